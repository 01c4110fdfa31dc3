#include "widgets/recommendation_view.h"

#include <numeric>

#include <QCheckBox>
#include <QComboBox>
#include <QFileDialog>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMessageBox>
#include <QPushButton>
#include <QScrollArea>
#include <QSplitter>
#include <QTableView>
#include <QTextBrowser>
#include <QTimer>
#include <QVBoxLayout>

#include "gradscope/common/units.h"
#include "gradscope/storage/files.h"
#include "models/units_text.h"
#include "widgets/chart_util.h"

namespace gradscope::gui {

namespace {
QString suggestedName(tuner::Format format) {
  switch (format) {
    case tuner::Format::Text: return QStringLiteral("recommendation.txt");
    case tuner::Format::Json: return QStringLiteral("recommendation.json");
    case tuner::Format::Markdown: return QStringLiteral("recommendation.md");
    case tuner::Format::NcclTuner: return QStringLiteral("nccl_tuner.csv");
    case tuner::Format::OmpiRules: return QStringLiteral("ompi_coll_tuned_rules.conf");
    case tuner::Format::Env: return QStringLiteral("recommendation.env");
    case tuner::Format::Ddp: return QStringLiteral("ddp_hook.py");
    case tuner::Format::Tf: return QStringLiteral("tf_strategy.py");
    case tuner::Format::Horovod: return QStringLiteral("horovod_settings.py");
    case tuner::Format::Predictions: return QStringLiteral("predictions.csv");
  }
  return QStringLiteral("recommendation");
}

QString gainText(const TimeInterval& baseline, const TimeInterval& choice) {
  if (!(baseline.median_ns > 0)) return QStringLiteral("–");
  const double gain = 1 - choice.median_ns / baseline.median_ns;
  // The widest gain interval the two 95% intervals allow.
  const double low = baseline.low_ns > 0 ? 1 - choice.high_ns / baseline.low_ns : gain;
  const double high = baseline.high_ns > 0 ? 1 - choice.low_ns / baseline.high_ns : gain;
  return QStringLiteral("%1 % (between %2 % and %3 %)")
      .arg(100 * gain, 0, 'f', 1)
      .arg(100 * std::min(low, high), 0, 'f', 1)
      .arg(100 * std::max(low, high), 0, 'f', 1);
}

// What the chosen async strategy saves on the step, as `gradscope recommend` says it: of the median step
// (Report::step_saving_ns), and as a share with its 95% interval (Recommendation::step_saving, of the
// measured mean step the replay was scaled to: the same shares).
QString asyncSavingText(const tuner::Result& result) {
  const tuner::Report& report = result.report;
  const double mean_step = report.async ? report.async->step_ns : 0;
  const std::optional<TimeInterval>& saving = result.recommendation.step_saving;
  QString text;
  if (report.step_ns && report.step_saving_ns) {
    text = QStringLiteral("%1 of %2 per step")
               .arg(durationText(*report.step_saving_ns), durationText(*report.step_ns));
  } else if (saving) {
    text = QStringLiteral("%1 of %2 per step").arg(durationText(saving->median_ns), durationText(mean_step));
  }
  if (saving && mean_step > 0) {
    text += QStringLiteral(" · <b>%1 % faster</b> (between %2 % and %3 %)")
                .arg(100 * saving->median_ns / mean_step, 0, 'f', 1)
                .arg(100 * saving->low_ns / mean_step, 0, 'f', 1)
                .arg(100 * saving->high_ns / mean_step, 0, 'f', 1);
  }
  return text;
}
}  // namespace

RecommendationView::RecommendationView(QWidget* parent)
    : QWidget(parent), model_(new RecommendationModel(this)), jobs_(this) {
  budget_ = new QComboBox(this);
  budget_->addItem(QStringLiteral("lossless only"), 0.0);
  budget_->addItem(QStringLiteral("rel. error ≤ 1e-4"), 1e-4);
  budget_->addItem(QStringLiteral("rel. error ≤ 1e-3"), 1e-3);
  budget_->addItem(QStringLiteral("rel. error ≤ 1e-2"), 1e-2);
  semantic_ = new QCheckBox(QStringLiteral("allow semantic changes (AdaCons, AdaSum, async)"), this);
  semantic_->setToolTip(
      QStringLiteral("Strategies that change what the job computes: AdaCons and AdaSum aggregate the "
                     "gradients differently, the async ones return an older step's sum."));
  run_ = new QPushButton(QStringLiteral("Recommend"), this);
  summary_ = new QLabel(this);
  summary_->setWordWrap(true);
  summary_->setTextFormat(Qt::RichText);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  summary_->setMinimumHeight(summary_->fontMetrics().height() * 4);
  summary_->setAlignment(Qt::AlignTop | Qt::AlignLeft);
  reasoning_ = new QTextBrowser(this);
  table_ = makeSortedTable(model_, RecommendationModel::ColApi, true, this);

  // Synchronous or asynchronous: a heading, the figures of the replay, the async strategies (in the
  // analysis' order until the user sorts them: no sort indicator), the verdict.
  async_model_ = new AsyncOptionsModel(this);
  async_table_ = makeSortedTable(async_model_, -1, true, this);
  async_table_->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);
  async_table_->setSortingEnabled(true);
  async_table_->setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  auto* async_heading = new QLabel(
      QStringLiteral("<b>Synchronous or asynchronous</b> (the measured steps replayed with each async "
                     "strategy; docs/async.md)"),
      this);
  async_heading->setTextFormat(Qt::RichText);
  async_figures_ = new QLabel(this);
  async_figures_->setWordWrap(true);
  async_figures_->setTextFormat(Qt::RichText);
  async_figures_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  async_verdict_ = new QLabel(this);
  async_verdict_->setWordWrap(true);
  async_verdict_->setTextFormat(Qt::PlainText);
  async_verdict_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  async_verdict_->setAlignment(Qt::AlignTop | Qt::AlignLeft);
  // In a scroll area, so that a narrow window or a short pane scrolls the verdict instead of clipping it.
  auto* async_content = new QWidget(this);
  auto* async_layout = new QVBoxLayout(async_content);
  async_layout->setContentsMargins(0, 4, 0, 4);
  async_layout->addWidget(async_heading);
  async_layout->addWidget(async_figures_);
  async_layout->addWidget(async_table_);
  async_layout->addWidget(async_verdict_);
  async_layout->addStretch(1);
  async_panel_ = new QScrollArea(this);
  async_panel_->setWidget(async_content);
  async_panel_->setWidgetResizable(true);
  async_panel_->setFrameShape(QFrame::NoFrame);
  async_panel_->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);

  auto* options = new QHBoxLayout;
  options->addWidget(new QLabel(QStringLiteral("Error budget:"), this));
  options->addWidget(budget_);
  options->addWidget(semantic_);
  options->addWidget(run_);
  options->addStretch(1);
  auto* exports = new QHBoxLayout;
  exports->addWidget(new QLabel(QStringLiteral("Export:"), this));
  for (const tuner::Format format : tuner::kFormats) {
    auto* button = new QPushButton(toQString(tuner::name(format)), this);
    button->setToolTip(QStringLiteral("Save the recommendation as %1").arg(toQString(tuner::name(format))));
    connect(button, &QPushButton::clicked, this, [this, format] {
      const QString path = QFileDialog::getSaveFileName(this, QStringLiteral("Export the recommendation"),
                                                        suggestedName(format));
      if (path.isEmpty()) return;
      const QString error = exportTo(format, path);
      if (!error.isEmpty()) QMessageBox::warning(this, QStringLiteral("Export failed"), error);
    });
    exports->addWidget(button);
    exports_.push_back(button);
  }
  exports->addStretch(1);

  // The sizes keep most of the height: the async panel takes what its few rows and its paragraph need,
  // and none of the three can be collapsed to nothing.
  splitter_ = new QSplitter(Qt::Vertical, this);
  splitter_->setChildrenCollapsible(false);
  splitter_->addWidget(table_);
  splitter_->addWidget(async_panel_);
  splitter_->addWidget(reasoning_);
  splitter_->setStretchFactor(0, 3);
  splitter_->setStretchFactor(1, 0);
  splitter_->setStretchFactor(2, 2);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(8, 8, 8, 8);
  layout->addLayout(options);
  layout->addWidget(summary_);
  layout->addWidget(splitter_, 1);
  layout->addLayout(exports);

  connect(run_, &QPushButton::clicked, this, &RecommendationView::recommend);
  clear();
}

void RecommendationView::clear() {
  jobs_.cancel();
  path_.clear();
  loading_ = false;
  result_.reset();
  model_->setRows({});
  showAsync({});
  summary_->setText(QStringLiteral("No trace open."));
  reasoning_->clear();
  setExportEnabled(false);
  run_->setEnabled(false);
}

void RecommendationView::setExportEnabled(bool enabled) {
  for (QPushButton* button : exports_) button->setEnabled(enabled);
}

void RecommendationView::setAllowSemanticChange(bool allow) {
  semantic_->setChecked(allow);
}

void RecommendationView::setTrace(const TraceInfo& info) {
  path_ = info.path;
  run_->setEnabled(true);
  recommend();
}

void RecommendationView::recommend() {
  if (path_.empty()) return;
  loading_ = true;
  result_.reset();
  setExportEnabled(false);
  summary_->setText(QStringLiteral("Running the tuner…"));
  tuner::RecommendOptions options;
  options.max_rel_error = budget_->currentData().toDouble();
  options.allow_semantic_change = semantic_->isChecked();
  options.keep_predictions = true;
  const std::string path = path_;
  jobs_.run<tuner::Result>(
      [path, options] { return tuner::recommend(tuner::readInputs({path}), options); },
      [this](Outcome<tuner::Result> outcome) {
        loading_ = false;
        if (!outcome.value) {
          model_->setRows({});
          showAsync({});
          reasoning_->clear();
          summary_->setText(
              QStringLiteral("<b>No recommendation.</b> %1").arg(outcome.error.toHtmlEscaped()));
        } else {
          result_ = std::move(*outcome.value);
          show(*result_);
        }
        emit loaded();
      });
}

void RecommendationView::show(const tuner::Result& result) {
  const tuner::Report& report = result.report;
  model_->setRows(report.sizes);
  QString text;
  const auto& rules = result.recommendation.rules;
  const bool async = !report.async_choice.empty();
  if (async) {
    // One strategy for the whole job (tuner/recommend.h): the rules only repeat it per api and dtype.
    text += QStringLiteral(
                "<b>Choice:</b> <tt>%1</tt> for every reduction — the synchronous choices below are "
                "what it outdoes on the step.<br>")
                .arg(QString::fromStdString(report.async_choice).toHtmlEscaped());
    if (const QString saving = asyncSavingText(result); !saving.isEmpty())
      text += QStringLiteral("<b>Saved on the step:</b> %1<br>").arg(saving);
  } else if (rules.empty()) {
    text += QStringLiteral(
        "<b>Choice:</b> keep <tt>sum/native</tt> — no strategy is faster beyond the noise.<br>");
  } else {
    text += QStringLiteral("<b>Choice:</b> ");
    QStringList parts;
    for (const RecommendationRule& rule : rules) {
      parts << QStringLiteral("<tt>%1</tt> for %2 %3 of %4 – %5")
                   .arg(QString::fromStdString(rule.strategy).toHtmlEscaped(), toQString(name(rule.api)),
                        toQString(name(rule.dtype)),
                        QString::fromStdString(formatBytes(static_cast<std::uint64_t>(rule.min_bytes))),
                        QString::fromStdString(formatBytes(static_cast<std::uint64_t>(rule.max_bytes))));
    }
    text += parts.join(QStringLiteral("; ")) + QStringLiteral("<br>");
  }
  const QString per = report.steps_known ? QStringLiteral("per step") : QStringLiteral("per run");
  if (report.baseline_per_step && report.choice_per_step) {
    text += QStringLiteral("<b>Predicted %1:</b> baseline %2, with the %3 %4 · <b>gain %5</b><br>")
                .arg(per, formatInterval(*report.baseline_per_step),
                     async ? QStringLiteral("synchronous choices") : QStringLiteral("choice"),
                     formatInterval(*report.choice_per_step),
                     gainText(*report.baseline_per_step, *report.choice_per_step));
  }
  text += QStringLiteral("World %1%2 · %3 rule(s) · error budget %4%5")
              .arg(report.world)
              .arg(report.world_predicted ? QStringLiteral(" (what-if)") : QString())
              .arg(rules.size())
              .arg(result.recommendation.max_rel_error == 0
                       ? QStringLiteral("lossless")
                       : QString::number(result.recommendation.max_rel_error, 'g', 3))
              .arg(report.workload_from_measurements
                       ? QStringLiteral(" · no observed calls: one call of each measured size assumed")
                       : QString());
  summary_->setText(text);
  QString reasoning = QStringLiteral("<h3>Reasoning</h3><ul>");
  for (const std::string& line : report.reasoning) {
    reasoning += QStringLiteral("<li>%1</li>").arg(QString::fromStdString(line).toHtmlEscaped());
  }
  reasoning += QStringLiteral("</ul>");
  if (report.consensus_note) {
    reasoning += QStringLiteral("<p><b>Consensus:</b> %1</p>")
                     .arg(QString::fromStdString(*report.consensus_note).toHtmlEscaped());
  }
  if (report.fusion) {
    reasoning +=
        QStringLiteral(
            "<p><b>Fusion:</b> %1 % of the baseline's time goes to calls under 64 KiB; fusing them "
            "into %2 buckets is predicted to save %3 %4.</p>")
            .arg(100 * report.fusion->small_share, 0, 'f', 1)
            .arg(QString::fromStdString(formatBytes(static_cast<std::uint64_t>(report.fusion->bucket_bytes))))
            .arg(QString::fromStdString(formatDuration(report.fusion->gain_ns)), per);
  }
  reasoning_->setHtml(reasoning);
  table_->resizeColumnsToContents();
  showAsync(report);
  setExportEnabled(true);
}

void RecommendationView::showAsync(const tuner::Report& report) {
  if (!report.async || !report.async->why_not.empty()) {
    async_model_->clear();
    async_figures_->clear();
    async_verdict_->clear();
    async_panel_->hide();
    return;
  }
  const tuner::AsyncAnalysis& analysis = *report.async;
  async_model_->setAnalysis(analysis, report.async_choice);
  const QString waiting_share = analysis.step_ns > 0
                                    ? QStringLiteral("%1 %").arg(100 * analysis.waiting_share, 0, 'f', 1)
                                    : QStringLiteral("–");
  async_figures_->setText(
      QStringLiteral("<b>Waiting for the last rank:</b> %1 of the step, %2 per step on average, worst %3 · "
                     "<b>exposed reduction:</b> %4 per step · <b>replayed synchronous step:</b> %5 "
                     "(measured %6; %7 steps of %8 ranks)")
          .arg(waiting_share, durationText(analysis.waiting_mean_ns), durationText(analysis.waiting_worst_ns),
               durationText(analysis.exposed_ns), durationText(analysis.replay_sync_ns),
               durationText(analysis.step_ns))
          .arg(analysis.steps)
          .arg(analysis.ranks));
  async_verdict_->setText(QString::fromStdString(analysis.verdict));
  async_table_->resizeColumnsToContents();
  // As tall as its rows: a handful of strategies, never a scroll bar.
  const int rows = async_model_->rowCount();
  async_table_->setFixedHeight(async_table_->horizontalHeader()->sizeHint().height() +
                               rows * async_table_->verticalHeader()->defaultSectionSize() +
                               2 * async_table_->frameWidth());
  async_panel_->show();
  // Once the splitter has laid the shown panel out.
  fit_async_pending_ = true;
  if (isVisible()) QTimer::singleShot(0, this, &RecommendationView::fitAsyncPanel);
}

void RecommendationView::showEvent(QShowEvent* event) {
  QWidget::showEvent(event);
  // After the layout has given the splitter its size.
  if (fit_async_pending_) QTimer::singleShot(0, this, &RecommendationView::fitAsyncPanel);
}

void RecommendationView::fitAsyncPanel() {
  if (!fit_async_pending_ || !isVisible() || async_panel_->isHidden()) return;
  fit_async_pending_ = false;
  const QList<int> sizes = splitter_->sizes();
  const int total = std::accumulate(sizes.begin(), sizes.end(), 0);
  QLayout* content = async_panel_->widget()->layout();
  const int width = splitter_->width();
  const int needed =
      content->hasHeightForWidth() ? content->totalHeightForWidth(width) : content->totalSizeHint().height();
  // What the panel needs, up to half the height; the rest to the sizes and the reasoning, 3 : 2.
  const int panel = std::min(needed, total / 2);
  const int rest = total - panel;
  splitter_->setSizes({rest * 3 / 5, panel, rest - rest * 3 / 5});
}

QString RecommendationView::exportTo(tuner::Format format, const QString& path) const {
  if (!result_) return QStringLiteral("there is no recommendation to export");
  try {
    const std::string text = tuner::format(result_->recommendation, result_->report, format);
    storage::writePrivateFile(path.toStdString(), text);
  } catch (const std::exception& error) {
    return QString::fromStdString(error.what());
  }
  return {};
}

}  // namespace gradscope::gui
