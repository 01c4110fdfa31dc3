#pragma once

// The agent's backend extension: the part of explore and apply modes that runs aggregation strategies
// over the job's own communicators (docs/agent.md, "Explore and apply").
//
// Why a second library. Strategies need the backend's library (the MPI communicator of
// comm/ links libmpi, the NCCL one libnccl and the CUDA runtime), and the agent itself must
// link neither: LD_PRELOAD puts it into mpirun, shells and Python launchers too. So the strategies
// live in libgradscope-agent-mpi.so and libgradscope-agent-nccl.so, which the agent loads with dlopen
// once the job has initialised MPI or created its first NCCL communicator; their dependency on libmpi
// or libnccl then binds to the copy the job already loaded (even one loaded with RTLD_LOCAL, as mpi4py
// and PyTorch do: the soname matches).
//
// The interface is C++: the libraries are built from this tree by one compiler, and
// gradscope_agent_extension() refuses an ABI number it does not know. The extension's own MPI and NCCL
// calls reach the agent's wrappers (the agent is first in the search order); the agent marks the thread
// (InternalScope in shadow.h) around every call into the extension, and the wrappers pass such calls
// straight to the library without recording them.
//
// Collective safety (DESIGN.md): every extension call that communicates is made by the agent on all
// ranks of the communicator in the same order, from decisions that are pure functions of sequence
// numbers, sizes and configuration. Every rank-local condition (no shadow room, a strategy that cannot
// be built here) is agreed on inside the extension before anyone acts on it.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/call_sites.h"
#include "gradscope/common/types.h"

namespace gradscope::agent {

// What the agent lends the extension (gradscope_agent_extension).
struct AgentHooks {
  void (*log)(const char* line) = nullptr;  // one line the agent's way ("gradscope: rank R: ...")
  // Marks the calling thread as the agent's own for the rest of its life: the wrappers pass its MPI and
  // NCCL calls straight to the library. A thread the extension starts calls it first.
  void (*own_thread)() = nullptr;
};

inline constexpr int kExtensionAbi = 5;

// The element types explore and apply take (sums of floating point the references can widen to fp64).
inline bool explorableDType(DType dtype) {
  return dtype == DType::Fp32 || dtype == DType::Fp64 || dtype == DType::Fp16 || dtype == DType::Bf16;
}

// The intercepted reduction, as the extension needs it.
struct ShadowCall {
  const void* comm = nullptr;    // address of the job's communicator handle (an MPI_Comm, an ncclComm_t)
  void* stream = nullptr;        // NCCL: the job's CUDA stream for this call (a cudaStream_t)
  std::uint32_t comm_index = 0;  // the agent's registry index: the key of per-communicator state
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  ReduceOp op = ReduceOp::None;
  std::size_t count = 0;
  std::int64_t seq = 0;
  int comm_size = 1;
  int comm_rank = 0;
  CallSite site;  // which call of its step it is (call_sites.h): the async strategies' identity of a call
};

struct ExploreSettings {
  int reps = 10;                         // timed repetitions per strategy
  int warmup_reps = 2;                   // untimed repetitions before them
  std::vector<std::string> strategies;   // names to measure; empty: every applicable one
  std::size_t shadow_bytes = 64u << 20;  // host shadow arena, allocated at start
  bool applying = false;                 // apply mode; explore mode otherwise
  // Apply: the strategies the recommendation's rules name (what start() may have to prepare).
  std::vector<std::string> apply_strategies;
  bool probe_links = false;  // explore: start() times the links between the job's hosts (MPI)
};

// One exchange between two hosts' lowest ranks timed by start() (probe_links): `bytes` sent each way at
// once, the fastest of a few tries, as the lowest rank of `host` measured it.
struct LinkSample {
  std::string host, peer;
  std::int64_t bytes = 0;
  std::int64_t ns = 0;
};

// What one rank spent and saw so far: the extension agrees on the budget from every rank's values.
struct BudgetState {
  double spent_ns = 0;    // time this rank spent in exploration so far
  double elapsed_ns = 0;  // time since the agent started recording on this rank
  double fraction = 0.1;  // the configured budget: spent may reach fraction × elapsed (1: no limit)
  double call_ns = 0;     // the job's own call here (0: not run yet); predicts the exploration's cost
};

struct StrategyTiming {
  std::string strategy;
  int reps = 0;
  double min_ns = 0, median_ns = 0, p90_ns = 0, max_ns = 0;
  std::optional<double> rel_l2_error, max_abs_error, cosine;  // against the fp64 reference
  std::int64_t overflow_count = 0;                            // non-finite results and wire overflows
};

// Consensus diagnostics of this rank on the explored buffer (docs/methods.md, "Consensus").
struct ConsensusSample {
  double alpha = 0;           // AdaCons α of this rank: ⟨g_sum, g_i⟩ / (‖g_i‖ + ε) / N
  double cosine_to_mean = 0;  // ⟨g_sum, g_i⟩ / (‖g_sum‖ ‖g_i‖)
  double grad_norm = 0;       // ‖g_i‖
  double diversity = 0;       // Σ_j ‖g_j‖² / ‖g_sum‖² (the same on every rank)
};

struct ExploreResult {
  bool explored = false;
  bool over_budget = false;  // skipped because the budget would not cover it (agreed)
  std::string skipped;       // why not, when !explored (one line; the same on every rank)
  std::vector<StrategyTiming> timings;
  std::optional<ConsensusSample> consensus;
};

class Extension {
 public:
  virtual ~Extension() = default;

  // Collective over the world, once, right after MPI_Init (inside the job's MPI_Init_thread: no job
  // thread can use MPI yet): allocates the shadow arena and agrees on going ahead with every rank.
  // `local_problem` is this rank's reason not to (its recommendation file did not load, its trace file could
  // not be created), empty when there is none. False, on every rank alike, when any rank could not; `error`
  // then says which rank and why.
  virtual bool start(const ExploreSettings& settings, const std::string& local_problem,
                     std::string& error) = 0;

  // Collective over the call's communicator, for backends without a world to agree over at start
  // (NCCL): the agent calls it at the first explorable all-reduce of every communicator, on every rank
  // whose agent is configured for explore or apply, whether start() succeeded there or not. It makes
  // the communicator's duplicate; false, on every rank alike, when some rank could not start or the
  // duplicate could not be made (`error` says why), and the agent then leaves the communicator alone.
  virtual bool join(const ShadowCall& call, std::string& error) = 0;

  // Collective over a communicator the job has just created, called inside the job's creation call on
  // every member, where preparesAtCreation(): makes now the communicator's duplicate and everything its
  // strategies will need, so that explore() and apply() on it create no communicator later. A failure
  // leaves the communicator refused (explore and apply then pass its calls through).
  virtual void prepare(const ShadowCall& call) = 0;
  // Whether communicators must be prepared when they are created (MPI at MPI_THREAD_MULTIPLE: Open MPI
  // can deadlock when two threads create communicators at once, and the job's threads may create theirs
  // at any moment). The agent then leaves the calls on a communicator it did not prepare untouched.
  virtual bool preparesAtCreation() const = 0;

  // Local: copies the call's input (`count` elements of `dtype`) into the shadow arena before the real
  // call runs (NCCL: enqueued on the call's stream ahead of the call). False when it does not fit;
  // explore() then agrees that every rank skips.
  virtual bool capture(const ShadowCall& call, const void* input) = 0;

  // Collective over the call's communicator (on the extension's duplicate of it), after the job's call
  // was issued (NCCL: the duplicate's work waits for the call's stream): agrees on going
  // ahead (every rank captured, and on every rank the time spent so far plus this exploration's
  // predicted cost stays within the budget), then times every strategy on the captured copy,
  // measures its error against an fp64 reference of the same data and the consensus diagnostics.
  virtual ExploreResult explore(const ShadowCall& call, const BudgetState& budget) = 0;

  // Collective over the call's communicator: aggregates `send` (nullptr: in place in `recv`) into
  // `recv` with `strategy`, as the job's all-reduce would (sum semantics; AdaCons scaled to match the
  // sum's norm); NCCL: ordered on the call's stream like the job's call, without waiting for it on the
  // host. The strategy is built (and agreed on) at its first use on a communicator and dtype.
  // Returns false with `error` set, on every rank alike, when it cannot be built there; the caller
  // then runs the job's own call and never asks again for that communicator, dtype and strategy.
  virtual bool apply(const ShadowCall& call, const void* send, void* recv, const std::string& strategy,
                     std::string& error) = 0;

  // Explore, the async strategies' errors (docs/async.md). Local: whether the call continues a call site
  // whose last steps an exploration kept (a pure function of the sites' sequence and of agreed outcomes:
  // the same on every rank). The agent then captures the call as for explore() and calls follow().
  virtual bool follows(const ShadowCall& call) = 0;
  // Collective over the call's communicator, after the job's call: agrees on going ahead (every rank
  // captured, no rank over the budget), computes this step's fp64 sum and, for each async strategy
  // explored, the relative error of what it would have returned against it (timings with no
  // repetitions), and keeps the step for the ones after it.
  virtual ExploreResult follow(const ShadowCall& call, const BudgetState& budget) = 0;

  // The job frees the communicator (MPI_Comm_free, which every member calls): free the duplicate
  // and the strategies built on it.
  virtual void forget(std::uint32_t comm_index) = 0;

  // MPI_Finalize is about to run (on every rank): free every duplicate while MPI still works.
  virtual void stop() = 0;

  // The links start() timed on this rank (probe_links; only a host's lowest rank times any); local.
  virtual std::vector<LinkSample> links() const { return {}; }
};

}  // namespace gradscope::agent

// The extension library's one entry point: a new Extension, or nullptr when `abi` is not its own. `hooks`
// outlives it.
extern "C" gradscope::agent::Extension* gradscope_agent_extension(int abi,
                                                                  const gradscope::agent::AgentHooks* hooks);
