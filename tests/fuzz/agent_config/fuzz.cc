// libFuzzer target for the agent's configuration (agent/core/config.h): the input is an environment, one
// NAME=VALUE per line (the first definition of a name wins, as in getenv), fed to parseConfig. Whatever
// the values, parseConfig neither crashes nor throws: it reports each bad value as one line in `errors`,
// and a configuration without errors holds only values in the documented ranges (docs/agent.md).
// Run: scripts/fuzz.sh 60 agent_config (docs/reliability.md).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"

namespace {

using namespace gradscope::agent;

void require(bool condition) {
  if (!condition) std::abort();
}

void checkRanges(const Config& config) {
  require(config.flush_interval_ns >= 1'000'000 && config.flush_interval_ns <= 10'000'000'000);
  require(config.buffer_calls >= 1024 && config.buffer_calls <= (1u << 24) &&
          (config.buffer_calls & (config.buffer_calls - 1)) == 0);
  require(config.step_calls >= 0);
  require(config.step_calls == 0 || config.step_nvtx.empty());
  require(config.mode != gradscope::Mode::Apply || !config.recommendation.empty());
  require(!config.output.empty());
  const ExploreConfig& explore = config.explore;
  require(explore.budget > 0 && explore.budget <= 1);
  require(explore.samples >= 1 && explore.samples <= 1000);
  require(explore.warmup >= 0 && explore.spacing >= 1 && explore.reps >= 1 && explore.warmup_reps >= 0);
  require(explore.shadow_bytes >= 0 && explore.shadow_bytes <= (std::int64_t{1} << 40));
  for (const auto& strategy : explore.strategies)
    require(!strategy.empty() && strategy.find(',') == std::string::npos);
  require(!config.env_rank || *config.env_rank >= 0);
  require(!config.env_world_size || *config.env_world_size >= 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::map<std::string, std::string, std::less<>> variables;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  while (!text.empty()) {
    const std::size_t newline = text.find('\n');
    const std::string_view line = text.substr(0, newline);
    const std::size_t equals = line.find('=');
    // getenv's values end at the first NUL, and so do the lookup's.
    if (equals != std::string_view::npos)
      variables.emplace(std::string(line.substr(0, equals)), std::string(line.substr(equals + 1)).c_str());
    if (newline == std::string_view::npos) break;
    text.remove_prefix(newline + 1);
  }
  const Environment env = [&](const char* name) -> const char* {
    const auto found = variables.find(std::string_view(name));
    return found == variables.end() ? nullptr : found->second.c_str();
  };
  std::vector<std::string> errors;
  const Config config = parseConfig(env, errors);
  for (const auto& error : errors) require(!error.empty() && error.find('\n') == std::string::npos);
  if (errors.empty()) checkRanges(config);
  return 0;
}
