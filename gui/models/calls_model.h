#pragma once

// The calls table: a model over the `calls` table of a trace that never holds more than the rows the
// user scrolled through. Rows come in pages of kCallsPageSize from a keyset query (ORDER BY key, id with
// WHERE (key, id) > last row), run on the thread pool; the view's fetchMore() asks for the next page.
// A time window becomes id ranges through call_tiles (TraceReader::callWindow, the store's time index, the
// query the timeline's frames use too), so "calls in the visible window" reads only those calls, also in a
// 10,000,000-call trace, and lists exactly the calls the timeline draws. Changing the filter, window or sort
// resets the model and drops pages still in flight (JobTracker generations).

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <QAbstractTableModel>

#include "gradscope/storage/reader.h"
#include "gradscope/storage/records.h"
#include "models/jobs.h"
#include "models/view_state.h"

namespace gradscope::gui {

class ReadOnlyDatabase;

inline constexpr int kCallsPageSize = 256;

enum class CallColumn : int {
  Id,
  Rank,
  Host,
  Step,
  Api,
  Bytes,
  Start,
  Duration,
  Seq,
  Dtype,
  Op,
  Strategy,
  Count
};

struct CallsQuery {
  CallFilter filter;
  std::optional<TimeRange> window;  // only calls in it (storage/window.h), over its whole nanoseconds
  CallColumn sort = CallColumn::Id;
  bool descending = false;
  friend bool operator==(const CallsQuery&, const CallsQuery&) = default;
};

struct CallRow {
  storage::CallRecord call;
  std::string strategy;  // what apply mode ran instead; empty when it ran as issued
};

struct CallsPage {
  std::vector<CallRow> rows;
  bool last = false;  // no rows after these
};

// One page after `after` (nullopt: the first page), read through `db`; the reader of the same file finds
// the window's calls (TraceReader::callWindow, as the timeline does). Throws gradscope::Error.
CallsPage loadCallsPage(const storage::TraceReader& reader, const ReadOnlyDatabase& db,
                        const CallsQuery& query, const std::optional<CallRow>& after,
                        int page_size = kCallsPageSize);
// All matching calls (one scan of the matching id ranges).
std::int64_t countCalls(const storage::TraceReader& reader, const ReadOnlyDatabase& db,
                        const CallsQuery& query);

class CallsModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Role {
    SortRole = Qt::UserRole + 1,  // the raw value of the cell (numbers as qint64)
    CallIdRole,
    RankIdRole,
    StartRole,
    EndRole,
  };

  explicit CallsModel(QObject* parent = nullptr);

  // A trace whose info was loaded (TraceReader opened it); ranks give the Rank and Host columns.
  void setTrace(const std::string& path, const std::vector<storage::RankInfo>& ranks);
  void clear();
  void setQuery(const CallsQuery& query);
  const CallsQuery& query() const { return query_; }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;
  bool canFetchMore(const QModelIndex& parent) const override;
  void fetchMore(const QModelIndex& parent) override;
  void sort(int column, Qt::SortOrder order = Qt::AscendingOrder) override;

  // Row of a loaded call, -1 when not loaded.
  int rowOfCall(std::int64_t call_id) const;
  const CallRow* rowAt(int row) const;
  bool loading() const { return loading_; }
  bool exhausted() const { return exhausted_; }
  std::optional<std::int64_t> matchingCalls() const { return matching_; }
  QString lastError() const { return error_; }

 signals:
  void pageLoaded();
  void matchingCallsChanged();
  void failed(const QString& message);

 private:
  void reload();
  void requestPage();

  std::string path_;
  std::unordered_map<std::int64_t, std::pair<int, std::string>> rank_names_;  // rank id → (rank, host)
  CallsQuery query_;
  std::vector<CallRow> rows_;
  std::unordered_map<std::int64_t, int> row_of_call_;
  bool loading_ = false;
  bool exhausted_ = true;
  std::optional<std::int64_t> matching_;
  QString error_;
  JobTracker pages_;
  JobTracker count_;
};

}  // namespace gradscope::gui
