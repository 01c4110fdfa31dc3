// Local multi-tensor sums against memcpy bandwidth measured in the same run.
//
// Every method × element type × K in {2, 4, 8} sums K inputs into a 64 MiB output (16 Mi fp32, 32 Mi
// fp16/bf16 or 8 Mi fp64 elements). bytes_per_second uses localSumBytesMoved (the bandwidth model of
// local_sum.h: (K+1)·n·size, (3K-2)·n·size for AccumulateN). Right before the timed loop each benchmark
// times a memcpy on the same thread pool that moves as many bytes (it copies bytes/2: a copy reads and
// writes each byte) and reports
//   vs_memcpy  = best memcpy time (of 3) / best method time     (1.0 = as fast as copying)
//   GBps_best  = bytes moved / best method time (decimal GB/s), memcpy_GBps likewise for the copy.
// Best-of times are what the ratio uses because other processes share the machine; the mean is the
// time column. Inputs are uniform in [-1, 1] rounded to the element type.
//
//   gradscope_methods_bench --benchmark_filter='BM_LocalSum|BM_MemcpyForLocalSum'

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "gradscope/common/types.h"
#include "gradscope/methods/cpu_executor.h"
#include "gradscope/methods/local_sum.h"
#include "gradscope/methods/numeric.h"

namespace gradscope::methods {
namespace {

constexpr std::size_t kOutputBytes = std::size_t{64} << 20;
constexpr std::size_t kMaxInputs = 8;

// K inputs and one output of 64 MiB each, allocated once and refilled when the element type changes
// (benchmarks run grouped by type).
struct Buffers {
  std::vector<std::unique_ptr<std::byte[]>> inputs;
  std::unique_ptr<std::byte[]> output;
  DType filled = DType::Other;

  static Buffers& get(DType dtype) {
    static Buffers buffers;
    if (buffers.inputs.empty()) {
      for (std::size_t i = 0; i < kMaxInputs; ++i) buffers.inputs.emplace_back(new std::byte[kOutputBytes]);
      buffers.output.reset(new std::byte[kOutputBytes]);
      std::memset(buffers.output.get(), 0, kOutputBytes);
    }
    if (buffers.filled != dtype) buffers.fill(dtype);
    return buffers;
  }

  void fill(DType dtype) {
    const std::size_t count = kOutputBytes / sizeOf(dtype);
    std::uint64_t state = 0x9E3779B97F4A7C15ull;
    for (auto& input : inputs) {
      for (std::size_t i = 0; i < count; ++i) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        const float value = static_cast<float>(static_cast<double>(state >> 40) * 0x1p-23 - 1.0);
        switch (dtype) {
          case DType::Fp32: reinterpret_cast<float*>(input.get())[i] = value; break;
          case DType::Fp64: reinterpret_cast<double*>(input.get())[i] = static_cast<double>(value); break;
          case DType::Fp16: reinterpret_cast<std::uint16_t*>(input.get())[i] = fp32ToFp16(value); break;
          case DType::Bf16: reinterpret_cast<std::uint16_t*>(input.get())[i] = fp32ToBf16(value); break;
          default: break;
        }
      }
    }
    filled = dtype;
  }
};

double seconds(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

// Best of three parallel copies that together move `bytes` (read + write), through the 64 MiB buffers.
double bestMemcpySeconds(Buffers& buffers, std::size_t bytes) {
  CpuExecutor& executor = CpuExecutor::shared();
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    std::size_t left = bytes / 2;
    for (std::size_t source = 0; left > 0; source = (source + 1) % kMaxInputs) {
      const std::size_t chunk = std::min(left, kOutputBytes);
      const std::byte* from = buffers.inputs[source].get();
      std::byte* to = buffers.output.get();
      executor.parallelFor(chunk, 2, 4096, [&](std::size_t begin, std::size_t end) {
        std::memcpy(to + begin, from + begin, end - begin);
      });
      left -= chunk;
    }
    best = std::min(best, seconds(std::chrono::steady_clock::now() - start));
  }
  return best;
}

void BM_LocalSum(benchmark::State& state, LocalSumMethod method, DType dtype, std::size_t k) {
  Buffers& buffers = Buffers::get(dtype);
  const std::size_t count = kOutputBytes / sizeOf(dtype);
  std::vector<const void*> inputs;
  for (std::size_t i = 0; i < k; ++i) inputs.push_back(buffers.inputs[i].get());
  const std::size_t bytes = localSumBytesMoved(method, dtype, k, count);

  localSum(method, dtype, inputs, buffers.output.get(), count);  // warm-up
  const double memcpy_best = bestMemcpySeconds(buffers, bytes);
  double best = std::numeric_limits<double>::infinity();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    localSum(method, dtype, inputs, buffers.output.get(), count);
    const double elapsed = seconds(std::chrono::steady_clock::now() - start);
    state.SetIterationTime(elapsed);
    best = std::min(best, elapsed);
  }
  benchmark::DoNotOptimize(buffers.output.get());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
  state.counters["vs_memcpy"] = memcpy_best / best;
  state.counters["GBps_best"] = static_cast<double>(bytes) / best * 1e-9;
  state.counters["memcpy_GBps"] = static_cast<double>(bytes) / memcpy_best * 1e-9;
  state.counters["K"] = static_cast<double>(k);
}

// The hardware reference on its own: a parallel 64 MiB copy (bytes_per_second counts read + write).
void BM_MemcpyForLocalSum(benchmark::State& state) {
  Buffers& buffers = Buffers::get(DType::Fp32);
  CpuExecutor& executor = CpuExecutor::shared();
  const std::byte* from = buffers.inputs[0].get();
  std::byte* to = buffers.output.get();
  for (auto _ : state) {
    executor.parallelFor(kOutputBytes, 2, 4096, [&](std::size_t begin, std::size_t end) {
      std::memcpy(to + begin, from + begin, end - begin);
    });
    benchmark::DoNotOptimize(to);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(2 * kOutputBytes));
}

std::string shortName(LocalSumMethod method) {
  std::string name(strategyName(method));
  return name.substr(name.find('/') + 1);
}

const bool registered = [] {
  benchmark::RegisterBenchmark("BM_MemcpyForLocalSum", BM_MemcpyForLocalSum)->Unit(benchmark::kMillisecond);
  for (DType dtype : {DType::Fp32, DType::Fp16, DType::Bf16, DType::Fp64}) {
    for (LocalSumMethod method : kLocalSumMethods) {
      for (std::size_t k : {std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
        const std::string label =
            "BM_LocalSum/" + shortName(method) + "/" + std::string(name(dtype)) + "/K:" + std::to_string(k);
        benchmark::RegisterBenchmark(label.c_str(), BM_LocalSum, method, dtype, k)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  return true;
}();

}  // namespace
}  // namespace gradscope::methods
