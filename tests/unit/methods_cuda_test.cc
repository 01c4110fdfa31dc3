// methods/: the CUDA kernels (cuda.h) against the CPU kernels.
//
// Where the CPU result is defined bit for bit (local sums, reference sums, wire encode/decode and their
// counters) the GPU result must be the same bits, on inputs whose sums are exact (so the expected value
// is known independently of either implementation) and on random inputs full of rounding, subnormals,
// overflow, ±Inf and NaN. One documented exception: a NaN *produced by GPU arithmetic* is the canonical
// NaN 0x7FFFFFFF, while x86 propagates an input's payload, so NaN results are compared as "both NaN".
// fp64 reductions (error metrics, the dot products of the adaptive methods) are summed in a different
// order on the GPU (fixed blocks and trees instead of the CPU's chunks), so they are compared to the CPU
// within a bound on that reordering, stated next to each check.
//
// Everything GPU-side runs on a non-blocking stream created here, with no host synchronisation between
// enqueued steps: only the functions that return host values (and DeviceBuffer::download) synchronise.
// Without a usable GPU the GPU suites skip with cuda::available()'s reason, and the CudaAvailability /
// CudaUnavailable tests check that every function then throws gradscope::Error instead of crashing.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gradscope/common/error.h"
#include "gradscope/common/types.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/cuda.h"
#include "gradscope/methods/delayed.h"
#include "gradscope/methods/error_metrics.h"
#include "gradscope/methods/local_sum.h"
#include "gradscope/methods/numeric.h"
#include "gradscope/methods/wire.h"

// The stream test needs the CUDA runtime API; the build links it where CUDA is on.
#if defined(GRADSCOPE_HAVE_CUDA) && __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define GS_TEST_CUDA_RUNTIME 1
#else
#define GS_TEST_CUDA_RUNTIME 0
#endif

namespace gradscope::methods {
namespace {

// ---------------------------------------------------------------------------------------------------
// Host-side helpers

// SplitMix64: reproducible inputs.
struct Random {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
  // Random sign, magnitude log-uniform in [2^lo, 2^hi).
  double logUniform(double lo, double hi) {
    const double magnitude = std::exp2(lo + (hi - lo) * uniform());
    return (next() & 1) != 0 ? -magnitude : magnitude;
  }
};

using Bytes = std::vector<std::uint8_t>;

std::uint32_t bitsOf(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Whether element `i` of a buffer of `dtype` is a NaN.
bool isNanElement(DType dtype, const std::uint8_t* data, std::size_t i) {
  switch (dtype) {
    case DType::Fp32: {
      std::uint32_t bits;
      std::memcpy(&bits, data + 4 * i, 4);
      return (bits & 0x7FFFFFFFu) > 0x7F800000u;
    }
    case DType::Fp64: {
      std::uint64_t bits;
      std::memcpy(&bits, data + 8 * i, 8);
      return (bits & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
    }
    case DType::Fp16: {
      std::uint16_t bits;
      std::memcpy(&bits, data + 2 * i, 2);
      return (bits & 0x7FFFu) > 0x7C00u;
    }
    case DType::Bf16: {
      std::uint16_t bits;
      std::memcpy(&bits, data + 2 * i, 2);
      return (bits & 0x7FFFu) > 0x7F80u;
    }
    case DType::Fp8E4M3: return (data[i] & 0x7Fu) == 0x7Fu;
    case DType::Fp8E5M2: return (data[i] & 0x7Fu) > 0x7Cu;
    default: return false;
  }
}

// Element-wise equality of two buffers of `count` elements: the same bits, or both NaN. Fails the test
// with the first differences (index and both encodings).
::testing::AssertionResult sameElements(DType dtype, const std::uint8_t* expected, const std::uint8_t* actual,
                                        std::size_t count) {
  const std::size_t size = sizeOf(dtype);
  std::size_t mismatches = 0;
  std::string first;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(expected + i * size, actual + i * size, size) == 0) continue;
    if (isNanElement(dtype, expected, i) && isNanElement(dtype, actual, i)) continue;
    if (mismatches < 4) {
      std::uint64_t e = 0;
      std::uint64_t a = 0;
      std::memcpy(&e, expected + i * size, size);
      std::memcpy(&a, actual + i * size, size);
      first +=
          " [" + std::to_string(i) + "] cpu 0x" + fmt::format("{:x}", e) + " gpu 0x" + fmt::format("{:x}", a);
    }
    ++mismatches;
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << count << " " << name(dtype) << " elements differ:" << first;
}

::testing::AssertionResult sameElements(DType dtype, const Bytes& expected, const Bytes& actual,
                                        std::size_t count) {
  if (expected.size() < count * sizeOf(dtype) || actual.size() < count * sizeOf(dtype))
    return ::testing::AssertionFailure() << "buffers shorter than " << count << " elements";
  return sameElements(dtype, expected.data(), actual.data(), count);
}

// One element of `dtype` from a double (rounded the way the format's conversion rounds).
void storeElement(DType dtype, std::uint8_t* data, std::size_t i, double value) {
  switch (dtype) {
    case DType::Fp32: {
      const auto v = static_cast<float>(value);
      std::memcpy(data + 4 * i, &v, 4);
      break;
    }
    case DType::Fp64: std::memcpy(data + 8 * i, &value, 8); break;
    case DType::Fp16: {
      const std::uint16_t v = fp32ToFp16(static_cast<float>(value));
      std::memcpy(data + 2 * i, &v, 2);
      break;
    }
    case DType::Bf16: {
      const std::uint16_t v = fp32ToBf16(static_cast<float>(value));
      std::memcpy(data + 2 * i, &v, 2);
      break;
    }
    default: break;
  }
}

double loadElement(DType dtype, const std::uint8_t* data, std::size_t i) {
  switch (dtype) {
    case DType::Fp32: {
      float v;
      std::memcpy(&v, data + 4 * i, 4);
      return static_cast<double>(v);
    }
    case DType::Fp64: {
      double v;
      std::memcpy(&v, data + 8 * i, 8);
      return v;
    }
    case DType::Fp16: {
      std::uint16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      return static_cast<double>(fp16ToFp32(v));
    }
    case DType::Bf16: {
      std::uint16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      return static_cast<double>(bf16ToFp32(v));
    }
    default: return 0.0;
  }
}

// Random elements for sums: mostly moderate values of both signs spread over many binades (rounding
// and cancellation in every method), some values near the top of the format (overflow in the sums),
// subnormals, signed zeros, and 1% raw random bit patterns (NaN with payloads, ±Inf, anything).
Bytes randomElements(DType dtype, std::size_t count, std::uint64_t seed) {
  Random random{seed};
  const std::size_t size = sizeOf(dtype);
  Bytes data(count * size);
  const double top = dtype == DType::Fp16 ? 15.0 : (dtype == DType::Fp64 ? 1023.0 : 127.0);
  const double subnormal = dtype == DType::Fp16 ? -20.0 : (dtype == DType::Fp64 ? -1060.0 : -140.0);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t kind = random.below(100);
    if (kind == 0) {
      const std::uint64_t bits = random.next();
      std::memcpy(data.data() + i * size, &bits, size);
    } else if (kind < 3) {
      storeElement(dtype, data.data(), i, random.logUniform(top - 2.0, top + 0.999));
    } else if (kind < 5) {
      storeElement(dtype, data.data(), i, random.logUniform(subnormal, subnormal + 8.0));
    } else if (kind < 6) {
      storeElement(dtype, data.data(), i, (random.next() & 1) != 0 ? -0.0 : 0.0);
    } else {
      storeElement(dtype, data.data(), i, random.logUniform(-12.0, 12.0));
    }
  }
  return data;
}

// Random fp32 inputs for the wire formats: moderate values, values around every format's largest value
// (overflow and saturation), tiny values (subnormal codes), zeros, ±Inf and NaN. `zero_runs` blocks of
// zeros and of tiny values exercise the scale-of-1 cases.
std::vector<float> randomWireInputs(std::size_t count, std::uint64_t seed) {
  Random random{seed};
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t kind = random.below(200);
    double value;
    if (kind == 0) {
      value = std::numeric_limits<double>::infinity() * ((random.next() & 1) != 0 ? -1.0 : 1.0);
    } else if (kind == 1) {
      const std::uint32_t nan = 0x7F800001u | static_cast<std::uint32_t>(random.next() & 0x807FFFFFu);
      float f;
      std::memcpy(&f, &nan, 4);
      values[i] = f;
      continue;
    } else if (kind < 6) {
      value = random.logUniform(15.5, 16.5);  // around the fp16 and e5m2 limits
    } else if (kind < 10) {
      value = random.logUniform(8.5, 9.5);  // around the e4m3 limit
    } else if (kind < 12) {
      value = random.logUniform(126.0, 128.0);  // bf16 overflow
    } else if (kind < 16) {
      value = random.logUniform(-149.0, -120.0);  // fp32 subnormals and tiny values
    } else if (kind < 18) {
      value = (random.next() & 1) != 0 ? -0.0 : 0.0;
    } else {
      value = random.logUniform(-20.0, 12.0);
    }
    values[i] = static_cast<float>(value);
  }
  // Runs of zeros and of tiny values: whole blocks whose scale is 1.
  for (std::size_t start = count / 3; start < count && start < count / 3 + 300; ++start) values[start] = 0.0f;
  for (std::size_t start = count / 2; start < count && start < count / 2 + 300; ++start)
    values[start] = static_cast<float>(random.logUniform(-140.0, -125.0));
  return values;
}

// ---------------------------------------------------------------------------------------------------
// Without a GPU (these run everywhere)

TEST(CudaAvailability, AnswersWithAOneLineReasonWhenThereIsNoGpu) {
  std::string reason = "unchanged";
  const bool ok = cuda::available(&reason);
  EXPECT_EQ(cuda::available(), ok);  // decided once
  if (ok) {
    EXPECT_TRUE(reason.empty());
    const std::string description = cuda::deviceDescription();
    EXPECT_NE(description.find("(sm_"), std::string::npos) << description;
  } else {
    EXPECT_FALSE(reason.empty());
    EXPECT_EQ(reason.find('\n'), std::string::npos) << reason;
  }
}

// Runs `call` and checks it throws gradscope::Error whose message is available()'s reason.
void expectUnavailable(const std::string& reason, const std::function<void()>& call, const char* what) {
  try {
    call();
    ADD_FAILURE() << what << " did not throw without a GPU";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), reason) << what;
  } catch (...) {
    ADD_FAILURE() << what << " threw something other than gradscope::Error";
  }
}

TEST(CudaUnavailable, EveryFunctionThrowsTheReasonInsteadOfCrashing) {
  std::string reason;
  if (cuda::available(&reason)) GTEST_SKIP() << "a GPU is usable here: " << cuda::deviceDescription();
  float host[4] = {1, 2, 3, 4};
  const void* inputs[] = {host, host};
  const float* gradients[] = {host, host};
  double reference[4] = {};
  std::uint64_t stats[2] = {};
  AdaConsState state;
  expectUnavailable(
      reason, [] { (void)cuda::deviceDescription(); }, "deviceDescription");
  expectUnavailable(
      reason, [] { cuda::DeviceBuffer buffer(64); }, "DeviceBuffer");
  expectUnavailable(
      reason, [] { cuda::synchronize(nullptr); }, "synchronize");
  expectUnavailable(
      reason, [&] { cuda::localSum(LocalSumMethod::AddN, DType::Fp32, inputs, host, 4, nullptr); },
      "localSum");
  expectUnavailable(
      reason, [&] { cuda::referenceSum(DType::Fp32, inputs, reference, 4, nullptr); }, "referenceSum");
  expectUnavailable(
      reason, [&] { cuda::encode(WireFormat::Fp16, host, 4, host, nullptr, {}, stats, nullptr); }, "encode");
  expectUnavailable(
      reason, [&] { cuda::decode(WireFormat::Fp16, host, nullptr, 4, host, 1.0f, 128, nullptr); }, "decode");
  expectUnavailable(
      reason, [&] { (void)cuda::compareToReference(DType::Fp32, host, reference, 4, nullptr); },
      "compareToReference");
  expectUnavailable(
      reason, [&] { cuda::mean(gradients, 4, host, nullptr); }, "mean");
  expectUnavailable(
      reason, [&] { (void)cuda::adaconsAlpha(gradients, 4, 1e-8, nullptr); }, "adaconsAlpha");
  expectUnavailable(
      reason, [&] { (void)cuda::adacons(gradients, 4, state, {}, host, nullptr); }, "adacons");
  expectUnavailable(
      reason, [&] { cuda::adasumPair(host, host, 4, host, nullptr); }, "adasumPair");
  expectUnavailable(
      reason, [&] { cuda::adasum(gradients, 4, host, nullptr); }, "adasum");
  expectUnavailable(
      reason, [&] { (void)cuda::consensusStats(gradients, 4, nullptr); }, "consensusStats");
  expectUnavailable(
      reason, [&] { cuda::copy(host, host, 16, nullptr); }, "copy");
  expectUnavailable(
      reason, [&] { cuda::delayedCorrection(DType::Fp32, host, host, host, host, 4, 2.0, nullptr); },
      "delayedCorrection");
  // Nothing to free: a default-constructed buffer is fine anywhere.
  cuda::DeviceBuffer empty;
  EXPECT_EQ(empty.get(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
}

// ---------------------------------------------------------------------------------------------------
// GPU fixture

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (!cuda::available(&reason)) GTEST_SKIP() << "GPU tests skipped: " << reason;
#if GS_TEST_CUDA_RUNTIME
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    stream_ = stream;
#endif
  }
  void TearDown() override {
#if GS_TEST_CUDA_RUNTIME
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), cudaSuccess);
      EXPECT_EQ(cudaStreamDestroy(static_cast<cudaStream_t>(stream_)), cudaSuccess);
    }
#endif
  }

  cuda::Stream stream() const {
    return stream_;
  }

  // A device copy of `bytes` (at least 64 bytes are allocated, so an empty buffer has an address).
  cuda::DeviceBuffer toDevice(const void* host, std::size_t bytes) const {
    cuda::DeviceBuffer buffer(std::max<std::size_t>(bytes, 64));
    buffer.upload(host, bytes, stream_);
    return buffer;
  }
  cuda::DeviceBuffer toDevice(const Bytes& host) const {
    return toDevice(host.data(), host.size());
  }
  template <typename T>
  cuda::DeviceBuffer toDevice(const std::vector<T>& host) const {
    return toDevice(host.data(), host.size() * sizeof(T));
  }

  // A device buffer of `bytes` (plus 64 guard bytes) filled with 0xA5 through a host upload.
  cuda::DeviceBuffer filled(std::size_t bytes) const {
    const Bytes pattern(bytes + 64, 0xA5);
    return toDevice(pattern);
  }

  Bytes fromDevice(const cuda::DeviceBuffer& buffer, std::size_t bytes) const {
    Bytes host(bytes);
    buffer.download(host.data(), bytes, stream_);
    return host;
  }
  template <typename T>
  std::vector<T> fromDevice(const cuda::DeviceBuffer& buffer, std::size_t count) const {
    std::vector<T> host(count);
    buffer.download(host.data(), count * sizeof(T), stream_);
    return host;
  }

 private:
  cuda::Stream stream_ = nullptr;
};

TEST_F(CudaTest, DeviceBufferRoundTripsAndMoves) {
  const Bytes data = randomElements(DType::Fp32, 1000, 1);
  cuda::DeviceBuffer buffer = toDevice(data);
  cuda::DeviceBuffer moved = std::move(buffer);
  EXPECT_EQ(buffer.get(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(fromDevice(moved, data.size()), data);
  cuda::DeviceBuffer copy(data.size());
  cuda::copy(copy.get(), moved.get(), data.size(), stream());
  EXPECT_EQ(fromDevice(copy, data.size()), data);
  EXPECT_THROW(moved.upload(data.data(), moved.size() + 1, stream()), Error);
}

// async/dga<K>'s correction (delayed.h): the CPU's bits for every element, and the gradient kept, in
// place and not, for the four dtypes the async strategies take.
TEST_F(CudaTest, DelayedCorrectionMatchesTheCpuBitForBit) {
  constexpr std::size_t kCount = 4099;
  std::uint64_t seed = 700;
  for (const DType dtype : {DType::Fp32, DType::Fp64, DType::Fp16, DType::Bf16}) {
    for (const bool in_place : {false, true}) {
      SCOPED_TRACE(std::string(name(dtype)) + (in_place ? " in place" : ""));
      const std::size_t bytes = kCount * sizeOf(dtype);
      const Bytes gradient = randomElements(dtype, kCount, ++seed);
      const Bytes sum = randomElements(dtype, kCount, ++seed);
      const Bytes older = randomElements(dtype, kCount, ++seed);
      Bytes host_older = older;
      Bytes host_out = in_place ? gradient : Bytes(bytes);
      methods::delayedCorrection(dtype, in_place ? host_out.data() : gradient.data(), host_older.data(),
                                 sum.data(), host_out.data(), kCount, 3.0);

      cuda::DeviceBuffer d_gradient = toDevice(gradient);
      cuda::DeviceBuffer d_sum = toDevice(sum);
      cuda::DeviceBuffer d_older = toDevice(older);
      cuda::DeviceBuffer d_out = filled(bytes);
      void* out = in_place ? d_gradient.get() : d_out.get();
      cuda::delayedCorrection(dtype, d_gradient.get(), d_older.get(), d_sum.get(), out, kCount, 3.0,
                              stream());
      EXPECT_TRUE(sameElements(dtype, host_out, fromDevice(in_place ? d_gradient : d_out, bytes), kCount));
      EXPECT_TRUE(sameElements(dtype, host_older, fromDevice(d_older, bytes), kCount)) << "older";
    }
  }
}

TEST_F(CudaTest, CudaErrorsBecomeOneLineErrorsNamingTheCall) {
  try {
    cuda::DeviceBuffer huge(std::size_t{1} << 62);
    FAIL() << "a 4 EiB allocation succeeded";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("cudaMalloc"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  // The error was not sticky: the device still works.
  cuda::DeviceBuffer small(64);
  cuda::synchronize(stream());
}

// ---------------------------------------------------------------------------------------------------
// Local sums

constexpr DType kSumTypes[] = {DType::Fp32, DType::Fp16, DType::Bf16, DType::Fp64};
constexpr std::size_t kInputCounts[] = {1, 2, 3, 5, 8, 17};
constexpr std::size_t kElementCounts[] = {0, 1, 7, 1000, (std::size_t{1} << 20) + 3};

class CudaLocalSum : public CudaTest, public ::testing::WithParamInterface<DType> {};

// Sums of small integers are exact in every method and type, so every method's result is known
// without either implementation: the exact integer sum.
TEST_P(CudaLocalSum, ExactSumsOfSmallIntegers) {
  const DType dtype = GetParam();
  const std::size_t size = sizeOf(dtype);
  // |sum| <= 17 * 7 = 119: exact in bf16 (8 significant bits) and everything wider.
  constexpr std::size_t kCount = 4099;
  Random random{7};
  std::vector<Bytes> host(17, Bytes(kCount * size));
  for (auto& input : host) {
    for (std::size_t i = 0; i < kCount; ++i)
      storeElement(dtype, input.data(), i, static_cast<double>(static_cast<int>(random.below(15)) - 7));
  }
  std::vector<cuda::DeviceBuffer> device;
  for (const auto& input : host) device.push_back(toDevice(input));
  for (std::size_t k : kInputCounts) {
    std::vector<const void*> pointers;
    for (std::size_t i = 0; i < k; ++i) pointers.push_back(device[i].get());
    Bytes exact(kCount * size);
    for (std::size_t e = 0; e < kCount; ++e) {
      double sum = 0;
      for (std::size_t i = 0; i < k; ++i) sum += loadElement(dtype, host[i].data(), e);
      storeElement(dtype, exact.data(), e, sum);
    }
    for (LocalSumMethod method : kLocalSumMethods) {
      SCOPED_TRACE(std::string(strategyName(method)) + " K=" + std::to_string(k));
      cuda::DeviceBuffer out = filled(kCount * size);
      cuda::localSum(method, dtype, pointers, out.get(), kCount, stream());
      EXPECT_TRUE(sameElements(dtype, exact, fromDevice(out, kCount * size), kCount));
    }
    std::vector<double> reference(kCount);
    cuda::DeviceBuffer reference_out = filled(kCount * sizeof(double));
    cuda::referenceSum(dtype, pointers, reference_out.as<double>(), kCount, stream());
    const auto gpu_reference = fromDevice<double>(reference_out, kCount);
    for (std::size_t e = 0; e < kCount; ++e) {
      double sum = 0;
      for (std::size_t i = 0; i < k; ++i) sum += loadElement(dtype, host[i].data(), e);
      ASSERT_EQ(gpu_reference[e], sum) << "element " << e << " K=" << k;
    }
  }
}

// Random inputs (rounding, cancellation, overflow, subnormals, NaN, Inf) at every size: the GPU gives
// the CPU's bits. Element-wise methods make a prefix of the inputs sum to a prefix of the output, so
// the CPU runs once per method and K at the largest size. The output buffer's guard bytes after
// `count` elements must stay untouched.
TEST_P(CudaLocalSum, RandomInputsMatchTheCpuBitForBit) {
  const DType dtype = GetParam();
  const std::size_t size = sizeOf(dtype);
  const std::size_t max_count = kElementCounts[std::size(kElementCounts) - 1];
  std::vector<Bytes> host;
  std::vector<cuda::DeviceBuffer> device;
  for (std::size_t i = 0; i < 17; ++i) {
    host.push_back(randomElements(dtype, max_count, 100 + i));
    device.push_back(toDevice(host.back()));
  }
  for (std::size_t k : kInputCounts) {
    std::vector<const void*> cpu_inputs;
    std::vector<const void*> gpu_inputs;
    for (std::size_t i = 0; i < k; ++i) {
      cpu_inputs.push_back(host[i].data());
      gpu_inputs.push_back(device[i].get());
    }
    for (LocalSumMethod method : kLocalSumMethods) {
      Bytes expected(max_count * size);
      localSum(method, dtype, cpu_inputs, expected.data(), max_count);
      for (std::size_t count : kElementCounts) {
        SCOPED_TRACE(std::string(strategyName(method)) + " K=" + std::to_string(k) +
                     " count=" + std::to_string(count));
        cuda::DeviceBuffer out = filled(count * size);
        cuda::localSum(method, dtype, gpu_inputs, out.get(), count, stream());
        const Bytes actual = fromDevice(out, count * size + 64);
        EXPECT_TRUE(sameElements(dtype, expected, actual, count));
        EXPECT_TRUE(std::all_of(actual.begin() + static_cast<std::ptrdiff_t>(count * size), actual.end(),
                                [](std::uint8_t byte) { return byte == 0xA5; }))
            << "wrote past the end";
      }
    }
    // The fp64 reference: the CPU's bits too (both add in fp64 in input order).
    std::vector<double> expected(max_count);
    referenceSum(dtype, cpu_inputs, expected.data(), max_count);
    cuda::DeviceBuffer out = filled(max_count * sizeof(double));
    cuda::referenceSum(dtype, gpu_inputs, out.as<double>(), max_count, stream());
    const auto actual = fromDevice<double>(out, max_count);
    EXPECT_TRUE(sameElements(DType::Fp64, reinterpret_cast<const std::uint8_t*>(expected.data()),
                             reinterpret_cast<const std::uint8_t*>(actual.data()), max_count))
        << "referenceSum K=" << k;
  }
}

// Pointers that are not 16-byte aligned take the scalar path; an output that is input 0 is summed in
// place. Both must give the same bits as the aligned, out-of-place run.
TEST_P(CudaLocalSum, UnalignedAndInPlaceBuffersGiveTheSameBits) {
  const DType dtype = GetParam();
  const std::size_t size = sizeOf(dtype);
  constexpr std::size_t kCount = 100003;
  std::vector<Bytes> host;
  for (std::size_t i = 0; i < 5; ++i) host.push_back(randomElements(dtype, kCount + 1, 200 + i));
  std::vector<cuda::DeviceBuffer> device;
  for (const auto& input : host) device.push_back(toDevice(input));
  for (LocalSumMethod method : kLocalSumMethods) {
    SCOPED_TRACE(std::string(strategyName(method)));
    // Shifted by one element: inputs and output at +size bytes.
    std::vector<const void*> cpu_inputs;
    std::vector<const void*> gpu_inputs;
    for (std::size_t i = 0; i < host.size(); ++i) {
      cpu_inputs.push_back(host[i].data() + size);
      gpu_inputs.push_back(static_cast<const std::uint8_t*>(device[i].get()) + size);
    }
    Bytes expected(kCount * size);
    localSum(method, dtype, cpu_inputs, expected.data(), kCount);
    cuda::DeviceBuffer out = filled((kCount + 1) * size);
    cuda::localSum(method, dtype, gpu_inputs, static_cast<std::uint8_t*>(out.get()) + size, kCount, stream());
    const Bytes shifted = fromDevice(out, (kCount + 1) * size);
    EXPECT_TRUE(sameElements(dtype, expected.data(), shifted.data() + size, kCount)) << "unaligned";

    // In place into a copy of input 0 (aligned).
    std::vector<const void*> aligned_cpu;
    for (const auto& input : host) aligned_cpu.push_back(input.data());
    Bytes expected_in_place(kCount * size);
    localSum(method, dtype, aligned_cpu, expected_in_place.data(), kCount);
    cuda::DeviceBuffer accumulator = toDevice(host[0]);
    std::vector<const void*> in_place{accumulator.get()};
    for (std::size_t i = 1; i < host.size(); ++i) in_place.push_back(device[i].get());
    cuda::localSum(method, dtype, in_place, accumulator.get(), kCount, stream());
    EXPECT_TRUE(sameElements(dtype, expected_in_place, fromDevice(accumulator, kCount * size), kCount))
        << "in place";
  }
}

// More inputs than fit the kernel's parameter block (the pointer table is uploaded), and enough that
// the tree needs its widest slot layout.
TEST_P(CudaLocalSum, ManyInputsMatchTheCpu) {
  const DType dtype = GetParam();
  const std::size_t size = sizeOf(dtype);
  constexpr std::size_t kCount = 1031;
  for (std::size_t k : {std::size_t{64}, std::size_t{65}, std::size_t{255}, std::size_t{300}}) {
    std::vector<Bytes> host;
    std::vector<cuda::DeviceBuffer> device;
    std::vector<const void*> cpu_inputs;
    std::vector<const void*> gpu_inputs;
    for (std::size_t i = 0; i < k; ++i) {
      host.push_back(randomElements(dtype, kCount, 1000 * k + i));
      device.push_back(toDevice(host.back()));
    }
    for (std::size_t i = 0; i < k; ++i) {
      cpu_inputs.push_back(host[i].data());
      gpu_inputs.push_back(device[i].get());
    }
    for (LocalSumMethod method : kLocalSumMethods) {
      SCOPED_TRACE(std::string(strategyName(method)) + " K=" + std::to_string(k));
      Bytes expected(kCount * size);
      localSum(method, dtype, cpu_inputs, expected.data(), kCount);
      cuda::DeviceBuffer out = filled(kCount * size);
      cuda::localSum(method, dtype, gpu_inputs, out.get(), kCount, stream());
      EXPECT_TRUE(sameElements(dtype, expected, fromDevice(out, kCount * size), kCount));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaLocalSum, ::testing::ValuesIn(kSumTypes),
                         [](const ::testing::TestParamInfo<DType>& param) {
                           return std::string(name(param.param));
                         });

TEST_F(CudaTest, LocalSumRefusesWhatTheCpuRefuses) {
  cuda::DeviceBuffer a(64);
  cuda::DeviceBuffer b(64);
  const void* two[] = {a.get(), b.get()};
  EXPECT_THROW(cuda::localSum(LocalSumMethod::AddN, DType::Int32, two, a.get(), 4, stream()), Error);
  EXPECT_THROW(cuda::localSum(LocalSumMethod::AddN, DType::Fp32, {}, a.get(), 4, stream()), Error);
  EXPECT_THROW(cuda::localSum(LocalSumMethod::AddN, DType::Fp32, two, b.get(), 4, stream()),
               Error);  // aliases x1
  EXPECT_THROW(cuda::referenceSum(DType::Fp8E4M3, two, a.as<double>(), 4, stream()), Error);
}

// ---------------------------------------------------------------------------------------------------
// Wire formats

constexpr std::size_t kBlocks[] = {1, 3, 4, 16, 31, 32, 100, 128, 4096, 4100, 65536};
constexpr float kPrescales[] = {1.0f, 0.125f, 3.0f};

struct WireRun {
  Bytes codes;
  std::vector<float> scales;
  EncodeStats stats;
};

class CudaWire : public CudaTest, public ::testing::WithParamInterface<WireFormat> {
 protected:
  // Encodes `count` values at `in_offset` elements into a buffer at `out_offset` elements, twice, so the
  // counters must come out doubled (encode adds to them).
  WireRun encodeOnGpu(const cuda::DeviceBuffer& in, std::size_t in_offset, std::size_t count,
                      std::size_t out_offset, const EncodeOptions& options) {
    const WireFormat format = GetParam();
    const std::size_t element = wireElementBytes(format);
    const std::size_t scales = scaleCount(format, count, options.block);
    cuda::DeviceBuffer out = filled((count + out_offset) * element);
    cuda::DeviceBuffer scale_buffer = filled(scales * sizeof(float));
    const std::uint64_t zero[2] = {0, 0};
    cuda::DeviceBuffer stats = toDevice(zero, sizeof zero);
    const float* source = in.as<float>() + in_offset;
    auto* codes = static_cast<std::uint8_t*>(out.get()) + out_offset * element;
    for (int pass = 0; pass < 2; ++pass)
      cuda::encode(format, source, count, codes, scale_buffer.as<float>(), options, stats.as<std::uint64_t>(),
                   stream());
    WireRun run;
    const Bytes all = fromDevice(out, (count + out_offset) * element + 64);
    run.codes.assign(all.begin() + static_cast<std::ptrdiff_t>(out_offset * element),
                     all.begin() + static_cast<std::ptrdiff_t>((out_offset + count) * element));
    EXPECT_TRUE(std::all_of(all.begin() + static_cast<std::ptrdiff_t>((out_offset + count) * element),
                            all.end(), [](std::uint8_t byte) { return byte == 0xA5; }))
        << "encode wrote past the end";
    run.scales = fromDevice<float>(scale_buffer, scales);
    const auto counters = fromDevice<std::uint64_t>(stats, 2);
    EXPECT_EQ(counters[0] % 2, 0u);
    EXPECT_EQ(counters[1] % 2, 0u);
    run.stats = {counters[0] / 2, counters[1] / 2};
    return run;
  }
};

::testing::AssertionResult sameScales(const std::vector<float>& expected, const std::vector<float>& actual) {
  if (expected.size() != actual.size()) return ::testing::AssertionFailure() << "scale counts differ";
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (bitsOf(expected[i]) != bitsOf(actual[i]))
      return ::testing::AssertionFailure()
             << "scale " << i << ": cpu " << expected[i] << " gpu " << actual[i];
  }
  return ::testing::AssertionSuccess();
}

TEST_P(CudaWire, EncodeMatchesTheCpuCodesScalesAndCounters) {
  const WireFormat format = GetParam();
  const std::size_t max_count = kElementCounts[std::size(kElementCounts) - 1];
  const std::vector<float> values = randomWireInputs(max_count, 42);
  const cuda::DeviceBuffer in = toDevice(values);
  const DType dtype = wireDType(format);
  const std::size_t element = wireElementBytes(format);
  for (std::size_t block : kBlocks) {
    if (!isFp8(format) && block != 128) continue;  // the block only matters for fp8
    for (float prescale : kPrescales) {
      for (std::size_t count : kElementCounts) {
        SCOPED_TRACE("block=" + std::to_string(block) + " prescale=" + std::to_string(prescale) +
                     " count=" + std::to_string(count));
        const EncodeOptions options{.prescale = prescale, .block = block};
        Bytes codes(count * element);
        std::vector<float> scales(scaleCount(format, count, block));
        const EncodeStats expected =
            encode(format, values.data(), count, codes.data(), scales.data(), options);
        const WireRun run = encodeOnGpu(in, 0, count, 0, options);
        EXPECT_TRUE(sameElements(dtype, codes, run.codes, count));
        EXPECT_TRUE(sameScales(scales, run.scales));
        EXPECT_EQ(run.stats.overflow, expected.overflow);
        EXPECT_EQ(run.stats.nan, expected.nan);
      }
    }
  }
}

TEST_P(CudaWire, UnalignedBuffersGiveTheSameCodes) {
  const WireFormat format = GetParam();
  constexpr std::size_t kCount = 70001;
  const std::vector<float> values = randomWireInputs(kCount + 3, 43);
  const cuda::DeviceBuffer in = toDevice(values);
  for (std::size_t block : {std::size_t{4}, std::size_t{128}, std::size_t{8192}}) {
    SCOPED_TRACE("block=" + std::to_string(block));
    const EncodeOptions options{.prescale = 1.0f, .block = block};
    Bytes codes(kCount * wireElementBytes(format));
    std::vector<float> scales(scaleCount(format, kCount, block));
    const EncodeStats expected =
        encode(format, values.data() + 1, kCount, codes.data(), scales.data(), options);
    // Input at +1 float (4-byte aligned only), output at +1 and +3 elements.
    for (std::size_t out_offset : {std::size_t{1}, std::size_t{3}}) {
      const WireRun run = encodeOnGpu(in, 1, kCount, out_offset, options);
      EXPECT_TRUE(sameElements(wireDType(format), codes, run.codes, kCount));
      EXPECT_TRUE(sameScales(scales, run.scales));
      EXPECT_EQ(run.stats.overflow, expected.overflow);
      EXPECT_EQ(run.stats.nan, expected.nan);
    }
  }
}

// Every code decodes like the CPU, with several scales and postscales, aligned and not.
TEST_P(CudaWire, DecodeOfEveryCodeMatchesTheCpu) {
  const WireFormat format = GetParam();
  const std::size_t element = wireElementBytes(format);
  const std::size_t codes_count = element == 1 ? 256 : 65536;
  // Every code several times over, so blocks see mixed codes: 3 copies + a few extra.
  const std::size_t count = 3 * codes_count + 5;
  Bytes codes(count * element);
  for (std::size_t i = 0; i < count; ++i) {
    const auto code = static_cast<std::uint16_t>((i * 7919) % codes_count);
    std::memcpy(codes.data() + i * element, &code, element);
  }
  Random random{5};
  for (std::size_t block : kBlocks) {
    if (!isFp8(format) && block != 128) continue;
    std::vector<float> scales(std::max<std::size_t>(scaleCount(format, count, block), 1));
    for (auto& scale : scales) scale = static_cast<float>(std::fabs(random.logUniform(-130.0, 20.0)));
    scales[0] = 1.0f;
    const cuda::DeviceBuffer device_scales = toDevice(scales);
    const cuda::DeviceBuffer in = toDevice(codes);
    for (float postscale : {1.0f, 8.0f, 0.1f}) {
      for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
        SCOPED_TRACE("block=" + std::to_string(block) + " postscale=" + std::to_string(postscale) +
                     " offset=" + std::to_string(offset));
        // The CPU decodes elements [offset, count) with the scales of blocks counted from `offset`.
        const std::size_t n = count - offset;
        std::vector<float> expected(n);
        decode(format, codes.data() + offset * element, scales.data(), n, expected.data(), postscale, block);
        cuda::DeviceBuffer out = filled((n + offset) * sizeof(float));
        cuda::decode(format, static_cast<const std::uint8_t*>(in.get()) + offset * element,
                     device_scales.as<float>(), n, out.as<float>() + offset, postscale, block, stream());
        const auto actual = fromDevice<float>(out, n + offset);
        EXPECT_TRUE(sameElements(DType::Fp32, reinterpret_cast<const std::uint8_t*>(expected.data()),
                                 reinterpret_cast<const std::uint8_t*>(actual.data() + offset), n));
      }
    }
  }
}

// The round trip through the GPU equals the round trip through the CPU, at every size.
TEST_P(CudaWire, RoundTripMatchesTheCpu) {
  const WireFormat format = GetParam();
  const std::size_t element = wireElementBytes(format);
  const std::size_t max_count = kElementCounts[std::size(kElementCounts) - 1];
  const std::vector<float> values = randomWireInputs(max_count, 44);
  const cuda::DeviceBuffer in = toDevice(values);
  for (std::size_t count : kElementCounts) {
    SCOPED_TRACE("count=" + std::to_string(count));
    const EncodeOptions options{.prescale = 0.25f, .block = 128};
    Bytes codes(count * element);
    std::vector<float> scales(scaleCount(format, count, 128));
    encode(format, values.data(), count, codes.data(), scales.data(), options);
    std::vector<float> expected(count);
    decode(format, codes.data(), scales.data(), count, expected.data(), 4.0f, 128);

    cuda::DeviceBuffer device_codes(std::max<std::size_t>(count * element, 64));
    cuda::DeviceBuffer device_scales(std::max<std::size_t>(scales.size() * sizeof(float), 64));
    cuda::DeviceBuffer out(std::max<std::size_t>(count * sizeof(float), 64));
    cuda::encode(format, in.as<float>(), count, device_codes.get(), device_scales.as<float>(), options,
                 nullptr, stream());
    cuda::decode(format, device_codes.get(), device_scales.as<float>(), count, out.as<float>(), 4.0f, 128,
                 stream());
    const auto actual = fromDevice<float>(out, count);
    EXPECT_TRUE(sameElements(DType::Fp32, reinterpret_cast<const std::uint8_t*>(expected.data()),
                             reinterpret_cast<const std::uint8_t*>(actual.data()), count));
  }
}

TEST_P(CudaWire, Fp8RefusesAnEmptyBlock) {
  const WireFormat format = GetParam();
  cuda::DeviceBuffer buffer(64);
  const EncodeOptions options{.prescale = 1.0f, .block = 0};
  if (isFp8(format)) {
    EXPECT_THROW(cuda::encode(format, buffer.as<float>(), 4, buffer.get(), buffer.as<float>(), options,
                              nullptr, stream()),
                 Error);
    EXPECT_THROW(
        cuda::decode(format, buffer.get(), buffer.as<float>(), 4, buffer.as<float>(), 1.0f, 0, stream()),
        Error);
  } else {
    cuda::DeviceBuffer codes(64);
    EXPECT_NO_THROW(
        cuda::encode(format, buffer.as<float>(), 4, codes.get(), nullptr, options, nullptr, stream()));
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaWire, ::testing::ValuesIn(kWireFormats),
                         [](const ::testing::TestParamInfo<WireFormat>& param) {
                           return std::string(name(param.param));
                         });

// ---------------------------------------------------------------------------------------------------
// Error metrics
//
// reduce.cu adds in error_metrics.cc's order (blocks of 16384 elements, 16 lanes, lanes then blocks),
// so the metrics are compared bit for bit (NaN as NaN). A mismatch after a change to error_metrics.cc's
// blocking means reduce.cu's kMetricsBlock must follow it.

::testing::AssertionResult sameDouble(const char* what, double expected, double actual) {
  if (std::isnan(expected) && std::isnan(actual)) return ::testing::AssertionSuccess();
  if (std::memcmp(&expected, &actual, sizeof expected) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": cpu " << fmt::format("{:.17g}", expected) << " gpu " << fmt::format("{:.17g}", actual);
}

void expectSameMetrics(const ErrorMetrics& expected, const ErrorMetrics& actual) {
  EXPECT_TRUE(sameDouble("rel_l2", expected.rel_l2, actual.rel_l2));
  EXPECT_TRUE(sameDouble("max_abs", expected.max_abs, actual.max_abs));
  EXPECT_TRUE(sameDouble("cosine", expected.cosine, actual.cosine));
  EXPECT_EQ(expected.overflow, actual.overflow);
  EXPECT_EQ(expected.nan, actual.nan);
}

class CudaErrorMetrics : public CudaTest, public ::testing::WithParamInterface<DType> {};

TEST_P(CudaErrorMetrics, MatchTheCpuBitForBit) {
  const DType dtype = GetParam();
  const std::size_t size = sizeOf(dtype);
  constexpr std::size_t kMax = (std::size_t{1} << 21) + 7;  // 129 blocks of the CPU order, the last partial
  // A result (a Tree sum in the element type) against its fp64 reference: realistic errors, plus the
  // random inputs' overflows, NaN and Inf on both sides.
  std::vector<Bytes> inputs;
  std::vector<const void*> pointers;
  for (std::size_t i = 0; i < 3; ++i) {
    inputs.push_back(randomElements(dtype, kMax, 300 + i));
    pointers.push_back(inputs.back().data());
  }
  Bytes result(kMax * size);
  localSum(LocalSumMethod::Tree, dtype, pointers, result.data(), kMax);
  std::vector<double> reference(kMax);
  referenceSum(dtype, pointers, reference.data(), kMax);
  const cuda::DeviceBuffer device_result = toDevice(result);
  const cuda::DeviceBuffer device_reference = toDevice(reference);
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000},
                            std::size_t{16384}, std::size_t{16385}, (std::size_t{1} << 20) + 3, kMax}) {
    SCOPED_TRACE("count=" + std::to_string(count));
    expectSameMetrics(
        compareToReference(dtype, result.data(), reference.data(), count),
        cuda::compareToReference(dtype, device_result.get(), device_reference.as<double>(), count, stream()));
  }
}

TEST_P(CudaErrorMetrics, ExactAndZeroCases) {
  const DType dtype = GetParam();
  const std::size_t size = sizeOf(dtype);
  constexpr std::size_t kCount = 50000;
  Bytes result(kCount * size);
  std::vector<double> reference(kCount);
  Random random{9};
  for (std::size_t i = 0; i < kCount; ++i) {
    storeElement(dtype, result.data(), i, static_cast<double>(static_cast<int>(random.below(200)) - 100));
    reference[i] = loadElement(dtype, result.data(), i);
  }
  const ErrorMetrics exact = cuda::compareToReference(dtype, toDevice(result).get(),
                                                      toDevice(reference).as<double>(), kCount, stream());
  EXPECT_EQ(exact.rel_l2, 0.0);
  EXPECT_EQ(exact.max_abs, 0.0);
  EXPECT_EQ(exact.cosine, 1.0);
  EXPECT_EQ(exact.overflow, 0u);
  EXPECT_EQ(exact.nan, 0u);
  const Bytes zeros(kCount * size, 0);
  const std::vector<double> zero_reference(kCount, 0.0);
  const ErrorMetrics both_zero = cuda::compareToReference(
      dtype, toDevice(zeros).get(), toDevice(zero_reference).as<double>(), kCount, stream());
  EXPECT_EQ(both_zero.rel_l2, 0.0);
  EXPECT_EQ(both_zero.cosine, 1.0);
  const ErrorMetrics zero_reference_only = cuda::compareToReference(
      dtype, toDevice(result).get(), toDevice(zero_reference).as<double>(), kCount, stream());
  EXPECT_TRUE(std::isinf(zero_reference_only.rel_l2));
  EXPECT_EQ(zero_reference_only.cosine, 0.0);
  EXPECT_THROW((void)cuda::compareToReference(DType::Int8, toDevice(result).get(),
                                              toDevice(reference).as<double>(), kCount, stream()),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Types, CudaErrorMetrics, ::testing::ValuesIn(kSumTypes),
                         [](const ::testing::TestParamInfo<DType>& param) {
                           return std::string(name(param.param));
                         });

// ---------------------------------------------------------------------------------------------------
// Mean and the adaptive methods
//
// adaptive.cu reduces in adaptive.cc's order (blocks of 4096, 16 lanes) and evaluates every
// per-element expression the same way, so α, weights, norms, cosines and output vectors are compared
// bit for bit; the identities of AdaSum are checked on inputs where they hold exactly.

constexpr std::size_t kGradientCounts[] = {1, 2, 3, 5, 8, 9, 17};
constexpr std::size_t kVectorLengths[] = {1, 7, 1000, 4096, 4097, (std::size_t{1} << 20) + 3};

// Gradients that agree in sign element by element (a shared component over many binades, scaled by
// 0.75..1.25 per gradient), so every ⟨g_sum, g_i⟩ is positive and the AdaCons weights normalise;
// gradient `zero`, if there is one, is all zeros (norm 0).
std::vector<std::vector<float>> agreeingGradients(
    std::size_t n, std::size_t count, std::uint64_t seed,
    std::size_t zero = std::numeric_limits<std::size_t>::max()) {
  Random random{seed};
  std::vector<float> common(count);
  for (auto& value : common) value = static_cast<float>(random.logUniform(-8.0, 2.0));
  std::vector<std::vector<float>> gradients(n, std::vector<float>(count, 0.0f));
  for (std::size_t i = 0; i < n; ++i) {
    if (i == zero) continue;
    for (std::size_t e = 0; e < count; ++e)
      gradients[i][e] = static_cast<float>(static_cast<double>(common[e]) * (0.75 + 0.5 * random.uniform()));
  }
  return gradients;
}

struct DeviceGradients {
  std::vector<cuda::DeviceBuffer> buffers;
  std::vector<const float*> device;
  std::vector<const float*> host;
};

class CudaAdaptive : public CudaTest {
 protected:
  DeviceGradients upload(const std::vector<std::vector<float>>& gradients) const {
    DeviceGradients result;
    for (const auto& gradient : gradients) {
      result.buffers.push_back(toDevice(gradient));
      result.host.push_back(gradient.data());
    }
    for (const auto& buffer : result.buffers) result.device.push_back(buffer.as<float>());
    return result;
  }

  ::testing::AssertionResult sameFloats(const std::vector<float>& expected, const cuda::DeviceBuffer& actual,
                                        std::size_t count) const {
    const auto gpu = fromDevice<float>(actual, count);
    return sameElements(DType::Fp32, reinterpret_cast<const std::uint8_t*>(expected.data()),
                        reinterpret_cast<const std::uint8_t*>(gpu.data()), count);
  }
};

::testing::AssertionResult sameDoubles(const char* what, const std::vector<double>& expected,
                                       const std::vector<double>& actual) {
  if (expected.size() != actual.size())
    return ::testing::AssertionFailure()
           << what << ": " << expected.size() << " vs " << actual.size() << " values";
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ::testing::AssertionResult same = sameDouble(what, expected[i], actual[i]);
    if (!same) return same << " at " << i;
  }
  return ::testing::AssertionSuccess();
}

TEST_F(CudaAdaptive, MeanMatchesTheCpuBitForBit) {
  for (std::size_t n : kGradientCounts) {
    for (std::size_t count : kVectorLengths) {
      SCOPED_TRACE("N=" + std::to_string(n) + " count=" + std::to_string(count));
      const auto gradients = agreeingGradients(n, count + 1, 10 * n + count);
      const DeviceGradients device = upload(gradients);
      std::vector<float> expected(count);
      mean(device.host, count, expected.data());
      cuda::DeviceBuffer out = filled(count * sizeof(float));
      cuda::mean(device.device, count, out.as<float>(), stream());
      EXPECT_TRUE(sameFloats(expected, out, count));
      // Unaligned: every vector from element 1.
      std::vector<const float*> host_shifted;
      std::vector<const float*> device_shifted;
      for (std::size_t i = 0; i < n; ++i) {
        host_shifted.push_back(device.host[i] + 1);
        device_shifted.push_back(device.device[i] + 1);
      }
      mean(host_shifted, count, expected.data());
      cuda::mean(device_shifted, count, out.as<float>() + 1, stream());
      const auto shifted = fromDevice<float>(out, count + 1);
      EXPECT_TRUE(sameElements(DType::Fp32, reinterpret_cast<const std::uint8_t*>(expected.data()),
                               reinterpret_cast<const std::uint8_t*>(shifted.data() + 1), count))
          << "unaligned";
    }
  }
}

TEST_F(CudaAdaptive, AdaConsMatchesTheCpuBitForBit) {
  for (std::size_t n : kGradientCounts) {
    for (std::size_t count : kVectorLengths) {
      for (AdaConsScale scale :
           {AdaConsScale::Paper, AdaConsScale::MatchSumNorm, AdaConsScale::MatchMeanNorm}) {
        SCOPED_TRACE("N=" + std::to_string(n) + " count=" + std::to_string(count) +
                     " scale=" + std::to_string(static_cast<int>(scale)));
        // One zero gradient when there are several: it gets no share of the aggregate.
        const auto gradients = agreeingGradients(n, count, 20 * n + count, n > 2 ? 1 : n);
        const DeviceGradients device = upload(gradients);
        const AdaConsOptions options{.beta = 0.9, .epsilon = 1e-8, .scale = scale};
        AdaConsState cpu_state;
        AdaConsState gpu_state;
        // Three steps (the momentum state carries over), the later ones on reordered gradients.
        for (int step_index = 0; step_index < 3; ++step_index) {
          std::vector<const float*> host = device.host;
          std::vector<const float*> gpu = device.device;
          std::rotate(host.begin(), host.begin() + step_index % static_cast<int>(n), host.end());
          std::rotate(gpu.begin(), gpu.begin() + step_index % static_cast<int>(n), gpu.end());
          std::vector<float> expected(count);
          const AdaConsStep cpu = adacons(host, count, cpu_state, options, expected.data());
          EXPECT_TRUE(
              sameDoubles("alpha", cpu.alpha, cuda::adaconsAlpha(gpu, count, options.epsilon, stream())));
          cuda::DeviceBuffer out = filled(count * sizeof(float));
          const AdaConsStep actual = cuda::adacons(gpu, count, gpu_state, options, out.as<float>(), stream());
          EXPECT_TRUE(sameDoubles("alpha", cpu.alpha, actual.alpha));
          EXPECT_TRUE(sameDoubles("smoothed", cpu.smoothed, actual.smoothed));
          EXPECT_TRUE(sameDoubles("weights", cpu.weights, actual.weights));
          EXPECT_TRUE(sameDoubles("norms", cpu.norms, actual.norms));
          EXPECT_TRUE(sameDouble("scale", cpu.scale, actual.scale));
          EXPECT_TRUE(sameDoubles("momentum", cpu_state.sorted_momentum, gpu_state.sorted_momentum));
          EXPECT_TRUE(sameFloats(expected, out, count));
        }
      }
    }
  }
}

TEST_F(CudaAdaptive, AdaConsRefusesWhatTheCpuRefuses) {
  const auto gradients = agreeingGradients(3, 100, 1);
  const DeviceGradients device = upload(gradients);
  cuda::DeviceBuffer out(400);
  AdaConsState state;
  EXPECT_THROW((void)cuda::adacons({}, 100, state, {}, out.as<float>(), stream()), Error);
  // No elements: every α is 0 and the weights cannot be normalised, as on the CPU.
  EXPECT_THROW((void)adacons(device.host, 0, state, {}, nullptr), Error);
  EXPECT_THROW((void)cuda::adacons(device.device, 0, state, {}, out.as<float>(), stream()), Error);
  // All-zero gradients: likewise.
  const std::vector<std::vector<float>> zeros(2, std::vector<float>(100, 0.0f));
  const DeviceGradients zero_device = upload(zeros);
  EXPECT_THROW((void)cuda::adacons(zero_device.device, 100, state, {}, out.as<float>(), stream()), Error);
  EXPECT_TRUE(state.sorted_momentum.empty());
}

TEST_F(CudaAdaptive, AdaSumPairMatchesTheCpuInAndOutOfPlace) {
  for (std::size_t count : kVectorLengths) {
    SCOPED_TRACE("count=" + std::to_string(count));
    const auto gradients = agreeingGradients(2, count + 1, 40 + count);
    const DeviceGradients device = upload(gradients);
    std::vector<float> expected(count);
    adasumPair(device.host[0], device.host[1], count, expected.data());
    cuda::DeviceBuffer out = filled(count * sizeof(float));
    cuda::adasumPair(device.device[0], device.device[1], count, out.as<float>(), stream());
    EXPECT_TRUE(sameFloats(expected, out, count));
    // In place into a and into b.
    for (int into = 0; into < 2; ++into) {
      cuda::DeviceBuffer a = toDevice(gradients[0]);
      cuda::DeviceBuffer b = toDevice(gradients[1]);
      float* target = into == 0 ? a.as<float>() : b.as<float>();
      cuda::adasumPair(a.as<float>(), b.as<float>(), count, target, stream());
      EXPECT_TRUE(sameFloats(expected, into == 0 ? a : b, count))
          << "in place into " << (into == 0 ? "a" : "b");
    }
    // Unaligned.
    std::vector<float> shifted_expected(count);
    adasumPair(device.host[0] + 1, device.host[1] + 1, count, shifted_expected.data());
    cuda::DeviceBuffer shifted = filled((count + 1) * sizeof(float));
    cuda::adasumPair(device.device[0] + 1, device.device[1] + 1, count, shifted.as<float>() + 1, stream());
    const auto actual = fromDevice<float>(shifted, count + 1);
    EXPECT_TRUE(sameElements(DType::Fp32, reinterpret_cast<const std::uint8_t*>(shifted_expected.data()),
                             reinterpret_cast<const std::uint8_t*>(actual.data() + 1), count))
        << "unaligned";
  }
}

// a ⊕ b = a + b for orthogonal inputs, a ⊕ a = a, 0 ⊕ b = b: exact on these inputs (disjoint supports
// make a·b exactly 0 and the coefficients exactly 1; for a ⊕ a they are exactly 1/2).
TEST_F(CudaAdaptive, AdaSumIdentities) {
  constexpr std::size_t kCount = 10001;
  Random random{77};
  std::vector<float> a(kCount, 0.0f);
  std::vector<float> b(kCount, 0.0f);
  for (std::size_t i = 0; i < kCount; ++i)
    (i % 3 == 0 ? a : b)[i] = static_cast<float>(random.logUniform(-6, 6));
  const cuda::DeviceBuffer da = toDevice(a);
  const cuda::DeviceBuffer db = toDevice(b);
  const cuda::DeviceBuffer zero = toDevice(std::vector<float>(kCount, 0.0f));
  cuda::DeviceBuffer out(kCount * sizeof(float));
  std::vector<float> sum(kCount);
  for (std::size_t i = 0; i < kCount; ++i) sum[i] = a[i] + b[i];  // exact: one side is zero
  cuda::adasumPair(da.as<float>(), db.as<float>(), kCount, out.as<float>(), stream());
  EXPECT_TRUE(sameFloats(sum, out, kCount)) << "orthogonal";
  cuda::adasumPair(da.as<float>(), da.as<float>(), kCount, out.as<float>(), stream());
  EXPECT_TRUE(sameFloats(a, out, kCount)) << "a + a";
  cuda::adasumPair(zero.as<float>(), db.as<float>(), kCount, out.as<float>(), stream());
  EXPECT_TRUE(sameFloats(b, out, kCount)) << "0 + b";
  cuda::adasumPair(da.as<float>(), zero.as<float>(), kCount, out.as<float>(), stream());
  EXPECT_TRUE(sameFloats(a, out, kCount)) << "a + 0";
}

TEST_F(CudaAdaptive, AdaSumTreeMatchesTheCpuBitForBit) {
  for (std::size_t n : kGradientCounts) {
    for (std::size_t count : kVectorLengths) {
      SCOPED_TRACE("N=" + std::to_string(n) + " count=" + std::to_string(count));
      const auto gradients = agreeingGradients(n, count, 50 * n + count);
      const DeviceGradients device = upload(gradients);
      std::vector<float> expected(count);
      adasum(device.host, count, expected.data());
      cuda::DeviceBuffer out = filled(count * sizeof(float));
      cuda::adasum(device.device, count, out.as<float>(), stream());
      EXPECT_TRUE(sameFloats(expected, out, count));
      // Into gradient 0 (only the last step writes the output).
      cuda::adasum(device.device, count, const_cast<float*>(device.device[0]), stream());
      EXPECT_TRUE(sameFloats(expected, device.buffers[0], count)) << "into gradient 0";
    }
  }
}

TEST_F(CudaAdaptive, ConsensusStatsMatchTheCpuBitForBit) {
  for (std::size_t n : kGradientCounts) {
    for (std::size_t count :
         {std::size_t{0}, std::size_t{7}, std::size_t{4097}, (std::size_t{1} << 20) + 3}) {
      SCOPED_TRACE("N=" + std::to_string(n) + " count=" + std::to_string(count));
      const auto gradients = agreeingGradients(n, count, 60 * n + count, n > 1 ? 0 : n);
      const DeviceGradients device = upload(gradients);
      const ConsensusStats cpu = consensusStats(device.host, count);
      const ConsensusStats gpu = cuda::consensusStats(device.device, count, stream());
      EXPECT_TRUE(sameDoubles("norms", cpu.norms, gpu.norms));
      EXPECT_TRUE(sameDoubles("cosine_to_mean", cpu.cosine_to_mean, gpu.cosine_to_mean));
      EXPECT_TRUE(sameDouble("diversity", cpu.diversity, gpu.diversity));
    }
  }
  EXPECT_TRUE(cuda::consensusStats({}, 10, stream()).norms.empty());
}

// ---------------------------------------------------------------------------------------------------
// Stream ordering: a chain of kernels enqueued back to back on the test's non-blocking stream, with no
// host synchronisation between them (uploads from pageable memory are staged before they return), gives
// the CPU chain's results. Only the last call, which returns host values, waits.

TEST_F(CudaTest, ChainedCallsOnOneStreamNeedNoHostSync) {
  constexpr std::size_t kCount = (std::size_t{1} << 20) + 5;
  std::vector<Bytes> inputs;
  std::vector<const void*> host_inputs;
  for (std::size_t i = 0; i < 5; ++i) {
    inputs.push_back(randomElements(DType::Fp32, kCount, 500 + i));
    // Keep the chain finite: no NaN/Inf here (those are covered above), so the metrics are numbers.
    auto* values = reinterpret_cast<float*>(inputs.back().data());
    for (std::size_t e = 0; e < kCount; ++e)
      if (!std::isfinite(values[e]) || std::fabs(values[e]) > 1e30f) values[e] = 1.0f;
    host_inputs.push_back(inputs.back().data());
  }
  // CPU chain.
  std::vector<float> sum(kCount);
  localSum(LocalSumMethod::Kahan, DType::Fp32, host_inputs, sum.data(), kCount);
  std::vector<double> reference(kCount);
  referenceSum(DType::Fp32, host_inputs, reference.data(), kCount);
  std::vector<std::uint8_t> codes(kCount);
  std::vector<float> scales(scaleCount(WireFormat::Fp8E4M3, kCount, 128));
  const EncodeOptions options{.prescale = 0.2f, .block = 128};
  encode(WireFormat::Fp8E4M3, sum.data(), kCount, codes.data(), scales.data(), options);
  std::vector<float> decoded(kCount);
  decode(WireFormat::Fp8E4M3, codes.data(), scales.data(), kCount, decoded.data(), 5.0f, 128);
  std::vector<float> combined(kCount);
  adasumPair(sum.data(), decoded.data(), kCount, combined.data());
  const std::vector<const float*> parts{sum.data(), decoded.data(), combined.data()};
  std::vector<float> averaged(kCount);
  mean(parts, kCount, averaged.data());
  const ErrorMetrics expected = compareToReference(DType::Fp32, averaged.data(), reference.data(), kCount);

  // GPU chain: every call enqueues on stream(); nothing waits until compareToReference.
  std::vector<cuda::DeviceBuffer> device_inputs;
  std::vector<const void*> device_pointers;
  for (const auto& input : inputs) {
    device_inputs.push_back(toDevice(input));
    device_pointers.push_back(device_inputs.back().get());
  }
  cuda::DeviceBuffer d_sum(kCount * sizeof(float));
  cuda::DeviceBuffer d_reference(kCount * sizeof(double));
  cuda::DeviceBuffer d_codes(kCount);
  cuda::DeviceBuffer d_scales(scales.size() * sizeof(float));
  cuda::DeviceBuffer d_decoded(kCount * sizeof(float));
  cuda::DeviceBuffer d_combined(kCount * sizeof(float));
  cuda::DeviceBuffer d_averaged(kCount * sizeof(float));
  cuda::localSum(LocalSumMethod::Kahan, DType::Fp32, device_pointers, d_sum.get(), kCount, stream());
  cuda::referenceSum(DType::Fp32, device_pointers, d_reference.as<double>(), kCount, stream());
  cuda::encode(WireFormat::Fp8E4M3, d_sum.as<float>(), kCount, d_codes.get(), d_scales.as<float>(), options,
               nullptr, stream());
  cuda::decode(WireFormat::Fp8E4M3, d_codes.get(), d_scales.as<float>(), kCount, d_decoded.as<float>(), 5.0f,
               128, stream());
  cuda::adasumPair(d_sum.as<float>(), d_decoded.as<float>(), kCount, d_combined.as<float>(), stream());
  const std::vector<const float*> device_parts{d_sum.as<float>(), d_decoded.as<float>(),
                                               d_combined.as<float>()};
  cuda::mean(device_parts, kCount, d_averaged.as<float>(), stream());
  const ErrorMetrics actual =
      cuda::compareToReference(DType::Fp32, d_averaged.get(), d_reference.as<double>(), kCount, stream());
  expectSameMetrics(expected, actual);
  EXPECT_TRUE(sameElements(DType::Fp32, reinterpret_cast<const std::uint8_t*>(averaged.data()),
                           fromDevice(d_averaged, kCount * sizeof(float)).data(), kCount));
}

}  // namespace
}  // namespace gradscope::methods
