#include "gradscope/common/launcher.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string_view>

#include <fmt/format.h>

#include "gradscope/common/job_environment.h"

namespace gradscope {
namespace {

// The value of `name`, or nullptr when it is unset or empty.
const char* valueOf(const Environment& env, const char* name) {
  const char* value = env(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

std::optional<int> nonNegativeInt(const char* text) {
  if (text == nullptr) return std::nullopt;
  const std::string_view view(text);
  int value = 0;
  const auto [end, error] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (error != std::errc() || end != view.data() + view.size() || value < 0) return std::nullopt;
  return value;
}

bool fileNameCharacter(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
}

// FNV-1a with a final avalanche (MurmurHash3's fmix64), so that close keys give far-apart uuids.
std::uint64_t hashKey(std::string_view key, std::uint64_t seed) {
  std::uint64_t hash = 0xcbf29ce484222325ull ^ seed;
  for (const char c : key) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  hash ^= hash >> 33;
  hash *= 0xff51afd7ed558ccdull;
  hash ^= hash >> 33;
  hash *= 0xc4ceb9fe1a85ec53ull;
  return hash ^ (hash >> 33);
}

// RFC 9562 layout: the version in the high nibble of byte 6, the variant (binary 10) in byte 8.
std::string makeUuid(std::uint64_t high, std::uint64_t low, unsigned version) {
  high = (high & ~0xf000ull) | (static_cast<std::uint64_t>(version) << 12);
  low = (low & ~(0xc000ull << 48)) | (0x8000ull << 48);
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", high >> 32, (high >> 16) & 0xffff, high & 0xffff,
                     low >> 48, low & 0xffffffffffffull);
}

}  // namespace

Environment processEnvironment() {
  return [](const char* name) { return static_cast<const char*>(std::getenv(name)); };
}

Environment environmentOf(const std::map<std::string, std::string>& variables) {
  return [&variables](const char* name) -> const char* {
    const auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  };
}

std::optional<Launch> detectLaunch(const Environment& env) {
  // The rule and why bare RANK is not in it: launcher.h.
  struct Source {
    const char* rank;
    const char* size;
    const char* required;  // must be set as well (nullptr: nothing else)
  };
  static constexpr Source kSources[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", nullptr},
      {"PMI_RANK", "PMI_SIZE", nullptr},
      {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_ID"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID"},
      {"RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"},
  };
  for (const Source& source : kSources) {
    const auto rank = nonNegativeInt(valueOf(env, source.rank));
    const auto size = nonNegativeInt(valueOf(env, source.size));
    if (!rank || !size || *size < 1 || *rank >= *size) continue;
    if (source.required != nullptr && valueOf(env, source.required) == nullptr) continue;
    Launch launch{*rank, *size, {}};
    if (const char* ns = valueOf(env, "PMIX_NAMESPACE")) launch.job_id = ns;
    else if (const char* ompi = valueOf(env, "OMPI_MCA_ess_base_jobid")) launch.job_id = ompi;
    else if (const char* job = valueOf(env, "SLURM_JOB_ID"); job && valueOf(env, "SLURM_STEP_ID"))
      launch.job_id = fmt::format("{}.{}", job, valueOf(env, "SLURM_STEP_ID"));
    else if (const char* torch = valueOf(env, "TORCHELASTIC_RUN_ID");
             torch && std::string_view(torch) != "none")
      launch.job_id = torch;
    for (char& c : launch.job_id)
      if (!fileNameCharacter(c)) c = '_';
    return launch;
  }
  return std::nullopt;
}

std::string fileNameComponent(std::string_view text) {
  std::string name(text);
  for (char& c : name)
    if (!fileNameCharacter(c)) c = '_';
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
  if (const char* value = valueOf(env, env::kRunId)) return value;
  std::string key;
  // Open MPI gives every rank of one job the same random transport key: unique per job.
  for (const char* name : {"OMPI_MCA_orte_precondition_transports", "PMIX_NAMESPACE", "TORCHELASTIC_RUN_ID",
                           "SLURM_JOB_ID", "SLURM_STEP_ID"}) {
    if (const char* value = env(name); value != nullptr && *value != '\0')
      key += fmt::format("{}={};", name, value);
  }
  return key.empty() ? std::string() : uuidFromKey(key);
}

std::string spawnedRunId(const std::string& inherited, const Environment& env) {
  std::string key;
  for (const char* name : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"})
    if (const char* value = env(name); value != nullptr && *value != '\0')
      key += fmt::format("{}={};", name, value);
  if (key.empty()) return {};
  return uuidFromKey(fmt::format("spawned from {}: {}", inherited, key));
}

std::string randomUuid() {
  std::random_device device;
  const auto draw = [&device] { return (static_cast<std::uint64_t>(device()) << 32) | device(); };
  const std::uint64_t high = draw();
  return makeUuid(high, draw(), 4);
}

std::string uuidFromKey(std::string_view key) {
  // Version 8 ("custom"): a hash, not a name-based (v5, SHA-1) uuid; 122 bits are ample for job ids.
  return makeUuid(hashKey(key, 0), hashKey(key, 0x9e3779b97f4a7c15ull), 8);
}

std::string hostName() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof buffer - 1) != 0) return "host";
  return fileNameComponent(buffer);
}

std::string processCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  std::replace(raw.begin(), raw.end(), '\0', ' ');
  return raw;
}

}  // namespace gradscope
