// Compile-time proof that the agent's own declarations of NCCL, CUDA driver and NVTX facts
// (nccl_functions.def, cuda_driver.h, nvtx_abi.h) match the real headers: type sizes and layouts,
// enumerator values, and the exact function type of every NCCL function in the table and every driver
// function the agent looks up. NCCL's types themselves (nccl_abi/nccl.h) are proved by
// nccl_abi/abi_check.cc; here they are only mapped to nccl.h's to compare the signatures. Built only where
// the CUDA toolkit's headers are found (agent/CMakeLists.txt); it generates no code, and the agent's build
// depends on it, so a mismatch fails the build.

#include <nvtx3/nvToolsExt.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include <cuda.h>
#include <cupti.h>
#include <nccl.h>

#include "core/cuda_driver.h"
#include "core/cupti_abi.h"
#include "core/nccl_types.h"
#include "interpose/nvtx_abi.h"

namespace gradscope::agent::abi_check {

// Real<T>::type: the real headers' type for one of the agent's; other types map to themselves, and
// pointers, const and function pointers map part by part.
template <typename T>
struct Real {
  using type = T;
};
template <typename T>
using RealT = typename Real<T>::type;
template <typename T>
struct Real<T*> {
  using type = RealT<T>*;
};
template <typename T>
struct Real<const T> {
  using type = const RealT<T>;
};
template <typename R, typename... Args>
struct Real<R (*)(Args...)> {
  using type = RealT<R> (*)(RealT<Args>...);
};
#define GS_REAL_TYPE(OURS, THEIRS) \
  template <>                      \
  struct Real<OURS> {              \
    using type = THEIRS;           \
  };
GS_REAL_TYPE(nccl::ncclResult_t, ::ncclResult_t)
GS_REAL_TYPE(nccl::ncclDataType_t, ::ncclDataType_t)
GS_REAL_TYPE(nccl::ncclRedOp_t, ::ncclRedOp_t)
GS_REAL_TYPE(nccl::ncclComm, ::ncclComm)
GS_REAL_TYPE(nccl::ncclUniqueId, ::ncclUniqueId)
GS_REAL_TYPE(nccl::ncclConfig_t, ::ncclConfig_t)
GS_REAL_TYPE(nccl::ncclSimInfo_t, ::ncclSimInfo_t)
GS_REAL_TYPE(cuda::CUresult, ::CUresult)
GS_REAL_TYPE(cuda::CUstreamCaptureStatus, ::CUstreamCaptureStatus)
GS_REAL_TYPE(cuda::CUstreamCaptureMode, ::CUstreamCaptureMode)
GS_REAL_TYPE(cuda::CUctx_st, ::CUctx_st)
GS_REAL_TYPE(cuda::CUevent_st, ::CUevent_st)
GS_REAL_TYPE(cuda::CUstream_st, ::CUstream_st)
GS_REAL_TYPE(nvtx::CallbackModule, ::NvtxCallbackModule)
GS_REAL_TYPE(cupti::CUptiResult, ::CUptiResult)
GS_REAL_TYPE(cupti::CUpti_ActivityKind, ::CUpti_ActivityKind)
GS_REAL_TYPE(cupti::CUpti_ExternalCorrelationKind, ::CUpti_ExternalCorrelationKind)
GS_REAL_TYPE(cupti::CUpti_Activity, ::CUpti_Activity)
GS_REAL_TYPE(cupti::CUpti_BuffersCallbackRequestFunc, ::CUpti_BuffersCallbackRequestFunc)
GS_REAL_TYPE(cupti::CUpti_BuffersCallbackCompleteFunc, ::CUpti_BuffersCallbackCompleteFunc)
GS_REAL_TYPE(cupti::CUpti_CallbackDomain, ::CUpti_CallbackDomain)
GS_REAL_TYPE(cupti::CUpti_Subscriber_st, ::CUpti_Subscriber_st)
GS_REAL_TYPE(cupti::CUpti_CallbackFunc, ::CUpti_CallbackFunc)
GS_REAL_TYPE(cuda::CUgraph_st, ::CUgraph_st)
GS_REAL_TYPE(cuda::CUgraphNode_st, ::CUgraphNode_st)
GS_REAL_TYPE(cuda::CUgraphExec_st, ::CUgraphExec_st)
#undef GS_REAL_TYPE

// Enumerations: same size and underlying type (so the same calling convention), and the same values.
template <typename Ours, typename Theirs>
constexpr bool kSameEnum = sizeof(Ours) == sizeof(Theirs) &&
                           std::is_same_v<std::underlying_type_t<Ours>, std::underlying_type_t<Theirs>>;
static_assert(kSameEnum<cuda::CUresult, ::CUresult>);
static_assert(kSameEnum<cuda::CUstreamCaptureStatus, ::CUstreamCaptureStatus>);
static_assert(kSameEnum<cuda::CUstreamCaptureMode, ::CUstreamCaptureMode>);
static_assert(kSameEnum<nvtx::CallbackModule, ::NvtxCallbackModule>);
static_assert(kSameEnum<cupti::CUptiResult, ::CUptiResult>);
static_assert(kSameEnum<cupti::CUpti_ActivityKind, ::CUpti_ActivityKind>);
static_assert(kSameEnum<cupti::CUpti_ExternalCorrelationKind, ::CUpti_ExternalCorrelationKind>);
static_assert(kSameEnum<cupti::CUpti_CallbackDomain, ::CUpti_CallbackDomain>);
static_assert(std::is_same_v<cupti::CUpti_CallbackId, ::CUpti_CallbackId>);

#define GS_SAME_VALUE(OURS, THEIRS)                                             \
  static_assert(static_cast<long long>(OURS) == static_cast<long long>(THEIRS), \
                #OURS " differs from " #THEIRS);
GS_SAME_VALUE(cuda::CUDA_SUCCESS, ::CUDA_SUCCESS)
GS_SAME_VALUE(cuda::CUDA_ERROR_INVALID_VALUE, ::CUDA_ERROR_INVALID_VALUE)
GS_SAME_VALUE(cuda::CUDA_ERROR_DEINITIALIZED, ::CUDA_ERROR_DEINITIALIZED)
GS_SAME_VALUE(cuda::CUDA_ERROR_INVALID_CONTEXT, ::CUDA_ERROR_INVALID_CONTEXT)
GS_SAME_VALUE(cuda::CUDA_ERROR_INVALID_HANDLE, ::CUDA_ERROR_INVALID_HANDLE)
GS_SAME_VALUE(cuda::CUDA_ERROR_NOT_READY, ::CUDA_ERROR_NOT_READY)
GS_SAME_VALUE(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, ::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
GS_SAME_VALUE(cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, ::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
GS_SAME_VALUE(cuda::CU_STREAM_CAPTURE_STATUS_NONE, ::CU_STREAM_CAPTURE_STATUS_NONE)
GS_SAME_VALUE(cuda::CU_STREAM_CAPTURE_STATUS_ACTIVE, ::CU_STREAM_CAPTURE_STATUS_ACTIVE)
GS_SAME_VALUE(cuda::CU_STREAM_CAPTURE_STATUS_INVALIDATED, ::CU_STREAM_CAPTURE_STATUS_INVALIDATED)
GS_SAME_VALUE(cuda::CU_STREAM_CAPTURE_MODE_GLOBAL, ::CU_STREAM_CAPTURE_MODE_GLOBAL)
GS_SAME_VALUE(cuda::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, ::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
GS_SAME_VALUE(cuda::CU_STREAM_CAPTURE_MODE_RELAXED, ::CU_STREAM_CAPTURE_MODE_RELAXED)
GS_SAME_VALUE(cuda::kEventDefault, ::CU_EVENT_DEFAULT)
GS_SAME_VALUE(cuda::kEventDisableTiming, ::CU_EVENT_DISABLE_TIMING)
GS_SAME_VALUE(cuda::kStreamNonBlocking, ::CU_STREAM_NON_BLOCKING)
GS_SAME_VALUE(nvtx::kExportTableCallbacks, ::NVTX_ETID_CALLBACKS)
GS_SAME_VALUE(nvtx::kExportTableVersionInfo, ::NVTX_ETID_VERSIONINFO)
GS_SAME_VALUE(nvtx::kModuleCore, ::NVTX_CB_MODULE_CORE)
GS_SAME_VALUE(nvtx::kModuleCore2, ::NVTX_CB_MODULE_CORE2)
GS_SAME_VALUE(nvtx::kCoreRangePushEx, ::NVTX_CBID_CORE_RangePushEx)
GS_SAME_VALUE(nvtx::kCoreRangePushA, ::NVTX_CBID_CORE_RangePushA)
GS_SAME_VALUE(nvtx::kCoreRangePushW, ::NVTX_CBID_CORE_RangePushW)
GS_SAME_VALUE(nvtx::kCore2DomainRangePushEx, ::NVTX_CBID_CORE2_DomainRangePushEx)
GS_SAME_VALUE(nvtx::kCoreRangePop, ::NVTX_CBID_CORE_RangePop)
GS_SAME_VALUE(nvtx::kCore2DomainRangePop, ::NVTX_CBID_CORE2_DomainRangePop)
GS_SAME_VALUE(nvtx::kVersion, NVTX_VERSION)
GS_SAME_VALUE(nvtx::kMessageAscii, ::NVTX_MESSAGE_TYPE_ASCII)
GS_SAME_VALUE(nvtx::kMessageUnicode, ::NVTX_MESSAGE_TYPE_UNICODE)
GS_SAME_VALUE(nvtx::kNoPushPopTracking, NVTX_NO_PUSH_POP_TRACKING)
GS_SAME_VALUE(cupti::CUPTI_SUCCESS, ::CUPTI_SUCCESS)
GS_SAME_VALUE(cupti::CUPTI_ERROR_MAX_LIMIT_REACHED, ::CUPTI_ERROR_MAX_LIMIT_REACHED)
GS_SAME_VALUE(cupti::CUPTI_ERROR_UNKNOWN, ::CUPTI_ERROR_UNKNOWN)
GS_SAME_VALUE(cupti::CUPTI_ACTIVITY_KIND_KERNEL, ::CUPTI_ACTIVITY_KIND_KERNEL)
GS_SAME_VALUE(cupti::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, ::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
GS_SAME_VALUE(cupti::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, ::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION)
GS_SAME_VALUE(cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, ::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
GS_SAME_VALUE(cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1, ::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1)
GS_SAME_VALUE(cupti::CUPTI_CB_DOMAIN_RESOURCE, ::CUPTI_CB_DOMAIN_RESOURCE)
GS_SAME_VALUE(cupti::CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, ::CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED)
GS_SAME_VALUE(cupti::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED, ::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED)
GS_SAME_VALUE(cupti::kGraphKernelNode, ::CU_GRAPH_NODE_TYPE_KERNEL)
#undef GS_SAME_VALUE

// Structures: same size and, where the agent reads fields, the same offsets.
static_assert(sizeof(nvtx::EventAttributes) == sizeof(::nvtxEventAttributes_t));
static_assert(offsetof(nvtx::EventAttributes, payload) == offsetof(::nvtxEventAttributes_t, payload));
static_assert(offsetof(nvtx::EventAttributes, messageType) == offsetof(::nvtxEventAttributes_t, messageType));
static_assert(offsetof(nvtx::EventAttributes, message) == offsetof(::nvtxEventAttributes_t, message));
static_assert(sizeof(nvtx::ExportTableCallbacks) == sizeof(::NvtxExportTableCallbacks));
static_assert(offsetof(nvtx::ExportTableCallbacks, GetModuleFunctionTable) ==
              offsetof(::NvtxExportTableCallbacks, GetModuleFunctionTable));
static_assert(std::is_same_v<RealT<decltype(nvtx::ExportTableCallbacks::GetModuleFunctionTable)>,
                             decltype(::NvtxExportTableCallbacks::GetModuleFunctionTable)>);
static_assert(sizeof(nvtx::ExportTableVersionInfo) == sizeof(::NvtxExportTableVersionInfo));
static_assert(offsetof(nvtx::ExportTableVersionInfo, SetInjectionNvtxVersion) ==
              offsetof(::NvtxExportTableVersionInfo, SetInjectionNvtxVersion));
static_assert(std::is_same_v<nvtx::FunctionTable, ::NvtxFunctionTable>);
static_assert(std::is_same_v<nvtx::GetExportTable, ::NvtxGetExportTableFunc_t>);
static_assert(std::is_same_v<nvtx::InitializeInjection, ::NvtxInitializeInjectionNvtxFunc_t>);
static_assert(std::is_same_v<RealT<nccl::cudaStream_t>, ::cudaStream_t>);
static_assert(std::is_same_v<RealT<cuda::CUstream>, ::CUstream>);
static_assert(std::is_same_v<cuda::CUdevice, ::CUdevice>);
// CUPTI's activity records: the fields the agent reads, at the real offsets.
static_assert(sizeof(cupti::CUpti_Activity) == sizeof(::CUpti_Activity));
static_assert(cupti::kKernelRecordSize == sizeof(::CUpti_ActivityKernel10));
#define GS_SAME_OFFSET(OURS, THEIRS, FIELD)                                                     \
  static_assert(offsetof(OURS, FIELD) == offsetof(THEIRS, FIELD) &&                             \
                    sizeof(std::declval<OURS>().FIELD) == sizeof(std::declval<THEIRS>().FIELD), \
                #OURS "::" #FIELD " differs from " #THEIRS);
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, kind)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, start)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, end)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, completed)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, deviceId)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, contextId)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, streamId)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, correlationId)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, gridId)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, name)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, graphNodeId)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, shmemLimitConfig)
GS_SAME_OFFSET(cupti::KernelRecordHead, ::CUpti_ActivityKernel10, graphId)
static_assert(sizeof(cupti::CUpti_ResourceData) == sizeof(::CUpti_ResourceData));
GS_SAME_OFFSET(cupti::CUpti_ResourceData, ::CUpti_ResourceData, context)
static_assert(offsetof(cupti::CUpti_ResourceData, stream) == offsetof(::CUpti_ResourceData, resourceHandle) &&
              sizeof(cupti::CUpti_ResourceData::stream) == sizeof(::CUpti_ResourceData::resourceHandle));
GS_SAME_OFFSET(cupti::CUpti_ResourceData, ::CUpti_ResourceData, resourceDescriptor)
static_assert(sizeof(cupti::CUpti_GraphData) == sizeof(::CUpti_GraphData));
GS_SAME_OFFSET(cupti::CUpti_GraphData, ::CUpti_GraphData, graph)
GS_SAME_OFFSET(cupti::CUpti_GraphData, ::CUpti_GraphData, originalGraph)
GS_SAME_OFFSET(cupti::CUpti_GraphData, ::CUpti_GraphData, node)
GS_SAME_OFFSET(cupti::CUpti_GraphData, ::CUpti_GraphData, originalNode)
GS_SAME_OFFSET(cupti::CUpti_GraphData, ::CUpti_GraphData, nodeType)
GS_SAME_OFFSET(cupti::CUpti_GraphData, ::CUpti_GraphData, dependency)
GS_SAME_OFFSET(cupti::CUpti_GraphData, ::CUpti_GraphData, graphExec)
static_assert(sizeof(cupti::KernelRecordHead) <= sizeof(::CUpti_ActivityKernel10));
static_assert(sizeof(cupti::CUpti_ActivityExternalCorrelation) ==
              sizeof(::CUpti_ActivityExternalCorrelation));
GS_SAME_OFFSET(cupti::CUpti_ActivityExternalCorrelation, ::CUpti_ActivityExternalCorrelation, kind)
GS_SAME_OFFSET(cupti::CUpti_ActivityExternalCorrelation, ::CUpti_ActivityExternalCorrelation, externalKind)
GS_SAME_OFFSET(cupti::CUpti_ActivityExternalCorrelation, ::CUpti_ActivityExternalCorrelation, externalId)
GS_SAME_OFFSET(cupti::CUpti_ActivityExternalCorrelation, ::CUpti_ActivityExternalCorrelation, correlationId)
#undef GS_SAME_OFFSET

}  // namespace gradscope::agent::abi_check

// Functions: every row of the tables, with the agent's types mapped to the real ones, has exactly the
// type of the real declaration. (Expanded inside the agent's namespaces so that the rows' unqualified
// type names are the agent's.) The rows of functions newer than the installed nccl.h are left out; the
// agent exports them all the same (nccl_functions.def says what a call to one does on an older NCCL).
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 0)
#define GS_NCCL_OLDER_THAN_2_28
#endif
namespace gradscope::agent::nccl {
#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS)                                      \
  static_assert(std::is_same_v<abi_check::RealT<RESULT(*) PARAMS>, decltype(&::NAME)>,    \
                #NAME " in nccl_functions.def differs from nccl.h");                      \
  static_assert(std::is_same_v<abi_check::RealT<RESULT(*) PARAMS>, decltype(&::p##NAME)>, \
                "p" #NAME " in nccl_functions.def differs from nccl.h");
#include "interpose/nccl_functions.def"
#undef GS_NCCL_FUNCTION
}  // namespace gradscope::agent::nccl

namespace gradscope::agent::cuda {
#define GS_CUDA_DRIVER_CHECK(MEMBER, SYMBOL, FALLBACK, RESULT, PARAMS)                   \
  static_assert(std::is_same_v<abi_check::RealT<RESULT(*) PARAMS>, decltype(&::SYMBOL)>, \
                #SYMBOL " in cuda_driver.h differs from cuda.h");
GS_CUDA_DRIVER_FUNCTIONS(GS_CUDA_DRIVER_CHECK)
#undef GS_CUDA_DRIVER_CHECK
}  // namespace gradscope::agent::cuda

namespace gradscope::agent::cupti {
#define GS_CUPTI_CHECK(MEMBER, SYMBOL, PARAMS)                                                \
  static_assert(std::is_same_v<abi_check::RealT<CUptiResult(*) PARAMS>, decltype(&::SYMBOL)>, \
                #SYMBOL " in cupti_abi.h differs from cupti.h");
GS_CUPTI_FUNCTIONS(GS_CUPTI_CHECK)
#undef GS_CUPTI_CHECK
}  // namespace gradscope::agent::cupti
