#pragma once

// Small helpers shared by the chart views: a chart with readable fonts and no animation, log and value
// axes with units in their titles, and a placeholder text for a chart without data.

#include <QString>
#include <QtCharts/QChart>
#include <QtCharts/QChartView>
#include <QtCharts/QLogValueAxis>
#include <QtCharts/QValueAxis>

namespace gradscope::gui {

QChartView* makeChartView(const QString& title, QWidget* parent);
QLogValueAxis* makeLogAxis(const QString& title, const QString& format);
QValueAxis* makeValueAxis(const QString& title, const QString& format);
// Removes every series and axis, and sets a title that says why the chart is empty when `empty_reason`
// is set.
void resetChart(QChart* chart, const QString& title, const QString& empty_reason = {});

}  // namespace gradscope::gui
