// async/stale<K> and async/dga<K> (async.h) on the test world's communicator: MPI under mpiexec with 2 and
// 3 ranks at MPI_THREAD_MULTIPLE (`--threads multiple`), whose worker is a thread, and NCCL on a GPU
// (strategies_test_nccl_main.cc), whose worker is a second stream. Buffers are in the communicator's
// memory (uploaded and downloaded through its LocalOps). Inputs are small integers regenerated on every
// rank from (seed, step, rank, index), so every sum and every dga correction is exact in all four dtypes
// and each rank can compute what each step must return: bit for bit.

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
#include "gradscope/methods/element.h"
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
    return AsyncWorker::make(testWorld());
  } catch (const Error& error) {
    why = error.what();
    return nullptr;
  }
}

using Bytes = std::vector<std::byte>;

// A rank's gradient of a step, as `dtype`'s bytes.
Bytes gradients(DType dtype, std::uint32_t seed, std::int64_t step, int rank, std::size_t count) {
  Bytes values(count * sizeOf(dtype));
  for (std::size_t i = 0; i < count; ++i)
    methods::storeElement(dtype, values.data(), i, gradientAt(seed, step, rank, i));
  return values;
}

// A buffer of the communicator's memory holding `bytes`, and back.
Buffer toComm(Communicator& comm, const Bytes& bytes) {
  Buffer buffer = comm.local().allocate(bytes.size());
  comm.local().upload(buffer.get(), bytes.data(), bytes.size());
  return buffer;
}
Bytes fromComm(Communicator& comm, const Buffer& buffer, std::size_t bytes) {
  Bytes host(bytes);
  comm.local().download(host.data(), buffer.get(), bytes);
  return host;
}

// A call site of the test world under `text`, handing its sums to `worker`.
std::unique_ptr<Strategy> siteOf(const std::string& text, DType dtype,
                                 const std::shared_ptr<AsyncWorker>& worker) {
  StrategyOptions options;
  options.async_worker = worker;
  return makeStrategy(*parseStrategyName(text), testWorld(), dtype, options);
}

// Runs `steps` steps of one site (count changing to `count_after` at step `change_at`) and checks every
// result against the exact expectation. `global` counts the steps; the site's own step restarts at a change.
void checkSite(const std::string& text, DType dtype, std::uint32_t seed, std::size_t count,
               std::size_t count_after, std::int64_t change_at, std::int64_t steps,
               const std::shared_ptr<AsyncWorker>& worker) {
  Communicator& comm = testWorld();
  const StrategyName name = *parseStrategyName(text);
  const std::unique_ptr<Strategy> strategy = siteOf(text, dtype, worker);
  EXPECT_FALSE(strategy->lossless());
  const int ranks = comm.size();
  const int K = name.staleness;
  const std::size_t size = sizeOf(dtype);
  std::int64_t restarted_at = 0;
  for (std::int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE(fmt::format("{} {}, step {}", text, gradscope::name(dtype), step));
    const std::size_t n = step < change_at ? count : count_after;
    if (step == change_at) restarted_at = step;
    const Bytes send = gradients(dtype, seed, step, comm.rank(), n);
    const Buffer send_buffer = toComm(comm, send);
    const bool in_place = step % 2 == 1;
    const Buffer recv_buffer = in_place ? Buffer{} : toComm(comm, Bytes(n * size, std::byte{0xA5}));
    void* recv = in_place ? send_buffer.get() : recv_buffer.get();
    strategy->run(send_buffer.get(), recv, n);
    if (!in_place) {
      EXPECT_EQ(fromComm(comm, send_buffer, n * size), send) << "send changed";
    }
    const Bytes got = fromComm(comm, in_place ? send_buffer : recv_buffer, n * size);
    const std::int64_t local = step - restarted_at;
    Bytes want(n * size);
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
      methods::storeElement(dtype, want.data(), i, expected);
      ASSERT_EQ(std::memcmp(got.data() + i * size, want.data() + i * size, size), 0)
          << "element " << i << ": got " << methods::loadElement(dtype, got.data(), i) << ", want "
          << expected << (in_place ? " (in place)" : "");
    }
  }
}

// Every dtype: fp16 and bf16 too, where sums of integers within ±64 are exact up to 3 ranks, and so is a
// correction of up to 3 · 128 in fp16; bf16 rounds that once, as the expectation does.
TEST(Async, StaleAndDgaStepByStepWithASizeChange) {
  std::string why;
  const auto worker = workerOrSkip(why);
  if (!worker) GTEST_SKIP() << why;
  struct Shape {
    DType dtype;
    std::size_t count, count_after;
    std::int64_t change_at, steps;
  };
  constexpr Shape kShapes[] = {{DType::Fp32, 7, 300, 9, 16},
                               {DType::Fp64, 1, 5, 6, 10},
                               {DType::Fp16, 33, 4, 5, 9},
                               {DType::Bf16, 33, 4, 5, 9}};
  std::uint32_t seed = 1;
  for (const char* text : {"async/stale1", "async/stale2", "async/stale4", "async/dga1", "async/dga2"})
    for (const Shape& shape : kShapes)
      checkSite(text, shape.dtype, ++seed, shape.count, shape.count_after, shape.change_at, shape.steps,
                worker);
}

// Sites of one communicator share its worker, their sums interleaved as a job's layers are.
TEST(Async, SitesShareOneWorker) {
  std::string why;
  const auto worker = workerOrSkip(why);
  if (!worker) GTEST_SKIP() << why;
  Communicator& comm = testWorld();
  const auto stale = siteOf("async/stale1", DType::Fp32, worker);
  const auto dga = siteOf("async/dga1", DType::Fp32, worker);
  const int ranks = comm.size();
  constexpr std::uint32_t kSeedA = 11, kSeedB = 12;
  constexpr std::size_t kA = 1000, kB = 3;
  for (std::int64_t step = 0; step < 6; ++step) {
    const Buffer a = toComm(comm, gradients(DType::Fp32, kSeedA, step, comm.rank(), kA));
    const Buffer b = toComm(comm, gradients(DType::Fp32, kSeedB, step, comm.rank(), kB));
    stale->run(a.get(), a.get(), kA);
    dga->run(b.get(), b.get(), kB);
    std::vector<float> a_got(kA), b_got(kB);
    comm.local().download(a_got.data(), a.get(), kA * sizeof(float));
    comm.local().download(b_got.data(), b.get(), kB * sizeof(float));
    const std::int64_t source = step == 0 ? 0 : step - 1;
    for (std::size_t i = 0; i < kA; ++i)
      ASSERT_EQ(a_got[i], static_cast<float>(sumAt(kSeedA, source, ranks, i)))
          << "step " << step << " a" << i;
    for (std::size_t i = 0; i < kB; ++i) {
      double want = sumAt(kSeedB, source, ranks, i);
      if (step > 0)
        want +=
            ranks * (gradientAt(kSeedB, step, comm.rank(), i) - gradientAt(kSeedB, step - 1, comm.rank(), i));
      ASSERT_EQ(b_got[i], static_cast<float>(want)) << "step " << step << " b" << i;
    }
  }
}

// restart(): the site's next step is its step 0 again (synchronous for K steps), the size unchanged.
TEST(Async, RestartIsSynchronousAgainForKSteps) {
  std::string why;
  const auto worker = workerOrSkip(why);
  if (!worker) GTEST_SKIP() << why;
  Communicator& comm = testWorld();
  const std::unique_ptr<Strategy> built = siteOf("async/stale2", DType::Fp32, worker);
  auto* site = dynamic_cast<AsyncStrategy*>(built.get());
  ASSERT_NE(site, nullptr);
  constexpr std::uint32_t kSeed = 77;
  constexpr std::size_t kCount = 9;
  const int ranks = comm.size();
  // Steps 0-4, a restart, steps 5-8: the site's own steps 0, 1 (synchronous) and 2, 3 (stale by 2).
  const std::int64_t returned[] = {0, 1, 0, 1, 2, 5, 6, 5, 6};
  for (std::int64_t step = 0; step < 9; ++step) {
    if (step == 5) site->restart();
    const Buffer buffer = toComm(comm, gradients(DType::Fp32, kSeed, step, comm.rank(), kCount));
    site->run(buffer.get(), buffer.get(), kCount);
    std::vector<float> got(kCount);
    comm.local().download(got.data(), buffer.get(), kCount * sizeof(float));
    for (std::size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(got[i], static_cast<float>(sumAt(kSeed, returned[step], ranks, i)))
          << "step " << step << " " << i;
  }
}

TEST(Async, RefusesWhatItCannotRun) {
  std::string why;
  const auto worker = workerOrSkip(why);
  if (!worker) GTEST_SKIP() << why;
  EXPECT_THROW(siteOf("async/stale1", DType::Int32, worker), Error);
  std::string error;
  EXPECT_FALSE(parseStrategyName("async/stale5", &error));
  EXPECT_FALSE(parseStrategyName("async/stale1/bf16", &error));
  EXPECT_FALSE(parseStrategyName("async/native", &error));
}

}  // namespace
}  // namespace gradscope::comm
