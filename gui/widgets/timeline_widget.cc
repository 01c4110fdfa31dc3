#include "widgets/timeline_widget.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QTimer>
#include <QToolTip>
#include <QWheelEvent>
#include <fmt/format.h>

#include "gradscope/common/units.h"
#include "models/analysis_models.h"
#include "models/palette.h"
#include "models/units_text.h"
#include "widgets/chart_util.h"

namespace gradscope::gui {

namespace {
constexpr int kDragThreshold = 4;  // pixels a press may move and still be a click
const QColor kBackground(0xff, 0xff, 0xff);
const QColor kGutter(0xf3, 0xf4, 0xf6);
const QColor kStripe(0xf8, 0xf9, 0xfb);
const QColor kHostBand(0xe4, 0xe8, 0xee);
const QColor kError(0xc6, 0x28, 0x28);
const QColor kRubberBand(0x4e, 0x79, 0xa7);
const QColor kArrow(0x1f, 0x29, 0x37);

// Messages: a line from the send's end to the receive's end, an arrowhead there when it is in view, the
// size and tag beside it on a white ground. Antialiased: slanted lines look broken without.
void drawArrows(QPainter& painter, const std::vector<SceneArrow>& arrows, const QFont& font) {
  if (arrows.empty()) return;
  painter.save();
  painter.setRenderHint(QPainter::Antialiasing, true);
  for (const SceneArrow& arrow : arrows) {
    const QPointF from = arrow.from;
    const QPointF to = arrow.to;
    painter.setPen(QPen(kArrow, 1.6));
    painter.drawLine(from, to);
    painter.setPen(Qt::NoPen);
    painter.setBrush(kArrow);
    if (arrow.tail) painter.drawEllipse(from, 2.5, 2.5);
    const double length = std::hypot(to.x() - from.x(), to.y() - from.y());
    if (arrow.head && length > 0) {
      const QPointF along = (to - from) / length;
      const QPointF across(-along.y(), along.x());
      const QPointF base = to - along * 9.0;
      const QPointF head[] = {to, base + across * 4.5, base - across * 4.5};
      painter.drawPolygon(head, 3);
    }
    painter.setFont(font);
    painter.fillRect(arrow.label.rect, QColor(255, 255, 255, 220));
    painter.setPen(kArrow);
    drawSceneText(painter, arrow.label);
  }
  painter.restore();
}

// The scene's bars, one drawRects per colour.
void drawBars(QPainter& painter, const std::vector<SceneBar>& bars) {
  std::map<QRgb, std::vector<QRect>> by_colour;
  for (const SceneBar& bar : bars) by_colour[bar.colour].push_back(bar.rect);
  painter.setPen(Qt::NoPen);
  for (const auto& [colour, rects] : by_colour) {
    painter.setBrush(QColor::fromRgb(colour));
    painter.drawRects(rects.data(), static_cast<int>(rects.size()));
  }
}
}  // namespace

TimelineWidget::TimelineWidget(ViewState* state, QWidget* parent)
    : QWidget(parent), state_(state), jobs_(this), flow_jobs_(this) {
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  setAttribute(Qt::WA_OpaquePaintEvent);
  connect(state_, &ViewState::windowChanged, this, [this] {
    invalidate();
    scheduleLoad();
  });
  connect(state_, &ViewState::colourByChanged, this, [this] {
    invalidate();
    scheduleLoad();
  });
  connect(state_, &ViewState::filterChanged, this, [this] { invalidate(); });
  connect(state_, &ViewState::extentChanged, this, [this] { invalidate(); });
  connect(state_, &ViewState::selectionChanged, this, [this] {
    const std::optional<SelectedCall> selection = state_->selection();
    if (selection) {
      const TimeRange window = state_->window();
      const auto start = static_cast<double>(selection->start_ns);
      const auto end = static_cast<double>(selection->end_ns);
      // Bring a call selected elsewhere (the calls table) into view, keeping the zoom when it fits.
      if (end < window.begin_ns || start > window.end_ns) {
        const double length = std::max(window.length(), 4 * (end - start));
        const double middle = (start + end) / 2;
        state_->setWindow({middle - length / 2, middle + length / 2}, true);
      }
      if (flows_stale_) loadFlows();
    }
    invalidate();
  });
}

void TimelineWidget::setTrace(const TraceInfo& info) {
  path_ = info.path;
  ranks_ = info.ranks;
  frame_.reset();
  error_.clear();
  flows_.reset();
  invalidate();
  scheduleLoad();
  loadFlows();
}

void TimelineWidget::clear() {
  jobs_.cancel();
  flow_jobs_.cancel();
  path_.clear();
  ranks_.clear();
  frame_.reset();
  flows_.reset();
  flows_stale_ = false;
  loading_ = false;
  invalidate();
}

void TimelineWidget::reload() {
  scheduleLoad();
  // Matching every message again at each poll of a live trace would cost a scan of its point-to-point
  // calls every second: only when a call is selected next, or now when the selected one has no partner yet.
  flows_stale_ = true;
  const std::optional<SelectedCall> selection = state_->selection();
  if (selection && (!flows_ || flows_->of(selection->id).empty())) loadFlows();
}

void TimelineWidget::loadFlows() {
  if (path_.empty()) return;
  flows_stale_ = false;
  const std::string path = path_;
  flow_jobs_.run<std::shared_ptr<const PeerFlows>>(
      [path] {
        try {
          return std::make_shared<const PeerFlows>(loadPeerFlows(threadReader(path)));
        } catch (...) {
          dropThreadReader(path);
          throw;
        }
      },
      [this](Outcome<std::shared_ptr<const PeerFlows>> outcome) {
        // Without its messages the timeline still shows every call: no arrows, the reason in the status bar.
        if (!outcome.value) {
          emit loadFailed(QStringLiteral("cannot match point-to-point messages: %1").arg(outcome.error));
          return;
        }
        flows_ = std::move(*outcome.value);
        invalidate();
      });
}

void TimelineWidget::invalidate() {
  scene_.reset();
  update();
}

int TimelineWidget::preferredHeight() const {
  return preferredTimelineHeight(ranks_);
}

QRect TimelineWidget::plotRect() const {
  return timelinePlotRect(size());
}

TimelineMath TimelineWidget::math() const {
  return timelineMath(plotRect(), state_->window());
}

const TimelineScene& TimelineWidget::scene() const {
  if (!scene_) {
    TimelineSceneInput input;
    input.size = size();
    input.ranks = ranks_;
    input.frame = frame_ ? &*frame_ : nullptr;
    input.window = state_->window();
    input.filter = state_->filter();
    input.colour_by = state_->colourBy();
    input.selection = state_->selection();
    input.flows = flows_.get();
    if (drag_ == Drag::Select) input.rubber_band = std::pair{press_pos_.x(), current_pos_.x()};
    input.error = error_;
    input.has_trace = !path_.empty();
    input.extent_empty = state_->extent().empty();
    input.loading = loading_;
    const QFontMetrics metrics(font());
    input.text = {metrics.height(),
                  [metrics](const QString& text) { return metrics.horizontalAdvance(text); }};
    scene_ = buildTimelineScene(input);
  }
  return *scene_;
}

void TimelineWidget::scheduleLoad() {
  if (path_.empty() || load_scheduled_) return;
  load_scheduled_ = true;
  // Coalesces the many window changes of one wheel or drag gesture into one request per event-loop turn.
  QTimer::singleShot(0, this, [this] {
    load_scheduled_ = false;
    startLoad();
  });
}

void TimelineWidget::startLoad() {
  if (path_.empty() || state_->window().empty()) return;
  loading_ = true;
  const std::string path = path_;
  const TimeRange window = state_->window();
  const int columns = plotRect().width();
  const bool strategies = state_->colourBy() == ColourBy::Strategy;
  jobs_.run<TimelineFrame>(
      [path, window, columns, strategies] {
        try {
          return loadTimelineFrame(threadReader(path), window, columns, strategies);
        } catch (...) {
          dropThreadReader(path);
          throw;
        }
      },
      [this](Outcome<TimelineFrame> outcome) {
        loading_ = false;
        if (!outcome.value) {
          error_ = outcome.error;
          invalidate();
          emit loadFailed(outcome.error);
          return;
        }
        error_.clear();
        frame_ = std::move(*outcome.value);
        ++frame_count_;
        invalidate();
        emit frameLoaded();
      });
  invalidate();
}

void TimelineWidget::paintEvent(QPaintEvent*) {
  const TimelineScene& scene = this->scene();
  QPainter painter(this);
  painter.setRenderHint(QPainter::Antialiasing, false);
  painter.fillRect(rect(), kBackground);

  // Label gutter, host headers, row stripes and labels.
  painter.fillRect(scene.gutter, kGutter);
  QFont bold = font();
  bold.setBold(true);
  for (const SceneRow& row : scene.rows) {
    if (row.host_header) {
      painter.fillRect(QRect(0, row.top, width(), row.height), kHostBand);
      painter.setFont(bold);
    } else if (row.stripe) {
      painter.fillRect(QRect(scene.plot.left(), row.top, scene.plot.width(), row.height), kStripe);
    }
    painter.setPen(kText);
    if (row.label) drawSceneText(painter, *row.label);
    painter.setFont(font());
  }

  // Time axis with grid lines.
  painter.fillRect(scene.axis, kBackground);
  painter.setPen(kMuted);
  drawSceneText(painter, scene.axis_title);
  for (const AxisTick& tick : scene.ticks) {
    painter.setPen(kGrid);
    painter.drawLine(tick.x, scene.axis.bottom() + 1, tick.x, scene.plot.bottom());
    painter.setPen(kMuted);
    painter.drawLine(tick.x, scene.axis.bottom() - 5, tick.x, scene.axis.bottom());
    painter.setPen(kText);
    drawSceneText(painter, tick.label);
  }
  painter.setPen(kGrid);
  painter.drawLine(scene.plot.left(), scene.axis.bottom(), scene.plot.right(), scene.axis.bottom());

  painter.setClipRect(scene.plot);
  drawBars(painter, scene.posted);
  drawBars(painter, scene.bars);
  if (scene.selection) {
    painter.setPen(QPen(kOutline, 2));
    painter.setBrush(Qt::NoBrush);
    painter.drawRect(*scene.selection);
  }
  drawArrows(painter, scene.arrows, font());
  if (scene.rubber_band) {
    const QRect band = *scene.rubber_band;
    painter.fillRect(band, QColor(kRubberBand.red(), kRubberBand.green(), kRubberBand.blue(), 60));
    painter.setPen(kRubberBand);
    painter.drawLine(band.left(), band.top(), band.left(), band.bottom());
    painter.drawLine(band.left() + band.width(), band.top(), band.left() + band.width(), band.bottom());
  }
  painter.setClipping(false);

  // Legend and status line.
  painter.fillRect(scene.legend_area, kGutter);
  for (const LegendEntry& entry : scene.legend) {
    painter.fillRect(entry.swatch, entry.posted ? kMuted : apiColor(entry.api));
    painter.setPen(kText);
    drawSceneText(painter, entry.label);
  }
  if (scene.legend_more) {
    painter.setPen(kMuted);
    drawSceneText(painter, *scene.legend_more);
  }
  painter.setPen(scene.status_is_error ? kError : kMuted);
  drawSceneText(painter, scene.status);
}

void TimelineWidget::resizeEvent(QResizeEvent*) {
  invalidate();
  scheduleLoad();
}

void TimelineWidget::zoomBy(double factor, double anchor_x, bool record) {
  const TimelineMath m = math();
  state_->setWindow(zoomAround(state_->window(), m.xToTime(anchor_x), factor, state_->extent()), record);
}

void TimelineWidget::wheelEvent(QWheelEvent* event) {
  const double steps = event->angleDelta().y() / 120.0;
  if (steps == 0) return;
  zoomBy(std::pow(0.8, steps), event->position().x(), false);
  event->accept();
}

void TimelineWidget::mousePressEvent(QMouseEvent* event) {
  press_pos_ = event->position().toPoint();
  current_pos_ = press_pos_;
  press_window_ = state_->window();
  const bool select = event->button() == Qt::RightButton ||
                      (event->button() == Qt::LeftButton && (event->modifiers() & Qt::ShiftModifier));
  drag_ = select ? Drag::Select : (event->button() == Qt::LeftButton ? Drag::Pan : Drag::None);
  if (drag_ == Drag::Pan) setCursor(Qt::ClosedHandCursor);
}

void TimelineWidget::mouseMoveEvent(QMouseEvent* event) {
  current_pos_ = event->position().toPoint();
  if (drag_ == Drag::Pan) {
    const double ns_per_pixel = press_window_.length() / std::max(1, plotRect().width());
    const double delta = -(current_pos_.x() - press_pos_.x()) * ns_per_pixel;
    state_->setWindow(panBy(press_window_, delta, state_->extent()));
  } else if (drag_ == Drag::Select) {
    invalidate();
  }
}

void TimelineWidget::mouseReleaseEvent(QMouseEvent* event) {
  const QPoint pos = event->position().toPoint();
  const bool click = (pos - press_pos_).manhattanLength() < kDragThreshold;
  const Drag drag = drag_;
  drag_ = Drag::None;
  unsetCursor();
  if (drag == Drag::Select && !click) {
    const TimelineMath m = math();
    const double a = m.xToTime(std::min(press_pos_.x(), pos.x()));
    const double b = m.xToTime(std::max(press_pos_.x(), pos.x()));
    state_->setWindow({a, b}, true);
  } else if (drag == Drag::Pan && click) {
    if (const std::optional<storage::CallRecord> call = callAt(pos)) {
      state_->setSelection(SelectedCall{call->id, call->rank_id, call->start_ns, call->end_ns});
    } else {
      state_->setSelection(std::nullopt);
    }
  } else if (drag == Drag::Pan && !click) {
    // A pan is one step of the zoom history, not one per mouse move.
    const TimeRange now = state_->window();
    state_->setWindow(press_window_);
    state_->setWindow(now, true);
  }
  invalidate();
}

void TimelineWidget::mouseDoubleClickEvent(QMouseEvent* event) {
  zoomBy(0.5, event->position().x(), true);
}

void TimelineWidget::keyPressEvent(QKeyEvent* event) {
  const QRect plot = plotRect();
  const double middle = plot.left() + plot.width() / 2.0;
  switch (event->key()) {
    case Qt::Key_Plus:
    case Qt::Key_Equal: zoomBy(0.5, middle, true); return;
    case Qt::Key_Minus: zoomBy(2.0, middle, true); return;
    case Qt::Key_Left:
      state_->setWindow(panBy(state_->window(), -0.2 * state_->window().length(), state_->extent()));
      return;
    case Qt::Key_Right:
      state_->setWindow(panBy(state_->window(), 0.2 * state_->window().length(), state_->extent()));
      return;
    case Qt::Key_Backspace: state_->zoomBack(); return;
    case Qt::Key_0:
    case Qt::Key_Home: state_->resetZoom(); return;
    default: QWidget::keyPressEvent(event);
  }
}

std::optional<storage::CallRecord> TimelineWidget::callAt(QPoint point) const {
  if (!frame_) return std::nullopt;
  const storage::CallRecord* call = gui::callAt(scene(), *frame_, point);
  if (call == nullptr) return std::nullopt;
  return *call;
}

// A call's peers and, when matched, its partners; a nonblocking call's time between posting and waiting.
QString TimelineWidget::peerText(const storage::CallRecord& call) const {
  QString text;
  const auto time = [](std::int64_t ns) {
    return QString::fromStdString(tickLabel(static_cast<double>(ns), 1000));
  };
  if (isNonblocking(call.api) && call.enqueue_ns < call.start_ns) {
    text +=
        QStringLiteral("<br>posted at %1, waited for from %2 (%3 later)")
            .arg(time(call.enqueue_ns), time(call.start_ns), durationText(call.start_ns - call.enqueue_ns));
  }
  const std::vector<const PeerFlow*> flows = flows_ ? flows_->of(call.id) : std::vector<const PeerFlow*>{};
  for (const PeerFlow* flow : flows) {
    text += flow->send_call_id == call.id ? QStringLiteral("<br>sent to rank %1: received by call %2")
                                                .arg(flow->to_rank)
                                                .arg(flow->recv_call_id)
                                          : QStringLiteral("<br>received from rank %1: sent by call %2")
                                                .arg(flow->from_rank)
                                                .arg(flow->send_call_id);
    if (flow->tag >= 0) text += QStringLiteral(" · tag %1").arg(flow->tag);
  }
  if (flows.empty()) {
    const auto tag = [](int value) {
      return value >= 0 ? QStringLiteral(" · tag %1").arg(value) : QString();
    };
    if (call.dest >= 0)
      text += QStringLiteral("<br>to rank %1 of its communicator%2").arg(call.dest).arg(tag(call.send_tag));
    if (call.source >= 0)
      text +=
          QStringLiteral("<br>from rank %1 of its communicator%2").arg(call.source).arg(tag(call.recv_tag));
    if ((call.dest >= 0 || call.source >= 0) && flows_) text += QStringLiteral(" (no partner in the trace)");
  }
  if (call.recv_bytes >= 0 && call.api != Api::MpiRecv && call.api != Api::MpiIrecv &&
      call.api != Api::NcclRecv)
    text += QStringLiteral("<br>received %1").arg(bytesText(call.recv_bytes));
  if (call.peer_max_bytes >= 0) {
    text += QStringLiteral("<br>per peer %1 to %2")
                .arg(bytesText(call.peer_min_bytes), bytesText(call.peer_max_bytes));
  }
  return text;
}

QString TimelineWidget::tooltipAt(QPoint point) const {
  if (!frame_) return {};
  const TimelineScene& scene = this->scene();
  if (scene.legend_more && scene.legend_more->rect.contains(point))
    return scene.legend_hidden.join(QStringLiteral("<br>"));
  const SceneRow* row = scene.rankRowAt(point.y());
  if (row == nullptr) return {};
  const QString host = QString::fromStdString(row->host).toHtmlEscaped();
  if (frame_->detailed) {
    const storage::CallRecord* call = gui::callAt(scene, *frame_, point);
    if (call == nullptr) return {};
    QString text = QStringLiteral("<b>%1</b> · rank %2 (%3)<br>")
                       .arg(toQString(name(call->api)))
                       .arg(row->rank)
                       .arg(host);
    text += QStringLiteral("%1 · %2 × %3%4<br>")
                .arg(bytesText(call->bytes))
                .arg(call->count)
                .arg(toQString(name(call->dtype)))
                .arg(call->op == ReduceOp::None ? QString()
                                                : QStringLiteral(" · op ") + toQString(name(call->op)));
    text += QStringLiteral("duration %1 · starts at %2<br>")
                .arg(durationText(call->end_ns - call->start_ns))
                .arg(QString::fromStdString(tickLabel(static_cast<double>(call->start_ns), 1000)));
    text += QStringLiteral("call %1 · seq %2 · step %3")
                .arg(call->id)
                .arg(call->seq)
                .arg(call->step >= 0 ? QString::number(call->step) : QStringLiteral("–"));
    text += peerText(*call);
    if (call->graph_replay > 0)
      text += QStringLiteral("<br>CUDA graph replay %1 of the call captured with this seq")
                  .arg(call->graph_replay);
    const auto strategy = frame_->strategies.find(call->id);
    if (strategy != frame_->strategies.end()) {
      text += QStringLiteral("<br>apply mode ran <b>%1</b>")
                  .arg(QString::fromStdString(strategy->second).toHtmlEscaped());
    }
    return text;
  }
  const storage::TimelineBucket* bucket = bucketAt(scene, *frame_, point);
  if (bucket == nullptr || bucket->calls == 0) return {};
  const storage::TimelineSummary& summary = frame_->summary;
  const double bucket_ns = static_cast<double>(summary.t1_ns - summary.t0_ns) / std::max(1, summary.columns);
  return QStringLiteral(
             "<b>rank %1</b> (%2)<br>%3 calls in %4 · busy %5 (%6 %)<br>%7 · longest %8<br>mostly %9")
      .arg(row->rank)
      .arg(host)
      .arg(bucket->calls)
      .arg(durationText(bucket_ns))
      .arg(durationText(bucket->busy_ns))
      .arg(std::min(100.0, 100.0 * static_cast<double>(bucket->busy_ns) / bucket_ns), 0, 'f', 1)
      .arg(bytesText(bucket->bytes))
      .arg(durationText(bucket->max_ns))
      .arg(toQString(name(bucket->dominant_api)));
}

bool TimelineWidget::event(QEvent* event) {
  if (event->type() == QEvent::FontChange) scene_.reset();  // labels are measured in the widget's font
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    const QString text = tooltipAt(help->pos());
    if (text.isEmpty()) {
      QToolTip::hideText();
      event->ignore();
    } else {
      QToolTip::showText(help->globalPos(), text, this);
    }
    return true;
  }
  return QWidget::event(event);
}

}  // namespace gradscope::gui
