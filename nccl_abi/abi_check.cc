// Compile-time proof that nccl_abi/nccl.h is the installed nccl.h: the enums' sizes, underlying types and
// every enumerator's value, the unique id's layout, the constants nccl.h defines as macros. The plugin
// headers (tuner.h, profiler.h) are included too, to prove that they live beside nccl.h without a
// clash; nccl.h has no plugin declarations (nor the logger) to check them against (their layouts are pinned
// by tests/plugins/tuner/abi_test.cc and tests/plugins/profiler/abi_layout_test.cc). Built only where nccl.h
// is found; it generates no code, and every target that uses these headers depends on it, so a mismatch
// fails the build.

#include <type_traits>

#include <nccl.h>

#include "nccl_abi/nccl.h"
#include "nccl_abi/profiler.h"
#include "nccl_abi/tuner.h"

namespace ours = gradscope::nccl_abi;

// Enumerations: same size and underlying type (so the same calling convention), and the same values.
#define GS_SAME_ENUM(NAME)                                                                              \
  static_assert(sizeof(ours::NAME) == sizeof(::NAME) &&                                                 \
                    std::is_same_v<std::underlying_type_t<ours::NAME>, std::underlying_type_t<::NAME>>, \
                #NAME " in nccl_abi/nccl.h differs from nccl.h");
GS_SAME_ENUM(ncclResult_t)
GS_SAME_ENUM(ncclDataType_t)
GS_SAME_ENUM(ncclRedOp_t)
#undef GS_SAME_ENUM

#define GS_SAME_VALUE(NAME)                                                           \
  static_assert(static_cast<long long>(ours::NAME) == static_cast<long long>(::NAME), \
                #NAME " in nccl_abi/nccl.h differs from nccl.h");
GS_SAME_VALUE(ncclSuccess)
GS_SAME_VALUE(ncclUnhandledCudaError)
GS_SAME_VALUE(ncclSystemError)
GS_SAME_VALUE(ncclInternalError)
GS_SAME_VALUE(ncclInvalidArgument)
GS_SAME_VALUE(ncclInvalidUsage)
GS_SAME_VALUE(ncclRemoteError)
GS_SAME_VALUE(ncclInProgress)
GS_SAME_VALUE(ncclNumResults)
GS_SAME_VALUE(ncclInt8)
GS_SAME_VALUE(ncclChar)
GS_SAME_VALUE(ncclUint8)
GS_SAME_VALUE(ncclInt32)
GS_SAME_VALUE(ncclInt)
GS_SAME_VALUE(ncclUint32)
GS_SAME_VALUE(ncclInt64)
GS_SAME_VALUE(ncclUint64)
GS_SAME_VALUE(ncclFloat16)
GS_SAME_VALUE(ncclHalf)
GS_SAME_VALUE(ncclFloat32)
GS_SAME_VALUE(ncclFloat)
GS_SAME_VALUE(ncclFloat64)
GS_SAME_VALUE(ncclDouble)
GS_SAME_VALUE(ncclBfloat16)
GS_SAME_VALUE(ncclFloat8e4m3)
GS_SAME_VALUE(ncclFloat8e5m2)
GS_SAME_VALUE(ncclNumTypes)
GS_SAME_VALUE(ncclSum)
GS_SAME_VALUE(ncclProd)
GS_SAME_VALUE(ncclMax)
GS_SAME_VALUE(ncclMin)
GS_SAME_VALUE(ncclAvg)
GS_SAME_VALUE(ncclNumOps)
GS_SAME_VALUE(ncclMaxRedOp)
#undef GS_SAME_VALUE
static_assert(ours::kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(ours::kSplitNoColor == NCCL_SPLIT_NOCOLOR);

// Structures passed by value: same size and alignment.
static_assert(sizeof(ours::ncclUniqueId) == sizeof(::ncclUniqueId) &&
              alignof(ours::ncclUniqueId) == alignof(::ncclUniqueId));
