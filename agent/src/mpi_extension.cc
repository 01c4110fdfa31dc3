// libgradscope-agent-mpi.so: explore and apply over MPI communicators (extension.h says why this is
// a library of its own, and what the agent guarantees about the order of calls; strategy_extension.h
// holds everything that is not MPI's).
//
// MPI specifics: start() agrees over a duplicate of MPI_COMM_WORLD (every rank calls it right after
// MPI_Init); each job communicator's duplicate is an MPI_Comm_dup of it; the shadow arena is one host
// mapping made at start, touched only as used; the job's buffers are host memory, and every MPI call
// is complete when it returns, so no ordering with the job's work is needed.

#include <algorithm>
#include <cstring>

#include "gradscope/comm/mpi.h"
#include "strategy_extension.h"

namespace gradscope::agent {
namespace {

class MpiExtension final : public StrategyExtension {
 public:
  using StrategyExtension::StrategyExtension;

  void stop() override {
    StrategyExtension::stop();
    world_.reset();  // MPI_Finalize is next
  }

 protected:
  bool agreeToStart(const std::string& local_problem, std::string& error) override {
    world_ = comm::mpiWorld();  // MPI is initialised: a duplicate of MPI_COMM_WORLD
    // The lowest failing rank says why; the others stay quiet (a bad file would say it N times).
    const auto failed = world_->allGatherScalars(local_problem.empty() ? 0.0 : 1.0);
    const auto first = std::find(failed.begin(), failed.end(), 1.0);
    if (first == failed.end()) return true;
    error = first - failed.begin() == world_->rank() ? local_problem : std::string();
    return false;
  }

  bool speaksForAll() const override { return world_ && world_->rank() == 0; }

  bool reserve(std::size_t bytes) override { return arena_.mapHost(bytes); }

  std::unique_ptr<comm::Communicator> duplicate(const ShadowCall& call, bool) override {
    return comm::mpiDuplicateOf(call.comm);  // start() agreed over the world: every rank joins
  }

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
  SliceArena arena_;
  std::unique_ptr<comm::Communicator> world_;
};

}  // namespace
}  // namespace gradscope::agent

extern "C" __attribute__((visibility("default"))) gradscope::agent::Extension* gradscope_agent_extension(
    int abi, void (*log)(const char* line)) {
  if (abi != gradscope::agent::kExtensionAbi) return nullptr;
  // Never destroyed: job threads may be inside it while the process exits, and its communicators
  // must not be freed after MPI_Finalize.
  return new gradscope::agent::MpiExtension(log);
}
