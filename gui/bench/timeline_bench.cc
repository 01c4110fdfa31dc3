// gradscope_gui_bench FILE [REPS]: the timeline figures of docs/gui.md, offscreen.
//
//   open → first frame   reading the trace's summary on the pool (as the window does), the first
//                        aggregated frame of the whole trace, and its paint into an image
//   pan / zoom repaint   paintEvent right after the window moved: the last frame re-mapped onto the new
//                        window (what the user sees while the next frame loads)
//   pan / zoom frame     the next frame's query on the pool, until it is delivered to the widget
//   detailed repaint     paint of a window of single calls (≤ kDetailCallLimit calls)
// Each figure is measured REPS times (default 30) and reported as min / median / max; the paint
// happens into a QImage of the widget's size (1400 × 700), antialiasing off as in the window.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <QApplication>
#include <QElapsedTimer>
#include <QImage>
#include <QtConcurrent/QtConcurrentRun>

#include "models/jobs.h"
#include "models/trace_data.h"
#include "widgets/timeline_widget.h"

namespace {

using gradscope::gui::TimeRange;
using Clock = std::chrono::steady_clock;

double millisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void report(const char* what, std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const double median = samples[samples.size() / 2];
  std::printf("%-34s %9.2f %9.2f %9.2f   (n=%zu)\n", what, samples.front(), median, samples.back(),
              samples.size());
}

// Processes events until the widget has received a frame after the first `frames_before`.
bool waitFrame(gradscope::gui::TimelineWidget& widget, std::uint64_t frames_before) {
  QElapsedTimer timer;
  timer.start();
  while (timer.elapsed() < 60000) {
    QApplication::processEvents(QEventLoop::AllEvents, 5);
    if (widget.frameCount() > frames_before) return true;
  }
  return false;
}

double paint(gradscope::gui::TimelineWidget& widget, QImage& image) {
  const auto start = Clock::now();
  widget.render(&image);
  return millisecondsSince(start);
}

}  // namespace

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: gradscope_gui_bench FILE [REPS]\n");
    return 2;
  }
  const std::string path = argv[1];
  const int reps = argc > 2 ? std::max(3, std::atoi(argv[2])) : 30;

  gradscope::gui::ViewState state;
  gradscope::gui::TimelineWidget widget(&state);
  widget.resize(1400, 700);
  QImage image(widget.size(), QImage::Format_ARGB32_Premultiplied);

  const auto open_start = Clock::now();
  gradscope::gui::TraceInfo info;
  try {
    info = QtConcurrent::run([&path] {
             return gradscope::gui::loadTraceInfo(gradscope::gui::threadReader(path));
           }).result();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gradscope_gui_bench: %s\n", error.what());
    return 1;
  }
  const double info_ms = millisecondsSince(open_start);
  state.setExtent(info.extent);
  widget.setTrace(info);
  if (!waitFrame(widget, 0)) {
    std::fprintf(stderr, "gradscope_gui_bench: no frame within 60 s\n");
    return 1;
  }
  paint(widget, image);
  const double first_frame_ms = millisecondsSince(open_start);
  std::printf("trace: %s, %lld calls, %zu ranks, %.3f s of run time\n", path.c_str(),
              static_cast<long long>(info.calls), info.ranks.size(), info.extent.length() / 1e9);
  std::printf("%-34s %9s %9s %9s\n", "figure (ms)", "min", "median", "max");
  std::printf("%-34s %9.2f\n", "open: summary read", info_ms);
  std::printf("%-34s %9.2f\n", "open: first frame painted", first_frame_ms);

  // Zoom: from the whole trace in by 0.8 per step around the middle (a wheel notch each).
  std::vector<double> zoom_paint, zoom_frame;
  for (int i = 0; i < reps; ++i) {
    const TimeRange w = state.window();
    state.setWindow(gradscope::gui::zoomAround(w, (w.begin_ns + w.end_ns) / 2, 0.8, state.extent()));
    const std::uint64_t frames = widget.frameCount();
    zoom_paint.push_back(paint(widget, image));
    const auto start = Clock::now();
    waitFrame(widget, frames);
    zoom_frame.push_back(millisecondsSince(start));
  }
  // Pan: 5% of the window per step (a mouse drag), at the zoom reached above.
  std::vector<double> pan_paint, pan_frame;
  for (int i = 0; i < reps; ++i) {
    const TimeRange w = state.window();
    const double direction = (i / 10) % 2 == 0 ? 1 : -1;
    state.setWindow(gradscope::gui::panBy(w, direction * 0.05 * w.length(), state.extent()));
    const std::uint64_t frames = widget.frameCount();
    pan_paint.push_back(paint(widget, image));
    const auto start = Clock::now();
    waitFrame(widget, frames);
    pan_frame.push_back(millisecondsSince(start));
  }
  report("zoom repaint (last frame)", zoom_paint);
  report("zoom: next frame loaded", zoom_frame);
  report("pan repaint (last frame)", pan_paint);
  report("pan: next frame loaded", pan_frame);

  // Zoom in until single calls are drawn, then time their repaint while panning.
  for (int i = 0; i < 200 && !(widget.frame() && widget.frame()->detailed); ++i) {
    const TimeRange w = state.window();
    const std::uint64_t frames = widget.frameCount();
    state.setWindow(gradscope::gui::zoomAround(w, (w.begin_ns + w.end_ns) / 2, 0.5, state.extent()));
    waitFrame(widget, frames);
  }
  if (widget.frame() && widget.frame()->detailed) {
    std::vector<double> detailed;
    for (int i = 0; i < reps; ++i) {
      const TimeRange w = state.window();
      const std::uint64_t frames = widget.frameCount();
      state.setWindow(
          gradscope::gui::panBy(w, ((i / 10) % 2 == 0 ? 0.05 : -0.05) * w.length(), state.extent()));
      waitFrame(widget, frames);
      detailed.push_back(paint(widget, image));
    }
    std::printf("detailed window: %lld calls\n", static_cast<long long>(widget.frame()->window_calls));
    report("detailed repaint", detailed);
  }
  return 0;
}
