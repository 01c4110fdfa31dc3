// Benchmarks behind the storage figures of docs/benchmarks.md: ingest rate and bytes per call row,
// window and zoomed-out queries on a 10,000,000-call file.

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <benchmark/benchmark.h>

#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"

namespace {

std::string scratchPath(const std::string& name) {
  const char* dir = std::getenv("GRADSCOPE_BENCH_DIR");
  return (std::filesystem::path(dir ? dir : std::filesystem::temp_directory_path().string()) / name).string();
}

void removeTrace(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) std::remove((path + suffix).c_str());
}

// Ingest: call rows per second into one file from one writer thread (appendCalls in the agent
// flusher's batches, with its commits), and bytes per row on disk once finished (tiles and metadata
// included). Rows are generated before timing; the one-time create() and finish() (which syncs the
// file) are reported separately as finish_ms.
void BM_IngestCalls(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto calls = gradscope::testing::manyCalls(rows, 0, 1, 42);
  const std::string path = scratchPath("gradscope-bench-ingest.db");
  double bytes_per_row = 0, finish_ms = 0;
  for (auto _ : state) {
    removeTrace(path);
    auto writer = gradscope::storage::TraceWriter::create(path);
    gradscope::storage::RunInfo run;
    run.uuid = "bench";
    run.mode = "bench";
    const auto run_id = writer.addRun(run);
    writer.addRank({0, run_id, 0, "host", 1, "cpu", 0});
    writer.addComm({0, 0, "world", gradscope::Backend::Mpi, 1, 0});
    writer.commit();
    const auto begin = std::chrono::steady_clock::now();
    constexpr std::size_t kBatch = 1 << 16;  // what the agent's flusher hands over at a time
    for (std::size_t i = 0; i < calls.size(); i += kBatch)
      writer.appendCalls(std::span(calls).subspan(i, std::min(kBatch, calls.size() - i)));
    writer.commit();
    const auto appended = std::chrono::steady_clock::now();
    writer.finish(calls.back().end_ns);
    const auto finished = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(appended - begin).count());
    finish_ms = std::chrono::duration<double, std::milli>(finished - appended).count();
    struct stat info {};
    ::stat(path.c_str(), &info);
    bytes_per_row = static_cast<double>(info.st_size) / static_cast<double>(rows);
  }
  removeTrace(path);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(rows));
  state.counters["bytes_per_row"] = bytes_per_row;
  state.counters["finish_ms"] = finish_ms;
}
BENCHMARK(BM_IngestCalls)
    ->Arg(1'000'000)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->Repetitions(3)
    ->UseManualTime();

// A 10,000,000-call file over 4 ranks, created once.
const std::string& largeTrace() {
  static const std::string path = [] {
    const std::string p = scratchPath("gradscope-bench-10m.db");
    struct stat info {};
    if (::stat(p.c_str(), &info) != 0) gradscope::testing::writeLargeTrace(p, 10'000'000, 4, 7);
    return p;
  }();
  return path;
}

// Calls of one rank in a window of `range(0)` microseconds in the middle of the trace (what the
// timeline asks for when zoomed in).
void BM_CallsInWindow(benchmark::State& state) {
  const auto reader = gradscope::storage::TraceReader::open(largeTrace());
  const auto extent = reader.timeExtent();
  const std::int64_t width = state.range(0) * 1000;
  const std::int64_t middle = (extent.begin_ns + extent.end_ns) / 2;
  std::size_t rows = 0;
  for (auto _ : state) {
    const auto calls = reader.callsInWindow(2, middle, middle + width);
    rows = calls.size();
    benchmark::DoNotOptimize(calls.data());
  }
  state.counters["calls"] = static_cast<double>(rows);
}
BENCHMARK(BM_CallsInWindow)->Arg(1'000)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond);

// The zoomed-out timeline of the whole file at 2000 columns (a full-screen view).
void BM_WholeFileTimeline(benchmark::State& state) {
  const auto reader = gradscope::storage::TraceReader::open(largeTrace());
  const auto extent = reader.timeExtent();
  for (auto _ : state) {
    const auto summary = reader.timeline(extent.begin_ns, extent.end_ns, static_cast<int>(state.range(0)));
    benchmark::DoNotOptimize(summary.buckets.data());
  }
}
BENCHMARK(BM_WholeFileTimeline)->Arg(2000)->Unit(benchmark::kMillisecond);

// Open + extent: what the GUI does before its first frame.
void BM_OpenAndExtent(benchmark::State& state) {
  for (auto _ : state) {
    const auto reader = gradscope::storage::TraceReader::open(largeTrace());
    benchmark::DoNotOptimize(reader.timeExtent());
  }
}
BENCHMARK(BM_OpenAndExtent)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
