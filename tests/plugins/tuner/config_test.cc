// The tuner configuration parser and rule index (plugins/nccl-tuner/config.h), linked directly.

#include "config.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/common/error.h"

namespace gradscope::nccl_tuner {
namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string errorOf(std::string_view text, std::string_view source = "t.csv") {
  try {
    parseConfig(text, source);
  } catch (const Error& error) {
    return error.what();
  }
  return "(accepted)";
}

Rule rule(int collective, std::uint64_t min, std::uint64_t max, int algorithm, int protocol, int origin) {
  Rule r;
  r.collective = collective;
  r.min_bytes = min;
  r.max_bytes = max;
  r.algorithm = algorithm;
  r.protocol = protocol;
  r.origin = origin;
  return r;
}

TEST(TunerConfig, ParsesNvidiasExampleFile) {
  // ext-tuner/example/README.md's example configuration, verbatim.
  const Config config = parseConfig(
      "# Single-node, small allreduce: use tree algorithm, registered buffers only\n"
      "allreduce,0,65536,tree,simple,2,1,-1,-1,1\n"
      "\n"
      "# 4-node, 32-rank setup: medium allreduce, single pipeline op, non-registered buffers\n"
      "allreduce,65537,1048576,ring,simple,4,4,32,1,0\n"
      "\n"
      "# Any topology: large allreduce with LL128, multiple pipeline ops, any buffer type\n"
      "allreduce,1048577,4294967295,ring,ll128,-1,-1,-1,4,-1\n"
      "\n"
      "# Single-node broadcast: prefer tree, any pipeOps, registered buffers (backward compatible)\n"
      "broadcast,0,32768,tree,simple,-1,1,-1\n"
      "\n"
      "# Multi-node broadcast: optimized for non-registered buffers, single pipeline op\n"
      "broadcast,32769,4294967295,ring,simple,2,-1,-1,1,0\n",
      "nccl_tuner.conf");
  EXPECT_EQ(config.format, ConfigFormat::Csv);
  ASSERT_EQ(config.rules.size(), 5u);
  Rule first = rule(4, 0, 65536, 0, 2, 2);
  first.channels = 2;
  first.nodes = 1;
  first.reg_buff = 1;
  EXPECT_EQ(config.rules[0], first);
  Rule second = rule(4, 65537, 1048576, 1, 2, 5);
  second.channels = 4;
  second.nodes = 4;
  second.ranks = 32;
  second.pipe_ops = 1;
  second.reg_buff = 0;
  EXPECT_EQ(config.rules[1], second);
  Rule third = rule(4, 1048577, 4294967295u, 1, 1, 8);
  third.pipe_ops = 4;
  EXPECT_EQ(config.rules[2], third);
  Rule fourth = rule(0, 0, 32768, 0, 2, 11);
  fourth.nodes = 1;
  EXPECT_EQ(config.rules[3], fourth);
  EXPECT_EQ(config.rules[4].origin, 14);
}

TEST(TunerConfig, AcceptsCaseSpacesCrlfBomAndNcclSpellings) {
  const Config config = parseConfig(
      "\xef\xbb\xbf  # exported on Windows\r\n"
      " AllReduce , 0 , -1 , CollNetDirect , LL128 , -1 , -1 , -1 \r\n"
      "\tallgather,-1,100,nvls_tree,Simple,-1,-1,-1\r\n"
      "reducescatter,1,1,NVLSTree,ll,-1,-1,-1",
      "t.csv");
  ASSERT_EQ(config.rules.size(), 3u);
  EXPECT_EQ(config.rules[0], rule(4, 0, UINT64_MAX, 2, 1, 2));
  EXPECT_EQ(config.rules[1], rule(2, 0, 100, 5, 2, 3)) << "-1 as min_bytes is 0";
  EXPECT_EQ(config.rules[2], rule(3, 1, 1, 5, 0, 4)) << "last line without newline";
}

TEST(TunerConfig, CommentOnlyFileHasNoRules) {
  EXPECT_TRUE(parseConfig("# nothing\n\n#\n", "t.csv").rules.empty());
}

TEST(TunerConfig, MessagesNameFileAndLine) {
  EXPECT_EQ(errorOf("# a\n\nallreduce,0,-1,ring,bogus,-1,-1,-1\n"),
            "t.csv:3: unknown protocol 'bogus' (use ll, ll128, simple)");
  EXPECT_EQ(errorOf("allreduce,0,-1,ring,simple,-1,-1,-1,0\n"),
            "t.csv:1: numPipeOps '0' is not -1 or an integer from 1 to 2147483647 (-1 means any number of "
            "operations)");
  EXPECT_EQ(errorOf("allreduce,0,-1,ring,simple,+4,-1,-1\n"),
            "t.csv:1: channels '+4' is not -1 or an integer from 1 to 2147483647 (-1 means NCCL's own "
            "channel count)");
  EXPECT_EQ(errorOf("allreduce,0,-1,ring,simple,-1,-1,-1\x7f\n"),
            "t.csv:1: control character 0x7f (a tuner file is plain text)");
  EXPECT_EQ(errorOf("allreduce,0,-1,-1,simple,-1,-1,-1\n"),
            "t.csv:1: unknown algorithm '-1' (use tree, ring, collnet_direct, collnet_chain, nvls, "
            "nvls_tree, pat)");
  EXPECT_EQ(errorOf(""),
            "t.csv: empty file (write one rule per line: collective,min_bytes,max_bytes,algorithm,"
            "protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]])");
  // Escaped and shortened in messages.
  EXPECT_EQ(errorOf("\tal\x01\n"), "t.csv:1: control character 0x01 (a tuner file is plain text)");
  EXPECT_EQ(errorOf(std::string(50, 'z') + ",0,-1,ring,simple,-1,-1,-1\n"),
            "t.csv:1: unknown collective '" + std::string(40, 'z') +
                "...' (use broadcast, reduce, allgather, reducescatter, allreduce)");
  // Overlong UTF-8 and surrogates are not UTF-8.
  EXPECT_EQ(errorOf("#\xc0\xaf\n"),
            "t.csv:1: byte 0xc0 at offset 1 is not UTF-8 (save the file as UTF-8 text)");
  EXPECT_EQ(errorOf("#\xed\xa0\x80\n"),
            "t.csv:1: byte 0xed at offset 1 is not UTF-8 (save the file as UTF-8 text)");
  EXPECT_EQ(errorOf("# caf\xc3\xa9 ok\n"), "(accepted)");
}

TEST(TunerConfig, RefusesTooManyRules) {
  std::string text;
  for (std::size_t i = 0; i <= kMaxRules; ++i)
    text += "allreduce," + std::to_string(i) + "," + std::to_string(i) + ",ring,ll,-1,-1,-1\n";
  EXPECT_EQ(errorOf(text), "t.csv:10001: more than 10000 rules (merge rules with byte ranges)");
}

TEST(TunerConfig, RefusesRulesThatOverlapTooMuchToIndex) {
  // 2000 rules [i, 2^40] with distinct numPipeOps: segment i holds i rules, ~2 million entries, and placing
  // them compares each with those already there (the step bound comes first).
  std::string text;
  for (int i = 1; i <= 2000; ++i)
    text += "allreduce," + std::to_string(i) + ",1099511627776,ring,ll,-1,-1,-1," + std::to_string(i) + "\n";
  EXPECT_EQ(errorOf(text),
            "t.csv: too many overlapping rules to index (more than 16777216 steps; merge rules)");
}

// The index against the definition of first-match-wins, on random rule sets with many wildcards.
TEST(TunerConfig, IndexAgreesWithFirstMatchOnRandomRules) {
  std::mt19937_64 random(20240501);
  const auto pick = [&](std::initializer_list<int> values) {
    return *(values.begin() + static_cast<std::ptrdiff_t>(random() % values.size()));
  };
  for (int round = 0; round < 200; ++round) {
    std::vector<Rule> rules;
    const int count = 1 + static_cast<int>(random() % 40);
    for (int i = 0; i < count; ++i) {
      Rule r;
      r.collective = static_cast<int>(random() % kCollectiveCount);
      const std::uint64_t a = random() % 64, b = random() % 64;
      r.min_bytes = std::min(a, b);
      r.max_bytes = random() % 8 == 0 ? UINT64_MAX : std::max(a, b);
      r.algorithm = static_cast<int>(random() % 7);
      r.protocol = static_cast<int>(random() % 3);
      r.nodes = pick({kAny, kAny, 1, 2});
      r.ranks = pick({kAny, kAny, 8, 16});
      r.pipe_ops = pick({kAny, kAny, 1, 2, 3});
      r.reg_buff = pick({kAny, kAny, 0, 1});
      r.origin = i + 1;
      rules.push_back(r);
    }
    for (const Topology topology : {Topology{1, 8}, Topology{2, 16}, Topology{3, 8}}) {
      const RuleIndex index = RuleIndex::build(rules, topology);
      for (int coll = 0; coll < kCollectiveCount; ++coll)
        for (std::uint64_t bytes : {0ull, 1ull, 5ull, 17ull, 31ull, 32ull, 63ull, 64ull, 1000ull, ~0ull})
          for (int pipe_ops : {1, 2, 3, 4})
            for (int reg_buff : {0, 1}) {
              long want = -1;
              for (std::size_t i = 0; i < rules.size() && want < 0; ++i) {
                const Rule& r = rules[i];
                if (r.collective == coll && r.min_bytes <= bytes && bytes <= r.max_bytes &&
                    (r.nodes == kAny || static_cast<std::uint64_t>(r.nodes) == topology.nodes) &&
                    (r.ranks == kAny || static_cast<std::uint64_t>(r.ranks) == topology.ranks) &&
                    (r.pipe_ops == kAny || r.pipe_ops == pipe_ops) &&
                    (r.reg_buff == kAny || r.reg_buff == reg_buff))
                  want = static_cast<long>(i);
              }
              const RuleIndex::Entry* got = index.find(coll, bytes, pipe_ops, reg_buff);
              ASSERT_EQ(got == nullptr ? -1 : static_cast<long>(got->rule), want)
                  << "round " << round << " coll " << coll << " bytes " << bytes << " pipe " << pipe_ops
                  << " reg " << reg_buff;
              if (got != nullptr) {
                EXPECT_EQ(got->algorithm, rules[got->rule].algorithm);
                EXPECT_EQ(got->protocol, rules[got->rule].protocol);
              }
            }
    }
  }
}

TEST(TunerConfig, IndexDropsShadowedRules) {
  std::vector<Rule> rules = {rule(4, 0, UINT64_MAX, 1, 2, 1), rule(4, 0, 100, 0, 0, 2),
                             rule(4, 5, 5, 0, 1, 3)};
  const RuleIndex index = RuleIndex::build(rules, Topology{1, 8});
  // Segments [0,5), [5,6), [6,101), [101,max]: the wildcard rule closes each, the others are never listed.
  EXPECT_EQ(index.entryCount(), 4u);
  EXPECT_EQ(index.ruleCount(), 3u);
}

// ---- the exporters' output (issue 7: "the exported NCCL tuner CSV parsed back") -------------------------

TEST(TunerConfig, ParsesGradscopeRecommendNcclTunerExport) {
  const std::string path = GRADSCOPE_TEST_DATA_DIR "/recommend_nccl_nccl-tuner.txt";
  const Config config = parseConfig(readFile(path), path);
  ASSERT_EQ(config.rules.size(), 2u);
  Rule first = rule(4, 4096, 65536, 0, 0, 4);
  first.ranks = 4;
  EXPECT_EQ(config.rules[0], first);
  Rule second = rule(4, 4194304, 67108864, 1, 2, 5);
  second.ranks = 4;
  EXPECT_EQ(config.rules[1], second);
}

TEST(TunerConfig, ParsesGradscopeRecommendExportWithoutNcclRules) {
  const std::string path = GRADSCOPE_TEST_DATA_DIR "/recommend_mpi_nccl-tuner.txt";
  EXPECT_TRUE(parseConfig(readFile(path), path).rules.empty());
}

TEST(TunerConfig, EveryNcclTunerGoldenFileParses) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(GRADSCOPE_TEST_DATA_DIR)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with("_nccl-tuner.txt")) continue;
    ++files;
    EXPECT_NO_THROW(parseConfig(readFile(entry.path().string()), name)) << name;
  }
  EXPECT_GE(files, 2);
}

// ---- recommendation files -------------------------------------------------------------------------------

std::string recommendation(const std::string& rules, const std::string& extra = "") {
  return R"({"format": "gradscope-recommendation", "version": 1, "backend": "nccl", "max_rel_error": 0.01,)" +
         extra + R"( "rules": [)" + rules + "]}";
}

std::string ruleJson(const std::string& dtype, int min, int max, const std::string& strategy,
                     const std::string& world_size = "", const std::string& error_class = "lossless") {
  return R"({"api": "ncclAllReduce", "dtype": ")" + dtype + R"(", "min_bytes": )" + std::to_string(min) +
         R"(, "max_bytes": )" + std::to_string(max) +
         (world_size.empty() ? "" : ", \"world_size\": " + world_size) + R"(, "strategy": ")" + strategy +
         R"(", "error_class": ")" + error_class + R"("})";
}

TEST(TunerConfig, RecommendationGoldenMatchesItsCsvExport) {
  const std::string json_path = GRADSCOPE_TEST_DATA_DIR "/recommend_nccl_json.json";
  const std::string csv_path = GRADSCOPE_TEST_DATA_DIR "/recommend_nccl_nccl-tuner.txt";
  const Config json = parseConfig(readFile(json_path), json_path);
  const Config csv = parseConfig(readFile(csv_path), csv_path);
  EXPECT_EQ(json.format, ConfigFormat::Recommendation);
  ASSERT_EQ(json.rules.size(), csv.rules.size());
  for (std::size_t i = 0; i < json.rules.size(); ++i) {
    Rule from_json = json.rules[i];
    from_json.origin = csv.rules[i].origin;
    EXPECT_EQ(from_json, csv.rules[i]) << i;
  }
}

TEST(TunerConfig, RecommendationKeepsNcclRulesSkipsOthersAndOrdersSpecificSizesFirst) {
  const Config config =
      parseConfig(recommendation(ruleJson("fp32", 0, 100, "sum/native") + "," +
                                 ruleJson("fp32", 101, 200, "sum/nccl.tree.ll128") + "," +
                                 ruleJson("fp32", 101, 200, "sum/nccl.ring.simple/native", "8") + "," +
                                 ruleJson("fp32", 300, 400, "sum/rs_ag/bf16", "", "lossy") + "," +
                                 ruleJson("fp16", 300, 400, "sum/nccl.collnetdirect.ll", "8")),
                  "plan.json");
  EXPECT_EQ(config.format, ConfigFormat::Recommendation);
  EXPECT_EQ(config.skipped_rules, 2u);
  ASSERT_EQ(config.rules.size(), 3u);
  Rule ring = rule(4, 101, 200, 1, 2, 3);
  ring.ranks = 8;
  Rule collnet = rule(4, 300, 400, 2, 0, 5);
  collnet.ranks = 8;
  EXPECT_EQ(config.rules[0], ring);
  EXPECT_EQ(config.rules[1], collnet);
  EXPECT_EQ(config.rules[2], rule(4, 101, 200, 0, 1, 2)) << "any world size last";
}

TEST(TunerConfig, RecommendationRulesDifferingOnlyInDtypeMustAgree) {
  EXPECT_EQ(errorOf(recommendation(ruleJson("fp32", 0, 1000, "sum/nccl.tree.ll") + "," +
                                   ruleJson("fp16", 500, 2000, "sum/nccl.ring.ll")),
                    "plan.json"),
            "plan.json: rules 1 and 2 (fp32 and fp16) ask NCCL for different algorithms from 500 bytes on "
            "(NCCL's tuner "
            "does not see the dtype; keep one of them, or apply them with the agent)");
  EXPECT_EQ(errorOf(recommendation(ruleJson("fp32", 0, 1000, "sum/nccl.tree.ll") + "," +
                                   ruleJson("fp16", 500, 2000, "sum/nccl.tree.ll")),
                    "plan.json"),
            "(accepted)");
  EXPECT_EQ(errorOf(recommendation(ruleJson("fp32", 0, 1000, "sum/nccl.tree.ll", "4") + "," +
                                   ruleJson("fp16", 500, 2000, "sum/nccl.ring.ll", "8")),
                    "plan.json"),
            "(accepted)")
      << "different world sizes never meet";
}

TEST(TunerConfig, RecommendationWithUnknownNcclEngineIsRefused) {
  EXPECT_EQ(
      errorOf(recommendation(ruleJson("fp32", 0, 1000, "sum/nccl.star.ll")), "plan.json"),
      "plan.json: rule 1: strategy sum/nccl.star.ll names no NCCL algorithm and protocol (use "
      "sum/nccl.<tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat>.<ll, ll128, simple>)");
}

TEST(TunerConfig, InvalidRecommendationKeepsTheReadersMessage) {
  EXPECT_EQ(
      errorOf(R"({"format": "something else"})", "plan.json"),
      "plan.json: not a gradscope recommendation file: format is the string \"something else\" (expected "
      "\"format\": \"gradscope-recommendation\"; pass the file gradscope recommend --format json wrote)");
}

TEST(TunerConfig, EnvironmentChoosesGradscopesVariableFirst) {
  unsetenv("GRADSCOPE_TUNER_CONFIG");
  unsetenv("NCCL_TUNER_CONFIG_FILE");
  EXPECT_FALSE(configSourceFromEnvironment().has_value());
  setenv("NCCL_TUNER_CONFIG_FILE", "/nvidia.conf", 1);
  setenv("GRADSCOPE_TUNER_CONFIG", "", 1);
  EXPECT_EQ(configSourceFromEnvironment()->path, "/nvidia.conf");
  setenv("GRADSCOPE_TUNER_CONFIG", "/ours.json", 1);
  EXPECT_EQ(configSourceFromEnvironment()->path, "/ours.json");
  EXPECT_EQ(configSourceFromEnvironment()->variable, "GRADSCOPE_TUNER_CONFIG");
  unsetenv("GRADSCOPE_TUNER_CONFIG");
  unsetenv("NCCL_TUNER_CONFIG_FILE");
}

TEST(TunerConfig, LoadRefusesOversizedFiles) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("gradscope-tuner-big-" + std::to_string(getpid()))).string();
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string(kMaxConfigBytes + 1, '#');
  }
  try {
    loadConfig(path);
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              path + ": 16777217 bytes, more than 16777216 (a tuner file is small)");
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace gradscope::nccl_tuner
