// A fake CUDA driver for the agent's NCCL tests on machines without a GPU: built as libcuda.so.1
// (SONAME included), so that the agent, which only looks for an already loaded libcuda.so.1, times
// calls with it exactly as with the real driver. The fake NCCL library loads it (as NCCL loads the
// driver through the runtime) when GRADSCOPE_FAKE_CUDA names it.
//
// Model: a stream is any handle value; it has a cursor, the fake GPU time at which its queued work
// ends. fakeCudaLaunch(stream, ns) queues a kernel of `ns` after the cursor (the fake NCCL calls it for
// every collective it runs). An event recorded on a stream completes at max(now, cursor); queries and
// elapsed times are answered from the host's monotonic clock, so work really completes later than it
// is enqueued, as on a GPU. fakeCudaSetKernelHook installs a function told of every kernel's start and
// end (the fake CUPTI's kernel records). Graphs: while a stream captures, fakeCudaLaunch adds two nodes to
// the stream's graph instead of queueing a kernel: a host node, as NCCL's proxy callbacks add to a
// captured collective, and a kernel node of that length; cuStreamEndCapture hands the graph out,
// cuGraphInstantiateWithFlags copies its nodes (new ids) into an executable graph, and cuGraphLaunch
// queues every kernel node's kernel on a stream, the kernel hook told the node and the launch (host
// nodes run no kernel). fakeCudaSetGraphHook installs a function told of every node created and copied,
// with its CUgraphNodeType (the fake CUPTI's resource callbacks); fakeCudaGraphNodeId names a node (its
// cuptiGetGraphNodeId).
//
// It also watches what the agent must never do, and writes the counts at exit to the file named by
// GRADSCOPE_FAKE_CUDA_STATS: synchronising an event of a stream it did not create (a job's stream),
// and recording an event on a stream that is capturing.

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda_driver.h"

using namespace gradscope::agent::cuda;

struct CUctx_st_fake {};
struct gradscope::agent::cuda::CUevent_st {
  std::int64_t time_ns = 0;
  bool recorded = false;
  bool timing = true;  // not created with CU_EVENT_DISABLE_TIMING
  CUstream stream = nullptr;
};
struct gradscope::agent::cuda::CUstream_st {};
// CUgraphNodeType values (cuda.h).
enum : int { kKernelNode = 0, kHostNode = 3 };
struct gradscope::agent::cuda::CUgraphNode_st {
  std::uint64_t id = 0;
  int type = kKernelNode;
  std::int64_t duration_ns = 0;  // kernel nodes
};
struct gradscope::agent::cuda::CUgraph_st {
  std::vector<CUgraphNode> nodes;
  ~CUgraph_st() {
    for (CUgraphNode node : nodes) delete node;
  }
};
struct gradscope::agent::cuda::CUgraphExec_st : CUgraph_st {};

namespace {

struct StreamState {
  std::int64_t cursor_ns = 0;
  bool capturing = false;
  CUgraph graph = nullptr;  // being captured
  bool created = false;     // by cuStreamCreate (the agent's own), not a job's handle
};

struct Stats {
  long events_created = 0;
  long events_live = 0;
  long events_live_max = 0;
  long event_records = 0;
  long timing_records = 0;   // of timing events on the job's streams (each costs ~1.3 us on a real GPU)
  long untimed_records = 0;  // of events without timing on the job's streams (~0.13 us)
  long job_stream_syncs = 0;
  long capture_records = 0;
  long streams_created = 0;

  ~Stats() {
    const char* path = std::getenv("GRADSCOPE_FAKE_CUDA_STATS");
    if (path == nullptr) return;
    if (FILE* out = std::fopen(path, "w")) {
      std::fprintf(out,
                   "events_created %ld\nevents_live_max %ld\nevent_records %ld\ntiming_records %ld\n"
                   "untimed_records %ld\njob_stream_syncs %ld\ncapture_records %ld\nstreams_created %ld\n",
                   events_created, events_live_max, event_records, timing_records, untimed_records,
                   job_stream_syncs, capture_records, streams_created);
      std::fclose(out);
    }
  }
};

std::mutex g_mutex;
std::map<CUstream, StreamState> g_streams;
Stats g_stats;
CUctx_st_fake g_context_object;
const CUcontext g_context = reinterpret_cast<CUcontext>(&g_context_object);
thread_local CUcontext t_current = g_context;
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

std::int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool completed(const CUevent_st& event) {
  return !event.recorded || nowNs() >= event.time_ns;
}

}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

// ---- the fake's own entry points (used by the fake NCCL and the test job) ----------------------------

// Told of every kernel queued, on the launching thread: the fake CUPTI (fake_cupti.cc) installs it.
// `node` and `launch` are 0 for a kernel launched directly, else the executable graph's node and the
// graph launch (numbered from 1). `name`: the kernel's (fakeCudaLaunchNamed), nullptr for NCCL's.
using KernelHook = void (*)(CUstream stream, std::int64_t start_ns, std::int64_t end_ns, std::uint64_t node,
                            std::uint64_t launch, const char* name);
std::atomic<KernelHook> g_kernel_hook{nullptr};
// Told of every graph node created (original nullptr) and copied into an executable graph, with its
// CUgraphNodeType.
using GraphHook = void (*)(CUgraph graph, CUgraphNode node, CUgraphNode original, int type);
std::atomic<GraphHook> g_graph_hook{nullptr};
std::uint64_t g_next_node = 0, g_next_launch = 0;  // g_mutex

FAKE_EXPORT void fakeCudaSetKernelHook(KernelHook hook) {
  g_kernel_hook.store(hook);
}

FAKE_EXPORT void fakeCudaSetGraphHook(GraphHook hook) {
  g_graph_hook.store(hook);
}

FAKE_EXPORT std::uint64_t fakeCudaGraphNodeId(CUgraphNode node) {
  return node == nullptr ? 0 : node->id;
}

namespace {

void queueKernel(CUstream stream, std::int64_t duration_ns, std::uint64_t node, std::uint64_t launch,
                 const char* name = nullptr) {
  std::int64_t start = 0, end = 0;
  {
    const std::lock_guard lock(g_mutex);
    StreamState& state = g_streams[stream];
    start = std::max(nowNs(), state.cursor_ns);
    end = state.cursor_ns = start + duration_ns;
  }
  if (const KernelHook hook = g_kernel_hook.load()) hook(stream, start, end, node, launch, name);
}

}  // namespace

// A job's own (compute) kernel named `name` (a string that outlives the process's CUPTI flushes), queued
// like NCCL's: the step model's tests launch them beside NCCL calls.
FAKE_EXPORT void fakeCudaLaunchNamed(CUstream stream, std::int64_t duration_ns, const char* name) {
  queueKernel(stream, duration_ns, 0, 0, name);
}

FAKE_EXPORT void fakeCudaLaunch(CUstream stream, std::int64_t duration_ns) {
  CUgraph graph = nullptr;
  CUgraphNode host = nullptr, kernel = nullptr;
  {
    const std::lock_guard lock(g_mutex);
    StreamState& state = g_streams[stream];
    if (state.capturing && state.graph != nullptr) {
      graph = state.graph;
      host = new CUgraphNode_st{++g_next_node, kHostNode, 0};
      kernel = new CUgraphNode_st{++g_next_node, kKernelNode, duration_ns};
      graph->nodes.push_back(host);
      graph->nodes.push_back(kernel);
    }
  }
  if (kernel == nullptr) return queueKernel(stream, duration_ns, 0, 0);
  if (const GraphHook hook = g_graph_hook.load())
    for (CUgraphNode node : {host, kernel}) hook(graph, node, nullptr, node->type);
}

// ---- driver API ---------------------------------------------------------------------------------------

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* context) {
  *context = t_current;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext context) {
  t_current = context;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  *device = 0;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_VALUE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetName(char* name, int length, CUdevice) {
  std::snprintf(name, static_cast<std::size_t>(length), "%s", "Gradscope Fake GPU");
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned int) {
  *stream = new CUstream_st;
  const std::lock_guard lock(g_mutex);
  g_streams[*stream].created = true;
  ++g_stats.streams_created;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
  const std::lock_guard lock(g_mutex);
  g_streams.erase(stream);
  delete stream;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamGetCtx(CUstream, CUcontext* context) {
  *context = g_context;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  const std::lock_guard lock(g_mutex);
  *status = g_streams[stream].capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode) {
  const std::lock_guard lock(g_mutex);
  StreamState& state = g_streams[stream];
  state.capturing = true;
  state.graph = new CUgraph_st;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  const std::lock_guard lock(g_mutex);
  StreamState& state = g_streams[stream];
  state.capturing = false;
  if (graph != nullptr) *graph = state.graph;
  else delete state.graph;
  state.graph = nullptr;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* copy = new CUgraphExec_st;
  {
    const std::lock_guard lock(g_mutex);
    for (CUgraphNode node : graph->nodes)
      copy->nodes.push_back(new CUgraphNode_st{++g_next_node, node->type, node->duration_ns});
  }
  if (const GraphHook hook = g_graph_hook.load())
    for (std::size_t i = 0; i < copy->nodes.size(); ++i)
      hook(copy, copy->nodes[i], graph->nodes[i], copy->nodes[i]->type);
  *exec = copy;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t launch = 0;
  {
    const std::lock_guard lock(g_mutex);
    launch = ++g_next_launch;
  }
  for (CUgraphNode node : exec->nodes)
    if (node->type == kKernelNode) queueKernel(stream, node->duration_ns, node->id, launch);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  delete exec;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphDestroy(CUgraph graph) {
  delete graph;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  std::int64_t until = 0;
  {
    const std::lock_guard lock(g_mutex);
    until = g_streams[stream].cursor_ns;
  }
  while (nowNs() < until) std::this_thread::sleep_for(std::chrono::microseconds(100));
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  std::swap(*mode, t_capture_mode);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  *event = new CUevent_st;
  (*event)->timing = (flags & kEventDisableTiming) == 0;
  const std::lock_guard lock(g_mutex);
  ++g_stats.events_created;
  g_stats.events_live_max = std::max(g_stats.events_live_max, ++g_stats.events_live);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent event) {
  const std::lock_guard lock(g_mutex);
  --g_stats.events_live;
  delete event;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
  const std::lock_guard lock(g_mutex);
  StreamState& state = g_streams[stream];
  ++g_stats.event_records;
  if (!state.created) ++(event->timing ? g_stats.timing_records : g_stats.untimed_records);
  if (state.capturing) ++g_stats.capture_records;
  state.cursor_ns = std::max(nowNs(), state.cursor_ns);
  event->time_ns = state.cursor_ns;
  event->recorded = true;
  event->stream = stream;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventQuery(CUevent event) {
  const std::lock_guard lock(g_mutex);
  return completed(*event) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent event) {
  std::int64_t until = 0;
  {
    const std::lock_guard lock(g_mutex);
    if (event->recorded && !g_streams[event->stream].created) ++g_stats.job_stream_syncs;
    until = event->recorded ? event->time_ns : 0;
  }
  while (nowNs() < until) std::this_thread::sleep_for(std::chrono::microseconds(50));
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventElapsedTime_v2(float* milliseconds, CUevent start, CUevent end) {
  const std::lock_guard lock(g_mutex);
  // As CUDA: an event without timing has no time to give.
  if (!start->recorded || !end->recorded || !start->timing || !end->timing) return CUDA_ERROR_INVALID_HANDLE;
  if (!completed(*start) || !completed(*end)) return CUDA_ERROR_NOT_READY;
  *milliseconds = static_cast<float>(static_cast<double>(end->time_ns - start->time_ns) / 1e6);
  return CUDA_SUCCESS;
}
