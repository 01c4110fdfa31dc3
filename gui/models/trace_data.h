#pragma once

// What the views load from a trace, as plain structs built on a pool thread from a TraceReader
// (jobs.h threadReader) and handed to the GUI thread whole.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "gradscope/storage/reader.h"
#include "models/timeline_math.h"

namespace gradscope::gui {

// The facts the window shows as soon as a file is open: status bar, timeline rows, filters.
struct TraceInfo {
  std::string path;
  int schema_version = 0;
  std::vector<storage::RunInfo> runs;
  std::vector<storage::RankInfo> ranks;  // ordered by host, then rank (the timeline's row order)
  std::int64_t calls = 0;
  TimeRange extent;
  std::int64_t measurements = 0;
  std::int64_t consensus_rows = 0;
  std::int64_t applied_calls = 0;
  std::vector<storage::DropRecord> drops;  // what the agent could not record, per rank and kind
  bool live = false;                       // a run without an end time: still being written (or it crashed)
};

// The status bar's account of dropped events: a short text ("nothing dropped", "1,204 calls not
// recorded", "35 events dropped") and a tooltip with every rank's kinds and what each means.
struct DropSummary {
  std::int64_t calls_lost = 0;  // drops of kinds that lose calls (storage::dropLosesCalls)
  std::int64_t events = 0;      // every drop
  std::string text;
  std::string details;
};
DropSummary summarizeDrops(const std::vector<storage::DropRecord>& drops);
// Opens and summarises; throws gradscope::Error with the storage library's one-line message.
TraceInfo loadTraceInfo(const storage::TraceReader& reader);

// One frame of the timeline: the aggregated buckets of every rank over the window, and, when the window
// holds few enough calls, the calls themselves.
struct TimelineFrame {
  TimeRange window;
  int columns = 0;
  storage::TimelineSummary summary;
  std::int64_t window_calls = 0;  // calls starting in the window, from the buckets
  bool detailed = false;
  // Per rank id: its calls overlapping the window (times as stored; the widget applies clock offsets).
  std::unordered_map<std::int64_t, std::vector<storage::CallRecord>> calls;
  // Call id → the strategy apply mode ran instead, for the detailed calls (empty unless asked).
  std::unordered_map<std::int64_t, std::string> strategies;
};

// Up to this many calls in the window, the timeline draws calls instead of buckets: painting stays well
// inside a frame (coalesced to at most one bar per pixel column and row) and the query under 50 ms.
inline constexpr std::int64_t kDetailCallLimit = 40'000;

TimelineFrame loadTimelineFrame(const storage::TraceReader& reader, TimeRange window, int columns,
                                bool with_strategies, std::int64_t detail_limit = kDetailCallLimit);

}  // namespace gradscope::gui
