#pragma once

// The CI gate behind `gradscope check`: compares the measurements of a current trace with those of a
// baseline and says which got slower beyond both the tolerance and the measured noise.
//
// Contract:
// - Measurements are matched by key (collective of the API, strategy, dtype, bytes, world size). The
//   samples of a key are its rows' median_ns (one row per rank and call in explore traces, one per point
//   in bench traces).
// - A key regressed only when its median is slower than the baseline's by more than the tolerance AND the
//   difference is beyond the noise: with at least 4 rows on each side, a one-sided Mann–Whitney U test at
//   `alpha`; with fewer (bench traces have one row per point) the sweep rule of docs/tuner.md ("CI gate"):
//   the rows' min..max intervals must not overlap and the key's sweep over sizes must be slower as a whole.
//   Improvements are judged the same way in the other direction and never fail the check.
// - Bad input (a missing or foreign file, no measurements, nothing in common) throws gradscope::Error with
//   one line naming the file and the fix; the CLI turns it into exit code 2.
// - Deterministic: the same two files give the same result, rows in a fixed order.

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "gradscope/common/types.h"

namespace gradscope::tuner {

inline constexpr int kCheckExitOk = 0;
inline constexpr int kCheckExitRegression = 1;
inline constexpr int kCheckExitBadInput = 2;
inline constexpr int kCheckExitRecommendationChanged = 3;

struct CheckOptions {
  double tolerance = 0.05;  // relative: 0.05 = a 5% slower median is still fine
  double alpha = 0.01;      // significance of the noise tests
  // Set to compare the recommendations made from the two traces (--fail-on-change): returns the canonical
  // recommendation JSON of a trace (the versioned file of docs/recommendation-file.md). May throw
  // gradscope::Error, which is bad input. Called for both traces at once, from two threads.
  std::function<std::string(const std::string& trace_path)> recommend_json;
};

struct CheckKey {
  Collective collective = Collective::Unknown;
  std::string strategy;
  DType dtype = DType::Fp32;
  std::int64_t bytes = 0;
  int world = 0;
  friend auto operator<=>(const CheckKey&, const CheckKey&) = default;
};

enum class Verdict : std::uint8_t {
  Regression,   // slower beyond tolerance and noise
  Improvement,  // faster beyond tolerance and noise
  Noisy,        // beyond tolerance, either way, but not beyond the noise
  Unchanged,    // within tolerance
};
std::string_view name(Verdict verdict);  // "regression", "improvement", "noisy", "unchanged"

struct KeyComparison {
  CheckKey key;
  int baseline_rows = 0, current_rows = 0;
  double baseline_median_ns = 0, current_median_ns = 0;  // medians of the rows' median_ns
  double change = 0;                                     // current / baseline - 1
  Verdict verdict = Verdict::Unchanged;
  std::string test;               // "mann-whitney" or "sweep"
  std::optional<double> p_value;  // of the one-sided test in the direction of the change
  std::string reason;             // one line: why this verdict
};

struct NotCompared {
  CheckKey key;
  bool in_baseline = false;  // false: only in the current trace
};

// A rule of the recommendation that differs between the two traces; an empty strategy means the rule
// exists on the other side only.
struct RuleChange {
  std::string api, dtype;
  std::int64_t min_bytes = 0, max_bytes = 0;
  std::string baseline_strategy, current_strategy;
};

// Two observed runs of one job compared step by step (docs/tuner.md, "Comparing two runs"): the step's time
// and its breakdown (storage/step_model.h), and the time per step in each API and size. A figure's samples
// are the medians of kRunBlocks consecutive blocks of the run's steps, judged like a key's rows: beyond
// the tolerance, by more than the tolerance's share of the baseline's step time (a smaller change of any
// figure could not move the step by the tolerance), beyond the run-to-run shift
// (kRunShift) and beyond the noise (Mann–Whitney on the block medians at alpha). A part of the step (or
// an API) that got slower while the step time did not is noisy, not a regression: a shift inside the step.
// One run a side cannot tell a change from the machine's run-to-run shift, which moves every figure of a
// run alike: on the 2-core development VM, 20 repeats of one 400-step job had median steps up to 16% apart
// from the first run's (bench/check_false_alarms.py --observe). A figure is therefore a regression or an
// improvement only beyond kRunShift as well.
inline constexpr int kRunBlocks = 8;
inline constexpr double kRunShift = 0.20;
struct RunComparison {
  std::string what;  // "step time", "compute", "exposed communication", "waiting", "MPI_Allreduce 16 MiB"
  int baseline_steps = 0, current_steps = 0;
  double baseline_ns = 0, current_ns = 0;  // medians over the steps
  double change = 0;                       // current / baseline - 1
  Verdict verdict = Verdict::Unchanged;
  std::optional<double> p_value;
  std::string reason;
};

struct CheckResult {
  std::string baseline_path, current_path;
  double tolerance = 0, alpha = 0;
  // Regressions (largest change first), improvements (largest gain first), noisy, unchanged (key order).
  std::vector<KeyComparison> comparisons;
  // When both traces have steps: their runs compared, in the order of RunComparison::what above (the
  // per-API figures by API and size).
  std::vector<RunComparison> runs;
  std::vector<NotCompared> not_compared;
  bool recommendations_compared = false;
  std::vector<RuleChange> rule_changes;  // ordered by api, dtype, min_bytes, max_bytes

  int count(Verdict verdict) const;  // over comparisons and runs
  // 1 on any regression, else 3 when recommendations were compared and differ, else 0.
  int exitCode() const;
};

// Reads both traces and compares them: their measurements when both have some, their runs when both have
// steps (one of the two is enough). Throws gradscope::Error on bad input (see the contract above).
CheckResult checkTraces(const std::string& baseline_path, const std::string& current_path,
                        const CheckOptions& options = {});

// Outputs. All deterministic for a given result.
void writeCheckText(const CheckResult& result, std::ostream& out);      // terminal: regressions, improvements
void writeCheckMarkdown(const CheckResult& result, std::ostream& out);  // summary for CI job pages
std::string checkJson(const CheckResult& result);                       // docs/tuner.md "CI gate"

// `gradscope check` as a whole, for the command line and its tests: compares, prints the text table to
// `out`, appends the markdown summary to `summary_path` (appending lets CI pass $GITHUB_STEP_SUMMARY) and
// writes the JSON to `json_path` (replaced) when set, and returns the exit code: 0 fine, 1 regression,
// 2 bad input (one line "gradscope: ..." on `err`), 3 recommendation changed with `fail_on_change`.
// With min_step_gain the step-gain gate runs too (and alone without a baseline); its failure is exit 1.
struct CheckCommand {
  std::string baseline, current;
  double tolerance = 0.05;
  std::string summary_path, json_path;
  bool fail_on_change = false;  // needs recommend_json; without one it is bad input
  // --min-step-gain: the current trace is a validated apply run (tuner/validate.h) whose plan must have
  // made the step at least this much faster (0.02 = 2%), measured; a regression (exit 1) otherwise. With
  // it, the baseline may be left out.
  std::optional<double> min_step_gain;
};
int runCheckCommand(const CheckCommand& command,
                    const std::function<std::string(const std::string& trace_path)>& recommend_json,
                    std::ostream& out, std::ostream& err);

// "5%" or "0.05" → 0.05. Throws gradscope::Error for anything else (negative, inf, nan), and for a bare
// number >= 1 (write 5%).
double parseTolerance(std::string_view text);

// One-sided exact/normal-approximation tests used by the check, exposed for tests.
// P(U >= observed) that `current` is stochastically greater than `baseline` (Mann–Whitney U); ties get
// average ranks (normal approximation with tie correction when there are ties or more than 400 pairs).
double mannWhitneyGreater(const std::vector<double>& baseline, const std::vector<double>& current);
// P(W+ >= observed) of the Wilcoxon signed-rank test that the differences are centred above zero; zeros
// are dropped, ties get average ranks; exact.
double wilcoxonGreater(const std::vector<double>& differences);

}  // namespace gradscope::tuner
