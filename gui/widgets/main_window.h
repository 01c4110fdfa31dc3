#pragma once

// The main window: tabs for the views of one trace (Timeline with the calls table, Strategies,
// Consensus, Recommendation, Runs, Communication, Steps), a File menu (Open, Open Recent, Compare with…,
// Follow live, Quit), drag and drop, and a status bar with the file, its calls and ranks.
//
// Opening reads the trace's summary on the thread pool; a file the storage library refuses (missing,
// empty, not SQLite, foreign, truncated, newer schema) replaces the tabs with its one-line message.
// Follow live re-reads the summary every second and extends the timeline while a job writes the trace.

#include <optional>
#include <utility>
#include <vector>

#include <QMainWindow>

#include "models/jobs.h"
#include "models/trace_data.h"
#include "models/view_state.h"

class QAction;
class QLabel;
class QMenu;
class QSplitter;
class QStackedWidget;
class QTabWidget;
class QTimer;

namespace gradscope::gui {

class CallsView;
class CommMatrixView;
class ConsensusView;
class RecommendationView;
class RunsView;
class StepsView;
class StrategiesView;
class TimelineWidget;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(QWidget* parent = nullptr);

  // `shown`: what the title and the status bar name instead of `path`, which is then not remembered among
  // the recent files (a run's directory of rank files, opened through its temporary merged copy).
  void openTrace(const QString& path, const QString& shown = {});
  void compareWith(const QString& baseline_path);
  void setLive(bool live);
  bool live() const;
  // Applied when the next trace has opened (command-line --compare and --live).
  void compareWhenOpened(const QString& baseline_path) { pending_baseline_ = baseline_path; }
  void followWhenOpened() { pending_live_ = true; }

  // State for tests and the screenshot mode.
  bool busy() const;
  bool showingError() const;
  QString errorText() const { return error_text_; }
  const std::optional<TraceInfo>& trace() const { return info_; }
  ViewState* state() { return state_; }
  QTabWidget* tabs() { return tabs_; }
  TimelineWidget* timeline() { return timeline_; }
  CallsView* calls() { return calls_; }
  StrategiesView* strategies() { return strategies_; }
  ConsensusView* consensus() { return consensus_; }
  RecommendationView* recommendation() { return recommendation_; }
  RunsView* runs() { return runs_; }
  CommMatrixView* communication() { return communication_; }
  StepsView* steps() { return steps_; }
  // (file name, tab index) of every tab, for screenshots.
  std::vector<std::pair<QString, int>> views() const;

 protected:
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  void buildMenus();
  void showError(const QString& title, const QString& message);
  void showTrace(const TraceInfo& info);
  void updateStatus();
  void addRecent(const QString& path);
  void fillRecentMenu();
  void pollLive();
  void chooseFileToOpen();
  void chooseBaseline();

  ViewState* state_;
  QStackedWidget* stack_;
  QLabel* message_;
  QTabWidget* tabs_;
  QSplitter* splitter_;
  TimelineWidget* timeline_;
  CallsView* calls_;
  StrategiesView* strategies_;
  ConsensusView* consensus_;
  RecommendationView* recommendation_;
  RunsView* runs_;
  CommMatrixView* communication_;
  StepsView* steps_;
  QMenu* recent_menu_ = nullptr;
  QAction* live_action_ = nullptr;
  QAction* compare_action_ = nullptr;
  QLabel* status_file_;
  QLabel* status_calls_;
  QLabel* status_drops_;  // what the agent could not record (red when calls are missing)
  QLabel* status_ranks_;
  QLabel* status_mode_;
  QTimer* live_timer_;
  std::optional<TraceInfo> info_;
  QString shown_name_;  // openTrace's `shown` for the trace open now; empty: its path
  QString error_text_;
  bool opening_ = false;
  QString pending_baseline_;
  bool pending_live_ = false;
  bool communication_stale_ = false;  // a live trace grew while another tab was shown
  bool steps_stale_ = false;          // likewise for the steps
  JobTracker open_job_;
  JobTracker live_job_;
};

}  // namespace gradscope::gui
