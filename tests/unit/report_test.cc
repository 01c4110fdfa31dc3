// cli/: `gradscope report` (golden output of a merged 4-rank synthetic job, empty traces, drops) and the
// command line's contract: --version, --help, exit statuses, merge → report end to end.

#include "gradscope/cli/report.h"

#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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
  EXPECT_EQ(top.out, report(path, ReportOptions{3, {}}));
}

// A run's directory of rank files reads as its merged file: report, export and recommend merge it into a
// temporary copy under TMPDIR, name the directory, and leave nothing behind.
TEST(Report, ADirectoryOfRankFilesReadsAsItsMergedFile) {
  TempDir dir;
  const std::string merged = writeMergedJob(dir);
  const std::string ranks = dir.path() + "/ranks";
  const std::string scratch = dir.makeSubdir("tmp");
  const auto cli = [&](const std::string& arguments) {
    return test::runShell(fmt::format("TMPDIR={} {} {}", test::shellQuote(scratch),
                                      test::shellQuote(GRADSCOPE_CLI_PATH), arguments));
  };
  const auto leftovers = [&] {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(scratch))
      names.push_back(entry.path().filename().string());
    return names;
  };

  const auto from_directory = cli("report " + test::shellQuote(ranks));
  ASSERT_EQ(from_directory.exit_code, 0) << test::describe(from_directory);
  EXPECT_EQ(from_directory.out,
            test::replaceAll(report(merged), "gradscope report: " + merged, "gradscope report: " + ranks));
  EXPECT_TRUE(leftovers().empty()) << fmt::format("{}", fmt::join(leftovers(), " "));

  // export: the same rows as the merged file's, written beside the directory by default.
  const auto exported = cli("export " + test::shellQuote(ranks) + " --format csv");
  ASSERT_EQ(exported.exit_code, 0) << test::describe(exported);
  ASSERT_EQ(runCli({"export", merged, "--format", "csv"}).exit_code, 0);
  EXPECT_EQ(test::readFile(ranks + ".csv"), test::readFile(dir.file("merged.csv")));
  EXPECT_TRUE(leftovers().empty());

  // recommend: the same plan as from the merged file; not stored anywhere (the merged copy is gone), and
  // it says so. A benchmark trace alone in its directory, with a known winner.
  const std::string bench_dir = dir.makeSubdir("bench");
  testing::writeBenchTrace(bench_dir + "/rank0.db", 2, {{"sum/mpi.ring", 1 << 10, 1 << 14}});
  const std::string bench_merged = dir.file("bench-merged.db");
  storage::mergeTraces({bench_dir + "/rank0.db"}, bench_merged, {});
  const auto planned = cli("recommend " + test::shellQuote(bench_dir) + " --format ompi-rules");
  ASSERT_EQ(planned.exit_code, 0) << test::describe(planned);
  const auto expected = runCli({"recommend", bench_merged, "--format", "ompi-rules", "--no-store"});
  ASSERT_EQ(expected.exit_code, 0) << test::describe(expected);
  EXPECT_NE(planned.out.find("ring (4)"), std::string::npos) << planned.out;
  EXPECT_EQ(test::replaceAll(planned.out, bench_dir, "<input>"),
            test::replaceAll(expected.out, bench_merged, "<input>"));
  EXPECT_NE(planned.err.find("directory of rank files, merged for this command only"), std::string::npos)
      << planned.err;
  EXPECT_TRUE(leftovers().empty());

  // A directory without trace files: one line naming it, exit 2 (bad input), nothing written.
  const std::string empty = dir.makeSubdir("empty");
  const auto refused = cli("report " + test::shellQuote(empty));
  EXPECT_EQ(refused.exit_code, 2) << test::describe(refused);
  EXPECT_EQ(refused.err, fmt::format("gradscope: {}: no trace files (*.db) in this directory\n", empty));
  EXPECT_TRUE(leftovers().empty());
}

TEST(Report, TopLimitsTheSlowestCalls) {
  TempDir dir;
  const std::string path = writeMergedJob(dir);
  const auto all = lines(report(path, ReportOptions{3, {}}));
  const auto header = std::find_if(
      all.begin(), all.end(), [](const std::string& line) { return line.starts_with("Slowest calls ("); });
  ASSERT_NE(header, all.end());
  // The title, the column header, three calls, then a blank line.
  ASSERT_GT(all.end() - header, 5);
  EXPECT_EQ(*(header + 5), "");
  EXPECT_NE((header + 4)->find("MPI_Allreduce"), std::string::npos) << *(header + 4);
}

// Beyond 32 ranks the report lists no rank by rank: the spread over the ranks, the ranks and hosts that
// stand out (the straggler first), and each slow collective once, with how many ranks' calls it stands for.
TEST(Report, ManyRanksAreSummarisedNotListed) {
  TempDir dir;
  testing::SyntheticJob job;
  job.ranks = 96;
  job.steps = 5;
  job.straggler = 37;
  std::vector<std::string> files;
  const std::string ranks_dir = dir.makeSubdir("ranks");
  for (int rank = 0; rank < job.ranks; ++rank) {
    files.push_back(fmt::format("{}/rank-{}.db", ranks_dir, rank));
    testing::writeSyntheticRank(files.back(), job, rank);
  }
  const std::string merged = dir.file("merged.db");
  storage::mergeTraces(files, merged, {});
  const std::string text = report(merged);
  const auto all = lines(text);
  EXPECT_LT(all.size(), 80u) << text;
  EXPECT_TRUE(hasLine(text,
                      "Per rank: 96 ranks, their spread and the ones that stand out (lateness: how long "
                      "after the first rank this rank started the same collective)"))
      << text;
  // The straggler heads the latest ranks, and its host the latest hosts.
  const auto latest = std::find(all.begin(), all.end(), "  the 5 latest ranks (the others wait for them)");
  ASSERT_NE(latest, all.end()) << text;
  ASSERT_LT(latest + 2, all.end());
  EXPECT_EQ((latest + 2)->rfind("     37 node18 ", 0), 0u) << *(latest + 2);
  const auto hosts =
      std::find(all.begin(), all.end(), "  the 5 latest of 48 hosts (their ranks' mean lateness)");
  ASSERT_NE(hosts, all.end()) << text;
  EXPECT_EQ((hosts + 2)->rfind("  node18 ", 0), 0u) << *(hosts + 2);
  // Slowest calls: each collective on one line, standing for its calls on every rank but the straggler,
  // whose call is shorter (it arrives when the others have waited).
  const auto slowest = std::find_if(all.begin(), all.end(), [](const std::string& line) {
    return line.rfind("Slowest calls (each collective once", 0) == 0;
  });
  ASSERT_NE(slowest, all.end()) << text;
  std::set<std::string> seqs;
  for (auto line = slowest + 2; line != all.end() && !line->empty(); ++line) {
    std::istringstream fields(*line);
    std::string rank, api, size, unit, duration, duration_unit, start, start_unit, step, seq;
    fields >> rank >> api >> size >> unit >> duration >> duration_unit >> start >> start_unit >> step >> seq;
    EXPECT_TRUE(seqs.insert(seq).second) << "seq " << seq << " listed twice:\n" << text;
  }
  EXPECT_EQ(seqs.size(), 10u) << text;
  for (const auto& line : all)
    EXPECT_EQ(line.find("   95 node47"), std::string::npos) << "a rank listed: " << line;
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
    db.exec("INSERT INTO drops VALUES (3, 'call', 1200), (3, 'call_rate', 800), (3, 'cupti_record', 34)");
  }
  const std::string text = report(path);
  EXPECT_TRUE(hasLine(text, "Dropped events")) << text;
  EXPECT_TRUE(hasLine(text, "  rank     3  call                    1,200")) << text;
  EXPECT_TRUE(hasLine(text, "  rank     3  cupti_record               34")) << text;
  EXPECT_TRUE(hasLine(
      text, "  call: calls not recorded: the agent's per-thread buffer was full (GRADSCOPE_BUFFER_CALLS)"))
      << text;
  EXPECT_TRUE(hasLine(
      text, "  cupti_record: CUPTI kernel records lost: those calls' spans come from their CUDA events"))
      << text;
  EXPECT_TRUE(hasLine(text,
                      "  call_rate: calls not recorded: the thread made more calls per second than the agent "
                      "records (GRADSCOPE_MAX_CALL_RATE, 50000 by default; 0 records them all)"))
      << text;
  EXPECT_TRUE(hasLine(text, "  2,000 calls not recorded in total: the totals above miss them")) << text;
  EXPECT_EQ(text.find("none: every intercepted event"), std::string::npos);
}

TEST(Report, DropsThatLoseNoCallSaySo) {
  TempDir dir;
  const std::string path = dir.file("drops.db");
  testing::SyntheticJob job;
  testing::writeSyntheticRank(path, job, 0);
  {
    test::RawDb db(path);
    db.exec("INSERT INTO drops VALUES (0, 'nccl_profile', 86), (0, 'gpu_timing', 2)");
  }
  const std::string text = report(path);
  EXPECT_TRUE(hasLine(text,
                      "  nccl_profile: NCCL profiler reports that matched no call: those calls lack NCCL's "
                      "algorithm, protocol and channels"))
      << text;
  EXPECT_TRUE(hasLine(text, "  88 events dropped in total; every call is recorded, some with less detail"))
      << text;
  EXPECT_EQ(text.find("calls not recorded"), std::string::npos) << text;
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
  EXPECT_TRUE(hasLine(text, "  11 calls not recorded in total: the totals above miss them")) << text;
}

// ---------------------------------------------------------------------------------------------------
// Explore and apply modes

// A trace of `mode` on `world` ranks (rank ids 0..world-1, communicator "world" on each) with
// `calls_per_rank` all-reduces of `bytes` per rank, 1 ms each, and one all-gather per rank. Calls get
// ids rank * (calls_per_rank + 1) + 1.. in order. `fill` adds more rows before the file is finished.
void writeModeTrace(const std::string& path, const std::string& mode, int world, int calls_per_rank,
                    std::int64_t bytes, const std::function<void(TraceWriter&, std::int64_t run_id)>& fill) {
  TraceWriter writer = TraceWriter::create(path);
  storage::RunInfo run;
  run.uuid = mode + "-run";
  run.mode = mode;
  run.backend = Backend::Mpi;
  run.world_size = world;
  run.host = "h";
  run.epoch_ns = 1'795'000'000'000'000'000;
  const std::int64_t run_id = writer.addRun(run);
  for (int rank = 0; rank < world; ++rank) {
    const std::int64_t rank_id = writer.addRank({0, run_id, rank, "h", 100 + rank, "cpu", 0});
    const std::int64_t comm_id = writer.addComm({0, rank_id, "world", Backend::Mpi, world, rank});
    std::vector<storage::CallRecord> calls;
    for (int i = 0; i <= calls_per_rank; ++i) {
      storage::CallRecord call;
      call.rank_id = rank_id;
      call.comm_id = comm_id;
      call.seq = i;
      call.step = i;
      const bool gather = i == calls_per_rank;
      call.api = gather ? Api::MpiAllgather : Api::MpiAllreduce;
      call.dtype = DType::Fp32;
      call.op = gather ? ReduceOp::None : ReduceOp::Sum;
      call.bytes = gather ? 64 : bytes;
      call.count = call.bytes / 4;
      call.start_ns = 10'000'000 * (i + 1);
      call.enqueue_ns = call.start_ns;
      call.end_ns = call.start_ns + 1'000'000;
      calls.push_back(call);
    }
    writer.appendCalls(calls);
  }
  fill(writer, run_id);
  writer.finish(1'000'000'000);
}

// Adds a measurement of `strategy` timed on call `call_id` in `median_ns`.
void measure(TraceWriter& writer, std::int64_t run_id, std::int64_t call_id, const std::string& strategy,
             DType dtype, std::int64_t bytes, double median_ns, std::optional<double> error,
             std::int64_t overflows = 0) {
  storage::Measurement m;
  m.run_id = run_id;
  m.rank_id = 0;
  m.call_id = call_id;
  m.strategy = strategy;
  m.api = Api::MpiAllreduce;
  m.dtype = dtype;
  m.bytes = bytes;
  m.world = 4;
  m.reps = 5;
  m.min_ns = m.median_ns = m.p90_ns = m.max_ns = median_ns;
  m.rel_l2_error = error;
  m.overflow_count = overflows;
  writer.addMeasurement(m);
}

// The lines of one section: from its title (the line starting with `title`) to the next blank line.
std::vector<std::string> section(const std::string& text, const std::string& title) {
  const auto all = lines(text);
  auto begin =
      std::find_if(all.begin(), all.end(), [&](const std::string& line) { return line.starts_with(title); });
  auto end = std::find(begin, all.end(), "");
  return {begin, end};
}

TEST(Report, ExploreModeStrategiesPerBucketAgainstSumNative) {
  TempDir dir;
  const std::string path = dir.file("explore.db");
  constexpr std::int64_t kBig = 25 << 20, kScalar = 4;
  writeModeTrace(path, "explore", 4, 3, kBig, [&](TraceWriter& writer, std::int64_t run_id) {
    // 25 MiB fp32: eight lossy strategies faster than every lossless one, which the listing must still show:
    // the fastest lossless (sum/rs_ag, timed on two calls: two samples) and the baseline (sum/native: four
    // rows on one call, one sample, their median).
    for (double ms : {4.0, 4.0, 4.4, 9.0})
      measure(writer, run_id, 1, "sum/native", DType::Fp32, kBig, ms * 1e6, 1e-7);
    measure(writer, run_id, 1, "sum/rs_ag", DType::Fp32, kBig, 3.0e6, 2e-7);
    measure(writer, run_id, 2, "sum/rs_ag", DType::Fp32, kBig, 3.0e6, 1e-7);
    measure(writer, run_id, 1, "sum/hier", DType::Fp32, kBig, 3.5e6, 1e-7);
    double ms = 1.0;
    for (const char* lossy : {"sum/rs_ag/fp8e4m3", "sum/rs_ag/fp8e5m2", "sum/native/fp8e4m3",
                              "sum/native/fp8e5m2", "sum/hier/bf16", "sum/hier/fp16", "sum/rs_ag/fp16",
                              "adasum/native", "adacons/native", "sum/rs_ag/bf16"}) {
      measure(writer, run_id, 1, lossy, DType::Fp32, kBig, ms * 1e6, 1e-3);
      ms += 0.1;
    }
    measure(writer, run_id, 2, "sum/rs_ag/bf16", DType::Fp32, kBig, 2.0e6, 2.4e-3);  // worst error of its two
    // 4 B fp32: the baseline is the fastest lossless strategy.
    measure(writer, run_id, 3, "sum/native", DType::Fp32, kScalar, 20'000, 0.0);
    measure(writer, run_id, 3, "sum/rs_ag", DType::Fp32, kScalar, 30'000, std::nullopt);
    // 1 MiB bf16 without a baseline: no speedup to show.
    measure(writer, run_id, 5, "sum/rs_ag", DType::Bf16, 1 << 20, 500'000, std::nullopt);
    // A benchmark point (no call) stays in "Measured strategies".
    storage::Measurement point;
    point.run_id = run_id;
    point.strategy = "sum/ring-bench";
    point.api = Api::MpiAllreduce;
    point.bytes = 1024;
    point.world = 4;
    point.median_ns = 1000;
    writer.addMeasurement(point);
  });
  const std::string text = report(path);
  // The plan gradscope recommend makes from the explored strategies: sum/rs_ag for the 25 MiB calls, 1.2 ms
  // faster than sum/native's 4.2 ms, of which the step saves what the call had exposed (each of the
  // trace's calls lasts 1 ms, blocking).
  EXPECT_EQ(
      section(text, "Plan (gradscope recommend"),
      (std::vector<std::string>{"Plan (gradscope recommend, lossless strategies): 1 rule; reductions 28.6% "
                                "faster (1.20 ms of 4.20 ms per step);",
                                "  on the step 10.00% faster (1.00 ms of 10.0 ms)"}))
      << text;
  EXPECT_EQ(
      section(text, "Strategies measured (explore)"),
      (std::vector<std::string>{
          "Strategies measured (explore): 18 samples on 4 calls (a call's ranks merged); per API, dtype and "
          "size, "
          "fastest first",
          "    strategy                          samples     median   speedup  worst err",
          "  MPI_Allreduce fp32, 4 B - 8 B",
          "  * sum/native                              1    20.0 us     1.00x    0.0e+00",
          "    sum/rs_ag                               1    30.0 us     0.67x          -",
          "  MPI_Allreduce fp32, 16 MiB - 32 MiB",
          "    sum/rs_ag/fp8e4m3                       1    1.00 ms     4.20x    1.0e-03",
          "    sum/rs_ag/fp8e5m2                       1    1.10 ms     3.82x    1.0e-03",
          "    sum/native/fp8e4m3                      1    1.20 ms     3.50x    1.0e-03",
          "    sum/native/fp8e5m2                      1    1.30 ms     3.23x    1.0e-03",
          "    sum/hier/bf16                           1    1.40 ms     3.00x    1.0e-03",
          "    sum/hier/fp16                           1    1.50 ms     2.80x    1.0e-03",
          "    sum/rs_ag/fp16                          1    1.60 ms     2.62x    1.0e-03",
          "    adasum/native                           1    1.70 ms     2.47x    1.0e-03",
          "  * sum/rs_ag                               2    3.00 ms     1.40x    2.0e-07",
          "    sum/native                              1    4.20 ms     1.00x    1.0e-07",
          "    ... 3 more",
          "  MPI_Allreduce bf16, 1 MiB - 2 MiB",
          "  * sum/rs_ag                               1     500 us         -          -",
          "  speedup: median time of sum/native over the strategy's, on the same API, dtype and size",
          "  *: the fastest lossless strategy (a sum without a wire precision) of its API, dtype and size",
      }))
      << text;
  EXPECT_TRUE(hasLine(text, "Measured strategies (1 points; per size, fastest first)")) << text;
  EXPECT_EQ(section(text, "Measured strategies").size(), 3u) << "the title, the header, the benchmark point\n"
                                                             << text;
  EXPECT_EQ(text.find("\nConsensus"), std::string::npos) << text;
  EXPECT_EQ(text.find("\nApplied"), std::string::npos) << text;
}

// Explore mode whose budget was spent before any sampled call says so, with the fix; with some explored,
// the skipped ones are one line under the strategies.
TEST(Report, ExploreModeSaysWhenTheBudgetLeftCallsUnexplored) {
  TempDir dir;
  const std::string none = dir.file("none.db");
  const auto stats = [](int explored, int skipped) {
    return nlohmann::json{
        {"agent_ranks",
         {{{"rank", 0},
           {"calls_recorded", 4},
           {"shadow", {{"explored", explored}, {"skipped_budget", skipped}, {"skipped_other", 0}}}}}}}
        .dump();
  };
  writeModeTrace(none, "explore", 1, 3, 4096, [&](TraceWriter& writer, std::int64_t run_id) {
    writer.setRunConfig(run_id, stats(0, 36));
  });
  const std::string text = report(none);
  EXPECT_NE(
      text.find("Strategies measured (explore): none. The 36 sampled calls came when the explore budget "
                "was spent"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("--explore-budget"), std::string::npos) << text;

  const std::string some = dir.file("some.db");
  writeModeTrace(some, "explore", 1, 3, 4096, [&](TraceWriter& writer, std::int64_t run_id) {
    writer.setRunConfig(run_id, stats(1, 5));
    measure(writer, run_id, 1, "sum/native", DType::Fp32, 4096, 2e4, 1e-7);
  });
  const std::string some_text = report(some);
  EXPECT_TRUE(hasLine(some_text,
                      "  5 more sampled calls were skipped: the explore budget was spent "
                      "(--explore-budget)"))
      << some_text;
  // Observe mode, or nothing skipped: no such line.
  const std::string observed = dir.file("observe.db");
  writeModeTrace(observed, "observe", 1, 3, 4096, [](TraceWriter&, std::int64_t) {});
  EXPECT_EQ(report(observed).find("explore budget"), std::string::npos);
}

// The agent overhead section says where the NCCL calls' GPU spans came from, with the ranks when they
// differ and why a cheaper source was not used.
TEST(Report, AgentOverheadSaysWhereTheGpuSpansCameFrom) {
  TempDir dir;
  const auto rank = [](int number, const char* spans, const char* note) {
    nlohmann::json entry = {
        {"rank", number}, {"calls_recorded", 4}, {"hot_path_ns", 40}, {"gpu_spans", spans}};
    if (note != nullptr) entry["gpu_spans_note"] = note;
    return entry;
  };
  const std::string same = dir.file("same.db");
  writeModeTrace(same, "observe", 2, 3, 4096, [&](TraceWriter& writer, std::int64_t run_id) {
    writer.setRunConfig(
        run_id,
        nlohmann::json{{"agent_ranks", {rank(0, "cupti", nullptr), rank(1, "cupti", nullptr)}}}.dump());
  });
  EXPECT_TRUE(
      hasLine(report(same),
              "  GPU spans of the NCCL calls: CUPTI's kernel records (one CUDA event without timing per "
              "call)"))
      << report(same);
  const std::string mixed = dir.file("mixed.db");
  writeModeTrace(mixed, "observe", 2, 3, 4096, [&](TraceWriter& writer, std::int64_t run_id) {
    writer.setRunConfig(
        run_id,
        nlohmann::json{{"agent_ranks", {rank(0, "cupti", nullptr), rank(1, "events", "GRADSCOPE_CUPTI=0")}}}
            .dump());
  });
  const std::string text = report(mixed);
  EXPECT_TRUE(
      hasLine(text,
              "  GPU spans of the NCCL calls on rank 1: two CUDA timing events per call (~1.4 us of host "
              "time each) (GRADSCOPE_CUPTI=0)"))
      << text;
  EXPECT_TRUE(
      hasLine(text,
              "  GPU spans of the NCCL calls on rank 0: CUPTI's kernel records (one CUDA event without "
              "timing per call)"))
      << text;
  // An MPI job's agent times nothing on a GPU: no such line.
  const std::string mpi = dir.file("mpi.db");
  writeModeTrace(mpi, "observe", 1, 3, 4096, [](TraceWriter& writer, std::int64_t run_id) {
    writer.setRunConfig(run_id,
                        nlohmann::json{{"agent_ranks", {{{"rank", 0}, {"calls_recorded", 4}}}}}.dump());
  });
  EXPECT_EQ(report(mpi).find("GPU spans"), std::string::npos) << report(mpi);
}

// Explore mode names the sizes of the job's reductions that no exploration measured, the most time first,
// so that a short run says what it did not learn.
TEST(Report, ExploreModeListsTheSizesLeftUnexplored) {
  TempDir dir;
  const std::string path = dir.file("unexplored.db");
  writeModeTrace(path, "explore", 2, 3, 4096, [&](TraceWriter& writer, std::int64_t run_id) {
    measure(writer, run_id, 1, "sum/native", DType::Fp32, 1 << 20, 2e5, 1e-7);  // another size
  });
  EXPECT_EQ(section(report(path), "Not explored"),
            (std::vector<std::string>{
                "Not explored: 1 size of the job's reductions, most time first",
                "  api                        dtype                 size       calls       time",
                "  MPI_Allreduce              fp32         4 KiB - 8 KiB           6    6.00 ms",
            }))
      << report(path);
  const std::string measured = dir.file("measured.db");
  writeModeTrace(measured, "explore", 2, 3, 4096, [&](TraceWriter& writer, std::int64_t run_id) {
    measure(writer, run_id, 1, "sum/native", DType::Fp32, 4096, 2e4, 1e-7);
  });
  EXPECT_EQ(report(measured).find("Not explored"), std::string::npos) << report(measured);
}

// A wire format whose values overflowed has an error that means nothing but that: it says "overflow".
TEST(Report, AnOverflowedWireSaysOverflow) {
  TempDir dir;
  const std::string path = dir.file("overflow.db");
  writeModeTrace(path, "explore", 1, 3, 4096, [&](TraceWriter& writer, std::int64_t run_id) {
    measure(writer, run_id, 1, "sum/native", DType::Fp32, 4096, 2e4, 1e-7);
    measure(writer, run_id, 1, "sum/native/fp16", DType::Fp32, 4096, 1e4, 1.0, /*overflows=*/12);
  });
  const std::string text = report(path);
  EXPECT_TRUE(hasLine(text, "    sum/native/fp16                         1    10.0 us     2.00x   overflow"))
      << text;
  EXPECT_TRUE(hasLine(text,
                      "  overflow: values left the wire format's range in some sample (its error is "
                      "meaningless there)"))
      << text;
  EXPECT_EQ(text.find("1.0e+00"), std::string::npos) << text;
}

// The reductions explore and apply passed through (an intercommunicator's, ...), per reason over ranks.
TEST(Report, UntouchedReductionsPerReason) {
  TempDir dir;
  const std::string path = dir.file("untouched.db");
  writeModeTrace(path, "apply", 2, 3, 4096, [&](TraceWriter& writer, std::int64_t run_id) {
    const auto rank = [](int number, int inter) {
      return nlohmann::json{{"rank", number},
                            {"shadow", {{"untouched", {{"intercommunicator", inter}, {"not_prepared", 1}}}}}};
    };
    writer.setRunConfig(run_id, nlohmann::json{{"agent_ranks", {rank(0, 3), rank(1, 4)}}}.dump());
  });
  const auto lines = section(report(path), "Left untouched");
  ASSERT_EQ(lines.size(), 3u) << report(path);
  EXPECT_EQ(lines[0], "Left untouched by explore and apply (run as the job issued them, summed over ranks)");
  EXPECT_TRUE(lines[1].starts_with("  intercommunicator          7  calls on MPI intercommunicators"))
      << lines[1];
  EXPECT_TRUE(
      lines[2].starts_with("  not_prepared               2  calls on communicators the agent did not see"))
      << lines[2];
}

// The links explore timed between hosts (agent.shadow.links of each host's lowest rank): the pairs,
// slowest first, the host whose every exchange is slow, and the step analysis's pointer to it.
TEST(Report, LinksBetweenHostsNameTheSlowHost) {
  TempDir dir;
  const std::string path = writeMergedJob(dir);
  const auto link = [](const char* host, const char* peer, std::int64_t ns) {
    return nlohmann::json{{"host", host}, {"peer", peer}, {"bytes", 1 << 20}, {"ns", ns}};
  };
  const auto rank = [](int number, nlohmann::json links) {
    return nlohmann::json{{"rank", number}, {"shadow", {{"links", std::move(links)}}}};
  };
  storage::setRunConfigValue(
      path, "agent_ranks",
      nlohmann::json::array(
          {rank(0, {link("node0", "node1", 10'400'000), link("node0", "node2", 85'000'000)}),
           rank(2, {link("node1", "node0", 10'000'000), link("node1", "node2", 87'400'000)}),
           rank(4, {link("node2", "node0", 84'000'000)})})
          .dump());
  const std::string text = report(path);
  const auto lines = section(text, "Links between hosts");
  ASSERT_EQ(lines.size(), 6u) << text;
  EXPECT_EQ(lines[2], "  node1            node2                 12 MB/s    87.4 ms");
  EXPECT_EQ(lines[3], "  node0            node2               12.3 MB/s    85.0 ms");
  EXPECT_EQ(lines[4], "  node0            node1                101 MB/s    10.4 ms");
  EXPECT_EQ(lines[5],
            "  host node2's link is slow: its exchanges ran at 12.3 MB/s at best, the others' at 101 MB/s "
            "(median)");
  // Rank 1 straggles in every step of the synthetic job; the link is named beside it.
  EXPECT_TRUE(
      hasLine(text, "    host node2's link is slow (see \"Links between hosts\"): ranks after it wait on it"))
      << text;

  // Two hosts: one pair, and no verdict.
  storage::setRunConfigValue(path, "agent_ranks",
                             nlohmann::json::array({rank(0, {link("node0", "node1", 85'000'000)})}).dump());
  const auto two = section(report(path), "Links between hosts");
  ASSERT_EQ(two.size(), 4u);
  EXPECT_EQ(two[3], "  (two hosts: a slow link could be either end's; three or more tell them apart)");
}

TEST(Report, ConsensusSummaryAndItsReading) {
  const auto consensusReport = [](double cosine) {
    TempDir dir;
    const std::string path = dir.file("consensus.db");
    writeModeTrace(path, "explore", 4, 3, 1 << 20, [&](TraceWriter& writer, std::int64_t) {
      std::vector<storage::ConsensusRecord> rows;
      // Three explored reductions (steps 0..2) on four ranks, and one whose step the agent did not know.
      for (std::int64_t call = 0; call < 4; ++call)
        for (std::int64_t rank = 0; rank < 4; ++rank)
          rows.push_back({0, rank, call < 3 ? call : -1, 0.1 * static_cast<double>(rank + 1), cosine, 1.0,
                          0.25 + 0.1 * static_cast<double>(call), rank * 4 + call + 1});
      writer.appendConsensus(rows);
    });
    return report(path);
  };
  const std::string agree = consensusReport(0.9);
  EXPECT_EQ(section(agree, "Consensus"),
            (std::vector<std::string>{
                "Consensus (per rank and explored reduction)",
                "  16 rows, 3 steps with rows, 4 ranks (4 rows without a step)",
                "  alpha            mean 0.250, min 0.100",
                "  cosine to mean   mean 0.900",
                "  diversity        mean 0.400 (1/4 = 0.250 when the ranks' gradients are identical, 1 when "
                "orthogonal)",
                "  ranks agree: plain sum is fine",
            }))
      << agree;
  const std::string disagree = consensusReport(0.3);
  EXPECT_TRUE(hasLine(disagree, "  cosine to mean   mean 0.300")) << disagree;
  EXPECT_TRUE(hasLine(disagree,
                      "  ranks disagree strongly: adaptive aggregation (adacons/adasum) may matter -- see "
                      "docs/methods.md"))
      << disagree;
  EXPECT_EQ(disagree.find("plain sum is fine"), std::string::npos) << disagree;
}

TEST(Report, AppliedCallsPerStrategyAndTheReductionsLeftAlone) {
  TempDir dir;
  const std::string path = dir.file("apply.db");
  // Two ranks of five all-reduces and one all-gather: rank 0's calls are ids 1..6, rank 1's 7..12.
  writeModeTrace(path, "apply", 2, 5, 1 << 20, [](TraceWriter& writer, std::int64_t) {
    writer.appendApplied(std::vector<storage::AppliedCall>{{1, "sum/rs_ag/bf16"},
                                                           {2, "sum/rs_ag/bf16"},
                                                           {3, "sum/rs_ag/bf16"},
                                                           {7, "sum/rs_ag/bf16"},
                                                           {8, "sum/native/bf16"},
                                                           {9, "sum/native/bf16"}});
  });
  const std::string text = report(path);
  EXPECT_EQ(section(text, "Applied (apply mode)"),
            (std::vector<std::string>{
                "Applied (apply mode): 6 calls replaced with a recommended strategy",
                "  strategy                               calls      total       mean",
                "  sum/rs_ag/bf16                             4    4.00 ms    1.00 ms",
                "  sum/native/bf16                            2    2.00 ms    1.00 ms",
                "  untouched: 4 reductions ran as the job issued them",
            }))
      << text;

  // Apply mode that replaced nothing says so; other modes have no such section.
  const std::string idle = dir.file("idle.db");
  writeModeTrace(idle, "apply", 2, 5, 1 << 20, [](TraceWriter&, std::int64_t) {});
  EXPECT_EQ(section(report(idle), "Applied (apply mode)"),
            (std::vector<std::string>{"Applied (apply mode)",
                                      "  no call was replaced: every call ran as the job issued it"}));
  const std::string observe = dir.file("observe.db");
  writeModeTrace(observe, "observe", 2, 5, 1 << 20, [](TraceWriter&, std::int64_t) {});
  EXPECT_EQ(report(observe).find("Applied"), std::string::npos);
}

// Graph-captured calls: their replays (calls of their own) summed per API in a section of their own.
TEST(Report, GraphReplaysPerApi) {
  TempDir dir;
  const std::string path = dir.file("graphs.db");
  // Two ranks of two all-reduces and one all-gather (seq 0..2), on communicators 1 and 2.
  writeModeTrace(path, "observe", 2, 2, 1 << 20, [](TraceWriter& writer, std::int64_t) {
    std::vector<storage::CallRecord> replays;
    const auto replay = [&](std::int64_t rank, std::int64_t seq, Api api, std::int64_t k, std::int64_t start,
                            std::int64_t duration) {
      storage::CallRecord call;
      call.rank_id = rank;
      call.comm_id = rank + 1;
      call.seq = seq;
      call.api = api;
      call.dtype = DType::Fp32;
      call.op = api == Api::MpiAllgather ? ReduceOp::None : ReduceOp::Sum;
      call.bytes = 1 << 20;
      call.count = call.bytes / 4;
      call.enqueue_ns = call.start_ns = start;
      call.end_ns = start + duration;
      call.graph_replay = k;
      replays.push_back(call);
    };
    replay(0, 0, Api::MpiAllreduce, 1, 100'000'000, 2'000'000);
    replay(0, 0, Api::MpiAllreduce, 2, 110'000'000, 2'000'000);
    replay(0, 2, Api::MpiAllgather, 1, 120'000'000, 500'000);
    replay(1, 0, Api::MpiAllreduce, 1, 100'000'000, 4'000'000);
    writer.appendCalls(replays);
  });
  const std::string text = report(path);
  EXPECT_EQ(
      section(text, "CUDA graph replays"),
      (std::vector<std::string>{
          "CUDA graph replays (GPU executions of graph-captured calls, summed over ranks; counted above)",
          "  api                         captured     replays      total       mean",
          "  MPI_Allreduce                      2           3    8.00 ms    2.67 ms",
          "  MPI_Allgather                      1           1     500 us     500 us",
      }))
      << text;
  // The slowest call is rank 1's replay of its seq 0, which rank 0 replayed too: one line for both.
  const auto slowest = section(text, "Slowest calls");
  ASSERT_GE(slowest.size(), 3u) << text;
  EXPECT_NE(slowest[2].find("    4.00 ms"), std::string::npos) << slowest[2];
  EXPECT_NE(slowest[2].find("  0 r1      2  world"), std::string::npos) << slowest[2];
  const std::string plain = dir.file("plain.db");
  writeModeTrace(plain, "observe", 2, 2, 1 << 20, [](TraceWriter&, std::int64_t) {});
  EXPECT_EQ(report(plain).find("graph replays"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------
// The command line

TEST(Command, Version) {
  const auto result = runCli({"--version"});
  EXPECT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(result.out, "gradscope 0.1.0\n");
  EXPECT_EQ(std::string("gradscope ") + kVersion + "\n", result.out);
}

TEST(Command, HelpListsTheCommandsAndNamesTheViewer) {
  const auto result = runCli({"--help"});
  EXPECT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(result.out.find("Not built yet"), std::string::npos) << result.out;
  for (const char* part : {"report", "merge", "export", "bench", "recommend", "check",
                           "gradscope-gui TRACE.db", "run", "Exit status"})
    EXPECT_NE(result.out.find(part), std::string::npos) << "help lacks \"" << part << "\":\n" << result.out;
}

TEST(Command, SubcommandHelp) {
  for (const char* command : {"report", "merge", "export", "bench", "recommend"}) {
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
