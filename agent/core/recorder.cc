#include "core/recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/correlator.h"
#include "core/nccl_profile.h"
#include "core/shadow.h"
#include "core/trace_output.h"
#include "gradscope/common/error.h"
#include "gradscope/common/launcher.h"
#include "gradscope/common/version.h"

namespace gradscope::agent {

std::atomic<bool> g_recording{false};
constinit thread_local ThreadBuffer* t_buffer __attribute__((tls_model("initial-exec"))) = nullptr;
ThreadBuffer::RateLimit g_rate_limit;
CommRegistry* const g_comm_registry = new CommRegistry();
StepMarker g_step_marker = StepMarker::None;

namespace {

// ---- state fixed at load ---------------------------------------------------------------------------

Config g_config;
std::vector<std::string> g_config_errors;
std::atomic<std::int64_t> g_step_call_counter{0};
std::atomic<std::int64_t> g_nvtx_steps{0};
std::atomic<int> g_log_rank{-1};

// ---- state created at activation --------------------------------------------------------------------

std::mutex g_lifecycle_mutex;  // activate() and finish()
bool g_activated = false;
bool g_finished = false;
pid_t g_owner_pid = 0;  // the process that activated: a forked child never touches the file
ThreadBufferTable* g_buffers = nullptr;
std::atomic<GpuTimer*> g_gpu_timer{nullptr};

// Wake-up pipe of the background thread (byte 0 = stop, else a signal number) and the pipe on which
// it answers a signal handler.
int g_wake_pipe[2] = {-1, -1};
int g_done_pipe[2] = {-1, -1};

// What countDrop() counted, by kind, until the background thread takes it (Flusher::takeDrops).
std::atomic<std::int64_t> g_drops[kDropKinds] = {};
// Set when the background thread stops recording after an error (Flusher::fail).
std::atomic<bool> g_recording_failed{false};

constexpr std::size_t kindIndex(DropKind kind) {
  return static_cast<std::size_t>(kind);
}

void countDrops(DropKind kind, std::int64_t count) {
  g_drops[kindIndex(kind)].fetch_add(count, std::memory_order_relaxed);
}

// Owns the calling thread's buffer claim: returns it to the table when the thread exits.
struct BufferOwner {
  ThreadBuffer* buffer = nullptr;
  ~BufferOwner() {
    if (buffer != nullptr) {
      t_buffer = nullptr;
      ThreadBufferTable::release(buffer);
    }
  }
};
thread_local BufferOwner t_owner;

void writeAll(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

// What an intercepted call costs the calling thread, measured on it with the same operations: a
// communicator look-up that hits (the common case: the thread's last communicator), then for a recorded
// call the rate limit's admission, two clock reads and a record written into a ring, and for a call the
// rate limit turns away the admission alone. bench/agent_hot_path.c measures the real wrapper; the two
// agree within a few ns. About 1 ms, run by the activating thread inside MPI_Init or the first
// communicator's creation: on the background thread, at its start, it took that millisecond from a rank
// whose timed loop had begun.
struct HotPathCost {
  double recorded_ns = 0, dropped_ns = 0;
};

HotPathCost measureHotPath() {
  constexpr int kCalls = 20000;
  HotPathCost cost;
  ThreadBuffer scratch(32768);
  // A private registry, never destroyed: the thread's last-hit pointer points into it until the thread
  // looks up one of the job's communicators (whose handles never equal `handle`'s address).
  static CommRegistry* const registry = new CommRegistry();
  static const int handle = 0;
  if (registry->size() == 0) registry->add(&handle, {Backend::Unknown, "scratch", 1, 0});
  // A window longer than the loop with more calls than it makes: the limit's bookkeeping, nothing turned
  // away.
  const ThreadBuffer::RateLimit roomy{std::numeric_limits<std::uint64_t>::max() / 2,
                                      std::numeric_limits<std::uint32_t>::max()};
  // Twice: the first pass warms the caches and the branch predictor, the second is what a warm thread
  // pays (the ring's pages are resident from the start, as every thread's are).
  for (int pass = 0; pass < 2; ++pass) {
    const std::int64_t t0 = monotonicNs();
    for (int i = 0; i < kCalls; ++i) {
      const CommSlot* slot = registry->find(&handle);
      std::uint64_t start = 0;
      if (!scratch.admit(roomy, ticks, start) || !scratch.roomOrDrop()) continue;
      const std::uint64_t end = ticks();
      if (CallEvent* event = scratch.reserve()) {
        event->call.start = event->call.enqueue = start;
        event->call.end = end;
        event->header.comm = slot == nullptr ? 0 : slot->index;
        event->header.seq = i;
        scratch.publish();
      }
    }
    cost.recorded_ns = static_cast<double>(monotonicNs() - t0) / kCalls;
    scratch.drain([](const CallEvent&) {});
  }
  // One call per window, and a window longer than the loop: every call but the first is turned away.
  const ThreadBuffer::RateLimit spent{std::numeric_limits<std::uint64_t>::max() / 2, 1};
  scratch.restartRateWindow();
  for (int pass = 0; pass < 2; ++pass) {
    const std::int64_t t0 = monotonicNs();
    for (int i = 0; i < kCalls; ++i) {
      const CommSlot* slot = registry->find(&handle);
      std::uint64_t start = 0;
      if (slot != nullptr && scratch.admit(spent, ticks, start)) scratch.roomOrDrop();
    }
    cost.dropped_ns = static_cast<double>(monotonicNs() - t0) / kCalls;
  }
  return cost;
}

// ---- the background thread --------------------------------------------------------------------------
//
// Drains the rings, turns records into rows (ticks into times, GPU spans from the timer), joins what
// arrives about a call from elsewhere with it (NCCL's choices, explorations, graph replays: one bounded
// correlator each, correlator.h), counts drops, and hands everything to its TraceOutput, which it owns.
// Lock order: it takes two leaf locks, one at a time and never while holding another — the communicator
// registry's (CommRegistry::description) and shadow.h's result queue's (takeExploreRecords) — and none
// of the recorder's; the rings and the GPU timer it reads without one.

class Flusher {
 public:
  explicit Flusher(TraceOutput output) : output_(std::move(output)) {}

  void start() {
    thread_ = std::thread([this] { run(); });
  }
  // Before start(): afterwards the clock is the background thread's.
  double ticksPerNs() const { return clock_.ticksPerNs(); }
  void setHotPathCost(HotPathCost cost) { hot_path_ = cost; }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    // Job signals never land here: the handlers wait for this thread.
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    // Idle priority: on a machine whose cores the job keeps busy, this thread takes about 0.3% of one
    // (SCHED_IDLE's CFS weight is 3 against a normal thread's 1024) instead of a full share, and calls
    // it cannot keep up with are dropped and counted rather than slowing the job: with ranks that spin
    // in MPI, every moment this thread runs in a rank's place stalls all the ranks. Where SCHED_IDLE is
    // refused, nice 19 (weight 15). Both apply to this thread only.
    sched_param idle{};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle) != 0)
      setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
    // Any core, not only the rank's (GRADSCOPE_WRITER_CPUS=rank keeps the binding): launchers bind each
    // rank, and so every thread it starts, to one core, which the rank keeps busy computing or spinning
    // in MPI. Bound there, this thread ran only when its rank blocked, and dropped calls while other cores
    // sat idle: of 5,000,000 calls of a 1-rank loop on 2 cores it recorded 73,728 bound, 184,320 unbound.
    // At idle priority it still takes no core that has other work.
    if (g_config.writer_any_cpu) unbindCallingThread();
    pthread_setname_np(pthread_self(), "gradscope-write");
    const int timeout_ms =
        static_cast<int>(std::max<std::int64_t>(1, g_config.flush_interval_ns / 1'000'000));
    int signal_number = 0;
    for (;;) {
      pollfd wake{g_wake_pipe[0], POLLIN, 0};
      const int ready = poll(&wake, 1, timeout_ms);
      bool stop = false;
      if (ready > 0) {
        unsigned char byte = 0;
        if (read(g_wake_pipe[0], &byte, 1) == 1) {
          stop = true;
          signal_number = byte;
        }
      }
      // The last flush at normal priority: at the job's end, a launcher that got SIGTERM sends SIGKILL to
      // what is left as soon as one rank has died, and at idle priority, next to ranks still spinning in
      // MPI, this thread could be killed before the file is finished. (Leaving SCHED_IDLE for
      // SCHED_OTHER at nice 0 needs no privilege; a thread that fell back to nice 19 stays there.)
      if (stop) {
        sched_param normal{};
        pthread_setschedparam(pthread_self(), SCHED_OTHER, &normal);
      }
      flush(stop);
      if (stop) break;
    }
    close(/*signalled=*/signal_number != 0);
    if (signal_number != 0) {
      const char done = 1;
      writeAll(g_done_pipe[1], &done, 1);
    }
  }

  // Drains every buffer in batches of at most kBatch records, so that the background thread's memory
  // does not depend on how far behind it is.
  void flush(bool final) {
    // Explorations submitted so far: taken before the calls are drained, so that the calls they
    // belong to (recorded before them, on the same thread) are written by the time they are joined.
    std::vector<ExploreRecord> explorations = takeExploreRecords();
    const std::size_t buffers = g_buffers->size();
    dropped_per_buffer_.resize(buffers, 0);
    bool more = true;
    while (more) {
      // 1. Records, oldest first per thread. Buffers of exited threads are freed once drained.
      more = false;
      events_.clear();
      for (std::size_t i = 0; i < buffers && events_.size() < kBatch; ++i) {
        ThreadBuffer* buffer = g_buffers->at(i);
        if (buffer == nullptr) continue;
        const bool orphaned = buffer->state.load(std::memory_order_acquire) == ThreadBuffer::kOrphaned;
        const std::size_t room = kBatch - events_.size();
        if (buffer->drain([&](const CallEvent& event) { events_.push_back(event); }, room) == room)
          more = true;
        else if (orphaned) buffer->state.store(ThreadBuffer::kFree, std::memory_order_release);
      }
      if (!failed_) writeBatch(final && !more);
      else countLostCalls(events_);
      // Between batches, the CPU goes to whatever else is runnable here. At idle priority this thread
      // runs, once picked, until the next scheduler tick (4 ms at 250 Hz) unless it gives the CPU up: on
      // cores the job's ranks keep busy spinning in MPI, that was a 4 ms stall of every rank each time
      // (an 8-byte all-reduce loop ran 5% slower for it). A batch takes a fraction of a millisecond.
      if (more && !final) sched_yield();
    }
    if (!failed_) writeExplorations(explorations, final);
    if (failed_) return;
    try {
      output_.addDrops(takeDrops());
      output_.commit();
      clock_.refine();
    } catch (const std::exception& error) {
      fail(error.what());
    }
  }

  // Writes events_ (committed with the flush): communicators first, then the calls.
  void writeBatch(bool final) {
    try {
      // Every record refers to a communicator registered before it.
      output_.addComms(comms());
      // Host-timed calls now, GPU ones once their timer has the span.
      calls_.clear();
      extras_.clear();
      GpuTimer* timer = g_gpu_timer.load(std::memory_order_acquire);
      for (const CallEvent& event : events_) {
        if (event.header.kind == EventKind::NcclInfo) {
          ncclInfoArrived(event);
        } else if (event.header.kind == EventKind::PeerExtra) {
          peer_extra_ = event;  // its call's record comes next from the same ring
        } else if (event.call.gpu_slot != 0 && timer != nullptr) {
          pending_gpu_.push_back(event);
        } else {
          addCall(event, nullptr);
          addPeerExtra(event, calls_.back());
          if (event.call.graph_captured) captureArrived();
        }
      }
      resolveGpu(timer, final);
      if (timer != nullptr) addGraphReplays(*timer, final);
      if (timer != nullptr) addGpuActivity(*timer, final);
      if (!any_extra_) {
        std::stable_sort(calls_.begin(), calls_.end(),
                         [](const storage::CallRecord& a, const storage::CallRecord& b) {
                           return a.start_ns < b.start_ns;
                         });
        rememberWritten(calls_, output_.appendCalls(calls_));
      } else {
        writeCallsWithExtras();
      }
      calls_recorded_ += static_cast<std::int64_t>(calls_.size());
      if (final) nccl_info_.drain([](NcclInfoPayload&&) {});
    } catch (const std::exception& error) {
      fail(error.what());
      countLostCalls(events_);  // the batch that could not be written
    }
  }

  // Calls drained but never written once recording has stopped: "recording_stopped" drops, written
  // with the others at the end if the file still takes them.
  void countLostCalls(const std::vector<CallEvent>& events) {
    const auto calls = std::count_if(events.begin(), events.end(), [](const CallEvent& event) {
      return event.header.kind == EventKind::Call;
    });
    countDrops(DropKind::RecordingStopped, calls);
  }

  void resolveGpu(GpuTimer* timer, bool final) {
    if (timer == nullptr) return;
    // A span can be known only some time after the call's work has completed (GpuTimer::settleNs): at
    // the end, what is pending is given up only after that long and a margin (polled every millisecond).
    if (!final) return resolveGpuPass(*timer, false);
    const std::int64_t give_up_at = monotonicNs() + timer->settleNs() + kFinalGpuMarginNs;
    for (;;) {
      const bool last = monotonicNs() >= give_up_at;
      resolveGpuPass(*timer, last);
      if (last || pending_gpu_.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void resolveGpuPass(GpuTimer& timer, bool final) {
    timer.poll();
    // Calls complete in order per stream, not across streams: query every pending one.
    for (auto it = pending_gpu_.begin(); it != pending_gpu_.end();) {
      std::int64_t start = 0, end = 0;
      const auto status = timer.query(it->call.gpu_slot - 1, start, end);
      const bool give_up = final || pending_gpu_.size() > kMaxPendingGpu;
      if (status == GpuTimer::Status::Pending && !give_up) {
        ++it;
        continue;
      }
      std::int64_t span[2] = {start, end};
      if (status != GpuTimer::Status::Ready) {
        if (status != GpuTimer::Status::NoKernel) countDrop(DropKind::GpuTiming);
        addCall(*it, nullptr);  // host enqueue times instead
      } else {
        addCall(*it, span);
      }
      timer.release(it->call.gpu_slot - 1);
      it = pending_gpu_.erase(it);
    }
  }

  void addCall(const CallEvent& event, const std::int64_t* gpu_span) {
    calls_.push_back(toRecord(event, gpu_span));
    storage::CallRecord& call = calls_.back();
    // NCCL's reports name collectives by their sequence numbers; point-to-point calls and group launches
    // are numbered apart (call_event.h numberedApart).
    if (!numberedApart(call.api))
      nccl_info_.takeReports({call.comm_id, call.seq}, [&](NcclInfoPayload&& info) {
        call.nccl_algo = info.algo;
        call.nccl_proto = info.proto;
        call.nccl_channels = info.channels;
      });
    extras_.push_back({event.header.comm, event.call.sampled, event.call.strategy});
    // Explore and apply modes mark calls; observe mode never does, and keeps the plain sort below.
    if (event.call.sampled || event.call.strategy != 0) any_extra_ = true;
  }

  // ---- the second side of a call (call_event.h PeerExtraPayload) ----
  //
  // Written by the calling thread just before the call's record, so it is the record before it in the
  // same ring: kept until the next host-timed call, and attached when that call is its own (one of the
  // two may have been dropped with a full ring). Only MPI calls have one, and they are never GPU-timed.
  void addPeerExtra(const CallEvent& event, storage::CallRecord& call) {
    if (!peer_extra_) return;
    const EventHeader& extra = peer_extra_->header;
    if (extra.comm == event.header.comm && extra.seq == event.header.seq && extra.api == event.header.api) {
      const PeerExtraPayload& payload = peer_extra_->peer_extra;
      call.source = payload.source;
      call.recv_tag = payload.recv_tag;
      call.recv_bytes = payload.recv_bytes;
      call.peer_max_bytes = payload.peer_max_bytes;
      call.peer_min_bytes = payload.peer_min_bytes;
    }
    peer_extra_.reset();
  }

  // ---- NCCL's choices from the profiler plugin (nccl_profile.h) ----
  //
  // A report is recorded on the calling thread before the call's own record (the call is recorded after
  // NCCL returns), so it normally waits, keyed by (communicator row, seq), until its call is added, and is
  // attached to the call's row before it is written. A report that comes after its call was written
  // (another thread's ring, drained first) finds the call's id among the last kMaxNcclInfo written and
  // updates its row. Reports that find no call, pushed out or at the end, are "nccl_profile" drops.
  void ncclInfoArrived(const CallEvent& event) {
    nccl_info_.addReport(
        {output_.commRow(event.header.comm), event.header.seq}, event.nccl_info,
        [this](std::int64_t call_id, NcclInfoPayload&& info) { output_.setNcclInfo(call_id, info); },
        [](NcclInfoPayload&&) {});
  }

  // Calls with ids first, first + 1, ...: remembered for reports that come later (only once a plugin
  // has reported at all).
  void rememberWritten(const std::vector<storage::CallRecord>& calls, std::int64_t first) {
    if (!g_nccl_profile_active.load(std::memory_order_relaxed)) return;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      // Has its report already, or is a graph replay (NCCL reports the captured call).
      if (calls[i].nccl_algo >= 0 || calls[i].graph_replay > 0 || numberedApart(calls[i].api)) continue;
      nccl_info_.addCall(
          {calls[i].comm_id, calls[i].seq}, first + static_cast<std::int64_t>(i),
          [this](std::int64_t call_id, NcclInfoPayload&& info) { output_.setNcclInfo(call_id, info); });
    }
  }

  // ---- graph replays (cupti_tracer.h) ----
  //
  // A graph-captured call's row is written like any call's (host-timed: its capture). Each of its GPU
  // executions, reported by the timer once complete, is a row of its own: a copy of the captured call's
  // with graph_replay 1, 2, ... and the GPU's times (docs/schema.md, "CUDA graphs"). The last
  // kMaxCaptured captured calls are remembered, by (communicator row, seq); a replay whose captured call
  // has not been drained from its thread's ring yet (a batch holds at most kBatch records) waits for it.
  // A replay that finds no captured call, pushed out or at the end, is a "graph_replay" drop.
  struct Captured {
    storage::CallRecord call;
    std::int64_t replays = 0;
  };

  // The call just added (calls_.back()) was captured into a graph.
  void captureArrived() {
    const storage::CallRecord call = calls_.back();
    replays_.addCall({call.comm_id, joinSeq(call.api, call.seq)}, Captured{call, 0},
                     [this](Captured& captured, ReplaySpan&& span) { addReplay(captured, span); });
  }

  void addGraphReplays(GpuTimer& timer, bool final) {
    replay_spans_.clear();
    timer.takeGraphReplays(replay_spans_, final);
    for (const ReplaySpan& span : replay_spans_)
      replays_.addReport(
          {output_.commRow(span.comm), span.seq}, span,
          [this](Captured& captured, ReplaySpan&& replay) { addReplay(captured, replay); },
          [](ReplaySpan&&) {});
    if (final) replays_.drain([](ReplaySpan&&) {});
  }

  // The sampled GPU windows' rows, as they complete (cupti_tracer.h, "Windows").
  void addGpuActivity(GpuTimer& timer, bool final) {
    gpu_spans_.clear();
    timer.takeGpuActivity(gpu_spans_, final);
    if (gpu_spans_.empty()) return;
    gpu_rows_.clear();
    for (const GpuActivitySpan& span : gpu_spans_)
      gpu_rows_.push_back({output_.rankId(), static_cast<storage::GpuActivityKind>(span.kind),
                           span.start_epoch_ns - output_.epochNs(), span.end_epoch_ns - output_.epochNs(),
                           span.kernels,
                           span.range.empty() ? std::nullopt : std::optional<std::string>(span.range)});
    output_.appendGpuActivity(gpu_rows_);
  }

  void addReplay(Captured& captured, const ReplaySpan& span) {
    storage::CallRecord replay = captured.call;
    replay.graph_replay = ++captured.replays;
    replay.step = -1;  // the capture's step is not the launch's; merge detects steps
    replay.start_ns = replay.enqueue_ns = span.start_epoch_ns - output_.epochNs();
    replay.end_ns = std::max(span.start_epoch_ns, span.end_epoch_ns) - output_.epochNs();
    calls_.push_back(replay);
    extras_.push_back({span.comm, false, 0});
  }

  // ---- explorations (shadow.h) ----
  //
  // The calls in time order, like the plain path, remembering which rows the explored and applied
  // calls became: explorations link to them, applied calls get their applied_calls row.
  void writeCallsWithExtras() {
    order_.resize(calls_.size());
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    std::stable_sort(order_.begin(), order_.end(), [this](std::size_t a, std::size_t b) {
      return calls_[a].start_ns < calls_[b].start_ns;
    });
    sorted_.clear();
    for (const std::size_t i : order_) sorted_.push_back(calls_[i]);
    const std::int64_t first = output_.appendCalls(sorted_);
    rememberWritten(sorted_, first);
    applied_.clear();
    for (std::size_t k = 0; k < order_.size(); ++k) {
      const Extra& extra = extras_[order_[k]];
      const std::int64_t id = first + static_cast<std::int64_t>(k);
      if (extra.sampled)
        explorations_.addCall({extra.comm, sorted_[k].seq}, id,
                              [this](std::int64_t call_id, ExploreRecord&& record) {
                                explorations_ready_.push_back({std::move(record), call_id});
                              });
      if (extra.strategy != 0) applied_.push_back({id, appliedStrategyName(extra.strategy)});
    }
    if (!applied_.empty()) output_.appendApplied(applied_);
  }

  // Measurements and consensus rows of the explorations, each linked to its call once the call is
  // written, by (communicator index, seq). An MPI_Iallreduce is explored before it is issued and recorded
  // at its completion, possibly many flushes later; an exploration whose call never comes (dropped) waits
  // until the end, or until kMaxPendingExplorations newer ones waited, and is then written without the
  // link (an "explore_link" drop).
  void writeExplorations(std::vector<ExploreRecord>& explorations, bool final) {
    try {
      const auto unlinked = [this](ExploreRecord&& record) {
        explorations_ready_.push_back({std::move(record), std::nullopt});
      };
      for (ExploreRecord& record : explorations)
        explorations_.addReport(
            {record.comm, record.seq}, std::move(record),
            [this](std::int64_t call_id, ExploreRecord&& linked) {
              explorations_ready_.push_back({std::move(linked), call_id});
            },
            unlinked);
      if (final) explorations_.drain(unlinked);
      for (const auto& [record, call_id] : explorations_ready_) output_.writeExploration(record, call_id);
      explorations_ready_.clear();
    } catch (const std::exception& error) {
      fail(error.what());
    }
  }

  storage::CallRecord toRecord(const CallEvent& event, const std::int64_t* gpu_span) const {
    const std::int64_t epoch_ns = output_.epochNs();
    storage::CallRecord call;
    call.rank_id = output_.rankId();
    call.comm_id = output_.commRow(event.header.comm);
    call.seq = event.header.seq;
    call.step = event.call.step;
    call.api = event.header.api;
    call.dtype = event.header.dtype;
    call.op = event.header.op;
    call.count = event.call.count;
    call.bytes = event.call.bytes;
    call.enqueue_ns = clock_.toEpochNs(event.call.enqueue) - epoch_ns;
    if (gpu_span != nullptr) {
      call.start_ns = gpu_span[0] - epoch_ns;
      call.end_ns = gpu_span[1] - epoch_ns;
    } else {
      call.start_ns = clock_.toEpochNs(event.call.start) - epoch_ns;
      call.end_ns = clock_.toEpochNs(event.call.end) - epoch_ns;
    }
    if (call.end_ns < call.start_ns) call.end_ns = call.start_ns;
    call.stream = event.call.stream;
    switch (collectiveOf(call.api)) {
      case Collective::Send:
      case Collective::SendRecv:
        call.dest = event.call.peer;
        call.send_tag = event.call.tag;
        break;
      case Collective::Recv:
        call.source = event.call.peer;
        call.recv_tag = event.call.tag;
        call.recv_bytes = call.bytes;
        break;
      case Collective::AllToAll:
        // NCCL's is even: count elements to every peer (MPI's come with their spread, addPeerExtra).
        if (backendOf(call.api) == Backend::Nccl)
          call.peer_max_bytes = call.peer_min_bytes =
              call.count * static_cast<std::int64_t>(sizeOf(call.dtype));
        break;
      default: break;
    }
    return call;
  }

  void fail(const std::string& what) {
    if (failed_) return;
    failed_ = true;
    stopped_because_ = what;
    g_recording_failed.store(true, std::memory_order_relaxed);
    g_recording.store(false, std::memory_order_relaxed);
    log("{}; recording stopped, the job continues", what);
  }

  // Drops counted since the last commit, by kind, taken (the counters start again from 0): the full
  // rings' and the rate limit's, every kind counted elsewhere (countDrop), and the joins'.
  DropCounts takeDrops() {
    DropCounts drops{};
    const std::size_t buffers = g_buffers->size();
    dropped_per_buffer_.resize(buffers, 0);
    rate_dropped_per_buffer_.resize(buffers, 0);
    for (std::size_t i = 0; i < buffers; ++i) {
      const std::uint64_t dropped = g_buffers->at(i)->dropped();
      drops[kindIndex(DropKind::Call)] += static_cast<std::int64_t>(dropped - dropped_per_buffer_[i]);
      dropped_per_buffer_[i] = dropped;
      const std::uint64_t rate_dropped = g_buffers->at(i)->rateDropped();
      drops[kindIndex(DropKind::CallRate)] +=
          static_cast<std::int64_t>(rate_dropped - rate_dropped_per_buffer_[i]);
      rate_dropped_per_buffer_[i] = rate_dropped;
    }
    for (std::size_t kind = 0; kind < kDropKinds; ++kind)
      drops[kind] += g_drops[kind].exchange(0, std::memory_order_relaxed);
    drops[kindIndex(nccl_info_.kind())] += nccl_info_.takeDropped();
    drops[kindIndex(replays_.kind())] += replays_.takeDropped();
    drops[kindIndex(explorations_.kind())] += explorations_.takeDropped();
    calls_dropped_ += drops[kindIndex(DropKind::Call)] + drops[kindIndex(DropKind::CallRate)] +
                      drops[kindIndex(DropKind::RecordingStopped)];
    return drops;
  }

  void close(bool signalled) {
    g_recording.store(false, std::memory_order_relaxed);
    if (failed_) {
      // The calls the failure rolled back and every one drained or intercepted since are
      // "recording_stopped" drops, beside the other kinds' counts.
      countDrops(DropKind::RecordingStopped, output_.callsRolledBack());
      calls_recorded_ -= output_.callsRolledBack();
      const DropCounts drops = takeDrops();
      output_.closeAfterFailure(drops, calls_recorded_, calls_dropped_, stopped_because_,
                                clock_.epochNsNow());
      return;
    }
    try {
      output_.addDrops(takeDrops());
      timespec cpu{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
      AgentStatistics stats;
      stats.calls_recorded = calls_recorded_;
      stats.calls_dropped = calls_dropped_;
      stats.hot_path_ns = hot_path_.recorded_ns;
      stats.dropped_call_ns = hot_path_.dropped_ns;
      stats.flusher_cpu_ns = static_cast<std::int64_t>(cpu.tv_sec) * 1'000'000'000 + cpu.tv_nsec;
      stats.buffer_bytes = static_cast<std::int64_t>(g_buffers->size()) * g_buffers->capacity() *
                           static_cast<std::int64_t>(sizeof(CallEvent));
      if (const GpuTimer* timer = g_gpu_timer.load(std::memory_order_acquire)) {
        GpuTimer::SpanSource spans = timer->spanSource();
        stats.gpu_spans = std::move(spans.source);
        stats.gpu_spans_note = std::move(spans.note);
      }
      output_.finish(stats, clock_.epochNsNow(), signalled);
    } catch (const std::exception& error) {
      fail(error.what());
    }
  }

  struct Extra {
    std::uint32_t comm;
    bool sampled;
    std::uint16_t strategy;
  };
  struct ExplorationToWrite {
    ExploreRecord record;
    std::optional<std::int64_t> call_id;
  };

  static constexpr std::size_t kMaxPendingGpu = 1 << 16;
  // At the end, beyond GpuTimer::settleNs: the calls whose work was still running when the job ended.
  static constexpr std::int64_t kFinalGpuMarginNs = 10'000'000;
  static constexpr std::size_t kBatch = 256;
  // The joins' bounds (correlator.h): how many calls each remembers, and how many reports wait.
  static constexpr std::size_t kMaxNcclInfo = 4096;
  static constexpr std::size_t kMaxCaptured = 4096;
  static constexpr std::size_t kMaxPendingExplorations = 256;

  TraceOutput output_;
  HotPathCost hot_path_;
  ClockConversion clock_;
  std::thread thread_;
  std::vector<CallEvent> events_;
  std::vector<storage::CallRecord> calls_;
  std::optional<CallEvent> peer_extra_;  // the last PeerExtra record, until the call it belongs to
  std::vector<Extra> extras_;
  std::vector<std::size_t> order_;
  std::vector<storage::CallRecord> sorted_;
  std::vector<storage::AppliedCall> applied_;
  bool any_extra_ = false;
  std::deque<CallEvent> pending_gpu_;
  // Keyed by (communicator row, seq): a call's row id / its captured record.
  BoundedCorrelator<CommSeq, std::int64_t, NcclInfoPayload, CommSeqHash> nccl_info_{kMaxNcclInfo,
                                                                                    DropKind::NcclProfile};
  BoundedCorrelator<CommSeq, Captured, ReplaySpan, CommSeqHash> replays_{kMaxCaptured, DropKind::GraphReplay};
  std::vector<ReplaySpan> replay_spans_;
  std::vector<GpuActivitySpan> gpu_spans_;
  std::vector<storage::GpuActivityRecord> gpu_rows_;
  // Keyed by (communicator index, seq), as explorations name their call: the call's row id.
  BoundedCorrelator<CommSeq, std::int64_t, ExploreRecord, CommSeqHash> explorations_{kMaxPendingExplorations,
                                                                                     DropKind::ExploreLink};
  std::vector<ExplorationToWrite> explorations_ready_;
  std::vector<std::uint64_t> dropped_per_buffer_, rate_dropped_per_buffer_;
  std::int64_t calls_recorded_ = 0, calls_dropped_ = 0;
  bool failed_ = false;
  std::string stopped_because_;  // fail()'s reason
};

Flusher* g_flusher = nullptr;

// ---- signals ----------------------------------------------------------------------------------------

constexpr int kFlushSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Async-signal-safe: write, poll, sigaction, raise. Waits at most 3 s for the file to be finished,
// then lets the signal's default action (termination) happen as it would without the agent.
void onTerminatingSignal(int signal_number) {
  if (getpid() == g_owner_pid && g_wake_pipe[1] >= 0) {
    const auto byte = static_cast<unsigned char>(signal_number);
    writeAll(g_wake_pipe[1], &byte, 1);
    pollfd done{g_done_pipe[0], POLLIN, 0};
    while (poll(&done, 1, 3000) < 0 && errno == EINTR) {
    }
  }
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal_number, &action, nullptr);
  raise(signal_number);  // pending until this handler returns, then terminates the process
}

// Only where the job left the default action: a job's own handler (Python's SIGINT, a trainer's
// checkpoint-on-SIGTERM) stays in charge, and its normal exit path finishes the trace.
void installSignalHandlers() {
  for (const int signal_number : kFlushSignals) {
    struct sigaction current {};
    if (sigaction(signal_number, nullptr, &current) != 0) continue;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) continue;
    struct sigaction action {};
    action.sa_handler = onTerminatingSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(signal_number, &action, nullptr);
  }
}

void atExit() {
  finish();
}

void afterForkInChild() {
  // The child shares the parent's file handle and buffers: it must never write either.
  g_recording.store(false, std::memory_order_relaxed);
}

void onLoad() {
  chooseTickSource();
  g_config = parseConfig([](const char* name) { return static_cast<const char*>(std::getenv(name)); },
                         g_config_errors);
  if (g_config.step_calls > 0) g_step_marker = StepMarker::CallCount;
  else if (!g_config.step_nvtx.empty()) g_step_marker = StepMarker::Nvtx;
  if (g_config.env_rank) g_log_rank.store(*g_config.env_rank, std::memory_order_relaxed);
  pthread_atfork(nullptr, nullptr, afterForkInChild);
}

// Runs when the library loads, after every global above is initialised (declaration order within
// this file; an __attribute__((constructor)) would have no defined order against them).
struct Loader {
  Loader() { onLoad(); }
} g_loader;

}  // namespace

bool unbindCallingThread() {
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  if (configured <= 0) return false;
  const auto cpus = static_cast<std::size_t>(configured);
  cpu_set_t* set = CPU_ALLOC(cpus);
  if (set == nullptr) return false;
  const std::size_t size = CPU_ALLOC_SIZE(cpus);
  CPU_ZERO_S(size, set);
  for (std::size_t cpu = 0; cpu < cpus; ++cpu) CPU_SET_S(cpu, size, set);
  const bool done = pthread_setaffinity_np(pthread_self(), size, set) == 0;
  CPU_FREE(set);
  return done;
}

ThreadBuffer* claimThreadBuffer() {
  if (g_buffers == nullptr) return nullptr;
  ThreadBuffer* buffer = g_buffers->claim();
  if (buffer == nullptr) {
    countDrop(DropKind::ThreadBuffer);
    return nullptr;
  }
  t_buffer = buffer;
  t_owner.buffer = buffer;
  return buffer;
}

namespace {
std::atomic<StepListener> g_step_listener{nullptr};
void stepBegan(std::int64_t step) {
  if (const StepListener listener = g_step_listener.load(std::memory_order_acquire)) listener(step);
}
}  // namespace

void setStepListener(StepListener listener) {
  g_step_listener.store(listener, std::memory_order_release);
}

std::int64_t currentStep() {
  if (g_config.step_calls > 0) {
    const std::int64_t calls = g_step_call_counter.load(std::memory_order_relaxed);
    return calls == 0 ? -1 : (calls - 1) / g_config.step_calls;
  }
  if (!g_config.step_nvtx.empty()) return g_nvtx_steps.load(std::memory_order_relaxed) - 1;
  return -1;
}

std::int64_t stepForCallSlow(Api api) {
  if (g_config.step_calls > 0) {
    if (familyOf(api) != ApiFamily::Collective)
      return g_step_call_counter.load(std::memory_order_relaxed) / g_config.step_calls;
    const std::int64_t call = g_step_call_counter.fetch_add(1, std::memory_order_relaxed);
    if (call % g_config.step_calls == 0) stepBegan(call / g_config.step_calls);
    return call / g_config.step_calls;
  }
  if (!g_config.step_nvtx.empty()) return g_nvtx_steps.load(std::memory_order_relaxed) - 1;
  return -1;
}

namespace {
std::atomic<void (*)(const char*)> g_range_pushed{nullptr};
std::atomic<void (*)()> g_range_popped{nullptr};
}  // namespace

void setNvtxRangeListener(NvtxRangeListener listener) {
  g_range_popped.store(listener.popped, std::memory_order_release);
  g_range_pushed.store(listener.pushed, std::memory_order_release);
}

bool wantsNvtx() {
  return !g_config.disabled && (!g_config.step_nvtx.empty() || !g_config.gpu_windows.off);
}

void nvtxRangePushed(const char* name) {
  if (name != nullptr && !g_config.step_nvtx.empty() && g_config.step_nvtx == name)
    stepBegan(g_nvtx_steps.fetch_add(1, std::memory_order_relaxed));
  if (const auto pushed = g_range_pushed.load(std::memory_order_acquire)) pushed(name);
}

void nvtxRangePopped() {
  if (const auto popped = g_range_popped.load(std::memory_order_acquire)) popped();
}

const Config& config() {
  return g_config;
}

bool configHasErrors() {
  return !g_config_errors.empty();
}

bool activated() {
  const std::lock_guard lock(g_lifecycle_mutex);
  return g_activated;
}

bool activate(const Activation& activation) {
  const std::lock_guard lock(g_lifecycle_mutex);
  if (g_activated) return recording();
  g_activated = true;
  g_owner_pid = getpid();
  g_log_rank.store(activation.rank, std::memory_order_relaxed);
  if (g_config.disabled) return false;
  // A setuid/setgid program (the kernel's secure-execution mode): its privileges must not write files
  // named by the invoking user's environment, nor read a recommendation from there. ld.so already
  // ignores LD_PRELOAD of a non-system path there; this covers an agent loaded any other way.
  if (::getauxval(AT_SECURE) != 0) {
    log("not recording in a setuid or setgid process; the job runs untouched");
    return false;
  }
  if (!g_config_errors.empty()) {
    for (const std::string& error : g_config_errors)
      log("{}; recording is off, the job runs untouched", error);
    return false;
  }
  const std::string host = hostName();
  const std::string path =
      expandOutputTemplate(g_config.output, activation.rank, static_cast<long>(getpid()), host);
  try {
    const std::int64_t epoch_ns = realtimeNs();
    nlohmann::json config = {
        {"mode", modeName(g_config.mode)},
        {"flush_interval_ns", g_config.flush_interval_ns},
        {"buffer_calls", g_config.buffer_calls},
        {"max_call_rate", g_config.max_call_rate},
        {"clock", g_ticks_are_tsc ? "tsc" : "monotonic"},
    };
    if (g_config.step_calls > 0) config["step_calls"] = g_config.step_calls;
    if (g_config.validate_window > 0) config["validate_window"] = g_config.validate_window;
    if (!g_config.step_nvtx.empty()) config["step_nvtx"] = g_config.step_nvtx;
    if (g_config.mode == Mode::Explore) {
      const ExploreConfig& explore = g_config.explore;
      config["explore"] = {{"budget", explore.budget},
                           {"samples", explore.samples},
                           {"warmup", explore.warmup},
                           {"spacing", explore.spacing},
                           {"reps", explore.reps},
                           {"warmup_reps", explore.warmup_reps},
                           {"strategies", explore.strategies},
                           {"shadow_bytes", explore.shadow_bytes}};
    } else if (g_config.mode == Mode::Apply) {
      config["apply"] = {{"recommendation", g_config.recommendation},
                         {"allow_semantic_change", g_config.allow_semantic_change}};
    }
    storage::RunInfo run;
    run.uuid = g_config.run_id.empty() ? randomUuid() : g_config.run_id;
    if (activation.spawned) {
      const std::string own = spawnedRunId(run.uuid, processEnvironment());
      if (!g_config.run_id.empty()) config["spawned_by"] = g_config.run_id;
      run.uuid = own.empty() ? randomUuid() : own;
    }
    run.command = g_config.command.empty() ? processCommandLine() : g_config.command;
    run.mode = std::string(modeName(g_config.mode));
    run.backend = activation.backend;
    run.world_size = activation.world_size;
    run.host = host;
    run.config_json = config.dump();
    run.tool_version = kVersion;
    run.epoch_ns = epoch_ns;
    run.start_ns = 0;
    storage::RankInfo rank;
    rank.rank = activation.rank;
    rank.host = host;
    rank.pid = getpid();
    rank.device = activation.device;
    TraceOutput output = TraceOutput::create(path, run, rank);
    if (pipe2(g_wake_pipe, O_CLOEXEC) != 0 || pipe2(g_done_pipe, O_CLOEXEC) != 0)
      fail("cannot create the agent's wake-up pipe: {}", errnoMessage(errno));
    g_buffers = new ThreadBufferTable(g_config.buffer_calls);
    g_flusher = new Flusher(std::move(output));
    g_flusher->setHotPathCost(measureHotPath());
    if (g_config.max_call_rate > 0) {
      // The tick rate of the flusher's first 2 ms: a window a few % off its length changes nothing.
      g_rate_limit.window_ticks =
          static_cast<std::uint64_t>(static_cast<double>(kCallRateWindowNs) * g_flusher->ticksPerNs());
      g_rate_limit.window_calls =
          static_cast<std::uint32_t>(g_config.max_call_rate * kCallRateWindowNs / 1'000'000'000);
    }
    g_flusher->start();
  } catch (const std::exception& error) {
    log("{}; recording is off, the job runs untouched (set GRADSCOPE_OUTPUT to a writable path)",
        error.what());
    return false;
  }
  installSignalHandlers();
  std::atexit(atExit);
  // The activating thread (inside MPI_Init or the first NCCL communicator's creation) is almost always
  // the one that calls the collectives: its ring is mapped and populated here, not in its first call.
  if (t_buffer == nullptr) claimThreadBuffer();
  g_recording.store(true, std::memory_order_release);
  return true;
}

void finish() {
  const std::lock_guard lock(g_lifecycle_mutex);
  if (g_flusher == nullptr || g_finished || getpid() != g_owner_pid) return;
  g_finished = true;
  g_recording.store(false, std::memory_order_relaxed);
  const unsigned char stop = 0;
  writeAll(g_wake_pipe[1], &stop, 1);
  g_flusher->join();
}

void countDrop(DropKind kind) {
  countDrops(kind, 1);
}

void countCallNotRecorded() {
  if (g_recording_failed.load(std::memory_order_relaxed)) countDrop(DropKind::RecordingStopped);
}

void setGpuTimer(GpuTimer* timer) {
  g_gpu_timer.store(timer, std::memory_order_release);
}

namespace {

// Whether stderr is known to be at the start of a line: where it is a regular file, its last byte says.
// A pipe (every rank's stderr under mpirun) or a terminal cannot be read back.
bool stderrAtLineStart() {
  struct stat status {};
  if (fstat(STDERR_FILENO, &status) != 0 || !S_ISREG(status.st_mode)) return false;
  if (status.st_size == 0) return true;
  const int fd = open("/proc/self/fd/2", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char last = 0;
  const bool read_back = pread(fd, &last, 1, status.st_size - 1) == 1;
  ::close(fd);
  return read_back && last == '\n';
}

}  // namespace

// Agent lines start on a line of their own: a job that wrote part of a line to stderr (a progress
// counter, unittest's "test_x ... ") would otherwise find "gradscope: ..." inside it. Where the start of
// a line cannot be known, the message brings its own newline first: an empty line before gradscope's,
// rather than gradscope's inside the job's. One write(2), so that ranks sharing a pipe do not interleave.
void logLine(const std::string& message) {
  const int rank = g_log_rank.load(std::memory_order_relaxed);
  const char* lead = stderrAtLineStart() ? "" : "\n";
  const std::string line = rank >= 0 ? fmt::format("{}gradscope: rank {}: {}\n", lead, rank, message)
                                     : fmt::format("{}gradscope: {}\n", lead, message);
  writeAll(STDERR_FILENO, line.data(), line.size());
}

}  // namespace gradscope::agent
