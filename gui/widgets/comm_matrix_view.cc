#include "widgets/comm_matrix_view.h"

#include <algorithm>
#include <map>

#include <QComboBox>
#include <QHBoxLayout>
#include <QHelpEvent>
#include <QLabel>
#include <QMouseEvent>
#include <QPainter>
#include <QScrollArea>
#include <QToolTip>
#include <QVBoxLayout>

#include "gradscope/common/units.h"
#include "models/palette.h"
#include "models/units_text.h"
#include "widgets/chart_util.h"

namespace gradscope::gui {

// ---- CommMatrixWidget

CommMatrixWidget::CommMatrixWidget(CommMatrixModel* model, QWidget* parent) : QWidget(parent), model_(model) {
  setMouseTracking(true);
  setAttribute(Qt::WA_OpaquePaintEvent);
  connect(model_, &QAbstractItemModel::modelReset, this, [this] {
    hovered_.reset();
    updateGeometry();
    invalidate();
  });
  connect(model_, &QAbstractItemModel::dataChanged, this, [this] { invalidate(); });
}

TextMetrics CommMatrixWidget::textMetrics() const {
  return textMetricsOf(font());
}

void CommMatrixWidget::invalidate() {
  scene_.reset();
  update();
}

const CommMatrixScene& CommMatrixWidget::scene() const {
  if (!scene_) scene_ = buildCommMatrixScene(*model_, size(), textMetrics());
  return *scene_;
}

QSize CommMatrixWidget::minimumSizeHint() const {
  return commMatrixMinimumSize(model_->ranks(), textMetrics());
}

QSize CommMatrixWidget::sizeHint() const {
  return minimumSizeHint().expandedTo({700, 500});
}

void CommMatrixWidget::resizeEvent(QResizeEvent*) {
  invalidate();
}

void CommMatrixWidget::paintEvent(QPaintEvent*) {
  const CommMatrixScene& scene = this->scene();
  QPainter painter(this);
  painter.setRenderHint(QPainter::Antialiasing, false);
  painter.fillRect(rect(), Qt::white);
  if (scene.message) {
    painter.setPen(kMuted);
    drawSceneText(painter, *scene.message);
    return;
  }
  painter.fillRect(scene.grid, matrixColour(0));
  painter.setPen(Qt::NoPen);
  for (const MatrixCell& cell : scene.cells) painter.fillRect(cell.rect, QColor::fromRgb(cell.colour));
  // Grid lines between groups of labelled ranks, where cells are too small to show their own edges.
  if (scene.cell < 6 && scene.label_step > 1) {
    painter.setPen(kGrid);
    for (int r = scene.label_step; r < scene.ranks; r += scene.label_step) {
      const int offset = r * scene.cell;
      painter.drawLine(scene.grid.left() + offset, scene.grid.top(), scene.grid.left() + offset,
                       scene.grid.bottom());
      painter.drawLine(scene.grid.left(), scene.grid.top() + offset, scene.grid.right(),
                       scene.grid.top() + offset);
    }
  }
  for (const MatrixCell& cell : scene.cells) {
    if (!cell.text) continue;
    painter.setPen(cell.light_text ? QColor(Qt::white) : kText);
    drawSceneText(painter, *cell.text);
  }
  painter.setPen(kGrid);
  painter.setBrush(Qt::NoBrush);
  painter.drawRect(scene.grid.adjusted(-1, -1, 0, 0));

  painter.setPen(kText);
  for (const SceneText& label : scene.row_labels) drawSceneText(painter, label);
  for (const SceneText& label : scene.column_labels) drawSceneText(painter, label);
  painter.setPen(kMuted);
  drawSceneText(painter, scene.row_title);
  drawSceneText(painter, scene.column_title);

  // The colour scale: the ramp from the largest value (top) down to the smallest, then none.
  for (int y = 0; y < scene.scale.height(); ++y) {
    const double share = std::max(1e-9, 1.0 - static_cast<double>(y) / std::max(1, scene.scale.height() - 1));
    painter.setPen(matrixColour(share));
    painter.drawLine(scene.scale.left(), scene.scale.top() + y, scene.scale.right(), scene.scale.top() + y);
  }
  painter.fillRect(scene.none_swatch, matrixColour(0));
  painter.setPen(kGrid);
  painter.drawRect(scene.scale.adjusted(-1, -1, 0, 0));
  painter.drawRect(scene.none_swatch.adjusted(-1, -1, 0, 0));
  painter.setPen(kText);
  for (const SceneText& label : scene.scale_labels) drawSceneText(painter, label);

  if (hovered_) {
    const QRect cell(scene.grid.left() + hovered_->second * scene.cell,
                     scene.grid.top() + hovered_->first * scene.cell, scene.cell, scene.cell);
    painter.setPen(QPen(kOutline, scene.cell >= 8 ? 2 : 1));
    painter.drawRect(cell.adjusted(0, 0, -1, -1));
  }
}

void CommMatrixWidget::mouseMoveEvent(QMouseEvent* event) {
  const std::optional<std::pair<int, int>> cell = scene().cellAt(event->position().toPoint());
  if (cell != hovered_) {
    hovered_ = cell;
    update();
  }
}

void CommMatrixWidget::leaveEvent(QEvent*) {
  if (hovered_) {
    hovered_.reset();
    update();
  }
}

bool CommMatrixWidget::event(QEvent* event) {
  if (event->type() == QEvent::FontChange) scene_.reset();
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    const std::optional<std::pair<int, int>> cell = scene().cellAt(help->pos());
    if (!cell) {
      QToolTip::hideText();
      event->ignore();
      return true;
    }
    QToolTip::showText(help->globalPos(),
                       model_->data(model_->index(cell->first, cell->second), Qt::ToolTipRole).toString(),
                       this);
    return true;
  }
  return QWidget::event(event);
}

// ---- CommMatrixView

CommMatrixView::CommMatrixView(QWidget* parent)
    : QWidget(parent), model_(new CommMatrixModel(this)), jobs_(this) {
  matrix_ = new CommMatrixWidget(model_, this);
  scroll_ = new QScrollArea(this);
  scroll_->setWidget(matrix_);
  scroll_->setWidgetResizable(true);
  scroll_->setFrameShape(QFrame::NoFrame);
  metric_ = new QComboBox(this);
  metric_->addItem(QStringLiteral("Bytes sent"));
  metric_->addItem(QStringLiteral("Time sending + receiving"));
  metric_->setToolTip(
      QStringLiteral("What colours the cells: the bytes the row's rank sent to the peer, or the "
                     "time it spent in sends to it plus receives from it"));
  connect(metric_, &QComboBox::currentIndexChanged, this,
          [this](int index) { model_->setMetric(index == 1 ? MatrixMetric::Time : MatrixMetric::Bytes); });
  note_ = new QLabel(this);
  note_->setWordWrap(true);
  note_->setTextFormat(Qt::RichText);
  note_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* top = new QHBoxLayout;
  top->addWidget(note_, 1);
  top->addWidget(metric_, 0, Qt::AlignTop);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(8, 8, 8, 8);
  layout->addLayout(top);
  layout->addWidget(scroll_, 1);
  clear();
}

void CommMatrixView::setMetric(MatrixMetric metric) {
  metric_->setCurrentIndex(metric == MatrixMetric::Time ? 1 : 0);
}

void CommMatrixView::clear() {
  jobs_.cancel();
  loading_ = false;
  model_->setMatrix({});
  note_->setText(QStringLiteral("No trace open."));
}

void CommMatrixView::setTrace(const TraceInfo& info) {
  loading_ = true;
  note_->setText(QStringLiteral("Loading the point-to-point traffic…"));
  const std::string path = info.path;
  jobs_.run<Loaded>(
      [path] {
        try {
          const storage::TraceReader& reader = threadReader(path);
          return Loaded{storage::peerMatrix(reader), storage::pipelineBubbles(reader)};
        } catch (...) {
          dropThreadReader(path);
          throw;
        }
      },
      [this](Outcome<Loaded> outcome) {
        loading_ = false;
        if (!outcome.value) {
          model_->setMatrix({});
          note_->setText(
              QStringLiteral("Cannot read the point-to-point calls: %1").arg(outcome.error.toHtmlEscaped()));
        } else {
          model_->setMatrix(std::move(outcome.value->matrix));
          note_->setText(noteText(outcome.value->stages));
        }
        emit loaded();
      });
}

QString CommMatrixView::noteText(const std::vector<storage::PipelineRank>& stages) const {
  const storage::PeerMatrix& matrix = model_->matrix();
  if (model_->empty()) {
    return QStringLiteral(
        "This trace has no point-to-point calls (MPI_Send, MPI_Recv, ncclSend, ...): its "
        "ranks exchanged data in collectives only.");
  }
  std::int64_t sends = 0, receives = 0;
  for (const std::int64_t n : matrix.send_calls) sends += n;
  for (const std::int64_t n : matrix.recv_calls) receives += n;
  const auto count = [](std::int64_t n) {
    return QString::fromStdString(formatCount(static_cast<std::uint64_t>(n)));
  };
  QString text =
      QStringLiteral(
          "<b>Who talks to whom</b>: %1 sends and %2 receives among %3 ranks. A row is the calling "
          "rank, a column its peer (world ranks). <b>Bytes sent</b>: what the row's rank sent to "
          "the peer; <b>time</b>: what it spent in sends to it plus receives from it (a "
          "receive's time is mostly waiting for its sender). Hover a cell for all of them.")
          .arg(count(sends), count(receives))
          .arg(matrix.ranks);
  if (matrix.unresolved > 0) {
    text += QStringLiteral(" %1 calls name a peer the trace has no rank for (a missing file): left out.")
                .arg(QString::fromStdString(formatCount(static_cast<std::uint64_t>(matrix.unresolved))));
  }
  if (stages.empty()) return text;
  // The stages, and where upstream ranks kept a rank waiting longest.
  std::map<int, QStringList> by_stage;
  for (const storage::PipelineRank& rank : stages) by_stage[rank.stage] << QString::number(rank.rank);
  if (by_stage.size() < 2) return text;
  // A long pipeline: its first three stages and its last two, each with at most six ranks.
  constexpr std::size_t kHead = 3, kTail = 2, kRanksShown = 6;
  QStringList parts;
  std::size_t i = 0;
  for (const auto& [stage, ranks] : by_stage) {
    const std::size_t position = i++;
    if (by_stage.size() > kHead + kTail + 1 && position >= kHead && position + kTail < by_stage.size()) {
      if (position == kHead) parts << QStringLiteral("…");
      continue;
    }
    QString listed = ranks.mid(0, static_cast<qsizetype>(kRanksShown)).join(QStringLiteral(", "));
    if (ranks.size() > static_cast<qsizetype>(kRanksShown))
      listed += QStringLiteral(", … (%1 ranks)").arg(ranks.size());
    parts << QStringLiteral("stage %1: %2 %3")
                 .arg(stage)
                 .arg(ranks.size() == 1 ? QStringLiteral("rank") : QStringLiteral("ranks"), listed);
  }
  text += QStringLiteral("<br><b>%1 pipeline stages</b> (from who feeds whom): %2.")
              .arg(by_stage.size())
              .arg(parts.join(QStringLiteral(" · ")));
  // Where a rank waited longest for the stages before it (forward) and after it (backward).
  const auto share = [](std::int64_t part, std::int64_t whole) {
    return QString::number(
        100.0 * static_cast<double>(part) / static_cast<double>(std::max<std::int64_t>(whole, 1)), 'f', 1);
  };
  const auto upstream = std::max_element(
      stages.begin(), stages.end(), [](const auto& a, const auto& b) { return a.blocked_ns < b.blocked_ns; });
  if (upstream->blocked_ns > 0) {
    text += QStringLiteral(
                " Longest wait for the stages before it: rank %1, %2 in %3 receives (%4% of its span).")
                .arg(upstream->rank)
                .arg(durationText(upstream->blocked_ns))
                .arg(upstream->recv_calls)
                .arg(share(upstream->blocked_ns, upstream->busy_ns));
  }
  const auto downstream = std::max_element(stages.begin(), stages.end(), [](const auto& a, const auto& b) {
    return a.downstream_ns < b.downstream_ns;
  });
  if (downstream->downstream_ns > 0) {
    text += QStringLiteral(" For the stages after it: rank %1, %2 in %3 receives (%4%).")
                .arg(downstream->rank)
                .arg(durationText(downstream->downstream_ns))
                .arg(downstream->downstream_calls)
                .arg(share(downstream->downstream_ns, downstream->busy_ns));
  }
  return text;
}

}  // namespace gradscope::gui
