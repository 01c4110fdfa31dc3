// libgradscope-agent-mpi.so: explore and apply over MPI communicators (extension.h says why this is
// a library of its own, and what the agent guarantees about the order of calls; strategy_extension.h
// holds everything that is not MPI's).
//
// MPI specifics: start() agrees over a copy of MPI_COMM_WORLD (every rank calls it right after
// MPI_Init); each job communicator's duplicate is a private copy of it (comm::mpiDuplicateOf); the shadow
// arena is one host mapping made at start, touched only as used; the job's buffers are host memory, and
// every MPI call is complete when it returns, so no ordering with the job's work is needed.
//
// Threads. Below MPI_THREAD_MULTIPLE the intercepted call's thread is the only one in MPI: the
// duplicates, the communicators of sum/hier and those of Open MPI's forced algorithms are made lazily,
// at a communicator's first explored or applied call. At MPI_THREAD_MULTIPLE some job thread may be
// creating a communicator at any moment once MPI_Init_thread has returned, and the agent must create
// none beside it: Open MPI 4.1 can deadlock when two threads create communicators at once (both ranks
// seen waiting in its CID agreement under explore), and a forced algorithm, a process-wide variable
// while a communicator is made, would reach the job's. So at that level every communicator the agent
// needs is made inside a creation the job is making anyway: at MPI_Init for MPI_COMM_WORLD and
// MPI_COMM_SELF (and Open MPI's forced algorithms, for MPI_COMM_WORLD only: comm/mpi.h,
// mpiPrepareForcedAlgorithms), and inside the job's MPI_Comm_dup, _split, ... for the others
// (prepare(), sealed copies: comm/mpi.h, mpiDuplicateOf).

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <mpi.h>

#include "extensions/strategy_extension.h"
#include "gradscope/comm/mpi.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/error.h"

namespace gradscope::agent {
namespace {

class MpiExtension final : public StrategyExtension {
 public:
  using StrategyExtension::StrategyExtension;

  void stop() override {
    StrategyExtension::stop();
    comm::mpiReleaseForcedAlgorithms();
    world_.reset();  // MPI_Finalize is next
  }

 protected:
  bool agreeToStart(const std::string& local_problem, std::string& error) override {
    world_ = comm::mpiWorld();  // MPI is initialised: a copy of MPI_COMM_WORLD
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    // One gather: this rank's problem, whether it runs MPI_THREAD_MULTIPLE, the Open MPI algorithms its
    // settings want forced (the same everywhere, unless the ranks were given different files).
    std::vector<double> mine = {local_problem.empty() ? 0.0 : 1.0, level == MPI_THREAD_MULTIPLE ? 1.0 : 0.0};
    const std::vector<int> wanted = wantedAlgorithms();
    for (int algorithm = 1; algorithm <= kAlgorithms; ++algorithm)
      mine.push_back(std::count(wanted.begin(), wanted.end(), algorithm) != 0 ? 1.0 : 0.0);
    const auto all = world_->allGatherValues(mine);
    const std::size_t stride = mine.size();
    const auto ranks = static_cast<std::size_t>(world_->size());
    // The lowest failing rank says why; the others stay quiet (a bad file would say it N times).
    for (std::size_t r = 0; r < ranks; ++r)
      if (all[r * stride] != 0) {
        error = r == static_cast<std::size_t>(world_->rank()) ? local_problem : std::string();
        return false;
      }
    bool multiple = false;
    std::vector<int> algorithms;
    for (std::size_t r = 0; r < ranks; ++r) multiple = multiple || all[r * stride + 1] != 0;
    for (int algorithm = 1; algorithm <= kAlgorithms; ++algorithm)
      for (std::size_t r = 0; r < ranks; ++r)
        if (all[r * stride + 1 + static_cast<std::size_t>(algorithm)] != 0) {
          algorithms.push_back(algorithm);
          break;
        }
    multiple_ = multiple;
    if (multiple && !algorithms.empty()) {
      try {
        comm::mpiPrepareForcedAlgorithms(*world_, algorithms);
        notePreparedEngines();
      } catch (const std::exception& failure) {
        if (speaksForAll())
          log(fmt::format(
              "Open MPI's algorithms cannot be forced ({}); the sum/mpi.* strategies are left out",
              failure.what()));
      }
    }
    return true;
  }

  bool speaksForAll() const override { return world_ && world_->rank() == 0; }

  bool reserve(std::size_t bytes) override { return arena_.mapHost(bytes); }

  // start() agreed over the world: every rank joins. At MPI_THREAD_MULTIPLE only inside the job's own
  // creation of the communicator (prepare()), and sealed: nothing creates a communicator later.
  std::unique_ptr<comm::Communicator> duplicate(const ShadowCall& call, bool, bool at_creation) override {
    if (multiple_ && !at_creation)
      fail("a communicator not prepared when the job created it, in a job at MPI_THREAD_MULTIPLE");
    // The async strategies' worker needs a copy of its own, made now where nothing may be made later.
    return comm::mpiDuplicateOf(call.comm, /*sealed=*/multiple_, /*concurrent=*/multiple_ && appliesAsync());
  }

  bool preparesAtCreation() const override { return multiple_; }

  bool take(const ShadowCall& call, std::size_t input_bytes, bool want_gather, Capture& capture) override {
    const std::size_t base = Capture::baseBytes(input_bytes, call.count);
    std::byte* slice =
        want_gather ? arena_.take(base + Capture::gatherBytes(call.count, call.comm_size)) : nullptr;
    const bool with_gather = slice != nullptr;
    if (slice == nullptr) slice = arena_.take(base);
    if (slice == nullptr) return false;
    capture = Capture::layout(slice, nullptr, input_bytes, call.count, with_gather);
    return true;
  }

  void give(Capture& capture) override {
    arena_.give(capture.slice);
    capture = {};
  }

  void copyInput(const ShadowCall&, void* dst, const void* src, std::size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }

 private:
  static constexpr int kAlgorithms = 6;  // Open MPI's coll/tuned all-reduce algorithms, 1 to 6

  // The Open MPI algorithms this rank's settings would force: explore's strategies (all of them when
  // none are named), or apply's rules.
  std::vector<int> wantedAlgorithms() const {
    const ExploreSettings& given = settings();
    const std::vector<std::string>& names = given.applying ? given.apply_strategies : given.strategies;
    std::vector<int> algorithms;
    if (!given.applying && names.empty()) {
      for (int algorithm = 1; algorithm <= kAlgorithms; ++algorithm) algorithms.push_back(algorithm);
      return algorithms;
    }
    for (const std::string& text : names)
      if (const auto name = parseStrategyName(text);
          name && name->transport == Transport::Engine && name->engine == Backend::Mpi)
        algorithms.push_back(name->algorithm);
    return algorithms;
  }

  SliceArena arena_;
  std::unique_ptr<comm::Communicator> world_;
  bool multiple_ = false;  // some rank runs MPI_THREAD_MULTIPLE (agreed at start)
};

}  // namespace
}  // namespace gradscope::agent

extern "C" __attribute__((visibility("default"))) gradscope::agent::Extension* gradscope_agent_extension(
    int abi, const gradscope::agent::AgentHooks* hooks) {
  if (abi != gradscope::agent::kExtensionAbi) return nullptr;
  // Never destroyed: job threads may be inside it while the process exits, and its communicators
  // must not be freed after MPI_Finalize.
  return new gradscope::agent::MpiExtension(*hooks);
}
