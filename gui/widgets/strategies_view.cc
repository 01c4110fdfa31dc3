#include "widgets/strategies_view.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QIcon>
#include <QLabel>
#include <QListWidget>
#include <QPixmap>
#include <QTableView>
#include <QVBoxLayout>
#include <QtCharts/QAreaSeries>
#include <QtCharts/QLegendMarker>
#include <QtCharts/QLineSeries>
#include <QtCharts/QScatterSeries>

#include "gradscope/common/units.h"
#include "gradscope/tuner/model.h"
#include "models/palette.h"
#include "models/units_text.h"
#include "widgets/chart_util.h"

namespace gradscope::gui {

namespace {
// Strategies drawn by default: the baseline and the fastest at the largest size, at most this many.
constexpr int kDefaultChecked = 7;
// Exact strategies have no log position: they are drawn at this error, and a note under the chart says so.
constexpr double kExactErrorFloor = 1e-9;
// The min–max bands of the time chart: light enough that seven overlapping ones leave the lines readable.
constexpr int kBandAlpha = 14;

QString groupLabel(Api api, DType dtype, int world) {
  return QStringLiteral("%1 · %2 · %3 ranks").arg(toQString(name(api)), toQString(name(dtype))).arg(world);
}

}  // namespace

StrategiesView::StrategiesView(QWidget* parent)
    : QWidget(parent), model_(new StrategiesModel(this)), jobs_(this) {
  table_ = makeSortedTable(model_, 0, true, this);
  group_ = new QComboBox(this);
  size_ = new QComboBox(this);
  strategies_ = new QListWidget(this);
  strategies_->setMinimumWidth(200);
  strategies_->setMaximumWidth(260);
  time_chart_ = makeChartView(QStringLiteral("Time vs size"), this);
  busbw_chart_ = makeChartView(QStringLiteral("Bus bandwidth vs size"), this);
  error_chart_ = makeChartView(QStringLiteral("Error vs time"), this);
  note_ = new QLabel(this);
  note_->setWordWrap(true);

  auto* left = new QVBoxLayout;
  left->addWidget(new QLabel(QStringLiteral("Collective:"), this));
  left->addWidget(group_);
  left->addWidget(new QLabel(QStringLiteral("Strategies drawn:"), this));
  left->addWidget(strategies_, 1);
  left->addWidget(new QLabel(QStringLiteral("Size for error vs time:"), this));
  left->addWidget(size_);
  auto* charts = new QHBoxLayout;
  charts->addWidget(time_chart_, 1);
  charts->addWidget(busbw_chart_, 1);
  // Exact results have no place on a log axis: the note says where they are.
  auto* error_column = new QVBoxLayout;
  error_column->setSpacing(2);
  error_column->addWidget(error_chart_, 1);
  auto* exact_note =
      new QLabel(QStringLiteral("Bit-exact results (error 0) are drawn at %1.")
                     .arg(QString::fromStdString(logTickLabel(kExactErrorFloor, LogLabels::Scientific))),
                 this);
  exact_note->setAlignment(Qt::AlignHCenter);
  exact_note->setWordWrap(true);
  error_column->addWidget(exact_note);
  charts->addLayout(error_column, 1);
  auto* top = new QWidget(this);
  auto* top_layout = new QHBoxLayout(top);
  top_layout->setContentsMargins(0, 0, 0, 0);
  top_layout->addLayout(left);
  top_layout->addLayout(charts, 1);
  layOutChartsOverTable(this, note_, top, table_);

  connect(group_, &QComboBox::currentIndexChanged, this, [this] {
    fillStrategies();
    fillSizes();
    redraw();
  });
  connect(size_, &QComboBox::currentIndexChanged, this, &StrategiesView::redraw);
  connect(strategies_, &QListWidget::itemChanged, this, &StrategiesView::redraw);
  clear();
}

void StrategiesView::clear() {
  jobs_.cancel();
  loading_ = false;
  model_->setPoints({});
  fillGroups();
  note_->setText(QStringLiteral("No trace open."));
}

void StrategiesView::setTrace(const TraceInfo& info) {
  loading_ = true;
  note_->setText(QStringLiteral("Loading measurements…"));
  const std::string path = info.path;
  jobs_.run<std::vector<StrategyPoint>>(
      [path] {
        // One sample per collective measured (an exploration's ranks merged), as check and recommend
        // count them (tuner/model.h).
        std::vector<storage::Measurement> samples;
        for (auto& row : tuner::loadMeasurements(threadReader(path)))
          samples.push_back(std::move(row.measurement));
        return aggregateMeasurements(samples);
      },
      [this](Outcome<std::vector<StrategyPoint>> outcome) {
        loading_ = false;
        if (!outcome.value) {
          model_->setPoints({});
          note_->setText(QStringLiteral("Cannot read the measurements: %1").arg(outcome.error));
        } else {
          model_->setPoints(std::move(*outcome.value));
          std::set<std::string> names;
          for (const StrategyPoint& p : model_->points()) names.insert(p.strategy);
          note_->setText(
              model_->points().empty()
                  ? QStringLiteral("This trace has no measurements. Record some with "
                                   "<tt>gradscope run --mode explore</tt> or <tt>gradscope bench</tt>.")
                  : QStringLiteral("%1 strategies measured at %2 points.")
                        .arg(names.size())
                        .arg(model_->points().size()));
        }
        fillGroups();
        emit loaded();
      });
}

void StrategiesView::fillGroups() {
  std::map<std::tuple<int, int, int>, int> counts;
  for (const StrategyPoint& p : model_->points()) {
    ++counts[{static_cast<int>(p.api), static_cast<int>(p.dtype), p.world}];
  }
  groups_.clear();
  const QSignalBlocker block(group_);
  group_->clear();
  int best = -1, best_count = -1;
  for (const auto& [key, count] : counts) {
    const auto [api, dtype, world] = key;
    groups_.push_back(Group{static_cast<Api>(api), static_cast<DType>(dtype), world});
    group_->addItem(groupLabel(static_cast<Api>(api), static_cast<DType>(dtype), world));
    if (count > best_count) {
      best_count = count;
      best = group_->count() - 1;
    }
  }
  if (best >= 0) group_->setCurrentIndex(best);
  fillStrategies();
  fillSizes();
  redraw();
}

std::vector<const StrategyPoint*> StrategiesView::pointsOfGroup() const {
  std::vector<const StrategyPoint*> points;
  const int index = group_->currentIndex();
  if (index < 0 || index >= static_cast<int>(groups_.size())) return points;
  const Group& group = groups_[static_cast<std::size_t>(index)];
  for (const StrategyPoint& p : model_->points()) {
    if (p.api == group.api && p.dtype == group.dtype && p.world == group.world) points.push_back(&p);
  }
  return points;
}

void StrategiesView::fillStrategies() {
  const QSignalBlocker block(strategies_);
  strategies_->clear();
  const std::vector<const StrategyPoint*> points = pointsOfGroup();
  if (points.empty()) return;
  const std::int64_t largest = (*std::max_element(points.begin(), points.end(), [](auto* a, auto* b) {
                                 return a->bytes < b->bytes;
                               }))->bytes;
  std::vector<std::pair<double, std::string>> at_largest;
  std::set<std::string> names;
  for (const StrategyPoint* p : points) {
    names.insert(p->strategy);
    if (p->bytes == largest) at_largest.emplace_back(p->median_ns, p->strategy);
  }
  std::sort(at_largest.begin(), at_largest.end());
  std::set<std::string> checked{"sum/native"};
  for (const auto& [time, strategy] : at_largest) {
    if (static_cast<int>(checked.size()) >= kDefaultChecked) break;
    checked.insert(strategy);
  }
  for (const std::string& strategy : names) {
    auto* item = new QListWidgetItem(QString::fromStdString(strategy), strategies_);
    item->setFlags(item->flags() | Qt::ItemIsUserCheckable);
    item->setCheckState(checked.count(strategy) != 0 ? Qt::Checked : Qt::Unchecked);
  }
}

void StrategiesView::fillSizes() {
  const QSignalBlocker block(size_);
  size_->clear();
  std::set<std::int64_t> sizes;
  for (const StrategyPoint* p : pointsOfGroup()) sizes.insert(p->bytes);
  for (const std::int64_t bytes : sizes) {
    size_->addItem(bytesText(bytes), QVariant::fromValue<qint64>(bytes));
  }
  size_->setCurrentIndex(size_->count() - 1);
}

void StrategiesView::redraw() {
  QChart* time_chart = time_chart_->chart();
  QChart* busbw_chart = busbw_chart_->chart();
  QChart* error_chart = error_chart_->chart();
  const std::vector<const StrategyPoint*> points = pointsOfGroup();
  const QString empty = points.empty() ? QStringLiteral("no measurements") : QString();
  resetChart(time_chart, QStringLiteral("Time vs size (median, min–max band)"), empty);
  resetChart(busbw_chart, QStringLiteral("Bus bandwidth vs size"), empty);
  const qint64 error_size = size_->currentData().toLongLong();
  resetChart(error_chart, QStringLiteral("Error vs time at %1").arg(size_->currentText()), empty);
  if (points.empty()) return;

  // The strategies list is the legend of all three charts: each drawn strategy gets its colour swatch.
  std::vector<std::string> drawn;
  {
    const QSignalBlocker block(strategies_);
    for (int i = 0; i < strategies_->count(); ++i) {
      QListWidgetItem* item = strategies_->item(i);
      if (item->checkState() != Qt::Checked) {
        item->setIcon(QIcon());
        continue;
      }
      QPixmap swatch(12, 12);
      swatch.fill(paletteColor(static_cast<int>(drawn.size())));
      item->setIcon(QIcon(swatch));
      drawn.push_back(item->text().toStdString());
    }
  }
  // The series of each drawn strategy, sorted by size; the ranges of the axes from them.
  struct Drawn {
    QColor colour;
    QString name;
    std::vector<const StrategyPoint*> points;
  };
  std::vector<Drawn> series_of;
  double lo_bytes = 1e300, hi_bytes = 0, max_bw = 0, lowest_ns = 1e300, highest_median_ns = 0;
  for (std::size_t s = 0; s < drawn.size(); ++s) {
    Drawn d{paletteColor(static_cast<int>(s)), QString::fromStdString(drawn[s]), {}};
    for (const StrategyPoint* p : points) {
      if (p->strategy != drawn[s] || p->bytes <= 0) continue;
      d.points.push_back(p);
      lo_bytes = std::min(lo_bytes, static_cast<double>(p->bytes));
      hi_bytes = std::max(hi_bytes, static_cast<double>(p->bytes));
      max_bw = std::max(max_bw, p->busbw_gbs);
      lowest_ns = std::min(lowest_ns, std::max(p->min_ns, 1.0));
      highest_median_ns = std::max(highest_median_ns, std::max(p->median_ns, 1.0));
    }
    std::sort(d.points.begin(), d.points.end(), [](auto* a, auto* b) { return a->bytes < b->bytes; });
    if (!d.points.empty()) series_of.push_back(std::move(d));
  }
  if (series_of.empty()) {
    lo_bytes = 1;
    hi_bytes = 1e6;
    lowest_ns = highest_median_ns = 1e3;
  }
  auto* time_x =
      makeLogAxis(QStringLiteral("size (bytes)"), lo_bytes / 1.3, hi_bytes * 1.3, 8, LogLabels::Si);
  // Medians decide the range; a band's outliers above three times the slowest median are cut off.
  auto* time_y = makeLogAxis(QStringLiteral("time (µs)"), lowest_ns / 1e3 / 1.3, highest_median_ns / 1e3 * 3,
                             10, LogLabels::Plain);
  auto* bw_x = makeLogAxis(QStringLiteral("size (bytes)"), lo_bytes / 1.3, hi_bytes * 1.3, 8, LogLabels::Si);
  auto* bw_y = makeValueAxis(QStringLiteral("bus bandwidth (GB/s)"), QStringLiteral("%.2f"));
  setNiceRange(bw_y, 0, std::max(max_bw, 0.001), 8);
  time_chart->addAxis(time_x, Qt::AlignBottom);
  time_chart->addAxis(time_y, Qt::AlignLeft);
  busbw_chart->addAxis(bw_x, Qt::AlignBottom);
  busbw_chart->addAxis(bw_y, Qt::AlignLeft);

  // Bands first, every line over every band: a band never hides a line.
  for (const Drawn& d : series_of) {
    auto* low = new QLineSeries;
    auto* high = new QLineSeries;
    for (const StrategyPoint* p : d.points) {
      const double x = logPosition(static_cast<double>(p->bytes));
      low->append(x, logPosition(std::max(p->min_ns, 1.0) / 1e3));
      high->append(x, logPosition(std::max(p->max_ns, 1.0) / 1e3));
    }
    auto* band = new QAreaSeries(high, low);
    QColor fill = d.colour;
    fill.setAlpha(kBandAlpha);
    band->setBrush(fill);
    band->setPen(Qt::NoPen);
    time_chart->addSeries(band);
    band->attachAxis(time_x);
    band->attachAxis(time_y);
  }
  for (const Drawn& d : series_of) {
    auto* median = new QLineSeries;
    auto* bw = new QLineSeries;
    median->setName(d.name);
    bw->setName(d.name);
    for (const StrategyPoint* p : d.points) {
      const double x = logPosition(static_cast<double>(p->bytes));
      median->append(x, logPosition(std::max(p->median_ns, 1.0) / 1e3));
      bw->append(x, p->busbw_gbs);
    }
    median->setPen(QPen(d.colour, 2));
    median->setPointsVisible(true);
    time_chart->addSeries(median);
    median->attachAxis(time_x);
    median->attachAxis(time_y);
    bw->setPen(QPen(d.colour, 2));
    bw->setPointsVisible(true);
    busbw_chart->addSeries(bw);
    bw->attachAxis(bw_x);
    bw->attachAxis(bw_y);
  }

  // Error vs time at the chosen size: every strategy measured there; the Pareto front over all of them.
  std::vector<const StrategyPoint*> at_size;
  for (const StrategyPoint* p : points) {
    if (p->bytes == error_size) at_size.push_back(p);
  }
  std::vector<std::pair<double, double>> coordinates;
  for (const StrategyPoint* p : at_size) {
    coordinates.emplace_back(std::max(p->median_ns, 1.0) / 1e3,
                             std::max(p->rel_l2_error.value_or(0.0), kExactErrorFloor));
  }
  const std::vector<bool> front = paretoFront(coordinates);
  // A log axis needs a positive range that shows every point with some room.
  double lo_t = 1e300, hi_t = 0, lo_e = 1e300, hi_e = 0;
  for (const auto& [t, e] : coordinates) {
    lo_t = std::min(lo_t, t);
    hi_t = std::max(hi_t, t);
    lo_e = std::min(lo_e, e);
    hi_e = std::max(hi_e, e);
  }
  if (coordinates.empty()) {
    lo_t = hi_t = 1;
    lo_e = hi_e = kExactErrorFloor;
  }
  auto* err_x = makeLogAxis(QStringLiteral("median time (µs)"), lo_t / 1.3, hi_t * 1.3, 7, LogLabels::Plain);
  auto* err_y = makeLogAxis(QStringLiteral("relative L2 error"), lo_e / 3, std::max(hi_e * 3, lo_e * 30), 12,
                            LogLabels::Scientific);
  error_chart->addAxis(err_x, Qt::AlignBottom);
  error_chart->addAxis(err_y, Qt::AlignLeft);
  for (auto& [t, e] : coordinates) {
    t = logPosition(t);
    e = logPosition(e);
  }
  std::vector<std::pair<double, double>> front_points;
  auto* others = new QScatterSeries;
  others->setName(QStringLiteral("other strategies"));
  others->setColor(QColor(0xba, 0xb0, 0xac));
  others->setMarkerSize(7);
  for (std::size_t i = 0; i < at_size.size(); ++i) {
    const auto drawn_at = std::find(drawn.begin(), drawn.end(), at_size[i]->strategy);
    if (front[i]) front_points.push_back(coordinates[i]);
    if (drawn_at == drawn.end()) {
      others->append(coordinates[i].first, coordinates[i].second);
      continue;
    }
    auto* series = new QScatterSeries;
    series->setName(QString::fromStdString(at_size[i]->strategy));
    series->setColor(paletteColor(static_cast<int>(drawn_at - drawn.begin())));
    series->setMarkerSize(11);
    series->append(coordinates[i].first, coordinates[i].second);
    error_chart->addSeries(series);
    for (QLegendMarker* marker : error_chart->legend()->markers(series)) marker->setVisible(false);
    series->attachAxis(err_x);
    series->attachAxis(err_y);
  }
  error_chart->addSeries(others);
  others->attachAxis(err_x);
  others->attachAxis(err_y);
  std::sort(front_points.begin(), front_points.end());
  auto* front_line = new QLineSeries;
  front_line->setName(QStringLiteral("Pareto front"));
  front_line->setPen(QPen(QColor(0x22, 0x22, 0x22), 1.5, Qt::DashLine));
  front_line->setPointsVisible(true);
  for (const auto& [time, error] : front_points) front_line->append(time, error);
  error_chart->addSeries(front_line);
  front_line->attachAxis(err_x);
  front_line->attachAxis(err_y);
  time_chart->legend()->setVisible(false);
  busbw_chart->legend()->setVisible(false);
  error_chart->legend()->setVisible(true);
  error_chart->legend()->setAlignment(Qt::AlignBottom);
  table_->resizeColumnsToContents();
}

}  // namespace gradscope::gui
