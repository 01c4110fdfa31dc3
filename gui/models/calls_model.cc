#include "models/calls_model.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gradscope/common/units.h"
#include "gradscope/storage/call_columns.h"
#include "models/sql.h"
#include "models/units_text.h"

namespace gradscope::gui {

namespace {

// The expressions storage selects the columns as, so that a key compares as the CallRecord member that
// sortValue() gives for the keyset (an unknown step -1, no op ReduceOp::None).
std::string sortKey(CallColumn column) {
  switch (column) {
    case CallColumn::Rank:
    case CallColumn::Host: return storage::callColumn("rank_id");
    case CallColumn::Step: return storage::callColumn("step");
    case CallColumn::Api: return storage::callColumn("api");
    case CallColumn::Bytes: return storage::callColumn("bytes");
    case CallColumn::Start: return storage::callColumn("start_ns");
    case CallColumn::Duration: return "(c.end_ns - c.start_ns)";
    case CallColumn::Seq: return storage::callColumn("seq");
    case CallColumn::Dtype: return storage::callColumn("dtype");
    case CallColumn::Op: return storage::callColumn("op");
    default: return storage::callColumn("id");
  }
}

std::int64_t sortValue(const CallRow& row, CallColumn column) {
  const storage::CallRecord& call = row.call;
  switch (column) {
    case CallColumn::Rank:
    case CallColumn::Host: return call.rank_id;
    case CallColumn::Step: return call.step;
    case CallColumn::Api: return static_cast<std::int64_t>(call.api);
    case CallColumn::Bytes: return call.bytes;
    case CallColumn::Start: return call.start_ns;
    case CallColumn::Duration: return call.end_ns - call.start_ns;
    case CallColumn::Seq: return call.seq;
    case CallColumn::Dtype: return static_cast<std::int64_t>(call.dtype);
    case CallColumn::Op: return static_cast<std::int64_t>(call.op);
    default: return call.id;
  }
}

// The WHERE clause of a query (without the keyset part); empty optional when nothing can match.
std::optional<std::string> whereClause(const storage::TraceReader& reader, const CallsQuery& query) {
  std::vector<std::string> terms;
  const CallFilter& filter = query.filter;
  if (filter.api) terms.push_back(fmt::format("c.api = {}", static_cast<int>(*filter.api)));
  if (filter.rank_id) terms.push_back(fmt::format("c.rank_id = {}", *filter.rank_id));
  if (filter.min_bytes > 0) terms.push_back(fmt::format("c.bytes >= {}", filter.min_bytes));
  if (filter.max_bytes) terms.push_back(fmt::format("c.bytes <= {}", *filter.max_bytes));
  if (filter.step) terms.push_back(fmt::format("coalesce(c.step, -1) = {}", *filter.step));
  if (query.window) {
    // The store's window query, the timeline's too: both list the same calls (storage/window.h).
    const NanosecondWindow ns = wholeNanoseconds(*query.window);
    const storage::CallWindow window = reader.callWindow(ns.t0_ns, ns.t1_ns, filter.rank_id);
    if (window.empty()) return std::nullopt;
    terms.push_back(window.sqlCondition("c"));
  }
  std::string clause;
  for (const std::string& term : terms) clause += (clause.empty() ? " WHERE " : " AND ") + term;
  return clause;
}

QString formatTime(std::int64_t ns) {
  return QString::fromStdString(fmt::format("{:.6f} s", static_cast<double>(ns) / 1e9));
}

}  // namespace

CallsPage loadCallsPage(const storage::TraceReader& reader, const ReadOnlyDatabase& db,
                        const CallsQuery& query, const std::optional<CallRow>& after, int page_size) {
  CallsPage page;
  std::optional<std::string> where = whereClause(reader, query);
  if (!where) {
    page.last = true;
    return page;
  }
  const std::string key = sortKey(query.sort);
  const char* order = query.descending ? "DESC" : "ASC";
  std::string clause = *where;
  if (after) {
    const std::int64_t value = sortValue(*after, query.sort);
    clause +=
        fmt::format("{0} ({1} {2} {3} OR ({1} = {3} AND c.id {2} {4}))", clause.empty() ? " WHERE" : " AND",
                    key, query.descending ? "<" : ">", value, after->call.id);
  }
  ReadOnlyDatabase::Statement statement = db.prepare(
      fmt::format("SELECT {}, a.strategy FROM {} LEFT JOIN applied_calls a ON a.call_id = c.id{} "
                  "ORDER BY {} {}, c.id {} LIMIT {}",
                  storage::callColumns(), storage::kCallsFrom, clause, key, order, order, page_size));
  const int strategy = storage::callColumnCount();
  while (statement.step()) {
    CallRow row;
    row.call = storage::readCall(statement.handle());
    if (!statement.isNull(strategy)) row.strategy = statement.text(strategy);
    page.rows.push_back(std::move(row));
  }
  page.last = static_cast<int>(page.rows.size()) < page_size;
  return page;
}

std::int64_t countCalls(const storage::TraceReader& reader, const ReadOnlyDatabase& db,
                        const CallsQuery& query) {
  std::optional<std::string> where = whereClause(reader, query);
  if (!where) return 0;
  return db.scalar("SELECT count(*) FROM calls c" + *where);
}

CallsModel::CallsModel(QObject* parent) : QAbstractTableModel(parent), pages_(this), count_(this) {}

void CallsModel::setTrace(const std::string& path, const std::vector<storage::RankInfo>& ranks) {
  path_ = path;
  rank_names_.clear();
  for (const storage::RankInfo& rank : ranks) rank_names_[rank.id] = {rank.rank, rank.host};
  reload();
}

void CallsModel::clear() {
  path_.clear();
  reload();
}

void CallsModel::setQuery(const CallsQuery& query) {
  if (query == query_ && !rows_.empty()) return;
  query_ = query;
  reload();
}

void CallsModel::reload() {
  pages_.cancel();
  count_.cancel();
  beginResetModel();
  rows_.clear();
  row_of_call_.clear();
  loading_ = false;
  exhausted_ = path_.empty();
  matching_.reset();
  error_.clear();
  endResetModel();
  emit matchingCallsChanged();
  if (path_.empty()) return;
  requestPage();
  const std::string path = path_;
  const CallsQuery query = query_;
  count_.run<std::int64_t>(
      [path, query] { return countCalls(threadReader(path), threadDatabase(path), query); },
      [this](Outcome<std::int64_t> outcome) {
        if (outcome.value) {
          matching_ = *outcome.value;
          emit matchingCallsChanged();
        }
      });
}

void CallsModel::requestPage() {
  if (loading_ || exhausted_) return;
  loading_ = true;
  const std::string path = path_;
  const CallsQuery query = query_;
  std::optional<CallRow> after;
  if (!rows_.empty()) after = rows_.back();
  pages_.run<CallsPage>(
      [path, query, after] { return loadCallsPage(threadReader(path), threadDatabase(path), query, after); },
      [this](Outcome<CallsPage> outcome) {
        // loading_ stays set until the rows are in: a view (or the model tester) may
        // ask for the next page from inside beginInsertRows, which must not start
        // one after the previous last row.
        if (!outcome.value) {
          loading_ = false;
          exhausted_ = true;
          error_ = outcome.error;
          emit failed(outcome.error);
          emit pageLoaded();
          return;
        }
        CallsPage& page = *outcome.value;
        exhausted_ = page.last;
        if (!page.rows.empty()) {
          const int first = static_cast<int>(rows_.size());
          beginInsertRows({}, first, first + static_cast<int>(page.rows.size()) - 1);
          for (CallRow& row : page.rows) {
            row_of_call_[row.call.id] = static_cast<int>(rows_.size());
            rows_.push_back(std::move(row));
          }
          endInsertRows();
        }
        loading_ = false;
        emit pageLoaded();
      });
}

int CallsModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

int CallsModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(CallColumn::Count);
}

QVariant CallsModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  const CallRow& row = rows_[static_cast<std::size_t>(index.row())];
  const storage::CallRecord& call = row.call;
  const auto column = static_cast<CallColumn>(index.column());
  switch (role) {
    case CallIdRole: return QVariant::fromValue<qint64>(call.id);
    case RankIdRole: return QVariant::fromValue<qint64>(call.rank_id);
    case StartRole: return QVariant::fromValue<qint64>(call.start_ns);
    case EndRole: return QVariant::fromValue<qint64>(call.end_ns);
    case SortRole: return QVariant::fromValue<qint64>(sortValue(row, column));
    case Qt::TextAlignmentRole:
      if (column == CallColumn::Host || column == CallColumn::Api || column == CallColumn::Dtype ||
          column == CallColumn::Op || column == CallColumn::Strategy) {
        return QVariant::fromValue(Qt::Alignment(Qt::AlignLeft | Qt::AlignVCenter));
      }
      return QVariant::fromValue(Qt::Alignment(Qt::AlignRight | Qt::AlignVCenter));
    case Qt::DisplayRole: break;
    default: return {};
  }
  const auto rank = rank_names_.find(call.rank_id);
  switch (column) {
    case CallColumn::Id: return QVariant::fromValue<qint64>(call.id);
    case CallColumn::Rank:
      return rank != rank_names_.end() ? QVariant(rank->second.first)
                                       : QVariant::fromValue<qint64>(call.rank_id);
    case CallColumn::Host:
      return rank != rank_names_.end() ? QString::fromStdString(rank->second.second) : QString();
    case CallColumn::Step:
      return call.step >= 0 ? QVariant::fromValue<qint64>(call.step) : QVariant(QStringLiteral("–"));
    case CallColumn::Api:
      return QString::fromUtf8(name(call.api).data(), static_cast<qsizetype>(name(call.api).size()));
    case CallColumn::Bytes: return bytesText(call.bytes);
    case CallColumn::Start: return formatTime(call.start_ns);
    case CallColumn::Duration: return durationText(call.end_ns - call.start_ns);
    case CallColumn::Seq:
      // A CUDA graph replay shares its captured call's seq (docs/schema.md, "CUDA graphs").
      if (call.graph_replay > 0) return QStringLiteral("%1 · replay %2").arg(call.seq).arg(call.graph_replay);
      return QVariant::fromValue<qint64>(call.seq);
    case CallColumn::Dtype:
      return QString::fromUtf8(name(call.dtype).data(), static_cast<qsizetype>(name(call.dtype).size()));
    case CallColumn::Op:
      return call.op == ReduceOp::None
                 ? QStringLiteral("–")
                 : QString::fromUtf8(name(call.op).data(), static_cast<qsizetype>(name(call.op).size()));
    case CallColumn::Strategy:
      return row.strategy.empty() ? QStringLiteral("as issued") : QString::fromStdString(row.strategy);
    case CallColumn::Count: break;
  }
  return {};
}

QVariant CallsModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole)
    return QAbstractTableModel::headerData(section, orientation, role);
  static const char* const kHeaders[] = {"Call",  "Rank",     "Host", "Step",  "API", "Bytes",
                                         "Start", "Duration", "Seq",  "Dtype", "Op",  "Strategy"};
  if (section < 0 || section >= static_cast<int>(CallColumn::Count)) return {};
  return QString::fromLatin1(kHeaders[section]);
}

bool CallsModel::canFetchMore(const QModelIndex& parent) const {
  return !parent.isValid() && !exhausted_ && !loading_;
}

void CallsModel::fetchMore(const QModelIndex& parent) {
  if (!parent.isValid()) requestPage();
}

void CallsModel::sort(int column, Qt::SortOrder order) {
  if (column < 0 || column >= static_cast<int>(CallColumn::Count)) return;
  CallsQuery query = query_;
  query.sort = static_cast<CallColumn>(column);
  query.descending = order == Qt::DescendingOrder;
  if (query == query_) return;
  query_ = query;
  reload();
}

int CallsModel::rowOfCall(std::int64_t call_id) const {
  const auto found = row_of_call_.find(call_id);
  return found != row_of_call_.end() ? found->second : -1;
}

const CallRow* CallsModel::rowAt(int row) const {
  if (row < 0 || row >= static_cast<int>(rows_.size())) return nullptr;
  return &rows_[static_cast<std::size_t>(row)];
}

}  // namespace gradscope::gui
