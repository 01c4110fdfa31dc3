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

namespace gradscope::gui {

namespace {
constexpr int kLabelWidth = 130;
constexpr int kAxisHeight = 30;
constexpr int kLegendHeight = 24;
constexpr int kHostHeight = 20;
constexpr int kMaxRowHeight = 34;
constexpr int kMinRowHeight = 6;
constexpr int kDragThreshold = 4;  // pixels a press may move and still be a click
const QColor kBackground(0xff, 0xff, 0xff);
const QColor kGutter(0xf3, 0xf4, 0xf6);
const QColor kStripe(0xf8, 0xf9, 0xfb);
const QColor kHostBand(0xe4, 0xe8, 0xee);
const QColor kText(0x22, 0x26, 0x2e);
const QColor kMuted(0x6b, 0x72, 0x80);
const QColor kGrid(0xe2, 0xe5, 0xea);

// Rectangles grouped by colour, so that a frame is one drawRects per colour.
class BarBatch {
 public:
  void add(QRgb colour, const QRect& rect) { rects_[colour].push_back(rect); }
  void draw(QPainter& painter) const {
    painter.setPen(Qt::NoPen);
    for (const auto& [colour, rects] : rects_) {
      painter.setBrush(QColor::fromRgb(colour));
      painter.drawRects(rects.data(), static_cast<int>(rects.size()));
    }
  }

 private:
  std::map<QRgb, std::vector<QRect>> rects_;
};
}  // namespace

TimelineWidget::TimelineWidget(ViewState* state, QWidget* parent)
    : QWidget(parent), state_(state), jobs_(this) {
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  setAttribute(Qt::WA_OpaquePaintEvent);
  connect(state_, &ViewState::windowChanged, this, [this] {
    update();
    scheduleLoad();
  });
  connect(state_, &ViewState::colourByChanged, this, [this] {
    update();
    scheduleLoad();
  });
  connect(state_, &ViewState::filterChanged, this, [this] {
    layoutRows();
    update();
  });
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
    }
    update();
  });
}

void TimelineWidget::setTrace(const TraceInfo& info) {
  path_ = info.path;
  ranks_ = info.ranks;
  frame_.reset();
  error_.clear();
  layoutRows();
  update();
  scheduleLoad();
}

void TimelineWidget::clear() {
  jobs_.cancel();
  path_.clear();
  ranks_.clear();
  rows_.clear();
  frame_.reset();
  loading_ = false;
  update();
}

void TimelineWidget::reload() {
  scheduleLoad();
}

int TimelineWidget::preferredHeight() const {
  int hosts = 0;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    if (i == 0 || ranks_[i].host != ranks_[i - 1].host) ++hosts;
  }
  return kAxisHeight + hosts * kHostHeight + static_cast<int>(ranks_.size()) * kMaxRowHeight + kLegendHeight +
         8;
}

QRect TimelineWidget::plotRect() const {
  return {kLabelWidth, kAxisHeight, std::max(1, width() - kLabelWidth - 8),
          std::max(1, height() - kAxisHeight - kLegendHeight)};
}

TimelineMath TimelineWidget::math() const {
  const QRect plot = plotRect();
  TimelineMath m;
  m.window = state_->window().empty() ? TimeRange{0, 1} : state_->window();
  m.x0 = plot.left();
  m.width = plot.width();
  return m;
}

void TimelineWidget::layoutRows() {
  rows_.clear();
  const CallFilter& filter = state_->filter();
  std::vector<const storage::RankInfo*> shown;
  for (const storage::RankInfo& rank : ranks_) {
    if (!filter.rank_id || *filter.rank_id == rank.id) shown.push_back(&rank);
  }
  std::vector<std::pair<std::string, int>> hosts;  // in row order, with their rank counts
  for (const storage::RankInfo* rank : shown) {
    if (hosts.empty() || hosts.back().first != rank->host) hosts.emplace_back(rank->host, 0);
    ++hosts.back().second;
  }
  const int available = plotRect().height() - static_cast<int>(hosts.size()) * kHostHeight;
  const int count = std::max<int>(1, static_cast<int>(shown.size()));
  const int row_height = std::clamp(available / count, kMinRowHeight, kMaxRowHeight);
  int y = kAxisHeight;
  std::size_t host_index = 0;
  for (std::size_t i = 0; i < shown.size(); ++i) {
    if (i == 0 || shown[i]->host != shown[i - 1]->host) {
      Row header;
      header.host_header = true;
      header.host = shown[i]->host;
      header.host_ranks = hosts[host_index++].second;
      header.top = y;
      header.height = kHostHeight;
      rows_.push_back(header);
      y += kHostHeight;
    }
    Row row;
    row.rank_id = shown[i]->id;
    row.rank = shown[i]->rank;
    row.host = shown[i]->host;
    row.clock_offset_ns = shown[i]->clock_offset_ns;
    row.top = y;
    row.height = row_height;
    rows_.push_back(row);
    y += row_height;
  }
}

const TimelineWidget::Row* TimelineWidget::rowAt(int y) const {
  for (const Row& row : rows_) {
    if (!row.host_header && y >= row.top && y < row.top + row.height) return &row;
  }
  return nullptr;
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
          update();
          emit loadFailed(outcome.error);
          return;
        }
        error_.clear();
        frame_ = std::move(*outcome.value);
        ++frame_count_;
        update();
        emit frameLoaded();
      });
  update();
}

QColor TimelineWidget::callColour(const storage::CallRecord& call) const {
  const CallFilter& filter = state_->filter();
  if (!filter.matches(call.api, call.rank_id, call.bytes, call.step)) return dimmedColor();
  if (state_->colourBy() == ColourBy::Strategy && frame_) {
    const auto found = frame_->strategies.find(call.id);
    if (found != frame_->strategies.end()) return strategyColor(found->second);
    return QColor(0x9a, 0xa5, 0xb1);  // ran as issued
  }
  return apiColor(call.api);
}

void TimelineWidget::paintEvent(QPaintEvent*) {
  QPainter painter(this);
  painter.setRenderHint(QPainter::Antialiasing, false);
  painter.fillRect(rect(), kBackground);
  const QRect plot = plotRect();
  const TimelineMath m = math();
  const QFontMetrics metrics(font());

  // Label gutter and row stripes.
  painter.fillRect(QRect(0, 0, kLabelWidth, height()), kGutter);
  bool stripe = false;
  for (const Row& row : rows_) {
    if (row.host_header) {
      painter.fillRect(QRect(0, row.top, width(), row.height), kHostBand);
      painter.setPen(kText);
      QFont bold = font();
      bold.setBold(true);
      painter.setFont(bold);
      painter.drawText(QRect(8, row.top, width() - 16, row.height), Qt::AlignVCenter | Qt::AlignLeft,
                       QStringLiteral("%1  ·  %2 rank%3")
                           .arg(QString::fromStdString(row.host))
                           .arg(row.host_ranks)
                           .arg(row.host_ranks == 1 ? QString() : QStringLiteral("s")));
      painter.setFont(font());
      stripe = false;
      continue;
    }
    if (stripe) painter.fillRect(QRect(plot.left(), row.top, plot.width(), row.height), kStripe);
    stripe = !stripe;
    if (row.height >= metrics.height() - 2) {
      painter.setPen(kText);
      painter.drawText(QRect(12, row.top, kLabelWidth - 16, row.height), Qt::AlignVCenter | Qt::AlignLeft,
                       QStringLiteral("rank %1").arg(row.rank));
    }
  }

  // Time axis with grid lines.
  const int max_ticks = std::max(2, plot.width() / 110);
  const AxisTicks ticks = axisTicks(m.window, max_ticks);
  painter.fillRect(QRect(0, 0, width(), kAxisHeight), kBackground);
  painter.setPen(kMuted);
  painter.drawText(QRect(8, 0, kLabelWidth - 12, kAxisHeight), Qt::AlignVCenter | Qt::AlignLeft,
                   QStringLiteral("time"));
  for (const double t : ticks.ticks_ns) {
    const int x = static_cast<int>(std::lround(m.timeToX(t)));
    if (x < plot.left() || x > plot.right()) continue;
    painter.setPen(kGrid);
    painter.drawLine(x, kAxisHeight, x, plot.bottom());
    painter.setPen(kMuted);
    painter.drawLine(x, kAxisHeight - 6, x, kAxisHeight - 1);
    const QString label = QString::fromStdString(tickLabel(t, ticks.step_ns));
    const int label_width = metrics.horizontalAdvance(label);
    const int left =
        std::clamp(x - label_width / 2, plot.left(), std::max(plot.left(), width() - label_width - 4));
    painter.setPen(kText);
    painter.drawText(QRect(left, 2, label_width + 2, kAxisHeight - 8), Qt::AlignVCenter | Qt::AlignLeft,
                     label);
  }
  painter.setPen(kGrid);
  painter.drawLine(plot.left(), kAxisHeight - 1, plot.right(), kAxisHeight - 1);

  painter.setClipRect(plot);
  BarBatch batch;
  std::map<Api, bool> apis_seen;
  if (frame_) {
    const CallFilter& filter = state_->filter();
    for (const Row& row : rows_) {
      if (row.host_header) continue;
      const int bar_top = row.top + std::max(1, row.height / 8);
      const int bar_height = std::max(2, row.height - 2 * std::max(1, row.height / 8));
      const auto offset = static_cast<double>(row.clock_offset_ns);
      if (frame_->detailed) {
        const auto found = frame_->calls.find(row.rank_id);
        if (found == frame_->calls.end()) continue;
        // Coalesce neighbours of one colour that share pixel columns: one primitive per column at most.
        int run_left = 0, run_right = -1;
        QRgb run_colour = 0;
        for (const storage::CallRecord& call : found->second) {
          const double x0 = m.timeToX(static_cast<double>(call.start_ns) + offset);
          const double x1 = m.timeToX(static_cast<double>(call.end_ns) + offset);
          if (x1 < plot.left() || x0 > plot.right() + 1) continue;
          const int left = static_cast<int>(std::floor(std::max(x0, static_cast<double>(plot.left()))));
          const int right = std::max(
              left + 1, static_cast<int>(std::ceil(std::min(x1, static_cast<double>(plot.right() + 1)))));
          const QRgb colour = callColour(call).rgb();
          apis_seen[call.api] = true;
          if (colour == run_colour && left <= run_right) {
            run_right = std::max(run_right, right);
            continue;
          }
          if (run_right > run_left)
            batch.add(run_colour, QRect(run_left, bar_top, run_right - run_left, bar_height));
          run_left = std::max(left, run_right);
          run_right = std::max(right, run_left + 1);
          run_colour = colour;
        }
        if (run_right > run_left)
          batch.add(run_colour, QRect(run_left, bar_top, run_right - run_left, bar_height));
      } else {
        const storage::TimelineSummary& summary = frame_->summary;
        const auto rank_index = std::find(summary.rank_ids.begin(), summary.rank_ids.end(), row.rank_id);
        if (rank_index == summary.rank_ids.end()) continue;
        const auto& buckets =
            summary.buckets[static_cast<std::size_t>(rank_index - summary.rank_ids.begin())];
        const double bucket_ns =
            static_cast<double>(summary.t1_ns - summary.t0_ns) / std::max(1, summary.columns);
        int last_right = -1;
        for (std::size_t i = 0; i < buckets.size(); ++i) {
          const storage::TimelineBucket& bucket = buckets[i];
          if (bucket.calls == 0) continue;
          const double begin =
              static_cast<double>(summary.t0_ns) + static_cast<double>(i) * bucket_ns + offset;
          const double x0 = m.timeToX(begin);
          const double x1 = m.timeToX(begin + bucket_ns);
          if (x1 < plot.left() || x0 > plot.right() + 1) continue;
          int left = static_cast<int>(std::floor(x0));
          if (left < last_right) left = last_right;  // a stale frame zoomed out: one bar per column
          const int right = std::max(left + 1, static_cast<int>(std::ceil(x1)));
          if (left >= right) continue;
          last_right = right;
          const double occupancy = std::clamp(static_cast<double>(bucket.busy_ns) / bucket_ns, 0.0, 1.0);
          const int h = std::max(3, static_cast<int>(std::lround(occupancy * bar_height)));
          const bool match = (!filter.api || *filter.api == bucket.dominant_api);
          apis_seen[bucket.dominant_api] = true;
          batch.add((match ? apiColor(bucket.dominant_api) : dimmedColor()).rgb(),
                    QRect(left, bar_top + bar_height - h, right - left, h));
        }
      }
    }
  }
  batch.draw(painter);

  // The selected call, outlined.
  if (const std::optional<SelectedCall> selection = state_->selection()) {
    for (const Row& row : rows_) {
      if (row.host_header || row.rank_id != selection->rank_id) continue;
      const auto offset = static_cast<double>(row.clock_offset_ns);
      const double x0 = m.timeToX(static_cast<double>(selection->start_ns) + offset);
      const double x1 = m.timeToX(static_cast<double>(selection->end_ns) + offset);
      const int left = static_cast<int>(std::floor(x0)) - 2;
      const int right = std::max(left + 5, static_cast<int>(std::ceil(x1)) + 2);
      painter.setPen(QPen(QColor(0x11, 0x11, 0x11), 2));
      painter.setBrush(Qt::NoBrush);
      painter.drawRect(QRect(left, row.top + 1, right - left, row.height - 2));
    }
  }

  // Rubber band of a zoom-to-selection drag.
  if (drag_ == Drag::Select) {
    const int left = std::min(press_pos_.x(), current_pos_.x());
    const int right = std::max(press_pos_.x(), current_pos_.x());
    painter.fillRect(QRect(left, plot.top(), right - left, plot.height()), QColor(0x4e, 0x79, 0xa7, 60));
    painter.setPen(QColor(0x4e, 0x79, 0xa7));
    painter.drawLine(left, plot.top(), left, plot.bottom());
    painter.drawLine(right, plot.top(), right, plot.bottom());
  }
  painter.setClipping(false);

  // Legend and state line.
  const int legend_top = height() - kLegendHeight;
  painter.fillRect(QRect(0, legend_top, width(), kLegendHeight), kGutter);
  int x = 8;
  painter.setPen(kText);
  for (const auto& [api, seen] : apis_seen) {
    if (!seen) continue;
    painter.fillRect(QRect(x, legend_top + 7, 12, 12), apiColor(api));
    const QString label = toQString(name(api));
    painter.setPen(kText);
    painter.drawText(QRect(x + 16, legend_top, metrics.horizontalAdvance(label) + 4, kLegendHeight),
                     Qt::AlignVCenter | Qt::AlignLeft, label);
    x += 16 + metrics.horizontalAdvance(label) + 16;
  }
  QString status;
  if (!error_.isEmpty()) {
    status = error_;
  } else if (path_.empty()) {
    status = QStringLiteral("no trace");
  } else if (state_->extent().empty()) {
    status = QStringLiteral("this trace has no calls (see the other tabs for its measurements)");
  } else if (!frame_) {
    status = QStringLiteral("loading…");
  } else {
    status =
        frame_->detailed
            ? QStringLiteral("%1 calls in view")
                  .arg(QString::fromStdString(formatCount(static_cast<std::uint64_t>(frame_->window_calls))))
            : QStringLiteral("%1 calls in view, aggregated per pixel column%2")
                  .arg(QString::fromStdString(formatCount(static_cast<std::uint64_t>(frame_->window_calls))),
                       state_->colourBy() == ColourBy::Strategy
                           ? QStringLiteral(" (zoom in for strategy colours)")
                           : QString());
    status += QStringLiteral("  ·  window %1").arg(QString::fromStdString(formatDuration(m.window.length())));
    if (loading_) status += QStringLiteral("  ·  loading…");
  }
  painter.setPen(error_.isEmpty() ? kMuted : QColor(0xc6, 0x28, 0x28));
  painter.drawText(QRect(x, legend_top, width() - x - 8, kLegendHeight), Qt::AlignVCenter | Qt::AlignRight,
                   status);
}

void TimelineWidget::resizeEvent(QResizeEvent*) {
  layoutRows();
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
    update();
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
  update();
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
  const Row* row = rowAt(point.y());
  if (row == nullptr || !frame_ || !frame_->detailed || !plotRect().contains(point)) return std::nullopt;
  const auto found = frame_->calls.find(row->rank_id);
  if (found == frame_->calls.end()) return std::nullopt;
  const TimelineMath m = math();
  const double t = m.xToTime(point.x()) - static_cast<double>(row->clock_offset_ns);
  const double slack = 2 * m.nsPerPixel();  // thin bars are drawn one pixel wide: hit them within two
  const std::vector<storage::CallRecord>& calls = found->second;
  // Calls are ordered by start: look at those starting up to the cursor (plus slack), nearest first.
  auto it = std::upper_bound(
      calls.begin(), calls.end(), t + slack,
      [](double time, const storage::CallRecord& call) { return time < static_cast<double>(call.start_ns); });
  const storage::CallRecord* best = nullptr;
  double best_distance = slack;
  for (int checked = 0; it != calls.begin() && checked < 64; ++checked) {
    --it;
    const auto start = static_cast<double>(it->start_ns);
    const auto end = static_cast<double>(it->end_ns);
    const double distance = t < start ? start - t : (t > end ? t - end : 0);
    if (distance <= best_distance) {
      best = &*it;
      best_distance = distance;
      if (distance == 0) break;
    }
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

QString TimelineWidget::tooltipAt(QPoint point) const {
  const Row* row = rowAt(point.y());
  if (row == nullptr || !frame_ || !plotRect().contains(point)) return {};
  const QString host = QString::fromStdString(row->host).toHtmlEscaped();
  if (frame_->detailed) {
    const std::optional<storage::CallRecord> call = callAt(point);
    if (!call) return {};
    QString text = QStringLiteral("<b>%1</b> · rank %2 (%3)<br>")
                       .arg(toQString(name(call->api)))
                       .arg(row->rank)
                       .arg(host);
    text += QStringLiteral("%1 · %2 × %3%4<br>")
                .arg(QString::fromStdString(
                    formatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(call->bytes, 0)))))
                .arg(call->count)
                .arg(toQString(name(call->dtype)))
                .arg(call->op == ReduceOp::None ? QString()
                                                : QStringLiteral(" · op ") + toQString(name(call->op)));
    text +=
        QStringLiteral("duration %1 · starts at %2<br>")
            .arg(QString::fromStdString(formatDuration(static_cast<double>(call->end_ns - call->start_ns))))
            .arg(QString::fromStdString(tickLabel(static_cast<double>(call->start_ns), 1000)));
    text += QStringLiteral("call %1 · seq %2 · step %3")
                .arg(call->id)
                .arg(call->seq)
                .arg(call->step >= 0 ? QString::number(call->step) : QStringLiteral("–"));
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
  const storage::TimelineSummary& summary = frame_->summary;
  const auto rank_index = std::find(summary.rank_ids.begin(), summary.rank_ids.end(), row->rank_id);
  if (rank_index == summary.rank_ids.end() || summary.columns <= 0) return {};
  const TimelineMath m = math();
  const double t = m.xToTime(point.x()) - static_cast<double>(row->clock_offset_ns);
  const double bucket_ns = static_cast<double>(summary.t1_ns - summary.t0_ns) / summary.columns;
  const auto column = static_cast<long>(std::floor((t - static_cast<double>(summary.t0_ns)) / bucket_ns));
  const auto& buckets = summary.buckets[static_cast<std::size_t>(rank_index - summary.rank_ids.begin())];
  if (column < 0 || column >= static_cast<long>(buckets.size())) return {};
  const storage::TimelineBucket& bucket = buckets[static_cast<std::size_t>(column)];
  if (bucket.calls == 0) return {};
  return QStringLiteral(
             "<b>rank %1</b> (%2)<br>%3 calls in %4 · busy %5 (%6 %)<br>%7 · longest %8<br>mostly %9")
      .arg(row->rank)
      .arg(host)
      .arg(bucket.calls)
      .arg(QString::fromStdString(formatDuration(bucket_ns)))
      .arg(QString::fromStdString(formatDuration(static_cast<double>(bucket.busy_ns))))
      .arg(std::min(100.0, 100.0 * static_cast<double>(bucket.busy_ns) / bucket_ns), 0, 'f', 1)
      .arg(QString::fromStdString(
          formatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(bucket.bytes, 0)))))
      .arg(QString::fromStdString(formatDuration(static_cast<double>(bucket.max_ns))))
      .arg(toQString(name(bucket.dominant_api)));
}

bool TimelineWidget::event(QEvent* event) {
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
