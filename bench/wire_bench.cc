// Wire-precision conversions against memcpy bandwidth measured in the same run.
//
// Every format encodes 64 MiB of fp32 (16 Mi elements, uniform in [-1, 1]) and decodes it back
// (fp8 with the default 128-element scaling blocks). bytes_per_second uses encodeBytesMoved /
// decodeBytesMoved (wire.h: fp32 read or written, codes written or read, fp8 scales). Right before
// the timed loop each benchmark times a memcpy on the same thread pool that moves as many bytes (it
// copies bytes/2: a copy reads and writes each byte) and reports
//   vs_memcpy  = best memcpy time (of 3) / best conversion time   (1.0 = as fast as copying)
//   GBps_best  = bytes moved / best conversion time (decimal GB/s), memcpy_GBps likewise for the copy.
// Best-of times are what the ratio uses because other processes share the machine; the mean is the
// time column. BM_MemcpyForWire/<bytes> is the copy on its own for each distinct byte count.
//
//   gradscope_methods_bench --benchmark_filter='BM_Wire|BM_MemcpyForWire'

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>

#include <benchmark/benchmark.h>

#include "gradscope/methods/cpu_executor.h"
#include "gradscope/methods/wire.h"

namespace gradscope::methods {
namespace {

constexpr std::size_t kCount = std::size_t{16} << 20;  // 64 MiB of fp32
constexpr std::size_t kBlock = EncodeOptions{}.block;

// The fp32 input, the codes (2 bytes an element at most), the fp8 scales and the decoded output,
// allocated and filled once. The memcpy reference copies from `input` into `output`.
struct Buffers {
  std::unique_ptr<float[]> input{new float[kCount]};
  std::unique_ptr<std::uint16_t[]> codes{new std::uint16_t[kCount]};
  std::unique_ptr<float[]> scales{new float[kCount / kBlock + 1]};
  std::unique_ptr<float[]> output{new float[kCount]};

  static Buffers& get() {
    static Buffers buffers;
    return buffers;
  }

  Buffers() {
    std::uint64_t state = 0x9E3779B97F4A7C15ull;
    for (std::size_t i = 0; i < kCount; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      input[i] = static_cast<float>(static_cast<double>(state >> 40) * 0x1p-23 - 1.0);
    }
    std::memset(codes.get(), 0, kCount * sizeof(std::uint16_t));
    std::memset(scales.get(), 0, (kCount / kBlock + 1) * sizeof(float));
    std::memset(output.get(), 0, kCount * sizeof(float));
  }
};

double seconds(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

// A parallel copy of bytes/2 bytes (it moves `bytes`: read + write), split like the kernels' parallelFor.
void parallelCopy(Buffers& buffers, std::size_t bytes) {
  const auto* from = reinterpret_cast<const std::byte*>(buffers.input.get());
  auto* to = reinterpret_cast<std::byte*>(buffers.output.get());
  CpuExecutor::shared().parallelFor(bytes / 2, 2, 4096, [&](std::size_t begin, std::size_t end) {
    std::memcpy(to + begin, from + begin, end - begin);
  });
}

double bestMemcpySeconds(Buffers& buffers, std::size_t bytes) {
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    parallelCopy(buffers, bytes);
    best = std::min(best, seconds(std::chrono::steady_clock::now() - start));
  }
  return best;
}

template <class Convert>
void timeConversion(benchmark::State& state, Buffers& buffers, std::size_t bytes, Convert convert) {
  convert();  // warm-up: page faults, the pool's threads
  const double memcpy_best = bestMemcpySeconds(buffers, bytes);
  double best = std::numeric_limits<double>::infinity();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    convert();
    const double elapsed = seconds(std::chrono::steady_clock::now() - start);
    state.SetIterationTime(elapsed);
    best = std::min(best, elapsed);
  }
  benchmark::DoNotOptimize(buffers.codes.get());
  benchmark::DoNotOptimize(buffers.output.get());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
  state.counters["vs_memcpy"] = memcpy_best / best;
  state.counters["GBps_best"] = static_cast<double>(bytes) / best * 1e-9;
  state.counters["memcpy_GBps"] = static_cast<double>(bytes) / memcpy_best * 1e-9;
}

void BM_WireEncode(benchmark::State& state, WireFormat format) {
  Buffers& buffers = Buffers::get();
  EncodeStats stats;
  timeConversion(state, buffers, encodeBytesMoved(format, kCount, kBlock), [&] {
    stats = encode(format, buffers.input.get(), kCount, buffers.codes.get(), buffers.scales.get());
  });
  state.counters["overflow"] = static_cast<double>(stats.overflow);
}

void BM_WireDecode(benchmark::State& state, WireFormat format) {
  Buffers& buffers = Buffers::get();
  encode(format, buffers.input.get(), kCount, buffers.codes.get(), buffers.scales.get());
  timeConversion(state, buffers, decodeBytesMoved(format, kCount, kBlock), [&] {
    decode(format, buffers.codes.get(), buffers.scales.get(), kCount, buffers.output.get());
  });
}

// The hardware reference on its own (bytes_per_second counts read + write).
void BM_MemcpyForWire(benchmark::State& state, std::size_t bytes) {
  Buffers& buffers = Buffers::get();
  parallelCopy(buffers, bytes);
  for (auto _ : state) {
    parallelCopy(buffers, bytes);
    benchmark::DoNotOptimize(buffers.output.get());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
}

const bool registered = [] {
  std::set<std::size_t> copies;
  for (WireFormat format : kWireFormats) {
    copies.insert(encodeBytesMoved(format, kCount, kBlock));
    copies.insert(decodeBytesMoved(format, kCount, kBlock));
  }
  for (std::size_t bytes : copies) {
    benchmark::RegisterBenchmark(("BM_MemcpyForWire/" + std::to_string(bytes)).c_str(), BM_MemcpyForWire,
                                 bytes)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (WireFormat format : kWireFormats) {
    const std::string suffix = "/" + std::string(name(format));
    benchmark::RegisterBenchmark(("BM_WireEncode" + suffix).c_str(), BM_WireEncode, format)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_WireDecode" + suffix).c_str(), BM_WireDecode, format)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
}  // namespace gradscope::methods
