// Cost models from measurements: robust statistics per size, log-log interpolation, alpha-beta fits.

#include "gradscope/tuner/model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <unordered_map>

namespace gradscope::tuner {
namespace {

// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast and fully specified, so the bootstrap is the same
// on every platform and standard library (std::uniform_int_distribution is not).
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};

double logInterpolate(double x0, double y0, double x1, double y1, double x) {
  if (y0 <= 0 || y1 <= 0) return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
  const double t = (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0));
  return std::exp(std::log(y0) + t * (std::log(y1) - std::log(y0)));
}

double relativeHalfWidth(const TimeInterval& time) {
  return time.median_ns > 0 ? (time.high_ns - time.low_ns) / (2 * time.median_ns) : 0;
}

// Simple least squares of y against x: returns (intercept, slope).
std::pair<double, double> lineFit(std::span<const double> x, std::span<const double> y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) sx += x[i], sy += y[i];
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  const double slope = sxx > 0 ? sxy / sxx : 0;
  return {my - slope * mx, slope};
}

}  // namespace

storage::Measurement collapseRanks(std::span<const storage::Measurement> rows) {
  storage::Measurement out = rows.front();
  if (rows.size() == 1) return out;
  out.rank_id.reset();
  std::vector<double> medians, p90s, algbws, busbws;
  out.overflow_count = 0;
  for (const auto& row : rows) {
    medians.push_back(row.median_ns);
    p90s.push_back(row.p90_ns);
    algbws.push_back(row.algbw_gbs);
    busbws.push_back(row.busbw_gbs);
    out.min_ns = std::min(out.min_ns, row.min_ns);
    out.max_ns = std::max(out.max_ns, row.max_ns);
    if (row.rel_l2_error) out.rel_l2_error = std::max(out.rel_l2_error.value_or(0.0), *row.rel_l2_error);
    if (row.max_abs_error) out.max_abs_error = std::max(out.max_abs_error.value_or(0.0), *row.max_abs_error);
    if (row.cosine) out.cosine = std::min(out.cosine.value_or(1.0), *row.cosine);
    out.overflow_count += row.overflow_count;
  }
  out.median_ns = median(std::move(medians));
  out.p90_ns = median(std::move(p90s));
  out.algbw_gbs = median(std::move(algbws));
  out.busbw_gbs = median(std::move(busbws));
  return out;
}

std::vector<MeasurementRow> loadMeasurements(const storage::TraceReader& reader) {
  std::unordered_map<std::int64_t, Backend> backends;
  for (const auto& run : reader.runs()) backends[run.id] = run.backend;
  std::unordered_map<std::int64_t, std::pair<std::string, std::int64_t>> origins;
  for (auto& origin : reader.measurementOrigins())
    origins.emplace(origin.measurement_id, std::pair{std::move(origin.comm_key), origin.seq});

  // Rows of one collective measurement: the same run, strategy, collective, dtype, size and world, timed on
  // calls with the same communicator key and sequence number.
  using Origin =
      std::tuple<std::int64_t, std::string, Api, DType, std::int64_t, int, std::string, std::int64_t>;
  std::map<Origin, std::size_t> group_of;
  std::vector<std::vector<storage::Measurement>> groups;
  for (auto& measurement : reader.measurements()) {
    const auto origin = origins.find(measurement.id);
    if (origin == origins.end()) {
      groups.push_back({std::move(measurement)});
      continue;
    }
    const Origin key{measurement.run_id, measurement.strategy, measurement.api,      measurement.dtype,
                     measurement.bytes,  measurement.world,    origin->second.first, origin->second.second};
    const auto [it, inserted] = group_of.try_emplace(key, groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(std::move(measurement));
  }
  std::sort(groups.begin(), groups.end(),
            [](const auto& a, const auto& b) { return a.front().id < b.front().id; });
  std::vector<MeasurementRow> rows;
  rows.reserve(groups.size());
  for (const auto& group : groups) {
    storage::Measurement row = collapseRanks(group);
    const auto backend = backends.find(row.run_id);
    rows.push_back({std::move(row), backend == backends.end() ? Backend::Unknown : backend->second});
  }
  return rows;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const std::size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle), values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  const double lower =
      *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle));
  return (lower + upper) / 2;
}

TimeInterval bootstrapMedian(std::span<const double> values, int resamples, std::uint64_t seed) {
  TimeInterval result;
  result.median_ns = median({values.begin(), values.end()});
  if (values.size() < 2 || resamples < 1) {
    result.low_ns = result.high_ns = result.median_ns;
    return result;
  }
  SplitMix64 random{seed};
  std::vector<double> medians(static_cast<std::size_t>(resamples));
  std::vector<double> sample(values.size());
  for (auto& resampled : medians) {
    for (auto& value : sample) value = values[random.next() % values.size()];
    resampled = median(sample);
  }
  std::sort(medians.begin(), medians.end());
  const auto last = static_cast<double>(medians.size() - 1);
  result.low_ns = std::min(result.median_ns, medians[static_cast<std::size_t>(std::floor(0.025 * last))]);
  result.high_ns = std::max(result.median_ns, medians[static_cast<std::size_t>(std::ceil(0.975 * last))]);
  return result;
}

AlphaBetaFit fitAlphaBeta(std::span<const SizePoint> points) {
  AlphaBetaFit fit;
  if (points.size() < 2) return fit;
  // Weighted normal equations for t = a + g*b with weights w = 1/t^2.
  double sw = 0, swb = 0, swbb = 0, swt = 0, swbt = 0;
  for (const auto& point : points) {
    const double t = point.time.median_ns, b = static_cast<double>(point.bytes);
    if (t <= 0) return fit;
    const double w = 1 / (t * t);
    sw += w, swb += w * b, swbb += w * b * b, swt += w * t, swbt += w * b * t;
  }
  const double determinant = sw * swbb - swb * swb;
  if (!(determinant > 0)) return fit;
  fit.ns_per_byte = (sw * swbt - swb * swt) / determinant;
  fit.alpha_ns = (swt - fit.ns_per_byte * swb) / sw;
  double mean = 0;
  for (const auto& point : points) mean += point.time.median_ns;
  mean /= static_cast<double>(points.size());
  double residual = 0, total = 0, relative = 0;
  for (const auto& point : points) {
    const double t = point.time.median_ns, error = fit.predict(static_cast<double>(point.bytes)) - t;
    residual += error * error;
    total += (t - mean) * (t - mean);
    relative += (error / t) * (error / t);
  }
  fit.r_squared = total > 0 ? 1 - residual / total : 1;
  fit.relative_rms = std::sqrt(relative / static_cast<double>(points.size()));
  fit.valid = fit.ns_per_byte > 0 && std::isfinite(fit.alpha_ns);
  return fit;
}

std::vector<StrategyModel> buildModels(std::span<const MeasurementRow> rows) {
  struct Group {
    std::map<std::int64_t, std::vector<const storage::Measurement*>> sizes;
    std::optional<double> worst_rel_error;
  };
  std::map<ModelKey, Group> groups;
  for (const auto& row : rows) {
    const auto& m = row.measurement;
    if (m.bytes <= 0 || !(m.median_ns > 0) || !std::isfinite(m.median_ns)) continue;
    auto& group = groups[ModelKey{collectiveOf(m.api), m.strategy, m.dtype, m.world, row.backend}];
    group.sizes[m.bytes].push_back(&m);
    if (m.rel_l2_error)
      group.worst_rel_error = std::max(group.worst_rel_error.value_or(0.0), *m.rel_l2_error);
  }
  std::vector<StrategyModel> models;
  for (auto& [key, group] : groups) {
    StrategyModel model;
    model.key = key;
    model.worst_rel_error = group.worst_rel_error;
    for (const auto& [bytes, measured] : group.sizes) {
      SizePoint point{bytes, {}, static_cast<int>(measured.size())};
      if (measured.size() == 1) {
        const auto& m = *measured.front();
        point.time = {m.median_ns, std::min(m.min_ns > 0 ? m.min_ns : m.median_ns, m.median_ns),
                      std::max(m.max_ns, m.median_ns)};
      } else {
        std::vector<double> medians;
        for (const auto* m : measured) medians.push_back(m->median_ns);
        point.time = bootstrapMedian(medians);
      }
      model.rows += point.rows;
      model.points.push_back(point);
    }
    model.fit = fitAlphaBeta(model.points);
    models.push_back(std::move(model));
  }
  return models;
}

std::optional<Prediction> predict(const StrategyModel& model, std::int64_t bytes) {
  if (bytes <= 0 || model.points.empty()) return std::nullopt;
  Prediction prediction;
  prediction.predicted_world = model.predicted_world;
  const auto& points = model.points;
  const auto above = std::lower_bound(points.begin(), points.end(), bytes,
                                      [](const SizePoint& point, std::int64_t b) { return point.bytes < b; });
  if (above != points.end() && above->bytes == bytes) {
    prediction.time = above->time;
    return prediction;
  }
  if (above != points.begin() && above != points.end()) {
    const auto& a = *(above - 1);
    const auto& b = *above;
    const auto x0 = static_cast<double>(a.bytes), x1 = static_cast<double>(b.bytes);
    const auto x = static_cast<double>(bytes);
    prediction.time = {logInterpolate(x0, a.time.median_ns, x1, b.time.median_ns, x),
                       logInterpolate(x0, a.time.low_ns, x1, b.time.low_ns, x),
                       logInterpolate(x0, a.time.high_ns, x1, b.time.high_ns, x)};
    return prediction;
  }
  if (!model.fit.valid) return std::nullopt;
  const double time = model.fit.predict(static_cast<double>(bytes));
  if (!(time > 0)) return std::nullopt;
  const auto& nearest = above == points.end() ? points.back() : points.front();
  const double spread = model.fit.relative_rms + relativeHalfWidth(nearest.time);
  prediction.time = {time, time * std::max(0.0, 1 - spread), time * (1 + spread)};
  prediction.extrapolated = true;
  return prediction;
}

std::optional<StrategyModel> modelAtWorld(std::span<const StrategyModel* const> models, int world) {
  std::vector<double> log_world, alpha, ns_per_byte;
  const StrategyModel* nearest = nullptr;
  double spread = 0;
  for (const auto* model : models) {
    if (!model->fit.valid || model->key.world < 1) continue;
    log_world.push_back(std::log(static_cast<double>(model->key.world)));
    alpha.push_back(model->fit.alpha_ns);
    ns_per_byte.push_back(model->fit.ns_per_byte);
    spread = std::max(spread, model->fit.relative_rms);
    if (nearest == nullptr || std::abs(std::log(static_cast<double>(model->key.world) / world)) <
                                  std::abs(std::log(static_cast<double>(nearest->key.world) / world)))
      nearest = model;
  }
  std::vector<double> distinct = log_world;
  std::sort(distinct.begin(), distinct.end());
  if (std::unique(distinct.begin(), distinct.end()) - distinct.begin() < 2 || world < 1) return std::nullopt;
  const auto [alpha0, alpha1] = lineFit(log_world, alpha);
  const auto [gamma0, gamma1] = lineFit(log_world, ns_per_byte);
  const double x = std::log(static_cast<double>(world));
  AlphaBetaFit fit;
  fit.alpha_ns = alpha0 + alpha1 * x;
  fit.ns_per_byte = gamma0 + gamma1 * x;
  if (!(fit.alpha_ns > 0) || !(fit.ns_per_byte > 0)) return std::nullopt;
  fit.valid = true;
  fit.relative_rms = spread;
  fit.r_squared = nearest->fit.r_squared;

  StrategyModel result;
  result.key = nearest->key;
  result.key.world = world;
  result.fit = fit;
  result.predicted_world = true;
  result.worst_rel_error = nearest->worst_rel_error;
  for (const auto* model : models) result.rows += model->rows;
  // The nearest world's measured shape, scaled by how the fitted cost changes between the two worlds;
  // widened by the fits' residual because the world fit itself is a model, not a measurement.
  for (auto point : nearest->points) {
    const auto b = static_cast<double>(point.bytes);
    const double at_nearest = nearest->fit.predict(b);
    const double scale = at_nearest > 0 ? fit.predict(b) / at_nearest : fit.predict(b) / point.time.median_ns;
    point.time = {point.time.median_ns * scale, point.time.low_ns * scale * std::max(0.0, 1 - spread),
                  point.time.high_ns * scale * (1 + spread)};
    result.points.push_back(point);
  }
  return result;
}

}  // namespace gradscope::tuner
