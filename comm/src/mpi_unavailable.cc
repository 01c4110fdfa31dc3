// The MPI backend of a build without MPI: every entry point says so.

#include "gradscope/comm/mpi.h"
#include "gradscope/common/error.h"

namespace gradscope::comm {
namespace {

constexpr const char* kReason =
    "this build has no MPI backend (no MPI found at configure time; GRADSCOPE_WITH_MPI)";

}  // namespace

bool mpiBuilt(std::string* reason) {
  if (reason != nullptr) *reason = kReason;
  return false;
}

std::unique_ptr<Communicator> mpiWorld(MpiThreads) {
  fail("MPI: {}", kReason);
}

std::unique_ptr<Communicator> mpiDuplicateOf(const void*, bool, bool) {
  fail("MPI: {}", kReason);
}

void mpiPrepareForcedAlgorithms(Communicator&, std::span<const int>) {
  fail("MPI: {}", kReason);
}

void mpiReleaseForcedAlgorithms() {}

}  // namespace gradscope::comm
