#pragma once

// Merging the per-rank files of a run into one file.

#include <cstdint>
#include <string>
#include <vector>

namespace gradscope::storage {

struct MergeOptions {
  bool allow_different_runs = false;  // merge files of different runs (each keeps its own run row)
  bool overwrite = false;             // replace an existing output file
};

struct MergeSummary {
  int files = 0;
  int runs = 0;
  int ranks = 0;
  std::int64_t calls = 0;
  std::int64_t measurements = 0;
};

// Expands the command line's inputs: a directory stands for the trace files (*.db) directly inside it,
// in name order; `exclude` (the output) is skipped. Throws when nothing is left.
std::vector<std::string> expandTraceInputs(const std::vector<std::string>& inputs,
                                           const std::string& exclude);

// Merges `inputs` into a new file `output`, keeping every row: calls, measurements, consensus,
// recommendations and drops, with ids remapped and each run's times rebased onto its earliest time
// origin. Refuses (before writing anything) files of different runs unless allowed, the same rank of
// a run in two files, and unreadable inputs. The output appears only when complete.
MergeSummary mergeTraces(const std::vector<std::string>& inputs, const std::string& output,
                         const MergeOptions& options);

}  // namespace gradscope::storage
