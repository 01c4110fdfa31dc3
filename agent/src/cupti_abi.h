#pragma once

// The few CUPTI activity-API facts the agent uses to read NCCL kernels' GPU spans, declared here so that
// the agent builds without the toolkit and never links CUPTI: libcupti is dlopen'ed at run time
// (cupti_tracer.h). Every fact is from CUDA 13's /usr/local/cuda/include/cupti_result.h and
// cupti_activity.h (activity record layouts: cupti_common.h packs them with 8-byte alignment), and
// abi_check.cc proves the values, sizes, offsets and function types against those headers whenever they
// are present.

#include <cstddef>
#include <cstdint>

#include "cuda_driver.h"

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
  CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0 = 3,
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
  std::uint8_t unused1[40];  // grid, block, shared memory, ...
  std::uint32_t correlationId;
  std::int64_t gridId;
  const char* name;  // valid while the buffer is being read
};
static_assert(offsetof(KernelRecordHead, start) == 16 && offsetof(KernelRecordHead, correlationId) == 92 &&
              offsetof(KernelRecordHead, name) == 104);
inline constexpr std::size_t kKernelRecordSize = 216;  // sizeof(CUpti_ActivityKernel10)

// cupti_activity.h `CUpti_ActivityExternalCorrelation` (24 bytes).
struct CUpti_ActivityExternalCorrelation {
  CUpti_ActivityKind kind;
  CUpti_ExternalCorrelationKind externalKind;
  std::uint64_t externalId;
  std::uint32_t correlationId;
  std::uint32_t reserved;
};

// cupti_activity.h: the buffer callbacks of cuptiActivityRegisterCallbacks.
using CUpti_BuffersCallbackRequestFunc = void (*)(std::uint8_t** buffer, std::size_t* size,
                                                  std::size_t* maxNumRecords);
using CUpti_BuffersCallbackCompleteFunc = void (*)(cuda::CUcontext context, std::uint32_t streamId,
                                                   std::uint8_t* buffer, std::size_t size,
                                                   std::size_t validSize);

// X(MEMBER, SYMBOL, PARAMS): the Library member, the exported symbol and its signature (all return
// CUptiResult).
#define GS_CUPTI_FUNCTIONS(X)                                                            \
  X(getTimestamp, cuptiGetTimestamp, (std::uint64_t * timestamp))                        \
  X(activityEnable, cuptiActivityEnable, (CUpti_ActivityKind kind))                      \
  X(activityDisable, cuptiActivityDisable, (CUpti_ActivityKind kind))                    \
  X(activityRegisterCallbacks, cuptiActivityRegisterCallbacks,                           \
    (CUpti_BuffersCallbackRequestFunc funcBufferRequested,                               \
     CUpti_BuffersCallbackCompleteFunc funcBufferCompleted))                             \
  X(activityGetNextRecord, cuptiActivityGetNextRecord,                                   \
    (std::uint8_t * buffer, std::size_t validBufferSizeBytes, CUpti_Activity * *record)) \
  X(activityFlushAll, cuptiActivityFlushAll, (std::uint32_t flag))                       \
  X(activityGetNumDroppedRecords, cuptiActivityGetNumDroppedRecords,                     \
    (cuda::CUcontext context, std::uint32_t streamId, std::size_t * dropped))            \
  X(activityPushExternalCorrelationId, cuptiActivityPushExternalCorrelationId,           \
    (CUpti_ExternalCorrelationKind kind, std::uint64_t id))                              \
  X(activityPopExternalCorrelationId, cuptiActivityPopExternalCorrelationId,             \
    (CUpti_ExternalCorrelationKind kind, std::uint64_t * lastId))

// The entry points; every member is set in a loaded Library.
struct Library {
#define GS_CUPTI_MEMBER(MEMBER, SYMBOL, PARAMS) CUptiResult(*MEMBER) PARAMS = nullptr;
  GS_CUPTI_FUNCTIONS(GS_CUPTI_MEMBER)
#undef GS_CUPTI_MEMBER
};

}  // namespace gradscope::agent::cupti
