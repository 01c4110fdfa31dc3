// libgradscope-fake-nccl.so: a one-rank NCCL on host memory, for testing the agent's NCCL interposer on
// machines without a GPU. Like libnccl.so.2 it exports every API function of agent/src/nccl_functions.def
// twice, as a strong pncclX (the implementation) and a weak ncclX alias, with NCCL 2.28's signatures
// (nccl_abi.h, checked against nccl.h by agent/src/abi_check.cc).
//
// Semantics: communicators have one rank (ncclCommInitAll and ncclCommSplit included), so every
// collective copies its send buffer to its receive buffer. Inside ncclGroupStart/End the calls are
// queued and run at the outermost ncclGroupEnd, as NCCL launches them. ncclGetUniqueId is
// deterministic: byte i of the n-th id (from 0) is (7·i + 13·n) mod 256, so tests can compute the
// agent's communicator keys.
//
// Fake GPU: when GRADSCOPE_FAKE_CUDA names the fake driver (fake_cuda.cc), the first communicator
// loads it (as NCCL loads libcuda through the CUDA runtime) and every collective queues a kernel of
// GRADSCOPE_FAKE_KERNEL_NS nanoseconds (default 1 ms) on its stream.
//
// Profiler plugin: loaded and driven the way NCCL 2.28 does (src/plugin/profiler.cc; declarations in
// plugins/nccl-profiler/profiler_abi.h). NCCL_PROFILER_PLUGIN names it ("none" disables it; unset:
// libnccl-profiler.so): dlopen of the name as given, then of libnccl-profiler-<name>.so; ncclProfiler_v5,
// else ncclProfiler_v4 (GRADSCOPE_FAKE_PROFILER_V4=1 skips v5). Loaded at every communicator's creation
// (reference counted; dlclosed at the last finalize), init per communicator with commHash = FNV-1a of
// its unique id (splits and ncclCommInitAll: of the parent's hash and the colour, of the call's ordinal),
// on the creating thread. A launch (a call outside a group, or the outermost ncclGroupEnd) starts, per
// communicator, a Group event and a Coll event per collective — in NCCL's order, largest first — with
// the algorithm, protocol and channels the fake "chooses" (fakeChoice below, which check_nccl.py
// mirrors), runs the work, stops them, and hands each Coll to a proxy thread that starts and stops a
// ProxyOp and a KernelCh event per channel (KernelCh with ncclProfilerKernelChStop), after the Coll's
// stop as NCCL's proxy does. ncclCommDestroy waits for that proxy work, then finalizes the context.

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl_abi.h"
#include "profiler_abi.h"

using namespace gradscope::agent::nccl;
namespace prof = gradscope::nccl_profiler;

struct gradscope::agent::nccl::ncclComm {
  int nranks = 1;
  int rank = 0;
  int device = 0;
  std::uint64_t hash = 0;     // NCCL's commHash
  void* profiler = nullptr;   // the plugin's context (nullptr: none, or its init failed)
  std::uint64_t seq[5] = {};  // NCCL's comm->seqNumber, per function (profiler_abi.h)
};

namespace {

using Launch = void (*)(cudaStream_t stream, std::int64_t duration_ns);
Launch g_launch = nullptr;
std::int64_t g_kernel_ns = 1'000'000;

void loadFakeCuda() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("GRADSCOPE_FAKE_CUDA");
    if (path == nullptr || *path == '\0') return;
    void* library = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr) return;
    g_launch = reinterpret_cast<Launch>(dlsym(library, "fakeCudaLaunch"));
    if (const char* ns = std::getenv("GRADSCOPE_FAKE_KERNEL_NS")) g_kernel_ns = std::atoll(ns);
  });
}

std::size_t sizeOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

// ---- the profiler plugin ------------------------------------------------------------------------------

std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t hash = 0xcbf29ce484222325ull) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

void pluginLogger(int, unsigned long, const char*, int, const char*, ...) {}

// The loaded plugin, as one v5 table (a v4 plugin's functions are called through adapters below).
struct Plugin {
  std::mutex mutex;
  void* library = nullptr;
  int references = 0;
  bool failed = false;  // tried and not found: NCCL does not retry
  prof::ncclProfiler_v5_t* v5 = nullptr;
  prof::ncclProfiler_v4_t* v4 = nullptr;
  int mask = 0;  // NCCL's process-wide ncclProfilerEventMask
} g_plugin;

void* openPlugin() {
  const char* name = std::getenv("NCCL_PROFILER_PLUGIN");
  if (name != nullptr && strcasecmp(name, "none") == 0) return nullptr;
  if (name == nullptr || *name == '\0') return dlopen("libnccl-profiler.so", RTLD_NOW | RTLD_LOCAL);
  if (void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return library;
  const std::string prefixed = std::string("libnccl-profiler-") + name + ".so";
  return dlopen(prefixed.c_str(), RTLD_NOW | RTLD_LOCAL);
}

// At every communicator's creation: loads the plugin (once) and inits a context for the communicator.
void profilerInit(ncclComm_t comm) {
  const std::lock_guard lock(g_plugin.mutex);
  if (g_plugin.failed) return;
  if (g_plugin.library == nullptr) {
    g_plugin.library = openPlugin();
    if (g_plugin.library != nullptr) {
      const char* v4_only = std::getenv("GRADSCOPE_FAKE_PROFILER_V4");
      if (v4_only == nullptr || std::strcmp(v4_only, "1") != 0)
        g_plugin.v5 = static_cast<prof::ncclProfiler_v5_t*>(dlsym(g_plugin.library, "ncclProfiler_v5"));
      if (g_plugin.v5 == nullptr)
        g_plugin.v4 = static_cast<prof::ncclProfiler_v4_t*>(dlsym(g_plugin.library, "ncclProfiler_v4"));
    }
    if (g_plugin.v5 == nullptr && g_plugin.v4 == nullptr) {
      if (g_plugin.library != nullptr) dlclose(g_plugin.library);
      g_plugin.library = nullptr;
      g_plugin.failed = true;
      return;
    }
  }
  ++g_plugin.references;
  const int rc = g_plugin.v5 != nullptr ? g_plugin.v5->init(&comm->profiler, comm->hash, &g_plugin.mask, "",
                                                            1, comm->nranks, comm->rank, pluginLogger)
                                        : g_plugin.v4->init(&comm->profiler, &g_plugin.mask, "", comm->hash,
                                                            1, comm->nranks, comm->rank, pluginLogger);
  if (rc != 0) comm->profiler = nullptr;  // NCCL: "Continue without profiler"
}

int profilerMask() {
  const std::lock_guard lock(g_plugin.mutex);
  return g_plugin.mask;
}

// The fake's events, converted for a v4 plugin when that is what was loaded.
void startEvent(void* context, void** handle, prof::ncclProfilerEventDescr_v5_t& d) {
  *handle = nullptr;
  if (g_plugin.v5 != nullptr) {
    g_plugin.v5->startEvent(context, handle, &d);
    return;
  }
  prof::ncclProfilerEventDescr_v4_t v4{};
  v4.type = static_cast<std::uint8_t>(d.type);
  v4.parentObj = d.type == prof::ncclProfileColl ? d.coll.parentGroup : d.parentObj;
  v4.rank = d.rank;
  if (d.type == prof::ncclProfileColl) {
    v4.coll.seqNumber = d.coll.seqNumber;
    v4.coll.func = d.coll.func;
    v4.coll.sendBuff = d.coll.sendBuff;
    v4.coll.recvBuff = d.coll.recvBuff;
    v4.coll.count = d.coll.count;
    v4.coll.root = d.coll.root;
    v4.coll.datatype = d.coll.datatype;
    v4.coll.nChannels = d.coll.nChannels;
    v4.coll.nWarps = d.coll.nWarps;
    v4.coll.algo = d.coll.algo;
    v4.coll.proto = d.coll.proto;
  } else if (d.type == prof::ncclProfileProxyOp) {
    v4.proxyOp.pid = d.proxyOp.pid;
    v4.proxyOp.channelId = d.proxyOp.channelId;
  } else if (d.type == prof::ncclProfileKernelCh) {
    v4.kernelCh.channelId = d.kernelCh.channelId;
    v4.kernelCh.pTimer = d.kernelCh.pTimer;
  }
  g_plugin.v4->startEvent(context, handle, &v4);
}
void stopEvent(void* handle) {
  if (handle == nullptr) return;
  if (g_plugin.v5 != nullptr) g_plugin.v5->stopEvent(handle);
  else g_plugin.v4->stopEvent(handle);
}
void kernelStop(void* handle, std::uint64_t timer) {
  if (handle == nullptr) return;
  prof::ncclProfilerEventStateArgs_v5_t args{};
  args.kernelCh.pTimer = timer;
  if (g_plugin.v5 != nullptr) {
    g_plugin.v5->recordEventState(handle, prof::ncclProfilerKernelChStop, &args);
  } else {
    prof::ncclProfilerEventStateArgs_v4_t v4{};
    v4.kernelCh.pTimer = timer;
    g_plugin.v4->recordEventState(handle, prof::ncclProfilerKernelChStop, &v4);
  }
}

// NCCL's proxy thread, for the children of collectives: one thread, work in launch order.
class Proxy {
 public:
  struct Work {
    void* context;
    void* coll;
    int channels;
    int rank;
    int mask;
  };
  ~Proxy() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void post(const Work& work) {
    {
      const std::lock_guard lock(mutex_);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      queue_.push_back(work);
    }
    wake_.notify_all();
  }
  // Waits until every posted work item is done (ncclCommDestroy: the proxy finishes first).
  void drain() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return queue_.empty() && busy_ == 0; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const Work work = queue_.front();
      queue_.pop_front();
      ++busy_;
      lock.unlock();
      children(work);
      lock.lock();
      --busy_;
      idle_.notify_all();
    }
  }
  static void children(const Work& work) {
    for (int channel = 0; channel < work.channels; ++channel) {
      void* op = nullptr;
      if ((work.mask & prof::ncclProfileProxyOp) != 0) {
        prof::ncclProfilerEventDescr_v5_t d{};
        d.type = prof::ncclProfileProxyOp;
        d.parentObj = work.coll;
        d.rank = work.rank;
        d.proxyOp.pid = getpid();
        d.proxyOp.channelId = static_cast<std::uint8_t>(channel);
        d.proxyOp.nSteps = 8;
        startEvent(work.context, &op, d);
      }
      if ((work.mask & prof::ncclProfileKernelCh) != 0) {
        prof::ncclProfilerEventDescr_v5_t d{};
        d.type = prof::ncclProfileKernelCh;
        d.parentObj = work.coll;
        d.rank = work.rank;
        d.kernelCh.channelId = static_cast<std::uint8_t>(channel);
        d.kernelCh.pTimer = 1000;
        void* kernel = nullptr;
        startEvent(work.context, &kernel, d);
        kernelStop(kernel, 2000);
        stopEvent(kernel);
      }
      stopEvent(op);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Work> queue_;
  int busy_ = 0;
  bool stop_ = false;
  std::thread thread_;
} g_proxy;

void profilerFinalize(ncclComm_t comm) {
  if (comm->profiler == nullptr && g_plugin.library == nullptr) return;
  g_proxy.drain();
  const std::lock_guard lock(g_plugin.mutex);
  if (g_plugin.library == nullptr) return;
  if (comm->profiler != nullptr) {
    if (g_plugin.v5 != nullptr) g_plugin.v5->finalize(comm->profiler);
    else g_plugin.v4->finalize(comm->profiler);
    comm->profiler = nullptr;
  }
  if (--g_plugin.references == 0) {  // NCCL unloads the plugin with its last communicator
    dlclose(g_plugin.library);
    g_plugin.library = nullptr;
    g_plugin.v5 = nullptr;
    g_plugin.v4 = nullptr;
    g_plugin.mask = 0;
  }
}

// What the fake "chooses" for a collective of `bytes` (check_nccl.py's fake_choice mirrors it).
struct Choice {
  const char* algo;
  const char* proto;
  int channels;
};
Choice fakeChoice(std::size_t bytes) {
  if (bytes <= 1024) return {"TREE", "LL", 1};
  if (bytes <= 8192) return {"RING", "LL128", 2};
  return {"RING", "SIMPLE", 4};
}

// ncclDatatypeToString of NCCL 2.28 (which has no name for ncclUint8).
const char* datatypeName(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: return "ncclInt8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    case ncclFloat8e4m3: return "ncclFloat8e4m3";
    case ncclFloat8e5m2: return "ncclFloat8e5m2";
    default: return "Unknown";
  }
}

// ---- launches ------------------------------------------------------------------------------------------

enum Function { kBroadcast, kReduce, kAllGather, kReduceScatter, kAllReduce };
constexpr const char* kFunctionNames[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};

struct Task {
  ncclComm_t comm;
  Function function;
  std::size_t count;
  ncclDataType_t type;
  std::size_t bytes;  // the send buffer's
  cudaStream_t stream;
  std::function<void()> work;
};

thread_local int t_group_depth = 0;
thread_local std::vector<Task> t_group_work;

// One launch: NCCL's profiler events around the work (each task is one kernel on its stream).
void launch(std::vector<Task>& tasks) {
  // NCCL orders a launch's collectives largest first (its task sorter); equal sizes keep call order.
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.bytes > b.bytes; });
  const int mask = profilerMask();
  const bool profiled = (mask & (prof::ncclProfileGroup | prof::ncclProfileColl | prof::ncclProfileProxyOp |
                                 prof::ncclProfileKernelCh)) != 0;
  std::vector<ncclComm_t> comms;
  for (const Task& task : tasks)
    if (std::find(comms.begin(), comms.end(), task.comm) == comms.end()) comms.push_back(task.comm);
  std::vector<void*> groups(comms.size(), nullptr);
  std::vector<void*> colls(tasks.size(), nullptr);
  std::vector<int> channels(tasks.size(), 0);
  for (std::size_t c = 0; c < comms.size(); ++c) {
    ncclComm_t comm = comms[c];
    if (comm->profiler == nullptr || !profiled) continue;
    prof::ncclProfilerEventDescr_v5_t group{};
    group.type = prof::ncclProfileGroup;
    startEvent(comm->profiler, &groups[c], group);
    for (std::size_t t = 0; t < tasks.size(); ++t) {
      const Task& task = tasks[t];
      if (task.comm != comm) continue;
      const Choice choice = fakeChoice(task.bytes);
      prof::ncclProfilerEventDescr_v5_t d{};
      d.type = prof::ncclProfileColl;
      d.rank = comm->rank;
      d.coll.seqNumber = comm->seq[task.function]++;
      d.coll.func = kFunctionNames[task.function];
      d.coll.count = task.count;
      d.coll.datatype = datatypeName(task.type);
      d.coll.nChannels = static_cast<std::uint8_t>(choice.channels);
      d.coll.nWarps = 16;
      d.coll.algo = choice.algo;
      d.coll.proto = choice.proto;
      d.coll.parentGroup = groups[c];
      channels[t] = choice.channels;
      startEvent(comm->profiler, &colls[t], d);
    }
  }
  for (Task& task : tasks) {
    task.work();
    if (g_launch != nullptr) g_launch(task.stream, g_kernel_ns);
  }
  for (void* coll : colls) stopEvent(coll);
  for (void* group : groups) stopEvent(group);
  for (std::size_t t = 0; t < tasks.size(); ++t)
    if (colls[t] != nullptr && (mask & (prof::ncclProfileProxyOp | prof::ncclProfileKernelCh)) != 0)
      g_proxy.post({tasks[t].comm->profiler, colls[t], channels[t], tasks[t].comm->rank, mask});
}

// Runs the task now, or at the outermost ncclGroupEnd.
ncclResult_t submit(ncclComm_t comm, Function function, std::size_t count, std::size_t send_elements,
                    ncclDataType_t type, cudaStream_t stream, std::function<void()> work) {
  if (comm == nullptr || sizeOf(type) == 0) return ncclInvalidArgument;
  Task task{comm, function, count, type, send_elements * sizeOf(type), stream, std::move(work)};
  if (t_group_depth > 0) {
    t_group_work.push_back(std::move(task));
  } else {
    std::vector<Task> tasks;
    tasks.push_back(std::move(task));
    launch(tasks);
  }
  return ncclSuccess;
}

void copy(void* to, const void* from, std::size_t count, ncclDataType_t type) {
  if (to != from && count > 0) std::memmove(to, from, count * sizeOf(type));
}

ncclResult_t newComm(ncclComm_t* comm, int nranks, int rank, std::uint64_t hash) {
  if (comm == nullptr) return ncclInvalidArgument;
  loadFakeCuda();
  *comm = new ncclComm{nranks, rank, 0, hash, nullptr, {}};
  profilerInit(*comm);
  return ncclSuccess;
}

void destroyComm(ncclComm_t comm) {
  if (comm == nullptr) return;
  profilerFinalize(comm);
  delete comm;
}

}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  static std::atomic<int> ids{0};
  const int n = ids.fetch_add(1);
  for (std::size_t i = 0; i < kUniqueIdBytes; ++i)
    uniqueId->internal[i] = static_cast<char>((7 * i + 13 * static_cast<std::size_t>(n)) & 0xff);
  return ncclSuccess;
}

FAKE_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error" : "fake NCCL error";
}

FAKE_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr) return ncclInvalidArgument;
  *device = comm->device;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                                 ncclConfig_t*) {
  if (nranks != 1 || rank != 0) return ncclInvalidArgument;
  return newComm(comm, nranks, rank, fnv1a(id.internal, sizeof id.internal));
}

FAKE_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return pncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

FAKE_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nId,
                                                   ncclUniqueId* ids, ncclConfig_t*) {
  if (nranks != 1 || rank != 0 || nId < 1) return ncclInvalidArgument;
  return newComm(comm, nranks, rank, fnv1a(ids, sizeof(ncclUniqueId) * static_cast<std::size_t>(nId)));
}

FAKE_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int*) {
  if (comm == nullptr || ndev < 1) return ncclInvalidArgument;
  static std::atomic<std::uint64_t> calls{0};
  const std::uint64_t ordinal = calls.fetch_add(1);
  for (int i = 0; i < ndev; ++i) newComm(&comm[i], ndev, i, fnv1a(&ordinal, sizeof ordinal, 0x1234));
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  destroyComm(comm);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  destroyComm(comm);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int, ncclComm_t* newcomm, ncclConfig_t*) {
  if (comm == nullptr || newcomm == nullptr) return ncclInvalidArgument;
  if (color == kSplitNoColor) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  return newComm(newcomm, 1, 0, fnv1a(&color, sizeof color, comm->hash));
}

FAKE_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  if (comm != nullptr && root != comm->rank) return ncclInvalidArgument;
  return submit(comm, kReduce, count, count, datatype, stream,
                [=] { copy(recvbuff, sendbuff, count, datatype); });
}

FAKE_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream) {
  if (comm != nullptr && root != comm->rank) return ncclInvalidArgument;
  return submit(comm, kBroadcast, count, count, datatype, stream,
                [=] { copy(recvbuff, sendbuff, count, datatype); });
}

FAKE_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t, ncclComm_t comm,
                                        cudaStream_t stream) {
  return submit(comm, kAllReduce, count, count, datatype, stream,
                [=] { copy(recvbuff, sendbuff, count, datatype); });
}

FAKE_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                            ncclDataType_t datatype, ncclRedOp_t, ncclComm_t comm,
                                            cudaStream_t stream) {
  const std::size_t ranks = comm != nullptr ? static_cast<std::size_t>(comm->nranks) : 1;
  return submit(comm, kReduceScatter, recvcount, recvcount * ranks, datatype, stream,
                [=] { copy(recvbuff, sendbuff, recvcount, datatype); });
}

FAKE_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, kAllGather, sendcount, sendcount, datatype, stream,
                [=] { copy(recvbuff, sendbuff, sendcount, datatype); });
}

FAKE_EXPORT ncclResult_t pncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclGroupEnd() {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth == 0) {
    std::vector<Task> tasks = std::move(t_group_work);
    t_group_work.clear();
    launch(tasks);
  }
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t*) {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth == 0) t_group_work.clear();
  return ncclSuccess;
}

// The weak ncclX of every row, aliases of the pncclX above (what `nm -D libnccl.so.2` shows: W and T).
#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS) \
  FAKE_EXPORT RESULT NAME PARAMS __attribute__((weak, alias("p" #NAME)));
#include "nccl_functions.def"
#undef GS_NCCL_FUNCTION
