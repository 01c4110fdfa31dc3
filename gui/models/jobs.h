#pragma once

// Background work for the viewer (hotspot's JobTracker): a job runs on the global thread pool, its
// result is delivered on the thread of the tracker's context object (the GUI thread) through a queued
// signal, and only the result of the newest job of a tracker is delivered; older ones are dropped as
// stale. Exceptions become an error text, so a corrupted file is a message, never a crash.
//
// Lifetime: the watcher is a child of the context; when the context goes away first, the job finishes
// on the pool and its result is discarded. ~QCoreApplication waits for the pool.

#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <QFutureWatcher>
#include <QObject>
#include <QString>
#include <QtConcurrent/QtConcurrentRun>

#include "gradscope/storage/reader.h"

namespace gradscope::gui {

template <class T>
struct Outcome {
  std::optional<T> value;
  QString error;  // set when value is not
};

// Jobs started by any tracker and not finished yet: tests and the screenshot mode wait for 0.
int jobsInFlight();
namespace detail {
void jobStarted();
void jobEnded();
}  // namespace detail

class JobTracker {
 public:
  explicit JobTracker(QObject* context) : context_(context) {}

  // Runs work() on the pool; done(outcome) runs on the context's thread unless a newer job was started
  // (or cancel() called) meanwhile.
  template <class T>
  void run(std::function<T()> work, std::function<void(Outcome<T>)> done) {
    const std::uint64_t generation = ++generation_;
    auto* watcher = new QFutureWatcher<Outcome<T>>(context_);
    detail::jobStarted();
    QObject::connect(watcher, &QObject::destroyed, [] { detail::jobEnded(); });
    QObject::connect(watcher, &QFutureWatcherBase::finished, context_,
                     [this, watcher, generation, done = std::move(done)] {
                       Outcome<T> outcome = watcher->result();
                       watcher->deleteLater();
                       if (generation != generation_) return;  // stale: a newer request superseded it
                       done(std::move(outcome));
                     });
    watcher->setFuture(QtConcurrent::run([work = std::move(work)]() -> Outcome<T> {
      Outcome<T> outcome;
      try {
        outcome.value = work();
      } catch (const std::exception& error) {
        outcome.error = QString::fromStdString(error.what());
      } catch (...) {
        outcome.error = QStringLiteral("unexpected error");
      }
      return outcome;
    }));
  }

  void cancel() { ++generation_; }
  std::uint64_t generation() const { return generation_; }

 private:
  QObject* context_;
  std::uint64_t generation_ = 0;
};

// The TraceReader of this pool thread for `path` (a reader is not thread-safe: one per thread), opened
// on first use and kept while the file is the same file (same device and inode). Throws gradscope::Error.
const storage::TraceReader& threadReader(const std::string& path);
// Forgets this thread's reader of `path` (after an error, so the next job reopens it).
void dropThreadReader(const std::string& path);

}  // namespace gradscope::gui

namespace gradscope::gui {
class ReadOnlyDatabase;
// The same for the viewer's own read-only SQLite connection (sql.h); only for files TraceReader opened.
ReadOnlyDatabase& threadDatabase(const std::string& path);
}  // namespace gradscope::gui
