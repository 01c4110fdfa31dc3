#include "widgets/runs_view.h"

#include <QDir>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSplitter>
#include <QStringList>
#include <QTableView>
#include <QVBoxLayout>

#include "gradscope/common/units.h"
#include "widgets/chart_util.h"

namespace gradscope::gui {

namespace {
// Both traces are named the same way, whatever path they were given by: the file name in bold, its
// directory's name before it (two runs' traces are often both trace.db); the full paths are in the
// tooltip.
QString fileLabel(const std::string& path) {
  const QFileInfo file(QString::fromStdString(path));
  const QString directory = file.absoluteDir().dirName();
  return QStringLiteral("%1<b>%2</b>")
      .arg(directory.isEmpty() ? QString() : (directory + QLatin1Char('/')).toHtmlEscaped(),
           file.fileName().toHtmlEscaped());
}

// A part of the view: its heading over its table.
QWidget* section(QLabel* heading, QTableView* table, QWidget* parent) {
  auto* widget = new QWidget(parent);
  auto* layout = new QVBoxLayout(widget);
  layout->setContentsMargins(0, 4, 0, 0);
  heading->setTextFormat(Qt::RichText);
  layout->addWidget(heading);
  layout->addWidget(table, 1);
  return widget;
}
}  // namespace

RunsView::RunsView(QWidget* parent)
    : QWidget(parent), model_(new CheckModel(this)), runs_model_(new RunComparisonModel(this)), jobs_(this) {
  // Both in the check's own order: the step time first; regressions first.
  runs_table_ = makeSortedTable(runs_model_, -1, true, this);
  table_ = makeSortedTable(model_, -1, true, this);
  runs_heading_ = new QLabel(this);
  keys_heading_ = new QLabel(this);
  summary_ = new QLabel(this);
  summary_->setWordWrap(true);
  summary_->setTextFormat(Qt::RichText);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  compare_ = new QPushButton(QStringLiteral("Compare with…"), this);
  auto* top = new QHBoxLayout;
  top->addWidget(summary_, 1);
  top->addWidget(compare_, 0, Qt::AlignTop);
  // A splitter: the runs' dozen figures over the keys, either taking the whole height when alone.
  auto* parts = new QSplitter(Qt::Vertical, this);
  parts->setChildrenCollapsible(false);
  runs_section_ = section(runs_heading_, runs_table_, parts);
  keys_section_ = section(keys_heading_, table_, parts);
  parts->addWidget(runs_section_);
  parts->addWidget(keys_section_);
  parts->setStretchFactor(0, 1);
  parts->setStretchFactor(1, 2);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(8, 8, 8, 8);
  layout->addLayout(top);
  layout->addWidget(parts, 1);
  connect(compare_, &QPushButton::clicked, this, &RunsView::compareRequested);
  clear();
}

void RunsView::showResult(const tuner::CheckResult* result) {
  model_->setComparisons(result ? result->comparisons : std::vector<tuner::KeyComparison>{});
  runs_model_->setRuns(result ? result->runs : std::vector<tuner::RunComparison>{});
  // Before any comparison the keys' empty table stays, under the note that asks for a baseline.
  runs_section_->setVisible(runs_model_->rowCount() > 0);
  keys_section_->setVisible(!result || model_->rowCount() > 0);
  if (!result) return;
  if (!result->runs.empty()) {
    const tuner::RunComparison& first = result->runs.front();
    runs_heading_->setText(
        QStringLiteral("<b>The runs, step by step</b> (%1 against %2 steps; medians per step)")
            .arg(first.current_steps)
            .arg(first.baseline_steps));
    runs_table_->resizeColumnsToContents();
  }
  keys_heading_->setText(
      QStringLiteral("<b>Measured keys</b> (%1; regressions first)").arg(model_->rowCount()));
  table_->resizeColumnsToContents();
}

void RunsView::clear() {
  jobs_.cancel();
  current_.clear();
  baseline_.clear();
  loading_ = false;
  showResult(nullptr);
  compare_->setEnabled(false);
  summary_->setText(QStringLiteral("No trace open."));
  summary_->setToolTip({});
}

void RunsView::setTrace(const TraceInfo& info) {
  current_ = info.path;
  compare_->setEnabled(true);
  if (!baseline_.isEmpty()) {
    compareWith(baseline_);
    return;
  }
  showResult(nullptr);
  summary_->setText(
      QStringLiteral("Compare this trace with a baseline trace (<b>File › Compare with…</b>): the two runs "
                     "step by step, and every strategy and size measured in both, judged as "
                     "<tt>gradscope check</tt> does."));
}

void RunsView::compareWith(const QString& baseline_path) {
  if (current_.empty()) return;
  baseline_ = baseline_path;
  loading_ = true;
  summary_->setText(QStringLiteral("Comparing with %1…").arg(baseline_path.toHtmlEscaped()));
  summary_->setToolTip({});
  const std::string baseline = baseline_path.toStdString();
  const std::string current = current_;
  jobs_.run<tuner::CheckResult>(
      [baseline, current] { return tuner::checkTraces(baseline, current); },
      [this](Outcome<tuner::CheckResult> outcome) {
        loading_ = false;
        if (!outcome.value) {
          showResult(nullptr);
          summary_->setText(QStringLiteral("<b>Cannot compare:</b> %1").arg(outcome.error.toHtmlEscaped()));
          emit loaded();
          return;
        }
        const tuner::CheckResult& result = *outcome.value;
        const int exit_code = result.exitCode();
        const QString verdict = exit_code == tuner::kCheckExitRegression
                                    ? QStringLiteral(
                                          "<span style='color:#c62828'><b>regression</b></span> "
                                          "(gradscope check exits 1)")
                                    : QStringLiteral(
                                          "<span style='color:#2e7d32'><b>no regression</b></span> "
                                          "(gradscope check exits 0)");
        // What was compared: the runs' figures, the measured keys, or both (two observe runs measure
        // no keys; traces with fewer than 16 steps are not compared step by step).
        QStringList compared;
        if (!result.runs.empty())
          compared << QStringLiteral("%1 figures of the runs step by step").arg(result.runs.size());
        if (!result.comparisons.empty() || !result.not_compared.empty())
          compared << QStringLiteral("%1 measured keys (%2 measured on one side only)")
                          .arg(result.comparisons.size())
                          .arg(result.not_compared.size());
        QString note;
        if (result.comparisons.empty() && !result.runs.empty())
          note = QStringLiteral(
              "<br>No key was measured in both traces (observe runs measure none): the runs "
              "were compared step by step.");
        summary_->setText(QStringLiteral("Baseline %1 → current %2: %3<br>"
                                         "Compared %4: %5 regressions · %6 improvements · %7 noisy · "
                                         "%8 unchanged · tolerance %9 %, α %10%11")
                              .arg(fileLabel(result.baseline_path), fileLabel(result.current_path), verdict,
                                   compared.join(QStringLiteral(" and ")))
                              .arg(result.count(tuner::Verdict::Regression))
                              .arg(result.count(tuner::Verdict::Improvement))
                              .arg(result.count(tuner::Verdict::Noisy))
                              .arg(result.count(tuner::Verdict::Unchanged))
                              .arg(100 * result.tolerance, 0, 'g', 3)
                              .arg(result.alpha, 0, 'g', 3)
                              .arg(note));
        summary_->setToolTip(
            QStringLiteral("Baseline: %1\nCurrent: %2")
                .arg(QFileInfo(QString::fromStdString(result.baseline_path)).absoluteFilePath(),
                     QFileInfo(QString::fromStdString(result.current_path)).absoluteFilePath()));
        showResult(&result);
        emit loaded();
      });
}

}  // namespace gradscope::gui
