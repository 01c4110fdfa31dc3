#pragma once

// TraceReader: typed, read-only queries over a trace file, for the report, the tuner and the GUI.
//
// Contract:
// - open() validates before anything is read: the file exists, is SQLite, carries gradscope's
//   application_id, is not truncated, and has a schema this build knows. A file of an older schema is
//   upgraded in place (one transaction: all or nothing) when writable; one of a newer schema is refused.
//   Each refusal is a gradscope::Error with one line naming the problem and the fix.
// - Reading never blocks the writer: a trace can be read while the agent writes it (WAL); a reader
//   sees the state of the last commit at the start of each query.
// - A reader is not thread-safe; open one per thread.
// - Corruption found later, while a query runs, throws gradscope::Error as well.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/storage/records.h"
#include "gradscope/storage/window.h"

namespace gradscope::storage {

// One pixel column (or bucket) of the zoomed-out timeline of one rank.
struct TimelineBucket {
  std::int64_t calls = 0;
  std::int64_t busy_ns = 0;  // summed durations of the calls starting in the bucket
  std::int64_t bytes = 0;
  std::int64_t max_ns = 0;          // longest call
  Api dominant_api = Api::Unknown;  // API with the most busy time in the bucket
};

struct TimelineSummary {
  std::int64_t t0_ns = 0, t1_ns = 0;  // the window; bucket i covers [t0 + i·w, t0 + (i+1)·w)
  int columns = 0;
  int level = -1;  // tile level used, -1 when computed from the calls themselves
  std::vector<std::int64_t> rank_ids;
  std::vector<std::vector<TimelineBucket>> buckets;  // [rank index][column]
};

struct SizeBucket {
  Api api = Api::Unknown;
  int log2_bytes = -1;  // bucket [2^k, 2^(k+1)) bytes; -1 for zero-byte calls
  std::int64_t calls = 0;
  std::int64_t total_ns = 0;
  std::int64_t min_ns = 0, max_ns = 0;
  std::int64_t bytes = 0;
};

struct RankSummary {
  std::int64_t rank_id = 0;
  int rank = 0;
  std::string host;
  std::int64_t calls = 0;
  std::int64_t total_ns = 0;               // summed durations: overlapping calls count each
  std::int64_t busy_ns = 0;                // time in at least one collective (the union of the calls)
  std::int64_t first_ns = 0, last_ns = 0;  // first call start, last call end
};

struct TimeExtent {
  std::int64_t begin_ns = 0, end_ns = 0;
  bool empty() const { return end_ns <= begin_ns; }
};

class TraceReader {
 public:
  static TraceReader open(const std::string& path);

  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;
  ~TraceReader();

  const std::string& path() const;
  int schemaVersion() const;

  // Metadata.
  std::vector<RunInfo> runs() const;
  std::vector<RankInfo> ranks() const;
  std::vector<CommInfo> comms() const;
  std::int64_t callCount() const;

  // The calls of [t0, t1), of one rank or of every rank, as id ranges and the rule that picks them out
  // (window.h: which calls, how far back it looks and why that finds them all). A few probes of
  // call_tiles per rank; no call is read.
  CallWindow callWindow(std::int64_t t0_ns, std::int64_t t1_ns,
                        std::optional<std::int64_t> rank_id = std::nullopt) const;
  // The calls of one rank in [t0, t1) (callWindow), ordered by start, at most `limit` (0 = no limit).
  std::vector<CallRecord> callsInWindow(std::int64_t rank_id, std::int64_t t0_ns, std::int64_t t1_ns,
                                        std::size_t limit = 0) const;
  // The zoomed-out form: per rank, `columns` buckets over [t0, t1). Uses the coarsest tile level that
  // still resolves one column, or the calls themselves when the window holds few of them.
  TimelineSummary timeline(std::int64_t t0_ns, std::int64_t t1_ns, int columns) const;
  // Earliest start and latest end over all calls (from the tiles: no scan of calls).
  TimeExtent timeExtent() const;

  // Aggregates over all calls, computed in one scan: the size histogram per API, per-rank totals and
  // the `top` longest calls (longest first).
  struct CallStatistics {
    std::vector<SizeBucket> sizes;   // ordered by api, then size
    std::vector<RankSummary> ranks;  // ordered by rank id
    std::vector<CallRecord> longest;
  };
  CallStatistics callStatistics(std::size_t top) const;
  // Start-time spread of each collective across ranks, matched by (communicator key, seq): for each
  // rank, the mean and max of (its start − the earliest start of the same collective). Point-to-point
  // calls, numbered apart and never equal across ranks, are left out. Two scans.
  struct Lateness {
    std::int64_t rank_id = 0;
    std::int64_t matched = 0;  // calls matched with at least one other rank
    double mean_ns = 0;
    std::int64_t max_ns = 0;
  };
  std::vector<Lateness> lateness() const;

  // Other tables. `strategy` empty = all.
  std::vector<Measurement> measurements(const std::string& strategy = {}) const;
  // The collective each explore row was timed on, by measurement id: its call's communicator key and
  // sequence number, the same on every rank (the rows of one exploration share them). Bench rows, timed
  // on no call, have none.
  struct MeasurementOrigin {
    std::int64_t measurement_id = 0;
    std::string comm_key;
    std::int64_t seq = 0;
  };
  std::vector<MeasurementOrigin> measurementOrigins() const;
  std::vector<ConsensusRecord> consensus() const;  // ordered by step (-1 first), rank id, id
  std::vector<AppliedCall> appliedCalls() const;   // ordered by call id
  // The step model merge stored (schema v6), ordered by rank id, step; empty for a file merge did not
  // write (storage/step_model.h derives the same rows from the calls).
  std::vector<StepRecord> steps() const;
  // The step model's exposure merge stored (ordered by api, dtype, bytes); empty in a file not merged.
  std::vector<CallExposure> exposure() const;
  // The calls' time per step, API and size class merge stored with the steps (ordered by step, api,
  // size_class); empty in a file not merged.
  std::vector<StepCallTime> stepCalls() const;
  // The GPU work of the agent's sampled windows (schema v7), ordered by rank id, start.
  std::vector<GpuActivityRecord> gpuActivity() const;
  // Graph replays (CallRecord::graph_replay) per API: of how many captured calls, how many, and their
  // summed GPU time. Aggregated in SQL.
  struct ReplaySummary {
    Api api = Api::Unknown;
    std::int64_t captured_calls = 0;
    std::int64_t replays = 0;
    std::int64_t total_ns = 0;
  };
  std::vector<ReplaySummary> replaySummary() const;  // most GPU time first
  // What apply mode did: per strategy, the calls it replaced and their summed duration (most calls
  // first), and the reductions (calls with a reduction op) it left as the job issued them, counted only
  // when it replaced any (a scan of the calls, skipped for traces of the other modes). Aggregated in
  // SQL, without reading the calls into memory.
  struct AppliedStrategy {
    std::string strategy;
    std::int64_t calls = 0;
    std::int64_t total_ns = 0;
  };
  struct AppliedSummary {
    std::vector<AppliedStrategy> strategies;
    std::int64_t untouched_reductions = 0;
  };
  AppliedSummary appliedSummary() const;
  std::vector<RecommendationRecord> recommendations() const;
  std::vector<DropRecord> drops() const;

  // The calls that carry a reduction op, counted per (api, dtype, op, bytes), with the number of distinct
  // steps (>= 0) and ranks among them: the workload the tuner optimises. Calls on communicators of one
  // rank (comms.size = 1: MPI_COMM_SELF, a split of one) are left out, only counted: they aggregate
  // nothing, so no strategy saves anything on them. A merged trace stores them (reduction_sizes and
  // reduction_totals, schema v9): they are read back. Otherwise one narrow scan of `calls` (no join, seven
  // columns), because the tuner must read a ten-million-call trace in well under two seconds.
  using ReductionCount = storage::ReductionCount;
  struct ReductionCounts : ReductionTotals {
    std::vector<ReductionCount> sizes;  // ordered by api, dtype, op, bytes
  };
  // Traces of more than `rows_per_thread` calls are read in id ranges by parallel read-only connections
  // (one per core at most); tests lower it to exercise that path.
  static constexpr std::int64_t kRowsPerThread = 2'000'000;
  ReductionCounts reductionCounts(std::int64_t rows_per_thread = kRowsPerThread) const;

  // Streams every call in id order, GPU facts included. Return false from `visit` to stop.
  void forEachCall(const std::function<bool(const CallRecord&)>& visit) const;
  // The same calls without the GPU facts other than graph_replay (stream, NCCL algorithm, protocol and
  // channels stay unset): the calls table alone, its replays read in step from gpu_calls' partial index.
  // About half the cost of forEachCall, for passes over every call of a large trace (the step model,
  // lateness, callStatistics).
  void forEachCallWithoutGpuFacts(const std::function<bool(const CallRecord&)>& visit) const;
  // Streams the calls that have peer facts (CallRecord::hasPeerInfo: point-to-point calls and
  // all-to-alls, schema v5's peer_calls) in id order, as forEachCall reads them. The scan is driven by
  // peer_calls, so a trace of millions of collectives and few point-to-point calls reads only those.
  void forEachPeerCall(const std::function<bool(const CallRecord&)>& visit) const;

  // Per rank id and API: calls, bytes, summed duration and the first start and last end. One narrow scan
  // of `calls` (no join), aggregated in memory: what the report's families and the pipeline shares need.
  struct ApiTotal {
    std::int64_t rank_id = 0;
    Api api = Api::Unknown;
    std::int64_t calls = 0;
    std::int64_t bytes = 0;
    std::int64_t total_ns = 0;
    std::int64_t first_ns = 0, last_ns = 0;
  };
  std::vector<ApiTotal> apiTotals() const;  // ordered by rank id, api

 private:
  struct Impl;
  explicit TraceReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradscope::storage
