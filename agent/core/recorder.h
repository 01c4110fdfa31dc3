#pragma once

// The agent's process-wide recorder: what the interposers call.
//
// Life cycle. The library loads in every process LD_PRELOAD reaches, and does nothing there until an
// interposer calls activate() — at MPI_Init, at the first NCCL communicator, or at the first
// collective when MPI was initialised behind the agent's back. activate() creates the per-rank trace
// file and starts one background thread; a process that never activates writes nothing. finish()
// (MPI_Finalize, exit, SIGINT/SIGTERM/SIGHUP with the default action) drains every buffer, writes
// the agent's statistics and closes the file; afterwards nothing is recorded.
//
// Fail open: any failure to set up (configuration, output file) prints one line on stderr and leaves
// recording off; the intercepted calls still go straight to the library.
//
// Threads and locks. Hot path (any job thread): recording() and record() take no lock. activate() and
// finish() serialise on one mutex; the background thread owns the trace (trace_output.h), the clock
// conversion and the GPU timer's completion queries. Signal handlers take no lock: they wake the background
// thread through a pipe and wait (bounded) on another pipe for it to finish the file.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/call_event.h"
#include "core/clock.h"
#include "core/comm_registry.h"
#include "core/config.h"
#include "core/thread_buffer.h"
#include "gradscope/common/drop_kind.h"

namespace gradscope::agent {

extern std::atomic<bool> g_recording;
// Buffer of the calling thread, claimed on its first record (initial-exec: the library is loaded at
// start-up with LD_PRELOAD, so the fast TLS model applies).
extern constinit thread_local ThreadBuffer* t_buffer __attribute__((tls_model("initial-exec")));

inline bool recording() {
  return g_recording.load(std::memory_order_relaxed);
}

// Lets the calling thread run on every CPU the process may use (the kernel keeps it inside the job's
// cpuset), undoing the one-core binding it inherited from its rank. Best effort: false when the kernel
// refused.
bool unbindCallingThread();

ThreadBuffer* claimThreadBuffer();

// Hot path: hands one record to the background thread, or drops and counts it.
inline void record(const CallEvent& event) {
  ThreadBuffer* buffer = t_buffer;
  if (__builtin_expect(buffer == nullptr, 0)) buffer = claimThreadBuffer();
  if (buffer != nullptr) buffer->push(event);
}

// The recording rate limit of every thread (GRADSCOPE_MAX_CALL_RATE), set at activation.
extern ThreadBuffer::RateLimit g_rate_limit;

// Hot path, before a call is timed: whether it is to be recorded, and then its start tick. A call is not
// recorded when its thread is over the recording rate limit, or its ring is full, or it could get no
// ring; the drop is counted here and the caller neither reads the clock nor writes a record: two TSC
// reads are most of what recording a call costs (docs/agent.md, "Overhead").
inline bool startRecording(std::uint64_t& start) {
  ThreadBuffer* buffer = t_buffer;
  if (__builtin_expect(buffer == nullptr, 0)) buffer = claimThreadBuffer();
  return buffer != nullptr && buffer->admit(g_rate_limit, ticks, start) && buffer->roomOrDrop();
}

// Hot path, in place: `fill` writes every field of the record straight into the thread's ring.
template <typename Fill>
inline void recordInPlace(Fill&& fill) {
  ThreadBuffer* buffer = t_buffer;
  if (__builtin_expect(buffer == nullptr, 0)) buffer = claimThreadBuffer();
  if (buffer == nullptr) return;
  if (CallEvent* slot = buffer->reserve()) {
    fill(*slot);
    buffer->publish();
  }
}

// The step of the call being recorded, from the explicit markers (GRADSCOPE_STEP_CALLS: counts this
// call if it is a collective; GRADSCOPE_STEP_NVTX: the steps started so far − 1), or -1 when none is
// configured (steps are then detected from the pattern of calls when the files are merged).
// Point-to-point calls and barriers are not counted, only given the step of the collectives so far:
// ranks of a pipeline make different numbers of them per step.
enum class StepMarker : std::uint8_t { None, CallCount, Nvtx };
extern StepMarker g_step_marker;  // fixed at load
std::int64_t stepForCallSlow(Api api);
inline std::int64_t stepForCall(Api api) {
  return g_step_marker == StepMarker::None ? -1 : stepForCallSlow(api);
}
// An NVTX range push: starts a new step when `name` is the configured marker, and is told to the range
// listener; a pop is told to it too (the agent's NVTX injection calls these on the job's threads).
void nvtxRangePushed(const char* name);
void nvtxRangePopped();
// Told of the job's NVTX range pushes and pops: the GPU windows name the kernels launched inside a range
// (cupti_tracer.h). Set with the tracer; nullptr: none.
struct NvtxRangeListener {
  void (*pushed)(const char* name) = nullptr;
  void (*popped)() = nullptr;
};
void setNvtxRangeListener(NvtxRangeListener listener);
// Whether the agent wants the job's NVTX ranges (a step marker, or GPU windows): its NVTX injection
// attaches only then.
bool wantsNvtx();
// Told of every marked step as it begins (its number), on the thread that began it: the NCCL side opens
// and closes its GPU windows there (cupti_tracer.h). Set before the first call; nullptr: none.
using StepListener = void (*)(std::int64_t step);
void setStepListener(StepListener listener);
// The marked step in progress (-1 before the first, or when steps are not marked): where a listener set
// meanwhile starts from.
std::int64_t currentStep();

// Created when the library loads (before any interposed call) and never destroyed: job threads may
// still look communicators up while the process exits.
extern CommRegistry* const g_comm_registry;
inline CommRegistry& comms() {
  return *g_comm_registry;
}
const Config& config();
// Whether the configuration had errors (activation then said so and left recording off).
bool configHasErrors();

struct Activation {
  Backend backend = Backend::Unknown;
  int rank = 0;
  int world_size = 1;
  std::string device = "cpu";
  // A process of a job another job started (MPI_Comm_spawn): a run of its own (launcher.h spawnedRunId),
  // which names the run it came from ("spawned_by" in runs.config_json).
  bool spawned = false;
};
// Starts recording (once per process; later calls return the current state). Returns recording().
bool activate(const Activation& activation);
bool activated();
// Drains, writes the statistics and closes the trace. Idempotent; a no-op in a forked child.
void finish();

// Counts one dropped event of a kind other than a full ring's or the rate limit's (those are counted by
// the ring itself). Any thread, no lock: one relaxed atomic add.
void countDrop(DropKind kind);

// An intercepted call that is not recorded because recording is off. Once recording has stopped after
// an error in the agent (the trace could not be written), each such call counts as a
// "recording_stopped" drop, so the trace never says that nothing was lost; before activation and after
// the end it counts nothing. Cold path: interposers reach it only while not recording.
void countCallNotRecorded();

// GPU calls are recorded with gpu_slot != 0; the background thread asks the timer for their span.
class GpuTimer {
 public:
  enum class Status { Pending, Ready, Failed, NoKernel };
  virtual ~GpuTimer() = default;
  // Background thread only. Ready: the call's GPU start and end as Unix-epoch ns. Pending: ask again
  // after the next poll() (a span may be known only some polls after the call's work has completed).
  // Failed: no GPU span (a "gpu_timing" drop). NoKernel: the call ran no kernel; its host times stand.
  virtual Status query(std::uint32_t slot, std::int64_t& start_epoch_ns, std::int64_t& end_epoch_ns) = 0;
  // The slot's record is written; the timer may reuse it.
  virtual void release(std::uint32_t slot) = 0;
  // Background thread, at every flush: housekeeping (the CUDA timer renews its clock reference here).
  virtual void poll() {}
  // How long after a call's work has completed its query may still answer Pending.
  virtual std::int64_t settleNs() const { return 0; }
  // Background thread, after poll(): the GPU executions of graph-captured calls complete so far (all of
  // them when `final`), in launch order.
  virtual void takeGraphReplays(std::vector<ReplaySpan>& out, bool final) {
    (void)out;
    (void) final;
  }
  // Background thread, after poll(): the rows of the sampled GPU windows complete so far (all of them
  // when `final`).
  virtual void takeGpuActivity(std::vector<GpuActivitySpan>& out, bool final) {
    (void)out;
    (void) final;
  }
  // Where the calls' GPU spans come from, for the run's summary (runs.config_json "agent.gpu_spans"):
  // a short name, and why a better source is not in use (empty when it is the best there is).
  struct SpanSource {
    std::string source;
    std::string note;
  };
  virtual SpanSource spanSource() const { return {}; }
};
// Installs the timer (before the first GPU record). The recorder does not own it.
void setGpuTimer(GpuTimer* timer);

// One line on stderr, "gradscope: rank R: ...", written with a single write(2).
void logLine(const std::string& message);
template <typename... Args>
void log(fmt::format_string<Args...> format, Args&&... args) {
  logLine(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace gradscope::agent
