// gradscope-sample-nccl-allreduce: a data-parallel training loop's communication on NVIDIA GPUs with
// NCCL, one rank per GPU (README.md).
//
// Two ways to start it:
//   - under an MPI launcher (mpirun, srun with PMI): one process per GPU; MPI only bootstraps NCCL
//     (rank 0's ncclUniqueId is broadcast) and compares the final weights; the gradients go through NCCL;
//   - on its own: one process drives every visible GPU (or --gpus N) through ncclCommInitAll.
//
// Every step, each rank's "backward pass" (a kernel) writes its gradient buckets, the buckets are
// all-reduced in place with ncclAllReduce (sum, fp32; last bucket first, as DDP issues them), each
// result is checked against the exact sum, and an SGD step updates the rank's weights. Rank 0 prints
// the time per bucket and a final line with the number of wrong elements and a hash of the weights.
//
// --mode sendrecv (exactly 2 ranks): the same sums made by point-to-point calls instead, as a pipeline or
// an expert-parallel job moves its tensors: each bucket is exchanged with the other rank, one ncclSend and
// one ncclRecv per rank in an ncclGroupStart/End group, and the received gradient is added to the rank's
// own. Every element is a sum of two small integers, so the weights end bit for bit as in the default
// mode (--mode allreduce) on 2 ranks.
//
// Exit status: 0 success; 1 a wrong all-reduce result or weights that differ between ranks; 2 a bad
// argument; 3 no usable GPU, or a CUDA, NCCL or MPI failure.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include "kernels.h"

namespace {

constexpr const char* kName = "gradscope-sample-nccl-allreduce";

enum class Mode { AllReduce, SendRecv };

struct Options {
  Mode mode = Mode::AllReduce;
  int steps = 100;
  std::vector<std::uint64_t> bucketBytes = {1024, 256 * 1024, 4 * 1024 * 1024, 25 * 1024 * 1024};
  int printEvery = 20;
  int gpus = 0;  // single-process mode: 0 = every visible GPU
  float lr = 0.01f;
};

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: %s [--mode allreduce|sendrecv] [--steps N] [--buckets SIZES] [--print-every K]\n"
               "          [--gpus G] [--lr R]\n"
               "  --mode M          allreduce: ncclAllReduce of every bucket (default); sendrecv (2 ranks):\n"
               "                    ncclSend and ncclRecv of every bucket to and from the other rank\n"
               "  --steps N         training steps (default 100)\n"
               "  --buckets SIZES   comma-separated gradient bucket sizes in bytes, multiples of 4, with\n"
               "                    optional K/M/G suffixes (powers of 1024); default 1K,256K,4M,25M\n"
               "  --print-every K   rank 0 prints every K steps; 0: only the final lines (default 20)\n"
               "  --gpus G          without an MPI launcher: drive G GPUs from this process with\n"
               "                    ncclCommInitAll (default: every visible GPU)\n"
               "  --lr R            learning rate of the SGD step (default 0.01)\n"
               "One rank per GPU: start it with mpirun -np <GPUs> (MPI bootstraps NCCL), or on its own.\n",
               kName);
}

bool parseSize(const std::string& text, std::uint64_t& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || text[0] == '-') return false;
  std::uint64_t scale = 1;
  const std::string suffix(end);
  if (suffix == "K" || suffix == "k") {
    scale = 1024;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1024 * 1024;
  } else if (suffix == "G" || suffix == "g") {
    scale = 1024ull * 1024 * 1024;
  } else if (!suffix.empty()) {
    return false;
  }
  if (value == 0 || value > (1ull << 40) / scale) return false;
  out = value * scale;
  return out % 4 == 0;
}

bool parseInt(const char* text, int low, int high, int& out) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < low || value > high) return false;
  out = static_cast<int>(value);
  return true;
}

// Returns -1 to go on, else the exit status.
int parseArgs(int argc, char** argv, Options& options, bool quiet) {
  auto fail = [&](const std::string& what) {
    if (!quiet) std::fprintf(stderr, "%s: %s; see --help\n", kName, what.c_str());
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      if (!quiet) usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) return fail(arg + " needs a value or is unknown");
    const char* value = argv[++i];
    if (arg == "--mode") {
      const std::string mode = value;
      if (mode == "allreduce") options.mode = Mode::AllReduce;
      else if (mode == "sendrecv") options.mode = Mode::SendRecv;
      else return fail("--mode: expected allreduce or sendrecv");
    } else if (arg == "--steps") {
      if (!parseInt(value, 1, 100000000, options.steps)) return fail("--steps: expected 1 to 100000000");
    } else if (arg == "--print-every") {
      if (!parseInt(value, 0, 100000000, options.printEvery))
        return fail("--print-every: expected 0 or more");
    } else if (arg == "--gpus") {
      if (!parseInt(value, 1, 1024, options.gpus)) return fail("--gpus: expected 1 to 1024");
    } else if (arg == "--lr") {
      char* end = nullptr;
      const double lr = std::strtod(value, &end);
      if (end == value || *end != '\0' || !(lr >= 0.0 && lr <= 1.0)) return fail("--lr: expected 0 to 1");
      options.lr = static_cast<float>(lr);
    } else if (arg == "--buckets") {
      options.bucketBytes.clear();
      std::string list = value;
      std::size_t start = 0;
      while (start <= list.size()) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        std::uint64_t bytes = 0;
        if (!parseSize(list.substr(start, comma - start), bytes)) {
          return fail("--buckets: '" + list.substr(start, comma - start) +
                      "' is not a size in bytes, a positive multiple of 4 (e.g. 4M)");
        }
        options.bucketBytes.push_back(bytes);
        start = comma + 1;
      }
      if (options.bucketBytes.size() > 64) return fail("--buckets: at most 64 buckets");
    } else {
      return fail("unknown option " + arg);
    }
  }
  return -1;
}

// True when an MPI launcher started this process (then MPI bootstraps NCCL).
bool launchedByMpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

// One GPU's rank: its communicator, stream, buffers and per-bucket timing events.
struct Rank {
  int device = 0;
  int rank = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<float*> grads;     // one buffer per bucket, all-reduced in place
  std::vector<float*> received;  // --mode sendrecv: the other rank's gradient, per bucket
  std::vector<float*> weights;   // the parameters the buckets belong to
  unsigned long long* wrong = nullptr;
  std::vector<cudaEvent_t> begin, end;  // per bucket
};

bool gUseMpi = false;
int gWorldRank = 0;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "%s: rank %d: %s\n", kName, gWorldRank, what.c_str());
  std::fflush(stderr);
  if (gUseMpi) MPI_Abort(MPI_COMM_WORLD, 3);
  std::exit(3);
}

void cudaCheck(cudaError_t status, const char* what) {
  if (status != cudaSuccess) die(std::string(what) + " failed: " + cudaGetErrorString(status));
}
void launchCheck(int status, const char* what) {
  cudaCheck(static_cast<cudaError_t>(status), what);
}
void ncclCheck(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) die(std::string(what) + " failed: " + ncclGetErrorString(status));
}

std::string formatBytes(std::uint64_t bytes) {
  char text[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
    std::snprintf(text, sizeof text, "%" PRIu64 " MiB", bytes >> 20);
  } else if (bytes >= 1024 && bytes % 1024 == 0) {
    std::snprintf(text, sizeof text, "%" PRIu64 " KiB", bytes >> 10);
  } else {
    std::snprintf(text, sizeof text, "%" PRIu64 " B", bytes);
  }
  return text;
}

std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t hash) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// --mode sendrecv: bucket k exchanged between the 2 ranks (one ncclSend and one ncclRecv each, in one
// group, so that neither waits for the other), then the received gradient added to the rank's own: the sum
// an all-reduce of 2 ranks makes. Timed like an all-reduce, by the events around the group.
void exchange(std::vector<Rank>& ranks, std::size_t k, unsigned long long elements) {
  const auto count = static_cast<std::size_t>(elements);
  ncclCheck(ncclGroupStart(), "ncclGroupStart");
  for (Rank& r : ranks) {
    if (ranks.size() > 1) cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
    cudaCheck(cudaEventRecord(r.begin[k], r.stream), "cudaEventRecord");
    const int peer = 1 - r.rank;
    ncclCheck(ncclSend(r.grads[k], count, ncclFloat, peer, r.comm, r.stream), "ncclSend");
    ncclCheck(ncclRecv(r.received[k], count, ncclFloat, peer, r.comm, r.stream), "ncclRecv");
  }
  ncclCheck(ncclGroupEnd(), "ncclGroupEnd");
  for (Rank& r : ranks) {
    cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
    cudaCheck(cudaEventRecord(r.end[k], r.stream), "cudaEventRecord");
    launchCheck(sample::launchAdd(r.grads[k], r.received[k], elements, r.stream), "add kernel");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  gUseMpi = launchedByMpi();
  int worldSize = 1;
  if (gUseMpi) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &gWorldRank);
    MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
  }
  // Arguments are the same on every rank: every rank decides alike, rank 0 speaks.
  const int parsed = parseArgs(argc, argv, options, gWorldRank != 0);
  if (parsed >= 0) {
    if (gUseMpi) MPI_Finalize();
    return parsed;
  }

  // Which GPU(s) this process drives. Every rank reports whether it has one; if any has not, the
  // lowest such rank says why and every rank exits with 3.
  int deviceCount = 0;
  const cudaError_t countStatus = cudaGetDeviceCount(&deviceCount);
  std::string problem;
  if (countStatus != cudaSuccess) {
    problem = std::string("no usable CUDA GPU (cudaGetDeviceCount: ") + cudaGetErrorString(countStatus) +
              "); this sample needs one NVIDIA GPU per rank";
  } else if (deviceCount == 0) {
    problem = "no CUDA GPU visible (CUDA_VISIBLE_DEVICES?); this sample needs one NVIDIA GPU per rank";
  }
  int localRank = 0;
  int localSize = 1;
  if (gUseMpi) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, gWorldRank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &localRank);
    MPI_Comm_size(node, &localSize);
    MPI_Comm_free(&node);
    if (problem.empty() && localSize > deviceCount) {
      problem = std::to_string(localSize) + " ranks on this node but " + std::to_string(deviceCount) +
                " GPUs visible; start one rank per GPU";
    }
  } else if (problem.empty() && options.gpus > deviceCount) {
    problem =
        "--gpus " + std::to_string(options.gpus) + " but " + std::to_string(deviceCount) + " GPUs visible";
  }
  const bool sendRecv = options.mode == Mode::SendRecv;
  const int plannedRanks = gUseMpi ? worldSize : (options.gpus > 0 ? options.gpus : deviceCount);
  // A usage error before a missing GPU (one process: the GPU count is the rank count, so only with GPUs).
  // Under MPI every rank knows it alike, whatever its GPUs, and rank 0 says it.
  if (sendRecv && plannedRanks != 2 && (gUseMpi || problem.empty())) {
    if (gWorldRank == 0)
      std::fprintf(stderr, "%s: --mode sendrecv exchanges between exactly 2 ranks, not %d\n", kName,
                   plannedRanks);
    if (gUseMpi) MPI_Finalize();
    return 2;
  }
  int firstBad = problem.empty() ? worldSize : gWorldRank;
  if (gUseMpi) MPI_Allreduce(MPI_IN_PLACE, &firstBad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (firstBad < worldSize) {
    if (firstBad == gWorldRank) std::fprintf(stderr, "%s: rank %d: %s\n", kName, gWorldRank, problem.c_str());
    if (gUseMpi) MPI_Finalize();
    return 3;
  }

  // Communicators: one per GPU.
  std::vector<Rank> ranks;
  int nranks = worldSize;
  if (gUseMpi) {
    ncclUniqueId id;
    if (gWorldRank == 0) ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    Rank r;
    r.device = localRank;
    r.rank = gWorldRank;
    cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
    ncclCheck(ncclCommInitRank(&r.comm, worldSize, id, gWorldRank), "ncclCommInitRank");
    ranks.push_back(r);
  } else {
    nranks = options.gpus > 0 ? options.gpus : deviceCount;
    std::vector<int> devices(static_cast<std::size_t>(nranks));
    for (int d = 0; d < nranks; ++d) devices[static_cast<std::size_t>(d)] = d;
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(nranks));
    ncclCheck(ncclCommInitAll(comms.data(), nranks, devices.data()), "ncclCommInitAll");
    for (int d = 0; d < nranks; ++d) {
      Rank r;
      r.device = d;
      r.rank = d;
      r.comm = comms[static_cast<std::size_t>(d)];
      ranks.push_back(r);
    }
  }

  const std::size_t buckets = options.bucketBytes.size();
  std::uint64_t stepBytes = 0;
  for (std::uint64_t b : options.bucketBytes) stepBytes += b;
  for (Rank& r : ranks) {
    cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
    cudaCheck(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaCheck(cudaMalloc(&r.wrong, sizeof *r.wrong), "cudaMalloc");
    cudaCheck(cudaMemset(r.wrong, 0, sizeof *r.wrong), "cudaMemset");
    for (std::size_t b = 0; b < buckets; ++b) {
      float* grad = nullptr;
      float* weight = nullptr;
      if (sendRecv) {
        float* received = nullptr;
        cudaCheck(cudaMalloc(&received, options.bucketBytes[b]), "cudaMalloc (received bucket)");
        r.received.push_back(received);
      }
      cudaCheck(cudaMalloc(&grad, options.bucketBytes[b]), "cudaMalloc (gradient bucket)");
      cudaCheck(cudaMalloc(&weight, options.bucketBytes[b]), "cudaMalloc (weights)");
      cudaCheck(cudaMemset(weight, 0, options.bucketBytes[b]), "cudaMemset");
      r.grads.push_back(grad);
      r.weights.push_back(weight);
      cudaEvent_t e0;
      cudaEvent_t e1;
      cudaCheck(cudaEventCreate(&e0), "cudaEventCreate");
      cudaCheck(cudaEventCreate(&e1), "cudaEventCreate");
      r.begin.push_back(e0);
      r.end.push_back(e1);
    }
    cudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  const bool speaker = gWorldRank == 0;
  if (speaker) {
    std::string list;
    for (std::uint64_t b : options.bucketBytes) list += (list.empty() ? "" : ", ") + formatBytes(b);
    std::printf("nccl %d.%d.%d, %d ranks (%s), %zu gradient buckets per step (%s), %d steps, %s\n",
                NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, nranks,
                gUseMpi ? "one process per GPU, MPI bootstrap" : "one process, ncclCommInitAll", buckets,
                list.c_str(), options.steps, sendRecv ? "ncclSend/ncclRecv" : "ncclAllReduce");
    std::fflush(stdout);
  }

  // Time per bucket on the first local rank, summed over the steps after the first (warm-up).
  std::vector<double> bucketMs(buckets, 0.0);
  int timedSteps = 0;
  for (int step = 0; step < options.steps; ++step) {
    // Backward pass: every bucket's gradient.
    for (Rank& r : ranks) {
      cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
      for (std::size_t b = 0; b < buckets; ++b) {
        launchCheck(sample::launchFill(r.grads[b], options.bucketBytes[b] / 4, static_cast<int>(b), step,
                                       r.rank, r.stream),
                    "fill kernel");
      }
    }
    // All-reduce, last bucket first (the order in which a backward pass finishes them).
    for (std::size_t k = buckets; k-- > 0;) {
      if (sendRecv) {
        exchange(ranks, k, options.bucketBytes[k] / 4);
        continue;
      }
      if (ranks.size() > 1) ncclCheck(ncclGroupStart(), "ncclGroupStart");
      for (Rank& r : ranks) {
        if (ranks.size() > 1) cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
        cudaCheck(cudaEventRecord(r.begin[k], r.stream), "cudaEventRecord");
        ncclCheck(ncclAllReduce(r.grads[k], r.grads[k], options.bucketBytes[k] / 4, ncclFloat, ncclSum,
                                r.comm, r.stream),
                  "ncclAllReduce");
      }
      if (ranks.size() > 1) ncclCheck(ncclGroupEnd(), "ncclGroupEnd");
      for (Rank& r : ranks) {
        cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
        cudaCheck(cudaEventRecord(r.end[k], r.stream), "cudaEventRecord");
      }
    }
    // Check every result, then the optimizer step.
    for (Rank& r : ranks) {
      cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
      for (std::size_t b = 0; b < buckets; ++b) {
        const unsigned long long n = options.bucketBytes[b] / 4;
        launchCheck(sample::launchCheck(r.grads[b], n, static_cast<int>(b), step, nranks, r.wrong, r.stream),
                    "check kernel");
        launchCheck(sample::launchSgd(r.weights[b], r.grads[b], n, nranks, options.lr, r.stream),
                    "sgd kernel");
      }
    }
    for (Rank& r : ranks) {
      cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
      cudaCheck(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
    }
    if (step > 0 || options.steps == 1) {
      ++timedSteps;
      for (std::size_t b = 0; b < buckets; ++b) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, ranks[0].begin[b], ranks[0].end[b]), "cudaEventElapsedTime");
        bucketMs[b] += static_cast<double>(ms);
      }
    }
    if (speaker && options.printEvery > 0 && (step + 1) % options.printEvery == 0) {
      unsigned long long wrong = 0;
      cudaCheck(cudaSetDevice(ranks[0].device), "cudaSetDevice");
      cudaCheck(cudaMemcpy(&wrong, ranks[0].wrong, sizeof wrong, cudaMemcpyDeviceToHost), "cudaMemcpy");
      std::printf("step %d: %" PRIu64 " bytes all-reduced per rank, %llu wrong elements so far\n", step + 1,
                  stepBytes, wrong);
      std::fflush(stdout);
    }
  }

  // Results: wrong elements over every rank, and the weights' hash, which must agree everywhere.
  unsigned long long wrong = 0;
  std::uint64_t hashLow = ~0ull;
  std::uint64_t hashHigh = 0;
  for (Rank& r : ranks) {
    cudaCheck(cudaSetDevice(r.device), "cudaSetDevice");
    unsigned long long w = 0;
    cudaCheck(cudaMemcpy(&w, r.wrong, sizeof w, cudaMemcpyDeviceToHost), "cudaMemcpy");
    wrong += w;
    std::uint64_t hash = 0xcbf29ce484222325ull;
    for (std::size_t b = 0; b < buckets; ++b) {
      std::vector<float> host(options.bucketBytes[b] / 4);
      cudaCheck(cudaMemcpy(host.data(), r.weights[b], options.bucketBytes[b], cudaMemcpyDeviceToHost),
                "cudaMemcpy");
      hash = fnv1a(host.data(), options.bucketBytes[b], hash);
    }
    hashLow = std::min(hashLow, hash);
    hashHigh = std::max(hashHigh, hash);
  }
  if (gUseMpi) {
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hashLow, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hashHigh, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  }
  if (speaker) {
    for (std::size_t b = 0; b < buckets; ++b) {
      const double ms = bucketMs[b] / std::max(timedSteps, 1);
      const double algbw = static_cast<double>(options.bucketBytes[b]) / (ms * 1e-3) / 1e9;
      // nccl-tests' factors: 2(n-1)/n for an all-reduce, 1 for a send/receive.
      const double busbw = sendRecv ? algbw : algbw * 2.0 * (nranks - 1) / nranks;
      std::printf(
          "bucket %zu: %s, %.3f ms per %s (rank 0, mean of %d steps), algbw %.2f GB/s, busbw %.2f "
          "GB/s\n",
          b, formatBytes(options.bucketBytes[b]).c_str(), ms, sendRecv ? "exchange" : "all-reduce",
          timedSteps, algbw, busbw);
    }
    std::printf("final steps %d ranks %d buckets %zu wrong %llu weights fnv1a64 %016" PRIx64 "%s\n",
                options.steps, nranks, buckets, wrong, hashLow,
                hashLow == hashHigh ? "" : " (DIFFERENT ON SOME RANKS)");
    std::fflush(stdout);
  }

  for (Rank& r : ranks) {
    cudaSetDevice(r.device);
    for (std::size_t b = 0; b < buckets; ++b) {
      cudaFree(r.grads[b]);
      if (sendRecv) cudaFree(r.received[b]);
      cudaFree(r.weights[b]);
      cudaEventDestroy(r.begin[b]);
      cudaEventDestroy(r.end[b]);
    }
    cudaFree(r.wrong);
    cudaStreamDestroy(r.stream);
    ncclCommDestroy(r.comm);
  }
  if (gUseMpi) MPI_Finalize();
  return (wrong == 0 && hashLow == hashHigh) ? 0 : 1;
}
