#include "tiles.h"

#include "tables.h"

namespace gradscope::storage::detail {

TileUpserter::TileUpserter(sql::Database& db)
    : statement_(db,
                 kCallTiles.insertSql() +
                     " ON CONFLICT (level, rank_id, tile, api) DO UPDATE SET "
                     "calls = calls + excluded.calls, busy_ns = busy_ns + excluded.busy_ns, "
                     "bytes = bytes + excluded.bytes, max_ns = max(max_ns, excluded.max_ns), "
                     "first_id = min(first_id, excluded.first_id), last_id = max(last_id, excluded.last_id)",
                 true) {}

void TileUpserter::upsert(const std::vector<TileRow>& rows) {
  for (const TileRow& row : rows) {
    kCallTiles.bind(statement_, 1, row);
    statement_.step();
    sqlite3_reset(statement_.handle());
  }
}

void pruneTileLevels(sql::Database& db) {
  const std::int64_t calls = db.queryInt("SELECT count(*) FROM calls");
  const std::int64_t coarsest = db.queryInt("SELECT coalesce(max(level), 0) FROM call_tiles");
  sql::Statement rows(db, "SELECT level, count(*) FROM call_tiles GROUP BY level");
  std::vector<int> useless;
  while (rows.step())
    if (rows.int32(0) != coarsest && rows.int64(1) * 4 > calls) useless.push_back(rows.int32(0));
  sql::Statement remove(db, "DELETE FROM call_tiles WHERE level = ?");
  for (int level : useless) {
    remove.bind(1, level);
    remove.run();
  }
}

void deleteFinerTiles(sql::Database& db, int level) {
  sql::Statement remove(db, "DELETE FROM call_tiles WHERE level < ?");
  remove.bind(1, level);
  remove.run();
}

void rebuildTiles(sql::Database& db) {
  db.exec("DELETE FROM call_tiles");
  TileAccumulator tiles;
  TileUpserter upserter(db);
  sql::Statement calls(db, "SELECT " + kCalls.selectList() + " FROM calls ORDER BY id");
  std::int64_t since_flush = 0;
  CallRecord call;
  while (calls.step()) {
    kCalls.read(calls.handle(), 0, call);
    tiles.add(call, call.id);
    if (++since_flush == (1 << 16)) {
      tiles.drain([&](const std::vector<TileRow>& rows) { upserter.upsert(rows); });
      since_flush = 0;
    }
  }
  tiles.drain([&](const std::vector<TileRow>& rows) { upserter.upsert(rows); });
  deleteFinerTiles(db, tiles.finestLevel());
  pruneTileLevels(db);
}

}  // namespace gradscope::storage::detail
