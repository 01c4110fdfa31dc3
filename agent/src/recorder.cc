#include "recorder.h"

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
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/common/error.h"
#include "gradscope/common/version.h"
#include "gradscope/storage/writer.h"
#include "nccl_profile.h"
#include "shadow.h"

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

struct DropCounter {
  const char* kind;
  std::atomic<std::int64_t> count{0};
};
DropCounter g_drop_counters[] = {
    {"thread_buffer", {}}, {"comm_table", {}},    {"gpu_timing", {}},   {"iallreduce_table", {}},
    {"stream_table", {}},  {"group_table", {}},   {"cupti_record", {}}, {"explore_result", {}},
    {"nccl_profile", {}},  {"graph_capture", {}}, {"graph_replay", {}}, {"recording_stopped", {}},
    {"other", {}}};
// Set when the background thread stops recording after an error (Flusher::fail).
std::atomic<bool> g_recording_failed{false};

// The counter of a kind ("other" for a kind not in the table).
DropCounter& dropCounter(const char* kind) {
  for (DropCounter& counter : g_drop_counters)
    if (std::strcmp(counter.kind, kind) == 0) return counter;
  return std::end(g_drop_counters)[-1];
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

std::string commandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  std::replace(raw.begin(), raw.end(), '\0', ' ');
  return raw;
}

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

bool createDirectories(const std::filesystem::path& directory, std::string& error);

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
        event->start = event->enqueue = start;
        event->end = end;
        event->comm = slot == nullptr ? 0 : slot->index;
        event->seq = i;
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

class Flusher {
 public:
  Flusher(storage::TraceWriter writer, std::int64_t run_id, std::int64_t rank_id, std::int64_t epoch_ns,
          std::string config_json)
      : writer_(std::move(writer)),
        run_id_(run_id),
        rank_id_(rank_id),
        epoch_ns_(epoch_ns),
        config_json_(std::move(config_json)) {}

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
    // belong to (recorded before them, on the same thread) are written by the time they are linked.
    for (ExploreRecord& record : takeExploreRecords()) pending_explore_.push_back({std::move(record)});
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
    if (!failed_) writeExplorations(final);
    if (failed_) return;
    try {
      writeDrops();
      writer_.commit();
      clock_.refine();
    } catch (const std::exception& error) {
      fail(error.what());
      return;
    }
    restoreIfRemoved();
  }

  // The output file (or its directory) removed while the job runs: SQLite would go on writing the
  // unlinked file and everything would vanish at exit. Instead the directory and the file are made again
  // with everything committed so far, and recording goes on there.
  void restoreIfRemoved() {
    if (!writer_.removed()) return;
    const std::string path = writer_.path();
    const auto lost = [&](const std::string& why) {
      fail(fmt::format("{} was removed while the job ran and cannot be written again ({})", path, why));
    };
    std::string error;
    if (!createDirectories(std::filesystem::path(path).parent_path(), error)) return lost(error);
    try {
      writer_.recreate();
    } catch (const std::exception& failure) {
      return lost(failure.what());
    }
    log("{} was removed while the job ran; written again with the {} calls recorded so far, recording goes "
        "on",
        path, writer_.callCount());
  }

  // Writes events_ (committed with the flush): communicators first, then the calls.
  void writeBatch(bool final) {
    try {
      // Every record refers to a communicator registered before it.
      CommRegistry& registry = comms();
      for (std::size_t i = comm_rows_.size(); i < registry.size(); ++i) {
        const CommDescription description = registry.description(i);
        storage::CommInfo comm;
        comm.rank_id = rank_id_;
        comm.key = description.key;
        comm.backend = description.backend;
        comm.size = description.size;
        comm.comm_rank = description.rank;
        comm_rows_.push_back(writer_.addComm(comm));
      }
      // Host-timed calls now, GPU ones once their timer has the span.
      calls_.clear();
      extras_.clear();
      GpuTimer* timer = g_gpu_timer.load(std::memory_order_acquire);
      for (const CallEvent& event : events_) {
        if ((event.flags & kNcclInfo) != 0) ncclInfoArrived(event);
        else if (event.gpu_slot != 0 && timer != nullptr) pending_gpu_.push_back(event);
        else addCall(event, nullptr);
        if ((event.flags & kGraphCaptured) != 0 && (event.gpu_slot == 0 || timer == nullptr) &&
            captured_.size() < kMaxCaptured)
          captured_.try_emplace({calls_.back().comm_id, calls_.back().seq}, Captured{calls_.back(), 0});
      }
      resolveGpu(timer, final);
      if (timer != nullptr) addGraphReplays(*timer, final);
      if (!any_extra_) {
        std::stable_sort(calls_.begin(), calls_.end(),
                         [](const storage::CallRecord& a, const storage::CallRecord& b) {
                           return a.start_ns < b.start_ns;
                         });
        rememberWritten(calls_, writer_.appendCalls(calls_));
      } else {
        writeCallsWithExtras();
      }
      calls_recorded_ += static_cast<std::int64_t>(calls_.size());
      if (final) dropUnmatchedNcclInfo();
    } catch (const std::exception& error) {
      fail(error.what());
      countLostCalls(events_);  // the batch that could not be written
    }
  }

  // Calls drained but never written once recording has stopped: "recording_stopped" drops, written
  // with the others at the end if the file still takes them.
  void countLostCalls(const std::vector<CallEvent>& events) {
    const auto calls = std::count_if(events.begin(), events.end(),
                                     [](const CallEvent& event) { return (event.flags & kNcclInfo) == 0; });
    dropCounter("recording_stopped").count.fetch_add(calls, std::memory_order_relaxed);
  }

  void resolveGpu(GpuTimer* timer, bool final) {
    if (timer == nullptr) return;
    timer->poll();
    // Calls complete in order per stream, not across streams: query every pending one.
    for (auto it = pending_gpu_.begin(); it != pending_gpu_.end();) {
      std::int64_t start = 0, end = 0;
      const auto status = timer->query(it->gpu_slot - 1, start, end);
      const bool give_up = final || pending_gpu_.size() > kMaxPendingGpu;
      if (status == GpuTimer::Status::Pending && !give_up) {
        ++it;
        continue;
      }
      std::int64_t span[2] = {start, end};
      if (status != GpuTimer::Status::Ready) {
        g_drop_counters[2].count.fetch_add(1, std::memory_order_relaxed);
        addCall(*it, nullptr);  // host enqueue times instead
      } else {
        addCall(*it, span);
      }
      timer->release(it->gpu_slot - 1);
      it = pending_gpu_.erase(it);
    }
  }

  // ---- graph replays (cupti_tracer.h) ----
  //
  // A graph-captured call's row is written like any call's (host-timed: its capture). Each of its GPU
  // executions, reported by the timer once complete, is a row of its own: a copy of the captured call's
  // with graph_replay 1, 2, ... and the GPU's times (docs/schema.md, "CUDA graphs").
  struct Captured {
    storage::CallRecord call;
    std::int64_t replays = 0;
  };

  // A replay whose captured call has not been drained from its thread's ring yet (a batch holds at most
  // kBatch records) waits, up to kMaxCaptured of them; at the end, or beyond that, it is dropped.
  void addGraphReplays(GpuTimer& timer, bool final) {
    replay_spans_.swap(waiting_replays_);  // the ones that waited first: launch order
    waiting_replays_.clear();
    timer.takeGraphReplays(replay_spans_, final);
    for (const ReplaySpan& span : replay_spans_) {
      const auto it = captured_.find({span.comm < comm_rows_.size() ? comm_rows_[span.comm] : 0, span.seq});
      if (it == captured_.end()) {
        if (!final && waiting_replays_.size() < kMaxCaptured) waiting_replays_.push_back(span);
        else countDrop("graph_replay");  // its call was not recorded
        continue;
      }
      storage::CallRecord replay = it->second.call;
      replay.graph_replay = ++it->second.replays;
      replay.step = -1;  // the capture's step is not the launch's; merge detects steps
      replay.start_ns = replay.enqueue_ns = span.start_epoch_ns - epoch_ns_;
      replay.end_ns = std::max(span.start_epoch_ns, span.end_epoch_ns) - epoch_ns_;
      calls_.push_back(replay);
      extras_.push_back({span.comm, 0, 0});
    }
  }

  // ---- NCCL's choices from the profiler plugin (nccl_profile.h) ----
  //
  // A report is recorded on the calling thread before the call's own record (the call is recorded after
  // NCCL returns), so it normally waits here, keyed by (communicator row, seq), until its call is added.
  // A report that comes after its call was written (another thread's ring, drained first) finds the call
  // among the last kMaxNcclInfo written and updates its row. Both tables are bounded; reports that find
  // no call by the end, or are pushed out, are counted as "nccl_profile" drops.
  using CommSeq = std::pair<std::int64_t, std::int64_t>;
  struct NcclInfo {
    int algo, proto, channels;
  };

  void ncclInfoArrived(const CallEvent& event) {
    const CommSeq key{event.comm < comm_rows_.size() ? comm_rows_[event.comm] : 0, event.seq};
    const NcclInfo info{static_cast<int>(event.count), static_cast<int>(event.bytes), event.stream};
    if (const auto written = written_ids_.find(key); written != written_ids_.end()) {
      writer_.setNcclInfo(written->second, info.algo, info.proto, info.channels);
      return;
    }
    if (pending_info_.emplace(key, info).second) pending_info_order_.push_back(key);
    while (pending_info_order_.size() > kMaxNcclInfo) {
      if (pending_info_.erase(pending_info_order_.front()) != 0)
        g_drop_counters[kNcclProfileDrops].count.fetch_add(1, std::memory_order_relaxed);
      pending_info_order_.pop_front();
    }
  }

  void attachNcclInfo(storage::CallRecord& call) {
    const auto found = pending_info_.find({call.comm_id, call.seq});
    if (found == pending_info_.end()) return;
    call.nccl_algo = found->second.algo;
    call.nccl_proto = found->second.proto;
    call.nccl_channels = found->second.channels;
    pending_info_.erase(found);
  }

  // Calls with ids first, first + 1, ...: remembered for reports that come later (only once a plugin
  // has reported at all).
  void rememberWritten(const std::vector<storage::CallRecord>& calls, std::int64_t first) {
    if (!g_nccl_profile_active.load(std::memory_order_relaxed)) return;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      // Has its report already, or is a graph replay (NCCL reports the captured call).
      if (calls[i].nccl_algo >= 0 || calls[i].graph_replay > 0) continue;
      const CommSeq key{calls[i].comm_id, calls[i].seq};
      written_ids_[key] = first + static_cast<std::int64_t>(i);
      written_order_.push_back(key);
      if (written_order_.size() > kMaxNcclInfo) {
        written_ids_.erase(written_order_.front());
        written_order_.pop_front();
      }
    }
  }

  void dropUnmatchedNcclInfo() {
    if (pending_info_.empty()) return;
    g_drop_counters[kNcclProfileDrops].count.fetch_add(static_cast<std::int64_t>(pending_info_.size()),
                                                       std::memory_order_relaxed);
    pending_info_.clear();
    pending_info_order_.clear();
  }

  void addCall(const CallEvent& event, const std::int64_t* gpu_span) {
    calls_.push_back(toRecord(event, gpu_span));
    if (!pending_info_.empty()) attachNcclInfo(calls_.back());
    extras_.push_back({event.comm, event.flags, event.strategy});
    // Explore and apply modes mark calls; observe mode never does, and keeps the plain sort below.
    if ((event.flags & kSampled) != 0 || event.strategy != 0) any_extra_ = true;
  }

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
    const std::int64_t first = writer_.appendCalls(sorted_);
    rememberWritten(sorted_, first);
    applied_.clear();
    for (std::size_t k = 0; k < order_.size(); ++k) {
      const Extra& extra = extras_[order_[k]];
      const std::int64_t id = first + static_cast<std::int64_t>(k);
      if ((extra.flags & kSampled) != 0 && sampled_ids_.size() < kMaxSampledIds)
        sampled_ids_[{extra.comm, sorted_[k].seq}] = id;
      if (extra.strategy != 0) applied_.push_back({id, appliedStrategyName(extra.strategy)});
    }
    if (!applied_.empty()) writer_.appendApplied(applied_);
  }

  // Measurements and consensus rows of the explorations whose call is written. An MPI_Iallreduce is
  // explored before it is issued and recorded at its completion, possibly many flushes later; a call
  // that never comes (dropped) keeps its exploration waiting until the end, or until more than
  // kMaxPendingExplorations wait, and it is then written without the link.
  void writeExplorations(bool final) {
    try {
      for (auto it = pending_explore_.begin(); it != pending_explore_.end();) {
        const ExploreRecord& record = it->record;
        const auto id = sampled_ids_.find({record.comm, record.seq});
        if (id == sampled_ids_.end() && !final && pending_explore_.size() <= kMaxPendingExplorations) {
          ++it;
          continue;
        }
        std::optional<std::int64_t> call_id;
        if (id != sampled_ids_.end()) {
          call_id = id->second;
          sampled_ids_.erase(id);
        }
        writeExploration(record, call_id);
        it = pending_explore_.erase(it);
      }
    } catch (const std::exception& error) {
      fail(error.what());
    }
  }

  void writeExploration(const ExploreRecord& record, std::optional<std::int64_t> call_id) {
    for (const StrategyTiming& timing : record.result.timings) {
      storage::Measurement m;
      m.run_id = run_id_;
      m.rank_id = rank_id_;
      m.call_id = call_id;
      m.strategy = timing.strategy;
      m.api = record.api;
      m.dtype = record.dtype;
      m.bytes = record.bytes;
      m.world = record.world;
      m.reps = timing.reps;
      m.min_ns = timing.min_ns;
      m.median_ns = timing.median_ns;
      m.p90_ns = timing.p90_ns;
      m.max_ns = timing.max_ns;
      m.algbw_gbs = timing.median_ns > 0 ? static_cast<double>(record.bytes) / timing.median_ns : 0.0;
      m.busbw_gbs = m.algbw_gbs * busBandwidthFactor(Collective::AllReduce, record.world);
      m.rel_l2_error = timing.rel_l2_error;
      m.max_abs_error = timing.max_abs_error;
      m.cosine = timing.cosine;
      m.overflow_count = timing.overflow_count;
      writer_.addMeasurement(m);
    }
    if (const auto& sample = record.result.consensus) {
      storage::ConsensusRecord row;
      row.rank_id = rank_id_;
      row.step = record.step;
      row.call_id = call_id;
      row.alpha = sample->alpha;
      row.cosine_to_mean = sample->cosine_to_mean;
      row.grad_norm = sample->grad_norm;
      row.diversity = sample->diversity;
      writer_.appendConsensus(std::span(&row, 1));
    }
  }

  storage::CallRecord toRecord(const CallEvent& event, const std::int64_t* gpu_span) const {
    storage::CallRecord call;
    call.rank_id = rank_id_;
    call.comm_id = event.comm < comm_rows_.size() ? comm_rows_[event.comm] : 0;
    call.seq = event.seq;
    call.step = event.step;
    call.api = event.api;
    call.dtype = event.dtype;
    call.op = event.op;
    call.count = event.count;
    call.bytes = event.bytes;
    call.enqueue_ns = clock_.toEpochNs(event.enqueue) - epoch_ns_;
    if (gpu_span != nullptr) {
      call.start_ns = gpu_span[0] - epoch_ns_;
      call.end_ns = gpu_span[1] - epoch_ns_;
    } else if ((event.flags & kEpochTimes) != 0) {
      call.start_ns = static_cast<std::int64_t>(event.start) - epoch_ns_;
      call.end_ns = static_cast<std::int64_t>(event.end) - epoch_ns_;
    } else {
      call.start_ns = clock_.toEpochNs(event.start) - epoch_ns_;
      call.end_ns = clock_.toEpochNs(event.end) - epoch_ns_;
    }
    if (call.end_ns < call.start_ns) call.end_ns = call.start_ns;
    call.stream = event.stream;
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

  // Drops counted since the last commit: every kind's counter, the full rings' and the rate limit's,
  // as (kind, count), and taken (the counters start again from 0).
  std::vector<std::pair<std::string, std::int64_t>> takeDrops() {
    const std::size_t buffers = g_buffers->size();
    dropped_per_buffer_.resize(buffers, 0);
    rate_dropped_per_buffer_.resize(buffers, 0);
    std::int64_t new_drops = 0, new_rate_drops = 0;
    for (std::size_t i = 0; i < buffers; ++i) {
      const std::uint64_t dropped = g_buffers->at(i)->dropped();
      new_drops += static_cast<std::int64_t>(dropped - dropped_per_buffer_[i]);
      dropped_per_buffer_[i] = dropped;
      const std::uint64_t rate_dropped = g_buffers->at(i)->rateDropped();
      new_rate_drops += static_cast<std::int64_t>(rate_dropped - rate_dropped_per_buffer_[i]);
      rate_dropped_per_buffer_[i] = rate_dropped;
    }
    std::vector<std::pair<std::string, std::int64_t>> drops;
    if (new_drops > 0) drops.emplace_back("call", new_drops);
    if (new_rate_drops > 0) drops.emplace_back("call_rate", new_rate_drops);
    calls_dropped_ += new_drops + new_rate_drops;
    for (DropCounter& counter : g_drop_counters) {
      const std::int64_t n = counter.count.exchange(0, std::memory_order_relaxed);
      if (n > 0) drops.emplace_back(counter.kind, n);
      if (&counter == &dropCounter("recording_stopped")) calls_dropped_ += n;
    }
    return drops;
  }

  void writeDrops() {
    for (const auto& [kind, count] : takeDrops()) writer_.addDrops(rank_id_, kind, count);
  }

  // `signalled`: the process dies of a signal next, and its launcher may SIGKILL it within milliseconds:
  // the end is committed first and the file's tidy-up skipped (TraceWriter::finishQuickly).
  void close(bool signalled) {
    g_recording.store(false, std::memory_order_relaxed);
    if (failed_) {
      // What stopped the recording, and how many calls it lost, where the file still takes that (a
      // refused insert does; a full disk does not): the calls the failure rolled back and every one
      // drained or intercepted since, as "recording_stopped" drops, beside the other kinds' counts.
      dropCounter("recording_stopped").count.fetch_add(writer_.callsRolledBack(), std::memory_order_relaxed);
      calls_recorded_ -= writer_.callsRolledBack();
      std::vector<std::pair<std::string, std::int64_t>> drops = takeDrops();
      nlohmann::json config = nlohmann::json::parse(config_json_, nullptr, false);
      if (config.is_discarded() || !config.is_object()) config = nlohmann::json::object();
      config["agent"] = {{"calls_recorded", calls_recorded_},
                         {"calls_dropped", calls_dropped_},
                         {"recording_stopped", stopped_because_}};
      try {
        writer_.closeAfterFailure(run_id_, rank_id_, drops, config.dump(), clock_.epochNsNow() - epoch_ns_);
      } catch (const std::exception&) {
      }
      return;
    }
    try {
      writeDrops();
      timespec cpu{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
      nlohmann::json config = nlohmann::json::parse(config_json_, nullptr, false);
      if (config.is_discarded() || !config.is_object()) config = nlohmann::json::object();
      config["agent"] = {
          {"calls_recorded", calls_recorded_},
          {"calls_dropped", calls_dropped_},
          {"hot_path_ns", hot_path_.recorded_ns},
          {"dropped_call_ns", hot_path_.dropped_ns},
          {"flusher_cpu_ns", static_cast<std::int64_t>(cpu.tv_sec) * 1'000'000'000 + cpu.tv_nsec},
          {"buffer_bytes", static_cast<std::int64_t>(g_buffers->size()) * g_buffers->capacity() *
                               static_cast<std::int64_t>(sizeof(CallEvent))},
      };
      if (g_config.mode != Mode::Observe) {
        const ShadowStats stats = shadowStats();
        config["agent"]["shadow"] = {
            {"mode", shadowModeName()},
            {"explored", stats.explored},
            {"skipped_budget", stats.skipped_budget},
            {"skipped_other", stats.skipped_other},
            {"explore_ns", stats.spent_ns},
            {"applied", stats.applied},
            {"apply_failed", stats.apply_failed},
        };
        nlohmann::json untouched = nlohmann::json::object();
        for (std::size_t i = 0; i < kUntouchedReasons; ++i)
          if (stats.untouched[i] > 0)
            untouched[std::string(name(static_cast<Untouched>(i)))] = stats.untouched[i];
        config["agent"]["shadow"]["untouched"] = untouched;
      }
      writer_.setRunConfig(run_id_, config.dump());
      if (signalled) writer_.finishQuickly(clock_.epochNsNow() - epoch_ns_);
      else writer_.finish(clock_.epochNsNow() - epoch_ns_);
    } catch (const std::exception& error) {
      fail(error.what());
    }
  }

  struct Extra {
    std::uint32_t comm;
    std::uint8_t flags;
    std::uint16_t strategy;
  };
  struct PendingExplore {
    ExploreRecord record;
  };
  struct CommSeqHash {
    std::size_t operator()(const std::pair<std::uint32_t, std::int64_t>& key) const {
      return std::hash<std::int64_t>()(key.second * 4099 + key.first);
    }
  };

  static constexpr std::size_t kMaxPendingGpu = 1 << 16;
  static constexpr std::size_t kMaxSampledIds = 1 << 16;
  static constexpr std::size_t kMaxPendingExplorations = 256;
  static constexpr std::size_t kBatch = 256;
  static constexpr std::size_t kMaxNcclInfo = 4096;
  static constexpr std::size_t kNcclProfileDrops = 8;  // g_drop_counters index of "nccl_profile"
  static constexpr std::size_t kMaxCaptured = 4096;    // graph-captured calls whose replays are written

  storage::TraceWriter writer_;
  std::int64_t run_id_, rank_id_, epoch_ns_;
  std::string config_json_;
  ClockConversion clock_;
  std::thread thread_;
  std::vector<CallEvent> events_;
  std::vector<storage::CallRecord> calls_;
  std::vector<Extra> extras_;
  std::vector<std::size_t> order_;
  std::vector<storage::CallRecord> sorted_;
  std::vector<storage::AppliedCall> applied_;
  bool any_extra_ = false;
  std::deque<PendingExplore> pending_explore_;
  std::unordered_map<std::pair<std::uint32_t, std::int64_t>, std::int64_t, CommSeqHash> sampled_ids_;
  std::deque<CallEvent> pending_gpu_;
  struct CommSeqKeyHash {
    std::size_t operator()(const CommSeq& key) const {
      return std::hash<std::int64_t>()(key.second * 4099 + key.first);
    }
  };
  std::unordered_map<CommSeq, NcclInfo, CommSeqKeyHash> pending_info_;
  std::deque<CommSeq> pending_info_order_;
  std::unordered_map<CommSeq, std::int64_t, CommSeqKeyHash> written_ids_;
  std::deque<CommSeq> written_order_;
  std::unordered_map<CommSeq, Captured, CommSeqKeyHash> captured_;
  std::vector<ReplaySpan> replay_spans_, waiting_replays_;
  std::vector<std::int64_t> comm_rows_;
  std::vector<std::uint64_t> dropped_per_buffer_, rate_dropped_per_buffer_;
  std::int64_t calls_recorded_ = 0, calls_dropped_ = 0;
  HotPathCost hot_path_;
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

bool createDirectories(const std::filesystem::path& directory, std::string& error) {
  if (directory.empty()) return true;
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    error = fmt::format("cannot create directory {}: {}", directory.string(), ec.message());
    return false;
  }
  return true;
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
    g_drop_counters[0].count.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  t_buffer = buffer;
  t_owner.buffer = buffer;
  return buffer;
}

std::int64_t stepForCallSlow() {
  if (g_config.step_calls > 0)
    return g_step_call_counter.fetch_add(1, std::memory_order_relaxed) / g_config.step_calls;
  if (!g_config.step_nvtx.empty()) return g_nvtx_steps.load(std::memory_order_relaxed) - 1;
  return -1;
}

void nvtxRangePushed(const char* name) {
  if (name != nullptr && !g_config.step_nvtx.empty() && g_config.step_nvtx == name)
    g_nvtx_steps.fetch_add(1, std::memory_order_relaxed);
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
    std::string error;
    if (!createDirectories(std::filesystem::path(path).parent_path(), error)) fail("{}", error);
    storage::TraceWriter writer = storage::TraceWriter::create(path);
    const std::int64_t epoch_ns = realtimeNs();
    nlohmann::json config = {
        {"mode", modeName(g_config.mode)},
        {"flush_interval_ns", g_config.flush_interval_ns},
        {"buffer_calls", g_config.buffer_calls},
        {"max_call_rate", g_config.max_call_rate},
        {"clock", g_ticks_are_tsc ? "tsc" : "monotonic"},
    };
    if (g_config.step_calls > 0) config["step_calls"] = g_config.step_calls;
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
    run.command = g_config.command.empty() ? commandLine() : g_config.command;
    run.mode = std::string(modeName(g_config.mode));
    run.backend = activation.backend;
    run.world_size = activation.world_size;
    run.host = host;
    run.config_json = config.dump();
    run.tool_version = kVersion;
    run.epoch_ns = epoch_ns;
    run.start_ns = 0;
    const std::int64_t run_id = writer.addRun(run);
    storage::RankInfo rank;
    rank.run_id = run_id;
    rank.rank = activation.rank;
    rank.host = host;
    rank.pid = getpid();
    rank.device = activation.device;
    const std::int64_t rank_id = writer.addRank(rank);
    writer.commit();
    if (pipe2(g_wake_pipe, O_CLOEXEC) != 0 || pipe2(g_done_pipe, O_CLOEXEC) != 0)
      fail("cannot create the agent's wake-up pipe: {}", errnoMessage(errno));
    g_buffers = new ThreadBufferTable(g_config.buffer_calls);
    g_flusher = new Flusher(std::move(writer), run_id, rank_id, epoch_ns, run.config_json);
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

void countDrop(const char* kind) {
  dropCounter(kind).count.fetch_add(1, std::memory_order_relaxed);
}

void countCallNotRecorded() {
  if (g_recording_failed.load(std::memory_order_relaxed)) countDrop("recording_stopped");
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
