#include "gradscope/common/launcher.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <random>
#include <string_view>

#include <fmt/format.h>

namespace gradscope {
namespace {

std::optional<std::int64_t> parseInteger(std::string_view text) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

std::uint64_t fnv1a(std::string_view text, std::uint64_t hash = 0xcbf29ce484222325ull) {
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string formatUuid(std::uint64_t high, std::uint64_t low) {
  // Version 4 / variant 1 bits, so the result looks like any other uuid.
  high = (high & ~0xf000ull) | 0x4000ull;
  low = (low & ~(0xc000ull << 48)) | (0x8000ull << 48);
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", high >> 32, (high >> 16) & 0xffff, high & 0xffff,
                     low >> 48, low & 0xffffffffffffull);
}

std::optional<int> firstInteger(const Environment& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* value = env(name);
    if (value == nullptr) continue;
    const auto parsed = parseInteger(value);
    if (parsed && *parsed >= 0 && *parsed <= INT32_MAX) return static_cast<int>(*parsed);
  }
  return std::nullopt;
}

}  // namespace

Environment processEnvironment() {
  return [](const char* name) { return static_cast<const char*>(std::getenv(name)); };
}

std::optional<int> rankFromLauncher(const Environment& env) {
  return firstInteger(env, {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK", "SLURM_PROCID"});
}

std::optional<int> worldSizeFromLauncher(const Environment& env) {
  return firstInteger(env, {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", "SLURM_NTASKS"});
}

std::string fileNameComponent(std::string_view text) {
  std::string name(text);
  for (char& c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
  // "." and ".." name directories: a component of dots only would climb out of the template's folder.
  if (name.find_first_not_of('.') == std::string::npos) std::replace(name.begin(), name.end(), '.', '_');
  return name.empty() ? "host" : name;
}

std::string expandOutputTemplate(const std::string& pattern, int rank, long pid, const std::string& host) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    switch (pattern[++i]) {
      case 'r': out += std::to_string(rank); break;
      case 'p': out += std::to_string(pid); break;
      case 'h': out += fileNameComponent(host); break;
      case '%': out += '%'; break;
      default: out += '%'; out += pattern[i];
    }
  }
  return out;
}

std::string runIdFromLauncher(const Environment& env) {
  if (const char* value = env("GRADSCOPE_RUN_ID"); value != nullptr && *value != '\0') return value;
  std::string key;
  // Open MPI gives every rank of one job the same random transport key: unique per job.
  for (const char* name : {"OMPI_MCA_orte_precondition_transports", "PMIX_NAMESPACE", "TORCHELASTIC_RUN_ID",
                           "SLURM_JOB_ID", "SLURM_STEP_ID"}) {
    if (const char* value = env(name); value != nullptr && *value != '\0')
      key += fmt::format("{}={};", name, value);
  }
  if (key.empty()) return {};
  return formatUuid(fnv1a(key), fnv1a(key, 0x84222325cbf29ce4ull));
}

std::string spawnedRunId(const std::string& inherited, const Environment& env) {
  std::string key;
  for (const char* name : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"})
    if (const char* value = env(name); value != nullptr && *value != '\0')
      key += fmt::format("{}={};", name, value);
  if (key.empty()) return {};
  key = fmt::format("spawned from {}: {}", inherited, key);
  return formatUuid(fnv1a(key), fnv1a(key, 0x84222325cbf29ce4ull));
}

std::string randomUuid() {
  std::random_device device;
  const std::uint64_t high = (static_cast<std::uint64_t>(device()) << 32) | device();
  const std::uint64_t low = (static_cast<std::uint64_t>(device()) << 32) | device();
  return formatUuid(high, low);
}

std::string hostName() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof buffer - 1) != 0) return "host";
  return fileNameComponent(buffer);
}

}  // namespace gradscope
