#include "gradscope/storage/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <queue>

#include "file_util.h"
#include "gradscope/common/error.h"
#include "gradscope/common/units.h"
#include "gradscope/storage/call_columns.h"
#include "gradscope/storage/schema.h"
#include "schema_sql.h"
#include "sqlite.h"
#include "tables.h"
#include "window_index.h"

namespace gradscope::storage {
namespace {

// All rows of a table, decoded, in the order `order_by` gives; `expected` rows are reserved.
template <typename Table>
std::vector<typename Table::record_type> readAll(sql::Database& db, const Table& table,
                                                 std::string_view order_by, std::size_t expected = 0) {
  std::vector<typename Table::record_type> rows;
  rows.reserve(expected);
  sql::Statement query(
      db, fmt::format("SELECT {} FROM {} ORDER BY {}", table.selectList(), table.name(), order_by));
  while (query.step()) table.read(query.handle(), 0, rows.emplace_back());
  return rows;
}

// t - d without overflow: windows may be given as the whole int64 range.
std::int64_t saturatingSub(std::int64_t t, std::int64_t d) {
  std::int64_t out = 0;
  return __builtin_sub_overflow(t, d, &out) ? std::numeric_limits<std::int64_t>::min() : out;
}

std::uint32_t bigEndian32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

// Checks what can be checked before SQLite sees the file, so that the common mistakes get precise
// messages: missing, a directory, empty, not SQLite, shorter than its header says (truncated copy).
// A writer killed inside a rollback-journal transaction leaves a hot journal (<file>-journal): the file is
// consistent only once SQLite has rolled it back, which takes a read-write connection. It happens when a
// launcher's SIGKILL follows its SIGTERM within milliseconds, while the agent's finish() switches the file
// out of WAL mode. Rolled back here, so that every command (and the merge of `gradscope run`) reads such a
// file as the complete trace it is; without write access the error says what to do.
void rollBackHotJournal(const std::string& path) {
  struct stat journal {};
  if (::stat((path + "-journal").c_str(), &journal) != 0 || journal.st_size == 0) return;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // checkFile says why
  char magic[16] = {};
  const ssize_t got = ::read(fd, magic, sizeof magic);
  ::close(fd);
  if (got != sizeof magic || std::memcmp(magic, "SQLite format 3", sizeof magic) != 0) return;
  if (::access(path.c_str(), W_OK) != 0 || ::access(detail::parentDirectory(path).c_str(), W_OK) != 0)
    fail(
        "{}: its writer was killed in the middle of an update, and {}-journal must be rolled back before it "
        "can be read, which needs write access; copy both files to a writable directory and open the copy",
        path, path);
  try {
    sql::Database db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX);
    sqlite3_busy_timeout(db.handle(), 5000);
    db.queryInt("SELECT count(*) FROM sqlite_master");  // the first read rolls the journal back
  } catch (const Error& error) {
    fail("{}: its writer was killed in the middle of an update, and rolling back {}-journal failed: {}", path,
         path, error.what());
  }
}

void checkFile(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) fail("{}: no such file", path);
    fail("{}: cannot read: {}", path, errnoMessage(errno));
  }
  if (S_ISDIR(info.st_mode)) fail("{}: is a directory; name a trace file (.db)", path);
  if (info.st_size == 0) fail("{}: empty file, not a gradscope trace", path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot read: {}", path, errnoMessage(errno));
  unsigned char header[100] = {};
  const ssize_t got = ::read(fd, header, sizeof header);
  ::close(fd);
  if (got < 16 || std::memcmp(header, "SQLite format 3", 16) != 0)
    fail("{}: not a gradscope trace (not an SQLite database)", path);
  if (got < 100) fail("{}: truncated trace ({} bytes, shorter than an SQLite header)", path, got);
  std::uint32_t page_size = (std::uint32_t{header[16]} << 8) | header[17];
  if (page_size == 1) page_size = 65536;
  const std::uint32_t pages = bigEndian32(header + 28);
  const bool header_size_valid = bigEndian32(header + 24) == bigEndian32(header + 92);
  struct stat wal {};
  const bool has_wal = ::stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0;
  // File format version bytes 18/19 are 2 in WAL mode; a live trace copied without its -wal file
  // holds little more than the header page.
  if (header[18] == 2 && !has_wal && static_cast<std::int64_t>(info.st_size) <= page_size)
    fail(
        "{}: incomplete copy of a trace that was still being written: {}-wal is missing; copy it along "
        "with the trace (or wait for the job to finish)",
        path, path);
  const auto expected = static_cast<std::int64_t>(pages) * page_size;
  if (header_size_valid && !has_wal && pages > 0 && info.st_size < expected)
    fail("{}: truncated trace: the header describes {} bytes but the file has {}; copy it again", path,
         expected, static_cast<std::int64_t>(info.st_size));
}

}  // namespace

struct TraceReader::Impl {
  mutable sql::Database db;
  int version = 0;

  bool hasLevel(int level, std::int64_t rank_id) const {
    sql::Statement probe(db, "SELECT 1 FROM call_tiles WHERE level = ? AND rank_id = ? LIMIT 1");
    probe.bind(1, level);
    probe.bind(2, rank_id);
    return probe.step();
  }

  // Finest / coarsest tile level present for a rank, or -1 (a few primary-key probes).
  int finestLevel(std::int64_t rank_id) const {
    for (int level : kTileLevels)
      if (hasLevel(level, rank_id)) return level;
    return -1;
  }
  int coarsestLevel(std::int64_t rank_id) const {
    for (auto it = std::rbegin(kTileLevels); it != std::rend(kTileLevels); ++it)
      if (hasLevel(*it, rank_id)) return *it;
    return -1;
  }

  // Longest call of a rank, from the coarsest level (fewest rows).
  std::int64_t maxDuration(std::int64_t rank_id) const {
    sql::Statement query(db,
                         "SELECT coalesce(max(max_ns), 0) FROM call_tiles WHERE level = ? AND rank_id = ?");
    query.bind(1, coarsestLevel(rank_id));
    query.bind(2, rank_id);
    return query.step() ? query.int64(0) : 0;
  }

  struct IdRange {
    std::int64_t first = 0, last = -1;
    bool empty() const { return last < first; }
  };

  IdRange idRange(int level, std::int64_t rank_id, std::int64_t from_ns, std::int64_t to_ns) const {
    sql::Statement query(
        db,
        "SELECT min(first_id), max(last_id) FROM call_tiles WHERE level = ? AND rank_id = ? AND "
        "tile BETWEEN ? AND ?");
    query.bind(1, level);
    query.bind(2, rank_id);
    query.bind(3, from_ns >> level);
    query.bind(4, to_ns >> level);
    if (!query.step() || query.isNull(0)) return {};
    return {query.int64(0), query.int64(1)};
  }

  std::vector<std::int64_t> rankIds() const {
    std::vector<std::int64_t> ids;
    sql::Statement query(db,
                         "SELECT DISTINCT rank_id FROM call_tiles WHERE level = (SELECT max(level) FROM "
                         "call_tiles) UNION SELECT id FROM ranks ORDER BY 1");
    while (query.step()) ids.push_back(query.int64(0));
    return ids;
  }
};

TraceReader::TraceReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceReader::TraceReader(TraceReader&&) noexcept = default;
TraceReader& TraceReader::operator=(TraceReader&&) noexcept = default;
TraceReader::~TraceReader() = default;

TraceReader TraceReader::open(const std::string& path) {
  rollBackHotJournal(path);
  checkFile(path);
  auto impl = std::make_unique<Impl>();
  impl->db = sql::Database(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX);
  sqlite3_busy_timeout(impl->db.handle(), 5000);
  const auto application_id = static_cast<std::int32_t>(impl->db.queryInt("PRAGMA application_id"));
  if (application_id != kApplicationId) {
    fail("{}: not a gradscope trace (an SQLite database of another application)", path);
  }
  int version = static_cast<int>(impl->db.queryInt("PRAGMA user_version"));
  if (version > kSchemaVersion)
    fail("{}: written by a newer gradscope (schema v{}; this build reads up to v{}); upgrade gradscope", path,
         version, kSchemaVersion);
  if (version < kOldestMigratableVersion)
    fail("{}: incomplete gradscope trace (schema version {}); it was not fully created", path, version);
  if (version < kSchemaVersion) {
    impl->db.close();
    if (::access(path.c_str(), W_OK) != 0)
      fail(
          "{}: uses schema v{} of an older gradscope and upgrading it needs write access; copy it somewhere "
          "writable",
          path, version);
    sql::Database writable(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX);
    sqlite3_busy_timeout(writable.handle(), 5000);
    sql::Transaction transaction(writable);
    const int current = static_cast<int>(writable.queryInt("PRAGMA user_version"));
    if (current < kSchemaVersion) detail::migrate(writable, current);
    transaction.commit();
    writable.close();
    impl->db = sql::Database(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX);
    sqlite3_busy_timeout(impl->db.handle(), 5000);
    version = kSchemaVersion;
  }
  impl->version = version;
  // Touch every table once so a damaged schema page fails here, not in the middle of a report.
  for (std::string_view table : tableNames())
    impl->db.queryInt(fmt::format("SELECT 1 FROM {} LIMIT 1", table));
  return TraceReader(std::move(impl));
}

const std::string& TraceReader::path() const {
  return impl_->db.path();
}
int TraceReader::schemaVersion() const {
  return impl_->version;
}

std::vector<RunInfo> TraceReader::runs() const {
  return readAll(impl_->db, detail::kRuns, "id");
}

std::vector<RankInfo> TraceReader::ranks() const {
  return readAll(impl_->db, detail::kRanks, "id");
}

std::vector<CommInfo> TraceReader::comms() const {
  return readAll(impl_->db, detail::kComms, "id");
}

std::int64_t TraceReader::callCount() const {
  return impl_->db.queryInt("SELECT count(*) FROM calls");
}

CallWindow TraceReader::callWindow(std::int64_t t0_ns, std::int64_t t1_ns,
                                   std::optional<std::int64_t> rank_id) const {
  CallWindow window{t0_ns, t1_ns, rank_id, {}};
  std::vector<detail::RankTiles> ranks;
  for (const std::int64_t id : rank_id ? std::vector<std::int64_t>{*rank_id} : impl_->rankIds()) {
    const int level = impl_->finestLevel(id);
    if (level >= 0) ranks.push_back({id, level, impl_->maxDuration(id)});
  }
  detail::findWindowIds(impl_->db, window, ranks);
  return window;
}

std::vector<CallRecord> TraceReader::callsInWindow(std::int64_t rank_id, std::int64_t t0_ns,
                                                   std::int64_t t1_ns, std::size_t limit) const {
  std::vector<CallRecord> calls;
  const CallWindow window = callWindow(t0_ns, t1_ns, rank_id);
  if (window.empty()) return calls;
  sql::Statement query(impl_->db, fmt::format("SELECT {} FROM {} WHERE {} ORDER BY c.start_ns, c.id LIMIT ?",
                                              callColumns(), kCallsFrom, window.sqlCondition("c")));
  query.bind(1, limit == 0 ? std::int64_t{-1} : static_cast<std::int64_t>(limit));
  while (query.step()) calls.push_back(readCall(query.handle()));
  return calls;
}

TimelineSummary TraceReader::timeline(std::int64_t t0_ns, std::int64_t t1_ns, int columns) const {
  TimelineSummary summary;
  summary.t0_ns = t0_ns;
  summary.t1_ns = t1_ns;
  summary.columns = columns;
  if (columns <= 0 || t1_ns <= t0_ns) return summary;
  const double width = (static_cast<double>(t1_ns) - static_cast<double>(t0_ns)) / columns;
  summary.rank_ids = impl_->rankIds();
  summary.buckets.assign(summary.rank_ids.size(),
                         std::vector<TimelineBucket>(static_cast<std::size_t>(columns)));

  // Coarsest level whose tile still fits in one column.
  int wanted = -1;
  for (int level : kTileLevels)
    if (std::ldexp(1.0, level) <= width) wanted = level;

  constexpr int kApiSlots = 80;  // Api codes are below 80 (common/types.h)
  std::vector<std::array<std::int64_t, kApiSlots>> api_busy(static_cast<std::size_t>(columns));

  // Adds `busy` starting at time `at`, spread forward over the columns it covers and clipped to the
  // window, so a long call shows as long; counts the call(s) in the column where they start when
  // `counted` (calls that started before the window add only their busy time inside it).
  const auto add = [&](std::vector<TimelineBucket>& row, std::int64_t at, bool counted, std::int64_t calls,
                       std::int64_t busy, std::int64_t bytes, std::int64_t max_ns, int api) {
    double position = (static_cast<double>(at) - static_cast<double>(t0_ns)) / width;
    if (position >= columns) return;
    double remaining = static_cast<double>(busy);
    if (position < 0) {
      remaining += position * width;  // the part before the window is not shown
      position = 0;
      if (remaining <= 0) return;
    }
    auto column = static_cast<std::size_t>(position);
    if (counted) {
      TimelineBucket& first = row[column];
      first.calls += calls;
      first.bytes += bytes;
      first.max_ns = std::max(first.max_ns, max_ns);
    }
    double offset = (position - static_cast<double>(column)) * width;
    while (column < row.size()) {
      const double room = width - offset;
      const double part = std::max(0.0, std::min(room, remaining));
      row[column].busy_ns += static_cast<std::int64_t>(part);
      if (api >= 0 && api < kApiSlots)
        api_busy[column][static_cast<std::size_t>(api)] += static_cast<std::int64_t>(part) + 1;
      remaining -= part;
      if (remaining <= 0) break;
      ++column;
      offset = 0;
    }
  };

  sql::Statement tiles(impl_->db,
                       "SELECT tile, api, calls, busy_ns, bytes, max_ns FROM call_tiles WHERE level = ? AND "
                       "rank_id = ? AND tile BETWEEN ? AND ?");
  for (std::size_t r = 0; r < summary.rank_ids.size(); ++r) {
    const std::int64_t rank_id = summary.rank_ids[r];
    std::vector<TimelineBucket>& row = summary.buckets[r];
    for (auto& slots : api_busy) slots.fill(0);
    // Raw calls when the window holds few of them (exact, and cheap); otherwise the coarsest level whose
    // tile fits in a column, or the finest level there is when even that is wider than a column.
    const int finest = impl_->finestLevel(rank_id);
    bool use_tiles = false;
    int level = -1;
    if (finest >= 0) {
      const Impl::IdRange range = impl_->idRange(finest, rank_id, t0_ns, t1_ns - 1);
      use_tiles = !range.empty() && range.last - range.first > 16 * static_cast<std::int64_t>(columns);
      level = finest;
      for (int candidate : kTileLevels)
        if (candidate > finest && candidate <= wanted && impl_->hasLevel(candidate, rank_id))
          level = candidate;
    }
    if (use_tiles) {
      summary.level = level;
      const std::int64_t from = saturatingSub(t0_ns, impl_->maxDuration(rank_id));
      tiles.bind(1, level);
      tiles.bind(2, rank_id);
      tiles.bind(3, from >> level);
      tiles.bind(4, (t1_ns - 1) >> level);
      while (tiles.step()) {
        const std::int64_t tile_start = tiles.int64(0) << level;
        // A tile that straddles t0 is counted whole: tiles are the resolution of this path.
        const bool counted = tile_start + (std::int64_t{1} << level) > t0_ns;
        add(row, std::max(tile_start, from), counted, tiles.int64(2), tiles.int64(3), tiles.int64(4),
            tiles.int64(5), tiles.int32(1));
      }
      tiles.reset();
    } else {
      for (const CallRecord& call : callsInWindow(rank_id, t0_ns, t1_ns)) {
        add(row, call.start_ns, call.start_ns >= t0_ns, 1, call.end_ns - call.start_ns, call.bytes,
            call.end_ns - call.start_ns, static_cast<int>(call.api));
      }
    }
    for (std::size_t c = 0; c < row.size(); ++c) {
      const auto& slots = api_busy[c];
      const auto best = std::max_element(slots.begin(), slots.end());
      if (*best > 0) row[c].dominant_api = static_cast<Api>(best - slots.begin());
    }
  }
  return summary;
}

TimeExtent TraceReader::timeExtent() const {
  TimeExtent extent;
  bool any = false;
  for (std::int64_t rank_id : impl_->rankIds()) {
    const int level = impl_->finestLevel(rank_id);
    if (level < 0) continue;
    sql::Statement bounds(impl_->db,
                          "SELECT min(tile), max(tile) FROM call_tiles WHERE level = ? AND rank_id = ?");
    bounds.bind(1, level);
    bounds.bind(2, rank_id);
    if (!bounds.step() || bounds.isNull(0)) continue;
    const std::int64_t first_tile = bounds.int64(0), last_tile = bounds.int64(1);
    sql::Statement first(impl_->db,
                         "SELECT min(start_ns) FROM calls WHERE id BETWEEN ? AND ? AND rank_id = ?");
    const Impl::IdRange head = impl_->idRange(level, rank_id, first_tile << level, first_tile << level);
    first.bind(1, head.first);
    first.bind(2, head.last);
    first.bind(3, rank_id);
    first.step();
    const std::int64_t begin = first.int64(0);
    const std::int64_t from = (last_tile << level) - impl_->maxDuration(rank_id);
    const Impl::IdRange tail = impl_->idRange(level, rank_id, from, last_tile << level);
    sql::Statement last(impl_->db, "SELECT max(end_ns) FROM calls WHERE id BETWEEN ? AND ? AND rank_id = ?");
    last.bind(1, tail.first);
    last.bind(2, tail.last);
    last.bind(3, rank_id);
    last.step();
    const std::int64_t end = last.int64(0);
    extent.begin_ns = any ? std::min(extent.begin_ns, begin) : begin;
    extent.end_ns = any ? std::max(extent.end_ns, end) : end;
    any = true;
  }
  return extent;
}

namespace {

// The length of the union of a rank's call intervals, in bounded memory. Calls arrive in file order,
// which is completion order per thread; a nonblocking call arrives after the calls that ran while it
// was in flight and covers them. The disjoint intervals seen so far are kept sorted; past kMaxOpen the
// oldest are settled into the sum, and a later call reaching back before the settled horizon is clipped
// to it (exact unless a call overlaps more than kMaxOpen disjoint calls before it: then slightly low).
class IntervalUnion {
 public:
  void add(std::int64_t start, std::int64_t end) {
    start = std::max(start, horizon_);
    if (end <= start) return;
    // The first interval ending at or after `start`; merge every one that begins at or before `end`.
    auto first = std::lower_bound(open_.begin(), open_.end(), start,
                                  [](const Interval& interval, std::int64_t t) { return interval.end < t; });
    auto last = first;
    while (last != open_.end() && last->start <= end) {
      start = std::min(start, last->start);
      end = std::max(end, last->end);
      ++last;
    }
    first = open_.erase(first, last);
    open_.insert(first, {start, end});
    if (open_.size() > kMaxOpen) {
      const std::size_t settle = open_.size() / 2;
      for (std::size_t i = 0; i < settle; ++i) settled_ += open_[i].end - open_[i].start;
      horizon_ = open_[settle - 1].end;
      open_.erase(open_.begin(), open_.begin() + static_cast<std::ptrdiff_t>(settle));
    }
  }
  std::int64_t length() const {
    std::int64_t total = settled_;
    for (const Interval& interval : open_) total += interval.end - interval.start;
    return total;
  }

 private:
  struct Interval {
    std::int64_t start, end;
  };
  static constexpr std::size_t kMaxOpen = 256;
  std::vector<Interval> open_;
  std::int64_t settled_ = 0;
  std::int64_t horizon_ = std::numeric_limits<std::int64_t>::min();
};

}  // namespace

TraceReader::CallStatistics TraceReader::callStatistics(std::size_t top) const {
  CallStatistics stats;
  std::map<std::pair<int, int>, SizeBucket> sizes;
  std::map<std::int64_t, RankSummary> ranks;
  std::map<std::int64_t, IntervalUnion> busy;
  // Longest first; among equal durations, the earlier call first (deterministic output).
  const auto longer = [](const CallRecord& a, const CallRecord& b) {
    const std::int64_t da = a.end_ns - a.start_ns, db = b.end_ns - b.start_ns;
    return da != db ? da > db : a.id < b.id;
  };
  // Min-heap on duration holding the `top` longest calls seen so far. The scan reads the calls table
  // alone (forEachCallWithoutGpuFacts); the calls kept are read again whole at the end.
  std::priority_queue<CallRecord, std::vector<CallRecord>, decltype(longer)> longest(longer);
  forEachCallWithoutGpuFacts([&](const CallRecord& call) {
    const std::int64_t duration = call.end_ns - call.start_ns;
    const int bucket = sizeClass(call.bytes);
    SizeBucket& size = sizes[{static_cast<int>(call.api), bucket}];
    if (size.calls == 0) {
      size.api = call.api;
      size.log2_bytes = bucket;
      size.min_ns = duration;
    }
    ++size.calls;
    size.total_ns += duration;
    size.bytes += call.bytes;
    size.min_ns = std::min(size.min_ns, duration);
    size.max_ns = std::max(size.max_ns, duration);
    RankSummary& rank = ranks[call.rank_id];
    if (rank.calls == 0) {
      rank.rank_id = call.rank_id;
      rank.first_ns = call.start_ns;
      rank.last_ns = call.end_ns;
    }
    ++rank.calls;
    rank.total_ns += duration;
    rank.first_ns = std::min(rank.first_ns, call.start_ns);
    rank.last_ns = std::max(rank.last_ns, call.end_ns);
    busy[call.rank_id].add(call.start_ns, call.end_ns);
    if (top > 0) {
      if (longest.size() < top) longest.push(call);
      else if (longer(call, longest.top())) {
        longest.pop();
        longest.push(call);
      }
    }
    return true;
  });
  for (auto& [key, size] : sizes) stats.sizes.push_back(size);
  for (const RankInfo& info : this->ranks()) {
    RankSummary& rank = ranks[info.id];
    rank.rank_id = info.id;
    rank.rank = info.rank;
    rank.host = info.host;
  }
  for (auto& [id, rank] : ranks) {
    if (const auto it = busy.find(id); it != busy.end()) rank.busy_ns = it->second.length();
    stats.ranks.push_back(rank);
  }
  sql::Statement whole(impl_->db, fmt::format("SELECT {} FROM {} WHERE c.id = ?", callColumns(), kCallsFrom));
  while (!longest.empty()) {
    whole.bind(1, longest.top().id);
    if (!whole.step()) fail("{}: call {} vanished while the trace was read", path(), longest.top().id);
    stats.longest.push_back(readCall(whole.handle()));
    whole.reset();
    longest.pop();
  }
  std::reverse(stats.longest.begin(), stats.longest.end());
  return stats;
}

std::vector<TraceReader::Lateness> TraceReader::lateness() const {
  // Communicators are matched across ranks by key (and run): map each comm id to a dense key index.
  std::unordered_map<std::int64_t, std::int64_t> comm_key;
  {
    std::map<std::pair<std::int64_t, std::string>, std::int64_t> keys;
    sql::Statement query(impl_->db,
                         "SELECT c.id, r.run_id, c.key FROM comms c JOIN ranks r ON r.id = c.rank_id");
    while (query.step()) {
      const auto [it, inserted] =
          keys.try_emplace({query.int64(1), query.text(2)}, static_cast<std::int64_t>(keys.size()));
      comm_key[query.int64(0)] = it->second;
    }
  }
  struct Earliest {
    std::int64_t start;
    std::int32_t ranks;
  };
  // Starts are compared on rank 0's clock.
  std::unordered_map<std::int64_t, std::int64_t> offset;
  for (const RankInfo& rank : ranks()) offset[rank.id] = rank.clock_offset_ns;
  const auto alignedStart = [&offset](const CallRecord& call) {
    const auto it = offset.find(call.rank_id);
    return call.start_ns + (it == offset.end() ? 0 : it->second);
  };
  // One collective: (communicator, seq) and, for the replays of a graph-captured call, which replay.
  using Key = std::pair<std::uint64_t, std::uint64_t>;
  struct KeyHash {
    std::size_t operator()(const Key& key) const {
      return std::hash<std::uint64_t>()(key.first * 31 + key.second);
    }
  };
  std::unordered_map<Key, Earliest, KeyHash> earliest;
  const auto keyOf = [&](const CallRecord& call) -> std::optional<Key> {
    // Calls numbered apart (point-to-point, NCCL group launches) are not equal across ranks: no match.
    if (numberedApart(call.api)) return std::nullopt;
    const auto it = comm_key.find(call.comm_id);
    if (it == comm_key.end()) return std::nullopt;
    return Key{(static_cast<std::uint64_t>(it->second) << 40) ^ static_cast<std::uint64_t>(call.seq),
               static_cast<std::uint64_t>(call.graph_replay)};
  };
  // Neither scan needs the GPU or peer facts: the calls table alone (and the replays beside it) reads
  // several times faster than its joins.
  forEachCallWithoutGpuFacts([&](const CallRecord& call) {
    if (const auto key = keyOf(call)) {
      const std::int64_t start = alignedStart(call);
      auto [it, inserted] = earliest.try_emplace(*key, Earliest{start, 0});
      it->second.start = std::min(it->second.start, start);
      ++it->second.ranks;
    }
    return true;
  });
  std::map<std::int64_t, Lateness> per_rank;
  forEachCallWithoutGpuFacts([&](const CallRecord& call) {
    const auto key = keyOf(call);
    if (!key) return true;
    const Earliest& first = earliest.at(*key);
    if (first.ranks < 2) return true;
    Lateness& late = per_rank[call.rank_id];
    late.rank_id = call.rank_id;
    const std::int64_t behind = alignedStart(call) - first.start;
    late.mean_ns += static_cast<double>(behind);
    late.max_ns = std::max(late.max_ns, behind);
    ++late.matched;
    return true;
  });
  std::vector<Lateness> out;
  for (auto& [id, late] : per_rank) {
    if (late.matched > 0) late.mean_ns /= static_cast<double>(late.matched);
    out.push_back(late);
  }
  return out;
}

std::vector<Measurement> TraceReader::measurements(const std::string& strategy) const {
  std::vector<Measurement> out;
  sql::Statement query(impl_->db, fmt::format("SELECT {} FROM measurements WHERE ?1 = '' OR strategy = ?1 "
                                              "ORDER BY strategy, dtype, bytes, id",
                                              detail::kMeasurements.selectList()));
  query.bind(1, strategy);
  while (query.step()) detail::kMeasurements.read(query.handle(), 0, out.emplace_back());
  return out;
}

std::vector<TraceReader::MeasurementOrigin> TraceReader::measurementOrigins() const {
  std::vector<MeasurementOrigin> out;
  sql::Statement query(impl_->db,
                       "SELECT m.id, k.key, c.seq FROM measurements m JOIN calls c ON c.id = m.call_id "
                       "JOIN comms k ON k.id = c.comm_id ORDER BY m.id");
  while (query.step()) out.push_back({query.int64(0), query.text(1), query.int64(2)});
  return out;
}

std::vector<ConsensusRecord> TraceReader::consensus() const {
  return readAll(impl_->db, detail::kConsensus, "step, rank_id, id");
}

std::vector<StepRecord> TraceReader::steps() const {
  // Sized first: a rank x step table of a large job is tens of MB, and growing it would overshoot by up to a
  // half.
  return readAll(impl_->db, detail::kSteps, "rank_id, step",
                 static_cast<std::size_t>(impl_->db.queryInt("SELECT count(*) FROM steps")));
}

std::vector<CallExposure> TraceReader::exposure() const {
  return readAll(impl_->db, detail::kExposure, "api, dtype, bytes");
}

std::vector<StepCallTime> TraceReader::stepCalls() const {
  return readAll(impl_->db, detail::kStepCalls, "step, api, size_class",
                 static_cast<std::size_t>(impl_->db.queryInt("SELECT count(*) FROM step_calls")));
}

std::vector<GpuActivityRecord> TraceReader::gpuActivity() const {
  return readAll(impl_->db, detail::kGpuActivity, "rank_id, start_ns, kind");
}

std::vector<AppliedCall> TraceReader::appliedCalls() const {
  return readAll(impl_->db, detail::kAppliedCalls, "call_id");
}

std::vector<TraceReader::ReplaySummary> TraceReader::replaySummary() const {
  std::vector<ReplaySummary> out;
  // A replay row per launch; its captured call is the row of the same rank, communicator and seq.
  sql::Statement query(
      impl_->db,
      "SELECT c.api, count(DISTINCT c.rank_id || ':' || c.comm_id || ':' || c.seq), count(*), "
      "coalesce(sum(c.end_ns - c.start_ns), 0) "
      "FROM gpu_calls g JOIN calls c ON c.id = g.call_id WHERE g.replay IS NOT NULL "
      "GROUP BY c.api ORDER BY 4 DESC, c.api");
  while (query.step())
    out.push_back({static_cast<Api>(query.int32(0)), query.int64(1), query.int64(2), query.int64(3)});
  return out;
}

TraceReader::AppliedSummary TraceReader::appliedSummary() const {
  AppliedSummary summary;
  // Aggregated in SQL: apply mode may replace every reduction of a long job.
  sql::Statement per_strategy(impl_->db,
                              "SELECT a.strategy, count(*), coalesce(sum(c.end_ns - c.start_ns), 0) "
                              "FROM applied_calls a LEFT JOIN calls c ON c.id = a.call_id "
                              "GROUP BY a.strategy ORDER BY count(*) DESC, a.strategy");
  while (per_strategy.step())
    summary.strategies.push_back({per_strategy.text(0), per_strategy.int64(1), per_strategy.int64(2)});
  if (summary.strategies.empty()) return summary;
  summary.untouched_reductions = impl_->db.queryInt(
      "SELECT count(*) FROM calls c WHERE c.op IS NOT NULL AND "
      "NOT EXISTS (SELECT 1 FROM applied_calls a WHERE a.call_id = c.id)");
  return summary;
}

std::vector<RecommendationRecord> TraceReader::recommendations() const {
  return readAll(impl_->db, detail::kRecommendations, "id");
}

std::vector<DropRecord> TraceReader::drops() const {
  return readAll(impl_->db, detail::kDrops, "rank_id, kind");
}

void TraceReader::forEachCall(const std::function<bool(const CallRecord&)>& visit) const {
  sql::Statement query(impl_->db, fmt::format("SELECT {} FROM {} ORDER BY c.id", callColumns(), kCallsFrom));
  while (query.step())
    if (!visit(readCall(query.handle()))) break;
}

void TraceReader::forEachCallWithoutGpuFacts(const std::function<bool(const CallRecord&)>& visit) const {
  sql::Statement replays(impl_->db,
                         "SELECT call_id, replay FROM gpu_calls WHERE replay IS NOT NULL ORDER BY call_id");
  std::int64_t next_replay = replays.step() ? replays.int64(0) : INT64_MAX;
  sql::Statement query(impl_->db,
                       fmt::format("SELECT {} FROM calls ORDER BY id", detail::kCalls.selectList()));
  CallRecord call;
  while (query.step()) {
    call = CallRecord{};
    detail::kCalls.read(query.handle(), 0, call);
    while (next_replay < call.id) next_replay = replays.step() ? replays.int64(0) : INT64_MAX;
    if (next_replay == call.id) call.graph_replay = replays.int64(1);
    if (!visit(call)) break;
  }
}

void TraceReader::forEachPeerCall(const std::function<bool(const CallRecord&)>& visit) const {
  // The same columns as forEachCall, from peer_calls outwards: a row per call that has peers.
  sql::Statement query(impl_->db, fmt::format("SELECT {} FROM peer_calls p JOIN calls c ON c.id = p.call_id "
                                              "LEFT JOIN gpu_calls g ON g.call_id = c.id ORDER BY p.call_id",
                                              callColumns()));
  while (query.step())
    if (!visit(readCall(query.handle()))) break;
}

std::vector<TraceReader::ApiTotal> TraceReader::apiTotals() const {
  // Aggregated here rather than with GROUP BY, which would sort every call in a temporary b-tree.
  std::map<std::pair<std::int64_t, int>, ApiTotal> totals;
  sql::Statement query(impl_->db, "SELECT rank_id, api, bytes, start_ns, end_ns FROM calls");
  ApiTotal* last = nullptr;
  while (query.step()) {
    const std::int64_t rank_id = query.int64(0);
    const auto api = static_cast<Api>(query.int32(1));
    if (last == nullptr || last->rank_id != rank_id || last->api != api) {
      auto [it, inserted] = totals.try_emplace({rank_id, static_cast<int>(api)});
      last = &it->second;
      if (inserted) {
        last->rank_id = rank_id;
        last->api = api;
        last->first_ns = query.int64(3);
        last->last_ns = query.int64(4);
      }
    }
    ++last->calls;
    last->bytes += query.int64(2);
    last->total_ns += query.int64(4) - query.int64(3);
    last->first_ns = std::min(last->first_ns, query.int64(3));
    last->last_ns = std::max(last->last_ns, query.int64(4));
  }
  std::vector<ApiTotal> out;
  out.reserve(totals.size());
  for (const auto& [key, total] : totals) out.push_back(total);
  return out;
}

namespace {

// Open-addressing counts per (api, dtype, op, bytes) for reductionCounts(): one probe into a flat array
// per call instead of a node look-up, which decides the speed with hundreds of thousands of sizes.
class SizeTally {
 public:
  SizeTally() : slots_(1024) {}

  void add(std::int64_t tag, std::int64_t bytes, std::int64_t calls = 1) {
    if (tag == last_tag_ && bytes == last_bytes_) {
      slots_[last_].calls += calls;
      return;
    }
    std::size_t mask = slots_.size() - 1;
    std::size_t i = hash(tag, bytes) & mask;
    while (slots_[i].calls != 0 && (slots_[i].tag != tag || slots_[i].bytes != bytes)) i = (i + 1) & mask;
    if (slots_[i].calls == 0) {
      if (2 * (used_ + 1) > slots_.size()) {
        grow();
        last_tag_ = -1;
        add(tag, bytes, calls);
        return;
      }
      slots_[i].tag = tag, slots_[i].bytes = bytes, ++used_;
    }
    slots_[i].calls += calls;
    last_ = i, last_tag_ = tag, last_bytes_ = bytes;
  }
  void merge(const SizeTally& other) {
    for (const auto& slot : other.slots_)
      if (slot.calls != 0) add(slot.tag, slot.bytes, slot.calls);
  }
  template <typename Visit>
  void forEach(Visit&& visit) const {
    for (const auto& slot : slots_)
      if (slot.calls != 0) visit(slot.tag, slot.bytes, slot.calls);
  }
  std::size_t size() const { return used_; }
  // Starts loading the slot of a key that add() will see soon: with hundreds of thousands of sizes the
  // table outgrows the caches and each add would otherwise wait for memory.
  void prefetch(std::int64_t tag, std::int64_t bytes) const {
    __builtin_prefetch(&slots_[hash(tag, bytes) & (slots_.size() - 1)]);
  }

 private:
  struct Slot {
    std::int64_t tag = 0, bytes = 0, calls = 0;  // calls == 0: empty
  };
  static std::size_t hash(std::int64_t tag, std::int64_t bytes) {
    std::uint64_t h =
        static_cast<std::uint64_t>(bytes) * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(tag);
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    used_ = 0;
    const std::size_t mask = slots_.size() - 1;
    for (const auto& slot : old) {
      if (slot.calls == 0) continue;
      std::size_t i = hash(slot.tag, slot.bytes) & mask;
      while (slots_[i].calls != 0) i = (i + 1) & mask;
      slots_[i] = slot, ++used_;
    }
  }

  std::vector<Slot> slots_;
  std::size_t used_ = 0;
  std::size_t last_ = 0;
  std::int64_t last_tag_ = -1, last_bytes_ = -1;
};

// Distinct small non-negative integers (steps, rank ids) as a bitmap; the rare others in a set.
class DistinctInts {
 public:
  void add(std::int64_t value) {
    if (value == last_) return;
    last_ = value;
    if (value >= 0 && value < kBitmapLimit) {
      const auto word = static_cast<std::size_t>(value >> 6);
      if (word >= bits_.size()) bits_.resize(std::max(word + 1, 2 * bits_.size()));
      bits_[word] |= std::uint64_t{1} << (value & 63);
    } else {
      others_.insert(value);
    }
  }
  void merge(const DistinctInts& other) {
    if (other.bits_.size() > bits_.size()) bits_.resize(other.bits_.size());
    for (std::size_t i = 0; i < other.bits_.size(); ++i) bits_[i] |= other.bits_[i];
    others_.insert(other.others_.begin(), other.others_.end());
  }
  std::int64_t count() const {
    std::int64_t n = static_cast<std::int64_t>(others_.size());
    for (const auto word : bits_) n += std::popcount(word);
    return n;
  }

 private:
  static constexpr std::int64_t kBitmapLimit = std::int64_t{1} << 28;  // 32 MiB of bitmap at most
  std::vector<std::uint64_t> bits_;
  std::unordered_set<std::int64_t> others_;
  std::int64_t last_ = std::numeric_limits<std::int64_t>::min();
};

struct ReductionScan {
  SizeTally sizes;
  DistinctInts steps, ranks;
  std::int64_t single_rank_calls = 0;
};

// Counts the reductions among the calls with ids in [first, last], except those on the communicators
// marked in `single_rank` (by id).
void scanReductions(sql::Database& db, std::int64_t first, std::int64_t last,
                    const std::vector<bool>& single_rank, ReductionScan& out) {
  // Memory-mapped reads for the scan: the pages are used once, and copying each into SQLite's cache
  // costs a tenth of it.
  sqlite3_exec(db.handle(), "PRAGMA mmap_size = 68719476736", nullptr, nullptr, nullptr);
  sql::Statement query(db,
                       "SELECT api, dtype, op, bytes, step, rank_id, comm_id FROM calls "
                       "WHERE id BETWEEN ? AND ? AND op IS NOT NULL");
  query.bind(1, first);
  query.bind(2, last);
  // Rows are counted in batches whose slots are prefetched while SQLite decodes the next rows.
  constexpr int kBatch = 32;
  std::int64_t tags[kBatch], sizes[kBatch];
  int pending = 0;
  const auto flush = [&] {
    for (int i = 0; i < pending; ++i) out.sizes.add(tags[i], sizes[i]);
    pending = 0;
  };
  while (query.step()) {
    if (!single_rank.empty() && !query.isNull(6)) {
      const std::int64_t comm = query.int64(6);
      if (comm >= 0 && static_cast<std::uint64_t>(comm) < single_rank.size() &&
          single_rank[static_cast<std::size_t>(comm)]) {
        ++out.single_rank_calls;
        continue;
      }
    }
    tags[pending] = (query.int64(0) << 32) | ((query.int64(1) & 0xffff) << 16) | (query.int64(2) & 0xffff);
    sizes[pending] = query.int64(3);
    out.sizes.prefetch(tags[pending], sizes[pending]);
    if (++pending == kBatch) flush();
    if (!query.isNull(4)) out.steps.add(query.int64(4));
    out.ranks.add(query.int64(5));
  }
  flush();
}

}  // namespace

TraceReader::ReductionCounts TraceReader::reductionCounts(std::int64_t rows_per_thread) const {
  // Stored by merge (schema v9): its rows, already in order.
  if (const auto totals = readAll(impl_->db, detail::kReductionTotals, "rowid"); !totals.empty()) {
    ReductionCounts stored;
    static_cast<ReductionTotals&>(stored) = totals.front();
    stored.sizes =
        readAll(impl_->db, detail::kReductionSizes, "api, dtype, op, bytes",
                static_cast<std::size_t>(impl_->db.queryInt("SELECT count(*) FROM reduction_sizes")));
    return stored;
  }
  std::int64_t first = 0, last = -1;
  {
    // Two statements: SQLite answers a lone min() or max() of the rowid from the b-tree's ends, but
    // both in one SELECT scan the whole table (0.6 s for ten million calls).
    sql::Statement lowest(impl_->db, "SELECT min(id) FROM calls");
    sql::Statement highest(impl_->db, "SELECT max(id) FROM calls");
    if (lowest.step() && !lowest.isNull(0) && highest.step() && !highest.isNull(0))
      first = lowest.int64(0), last = highest.int64(0);
  }
  // Communicators of one rank: their sums aggregate nothing (a rank's own MPI_COMM_SELF, a split of one).
  std::vector<bool> single_rank;
  {
    sql::Statement query(impl_->db, "SELECT id FROM comms WHERE size = 1 AND id >= 0 ORDER BY id");
    while (query.step()) {
      const auto id = static_cast<std::size_t>(query.int64(0));
      if (id >= single_rank.size()) single_rank.resize(id + 1, false);
      single_rank[id] = true;
    }
  }
  // A large trace is read in id ranges by parallel read-only connections (ids are the rowid: each
  // range is a b-tree seek). A trace still being written may show each connection a slightly newer
  // snapshot; the counts are statistics of the workload, so that does not matter.
  const auto rows = last - first + 1;
  const auto threads =
      static_cast<int>(std::clamp<std::int64_t>(rows / std::max<std::int64_t>(1, rows_per_thread), 1,
                                                std::max(1u, std::thread::hardware_concurrency())));
  std::vector<ReductionScan> scans(static_cast<std::size_t>(threads));
  const auto range = [&](int i) {
    const std::int64_t begin = first + rows * i / threads;
    return std::pair{begin, first + rows * (i + 1) / threads - 1};
  };
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  {
    std::vector<std::jthread> workers;
    for (int i = 1; i < threads; ++i)
      workers.emplace_back([&, i] {
        try {
          sql::Database db(impl_->db.path(), SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX);
          sqlite3_busy_timeout(db.handle(), 5000);
          const auto [begin, end] = range(i);
          scanReductions(db, begin, end, single_rank, scans[static_cast<std::size_t>(i)]);
        } catch (...) {
          errors[static_cast<std::size_t>(i)] = std::current_exception();
        }
      });
    const auto [begin, end] = range(0);
    scanReductions(impl_->db, begin, end, single_rank, scans[0]);
    sqlite3_exec(impl_->db.handle(), "PRAGMA mmap_size = 0", nullptr, nullptr, nullptr);  // this scan only
  }
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
  for (std::size_t i = 1; i < scans.size(); ++i) {
    scans[0].sizes.merge(scans[i].sizes);
    scans[0].steps.merge(scans[i].steps);
    scans[0].ranks.merge(scans[i].ranks);
    scans[0].single_rank_calls += scans[i].single_rank_calls;
  }

  ReductionCounts result;
  result.steps = scans[0].steps.count();
  result.ranks = scans[0].ranks.count();
  result.single_rank_calls = scans[0].single_rank_calls;
  result.sizes.reserve(scans[0].sizes.size());
  scans[0].sizes.forEach([&](std::int64_t tag, std::int64_t bytes, std::int64_t calls) {
    result.sizes.push_back({static_cast<Api>(tag >> 32), static_cast<DType>((tag >> 16) & 0xffff),
                            static_cast<ReduceOp>(tag & 0xffff), bytes, calls});
  });
  std::sort(result.sizes.begin(), result.sizes.end(), [](const ReductionCount& a, const ReductionCount& b) {
    return std::tie(a.api, a.dtype, a.op, a.bytes) < std::tie(b.api, b.dtype, b.op, b.bytes);
  });
  return result;
}

}  // namespace gradscope::storage
