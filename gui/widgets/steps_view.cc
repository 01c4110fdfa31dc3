#include "widgets/steps_view.h"

#include <algorithm>
#include <cmath>

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

namespace {
const QColor kEmptyCell(0xf3, 0xf4, 0xf6);  // a rank without the step

// The timeline's window for a step: its span with a twentieth on each side, so its edges show.
TimeRange padded(TimeRange range) {
  const double margin = std::max(range.length() / 20, 1000.0);
  return {range.begin_ns - margin, range.end_ns + margin};
}
}  // namespace

// ---- StepsWidget

StepsWidget::StepsWidget(StepBreakdownModel* model, QWidget* parent) : QWidget(parent), model_(model) {
  setMouseTracking(true);
  setAttribute(Qt::WA_OpaquePaintEvent);
  connect(model_, &QAbstractItemModel::modelReset, this, [this] {
    hovered_.reset();
    bar_rank_.reset();
    updateGeometry();
    invalidate();
  });
  connect(model_, &QAbstractItemModel::dataChanged, this, [this] { invalidate(); });
}

TextMetrics StepsWidget::textMetrics() const {
  return textMetricsOf(font());
}

void StepsWidget::invalidate() {
  scene_.reset();
  update();
}

void StepsWidget::setBarRank(std::optional<int> rank_index) {
  if (rank_index == bar_rank_) return;
  bar_rank_ = rank_index;
  invalidate();
}

const StepsScene& StepsWidget::scene() const {
  if (!scene_) scene_ = buildStepsScene(*model_, size(), textMetrics(), bar_rank_);
  return *scene_;
}

QSize StepsWidget::minimumSizeHint() const {
  return {600, stepsMinimumHeight(model_->rowCount(), textMetrics())};
}

QSize StepsWidget::sizeHint() const {
  return minimumSizeHint().expandedTo({900, 600});
}

void StepsWidget::resizeEvent(QResizeEvent*) {
  invalidate();
}

void StepsWidget::paintEvent(QPaintEvent*) {
  const StepsScene& scene = this->scene();
  QPainter painter(this);
  painter.setRenderHint(QPainter::Antialiasing, false);
  painter.fillRect(rect(), Qt::white);
  if (scene.message) {
    painter.setPen(kMuted);
    painter.drawText(scene.message->rect, static_cast<int>(Qt::AlignLeft | Qt::AlignTop | Qt::TextWordWrap),
                     scene.message->text);
    return;
  }
  // Bars: grid lines, then the segments, then the axis labels and the legend.
  painter.setPen(kGrid);
  for (const int y : scene.bar_grid_y) painter.drawLine(scene.bars.left(), y, scene.bars.right(), y);
  // A step with its time only (outside the GPU windows): a dashed outline, or a pale fill in narrow columns.
  const auto drawTimeOnly = [&](const QRect& rect, QRgb colour) {
    if (scene.outline_filled) {
      painter.fillRect(rect, QColor::fromRgb(colour).lighter(125));
      return;
    }
    painter.setPen(QPen(QColor::fromRgb(colour).darker(130), 1, Qt::DashLine));
    painter.drawRect(rect.adjusted(0, 0, -1, -1));
  };
  for (const StepBarSegment& segment : scene.segments) {
    if (segment.outline) drawTimeOnly(segment.rect, segment.colour);
    else painter.fillRect(segment.rect, QColor::fromRgb(segment.colour));
  }
  painter.setPen(kMuted);
  painter.drawLine(scene.bars.left(), scene.bars.bottom() + 1, scene.bars.right(), scene.bars.bottom() + 1);
  for (const SceneText& label : scene.bar_axis_labels) drawSceneText(painter, label);
  painter.setPen(kText);
  drawSceneText(painter, scene.bar_title);
  for (const auto& [colour, label] : scene.bar_legend) {
    const QRect swatch(label.rect.left() - 16, label.rect.center().y() - 5, 11, 11);
    painter.fillRect(swatch, QColor::fromRgb(colour));
    drawSceneText(painter, label);
  }
  if (scene.outline_legend) {
    drawTimeOnly(
        QRect(scene.outline_legend->rect.left() - 16, scene.outline_legend->rect.center().y() - 5, 11, 11),
        scene.outline_colour);
    painter.setPen(kText);
    drawSceneText(painter, *scene.outline_legend);
  }

  // Heatmap: missing cells grey, then the cells, the rank labels and ticks, the step labels.
  painter.fillRect(scene.heatmap, kEmptyCell);
  for (const StepBarSegment& cell : scene.cells) painter.fillRect(cell.rect, QColor::fromRgb(cell.colour));
  painter.setPen(kGrid);
  painter.setBrush(Qt::NoBrush);
  painter.drawRect(scene.heatmap.adjusted(-1, -1, 0, 0));
  painter.setPen(kMuted);
  for (const int y : scene.rank_ticks_y)
    painter.drawLine(scene.heatmap.left() - 5, y, scene.heatmap.left() - 2, y);
  painter.setPen(kText);
  for (const SceneText& label : scene.rank_labels) drawSceneText(painter, label);
  for (const SceneText& label : scene.step_labels) drawSceneText(painter, label);
  painter.setPen(kMuted);
  drawSceneText(painter, scene.step_axis_title);
  painter.setPen(kText);
  drawSceneText(painter, scene.heatmap_title);

  // The scale: the ramp from the highest value (top) to the lowest.
  for (int y = 0; y < scene.scale.height(); ++y) {
    const double share = 1.0 - static_cast<double>(y) / std::max(1, scene.scale.height() - 1);
    painter.setPen(stepRampColour(model_->figure(), share));
    painter.drawLine(scene.scale.left(), scene.scale.top() + y, scene.scale.right(), scene.scale.top() + y);
  }
  painter.setPen(kGrid);
  painter.drawRect(scene.scale.adjusted(-1, -1, 0, 0));
  painter.setPen(kText);
  for (const SceneText& label : scene.scale_labels) drawSceneText(painter, label);

  if (hovered_) {
    const QRect cell(
        scene.columnLeft(hovered_->second), scene.heatmap.top() + hovered_->first * scene.row_height,
        scene.columnRight(hovered_->second) - scene.columnLeft(hovered_->second), scene.row_height);
    painter.setPen(QPen(kOutline, scene.row_height >= 8 ? 2 : 1));
    painter.drawRect(cell.adjusted(0, 0, -1, -1));
  }
}

void StepsWidget::mouseMoveEvent(QMouseEvent* event) {
  const std::optional<std::pair<int, int>> cell = scene().cellAt(event->position().toPoint());
  if (cell != hovered_) {
    hovered_ = cell;
    update();
  }
}

void StepsWidget::mouseReleaseEvent(QMouseEvent* event) {
  if (event->button() != Qt::LeftButton) return;
  const QPoint point = event->position().toPoint();
  if (const auto cell = scene().cellAt(point)) {
    emit clicked(cell->first, cell->second);
  } else if (const auto bar = scene().barAt(point)) {
    emit clicked(std::nullopt, *bar);
  }
}

void StepsWidget::leaveEvent(QEvent*) {
  if (hovered_) {
    hovered_.reset();
    update();
  }
}

bool StepsWidget::event(QEvent* event) {
  if (event->type() == QEvent::FontChange) scene_.reset();
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    QString tip;
    if (const auto cell = scene().cellAt(help->pos())) {
      tip = model_->cellToolTip(cell->first, cell->second);
    } else if (const auto bar = scene().barAt(help->pos())) {
      tip = model_->barToolTip(*bar, bar_rank_);
    }
    if (tip.isEmpty()) {
      QToolTip::hideText();
      event->ignore();
    } else {
      QToolTip::showText(help->globalPos(), tip, this);
    }
    return true;
  }
  return QWidget::event(event);
}

// ---- StepsView

StepsView::StepsView(QWidget* parent) : QWidget(parent), model_(new StepBreakdownModel(this)), jobs_(this) {
  chart_ = new StepsWidget(model_, this);
  scroll_ = new QScrollArea(this);
  scroll_->setWidget(chart_);
  scroll_->setWidgetResizable(true);
  scroll_->setFrameShape(QFrame::NoFrame);
  bar_rank_ = new QComboBox(this);
  bar_rank_->setToolTip(QStringLiteral("Whose steps the bars show: the mean over every rank, or one rank"));
  bar_rank_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  connect(bar_rank_, &QComboBox::currentIndexChanged, this, [this](int index) {
    chart_->setBarRank(index > 0 ? std::optional<int>(index - 1) : std::nullopt);
  });
  figure_ = new QComboBox(this);
  for (int f = 0; f < kStepFigureCount; ++f) {
    const QString name = stepFigureName(static_cast<StepFigure>(f));
    figure_->addItem(QStringLiteral("Heatmap: %1").arg(name));
  }
  figure_->setToolTip(QStringLiteral(
      "What colours the heatmap: exposed communication (blocked in calls), waiting (of it, for "
      "ranks that arrived later), the step's time, or the waiting a rank caused others"));
  connect(figure_, &QComboBox::currentIndexChanged, this, [this](int index) {
    model_->setFigure(static_cast<StepFigure>(std::clamp(index, 0, kStepFigureCount - 1)));
  });
  connect(chart_, &StepsWidget::clicked, this, [this](std::optional<int> rank_index, int step_index) {
    const StepBreakdown& breakdown = model_->breakdown();
    const TimeRange range = breakdown.stepRange(step_index, rank_index);
    if (range.empty()) return;
    emit showOnTimeline(padded(range),
                        rank_index ? breakdown.ranks[static_cast<std::size_t>(*rank_index)].rank_id : -1,
                        breakdown.steps[static_cast<std::size_t>(step_index)]);
  });
  note_ = new QLabel(this);
  note_->setWordWrap(true);
  note_->setTextFormat(Qt::RichText);
  note_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* top = new QHBoxLayout;
  top->addWidget(note_, 1);
  top->addWidget(new QLabel(QStringLiteral("Bars:"), this), 0, Qt::AlignTop);
  top->addWidget(bar_rank_, 0, Qt::AlignTop);
  top->addSpacing(8);
  top->addWidget(figure_, 0, Qt::AlignTop);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(8, 8, 8, 8);
  layout->addLayout(top);
  layout->addWidget(scroll_, 1);
  // Waiting first: it shows who waited for whom, where exposed time is much alike on every rank.
  setFigure(StepFigure::Waiting);
  clear();
}

void StepsView::setFigure(StepFigure figure) {
  figure_->setCurrentIndex(static_cast<int>(figure));
}

void StepsView::clear() {
  jobs_.cancel();
  loading_ = false;
  setBreakdown({});
  note_->setText(QStringLiteral("No trace open."));
}

void StepsView::setBreakdown(StepBreakdown breakdown) {
  model_->setBreakdown(std::move(breakdown));
  fillRanks();
  note_->setText(noteText());
}

void StepsView::fillRanks() {
  const QSignalBlocker block(bar_rank_);
  bar_rank_->clear();
  bar_rank_->addItem(QStringLiteral("mean over ranks"));
  const StepBreakdown& breakdown = model_->breakdown();
  for (int r = 0; r < static_cast<int>(breakdown.ranks.size()); ++r)
    bar_rank_->addItem(breakdown.rankLabel(r));
  bar_rank_->setCurrentIndex(0);
  bar_rank_->setEnabled(breakdown.ranks.size() > 1);
  chart_->setBarRank(std::nullopt);
}

void StepsView::setTrace(const TraceInfo& info) {
  loading_ = true;
  note_->setText(QStringLiteral("Loading the steps…"));
  const std::string path = info.path;
  jobs_.run<StepBreakdown>(
      [path] {
        try {
          return loadStepBreakdown(threadReader(path));
        } catch (...) {
          dropThreadReader(path);
          throw;
        }
      },
      [this](Outcome<StepBreakdown> outcome) {
        loading_ = false;
        if (!outcome.value) {
          setBreakdown({});
          note_->setText(QStringLiteral("Cannot read the steps: %1").arg(outcome.error.toHtmlEscaped()));
        } else {
          setBreakdown(std::move(*outcome.value));
        }
        emit loaded();
      });
}

QString StepsView::noteText() const {
  const StepBreakdown& breakdown = model_->breakdown();
  if (breakdown.empty()) {
    return QStringLiteral(
        "<b>No steps.</b> The calls of this trace carry no step markers, and no repeating pattern of calls "
        "was detected in them. Per-rank files get their steps when merged: <tt>gradscope merge DIR -o "
        "merged.db</tt> detects each rank's steps (docs/schema.md, \"Steps\").");
  }
  // Over the steps with a breakdown (GPU steps outside the sampled windows have their time only).
  double span = 0, compute = 0, exposed = 0, waiting = 0;
  std::size_t measured = 0, gpu_rows = 0, gpu_measured = 0;
  for (const storage::StepRecord& row : breakdown.rows) {
    gpu_rows += row.basis != storage::StepBasis::Host ? 1 : 0;
    gpu_measured += row.basis == storage::StepBasis::Gpu ? 1 : 0;
  }
  for (std::size_t s = 0; s < breakdown.steps.size(); ++s) {
    if (breakdown.totals[s].measured == 0) continue;
    ++measured;
    const StepParts parts = breakdown.parts(static_cast<int>(s));
    span += parts.total();
    compute += parts.compute_ns;
    exposed += parts.exposed_only_ns + parts.waiting_ns;
    waiting += parts.waiting_ns;
  }
  const auto share = [span](double part) {
    return QString::number(span > 0 ? 100.0 * part / span : 0.0, 'f', 1);
  };
  QStringList hosts;
  for (const std::string& host : breakdown.hosts) hosts << QString::fromStdString(host).toHtmlEscaped();
  if (hosts.size() > 6) hosts = hosts.mid(0, 3) << QStringLiteral("…") << hosts.mid(hosts.size() - 2);
  QString text =
      QStringLiteral(
          "<b>%1 steps</b> on %2 ranks, %3 host%4 (%5). The mean rank's step: %6, of which compute "
          "%7%, exposed communication %8% (waiting for other ranks %9%).")
          .arg(breakdown.steps.size())
          .arg(breakdown.ranks.size())
          .arg(breakdown.hosts.size())
          .arg(breakdown.hosts.size() == 1 ? QString() : QStringLiteral("s"),
               hosts.join(QStringLiteral(", ")),
               spanText(measured > 0 ? span / static_cast<double>(measured) : 0.0), share(compute),
               share(exposed), share(waiting));
  if (gpu_rows > 0)
    text += QStringLiteral(
                " Measured on the GPU in %1 of %2 rank steps (the agent's sampled windows); the others show "
                "their time only.")
                .arg(gpu_measured)
                .arg(gpu_rows);
  const storage::Stragglers stragglers = storage::stragglers(breakdown.rows);
  if (!stragglers.ranks.empty() && stragglers.steps > 0) {
    const storage::StragglerRank& first = stragglers.ranks.front();
    const auto row = std::find_if(breakdown.ranks.begin(), breakdown.ranks.end(),
                                  [&](const StepRank& r) { return r.rank_id == first.rank_id; });
    const QString who =
        row != breakdown.ranks.end()
            ? breakdown.rankLabel(static_cast<int>(row - breakdown.ranks.begin())).toHtmlEscaped()
            : QStringLiteral("rank id %1").arg(first.rank_id);
    text += QStringLiteral(" Last to arrive: %1, in %2 of the %3 steps with waiting%4.")
                .arg(who)
                .arg(first.steps_last)
                .arg(stragglers.steps)
                .arg(stragglers.persistent ? QStringLiteral(": a persistent straggler") : QString());
  }
  return text;
}

}  // namespace gradscope::gui
