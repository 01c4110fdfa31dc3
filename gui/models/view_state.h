#pragma once

// The zoom, selection and filter state shared by every view of one trace (hotspot's
// FilterAndZoomStack): the timeline and the calls table both read it and change it only through these
// setters, so they never disagree about what is shown.

#include <cstdint>
#include <optional>
#include <vector>

#include <QObject>

#include "gradscope/common/types.h"
#include "models/timeline_math.h"

namespace gradscope::gui {

// Which calls the calls table lists (and the timeline emphasises).
struct CallFilter {
  std::optional<Api> api;
  std::optional<std::int64_t> rank_id;  // ranks.id
  std::int64_t min_bytes = 0;
  std::optional<std::int64_t> max_bytes;  // inclusive
  std::optional<std::int64_t> step;
  bool visible_window_only = true;  // only calls overlapping the timeline's window
  friend bool operator==(const CallFilter&, const CallFilter&) = default;
  bool matches(Api call_api, std::int64_t call_rank_id, std::int64_t bytes, std::int64_t call_step) const;
};

enum class ColourBy { Api, Strategy };

struct SelectedCall {
  std::int64_t id = 0;
  std::int64_t rank_id = 0;
  std::int64_t start_ns = 0, end_ns = 0;
  friend bool operator==(const SelectedCall&, const SelectedCall&) = default;
};

class ViewState : public QObject {
  Q_OBJECT
 public:
  explicit ViewState(QObject* parent = nullptr);

  // The trace's time range. keep_window: a live trace grew; the window stays, or follows the end when it
  // showed the end before. Otherwise the window becomes the whole extent and the zoom history is cleared.
  void setExtent(TimeRange extent, bool keep_window = false);
  TimeRange extent() const { return extent_; }

  TimeRange window() const { return window_; }
  // Clamped to the extent. record: the previous window goes on the zoom history (zoomBack returns to it).
  void setWindow(TimeRange window, bool record = false);
  bool zoomBack();  // false when the history is empty
  void resetZoom();
  std::size_t historyDepth() const { return history_.size(); }

  std::optional<SelectedCall> selection() const { return selection_; }
  void setSelection(std::optional<SelectedCall> selection);

  const CallFilter& filter() const { return filter_; }
  void setFilter(const CallFilter& filter);

  ColourBy colourBy() const { return colour_by_; }
  void setColourBy(ColourBy colour_by);

 signals:
  void windowChanged();
  void extentChanged();
  void selectionChanged();
  void filterChanged();
  void colourByChanged();

 private:
  TimeRange extent_;
  TimeRange window_;
  std::vector<TimeRange> history_;
  std::optional<SelectedCall> selection_;
  CallFilter filter_;
  ColourBy colour_by_ = ColourBy::Api;
};

}  // namespace gradscope::gui
