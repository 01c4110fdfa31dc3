#include "core/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace gradscope::agent {
namespace {

std::optional<std::int64_t> parseInteger(std::string_view text) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

// "50ms", "2s", "500us", "100" (ms). Nanoseconds, or nullopt.
std::optional<std::int64_t> parseDuration(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const auto number = parseInteger(text.substr(0, digits));
  if (!number) return std::nullopt;
  const std::string_view unit = text.substr(digits);
  std::int64_t scale = 0;
  if (unit.empty() || unit == "ms") scale = 1'000'000;
  else if (unit == "s") scale = 1'000'000'000;
  else if (unit == "us") scale = 1'000;
  else return std::nullopt;
  if (*number > INT64_MAX / scale) return std::nullopt;
  return *number * scale;
}

// The errors of one parse: every invalid value is one line naming the variable, the value and what is
// accepted.
struct Errors {
  std::vector<std::string>& lines;
  void bad(const char* name, std::string_view value, std::string_view accepted) const {
    lines.push_back(
        fmt::format("{}='{}' is not valid ({}); unset it or fix the value", name, value, accepted));
  }
};

std::optional<bool> parseFlag(std::string_view text) {
  if (text == "1" || text == "true" || text == "yes") return true;
  if (text.empty() || text == "0" || text == "false" || text == "no") return false;
  return std::nullopt;
}

template <typename Target>
void readInteger(const char* name, std::string_view value, std::int64_t low, std::int64_t high,
                 Target& target, const Errors& errors) {
  const auto parsed = parseInteger(value);
  if (!parsed || *parsed < low || *parsed > high)
    errors.bad(name, value, fmt::format("a whole number from {} to {}", low, high));
  else target = static_cast<Target>(*parsed);
}

// One reader per AgentConfig row of job_environment.def, named read<ID>, run in the table's order when the
// variable is set. A row without its reader does not compile; a reader without its row is an unused
// function (an error under -Werror).

void readDisable(std::string_view value, Config& config, const Errors& errors) {
  const auto flag = parseFlag(value);
  if (!flag) errors.bad(env::kDisable, value, "1 or 0");
  else if (*flag) config.disabled = true;
}

void readMode(std::string_view value, Config& config, const Errors& errors) {
  if (value.empty()) config.mode = Mode::Observe;
  else if (const auto mode = parseMode(value)) config.mode = *mode;
  else errors.bad(env::kMode, value, "observe, explore or apply");
}

void readExploreBudget(std::string_view value, Config& config, const Errors& errors) {
  std::string_view text = value;
  const bool percent = text.ends_with('%');
  if (percent) text.remove_suffix(1);
  double fraction = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), fraction);
  if (percent) fraction /= 100;
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty() || !(fraction > 0) ||
      fraction > 1)
    errors.bad(env::kExploreBudget, value, "a fraction of the run in (0, 1], e.g. 0.1 or 10%");
  else config.explore.budget = fraction;
}

void readExploreSamples(std::string_view value, Config& config, const Errors& errors) {
  readInteger(env::kExploreSamples, value, 1, 1000, config.explore.samples, errors);
}

void readExploreWarmup(std::string_view value, Config& config, const Errors& errors) {
  readInteger(env::kExploreWarmup, value, 0, 1'000'000, config.explore.warmup, errors);
}

void readExploreSpacing(std::string_view value, Config& config, const Errors& errors) {
  readInteger(env::kExploreSpacing, value, 1, 1'000'000, config.explore.spacing, errors);
}

void readExploreReps(std::string_view value, Config& config, const Errors& errors) {
  readInteger(env::kExploreReps, value, 1, 10'000, config.explore.reps, errors);
}

void readExploreWarmupReps(std::string_view value, Config& config, const Errors& errors) {
  readInteger(env::kExploreWarmupReps, value, 0, 10'000, config.explore.warmup_reps, errors);
}

void readShadowBytes(std::string_view value, Config& config, const Errors& errors) {
  readInteger(env::kShadowBytes, value, 0, std::int64_t{1} << 40, config.explore.shadow_bytes, errors);
}

void readExploreStrategies(std::string_view value, Config& config, const Errors&) {
  std::string_view text = value;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) config.explore.strategies.emplace_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
}

void readExploreLinks(std::string_view value, Config& config, const Errors& errors) {
  readInteger(env::kExploreLinks, value, 0, 1, config.explore.links, errors);
}

void readRecommendation(std::string_view value, Config& config, const Errors&) {
  if (!value.empty()) config.recommendation = value;
}

void readAllowSemanticChange(std::string_view value, Config& config, const Errors& errors) {
  const auto flag = parseFlag(value);
  if (!flag) errors.bad(env::kAllowSemanticChange, value, "1 or 0");
  else if (*flag) config.allow_semantic_change = true;
}

void readOutput(std::string_view value, Config& config, const Errors&) {
  if (!value.empty()) config.output = value;
}

void readCommand(std::string_view value, Config& config, const Errors&) {
  config.command = value;
}

void readFlushInterval(std::string_view value, Config& config, const Errors& errors) {
  const auto ns = parseDuration(value);
  if (!ns || *ns < 1'000'000 || *ns > 10'000'000'000)
    errors.bad(env::kFlushInterval, value, "a duration from 1ms to 10s, e.g. 50ms");
  else config.flush_interval_ns = *ns;
}

void readBufferCalls(std::string_view value, Config& config, const Errors& errors) {
  const auto calls = parseInteger(value);
  if (!calls || *calls < 1024 || *calls > (1 << 24) || (*calls & (*calls - 1)) != 0)
    errors.bad(env::kBufferCalls, value, "a power of two from 1024 to 16777216");
  else config.buffer_calls = static_cast<std::uint32_t>(*calls);
}

void readMaxCallRate(std::string_view value, Config& config, const Errors& errors) {
  const auto rate = parseInteger(value);
  // At least one call per window; at most 10^9 calls/s, which no thread reaches (0 says "all" plainly).
  if (!rate || *rate < 0 || (*rate > 0 && *rate < 1'000'000'000 / kCallRateWindowNs) || *rate > 1'000'000'000)
    errors.bad(env::kMaxCallRate, value,
               "calls per second per thread from 10 to 1000000000, or 0 for no limit");
  else config.max_call_rate = *rate;
}

void readWriterCpus(std::string_view value, Config& config, const Errors& errors) {
  if (value == "any" || value.empty()) config.writer_any_cpu = true;
  else if (value == "rank") config.writer_any_cpu = false;
  else errors.bad(env::kWriterCpus, value, "any or rank");
}

void readStepCalls(std::string_view value, Config& config, const Errors& errors) {
  const auto calls = parseInteger(value);
  if (!calls || *calls < 1) errors.bad(env::kStepCalls, value, "a positive number of calls per step");
  else config.step_calls = *calls;
}

void readValidateWindow(std::string_view value, Config& config, const Errors& errors) {
  const auto calls = parseInteger(value);
  if (!calls || *calls < 0 || *calls > 1'000'000'000)
    errors.bad(env::kValidateWindow, value,
               "calls per window per communicator from 1 to 1000000000, or 0 for off");
  else config.validate_window = *calls;
}

void readStepNvtx(std::string_view value, Config& config, const Errors& errors) {
  if (value.empty()) errors.bad(env::kStepNvtx, value, "the name of an NVTX range");
  else config.step_nvtx = value;
}

// "off", "S/N" (steps) or "D/P" (durations, e.g. 1s/20s); a value sets its form and keeps the other's
// default.
void readGpuWindows(std::string_view value, Config& config, const Errors& errors) {
  constexpr std::string_view kAccepted =
      "off, STEPS/EVERY (e.g. 4/100: steps 1-4 of every 100 marked steps) or DURATION/PERIOD (e.g. 1s/20s, "
      "the period at most 1h)";
  if (value == "off") {
    config.gpu_windows.off = true;
    return;
  }
  const std::size_t slash = value.find('/');
  if (slash == std::string_view::npos) return errors.bad(env::kGpuWindows, value, kAccepted);
  const std::string_view first = value.substr(0, slash), second = value.substr(slash + 1);
  if (const auto steps = parseInteger(first), every = parseInteger(second); steps && every) {
    if (*steps < 1 || *every < *steps || *every > 1'000'000'000)
      return errors.bad(env::kGpuWindows, value, kAccepted);
    config.gpu_windows.steps = *steps;
    config.gpu_windows.every_steps = *every;
    return;
  }
  const auto time = parseDuration(first), period = parseDuration(second);
  if (!time || !period || *time < 1'000'000 || *period < *time || *period > 3'600'000'000'000)
    return errors.bad(env::kGpuWindows, value, kAccepted);
  config.gpu_windows.time_ns = *time;
  config.gpu_windows.every_ns = *period;
}

}  // namespace

Config parseConfig(const Environment& env, std::vector<std::string>& errors) {
  Config config;
  const Errors report{errors};
#define GS_JOB_ENV(ID, NAME, READ_BY, AUDIENCE) GS_READ_##READ_BY(ID)
#define GS_READ_AgentConfig(ID) \
  if (const char* value = env(env::k##ID)) read##ID(value, config, report);
#define GS_READ_Agent(ID)
#define GS_READ_Launcher(ID)
#define GS_READ_Methods(ID)
#define GS_READ_TunerPlugin(ID)
#define GS_READ_Run(ID)
#define GS_READ_Foreign(ID)
#include "gradscope/common/job_environment.def"
#undef GS_JOB_ENV
#undef GS_READ_AgentConfig
#undef GS_READ_Agent
#undef GS_READ_Launcher
#undef GS_READ_Methods
#undef GS_READ_TunerPlugin
#undef GS_READ_Run
#undef GS_READ_Foreign
  if (config.mode == Mode::Apply && config.recommendation.empty())
    errors.push_back(fmt::format("{}=apply needs {}=FILE (gradscope run --recommendation FILE)", env::kMode,
                                 env::kRecommendation));
  if (config.validate_window > 0 && config.mode != Mode::Apply)
    errors.push_back(fmt::format("{} needs {}=apply (gradscope run --mode apply --validate N)",
                                 env::kValidateWindow, env::kMode));
  if (config.step_calls > 0 && !config.step_nvtx.empty())
    errors.push_back(
        fmt::format("{} and {} are both set; keep one of them", env::kStepCalls, env::kStepNvtx));
  config.run_id = runIdFromLauncher(env);
  if (const auto launch = detectLaunch(env)) {
    config.env_rank = launch->rank;
    config.env_world_size = launch->world_size;
  }
  return config;
}

}  // namespace gradscope::agent
