#include "gradscope/storage/window.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "window_index.h"

namespace gradscope::storage {
namespace {

// t - d for d >= 0, saturating: windows may be given as the whole int64 range.
std::int64_t saturatingSub(std::int64_t t, std::int64_t d) {
  std::int64_t out = 0;
  return __builtin_sub_overflow(t, d, &out) ? std::numeric_limits<std::int64_t>::min() : out;
}

// An integer literal SQLite reads as an integer: "-9223372036854775808" would be the negation of a
// number too large for an integer, a REAL.
std::string sqlInteger(std::int64_t value) {
  if (value == std::numeric_limits<std::int64_t>::min()) return "(-9223372036854775807 - 1)";
  return fmt::format("{}", value);
}

}  // namespace

bool inWindow(std::int64_t start_ns, std::int64_t end_ns, std::int64_t t0_ns, std::int64_t t1_ns) {
  return start_ns < t1_ns && (end_ns > t0_ns || start_ns >= t0_ns);
}

std::string CallWindow::sqlCondition(std::string_view alias) const {
  if (empty()) return "0";
  std::vector<RankIds> sorted = ids;
  std::sort(sorted.begin(), sorted.end(),
            [](const RankIds& a, const RankIds& b) { return a.first_id < b.first_id; });
  std::string any;
  for (std::size_t i = 0; i < sorted.size();) {
    const std::int64_t first = sorted[i].first_id;
    std::int64_t last = sorted[i].last_id;
    for (++i; i < sorted.size() && sorted[i].first_id <= last + 1; ++i)
      last = std::max(last, sorted[i].last_id);
    any += fmt::format("{}{}.id BETWEEN {} AND {}", any.empty() ? "" : " OR ", alias, first, last);
  }
  // The rule of inWindow(); `end > t0 OR start >= t0` is `end > t0` but for calls of zero length.
  std::string condition =
      fmt::format("({0}) AND {1}.start_ns < {2} AND ({1}.end_ns > {3} OR {1}.start_ns >= {3})", any, alias,
                  sqlInteger(t1_ns), sqlInteger(t0_ns));
  if (rank_id) condition += fmt::format(" AND {}.rank_id = {}", alias, *rank_id);
  return condition;
}

namespace detail {

void findWindowIds(sql::Database& db, CallWindow& window, const std::vector<RankTiles>& ranks) {
  window.ids.clear();
  if (window.t1_ns <= window.t0_ns) return;
  // ?3..?4: the tiles from the look-back's start to the window's end. A tile from t0's on holds calls
  // that start in the window (or just before it, in t0's own tile); an earlier one is kept when a call
  // of it may still run at t0: starting at most at tile_start + 2^level - 1 and lasting at most max_ns,
  // it reaches past t0 when tile_start + max_ns > t0 - (2^level - 1) (?6).
  sql::Statement tiles(db,
                       "SELECT min(first_id), max(last_id) FROM call_tiles WHERE level = ?1 AND rank_id = ?2 "
                       "AND tile BETWEEN ?3 AND ?4 AND (tile >= ?5 OR (tile << ?1) + max_ns > ?6)");
  for (const RankTiles& rank : ranks) {
    if (window.rank_id && *window.rank_id != rank.rank_id) continue;
    const std::int64_t from = saturatingSub(window.t0_ns, rank.longest_ns);
    tiles.bind(1, rank.level);
    tiles.bind(2, rank.rank_id);
    tiles.bind(3, from >> rank.level);
    tiles.bind(4, (window.t1_ns - 1) >> rank.level);
    tiles.bind(5, window.t0_ns >> rank.level);
    tiles.bind(6, saturatingSub(window.t0_ns, (std::int64_t{1} << rank.level) - 1));
    if (tiles.step() && !tiles.isNull(0))
      window.ids.push_back({rank.rank_id, tiles.int64(0), tiles.int64(1)});
    tiles.reset();
  }
  std::sort(window.ids.begin(), window.ids.end(),
            [](const CallWindow::RankIds& a, const CallWindow::RankIds& b) { return a.rank_id < b.rank_id; });
}

}  // namespace detail
}  // namespace gradscope::storage
