// gradscope-gui [FILE]: the desktop viewer (docs/gui.md). Parses the command line and shows the window;
// --screenshots renders every view to PNG files and exits (scripts/screenshots.sh).

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include <QApplication>
#include <QCommandLineParser>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QScrollArea>
#include <QTabWidget>
#include <QTextStream>

#include "gradscope/common/error.h"
#include "gradscope/storage/trace_input.h"
#include "widgets/comm_matrix_view.h"
#include "widgets/main_window.h"
#include "widgets/recommendation_view.h"
#include "widgets/timeline_widget.h"

namespace {

using gradscope::gui::MainWindow;

// Lets the event loop run until the window has no background work left; false after `timeout_ms`.
bool waitIdle(MainWindow& window, int timeout_ms) {
  QElapsedTimer timer;
  timer.start();
  // A job may be scheduled one event-loop turn after the change that asks for it: idle twice in a row.
  int idle_turns = 0;
  while (timer.elapsed() < timeout_ms) {
    QApplication::processEvents(QEventLoop::AllEvents, 20);
    idle_turns = window.busy() ? 0 : idle_turns + 1;
    if (idle_turns >= 3) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool save(MainWindow& window, const QString& directory, const QString& name) {
  waitIdle(window, 60000);
  const QString path = QDir(directory).filePath(name + QStringLiteral(".png"));
  if (!window.grab().save(path)) {
    QTextStream(stderr) << "gradscope-gui: cannot write " << path << "\n";
    return false;
  }
  QTextStream(stdout) << "wrote " << path << "\n";
  return true;
}

bool saveMessage(MainWindow& window, const gradscope::gui::PeerFlows& flows, const QString& directory) {
  std::vector<const gradscope::gui::PeerFlow*> by_time;
  for (const gradscope::gui::PeerFlow& flow : flows.all()) by_time.push_back(&flow);
  std::sort(by_time.begin(), by_time.end(),
            [](const auto* a, const auto* b) { return a->send_end_ns < b->send_end_ns; });
  const gradscope::gui::TimeRange extent = window.state()->extent();
  const double middle = (extent.begin_ns + extent.end_ns) / 2;
  const auto chosen =
      std::lower_bound(by_time.begin(), by_time.end(), middle,
                       [](const auto* flow, double t) { return static_cast<double>(flow->send_end_ns) < t; });
  const std::size_t at =
      std::min<std::size_t>(static_cast<std::size_t>(chosen - by_time.begin()), by_time.size() - 1);
  constexpr std::size_t kContext = 12;
  const gradscope::gui::PeerFlow& flow = *by_time[at];
  const auto first = static_cast<double>(by_time[at >= kContext ? at - kContext : 0]->send_end_ns);
  const auto last = static_cast<double>(by_time[std::min(at + kContext, by_time.size() - 1)]->send_end_ns);
  const double margin = std::max((last - first) / 10, 1e5);
  window.state()->setWindow({std::min(first, static_cast<double>(flow.send_start_ns)) - margin,
                             std::max(last, static_cast<double>(flow.recv_end_ns)) + margin},
                            true);
  window.state()->setSelection(gradscope::gui::SelectedCall{flow.send_call_id, flow.send_rank_id,
                                                            flow.send_start_ns, flow.send_end_ns});
  return save(window, directory, QStringLiteral("timeline-message"));
}

int screenshots(MainWindow& window, const QString& directory, const QString& compare) {
  QDir().mkpath(directory);
  window.show();
  if (!waitIdle(window, 120000)) {
    QTextStream(stderr) << "gradscope-gui: the trace did not load within 2 minutes\n";
    return 1;
  }
  if (window.showingError()) {
    QTextStream(stderr) << "gradscope-gui: " << window.errorText() << "\n";
    return 1;
  }
  if (!compare.isEmpty()) window.compareWith(compare);
  bool ok = true;
  // The point-to-point views only for a trace that has point-to-point calls (docs/gui.md shows a pipeline
  // job's; the sample job's all-reduces would replace them with an empty matrix).
  const bool point_to_point = !window.communication()->model()->empty();
  for (const auto& [name, index] : window.views()) {
    if (window.tabs()->widget(index) == window.communication() && !point_to_point) continue;
    window.tabs()->setCurrentIndex(index);
    ok = save(window, directory, name) && ok;
  }
  // The recommendation with semantic changes allowed, when the trace's steps could be replayed: the
  // synchronous-or-asynchronous panel, and an async strategy chosen where explore measured its error.
  if (window.recommendation()->asyncPanel()->isVisibleTo(window.recommendation())) {
    window.tabs()->setCurrentWidget(window.recommendation());
    window.recommendation()->setAllowSemanticChange(true);
    window.recommendation()->recommend();
    ok = save(window, directory, QStringLiteral("recommendation-async")) && ok;
    window.recommendation()->setAllowSemanticChange(false);
  }
  // The communication matrix by time as well.
  if (point_to_point) {
    window.tabs()->setCurrentWidget(window.communication());
    window.communication()->setMetric(gradscope::gui::MatrixMetric::Time);
    ok = save(window, directory, QStringLiteral("communication-time")) && ok;
    window.communication()->setMetric(gradscope::gui::MatrixMetric::Bytes);
  }
  // The timeline zoomed in on a few steps in the middle of the run: single calls and their bars.
  window.tabs()->setCurrentIndex(0);
  const gradscope::gui::TimeRange extent = window.state()->extent();
  if (!extent.empty()) {
    const double middle = (extent.begin_ns + extent.end_ns) / 2;
    const double length = std::max(extent.length() / 200, 2e5);
    window.state()->setWindow({middle, middle + length}, true);
    ok = save(window, directory, QStringLiteral("timeline-zoomed")) && ok;
  }
  // A point-to-point message, when the trace has any: the send nearest the middle of the run selected, its
  // arrow in a window of about two dozen messages around it.
  if (const gradscope::gui::PeerFlows* flows = window.timeline()->flows();
      flows != nullptr && !flows->empty()) {
    ok = saveMessage(window, *flows, directory) && ok;
  }
  // What a file the viewer cannot read looks like.
  const QString bad = QDir(directory).filePath(QStringLiteral(".not-a-trace.db"));
  {
    QFile file(bad);
    if (file.open(QIODevice::WriteOnly)) file.write("this is not a SQLite database, just some text\n");
  }
  window.openTrace(bad);
  ok = save(window, directory, QStringLiteral("error")) && ok;
  QFile::remove(bad);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("gradscope-gui"));
  QApplication::setOrganizationName(QStringLiteral("gradscope"));
  QApplication::setApplicationVersion(QStringLiteral(GRADSCOPE_VERSION));

  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral("gradscope's trace viewer"));
  parser.addHelpOption();
  parser.addVersionOption();
  parser.addPositionalArgument(QStringLiteral("FILE"), QStringLiteral("trace to open"),
                               QStringLiteral("[FILE]"));
  const QCommandLineOption live(QStringLiteral("live"),
                                QStringLiteral("Follow the trace while a job writes it"));
  const QCommandLineOption compare(QStringLiteral("compare"),
                                   QStringLiteral("Compare FILE with this baseline trace (the Runs view)"),
                                   QStringLiteral("BASELINE"));
  const QCommandLineOption shots(QStringLiteral("screenshots"),
                                 QStringLiteral("Render every view of FILE to DIR/<view>.png and exit"),
                                 QStringLiteral("DIR"));
  const QCommandLineOption size(QStringLiteral("size"), QStringLiteral("Window size, WIDTHxHEIGHT"),
                                QStringLiteral("SIZE"), QStringLiteral("1400x900"));
  parser.addOptions({live, compare, shots, size});
  parser.process(app);

  MainWindow window;
  const QStringList dimensions = parser.value(size).split(QLatin1Char('x'));
  if (dimensions.size() == 2 && dimensions[0].toInt() > 0 && dimensions[1].toInt() > 0) {
    window.resize(dimensions[0].toInt(), dimensions[1].toInt());
  }
  const QStringList files = parser.positionalArguments();
  // A run's directory of rank files: merged into a temporary copy, opened, removed when the viewer exits
  // (storage/trace_input.h). It is read once: there is no file for --live to follow.
  std::optional<gradscope::storage::TraceInput> merged;
  if (!files.isEmpty() && QFileInfo(files.first()).isDir()) {
    if (parser.isSet(live)) {
      QTextStream(stderr) << "gradscope-gui: --live follows one trace file, not a directory of rank files; "
                             "name the file a rank is writing\n";
      return 2;
    }
    QTextStream(stderr) << "gradscope-gui: merging the rank files of " << files.first() << "\n";
    try {
      merged.emplace(files.first().toStdString());
    } catch (const gradscope::Error& error) {
      QTextStream(stderr) << "gradscope-gui: " << error.what() << "\n";
      return 2;
    }
  }
  // The trace to open, and what the window calls it: a directory by its own name, not its merged copy's.
  const auto open = [&] {
    if (merged)
      window.openTrace(QString::fromStdString(merged->file()), QFileInfo(files.first()).absoluteFilePath());
    else window.openTrace(files.first());
  };
  if (parser.isSet(shots)) {
    if (files.isEmpty()) {
      QTextStream(stderr) << "gradscope-gui: --screenshots needs a FILE\n";
      return 2;
    }
    open();
    return screenshots(window, parser.value(shots), parser.value(compare));
  }
  if (parser.isSet(compare)) window.compareWhenOpened(parser.value(compare));
  if (parser.isSet(live)) window.followWhenOpened();
  if (!files.isEmpty()) open();
  window.show();
  return QApplication::exec();
}
