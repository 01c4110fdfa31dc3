#include "models/timeline_math.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace gradscope::gui {

int TimelineMath::columnOf(double t_ns) const {
  const double x = std::floor(timeToX(t_ns));
  const double last = x0 + width - 1;
  return static_cast<int>(std::clamp(x, x0, std::max(x0, last)));
}

TimeRange clampTo(TimeRange window, TimeRange extent) {
  if (extent.empty()) return window;
  if (window.length() >= extent.length()) return extent;
  if (window.begin_ns < extent.begin_ns) return {extent.begin_ns, extent.begin_ns + window.length()};
  if (window.end_ns > extent.end_ns) return {extent.end_ns - window.length(), extent.end_ns};
  return window;
}

TimeRange zoomAround(TimeRange window, double anchor_ns, double factor, TimeRange extent) {
  if (window.empty() || !(factor > 0)) return clampTo(window, extent);
  double length = window.length() * factor;
  // Where the anchor sits in the window, 0..1: kept, so the point under the cursor stays under it.
  const double share = std::clamp((anchor_ns - window.begin_ns) / window.length(), 0.0, 1.0);
  if (length < kMinWindowNs) length = kMinWindowNs;
  const double begin = anchor_ns - share * length;
  return clampTo({begin, begin + length}, extent);
}

TimeRange panBy(TimeRange window, double delta_ns, TimeRange extent) {
  return clampTo({window.begin_ns + delta_ns, window.end_ns + delta_ns}, extent);
}

double niceStep(double range_ns, int max_ticks) {
  if (!(range_ns > 0) || max_ticks < 1) return 1;
  const double raw = range_ns / max_ticks;
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (;;) {
    for (const double multiple : {1.0, 2.0, 5.0}) {
      const double step = multiple * magnitude;
      if (step >= raw * (1 - 1e-9)) return std::max(step, 1.0);
    }
    magnitude *= 10;
  }
}

AxisTicks axisTicks(TimeRange window, int max_ticks) {
  AxisTicks result;
  if (window.empty()) return result;
  result.step_ns = niceStep(window.length(), max_ticks);
  const double first = std::ceil(window.begin_ns / result.step_ns) * result.step_ns;
  for (double t = first; t <= window.end_ns + 1e-9 * result.step_ns; t += result.step_ns) {
    result.ticks_ns.push_back(t);
    if (result.ticks_ns.size() > static_cast<std::size_t>(max_ticks) + 2) break;  // guards rounding
  }
  return result;
}

std::string tickLabel(double t_ns, double step_ns) {
  struct Unit {
    double ns;
    const char* name;
  };
  static constexpr Unit kUnits[] = {{1e9, "s"}, {1e6, "ms"}, {1e3, "µs"}, {1, "ns"}};
  const Unit* unit = &kUnits[3];
  // The largest unit that needs at most three decimals for this step, the same for every tick of an axis.
  for (const Unit& candidate : kUnits) {
    if (step_ns >= candidate.ns / 1000 * (1 - 1e-9)) {
      unit = &candidate;
      break;
    }
  }
  // Decimals: enough to tell two neighbouring ticks apart.
  const double step_in_unit = step_ns / unit->ns;
  int decimals = 0;
  if (step_in_unit < 1) decimals = static_cast<int>(std::ceil(-std::log10(step_in_unit) - 1e-9));
  decimals = std::clamp(decimals, 0, 9);
  const double value = t_ns / unit->ns;
  return fmt::format("{:.{}f} {}", std::abs(value) < 0.5 * std::pow(10.0, -decimals) ? 0.0 : value, decimals,
                     unit->name);
}

}  // namespace gradscope::gui
