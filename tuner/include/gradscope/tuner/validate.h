#pragma once

// Proof in the job (docs/tuner.md, "Proof in the job"). `gradscope run --mode apply --validate N` has
// the agent follow the plan in alternate windows (GRADSCOPE_VALIDATE_WINDOW: even windows, the plan; odd,
// the job's own calls), the same on every rank: of N steps, switched between two steps, when the job marks
// its steps (GRADSCOPE_STEP_CALLS, GRADSCOPE_STEP_NVTX; the run's configuration says so), else of N calls
// of each communicator (seq / N). This compares the steps run
// with the plan against those run without, and the change measured against the one the plan predicts.
//
// - A step is *with* the plan when every one of its calls that a rule of the plan covers ran in an even
//   window, *without* when every one ran in an odd window; a step with calls of both (a window boundary
//   fell inside it), or with none, is left out. Consecutive steps of one kind are a *window*: steps in
//   one window share the machine's state, so the window, not the step, is the unit of evidence.
// - The first window of each kind is left out (apply mode's first uses of a strategy allocate and warm
//   up). Measured change = mean step time with / mean step time without − 1; its 95% interval is the
//   2.5th..97.5th percentile of the same ratio over 2,000 bootstrap resamples of the windows (seeded: the
//   same file gives the same interval).
// - Predicted change: for each rule, its calls per step (in the steps without the plan) × what a call
//   whose transport is baseline − predicted faster saves on the step, given how such calls were exposed in
//   those steps (storage::stepSavingNs: at most the exposed time; a slower strategy costs what the call's
//   hidden slack cannot absorb), summed, over the mean step time without; its interval from the rule's
//   intervals (baseline low − predicted high .. baseline high − predicted low). Rules acting inside NCCL
//   (sum/nccl.*, through the tuner plugin) are not switched by windows and are left out of both. A plan
//   with a predicted step saving of its own (Recommendation::step_saving: async rules) is compared with
//   that instead. An async site restarts synchronously after every window without the plan (its first K
//   steps), which the measured change includes.

#include <cstdint>
#include <optional>
#include <string>

#include "gradscope/common/recommendation.h"
#include "gradscope/storage/reader.h"

namespace gradscope::tuner {

struct Validation {
  std::int64_t window_calls = 0;  // N of --validate: calls of each communicator, or steps (window_steps)
  bool window_steps = false;  // the job marked its steps: the windows were N steps, switched between steps
  std::int64_t steps_with = 0, steps_without = 0, steps_left_out = 0;
  int windows_with = 0, windows_without = 0;  // counted, the left-out first ones excluded
  double step_with_ns = 0, step_without_ns = 0;
  double change = 0, change_low = 0, change_high = 0;  // with / without - 1 (negative: faster)
  std::optional<double> predicted_change, predicted_low, predicted_high;
  bool operator==(const Validation&) const = default;
};

// The validation of the merged trace of a run made with GRADSCOPE_VALIDATE_WINDOW = `window_calls` and
// `plan`; unset when it has fewer than 2 windows of each kind to compare (the run was too short for its
// window: say so).
std::optional<Validation> validateRun(const storage::TraceReader& reader, const Recommendation& plan,
                                      std::int64_t window_calls);

// One line: the measured change and its interval, the prediction and whether the measurement falls in it.
std::string describe(const Validation& validation);

// As stored in the trace (runs.config_json "validation") and back; parseValidation returns nothing for
// text that is not a validation.
std::string validationJson(const Validation& validation);
std::optional<Validation> parseValidation(const std::string& json_text);
// The validation stored in a run's configuration, if any.
std::optional<Validation> storedValidation(const storage::RunInfo& run);

}  // namespace gradscope::tuner
