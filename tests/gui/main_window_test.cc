// The window, headless: bad files show their message and do not crash; every view renders real data
// (pixels checked in the areas where it draws); timeline ↔ table selection; a point-to-point message's
// arrow and the communication matrix of a pipeline job; exports; live mode.

#include "widgets/main_window.h"

#include <QAbstractItemModelTester>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QHeaderView>
#include <QImage>
#include <QLabel>
#include <QScrollArea>
#include <QStatusBar>
#include <QTabWidget>
#include <QTableView>
#include <QTemporaryDir>
#include <QTest>
#include <QToolTip>
#include <QtCharts/QChartView>
#include <QtCharts/QLineSeries>
#include <QtCharts/QScatterSeries>

#include "gradscope/storage/writer.h"
#include "gui_test_support.h"
#include "pipeline_trace.h"
#include "synthetic_trace.h"
#include "widgets/calls_view.h"
#include "widgets/comm_matrix_view.h"
#include "widgets/consensus_view.h"
#include "widgets/recommendation_view.h"
#include "widgets/runs_view.h"
#include "widgets/steps_view.h"
#include "widgets/strategies_view.h"
#include "widgets/timeline_widget.h"

using namespace gradscope;
using namespace gradscope::gui;

namespace {

// Idle for a few event-loop turns in a row: a load may be scheduled one turn after what asks for it.
bool waitIdle(MainWindow& window, int timeout_ms = 60000) {
  QElapsedTimer timer;
  timer.start();
  int idle = 0;
  while (timer.elapsed() < timeout_ms) {
    QTest::qWait(10);
    idle = window.busy() ? 0 : idle + 1;
    if (idle >= 5) return true;
  }
  return false;
}

// The window at the size the figures use, showing `path` once everything it loads has loaded.
bool showTrace(MainWindow& window, const QString& path) {
  window.resize(1400, 900);
  window.show();
  window.openTrace(path);
  return waitIdle(window);
}

// Pixels that are clearly coloured (not white, grey or black): bars, lines, markers.
int colouredPixels(const QImage& image, const QRect& area) {
  int count = 0;
  const QRect clipped = area.intersected(image.rect());
  for (int y = clipped.top(); y <= clipped.bottom(); ++y) {
    for (int x = clipped.left(); x <= clipped.right(); ++x) {
      const QColor c = image.pixelColor(x, y);
      if (c.hsvSaturation() > 50 && c.value() > 60) ++count;
    }
  }
  return count;
}

}  // namespace

class MainWindowTest : public QObject {
  Q_OBJECT
 private:
  QTemporaryDir dir_;
  QString trace_;
  QString slow_;

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    trace_ = QString::fromStdString(
        gui::testing::writeTestTrace(dir_.filePath(QStringLiteral("trace.db")).toStdString()));
    slow_ = QString::fromStdString(
        gui::testing::writeTestTrace(dir_.filePath(QStringLiteral("slow.db")).toStdString(),
                                     gui::testing::TraceOptions{4, 40, 1.5, true}));
  }

  void badFilesShowTheirMessage_data() {
    QTest::addColumn<QString>("path");
    QTest::addColumn<QString>("kind");
    QTest::newRow("missing") << dir_.filePath(QStringLiteral("no-such.db")) << QStringLiteral("missing");
    QTest::newRow("empty") << QString::fromStdString(gui::testing::writeEmptyFile(dir_))
                           << QStringLiteral("empty");
    QTest::newRow("not SQLite") << QString::fromStdString(gui::testing::writeTextFile(dir_))
                                << QStringLiteral("text");
    QTest::newRow("foreign SQLite") << QString::fromStdString(gui::testing::writeForeignSqlite(dir_))
                                    << QStringLiteral("foreign");
    QTest::newRow("truncated") << QString::fromStdString(gui::testing::writeTruncatedTrace(dir_))
                               << QStringLiteral("truncated");
    QTest::newRow("newer schema") << QString::fromStdString(gui::testing::writeNewerSchemaTrace(dir_))
                                  << QStringLiteral("newer");
    QTest::newRow("directory") << dir_.path() << QStringLiteral("directory");
  }
  void badFilesShowTheirMessage() {
    QFETCH(QString, path);
    MainWindow window;
    window.show();
    window.openTrace(path);
    QVERIFY(waitIdle(window));
    QVERIFY2(window.showingError(), qPrintable(path));
    QVERIFY(!window.errorText().isEmpty());
    QVERIFY(!window.errorText().contains(QLatin1Char('\n')));  // the library's one line
    QVERIFY(!window.trace().has_value());
    // The message is on screen, in the window.
    const QList<QLabel*> labels = window.findChildren<QLabel*>();
    const bool shown = std::any_of(labels.begin(), labels.end(), [&](QLabel* label) {
      return label->isVisible() && label->text().contains(window.errorText().toHtmlEscaped());
    });
    QVERIFY(shown);
    // And a good file opens afterwards.
    window.openTrace(trace_);
    QVERIFY(waitIdle(window));
    QVERIFY(!window.showingError());
    QVERIFY(window.trace().has_value());
  }

  // A run's directory of rank files is opened through its merged copy (gradscope-gui DIR): the window
  // names the directory, not the temporary file.
  void aMergedCopyIsNamedByItsDirectory() {
    MainWindow window;
    window.show();
    const QString directory = QStringLiteral("/runs/job-17/ranks");
    window.openTrace(trace_, directory);
    QVERIFY(waitIdle(window));
    QVERIFY(window.trace().has_value());
    QCOMPARE(window.windowTitle(), QStringLiteral("%1 — gradscope").arg(directory));
    const QList<QLabel*> labels = window.statusBar()->findChildren<QLabel*>();
    QVERIFY(
        std::any_of(labels.begin(), labels.end(), [&](QLabel* label) { return label->text() == directory; }));
    QVERIFY(std::none_of(labels.begin(), labels.end(), [&](QLabel* label) {
      return label->text().contains(QFileInfo(trace_).fileName());
    }));
    // A file opened afterwards is named by its own path again.
    window.openTrace(trace_);
    QVERIFY(waitIdle(window));
    QCOMPARE(window.windowTitle(), QStringLiteral("%1 — gradscope").arg(QFileInfo(trace_).fileName()));
  }

  // The status bar says what the agent could not record: "nothing dropped", or in red how many calls
  // are missing, with every kind and its meaning in the tooltip.
  void statusBarAccountsForDroppedEvents() {
    const auto statusLabel = [](MainWindow& window, const QString& prefix) -> QLabel* {
      for (QLabel* label : window.statusBar()->findChildren<QLabel*>())
        if (label->text().contains(prefix)) return label;
      return nullptr;
    };
    MainWindow window;
    QVERIFY(showTrace(window, trace_));
    QLabel* none = statusLabel(window, QStringLiteral("nothing dropped"));
    QVERIFY(none != nullptr);
    QVERIFY(none->isVisible());
    QVERIFY(window.statusBar()->findChildren<QLabel*>().size() >= 4);

    const QString lossy = dir_.filePath(QStringLiteral("lossy.db"));
    QFile::remove(lossy);
    QVERIFY(QFile::copy(trace_, lossy));
    gui::testing::exec(lossy.toStdString(),
                       "INSERT INTO drops (rank_id, kind, count) VALUES (0, 'recording_stopped', 938), "
                       "(1, 'gpu_timing', 2)");
    MainWindow other;
    QVERIFY(showTrace(other, lossy));
    QLabel* lost = statusLabel(other, QStringLiteral("calls not recorded"));
    QVERIFY(lost != nullptr);
    QCOMPARE(lost->text(), QStringLiteral("938 calls not recorded"));
    QVERIFY(lost->styleSheet().contains(QStringLiteral("#c62828")));
    QVERIFY(lost->toolTip().contains(QStringLiteral("recording stopped after an error")));
    QVERIFY(lost->toolTip().contains(QStringLiteral("gpu_timing")));
  }

  void everyViewRendersItsData() {
    MainWindow window;
    QVERIFY(showTrace(window, trace_));
    QVERIFY(window.trace().has_value());
    QCOMPARE(window.trace()->ranks.size(), std::size_t{4});

    // Timeline: bars in the plot area, in every rank's row.
    window.tabs()->setCurrentIndex(0);
    QVERIFY(waitIdle(window));
    TimelineWidget* timeline = window.timeline();
    QVERIFY(timeline->hasFrame());
    const QImage timeline_image = timeline->grab().toImage();
    QVERIFY(colouredPixels(timeline_image, timeline->plotRect()) > 500);
    const QRect gutter(0, timeline->plotRect().top(), timeline->plotRect().left() - 1,
                       timeline->plotRect().height());
    QVERIFY(colouredPixels(timeline_image, gutter) <
            20);  // labels only (antialiased), no bars left of the plot
    // Calls table: the window's calls.
    QTRY_VERIFY(window.calls()->model()->rowCount() > 0);

    // Charts: lines and markers in every chart of the three chart views.
    for (const int tab : {1, 2}) {
      window.tabs()->setCurrentIndex(tab);
      QVERIFY(waitIdle(window));
      const QList<QChartView*> charts = window.tabs()->widget(tab)->findChildren<QChartView*>();
      QCOMPARE(charts.size(), 3);
      for (QChartView* chart : charts) {
        const QImage image = chart->grab().toImage();
        QVERIFY2(colouredPixels(image, image.rect()) > 100, qPrintable(chart->chart()->title()));
      }
    }
    QCOMPARE(window.strategies()->model()->rowCount(), 12);
    QCOMPARE(window.consensus()->model()->rowCount(), 160);
    // Consensus charts: per rank a line with one point per step, steps increasing, over the rows' dots;
    // the diversity one line with one point per step.
    for (QChartView* view : window.tabs()->widget(2)->findChildren<QChartView*>()) {
      const bool diversity = view->chart()->title().startsWith(QStringLiteral("Gradient diversity"));
      int lines = 0;
      qsizetype dots = 0;
      for (QAbstractSeries* series : view->chart()->series()) {
        if (auto* scatter = qobject_cast<QScatterSeries*>(series)) {
          dots += scatter->count();
          continue;
        }
        auto* line = qobject_cast<QLineSeries*>(series);
        QVERIFY(line != nullptr);
        ++lines;
        QCOMPARE(line->count(), 40);
        for (int i = 1; i < line->count(); ++i) QVERIFY(line->at(i).x() > line->at(i - 1).x());
      }
      QCOMPARE(lines, diversity ? 1 : 4);
      QCOMPARE(dots, qsizetype{160});
    }

    // Recommendation: the tuner ran, its sizes are listed, the exports work.
    window.tabs()->setCurrentIndex(3);
    QVERIFY(waitIdle(window));
    QVERIFY(window.recommendation()->result().has_value());
    QVERIFY(window.recommendation()->model()->rowCount() > 0);
    // Synchronous or asynchronous: the trace's steps replay (four ranks, a persistent straggler), so the
    // panel is shown with the three default async strategies, none of them measured or chosen.
    const tuner::Report& report = window.recommendation()->result()->report;
    QVERIFY(report.async.has_value());
    QVERIFY(report.async->why_not.empty());
    QVERIFY(report.async_choice.empty());
    QVERIFY(window.recommendation()->asyncPanel()->isVisible());
    QTableView* async_table = window.recommendation()->asyncTable();
    QVERIFY(async_table->isVisible());
    QCOMPARE(async_table->model()->rowCount(), 3);
    QStringList strategies;
    for (int row = 0; row < 3; ++row) {
      strategies << async_table->model()->index(row, AsyncOptionsModel::ColStrategy).data().toString();
      QCOMPARE(async_table->model()->index(row, AsyncOptionsModel::ColSamples).data().toString(),
               QStringLiteral("–"));
    }
    QCOMPARE(strategies, (QStringList{QStringLiteral("async/stale1"), QStringLiteral("async/dga1"),
                                      QStringLiteral("async/stale2")}));
    // Its rows all shown, and the sizes' table not squeezed by it.
    QVERIFY(async_table->height() > 3 * async_table->verticalHeader()->defaultSectionSize());
    for (const QTableView* table : window.recommendation()->findChildren<QTableView*>()) {
      if (table != async_table) QVERIFY(table->height() > 4 * table->verticalHeader()->defaultSectionSize());
    }
    for (const tuner::Format format : tuner::kFormats) {
      const QString path = dir_.filePath(QStringLiteral("export-%1").arg(static_cast<int>(format)));
      QCOMPARE(window.recommendation()->exportTo(format, path), QString());
      QVERIFY(QFile(path).size() > 0);
      QCOMPARE(QFile(path).permissions() & (QFileDevice::ReadGroup | QFileDevice::ReadOther),
               QFileDevice::Permissions());  // 0600, like every file gradscope writes
    }
    const QImage recommendation = window.tabs()->currentWidget()->grab().toImage();
    QVERIFY(colouredPixels(recommendation, recommendation.rect()) > 0 ||
            window.recommendation()->model()->rowCount() > 0);

    // Runs: the comparison with a slower trace finds the regression.
    window.compareWith(slow_);
    QVERIFY(waitIdle(window));
    QCOMPARE(window.tabs()->currentIndex(), 4);
    QVERIFY(window.runs()->model()->rowCount() > 0);
    QCOMPARE(
        window.runs()->model()->data(window.runs()->model()->index(0, CheckModel::ColVerdict)).toString(),
        QStringLiteral("improvement"));  // the open trace is faster than the "baseline" slow one
    QVERIFY(window.runs()->keysTable()->isVisibleTo(window.runs()));
    const QImage runs = window.runs()->grab().toImage();
    QVERIFY(colouredPixels(runs, runs.rect()) > 20);  // verdicts are coloured
  }

  // Two observe runs, no measurements: the Runs view shows the runs step by step, the step time first and
  // a regression, hides the empty measured keys' table and says why.
  void runsViewComparesTwoObservedRunsStepByStep() {
    QTemporaryDir dir;
    const gui::testing::ObservedRuns observed = gui::testing::writeObservedRuns(dir);
    MainWindow window;
    QVERIFY(showTrace(window, QString::fromStdString(observed.after)));
    window.compareWith(QString::fromStdString(observed.before));
    QVERIFY(waitIdle(window));
    RunsView* view = window.runs();
    QCOMPARE(window.tabs()->currentWidget(), view);
    QCOMPARE(view->model()->rowCount(), 0);
    QVERIFY(view->runsModel()->rowCount() >= 5);
    QCOMPARE(view->runsModel()->data(view->runsModel()->index(0, RunComparisonModel::ColFigure)).toString(),
             QStringLiteral("step time"));
    QCOMPARE(view->runsModel()->data(view->runsModel()->index(0, RunComparisonModel::ColVerdict)).toString(),
             QStringLiteral("regression"));
    QVERIFY(view->runsTable()->isVisibleTo(view));
    QVERIFY(!view->keysTable()->isVisibleTo(view));
    const QString summary = view->summary()->text();
    QVERIFY2(summary.contains(QStringLiteral("the runs were compared step by step")), qPrintable(summary));
    QVERIFY2(summary.contains(QStringLiteral("figures of the runs")), qPrintable(summary));
    QVERIFY2(summary.contains(QStringLiteral("gradscope check exits 1")), qPrintable(summary));
    QVERIFY(!summary.contains(QStringLiteral("measured keys")));
    // The table's first row is on screen, its verdict red.
    const QRect cell = view->runsTable()->visualRect(view->runsTable()->model()->index(0, 0));
    QVERIFY(!cell.isEmpty());
    const QImage table = view->runsTable()->viewport()->grab().toImage();
    QVERIFY(colouredPixels(table, cell) > 0);
  }

  // A heatmap cell of the Steps view opens the timeline on that rank's step (the calls filter's rank, shown
  // by the calls bar); a bar opens it on every rank.
  void aStepCellOpensTheTimelineOnItsRank() {
    MainWindow window;
    QVERIFY(showTrace(window, trace_));
    window.tabs()->setCurrentWidget(window.steps());
    QVERIFY(waitIdle(window));
    QTRY_VERIFY(!window.steps()->model()->breakdown().empty());
    const std::int64_t rank_id = window.steps()->model()->breakdown().ranks[2].rank_id;
    const TimeRange extent = window.state()->extent();
    const TimeRange step{extent.begin_ns + (extent.end_ns - extent.begin_ns) / 4,
                         extent.begin_ns + (extent.end_ns - extent.begin_ns) / 2};
    emit window.steps()->showOnTimeline(step, rank_id, 3);
    QCOMPARE(window.tabs()->currentIndex(), 0);
    QCOMPARE(window.state()->filter().rank_id, std::optional<std::int64_t>(rank_id));
    QCOMPARE(window.state()->window(), step);
    emit window.steps()->showOnTimeline(extent, -1, 3);
    QVERIFY(!window.state()->filter().rank_id.has_value());
  }

  void timelineAndTableShareTheSelection() {
    MainWindow window;
    QVERIFY(showTrace(window, trace_));
    TimelineWidget* timeline = window.timeline();
    QVERIFY(timeline->frame() && timeline->frame()->detailed);
    // Zoom to a short window, then click a bar: the table selects its row.
    const auto& all = timeline->frame()->calls.at(0);
    QVERIFY(!all.empty());
    const storage::CallRecord call = all[all.size() / 2];
    const double length = 20.0 * static_cast<double>(call.end_ns - call.start_ns) + 1e5;
    const double middle = static_cast<double>(call.start_ns + call.end_ns) / 2;
    window.state()->setWindow({middle - length / 2, middle + length / 2}, true);
    QVERIFY(waitIdle(window));
    const TimelineMath m = timeline->math();
    std::optional<QPoint> point;
    for (int y = timeline->plotRect().top(); y < timeline->plotRect().bottom() && !point; ++y) {
      const QPoint p(static_cast<int>(m.timeToX((static_cast<double>(call.start_ns + call.end_ns)) / 2)), y);
      const auto hit = timeline->callAt(p);
      if (hit && hit->id == call.id) point = p;
    }
    QVERIFY(point.has_value());
    QTest::mouseClick(timeline, Qt::LeftButton, {}, *point);
    QVERIFY(window.state()->selection().has_value());
    QCOMPARE(window.state()->selection()->id, call.id);
    QVERIFY(waitIdle(window));
    CallsModel* model = window.calls()->model();
    QTRY_VERIFY(model->rowOfCall(call.id) >= 0);
    QTRY_COMPARE(window.calls()->table()->currentIndex().row(), model->rowOfCall(call.id));
    // And the other way: selecting a row selects the call.
    const int other = model->rowOfCall(call.id) == 0 ? 1 : 0;
    window.calls()->table()->selectRow(other);
    QCOMPARE(window.state()->selection()->id, model->rowAt(other)->call.id);
  }

  // A pipeline job: its messages are matched once the trace opens; selecting a send draws its arrow to the
  // receive; the Communication tab paints the stages' traffic, by bytes and by time.
  void pointToPointViews() {
    gradscope::testing::SyntheticPipeline job;
    job.steps = 2;
    const QString path = dir_.filePath(QStringLiteral("pipeline.db"));
    gradscope::testing::writePipelineTrace(path.toStdString(), job);
    MainWindow window;
    QVERIFY(showTrace(window, path));
    const PeerFlows* flows = window.timeline()->flows();
    QVERIFY(flows != nullptr);
    // Per step and replica, (stages - 1) × microbatches messages each way.
    QCOMPARE(flows->all().size(), std::size_t{2 * 2 * 2 * 3 * 4});
    QCOMPARE(flows->unmatched(), std::int64_t{0});
    const PeerFlow& flow = flows->all()[flows->all().size() / 2];
    window.state()->setSelection(
        SelectedCall{flow.send_call_id, flow.send_rank_id, flow.send_start_ns, flow.send_end_ns});
    QVERIFY(waitIdle(window));
    const TimelineScene& scene = window.timeline()->scene();
    QCOMPARE(scene.arrows.size(), std::size_t{1});
    QCOMPARE(scene.arrows[0].recv_call_id, flow.recv_call_id);
    const QImage timeline = window.timeline()->grab().toImage();
    QVERIFY(timeline.pixelColor(scene.arrows[0].from).value() < 100);  // the arrow's dark line
    // The send's tooltip names its partner.
    const QPoint at(scene.arrows[0].from.x() - 1, scene.arrows[0].from.y());
    QHelpEvent help(QEvent::ToolTip, at, window.timeline()->mapToGlobal(at));
    QApplication::sendEvent(window.timeline(), &help);
    QVERIFY2(
        QToolTip::text().contains(
            QStringLiteral("sent to rank %1: received by call %2").arg(flow.to_rank).arg(flow.recv_call_id)),
        qPrintable(QToolTip::text()));

    window.tabs()->setCurrentWidget(window.communication());
    QVERIFY(waitIdle(window));
    CommMatrixModel* model = window.communication()->model();
    QCOMPARE(model->ranks(), 8);
    QVERIFY(model->value(0, 1) > 0);
    QCOMPARE(model->value(0, 2), 0.0);
    QCOMPARE(model->value(4, 5), model->value(0, 1));  // the second replica sends what the first does
    CommMatrixWidget* matrix = window.communication()->matrix();
    const QImage bytes = matrix->grab().toImage();
    QVERIFY(colouredPixels(bytes, matrix->scene().grid) > 1000);
    QCOMPARE(matrix->scene().cells.size(), std::size_t{12});  // each of the 6 links of a replica, both ways
    window.communication()->setMetric(MatrixMetric::Time);
    QCOMPARE(model->metric(), MatrixMetric::Time);
    QVERIFY(model->value(1, 0) > 0);
    QVERIFY(colouredPixels(matrix->grab().toImage(), matrix->scene().grid) > 1000);
  }

  void wheelZoomsAroundTheCursor() {
    MainWindow window;
    QVERIFY(showTrace(window, trace_));
    TimelineWidget* timeline = window.timeline();
    const QPoint at(timeline->plotRect().left() + timeline->plotRect().width() / 4,
                    timeline->plotRect().center().y());
    const double anchor = timeline->math().xToTime(at.x());
    const double before = window.state()->window().length();
    QWheelEvent wheel(at, timeline->mapToGlobal(at), {}, QPoint(0, 120), Qt::NoButton, Qt::NoModifier,
                      Qt::NoScrollPhase, false);
    QApplication::sendEvent(timeline, &wheel);
    QVERIFY(std::abs(window.state()->window().length() - before * 0.8) < 1);
    QVERIFY(std::abs(timeline->math().xToTime(at.x()) - anchor) < 2);
    QVERIFY(waitIdle(window));
    QVERIFY(timeline->hasFrame());
  }

  void liveModeFollowsAGrowingTrace() {
    const std::string path = dir_.filePath(QStringLiteral("live.db")).toStdString();
    storage::TraceWriter writer = storage::TraceWriter::create(path);
    storage::RunInfo run;
    run.uuid = "00000000-0000-4000-8000-0000000000bb";
    run.mode = "observe";
    run.backend = Backend::Mpi;
    run.world_size = 1;
    run.host = "node0";
    run.epoch_ns = 1'795'000'000'000'000'000;
    const std::int64_t run_id = writer.addRun(run);
    storage::RankInfo rank;
    rank.run_id = run_id;
    rank.host = "node0";
    const std::int64_t rank_id = writer.addRank(rank);
    storage::CommInfo comm;
    comm.rank_id = rank_id;
    comm.key = "world";
    comm.size = 1;
    const std::int64_t comm_id = writer.addComm(comm);
    std::vector<storage::CallRecord> calls = gradscope::testing::manyCalls(2000, rank_id, comm_id, 7);
    writer.appendCalls(std::span(calls).subspan(0, 1000));
    writer.commit();

    MainWindow window;
    window.show();
    window.followWhenOpened();
    window.openTrace(QString::fromStdString(path));
    QVERIFY(waitIdle(window));
    QVERIFY(window.live());
    QCOMPARE(window.trace()->calls, std::int64_t{1000});
    const double end_before = window.state()->extent().end_ns;
    writer.appendCalls(std::span(calls).subspan(1000));
    writer.commit();
    QTRY_COMPARE_WITH_TIMEOUT(window.trace()->calls, std::int64_t{2000}, 10000);
    QVERIFY(window.state()->extent().end_ns > end_before);
    // Showing everything before, so it still does: the window grew with the trace.
    QCOMPARE(window.state()->window(), window.state()->extent());
    window.setLive(false);
    QVERIFY(!window.live());
    writer.finish();
  }
};

QTEST_MAIN(MainWindowTest)
#include "main_window_test.moc"
