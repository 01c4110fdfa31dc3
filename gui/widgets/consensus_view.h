#pragma once

// Consensus: the diagnostics explore mode computes on the job's own gradients (AdaCons α per rank,
// cosine of each rank's gradient to the mean, gradient diversity) over the training steps; several
// explored reductions of one step are averaged per rank. The rows are in the table below the charts.

#include <QWidget>

#include "models/analysis_models.h"
#include "models/jobs.h"
#include "models/trace_data.h"

class QChartView;
class QLabel;
class QTableView;

namespace gradscope::gui {

class ConsensusView : public QWidget {
  Q_OBJECT
 public:
  explicit ConsensusView(QWidget* parent = nullptr);
  void setTrace(const TraceInfo& info);
  void clear();
  ConsensusModel* model() { return model_; }
  bool loading() const { return loading_; }

 signals:
  void loaded();

 private:
  void redraw();

  ConsensusModel* model_;
  QTableView* table_;
  QChartView* alpha_chart_;
  QChartView* cosine_chart_;
  QChartView* diversity_chart_;
  QLabel* note_;
  bool loading_ = false;
  JobTracker jobs_;
};

}  // namespace gradscope::gui
