// GoogleTest main for tests that run under mpiexec: initialises MPI through mpiWorld() (so the tests use
// the communicator as the library sets it up), prints the usual report on rank 0 and only failures,
// prefixed with their rank, elsewhere.

#include <memory>

#include <gtest/gtest.h>

#include "gradscope/comm/mpi.h"
#include "strategies_test_world.h"

namespace gradscope::comm {
namespace {

std::unique_ptr<Communicator> world;

}  // namespace

Communicator& testWorld() {
  return *world;
}

}  // namespace gradscope::comm

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  gradscope::comm::world = gradscope::comm::mpiWorld();
  const int rank = gradscope::comm::world->rank();
  gradscope::comm::reportAsRank(rank);
  const int status = RUN_ALL_TESTS();
  gradscope::comm::world.reset();
  return status;
}
