#include "widgets/main_window.h"

#include <algorithm>

#include <QAction>
#include <QApplication>
#include <QComboBox>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QMenuBar>
#include <QMimeData>
#include <QPushButton>
#include <QSettings>
#include <QSplitter>
#include <QStackedWidget>
#include <QStatusBar>
#include <QTabWidget>
#include <QTimer>
#include <QToolButton>
#include <QVBoxLayout>

#include "gradscope/common/units.h"
#include "widgets/calls_view.h"
#include "widgets/comm_matrix_view.h"
#include "widgets/consensus_view.h"
#include "widgets/recommendation_view.h"
#include "widgets/runs_view.h"
#include "widgets/steps_view.h"
#include "widgets/strategies_view.h"
#include "widgets/timeline_widget.h"

namespace gradscope::gui {

namespace {
constexpr int kMaxRecent = 8;
// How often Follow live looks at the trace: often enough to watch a job, rare enough to cost nothing.
constexpr int kLivePollMs = 1000;
const char* const kRecentKey = "recentFiles";
const char* const kTraceFilter = "gradscope traces (*.db *.sqlite);;All files (*)";

QString countText(std::int64_t n) {
  return QString::fromStdString(formatCount(static_cast<std::uint64_t>(n)));
}
}  // namespace

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent), state_(new ViewState(this)), open_job_(this), live_job_(this) {
  setWindowTitle(QStringLiteral("gradscope"));
  setAcceptDrops(true);

  timeline_ = new TimelineWidget(state_, this);
  calls_ = new CallsView(state_, this);
  strategies_ = new StrategiesView(this);
  consensus_ = new ConsensusView(this);
  recommendation_ = new RecommendationView(this);
  runs_ = new RunsView(this);
  communication_ = new CommMatrixView(this);
  steps_ = new StepsView(this);

  // Timeline tab: a small toolbar, the timeline and the calls table.
  auto* timeline_page = new QWidget(this);
  auto* toolbar = new QHBoxLayout;
  auto* colour = new QComboBox(timeline_page);
  colour->addItem(QStringLiteral("Colour by API"));
  colour->addItem(QStringLiteral("Colour by strategy (apply mode)"));
  connect(colour, &QComboBox::currentIndexChanged, this,
          [this](int index) { state_->setColourBy(index == 1 ? ColourBy::Strategy : ColourBy::Api); });
  auto button = [timeline_page](const QString& text, const QString& tip) {
    auto* b = new QToolButton(timeline_page);
    b->setText(text);
    b->setToolTip(tip);
    return b;
  };
  QToolButton* zoom_in =
      button(QStringLiteral("Zoom in"), QStringLiteral("Zoom in (+, wheel, double click)"));
  QToolButton* zoom_out = button(QStringLiteral("Zoom out"), QStringLiteral("Zoom out (-, wheel)"));
  QToolButton* back = button(QStringLiteral("Back"), QStringLiteral("Previous zoom (Backspace)"));
  QToolButton* all = button(QStringLiteral("Show all"), QStringLiteral("Whole trace (0)"));
  auto zoom = [this](double factor) {
    const TimeRange w = state_->window();
    state_->setWindow(zoomAround(w, (w.begin_ns + w.end_ns) / 2, factor, state_->extent()), true);
  };
  connect(zoom_in, &QToolButton::clicked, this, [zoom] { zoom(0.5); });
  connect(zoom_out, &QToolButton::clicked, this, [zoom] { zoom(2.0); });
  connect(back, &QToolButton::clicked, this, [this] { state_->zoomBack(); });
  connect(all, &QToolButton::clicked, this, [this] { state_->resetZoom(); });
  auto* hint =
      new QLabel(QStringLiteral("wheel: zoom · drag: pan · right drag: zoom to selection · click: select"),
                 timeline_page);
  hint->setStyleSheet(QStringLiteral("color: #6b7280"));
  toolbar->addWidget(colour);
  toolbar->addWidget(zoom_in);
  toolbar->addWidget(zoom_out);
  toolbar->addWidget(back);
  toolbar->addWidget(all);
  toolbar->addStretch(1);
  toolbar->addWidget(hint);
  splitter_ = new QSplitter(Qt::Vertical, timeline_page);
  auto* splitter = splitter_;
  splitter->addWidget(timeline_);
  splitter->addWidget(calls_);
  splitter->setStretchFactor(0, 3);
  splitter->setStretchFactor(1, 2);
  auto* timeline_layout = new QVBoxLayout(timeline_page);
  timeline_layout->setContentsMargins(4, 4, 4, 0);
  timeline_layout->addLayout(toolbar);
  timeline_layout->addWidget(splitter, 1);

  tabs_ = new QTabWidget(this);
  tabs_->setDocumentMode(true);
  tabs_->addTab(timeline_page, QStringLiteral("Timeline"));
  tabs_->addTab(strategies_, QStringLiteral("Compare strategies"));
  tabs_->addTab(consensus_, QStringLiteral("Consensus"));
  tabs_->addTab(recommendation_, QStringLiteral("Recommendation"));
  tabs_->addTab(runs_, QStringLiteral("Runs"));
  tabs_->addTab(communication_, QStringLiteral("Communication"));
  tabs_->addTab(steps_, QStringLiteral("Steps"));
  connect(tabs_, &QTabWidget::currentChanged, this, [this] {
    if (communication_stale_ && info_ && tabs_->currentWidget() == communication_) {
      communication_stale_ = false;
      communication_->setTrace(*info_);
    }
    if (steps_stale_ && info_ && tabs_->currentWidget() == steps_) {
      steps_stale_ = false;
      steps_->setTrace(*info_);
    }
  });
  // A step clicked in the Steps tab: the timeline shows its time range, then comes to the front, on the
  // rank whose cell it was (the calls filter's rank: at 1024 ranks the user picks the lanes this way), or
  // on every rank for a bar.
  connect(steps_, &StepsView::showOnTimeline, this,
          [this](TimeRange range, std::int64_t rank_id, std::int64_t) {
            CallFilter filter = state_->filter();
            filter.rank_id = rank_id >= 0 ? std::optional<std::int64_t>(rank_id) : std::nullopt;
            state_->setFilter(filter);
            state_->setWindow(range, true);
            tabs_->setCurrentIndex(0);
          });

  // The page shown without a trace, or with the message of one that cannot be opened.
  auto* message_page = new QWidget(this);
  message_ = new QLabel(message_page);
  message_->setWordWrap(true);
  message_->setTextFormat(Qt::RichText);
  message_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  message_->setAlignment(Qt::AlignCenter);
  // A word-wrapped label in a centring layout shrinks to its narrowest: give the message room.
  message_->setMinimumWidth(760);
  message_->setMaximumWidth(1000);
  auto* open_button = new QPushButton(QStringLiteral("Open a trace…"), message_page);
  connect(open_button, &QPushButton::clicked, this, &MainWindow::chooseFileToOpen);
  auto* message_layout = new QVBoxLayout(message_page);
  message_layout->addStretch(1);
  message_layout->addWidget(message_, 0, Qt::AlignHCenter);
  message_layout->addSpacing(16);
  message_layout->addWidget(open_button, 0, Qt::AlignHCenter);
  message_layout->addStretch(2);
  message_->setText(
      QStringLiteral("<h2>gradscope</h2><p>Open a trace with <b>File › Open</b>, or drop one "
                     "here.</p><p>Traces come from <tt>gradscope run</tt>, <tt>gradscope bench</tt> "
                     "and <tt>gradscope merge</tt>.</p>"));

  stack_ = new QStackedWidget(this);
  stack_->addWidget(message_page);
  stack_->addWidget(tabs_);
  setCentralWidget(stack_);

  status_file_ = new QLabel(this);
  status_calls_ = new QLabel(this);
  status_drops_ = new QLabel(this);
  status_ranks_ = new QLabel(this);
  status_mode_ = new QLabel(this);
  statusBar()->addWidget(status_file_, 1);
  statusBar()->addPermanentWidget(status_calls_);
  statusBar()->addPermanentWidget(status_drops_);
  statusBar()->addPermanentWidget(status_ranks_);
  statusBar()->addPermanentWidget(status_mode_);

  live_timer_ = new QTimer(this);
  live_timer_->setInterval(kLivePollMs);
  connect(live_timer_, &QTimer::timeout, this, &MainWindow::pollLive);
  connect(runs_, &RunsView::compareRequested, this, &MainWindow::chooseBaseline);
  connect(timeline_, &TimelineWidget::loadFailed, this, [this](const QString& message) {
    statusBar()->showMessage(QStringLiteral("Timeline: %1").arg(message), 10000);
  });

  buildMenus();
  updateStatus();
  resize(1400, 900);
}

void MainWindow::buildMenus() {
  QMenu* file = menuBar()->addMenu(QStringLiteral("&File"));
  QAction* open = file->addAction(QStringLiteral("&Open…"), this, &MainWindow::chooseFileToOpen);
  open->setShortcut(QKeySequence::Open);
  recent_menu_ = file->addMenu(QStringLiteral("Open &Recent"));
  fillRecentMenu();
  compare_action_ = file->addAction(QStringLiteral("&Compare with…"), this, &MainWindow::chooseBaseline);
  compare_action_->setEnabled(false);
  live_action_ = file->addAction(QStringLiteral("Follow &live"));
  live_action_->setCheckable(true);
  live_action_->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_L));
  live_action_->setToolTip(QStringLiteral("Re-read the trace every second while a job writes it"));
  connect(live_action_, &QAction::toggled, this, &MainWindow::setLive);
  file->addSeparator();
  QAction* quit = file->addAction(QStringLiteral("&Quit"), qApp, &QApplication::closeAllWindows);
  quit->setShortcut(QKeySequence::Quit);

  QMenu* view = menuBar()->addMenu(QStringLiteral("&View"));
  for (int i = 0; i < tabs_->count(); ++i) {
    QAction* action = view->addAction(tabs_->tabText(i), this, [this, i] { tabs_->setCurrentIndex(i); });
    action->setShortcut(QKeySequence(Qt::ALT | static_cast<Qt::Key>(Qt::Key_1 + i)));
  }
  view->addSeparator();
  QAction* back = view->addAction(QStringLiteral("Zoom &back"), this, [this] { state_->zoomBack(); });
  back->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Backspace));
  QAction* all = view->addAction(QStringLiteral("Show &all"), this, [this] { state_->resetZoom(); });
  all->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_0));
}

std::vector<std::pair<QString, int>> MainWindow::views() const {
  return {{QStringLiteral("timeline"), 0},  {QStringLiteral("strategies"), 1},
          {QStringLiteral("consensus"), 2}, {QStringLiteral("recommendation"), 3},
          {QStringLiteral("runs"), 4},      {QStringLiteral("communication"), 5},
          {QStringLiteral("steps"), 6}};
}

bool MainWindow::busy() const {
  return opening_ || jobsInFlight() > 0 || calls_->requeryPending();
}

bool MainWindow::showingError() const {
  return !error_text_.isEmpty() && stack_->currentIndex() == 0;
}

void MainWindow::chooseFileToOpen() {
  const QString path = QFileDialog::getOpenFileName(this, QStringLiteral("Open a trace"), QString(),
                                                    QString::fromLatin1(kTraceFilter));
  if (!path.isEmpty()) openTrace(path);
}

void MainWindow::chooseBaseline() {
  if (!info_) return;
  const QString path = QFileDialog::getOpenFileName(
      this, QStringLiteral("Baseline trace to compare with"),
      QFileInfo(QString::fromStdString(info_->path)).absolutePath(), QString::fromLatin1(kTraceFilter));
  if (!path.isEmpty()) compareWith(path);
}

void MainWindow::compareWith(const QString& baseline_path) {
  tabs_->setCurrentWidget(runs_);
  runs_->compareWith(baseline_path);
}

void MainWindow::openTrace(const QString& path, const QString& shown) {
  opening_ = true;
  const QString absolute = QFileInfo(path).absoluteFilePath();
  statusBar()->showMessage(QStringLiteral("Opening %1…").arg(shown.isEmpty() ? absolute : shown));
  const std::string file = absolute.toStdString();
  open_job_.run<TraceInfo>(
      [file] {
        try {
          return loadTraceInfo(threadReader(file));
        } catch (...) {
          dropThreadReader(file);
          throw;
        }
      },
      [this, absolute, shown](Outcome<TraceInfo> outcome) {
        opening_ = false;
        statusBar()->clearMessage();
        if (!outcome.value) {
          showError(
              QStringLiteral("Cannot open %1").arg(shown.isEmpty() ? QFileInfo(absolute).fileName() : shown),
              outcome.error);
          return;
        }
        shown_name_ = shown;
        if (shown.isEmpty()) addRecent(absolute);
        showTrace(*outcome.value);
      });
}

void MainWindow::showError(const QString& title, const QString& message) {
  info_.reset();
  error_text_ = message;
  setLive(false);
  timeline_->clear();
  calls_->clear();
  strategies_->clear();
  consensus_->clear();
  recommendation_->clear();
  runs_->clear();
  communication_->clear();
  steps_->clear();
  compare_action_->setEnabled(false);
  message_->setText(QStringLiteral("<h2 style='color:#c62828'>%1</h2><p style='font-size:large'>%2</p>")
                        .arg(title.toHtmlEscaped(), message.toHtmlEscaped()));
  stack_->setCurrentIndex(0);
  setWindowTitle(QStringLiteral("gradscope"));
  updateStatus();
}

void MainWindow::showTrace(const TraceInfo& info) {
  info_ = info;
  error_text_.clear();
  state_->setSelection(std::nullopt);
  state_->setExtent(info.extent);
  timeline_->setTrace(info);
  calls_->setTrace(info);
  strategies_->setTrace(info);
  consensus_->setTrace(info);
  recommendation_->setTrace(info);
  runs_->setTrace(info);
  communication_->setTrace(info);
  communication_stale_ = false;
  steps_->setTrace(info);
  steps_stale_ = false;
  compare_action_->setEnabled(true);
  stack_->setCurrentIndex(1);
  // The timeline as tall as its rows need (a few ranks leave no empty band), the table the rest.
  const int total = splitter_->height() > 0 ? splitter_->height() : 700;
  const int timeline_height = std::clamp(timeline_->preferredHeight(), total / 4, total * 2 / 3);
  splitter_->setSizes({timeline_height, total - timeline_height});
  setWindowTitle(QStringLiteral("%1 — gradscope")
                     .arg(shown_name_.isEmpty() ? QFileInfo(QString::fromStdString(info.path)).fileName()
                                                : shown_name_));
  if (!pending_baseline_.isEmpty()) {
    runs_->compareWith(std::exchange(pending_baseline_, QString()));
  }
  if (std::exchange(pending_live_, false)) setLive(true);
  updateStatus();
}

void MainWindow::updateStatus() {
  if (!info_) {
    status_file_->setText(error_text_.isEmpty() ? QStringLiteral("No trace") : QStringLiteral("Not opened"));
    status_calls_->clear();
    status_drops_->clear();
    status_drops_->setToolTip({});
    status_ranks_->clear();
    status_mode_->clear();
    return;
  }
  status_file_->setText(shown_name_.isEmpty() ? QString::fromStdString(info_->path) : shown_name_);
  status_calls_->setText(QStringLiteral("%1 calls").arg(countText(info_->calls)));
  // "none" must mean none: a trace whose recording stopped says so here, not only in gradscope report.
  const DropSummary drops = summarizeDrops(info_->drops);
  status_drops_->setText(QString::fromStdString(drops.text));
  status_drops_->setToolTip(QString::fromStdString(drops.details));
  status_drops_->setStyleSheet(drops.calls_lost > 0 ? QStringLiteral("color: #c62828; font-weight: bold")
                               : drops.events > 0   ? QStringLiteral("color: #ef6c00")
                                                    : QString());
  std::vector<std::string> hosts;
  for (const storage::RankInfo& rank : info_->ranks) {
    if (std::find(hosts.begin(), hosts.end(), rank.host) == hosts.end()) hosts.push_back(rank.host);
  }
  status_ranks_->setText(QStringLiteral("%1 rank%2 on %3 host%4")
                             .arg(info_->ranks.size())
                             .arg(info_->ranks.size() == 1 ? QString() : QStringLiteral("s"))
                             .arg(hosts.size())
                             .arg(hosts.size() == 1 ? QString() : QStringLiteral("s")));
  QStringList modes;
  for (const storage::RunInfo& run : info_->runs) {
    if (!modes.contains(QString::fromStdString(run.mode))) modes << QString::fromStdString(run.mode);
  }
  QString mode = modes.join(QStringLiteral(", "));
  if (live()) {
    mode += QStringLiteral(" · following live");
  } else if (info_->live) {
    mode += QStringLiteral(" · still being written (File › Follow live)");
  }
  status_mode_->setText(mode);
}

void MainWindow::addRecent(const QString& path) {
  QSettings settings;
  QStringList recent = settings.value(QString::fromLatin1(kRecentKey)).toStringList();
  recent.removeAll(path);
  recent.prepend(path);
  while (recent.size() > kMaxRecent) recent.removeLast();
  settings.setValue(QString::fromLatin1(kRecentKey), recent);
  fillRecentMenu();
}

void MainWindow::fillRecentMenu() {
  recent_menu_->clear();
  const QStringList recent = QSettings().value(QString::fromLatin1(kRecentKey)).toStringList();
  for (const QString& path : recent) {
    recent_menu_->addAction(path, this, [this, path] { openTrace(path); });
  }
  recent_menu_->setEnabled(!recent.isEmpty());
}

bool MainWindow::live() const {
  return live_timer_->isActive();
}

void MainWindow::setLive(bool live) {
  if (live && info_) {
    live_timer_->start();
  } else {
    live_timer_->stop();
    live_job_.cancel();
  }
  if (live_action_->isChecked() != live_timer_->isActive()) {
    const QSignalBlocker block(live_action_);
    live_action_->setChecked(live_timer_->isActive());
  }
  updateStatus();
}

void MainWindow::pollLive() {
  if (!info_) return;
  const std::string file = info_->path;
  live_job_.run<TraceInfo>([file] { return loadTraceInfo(threadReader(file)); },
                           [this](Outcome<TraceInfo> outcome) {
                             if (!outcome.value || !info_ || outcome.value->path != info_->path) return;
                             const TraceInfo& next = *outcome.value;
                             const bool grew = next.calls != info_->calls ||
                                               !(next.extent == info_->extent) ||
                                               next.ranks.size() != info_->ranks.size();
                             const bool ranks_changed = next.ranks.size() != info_->ranks.size();
                             const bool measured = next.measurements != info_->measurements ||
                                                   next.consensus_rows != info_->consensus_rows;
                             info_ = next;
                             if (grew) {
                               state_->setExtent(next.extent, true);
                               if (ranks_changed) {
                                 timeline_->setTrace(next);
                               } else {
                                 timeline_->reload();
                               }
                             }
                             if (measured) {
                               strategies_->setTrace(next);
                               consensus_->setTrace(next);
                             }
                             // The matrix scans every point-to-point call: again only while it is shown.
                             if (grew) {
                               communication_stale_ = tabs_->currentWidget() != communication_;
                               if (!communication_stale_) communication_->setTrace(next);
                               steps_stale_ = tabs_->currentWidget() != steps_;
                               if (!steps_stale_) steps_->setTrace(next);
                             }
                             updateStatus();
                           });
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event) {
  const QList<QUrl> urls = event->mimeData()->urls();
  if (!urls.isEmpty() && urls.first().isLocalFile()) event->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* event) {
  const QList<QUrl> urls = event->mimeData()->urls();
  if (urls.isEmpty() || !urls.first().isLocalFile()) return;
  openTrace(urls.first().toLocalFile());
  event->acceptProposedAction();
}

}  // namespace gradscope::gui
