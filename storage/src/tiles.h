#pragma once

// call_tiles maintenance: per (level, rank, tile, api) aggregates of the calls that start in the tile.
// They serve two readers: the zoomed-out timeline (one tile row instead of thousands of calls) and the
// time index of calls (first_id..last_id of a tile bound the calls to scan for a time window).
//
// The accumulator keeps one open tile per (rank, api, level). Calls arrive nearly in time order, so a
// call almost always lands in the open tile: a shift, a compare and a few adds per level. When a call
// falls outside, the open tile is moved to the pending list; pending rows are upserted at commit, which
// also makes out-of-order arrivals correct (the upsert adds to the row already stored).
//
// A level whose tiles hold fewer than two calls each indexes nothing the calls don't, and pruneTileLevels
// removes it at the end anyway (it removes any level with more rows than a quarter of the calls): the
// accumulator stops keeping such a level once it has seen kDecideAfterCalls calls, so that a merge of
// thousands of ranks (a 4 ms tile per call, nearly) does not write millions of rows only to delete them.
// The writer deletes the rows already stored.

#include <algorithm>
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
  static constexpr std::int64_t kDecideAfterCalls = std::int64_t{1} << 18;

  // `id` is the call's id in the file.
  void add(const CallRecord& call, std::int64_t id) {
    OpenTiles& open = find(call.rank_id, static_cast<int>(call.api));
    const std::int64_t duration = call.end_ns > call.start_ns ? call.end_ns - call.start_ns : 0;
    ++calls_;
    for (int l = first_level_; l < kTileLevelCount; ++l) {
      const std::int64_t tile = call.start_ns >> kTileLevels[l];
      TileRow& row = open.level[l];
      if (row.calls != 0 && row.tile != tile) {
        push(row, l);
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
  // Levels dropped since the last drain leave no row in the list (finestLevel() says which remain).
  template <typename Sink>
  void drain(Sink&& sink) {
    for (OpenTiles& open : open_)
      for (int l = first_level_; l < kTileLevelCount; ++l)
        if (TileRow& row = open.level[l]; row.calls != 0) {
          push(row, l);
          row.calls = 0;
        }
    dropSparseLevels();
    sink(static_cast<const std::vector<TileRow>&>(pending_));
    pending_.clear();
  }
  // The finest level still kept (kTileLevels' value): rows of finer levels are no longer written.
  int finestLevel() const { return kTileLevels[first_level_]; }
  // Frees the list's memory (tens of MiB after a merge's commits), when no rows will follow soon.
  void releaseMemory() { std::vector<TileRow>().swap(pending_); }

 private:
  void push(const TileRow& row, int level_index) {
    pending_.push_back(row);
    ++rows_[level_index];
  }

  // A level with more rows than half the calls (counting a tile drained open and continued twice) is
  // dropped, and every finer one with it; never the coarsest.
  void dropSparseLevels() {
    if (calls_ < kDecideAfterCalls) return;
    const int before = first_level_;
    while (first_level_ < kTileLevelCount - 1 && rows_[first_level_] * 2 > calls_) ++first_level_;
    if (first_level_ == before) return;
    const int finest = kTileLevels[first_level_];
    std::erase_if(pending_, [finest](const TileRow& row) { return row.level < finest; });
  }

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
      return std::hash<std::uint64_t>{}(static_cast<std::uint64_t>(key.rank_id) * 1021 +
                                        static_cast<std::uint64_t>(key.api));
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
  std::int64_t calls_ = 0;                   // calls added
  std::int64_t rows_[kTileLevelCount] = {};  // rows pushed, per level
  int first_level_ = 0;                      // index in kTileLevels of the finest level kept
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

// Removes the rows of the levels finer than `level` (TileAccumulator dropped them).
void deleteFinerTiles(sql::Database& db, int level);

// Rebuilds call_tiles from the calls table (used after migration).
void rebuildTiles(sql::Database& db);

}  // namespace gradscope::storage::detail
