#include "gradscope/tuner/async.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/common/strategy_name.h"
#include "gradscope/common/units.h"

namespace gradscope::tuner {
namespace {

constexpr int kBootstrapResamples = 1000;

// The async strategies the analysis replays when explore measured none of them.
constexpr const char* kDefaultOptions[] = {"async/stale1", "async/stale2", "async/dga1"};

std::string percent(double part, double whole) {
  return whole > 0 ? fmt::format("{:.1f}%", 100.0 * part / whole) : "-";
}

std::string signedPercent(double part, double whole) {
  return whole > 0 ? fmt::format("{:+.1f}%", 100.0 * part / whole) : "-";
}

// The wire formats in the order the verdict prefers to compare with (the narrowest the job could use).
int wireRank(const StrategyName& name) {
  if (!name.wire || name.aggregator != Aggregator::Sum) return -1;
  switch (*name.wire) {
    case WireFormat::Fp16: return 3;
    case WireFormat::Bf16: return 2;
    default: return 1;  // fp8: the narrowest, but rarely what a job deploys first
  }
}

}  // namespace

std::vector<double> replaySteps(const std::vector<std::vector<double>>& compute,
                                const std::vector<double>& transport, int staleness) {
  const std::size_t steps = compute.size();
  std::vector<double> durations;
  if (steps == 0) return durations;
  const std::size_t ranks = compute.front().size();
  std::vector<double> begin(ranks, 0.0);
  std::vector<double> ends;  // each step's reduction end
  ends.reserve(steps);
  durations.reserve(steps);
  double worker_free = 0, last_begin = 0;
  const auto k = static_cast<std::size_t>(staleness);
  for (std::size_t t = 0; t < steps; ++t) {
    double last_arrival = 0;
    for (std::size_t r = 0; r < ranks; ++r) last_arrival = std::max(last_arrival, begin[r] + compute[t][r]);
    const double end = (staleness == 0 ? last_arrival : std::max(last_arrival, worker_free)) + transport[t];
    worker_free = end;
    ends.push_back(end);
    for (std::size_t r = 0; r < ranks; ++r) {
      const double arrival = begin[r] + compute[t][r];
      begin[r] = staleness == 0 || t < k ? end : std::max(arrival, ends[t - k]);
    }
    const double next = *std::max_element(begin.begin(), begin.end());
    durations.push_back(next - last_begin);
    last_begin = next;
  }
  return durations;
}

double replayStepNs(const std::vector<std::vector<double>>& compute, const std::vector<double>& transport,
                    int staleness) {
  const std::vector<double> durations = replaySteps(compute, transport, staleness);
  if (durations.empty()) return 0;
  double total = 0;
  for (const double d : durations) total += d;
  return total / static_cast<double>(durations.size());
}

std::optional<CpuSharing> cpuSharing(const storage::TraceReader& reader) {
  std::map<std::string, int> ranks_on;
  std::map<std::int64_t, std::string> host_of;  // rank number -> host
  for (const storage::RankInfo& rank : reader.ranks()) {
    ++ranks_on[rank.host];
    host_of[rank.rank] = rank.host;
  }
  std::map<std::string, int> cpus_on;  // the fewest any rank there could use
  for (const storage::RunInfo& run : reader.runs()) {
    const auto config = nlohmann::json::parse(run.config_json, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) continue;
    const auto entries = config.find("agent_ranks");
    if (entries == config.end() || !entries->is_array()) continue;
    for (const auto& entry : *entries) {
      if (!entry.is_object() || !entry.contains("cpus") || !entry["cpus"].is_number_integer() ||
          !entry.contains("rank") || !entry["rank"].is_number_integer())
        continue;
      const auto host = host_of.find(entry["rank"].get<std::int64_t>());
      const int cpus = entry["cpus"].get<int>();
      if (host == host_of.end() || cpus <= 0) continue;
      auto [it, fresh] = cpus_on.try_emplace(host->second, cpus);
      if (!fresh) it->second = std::min(it->second, cpus);
    }
  }
  std::optional<CpuSharing> worst;
  for (const auto& [host, cpus] : cpus_on) {
    const int ranks = ranks_on[host];
    if (ranks <= cpus) continue;
    if (!worst || ranks * worst->cpus > worst->ranks * cpus) worst = CpuSharing{host, ranks, cpus};
  }
  return worst;
}

AsyncAnalysis analyzeAsync(std::span<const storage::StepRecord> rows,
                           std::span<const MeasurementRow> measurements,
                           const std::function<std::string(std::int64_t)>& rank_label,
                           const std::optional<CpuSharing>& shared_cpus) {
  const auto label = [&](std::int64_t id) { return rank_label ? rank_label(id) : fmt::format("#{}", id); };
  AsyncAnalysis out;
  // Per step, the rows of every rank (with a breakdown).
  std::map<std::int64_t, std::map<std::int64_t, const storage::StepRecord*>> by_step;
  std::map<std::int64_t, int> rank_ids;
  for (const storage::StepRecord& row : rows) {
    if (row.basis == storage::StepBasis::GpuUnsampled) continue;
    by_step[row.step][row.rank_id] = &row;
    rank_ids.emplace(row.rank_id, 0);
  }
  out.ranks = static_cast<int>(rank_ids.size());
  if (out.ranks < 2) {
    out.why_not = "the trace has no steps on two or more ranks (mark the job's steps, or run it longer)";
    out.verdict = out.why_not;
    return out;
  }
  int column = 0;
  for (auto& [id, index] : rank_ids) index = column++;
  std::vector<std::vector<double>> compute;
  std::vector<double> transport;
  double span_sum = 0, waiting_sum = 0;
  for (const auto& [step, ranks] : by_step) {
    if (ranks.size() != rank_ids.size()) continue;  // a step some rank does not have
    std::vector<double> c(rank_ids.size());
    std::vector<double> after_arrival;
    double span = 0, waiting = 0;
    for (const auto& [id, row] : ranks) {
      c[static_cast<std::size_t>(rank_ids[id])] = static_cast<double>(row->compute_ns);
      after_arrival.push_back(
          static_cast<double>(std::max<std::int64_t>(0, row->exposed_ns - row->waiting_ns)));
      span = std::max(span, static_cast<double>(row->end_ns - row->start_ns));
      waiting += static_cast<double>(row->waiting_ns);
      out.waiting_worst_ns = std::max(out.waiting_worst_ns, static_cast<double>(row->waiting_ns));
    }
    compute.push_back(std::move(c));
    transport.push_back(median(after_arrival));
    span_sum += span;
    waiting_sum += waiting / static_cast<double>(ranks.size());
  }
  out.steps = static_cast<std::int64_t>(compute.size());
  if (out.steps < 2 * kAsyncChunkSteps) {
    out.why_not = fmt::format("{} steps on every rank; replaying them needs {} or more", out.steps,
                              2 * kAsyncChunkSteps);
    out.verdict = out.why_not;
    return out;
  }
  const auto steps = static_cast<double>(out.steps);
  out.step_ns = span_sum / steps;
  out.waiting_mean_ns = waiting_sum / steps;
  out.waiting_share = out.step_ns > 0 ? out.waiting_mean_ns / out.step_ns : 0;
  for (const double r : transport) out.exposed_ns += r / steps;
  out.replay_sync_ns = replayStepNs(compute, transport, 0);
  const storage::Stragglers late = storage::stragglers(rows);
  out.late_ranks = late.ranks;
  out.persistent = late.persistent;

  // The options: the async strategies explore measured, else the default set; their errors.
  std::map<std::string, std::vector<double>> errors;
  std::map<int, std::vector<double>> wire_errors;
  std::map<int, std::string> wire_names;
  for (const MeasurementRow& row : measurements) {
    const auto name = parseStrategyName(row.measurement.strategy);
    if (!name || !row.measurement.rel_l2_error) continue;
    if (name->aggregator == Aggregator::Async) errors[name->text()].push_back(*row.measurement.rel_l2_error);
    if (const int rank = wireRank(*name); rank >= 0) {
      wire_errors[rank].push_back(*row.measurement.rel_l2_error);
      wire_names.emplace(rank, name->text());
    }
  }
  std::vector<StrategyName> names;
  for (const auto& [text, values] : errors) names.push_back(*parseStrategyName(text));
  if (names.empty())
    for (const char* text : kDefaultOptions) names.push_back(*parseStrategyName(text));
  std::sort(names.begin(), names.end(), [](const StrategyName& a, const StrategyName& b) {
    return std::tie(a.staleness, a.delay) < std::tie(b.staleness, b.delay);
  });
  // The interval: per-step savings of the whole replay, resampled in blocks of consecutive steps (a step's
  // saving depends on the steps before it).
  const std::vector<double> sync_steps = replaySteps(compute, transport, 0);
  for (const StrategyName& name : names) {
    AsyncOption option;
    option.strategy = name.text();
    option.staleness = name.staleness;
    const std::vector<double> async_steps = replaySteps(compute, transport, name.staleness);
    std::vector<double> blocks;  // mean saving per block
    for (std::size_t begin = 0; begin + kAsyncChunkSteps <= async_steps.size(); begin += kAsyncChunkSteps) {
      double sum = 0;
      for (std::size_t t = begin; t < begin + kAsyncChunkSteps; ++t) sum += sync_steps[t] - async_steps[t];
      blocks.push_back(sum / static_cast<double>(kAsyncChunkSteps));
    }
    option.step_ns = replayStepNs(compute, transport, name.staleness);
    option.saving_ns = out.replay_sync_ns - option.step_ns;
    std::mt19937_64 random(0x5eedu + static_cast<std::uint64_t>(name.staleness));
    std::uniform_int_distribution<std::size_t> pick(0, blocks.size() - 1);
    std::vector<double> means;
    for (int i = 0; i < kBootstrapResamples; ++i) {
      double sum = 0;
      for (std::size_t j = 0; j < blocks.size(); ++j) sum += blocks[pick(random)];
      means.push_back(sum / static_cast<double>(blocks.size()));
    }
    std::sort(means.begin(), means.end());
    option.saving_low_ns = means[kBootstrapResamples / 40];
    option.saving_high_ns = means[kBootstrapResamples - 1 - kBootstrapResamples / 40];
    if (const auto found = errors.find(option.strategy); found != errors.end()) {
      option.error_median = median(found->second);
      option.error_worst = *std::max_element(found->second.begin(), found->second.end());
      option.error_samples = static_cast<std::int64_t>(found->second.size());
    }
    out.options.push_back(std::move(option));
  }
  if (!wire_errors.empty()) {
    const auto best = std::prev(wire_errors.end());
    out.wire_strategy = wire_names[best->first];
    out.wire_error = median(best->second);
  }

  // The verdict.
  std::string text;
  if (out.waiting_mean_ns > 0) {
    text = fmt::format("Ranks wait {} of the step ({} per step on average, worst {})",
                       percent(out.waiting_mean_ns, out.step_ns), formatDuration(out.waiting_mean_ns),
                       formatDuration(out.waiting_worst_ns));
    if (!late.ranks.empty()) {
      const auto& first = late.ranks.front();
      text += late.persistent ? fmt::format(" for rank {}, last in {} of {} steps", label(first.rank_id),
                                            first.steps_last, late.steps)
                              : fmt::format(
                                    " for a late rank that changes from step to step (most often rank {}, "
                                    "{} of {} steps)",
                                    label(first.rank_id), first.steps_last, late.steps);
    }
    text += "; ";
  } else {
    text = "No rank waits for another; ";
  }
  text += fmt::format("{} per step of reduction is exposed. ", formatDuration(out.exposed_ns));
  const AsyncOption* best = nullptr;
  for (const AsyncOption& option : out.options)
    if (best == nullptr || option.saving_ns > best->saving_ns) best = &option;
  if (best != nullptr) {
    text += fmt::format(
        "Replayed on the measured steps (synchronous {} against {} measured), {} would take the step to {} "
        "({} [{}, {}])",
        formatDuration(out.replay_sync_ns), formatDuration(out.step_ns), best->strategy,
        formatDuration(best->step_ns), signedPercent(-best->saving_ns, out.replay_sync_ns),
        signedPercent(-best->saving_high_ns, out.replay_sync_ns),
        signedPercent(-best->saving_low_ns, out.replay_sync_ns));
    text += best->error_median
                ? fmt::format(" at a measured gradient error of {:.2g} per step (worst {:.2g})",
                              *best->error_median, *best->error_worst)
                : " (its error was not measured: run explore mode)";
    text += ".";
  }
  for (const AsyncOption& option : out.options)
    if (&option != best && option.error_median)
      text += fmt::format(" {}: {} on the step, error {:.2g}.", option.strategy,
                          signedPercent(-option.saving_ns, out.replay_sync_ns), *option.error_median);
  if (out.wire_error)
    text += fmt::format(" For comparison, the relative error of the {} wire is {:.2g}.", out.wire_strategy,
                        *out.wire_error);
  if (late.persistent && out.waiting_mean_ns > 0 && !late.ranks.empty())
    text += fmt::format(
        " Rank {} is a persistent straggler, which keeps its lead under bounded staleness (the others run K "
        "steps ahead, then wait for it all the same): what async saves here is the exposed reduction, not "
        "the "
        "waiting; that is saved by making rank {} faster.",
        label(late.ranks.front().rank_id), label(late.ranks.front().rank_id));
  if (std::any_of(rows.begin(), rows.end(),
                  [](const storage::StepRecord& row) { return row.basis != storage::StepBasis::Host; }))
    text +=
        " The steps are on the GPU (NCCL): there the async sums run on a second NCCL communicator and "
        "stream beside the job's kernels and take SMs and links from them, so the replayed saving is an "
        "upper "
        "bound until apply mode's --validate measures it.";
  out.shared_cpus = shared_cpus;
  if (shared_cpus)
    text += fmt::format(
        " Here {} ranks share {} CPUs on {}: a reduction's transport is those CPUs' work and cannot hide "
        "behind compute, and the async worker competes for them, so the replayed saving is an upper bound "
        "(docs/async.md measured async slower than synchronous there).",
        shared_cpus->ranks, shared_cpus->cpus, shared_cpus->host);
  if (best == nullptr || best->saving_low_ns <= 0.02 * out.replay_sync_ns)
    text += " Dropping the lock-step would not pay here: the saving is within 2% of the step or not certain.";
  out.verdict = text;
  return out;
}

}  // namespace gradscope::tuner
