// Adaptive aggregators on N = 8 fp32 gradients of 16 Mi elements (64 MiB each), against memcpy
// bandwidth measured in the same run.
//
// bytes_per_second uses the bytes each CPU implementation reads and writes:
//   AdaCons         (2N + 1)·n·4   one pass for g_sum and the dot products (N reads), one for the
//                                  weighted aggregate (N reads, 1 write)
//   AdaSum          5(N − 1)·n·4   N − 1 pairwise ⊕, each a dot pass (2 reads) and a combine (2 reads, 1
//   write) Mean            (N + 1)·n·4 ConsensusStats  N·n·4
// vs_memcpy = best time of a parallel memcpy moving as many bytes (of 3) / best time of the method, as in
// local_sum_bench.cc.
//
//   gradscope_methods_bench --benchmark_filter=BM_Adaptive

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/cpu_executor.h"

namespace gradscope::methods {
namespace {

constexpr std::size_t kRanks = 8;
constexpr std::size_t kCount = std::size_t{16} << 20;

struct Gradients8 {
  std::vector<std::unique_ptr<float[]>> gradients;
  std::unique_ptr<float[]> out;

  static Gradients8& get() {
    static Gradients8 data = [] {
      Gradients8 d;
      std::uint64_t state = 0x2545F4914F6CDD1Dull;
      for (std::size_t r = 0; r < kRanks; ++r) {
        d.gradients.emplace_back(new float[kCount]);
        for (std::size_t i = 0; i < kCount; ++i) {
          state ^= state << 13;
          state ^= state >> 7;
          state ^= state << 17;
          // A shared direction plus noise, so that AdaCons' α are positive and distinct.
          const double noise = static_cast<double>(state >> 40) * 0x1p-23 - 1.0;
          d.gradients.back()[i] = static_cast<float>(0.3 * std::sin(static_cast<double>(i) * 1e-3) + noise);
        }
      }
      d.out.reset(new float[kCount]);
      std::memset(d.out.get(), 0, kCount * sizeof(float));
      return d;
    }();
    return data;
  }

  std::vector<const float*> pointers() const {
    std::vector<const float*> result;
    for (const auto& g : gradients) result.push_back(g.get());
    return result;
  }
};

double seconds(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

double bestMemcpySeconds(const Gradients8& data, std::size_t bytes) {
  CpuExecutor& executor = CpuExecutor::shared();
  const std::size_t buffer_bytes = kCount * sizeof(float);
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    std::size_t left = bytes / 2;
    for (std::size_t source = 0; left > 0; source = (source + 1) % kRanks) {
      const std::size_t chunk = std::min(left, buffer_bytes);
      const auto* from = reinterpret_cast<const std::byte*>(data.gradients[source].get());
      auto* to = reinterpret_cast<std::byte*>(data.out.get());
      executor.parallelFor(chunk, 2, 4096, [&](std::size_t begin, std::size_t end) {
        std::memcpy(to + begin, from + begin, end - begin);
      });
      left -= chunk;
    }
    best = std::min(best, seconds(std::chrono::steady_clock::now() - start));
  }
  return best;
}

void runTimed(benchmark::State& state, std::size_t bytes, const std::function<void()>& method) {
  const Gradients8& data = Gradients8::get();
  method();  // warm-up (and first-touch of any scratch)
  const double memcpy_best = bestMemcpySeconds(data, bytes);
  double best = std::numeric_limits<double>::infinity();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    method();
    const double elapsed = seconds(std::chrono::steady_clock::now() - start);
    state.SetIterationTime(elapsed);
    best = std::min(best, elapsed);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
  state.counters["vs_memcpy"] = memcpy_best / best;
  state.counters["GBps_best"] = static_cast<double>(bytes) / best * 1e-9;
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["N"] = static_cast<double>(kRanks);
}

void BM_AdaptiveAdaCons(benchmark::State& state) {
  Gradients8& data = Gradients8::get();
  const auto g = data.pointers();
  AdaConsState momentum;
  AdaConsOptions options;
  options.scale = AdaConsScale::MatchSumNorm;
  runTimed(state, (2 * kRanks + 1) * kCount * sizeof(float),
           [&] { adacons(g, kCount, momentum, options, data.out.get()); });
}

void BM_AdaptiveAdaSum(benchmark::State& state) {
  Gradients8& data = Gradients8::get();
  const auto g = data.pointers();
  runTimed(state, 5 * (kRanks - 1) * kCount * sizeof(float), [&] { adasum(g, kCount, data.out.get()); });
}

void BM_AdaptiveMean(benchmark::State& state) {
  Gradients8& data = Gradients8::get();
  const auto g = data.pointers();
  runTimed(state, (kRanks + 1) * kCount * sizeof(float), [&] { mean(g, kCount, data.out.get()); });
}

void BM_AdaptiveConsensusStats(benchmark::State& state) {
  Gradients8& data = Gradients8::get();
  const auto g = data.pointers();
  runTimed(state, kRanks * kCount * sizeof(float),
           [&] { benchmark::DoNotOptimize(consensusStats(g, kCount)); });
}

BENCHMARK(BM_AdaptiveAdaCons)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdaptiveAdaSum)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdaptiveMean)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdaptiveConsensusStats)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gradscope::methods
