#include "models/trace_data.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "gradscope/common/units.h"
#include "gradscope/storage/drops.h"
#include "models/sql.h"

namespace gradscope::gui {

TraceInfo loadTraceInfo(const storage::TraceReader& reader) {
  TraceInfo info;
  info.path = reader.path();
  info.schema_version = reader.schemaVersion();
  info.runs = reader.runs();
  info.ranks = reader.ranks();
  std::stable_sort(info.ranks.begin(), info.ranks.end(),
                   [](const storage::RankInfo& a, const storage::RankInfo& b) {
                     if (a.host != b.host) return a.host < b.host;
                     if (a.rank != b.rank) return a.rank < b.rank;
                     return a.id < b.id;
                   });
  const storage::TimeExtent extent = reader.timeExtent();
  info.extent = {static_cast<double>(extent.begin_ns), static_cast<double>(extent.end_ns)};
  ReadOnlyDatabase db(reader.path());
  // Every call is in exactly one tile of each level, and tiles commit with their calls: the coarsest
  // level's sum is the call count without the scan of count(*) (a quarter of a second at 10 M calls).
  info.calls = db.scalar(
      "SELECT coalesce(sum(calls), 0) FROM call_tiles WHERE level = (SELECT max(level) FROM call_tiles)");
  info.measurements = db.scalar("SELECT count(*) FROM measurements");
  info.consensus_rows = db.scalar("SELECT count(*) FROM consensus");
  info.applied_calls = db.scalar("SELECT count(*) FROM applied_calls");
  info.drops = reader.drops();
  info.live = std::any_of(info.runs.begin(), info.runs.end(),
                          [](const storage::RunInfo& run) { return !run.end_ns.has_value(); });
  return info;
}

DropSummary summarizeDrops(const std::vector<storage::DropRecord>& drops) {
  DropSummary summary;
  std::map<std::string, std::int64_t> per_kind;
  for (const storage::DropRecord& drop : drops) {
    summary.events += drop.count;
    if (storage::dropLosesCalls(drop.kind)) summary.calls_lost += drop.count;
    per_kind[drop.kind] += drop.count;
  }
  if (summary.calls_lost > 0) {
    summary.text =
        fmt::format("{} call{} not recorded", formatCount(static_cast<std::uint64_t>(summary.calls_lost)),
                    summary.calls_lost == 1 ? "" : "s");
  } else if (summary.events > 0) {
    summary.text = fmt::format("{} event{} dropped", formatCount(static_cast<std::uint64_t>(summary.events)),
                               summary.events == 1 ? "" : "s");
  } else {
    summary.text = "nothing dropped";
    summary.details = "Every intercepted event was recorded.";
    return summary;
  }
  for (const auto& [kind, count] : per_kind)
    summary.details +=
        fmt::format("{}{} × {}: {}", summary.details.empty() ? "" : "\n",
                    formatCount(static_cast<std::uint64_t>(count)), kind, storage::dropMeaning(kind));
  return summary;
}

TimelineFrame loadTimelineFrame(const storage::TraceReader& reader, TimeRange window, int columns,
                                bool with_strategies, std::int64_t detail_limit) {
  TimelineFrame frame;
  frame.window = window;
  frame.columns = std::max(columns, 1);
  const auto [t0, t1] = wholeNanoseconds(window);
  frame.summary = reader.timeline(t0, t1, frame.columns);
  for (const auto& rank : frame.summary.buckets) {
    for (const storage::TimelineBucket& bucket : rank) frame.window_calls += bucket.calls;
  }
  if (frame.window_calls > detail_limit) return frame;
  frame.detailed = true;
  std::int64_t min_id = 0, max_id = -1;
  const auto per_rank_limit = static_cast<std::size_t>(detail_limit) + 1;
  for (const std::int64_t rank_id : frame.summary.rank_ids) {
    std::vector<storage::CallRecord> calls = reader.callsInWindow(rank_id, t0, t1, per_rank_limit);
    for (const storage::CallRecord& call : calls) {
      min_id = max_id < min_id ? call.id : std::min(min_id, call.id);
      max_id = std::max(max_id, call.id);
    }
    frame.calls.emplace(rank_id, std::move(calls));
  }
  if (with_strategies && max_id >= min_id) {
    ReadOnlyDatabase db(reader.path());
    ReadOnlyDatabase::Statement statement =
        db.prepare("SELECT call_id, strategy FROM applied_calls WHERE call_id BETWEEN ? AND ?");
    statement.bind(1, min_id);
    statement.bind(2, max_id);
    while (statement.step()) frame.strategies.emplace(statement.int64(0), statement.text(1));
  }
  return frame;
}

}  // namespace gradscope::gui
