#include "gradscope/storage/trace_input.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "gradscope/common/error.h"

namespace gradscope::storage {

namespace {

// Removes the merged copy and whatever SQLite left beside it.
void removeMergedCopy(const std::string& file) {
  std::error_code ignored;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) std::filesystem::remove(file + suffix, ignored);
}

}  // namespace

TraceInput::TraceInput(const std::string& path, int jobs, MergeLink* link) : name_(path), file_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return;
  const std::vector<std::string> inputs = expandTraceInputs({path}, "");
  const fs::path directory = fs::temp_directory_path(ec);
  if (ec)
    fail("{}: no temporary directory to merge its rank files into ({}); set TMPDIR", path, ec.message());
  // Unique within this process (a counter) and among processes (the pid); mergeTraces refuses an
  // existing output, so a leftover of a killed process with the same pid is refused, not overwritten.
  static std::atomic<int> counter{0};
  file_ = (directory / fmt::format("gradscope-{}-{}.db", ::getpid(), counter++)).string();
  MergeOptions options;
  options.jobs = jobs;
  options.link = link;
  try {
    summary_ = mergeTraces(inputs, file_, options);
  } catch (...) {
    removeMergedCopy(file_);
    throw;
  }
  merged_ = true;
}

TraceInput::~TraceInput() {
  if (merged_) removeMergedCopy(file_);
}

}  // namespace gradscope::storage
