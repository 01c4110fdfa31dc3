#pragma once

// Runs: the open trace compared with a baseline trace, as `gradscope check BASELINE CURRENT` does
// (tuner::checkTraces on the thread pool): the two runs step by step when both have steps (the step time
// first), then the verdict of every measured key, regressions first, and which keys only one side
// measured. A part with nothing to show is hidden: two observe runs have no measured keys.

#include <QWidget>

#include "gradscope/tuner/check.h"
#include "models/analysis_models.h"
#include "models/jobs.h"
#include "models/trace_data.h"

class QLabel;
class QPushButton;
class QTableView;

namespace gradscope::gui {

class RunsView : public QWidget {
  Q_OBJECT
 public:
  explicit RunsView(QWidget* parent = nullptr);
  void setTrace(const TraceInfo& info);
  void clear();
  // Compares the open trace (current) with `baseline_path`.
  void compareWith(const QString& baseline_path);
  CheckModel* model() { return model_; }  // the measured keys
  RunComparisonModel* runsModel() { return runs_model_; }
  QTableView* keysTable() { return table_; }
  QTableView* runsTable() { return runs_table_; }
  QLabel* summary() { return summary_; }
  bool loading() const { return loading_; }
  QString baselinePath() const { return baseline_; }

 signals:
  void loaded();
  void compareRequested();  // the "Compare with…" button: the main window asks for a file

 private:
  void showResult(const tuner::CheckResult* result);  // null: no comparison; hides the empty parts

  std::string current_;
  QString baseline_;
  CheckModel* model_;
  RunComparisonModel* runs_model_;
  QTableView* table_;
  QTableView* runs_table_;
  QWidget* keys_section_;
  QWidget* runs_section_;
  QLabel* keys_heading_;
  QLabel* runs_heading_;
  QLabel* summary_;
  QPushButton* compare_;
  bool loading_ = false;
  JobTracker jobs_;
};

}  // namespace gradscope::gui
