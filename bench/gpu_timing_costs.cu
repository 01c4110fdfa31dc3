// gradscope_gpu_timing_costs: what each CUDA/CUPTI call that the agent makes around a GPU collective
// costs the calling thread, on the machine at hand (docs/agent.md, "GPU timing"; docs/benchmarks.md).
//
// For each primitive: `iterations` calls on one non-blocking stream, the host time per call (median of
// `rounds` rounds). Kernel launches are timed alone and with CUPTI's concurrent-kernel activity on, as
// the agent enables it, to show what CUPTI costs every kernel of the job, not only NCCL's.
//
//   gradscope_gpu_timing_costs [-n ITERATIONS] [-r ROUNDS]
//
// Exit status 0, 3 without a usable GPU or when a CUDA/CUPTI call fails (one line on stderr).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>

namespace {

__global__ void emptyKernel() {}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "gradscope_gpu_timing_costs: %s\n", what.c_str());
  std::exit(3);
}

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(rc));
}

void check(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS) die(std::string(what) + ": CUresult " + std::to_string(rc));
}

void check(CUptiResult rc, const char* what) {
  if (rc != CUPTI_SUCCESS) {
    const char* text = nullptr;
    cuptiGetResultString(rc, &text);
    die(std::string(what) + ": " + (text != nullptr ? text : "CUPTI error"));
  }
}

// CUPTI's buffers: 8 MiB each, handed back and dropped at once (this program reads no record).
void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = std::size_t{8} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI bufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t) {
  std::free(buffer);
}

// Host ns per call of `body`, median over rounds; the stream is drained between rounds.
double nsPerCall(int iterations, int rounds, cudaStream_t stream, const std::function<void(int)>& body) {
  std::vector<double> per_call;
  for (int round = 0; round < rounds; ++round) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) body(i);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    per_call.push_back(std::chrono::duration<double, std::nano>(elapsed).count() / iterations);
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20000, rounds = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "-n") == 0) iterations = std::max(1, std::atoi(argv[i + 1]));
    else if (std::strcmp(argv[i], "-r") == 0) rounds = std::max(1, std::atoi(argv[i + 1]));
    else die(std::string("unknown option ") + argv[i] + " (-n ITERATIONS, -r ROUNDS)");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) die("no usable CUDA GPU");
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const auto cu_stream = reinterpret_cast<CUstream>(stream);
  CUevent timed[2], untimed[2];
  for (int i = 0; i < 2; ++i) {
    check(cuEventCreate(&timed[i], CU_EVENT_DEFAULT), "cuEventCreate");
    check(cuEventCreate(&untimed[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  }
  const auto time = [&](const char* what, const std::function<void(int)>& body) {
    const double ns = nsPerCall(iterations, rounds, stream, body);
    std::printf("%-58s %9.0f ns\n", what, ns);
    return ns;
  };
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("# %s: host time per call, median of %d rounds of %d calls\n", prop.name, rounds, iterations);

  time("cuStreamIsCapturing", [&](int) {
    CUstreamCaptureStatus status;
    check(cuStreamIsCapturing(cu_stream, &status), "cuStreamIsCapturing");
  });
  time("cuEventRecord, timing event",
       [&](int i) { check(cuEventRecord(timed[i & 1], cu_stream), "cuEventRecord"); });
  time("cuEventRecord, CU_EVENT_DISABLE_TIMING",
       [&](int i) { check(cuEventRecord(untimed[i & 1], cu_stream), "cuEventRecord"); });
  time("cudaMemsetAsync of 4 bytes", [&](int) {
    static void* scratch = [] {
      void* p = nullptr;
      check(cudaMalloc(&p, 4), "cudaMalloc");
      return p;
    }();
    check(cudaMemsetAsync(scratch, 0, 4, stream), "cudaMemsetAsync");
  });
  const double bare = time("empty kernel launch", [&](int) { emptyKernel<<<1, 1, 0, stream>>>(); });
  time("empty kernel launch + 2 timing cuEventRecord", [&](int i) {
    check(cuEventRecord(timed[0], cu_stream), "cuEventRecord");
    emptyKernel<<<1, 1, 0, stream>>>();
    check(cuEventRecord(timed[1], cu_stream), "cuEventRecord");
    (void)i;
  });

  check(cuptiActivityRegisterCallbacks(bufferRequested, bufferCompleted), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), "cuptiActivityEnable");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  const double traced = time("empty kernel launch, CUPTI concurrent-kernel activity on",
                             [&](int) { emptyKernel<<<1, 1, 0, stream>>>(); });
  time("cuptiActivityPush/PopExternalCorrelationId", [&](int i) {
    check(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                                                 static_cast<uint64_t>(i)),
          "cuptiActivityPushExternalCorrelationId");
    uint64_t id = 0;
    check(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id),
          "cuptiActivityPopExternalCorrelationId");
  });
  time("empty kernel launch + push/pop, CUPTI on", [&](int i) {
    cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, static_cast<uint64_t>(i));
    emptyKernel<<<1, 1, 0, stream>>>();
    uint64_t id = 0;
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id);
  });
  check(cuptiActivityFlushAll(0), "cuptiActivityFlushAll");
  check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
  check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), "cuptiActivityDisable");
  const double after =
      time("empty kernel launch, CUPTI off again", [&](int) { emptyKernel<<<1, 1, 0, stream>>>(); });
  std::printf(
      "# CUPTI's concurrent-kernel activity adds %.0f ns to every kernel launch (bare %.0f, after %.0f)\n",
      traced - bare, bare, after);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return 0;
}
