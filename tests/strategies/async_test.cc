// async/stale<K> and async/dga<K> (async.h) on the MPI communicator, under mpiexec with 2 and 3 ranks at
// MPI_THREAD_MULTIPLE (`--threads multiple`). Inputs are small integers regenerated on every rank from
// (seed, step, rank, index), so every sum and every dga correction is exact and each rank can compute
// what each step must return: bit for bit.

#include "gradscope/comm/async.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gradscope/comm/communicator.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/error.h"
#include "gradscope/common/strategy_name.h"
#include "strategies_test_world.h"

namespace gradscope::comm {
namespace {

// Integers in [-64, 64], different for every step, rank and element.
std::uint64_t mixAsync(std::uint64_t seed, std::uint64_t step, std::uint64_t rank, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + step * 0xD1B54A32D192ED03ull +
                    rank * 0xBF58476D1CE4E5B9ull + index * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double gradientAt(std::uint32_t seed, std::int64_t step, int rank, std::size_t index) {
  const std::uint64_t z =
      mixAsync(seed, static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(rank), index);
  return static_cast<double>(static_cast<int>(z % 129) - 64);
}

double sumAt(std::uint32_t seed, std::int64_t step, int ranks, std::size_t index) {
  double sum = 0;
  for (int r = 0; r < ranks; ++r) sum += gradientAt(seed, step, r, index);
  return sum;
}

// The worker, or a skip where this world cannot run one (MPI below MPI_THREAD_MULTIPLE).
std::shared_ptr<AsyncWorker> workerOrSkip(std::string& why) {
  try {
    return std::make_shared<AsyncWorker>(testWorld());
  } catch (const Error& error) {
    why = error.what();
    return nullptr;
  }
}

template <typename T>
std::vector<T> gradients(std::uint32_t seed, std::int64_t step, int rank, std::size_t count) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<T>(gradientAt(seed, step, rank, i));
  return values;
}

// Runs `steps` steps of one site (count changing to `count_after` at step `change_at`) and checks every
// result against the exact expectation. `global` counts the steps; the site's own step restarts at a change.
template <typename T>
void checkSite(const std::string& text, DType dtype, std::uint32_t seed, std::size_t count,
               std::size_t count_after, std::int64_t change_at, std::int64_t steps,
               const std::shared_ptr<AsyncWorker>& worker) {
  Communicator& comm = testWorld();
  const StrategyName name = *parseStrategyName(text);
  StrategyOptions options;
  options.async_worker = worker;
  const std::unique_ptr<Strategy> strategy = makeStrategy(name, comm, dtype, options);
  EXPECT_FALSE(strategy->lossless());
  const int ranks = comm.size();
  const int K = name.staleness;
  std::int64_t restarted_at = 0;
  for (std::int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE(fmt::format("{} {}, step {}", text, gradscope::name(dtype), step));
    const std::size_t n = step < change_at ? count : count_after;
    if (step == change_at) restarted_at = step;
    std::vector<T> send = gradients<T>(seed, step, comm.rank(), n);
    std::vector<T> recv(n, T(-1));
    const bool in_place = step % 2 == 1;
    if (in_place) {
      recv = send;
      strategy->run(recv.data(), recv.data(), n);
    } else {
      strategy->run(send.data(), recv.data(), n);
      EXPECT_EQ(send, gradients<T>(seed, step, comm.rank(), n)) << "send changed";
    }
    const std::int64_t local = step - restarted_at;
    for (std::size_t i = 0; i < n; ++i) {
      double expected = 0;
      if (local < K) {
        expected = sumAt(seed, step, ranks, i);
      } else {
        expected = sumAt(seed, step - K, ranks, i);
        if (name.delay == StrategyName::Delay::Dga)
          expected +=
              ranks * (gradientAt(seed, step, comm.rank(), i) - gradientAt(seed, step - K, comm.rank(), i));
      }
      const T want = static_cast<T>(expected);
      ASSERT_EQ(std::memcmp(&recv[i], &want, sizeof(T)), 0)
          << "element " << i << ": got " << recv[i] << ", want " << want << (in_place ? " (in place)" : "");
    }
  }
}

TEST(Async, StaleAndDgaStepByStepWithASizeChange) {
  std::string why;
  const auto worker = workerOrSkip(why);
  if (!worker) GTEST_SKIP() << why;
  std::uint32_t seed = 1;
  for (const char* text : {"async/stale1", "async/stale2", "async/stale4", "async/dga1", "async/dga2"}) {
    checkSite<float>(text, DType::Fp32, ++seed, 7, 300, 9, 16, worker);
    checkSite<double>(text, DType::Fp64, ++seed, 1, 5, 6, 10, worker);
  }
}

// Sites of one communicator share its worker, their sums interleaved as a job's layers are.
TEST(Async, SitesShareOneWorker) {
  std::string why;
  const auto worker = workerOrSkip(why);
  if (!worker) GTEST_SKIP() << why;
  Communicator& comm = testWorld();
  StrategyOptions options;
  options.async_worker = worker;
  const auto stale = makeStrategy(*parseStrategyName("async/stale1"), comm, DType::Fp32, options);
  const auto dga = makeStrategy(*parseStrategyName("async/dga1"), comm, DType::Fp32, options);
  const int ranks = comm.size();
  constexpr std::uint32_t kSeedA = 11, kSeedB = 12;
  constexpr std::size_t kA = 1000, kB = 3;
  for (std::int64_t step = 0; step < 6; ++step) {
    std::vector<float> a = gradients<float>(kSeedA, step, comm.rank(), kA);
    std::vector<float> b = gradients<float>(kSeedB, step, comm.rank(), kB);
    stale->run(a.data(), a.data(), kA);
    dga->run(b.data(), b.data(), kB);
    const std::int64_t source = step == 0 ? 0 : step - 1;
    for (std::size_t i = 0; i < kA; ++i)
      ASSERT_EQ(a[i], static_cast<float>(sumAt(kSeedA, source, ranks, i))) << "step " << step << " a" << i;
    for (std::size_t i = 0; i < kB; ++i) {
      double want = sumAt(kSeedB, source, ranks, i);
      if (step > 0)
        want +=
            ranks * (gradientAt(kSeedB, step, comm.rank(), i) - gradientAt(kSeedB, step - 1, comm.rank(), i));
      ASSERT_EQ(b[i], static_cast<float>(want)) << "step " << step << " b" << i;
    }
  }
}

TEST(Async, RefusesWhatItCannotRun) {
  std::string why;
  const auto worker = workerOrSkip(why);
  if (!worker) GTEST_SKIP() << why;
  StrategyOptions options;
  options.async_worker = worker;
  EXPECT_THROW(makeStrategy(*parseStrategyName("async/stale1"), testWorld(), DType::Int32, options), Error);
  std::string error;
  EXPECT_FALSE(parseStrategyName("async/stale5", &error));
  EXPECT_FALSE(parseStrategyName("async/stale1/bf16", &error));
  EXPECT_FALSE(parseStrategyName("async/native", &error));
}

}  // namespace
}  // namespace gradscope::comm
