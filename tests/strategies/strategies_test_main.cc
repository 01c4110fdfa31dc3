// GoogleTest main for tests that run under mpiexec: initialises MPI through mpiWorld() (so the tests use
// the communicator as the library sets it up), prints the usual report on rank 0 and only failures,
// prefixed with their rank, elsewhere.

#include <memory>
#include <string_view>

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

// `--threads multiple` (after gtest's own arguments are taken): MPI at MPI_THREAD_MULTIPLE, which the
// async strategies' worker thread needs (async.h); the other tests run as gradscope bench does, single.
int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  auto threads = gradscope::comm::MpiThreads::Single;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string_view(argv[i]) == "--threads")
      threads = gradscope::comm::parseMpiThreads(argv[i + 1]).value_or(threads);
  gradscope::comm::world = gradscope::comm::mpiWorld(threads);
  const int rank = gradscope::comm::world->rank();
  gradscope::comm::reportAsRank(rank);
  const int status = RUN_ALL_TESTS();
  gradscope::comm::world.reset();
  return status;
}
