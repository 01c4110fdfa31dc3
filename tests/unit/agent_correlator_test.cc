// The background thread's bounded join (agent/core/correlator.h), on its own.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/correlator.h"

namespace gradscope::agent {
namespace {

using Join = BoundedCorrelator<CommSeq, std::string, int, CommSeqHash>;

// What a join did: each match as "call:report", each lost report.
struct Outcome {
  std::vector<std::string> matched;
  std::vector<int> lost;

  auto match() {
    return
        [this](std::string& call, int&& report) { matched.push_back(call + ":" + std::to_string(report)); };
  }
  auto lose() {
    return [this](int&& report) { lost.push_back(report); };
  }
};

TEST(AgentCorrelator, MatchesWhicheverSideComesFirst) {
  Join calls_first(8, DropKind::NcclProfile), reports_first(8, DropKind::NcclProfile);
  Outcome a, b;
  calls_first.addCall({1, 10}, "c10", a.match());
  calls_first.addCall({1, 11}, "c11", a.match());
  calls_first.addReport({1, 11}, 111, a.match(), a.lose());
  calls_first.addReport({1, 10}, 110, a.match(), a.lose());
  reports_first.addReport({1, 11}, 111, b.match(), b.lose());
  reports_first.addReport({1, 10}, 110, b.match(), b.lose());
  reports_first.addCall({1, 10}, "c10", b.match());
  reports_first.addCall({1, 11}, "c11", b.match());
  std::sort(a.matched.begin(), a.matched.end());
  std::sort(b.matched.begin(), b.matched.end());
  EXPECT_EQ(a.matched, (std::vector<std::string>{"c10:110", "c11:111"}));
  EXPECT_EQ(a.matched, b.matched);
  EXPECT_TRUE(a.lost.empty() && b.lost.empty());
  EXPECT_EQ(calls_first.waitingReports() + reports_first.waitingReports(), 0u);
  EXPECT_EQ(calls_first.takeDropped() + reports_first.takeDropped(), 0);
}

// A call stays after it matched (a captured call gets a report per replay), and reports that waited for
// it are matched in the order they came.
TEST(AgentCorrelator, ACallMatchesEveryReportInArrivalOrder) {
  Join join(8, DropKind::GraphReplay);
  Outcome out;
  join.addReport({0, 5}, 1, out.match(), out.lose());
  join.addReport({0, 6}, 9, out.match(), out.lose());
  join.addReport({0, 5}, 2, out.match(), out.lose());
  join.addCall({0, 5}, "c", out.match());
  join.addReport({0, 5}, 3, out.match(), out.lose());
  EXPECT_EQ(out.matched, (std::vector<std::string>{"c:1", "c:2", "c:3"}));
  EXPECT_EQ(join.waitingReports(), 1u);  // {0, 6}
  EXPECT_EQ(join.knownCalls(), 1u);
}

// Reports of a call about to be written are taken without remembering the call.
TEST(AgentCorrelator, TakeReportsConsumesThemOnce) {
  Join join(8, DropKind::NcclProfile);
  Outcome out;
  join.addReport({2, 1}, 7, out.match(), out.lose());
  std::vector<int> taken;
  join.takeReports({2, 1}, [&](int&& report) { taken.push_back(report); });
  join.takeReports({2, 1}, [&](int&& report) { taken.push_back(report); });
  EXPECT_EQ(taken, (std::vector<int>{7}));
  EXPECT_EQ(join.waitingReports(), 0u);
  EXPECT_EQ(join.knownCalls(), 0u);
  // The call was not remembered: a later report waits.
  join.addReport({2, 1}, 8, out.match(), out.lose());
  EXPECT_EQ(join.waitingReports(), 1u);
  EXPECT_TRUE(out.matched.empty());
}

// The bound: a report is lost once `bound` newer reports waited, and counted as the join's kind; a call
// is forgotten once `bound` newer calls came, which by itself costs nothing.
TEST(AgentCorrelator, BoundEvictsTheOldestAndCountsLostReports) {
  Join join(3, DropKind::ExploreLink);
  EXPECT_EQ(join.kind(), DropKind::ExploreLink);
  EXPECT_EQ(join.bound(), 3u);
  Outcome out;
  for (int i = 0; i < 5; ++i) join.addReport({0, i}, i, out.match(), out.lose());
  EXPECT_EQ(out.lost, (std::vector<int>{0, 1}));
  EXPECT_EQ(join.waitingReports(), 3u);
  EXPECT_EQ(join.takeDropped(), 2);
  EXPECT_EQ(join.takeDropped(), 0);  // taken

  // A matched report leaves the window with the others: it is not lost again.
  join.addCall({0, 2}, "c2", out.match());
  EXPECT_EQ(out.matched, (std::vector<std::string>{"c2:2"}));
  for (int i = 10; i < 13; ++i) join.addReport({1, i}, i, out.match(), out.lose());
  EXPECT_EQ(out.lost, (std::vector<int>{0, 1, 3, 4}));
  EXPECT_EQ(join.takeDropped(), 2);

  for (int i = 0; i < 5; ++i) join.addCall({2, i}, "d" + std::to_string(i), out.match());
  EXPECT_EQ(join.knownCalls(), 3u);
  join.addReport({2, 0}, 20, out.match(), out.lose());  // its call was forgotten: waits
  join.addReport({2, 4}, 24, out.match(), out.lose());
  EXPECT_EQ(out.matched.back(), "d4:24");
  EXPECT_EQ(join.takeDropped(), 1);  // {1, 10} pushed out by {2, 0}
}

// A call added again replaces the earlier one, and the earlier one's eviction does not take it along.
TEST(AgentCorrelator, ACallAddedAgainStaysUntilItsOwnTurn) {
  Join join(2, DropKind::NcclProfile);
  Outcome out;
  join.addCall({0, 1}, "old", out.match());
  join.addCall({0, 1}, "new", out.match());
  join.addCall({0, 2}, "other", out.match());  // pushes out the first {0, 1} entry only
  join.addReport({0, 1}, 5, out.match(), out.lose());
  EXPECT_EQ(out.matched, (std::vector<std::string>{"new:5"}));
}

TEST(AgentCorrelator, DrainLosesEveryWaitingReport) {
  Join join(8, DropKind::GraphReplay);
  Outcome out;
  join.addReport({0, 1}, 1, out.match(), out.lose());
  join.addReport({0, 2}, 2, out.match(), out.lose());
  join.addCall({0, 2}, "c", out.match());
  join.drain(out.lose());
  EXPECT_EQ(out.lost, (std::vector<int>{1}));
  EXPECT_EQ(join.waitingReports(), 0u);
  EXPECT_EQ(join.takeDropped(), 1);
  // Usable afterwards, and the calls are still known.
  join.addReport({0, 2}, 3, out.match(), out.lose());
  EXPECT_EQ(out.matched, (std::vector<std::string>{"c:2", "c:3"}));
}

// Whatever the order the two sides interleave in, the same pairs are matched, as long as nothing waits
// beyond the bound.
TEST(AgentCorrelator, OrderIndependence) {
  constexpr int kCalls = 20;
  std::vector<std::pair<bool, int>> arrivals;  // (is a call, seq)
  for (int i = 0; i < kCalls; ++i) {
    arrivals.emplace_back(true, i);
    arrivals.emplace_back(false, i);
  }
  std::vector<std::string> expected;
  for (int i = 0; i < kCalls; ++i) expected.push_back("c" + std::to_string(i) + ":" + std::to_string(i));
  std::sort(expected.begin(), expected.end());
  unsigned state = 12345;
  for (int round = 0; round < 50; ++round) {
    for (std::size_t i = arrivals.size() - 1; i > 0; --i) {
      state = state * 1103515245u + 12345u;
      std::swap(arrivals[i], arrivals[(state >> 8) % (i + 1)]);
    }
    Join join(2 * kCalls, DropKind::NcclProfile);
    Outcome out;
    for (const auto& [is_call, seq] : arrivals) {
      if (is_call) join.addCall({0, seq}, "c" + std::to_string(seq), out.match());
      else join.addReport({0, seq}, seq, out.match(), out.lose());
    }
    std::sort(out.matched.begin(), out.matched.end());
    EXPECT_EQ(out.matched, expected) << "round " << round;
    EXPECT_TRUE(out.lost.empty());
    EXPECT_EQ(join.waitingReports(), 0u);
  }
}

}  // namespace
}  // namespace gradscope::agent
