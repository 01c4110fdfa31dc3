#pragma once

// Wire precisions: what a gradient looks like on the wire when a strategy sends it in a narrower type.
// Conversions are defined bit for bit in numeric.h. fp8 uses per-block scaling: each block of
// `block` elements carries one fp32 scale = amax / fp8_max over its finite values (1 when that is below
// FLT_MIN, e.g. an all-zero block), and element i is stored as fp8((x_i · prescale) · fl(1 / scale)),
// a multiplication by the rounded reciprocal as Transformer Engine quantises (within an fp32 ulp of a
// true division); decoding computes (decoded · scale) · postscale.
// Pre-scaling by 1/N before the conversion keeps an N-rank sum from overflowing the narrow type.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "gradscope/common/types.h"
#include "gradscope/methods/cpu_executor.h"

namespace gradscope::methods {

// WireFormat, its names and kWireFormats are common/types.h's: the wire part of a strategy name.
DType wireDType(WireFormat format);
bool isFp8(WireFormat format);
std::size_t wireElementBytes(WireFormat format);  // 2 or 1
float wireMax(WireFormat format);                 // largest finite value

struct EncodeOptions {
  float prescale = 1.0f;    // multiply before converting (1/N for an N-rank sum)
  std::size_t block = 128;  // fp8 scaling block, in elements (>= 1)
  // false: the caller does not read the EncodeStats (they stay 0). On a GPU that saves reading the
  // counters back, a host synchronisation per conversion.
  bool count = true;
};

// What a conversion did to the values. overflow: finite inputs whose (prescaled, block-scaled) value
// rounds past the largest finite value: to Inf for fp16/bf16, clamped for fp8 (|v/scale| > 464 for
// e4m3, >= 61440 for e5m2; with amax scaling only a prescale that pushes a value past FLT_MAX can do
// that). nan: NaN inputs. ±Inf inputs are neither; they are left out of the fp8 block amax.
// (methods/src/wire.cc has the exact definitions the CUDA kernels reproduce.)
struct EncodeStats {
  std::uint64_t overflow = 0;
  std::uint64_t nan = 0;
};

// Number of fp32 scales an fp8 encoding of `count` elements carries (0 for fp16/bf16).
std::size_t scaleCount(WireFormat format, std::size_t count, std::size_t block);

// Encodes `count` fp32 values into `out` (count · wireElementBytes bytes) and, for fp8, `scales`
// (scaleCount entries; ignored for fp16/bf16).
EncodeStats encode(WireFormat format, const float* in, std::size_t count, void* out, float* scales,
                   const EncodeOptions& options = {}, CpuExecutor& executor = CpuExecutor::shared());

// Decodes into fp32, multiplying by the block scale (fp8) and by `postscale` (e.g. N to undo 1/N).
void decode(WireFormat format, const void* in, const float* scales, std::size_t count, float* out,
            float postscale = 1.0f, std::size_t block = 128, CpuExecutor& executor = CpuExecutor::shared());

// inout[i] = code(decode(inout[i]) + decode(in[i])) for plain codes (fp16, bf16, or fp8 with scale 1):
// the two values added in fp32 and rounded back to the format (numeric.h; fp8 saturates; when both are
// NaN either payload may come through). This is
// what every hop of a sum on a narrow wire computes. Runs on the calling thread only: it is called
// from inside communication libraries' progress engines, on chunks they choose.
void addCodes(WireFormat format, const void* in, void* inout, std::size_t count);

// Bytes read and written by encode / decode of `count` elements.
std::size_t encodeBytesMoved(WireFormat format, std::size_t count, std::size_t block);
std::size_t decodeBytesMoved(WireFormat format, std::size_t count, std::size_t block);

}  // namespace gradscope::methods
