#pragma once

// The agent's trace file: the storage writer and everything written through it — the run's and the
// rank's rows, communicators, calls, explorations, drops, and at the end the agent's statistics — and a
// file removed while the job runs, written again.
//
// Threads. create() runs on the activating thread (under recorder.cc's lifecycle mutex); afterwards the
// object belongs to the background thread alone (no lock). Errors: every write throws (gradscope::Error or
// SQLite's failure) and leaves the writer refusing further writes; the caller then stops recording and
// ends with closeAfterFailure().

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/call_event.h"
#include "core/comm_registry.h"
#include "core/shadow.h"
#include "gradscope/common/drop_kind.h"
#include "gradscope/storage/writer.h"

namespace gradscope::agent {

// Drops by kind, indexed by DropKind.
using DropCounts = std::array<std::int64_t, kDropKinds>;

// What the agent says of itself at the end (runs.config_json "agent"; docs/agent.md).
struct AgentStatistics {
  std::int64_t calls_recorded = 0;
  std::int64_t calls_dropped = 0;
  double hot_path_ns = 0;      // one recorded call on the calling thread (measureHotPath)
  double dropped_call_ns = 0;  // one call the rate limit turns away
  std::int64_t flusher_cpu_ns = 0;
  std::int64_t buffer_bytes = 0;
  // Where the NCCL calls' GPU spans came from (GpuTimer::spanSource), empty when none was GPU-timed.
  std::string gpu_spans, gpu_spans_note;
};

class TraceOutput {
 public:
  // Creates the file at `path` (0600, and its directory) with the run's row and the rank's (rank.run_id
  // is set here), committed. Throws with the reason.
  static TraceOutput create(const std::string& path, const storage::RunInfo& run, storage::RankInfo rank);

  std::int64_t rankId() const { return rank_id_; }
  // The run's origin, Unix-epoch ns: rows store times relative to it.
  std::int64_t epochNs() const { return epoch_ns_; }

  // Rows of the communicators registered since the last call: a record refers to a communicator
  // registered before it, so this comes before the records drained after it.
  void addComms(CommRegistry& registry);
  // The row of a communicator (CommRegistry index), 0 for one without a row.
  std::int64_t commRow(std::uint32_t index) const {
    return index < comm_rows_.size() ? comm_rows_[index] : 0;
  }

  // TraceWriter's, for the calls of a batch: the id of the first.
  std::int64_t appendCalls(std::span<const storage::CallRecord> calls) { return writer_.appendCalls(calls); }
  void appendApplied(std::span<const storage::AppliedCall> rows) { writer_.appendApplied(rows); }
  void appendGpuActivity(std::span<const storage::GpuActivityRecord> rows) {
    writer_.appendGpuActivity(rows);
  }
  void setNcclInfo(std::int64_t call_id, const NcclInfoPayload& info) {
    writer_.setNcclInfo(call_id, info.algo, info.proto, info.channels);
  }
  // An exploration's measurements and consensus row, linked to its call when it has one.
  void writeExploration(const ExploreRecord& record, std::optional<std::int64_t> call_id);
  void addDrops(const DropCounts& drops);

  // Commits. Then, when the file (or its directory) was removed meanwhile — SQLite would go on writing
  // the unlinked file and everything would vanish at exit — makes them again with everything committed
  // so far, and recording goes on there (one line on stderr says so). Throws when it cannot.
  void commit();

  // The end, recording intact: the statistics into the run's configuration, then the file closed.
  // `signalled`: the process dies of a signal next and its launcher may SIGKILL it within milliseconds, so
  // the end is committed first and the file's tidy-up skipped (TraceWriter::finishQuickly).
  void finish(const AgentStatistics& stats, std::int64_t end_epoch_ns, bool signalled);
  // The end after a failed write: what stopped the recording (`why`) and how many calls it lost, where the
  // file still takes that (a refused insert does; a full disk does not). Never throws.
  void closeAfterFailure(const DropCounts& drops, std::int64_t calls_recorded, std::int64_t calls_dropped,
                         const std::string& why, std::int64_t end_epoch_ns);
  // The calls the failed write took with it (appended, never committed).
  std::int64_t callsRolledBack() const { return writer_.callsRolledBack(); }

 private:
  TraceOutput(storage::TraceWriter writer, std::int64_t run_id, std::int64_t rank_id, std::int64_t epoch_ns,
              std::string config_json);
  void restoreIfRemoved();

  storage::TraceWriter writer_;
  std::int64_t run_id_, rank_id_, epoch_ns_;
  std::string config_json_;  // the run's, as created: the statistics are added to it at the end
  std::vector<std::int64_t> comm_rows_;
};

}  // namespace gradscope::agent
