#pragma once

// Communication: the rank × rank matrix of a trace's point-to-point traffic (models/comm_matrix.h), by
// bytes or by time, with the pipeline stages its traffic implies (storage/peers.h pipelineBubbles) in the
// note above it. Loaded on the thread pool when a trace opens.
//
// CommMatrixWidget paints a CommMatrixScene (built again when the model, the metric or the size changed)
// and answers tooltips from the same scene: rank, peer, bytes both ways, time, calls.

#include <optional>
#include <utility>
#include <vector>

#include <QWidget>

#include "gradscope/storage/peers.h"
#include "models/comm_matrix.h"
#include "models/jobs.h"
#include "models/trace_data.h"

class QComboBox;
class QLabel;
class QScrollArea;

namespace gradscope::gui {

class CommMatrixWidget : public QWidget {
  Q_OBJECT
 public:
  explicit CommMatrixWidget(CommMatrixModel* model, QWidget* parent = nullptr);
  const CommMatrixScene& scene() const;
  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void leaveEvent(QEvent* event) override;
  bool event(QEvent* event) override;

 private:
  void invalidate();
  TextMetrics textMetrics() const;

  CommMatrixModel* model_;
  mutable std::optional<CommMatrixScene> scene_;
  std::optional<std::pair<int, int>> hovered_;
};

class CommMatrixView : public QWidget {
  Q_OBJECT
 public:
  explicit CommMatrixView(QWidget* parent = nullptr);
  void setTrace(const TraceInfo& info);
  void clear();
  CommMatrixModel* model() { return model_; }
  CommMatrixWidget* matrix() { return matrix_; }
  bool loading() const { return loading_; }
  void setMetric(MatrixMetric metric);

 signals:
  void loaded();

 private:
  struct Loaded {
    storage::PeerMatrix matrix;
    std::vector<storage::PipelineRank> stages;
  };
  QString noteText(const std::vector<storage::PipelineRank>& stages) const;

  CommMatrixModel* model_;
  CommMatrixWidget* matrix_;
  QScrollArea* scroll_;
  QComboBox* metric_;
  QLabel* note_;
  bool loading_ = false;
  JobTracker jobs_;
};

}  // namespace gradscope::gui
