#pragma once

// The step, not the call: where each rank's training step goes, who waits for whom, and how much of a
// call's time a faster transport could take off the step (docs/schema.md, "Steps").
//
// Per rank and step (calls.step: marked by the job or detected at merge):
// - span: from the posting (enqueue_ns) of the step's first call to that of the rank's next step's first
//   call; the rank's last step ends where its last call ends. The spans partition the rank's time from
//   its first step on, so a span is what the step cost the rank: time no step claims (an evaluation pass
//   whose calls have no step) belongs to the step before it.
// - exposed: time the rank was blocked in communication, the union of the spans (start_ns..end_ns) of its
//   blocking MPI calls and of the waits that completed its nonblocking ones, clipped to the step's span.
//   compute = span - exposed: everything else the rank did.
// - hidden: nonblocking communication in flight (enqueue_ns..end_ns) while the rank was not blocked.
// - waiting: the part of exposed time before the others arrived: in a collective (the same communicator
//   key and seq on every rank), until the last rank posted it; in a receive, until the matched sender
//   posted its send (storage/peers.h). Times are compared on rank 0's clock (ranks.clock_offset_ns). A
//   faster transport cannot remove waiting; the rank that arrived last is charged it as caused_ns, in its
//   own step that holds its arrival.
//
// GPU ranks (NCCL calls with steps): NCCL calls return to the host at once and run on the GPU, so their
// steps are measured on the GPU, from the kernels of the agent's sampled windows (gpu_activity, schema
// v7): a step spans from its first NCCL call's GPU start to the next step's; exposed = NCCL kernels'
// time not overlapped by compute kernels, hidden = the overlapped part, idle_ns = the GPU ran neither,
// waiting = the exposed time of a call before the last rank's kernel of it started (that rank is charged
// caused_ns). Such a row has StepBasis::Gpu. A GPU step not inside one window keeps its span and calls,
// with StepBasis::GpuUnsampled and the breakdown columns 0.
//
// What it does not see: a blocking send that waits for its receiver (rendezvous) is exposed, not waiting.
// The threads of one rank share its timeline.
//
// Cost: two passes over the calls (TraceReader::forEachCallWithoutGpuFacts), the point-to-point matching of
// peers.h when the trace has such calls, and a sort per rank: O(n log n) time. Memory does not grow with
// the trace's calls but with one rank's: the first pass keeps an entry per collective (who posted it
// last), each rank's distinct steps and the point-to-point calls' postings; the second keeps a rank's MPI
// calls (72 bytes each) until its last call, when its rows are made (the ranks of merged and per-rank files
// keep their calls together; ranks whose calls interleave are held together). The rows themselves are
// 96 bytes per (rank, step); a GPU rank's NCCL calls are all kept (72 bytes each); the calls' time per step
// and kind (StepModel::step_calls) about 64 bytes per (step, api, size class).

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "gradscope/common/types.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/records.h"

namespace gradscope::storage {

// What a call saves on its step when its transport is `faster_ns` faster (negative: slower), given its
// mean transport and exposed times (CallExposure): a faster one saves at most what was exposed; a slower
// one first uses up the slack its hidden part left (a nonblocking call waited for later; a blocking call
// has none) and costs the rest. Negative: the step gets longer.
double stepSavingNs(double faster_ns, double transport_ns, double exposed_ns);

struct StepModel {
  std::vector<StepRecord> steps;       // ordered by rank id, step
  std::vector<CallExposure> exposure;  // ordered by api, dtype, bytes
  // The calls with a step, every rank's, by (step, api, size class), in that order.
  std::vector<StepCallTime> step_calls;
};

// The step model of every rank of `reader`'s trace. Empty when no call has a step. `exposure_of`, when
// set, picks the calls whose exposure is measured (all collectives otherwise): a validated apply run
// measures it on the calls that ran without the plan. It sees calls without their GPU facts other than
// graph_replay (forEachCallWithoutGpuFacts).
StepModel computeStepModel(const TraceReader& reader,
                           const std::function<bool(const CallRecord&)>& exposure_of = {});

// The stored rows (merge writes them) when the file has any, else computeStepModel's.
std::vector<StepRecord> readOrComputeSteps(const TraceReader& reader);
// The stored model when the file has steps rows (merge writes the exposure and the step calls with them;
// a file merged before schema v9 had its rows dropped when it was upgraded), else computeStepModel's: the
// tuner's one read of a merged file's model instead of two of its every call. `parts` leaves out stored
// parts a caller does not use (a computed model has them all).
struct StoredParts {
  bool exposure = true;
  bool step_calls = true;
};
StepModel readOrComputeStepModel(const TraceReader& reader, StoredParts parts = {});

// One step across its ranks.
struct StepTotals {
  std::int64_t step = 0;
  int ranks = 0;
  int measured = 0;          // ranks whose row has a breakdown (not StepBasis::GpuUnsampled)
  int gpu = 0;               // of them, measured on the GPU (StepBasis::Gpu)
  std::int64_t span_ns = 0;  // the longest rank's span: the step's time
  // Means over the measured ranks (0 when none).
  double compute_ns = 0, exposed_ns = 0, waiting_ns = 0, hidden_ns = 0;
  std::int64_t lost_ns = 0;        // every rank's waiting, summed: what the slowest arrivals cost
  std::int64_t last_rank_id = -1;  // the rank charged the most caused_ns; -1 when nobody waited
};
// By step; `rows` as computeStepModel orders them.
std::vector<StepTotals> stepTotals(std::span<const StepRecord> rows);

// Who made the others wait, over the whole run.
struct StragglerRank {
  std::int64_t rank_id = 0;
  std::int64_t steps_last = 0;  // steps in which it was charged the most caused_ns
  std::int64_t caused_ns = 0;
};
struct Stragglers {
  std::int64_t steps = 0;            // steps in which some rank waited
  std::int64_t lost_ns = 0;          // every rank's waiting, summed over the steps
  std::int64_t rank_time_ns = 0;     // every rank's spans, summed
  std::vector<StragglerRank> ranks;  // most steps last first, then most caused
  // The same rank was last in at least three quarters of the steps with waiting (and in 3 or more): a slow
  // rank or node, not noise (which, between two ranks, makes each last about half the time).
  bool persistent = false;
};
Stragglers stragglers(std::span<const StepRecord> rows);

// Where the GPU-measured steps' (StepBasis::Gpu rows of `rows`) compute went, by the job's NVTX ranges
// (gpu_activity.nvtx_range): per range, the time its compute kernels ran inside those steps, summed over
// them (kernels of ranges that ran side by side both count).
struct GpuRangeTime {
  std::string range;  // empty: kernels launched outside any range
  std::int64_t ns = 0;
};
struct GpuRanges {
  std::int64_t steps = 0;            // GPU-measured rank steps
  std::int64_t span_ns = 0;          // their spans, summed
  std::vector<GpuRangeTime> ranges;  // most time first
};
GpuRanges gpuRangeTimes(const TraceReader& reader, std::span<const StepRecord> rows);

}  // namespace gradscope::storage
