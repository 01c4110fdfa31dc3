// Compile-time proof that tuner_abi.h's ncclResult_t is nccl.h's (NCCL installs no plugin headers, so the
// structs are checked in tests/plugins/tuner/abi_test.cc against NCCL's plugin headers' layout). Built
// only where nccl.h is found; it generates no code.

#include <nccl.h>

#include "tuner_abi.h"

namespace tuner = gradscope::nccl_tuner;

static_assert(sizeof(tuner::ncclResult_t) == sizeof(::ncclResult_t));
static_assert(static_cast<int>(tuner::ncclSuccess) == static_cast<int>(::ncclSuccess));
static_assert(static_cast<int>(tuner::ncclUnhandledCudaError) == static_cast<int>(::ncclUnhandledCudaError));
static_assert(static_cast<int>(tuner::ncclSystemError) == static_cast<int>(::ncclSystemError));
static_assert(static_cast<int>(tuner::ncclInternalError) == static_cast<int>(::ncclInternalError));
static_assert(static_cast<int>(tuner::ncclInvalidArgument) == static_cast<int>(::ncclInvalidArgument));
static_assert(static_cast<int>(tuner::ncclInvalidUsage) == static_cast<int>(::ncclInvalidUsage));
static_assert(static_cast<int>(tuner::ncclRemoteError) == static_cast<int>(::ncclRemoteError));
static_assert(static_cast<int>(tuner::ncclInProgress) == static_cast<int>(::ncclInProgress));
static_assert(static_cast<int>(tuner::ncclNumResults) == static_cast<int>(::ncclNumResults));
