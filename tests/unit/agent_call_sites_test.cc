// CallSites (agent/core/call_sites.h): the identity of a reduction's call site from step to step.

#include <gtest/gtest.h>

#include "core/call_sites.h"

namespace gradscope::agent {
namespace {

CallSite nextSite(CallSites& sites, std::int64_t marked, std::size_t count, std::uint32_t comm = 0) {
  return sites.next(comm, marked, count, DType::Fp32, ReduceOp::Sum);
}

TEST(AgentCallSites, CountedStepsBeginWhenTheFirstCallComesAgain) {
  CallSites sites;
  for (std::int64_t step = 0; step < 3; ++step)
    for (std::uint32_t ordinal = 0; ordinal < 3; ++ordinal) {
      const CallSite site = nextSite(sites, -1, 100 + ordinal);
      EXPECT_EQ(site.step, step);
      EXPECT_EQ(site.ordinal, ordinal);
      EXPECT_FALSE(site.changed);
      EXPECT_FALSE(site.reshaped);
    }
  // Another communicator counts its own.
  EXPECT_EQ(nextSite(sites, -1, 100, 1).step, 0);
}

TEST(AgentCallSites, MarkedStepsAreTheJobs) {
  CallSites sites;
  EXPECT_EQ(nextSite(sites, 5, 100).ordinal, 0u);
  EXPECT_EQ(nextSite(sites, 5, 100).ordinal, 1u);  // the same size twice in a marked step: two sites
  const CallSite next = nextSite(sites, 6, 100);
  EXPECT_EQ(next.step, 6);
  EXPECT_EQ(next.ordinal, 0u);
}

TEST(AgentCallSites, ASiteThatChangesSizeOrAStepOfAnotherShapeIsSaid) {
  CallSites sites;
  nextSite(sites, 0, 100);
  nextSite(sites, 0, 200);
  nextSite(sites, 1, 100);
  EXPECT_TRUE(nextSite(sites, 1, 300).changed);    // ordinal 1 was 200
  EXPECT_FALSE(nextSite(sites, 2, 100).reshaped);  // steps 0 and 1 both had 2 calls
  nextSite(sites, 2, 300);
  nextSite(sites, 2, 400);                        // step 2 has 3
  EXPECT_TRUE(nextSite(sites, 3, 100).reshaped);  // seen as step 3 begins
  sites.forget(0);
  const CallSite fresh = nextSite(sites, 7, 999);
  EXPECT_FALSE(fresh.changed);
  EXPECT_FALSE(fresh.reshaped);
}

}  // namespace
}  // namespace gradscope::agent
