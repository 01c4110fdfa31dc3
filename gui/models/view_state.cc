#include "models/view_state.h"

namespace gradscope::gui {

namespace {
// Deep enough for any exploration; bounded so a long session does not grow it without end.
constexpr std::size_t kMaxHistory = 64;
}  // namespace

bool CallFilter::matches(Api call_api, std::int64_t call_rank_id, std::int64_t bytes,
                         std::int64_t call_step) const {
  if (api && *api != call_api) return false;
  if (rank_id && *rank_id != call_rank_id) return false;
  if (bytes < min_bytes) return false;
  if (max_bytes && bytes > *max_bytes) return false;
  if (step && *step != call_step) return false;
  return true;
}

ViewState::ViewState(QObject* parent) : QObject(parent) {}

void ViewState::setExtent(TimeRange extent, bool keep_window) {
  const TimeRange old_extent = extent_;
  extent_ = extent;
  emit extentChanged();
  if (!keep_window || window_.empty()) {
    history_.clear();
    window_ = extent;
    emit windowChanged();
    return;
  }
  // Live mode: a window that reached the old end keeps its length and follows the new end.
  TimeRange next = window_;
  if (window_.end_ns >= old_extent.end_ns) {
    if (window_ == old_extent) {
      next = extent;
    } else {
      next = {extent.end_ns - window_.length(), extent.end_ns};
    }
  }
  next = clampTo(next, extent_);
  if (!(next == window_)) {
    window_ = next;
    emit windowChanged();
  }
}

void ViewState::setWindow(TimeRange window, bool record) {
  if (window.length() < kMinWindowNs) {
    const double middle = (window.begin_ns + window.end_ns) / 2;
    window = {middle - kMinWindowNs / 2, middle + kMinWindowNs / 2};
  }
  window = clampTo(window, extent_);
  if (window == window_) return;
  if (record) {
    history_.push_back(window_);
    if (history_.size() > kMaxHistory) history_.erase(history_.begin());
  }
  window_ = window;
  emit windowChanged();
}

bool ViewState::zoomBack() {
  if (history_.empty()) return false;
  window_ = clampTo(history_.back(), extent_);
  history_.pop_back();
  emit windowChanged();
  return true;
}

void ViewState::resetZoom() {
  setWindow(extent_, true);
}

void ViewState::setSelection(std::optional<SelectedCall> selection) {
  if (selection == selection_) return;
  selection_ = selection;
  emit selectionChanged();
}

void ViewState::setFilter(const CallFilter& filter) {
  if (filter == filter_) return;
  filter_ = filter;
  emit filterChanged();
}

void ViewState::setColourBy(ColourBy colour_by) {
  if (colour_by == colour_by_) return;
  colour_by_ = colour_by;
  emit colourByChanged();
}

}  // namespace gradscope::gui
