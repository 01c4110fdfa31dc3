#pragma once

// Colours of APIs and strategies: a fixed qualitative palette (Tableau 10, readable on white and
// distinguishable by most colour-blind readers), so that an API or a strategy keeps its colour in every
// view and every session.

#include <string_view>

#include <QColor>

#include "gradscope/common/types.h"

namespace gradscope::gui {

inline constexpr int kPaletteSize = 10;
QColor paletteColor(int index);  // index modulo kPaletteSize
QColor apiColor(Api api);
// By a stable hash of the name (FNV-1a), so a strategy's colour does not depend on which others exist.
QColor strategyColor(std::string_view strategy);
// Bars that a filter leaves out.
QColor dimmedColor();

}  // namespace gradscope::gui
