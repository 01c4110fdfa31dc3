// libnccl-tuner-gradscope.so: NCCL's tuner interface (nccl_abi/tuner.h) over the rules of config.h, plus
// explore mode and the extension functions of gradscope_tuner.h. docs/nccl-tuner-plugin.md explains
// the behaviour; this file the mechanics.
//
// Life cycle. The configuration is loaded by the first init after no context holds one and shared,
// immutable, by every context created while any is alive; the last finalize drops it, so the next
// communicator reads the file again. NCCL does the same with the whole library: it dlcloses the plugin
// when its last communicator goes. A load logs once (INFO with the rule count, or WARN with the one-line
// error, after which no rule is applied at all: fail open).
//
// Locking. registryMutex guards `registry` (live contexts, for the extension functions) and `shared`
// (the current load). init, finalize and the extension functions take it; getCollInfo never does. While
// holding it we call NCCL's logger, which takes NCCL's own debug lock; NCCL never calls into the plugin
// while holding that lock, so the order registryMutex -> NCCL's lock is the only one.
//
// Hot path (getCollInfo). Each context owns its RuleIndex, built at init for its node and rank counts, so
// a call is a range check, a binary search and a short scan: no lock, no allocation, no strings. NCCL
// serialises calls per communicator; the per-context counters are relaxed atomics only because the
// extension functions read and reset them from other threads. A rule NCCL cannot honour is logged once
// per rule per load (an atomic flag decides who logs), the only string work getCollInfo ever does.

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config.h"
#include "gradscope/common/error.h"
#include "gradscope/common/job_environment.h"
#include "gradscope/common/types.h"
#include "gradscope_tuner.h"
#include "nccl_abi/tuner.h"

namespace gradscope::nccl_tuner {

using namespace nccl_abi;

namespace {

constexpr int kSizeBuckets = 65;  // std::bit_width of a 64-bit byte count: 0..64

// A null logger (a host that passes none) drops the message.
void logLine(ncclDebugLogger_t log, ncclDebugLogLevel level, const std::string& message) noexcept {
  if (log != nullptr) log(level, NCCL_TUNING, __FILE__, __LINE__, "%s", message.c_str());
}

// One load of the configuration.
struct Shared {
  std::string source;  // the file, for messages
  Config config;       // empty when none was named or it was refused
  int explore_repeats = 0;
  // Per rule: "NCCL cannot honour it" was logged. The only mutable part, hence `mutable`.
  mutable std::unique_ptr<std::atomic<bool>[]> warned;

  std::string origin(const Rule& rule) const {
    return config.format == ConfigFormat::Csv ? fmt::format("{}:{}", source, rule.origin)
                                              : fmt::format("{} rule {}", source, rule.origin);
  }
};

struct Context {
  std::uint64_t comm_id = 0;
  Topology topology;
  ncclDebugLogger_t log = nullptr;
  std::shared_ptr<const Shared> shared;
  RuleIndex index;
  std::atomic<int> explore_repeats{0};
  std::atomic<std::uint64_t> explore_calls[kCollectiveCount][kSizeBuckets] = {};
  std::atomic<std::int32_t> last_choice[kCollectiveCount] = {};  // algorithm * 256 + protocol, or -1
  std::atomic<std::uint64_t> calls[kCollectiveCount] = {};
};

std::mutex registryMutex;
std::vector<Context*> registry;        // live contexts, oldest first
std::shared_ptr<const Shared> shared;  // the current load; null when no context is live

// Explore settings from the environment: GRADSCOPE_TUNER_EXPLORE=1 (0 or unset: off) and
// GRADSCOPE_TUNER_EXPLORE_REPEATS=N (default 1). Anything else is logged and leaves explore off.
int exploreFromEnvironment(ncclDebugLogger_t log) {
  const char* explore = std::getenv(gradscope::env::kTunerExplore);
  if (explore == nullptr || *explore == '\0' || std::string_view(explore) == "0") return 0;
  if (std::string_view(explore) != "1") {
    logLine(log, NCCL_LOG_WARN,
            fmt::format("gradscope tuner: {}={} is not 0 or 1; explore mode stays off",
                        gradscope::env::kTunerExplore, explore));
    return 0;
  }
  const char* repeats_text = std::getenv(gradscope::env::kTunerExploreRepeats);
  int repeats = 1;
  if (repeats_text != nullptr && *repeats_text != '\0') {
    char* end = nullptr;
    const long value = std::strtol(repeats_text, &end, 10);
    if (*end != '\0' || value < 1 || value > 1000000) {
      logLine(log, NCCL_LOG_WARN,
              fmt::format(
                  "gradscope tuner: GRADSCOPE_TUNER_EXPLORE_REPEATS={} is not an integer from 1 to 1000000; "
                  "explore mode stays off",
                  repeats_text));
      return 0;
    }
    repeats = static_cast<int>(value);
  }
  logLine(
      log, NCCL_LOG_INFO,
      fmt::format("gradscope tuner: explore mode: every usable algorithm/protocol in turn, {} call{} each, "
                  "per collective and size bucket",
                  repeats, repeats == 1 ? "" : "s"));
  return repeats;
}

// Under registryMutex. Never throws: any failure leaves an empty configuration (fail open).
std::shared_ptr<const Shared> load(ncclDebugLogger_t log) {
  auto result = std::make_shared<Shared>();
  result->explore_repeats = exploreFromEnvironment(log);
  const std::optional<ConfigSource> source = configSourceFromEnvironment();
  if (!source) {
    logLine(
        log, NCCL_LOG_INFO,
        "gradscope tuner: no configuration (GRADSCOPE_TUNER_CONFIG and NCCL_TUNER_CONFIG_FILE unset); NCCL "
        "keeps its own choices");
    return result;
  }
  result->source = source->path;
  try {
    result->config = loadConfig(source->path);
    result->warned = std::make_unique<std::atomic<bool>[]>(result->config.rules.size());
    std::string skipped;
    if (result->config.skipped_rules > 0)
      skipped = fmt::format(" ({} rule{} of other strategies left to the agent)",
                            result->config.skipped_rules, result->config.skipped_rules == 1 ? "" : "s");
    logLine(
        log, NCCL_LOG_INFO,
        fmt::format("gradscope tuner: {} rule{} from {} ({}){}", result->config.rules.size(),
                    result->config.rules.size() == 1 ? "" : "s", source->path, source->variable, skipped));
  } catch (const std::exception& error) {
    result->config = Config{};
    result->warned.reset();
    logLine(log, NCCL_LOG_WARN,
            fmt::format("gradscope tuner: {}; no rule applied, NCCL keeps its own choices", error.what()));
  }
  return result;
}

enum class Refusal { OutsideTable, Unusable };

void warnOnce(const Context& context, std::uint32_t rule_index, Refusal refusal, int num_algo,
              int num_proto) noexcept {
  const Shared& state = *context.shared;
  if (state.warned[rule_index].exchange(true, std::memory_order_relaxed)) return;
  try {
    const Rule& rule = state.config.rules[rule_index];
    const std::string why =
        refusal == Refusal::OutsideTable
            ? fmt::format("outside NCCL's {}x{} cost table", num_algo, num_proto)
            : std::string(
                  "which NCCL cannot use on this communicator (excluded by NCCL_ALGO/NCCL_PROTO or not "
                  "supported)");
    logLine(
        context.log, NCCL_LOG_WARN,
        fmt::format("gradscope tuner: {} asks for {}/{} for {}, {}; NCCL keeps its own choice for such calls",
                    state.origin(rule), ncclTunerAlgoName(rule.algorithm), ncclTunerProtoName(rule.protocol),
                    collectiveName(rule.collective), why));
  } catch (...) {
    // Formatting failed (out of memory): the message is lost, the call is not.
  }
}

void record(Context& context, int collective, std::int32_t choice) noexcept {
  context.last_choice[collective].store(choice, std::memory_order_relaxed);
}

ncclResult_t initContext(void** ctx, std::uint64_t comm_id, std::size_t n_ranks, std::size_t n_nodes,
                         ncclDebugLogger_t log) noexcept {
  if (ctx == nullptr) return ncclSuccess;
  *ctx = nullptr;
  try {
    auto context = std::make_unique<Context>();
    context->comm_id = comm_id;
    context->topology = Topology{n_nodes, n_ranks};
    context->log = log;
    for (auto& choice : context->last_choice) choice.store(-1, std::memory_order_relaxed);
    std::lock_guard lock(registryMutex);
    if (!shared) shared = load(log);
    context->shared = shared;
    try {
      context->index = RuleIndex::build(shared->config.rules, context->topology);
    } catch (const std::exception& error) {
      // parseConfig proved the rules indexable for every topology, so only memory can fail here.
      logLine(log, NCCL_LOG_WARN,
              fmt::format("gradscope tuner: {}: {}; no rule applied to this communicator", shared->source,
                          error.what()));
      context->index = RuleIndex();
    }
    context->explore_repeats.store(shared->explore_repeats, std::memory_order_relaxed);
    registry.push_back(context.get());
    *ctx = context.release();
  } catch (...) {
    // Out of memory: no context. getCollInfo and finalize accept a null one, and NCCL keeps its choices.
    logLine(log, NCCL_LOG_WARN, "gradscope tuner: out of memory at init; NCCL keeps its own choices");
  }
  return ncclSuccess;
}

ncclResult_t finalizeContext(void* ctx) noexcept {
  auto* context = static_cast<Context*>(ctx);
  if (context == nullptr) return ncclSuccess;
  {
    std::lock_guard lock(registryMutex);
    registry.erase(std::remove(registry.begin(), registry.end(), context), registry.end());
    if (registry.empty()) shared.reset();
  }
  delete context;
  return ncclSuccess;
}

// Explore: the (k / repeats)-th usable entry, algorithm-major, modulo the usable count.
void explore(Context& context, int collective, std::size_t n_bytes, float* cost, std::size_t entries,
             std::size_t protos, int repeats) noexcept {
  std::atomic<std::uint64_t>& counter =
      context.explore_calls[collective][std::bit_width(static_cast<std::uint64_t>(n_bytes))];
  const std::uint64_t k = counter.load(std::memory_order_relaxed);
  counter.store(k + 1, std::memory_order_relaxed);
  std::uint64_t usable = 0;
  for (std::size_t i = 0; i < entries; ++i) usable += cost[i] >= 0.0f ? 1 : 0;
  if (usable == 0) {
    record(context, collective, -1);
    return;
  }
  std::uint64_t target = (k / static_cast<std::uint64_t>(repeats)) % usable;
  for (std::size_t i = 0; i < entries; ++i) {
    if (!(cost[i] >= 0.0f)) continue;
    if (target-- == 0) {
      cost[i] = 0.0f;
      record(context, collective, static_cast<std::int32_t>((i / protos) * 256 + i % protos));
      return;
    }
  }
}

ncclResult_t getCollInfo(void* ctx, ncclFunc_t coll_type, std::size_t n_bytes, int num_pipe_ops,
                         float** cost_table, int num_algo, int num_proto, int reg_buff,
                         int* n_channels) noexcept {
  auto* context = static_cast<Context*>(ctx);
  const int collective = static_cast<int>(coll_type);
  if (context == nullptr || collective < 0 || collective >= kCollectiveCount) return ncclSuccess;
  std::atomic<std::uint64_t>& calls = context->calls[collective];
  calls.store(calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (cost_table == nullptr || num_algo <= 0 || num_proto <= 0) {
    record(*context, collective, -1);
    return ncclSuccess;
  }
  // The table is float[num_algo][num_proto] passed as float**: entry (a, p) is at a * num_proto + p.
  float* const cost = reinterpret_cast<float*>(cost_table);
  const auto protos = static_cast<std::size_t>(num_proto);
  const std::size_t entries = static_cast<std::size_t>(num_algo) * protos;

  const int repeats = context->explore_repeats.load(std::memory_order_relaxed);
  if (repeats > 0) {
    explore(*context, collective, n_bytes, cost, entries, protos, repeats);
    return ncclSuccess;
  }

  const RuleIndex::Entry* rule = context->index.find(collective, n_bytes, num_pipe_ops, reg_buff);
  if (rule == nullptr) {
    record(*context, collective, -1);
    return ncclSuccess;
  }
  if (rule->algorithm >= num_algo || rule->protocol >= num_proto) {
    record(*context, collective, -1);
    warnOnce(*context, rule->rule, Refusal::OutsideTable, num_algo, num_proto);
    return ncclSuccess;
  }
  float& entry =
      cost[static_cast<std::size_t>(rule->algorithm) * protos + static_cast<std::size_t>(rule->protocol)];
  if (!(entry >= 0.0f)) {
    record(*context, collective, -1);
    warnOnce(*context, rule->rule, Refusal::Unusable, num_algo, num_proto);
    return ncclSuccess;
  }
  entry = 0.0f;  // NCCL picks the smallest entry >= 0
  if (rule->channels > 0 && n_channels != nullptr) *n_channels = rule->channels;
  record(*context, collective, rule->algorithm * 256 + rule->protocol);
  return ncclSuccess;
}

ncclResult_t getCollInfoV3(void* ctx, ncclFunc_t coll_type, std::size_t n_bytes, int num_pipe_ops,
                           float** cost_table, int num_algo, int num_proto, int* n_channels) noexcept {
  // v3 does not say whether buffers are registered: only rules with regBuff -1 can match.
  return getCollInfo(ctx, coll_type, n_bytes, num_pipe_ops, cost_table, num_algo, num_proto, kAny,
                     n_channels);
}

ncclResult_t initV5(void** ctx, std::uint64_t comm_id, std::size_t n_ranks, std::size_t n_nodes,
                    ncclDebugLogger_t log, ncclNvlDomainInfo_v5_t* /*nvl_domain_info*/,
                    ncclTunerConstants_v5_t* /*constants*/) noexcept {
  return initContext(ctx, comm_id, n_ranks, n_nodes, log);
}

ncclResult_t initV4(std::size_t n_ranks, std::size_t n_nodes, ncclDebugLogger_t log, void** ctx) noexcept {
  return initContext(ctx, 0, n_ranks, n_nodes, log);
}

}  // namespace
}  // namespace gradscope::nccl_tuner

using namespace gradscope::nccl_tuner;

// The symbols NCCL looks for (and the extension functions): the only ones the library exports
// (CMakeLists.txt: hidden visibility and a version script).
extern "C" {

__attribute__((visibility("default"))) extern const ncclTuner_v5_t ncclTunerPlugin_v5;
__attribute__((visibility("default"))) extern const ncclTuner_v4_t ncclTunerPlugin_v4;
__attribute__((visibility("default"))) extern const ncclTuner_v3_t ncclTunerPlugin_v3;

const ncclTuner_v5_t ncclTunerPlugin_v5 = {"gradscope", initV5, getCollInfo, finalizeContext};
const ncclTuner_v4_t ncclTunerPlugin_v4 = {"gradscope", initV4, getCollInfo, finalizeContext};
const ncclTuner_v3_t ncclTunerPlugin_v3 = {"gradscope", initV4, getCollInfoV3, finalizeContext};

__attribute__((visibility("default"))) int gradscope_tuner_explore_v1(uint64_t commId, int repeats) {
  if (repeats < 0) return -1;
  std::lock_guard lock(registryMutex);
  int switched = 0;
  for (Context* context : registry) {
    if (commId != 0 && context->comm_id != commId) continue;
    // Counts first, then the switch: a getCollInfo racing with us sees either the old mode or fresh counts.
    for (auto& per_collective : context->explore_calls)
      for (auto& counter : per_collective) counter.store(0, std::memory_order_relaxed);
    context->explore_repeats.store(repeats, std::memory_order_relaxed);
    ++switched;
  }
  return switched;
}

__attribute__((visibility("default"))) int gradscope_tuner_last_choice_v1(uint64_t commId, int collType,
                                                                          int* algorithm, int* protocol,
                                                                          uint64_t* calls) {
  if (collType < 0 || collType >= kCollectiveCount) return -1;
  std::lock_guard lock(registryMutex);
  const auto found = std::find_if(registry.begin(), registry.end(),
                                  [&](const Context* context) { return context->comm_id == commId; });
  if (found == registry.end()) return -1;
  const std::int32_t choice = (*found)->last_choice[collType].load(std::memory_order_relaxed);
  if (algorithm != nullptr) *algorithm = choice >= 0 ? choice / 256 : -1;
  if (protocol != nullptr) *protocol = choice >= 0 ? choice % 256 : -1;
  if (calls != nullptr) *calls = (*found)->calls[collType].load(std::memory_order_relaxed);
  return choice >= 0 ? 1 : 0;
}

}  // extern "C"
