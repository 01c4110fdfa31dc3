#pragma once

// NCCL's names as the agent's NCCL code and nccl_functions.def spell them: NCCL's ABI, declared once for
// the agent and the plugins in nccl_abi/nccl.h (checked against the installed nccl.h there), and the CUDA
// stream NCCL's functions take, which is the agent's own CUDA driver type.
//
// gradscope::agent::nccl only gathers those names, so that a translation unit may also include nccl.h.

#include "core/cuda_driver.h"
#include "nccl_abi/nccl.h"

namespace gradscope::agent::nccl {

using namespace gradscope::nccl_abi;

// driver_types.h: `typedef struct CUstream_st* cudaStream_t;` — the driver API's CUstream. 0 is the
// legacy default stream; 0x1 (cudaStreamLegacy) and 0x2 (cudaStreamPerThread) are special handles that
// the driver accepts as well.
using cudaStream_t = cuda::CUstream;

}  // namespace gradscope::agent::nccl
