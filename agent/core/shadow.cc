#include "core/shadow.h"

#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <set>

#include "core/clock.h"
#include "core/recorder.h"
#include "gradscope/common/strategy_name.h"

namespace gradscope::agent {

constinit thread_local bool t_internal __attribute__((tls_model("initial-exec"))) = false;
std::atomic<bool> g_shadow_hooks{false};

namespace {

// Per backend (Backend::Mpi, Backend::Nccl).
constexpr int kBackends = 3;
int slotOf(Backend backend) {
  return static_cast<int>(backend) % kBackends;
}
std::atomic<ShadowMode> g_mode[kBackends] = {};
ShadowMode g_started_mode[kBackends] = {};  // what start agreed on (g_mode is Off again after stop)
std::atomic<Extension*> g_extension[kBackends] = {};
std::atomic<bool> g_prepares[kBackends] = {};
std::mutex g_start_mutex;
std::atomic<ExplorePlan*> g_plan{nullptr};
std::atomic<bool> g_call_sites{false};

bool isAsync(const std::string& strategy) {
  const auto name = parseStrategyName(strategy);
  return name && name->aggregator == Aggregator::Async;
}
std::optional<Recommendation> g_recommendation;
std::int64_t g_started_ns = 0;
std::atomic<std::int64_t> g_spent_ns{0};

std::mutex g_results_mutex;
std::vector<LinkSample> g_links;  // what start() timed (guarded by g_results_mutex)
std::vector<ExploreRecord> g_results;
constexpr std::size_t kMaxQueuedResults = 4096;

std::mutex g_reported_mutex;
std::set<std::string> g_reported;

struct Counters {
  std::atomic<std::int64_t> explored{0}, skipped_budget{0}, skipped_other{0}, applied{0}, apply_failed{0};
  std::atomic<std::int64_t> followed{0};
  std::atomic<std::int64_t> untouched[kUntouchedReasons] = {};
} g_counters;

// The extension lives next to the agent: the directory of the object this function is in.
std::string extensionPath(Backend backend) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&extensionPath), &info) == 0 || info.dli_fname == nullptr) return {};
  const char* file = backend == Backend::Mpi    ? "libgradscope-agent-mpi.so"
                     : backend == Backend::Nccl ? "libgradscope-agent-nccl.so"
                                                : "";
  return (std::filesystem::path(info.dli_fname).parent_path() / file).string();
}

void logFromExtension(const char* line) {
  logLine(line);
}

void ownThread() {
  t_internal = true;
}

constexpr AgentHooks kHooks{&logFromExtension, &ownThread};

// This rank's reason not to take part in apply mode, or empty.
std::string loadRecommendationFile(Backend backend, int world_size) {
  const Config& cfg = config();
  try {
    Recommendation recommendation = loadRecommendation(cfg.recommendation);
    if (recommendation.backend != backend)
      return fmt::format("{}: made for a {} job, not {} (make it from a trace of this job)",
                         cfg.recommendation, name(recommendation.backend), name(backend));
    if (recommendation.world_size && *recommendation.world_size != world_size)
      return fmt::format(
          "{}: made for {} ranks, this job has {} (make it from a trace of a run at this size)",
          cfg.recommendation, *recommendation.world_size, world_size);
    if (!cfg.allow_semantic_change)
      for (const RecommendationRule& rule : recommendation.rules)
        if (rule.error_class == ErrorClass::Semantic)
          return fmt::format(
              "{}: rule for {} {} uses {}, which changes what the job computes; pass --allow-semantic-change "
              "(GRADSCOPE_ALLOW_SEMANTIC_CHANGE=1) to apply it",
              cfg.recommendation, name(rule.api), name(rule.dtype), rule.strategy);
    // CallEvent::strategy names an applied call's rule in 16 bits.
    if (recommendation.rules.size() >= 0xffff)
      return fmt::format("{}: {} rules, more than apply mode takes (65534)", cfg.recommendation,
                         recommendation.rules.size());
    g_recommendation = std::move(recommendation);
    return {};
  } catch (const std::exception& error) {
    return error.what();
  }
}

}  // namespace

// ---- ExplorePlan ------------------------------------------------------------------------------------

// Occurrences between tries of a key the budget refused, at most: a refusal costs one small all-reduce
// (tens of µs: at 32, osu_allreduce spent its whole budget on refusals of sub-µs calls), and a job's
// later steps must still get their turn once the run has grown (doubling finds the budget within twice
// the time it took to accrue).
constexpr int kMaxBackoff = 1024;

int ExplorePlan::bucketOf(std::int64_t bytes) {
  return bytes <= 0 ? -1 : static_cast<int>(std::bit_width(static_cast<std::uint64_t>(bytes))) - 1;
}

std::uint64_t ExplorePlan::key(std::uint32_t comm, Api api, DType dtype, std::int64_t bytes) {
  return (std::uint64_t{comm} << 32) | (std::uint64_t{static_cast<std::uint8_t>(api)} << 16) |
         (std::uint64_t{static_cast<std::uint8_t>(dtype)} << 8) | static_cast<std::uint8_t>(bucketOf(bytes));
}

bool ExplorePlan::sample(std::uint32_t comm, Api api, DType dtype, ReduceOp op, std::int64_t bytes) {
  if (op != ReduceOp::Sum || bytes <= 0 || bytes > settings_.max_bytes) return false;
  if (!explorableDType(dtype)) return false;
  const std::lock_guard lock(mutex_);
  auto it = keys_.find(key(comm, api, dtype, bytes));
  if (it == keys_.end()) {
    if (keys_.size() >= kMaxKeys) return false;
    KeyState fresh;
    fresh.next = settings_.warmup;
    it = keys_.emplace(key(comm, api, dtype, bytes), fresh).first;
  }
  KeyState& state = it->second;
  const std::int64_t occurrence = state.occurrences++;
  state.weight += std::max(bytes, kLatencyBytes);
  state.last_seen = ++calls_[comm];
  if (state.explored >= settings_.samples || occurrence < state.next) return false;
  if (state.deferrals < kMaxDeferrals && defers(comm, state)) {
    ++state.deferrals;
    return false;
  }
  return true;
}

bool ExplorePlan::defers(std::uint32_t comm, const KeyState& state) const {
  const std::int64_t now = calls_.at(comm);
  for (const auto& [other_key, other] : keys_) {
    if ((other_key >> 32) != comm || &other == &state) continue;
    if (other.waiting && other.explored < settings_.samples && now - other.last_seen <= kRecentCalls &&
        other.weight >= 2 * state.weight)
      return true;
  }
  return false;
}

void ExplorePlan::done(std::uint32_t comm, Api api, DType dtype, std::int64_t bytes, bool explored,
                       bool over_budget) {
  const std::lock_guard lock(mutex_);
  const auto it = keys_.find(key(comm, api, dtype, bytes));
  if (it == keys_.end()) return;
  KeyState& state = it->second;
  state.waiting = !explored && over_budget;
  if (explored) {
    ++state.explored;
    state.backoff = 1;
    state.next = state.occurrences + settings_.spacing - 1;
  } else {
    state.next = state.occurrences + state.backoff - 1;
    state.backoff = std::min(state.backoff * 2, kMaxBackoff);
  }
}

// ---- start and stop ---------------------------------------------------------------------------------

ShadowMode shadowMode(Backend backend) {
  return g_mode[slotOf(backend)].load(std::memory_order_relaxed);
}

void startShadow(Backend backend, int world_size, bool recording) {
  const Config& cfg = config();
  if (cfg.disabled || cfg.mode == Mode::Observe || configHasErrors()) return;
  const std::lock_guard start_lock(g_start_mutex);
  const int slot = slotOf(backend);
  static bool tried[kBackends] = {};  // once per backend, loaded or not
  if (tried[slot]) return;
  tried[slot] = true;
  // Every rank gets here with the same configuration; a rank whose extension does not load cannot
  // agree with the others, so its failure must be the same everywhere: a missing library is (one
  // installation), and the message says so.
  const std::string path = extensionPath(backend);
  void* library = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    log("{} mode needs {} ({}); the job's {} calls run in observe mode", modeName(cfg.mode), path,
        why != nullptr ? why : "not found", name(backend));
    return;
  }
  using Entry = Extension* (*)(int, const AgentHooks*);
  const auto entry = reinterpret_cast<Entry>(dlsym(library, "gradscope_agent_extension"));
  Extension* extension = entry != nullptr ? entry(kExtensionAbi, &kHooks) : nullptr;
  if (extension == nullptr) {
    log("{} is from another gradscope version; {} mode is off, the job runs in observe mode", path,
        modeName(cfg.mode));
    return;
  }
  g_extension[slot].store(extension, std::memory_order_release);
  g_shadow_hooks.store(true, std::memory_order_release);

  std::string local_problem;
  if (cfg.mode == Mode::Apply) local_problem = loadRecommendationFile(backend, world_size);
  else if (!recording) local_problem = "this rank is not recording (see the line above)";
  ExploreSettings settings;
  settings.reps = cfg.explore.reps;
  settings.warmup_reps = cfg.explore.warmup_reps;
  settings.strategies = cfg.explore.strategies;
  settings.shadow_bytes = cfg.mode == Mode::Explore ? static_cast<std::size_t>(cfg.explore.shadow_bytes) : 0;
  settings.applying = cfg.mode == Mode::Apply;
  settings.probe_links = cfg.mode == Mode::Explore && cfg.explore.links != 0;
  if (g_recommendation)
    for (const RecommendationRule& rule : g_recommendation->rules)
      settings.apply_strategies.push_back(rule.strategy);
  const auto& explored = settings.strategies;
  const bool sites =
      cfg.mode == Mode::Apply
          ? std::any_of(settings.apply_strategies.begin(), settings.apply_strategies.end(), isAsync)
          : explored.empty() || std::any_of(explored.begin(), explored.end(), isAsync);
  if (sites) g_call_sites.store(true, std::memory_order_relaxed);
  std::string error;
  bool started = false;
  const std::int64_t start_ns = monotonicNs();
  {
    InternalScope internal;
    started = extension->start(settings, local_problem, error);
  }
  if (started) {
    std::lock_guard lock(g_results_mutex);
    g_links = extension->links();
  }
  // Preparing exploration (the agreement, mapping the arena) is part of its cost: the budget counts it.
  if (cfg.mode == Mode::Explore) g_spent_ns.fetch_add(monotonicNs() - start_ns, std::memory_order_relaxed);
  if (!started) {
    if (cfg.mode == Mode::Apply && local_problem.empty()) g_recommendation.reset();  // loaded here, unused
    // MPI: only the lowest rank that failed has a message: one line per job, not per rank.
    if (!error.empty())
      log("{}; {} mode is off for {} calls, {}", error, modeName(cfg.mode), name(backend),
          cfg.mode == Mode::Apply ? "they run untouched" : "they are observed only");
    return;
  }
  if (cfg.mode == Mode::Explore && g_plan.load(std::memory_order_relaxed) == nullptr) {
    // The arena holds the input copy, the result, the fp64 reference (8 bytes per element, at most 4×
    // an fp16 input): the largest call explored is a quarter of it for fp32.
    ExplorePlan::Settings plan;
    plan.samples = cfg.explore.samples;
    plan.warmup = cfg.explore.warmup;
    plan.spacing = cfg.explore.spacing;
    plan.max_bytes = cfg.explore.shadow_bytes / 4;
    g_plan.store(new ExplorePlan(plan), std::memory_order_release);
  }
  if (g_started_ns == 0) g_started_ns = start_ns;
  const ShadowMode mode = cfg.mode == Mode::Explore ? ShadowMode::Explore : ShadowMode::Apply;
  g_started_mode[slot] = mode;
  g_prepares[slot].store(extension->preparesAtCreation(), std::memory_order_relaxed);
  g_mode[slot].store(mode, std::memory_order_release);
}

bool callSitesWanted() {
  return g_call_sites.load(std::memory_order_relaxed);
}

bool applyNeedsMpiThreads() {
  const Config& cfg = config();
  if (cfg.disabled || cfg.mode != Mode::Apply || configHasErrors() || cfg.recommendation.empty())
    return false;
  try {
    const Recommendation recommendation = loadRecommendation(cfg.recommendation);
    return std::any_of(recommendation.rules.begin(), recommendation.rules.end(),
                       [](const RecommendationRule& rule) { return isAsync(rule.strategy); });
  } catch (const std::exception&) {
    return false;
  }
}

void stopShadow(Backend backend) {
  Extension* const extension = g_extension[slotOf(backend)].load(std::memory_order_acquire);
  if (extension == nullptr) return;
  g_mode[slotOf(backend)].store(ShadowMode::Off, std::memory_order_release);
  InternalScope internal;
  extension->stop();
}

Extension* extension(Backend backend) {
  return g_extension[slotOf(backend)].load(std::memory_order_acquire);
}

bool preparesAtCreation(Backend backend) {
  return g_prepares[slotOf(backend)].load(std::memory_order_relaxed);
}

std::string shadowModeName() {
  for (const ShadowMode mode : g_started_mode) {
    if (mode == ShadowMode::Explore) return "explore";
    if (mode == ShadowMode::Apply) return "apply";
  }
  return "off";
}

// ---- explore ----------------------------------------------------------------------------------------

ExplorePlan& explorePlan() {
  return *g_plan.load(std::memory_order_acquire);
}

BudgetState budgetNow(double call_ns) {
  BudgetState budget;
  budget.call_ns = call_ns;
  budget.spent_ns = static_cast<double>(g_spent_ns.load(std::memory_order_relaxed));
  budget.elapsed_ns = static_cast<double>(monotonicNs() - g_started_ns);
  budget.fraction = config().explore.budget;
  return budget;
}

void addSpentNs(std::int64_t ns) {
  g_spent_ns.fetch_add(ns, std::memory_order_relaxed);
}

void submitExplore(ExploreRecord record) {
  // A follow that did not happen (over budget, no room) only ends the following: nothing to say.
  if (record.follow && !record.result.explored) return;
  if (record.result.explored)
    (record.follow ? g_counters.followed : g_counters.explored).fetch_add(1, std::memory_order_relaxed);
  else if (record.result.over_budget) g_counters.skipped_budget.fetch_add(1, std::memory_order_relaxed);
  else if (g_counters.skipped_other.fetch_add(1, std::memory_order_relaxed) == 0)
    log("explore: an exploration was skipped: {} (said once; the job is not affected)",
        record.result.skipped);
  if (!record.result.explored) return;
  const std::lock_guard lock(g_results_mutex);
  if (g_results.size() >= kMaxQueuedResults) {
    countDrop(DropKind::ExploreResult);
    return;
  }
  g_results.push_back(std::move(record));
}

std::vector<ExploreRecord> takeExploreRecords() {
  const std::lock_guard lock(g_results_mutex);
  std::vector<ExploreRecord> out;
  out.swap(g_results);
  return out;
}

// ---- apply ------------------------------------------------------------------------------------------

const RecommendationRule* applyRuleFor(Api api, DType dtype, ReduceOp op, std::int64_t bytes, int world,
                                       std::int64_t seq, std::int64_t step) {
  if (!g_recommendation || op != ReduceOp::Sum) return nullptr;
  if (const std::int64_t window = config().validate_window; window > 0) {
    const std::int64_t unit = g_step_marker == StepMarker::None ? seq : step;
    if (unit < 0 || (unit / window) % 2 == 1) return nullptr;
  }
  return g_recommendation->match(api, dtype, bytes, world);
}

void reportApplyFailure(const std::string& strategy, DType dtype, const std::string& error) {
  {
    const std::lock_guard lock(g_reported_mutex);
    if (!g_reported.insert(fmt::format("{}/{}", strategy, name(dtype))).second) return;
  }
  log("apply: {} on {} calls: {}; those calls run untouched", strategy, name(dtype), error);
}

void countApplied(bool ok) {
  (ok ? g_counters.applied : g_counters.apply_failed).fetch_add(1, std::memory_order_relaxed);
}

std::uint16_t appliedStrategyIndex(const RecommendationRule& rule) {
  return static_cast<std::uint16_t>(&rule - g_recommendation->rules.data() + 1);
}

std::string appliedStrategyName(std::uint16_t index) {
  if (!g_recommendation || index == 0 || index > g_recommendation->rules.size()) return {};
  return g_recommendation->rules[index - 1].strategy;
}

void countUntouched(Untouched reason) {
  g_counters.untouched[static_cast<std::size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
}

ShadowStats shadowStats() {
  ShadowStats stats;
  stats.explored = g_counters.explored.load(std::memory_order_relaxed);
  stats.followed = g_counters.followed.load(std::memory_order_relaxed);
  stats.skipped_budget = g_counters.skipped_budget.load(std::memory_order_relaxed);
  stats.skipped_other = g_counters.skipped_other.load(std::memory_order_relaxed);
  stats.applied = g_counters.applied.load(std::memory_order_relaxed);
  stats.apply_failed = g_counters.apply_failed.load(std::memory_order_relaxed);
  stats.spent_ns = g_spent_ns.load(std::memory_order_relaxed);
  {
    std::lock_guard lock(g_results_mutex);
    stats.links = g_links;
  }
  for (std::size_t i = 0; i < kUntouchedReasons; ++i)
    stats.untouched[i] = g_counters.untouched[i].load(std::memory_order_relaxed);
  return stats;
}

}  // namespace gradscope::agent
