#pragma once

// Synchronous or asynchronous (docs/async.md): what dropping the lock-step would buy the job, from its
// step model, and what it would cost, from the errors explore measured on its own gradients.
//
// What it would buy: a replay of the measured steps. Every rank's step t is its measured compute c[r][t]
// (span - exposed) followed by the step's reductions, whose transport R[t] is the median over ranks of
// the exposed time after the last arrival (exposed - waiting). Synchronous: a reduction starts when the
// last rank arrives and every rank waits for its end. async/stale<K> and dga<K> (the same timing): the
// reductions run one after the other on a worker, each starting when every rank has posted it and the
// one before has ended; a rank's step t returns at once unless the reduction of step t-K has not ended,
// and its first K steps wait for their own. The saving is the replayed synchronous step less the
// replayed asynchronous one, so that what the replay leaves out (the worker's own cost, a CPU shared
// with it) biases both alike; the replayed synchronous step is given next to the measured one.
//
// A persistent straggler keeps its lead under bounded staleness: the others run ahead K steps and then
// wait for its reductions all the same, so the replay saves its waiting only where the late rank changes
// from step to step (noise averages out over K steps), and the exposed transport, which overlaps compute.
//
// The interval: the replays' per-step savings (how much sooner the last rank began its next step) in
// blocks of kAsyncChunkSteps consecutive steps, the 2.5th and 97.5th percentiles of the mean block saving
// over 1,000 bootstrap resamples of the blocks (seeded: the same trace gives the same interval); the
// mean of all the blocks is the point estimate, up to the steps after the last whole block.
//
// What it would cost: explore's measurements of the async strategies (rows without repetitions whose
// relative L2 error is what the strategy would have returned against the step's own fp64 sum), and for
// comparison the error of the job's narrowest measured wire precision.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradscope/storage/records.h"
#include "gradscope/storage/step_model.h"
#include "gradscope/tuner/model.h"

namespace gradscope::tuner {

struct AsyncOption {
  std::string strategy;  // "async/stale1", ...
  int staleness = 1;
  double step_ns = 0;                            // replayed, mean per step
  double saving_ns = 0;                          // replayed synchronous step - step_ns (negative: slower)
  double saving_low_ns = 0, saving_high_ns = 0;  // its 95% interval
  // Explore's measurements of it: median and worst relative L2 error per step, over `error_samples`.
  std::optional<double> error_median, error_worst;
  std::int64_t error_samples = 0;
};

// Ranks that share CPUs: the host with the most ranks per usable CPU (the agent records each rank's CPU
// affinity as "cpus" in its statistics), when it has more ranks than CPUs. There a reduction's transport
// is the same CPUs' work (shared-memory copies and the additions), which cannot hide behind compute, and
// the async worker competes for them: the replay's saving is an upper bound.
struct CpuSharing {
  std::string host;
  int ranks = 0;
  int cpus = 0;
};
std::optional<CpuSharing> cpuSharing(const storage::TraceReader& reader);

struct AsyncAnalysis {
  std::string why_not;  // set when there is nothing to analyse (then nothing else is)
  std::int64_t steps = 0;
  int ranks = 0;
  double step_ns = 0;         // measured mean step (the longest rank's span)
  double replay_sync_ns = 0;  // the replay of the synchronous steps, mean per step
  // Waiting per step: the mean over ranks (a rank's loss), averaged over steps, and the worst rank-step.
  double waiting_mean_ns = 0, waiting_worst_ns = 0;
  double waiting_share = 0;                        // waiting_mean_ns / step_ns
  double exposed_ns = 0;                           // mean per step of R[t], the exposed transport
  std::vector<storage::StragglerRank> late_ranks;  // most steps last first (storage::stragglers)
  bool persistent = false;                         // one rank last in 3/4 of them
  std::vector<AsyncOption> options;  // the measured async strategies (else stale1, stale2, dga1), by K
  std::string wire_strategy;         // the narrowest wire measured (fp8 > fp16 > bf16 order of preference)
  std::optional<double> wire_error;  // its median relative error
  std::optional<CpuSharing> shared_cpus;  // given to analyzeAsync: the verdict warns
  std::string verdict;                    // one paragraph (an empty analysis: why_not)
};

inline constexpr std::int64_t kAsyncChunkSteps = 8;

// `rows`: one run's step model (storage::readOrComputeSteps); `measurements`: its measurements
// (loadMeasurements); `rank_label` names a rank id in the verdict (its rank number; "#id" when unset).
// Only steps that every rank has, with a breakdown, are replayed.
AsyncAnalysis analyzeAsync(std::span<const storage::StepRecord> rows,
                           std::span<const MeasurementRow> measurements,
                           const std::function<std::string(std::int64_t)>& rank_label = {},
                           const std::optional<CpuSharing>& shared_cpus = std::nullopt);

// The replay's mean step time with staleness K (0: synchronous). compute[t][r]: rank r's compute in step
// t; transport[t]: the step's exposed transport. Exposed for tests.
double replayStepNs(const std::vector<std::vector<double>>& compute, const std::vector<double>& transport,
                    int staleness);

}  // namespace gradscope::tuner
