#pragma once

// The timeline: one row per rank, grouped by host; a bar per call coloured by API (or by the strategy
// apply mode ran), or, zoomed out, one bar per pixel column from the store's aggregated tiles whose
// height is the share of the column the rank spent in collectives.
//
// The widget paints a TimelineScene (models/timeline_scene.h: rows, bars and labels as plain data, built
// again after anything it shows changed) and answers tooltips and clicks from the same scene, so what is
// hit is what was drawn.
//
// Selecting a point-to-point call draws an arrow from the send's end to its receive's end: the trace's
// messages (models/peer_flows.h) are matched once per trace on the thread pool, when it opens (again
// after a live trace grew, when a call is selected).
//
// Painting never waits for data: a frame (trace_data.h) is loaded on the thread pool for the window and
// width of the request; until the next one arrives, the last frame is drawn re-mapped onto the current
// window, so a pan or zoom repaints at once. Requests are coalesced (one per event-loop turn) and stale
// frames dropped (JobTracker). Bars are drawn batched by colour, without antialiasing.
//
// Mouse: wheel zooms around the cursor, left drag pans, right drag (or Shift + left drag) zooms to the
// selection, a click selects the call under the cursor, double click zooms in. Keys: + and - zoom,
// arrows pan, Backspace goes back, 0 shows everything.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <QPoint>
#include <QWidget>

#include "models/jobs.h"
#include "models/peer_flows.h"
#include "models/timeline_math.h"
#include "models/timeline_scene.h"
#include "models/trace_data.h"
#include "models/view_state.h"

namespace gradscope::gui {

class TimelineWidget : public QWidget {
  Q_OBJECT
 public:
  explicit TimelineWidget(ViewState* state, QWidget* parent = nullptr);

  void setTrace(const TraceInfo& info);
  void clear();
  // Asks for a new frame (the live mode's trace grew).
  void reload();

  bool hasFrame() const { return frame_.has_value(); }
  const TimelineFrame* frame() const { return frame_ ? &*frame_ : nullptr; }
  bool loading() const { return loading_; }
  // Frames delivered so far: a caller that changed the window waits for this to grow.
  std::uint64_t frameCount() const { return frame_count_; }
  // The area bars are drawn in, and the math that maps the current window onto it.
  QRect plotRect() const;
  TimelineMath math() const;
  // What the widget shows now, as data (built when it changed).
  const TimelineScene& scene() const;
  // The call drawn at a point (detailed frames only).
  std::optional<storage::CallRecord> callAt(QPoint point) const;
  // The trace's point-to-point messages; nullptr until they are loaded (or when they cannot be).
  const PeerFlows* flows() const { return flows_.get(); }

  // The height that shows every row at its largest: axis, host bands, rows and legend.
  int preferredHeight() const;
  QSize sizeHint() const override { return {1000, 320}; }
  QSize minimumSizeHint() const override { return {400, 160}; }

 signals:
  void frameLoaded();
  void loadFailed(const QString& message);

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseDoubleClickEvent(QMouseEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  bool event(QEvent* event) override;

 private:
  // Forgets the scene and schedules a repaint: what it shows changed.
  void invalidate();
  void scheduleLoad();
  void startLoad();
  void loadFlows();
  QString tooltipAt(QPoint point) const;
  QString peerText(const storage::CallRecord& call) const;
  void zoomBy(double factor, double anchor_x, bool record);

  ViewState* state_;
  std::string path_;
  std::vector<storage::RankInfo> ranks_;
  std::optional<TimelineFrame> frame_;
  std::shared_ptr<const PeerFlows> flows_;
  bool flows_stale_ = false;  // the trace grew since they were matched
  mutable std::optional<TimelineScene> scene_;
  QString error_;
  bool loading_ = false;
  bool load_scheduled_ = false;
  std::uint64_t frame_count_ = 0;
  JobTracker jobs_;
  JobTracker flow_jobs_;

  enum class Drag { None, Pan, Select };
  Drag drag_ = Drag::None;
  QPoint press_pos_;
  QPoint current_pos_;
  TimeRange press_window_;
};

}  // namespace gradscope::gui
