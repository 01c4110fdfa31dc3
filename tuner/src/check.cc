// gradscope check: the CI gate. See check.h for the contract and docs/tuner.md "CI gate" for the rules.

#include "gradscope/tuner/check.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <numeric>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/common/error.h"
#include "gradscope/common/units.h"
#include "gradscope/storage/files.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/step_model.h"
#include "gradscope/tuner/model.h"
#include "gradscope/tuner/validate.h"

namespace gradscope::tuner {
namespace {

// Below this many rows per side a key has too few samples for a rank test (Mann–Whitney with 4 against
// 4 rows cannot even reach p = 0.01: its smallest p is 1/70) and the sweep rule judges it.
constexpr std::size_t kMinRowsForRankTest = 4;
// How far a sweep's median change must clear the tolerance, in units of the spread of the sweep medians
// across all sweeps of the comparison. A repeat run on a loaded machine shifts whole sweeps by ~10%
// (measured: bench/check_false_alarms.py); the spread across sweeps measures that, and 4 of it gave no
// false alarm on 30 repeat pairs while still catching a 20% slowdown in 27 of them.
constexpr double kSweepSpreadFactor = 4.0;
// 1.4826 · MAD estimates the standard deviation of normal data, robust to the stalls that make a bench
// point hundreds of times slower now and then.
constexpr double kMadToSigma = 1.4826;

struct Samples {
  std::vector<double> medians;  // one per collective measured (loadMeasurements)
  double min_ns = 0, max_ns = 0;
};

// The range a change must clear to count as apart from the noise: with several samples (explorations,
// merged bench runs) the range of their medians; with one, that row's own min..max (over its ranks'
// median calls for a bench point, over every repetition for a single exploration).
std::pair<double, double> rangeOf(const Samples& samples) {
  if (samples.medians.size() < 2) return {samples.min_ns, samples.max_ns};
  const auto [low, high] = std::minmax_element(samples.medians.begin(), samples.medians.end());
  return {*low, *high};
}

using SampleMap = std::map<CheckKey, Samples>;
using SweepKey = std::tuple<Collective, std::string, DType, int>;

SweepKey sweepOf(const CheckKey& key) {
  return {key.collective, key.strategy, key.dtype, key.world};
}

bool hasMeasurements(const std::string& path) {
  return !storage::TraceReader::open(path).measurements().empty();
}

SampleMap load(const std::string& path, std::string_view role) {
  std::error_code error;
  if (!std::filesystem::exists(path, error))
    fail("{}: no such file (give the {} trace written by gradscope run or gradscope bench)", path, role);
  const auto reader = storage::TraceReader::open(path);
  // One sample per collective measured (the ranks of an exploration time one collective together).
  const auto rows = loadMeasurements(reader);
  if (rows.empty())
    fail(
        "{}: the {} trace has no measurements (record it with gradscope bench or gradscope run --mode "
        "explore), and two runs are compared only when both have at least {} steps",
        path, role, 2 * kRunBlocks);
  SampleMap samples;
  for (const auto& [row, backend] : rows) {
    const CheckKey key{collectiveOf(row.api), row.strategy, row.dtype, row.bytes, row.world};
    auto [it, inserted] = samples.try_emplace(key);
    auto& entry = it->second;
    if (inserted) entry.min_ns = row.min_ns, entry.max_ns = row.max_ns;
    entry.medians.push_back(row.median_ns);
    entry.min_ns = std::min(entry.min_ns, std::min(row.min_ns, row.median_ns));
    entry.max_ns = std::max(entry.max_ns, std::max(row.max_ns, row.median_ns));
  }
  return samples;
}

// ---- Two observed runs ---------------------------------------------------------------------------------

// What a run's steps say: per figure, its value in each step, in step order.
struct RunFigures {
  std::int64_t steps = 0;
  double median_step_ns = 0;
  std::vector<std::pair<std::string, std::vector<double>>> figures;  // in the order they are reported
};

// The step model's figures (the step's time, the ranks' mean compute, exposed and waiting) and the time
// per step in each API and size class (the calls' durations summed over the ranks, divided by the ranks).
// Empty when the trace has no steps. The breakdown comes from the steps that have one (a GPU job's steps
// outside the agent's sampled windows have their time only), and is left out when none has. A merged
// trace holds all of it (steps, step_calls); another has it derived from its calls.
RunFigures runFigures(const storage::TraceReader& reader) {
  RunFigures run;
  const storage::StepModel model = storage::readOrComputeStepModel(reader, {.exposure = false});
  const std::vector<storage::StepTotals> steps = storage::stepTotals(model.steps);
  if (steps.empty()) return run;
  run.steps = static_cast<std::int64_t>(steps.size());
  std::map<std::int64_t, std::size_t> index;
  std::vector<double> time, compute, exposed, waiting;
  for (const auto& step : steps) {
    index.emplace(step.step, time.size());
    time.push_back(static_cast<double>(step.span_ns));
    if (step.measured == 0) continue;
    compute.push_back(step.compute_ns);
    exposed.push_back(step.exposed_ns);
    waiting.push_back(step.waiting_ns);
  }
  run.median_step_ns = median(time);
  run.figures = {{"step time", time}};
  if (!compute.empty())
    run.figures.insert(run.figures.end(),
                       {{"compute", compute}, {"exposed communication", exposed}, {"waiting", waiting}});
  std::map<std::pair<Api, int>, std::vector<double>> per_api;
  std::int64_t ranks = 0;
  for (const auto& step : steps) ranks = std::max<std::int64_t>(ranks, step.ranks);
  for (const storage::StepCallTime& row : model.step_calls) {
    const auto it = index.find(row.step);
    if (it == index.end()) continue;
    auto& values = per_api[{row.api, row.size_class}];
    if (values.empty()) values.assign(steps.size(), 0.0);
    values[it->second] += static_cast<double>(row.total_ns) / static_cast<double>(ranks);
  }
  for (auto& [key, values] : per_api)
    run.figures.emplace_back(
        fmt::format("{} {}", name(key.first),
                    key.second < 0 ? std::string("0 B") : formatBytes(std::uint64_t{1} << key.second)),
        std::move(values));
  return run;
}

// The medians of kRunBlocks consecutive blocks of `values` (equal in size but for the remainder).
std::vector<double> blockMedians(const std::vector<double>& values) {
  std::vector<double> out;
  const std::size_t n = values.size();
  for (int b = 0; b < kRunBlocks; ++b) {
    const std::size_t begin = n * static_cast<std::size_t>(b) / kRunBlocks;
    const std::size_t end = n * static_cast<std::size_t>(b + 1) / kRunBlocks;
    if (end > begin)
      out.push_back(median({values.begin() + static_cast<std::ptrdiff_t>(begin),
                            values.begin() + static_cast<std::ptrdiff_t>(end)}));
  }
  return out;
}

void compareRuns(const RunFigures& base, const RunFigures& current, const CheckOptions& options,
                 CheckResult& result) {
  const double log_tolerance = std::log1p(options.tolerance);
  const double material_ns = options.tolerance * base.median_step_ns;
  std::map<std::string, const std::vector<double>*> after;
  for (const auto& [what, values] : current.figures) after.emplace(what, &values);
  for (const auto& [what, values] : base.figures) {
    const auto match = after.find(what);
    if (match == after.end()) continue;
    RunComparison c;
    c.what = what;
    c.baseline_steps = static_cast<int>(values.size());
    c.current_steps = static_cast<int>(match->second->size());
    c.baseline_ns = median(values);
    c.current_ns = median(*match->second);
    c.change = c.baseline_ns > 0 ? c.current_ns / c.baseline_ns - 1 : (c.current_ns > 0 ? 1.0 : 0.0);
    const double d = c.baseline_ns > 0 && c.current_ns > 0 ? std::log(c.current_ns / c.baseline_ns) : 0;
    if (std::abs(c.current_ns - c.baseline_ns) < material_ns) {
      c.reason = fmt::format("changed by under {:.1f}% of the step", 100 * options.tolerance);
    } else if (c.baseline_ns > 0 && std::abs(d) <= log_tolerance) {
      c.reason = "within tolerance";
    } else if (c.baseline_ns > 0 && c.current_ns > 0 && std::abs(d) <= std::log1p(kRunShift)) {
      c.verdict = Verdict::Noisy;
      c.reason = fmt::format("within the {:.0f}% by which repeats of one run differ", 100 * kRunShift);
    } else {
      const std::vector<double> before_blocks = blockMedians(values),
                                after_blocks = blockMedians(*match->second);
      const bool slower = c.current_ns > c.baseline_ns;
      const double p = slower ? mannWhitneyGreater(before_blocks, after_blocks)
                              : mannWhitneyGreater(after_blocks, before_blocks);
      c.p_value = p;
      c.verdict = p < options.alpha ? (slower ? Verdict::Regression : Verdict::Improvement) : Verdict::Noisy;
      c.reason = fmt::format("{} (Mann-Whitney p={:.2g} {} {} over {} vs {} blocks of steps)",
                             p < options.alpha ? (slower ? "slower" : "faster") : "within noise", p,
                             p < options.alpha ? "<" : ">=", options.alpha, before_blocks.size(),
                             after_blocks.size());
    }
    result.runs.push_back(std::move(c));
  }
  // The step is what the job waits for: a part that moved while the step did not is a shift inside the
  // step (on a busy machine, exposed communication doubles from run to run as ranks are descheduled), said
  // but not failed.
  if (!result.runs.empty() && result.runs.front().what == "step time")
    for (std::size_t i = 1; i < result.runs.size(); ++i) {
      RunComparison& part = result.runs[i];
      const Verdict step = result.runs.front().verdict;
      if ((part.verdict == Verdict::Regression || part.verdict == Verdict::Improvement) &&
          step != part.verdict) {
        part.reason += fmt::format("; the step time is not {}: a shift inside the step",
                                   part.verdict == Verdict::Regression ? "slower" : "faster");
        part.verdict = Verdict::Noisy;
      }
    }
}

std::string worldList(const SampleMap& samples) {
  std::vector<int> worlds;
  for (const auto& [key, value] : samples)
    if (std::find(worlds.begin(), worlds.end(), key.world) == worlds.end()) worlds.push_back(key.world);
  std::sort(worlds.begin(), worlds.end());
  return fmt::format("{}", fmt::join(worlds, ", "));
}

double logChange(const KeyComparison& comparison) {
  if (comparison.baseline_median_ns <= 0 || comparison.current_median_ns <= 0) return 0;
  return std::log(comparison.current_median_ns / comparison.baseline_median_ns);
}

void judgeByRankTest(KeyComparison& comparison, const Samples& base, const Samples& current,
                     double log_tolerance, double alpha) {
  const double d = logChange(comparison);
  comparison.test = "mann-whitney";
  if (std::abs(d) <= log_tolerance) {
    comparison.verdict = Verdict::Unchanged;
    comparison.reason = "within tolerance";
    return;
  }
  const bool slower = d > 0;
  const double p = slower ? mannWhitneyGreater(base.medians, current.medians)
                          : mannWhitneyGreater(current.medians, base.medians);
  comparison.p_value = p;
  if (p < alpha) {
    comparison.verdict = slower ? Verdict::Regression : Verdict::Improvement;
    comparison.reason =
        fmt::format("{} (Mann-Whitney p={:.2g} < {}, {} vs {} samples)", slower ? "slower" : "faster", p,
                    alpha, base.medians.size(), current.medians.size());
  } else {
    comparison.verdict = Verdict::Noisy;
    comparison.reason = fmt::format("within noise (Mann-Whitney p={:.2g} >= {}, {} vs {} samples)", p, alpha,
                                    base.medians.size(), current.medians.size());
  }
}

struct SweepEvidence {
  double median_change = 0;  // median log change over the sweep's sizes
  double p_slower = 1, p_faster = 1;
  std::size_t sizes = 0;
  std::size_t pooled_samples = 0;  // samples of the pooled rank test; 0: Wilcoxon over the sizes
};

std::string testOf(const SweepEvidence& sweep) {
  return sweep.pooled_samples > 0 ? fmt::format("Mann-Whitney of {} samples", sweep.pooled_samples)
                                  : std::string("Wilcoxon");
}

void judgeBySweep(KeyComparison& comparison, const Samples& base, const Samples& current,
                  const SweepEvidence& sweep, double sweep_threshold, double log_tolerance, double alpha) {
  const double d = logChange(comparison);
  comparison.test = "sweep";
  if (std::abs(d) <= log_tolerance) {
    comparison.verdict = Verdict::Unchanged;
    comparison.reason = "within tolerance";
    return;
  }
  const bool slower = d > 0;
  const double p = slower ? sweep.p_slower : sweep.p_faster;
  comparison.p_value = p;
  comparison.verdict = Verdict::Noisy;
  const auto [base_low, base_high] = rangeOf(base);
  const auto [current_low, current_high] = rangeOf(current);
  const bool separated = slower ? current_low > base_high : current_high < base_low;
  const double sweep_change = slower ? sweep.median_change : -sweep.median_change;
  if (!separated) comparison.reason = "within noise (the two sides' ranges overlap)";
  else if (p >= alpha)
    comparison.reason = fmt::format("within noise (sweep of {} sizes not {} as a whole: {} p={:.2g} >= {})",
                                    sweep.sizes, slower ? "slower" : "faster", testOf(sweep), p, alpha);
  else if (sweep_change <= sweep_threshold)
    comparison.reason =
        fmt::format("within noise (sweep median {:+.1f}% inside the run-to-run spread ±{:.1f}%)",
                    100 * std::expm1(sweep.median_change), 100 * std::expm1(sweep_threshold));
  else {
    comparison.verdict = slower ? Verdict::Regression : Verdict::Improvement;
    comparison.reason = fmt::format("{} (ranges apart; sweep of {} sizes {:+.1f}%, {} p={:.2g})",
                                    slower ? "slower" : "faster", sweep.sizes,
                                    100 * std::expm1(sweep.median_change), testOf(sweep), p);
  }
}

int verdictOrder(Verdict verdict) {
  return static_cast<int>(verdict);
}

std::string percent(double fraction) {
  return fmt::format("{:+.1f}%", 100 * fraction);
}

nlohmann::json keyJson(const CheckKey& key) {
  return {{"collective", std::string(name(key.collective))},
          {"strategy", key.strategy},
          {"dtype", std::string(name(key.dtype))},
          {"bytes", key.bytes},
          {"world", key.world}};
}

// The rules of a recommendation JSON text: (api, dtype, min_bytes, max_bytes) → strategy.
using RuleKey = std::tuple<std::string, std::string, std::int64_t, std::int64_t>;
std::map<RuleKey, std::string> rulesOf(const std::string& text, const std::string& trace) {
  std::map<RuleKey, std::string> rules;
  try {
    const auto json = nlohmann::json::parse(text);
    for (const auto& rule : json.at("rules"))
      rules[{rule.at("api").get<std::string>(), rule.at("dtype").get<std::string>(),
             rule.at("min_bytes").get<std::int64_t>(), rule.at("max_bytes").get<std::int64_t>()}] =
          rule.at("strategy").get<std::string>();
  } catch (const nlohmann::json::exception& error) {
    fail("{}: its recommendation is not a valid recommendation file ({})", trace, error.what());
  }
  return rules;
}

}  // namespace

std::string_view name(Verdict verdict) {
  switch (verdict) {
    case Verdict::Regression: return "regression";
    case Verdict::Improvement: return "improvement";
    case Verdict::Noisy: return "noisy";
    case Verdict::Unchanged: return "unchanged";
  }
  return "unchanged";
}

int CheckResult::count(Verdict verdict) const {
  return static_cast<int>(
      std::count_if(comparisons.begin(), comparisons.end(),
                    [&](const KeyComparison& c) { return c.verdict == verdict; }) +
      std::count_if(runs.begin(), runs.end(), [&](const RunComparison& c) { return c.verdict == verdict; }));
}

int CheckResult::exitCode() const {
  if (count(Verdict::Regression) > 0) return kCheckExitRegression;
  if (recommendations_compared && !rule_changes.empty()) return kCheckExitRecommendationChanged;
  return kCheckExitOk;
}

double mannWhitneyGreater(const std::vector<double>& baseline, const std::vector<double>& current) {
  const std::size_t n1 = baseline.size(), n2 = current.size();
  if (n1 == 0 || n2 == 0) return 1;
  // Ranks of the pooled samples, average ranks for ties.
  std::vector<std::pair<double, bool>> pooled;  // value, from current
  for (double v : baseline) pooled.emplace_back(v, false);
  for (double v : current) pooled.emplace_back(v, true);
  std::sort(pooled.begin(), pooled.end());
  const std::size_t n = pooled.size();
  double rank_sum = 0, tie_term = 0;
  bool ties = false;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j + 1 < n && pooled[j + 1].first == pooled[i].first) ++j;
    const double rank = 0.5 * static_cast<double>(i + j) + 1;
    const auto t = static_cast<double>(j - i + 1);
    if (j > i) ties = true;
    tie_term += t * t * t - t;
    for (std::size_t k = i; k <= j; ++k)
      if (pooled[k].second) rank_sum += rank;
    i = j + 1;
  }
  const double u = rank_sum - static_cast<double>(n2 * (n2 + 1)) / 2;  // pairs with current > baseline
  if (!ties && n1 * n2 <= 400) {
    // Exact: count the subsets of n2 ranks out of 1..n by their sum (as probabilities, so no overflow).
    const std::size_t max_sum = n * (n + 1) / 2;
    std::vector<std::vector<double>> ways(n2 + 1, std::vector<double>(max_sum + 1, 0));
    ways[0][0] = 1;
    for (std::size_t r = 1; r <= n; ++r)
      for (std::size_t k = std::min(r, n2); k >= 1; --k)
        for (std::size_t s = max_sum; s >= r; --s) ways[k][s] += ways[k - 1][s - r];
    double total = 0, tail = 0;
    for (std::size_t s = 0; s <= max_sum; ++s) {
      total += ways[n2][s];
      if (static_cast<double>(s) >= rank_sum - 1e-9) tail += ways[n2][s];
    }
    return tail / total;
  }
  const double mean = static_cast<double>(n1 * n2) / 2;
  const double nd = static_cast<double>(n);
  const double variance = static_cast<double>(n1 * n2) / 12 * ((nd + 1) - tie_term / (nd * (nd - 1)));
  if (variance <= 0) return u > mean ? 0 : 1;
  const double z = (u - mean - 0.5) / std::sqrt(variance);
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

double wilcoxonGreater(const std::vector<double>& differences) {
  std::vector<double> d;
  for (double x : differences)
    if (x != 0 && std::isfinite(x)) d.push_back(x);
  const std::size_t n = d.size();
  if (n == 0) return 1;
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return std::abs(d[a]) < std::abs(d[b]); });
  // Doubled average ranks keep ties integral for the exact distribution.
  std::vector<std::size_t> rank2(n);
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j + 1 < n && std::abs(d[order[j + 1]]) == std::abs(d[order[i]])) ++j;
    for (std::size_t k = i; k <= j; ++k) rank2[order[k]] = i + j + 2;
    i = j + 1;
  }
  std::size_t w = 0, total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    total += rank2[i];
    if (d[i] > 0) w += rank2[i];
  }
  std::vector<double> probability(total + 1, 0);
  probability[0] = 1;
  for (std::size_t r : rank2)
    for (std::size_t s = total + 1; s-- > 0;)
      probability[s] = 0.5 * (probability[s] + (s >= r ? probability[s - r] : 0));
  double tail = 0;
  for (std::size_t s = w; s <= total; ++s) tail += probability[s];
  return std::min(1.0, tail);
}

CheckResult checkTraces(const std::string& baseline_path, const std::string& current_path,
                        const CheckOptions& options) {
  if (!(options.tolerance >= 0)) fail("tolerance {} is negative (give e.g. 5% or 0.05)", options.tolerance);
  CheckResult result;
  // Observed runs: compared when both have enough steps; then measurements are compared only where both
  // traces have some.
  RunFigures base_run, current_run;
  {
    std::error_code error;
    if (std::filesystem::exists(baseline_path, error) && std::filesystem::exists(current_path, error)) {
      // The two at once: each reads every call of its trace.
      auto base_later = std::async(std::launch::async, [&baseline_path] {
        return runFigures(storage::TraceReader::open(baseline_path));
      });
      current_run = runFigures(storage::TraceReader::open(current_path));
      base_run = base_later.get();
    }
  }
  const bool runs_compared = base_run.steps >= 2 * kRunBlocks && current_run.steps >= 2 * kRunBlocks;
  const bool measurements_compared =
      !runs_compared || (hasMeasurements(baseline_path) && hasMeasurements(current_path));
  const SampleMap base = measurements_compared ? load(baseline_path, "baseline") : SampleMap{};
  const SampleMap current = measurements_compared ? load(current_path, "current") : SampleMap{};

  result.baseline_path = baseline_path;
  result.current_path = current_path;
  result.tolerance = options.tolerance;
  result.alpha = options.alpha;
  const double log_tolerance = std::log1p(options.tolerance);

  std::vector<std::pair<const Samples*, const Samples*>> sides;
  for (const auto& [key, samples] : base) {
    const auto match = current.find(key);
    if (match == current.end()) {
      result.not_compared.push_back({key, true});
      continue;
    }
    KeyComparison comparison;
    comparison.key = key;
    comparison.baseline_rows = static_cast<int>(samples.medians.size());
    comparison.current_rows = static_cast<int>(match->second.medians.size());
    comparison.baseline_median_ns = median(samples.medians);
    comparison.current_median_ns = median(match->second.medians);
    comparison.change = comparison.baseline_median_ns > 0
                            ? comparison.current_median_ns / comparison.baseline_median_ns - 1
                            : 0;
    result.comparisons.push_back(std::move(comparison));
    sides.emplace_back(&samples, &match->second);
  }
  for (const auto& [key, samples] : current)
    if (!base.contains(key)) result.not_compared.push_back({key, false});

  if (runs_compared) compareRuns(base_run, current_run, options, result);
  if (result.comparisons.empty() && !runs_compared) {
    const std::string base_worlds = worldList(base), current_worlds = worldList(current);
    if (base_worlds != current_worlds)
      fail("{} and {}: world sizes never match (baseline {}, current {}); run both at the same world size",
           baseline_path, current_path, base_worlds, current_worlds);
    fail(
        "{} and {}: no measurement in common (strategy, dtype, size and world differ); benchmark the same "
        "sweep for both",
        baseline_path, current_path);
  }

  // Sweep evidence for the keys with few rows: their log changes grouped by sweep, and where every key of
  // the sweep has several samples on both sides (explorations of a job's gradients: typically 3 each, at
  // only a handful of sizes), each sample's log time relative to its key's baseline median.
  struct SweepSamples {
    std::vector<double> changes;
    std::vector<double> baseline, current;  // log(sample / baseline median of its key)
    bool pooled = true;                     // every key has at least 2 samples on both sides
  };
  std::map<SweepKey, SweepSamples> sweep_samples;
  auto fewRows = [](const KeyComparison& c) {
    return static_cast<std::size_t>(std::min(c.baseline_rows, c.current_rows)) < kMinRowsForRankTest;
  };
  for (std::size_t i = 0; i < result.comparisons.size(); ++i) {
    const auto& comparison = result.comparisons[i];
    if (!fewRows(comparison)) continue;
    auto& sweep = sweep_samples[sweepOf(comparison.key)];
    sweep.changes.push_back(logChange(comparison));
    const Samples& before = *sides[i].first;
    const Samples& after = *sides[i].second;
    if (before.medians.size() < 2 || after.medians.size() < 2 || !(comparison.baseline_median_ns > 0)) {
      sweep.pooled = false;
      continue;
    }
    for (double v : before.medians) sweep.baseline.push_back(std::log(v / comparison.baseline_median_ns));
    for (double v : after.medians) sweep.current.push_back(std::log(v / comparison.baseline_median_ns));
  }
  std::map<SweepKey, SweepEvidence> sweeps;
  std::vector<double> sweep_medians;
  for (const auto& [key, sweep] : sweep_samples) {
    SweepEvidence evidence;
    evidence.sizes = sweep.changes.size();
    evidence.median_change = median(sweep.changes);
    if (sweep.pooled) {
      // Whether the current samples lie above (below) the baseline's by more than the tolerance, all
      // sizes pooled: a rank test on the samples, which a sweep of few sizes still has enough of.
      std::vector<double> slower, faster;
      for (double v : sweep.current) {
        slower.push_back(v - log_tolerance);
        faster.push_back(v + log_tolerance);
      }
      evidence.p_slower = mannWhitneyGreater(sweep.baseline, slower);
      evidence.p_faster = mannWhitneyGreater(faster, sweep.baseline);
      evidence.pooled_samples = sweep.baseline.size() + sweep.current.size();
    } else {
      // One sample per size on a side (a bench run): whether the sizes' changes clear the tolerance.
      std::vector<double> above, below;
      for (double d : sweep.changes) {
        above.push_back(d - log_tolerance);
        below.push_back(-d - log_tolerance);
      }
      evidence.p_slower = wilcoxonGreater(above);
      evidence.p_faster = wilcoxonGreater(below);
    }
    sweeps[key] = evidence;
    sweep_medians.push_back(evidence.median_change);
  }
  double sweep_spread = 0;
  if (sweep_medians.size() >= 3) {
    const double center = median(sweep_medians);
    std::vector<double> deviations;
    for (double m : sweep_medians) deviations.push_back(std::abs(m - center));
    sweep_spread = kMadToSigma * median(deviations);
  }
  const double sweep_threshold = log_tolerance + kSweepSpreadFactor * sweep_spread;

  for (std::size_t i = 0; i < result.comparisons.size(); ++i) {
    auto& comparison = result.comparisons[i];
    if (fewRows(comparison))
      judgeBySweep(comparison, *sides[i].first, *sides[i].second, sweeps.at(sweepOf(comparison.key)),
                   sweep_threshold, log_tolerance, options.alpha);
    else judgeByRankTest(comparison, *sides[i].first, *sides[i].second, log_tolerance, options.alpha);
  }
  std::stable_sort(result.comparisons.begin(), result.comparisons.end(),
                   [](const KeyComparison& a, const KeyComparison& b) {
                     if (a.verdict != b.verdict) return verdictOrder(a.verdict) < verdictOrder(b.verdict);
                     if (a.verdict == Verdict::Regression) return a.change > b.change;
                     if (a.verdict == Verdict::Improvement) return a.change < b.change;
                     return false;
                   });

  if (options.recommend_json) {
    // The two recommendations read different files: made side by side (each reads a ten-million-call
    // trace in about a second).
    auto baseline_json = std::async(std::launch::async, options.recommend_json, baseline_path);
    const std::string current_json = options.recommend_json(current_path);
    const auto before = rulesOf(baseline_json.get(), baseline_path);
    const auto after = rulesOf(current_json, current_path);
    result.recommendations_compared = true;
    std::map<RuleKey, std::pair<std::string, std::string>> all;
    for (const auto& [key, strategy] : before) all[key].first = strategy;
    for (const auto& [key, strategy] : after) all[key].second = strategy;
    for (const auto& [key, strategies] : all)
      if (strategies.first != strategies.second)
        result.rule_changes.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key),
                                       strategies.first, strategies.second});
  }
  return result;
}

// ---- Outputs ------------------------------------------------------------------------------------------

void writeCheckText(const CheckResult& result, std::ostream& out) {
  const int regressions = result.count(Verdict::Regression);
  out << fmt::format("gradscope check: {} against baseline {} (tolerance {:.1f}%, alpha {})\n",
                     result.current_path, result.baseline_path, 100 * result.tolerance, result.alpha);
  out << fmt::format("{}: {} compared, {} regressed, {} improved, {} noisy, {} unchanged, {} not compared\n",
                     regressions > 0 ? "REGRESSION" : "OK", result.comparisons.size() + result.runs.size(),
                     regressions, result.count(Verdict::Improvement), result.count(Verdict::Noisy),
                     result.count(Verdict::Unchanged), result.not_compared.size());
  // The runs' figures are few and what the user asked about: every one is listed.
  if (!result.runs.empty()) {
    out << fmt::format("\nThe runs, step by step ({} against {} steps; medians per step):\n",
                       result.runs.front().current_steps, result.runs.front().baseline_steps);
    out << fmt::format("{:<12} {:<34} {:>11} {:>11} {:>8}  {}\n", "verdict", "figure", "baseline", "current",
                       "change", "evidence");
    for (const auto& c : result.runs)
      out << fmt::format("{:<12} {:<34} {:>11} {:>11} {:>8}  {}\n", name(c.verdict), c.what,
                         formatDuration(c.baseline_ns), formatDuration(c.current_ns), percent(c.change),
                         c.reason);
  }
  // Regressions and improvements only: a noisy machine makes half of a sweep's keys "noisy", and a
  // terminal is no place for a hundred of them (the markdown summary and the JSON list every key).
  bool header = false;
  for (const auto& c : result.comparisons) {
    if (c.verdict == Verdict::Unchanged || c.verdict == Verdict::Noisy) continue;
    if (!header) {
      out << fmt::format("\n{:<12} {:<28} {:<11} {:<6} {:>9} {:>5} {:>11} {:>11} {:>8}  {}\n", "verdict",
                         "strategy", "collective", "dtype", "size", "world", "baseline", "current", "change",
                         "evidence");
      header = true;
    }
    out << fmt::format("{:<12} {:<28} {:<11} {:<6} {:>9} {:>5} {:>11} {:>11} {:>8}  {}\n", name(c.verdict),
                       c.key.strategy, name(c.key.collective), name(c.key.dtype),
                       formatBytes(static_cast<std::uint64_t>(c.key.bytes)), c.key.world,
                       formatDuration(c.baseline_median_ns), formatDuration(c.current_median_ns),
                       percent(c.change), c.reason);
  }
  if (const int noisy = result.count(Verdict::Noisy); noisy > 0)
    out << fmt::format(
        "\n{} key{} changed by more than the tolerance but within the measured noise (listed in "
        "--summary and --json)\n",
        noisy, noisy == 1 ? "" : "s");
  if (!result.not_compared.empty()) {
    out << fmt::format("\nNot compared ({}):\n", result.not_compared.size());
    for (const auto& n : result.not_compared)
      out << fmt::format("  {} {} {} {} world {}: only in the {}\n", n.key.strategy, name(n.key.collective),
                         name(n.key.dtype), formatBytes(static_cast<std::uint64_t>(n.key.bytes)), n.key.world,
                         n.in_baseline ? "baseline" : "current trace");
  }
  if (result.recommendations_compared) {
    if (result.rule_changes.empty()) out << "\nRecommendation: unchanged\n";
    else {
      out << fmt::format("\nRecommendation changed ({} rules):\n", result.rule_changes.size());
      for (const auto& r : result.rule_changes)
        out << fmt::format("  {} {} {}..{} bytes: {} -> {}\n", r.api, r.dtype, r.min_bytes, r.max_bytes,
                           r.baseline_strategy.empty() ? "(no rule)" : r.baseline_strategy,
                           r.current_strategy.empty() ? "(no rule)" : r.current_strategy);
    }
  }
}

void writeCheckMarkdown(const CheckResult& result, std::ostream& out) {
  const int regressions = result.count(Verdict::Regression);
  const int improvements = result.count(Verdict::Improvement);
  if (regressions > 0)
    out << fmt::format("### ❌ gradscope check: {} regression{} beyond {:.1f}% and noise\n\n", regressions,
                       regressions == 1 ? "" : "s", 100 * result.tolerance);
  else if (result.exitCode() == kCheckExitRecommendationChanged)
    out << fmt::format("### ❌ gradscope check: no regression, but the recommendation changed\n\n");
  else
    out << fmt::format("### ✅ gradscope check: no regression beyond {:.1f}% and noise\n\n",
                       100 * result.tolerance);
  out << fmt::format("Current `{}` against baseline `{}`: {} compared, {} regressed, {} improved.\n",
                     result.current_path, result.baseline_path,
                     result.comparisons.size() + result.runs.size(), regressions, improvements);
  if (!result.runs.empty()) {
    out << "\n| | figure (per step) | baseline | current | change | evidence "
           "|\n|---|---|---:|---:|---:|---|\n";
    for (const auto& c : result.runs)
      out << fmt::format("| {} | {} | {} | {} | {} | {} |\n",
                         c.verdict == Verdict::Regression    ? "❌ regression"
                         : c.verdict == Verdict::Improvement ? "✅ improvement"
                                                             : std::string(name(c.verdict)),
                         c.what, formatDuration(c.baseline_ns), formatDuration(c.current_ns),
                         percent(c.change), c.reason);
  }
  if (regressions + improvements > 0) {
    out << "\n| | strategy | collective | dtype | size | world | baseline | current | change | evidence |\n"
        << "|---|---|---|---|---:|---:|---:|---:|---:|---|\n";
    for (const auto& c : result.comparisons) {
      if (c.verdict != Verdict::Regression && c.verdict != Verdict::Improvement) continue;
      out << fmt::format("| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                         c.verdict == Verdict::Regression ? "❌ regression" : "✅ improvement", c.key.strategy,
                         name(c.key.collective), name(c.key.dtype),
                         formatBytes(static_cast<std::uint64_t>(c.key.bytes)), c.key.world,
                         formatDuration(c.baseline_median_ns), formatDuration(c.current_median_ns),
                         percent(c.change), c.reason);
    }
  }
  if (result.recommendations_compared && !result.rule_changes.empty()) {
    out << "\n| recommendation rule | baseline | current |\n|---|---|---|\n";
    for (const auto& r : result.rule_changes)
      out << fmt::format("| {} {} {}..{} bytes | {} | {} |\n", r.api, r.dtype, r.min_bytes, r.max_bytes,
                         r.baseline_strategy.empty() ? "(no rule)" : "`" + r.baseline_strategy + "`",
                         r.current_strategy.empty() ? "(no rule)" : "`" + r.current_strategy + "`");
  }
  out << fmt::format("\n<details><summary>{} unchanged, {} noisy, {} not compared</summary>\n\n",
                     result.count(Verdict::Unchanged), result.count(Verdict::Noisy),
                     result.not_compared.size());
  out << fmt::format("- unchanged (within {:.1f}%): {}\n", 100 * result.tolerance,
                     result.count(Verdict::Unchanged));
  out << fmt::format("- noisy (beyond {:.1f}% but within the measured noise): {}\n", 100 * result.tolerance,
                     result.count(Verdict::Noisy));
  for (const auto& c : result.comparisons)
    if (c.verdict == Verdict::Noisy)
      out << fmt::format("  - `{}` {} {} {}: {} ({})\n", c.key.strategy, name(c.key.dtype),
                         formatBytes(static_cast<std::uint64_t>(c.key.bytes)), c.key.world, percent(c.change),
                         c.reason);
  out << fmt::format("- not compared (in one trace only): {}\n", result.not_compared.size());
  if (result.recommendations_compared && result.rule_changes.empty()) out << "- recommendation: unchanged\n";
  out << "\n</details>\n";
}

std::string checkJson(const CheckResult& result) {
  nlohmann::json comparisons = nlohmann::json::array(), not_compared = nlohmann::json::array();
  for (const auto& c : result.comparisons) {
    auto row = keyJson(c.key);
    row["baseline_rows"] = c.baseline_rows;
    row["current_rows"] = c.current_rows;
    row["baseline_median_ns"] = c.baseline_median_ns;
    row["current_median_ns"] = c.current_median_ns;
    row["change"] = c.change;
    row["verdict"] = std::string(name(c.verdict));
    row["test"] = c.test;
    row["p_value"] = c.p_value ? nlohmann::json(*c.p_value) : nlohmann::json(nullptr);
    row["reason"] = c.reason;
    comparisons.push_back(std::move(row));
  }
  for (const auto& n : result.not_compared) {
    auto row = keyJson(n.key);
    row["only_in"] = n.in_baseline ? "baseline" : "current";
    not_compared.push_back(std::move(row));
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& c : result.runs)
    runs.push_back({{"figure", c.what},
                    {"baseline_steps", c.baseline_steps},
                    {"current_steps", c.current_steps},
                    {"baseline_median_ns", c.baseline_ns},
                    {"current_median_ns", c.current_ns},
                    {"change", c.change},
                    {"verdict", std::string(name(c.verdict))},
                    {"p_value", c.p_value ? nlohmann::json(*c.p_value) : nlohmann::json(nullptr)},
                    {"reason", c.reason}});
  nlohmann::json recommendation = nullptr;
  if (result.recommendations_compared) {
    nlohmann::json rules = nlohmann::json::array();
    auto strategyOrNull = [](const std::string& strategy) {
      return strategy.empty() ? nlohmann::json(nullptr) : nlohmann::json(strategy);
    };
    for (const auto& r : result.rule_changes) {
      nlohmann::json rule = {
          {"api", r.api}, {"dtype", r.dtype}, {"min_bytes", r.min_bytes}, {"max_bytes", r.max_bytes}};
      rule["baseline"] = strategyOrNull(r.baseline_strategy);
      rule["current"] = strategyOrNull(r.current_strategy);
      rules.push_back(std::move(rule));
    }
    recommendation = {{"changed", !result.rule_changes.empty()}, {"rules", std::move(rules)}};
  }
  const nlohmann::json json = {
      {"version", 1},
      {"baseline", result.baseline_path},
      {"current", result.current_path},
      {"tolerance", result.tolerance},
      {"alpha", result.alpha},
      {"exit_code", result.exitCode()},
      {"totals",
       {{"compared", result.comparisons.size() + result.runs.size()},
        {"regression", result.count(Verdict::Regression)},
        {"improvement", result.count(Verdict::Improvement)},
        {"noisy", result.count(Verdict::Noisy)},
        {"unchanged", result.count(Verdict::Unchanged)},
        {"not_compared", result.not_compared.size()}}},
      {"comparisons", std::move(comparisons)},
      {"runs", std::move(runs)},
      {"not_compared", std::move(not_compared)},
      {"recommendation", std::move(recommendation)},
  };
  return json.dump(2) + "\n";
}

// ---- The command ------------------------------------------------------------------------------------------

double parseTolerance(std::string_view text) {
  std::string_view number = text;
  const bool percent_sign = !number.empty() && number.back() == '%';
  if (percent_sign) number.remove_suffix(1);
  double value = 0;
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
  // from_chars reads "inf" too: an infinite tolerance would pass every slowdown, so it is refused.
  if (number.empty() || error != std::errc() || end != number.data() + number.size() || !(value >= 0) ||
      !std::isfinite(value))
    fail("tolerance '{}' is not a percentage or fraction (write e.g. 5% or 0.05)", text);
  if (percent_sign) return value / 100;
  if (value >= 1)
    fail("tolerance '{}' is ambiguous (write {}% for percent, or a fraction below 1)", text, text);
  return value;
}

namespace {

// The step-gain gate: the validation stored in `path` (gradscope run --validate) against `min_gain`.
bool stepGainHolds(const std::string& path, double min_gain, std::ostream& out) {
  std::optional<Validation> validation;
  for (const auto& run : storage::TraceReader::open(path).runs())
    if (auto stored = storedValidation(run)) validation = std::move(stored);
  if (!validation)
    fail(
        "{}: no validation of a plan in this trace (record one with gradscope run --mode apply "
        "--recommendation "
        "FILE --validate N)",
        path);
  // A gate on proof: the gain's whole 95% interval at or above the minimum. On its point estimate alone the
  // gate passed a run whose windows, disturbed by another process, measured "71% faster [-51%, 90%]".
  const double gain = -validation->change, gain_low = -validation->change_high;
  const bool holds = gain_low >= min_gain;
  const std::string_view why = holds ? ""
                               : gain < min_gain
                                   ? ": below it"
                                   : ": its 95% interval reaches below it (the run does not show "
                                     "that gain: a longer run, or a quieter machine, narrows it)";
  out << fmt::format(
      "{}: the plan made the step {:.2f}% faster [{:.2f}%, {:.2f}%], measured in {}; --min-step-gain "
      "{:.2f}%{}\n",
      holds ? "OK" : "REGRESSION", 100 * gain, 100 * gain_low, -100 * validation->change_low, path,
      100 * min_gain, why);
  out << fmt::format("  {}\n", describe(*validation));
  return holds;
}

}  // namespace

int runCheckCommand(const CheckCommand& command,
                    const std::function<std::string(const std::string& trace_path)>& recommend_json,
                    std::ostream& out, std::ostream& err) {
  try {
    if (command.baseline.empty() && !command.min_step_gain)
      fail("check needs --baseline BASE.db (or --min-step-gain G for a validated apply run)");
    if (command.min_step_gain && !(*command.min_step_gain > -1 && *command.min_step_gain < 1))
      fail("--min-step-gain {} is not a fraction of the step (write e.g. 2% or 0.02)",
           *command.min_step_gain);
    int code = kCheckExitOk;
    if (!command.baseline.empty()) {
      CheckOptions options;
      options.tolerance = command.tolerance;
      if (command.fail_on_change) {
        if (!recommend_json) fail("--fail-on-change needs the recommender, which this build lacks");
        options.recommend_json = recommend_json;
      }
      const CheckResult result = checkTraces(command.baseline, command.current, options);
      writeCheckText(result, out);
      if (!command.summary_path.empty()) {
        std::ofstream summary(command.summary_path, std::ios::app);
        writeCheckMarkdown(result, summary);
        if (!summary.flush())
          fail("{}: cannot write the summary (check the directory exists and is writable)",
               command.summary_path);
      }
      if (!command.json_path.empty()) storage::writePrivateFile(command.json_path, checkJson(result));
      code = result.exitCode();
    } else if (command.fail_on_change || !command.summary_path.empty() || !command.json_path.empty()) {
      fail("--fail-on-change, --summary and --json compare with a baseline: give --baseline BASE.db");
    }
    if (command.min_step_gain && !stepGainHolds(command.current, *command.min_step_gain, out))
      code = kCheckExitRegression;
    return code;
  } catch (const Error& error) {
    err << "gradscope: " << error.what() << "\n";
    return kCheckExitBadInput;
  }
}

}  // namespace gradscope::tuner
