// What both test mains share (strategies_test_world.h).

#include "strategies_test_world.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace gradscope::comm {
namespace {

// Prints a failed assertion on one line, prefixed with the rank.
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

void reportAsRank(int rank) {
  if (rank == 0) return;
  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new FailurePrinter(rank));
}

}  // namespace gradscope::comm
