// tuner/model.h: statistics per size, the alpha-beta fit, interpolation, extrapolation and the world
// what-if, on synthetic rows whose answers are known exactly.

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/tuner/model.h"

namespace gradscope::tuner {
namespace {

MeasurementRow row(std::string strategy, std::int64_t bytes, double median_ns, int world = 4,
                   Api api = Api::MpiAllreduce) {
  MeasurementRow row;
  row.backend = Backend::Mpi;
  auto& m = row.measurement;
  m.strategy = std::move(strategy);
  m.api = api;
  m.dtype = DType::Fp32;
  m.bytes = bytes;
  m.world = world;
  m.reps = 10;
  m.min_ns = median_ns * 0.9;
  m.median_ns = median_ns;
  m.p90_ns = median_ns * 1.05;
  m.max_ns = median_ns * 1.2;
  return row;
}

// Exact alpha-beta rows: time = alpha + bytes * ns_per_byte at 1 KiB, 4 KiB, ..., 1 MiB.
std::vector<MeasurementRow> alphaBetaRows(std::string strategy, double alpha, double ns_per_byte,
                                          int world = 4) {
  std::vector<MeasurementRow> rows;
  for (std::int64_t bytes = 1024; bytes <= (1 << 20); bytes *= 4)
    rows.push_back(row(strategy, bytes, alpha + static_cast<double>(bytes) * ns_per_byte, world));
  return rows;
}

TEST(TunerModel, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({}), 0);
}

TEST(TunerModel, BootstrapIsDeterministicAndBracketsTheMedian) {
  const std::vector<double> values = {10, 12, 11, 30, 9, 10, 11};
  const TimeInterval a = bootstrapMedian(values), b = bootstrapMedian(values);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.median_ns, 11);
  EXPECT_LE(a.low_ns, a.median_ns);
  EXPECT_GE(a.high_ns, a.median_ns);
  EXPECT_GE(a.low_ns, 9);
  EXPECT_LE(a.high_ns, 30);
  // Identical values leave nothing to resample: the interval is the value itself.
  const std::vector<double> same(5, 7.0);
  EXPECT_EQ(bootstrapMedian(same), (TimeInterval{7, 7, 7}));
  // Another seed gives another (still valid) interval: the seed is really used.
  const TimeInterval other = bootstrapMedian(values, 1000, 42);
  EXPECT_LE(other.low_ns, 11);
  EXPECT_GE(other.high_ns, 11);
}

TEST(TunerModel, AlphaBetaFitIsExactOnExactData) {
  const auto models = buildModels(alphaBetaRows("sum/native", 5000, 0.25));
  ASSERT_EQ(models.size(), 1u);
  const auto& fit = models[0].fit;
  ASSERT_TRUE(fit.valid);
  EXPECT_NEAR(fit.alpha_ns, 5000, 1e-6);
  EXPECT_NEAR(fit.ns_per_byte, 0.25, 1e-12);
  EXPECT_NEAR(fit.r_squared, 1, 1e-12);
  EXPECT_NEAR(fit.relative_rms, 0, 1e-12);
}

TEST(TunerModel, FitNeedsTwoSizes) {
  const std::vector<MeasurementRow> rows = {row("sum/native", 4096, 1000)};
  const auto models = buildModels(rows);
  ASSERT_EQ(models.size(), 1u);
  EXPECT_FALSE(models[0].fit.valid);
  // Inside the measured sizes (the one size) it predicts; outside it refuses rather than guess.
  EXPECT_TRUE(predict(models[0], 4096).has_value());
  EXPECT_FALSE(predict(models[0], 8192).has_value());
}

TEST(TunerModel, GroupsAllReduceApisAndUsesOneRowsOwnSpreadAsItsInterval) {
  std::vector<MeasurementRow> rows = {row("sum/native", 4096, 1000, 4, Api::MpiAllreduce),
                                      row("sum/native", 4096, 3000, 4, Api::MpiIallreduce),
                                      row("sum/native", 4096, 2000, 4, Api::MpiAllreduce),
                                      row("sum/native", 8192, 5000), row("sum/native", 8192, 5000, 8)};
  rows[0].measurement.rel_l2_error = 1e-7;
  rows[2].measurement.rel_l2_error = 3e-7;
  const auto models = buildModels(rows);
  ASSERT_EQ(models.size(), 2u);  // world 4 and world 8
  const auto& four = models[0];
  EXPECT_EQ(four.key.collective, Collective::AllReduce);
  EXPECT_EQ(four.key.world, 4);
  EXPECT_EQ(four.rows, 4);
  EXPECT_EQ(four.worst_rel_error, 3e-7);
  ASSERT_EQ(four.points.size(), 2u);
  EXPECT_EQ(four.points[0].rows, 3);
  EXPECT_EQ(four.points[0].time.median_ns, 2000);
  // One row: its own repetitions' min and max.
  EXPECT_EQ(four.points[1].time, (TimeInterval{5000, 4500, 6000}));
  EXPECT_EQ(models[1].key.world, 8);
}

TEST(TunerModel, InterpolatesInLogLogSpace) {
  // A power law t = bytes / 10 is a straight line in log-log space: interpolation is exact.
  const std::vector<MeasurementRow> rows = {row("sum/native", 1024, 102.4), row("sum/native", 4096, 409.6)};
  const auto models = buildModels(rows);
  const auto at = predict(models[0], 2048);
  ASSERT_TRUE(at.has_value());
  EXPECT_NEAR(at->time.median_ns, 204.8, 1e-9);
  EXPECT_NEAR(at->time.low_ns, 204.8 * 0.9, 1e-9);
  EXPECT_NEAR(at->time.high_ns, 204.8 * 1.2, 1e-9);
  EXPECT_FALSE(at->extrapolated);
  // A measured size is the point itself.
  const auto exact = predict(models[0], 1024);
  ASSERT_TRUE(exact.has_value());
  EXPECT_EQ(exact->time, (TimeInterval{102.4, 102.4 * 0.9, 102.4 * 1.2}));
}

TEST(TunerModel, ExtrapolatesWithTheFitAndSaysSo) {
  const auto models = buildModels(alphaBetaRows("sum/native", 5000, 0.25));
  const std::int64_t bytes = 16 << 20;
  const auto far = predict(models[0], bytes);
  ASSERT_TRUE(far.has_value());
  EXPECT_TRUE(far->extrapolated);
  EXPECT_NEAR(far->time.median_ns, 5000 + 0.25 * static_cast<double>(bytes), 1e-3);
  EXPECT_LT(far->time.low_ns, far->time.median_ns);  // widened by the nearest point's spread
  EXPECT_GT(far->time.high_ns, far->time.median_ns);
  const auto below = predict(models[0], 16);
  ASSERT_TRUE(below.has_value());
  EXPECT_TRUE(below->extrapolated);
  EXPECT_FALSE(predict(models[0], 0).has_value());
}

TEST(TunerModel, PredictsAnotherWorldSizeFromFitsInLogWorld) {
  // alpha 1000 at world 2 and 3000 at world 8: linear in log(world) gives 2000 at world 4.
  std::vector<MeasurementRow> rows = alphaBetaRows("sum/native", 1000, 0.5, 2);
  for (auto& r : alphaBetaRows("sum/native", 3000, 0.5, 8)) rows.push_back(r);
  const auto models = buildModels(rows);
  ASSERT_EQ(models.size(), 2u);
  const std::vector<const StrategyModel*> pointers = {&models[0], &models[1]};
  const auto four = modelAtWorld(pointers, 4);
  ASSERT_TRUE(four.has_value());
  EXPECT_TRUE(four->predicted_world);
  EXPECT_EQ(four->key.world, 4);
  EXPECT_NEAR(four->fit.alpha_ns, 2000, 1e-6);
  EXPECT_NEAR(four->fit.ns_per_byte, 0.5, 1e-12);
  const auto at = predict(*four, 4096);
  ASSERT_TRUE(at.has_value());
  EXPECT_TRUE(at->predicted_world);
  EXPECT_NEAR(at->time.median_ns, 2000 + 0.5 * 4096, 1e-6);
  // One world size is not enough to fit against world.
  const std::vector<const StrategyModel*> one = {&models[0]};
  EXPECT_FALSE(modelAtWorld(one, 4).has_value());
}

}  // namespace
}  // namespace gradscope::tuner
