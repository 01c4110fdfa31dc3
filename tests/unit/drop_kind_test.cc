// The kinds of the trace's `drops` table (common/drop_kind.h): their stored names never change, and
// docs/agent.md lists every one.

#include "gradscope/common/drop_kind.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/storage/drops.h"
#include "test_util.h"

namespace gradscope {
namespace {

TEST(DropKinds, StoredNamesNeverChange) {
  const std::vector<std::string_view> stored = {
      "call",          "call_rate",        "thread_buffer",     "comm_table",
      "gpu_timing",    "iallreduce_table", "stream_table",      "group_table",
      "cupti_record",  "explore_result",   "explore_link",      "nccl_profile",
      "graph_capture", "graph_replay",     "recording_stopped", "gpu_kernel"};
  ASSERT_EQ(stored.size(), kDropKinds);
  for (std::size_t i = 0; i < kDropKinds; ++i) {
    const auto kind = static_cast<DropKind>(i);
    EXPECT_EQ(name(kind), stored[i]);
    EXPECT_EQ(parseDropKind(stored[i]), kind);
    EXPECT_FALSE(meaning(kind).empty());
    // What the report and the viewer say is the kind's own.
    EXPECT_EQ(storage::dropMeaning(std::string(stored[i])), meaning(kind));
    EXPECT_EQ(storage::dropLosesCalls(std::string(stored[i])), losesCalls(kind));
  }
  EXPECT_EQ(parseDropKind("nccl_profile_pool"), std::nullopt);
  EXPECT_FALSE(storage::dropLosesCalls("nccl_profile_pool"));
  EXPECT_NE(storage::dropMeaning("nccl_profile_pool").find("profiler plugin"), std::string::npos);
}

TEST(DropKinds, AgentPageListsEveryKind) {
  std::ifstream file(GRADSCOPE_SOURCE_DIR "/docs/agent.md");
  ASSERT_TRUE(file) << "docs/agent.md is missing";
  std::stringstream text;
  text << file.rdbuf();
  // Rows of the drop kinds' table: | `name` | ... | (other tables of the page name variables in capitals)
  const std::set<std::string> documented = test::documentedNames(text.str());
  std::set<std::string> kinds;
  for (std::size_t i = 0; i < kDropKinds; ++i) kinds.emplace(name(static_cast<DropKind>(i)));
  EXPECT_EQ(documented, kinds);
}

}  // namespace
}  // namespace gradscope
