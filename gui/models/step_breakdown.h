#pragma once

// The Steps tab's data: where each rank's training step went (storage/step_model.h, docs/schema.md
// "Steps"), as plain data loaded on a pool thread (loadStepBreakdown), an item model over its rank × step
// cells (StepBreakdownModel), and the scene the widget paints (buildStepsScene), as the timeline and the
// communication matrix keep their layout apart from their painting.
//
// - Bars, one per step: the mean over the ranks (storage::stepTotals) of compute, exposed communication
//   that was not waiting, and waiting; hidden (overlapped) communication as an extra figure. Or one rank's
//   own figures.
// - Cells, one per (rank, step): the chosen figure (exposed communication, waiting, step time, caused
//   waiting), coloured on a ramp of the figure's palette colour from its smallest to its largest value.
// - Times for the timeline: a step's span moved onto rank 0's clock (ranks.clock_offset_ns added).
//
// Rows are ranks in rank order (then host, naturally: node2 before node10); hosts are listed naturally.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <QAbstractTableModel>
#include <QColor>
#include <QRect>
#include <QSize>

#include "gradscope/storage/reader.h"
#include "gradscope/storage/step_model.h"
#include "models/analysis_models.h"
#include "models/scene_text.h"
#include "models/timeline_math.h"

namespace gradscope::gui {

// Natural order: runs of digits compare by their number ("node2" < "node10"), everything else by byte;
// equal numbers with more leading zeros first, so that the order is total. < 0, 0, > 0 like strcmp.
int compareNatural(std::string_view a, std::string_view b);
inline bool naturalLess(std::string_view a, std::string_view b) {
  return compareNatural(a, b) < 0;
}

enum class StepFigure { Exposed, Waiting, StepTime, Caused };
inline constexpr int kStepFigureCount = 4;
QString stepFigureName(StepFigure figure);  // "exposed communication", ...
// The palette colour of a figure (also its bar segment's colour where it has one).
QColor stepFigureColour(StepFigure figure);
// The heatmap's ramp for a figure: share 0 a light tint of its colour, 1 its darkest.
QColor stepRampColour(StepFigure figure, double share);

// The stacked bar of one step: compute + exposed_only + waiting = the span (of the mean rank, or of one).
struct StepParts {
  double compute_ns = 0;
  double exposed_only_ns = 0;  // exposed communication that was not waiting
  double waiting_ns = 0;
  double hidden_ns = 0;  // not in the bar: overlapped with compute
  double total() const { return compute_ns + exposed_only_ns + waiting_ns; }
};

struct StepRank {
  std::int64_t rank_id = 0;  // ranks.id
  int rank = 0;
  std::string host;
  std::int64_t clock_offset_ns = 0;
};

struct StepBreakdown {
  std::vector<StepRank> ranks;              // the heatmap's rows: by rank, then host (natural), id
  std::vector<std::string> hosts;           // distinct, in natural order
  std::vector<std::int64_t> steps;          // the columns, ascending
  std::vector<storage::StepTotals> totals;  // one per column
  std::vector<storage::StepRecord> rows;    // as readOrComputeSteps returned them
  std::vector<std::int64_t> cell_row;       // ranks × steps: index into rows, -1 where the rank has none
  std::vector<std::int64_t> step_begin_ns;  // per column: its earliest start on rank 0's clock
  std::vector<std::int64_t> step_end_ns;    // per column: its latest end on rank 0's clock

  bool empty() const { return steps.empty(); }
  const storage::StepRecord* cell(int rank_index, int step_index) const;
  // Mean over ranks (rank_index nullopt: exactly stepTotals' means) or one rank's own figures.
  StepParts parts(int step_index, std::optional<int> rank_index = std::nullopt) const;
  // A figure of one cell; nullopt where the rank has no such step.
  std::optional<double> value(int rank_index, int step_index, StepFigure figure) const;
  // The step on rank 0's clock: one rank's span, or every rank's (earliest start to latest end).
  TimeRange stepRange(int step_index, std::optional<int> rank_index = std::nullopt) const;
  // "rank 3 · node1"
  QString rankLabel(int rank_index) const;
};

// `ranks` as TraceReader::ranks() returns them, `rows` as readOrComputeSteps does.
StepBreakdown buildStepBreakdown(std::vector<storage::RankInfo> ranks, std::vector<storage::StepRecord> rows);
StepBreakdown loadStepBreakdown(const storage::TraceReader& reader);

// Rows ranks, columns steps. Qt::DisplayRole: the figure's value as short text ("" without a step);
// kValueRole: nanoseconds as a double; Qt::BackgroundRole: the heatmap's colour; Qt::ToolTipRole: rank,
// host, step and every figure. Headers: "rank N" down, "step N" across.
class StepBreakdownModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  static constexpr int kValueRole = kSortRole;

  using QAbstractTableModel::QAbstractTableModel;
  void setBreakdown(StepBreakdown breakdown);
  const StepBreakdown& breakdown() const { return breakdown_; }
  void setFigure(StepFigure figure);
  StepFigure figure() const { return figure_; }

  // The heatmap's scale for the current figure: [low, high] over every cell (low 0 except for step time,
  // whose cells differ little from the smallest).
  double scaleLow() const { return low_; }
  double scaleHigh() const { return high_; }
  double share(double value) const;  // where a value falls on the scale, [0, 1]
  QString cellToolTip(int rank_index, int step_index) const;
  QString barToolTip(int step_index, std::optional<int> rank_index) const;

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  void rescale();
  StepBreakdown breakdown_;
  StepFigure figure_ = StepFigure::Exposed;
  double low_ = 0, high_ = 0;
};

// ---- the scene

inline constexpr int kStepsMargin = 12;
inline constexpr int kStepsLegendWidth = 14;  // the colour scale's bar
inline constexpr int kStepsMinBarsHeight = 150;

struct StepBarSegment {
  QRect rect;
  QRgb colour = 0;
  // A GPU step outside the agent's sampled windows: its time only, drawn as an outline.
  bool outline = false;
};

struct StepsScene {
  QSize size;
  std::optional<SceneText> message;  // instead of charts: why there are none

  // Columns shared by both charts: step i spans [x(i), x(i + 1)) within `bars.left()`..`bars.right()`.
  int steps = 0, ranks = 0;
  double column_width = 0;
  int columnLeft(int step_index) const;
  int columnRight(int step_index) const;  // exclusive

  QRect bars;                              // the bar chart's plot area
  std::vector<StepBarSegment> segments;    // compute, exposed only, waiting, per step, bottom up
  std::vector<SceneText> bar_axis_labels;  // the y axis's durations
  std::vector<int> bar_grid_y;             // their grid lines
  SceneText bar_title;
  std::vector<std::pair<QRgb, SceneText>> bar_legend;  // swatch colour, its text
  std::optional<SceneText> outline_legend;             // the outline bars' entry, when there are any
  QRgb outline_colour = 0;
  // Columns too narrow for a dashed outline (under 6 pixels): the time-only bars are filled, pale.
  bool outline_filled = false;

  QRect heatmap;  // ranks × steps
  int row_height = 1;
  std::vector<StepBarSegment> cells;   // those with a step
  std::vector<SceneText> rank_labels;  // every label_step ranks; ticks only when rows are thin
  std::vector<int> rank_ticks_y;
  int label_step = 1;
  std::vector<SceneText> step_labels;  // under the heatmap
  SceneText heatmap_title, step_axis_title;
  QRect scale;  // the legend's ramp: top the highest value
  std::vector<SceneText> scale_labels;

  // What lies under a point: a heatmap cell (rank index, step index), a bar (step index).
  std::optional<std::pair<int, int>> cellAt(QPoint point) const;
  std::optional<int> barAt(QPoint point) const;
};

// The height that keeps every rank at least one pixel row (the widget scrolls beyond).
int stepsMinimumHeight(int ranks, const TextMetrics& text);
// bar_rank: the bars of one rank (an index into ranks), else the mean over ranks.
StepsScene buildStepsScene(const StepBreakdownModel& model, QSize size, const TextMetrics& text,
                           std::optional<int> bar_rank = std::nullopt);

}  // namespace gradscope::gui
