#include "gradscope/storage/schema.h"

#include <array>
#include <string>
#include <tuple>

#include "gradscope/common/types.h"
#include "schema_sql.h"
#include "sqlite.h"
#include "tables.h"
#include "tiles.h"

namespace gradscope::storage {
namespace {

// The tables' names, in creation order.
constexpr auto kTableNames =
    std::apply([](const auto*... table) { return std::array{table->name()...}; }, detail::kAllTables);

// The view over calls, as of schema v5 (v3 added applied_calls.strategy, v4 gpu_calls.replay, v5 the
// peer_calls columns); migrate() recreates it once every table is in place. Written as SQL rather than
// generated: it is a query for people (names for codes, a duration), not a copy of the tables' columns.
constexpr std::string_view kCallView = R"sql(
-- Calls with names instead of codes, for people querying with the sqlite3 shell; `strategy` is what
-- apply mode ran instead of the call, NULL when the call ran as the job issued it; `replay` numbers the
-- GPU executions of a graph-captured call; dest and source are the peers of point-to-point calls (ranks in
-- the communicator), peer_max_bytes and peer_min_bytes an all-to-all's spread over its peers.
CREATE VIEW call_view AS
SELECT c.id, r.run_id, r.rank, r.host, m.key AS comm, c.seq, c.step,
       na.name AS api, nd.name AS dtype, no.name AS op, c.count, c.bytes,
       c.enqueue_ns, c.start_ns, c.end_ns, c.end_ns - c.start_ns AS dur_ns,
       g.stream, ng.name AS algo, np.name AS proto, g.channels, a.strategy, g.replay,
       p.dest, p.send_tag, p.source, p.recv_tag, p.recv_bytes, p.peer_max_bytes, p.peer_min_bytes
FROM calls c
JOIN ranks r ON r.id = c.rank_id
LEFT JOIN comms m ON m.id = c.comm_id
LEFT JOIN names na ON na.domain = 'api' AND na.code = c.api
LEFT JOIN names nd ON nd.domain = 'dtype' AND nd.code = c.dtype
LEFT JOIN names no ON no.domain = 'op' AND no.code = c.op
LEFT JOIN gpu_calls g ON g.call_id = c.id
LEFT JOIN names ng ON ng.domain = 'nccl_algo' AND ng.code = g.algo
LEFT JOIN names np ON np.domain = 'nccl_proto' AND np.code = g.proto
LEFT JOIN applied_calls a ON a.call_id = c.id
LEFT JOIN peer_calls p ON p.call_id = c.id;
)sql";

void fillNames(sql::Database& db) {
  db.exec("DELETE FROM names");
  sql::Statement insert(db, detail::kNames.insertSql());
  const auto add = [&](std::string_view domain, int code, std::string_view text) {
    detail::kNames.bind(insert, 1, detail::NameRow{domain, code, text});
    insert.run();
  };
  for (Api api : allApis()) add("api", static_cast<int>(api), name(api));
  for (DType dtype : allDTypes()) add("dtype", static_cast<int>(dtype), name(dtype));
  for (ReduceOp op : allReduceOps()) add("op", static_cast<int>(op), name(op));
  for (Backend backend : allBackends()) add("backend", static_cast<int>(backend), name(backend));
  add("backend", 0, "unknown");
  for (int i = 0; i < kNcclAlgoCount; ++i) add("nccl_algo", i, ncclAlgoName(i));
  for (int i = 0; i < kNcclProtoCount; ++i) add("nccl_proto", i, ncclProtoName(i));
}

void stampVersion(sql::Database& db, int version) {
  db.exec(fmt::format("PRAGMA application_id = {}", kApplicationId));
  db.exec(fmt::format("PRAGMA user_version = {}", version));
}

void migrateV1ToV2(sql::Database& db) {
  // Move the v1 table aside, create the new tables with their declared definitions, copy, drop.
  db.exec("DROP INDEX calls_by_rank_time; ALTER TABLE calls RENAME TO calls_v1;");
  db.exec(detail::kCalls.ddl() + detail::kCallTiles.ddl() + detail::kGpuCalls.ddl());
  db.exec(R"sql(
    INSERT INTO calls (id, rank_id, comm_id, seq, step, api, dtype, op, count, bytes, enqueue_ns, start_ns, end_ns)
      SELECT id, rank_id, comm_id, seq, step, api, dtype, op, count, bytes, enqueue_ns, start_ns, end_ns
      FROM calls_v1 ORDER BY id;
    INSERT INTO gpu_calls (call_id, stream, algo, proto, channels)
      SELECT id, coalesce(stream, 0), nccl_algo, nccl_proto, nccl_channels FROM calls_v1
      WHERE stream IS NOT NULL OR nccl_algo IS NOT NULL OR nccl_proto IS NOT NULL OR nccl_channels IS NOT NULL;
    DROP TABLE calls_v1;
  )sql");
  detail::rebuildTiles(db);
}

void migrateV2ToV3(sql::Database& db) {
  // consensus gains call_id. Rebuilt rather than ALTERed (it holds a few rows per explored call): ALTER
  // TABLE ADD COLUMN would store a definition without the column comments, and a migrated file is to
  // store the documented text like a new one.
  db.exec(R"sql(
    DROP VIEW IF EXISTS call_view;
    DROP INDEX consensus_by_step;
    ALTER TABLE consensus RENAME TO consensus_v2;
  )sql");
  db.exec(detail::kConsensus.ddl() + detail::kAppliedCalls.ddl());
  db.exec(R"sql(
    INSERT INTO consensus (id, rank_id, step, alpha, cosine_to_mean, grad_norm, diversity)
      SELECT id, rank_id, step, alpha, cosine_to_mean, grad_norm, diversity FROM consensus_v2 ORDER BY id;
    DROP TABLE consensus_v2;
  )sql");
}

void migrateV3ToV4(sql::Database& db) {
  // gpu_calls gains replay; rebuilt rather than ALTERed, like consensus in v3, so that the file stores
  // the documented definition. (A v1 file got this layout at v1 -> v2 already.)
  if (db.queryInt("SELECT count(*) FROM pragma_table_info('gpu_calls') WHERE name = 'replay'") > 0) return;
  db.exec(R"sql(
    DROP VIEW IF EXISTS call_view;
    ALTER TABLE gpu_calls RENAME TO gpu_calls_v3;
  )sql");
  db.exec(detail::kGpuCalls.ddl());
  db.exec(R"sql(
    INSERT INTO gpu_calls (call_id, stream, algo, proto, channels)
      SELECT call_id, stream, algo, proto, channels FROM gpu_calls_v3 ORDER BY call_id;
    DROP TABLE gpu_calls_v3;
  )sql");
}

void migrateV4ToV5(sql::Database& db) {
  // peer_calls is new: nothing to copy (older agents recorded no point-to-point calls).
  if (db.queryInt("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'peer_calls'") > 0)
    return;
  db.exec(detail::kPeerCalls.ddl());
}

void migrateV5ToV6(sql::Database& db) {
  // steps is new: an older file's steps are derived again by merge (or on the fly by its readers).
  if (db.queryInt("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'steps'") > 0) return;
  db.exec(detail::kSteps.ddl());
}

void migrateV6ToV7(sql::Database& db) {
  // steps gains basis and idle_ns: its rows are derived, so a v6 file's are dropped with the table and
  // derived again by their readers (storage/step_model.h readOrComputeSteps) or a new merge.
  if (db.queryInt("SELECT count(*) FROM pragma_table_info('steps') WHERE name = 'basis'") == 0) {
    db.exec("DROP TABLE IF EXISTS steps");
    db.exec(detail::kSteps.ddl());
  }
  // gpu_activity is new: older agents sampled no kernels.
  if (db.queryInt("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'gpu_activity'") == 0)
    db.exec(detail::kGpuActivity.ddl());
}

void migrateV7ToV8(sql::Database& db) {
  // exposure is new. The derived steps rows go (readers derive the model again, like v6 -> v7), so that
  // steps rows in a v8 file always come with their exposure, which may rightly be empty (an NCCL job).
  if (db.queryInt("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'exposure'") > 0)
    return;
  db.exec("DELETE FROM steps");
  db.exec(detail::kExposure.ddl());
}

void migrateV8ToV9(sql::Database& db) {
  // step_calls, reduction_sizes and reduction_totals are new. The derived steps and exposure rows go
  // (readers derive the model again, like v7 -> v8), so that steps rows in a v9 file always come with
  // their step_calls; without a reduction_totals row, the reductions are counted from the calls.
  if (db.queryInt("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'step_calls'") > 0)
    return;
  db.exec("DELETE FROM steps; DELETE FROM exposure;");
  db.exec(detail::kStepCalls.ddl() + detail::kReductionSizes.ddl() + detail::kReductionTotals.ddl());
}

}  // namespace

std::span<const std::string_view> tableNames() {
  return kTableNames;
}

std::string schemaSql() {
  std::string sql;
  std::apply([&](const auto*... table) { ((sql += table->ddl()), ...); }, detail::kAllTables);
  return sql + std::string(kCallView);
}

namespace detail {

void createSchema(sql::Database& db) {
  db.exec(schemaSql());
  fillNames(db);
  stampVersion(db, kSchemaVersion);
}

void migrate(sql::Database& db, int from) {
  if (from < kOldestMigratableVersion || from > kSchemaVersion)
    fail("{}: cannot upgrade a trace of schema version {}", db.path(), from);
  // Each step creates the tables it adds or rebuilds from the current declarations (tables.h), so that
  // a migrated file stores the text a new one does; a later step that changes a table must therefore
  // check whether an earlier one already created it in the new layout (as migrateV3ToV4 does).
  // Without legacy_alter_table, SQLite (3.26+) rewrites every reference to a renamed table, so moving
  // a table aside would point measurements.call_id and the like at the copy that is dropped next.
  db.exec("PRAGMA legacy_alter_table = ON");
  if (from <= 1) migrateV1ToV2(db);
  if (from <= 2) migrateV2ToV3(db);
  if (from <= 3) migrateV3ToV4(db);
  if (from <= 4) migrateV4ToV5(db);
  if (from <= 5) migrateV5ToV6(db);
  if (from <= 6) migrateV6ToV7(db);
  if (from <= 7) migrateV7ToV8(db);
  if (from <= 8) migrateV8ToV9(db);
  db.exec("DROP VIEW IF EXISTS call_view");
  db.exec(kCallView);
  db.exec("PRAGMA legacy_alter_table = OFF");
  fillNames(db);
  stampVersion(db, kSchemaVersion);
}

}  // namespace detail
}  // namespace gradscope::storage
