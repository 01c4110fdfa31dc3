// A one-rank NCCL job with a known GPU step, for the step model's GPU side (check_nccl.py gpu-steps), on the
// fake NCCL and the fake driver (which check_nccl.py loads through GRADSCOPE_FAKE_CUDA):
//
//   gpu-steps-job STEPS COMPUTE_MS PERIOD_MS
//
// Every step, on the fake GPU: a compute kernel "gemm_fake" of COMPUTE_MS on stream A; an all-reduce on
// stream B, launched with it (hidden behind it); an all-reduce on stream A, after it (exposed). NCCL's
// kernels last GRADSCOPE_FAKE_KERNEL_NS each. The host then waits for both streams and sleeps until
// PERIOD_MS after the step began, so that the GPU idles for the rest of the step. Built with NVTX v3
// (GRADSCOPE_JOB_NVTX), the compute kernel is launched inside an NVTX range "forward". Prints one checksum
// line and "gpu_steps_job: done"; exit status 0, or 1 with the failing call on stderr.

#include <dlfcn.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#ifdef GRADSCOPE_JOB_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

#include "core/nccl_types.h"
using namespace gradscope::agent::nccl;
extern "C" {
#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS) RESULT NAME PARAMS;
#include "interpose/nccl_functions.def"
#undef GS_NCCL_FUNCTION
}

namespace {

[[noreturn]] void fail(const char* what, int code) {
  std::fprintf(stderr, "gpu_steps_job: %s failed (%d)\n", what, code);
  std::exit(1);
}

void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) fail(what, static_cast<int>(result));
}

std::int64_t nowNs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

void sleepUntil(std::int64_t deadline_ns) {
  for (std::int64_t left = deadline_ns - nowNs(); left > 0; left = deadline_ns - nowNs()) {
    const timespec pause{static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
    nanosleep(&pause, nullptr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: gpu-steps-job STEPS COMPUTE_MS PERIOD_MS\n");
    return 2;
  }
  const int steps = std::atoi(argv[1]);
  const std::int64_t compute_ns = std::atoll(argv[2]) * 1'000'000,
                     period_ns = std::atoll(argv[3]) * 1'000'000;
  static int stream_tokens[2];
  cudaStream_t compute_stream = reinterpret_cast<cudaStream_t>(&stream_tokens[0]);
  cudaStream_t side_stream = reinterpret_cast<cudaStream_t>(&stream_tokens[1]);

  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, 1, id, 0), "ncclCommInitRank");
  // The fake driver, which the fake NCCL has loaded by now; without it the compute kernels are left out
  // (there is no GPU to run them on).
  using LaunchNamed = void (*)(cudaStream_t, std::int64_t, const char*);
  const auto launch = reinterpret_cast<LaunchNamed>(dlsym(RTLD_DEFAULT, "fakeCudaLaunchNamed"));
  using Synchronize = int (*)(cudaStream_t);
  const auto synchronize = reinterpret_cast<Synchronize>(dlsym(RTLD_DEFAULT, "cuStreamSynchronize"));
  constexpr std::size_t kCount = 1024;
  std::vector<float> gradients(kCount), first(kCount), second(kCount);
  double checksum = 0;
  for (int step = 0; step < steps; ++step) {
    const std::int64_t began = nowNs();
    for (std::size_t i = 0; i < kCount; ++i)
      gradients[i] = static_cast<float>(static_cast<std::size_t>(step + 1) * (i % 7));
#ifdef GRADSCOPE_JOB_NVTX
    nvtxRangePushA("forward");
#endif
    if (launch != nullptr) launch(compute_stream, compute_ns, "gemm_fake");
#ifdef GRADSCOPE_JOB_NVTX
    nvtxRangePop();
#endif
    check(ncclAllReduce(gradients.data(), first.data(), kCount, ncclFloat32, ncclSum, comm, side_stream),
          "ncclAllReduce (side stream)");
    check(ncclAllReduce(gradients.data(), second.data(), kCount, ncclFloat32, ncclSum, comm, compute_stream),
          "ncclAllReduce (compute stream)");
    for (std::size_t i = 0; i < kCount; ++i) checksum += static_cast<double>(first[i] + second[i]);
    // The step's kernels end before the next step's are launched, however late this step's launches came
    // (the first calls set the agent's timing up, which takes long under a sanitizer).
    if (synchronize != nullptr) synchronize(compute_stream), synchronize(side_stream);
    sleepUntil(began + period_ns);
  }
  check(ncclCommDestroy(comm), "ncclCommDestroy");
  std::printf("gpu_steps_job: checksum %.1f\n", checksum);
  std::printf("gpu_steps_job: done\n");
  return 0;
}
