#pragma once

// Every table of the trace store, declared once (table.h says what a declaration generates): the
// column-by-column contract of the file format. schema.cc creates the tables from these declarations,
// the writer binds and the readers decode their rows with them. The text they generate is what files
// store, byte for byte (tests/data/schema_v<version>.sql), so changing a name, type, comment or their
// alignment changes the file format: a new schema version with a migration.
//
// Adding a column: one line here, naming the record member (records.h) that holds it; the DDL, the
// INSERT and its binds, the SELECT lists and decoders, and with them merge (which copies records) and the
// viewer's calls table (call_columns.h), follow. Presentations of the data stay written by hand: the
// call_view view (schema.cc) and the CSV and Chrome-trace exports (export.cc), whose columns are chosen
// for people and golden-tested. (A new column changes the file format all the same: it comes with a
// schema version, a migration of older files and that version's golden text.)

#include <string_view>
#include <tuple>

#include "gradscope/storage/records.h"
#include "table.h"
#include "tiles.h"

namespace gradscope::storage::detail {

// A row of `names` (schema.cc fills the table from common/types.h).
struct NameRow {
  std::string_view domain;
  int code = 0;
  std::string_view name;
};

inline constexpr auto kNames = table(
    {.name = "names",
     .about = "Human-readable names of the integer codes stored in other tables (api, dtype, op, backend,\n"
              "nccl_algo, nccl_proto). Codes never change meaning; see "
              "common/include/gradscope/common/types.h.",
     .comment_at = 19,
     .constraint = "PRIMARY KEY (domain, code)",
     .without_rowid = true},
    column<&NameRow::domain>("domain", "TEXT NOT NULL",
                             "which column family the code belongs to, e.g. 'api'"),
    column<&NameRow::code>("code", "INTEGER NOT NULL", "the stored value"),
    column<&NameRow::name>("name", "TEXT NOT NULL", "e.g. 'MPI_Allreduce', 'fp32', 'sum'"));

inline constexpr auto kRuns = table(
    {.name = "runs", .about = "One row per profiled run or benchmark.", .comment_at = 22},
    key<&RunInfo::id>("id", "INTEGER PRIMARY KEY", "file-local run id"),
    column<&RunInfo::uuid>("uuid", "TEXT NOT NULL UNIQUE", "identifies the run across its per-rank files"),
    column<&RunInfo::command>("command", "TEXT NOT NULL",
                              "command line that was profiled, or the benchmark's"),
    column<&RunInfo::mode>("mode", "TEXT NOT NULL", "observe | explore | apply | bench | synthetic"),
    column<&RunInfo::backend>("backend", "INTEGER NOT NULL",
                              "names.domain 'backend': 1 mpi, 2 nccl, 3 local, 0 unknown"),
    column<&RunInfo::world_size>("world_size", "INTEGER NOT NULL", "ranks in the job"),
    column<&RunInfo::host>("host", "TEXT NOT NULL", "host of the process that created the run's first file"),
    column<&RunInfo::config_json>("config_json", "TEXT NOT NULL",
                                  "gradscope configuration in effect, as JSON"),
    column<&RunInfo::tool_version>("tool_version", "TEXT NOT NULL", "gradscope version that wrote the run"),
    column<&RunInfo::epoch_ns>("epoch_ns", "INTEGER NOT NULL",
                               "time origin of every *_ns column of this run, in Unix-epoch ns"),
    column<&RunInfo::start_ns>("start_ns", "INTEGER NOT NULL", "run start, relative to epoch_ns"),
    column<&RunInfo::end_ns>("end_ns", "INTEGER",
                             "run end, relative to epoch_ns; NULL while written or if the job died"));

inline constexpr auto kRanks =
    table({.name = "ranks",
           .about = "One row per rank (process) of a run.",
           .comment_at = 31,
           .constraint = "UNIQUE (run_id, rank)"},
          key<&RankInfo::id>("id", "INTEGER PRIMARY KEY", "file-local id; equals rank in single-run files"),
          column<&RankInfo::run_id>("run_id", "INTEGER NOT NULL REFERENCES runs(id)"),
          column<&RankInfo::rank>("rank", "INTEGER NOT NULL", "rank in the job's world"),
          column<&RankInfo::host>("host", "TEXT NOT NULL", "host the rank ran on"),
          column<&RankInfo::pid>("pid", "INTEGER NOT NULL", "process id"),
          column<&RankInfo::device>("device", "TEXT NOT NULL", "'cpu' or 'cuda:N <device name>'"),
          column<&RankInfo::clock_offset_ns>("clock_offset_ns", "INTEGER NOT NULL DEFAULT 0",
                                             "add to this rank's times to align them with rank 0"));

inline constexpr auto kComms = table(
    {.name = "comms",
     .about = "One row per communicator seen on a rank.",
     .comment_at = 37,
     .constraint = "UNIQUE (rank_id, key)"},
    key<&CommInfo::id>("id", "INTEGER PRIMARY KEY", "file-local id, referenced by calls.comm_id"),
    column<&CommInfo::rank_id>("rank_id", "INTEGER NOT NULL REFERENCES ranks(id)"),
    column<&CommInfo::key>("key", "TEXT NOT NULL", "equal on every rank of the communicator"),
    column<&CommInfo::backend>("backend", "INTEGER NOT NULL", "names.domain 'backend'"),
    column<&CommInfo::size>("size", "INTEGER NOT NULL", "ranks in the communicator"),
    column<&CommInfo::comm_rank>("comm_rank", "INTEGER NOT NULL", "this rank's index in the communicator"));

inline constexpr auto kMeasurements = table(
    {.name = "measurements",
     .about = "One row per strategy timed on an intercepted call (explore) or a benchmark point (bench).",
     .comment_at = 31,
     .indexes = "CREATE INDEX measurements_by_strategy ON measurements (strategy, dtype, bytes);"},
    key<&Measurement::id>("id", "INTEGER PRIMARY KEY"),
    column<&Measurement::run_id>("run_id", "INTEGER NOT NULL REFERENCES runs(id)"),
    column<&Measurement::rank_id>("rank_id", "INTEGER REFERENCES ranks(id)",
                                  "rank that measured; NULL when aggregated over ranks"),
    column<&Measurement::call_id>("call_id", "INTEGER REFERENCES calls(id)",
                                  "call the strategy was timed on; NULL for benchmarks"),
    column<&Measurement::strategy>("strategy", "TEXT NOT NULL",
                                   "strategy name, e.g. 'sum/rs_ag/bf16' (DESIGN.md)"),
    column<&Measurement::api>("api", "INTEGER NOT NULL", "names.domain 'api': the collective measured"),
    column<&Measurement::dtype>("dtype", "INTEGER NOT NULL", "names.domain 'dtype': the job's element type"),
    column<&Measurement::bytes>("bytes", "INTEGER NOT NULL", "buffer size in bytes"),
    column<&Measurement::world>("world", "INTEGER NOT NULL", "ranks taking part"),
    column<&Measurement::reps>("reps", "INTEGER NOT NULL", "timed repetitions (after warm-up)"),
    column<&Measurement::min_ns>("min_ns", "REAL NOT NULL", "fastest repetition"),
    column<&Measurement::median_ns>("median_ns", "REAL NOT NULL"),
    column<&Measurement::p90_ns>("p90_ns", "REAL NOT NULL"),
    column<&Measurement::max_ns>("max_ns", "REAL NOT NULL"),
    column<&Measurement::algbw_gbs>("algbw_gbs", "REAL NOT NULL",
                                    "bytes / median time, decimal GB/s (nccl-tests)"),
    column<&Measurement::busbw_gbs>("busbw_gbs", "REAL NOT NULL", "algbw times the collective's bus factor"),
    column<&Measurement::rel_l2_error>("rel_l2_error", "REAL",
                                       "||result - fp64 reference|| / ||reference||; NULL if not checked"),
    column<&Measurement::max_abs_error>("max_abs_error", "REAL", "largest element-wise absolute error"),
    column<&Measurement::cosine>("cosine", "REAL", "cosine similarity to the reference"),
    column<&Measurement::overflow_count>("overflow_count", "INTEGER NOT NULL DEFAULT 0",
                                         "elements that overflowed or became NaN"));

inline constexpr auto kRecommendations =
    table({.name = "recommendations", .about = "Recommendations made from the run.", .comment_at = 19},
          key<&RecommendationRecord::id>("id", "INTEGER PRIMARY KEY"),
          column<&RecommendationRecord::run_id, NullWhen<0>>("run_id", "INTEGER REFERENCES runs(id)"),
          column<&RecommendationRecord::created_ns>("created_ns", "INTEGER NOT NULL", "Unix-epoch ns"),
          column<&RecommendationRecord::json>("json", "TEXT NOT NULL",
                                              "the versioned recommendation file (DESIGN.md)"));

inline constexpr auto kDrops = table(
    {.name = "drops",
     .about =
         "Events the agent could not record: its bounded buffers were full, or recording stopped after an\n"
         "error. What each kind means: storage/include/gradscope/storage/drops.h, gradscope report.",
     .comment_at = 19,
     .constraint = "PRIMARY KEY (rank_id, kind)",
     .without_rowid = true},
    column<&DropRecord::rank_id>("rank_id", "INTEGER NOT NULL REFERENCES ranks(id)"),
    column<&DropRecord::kind>("kind", "TEXT NOT NULL", "what was dropped: 'call', 'cupti_record', ..."),
    column<&DropRecord::count>("count", "INTEGER NOT NULL", "how many"));

inline constexpr auto kCalls = table(
    {.name = "calls",
     .about =
         "One row per intercepted collective on a rank. Kept narrow on purpose: the agent writes millions.\n"
         "Columns other than step and op are never NULL; the writer guarantees it (NOT NULL checks cost\n"
         "about 5% of the insert rate).",
     .comment_at = 10},
    key<&CallRecord::id>("id", "INTEGER PRIMARY KEY",
                         "file-local; increases with insertion, contiguous per rank file"),
    column<&CallRecord::rank_id>("rank_id", "INTEGER", "ranks.id of the calling rank"),
    column<&CallRecord::comm_id>("comm_id", "INTEGER", "comms.id of the communicator"),
    column<&CallRecord::seq>("seq", "INTEGER",
                             "per-communicator sequence number: equal on all ranks for one collective"),
    column<&CallRecord::step, NullWhen<-1>>("step", "INTEGER", "training step; NULL when unknown"),
    column<&CallRecord::api>("api", "INTEGER", "names.domain 'api'"),
    column<&CallRecord::dtype>("dtype", "INTEGER", "names.domain 'dtype'"),
    column<&CallRecord::op, NullWhen<ReduceOp::None>>(
        "op", "INTEGER", "names.domain 'op'; NULL when the API has no reduction"),
    column<&CallRecord::count>("count", "INTEGER", "elements, as passed to the API"),
    column<&CallRecord::bytes>("bytes", "INTEGER", "bytes of the send buffer"),
    column<&CallRecord::enqueue_ns>("enqueue_ns", "INTEGER",
                                    "host time of the API call (relative to runs.epoch_ns)"),
    column<&CallRecord::start_ns>("start_ns", "INTEGER", "operation start (GPU time for NCCL when known)"),
    column<&CallRecord::end_ns>("end_ns", "INTEGER", "operation end"));

inline constexpr auto kCallTiles = table(
    {.name = "call_tiles",
     .about = "Aggregates of the calls that start in each 2^level-ns tile, per rank and API: the zoomed-out\n"
              "timeline, and the time index of calls (first_id..last_id). Levels: schema.h kTileLevels.",
     .comment_at = 19,
     .constraint = "PRIMARY KEY (level, rank_id, tile, api)",
     .without_rowid = true},
    column<&TileRow::level>("level", "INTEGER NOT NULL", "tile width is 2^level ns"),
    column<&TileRow::rank_id>("rank_id", "INTEGER NOT NULL", "ranks.id"),
    column<&TileRow::tile>("tile", "INTEGER NOT NULL", "start_ns >> level"),
    column<&TileRow::api>("api", "INTEGER NOT NULL", "names.domain 'api'"),
    column<&TileRow::calls>("calls", "INTEGER NOT NULL", "calls starting in the tile"),
    column<&TileRow::busy_ns>("busy_ns", "INTEGER NOT NULL",
                              "sum of their durations (may exceed the tile width)"),
    column<&TileRow::bytes>("bytes", "INTEGER NOT NULL", "sum of their bytes"),
    column<&TileRow::max_ns>("max_ns", "INTEGER NOT NULL", "longest duration among them"),
    column<&TileRow::first_id>("first_id", "INTEGER NOT NULL", "smallest calls.id among them"),
    column<&TileRow::last_id>("last_id", "INTEGER NOT NULL", "largest calls.id among them"));

// The GPU facts of a CallRecord; its key is the call's id. A call without any (CallRecord::hasGpuInfo)
// has no row, and a LEFT JOIN reads the members' unknown values.
inline constexpr auto kGpuCalls = table(
    {.name = "gpu_calls",
     .about = "GPU-side facts of calls enqueued on a CUDA stream; absent for host (MPI) calls.",
     .comment_at = 19,
     .indexes = "CREATE INDEX gpu_calls_replays ON gpu_calls (call_id) WHERE replay IS NOT NULL;"},
    key<&CallRecord::id>("call_id", "INTEGER PRIMARY KEY REFERENCES calls(id)"),
    column<&CallRecord::stream>("stream", "INTEGER NOT NULL", "per-rank stream index (0 = unknown)"),
    column<&CallRecord::nccl_algo, NullWhen<-1>>("algo", "INTEGER", "names.domain 'nccl_algo'; NULL unknown"),
    column<&CallRecord::nccl_proto, NullWhen<-1>>("proto", "INTEGER",
                                                  "names.domain 'nccl_proto'; NULL unknown"),
    column<&CallRecord::nccl_channels, NullWhen<0>>("channels", "INTEGER",
                                                    "channels NCCL used; NULL unknown"),
    column<&CallRecord::graph_replay, NullWhen<0>>(
        "replay", "INTEGER",
        "k >= 1: the k-th GPU execution (CUDA graph launch) of the graph-captured\n"
        "call with this seq on this communicator, timed on the GPU; NULL for\n"
        "every other call"));

// The point-to-point and all-to-all facts of a CallRecord; its key is the call's id. A call without any
// (CallRecord::hasPeerInfo) has no row, and a LEFT JOIN reads the members' unknown values.
inline constexpr auto kPeerCalls = table(
    {.name = "peer_calls",
     .about = "Whom a point-to-point call sent to or received from, and how an all-to-all spread its bytes\n"
              "over the peers; absent for other calls. Ranks are ranks in the call's communicator.",
     .comment_at = 19},
    key<&CallRecord::id>("call_id", "INTEGER PRIMARY KEY REFERENCES calls(id)"),
    column<&CallRecord::dest, NullWhen<-1>>("dest", "INTEGER", "rank sent to; NULL when nothing was sent"),
    column<&CallRecord::send_tag, NullWhen<-1>>("send_tag", "INTEGER", "the send's tag; NULL for NCCL"),
    column<&CallRecord::source, NullWhen<-1>>("source", "INTEGER",
                                              "rank received from (MPI_ANY_SOURCE: the matched one)"),
    column<&CallRecord::recv_tag, NullWhen<-1>>("recv_tag", "INTEGER",
                                                "the received message's tag (MPI_ANY_TAG: the matched one)"),
    column<&CallRecord::recv_bytes, NullWhen<-1>>("recv_bytes", "INTEGER",
                                                  "bytes received; NULL when nothing was received"),
    column<&CallRecord::peer_max_bytes, NullWhen<-1>>("peer_max_bytes", "INTEGER",
                                                      "all-to-all: most bytes sent to one peer"),
    column<&CallRecord::peer_min_bytes, NullWhen<-1>>("peer_min_bytes", "INTEGER",
                                                      "all-to-all: fewest bytes sent to one peer"));

inline constexpr auto kConsensus = table(
    {.name = "consensus",
     .about = "Consensus diagnostics: one row per rank and explored reduction (call_id), grouped by step.",
     .comment_at = 19,
     .indexes = "CREATE INDEX consensus_by_step ON consensus (step, rank_id);"},
    key<&ConsensusRecord::id>("id", "INTEGER PRIMARY KEY"),
    column<&ConsensusRecord::rank_id>("rank_id", "INTEGER NOT NULL REFERENCES ranks(id)"),
    column<&ConsensusRecord::step>("step", "INTEGER NOT NULL",
                                   "training step; -1 when unknown (merge takes call_id's step)"),
    column<&ConsensusRecord::alpha>("alpha", "REAL NOT NULL", "AdaCons alpha of this rank"),
    column<&ConsensusRecord::cosine_to_mean>("cosine_to_mean", "REAL NOT NULL",
                                             "cosine of this rank's gradient to the mean gradient"),
    column<&ConsensusRecord::grad_norm>("grad_norm", "REAL NOT NULL", "L2 norm of this rank's gradient"),
    column<&ConsensusRecord::diversity>("diversity", "REAL NOT NULL",
                                        "gradient diversity of the step: sum ||g_i||^2 / ||sum g_i||^2"),
    column<&ConsensusRecord::call_id>("call_id", "INTEGER REFERENCES calls(id)",
                                      "explored call whose buffer it was computed on; NULL: v2 row"));

inline constexpr auto kAppliedCalls = table(
    {.name = "applied_calls",
     .about = "Calls that apply mode replaced with a recommended strategy, and which. A call without a row "
              "ran as the\njob issued it.",
     .comment_at = 15},
    column<&AppliedCall::call_id>("call_id", "INTEGER PRIMARY KEY REFERENCES calls(id)"),
    column<&AppliedCall::strategy>("strategy", "TEXT NOT NULL",
                                   "strategy that ran instead, e.g. 'sum/rs_ag/bf16' (DESIGN.md)"));

// The step model (storage/step_model.h), written by merge: one row per rank and step.
inline constexpr auto kSteps = table(
    {.name = "steps",
     .about = "Where each rank's training step went (derived at merge from the calls; docs/schema.md):\n"
              "compute_ns + exposed_ns = end_ns - start_ns, waiting_ns is part of exposed_ns.",
     .comment_at = 19,
     .constraint = "PRIMARY KEY (rank_id, step)",
     .without_rowid = true},
    column<&StepRecord::rank_id>("rank_id", "INTEGER NOT NULL REFERENCES ranks(id)"),
    column<&StepRecord::step>("step", "INTEGER NOT NULL", "calls.step"),
    column<&StepRecord::start_ns>("start_ns", "INTEGER NOT NULL", "posting of the step's first call"),
    column<&StepRecord::end_ns>("end_ns", "INTEGER NOT NULL",
                                "posting of the next step's first call (the last step: its last end)"),
    column<&StepRecord::compute_ns>("compute_ns", "INTEGER NOT NULL", "time not blocked in communication"),
    column<&StepRecord::exposed_ns>("exposed_ns", "INTEGER NOT NULL",
                                    "time blocked in a communication call or a wait"),
    column<&StepRecord::waiting_ns>("waiting_ns", "INTEGER NOT NULL",
                                    "of exposed_ns: before the last rank arrived (or the sender posted)"),
    column<&StepRecord::hidden_ns>("hidden_ns", "INTEGER NOT NULL",
                                   "nonblocking communication in flight while not blocked"),
    column<&StepRecord::caused_ns>("caused_ns", "INTEGER NOT NULL",
                                   "other ranks' waiting in calls this rank arrived at last"),
    column<&StepRecord::calls>("calls", "INTEGER NOT NULL", "calls posted in the step"),
    column<&StepRecord::basis>("basis", "INTEGER NOT NULL",
                               "0 host calls; 1 GPU kernels (a sampled window); 2 GPU, not sampled:\n"
                               "span and calls only, the breakdown columns 0"),
    column<&StepRecord::idle_ns>("idle_ns", "INTEGER NOT NULL",
                                 "basis 1: of compute_ns, the GPU ran no kernel; else 0"));

// GPU work the agent sampled (agent/core/cupti_tracer.h, "Windows"); the step model reads it at merge.
inline constexpr auto kGpuActivity = table(
    {.name = "gpu_activity",
     .about = "GPU kernels inside the agent's sampled windows (CUPTI), as intervals per kind; merge derives\n"
              "the GPU steps' breakdown from them (docs/schema.md, \"GPU steps\").",
     .comment_at = 19,
     .indexes = "CREATE INDEX gpu_activity_by_rank ON gpu_activity (rank_id, start_ns);"},
    column<&GpuActivityRecord::rank_id>("rank_id", "INTEGER NOT NULL REFERENCES ranks(id)"),
    column<&GpuActivityRecord::kind>("kind", "INTEGER NOT NULL",
                                     "0 a window; 1 compute kernels; 2 NCCL kernels"),
    column<&GpuActivityRecord::start_ns>("start_ns", "INTEGER NOT NULL", "GPU time"),
    column<&GpuActivityRecord::end_ns>("end_ns", "INTEGER NOT NULL", "GPU time"),
    column<&GpuActivityRecord::kernels>("kernels", "INTEGER NOT NULL",
                                        "kernels merged into the interval (they overlap or touch); 0: a\n"
                                        "window"),
    column<&GpuActivityRecord::range>("nvtx_range", "TEXT",
                                      "compute kernels: the job's innermost NVTX range on the thread that\n"
                                      "launched them; NULL: none, or not a compute row"));

// The exposure of the step model (storage/step_model.h), written by merge beside the steps: one row per
// kind of collective, so that the tuner reads it instead of deriving it from every call again.
inline constexpr auto kExposure = table(
    {.name = "exposure",
     .about = "What a faster transport could take off the step, per kind of MPI collective (derived at\n"
              "merge from the calls with the steps; docs/schema.md, \"Steps\").",
     .comment_at = 19,
     .constraint = "PRIMARY KEY (api, dtype, bytes)",
     .without_rowid = true},
    column<&CallExposure::api>("api", "INTEGER NOT NULL", "names.domain 'api'"),
    column<&CallExposure::dtype>("dtype", "INTEGER NOT NULL", "names.domain 'dtype'"),
    column<&CallExposure::bytes>("bytes", "INTEGER NOT NULL", "calls.bytes"),
    column<&CallExposure::calls>("calls", "INTEGER NOT NULL", "calls of this kind, over every rank"),
    column<&CallExposure::transport_ns>("transport_ns", "REAL NOT NULL",
                                        "mean time from the last rank's arrival to the call's end"),
    column<&CallExposure::exposed_ns>("exposed_ns", "REAL NOT NULL",
                                      "mean part of transport_ns the rank spent blocked"));

// The calls' time per step and kind, written by merge beside the steps: what `gradscope check` compares
// between two runs step by step, without reading every call of both again.
inline constexpr auto kStepCalls = table(
    {.name = "step_calls",
     .about = "The calls of each step by API and size class, over every rank (derived at merge with the\n"
              "steps; docs/schema.md, \"Derived at merge\").",
     .comment_at = 17,
     .constraint = "PRIMARY KEY (step, api, size_class)",
     .without_rowid = true},
    column<&StepCallTime::step>("step", "INTEGER NOT NULL", "calls.step"),
    column<&StepCallTime::api>("api", "INTEGER NOT NULL", "names.domain 'api'"),
    column<&StepCallTime::size_class>("size_class", "INTEGER NOT NULL",
                                      "floor(log2(bytes)): calls of 2^k up to 2^(k+1) bytes; -1: 0 bytes"),
    column<&StepCallTime::calls>("calls", "INTEGER NOT NULL", "calls of the class in the step"),
    column<&StepCallTime::total_ns>("total_ns", "INTEGER NOT NULL", "their end_ns - start_ns, summed"));

// The workload the tuner weighs (TraceReader::reductionCounts), written by merge: recommend reads these
// rows instead of counting every call.
inline constexpr auto kReductionSizes = table(
    {.name = "reduction_sizes",
     .about = "The reductions of the trace by kind, over every rank, leaving out those on communicators of\n"
              "one rank (derived at merge; docs/schema.md, \"Derived at merge\").",
     .comment_at = 13,
     .constraint = "PRIMARY KEY (api, dtype, op, bytes)",
     .without_rowid = true},
    column<&ReductionCount::api>("api", "INTEGER NOT NULL", "names.domain 'api'"),
    column<&ReductionCount::dtype>("dtype", "INTEGER NOT NULL", "names.domain 'dtype'"),
    column<&ReductionCount::op>("op", "INTEGER NOT NULL", "names.domain 'op'"),
    column<&ReductionCount::bytes>("bytes", "INTEGER NOT NULL", "calls.bytes"),
    column<&ReductionCount::calls>("calls", "INTEGER NOT NULL", "calls of this kind"));

inline constexpr auto kReductionTotals =
    table({.name = "reduction_totals",
           .about = "One row, written by merge with reduction_sizes (a file without it has its reductions\n"
                    "counted from the calls).",
           .comment_at = 19},
          column<&ReductionTotals::steps>("steps", "INTEGER NOT NULL",
                                          "distinct known steps of those reductions; 0: none known"),
          column<&ReductionTotals::ranks>("ranks", "INTEGER NOT NULL", "distinct ranks that issued them"),
          column<&ReductionTotals::single_rank_calls>("single_rank_calls", "INTEGER NOT NULL",
                                                      "reductions left out: on communicators of one rank"));

// Every table, in the order a new file creates them.
inline constexpr std::tuple kAllTables{
    &kNames,       &kRuns,      &kRanks,     &kComms,          &kMeasurements,   &kRecommendations, &kDrops,
    &kCalls,       &kCallTiles, &kGpuCalls,  &kPeerCalls,      &kConsensus,      &kAppliedCalls,    &kSteps,
    &kGpuActivity, &kExposure,  &kStepCalls, &kReductionSizes, &kReductionTotals};

}  // namespace gradscope::storage::detail
