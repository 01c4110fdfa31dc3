// Local multi-tensor sums and error metrics: exact results on verifiable inputs, the documented
// summation order of every method bit for bit (against scalar references written here), the error
// bounds on random inputs, determinism across thread counts, and the refusals.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "dispatch.h"
#include "gradscope/common/error.h"
#include "gradscope/methods/error_metrics.h"
#include "gradscope/methods/local_sum.h"
#include "gradscope/methods/numeric.h"
#include "sanitized.h"

namespace gradscope::methods {

namespace {

using Sizes = std::initializer_list<std::size_t>;

using gradscope::testing::kSanitized;

// Elements for the tests of the parallel path: above CpuExecutor::kParallelBytes for every dtype and K
// (the smallest case, fp16 with K = 1, touches 4 bytes per element), and not a multiple of any tile or
// vector width. Under a sanitizer a fifth of the full count, still 2.3 MiB for that case.
constexpr std::size_t kParallelCount = kSanitized ? 600'001 : 3'000'003;
static_assert(kParallelCount * 4 >= 2 * CpuExecutor::kParallelBytes);

constexpr DType kDTypes[] = {DType::Fp32, DType::Fp16, DType::Bf16, DType::Fp64};

// ---- Typed buffers ---------------------------------------------------------------------------------

// `count` elements of one supported type, written and read as double.
class Buffer {
 public:
  Buffer(DType dtype, std::size_t count) : dtype_(dtype), count_(count), bytes_(count * sizeOf(dtype) + 1) {}

  DType dtype() const { return dtype_; }
  std::size_t count() const { return count_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  void set(std::size_t i, double value) {
    switch (dtype_) {
      case DType::Fp32: store(i, static_cast<float>(value)); break;
      case DType::Fp64: store(i, value); break;
      case DType::Fp16: store(i, fp32ToFp16(static_cast<float>(value))); break;
      case DType::Bf16: store(i, fp32ToBf16(static_cast<float>(value))); break;
      default: FAIL();
    }
  }
  double get(std::size_t i) const {
    switch (dtype_) {
      case DType::Fp32: return static_cast<double>(load<float>(i));
      case DType::Fp64: return load<double>(i);
      case DType::Fp16: return static_cast<double>(fp16ToFp32(load<std::uint16_t>(i)));
      case DType::Bf16: return static_cast<double>(bf16ToFp32(load<std::uint16_t>(i)));
      default: return 0;
    }
  }
  // The raw bits of element i (for bit-for-bit comparisons, NaN payloads included).
  std::uint64_t bits(std::size_t i) const {
    std::uint64_t value = 0;
    std::memcpy(&value, bytes_.data() + i * sizeOf(dtype_), sizeOf(dtype_));
    return value;
  }
  void setBits(std::size_t i, std::uint64_t value) {
    std::memcpy(bytes_.data() + i * sizeOf(dtype_), &value, sizeOf(dtype_));
  }

 private:
  template <class T>
  void store(std::size_t i, T value) {
    std::memcpy(bytes_.data() + i * sizeof(T), &value, sizeof(T));
  }
  template <class T>
  T load(std::size_t i) const {
    T value;
    std::memcpy(&value, bytes_.data() + i * sizeof(T), sizeof(T));
    return value;
  }

  DType dtype_;
  std::size_t count_;
  std::vector<std::byte> bytes_;  // one spare byte so data() is never null, even for count 0
};

std::vector<const void*> pointers(const std::vector<Buffer>& buffers) {
  std::vector<const void*> result;
  for (const Buffer& buffer : buffers) result.push_back(buffer.data());
  return result;
}

std::string label(LocalSumMethod method, DType dtype, std::size_t k, std::size_t count) {
  return std::string(strategyName(method)) + " " + std::string(name(dtype)) + " K=" + std::to_string(k) +
         " count=" + std::to_string(count);
}

// ---- Scalar references of the documented orders -------------------------------------------------------
//
// Written independently of the library: per element, in the accumulator type (fp32 for fp16/bf16, fp64
// for fp64), with numeric.h's conversions.

// Rounds an accumulator value to the element type, as a double of the stored value.
double roundTo(DType dtype, double value) {
  switch (dtype) {
    case DType::Fp32: return static_cast<double>(static_cast<float>(value));
    case DType::Fp16: return static_cast<double>(fp16ToFp32(fp32ToFp16(static_cast<float>(value))));
    case DType::Bf16: return static_cast<double>(bf16ToFp32(fp32ToBf16(static_cast<float>(value))));
    default: return value;
  }
}

// One addition in the accumulator type.
double add(DType dtype, double a, double b) {
  if (dtype == DType::Fp64) return a + b;
  return static_cast<double>(static_cast<float>(a) + static_cast<float>(b));
}
double subtract(DType dtype, double a, double b) {
  if (dtype == DType::Fp64) return a - b;
  return static_cast<double>(static_cast<float>(a) - static_cast<float>(b));
}

double referenceAddN(DType dtype, const std::vector<double>& x) {
  double acc = x[0];
  for (std::size_t k = 1; k < x.size(); ++k) acc = add(dtype, acc, x[k]);
  return roundTo(dtype, acc);
}

// Pairwise summation as a stack of (partial, size): push each input; merge the top two while they
// have the same size; at the end fold the stack from the top (smallest, most recent) down.
double referenceTree(DType dtype, const std::vector<double>& x) {
  std::vector<std::pair<double, std::size_t>> stack;
  for (double value : x) {
    stack.emplace_back(value, 1);
    while (stack.size() >= 2 && stack[stack.size() - 1].second == stack[stack.size() - 2].second) {
      const auto newer = stack.back();
      stack.pop_back();
      stack.back() = {add(dtype, stack.back().first, newer.first), stack.back().second * 2};
    }
  }
  double acc = stack.back().first;
  for (std::size_t i = stack.size() - 1; i-- > 0;) acc = add(dtype, stack[i].first, acc);
  return roundTo(dtype, acc);
}

// Another balanced order (split in halves recursively): the test uses it to show that the Tree check
// really tells orders apart.
double recursiveHalves(DType dtype, const std::vector<double>& x, std::size_t begin, std::size_t end) {
  if (end - begin == 1) return x[begin];
  const std::size_t middle = begin + (end - begin) / 2;
  return add(dtype, recursiveHalves(dtype, x, begin, middle), recursiveHalves(dtype, x, middle, end));
}

double referenceAccumulateN(DType dtype, const std::vector<double>& x) {
  double out = x[0];
  for (std::size_t k = 1; k < x.size(); ++k) out = roundTo(dtype, add(dtype, out, x[k]));
  return out;
}

double referenceKahan(DType dtype, const std::vector<double>& x) {
  double sum = x[0];
  double compensation = 0;
  for (std::size_t k = 1; k < x.size(); ++k) {
    const double y = subtract(dtype, x[k], compensation);
    const double t = add(dtype, sum, y);
    compensation = subtract(dtype, subtract(dtype, t, sum), y);
    sum = t;
  }
  return roundTo(dtype, sum);
}

double referenceOf(LocalSumMethod method, DType dtype, const std::vector<double>& x) {
  switch (method) {
    case LocalSumMethod::AddN: return referenceAddN(dtype, x);
    case LocalSumMethod::Tree: return referenceTree(dtype, x);
    case LocalSumMethod::AccumulateN: return referenceAccumulateN(dtype, x);
    case LocalSumMethod::Kahan: return referenceKahan(dtype, x);
  }
  return 0;
}

// Values whose sums depend on the order: random signs and exponents spread wide enough that the
// accumulator rounds (and, for 16-bit types, cancellation makes its rounding show after the final
// rounding to 16 bits), kept clear of overflow.
std::vector<Buffer> orderSensitiveInputs(DType dtype, std::size_t k, std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  const int spread = dtype == DType::Fp16 ? 12 : dtype == DType::Fp32 ? 20 : 60;
  std::uniform_int_distribution<int> exponent(dtype == DType::Fp16 ? -14 : -spread, spread / 2);
  std::bernoulli_distribution negative(0.5);
  std::vector<Buffer> inputs;
  for (std::size_t i = 0; i < k; ++i) {
    inputs.emplace_back(dtype, count);
    for (std::size_t e = 0; e < count; ++e)
      inputs.back().set(e, (negative(rng) ? -1.0 : 1.0) * std::ldexp(mantissa(rng), exponent(rng)));
  }
  return inputs;
}

// Values built to make the accumulator round at ties: ±big and ±tiny with big/tiny = 2^p (p the
// accumulator's precision), so big + tiny is a tie and cancellation of the bigs exposes what was
// rounded away, even after a final rounding to 16 bits.
std::vector<Buffer> cancellationInputs(DType dtype, std::size_t k, std::size_t count, std::uint32_t seed) {
  const int half_precision = dtype == DType::Fp64 ? 26 : 12;
  const double big = std::ldexp(1.0, dtype == DType::Fp64 ? 27 : 12);
  const double tiny = std::ldexp(1.0, -half_precision);
  const double choices[] = {big, big / 2, tiny, 3 * tiny, tiny, 3 * tiny, 5 * tiny, tiny};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 7);
  std::bernoulli_distribution negative(0.5);
  std::vector<Buffer> inputs;
  for (std::size_t i = 0; i < k; ++i) {
    inputs.emplace_back(dtype, count);
    for (std::size_t e = 0; e < count; ++e)
      inputs.back().set(e, (negative(rng) ? -1.0 : 1.0) * choices[pick(rng)]);
  }
  return inputs;
}

// Bit-for-bit equality, except that any NaN equals any NaN: which operand's payload NaN + NaN keeps
// depends on the operand order a compiler picks for a commutative addition, so NaN payloads are not
// part of the contract (NaN-ness is).
bool sameValue(const Buffer& a, std::size_t i, const Buffer& b, std::size_t j) {
  return a.bits(i) == b.bits(j) || (std::isnan(a.get(i)) && std::isnan(b.get(j)));
}

std::vector<Buffer> uniformInputs(DType dtype, std::size_t k, std::size_t count, double low, double high,
                                  std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> value(low, high);
  std::vector<Buffer> inputs;
  for (std::size_t i = 0; i < k; ++i) {
    inputs.emplace_back(dtype, count);
    for (std::size_t e = 0; e < count; ++e) inputs.back().set(e, value(rng));
  }
  return inputs;
}

std::vector<double> column(const std::vector<Buffer>& inputs, std::size_t e) {
  std::vector<double> x;
  for (const Buffer& input : inputs) x.push_back(input.get(e));
  return x;
}

// ---- Names and the bandwidth model ------------------------------------------------------------------------

TEST(LocalSum, StrategyNamesRoundTrip) {
  EXPECT_EQ(strategyName(LocalSumMethod::AddN), "local/add_n");
  EXPECT_EQ(strategyName(LocalSumMethod::Tree), "local/tree");
  EXPECT_EQ(strategyName(LocalSumMethod::AccumulateN), "local/accumulate_n");
  EXPECT_EQ(strategyName(LocalSumMethod::Kahan), "local/kahan");
  for (LocalSumMethod method : kLocalSumMethods) EXPECT_EQ(parseLocalSumMethod(strategyName(method)), method);
  EXPECT_EQ(parseLocalSumMethod("add_n"), std::nullopt);
  EXPECT_EQ(parseLocalSumMethod("local/pairwise"), std::nullopt);
  EXPECT_EQ(parseLocalSumMethod(""), std::nullopt);
}

TEST(LocalSum, SupportsTheFourFloatingTypes) {
  for (DType dtype : allDTypes()) {
    const bool expected =
        dtype == DType::Fp32 || dtype == DType::Fp16 || dtype == DType::Bf16 || dtype == DType::Fp64;
    EXPECT_EQ(localSumSupports(dtype), expected) << name(dtype);
  }
}

TEST(LocalSum, BytesMovedFollowsTheHeaderModel) {
  EXPECT_EQ(localSumBytesMoved(LocalSumMethod::AddN, DType::Fp32, 4, 1000), 5u * 1000 * 4);
  EXPECT_EQ(localSumBytesMoved(LocalSumMethod::Tree, DType::Fp16, 8, 1000), 9u * 1000 * 2);
  EXPECT_EQ(localSumBytesMoved(LocalSumMethod::Kahan, DType::Fp64, 2, 10), 3u * 10 * 8);
  EXPECT_EQ(localSumBytesMoved(LocalSumMethod::AccumulateN, DType::Bf16, 4, 1000), 9u * 1000 * 2);
  EXPECT_EQ(localSumBytesMoved(LocalSumMethod::AccumulateN, DType::Fp32, 1, 1000), 2u * 1000 * 4);
  EXPECT_EQ(localSumBytesMoved(LocalSumMethod::AccumulateN, DType::Fp32, 0, 1000), 0u);
}

// ---- Refusals -------------------------------------------------------------------------------------------

TEST(LocalSum, RefusesUnsupportedTypesAndNoInputs) {
  std::vector<std::int32_t> a(4, 1), b(4, 2), out(4);
  const void* inputs[] = {a.data(), b.data()};
  for (DType dtype : {DType::Int32, DType::Int8, DType::Fp8E4M3, DType::Other})
    for (LocalSumMethod method : kLocalSumMethods)
      EXPECT_THROW(localSum(method, dtype, inputs, out.data(), 4), Error) << name(dtype);
  EXPECT_THROW(localSum(LocalSumMethod::AddN, DType::Fp32, std::span<const void* const>{}, out.data(), 4),
               Error);
  EXPECT_THROW(localSum(LocalSumMethod::Tree, DType::Fp32, std::span<const void* const>{}, out.data(), 0),
               Error);
  std::vector<double> reference(4);
  EXPECT_THROW(referenceSum(DType::Int32, inputs, reference.data(), 4), Error);
  EXPECT_THROW(referenceSum(DType::Fp32, std::span<const void* const>{}, reference.data(), 4), Error);
}

TEST(LocalSum, RefusesNullBuffersAndAnOutputAliasingALaterInput) {
  std::vector<float> a(8, 1), b(8, 2);
  const void* with_null[] = {a.data(), nullptr};
  EXPECT_THROW(localSum(LocalSumMethod::AddN, DType::Fp32, with_null, a.data(), 8), Error);
  const void* inputs[] = {a.data(), b.data()};
  EXPECT_THROW(localSum(LocalSumMethod::AddN, DType::Fp32, inputs, nullptr, 8), Error);
  EXPECT_THROW(localSum(LocalSumMethod::Kahan, DType::Fp32, inputs, b.data(), 8), Error);
  EXPECT_NO_THROW(localSum(LocalSumMethod::Kahan, DType::Fp32, inputs, a.data(), 8));
}

// ---- Exact results on verifiable inputs
// ---------------------------------------------------------------------

// Small integers in [-2, 2]: every partial sum of up to 64 of them is an integer of magnitude <= 128,
// exact in every supported type (bf16 has 8 significant bits), so every method and order must give
// exactly the integer sum.
double smallInteger(std::size_t input, std::size_t element) {
  return static_cast<double>(static_cast<int>((element * 7 + input * 13 + element / 3) % 5) - 2);
}

void checkExactSums(DType dtype, std::size_t k, std::size_t count, std::size_t distinct,
                    CpuExecutor& executor) {
  // `distinct` buffers, input i is buffer i % distinct (inputs may share memory: they are only read).
  std::vector<Buffer> buffers;
  for (std::size_t b = 0; b < std::min(k, distinct); ++b) {
    buffers.emplace_back(dtype, count);
    for (std::size_t e = 0; e < count; ++e) buffers.back().set(e, smallInteger(b, e));
  }
  std::vector<const void*> inputs;
  std::vector<double> multiplicity(buffers.size(), 0.0);
  for (std::size_t i = 0; i < k; ++i) {
    inputs.push_back(buffers[i % buffers.size()].data());
    multiplicity[i % buffers.size()] += 1;
  }
  Buffer expected(dtype, count);
  for (std::size_t e = 0; e < count; ++e) {
    double sum = 0;
    for (std::size_t b = 0; b < buffers.size(); ++b) sum += multiplicity[b] * smallInteger(b, e);
    expected.set(e, sum);
  }
  for (LocalSumMethod method : kLocalSumMethods) {
    Buffer out(dtype, count);
    for (std::size_t e = 0; e < count; ++e) out.set(e, 99.0);  // stale values must be overwritten
    localSum(method, dtype, inputs, out.data(), count, executor);
    std::size_t wrong = 0, first_wrong = count;
    for (std::size_t e = 0; e < count; ++e)
      if (out.bits(e) != expected.bits(e) && wrong++ == 0) first_wrong = e;
    EXPECT_EQ(wrong, 0u) << label(method, dtype, k, count) << ": first wrong element " << first_wrong
                         << " is " << (first_wrong < count ? out.get(first_wrong) : 0.0) << ", expected "
                         << (first_wrong < count ? expected.get(first_wrong) : 0.0);
  }
}

TEST(LocalSum, ExactOnSmallIntegersForEveryMethodTypeAndK) {
  for (DType dtype : kDTypes)
    for (std::size_t k : Sizes{1, 2, 3, 5, 8, 17, 64})
      for (std::size_t count : Sizes{0, 1, 7, 1000})
        checkExactSums(dtype, k, count, k, CpuExecutor::shared());
}

TEST(LocalSum, ExactOnSmallIntegersOnTheParallelPath) {
  // Five distinct buffers keep the memory small for K = 17 and 64. Under a sanitizer a subset of K keeps
  // the test short; it still covers the unrolled kernels (K <= 16) and the run-time loops (K = 17).
  const std::vector<std::size_t> ks =
      kSanitized ? std::vector<std::size_t>{1, 2, 5, 17} : std::vector<std::size_t>{1, 2, 3, 5, 8, 17, 64};
  CpuExecutor executor(3);
  for (DType dtype : kDTypes)
    for (std::size_t k : ks) checkExactSums(dtype, k, kParallelCount, 5, executor);
}

TEST(LocalSum, OutputMayAliasTheFirstInput) {
  for (DType dtype : kDTypes) {
    for (std::size_t count : Sizes{std::size_t{1000}, std::size_t{300'007}}) {
      for (LocalSumMethod method : kLocalSumMethods) {
        // Under the sanitizers (10-20x slower) the aliasing is checked with one and with five inputs.
        for (std::size_t k :
             kSanitized ? std::vector<std::size_t>{1, 5} : std::vector<std::size_t>{1, 2, 5}) {
          std::vector<Buffer> inputs = orderSensitiveInputs(dtype, k, count, 7);
          Buffer separate(dtype, count);
          localSum(method, dtype, pointers(inputs), separate.data(), count);
          localSum(method, dtype, pointers(inputs), inputs[0].data(), count);
          std::size_t wrong = 0;
          for (std::size_t e = 0; e < count; ++e) wrong += inputs[0].bits(e) != separate.bits(e);
          EXPECT_EQ(wrong, 0u) << label(method, dtype, k, count);
        }
      }
    }
  }
}

// ---- The documented summation orders, bit for bit --------------------------------------------------------

void checkOrder(LocalSumMethod method, DType dtype, std::size_t k, std::size_t count, std::uint32_t seed,
                bool cancellation) {
  const std::vector<Buffer> inputs =
      cancellation ? cancellationInputs(dtype, k, count, seed) : orderSensitiveInputs(dtype, k, count, seed);
  Buffer out(dtype, count);
  localSum(method, dtype, pointers(inputs), out.data(), count);
  Buffer expected(dtype, count);
  for (std::size_t e = 0; e < count; ++e) expected.set(e, referenceOf(method, dtype, column(inputs, e)));
  std::size_t wrong = 0, first_wrong = count;
  for (std::size_t e = 0; e < count; ++e)
    if (!sameValue(out, e, expected, e) && wrong++ == 0) first_wrong = e;
  EXPECT_EQ(wrong, 0u) << label(method, dtype, k, count) << (cancellation ? " cancellation" : " spread")
                       << " inputs, first wrong element " << first_wrong;
}

TEST(LocalSum, EveryMethodFollowsItsDocumentedOrderBitForBit) {
  for (bool cancellation : {false, true}) {
    for (DType dtype : kDTypes)
      for (LocalSumMethod method : kLocalSumMethods)
        for (std::size_t k = 1; k <= 20; ++k)
          checkOrder(method, dtype, k, 301, static_cast<std::uint32_t>(k), cancellation);
    for (DType dtype : kDTypes)
      for (LocalSumMethod method : kLocalSumMethods)
        for (std::size_t k : Sizes{31, 33, 64, 100})
          checkOrder(method, dtype, k, 67, static_cast<std::uint32_t>(k), cancellation);
  }
}

// The order checks above only mean something if the orders give different results on these inputs:
// here they do, for every pair of methods, and for the tree against another balanced order. (The
// spread inputs are enough for fp32; after rounding to 16 bits only the cancellation inputs show the
// accumulator's order.)
TEST(LocalSum, TheOrderInputsTellTheOrdersApart) {
  for (DType dtype : {DType::Fp32, DType::Fp16, DType::Bf16, DType::Fp64}) {
    for (std::size_t k : Sizes{5, 6, 7, 12}) {
      const std::vector<Buffer> inputs = dtype == DType::Fp32 ? orderSensitiveInputs(dtype, k, 2000, 99)
                                                              : cancellationInputs(dtype, k, 2000, 99);
      std::size_t tree_vs_addn = 0, tree_vs_halves = 0, kahan_vs_addn = 0, accumulate_vs_addn = 0;
      for (std::size_t e = 0; e < 2000; ++e) {
        const std::vector<double> x = column(inputs, e);
        const double tree = referenceTree(dtype, x);
        tree_vs_addn += tree != referenceAddN(dtype, x);
        tree_vs_halves += tree != roundTo(dtype, recursiveHalves(dtype, x, 0, x.size()));
        kahan_vs_addn += referenceKahan(dtype, x) != referenceAddN(dtype, x);
        accumulate_vs_addn += referenceAccumulateN(dtype, x) != referenceAddN(dtype, x);
      }
      EXPECT_GT(tree_vs_addn, 0u) << name(dtype) << " K=" << k;
      EXPECT_GT(tree_vs_halves, 0u) << name(dtype) << " K=" << k;
      EXPECT_GT(kahan_vs_addn, 0u) << name(dtype) << " K=" << k;
      if (dtype == DType::Fp16 || dtype == DType::Bf16) {
        EXPECT_GT(accumulate_vs_addn, 0u) << name(dtype) << " K=" << k;
      }
    }
  }
}

// The tree order spelled out for K = 5, 6, 7 (local_sum.h's binary-counter description).
TEST(LocalSum, TreeOrderForFiveSixAndSevenInputs) {
  const std::vector<Buffer> inputs = orderSensitiveInputs(DType::Fp32, 7, 3000, 5);
  const std::vector<const void*> all = pointers(inputs);
  for (std::size_t k : Sizes{5, 6, 7}) {
    const std::span<const void* const> first_k(all.data(), k);
    std::vector<float> out(3000);
    localSum(LocalSumMethod::Tree, DType::Fp32, first_k, out.data(), 3000);
    for (std::size_t e = 0; e < 3000; ++e) {
      float x[7];
      for (std::size_t i = 0; i < 7; ++i) x[i] = static_cast<float>(inputs[i].get(e));
      float expected = 0;
      const float quad = (x[0] + x[1]) + (x[2] + x[3]);
      if (k == 5) expected = quad + x[4];
      if (k == 6) expected = quad + (x[4] + x[5]);
      if (k == 7) expected = quad + ((x[4] + x[5]) + x[6]);
      ASSERT_EQ(floatBits(out[e]), floatBits(expected)) << "K=" << k << " element " << e;
    }
  }
}

// Every fp16 value (subnormals, Inf, NaN included) through the fp16 kernels: x + 0 must be exactly what
// numeric.h's conversions give. Random pairs then exercise the rounding of sums back to fp16 and bf16.
TEST(LocalSum, HalfPrecisionConversionsMatchNumericH) {
  for (LocalSumMethod method : kLocalSumMethods) {
    std::vector<std::uint16_t> all(65536), zeros(65536, 0), out(65536);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
    const void* inputs[] = {all.data(), zeros.data()};
    localSum(method, DType::Fp16, inputs, out.data(), all.size());
    for (std::size_t i = 0; i < all.size(); ++i)
      ASSERT_EQ(out[i], fp32ToFp16(fp16ToFp32(all[i]) + 0.0f)) << strategyName(method) << " code " << i;
  }
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> code(0, 0xFFFF);
  const std::size_t count = 1 << 20;
  for (DType dtype : {DType::Fp16, DType::Bf16}) {
    std::vector<std::uint16_t> a(count), b(count), out(count);
    for (std::size_t i = 0; i < count; ++i) {
      a[i] = static_cast<std::uint16_t>(code(rng));
      b[i] = static_cast<std::uint16_t>(code(rng));
    }
    const void* inputs[] = {a.data(), b.data()};
    for (LocalSumMethod method : kLocalSumMethods) {
      localSum(method, dtype, inputs, out.data(), count);
      for (std::size_t i = 0; i < count; ++i) {
        const float sum =
            dtype == DType::Fp16 ? fp16ToFp32(a[i]) + fp16ToFp32(b[i]) : bf16ToFp32(a[i]) + bf16ToFp32(b[i]);
        if (std::isnan(sum)) {
          // Which operand's payload a NaN + NaN keeps depends on the operand order the compiler picks:
          // NaN payloads are not part of the bit-exact contract, NaN-ness is.
          const float got = dtype == DType::Fp16 ? fp16ToFp32(out[i]) : bf16ToFp32(out[i]);
          ASSERT_TRUE(std::isnan(got))
              << strategyName(method) << " " << name(dtype) << " " << a[i] << " + " << b[i];
          continue;
        }
        const std::uint16_t expected = dtype == DType::Fp16 ? fp32ToFp16(sum) : fp32ToBf16(sum);
        ASSERT_EQ(out[i], expected) << strategyName(method) << " " << name(dtype) << " " << a[i] << " + "
                                    << b[i];
      }
    }
  }
}

// The fp16 kernel sets (AVX-512F, F16C, software) must give the same bits: run the exact, order,
// aliasing and conversion checks on each one this CPU can run.
class HalfKernelSet {
 public:
  explicit HalfKernelSet(const char* name) : supported_(testing::useIsaForTesting(name)) {}
  ~HalfKernelSet() { testing::useIsaForTesting(""); }
  HalfKernelSet(const HalfKernelSet&) = delete;
  HalfKernelSet& operator=(const HalfKernelSet&) = delete;
  bool supported() const { return supported_; }

 private:
  bool supported_;
};

TEST(LocalSum, EveryFp16KernelSetGivesTheSameBits) {
  EXPECT_FALSE(testing::useIsaForTesting("no-such-set"));
  std::size_t ran = 0;
  for (const char* set : {"avx512", "avx2", "portable"}) {
    HalfKernelSet chosen(set);
    if (!chosen.supported()) {
      std::printf("fp16 kernel set %s: this CPU cannot run it, skipped\n", set);
      continue;
    }
    ++ran;
    SCOPED_TRACE(set);
    for (std::size_t k : Sizes{1, 2, 3, 5, 8, 17, 64})
      for (std::size_t count : Sizes{1, 7, 1000})
        checkExactSums(DType::Fp16, k, count, k, CpuExecutor::shared());
    CpuExecutor three(3);
    for (std::size_t k : kSanitized ? std::vector<std::size_t>{5} : std::vector<std::size_t>{2, 5, 17})
      checkExactSums(DType::Fp16, k, 300'007, 5, three);
    for (bool cancellation : {false, true})
      for (LocalSumMethod method : kLocalSumMethods)
        for (std::size_t k :
             kSanitized ? std::vector<std::size_t>{1, 2, 3, 5, 8, 16, 17, 64}
                        : std::vector<std::size_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 20, 33, 64})
          checkOrder(method, DType::Fp16, k, 301, static_cast<std::uint32_t>(k), cancellation);
    for (LocalSumMethod method : kLocalSumMethods) {
      std::vector<Buffer> inputs = orderSensitiveInputs(DType::Fp16, 5, 30'011, 7);
      Buffer separate(DType::Fp16, 30'011);
      localSum(method, DType::Fp16, pointers(inputs), separate.data(), 30'011);
      localSum(method, DType::Fp16, pointers(inputs), inputs[0].data(), 30'011);
      EXPECT_EQ(std::memcmp(inputs[0].data(), separate.data(), 30'011 * 2), 0) << strategyName(method);

      std::vector<std::uint16_t> all(65536), zeros(65536, 0), out(65536);
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
      const void* codes[] = {all.data(), zeros.data()};
      localSum(method, DType::Fp16, codes, out.data(), all.size());
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < all.size(); ++i) wrong += out[i] != fp32ToFp16(fp16ToFp32(all[i]) + 0.0f);
      EXPECT_EQ(wrong, 0u) << strategyName(method);
    }
    const std::vector<Buffer> inputs = orderSensitiveInputs(DType::Fp16, 9, 1001, 17);
    std::vector<double> reference(1001);
    referenceSum(DType::Fp16, pointers(inputs), reference.data(), 1001);
    for (std::size_t e = 0; e < 1001; ++e) {
      double expected = inputs[0].get(e);
      for (std::size_t k = 1; k < inputs.size(); ++k) expected += inputs[k].get(e);
      ASSERT_EQ(reference[e], expected) << "element " << e;
    }
  }
  EXPECT_GE(ran, 1u);
}

// ---- Error bounds on random inputs -----------------------------------------------------------------------
//
// Per element, against the fp64 reference s of the same (already rounded) inputs, with A = Σ_k |x_k|:
//   AddN, AccumulateN in the accumulator: |ŝ - s| <= γ(K-1)·A,  γ(n) = n·u / (1 - n·u)
//   Tree:                                 |ŝ - s| <= γ(ceil(log2 K))·A
//   Kahan:                                |ŝ - s| <= (2u + 4K·u²)·A
// (γ(n) is the rigorous form of the n·u of local_sum.h.) u is the unit roundoff of the accumulator
// (fp32 for fp16/bf16); a 16-bit output adds one rounding, u_out·|ŝ_acc|; AccumulateN on a 16-bit type
// rounds every step to it, γ(K-1) with u_out. The fp64 reference itself is within (K-1)·2^-53·A.

double gamma(double n, double u) {
  return n * u / (1 - n * u);
}

double unitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::Fp16: return std::ldexp(1.0, -11);
    case DType::Bf16: return std::ldexp(1.0, -8);
    case DType::Fp64: return std::ldexp(1.0, -53);
    default: return std::ldexp(1.0, -24);
  }
}

double errorBound(LocalSumMethod method, DType dtype, std::size_t k, double absolute_sum, double result) {
  const double u = dtype == DType::Fp64 ? unitRoundoff(DType::Fp64) : unitRoundoff(DType::Fp32);
  const double u_out = dtype == DType::Fp32 || dtype == DType::Fp64 ? 0.0 : unitRoundoff(dtype);
  const auto kd = static_cast<double>(k);
  double accumulator = 0;
  switch (method) {
    case LocalSumMethod::AddN: accumulator = gamma(kd - 1, u) * absolute_sum; break;
    case LocalSumMethod::Tree: accumulator = gamma(std::ceil(std::log2(kd)), u) * absolute_sum; break;
    case LocalSumMethod::Kahan: accumulator = (2 * u + 4 * kd * u * u) * absolute_sum; break;
    case LocalSumMethod::AccumulateN:
      if (u_out > 0) return gamma(kd - 1, u_out) * absolute_sum + kd * std::ldexp(1.0, -53) * absolute_sum;
      accumulator = gamma(kd - 1, u) * absolute_sum;
      break;
  }
  return accumulator + u_out * (std::fabs(result) + accumulator) + kd * std::ldexp(1.0, -53) * absolute_sum;
}

TEST(LocalSum, RandomInputsStayWithinTheErrorBounds) {
  const std::size_t count = 4096;
  for (DType dtype : {DType::Fp32, DType::Fp16, DType::Bf16}) {
    for (std::size_t k : kSanitized ? std::vector<std::size_t>{2, 3, 16, 64}
                                    : std::vector<std::size_t>{2, 3, 4, 8, 16, 64, 256}) {
      // Positive inputs (no cancellation: the running sums grow, as in the worst case) and mixed signs.
      for (double low : {0.0, -1.0}) {
        const std::vector<Buffer> inputs =
            uniformInputs(dtype, k, count, low, 1.0, static_cast<std::uint32_t>(k));
        const std::vector<const void*> in = pointers(inputs);
        std::vector<double> reference(count);
        referenceSum(dtype, in, reference.data(), count);
        for (LocalSumMethod method : kLocalSumMethods) {
          Buffer out(dtype, count);
          localSum(method, dtype, in, out.data(), count);
          double worst = 0;  // largest error / bound
          for (std::size_t e = 0; e < count; ++e) {
            double absolute_sum = 0;
            for (const Buffer& input : inputs) absolute_sum += std::fabs(input.get(e));
            const double error = std::fabs(out.get(e) - reference[e]);
            const double bound = errorBound(method, dtype, k, absolute_sum, out.get(e));
            if (bound > 0) {
              worst = std::max(worst, error / bound);
            } else {
              EXPECT_EQ(error, 0.0);
            }
          }
          EXPECT_LE(worst, 1.0) << label(method, dtype, k, count) << (low < 0 ? " mixed signs" : " positive");
        }
      }
    }
  }
}

// ---- Determinism and the reference ------------------------------------------------------------------------

TEST(LocalSum, ResultsDoNotDependOnTheThreadCount) {
  CpuExecutor one(1), two(2), five(5);
  const std::size_t count = kParallelCount;
  for (DType dtype : kDTypes) {
    const std::vector<Buffer> inputs = uniformInputs(dtype, 5, count, -1.0, 1.0, 11);
    const std::vector<const void*> in = pointers(inputs);
    for (LocalSumMethod method : kLocalSumMethods) {
      Buffer a(dtype, count), b(dtype, count), c(dtype, count);
      localSum(method, dtype, in, a.data(), count, one);
      localSum(method, dtype, in, b.data(), count, two);
      localSum(method, dtype, in, c.data(), count, five);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), count * sizeOf(dtype)), 0) << label(method, dtype, 5, count);
      EXPECT_EQ(std::memcmp(a.data(), c.data(), count * sizeOf(dtype)), 0) << label(method, dtype, 5, count);
    }
    std::vector<double> r1(count), r2(count);
    referenceSum(dtype, in, r1.data(), count, one);
    referenceSum(dtype, in, r2.data(), count, two);
    EXPECT_EQ(std::memcmp(r1.data(), r2.data(), count * sizeof(double)), 0) << name(dtype);
  }
}

TEST(LocalSum, ReferenceIsTheFp64SumInAddNOrder) {
  for (DType dtype : kDTypes) {
    const std::vector<Buffer> inputs = orderSensitiveInputs(dtype, 9, 1001, 17);
    std::vector<double> reference(1001);
    referenceSum(dtype, pointers(inputs), reference.data(), 1001);
    for (std::size_t e = 0; e < 1001; ++e) {
      double expected = inputs[0].get(e);
      for (std::size_t k = 1; k < inputs.size(); ++k) expected += inputs[k].get(e);
      ASSERT_EQ(reference[e], expected) << name(dtype) << " element " << e;
    }
  }
}

// fp32 AccumulateN rounds to fp32 after every step, which is what AddN's fp32 accumulator does anyway:
// the two are the same bits for fp32 (and fp64), and differ for 16-bit types.
TEST(LocalSum, AccumulateNEqualsAddNForFullPrecisionTypes) {
  for (DType dtype : {DType::Fp32, DType::Fp64}) {
    const std::vector<Buffer> inputs = orderSensitiveInputs(dtype, 13, 5000, 23);
    Buffer a(dtype, 5000), b(dtype, 5000);
    localSum(LocalSumMethod::AddN, dtype, pointers(inputs), a.data(), 5000);
    localSum(LocalSumMethod::AccumulateN, dtype, pointers(inputs), b.data(), 5000);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), 5000 * sizeOf(dtype)), 0) << name(dtype);
  }
}

// ---- Error metrics ----------------------------------------------------------------------------------------

TEST(ErrorMetrics, KnownVectors) {
  const std::vector<float> result = {3, 4, 0, 0};
  const std::vector<double> reference = {3, 0, 0, 4};
  const ErrorMetrics m = compareToReference(DType::Fp32, result.data(), reference.data(), 4);
  EXPECT_EQ(m.rel_l2, std::sqrt(32.0) / 5.0);  // ‖(0, 4, 0, -4)‖ / ‖(3, 0, 0, 4)‖
  EXPECT_EQ(m.max_abs, 4.0);
  EXPECT_EQ(m.cosine, 9.0 / 25.0);  // 3·3 / (5·5)
  EXPECT_EQ(m.overflow, 0u);
  EXPECT_EQ(m.nan, 0u);

  const std::vector<double> exact = {3, 4, 0, 0};
  const ErrorMetrics same = compareToReference(DType::Fp32, result.data(), exact.data(), 4);
  EXPECT_EQ(same.rel_l2, 0.0);
  EXPECT_EQ(same.max_abs, 0.0);
  EXPECT_EQ(same.cosine, 1.0);
}

TEST(ErrorMetrics, ZeroVectorsAndEmptyInput) {
  const std::vector<float> zeros(5, 0.0f), ones(5, 1.0f);
  const std::vector<double> zero_reference(5, 0.0), one_reference(5, 1.0);
  const ErrorMetrics both = compareToReference(DType::Fp32, zeros.data(), zero_reference.data(), 5);
  EXPECT_EQ(both.rel_l2, 0.0);
  EXPECT_EQ(both.cosine, 1.0);
  const ErrorMetrics reference_zero = compareToReference(DType::Fp32, ones.data(), zero_reference.data(), 5);
  EXPECT_EQ(reference_zero.rel_l2, std::numeric_limits<double>::infinity());
  EXPECT_EQ(reference_zero.cosine, 0.0);
  EXPECT_EQ(reference_zero.max_abs, 1.0);
  const ErrorMetrics result_zero = compareToReference(DType::Fp32, zeros.data(), one_reference.data(), 5);
  EXPECT_EQ(result_zero.rel_l2, 1.0);
  EXPECT_EQ(result_zero.cosine, 0.0);
  const ErrorMetrics empty = compareToReference(DType::Fp32, zeros.data(), zero_reference.data(), 0);
  EXPECT_EQ(empty.rel_l2, 0.0);
  EXPECT_EQ(empty.cosine, 1.0);
  EXPECT_EQ(empty.max_abs, 0.0);
}

TEST(ErrorMetrics, CountsOverflowAndNanAndLeavesThemOutOfTheNorms) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const double dnan = std::numeric_limits<double>::quiet_NaN();
  const double dinf = std::numeric_limits<double>::infinity();
  //                           overflow  overflow  nan  finite  nan(ref nan)  inf(ref inf)  finite
  const std::vector<float> result = {inf, -inf, nan, 2.0f, nan, inf, -1.0f};
  const std::vector<double> reference = {1.0, 2.0, 3.0, 2.0, dnan, dinf, -2.0};
  const ErrorMetrics m = compareToReference(DType::Fp32, result.data(), reference.data(), result.size());
  EXPECT_EQ(m.overflow, 2u);
  EXPECT_EQ(m.nan, 1u);
  // Only the finite results count: (2, -1) against (2, -2).
  EXPECT_EQ(m.max_abs, 1.0);
  EXPECT_EQ(m.rel_l2, 1.0 / std::sqrt(8.0));
  EXPECT_EQ(m.cosine, 6.0 / std::sqrt(5.0 * 8.0));

  // The same through 16-bit results (fp16 overflows above 65504).
  std::vector<std::uint16_t> half(result.size()), brain(result.size());
  for (std::size_t i = 0; i < result.size(); ++i) {
    half[i] = fp32ToFp16(result[i]);
    brain[i] = fp32ToBf16(result[i]);
  }
  for (DType dtype : {DType::Fp16, DType::Bf16}) {
    const ErrorMetrics h = compareToReference(dtype, dtype == DType::Fp16 ? half.data() : brain.data(),
                                              reference.data(), result.size());
    EXPECT_EQ(h.overflow, 2u) << name(dtype);
    EXPECT_EQ(h.nan, 1u) << name(dtype);
    EXPECT_EQ(h.max_abs, 1.0) << name(dtype);
  }
  const std::uint16_t big = fp32ToFp16(1e6f);  // Inf in fp16: an overflow against a finite reference
  const double big_reference = 1e6;
  EXPECT_EQ(compareToReference(DType::Fp16, &big, &big_reference, 1).overflow, 1u);
}

TEST(ErrorMetrics, Fp64AndLargeInputsAreDeterministic) {
  const std::size_t count = 2'000'003;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> value(0.0, 1.0);
  std::vector<double> reference(count), result(count);
  for (std::size_t i = 0; i < count; ++i) {
    reference[i] = value(rng);
    result[i] = reference[i] * (1 + 1e-7 * value(rng));
  }
  CpuExecutor one(1), three(3);
  const ErrorMetrics a = compareToReference(DType::Fp64, result.data(), reference.data(), count, one);
  const ErrorMetrics b = compareToReference(DType::Fp64, result.data(), reference.data(), count, three);
  EXPECT_EQ(a.rel_l2, b.rel_l2);
  EXPECT_EQ(a.max_abs, b.max_abs);
  EXPECT_EQ(a.cosine, b.cosine);
  EXPECT_GT(a.rel_l2, 0.0);
  EXPECT_LT(a.rel_l2, 1e-6);
  EXPECT_GT(a.cosine, 1.0 - 1e-12);
}

TEST(ErrorMetrics, SumOfAbsolutes) {
  const std::vector<float> a = {1, -2, 3}, b = {-4, 5, -6};
  const void* inputs[] = {a.data(), b.data()};
  EXPECT_EQ(sumOfAbsolutes(DType::Fp32, inputs, 2, 3), 21.0);
  EXPECT_EQ(sumOfAbsolutes(DType::Fp32, inputs, 0, 3), 0.0);
  EXPECT_EQ(sumOfAbsolutes(DType::Fp32, inputs, 2, 0), 0.0);
  const std::vector<std::uint16_t> h = {fp32ToFp16(-0.5f), fp32ToFp16(0.25f)};
  const void* half[] = {h.data()};
  EXPECT_EQ(sumOfAbsolutes(DType::Fp16, half, 1, 2), 0.75);
  EXPECT_THROW(sumOfAbsolutes(DType::Int32, inputs, 2, 3), Error);
  EXPECT_THROW(compareToReference(DType::Int8, a.data(), std::vector<double>(3).data(), 3), Error);
}

// ---- Numerics table (docs/methods.md) ---------------------------------------------------------------------
//
// Regenerate with:
//   gradscope_unit_tests --gtest_also_run_disabled_tests --gtest_filter='LocalSumNumerics.DISABLED_Table'
// Inputs uniform in [2^-20, 1] rounded to the type (positive, so Σ|x| = |s| and the normalised error
// below is the relative error of each sum). Per K: the largest |ŝ_i - s_i| / Σ_k|x_k,i| over 5 seeds ×
// 16384 elements, against the fp64 reference, in units of u of the type (fp32 2^-24, fp16 2^-11, bf16
// 2^-8), next to each method's bound in the same unit. For 16-bit types the accumulator is fp32
// (u_acc = 2^-24) and the one rounding of the result adds 1.

TEST(LocalSumNumerics, DISABLED_Table) {
  const std::size_t count = 16384;
  const double u_acc = unitRoundoff(DType::Fp32);
  for (DType dtype : {DType::Fp32, DType::Fp16, DType::Bf16}) {
    const double u = unitRoundoff(dtype);
    const double final_rounding = dtype == DType::Fp32 ? 0.0 : 1.0;
    std::printf("\n%s: max relative error in units of u = 2^%d (5 seeds x %zu elements)\n\n",
                std::string(name(dtype)).c_str(), static_cast<int>(std::log2(u)), count);
    std::printf(
        "| K | tree | accumulate_n | add_n | kahan | bound tree | bound accumulate_n | bound add_n | bound "
        "kahan |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (std::size_t k = 2; k <= 1024; k *= 2) {
      double worst[4] = {};
      for (std::uint32_t seed = 1; seed <= 5; ++seed) {
        const std::vector<Buffer> inputs = uniformInputs(dtype, k, count, std::ldexp(1.0, -20), 1.0,
                                                         seed * 1000 + static_cast<std::uint32_t>(k));
        const std::vector<const void*> in = pointers(inputs);
        std::vector<double> reference(count), absolute(count, 0.0);
        referenceSum(dtype, in, reference.data(), count);
        for (const Buffer& input : inputs)
          for (std::size_t e = 0; e < count; ++e) absolute[e] += std::fabs(input.get(e));
        for (LocalSumMethod method : kLocalSumMethods) {
          Buffer out(dtype, count);
          localSum(method, dtype, in, out.data(), count);
          double& w = worst[static_cast<int>(method)];
          for (std::size_t e = 0; e < count; ++e)
            w = std::max(w, std::fabs(out.get(e) - reference[e]) / absolute[e] / u);
        }
      }
      const auto kd = static_cast<double>(k);
      const double scale = u_acc / u;  // accumulator bounds in units of u
      std::printf(
          "| %zu | %.3g | %.3g | %.3g | %.3g | %.4g | %.4g | %.4g | %.4g |\n", k,
          worst[static_cast<int>(LocalSumMethod::Tree)], worst[static_cast<int>(LocalSumMethod::AccumulateN)],
          worst[static_cast<int>(LocalSumMethod::AddN)], worst[static_cast<int>(LocalSumMethod::Kahan)],
          final_rounding + std::ceil(std::log2(kd)) * scale, kd - 1, final_rounding + (kd - 1) * scale,
          final_rounding + 2 * scale);
    }
  }
}

}  // namespace
}  // namespace gradscope::methods
