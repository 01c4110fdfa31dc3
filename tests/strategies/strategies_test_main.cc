// GoogleTest main for tests that run under mpiexec: initialises MPI through mpiWorld() (so the tests use
// the communicator as the library sets it up), prints the usual report on rank 0 and only failures,
// prefixed with their rank, elsewhere.

#include <memory>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gradscope/comm/mpi.h"
#include "strategies_test_world.h"

namespace gradscope::comm {
namespace {

std::unique_ptr<Communicator> world;

class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (result.failed())
      fmt::print(stderr, "[rank {}] {}:{}: {}\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }

 private:
  int rank_;
};

}  // namespace

Communicator& testWorld() {
  return *world;
}

}  // namespace gradscope::comm

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  gradscope::comm::world = gradscope::comm::mpiWorld();
  const int rank = gradscope::comm::world->rank();
  if (rank != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new gradscope::comm::FailurePrinter(rank));
  }
  const int status = RUN_ALL_TESTS();
  gradscope::comm::world.reset();
  return status;
}
