#pragma once

// The recommender: which aggregation strategy each all-reduce of a job should use, judged on the job's
// own workload (the reductions it issues per step, by size) with the models of model.h.
//
// Rules it follows (docs/tuner.md "Recommendations"):
// - the baseline is sum/native, what the job does without gradscope;
// - lossless strategies only, unless max_rel_error > 0 allows lossy ones whose worst measured relative L2
//   error is within it; AdaCons and AdaSum only with allow_semantic_change;
// - a strategy replaces the baseline for a size only when the high end of its 95% interval is below the
//   low end of the baseline's: an overlap is noise, not a gain;
// - neighbouring sizes with the same winner become one rule covering their byte range;
// - async strategies (async.h) are a choice for the whole job, weighed on the step: with
//   allow_semantic_change, an async strategy whose error explore measured (within max_rel_error when it is
//   above 0) replaces every rule when the low end of its replayed step saving beats the synchronous plan's
//   saving on the step (MPI and NCCL alike).
// Errors are gradscope::Error with one line saying what is missing and how to get it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/common/recommendation.h"
#include "gradscope/storage/step_model.h"
#include "gradscope/tuner/async.h"
#include "gradscope/tuner/model.h"

namespace gradscope::tuner {

// One kind of reduction the job issues: an all-reduce with op sum of `bytes` bytes.
struct WorkloadEntry {
  Api api = Api::Unknown;
  DType dtype = DType::Fp32;
  std::int64_t bytes = 0;
  double calls_per_step = 0;  // per rank: calls / (ranks * steps), or per run when steps are unknown
  // A size class (recommend() groups a workload of very many distinct sizes): the smallest and largest
  // size in it, `bytes` being their call-weighted mean. 0: the entry is the one size `bytes`.
  std::int64_t min_bytes = 0, max_bytes = 0;
};

// What the recommender needs from the trace files, read once (readInputs) or built by tests.
struct Inputs {
  std::vector<storage::RunInfo> runs;  // of every file; ids are file-local, uuids identify runs
  std::vector<MeasurementRow> measurements;
  std::vector<WorkloadEntry> workload;        // ordered by api, dtype, bytes
  bool steps_known = false;                   // workload counts are per step (else per run)
  std::int64_t other_reductions = 0;          // reduction calls no strategy applies to (other APIs or ops)
  std::optional<double> mean_cosine_to_mean;  // over the consensus rows, when there are any
  // The step model (storage/step_model.h) of the traces that have steps: the median step's time (its
  // longest rank's span) and how much of each kind of collective is exposed. Unset / empty without steps.
  std::optional<double> step_ns;
  std::vector<storage::CallExposure> exposure;  // ordered by api, dtype, bytes
  // Synchronous or asynchronous (async.h), of the file with the most steps that can be replayed.
  std::optional<AsyncAnalysis> async;
};

// Reads every file: runs, measurements, the calls (TraceReader::reductionCounts: counts per size, stored
// by merge or from one narrow scan, so a trace of millions of calls costs neither memory nor much time)
// and the consensus rows.
// Throws gradscope::Error for a file that cannot be opened.
Inputs readInputs(const std::vector<std::string>& paths);

struct RecommendOptions {
  double max_rel_error = 0;  // 0: lossless strategies only
  bool allow_semantic_change = false;
  std::optional<int> world;       // predict for this world size (what-if)
  std::string created;            // ISO 8601 UTC; empty: now (tests set it for reproducible output)
  bool keep_predictions = false;  // fill Report::predictions (the `predictions` format)
};

// Every model's prediction at one workload size (RecommendOptions::keep_predictions).
struct StrategyPrediction {
  Api api = Api::Unknown;
  DType dtype = DType::Fp32;
  std::int64_t bytes = 0;
  std::string strategy;
  bool allowed = false;  // the budget allows it (the baseline always is)
  Prediction prediction;
};

// One workload size and what the recommender predicts for it.
struct SizeRow {
  Api api = Api::Unknown;
  DType dtype = DType::Fp32;
  std::int64_t bytes = 0;                     // the size predicted (a size class's call-weighted mean)
  std::int64_t min_bytes = 0, max_bytes = 0;  // the sizes the row stands for (both `bytes` for one size)
  double calls_per_step = 0;
  std::optional<TimeInterval> baseline;  // unset: no sum/native model can predict this size
  std::string best;                      // winning strategy; the baseline's name when nothing beats it
  std::optional<TimeInterval> best_time;
  bool extrapolated = false;  // a prediction used here lies outside the measured sizes
  double gain = 0;            // 1 - best / baseline (medians)
  // What the choice saves on the step, per step: calls_per_step × min(baseline - best, the exposed time
  // of such a call in the job); unset when the trace has no step model for this size.
  std::optional<double> step_saving_ns;
};

struct FusionAdvice {
  std::int64_t bucket_bytes = 0;  // a power of two MiB, at least 1 MiB
  double small_share = 0;         // share of the baseline's time per step spent in calls under 64 KiB
  double gain_ns = 0;             // predicted saving per step from fusing those calls into buckets
  std::optional<double>
      step_gain_ns;  // of it, what the step saves (the calls' exposed share); unset: unknown
};

struct Report {
  int world = 0;
  bool world_predicted = false;             // world is a what-if (--world), not measured
  bool workload_from_measurements = false;  // no observed calls: one call of each measured size
  bool steps_known = false;
  std::optional<TimeInterval> baseline_per_step;  // summed over the workload (intervals added up)
  std::optional<TimeInterval> choice_per_step;
  std::vector<SizeRow> sizes;
  std::vector<std::string> reasoning;  // one sentence per line
  std::optional<std::string> consensus_note;
  std::optional<FusionAdvice> fusion;
  // The choice on the step: the median step's time and what the choice saves on it per step (the sizes'
  // step_saving_ns summed). Unset without a step model.
  std::optional<double> step_ns;
  std::optional<double> step_saving_ns;
  std::vector<StrategyPrediction> predictions;  // only with RecommendOptions::keep_predictions
  std::optional<AsyncAnalysis> async;           // Inputs::async, when there was one
  std::string async_choice;                     // the async strategy the rules use; empty: none
};

struct Result {
  Recommendation recommendation;
  Report report;
};

inline constexpr std::string_view kBaselineStrategy = "sum/native";
// Calls below this size count as small for the fusion advice: below it latency dominates all-reduce time
// on every interconnect we measured.
inline constexpr std::int64_t kSmallCallBytes = 64 << 10;

// Makes the recommendation. Throws gradscope::Error when there are no measurements, when the measurements
// are at several world sizes and options.world is unset, or when options.world cannot be predicted.
Result recommend(const Inputs& inputs, const RecommendOptions& options);

// Whether `strategy` is a name from DESIGN.md "Strategy names" that applies to an all-reduce: one that
// parseStrategyName (common/strategy_name.h) accepts, so that the tuner never recommends a strategy the
// agent's apply mode would refuse.
bool isKnownStrategy(std::string_view strategy);

}  // namespace gradscope::tuner
