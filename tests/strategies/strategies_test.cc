// The distributed strategies (strategy.h) on the MPI communicator, run by ctest under mpiexec with 2 and
// 3 ranks. Every rank regenerates every rank's input from (seed, rank, index), so each rank can compute
// the reference itself: the exact sum, methods::adacons or methods::adasum over the ranks' vectors in
// rank order.
//
// Inputs are chosen so that the comparisons can be exact:
// - sums: small integers, so every order of addition gives the exact sum in every dtype tested;
// - AdaCons and AdaSum: m · 2^E with |m| < 128 and E depending only on the element index, so the fp32
//   sum over ranks is exact (AdaCons' g_sum) while fp64 dot products over many elements are not, which
//   makes their summation order visible.
// Wire precisions are checked against the bound of docs/methods.md ("Distributed strategies").

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gradscope/comm/communicator.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/error.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/numeric.h"
#include "gradscope/methods/wire.h"
#include "strategies_test_world.h"

namespace gradscope::comm {
namespace {

using Bytes = std::vector<std::byte>;

constexpr double kU32 = 0x1p-24;  // unit roundoff of fp32

// ---- Inputs ---------------------------------------------------------------------------------------------

std::uint64_t mix(std::uint64_t seed, std::uint64_t rank, std::uint64_t index) {
  std::uint64_t z =
      seed * 0x9E3779B97F4A7C15ull + rank * 0xBF58476D1CE4E5B9ull + index * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Integers in [-64, 64]: sums over up to 3 ranks stay within 192, exact in fp16 and bf16 too.
std::vector<double> integers(std::uint32_t seed, int rank, std::size_t count) {
  std::vector<double> values(count);
  for (std::size_t e = 0; e < count; ++e)
    values[e] =
        static_cast<double>(static_cast<int>(mix(seed, static_cast<std::uint64_t>(rank), e) % 129) - 64);
  return values;
}

// m · 2^E, |m| <= 127, E in [-24, 0] chosen by the element alone: fp32 sums over ranks are exact.
std::vector<float> scaledIntegers(std::uint32_t seed, int rank, std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t e = 0; e < count; ++e) {
    const auto m = static_cast<int>(mix(seed, static_cast<std::uint64_t>(rank), e) % 255) - 127;
    const auto exponent = -static_cast<int>(mix(seed, 1000, e) % 25);
    values[e] = std::ldexp(static_cast<float>(m), exponent);
  }
  return values;
}

// Normally distributed, with magnitudes spread over several decades.
std::vector<float> normals(std::uint32_t seed, int rank, std::size_t count) {
  std::mt19937_64 rng(mix(seed, static_cast<std::uint64_t>(rank), 0));
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 6);
  std::vector<float> values(count);
  for (float& x : values) x = std::ldexp(value(rng), exponent(rng));
  return values;
}

Bytes encodeAs(DType dtype, const std::vector<double>& values) {
  Bytes bytes(values.size() * sizeOf(dtype));
  for (std::size_t e = 0; e < values.size(); ++e) {
    std::byte* at = bytes.data() + e * sizeOf(dtype);
    const auto single = static_cast<float>(values[e]);
    switch (dtype) {
      case DType::Fp64: std::memcpy(at, &values[e], sizeof(double)); break;
      case DType::Fp32: std::memcpy(at, &single, sizeof(float)); break;
      case DType::Fp16: {
        const std::uint16_t code = methods::fp32ToFp16(single);
        std::memcpy(at, &code, sizeof code);
        break;
      }
      case DType::Bf16: {
        const std::uint16_t code = methods::fp32ToBf16(single);
        std::memcpy(at, &code, sizeof code);
        break;
      }
      default: ADD_FAILURE() << "no test encoding for " << name(dtype);
    }
  }
  return bytes;
}

Bytes asBytes(const std::vector<float>& values) {
  Bytes bytes(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<float> asFloats(const Bytes& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

std::vector<const float*> pointers(const std::vector<std::vector<float>>& vectors) {
  std::vector<const float*> result;
  for (const auto& v : vectors) result.push_back(v.data());
  return result;
}

// ---- Running a strategy -----------------------------------------------------------------------------------

struct Outcome {
  Bytes result;
  RunStats stats;
};

// Runs `strategy` on this rank's `input` (count elements), in place or out of place, in the
// communicator's memory (host for MPI, the GPU for NCCL); out of place also checks that the input is
// left alone.
Outcome runStrategy(Communicator& comm, Strategy& strategy, const Bytes& input, std::size_t count,
                    bool in_place) {
  Outcome outcome;
  const Bytes garbage(input.size(), std::byte{0x5A});  // what an out-of-place result must overwrite
  if (comm.memory() == Memory::Host) {
    Bytes send = input;
    if (in_place) {
      outcome.stats = strategy.run(send.data(), send.data(), count);
      outcome.result = std::move(send);
    } else {
      outcome.result = garbage;
      outcome.stats = strategy.run(send.data(), outcome.result.data(), count);
      EXPECT_EQ(send, input) << "the input changed out of place";
    }
    return outcome;
  }
  LocalOps& local = comm.local();
  const std::size_t bytes = input.size();
  const Buffer send = local.allocate(std::max<std::size_t>(bytes, 1));
  const Buffer recv = local.allocate(std::max<std::size_t>(bytes, 1));
  if (bytes > 0) {
    local.upload(send.get(), input.data(), bytes);
    local.upload(recv.get(), garbage.data(), bytes);
  }
  outcome.stats = strategy.run(send.get(), in_place ? send.get() : recv.get(), count);
  outcome.result.resize(bytes);
  if (bytes > 0) local.download(outcome.result.data(), in_place ? send.get() : recv.get(), bytes);
  if (!in_place && bytes > 0) {
    Bytes after(bytes);
    local.download(after.data(), send.get(), bytes);
    EXPECT_EQ(after, input) << "the input changed out of place";
  }
  return outcome;
}

// First element whose bytes differ, or nullopt.
std::optional<std::size_t> firstDifference(const Bytes& a, const Bytes& b, std::size_t element_bytes) {
  for (std::size_t e = 0; e * element_bytes < a.size(); ++e)
    if (std::memcmp(a.data() + e * element_bytes, b.data() + e * element_bytes, element_bytes) != 0) return e;
  return std::nullopt;
}

void expectFloatsIdentical(const std::vector<float>& actual, const std::vector<float>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  const auto difference = firstDifference(asBytes(actual), asBytes(expected), sizeof(float));
  if (difference)
    ADD_FAILURE() << fmt::format("element {} of {}: {:a}, expected {:a}", *difference, actual.size(),
                                 actual[*difference], expected[*difference]);
}

// ---- Checks per aggregator ---------------------------------------------------------------------------

// Lossless sums: the exact sum, bit for bit.
void checkExactSum(Communicator& comm, Strategy& strategy, DType dtype, std::size_t count, bool in_place,
                   std::uint32_t seed) {
  std::vector<double> exact(count, 0.0);
  for (int r = 0; r < comm.size(); ++r) {
    const std::vector<double> values = integers(seed, r, count);
    for (std::size_t e = 0; e < count; ++e) exact[e] += values[e];
  }
  const Outcome outcome =
      runStrategy(comm, strategy, encodeAs(dtype, integers(seed, comm.rank(), count)), count, in_place);
  const Bytes expected = encodeAs(dtype, exact);
  ASSERT_EQ(outcome.result.size(), expected.size());
  const auto difference = firstDifference(outcome.result, expected, sizeOf(dtype));
  if (difference)
    ADD_FAILURE() << fmt::format("element {} of {} differs from the exact sum {}", *difference, count,
                                 exact[*difference]);
}

// The documented bound of a wire-precision sum (docs/methods.md), per element:
//   |out − Σ x_r| <= (θ + (1+θ)·((1+u_32)·γ + u_32))·Σ|x_r| + floor,
//   θ = (1+u_w)(1+u_32)² − 1, γ = (N−1)·u_h / (1 − (N−1)·u_h), u_h = u_w + u_32 + u_w·u_32;
//   floor = 2N²·2^-25·(1+γ) for fp16 (its subnormals), N·η·Σ_r amax_r·(1+γ)(1+θ) for fp8 (amax_r over the
//   scaling block, η = half the smallest subnormal step / the fp8 maximum), 0 for bf16.
struct WireBound {
  double unit = 0;  // u_w
  double eta = 0;   // fp8 floor per unit of block amax
};

WireBound wireBound(WireFormat format) {
  switch (format) {
    case WireFormat::Fp16: return {0x1p-11, 0};
    case WireFormat::Bf16: return {0x1p-8, 0};
    case WireFormat::Fp8E4M3: return {0x1p-4, 0x1p-10 / 448.0};
    case WireFormat::Fp8E5M2: return {0x1p-3, 0x1p-17 / 57344.0};
  }
  return {};
}

void checkWireSum(Communicator& comm, Strategy& strategy, WireFormat format, std::size_t count, bool in_place,
                  std::uint32_t seed) {
  const int n = comm.size();
  // fp8 scales per block where the communicator moves scaled blocks (MPI), else per buffer (NCCL).
  const std::size_t block =
      comm.supportsScaledBlocks() ? StrategyOptions{}.fp8_block : std::max<std::size_t>(count, 1);
  std::vector<double> exact(count, 0.0), magnitude(count, 0.0), block_amax(count, 0.0);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> values = normals(seed, r, count);
    for (std::size_t first = 0; first < count; first += block) {
      const std::size_t last = std::min(count, first + block);
      double amax = 0;
      for (std::size_t e = first; e < last; ++e) amax = std::max(amax, std::fabs(double{values[e]}));
      for (std::size_t e = first; e < last; ++e) block_amax[e] += amax;
    }
    for (std::size_t e = 0; e < count; ++e) {
      exact[e] += double{values[e]};
      magnitude[e] += std::fabs(double{values[e]});
    }
  }
  const Outcome outcome =
      runStrategy(comm, strategy, asBytes(normals(seed, comm.rank(), count)), count, in_place);
  const std::vector<float> result = asFloats(outcome.result);
  ASSERT_EQ(result.size(), count);
  EXPECT_EQ(outcome.stats.wire.overflow, 0u);
  EXPECT_EQ(outcome.stats.wire.nan, 0u);
  const WireBound bound = wireBound(format);
  const double theta = (1 + bound.unit) * (1 + kU32) * (1 + kU32) - 1;
  const double hop = bound.unit + kU32 + bound.unit * kU32;
  const double gamma = (n - 1) * hop / (1 - (n - 1) * hop);
  const double relative = theta + (1 + theta) * ((1 + kU32) * gamma + kU32);
  const double floor_fp16 = format == WireFormat::Fp16 ? 2.0 * n * n * 0x1p-25 * (1 + gamma) : 0.0;
  for (std::size_t e = 0; e < count; ++e) {
    const double limit =
        relative * magnitude[e] + floor_fp16 + n * bound.eta * block_amax[e] * (1 + gamma) * (1 + theta);
    const double error = std::fabs(double{result[e]} - exact[e]);
    if (!(error <= limit)) {
      ADD_FAILURE() << fmt::format("element {} of {}: {} vs the exact {}: error {:.3g} over the bound {:.3g}",
                                   e, count, result[e], exact[e], error, limit);
      return;
    }
  }
}

// AdaCons: the step's scalars bit for bit; the aggregate within (N+2)·u_32·Σ_i|c_i·g_i[e]|.
void checkAdaCons(Communicator& comm, Strategy& strategy, std::size_t count, bool in_place,
                  std::uint32_t seed, methods::AdaConsState& reference_state) {
  const int n = comm.size();
  std::vector<std::vector<float>> gradients;
  for (int r = 0; r < n; ++r) gradients.push_back(scaledIntegers(seed, r, count));
  const Outcome outcome =
      runStrategy(comm, strategy, asBytes(gradients[static_cast<std::size_t>(comm.rank())]), count, in_place);
  if (count == 0) {
    EXPECT_FALSE(outcome.stats.adacons) << "count 0 is a no-op";
    return;
  }
  std::vector<float> expected(count);
  const methods::AdaConsStep reference = methods::adacons(pointers(gradients), count, reference_state,
                                                          StrategyOptions{}.adacons, expected.data());
  ASSERT_TRUE(outcome.stats.adacons);
  const methods::AdaConsStep& step = *outcome.stats.adacons;
  EXPECT_EQ(step.alpha, reference.alpha);
  EXPECT_EQ(step.smoothed, reference.smoothed);
  EXPECT_EQ(step.weights, reference.weights);
  EXPECT_EQ(step.norms, reference.norms);
  EXPECT_EQ(step.scale, reference.scale);

  std::vector<double> coefficient(static_cast<std::size_t>(n), 0.0);
  for (std::size_t i = 0; i < coefficient.size(); ++i)
    if (reference.norms[i] > 0)
      coefficient[i] = reference.scale * (reference.weights[i] / reference.norms[i]);
  const std::vector<float> result = asFloats(outcome.result);
  for (std::size_t e = 0; e < count; ++e) {
    double magnitude = 0;
    for (std::size_t i = 0; i < gradients.size(); ++i)
      magnitude += std::fabs(coefficient[i] * double{gradients[i][e]});
    const double limit =
        (n + 2) * kU32 * magnitude * (1 + 1e-6) + double{std::numeric_limits<float>::denorm_min()};
    const double error = std::fabs(double{result[e]} - double{expected[e]});
    if (!(error <= limit)) {
      ADD_FAILURE() << fmt::format(
          "element {} of {}: {} vs methods::adacons {}: error {:.3g} over the bound {:.3g}", e, count,
          result[e], expected[e], error, limit);
      return;
    }
  }
}

// AdaSum: methods::adasum over the ranks' vectors in rank order, bit for bit.
void checkAdaSum(Communicator& comm, Strategy& strategy, std::size_t count, bool in_place,
                 std::uint32_t seed) {
  std::vector<std::vector<float>> gradients;
  for (int r = 0; r < comm.size(); ++r) gradients.push_back(scaledIntegers(seed, r, count));
  const Outcome outcome =
      runStrategy(comm, strategy, asBytes(gradients[static_cast<std::size_t>(comm.rank())]), count, in_place);
  std::vector<float> expected(count);
  methods::adasum(pointers(gradients), count, expected.data());
  expectFloatsIdentical(asFloats(outcome.result), expected);
}

// Whether `name` is in the communicator's default list for fp32: the wire formats a backend cannot
// reduce are left out there (NCCL's fp8 types need an sm_90 GPU), and the tests that name strategies
// themselves skip those too. MPI reduces every format, so there a missing name is a failure.
bool applies(const Communicator& comm, const StrategyName& name) {
  const std::vector<StrategyName> names = applicableStrategies(comm, DType::Fp32);
  const bool found = std::find(names.begin(), names.end(), name) != names.end();
  if (!found && comm.backend() == Backend::Mpi) ADD_FAILURE() << name.text() << " does not apply on MPI";
  return found;
}

std::vector<std::size_t> testCounts(int ranks) {
  return {0, 1, 7, static_cast<std::size_t>(ranks) * 5 + 1, 10007};
}

// ---- Tests -------------------------------------------------------------------------------------------

TEST(Strategies, EveryApplicableStrategyOnFp32) {
  Communicator& comm = testWorld();
  const std::vector<StrategyName> names = applicableStrategies(comm, DType::Fp32);
  ASSERT_FALSE(names.empty());
  std::uint32_t seed = 0;
  for (const StrategyName& name : names) {
    SCOPED_TRACE(name.text());
    const std::unique_ptr<Strategy> strategy = makeStrategy(name, comm, DType::Fp32);
    EXPECT_EQ(strategy->name(), name);
    EXPECT_EQ(strategy->lossless(), name.aggregator == Aggregator::Sum && !name.wire);
    methods::AdaConsState reference_state;  // follows the strategy's momentum across its runs
    for (std::size_t count : testCounts(comm.size()))
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(fmt::format("count {}, {}", count, in_place ? "in place" : "out of place"));
        ++seed;
        switch (name.aggregator) {
          case Aggregator::Sum:
            if (name.wire) checkWireSum(comm, *strategy, *name.wire, count, in_place, seed);
            else checkExactSum(comm, *strategy, DType::Fp32, count, in_place, seed);
            break;
          case Aggregator::AdaCons:
            checkAdaCons(comm, *strategy, count, in_place, seed, reference_state);
            break;
          case Aggregator::AdaSum: checkAdaSum(comm, *strategy, count, in_place, seed); break;
          case Aggregator::Async: ADD_FAILURE() << "async strategies are not applicable ones"; break;
        }
      }
  }
}

// rs_ag on the host works through its blocks in chunks of 2^17 fp32 elements (pipelined_rs_ag.h): a
// block of one chunk and 1024 elements per rank, plus a few elements, takes each rank through a full
// chunk, a partial one and uneven blocks; fp8's records (128 elements) make the chunks whole blocks.
TEST(Strategies, RsAgAcrossChunks) {
  Communicator& comm = testWorld();
  const std::size_t count = static_cast<std::size_t>(comm.size()) * ((1 << 17) + 1024) + 5;
  std::uint32_t seed = 200;
  for (const char* text : {"sum/rs_ag", "sum/rs_ag/bf16", "sum/rs_ag/fp16", "sum/rs_ag/fp8e4m3",
                           "sum/rs_ag/fp8e5m2", "adacons/rs_ag"}) {
    SCOPED_TRACE(text);
    const StrategyName name = *parseStrategyName(text);
    if (!applies(comm, name)) continue;
    const std::unique_ptr<Strategy> strategy = makeStrategy(name, comm, DType::Fp32);
    methods::AdaConsState reference_state;
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(in_place ? "in place" : "out of place");
      if (name.aggregator == Aggregator::AdaCons) {
        checkAdaCons(comm, *strategy, count, in_place, ++seed, reference_state);
      } else if (name.wire) {
        checkWireSum(comm, *strategy, *name.wire, count, in_place, ++seed);
      } else {
        checkExactSum(comm, *strategy, DType::Fp32, count, in_place, ++seed);
      }
    }
  }
}

TEST(Strategies, LosslessSumsOnOtherDTypesAreExact) {
  Communicator& comm = testWorld();
  for (DType dtype : {DType::Fp64, DType::Fp16, DType::Bf16}) {
    SCOPED_TRACE(name(dtype));
    const std::vector<StrategyName> names = applicableStrategies(comm, dtype);
    if (dtype == DType::Fp64) {
      ASSERT_FALSE(names.empty());
    }
    std::uint32_t seed = 100;
    for (const StrategyName& name : names) {
      SCOPED_TRACE(name.text());
      EXPECT_EQ(name.aggregator, Aggregator::Sum);
      EXPECT_FALSE(name.wire);
      const std::unique_ptr<Strategy> strategy = makeStrategy(name, comm, dtype);
      for (std::size_t count : testCounts(comm.size()))
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(fmt::format("count {}, {}", count, in_place ? "in place" : "out of place"));
          checkExactSum(comm, *strategy, dtype, count, in_place, ++seed);
        }
    }
  }
}

TEST(Strategies, AdaConsMomentumOverSeveralSteps) {
  Communicator& comm = testWorld();
  StrategyName name;
  name.aggregator = Aggregator::AdaCons;
  const std::unique_ptr<Strategy> strategy = makeStrategy(name, comm, DType::Fp32);
  methods::AdaConsState reference_state;
  for (std::uint32_t step = 0; step < 6; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    checkAdaCons(comm, *strategy, 4099, step % 2 == 1, 500 + step, reference_state);
  }
  EXPECT_EQ(reference_state.sorted_momentum.size(), static_cast<std::size_t>(comm.size()));
}

TEST(Strategies, AdaConsRefusesAllZeroGradientsOnEveryRank) {
  Communicator& comm = testWorld();
  StrategyName name;
  name.aggregator = Aggregator::AdaCons;
  const std::unique_ptr<Strategy> strategy = makeStrategy(name, comm, DType::Fp32);
  const std::vector<float> zeros(33, 0.0f);
  EXPECT_THROW(runStrategy(comm, *strategy, asBytes(zeros), zeros.size(), false), Error);
  // The refusal left the strategy usable (and its momentum untouched).
  methods::AdaConsState reference_state;
  checkAdaCons(comm, *strategy, 100, false, 900, reference_state);
}

// Schedules that depend on the number of ranks (AdaSum's tree: which rank combines and broadcasts; rs_ag's
// uneven blocks; the wire bounds' growth with N): every size from 1 to the world's, on sub-communicators
// of the first k ranks. ctest runs it with 6 ranks too, which covers a final AdaSum step between two
// slots and slots passing between ranks.
TEST(Strategies, EveryWorldSize) {
  Communicator& world = testWorld();
  for (int size = 1; size <= world.size(); ++size) {
    const bool member = world.rank() < size;
    const std::unique_ptr<Communicator> comm = world.split(member ? 0 : 1, world.rank());
    if (!member) continue;
    SCOPED_TRACE(fmt::format("{} ranks", size));
    StrategyName adasum_name, adacons_name;
    adasum_name.aggregator = Aggregator::AdaSum;
    adacons_name.aggregator = Aggregator::AdaCons;
    const std::unique_ptr<Strategy> adasum = makeStrategy(adasum_name, *comm, DType::Fp32);
    const std::unique_ptr<Strategy> adacons = makeStrategy(adacons_name, *comm, DType::Fp32);
    methods::AdaConsState reference_state;
    std::vector<std::unique_ptr<Strategy>> sums;
    for (const char* text : {"sum/native", "sum/rs_ag", "sum/reduce_bcast", "sum/hier", "sum/native/fp16",
                             "sum/hier/bf16", "sum/rs_ag/fp8e5m2", "sum/reduce_bcast/fp8e4m3"})
      if (applies(*comm, *parseStrategyName(text)))
        sums.push_back(makeStrategy(*parseStrategyName(text), *comm, DType::Fp32));
    std::uint32_t seed = 700;
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4097}, std::size_t{10007}})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(fmt::format("count {}, {}", count, in_place ? "in place" : "out of place"));
        checkAdaSum(*comm, *adasum, count, in_place, ++seed);
        checkAdaCons(*comm, *adacons, count, in_place, ++seed, reference_state);
        for (const auto& sum : sums) {
          SCOPED_TRACE(sum->name().text());
          if (sum->name().wire) checkWireSum(*comm, *sum, *sum->name().wire, count, in_place, ++seed);
          else checkExactSum(*comm, *sum, DType::Fp32, count, in_place, ++seed);
        }
      }
  }
}

TEST(Strategies, WireCountsOverflowAndNaNOfThisRank) {
  Communicator& comm = testWorld();
  const int n = comm.size();
  const std::size_t count = 1000;
  for (WireFormat format : kWireFormats) {
    SCOPED_TRACE(name(format));
    StrategyName name;
    name.wire = format;
    if (!applies(comm, name)) continue;
    const std::unique_ptr<Strategy> strategy = makeStrategy(name, comm, DType::Fp32);
    std::vector<float> input = normals(7, comm.rank(), count);
    const auto nan_at = static_cast<std::size_t>(comm.rank());
    const auto big_at = static_cast<std::size_t>(500 + comm.rank());
    input[nan_at] = std::numeric_limits<float>::quiet_NaN();
    // Past fp16's range even after the prescale 1/N; within every other format's (bf16 has fp32's range,
    // fp8 scales per block).
    input[big_at] = 70000.0f * static_cast<float>(n);
    const bool fp16 = format == WireFormat::Fp16;
    const Outcome outcome = runStrategy(comm, *strategy, asBytes(input), count, false);
    const RunStats& stats = outcome.stats;
    const std::vector<float> out = asFloats(outcome.result);
    EXPECT_EQ(stats.wire.nan, 1u);
    EXPECT_EQ(stats.wire.overflow, fp16 ? 1u : 0u);
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(r)])) << "NaN of rank " << r;
      if (fp16) {
        EXPECT_TRUE(std::isinf(out[static_cast<std::size_t>(500 + r)])) << "overflow of rank " << r;
      }
    }
  }
}

TEST(Strategies, BadInputIsRefusedWithOneLine) {
  Communicator& comm = testWorld();
  const auto expectRefusal = [&](const StrategyName& name, DType dtype, const std::string& fragment) {
    try {
      makeStrategy(name, comm, dtype);
      ADD_FAILURE() << name.text() << " on " << gradscope::name(dtype) << " was accepted";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  };
  StrategyName wire_fp16;
  wire_fp16.wire = WireFormat::Fp16;
  expectRefusal(wire_fp16, DType::Fp64, "sum/native/fp16 needs fp32 input, not fp64");
  StrategyName adasum_rs_ag;
  adasum_rs_ag.aggregator = Aggregator::AdaSum;
  adasum_rs_ag.transport = Transport::RsAg;
  expectRefusal(adasum_rs_ag, DType::Fp32, "adasum/rs_ag: adasum only runs as adasum/native");
  StrategyName adacons_bf16;
  adacons_bf16.aggregator = Aggregator::AdaCons;
  adacons_bf16.wire = WireFormat::Bf16;
  expectRefusal(adacons_bf16, DType::Fp32, "adacons/native/bf16: adacons and adasum take no wire precision");
  StrategyName adasum;
  adasum.aggregator = Aggregator::AdaSum;
  expectRefusal(adasum, DType::Fp64, "adasum/native needs fp32 input, not fp64");
  if (comm.backend() == Backend::Mpi)
    expectRefusal(*parseStrategyName("sum/nccl.ring.ll128"), DType::Fp32,
                  "sum/nccl.ring.ll128 needs the nccl backend");
  else expectRefusal(*parseStrategyName("sum/mpi.ring"), DType::Fp32, "sum/mpi.ring needs the mpi backend");
  expectRefusal(StrategyName{}, DType::Int32, "sum/native takes fp32, fp64, fp16 or bf16 input, not int32");
  EXPECT_TRUE(applicableStrategies(comm, DType::Int32).empty());
}

TEST(StrategyNames, PrintAndParseRoundTrip) {
  std::vector<StrategyName> names = applicableStrategies(testWorld(), DType::Fp32);
  for (int algorithm = 0; algorithm < kNcclAlgoCount; ++algorithm)
    for (int protocol = 0; protocol < kNcclProtoCount; ++protocol)
      for (std::optional<WireFormat> wire :
           {std::optional<WireFormat>(), std::optional(WireFormat::Fp8E4M3)}) {
        StrategyName name;
        name.transport = Transport::Engine;
        name.engine = Backend::Nccl;
        name.algorithm = algorithm;
        name.protocol = protocol;
        name.wire = wire;
        names.push_back(name);
      }
  for (const StrategyName& name : names) {
    const std::string text = name.text();
    std::string error;
    const std::optional<StrategyName> parsed = parseStrategyName(text, &error);
    ASSERT_TRUE(parsed) << text << ": " << error;
    EXPECT_EQ(*parsed, name) << text;
    EXPECT_EQ(parsed->text(), text);
    std::string upper = text;
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    ASSERT_TRUE(parseStrategyName(upper)) << upper;
    EXPECT_EQ(*parseStrategyName(upper), name) << upper;
  }
  EXPECT_EQ(parseStrategyName("Sum/NCCL.Tree.LL128/BF16")->text(), "sum/nccl.tree.ll128/bf16");
  EXPECT_EQ(parseStrategyName("sum/rs_ag/native")->text(), "sum/rs_ag");
  EXPECT_EQ(parseStrategyName("sum/mpi.rabenseifner")->text(), "sum/mpi.rabenseifner");
}

TEST(StrategyNames, DefaultListIsStable) {
  std::vector<std::string> texts;
  for (const StrategyName& name : applicableStrategies(testWorld(), DType::Fp32))
    texts.push_back(name.text());
  ASSERT_GE(texts.size(), 4u);
  EXPECT_EQ(texts[0], "sum/native");
  EXPECT_EQ(texts[1], "sum/rs_ag");
  EXPECT_EQ(texts[2], "sum/reduce_bcast");
  EXPECT_EQ(texts[3], "sum/hier");
  EXPECT_NE(std::find(texts.begin(), texts.end(), "sum/rs_ag/bf16"), texts.end());
  EXPECT_NE(std::find(texts.begin(), texts.end(), "sum/hier/fp8e5m2"), texts.end());
  const char* engine =
      testWorld().backend() == Backend::Mpi ? "sum/mpi.recursive_doubling" : "sum/nccl.ring.simple";
  EXPECT_NE(std::find(texts.begin(), texts.end(), engine), texts.end());
  EXPECT_EQ(texts[texts.size() - 3], "adacons/native");
  EXPECT_EQ(texts[texts.size() - 2], "adacons/rs_ag");
  EXPECT_EQ(texts.back(), "adasum/native");
}

}  // namespace
}  // namespace gradscope::comm
