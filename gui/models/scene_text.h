#pragma once

// What the scenes (timeline_scene.h, comm_matrix.h) say about text: a text and the rectangle it is drawn
// in, and how wide a text is. Scenes hold no font: widths come in as a function (the widget's font
// metrics, or a fixed width per character in tests).

#include <functional>

#include <QRect>
#include <QString>

namespace gradscope::gui {

struct TextMetrics {
  int height = 0;                            // of a line of text
  std::function<int(const QString&)> width;  // advance of a text
};

// A text and the rectangle it is drawn in (vertically centred, left-aligned unless `right`).
struct SceneText {
  QRect rect;
  QString text;
  bool right = false;
};

}  // namespace gradscope::gui
