// The CUDA kernels against device-to-device copy bandwidth measured in the same run.
//
// Buffers are 256 MiB each: every local sum input and output (64 Mi fp32, 128 Mi fp16/bf16, 32 Mi fp64
// elements), and the fp32 side of encode/decode (64 Mi elements). Each benchmark runs its kernel twice
// to warm up, then times every iteration with CUDA events recorded on the benchmark's stream around a
// single launch (UseManualTime), and reports
//   bytes_per_second  bytes moved / mean time, with bytes moved =
//                       local sums: (K + 1)·n·size, every method: the GPU runs AccumulateN as one fused
//                         pass (the per-step rounding to the element type is kept; the CPU instead makes
//                         K-1 passes, and local_sum.h's model charges it (3K - 2)·n·size);
//                       encode / decode: encodeBytesMoved / decodeBytesMoved (wire.h)
//   GBps_best         bytes moved / fastest iteration (decimal GB/s)
//   ms_min, ms_median, ms_max   of the iterations
//   d2d_GBps          a cudaMemcpyAsync device-to-device copy of one 256 MiB buffer, timed the same way
//                       right before the benchmark (best of 10): 2 × 256 MiB / time (a copy reads and
//                       writes every byte)
//   vs_d2d            GBps_best / d2d_GBps: 1.0 = moves bytes as fast as the copy engine path. Target:
//                       >= 0.9 for every memory-bound kernel here.
// Without a usable GPU every benchmark stops with SkipWithError(cuda::available()'s reason).
//
//   gradscope_cuda_bench --benchmark_filter='LocalSum/add_n' --benchmark_out=cuda.json

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "gradscope/common/error.h"
#include "gradscope/common/types.h"
#include "gradscope/methods/cuda.h"
#include "gradscope/methods/local_sum.h"
#include "gradscope/methods/numeric.h"
#include "gradscope/methods/wire.h"

#if defined(GRADSCOPE_HAVE_CUDA) && __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define GS_BENCH_CUDA_EVENTS 1
#else
#define GS_BENCH_CUDA_EVENTS 0
#endif

namespace gradscope::methods {
namespace {

constexpr std::size_t kBufferBytes = std::size_t{256} << 20;
constexpr std::size_t kMaxInputs = 8;
constexpr int kWarmups = 2;

// Times one enqueued piece of work on `stream`: CUDA events around it where the runtime API is linked
// in, otherwise the host clock around a stream synchronisation on each side (a few microseconds of
// error on millisecond kernels).
class GpuTimer {
 public:
  explicit GpuTimer(cuda::Stream stream) : stream_(stream) {
#if GS_BENCH_CUDA_EVENTS
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
#endif
  }
  ~GpuTimer() {
#if GS_BENCH_CUDA_EVENTS
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
#endif
  }
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  double seconds(const std::function<void()>& work) {
#if GS_BENCH_CUDA_EVENTS
    auto* stream = static_cast<cudaStream_t>(stream_);
    check(cudaEventRecord(start_, stream), "cudaEventRecord");
    work();
    check(cudaEventRecord(stop_, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float milliseconds = 0;
    check(cudaEventElapsedTime(&milliseconds, start_, stop_), "cudaEventElapsedTime");
    return static_cast<double>(milliseconds) * 1e-3;
#else
    cuda::synchronize(stream_);
    const auto start = std::chrono::steady_clock::now();
    work();
    cuda::synchronize(stream_);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
#endif
  }

 private:
#if GS_BENCH_CUDA_EVENTS
  static void check(cudaError_t status, const char* call) {
    if (status != cudaSuccess) throw Error(std::string(call) + ": " + cudaGetErrorString(status));
  }
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
#endif
  cuda::Stream stream_;
};

// Device buffers shared by all benchmarks, allocated on first use: kMaxInputs inputs, one output, a
// codes buffer and scales. Input contents are refilled when the element type changes (benchmarks run
// grouped by type); values are uniform in [-1, 1] rounded to the type, as in the CPU benchmarks.
struct Device {
  cuda::Stream stream = nullptr;
  std::vector<cuda::DeviceBuffer> inputs;
  cuda::DeviceBuffer output;
  cuda::DeviceBuffer codes;
  cuda::DeviceBuffer scales;
  cuda::DeviceBuffer stats;
  DType filled = DType::Other;
  double d2d_seconds = 0;

  static Device& get() {
    static Device device;
    if (device.inputs.empty()) {
#if GS_BENCH_CUDA_EVENTS
      cudaStream_t stream = nullptr;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
        throw Error("cudaStreamCreateWithFlags failed");
      device.stream = stream;
#endif
      for (std::size_t i = 0; i < kMaxInputs; ++i) device.inputs.emplace_back(kBufferBytes);
      device.output = cuda::DeviceBuffer(kBufferBytes);
      device.codes = cuda::DeviceBuffer(kBufferBytes);
      device.scales = cuda::DeviceBuffer(kBufferBytes / 4);
      device.stats = cuda::DeviceBuffer(2 * sizeof(std::uint64_t));
    }
    return device;
  }

  void fill(DType dtype) {
    if (filled == dtype) return;
    const std::size_t count = kBufferBytes / sizeOf(dtype);
    std::vector<std::uint8_t> host(kBufferBytes);
    std::uint64_t state = 0x9E3779B97F4A7C15ull;
    for (std::size_t input = 0; input < inputs.size(); ++input) {
      // A cheap xorshift per input: different data in every buffer.
      for (std::size_t i = 0; i < count; ++i) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        const float value = static_cast<float>(static_cast<double>(state >> 40) * 0x1p-23 - 1.0);
        switch (dtype) {
          case DType::Fp32: std::memcpy(host.data() + 4 * i, &value, 4); break;
          case DType::Fp64: {
            const auto wide = static_cast<double>(value);
            std::memcpy(host.data() + 8 * i, &wide, 8);
            break;
          }
          case DType::Fp16: {
            const std::uint16_t half = fp32ToFp16(value);
            std::memcpy(host.data() + 2 * i, &half, 2);
            break;
          }
          case DType::Bf16: {
            const std::uint16_t half = fp32ToBf16(value);
            std::memcpy(host.data() + 2 * i, &half, 2);
            break;
          }
          default: break;
        }
      }
      inputs[input].upload(host.data(), kBufferBytes, stream);
      cuda::synchronize(stream);  // `host` is reused for the next input
    }
    filled = dtype;
  }

  // Best of 10 device-to-device copies of one buffer, measured once per process (and again for each
  // benchmark, so the ratio is taken against the copy rate of the same moment).
  double bestCopySeconds(GpuTimer& timer) {
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < 10; ++i) {
      best = std::min(
          best, timer.seconds([&] { cuda::copy(output.get(), inputs[0].get(), kBufferBytes, stream); }));
    }
    return best;
  }
};

// Runs `work` once per benchmark iteration, timed on the GPU, and reports the counters above.
void measure(benchmark::State& state, std::size_t bytes, const std::function<void()>& work) {
  Device& device = Device::get();
  GpuTimer timer(device.stream);
  for (int i = 0; i < kWarmups; ++i) timer.seconds(work);
  const double copy_seconds = device.bestCopySeconds(timer);
  std::vector<double> times;
  for (auto _ : state) {
    const double elapsed = timer.seconds(work);
    state.SetIterationTime(elapsed);
    times.push_back(elapsed);
  }
  if (times.empty()) return;
  std::sort(times.begin(), times.end());
  const double best = times.front();
  const double d2d_bps = 2.0 * static_cast<double>(kBufferBytes) / copy_seconds;
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
  state.counters["GBps_best"] = static_cast<double>(bytes) / best * 1e-9;
  state.counters["d2d_GBps"] = d2d_bps * 1e-9;
  state.counters["vs_d2d"] = static_cast<double>(bytes) / best / d2d_bps;
  state.counters["ms_min"] = best * 1e3;
  state.counters["ms_median"] = times[times.size() / 2] * 1e3;
  state.counters["ms_max"] = times.back() * 1e3;
}

// Turns an exception (no GPU, out of memory) into a skipped benchmark with the reason.
template <typename Body>
void guarded(benchmark::State& state, Body&& body) {
  std::string reason;
  if (!cuda::available(&reason)) {
    state.SkipWithError(reason.c_str());
    return;
  }
  try {
    body();
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

void BM_CudaD2DCopy(benchmark::State& state) {
  guarded(state, [&] {
    Device& device = Device::get();
    measure(state, 2 * kBufferBytes,
            [&] { cuda::copy(device.output.get(), device.inputs[0].get(), kBufferBytes, device.stream); });
  });
}

void BM_CudaLocalSum(benchmark::State& state, LocalSumMethod method, DType dtype, std::size_t k) {
  guarded(state, [&] {
    Device& device = Device::get();
    device.fill(dtype);
    const std::size_t count = kBufferBytes / sizeOf(dtype);
    std::vector<const void*> inputs;
    for (std::size_t i = 0; i < k; ++i) inputs.push_back(device.inputs[i].get());
    const std::size_t bytes = (k + 1) * count * sizeOf(dtype);
    measure(state, bytes,
            [&] { cuda::localSum(method, dtype, inputs, device.output.get(), count, device.stream); });
    state.counters["K"] = static_cast<double>(k);
  });
}

void BM_CudaEncode(benchmark::State& state, WireFormat format, std::size_t block) {
  guarded(state, [&] {
    Device& device = Device::get();
    device.fill(DType::Fp32);
    const std::size_t count = kBufferBytes / sizeof(float);
    const EncodeOptions options{.prescale = 0.125f, .block = block};
    measure(state, encodeBytesMoved(format, count, block), [&] {
      cuda::encode(format, device.inputs[0].as<float>(), count, device.codes.get(), device.scales.as<float>(),
                   options, device.stats.as<std::uint64_t>(), device.stream);
    });
  });
}

void BM_CudaDecode(benchmark::State& state, WireFormat format, std::size_t block) {
  guarded(state, [&] {
    Device& device = Device::get();
    device.fill(DType::Fp32);
    const std::size_t count = kBufferBytes / sizeof(float);
    // Real codes and scales to decode: one encode first.
    cuda::encode(format, device.inputs[0].as<float>(), count, device.codes.get(), device.scales.as<float>(),
                 {.prescale = 0.125f, .block = block}, device.stats.as<std::uint64_t>(), device.stream);
    measure(state, decodeBytesMoved(format, count, block), [&] {
      cuda::decode(format, device.codes.get(), device.scales.as<float>(), count, device.output.as<float>(),
                   8.0f, block, device.stream);
    });
  });
}

std::string shortName(LocalSumMethod method) {
  std::string text(strategyName(method));
  return text.substr(text.find('/') + 1);
}

void registerAll() {
  benchmark::RegisterBenchmark("BM_CudaD2DCopy", BM_CudaD2DCopy)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  for (DType dtype : {DType::Fp32, DType::Fp16, DType::Bf16, DType::Fp64}) {
    for (LocalSumMethod method : kLocalSumMethods) {
      for (std::size_t k : {std::size_t{4}, std::size_t{8}}) {
        const std::string label = "BM_CudaLocalSum/" + shortName(method) + "/" + std::string(name(dtype)) +
                                  "/K:" + std::to_string(k);
        benchmark::RegisterBenchmark(label.c_str(), BM_CudaLocalSum, method, dtype, k)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  for (WireFormat format : kWireFormats) {
    // fp8: the default block of 128 (one warp per block), a short block (one thread per block) and a
    // long one (one thread block per scaling block).
    std::vector<std::size_t> blocks{128};
    if (isFp8(format)) blocks = {16, 128, 8192};
    for (std::size_t block : blocks) {
      const std::string suffix =
          std::string(name(format)) + (isFp8(format) ? "/block:" + std::to_string(block) : "");
      benchmark::RegisterBenchmark(("BM_CudaEncode/" + suffix).c_str(), BM_CudaEncode, format, block)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("BM_CudaDecode/" + suffix).c_str(), BM_CudaDecode, format, block)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace gradscope::methods

int main(int argc, char** argv) {
  using namespace gradscope::methods;
  std::string reason;
  if (cuda::available(&reason)) {
    benchmark::AddCustomContext("gpu", cuda::deviceDescription());
  } else {
    benchmark::AddCustomContext("gpu", "none: " + reason);
  }
  benchmark::AddCustomContext("timer",
                              GS_BENCH_CUDA_EVENTS ? "cuda events" : "host clock around stream syncs");
  benchmark::AddCustomContext("buffer_bytes", std::to_string(kBufferBytes));
  registerAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
