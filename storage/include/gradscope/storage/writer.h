#pragma once

// TraceWriter: the one writer of a trace file.
//
// Contract:
// - create() makes a new file (mode 0600, never overwriting an existing one) with the current schema,
//   in WAL mode so readers (the GUI's live view, `gradscope report`) can read while it is written.
// - Rows are written in batched transactions with prepared statements: append*() adds to the open
//   transaction; commit() makes everything so far visible to readers and durable against a crash of the
//   process; a transaction is also committed automatically every Options::commit_rows call rows.
// - Not thread-safe: use it from one thread at a time. It holds no thread-affine state, so it may be
//   created on one thread and handed to a background thread that does all the writing.
// - finish() records the end of the run, commits, prunes useless tile levels and checkpoints the WAL
//   into the main file. A writer destroyed without finish() commits what it has (the file stays valid;
//   runs.end_ns stays NULL, which readers report as "incomplete").
// - Every failure throws gradscope::Error with a one-line message naming the file.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gradscope/storage/records.h"

namespace gradscope::storage {

class TraceWriter {
 public:
  struct Options {
    std::int64_t commit_rows = 1 << 18;  // auto-commit after this many call rows (bounds the WAL)
  };

  // Creates `path`; fails if it exists, if its directory does not, or if it cannot be written.
  static TraceWriter create(const std::string& path, Options options);
  static TraceWriter create(const std::string& path) { return create(path, Options{}); }

  TraceWriter(TraceWriter&&) noexcept;
  TraceWriter& operator=(TraceWriter&&) noexcept;
  ~TraceWriter();

  // Metadata. add*() return the new row's file-local id.
  std::int64_t addRun(const RunInfo& run);
  void setRunEnd(std::int64_t run_id, std::int64_t end_ns);
  // Replaces the run's configuration JSON (the agent adds its own statistics when it finishes).
  void setRunConfig(std::int64_t run_id, const std::string& config_json);
  // Uses rank.id when non-zero, else `rank.rank` when that id is free, else the next free id.
  std::int64_t addRank(const RankInfo& rank);
  void setClockOffset(std::int64_t rank_id, std::int64_t offset_ns);
  std::int64_t addComm(const CommInfo& comm);

  // Appends calls. Calls with id 0 get consecutive ids; explicit ids must increase. Returns the id of the
  // first call (0 for an empty span).
  std::int64_t appendCalls(std::span<const CallRecord> calls);
  // Fills the NCCL facts of a call already written (from the profiler plugin, which reports later).
  void setNcclInfo(std::int64_t call_id, int algo, int proto, int channels);

  std::int64_t addMeasurement(const Measurement& measurement);
  void appendConsensus(std::span<const ConsensusRecord> rows);
  // Records calls that apply mode replaced; a call can be recorded once (a second row for it throws).
  void appendApplied(std::span<const AppliedCall> rows);
  std::int64_t addRecommendation(const RecommendationRecord& recommendation);
  // The step model's rows (merge writes them once the calls are in; a (rank, step) appears once).
  void appendSteps(std::span<const StepRecord> rows);
  // The step model's exposure per kind of collective (merge writes it with the steps).
  void appendExposure(std::span<const CallExposure> rows);
  // The calls' time per step and kind (merge writes it with the steps).
  void appendStepCalls(std::span<const StepCallTime> rows);
  // The reductions by kind and their totals (merge writes them once; TraceReader::reductionCounts then
  // reads them instead of counting the calls).
  void setReductionCounts(std::span<const ReductionCount> sizes, const ReductionTotals& totals);
  // GPU work of the agent's sampled windows (the agent writes it as its windows close; merge copies it).
  void appendGpuActivity(std::span<const GpuActivityRecord> rows);
  // Adds `count` to the drops of this kind on this rank.
  void addDrops(std::int64_t rank_id, const std::string& kind, std::int64_t count);

  void commit();

  // True when the file at path() is no longer the one being written: it (or its directory) was removed
  // or replaced while the job ran. Writing goes on into the unlinked file, which vanishes when closed.
  // A stat() of the path: cheap enough to ask at every commit.
  bool removed() const;
  // Commits, then writes everything committed so far into a new file at path() (mode 0600; the directory
  // must exist: the caller creates it) and goes on writing there. Throws when the file cannot be created
  // (a file now in its place is never overwritten); the writer then still writes the old file.
  void recreate();

  // Commits and closes the file; `end_ns` is stored as the end of every run still open in this file.
  void finish(std::int64_t end_ns);
  void finish();  // keeps end_ns NULL unless setRunEnd() was called
  // finish(end_ns) without the tidy-up (tile pruning, PRAGMA optimize, a synced switch out of WAL mode):
  // one commit, then close. For a process about to die of a signal, whose launcher may SIGKILL it within
  // milliseconds (Open MPI does, as soon as another rank has died). The file stays in WAL mode; closing
  // the last connection folds the WAL in. Readers read it like any other trace.
  void finishQuickly(std::int64_t end_ns);

  // After a failed write the writer refuses everything above (its ids and tiles no longer match the
  // file) and the calls of the open transaction are gone. What the failure cost can still be said, in a
  // transaction of its own that touches no call: `drops` (kind, count) added to this rank's, the run's
  // configuration, its end. Then the file is closed. Throws when the file takes none of it (a full disk);
  // the writer is closed either way. Without an earlier failure it is finish(end_ns) after those writes.
  void closeAfterFailure(std::int64_t run_id, std::int64_t rank_id,
                         const std::vector<std::pair<std::string, std::int64_t>>& drops,
                         const std::string& config_json, std::int64_t end_ns);
  // The calls the failed write took with it: appended, never committed (0 before a failure).
  std::int64_t callsRolledBack() const;

  const std::string& path() const;
  std::int64_t callCount() const;

 private:
  struct Impl;
  explicit TraceWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Adds one row to the `recommendations` table of an existing trace (what `gradscope recommend` made from
// it), in its own transaction, and returns its id. The file is validated (and an older schema upgraded)
// as by TraceReader::open first; a file that is not writable is an Error saying so, and the trace's other
// tables are left untouched. Safe while readers have the file open (WAL); do not call it while a
// TraceWriter is still writing the file.
std::int64_t appendRecommendation(const std::string& path, const RecommendationRecord& recommendation);

// Sets `key` to the JSON value `json_value` in the configuration (runs.config_json) of every run of an
// existing trace, in one transaction (gradscope run stores its validation of an apply run this way).
// Opened and checked as appendRecommendation opens it; a configuration that is not a JSON object becomes
// one holding the key.
void setRunConfigValue(const std::string& path, const std::string& key, const std::string& json_value);

// Unix-epoch time in ns from the system clock.
std::int64_t unixTimeNs();

}  // namespace gradscope::storage
