#pragma once

// Traces for the viewer's tests, written with TraceWriter: a small explore-mode job with calls on four
// ranks over two hosts, measurements of three strategies, consensus rows and apply-mode rows, and the
// bad files the window must refuse with a message; and observe-mode jobs (steps, no measurements) for the
// comparison of two runs step by step.

#include <cstdint>
#include <string>

#include <QTemporaryDir>

namespace gradscope::gui::testing {

struct TraceOptions {
  int ranks = 4;
  int steps = 40;
  double slowdown = 1.0;  // factor on every measured time (a regression for the check)
  bool finish = true;     // false: the run has no end time (as while a job writes it)
};

// Runs `sql` on the SQLite file at `path`; throws std::runtime_error with SQLite's message.
void exec(const std::string& path, const std::string& sql);

// Writes the trace to `path` and returns it.
std::string writeTestTrace(const std::string& path, const TraceOptions& options = {});

// Two observe runs of a synthetic data-parallel job (tests/support/synthetic_trace.h, 40 steps, each
// rank written as the agent writes it, then merged), in `dir`: `before.db`, and `after.db` with twice the
// gradient bytes, so that its step time regresses. Returns {before, after}.
struct ObservedRuns {
  std::string before, after;
};
ObservedRuns writeObservedRuns(const QTemporaryDir& dir);

// Bad files, each in `dir`; the path returned.
std::string writeEmptyFile(const QTemporaryDir& dir);
std::string writeTextFile(const QTemporaryDir& dir);
std::string writeForeignSqlite(const QTemporaryDir& dir);
std::string writeTruncatedTrace(const QTemporaryDir& dir);
std::string writeNewerSchemaTrace(const QTemporaryDir& dir);

}  // namespace gradscope::gui::testing
