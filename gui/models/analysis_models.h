#pragma once

// Table models of the analysis views: measured strategies, consensus rows, the recommendation's sizes
// and its async strategies, and the check comparison (measured keys and runs step by step). Each holds plain
// rows loaded on a pool thread (set*() replaces them with a model reset); Qt::DisplayRole is formatted text,
// SortRole the raw number, so a QSortFilterProxyModel sorts numerically.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <QAbstractTableModel>

#include "gradscope/storage/records.h"
#include "gradscope/tuner/check.h"
#include "gradscope/tuner/recommend.h"

namespace gradscope::gui {

inline constexpr int kSortRole = Qt::UserRole + 1;

// The measurements of one strategy at one size, aggregated: medians of the rows' medians and bandwidths,
// the extremes of their min and max, the worst error. The Strategies view passes one row per collective
// measured (tuner::loadMeasurements: an exploration with its ranks merged, or a bench point), so that
// `rows` counts what check and recommend count.
struct StrategyPoint {
  std::string strategy;
  Api api = Api::Unknown;
  DType dtype = DType::Fp32;
  std::int64_t bytes = 0;
  int world = 0;
  int rows = 0;
  double median_ns = 0, min_ns = 0, max_ns = 0;
  double busbw_gbs = 0;
  std::optional<double> rel_l2_error;  // worst over the rows
  std::int64_t overflow = 0;
};
// Ordered by strategy, api, dtype, world, bytes.
std::vector<StrategyPoint> aggregateMeasurements(const std::vector<storage::Measurement>& measurements);

// For each point (time, error): whether no other point is at least as good in both and better in one.
std::vector<bool> paretoFront(const std::vector<std::pair<double, double>>& points);

class StrategiesModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column {
    ColStrategy,
    ColApi,
    ColDtype,
    ColBytes,
    ColWorld,
    ColRows,
    ColMedian,
    ColMin,
    ColMax,
    ColBusbw,
    ColError,
    ColumnCount
  };
  using QAbstractTableModel::QAbstractTableModel;
  void setPoints(std::vector<StrategyPoint> points);
  const std::vector<StrategyPoint>& points() const { return points_; }
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::vector<StrategyPoint> points_;
};

struct ConsensusRow {
  storage::ConsensusRecord record;
  int rank = 0;  // the rank number of record.rank_id
};

// What the consensus charts draw. x is the step, or the row's index within its rank when no row knows its
// step (rows with an unknown step are left out otherwise). A step with several explored buffers has several
// rows per rank: the chart's line goes through their mean, one point per step, and the rows themselves
// are scattered behind it.
struct ConsensusPoint {
  std::int64_t x = 0;
  double mean = 0;
  std::vector<double> values;  // every row's value, in row order
};
struct ConsensusSeries {
  bool steps_known = false;
  // Per rank, points sorted by x.
  std::map<int, std::vector<ConsensusPoint>> alpha, cosine;
  // Gradient diversity, one point per x: the mean over that step's rows (of every rank).
  std::vector<ConsensusPoint> diversity;
};
ConsensusSeries consensusSeries(const std::vector<ConsensusRow>& rows);

class ConsensusModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { ColStep, ColRank, ColAlpha, ColCosine, ColNorm, ColDiversity, ColCall, ColumnCount };
  using QAbstractTableModel::QAbstractTableModel;
  void setRows(std::vector<ConsensusRow> rows);
  const std::vector<ConsensusRow>& rows() const { return rows_; }
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::vector<ConsensusRow> rows_;
};

class RecommendationModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column {
    ColApi,
    ColDtype,
    ColSizes,
    ColCallsPerStep,
    ColBaseline,
    ColBest,
    ColBestTime,
    ColGain,
    ColumnCount
  };
  using QAbstractTableModel::QAbstractTableModel;
  void setRows(std::vector<tuner::SizeRow> rows);
  const std::vector<tuner::SizeRow>& rows() const { return rows_; }
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::vector<tuner::SizeRow> rows_;
};

// The async strategies of a synchronous-or-asynchronous analysis (tuner/async.h), one row per
// tuner::AsyncOption in the analysis' order: the replayed step, what it does to the step as a share of the
// replayed synchronous step (negative: faster) with its 95% interval, and the errors explore measured
// ("–" where it measured none). The row of the plan's choice (tuner::Report::async_choice) is bold.
class AsyncOptionsModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { ColStrategy, ColStep, ColOnStep, ColErrorMedian, ColErrorWorst, ColSamples, ColumnCount };
  using QAbstractTableModel::QAbstractTableModel;
  // `choice`: the strategy the plan uses for every reduction; empty: none.
  void setAnalysis(const tuner::AsyncAnalysis& analysis, std::string choice);
  void clear();
  const std::vector<tuner::AsyncOption>& options() const { return options_; }
  const std::string& choice() const { return choice_; }
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::vector<tuner::AsyncOption> options_;
  double replay_sync_ns_ = 0;
  std::string choice_;
};

class CheckModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column {
    ColVerdict,
    ColStrategy,
    ColCollective,
    ColDtype,
    ColBytes,
    ColWorld,
    ColBaseline,
    ColCurrent,
    ColChange,
    ColPValue,
    ColReason,
    ColumnCount
  };
  using QAbstractTableModel::QAbstractTableModel;
  void setComparisons(std::vector<tuner::KeyComparison> comparisons);
  const std::vector<tuner::KeyComparison>& comparisons() const { return rows_; }
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::vector<tuner::KeyComparison> rows_;
};

// Two observed runs compared step by step (tuner::CheckResult::runs), one row per figure in the check's
// order: the step time, its parts, then the time per step in each API and size. Verdicts are coloured as
// CheckModel colours them.
class RunComparisonModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { ColVerdict, ColFigure, ColBaseline, ColCurrent, ColChange, ColEvidence, ColumnCount };
  using QAbstractTableModel::QAbstractTableModel;
  void setRuns(std::vector<tuner::RunComparison> runs);
  const std::vector<tuner::RunComparison>& runs() const { return rows_; }
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::vector<tuner::RunComparison> rows_;
};

// "1.25 ms [1.20 ms – 1.31 ms]"
QString formatInterval(const TimeInterval& interval);
QString toQString(std::string_view text);

}  // namespace gradscope::gui
