// Synchronous or asynchronous (tuner/async.h): the replay of measured steps and the analysis over it.

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/common/recommendation.h"
#include "gradscope/tuner/async.h"
#include "gradscope/tuner/recommend.h"

namespace gradscope::tuner {
namespace {

// Steps of `ranks` ranks where rank r computes compute(step, r) and the reduction's transport takes
// `transport` after the last arrival: the rows a synchronous job's step model would hold.
template <typename Compute>
std::vector<storage::StepRecord> syncSteps(int ranks, int steps, double transport, Compute compute) {
  std::vector<storage::StepRecord> rows;
  double begin = 0;
  for (int t = 0; t < steps; ++t) {
    double last = 0;
    int last_rank = 0;
    for (int r = 0; r < ranks; ++r)
      if (compute(t, r) > last) last = compute(t, r), last_rank = r;
    const double span = last + transport;
    for (int r = 0; r < ranks; ++r) {
      storage::StepRecord row;
      row.rank_id = 100 + r;
      row.step = t;
      row.start_ns = static_cast<std::int64_t>(begin);
      row.end_ns = static_cast<std::int64_t>(begin + span);
      row.compute_ns = static_cast<std::int64_t>(compute(t, r));
      row.exposed_ns = static_cast<std::int64_t>(span - compute(t, r));
      row.waiting_ns = static_cast<std::int64_t>(last - compute(t, r));
      rows.push_back(row);
    }
    for (int r = 0; r < ranks; ++r)
      if (r == last_rank)
        for (auto& row : rows)
          if (row.step == t && row.rank_id == 100 + r)
            for (int q = 0; q < ranks; ++q) row.caused_ns += static_cast<std::int64_t>(last - compute(t, q));
    begin += span;
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return std::tie(a.rank_id, a.step) < std::tie(b.rank_id, b.step);
  });
  return rows;
}

TEST(TunerAsync, ReplayOfAPersistentStragglerHidesOnlyTheTransport) {
  // Rank 1 always computes 20, rank 0 10; transport 5. Synchronous: 25 a step. stale1: rank 1 sets the
  // pace at 20 a step after its first (synchronous) step: (25 + 20·31) / 32.
  const std::vector<std::vector<double>> compute(32, {10.0, 20.0});
  const std::vector<double> transport(32, 5.0);
  EXPECT_DOUBLE_EQ(replayStepNs(compute, transport, 0), 25.0);
  EXPECT_DOUBLE_EQ(replayStepNs(compute, transport, 1), (25.0 + 20.0 * 31) / 32);
  EXPECT_DOUBLE_EQ(replayStepNs(compute, transport, 2), (50.0 + 20.0 * 30) / 32);
}

TEST(TunerAsync, ReplayOfAlternatingLateRanksHidesTheirWaiting) {
  // The late rank alternates: synchronous steps take 20 + 5; bounded staleness lets each rank average
  // its 15, so stale1's steps fall between the mean compute and the persistent case's 20.
  std::vector<std::vector<double>> compute;
  for (int t = 0; t < 64; ++t)
    compute.push_back(t % 2 == 0 ? std::vector{10.0, 20.0} : std::vector{20.0, 10.0});
  const std::vector<double> transport(64, 5.0);
  EXPECT_DOUBLE_EQ(replayStepNs(compute, transport, 0), 25.0);
  const double stale1 = replayStepNs(compute, transport, 1);
  EXPECT_GE(stale1, 15.0);
  EXPECT_LT(stale1, 20.0);
}

TEST(TunerAsync, AnalysisNamesThePersistentStragglerAndTheMeasuredErrors) {
  const auto rows = syncSteps(2, 32, 5000, [](int, int r) { return r == 1 ? 20000.0 : 10000.0; });
  std::vector<MeasurementRow> measurements;
  for (const double error : {0.3, 0.5, 0.9}) {
    MeasurementRow row;
    row.measurement.strategy = "async/stale1";
    row.measurement.rel_l2_error = error;
    measurements.push_back(row);
  }
  MeasurementRow wire;
  wire.measurement.strategy = "sum/native/fp16";
  wire.measurement.rel_l2_error = 3e-4;
  wire.measurement.median_ns = 1000;
  measurements.push_back(wire);
  const AsyncAnalysis analysis =
      analyzeAsync(rows, measurements, [](std::int64_t id) { return std::to_string(id - 100); });
  ASSERT_TRUE(analysis.why_not.empty()) << analysis.why_not;
  EXPECT_EQ(analysis.steps, 32);
  EXPECT_EQ(analysis.ranks, 2);
  EXPECT_DOUBLE_EQ(analysis.step_ns, 25000);
  EXPECT_DOUBLE_EQ(analysis.replay_sync_ns, 25000);
  EXPECT_DOUBLE_EQ(analysis.waiting_mean_ns, 5000);  // rank 0 waits 10 µs, rank 1 none
  EXPECT_DOUBLE_EQ(analysis.waiting_worst_ns, 10000);
  EXPECT_DOUBLE_EQ(analysis.exposed_ns, 5000);
  EXPECT_TRUE(analysis.persistent);
  ASSERT_EQ(analysis.options.size(), 1u);  // only what explore measured
  const AsyncOption& stale1 = analysis.options[0];
  EXPECT_EQ(stale1.strategy, "async/stale1");
  EXPECT_DOUBLE_EQ(stale1.step_ns, (25000.0 + 20000.0 * 31) / 32);
  EXPECT_LE(stale1.saving_low_ns, stale1.saving_ns);
  EXPECT_GE(stale1.saving_high_ns, stale1.saving_low_ns);
  EXPECT_DOUBLE_EQ(*stale1.error_median, 0.5);
  EXPECT_DOUBLE_EQ(*stale1.error_worst, 0.9);
  EXPECT_EQ(stale1.error_samples, 3);
  EXPECT_EQ(analysis.wire_strategy, "sum/native/fp16");
  EXPECT_DOUBLE_EQ(*analysis.wire_error, 3e-4);
  EXPECT_NE(analysis.verdict.find("for rank 1, last in 32 of 32 steps"), std::string::npos)
      << analysis.verdict;
  EXPECT_NE(analysis.verdict.find("Rank 1 is a persistent straggler"), std::string::npos) << analysis.verdict;
  EXPECT_NE(analysis.verdict.find("error of 0.5 per step"), std::string::npos) << analysis.verdict;
}

TEST(TunerAsync, WithoutMeasurementsTheDefaultSetIsReplayedAndSaysSo) {
  const auto rows = syncSteps(3, 24, 1000, [](int t, int r) { return (t + r) % 3 == 0 ? 9000.0 : 3000.0; });
  const AsyncAnalysis analysis = analyzeAsync(rows, {});
  ASSERT_TRUE(analysis.why_not.empty());
  ASSERT_EQ(analysis.options.size(), 3u);
  EXPECT_EQ(analysis.options[0].strategy, "async/stale1");
  EXPECT_FALSE(analysis.options[0].error_median);
  EXPECT_FALSE(analysis.persistent);
  EXPECT_NE(analysis.verdict.find("not measured: run explore mode"), std::string::npos) << analysis.verdict;
}

TEST(TunerAsync, RanksSharingCpusMakeTheReplayAnUpperBound) {
  const auto rows = syncSteps(2, 32, 5000, [](int t, int r) { return (t + r) % 2 == 0 ? 20000.0 : 10000.0; });
  const AsyncAnalysis alone = analyzeAsync(rows, {});
  EXPECT_EQ(alone.verdict.find("share"), std::string::npos) << alone.verdict;
  const AsyncAnalysis shared = analyzeAsync(rows, {}, {}, CpuSharing{"node7", 4, 2});
  ASSERT_TRUE(shared.shared_cpus);
  EXPECT_NE(shared.verdict.find("Here 4 ranks share 2 CPUs on node7"), std::string::npos) << shared.verdict;
  EXPECT_NE(shared.verdict.find("upper bound"), std::string::npos) << shared.verdict;
}

TEST(TunerAsync, GpuStepsSayTheSumsShareTheGpuWithTheJob) {
  auto rows = syncSteps(2, 32, 5000, [](int t, int r) { return (t + r) % 2 == 0 ? 20000.0 : 10000.0; });
  EXPECT_EQ(analyzeAsync(rows, {}).verdict.find("second NCCL communicator"), std::string::npos);
  for (auto& row : rows) row.basis = storage::StepBasis::Gpu;
  const AsyncAnalysis gpu = analyzeAsync(rows, {});
  EXPECT_NE(gpu.verdict.find("The steps are on the GPU (NCCL): there the async sums run on a second NCCL "
                             "communicator and stream beside the job's kernels"),
            std::string::npos)
      << gpu.verdict;
}

TEST(TunerAsync, TooFewStepsOrRanksAreSaid) {
  EXPECT_FALSE(analyzeAsync(syncSteps(1, 40, 1, [](int, int) { return 1.0; }), {}).why_not.empty());
  EXPECT_FALSE(analyzeAsync(syncSteps(2, 10, 1, [](int, int) { return 1.0; }), {}).why_not.empty());
  EXPECT_FALSE(analyzeAsync({}, {}).why_not.empty());
}

// A job whose late rank alternates (what async hides), sum/native measured at its one size, and explore's
// errors of async/stale1: the inputs of recommend(). NCCL: the same job's all-reduces on GPUs.
Inputs asyncJobInputs(double async_error, Backend backend = Backend::Mpi) {
  const Api api = backend == Backend::Nccl ? Api::NcclAllReduce : Api::MpiAllreduce;
  Inputs inputs;
  storage::RunInfo info;
  info.id = 1;
  info.uuid = "00000000-0000-4000-8000-0000000000a5";
  info.backend = backend;
  info.world_size = 2;
  inputs.runs.push_back(info);
  for (const std::int64_t bytes : {1024, 4096, 16384})
    for (const double factor : {0.99, 1.0, 1.01}) {
      MeasurementRow row;
      row.backend = backend;
      row.measurement.run_id = 1;
      row.measurement.strategy = "sum/native";
      row.measurement.api = api;
      row.measurement.bytes = bytes;
      row.measurement.world = 2;
      row.measurement.reps = 10;
      row.measurement.median_ns = factor * (5000 + static_cast<double>(bytes));
      row.measurement.min_ns = row.measurement.median_ns;
      row.measurement.max_ns = row.measurement.median_ns;
      inputs.measurements.push_back(row);
    }
  std::vector<MeasurementRow> errors;
  for (int i = 0; i < 4; ++i) {
    MeasurementRow row;
    row.backend = backend;
    row.measurement.strategy = "async/stale1";
    row.measurement.rel_l2_error = async_error;
    errors.push_back(row);
  }
  inputs.workload = {{api, DType::Fp32, 4096, 1}};
  inputs.steps_known = true;
  inputs.step_ns = 25000;
  inputs.async = analyzeAsync(
      syncSteps(2, 32, 5000, [](int t, int r) { return (t + r) % 2 == 0 ? 20000.0 : 10000.0; }), errors);
  return inputs;
}

TEST(TunerAsync, RecommendedForTheWholeJobOnlyWhenAllowedAndWithinTheBudget) {
  RecommendOptions options;
  options.created = "2026-12-02T00:00:00Z";
  // Not allowed: the synchronous plan, and the reason.
  Result plain = recommend(asyncJobInputs(0.4), options);
  EXPECT_TRUE(plain.report.async_choice.empty());
  EXPECT_FALSE(plain.recommendation.step_saving);
  const auto said = [](const Result& result, const std::string& text) {
    for (const std::string& line : result.report.reasoning)
      if (line.find(text) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(said(plain, "Excluded async/stale1: changes what the job computes"));
  // Allowed, but its error is above the budget.
  options.allow_semantic_change = true;
  options.max_rel_error = 0.1;
  EXPECT_TRUE(said(recommend(asyncJobInputs(0.4), options), "above the budget 0.1"));
  // Allowed and within it: one rule over the workload, the step saving carried into the file.
  options.max_rel_error = 0.5;
  const Result chosen = recommend(asyncJobInputs(0.4), options);
  ASSERT_EQ(chosen.report.async_choice, "async/stale1");
  ASSERT_EQ(chosen.recommendation.rules.size(), 1u);
  const RecommendationRule& rule = chosen.recommendation.rules[0];
  EXPECT_EQ(rule.strategy, "async/stale1");
  EXPECT_EQ(rule.error_class, ErrorClass::Semantic);
  EXPECT_EQ(rule.min_bytes, 4096);
  EXPECT_DOUBLE_EQ(*rule.measured_rel_error, 0.4);
  ASSERT_TRUE(chosen.recommendation.step_saving);
  const AsyncOption& option = chosen.report.async->options[0];
  EXPECT_DOUBLE_EQ(chosen.recommendation.step_saving->median_ns, option.saving_ns);  // replay = measured here
  EXPECT_GT(chosen.recommendation.step_saving->low_ns, 0);
  EXPECT_NEAR(*chosen.report.step_saving_ns, option.saving_ns / 25000 * 25000, 1e-6);
  // The file says it and reads back the same.
  EXPECT_EQ(parseRecommendation(toJson(chosen.recommendation)), chosen.recommendation);
  EXPECT_NE(toJson(chosen.recommendation).find("predicted_step_saving_ns"), std::string::npos);
}

// The agent applies them over NCCL too (a second communicator and stream): an NCCL job gets the same choice.
TEST(TunerAsync, RecommendedForAnNcclJobAsForAnMpiOne) {
  RecommendOptions options;
  options.created = "2026-12-02T00:00:00Z";
  options.allow_semantic_change = true;
  options.max_rel_error = 0.5;
  const Result chosen = recommend(asyncJobInputs(0.4, Backend::Nccl), options);
  ASSERT_EQ(chosen.report.async_choice, "async/stale1");
  ASSERT_EQ(chosen.recommendation.rules.size(), 1u);
  EXPECT_EQ(chosen.recommendation.backend, Backend::Nccl);
  EXPECT_EQ(chosen.recommendation.rules[0].api, Api::NcclAllReduce);
  EXPECT_EQ(chosen.recommendation.rules[0].strategy, "async/stale1");
}

}  // namespace
}  // namespace gradscope::tuner
