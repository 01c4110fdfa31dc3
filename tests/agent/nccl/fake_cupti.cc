// A fake CUPTI for the agent's NCCL tests on machines without a GPU: built as libcupti.so.13 in a folder
// of its own, which the test puts first on LD_LIBRARY_PATH so that the agent's dlopen finds it.
//
// Model: the fake driver (fake_cuda.cc) reports every fake kernel it queues (fakeCudaSetKernelHook) with
// its start and end on the fake GPU's clock, CLOCK_MONOTONIC, which is also cuptiGetTimestamp's here.
// For each kernel the fake writes, on the launching thread, an EXTERNAL_CORRELATION record for each of
// the CUSTOM0 and CUSTOM1 kinds with an id pushed on that thread (ready at once) and a CONCURRENT_KERNEL
// record named "ncclDevKernel_Fake", or the job's name for its own kernels (fakeCudaLaunchNamed), ready when
// the kernel has ended. Kernel records are written only while that kind is enabled. cuptiActivityFlushAll(0)
// copies the ready records into buffers asked for through the registered request callback and hands them back
// through the completion callback; a record finding no buffer is dropped and counted.
//
// Graphs: the callback API's one subscriber gets the resource domain's GRAPHNODE_CREATED and
// GRAPHNODE_CLONED callbacks it enabled, on the thread that made the node (fakeCudaSetGraphHook), and
// cuptiGetGraphNodeId is the fake driver's node id. A kernel of a graph launch gets the launch's
// correlation id (one per launch, as CUPTI gives a cuGraphLaunch's) and its node's id, and no external
// correlation record.
//
// Knobs (environment): GRADSCOPE_FAKE_CUPTI_RECORDS_PER_BUFFER=N: at most N records a buffer;
// GRADSCOPE_FAKE_CUPTI_HOLD=1: filled buffers are kept, never handed back (the client's pool runs dry);
// GRADSCOPE_FAKE_CUPTI_LATE_NS=N: a kernel record is ready N ns after its kernel has ended (CUPTI delivers
// records after the kernels, so one flush may bring a group's first kernels and a later one its last);
// GRADSCOPE_FAKE_CUPTI_LOG=FILE: at exit, one line per kernel: "<external id> <start> <end> <graph node>"
// (0: none).

#include <dlfcn.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cupti_abi.h"

using namespace gradscope::agent;
using namespace gradscope::agent::cupti;

namespace {

struct Record {
  std::vector<std::uint8_t> bytes;
  std::int64_t ready_ns = 0;
};

struct Kernel {
  std::uint64_t id;
  std::int64_t start, end;
  std::uint64_t node;
};

struct State {
  std::mutex mutex;
  CUpti_BuffersCallbackRequestFunc request = nullptr;
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;
  bool kernels = false, externals = false;
  std::deque<Record> pending;
  std::uint32_t next_correlation = 0;
  std::size_t dropped = 0;
  std::vector<Kernel> log;
  std::map<std::uint64_t, std::uint32_t> launch_correlations;  // graph launch -> its correlation id
  CUpti_CallbackFunc callback = nullptr;
  void* userdata = nullptr;
  bool node_created = false, node_cloned = false;
};
// Never destroyed: the agent's background thread may flush while the process exits.
State& g_state = *new State;

// Writes the kernel log at exit.
struct LogWriter {
  ~LogWriter() {
    const char* path = std::getenv("GRADSCOPE_FAKE_CUPTI_LOG");
    if (path == nullptr) return;
    const std::lock_guard lock(g_state.mutex);
    if (FILE* out = std::fopen(path, "w")) {
      for (const Kernel& kernel : g_state.log)
        std::fprintf(out, "%llu %lld %lld %llu\n", static_cast<unsigned long long>(kernel.id),
                     static_cast<long long>(kernel.start), static_cast<long long>(kernel.end),
                     static_cast<unsigned long long>(kernel.node));
      std::fclose(out);
    }
  }
} g_log_writer;
thread_local std::vector<std::uint64_t> t_ids;
// The CUSTOM1 ids pushed on this thread (the agent's NVTX range names).
thread_local std::vector<std::uint64_t> t_range_ids;

std::int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::size_t recordSize(CUpti_ActivityKind kind) {
  return kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION ? sizeof(CUpti_ActivityExternalCorrelation)
                                                          : kKernelRecordSize;
}

const char kKernelName[] = "ncclDevKernel_Fake";

// Called by the fake driver, on the launching thread, for every kernel it queues.
void onKernel(gradscope::agent::cuda::CUstream, std::int64_t start, std::int64_t end, std::uint64_t node,
              std::uint64_t launch, const char* name) {
  const std::lock_guard lock(g_state.mutex);
  const std::uint64_t id = t_ids.empty() || node != 0 ? 0 : t_ids.back();
  g_state.log.push_back({id, start, end, node});
  if (!g_state.kernels) return;
  std::uint32_t correlation = 0;
  if (launch != 0) {
    const auto [it, first] = g_state.launch_correlations.try_emplace(launch, 0);
    if (first) it->second = ++g_state.next_correlation;
    correlation = it->second;
  } else {
    correlation = ++g_state.next_correlation;
  }
  const auto external = [&](CUpti_ExternalCorrelationKind kind, std::uint64_t external_id) {
    CUpti_ActivityExternalCorrelation row{};
    row.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    row.externalKind = kind;
    row.externalId = external_id;
    row.correlationId = correlation;
    Record record{std::vector<std::uint8_t>(sizeof row), 0};
    std::memcpy(record.bytes.data(), &row, sizeof row);
    g_state.pending.push_back(std::move(record));
  };
  if (id != 0 && g_state.externals) external(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
  if (!t_range_ids.empty() && node == 0 && g_state.externals)
    external(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1, t_range_ids.back());
  KernelRecordHead kernel{};
  kernel.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  kernel.start = static_cast<std::uint64_t>(start);
  kernel.end = static_cast<std::uint64_t>(end);
  kernel.completed = kernel.end;
  kernel.correlationId = correlation;
  kernel.name = name != nullptr ? name : kKernelName;
  kernel.graphNodeId = node;
  static const char* late_text = std::getenv("GRADSCOPE_FAKE_CUPTI_LATE_NS");
  static const std::int64_t late = late_text != nullptr ? std::strtoll(late_text, nullptr, 10) : 0;
  Record record{std::vector<std::uint8_t>(kKernelRecordSize), end + late};
  std::memcpy(record.bytes.data(), &kernel, sizeof kernel);
  g_state.pending.push_back(std::move(record));
}

// Called by the fake driver, on the thread that made the node, for every graph node created (original
// nullptr) or copied into an executable graph, with its CUgraphNodeType.
void onGraphNode(gradscope::agent::cuda::CUgraph graph, gradscope::agent::cuda::CUgraphNode node,
                 gradscope::agent::cuda::CUgraphNode original, int type) {
  CUpti_CallbackFunc callback = nullptr;
  void* userdata = nullptr;
  {
    const std::lock_guard lock(g_state.mutex);
    if (original == nullptr ? !g_state.node_created : !g_state.node_cloned) return;
    callback = g_state.callback;
    userdata = g_state.userdata;
  }
  if (callback == nullptr) return;
  CUpti_GraphData data{};
  data.graph = graph;
  data.node = node;
  data.originalNode = original;
  data.nodeType = type;
  CUpti_ResourceData resource{};
  resource.resourceDescriptor = &data;
  callback(userdata, CUPTI_CB_DOMAIN_RESOURCE,
           original == nullptr ? CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED : CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED,
           &resource);
}

void installHook() {
  static std::once_flag once;
  std::call_once(once, [] {
    using Hook = void (*)(gradscope::agent::cuda::CUstream, std::int64_t, std::int64_t, std::uint64_t,
                          std::uint64_t, const char*);
    using GraphHook = void (*)(gradscope::agent::cuda::CUgraph, gradscope::agent::cuda::CUgraphNode,
                               gradscope::agent::cuda::CUgraphNode, int);
    // The fake driver is loaded RTLD_GLOBAL by the fake NCCL before the agent starts CUPTI.
    if (auto set = reinterpret_cast<void (*)(Hook)>(dlsym(RTLD_DEFAULT, "fakeCudaSetKernelHook")))
      set(&onKernel);
    if (auto set = reinterpret_cast<void (*)(GraphHook)>(dlsym(RTLD_DEFAULT, "fakeCudaSetGraphHook")))
      set(&onGraphNode);
  });
}

}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_EXPORT CUptiResult cuptiGetTimestamp(std::uint64_t* timestamp) {
  *timestamp = static_cast<std::uint64_t>(nowNs());
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  installHook();
  const std::lock_guard lock(g_state.mutex);
  if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) g_state.kernels = true;
  else if (kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) g_state.externals = true;
  else return CUPTI_ERROR_UNKNOWN;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  const std::lock_guard lock(g_state.mutex);
  if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) g_state.kernels = false;
  if (kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) g_state.externals = false;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                       CUpti_BuffersCallbackCompleteFunc complete) {
  const std::lock_guard lock(g_state.mutex);
  g_state.request = request;
  g_state.complete = complete;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiActivityGetNextRecord(std::uint8_t* buffer, std::size_t valid,
                                                   CUpti_Activity** record) {
  std::uint8_t* next =
      *record == nullptr ? buffer : reinterpret_cast<std::uint8_t*>(*record) + recordSize((*record)->kind);
  if (next >= buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(next);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiActivityGetNumDroppedRecords(gradscope::agent::cuda::CUcontext, std::uint32_t,
                                                          std::size_t* dropped) {
  const std::lock_guard lock(g_state.mutex);
  *dropped = std::exchange(g_state.dropped, 0);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiActivityFlushAll(std::uint32_t) {
  static const char* per_buffer_text = std::getenv("GRADSCOPE_FAKE_CUPTI_RECORDS_PER_BUFFER");
  static const std::size_t per_buffer =
      per_buffer_text != nullptr ? std::strtoull(per_buffer_text, nullptr, 10) : SIZE_MAX;
  static const bool hold = std::getenv("GRADSCOPE_FAKE_CUPTI_HOLD") != nullptr;
  std::vector<std::pair<std::uint8_t*, std::size_t>> done;
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;
  {
    const std::lock_guard lock(g_state.mutex);
    if (g_state.request == nullptr) return CUPTI_ERROR_UNKNOWN;
    complete = g_state.complete;
    const std::int64_t now = nowNs();
    std::uint8_t* buffer = nullptr;
    std::size_t size = 0, used = 0, records = 0;
    auto finish = [&] {
      if (buffer != nullptr && !hold) done.emplace_back(buffer, used);
      buffer = nullptr;
    };
    for (auto it = g_state.pending.begin(); it != g_state.pending.end();) {
      if (it->ready_ns > now) {
        ++it;
        continue;
      }
      if (buffer != nullptr && (used + it->bytes.size() > size || records == per_buffer)) finish();
      if (buffer == nullptr) {
        std::size_t max_records = 0;
        g_state.request(&buffer, &size, &max_records);
        used = records = 0;
        if (buffer == nullptr || size < it->bytes.size()) {
          buffer = nullptr;
          ++g_state.dropped;
          it = g_state.pending.erase(it);
          continue;
        }
      }
      std::memcpy(buffer + used, it->bytes.data(), it->bytes.size());
      used += it->bytes.size();
      ++records;
      it = g_state.pending.erase(it);
    }
    finish();
  }
  for (const auto& [buffer, used] : done) complete(nullptr, 0, buffer, 0, used);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                               std::uint64_t id) {
  if (kind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1) t_range_ids.push_back(id);
  else if (kind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) t_ids.push_back(id);
  else return CUPTI_ERROR_UNKNOWN;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                              std::uint64_t* last) {
  std::vector<std::uint64_t>& ids = kind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1 ? t_range_ids : t_ids;
  if ((kind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0 && kind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1) ||
      ids.empty())
    return CUPTI_ERROR_UNKNOWN;
  *last = ids.back();
  ids.pop_back();
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                                       void* userdata) {
  installHook();
  const std::lock_guard lock(g_state.mutex);
  if (g_state.callback != nullptr) return CUPTI_ERROR_UNKNOWN;  // CUPTI allows one subscriber
  g_state.callback = callback;
  g_state.userdata = userdata;
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(&g_state);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiEnableCallback(std::uint32_t enable, CUpti_SubscriberHandle subscriber,
                                            CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const std::lock_guard lock(g_state.mutex);
  if (subscriber != reinterpret_cast<CUpti_SubscriberHandle>(&g_state) || domain != CUPTI_CB_DOMAIN_RESOURCE)
    return CUPTI_ERROR_UNKNOWN;
  if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED) g_state.node_created = enable != 0;
  else if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) g_state.node_cloned = enable != 0;
  else return CUPTI_ERROR_UNKNOWN;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult cuptiGetGraphNodeId(gradscope::agent::cuda::CUgraphNode node, std::uint64_t* id) {
  using NodeId = std::uint64_t (*)(gradscope::agent::cuda::CUgraphNode);
  static const auto node_id = reinterpret_cast<NodeId>(dlsym(RTLD_DEFAULT, "fakeCudaGraphNodeId"));
  if (node_id == nullptr || node == nullptr) return CUPTI_ERROR_UNKNOWN;
  *id = node_id(node);
  return CUPTI_SUCCESS;
}
