// libnccl-tuner-gradscope.so loaded with dlopen and called the way NCCL 2.28 calls it (src/plugin/tuner.cc,
// src/enqueue.cc): init per communicator, getCollInfo with a real float[7][3] cost table cast to float**
// and *nChannels = 0, finalize. Every check compares the whole table (and guard cells around it) with
// what it must be: only the intended entry lowered to 0, or nothing.

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope_tuner.h"
#include "nccl_abi/tuner.h"

namespace gradscope::nccl_tuner {
namespace {

using namespace nccl_abi;

constexpr int kAlgos = NCCL_NUM_ALGORITHMS_V5;
constexpr int kProtos = NCCL_NUM_PROTOCOLS_V5;

struct Plugin {
  const ncclTuner_v5_t* v5 = nullptr;
  const ncclTuner_v4_t* v4 = nullptr;
  const ncclTuner_v3_t* v3 = nullptr;
  gradscope_tuner_explore_v1_t explore = nullptr;
  gradscope_tuner_last_choice_v1_t last_choice = nullptr;
};

const Plugin& plugin() {
  static const Plugin loaded = [] {
    void* handle = dlopen(GRADSCOPE_TUNER_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      ADD_FAILURE() << dlerror();
      return Plugin{};
    }
    Plugin p;
    p.v5 = static_cast<const ncclTuner_v5_t*>(dlsym(handle, "ncclTunerPlugin_v5"));
    p.v4 = static_cast<const ncclTuner_v4_t*>(dlsym(handle, "ncclTunerPlugin_v4"));
    p.v3 = static_cast<const ncclTuner_v3_t*>(dlsym(handle, "ncclTunerPlugin_v3"));
    p.explore = reinterpret_cast<gradscope_tuner_explore_v1_t>(dlsym(handle, "gradscope_tuner_explore_v1"));
    p.last_choice =
        reinterpret_cast<gradscope_tuner_last_choice_v1_t>(dlsym(handle, "gradscope_tuner_last_choice_v1"));
    return p;
  }();
  return loaded;
}

// The test logger NCCL's ncclDebugLogger_t stands for: records (level, message).
std::mutex logMutex;
std::vector<std::pair<int, std::string>> logLines;

void testLogger(ncclDebugLogLevel level, unsigned long flags, const char* /*file*/, int /*line*/,
                const char* fmt, ...) {
  EXPECT_EQ(flags & NCCL_TUNING, NCCL_TUNING);
  char buffer[4096];
  va_list args;
  va_start(args, fmt);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"  // NCCL's format, forwarded as NCCL's logger would
  std::vsnprintf(buffer, sizeof buffer, fmt, args);
#pragma GCC diagnostic pop
  va_end(args);
  std::lock_guard lock(logMutex);
  logLines.emplace_back(static_cast<int>(level), buffer);
}

std::vector<std::string> logged(ncclDebugLogLevel level) {
  std::lock_guard lock(logMutex);
  std::vector<std::string> out;
  for (const auto& [l, text] : logLines)
    if (l == level) out.push_back(text);
  return out;
}

// A float[7][3] cost table with 4 guard cells on each side. Usable: Tree and Ring with every protocol,
// NVLS and PAT with Simple only; CollNet and NVLS_Tree unusable.
struct CostTable {
  static constexpr float kGuard = 777.0f;
  static constexpr std::array<std::array<float, kProtos>, kAlgos> kInitial = {{{10.0f, 20.0f, 30.0f},
                                                                               {11.0f, 21.0f, 31.0f},
                                                                               {-1.0f, -1.0f, -1.0f},
                                                                               {-1.0f, -1.0f, -1.0f},
                                                                               {-1.0f, -1.0f, 40.0f},
                                                                               {-1.0f, -1.0f, -1.0f},
                                                                               {-1.0f, -1.0f, 50.0f}}};
  std::array<float, 4 + kAlgos * kProtos + 4> cells{};

  CostTable() {
    cells.fill(kGuard);
    for (int a = 0; a < kAlgos; ++a)
      for (int p = 0; p < kProtos; ++p)
        at(a, p) = kInitial[static_cast<std::size_t>(a)][static_cast<std::size_t>(p)];
  }
  float& at(int a, int p) { return cells[static_cast<std::size_t>(4 + a * kProtos + p)]; }
  // What NCCL passes: the address of float[numAlgo][numProto], cast to float**.
  float** table() { return reinterpret_cast<float**>(&cells[4]); }

  // Empty `changed`: the table must be exactly as NCCL filled it.
  void expectOnly(std::optional<std::pair<int, int>> changed) {
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(cells[i], kGuard) << "wrote before the table";
      EXPECT_EQ(cells[cells.size() - 1 - i], kGuard) << "wrote after the table";
    }
    for (int a = 0; a < kAlgos; ++a)
      for (int p = 0; p < kProtos; ++p) {
        const float want = changed && changed->first == a && changed->second == p
                               ? 0.0f
                               : kInitial[static_cast<std::size_t>(a)][static_cast<std::size_t>(p)];
        EXPECT_EQ(at(a, p), want) << "entry [" << a << "][" << p << "]";
      }
  }
  // The one entry lowered to 0, if exactly one was; otherwise nullopt.
  std::optional<std::pair<int, int>> chosen() {
    std::optional<std::pair<int, int>> found;
    int count = 0;
    for (int a = 0; a < kAlgos; ++a)
      for (int p = 0; p < kProtos; ++p)
        if (at(a, p) != kInitial[static_cast<std::size_t>(a)][static_cast<std::size_t>(p)]) {
          found = std::pair{a, p};
          ++count;
        }
    return count == 1 ? found : std::nullopt;
  }
};

struct CallResult {
  std::optional<std::pair<int, int>> chosen;
  int channels = 0;
};

class TunerPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(plugin().v5, nullptr);
    for (const char* variable : {"GRADSCOPE_TUNER_CONFIG", "NCCL_TUNER_CONFIG_FILE",
                                 "GRADSCOPE_TUNER_EXPLORE", "GRADSCOPE_TUNER_EXPLORE_REPEATS"})
      unsetenv(variable);
    std::lock_guard lock(logMutex);
    logLines.clear();
    // A parameterised test's name holds a '/' ("IsRefusedWholeWithOneWarning/BadNumber"): one directory,
    // so that TearDown removes all that SetUp made.
    std::string test_name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(test_name.begin(), test_name.end(), '/', '-');
    directory_ = std::filesystem::temp_directory_path() /
                 ("gradscope-tuner-test-" + std::to_string(getpid()) + "-" + test_name);
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override {
    finalizeAll();
    std::filesystem::remove_all(directory_);
  }

  void finalizeAll() {
    for (void* ctx : contexts_) EXPECT_EQ(plugin().v5->finalize(ctx), ncclSuccess);
    contexts_.clear();
  }

  std::string writeFile(const std::string& name, const std::string& text) {
    const std::string path = (directory_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string useConfig(const std::string& text, const std::string& name = "tuner.conf") {
    const std::string path = writeFile(name, text);
    setenv("GRADSCOPE_TUNER_CONFIG", path.c_str(), 1);
    return path;
  }

  void* init(std::uint64_t comm_id = 1, std::size_t ranks = 8, std::size_t nodes = 1) {
    void* ctx = nullptr;
    ncclNvlDomainInfo_v5_t nvl{1, static_cast<int>(ranks), static_cast<int>(ranks)};
    ncclTunerConstants_v5_t constants{};
    constants.baseLatencies[1][2] = 8.5;
    EXPECT_EQ(plugin().v5->init(&ctx, comm_id, ranks, nodes, testLogger, &nvl, &constants), ncclSuccess);
    EXPECT_NE(ctx, nullptr);
    EXPECT_EQ(constants.baseLatencies[1][2], 8.5) << "the constants are NCCL's";
    contexts_.push_back(ctx);
    return ctx;
  }

  static CallResult call(void* ctx, ncclFunc_t coll, std::size_t bytes, int pipe_ops = 1, int reg_buff = 0) {
    CostTable table;
    int channels = 0;
    EXPECT_EQ(plugin().v5->getCollInfo(ctx, coll, bytes, pipe_ops, table.table(), kAlgos, kProtos, reg_buff,
                                       &channels),
              ncclSuccess);
    const auto chosen = table.chosen();
    table.expectOnly(chosen);
    if (chosen) {
      EXPECT_EQ(table.at(chosen->first, chosen->second), 0.0f);
    }
    return {chosen, channels};
  }

  std::filesystem::path directory_;
  std::vector<void*> contexts_;
};

using Choice = std::optional<std::pair<int, int>>;
const Choice kNone = std::nullopt;
Choice choice(int a, int p) {
  return std::pair{a, p};
}

TEST_F(TunerPlugin, ExportsEveryInterfaceNamedGradscope) {
  const Plugin& p = plugin();
  ASSERT_NE(p.v4, nullptr);
  ASSERT_NE(p.v3, nullptr);
  ASSERT_NE(p.explore, nullptr);
  ASSERT_NE(p.last_choice, nullptr);
  EXPECT_STREQ(p.v5->name, "gradscope");
  EXPECT_STREQ(p.v4->name, "gradscope");
  EXPECT_STREQ(p.v3->name, "gradscope");
  void* handle = dlopen(GRADSCOPE_TUNER_PLUGIN_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr);
  // Internals stay hidden: the configuration parser is not exported.
  EXPECT_EQ(dlsym(handle,
                  "_ZN9gradscope11nccl_tuner14parseCsvConfigESt17basic_string_viewIcSt11char_traitsIcEES4_"),
            nullptr);
  dlclose(handle);
}

TEST_F(TunerPlugin, NoConfigurationLeavesEveryTableAlone) {
  void* ctx = init();
  for (int coll = 0; coll < NCCL_NUM_FUNCTIONS; ++coll) {
    const CallResult result = call(ctx, static_cast<ncclFunc_t>(coll), 1 << 20);
    EXPECT_EQ(result.chosen, kNone);
    EXPECT_EQ(result.channels, 0);
  }
  const auto info = logged(NCCL_LOG_INFO);
  ASSERT_EQ(info.size(), 1u);
  EXPECT_NE(info[0].find("no configuration"), std::string::npos) << info[0];
  EXPECT_TRUE(logged(NCCL_LOG_WARN).empty());
}

TEST_F(TunerPlugin, RuleLowersExactlyItsEntryAndLogsTheLoad) {
  const std::string path = useConfig("# comment\nallreduce,0,-1,ring,ll128,-1,-1,-1\n");
  void* ctx = init();
  const CallResult result = call(ctx, ncclFuncAllReduce, 4096);
  EXPECT_EQ(result.chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_LL128));
  EXPECT_EQ(result.channels, 0) << "the rule leaves channels to NCCL";
  EXPECT_EQ(call(ctx, ncclFuncAllGather, 4096).chosen, kNone) << "other collectives unaffected";
  const auto info = logged(NCCL_LOG_INFO);
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0], "gradscope tuner: 1 rule from " + path + " (GRADSCOPE_TUNER_CONFIG)");
}

TEST_F(TunerPlugin, ChannelsOnlyWhenTheRuleSetsThem) {
  useConfig(
      "allreduce,0,1000,tree,simple,4,-1,-1\n"
      "allreduce,1001,-1,ring,simple,-1,-1,-1\n");
  void* ctx = init();
  CallResult small = call(ctx, ncclFuncAllReduce, 1000);
  EXPECT_EQ(small.chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE));
  EXPECT_EQ(small.channels, 4);
  CallResult large = call(ctx, ncclFuncAllReduce, 1001);
  EXPECT_EQ(large.chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE));
  EXPECT_EQ(large.channels, 0);
}

TEST_F(TunerPlugin, FirstMatchingLineWins) {
  useConfig(
      "allreduce,100,200,tree,ll,-1,-1,-1\n"
      "allreduce,0,-1,ring,simple,-1,-1,-1\n"
      "allreduce,150,150,pat,simple,-1,-1,-1\n");
  void* ctx = init();
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 150).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL));
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 99).chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE));
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 201).chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE));
}

TEST_F(TunerPlugin, ByteRangeIsInclusiveAtBothEnds) {
  useConfig("allreduce,1000,2000,tree,ll128,-1,-1,-1\n");
  void* ctx = init();
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 999).chosen, kNone);
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 1000).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL128));
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 2000).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL128));
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 2001).chosen, kNone);
}

TEST_F(TunerPlugin, WildcardBytesCoverZeroAndTheLargestSize) {
  useConfig("broadcast,-1,-1,ring,ll,-1,-1,-1\n");
  void* ctx = init();
  EXPECT_EQ(call(ctx, ncclFuncBroadcast, 0).chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_LL));
  EXPECT_EQ(call(ctx, ncclFuncBroadcast, SIZE_MAX).chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_LL));
}

TEST_F(TunerPlugin, NodeAndRankCountsComeFromInit) {
  useConfig(
      "allreduce,0,-1,tree,ll,-1,2,16\n"
      "allreduce,0,-1,ring,ll,-1,-1,8\n"
      "allreduce,0,-1,pat,simple,-1,1,-1\n");
  EXPECT_EQ(call(init(1, 16, 2), ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL));
  EXPECT_EQ(call(init(2, 8, 2), ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_LL));
  EXPECT_EQ(call(init(3, 4, 1), ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_PAT, NCCL_PROTO_SIMPLE));
  EXPECT_EQ(call(init(4, 4, 2), ncclFuncAllReduce, 64).chosen, kNone);
}

TEST_F(TunerPlugin, NumPipeOpsAndRegBuffMatchWhenGiven) {
  useConfig(
      "allreduce,0,-1,tree,ll,-1,-1,-1,4,1\n"
      "allreduce,0,-1,tree,simple,-1,-1,-1,4\n"
      "allreduce,0,-1,ring,simple,-1,-1,-1,-1,1\n");
  void* ctx = init();
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 64, 4, 1).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL));
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 64, 4, 0).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE));
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 64, 1, 1).chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE));
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 64, 1, 0).chosen, kNone);
}

TEST_F(TunerPlugin, AllGatherMatchesOnTotalBytes) {
  // NCCL passes count x nRanks x element size for AllGather and ReduceScatter.
  useConfig("allgather,8192,8192,ring,ll128,-1,-1,-1\n");
  void* ctx = init(1, 8, 1);
  EXPECT_EQ(call(ctx, ncclFuncAllGather, 1024).chosen, kNone) << "one rank's share";
  EXPECT_EQ(call(ctx, ncclFuncAllGather, 8 * 1024).chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_LL128));
}

TEST_F(TunerPlugin, UnusableEntryLeavesTheTableAndWarnsOnce) {
  const std::string path = useConfig("# header\nallreduce,0,-1,collnet_direct,simple,2,-1,-1\n");
  void* ctx = init();
  for (int i = 0; i < 3; ++i) {
    const CallResult result = call(ctx, ncclFuncAllReduce, 4096);
    EXPECT_EQ(result.chosen, kNone);
    EXPECT_EQ(result.channels, 0) << "nothing of an unhonoured rule is applied";
  }
  const auto warnings = logged(NCCL_LOG_WARN);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "gradscope tuner: " + path +
                ":2 asks for collnet_direct/simple for allreduce, which NCCL cannot use on this "
                "communicator (excluded by NCCL_ALGO/NCCL_PROTO or not supported); NCCL keeps its own "
                "choice for such calls");
}

TEST_F(TunerPlugin, RuleOutsideASmallerTableIsNotApplied) {
  // An NCCL whose table has 6 algorithms (no PAT): the rule's row does not exist.
  useConfig("allreduce,0,-1,pat,simple,-1,-1,-1\n");
  void* ctx = init();
  std::array<float, 4 + 6 * kProtos + 4> cells;
  cells.fill(5.0f);
  int channels = 0;
  EXPECT_EQ(plugin().v5->getCollInfo(ctx, ncclFuncAllReduce, 64, 1, reinterpret_cast<float**>(&cells[4]), 6,
                                     kProtos, 0, &channels),
            ncclSuccess);
  for (float cell : cells) EXPECT_EQ(cell, 5.0f);
  const auto warnings = logged(NCCL_LOG_WARN);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("outside NCCL's 6x3 cost table"), std::string::npos) << warnings[0];
}

TEST_F(TunerPlugin, NullAndOutOfRangeArgumentsAreHarmless) {
  useConfig("allreduce,0,-1,ring,simple,3,-1,-1\n");
  void* ctx = init();
  CostTable table;
  EXPECT_EQ(
      plugin().v5->getCollInfo(nullptr, ncclFuncAllReduce, 64, 1, table.table(), kAlgos, kProtos, 0, nullptr),
      ncclSuccess);
  EXPECT_EQ(plugin().v5->getCollInfo(ctx, ncclFuncAllReduce, 64, 1, nullptr, kAlgos, kProtos, 0, nullptr),
            ncclSuccess);
  EXPECT_EQ(
      plugin().v5->getCollInfo(ctx, ncclFuncSendRecv, 64, 1, table.table(), kAlgos, kProtos, 0, nullptr),
      ncclSuccess);
  EXPECT_EQ(plugin().v5->getCollInfo(ctx, static_cast<ncclFunc_t>(15), 64, 1, table.table(), kAlgos, kProtos,
                                     0, nullptr),
            ncclSuccess);
  EXPECT_EQ(plugin().v5->getCollInfo(ctx, ncclFuncAllReduce, 64, 1, table.table(), 0, kProtos, 0, nullptr),
            ncclSuccess);
  table.expectOnly(kNone);
  // A null nChannels still gets the algorithm.
  EXPECT_EQ(
      plugin().v5->getCollInfo(ctx, ncclFuncAllReduce, 64, 1, table.table(), kAlgos, kProtos, 0, nullptr),
      ncclSuccess);
  table.expectOnly(choice(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE));
  EXPECT_EQ(plugin().v5->finalize(nullptr), ncclSuccess);
}

// ---- malformed files: one WARN naming file and line, and no rule applied at all ------------------------

struct Malformed {
  const char* name;
  std::string text;
  std::string message;  // after "<path>"
};

class MalformedConfig : public TunerPlugin, public ::testing::WithParamInterface<Malformed> {};

TEST_P(MalformedConfig, IsRefusedWholeWithOneWarning) {
  const Malformed& param = GetParam();
  // A valid first line: a whole-file refusal must not apply it either.
  const std::string path = useConfig("allreduce,0,-1,ring,simple,2,-1,-1\n" + param.text);
  void* ctx = init();
  for (int i = 0; i < 2; ++i) {
    const CallResult result = call(ctx, ncclFuncAllReduce, 4096);
    EXPECT_EQ(result.chosen, kNone);
    EXPECT_EQ(result.channels, 0);
  }
  const auto warnings = logged(NCCL_LOG_WARN);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "gradscope tuner: " + path + param.message + "; no rule applied, NCCL keeps its own choices");
  EXPECT_TRUE(logged(NCCL_LOG_INFO).empty());
}

const std::string kFields =
    "the format is "
    "collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]";

INSTANTIATE_TEST_SUITE_P(
    Cases, MalformedConfig,
    ::testing::Values(
        Malformed{
            "UnknownCollective", "alltoall,0,-1,ring,simple,-1,-1,-1\n",
            ":2: unknown collective 'alltoall' (use broadcast, reduce, allgather, reducescatter, allreduce)"},
        Malformed{"UnknownAlgorithm", "allreduce,0,-1,rign,simple,-1,-1,-1\n",
                  ":2: unknown algorithm 'rign' (use tree, ring, collnet_direct, collnet_chain, nvls, "
                  "nvls_tree, pat)"},
        Malformed{"UnknownProtocol", "allreduce,0,-1,ring,ll64,-1,-1,-1\n",
                  ":2: unknown protocol 'll64' (use ll, ll128, simple)"},
        Malformed{"BadNumber", "allreduce,1k,-1,ring,simple,-1,-1,-1\n",
                  ":2: min_bytes '1k' is not a byte count (write a decimal integer >= 0, or -1 for any)"},
        Malformed{"NegativeBytes", "allreduce,-2,-1,ring,simple,-1,-1,-1\n",
                  ":2: min_bytes '-2' is not a byte count (write a decimal integer >= 0, or -1 for any)"},
        Malformed{
            "MinAboveMax", "allreduce,10,9,ring,simple,-1,-1,-1\n",
            ":2: min_bytes 10 is larger than max_bytes 9 (the range is inclusive at both ends; swap them)"},
        Malformed{
            "Overflow", "allreduce,0,18446744073709551616,ring,simple,-1,-1,-1\n",
            ":2: max_bytes '18446744073709551616' is larger than 18446744073709551615 (use -1 for no limit)"},
        Malformed{
            "IntOverflow", "allreduce,0,-1,ring,simple,2147483648,-1,-1\n",
            ":2: channels '2147483648' is not -1 or an integer from 1 to 2147483647 (-1 means NCCL's own "
            "channel count)"},
        Malformed{"ZeroRanks", "allreduce,0,-1,ring,simple,-1,-1,0\n",
                  ":2: nRanks '0' is not -1 or an integer from 1 to 2147483647 (-1 means any rank count)"},
        Malformed{"BadRegBuff", "allreduce,0,-1,ring,simple,-1,-1,-1,-1,2\n",
                  ":2: regBuff '2' is not -1, 0 or 1 (0: unregistered buffers, 1: registered, -1: either)"},
        Malformed{"TooManyFields", "allreduce,0,-1,ring,simple,-1,-1,-1,-1,-1,7\n",
                  ":2: more than 10 fields (" + kFields + ")"},
        Malformed{"TooFewFields", "allreduce,0,-1,ring,simple,-1,-1\n",
                  ":2: 7 fields, expected 8 to 10 (" + kFields + ")"},
        Malformed{"EmptyField", "allreduce,0,,ring,simple,-1,-1,-1\n",
                  ":2: field 3 (max_bytes) is empty (write -1 for any)"},
        Malformed{"HugeLine", "# " + std::string(5000, 'x') + "\n",
                  ":2: line of 5002 bytes, longer than 4096 (one rule per line)"},
        Malformed{"NotUtf8", "# caf\xe9\n",
                  ":2: byte 0xe9 at offset 40 is not UTF-8 (save the file as UTF-8 text)"},
        Malformed{"ControlCharacter", std::string("allreduce,0,-1,ring,simple,-1,-1,-1\0\n", 37),
                  ":2: control character 0x00 (a tuner file is plain text)"}),
    [](const ::testing::TestParamInfo<Malformed>& case_info) { return std::string(case_info.param.name); });

TEST_F(TunerPlugin, NotUtf8MessageNamesTheLine) {
  // The parametrised case above checks the whole message; here the line number of a later bad byte.
  const std::string path = useConfig("# ok\n# ok\nallreduce,0,-1,ring,simple,-1,-1,-1 # \xff\n");
  call(init(), ncclFuncAllReduce, 1);
  const auto warnings = logged(NCCL_LOG_WARN);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(path + ":3: byte 0xff at offset"), std::string::npos) << warnings[0];
}

TEST_F(TunerPlugin, EmptyFileIsRefused) {
  for (const char* text : {"", "  \n\t\r\n"}) {
    const std::string path = useConfig(text);
    void* ctx = init();
    EXPECT_EQ(call(ctx, ncclFuncAllReduce, 64).chosen, kNone);
    finalizeAll();
    const auto warnings = logged(NCCL_LOG_WARN);
    ASSERT_FALSE(warnings.empty());
    EXPECT_EQ(warnings.back(),
              "gradscope tuner: " + path +
                  ": empty file (write one rule per line: collective,min_bytes,max_bytes,algorithm,"
                  "protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]); no rule applied, NCCL "
                  "keeps its own choices");
  }
}

TEST_F(TunerPlugin, MissingFileOrDirectoryIsRefused) {
  const std::string missing = (directory_ / "absent.conf").string();
  setenv("NCCL_TUNER_CONFIG_FILE", missing.c_str(), 1);
  EXPECT_EQ(call(init(), ncclFuncAllReduce, 64).chosen, kNone);
  finalizeAll();
  setenv("NCCL_TUNER_CONFIG_FILE", directory_.c_str(), 1);
  EXPECT_EQ(call(init(), ncclFuncAllReduce, 64).chosen, kNone);
  const auto warnings = logged(NCCL_LOG_WARN);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0], "gradscope tuner: " + missing +
                             ": cannot open: No such file or directory (check GRADSCOPE_TUNER_CONFIG / "
                             "NCCL_TUNER_CONFIG_FILE); no rule applied, NCCL keeps its own choices");
  EXPECT_NE(warnings[1].find(directory_.string() + ": not a regular file"), std::string::npos) << warnings[1];
}

TEST_F(TunerPlugin, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = (directory_ / "fifo").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  setenv("GRADSCOPE_TUNER_CONFIG", fifo.c_str(), 1);
  EXPECT_EQ(call(init(), ncclFuncAllReduce, 64).chosen, kNone);
  const auto warnings = logged(NCCL_LOG_WARN);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(fifo + ": not a regular file"), std::string::npos) << warnings[0];
}

TEST_F(TunerPlugin, GradscopeVariableWinsOverNvidias) {
  const std::string nvidia = writeFile("nvidia.conf", "allreduce,0,-1,tree,ll,-1,-1,-1\n");
  setenv("NCCL_TUNER_CONFIG_FILE", nvidia.c_str(), 1);
  EXPECT_EQ(call(init(), ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL));
  finalizeAll();
  useConfig("allreduce,0,-1,ring,ll,-1,-1,-1\n");
  EXPECT_EQ(call(init(), ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_LL));
}

TEST_F(TunerPlugin, ConfigurationIsSharedUntilTheLastContextGoes) {
  useConfig("allreduce,0,-1,tree,ll,-1,-1,-1\n", "a.conf");
  void* first = init(1);
  useConfig("allreduce,0,-1,ring,ll,-1,-1,-1\n", "b.conf");
  void* second = init(2);
  EXPECT_EQ(call(second, ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL))
      << "still a.conf";
  EXPECT_EQ(call(first, ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL));
  EXPECT_EQ(logged(NCCL_LOG_INFO).size(), 1u) << "loaded once";
  finalizeAll();
  EXPECT_EQ(call(init(3), ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_RING, NCCL_PROTO_LL))
      << "b.conf now";
}

TEST_F(TunerPlugin, RecommendationFileAppliesItsNcclRules) {
  // The golden recommendation of tests/data (two sum/nccl.* rules for 4 ranks) and the nccl-tuner CSV the
  // exporter writes from it must steer NCCL identically.
  setenv("GRADSCOPE_TUNER_CONFIG", GRADSCOPE_TEST_DATA_DIR "/recommend_nccl_json.json", 1);
  void* json4 = init(1, 4, 1);
  void* json8 = init(2, 8, 1);
  EXPECT_EQ(logged(NCCL_LOG_INFO),
            std::vector<std::string>{"gradscope tuner: 2 rules from " GRADSCOPE_TEST_DATA_DIR
                                     "/recommend_nccl_json.json (GRADSCOPE_TUNER_CONFIG)"});
  const std::vector<std::size_t> sizes = {0, 4095, 4096, 65536, 65537, 4194303, 4194304, 67108864, 67108865};
  std::vector<Choice> from_json;
  for (std::size_t bytes : sizes) {
    from_json.push_back(call(json4, ncclFuncAllReduce, bytes).chosen);
    EXPECT_EQ(call(json8, ncclFuncAllReduce, bytes).chosen, kNone) << "rules are for 4 ranks";
    EXPECT_EQ(call(json4, ncclFuncReduceScatter, bytes).chosen, kNone) << "rules are for all-reduce";
  }
  EXPECT_EQ(from_json, (std::vector<Choice>{kNone, kNone, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL),
                                            choice(NCCL_ALGO_TREE, NCCL_PROTO_LL), kNone, kNone,
                                            choice(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE),
                                            choice(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE), kNone}));
  finalizeAll();
  setenv("GRADSCOPE_TUNER_CONFIG", GRADSCOPE_TEST_DATA_DIR "/recommend_nccl_nccl-tuner.txt", 1);
  void* csv4 = init(1, 4, 1);
  for (std::size_t i = 0; i < sizes.size(); ++i)
    EXPECT_EQ(call(csv4, ncclFuncAllReduce, sizes[i]).chosen, from_json[i]);
}

// ---- older interfaces -----------------------------------------------------------------------------------

TEST_F(TunerPlugin, V4InterfaceBehavesLikeV5) {
  useConfig("allreduce,0,-1,tree,ll128,6,-1,4,-1,1\n");
  const ncclTuner_v4_t* v4 = plugin().v4;
  void* ctx = nullptr;
  ASSERT_EQ(v4->init(4, 1, testLogger, &ctx), ncclSuccess);
  ASSERT_NE(ctx, nullptr);
  CostTable table;
  int channels = 0;
  ASSERT_EQ(v4->getCollInfo(ctx, ncclFuncAllReduce, 64, 1, table.table(), kAlgos, kProtos, 1, &channels),
            ncclSuccess);
  table.expectOnly(choice(NCCL_ALGO_TREE, NCCL_PROTO_LL128));
  EXPECT_EQ(channels, 6);
  int algorithm = 0, protocol = 0;
  std::uint64_t calls = 0;
  EXPECT_EQ(plugin().last_choice(0, ncclFuncAllReduce, &algorithm, &protocol, &calls), 1)
      << "v4 contexts are id 0";
  EXPECT_EQ(std::pair(algorithm, protocol), std::pair(NCCL_ALGO_TREE, NCCL_PROTO_LL128));
  EXPECT_EQ(calls, 1u);
  EXPECT_EQ(v4->destroy(ctx), ncclSuccess);
}

TEST_F(TunerPlugin, V3InterfaceMatchesOnlyRulesForAnyRegBuff) {
  useConfig(
      "allreduce,0,-1,tree,ll,-1,-1,-1,-1,1\n"
      "allreduce,0,-1,ring,ll,-1,-1,-1,-1,-1\n");
  const ncclTuner_v3_t* v3 = plugin().v3;
  void* ctx = nullptr;
  ASSERT_EQ(v3->init(8, 1, testLogger, &ctx), ncclSuccess);
  CostTable table;
  int channels = 0;
  ASSERT_EQ(v3->getCollInfo(ctx, ncclFuncAllReduce, 64, 1, table.table(), kAlgos, kProtos, &channels),
            ncclSuccess);
  table.expectOnly(choice(NCCL_ALGO_RING, NCCL_PROTO_LL));
  EXPECT_EQ(v3->destroy(ctx), ncclSuccess);
}

// ---- explore mode ---------------------------------------------------------------------------------------

// The usable entries of CostTable in algorithm-major order: the cycle explore mode must walk.
const std::vector<Choice> kUsableOrder = {choice(0, 0), choice(0, 1), choice(0, 2), choice(1, 0),
                                          choice(1, 1), choice(1, 2), choice(4, 2), choice(6, 2)};

TEST_F(TunerPlugin, ExploreCyclesUsableCombinationsIdenticallyInEveryContext) {
  setenv("GRADSCOPE_TUNER_EXPLORE", "1", 1);
  useConfig("allreduce,0,-1,tree,ll,-1,-1,-1\n");  // ignored while exploring
  void* rank0 = init(9);
  void* rank1 = init(9);
  // Two size buckets interleaved: 4096 (bit width 13) and 1 MiB (21), each with its own count.
  std::vector<Choice> small0, large0, small1, large1;
  for (std::size_t i = 0; i < 2 * kUsableOrder.size() + 3; ++i) {
    small0.push_back(call(rank0, ncclFuncAllReduce, 4096).chosen);
    large0.push_back(call(rank0, ncclFuncAllReduce, 1 << 20).chosen);
    if (i % 2 == 0) large0.push_back(call(rank0, ncclFuncAllReduce, (1 << 20) + 7).chosen);  // same bucket
  }
  for (std::size_t i = 0; i < 2 * kUsableOrder.size() + 3;
       ++i) {  // another order of buckets, same per bucket
    large1.push_back(call(rank1, ncclFuncAllReduce, 1 << 20).chosen);
    if (i % 2 == 0) large1.push_back(call(rank1, ncclFuncAllReduce, (1 << 20) + 7).chosen);
    small1.push_back(call(rank1, ncclFuncAllReduce, 4096).chosen);
  }
  EXPECT_EQ(small0, small1);
  EXPECT_EQ(large0, large1);
  for (std::size_t k = 0; k < small0.size(); ++k)
    EXPECT_EQ(small0[k], kUsableOrder[k % kUsableOrder.size()]) << k;
  for (std::size_t k = 0; k < large0.size(); ++k)
    EXPECT_EQ(large0[k], kUsableOrder[k % kUsableOrder.size()]) << k;
  EXPECT_EQ(logged(NCCL_LOG_INFO).size(), 2u) << "explore and rule count";
}

TEST_F(TunerPlugin, ExploreRepeatsEachCombination) {
  setenv("GRADSCOPE_TUNER_EXPLORE", "1", 1);
  setenv("GRADSCOPE_TUNER_EXPLORE_REPEATS", "3", 1);
  void* ctx = init();
  for (std::size_t k = 0; k < 3 * kUsableOrder.size() + 3; ++k)
    EXPECT_EQ(call(ctx, ncclFuncBroadcast, 100).chosen, kUsableOrder[(k / 3) % kUsableOrder.size()]) << k;
}

TEST_F(TunerPlugin, ExploreLeavesATableWithoutUsableEntriesAlone) {
  setenv("GRADSCOPE_TUNER_EXPLORE", "1", 1);
  void* ctx = init();
  std::array<float, kAlgos * kProtos> cells;
  cells.fill(-1.0f);
  int channels = 0;
  EXPECT_EQ(plugin().v5->getCollInfo(ctx, ncclFuncAllReduce, 64, 1, reinterpret_cast<float**>(cells.data()),
                                     kAlgos, kProtos, 0, &channels),
            ncclSuccess);
  for (float cell : cells) EXPECT_EQ(cell, -1.0f);
  EXPECT_EQ(channels, 0);
}

TEST_F(TunerPlugin, InvalidExploreSettingsWarnAndStayOff) {
  useConfig("allreduce,0,-1,tree,ll,-1,-1,-1\n");
  for (const auto& [explore, repeats] :
       std::vector<std::pair<const char*, const char*>>{{"yes", nullptr}, {"1", "0"}, {"1", "many"}}) {
    setenv("GRADSCOPE_TUNER_EXPLORE", explore, 1);
    if (repeats != nullptr) setenv("GRADSCOPE_TUNER_EXPLORE_REPEATS", repeats, 1);
    void* ctx = init();
    EXPECT_EQ(call(ctx, ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_TREE, NCCL_PROTO_LL))
        << "rules apply";
    finalizeAll();
  }
  const auto warnings = logged(NCCL_LOG_WARN);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_EQ(warnings[0],
            "gradscope tuner: GRADSCOPE_TUNER_EXPLORE=yes is not 0 or 1; explore mode stays off");
  EXPECT_EQ(warnings[2],
            "gradscope tuner: GRADSCOPE_TUNER_EXPLORE_REPEATS=many is not an integer from 1 to 1000000; "
            "explore mode "
            "stays off");
}

TEST_F(TunerPlugin, ExtensionSwitchesExplorePerCommunicator) {
  useConfig("allreduce,0,-1,pat,simple,-1,-1,-1\n");
  void* a = init(100);
  void* b = init(200);
  EXPECT_EQ(plugin().explore(100, 2), 1);
  EXPECT_EQ(plugin().explore(12345, 1), 0) << "no such communicator";
  EXPECT_EQ(plugin().explore(100, -1), -1);
  for (std::size_t k = 0; k < 2 * kUsableOrder.size(); ++k) {
    EXPECT_EQ(call(a, ncclFuncAllReduce, 64).chosen, kUsableOrder[k / 2]) << k;
    EXPECT_EQ(call(b, ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_PAT, NCCL_PROTO_SIMPLE))
        << "b keeps its rules";
  }
  // Switching again restarts the cycle.
  EXPECT_EQ(plugin().explore(100, 1), 1);
  EXPECT_EQ(call(a, ncclFuncAllReduce, 64).chosen, kUsableOrder[0]);
  EXPECT_EQ(call(a, ncclFuncAllReduce, 64).chosen, kUsableOrder[1]);
  EXPECT_EQ(plugin().explore(100, 0), 1);
  EXPECT_EQ(call(a, ncclFuncAllReduce, 64).chosen, choice(NCCL_ALGO_PAT, NCCL_PROTO_SIMPLE)) << "off again";
  EXPECT_EQ(plugin().explore(0, 1), 2) << "0 = every live context";
}

TEST_F(TunerPlugin, LastChoiceReportsWhatEachCallAskedFor) {
  useConfig("allreduce,0,1000,nvls,simple,-1,-1,-1\n");
  void* ctx = init(55);
  int algorithm = 0, protocol = 0;
  std::uint64_t calls = 7;
  EXPECT_EQ(plugin().last_choice(55, ncclFuncAllReduce, &algorithm, &protocol, &calls), 0) << "no call yet";
  EXPECT_EQ(std::tuple(algorithm, protocol, calls), std::tuple(-1, -1, 0u));
  call(ctx, ncclFuncAllReduce, 1000);
  EXPECT_EQ(plugin().last_choice(55, ncclFuncAllReduce, &algorithm, &protocol, &calls), 1);
  EXPECT_EQ(std::tuple(algorithm, protocol, calls), std::tuple(NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE, 1u));
  call(ctx, ncclFuncAllReduce, 1001);
  EXPECT_EQ(plugin().last_choice(55, ncclFuncAllReduce, &algorithm, &protocol, &calls), 0);
  EXPECT_EQ(std::tuple(algorithm, protocol, calls), std::tuple(-1, -1, 2u));
  EXPECT_EQ(plugin().last_choice(55, ncclFuncAllReduce, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(plugin().last_choice(56, ncclFuncAllReduce, &algorithm, &protocol, &calls), -1);
  EXPECT_EQ(plugin().last_choice(55, 5, &algorithm, &protocol, &calls), -1);
}

TEST_F(TunerPlugin, NullLoggerIsAccepted) {
  useConfig("allreduce,x\n");
  void* ctx = nullptr;
  ASSERT_EQ(plugin().v5->init(&ctx, 1, 8, 1, nullptr, nullptr, nullptr), ncclSuccess);
  EXPECT_EQ(call(ctx, ncclFuncAllReduce, 64).chosen, kNone);
  EXPECT_EQ(plugin().v5->finalize(ctx), ncclSuccess);
}

// ---- threads --------------------------------------------------------------------------------------------

TEST_F(TunerPlugin, ConcurrentCommunicatorsOnManyThreads) {
  useConfig(
      "allreduce,0,65535,tree,ll,-1,-1,-1\n"
      "allreduce,65536,-1,ring,simple,8,-1,-1\n"
      "allgather,0,-1,pat,simple,-1,-1,-1\n");
  constexpr int kThreads = 8;
  constexpr int kCalls = 5000;
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread creates, uses and destroys its own communicators, as NCCL does per communicator.
      for (int round = 0; round < 2; ++round) {
        const auto comm_id = static_cast<std::uint64_t>(1000 + t);
        void* ctx = nullptr;
        if (plugin().v5->init(&ctx, comm_id, 8, 1, testLogger, nullptr, nullptr) != ncclSuccess ||
            ctx == nullptr) {
          ++failures;
          return;
        }
        const bool exploring = t == 0 && round == 1;
        if (exploring) plugin().explore(comm_id, 1);
        for (int i = 0; i < kCalls; ++i) {
          CostTable table;
          int channels = 0;
          const std::size_t bytes = static_cast<std::size_t>(i) * 97;
          const auto coll = i % 3 == 0 ? ncclFuncAllGather : ncclFuncAllReduce;
          plugin().v5->getCollInfo(ctx, coll, bytes, 1, table.table(), kAlgos, kProtos, 0, &channels);
          const Choice got = table.chosen();
          Choice want = coll == ncclFuncAllGather ? choice(NCCL_ALGO_PAT, NCCL_PROTO_SIMPLE)
                        : bytes < 65536           ? choice(NCCL_ALGO_TREE, NCCL_PROTO_LL)
                                                  : choice(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE);
          if (exploring ? !got.has_value() : got != want) ++failures;
        }
        plugin().v5->finalize(ctx);
      }
    });
  }
  // Meanwhile the agent's side: switch and query from another thread.
  std::thread agent([&] {
    while (!stop.load()) {
      int algorithm = 0, protocol = 0;
      std::uint64_t calls = 0;
      plugin().last_choice(1003, ncclFuncAllReduce, &algorithm, &protocol, &calls);
      plugin().explore(424242, 1);
      std::this_thread::yield();
    }
  });
  for (auto& thread : threads) thread.join();
  stop.store(true);
  agent.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(logged(NCCL_LOG_WARN).empty());
}

}  // namespace
}  // namespace gradscope::nccl_tuner
