#pragma once

// What nccl.h declares that crosses gradscope's boundaries with NCCL: results, data types, reduction
// operators, communicator and unique-id handles; and the logger that NCCL's plugins receive. The layout and
// values of NCCL 2.28 (nccl.h of NVIDIA/nccl v2.28.9-1, the header in /usr/local/cuda/include/nccl.h; codes
// also listed in /work/shared/REFERENCE.md), declared here once so that the agent and the plugins build
// without NCCL or CUDA; nccl_abi/abi_check.cc proves every declaration against the real header wherever it is
// found.
//
// Everything lives in gradscope::nccl_abi, so that a translation unit may also include nccl.h; the names
// are NCCL's own (constants that nccl.h defines as macros get k-names, which a macro cannot clobber).

#include <cstddef>

namespace gradscope::nccl_abi {

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

// ---- the logger NCCL hands its plugins at init ---------------------------------------------------------
// Not in nccl.h but in NVIDIA/nccl src/include/nccl_common.h (NCCL 2.28), which NCCL does not install:
// abi_check.cc cannot see it; tests/plugins/tuner/abi_test.cc pins the values. The tuner logs WARN (once
// per problem) and INFO (once per configuration load).
enum ncclDebugLogLevel {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
};

// ncclDebugLogSubSys (a bit mask passed as `unsigned long flags`); only what we use.
inline constexpr unsigned long NCCL_INIT = 0x1;
inline constexpr unsigned long NCCL_TUNING = 0x40;

// NCCL's logger: printf-like, thread-safe, prints only when NCCL_DEBUG allows `level` and
// NCCL_DEBUG_SUBSYS allows `flags`. It may be null when a host (a test, an older NCCL) passes none.
using ncclDebugLogger_t = void (*)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                   const char* fmt, ...);

}  // namespace gradscope::nccl_abi
