// The recommender: models x workload -> rules, with the reasoning a user needs to trust them.

#include "gradscope/tuner/recommend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "gradscope/common/error.h"
#include "gradscope/common/strategy_name.h"
#include "gradscope/common/units.h"
#include "gradscope/common/version.h"

namespace gradscope::tuner {
namespace {

bool isReduction(Api api) {
  return api == Api::MpiAllreduce || api == Api::MpiIallreduce || api == Api::NcclAllReduce;
}

std::string nowIso8601() {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                     utc.tm_hour, utc.tm_min, utc.tm_sec);
}

std::string interval(const TimeInterval& time) {
  return fmt::format("{} [{}, {}]", formatDuration(time.median_ns), formatDuration(time.low_ns),
                     formatDuration(time.high_ns));
}

TimeInterval scaled(const TimeInterval& time, double factor) {
  return {time.median_ns * factor, time.low_ns * factor, time.high_ns * factor};
}

void add(TimeInterval& sum, const TimeInterval& time) {
  sum.median_ns += time.median_ns;
  sum.low_ns += time.low_ns;
  sum.high_ns += time.high_ns;
}

// A workload of very many distinct sizes (a job that reduces arbitrary tensor sizes one by one) is
// predicted per size class: neighbouring sizes within 1/256 of an octave (0.27%) are one entry at their
// call-weighted mean size, which gives the models' predictions to well under their own uncertainty (the
// interpolation is smooth in log-log; the alpha-beta fit is linear in bytes, exact at the mean). Rules
// still span the classes' smallest to largest size. Returns the number of distinct sizes grouped.
constexpr std::size_t kMaxDistinctSizes = 4096;
constexpr double kClassesPerOctave = 256;

std::size_t groupSizeClasses(std::vector<WorkloadEntry>& workload) {
  if (workload.size() <= kMaxDistinctSizes) return 0;
  const auto sizeClass = [](std::int64_t bytes) {
    return static_cast<std::int64_t>(std::floor(std::log2(static_cast<double>(bytes)) * kClassesPerOctave));
  };
  std::vector<WorkloadEntry> classes;
  double weighted_bytes = 0;
  const auto close = [&] {
    auto& last = classes.back();
    last.bytes = std::clamp(static_cast<std::int64_t>(std::llround(weighted_bytes / last.calls_per_step)),
                            last.min_bytes, last.max_bytes);
  };
  for (const auto& entry : workload) {
    const bool same = !classes.empty() && classes.back().api == entry.api &&
                      classes.back().dtype == entry.dtype && entry.bytes > 0 &&
                      classes.back().min_bytes > 0 &&
                      sizeClass(entry.bytes) == sizeClass(classes.back().min_bytes);
    if (same) {
      classes.back().max_bytes = entry.bytes;
      classes.back().calls_per_step += entry.calls_per_step;
      weighted_bytes += static_cast<double>(entry.bytes) * entry.calls_per_step;
      continue;
    }
    if (!classes.empty()) close();
    classes.push_back(entry);
    classes.back().min_bytes = classes.back().max_bytes = entry.bytes;
    weighted_bytes = static_cast<double>(entry.bytes) * entry.calls_per_step;
  }
  close();
  const std::size_t grouped = workload.size();
  workload = std::move(classes);
  return grouped;
}

// What happened to a strategy over the workload, for the reasoning lines.
struct Tally {
  std::string excluded;  // why it was never considered; empty when it was
  int wins = 0, overlaps = 0, slower = 0, unpredicted = 0;
};

std::string joined(const std::set<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// Entries of several files, one per (api, dtype, bytes), in that order, each kind's added up in file order
// by `add`. One file's come sorted already (reductionCounts, the stored exposure): then the check is the
// only pass.
template <typename Entry, typename Add>
std::vector<Entry> addUpByKind(std::vector<Entry> entries, Add add) {
  const auto by_kind = [](const Entry& a, const Entry& b) {
    return std::tie(a.api, a.dtype, a.bytes) < std::tie(b.api, b.dtype, b.bytes);
  };
  if (!std::is_sorted(entries.begin(), entries.end(), by_kind))
    std::stable_sort(entries.begin(), entries.end(), by_kind);
  std::vector<Entry> out;
  out.reserve(entries.size());
  for (const Entry& entry : entries) {
    if (!out.empty() && !by_kind(out.back(), entry)) add(out.back(), entry);
    else out.push_back(entry);
  }
  return out;
}

}  // namespace

bool isKnownStrategy(std::string_view strategy) {
  return parseStrategyName(strategy).has_value();
}

// The mean exposed time per call of the job's `api` `dtype` collectives of min..max bytes (weighted by
// their calls), and the mean transport time; unset when the step model has none of them. `exposure` is
// ordered by api, dtype, bytes: the range is found by a binary search (a scan per rule was a quarter of
// `recommend` on a job with 887,000 sizes).
std::optional<std::pair<double, double>> exposedPerCall(const std::vector<storage::CallExposure>& exposure,
                                                        Api api, DType dtype, std::int64_t min_bytes,
                                                        std::int64_t max_bytes) {
  double calls = 0, exposed = 0, transport = 0;
  auto entry =
      std::lower_bound(exposure.begin(), exposure.end(), std::tuple{api, dtype, min_bytes},
                       [](const storage::CallExposure& a, const std::tuple<Api, DType, std::int64_t>& b) {
                         return std::tie(a.api, a.dtype, a.bytes) < b;
                       });
  for (; entry != exposure.end() && entry->api == api && entry->dtype == dtype && entry->bytes <= max_bytes;
       ++entry) {
    calls += static_cast<double>(entry->calls);
    exposed += entry->exposed_ns * static_cast<double>(entry->calls);
    transport += entry->transport_ns * static_cast<double>(entry->calls);
  }
  if (calls <= 0) return std::nullopt;
  return std::pair{exposed / calls, transport / calls};
}

Inputs readInputs(const std::vector<std::string>& paths) {
  Inputs inputs;
  // (api, dtype, bytes, calls per step) of every file, summed per key below: a sort, not a tree of
  // hundreds of thousands of nodes.
  std::vector<WorkloadEntry> rates;
  int files_with_calls = 0;
  bool steps_known = true;
  double cosine_sum = 0;
  std::int64_t cosine_rows = 0;
  std::vector<std::int64_t> step_spans;         // every file's steps
  std::vector<storage::CallExposure> exposure;  // every file's, as sums; added up per key below
  for (const auto& path : paths) {
    const auto reader = storage::TraceReader::open(path);
    const storage::StepModel model = storage::readOrComputeStepModel(reader, {.step_calls = false});
    for (const auto& step : storage::stepTotals(model.steps)) step_spans.push_back(step.span_ns);
    exposure.reserve(exposure.size() + model.exposure.size());
    for (storage::CallExposure entry : model.exposure) {
      entry.transport_ns *= static_cast<double>(entry.calls);
      entry.exposed_ns *= static_cast<double>(entry.calls);
      exposure.push_back(entry);
    }
    for (auto& run : reader.runs()) inputs.runs.push_back(std::move(run));
    std::vector<MeasurementRow> measured = loadMeasurements(reader);
    if (!model.steps.empty()) {
      std::map<std::int64_t, int> rank_of;
      for (const auto& rank : reader.ranks()) rank_of[rank.id] = rank.rank;
      AsyncAnalysis async = analyzeAsync(
          model.steps, measured,
          [&](std::int64_t id) {
            const auto found = rank_of.find(id);
            return found == rank_of.end() ? fmt::format("#{}", id) : std::to_string(found->second);
          },
          cpuSharing(reader));
      if (async.why_not.empty() && (!inputs.async || async.steps > inputs.async->steps))
        inputs.async = std::move(async);
    }
    for (auto& row : measured) inputs.measurements.push_back(std::move(row));
    for (const auto& row : reader.consensus()) cosine_sum += row.cosine_to_mean, ++cosine_rows;

    const auto counts = reader.reductionCounts();
    bool any = false;
    // Every rank issues the job's reductions, so a rank's share is what one step of the job costs.
    const double per = static_cast<double>(std::max<std::int64_t>(1, counts.ranks)) *
                       static_cast<double>(std::max<std::int64_t>(1, counts.steps));
    rates.reserve(rates.size() + counts.sizes.size());
    for (const auto& size : counts.sizes) {
      if (!isReduction(size.api) || size.op != ReduceOp::Sum || size.bytes <= 0) {
        inputs.other_reductions += size.calls;
        continue;
      }
      rates.push_back({size.api, size.dtype, size.bytes, static_cast<double>(size.calls) / per});
      any = true;
    }
    if (!any) continue;
    ++files_with_calls;
    steps_known = steps_known && counts.steps > 0;
  }
  inputs.steps_known = files_with_calls > 0 && steps_known;
  // Several files with calls are taken as repeats of one job: their rates are averaged, not added.
  inputs.workload = addUpByKind(std::move(rates), [](WorkloadEntry& sum, const WorkloadEntry& entry) {
    sum.calls_per_step += entry.calls_per_step;
  });
  for (auto& entry : inputs.workload) entry.calls_per_step /= files_with_calls;
  if (cosine_rows > 0) inputs.mean_cosine_to_mean = cosine_sum / static_cast<double>(cosine_rows);
  if (!step_spans.empty()) {
    std::nth_element(step_spans.begin(),
                     step_spans.begin() + static_cast<std::ptrdiff_t>(step_spans.size() / 2),
                     step_spans.end());
    inputs.step_ns = static_cast<double>(step_spans[step_spans.size() / 2]);
  }
  inputs.exposure =
      addUpByKind(std::move(exposure), [](storage::CallExposure& sum, const storage::CallExposure& entry) {
        sum.calls += entry.calls;
        sum.transport_ns += entry.transport_ns;
        sum.exposed_ns += entry.exposed_ns;
      });
  for (auto& entry : inputs.exposure) {
    entry.transport_ns /= static_cast<double>(entry.calls);
    entry.exposed_ns /= static_cast<double>(entry.calls);
  }
  return inputs;
}

// Synchronous or asynchronous: a choice for the whole job (a reduction left synchronous would keep the
// ranks in lock-step), weighed on the step against what the synchronous plan saves there.
void chooseAsync(const Inputs& inputs, const RecommendOptions& options,
                 const std::vector<WorkloadEntry>& workload, Result& result) {
  Report& report = result.report;
  report.async = inputs.async;
  if (!inputs.async || inputs.async->options.empty()) return;
  const AsyncAnalysis& async = *inputs.async;
  const double sync_saving = std::max(0.0, report.step_saving_ns.value_or(0.0));
  const AsyncOption* chosen = nullptr;
  std::vector<std::string> excluded;
  for (const AsyncOption& option : async.options) {
    std::string why;
    if (!option.error_median) why = "its error was never measured (run explore mode)";
    else if (!options.allow_semantic_change)
      why = "changes what the job computes (allow it with --allow-semantic-change)";
    else if (options.max_rel_error > 0 && *option.error_median > options.max_rel_error)
      why = fmt::format("measured gradient error {:.3g} per step is above the budget {:.3g}",
                        *option.error_median, options.max_rel_error);
    else if (option.saving_low_ns <= sync_saving)
      why = fmt::format("saves {} on the step [{}, {}], not surely more than the synchronous plan's {}",
                        formatDuration(option.saving_ns), formatDuration(option.saving_low_ns),
                        formatDuration(option.saving_high_ns), formatDuration(sync_saving));
    if (!why.empty()) {
      excluded.push_back(fmt::format("{}: {}", option.strategy, why));
      continue;
    }
    if (chosen == nullptr || option.saving_ns > chosen->saving_ns) chosen = &option;
  }
  std::vector<std::string>& reasoning = report.reasoning;
  for (const std::string& line : excluded) reasoning.push_back(fmt::format("Excluded {}.", line));
  if (chosen == nullptr) return;
  // One rule per (api, dtype) over the workload's sizes.
  Recommendation& recommendation = result.recommendation;
  recommendation.rules.clear();
  for (const WorkloadEntry& entry : workload) {
    const std::int64_t low = entry.min_bytes > 0 ? entry.min_bytes : entry.bytes;
    const std::int64_t high = entry.max_bytes > 0 ? entry.max_bytes : entry.bytes;
    if (!recommendation.rules.empty() && recommendation.rules.back().api == entry.api &&
        recommendation.rules.back().dtype == entry.dtype) {
      recommendation.rules.back().max_bytes = std::max(recommendation.rules.back().max_bytes, high);
      continue;
    }
    RecommendationRule rule;
    rule.api = entry.api;
    rule.dtype = entry.dtype;
    rule.min_bytes = low;
    rule.max_bytes = high;
    rule.world_size = report.world;
    rule.strategy = chosen->strategy;
    rule.error_class = ErrorClass::Semantic;
    rule.measured_rel_error = chosen->error_median;
    rule.baseline_strategy = std::string(kBaselineStrategy);
    rule.evidence = chosen->error_samples;
    recommendation.rules.push_back(std::move(rule));
  }
  // The replay's saving is of its own synchronous step; as a share, it is carried onto the measured mean
  // step (what a validation compares with) and the median step the report gives.
  const double share = chosen->saving_ns / async.replay_sync_ns;
  const double scale = async.step_ns / async.replay_sync_ns;
  recommendation.step_saving =
      TimeInterval{chosen->saving_ns * scale, chosen->saving_low_ns * scale, chosen->saving_high_ns * scale};
  report.async_choice = chosen->strategy;
  if (report.step_ns) report.step_saving_ns = share * *report.step_ns;
  const double sync_step = async.replay_sync_ns;
  reasoning.push_back(fmt::format(
      "{} for every reduction: the replayed step goes from {} to {} ({:.1f}% faster, [{:.1f}%, {:.1f}%]), "
      "more "
      "than the synchronous plan saves ({}); measured gradient error {:.3g} per step (worst {:.3g}{}). It "
      "returns each call site's sum of {} step{} before.",
      chosen->strategy, formatDuration(sync_step), formatDuration(chosen->step_ns),
      100 * chosen->saving_ns / sync_step, 100 * chosen->saving_low_ns / sync_step,
      100 * chosen->saving_high_ns / sync_step, formatDuration(sync_saving), *chosen->error_median,
      *chosen->error_worst,
      options.max_rel_error > 0 ? fmt::format(", budget {:.3g}", options.max_rel_error) : std::string(),
      chosen->staleness, chosen->staleness == 1 ? "" : "s"));
}

Result recommend(const Inputs& inputs, const RecommendOptions& options) {
  Result result;
  Report& report = result.report;
  auto& reasoning = report.reasoning;

  std::vector<MeasurementRow> rows;
  for (const auto& row : inputs.measurements)
    if (collectiveOf(row.measurement.api) == Collective::AllReduce) rows.push_back(row);
  if (rows.empty())
    fail(
        "no all-reduce measurements in the input (run gradscope run --mode explore or gradscope bench -o "
        "FILE "
        "first)");

  // The backend: the one the job's reductions use, else the one most measurements were made with.
  std::map<Backend, double> weight;
  for (const auto& entry : inputs.workload) weight[backendOf(entry.api)] += entry.calls_per_step;
  if (weight.empty())
    for (const auto& row : rows) weight[row.backend] += 1;
  Backend backend = Backend::Unknown;
  for (const auto& [candidate, w] : weight)
    if ((candidate == Backend::Mpi || candidate == Backend::Nccl) &&
        (backend == Backend::Unknown || w > weight[backend]))
      backend = candidate;
  if (backend == Backend::Unknown)
    fail(
        "no all-reduce measurements of an MPI or NCCL run (gradscope bench --backend mpi or nccl makes "
        "them)");

  // Unknown names are someone else's (a newer gradscope, a typo in a hand-made file): skipped, not fatal.
  std::set<std::string> unknown;
  std::erase_if(rows, [&](const MeasurementRow& row) {
    if (row.backend != backend) return true;
    if (isKnownStrategy(row.measurement.strategy)) return false;
    unknown.insert(row.measurement.strategy);
    return true;
  });
  if (!unknown.empty())
    reasoning.push_back(fmt::format("Ignored measurements of unknown strategies: {}.", joined(unknown)));
  if (rows.empty()) fail("no measurements of known strategies on the {} backend", name(backend));

  std::set<int> worlds;
  for (const auto& row : rows) worlds.insert(row.measurement.world);
  std::string world_list;
  for (int w : worlds) world_list += (world_list.empty() ? "" : ", ") + std::to_string(w);
  int world = *worlds.begin();
  bool predict_world = false;
  if (options.world) {
    world = *options.world;
    predict_world = !worlds.contains(world);
  } else if (worlds.size() > 1) {
    fail("the measurements are at world sizes {}: choose one with --world N", world_list);
  }
  report.world = world;
  report.world_predicted = predict_world;

  const std::vector<StrategyModel> all_models = buildModels(rows);
  // (strategy, dtype) -> model at `world`.
  std::map<std::pair<std::string, DType>, StrategyModel> models;
  if (!predict_world) {
    for (const auto& model : all_models)
      if (model.key.world == world) models.emplace(std::pair{model.key.strategy, model.key.dtype}, model);
  } else {
    std::map<std::pair<std::string, DType>, std::vector<const StrategyModel*>> by_world;
    for (const auto& model : all_models) by_world[{model.key.strategy, model.key.dtype}].push_back(&model);
    for (const auto& [key, measured] : by_world)
      if (auto model = modelAtWorld(measured, world)) models.emplace(key, std::move(*model));
    bool baseline = false;
    for (const auto& [key, model] : models) baseline |= key.first == kBaselineStrategy;
    if (!baseline)
      fail(
          "--world {} needs sum/native measured with valid fits at two or more world sizes (have {}); run "
          "gradscope "
          "bench at another world size",
          world, world_list);
    reasoning.push_back(fmt::format(
        "World size {} was not measured: every time is a prediction from alpha-beta fits against log(world) "
        "over world sizes {}.",
        world, world_list));
  }

  // The workload: the job's reductions on this backend, or one call of each measured baseline size.
  std::vector<WorkloadEntry> workload;
  workload.reserve(inputs.workload.size());
  for (const auto& entry : inputs.workload)
    if (backendOf(entry.api) == backend) workload.push_back(entry);
  if (workload.size() < inputs.workload.size())
    reasoning.push_back(fmt::format("Ignored the reductions of other backends than {}.", name(backend)));
  if (inputs.other_reductions > 0)
    reasoning.push_back(
        fmt::format("{} reduction calls are not all-reduce sums; no strategy applies to them.",
                    formatCount(static_cast<std::uint64_t>(inputs.other_reductions))));
  if (workload.empty()) {
    report.workload_from_measurements = true;
    const Api api = backend == Backend::Nccl ? Api::NcclAllReduce : Api::MpiAllreduce;
    for (const auto& [key, model] : models)
      if (key.first == kBaselineStrategy)
        for (const auto& point : model.points) workload.push_back({api, key.second, point.bytes, 1});
    reasoning.push_back(
        "No observed all-reduce calls: the workload is one call of each measured size (per step means per "
        "measured size set).");
  }
  std::sort(workload.begin(), workload.end(), [](const WorkloadEntry& a, const WorkloadEntry& b) {
    return std::tie(a.api, a.dtype, a.bytes) < std::tie(b.api, b.dtype, b.bytes);
  });
  if (const std::size_t distinct = groupSizeClasses(workload))
    reasoning.push_back(fmt::format(
        "The job reduces {} distinct sizes: they are predicted as {} size classes, each at most 0.27% wide.",
        distinct, workload.size()));
  report.steps_known = inputs.steps_known && !report.workload_from_measurements;
  if (!report.steps_known && !report.workload_from_measurements)
    reasoning.push_back("The calls carry no steps: counts are per run, not per step.");

  // Which strategies may be used at all.
  std::map<std::string, Tally> tallies;
  for (const auto& [key, model] : models) {
    if (key.first == kBaselineStrategy) continue;
    auto& tally = tallies[key.first];
    const auto error_class = strategyErrorClass(key.first).value_or(ErrorClass::Semantic);
    if (error_class == ErrorClass::Semantic && !options.allow_semantic_change)
      tally.excluded = "changes what the job computes (allow it with --allow-semantic-change)";
    else if (error_class == ErrorClass::Lossy && options.max_rel_error <= 0)
      tally.excluded = "lossy (allow it with --max-rel-error)";
    else if (error_class == ErrorClass::Lossy && !model.worst_rel_error)
      tally.excluded = "lossy and its error was never measured";
    else if (error_class == ErrorClass::Lossy && *model.worst_rel_error > options.max_rel_error)
      tally.excluded = fmt::format("worst measured relative error {:.3g} is above the budget {:.3g}",
                                   *model.worst_rel_error, options.max_rel_error);
  }

  std::set<DType> missing_baseline;
  bool any_extrapolated = false;
  for (const auto& entry : workload) {
    SizeRow row{entry.api,
                entry.dtype,
                entry.bytes,
                entry.min_bytes > 0 ? entry.min_bytes : entry.bytes,
                entry.max_bytes > 0 ? entry.max_bytes : entry.bytes,
                entry.calls_per_step,
                {},
                std::string(kBaselineStrategy),
                {},
                false,
                0,
                std::nullopt};
    const auto baseline_model = models.find({std::string(kBaselineStrategy), entry.dtype});
    const auto baseline =
        baseline_model == models.end() ? std::nullopt : predict(baseline_model->second, entry.bytes);
    if (!baseline) {
      missing_baseline.insert(entry.dtype);
      report.sizes.push_back(row);
      continue;
    }
    row.baseline = baseline->time;
    row.best_time = baseline->time;
    row.extrapolated = baseline->extrapolated;
    if (options.keep_predictions)
      for (const auto& [key, model] : models)
        if (key.second == entry.dtype)
          if (const auto prediction = predict(model, entry.bytes))
            report.predictions.push_back(
                {entry.api, entry.dtype, entry.bytes, key.first,
                 key.first == kBaselineStrategy || tallies[key.first].excluded.empty(), *prediction});
    for (const auto& [key, model] : models) {
      if (key.second != entry.dtype || key.first == kBaselineStrategy) continue;
      auto& tally = tallies[key.first];
      if (!tally.excluded.empty()) continue;
      const auto candidate = predict(model, entry.bytes);
      if (!candidate) {
        ++tally.unpredicted;
        continue;
      }
      if (candidate->time.high_ns >= baseline->time.low_ns) {
        ++(candidate->time.median_ns < baseline->time.median_ns ? tally.overlaps : tally.slower);
        continue;
      }
      if (candidate->time.median_ns < row.best_time->median_ns || row.best == kBaselineStrategy) {
        row.best = key.first;
        row.best_time = candidate->time;
        row.extrapolated = baseline->extrapolated || candidate->extrapolated;
      }
    }
    if (row.best != kBaselineStrategy) ++tallies[row.best].wins;
    row.gain = 1 - row.best_time->median_ns / row.baseline->median_ns;
    // On the step, a faster call saves only what of it was exposed (storage/step_model.h).
    if (const auto exposed =
            exposedPerCall(inputs.exposure, row.api, row.dtype, row.min_bytes, row.max_bytes))
      row.step_saving_ns =
          row.calls_per_step * storage::stepSavingNs(row.baseline->median_ns - row.best_time->median_ns,
                                                     exposed->second, exposed->first);
    any_extrapolated |= row.extrapolated;
    report.sizes.push_back(row);
  }
  for (DType dtype : missing_baseline)
    reasoning.push_back(fmt::format(
        "No sum/native model predicts some {} sizes: they keep the job's own reduction.", name(dtype)));
  if (any_extrapolated)
    reasoning.push_back("Rows marked * are extrapolated beyond the measured sizes with the alpha-beta fit.");

  // Totals per step.
  TimeInterval baseline_total, choice_total;
  bool any = false;
  for (const auto& row : report.sizes) {
    if (!row.baseline) continue;
    any = true;
    add(baseline_total, scaled(*row.baseline, row.calls_per_step));
    add(choice_total, scaled(*row.best_time, row.calls_per_step));
  }
  if (any) report.baseline_per_step = baseline_total, report.choice_per_step = choice_total;
  report.step_ns = inputs.step_ns;
  for (const auto& row : report.sizes)
    if (row.step_saving_ns) report.step_saving_ns = report.step_saving_ns.value_or(0) + *row.step_saving_ns;
  if (!report.step_ns) report.step_saving_ns.reset();

  // Rules: runs of neighbouring sizes (same api and dtype) with the same winner.
  Recommendation& recommendation = result.recommendation;
  recommendation.backend = backend;
  recommendation.world_size = world;
  recommendation.max_rel_error = options.max_rel_error;
  recommendation.allow_semantic_change = options.allow_semantic_change;
  recommendation.created = options.created.empty() ? nowIso8601() : options.created;
  recommendation.tool_version = kVersion;
  for (const auto& run : inputs.runs)
    if (!run.uuid.empty() && std::find(recommendation.source_runs.begin(), recommendation.source_runs.end(),
                                       run.uuid) == recommendation.source_runs.end())
      recommendation.source_runs.push_back(run.uuid);
  const auto& sizes = report.sizes;
  for (std::size_t begin = 0; begin < sizes.size();) {
    std::size_t end = begin + 1;
    while (end < sizes.size() && sizes[end].api == sizes[begin].api &&
           sizes[end].dtype == sizes[begin].dtype && sizes[end].best == sizes[begin].best &&
           sizes[end].baseline.has_value() == sizes[begin].baseline.has_value())
      ++end;
    if (sizes[begin].baseline && sizes[begin].best != kBaselineStrategy) {
      const auto& model = models.at({sizes[begin].best, sizes[begin].dtype});
      RecommendationRule rule;
      rule.api = sizes[begin].api;
      rule.dtype = sizes[begin].dtype;
      rule.min_bytes = sizes[begin].min_bytes;
      rule.max_bytes = sizes[end - 1].max_bytes;
      rule.world_size = world;
      rule.strategy = sizes[begin].best;
      rule.error_class = strategyErrorClass(rule.strategy).value_or(ErrorClass::Semantic);
      rule.measured_rel_error = model.worst_rel_error;
      rule.baseline_strategy = std::string(kBaselineStrategy);
      rule.evidence = model.rows;
      // The rule's times are those of an average call in its range, weighted by how often each size occurs.
      TimeInterval predicted, baseline;
      double calls = 0;
      for (std::size_t i = begin; i < end; ++i) {
        add(predicted, scaled(*sizes[i].best_time, sizes[i].calls_per_step));
        add(baseline, scaled(*sizes[i].baseline, sizes[i].calls_per_step));
        calls += sizes[i].calls_per_step;
      }
      rule.predicted = scaled(predicted, 1 / calls);
      rule.baseline = scaled(baseline, 1 / calls);
      std::optional<double> step_saving;
      for (std::size_t i = begin; i < end; ++i)
        if (sizes[i].step_saving_ns) step_saving = step_saving.value_or(0) + *sizes[i].step_saving_ns;
      const std::string sizes_text =
          rule.min_bytes == rule.max_bytes
              ? formatBytes(static_cast<std::uint64_t>(rule.min_bytes))
              : fmt::format("{}..{}", formatBytes(static_cast<std::uint64_t>(rule.min_bytes)),
                            formatBytes(static_cast<std::uint64_t>(rule.max_bytes)));
      // The saving on the step, next to the saving on the calls: a reduction hidden behind compute saves
      // little of it however much faster it becomes.
      std::string on_step;
      if (step_saving && report.step_ns && *report.step_ns > 0)
        on_step =
            fmt::format("; on the step {} of {} per step ({:.2f}% faster){}", formatDuration(*step_saving),
                        formatDuration(*report.step_ns), 100 * *step_saving / *report.step_ns,
                        *step_saving < 0.5 * (baseline.median_ns - predicted.median_ns)
                            ? ": most of this reduction is hidden behind compute"
                            : "");
      reasoning.push_back(fmt::format(
          "{} {} {}: {} wins, {} against sum/native {} ({:.0f}% faster; the intervals do not overlap){}{}.",
          name(rule.api), name(rule.dtype), sizes_text, rule.strategy, interval(*rule.predicted),
          interval(*rule.baseline), 100 * (1 - rule.predicted->median_ns / rule.baseline->median_ns),
          rule.error_class == ErrorClass::Lossy
              ? fmt::format(", worst measured relative error {:.3g}", rule.measured_rel_error.value_or(0))
              : std::string(),
          on_step));
      recommendation.rules.push_back(std::move(rule));
    }
    begin = end;
  }
  for (const auto& [strategy, tally] : tallies) {
    if (!tally.excluded.empty())
      reasoning.push_back(fmt::format("Excluded {}: {}.", strategy, tally.excluded));
    else if (tally.wins == 0 && tally.overlaps > 0)
      reasoning.push_back(fmt::format(
          "{} is faster at {} size{} but its interval overlaps the baseline's: not a reliable gain.",
          strategy, tally.overlaps, tally.overlaps == 1 ? "" : "s"));
    else if (tally.wins == 0 && tally.slower > 0)
      reasoning.push_back(fmt::format("{} is not faster than sum/native at any size.", strategy));
    else if (tally.wins == 0 && tally.unpredicted > 0)
      reasoning.push_back(fmt::format(
          "{} cannot be predicted at the workload's sizes (measured at one size only).", strategy));
  }
  chooseAsync(inputs, options, workload, result);
  if (recommendation.rules.empty() && any)
    reasoning.push_back("Nothing beats sum/native beyond the noise: keep the job as it is.");

  // Fusion: many small reductions are latency-bound; fewer, larger buckets pay the latency once.
  if (report.baseline_per_step && report.baseline_per_step->median_ns > 0) {
    std::map<DType, std::pair<double, double>> small;  // dtype -> (baseline ns, bytes) per step
    double small_ns = 0;
    for (const auto& row : report.sizes)
      if (row.baseline && row.bytes < kSmallCallBytes) {
        small[row.dtype].first += row.baseline->median_ns * row.calls_per_step;
        small[row.dtype].second += static_cast<double>(row.bytes) * row.calls_per_step;
        small_ns += row.baseline->median_ns * row.calls_per_step;
      }
    const double share = small_ns / report.baseline_per_step->median_ns;
    if (share > 0.5) {
      const auto dominant = std::max_element(small.begin(), small.end(), [](const auto& a, const auto& b) {
        return a.second.first < b.second.first;
      });
      const auto& fit = models.at({std::string(kBaselineStrategy), dominant->first}).fit;
      if (fit.valid && fit.alpha_ns > 0) {
        // A bucket is large enough once its transfer time is 4x the latency: the latency is then under 20%.
        const double target = 4 * fit.alpha_ns / fit.ns_per_byte;
        std::int64_t bucket = 1 << 20;
        while (static_cast<double>(bucket) < target && bucket < (std::int64_t{1} << 40)) bucket *= 2;
        double gain = 0;
        for (const auto& [dtype, cost] : small) {
          const double buckets = std::ceil(cost.second / static_cast<double>(bucket));
          gain += cost.first - (buckets * fit.alpha_ns + cost.second * fit.ns_per_byte);
        }
        report.fusion = FusionAdvice{bucket, share, std::max(0.0, gain), std::nullopt};
        // On the step: the share of the small calls' transport that the job left exposed.
        double exposed_ns = 0, transport_ns = 0;
        for (const auto& row : report.sizes)
          if (row.baseline && row.bytes < kSmallCallBytes)
            if (const auto exposed =
                    exposedPerCall(inputs.exposure, row.api, row.dtype, row.min_bytes, row.max_bytes)) {
              exposed_ns += exposed->first * row.calls_per_step;
              transport_ns += exposed->second * row.calls_per_step;
            }
        if (report.step_ns && transport_ns > 0)
          report.fusion->step_gain_ns = report.fusion->gain_ns * std::min(1.0, exposed_ns / transport_ns);
        reasoning.push_back(fmt::format(
            "{:.0f}% of the baseline's time per step is in calls under 64 KiB: fuse them into {} buckets "
            "(alpha {}, {:.3g} GB/s; predicted saving {} per step{}).",
            100 * share, formatBytes(static_cast<std::uint64_t>(bucket)), formatDuration(fit.alpha_ns),
            1 / fit.ns_per_byte, formatDuration(report.fusion->gain_ns),
            report.fusion->step_gain_ns
                ? fmt::format(", {} of it on the step", formatDuration(*report.fusion->step_gain_ns))
                : std::string()));
      }
    }
  }

  if (inputs.mean_cosine_to_mean && *inputs.mean_cosine_to_mean < 0.5)
    report.consensus_note = fmt::format(
        "ranks disagree (mean cosine to the mean gradient {:.2f} < 0.5): try --allow-semantic-change with "
        "adacons",
        *inputs.mean_cosine_to_mean);
  // Checked here so that a bug surfaces as the recommender's error, not as a file the agent refuses.
  (void)toJson(recommendation);
  return result;
}

}  // namespace gradscope::tuner
