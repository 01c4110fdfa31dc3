#pragma once

// The half of explore and apply that is the same over MPI and NCCL (extension.h): the agreements, the
// strategy sets, the fp64 references, the consensus diagnostics, the timing loop and apply's strategy
// cache, written once against comm::Communicator. A backend (mpi_extension.cc, nccl_extension.cc) adds
// what differs: how it agrees at start, how it duplicates the job's communicator, where the shadow
// copies live and how they are ordered with the job's own work.
//
// Memory. An explored call takes one slice laid out as [input | result | fp64 reference | every rank's
// fp32 input], in the duplicate's memory (host for MPI, the GPU for NCCL), and, for device memory, a
// host slice of the same layout that the references and error metrics read. The backend hands both out
// from arenas of a fixed size reserved before any exploration.

#include <atomic>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/extension.h"
#include "gradscope/comm/async.h"
#include "gradscope/comm/communicator.h"
#include "gradscope/comm/strategy.h"

namespace gradscope::agent {

// A first-fit allocator of slices of one block of memory (host or device: it never touches the
// memory). Thread-safe: explorations on different communicators may run at once on different threads.
class SliceArena {
 public:
  static constexpr std::size_t kAlign = 256;
  static std::size_t alignUp(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  void assign(std::byte* base, std::size_t bytes) {
    base_ = base;
    size_ = bytes;
  }
  // Maps `bytes` of host memory (touched only as used) and hands out slices of it; false when the
  // mapping fails. Nothing to map for 0 bytes.
  bool mapHost(std::size_t bytes);
  // A slice of `bytes`, or nullptr when no gap is large enough.
  std::byte* take(std::size_t bytes);
  void give(std::byte* slice);

 private:
  std::mutex mutex_;
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  std::map<std::size_t, std::size_t> used_;  // offset -> bytes
};

// One exploration's buffers. The strategies read `input` and write `result`; the references and
// metrics read the host side, which is the same memory when the communicator's memory is the host's.
struct Capture {
  struct Side {
    std::byte* input = nullptr;
    std::byte* result = nullptr;
    double* reference = nullptr;
    float* gathered = nullptr;  // nullptr: no room for the adaptive aggregators' references
  };
  Side comm;                        // in the duplicate's memory
  Side host;                        // on the host (== comm for host memory)
  std::byte* slice = nullptr;       // what the backend handed out (nullptr: nothing captured)
  std::byte* host_slice = nullptr;  // nullptr when the host side is the slice itself
  int device = -1;                  // the arena the slice came from (NCCL), -1 for the host's

  // Lays the slices out as [input | result | reference | gathered]; host_base may be nullptr (host memory).
  static Capture layout(std::byte* base, std::byte* host_base, std::size_t input_bytes, std::size_t count,
                        bool with_gather);
  // Bytes of one slice: without and with the gathered inputs of `ranks` ranks.
  static std::size_t baseBytes(std::size_t input_bytes, std::size_t count);
  static std::size_t gatherBytes(std::size_t count, int ranks);
};

class StrategyExtension : public Extension {
 public:
  explicit StrategyExtension(const AgentHooks& hooks) : hooks_(hooks) {}

  bool start(const ExploreSettings& settings, const std::string& local_problem, std::string& error) override;
  bool join(const ShadowCall& call, std::string& error) override;
  void prepare(const ShadowCall& call) override;
  bool preparesAtCreation() const override { return false; }
  bool capture(const ShadowCall& call, const void* input) override;
  ExploreResult explore(const ShadowCall& call, const BudgetState& budget) override;
  bool follows(const ShadowCall& call) override;
  ExploreResult follow(const ShadowCall& call, const BudgetState& budget) override;
  bool apply(const ShadowCall& call, const void* send, void* recv, const std::string& strategy,
             std::string& error) override;
  void forget(std::uint32_t comm_index) override;
  void stop() override;

 protected:
  // start(): agrees with the other ranks on going ahead, where the backend has a world to agree over
  // (MPI), given this rank's problem (empty: none). False with `error` set on the lowest failing rank
  // (empty on the others). A backend without a world returns !local_problem and agrees per
  // communicator instead (duplicate()).
  virtual bool agreeToStart(const std::string& local_problem, std::string& error) = 0;
  // start(): reserves the shadow memory for `bytes` of explored buffers. False when it cannot.
  virtual bool reserve(std::size_t bytes) = 0;
  // The communicator's duplicate, made at its first explored or applied call (NCCL: at join()), or at
  // its creation (`at_creation`: prepare()), on every rank. `join` is false on a rank whose start()
  // failed: it takes part without joining (NCCL's NOCOLOR split) and throws. Throws gradscope::Error when
  // the duplicate cannot be made or some rank did not join (every rank then throws alike).
  virtual std::unique_ptr<comm::Communicator> duplicate(const ShadowCall& call, bool join,
                                                        bool at_creation) = 0;
  // Hands out a slice for a capture of `base` bytes, or `base + gather` when that fits (Capture::layout
  // of it); false when not even `base` fits. give() takes it back.
  virtual bool take(const ShadowCall& call, std::size_t input_bytes, bool want_gather, Capture& capture) = 0;
  virtual void give(Capture& capture) = 0;
  // Copies the job's input into the capture, ordered before the job's own call on it.
  virtual void copyInput(const ShadowCall& call, void* dst, const void* src, std::size_t bytes) = 0;
  // Orders the duplicate's next work after everything the job enqueued so far on the call's stream,
  // and the job's next work after what the duplicate enqueued (no-ops where calls complete on return).
  virtual void afterJob(const ShadowCall&, comm::Communicator&) {}
  virtual void beforeJob(const ShadowCall&, comm::Communicator&) {}
  // Whether this rank says what is the same on every rank (once per job, not once per rank): MPI's
  // world rank 0; without a world (NCCL) every rank.
  virtual bool speaksForAll() const { return true; }
  void log(const std::string& line) const;
  // The settings start() was given (its strategy names filtered to those that parse).
  const ExploreSettings& settings() const { return settings_; }
  // Apply: some rule names an async strategy (their worker needs a concurrent copy of each communicator).
  bool appliesAsync() const;
  // The engine strategies' one-off setup was paid at start (the budget reserves none for it later).
  void notePreparedEngines() { engines_prepared_.store(true, std::memory_order_relaxed); }

 private:
  struct Prepared {
    StrategyName name;
    std::string text;
    std::unique_ptr<comm::Strategy> strategy;
  };
  struct CommState {
    std::mutex mutex;  // the job orders collectives per communicator; this guards against misuse
    std::unique_ptr<comm::Communicator> duplicate;
    std::string refused_all;  // the duplicate could not be made: why (agreed), and never again
    // Explore: per dtype, the strategies built so far. The engine strategies (Open MPI's or NCCL's own
    // algorithms) are built only once an exploration can afford their one-off setup.
    struct Explored {
      std::vector<Prepared> plain, engines;
      bool engines_built = false;
    };
    std::map<DType, Explored> explore;
    // Apply: by (dtype, strategy, count). AdaCons keeps momentum per buffer: one instance per count, so
    // that a layer's weights are smoothed with its own history (docs/agent.md, "Apply mode").
    std::map<std::tuple<DType, std::string, std::size_t>, std::unique_ptr<comm::Strategy>> applied;
    std::map<std::pair<DType, std::string>, std::string> refused;  // agreed failures, with the reason
    // Apply, async/*: one worker per communicator (made at its first async call, with agreement), and
    // one strategy per call site, by ordinal (call_sites.h).
    std::shared_ptr<comm::AsyncWorker> async_worker;
    struct AsyncSite {
      std::unique_ptr<comm::AsyncStrategy> strategy;
      std::string text;
      DType dtype = DType::Other;
      std::size_t count = 0;
      std::int64_t last_step = -1;
    };
    std::map<std::uint32_t, AsyncSite> async_sites;
    // Explore, async/*: the last steps of the call sites an exploration follows (follows()), by ordinal.
    struct History {
      struct Step {
        std::int64_t step = 0;
        std::vector<double> sum;    // the fp64 sum over ranks
        std::vector<double> input;  // this rank's gradient
      };
      DType dtype = DType::Other;
      std::size_t count = 0;
      std::int64_t last_step = -1;
      int follows_left = 0;
      std::deque<Step> steps;  // newest first, at most the largest K explored
    };
    std::map<std::uint32_t, History> histories;
    Capture capture;
    double cost_per_strategy_byte_ns = 0;  // of this rank's last exploration here (predicts the next one)
    // The job's quickest call seen at this communicator's explorations, per (dtype, ⌊log2 bytes⌋): one
    // call's time is noisy (a call that waited for a late rank), the quickest of several is not.
    std::map<std::pair<DType, int>, double> quickest_call_ns;
    comm::Buffer agreement;  // device memory of the agreements (NCCL)
  };

  static void maxOverRanks(comm::Communicator& comm, CommState& state, double* values, std::size_t n);

  // The fp64 sum over ranks of the captured input, into the capture's host reference (collective).
  static void computeReference(comm::Communicator& comm, const ShadowCall& call, const Capture& capture);
  // Explore: the async strategies' errors at this step of the call's site, from the steps kept before it
  // (timings without repetitions, into `result`), then keeps this step. `sampled`: an exploration, which
  // (re)starts following the site for the largest K.
  void asyncErrors(CommState& state, const ShadowCall& call, const Capture& capture, bool sampled,
                   ExploreResult& result);
  void dropHistory(CommState& state, std::uint32_t ordinal);
  static bool agreeToBuild(comm::Communicator& comm, CommState& state, const ShadowCall& call,
                           const std::string& strategy, const std::string& local_error, std::string& error);
  bool applyAsync(CommState& state, comm::Communicator& comm, const ShadowCall& call,
                  const std::string& strategy, const void* send, void* recv, std::string& error);

  CommState& stateOf(std::uint32_t index);
  comm::Communicator& duplicateOf(CommState& state, const ShadowCall& call, bool at_creation = false);
  // The strategy names explored for a dtype: (plain ones, engine ones).
  std::pair<std::vector<StrategyName>, std::vector<StrategyName>> namesFor(const comm::Communicator& comm,
                                                                           DType dtype) const;
  // How many strategies an exploration of `dtype` runs: (plain, engine), of the built set or, before it is
  // built, of the names (the same on every rank: it depends on the configuration only).
  std::pair<std::size_t, std::size_t> expectedStrategies(CommState& state, const comm::Communicator& comm,
                                                         DType dtype) const;
  // The strategies of an exploration, built once with agreement (one that cannot be built on some rank is
  // left out on every rank); the engine ones only `with_engines`.
  std::vector<Prepared*> strategiesFor(CommState& state, comm::Communicator& comm, DType dtype,
                                       bool with_engines);
  // Runs the exploration, each strategy timed `reps` times after `warmup_reps` untimed runs; returns how
  // many strategies it timed.
  std::size_t run(CommState& state, comm::Communicator& comm, const ShadowCall& call, const Capture& capture,
                  bool adaptive_references, bool with_engines, int reps, int warmup_reps,
                  ExploreResult& result);

  // The one-off cost the budget reserves for the first exploration with engine strategies.
  static constexpr double kEngineSetupNs = 250e6;
  // Fewest timed repetitions an exploration squeezed into the budget runs (a median of 3).
  static constexpr int kMinReps = 3;

  AgentHooks hooks_;
  ExploreSettings settings_;
  // Explore: the async strategies whose errors are measured (settings' names, or the default set); not
  // built as strategies. The largest K among them is how many steps a followed site keeps.
  std::vector<StrategyName> async_names_;
  int async_depth_ = 0;
  // Bytes the histories hold, over every communicator: at most the shadow arena's size again.
  std::atomic<std::size_t> history_bytes_{0};
  std::atomic<bool> reported_moved_{false};  // apply: an async site's restart was said
  bool started_ = false;
  // Process-wide, read and set by explorations of different communicators on different threads. A hint
  // for the budget's prediction only (the decision it feeds is agreed over the ranks): relaxed.
  std::atomic<bool> engines_prepared_{false};
  std::mutex states_mutex_;
  std::unordered_map<std::uint32_t, std::unique_ptr<CommState>> states_;
};

}  // namespace gradscope::agent
