#include "widgets/consensus_view.h"

#include <algorithm>
#include <map>

#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QTableView>
#include <QVBoxLayout>
#include <QtCharts/QLineSeries>

#include "models/palette.h"
#include "widgets/chart_util.h"

namespace gradscope::gui {

namespace {
// Ranks drawn as their own line; beyond this the charts would be unreadable, and the table has them all.
constexpr int kMaxRankLines = 16;

struct Mean {
  double sum = 0;
  int n = 0;
  void add(double value) {
    sum += value;
    ++n;
  }
  double value() const { return n > 0 ? sum / n : 0; }
};
}  // namespace

ConsensusView::ConsensusView(QWidget* parent)
    : QWidget(parent), model_(new ConsensusModel(this)), jobs_(this) {
  auto* proxy = new QSortFilterProxyModel(this);
  proxy->setSourceModel(model_);
  proxy->setSortRole(kSortRole);
  table_ = new QTableView(this);
  table_->setModel(proxy);
  table_->setSortingEnabled(true);
  table_->sortByColumn(ConsensusModel::ColStep, Qt::AscendingOrder);
  table_->setAlternatingRowColors(true);
  table_->verticalHeader()->hide();
  table_->verticalHeader()->setDefaultSectionSize(table_->fontMetrics().height() + 6);
  table_->horizontalHeader()->setStretchLastSection(false);
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
  auto* splitter = new QSplitter(Qt::Vertical, this);
  splitter->addWidget(charts);
  splitter->addWidget(table_);
  splitter->setStretchFactor(0, 3);
  splitter->setStretchFactor(1, 1);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->addWidget(note_);
  layout->addWidget(splitter, 1);
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
          note_->setText(
              model_->rows().empty()
                  ? QStringLiteral("This trace has no consensus rows: they come from "
                                   "<tt>gradscope run --mode explore</tt> on a job's all-reduces.")
                  : QStringLiteral("%1 consensus rows. α near 1/N on every rank and cosines near 1 mean "
                                   "the ranks agree; low diversity means averaging loses little.")
                        .arg(model_->rows().size()));
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
  const bool steps_known =
      std::any_of(rows.begin(), rows.end(), [](const ConsensusRow& r) { return r.record.step >= 0; });
  // x: the step, or the row's index within its rank when steps are unknown.
  std::map<int, std::map<std::int64_t, Mean>> alpha, cosine;
  std::map<std::int64_t, Mean> diversity;
  std::map<int, std::int64_t> index_of_rank;
  for (const ConsensusRow& row : rows) {
    const std::int64_t x = steps_known ? row.record.step : index_of_rank[row.rank]++;
    if (steps_known && x < 0) continue;
    alpha[row.rank][x].add(row.record.alpha);
    cosine[row.rank][x].add(row.record.cosine_to_mean);
    diversity[x].add(row.record.diversity);
  }
  const QString x_title = steps_known ? QStringLiteral("step") : QStringLiteral("explored reduction");
  struct Target {
    QChart* chart;
    std::map<int, std::map<std::int64_t, Mean>>* data;
    QString y_title;
  };
  for (const Target& target : {Target{alpha_chart_->chart(), &alpha, QStringLiteral("α")},
                               Target{cosine_chart_->chart(), &cosine, QStringLiteral("cosine")}}) {
    auto* x_axis = makeValueAxis(x_title, QStringLiteral("%d"));
    auto* y_axis = makeValueAxis(target.y_title, QStringLiteral("%.3f"));
    target.chart->addAxis(x_axis, Qt::AlignBottom);
    target.chart->addAxis(y_axis, Qt::AlignLeft);
    double lo = 1e300, hi = -1e300, x_lo = 1e300, x_hi = -1e300;
    int drawn = 0;
    for (const auto& [rank, points] : *target.data) {
      if (drawn++ >= kMaxRankLines) break;
      auto* series = new QLineSeries;
      series->setName(QStringLiteral("rank %1").arg(rank));
      series->setPen(QPen(paletteColor(rank), 1.5));
      series->setPointsVisible(true);
      for (const auto& [x, mean] : points) {
        series->append(static_cast<double>(x), mean.value());
        lo = std::min(lo, mean.value());
        hi = std::max(hi, mean.value());
        x_lo = std::min(x_lo, static_cast<double>(x));
        x_hi = std::max(x_hi, static_cast<double>(x));
      }
      target.chart->addSeries(series);
      series->attachAxis(x_axis);
      series->attachAxis(y_axis);
    }
    const double pad = std::max((hi - lo) * 0.08, 1e-3);
    y_axis->setRange(lo - pad, hi + pad);
    x_axis->setRange(x_lo, std::max(x_hi, x_lo + 1));
    x_axis->applyNiceNumbers();
    target.chart->legend()->setAlignment(Qt::AlignBottom);
  }
  QChart* chart = diversity_chart_->chart();
  auto* x_axis = makeValueAxis(x_title, QStringLiteral("%d"));
  auto* y_axis = makeValueAxis(QStringLiteral("Σ‖gᵢ‖² / ‖Σgᵢ‖²"), QStringLiteral("%.3f"));
  chart->addAxis(x_axis, Qt::AlignBottom);
  chart->addAxis(y_axis, Qt::AlignLeft);
  auto* series = new QLineSeries;
  series->setName(QStringLiteral("diversity (mean over the step's reductions)"));
  series->setPen(QPen(paletteColor(6), 2));
  series->setPointsVisible(true);
  double lo = 1e300, hi = -1e300;
  for (const auto& [x, mean] : diversity) {
    series->append(static_cast<double>(x), mean.value());
    lo = std::min(lo, mean.value());
    hi = std::max(hi, mean.value());
  }
  chart->addSeries(series);
  series->attachAxis(x_axis);
  series->attachAxis(y_axis);
  const double pad = std::max((hi - lo) * 0.08, 1e-3);
  y_axis->setRange(lo - pad, hi + pad);
  if (!diversity.empty()) {
    x_axis->setRange(static_cast<double>(diversity.begin()->first),
                     std::max(static_cast<double>(diversity.rbegin()->first),
                              static_cast<double>(diversity.begin()->first) + 1));
    x_axis->applyNiceNumbers();
  }
  chart->legend()->setAlignment(Qt::AlignBottom);
}

}  // namespace gradscope::gui
