// delayed.h (async/dga<K>'s correction) on the CPU, against the formula written out with element.h's loads
// and stores: every element's bits, in place and not, for the four dtypes; what it refuses. The GPU's
// bits against these are in methods_cuda_test.cc.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/common/error.h"
#include "gradscope/methods/delayed.h"
#include "gradscope/methods/element.h"

// A namespace of its own: the unit tests are built as a unity build, beside methods_cuda_test.cc's Bytes.
namespace gradscope::methods::delayed_test {
namespace {

using Bytes = std::vector<std::byte>;

// Values of both signs over many binades, and some zeros: cancellation and rounding in every dtype.
Bytes randomValues(DType dtype, std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> exponent(-8.0, 8.0);
  Bytes data(count * sizeOf(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    const double magnitude = rng() % 16 == 0 ? 0.0 : std::exp2(exponent(rng));
    storeElement(dtype, data.data(), i, rng() % 2 == 0 ? magnitude : -magnitude);
  }
  return data;
}

struct Expected {
  Bytes out, older;
};

// The definition, one element at a time: fp64 from the stored values, one rounding to the dtype.
Expected direct(DType dtype, const Bytes& gradient, const Bytes& older, const Bytes& sum, std::size_t count,
                double ranks) {
  Expected expected{Bytes(gradient.size()), gradient};
  for (std::size_t i = 0; i < count; ++i) {
    const double value = loadElement(dtype, sum.data(), i) + ranks * (loadElement(dtype, gradient.data(), i) -
                                                                      loadElement(dtype, older.data(), i));
    storeElement(dtype, expected.out.data(), i, value);
  }
  return expected;
}

TEST(DelayedCorrection, EveryElementIsTheFormulaRoundedOnce) {
  constexpr std::size_t kCount = 1031;
  std::uint32_t seed = 0;
  for (const DType dtype : {DType::Fp32, DType::Fp64, DType::Fp16, DType::Bf16}) {
    for (const double ranks : {1.0, 3.0, 1024.0}) {
      SCOPED_TRACE(std::string(name(dtype)) + " ranks " + std::to_string(ranks));
      const Bytes gradient = randomValues(dtype, kCount, ++seed);
      const Bytes sum = randomValues(dtype, kCount, ++seed);
      const Bytes older_before = randomValues(dtype, kCount, ++seed);
      const Expected expected = direct(dtype, gradient, older_before, sum, kCount, ranks);

      Bytes older = older_before;
      Bytes out(gradient.size(), std::byte{0xA5});
      delayedCorrection(dtype, gradient.data(), older.data(), sum.data(), out.data(), kCount, ranks);
      EXPECT_EQ(out, expected.out);
      EXPECT_EQ(older, expected.older) << "older holds the gradient afterwards";

      // In place: the gradient's buffer receives the result.
      older = older_before;
      Bytes in_place = gradient;
      delayedCorrection(dtype, in_place.data(), older.data(), sum.data(), in_place.data(), kCount, ranks);
      EXPECT_EQ(in_place, expected.out) << "in place";
      EXPECT_EQ(older, expected.older) << "in place";
    }
  }
}

// Sums of small integers are exact, so the corrected value is too: the telescoping the strategy promises.
TEST(DelayedCorrection, OneRankReturnsItsOwnNewestGradient) {
  const std::vector<float> gradient{3, -2, 0.5f, 7};
  std::vector<float> older{1, 1, 1, 1};
  const std::vector<float> sum = older;  // one rank: the sum of step t-K is that step's gradient
  std::vector<float> out(4);
  delayedCorrection(DType::Fp32, gradient.data(), older.data(), sum.data(), out.data(), 4, 1.0);
  EXPECT_EQ(out, gradient);
  EXPECT_EQ(older, gradient);
}

TEST(DelayedCorrection, RefusesIntegersWithTheReason) {
  std::vector<std::int32_t> a(4), b(4), c(4), d(4);
  try {
    delayedCorrection(DType::Int32, a.data(), b.data(), c.data(), d.data(), 4, 2.0);
    FAIL() << "int32 was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("not fp32, fp64, fp16 or bf16"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace gradscope::methods::delayed_test
