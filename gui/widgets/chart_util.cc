#include "widgets/chart_util.h"

#include <cmath>

#include <QFontMetrics>
#include <QHeaderView>
#include <QPainter>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QVBoxLayout>
#include <QtCharts/QLegend>

#include "models/analysis_models.h"
#include "models/timeline_math.h"

namespace gradscope::gui {

void layOutChartsOverTable(QWidget* view, QWidget* note, QWidget* charts, QTableView* table) {
  auto* splitter = new QSplitter(Qt::Vertical, view);
  splitter->addWidget(charts);
  splitter->addWidget(table);
  splitter->setStretchFactor(0, 3);
  splitter->setStretchFactor(1, 1);
  auto* layout = new QVBoxLayout(view);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->addWidget(note);
  layout->addWidget(splitter, 1);
}

QTableView* makeSortedTable(QAbstractItemModel* model, int sort_column, bool stretch_last, QWidget* parent) {
  auto* proxy = new QSortFilterProxyModel(parent);
  proxy->setSourceModel(model);
  proxy->setSortRole(kSortRole);
  auto* table = new QTableView(parent);
  table->setModel(proxy);
  table->setSortingEnabled(sort_column >= 0);
  if (sort_column >= 0) table->sortByColumn(sort_column, Qt::AscendingOrder);
  table->setAlternatingRowColors(true);
  table->verticalHeader()->hide();
  table->verticalHeader()->setDefaultSectionSize(table->fontMetrics().height() + 6);
  table->horizontalHeader()->setStretchLastSection(stretch_last);
  table->setSelectionBehavior(QAbstractItemView::SelectRows);
  return table;
}

QChartView* makeChartView(const QString& title, QWidget* parent) {
  auto* chart = new QChart;
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->legend()->setAlignment(Qt::AlignRight);
  QFont font = chart->titleFont();
  font.setPointSizeF(font.pointSizeF() * 1.1);
  font.setBold(true);
  chart->setTitleFont(font);
  chart->setTitle(title);
  chart->setMargins(QMargins(4, 4, 12, 4));  // room for the last x label
  auto* view = new QChartView(chart, parent);
  view->setRenderHint(QPainter::Antialiasing, true);
  view->setMinimumSize(320, 240);
  return view;
}

double logPosition(double value) {
  return std::log10(value);
}

QCategoryAxis* makeLogAxis(const QString& title, double lo, double hi, int max_ticks, LogLabels style) {
  const LogAxisTicks ticks = niceLogAxis(lo, hi, max_ticks);
  auto* axis = new QCategoryAxis;
  axis->setTitleText(title);
  axis->setLabelsPosition(QCategoryAxis::AxisLabelsPositionOnValue);
  // The end ticks are labelled at the plot's edges: let their labels reach into the margin rather than
  // elide them ("10…").
  axis->setTruncateLabels(false);
  axis->setStartValue(logPosition(ticks.min));
  for (const double tick : ticks.ticks) {
    axis->append(QString::fromStdString(logTickLabel(tick, style)), logPosition(tick));
  }
  axis->setRange(logPosition(ticks.min), logPosition(ticks.max));
  return axis;
}

QValueAxis* makeValueAxis(const QString& title, const QString& format) {
  auto* axis = new QValueAxis;
  axis->setTitleText(title);
  axis->setLabelFormat(format);
  return axis;
}

void setNiceRange(QValueAxis* axis, double lo, double hi, int max_ticks, double margin) {
  const ValueAxisTicks ticks = niceValueAxis(lo, hi, max_ticks, margin);
  axis->setRange(ticks.min, ticks.max);
  axis->setTickType(QValueAxis::TicksFixed);
  axis->setTickCount(ticks.ticks);
  axis->setLabelFormat(QStringLiteral("%.%1f").arg(ticks.decimals));
}

void resetChart(QChart* chart, const QString& title, const QString& empty_reason) {
  chart->removeAllSeries();
  for (QAbstractAxis* axis : chart->axes()) {
    chart->removeAxis(axis);
    delete axis;
  }
  chart->setTitle(empty_reason.isEmpty() ? title : QStringLiteral("%1 — %2").arg(title, empty_reason));
}

TextMetrics textMetricsOf(const QFont& font) {
  const QFontMetrics metrics(font);
  return {metrics.height(), [metrics](const QString& text) { return metrics.horizontalAdvance(text); }};
}

void drawSceneText(QPainter& painter, const SceneText& text) {
  const Qt::Alignment alignment = Qt::AlignVCenter | (text.right ? Qt::AlignRight : Qt::AlignLeft);
  painter.drawText(text.rect, static_cast<int>(alignment.toInt()), text.text);
}

}  // namespace gradscope::gui
