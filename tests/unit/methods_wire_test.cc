// methods/: wire precisions (wire.h) and the scalar conversions under them (numeric.h).
//
// Conversions are checked exhaustively where the domain allows it (every fp16, bf16 and fp8 code) and
// against references written here from the format definitions in double arithmetic, never against
// numeric.h itself. Lossy round trips are checked against the half-ulp bound of the format, derived
// below, and the parallel paths against the single-threaded one bit for bit.

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dispatch.h"
#include "gradscope/common/error.h"
#include "gradscope/methods/cpu_executor.h"
#include "gradscope/methods/numeric.h"
#include "gradscope/methods/wire.h"
#include "sanitized.h"

namespace gradscope::methods {
namespace {

std::uint32_t bitsOf(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float floatOf(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

bool isNanBits(std::uint32_t bits) {
  return (bits & 0x7FFFFFFFu) > 0x7F800000u;
}

// SplitMix64: fast and reproducible, for buffers of millions of values.
struct Random {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  // Random sign, magnitude log-uniform in [2^lo, 2^hi).
  float logUniform(int lo, int hi) {
    const double magnitude = std::exp2(lo + (hi - lo) * uniform());
    return static_cast<float>((next() & 1) != 0 ? -magnitude : magnitude);
  }
};

// ---------------------------------------------------------------------------------------------------
// References from the format definitions (double arithmetic; every value involved is exact in double)

// A binary floating-point format with an implicit leading bit: `mantissa_bits` stored fraction bits,
// smallest normal exponent `min_exponent`; `bias` places the exponent field.
struct Format {
  int mantissa_bits;
  int min_exponent;
  int bias;
};

constexpr Format kHalfFormat{10, -14, 15};
constexpr Format kBf16Format{7, -126, 127};

// Rounds `value` to `format` (nearest, ties to even, unbounded exponent range above) and returns the
// code without the sign: the magnitude's bits, which may reach or pass the all-ones exponent when the
// value is too large (the caller decides what that means).
std::uint32_t roundMagnitude(double value, Format format) {
  const double magnitude = std::fabs(value);
  if (magnitude == 0.0) return 0;
  const int exponent = std::max(std::ilogb(magnitude), format.min_exponent);
  const double quantum = std::ldexp(1.0, exponent - format.mantissa_bits);
  const double steps = std::nearbyint(magnitude / quantum);  // default rounding mode: ties to even
  // steps in [0, 2^(m+1)]; a carry to 2^(m+1) lands on the next exponent by the same formula.
  return static_cast<std::uint32_t>(((exponent + format.bias) << format.mantissa_bits) +
                                    static_cast<std::int64_t>(steps) -
                                    (std::int64_t{1} << format.mantissa_bits));
}

// Reference fp32 -> fp16 / bf16 code (IEEE semantics: overflow to Inf, NaN stays a quiet NaN).
std::uint16_t referenceHalf(float value, Format format) {
  const std::uint32_t bits = bitsOf(value);
  const std::uint32_t sign = bits >> 31 << 15;
  const std::uint32_t exponent_all_ones = ((1u << (15 - format.mantissa_bits)) - 1u) << format.mantissa_bits;
  if (std::isnan(value))
    return static_cast<std::uint16_t>(sign | exponent_all_ones | (1u << (format.mantissa_bits - 1)));
  if (std::isinf(value)) return static_cast<std::uint16_t>(sign | exponent_all_ones);
  const std::uint32_t magnitude = roundMagnitude(value, format);
  return static_cast<std::uint16_t>(sign | (magnitude >= exponent_all_ones ? exponent_all_ones : magnitude));
}

// Value of an fp16 code by the IEEE binary16 definition.
double referenceFp16Value(std::uint16_t code) {
  const int sign = code >> 15;
  const int exponent = (code >> 10) & 0x1F;
  const int mantissa = code & 0x3FF;
  double value;
  if (exponent == 0x1F) {
    value =
        mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(mantissa, -24);
  } else {
    value = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign != 0 ? -value : value;
}

// Value of an fp8 code by the OCP 8-bit floating point specification (v1.0): E4M3 (bias 7, no Inf,
// S.1111.111 is NaN) and E5M2 (bias 15, IEEE-like Inf and NaN).
double referenceFp8Value(WireFormat format, std::uint8_t code) {
  const bool e5m2 = format == WireFormat::Fp8E5M2;
  const int mantissa_bits = e5m2 ? 2 : 3;
  const int bias = e5m2 ? 15 : 7;
  const int sign = code >> 7;
  const int exponent = (code & 0x7F) >> mantissa_bits;
  const int mantissa = code & ((1 << mantissa_bits) - 1);
  double value;
  if (e5m2 && exponent == 0x1F) {
    value =
        mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!e5m2 && exponent == 0xF && mantissa == 0x7) {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(mantissa, 1 - bias - mantissa_bits);
  } else {
    value = std::ldexp((1 << mantissa_bits) + mantissa, exponent - bias - mantissa_bits);
  }
  return sign != 0 ? -value : value;
}

// The code of +fp8_max: S.1111.110 in e4m3, S.11110.11 in e5m2.
std::uint8_t maxCode(WireFormat format) {
  return format == WireFormat::Fp8E4M3 ? 0x7E : 0x7B;
}

// Reference fp32 -> fp8 code by the OCP definition with saturation (wire.h): nearest, ties to even;
// finite values beyond the largest finite value become it; NaN -> NaN; ±Inf -> ±Inf (e5m2) or NaN
// (e4m3, which has no Inf).
std::uint8_t referenceFp8(WireFormat format, float value) {
  const bool e5m2 = format == WireFormat::Fp8E5M2;
  const std::uint32_t sign = std::signbit(value) ? 0x80u : 0u;
  const std::uint32_t nan = e5m2 ? 0x7Eu : 0x7Fu;
  if (std::isnan(value)) return static_cast<std::uint8_t>(sign | nan);
  if (std::isinf(value)) return static_cast<std::uint8_t>(sign | (e5m2 ? 0x7Cu : nan));
  const Format fp8 = e5m2 ? Format{2, -14, 15} : Format{3, -6, 7};
  const std::uint32_t magnitude = roundMagnitude(value, fp8);
  return static_cast<std::uint8_t>(sign | std::min(magnitude, e5m2 ? 0x7Bu : 0x7Eu));
}

// Encodes `values` as one fp8 block that also holds ±fp8_max, so that the block scale is exactly
// 448 / 448 = 1 (57344 / 57344 for e5m2) and the codes are the plain conversions of the values.
std::vector<std::uint8_t> encodeUnscaled(WireFormat format, std::vector<float> values,
                                         EncodeStats* stats = nullptr) {
  values.push_back(-wireMax(format));
  std::vector<std::uint8_t> codes(values.size());
  float scale = 0.0f;
  const EncodeStats result = encode(format, values.data(), values.size(), codes.data(), &scale,
                                    {.prescale = 1.0f, .block = values.size()});
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(codes.back(), maxCode(format) | 0x80);
  codes.pop_back();
  if (stats != nullptr) *stats = result;
  return codes;
}

// ---------------------------------------------------------------------------------------------------
// Names and sizes

TEST(WireFormats, NamesRoundTripAndMatchTheDTypes) {
  const char* const names[] = {"fp16", "bf16", "fp8e4m3", "fp8e5m2"};
  const DType dtypes[] = {DType::Fp16, DType::Bf16, DType::Fp8E4M3, DType::Fp8E5M2};
  int i = 0;
  for (WireFormat format : kWireFormats) {
    EXPECT_EQ(name(format), names[i]);
    EXPECT_EQ(parseWireFormat(names[i]), format);
    EXPECT_EQ(wireDType(format), dtypes[i]);
    EXPECT_EQ(wireElementBytes(format), sizeOf(dtypes[i]));
    EXPECT_EQ(name(wireDType(format)), name(format));  // the wire part of a strategy is the dtype's name
    ++i;
  }
  EXPECT_EQ(parseWireFormat("native"), std::nullopt);  // the job's own dtype: no conversion at all
  EXPECT_EQ(parseWireFormat("fp8"), std::nullopt);
  EXPECT_EQ(parseWireFormat(""), std::nullopt);
  EXPECT_EQ(parseWireFormat("fp16 "), std::nullopt);
}

TEST(WireFormats, KindsSizesAndLargestValues) {
  EXPECT_FALSE(isFp8(WireFormat::Fp16));
  EXPECT_FALSE(isFp8(WireFormat::Bf16));
  EXPECT_TRUE(isFp8(WireFormat::Fp8E4M3));
  EXPECT_TRUE(isFp8(WireFormat::Fp8E5M2));
  EXPECT_EQ(wireElementBytes(WireFormat::Fp16), 2u);
  EXPECT_EQ(wireElementBytes(WireFormat::Bf16), 2u);
  EXPECT_EQ(wireElementBytes(WireFormat::Fp8E4M3), 1u);
  EXPECT_EQ(wireElementBytes(WireFormat::Fp8E5M2), 1u);
  // Largest finite values from the format definitions: (2 - 2^-10)·2^15, (2 - 2^-7)·2^127,
  // 1.75·2^8 (E4M3FN gives up S.1111.111 for NaN), 1.75·2^15.
  EXPECT_EQ(wireMax(WireFormat::Fp16), static_cast<float>(std::ldexp(2.0 - std::ldexp(1.0, -10), 15)));
  EXPECT_EQ(wireMax(WireFormat::Bf16), static_cast<float>(std::ldexp(2.0 - std::ldexp(1.0, -7), 127)));
  EXPECT_EQ(wireMax(WireFormat::Fp8E4M3), 448.0f);
  EXPECT_EQ(wireMax(WireFormat::Fp8E5M2), 57344.0f);
}

TEST(WireFormats, ScaleCountsAndBytesMoved) {
  EXPECT_EQ(scaleCount(WireFormat::Fp16, 1000, 128), 0u);
  EXPECT_EQ(scaleCount(WireFormat::Bf16, 1000, 0), 0u);  // the block means nothing without scales
  EXPECT_EQ(scaleCount(WireFormat::Fp8E4M3, 0, 128), 0u);
  EXPECT_EQ(scaleCount(WireFormat::Fp8E4M3, 1, 128), 1u);
  EXPECT_EQ(scaleCount(WireFormat::Fp8E4M3, 128, 128), 1u);
  EXPECT_EQ(scaleCount(WireFormat::Fp8E5M2, 129, 128), 2u);
  EXPECT_EQ(scaleCount(WireFormat::Fp8E5M2, 1000, 1), 1000u);
  // Encode reads fp32, writes codes and scales; decode reads codes and scales, writes fp32.
  EXPECT_EQ(encodeBytesMoved(WireFormat::Fp16, 1000, 128), 1000u * 4 + 1000u * 2);
  EXPECT_EQ(decodeBytesMoved(WireFormat::Bf16, 1000, 128), 1000u * 2 + 1000u * 4);
  EXPECT_EQ(encodeBytesMoved(WireFormat::Fp8E4M3, 1000, 128), 1000u * 4 + 1000u + 8u * 4);
  EXPECT_EQ(decodeBytesMoved(WireFormat::Fp8E5M2, 1000, 128), 1000u + 8u * 4 + 1000u * 4);
}

TEST(WireFormats, Fp8RefusesAnEmptyBlock) {
  std::vector<float> in(16, 1.0f);
  std::vector<std::uint8_t> codes(16);
  std::vector<float> scales(16), out(16);
  EXPECT_THROW(scaleCount(WireFormat::Fp8E4M3, 16, 0), Error);
  EXPECT_THROW(encode(WireFormat::Fp8E4M3, in.data(), 16, codes.data(), scales.data(), {.block = 0}), Error);
  EXPECT_THROW(decode(WireFormat::Fp8E5M2, codes.data(), scales.data(), 16, out.data(), 1.0f, 0), Error);
  // fp16 ignores the block.
  std::vector<std::uint16_t> half(16);
  EXPECT_NO_THROW(encode(WireFormat::Fp16, in.data(), 16, half.data(), nullptr, {.block = 0}));
}

TEST(WireFormats, EmptyBuffersTouchNothing) {
  for (WireFormat format : kWireFormats) {
    const EncodeStats stats = encode(format, nullptr, 0, nullptr, nullptr);
    EXPECT_EQ(stats.overflow, 0u);
    EXPECT_EQ(stats.nan, 0u);
    decode(format, nullptr, nullptr, 0, nullptr);
  }
}

// ---------------------------------------------------------------------------------------------------
// fp16

TEST(Fp16, EveryCodeDecodesToItsValueAndEncodesBack) {
  std::vector<std::uint16_t> codes(65536);
  for (std::uint32_t c = 0; c < 65536; ++c) codes[c] = static_cast<std::uint16_t>(c);
  std::vector<float> values(codes.size());
  decode(WireFormat::Fp16, codes.data(), nullptr, codes.size(), values.data());
  std::vector<std::uint16_t> again(codes.size());
  const EncodeStats stats = encode(WireFormat::Fp16, values.data(), values.size(), again.data(), nullptr);
  std::uint64_t nans = 0;
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const double expected = referenceFp16Value(codes[c]);
    if (std::isnan(expected)) {
      ++nans;
      ASSERT_TRUE(std::isnan(values[c])) << c;
      EXPECT_EQ(bitsOf(values[c]) >> 31, c >> 15) << c;
      // Still a NaN with its sign and payload; the quiet bit is set (signalling NaNs become quiet).
      EXPECT_EQ(again[c] | 0x0200u, c | 0x0200u) << c;
      ASSERT_TRUE((again[c] & 0x7C00u) == 0x7C00u && (again[c] & 0x3FFu) != 0) << c;
    } else {
      ASSERT_EQ(static_cast<double>(values[c]), expected) << c;
      ASSERT_EQ(std::signbit(values[c]), (c & 0x8000u) != 0) << c;  // -0 stays -0
      ASSERT_EQ(again[c], codes[c]) << c;
    }
  }
  EXPECT_EQ(stats.nan, nans);
  EXPECT_EQ(nans, 2u * 1023u);
  EXPECT_EQ(stats.overflow, 0u);  // ±Inf codes are not finite inputs
}

// fp32 values worth rounding: a stride over all 2^32 patterns, every halfway point between adjacent
// values of the format (computed from the reference, so exact), and each halfway point's neighbours.
std::vector<float> roundingProbes(Format format) {
  std::vector<float> probes;
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += 65537) {
    probes.push_back(floatOf(static_cast<std::uint32_t>(bits)));
  }
  auto value = [&](int code) {
    const int exponent = code >> format.mantissa_bits;
    const int mantissa = code & ((1 << format.mantissa_bits) - 1);
    return exponent == 0 ? std::ldexp(mantissa, format.min_exponent - format.mantissa_bits)
                         : std::ldexp((1 << format.mantissa_bits) + mantissa,
                                      exponent - format.bias - format.mantissa_bits);
  };
  const int all_ones = ((1 << (15 - format.mantissa_bits)) - 1) << format.mantissa_bits;
  // Halfway from each finite magnitude to the next; from the largest one to the next power of two
  // (where a format with more exponent would continue): the overflow threshold.
  for (int code = 0; code < all_ones; ++code) {
    const double low = value(code);
    const double high = code + 1 == all_ones
                            ? std::ldexp(1.0, all_ones / (1 << format.mantissa_bits) - format.bias)
                            : value(code + 1);
    const double midpoint = (low + high) / 2;
    if (midpoint > static_cast<double>(FLT_MAX)) continue;  // bf16's top halfway point is past fp32's range
    const float halfway = static_cast<float>(midpoint);
    EXPECT_EQ(static_cast<double>(halfway), midpoint);
    for (float probe : {halfway, std::nextafter(halfway, 0.0f), std::nextafter(halfway, INFINITY)}) {
      probes.push_back(probe);
      probes.push_back(-probe);
    }
  }
  return probes;
}

TEST(Fp16, EncodeRoundsToNearestEvenLikeTheReference) {
  const std::vector<float> probes = roundingProbes(kHalfFormat);
  std::vector<std::uint16_t> codes(probes.size());
  const EncodeStats stats = encode(WireFormat::Fp16, probes.data(), probes.size(), codes.data(), nullptr);
  std::uint64_t overflow = 0, nan = 0;
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const std::uint16_t expected = referenceHalf(probes[i], kHalfFormat);
    if (std::isnan(probes[i])) {
      ++nan;
      ASSERT_EQ(codes[i] & 0xFE00u, expected & 0xFE00u) << probes[i];  // quiet NaN, sign kept
      continue;
    }
    ASSERT_EQ(codes[i], expected) << std::hexfloat << probes[i];
    if (std::isfinite(probes[i]) && (expected & 0x7FFFu) == 0x7C00u) ++overflow;
  }
  EXPECT_GT(overflow, 0u);
  EXPECT_EQ(stats.overflow, overflow);
  EXPECT_EQ(stats.nan, nan);
}

TEST(Fp16, OverflowsToInfFrom65520AndCountsIt) {
  const std::vector<float> in = {65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e6f, FLT_MAX,
                                 INFINITY, -INFINITY, NAN,      -NAN,      0.0f, -0.0f};
  std::vector<std::uint16_t> codes(in.size());
  const EncodeStats stats = encode(WireFormat::Fp16, in.data(), in.size(), codes.data(), nullptr);
  EXPECT_EQ(codes[0], 0x7BFF);
  EXPECT_EQ(codes[1], 0x7BFF);  // 65519.99 is below the halfway point 65520: stays 65504
  EXPECT_EQ(codes[2], 0x7C00);  // halfway, and 65504 is odd: rounds up, to Inf
  EXPECT_EQ(codes[3], 0xFC00);
  EXPECT_EQ(codes[4], 0x7C00);
  EXPECT_EQ(codes[5], 0x7C00);
  EXPECT_EQ(codes[6], 0x7C00);
  EXPECT_EQ(codes[7], 0xFC00);
  EXPECT_EQ(codes[10], 0x0000);
  EXPECT_EQ(codes[11], 0x8000);
  EXPECT_EQ(stats.overflow, 4u);  // 65520, -65520, 1e6, FLT_MAX; the Infs were Inf already
  EXPECT_EQ(stats.nan, 2u);
}

TEST(Fp16, PrescaleAppliesBeforeTheConversion) {
  // 1e5 overflows fp16 alone but not after a prescale of 1/2; 1e-8 is below fp16's subnormals
  // (flushes to 0) but not after a prescale of 2^10. A finite value that a prescale pushes past
  // FLT_MAX counts as an overflow too.
  const std::vector<float> in = {1e5f, 1e-8f, 3e38f};
  std::vector<std::uint16_t> codes(in.size());
  EncodeStats stats = encode(WireFormat::Fp16, in.data(), in.size(), codes.data(), nullptr);
  EXPECT_EQ(codes[0], 0x7C00);
  EXPECT_EQ(codes[1], 0x0000);
  EXPECT_EQ(stats.overflow, 2u);
  stats = encode(WireFormat::Fp16, in.data(), 2, codes.data(), nullptr, {.prescale = 0.5f});
  EXPECT_EQ(codes[0], referenceHalf(5e4f, kHalfFormat));
  EXPECT_EQ(stats.overflow, 0u);
  stats = encode(WireFormat::Fp16, in.data(), in.size(), codes.data(), nullptr, {.prescale = 1024.0f});
  EXPECT_EQ(codes[1], referenceHalf(1e-8f * 1024.0f, kHalfFormat));
  EXPECT_NE(codes[1], 0);
  EXPECT_EQ(codes[2], 0x7C00);
  EXPECT_EQ(stats.overflow, 2u);
}

// ---------------------------------------------------------------------------------------------------
// bf16

TEST(Bf16, EveryCodeDecodesToItsValueAndEncodesBack) {
  std::vector<std::uint16_t> codes(65536);
  for (std::uint32_t c = 0; c < 65536; ++c) codes[c] = static_cast<std::uint16_t>(c);
  std::vector<float> values(codes.size());
  decode(WireFormat::Bf16, codes.data(), nullptr, codes.size(), values.data());
  std::vector<std::uint16_t> again(codes.size());
  const EncodeStats stats = encode(WireFormat::Bf16, values.data(), values.size(), again.data(), nullptr);
  std::uint64_t nans = 0;
  for (std::uint32_t c = 0; c < 65536; ++c) {
    // bf16 is the top half of an fp32: the value's bits are the code followed by 16 zero bits; a
    // signalling NaN comes back quiet (decode multiplies by the postscale).
    if (isNanBits(c << 16)) {
      ++nans;
      ASSERT_EQ(bitsOf(values[c]) | 0x00400000u, (c << 16) | 0x00400000u) << c;
      EXPECT_EQ(again[c] | 0x0040u, c | 0x0040u) << c;  // quiet bit set, sign and payload kept
    } else {
      ASSERT_EQ(bitsOf(values[c]), c << 16) << c;
      ASSERT_EQ(again[c], codes[c]) << c;
    }
  }
  EXPECT_EQ(stats.nan, nans);
  EXPECT_EQ(nans, 2u * 127u);
  EXPECT_EQ(stats.overflow, 0u);
}

TEST(Bf16, EncodeRoundsToNearestEvenLikeTheReference) {
  const std::vector<float> probes = roundingProbes(kBf16Format);
  std::vector<std::uint16_t> codes(probes.size());
  const EncodeStats stats = encode(WireFormat::Bf16, probes.data(), probes.size(), codes.data(), nullptr);
  std::uint64_t overflow = 0, nan = 0;
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const std::uint16_t expected = referenceHalf(probes[i], kBf16Format);
    if (std::isnan(probes[i])) {
      ++nan;
      ASSERT_EQ(codes[i] & 0xFFC0u, expected & 0xFFC0u) << probes[i];
      continue;
    }
    ASSERT_EQ(codes[i], expected) << std::hexfloat << probes[i];
    if (std::isfinite(probes[i]) && (expected & 0x7FFFu) == 0x7F80u) ++overflow;
  }
  EXPECT_GT(overflow, 0u);
  EXPECT_EQ(stats.overflow, overflow);
  EXPECT_EQ(stats.nan, nan);
}

TEST(Bf16, OverflowsOnlyPastTheLastHalfwayPoint) {
  // bf16's largest value is 0x7F7F = (2 - 2^-7)·2^127; fp32 values from the halfway point to 2^128
  // (0x7F7F8000 and up) round to Inf.
  const std::vector<float> in = {floatOf(0x7F7F7FFFu), floatOf(0x7F7F8000u), -FLT_MAX, 1.0f};
  std::vector<std::uint16_t> codes(in.size());
  const EncodeStats stats = encode(WireFormat::Bf16, in.data(), in.size(), codes.data(), nullptr);
  EXPECT_EQ(codes[0], 0x7F7F);
  EXPECT_EQ(codes[1], 0x7F80);
  EXPECT_EQ(codes[2], 0xFF80);
  EXPECT_EQ(codes[3], 0x3F80);
  EXPECT_EQ(stats.overflow, 2u);
}

// ---------------------------------------------------------------------------------------------------
// fp8 conversions (one block with scale exactly 1)

class Fp8Codes : public ::testing::TestWithParam<WireFormat> {};

TEST_P(Fp8Codes, EveryCodeDecodesToTheOcpValue) {
  const WireFormat format = GetParam();
  std::vector<std::uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[static_cast<std::size_t>(c)] = static_cast<std::uint8_t>(c);
  const float scale = 1.0f;
  std::vector<float> values(256);
  decode(format, codes.data(), &scale, 256, values.data(), 1.0f, 256);
  int nans = 0, infs = 0;
  for (int c = 0; c < 256; ++c) {
    const double expected = referenceFp8Value(format, static_cast<std::uint8_t>(c));
    const float value = values[static_cast<std::size_t>(c)];
    if (std::isnan(expected)) {
      ++nans;
      EXPECT_TRUE(std::isnan(value)) << c;
    } else {
      infs += std::isinf(expected) ? 1 : 0;
      EXPECT_EQ(static_cast<double>(value), expected) << c;
      EXPECT_EQ(std::signbit(value), c >= 128) << c;
    }
  }
  if (format == WireFormat::Fp8E4M3) {
    EXPECT_EQ(nans, 2);  // S.1111.111 only
    EXPECT_EQ(infs, 0);
    EXPECT_EQ(values[0x7E], 448.0f);
    EXPECT_EQ(values[0x01], 0x1p-9f);
    EXPECT_EQ(values[0x08], 0x1p-6f);
  } else {
    EXPECT_EQ(nans, 6);
    EXPECT_EQ(infs, 2);
    EXPECT_EQ(values[0x7B], 57344.0f);
    EXPECT_EQ(values[0x01], 0x1p-16f);
    EXPECT_EQ(values[0x04], 0x1p-14f);
  }
}

TEST_P(Fp8Codes, EveryFiniteCodeEncodesBack) {
  const WireFormat format = GetParam();
  std::vector<std::uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[static_cast<std::size_t>(c)] = static_cast<std::uint8_t>(c);
  const float one = 1.0f;
  std::vector<float> values(256);
  decode(format, codes.data(), &one, 256, values.data(), 1.0f, 256);
  // The block holds ±max, so its scale is exactly 1 and encode is the plain conversion.
  std::vector<std::uint8_t> again(256);
  float scale = 0.0f;
  const EncodeStats stats = encode(format, values.data(), 256, again.data(), &scale, {.block = 256});
  EXPECT_EQ(scale, 1.0f);
  std::uint64_t nans = 0;
  for (int c = 0; c < 256; ++c) {
    const auto i = static_cast<std::size_t>(c);
    if (std::isnan(values[i])) {
      ++nans;
      EXPECT_EQ(again[i] & 0x80, c & 0x80) << c;
      EXPECT_TRUE(std::isnan(referenceFp8Value(format, again[i]))) << c;
    } else {
      EXPECT_EQ(again[i], c) << c;  // includes ±0, subnormals, ±max and (e5m2) ±Inf
    }
  }
  EXPECT_EQ(stats.nan, nans);
  EXPECT_EQ(stats.overflow, 0u);
}

TEST_P(Fp8Codes, RoundsToNearestEvenIncludingSubnormals) {
  const WireFormat format = GetParam();
  const bool e5m2 = format == WireFormat::Fp8E5M2;
  // q = smallest subnormal of the format (2^-9 for e4m3, 2^-16 for e5m2).
  const float q = e5m2 ? 0x1p-16f : 0x1p-9f;
  // The last two are halfway between normal neighbours: one rounds down to even, one up.
  const std::vector<float> in = {q,
                                 q / 2,
                                 3 * q / 2,
                                 5 * q / 2,
                                 -q / 2,
                                 q / 2 * 1.0001f,
                                 -0.0f,
                                 0.0f,
                                 e5m2 ? 1.125f : 1.0625f,
                                 e5m2 ? 1.375f : 1.1875f};
  const std::vector<std::uint8_t> codes = encodeUnscaled(format, in);
  EXPECT_EQ(codes[0], 0x01);
  EXPECT_EQ(codes[1], 0x00);  // halfway between 0 and q: ties to even, 0
  EXPECT_EQ(codes[2], 0x02);  // halfway between q and 2q: 2q
  EXPECT_EQ(codes[3], 0x02);  // halfway between 2q and 3q: 2q
  EXPECT_EQ(codes[4], 0x80);  // -0
  EXPECT_EQ(codes[5], 0x01);  // just above halfway
  EXPECT_EQ(codes[6], 0x80);
  EXPECT_EQ(codes[7], 0x00);
  if (e5m2) {
    EXPECT_EQ(codes[8], 0x3C);  // 1.125 between 1.0 (3C) and 1.25 (3D): 3C
    EXPECT_EQ(codes[9], 0x3E);  // 1.375 between 1.25 (3D) and 1.5 (3E): 3E
  } else {
    EXPECT_EQ(codes[8], 0x38);  // 1.0625 between 1.0 (38) and 1.125 (39): 38
    EXPECT_EQ(codes[9], 0x3A);  // 1.1875 between 1.125 (39) and 1.25 (3A): 3A
  }
  // The brief's examples for e4m3: 2^-9 -> 2^-9, 2^-10 -> 0, 3·2^-10 -> 2^-8.
  if (!e5m2) {
    const std::vector<std::uint8_t> more = encodeUnscaled(format, {0x1p-9f, 0x1p-10f, 3 * 0x1p-10f});
    EXPECT_EQ(more[0], 0x01);
    EXPECT_EQ(more[1], 0x00);
    EXPECT_EQ(more[2], 0x02);
  }
}

TEST_P(Fp8Codes, SpecialValues) {
  const WireFormat format = GetParam();
  const bool e5m2 = format == WireFormat::Fp8E5M2;
  EncodeStats stats;
  const std::vector<std::uint8_t> codes =
      encodeUnscaled(format, {NAN, -NAN, INFINITY, -INFINITY, -0.0f}, &stats);
  EXPECT_TRUE(std::isnan(referenceFp8Value(format, codes[0])));
  EXPECT_TRUE(std::isnan(referenceFp8Value(format, codes[1])));
  EXPECT_EQ(codes[1] & 0x80, 0x80);
  if (e5m2) {
    EXPECT_EQ(codes[2], 0x7C);  // Inf stays Inf
    EXPECT_EQ(codes[3], 0xFC);
  } else {
    EXPECT_EQ(codes[2], 0x7F);  // E4M3FN has no Inf: NaN
    EXPECT_EQ(codes[3], 0xFF);
  }
  EXPECT_EQ(codes[4], 0x80);
  EXPECT_EQ(stats.nan, 2u);
  EXPECT_EQ(stats.overflow, 0u);  // Inf inputs are not finite inputs that overflowed
}

TEST_P(Fp8Codes, ConversionMatchesTheReferenceOnAStrideOfAllFloatsAndEveryHalfwayPoint) {
  // numeric.h's conversions on their own (encode adds the block scale around them): a stride over
  // all 2^32 patterns plus every halfway point between adjacent fp8 magnitudes (including the one
  // past the largest, 464 or 61440) and its neighbours, both signs.
  const WireFormat format = GetParam();
  const bool e5m2 = format == WireFormat::Fp8E5M2;
  std::vector<float> probes;
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += 65537) {
    probes.push_back(floatOf(static_cast<std::uint32_t>(bits)));
  }
  const int largest = e5m2 ? 0x7B : 0x7E;
  for (int code = 0; code <= largest; ++code) {
    const double low = referenceFp8Value(format, static_cast<std::uint8_t>(code));
    const double high = code == largest ? (e5m2 ? 65536.0 : 480.0)
                                        : referenceFp8Value(format, static_cast<std::uint8_t>(code + 1));
    const auto halfway = static_cast<float>((low + high) / 2);
    for (float probe : {halfway, std::nextafter(halfway, 0.0f), std::nextafter(halfway, INFINITY)}) {
      probes.push_back(probe);
      probes.push_back(-probe);
    }
  }
  for (float probe : probes) {
    const std::uint8_t code = e5m2 ? fp32ToFp8E5M2(probe) : fp32ToFp8E4M3(probe);
    const std::uint8_t expected = referenceFp8(format, probe);
    if (std::isnan(probe)) {
      ASSERT_TRUE(std::isnan(referenceFp8Value(format, code))) << probe;
      ASSERT_EQ(code & 0x80, expected & 0x80) << probe;
    } else {
      ASSERT_EQ(code, expected) << std::hexfloat << probe;
    }
  }
}

TEST_P(Fp8Codes, ConversionSaturatesAtTheLargestFiniteValue) {
  // The conversions themselves (numeric.h); through encode() the block scale keeps every finite value
  // in range, so saturation shows only here.
  if (GetParam() == WireFormat::Fp8E4M3) {
    EXPECT_EQ(fp32ToFp8E4M3(500.0f), 0x7E);   // 448
    EXPECT_EQ(fp32ToFp8E4M3(-1e30f), 0xFE);   // -448
    EXPECT_EQ(fp32ToFp8E4M3(463.99f), 0x7E);  // would round to 448 anyway
    EXPECT_EQ(fp32ToFp8E4M3(FLT_MAX), 0x7E);
  } else {
    EXPECT_EQ(fp32ToFp8E5M2(1e5f), 0x7B);  // 57344
    EXPECT_EQ(fp32ToFp8E5M2(-1e5f), 0xFB);
    EXPECT_EQ(fp32ToFp8E5M2(61439.0f), 0x7B);
    EXPECT_EQ(fp32ToFp8E5M2(FLT_MAX), 0x7B);
  }
}

TEST_P(Fp8Codes, FiniteInputsThatThePrescalePushesPastFp32AreOverflows) {
  // v = x · prescale = Inf for a finite x: the only way a finite input leaves an fp8 block's range,
  // since the block scale follows the finite |v|. It encodes as Inf's code (e5m2 Inf, e4m3 NaN).
  const WireFormat format = GetParam();
  const std::vector<float> in = {3e38f, -3e38f, 1.0f, 2.0f};
  std::vector<std::uint8_t> codes(in.size());
  float scale = 0.0f;
  const EncodeStats stats =
      encode(format, in.data(), in.size(), codes.data(), &scale, {.prescale = 4.0f, .block = in.size()});
  EXPECT_EQ(scale, 8.0f / wireMax(format));  // from the finite |v| only
  EXPECT_EQ(stats.overflow, 2u);
  EXPECT_EQ(stats.nan, 0u);
  EXPECT_EQ(codes[0], format == WireFormat::Fp8E5M2 ? 0x7C : 0x7F);
  EXPECT_EQ(codes[3], maxCode(format));  // 8 / scale is max (within an fp32 ulp)
}

INSTANTIATE_TEST_SUITE_P(Fp8, Fp8Codes, ::testing::Values(WireFormat::Fp8E4M3, WireFormat::Fp8E5M2),
                         [](const auto& test) { return std::string(name(test.param)); });

// ---------------------------------------------------------------------------------------------------
// fp8 block scaling

// Relative half-ulp bound of each format's normal range, and the absolute half-quantum of its subnormals
// (in units of the block scale).
//
// Encode stores q = fl(v · fl(1 / scale)) rounded to fp8; decode returns fl(fl(code · scale) · postscale). In
// the normal range round-to-nearest moves q by at most half an ulp, 2^-(m+1)·2^e <= 2^-(m+1)·|q| with
// m stored mantissa bits: 2^-4 for e4m3 and 2^-3 for e5m2. Below the smallest normal (2^-6, 2^-14) the
// step is the subnormal quantum (2^-9, 2^-16) and the error at most half of it. Multiplying back by the
// same fp32 scale cancels the scale (its own rounding does not matter). On top come at most six fp32
// roundings of 2^-24 relative each (1/N itself, x·prescale, 1 / scale, v · inverse, ·scale, ·postscale)
// and their products with the fp8 error: 8·2^-24·|x| covers them.
struct Fp8Bound {
  double relative;      // normal range, relative to |v|
  double min_normal;    // |q| below this is subnormal
  double half_quantum;  // subnormal range, absolute in units of scale
};

Fp8Bound boundOf(WireFormat format) {
  return format == WireFormat::Fp8E4M3 ? Fp8Bound{0x1p-4, 0x1p-6, 0x1p-10}
                                       : Fp8Bound{0x1p-3, 0x1p-14, 0x1p-17};
}

// Largest |x · prescale| over the finite elements of each block, divided by max: the scale the header
// promises (1 for an all-zero block), computed here with std::fabs and float arithmetic.
std::vector<float> referenceScales(WireFormat format, const std::vector<float>& in, std::size_t block,
                                   float prescale) {
  std::vector<float> scales;
  for (std::size_t begin = 0; begin < in.size(); begin += block) {
    float amax = 0.0f;
    for (std::size_t i = begin; i < std::min(in.size(), begin + block); ++i) {
      const float v = std::fabs(in[i] * prescale);
      if (std::isfinite(v)) amax = std::max(amax, v);
    }
    const float scale = amax / wireMax(format);
    scales.push_back(scale >= FLT_MIN ? scale : 1.0f);
  }
  return scales;
}

void expectWithinBound(WireFormat format, const std::vector<float>& in, const std::vector<float>& out,
                       const std::vector<float>& scales, std::size_t block, double factor) {
  const Fp8Bound bound = boundOf(format);
  for (std::size_t i = 0; i < in.size(); ++i) {
    const double x = in[i];
    if (!std::isfinite(x)) continue;
    const double scale =
        static_cast<double>(scales[i / block]) * factor;  // in units of x (factor undoes the prescale)
    const double q = std::fabs(x) / scale;
    const double allowed =
        (q >= bound.min_normal ? bound.relative * std::fabs(x) : bound.half_quantum * scale) +
        0x1p-21 * std::fabs(x);
    ASSERT_LE(std::fabs(static_cast<double>(out[i]) - x), allowed)
        << "element " << i << " x=" << x << " out=" << out[i] << " scale=" << scale;
  }
}

std::vector<float> randomGradients(std::size_t count, std::uint64_t seed, int lo = -30, int hi = 10) {
  Random random{seed};
  std::vector<float> values(count);
  for (float& value : values) value = random.logUniform(lo, hi);
  return values;
}

class WireFp8Scaling : public ::testing::TestWithParam<WireFormat> {};

TEST_P(WireFp8Scaling, ScalesAreAmaxOverMaxPerBlockIncludingAShortLastBlock) {
  const WireFormat format = GetParam();
  const std::size_t block = 128;
  std::vector<float> in = randomGradients(1000, 1);  // 7 full blocks and one of 104
  const std::size_t blocks = scaleCount(format, in.size(), block);
  ASSERT_EQ(blocks, 8u);
  std::vector<std::uint8_t> codes(in.size());
  std::vector<float> scales(blocks), out(in.size());
  const EncodeStats stats =
      encode(format, in.data(), in.size(), codes.data(), scales.data(), {.block = block});
  EXPECT_EQ(stats.overflow, 0u);
  EXPECT_EQ(stats.nan, 0u);
  const std::vector<float> expected = referenceScales(format, in, block, 1.0f);
  for (std::size_t b = 0; b < blocks; ++b) EXPECT_EQ(scales[b], expected[b]) << b;
  decode(format, codes.data(), scales.data(), in.size(), out.data(), 1.0f, block);
  expectWithinBound(format, in, out, scales, block, 1.0);
}

TEST_P(WireFp8Scaling, AllZeroBlockHasScaleOneAndDecodesToZeros) {
  const WireFormat format = GetParam();
  std::vector<float> in(300, 0.0f);
  for (std::size_t i = 0; i < 100; ++i) in[i] = static_cast<float>(i) - 50.0f;  // block 0 non-zero
  in[150] = -0.0f;
  std::vector<std::uint8_t> codes(in.size());
  std::vector<float> scales(3), out(in.size(), 7.0f);
  encode(format, in.data(), in.size(), codes.data(), scales.data(), {.block = 100});
  EXPECT_EQ(scales[0], 50.0f / wireMax(format));
  EXPECT_EQ(scales[1], 1.0f);
  EXPECT_EQ(scales[2], 1.0f);
  decode(format, codes.data(), scales.data(), in.size(), out.data(), 1.0f, 100);
  for (std::size_t i = 100; i < 300; ++i) {
    EXPECT_EQ(out[i], 0.0f) << i;
    EXPECT_EQ(std::signbit(out[i]), i == 150) << i;
  }
}

TEST_P(WireFp8Scaling, TinyBlocksWhoseScaleWouldBeSubnormalUseScaleOne) {
  // amax / max below FLT_MIN: a subnormal (or zero) scale would lose its precision or divide by zero.
  const WireFormat format = GetParam();
  const std::vector<float> in = {1e-40f, -2e-40f, FLT_MIN, 0.0f};
  std::vector<std::uint8_t> codes(in.size());
  float scale = 0.0f;
  const EncodeStats stats = encode(format, in.data(), in.size(), codes.data(), &scale, {.block = in.size()});
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(stats.overflow, 0u);
  EXPECT_EQ(codes[0], 0x00);  // far below the fp8 subnormals: ±0
  EXPECT_EQ(codes[1], 0x80);
}

TEST_P(WireFp8Scaling, InfAndNanAreLeftOutOfTheScale) {
  const WireFormat format = GetParam();
  const bool e5m2 = format == WireFormat::Fp8E5M2;
  std::vector<float> in = {1.0f, -4.0f, INFINITY, 2.0f, NAN, 0.5f, -INFINITY, 3.0f};
  std::vector<std::uint8_t> codes(in.size());
  std::vector<float> scales(2), out(in.size());
  const EncodeStats stats = encode(format, in.data(), in.size(), codes.data(), scales.data(), {.block = 4});
  EXPECT_EQ(scales[0], 4.0f / wireMax(format));
  EXPECT_EQ(scales[1], 3.0f / wireMax(format));
  EXPECT_EQ(stats.nan, 1u);
  EXPECT_EQ(stats.overflow, 0u);
  EXPECT_EQ(codes[1], maxCode(format) | 0x80);  // -4 is the block's amax: -max
  EXPECT_EQ(codes[2], e5m2 ? 0x7C : 0x7F);
  EXPECT_EQ(codes[6], e5m2 ? 0xFC : 0xFF);
  decode(format, codes.data(), scales.data(), in.size(), out.data(), 1.0f, 4);
  EXPECT_EQ(out[1], -4.0f);
  EXPECT_EQ(out[7], 3.0f);
  EXPECT_TRUE(std::isnan(out[4]));
  if (e5m2) {
    EXPECT_EQ(out[2], INFINITY);
    EXPECT_EQ(out[6], -INFINITY);
  } else {
    EXPECT_TRUE(std::isnan(out[2]));
    EXPECT_TRUE(std::isnan(out[6]));
  }
  expectWithinBound(format, in, out, scales, 4, 1.0);
}

TEST_P(WireFp8Scaling, BlockOfOneStoresEveryValueAtTheLargestCode) {
  const WireFormat format = GetParam();
  const std::vector<float> in = randomGradients(257, 2);
  std::vector<std::uint8_t> codes(in.size());
  std::vector<float> scales(in.size()), out(in.size());
  encode(format, in.data(), in.size(), codes.data(), scales.data(), {.block = 1});
  decode(format, codes.data(), scales.data(), in.size(), out.data(), 1.0f, 1);
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(scales[i], std::fabs(in[i]) / wireMax(format)) << i;
    EXPECT_EQ(codes[i] & 0x7F, maxCode(format)) << i;  // |x| / (|x| / max) rounds to max: within 464 / 61440
    EXPECT_EQ(codes[i] >> 7, std::signbit(in[i]) ? 1 : 0) << i;
  }
  expectWithinBound(format, in, out, scales, 1, 1.0);
}

TEST_P(WireFp8Scaling, RoundTripErrorIsWithinHalfAnUlpTimesTheScale) {
  // Magnitudes over 2^-30 .. 2^10 put many elements of each block into the fp8 subnormal range too.
  const WireFormat format = GetParam();
  for (std::size_t block : {std::size_t{32}, std::size_t{128}, std::size_t{1000}}) {
    std::vector<float> in = randomGradients(100003, block);
    std::vector<std::uint8_t> codes(in.size());
    std::vector<float> scales(scaleCount(format, in.size(), block)), out(in.size());
    const EncodeStats stats =
        encode(format, in.data(), in.size(), codes.data(), scales.data(), {.block = block});
    decode(format, codes.data(), scales.data(), in.size(), out.data(), 1.0f, block);
    EXPECT_EQ(stats.overflow, 0u);
    expectWithinBound(format, in, out, scales, block, 1.0);
  }
}

TEST_P(WireFp8Scaling, LargestElementOfABlockLandsNearMaxWithoutCountingAnOverflow) {
  // scale = fl(amax / max) is rounded, so amax · fl(1 / scale) lands within two fp32 ulps of max on either
  // side; above max it is clamped by the conversion to the same code rounding gives, and is no overflow.
  // Check the data really has such blocks, so that the zero overflow count means something.
  const WireFormat format = GetParam();
  const std::vector<float> in = randomGradients(1 << 16, 3, -4, 4);
  const std::size_t block = 64;
  const std::vector<float> scales = referenceScales(format, in, block, 1.0f);
  std::size_t above = 0;
  for (std::size_t b = 0; b < scales.size(); ++b) {
    float amax = 0.0f;
    for (std::size_t i = b * block; i < (b + 1) * block; ++i) amax = std::max(amax, std::fabs(in[i]));
    above += amax * (1.0f / scales[b]) > wireMax(format) ? 1u : 0u;
  }
  EXPECT_GT(above, 0u);
  std::vector<std::uint8_t> codes(in.size());
  std::vector<float> got(scales.size());
  const EncodeStats stats = encode(format, in.data(), in.size(), codes.data(), got.data(), {.block = block});
  EXPECT_EQ(stats.overflow, 0u);
  EXPECT_EQ(got, scales);
}

TEST_P(WireFp8Scaling, CodesAreTheConversionOfVTimesTheRoundedReciprocalOfTheScale) {
  // The exact arithmetic the CUDA kernels share: v = fl(x · prescale), q = fl(v · fl(1 / scale)),
  // code = fp8(q). On random data first, then on values picked next to fp8 halfway points where a
  // true division v / scale would round to the other code.
  const WireFormat format = GetParam();
  const std::vector<float> in = randomGradients(100000, 8);
  const float prescale = 1.0f / 6.0f;
  std::vector<std::uint8_t> codes(in.size());
  std::vector<float> scales(scaleCount(format, in.size(), 128));
  encode(format, in.data(), in.size(), codes.data(), scales.data(), {.prescale = prescale});
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(codes[i], referenceFp8(format, (in[i] * prescale) * (1.0f / scales[i / 128]))) << i;
  }

  // One block whose amax is 1, so scale = fl(1 / max), which is inexact.
  const float scale = 1.0f / wireMax(format);
  std::vector<float> block = {1.0f};
  std::vector<std::uint8_t> expected = {0};
  for (int code = 0x08; code < 0x7B; ++code) {  // normal range of both formats, below max
    const double halfway = (referenceFp8Value(format, static_cast<std::uint8_t>(code)) +
                            referenceFp8Value(format, static_cast<std::uint8_t>(code + 1))) /
                           2;
    float v = static_cast<float>(halfway * static_cast<double>(scale));
    for (int step = 0; step < 4; ++step) v = std::nextafter(v, 0.0f);
    for (int step = 0; step < 8; ++step, v = std::nextafter(v, INFINITY)) {
      const std::uint8_t multiplied = referenceFp8(format, v * (1.0f / scale));
      if (multiplied != referenceFp8(format, v / scale)) {
        block.push_back(v);
        expected.push_back(multiplied);
      }
    }
  }
  ASSERT_GT(block.size(), 1u);
  std::vector<std::uint8_t> got(block.size());
  float got_scale = 0.0f;
  encode(format, block.data(), block.size(), got.data(), &got_scale, {.block = block.size()});
  ASSERT_EQ(got_scale, scale);
  for (std::size_t i = 1; i < block.size(); ++i) EXPECT_EQ(got[i], expected[i]) << std::hexfloat << block[i];
}

TEST_P(WireFp8Scaling, PrescaleThenPostscaleRecoversTheValues) {
  // Prescale 1/N then postscale N; N = 8 is exact, N = 6 adds two fp32 roundings (1/6 itself, then
  // the products), which the slack covers. The scale is in units of x·prescale: divide by prescale.
  const WireFormat format = GetParam();
  const std::vector<float> in = randomGradients(10007, 4);
  for (float n : {8.0f, 6.0f}) {
    const float prescale = 1.0f / n;
    std::vector<std::uint8_t> codes(in.size());
    std::vector<float> scales(scaleCount(format, in.size(), 128)), out(in.size());
    encode(format, in.data(), in.size(), codes.data(), scales.data(), {.prescale = prescale});
    EXPECT_EQ(scales, referenceScales(format, in, 128, prescale));
    decode(format, codes.data(), scales.data(), in.size(), out.data(), n);
    expectWithinBound(format, in, out, scales, 128, 1.0 / static_cast<double>(prescale));
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8, WireFp8Scaling, ::testing::Values(WireFormat::Fp8E4M3, WireFormat::Fp8E5M2),
                         [](const auto& test) { return std::string(name(test.param)); });

TEST(WireHalf, PrescaleThenPostscaleRecoversTheValues) {
  // fp16: half an ulp is 2^-11 relative in the normal range (|v| >= 2^-14), 2^-25 absolute below;
  // bf16: 2^-8 relative (its range covers every fp32 normal).
  const std::vector<float> in = randomGradients(10007, 5, -20, 14);
  const float n = 4.0f;
  for (WireFormat format : {WireFormat::Fp16, WireFormat::Bf16}) {
    std::vector<std::uint16_t> codes(in.size());
    std::vector<float> out(in.size());
    const EncodeStats stats =
        encode(format, in.data(), in.size(), codes.data(), nullptr, {.prescale = 1.0f / n});
    EXPECT_EQ(stats.overflow, 0u);
    decode(format, codes.data(), nullptr, in.size(), out.data(), n);
    for (std::size_t i = 0; i < in.size(); ++i) {
      const double x = in[i];
      const double v = x / static_cast<double>(n);
      double allowed =
          format == WireFormat::Fp16
              ? (std::fabs(v) >= 0x1p-14 ? 0x1p-11 * std::fabs(x) : 0x1p-25 * static_cast<double>(n))
              : 0x1p-8 * std::fabs(x);
      ASSERT_LE(std::fabs(static_cast<double>(out[i]) - x), allowed) << name(format) << " " << x;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Parallel execution

// A large buffer with some of everything: random magnitudes, zeros, NaN, ±Inf, and values that overflow
// fp16. The block (100) divides neither the count nor a chunk, so chunk alignment is exercised. Under a
// sanitizer a fifth of the buffer, still 8 MB of input for the chunks of every executor.
TEST(WireParallel, EveryExecutorGivesTheSameBitsAndCounts) {
  const std::size_t count = gradscope::testing::kSanitized ? 2'000'037 : 10'000'037;
  std::vector<float> in = randomGradients(count, 6, -30, 18);
  Random random{7};
  for (int k = 0; k < 1000; ++k) {
    const std::size_t i = random.next() % count;
    const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e6f};
    in[i] = specials[k % 6];
  }
  CpuExecutor one(1), two(2), three(3);
  CpuExecutor* executors[] = {&one, &two, &three, &CpuExecutor::shared()};
  const std::size_t block = 100;
  for (WireFormat format : kWireFormats) {
    SCOPED_TRACE(std::string(name(format)));
    const std::size_t bytes = count * wireElementBytes(format);
    const std::size_t scale_count = scaleCount(format, count, block);
    std::vector<unsigned char> first_codes;
    std::vector<float> first_scales, first_out;
    EncodeStats first_stats;
    for (CpuExecutor* executor : executors) {
      std::vector<unsigned char> codes(bytes, 0xAA);
      std::vector<float> scales(scale_count, -1.0f), out(count, -1.0f);
      const EncodeStats stats = encode(format, in.data(), count, codes.data(), scales.data(),
                                       {.prescale = 0.25f, .block = block}, *executor);
      decode(format, codes.data(), scales.data(), count, out.data(), 4.0f, block, *executor);
      if (executor == &one) {
        // The counts by their definition: NaN inputs; finite inputs whose v rounds past the largest
        // value (fp16: |v| >= 65520; bf16: |v| >= (2 - 2^-8)·2^127) or, for fp8, whose v is not finite.
        std::uint64_t nan = 0, overflow = 0;
        for (float x : in) {
          const float v = x * 0.25f;
          nan += std::isnan(x) ? 1u : 0u;
          if (!std::isfinite(x)) continue;
          switch (format) {
            case WireFormat::Fp16: overflow += std::fabs(v) >= 65520.0f ? 1u : 0u; break;
            case WireFormat::Bf16: overflow += std::fabs(v) >= floatOf(0x7F7F8000u) ? 1u : 0u; break;
            default: overflow += std::isfinite(v) ? 0u : 1u; break;
          }
        }
        EXPECT_GT(nan, 0u);
        EXPECT_EQ(stats.nan, nan);
        EXPECT_EQ(stats.overflow, overflow);
        if (format == WireFormat::Fp16) {
          EXPECT_GT(stats.overflow, 0u);
        }
        first_codes = std::move(codes);
        first_scales = std::move(scales);
        first_out = std::move(out);
        first_stats = stats;
        continue;
      }
      EXPECT_EQ(stats.overflow, first_stats.overflow) << executor->threads();
      EXPECT_EQ(stats.nan, first_stats.nan) << executor->threads();
      EXPECT_TRUE(codes == first_codes) << executor->threads();
      EXPECT_TRUE(scales == first_scales) << executor->threads();  // never NaN
      EXPECT_EQ(std::memcmp(out.data(), first_out.data(), out.size() * sizeof(float)), 0);
    }
  }
}

}  // namespace
}  // namespace gradscope::methods

// ---- Every fp16 encoder this CPU can run gives the same bits and counts --------------------------------

namespace {

using gradscope::WireFormat;

TEST(WireFp16Encoders, HardwareAndSoftwareEncodersAgreeBitForBit) {
  using namespace gradscope::methods;
  // Every 4099th fp32 bit pattern (all exponents, NaNs, Infs, subnormals) plus a stretch that overflows.
  std::vector<float> values;
  for (std::uint64_t bits = 0; bits < (1ull << 32); bits += 4099)
    values.push_back(bitsFloat(static_cast<std::uint32_t>(bits)));
  for (int i = 0; i < 5000; ++i) values.push_back(65000.0f + static_cast<float>(i));
  const float prescale = 0.75f;
  std::vector<std::uint16_t> expected(values.size());
  std::uint64_t expected_overflow = 0, expected_nan = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float v = values[i] * prescale;
    expected[i] = fp32ToFp16(v);
    const bool finite = isFiniteFloat(values[i]);
    expected_overflow += finite && (expected[i] & 0x7FFFu) == 0x7C00u;
    expected_nan += values[i] != values[i];
  }
  int ran = 0;
  for (const char* kernel : {"avx512", "avx2", "portable"}) {
    if (!gradscope::methods::testing::useIsaForTesting(kernel)) continue;
    ++ran;
    std::vector<std::uint16_t> out(values.size());
    const EncodeStats stats = encode(WireFormat::Fp16, values.data(), values.size(), out.data(), nullptr,
                                     EncodeOptions{prescale, 128});
    gradscope::methods::testing::useIsaForTesting("");
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < values.size(); ++i) mismatches += out[i] != expected[i];
    EXPECT_EQ(mismatches, 0u) << kernel;
    EXPECT_EQ(stats.overflow, expected_overflow) << kernel;
    EXPECT_EQ(stats.nan, expected_nan) << kernel;
  }
  EXPECT_GE(ran, 1);
  EXPECT_FALSE(gradscope::methods::testing::useIsaForTesting("no-such-kernel"));
}

}  // namespace

// ---- Every fp8 encoder this CPU can run gives the same codes, scales and counts -------------------

namespace {

struct Fp8Encoding {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
  gradscope::methods::EncodeStats stats;
};

Fp8Encoding encodeWith(const char* kernels, gradscope::WireFormat format, const std::vector<float>& in,
                       float prescale, std::size_t block) {
  using namespace gradscope::methods;
  Fp8Encoding result;
  result.codes.assign(in.size(), 0xAB);
  result.scales.assign(scaleCount(format, in.size(), block), -1.0f);
  EXPECT_TRUE(gradscope::methods::testing::useIsaForTesting(kernels));
  result.stats = encode(format, in.data(), in.size(), result.codes.data(), result.scales.data(),
                        EncodeOptions{prescale, block});
  gradscope::methods::testing::useIsaForTesting("");
  return result;
}

TEST(WireFp8Encoders, VectorAndPortableEncodersAgreeBitForBit) {
  using namespace gradscope::methods;
  if (!gradscope::methods::testing::useIsaForTesting("avx512")) {
    GTEST_SKIP() << "this CPU has no AVX-512F/BW: only the portable fp8 encoder runs here";
  }
  gradscope::methods::testing::useIsaForTesting("");
  // Every 65537th fp32 bit pattern (all exponents, NaNs, Infs, subnormals), then values that land on
  // and next to every fp8 halfway point once divided by the scale of a block whose amax is 1, then
  // random normal-ish gradients with a few huge and tiny outliers.
  std::vector<float> values;
  for (std::uint64_t bits = 0; bits < (1ull << 32); bits += 65537)
    values.push_back(bitsFloat(static_cast<std::uint32_t>(bits)));
  for (std::uint32_t bits = 0x3A000000u; bits < 0x3F800000u; bits += 0x3FFFu) {
    values.push_back(bitsFloat(bits));
    values.push_back(-bitsFloat(bits + 1));
  }
  std::uint64_t state = 0x243F6A8885A308D3ull;
  for (int i = 0; i < 100000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double unit = static_cast<double>(state >> 11) * 0x1p-53;
    float value = static_cast<float>((unit - 0.5) * 1e-3);
    if (i % 997 == 0) value *= 1e6f;
    if (i % 1009 == 0) value *= 1e-30f;
    values.push_back(value);
  }
  for (WireFormat format : {WireFormat::Fp8E4M3, WireFormat::Fp8E5M2}) {
    // Blocks that are whole, partial and single vectors, shorter than one, and not multiples of 16.
    for (std::size_t block : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{100},
                              std::size_t{128}, std::size_t{8192}}) {
      for (float prescale : {1.0f, 0.125f, 1.0f / 3.0f, 1e30f}) {
        const Fp8Encoding expected = encodeWith("portable", format, values, prescale, block);
        const Fp8Encoding actual = encodeWith("avx512", format, values, prescale, block);
        std::size_t mismatches = 0;
        for (std::size_t i = 0; i < values.size(); ++i) mismatches += actual.codes[i] != expected.codes[i];
        EXPECT_EQ(mismatches, 0u) << name(format) << " block " << block << " prescale " << prescale;
        EXPECT_EQ(
            std::memcmp(actual.scales.data(), expected.scales.data(), expected.scales.size() * sizeof(float)),
            0)
            << name(format) << " block " << block << " prescale " << prescale;
        EXPECT_EQ(actual.stats.overflow, expected.stats.overflow) << name(format) << " block " << block;
        EXPECT_EQ(actual.stats.nan, expected.stats.nan) << name(format) << " block " << block;
      }
    }
  }
  EXPECT_FALSE(gradscope::methods::testing::useIsaForTesting("no-such-kernel"));
}

}  // namespace

// ---- addCodes: every hop of a narrow-wire sum ----------------------------------------------------------

namespace {

template <typename Code>
std::vector<Code> randomCodes(std::size_t count, std::uint64_t seed) {
  std::vector<Code> codes(count);
  for (Code& code : codes) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    code = static_cast<Code>(seed >> 40);
  }
  return codes;
}

std::uint32_t referenceAdd(gradscope::WireFormat format, std::uint32_t a, std::uint32_t b) {
  using namespace gradscope::methods;
  switch (format) {
    case WireFormat::Fp16:
      return fp32ToFp16(fp16ToFp32(static_cast<std::uint16_t>(b)) +
                        fp16ToFp32(static_cast<std::uint16_t>(a)));
    case WireFormat::Bf16:
      return fp32ToBf16(bf16ToFp32(static_cast<std::uint16_t>(b)) +
                        bf16ToFp32(static_cast<std::uint16_t>(a)));
    case WireFormat::Fp8E4M3:
      return fp32ToFp8E4M3(fp8E4M3ToFp32(static_cast<std::uint8_t>(b)) +
                           fp8E4M3ToFp32(static_cast<std::uint8_t>(a)));
    case WireFormat::Fp8E5M2:
      return fp32ToFp8E5M2(fp8E5M2ToFp32(static_cast<std::uint8_t>(b)) +
                           fp8E5M2ToFp32(static_cast<std::uint8_t>(a)));
  }
  return 0;
}

template <typename Code>
std::size_t addCodesMismatches(gradscope::WireFormat format, std::size_t count) {
  const std::vector<Code> in = randomCodes<Code>(count, 11);
  std::vector<Code> inout = randomCodes<Code>(count, 12);
  const std::vector<Code> before = inout;
  gradscope::methods::addCodes(format, in.data(), inout.data(), count);
  // Codes compare bit for bit, except that where both operands are NaN either payload may come through
  // (the compiler may commute the addition); the result must then be a NaN.
  const auto isNan = [format](std::uint32_t code) {
    switch (format) {
      case gradscope::WireFormat::Fp16:
        return std::isnan(gradscope::methods::fp16ToFp32(static_cast<std::uint16_t>(code)));
      case gradscope::WireFormat::Bf16:
        return std::isnan(gradscope::methods::bf16ToFp32(static_cast<std::uint16_t>(code)));
      case gradscope::WireFormat::Fp8E4M3:
        return std::isnan(gradscope::methods::fp8E4M3ToFp32(static_cast<std::uint8_t>(code)));
      case gradscope::WireFormat::Fp8E5M2:
        return std::isnan(gradscope::methods::fp8E5M2ToFp32(static_cast<std::uint8_t>(code)));
    }
    return false;
  };
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t expected = referenceAdd(format, in[i], before[i]);
    if (isNan(in[i]) && isNan(before[i])) {
      mismatches += isNan(inout[i]) ? 0u : 1u;
    } else {
      mismatches += inout[i] != expected ? 1u : 0u;
    }
  }
  return mismatches;
}

TEST(WireAddCodes, EveryKernelAddsInFp32AndRoundsBackBitForBit) {
  using namespace gradscope::methods;
  // Random code pairs cover every class (zeros, subnormals, normals, Inf, NaN); 100003 is not a
  // multiple of any vector length, so the tails run too.
  int ran = 0;
  for (const char* kernel : {"avx512", "avx2", "portable"}) {
    if (!gradscope::methods::testing::useIsaForTesting(kernel)) continue;
    ++ran;
    EXPECT_EQ(addCodesMismatches<std::uint16_t>(WireFormat::Fp16, 100003), 0u) << kernel;
    gradscope::methods::testing::useIsaForTesting("");
  }
  EXPECT_GE(ran, 1);
  EXPECT_EQ(addCodesMismatches<std::uint16_t>(WireFormat::Bf16, 100003), 0u);
  EXPECT_EQ(addCodesMismatches<std::uint8_t>(WireFormat::Fp8E4M3, 100003), 0u);
  EXPECT_EQ(addCodesMismatches<std::uint8_t>(WireFormat::Fp8E5M2, 100003), 0u);
}

TEST(WireAddCodes, SmallIntegersAddExactlyAndFp8Saturates) {
  using namespace gradscope::methods;
  std::vector<std::uint16_t> a = {fp32ToFp16(3.0f), fp32ToFp16(-7.0f), fp32ToFp16(1024.0f)};
  std::vector<std::uint16_t> b = {fp32ToFp16(4.0f), fp32ToFp16(2.0f), fp32ToFp16(1.0f)};
  addCodes(WireFormat::Fp16, a.data(), b.data(), b.size());
  EXPECT_EQ(fp16ToFp32(b[0]), 7.0f);
  EXPECT_EQ(fp16ToFp32(b[1]), -5.0f);
  EXPECT_EQ(fp16ToFp32(b[2]), 1025.0f);
  std::uint8_t x = fp32ToFp8E4M3(448.0f), y = fp32ToFp8E4M3(448.0f);
  addCodes(WireFormat::Fp8E4M3, &x, &y, 1);
  EXPECT_EQ(fp8E4M3ToFp32(y), 448.0f);  // saturates, never NaN
  EXPECT_NO_THROW(addCodes(WireFormat::Bf16, nullptr, nullptr, 0));
  EXPECT_THROW(addCodes(WireFormat::Bf16, nullptr, &x, 1), gradscope::Error);
}

}  // namespace
