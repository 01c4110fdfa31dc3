#pragma once

// Compare strategies: the measurements of a trace (explore mode or gradscope bench) per strategy and
// size. Time vs size on log-log axes (median with the min–max band), bus bandwidth vs size, and error vs
// time at one size with the Pareto front (no other strategy both faster and more accurate) marked; the
// table under them lists every point. The strategies list on the left picks what the charts draw.

#include <QWidget>

#include "models/analysis_models.h"
#include "models/jobs.h"
#include "models/trace_data.h"

class QChartView;
class QComboBox;
class QLabel;
class QListWidget;
class QTableView;

namespace gradscope::gui {

class StrategiesView : public QWidget {
  Q_OBJECT
 public:
  explicit StrategiesView(QWidget* parent = nullptr);
  void setTrace(const TraceInfo& info);
  void clear();
  StrategiesModel* model() { return model_; }
  bool loading() const { return loading_; }

 signals:
  void loaded();

 private:
  struct Group {
    Api api;
    DType dtype;
    int world;
    friend bool operator==(const Group&, const Group&) = default;
  };
  void fillGroups();
  void fillStrategies();
  void fillSizes();
  void redraw();
  std::vector<const StrategyPoint*> pointsOfGroup() const;

  StrategiesModel* model_;
  QTableView* table_;
  QComboBox* group_;
  QComboBox* size_;
  QListWidget* strategies_;
  QChartView* time_chart_;
  QChartView* busbw_chart_;
  QChartView* error_chart_;
  QLabel* note_;
  std::vector<Group> groups_;
  bool loading_ = false;
  JobTracker jobs_;
};

}  // namespace gradscope::gui
