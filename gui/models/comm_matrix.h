#pragma once

// The communication matrix: who talks to whom in a trace's point-to-point calls (storage/peers.h
// peerMatrix), rank × rank, rows the calling rank, columns its peer (world ranks), each cell coloured by
// the chosen metric:
// - bytes: what the row's rank sent to the column's (a send at (sender, receiver); MPI_Sendrecv counts its
//   send half), so row sums are what each rank sent and column sums what each received;
// - time: what the row's rank spent sending to the column's rank plus receiving from it (a receive's time
//   is mostly waiting for its sender: pipeline bubbles are dark cells; an MPI_Sendrecv's duration counts
//   once as a send and once as a receive, as peerMatrix counts it).
//
// CommMatrixModel exposes the cells as an item model (roles below, tested with QAbstractItemModelTester);
// buildCommMatrixScene lays them out as data, as the timeline's scene does, and CommMatrixWidget paints that
// scene and nothing else: cells, rank labels, the colour scale, and what a point hits.
//
// Colours: a sequential blue ramp (ColorBrewer "Blues"), linear in the value over the matrix's largest;
// a cell with any traffic is at least a light tint, so a small value never reads as none, and a cell with
// none stays (nearly) white.

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <QAbstractTableModel>
#include <QColor>
#include <QRect>
#include <QSize>

#include "gradscope/storage/peers.h"
#include "models/analysis_models.h"
#include "models/scene_text.h"

namespace gradscope::gui {

enum class MatrixMetric { Bytes, Time };

// The ramp: 0 (none) is (nearly) white; (0, 1] runs from a light tint to dark blue.
QColor matrixColour(double share);
// Whether text on a cell of this share is white (else dark).
bool matrixTextIsLight(double share);

class CommMatrixModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  // Qt::DisplayRole: the metric's value as short text ("" for an empty cell); kValueRole: the value as a
  // double (bytes or nanoseconds); Qt::BackgroundRole / Qt::ForegroundRole: the cell's colours;
  // Qt::ToolTipRole: rank, peer, bytes, calls and time each way, calls in all.
  // Headers: "rank N" down, "peer N" across.
  static constexpr int kValueRole = kSortRole;  // the views' numeric sort role (analysis_models.h)

  using QAbstractTableModel::QAbstractTableModel;
  void setMatrix(storage::PeerMatrix matrix);
  const storage::PeerMatrix& matrix() const { return matrix_; }
  void setMetric(MatrixMetric metric);
  MatrixMetric metric() const { return metric_; }

  int ranks() const { return matrix_.ranks; }
  // The metric's value at (rank, peer), and the largest over the matrix.
  double value(int rank, int peer) const;
  double value(int rank, int peer, MatrixMetric metric) const;
  double maxValue() const;
  bool empty() const;  // no point-to-point traffic at all
  // The short text of a value of the current metric: "4 MiB", "12.3 ms"; "" for 0.
  QString valueText(double value) const;

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::size_t at(int rank, int peer) const {
    return static_cast<std::size_t>(rank) * static_cast<std::size_t>(matrix_.ranks) +
           static_cast<std::size_t>(peer);
  }
  storage::PeerMatrix matrix_;
  MatrixMetric metric_ = MatrixMetric::Bytes;
  std::array<double, 2> largest_{};  // per metric (bytes, time)
};

// Up to this many ranks a cell may carry its value as text (when the text fits in it); beyond, colours
// only. Rank labels are drawn every 1, 2, 4, ... ranks, as often as they fit.
inline constexpr int kMatrixMaxTextRanks = 64;
// The smallest cell the widget asks room for up to kMatrixMaxTextRanks ranks (in a scroll area), so that
// labels every second rank stay readable; more ranks shrink to fit (at least one pixel).
inline constexpr int kMatrixMinCell = 10;
inline constexpr int kMatrixMaxCell = 96;
inline constexpr int kMatrixMargin = 12;
inline constexpr int kMatrixScaleWidth = 14;  // the colour scale's bar

struct MatrixCell {
  QRect rect;
  int rank = 0, peer = 0;
  QRgb colour = 0;
  std::optional<SceneText> text;  // the value, when it fits
  bool light_text = false;
};

struct CommMatrixScene {
  QSize size;
  int ranks = 0;
  int cell = 0;                   // side of a cell, pixels
  QRect grid;                     // ranks × ranks cells
  std::vector<MatrixCell> cells;  // those with traffic, row by row
  std::vector<SceneText> row_labels, column_labels;
  int label_step = 1;  // a label every label_step ranks
  SceneText row_title, column_title;
  QRect scale;        // the colour scale: top is the largest value, bottom the smallest above none
  QRect none_swatch;  // below it: the colour of cells without traffic
  std::vector<SceneText> scale_labels;  // the largest value, its half, "none"
  std::optional<SceneText> message;     // instead of a grid: why there is none

  // The (rank, peer) of the cell under a point, nullopt outside the grid.
  std::optional<std::pair<int, int>> cellAt(QPoint point) const;
};

// The size that shows every cell at least at kMatrixMinCell (up to kMatrixMaxTextRanks ranks).
QSize commMatrixMinimumSize(int ranks, const TextMetrics& text);
CommMatrixScene buildCommMatrixScene(const CommMatrixModel& model, QSize size, const TextMetrics& text);

}  // namespace gradscope::gui
