// Benchmarks behind the storage figures of docs/benchmarks.md: ingest rate and bytes per call row,
// window and zoomed-out queries on a 10,000,000-call file.

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/steps.h"
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

// Repetition statistics beside Google Benchmark's mean, median and stddev.
double minimum(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}
double maximum(const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
}

// Step detection (storage/steps.h), the pass merge runs over each rank without explicit steps.
// Input: a training loop: 2 setup calls, then steps of 40 all-reduces: 36 gradient buckets whose sizes
// repeat (12 identical layers of two equal buckets and a smaller one), loss, grad norm, metrics and an
// embedding remainder. The element counts of `calls` such calls:
std::vector<std::int64_t> trainingCounts(std::size_t calls) {
  std::vector<std::int64_t> step;
  for (int layer = 0; layer < 12; ++layer) step.insert(step.end(), {12'582'912, 12'582'912, 4'194'304});
  step.insert(step.end(), {1, 1, 1, 65'536});
  std::vector<std::int64_t> counts = {7, 8};  // setup
  while (counts.size() < calls) counts.insert(counts.end(), step.begin(), step.end());
  counts.resize(calls);
  return counts;
}

constexpr auto kTrainingApi = gradscope::Api::NcclAllReduce;
constexpr auto kTrainingDType = gradscope::DType::Bf16;

// Signatures are generated before timing; calls/s is items_per_second.
std::vector<std::uint64_t> trainingSignatures(std::size_t calls) {
  std::vector<std::uint64_t> signatures;
  for (const std::int64_t count : trainingCounts(calls))
    signatures.push_back(gradscope::storage::callSignature("world", kTrainingApi, kTrainingDType,
                                                           gradscope::ReduceOp::Sum, count));
  return signatures;
}

void BM_DetectSteps(benchmark::State& state) {
  const auto signatures = trainingSignatures(static_cast<std::size_t>(state.range(0)));
  std::int64_t steps = 0;
  for (auto _ : state) {
    const auto detected = gradscope::storage::detectSteps(signatures);
    steps = detected.back() + 1;
    benchmark::DoNotOptimize(detected.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.counters["steps"] = static_cast<double>(steps);
}
BENCHMARK(BM_DetectSteps)
    ->Arg(1'000'000)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ComputeStatistics("min", minimum)
    ->ComputeStatistics("max", maximum)
    ->ReportAggregatesOnly(true);

// The unfavourable case: no loop at all, four signatures in random order, so that every call tries its
// full kMaxCandidates periods and finds nothing (or short runs).
void BM_DetectStepsNoise(benchmark::State& state) {
  std::vector<std::uint64_t> signatures(static_cast<std::size_t>(state.range(0)));
  std::uint64_t random = 42;
  for (auto& signature : signatures) {
    random = random * 6364136223846793005ull + 1442695040888963407ull;
    signature = random >> 62;
  }
  for (auto _ : state) benchmark::DoNotOptimize(gradscope::storage::detectSteps(signatures).data());
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_DetectStepsNoise)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ComputeStatistics("min", minimum)
    ->ComputeStatistics("max", maximum)
    ->ReportAggregatesOnly(true);

// What detection adds to `gradscope merge`: 4 per-rank files of range(0) step-less training calls
// each (written once, kept for later runs like the 10 M-call file), merged with detection off
// (range(1) = 0) and on (1). calls/s is items_per_second over all ranks.
const std::vector<std::string>& steplessRankFiles(std::int64_t calls_per_rank) {
  static std::map<std::int64_t, std::vector<std::string>> files;
  auto [it, inserted] = files.try_emplace(calls_per_rank);
  if (!inserted) return it->second;
  const auto counts = trainingCounts(static_cast<std::size_t>(calls_per_rank));
  for (int rank = 0; rank < 4; ++rank) {
    const std::string path = scratchPath("gradscope-bench-stepless-" + std::to_string(calls_per_rank) + "-" +
                                         std::to_string(rank) + ".db");
    it->second.push_back(path);
    struct stat info {};
    if (::stat(path.c_str(), &info) == 0) continue;
    auto writer = gradscope::storage::TraceWriter::create(path);
    gradscope::storage::RunInfo run;
    run.uuid = "bench-steps";
    run.mode = "bench";
    const auto run_id = writer.addRun(run);
    const auto rank_id = writer.addRank({0, run_id, rank, "host", 1, "cpu", 0});
    const auto comm_id = writer.addComm({0, rank_id, "world", gradscope::Backend::Nccl, 4, rank});
    std::vector<gradscope::storage::CallRecord> calls(counts.size());
    for (std::size_t i = 0; i < calls.size(); ++i) {
      auto& call = calls[i];
      call.rank_id = rank_id;
      call.comm_id = comm_id;
      call.seq = static_cast<std::int64_t>(i);
      call.api = kTrainingApi;
      call.dtype = kTrainingDType;
      call.op = gradscope::ReduceOp::Sum;
      call.count = counts[i];
      call.bytes = 2 * counts[i];
      call.enqueue_ns = call.start_ns = 10'000 * static_cast<std::int64_t>(i);
      call.end_ns = call.start_ns + 5'000;
    }
    writer.appendCalls(calls);
    writer.finish(calls.back().end_ns);
  }
  return it->second;
}

void BM_MergeDetectSteps(benchmark::State& state) {
  const auto& inputs = steplessRankFiles(state.range(0));
  const std::string output = scratchPath("gradscope-bench-stepless-merged.db");
  gradscope::storage::MergeOptions options;
  options.detect_steps = state.range(1) != 0;
  options.overwrite = true;
  std::int64_t steps = 0;
  for (auto _ : state) steps = gradscope::storage::mergeTraces(inputs, output, options).steps_detected;
  removeTrace(output);
  state.SetItemsProcessed(state.iterations() * state.range(0) * 4);
  state.counters["steps"] = static_cast<double>(steps);
}
BENCHMARK(BM_MergeDetectSteps)
    ->ArgsProduct({{1'000'000}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->Repetitions(3)
    ->ComputeStatistics("min", minimum)
    ->ComputeStatistics("max", maximum)
    ->ReportAggregatesOnly(true);

}  // namespace

BENCHMARK_MAIN();
