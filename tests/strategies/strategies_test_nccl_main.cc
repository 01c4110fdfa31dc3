// GoogleTest main for the strategy tests on NCCL communicators with several ranks, without an MPI
// launcher (GPU machines often have none):
//
//   gradscope_strategy_tests_nccl [--ranks N] [GoogleTest flags]
//
// The process started by ctest only launches. It makes the NCCL unique id (ncclNewUniqueId, whose
// bootstrap root lives in this process until the ranks have met), starts itself N times with the id,
// the rank and the world size in its environment, waits for all of them, and exits with the first
// failing rank's status (0 when all pass). Each rank builds its communicator with ncclFromUniqueId on
// GPU r when GRADSCOPE_TEST_NCCL_DEVICES says there is one per rank, else on GPU 0, and runs the
// tests; rank 0 prints GoogleTest's report, the others only their failures, prefixed with the rank.
//
// Fewer GPUs than ranks: NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"), and
// tells hosts apart by NCCL_HOSTID, so each rank gets its own (gradscope-strategies-<rank>) and NCCL
// joins them with its socket transport (over the loopback interface unless NCCL_SOCKET_IFNAME is set),
// as tests/agent/nccl/nccl_pair.cc does.
//
// No usable GPU: one line with the reason, exit 77 (ctest's SKIP_RETURN_CODE).

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gradscope/comm/nccl.h"
#include "gradscope/common/error.h"
#include "strategies_test_world.h"

extern char** environ;

namespace gradscope::comm {
namespace {

constexpr int kSkip = 77;
constexpr const char* kRankVariable = "GRADSCOPE_TEST_NCCL_RANK";
constexpr const char* kRanksVariable = "GRADSCOPE_TEST_NCCL_RANKS";
constexpr const char* kIdVariable = "GRADSCOPE_TEST_NCCL_ID";

std::unique_ptr<Communicator> world;

std::string toHex(std::string_view bytes) {
  std::string hex;
  for (const char byte : bytes) hex += fmt::format("{:02x}", static_cast<unsigned char>(byte));
  return hex;
}

std::string fromHex(std::string_view hex) {
  std::string bytes;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes += static_cast<char>(std::strtoul(std::string(hex.substr(i, 2)).c_str(), nullptr, 16));
  return bytes;
}

// GRADSCOPE_TEST_NCCL_DEVICES=N says the machine has N GPUs: with at least one per rank, rank r takes
// GPU r; otherwise every rank takes GPU 0, as a separate NCCL host.
bool gpuPerRank(int ranks) {
  const char* devices = std::getenv("GRADSCOPE_TEST_NCCL_DEVICES");
  return devices != nullptr && std::atoi(devices) >= ranks;
}

// Waits for every rank; the result is the first failing rank's exit status, or 0. Once a rank has
// failed, the others get 30 seconds to finish before they are killed: a rank that is gone leaves the
// rest waiting in NCCL for ever.
int waitForRanks(std::map<pid_t, int> running) {
  constexpr auto kGrace = std::chrono::seconds(30);
  int result = 0;
  // Set once a rank has failed; until then, and once the rest are killed, waitpid blocks.
  bool counting = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!running.empty()) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, counting ? WNOHANG : 0);
    if (done < 0 && errno != EINTR) break;
    if (done > 0) {
      const auto it = running.find(done);
      if (it == running.end()) continue;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0) {
        fmt::print(stderr, "rank {} exited with {}\n", it->second, code);
        if (result == 0) result = code;
        if (deadline == std::chrono::steady_clock::time_point::max()) {
          deadline = std::chrono::steady_clock::now() + kGrace;
          counting = true;
        }
      }
      running.erase(it);
      continue;
    }
    if (counting && std::chrono::steady_clock::now() >= deadline) {
      for (const auto& [child, rank] : running) {
        fmt::print(stderr, "rank {} still running {} s after a rank failed: killed\n", rank, kGrace.count());
        kill(child, SIGKILL);
      }
      counting = false;  // reap them, blocking
      continue;
    }
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return result;
}

// Starts this program (with its original arguments, GoogleTest's included) as each rank and waits for
// them all.
int launch(int ranks, char** argv) {
  std::string reason;
  if (!ncclAvailable(&reason)) {
    fmt::print("SKIP: NCCL strategy tests need a GPU: {}\n", reason);
    return kSkip;
  }
  // The bootstrap root listens on the interface the ranks will use.
  const bool shared_gpu = !gpuPerRank(ranks);
  if (shared_gpu) setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
  const std::string id = toHex(ncclNewUniqueId());
  std::map<pid_t, int> running;  // pid -> rank
  for (int rank = 0; rank < ranks; ++rank) {
    std::vector<std::string> environment;
    for (char** variable = environ; *variable != nullptr; ++variable) environment.emplace_back(*variable);
    environment.push_back(fmt::format("{}={}", kRankVariable, rank));
    environment.push_back(fmt::format("{}={}", kRanksVariable, ranks));
    environment.push_back(fmt::format("{}={}", kIdVariable, id));
    if (shared_gpu) environment.push_back(fmt::format("NCCL_HOSTID=gradscope-strategies-{}", rank));
    std::vector<char*> envp;
    for (std::string& variable : environment) envp.push_back(variable.data());
    envp.push_back(nullptr);
    pid_t child = 0;
    if (const int error = posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv, envp.data());
        error != 0) {
      fmt::print(stderr, "cannot start rank {}: {}\n", rank, std::strerror(error));
      return 1;
    }
    running[child] = rank;
  }
  return waitForRanks(std::move(running));
}

// One rank: the communicator from the launcher's id, then the tests.
int runRank(int rank, int ranks) {
  const char* id = std::getenv(kIdVariable);
  const int device = gpuPerRank(ranks) ? rank : 0;
  try {
    world = ncclFromUniqueId(fromHex(id != nullptr ? id : ""), rank, ranks, device);
  } catch (const Error& error) {
    fmt::print(stderr, "[rank {}] {}\n", rank, error.what());
    return 3;
  }
  reportAsRank(rank);
  const int status = RUN_ALL_TESTS();
  world.reset();
  return status;
}

}  // namespace

Communicator& testWorld() {
  return *world;
}

}  // namespace gradscope::comm

int main(int argc, char** argv) {
  std::vector<char*> original(argv, argv + argc);  // InitGoogleTest takes its flags out of argv
  original.push_back(nullptr);
  testing::InitGoogleTest(&argc, argv);
  if (const char* rank = std::getenv(gradscope::comm::kRankVariable)) {
    const char* ranks = std::getenv(gradscope::comm::kRanksVariable);
    return gradscope::comm::runRank(std::atoi(rank), ranks != nullptr ? std::atoi(ranks) : 1);
  }
  int ranks = 2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) {
      ranks = std::atoi(argv[i + 1]);
    } else {
      fmt::print(stderr, "usage: {} [--ranks N] [GoogleTest flags]; unknown argument '{}'\n", argv[0],
                 argv[i]);
      return 2;
    }
    ++i;
  }
  if (ranks < 1) {
    fmt::print(stderr, "--ranks: need at least 1\n");
    return 2;
  }
  return gradscope::comm::launch(ranks, original.data());
}
