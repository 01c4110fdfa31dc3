#pragma once

// `gradscope check`: the CI gate (docs/tuner.md "CI gate"). The comparison and its outputs live in the
// tuner library (gradscope/tuner/check.h); this is what main() calls after parsing the arguments.

#include <functional>
#include <ostream>
#include <string>

namespace gradscope::cli {

struct CheckCommandOptions {
  std::string baseline;          // --baseline BASE.db
  std::string current;           // CURRENT.db
  std::string tolerance = "5%";  // --tolerance, as the user wrote it: "5%" or "0.05"
  std::string summary_path;      // --summary FILE.md (appended to)
  std::string json_path;         // --json FILE (replaced)
  bool fail_on_change = false;   // --fail-on-change
  std::string min_step_gain;     // --min-step-gain, as written: "2%" or "0.02"; empty: no gate
};

// The canonical recommendation JSON of a trace, as `gradscope recommend FILE --format json` writes it.
using RecommendJson = std::function<std::string(const std::string& trace_path)>;

// Runs the check and returns the process exit code: 0 fine, 1 regression, 2 bad input (one line on
// `err`), 3 recommendation changed (only with fail_on_change, which needs `recommend_json`).
int runCheck(const CheckCommandOptions& options, const RecommendJson& recommend_json, std::ostream& out,
             std::ostream& err);

}  // namespace gradscope::cli
