#pragma once

// Scalar conversions between fp32 and the wire formats, shared by the CPU kernels (which the compiler
// vectorises: every function is branch-free integer and float arithmetic with selects) and the CUDA
// kernels (GS_HOST_DEVICE). Bit-exact definitions:
//
// - fp16 (IEEE binary16) and bf16: round to nearest, ties to even; NaN stays NaN (quiet, sign kept);
//   ±Inf stays ±Inf; finite values beyond the format's range become ±Inf (an "overflow").
// - fp8 e4m3 (OCP E4M3FN: bias 7, max 448, subnormals down to 2^-9, no Inf, NaN = S.1111.111) and
//   e5m2 (OCP E5M2: bias 15, max 57344, subnormals down to 2^-16, Inf and NaN as in fp16): round to
//   nearest even; finite values beyond the largest finite value saturate to it (an "overflow"); NaN
//   stays NaN; e5m2 keeps ±Inf, e4m3 (which has no Inf) turns ±Inf into NaN.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GS_HOST_DEVICE inline
#endif

namespace gradscope::methods {

inline constexpr float kFp16Max = 65504.0f;
inline constexpr float kBf16Max = 3.38953139e38f;  // 0x7F7F
inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr float kFp8E5M2Max = 57344.0f;

GS_HOST_DEVICE std::uint32_t floatBits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

GS_HOST_DEVICE float bitsFloat(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// ---- fp16 -----------------------------------------------------------------------------------------

GS_HOST_DEVICE std::uint16_t fp32ToFp16(float value) {
  const std::uint32_t bits = floatBits(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  // NaN: quiet NaN with the top payload bits; Inf and values that round to >= 2^16: Inf.
  const std::uint32_t nan = 0x7E00u | ((magnitude >> 13) & 0x3FFu);
#if defined(__CUDA_ARCH__)
  // The GPU's conversion rounds to nearest even with subnormals and overflow to Inf, as below, in one
  // instruction instead of fifteen (fp16 sums ran at 0.78 of copy bandwidth on an H100 without it);
  // only its NaN (canonical) differs from ours.
  unsigned short converted;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(converted) : "f"(value));
  return static_cast<std::uint16_t>(magnitude > 0x7F800000u ? (nan | sign) : converted);
#else
  const std::uint32_t inf = 0x7C00u;
  // Subnormal results (|x| < 2^-14): adding 0.5 makes the float unit align with the fp16 subnormal
  // quantum 2^-24, so the hardware's round-to-nearest-even does the rounding.
  const float aligned = bitsFloat(magnitude) + 0.5f;
  const std::uint32_t subnormal = floatBits(aligned) - 0x3F000000u;
  // Normal results: re-bias the exponent and round the 13 dropped mantissa bits to nearest even; a
  // carry out of the mantissa correctly bumps the exponent (up to Inf for [65520, 65536)).
  const std::uint32_t odd = (magnitude >> 13) & 1u;
  const std::uint32_t normal = (magnitude + 0xC8000FFFu + odd) >> 13;  // 0xC8000000 = (15 - 127) << 23
  std::uint32_t half = magnitude < 0x38800000u ? subnormal : normal;
  half = magnitude >= 0x47800000u ? inf : half;
  half = magnitude > 0x7F800000u ? nan : half;
  return static_cast<std::uint16_t>(half | sign);
#endif
}

GS_HOST_DEVICE float fp16ToFp32(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu;
  const std::uint32_t mantissa = half & 0x3FFu;
#if defined(__CUDA_ARCH__)
  // Exact in hardware for every finite value and Inf; a NaN keeps its payload as below.
  float converted;
  asm("cvt.f32.f16 %0, %1;" : "=f"(converted) : "h"(static_cast<unsigned short>(half)));
  const bool nan = exponent == 0x1Fu && mantissa != 0;
  return nan ? bitsFloat(sign | 0x7F800000u | (mantissa << 13)) : converted;
#else
  // Normal: re-bias. Inf/NaN: all-ones exponent, payload kept. Subnormal: mantissa · 2^-24, exact.
  const std::uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
  const std::uint32_t special = 0x7F800000u | (mantissa << 13);
  const float subnormal = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
  std::uint32_t bits = exponent == 0x1Fu ? special : normal;
  bits = exponent == 0 ? floatBits(subnormal) : bits;
  return bitsFloat(bits | sign);
#endif
}

// ---- bf16 -----------------------------------------------------------------------------------------

GS_HOST_DEVICE std::uint16_t fp32ToBf16(float value) {
  const std::uint32_t bits = floatBits(value);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  const std::uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const std::uint32_t nan = ((bits >> 16) | 0x0040u);  // quiet NaN, sign and top payload kept
  return static_cast<std::uint16_t>(magnitude > 0x7F800000u ? nan : rounded);
}

GS_HOST_DEVICE float bf16ToFp32(std::uint16_t value) {
  return bitsFloat(static_cast<std::uint32_t>(value) << 16);
}

// ---- fp8 ------------------------------------------------------------------------------------------

// Rounds |x| (bits of a finite, non-negative float below the format's saturation point) to an fp8 code
// with `mantissa_bits` and exponent `bias`. Subnormals use the same float-addition trick as fp16.
GS_HOST_DEVICE std::uint32_t fp8RoundMagnitude(std::uint32_t magnitude, int mantissa_bits, int bias) {
  const int dropped = 23 - mantissa_bits;
  // Smallest normal: 2^(1 - bias); its float exponent field is 128 - bias.
  const std::uint32_t min_normal = static_cast<std::uint32_t>(128 - bias) << 23;
  // The subnormal quantum is 2^(1 - bias - mantissa_bits); adding 2^(1 - bias - mantissa_bits + 23)
  // aligns it with the float unit.
  const std::uint32_t magic = static_cast<std::uint32_t>(127 + 1 - bias - mantissa_bits + 23) << 23;
  const float aligned = bitsFloat(magnitude) + bitsFloat(magic);
  const std::uint32_t subnormal = floatBits(aligned) - magic;
  const std::uint32_t odd = (magnitude >> dropped) & 1u;
  const std::uint32_t rebias = static_cast<std::uint32_t>(127 - bias) << 23;
  const std::uint32_t normal = (magnitude - rebias + ((1u << (dropped - 1)) - 1u) + odd) >> dropped;
  return magnitude < min_normal ? subnormal : normal;
}

GS_HOST_DEVICE std::uint8_t fp32ToFp8E4M3(float value) {
  const std::uint32_t bits = floatBits(value);
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  // Everything from 448 up (Inf too) is handled by the selects below, so clamp before rounding.
  const std::uint32_t clamped = magnitude < 0x43E00000u ? magnitude : 0x43E00000u;  // 448
  std::uint32_t code = fp8RoundMagnitude(clamped, 3, 7);
  code = magnitude >= 0x7F800000u ? 0x7Fu : code;  // NaN and Inf -> NaN (E4M3FN has no Inf)
  return static_cast<std::uint8_t>(code | sign);
}

GS_HOST_DEVICE std::uint8_t fp32ToFp8E5M2(float value) {
  const std::uint32_t bits = floatBits(value);
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  const std::uint32_t clamped = magnitude < 0x47600000u ? magnitude : 0x47600000u;  // 57344
  std::uint32_t code = fp8RoundMagnitude(clamped, 2, 15);
  code = magnitude == 0x7F800000u ? 0x7Cu : code;  // Inf stays Inf
  code = magnitude > 0x7F800000u ? 0x7Eu : code;   // NaN (quiet)
  return static_cast<std::uint8_t>(code | sign);
}

GS_HOST_DEVICE float fp8E4M3ToFp32(std::uint8_t code) {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t exponent = (code >> 3) & 0xFu;
  const std::uint32_t mantissa = code & 0x7u;
  const std::uint32_t normal = ((exponent + 120u) << 23) | (mantissa << 20);
  const float subnormal = static_cast<float>(mantissa) * 0.001953125f;  // 2^-9
  std::uint32_t bits = exponent == 0 ? floatBits(subnormal) : normal;
  bits = (code & 0x7Fu) == 0x7Fu ? 0x7FC00000u : bits;
  return bitsFloat(bits | sign);
}

GS_HOST_DEVICE float fp8E5M2ToFp32(std::uint8_t code) {
  // E5M2 is the top byte of an fp16.
  return fp16ToFp32(static_cast<std::uint16_t>(code << 8));
}

// Whether a conversion saturated or overflowed: a finite input that came out as Inf (fp16, bf16) or
// was clamped to the largest finite value (fp8).
GS_HOST_DEVICE bool isFiniteFloat(float value) {
  return (floatBits(value) & 0x7F800000u) != 0x7F800000u;
}

}  // namespace gradscope::methods
