#include "models/timeline_scene.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "gradscope/common/units.h"
#include "models/palette.h"
#include "models/units_text.h"

namespace gradscope::gui {

namespace {

QString qstring(std::string_view text) {
  return QString::fromUtf8(text.data(), static_cast<qsizetype>(text.size()));
}

// Calls of a strategy-coloured frame that apply mode left as issued.
constexpr QRgb kRanAsIssued = 0xff9aa5b1;

std::vector<SceneRow> layoutRows(const TimelineSceneInput& input, QRect plot) {
  std::vector<SceneRow> rows;
  std::vector<const storage::RankInfo*> shown;
  for (const storage::RankInfo& rank : input.ranks) {
    if (!input.filter.rank_id || *input.filter.rank_id == rank.id) shown.push_back(&rank);
  }
  std::vector<int> host_ranks;  // per host, in row order
  for (std::size_t i = 0; i < shown.size(); ++i) {
    if (i == 0 || shown[i]->host != shown[i - 1]->host) host_ranks.push_back(0);
    ++host_ranks.back();
  }
  const int available = plot.height() - static_cast<int>(host_ranks.size()) * kTimelineHostHeight;
  const int count = std::max<int>(1, static_cast<int>(shown.size()));
  const int row_height = std::clamp(available / count, kTimelineMinRowHeight, kTimelineMaxRowHeight);
  const int width = input.size.width();
  int y = kTimelineAxisHeight;
  std::size_t host_index = 0;
  bool stripe = false;
  for (std::size_t i = 0; i < shown.size(); ++i) {
    if (i == 0 || shown[i]->host != shown[i - 1]->host) {
      SceneRow header;
      header.host_header = true;
      header.host = shown[i]->host;
      header.host_ranks = host_ranks[host_index++];
      header.top = y;
      header.height = kTimelineHostHeight;
      header.label = SceneText{QRect(8, y, width - 16, kTimelineHostHeight),
                               QStringLiteral("%1  ·  %2 rank%3")
                                   .arg(QString::fromStdString(header.host))
                                   .arg(header.host_ranks)
                                   .arg(header.host_ranks == 1 ? QString() : QStringLiteral("s")),
                               false};
      rows.push_back(std::move(header));
      y += kTimelineHostHeight;
      stripe = false;
    }
    SceneRow row;
    row.rank_id = shown[i]->id;
    row.rank = shown[i]->rank;
    row.host = shown[i]->host;
    row.clock_offset_ns = shown[i]->clock_offset_ns;
    row.top = y;
    row.height = row_height;
    row.stripe = stripe;
    stripe = !stripe;
    const int inset = std::max(1, row_height / 8);
    row.bar_top = y + inset;
    row.bar_height = std::max(2, row_height - 2 * inset);
    if (row_height >= input.text.height - 2)
      row.label = SceneText{QRect(12, y, kTimelineLabelWidth - 16, row_height),
                            QStringLiteral("rank %1").arg(row.rank), false};
    rows.push_back(std::move(row));
    y += row_height;
  }
  return rows;
}

std::vector<AxisTick> axisTicksOf(const TimelineSceneInput& input, QRect plot, const TimelineMath& m) {
  std::vector<AxisTick> ticks;
  const AxisTicks axis = axisTicks(m.window, std::max(2, plot.width() / 110));
  for (const double t : axis.ticks_ns) {
    const int x = static_cast<int>(std::lround(m.timeToX(t)));
    if (x < plot.left() || x > plot.right()) continue;
    const QString label = QString::fromStdString(tickLabel(t, axis.step_ns));
    const int label_width = input.text.width(label);
    const int left = std::clamp(x - label_width / 2, plot.left(),
                                std::max(plot.left(), input.size.width() - label_width - 4));
    ticks.push_back(
        {t, x, SceneText{QRect(left, 2, label_width + 2, kTimelineAxisHeight - 8), label, false}});
  }
  return ticks;
}

QRgb callColour(const TimelineSceneInput& input, const storage::CallRecord& call) {
  if (!input.filter.matches(call.api, call.rank_id, call.bytes, call.step)) return dimmedColor().rgb();
  if (input.colour_by == ColourBy::Strategy) {
    const auto found = input.frame->strategies.find(call.id);
    return found != input.frame->strategies.end() ? strategyColor(found->second).rgb() : kRanAsIssued;
  }
  return apiColor(call.api).rgb();
}

// The columns [left, right) a call's bar covers in the plot, at least one; nullopt when out of view.
std::optional<std::pair<int, int>> callColumns(const storage::CallRecord& call, double offset, QRect plot,
                                               const TimelineMath& m) {
  const double x0 = m.timeToX(static_cast<double>(call.start_ns) + offset);
  const double x1 = m.timeToX(static_cast<double>(call.end_ns) + offset);
  if (x1 < plot.left() || x0 >= plot.right() + 1) return std::nullopt;
  const int left = static_cast<int>(std::floor(std::max(x0, static_cast<double>(plot.left()))));
  const int right =
      std::max(left + 1, static_cast<int>(std::ceil(std::min(x1, static_cast<double>(plot.right() + 1)))));
  return std::pair{left, right};
}

// The columns [left, right) of a nonblocking call's posted part (enqueue to start); nullopt when it has
// none or it is out of view.
std::optional<std::pair<int, int>> postedColumns(const storage::CallRecord& call, double offset, QRect plot,
                                                 const TimelineMath& m) {
  if (!isNonblocking(call.api) || call.enqueue_ns >= call.start_ns) return std::nullopt;
  storage::CallRecord posted = call;
  posted.start_ns = call.enqueue_ns;
  posted.end_ns = call.start_ns;
  return callColumns(posted, offset, plot, m);
}

// The thin bars of one row: per colour, the union of its posted parts' columns.
void addPostedBars(TimelineScene& scene, std::size_t row_index,
                   std::map<QRgb, std::vector<std::pair<int, int>>>& parts) {
  const SceneRow& row = scene.rows[row_index];
  const int height = std::max(2, row.bar_height / 5);
  const int top = row.bar_top + (row.bar_height - height) / 2;
  for (auto& [colour, columns] : parts) {
    std::sort(columns.begin(), columns.end());
    std::optional<std::pair<int, int>> run;
    const auto flush = [&] {
      if (run)
        scene.posted.push_back(
            SceneBar{QRect(run->first, top, run->second - run->first, height), colour, row_index, 0, 0});
    };
    for (const auto& [left, right] : columns) {
      if (run && left <= run->second) {
        run->second = std::max(run->second, right);
        continue;
      }
      flush();
      run = std::pair{left, right};
    }
    flush();
  }
}

void addCallBars(const TimelineSceneInput& input, TimelineScene& scene, std::size_t row_index,
                 std::set<Api>& apis) {
  const SceneRow& row = scene.rows[row_index];
  const auto found = input.frame->calls.find(row.rank_id);
  if (found == input.frame->calls.end()) return;
  const std::vector<storage::CallRecord>& calls = found->second;
  const auto offset = static_cast<double>(row.clock_offset_ns);
  std::map<QRgb, std::vector<std::pair<int, int>>> posted;
  std::optional<SceneBar> run;
  const auto flush = [&] {
    if (run) scene.bars.push_back(*run);
  };
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto columns = callColumns(calls[i], offset, scene.plot, scene.math);
    const auto posted_part = postedColumns(calls[i], offset, scene.plot, scene.math);
    if (!columns && !posted_part) continue;
    const QRgb colour = callColour(input, calls[i]);
    apis.insert(calls[i].api);
    if (posted_part) posted[colour].push_back(*posted_part);
    if (!columns) continue;
    const auto [left, right] = *columns;
    if (run) {
      const int run_right = run->rect.left() + run->rect.width();
      // One colour sharing a column: the bar grows. Another colour inside columns drawn already: the call
      // joins the bar, unless it starts in the bar's last column; then it takes the next one, one column
      // late at most, so that a short call after a long one stays visible.
      const bool next_column = left + 1 == run_right && run_right <= scene.plot.right();
      if ((colour == run->colour && left <= run_right) || (right <= run_right && !next_column)) {
        if (right > run_right) run->rect.setRight(right - 1);
        run->last = i;
        continue;
      }
      flush();
      const int start = std::max(left, run_right);
      run = SceneBar{QRect(start, row.bar_top, 0, row.bar_height), colour, row_index, i, i};
      run->rect.setRight(std::max(right, start + 1) - 1);
    } else {
      run = SceneBar{QRect(left, row.bar_top, 0, row.bar_height), colour, row_index, i, i};
      run->rect.setRight(right - 1);
    }
  }
  flush();
  addPostedBars(scene, row_index, posted);
}

void addBucketBars(const TimelineSceneInput& input, TimelineScene& scene, std::size_t row_index,
                   std::set<Api>& apis) {
  const SceneRow& row = scene.rows[row_index];
  const storage::TimelineSummary& summary = input.frame->summary;
  const auto rank_index = std::find(summary.rank_ids.begin(), summary.rank_ids.end(), row.rank_id);
  if (rank_index == summary.rank_ids.end()) return;
  const auto& buckets = summary.buckets[static_cast<std::size_t>(rank_index - summary.rank_ids.begin())];
  const double bucket_ns = static_cast<double>(summary.t1_ns - summary.t0_ns) / std::max(1, summary.columns);
  const auto offset = static_cast<double>(row.clock_offset_ns);
  const QRect plot = scene.plot;
  int last_right = plot.left();
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    const storage::TimelineBucket& bucket = buckets[i];
    if (bucket.calls == 0) continue;
    const double begin = static_cast<double>(summary.t0_ns) + static_cast<double>(i) * bucket_ns + offset;
    const double x0 = scene.math.timeToX(begin);
    const double x1 = scene.math.timeToX(begin + bucket_ns);
    if (x1 < plot.left() || x0 > plot.right() + 1) continue;
    apis.insert(bucket.dominant_api);
    const int left = std::max(static_cast<int>(std::floor(x0)), last_right);
    const int right = std::min(
        std::max(static_cast<int>(std::floor(x0)) + 1, static_cast<int>(std::ceil(x1))), plot.right() + 1);
    if (right <= left) continue;  // its columns are drawn already
    last_right = right;
    const double occupancy = std::clamp(static_cast<double>(bucket.busy_ns) / bucket_ns, 0.0, 1.0);
    const int height = std::max(3, static_cast<int>(std::lround(occupancy * row.bar_height)));
    const bool match = !input.filter.api || *input.filter.api == bucket.dominant_api;
    scene.bars.push_back(SceneBar{QRect(left, row.bar_top + row.bar_height - height, right - left, height),
                                  (match ? apiColor(bucket.dominant_api) : dimmedColor()).rgb(), row_index, i,
                                  i});
  }
}

QString statusText(const TimelineSceneInput& input, const TimelineMath& m) {
  if (!input.error.isEmpty()) return input.error;
  if (!input.has_trace) return QStringLiteral("no trace");
  if (input.extent_empty)
    return QStringLiteral("this trace has no calls (see the other tabs for its measurements)");
  if (input.frame == nullptr) return QStringLiteral("loading…");
  const QString calls =
      QString::fromStdString(formatCount(static_cast<std::uint64_t>(input.frame->window_calls)));
  QString status = input.frame->detailed
                       ? QStringLiteral("%1 calls in view").arg(calls)
                       : QStringLiteral("%1 calls in view, aggregated per pixel column%2")
                             .arg(calls, input.colour_by == ColourBy::Strategy
                                             ? QStringLiteral(" (zoom in for strategy colours)")
                                             : QString());
  status += QStringLiteral("  ·  window %1").arg(durationText(m.window.length()));
  if (input.loading) status += QStringLiteral("  ·  loading…");
  return status;
}

const SceneRow* rankRow(const std::vector<SceneRow>& rows, std::int64_t rank_id) {
  for (const SceneRow& row : rows) {
    if (!row.host_header && row.rank_id == rank_id) return &row;
  }
  return nullptr;
}

// The part of the segment a→b inside `rect` (Liang–Barsky); nullopt when none.
std::optional<std::pair<QPointF, QPointF>> clipSegment(QPointF a, QPointF b, const QRectF& rect) {
  const double dx = b.x() - a.x();
  const double dy = b.y() - a.y();
  double enter = 0, leave = 1;
  const std::pair<double, double> edges[] = {{-dx, a.x() - rect.left()},
                                             {dx, rect.right() - a.x()},
                                             {-dy, a.y() - rect.top()},
                                             {dy, rect.bottom() - a.y()}};
  for (const auto& [p, q] : edges) {
    if (p == 0) {
      if (q < 0) return std::nullopt;  // parallel to this edge and outside it
      continue;
    }
    const double t = q / p;
    if (p < 0) enter = std::max(enter, t);
    else leave = std::min(leave, t);
    if (enter > leave) return std::nullopt;
  }
  return std::pair{QPointF(a.x() + enter * dx, a.y() + enter * dy),
                   QPointF(a.x() + leave * dx, a.y() + leave * dy)};
}

QPoint rounded(QPointF point) {
  return {static_cast<int>(std::lround(point.x())), static_cast<int>(std::lround(point.y()))};
}

void addArrows(const TimelineSceneInput& input, TimelineScene& scene) {
  if (!input.selection || input.flows == nullptr) return;
  // The plot's pixels are columns [left, right + 1): the segment may reach the last column's far edge.
  const QRectF plot(scene.plot.left(), scene.plot.top(), scene.plot.width(), scene.plot.height());
  for (const PeerFlow* flow : input.flows->of(input.selection->id)) {
    const SceneRow* sender = rankRow(scene.rows, flow->send_rank_id);
    const SceneRow* receiver = rankRow(scene.rows, flow->recv_rank_id);
    if (sender == nullptr || receiver == nullptr) continue;  // a rank the filter hides
    SceneArrow arrow;
    arrow.send_end =
        QPointF(scene.math.timeToX(static_cast<double>(flow->send_end_ns + sender->clock_offset_ns)),
                sender->bar_top + sender->bar_height / 2.0);
    arrow.recv_end =
        QPointF(scene.math.timeToX(static_cast<double>(flow->recv_end_ns + receiver->clock_offset_ns)),
                receiver->bar_top + receiver->bar_height / 2.0);
    const auto visible = clipSegment(arrow.send_end, arrow.recv_end, plot);
    if (!visible) continue;
    arrow.from = rounded(visible->first);
    arrow.to = rounded(visible->second);
    arrow.head = plot.contains(arrow.recv_end);
    arrow.tail = plot.contains(arrow.send_end);
    arrow.send_call_id = flow->send_call_id;
    arrow.recv_call_id = flow->recv_call_id;
    arrow.bytes = flow->bytes;
    arrow.tag = flow->tag;
    QString text = bytesText(flow->bytes);
    if (flow->tag >= 0) text += QStringLiteral(" · tag %1").arg(flow->tag);
    // Right of the visible part's middle (left of it near the plot's right edge), inside the plot.
    const int label_width = input.text.width(text) + 6;
    const QPoint middle = rounded((visible->first + visible->second) / 2);
    int left = middle.x() + 6;
    if (left + label_width > scene.plot.right()) left = middle.x() - 6 - label_width;
    left = std::max(left, scene.plot.left());
    const int top = std::clamp(middle.y() - input.text.height / 2, scene.plot.top(),
                               std::max(scene.plot.top(), scene.plot.bottom() - input.text.height));
    arrow.label = SceneText{QRect(left, top, label_width, input.text.height), text, false};
    scene.arrows.push_back(std::move(arrow));
  }
}

// The legend: an entry per API in view, then the posted key, left to right in the space the status line
// leaves; when they do not all fit, the last ones that do make room for "+N more".
void layOutLegend(const TimelineSceneInput& input, TimelineScene& scene, const std::set<Api>& apis,
                  const QString& status) {
  const int width = input.size.width();
  const int top = input.size.height() - kTimelineLegendHeight;
  scene.legend_area = QRect(0, top, width, kTimelineLegendHeight);
  const auto entry = [&](Api api, const QString& label, bool posted) {
    const QRect swatch = posted ? QRect(0, top + 11, 12, 3) : QRect(0, top + 7, 12, 12);
    return LegendEntry{
        api, swatch,
        SceneText{QRect(16, top, input.text.width(label) + 4, kTimelineLegendHeight), label, false}, posted};
  };
  std::vector<LegendEntry> entries;
  for (const Api api : apis) entries.push_back(entry(api, qstring(name(api)), false));
  if (!scene.posted.empty())
    entries.push_back(entry(Api::Unknown, QStringLiteral("thin: posted, not yet waited for"), true));

  const int limit = width - 8 - (status.isEmpty() ? 0 : input.text.width(status) + 16);
  const auto advance = [](const LegendEntry& e) { return e.label.rect.width() + 28; };  // swatch, label, gaps
  int x = 8;
  std::size_t shown = 0;
  while (shown < entries.size() && x + advance(entries[shown]) - 16 <= limit) x += advance(entries[shown++]);
  QString more;
  while (shown < entries.size()) {
    more = QStringLiteral("+%1 more").arg(entries.size() - shown);
    if (x + input.text.width(more) + 4 <= limit || shown == 0) break;
    x -= advance(entries[--shown]);
  }

  x = 8;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i >= shown) {
      scene.legend_hidden << entries[i].label.text;
      continue;
    }
    entries[i].swatch.moveLeft(x);
    entries[i].label.rect.moveLeft(x + 16);
    x += advance(entries[i]);
    scene.legend.push_back(std::move(entries[i]));
  }
  if (!more.isEmpty() && x + input.text.width(more) + 4 <= limit) {
    scene.legend_more =
        SceneText{QRect(x, top, input.text.width(more) + 4, kTimelineLegendHeight), more, false};
    x += scene.legend_more->rect.width() + 12;
  }
  scene.status = SceneText{QRect(x, top, width - x - 8, kTimelineLegendHeight), status, true};
}

}  // namespace

QRect timelinePlotRect(QSize size) {
  return {kTimelineLabelWidth, kTimelineAxisHeight, std::max(1, size.width() - kTimelineLabelWidth - 8),
          std::max(1, size.height() - kTimelineAxisHeight - kTimelineLegendHeight)};
}

TimelineMath timelineMath(QRect plot, TimeRange window) {
  TimelineMath m;
  m.window = window.empty() ? TimeRange{0, 1} : window;
  m.x0 = plot.left();
  m.width = plot.width();
  return m;
}

int preferredTimelineHeight(std::span<const storage::RankInfo> ranks) {
  int hosts = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i == 0 || ranks[i].host != ranks[i - 1].host) ++hosts;
  }
  return kTimelineAxisHeight + hosts * kTimelineHostHeight +
         static_cast<int>(ranks.size()) * kTimelineMaxRowHeight + kTimelineLegendHeight + 8;
}

TimelineScene buildTimelineScene(const TimelineSceneInput& input) {
  TimelineScene scene;
  scene.size = input.size;
  scene.plot = timelinePlotRect(input.size);
  scene.math = timelineMath(scene.plot, input.window);
  scene.detailed = input.frame != nullptr && input.frame->detailed;
  const int width = input.size.width();
  const int height = input.size.height();

  scene.gutter = QRect(0, 0, kTimelineLabelWidth, height);
  scene.rows = layoutRows(input, scene.plot);
  scene.axis = QRect(0, 0, width, kTimelineAxisHeight);
  scene.axis_title =
      SceneText{QRect(8, 0, kTimelineLabelWidth - 12, kTimelineAxisHeight), QStringLiteral("time"), false};
  scene.ticks = axisTicksOf(input, scene.plot, scene.math);

  std::set<Api> apis;  // in view, in API order (the legend's)
  if (input.frame != nullptr) {
    for (std::size_t r = 0; r < scene.rows.size(); ++r) {
      if (scene.rows[r].host_header) continue;
      if (scene.detailed) addCallBars(input, scene, r, apis);
      else addBucketBars(input, scene, r, apis);
    }
  }

  if (input.selection) {
    for (const SceneRow& row : scene.rows) {
      if (row.host_header || row.rank_id != input.selection->rank_id) continue;
      const auto offset = static_cast<double>(row.clock_offset_ns);
      const double x0 = scene.math.timeToX(static_cast<double>(input.selection->start_ns) + offset);
      const double x1 = scene.math.timeToX(static_cast<double>(input.selection->end_ns) + offset);
      const int left = static_cast<int>(std::floor(x0)) - 2;
      const int right = std::max(left + 5, static_cast<int>(std::ceil(x1)) + 2);
      scene.selection = QRect(left, row.top + 1, right - left, row.height - 2);
    }
  }
  if (input.rubber_band) {
    const int left = std::min(input.rubber_band->first, input.rubber_band->second);
    const int right = std::max(input.rubber_band->first, input.rubber_band->second);
    scene.rubber_band = QRect(left, scene.plot.top(), right - left, scene.plot.height());
  }

  addArrows(input, scene);
  layOutLegend(input, scene, apis, statusText(input, scene.math));
  scene.status_is_error = !input.error.isEmpty();
  return scene;
}

const SceneRow* TimelineScene::rankRowAt(int y) const {
  for (const SceneRow& row : rows) {
    if (!row.host_header && y >= row.top && y < row.top + row.height) return &row;
  }
  return nullptr;
}

const SceneBar* TimelineScene::barAt(QPoint point) const {
  const SceneRow* row = rankRowAt(point.y());
  if (row == nullptr || !plot.contains(point)) return nullptr;
  const auto row_index = static_cast<std::size_t>(row - rows.data());
  const int slack = detailed ? kTimelineHitSlack : 0;
  // Bars are ordered by row, then left to right: the row's bars are one stretch.
  const auto begin = std::lower_bound(bars.begin(), bars.end(), row_index,
                                      [](const SceneBar& bar, std::size_t r) { return bar.row < r; });
  const SceneBar* best = nullptr;
  int best_distance = slack + 1;
  for (auto it = begin; it != bars.end() && it->row == row_index; ++it) {
    const int left = it->rect.left();
    const int right = it->rect.left() + it->rect.width();  // exclusive
    if (left > point.x() + slack) break;
    const int distance =
        point.x() < left ? left - point.x() : (point.x() >= right ? point.x() - right + 1 : 0);
    if (distance < best_distance) {
      best = &*it;
      best_distance = distance;
    }
  }
  return best;
}

const storage::CallRecord* callAt(const TimelineScene& scene, const TimelineFrame& frame, QPoint point) {
  if (!scene.detailed) return nullptr;
  const SceneBar* bar = scene.barAt(point);
  if (bar == nullptr) return nullptr;
  const SceneRow& row = scene.rows[bar->row];
  const auto found = frame.calls.find(row.rank_id);
  if (found == frame.calls.end() || bar->last >= found->second.size()) return nullptr;
  const double t = scene.math.xToTime(point.x()) - static_cast<double>(row.clock_offset_ns);
  const storage::CallRecord* best = nullptr;
  double best_distance = 0;
  for (std::size_t i = bar->first; i <= bar->last; ++i) {
    const storage::CallRecord& call = found->second[i];
    const auto start = static_cast<double>(call.start_ns);
    const auto end = static_cast<double>(call.end_ns);
    const double distance = t < start ? start - t : (t > end ? t - end : 0);
    if (best == nullptr || distance < best_distance) {
      best = &call;
      best_distance = distance;
    }
  }
  return best;
}

const storage::TimelineBucket* bucketAt(const TimelineScene& scene, const TimelineFrame& frame,
                                        QPoint point) {
  if (scene.detailed) return nullptr;
  const SceneBar* bar = scene.barAt(point);
  if (bar == nullptr) return nullptr;
  const storage::TimelineSummary& summary = frame.summary;
  const auto rank_index =
      std::find(summary.rank_ids.begin(), summary.rank_ids.end(), scene.rows[bar->row].rank_id);
  if (rank_index == summary.rank_ids.end()) return nullptr;
  const auto& buckets = summary.buckets[static_cast<std::size_t>(rank_index - summary.rank_ids.begin())];
  return bar->first < buckets.size() ? &buckets[bar->first] : nullptr;
}

}  // namespace gradscope::gui
