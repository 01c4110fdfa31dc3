#pragma once

// LocalOps on host memory: the methods library's CPU kernels on the shared CpuExecutor. Used by the
// MPI communicator (and by anything else whose buffers live on the host).

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gradscope/comm/communicator.h"
#include "gradscope/methods/cpu_executor.h"

namespace gradscope::comm {

std::unique_ptr<LocalOps> makeHostLocalOps();

// This thread's inline executor (1 worker), for kernels called on chunks from inside a parallel region
// (the shared pool is busy running that region and must not be re-entered) or between messages.
methods::CpuExecutor& serialExecutor();

// Scaled-block records (Element{fp8, block > 0}): each is a 4-byte fp32 scale followed by `block`
// codes. These move `n` records to and from separate scale and code arrays, the layout wire.h's
// kernels take (for encodeScaledBlocks / decodeScaledBlocks and the MPI sum operator).
void unpackRecords(const void* records, std::size_t n, std::size_t block, float* scales, std::uint8_t* codes);
void packRecords(const float* scales, const std::uint8_t* codes, std::size_t n, std::size_t block,
                 void* records);

}  // namespace gradscope::comm
