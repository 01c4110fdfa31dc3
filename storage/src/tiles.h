#pragma once

// call_tiles maintenance: per (level, rank, tile, api) aggregates of the calls that start in the tile.
// They serve two readers: the zoomed-out timeline (one tile row instead of thousands of calls) and the
// time index of calls (first_id..last_id of a tile bound the calls to scan for a time window).
//
// The accumulator keeps one open tile per (rank, api, level). Calls arrive nearly in time order, so a
// call almost always lands in the open tile: a shift, a compare and a few adds per level. When a call
// falls outside, the open tile is moved to the pending list; pending rows are upserted at commit, which
// also makes out-of-order arrivals correct (the upsert adds to the row already stored).

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "gradscope/storage/records.h"
#include "gradscope/storage/schema.h"
#include "sqlite.h"

namespace gradscope::storage::detail {

inline constexpr int kTileLevelCount = static_cast<int>(std::size(kTileLevels));

struct TileRow {
  int level = 0;
  std::int64_t rank_id = 0;
  std::int64_t tile = 0;
  int api = 0;
  std::int64_t calls = 0;
  std::int64_t busy_ns = 0;
  std::int64_t bytes = 0;
  std::int64_t max_ns = 0;
  std::int64_t first_id = 0;
  std::int64_t last_id = 0;
};

class TileAccumulator {
 public:
  // `id` is the call's id in the file.
  void add(const CallRecord& call, std::int64_t id) {
    OpenTiles& open = find(call.rank_id, static_cast<int>(call.api));
    const std::int64_t duration = call.end_ns > call.start_ns ? call.end_ns - call.start_ns : 0;
    for (int l = 0; l < kTileLevelCount; ++l) {
      const std::int64_t tile = call.start_ns >> kTileLevels[l];
      TileRow& row = open.level[l];
      if (row.calls != 0 && row.tile != tile) {
        pending_.push_back(row);
        row.calls = 0;
      }
      if (row.calls == 0) {
        row = TileRow{kTileLevels[l], call.rank_id, tile, static_cast<int>(call.api), 0, 0, 0, 0, id, id};
      }
      ++row.calls;
      row.busy_ns += duration;
      row.bytes += call.bytes;
      if (duration > row.max_ns) row.max_ns = duration;
      if (id < row.first_id) row.first_id = id;
      if (id > row.last_id) row.last_id = id;
    }
  }

  // Hands every pending and open tile to `sink` (a const std::vector<TileRow>&), then forgets them (the
  // open ones restart empty). The list keeps its memory for the next rows.
  template <typename Sink>
  void drain(Sink&& sink) {
    for (OpenTiles& open : open_)
      for (TileRow& row : open.level)
        if (row.calls != 0) {
          pending_.push_back(row);
          row.calls = 0;
        }
    sink(static_cast<const std::vector<TileRow>&>(pending_));
    pending_.clear();
  }
  // Frees the list's memory (tens of MiB after a merge's commits), when no rows will follow soon.
  void releaseMemory() { std::vector<TileRow>().swap(pending_); }

 private:
  struct OpenTiles {
    std::int64_t rank_id;
    int api;
    TileRow level[kTileLevelCount];
  };
  struct Key {
    std::int64_t rank_id;
    int api;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const {
      return std::hash<std::int64_t>{}(key.rank_id * 1021 + key.api);
    }
  };

  // The last tile set used, else a hash lookup: a merge keeps the tiles of every rank it wrote open, and a
  // scan of them at each change of API took time in proportion to the number of ranks.
  OpenTiles& find(std::int64_t rank_id, int api) {
    if (last_ < open_.size() && open_[last_].rank_id == rank_id && open_[last_].api == api)
      return open_[last_];
    const auto [it, added] = index_.try_emplace(Key{rank_id, api}, open_.size());
    if (added) open_.push_back(OpenTiles{rank_id, api, {}});
    last_ = it->second;
    return open_[last_];
  }

  std::vector<OpenTiles> open_;
  std::unordered_map<Key, std::size_t, KeyHash> index_;  // (rank, api) -> its entry in open_
  std::size_t last_ = 0;
  std::vector<TileRow> pending_;
};

// Adds rows to call_tiles (summing into rows already there).
class TileUpserter {
 public:
  explicit TileUpserter(sql::Database& db);
  void upsert(const std::vector<TileRow>& rows);

 private:
  sql::Statement statement_;
};

// Removes levels that index nothing the raw calls don't: a level with more than a quarter as many rows
// as there are calls. The coarsest level is always kept (it is the time index of last resort).
void pruneTileLevels(sql::Database& db);

// Rebuilds call_tiles from the calls table (used after migration).
void rebuildTiles(sql::Database& db);

}  // namespace gradscope::storage::detail
