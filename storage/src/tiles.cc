#include "tiles.h"

namespace gradscope::storage::detail {

TileUpserter::TileUpserter(sql::Database& db)
    : statement_(
          db,
          "INSERT INTO call_tiles (level, rank_id, tile, api, calls, busy_ns, bytes, max_ns, first_id, "
          "last_id) "
          "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (level, rank_id, tile, api) DO UPDATE SET "
          "calls = calls + excluded.calls, busy_ns = busy_ns + excluded.busy_ns, "
          "bytes = bytes + excluded.bytes, max_ns = max(max_ns, excluded.max_ns), "
          "first_id = min(first_id, excluded.first_id), last_id = max(last_id, excluded.last_id)",
          true) {}

void TileUpserter::upsert(const std::vector<TileRow>& rows) {
  for (const TileRow& row : rows) {
    statement_.bindFast(1, row.level);
    statement_.bindFast(2, row.rank_id);
    statement_.bindFast(3, row.tile);
    statement_.bindFast(4, row.api);
    statement_.bindFast(5, row.calls);
    statement_.bindFast(6, row.busy_ns);
    statement_.bindFast(7, row.bytes);
    statement_.bindFast(8, row.max_ns);
    statement_.bindFast(9, row.first_id);
    statement_.bindFast(10, row.last_id);
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

void rebuildTiles(sql::Database& db) {
  db.exec("DELETE FROM call_tiles");
  TileAccumulator tiles;
  TileUpserter upserter(db);
  sql::Statement calls(db, "SELECT id, rank_id, api, bytes, start_ns, end_ns FROM calls ORDER BY id");
  std::int64_t since_flush = 0;
  while (calls.step()) {
    CallRecord call;
    call.id = calls.int64(0);
    call.rank_id = calls.int64(1);
    call.api = static_cast<Api>(calls.int32(2));
    call.bytes = calls.int64(3);
    call.start_ns = calls.int64(4);
    call.end_ns = calls.int64(5);
    tiles.add(call, call.id);
    if (++since_flush == (1 << 16)) {
      upserter.upsert(tiles.drain());
      since_flush = 0;
    }
  }
  upserter.upsert(tiles.drain());
  pruneTileLevels(db);
}

}  // namespace gradscope::storage::detail
