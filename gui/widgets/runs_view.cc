#include "widgets/runs_view.h"

#include <QDir>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
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
}  // namespace

RunsView::RunsView(QWidget* parent) : QWidget(parent), model_(new CheckModel(this)), jobs_(this) {
  table_ = makeSortedTable(model_, -1, true, this);  // the check's own order: regressions first
  summary_ = new QLabel(this);
  summary_->setWordWrap(true);
  summary_->setTextFormat(Qt::RichText);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  compare_ = new QPushButton(QStringLiteral("Compare with…"), this);
  auto* top = new QHBoxLayout;
  top->addWidget(summary_, 1);
  top->addWidget(compare_, 0, Qt::AlignTop);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(8, 8, 8, 8);
  layout->addLayout(top);
  layout->addWidget(table_, 1);
  connect(compare_, &QPushButton::clicked, this, &RunsView::compareRequested);
  clear();
}

void RunsView::clear() {
  jobs_.cancel();
  current_.clear();
  baseline_.clear();
  loading_ = false;
  model_->setComparisons({});
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
  model_->setComparisons({});
  summary_->setText(
      QStringLiteral("Compare this trace with a baseline trace (<b>File › Compare with…</b>): every "
                     "strategy and size measured in both is judged as <tt>gradscope check</tt> does."));
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
          model_->setComparisons({});
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
        summary_->setText(QStringLiteral("Baseline %1 → current %2: %3<br>"
                                         "%4 regressions · %5 improvements · %6 noisy · %7 unchanged · "
                                         "%8 keys measured on one side only · tolerance %9 %, α %10")
                              .arg(fileLabel(result.baseline_path), fileLabel(result.current_path), verdict)
                              .arg(result.count(tuner::Verdict::Regression))
                              .arg(result.count(tuner::Verdict::Improvement))
                              .arg(result.count(tuner::Verdict::Noisy))
                              .arg(result.count(tuner::Verdict::Unchanged))
                              .arg(result.not_compared.size())
                              .arg(100 * result.tolerance, 0, 'g', 3)
                              .arg(result.alpha, 0, 'g', 3));
        summary_->setToolTip(
            QStringLiteral("Baseline: %1\nCurrent: %2")
                .arg(QFileInfo(QString::fromStdString(result.baseline_path)).absoluteFilePath(),
                     QFileInfo(QString::fromStdString(result.current_path)).absoluteFilePath()));
        model_->setComparisons(result.comparisons);
        table_->resizeColumnsToContents();
        emit loaded();
      });
}

}  // namespace gradscope::gui
