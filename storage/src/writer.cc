#include "gradscope/storage/writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "file_util.h"
#include "gradscope/common/error.h"
#include "gradscope/common/version.h"
#include "gradscope/storage/reader.h"
#include "schema_sql.h"
#include "sqlite.h"
#include "tables.h"
#include "tiles.h"

namespace gradscope::storage {
namespace {

using detail::Part;

// Calls are inserted with one statement carrying this many rows: it amortises the statement's
// per-execution overhead, which otherwise costs about a third of the insert time (bench/storage_bench).
constexpr int kCallsPerStatement = 64;

const std::string kDropUpsert =
    detail::kDrops.insertSql() + " ON CONFLICT (rank_id, kind) DO UPDATE SET count = count + excluded.count";

// Inserts a row whose key (its id) SQLite assigns, and returns it: the row's own id, from another file
// when merging, is not kept.
template <typename Table>
std::int64_t insertRow(sql::Database& db, const Table& table, const typename Table::record_type& row) {
  sql::Statement insert(db, table.template insertSql<Part::Values>());
  table.template bind<Part::Values>(insert, 1, row);
  insert.run();
  return sqlite3_last_insert_rowid(db.handle());
}

// created_ns 0 means now.
// Inserts every row of a table whose columns are all written as given (no key to assign).
template <typename Table>
void insertRows(sql::Database& db, const Table& table, std::span<const typename Table::record_type> rows) {
  sql::Statement insert(db, table.insertSql());
  for (const auto& row : rows) {
    table.bind(insert, 1, row);
    insert.run();
  }
}

std::int64_t insertRecommendation(sql::Database& db, const RecommendationRecord& recommendation) {
  RecommendationRecord row = recommendation;
  if (row.created_ns == 0) row.created_ns = unixTimeNs();
  return insertRow(db, detail::kRecommendations, row);
}

}  // namespace

std::int64_t unixTimeNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct TraceWriter::Impl {
  sql::Database db;
  Options options;
  bool in_transaction = false;
  bool finished = false;
  std::int64_t next_call_id = 1;
  std::int64_t calls_written = 0;
  std::int64_t rows_in_transaction = 0;
  detail::TileAccumulator tiles;

  sql::Statement insert_calls_bulk;
  sql::Statement insert_call;
  sql::Statement insert_gpu;
  sql::Statement insert_peer;
  sql::Statement upsert_drop;
  std::unique_ptr<detail::TileUpserter> tile_upserter;
  detail::FileIdentity file;  // of the file create() made, to notice when it is removed

  // After a failed append or commit (disk full, I/O error) the open transaction is rolled back and the
  // writer refuses further writes: its ids and tiles no longer match the file. Everything committed
  // before stays valid.
  std::string failure;
  std::int64_t rolled_back_calls = 0;  // appended in the transaction the failure rolled back

  void poison(const Error& error) {
    if (in_transaction) {
      sqlite3_exec(db.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
      rolled_back_calls += rows_in_transaction;
      calls_written -= rows_in_transaction;
    }
    in_transaction = false;
    rows_in_transaction = 0;
    tiles = detail::TileAccumulator{};
    failure = error.what();
  }

  void begin() {
    if (finished) fail("{}: the trace is already finished; nothing more can be written to it", db.path());
    if (!failure.empty())
      fail("{}: writing stopped after an earlier error ({}); what was committed before it is intact",
           db.path(), failure);
    if (!in_transaction) {
      db.exec("BEGIN IMMEDIATE");
      in_transaction = true;
    }
  }

  void commit() {
    if (!in_transaction) return;
    const int finest = tiles.finestLevel();
    tiles.drain([&](const std::vector<detail::TileRow>& rows) { tile_upserter->upsert(rows); });
    if (tiles.finestLevel() != finest) detail::deleteFinerTiles(db, tiles.finestLevel());
    db.exec("COMMIT");
    in_transaction = false;
    rows_in_transaction = 0;
  }

  void endOpenRuns(std::int64_t end_ns) {
    begin();
    sql::Statement update(db, "UPDATE runs SET end_ns = ? WHERE end_ns IS NULL");
    update.bind(1, end_ns);
    update.run();
  }

  // The connection's settings while the job runs (a new connection after recreate() gets them too).
  void configure() {
    db.exec("PRAGMA journal_mode = WAL");
    // OFF while the job runs: in WAL mode a crash of the job (SIGKILL included) still never corrupts
    // the file or loses a committed transaction, because the data is in the OS's hands at commit;
    // only an OS crash or power loss could, and for a diagnostic trace that is not worth the fsync at
    // every checkpoint (8% of the ingest rate, bench/storage_bench). finish() syncs the final file.
    db.exec("PRAGMA synchronous = OFF");
    // Appends touch only the right edge of each b-tree: 4 MiB of page cache (256 pages) is plenty; a large
    // cache is slower (page recycling), 1.9 M rows/s at 64 MiB vs 2.15 M at 4 MiB on 10 M rows.
    db.exec("PRAGMA cache_size = -4096");
  }

  void prepare() {
    insert_calls_bulk = sql::Statement(db, detail::kCalls.insertSql(kCallsPerStatement), true);
    insert_call = sql::Statement(db, detail::kCalls.insertSql(1), true);
    insert_gpu = sql::Statement(db, detail::kGpuCalls.insertSql(1, "INSERT OR REPLACE"), true);
    insert_peer = sql::Statement(db, detail::kPeerCalls.insertSql(1, "INSERT OR REPLACE"), true);
    upsert_drop = sql::Statement(db, kDropUpsert, true);
    tile_upserter = std::make_unique<detail::TileUpserter>(db);
  }

  void release() {
    insert_calls_bulk = {};
    insert_call = {};
    insert_gpu = {};
    insert_peer = {};
    upsert_drop = {};
    tile_upserter.reset();
  }

  // Binds row `row` of an insert of calls. The key `id` is bound as NULL when it is the next rowid anyway:
  // SQLite then appends without the primary-key probe an explicit id costs (about 5% of the insert time).
  static void bindCall(sql::Statement& statement, int row, const CallRecord& call, std::int64_t id,
                       bool is_next_rowid) {
    const int key = row * detail::kCalls.count() + 1;
    if (is_next_rowid) statement.bindNullFast(key);
    else statement.bindFast(key, id);
    detail::kCalls.bind<Part::Values>(statement, key + 1, call);
  }

  void writeGpuInfo(const CallRecord& call, std::int64_t id) {
    insert_gpu.bind(1, id);
    detail::kGpuCalls.bind<Part::Values>(insert_gpu, 2, call);
    insert_gpu.run();
  }

  void writePeerInfo(const CallRecord& call, std::int64_t id) {
    insert_peer.bind(1, id);
    detail::kPeerCalls.bind<Part::Values>(insert_peer, 2, call);
    insert_peer.run();
  }

  void addDrops(std::int64_t rank_id, const std::string& kind, std::int64_t count) {
    upsert_drop.bind(1, rank_id);
    upsert_drop.bind(2, kind);
    upsert_drop.bind(3, count);
    upsert_drop.run();
  }
};

TraceWriter::TraceWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceWriter::TraceWriter(TraceWriter&&) noexcept = default;
TraceWriter& TraceWriter::operator=(TraceWriter&&) noexcept = default;

TraceWriter::~TraceWriter() {
  if (!impl_ || impl_->finished || !impl_->failure.empty()) return;
  try {
    impl_->commit();
  } catch (const Error&) {
    // Destructors must not throw; what was committed before stays valid.
  }
}

TraceWriter TraceWriter::create(const std::string& path, Options options) {
  detail::createPrivateFile(path);  // 0600, O_EXCL: never clobbers, never world-readable
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    impl->db = sql::Database(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX);
    // 16 KiB pages: a quarter of the WAL frames (one write() each) of 4 KiB pages; measured about 5%
    // faster ingest on 10 M rows, and a window query reads few pages either way.
    impl->db.exec("PRAGMA page_size = 16384");
    impl->configure();
    {
      sql::Transaction transaction(impl->db);
      detail::createSchema(impl->db);
      transaction.commit();
    }
    impl->prepare();
    impl->file = detail::fileIdentity(path);
  } catch (...) {
    impl->db.close();
    detail::removeDatabaseFiles(path);
    throw;
  }
  return TraceWriter(std::move(impl));
}

std::int64_t TraceWriter::addRun(const RunInfo& run) {
  impl_->begin();
  RunInfo row = run;
  if (row.config_json.empty()) row.config_json = "{}";
  if (row.tool_version.empty()) row.tool_version = kVersion;
  return insertRow(impl_->db, detail::kRuns, row);
}

void TraceWriter::setRunEnd(std::int64_t run_id, std::int64_t end_ns) {
  impl_->begin();
  sql::Statement update(impl_->db, "UPDATE runs SET end_ns = ? WHERE id = ?");
  update.bind(1, end_ns);
  update.bind(2, run_id);
  update.run();
}

void TraceWriter::setRunConfig(std::int64_t run_id, const std::string& config_json) {
  impl_->begin();
  sql::Statement update(impl_->db, "UPDATE runs SET config_json = ? WHERE id = ?");
  update.bind(1, config_json.empty() ? std::string("{}") : config_json);
  update.bind(2, run_id);
  update.run();
}

std::int64_t TraceWriter::addRank(const RankInfo& rank) {
  impl_->begin();
  sql::Database& db = impl_->db;
  std::int64_t id = rank.id;
  if (id == 0) {
    sql::Statement taken(db, "SELECT 1 FROM ranks WHERE id = ?");
    taken.bind(1, static_cast<std::int64_t>(rank.rank));
    id = taken.step() ? db.queryInt("SELECT coalesce(max(id), -1) + 1 FROM ranks") : rank.rank;
  }
  sql::Statement insert(db, detail::kRanks.insertSql());
  insert.bind(1, id);
  detail::kRanks.bind<Part::Values>(insert, 2, rank);
  insert.run();
  return id;
}

void TraceWriter::setClockOffset(std::int64_t rank_id, std::int64_t offset_ns) {
  impl_->begin();
  sql::Statement update(impl_->db, "UPDATE ranks SET clock_offset_ns = ? WHERE id = ?");
  update.bind(1, offset_ns);
  update.bind(2, rank_id);
  update.run();
}

std::int64_t TraceWriter::addComm(const CommInfo& comm) {
  impl_->begin();
  return insertRow(impl_->db, detail::kComms, comm);
}

std::int64_t TraceWriter::appendCalls(std::span<const CallRecord> calls) {
  if (calls.empty()) return 0;
  Impl& w = *impl_;
  // Validate ids before anything is written: explicit ids must increase; 0 takes the next one.
  std::int64_t next = w.next_call_id;
  for (const CallRecord& call : calls) {
    if (call.id != 0 && call.id < next)
      fail("{}: call id {} is not above the last id written ({}); ids must increase", w.db.path(), call.id,
           next - 1);
    next = (call.id == 0 ? next : call.id) + 1;
  }
  w.begin();
  try {
    const std::int64_t first_id = calls.front().id == 0 ? w.next_call_id : calls.front().id;
    std::int64_t id = w.next_call_id;
    const auto idOf = [&id](const CallRecord& call) {
      const bool next_rowid = call.id == 0 || call.id == id;
      if (call.id != 0) id = call.id;
      return std::pair{id++, next_rowid};
    };
    std::size_t i = 0;
    for (; i + kCallsPerStatement <= calls.size(); i += kCallsPerStatement) {
      for (int r = 0; r < kCallsPerStatement; ++r) {
        const CallRecord& call = calls[i + static_cast<std::size_t>(r)];
        const auto [call_id, next_rowid] = idOf(call);
        Impl::bindCall(w.insert_calls_bulk, r, call, call_id, next_rowid);
        w.tiles.add(call, call_id);
      }
      w.insert_calls_bulk.step();
      sqlite3_reset(w.insert_calls_bulk.handle());
    }
    for (; i < calls.size(); ++i) {
      const auto [call_id, next_rowid] = idOf(calls[i]);
      Impl::bindCall(w.insert_call, 0, calls[i], call_id, next_rowid);
      w.tiles.add(calls[i], call_id);
      w.insert_call.step();
      sqlite3_reset(w.insert_call.handle());
    }
    // GPU facts and peers go to tables of their own (ids are known now).
    std::int64_t side_id = w.next_call_id;
    for (const CallRecord& call : calls) {
      if (call.id != 0) side_id = call.id;
      if (call.hasGpuInfo()) w.writeGpuInfo(call, side_id);
      if (call.hasPeerInfo()) w.writePeerInfo(call, side_id);
      ++side_id;
    }
    w.next_call_id = next;
    const auto count = static_cast<std::int64_t>(calls.size());
    w.calls_written += count;
    w.rows_in_transaction += count;
    if (w.rows_in_transaction >= w.options.commit_rows) w.commit();
    return first_id;
  } catch (const Error& error) {
    w.poison(error);
    throw;
  }
}

void TraceWriter::setNcclInfo(std::int64_t call_id, int algo, int proto, int channels) {
  impl_->begin();
  // A call not yet in gpu_calls gets a row with these facts alone (stream 0, not a replay).
  sql::Statement upsert(impl_->db, detail::kGpuCalls.insertSql() +
                                       " ON CONFLICT (call_id) DO UPDATE SET algo = excluded.algo, "
                                       "proto = excluded.proto, channels = excluded.channels");
  CallRecord facts;
  facts.nccl_algo = algo;
  facts.nccl_proto = proto;
  facts.nccl_channels = channels;
  upsert.bind(1, call_id);
  detail::kGpuCalls.bind<Part::Values>(upsert, 2, facts);
  upsert.run();
}

std::int64_t TraceWriter::addMeasurement(const Measurement& measurement) {
  impl_->begin();
  return insertRow(impl_->db, detail::kMeasurements, measurement);
}

void TraceWriter::appendConsensus(std::span<const ConsensusRecord> rows) {
  if (rows.empty()) return;
  impl_->begin();
  sql::Statement insert(impl_->db, detail::kConsensus.insertSql<Part::Values>());
  for (const ConsensusRecord& row : rows) {
    detail::kConsensus.bind<Part::Values>(insert, 1, row);
    insert.run();
  }
}

void TraceWriter::appendApplied(std::span<const AppliedCall> rows) {
  if (rows.empty()) return;
  impl_->begin();
  insertRows(impl_->db, detail::kAppliedCalls, rows);
}

void TraceWriter::appendSteps(std::span<const StepRecord> rows) {
  if (rows.empty()) return;
  impl_->begin();
  insertRows(impl_->db, detail::kSteps, rows);
}

void TraceWriter::appendExposure(std::span<const CallExposure> rows) {
  if (rows.empty()) return;
  impl_->begin();
  insertRows(impl_->db, detail::kExposure, rows);
}

void TraceWriter::appendStepCalls(std::span<const StepCallTime> rows) {
  if (rows.empty()) return;
  impl_->begin();
  insertRows(impl_->db, detail::kStepCalls, rows);
}

void TraceWriter::setReductionCounts(std::span<const ReductionCount> sizes, const ReductionTotals& totals) {
  impl_->begin();
  impl_->db.exec("DELETE FROM reduction_sizes; DELETE FROM reduction_totals;");
  insertRows(impl_->db, detail::kReductionSizes, sizes);
  insertRow(impl_->db, detail::kReductionTotals, totals);
}

void TraceWriter::appendGpuActivity(std::span<const GpuActivityRecord> rows) {
  if (rows.empty()) return;
  impl_->begin();
  insertRows(impl_->db, detail::kGpuActivity, rows);
}

std::int64_t TraceWriter::addRecommendation(const RecommendationRecord& recommendation) {
  impl_->begin();
  return insertRecommendation(impl_->db, recommendation);
}

void TraceWriter::addDrops(std::int64_t rank_id, const std::string& kind, std::int64_t count) {
  if (count == 0) return;
  impl_->begin();
  impl_->addDrops(rank_id, kind, count);
}

void TraceWriter::commit() {
  try {
    impl_->commit();
    // The automatic commits while calls are appended keep the tiles' memory; one asked for (a flush of
    // the agent, the end of a merge's copying) frees it.
    impl_->tiles.releaseMemory();
  } catch (const Error& error) {
    impl_->poison(error);
    throw;
  }
}

bool TraceWriter::removed() const {
  const Impl& w = *impl_;
  return !w.finished && w.failure.empty() && detail::fileIdentity(w.db.path()) != w.file;
}

void TraceWriter::recreate() {
  Impl& w = *impl_;
  if (!w.failure.empty())
    fail("{}: writing stopped after an earlier error ({}); nothing to recreate", w.db.path(), w.failure);
  commit();
  const std::string path = w.db.path();
  detail::createPrivateFile(path);
  sql::Database copy;
  try {
    copy = sql::Database(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX);
    // The online backup copies every committed page (the WAL's included) as this connection sees them.
    sqlite3_backup* backup = sqlite3_backup_init(copy.handle(), "main", w.db.handle(), "main");
    if (backup == nullptr) fail("{}: cannot write the trace again: {}", path, sqlite3_errmsg(copy.handle()));
    const int step = sqlite3_backup_step(backup, -1);
    sqlite3_backup_finish(backup);
    if (step != SQLITE_DONE) fail("{}: cannot write the trace again: {}", path, sqlite3_errstr(step));
    copy.exec("PRAGMA journal_mode = WAL");
  } catch (...) {
    copy.close();
    detail::removeDatabaseFiles(path);
    throw;
  }
  // From here on the new file is the trace; the old one (unlinked) is closed.
  w.release();
  w.db = std::move(copy);
  w.configure();
  w.prepare();
  w.file = detail::fileIdentity(path);
}

void TraceWriter::finish(std::int64_t end_ns) {
  impl_->endOpenRuns(end_ns);
  finish();
}

void TraceWriter::finishQuickly(std::int64_t end_ns) {
  Impl& w = *impl_;
  if (w.finished) return;
  w.endOpenRuns(end_ns);
  w.commit();
  w.release();
  w.db.close();  // the last connection: SQLite folds the WAL into the file and removes it
  w.finished = true;
}

void TraceWriter::finish() {
  Impl& w = *impl_;
  if (w.finished) return;
  w.commit();
  {
    sql::Transaction transaction(w.db);
    detail::pruneTileLevels(w.db);
    transaction.commit();
  }
  w.db.exec("PRAGMA optimize");
  // Fold the WAL into the main file so a finished trace is one self-contained file. A reader that
  // still has it open (live view) keeps WAL mode in place; the checkpoint still happens.
  w.release();
  w.db.exec("PRAGMA synchronous = FULL");
  if (sqlite3_exec(w.db.handle(), "PRAGMA journal_mode = DELETE", nullptr, nullptr, nullptr) != SQLITE_OK)
    sqlite3_exec(w.db.handle(), "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
  w.db.close();
  w.finished = true;
}

void TraceWriter::closeAfterFailure(std::int64_t run_id, std::int64_t rank_id,
                                    const std::vector<std::pair<std::string, std::int64_t>>& drops,
                                    const std::string& config_json, std::int64_t end_ns) {
  Impl& w = *impl_;
  if (w.finished) return;
  if (w.failure.empty()) {
    for (const auto& [kind, count] : drops) addDrops(rank_id, kind, count);
    setRunConfig(run_id, config_json);
    finish(end_ns);
    return;
  }
  // Closed whatever happens below: nothing else may be written after a failure.
  struct Close {
    Impl& w;
    ~Close() {
      w.release();
      w.db.close();
      w.finished = true;
    }
  } close{w};
  sql::Transaction transaction(w.db);
  for (const auto& [kind, count] : drops)
    if (count != 0) w.addDrops(rank_id, kind, count);
  sql::Statement config(w.db, "UPDATE runs SET config_json = ? WHERE id = ?");
  config.bind(1, config_json.empty() ? std::string("{}") : config_json);
  config.bind(2, run_id);
  config.run();
  sql::Statement end(w.db, "UPDATE runs SET end_ns = ? WHERE end_ns IS NULL");
  end.bind(1, end_ns);
  end.run();
  transaction.commit();
}

std::int64_t TraceWriter::callsRolledBack() const {
  return impl_->rolled_back_calls;
}

const std::string& TraceWriter::path() const {
  return impl_->db.path();
}
std::int64_t TraceWriter::callCount() const {
  return impl_->calls_written;
}

std::int64_t appendRecommendation(const std::string& path, const RecommendationRecord& recommendation) {
  // Opening a reader first gives the same checks and messages as every other command (and upgrades an
  // older schema), so the insert below only ever meets a valid current trace.
  { const auto reader = TraceReader::open(path); }
  if (::access(path.c_str(), W_OK) != 0)
    fail("{}: cannot store the recommendation: {} (write it elsewhere with -o)", path, errnoMessage(errno));
  sql::Database db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX);
  sqlite3_busy_timeout(db.handle(), 5000);
  sql::Transaction transaction(db);
  const std::int64_t id = insertRecommendation(db, recommendation);
  transaction.commit();
  return id;
}

void setRunConfigValue(const std::string& path, const std::string& key, const std::string& json_value) {
  { const auto reader = TraceReader::open(path); }
  if (::access(path.c_str(), W_OK) != 0)
    fail("{}: cannot store {} in the run: {}", path, key, errnoMessage(errno));
  auto value = nlohmann::json::parse(json_value, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) fail("{}: the {} to store is not JSON", path, key);
  sql::Database db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX);
  sqlite3_busy_timeout(db.handle(), 5000);
  sql::Transaction transaction(db);
  std::vector<std::pair<std::int64_t, std::string>> runs;
  {
    sql::Statement query(db, "SELECT id, config_json FROM runs ORDER BY id");
    while (query.step()) runs.emplace_back(query.int64(0), query.text(1));
  }
  sql::Statement update(db, "UPDATE runs SET config_json = ?1 WHERE id = ?2");
  for (const auto& [id, text] : runs) {
    auto config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) config = nlohmann::json::object();
    config[key] = value;
    update.bind(1, config.dump());
    update.bind(2, id);
    update.run();
  }
  transaction.commit();
}

}  // namespace gradscope::storage
