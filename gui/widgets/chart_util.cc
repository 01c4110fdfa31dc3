#include "widgets/chart_util.h"

#include <QtCharts/QLegend>

namespace gradscope::gui {

QChartView* makeChartView(const QString& title, QWidget* parent) {
  auto* chart = new QChart;
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->legend()->setAlignment(Qt::AlignRight);
  QFont font = chart->titleFont();
  font.setPointSizeF(font.pointSizeF() * 1.1);
  font.setBold(true);
  chart->setTitleFont(font);
  chart->setTitle(title);
  chart->setMargins(QMargins(4, 4, 4, 4));
  auto* view = new QChartView(chart, parent);
  view->setRenderHint(QPainter::Antialiasing, true);
  view->setMinimumSize(320, 240);
  return view;
}

QLogValueAxis* makeLogAxis(const QString& title, const QString& format) {
  auto* axis = new QLogValueAxis;
  axis->setTitleText(title);
  axis->setLabelFormat(format);
  axis->setBase(10);
  axis->setMinorTickCount(-1);
  return axis;
}

QValueAxis* makeValueAxis(const QString& title, const QString& format) {
  auto* axis = new QValueAxis;
  axis->setTitleText(title);
  axis->setLabelFormat(format);
  return axis;
}

void resetChart(QChart* chart, const QString& title, const QString& empty_reason) {
  chart->removeAllSeries();
  for (QAbstractAxis* axis : chart->axes()) {
    chart->removeAxis(axis);
    delete axis;
  }
  chart->setTitle(empty_reason.isEmpty() ? title : QStringLiteral("%1 — %2").arg(title, empty_reason));
}

}  // namespace gradscope::gui
