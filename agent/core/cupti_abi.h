#pragma once

// The few CUPTI facts the agent uses to read NCCL kernels' GPU spans (activity API) and to follow graph
// nodes (callback API), declared here so that the agent builds without the toolkit and never links
// CUPTI: libcupti is dlopen'ed at run time (cupti_tracer.h). Every fact is from CUDA 13's
// /usr/local/cuda/include/cupti_result.h, cupti_activity.h (activity record layouts: cupti_common.h
// packs them with 8-byte alignment) and cupti_callbacks.h, and
// abi_check.cc proves the values, sizes, offsets and function types against those headers whenever they
// are present.

#include <cstddef>
#include <cstdint>

#include "core/cuda_driver.h"

namespace gradscope::agent::cupti {

// cupti_result.h `typedef enum {...} CUptiResult;`: only the codes the agent tells apart.
enum CUptiResult {
  CUPTI_SUCCESS = 0,
  CUPTI_ERROR_MAX_LIMIT_REACHED = 12,  // cuptiActivityGetNextRecord: no more records in the buffer
  CUPTI_ERROR_UNKNOWN = 999,
};

// cupti_activity.h `typedef enum {...} CUpti_ActivityKind;`.
enum CUpti_ActivityKind {
  CUPTI_ACTIVITY_KIND_KERNEL = 3,
  CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10,
  CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION = 39,
};

// cupti_activity.h `typedef enum {...} CUpti_ExternalCorrelationKind;`.
enum CUpti_ExternalCorrelationKind {
  CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0 = 3,  // the agent's NCCL calls
  CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1 = 4,  // the job's NVTX ranges, inside the GPU step windows
};

// cupti_activity.h: every record starts with its kind (`CUpti_Activity`); records are 8-byte aligned
// (cupti_common.h ACTIVITY_RECORD_ALIGNMENT).
struct alignas(8) CUpti_Activity {
  CUpti_ActivityKind kind;
};

// The head of a kernel record (`CUpti_ActivityKernel10`, 216 bytes in CUDA 13; start, end, deviceId,
// streamId, correlationId and name have had these offsets since CUpti_ActivityKernel4): what the agent reads.
struct KernelRecordHead {
  CUpti_ActivityKind kind;
  std::uint8_t unused0[12];  // cache configuration, registers per thread, partitioned cache configuration
  std::uint64_t start;       // ns, CUPTI's clock (cuptiGetTimestamp)
  std::uint64_t end;
  std::uint64_t completed;
  std::uint32_t deviceId;
  std::uint32_t contextId;
  std::uint32_t streamId;
  std::uint8_t unused1[40];     // grid, block, shared memory, ...
  std::uint32_t correlationId;  // a graph replay's kernels carry the graph launch's
  std::int64_t gridId;
  const char* name;           // valid while the buffer is being read
  std::uint8_t unused2[32];   // reserved0, queued, submitted, launch type, shared memory carve-out
  std::uint64_t graphNodeId;  // the node of the executable graph that launched it; 0: not a graph launch
  std::uint32_t shmemLimitConfig;
  std::uint32_t graphId;
};
static_assert(offsetof(KernelRecordHead, start) == 16 && offsetof(KernelRecordHead, correlationId) == 92 &&
              offsetof(KernelRecordHead, name) == 104 && offsetof(KernelRecordHead, graphNodeId) == 144);
inline constexpr std::size_t kKernelRecordSize = 216;  // sizeof(CUpti_ActivityKernel10)

// cupti_activity.h `CUpti_ActivityExternalCorrelation` (24 bytes).
struct CUpti_ActivityExternalCorrelation {
  CUpti_ActivityKind kind;
  CUpti_ExternalCorrelationKind externalKind;
  std::uint64_t externalId;
  std::uint32_t correlationId;
  std::uint32_t reserved;
};

// cupti_callbacks.h: the callback API, for the resource domain's graph-node notifications. A callback
// runs on the thread that made the driver call (for nodes made by stream capture: the capturing thread).
enum CUpti_CallbackDomain {
  CUPTI_CB_DOMAIN_RESOURCE = 3,
};
using CUpti_CallbackId = std::uint32_t;
enum CUpti_CallbackIdResource {
  CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED = 13,
  CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED = 20,  // cuGraphInstantiate copies every node into the executable
};
struct CUpti_Subscriber_st;
using CUpti_SubscriberHandle = CUpti_Subscriber_st*;
using CUpti_CallbackFunc = void (*)(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                    const void* cbdata);
// `cbdata` of the resource domain.
struct CUpti_ResourceData {
  cuda::CUcontext context;
  cuda::CUstream stream;     // `union { CUstream stream; } resourceHandle`
  void* resourceDescriptor;  // CUpti_GraphData for the graph callbacks
};
struct CUpti_GraphData {
  cuda::CUgraph graph;
  cuda::CUgraph originalGraph;
  cuda::CUgraphNode node;
  cuda::CUgraphNode originalNode;  // GRAPHNODE_CLONED: the node it is a copy of
  int nodeType;                    // CUgraphNodeType
  cuda::CUgraphNode dependency;
  cuda::CUgraphExec graphExec;
};
// cuda.h `CUgraphNodeType`: the one type whose nodes run kernels (the others: copies, host functions,
// events, ...).
inline constexpr int kGraphKernelNode = 0;  // CU_GRAPH_NODE_TYPE_KERNEL

// cupti_activity.h: the buffer callbacks of cuptiActivityRegisterCallbacks.
using CUpti_BuffersCallbackRequestFunc = void (*)(std::uint8_t** buffer, std::size_t* size,
                                                  std::size_t* maxNumRecords);
using CUpti_BuffersCallbackCompleteFunc = void (*)(cuda::CUcontext context, std::uint32_t streamId,
                                                   std::uint8_t* buffer, std::size_t size,
                                                   std::size_t validSize);

// X(MEMBER, SYMBOL, PARAMS): the Library member, the exported symbol and its signature (all return
// CUptiResult).
#define GS_CUPTI_FUNCTIONS(X)                                                              \
  X(getTimestamp, cuptiGetTimestamp, (std::uint64_t * timestamp))                          \
  X(activityEnable, cuptiActivityEnable, (CUpti_ActivityKind kind))                        \
  X(activityDisable, cuptiActivityDisable, (CUpti_ActivityKind kind))                      \
  X(activityRegisterCallbacks, cuptiActivityRegisterCallbacks,                             \
    (CUpti_BuffersCallbackRequestFunc funcBufferRequested,                                 \
     CUpti_BuffersCallbackCompleteFunc funcBufferCompleted))                               \
  X(activityGetNextRecord, cuptiActivityGetNextRecord,                                     \
    (std::uint8_t * buffer, std::size_t validBufferSizeBytes, CUpti_Activity * *record))   \
  X(activityFlushAll, cuptiActivityFlushAll, (std::uint32_t flag))                         \
  X(activityGetNumDroppedRecords, cuptiActivityGetNumDroppedRecords,                       \
    (cuda::CUcontext context, std::uint32_t streamId, std::size_t * dropped))              \
  X(activityPushExternalCorrelationId, cuptiActivityPushExternalCorrelationId,             \
    (CUpti_ExternalCorrelationKind kind, std::uint64_t id))                                \
  X(activityPopExternalCorrelationId, cuptiActivityPopExternalCorrelationId,               \
    (CUpti_ExternalCorrelationKind kind, std::uint64_t * lastId))                          \
  X(subscribe, cuptiSubscribe,                                                             \
    (CUpti_SubscriberHandle * subscriber, CUpti_CallbackFunc callback, void* userdata))    \
  X(enableCallback, cuptiEnableCallback,                                                   \
    (std::uint32_t enable, CUpti_SubscriberHandle subscriber, CUpti_CallbackDomain domain, \
     CUpti_CallbackId cbid))                                                               \
  X(getGraphNodeId, cuptiGetGraphNodeId, (cuda::CUgraphNode node, std::uint64_t * nodeId))

// The entry points; every member is set in a loaded Library.
struct Library {
#define GS_CUPTI_MEMBER(MEMBER, SYMBOL, PARAMS) CUptiResult(*MEMBER) PARAMS = nullptr;
  GS_CUPTI_FUNCTIONS(GS_CUPTI_MEMBER)
#undef GS_CUPTI_MEMBER
};

}  // namespace gradscope::agent::cupti
