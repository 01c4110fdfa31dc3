#pragma once

// Time↔pixel arithmetic of the timeline and the window operations behind zoom and pan, as plain
// functions on plain structs (no Qt), so that tests can pin them down exactly.
//
// Times are nanoseconds relative to the trace's origin, as doubles: a window narrower than one
// nanosecond is refused by the zoom (kMinWindowNs), and doubles hold every integer time of a trace
// (< 2^53 ns, 104 days) exactly.

#include <cstdint>
#include <string>
#include <vector>

namespace gradscope::gui {

// A half-open time range [begin_ns, end_ns).
struct TimeRange {
  double begin_ns = 0;
  double end_ns = 0;
  double length() const { return end_ns - begin_ns; }
  bool empty() const { return !(end_ns > begin_ns); }
  bool contains(double t) const { return t >= begin_ns && t < end_ns; }
  friend bool operator==(const TimeRange&, const TimeRange&) = default;
};

// The whole nanoseconds a window touches, [floor(begin), ceil(end)), at least one: what every view asks
// the store for, so that the timeline and the calls table ask for the same calls.
struct NanosecondWindow {
  std::int64_t t0_ns = 0, t1_ns = 0;
};
NanosecondWindow wholeNanoseconds(TimeRange window);

// The narrowest window the zoom goes to: 1 µs across the plot (a call is rarely shorter).
inline constexpr double kMinWindowNs = 1000.0;

// Maps the window onto the pixel span [x0, x0 + width) of the plot area.
struct TimelineMath {
  TimeRange window{0, 1};
  double x0 = 0;
  double width = 1;

  double nsPerPixel() const { return window.length() / width; }
  double timeToX(double t_ns) const { return x0 + (t_ns - window.begin_ns) * width / window.length(); }
  double xToTime(double x) const { return window.begin_ns + (x - x0) * window.length() / width; }
  // The pixel column a time falls in (floor of timeToX), clamped to [x0, x0 + width - 1].
  int columnOf(double t_ns) const;
};

// The window made `factor` times as long (< 1 zooms in) keeping `anchor_ns` at the same place on screen,
// then kept inside `extent` (see clampTo). A window shorter than kMinWindowNs grows to it around the anchor.
TimeRange zoomAround(TimeRange window, double anchor_ns, double factor, TimeRange extent);
// The window moved by delta_ns, kept inside extent.
TimeRange panBy(TimeRange window, double delta_ns, TimeRange extent);
// The window shifted (not shrunk) to lie inside extent; one longer than extent becomes extent. An empty
// extent leaves the window as it is.
TimeRange clampTo(TimeRange window, TimeRange extent);

// Tick marks of a time axis: the step is 1, 2 or 5 × 10^k ns, the largest number of ticks not above
// max_ticks; ticks are the multiples of the step inside [begin, end].
struct AxisTicks {
  double step_ns = 0;
  std::vector<double> ticks_ns;
};
double niceStep(double range_ns, int max_ticks);
AxisTicks axisTicks(TimeRange window, int max_ticks);
// A tick label in the largest unit that needs at most three decimals for the step (the same unit on
// every tick of an axis), with as many decimals as the step needs: "1.25 s", "12.5 ms", "800 ns".
std::string tickLabel(double t_ns, double step_ns);

// The chart axes of the analysis views.
//
// A linear value axis: [min, max] holds [lo, hi] with `margin` (a share of hi - lo) on each side, not
// below 0 when lo is not, and both ends are multiples of the step, 1, 2 or 5 × 10^k, chosen so that the
// axis has at most max_ticks ticks; `decimals` is what a label needs to show the step.
struct ValueAxisTicks {
  double min = 0;
  double max = 1;
  double step = 1;
  int ticks = 2;
  int decimals = 0;
};
ValueAxisTicks niceValueAxis(double lo, double hi, int max_ticks, double margin = 0.05);

// A log axis over [lo, hi] (both > 0): ticks at m × 10^k for m in the densest of {1, 2, 5}, {1, 3},
// {1} (then every 2nd, 5th, 10th… decade) that gives at most max_ticks ticks, the range widened to
// the tick just below lo and the one just above hi, so both ends are labelled.
struct LogAxisTicks {
  double min = 1;
  double max = 10;
  std::vector<double> ticks;
};
LogAxisTicks niceLogAxis(double lo, double hi, int max_ticks);
// A log-axis tick label. Plain: "0.5", "20", "500", and "2e-5", "1e6" outside [1e-3, 1e6); Si: "0.5",
// "20", "1k", "20k", "1M"; Scientific: "1", "1e-9", "2e-5", "1e3" (the same form on every tick).
enum class LogLabels { Plain, Si, Scientific };
std::string logTickLabel(double value, LogLabels style);

}  // namespace gradscope::gui
