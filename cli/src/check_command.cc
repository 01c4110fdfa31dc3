// gradscope check: argument conversion only; the check itself is gradscope::tuner::runCheckCommand.

#include "gradscope/cli/check.h"
#include "gradscope/common/error.h"
#include "gradscope/tuner/check.h"

namespace gradscope::cli {

int runCheck(const CheckCommandOptions& options, const RecommendJson& recommend_json, std::ostream& out,
             std::ostream& err) {
  tuner::CheckCommand command;
  try {
    command.tolerance = tuner::parseTolerance(options.tolerance);
  } catch (const Error& error) {
    err << "gradscope: " << error.what() << "\n";
    return tuner::kCheckExitBadInput;
  }
  try {
    if (!options.min_step_gain.empty()) command.min_step_gain = tuner::parseTolerance(options.min_step_gain);
  } catch (const Error&) {
    err << "gradscope: --min-step-gain '" << options.min_step_gain
        << "' is not a percentage or fraction of the step (write e.g. 2% or 0.02)\n";
    return tuner::kCheckExitBadInput;
  }
  command.baseline = options.baseline;
  command.current = options.current;
  command.summary_path = options.summary_path;
  command.json_path = options.json_path;
  command.fail_on_change = options.fail_on_change;
  return tuner::runCheckCommand(command, recommend_json, out, err);
}

}  // namespace gradscope::cli
