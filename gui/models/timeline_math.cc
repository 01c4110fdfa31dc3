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

NanosecondWindow wholeNanoseconds(TimeRange window) {
  const auto t0 = static_cast<std::int64_t>(std::floor(window.begin_ns));
  return {t0, std::max(t0 + 1, static_cast<std::int64_t>(std::ceil(window.end_ns)))};
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

namespace {
// 1, 2 or 5 × 10^k, the smallest not below raw (> 0).
double niceAtLeast(double raw) {
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (;;) {
    for (const double multiple : {1.0, 2.0, 5.0}) {
      if (multiple * magnitude >= raw * (1 - 1e-9)) return multiple * magnitude;
    }
    magnitude *= 10;
  }
}
}  // namespace

ValueAxisTicks niceValueAxis(double lo, double hi, int max_ticks, double margin) {
  ValueAxisTicks axis;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return axis;
  if (lo > hi) std::swap(lo, hi);
  if (!(hi > lo)) {
    // One value: a range around it, ±10% of it (±1 around 0).
    const double half = lo != 0 ? std::abs(lo) * 0.1 : 1;
    lo -= half;
    hi += half;
    margin = 0;
  }
  const bool non_negative = lo >= 0;
  const double pad = (hi - lo) * std::max(margin, 0.0);
  double a = lo - pad;
  const double b = hi + pad;
  if (non_negative && a < 0) a = 0;
  max_ticks = std::max(max_ticks, 2);
  double step = niceAtLeast((b - a) / (max_ticks - 1));
  for (;;) {
    axis.min = std::floor(a / step + 1e-9) * step;
    axis.max = std::ceil(b / step - 1e-9) * step;
    axis.ticks = static_cast<int>(std::lround((axis.max - axis.min) / step)) + 1;
    if (axis.ticks <= max_ticks) break;
    step = niceAtLeast(step * 1.01);
  }
  axis.step = step;
  axis.decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)), 0, 12);
  return axis;
}

LogAxisTicks niceLogAxis(double lo, double hi, int max_ticks) {
  LogAxisTicks axis;
  if (!(lo > 0) || !(hi > 0) || !std::isfinite(lo) || !std::isfinite(hi)) return axis;
  if (lo > hi) std::swap(lo, hi);
  max_ticks = std::max(max_ticks, 2);
  // Ticks of a mantissa set every `every` decades, from the one at or below lo to the one at or above hi.
  const auto ticksOf = [lo, hi](const std::vector<double>& mantissas, int every) {
    std::vector<double> ticks;
    const int first = static_cast<int>(std::floor(std::log10(lo) + 1e-9)) - 1;
    const int k0 = static_cast<int>(std::floor(static_cast<double>(first) / every)) * every;
    for (int k = k0;; k += every) {
      for (const double m : mantissas) {
        const double value = m * std::pow(10.0, k);
        if (value <= lo * (1 + 1e-9)) {
          ticks.assign(1, value);  // the last one at or below lo
        } else if (!ticks.empty()) {
          ticks.push_back(value);
          if (value >= hi * (1 - 1e-9)) return ticks;
        }
      }
    }
  };
  static const std::vector<std::vector<double>> kMantissas = {{1, 2, 5}, {1, 3}, {1}};
  for (const std::vector<double>& mantissas : kMantissas) {
    axis.ticks = ticksOf(mantissas, 1);
    if (static_cast<int>(axis.ticks.size()) <= max_ticks) break;
  }
  for (int every = 2; static_cast<int>(axis.ticks.size()) > max_ticks && every < 1000;
       every = static_cast<int>(niceAtLeast(every * 1.01))) {
    axis.ticks = ticksOf({1}, every);
  }
  axis.min = axis.ticks.front();
  axis.max = axis.ticks.back();
  return axis;
}

std::string logTickLabel(double value, LogLabels style) {
  if (!(value > 0)) return "0";
  const int exponent = static_cast<int>(std::floor(std::log10(value) + 1e-9));
  const double mantissa = std::round(value / std::pow(10.0, exponent) * 1e6) / 1e6;
  if (style == LogLabels::Si && exponent >= 3) {
    static constexpr const char* kPrefixes[] = {"k", "M", "G", "T", "P", "E"};
    const int group = std::min(exponent / 3, 6);
    return fmt::format("{:g}{}", value / std::pow(10.0, 3 * group), kPrefixes[group - 1]);
  }
  const bool scientific = style == LogLabels::Scientific
                              ? exponent != 0
                              : exponent < -3 || (style == LogLabels::Plain && exponent >= 6);
  if (scientific) return fmt::format("{:g}e{}", mantissa, exponent);
  return fmt::format("{:g}", value);
}

}  // namespace gradscope::gui
