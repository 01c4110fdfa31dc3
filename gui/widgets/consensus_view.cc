#include "widgets/consensus_view.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QTableView>
#include <QtCharts/QLegendMarker>
#include <QtCharts/QLineSeries>
#include <QtCharts/QScatterSeries>

#include "models/palette.h"
#include "models/timeline_math.h"
#include "widgets/chart_util.h"

namespace gradscope::gui {

namespace {
// Ranks drawn as their own line; beyond this the charts would be unreadable, and the table has them all.
constexpr int kMaxRankLines = 16;
}  // namespace

ConsensusView::ConsensusView(QWidget* parent)
    : QWidget(parent), model_(new ConsensusModel(this)), jobs_(this) {
  table_ = makeSortedTable(model_, ConsensusModel::ColStep, false, this);
  alpha_chart_ = makeChartView(QStringLiteral("AdaCons α per rank"), this);
  cosine_chart_ = makeChartView(QStringLiteral("Cosine to the mean gradient"), this);
  diversity_chart_ = makeChartView(QStringLiteral("Gradient diversity"), this);
  note_ = new QLabel(this);
  note_->setWordWrap(true);
  auto* charts = new QWidget(this);
  auto* chart_layout = new QHBoxLayout(charts);
  chart_layout->setContentsMargins(0, 0, 0, 0);
  chart_layout->addWidget(alpha_chart_, 1);
  chart_layout->addWidget(cosine_chart_, 1);
  chart_layout->addWidget(diversity_chart_, 1);
  layOutChartsOverTable(this, note_, charts, table_);
  clear();
}

void ConsensusView::clear() {
  jobs_.cancel();
  loading_ = false;
  model_->setRows({});
  note_->setText(QStringLiteral("No trace open."));
  redraw();
}

void ConsensusView::setTrace(const TraceInfo& info) {
  loading_ = true;
  note_->setText(QStringLiteral("Loading consensus rows…"));
  const std::string path = info.path;
  std::map<std::int64_t, int> rank_of;
  for (const storage::RankInfo& rank : info.ranks) rank_of[rank.id] = rank.rank;
  jobs_.run<std::vector<ConsensusRow>>(
      [path, rank_of] {
        std::vector<ConsensusRow> rows;
        for (storage::ConsensusRecord& record : threadReader(path).consensus()) {
          const auto found = rank_of.find(record.rank_id);
          const int rank = found != rank_of.end() ? found->second : static_cast<int>(record.rank_id);
          rows.push_back(ConsensusRow{std::move(record), rank});
        }
        return rows;
      },
      [this](Outcome<std::vector<ConsensusRow>> outcome) {
        loading_ = false;
        if (!outcome.value) {
          model_->setRows({});
          note_->setText(QStringLiteral("Cannot read the consensus rows: %1").arg(outcome.error));
        } else {
          model_->setRows(std::move(*outcome.value));
          const ConsensusSeries series = consensusSeries(model_->rows());
          note_->setText(
              model_->rows().empty()
                  ? QStringLiteral("This trace has no consensus rows: they come from "
                                   "<tt>gradscope run --mode explore</tt> on a job's all-reduces.")
                  : QStringLiteral("%1 consensus rows at %2 %3. Lines: the mean per step; dots: each "
                                   "explored buffer. Equal α on every rank (AdaCons weights near 1/N) and "
                                   "cosines near 1 mean the ranks agree; low diversity means averaging "
                                   "loses little.")
                        .arg(model_->rows().size())
                        .arg(series.diversity.size())
                        .arg(series.steps_known ? QStringLiteral("steps") : QStringLiteral("reductions")));
        }
        redraw();
        table_->resizeColumnsToContents();
        emit loaded();
      });
}

void ConsensusView::redraw() {
  const std::vector<ConsensusRow>& rows = model_->rows();
  const QString empty = rows.empty() ? QStringLiteral("no data") : QString();
  resetChart(alpha_chart_->chart(), QStringLiteral("AdaCons α per rank"), empty);
  resetChart(cosine_chart_->chart(), QStringLiteral("Cosine to the mean gradient"), empty);
  resetChart(diversity_chart_->chart(), QStringLiteral("Gradient diversity"), empty);
  if (rows.empty()) return;
  const ConsensusSeries series = consensusSeries(rows);
  const QString x_title = series.steps_known ? QStringLiteral("step") : QStringLiteral("explored reduction");

  // One chart: per line, its rows as light dots first, then every line (the mean per x) over them; the
  // y range holds every row, the x range every x.
  struct Line {
    QString name;
    QColor colour;
    const std::vector<ConsensusPoint>* points;
  };
  const auto draw = [&x_title](QChart* chart, const QString& y_title, const std::vector<Line>& lines) {
    auto* x_axis = makeValueAxis(x_title, QStringLiteral("%d"));
    auto* y_axis = makeValueAxis(y_title, QStringLiteral("%.2f"));
    chart->addAxis(x_axis, Qt::AlignBottom);
    chart->addAxis(y_axis, Qt::AlignLeft);
    double lo = 1e300, hi = -1e300, x_lo = 1e300, x_hi = -1e300;
    for (const Line& line : lines) {
      auto* dots = new QScatterSeries;
      QColor light = line.colour;
      light.setAlpha(80);
      dots->setColor(light);
      dots->setBorderColor(Qt::transparent);
      dots->setMarkerSize(5);
      for (const ConsensusPoint& point : *line.points) {
        for (const double value : point.values) {
          dots->append(static_cast<double>(point.x), value);
          lo = std::min(lo, value);
          hi = std::max(hi, value);
        }
        x_lo = std::min(x_lo, static_cast<double>(point.x));
        x_hi = std::max(x_hi, static_cast<double>(point.x));
      }
      chart->addSeries(dots);
      dots->attachAxis(x_axis);
      dots->attachAxis(y_axis);
      for (QLegendMarker* marker : chart->legend()->markers(dots)) marker->setVisible(false);
    }
    for (const Line& line : lines) {
      auto* mean_line = new QLineSeries;
      mean_line->setName(line.name);
      mean_line->setPen(QPen(line.colour, 2));
      mean_line->setPointsVisible(true);
      for (const ConsensusPoint& point : *line.points)
        mean_line->append(static_cast<double>(point.x), point.mean);
      chart->addSeries(mean_line);
      mean_line->attachAxis(x_axis);
      mean_line->attachAxis(y_axis);
    }
    if (lo > hi) return;
    setNiceRange(y_axis, lo, hi, 8);
    // x: whole steps, 1-2-5 apart.
    const ValueAxisTicks x_ticks = niceValueAxis(x_lo, x_hi, 8, 0.02);
    if (x_ticks.step >= 1) {
      setNiceRange(x_axis, x_lo, x_hi, 8, 0.02);
    } else {
      x_axis->setRange(x_lo, std::max(x_hi, x_lo + 1));
      x_axis->setTickType(QValueAxis::TicksFixed);
      x_axis->setTickCount(static_cast<int>(std::max(x_hi, x_lo + 1) - x_lo) + 1);
    }
    x_axis->setLabelFormat(QStringLiteral("%d"));
    chart->legend()->setAlignment(Qt::AlignBottom);
  };

  for (const auto& [chart, by_rank, y_title] :
       {std::tuple{alpha_chart_->chart(), &series.alpha, QStringLiteral("α")},
        std::tuple{cosine_chart_->chart(), &series.cosine, QStringLiteral("cosine")}}) {
    std::vector<Line> lines;
    for (const auto& [rank, points] : *by_rank) {
      if (static_cast<int>(lines.size()) >= kMaxRankLines) break;
      lines.push_back(Line{QStringLiteral("rank %1").arg(rank), paletteColor(rank), &points});
    }
    draw(chart, y_title, lines);
  }
  draw(diversity_chart_->chart(), QStringLiteral("Σ‖gᵢ‖² / ‖Σgᵢ‖²"),
       {Line{QStringLiteral("diversity (mean over the step's reductions)"), paletteColor(6),
             &series.diversity}});
}

}  // namespace gradscope::gui
