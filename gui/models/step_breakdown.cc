#include "models/step_breakdown.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include <QBrush>

#include "gradscope/common/units.h"
#include "models/palette.h"
#include "models/units_text.h"

namespace gradscope::gui {

// ---- natural order

namespace {
bool isDigit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}
}  // namespace

int compareNatural(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (isDigit(a[i]) && isDigit(b[j])) {
      // Compare the numbers without converting them (any length): skip leading zeros, then the longer run
      // of digits is larger, then the first differing digit decides.
      const std::size_t a_start = i, b_start = j;
      while (i < a.size() && isDigit(a[i])) ++i;
      while (j < b.size() && isDigit(b[j])) ++j;
      std::string_view x = a.substr(a_start, i - a_start), y = b.substr(b_start, j - b_start);
      const std::size_t x_zeros = std::min(x.find_first_not_of('0'), x.size());
      const std::size_t y_zeros = std::min(y.find_first_not_of('0'), y.size());
      const std::string_view x_digits = x.substr(x_zeros), y_digits = y.substr(y_zeros);
      if (x_digits.size() != y_digits.size()) return x_digits.size() < y_digits.size() ? -1 : 1;
      if (const int c = x_digits.compare(y_digits); c != 0) return c < 0 ? -1 : 1;
      if (x_zeros != y_zeros) return x_zeros > y_zeros ? -1 : 1;  // "007" before "7": a total order
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]) ? -1 : 1;
    ++i;
    ++j;
  }
  if (i < a.size()) return 1;
  if (j < b.size()) return -1;
  return 0;
}

// ---- figures and colours

QString stepFigureName(StepFigure figure) {
  switch (figure) {
    case StepFigure::Exposed: return QStringLiteral("exposed communication");
    case StepFigure::Waiting: return QStringLiteral("waiting");
    case StepFigure::StepTime: return QStringLiteral("step time");
    case StepFigure::Caused: return QStringLiteral("caused waiting");
  }
  return {};
}

QColor stepFigureColour(StepFigure figure) {
  // Tableau 10 (palette.h): orange and red for the communication the bars stack, blue for time, purple
  // for what a rank made the others wait.
  switch (figure) {
    case StepFigure::Exposed: return paletteColor(1);
    case StepFigure::Waiting: return paletteColor(2);
    case StepFigure::StepTime: return paletteColor(0);
    case StepFigure::Caused: return paletteColor(6);
  }
  return paletteColor(9);
}

QColor stepRampColour(StepFigure figure, double share) {
  // Three stops: a light tint (never white, so a cell with a step reads as one), the palette colour, and
  // the colour darkened, so that the top of the scale stands out from the middle.
  const QColor base = stepFigureColour(figure);
  const QColor light(base.red() + (255 - base.red()) * 88 / 100,
                     base.green() + (255 - base.green()) * 88 / 100,
                     base.blue() + (255 - base.blue()) * 88 / 100);
  const QColor dark = base.darker(190);
  const double s = std::clamp(std::isfinite(share) ? share : 0.0, 0.0, 1.0);
  const auto mix = [](const QColor& a, const QColor& b, double f) {
    const auto channel = [f](int x, int y) { return static_cast<int>(std::lround(x + (y - x) * f)); };
    return QColor(channel(a.red(), b.red()), channel(a.green(), b.green()), channel(a.blue(), b.blue()));
  };
  return s < 0.5 ? mix(light, base, s / 0.5) : mix(base, dark, (s - 0.5) / 0.5);
}

// ---- StepBreakdown

const storage::StepRecord* StepBreakdown::cell(int rank_index, int step_index) const {
  if (rank_index < 0 || step_index < 0 || rank_index >= static_cast<int>(ranks.size()) ||
      step_index >= static_cast<int>(steps.size()))
    return nullptr;
  const std::int64_t row =
      cell_row[static_cast<std::size_t>(rank_index) * steps.size() + static_cast<std::size_t>(step_index)];
  return row < 0 ? nullptr : &rows[static_cast<std::size_t>(row)];
}

StepParts StepBreakdown::parts(int step_index, std::optional<int> rank_index) const {
  StepParts parts;
  if (step_index < 0 || step_index >= static_cast<int>(steps.size())) return parts;
  if (!rank_index) {
    const storage::StepTotals& t = totals[static_cast<std::size_t>(step_index)];
    parts.compute_ns = t.compute_ns;
    parts.exposed_only_ns = t.exposed_ns - t.waiting_ns;
    parts.waiting_ns = t.waiting_ns;
    parts.hidden_ns = t.hidden_ns;
    return parts;
  }
  if (const storage::StepRecord* row = cell(*rank_index, step_index)) {
    parts.compute_ns = static_cast<double>(row->compute_ns);
    parts.exposed_only_ns = static_cast<double>(row->exposed_ns - row->waiting_ns);
    parts.waiting_ns = static_cast<double>(row->waiting_ns);
    parts.hidden_ns = static_cast<double>(row->hidden_ns);
  }
  return parts;
}

std::optional<double> StepBreakdown::value(int rank_index, int step_index, StepFigure figure) const {
  const storage::StepRecord* row = cell(rank_index, step_index);
  if (row == nullptr) return std::nullopt;
  // A GPU step outside the sampled windows has its time only: its other cells stay blank.
  if (row->basis == storage::StepBasis::GpuUnsampled && figure != StepFigure::StepTime) return std::nullopt;
  switch (figure) {
    case StepFigure::Exposed: return static_cast<double>(row->exposed_ns);
    case StepFigure::Waiting: return static_cast<double>(row->waiting_ns);
    case StepFigure::StepTime: return static_cast<double>(row->end_ns - row->start_ns);
    case StepFigure::Caused: return static_cast<double>(row->caused_ns);
  }
  return std::nullopt;
}

TimeRange StepBreakdown::stepRange(int step_index, std::optional<int> rank_index) const {
  if (step_index < 0 || step_index >= static_cast<int>(steps.size())) return {};
  if (!rank_index) {
    return {static_cast<double>(step_begin_ns[static_cast<std::size_t>(step_index)]),
            static_cast<double>(step_end_ns[static_cast<std::size_t>(step_index)])};
  }
  const storage::StepRecord* row = cell(*rank_index, step_index);
  if (row == nullptr) return {};
  const std::int64_t offset = ranks[static_cast<std::size_t>(*rank_index)].clock_offset_ns;
  return {static_cast<double>(row->start_ns + offset), static_cast<double>(row->end_ns + offset)};
}

QString StepBreakdown::rankLabel(int rank_index) const {
  if (rank_index < 0 || rank_index >= static_cast<int>(ranks.size())) return {};
  const StepRank& rank = ranks[static_cast<std::size_t>(rank_index)];
  return QStringLiteral("rank %1 · %2").arg(rank.rank).arg(QString::fromStdString(rank.host));
}

StepBreakdown buildStepBreakdown(std::vector<storage::RankInfo> ranks,
                                 std::vector<storage::StepRecord> rows) {
  StepBreakdown breakdown;
  // Rows: the ranks that have steps, by rank number; hosts break ties (several runs in one file).
  std::map<std::int64_t, const storage::RankInfo*> by_id;
  for (const storage::RankInfo& rank : ranks) by_id[rank.id] = &rank;
  std::vector<std::int64_t> ids;
  for (const storage::StepRecord& row : rows) {
    if (ids.empty() || ids.back() != row.rank_id) ids.push_back(row.rank_id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (const std::int64_t id : ids) {
    StepRank rank;
    rank.rank_id = id;
    rank.rank = static_cast<int>(id);
    if (const auto found = by_id.find(id); found != by_id.end()) {
      rank.rank = found->second->rank;
      rank.host = found->second->host;
      rank.clock_offset_ns = found->second->clock_offset_ns;
    }
    breakdown.ranks.push_back(std::move(rank));
  }
  std::sort(breakdown.ranks.begin(), breakdown.ranks.end(), [](const StepRank& a, const StepRank& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (const int c = compareNatural(a.host, b.host); c != 0) return c < 0;
    return a.rank_id < b.rank_id;
  });
  for (const StepRank& rank : breakdown.ranks) breakdown.hosts.push_back(rank.host);
  std::sort(breakdown.hosts.begin(), breakdown.hosts.end(), naturalLess);
  breakdown.hosts.erase(std::unique(breakdown.hosts.begin(), breakdown.hosts.end()), breakdown.hosts.end());

  // stepTotals wants rows by rank id, then step (computeStepModel's order); stored rows come that way too,
  // but sorting costs little and keeps the promise.
  std::sort(rows.begin(), rows.end(), [](const storage::StepRecord& a, const storage::StepRecord& b) {
    return a.rank_id != b.rank_id ? a.rank_id < b.rank_id : a.step < b.step;
  });
  breakdown.totals = storage::stepTotals(rows);
  for (const storage::StepTotals& t : breakdown.totals) breakdown.steps.push_back(t.step);
  std::map<std::int64_t, std::size_t> rank_index, step_index;
  for (std::size_t i = 0; i < breakdown.ranks.size(); ++i) rank_index[breakdown.ranks[i].rank_id] = i;
  for (std::size_t i = 0; i < breakdown.steps.size(); ++i) step_index[breakdown.steps[i]] = i;
  breakdown.cell_row.assign(breakdown.ranks.size() * breakdown.steps.size(), -1);
  breakdown.step_begin_ns.assign(breakdown.steps.size(), 0);
  breakdown.step_end_ns.assign(breakdown.steps.size(), 0);
  std::vector<bool> seen(breakdown.steps.size(), false);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const storage::StepRecord& row = rows[i];
    const auto r = rank_index.find(row.rank_id);
    const auto s = step_index.find(row.step);
    if (r == rank_index.end() || s == step_index.end()) continue;
    breakdown.cell_row[r->second * breakdown.steps.size() + s->second] = static_cast<std::int64_t>(i);
    const std::int64_t offset = breakdown.ranks[r->second].clock_offset_ns;
    const std::int64_t begin = row.start_ns + offset, end = row.end_ns + offset;
    if (!seen[s->second]) {
      breakdown.step_begin_ns[s->second] = begin;
      breakdown.step_end_ns[s->second] = end;
      seen[s->second] = true;
    } else {
      breakdown.step_begin_ns[s->second] = std::min(breakdown.step_begin_ns[s->second], begin);
      breakdown.step_end_ns[s->second] = std::max(breakdown.step_end_ns[s->second], end);
    }
  }
  breakdown.rows = std::move(rows);
  return breakdown;
}

StepBreakdown loadStepBreakdown(const storage::TraceReader& reader) {
  return buildStepBreakdown(reader.ranks(), storage::readOrComputeSteps(reader));
}

// ---- StepBreakdownModel

void StepBreakdownModel::setBreakdown(StepBreakdown breakdown) {
  beginResetModel();
  breakdown_ = std::move(breakdown);
  rescale();
  endResetModel();
}

void StepBreakdownModel::setFigure(StepFigure figure) {
  if (figure == figure_) return;
  figure_ = figure;
  rescale();
  if (!breakdown_.ranks.empty() && !breakdown_.steps.empty()) {
    emit dataChanged(index(0, 0), index(rowCount() - 1, columnCount() - 1));
  }
}

void StepBreakdownModel::rescale() {
  bool any = false;
  double low = 0, high = 0;
  for (int r = 0; r < rowCount(); ++r) {
    for (int s = 0; s < columnCount(); ++s) {
      const std::optional<double> v = breakdown_.value(r, s, figure_);
      if (!v) continue;
      low = any ? std::min(low, *v) : *v;
      high = any ? std::max(high, *v) : *v;
      any = true;
    }
  }
  // From the smallest value, not from 0: the ranks of a step are alike, and what the heatmap is for is
  // the difference between them (a straggler's row); the legend says where the scale starts.
  low_ = low;
  high_ = high;
}

double StepBreakdownModel::share(double value) const {
  if (!(high_ > low_)) return value > low_ ? 1.0 : 0.0;
  return std::clamp((value - low_) / (high_ - low_), 0.0, 1.0);
}

QString StepBreakdownModel::cellToolTip(int rank_index, int step_index) const {
  const storage::StepRecord* row = breakdown_.cell(rank_index, step_index);
  if (row == nullptr) return {};
  const std::int64_t step = breakdown_.steps[static_cast<std::size_t>(step_index)];
  const std::optional<double> v = breakdown_.value(rank_index, step_index, figure_);
  if (row->basis == storage::StepBasis::GpuUnsampled)
    return QStringLiteral(
               "<b>%1, step %2</b><br>step time %3<br>%4 calls<hr>outside the agent's sampled GPU windows: "
               "no breakdown (GRADSCOPE_GPU_WINDOWS)<br><i>click: show it on the timeline</i>")
        .arg(breakdown_.rankLabel(rank_index).toHtmlEscaped())
        .arg(step)
        .arg(spanText(static_cast<double>(row->end_ns - row->start_ns)))
        .arg(row->calls);
  const QString gpu = row->basis == storage::StepBasis::Gpu
                          ? QStringLiteral("<br>measured on the GPU: idle %1 (no kernel running)")
                                .arg(spanText(static_cast<double>(row->idle_ns)))
                          : QString();
  return QStringLiteral(
             "<b>%1, step %2</b><br>%3: <b>%4</b><hr>step time %5<br>compute %6<br>exposed communication %7 "
             "(waiting %8)<br>hidden communication %9<br>made others wait %10<br>%11 calls%12<br><i>click: "
             "show it on the timeline</i>")
      .arg(breakdown_.rankLabel(rank_index).toHtmlEscaped())
      .arg(step)
      .arg(stepFigureName(figure_), spanText(v.value_or(0)),
           spanText(static_cast<double>(row->end_ns - row->start_ns)),
           spanText(static_cast<double>(row->compute_ns)), spanText(static_cast<double>(row->exposed_ns)),
           spanText(static_cast<double>(row->waiting_ns)), spanText(static_cast<double>(row->hidden_ns)),
           spanText(static_cast<double>(row->caused_ns)))
      .arg(row->calls)
      .arg(gpu);
}

QString StepBreakdownModel::barToolTip(int step_index, std::optional<int> rank_index) const {
  if (step_index < 0 || step_index >= columnCount()) return {};
  const StepParts p = breakdown_.parts(step_index, rank_index);
  const storage::StepTotals& t = breakdown_.totals[static_cast<std::size_t>(step_index)];
  QString text = QStringLiteral(
                     "<b>step %1</b>, %2<br>compute %3<br>exposed communication %4<br>of it "
                     "waiting %5<br>hidden communication %6")
                     .arg(t.step)
                     .arg(rank_index ? breakdown_.rankLabel(*rank_index).toHtmlEscaped()
                                     : QStringLiteral("mean over %1 ranks").arg(t.ranks),
                          spanText(p.compute_ns), spanText(p.exposed_only_ns + p.waiting_ns),
                          spanText(p.waiting_ns), spanText(p.hidden_ns));
  if (!rank_index) {
    text += QStringLiteral("<br>slowest rank's span %1").arg(spanText(static_cast<double>(t.span_ns)));
    if (t.last_rank_id >= 0) {
      const auto last = std::find_if(breakdown_.ranks.begin(), breakdown_.ranks.end(),
                                     [&](const StepRank& r) { return r.rank_id == t.last_rank_id; });
      const QString who = last != breakdown_.ranks.end()
                              ? breakdown_.rankLabel(static_cast<int>(last - breakdown_.ranks.begin()))
                              : QStringLiteral("rank id %1").arg(t.last_rank_id);
      text += QStringLiteral("<br>ranks waited %1 in all, most for %2")
                  .arg(spanText(static_cast<double>(t.lost_ns)), who.toHtmlEscaped());
    }
  }
  return text + QStringLiteral("<br><i>click: show the step on the timeline</i>");
}

int StepBreakdownModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(breakdown_.ranks.size());
}

int StepBreakdownModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(breakdown_.steps.size());
}

QVariant StepBreakdownModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  const std::optional<double> v = breakdown_.value(index.row(), index.column(), figure_);
  switch (role) {
    case Qt::DisplayRole: return v ? spanText(*v) : QString();
    case kValueRole: return v ? QVariant(*v) : QVariant();
    case Qt::BackgroundRole: return v ? QVariant(QBrush(stepRampColour(figure_, share(*v)))) : QVariant();
    case Qt::ToolTipRole: return cellToolTip(index.row(), index.column());
    default: return {};
  }
}

QVariant StepBreakdownModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (role != Qt::DisplayRole || section < 0) return {};
  if (orientation == Qt::Vertical) {
    if (section >= rowCount()) return {};
    return QStringLiteral("rank %1").arg(breakdown_.ranks[static_cast<std::size_t>(section)].rank);
  }
  if (section >= columnCount()) return {};
  return QStringLiteral("step %1").arg(breakdown_.steps[static_cast<std::size_t>(section)]);
}

// ---- the scene

namespace {

// A duration axis's label in one unit for the whole axis, the one that makes its largest value at least 1
// ("20 ms", "40 ms", not "0.02 s"), with the decimals the step needs.
QString axisLabel(double ns, double step_ns, double largest_ns) {
  struct Unit {
    double ns;
    const char* name;
  };
  constexpr Unit kUnits[] = {{1e9, "s"}, {1e6, "ms"}, {1e3, "us"}, {1, "ns"}};
  Unit unit = kUnits[3];
  for (const Unit& u : kUnits) {
    if (largest_ns >= u.ns) {
      unit = u;
      break;
    }
  }
  const double step = step_ns / unit.ns;
  const int decimals = step >= 1 ? 0 : std::min(3, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  return QStringLiteral("%1 %2").arg(ns / unit.ns, 0, 'f', decimals).arg(QLatin1String(unit.name));
}

// Colours of the bars' parts: compute a neutral grey, so that communication stands out.
QRgb computeColour() {
  return paletteColor(9).rgb();
}

// The room left of the plots: the bars' duration labels and the heatmap's rank labels.
int gutterWidth(const StepBreakdown& breakdown, bool host_labels, const TextMetrics& text) {
  int width = text.width(QStringLiteral("999.9 ms"));
  width = std::max(width, text.width(QStringLiteral("rank")));
  if (host_labels) {
    for (int r = 0; r < static_cast<int>(breakdown.ranks.size()); ++r)
      width = std::max(width, text.width(breakdown.rankLabel(r)));
  } else if (!breakdown.ranks.empty()) {
    width = std::max(width, text.width(QString::number(breakdown.ranks.back().rank)));
  }
  return width + 10;
}

int legendAreaWidth(const TextMetrics& text) {
  return 14 + kStepsLegendWidth + 6 + text.width(QStringLiteral("999.9 ms")) + kStepsMargin;
}

// Rows at most this tall: a few ranks leave the space to the bars.
constexpr int kMaxRowHeight = 28;
// Rows at least this tall carry "rank N · host"; thinner rows get labels every few ranks.
int labelledRowHeight(const TextMetrics& text) {
  return text.height + 2;
}

}  // namespace

int StepsScene::columnLeft(int step_index) const {
  return bars.left() + static_cast<int>(std::floor(step_index * column_width));
}

int StepsScene::columnRight(int step_index) const {
  return std::max(columnLeft(step_index) + 1, columnLeft(step_index + 1));
}

std::optional<std::pair<int, int>> StepsScene::cellAt(QPoint point) const {
  if (steps <= 0 || ranks <= 0 || !heatmap.contains(point) || column_width <= 0) return std::nullopt;
  const int rank = (point.y() - heatmap.top()) / std::max(1, row_height);
  const int step = static_cast<int>(std::floor((point.x() - heatmap.left()) / column_width));
  if (rank < 0 || rank >= ranks || step < 0 || step >= steps) return std::nullopt;
  return std::pair{rank, step};
}

std::optional<int> StepsScene::barAt(QPoint point) const {
  if (steps <= 0 || !bars.contains(point) || column_width <= 0) return std::nullopt;
  const int step = static_cast<int>(std::floor((point.x() - bars.left()) / column_width));
  if (step < 0 || step >= steps) return std::nullopt;
  return step;
}

int stepsMinimumHeight(int ranks, const TextMetrics& text) {
  // Top legend, bars, the heatmap's title, one pixel row per rank, step labels and the axis title.
  return kStepsMargin + text.height + 6 + kStepsMinBarsHeight + 2 * text.height + 8 + std::max(ranks, 1) +
         2 * text.height + 6 + kStepsMargin;
}

StepsScene buildStepsScene(const StepBreakdownModel& model, QSize size, const TextMetrics& text,
                           std::optional<int> bar_rank) {
  StepsScene scene;
  scene.size = size;
  const StepBreakdown& data = model.breakdown();
  if (data.empty()) {
    scene.message = SceneText{
        QRect(kStepsMargin, kStepsMargin, std::max(1, size.width() - 2 * kStepsMargin), 3 * text.height),
        QStringLiteral(
            "No training steps in this trace: its calls have no step markers and merge detected no "
            "repeating pattern. Merge the rank files with `gradscope merge` (it detects steps)."),
        false};
    return scene;
  }
  scene.steps = static_cast<int>(data.steps.size());
  scene.ranks = static_cast<int>(data.ranks.size());
  if (bar_rank && (*bar_rank < 0 || *bar_rank >= scene.ranks)) bar_rank.reset();

  // Vertical budget: legend, bars, heatmap title, heatmap, step labels and title.
  const int top = kStepsMargin + text.height + 8;
  const int bottom_room = 2 * text.height + 6 + kStepsMargin;
  const int title_room = 2 * text.height + 8;  // the gap under the bars, then the heatmap's title
  const int available = std::max(0, size.height() - top - bottom_room - title_room);
  // The heatmap takes what the bars' minimum leaves, up to kMaxRowHeight a row: many ranks get rows as
  // tall as fit (a straggler's row stays visible), a few leave the rest of the height to the bars.
  scene.row_height =
      std::clamp((available - kStepsMinBarsHeight) / std::max(scene.ranks, 1), 1, kMaxRowHeight);
  const bool host_labels = scene.row_height >= labelledRowHeight(text);
  const int left = kStepsMargin + gutterWidth(data, host_labels, text);
  const int plot_width = std::max(1, size.width() - left - legendAreaWidth(text));
  const int heat_height = scene.row_height * scene.ranks;
  const int bars_height = std::max(kStepsMinBarsHeight, available - heat_height);
  scene.bars = QRect(left, top, plot_width, bars_height);
  scene.column_width = static_cast<double>(plot_width) / scene.steps;
  scene.heatmap = QRect(left, scene.bars.bottom() + 1 + title_room, plot_width, heat_height);

  // ---- bars
  double largest = 0;
  std::vector<StepParts> parts;
  // GPU steps outside the sampled windows have no breakdown: their time (the slowest rank's, or the
  // rank's) is drawn as an outline instead, 0 for a step with a breakdown.
  std::vector<double> time_only(static_cast<std::size_t>(scene.steps), 0.0);
  for (int s = 0; s < scene.steps; ++s) {
    parts.push_back(data.parts(s, bar_rank));
    largest = std::max(largest, parts.back().total());
    const auto index = static_cast<std::size_t>(s);
    if (bar_rank) {
      if (const storage::StepRecord* row = data.cell(*bar_rank, s);
          row != nullptr && row->basis == storage::StepBasis::GpuUnsampled)
        time_only[index] = static_cast<double>(row->end_ns - row->start_ns);
    } else if (data.totals[index].ranks > 0 && data.totals[index].measured == 0) {
      time_only[index] = static_cast<double>(data.totals[index].span_ns);
    }
    largest = std::max(largest, time_only[index]);
  }
  const ValueAxisTicks axis = niceValueAxis(0, std::max(largest, 1.0), 5, 0.02);
  const auto y_of = [&](double ns) {
    return scene.bars.bottom() + 1 -
           static_cast<int>(std::lround(ns / (axis.max - axis.min) * scene.bars.height()));
  };
  for (int t = 0; t < axis.ticks; ++t) {
    const double v = axis.min + t * axis.step;
    if (v > axis.max + axis.step / 2) break;
    const int y = y_of(v);
    scene.bar_grid_y.push_back(y);
    scene.bar_axis_labels.push_back(
        SceneText{QRect(kStepsMargin, y - text.height / 2, left - kStepsMargin - 6, text.height),
                  axisLabel(v, axis.step, axis.max), true});
  }
  const int bar_gap = scene.column_width >= 5 ? std::max(1, static_cast<int>(scene.column_width / 5)) : 0;
  const QRgb part_colours[3] = {computeColour(), stepFigureColour(StepFigure::Exposed).rgb(),
                                stepFigureColour(StepFigure::Waiting).rgb()};
  for (int s = 0; s < scene.steps; ++s) {
    const int x0 = scene.columnLeft(s) + bar_gap / 2;
    const int width = std::max(1, scene.columnRight(s) - scene.columnLeft(s) - bar_gap);
    const double values[3] = {parts[static_cast<std::size_t>(s)].compute_ns,
                              parts[static_cast<std::size_t>(s)].exposed_only_ns,
                              parts[static_cast<std::size_t>(s)].waiting_ns};
    double base = 0;
    for (int p = 0; p < 3; ++p) {
      const int y_low = y_of(base);
      base += std::max(values[p], 0.0);
      const int y_high = y_of(base);
      if (y_low > y_high)
        scene.segments.push_back({QRect(x0, y_high, width, y_low - y_high), part_colours[p], false});
    }
    if (const double only = time_only[static_cast<std::size_t>(s)]; only > 0) {
      const int y_high = y_of(only);
      scene.segments.push_back({QRect(x0, y_high, width, y_of(0) - y_high), computeColour(), true});
    }
  }
  const bool any_time_only = std::any_of(time_only.begin(), time_only.end(), [](double v) { return v > 0; });
  scene.bar_title = SceneText{QRect(kStepsMargin, kStepsMargin, 0, text.height),
                              bar_rank ? QStringLiteral("Per step, %1:").arg(data.rankLabel(*bar_rank))
                                       : QStringLiteral("Per step, mean over %1 ranks:").arg(scene.ranks),
                              false};
  scene.bar_title.rect.setWidth(text.width(scene.bar_title.text) + 4);
  int x = scene.bar_title.rect.right() + 14;
  const QString legend_texts[3] = {QStringLiteral("compute"), QStringLiteral("exposed communication"),
                                   QStringLiteral("of it waiting for other ranks")};
  for (int p = 0; p < 3; ++p) {
    const int width = text.width(legend_texts[p]) + 4;
    scene.bar_legend.push_back({part_colours[p], SceneText{QRect(x + 16, kStepsMargin, width, text.height),
                                                           legend_texts[p], false}});
    x += 16 + width + 14;
  }
  if (any_time_only) {
    const QString label = QStringLiteral("outside the GPU windows: time only");
    scene.outline_legend =
        SceneText{QRect(x + 16, kStepsMargin, text.width(label) + 4, text.height), label, false};
    scene.outline_colour = computeColour();
    scene.outline_filled = scene.column_width < 6;
  }

  // ---- heatmap
  const int cell_gap_x = scene.column_width >= 12 && scene.row_height >= 8 ? 1 : 0;
  const int cell_gap_y = scene.row_height >= 8 ? 1 : 0;
  for (int r = 0; r < scene.ranks; ++r) {
    for (int s = 0; s < scene.steps; ++s) {
      const std::optional<double> v = data.value(r, s, model.figure());
      if (!v) continue;
      const int x0 = scene.columnLeft(s);
      scene.cells.push_back({QRect(x0, scene.heatmap.top() + r * scene.row_height,
                                   std::max(1, scene.columnRight(s) - x0 - cell_gap_x),
                                   std::max(1, scene.row_height - cell_gap_y)),
                             stepRampColour(model.figure(), model.share(*v)).rgb()});
    }
  }
  // Rank labels: every rank with its host when rows are tall enough, else rank numbers every 1, 2, 4, ...
  // ranks (as often as they fit), each with a tick.
  if (!host_labels) {
    while (scene.label_step * scene.row_height < text.height + 4 && scene.label_step < scene.ranks)
      scene.label_step *= 2;
  }
  for (int r = 0; r < scene.ranks; r += scene.label_step) {
    const int y = scene.heatmap.top() + r * scene.row_height + (host_labels ? scene.row_height / 2 : 0);
    const QString label =
        host_labels ? data.rankLabel(r) : QString::number(data.ranks[static_cast<std::size_t>(r)].rank);
    // Thin rows: the label centred on the tick, kept inside the heatmap's height.
    const int label_top = std::clamp(y - text.height / 2, scene.heatmap.top() - text.height / 2,
                                     scene.heatmap.bottom() - text.height / 2);
    scene.rank_labels.push_back(
        SceneText{QRect(kStepsMargin, label_top, left - kStepsMargin - 8, text.height), label, true});
    if (!host_labels) scene.rank_ticks_y.push_back(y);
  }
  scene.heatmap_title = SceneText{
      QRect(kStepsMargin, scene.heatmap.top() - text.height - 6, std::max(1, size.width() - 2 * kStepsMargin),
            text.height),
      QStringLiteral("%1 per rank and step   (a row per rank%2; click a cell to show it on the timeline)")
          .arg(stepFigureName(model.figure()).replace(0, 1, stepFigureName(model.figure()).at(0).toUpper()),
               host_labels ? QString() : QStringLiteral(", ranks labelled every %1").arg(scene.label_step)),
      false};

  // Step labels under the heatmap: every 1, 2, 5, 10, ... steps, as often as they fit.
  const int step_label_width = text.width(QString::number(data.steps.back())) + 10;
  int step_every = 1;
  for (int k = 0; step_every * scene.column_width < step_label_width && step_every < scene.steps; ++k)
    step_every = (k % 3 == 0 ? 2 : k % 3 == 1 ? 5 : 10) * static_cast<int>(std::pow(10, k / 3));
  const int label_y = scene.heatmap.bottom() + 4;
  for (int s = 0; s < scene.steps; s += step_every) {
    const QString label = QString::number(data.steps[static_cast<std::size_t>(s)]);
    const int width = text.width(label) + 2;
    const int centre = (scene.columnLeft(s) + scene.columnRight(s)) / 2;
    scene.step_labels.push_back(
        SceneText{QRect(centre - width / 2, label_y, width, text.height), label, false});
  }
  scene.step_axis_title = SceneText{QRect(left, label_y + text.height + 2, plot_width, text.height),
                                    QStringLiteral("step →"), false};

  // The legend: the ramp beside the heatmap, the highest value at the top.
  const int scale_height = std::max(std::min(heat_height, 220), 3 * text.height);
  scene.scale = QRect(scene.heatmap.right() + 15, scene.heatmap.top(), kStepsLegendWidth, scale_height);
  const int label_left = scene.scale.right() + 7;
  const int label_width = std::max(1, size.width() - label_left - 4);
  const auto scale_label = [&](double value, int y) {
    scene.scale_labels.push_back(
        SceneText{QRect(label_left, y - text.height / 2, label_width, text.height), spanText(value), false});
  };
  scale_label(model.scaleHigh(), scene.scale.top() + text.height / 2);
  scale_label((model.scaleHigh() + model.scaleLow()) / 2, scene.scale.top() + scene.scale.height() / 2);
  scale_label(model.scaleLow(), scene.scale.bottom() - text.height / 2);
  return scene;
}

}  // namespace gradscope::gui
