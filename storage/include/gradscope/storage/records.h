#pragma once

// Row types of the trace store; storage/src/tables.h declares the column that stores each member.
// Times (*_ns) are nanoseconds relative to the file's time origin, RunInfo::epoch_ns, itself
// nanoseconds since the Unix epoch: relative times fit SQLite's 6-byte integers, which keeps call
// rows small. Ids are assigned by the writer and are only meaningful within one file.

#include <cstdint>
#include <optional>
#include <string>

#include "gradscope/common/types.h"

namespace gradscope::storage {

struct RunInfo {
  std::int64_t id = 0;
  std::string uuid;     // identifies the run across the per-rank files of one job
  std::string command;  // the profiled command line, or the benchmark's
  std::string mode;     // observe | explore | apply | bench | synthetic
  Backend backend = Backend::Unknown;
  int world_size = 0;
  std::string host;  // host of the process that created the file
  std::string config_json = "{}";
  std::string tool_version;   // gradscope version that wrote the file
  std::int64_t epoch_ns = 0;  // time origin of the file: Unix-epoch ns
  std::int64_t start_ns = 0;
  std::optional<std::int64_t> end_ns;  // unset while the run is still being written (or crashed)
};

struct RankInfo {
  std::int64_t id = 0;  // file-local id; equals `rank` in single-run files
  std::int64_t run_id = 0;
  int rank = 0;
  std::string host;
  std::int64_t pid = 0;
  std::string device;                // e.g. "cpu", "cuda:0 NVIDIA H100 80GB HBM3"
  std::int64_t clock_offset_ns = 0;  // add to this rank's times to align them with rank 0
};

struct CommInfo {
  std::int64_t id = 0;
  std::int64_t rank_id = 0;
  std::string key;  // same on every rank of the communicator, e.g. "world" or NCCL's unique id hash
  Backend backend = Backend::Unknown;
  int size = 0;
  int comm_rank = 0;  // this rank's index in the communicator
};

struct CallRecord {
  std::int64_t id = 0;  // 0: let the writer assign the next id
  std::int64_t rank_id = 0;
  std::int64_t comm_id = 0;
  std::int64_t seq = 0;    // per-communicator sequence number: equal on every rank for one collective
  std::int64_t step = -1;  // training step, -1 when unknown
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  ReduceOp op = ReduceOp::None;
  std::int64_t count = 0;       // elements, as passed to the API
  std::int64_t bytes = 0;       // bytes of the send buffer (count × element size)
  std::int64_t enqueue_ns = 0;  // host time the API was called
  std::int64_t start_ns = 0;    // start of the operation (GPU time for NCCL when known)
  std::int64_t end_ns = 0;
  // GPU-side facts, stored in gpu_calls only when any is known.
  std::int64_t stream = 0;  // 0 = no stream (host API); else a per-rank stream index
  int nccl_algo = -1;       // NCCL algorithm enum (REFERENCE.md), -1 unknown
  int nccl_proto = -1;      // NCCL protocol enum, -1 unknown
  int nccl_channels = 0;    // 0 unknown
  // k >= 1: the k-th GPU execution (CUDA graph launch) of the graph-captured call with this comm and seq;
  // its start and end are the GPU's, its enqueue_ns its start. 0: any other call.
  std::int64_t graph_replay = 0;
  // Point-to-point and all-to-all facts, stored in peer_calls only when any is known. Ranks are the
  // peers' ranks in the communicator; -1 unknown or none.
  int dest = -1;                     // a send's destination
  int send_tag = -1;                 // its tag (MPI; NCCL has none)
  int source = -1;                   // a receive's source: the matched one (MPI_ANY_SOURCE resolved)
  int recv_tag = -1;                 // its matched tag
  std::int64_t recv_bytes = -1;      // bytes received (a receive's calls.bytes; MPI_Sendrecv's other half)
  std::int64_t peer_max_bytes = -1;  // all-to-all(v): the most bytes sent to one peer
  std::int64_t peer_min_bytes = -1;  // ... and the least

  bool hasGpuInfo() const {
    return stream != 0 || nccl_algo >= 0 || nccl_proto >= 0 || nccl_channels > 0 || graph_replay > 0;
  }
  bool hasPeerInfo() const {
    return dest >= 0 || source >= 0 || send_tag >= 0 || recv_tag >= 0 || recv_bytes >= 0 ||
           peer_max_bytes >= 0 || peer_min_bytes >= 0;
  }
};

struct Measurement {
  std::int64_t id = 0;
  std::int64_t run_id = 0;
  std::optional<std::int64_t> rank_id;  // unset: aggregated over ranks
  std::optional<std::int64_t> call_id;  // the intercepted call it was timed on (explore), unset for bench
  std::string strategy;                 // e.g. "sum/rs_ag/bf16"
  Api api = Api::Unknown;               // collective measured
  DType dtype = DType::Fp32;
  std::int64_t bytes = 0;
  int world = 1;
  int reps = 0;
  double min_ns = 0, median_ns = 0, p90_ns = 0, max_ns = 0;
  double algbw_gbs = 0, busbw_gbs = 0;  // decimal GB/s, nccl-tests formulas
  std::optional<double> rel_l2_error, max_abs_error, cosine;
  std::int64_t overflow_count = 0;
};

// One per rank and explored reduction (explore mode), grouped by step.
struct ConsensusRecord {
  std::int64_t id = 0;
  std::int64_t rank_id = 0;
  std::int64_t step = 0;      // -1 when the agent did not know it; merge takes call_id's step
  double alpha = 0;           // AdaCons alpha of this rank
  double cosine_to_mean = 0;  // cosine of this rank's gradient to the mean gradient
  double grad_norm = 0;
  double diversity = 0;  // gradient diversity of the step (same on every rank)
  // The explored call whose gradient buffer the row was computed on; unset in rows from before schema
  // v3. Last, so that the positions of the fields before it stay as they were.
  std::optional<std::int64_t> call_id;
};

// Where one rank's training step went (storage/step_model.h): the step's span on the rank's clock and its
// split. exposed_ns + compute_ns = end_ns - start_ns; waiting_ns is part of exposed_ns.
// What a step row's breakdown was measured from.
enum class StepBasis : std::uint8_t {
  Host = 0,          // the host's calls (MPI; storage/step_model.h)
  Gpu = 1,           // the GPU's kernels, the step lying inside a sampled window (NCCL with CUPTI)
  GpuUnsampled = 2,  // a GPU rank's step outside the windows: its span and calls, no breakdown
};

struct StepRecord {
  std::int64_t rank_id = 0;
  std::int64_t step = 0;
  std::int64_t start_ns = 0;    // the posting of the step's first call
  std::int64_t end_ns = 0;      // the posting of the next step's first call; the last step: its last end
  std::int64_t compute_ns = 0;  // not blocked in communication
  std::int64_t exposed_ns = 0;  // blocked in communication calls (a blocking call, or a wait)
  std::int64_t waiting_ns = 0;  // of exposed_ns: before the last rank arrived (or the sender posted)
  std::int64_t hidden_ns = 0;   // nonblocking communication in flight while the rank was not blocked
  std::int64_t caused_ns = 0;   // other ranks' waiting_ns in calls this rank arrived at last
  std::int64_t calls = 0;       // calls posted in the span
  StepBasis basis = StepBasis::Host;
  std::int64_t idle_ns = 0;  // basis Gpu: the GPU ran no kernel (of compute_ns); 0 otherwise
};

// How much of one kind of call a faster transport could take off the step: over the MPI collectives of
// one (api, dtype, bytes), the mean transport time (from the last rank's arrival to the call's end, what
// an explored strategy's measured time stands for) and the mean exposed part of it (blocked after that
// arrival). A call whose transport is d faster ends d earlier, and its step saves min(d, exposed): a
// nonblocking call's hidden part shrinks first.
// Derived at merge from the calls (storage/step_model.h), stored in the exposure table.
struct CallExposure {
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  std::int64_t bytes = 0;
  std::int64_t calls = 0;
  double transport_ns = 0;  // means per call
  double exposed_ns = 0;
};

// The calls of one step by API and size class, over every rank: what `gradscope check` compares step by
// step between two runs. Derived at merge with the steps (storage/step_model.h), stored in step_calls.
struct StepCallTime {
  std::int64_t step = 0;
  Api api = Api::Unknown;
  int size_class = -1;  // floor(log2(bytes)): the calls of [2^k, 2^(k+1)) bytes; -1 for 0 bytes
  std::int64_t calls = 0;
  std::int64_t total_ns = 0;  // their durations (end_ns - start_ns), summed
};

// The reductions of a trace by kind (TraceReader::reductionCounts: what recommend weighs each size by).
// Derived at merge from the calls, stored in reduction_sizes and reduction_totals.
struct ReductionCount {
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  ReduceOp op = ReduceOp::Other;
  std::int64_t bytes = 0;
  std::int64_t calls = 0;
};
struct ReductionTotals {
  std::int64_t steps = 0;              // distinct known steps of those calls; 0 when none is known
  std::int64_t ranks = 0;              // distinct ranks that issued them
  std::int64_t single_rank_calls = 0;  // calls left out: on communicators of one rank
};

// GPU work the agent sampled: CUPTI's kernel records inside its windows (docs/schema.md, "GPU steps").
// Times are Unix-epoch ns in a rank's file, run-relative once merged, like the calls'.
enum class GpuActivityKind : std::uint8_t {
  Window = 0,   // a window: every kernel that started inside it is in the other rows
  Compute = 1,  // kernels other than NCCL's, merged where they overlap or touch
  Nccl = 2,     // NCCL's kernels, the same way
};
struct GpuActivityRecord {
  std::int64_t rank_id = 0;
  GpuActivityKind kind = GpuActivityKind::Window;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t kernels = 0;  // kernels merged into the interval; 0 for a window
  // Compute kernels: the job's innermost NVTX range on the launching thread, when it had one.
  std::optional<std::string> range;
};

// A call that apply mode replaced with a recommended strategy (calls without one ran as issued).
struct AppliedCall {
  std::int64_t call_id = 0;
  std::string strategy;  // what ran instead, e.g. "sum/rs_ag/bf16"
};

struct RecommendationRecord {
  std::int64_t id = 0;
  std::int64_t run_id = 0;
  std::int64_t created_ns = 0;  // Unix-epoch ns
  std::string json;
};

struct DropRecord {
  std::int64_t rank_id = 0;
  std::string kind;  // e.g. "call", "cupti_record"
  std::int64_t count = 0;
};

}  // namespace gradscope::storage
