// Replays the fuzz target's seed corpus (tests/fuzz/nccl_tuner_config/corpus) through the parser in every
// build, with or without clang: every file is accepted or refused with a gradscope::Error, nothing else.

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "config.h"
#include "gradscope/common/error.h"

namespace gradscope::nccl_tuner {
namespace {

TEST(FuzzCorpus, EveryFileIsAcceptedOrRefusedCleanly) {
  int files = 0, accepted = 0;
  for (const auto& entry : std::filesystem::directory_iterator(GRADSCOPE_TUNER_CORPUS_DIR)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    ++files;
    try {
      const Config config = parseConfig(text.str(), entry.path().filename().string());
      const RuleIndex index = RuleIndex::build(config.rules, Topology{1, 8});
      for (int collective = 0; collective < kCollectiveCount; ++collective)
        index.find(collective, 4096, 1, 0);
      ++accepted;
    } catch (const Error& error) {
      EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << "one line: " << error.what();
    }
  }
  EXPECT_GE(files, 10);
  EXPECT_GE(accepted, 3);
}

}  // namespace
}  // namespace gradscope::nccl_tuner
