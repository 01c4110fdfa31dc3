#pragma once

// Exact GPU spans of NCCL calls from CUPTI's activity records, preferred by the CUDA event timer
// (gpu_timer.h) wherever CUPTI is available.
//
// Design. Around each real NCCL call (and each real ncclGroupEnd that launches a group) the timer pushes
// an external correlation id of kind CUSTOM0 that names the call's event pair; CUPTI then writes, for
// every kernel launched meanwhile, an EXTERNAL_CORRELATION record (its correlationId → our id) and,
// once the kernel has run, a CONCURRENT_KERNEL record (correlationId, start, end). KernelSpans joins the
// two into one span per id: min start .. max end over the id's kernels, so a group's members share it.
//
// Bounds. kBuffers buffers of kBufferBytes, allocated once, are all CUPTI ever gets: when none is free
// the request callback hands out none and CUPTI drops records (counted as "cupti_record" drops). The
// join tables are fixed: a kernel whose correlation has not been seen waits in a small ring, and spans
// live in a table indexed by id (an entry is replaced by a newer id).
//
// Threads. push/pop: any job thread, no lock (CUPTI keeps the id stack per thread). The buffer request
// callback: any thread CUPTI calls it on, lock-free. The completion callback: CUPTI's thread or the one
// calling flush(); it takes `mutex_`, as do span() and forget() (background thread only). A job's thread
// takes it only in the graph-node callbacks, while it captures or instantiates a graph (never around an
// ordinary call), and `captures_mutex_` in endCapture. Beginning a step that opens or closes a window
// (onStep) takes `records_mutex_` (switching CUPTI's kernel records) and `events_mutex_` (queueing the
// event, which the callback applies under `mutex_`), never `mutex_`;
// `names_mutex_` in rangePushed while records are wanted for a window.
//
// Graph replays. A kernel of a CUDA graph carries the correlation of the graph's launch, not of the NCCL
// call that was captured into the graph, and runs at every launch. So while a job thread captures an
// NCCL call (or a group) the timer marks the thread with a capture id (beginCapture/endCapture, which
// also note the calls captured); CUPTI's resource callbacks then map, on that thread, every graph node
// the call creates to the id (GRAPHNODE_CREATED), and every copy cuGraphInstantiate makes of such a
// node into an executable graph to the same id (GRAPHNODE_CLONED). A kernel record with a graphNodeId
// of a mapped node is one kernel of one replay: joined per (capture id, the launch's correlation id) like
// a call's kernels, min start .. max end. A replay is complete once a whole flush has passed without a
// kernel of it; takeReplays() hands the complete ones over, in launch order, one per captured call.
//
// Windows (the step model's GPU side, storage/step_model.h). The job's compute kernels are kept only
// inside sampled windows (config.h GpuWindowConfig): a few marked steps every N (onStep, on the thread that
// starts a step), or, when the job marks no steps, a fixed time every period aligned to the Unix epoch
// (onPoll, background thread), so that every rank samples the same steps or the same seconds. A kernel
// belongs to a window when it runs between its opening and its closing (CUPTI's clock); its window is
// handed over (takeActivity) as intervals once it has closed and kGraceFlushes flushes have delivered
// what ran inside it. CUPTI's kernel records cost the job on every launch: when CUPTI times the NCCL calls
// (the default) they are on throughout and the windows only choose what is kept; with GRADSCOPE_CUPTI=
// windows the calls are timed with events and the kernel records are enabled only around a window: from
// the step before it (a tenth of the period before, for time windows), since CUPTI records only the
// launches made while they are on and a window's first step holds kernels launched before it began.
//
// Not loaded into a process that does not use CUDA: the timer starts it at the first NCCL communicator
// of a process that has loaded the driver, and libcupti is dlopen'ed (never linked).

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/call_event.h"
#include "core/config.h"
#include "core/cupti_abi.h"
#include "gradscope/storage/records.h"

namespace gradscope::agent {

// The join of external correlation records and kernel records (pure: unit-tested without CUPTI).
class KernelSpans {
 public:
  static constexpr std::uint32_t kCorrelations = 1u << 14;  // correlationId → id, by correlationId
  static constexpr std::uint32_t kWaiting = 256;            // kernels whose correlation is not known yet
  static constexpr std::uint32_t kSpans = 1u << 15;         // spans, by id (the timer's pair index)

  KernelSpans();
  void addExternal(std::uint32_t correlation, std::uint64_t id);
  void addKernel(std::uint32_t correlation, std::uint64_t start, std::uint64_t end);
  // The span of `id` in CUPTI's clock, when a kernel of it has been seen.
  bool span(std::uint64_t id, std::uint64_t& start, std::uint64_t& end) const;
  void forget(std::uint64_t id);

  // Graph replays (the design above). Node ids are CUPTI's (cuptiGetGraphNodeId), captures nonzero.
  static constexpr std::uint32_t kGraphNodes = 1u << 14;  // node → capture, by node id
  static constexpr std::uint32_t kReplays = 1024;         // replays whose kernels are still arriving
  void addGraphNode(std::uint64_t node, std::uint32_t capture);
  void cloneGraphNode(std::uint64_t original, std::uint64_t clone);
  // A kernel launched by graph node `node`, delivered during flush `flush`: false when the node is not
  // a captured call's (the kernel is someone else's).
  bool addGraphKernel(std::uint64_t node, std::uint32_t launch, std::uint64_t start, std::uint64_t end,
                      std::uint64_t flush);
  struct Replay {
    std::uint32_t capture = 0;
    std::uint32_t launch = 0;  // correlation id of the graph launch
    std::uint64_t start = 0, end = 0;
    std::uint64_t flush = 0;  // the last flush that extended it
  };
  // Appends to `out`, in launch order, the replays no kernel of which arrived after flush `last_flush`,
  // and forgets them.
  void takeReplays(std::uint64_t last_flush, std::vector<Replay>& out);
  // Replays lost because kReplays were in progress at once.
  std::uint64_t replayDrops() const { return replay_drops_; }
  // What the graph tracing saw so far, for the run's summary: nodes of captured calls (created and
  // cloned), and NCCL kernels launched by a graph, all of them and those of a known node.
  struct GraphCounts {
    std::uint64_t nodes = 0, clones = 0, kernels = 0, matched = 0;
    std::uint64_t other_kernels = 0;  // launched by a graph, not NCCL's (names other than nccl*)
  };
  GraphCounts graphCounts() const { return graph_counts_; }
  void countOtherGraphKernel() { ++graph_counts_.other_kernels; }

 private:
  struct Correlation {
    std::uint32_t correlation = 0;
    std::uint64_t id = 0;  // 0: none
  };
  struct Kernel {
    std::uint32_t correlation = 0;  // 0: none
    std::uint64_t start = 0, end = 0;
  };
  struct Span {
    std::uint64_t id = 0;  // 0: none
    std::uint64_t start = 0, end = 0;
  };
  void extend(std::uint64_t id, std::uint64_t start, std::uint64_t end);

  std::unique_ptr<Correlation[]> correlations_;
  Kernel waiting_[kWaiting];
  std::uint32_t waiting_next_ = 0, waiting_count_ = 0;
  std::unique_ptr<Span[]> spans_;
  struct GraphNode {
    std::uint64_t node = 0;  // 0: none
    std::uint32_t capture = 0;
  };
  std::unique_ptr<GraphNode[]> graph_nodes_;
  std::vector<Replay> replays_;  // in progress, in arrival order (capacity kReplays, reserved once)
  std::uint64_t replay_drops_ = 0;
  GraphCounts graph_counts_;
};

// The kernels of the sampled windows (the design above; pure: unit-tested without CUPTI). Times are CUPTI's.
class WindowKernels {
 public:
  static constexpr std::size_t kMaxKernels = std::size_t{1} << 18;  // kept, over the windows not yet taken
  static constexpr std::size_t kMaxWindows = 64;                    // open or not yet taken
  static constexpr std::uint32_t kRangeCorrelations = 1u << 16;  // correlationId → NVTX range, direct-mapped
  struct Row {
    storage::GpuActivityKind kind = storage::GpuActivityKind::Window;
    std::uint64_t start = 0, end = 0;
    std::int64_t kernels = 0;
    std::uint32_t range = 0;  // compute rows: the NVTX range's id (CuptiTracer's names), 0 none
  };
  WindowKernels();
  // Opens a window at `at`; false (and nothing opens) while one is open or kMaxWindows wait to be taken.
  bool open(std::uint64_t at);
  // Closes the open window at `at`, during flush number `flush` (its kernels may arrive until later).
  void close(std::uint64_t at, std::uint64_t flush);
  bool isOpen() const { return !windows_.empty() && windows_.back().close == kOpen; }
  // A kernel record: kept when it ran while a window was open (from before its opening on), else ignored.
  // `correlation`: its launch's, which names its NVTX range (addRange).
  void addKernel(std::uint64_t start, std::uint64_t end, bool nccl, std::uint32_t correlation = 0);
  // A launch made inside NVTX range `range` (a CUSTOM1 external correlation record). A kernel's range is
  // looked up when its window is taken, when every record of it has arrived.
  void addRange(std::uint32_t correlation, std::uint32_t range);
  // Appends the windows closed during a flush numbered `last_flush` or earlier, each as its window row then
  // the unions of its compute kernels per NVTX range and of its NCCL kernels (in time order), and forgets
  // them.
  void take(std::uint64_t last_flush, std::vector<Row>& out);
  // Kernels not kept because kMaxKernels were.
  std::uint64_t drops() const { return drops_; }

 private:
  static constexpr std::uint64_t kOpen = UINT64_MAX;
  struct Kernel {
    std::uint64_t start = 0, end = 0;
    std::uint32_t correlation = 0;
    bool nccl = false;
  };
  struct RangeOf {
    std::uint32_t correlation = 0;
    std::uint32_t range = 0;
  };
  std::unique_ptr<RangeOf[]> ranges_;
  struct Window {
    std::uint64_t open = 0, close = kOpen, closed_in_flush = 0;
    std::vector<Kernel> kernels;
  };
  std::vector<Window> windows_;  // by opening time
  std::size_t kernels_ = 0;
  std::uint64_t drops_ = 0;
};

// Reads the records of one completed CUPTI buffer into `spans`: kernels whose name starts with "nccl"
// and CUSTOM0 external correlations. Returns the number of records read.
// Kernels launched by a graph go to the replays (delivered during flush `flush`). With `windows`, every
// kernel (NCCL's or not) is offered to it as well.
// (and CUSTOM1 external correlations, the job's NVTX ranges).
int parseActivityBuffer(const cupti::Library& library, std::uint8_t* buffer, std::size_t valid_bytes,
                        KernelSpans& spans, std::uint64_t flush = 0, WindowKernels* windows = nullptr);

class CuptiTracer {
 public:
  static constexpr int kBuffers = 8;
  // Big enough that a flush every few ms never fills the pool (~4800 kernel records a buffer), small
  // enough that the pool costs little (kineto uses buffers of the same order).
  static constexpr std::size_t kBufferBytes = 1u << 20;
  // Flushes after a window closed before its kernels are taken (a record can come a flush late).
  static constexpr std::uint64_t kGraceFlushes = 2;

  // Loads libcupti (libcupti.so.13, then libcupti.so), registers the buffer callbacks and enables the
  // kernel and external-correlation records. nullptr on any failure (the caller then times with events
  // only), with the reason in `why`, empty when there is no libcupti to load. At most one per process:
  // CUPTI's callbacks are process-wide.
  // `spans`: CUPTI times the NCCL calls (kernel records on throughout); false: only the windows' kernels
  // are wanted (kernel records on while a window is open).
  static CuptiTracer* start(std::string& why, bool spans = true);

  // Windows (the design above). Before the first call: the configuration, and whether the job marks its
  // steps (then onStep decides, else onPoll).
  void useWindows(const GpuWindowConfig& windows, bool steps_marked);
  // A marked step began (any job thread; takes mutex_ only when a window opens or closes).
  void onStep(std::int64_t step);
  // Background thread, at each flush: time windows; `epoch_ns` now.
  void onPoll(std::int64_t epoch_ns);
  // Background thread, after flush(): the windows complete so far (all of them when `final`), as rows in
  // Unix-epoch ns.
  void takeActivity(std::vector<GpuActivitySpan>& out, bool final);
  // The job's NVTX range pushes and pops (the agent's NVTX injection), on the job's thread. While kernel
  // records are wanted for a window, a push makes its name CUPTI's CUSTOM1 external correlation on the
  // thread, so that the kernels launched inside it carry it; pops undo exactly the pushes that did.
  static constexpr std::uint32_t kMaxRangeNames = 1024;  // distinct names; beyond: kernels unnamed
  void rangePushed(const char* name);
  void rangePopped();

  // Whether the kernel records are on now (throughout, or around a window): a call correlated now gets its
  // span from them. Hot path: one load.
  bool correlating() const { return spans_on_ || records_on_.load(std::memory_order_relaxed); }
  // Whether the kernel records are on throughout (start's `spans`): every call's span can come from them.
  bool spansThroughout() const { return spans_on_; }
  // Whether graph-captured calls' replays are traced (the graph-node callbacks are on).
  bool tracesGraphs() const { return graphs_; }
  KernelSpans::GraphCounts graphCounts();
  // Hot path, around the real NCCL call.
  void push(std::uint64_t id) const {
    library_.activityPushExternalCorrelationId(cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
  }
  void pop() const {
    std::uint64_t last = 0;
    library_.activityPopExternalCorrelationId(cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
  }
  // Graph capture of NCCL calls, on the capturing job thread around the real call (not a hot path):
  // beginCapture() returns the id that the nodes created meanwhile are mapped to (0 when graph replays
  // are not traced); endCapture() notes the calls captured, by communicator index and sequence number.
  struct CapturedCall {
    std::uint32_t comm = 0;
    std::int64_t seq = 0;
  };
  static constexpr std::size_t kMaxCaptures = 4096;  // beyond: "graph_capture" drops
  std::uint32_t beginCapture();
  void endCapture(std::uint32_t capture, std::span<const CapturedCall> calls);
  // Background thread, after flush(): the replays complete so far (all of them when `final`), one entry
  // per captured call and replay, in launch order.
  void takeReplays(std::vector<ReplaySpan>& out, bool final);

  // Records dropped so far (by CUPTI, for want of a buffer). Any thread.
  std::uint64_t drops() const { return drops_.load(std::memory_order_acquire); }

  // Background thread: delivers the completed buffers (cuptiActivityFlushAll(0)) and counts drops.
  void flush();
  std::uint64_t flushes() const { return flushes_.load(std::memory_order_acquire); }
  // Monotonic time at which the last flush began (0: none yet).
  std::int64_t lastFlushBeganNs() const { return last_flush_began_ns_.load(std::memory_order_acquire); }
  // Background thread: the span of `id` as Unix-epoch ns, once a kernel record of it has arrived.
  bool span(std::uint64_t id, std::int64_t& start_epoch_ns, std::int64_t& end_epoch_ns);
  void forget(std::uint64_t id);

 private:
  explicit CuptiTracer(const cupti::Library& library);
  static void requestBuffer(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records);
  static void completeBuffer(cuda::CUcontext context, std::uint32_t stream, std::uint8_t* buffer,
                             std::size_t size, std::size_t valid);
  static void onCallback(void* userdata, cupti::CUpti_CallbackDomain domain, cupti::CUpti_CallbackId cbid,
                         const void* data);
  bool subscribeToGraphNodes(std::string& why);
  // `records`: CUPTI's kernel records wanted (switched when they are not on throughout); `open`: the window.
  void setWindow(bool records, bool open);
  // Applies the queued openings and closings to windows_ (holding mutex_).
  void applyWindowEvents();
  bool measureOffset();
  void countDropped(cuda::CUcontext context, std::uint32_t stream);

  const cupti::Library library_;
  std::unique_ptr<std::uint8_t[]> pool_;
  std::atomic<std::uint32_t> free_{(1u << kBuffers) - 1};  // bit i: buffer i is free
  std::atomic<std::uint64_t> drops_{0};
  std::int64_t offset_ns_ = 0;  // Unix-epoch ns − CUPTI timestamp
  std::atomic<std::uint64_t> flushes_{0};
  std::atomic<std::int64_t> last_flush_began_ns_{0};
  std::mutex mutex_;  // spans_
  KernelSpans spans_;
  bool graphs_ = false;  // the graph-node callbacks are on
  std::atomic<std::uint32_t> next_capture_{0};
  std::mutex captures_mutex_;  // captures_
  std::unordered_map<std::uint32_t, std::vector<CapturedCall>> captures_;
  std::vector<KernelSpans::Replay> taken_;  // background thread
  bool spans_on_ = true;                    // the kernel records are on throughout
  GpuWindowConfig window_config_;
  bool windows_by_step_ = false;
  std::atomic<bool> windows_on_{false};
  std::atomic<bool> window_open_{false};                       // what the host asked for last
  std::atomic<bool> records_on_{false};                        // the same for the kernel records
  std::mutex records_mutex_;                                   // switching the kernel records (records_on_)
  WindowKernels windows_;                                      // mutex_
  static constexpr std::size_t kMaxWindowEvents = 256;         // queued between two buffers (never near it)
  std::mutex events_mutex_;                                    // window_events_, window_open_'s changes
  std::vector<std::pair<std::uint64_t, bool>> window_events_;  // (CUPTI time, opens)
  std::vector<std::pair<std::uint64_t, bool>> applying_;       // mutex_
  std::uint64_t window_drops_counted_ = 0;                     // mutex_
  std::vector<WindowKernels::Row> window_rows_;                // background thread
  std::mutex names_mutex_;                                     // names_, name_ids_
  std::vector<std::string> names_{""};                         // by range id; 0: none
  std::unordered_map<std::string, std::uint32_t> name_ids_;
  std::uint64_t replay_drops_counted_ = 0;  // mutex_
};

}  // namespace gradscope::agent
