#pragma once

// Small helpers shared by the analysis views: a chart with readable fonts and no animation, log and value
// axes with round ticks and units in their titles, a placeholder text for a chart without data, and the
// views' sortable tables.

#include <QAbstractItemModel>
#include <QString>
#include <QTableView>
#include <QtCharts/QCategoryAxis>
#include <QtCharts/QChart>
#include <QtCharts/QChartView>
#include <QtCharts/QValueAxis>

#include "models/scene_text.h"
#include "models/timeline_math.h"

class QFont;
class QPainter;

namespace gradscope::gui {

QChartView* makeChartView(const QString& title, QWidget* parent);
// A read-only table over `model` through a proxy sorting on kSortRole: rows selected whole, alternating
// colours, compact rows. `sort_column` < 0 keeps the model's own order (no sorting by the user).
QTableView* makeSortedTable(QAbstractItemModel* model, int sort_column, bool stretch_last, QWidget* parent);
// The analysis views' layout: `note` on top, then `charts` over `table` in a vertical splitter (3 : 1).
void layOutChartsOverTable(QWidget* view, QWidget* note, QWidget* charts, QTableView* table);
QValueAxis* makeValueAxis(const QString& title, const QString& format);
// Gives a value axis the range [lo, hi] with a margin, rounded to 1-2-5 ticks (niceValueAxis), and a
// label format with the digits the step needs.
void setNiceRange(QValueAxis* axis, double lo, double hi, int max_ticks, double margin = 0.05);

// A log axis the series plot on in log10 units (append logPosition(x), not x): a QCategoryAxis whose
// labelled grid lines sit at 1-2-5 (or 1-3, or decade) values, so that a narrow range still shows
// several readable labels, which QLogValueAxis (labels at powers of ten only) does not. The range is
// [lo, hi] widened to the ticks around it (niceLogAxis), labelled as logTickLabel does.
QCategoryAxis* makeLogAxis(const QString& title, double lo, double hi, int max_ticks, LogLabels style);
double logPosition(double value);
// Removes every series and axis, and sets a title that says why the chart is empty when `empty_reason`
// is set.
void resetChart(QChart* chart, const QString& title, const QString& empty_reason = {});

// The painted views' text (models/scene_text.h): measured with the widget's font, drawn where the scene
// placed it.
TextMetrics textMetricsOf(const QFont& font);
void drawSceneText(QPainter& painter, const SceneText& text);

}  // namespace gradscope::gui
