#include "profiler.h"

#include <dlfcn.h>
#include <sys/auxv.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/common/job_environment.h"
#include "gradscope/common/launcher.h"
#include "gradscope/common/version.h"
#include "gradscope/storage/writer.h"
#include "names.h"

namespace gradscope::nccl_profiler {
namespace {

constexpr std::uint32_t kFree = 0;
constexpr std::uint32_t kLive = 1;
constexpr std::uintptr_t kKernelTag = 1;
constexpr std::uintptr_t kProxyTag = 2;
constexpr std::uintptr_t kGroupTag = 3;
constexpr std::uintptr_t kTagMask = 3;

std::int64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// One line on stderr with a single write(2), as the agent logs.
void logLine(const std::string& message) {
  const std::string line = fmt::format("gradscope: nccl profiler: {}\n", message);
  const ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

// ---- the record queue ------------------------------------------------------------------------------------

// Bounded multi-producer queue (D. Vyukov's array queue): every cell carries a sequence number telling
// producers and the consumer whose turn it is. push() is one compare-and-swap on the tail plus two
// stores; it never waits: a full queue returns false.
class RecordQueue {
 public:
  explicit RecordQueue(std::size_t capacity) : mask_(capacity - 1), cells_(new Cell[capacity]) {
    for (std::size_t i = 0; i < capacity; ++i) cells_[i].sequence.store(i, std::memory_order_relaxed);
  }

  bool push(const CollRecord& record) {
    std::size_t position = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[position & mask_];
      const std::size_t sequence = cell.sequence.load(std::memory_order_acquire);
      const auto difference = static_cast<std::intptr_t>(sequence) - static_cast<std::intptr_t>(position);
      if (difference == 0) {
        if (tail_.compare_exchange_weak(position, position + 1, std::memory_order_relaxed)) {
          cell.record = record;
          cell.sequence.store(position + 1, std::memory_order_release);
          return true;
        }
      } else if (difference < 0) {
        return false;  // full
      } else {
        position = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  // Consumer (one thread).
  template <typename Visit>
  std::size_t drain(Visit&& visit) {
    std::size_t n = 0;
    for (;;) {
      Cell& cell = cells_[head_ & mask_];
      if (cell.sequence.load(std::memory_order_acquire) != head_ + 1) return n;
      visit(cell.record);
      cell.sequence.store(head_ + mask_ + 1, std::memory_order_release);
      ++head_;
      ++n;
    }
  }

  std::size_t capacity() const { return mask_ + 1; }

 private:
  struct alignas(64) Cell {
    std::atomic<std::size_t> sequence{0};
    CollRecord record;
  };
  const std::size_t mask_;
  std::unique_ptr<Cell[]> cells_;
  alignas(64) std::atomic<std::size_t> tail_{0};
  alignas(64) std::size_t head_ = 0;
};

// ---- the sink: the plugin's own trace (standalone mode) -------------------------------------------------

// The first free name: the template's, else with "-2", "-3", ... before the extension (a trace finished
// at a last ncclCommDestroy is followed by another if the job creates communicators again).
std::string freePath(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return path;
  const std::filesystem::path p(path);
  for (int n = 2;; ++n) {
    std::filesystem::path candidate = p;
    candidate.replace_filename(fmt::format("{}-{}{}", p.stem().string(), n, p.extension().string()));
    if (!std::filesystem::exists(candidate, ec)) return candidate.string();
  }
}

class Sink {
 public:
  static constexpr std::size_t kQueueCapacity = 1 << 14;

  // Opens the trace at the first context (standalone). `agent_loaded`: the agent is in the process but
  // does not interpose this NCCL (said in the run's config, "agent"). Throws gradscope::Error.
  Sink(int rank, int nranks, bool agent_loaded) : queue_(kQueueCapacity) {
    const Environment env = processEnvironment();
    const char* output = env(env::kOutput);
    const std::string pattern = output != nullptr && *output != '\0' ? output : "gradscope-nccl-%h-%p.db";
    const std::string host = hostName();
    const std::optional<Launch> launch = detectLaunch(env);
    rank_ = launch ? launch->rank : rank;
    const std::string path =
        freePath(expandOutputTemplate(pattern, rank_, static_cast<long>(getpid()), host));
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(parent, ec);
    }
    writer_ = std::make_unique<storage::TraceWriter>(storage::TraceWriter::create(path));
    epoch_ns_ = nowNs();
    storage::RunInfo run_info;
    const std::string run_id = runIdFromLauncher(env);
    run_info.uuid = run_id.empty() ? randomUuid() : run_id;
    const char* command = env(env::kCommand);
    run_info.command = command != nullptr ? command : processCommandLine();
    run_info.mode = "observe";
    run_info.backend = Backend::Nccl;
    run_info.world_size = launch ? launch->world_size : nranks;
    run_info.host = host;
    config_ = {{"source", "nccl-profiler"}, {"agent", agent_loaded ? "not interposing" : "absent"}};
    run_info.config_json = config_.dump();
    run_info.tool_version = kVersion;
    run_info.epoch_ns = epoch_ns_;
    run_id_ = writer_->addRun(run_info);
    storage::RankInfo info;
    info.run_id = run_id_;
    info.rank = rank_;
    info.host = host;
    info.pid = getpid();
    info.device = "cuda";
    rank_id_ = writer_->addRank(info);
    writer_->commit();
    path_ = path;
    thread_ = std::thread([this] { run(); });
  }

  ~Sink() { finish(); }

  std::uint32_t addComm(std::uint64_t comm_hash, int nranks, int rank) {
    const std::lock_guard lock(comms_mutex_);
    std::string key = fmt::format("nccl:commhash:{:016x}", comm_hash);
    if (keys_.count(key) != 0) key = fmt::format("{}@{}", key, rank);
    for (int n = 1; keys_.count(key) != 0; ++n)
      key = fmt::format("nccl:commhash:{:016x}@{}#{}", comm_hash, rank, n);
    keys_.insert(key);
    storage::CommInfo comm;
    comm.key = key;
    comm.backend = Backend::Nccl;
    comm.size = nranks;
    comm.comm_rank = rank;
    comms_.push_back(comm);
    return static_cast<std::uint32_t>(comms_.size() - 1);
  }

  void push(const CollRecord& record) {
    if (!queue_.push(record)) queue_drops_.fetch_add(1, std::memory_order_relaxed);
  }
  void countPoolDrop() { pool_drops_.fetch_add(1, std::memory_order_relaxed); }

  // Drains, writes the statistics and finishes the file; joins the writer thread. Idempotent.
  void finish() {
    {
      const std::lock_guard lock(wake_mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  const std::string& path() const { return path_; }

 private:
  void run() {
    for (;;) {
      bool stop = false;
      {
        std::unique_lock lock(wake_mutex_);
        wake_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stopping_; });
        stop = stopping_;
      }
      flush();
      if (stop) break;
    }
    close();
  }

  void flush() {
    if (failed_) {
      queue_.drain([](const CollRecord&) {});
      return;
    }
    try {
      {
        const std::lock_guard lock(comms_mutex_);
        for (std::size_t i = comm_rows_.size(); i < comms_.size(); ++i) {
          storage::CommInfo comm = comms_[i];
          comm.rank_id = rank_id_;
          comm_rows_.push_back(writer_->addComm(comm));
        }
      }
      calls_.clear();
      queue_.drain([this](const CollRecord& record) { calls_.push_back(toCall(record)); });
      std::stable_sort(
          calls_.begin(), calls_.end(),
          [](const storage::CallRecord& a, const storage::CallRecord& b) { return a.start_ns < b.start_ns; });
      writer_->appendCalls(calls_);
      recorded_ += static_cast<std::int64_t>(calls_.size());
      const std::int64_t pool = pool_drops_.exchange(0, std::memory_order_relaxed);
      const std::int64_t queue = queue_drops_.exchange(0, std::memory_order_relaxed);
      if (pool > 0) writer_->addDrops(rank_id_, "nccl_profile_pool", pool);
      if (queue > 0) writer_->addDrops(rank_id_, "nccl_profile_queue", queue);
      pool_dropped_ += pool;
      queue_dropped_ += queue;
      writer_->commit();
    } catch (const std::exception& error) {
      fail(error.what());
    }
  }

  storage::CallRecord toCall(const CollRecord& record) {
    storage::CallRecord call;
    call.rank_id = rank_id_;
    call.comm_id = record.comm < comm_rows_.size() ? comm_rows_[record.comm] : 0;
    call.seq = record.seq;
    call.api = record.api;
    call.dtype = record.dtype;
    call.op = ReduceOp::None;  // NCCL's descriptor does not say
    call.count = record.count;
    std::int64_t elements = record.count;
    if (record.api == Api::NcclReduceScatter) elements *= record.nranks;
    call.bytes = elements * static_cast<std::int64_t>(sizeOf(record.dtype));
    call.enqueue_ns = record.start_ns - epoch_ns_;
    call.start_ns = record.stop_ns - epoch_ns_;
    call.end_ns = (record.complete_ns != 0 ? record.complete_ns : record.stop_ns) - epoch_ns_;
    if (call.start_ns < call.enqueue_ns) call.start_ns = call.enqueue_ns;
    if (call.end_ns < call.start_ns) call.end_ns = call.start_ns;
    call.nccl_algo = record.algo;
    call.nccl_proto = record.proto;
    call.nccl_channels = record.channels;
    if (record.complete_ns != 0) ++completed_;
    return call;
  }

  void fail(const std::string& what) {
    if (failed_) return;
    failed_ = true;
    logLine(fmt::format("{}; the plugin stops writing {}, the job continues", what, path_));
  }

  void close() {
    if (failed_) {
      try {
        writer_->finish();
      } catch (const std::exception&) {
      }
      return;
    }
    try {
      config_["profiler"] = {
          {"collectives_recorded", recorded_}, {"collectives_completed", completed_},
          {"pool_drops", pool_dropped_},       {"queue_drops", queue_dropped_},
          {"pool_size", Context::kPoolSize},   {"queue_capacity", queue_.capacity()},
      };
      writer_->setRunConfig(run_id_, config_.dump());
      writer_->finish(nowNs() - epoch_ns_);
    } catch (const std::exception& error) {
      fail(error.what());
    }
  }

  RecordQueue queue_;
  std::unique_ptr<storage::TraceWriter> writer_;
  std::string path_;
  int rank_ = 0;
  std::int64_t run_id_ = 0, rank_id_ = 0, epoch_ns_ = 0;
  nlohmann::json config_;
  std::thread thread_;
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::mutex comms_mutex_;
  std::set<std::string> keys_;
  std::vector<storage::CommInfo> comms_;
  // Writer thread only.
  std::vector<std::int64_t> comm_rows_;
  std::vector<storage::CallRecord> calls_;
  std::int64_t recorded_ = 0, completed_ = 0, pool_dropped_ = 0, queue_dropped_ = 0;
  bool failed_ = false;
  std::atomic<std::int64_t> pool_drops_{0}, queue_drops_{0};
};

// ---- process-wide state
// -------------------------------------------------------------------------------------

// Fixed at the first init: whether the agent is here (agent mode), and whether the plugin is off.
enum class Mode { Unset, Agent, Standalone, Off };
std::mutex g_lifecycle;  // init and finalize
Mode g_mode = Mode::Unset;
NcclProfileFunctionV1 g_hook = nullptr;
int g_contexts = 0;
// The open sink (standalone). Event paths read it without the lock: it is set before the first
// context is handed to NCCL and cleared only after the last context is finalized.
std::atomic<Sink*> g_sink{nullptr};

// Finishes an open trace when the process exits (or the library is unloaded) with communicators
// still alive.
struct ExitGuard {
  ~ExitGuard() {
    const std::lock_guard lock(g_lifecycle);
    if (Sink* sink = g_sink.exchange(nullptr)) {
      sink->finish();
      delete sink;
    }
  }
} g_exit_guard;

// GRADSCOPE_DISABLE=1, or a setuid/setgid process (secure-execution mode): its privileges must not write
// a trace where the invoking user's environment says.
bool disabledByEnvironment() {
  if (::getauxval(AT_SECURE) != 0) return true;
  const char* value = std::getenv(env::kDisable);
  return value != nullptr &&
         (std::strcmp(value, "1") == 0 || std::strcmp(value, "true") == 0 || std::strcmp(value, "yes") == 0);
}

// ---- collectives ------------------------------------------------------------------------------------------

void finishSlot(CollSlot& slot) {
  CollRecord& record = slot.record;
  record.stop_ns = slot.stop_ns.load(std::memory_order_relaxed);
  const bool all_channels =
      slot.kernel_expected > 0 && slot.kernel_stops.load(std::memory_order_relaxed) >= slot.kernel_expected;
  record.complete_ns = all_channels ? slot.last_child_stop_ns.load(std::memory_order_relaxed) : 0;
  if (Sink* sink = g_sink.load(std::memory_order_acquire)) sink->push(record);
  slot.state.store(kFree, std::memory_order_release);
}

// Drops one reference; the last one finishes the record (acquire: every other holder's writes are seen).
void release(CollSlot& slot) {
  if (slot.refs.fetch_sub(1, std::memory_order_acq_rel) == 1) finishSlot(slot);
}

CollSlot* claimSlot(Context& context) {
  const std::uint32_t first = context.next_slot.fetch_add(1, std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < Context::kPoolSize; ++i) {
    CollSlot& slot = context.slots[(first + i) % Context::kPoolSize];
    std::uint32_t expected = kFree;
    if (slot.state.load(std::memory_order_relaxed) == kFree &&
        slot.state.compare_exchange_strong(expected, kLive, std::memory_order_acquire))
      return &slot;
  }
  return nullptr;
}

void startColl(Context& context, void** handle, const ncclProfilerEventDescr_v5_t& descriptor) {
  const auto& coll = descriptor.coll;
  const Api api = apiFromNcclFunc(coll.func);
  if (api == Api::Unknown) return;  // a collective the trace has no API code for (AlltoAll, ...)
  const std::int64_t seq = context.next_seq.load(std::memory_order_relaxed);
  context.next_seq.store(seq + 1, std::memory_order_relaxed);
  if (context.hook != nullptr) {
    NcclProfileRecordV1 link;
    link.comm_hash = context.comm_hash;
    link.seq_number = coll.seqNumber;
    link.count = coll.count;
    link.nranks = context.nranks;
    link.rank = context.rank;
    link.api = static_cast<std::uint8_t>(api);
    link.dtype = static_cast<std::uint8_t>(dtypeFromNcclName(coll.datatype));
    link.algo = static_cast<std::int8_t>(algoFromNcclName(coll.algo));
    link.proto = static_cast<std::int8_t>(protoFromNcclName(coll.proto));
    link.channels = coll.nChannels;
    context.hook(&link);
    return;
  }
  CollSlot* slot = claimSlot(context);
  if (slot == nullptr) {
    if (Sink* sink = g_sink.load(std::memory_order_acquire)) sink->countPoolDrop();
    return;
  }
  CollRecord& record = slot->record;
  record.start_ns = nowNs();
  record.seq = seq;
  record.nccl_seq = coll.seqNumber;
  record.count = static_cast<std::int64_t>(coll.count);
  record.complete_ns = 0;
  record.comm = context.comm;
  record.nranks = context.nranks;
  record.api = api;
  record.dtype = dtypeFromNcclName(coll.datatype);
  record.algo = static_cast<std::int8_t>(algoFromNcclName(coll.algo));
  record.proto = static_cast<std::int8_t>(protoFromNcclName(coll.proto));
  record.channels = coll.nChannels;
  slot->context = &context;
  slot->kernel_expected = context.kernel_children ? coll.nChannels : 0;
  slot->kernel_stops.store(0, std::memory_order_relaxed);
  slot->stop_ns.store(0, std::memory_order_relaxed);
  slot->last_child_stop_ns.store(0, std::memory_order_relaxed);
  slot->refs.store(slot->kernel_expected > 0 ? 2 : 1, std::memory_order_relaxed);
  *handle = slot;
}

// The slot a child names as its parent, when it is a live collective of this context.
CollSlot* parentSlot(Context& context, void* parent) {
  const auto address = reinterpret_cast<std::uintptr_t>(parent);
  const auto first = reinterpret_cast<std::uintptr_t>(&context.slots[0]);
  const auto end = reinterpret_cast<std::uintptr_t>(&context.slots[Context::kPoolSize]);
  if (address < first || address >= end || (address - first) % sizeof(CollSlot) != 0) return nullptr;
  CollSlot* slot = reinterpret_cast<CollSlot*>(parent);
  return slot->state.load(std::memory_order_acquire) == kLive ? slot : nullptr;
}

void startChild(Context& context, void** handle, void* parent, std::uintptr_t tag) {
  CollSlot* slot = parentSlot(context, parent);
  if (slot == nullptr) return;
  slot->refs.fetch_add(1, std::memory_order_relaxed);
  *handle = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(slot) | tag);
}

void stopChild(CollSlot& slot, bool kernel) {
  const std::int64_t now = nowNs();
  std::int64_t last = slot.last_child_stop_ns.load(std::memory_order_relaxed);
  while (now > last && !slot.last_child_stop_ns.compare_exchange_weak(last, now, std::memory_order_relaxed)) {
  }
  // The nChannels-th kernel channel ends the wait for channels.
  if (kernel && slot.kernel_expected > 0 &&
      slot.kernel_stops.fetch_add(1, std::memory_order_relaxed) + 1 == slot.kernel_expected)
    release(slot);
  release(slot);
}

}  // namespace

// ---- the plugin's functions
// ------------------------------------------------------------------------------------

ncclResult_t init(void** context, std::uint64_t comm_hash, int* activation_mask, const char* /*comm_name*/,
                  int /*nodes*/, int nranks, int rank, ncclDebugLogger_t /*logger*/) {
  if (context == nullptr || activation_mask == nullptr) return ncclInvalidArgument;
  *context = nullptr;
  if (nranks <= 0 || rank < 0 || rank >= nranks) {
    *activation_mask = 0;
    return ncclInvalidArgument;
  }
  const std::lock_guard lock(g_lifecycle);
  if (g_mode == Mode::Unset) {
    if (disabledByEnvironment()) {
      g_mode = Mode::Off;
    } else {
      g_hook = reinterpret_cast<NcclProfileFunctionV1>(dlsym(RTLD_DEFAULT, kNcclProfileSymbol));
      g_mode = g_hook != nullptr ? Mode::Agent : Mode::Standalone;
    }
  }
  if (g_mode == Mode::Off) {
    *activation_mask = 0;
    return ncclInternalError;  // NCCL carries on without the plugin for this communicator
  }
  // The agent is loaded but has seen no NCCL call of this process: this NCCL is not the one it interposes
  // (linked into the job statically), so the plugin records its communicators itself.
  const bool interposed = g_mode == Mode::Agent && g_hook(nullptr) != kNcclProfileNotInterposed;
  if (!interposed && g_sink.load(std::memory_order_relaxed) == nullptr) {
    try {
      g_sink.store(new Sink(rank, nranks, g_mode == Mode::Agent), std::memory_order_release);
    } catch (const std::exception& error) {
      logLine(fmt::format("{}; no trace is written (set GRADSCOPE_OUTPUT to a writable path)", error.what()));
      g_mode = Mode::Off;
      *activation_mask = 0;
      return ncclSystemError;
    }
  }
  auto* created = new (std::nothrow) Context();
  if (created == nullptr) {
    *activation_mask = 0;
    return ncclSystemError;
  }
  created->comm_hash = comm_hash;
  created->rank = rank;
  created->nranks = nranks;
  if (interposed) {
    created->hook = g_hook;
    *activation_mask = static_cast<int>(ncclProfileColl);
  } else {
    created->comm = g_sink.load(std::memory_order_relaxed)->addComm(comm_hash, nranks, rank);
    created->kernel_children = true;
    *activation_mask = static_cast<int>(ncclProfileColl | ncclProfileProxyOp | ncclProfileKernelCh);
  }
  ++g_contexts;
  *context = created;
  return ncclSuccess;
}

ncclResult_t startEvent(void* context, void** handle, ncclProfilerEventDescr_v5_t* descriptor) {
  if (handle == nullptr) return ncclSuccess;
  *handle = nullptr;
  if (context == nullptr || descriptor == nullptr) return ncclSuccess;
  auto& ctx = *static_cast<Context*>(context);
  switch (descriptor->type) {
    case ncclProfileGroup:
      *handle = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(context) | kGroupTag);
      break;
    case ncclProfileColl: startColl(ctx, handle, *descriptor); break;
    case ncclProfileKernelCh:
      if (ctx.hook == nullptr) startChild(ctx, handle, descriptor->parentObj, kKernelTag);
      break;
    case ncclProfileProxyOp:
      // A parent in another process (NCCL's proxy serves several) is not one of our slots.
      if (ctx.hook == nullptr && descriptor->proxyOp.pid == getpid())
        startChild(ctx, handle, descriptor->parentObj, kProxyTag);
      break;
    default: break;
  }
  return ncclSuccess;
}

ncclResult_t stopEvent(void* handle) {
  if (handle == nullptr) return ncclSuccess;
  const auto address = reinterpret_cast<std::uintptr_t>(handle);
  const std::uintptr_t tag = address & kTagMask;
  if (tag == kGroupTag) return ncclSuccess;
  CollSlot& slot = *reinterpret_cast<CollSlot*>(address & ~kTagMask);
  if (tag == 0) {
    slot.stop_ns.store(nowNs(), std::memory_order_relaxed);
    release(slot);
  } else {
    stopChild(slot, tag == kKernelTag);
  }
  return ncclSuccess;
}

// Nothing to keep: completion is the host time of the children's stops (the KernelCh stop's GPU timer
// is a raw GPU clock without a conversion to host time here).
ncclResult_t recordEventState(void* /*handle*/, ncclProfilerEventState_t /*state*/,
                              ncclProfilerEventStateArgs_v5_t* /*args*/) {
  return ncclSuccess;
}

ncclResult_t finalize(void* context) {
  if (context == nullptr) return ncclSuccess;
  auto* ctx = static_cast<Context*>(context);
  const std::lock_guard lock(g_lifecycle);
  // Collectives still waiting for children NCCL will no longer send: written without a completion.
  for (CollSlot& slot : ctx->slots)
    if (slot.state.load(std::memory_order_acquire) == kLive) {
      slot.stop_ns.store(std::max(slot.stop_ns.load(std::memory_order_relaxed), slot.record.start_ns),
                         std::memory_order_relaxed);
      finishSlot(slot);
    }
  delete ctx;
  if (--g_contexts == 0) {
    // NCCL unloads the library after its last finalize: the file is finished and the thread gone now.
    if (Sink* sink = g_sink.exchange(nullptr)) {
      sink->finish();
      delete sink;
    }
  }
  return ncclSuccess;
}

}  // namespace gradscope::nccl_profiler
