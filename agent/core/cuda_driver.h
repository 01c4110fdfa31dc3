#pragma once

// The few CUDA driver API functions the agent uses to time NCCL calls on the GPU, found at run time in
// the libcuda.so.1 the job has already loaded (never loaded by the agent: a process that does not use
// CUDA must stay without it). The types are declared here, with cuda.h's layout and values (CUDA 13,
// /usr/local/cuda/include/cuda.h), so that the agent builds without the toolkit; abi_check.cc proves
// them against cuda.h whenever the toolkit is present.
//
// Tests hand the timer a Driver whose pointers are fakes (tests/unit/agent_nccl_test.cc), or preload a
// fake libcuda.so.1 (tests/agent/nccl/fake_cuda.cc).

#include <string>

namespace gradscope::agent::cuda {

// cuda.h `typedef enum cudaError_enum {...} CUresult;` (all values non-negative, like these). Only the
// codes the agent tells apart.
enum CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
};

// cuda.h: `typedef enum CUstreamCaptureStatus_enum {NONE = 0, ACTIVE = 1, INVALIDATED = 2}`.
enum CUstreamCaptureStatus {
  CU_STREAM_CAPTURE_STATUS_NONE = 0,
  CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
};

// cuda.h: `typedef enum CUstreamCaptureMode_enum {GLOBAL = 0, THREAD_LOCAL = 1, RELAXED = 2}`.
enum CUstreamCaptureMode {
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2
};

// cuda.h: CU_EVENT_DEFAULT = 0 (timing enabled, unlike CU_EVENT_DISABLE_TIMING = 2);
// CU_STREAM_NON_BLOCKING = 1 (no implicit synchronisation with the legacy default stream).
inline constexpr unsigned kEventDefault = 0x0;
inline constexpr unsigned kEventDisableTiming = 0x2;  // CU_EVENT_DISABLE_TIMING: order and completion only
inline constexpr unsigned kStreamNonBlocking = 0x1;

// cuda.h: `typedef int CUdevice_v1; typedef CUdevice_v1 CUdevice;` and opaque handles. CUstream_st is
// also the runtime's cudaStream_t (nccl_types.h).
using CUdevice = int;
struct CUctx_st;
struct CUevent_st;
struct CUstream_st;
struct CUgraph_st;
struct CUgraphNode_st;
struct CUgraphExec_st;
using CUcontext = CUctx_st*;
using CUevent = CUevent_st*;
using CUstream = CUstream_st*;
using CUgraph = CUgraph_st*;  // only passed through (CUPTI's graph callbacks, cupti_abi.h)
using CUgraphNode = CUgraphNode_st*;
using CUgraphExec = CUgraphExec_st*;

// X(MEMBER, SYMBOL, FALLBACK, RESULT, PARAMS): the Driver member, the exported symbol looked up first
// (cuda.h's name after its versioning macros, e.g. `#define cuEventDestroy cuEventDestroy_v2`), the one
// tried when a driver predates it ("" for none), and the signature.
#define GS_CUDA_DRIVER_FUNCTIONS(X)                                                        \
  X(ctxGetCurrent, cuCtxGetCurrent, "", CUresult, (CUcontext * pctx))                      \
  X(ctxSetCurrent, cuCtxSetCurrent, "", CUresult, (CUcontext ctx))                         \
  X(ctxGetDevice, cuCtxGetDevice, "", CUresult, (CUdevice * device))                       \
  X(deviceGet, cuDeviceGet, "", CUresult, (CUdevice * device, int ordinal))                \
  X(deviceGetName, cuDeviceGetName, "", CUresult, (char* name, int len, CUdevice dev))     \
  X(streamCreate, cuStreamCreate, "", CUresult, (CUstream * phStream, unsigned int Flags)) \
  X(streamDestroy, cuStreamDestroy_v2, "cuStreamDestroy", CUresult, (CUstream hStream))    \
  X(streamGetCtx, cuStreamGetCtx, "", CUresult, (CUstream hStream, CUcontext * pctx))      \
  X(streamIsCapturing, cuStreamIsCapturing, "", CUresult,                                  \
    (CUstream hStream, CUstreamCaptureStatus * status))                                    \
  X(threadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode, "", CUresult,      \
    (CUstreamCaptureMode * mode))                                                          \
  X(eventCreate, cuEventCreate, "", CUresult, (CUevent * phEvent, unsigned int Flags))     \
  X(eventDestroy, cuEventDestroy_v2, "cuEventDestroy", CUresult, (CUevent hEvent))         \
  X(eventRecord, cuEventRecord, "", CUresult, (CUevent hEvent, CUstream hStream))          \
  X(eventQuery, cuEventQuery, "", CUresult, (CUevent hEvent))                              \
  X(eventSynchronize, cuEventSynchronize, "", CUresult, (CUevent hEvent))                  \
  X(eventElapsedTime, cuEventElapsedTime_v2, "cuEventElapsedTime", CUresult,               \
    (float* pMilliseconds, CUevent hStart, CUevent hEnd))

// The driver entry points; every member is set in a loaded Driver.
struct Driver {
#define GS_CUDA_DRIVER_MEMBER(MEMBER, SYMBOL, FALLBACK, RESULT, PARAMS) RESULT(*MEMBER) PARAMS = nullptr;
  GS_CUDA_DRIVER_FUNCTIONS(GS_CUDA_DRIVER_MEMBER)
#undef GS_CUDA_DRIVER_MEMBER
};

// Fills `driver` from the libcuda.so.1 already loaded in this process. False, with the reason in
// `why`, when none is loaded or a function is missing. Never loads the library.
bool loadDriver(Driver& driver, std::string& why);

}  // namespace gradscope::agent::cuda
