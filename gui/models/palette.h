#pragma once

// Colours of APIs and strategies, fixed so that an API or a strategy keeps its colour in every view and
// every session.
//
// An API's colour says what the call does (common/types.h collectiveOf), not which library issued it:
// MPI_Allreduce and ncclAllReduce share a colour. Collectives keep the Tableau 10 hues (readable on white,
// distinguishable by most colour-blind readers); the kinds schema v5 added have hues of their own, chosen
// for their distance from every other colour (CIELAB ΔE ≥ 15):
// - point-to-point is one family of golds, dark to light: sends, MPI_Sendrecv (both), receives;
// - all-to-all a magenta, gather and scatter two teals, barriers a slate, NCCL group launches brown;
// - a nonblocking call (isNonblocking: MPI_Isend, MPI_Iallreduce, ...) is its blocking form's colour
//   mixed 35% toward white, so the legend tells the two apart; the timeline also draws its posted part.

#include <string_view>

#include <QColor>

#include "gradscope/common/types.h"

namespace gradscope::gui {

inline constexpr int kPaletteSize = 10;
QColor paletteColor(int index);  // Tableau 10, index modulo kPaletteSize
// Every Api has one; Api::Unknown (and any code this build does not know) is grey.
QColor apiColor(Api api);
// By a stable hash of the name (FNV-1a), so a strategy's colour does not depend on which others exist.
QColor strategyColor(std::string_view strategy);
// Bars that a filter leaves out.
QColor dimmedColor();

// The painted views' ink (timeline, steps, communication matrix): text, secondary text, grid lines, and
// the outline of what the pointer or the selection marks.
inline const QColor kText{0x22, 0x26, 0x2e};
inline const QColor kMuted{0x6b, 0x72, 0x80};
inline const QColor kGrid{0xe2, 0xe5, 0xea};
inline const QColor kOutline{0x11, 0x11, 0x11};

}  // namespace gradscope::gui
