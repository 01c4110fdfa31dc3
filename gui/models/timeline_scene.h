#pragma once

// The timeline as plain data, as hotspot keeps TimeLineData apart from its delegate: the rows, bars,
// labels, axis and legend that TimelineWidget paints, made by one function from the frame, the ranks, the
// view state and the widget's size. The widget paints the scene and nothing else, and its tooltips and
// clicks ask the same scene what lies under the cursor, so what can be hit is what was drawn; the tests
// read the scene instead of counting pixels. No widget or painter here: text widths come in as a
// function (the widget's font metrics, or a fixed width in tests).
//
// Geometry, in the widget's pixels: the label gutter on the left, the time axis on top, the legend and
// status line at the bottom, the plot in between; a header row per host, then a row per rank. Bars lie
// inside the plot, at most one per pixel column and row:
// - detailed frames: a bar per run of calls of one colour that share pixel columns. A call of another
//   colour whose columns are all drawn already joins the bar that drew them, unless it starts in that
//   bar's last column: then it takes the next column, so a short call right after a long one stays
//   visible, one column late at most (a dense window never pushes bars further from their calls).
// - aggregated frames: a bar per bucket, its height the share of the bucket spent in collectives, its
//   colour the bucket's dominant API. A frame with more buckets than columns (an older frame drawn while
//   a zoom-out loads) gives a column to the first of its buckets.
// - a nonblocking call (MPI_Isend, MPI_Iallreduce, ...) of a detailed frame also has a thin bar from when it
//   was posted (enqueue_ns) to when the rank began waiting for it (start_ns), under the full bar of its
//   wait (start_ns to end_ns); overlapping thin bars of one colour merge, so a row holds at most one per
//   pixel column and colour. They are drawn under the full bars and hit nothing.
// - when the selected call is a point-to-point call whose partner the trace has (peer_flows.h), an arrow
//   goes from the send's end on the sender's row to the receive's end on the receiver's row; an
//   MPI_Sendrecv has two (the message it sent and the one it received).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <QColor>
#include <QPoint>
#include <QPointF>
#include <QRect>
#include <QSize>
#include <QString>
#include <QStringList>

#include "gradscope/storage/records.h"
#include "models/peer_flows.h"
#include "models/scene_text.h"
#include "models/timeline_math.h"
#include "models/trace_data.h"
#include "models/view_state.h"

namespace gradscope::gui {

// Fixed sizes of the timeline's parts, in pixels.
inline constexpr int kTimelineLabelWidth = 130;
inline constexpr int kTimelineAxisHeight = 30;
inline constexpr int kTimelineLegendHeight = 24;
inline constexpr int kTimelineHostHeight = 20;
inline constexpr int kTimelineMaxRowHeight = 34;
inline constexpr int kTimelineMinRowHeight = 6;
// A thin bar is drawn one pixel wide: a point this many pixels beside a call's bar still hits it.
inline constexpr int kTimelineHitSlack = 2;

// The plot (where bars go) of a timeline of this size.
QRect timelinePlotRect(QSize size);
// The window mapped onto the plot; an empty window maps as [0, 1).
TimelineMath timelineMath(QRect plot, TimeRange window);
// The height that shows every row at its largest: axis, host headers, rows and legend.
int preferredTimelineHeight(std::span<const storage::RankInfo> ranks);

struct SceneRow {
  bool host_header = false;  // a host's header, else a rank's row
  std::string host;
  int host_ranks = 0;  // header rows: ranks shown under it
  std::int64_t rank_id = 0;
  int rank = 0;
  std::int64_t clock_offset_ns = 0;  // added to the rank's times
  int top = 0, height = 0;           // across the whole width
  bool stripe = false;               // rank rows: every other row under a header is shaded
  int bar_top = 0, bar_height = 0;   // rank rows: the band bars fill
  std::optional<SceneText> label;    // the header's text, or "rank N" when the row is tall enough
};

struct SceneBar {
  QRect rect;
  QRgb colour = 0;
  std::size_t row = 0;  // index in TimelineScene::rows
  // What it stands for. Detailed frames: the calls [first, last] of frame.calls.at(rank id), in start
  // order (a call of another colour among them was hidden by this bar). Aggregated frames: the bucket
  // `first` (== last) of the rank's buckets in frame.summary.
  std::size_t first = 0, last = 0;
};

struct AxisTick {
  double t_ns = 0;
  int x = 0;
  SceneText label;
};

struct LegendEntry {
  Api api = Api::Unknown;
  QRect swatch;
  SceneText label;
  bool posted = false;  // the key of the thin posted bars (a thin grey swatch), not an API
};

// A message between two calls, drawn as an arrow from the send's end to the receive's end.
struct SceneArrow {
  // Both ends in the widget's pixels (clock offsets applied), wherever they fall, even far outside the plot.
  QPointF send_end, recv_end;
  // The part of the segment inside the plot, what is drawn; an arrowhead at `to` when `head`, which is
  // when the receive's end is in the plot.
  QPoint from, to;
  bool head = false;
  bool tail = false;  // the send's end is in the plot: a dot there
  std::int64_t send_call_id = 0, recv_call_id = 0;
  std::int64_t bytes = 0;
  int tag = -1;
  SceneText label;  // "4.0 MiB · tag 1", above the middle of the visible part, inside the plot
};

struct TimelineScene {
  QSize size;
  QRect plot;
  TimelineMath math;
  bool detailed = false;  // bars are calls; else buckets

  QRect gutter;  // behind the row labels
  std::vector<SceneRow> rows;
  QRect axis;  // the time axis band
  SceneText axis_title;
  std::vector<AxisTick> ticks;
  std::vector<SceneBar> posted;      // thin bars of nonblocking calls' posted parts, row by row
  std::vector<SceneBar> bars;        // row by row, left to right
  std::optional<QRect> selection;    // outline of the selected call (may reach past the plot)
  std::optional<QRect> rubber_band;  // a zoom-to-selection drag
  std::vector<SceneArrow> arrows;    // the selected call's messages (those with a visible part)
  QRect legend_area;
  std::vector<LegendEntry> legend;  // the APIs of the calls (or buckets) in view, then the posted key
  // When the legend is too long for the space the status line leaves it: "+3 more", and their names.
  std::optional<SceneText> legend_more;
  QStringList legend_hidden;
  SceneText status;
  bool status_is_error = false;

  // The rank row at height y; nullptr over a header, the axis or the legend.
  const SceneRow* rankRowAt(int y) const;
  // The bar under a point of the plot, in the rank row under it: aggregated, the bar whose columns hold
  // x; detailed, the nearest bar within kTimelineHitSlack columns. nullptr when none.
  const SceneBar* barAt(QPoint point) const;
};

struct TimelineSceneInput {
  QSize size;
  std::span<const storage::RankInfo> ranks;  // in row order (TraceInfo::ranks)
  const TimelineFrame* frame = nullptr;      // nullptr until one is loaded
  TimeRange window;
  CallFilter filter;
  ColourBy colour_by = ColourBy::Api;
  std::optional<SelectedCall> selection;
  const PeerFlows* flows = nullptr;  // the trace's messages, for the selected call's arrows; nullptr: none
  std::optional<std::pair<int, int>> rubber_band;  // x of a zoom-to-selection drag's ends
  // The status line's facts.
  QString error;
  bool has_trace = false;
  bool extent_empty = false;
  bool loading = false;
  TextMetrics text;
};

TimelineScene buildTimelineScene(const TimelineSceneInput& input);

// The call drawn at a point of a scene built from `frame` (detailed frames): of the calls the bar under the
// point stands for, the one nearest to the point's time (the earliest of a tie). nullptr when no bar is.
const storage::CallRecord* callAt(const TimelineScene& scene, const TimelineFrame& frame, QPoint point);
// The bucket drawn at a point (aggregated frames), nullptr when none.
const storage::TimelineBucket* bucketAt(const TimelineScene& scene, const TimelineFrame& frame, QPoint point);

}  // namespace gradscope::gui
