// gradscope_nccl_tests_allreduce: an independent reference for `gradscope bench --backend nccl`, written
// after nccl-tests' all_reduce_perf: one process drives every visible GPU (or -g G) through
// ncclCommInitAll; for each size, `warm-up` untimed calls, then `iterations` calls enqueued back to back
// (each in an ncclGroupStart/End when there are several GPUs), one synchronisation of every stream, and
// the elapsed host time divided by the iterations. float sum, out-of-place (nccl-tests' first column),
// or in-place with -I. algbw = bytes / time, busbw = algbw * 2(n-1)/n, as nccl-tests reports them.
//
// Plain C++, CUDA runtime and NCCL on purpose: it shares no code with gradscope, so agreement between
// the two is evidence (bench/nccl_compare.py).
//
//   gradscope_nccl_tests_allreduce [-b MIN_BYTES] [-e MAX_BYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]
//                                  [-g GPUS] [-I]
//
// Prints one line per size: bytes, count, time_us, algbw_GBps, busbw_GBps. Exit status 0, 2 for a bad
// argument, 3 when there is no usable GPU or CUDA/NCCL fails (one line on stderr).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

namespace {

struct Options {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{64} << 20;
  int factor = 2;
  int iterations = 20;
  int warmup = 5;
  int gpus = 0;  // 0: every visible GPU
  bool in_place = false;
};

[[noreturn]] void die(int status, const std::string& what) {
  std::fprintf(stderr, "gradscope_nccl_tests_allreduce: %s\n", what.c_str());
  std::exit(status);
}

void cudaCheck(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) die(3, std::string(what) + ": " + cudaGetErrorString(rc));
}

void ncclCheck(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) die(3, std::string(what) + ": " + ncclGetErrorString(rc));
}

std::size_t parseBytes(const char* text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text) die(2, std::string("not a size: ") + text + " (bytes, with an optional K, M or G)");
  std::size_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = std::size_t{1} << 10;
  if (*end == 'M' || *end == 'm') scale = std::size_t{1} << 20;
  if (*end == 'G' || *end == 'g') scale = std::size_t{1} << 30;
  if (scale != 1) ++end;
  if (*end != '\0') die(2, std::string("not a size: ") + text + " (bytes, with an optional K, M or G)");
  return static_cast<std::size_t>(value) * scale;
}

int parseCount(const char* text, int least, const char* flag) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < least || value > 1000000)
    die(2, std::string(flag) + " needs an integer from " + std::to_string(least) + ", got " + text);
  return static_cast<int>(value);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-I") {
      options.in_place = true;
      continue;
    }
    if (i + 1 >= argc) die(2, "option " + flag + " needs a value (see the comment at the top of the source)");
    const char* value = argv[++i];
    if (flag == "-b") options.min_bytes = parseBytes(value);
    else if (flag == "-e") options.max_bytes = parseBytes(value);
    else if (flag == "-f") options.factor = parseCount(value, 2, "-f");
    else if (flag == "-n") options.iterations = parseCount(value, 1, "-n");
    else if (flag == "-w") options.warmup = parseCount(value, 0, "-w");
    else if (flag == "-g") options.gpus = parseCount(value, 1, "-g");
    else die(2, "unknown option " + flag + " (-b -e -f -n -w -g -I)");
  }
  if (options.min_bytes < 4 || options.min_bytes > options.max_bytes)
    die(2, "need 4 <= -b <= -e (bytes of float data)");
  return options;
}

struct Gpu {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* send = nullptr;
  float* recv = nullptr;
};

// As nccl-tests: a group only when one thread drives several GPUs.
void launch(std::vector<Gpu>& gpus, std::size_t count, bool in_place) {
  const bool grouped = gpus.size() > 1;
  if (grouped) ncclCheck(ncclGroupStart(), "ncclGroupStart");
  for (Gpu& gpu : gpus) {
    const float* send = in_place ? gpu.recv : gpu.send;
    ncclCheck(ncclAllReduce(send, gpu.recv, count, ncclFloat, ncclSum, gpu.comm, gpu.stream),
              "ncclAllReduce");
  }
  if (grouped) ncclCheck(ncclGroupEnd(), "ncclGroupEnd");
}

void synchronize(std::vector<Gpu>& gpus) {
  for (Gpu& gpu : gpus) {
    cudaCheck(cudaSetDevice(gpu.device), "cudaSetDevice");
    cudaCheck(cudaStreamSynchronize(gpu.stream), "cudaStreamSynchronize");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible == 0) die(3, "no usable CUDA GPU");
  const int n = options.gpus == 0 ? visible : options.gpus;
  if (n > visible)
    die(2, "-g " + std::to_string(n) + " but " + std::to_string(visible) + " GPUs are visible");

  std::vector<Gpu> gpus(static_cast<std::size_t>(n));
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
  std::vector<int> devices(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devices[static_cast<std::size_t>(i)] = i;
  ncclCheck(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
  const std::size_t max_count = options.max_bytes / sizeof(float);
  for (int i = 0; i < n; ++i) {
    Gpu& gpu = gpus[static_cast<std::size_t>(i)];
    gpu.device = i;
    gpu.comm = comms[static_cast<std::size_t>(i)];
    cudaCheck(cudaSetDevice(i), "cudaSetDevice");
    cudaCheck(cudaStreamCreateWithFlags(&gpu.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaCheck(cudaMalloc(reinterpret_cast<void**>(&gpu.send), max_count * sizeof(float)), "cudaMalloc");
    cudaCheck(cudaMalloc(reinterpret_cast<void**>(&gpu.recv), max_count * sizeof(float)), "cudaMalloc");
    cudaCheck(cudaMemset(gpu.send, 0x3c, max_count * sizeof(float)), "cudaMemset");  // 0.0115 in every float
    cudaCheck(cudaMemset(gpu.recv, 0, max_count * sizeof(float)), "cudaMemset");
  }
  cudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  int version = 0;
  ncclCheck(ncclGetVersion(&version), "ncclGetVersion");
  std::printf(
      "# nccl-tests-style all_reduce: %d GPU(s), NCCL %d, float sum, %s, %d iterations after %d warm-up\n", n,
      version, options.in_place ? "in-place" : "out-of-place", options.iterations, options.warmup);
  std::printf("%12s %12s %12s %12s %12s\n", "bytes", "count", "time_us", "algbw_GBps", "busbw_GBps");
  const double bus_factor = 2.0 * (n - 1) / n;
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes;
       bytes *= static_cast<std::size_t>(options.factor)) {
    const std::size_t count = bytes / sizeof(float);
    for (int i = 0; i < options.warmup; ++i) launch(gpus, count, options.in_place);
    synchronize(gpus);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options.iterations; ++i) launch(gpus, count, options.in_place);
    synchronize(gpus);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double time_us = seconds * 1e6 / options.iterations;
    const double algbw = static_cast<double>(count * sizeof(float)) / (time_us * 1e3);  // GB/s
    std::printf("%12zu %12zu %12.2f %12.2f %12.2f\n", count * sizeof(float), count, time_us, algbw,
                algbw * bus_factor);
    if (bytes > options.max_bytes / static_cast<std::size_t>(options.factor)) break;
  }
  for (Gpu& gpu : gpus) {
    cudaSetDevice(gpu.device);
    cudaFree(gpu.send);
    cudaFree(gpu.recv);
    cudaStreamDestroy(gpu.stream);
    ncclCommDestroy(gpu.comm);
  }
  return 0;
}
