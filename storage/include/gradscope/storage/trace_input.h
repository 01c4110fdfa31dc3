#pragma once

// A trace named on a command line or in the viewer: a trace file, or a run's directory of rank files.

#include <string>

#include "gradscope/storage/merge.h"

namespace gradscope::storage {

// What `gradscope report`, `recommend`, `export` and the viewer read. A file is read as it is. A directory
// stands for its rank files (expandTraceInputs: the *.db directly inside it); they are merged
// (mergeTraces with step detection, read on `jobs` threads, the memory bounds merge.h gives) into a
// temporary file under the system's temporary directory (TMPDIR), which this object removes. The merged
// copy takes about the disk space of the rank files together; `gradscope merge` keeps one instead.
// Refuses, before writing anything, what mergeTraces refuses (files of several runs, a rank twice,
// unreadable files) and a directory without trace files, naming the directory. With `link`, the rank
// files are read across its processes (merge.h MergeLink; this one is process 0) and merged here.
class TraceInput {
 public:
  explicit TraceInput(const std::string& path, int jobs = 0, MergeLink* link = nullptr);
  ~TraceInput();
  TraceInput(const TraceInput&) = delete;
  TraceInput& operator=(const TraceInput&) = delete;

  const std::string& file() const { return file_; }  // the file to open
  const std::string& name() const { return name_; }  // what the user named: the file, or the directory
  bool merged() const { return merged_; }
  const MergeSummary& summary() const { return summary_; }  // of the merge; zero for a file

 private:
  std::string name_, file_;
  bool merged_ = false;
  MergeSummary summary_;
};

}  // namespace gradscope::storage
