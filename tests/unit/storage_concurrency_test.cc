// storage/: readers while the writer writes (the GUI's live view, `gradscope report` on a running job).
// One writer thread appends calls in batches and commits often; three reader threads keep opening the
// file and querying it. Readers must never fail, must see every commit made before their query, never
// see the count go down, and at the end see exactly what was written.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using test::TempDir;

TEST(StorageConcurrency, ReadersFollowAGrowingTraceWithoutErrors) {
  TempDir dir;
  const std::string path = dir.file("live.db");
  constexpr int kBatches = 120;
  constexpr std::size_t kBatchSize = 100;
  constexpr int kReaders = 3;
  const std::vector<CallRecord> calls = testing::manyCalls(kBatches * kBatchSize, 0, 1, 3);
  const std::int64_t total = static_cast<std::int64_t>(calls.size());
  const std::int64_t end_of_data = calls.back().end_ns + 1;

  TraceWriter writer = TraceWriter::create(path, TraceWriter::Options{/*commit_rows=*/250});
  RunInfo run;
  run.uuid = "live";
  writer.addRun(run);
  writer.addRank({0, 1, 0, "h", 1, "cpu", 0});
  writer.addComm({0, 0, "world", Backend::Mpi, 1, 0});
  writer.commit();  // readers can open the file from here on

  std::atomic<std::int64_t> committed{0};  // calls committed so far (published after each commit)
  std::atomic<bool> done{false};
  std::mutex mutex;
  std::vector<std::string> errors;
  const auto report = [&](std::string message) {
    const std::lock_guard lock(mutex);
    if (errors.size() < 20) errors.push_back(std::move(message));
  };

  std::thread writer_thread([&] {
    try {
      std::int64_t written = 0;
      for (int b = 0; b < kBatches; ++b) {
        writer.appendCalls(std::span(calls).subspan(static_cast<std::size_t>(b) * kBatchSize, kBatchSize));
        written += static_cast<std::int64_t>(kBatchSize);
        if (b % 4 == 3) {  // besides the automatic commits every 250 rows
          writer.commit();
          committed.store(written);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(12));
      }
      writer.finish();
      committed.store(written);
    } catch (const std::exception& error) {
      report(std::string("writer: ") + error.what());
    }
    done.store(true);
  });

  std::vector<int> iterations(kReaders, 0);  // passes begun while the writer was still writing
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      std::int64_t last = 0;
      bool final_pass = false;
      while (!final_pass) {
        final_pass = done.load();
        try {
          const std::int64_t floor = committed.load();
          const TraceReader reader = TraceReader::open(path);
          const std::int64_t count = reader.callCount();
          if (count < last) report(fmt::format("reader {}: count went down from {} to {}", r, last, count));
          if (count < floor)
            report(fmt::format("reader {}: saw {} calls after {} were committed", r, count, floor));
          if (count > total) report(fmt::format("reader {}: saw {} calls of {}", r, count, total));
          last = count;
          const auto window = reader.callsInWindow(0, 0, end_of_data);
          const auto summary = reader.timeline(0, end_of_data, 64);
          std::int64_t in_timeline = 0;
          for (const auto& row : summary.buckets)
            for (const TimelineBucket& bucket : row) in_timeline += bucket.calls;
          const std::int64_t after = reader.callCount();
          if (static_cast<std::int64_t>(window.size()) > after || in_timeline > after)
            report(fmt::format("reader {}: window {} / timeline {} calls, more than the {} committed", r,
                               window.size(), in_timeline, after));
          if (!std::is_sorted(window.begin(), window.end(), [](const CallRecord& a, const CallRecord& b) {
                return a.start_ns < b.start_ns;
              }))
            report(fmt::format("reader {}: callsInWindow not ordered by start", r));
          if (final_pass &&
              (count != total || static_cast<std::int64_t>(window.size()) != total || in_timeline != total))
            report(fmt::format(
                "reader {}: after the writer finished: count {}, window {}, timeline {}; expected {}", r,
                count, window.size(), in_timeline, total));
        } catch (const std::exception& error) {
          report(fmt::format("reader {}: {}", r, error.what()));
        }
        if (!final_pass) ++iterations[static_cast<std::size_t>(r)];
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  }
  writer_thread.join();
  for (std::thread& reader : readers) reader.join();

  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  // Each reader read the trace while it was being written, several times: a pass takes ~0.5 s of a ~5 s write
  // under TSan on a loaded 2-core machine (10 passes in all were seen there), so 3 leaves room for load.
  for (int r = 0; r < kReaders; ++r) EXPECT_GE(iterations[static_cast<std::size_t>(r)], 3) << "reader " << r;

  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.callCount(), total);
  EXPECT_EQ(static_cast<std::int64_t>(reader.callsInWindow(0, 0, end_of_data).size()), total);
  std::int64_t id = 1;
  bool in_order = true;
  reader.forEachCall([&](const CallRecord& call) {
    in_order = in_order && call.id == id++ && call.seq == call.id - 1;
    return true;
  });
  EXPECT_TRUE(in_order);
  EXPECT_EQ(reader.timeExtent().end_ns, calls.back().end_ns);
}

TEST(StorageConcurrency, ReadersInManyThreadsOfAFinishedTrace) {
  // A reader is not thread-safe, but one reader per thread over the same file is the supported use.
  TempDir dir;
  const std::string path = dir.file("large.db");
  testing::writeLargeTrace(path, 20'000, 2, 9);
  const std::int64_t expected = 20'000;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      try {
        const TraceReader reader = TraceReader::open(path);
        for (int i = 0; i < 5; ++i) {
          if (reader.callCount() != expected) ++failures;
          const TimeExtent extent = reader.timeExtent();
          const auto stats = reader.callStatistics(5);
          std::int64_t calls = 0;
          for (const RankSummary& rank : stats.ranks) calls += rank.calls;
          if (calls != expected) ++failures;
          if (reader.callsInWindow(t % 2, extent.begin_ns, extent.end_ns + 1).size() != 10'000u) ++failures;
        }
      } catch (const std::exception&) {
        ++failures;
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace gradscope::storage
