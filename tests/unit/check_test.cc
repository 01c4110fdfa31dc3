// tuner/: `gradscope check`, the CI gate: verdicts against tolerance and noise (rank test with enough rows,
// the sweep rule with one row per bench point), exit codes, bad input, recommendation changes, and the
// markdown and JSON outputs.

#include "gradscope/tuner/check.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradscope/common/error.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "gradscope/tuner/model.h"
#include "gradscope/tuner/validate.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::tuner {
namespace {

using storage::TraceWriter;
using test::TempDir;

// One key's rows: `medians` one per row, each row's min..max spread ±`spread` around its median.
struct Point {
  std::string strategy = "sum/native";
  std::int64_t bytes = 1024;
  std::vector<double> medians;
  double spread = 0.01;
  int world = 2;
};

// A 2-rank MPI run of `mode` on host "h"; its id.
std::int64_t addRun(TraceWriter& writer, const std::string& mode, const std::string& path) {
  storage::RunInfo run;
  run.uuid = mode + "-" + path;
  run.mode = mode;
  run.backend = Backend::Mpi;
  run.world_size = 2;
  run.host = "h";
  run.epoch_ns = 1'795'000'000'000'000'000;
  return writer.addRun(run);
}

void writeTrace(const std::string& path, const std::vector<Point>& points) {
  TraceWriter writer = TraceWriter::create(path);
  const std::int64_t run_id = addRun(writer, "bench", path);
  writer.addRank({0, run_id, 0, "h", 7, "cpu", 0});
  writer.addRank({1, run_id, 1, "h", 8, "cpu", 0});
  for (const auto& point : points)
    for (double median : point.medians) {
      storage::Measurement row;
      row.run_id = run_id;
      row.strategy = point.strategy;
      row.api = Api::MpiAllreduce;
      row.dtype = DType::Fp32;
      row.bytes = point.bytes;
      row.world = point.world;
      row.reps = 20;
      row.min_ns = median * (1 - point.spread);
      row.median_ns = median;
      row.p90_ns = median * (1 + point.spread / 2);
      row.max_ns = median * (1 + point.spread);
      writer.addMeasurement(row);
    }
  writer.finish(1'000'000);
}

// `rows` distinct samples around `center`: a small deterministic jitter (within ±1.5% for up to 8 rows).
std::vector<double> samples(double center, int rows) {
  std::vector<double> values;
  for (int i = 0; i < rows; ++i) values.push_back(center * (1 + 0.004 * i - 0.014));
  return values;
}

// A bench-like sweep: one row per size from 8 B to 512 KiB (factor 4), `scale` times a base time.
std::vector<Point> sweep(const std::string& strategy, double scale, double spread = 0.02) {
  std::vector<Point> points;
  for (std::int64_t bytes = 8; bytes <= 512 * 1024; bytes *= 4)
    points.push_back({strategy, bytes, {scale * (2000 + static_cast<double>(bytes) / 4)}, spread});
  return points;
}

template <typename T>
std::vector<T> operator+(std::vector<T> a, const std::vector<T>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct CheckRun {
  int exit_code = -1;
  std::string out, err;
};

CheckRun runCheck(const std::string& baseline, const std::string& current, CheckCommand command = {},
                  const std::function<std::string(const std::string&)>& recommend = {}) {
  command.baseline = baseline;
  command.current = current;
  std::ostringstream out, err;
  CheckRun run;
  run.exit_code = runCheckCommand(command, recommend, out, err);
  run.out = out.str();
  run.err = err.str();
  return run;
}

const KeyComparison* find(const CheckResult& result, const std::string& strategy, std::int64_t bytes) {
  for (const auto& c : result.comparisons)
    if (c.key.strategy == strategy && c.key.bytes == bytes) return &c;
  return nullptr;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// --min-step-gain gates on proof: the gain's whole 95% interval must reach the minimum. A run whose interval
// spans a slowdown passes no minimum, whatever its point estimate (a noisy run measured "71% faster
// [-51%, 90%]" and passed a 50% gate on its point estimate).
TEST(CheckStepGain, PassesOnlyWhenTheWholeIntervalReachesTheMinimum) {
  TempDir dir;
  const auto traceWith = [&](const std::string& name, double change, double low, double high) {
    Validation validation;
    validation.window_calls = 14;
    validation.windows_with = validation.windows_without = 29;
    validation.steps_with = validation.steps_without = 60;
    validation.step_without_ns = 1'000'000;
    validation.step_with_ns = 1'000'000 * (1 + change);
    validation.change = change, validation.change_low = low, validation.change_high = high;
    const std::string path = dir.file(name + ".db");
    TraceWriter writer = TraceWriter::create(path);
    storage::RunInfo run;
    run.uuid = name;
    run.mode = "apply";
    run.backend = Backend::Mpi;
    run.world_size = 2;
    run.host = "h";
    run.config_json =
        nlohmann::json{{"validation", nlohmann::json::parse(validationJson(validation))}}.dump();
    writer.addRun(run);
    writer.finish(1'000'000);
    return path;
  };
  CheckCommand gate;
  gate.min_step_gain = 0.02;
  // 5% faster, between 3% and 7%: at least 2%.
  CheckRun proven = runCheck("", traceWith("proven", -0.05, -0.07, -0.03), gate);
  EXPECT_EQ(proven.exit_code, kCheckExitOk) << proven.out << proven.err;
  EXPECT_TRUE(proven.out.starts_with("OK: the plan made the step 5.00% faster [3.00%, 7.00%]")) << proven.out;
  // 1% faster: below the minimum.
  CheckRun below = runCheck("", traceWith("below", -0.01, -0.015, -0.005), gate);
  EXPECT_EQ(below.exit_code, kCheckExitRegression);
  EXPECT_NE(below.out.find("--min-step-gain 2.00%: below it"), std::string::npos) << below.out;
  // 71% faster on its point estimate, but anywhere from 51% slower to 90% faster: not shown.
  gate.min_step_gain = 0.5;
  CheckRun noisy = runCheck("", traceWith("noisy", -0.71, -0.90, 0.51), gate);
  EXPECT_EQ(noisy.exit_code, kCheckExitRegression);
  EXPECT_TRUE(noisy.out.starts_with("REGRESSION: the plan made the step 71.00% faster [-51.00%, 90.00%]"))
      << noisy.out;
  EXPECT_NE(noisy.out.find("its 95% interval reaches below it"), std::string::npos) << noisy.out;
}

TEST(CheckStatistics, RankTestsGiveExactTails) {
  // Completely separated 8 against 8: one arrangement of C(16, 8) = 12870.
  EXPECT_NEAR(mannWhitneyGreater(samples(1000, 8), samples(1200, 8)), 1.0 / 12870, 1e-12);
  EXPECT_NEAR(mannWhitneyGreater(samples(1200, 8), samples(1000, 8)), 1.0, 1e-12);
  // 4 against 4 cannot reach 0.01: 1/70 at best (why the rank test needs more rows).
  EXPECT_NEAR(mannWhitneyGreater(samples(1000, 4), samples(1200, 4)), 1.0 / 70, 1e-12);
  // All of 9 differences positive: 2^-9; zeros are dropped; symmetric data gives about one half.
  EXPECT_NEAR(wilcoxonGreater({1, 2, 3, 4, 5, 6, 7, 8, 9}), 1.0 / 512, 1e-12);
  EXPECT_NEAR(wilcoxonGreater({0, 0, 1, 2}), 0.25, 1e-12);
  EXPECT_NEAR(wilcoxonGreater({-1, 1}), 0.75, 1e-12);
  EXPECT_DOUBLE_EQ(wilcoxonGreater({}), 1.0);
}

TEST(CheckTolerance, ParsesPercentAndFraction) {
  EXPECT_DOUBLE_EQ(parseTolerance("5%"), 0.05);
  EXPECT_DOUBLE_EQ(parseTolerance("0.05"), 0.05);
  EXPECT_DOUBLE_EQ(parseTolerance("12.5%"), 0.125);
  EXPECT_THROW(parseTolerance("5"), Error);
  EXPECT_THROW(parseTolerance("five"), Error);
  EXPECT_THROW(parseTolerance("-1%"), Error);
  EXPECT_THROW(parseTolerance("%"), Error);
  // Found by tests/fuzz/cli_arguments: from_chars reads "inf", and inf% is no tolerance at all.
  EXPECT_THROW(parseTolerance("inf%"), Error);
  EXPECT_THROW(parseTolerance("infinity%"), Error);
  EXPECT_THROW(parseTolerance("nan%"), Error);
}

TEST(Check, IdenticalTracesPass) {
  TempDir dir;
  const auto points = std::vector<Point>{{"sum/native", 1024, samples(1000, 8)}} + sweep("sum/rs_ag", 1);
  writeTrace(dir.file("a.db"), points);
  writeTrace(dir.file("b.db"), points);
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(result.exitCode(), 0);
  EXPECT_EQ(result.comparisons.size(), 10u);
  EXPECT_EQ(result.count(Verdict::Unchanged), 10);
  const CheckRun run = runCheck(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("OK: 10 compared, 0 regressed"), std::string::npos) << run.out;
}

TEST(Check, SlowdownWithManyRowsIsARegression) {
  TempDir dir;
  writeTrace(dir.file("a.db"),
             {{"sum/native", 1024, samples(1000, 8)}, {"sum/rs_ag", 1024, samples(900, 8)}});
  writeTrace(dir.file("b.db"),
             {{"sum/native", 1024, samples(1200, 8)}, {"sum/rs_ag", 1024, samples(900, 8)}});
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  ASSERT_EQ(result.comparisons.size(), 2u);
  const auto& first = result.comparisons.front();  // regressions first
  EXPECT_EQ(first.key.strategy, "sum/native");
  EXPECT_EQ(first.verdict, Verdict::Regression);
  EXPECT_EQ(first.test, "mann-whitney");
  EXPECT_NEAR(first.change, 0.2, 1e-9);
  ASSERT_TRUE(first.p_value);
  EXPECT_LT(*first.p_value, 0.01);
  EXPECT_EQ(result.comparisons.back().verdict, Verdict::Unchanged);

  const CheckRun run = runCheck(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.out.find("REGRESSION: 2 compared, 1 regressed"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("regression   sum/native"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("+20.0%"), std::string::npos) << run.out;
}

TEST(Check, SlowdownInsideOverlappingSpreadsIsNoisy) {
  TempDir dir;
  // One row each, 20% slower, but each row's ranks spread ±15%: the intervals overlap.
  writeTrace(dir.file("a.db"), {{"sum/native", 1024, {1000}, 0.15}});
  writeTrace(dir.file("b.db"), {{"sum/native", 1024, {1200}, 0.15}});
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  ASSERT_EQ(result.comparisons.size(), 1u);
  EXPECT_EQ(result.comparisons[0].verdict, Verdict::Noisy);
  EXPECT_EQ(result.comparisons[0].test, "sweep");
  EXPECT_NE(result.comparisons[0].reason.find("ranges overlap"), std::string::npos);
  EXPECT_EQ(result.exitCode(), 0);
}

TEST(Check, SlowdownWithinToleranceIsUnchanged) {
  TempDir dir;
  writeTrace(dir.file("a.db"), {{"sum/native", 1024, samples(1000, 8)}});
  writeTrace(dir.file("b.db"), {{"sum/native", 1024, samples(1030, 8)}});
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(result.comparisons[0].verdict, Verdict::Unchanged);
  EXPECT_EQ(result.exitCode(), 0);
  // The same 3% fails a 2% tolerance: the rows are well apart.
  CheckOptions strict;
  strict.tolerance = 0.02;
  EXPECT_EQ(checkTraces(dir.file("a.db"), dir.file("b.db"), strict).exitCode(), 1);
}

TEST(Check, ImprovementIsReportedAndPasses) {
  TempDir dir;
  writeTrace(dir.file("a.db"), {{"sum/native", 1024, samples(1000, 8)}});
  writeTrace(dir.file("b.db"), {{"sum/native", 1024, samples(700, 8)}});
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(result.comparisons[0].verdict, Verdict::Improvement);
  EXPECT_NEAR(result.comparisons[0].change, -0.3, 1e-9);
  const CheckRun run = runCheck(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_NE(run.out.find("improvement  sum/native"), std::string::npos) << run.out;
}

TEST(Check, BenchSweepSlowerAsAWholeIsARegression) {
  TempDir dir;
  // Bench traces: one row per point. sum/rs_ag is 20% slower at every size; the others are not.
  writeTrace(dir.file("a.db"), sweep("sum/native", 1) + sweep("sum/rs_ag", 1) + sweep("sum/hier", 1));
  writeTrace(dir.file("b.db"), sweep("sum/native", 1.01) + sweep("sum/rs_ag", 1.2) + sweep("sum/hier", 0.99));
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(result.count(Verdict::Regression), 9);
  EXPECT_EQ(result.count(Verdict::Unchanged), 18);
  for (const auto& c : result.comparisons) {
    if (c.verdict == Verdict::Regression) {
      EXPECT_EQ(c.key.strategy, "sum/rs_ag");
    }
  }
  EXPECT_EQ(result.exitCode(), 1);
}

TEST(Check, BenchStallAtOneSizeIsNoisy) {
  TempDir dir;
  // A descheduled rank makes one point of a repeat run 50x slower, its interval far above the baseline's:
  // the rest of its sweep did not move, so it is noise, not a regression.
  auto stalled = sweep("sum/rs_ag", 1);
  stalled[4].medians[0] *= 50;
  writeTrace(dir.file("a.db"), sweep("sum/native", 1) + sweep("sum/rs_ag", 1));
  writeTrace(dir.file("b.db"), sweep("sum/native", 1) + stalled);
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  const KeyComparison* point = find(result, "sum/rs_ag", stalled[4].bytes);
  ASSERT_NE(point, nullptr);
  EXPECT_EQ(point->verdict, Verdict::Noisy);
  EXPECT_NE(point->reason.find("Wilcoxon"), std::string::npos) << point->reason;
  EXPECT_EQ(result.exitCode(), 0);
}

TEST(Check, BenchSweepShiftInsideRunToRunSpreadIsNoisy) {
  TempDir dir;
  // A repeat on a loaded machine moves whole sweeps by different amounts (here -4%..+8%): a sweep 9%
  // slower is within that spread, though every one of its points is slower beyond tolerance.
  const std::vector<double> shifts = {0.96, 1.0, 1.03, 1.05, 1.08, 1.09};
  std::vector<Point> base, current;
  for (std::size_t i = 0; i < shifts.size(); ++i) {
    base = base + sweep("s" + std::to_string(i), 1, 0.01);
    current = current + sweep("s" + std::to_string(i), shifts[i], 0.01);
  }
  writeTrace(dir.file("a.db"), base);
  writeTrace(dir.file("b.db"), current);
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(result.count(Verdict::Regression), 0);
  const KeyComparison* point = find(result, "s5", 8);
  ASSERT_NE(point, nullptr);
  EXPECT_EQ(point->verdict, Verdict::Noisy);
  EXPECT_NE(point->reason.find("run-to-run spread"), std::string::npos) << point->reason;
}

// Explore traces: a key's rows come from explorations, each timed on one call of every rank.
struct Exploration {
  std::string strategy = "sum/native";
  std::int64_t bytes = 1024;
  std::vector<std::vector<double>> medians;  // per exploration, one median per rank
};

void writeExploreTrace(const std::string& path, const std::vector<Exploration>& keys) {
  TraceWriter writer = TraceWriter::create(path);
  const std::int64_t run_id = addRun(writer, "explore", path);
  std::int64_t comm_ids[2];
  for (int rank = 0; rank < 2; ++rank) {
    writer.addRank({rank, run_id, rank, "h", 7 + rank, "cpu", 0});
    comm_ids[rank] = writer.addComm({0, rank, "world", Backend::Mpi, 2, rank});
  }
  std::int64_t seq = 0;
  for (const auto& key : keys)
    for (const auto& ranks : key.medians) {
      for (int rank = 0; rank < 2; ++rank) {
        storage::CallRecord call;
        call.rank_id = rank;
        call.comm_id = comm_ids[rank];
        call.seq = seq;
        call.api = Api::MpiAllreduce;
        call.dtype = DType::Fp32;
        call.op = ReduceOp::Sum;
        call.bytes = key.bytes;
        call.count = key.bytes / 4;
        call.start_ns = call.enqueue_ns = 1000 * seq;
        call.end_ns = call.start_ns + 500;
        const std::int64_t call_id = writer.appendCalls(std::span(&call, 1));
        storage::Measurement row;
        row.run_id = run_id;
        row.rank_id = rank;
        row.call_id = call_id;
        row.strategy = key.strategy;
        row.api = Api::MpiAllreduce;
        row.dtype = DType::Fp32;
        row.bytes = key.bytes;
        row.world = 2;
        row.reps = 10;
        const double median = ranks[static_cast<std::size_t>(rank)];
        row.min_ns = median * 0.7;  // one slow and one fast repetition: wide min..max
        row.median_ns = median;
        row.p90_ns = median * 1.05;
        row.max_ns = median * 1.6;
        row.rel_l2_error = rank == 0 ? 1e-7 : 3e-7;
        writer.addMeasurement(row);
      }
      ++seq;
    }
  writer.finish(1'000'000);
}

// Three explorations of each of six sizes, both ranks within 1% of each other, `scale` times a base time.
std::vector<Exploration> exploreSweep(const std::string& strategy, double scale) {
  std::vector<Exploration> keys;
  for (std::int64_t bytes : {40, 128, 512, 1280, 16384, 32768}) {
    Exploration key{strategy, bytes, {}};
    const double base = scale * (1000 + static_cast<double>(bytes) / 4);
    for (double jitter : {0.98, 1.0, 1.02}) key.medians.push_back({base * jitter, base * jitter * 1.01});
    keys.push_back(key);
  }
  return keys;
}

TEST(CheckSamples, TheRanksOfOneExplorationAreOneSample) {
  TempDir dir;
  writeExploreTrace(dir.file("a.db"), {{"sum/native", 1024, {{1000, 1010}, {1100, 1090}, {900, 950}}}});
  const auto rows = loadMeasurements(storage::TraceReader::open(dir.file("a.db")));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].measurement.median_ns, 1005);  // the median over the ranks
  EXPECT_EQ(rows[1].measurement.median_ns, 1095);
  EXPECT_EQ(rows[2].measurement.median_ns, 925);
  EXPECT_FALSE(rows[0].measurement.rank_id.has_value());
  EXPECT_DOUBLE_EQ(rows[0].measurement.min_ns, 700);   // the smallest of the ranks' minima
  EXPECT_DOUBLE_EQ(rows[0].measurement.max_ns, 1616);  // the largest of their maxima
  EXPECT_EQ(rows[0].measurement.rel_l2_error, 3e-7);   // the worse rank's error
  EXPECT_EQ(rows[0].backend, Backend::Mpi);
}

TEST(Check, ExploreRanksDoNotDoubleTheEvidence) {
  TempDir dir;
  // One key, 10% slower, three explorations a side; counted per rank (6 against 6 rows) a rank test gave
  // p = 0.001, but two ranks timing one collective are one sample: 3 against 3 cannot reach p < 0.01.
  writeExploreTrace(dir.file("a.db"), {{"sum/native", 1024, {{1000, 1005}, {990, 995}, {1010, 1012}}}});
  writeExploreTrace(dir.file("b.db"), {{"sum/native", 1024, {{1100, 1104}, {1090, 1096}, {1110, 1113}}}});
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  ASSERT_EQ(result.comparisons.size(), 1u);
  EXPECT_EQ(result.comparisons[0].baseline_rows, 3);
  EXPECT_EQ(result.comparisons[0].current_rows, 3);
  EXPECT_EQ(result.comparisons[0].verdict, Verdict::Noisy) << result.comparisons[0].reason;
  EXPECT_EQ(result.exitCode(), 0);
}

TEST(Check, ExploreSweepSlowerAtEverySizeIsARegression) {
  TempDir dir;
  // A job's explorations: six sizes, three explorations each. sum/rs_ag is 25% slower at every size, the
  // other strategies are not: six sizes are too few for a test over the sizes, the 36 samples are not.
  writeExploreTrace(dir.file("a.db"), exploreSweep("sum/native", 1) + exploreSweep("sum/rs_ag", 1) +
                                          exploreSweep("sum/hier", 1));
  writeExploreTrace(dir.file("b.db"), exploreSweep("sum/native", 1.01) + exploreSweep("sum/rs_ag", 1.25) +
                                          exploreSweep("sum/hier", 0.99));
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(result.count(Verdict::Regression), 6);
  for (const auto& c : result.comparisons)
    if (c.verdict == Verdict::Regression) {
      EXPECT_EQ(c.key.strategy, "sum/rs_ag");
      EXPECT_NE(c.reason.find("Mann-Whitney of 36 samples"), std::string::npos) << c.reason;
    }
  EXPECT_EQ(result.exitCode(), 1);
}

TEST(CheckBadInput, ExitsTwoWithOneLine) {
  TempDir dir;
  writeTrace(dir.file("a.db"), {{"sum/native", 1024, samples(1000, 8)}});

  CheckRun run = runCheck(dir.file("missing.db"), dir.file("a.db"));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("missing.db: no such file"), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find('\n'), run.err.size() - 1) << run.err;

  {
    std::ofstream text(dir.file("notes.db"));
    text << "not a database, just text\n";
  }
  run = runCheck(dir.file("a.db"), dir.file("notes.db"));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("notes.db"), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find('\n'), run.err.size() - 1) << run.err;

  writeTrace(dir.file("empty.db"), {});
  run = runCheck(dir.file("a.db"), dir.file("empty.db"));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("empty.db: the current trace has no measurements"), std::string::npos) << run.err;

  writeTrace(dir.file("other.db"), {{"sum/rs_ag", 4096, samples(1000, 8)}});
  run = runCheck(dir.file("a.db"), dir.file("other.db"));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("no measurement in common"), std::string::npos) << run.err;

  writeTrace(dir.file("world4.db"), {{"sum/native", 1024, samples(1000, 8), 0.01, 4}});
  run = runCheck(dir.file("a.db"), dir.file("world4.db"));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("world sizes never match (baseline 2, current 4)"), std::string::npos) << run.err;

  CheckCommand unrecommendable;
  unrecommendable.fail_on_change = true;
  run = runCheck(dir.file("a.db"), dir.file("a.db"), unrecommendable);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("--fail-on-change needs the recommender"), std::string::npos) << run.err;
}

// Two observed runs (no measurements) of the synthetic job, merged: compared step by step.
std::string writeObservedJob(const TempDir& dir, const std::string& name, const testing::SyntheticJob& job) {
  std::vector<std::string> files;
  const std::string ranks = dir.makeSubdir(name);
  for (int rank = 0; rank < job.ranks; ++rank) {
    files.push_back(fmt::format("{}/rank-{}.db", ranks, rank));
    testing::writeSyntheticRank(files.back(), job, rank);
  }
  const std::string merged = dir.file(name + ".db");
  storage::mergeTraces(files, merged, {});
  return merged;
}

const RunComparison* figure(const CheckResult& result, std::string_view what) {
  for (const auto& c : result.runs)
    if (c.what == what) return &c;
  return nullptr;
}

TEST(CheckRuns, TwoObservedRunsOfTheSameJobPass) {
  TempDir dir;
  testing::SyntheticJob job;
  job.steps = 40;
  const std::string before = writeObservedJob(dir, "before", job);
  job.seed = 7;  // the same job, other noise
  const std::string after = writeObservedJob(dir, "after", job);
  const CheckResult result = checkTraces(before, after);
  EXPECT_TRUE(result.comparisons.empty());
  ASSERT_GE(result.runs.size(), 5u);
  EXPECT_EQ(result.runs[0].what, "step time");
  EXPECT_EQ(result.runs[1].what, "compute");
  EXPECT_EQ(result.runs[2].what, "exposed communication");
  EXPECT_EQ(result.runs[3].what, "waiting");
  ASSERT_NE(figure(result, "MPI_Allreduce 16 MiB"), nullptr);
  EXPECT_EQ(result.runs[0].baseline_steps, 40);
  EXPECT_EQ(result.count(Verdict::Regression), 0);
  EXPECT_EQ(result.exitCode(), kCheckExitOk);
  std::ostringstream text;
  writeCheckText(result, text);
  EXPECT_NE(text.str().find("The runs, step by step (40 against 40 steps; medians per step):"),
            std::string::npos)
      << text.str();
  const auto json = nlohmann::json::parse(checkJson(result));
  EXPECT_EQ(json["runs"].size(), result.runs.size());
  EXPECT_EQ(json["runs"][0]["figure"], "step time");
}

// A GPU job: the step's time over every step, its breakdown over the steps the agent's windows measured.
TEST(CheckRuns, AGpuJobsBreakdownComesFromItsMeasuredSteps) {
  TempDir dir;
  testing::SyntheticJob job;
  job.steps = 40;
  job.gpu = true;
  const std::string before = writeObservedJob(dir, "before", job);
  job.seed = 7;
  const std::string after = writeObservedJob(dir, "after", job);
  const CheckResult result = checkTraces(before, after);
  ASSERT_GE(result.runs.size(), 4u);
  EXPECT_EQ(result.runs[0].what, "step time");
  EXPECT_EQ(result.runs[0].baseline_steps, 40);
  EXPECT_EQ(result.runs[2].what, "exposed communication");
  EXPECT_EQ(result.runs[2].baseline_steps, 5);  // steps 1-5, inside the window
  EXPECT_GT(result.runs[2].baseline_ns, 0);
  EXPECT_EQ(result.count(Verdict::Regression), 0);
}

TEST(CheckRuns, MoreGradientBytesMakeTheStepARegression) {
  TempDir dir;
  testing::SyntheticJob job;
  job.steps = 40;
  const std::string before = writeObservedJob(dir, "before", job);
  job.seed = 7;
  job.model_bytes = 200ll << 20;  // twice the gradients: twice the reductions' time, exposed
  const std::string after = writeObservedJob(dir, "after", job);
  const CheckResult result = checkTraces(before, after);
  const RunComparison* step = figure(result, "step time");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->verdict, Verdict::Regression) << step->reason;
  EXPECT_GT(step->change, 0.1);
  ASSERT_TRUE(step->p_value.has_value());
  EXPECT_LT(*step->p_value, 0.01);
  EXPECT_EQ(figure(result, "exposed communication")->verdict, Verdict::Regression);
  EXPECT_EQ(result.exitCode(), kCheckExitRegression);
  // And back: an improvement, which passes.
  const CheckResult back = checkTraces(after, before);
  EXPECT_EQ(figure(back, "step time")->verdict, Verdict::Improvement);
  EXPECT_EQ(back.exitCode(), kCheckExitOk);
}

// Steps written directly (the step model's rows, one rank): `exposed` of each step's 1,100 ns exposed, the
// rest compute, with a little jitter from step to step.
std::string writeSteps(const TempDir& dir, const std::string& name, std::int64_t exposed) {
  const std::string path = dir.file(name);
  TraceWriter writer = TraceWriter::create(path);
  const std::int64_t run_id = addRun(writer, "observe", path);
  writer.addRank({0, run_id, 0, "h", 7, "cpu", 0});
  std::vector<storage::StepRecord> rows;
  for (std::int64_t step = 0; step < 32; ++step) {
    const std::int64_t span = 1100 + step % 3, start = step * 2000;
    rows.push_back({0, step, start, start + span, span - exposed - step % 2, exposed + step % 2, 0, 0, 0, 1});
  }
  writer.appendSteps(rows);
  writer.finish(100'000);
  return path;
}

TEST(CheckRuns, APartThatMovesInsideAnUnchangedStepIsNoisy) {
  TempDir dir;
  const std::string before = writeSteps(dir, "before.db", 100), after = writeSteps(dir, "after.db", 300);
  const CheckResult result = checkTraces(before, after);
  ASSERT_NE(figure(result, "step time"), nullptr);
  EXPECT_EQ(figure(result, "step time")->verdict, Verdict::Unchanged);
  const RunComparison* exposed = figure(result, "exposed communication");
  ASSERT_NE(exposed, nullptr);
  EXPECT_EQ(exposed->verdict, Verdict::Noisy) << exposed->reason;
  EXPECT_NE(exposed->reason.find("the step time is not slower: a shift inside the step"), std::string::npos)
      << exposed->reason;
  EXPECT_EQ(figure(result, "compute")->verdict, Verdict::Noisy);  // faster, but not the step
  EXPECT_EQ(result.exitCode(), kCheckExitOk);
}

// The validation of an apply run (tuner/validate.h) as stored in the trace, and its one line.
TEST(Validation, StoredAndDescribed) {
  Validation v;
  v.window_calls = 70;
  v.steps_with = 750, v.steps_without = 750, v.windows_with = 74, v.windows_without = 74;
  v.step_with_ns = 3.0e6, v.step_without_ns = 3.1e6;
  v.change = -0.032, v.change_low = -0.041, v.change_high = -0.022;
  EXPECT_EQ(parseValidation(validationJson(v)), v);
  EXPECT_NE(describe(v).find("no prediction"), std::string::npos) << describe(v);
  v.predicted_change = -0.03, v.predicted_low = -0.035, v.predicted_high = -0.025;
  EXPECT_EQ(parseValidation(validationJson(v)), v);
  EXPECT_NE(describe(v).find(
                "step time with the plan -3.20% [-4.10%, -2.20%] against without (74 windows with it, "
                "74 without, of 70 calls a communicator; 750 and 750 steps); predicted -3.00% [-3.50%, "
                "-2.50%]: the measurement is inside the prediction's interval"),
            std::string::npos)
      << describe(v);
  v.predicted_change = -0.001, v.predicted_low = -0.002, v.predicted_high = 0;
  EXPECT_NE(describe(v).find("the measurement and the prediction disagree"), std::string::npos)
      << describe(v);
  EXPECT_FALSE(parseValidation("{\"window_calls\": 3}").has_value());
  EXPECT_FALSE(parseValidation("not json").has_value());
}

TEST(CheckRuns, TooFewStepsFallBackToMeasurements) {
  TempDir dir;
  testing::SyntheticJob job;
  job.steps = 10;  // under 2 x kRunBlocks
  const std::string short_run = writeObservedJob(dir, "short", job);
  CheckRun run = runCheck(short_run, short_run);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(
      run.err.find("has no measurements (record it with gradscope bench or gradscope run --mode explore), "
                   "and two runs are compared only when both have at least 16 steps"),
      std::string::npos)
      << run.err;
}

TEST(Check, KeysInOneTraceOnlyAreListedNotCompared) {
  TempDir dir;
  writeTrace(dir.file("a.db"),
             {{"sum/native", 1024, samples(1000, 8)}, {"sum/hier", 1024, samples(1000, 8)}});
  writeTrace(dir.file("b.db"),
             {{"sum/native", 1024, samples(1000, 8)}, {"sum/rs_ag", 1024, samples(1000, 8)}});
  const CheckResult result = checkTraces(dir.file("a.db"), dir.file("b.db"));
  EXPECT_EQ(result.comparisons.size(), 1u);
  ASSERT_EQ(result.not_compared.size(), 2u);
  EXPECT_EQ(result.not_compared[0].key.strategy, "sum/hier");
  EXPECT_TRUE(result.not_compared[0].in_baseline);
  EXPECT_EQ(result.not_compared[1].key.strategy, "sum/rs_ag");
  EXPECT_FALSE(result.not_compared[1].in_baseline);
}

// A recommender stand-in: the rule for 0..65536 bytes picks sum/rs_ag for traces whose name has "b".
std::string fakeRecommendation(const std::string& path) {
  const bool changed = path.find("b.db") != std::string::npos;
  nlohmann::json rules = nlohmann::json::array();
  rules.push_back({{"api", "MPI_Allreduce"},
                   {"dtype", "fp32"},
                   {"min_bytes", 0},
                   {"max_bytes", 65536},
                   {"strategy", changed ? "sum/rs_ag" : "sum/native"}});
  rules.push_back({{"api", "MPI_Allreduce"},
                   {"dtype", "fp32"},
                   {"min_bytes", 65537},
                   {"max_bytes", 1 << 30},
                   {"strategy", "sum/hier"}});
  return nlohmann::json{{"version", 1}, {"rules", rules}}.dump();
}

TEST(Check, FailOnChangeExitsThreeAndNamesTheRule) {
  TempDir dir;
  const std::vector<Point> same = {{"sum/native", 1024, samples(1000, 8)}};
  writeTrace(dir.file("a.db"), same);
  writeTrace(dir.file("b.db"), same);
  writeTrace(dir.file("a2.db"), same);
  CheckCommand command;
  command.fail_on_change = true;
  CheckRun run = runCheck(dir.file("a.db"), dir.file("b.db"), command, fakeRecommendation);
  EXPECT_EQ(run.exit_code, 3) << run.err;
  EXPECT_NE(
      run.out.find("Recommendation changed (1 rules):\n  MPI_Allreduce fp32 0..65536 bytes: sum/native -> "
                   "sum/rs_ag\n"),
      std::string::npos)
      << run.out;
  // Same recommendation: 0. Without --fail-on-change the recommender is not even asked.
  run = runCheck(dir.file("a.db"), dir.file("a2.db"), command, fakeRecommendation);
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find("Recommendation: unchanged"), std::string::npos) << run.out;
  run = runCheck(dir.file("a.db"), dir.file("b.db"), {}, [](const std::string&) -> std::string {
    ADD_FAILURE() << "asked for a recommendation without --fail-on-change";
    return "{}";
  });
  EXPECT_EQ(run.exit_code, 0);

  // A regression wins over a changed recommendation.
  writeTrace(dir.file("slow-b.db"), {{"sum/native", 1024, samples(1300, 8)}});
  run = runCheck(dir.file("a.db"), dir.file("slow-b.db"), command, fakeRecommendation);
  EXPECT_EQ(run.exit_code, 1);
  // A broken recommendation is bad input.
  run = runCheck(dir.file("a.db"), dir.file("b.db"), command,
                 [](const std::string&) { return std::string("[1"); });
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("not a valid recommendation file"), std::string::npos) << run.err;
}

TEST(CheckOutputs, MarkdownSummaryForCiPages) {
  TempDir dir;
  writeTrace(dir.file("a.db"), {{"sum/native", 1024, samples(1000, 8)},
                                {"sum/rs_ag", 1024, samples(1000, 8)},
                                {"sum/hier", 1024, samples(1000, 8)},
                                {"sum/only-base", 1024, samples(1000, 8)}});
  writeTrace(dir.file("b.db"), {{"sum/native", 1024, samples(1250, 8)},
                                {"sum/rs_ag", 1024, samples(800, 8)},
                                {"sum/hier", 1024, samples(1000, 8)}});
  CheckCommand command;
  command.summary_path = dir.file("summary.md");
  command.json_path = dir.file("check.json");
  {
    std::ofstream earlier(command.summary_path);
    earlier << "earlier step\n";
  }
  const CheckRun run = runCheck(dir.file("a.db"), dir.file("b.db"), command);
  EXPECT_EQ(run.exit_code, 1);
  const std::string summary = readFile(command.summary_path);
  const std::string expected =
      "earlier step\n"
      "### ❌ gradscope check: 1 regression beyond 5.0% and noise\n"
      "\n"
      "Current `" +
      dir.file("b.db") + "` against baseline `" + dir.file("a.db") +
      "`: 3 compared, 1 regressed, 1 improved.\n"
      "\n"
      "| | strategy | collective | dtype | size | world | baseline | current | change | evidence |\n"
      "|---|---|---|---|---:|---:|---:|---:|---:|---|\n";
  EXPECT_EQ(summary.substr(0, expected.size()), expected) << summary;
  EXPECT_NE(summary.find("| ❌ regression | `sum/native` | all_reduce | fp32 |"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("| ✅ improvement | `sum/rs_ag` | all_reduce | fp32 |"), std::string::npos)
      << summary;
  EXPECT_LT(summary.find("❌ regression |"), summary.find("✅ improvement |"));
  EXPECT_NE(summary.find("<details><summary>1 unchanged, 0 noisy, 1 not compared</summary>"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("</details>\n"), std::string::npos);

  EXPECT_EQ(test::fileMode(command.json_path), 0600u);
  const auto json = nlohmann::json::parse(readFile(command.json_path));
  EXPECT_EQ(json["version"], 1);
  EXPECT_EQ(json["exit_code"], 1);
  EXPECT_DOUBLE_EQ(json["tolerance"].get<double>(), 0.05);
  EXPECT_EQ(json["totals"]["compared"], 3);
  EXPECT_EQ(json["totals"]["regression"], 1);
  EXPECT_EQ(json["totals"]["improvement"], 1);
  EXPECT_EQ(json["totals"]["unchanged"], 1);
  EXPECT_EQ(json["totals"]["not_compared"], 1);
  const auto& first = json["comparisons"][0];
  EXPECT_EQ(first["strategy"], "sum/native");
  EXPECT_EQ(first["collective"], "all_reduce");
  EXPECT_EQ(first["dtype"], "fp32");
  EXPECT_EQ(first["bytes"], 1024);
  EXPECT_EQ(first["world"], 2);
  EXPECT_EQ(first["verdict"], "regression");
  EXPECT_EQ(first["test"], "mann-whitney");
  EXPECT_LT(first["p_value"].get<double>(), 0.01);
  EXPECT_EQ(first["baseline_rows"], 8);
  EXPECT_NEAR(first["change"].get<double>(), 0.25, 1e-9);
  EXPECT_EQ(json["comparisons"][2]["verdict"], "unchanged");
  EXPECT_TRUE(json["comparisons"][2]["p_value"].is_null());
  EXPECT_EQ(json["not_compared"][0]["strategy"], "sum/only-base");
  EXPECT_EQ(json["not_compared"][0]["only_in"], "baseline");
  EXPECT_TRUE(json["recommendation"].is_null());
}

TEST(CheckOutputs, PassingSummaryHasTheGreenHeadline) {
  TempDir dir;
  writeTrace(dir.file("a.db"), {{"sum/native", 1024, samples(1000, 8)}});
  CheckCommand command;
  command.summary_path = dir.file("summary.md");
  EXPECT_EQ(runCheck(dir.file("a.db"), dir.file("a.db"), command).exit_code, 0);
  const std::string summary = readFile(command.summary_path);
  EXPECT_EQ(summary.rfind("### ✅ gradscope check: no regression beyond 5.0% and noise\n", 0), 0u) << summary;
  EXPECT_EQ(summary.find("| strategy |"), std::string::npos) << summary;  // no table without changes
}

}  // namespace
}  // namespace gradscope::tuner
