#include "gradscope/methods/wire.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>
#include <string_view>

#include "cpu_kernels.h"
#include "dispatch.h"
#include "gradscope/common/error.h"
#include "gradscope/methods/numeric.h"

// Exact definitions the CUDA kernels (cuda/wire.cu) must reproduce bit for bit:
//
// Encode, for every element x (all arithmetic in fp32, round to nearest even):
//   v = x * prescale
//   fp16/bf16: code = fp32ToFp16(v) / fp32ToBf16(v)
//   fp8: per block of `block` elements (the last one may be shorter),
//     amax  = max |v| over the block's elements whose v is finite (NaN and ±Inf are ignored)
//     scale = amax / fp8_max, replaced by 1 when it is not at least FLT_MIN: an all-zero block (the
//             header's case) and also a block whose amax is so tiny (< fp8_max · 2^-126) that the scale
//             would be subnormal or zero: dividing by it would lose the scale's precision or give Inf.
//             amax itself is always finite, since non-finite v are skipped.
//     inverse = 1 / scale, one fp32 division per block
//     code  = fp32ToFp8E4M3(v * inverse) / fp32ToFp8E5M2(v * inverse): a multiplication by the
//             rounded reciprocal, as Transformer Engine quantises (x times a per-tensor scale). It
//             differs from a true division v / scale by at most an fp32 ulp of the quotient, which
//             is far inside the fp8 rounding error, and costs a multiplication where a vector
//             division is the slowest instruction of the encoder (7 cycles per 16 lanes here).
// Decode: out = (decoded * scale) * postscale, two fp32 multiplications in that order (scale = 1 for
//   fp16/bf16, so that case is decoded * postscale).
//
// Counters (EncodeStats), per input element x:
//   nan      = x is NaN.
//   overflow = x is finite, and the value handed to the conversion (v, or v * inverse for fp8) lies beyond
//              what round-to-nearest-even could bring back to the largest finite value: |v| >= 65520
//              (fp16), the bf16 equivalent, |v * inverse| > 464 (e4m3: halfway between 448 and the next
//              step 480, ties go to 448 which is even) or >= 61440 (e5m2: halfway between 57344 and
//              65536, ties go to 65536). This is exactly "became Inf" for fp16/bf16 and "was clamped to
//              fp8_max by more than rounding would move it" for fp8. Values between fp8_max and that
//              limit (448 < |q| <= 464) are rounded, not counted: with amax scaling the largest element
//              of every block lands within an ulp of fp8_max on either side, because amax / fp8_max is
//              rounded, and counting those would report a spurious overflow in a large share of blocks.
//              With amax scaling a finite x can only overflow fp8 when its v is not finite (a prescale
//              that pushes it past FLT_MAX); it then encodes like ±Inf.
//   ±Inf inputs are neither (not finite, not NaN); they stay ±Inf (fp16, bf16, e5m2) or become NaN
//   (e4m3 has no Inf), and they do not take part in the block's amax.

namespace gradscope::methods {

namespace {

constexpr std::uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr std::uint32_t kInfBits = 0x7F800000u;

// How the kernels are written so that GCC vectorises them at -O2 (its "very cheap" cost model, which
// only takes loops whose trip count is a known multiple of the vector length) as well as at -O3:
// - Elements go in runs of kRun with a constant trip count (the loop over j), then a shorter run of
//   kShortRun, then one at a time. 64 elements fill a 64-byte vector of fp8 codes (and four of fp32):
//   GCC gives all types of a loop the same vector size, so a shorter run would mean narrower vectors.
// - Sums and maxima are kept per lane (an array indexed by j, which lives in vector registers) and
//   folded once per scaling block or stretch; a scalar accumulator in the loop is a reduction, which
//   GCC 12 either refuses here or folds on every run.
//
// numeric.h's subnormal arms compute a float (an addition or multiplication) that only one side of a
// select uses; GCC sinks it into a branch and, under its default -ftrapping-math, will not speculate it
// back, so without -fno-trapping-math only the AVX-512 clones of the encoders vectorise (through masked
// operations) and no decoder does. -fno-trapping-math changes no result here: it only lets the compiler
// evaluate both sides of a select, and nothing reads the floating-point exception flags.
constexpr std::size_t kRun = 64;
constexpr std::size_t kShortRun = 16;

struct Counts {
  std::uint64_t overflow = 0;
  std::uint64_t nan = 0;
};

template <std::size_t kLanes>
[[gnu::always_inline]] inline std::uint64_t sumLanes(const std::uint32_t (&lanes)[kLanes]) {
  std::uint64_t sum = 0;
  for (std::uint32_t lane : lanes) sum += lane;
  return sum;
}

template <std::size_t kLanes>
[[gnu::always_inline]] inline std::uint32_t maxLanes(const std::uint32_t (&lanes)[kLanes]) {
  std::uint32_t max = 0;
  for (std::uint32_t lane : lanes) max = std::max(max, lane);
  return max;
}

// ---- fp16 / bf16 ----------------------------------------------------------------------------------

// The counters: a NaN input gives a NaN v, and an overflow is a v at least the overflow threshold
// (65520 for fp16, the halfway point to 2^128 for bf16) that is not NaN, so a stretch of input whose
// largest |v| stays below the threshold has nothing to count. The conversion loop therefore only
// keeps that maximum (one vector max per 16 elements), and a stretch where it reaches the threshold,
// which is rare, is counted again exactly by a separate pass while it is still in L1.
template <bool kBf16>
constexpr std::uint32_t kHalfOverflowBits = kBf16 ? 0x7F7F8000u : 0x477FF000u;

// 32 fp16 codes fill one 64-byte vector, so a run is exactly one vector iteration and the per-lane
// maxima stay in registers (with longer runs GCC keeps them in memory).
constexpr std::size_t kHalfRun = 32;
// Elements per stretch checked for something to count: 8 KiB of input, still in L1 for a recount.
constexpr std::size_t kHalfStretch = 2048;

template <bool kBf16>
[[gnu::always_inline]] inline void encodeHalf(float x, float prescale, std::uint16_t& out,
                                              std::uint32_t& v_max) {
  const float v = x * prescale;
  out = kBf16 ? fp32ToBf16(v) : fp32ToFp16(v);
  v_max = std::max(v_max, floatBits(v) & kAbsMask);
}

template <bool kBf16>
[[gnu::always_inline]] inline void countHalf(float x, float prescale, std::uint32_t& overflow,
                                             std::uint32_t& nan) {
  const std::uint32_t magnitude = floatBits(x) & kAbsMask;
  const std::uint32_t v_magnitude = floatBits(x * prescale) & kAbsMask;
  overflow += static_cast<std::uint32_t>(magnitude < kInfBits) &
              static_cast<std::uint32_t>(v_magnitude - kHalfOverflowBits<kBf16> <=
                                         kInfBits - kHalfOverflowBits<kBf16>);
  nan += static_cast<std::uint32_t>(magnitude > kInfBits);
}

// The exact count over a stretch (at most kHalfStretch elements, so 32-bit lanes cannot wrap).
template <bool kBf16>
[[gnu::noinline]] void countHalfStretch(const float* GS_RESTRICT in, std::size_t count, float prescale,
                                        Counts& counts) {
  std::uint32_t overflow[kShortRun] = {};
  std::uint32_t nan[kShortRun] = {};
  std::size_t i = 0;
  for (; i + kShortRun <= count; i += kShortRun) {
    const float* GS_RESTRICT x = in + i;
    for (std::size_t j = 0; j < kShortRun; ++j) countHalf<kBf16>(x[j], prescale, overflow[j], nan[j]);
  }
  for (; i < count; ++i) countHalf<kBf16>(in[i], prescale, overflow[0], nan[0]);
  counts.overflow += sumLanes(overflow);
  counts.nan += sumLanes(nan);
}

template <bool kBf16>
[[gnu::always_inline]] inline void encodeHalfRange(const float* GS_RESTRICT in,
                                                   std::uint16_t* GS_RESTRICT out, std::size_t count,
                                                   float prescale, Counts& counts) {
  for (std::size_t stretch = 0; stretch < count; stretch += kHalfStretch) {
    const std::size_t end = count - stretch < kHalfStretch ? count : stretch + kHalfStretch;
    std::uint32_t v_max[kHalfRun] = {};
    std::size_t i = stretch;
    for (; i + kHalfRun <= end; i += kHalfRun) {
      const float* GS_RESTRICT x = in + i;
      std::uint16_t* GS_RESTRICT y = out + i;
      detail::prefetchAhead(x);
      detail::prefetchAhead(x + 16);
      for (std::size_t j = 0; j < kHalfRun; ++j) encodeHalf<kBf16>(x[j], prescale, y[j], v_max[j]);
    }
    for (; i < end; ++i) encodeHalf<kBf16>(in[i], prescale, out[i], v_max[0]);
    if (maxLanes(v_max) >= kHalfOverflowBits<kBf16>) [[unlikely]] {
      countHalfStretch<kBf16>(in + stretch, end - stretch, prescale, counts);
    }
  }
}

GS_CPU_KERNEL void encodeFp16Kernel(const float* GS_RESTRICT in, std::uint16_t* GS_RESTRICT out,
                                    std::size_t count, float prescale, Counts* counts) {
  encodeHalfRange<false>(in, out, count, prescale, *counts);
}

GS_CPU_KERNEL void encodeBf16Kernel(const float* GS_RESTRICT in, std::uint16_t* GS_RESTRICT out,
                                    std::size_t count, float prescale, Counts* counts) {
  encodeHalfRange<true>(in, out, count, prescale, *counts);
}

// fp16 encode with the conversion instruction (vcvtps2ph, round to nearest even): bit-identical to
// fp32ToFp16 for every input (checked exhaustively when written; NaN is quietened with the top payload
// bits kept, as numeric.h does) and about twice as fast, since the software rounding is what limits
// encodeFp16Kernel. Same stretch structure: track the largest |v|, recount a stretch exactly only when
// it reaches the overflow threshold.
#if defined(GS_HAVE_X86_INTRINSICS)
__attribute__((target("avx512f"))) void encodeFp16Avx512(const float* GS_RESTRICT in,
                                                         std::uint16_t* GS_RESTRICT out, std::size_t count,
                                                         float prescale, Counts* counts) {
  const __m512 scale = _mm512_set1_ps(prescale);
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  for (std::size_t stretch = 0; stretch < count; stretch += kHalfStretch) {
    const std::size_t end = count - stretch < kHalfStretch ? count : stretch + kHalfStretch;
    __m512i v_max = _mm512_setzero_si512();
    std::uint32_t tail_max = 0;
    std::size_t i = stretch;
    for (; i + 16 <= end; i += 16) {
      detail::prefetchAhead(in + i);
      const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(in + i), scale);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm512_maskz_cvtps_ph(0xFFFF, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      v_max = _mm512_maskz_max_epu32(0xFFFF, v_max, _mm512_and_si512(_mm512_castps_si512(v), abs_mask));
    }
    for (; i < end; ++i) encodeHalf<false>(in[i], prescale, out[i], tail_max);
    // (The maskz forms and the store avoid GCC 12's false -Wmaybe-uninitialized in the unmasked
    // AVX-512 intrinsics.)
    alignas(64) std::uint32_t lanes[16];
    _mm512_store_si512(lanes, v_max);
    for (std::uint32_t lane : lanes) tail_max = std::max(tail_max, lane);
    if (tail_max >= kHalfOverflowBits<false>) [[unlikely]] {
      countHalfStretch<false>(in + stretch, end - stretch, prescale, *counts);
    }
  }
}

__attribute__((target("avx2,f16c"))) void encodeFp16F16c(const float* GS_RESTRICT in,
                                                         std::uint16_t* GS_RESTRICT out, std::size_t count,
                                                         float prescale, Counts* counts) {
  const __m256 scale = _mm256_set1_ps(prescale);
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  for (std::size_t stretch = 0; stretch < count; stretch += kHalfStretch) {
    const std::size_t end = count - stretch < kHalfStretch ? count : stretch + kHalfStretch;
    __m256i v_max = _mm256_setzero_si256();
    std::uint32_t tail_max = 0;
    std::size_t i = stretch;
    for (; i + 8 <= end; i += 8) {
      detail::prefetchAhead(in + i);
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(in + i), scale);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      v_max = _mm256_max_epu32(v_max, _mm256_and_si256(_mm256_castps_si256(v), abs_mask));
    }
    for (; i < end; ++i) encodeHalf<false>(in[i], prescale, out[i], tail_max);
    alignas(32) std::uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v_max);
    for (std::uint32_t lane : lanes) tail_max = std::max(tail_max, lane);
    if (tail_max >= kHalfOverflowBits<false>) [[unlikely]] {
      countHalfStretch<false>(in + stretch, end - stretch, prescale, *counts);
    }
  }
}
#endif

template <bool kBf16>
[[gnu::always_inline]] inline float decodeHalf(std::uint16_t code, float postscale) {
  return (kBf16 ? bf16ToFp32(code) : fp16ToFp32(code)) * postscale;
}

template <bool kBf16>
[[gnu::always_inline]] inline void decodeHalfRange(const std::uint16_t* GS_RESTRICT in,
                                                   float* GS_RESTRICT out, std::size_t count,
                                                   float postscale) {
  std::size_t i = 0;
  for (; i + kRun <= count; i += kRun) {
    const std::uint16_t* GS_RESTRICT x = in + i;
    float* GS_RESTRICT y = out + i;
    detail::prefetchAhead(x);
    detail::prefetchAhead(x + 32);
    for (std::size_t line = 0; line < kRun; line += 16) detail::prefetchForWrite(y + line);
    for (std::size_t j = 0; j < kRun; ++j) y[j] = decodeHalf<kBf16>(x[j], postscale);
  }
  for (; i < count; ++i) out[i] = decodeHalf<kBf16>(in[i], postscale);
}

GS_CPU_KERNEL void decodeFp16Kernel(const std::uint16_t* GS_RESTRICT in, float* GS_RESTRICT out,
                                    std::size_t count, float postscale) {
  decodeHalfRange<false>(in, out, count, postscale);
}

GS_CPU_KERNEL void decodeBf16Kernel(const std::uint16_t* GS_RESTRICT in, float* GS_RESTRICT out,
                                    std::size_t count, float postscale) {
  decodeHalfRange<true>(in, out, count, postscale);
}

// ---- fp8 ------------------------------------------------------------------------------------------

// Encoding one block takes two passes, the second from L1:
// 1. The scan: the largest finite |v| (as magnitude bits: non-negative floats order like their bits,
//    and an integer maximum vectorises where a float one would need -ffast-math) and the largest |v|
//    of all, which shows whether the block holds a NaN or an infinity at all.
// 2. The conversion, with no counting in it. The counters follow from the scan: a finite input can
//    only overflow when its v is not finite, because every finite v of the block has |v| <= amax, so
//    |v * inverse| <= amax · fl(1 / fl(amax / max)) <= max · (1 + 2^-22), far below the limits 464 and 61440
//    (and a block with scale 1 has |v| < max · 2^-126). So only a block whose largest |v| is not
//    finite, which is rare, is walked again to count NaN inputs and finite inputs whose v is not
//    finite: exactly what the threshold rule above counts.
struct BlockScan {
  std::uint32_t finite_max = 0;
  std::uint32_t any_max = 0;
};

[[gnu::always_inline]] inline void scanElement(float x, float prescale, std::uint32_t& finite_max,
                                               std::uint32_t& any_max) {
  const std::uint32_t magnitude = floatBits(x * prescale) & kAbsMask;
  const std::uint32_t finite = magnitude < kInfBits ? magnitude : 0u;
  // std::max, not a ternary: GCC 12 merges a ternary maximum with the select above and then does not
  // recognise the maximum, and the loop stays scalar.
  finite_max = std::max(finite_max, finite);
  any_max = std::max(any_max, magnitude);
}

[[gnu::always_inline]] inline BlockScan scanBlock(const float* GS_RESTRICT in, std::size_t count,
                                                  float prescale) {
  // fp32 only, so 16 lanes already fill a 64-byte vector.
  std::uint32_t finite_max[kShortRun] = {};
  std::uint32_t any_max[kShortRun] = {};
  std::size_t i = 0;
  for (; i + kShortRun <= count; i += kShortRun) {
    detail::prefetchAhead(in + i);
    const float* GS_RESTRICT x = in + i;
    for (std::size_t j = 0; j < kShortRun; ++j) scanElement(x[j], prescale, finite_max[j], any_max[j]);
  }
  for (; i < count; ++i) scanElement(in[i], prescale, finite_max[0], any_max[0]);
  return {maxLanes(finite_max), maxLanes(any_max)};
}

// The rare path: a block with a NaN or an infinity in v.
[[gnu::noinline]] void countNonFinite(const float* in, std::size_t count, float prescale, Counts& counts) {
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t magnitude = floatBits(in[i]) & kAbsMask;
    const std::uint32_t v_magnitude = floatBits(in[i] * prescale) & kAbsMask;
    counts.nan += magnitude > kInfBits ? 1u : 0u;
    counts.overflow += magnitude < kInfBits && v_magnitude >= kInfBits ? 1u : 0u;
  }
}

template <bool kE5M2>
[[gnu::always_inline]] inline std::uint8_t encodeFp8(float x, float prescale, float inverse) {
  const float scaled = (x * prescale) * inverse;
  return kE5M2 ? fp32ToFp8E5M2(scaled) : fp32ToFp8E4M3(scaled);
}

template <bool kE5M2, std::size_t kLength>
[[gnu::always_inline]] inline void encodeFp8Run(const float* GS_RESTRICT x, std::uint8_t* GS_RESTRICT q,
                                                float prescale, float inverse) {
  // The codes go through 32-bit lanes: stored straight into bytes, GCC 12 narrows part of the e4m3
  // rounding to 8 bits and then cannot vectorise the loop.
  std::uint32_t codes[kLength];
  for (std::size_t j = 0; j < kLength; ++j) codes[j] = encodeFp8<kE5M2>(x[j], prescale, inverse);
  for (std::size_t j = 0; j < kLength; ++j) q[j] = static_cast<std::uint8_t>(codes[j]);
}

template <bool kE5M2>
[[gnu::always_inline]] inline void encodeFp8Blocks(const float* GS_RESTRICT in, std::uint8_t* GS_RESTRICT out,
                                                   float* GS_RESTRICT scales, std::size_t count,
                                                   std::size_t block, float prescale, Counts& counts) {
  constexpr float kMax = kE5M2 ? kFp8E5M2Max : kFp8E4M3Max;
  for (std::size_t begin = 0; begin < count; begin += block) {
    const std::size_t n = count - begin < block ? count - begin : block;
    const float* GS_RESTRICT x = in + begin;
    std::uint8_t* GS_RESTRICT q = out + begin;
    const BlockScan scan = scanBlock(x, n, prescale);
    if (scan.any_max >= kInfBits) [[unlikely]] {
      countNonFinite(x, n, prescale, counts);
    }
    float scale = bitsFloat(scan.finite_max) / kMax;
    scale = scale >= FLT_MIN ? scale : 1.0f;
    *scales++ = scale;
    const float inverse = 1.0f / scale;
    std::size_t i = 0;
    for (; i + kRun <= n; i += kRun) encodeFp8Run<kE5M2, kRun>(x + i, q + i, prescale, inverse);
    for (; i + kShortRun <= n; i += kShortRun)
      encodeFp8Run<kE5M2, kShortRun>(x + i, q + i, prescale, inverse);
    for (; i < n; ++i) q[i] = encodeFp8<kE5M2>(x[i], prescale, inverse);
  }
}

GS_CPU_KERNEL void encodeE4M3Kernel(const float* GS_RESTRICT in, std::uint8_t* GS_RESTRICT out,
                                    float* GS_RESTRICT scales, std::size_t count, std::size_t block,
                                    float prescale, Counts* counts) {
  encodeFp8Blocks<false>(in, out, scales, count, block, prescale, *counts);
}

GS_CPU_KERNEL void encodeE5M2Kernel(const float* GS_RESTRICT in, std::uint8_t* GS_RESTRICT out,
                                    float* GS_RESTRICT scales, std::size_t count, std::size_t block,
                                    float prescale, Counts* counts) {
  encodeFp8Blocks<true>(in, out, scales, count, block, prescale, *counts);
}

// fp8 encode written with AVX-512 intrinsics: the same two passes per block and bit-identical codes,
// scales and counts (checked against the portable kernel on a stride of all fp32 patterns, values
// at every halfway point and random gradients, for several block sizes and prescales). GCC's
// vectorisation of encodeFp8Blocks spends ~150 instructions per 64 elements (it widens the selects
// and cannot pack four code vectors into one store); here the rounding is 17 vector operations per 16
// elements, the scan one vpmaxud over all magnitudes (a block whose maximum is not finite, which is
// rare, is rescanned by the portable code), and four vectors of codes go out in one 64-byte store.
#if defined(GS_HAVE_X86_INTRINSICS)
// GCC 12 reports the unmasked AVX-512 intrinsics' internal _mm512_undefined_*() as maybe-uninitialized
// once they are inlined; every value here is initialised.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <bool kE5M2>
struct Fp8Layout {
  static constexpr int kMantissaBits = kE5M2 ? 2 : 3;
  static constexpr int kBias = kE5M2 ? 15 : 7;
  static constexpr int kDropped = 23 - kMantissaBits;
  static constexpr float kMax = kE5M2 ? kFp8E5M2Max : kFp8E4M3Max;
  // The constants of numeric.h's fp8RoundMagnitude and of the two conversions above it.
  static constexpr std::uint32_t kClamp = kE5M2 ? 0x47600000u : 0x43E00000u;
  static constexpr std::uint32_t kMinNormal = static_cast<std::uint32_t>(128 - kBias) << 23;
  static constexpr std::uint32_t kMagic = static_cast<std::uint32_t>(127 + 1 - kBias - kMantissaBits + 23)
                                          << 23;
  static constexpr std::uint32_t kNormalOffset =
      ((1u << (kDropped - 1)) - 1u) - (static_cast<std::uint32_t>(127 - kBias) << 23);
};

__attribute__((target("avx512f"), always_inline)) inline __m512i broadcast(std::uint32_t value) {
  return _mm512_set1_epi32(static_cast<int>(value));
}

// fp32ToFp8E4M3 / fp32ToFp8E5M2 on 16 lanes, codes in the low byte of each 32-bit lane.
template <bool kE5M2>
__attribute__((target("avx512f"), always_inline)) inline __m512i fp8CodesAvx512(__m512 value) {
  using L = Fp8Layout<kE5M2>;
  const __m512i bits = _mm512_castps_si512(value);
  const __m512i magnitude = _mm512_and_si512(bits, broadcast(kAbsMask));
  const __m512i clamped = _mm512_min_epu32(magnitude, broadcast(L::kClamp));
  // Normal: (clamped + offset + odd) >> dropped, the odd bit tested into a mask.
  const __m512i rounded = _mm512_add_epi32(clamped, broadcast(L::kNormalOffset));
  const __m512i normal = _mm512_srli_epi32(
      _mm512_mask_add_epi32(rounded, _mm512_test_epi32_mask(clamped, broadcast(1u << L::kDropped)), rounded,
                            broadcast(1)),
      L::kDropped);
  // Subnormal: the float addition of the magic number rounds at the subnormal quantum.
  const __m512i magic = broadcast(L::kMagic);
  const __m512i aligned =
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(clamped), _mm512_castsi512_ps(magic)));
  __m512i code = _mm512_mask_sub_epi32(normal, _mm512_cmplt_epu32_mask(clamped, broadcast(L::kMinNormal)),
                                       aligned, magic);
  const __m512i inf = broadcast(kInfBits);
  if constexpr (kE5M2) {
    code = _mm512_mask_mov_epi32(code, _mm512_cmpeq_epi32_mask(magnitude, inf), broadcast(0x7C));
    code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(magnitude, inf), broadcast(0x7E));
  } else {
    code = _mm512_mask_mov_epi32(code, _mm512_cmpge_epu32_mask(magnitude, inf), broadcast(0x7F));
  }
  // code | ((bits >> 24) & 0x80): ternary-logic truth table (A & B) | C.
  return _mm512_ternarylogic_epi32(_mm512_srli_epi32(bits, 24), broadcast(0x80), code, 0xEA);
}

// v = x · prescale; with a prescale of 1 that is x itself (NaN payloads aside, which no code or count
// depends on), so the kernels are instantiated without the multiplication too.
template <bool kPrescale>
__attribute__((target("avx512f"), always_inline)) inline __m512 prescaled(__m512 x, __m512 prescale) {
  if constexpr (kPrescale) {
    return _mm512_mul_ps(x, prescale);
  } else {
    return x;
  }
}

// The rare block whose largest |v| is not finite: its finite maximum and its counts, by the portable code.
[[gnu::noinline]] std::uint32_t finiteMaxAndCount(const float* x, std::size_t n, float prescale,
                                                  Counts& counts) {
  std::uint32_t finite_max = 0;
  std::uint32_t any_max = 0;
  for (std::size_t i = 0; i < n; ++i) scanElement(x[i], prescale, finite_max, any_max);
  countNonFinite(x, n, prescale, counts);
  return finite_max;
}

// One block's scale (and its counts), as encodeFp8Blocks computes it. Only the largest |v| of all is
// tracked here (one vpmaxud per 16 elements); it is the finite maximum unless it is not finite.
template <bool kE5M2, bool kPrescale>
__attribute__((target("avx512f"))) float scanFp8BlockAvx512(const float* GS_RESTRICT x, std::size_t n,
                                                            float prescale, Counts& counts) {
  const __m512 prescale_v = _mm512_set1_ps(prescale);
  const __m512i abs_mask = broadcast(kAbsMask);
  const std::size_t whole = n - n % 16;
  const auto tail_mask = static_cast<__mmask16>((1u << (n % 16)) - 1u);
  __m512i any_max = _mm512_setzero_si512();
  for (std::size_t i = 0; i < whole; i += 16) {
    const __m512 v = prescaled<kPrescale>(_mm512_loadu_ps(x + i), prescale_v);
    any_max = _mm512_max_epu32(any_max, _mm512_and_si512(_mm512_castps_si512(v), abs_mask));
  }
  if (tail_mask != 0) {  // lanes past the block load as 0 and change no maximum
    const __m512 v = prescaled<kPrescale>(_mm512_maskz_loadu_ps(tail_mask, x + whole), prescale_v);
    any_max = _mm512_max_epu32(any_max, _mm512_and_si512(_mm512_castps_si512(v), abs_mask));
  }
  std::uint32_t amax = _mm512_reduce_max_epu32(any_max);
  if (amax >= kInfBits) [[unlikely]] {
    amax = finiteMaxAndCount(x, n, prescale, counts);
  }
  const float scale = bitsFloat(amax) / Fp8Layout<kE5M2>::kMax;
  return scale >= FLT_MIN ? scale : 1.0f;
}

template <bool kE5M2, bool kPrescale>
__attribute__((target("avx512f"), always_inline)) inline __m512i encodeFp8Vector(__m512 x, __m512 prescale,
                                                                                 __m512 inverse) {
  return fp8CodesAvx512<kE5M2>(_mm512_mul_ps(prescaled<kPrescale>(x, prescale), inverse));
}

// One block's codes given its scale: 64 elements per 64-byte store, then 16 at a time, then the tail.
// `ahead` (or null) is prefetched as far into the next stretch as this block is into its own.
template <bool kE5M2, bool kPrescale>
__attribute__((target("avx512f,avx512bw"))) void convertFp8BlockAvx512(const float* GS_RESTRICT x,
                                                                       std::uint8_t* GS_RESTRICT q,
                                                                       std::size_t n, float prescale,
                                                                       float inverse, const float* ahead) {
  const __m512 prescale_v = _mm512_set1_ps(prescale);
  const __m512 inverse_v = _mm512_set1_ps(inverse);
  const std::size_t whole = n - n % 16;
  const auto tail_mask = static_cast<__mmask16>((1u << (n % 16)) - 1u);
  // Codes are at most 0xFF, so the unsigned-saturating packs keep them; they interleave 4-element
  // groups per 128-bit lane, which this permutation puts back in element order.
  const __m512i unpack_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    if (ahead != nullptr) {
      for (std::size_t line = 0; line < 64; line += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + i + line), _MM_HINT_T0);
      }
    }
    const __m512i c0 = encodeFp8Vector<kE5M2, kPrescale>(_mm512_loadu_ps(x + i), prescale_v, inverse_v);
    const __m512i c1 = encodeFp8Vector<kE5M2, kPrescale>(_mm512_loadu_ps(x + i + 16), prescale_v, inverse_v);
    const __m512i c2 = encodeFp8Vector<kE5M2, kPrescale>(_mm512_loadu_ps(x + i + 32), prescale_v, inverse_v);
    const __m512i c3 = encodeFp8Vector<kE5M2, kPrescale>(_mm512_loadu_ps(x + i + 48), prescale_v, inverse_v);
    const __m512i packed = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
    _mm512_storeu_si512(q + i, _mm512_permutexvar_epi32(unpack_order, packed));
  }
  for (; i < whole; i += 16) {
    const __m512i c = encodeFp8Vector<kE5M2, kPrescale>(_mm512_loadu_ps(x + i), prescale_v, inverse_v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(c));
  }
  if (tail_mask != 0) {
    const __m512i c =
        encodeFp8Vector<kE5M2, kPrescale>(_mm512_maskz_loadu_ps(tail_mask, x + whole), prescale_v, inverse_v);
    _mm512_mask_cvtepi32_storeu_epi8(q + whole, tail_mask, c);
  }
}

// Scans a stretch of whole blocks (about 8 KiB of input) for their scales first, then converts the
// stretch from L1 while prefetching the next one. Block by block, each block's conversion waits on its
// scale's dependency chain (maximum, reduction, divisions); the waiting operations fill the scheduler
// and the next block's loads are not issued until they drain, so every block pays the memory latency.
// Without the prefetch, the scans (memory-bound) and the conversions (compute-bound) still alternate
// instead of overlapping. Each of the two steps doubled the speed.
constexpr std::size_t kFp8StretchElements = 2048;

template <bool kE5M2, bool kPrescale>
__attribute__((target("avx512f,avx512bw"))) void encodeFp8Stretches(const float* GS_RESTRICT in,
                                                                    std::uint8_t* GS_RESTRICT out,
                                                                    float* GS_RESTRICT scales,
                                                                    std::size_t count, std::size_t block,
                                                                    float prescale, Counts& counts) {
  const std::size_t stretch = block >= kFp8StretchElements ? block : kFp8StretchElements / block * block;
  for (std::size_t first = 0; first < count; first += stretch) {
    const std::size_t last = count - first < stretch ? count : first + stretch;
    float* GS_RESTRICT stretch_scales = scales + first / block;
    for (std::size_t begin = first, b = 0; begin < last; begin += block, ++b) {
      const std::size_t n = last - begin < block ? last - begin : block;
      stretch_scales[b] = scanFp8BlockAvx512<kE5M2, kPrescale>(in + begin, n, prescale, counts);
    }
    const bool more = count - last >= stretch;
    for (std::size_t begin = first, b = 0; begin < last; begin += block, ++b) {
      const std::size_t n = last - begin < block ? last - begin : block;
      convertFp8BlockAvx512<kE5M2, kPrescale>(in + begin, out + begin, n, prescale, 1.0f / stretch_scales[b],
                                              more ? in + begin + stretch : nullptr);
    }
  }
}

template <bool kE5M2>
void encodeFp8Avx512(const float* GS_RESTRICT in, std::uint8_t* GS_RESTRICT out, float* GS_RESTRICT scales,
                     std::size_t count, std::size_t block, float prescale, Counts* counts) {
  if (prescale == 1.0f) {
    encodeFp8Stretches<kE5M2, false>(in, out, scales, count, block, prescale, *counts);
  } else {
    encodeFp8Stretches<kE5M2, true>(in, out, scales, count, block, prescale, *counts);
  }
}
#pragma GCC diagnostic pop
#endif

template <bool kE5M2>
[[gnu::always_inline]] inline float decodeFp8(std::uint8_t code, float scale, float postscale) {
  return ((kE5M2 ? fp8E5M2ToFp32(code) : fp8E4M3ToFp32(code)) * scale) * postscale;
}

template <bool kE5M2, std::size_t kLength>
[[gnu::always_inline]] inline void decodeFp8Run(const std::uint8_t* GS_RESTRICT q, float* GS_RESTRICT y,
                                                float scale, float postscale) {
  for (std::size_t j = 0; j < kLength; ++j) y[j] = decodeFp8<kE5M2>(q[j], scale, postscale);
}

template <bool kE5M2>
[[gnu::always_inline]] inline void decodeFp8Blocks(const std::uint8_t* GS_RESTRICT in,
                                                   const float* GS_RESTRICT scales, std::size_t count,
                                                   std::size_t block, float* GS_RESTRICT out,
                                                   float postscale) {
  for (std::size_t begin = 0; begin < count; begin += block) {
    const std::size_t n = count - begin < block ? count - begin : block;
    const std::uint8_t* GS_RESTRICT q = in + begin;
    float* GS_RESTRICT y = out + begin;
    const float scale = *scales++;
    std::size_t i = 0;
    for (; i + kRun <= n; i += kRun) {
      detail::prefetchAhead(q + i);
      for (std::size_t line = 0; line < kRun; line += 16) detail::prefetchForWrite(y + i + line);
      decodeFp8Run<kE5M2, kRun>(q + i, y + i, scale, postscale);
    }
    for (; i + kShortRun <= n; i += kShortRun) decodeFp8Run<kE5M2, kShortRun>(q + i, y + i, scale, postscale);
    for (; i < n; ++i) y[i] = decodeFp8<kE5M2>(q[i], scale, postscale);
  }
}

GS_CPU_KERNEL void decodeE4M3Kernel(const std::uint8_t* GS_RESTRICT in, const float* GS_RESTRICT scales,
                                    std::size_t count, std::size_t block, float* GS_RESTRICT out,
                                    float postscale) {
  decodeFp8Blocks<false>(in, scales, count, block, out, postscale);
}

GS_CPU_KERNEL void decodeE5M2Kernel(const std::uint8_t* GS_RESTRICT in, const float* GS_RESTRICT scales,
                                    std::size_t count, std::size_t block, float* GS_RESTRICT out,
                                    float postscale) {
  decodeFp8Blocks<true>(in, scales, count, block, out, postscale);
}

// ---- addCodes ------------------------------------------------------------------------------------------

template <WireFormat kFormat>
[[gnu::always_inline]] inline std::uint32_t addCode(std::uint32_t a, std::uint32_t b) {
  if constexpr (kFormat == WireFormat::Fp16) {
    return fp32ToFp16(fp16ToFp32(static_cast<std::uint16_t>(b)) + fp16ToFp32(static_cast<std::uint16_t>(a)));
  } else if constexpr (kFormat == WireFormat::Bf16) {
    return fp32ToBf16(bf16ToFp32(static_cast<std::uint16_t>(b)) + bf16ToFp32(static_cast<std::uint16_t>(a)));
  } else if constexpr (kFormat == WireFormat::Fp8E4M3) {
    return fp32ToFp8E4M3(fp8E4M3ToFp32(static_cast<std::uint8_t>(b)) +
                         fp8E4M3ToFp32(static_cast<std::uint8_t>(a)));
  } else {
    return fp32ToFp8E5M2(fp8E5M2ToFp32(static_cast<std::uint8_t>(b)) +
                         fp8E5M2ToFp32(static_cast<std::uint8_t>(a)));
  }
}

// Runs of kRun through 32-bit lanes (as encodeFp8Run: stored straight into narrow codes, GCC 12 does
// not vectorise the rounding), then one at a time.
template <WireFormat kFormat, typename Code>
[[gnu::always_inline]] inline void addCodeRange(const Code* GS_RESTRICT in, Code* GS_RESTRICT inout,
                                                std::size_t count) {
  std::size_t i = 0;
  for (; i + kRun <= count; i += kRun) {
    std::uint32_t sums[kRun];
    for (std::size_t j = 0; j < kRun; ++j) sums[j] = addCode<kFormat>(in[i + j], inout[i + j]);
    for (std::size_t j = 0; j < kRun; ++j) inout[i + j] = static_cast<Code>(sums[j]);
  }
  for (; i < count; ++i) inout[i] = static_cast<Code>(addCode<kFormat>(in[i], inout[i]));
}

GS_CPU_KERNEL void addFp16Kernel(const std::uint16_t* GS_RESTRICT in, std::uint16_t* GS_RESTRICT inout,
                                 std::size_t count) {
  addCodeRange<WireFormat::Fp16>(in, inout, count);
}

GS_CPU_KERNEL void addBf16Kernel(const std::uint16_t* GS_RESTRICT in, std::uint16_t* GS_RESTRICT inout,
                                 std::size_t count) {
  addCodeRange<WireFormat::Bf16>(in, inout, count);
}

GS_CPU_KERNEL void addE4M3Kernel(const std::uint8_t* GS_RESTRICT in, std::uint8_t* GS_RESTRICT inout,
                                 std::size_t count) {
  addCodeRange<WireFormat::Fp8E4M3>(in, inout, count);
}

GS_CPU_KERNEL void addE5M2Kernel(const std::uint8_t* GS_RESTRICT in, std::uint8_t* GS_RESTRICT inout,
                                 std::size_t count) {
  addCodeRange<WireFormat::Fp8E5M2>(in, inout, count);
}

// fp16 with the conversion instructions: vcvtph2ps is exact, vcvtps2ph with round-to-nearest-even is
// fp32ToFp16 bit for bit (see encodeFp16Avx512), and the addition is the same fp32 addition in the
// same operand order, so the codes are addFp16Kernel's. About 4 instructions per 16 elements instead of
// numeric.h's software rounding, which matters because a hop's sum is on the all-reduce's critical path.
#if defined(GS_HAVE_X86_INTRINSICS)
__attribute__((target("avx512f"))) void addFp16Avx512(const std::uint16_t* GS_RESTRICT in,
                                                      std::uint16_t* GS_RESTRICT inout, std::size_t count) {
  std::size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512 a =
        _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    const __m512 b =
        _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(inout + i)));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(inout + i),
        _mm512_maskz_cvtps_ph(0xFFFF, _mm512_add_ps(b, a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < count; ++i) inout[i] = static_cast<std::uint16_t>(addCode<WireFormat::Fp16>(in[i], inout[i]));
}

__attribute__((target("avx2,f16c"))) void addFp16F16c(const std::uint16_t* GS_RESTRICT in,
                                                      std::uint16_t* GS_RESTRICT inout, std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(inout + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(inout + i),
                     _mm256_cvtps_ph(_mm256_add_ps(b, a), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < count; ++i) inout[i] = static_cast<std::uint16_t>(addCode<WireFormat::Fp16>(in[i], inout[i]));
}
#endif

// The kernels with a hand-written form, per level (dispatch.h). A level without its own keeps the one
// below it: the fp8 encoders need AVX-512BW, so Avx2 encodes fp8 with the portable clones.
struct WireKernels {
  void (*encode_fp16)(const float*, std::uint16_t*, std::size_t, float, Counts*);
  void (*add_fp16)(const std::uint16_t*, std::uint16_t*, std::size_t);
  void (*encode_e4m3)(const float*, std::uint8_t*, float*, std::size_t, std::size_t, float, Counts*);
  void (*encode_e5m2)(const float*, std::uint8_t*, float*, std::size_t, std::size_t, float, Counts*);
};

constexpr WireKernels kPortableWireKernels{encodeFp16Kernel, addFp16Kernel, encodeE4M3Kernel,
                                           encodeE5M2Kernel};

#if defined(GS_HAVE_X86_INTRINSICS)
constexpr detail::IsaTable<WireKernels> kWireKernels{
    kPortableWireKernels, WireKernels{encodeFp16F16c, addFp16F16c, encodeE4M3Kernel, encodeE5M2Kernel},
    WireKernels{encodeFp16Avx512, addFp16Avx512, encodeFp8Avx512<false>, encodeFp8Avx512<true>}};
#else
constexpr detail::IsaTable<WireKernels> kWireKernels{kPortableWireKernels, kPortableWireKernels,
                                                     kPortableWireKernels};
#endif

const WireKernels& wireKernels() {
  return detail::kernelsFor(kWireKernels);
}

void requireBlock(WireFormat format, std::size_t block) {
  if (isFp8(format) && block == 0)
    fail("{} wire format: the scaling block must be at least 1 element", name(format));
}

// Chunk boundaries for fp16/bf16: whole runs, so only the last chunk has a remainder.
constexpr std::size_t kHalfAlign = kRun;

}  // namespace

DType wireDType(WireFormat format) {
  switch (format) {
    case WireFormat::Fp16: return DType::Fp16;
    case WireFormat::Bf16: return DType::Bf16;
    case WireFormat::Fp8E4M3: return DType::Fp8E4M3;
    case WireFormat::Fp8E5M2: return DType::Fp8E5M2;
  }
  return DType::Other;
}

bool isFp8(WireFormat format) {
  return format == WireFormat::Fp8E4M3 || format == WireFormat::Fp8E5M2;
}

std::size_t wireElementBytes(WireFormat format) {
  return isFp8(format) ? 1 : 2;
}

float wireMax(WireFormat format) {
  switch (format) {
    case WireFormat::Fp16: return kFp16Max;
    case WireFormat::Bf16: return kBf16Max;
    case WireFormat::Fp8E4M3: return kFp8E4M3Max;
    case WireFormat::Fp8E5M2: return kFp8E5M2Max;
  }
  return 0.0f;
}

std::size_t scaleCount(WireFormat format, std::size_t count, std::size_t block) {
  if (!isFp8(format)) return 0;
  requireBlock(format, block);
  return count / block + (count % block != 0 ? 1 : 0);
}

EncodeStats encode(WireFormat format, const float* in, std::size_t count, void* out, float* scales,
                   const EncodeOptions& options, CpuExecutor& executor) {
  requireBlock(format, options.block);
  const float prescale = options.prescale;
  const std::size_t block = options.block;
  // One atomic add per chunk: integer sums, so the totals do not depend on how the work was split.
  std::atomic<std::uint64_t> overflow{0};
  std::atomic<std::uint64_t> nan{0};
  auto publish = [&](const Counts& counts) {
    overflow.fetch_add(counts.overflow, std::memory_order_relaxed);
    nan.fetch_add(counts.nan, std::memory_order_relaxed);
  };
  const std::size_t bytes_per_element = sizeof(float) + wireElementBytes(format);
  switch (format) {
    case WireFormat::Fp16:
    case WireFormat::Bf16: {
      auto* half = static_cast<std::uint16_t*>(out);
      const bool bf16 = format == WireFormat::Bf16;
      executor.parallelFor(count, bytes_per_element, kHalfAlign, [&](std::size_t begin, std::size_t end) {
        Counts counts;
        if (bf16) {
          encodeBf16Kernel(in + begin, half + begin, end - begin, prescale, &counts);
        } else {
          wireKernels().encode_fp16(in + begin, half + begin, end - begin, prescale, &counts);
        }
        publish(counts);
      });
      break;
    }
    case WireFormat::Fp8E4M3:
    case WireFormat::Fp8E5M2: {
      auto* bytes = static_cast<std::uint8_t*>(out);
      const bool e5m2 = format == WireFormat::Fp8E5M2;
      // Chunks are whole blocks (the last may end in a partial one), so each scale has one writer.
      executor.parallelFor(count, bytes_per_element, block, [&](std::size_t begin, std::size_t end) {
        Counts counts;
        float* chunk_scales = scales + begin / block;
        const WireKernels& kernels = wireKernels();
        (e5m2 ? kernels.encode_e5m2 : kernels.encode_e4m3)(in + begin, bytes + begin, chunk_scales,
                                                           end - begin, block, prescale, &counts);
        publish(counts);
      });
      break;
    }
  }
  return {overflow.load(std::memory_order_relaxed), nan.load(std::memory_order_relaxed)};
}

void decode(WireFormat format, const void* in, const float* scales, std::size_t count, float* out,
            float postscale, std::size_t block, CpuExecutor& executor) {
  requireBlock(format, block);
  const std::size_t bytes_per_element = sizeof(float) + wireElementBytes(format);
  switch (format) {
    case WireFormat::Fp16:
    case WireFormat::Bf16: {
      const auto* half = static_cast<const std::uint16_t*>(in);
      const bool bf16 = format == WireFormat::Bf16;
      executor.parallelFor(count, bytes_per_element, kHalfAlign, [&](std::size_t begin, std::size_t end) {
        if (bf16) {
          decodeBf16Kernel(half + begin, out + begin, end - begin, postscale);
        } else {
          decodeFp16Kernel(half + begin, out + begin, end - begin, postscale);
        }
      });
      break;
    }
    case WireFormat::Fp8E4M3:
    case WireFormat::Fp8E5M2: {
      const auto* bytes = static_cast<const std::uint8_t*>(in);
      const bool e5m2 = format == WireFormat::Fp8E5M2;
      executor.parallelFor(count, bytes_per_element, block, [&](std::size_t begin, std::size_t end) {
        const float* chunk_scales = scales + begin / block;
        if (e5m2) {
          decodeE5M2Kernel(bytes + begin, chunk_scales, end - begin, block, out + begin, postscale);
        } else {
          decodeE4M3Kernel(bytes + begin, chunk_scales, end - begin, block, out + begin, postscale);
        }
      });
      break;
    }
  }
}

void addCodes(WireFormat format, const void* in, void* inout, std::size_t count) {
  if (count == 0) return;
  if (in == nullptr || inout == nullptr) fail("addCodes: null buffer");
  switch (format) {
    case WireFormat::Fp16:
      wireKernels().add_fp16(static_cast<const std::uint16_t*>(in), static_cast<std::uint16_t*>(inout),
                             count);
      return;
    case WireFormat::Bf16:
      addBf16Kernel(static_cast<const std::uint16_t*>(in), static_cast<std::uint16_t*>(inout), count);
      return;
    case WireFormat::Fp8E4M3:
      addE4M3Kernel(static_cast<const std::uint8_t*>(in), static_cast<std::uint8_t*>(inout), count);
      return;
    case WireFormat::Fp8E5M2:
      addE5M2Kernel(static_cast<const std::uint8_t*>(in), static_cast<std::uint8_t*>(inout), count);
      return;
  }
}

std::size_t encodeBytesMoved(WireFormat format, std::size_t count, std::size_t block) {
  // Reads the fp32 input, writes the narrow codes and (fp8) the scales.
  return count * sizeof(float) + count * wireElementBytes(format) +
         scaleCount(format, count, block) * sizeof(float);
}

std::size_t decodeBytesMoved(WireFormat format, std::size_t count, std::size_t block) {
  // Reads the narrow codes and (fp8) the scales, writes fp32.
  return count * wireElementBytes(format) + scaleCount(format, count, block) * sizeof(float) +
         count * sizeof(float);
}

}  // namespace gradscope::methods
