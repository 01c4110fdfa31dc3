#pragma once

// Steps: where each training step went (models/step_breakdown.h, docs/schema.md "Steps"). On top a
// stacked bar per step (compute, exposed communication, of it waiting), of the mean rank or of one rank;
// below a rank × step heatmap of the chosen figure with its colour scale. Loaded on the thread pool when
// a trace opens (readOrComputeSteps: the merged file's steps table, or derived from the calls).
//
// StepsWidget paints a StepsScene (built again when the model, the figure, the bars' rank or the size
// changed) and answers tooltips and clicks from the same scene. A click on a cell asks for that rank's
// step on the timeline, a click on a bar for the step across ranks (showOnTimeline; the main window
// moves the timeline there and switches to it).

#include <cstdint>
#include <optional>
#include <utility>

#include <QWidget>

#include "models/jobs.h"
#include "models/step_breakdown.h"
#include "models/trace_data.h"

class QComboBox;
class QLabel;
class QScrollArea;

namespace gradscope::gui {

class StepsWidget : public QWidget {
  Q_OBJECT
 public:
  explicit StepsWidget(StepBreakdownModel* model, QWidget* parent = nullptr);
  const StepsScene& scene() const;
  // The bars of one rank (an index into the breakdown's ranks), or nullopt for the mean.
  void setBarRank(std::optional<int> rank_index);
  std::optional<int> barRank() const { return bar_rank_; }
  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 signals:
  // A heatmap cell (rank index, step index) or a bar (rank index nullopt) was clicked.
  void clicked(std::optional<int> rank_index, int step_index);

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void leaveEvent(QEvent* event) override;
  bool event(QEvent* event) override;

 private:
  void invalidate();
  TextMetrics textMetrics() const;

  StepBreakdownModel* model_;
  std::optional<int> bar_rank_;
  mutable std::optional<StepsScene> scene_;
  std::optional<std::pair<int, int>> hovered_;  // a cell
};

class StepsView : public QWidget {
  Q_OBJECT
 public:
  explicit StepsView(QWidget* parent = nullptr);
  void setTrace(const TraceInfo& info);
  void clear();
  // What setTrace loads, for tests and callers that have it already.
  void setBreakdown(StepBreakdown breakdown);
  StepBreakdownModel* model() { return model_; }
  StepsWidget* chart() { return chart_; }
  bool loading() const { return loading_; }
  void setFigure(StepFigure figure);

 signals:
  void loaded();
  // Show `range` (rank 0's clock, as the timeline's window) for `rank_id`'s step (rank_id -1: every rank).
  void showOnTimeline(TimeRange range, std::int64_t rank_id, std::int64_t step);

 private:
  void fillRanks();
  QString noteText() const;

  StepBreakdownModel* model_;
  StepsWidget* chart_;
  QScrollArea* scroll_;
  QComboBox* figure_;
  QComboBox* bar_rank_;
  QLabel* note_;
  bool loading_ = false;
  JobTracker jobs_;
};

}  // namespace gradscope::gui
