#include "models/analysis_models.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <QBrush>
#include <QColor>
#include <QFont>
#include <fmt/format.h>

#include "gradscope/common/units.h"
#include "gradscope/tuner/model.h"
#include "models/units_text.h"

namespace gradscope::gui {

namespace {

QString errorText(std::optional<double> error) {
  if (!error) return QStringLiteral("–");
  if (*error == 0) return QStringLiteral("0 (exact)");
  return QString::fromStdString(fmt::format("{:.2e}", *error));
}

QVariant alignment(bool left) {
  return QVariant::fromValue(Qt::Alignment((left ? Qt::AlignLeft : Qt::AlignRight) | Qt::AlignVCenter));
}

QVariant header(const char* const* names, int count, int section, Qt::Orientation orientation, int role) {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole || section < 0 || section >= count) return {};
  return QString::fromUtf8(names[section]);
}

// The check's verdicts, in every table that shows one: regression red, improvement green, noisy amber.
QVariant verdictBrush(tuner::Verdict verdict) {
  switch (verdict) {
    case tuner::Verdict::Regression: return QBrush(QColor(0xc6, 0x28, 0x28));
    case tuner::Verdict::Improvement: return QBrush(QColor(0x2e, 0x7d, 0x32));
    case tuner::Verdict::Noisy: return QBrush(QColor(0xb2, 0x6b, 0x00));
    case tuner::Verdict::Unchanged: break;
  }
  return {};
}
QString changeText(double change) {
  return QString::asprintf("%+.1f %%", 100.0 * change);
}

bool validCell(const QAbstractItemModel& model, const QModelIndex& index) {
  return model.checkIndex(index, QAbstractItemModel::CheckIndexOption::IndexIsValid |
                                     QAbstractItemModel::CheckIndexOption::ParentIsInvalid);
}

}  // namespace

QString toQString(std::string_view text) {
  return QString::fromUtf8(text.data(), static_cast<qsizetype>(text.size()));
}

QString formatInterval(const TimeInterval& interval) {
  return QStringLiteral("%1 [%2 – %3]")
      .arg(durationText(interval.median_ns), durationText(interval.low_ns), durationText(interval.high_ns));
}

std::vector<StrategyPoint> aggregateMeasurements(const std::vector<storage::Measurement>& measurements) {
  using Key = std::tuple<std::string, int, int, int, std::int64_t>;
  struct Samples {
    std::vector<double> medians, busbw;
    double min_ns = 0, max_ns = 0;
    std::optional<double> error;
    std::int64_t overflow = 0;
  };
  std::map<Key, Samples> groups;
  for (const storage::Measurement& m : measurements) {
    Samples& samples =
        groups[Key{m.strategy, static_cast<int>(m.api), static_cast<int>(m.dtype), m.world, m.bytes}];
    samples.min_ns = samples.medians.empty() ? m.min_ns : std::min(samples.min_ns, m.min_ns);
    samples.max_ns = samples.medians.empty() ? m.max_ns : std::max(samples.max_ns, m.max_ns);
    samples.medians.push_back(m.median_ns);
    samples.busbw.push_back(m.busbw_gbs);
    if (m.rel_l2_error) samples.error = std::max(samples.error.value_or(0.0), *m.rel_l2_error);
    samples.overflow += m.overflow_count;
  }
  std::vector<StrategyPoint> points;
  points.reserve(groups.size());
  for (auto& [key, samples] : groups) {
    StrategyPoint point;
    point.strategy = std::get<0>(key);
    point.api = static_cast<Api>(std::get<1>(key));
    point.dtype = static_cast<DType>(std::get<2>(key));
    point.world = std::get<3>(key);
    point.bytes = std::get<4>(key);
    point.rows = static_cast<int>(samples.medians.size());
    point.median_ns = tuner::median(samples.medians);
    point.min_ns = samples.min_ns;
    point.max_ns = samples.max_ns;
    point.busbw_gbs = tuner::median(samples.busbw);
    point.rel_l2_error = samples.error;
    point.overflow = samples.overflow;
    points.push_back(std::move(point));
  }
  return points;
}

std::vector<bool> paretoFront(const std::vector<std::pair<double, double>>& points) {
  std::vector<bool> front(points.size(), true);
  for (std::size_t i = 0; i < points.size(); ++i) {
    for (std::size_t j = 0; j < points.size() && front[i]; ++j) {
      if (i == j) continue;
      const auto& [ti, ei] = points[i];
      const auto& [tj, ej] = points[j];
      if (tj <= ti && ej <= ei && (tj < ti || ej < ei)) front[i] = false;
    }
  }
  return front;
}

// ---- StrategiesModel

void StrategiesModel::setPoints(std::vector<StrategyPoint> points) {
  beginResetModel();
  points_ = std::move(points);
  endResetModel();
}

int StrategiesModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(points_.size());
}
int StrategiesModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant StrategiesModel::data(const QModelIndex& index, int role) const {
  if (!validCell(*this, index)) return {};
  const StrategyPoint& p = points_[static_cast<std::size_t>(index.row())];
  const int column = index.column();
  if (role == Qt::TextAlignmentRole) return alignment(column <= ColDtype);
  if (role == kSortRole) {
    switch (column) {
      case ColStrategy: return toQString(p.strategy);
      case ColApi: return static_cast<int>(p.api);
      case ColDtype: return static_cast<int>(p.dtype);
      case ColBytes: return QVariant::fromValue<qint64>(p.bytes);
      case ColWorld: return p.world;
      case ColRows: return p.rows;
      case ColMedian: return p.median_ns;
      case ColMin: return p.min_ns;
      case ColMax: return p.max_ns;
      case ColBusbw: return p.busbw_gbs;
      case ColError: return p.rel_l2_error.value_or(-1.0);
      default: return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  switch (column) {
    case ColStrategy: return toQString(p.strategy);
    case ColApi: return toQString(name(p.api));
    case ColDtype: return toQString(name(p.dtype));
    case ColBytes: return bytesText(p.bytes);
    case ColWorld: return p.world;
    case ColRows: return p.rows;
    case ColMedian: return durationText(p.median_ns);
    case ColMin: return durationText(p.min_ns);
    case ColMax: return durationText(p.max_ns);
    case ColBusbw: return QString::number(p.busbw_gbs, 'f', 3);
    case ColError: return errorText(p.rel_l2_error);
    default: return {};
  }
}

QVariant StrategiesModel::headerData(int section, Qt::Orientation orientation, int role) const {
  static const char* const kNames[] = {"Strategy", "API", "Dtype", "Size",     "World",        "Samples",
                                       "Median",   "Min", "Max",   "Bus GB/s", "Rel. L2 error"};
  return header(kNames, ColumnCount, section, orientation, role);
}

// ---- ConsensusModel

ConsensusSeries consensusSeries(const std::vector<ConsensusRow>& rows) {
  ConsensusSeries series;
  series.steps_known =
      std::any_of(rows.begin(), rows.end(), [](const ConsensusRow& r) { return r.record.step >= 0; });
  std::map<int, std::map<std::int64_t, ConsensusPoint>> alpha, cosine;
  std::map<std::int64_t, ConsensusPoint> diversity;
  std::map<int, std::int64_t> index_of_rank;
  for (const ConsensusRow& row : rows) {
    const std::int64_t x = series.steps_known ? row.record.step : index_of_rank[row.rank]++;
    if (x < 0) continue;
    alpha[row.rank][x].values.push_back(row.record.alpha);
    cosine[row.rank][x].values.push_back(row.record.cosine_to_mean);
    diversity[x].values.push_back(row.record.diversity);
  }
  const auto flatten = [](std::map<std::int64_t, ConsensusPoint>& by_x) {
    std::vector<ConsensusPoint> points;
    points.reserve(by_x.size());
    for (auto& [x, point] : by_x) {
      point.x = x;
      double sum = 0;
      for (const double value : point.values) sum += value;
      point.mean = sum / static_cast<double>(point.values.size());
      points.push_back(std::move(point));
    }
    return points;
  };
  for (auto& [rank, by_x] : alpha) series.alpha[rank] = flatten(by_x);
  for (auto& [rank, by_x] : cosine) series.cosine[rank] = flatten(by_x);
  series.diversity = flatten(diversity);
  return series;
}

void ConsensusModel::setRows(std::vector<ConsensusRow> rows) {
  beginResetModel();
  rows_ = std::move(rows);
  endResetModel();
}

int ConsensusModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int ConsensusModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant ConsensusModel::data(const QModelIndex& index, int role) const {
  if (!validCell(*this, index)) return {};
  const ConsensusRow& row = rows_[static_cast<std::size_t>(index.row())];
  const storage::ConsensusRecord& r = row.record;
  const int column = index.column();
  if (role == Qt::TextAlignmentRole) return alignment(false);
  if (role != Qt::DisplayRole && role != kSortRole) return {};
  const bool raw = role == kSortRole;
  switch (column) {
    case ColStep:
      return raw || r.step >= 0 ? QVariant::fromValue<qint64>(r.step) : QVariant(QStringLiteral("–"));
    case ColRank: return row.rank;
    case ColAlpha: return raw ? QVariant(r.alpha) : QVariant(QString::number(r.alpha, 'f', 4));
    case ColCosine:
      return raw ? QVariant(r.cosine_to_mean) : QVariant(QString::number(r.cosine_to_mean, 'f', 4));
    case ColNorm: return raw ? QVariant(r.grad_norm) : QVariant(QString::number(r.grad_norm, 'g', 5));
    case ColDiversity: return raw ? QVariant(r.diversity) : QVariant(QString::number(r.diversity, 'f', 4));
    case ColCall:
      if (r.call_id) return QVariant::fromValue<qint64>(*r.call_id);
      return raw ? QVariant::fromValue<qint64>(-1) : QVariant(QStringLiteral("–"));
    default: return {};
  }
}

QVariant ConsensusModel::headerData(int section, Qt::Orientation orientation, int role) const {
  static const char* const kNames[] = {"Step",          "Rank",      "AdaCons α", "Cosine to mean",
                                       "Gradient norm", "Diversity", "Call"};
  return header(kNames, ColumnCount, section, orientation, role);
}

// ---- RecommendationModel

void RecommendationModel::setRows(std::vector<tuner::SizeRow> rows) {
  beginResetModel();
  rows_ = std::move(rows);
  endResetModel();
}

int RecommendationModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int RecommendationModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant RecommendationModel::data(const QModelIndex& index, int role) const {
  if (!validCell(*this, index)) return {};
  const tuner::SizeRow& r = rows_[static_cast<std::size_t>(index.row())];
  const int column = index.column();
  if (role == Qt::TextAlignmentRole)
    return alignment(column == ColApi || column == ColDtype || column == ColBest);
  if (role == Qt::ForegroundRole && column == ColGain && r.gain > 0) return QBrush(QColor(0x2e, 0x7d, 0x32));
  if (role == Qt::ToolTipRole && r.extrapolated) {
    return QStringLiteral("A prediction used here lies outside the measured sizes (extrapolated).");
  }
  if (role == kSortRole) {
    switch (column) {
      case ColApi: return static_cast<int>(r.api);
      case ColDtype: return static_cast<int>(r.dtype);
      case ColSizes: return QVariant::fromValue<qint64>(r.bytes);
      case ColCallsPerStep: return r.calls_per_step;
      case ColBaseline: return r.baseline ? r.baseline->median_ns : -1.0;
      case ColBest: return toQString(r.best);
      case ColBestTime: return r.best_time ? r.best_time->median_ns : -1.0;
      case ColGain: return r.gain;
      default: return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  switch (column) {
    case ColApi: return toQString(name(r.api));
    case ColDtype: return toQString(name(r.dtype));
    case ColSizes:
      if (r.min_bytes != r.max_bytes && r.max_bytes > 0) {
        return QStringLiteral("%1 – %2").arg(bytesText(r.min_bytes), bytesText(r.max_bytes));
      }
      return bytesText(r.bytes);
    case ColCallsPerStep: return QString::number(r.calls_per_step, 'g', 4);
    case ColBaseline: return r.baseline ? formatInterval(*r.baseline) : QStringLiteral("no model");
    case ColBest: return toQString(r.best) + (r.extrapolated ? QStringLiteral(" *") : QString());
    case ColBestTime: return r.best_time ? formatInterval(*r.best_time) : QStringLiteral("–");
    case ColGain: return QString::number(100.0 * r.gain, 'f', 1) + QStringLiteral(" %");
    default: return {};
  }
}

QVariant RecommendationModel::headerData(int section, Qt::Orientation orientation, int role) const {
  static const char* const kNames[] = {
      "API", "Dtype", "Size", "Calls / step", "Baseline (sum/native)", "Choice", "Choice time", "Gain"};
  return header(kNames, ColumnCount, section, orientation, role);
}

// ---- AsyncOptionsModel

namespace {
// A share of the replayed synchronous step, signed, with a real minus sign: "−18.3".
QString signedShare(double share) {
  const QString text = QString::number(100.0 * std::abs(share), 'f', 1);
  if (text == QStringLiteral("0.0")) return text;
  return (share < 0 ? QStringLiteral("\u2212") : QStringLiteral("+")) + text;
}
}  // namespace

void AsyncOptionsModel::setAnalysis(const tuner::AsyncAnalysis& analysis, std::string choice) {
  beginResetModel();
  options_ = analysis.options;
  replay_sync_ns_ = analysis.replay_sync_ns;
  choice_ = std::move(choice);
  endResetModel();
}

void AsyncOptionsModel::clear() {
  setAnalysis({}, {});
}

int AsyncOptionsModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(options_.size());
}
int AsyncOptionsModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant AsyncOptionsModel::data(const QModelIndex& index, int role) const {
  if (!validCell(*this, index)) return {};
  const tuner::AsyncOption& o = options_[static_cast<std::size_t>(index.row())];
  const int column = index.column();
  const bool chosen = !choice_.empty() && o.strategy == choice_;
  // On the step, as a share of the replayed synchronous step: the saving's interval reversed.
  const bool shares = replay_sync_ns_ > 0;
  const double on_step = shares ? -o.saving_ns / replay_sync_ns_ : 0;
  const double on_step_low = shares ? -o.saving_high_ns / replay_sync_ns_ : 0;
  const double on_step_high = shares ? -o.saving_low_ns / replay_sync_ns_ : 0;
  if (role == Qt::TextAlignmentRole) return alignment(column == ColStrategy);
  if (role == Qt::FontRole && chosen) {
    QFont font;
    font.setBold(true);
    return font;
  }
  // Surely faster (the whole interval below the synchronous step): green, as the sizes' gains are.
  if (role == Qt::ForegroundRole && column == ColOnStep && shares && on_step_high < 0)
    return QBrush(QColor(0x2e, 0x7d, 0x32));
  if (role == Qt::ToolTipRole) {
    if (chosen) return QStringLiteral("The plan uses %1 for every reduction.").arg(toQString(o.strategy));
    if (!o.error_median) return QStringLiteral("Its error was not measured: run explore mode.");
    return {};
  }
  if (role == kSortRole) {
    switch (column) {
      case ColStrategy: return toQString(o.strategy);
      case ColStep: return o.step_ns;
      case ColOnStep: return on_step;
      case ColErrorMedian: return o.error_median.value_or(-1.0);
      case ColErrorWorst: return o.error_worst.value_or(-1.0);
      case ColSamples: return QVariant::fromValue<qint64>(o.error_samples);
      default: return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  switch (column) {
    case ColStrategy: return toQString(o.strategy);
    case ColStep: return durationText(o.step_ns);
    case ColOnStep:
      if (!shares) return QStringLiteral("–");
      return QStringLiteral("%1 % [%2, %3]")
          .arg(signedShare(on_step), signedShare(on_step_low), signedShare(on_step_high));
    case ColErrorMedian: return errorText(o.error_median);
    case ColErrorWorst: return errorText(o.error_worst);
    case ColSamples:
      return o.error_samples > 0 ? QVariant::fromValue<qint64>(o.error_samples)
                                 : QVariant(QStringLiteral("–"));
    default: return {};
  }
}

QVariant AsyncOptionsModel::headerData(int section, Qt::Orientation orientation, int role) const {
  static const char* const kNames[] = {"Strategy",     "Replayed step", "On the step [95%]",
                                       "Median error", "Worst error",   "Samples"};
  return header(kNames, ColumnCount, section, orientation, role);
}

// ---- CheckModel

void CheckModel::setComparisons(std::vector<tuner::KeyComparison> comparisons) {
  beginResetModel();
  rows_ = std::move(comparisons);
  endResetModel();
}

int CheckModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int CheckModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant CheckModel::data(const QModelIndex& index, int role) const {
  if (!validCell(*this, index)) return {};
  const tuner::KeyComparison& c = rows_[static_cast<std::size_t>(index.row())];
  const int column = index.column();
  if (role == Qt::TextAlignmentRole) {
    return alignment(column == ColVerdict || column == ColStrategy || column == ColCollective ||
                     column == ColDtype || column == ColReason);
  }
  if (role == Qt::ForegroundRole && (column == ColVerdict || column == ColChange))
    return verdictBrush(c.verdict);
  if (role == kSortRole) {
    switch (column) {
      case ColVerdict: return static_cast<int>(c.verdict);
      case ColStrategy: return toQString(c.key.strategy);
      case ColCollective: return static_cast<int>(c.key.collective);
      case ColDtype: return static_cast<int>(c.key.dtype);
      case ColBytes: return QVariant::fromValue<qint64>(c.key.bytes);
      case ColWorld: return c.key.world;
      case ColBaseline: return c.baseline_median_ns;
      case ColCurrent: return c.current_median_ns;
      case ColChange: return c.change;
      case ColPValue: return c.p_value.value_or(-1.0);
      case ColReason: return toQString(c.reason);
      default: return {};
    }
  }
  if (role == Qt::ToolTipRole && column == ColReason) return toQString(c.reason);
  if (role != Qt::DisplayRole) return {};
  switch (column) {
    case ColVerdict: return toQString(tuner::name(c.verdict));
    case ColStrategy: return toQString(c.key.strategy);
    case ColCollective: return toQString(name(c.key.collective));
    case ColDtype: return toQString(name(c.key.dtype));
    case ColBytes: return bytesText(c.key.bytes);
    case ColWorld: return c.key.world;
    case ColBaseline: return durationText(c.baseline_median_ns);
    case ColCurrent: return durationText(c.current_median_ns);
    case ColChange: return changeText(c.change);
    case ColPValue: return c.p_value ? QString::number(*c.p_value, 'g', 3) : QStringLiteral("–");
    case ColReason: return toQString(c.reason);
    default: return {};
  }
}

QVariant CheckModel::headerData(int section, Qt::Orientation orientation, int role) const {
  static const char* const kNames[] = {"Verdict",  "Strategy", "Collective", "Dtype",   "Size", "World",
                                       "Baseline", "Current",  "Change",     "p-value", "Why"};
  return header(kNames, ColumnCount, section, orientation, role);
}

// ---- RunComparisonModel

void RunComparisonModel::setRuns(std::vector<tuner::RunComparison> runs) {
  beginResetModel();
  rows_ = std::move(runs);
  endResetModel();
}

int RunComparisonModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int RunComparisonModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant RunComparisonModel::data(const QModelIndex& index, int role) const {
  if (!validCell(*this, index)) return {};
  const tuner::RunComparison& c = rows_[static_cast<std::size_t>(index.row())];
  const int column = index.column();
  if (role == Qt::TextAlignmentRole)
    return alignment(column == ColVerdict || column == ColFigure || column == ColEvidence);
  if (role == Qt::ForegroundRole && (column == ColVerdict || column == ColChange))
    return verdictBrush(c.verdict);
  if (role == kSortRole) {
    switch (column) {
      case ColVerdict: return static_cast<int>(c.verdict);
      case ColFigure: return toQString(c.what);
      case ColBaseline: return c.baseline_ns;
      case ColCurrent: return c.current_ns;
      case ColChange: return c.change;
      case ColEvidence: return c.p_value.value_or(-1.0);
      default: return {};
    }
  }
  if (role == Qt::ToolTipRole) {
    switch (column) {
      case ColBaseline: return QStringLiteral("Median over the baseline's %1 steps").arg(c.baseline_steps);
      case ColCurrent: return QStringLiteral("Median over the current trace's %1 steps").arg(c.current_steps);
      case ColEvidence:
        return c.p_value ? QStringLiteral("%1\np = %2").arg(toQString(c.reason)).arg(*c.p_value, 0, 'g', 3)
                         : toQString(c.reason);
      default: return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  switch (column) {
    case ColVerdict: return toQString(tuner::name(c.verdict));
    case ColFigure: return toQString(c.what);
    case ColBaseline: return durationText(c.baseline_ns);
    case ColCurrent: return durationText(c.current_ns);
    case ColChange: return changeText(c.change);
    case ColEvidence: return toQString(c.reason);
    default: return {};
  }
}

QVariant RunComparisonModel::headerData(int section, Qt::Orientation orientation, int role) const {
  static const char* const kNames[] = {"Verdict",        "Figure", "Baseline / step",
                                       "Current / step", "Change", "Evidence"};
  return header(kNames, ColumnCount, section, orientation, role);
}

}  // namespace gradscope::gui
