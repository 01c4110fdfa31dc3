#pragma once

// Recommendation: runs the tuner (readInputs + recommend) on the thread pool for the open trace and
// shows its choice per size with predicted times and their 95% intervals, the gain per step, the
// synchronous-or-asynchronous analysis when the trace's steps can be replayed (tuner/async.h: the waiting,
// each async strategy's replayed step and measured error, the verdict), the reasoning, and buttons that
// save the recommendation in every export format.

#include <optional>

#include <QWidget>

#include "gradscope/tuner/exporters.h"
#include "gradscope/tuner/recommend.h"
#include "models/analysis_models.h"
#include "models/jobs.h"
#include "models/trace_data.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QPushButton;
class QScrollArea;
class QSplitter;
class QTableView;
class QTextBrowser;

namespace gradscope::gui {

class RecommendationView : public QWidget {
  Q_OBJECT
 public:
  explicit RecommendationView(QWidget* parent = nullptr);
  void setTrace(const TraceInfo& info);
  void clear();
  void recommend();
  RecommendationModel* model() { return model_; }
  AsyncOptionsModel* asyncModel() { return async_model_; }
  // The synchronous-or-asynchronous panel: shown when the report has an analysis (an empty why_not).
  QScrollArea* asyncPanel() { return async_panel_; }
  QTableView* asyncTable() { return async_table_; }
  // Checks or unchecks "allow semantic changes" (AdaCons, AdaSum, async); takes effect at the next
  // recommend().
  void setAllowSemanticChange(bool allow);
  bool loading() const { return loading_; }
  const std::optional<tuner::Result>& result() const { return result_; }
  // Writes the current result in `format` to `path`; returns an error text, empty on success.
  QString exportTo(tuner::Format format, const QString& path) const;

 signals:
  void loaded();

 private:
  void show(const tuner::Result& result);
  void showAsync(const tuner::Report& report);
  // Gives the async panel the height it needs at its width (up to half the splitter), once per result,
  // when the view is visible: the user's own splitter sizes are kept until the next result.
  void fitAsyncPanel();
  void showEvent(QShowEvent* event) override;
  void setExportEnabled(bool enabled);

  std::string path_;
  RecommendationModel* model_;
  QTableView* table_;
  QComboBox* budget_;
  QCheckBox* semantic_;
  QPushButton* run_;
  QLabel* summary_;
  QTextBrowser* reasoning_;
  QSplitter* splitter_;
  AsyncOptionsModel* async_model_;
  QScrollArea* async_panel_;
  QLabel* async_figures_;
  QTableView* async_table_;
  QLabel* async_verdict_;
  std::vector<QPushButton*> exports_;
  std::optional<tuner::Result> result_;
  bool loading_ = false;
  bool fit_async_pending_ = false;
  JobTracker jobs_;
};

}  // namespace gradscope::gui
