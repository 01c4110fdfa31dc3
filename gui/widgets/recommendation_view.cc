#include "widgets/recommendation_view.h"

#include <QCheckBox>
#include <QComboBox>
#include <QFileDialog>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMessageBox>
#include <QPushButton>
#include <QSplitter>
#include <QTableView>
#include <QTextBrowser>
#include <QVBoxLayout>

#include "gradscope/common/units.h"
#include "gradscope/storage/files.h"
#include "widgets/chart_util.h"

namespace gradscope::gui {

namespace {
constexpr tuner::Format kFormats[] = {
    tuner::Format::Text,      tuner::Format::Json,    tuner::Format::Markdown,
    tuner::Format::NcclTuner, tuner::Format::Env,     tuner::Format::Ddp,
    tuner::Format::Tf,        tuner::Format::Horovod, tuner::Format::Predictions};

QString suggestedName(tuner::Format format) {
  switch (format) {
    case tuner::Format::Text: return QStringLiteral("recommendation.txt");
    case tuner::Format::Json: return QStringLiteral("recommendation.json");
    case tuner::Format::Markdown: return QStringLiteral("recommendation.md");
    case tuner::Format::NcclTuner: return QStringLiteral("nccl_tuner.csv");
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
}  // namespace

RecommendationView::RecommendationView(QWidget* parent)
    : QWidget(parent), model_(new RecommendationModel(this)), jobs_(this) {
  budget_ = new QComboBox(this);
  budget_->addItem(QStringLiteral("lossless only"), 0.0);
  budget_->addItem(QStringLiteral("rel. error ≤ 1e-4"), 1e-4);
  budget_->addItem(QStringLiteral("rel. error ≤ 1e-3"), 1e-3);
  budget_->addItem(QStringLiteral("rel. error ≤ 1e-2"), 1e-2);
  semantic_ = new QCheckBox(QStringLiteral("allow AdaCons / AdaSum"), this);
  run_ = new QPushButton(QStringLiteral("Recommend"), this);
  summary_ = new QLabel(this);
  summary_->setWordWrap(true);
  summary_->setTextFormat(Qt::RichText);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  summary_->setMinimumHeight(summary_->fontMetrics().height() * 4);
  summary_->setAlignment(Qt::AlignTop | Qt::AlignLeft);
  reasoning_ = new QTextBrowser(this);
  table_ = makeSortedTable(model_, RecommendationModel::ColApi, true, this);

  auto* options = new QHBoxLayout;
  options->addWidget(new QLabel(QStringLiteral("Error budget:"), this));
  options->addWidget(budget_);
  options->addWidget(semantic_);
  options->addWidget(run_);
  options->addStretch(1);
  auto* exports = new QHBoxLayout;
  exports->addWidget(new QLabel(QStringLiteral("Export:"), this));
  for (const tuner::Format format : kFormats) {
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

  auto* splitter = new QSplitter(Qt::Vertical, this);
  splitter->addWidget(table_);
  splitter->addWidget(reasoning_);
  splitter->setStretchFactor(0, 3);
  splitter->setStretchFactor(1, 2);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(8, 8, 8, 8);
  layout->addLayout(options);
  layout->addWidget(summary_);
  layout->addWidget(splitter, 1);
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
  summary_->setText(QStringLiteral("No trace open."));
  reasoning_->clear();
  setExportEnabled(false);
  run_->setEnabled(false);
}

void RecommendationView::setExportEnabled(bool enabled) {
  for (QPushButton* button : exports_) button->setEnabled(enabled);
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
  if (rules.empty()) {
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
    text += QStringLiteral("<b>Predicted %1:</b> baseline %2, with the choice %3 · <b>gain %4</b><br>")
                .arg(per, formatInterval(*report.baseline_per_step), formatInterval(*report.choice_per_step),
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
  setExportEnabled(true);
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
