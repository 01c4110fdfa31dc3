#include "gradscope/cli/report.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/common/error.h"
#include "gradscope/common/job_environment.h"
#include "gradscope/common/units.h"
#include "gradscope/common/untouched.h"
#include "gradscope/storage/drops.h"
#include "gradscope/storage/peers.h"
#include "gradscope/storage/step_model.h"
#include "gradscope/tuner/async.h"
#include "gradscope/tuner/model.h"
#include "gradscope/tuner/recommend.h"
#include "gradscope/tuner/validate.h"

namespace gradscope::cli {
namespace {

std::string sizeRange(int log2_bytes) {
  if (log2_bytes < 0) return "0 B";
  const auto low = std::uint64_t{1} << log2_bytes;
  return fmt::format("{} - {}", formatBytes(low), formatBytes(low * 2));
}

std::string utcTime(std::int64_t unix_ns) {
  const std::chrono::sys_time<std::chrono::milliseconds> time{std::chrono::milliseconds(unix_ns / 1'000'000)};
  return fmt::format("{:%Y-%m-%d %H:%M:%S} UTC", time);
}

std::string percent(double part, double whole) {
  return whole > 0 ? fmt::format("{:.1f}%", 100.0 * part / whole) : std::string("-");
}

}  // namespace

namespace {

// A strategy's error as the tables print it. A wire precision that overflowed (values beyond fp16's range,
// say) has a relative error of 1 or NaN that means nothing more than that: it says "overflow".
std::string errorText(std::optional<double> rel_l2_error, bool overflowed) {
  if (overflowed) return "overflow";
  return rel_l2_error ? fmt::format("{:.1e}", *rel_l2_error) : std::string("-");
}

// Strategies timed on the same points (gradscope bench, explore mode): per point (dtype, size, ranks),
// fastest first, each with its time relative to the point's fastest.
void writeMeasurements(std::vector<storage::Measurement> measurements, std::ostream& out) {
  if (measurements.empty()) return;
  std::stable_sort(measurements.begin(), measurements.end(), [](const auto& a, const auto& b) {
    return std::tuple(a.bytes, a.dtype, a.world, a.median_ns) <
           std::tuple(b.bytes, b.dtype, b.world, b.median_ns);
  });
  out << fmt::format("\nMeasured strategies ({} points; per size, fastest first)\n", measurements.size());
  out << fmt::format("  {:>10} {:<9} {:>5}  {:<28} {:>10} {:>10} {:>9} {:>10}\n", "size", "dtype", "ranks",
                     "strategy", "median", "busbw", "rel_err", "vs best");
  double best_ns = 0;
  for (std::size_t i = 0; i < measurements.size(); ++i) {
    const storage::Measurement& m = measurements[i];
    const bool first_of_point = i == 0 || m.bytes != measurements[i - 1].bytes ||
                                m.dtype != measurements[i - 1].dtype || m.world != measurements[i - 1].world;
    if (first_of_point) best_ns = m.median_ns;
    out << fmt::format("  {:>10} {:<9} {:>5}  {:<28} {:>10} {:>10} {:>9} {:>10}\n",
                       first_of_point ? formatBytes(static_cast<std::uint64_t>(m.bytes)) : "",
                       first_of_point ? std::string(name(m.dtype)) : "",
                       first_of_point ? std::to_string(m.world) : "", m.strategy, formatDuration(m.median_ns),
                       fmt::format("{:.2f} GB/s", m.busbw_gbs),
                       errorText(m.rel_l2_error, m.overflow_count > 0),
                       best_ns > 0 ? fmt::format("{:.2f}x", m.median_ns / best_ns) : "-");
  }
}

// Lossless as comm::Strategy::lossless() defines it: a sum without a wire precision, "sum/<transport>".
// The report reads the name because gradscope does not link the strategies (they need MPI or NCCL).
bool isLossless(std::string_view strategy) {
  return strategy.starts_with("sum/") && strategy.find('/', 4) == std::string_view::npos;
}

constexpr std::string_view kBaselineStrategy = "sum/native";
// Strategies listed per bucket: the fastest ones. A bucket of an explore run can hold every applicable
// strategy (dozens); the baseline and the fastest lossless one are listed as well when slower.
constexpr std::size_t kStrategiesPerBucket = 8;

// Strategies the agent timed on the job's own calls (explore mode: measurements with a call_id): per
// API, dtype and size bucket, each strategy's median time over its measurements, fastest first, with
// its speed relative to the backend's own all-reduce and its worst error.
void writeExplored(const std::vector<storage::Measurement>& measurements, std::ostream& out) {
  struct Timed {
    std::vector<double> median_ns;
    std::optional<double> worst_error;
    bool overflowed = false;
  };
  using Bucket = std::tuple<Api, DType, int>;
  std::map<Bucket, std::map<std::string, Timed>> buckets;
  std::set<std::int64_t> calls;
  std::size_t count = 0;
  for (const storage::Measurement& m : measurements) {
    if (!m.call_id) continue;                        // a benchmark point: "Measured strategies"
    if (m.strategy.starts_with("async/")) continue;  // an error without a time: "Synchronous or asynchronous"
    ++count;
    calls.insert(*m.call_id);
    Timed& timed = buckets[{m.api, m.dtype, sizeClass(m.bytes)}][m.strategy];
    timed.median_ns.push_back(m.median_ns);
    if (m.rel_l2_error)
      timed.worst_error = std::max(timed.worst_error.value_or(*m.rel_l2_error), *m.rel_l2_error);
    timed.overflowed = timed.overflowed || m.overflow_count > 0;
  }
  if (count == 0) return;

  out << fmt::format(
      "\nStrategies measured (explore): {} samples on {} calls (a call's ranks merged); per API, dtype and "
      "size, fastest first\n",
      formatCount(count), formatCount(calls.size()));
  out << fmt::format("    {:<32} {:>8} {:>10} {:>9} {:>10}\n", "strategy", "samples", "median", "speedup",
                     "worst err");
  bool any_marked = false;
  for (const auto& [bucket, strategies] : buckets) {
    struct Row {
      std::string_view strategy;
      std::size_t rows;
      double median_ns;
      std::optional<double> worst_error;
      bool overflowed;
    };
    std::vector<Row> rows;
    for (const auto& [strategy, timed] : strategies)
      rows.push_back({strategy, timed.median_ns.size(), tuner::median(timed.median_ns), timed.worst_error,
                      timed.overflowed});
    // Fastest first; equal times keep the names' order (the map's), so the output is deterministic.
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Row& a, const Row& b) { return a.median_ns < b.median_ns; });
    const auto baseline = std::find_if(rows.begin(), rows.end(),
                                       [](const Row& row) { return row.strategy == kBaselineStrategy; });
    const auto lossless =
        std::find_if(rows.begin(), rows.end(), [](const Row& row) { return isLossless(row.strategy); });
    const auto& [api, dtype, log2_bytes] = bucket;
    out << fmt::format("  {} {}, {}\n", name(api), name(dtype), sizeRange(log2_bytes));
    std::size_t hidden = 0;
    for (auto row = rows.begin(); row != rows.end(); ++row) {
      if (static_cast<std::size_t>(row - rows.begin()) >= kStrategiesPerBucket && row != baseline &&
          row != lossless) {
        ++hidden;
        continue;
      }
      any_marked = any_marked || row == lossless;
      out << fmt::format("  {} {:<32} {:>8} {:>10} {:>9} {:>10}\n", row == lossless ? '*' : ' ',
                         row->strategy, formatCount(row->rows), formatDuration(row->median_ns),
                         baseline != rows.end() && row->median_ns > 0
                             ? fmt::format("{:.2f}x", baseline->median_ns / row->median_ns)
                             : std::string("-"),
                         errorText(row->worst_error, row->overflowed));
    }
    if (hidden > 0) out << fmt::format("    ... {} more\n", hidden);
  }
  out << fmt::format("  speedup: median time of {} over the strategy's, on the same API, dtype and size\n",
                     kBaselineStrategy);
  if (any_marked)
    out << "  *: the fastest lossless strategy (a sum without a wire precision) of its API, dtype and size\n";
  if (std::any_of(buckets.begin(), buckets.end(), [](const auto& bucket) {
        return std::any_of(bucket.second.begin(), bucket.second.end(),
                           [](const auto& strategy) { return strategy.second.overflowed; });
      }))
    out << "  overflow: values left the wire format's range in some sample (its error is meaningless "
           "there)\n";
}

// How much the ranks' gradients agreed in the reductions explore mode looked at (AdaCons diagnostics,
// docs/methods.md). `world` is the job's size: the diversity of identical gradients is 1/world.
void writeConsensus(const std::vector<storage::ConsensusRecord>& rows, int world, std::ostream& out) {
  if (rows.empty()) return;
  std::set<std::int64_t> steps, ranks;
  std::size_t without_step = 0;
  double alpha = 0, min_alpha = rows.front().alpha, cosine = 0, diversity = 0;
  for (const storage::ConsensusRecord& row : rows) {
    if (row.step >= 0) steps.insert(row.step);
    else ++without_step;
    ranks.insert(row.rank_id);
    alpha += row.alpha;
    min_alpha = std::min(min_alpha, row.alpha);
    cosine += row.cosine_to_mean;
    diversity += row.diversity;
  }
  const auto n = static_cast<double>(rows.size());
  alpha /= n;
  cosine /= n;
  diversity /= n;
  out << "\nConsensus (per rank and explored reduction)\n";
  out << fmt::format(
      "  {} rows, {} step{} with rows, {} rank{}{}\n", formatCount(rows.size()), formatCount(steps.size()),
      steps.size() == 1 ? "" : "s", ranks.size(), ranks.size() == 1 ? "" : "s",
      without_step > 0 ? fmt::format(" ({} rows without a step)", formatCount(without_step)) : std::string());
  out << fmt::format("  alpha            mean {:.3f}, min {:.3f}\n", alpha, min_alpha);
  out << fmt::format("  cosine to mean   mean {:.3f}\n", cosine);
  out << fmt::format("  diversity        mean {:.3f}{}\n", diversity,
                     world > 1 ? fmt::format(" (1/{} = {:.3f} when the ranks' gradients are identical, 1 "
                                             "when orthogonal)",
                                             world, 1.0 / world)
                               : std::string());
  // The mean cosine is the plainest sign: near 1 every rank pushes the same way and a plain sum loses
  // nothing; below 0.5 the ranks pull apart, where weighting them (AdaCons, AdaSum) can change training.
  out << (cosine < 0.5 ? "  ranks disagree strongly: adaptive aggregation (adacons/adasum) may matter -- see "
                         "docs/methods.md\n"
                       : "  ranks agree: plain sum is fine\n");
}

// What apply mode changed: the calls it ran with a recommended strategy instead, per strategy, and the
// reductions it left alone.
void writeApplied(const storage::TraceReader::AppliedSummary& applied, bool apply_mode, std::ostream& out) {
  if (applied.strategies.empty()) {
    if (apply_mode)
      out << "\nApplied (apply mode)\n  no call was replaced: every call ran as the job issued it\n";
    return;
  }
  std::int64_t replaced = 0;
  for (const auto& strategy : applied.strategies) replaced += strategy.calls;
  out << fmt::format("\nApplied (apply mode): {} call{} replaced with a recommended strategy\n",
                     formatCount(static_cast<std::uint64_t>(replaced)), replaced == 1 ? "" : "s");
  out << fmt::format("  {:<32} {:>11} {:>10} {:>10}\n", "strategy", "calls", "total", "mean");
  for (const auto& strategy : applied.strategies)
    out << fmt::format(
        "  {:<32} {:>11} {:>10} {:>10}\n", strategy.strategy,
        formatCount(static_cast<std::uint64_t>(strategy.calls)),
        formatDuration(static_cast<double>(strategy.total_ns)),
        formatDuration(static_cast<double>(strategy.total_ns) / static_cast<double>(strategy.calls)));
  out << fmt::format("  untouched: {} reduction{} ran as the job issued {}\n",
                     formatCount(static_cast<std::uint64_t>(applied.untouched_reductions)),
                     applied.untouched_reductions == 1 ? "" : "s",
                     applied.untouched_reductions == 1 ? "it" : "them");
}

// The agent's statistics of one rank (docs/agent.md, runs.config_json).
struct AgentStats {
  int rank = -1;
  double calls_recorded = 0, calls_dropped = 0, hot_path_ns = 0, flusher_cpu_ns = 0, buffer_bytes = 0;
  // What a call the agent did not record cost its caller; files written before the agent measured it
  // (no "dropped_call_ns") count such a call at hot_path_ns, as it then cost.
  double dropped_call_ns = 0;
  double callerNs() const { return calls_recorded * hot_path_ns + calls_dropped * dropped_call_ns; }
  // Explore and apply modes ("shadow"): sampled calls explored, and skipped for the budget or otherwise.
  double explored = 0, skipped_budget = 0, skipped_other = 0;
  // Reductions passed to the library untouched, by reason name (gradscope/common/untouched.h).
  std::map<std::string, double> untouched;
  // Where the NCCL calls' GPU spans came from ("cupti", "cupti+events", "events"), and why not better.
  std::string gpu_spans, gpu_spans_note;
};

// Every rank's agent statistics in the runs' configurations: "agent_ranks" in a merged file, "agent"
// in a per-rank file (whose rank is the run's only one). Empty when the agent did not write any, as in
// benchmark and synthetic traces.
std::vector<AgentStats> agentStats(const std::vector<storage::RunInfo>& runs,
                                   const std::vector<storage::RankInfo>& ranks) {
  std::vector<AgentStats> out;
  const auto read = [&out](const nlohmann::json& entry, int rank) {
    if (!entry.is_object()) return;
    const auto number = [&entry](const char* key) {
      const auto it = entry.find(key);
      return it != entry.end() && it->is_number() ? it->get<double>() : 0.0;
    };
    AgentStats stats;
    stats.rank = rank;
    stats.calls_recorded = number("calls_recorded");
    stats.calls_dropped = number("calls_dropped");
    stats.hot_path_ns = number("hot_path_ns");
    stats.flusher_cpu_ns = number("flusher_cpu_ns");
    stats.buffer_bytes = number("buffer_bytes");
    const auto text = [&entry](const char* key) {
      const auto it = entry.find(key);
      return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    stats.gpu_spans = text("gpu_spans");
    stats.gpu_spans_note = text("gpu_spans_note");
    const auto dropped_call = entry.find("dropped_call_ns");
    stats.dropped_call_ns = dropped_call != entry.end() && dropped_call->is_number()
                                ? dropped_call->get<double>()
                                : stats.hot_path_ns;
    if (const auto shadow = entry.find("shadow"); shadow != entry.end() && shadow->is_object()) {
      const auto count = [&shadow](const char* key) {
        const auto it = shadow->find(key);
        return it != shadow->end() && it->is_number() ? it->get<double>() : 0.0;
      };
      stats.explored = count("explored");
      stats.skipped_budget = count("skipped_budget");
      stats.skipped_other = count("skipped_other");
      if (const auto untouched = shadow->find("untouched");
          untouched != shadow->end() && untouched->is_object())
        for (const auto& [reason, value] : untouched->items())
          if (value.is_number()) stats.untouched[reason] = value.get<double>();
    }
    out.push_back(stats);
  };
  for (const auto& run : runs) {
    const auto config = nlohmann::json::parse(run.config_json, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) continue;
    if (const auto agent = config.find("agent"); agent != config.end()) {
      const auto rank = std::find_if(ranks.begin(), ranks.end(),
                                     [&](const storage::RankInfo& info) { return info.run_id == run.id; });
      read(*agent, rank == ranks.end() ? -1 : rank->rank);
    }
    if (const auto entries = config.find("agent_ranks"); entries != config.end() && entries->is_array())
      for (const auto& entry : *entries)
        read(entry,
             entry.contains("rank") && entry["rank"].is_number_integer() ? entry["rank"].get<int>() : -1);
  }
  return out;
}

// Explore mode that measured little or nothing says why, from the agent's own counts (rank 0's: the
// decisions are collective, so every rank counts the same).
void writeExploreBudget(const std::vector<AgentStats>& stats, bool explored_any, std::ostream& out) {
  const auto first = std::min_element(
      stats.begin(), stats.end(), [](const AgentStats& a, const AgentStats& b) { return a.rank < b.rank; });
  if (first == stats.end() || first->skipped_budget <= 0) return;
  const auto skipped = static_cast<std::uint64_t>(first->skipped_budget);
  if (!explored_any)
    out << fmt::format(
        "\nStrategies measured (explore): none. The {} sampled call{} came when the explore budget was "
        "spent (the first exploration also pays a one-off setup); give it more with --explore-budget "
        "(e.g. 0.25) or profile a longer run\n",
        formatCount(skipped), skipped == 1 ? "" : "s");
  else
    out << fmt::format("  {} more sampled call{} skipped: the explore budget was spent (--explore-budget)\n",
                       formatCount(skipped), skipped == 1 ? " was" : "s were");
}

// Reductions explore and apply passed through as the job issued them (intercommunicators, invalid
// arguments, ...): per reason, summed over ranks, with what it means.
void writeUntouched(const std::vector<AgentStats>& stats, std::ostream& out) {
  std::map<std::string, double> total;
  for (const AgentStats& rank : stats)
    for (const auto& [reason, count] : rank.untouched) total[reason] += count;
  if (total.empty()) return;
  out << "\nLeft untouched by explore and apply (run as the job issued them, summed over ranks)\n";
  for (const auto& [reason, count] : total) {
    const std::optional<Untouched> known = parseUntouched(reason);
    out << fmt::format("  {:<18} {:>9}  {}\n", reason, formatCount(static_cast<std::uint64_t>(count)),
                       known ? meaning(*known) : std::string_view("calls no strategy could stand in for"));
  }
}

// Explore mode: the sizes of the job's explorable reductions (sums of fp32, fp64, fp16 and bf16 on the
// all-reduces explore covers) that no exploration measured, the most time first (the time of all the
// calls of that API and size: `sizes`), so that a short run says what it did not learn.
void writeUnexplored(const storage::TraceReader::ReductionCounts& reductions,
                     const std::vector<storage::SizeBucket>& sizes,
                     const std::vector<storage::Measurement>& explored, std::ostream& out) {
  using Bucket = std::tuple<Api, DType, int>;
  std::set<Bucket> measured;
  for (const storage::Measurement& m : explored) measured.insert({m.api, m.dtype, sizeClass(m.bytes)});
  std::map<Bucket, std::int64_t> missing;
  for (const auto& size : reductions.sizes) {
    const bool explorable_api =
        size.api == Api::MpiAllreduce || size.api == Api::MpiIallreduce || size.api == Api::NcclAllReduce;
    const bool explorable_dtype = size.dtype == DType::Fp32 || size.dtype == DType::Fp64 ||
                                  size.dtype == DType::Fp16 || size.dtype == DType::Bf16;
    if (!explorable_api || !explorable_dtype || size.op != ReduceOp::Sum || size.bytes <= 0) continue;
    const Bucket bucket{size.api, size.dtype, sizeClass(size.bytes)};
    if (!measured.contains(bucket)) missing[bucket] += size.calls;
  }
  if (missing.empty()) return;
  std::map<std::pair<Api, int>, std::int64_t> time_ns;
  for (const storage::SizeBucket& size : sizes) time_ns[{size.api, size.log2_bytes}] += size.total_ns;
  struct Row {
    Bucket bucket;
    std::int64_t calls, ns;
  };
  std::vector<Row> rows;
  for (const auto& [bucket, calls] : missing)
    rows.push_back({bucket, calls, time_ns[{std::get<0>(bucket), std::get<2>(bucket)}]});
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.ns, a.calls) > std::tie(b.ns, b.calls);
  });
  out << fmt::format("\nNot explored: {} size{} of the job's reductions, most time first\n", rows.size(),
                     rows.size() == 1 ? "" : "s");
  out << fmt::format("  {:<26} {:<6} {:>19} {:>11} {:>10}\n", "api", "dtype", "size", "calls", "time");
  constexpr std::size_t kListed = 10;
  for (std::size_t i = 0; i < rows.size() && i < kListed; ++i) {
    const auto& [api, dtype, log2_bytes] = rows[i].bucket;
    out << fmt::format("  {:<26} {:<6} {:>19} {:>11} {:>10}\n", name(api), name(dtype), sizeRange(log2_bytes),
                       formatCount(static_cast<std::uint64_t>(rows[i].calls)),
                       formatDuration(static_cast<double>(rows[i].ns)));
  }
  if (rows.size() > kListed) out << fmt::format("  ... {} more\n", rows.size() - kListed);
}

// Calls captured into CUDA graphs run whenever the graph is launched: each GPU execution is a call row of
// its own (a replay), counted in the tables above; this says how much of the time was graphs'.
void writeGraphReplays(const std::vector<storage::TraceReader::ReplaySummary>& replays, std::ostream& out) {
  if (replays.empty()) return;
  out << "\nCUDA graph replays (GPU executions of graph-captured calls, summed over ranks; counted above)\n";
  out << fmt::format("  {:<26} {:>9} {:>11} {:>10} {:>10}\n", "api", "captured", "replays", "total", "mean");
  for (const auto& row : replays)
    out << fmt::format("  {:<26} {:>9} {:>11} {:>10} {:>10}\n", name(row.api),
                       formatCount(static_cast<std::uint64_t>(row.captured_calls)),
                       formatCount(static_cast<std::uint64_t>(row.replays)),
                       formatDuration(static_cast<double>(row.total_ns)),
                       formatDuration(static_cast<double>(row.total_ns) / static_cast<double>(row.replays)));
}

// Where the NCCL calls' GPU spans came from, per source (the ranks named when they differ): what it costs
// each call (docs/agent.md, "GPU timing"), and why a cheaper source was not used.
void writeGpuSpanSources(const std::vector<AgentStats>& stats, std::ostream& out) {
  std::map<std::pair<std::string, std::string>, std::vector<int>> sources;
  for (const AgentStats& rank : stats)
    if (!rank.gpu_spans.empty()) sources[{rank.gpu_spans, rank.gpu_spans_note}].push_back(rank.rank);
  for (const auto& [source, ranks] : sources) {
    const auto& [name, note] = source;
    const char* what = name == "cupti" ? "CUPTI's kernel records (one CUDA event without timing per call)"
                       : name == "cupti+events" ? "CUPTI's kernel records, two CUDA timing events per call "
                                                  "as the fallback"
                       : name == "events" ? "two CUDA timing events per call (~1.4 us of host time each)"
                                          : name.c_str();
    const std::string who =
        sources.size() > 1 ? fmt::format(" on rank{} {}", ranks.size() == 1 ? "" : "s", rankList(ranks)) : "";
    out << fmt::format("  GPU spans of the NCCL calls{}: {}{}\n", who, what,
                       note.empty() ? "" : " (" + note + ")");
  }
}

// What the agent cost the job, by its own measurements: the time it added on the calling threads (the
// calls it recorded at its measured cost of one record, the others at its measured cost of turning one
// away) and the CPU time of its background thread.
void writeAgentOverhead(const std::vector<AgentStats>& stats, std::int64_t collective_ns, std::ostream& out) {
  if (stats.empty()) return;
  out << "\nAgent overhead (the agent's own measurements)\n";
  out << fmt::format("  {:>5} {:>11} {:>9} {:>10} {:>12} {:>12} {:>10}\n", "rank", "calls", "dropped",
                     "per call", "on callers", "flusher CPU", "buffers");
  double calls = 0, caller_ns = 0, background_ns = 0, buffer_bytes = 0;
  for (const AgentStats& rank : stats) {
    const double seen = rank.calls_recorded + rank.calls_dropped;
    out << fmt::format("  {:>5} {:>11} {:>9} {:>10} {:>12} {:>12} {:>10}\n",
                       rank.rank >= 0 ? std::to_string(rank.rank) : "-",
                       formatCount(static_cast<std::uint64_t>(rank.calls_recorded)),
                       formatCount(static_cast<std::uint64_t>(rank.calls_dropped)),
                       formatDuration(rank.hot_path_ns), formatDuration(rank.callerNs()),
                       formatDuration(rank.flusher_cpu_ns),
                       formatBytes(static_cast<std::uint64_t>(rank.buffer_bytes)));
    calls += seen;
    caller_ns += rank.callerNs();
    background_ns += rank.flusher_cpu_ns;
    buffer_bytes += rank.buffer_bytes;
  }
  out << fmt::format(
      "  agent overhead: ~{} per call on the calling thread x {} calls = {} ({} of the time in "
      "collectives); background thread {} CPU; buffers {}\n",
      formatDuration(calls > 0 ? caller_ns / calls : 0), formatCount(static_cast<std::uint64_t>(calls)),
      formatDuration(caller_ns), percent(caller_ns, static_cast<double>(collective_ns)),
      formatDuration(background_ns), formatBytes(static_cast<std::uint64_t>(buffer_bytes)));
  writeGpuSpanSources(stats, out);
}

// The families of calls (common/types.h familyOf): what moved data among a group, between two ranks, or
// only ordered the ranks. Shown when the trace has more than collectives; NCCL group launches apart, since
// their members have rows of their own.
void writeFamilies(const std::vector<storage::SizeBucket>& sizes, std::ostream& out) {
  struct Family {
    std::int64_t calls = 0, bytes = 0, ns = 0;
  };
  std::map<ApiFamily, Family> families;
  for (const storage::SizeBucket& size : sizes) {
    Family& family = families[familyOf(size.api)];
    family.calls += size.calls;
    family.bytes += size.bytes;
    family.ns += size.total_ns;
  }
  if (families.empty() || (families.size() == 1 && families.begin()->first == ApiFamily::Collective)) return;
  std::int64_t total_ns = 0;
  for (const auto& [family, totals] : families)
    if (family != ApiFamily::Group) total_ns += totals.ns;
  const auto label = [](ApiFamily family) -> std::string_view {
    switch (family) {
      case ApiFamily::Collective: return "collective";
      case ApiFamily::PointToPoint: return "point-to-point";
      case ApiFamily::Synchronization: return "synchronization";
      case ApiFamily::Group: return "group launches";
    }
    return "unknown";
  };
  out << "\nTime by API family (summed over ranks)\n";
  out << fmt::format("  {:<18} {:>11} {:>10} {:>10} {:>7}\n", "family", "calls", "bytes", "total", "share");
  for (const auto& [family, totals] : families)
    out << fmt::format("  {:<18} {:>11} {:>10} {:>10} {:>7}\n", label(family),
                       formatCount(static_cast<std::uint64_t>(totals.calls)),
                       formatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(totals.bytes, 0))),
                       formatDuration(static_cast<double>(totals.ns)),
                       family == ApiFamily::Group
                           ? std::string("-")
                           : percent(static_cast<double>(totals.ns), static_cast<double>(total_ns)));
  if (families.contains(ApiFamily::Group))
    out << "  group launches: ncclGroupStart/End blocks timed as one; their members are counted in their own "
           "families, so the share leaves them out\n";
}

// Rank pairs listed in "Point-to-point", the most bytes first.
constexpr std::size_t kPairsListed = 10;
// Above this many ranks the report gives distributions and the ranks that stand out, not a line per rank.
constexpr std::size_t kRanksListed = 32;
constexpr std::size_t kRanksStandingOut = 5;
// "Slowest calls" reads this many calls per line it shows, or as many as there are ranks (one collective's
// calls on every rank are one line).
constexpr std::size_t kCallsPerListedCall = 64;

// Who sent how much to whom: the rank pairs that moved the most bytes, with the time each end spent on
// them, and how many sends and receives found their partner.
void writePointToPoint(const storage::PeerMessages& matched, const storage::PeerMatrix& matrix,
                       std::ostream& out) {
  struct Pair {
    int from, to;
    std::int64_t sends, bytes, send_ns, receives, recv_ns;
  };
  std::vector<Pair> pairs;
  const auto n = static_cast<std::size_t>(matrix.ranks);
  for (std::size_t from = 0; from < n; ++from)
    for (std::size_t to = 0; to < n; ++to) {
      const std::size_t sent = from * n + to, received = to * n + from;
      if (matrix.send_calls[sent] == 0 && matrix.recv_calls[received] == 0) continue;
      pairs.push_back({static_cast<int>(from), static_cast<int>(to), matrix.send_calls[sent],
                       matrix.sent_bytes[sent], matrix.send_ns[sent], matrix.recv_calls[received],
                       matrix.recv_ns[received]});
    }
  std::stable_sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
    return std::tie(a.bytes, a.recv_ns) > std::tie(b.bytes, b.recv_ns);
  });
  const auto messages = static_cast<std::uint64_t>(matched.messages.size());
  out << fmt::format("\nPoint-to-point: {} message{} matched between {} rank pair{}{}\n",
                     formatCount(messages), messages == 1 ? "" : "s", pairs.size(),
                     pairs.size() == 1 ? "" : "s",
                     matched.unmatched == 0 ? " (every send and receive found its partner)" : "");
  if (matched.unmatched > 0)
    out << fmt::format("  {} {} without a partner in the trace{}\n",
                       formatCount(static_cast<std::uint64_t>(matched.unmatched)),
                       matched.unmatched == 1 ? "send or receive" : "sends and receives",
                       matched.unresolved > 0
                           ? fmt::format(" ({} with a peer whose rank is not in it: a missing rank file?)",
                                         formatCount(static_cast<std::uint64_t>(matched.unresolved)))
                           : std::string(" (dropped by the agent?)"));
  if (pairs.empty()) return;
  out << fmt::format("  {:>5} {:>5} {:>9} {:>10} {:>10} {:>9} {:>10}\n", "from", "to", "sends", "bytes",
                     "send time", "receives", "recv time");
  for (std::size_t i = 0; i < pairs.size() && i < kPairsListed; ++i) {
    const Pair& pair = pairs[i];
    out << fmt::format("  {:>5} {:>5} {:>9} {:>10} {:>10} {:>9} {:>10}\n", pair.from, pair.to,
                       formatCount(static_cast<std::uint64_t>(pair.sends)),
                       formatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(pair.bytes, 0))),
                       formatDuration(static_cast<double>(pair.send_ns)),
                       formatCount(static_cast<std::uint64_t>(pair.receives)),
                       formatDuration(static_cast<double>(pair.recv_ns)));
  }
  if (pairs.size() > kPairsListed) out << fmt::format("  ... {} more pairs\n", pairs.size() - kPairsListed);
  out << "  send time: the sender's time in its sends to the peer; recv time: the receiver's in receiving "
         "from it (mostly waiting for the sender)\n";
}

// A pipeline's bubble as each rank saw it: its time blocked in receives from the stage before it.
// Shown when the point-to-point traffic forms more than one stage.
void writePipeline(const std::vector<storage::PipelineRank>& ranks, std::ostream& out) {
  if (ranks.empty() || ranks.back().stage == 0) return;
  const int stages = ranks.back().stage + 1;
  out << fmt::format("\nPipeline: {} stages; blocked = time in receives from upstream ranks (the bubble)\n",
                     stages);
  out << fmt::format("  {:>5} {:>5} {:>10} {:>9} {:>8} {:>16} {:>9}\n", "stage", "rank", "blocked",
                     "receives", "of span", "from downstream", "receives");
  const auto duration = [](std::int64_t ns, std::int64_t calls) {
    return calls > 0 ? formatDuration(static_cast<double>(ns)) : std::string("-");
  };
  const auto count = [](std::int64_t calls) {
    return calls > 0 ? formatCount(static_cast<std::uint64_t>(calls)) : std::string("-");
  };
  // Many ranks: the most blocked ones only; the per-stage lines below cover every rank.
  std::vector<const storage::PipelineRank*> listed;
  for (const storage::PipelineRank& rank : ranks) listed.push_back(&rank);
  if (listed.size() > kRanksListed) {
    std::stable_sort(listed.begin(), listed.end(),
                     [](const auto* a, const auto* b) { return a->blocked_ns > b->blocked_ns; });
    listed.resize(kRanksStandingOut);
    out << fmt::format("  ({} ranks: the {} most blocked)\n", ranks.size(), kRanksStandingOut);
  }
  for (const storage::PipelineRank* listed_rank : listed)
    out << fmt::format(
        "  {:>5} {:>5} {:>10} {:>9} {:>8} {:>16} {:>9}\n", listed_rank->stage, listed_rank->rank,
        duration(listed_rank->blocked_ns, listed_rank->recv_calls), count(listed_rank->recv_calls),
        listed_rank->recv_calls > 0
            ? percent(static_cast<double>(listed_rank->blocked_ns), static_cast<double>(listed_rank->busy_ns))
            : std::string("-"),
        duration(listed_rank->downstream_ns, listed_rank->downstream_calls),
        count(listed_rank->downstream_calls));
  for (int stage = 1; stage < stages; ++stage) {
    std::int64_t blocked = 0, span = 0, members = 0;
    for (const storage::PipelineRank& rank : ranks)
      if (rank.stage == stage) blocked += rank.blocked_ns, span += rank.busy_ns, ++members;
    out << fmt::format("  stage {}: {} blocked per rank on average, {} of the ranks' span\n", stage,
                       formatDuration(static_cast<double>(blocked) / static_cast<double>(members)),
                       percent(static_cast<double>(blocked), static_cast<double>(span)));
  }
  out << "  upstream: of two ranks that exchange messages, the one that sent first; of span: of the rank's "
         "time from its first call to its last\n";
}

// How evenly each rank's all-to-alls spread their bytes over the peers.
void writeAllToAll(const std::vector<storage::AllToAllBalance>& rows, std::ostream& out) {
  if (rows.empty()) return;
  out << "\nAll-to-all balance (imbalance: the most bytes sent to one peer over an even share; 1.00 = "
         "even)\n";
  out << fmt::format("  {:>5} {:<16} {:>9} {:>10} {:>10} {:>10} {:>6} {:>6} {:>10}\n", "rank", "api", "calls",
                     "bytes", "max peer", "min peer", "mean", "worst", "time");
  const storage::AllToAllBalance* worst = &rows.front();
  for (const storage::AllToAllBalance& row : rows)
    if (row.worst_imbalance > worst->worst_imbalance) worst = &row;
  // Many ranks: the most uneven ones only.
  std::vector<const storage::AllToAllBalance*> listed;
  for (const storage::AllToAllBalance& row : rows) listed.push_back(&row);
  if (listed.size() > kRanksListed) {
    std::stable_sort(listed.begin(), listed.end(),
                     [](const auto* a, const auto* b) { return a->worst_imbalance > b->worst_imbalance; });
    listed.resize(kRanksStandingOut);
    out << fmt::format("  ({} rows of ranks and APIs: the {} most uneven)\n", rows.size(), kRanksStandingOut);
  }
  for (const storage::AllToAllBalance* listed_row : listed) {
    const storage::AllToAllBalance& row = *listed_row;
    out << fmt::format("  {:>5} {:<16} {:>9} {:>10} {:>10} {:>10} {:>6.2f} {:>6.2f} {:>10}\n", row.rank,
                       name(row.api), formatCount(static_cast<std::uint64_t>(row.calls)),
                       formatBytes(static_cast<std::uint64_t>(row.bytes)),
                       formatBytes(static_cast<std::uint64_t>(row.max_peer_bytes)),
                       formatBytes(static_cast<std::uint64_t>(row.min_peer_bytes)), row.mean_imbalance,
                       row.worst_imbalance, formatDuration(static_cast<double>(row.time_ns)));
  }
  if (worst->worst_imbalance > 1.0)
    out << fmt::format("  most uneven: rank {} {}, one peer got {:.2f}x an even share\n", worst->rank,
                       name(worst->api), worst->worst_imbalance);
}

// The ranks grouped by the host they ran on, when they ran on several: each host's ranks, calls, time in
// them, how late its ranks arrived on average, and the clock offset merge removed from its times. At most
// kRanksListed hosts: beyond, the ones whose ranks arrived latest.
void writeHosts(const std::map<std::int64_t, const storage::RankInfo*>& rank_by_id,
                const std::vector<storage::RankSummary>& summaries,
                const std::map<std::int64_t, storage::TraceReader::Lateness>& late, bool collectives_only,
                std::ostream& out) {
  struct Host {
    std::vector<int> ranks;
    std::int64_t calls = 0, total_ns = 0, matched = 0;
    double late_ns = 0;  // sum over matched collectives
    std::optional<std::int64_t> offset_ns;
  };
  std::map<std::string, Host> hosts;
  for (const auto& [id, rank] : rank_by_id) {
    Host& host = hosts[rank->host];
    host.ranks.push_back(rank->rank);
    host.offset_ns = rank->clock_offset_ns;
  }
  if (hosts.size() < 2) return;
  for (const auto& summary : summaries) {
    const auto rank = rank_by_id.find(summary.rank_id);
    if (rank == rank_by_id.end()) continue;
    Host& host = hosts[rank->second->host];
    host.calls += summary.calls;
    host.total_ns += summary.total_ns;
    if (const auto lateness = late.find(summary.rank_id); lateness != late.end()) {
      host.matched += lateness->second.matched;
      host.late_ns += lateness->second.mean_ns * static_cast<double>(lateness->second.matched);
    }
  }
  const auto meanLate = [](const Host& host) {
    return host.matched > 0 ? host.late_ns / static_cast<double>(host.matched) : -1.0;
  };
  std::vector<const std::pair<const std::string, Host>*> listed;
  for (const auto& entry : hosts) listed.push_back(&entry);
  if (listed.size() > kRanksListed) {
    std::stable_sort(listed.begin(), listed.end(),
                     [&](const auto* a, const auto* b) { return meanLate(a->second) > meanLate(b->second); });
    listed.resize(kRanksListed / 4);
  }
  out << fmt::format(
      "\nPer host ({} hosts{}; clock offset: what merge added to the host's times to align its clock with "
      "the "
      "first rank's host)\n",
      hosts.size(), listed.size() < hosts.size() ? ", those whose ranks arrived latest" : "");
  out << fmt::format("  {:<16} {:<14} {:>10} {:>10} {:>12} {:>13}\n", "host", "ranks", "calls",
                     collectives_only ? "in coll." : "in calls", "mean late", "clock offset");
  for (const auto* entry : listed) {
    const Host& host = entry->second;
    out << fmt::format("  {:<16} {:<14} {:>10} {:>10} {:>12} {:>13}\n", entry->first, rankList(host.ranks),
                       formatCount(static_cast<std::uint64_t>(host.calls)),
                       formatDuration(static_cast<double>(host.total_ns)),
                       host.matched > 0 ? formatDuration(meanLate(host)) : "-",
                       host.offset_ns ? formatDuration(static_cast<double>(*host.offset_ns)) : "-");
  }
}

// Decimal megabytes per second, three significant digits.
std::string megabytesPerSecond(double bytes_per_second) {
  const double mb = bytes_per_second / 1e6;
  return fmt::format("{} MB/s", mb >= 100 ? fmt::format("{:.0f}", mb) : fmt::format("{:.3g}", mb));
}

// The links between hosts that explore mode timed at start, slowest first (at most kRanksListed), and the
// host whose link is slow when one stands out.
void writeLinks(const storage::HostLinks& links, std::ostream& out) {
  if (links.pairs.empty()) return;
  const auto bytes = static_cast<std::uint64_t>(links.pairs.front().bytes);
  out << fmt::format(
      "\nLinks between hosts (explore mode, at start: {} each way at once between two hosts' lowest ranks, "
      "the fastest try; slowest first)\n",
      formatBytes(bytes));
  out << fmt::format("  {:<16} {:<16} {:>12} {:>10}\n", "host", "host", "each way", "exchange");
  for (std::size_t i = 0; i < links.pairs.size() && i < kRanksListed; ++i) {
    const auto& pair = links.pairs[i];
    out << fmt::format("  {:<16} {:<16} {:>12} {:>10}\n", pair.host, pair.peer,
                       megabytesPerSecond(pair.bytesPerSecond()),
                       formatDuration(static_cast<double>(pair.ns)));
  }
  if (links.pairs.size() > kRanksListed)
    out << fmt::format("  ... {} more pairs\n", links.pairs.size() - kRanksListed);
  if (!links.slow_host.empty())
    out << fmt::format(
        "  host {}'s link is slow: its exchanges ran at {} at best, the others' at {} (median)\n",
        links.slow_host, megabytesPerSecond(links.slow_bytes_per_second),
        megabytesPerSecond(links.others_bytes_per_second));
  else if (links.pairs.size() == 1)
    out << "  (two hosts: a slow link could be either end's; three or more tell them apart)\n";
}

}  // namespace

// Many ranks: the spread of the per-rank figures over the ranks, then the ranks and hosts that stand out
// (rankRow writes one rank's line of the per-rank table).
template <typename RankRow>
void writeRanksAtScale(const std::vector<storage::RankSummary>& ranks,
                       const std::map<std::int64_t, storage::TraceReader::Lateness>& late,
                       std::string_view in_calls, const RankRow& rankRow, std::ostream& out) {
  const auto meanLate = [&](const storage::RankSummary& rank) -> std::optional<double> {
    const auto it = late.find(rank.rank_id);
    if (it == late.end() || it->second.matched == 0) return std::nullopt;
    return it->second.mean_ns;
  };
  std::vector<double> calls, time, share, lateness;
  for (const auto& rank : ranks) {
    calls.push_back(static_cast<double>(rank.calls));
    time.push_back(static_cast<double>(rank.total_ns));
    if (rank.last_ns > rank.first_ns)
      share.push_back(static_cast<double>(rank.busy_ns) / static_cast<double>(rank.last_ns - rank.first_ns));
    if (const auto mean = meanLate(rank)) lateness.push_back(*mean);
  }
  const auto spread = [&](std::string_view label, std::vector<double> values, const auto& text) {
    if (values.empty()) return;
    std::sort(values.begin(), values.end());
    const auto at = [&](double q) {
      return text(values[static_cast<std::size_t>(q * static_cast<double>(values.size() - 1) + 0.5)]);
    };
    out << fmt::format("  {:<12} {:>10} {:>10} {:>10} {:>10} {:>10}\n", label, at(0), at(0.1), at(0.5),
                       at(0.9), at(1));
  };
  out << fmt::format("  {:<12} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "over ranks", "min", "p10", "median",
                     "p90", "max");
  spread("calls", calls, [](double v) { return formatCount(static_cast<std::uint64_t>(v)); });
  spread(in_calls, time, [](double v) { return formatDuration(v); });
  spread("share", share, [](double v) { return fmt::format("{:.1f}%", 100 * v); });
  spread("mean late", lateness, [](double v) { return formatDuration(v); });

  const auto header = [&](std::string_view title) {
    out << fmt::format("  {}\n  {:>5} {:<16} {:>8} {:>10} {:>10} {:>8} {:>12} {:>12}\n", title, "rank",
                       "host", "pid", "calls", in_calls, "share", "mean late", "max late");
  };
  std::vector<const storage::RankSummary*> order;
  for (const auto& rank : ranks) order.push_back(&rank);
  const std::size_t shown = std::min(kRanksStandingOut, order.size());
  if (!lateness.empty()) {
    std::partial_sort(
        order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
        [&](const auto* a, const auto* b) { return meanLate(*a).value_or(0) > meanLate(*b).value_or(0); });
    header(fmt::format("the {} latest ranks (the others wait for them)", shown));
    for (std::size_t i = 0; i < shown; ++i) rankRow(*order[i]);
  }
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                    [](const auto* a, const auto* b) { return a->total_ns > b->total_ns; });
  header(fmt::format("the {} ranks with the most time {}", shown,
                     in_calls == "in coll." ? "in collectives" : "in calls"));
  for (std::size_t i = 0; i < shown; ++i) rankRow(*order[i]);

  // Hosts: a slow node makes all its ranks late.
  struct Host {
    std::string_view name;
    int ranks = 0, late_ranks = 0;
    double late_ns = 0, time_ns = 0;
  };
  std::map<std::string_view, Host> hosts;
  for (const auto& rank : ranks) {
    Host& host = hosts[rank.host];
    host.name = rank.host;
    ++host.ranks;
    host.time_ns += static_cast<double>(rank.total_ns);
    if (const auto mean = meanLate(rank)) host.late_ns += *mean, ++host.late_ranks;
  }
  if (hosts.size() < 2 || lateness.empty()) return;
  std::vector<Host> by_late;
  for (const auto& [name, host] : hosts) by_late.push_back(host);
  const auto hostLate = [](const Host& host) {
    return host.late_ranks > 0 ? host.late_ns / host.late_ranks : 0.0;
  };
  const std::size_t hosts_shown = std::min(kRanksStandingOut, by_late.size());
  std::partial_sort(by_late.begin(), by_late.begin() + static_cast<std::ptrdiff_t>(hosts_shown),
                    by_late.end(), [&](const Host& a, const Host& b) { return hostLate(a) > hostLate(b); });
  out << fmt::format(
      "  the {} latest of {} hosts (their ranks' mean lateness)\n  {:<22} {:>6} {:>12} {:>12}\n", hosts_shown,
      formatCount(hosts.size()), "host", "ranks", "mean late", in_calls);
  for (std::size_t i = 0; i < hosts_shown; ++i)
    out << fmt::format("  {:<22} {:>6} {:>12} {:>12}\n", by_late[i].name, by_late[i].ranks,
                       formatDuration(hostLate(by_late[i])),
                       formatDuration(by_late[i].time_ns / by_late[i].ranks));
}

// What `gradscope recommend` (lossless strategies, its defaults) predicts the plan saves, on the reductions
// and on the step (docs/tuner.md, "On the step"). Said only when it can make a plan from this trace.
void writePlanOnTheStep(const std::string& path, std::ostream& out) {
  tuner::Result result;
  try {
    result = tuner::recommend(tuner::readInputs({path}), {});
  } catch (const Error&) {
    return;  // too few measurements for a plan: the explored strategies above say what there is
  }
  const tuner::Report& plan = result.report;
  if (!plan.baseline_per_step || !plan.choice_per_step || !(plan.baseline_per_step->median_ns > 0)) return;
  const double saved = plan.baseline_per_step->median_ns - plan.choice_per_step->median_ns;
  out << fmt::format(
      "\nPlan (gradscope recommend, lossless strategies): {} rule{}; reductions {} faster ({} of {} "
      "per step)",
      result.recommendation.rules.size(), result.recommendation.rules.size() == 1 ? "" : "s",
      percent(saved, plan.baseline_per_step->median_ns), formatDuration(saved),
      formatDuration(plan.baseline_per_step->median_ns));
  if (plan.step_ns && plan.step_saving_ns && *plan.step_ns > 0)
    out << fmt::format(
        ";\n  on the step {:.2f}% faster ({} of {}){}", 100 * *plan.step_saving_ns / *plan.step_ns,
        formatDuration(*plan.step_saving_ns), formatDuration(*plan.step_ns),
        saved > 0 && *plan.step_saving_ns < 0.5 * saved ? ": most of this reduction is hidden behind compute"
                                                        : "");
  out << "\n";
}

// The step model (storage/step_model.h): the median and the worst step, each split into what the ranks
// did on average, and what waiting for the last rank cost.
template <typename RankLabel, typename HostLabel>
void writeSteps(const std::vector<storage::StepRecord>& rows, const RankLabel& rankLabel,
                const HostLabel& onHost, const std::string& slow_host, std::ostream& out) {
  std::vector<storage::StepTotals> steps = storage::stepTotals(rows);
  if (steps.empty()) return;
  int ranks = 0;
  for (const auto& step : steps) ranks = std::max(ranks, step.ranks);
  // GPU ranks: their breakdown comes from the sampled windows' kernels, for the steps inside one.
  std::int64_t gpu_rows = 0, gpu_measured = 0, gpu_idle_ns = 0, gpu_span_ns = 0;
  for (const storage::StepRecord& row : rows) {
    if (row.basis == storage::StepBasis::Host) continue;
    ++gpu_rows;
    if (row.basis != storage::StepBasis::Gpu) continue;
    ++gpu_measured;
    gpu_idle_ns += row.idle_ns;
    gpu_span_ns += row.end_ns - row.start_ns;
  }
  std::int64_t measured_steps = 0;
  for (const auto& step : steps) measured_steps += step.measured > 0 ? 1 : 0;
  out << fmt::format(
      "\nSteps ({} step{} on {} rank{}; a rank's step runs from its first call to the next step's; means "
      "over "
      "the ranks)\n",
      steps.size(), steps.size() == 1 ? "" : "s", ranks, ranks == 1 ? "" : "s");
  if (gpu_rows > 0)
    out << fmt::format(
        "  GPU ranks: measured on the GPU in {} of {} rank steps (the agent's sampled windows, {}); there a "
        "step runs from its first NCCL kernel to the next step's, and exposed communication is NCCL kernel "
        "time not overlapped by compute kernels\n",
        gpu_measured, gpu_rows, env::kGpuWindows);
  if (measured_steps == 0) {
    std::vector<std::int64_t> spans;
    for (const auto& step : steps) spans.push_back(step.span_ns);
    std::sort(spans.begin(), spans.end());
    out << fmt::format(
        "  step time: median {}, worst {}; no breakdown: NCCL runs on the GPU and no step lay inside a "
        "sampled GPU window (no CUPTI, {}=0, or steps longer than the windows: {})\n",
        env::kCupti, env::kGpuWindows, formatDuration(static_cast<double>(spans[spans.size() / 2])),
        formatDuration(static_cast<double>(spans.back())));
    return;
  }
  out << fmt::format("  {:<14} {:>10} {:>17} {:>17} {:>17} {:>14}\n", "step", "time", "compute",
                     "exposed comm.", "of it waiting", "hidden comm.");
  const auto line = [&](std::string_view label, const storage::StepTotals& step) {
    const double span = step.compute_ns + step.exposed_ns;
    const auto part = [&](double ns) {
      return fmt::format("{} {:>5}", formatDuration(ns), percent(ns, span));
    };
    out << fmt::format("  {:<14} {:>10} {:>17} {:>17} {:>17} {:>14}\n", label,
                       formatDuration(static_cast<double>(step.span_ns)), part(step.compute_ns),
                       part(step.exposed_ns), part(step.waiting_ns), formatDuration(step.hidden_ns));
  };
  // The median and worst of the steps with a breakdown (GPU steps outside the windows have none).
  std::vector<const storage::StepTotals*> by_time;
  for (const auto& step : steps)
    if (step.measured > 0) by_time.push_back(&step);
  std::stable_sort(by_time.begin(), by_time.end(),
                   [](const auto* a, const auto* b) { return a->span_ns < b->span_ns; });
  const storage::StepTotals& median = *by_time[by_time.size() / 2];
  const storage::StepTotals& worst = *by_time.back();
  line(fmt::format("median (#{})", median.step), median);
  if (&worst != &median) line(fmt::format("worst (#{})", worst.step), worst);
  if (gpu_measured > 0)
    out << fmt::format(
        "  GPU idle (no kernel running: the host launched too little) in the measured steps: "
        "{} of their time\n",
        percent(static_cast<double>(gpu_idle_ns), static_cast<double>(gpu_span_ns)));

  const storage::Stragglers late = storage::stragglers(rows);
  if (late.lost_ns <= 0) {
    out << "  stragglers: none (no rank was blocked by a late one)\n";
    return;
  }
  out << fmt::format("  stragglers: the ranks lost {} waiting for the last to arrive ({} of their step time)",
                     formatDuration(static_cast<double>(late.lost_ns)),
                     percent(static_cast<double>(late.lost_ns), static_cast<double>(late.rank_time_ns)));
  if (late.ranks.empty()) {
    out << "\n";
    return;
  }
  // A slow link makes late the ranks after it (in a ring, the next host's), not its own host's: the
  // links explore timed name it.
  const std::string link_note =
      slow_host.empty()
          ? std::string()
          : fmt::format(
                "    host {}'s link is slow (see \"Links between hosts\"): ranks after it wait on it\n",
                slow_host);
  const auto& first = late.ranks.front();
  if (late.persistent) {
    out << fmt::format(
        ";\n    rank {}{} was last in {} of {} steps, costing the others {}: a slow rank or node, not "
        "noise\n",
        rankLabel(first.rank_id), onHost(first.rank_id), first.steps_last, late.steps,
        formatDuration(static_cast<double>(first.caused_ns)));
    out << link_note;
    return;
  }
  out << ";\n    the last rank changes from step to step (noise, not one slow rank):";
  for (std::size_t i = 0; i < late.ranks.size() && i < 3; ++i)
    out << fmt::format("{} rank {} last in {}", i == 0 ? "" : ",", rankLabel(late.ranks[i].rank_id),
                       late.ranks[i].steps_last);
  out << "\n" << link_note;
}

// Words wrapped into lines of at most `width` characters, each after `indent`.
std::string wrapped(const std::string& text, std::string_view indent, std::size_t width = 108) {
  std::string out, line;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t space = text.find(' ', at);
    const std::string word = text.substr(at, space == std::string::npos ? std::string::npos : space - at);
    at = space == std::string::npos ? text.size() : space + 1;
    // A unit stays with its number ("48.9 ms", "2.1 us)").
    const std::string_view bare(word.data(), word.find_first_of("),;.") == std::string::npos
                                                 ? word.size()
                                                 : word.find_first_of("),;."));
    const bool unit = bare == "ns" || bare == "us" || bare == "ms" || bare == "s";
    if (!line.empty() && line.size() + 1 + word.size() > width && !unit) {
      out += fmt::format("{}{}\n", indent, line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += fmt::format("{}{}\n", indent, line);
  return out;
}

// What dropping the lock-step would buy and cost (tuner/async.h), when the steps allow a replay.
void writeAsync(const tuner::AsyncAnalysis& analysis, std::ostream& out) {
  if (!analysis.why_not.empty()) return;
  out << "\nSynchronous or asynchronous (docs/async.md; the steps replayed with each async strategy)\n";
  out << fmt::format("  waiting for the last rank: {} of the step, {} per step on average, worst {}\n",
                     percent(analysis.waiting_mean_ns, analysis.step_ns),
                     formatDuration(analysis.waiting_mean_ns), formatDuration(analysis.waiting_worst_ns));
  out << fmt::format("  exposed reduction per step: {} (what an async scheme hides behind compute)\n",
                     formatDuration(analysis.exposed_ns));
  out << fmt::format("  replayed synchronous step: {} (measured {}, {} steps of {} ranks)\n",
                     formatDuration(analysis.replay_sync_ns), formatDuration(analysis.step_ns),
                     analysis.steps, analysis.ranks);
  out << fmt::format("    {:<14} {:>10} {:>28} {:>10} {:>10} {:>8}\n", "strategy", "step",
                     "on the step [95%]", "error", "worst", "samples");
  for (const tuner::AsyncOption& option : analysis.options) {
    const double sync = analysis.replay_sync_ns;
    const auto signedShare = [&](double ns) {
      return sync > 0 ? fmt::format("{:+.1f}%", 100.0 * ns / sync) : "-";
    };
    out << fmt::format("    {:<14} {:>10} {:>28} {:>10} {:>10} {:>8}\n", option.strategy,
                       formatDuration(option.step_ns),
                       fmt::format("{} [{}, {}]", signedShare(-option.saving_ns),
                                   signedShare(-option.saving_high_ns), signedShare(-option.saving_low_ns)),
                       option.error_median ? fmt::format("{:.2g}", *option.error_median) : "-",
                       option.error_worst ? fmt::format("{:.2g}", *option.error_worst) : "-",
                       option.error_samples > 0 ? std::to_string(option.error_samples) : "-");
  }
  out << wrapped(analysis.verdict, "  ");
}

// The GPU-measured steps' compute by the job's NVTX ranges, when the agent saw any.
void writeGpuRanges(const storage::GpuRanges& gpu, std::ostream& out) {
  const bool named = std::any_of(gpu.ranges.begin(), gpu.ranges.end(),
                                 [](const storage::GpuRangeTime& r) { return !r.range.empty(); });
  if (gpu.steps == 0 || !named) return;
  out << "  GPU compute by NVTX range (kernels launched inside it, mean per measured step):";
  constexpr std::size_t kShown = 6;
  for (std::size_t i = 0; i < gpu.ranges.size() && i < kShown; ++i) {
    const storage::GpuRangeTime& range = gpu.ranges[i];
    out << fmt::format("{} {} {} ({})", i == 0 ? "" : ",", range.range.empty() ? "(no range)" : range.range,
                       formatDuration(static_cast<double>(range.ns) / static_cast<double>(gpu.steps)),
                       percent(static_cast<double>(range.ns), static_cast<double>(gpu.span_ns)));
  }
  if (gpu.ranges.size() > kShown) out << fmt::format(", {} more", gpu.ranges.size() - kShown);
  out << "\n";
}

void writeReport(const storage::TraceReader& reader, std::ostream& out, const ReportOptions& options) {
  const auto runs = reader.runs();
  const auto ranks = reader.ranks();
  std::map<std::int64_t, const storage::RankInfo*> rank_by_id;
  for (const auto& rank : ranks) rank_by_id[rank.id] = &rank;
  std::map<std::int64_t, std::string> comm_key;
  for (const auto& comm : reader.comms()) comm_key[comm.id] = comm.key;
  const auto rankLabel = [&](std::int64_t rank_id) {
    const auto it = rank_by_id.find(rank_id);
    return it == rank_by_id.end() ? fmt::format("#{}", rank_id) : std::to_string(it->second->rank);
  };

  out << fmt::format("gradscope report: {}\n\n", options.name.empty() ? reader.path() : options.name);
  for (const auto& run : runs) {
    out << fmt::format("Run       {} ({}, backend {}, {} rank{}, host {})\n", run.uuid, run.mode,
                       name(run.backend), run.world_size, run.world_size == 1 ? "" : "s", run.host);
    out << fmt::format("Command   {}\n", run.command.empty() ? "-" : run.command);
    if (run.end_ns)
      out << fmt::format("Time      {}, lasted {}\n", utcTime(run.epoch_ns + run.start_ns),
                         formatDuration(static_cast<double>(*run.end_ns - run.start_ns)));
    else
      out << fmt::format("Time      {}, incomplete: no end recorded (still running, or the job died)\n",
                         utcTime(run.epoch_ns + run.start_ns));
    out << fmt::format("Written   by gradscope {}\n", run.tool_version);
  }

  const storage::HostLinks host_links = storage::analyzeLinks(storage::linkMeasurements(runs));

  // The slowest calls are read many times over, so that one collective's calls on many ranks make one
  // line, its slowest rank's, and still leave room for the others (a 1024-rank job lists each all-reduce
  // once, not the same one ten times).
  const std::size_t fetched_calls = std::min<std::size_t>(
      options.top_calls * std::max(kCallsPerListedCall, ranks.size()), std::size_t{1} << 20);
  // lateness() scans the calls twice and callStatistics() once, most of a large trace's report: the
  // former runs on a connection of its own, beside the latter.
  auto lateness_later = std::async(
      std::launch::async, [path = reader.path()] { return storage::TraceReader::open(path).lateness(); });
  const auto stats = reader.callStatistics(fetched_calls);
  std::int64_t total_calls = 0, total_ns = 0, busy_ns = 0, rank_time_ns = 0;
  for (const auto& rank : stats.ranks) {
    total_calls += rank.calls;
    total_ns += rank.total_ns;
    busy_ns += rank.busy_ns;
    rank_time_ns += rank.calls > 0 ? rank.last_ns - rank.first_ns : 0;
  }
  // The share is of the time a collective was running (the union of the calls), which nonblocking
  // calls in flight while others run would otherwise count twice, past 100%.
  const std::string overlap = busy_ns < total_ns
                                  ? fmt::format("; {} of it in nonblocking calls overlapping others",
                                                formatDuration(static_cast<double>(total_ns - busy_ns)))
                                  : std::string();
  // A trace of collectives only says so, as it always did; one with point-to-point calls or barriers as
  // well speaks of calls, and "Time by API family" splits them.
  const bool collectives_only = std::all_of(
      stats.sizes.begin(), stats.sizes.end(),
      [](const storage::SizeBucket& size) { return familyOf(size.api) == ApiFamily::Collective; });
  out << fmt::format("Calls     {} {} on {} rank{}, {} in {} ({} of the ranks' active time{})\n",
                     formatCount(static_cast<std::uint64_t>(total_calls)),
                     collectives_only ? "collective calls" : "calls", stats.ranks.size(),
                     stats.ranks.size() == 1 ? "" : "s", formatDuration(static_cast<double>(total_ns)),
                     collectives_only ? "collectives" : "them",
                     percent(static_cast<double>(busy_ns), static_cast<double>(rank_time_ns)), overlap);
  if (total_calls == 0) {
    out << "\nNo collective calls were recorded.\n";
    if (!reader.measurements().empty()) out << "(A benchmark trace: its measurements follow.)\n";
  } else {
    out << fmt::format("\nTime in {} by API and size (summed over ranks)\n",
                       collectives_only ? "collectives" : "calls");
    out << fmt::format("  {:<26} {:>19} {:>11} {:>10} {:>10} {:>10} {:>10} {:>7}\n", "api", "size", "calls",
                       "total", "mean", "min", "max", "share");
    for (const auto& size : stats.sizes) {
      out << fmt::format("  {:<26} {:>19} {:>11} {:>10} {:>10} {:>10} {:>10} {:>7}\n", name(size.api),
                         sizeRange(size.log2_bytes), formatCount(static_cast<std::uint64_t>(size.calls)),
                         formatDuration(static_cast<double>(size.total_ns)),
                         formatDuration(static_cast<double>(size.total_ns) / static_cast<double>(size.calls)),
                         formatDuration(static_cast<double>(size.min_ns)),
                         formatDuration(static_cast<double>(size.max_ns)),
                         percent(static_cast<double>(size.total_ns), static_cast<double>(total_ns)));
    }

    writeFamilies(stats.sizes, out);
    writeGraphReplays(reader.replaySummary(), out);

    // One line per collective (communicator key, seq, replay): its slowest call; point-to-point calls,
    // numbered apart, are each their own.
    std::vector<std::pair<const storage::CallRecord*, int>> slowest_calls;  // (its slowest call, ranks read)
    std::map<std::tuple<std::string, std::int64_t, std::int64_t>, std::size_t> line_of;
    for (const auto& call : stats.longest) {
      if (!numberedApart(call.api)) {
        const auto [it, inserted] =
            line_of.try_emplace({comm_key[call.comm_id], call.seq, call.graph_replay}, slowest_calls.size());
        if (!inserted) {
          if (it->second < slowest_calls.size()) ++slowest_calls[it->second].second;
          continue;
        }
      }
      if (slowest_calls.size() < options.top_calls) slowest_calls.emplace_back(&call, 1);
    }
    out << fmt::format(
        "\nSlowest calls (each collective once, at its slowest rank; ranks: its calls among the {} "
        "slowest)\n",
        formatCount(static_cast<std::uint64_t>(stats.longest.size())));
    out << fmt::format("  {:>5} {:<26} {:>10} {:>10} {:>12} {:>7} {:>9} {:>6}  {}\n", "rank", "api", "bytes",
                       "duration", "start", "step", "seq", "ranks", "comm");
    for (const auto& [call_pointer, ranks_among] : slowest_calls) {
      const storage::CallRecord& call = *call_pointer;
      out << fmt::format("  {:>5} {:<26} {:>10} {:>10} {:>12} {:>7} {:>9} {:>6}  {}\n",
                         rankLabel(call.rank_id), name(call.api),
                         formatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(call.bytes, 0))),
                         formatDuration(static_cast<double>(call.end_ns - call.start_ns)),
                         formatDuration(static_cast<double>(call.start_ns)),
                         call.step >= 0 ? std::to_string(call.step) : "-",
                         // A graph replay: the captured call's seq and which replay ("17 r3").
                         call.graph_replay > 0 ? fmt::format("{} r{}", call.seq, call.graph_replay)
                                               : std::to_string(call.seq),
                         ranks_among, comm_key[call.comm_id]);
    }

    std::map<std::int64_t, storage::TraceReader::Lateness> late;
    for (const auto& row : lateness_later.get()) late[row.rank_id] = row;
    out << fmt::format(
        "\nPer rank{} (lateness: how long after the first rank this rank started the same "
        "collective)\n",
        stats.ranks.size() <= kRanksListed
            ? std::string()
            : fmt::format(": {} ranks, their spread and the ones that stand out",
                          formatCount(static_cast<std::uint64_t>(stats.ranks.size()))));
    if (stats.ranks.size() <= kRanksListed)
      out << fmt::format("  {:>5} {:<16} {:>8} {:>10} {:>10} {:>8} {:>12} {:>12}\n", "rank", "host", "pid",
                         "calls", collectives_only ? "in coll." : "in calls", "share", "mean late",
                         "max late");
    std::int64_t slowest = -1, fastest = -1;
    const auto rankRow = [&](const storage::RankSummary& rank) {
      const auto info = rank_by_id.find(rank.rank_id);
      const auto lateness = late.find(rank.rank_id);
      const bool has_late = lateness != late.end() && lateness->second.matched > 0;
      out << fmt::format(
          "  {:>5} {:<16} {:>8} {:>10} {:>10} {:>8} {:>12} {:>12}\n", rankLabel(rank.rank_id),
          info == rank_by_id.end() ? "-" : info->second->host,
          info == rank_by_id.end() ? 0 : info->second->pid,
          formatCount(static_cast<std::uint64_t>(rank.calls)),
          formatDuration(static_cast<double>(rank.total_ns)),
          percent(static_cast<double>(rank.busy_ns), static_cast<double>(rank.last_ns - rank.first_ns)),
          has_late ? formatDuration(lateness->second.mean_ns) : "-",
          has_late ? formatDuration(static_cast<double>(lateness->second.max_ns)) : "-");
    };
    if (stats.ranks.size() > kRanksListed)
      writeRanksAtScale(stats.ranks, late, collectives_only ? "in coll." : "in calls", rankRow, out);
    for (const auto& rank : stats.ranks) {
      if (stats.ranks.size() <= kRanksListed) rankRow(rank);
      if (rank.calls > 0) {
        if (slowest < 0 || rank.total_ns > stats.ranks[static_cast<std::size_t>(slowest)].total_ns)
          slowest = &rank - stats.ranks.data();
        if (fastest < 0 || rank.total_ns < stats.ranks[static_cast<std::size_t>(fastest)].total_ns)
          fastest = &rank - stats.ranks.data();
      }
    }
    if (stats.ranks.size() > 1 && slowest >= 0) {
      const auto& most = stats.ranks[static_cast<std::size_t>(slowest)];
      const auto& least = stats.ranks[static_cast<std::size_t>(fastest)];
      out << fmt::format("  spread: rank {} spent {} in {}, rank {} {} ({} more)\n", rankLabel(most.rank_id),
                         formatDuration(static_cast<double>(most.total_ns)),
                         collectives_only ? "collectives" : "communication calls", rankLabel(least.rank_id),
                         formatDuration(static_cast<double>(least.total_ns)),
                         formatDuration(static_cast<double>(most.total_ns - least.total_ns)));
      // The rank everyone waits for spends the least time inside collectives and arrives last.
      const auto latest = std::max_element(late.begin(), late.end(), [](const auto& a, const auto& b) {
        return a.second.mean_ns < b.second.mean_ns;
      });
      if (latest != late.end() && latest->second.mean_ns > 0)
        out << fmt::format("  rank {} arrives last on average ({} after the first): the others wait for it\n",
                           rankLabel(latest->first), formatDuration(latest->second.mean_ns));
    }
    writeHosts(rank_by_id, stats.ranks, late, collectives_only, out);
    writeLinks(host_links, out);
  }

  {
    const std::vector<storage::StepRecord> step_rows = storage::readOrComputeSteps(reader);
    // With ranks on several hosts, a rank named in the step analysis comes with its host.
    std::set<std::string> host_names;
    for (const auto& rank : ranks) host_names.insert(rank.host);
    const auto onHost = [&](std::int64_t rank_id) {
      const auto it = rank_by_id.find(rank_id);
      return host_names.size() < 2 || it == rank_by_id.end() ? std::string()
                                                             : fmt::format(" (host {})", it->second->host);
    };
    writeSteps(step_rows, rankLabel, onHost, host_links.slow_host, out);
    writeGpuRanges(storage::gpuRangeTimes(reader, step_rows), out);
    if (!step_rows.empty())
      writeAsync(tuner::analyzeAsync(step_rows, tuner::loadMeasurements(reader), rankLabel,
                                     tuner::cpuSharing(reader)),
                 out);
  }

  // Who talked to whom, read only when the trace has such calls (the scans of peer_calls are cheap then).
  const auto has = [&stats](auto&& wanted) {
    return std::any_of(stats.sizes.begin(), stats.sizes.end(),
                       [&](const storage::SizeBucket& size) { return wanted(size.api); });
  };
  if (has([](Api api) { return isPointToPoint(api); })) {
    writePointToPoint(storage::matchPeerMessages(reader), storage::peerMatrix(reader), out);
    writePipeline(storage::pipelineBubbles(reader), out);
  }
  if (has([](Api api) { return collectiveOf(api) == Collective::AllToAll; }))
    writeAllToAll(storage::allToAllBalance(reader), out);

  // Benchmark points; then, in a section of their own, what explore mode timed on the job's calls.
  const auto measurements = reader.measurements();
  std::vector<storage::Measurement> points;
  std::copy_if(measurements.begin(), measurements.end(), std::back_inserter(points),
               [](const storage::Measurement& m) { return !m.call_id; });
  writeMeasurements(std::move(points), out);
  // One sample per collective explored, its ranks' rows merged, as check and recommend count them.
  std::vector<storage::Measurement> explored;
  for (auto& row : tuner::loadMeasurements(reader))
    if (row.measurement.call_id) explored.push_back(std::move(row.measurement));
  writeExplored(explored, out);
  int world = 0;
  bool apply_mode = false, explore_mode = false;
  for (const auto& run : runs) {
    world = std::max(world, run.world_size);
    apply_mode = apply_mode || run.mode == modeName(Mode::Apply);
    explore_mode = explore_mode || run.mode == modeName(Mode::Explore);
  }
  if (explore_mode) {
    writeExploreBudget(agentStats(runs, ranks), !explored.empty(), out);
    writeUnexplored(reader.reductionCounts(), stats.sizes, explored, out);
  }
  if (!explored.empty()) writePlanOnTheStep(reader.path(), out);
  writeConsensus(reader.consensus(), world, out);
  writeApplied(reader.appliedSummary(), apply_mode, out);
  // A validated apply run (gradscope run --validate): what the plan measurably saved on the step.
  for (const auto& run : runs) {
    if (const auto validation = tuner::storedValidation(run))
      out << fmt::format("\nValidation (apply mode, the plan in alternate windows)\n  {}\n",
                         tuner::describe(*validation));
  }
  writeUntouched(agentStats(runs, ranks), out);

  const auto drops = reader.drops();
  out << "\nDropped events\n";
  if (drops.empty()) {
    out << "  none: every intercepted event was recorded\n";
  } else {
    std::int64_t dropped = 0, calls_lost = 0;
    std::set<std::string> kinds;
    std::set<std::int64_t> ranks_dropping;
    for (const auto& drop : drops) ranks_dropping.insert(drop.rank_id);
    // Many ranks: one line per kind (how many ranks, and the one that dropped the most).
    struct KindTotal {
      std::int64_t count = 0, ranks = 0, most = 0, most_rank = 0;
    };
    std::map<std::string, KindTotal> by_kind;
    for (const auto& drop : drops) {
      if (ranks_dropping.size() <= kRanksListed) {
        out << fmt::format("  rank {:>5}  {:<16} {:>12}\n", rankLabel(drop.rank_id), drop.kind,
                           formatCount(static_cast<std::uint64_t>(drop.count)));
      } else {
        KindTotal& total = by_kind[drop.kind];
        total.count += drop.count;
        ++total.ranks;
        if (drop.count > total.most) total.most = drop.count, total.most_rank = drop.rank_id;
      }
      dropped += drop.count;
      if (storage::dropLosesCalls(drop.kind)) calls_lost += drop.count;
      kinds.insert(drop.kind);
    }
    for (const auto& [kind, total] : by_kind)
      out << fmt::format("  {:<16} {:>12} on {} ranks, the most on rank {} ({})\n", kind,
                         formatCount(static_cast<std::uint64_t>(total.count)), total.ranks,
                         rankLabel(total.most_rank), formatCount(static_cast<std::uint64_t>(total.most)));
    for (const std::string& kind : kinds) out << fmt::format("  {}: {}\n", kind, storage::dropMeaning(kind));
    if (calls_lost > 0)
      out << fmt::format("  {} calls not recorded in total: the totals above miss them\n",
                         formatCount(static_cast<std::uint64_t>(calls_lost)));
    else
      out << fmt::format("  {} events dropped in total; every call is recorded, some with less detail\n",
                         formatCount(static_cast<std::uint64_t>(dropped)));
  }

  writeAgentOverhead(agentStats(runs, ranks), total_ns, out);
}

std::string rankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string text;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += fmt::format("{}{}", text.empty() ? "" : ", ",
                        j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return text;
}

}  // namespace gradscope::cli
