#pragma once

// Explore and apply modes, the backend-neutral half (docs/agent.md, "Explore and apply"): which calls
// are explored (ExplorePlan), which are replaced (the recommendation's rules), the budget, the
// extension library that runs strategies (extension.h), and the hand-over of results to the recorder's
// background thread.
//
// Collective safety. Everything here that leads to communication is decided from per-communicator
// sequences of (api, dtype, size), the configuration and the recommendation file, which are the same
// on every rank, or from values the extension agreed on collectively. Once shadow work has started it
// never depends on whether this rank is still recording (a full disk stops the recording, not the
// collectives the other ranks are waiting for).

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/extension.h"
#include "gradscope/common/recommendation.h"
#include "gradscope/common/types.h"
#include "gradscope/common/untouched.h"

namespace gradscope::agent {

enum class ShadowMode : std::uint8_t { Off, Explore, Apply };

// Set while the agent works inside the extension on this thread: the interposers then pass the
// extension's own MPI calls straight to the library, unrecorded.
extern constinit thread_local bool t_internal __attribute__((tls_model("initial-exec")));
struct InternalScope {
  InternalScope() { t_internal = true; }
  ~InternalScope() { t_internal = false; }
  InternalScope(const InternalScope&) = delete;
  InternalScope& operator=(const InternalScope&) = delete;
};

// True once an extension is loaded (the interposers then check t_internal and the mode). Read on the
// hot path: a plain load, set before the job's other threads can call MPI or NCCL.
extern std::atomic<bool> g_shadow_hooks;
inline bool shadowHooks() {
  return g_shadow_hooks.load(std::memory_order_relaxed);
}
// Each backend has its own extension and mode: a job that bootstraps with MPI and reduces gradients
// with NCCL explores (or applies to) both. Off where its start failed or was never made.
ShadowMode shadowMode(Backend backend);

// Which calls explore mode times strategies on: per communicator and key (api, dtype, size bucket =
// ⌊log2 bytes⌋), the occurrences after `warmup` ones, `samples` of them, each at least `spacing`
// occurrences apart (so that one size is seen in several steps). An exploration the budget refused
// is retried after twice the previous back-off (at most 1,024 occurrences). Only sum all-reduces of fp32,
// fp64, fp16 and bf16 that fit `max_bytes` (what the shadow arena can hold) are candidates.
//
// The budget goes to the calls that carry the most time first. A key's weight is the time its calls
// carried so far, estimated as Σ max(bytes, 4 KiB) (latency bounds small calls near one cost; above that
// time grows with bytes). While a key at least twice as heavy waits for the budget (its last try was
// refused for it) and was seen on the communicator in its last 1,024 candidate calls, a lighter key
// defers its exploration instead of spending the budget the heavier one waits for; at most 64 times,
// so that a heavy key the budget never fits cannot keep the job from learning anything.
//
// A pure function of the call sequence and of the agreed outcomes given to done(): the same on every rank.
class ExplorePlan {
 public:
  struct Settings {
    int samples = 3;
    int warmup = 2;
    int spacing = 1;
    std::int64_t max_bytes = 16 << 20;
  };
  explicit ExplorePlan(Settings settings) : settings_(settings) {}

  // Decides for one call (and counts its occurrence).
  bool sample(std::uint32_t comm, Api api, DType dtype, ReduceOp op, std::int64_t bytes);
  // What became of a sampled call: explored, or skipped (agreed: over budget, no room).
  void done(std::uint32_t comm, Api api, DType dtype, std::int64_t bytes, bool explored,
            bool over_budget = false);

  static int bucketOf(std::int64_t bytes);

  // The weight priorities compare, and the deferral rules (see above).
  static constexpr std::int64_t kLatencyBytes = 4096;
  static constexpr std::int64_t kRecentCalls = 1024;
  static constexpr int kMaxDeferrals = 64;

 private:
  struct KeyState {
    std::int64_t occurrences = 0;
    std::int64_t next = 0;  // occurrence index of the next try
    int explored = 0;
    int backoff = 1;
    std::int64_t weight = 0;     // Σ max(bytes, kLatencyBytes) of its calls
    std::int64_t last_seen = 0;  // its communicator's candidate-call count at its last call
    bool waiting = false;        // its last try was refused for the budget
    int deferrals = 0;           // explorations it deferred to heavier keys
  };
  static std::uint64_t key(std::uint32_t comm, Api api, DType dtype, std::int64_t bytes);
  // Whether `state` (a key of `comm`) defers to a heavier key waiting for the budget.
  bool defers(std::uint32_t comm, const KeyState& state) const;

  static constexpr std::size_t kMaxKeys = 1 << 14;
  Settings settings_;
  std::mutex mutex_;
  std::unordered_map<std::uint64_t, KeyState> keys_;
  std::unordered_map<std::uint32_t, std::int64_t> calls_;  // candidate calls per communicator
};

// An applied call's CallEvent::strategy: its rule's position in the recommendation, from 1 (0 = the
// job's own call); fixed once the file is loaded, so neither needs a lock.
std::uint16_t appliedStrategyIndex(const RecommendationRule& rule);
std::string appliedStrategyName(std::uint16_t index);

// Loads the backend's extension and starts explore or apply with it. MPI: collective over the world
// (call it on every rank right after MPI_Init, whether or not this rank records), agreed by every
// rank. NCCL: local, at the first communicator; the ranks agree per communicator (Extension::join),
// and a rank whose start failed still joins those agreements (extension(Nccl) is set, its mode Off).
// Once per backend: later calls return at once. `recording` is whether this rank's trace file is open. Logs
// one line and leaves the mode Off when anything fails. Apply: a recommendation made for another backend, or
// naming another world size, is refused too.
void startShadow(Backend backend, int world_size, bool recording);
// Whether calls need their call site (call_sites.h): apply mode with async rules, or explore mode that
// measures async strategies' errors (the default set, or async names among the explored ones). Fixed at
// start; a plain load.
bool callSitesWanted();

// Apply mode with a recommendation that names an async strategy (docs/async.md): their sums run on a
// thread of their own, so the agent asks MPI_Init for MPI_THREAD_MULTIPLE. Reads the file before MPI_Init;
// one that does not load is reported by startShadow.
bool applyNeedsMpiThreads();
// MPI_Finalize: frees the MPI extension's communicators first.
void stopShadow(Backend backend);
// The backend's extension, or nullptr when none was loaded.
Extension* extension(Backend backend);
// Whether the backend's started extension prepares communicators when the job creates them
// (Extension::preparesAtCreation), fixed at start.
bool preparesAtCreation(Backend backend);

// Explore mode.
ExplorePlan& explorePlan();
// `call_ns`: how long the job's own call took here (0 when it has not run yet).
BudgetState budgetNow(double call_ns);
void addSpentNs(std::int64_t ns);
// Hands an exploration's results to the background thread, which links them to the call (comm, seq).
struct ExploreRecord {
  std::uint32_t comm = 0;
  std::int64_t seq = 0;
  std::int64_t step = -1;
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  std::int64_t bytes = 0;
  int world = 1;
  bool follow = false;  // Extension::follow's (the async errors of a followed call site), not explore's
  ExploreResult result;
};
void submitExplore(ExploreRecord record);
// Background thread: takes everything submitted so far.
std::vector<ExploreRecord> takeExploreRecords();

// Apply mode: the rule for a call, or nullptr (a pure function of the call, its seq on its communicator,
// its step and the file: the same on every rank). Rules the extension could not run are reported once,
// and their calls run untouched. With GRADSCOPE_VALIDATE_WINDOW = N, calls in odd windows get none: windows
// of N steps when the job marks its steps (GRADSCOPE_STEP_CALLS or GRADSCOPE_STEP_NVTX: the plan switches
// at step boundaries; a call before the first step gets none), else of N calls of each communicator.
const RecommendationRule* applyRuleFor(Api api, DType dtype, ReduceOp op, std::int64_t bytes, int world,
                                       std::int64_t seq, std::int64_t step);
void reportApplyFailure(const std::string& strategy, DType dtype, const std::string& error);

// A call explore and apply passed to the job's library untouched (gradscope/common/untouched.h).
void countUntouched(Untouched reason);

// Counters for the run's statistics (runs.config_json "agent").
struct ShadowStats {
  std::int64_t explored = 0, skipped_budget = 0, skipped_other = 0, applied = 0, apply_failed = 0;
  std::int64_t followed = 0;  // calls whose async errors were measured (Extension::follow)
  std::int64_t spent_ns = 0;
  std::int64_t untouched[kUntouchedReasons] = {};
  std::vector<LinkSample> links;  // the links between hosts explore timed at start (this rank's)
};
ShadowStats shadowStats();
void countApplied(bool ok);
// The mode start agreed on ("explore", "apply"), or "off" when it did not start.
std::string shadowModeName();

}  // namespace gradscope::agent
