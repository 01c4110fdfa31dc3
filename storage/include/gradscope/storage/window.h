#pragma once

// Which calls a time window holds: the one rule, and the one way of finding them, for every view that
// lists the calls of a window (the viewer's timeline through TraceReader::callsInWindow, its calls table
// through TraceReader::callWindow and sqlCondition). Two views that ask for the same window see the same
// calls.
//
// The rule. A call is in the window [t0, t1) when it overlaps it: it starts before t1 and still runs
// after t0 (start < t1 and end > t0). A call of zero length is an instant: it is in when t0 <= start < t1.
// So a call that ends exactly at t0 is not in the window, and one that started long before t0 and runs
// into it is.
//
// Finding them. call_tiles is the time index (docs/schema.md): per rank, a tile of the finest level holds
// the range first_id..last_id of the ids of the calls that start in it, and the longest duration among
// them (max_ns). A call in the window either starts in [t0, t1), and so in one of the tiles from t0's to
// (t1 - 1)'s, or started earlier and still runs at t0. The second kind started at most its duration
// before t0, so no earlier than t0 - (the rank's longest call); and its tile's max_ns is at least its
// duration, so the tile's start + 2^level + max_ns reaches past t0. The look-back therefore reads the tiles
// of [t0 - longest, t0) and keeps only those that pass that test: it reaches exactly as far back as the
// earliest tile that may hold a call still running at t0, not one tile (which misses long calls) and not
// the longest call's duration (which scans every call of that span). The id range of a rank is the
// smallest that holds every kept tile's ids; the rule above, applied to the calls in it, removes the rest.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradscope::storage {

// The rule above for one call.
bool inWindow(std::int64_t start_ns, std::int64_t end_ns, std::int64_t t0_ns, std::int64_t t1_ns);

struct CallWindow {
  std::int64_t t0_ns = 0, t1_ns = 0;
  std::optional<std::int64_t> rank_id;  // only this rank's calls (ranks.id); nullopt: every rank

  // Per rank that may have calls in the window, the ids that hold all of them (and others, that the rule
  // removes). Ordered by rank id; a rank with no call near the window has none.
  struct RankIds {
    std::int64_t rank_id = 0;
    std::int64_t first_id = 0, last_id = 0;
    friend bool operator==(const RankIds&, const RankIds&) = default;
  };
  std::vector<RankIds> ids;

  // No call can be in the window (an empty or inverted window, or no tile near it).
  bool empty() const { return ids.empty(); }
  // The SQL condition that a row of `calls` (named `alias` in the query) meets when it is in the window
  // (and of rank_id, when set): the id ranges, neighbouring ones joined, and the rule. Empty windows give
  // a condition no row meets. As one BETWEEN the range is a rowid range scan; SQLite plans an OR of
  // ranges as a multi-index OR that holds every matching rowid in memory (350 MB and 1.5 s for a whole
  // 10-million-call trace), which is why ranges that touch (the ranks of a merged trace) are joined.
  std::string sqlCondition(std::string_view alias) const;
};

}  // namespace gradscope::storage
