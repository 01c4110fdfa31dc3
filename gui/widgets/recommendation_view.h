#pragma once

// Recommendation: runs the tuner (readInputs + recommend) on the thread pool for the open trace and
// shows its choice per size with predicted times and their 95% intervals, the gain per step, the
// reasoning, and buttons that save the recommendation in every export format.

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
  bool loading() const { return loading_; }
  const std::optional<tuner::Result>& result() const { return result_; }
  // Writes the current result in `format` to `path`; returns an error text, empty on success.
  QString exportTo(tuner::Format format, const QString& path) const;

 signals:
  void loaded();

 private:
  void show(const tuner::Result& result);
  void setExportEnabled(bool enabled);

  std::string path_;
  RecommendationModel* model_;
  QTableView* table_;
  QComboBox* budget_;
  QCheckBox* semantic_;
  QPushButton* run_;
  QLabel* summary_;
  QTextBrowser* reasoning_;
  std::vector<QPushButton*> exports_;
  std::optional<tuner::Result> result_;
  bool loading_ = false;
  JobTracker jobs_;
};

}  // namespace gradscope::gui
