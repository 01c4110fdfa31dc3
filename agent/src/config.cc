#include "config.h"

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

template <typename Bad>
void parseExplore(const Environment& env, ExploreConfig& explore, Bad& bad) {
  const auto integer = [&](const char* name, std::int64_t low, std::int64_t high, auto& target) {
    const char* value = env(name);
    if (value == nullptr) return;
    const auto parsed = parseInteger(value);
    if (!parsed || *parsed < low || *parsed > high)
      bad(name, value, fmt::format("a whole number from {} to {}", low, high));
    else target = static_cast<std::remove_reference_t<decltype(target)>>(*parsed);
  };
  if (const char* value = env("GRADSCOPE_EXPLORE_BUDGET")) {
    std::string_view text = value;
    const bool percent = text.ends_with('%');
    if (percent) text.remove_suffix(1);
    double fraction = 0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), fraction);
    if (percent) fraction /= 100;
    if (ec != std::errc() || ptr != text.data() + text.size() || text.empty() || !(fraction > 0) ||
        fraction > 1)
      bad("GRADSCOPE_EXPLORE_BUDGET", value, "a fraction of the run in (0, 1], e.g. 0.1 or 10%");
    else explore.budget = fraction;
  }
  integer("GRADSCOPE_EXPLORE_SAMPLES", 1, 1000, explore.samples);
  integer("GRADSCOPE_EXPLORE_WARMUP", 0, 1'000'000, explore.warmup);
  integer("GRADSCOPE_EXPLORE_SPACING", 1, 1'000'000, explore.spacing);
  integer("GRADSCOPE_EXPLORE_REPS", 1, 10'000, explore.reps);
  integer("GRADSCOPE_EXPLORE_WARMUP_REPS", 0, 10'000, explore.warmup_reps);
  integer("GRADSCOPE_SHADOW_BYTES", 0, std::int64_t{1} << 40, explore.shadow_bytes);
  if (const char* value = env("GRADSCOPE_EXPLORE_STRATEGIES"); value != nullptr && *value != '\0') {
    std::string_view text = value;
    while (!text.empty()) {
      const std::size_t comma = text.find(',');
      std::string_view item = text.substr(0, comma);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      if (!item.empty()) explore.strategies.emplace_back(item);
      if (comma == std::string_view::npos) break;
      text.remove_prefix(comma + 1);
    }
  }
}

}  // namespace

std::string_view modeName(Mode mode) {
  switch (mode) {
    case Mode::Explore: return "explore";
    case Mode::Apply: return "apply";
    case Mode::Observe: break;
  }
  return "observe";
}

Config parseConfig(const Environment& env, std::vector<std::string>& errors) {
  Config config;
  auto bad = [&](const char* name, std::string_view value, std::string_view accepted) {
    errors.push_back(
        fmt::format("{}='{}' is not valid ({}); unset it or fix the value", name, value, accepted));
  };
  if (const char* value = env("GRADSCOPE_DISABLE")) {
    const std::string_view text = value;
    if (text == "1" || text == "true" || text == "yes") config.disabled = true;
    else if (!(text.empty() || text == "0" || text == "false" || text == "no"))
      bad("GRADSCOPE_DISABLE", text, "1 or 0");
  }
  if (const char* value = env("GRADSCOPE_MODE")) {
    const std::string_view text = value;
    if (text == "observe" || text.empty()) config.mode = Mode::Observe;
    else if (text == "explore") config.mode = Mode::Explore;
    else if (text == "apply") config.mode = Mode::Apply;
    else bad("GRADSCOPE_MODE", text, "observe, explore or apply");
  }
  parseExplore(env, config.explore, bad);
  if (const char* value = env("GRADSCOPE_RECOMMENDATION"); value != nullptr && *value != '\0')
    config.recommendation = value;
  if (const char* value = env("GRADSCOPE_ALLOW_SEMANTIC_CHANGE")) {
    const std::string_view text = value;
    if (text == "1" || text == "true" || text == "yes") config.allow_semantic_change = true;
    else if (!(text.empty() || text == "0" || text == "false" || text == "no"))
      bad("GRADSCOPE_ALLOW_SEMANTIC_CHANGE", text, "1 or 0");
  }
  if (config.mode == Mode::Apply && config.recommendation.empty())
    errors.push_back(
        "GRADSCOPE_MODE=apply needs GRADSCOPE_RECOMMENDATION=FILE (gradscope run --recommendation FILE)");
  if (const char* value = env("GRADSCOPE_OUTPUT"); value != nullptr && *value != '\0') config.output = value;
  if (const char* value = env("GRADSCOPE_COMMAND")) config.command = value;
  if (const char* value = env("GRADSCOPE_FLUSH_INTERVAL")) {
    const auto ns = parseDuration(value);
    if (!ns || *ns < 1'000'000 || *ns > 10'000'000'000)
      bad("GRADSCOPE_FLUSH_INTERVAL", value, "a duration from 1ms to 10s, e.g. 50ms");
    else config.flush_interval_ns = *ns;
  }
  if (const char* value = env("GRADSCOPE_BUFFER_CALLS")) {
    const auto calls = parseInteger(value);
    if (!calls || *calls < 1024 || *calls > (1 << 24) || (*calls & (*calls - 1)) != 0)
      bad("GRADSCOPE_BUFFER_CALLS", value, "a power of two from 1024 to 16777216");
    else config.buffer_calls = static_cast<std::uint32_t>(*calls);
  }
  if (const char* value = env("GRADSCOPE_MAX_CALL_RATE")) {
    const auto rate = parseInteger(value);
    // At least one call per window; at most 10^9 calls/s, which no thread reaches (0 says "all" plainly).
    if (!rate || *rate < 0 || (*rate > 0 && *rate < 1'000'000'000 / kCallRateWindowNs) ||
        *rate > 1'000'000'000)
      bad("GRADSCOPE_MAX_CALL_RATE", value,
          "calls per second per thread from 50 to 1000000000, or 0 for no limit");
    else config.max_call_rate = *rate;
  }
  if (const char* value = env("GRADSCOPE_WRITER_CPUS")) {
    const std::string_view text = value;
    if (text == "any" || text.empty()) config.writer_any_cpu = true;
    else if (text == "rank") config.writer_any_cpu = false;
    else bad("GRADSCOPE_WRITER_CPUS", text, "any or rank");
  }
  if (const char* value = env("GRADSCOPE_STEP_CALLS")) {
    const auto calls = parseInteger(value);
    if (!calls || *calls < 1) bad("GRADSCOPE_STEP_CALLS", value, "a positive number of calls per step");
    else config.step_calls = *calls;
  }
  if (const char* value = env("GRADSCOPE_STEP_NVTX")) {
    if (*value == '\0') bad("GRADSCOPE_STEP_NVTX", value, "the name of an NVTX range");
    else config.step_nvtx = value;
  }
  if (config.step_calls > 0 && !config.step_nvtx.empty())
    errors.push_back("GRADSCOPE_STEP_CALLS and GRADSCOPE_STEP_NVTX are both set; keep one of them");
  config.run_id = runIdFromLauncher(env);
  if (const auto launch = detectLaunch(env)) {
    config.env_rank = launch->rank;
    config.env_world_size = launch->world_size;
  }
  return config;
}

}  // namespace gradscope::agent
