// wire.h on the GPU: encode fp32 into fp16 / bf16 / fp8 with per-block scaling, decode back.
//
// Bit-identical to wire.cc: the conversions are numeric.h's GS_HOST_DEVICE functions, and the fp32
// arithmetic is the same IEEE operations in the same order, written as __fmul_rn / __fdiv_rn so the
// compiler can neither fuse nor approximate them:
//   v = x * prescale; fp8: amax = integer max of the finite |v| bits of the block, scale = amax /
//   fp8_max (1 when below FLT_MIN), inverse = 1 / scale (__fdiv_rn, once per block), code =
//   fp8(v * inverse); decode = (decoded * scale) * postscale.
// The counters are integer sums (atomicAdd into the caller's uint64[2]), equal whatever the order.
//
// Layout of the fp8 kernels: one *group* of G threads per scaling block (grid-stride over blocks):
// a single thread for blocks shorter than a warp, a warp up to kWarpBlockLimit elements, a whole thread
// block beyond. The group finds amax (warp: __reduce_max_sync; block: shared memory), then converts
// the block a second time through L1/L2. With the default block of 128 a warp lane holds exactly one
// float4. 16-byte loads (and 4-byte fp8 stores) are used when the pointers are aligned and the block
// length is a multiple of 4, so every scaling block starts aligned too.

#include <cfloat>
#include <cstdint>
#include <string>

#include "common.cuh"
#include "gradscope/common/error.h"
#include "gradscope/methods/cuda.h"

namespace gradscope::methods::cuda {
namespace {

using detail::kBlockThreads;

constexpr std::uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr std::uint32_t kInfBits = 0x7F800000u;
// First |v * inverse| bits counted as an fp8 overflow (wire.cc: beyond what rounding brings back to max).
constexpr std::uint32_t kE4M3OverflowBits = 0x43E80001u;
constexpr std::uint32_t kE5M2OverflowBits = 0x47700000u;
// Scaling blocks up to this length get one warp each; longer ones a whole thread block.
constexpr std::size_t kWarpBlockLimit = 4096;

struct Counts {
  unsigned long long overflow = 0;
  unsigned long long nan = 0;
};

// Adds the block's counts to stats[0..1] with one atomic per counter per thread block.
__device__ __forceinline__ void publish(Counts counts, unsigned long long* stats) {
  const unsigned long long overflow = detail::blockCount(counts.overflow);
  const unsigned long long nan = detail::blockCount(counts.nan);
  if (threadIdx.x == 0 && stats != nullptr) {
    if (overflow != 0) atomicAdd(&stats[0], overflow);
    if (nan != 0) atomicAdd(&stats[1], nan);
  }
}

__device__ __forceinline__ bool isNan(float x) {
  return (floatBits(x) & kAbsMask) > kInfBits;
}
__device__ __forceinline__ bool isFinite(float x) {
  return (floatBits(x) & kAbsMask) < kInfBits;
}

// ---- fp16 / bf16 -----------------------------------------------------------------------------------------

// |v| from which the conversion gives Inf: 65520 for fp16, the halfway point to 2^128 for bf16.
template <bool kBf16>
constexpr std::uint32_t kHalfOverflowBits = kBf16 ? 0x7F7F8000u : 0x477FF000u;

template <bool kBf16>
__device__ __forceinline__ std::uint16_t encodeHalf(float x, float prescale, Counts& counts) {
  const float v = __fmul_rn(x, prescale);
  const std::uint16_t code = kBf16 ? fp32ToBf16(v) : fp32ToFp16(v);
  // An overflow: a finite x whose v reaches the threshold and is not NaN (so it became Inf).
  const std::uint32_t v_magnitude = floatBits(v) & kAbsMask;
  counts.overflow +=
      (isFinite(x) && v_magnitude >= kHalfOverflowBits<kBf16> && v_magnitude <= kInfBits) ? 1u : 0u;
  counts.nan += isNan(x) ? 1u : 0u;
  return code;
}

// kVector: `in` and `out` are 16-byte aligned; each thread converts 8 floats into one 16-byte store.
template <bool kBf16, bool kVector>
__global__ void __launch_bounds__(kBlockThreads)
    encodeHalfKernel(const float* in, std::uint16_t* out, std::size_t count, float prescale,
                     unsigned long long* stats) {
  Counts counts;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if constexpr (kVector) {
    const std::size_t packs = count / 8;
    const auto* in4 = reinterpret_cast<const float4*>(in);
    auto* out8 = reinterpret_cast<detail::Pack<std::uint16_t>*>(out);
    for (std::size_t p = first; p < packs; p += stride) {
      const float4 a = in4[2 * p];
      const float4 b = in4[2 * p + 1];
      detail::Pack<std::uint16_t> codes;
      codes.v[0] = encodeHalf<kBf16>(a.x, prescale, counts);
      codes.v[1] = encodeHalf<kBf16>(a.y, prescale, counts);
      codes.v[2] = encodeHalf<kBf16>(a.z, prescale, counts);
      codes.v[3] = encodeHalf<kBf16>(a.w, prescale, counts);
      codes.v[4] = encodeHalf<kBf16>(b.x, prescale, counts);
      codes.v[5] = encodeHalf<kBf16>(b.y, prescale, counts);
      codes.v[6] = encodeHalf<kBf16>(b.z, prescale, counts);
      codes.v[7] = encodeHalf<kBf16>(b.w, prescale, counts);
      out8[p] = codes;
    }
    done = packs * 8;
  }
  for (std::size_t i = done + first; i < count; i += stride)
    out[i] = encodeHalf<kBf16>(in[i], prescale, counts);
  publish(counts, stats);
}

template <bool kBf16>
__device__ __forceinline__ float decodeHalf(std::uint16_t code, float postscale) {
  return __fmul_rn(kBf16 ? bf16ToFp32(code) : fp16ToFp32(code), postscale);
}

template <bool kBf16, bool kVector>
__global__ void __launch_bounds__(kBlockThreads)
    decodeHalfKernel(const std::uint16_t* in, float* out, std::size_t count, float postscale) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if constexpr (kVector) {
    const std::size_t packs = count / 8;
    const auto* in8 = reinterpret_cast<const detail::Pack<std::uint16_t>*>(in);
    auto* out4 = reinterpret_cast<float4*>(out);
    for (std::size_t p = first; p < packs; p += stride) {
      const detail::Pack<std::uint16_t> codes = in8[p];
      out4[2 * p] =
          make_float4(decodeHalf<kBf16>(codes.v[0], postscale), decodeHalf<kBf16>(codes.v[1], postscale),
                      decodeHalf<kBf16>(codes.v[2], postscale), decodeHalf<kBf16>(codes.v[3], postscale));
      out4[2 * p + 1] =
          make_float4(decodeHalf<kBf16>(codes.v[4], postscale), decodeHalf<kBf16>(codes.v[5], postscale),
                      decodeHalf<kBf16>(codes.v[6], postscale), decodeHalf<kBf16>(codes.v[7], postscale));
    }
    done = packs * 8;
  }
  for (std::size_t i = done + first; i < count; i += stride) out[i] = decodeHalf<kBf16>(in[i], postscale);
}

// ---- fp8 -------------------------------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t finiteMagnitude(float x, float prescale) {
  const std::uint32_t magnitude = floatBits(__fmul_rn(x, prescale)) & kAbsMask;
  return magnitude < kInfBits ? magnitude : 0u;
}

template <bool kE5M2>
__device__ __forceinline__ std::uint8_t encodeFp8(float x, float prescale, float inverse, Counts& counts) {
  constexpr std::uint32_t kOverflowBits = kE5M2 ? kE5M2OverflowBits : kE4M3OverflowBits;
  const float scaled = __fmul_rn(__fmul_rn(x, prescale), inverse);
  const std::uint8_t code = kE5M2 ? fp32ToFp8E5M2(scaled) : fp32ToFp8E4M3(scaled);
  counts.overflow += (isFinite(x) && (floatBits(scaled) & kAbsMask) >= kOverflowBits) ? 1u : 0u;
  counts.nan += isNan(x) ? 1u : 0u;
  return code;
}

template <bool kE5M2>
__device__ __forceinline__ float decodeFp8(std::uint8_t code, float scale, float postscale) {
  const float decoded = kE5M2 ? fp8E5M2ToFp32(code) : fp8E4M3ToFp32(code);
  return __fmul_rn(__fmul_rn(decoded, scale), postscale);
}

__device__ __forceinline__ std::uint32_t quadMax(float4 v, float prescale) {
  return max(max(finiteMagnitude(v.x, prescale), finiteMagnitude(v.y, prescale)),
             max(finiteMagnitude(v.z, prescale), finiteMagnitude(v.w, prescale)));
}

// Four codes packed little-endian into one 32-bit store.
template <bool kE5M2>
__device__ __forceinline__ std::uint32_t encodeQuad(float4 v, float prescale, float inverse, Counts& counts) {
  return static_cast<std::uint32_t>(encodeFp8<kE5M2>(v.x, prescale, inverse, counts)) |
         static_cast<std::uint32_t>(encodeFp8<kE5M2>(v.y, prescale, inverse, counts)) << 8 |
         static_cast<std::uint32_t>(encodeFp8<kE5M2>(v.z, prescale, inverse, counts)) << 16 |
         static_cast<std::uint32_t>(encodeFp8<kE5M2>(v.w, prescale, inverse, counts)) << 24;
}

// Maximum over the G threads of a group (G = 1, 32 or the whole block), returned to every member.
template <int G>
__device__ __forceinline__ std::uint32_t groupMax(std::uint32_t value) {
  if constexpr (G == 1) {
    return value;
  } else if constexpr (G == 32) {
    return __reduce_max_sync(0xFFFFFFFFu, value);
  } else {
    static_assert(G == static_cast<int>(kBlockThreads));
    __shared__ std::uint32_t warps[kBlockThreads / 32];
    value = __reduce_max_sync(0xFFFFFFFFu, value);
    if ((threadIdx.x & 31u) == 0) warps[threadIdx.x >> 5] = value;
    __syncthreads();
    std::uint32_t result = 0;
#pragma unroll
    for (unsigned w = 0; w < kBlockThreads / 32; ++w) result = warps[w] > result ? warps[w] : result;
    __syncthreads();  // `warps` is reused by the next scaling block
    return result;
  }
}

// One scaling block per group of G threads. kVector: `in` 16-byte and `out` 4-byte aligned, block % 4 == 0.
template <bool kE5M2, int G, bool kVector>
__global__ void __launch_bounds__(kBlockThreads)
    encodeFp8Kernel(const float* in, std::size_t count, std::uint8_t* out, float* scales, std::size_t block,
                    float prescale, unsigned long long* stats) {
  constexpr float kMax = kE5M2 ? kFp8E5M2Max : kFp8E4M3Max;
  constexpr int kCached = G == 1 ? 4 : 1;
  const std::size_t blocks = (count + block - 1) / block;
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t groups = static_cast<std::size_t>(gridDim.x) * blockDim.x / G;
  const std::size_t lane = thread % G;
  Counts counts;
  // The first kCached float4 of each lane stay in registers between the two passes (the whole block
  // for the default 128 elements); the rest is read again, from L1. They are loaded one scaling block
  // ahead, so the next block's loads are in flight while this one's maximum is reduced and converted.
  float4 ahead[kCached];
  const auto loadAhead = [&](std::size_t b) {
    const std::size_t begin = b * block;
    const std::size_t quads = (count - begin < block ? count - begin : block) / 4;
#pragma unroll
    for (int c = 0; c < kCached; ++c) {
      const std::size_t i = lane + static_cast<std::size_t>(c) * G;
      if (i < quads) ahead[c] = reinterpret_cast<const float4*>(in + begin)[i];
    }
  };
  if constexpr (kVector) {
    if (thread / G < blocks) loadAhead(thread / G);
  }
  // Every thread of a group (for G = block size: of the thread block) runs the same iterations.
  for (std::size_t b = thread / G; b < blocks; b += groups) {
    const std::size_t begin = b * block;
    const std::size_t n = count - begin < block ? count - begin : block;
    const float* x = in + begin;
    std::uint8_t* q = out + begin;
    const std::size_t quads = kVector ? n / 4 : 0;

    float4 cached[kCached];
    std::uint32_t amax = 0;
    if constexpr (kVector) {
#pragma unroll
      for (int c = 0; c < kCached; ++c) cached[c] = ahead[c];
      if (b + groups < blocks) loadAhead(b + groups);
#pragma unroll
      for (int c = 0; c < kCached; ++c) {
        const std::size_t i = lane + static_cast<std::size_t>(c) * G;
        if (i < quads) amax = max(amax, quadMax(cached[c], prescale));
      }
      for (std::size_t i = lane + static_cast<std::size_t>(kCached) * G; i < quads; i += G)
        amax = max(amax, quadMax(reinterpret_cast<const float4*>(x)[i], prescale));
    }
    for (std::size_t i = quads * 4 + lane; i < n; i += G) amax = max(amax, finiteMagnitude(x[i], prescale));
    amax = groupMax<G>(amax);
    const float quotient = __fdiv_rn(bitsFloat(amax), kMax);
    const float scale = quotient >= FLT_MIN ? quotient : 1.0f;
    if (lane == 0) scales[b] = scale;
    const float inverse = __fdiv_rn(1.0f, scale);

    if constexpr (kVector) {
      auto* q4 = reinterpret_cast<std::uint32_t*>(q);
#pragma unroll
      for (int c = 0; c < kCached; ++c) {
        const std::size_t i = lane + static_cast<std::size_t>(c) * G;
        if (i < quads) q4[i] = encodeQuad<kE5M2>(cached[c], prescale, inverse, counts);
      }
      for (std::size_t i = lane + static_cast<std::size_t>(kCached) * G; i < quads; i += G)
        q4[i] = encodeQuad<kE5M2>(reinterpret_cast<const float4*>(x)[i], prescale, inverse, counts);
    }
    for (std::size_t i = quads * 4 + lane; i < n; i += G)
      q[i] = encodeFp8<kE5M2>(x[i], prescale, inverse, counts);
  }
  publish(counts, stats);
}

// kVector: `in` 4-byte and `out` 16-byte aligned, block % 4 == 0.
template <bool kE5M2, int G, bool kVector>
__global__ void __launch_bounds__(kBlockThreads)
    decodeFp8Kernel(const std::uint8_t* in, const float* scales, std::size_t count, std::size_t block,
                    float* out, float postscale) {
  const std::size_t blocks = (count + block - 1) / block;
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t groups = static_cast<std::size_t>(gridDim.x) * blockDim.x / G;
  const std::size_t lane = thread % G;
  for (std::size_t b = thread / G; b < blocks; b += groups) {
    const std::size_t begin = b * block;
    const std::size_t n = count - begin < block ? count - begin : block;
    const std::uint8_t* q = in + begin;
    float* y = out + begin;
    const float scale = scales[b];
    const std::size_t quads = kVector ? n / 4 : 0;
    if constexpr (kVector) {
      for (std::size_t i = lane; i < quads; i += G) {
        const std::uint32_t packed = reinterpret_cast<const std::uint32_t*>(q)[i];
        reinterpret_cast<float4*>(y)[i] =
            make_float4(decodeFp8<kE5M2>(static_cast<std::uint8_t>(packed), scale, postscale),
                        decodeFp8<kE5M2>(static_cast<std::uint8_t>(packed >> 8), scale, postscale),
                        decodeFp8<kE5M2>(static_cast<std::uint8_t>(packed >> 16), scale, postscale),
                        decodeFp8<kE5M2>(static_cast<std::uint8_t>(packed >> 24), scale, postscale));
      }
    }
    for (std::size_t i = quads * 4 + lane; i < n; i += G) y[i] = decodeFp8<kE5M2>(q[i], scale, postscale);
  }
}

void requireBlock(WireFormat format, std::size_t block) {
  if (isFp8(format) && block == 0) {
    throw Error(std::string(name(format)) + " wire format: the scaling block must be at least 1 element");
  }
}

template <bool kBf16>
void launchEncodeHalf(const float* in, std::size_t count, void* out, float prescale,
                      unsigned long long* stats, cudaStream_t stream) {
  auto* codes = static_cast<std::uint16_t*>(out);
  const bool vector = detail::aligned(in, 16) && detail::aligned(out, 16);
  const unsigned grid = detail::gridFor(vector ? count / 8 + count % 8 : count);
  if (vector) {
    encodeHalfKernel<kBf16, true><<<grid, kBlockThreads, 0, stream>>>(in, codes, count, prescale, stats);
  } else {
    encodeHalfKernel<kBf16, false><<<grid, kBlockThreads, 0, stream>>>(in, codes, count, prescale, stats);
  }
  detail::checkLaunch("encodeHalfKernel");
}

template <bool kBf16>
void launchDecodeHalf(const void* in, std::size_t count, float* out, float postscale, cudaStream_t stream) {
  const auto* codes = static_cast<const std::uint16_t*>(in);
  const bool vector = detail::aligned(in, 16) && detail::aligned(out, 16);
  const unsigned grid = detail::gridFor(vector ? count / 8 + count % 8 : count);
  if (vector) {
    decodeHalfKernel<kBf16, true><<<grid, kBlockThreads, 0, stream>>>(codes, out, count, postscale);
  } else {
    decodeHalfKernel<kBf16, false><<<grid, kBlockThreads, 0, stream>>>(codes, out, count, postscale);
  }
  detail::checkLaunch("decodeHalfKernel");
}

template <bool kE5M2, int G>
void launchEncodeFp8Group(const float* in, std::size_t count, void* out, float* scales, std::size_t block,
                          float prescale, unsigned long long* stats, cudaStream_t stream) {
  const std::size_t blocks = (count + block - 1) / block;
  const unsigned grid = detail::gridFor(blocks * G);
  auto* codes = static_cast<std::uint8_t*>(out);
  const bool vector = block % 4 == 0 && detail::aligned(in, 16) && detail::aligned(out, 4);
  if (vector) {
    encodeFp8Kernel<kE5M2, G, true>
        <<<grid, kBlockThreads, 0, stream>>>(in, count, codes, scales, block, prescale, stats);
  } else {
    encodeFp8Kernel<kE5M2, G, false>
        <<<grid, kBlockThreads, 0, stream>>>(in, count, codes, scales, block, prescale, stats);
  }
  detail::checkLaunch("encodeFp8Kernel");
}

template <bool kE5M2>
void launchEncodeFp8(const float* in, std::size_t count, void* out, float* scales, std::size_t block,
                     float prescale, unsigned long long* stats, cudaStream_t stream) {
  if (block < 32) {
    launchEncodeFp8Group<kE5M2, 1>(in, count, out, scales, block, prescale, stats, stream);
  } else if (block <= kWarpBlockLimit) {
    launchEncodeFp8Group<kE5M2, 32>(in, count, out, scales, block, prescale, stats, stream);
  } else {
    launchEncodeFp8Group<kE5M2, static_cast<int>(kBlockThreads)>(in, count, out, scales, block, prescale,
                                                                 stats, stream);
  }
}

template <bool kE5M2, int G>
void launchDecodeFp8Group(const void* in, const float* scales, std::size_t count, std::size_t block,
                          float* out, float postscale, cudaStream_t stream) {
  const std::size_t blocks = (count + block - 1) / block;
  const unsigned grid = detail::gridFor(blocks * G);
  const auto* codes = static_cast<const std::uint8_t*>(in);
  const bool vector = block % 4 == 0 && detail::aligned(in, 4) && detail::aligned(out, 16);
  if (vector) {
    decodeFp8Kernel<kE5M2, G, true>
        <<<grid, kBlockThreads, 0, stream>>>(codes, scales, count, block, out, postscale);
  } else {
    decodeFp8Kernel<kE5M2, G, false>
        <<<grid, kBlockThreads, 0, stream>>>(codes, scales, count, block, out, postscale);
  }
  detail::checkLaunch("decodeFp8Kernel");
}

template <bool kE5M2>
void launchDecodeFp8(const void* in, const float* scales, std::size_t count, std::size_t block, float* out,
                     float postscale, cudaStream_t stream) {
  if (block < 32) {
    launchDecodeFp8Group<kE5M2, 1>(in, scales, count, block, out, postscale, stream);
  } else if (block <= kWarpBlockLimit) {
    launchDecodeFp8Group<kE5M2, 32>(in, scales, count, block, out, postscale, stream);
  } else {
    launchDecodeFp8Group<kE5M2, static_cast<int>(kBlockThreads)>(in, scales, count, block, out, postscale,
                                                                 stream);
  }
}

// ---- Scaling and amax -------------------------------------------------------------------------------

__global__ void __launch_bounds__(detail::kBlockThreads)
    scaleKernel(const float* in, std::size_t count, float factor, float* out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    out[i] = __fmul_rn(in[i], factor);
}

// Non-negative floats order like their bit patterns, so the maximum is an unsigned atomicMax.
__global__ void __launch_bounds__(detail::kBlockThreads)
    finiteAmaxKernel(const float* in, std::size_t count, unsigned* amax_bits) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  float local = 0.0f;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const float magnitude = fabsf(in[i]);
    local = magnitude <= FLT_MAX ? fmaxf(local, magnitude) : local;  // NaN and Inf fail the test
  }
  for (int offset = 16; offset > 0; offset /= 2)
    local = fmaxf(local, __shfl_down_sync(0xFFFFFFFFu, local, offset));
  if ((threadIdx.x & 31u) == 0) atomicMax(amax_bits, __float_as_uint(local));
}

}  // namespace

void encode(WireFormat format, const float* in, std::size_t count, void* out, float* scales,
            const EncodeOptions& options, std::uint64_t* stats, Stream stream) {
  detail::requireDevice();
  requireBlock(format, options.block);
  if (count == 0) return;
  static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
  auto* counters = reinterpret_cast<unsigned long long*>(stats);
  const cudaStream_t s = detail::toCuda(stream);
  switch (format) {
    case WireFormat::Fp16: launchEncodeHalf<false>(in, count, out, options.prescale, counters, s); return;
    case WireFormat::Bf16: launchEncodeHalf<true>(in, count, out, options.prescale, counters, s); return;
    case WireFormat::Fp8E4M3:
      launchEncodeFp8<false>(in, count, out, scales, options.block, options.prescale, counters, s);
      return;
    case WireFormat::Fp8E5M2:
      launchEncodeFp8<true>(in, count, out, scales, options.block, options.prescale, counters, s);
      return;
  }
  throw Error("cuda::encode: unknown wire format " + std::to_string(static_cast<int>(format)));
}

void decode(WireFormat format, const void* in, const float* scales, std::size_t count, float* out,
            float postscale, std::size_t block, Stream stream) {
  detail::requireDevice();
  requireBlock(format, block);
  if (count == 0) return;
  const cudaStream_t s = detail::toCuda(stream);
  switch (format) {
    case WireFormat::Fp16: launchDecodeHalf<false>(in, count, out, postscale, s); return;
    case WireFormat::Bf16: launchDecodeHalf<true>(in, count, out, postscale, s); return;
    case WireFormat::Fp8E4M3: launchDecodeFp8<false>(in, scales, count, block, out, postscale, s); return;
    case WireFormat::Fp8E5M2: launchDecodeFp8<true>(in, scales, count, block, out, postscale, s); return;
  }
  throw Error("cuda::decode: unknown wire format " + std::to_string(static_cast<int>(format)));
}

void scale(const float* in, std::size_t count, float factor, float* out, Stream stream) {
  detail::requireDevice();
  if (count == 0) return;
  scaleKernel<<<detail::gridFor(count), detail::kBlockThreads, 0, detail::toCuda(stream)>>>(in, count, factor,
                                                                                            out);
  detail::checkLaunch("scaleKernel");
}

float finiteAmax(const float* in, std::size_t count, Stream stream) {
  detail::requireDevice();
  if (count == 0) return 0.0f;
  const cudaStream_t s = detail::toCuda(stream);
  const detail::Scratch bits(sizeof(unsigned), s);
  detail::check(cudaMemsetAsync(bits.as<unsigned>(), 0, sizeof(unsigned), s), "cudaMemsetAsync");
  finiteAmaxKernel<<<detail::gridFor(count), detail::kBlockThreads, 0, s>>>(in, count, bits.as<unsigned>());
  detail::checkLaunch("finiteAmaxKernel");
  float amax = 0.0f;
  detail::check(cudaMemcpyAsync(&amax, bits.as<unsigned>(), sizeof(float), cudaMemcpyDeviceToHost, s),
                "cudaMemcpyAsync");
  detail::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return amax;
}

}  // namespace gradscope::methods::cuda
