// libFuzzer target for trace files (storage/reader.h): any bytes, written to a file and opened with
// TraceReader::open, then queried the way gradscope report, recommend, check and the viewer query a
// trace, give results or a gradscope::Error, never a crash, a sanitizer report, another exception or a
// hang. Run: scripts/fuzz.sh 60 trace_reader (docs/reliability.md).
//
// The file lives in /dev/shm when there is one (no disk writes per input), named after the process so
// that fuzzers running side by side do not share it; SQLite's -wal, -shm and -journal files go with it.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gradscope/common/error.h"
#include "gradscope/storage/reader.h"

namespace {

using gradscope::storage::TraceReader;

const std::string& tracePath() {
  static const std::string path = [] {
    const std::filesystem::path directory = std::filesystem::is_directory("/dev/shm")
                                                ? std::filesystem::path("/dev/shm")
                                                : std::filesystem::temp_directory_path();
    return (directory / ("gradscope-fuzz-trace-" + std::to_string(::getpid()) + ".db")).string();
  }();
  return path;
}

void removeTrace() {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) std::remove((tracePath() + suffix).c_str());
}

bool writeTrace(const std::uint8_t* data, std::size_t size) {
  removeTrace();
  std::FILE* file = std::fopen(tracePath().c_str(), "wb");
  if (file == nullptr) return false;
  const bool written = std::fwrite(data, 1, size, file) == size;
  return std::fclose(file) == 0 && written;
}

void query(const TraceReader& reader) {
  reader.runs();
  reader.comms();
  reader.callCount();
  const auto ranks = reader.ranks();
  const auto extent = reader.timeExtent();
  // The viewer's first view (the whole trace over a window's width) and one zoomed in on its start.
  reader.timeline(extent.begin_ns, extent.end_ns, 640);
  for (const auto& rank : ranks) reader.callsInWindow(rank.id, extent.begin_ns, extent.end_ns, 1000);
  reader.callWindow(extent.begin_ns, extent.end_ns).sqlCondition("c");  // the calls table's window
  reader.callStatistics(10);
  reader.lateness();
  reader.measurements();
  reader.consensus();
  reader.appliedCalls();
  reader.appliedSummary();
  reader.recommendations();
  reader.reductionCounts();
  reader.steps();
  reader.exposure();
  reader.stepCalls();
  reader.drops();
  std::size_t visited = 0;
  reader.forEachCall([&](const auto&) { return ++visited < 1000; });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!writeTrace(data, size)) {
    std::fprintf(stderr, "trace_reader fuzz: cannot write %s\n", tracePath().c_str());
    std::abort();
  }
  try {
    query(TraceReader::open(tracePath()));
  } catch (const gradscope::Error&) {
    // Refused, at open or in a query: the expected outcome for most inputs.
  }
  removeTrace();
  return 0;
}
