#pragma once

// The NCCL and CUDA runtime types the NCCL interposer needs, declared here so that the agent builds
// without the CUDA toolkit and links neither NCCL nor CUDA. Only what crosses the wrapped functions'
// signatures is declared, with the layout and values of NCCL 2.28 (nccl.h of NVIDIA/nccl v2.28.9-1,
// the header in /usr/local/cuda/include/nccl.h; codes also listed in /work/shared/REFERENCE.md).
// abi_check.cc proves every declaration against the real headers whenever the toolkit is present.
//
// Everything lives in gradscope::agent::nccl, so that a translation unit may also include nccl.h;
// the names are NCCL's own so that nccl_functions.def reads like nccl.h.

#include <cstddef>

#include "cuda_driver.h"

namespace gradscope::agent::nccl {

// nccl.h: `typedef enum { ncclSuccess = 0, ... ncclNumResults = 8 } ncclResult_t;`. No enumerator is
// negative, so the compiler picks the same underlying type for this enum as for NCCL's.
enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
};

// nccl.h: `typedef enum { ncclInt8 = 0, ... ncclFloat8e5m2 = 11, ncclNumTypes = 12 } ncclDataType_t;`
// (the fp8 types since 2.24). gradscope::DType uses the same codes (common/types.h).
enum ncclDataType_t {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
};

// nccl.h: Sum=0 ... Avg=4, ncclNumOps=5 (the first dynamic operator, from ncclRedOpCreatePreMulSum),
// ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t)) = 0x7fffffff.
enum ncclRedOp_t {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
};

// nccl.h: `typedef struct ncclComm* ncclComm_t;` — opaque.
struct ncclComm;
using ncclComm_t = ncclComm*;

// nccl.h: `#define NCCL_UNIQUE_ID_BYTES 128`, `typedef struct { char internal[128]; } ncclUniqueId;`,
// passed by value to ncclCommInitRank.
inline constexpr std::size_t kUniqueIdBytes = 128;
struct ncclUniqueId {
  char internal[kUniqueIdBytes];
};

// nccl.h: `#define NCCL_SPLIT_NOCOLOR -1`: the caller takes no part in the new communicator.
inline constexpr int kSplitNoColor = -1;

// Only ever handled through pointers, so their layout (which grows with each NCCL release) stays NCCL's
// business: ncclConfig_t (ncclCommInitRankConfig, ncclCommSplit, ...) and ncclSimInfo_t
// (ncclGroupSimulateEnd).
struct ncclConfig_t;
struct ncclSimInfo_t;

// driver_types.h: `typedef struct CUstream_st* cudaStream_t;` — the driver API's CUstream. 0 is the
// legacy default stream; 0x1 (cudaStreamLegacy) and 0x2 (cudaStreamPerThread) are special handles that
// the driver accepts as well.
using cudaStream_t = cuda::CUstream;

}  // namespace gradscope::agent::nccl
