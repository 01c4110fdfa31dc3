// cli/: `gradscope report` (golden output of a merged 4-rank synthetic job, empty traces, drops) and the
// command line's contract: --version, --help, exit statuses, merge → report end to end.

#include "gradscope/cli/report.h"

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/common/version.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::cli {
namespace {

using storage::TraceReader;
using storage::TraceWriter;
using test::runCli;
using test::TempDir;

std::string report(const std::string& path, const ReportOptions& options = {}) {
  const TraceReader reader = TraceReader::open(path);
  std::ostringstream out;
  writeReport(reader, out, options);
  return out.str();
}

// The per-rank files of the default synthetic job (4 ranks, 20 steps, rank 1 straggling), merged.
std::string writeMergedJob(const TempDir& dir) {
  const testing::SyntheticJob job;
  std::vector<std::string> ranks;
  const std::string ranks_dir = dir.makeSubdir("ranks");
  for (int rank = 0; rank < job.ranks; ++rank) {
    ranks.push_back(fmt::format("{}/rank-{}.db", ranks_dir, rank));
    testing::writeSyntheticRank(ranks.back(), job, rank);
  }
  const std::string merged = dir.file("merged.db");
  storage::mergeTraces(ranks, merged, {});
  return merged;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool hasLine(const std::string& text, const std::string& line) {
  const auto all = lines(text);
  return std::find(all.begin(), all.end(), line) != all.end();
}

TEST(Report, GoldenForAMergedFourRankJob) {
  TempDir dir;
  const std::string path = writeMergedJob(dir);
  const std::string text = report(path);
  EXPECT_EQ(text.rfind("gradscope report: " + path + "\n", 0), 0u) << text;
  EXPECT_TRUE(test::matchesGolden("report_synthetic.txt", test::replaceAll(text, dir.path(), "<dir>")));
}

TEST(Report, TheCommandPrintsTheSameReport) {
  TempDir dir;
  const std::string path = writeMergedJob(dir);
  const auto result = runCli({"report", path});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(result.out, report(path));
  EXPECT_TRUE(result.err.empty()) << result.err;

  const auto top = runCli({"report", path, "--top", "3"});
  ASSERT_EQ(top.exit_code, 0) << test::describe(top);
  EXPECT_EQ(top.out, report(path, ReportOptions{3}));
}

TEST(Report, TopLimitsTheSlowestCalls) {
  TempDir dir;
  const std::string path = writeMergedJob(dir);
  const auto all = lines(report(path, ReportOptions{3}));
  const auto header = std::find(all.begin(), all.end(), "Slowest calls");
  ASSERT_NE(header, all.end());
  // The title, the column header, three calls, then a blank line.
  ASSERT_GT(all.end() - header, 5);
  EXPECT_EQ(*(header + 5), "");
  EXPECT_NE((header + 4)->find("MPI_Allreduce"), std::string::npos) << *(header + 4);
}

TEST(Report, SingleRankTraceOfTheSyntheticJob) {
  TempDir dir;
  const std::string path = dir.file("rank-1.db");
  testing::writeSyntheticRank(path, testing::SyntheticJob{}, 1);
  const std::string text = report(path);
  EXPECT_TRUE(
      hasLine(text,
              "Calls     140 collective calls on 1 rank, 342 ms in collectives (35.0% of the ranks' active "
              "time)"))
      << text;
  EXPECT_TRUE(hasLine(text, "Time      2026-11-18 11:06:40 UTC, lasted 1.07 s")) << text;
  EXPECT_EQ(text.find("spread:"), std::string::npos) << "no spread with one rank";
  EXPECT_EQ(text.find("arrives last"), std::string::npos);
  EXPECT_TRUE(hasLine(text, "Written   by gradscope test")) << text;
}

TEST(Report, EmptyTraceSaysThereAreNoCalls) {
  TempDir dir;
  const std::string path = dir.file("empty.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    storage::RunInfo run;
    run.uuid = "empty-run";
    run.mode = "observe";
    run.backend = Backend::Mpi;
    run.world_size = 1;
    run.host = "h";
    run.epoch_ns = 1'795'000'000'000'000'000;
    writer.addRun(run);
    writer.addRank({0, 1, 0, "h", 7, "cpu", 0});
    writer.finish();  // no end: incomplete
  }
  const std::string text = report(path);
  EXPECT_TRUE(hasLine(text, "No collective calls were recorded.")) << text;
  EXPECT_TRUE(hasLine(
      text, "Calls     0 collective calls on 1 rank, 0 ns in collectives (- of the ranks' active time)"))
      << text;
  EXPECT_TRUE(hasLine(text, "Run       empty-run (observe, backend mpi, 1 rank, host h)")) << text;
  EXPECT_TRUE(hasLine(text, "Command   -")) << text;
  EXPECT_TRUE(
      hasLine(text,
              "Time      2026-11-18 11:06:40 UTC, incomplete: no end recorded (still running, or the job "
              "died)"))
      << text;
  EXPECT_TRUE(hasLine(text, "  none: every intercepted event was recorded")) << text;
  EXPECT_EQ(text.find("Slowest calls"), std::string::npos);

  // No run, no ranks at all: still a report.
  const std::string bare = dir.file("bare.db");
  TraceWriter::create(bare).finish();
  const std::string bare_text = report(bare);
  EXPECT_TRUE(hasLine(bare_text, "No collective calls were recorded.")) << bare_text;
  EXPECT_TRUE(hasLine(bare_text,
                      "Calls     0 collective calls on 0 ranks, 0 ns in collectives (- of the ranks' active "
                      "time)"))
      << bare_text;
  const auto result = runCli({"report", bare});
  EXPECT_EQ(result.exit_code, 0) << test::describe(result);
}

TEST(Report, ListsMeasuredStrategiesFastestFirstPerPoint) {
  TempDir dir;
  const std::string path = dir.file("bench.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    storage::RunInfo run;
    run.uuid = "bench-run";
    run.mode = "bench";
    run.backend = Backend::Mpi;
    run.world_size = 2;
    run.epoch_ns = 1'795'000'000'000'000'000;
    const std::int64_t run_id = writer.addRun(run);
    auto point = [&](const char* strategy, std::int64_t bytes, double median_ns,
                     std::optional<double> error) {
      storage::Measurement m;
      m.run_id = run_id;
      m.strategy = strategy;
      m.api = Api::MpiAllreduce;
      m.bytes = bytes;
      m.world = 2;
      m.reps = 20;
      m.min_ns = m.median_ns = m.p90_ns = m.max_ns = median_ns;
      m.algbw_gbs = m.busbw_gbs = static_cast<double>(bytes) / median_ns;
      m.rel_l2_error = error;
      writer.addMeasurement(m);
    };
    point("sum/native", 1024, 2000, 3e-8);
    point("sum/native/bf16", 1024, 1000, 2.4e-3);
    point("sum/rs_ag", 1 << 20, 500'000, std::nullopt);
    writer.finish(1'000'000);
  }
  const std::string text = report(path);
  EXPECT_TRUE(hasLine(text, "No collective calls were recorded.")) << text;
  EXPECT_TRUE(hasLine(text, "(A benchmark trace: its measurements follow.)")) << text;
  EXPECT_TRUE(hasLine(text, "Measured strategies (3 points; per size, fastest first)")) << text;
  const auto bf16 = text.find("sum/native/bf16");
  const auto native = text.find("sum/native ");
  ASSERT_NE(bf16, std::string::npos) << text;
  ASSERT_NE(native, std::string::npos) << text;
  EXPECT_LT(bf16, native) << "the faster strategy of the 1 KiB point comes first\n" << text;
  EXPECT_NE(text.find("2.00x"), std::string::npos) << text;  // sum/native against the point's best
  EXPECT_NE(text.find("1 MiB"), std::string::npos) << text;
}

TEST(Report, ListsDroppedEventsAndTheirTotal) {
  TempDir dir;
  const std::string path = dir.file("drops.db");
  testing::SyntheticJob job;
  job.steps = 2;
  testing::writeSyntheticRank(path, job, 3);
  {
    test::RawDb db(path);
    db.exec("INSERT INTO drops VALUES (3, 'call', 1200), (3, 'cupti_record', 34)");
  }
  const std::string text = report(path);
  EXPECT_TRUE(hasLine(text, "Dropped events")) << text;
  EXPECT_TRUE(hasLine(text, "  rank     3  call                    1,200")) << text;
  EXPECT_TRUE(hasLine(text, "  rank     3  cupti_record               34")) << text;
  EXPECT_TRUE(hasLine(
      text, "  1,234 events dropped in total: the agent's buffers were full; the totals above miss them"))
      << text;
  EXPECT_EQ(text.find("none: every intercepted event"), std::string::npos);
}

TEST(Report, DropsAccumulatedByTheWriterAreReported) {
  TempDir dir;
  const std::string path = dir.file("drops.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    storage::RunInfo run;
    run.uuid = "d";
    writer.addRun(run);
    writer.addRank({0, 1, 0, "h", 1, "cpu", 0});
    writer.addDrops(0, "call", 5);
    writer.addDrops(0, "call", 6);
    writer.finish(10);
  }
  const std::string text = report(path);
  EXPECT_TRUE(hasLine(text, "  rank     0  call                       11")) << text;
  EXPECT_TRUE(hasLine(
      text, "  11 events dropped in total: the agent's buffers were full; the totals above miss them"))
      << text;
}

// ---------------------------------------------------------------------------------------------------
// The command line

TEST(Command, Version) {
  const auto result = runCli({"--version"});
  EXPECT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(result.out, "gradscope 0.1.0\n");
  EXPECT_EQ(std::string("gradscope ") + kVersion + "\n", result.out);
}

TEST(Command, HelpListsTheCommandsAndWhatIsNotBuiltYet) {
  const auto result = runCli({"--help"});
  EXPECT_EQ(result.exit_code, 0) << test::describe(result);
  for (const char* part :
       {"report", "merge", "export", "bench", "Not built yet", "recommend, check", "run", "Exit status"})
    EXPECT_NE(result.out.find(part), std::string::npos) << "help lacks \"" << part << "\":\n" << result.out;
}

TEST(Command, SubcommandHelp) {
  for (const char* command : {"report", "merge", "export", "bench"}) {
    const auto result = runCli({command, "--help"});
    EXPECT_EQ(result.exit_code, 0) << command << ": " << test::describe(result);
    EXPECT_FALSE(result.out.empty()) << command;
  }
}

TEST(Command, UsageErrorsExitWithStatus2) {
  for (const auto& args :
       std::vector<std::vector<std::string>>{{},                                    // no subcommand
                                             {"report"},                            // missing FILE
                                             {"export", "X", "--format", "bogus"},  // unknown format
                                             {"export", "X"},                       // missing --format
                                             {"export", "X", "--format", "csv", "--table", "runs"},
                                             {"merge", "a.db"},  // missing -o
                                             {"frobnicate"},     // unknown subcommand
                                             {"report", "a.db", "--top", "many"}}) {
    SCOPED_TRACE(::testing::PrintToString(args));
    const auto result = runCli(args);
    EXPECT_TRUE(result.exited) << test::describe(result);
    EXPECT_EQ(result.exit_code, 2) << test::describe(result);
    EXPECT_FALSE(result.err.empty()) << test::describe(result);
    EXPECT_TRUE(result.out.empty() || result.out.find("Usage") != std::string::npos)
        << test::describe(result);
  }
}

TEST(Command, MergeADirectoryThenReportTheResult) {
  TempDir dir;
  const std::string ranks = dir.makeSubdir("job");
  testing::SyntheticJob job;
  job.ranks = 4;
  job.steps = 5;
  for (int rank = 0; rank < job.ranks; ++rank)
    testing::writeSyntheticRank(fmt::format("{}/rank-{}.db", ranks, rank), job, rank);

  const std::string merged = dir.file("merged.db");
  auto result = runCli({"merge", ranks, "-o", merged});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(result.out,
            fmt::format("merged 4 files (1 run, 4 ranks, 140 calls, 0 measurements) into {}\n", merged));
  EXPECT_TRUE(result.err.empty()) << result.err;

  result = runCli({"report", merged});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_NE(result.out.find("Calls     140 collective calls on 4 ranks"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("rank 1 arrives last on average"), std::string::npos) << result.out;
  EXPECT_EQ(result.out, report(merged));

  // The merged file of one job merges and reports like the per-rank files.
  const std::string again = dir.file("again.db");
  result = runCli({"merge", merged, "-o", again});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(test::replaceAll(report(again), again, merged), report(merged));
}

}  // namespace
}  // namespace gradscope::cli
