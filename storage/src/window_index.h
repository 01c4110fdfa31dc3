#pragma once

// The tile look-up behind TraceReader::callWindow (gradscope/storage/window.h says what it finds, how
// far back it looks and why). Internal to storage/.

#include <cstdint>
#include <vector>

#include "gradscope/storage/window.h"
#include "sqlite.h"

namespace gradscope::storage::detail {

// What the look-up needs to know of a rank's tiles: its finest level and its longest call.
struct RankTiles {
  std::int64_t rank_id = 0;
  int level = 0;
  std::int64_t longest_ns = 0;
};

// Fills window.ids, one entry per rank of `ranks` with a tile that may hold a call of the window.
void findWindowIds(sql::Database& db, CallWindow& window, const std::vector<RankTiles>& ranks);

}  // namespace gradscope::storage::detail
