// A two-rank NCCL job on ONE GPU, for checking the agent and the NCCL plugins where NCCL really chooses
// an algorithm and a protocol (a one-rank communicator never asks the tuner and reports no collective
// to the profiler: NCCL copies the buffer instead).
//
// NCCL refuses two ranks on one GPU of one host ("Duplicate GPU detected"); it tells hosts apart by
// NCCL_HOSTID, so each rank gets its own (gradscope-pair-<rank>) and NCCL sees two nodes of one GPU
// each, joined by its socket transport over the loopback interface (NCCL_SOCKET_IFNAME=lo unless set).
//
//   nccl-pair [--steps N] [--expect sync|stale<K>|dga<K>] [--graph] [--p2p]
//
// The process started by the user only launches: it starts itself twice (GRADSCOPE_PAIR_RANK=0 and 1),
// rank 0 makes the unique id and hands it to the launcher through a pipe, which gives it to rank 1.
// Each rank all-reduces (sum, fp32, out of place) buffers of 4 KiB, 64 KiB, 1 MiB and 16 MiB every
// step; the inputs are small integers, so every sum is exact under any algorithm and protocol and is
// checked element by element. Each rank prints one line per size and a final line; the launcher
// prints nothing of its own. Exit status 0, 1 for a wrong sum, 3 when CUDA or NCCL fails.
//
// --expect says what each call must return when the agent applies an async strategy to every call
// (docs/async.md; a = (i + step) % 7): sync (the default) 3a[t]; stale<K> 3a[t-K] from step K on, dga<K>
// 3a[t-K] + 2(r + 1)(a[t] - a[t-K]) from step K on; the first K steps their own sums. All exact in fp32.
//
// --graph: after the steps, each rank captures one 64 KiB all-reduce into a CUDA graph and launches the
// graph kGraphLaunches times, checking every result (b = i % 5: the sum is 3b); it prints
// "rank R: graph: N launches, wrong W". A one-rank communicator would capture a copy: two ranks capture
// NCCL's own kernels, whose replays the agent traces (check_nccl.py real-pair-graph).
//
// --p2p: after the steps, the ranks exchange kP2pBytes each way twice: a send and a receive on their own
// (rank 0 sends first, rank 1 receives first), then both in one group. Rank r sends (r + 1) * (i % 9);
// it prints "rank R: p2p: 2 exchanges, wrong W" (check_nccl.py real-pair-p2p).
//
// Never linked with gradscope: the agent and the plugins observe it from outside
// (tests/agent/nccl/check_nccl.py real-pair, scripts/gpu_check.sh).

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

namespace {

constexpr std::size_t kSizes[] = {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20,
                                  std::size_t{16} << 20};
constexpr std::size_t kGraphBytes = std::size_t{64} << 10;
constexpr int kGraphLaunches = 3;
constexpr std::size_t kP2pBytes = std::size_t{256} << 10;

[[noreturn]] void fail(int rank, const char* what, const char* detail) {
  std::fprintf(stderr, "nccl-pair: rank %d: %s failed: %s\n", rank, what, detail);
  std::exit(3);
}

std::string toHex(const ncclUniqueId& id) {
  static const char kDigits[] = "0123456789abcdef";
  std::string text;
  for (const char c : id.internal) {
    const auto byte = static_cast<unsigned char>(c);
    text += kDigits[byte >> 4];
    text += kDigits[byte & 15];
  }
  return text;
}

bool fromHex(const char* text, ncclUniqueId& id) {
  if (text == nullptr || std::strlen(text) != 2 * sizeof(id.internal)) return false;
  for (std::size_t i = 0; i < sizeof(id.internal); ++i) {
    unsigned value = 0;
    if (std::sscanf(text + 2 * i, "%2x", &value) != 1) return false;
    id.internal[i] = static_cast<char>(value);
  }
  return true;
}

// What a call must return (--expect).
struct Expect {
  enum class Kind { Sync, Stale, Dga } kind = Kind::Sync;
  int staleness = 0;

  float at(int rank, int step, std::size_t i) const {
    const auto a = [i](int t) { return static_cast<int>((i + static_cast<std::size_t>(t)) % 7); };
    if (kind == Kind::Sync || step < staleness) return static_cast<float>(3 * a(step));
    const int before = step - staleness;
    if (kind == Kind::Stale) return static_cast<float>(3 * a(before));
    return static_cast<float>(3 * a(before) + 2 * (rank + 1) * (a(step) - a(before)));
  }
};

bool parseExpect(const char* text, Expect& expect) {
  const std::string value = text;
  if (value == "sync") {
    expect = {};
    return true;
  }
  for (const auto& [prefix, kind] :
       {std::pair{"stale", Expect::Kind::Stale}, std::pair{"dga", Expect::Kind::Dga}}) {
    const std::string p = prefix;
    if (value.size() == p.size() + 1 && value.compare(0, p.size(), p) == 0 && value.back() >= '1' &&
        value.back() <= '4') {
      expect = {kind, value.back() - '0'};
      return true;
    }
  }
  return false;
}

// One rank: returns the process exit status.
int runRank(int rank, int steps, const Expect& expect, bool graph, bool p2p) {
  const auto cuda = [rank](cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) fail(rank, what, cudaGetErrorString(rc));
  };
  const auto nccl = [rank](ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess) fail(rank, what, ncclGetErrorString(rc));
  };
  ncclUniqueId id{};
  if (rank == 0) {
    nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const char* fd_text = std::getenv("GRADSCOPE_PAIR_ID_FD");
    const std::string hex = toHex(id) + "\n";
    const int fd = fd_text != nullptr ? std::atoi(fd_text) : -1;
    if (fd < 0 || write(fd, hex.data(), hex.size()) != static_cast<ssize_t>(hex.size()))
      fail(rank, "handing the unique id to the launcher", std::strerror(errno));
    close(fd);
  } else if (!fromHex(std::getenv("GRADSCOPE_PAIR_ID"), id)) {
    fail(rank, "reading GRADSCOPE_PAIR_ID", "not 256 hex digits (start nccl-pair without it)");
  }
  cuda(cudaSetDevice(0), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  nccl(ncclCommInitRank(&comm, 2, id, rank), "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  const std::size_t max_count = kSizes[std::size(kSizes) - 1] / sizeof(float);
  std::vector<float> host(max_count), result(max_count);
  float* send = nullptr;
  float* recv = nullptr;
  cuda(cudaMalloc(reinterpret_cast<void**>(&send), max_count * sizeof(float)), "cudaMalloc");
  cuda(cudaMalloc(reinterpret_cast<void**>(&recv), max_count * sizeof(float)), "cudaMalloc");

  std::uint64_t wrong_total = 0;
  for (int step = 0; step < steps; ++step) {
    for (const std::size_t bytes : kSizes) {
      const std::size_t count = bytes / sizeof(float);
      // Rank r's element i: (r + 1) * ((i + step) % 7); the sum over both ranks: 3 * ((i + step) % 7).
      for (std::size_t i = 0; i < count; ++i)
        host[i] = static_cast<float>((rank + 1) * static_cast<int>((i + static_cast<std::size_t>(step)) % 7));
      // On the call's own stream: a non-blocking stream is not ordered after the legacy default stream's
      // copy and memset, and a sum that arrives fast (the agent's async strategies return one already
      // made) was seen overwritten by the memset.
      cuda(cudaMemcpyAsync(send, host.data(), bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
      cuda(cudaMemsetAsync(recv, 0xff, bytes, stream),
           "cudaMemsetAsync");  // NaN: an unwritten element is wrong
      nccl(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream), "ncclAllReduce");
      cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      cuda(cudaMemcpy(result.data(), recv, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      std::uint64_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) wrong += result[i] != expect.at(rank, step, i);
      wrong_total += wrong;
      if (step == steps - 1)
        std::printf("rank %d: %zu bytes: wrong %llu\n", rank, bytes, static_cast<unsigned long long>(wrong));
    }
  }
  std::printf("rank %d: done, %d steps x %zu all-reduces, wrong %llu\n", rank, steps, std::size(kSizes),
              static_cast<unsigned long long>(wrong_total));
  if (graph) {
    const std::size_t count = kGraphBytes / sizeof(float);
    for (std::size_t i = 0; i < count; ++i)
      host[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 5));
    cuda(cudaMemcpyAsync(send, host.data(), kGraphBytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cudaGraph_t captured = nullptr;
    cudaGraphExec_t launchable = nullptr;
    cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    nccl(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream), "ncclAllReduce (captured)");
    cuda(cudaStreamEndCapture(stream, &captured), "cudaStreamEndCapture");
    cuda(cudaGraphInstantiate(&launchable, captured, 0), "cudaGraphInstantiate");
    std::uint64_t wrong = 0;
    for (int launch = 0; launch < kGraphLaunches; ++launch) {
      cuda(cudaMemsetAsync(recv, 0xff, kGraphBytes, stream), "cudaMemsetAsync");
      cuda(cudaGraphLaunch(launchable, stream), "cudaGraphLaunch");
      cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      cuda(cudaMemcpy(result.data(), recv, kGraphBytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (std::size_t i = 0; i < count; ++i)
        wrong += result[i] != static_cast<float>(3 * static_cast<int>(i % 5));
    }
    std::printf("rank %d: graph: %d launches, wrong %llu\n", rank, kGraphLaunches,
                static_cast<unsigned long long>(wrong));
    wrong_total += wrong;
    cuda(cudaGraphExecDestroy(launchable), "cudaGraphExecDestroy");
    cuda(cudaGraphDestroy(captured), "cudaGraphDestroy");
  }
  if (p2p) {
    const std::size_t count = kP2pBytes / sizeof(float);
    const int peer = 1 - rank;
    for (std::size_t i = 0; i < count; ++i)
      host[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 9));
    cuda(cudaMemcpyAsync(send, host.data(), kP2pBytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    std::uint64_t wrong = 0;
    const auto check = [&] {
      cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      cuda(cudaMemcpy(result.data(), recv, kP2pBytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (std::size_t i = 0; i < count; ++i)
        wrong += result[i] != static_cast<float>((peer + 1) * static_cast<int>(i % 9));
    };
    cuda(cudaMemsetAsync(recv, 0xff, kP2pBytes, stream), "cudaMemsetAsync");
    if (rank == 0) {
      nccl(ncclSend(send, count, ncclFloat, peer, comm, stream), "ncclSend");
      nccl(ncclRecv(recv, count, ncclFloat, peer, comm, stream), "ncclRecv");
    } else {
      nccl(ncclRecv(recv, count, ncclFloat, peer, comm, stream), "ncclRecv");
      nccl(ncclSend(send, count, ncclFloat, peer, comm, stream), "ncclSend");
    }
    check();
    cuda(cudaMemsetAsync(recv, 0xff, kP2pBytes, stream), "cudaMemsetAsync");
    nccl(ncclGroupStart(), "ncclGroupStart");
    nccl(ncclSend(send, count, ncclFloat, peer, comm, stream), "ncclSend");
    nccl(ncclRecv(recv, count, ncclFloat, peer, comm, stream), "ncclRecv");
    nccl(ncclGroupEnd(), "ncclGroupEnd");
    check();
    std::printf("rank %d: p2p: 2 exchanges, wrong %llu\n", rank, static_cast<unsigned long long>(wrong));
    wrong_total += wrong;
  }
  std::fflush(stdout);
  cuda(cudaFree(send), "cudaFree");
  cuda(cudaFree(recv), "cudaFree");
  cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  nccl(ncclCommDestroy(comm), "ncclCommDestroy");
  return wrong_total == 0 ? 0 : 1;
}

// Starts this program as `rank` with `extra` environment variables; returns its pid.
pid_t startRank(int rank, char** argv, const std::vector<std::string>& extra, int close_fd) {
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("nccl-pair: fork");
    std::exit(3);
  }
  if (pid > 0) return pid;
  if (close_fd >= 0) close(close_fd);
  setenv("GRADSCOPE_PAIR_RANK", std::to_string(rank).c_str(), 1);
  setenv("NCCL_HOSTID", ("gradscope-pair-" + std::to_string(rank)).c_str(), 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  for (const std::string& variable : extra) {
    const std::size_t eq = variable.find('=');
    setenv(variable.substr(0, eq).c_str(), variable.substr(eq + 1).c_str(), 1);
  }
  execv("/proc/self/exe", argv);
  std::perror("nccl-pair: exec");
  _exit(3);
}

int launch(char** argv) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("nccl-pair: pipe");
    return 3;
  }
  const pid_t first = startRank(0, argv, {"GRADSCOPE_PAIR_ID_FD=" + std::to_string(fds[1])}, fds[0]);
  close(fds[1]);
  std::string hex;
  char chunk[300];
  ssize_t n = 0;
  while ((n = read(fds[0], chunk, sizeof chunk)) > 0) hex.append(chunk, static_cast<std::size_t>(n));
  close(fds[0]);
  while (!hex.empty() && hex.back() == '\n') hex.pop_back();
  pid_t second = -1;
  if (hex.size() == 2 * sizeof(ncclUniqueId::internal)) {
    std::fflush(stdout);
    second = startRank(1, argv, {"GRADSCOPE_PAIR_ID=" + hex}, -1);
  }
  int status = 0;
  for (const pid_t pid : {first, second}) {
    if (pid < 0) {
      status = 3;
      continue;
    }
    int rc = 0;
    if (waitpid(pid, &rc, 0) < 0 || !WIFEXITED(rc)) status = 3;
    else if (WEXITSTATUS(rc) != 0 && status == 0) status = WEXITSTATUS(rc);
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5;
  bool graph = false;
  bool p2p = false;
  Expect expect;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--graph") == 0) {
      graph = true;
    } else if (std::strcmp(argv[i], "--p2p") == 0) {
      p2p = true;
    } else if (std::strcmp(argv[i], "--expect") == 0 && i + 1 < argc) {
      if (!parseExpect(argv[++i], expect)) {
        std::fprintf(stderr, "nccl-pair: --expect takes sync, stale1..stale4 or dga1..dga4, not %s\n",
                     argv[i]);
        return 2;
      }
    } else {
      std::fprintf(
          stderr,
          "nccl-pair: unknown argument %s (usage: nccl-pair [--steps N] [--expect sync|stale<K>|dga<K>] "
          "[--graph] [--p2p])\n",
          argv[i]);
      return 2;
    }
  }
  if (steps < 1) {
    std::fprintf(stderr, "nccl-pair: --steps needs a positive count\n");
    return 2;
  }
  const char* rank = std::getenv("GRADSCOPE_PAIR_RANK");
  if (rank == nullptr) return launch(argv);
  return runRank(std::atoi(rank), steps, expect, graph, p2p);
}
