#pragma once

// Times and sizes as every view writes them: gradscope/common/units.h's formats, as QStrings.

#include <algorithm>
#include <cstdint>

#include <QString>

#include "gradscope/common/units.h"

namespace gradscope::gui {

// A duration; a negative one (a plan whose saving is a loss) keeps its sign.
inline QString durationText(double ns) {
  return QString::fromStdString(formatDuration(ns));
}
inline QString durationText(std::int64_t ns) {
  return durationText(static_cast<double>(ns));
}
// A part of a step, which cannot be negative: a value below 0 (a difference of two clocks' rounding)
// reads 0.
inline QString spanText(double ns) {
  return durationText(std::max(ns, 0.0));
}
// A size; below 0 (not known) reads 0 B.
inline QString bytesText(std::int64_t bytes) {
  return QString::fromStdString(formatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(bytes, 0))));
}

}  // namespace gradscope::gui
