#include "extensions/strategy_extension.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gradscope/common/error.h"
#include "gradscope/common/job_environment.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/element.h"
#include "gradscope/methods/error_metrics.h"

namespace gradscope::agent {
namespace {

using Clock = std::chrono::steady_clock;

// The async strategies whose errors explore measures when no names are given (docs/async.md).
constexpr const char* kDefaultAsyncStrategies[] = {"async/stale1", "async/stale2", "async/dga1"};

// "async/..." in any letter case, without parsing the rest (apply asks at every call).
bool isAsyncName(const std::string& strategy) {
  constexpr std::string_view kPrefix = "async/";
  if (strategy.size() < kPrefix.size()) return false;
  for (std::size_t i = 0; i < kPrefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(strategy[i])) != kPrefix[i]) return false;
  return true;
}

// Device -> host and host -> device where the two sides differ (nothing to do for host memory).
void toHost(comm::Communicator& comm, void* host, const void* source, std::size_t bytes) {
  if (host != source && bytes != 0) comm.local().download(host, source, bytes);
}
void fromHost(comm::Communicator& comm, void* target, const void* host, std::size_t bytes) {
  if (host != target && bytes != 0) comm.local().upload(target, host, bytes);
}

}  // namespace

// Host values, the maximum over ranks, in place: one small all-reduce (through a device buffer where the
// communicator's memory is the GPU's).
void StrategyExtension::maxOverRanks(comm::Communicator& comm, CommState& state, double* values,
                                     std::size_t n) {
  if (comm.memory() == comm::Memory::Host) {
    comm.allReduce(values, values, n, comm::Element{DType::Fp64}, ReduceOp::Max);
    return;
  }
  const std::size_t bytes = n * sizeof(double);
  if (state.agreement.size() < bytes) state.agreement = comm.local().allocate(bytes);
  comm.local().upload(state.agreement.get(), values, bytes);
  comm.allReduce(state.agreement.get(), state.agreement.get(), n, comm::Element{DType::Fp64}, ReduceOp::Max);
  comm.local().download(values, state.agreement.get(), bytes);
}

// ---- SliceArena -------------------------------------------------------------------------------------------

bool SliceArena::mapHost(std::size_t bytes) {
  if (bytes == 0) return true;
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return false;
  assign(static_cast<std::byte*>(memory), bytes);
  return true;
}

std::byte* SliceArena::take(std::size_t bytes) {
  bytes = alignUp(std::max<std::size_t>(bytes, 1));
  const std::lock_guard lock(mutex_);
  std::size_t offset = 0;
  for (auto it = used_.begin();; ++it) {
    const std::size_t end = it == used_.end() ? size_ : it->first;
    if (end >= offset && end - offset >= bytes) {
      used_.emplace(offset, bytes);
      return base_ + offset;
    }
    if (it == used_.end()) return nullptr;
    offset = it->first + it->second;
  }
}

void SliceArena::give(std::byte* slice) {
  if (slice == nullptr) return;
  const std::lock_guard lock(mutex_);
  used_.erase(static_cast<std::size_t>(slice - base_));
}

// ---- Capture ----------------------------------------------------------------------------------------------

std::size_t Capture::baseBytes(std::size_t input_bytes, std::size_t count) {
  return SliceArena::alignUp(input_bytes) * 2 + SliceArena::alignUp(count * sizeof(double));
}

std::size_t Capture::gatherBytes(std::size_t count, int ranks) {
  return SliceArena::alignUp(count * sizeof(float) * static_cast<std::size_t>(ranks));
}

Capture Capture::layout(std::byte* base, std::byte* host_base, std::size_t input_bytes, std::size_t count,
                        bool with_gather) {
  const auto side = [&](std::byte* start) {
    Side s;
    s.input = start;
    s.result = start + SliceArena::alignUp(input_bytes);
    s.reference = reinterpret_cast<double*>(start + 2 * SliceArena::alignUp(input_bytes));
    s.gathered = with_gather ? reinterpret_cast<float*>(start + baseBytes(input_bytes, count)) : nullptr;
    return s;
  };
  Capture capture;
  capture.slice = base;
  capture.host_slice = host_base;
  capture.comm = side(base);
  capture.host = host_base != nullptr ? side(host_base) : capture.comm;
  return capture;
}

// ---- StrategyExtension ----------------------------------------------------------------------------------

bool StrategyExtension::start(const ExploreSettings& settings, const std::string& local_problem,
                              std::string& error) {
  settings_ = settings;
  // Names that do not parse are left out on every rank (the same names everywhere); said once. Async names
  // are not built: explore measures their errors from the sums of a site's consecutive steps.
  settings_.strategies.clear();
  async_names_.clear();
  std::vector<std::string> unknown;
  for (const std::string& text : settings.strategies) {
    if (const auto name = parseStrategyName(text); !name) unknown.push_back(text);
    else if (name->aggregator == Aggregator::Async) async_names_.push_back(*name);
    else settings_.strategies.push_back(text);
  }
  if (!settings.strategies.empty() && settings_.strategies.empty()) settings_.strategies = {"sum/native"};
  if (settings.strategies.empty())
    for (const char* text : kDefaultAsyncStrategies) async_names_.push_back(*parseStrategyName(text));
  async_depth_ = 0;
  for (const StrategyName& name : async_names_) async_depth_ = std::max(async_depth_, name.staleness);
  std::string local_error = local_problem;
  if (local_error.empty() && !reserve(settings.shadow_bytes))
    local_error = fmt::format("cannot allocate the {}-byte shadow arena (GRADSCOPE_SHADOW_BYTES)",
                              settings.shadow_bytes);
  try {
    started_ = agreeToStart(local_error, error);
  } catch (const std::exception& failure) {
    error = failure.what();
    started_ = false;
  }
  if (started_ && !unknown.empty() && speaksForAll())
    log(fmt::format(
        "{}: {} not strategy names (DESIGN: aggregator/transport[/wire], e.g. sum/rs_ag/bf16); left out",
        env::kExploreStrategies, fmt::join(unknown, ", ")));
  return started_;
}

bool StrategyExtension::join(const ShadowCall& call, std::string& error) {
  CommState& state = stateOf(call.comm_index);
  const std::lock_guard lock(state.mutex);
  try {
    duplicateOf(state, call);
    return true;
  } catch (const std::exception& failure) {
    error = failure.what();
    return false;
  }
}

void StrategyExtension::prepare(const ShadowCall& call) {
  CommState& state = stateOf(call.comm_index);
  const std::lock_guard lock(state.mutex);
  try {
    duplicateOf(state, call, /*at_creation=*/true);
  } catch (const std::exception&) {
    // duplicateOf() kept the reason: every later call on the communicator passes through.
  }
}

bool StrategyExtension::capture(const ShadowCall& call, const void* input) {
  CommState& state = stateOf(call.comm_index);
  const std::lock_guard lock(state.mutex);
  give(state.capture);
  state.capture = {};
  if (!started_ || !state.refused_all.empty() || !explorableDType(call.dtype)) return false;
  const std::size_t bytes = call.count * sizeOf(call.dtype);
  if (input == nullptr && bytes != 0) return false;  // the job's call fails in the library, not here
  try {
    if (!take(call, bytes, call.dtype == DType::Fp32, state.capture)) return false;
    copyInput(call, state.capture.comm.input, input, bytes);
  } catch (const std::exception& failure) {
    // Agreed on in explore(): this rank reports no capture, and every rank skips.
    give(state.capture);
    state.capture = {};
    return false;
  }
  return true;
}

ExploreResult StrategyExtension::explore(const ShadowCall& call, const BudgetState& budget) {
  CommState& state = stateOf(call.comm_index);
  const std::lock_guard lock(state.mutex);
  ExploreResult result;
  Capture capture = state.capture;
  state.capture = {};
  const auto started = Clock::now();
  try {
    comm::Communicator& comm = duplicateOf(state, call);
    // 1. Agreement: did every rank capture (and with room for the adaptive references), and does the
    //    budget allow it on every rank? Maxima over ranks, so every rank decides alike.
    //    One all-reduce (max) of seven values: a skipped exploration costs the job one small collective.
    //    The exploration's predicted cost: every strategy's runs at up to twice the job's own call time,
    //    and, for the engine strategies, a one-off setup where this rank has not paid it yet (they open
    //    an MPI_T session, about 0.2 s with Open MPI 4.1, or split one NCCL communicator each). That call
    //    time is the smallest over the ranks: the others include waiting for the last rank to arrive,
    //    which the strategies, run right after the job's call has lined the ranks up, do not pay; and on
    //    each rank the quickest of the calls of this size its explorations saw (a retry after a refusal
    //    sees another), since one call may have waited for much more.
    //    Where the job's call time is not known here (a nonblocking MPI call explored before it runs;
    //    an NCCL call, which returns once enqueued), the last exploration's cost per strategy and byte on
    //    this communicator stands in, the largest over the ranks.
    //    What fits the budget runs: every strategy, or the plain ones alone while the engines' setup does
    //    not fit yet (a short job would otherwise learn nothing: 0.2 s is a tenth of a 2 s run).
    const auto [plain_count, engine_count] = expectedStrategies(state, comm, call.dtype);
    const bool setup_paid_before = engines_prepared_.load(std::memory_order_relaxed);
    const double setup_ns = engine_count > 0 && !setup_paid_before ? kEngineSetupNs : 0.0;
    const std::size_t byte_count = call.count * sizeOf(call.dtype);
    const double bytes = static_cast<double>(byte_count);
    double& quickest = state.quickest_call_ns[{call.dtype, static_cast<int>(std::bit_width(byte_count))}];
    if (budget.call_ns > 0) quickest = quickest > 0 ? std::min(quickest, budget.call_ns) : budget.call_ns;
    double agreed[7] = {capture.slice == nullptr ? 1.0 : 0.0,
                        capture.comm.gathered == nullptr ? 1.0 : 0.0,
                        budget.spent_ns,
                        -budget.elapsed_ns,
                        budget.call_ns > 0 ? -quickest : 0.0,
                        setup_ns,
                        state.cost_per_strategy_byte_ns * bytes};
    maxOverRanks(comm, state, agreed, 7);
    const double no_room = agreed[0], no_gather = agreed[1], spent = agreed[2], elapsed = -agreed[3];
    // Per strategy, a run costs up to twice the job's call; an exploration runs each strategy reps +
    // warm-up + 2 times (the reference check and the run that is checked).
    const double full_runs = static_cast<double>(settings_.reps + settings_.warmup_reps + 2);
    const double call_ns = -agreed[4];
    const double run_ns = call_ns > 0 ? 2.0 * call_ns : agreed[6] / full_runs;
    const auto cost = [&](int reps, int warmups, std::size_t strategies) {
      return run_ns * static_cast<double>(reps + warmups + 2) * static_cast<double>(strategies);
    };
    const double allowed = budget.fraction * elapsed;
    const bool unlimited = budget.fraction >= 1.0;
    const double room = allowed - spent;
    // What fits: every strategy with the configured repetitions; else the plain ones alone (the
    // engines' setup not yet affordable); else the plain ones with fewer repetitions, down to
    // kMinReps and one warm-up run, so that a short job learns its sizes less precisely rather than
    // not at all (the measurements say how many repetitions they had).
    int reps = settings_.reps;
    int warmups = settings_.warmup_reps;
    bool with_engines = unlimited || cost(reps, warmups, plain_count + engine_count) + agreed[5] <= room;
    if (!with_engines && plain_count == 0) reps = 0;  // nothing runs without the engines
    if (!unlimited && !with_engines && reps > 0 && cost(reps, warmups, plain_count) > room) {
      warmups = std::min(warmups, 1);
      const double per_rep = cost(1, 0, plain_count) - cost(0, 0, plain_count);
      const double affordable =
          per_rep > 0 ? std::floor((room - cost(0, warmups, plain_count)) / per_rep) : 0;
      reps = std::min(settings_.reps, static_cast<int>(std::max(0.0, affordable)));
      if (reps < std::min(kMinReps, settings_.reps)) reps = 0;
    }
    if (no_room != 0) {
      result.skipped = "a rank had no room in its shadow arena";
    } else if (reps == 0) {
      result.over_budget = true;
      result.skipped = fmt::format("over budget ({:.1f}% of the run spent exploring, budget {:.1f}%)",
                                   100.0 * spent / std::max(elapsed, 1.0), 100.0 * budget.fraction);
    } else {
      afterJob(call, comm);
      const bool setup_paid = setup_paid_before || !with_engines || engine_count == 0;
      const std::size_t strategies =
          run(state, comm, call, capture, no_gather == 0, with_engines, reps, warmups, result);
      result.explored = true;
      // A first exploration's one-off costs would make the next prediction too large.
      const double runs_made = static_cast<double>(reps + warmups + 2);
      if (setup_paid && bytes > 0 && strategies > 0)
        state.cost_per_strategy_byte_ns =
            std::chrono::duration<double, std::nano>(Clock::now() - started).count() /
            (bytes * static_cast<double>(strategies)) * full_runs / runs_made;
    }
  } catch (const std::exception& failure) {
    result.explored = false;
    result.timings.clear();
    result.consensus.reset();
    result.skipped = failure.what();
  }
  give(capture);
  return result;
}

// Whether every rank built what apply needs (`local_error` empty here); otherwise the lowest failing rank's
// reason (this rank's own, or which rank), remembered for the dtype and strategy on every rank alike.
bool StrategyExtension::agreeToBuild(comm::Communicator& comm, CommState& state, const ShadowCall& call,
                                     const std::string& strategy, const std::string& local_error,
                                     std::string& error) {
  const auto failed = comm.allGatherScalars(local_error.empty() ? 0.0 : 1.0);
  const auto first = std::find(failed.begin(), failed.end(), 1.0);
  if (first == failed.end()) return true;
  const auto rank = first - failed.begin();
  error = rank == comm.rank() ? local_error : fmt::format("{} cannot run on rank {}", strategy, rank);
  state.refused[{call.dtype, strategy}] = error;
  return false;
}

bool StrategyExtension::apply(const ShadowCall& call, const void* send, void* recv,
                              const std::string& strategy, std::string& error) {
  CommState& state = stateOf(call.comm_index);
  const std::lock_guard lock(state.mutex);
  if (const auto refused = state.refused.find({call.dtype, strategy}); refused != state.refused.end()) {
    error = refused->second;
    return false;
  }
  try {
    comm::Communicator& comm = duplicateOf(state, call);
    if (isAsyncName(strategy)) return applyAsync(state, comm, call, strategy, send, recv, error);
    const bool adacons = strategy.starts_with("adacons/");
    const auto key = std::make_tuple(call.dtype, strategy, adacons ? call.count : std::size_t{0});
    auto it = state.applied.find(key);
    if (it == state.applied.end()) {
      std::string local_error;
      std::unique_ptr<comm::Strategy> built;
      try {
        std::string parse_error;
        const auto name = parseStrategyName(strategy, &parse_error);
        if (!name) fail("{}", parse_error);
        // Nothing reads an applied run's statistics; counting them would stall the job's thread on NCCL.
        comm::StrategyOptions options;
        options.wire_stats = false;
        built = comm::makeStrategy(*name, comm, call.dtype, options);
      } catch (const std::exception& failure) {
        local_error = failure.what();
      }
      if (!agreeToBuild(comm, state, call, strategy, local_error, error)) return false;
      it = state.applied.emplace(key, std::move(built)).first;
    }
    afterJob(call, comm);
    it->second->run(send != nullptr ? send : recv, recv, call.count);
    beforeJob(call, comm);
    return true;
  } catch (const std::exception& failure) {
    // A failure in the middle of a collective cannot be agreed on; the call reports it.
    error = failure.what();
    state.refused[{call.dtype, strategy}] = error;
    return false;
  }
}

void StrategyExtension::forget(std::uint32_t comm_index) {
  std::unique_ptr<CommState> state;
  {
    const std::lock_guard lock(states_mutex_);
    const auto it = states_.find(comm_index);
    if (it == states_.end()) return;
    state = std::move(it->second);
    states_.erase(it);
  }
  give(state->capture);
}

void StrategyExtension::stop() {
  const std::lock_guard lock(states_mutex_);
  for (auto& [index, state] : states_) give(state->capture);
  states_.clear();
}

void StrategyExtension::log(const std::string& line) const {
  if (hooks_.log != nullptr) hooks_.log(line.c_str());
}

StrategyExtension::CommState& StrategyExtension::stateOf(std::uint32_t index) {
  const std::lock_guard lock(states_mutex_);
  auto& state = states_[index];
  if (!state) state = std::make_unique<CommState>();
  return *state;
}

// The duplicate is made at the communicator's first explored or applied call: collective over the
// job's communicator, at the same call on every rank. When it cannot be made, or some rank did not
// join, every rank refuses this communicator from then on.
comm::Communicator& StrategyExtension::duplicateOf(CommState& state, const ShadowCall& call,
                                                   bool at_creation) {
  if (!state.refused_all.empty()) fail("{}", state.refused_all);
  if (!state.duplicate) {
    try {
      state.duplicate = duplicate(call, started_, at_creation);
      if (!state.duplicate) fail("this rank could not start (see its first line)");
    } catch (const std::exception& failure) {
      state.refused_all = failure.what();
      throw;
    }
  }
  return *state.duplicate;
}

namespace {
bool isEngine(const StrategyName& name) {
  return name.transport == Transport::Engine;
}
}  // namespace

std::pair<std::vector<StrategyName>, std::vector<StrategyName>> StrategyExtension::namesFor(
    const comm::Communicator& comm, DType dtype) const {
  std::vector<StrategyName> names;
  if (settings_.strategies.empty()) {
    names = comm::applicableStrategies(comm, dtype);
  } else {
    for (const std::string& text : settings_.strategies)
      names.push_back(*parseStrategyName(text));  // start() kept only names that parse
  }
  std::pair<std::vector<StrategyName>, std::vector<StrategyName>> split;
  for (StrategyName& name : names) (isEngine(name) ? split.second : split.first).push_back(std::move(name));
  return split;
}

std::pair<std::size_t, std::size_t> StrategyExtension::expectedStrategies(CommState& state,
                                                                          const comm::Communicator& comm,
                                                                          DType dtype) const {
  const auto found = state.explore.find(dtype);
  if (found != state.explore.end() && found->second.engines_built)
    return {found->second.plain.size(), found->second.engines.size()};
  const auto [plain, engines] = namesFor(comm, dtype);
  return {found != state.explore.end() ? found->second.plain.size() : plain.size(), engines.size()};
}

std::vector<StrategyExtension::Prepared*> StrategyExtension::strategiesFor(CommState& state,
                                                                           comm::Communicator& comm,
                                                                           DType dtype, bool with_engines) {
  // Built with agreement: one that cannot be built on some rank is left out on every rank (said once).
  const auto build = [&](const std::vector<StrategyName>& names, std::vector<Prepared>& into) {
    for (const StrategyName& name : names) {
      std::string local_error;
      std::unique_ptr<comm::Strategy> strategy;
      try {
        strategy = comm::makeStrategy(name, comm, dtype);
      } catch (const std::exception& failure) {
        local_error = failure.what();
      }
      const double failed = comm.allReduceMax(local_error.empty() ? 0.0 : 1.0);
      if (failed != 0) {
        if (!local_error.empty() && settings_.strategies.size() > 0)
          log(fmt::format("explore: {} left out: {}", name.text(), local_error));
        continue;
      }
      into.push_back({name, name.text(), std::move(strategy)});
    }
  };
  auto [it, fresh] = state.explore.try_emplace(dtype);
  CommState::Explored& set = it->second;
  if (fresh) build(namesFor(comm, dtype).first, set.plain);
  if (with_engines && !set.engines_built) {
    // Building them opens MPI_T (once per process) or splits NCCL communicators.
    engines_prepared_.store(true, std::memory_order_relaxed);
    build(namesFor(comm, dtype).second, set.engines);
    set.engines_built = true;
  }
  std::vector<Prepared*> chosen;
  for (Prepared& entry : set.plain) chosen.push_back(&entry);
  if (with_engines)
    for (Prepared& entry : set.engines) chosen.push_back(&entry);
  return chosen;
}

// The fp64 reference: every rank's values widened, summed in fp64 (its own rounding, about N·2^-53
// relative, is far below any error it measures).
void StrategyExtension::computeReference(comm::Communicator& comm, const ShadowCall& call,
                                         const Capture& capture) {
  const std::size_t count = call.count;
  const Capture::Side& host = capture.host;
  const Capture::Side& mem = capture.comm;
  toHost(comm, host.input, mem.input, count * sizeOf(call.dtype));
  for (std::size_t i = 0; i < count; ++i) host.reference[i] = methods::loadElement(call.dtype, host.input, i);
  fromHost(comm, mem.reference, host.reference, count * sizeof(double));
  comm.allReduce(mem.reference, mem.reference, count, comm::Element{DType::Fp64}, ReduceOp::Sum);
  comm.synchronize();
  toHost(comm, host.reference, mem.reference, count * sizeof(double));
}

std::size_t StrategyExtension::run(CommState& state, comm::Communicator& comm, const ShadowCall& call,
                                   const Capture& capture, bool adaptive_references, bool with_engines,
                                   int reps, int warmup_reps, ExploreResult& result) {
  const std::size_t count = call.count;
  const DType dtype = call.dtype;
  const std::size_t bytes = count * sizeOf(dtype);
  const int ranks = comm.size();
  const Capture::Side& host = capture.host;
  const Capture::Side& mem = capture.comm;

  computeReference(comm, call, capture);

  // Consensus diagnostics of this buffer (fp32 gradients): α, cosine to the sum, diversity.
  const auto* input_f32 = reinterpret_cast<const float*>(host.input);
  if (dtype == DType::Fp32) {
    double dot = 0, own = 0, sum = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const double g = input_f32[i];
      dot += g * host.reference[i];
      own += g * g;
      sum += host.reference[i] * host.reference[i];
    }
    const auto norms2 = comm.allGatherScalars(own);
    double total = 0;
    for (const double n2 : norms2) total += n2;
    const double epsilon = comm::StrategyOptions{}.adacons.epsilon;
    ConsensusSample sample;
    sample.grad_norm = std::sqrt(own);
    sample.alpha = dot / (sample.grad_norm + epsilon) / ranks;
    sample.cosine_to_mean = own > 0 && sum > 0 ? dot / (std::sqrt(own) * std::sqrt(sum)) : 0.0;
    sample.diversity = sum > 0 ? total / sum : (total > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    result.consensus = sample;
  }

  // References of the adaptive aggregators: every rank's input, when the arena had room for it.
  std::vector<double> adacons_reference, adasum_reference;
  const std::vector<Prepared*> strategies = strategiesFor(state, comm, dtype, with_engines);
  const bool any_adaptive = std::any_of(strategies.begin(), strategies.end(), [](const Prepared* p) {
    return p->name.aggregator != Aggregator::Sum;
  });
  if (adaptive_references && any_adaptive && dtype == DType::Fp32) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(ranks), count);
    comm.allGather(mem.input, mem.gathered, counts, comm::Element{DType::Fp32});
    comm.synchronize();
    toHost(comm, host.gathered, mem.gathered, count * sizeof(float) * static_cast<std::size_t>(ranks));
    std::vector<const float*> gradients;
    for (int r = 0; r < ranks; ++r) gradients.push_back(host.gathered + static_cast<std::size_t>(r) * count);
    std::vector<float> out(count);
    try {
      methods::AdaConsState fresh;
      methods::adacons(gradients, count, fresh, comm::StrategyOptions{}.adacons, out.data());
      adacons_reference.assign(out.begin(), out.end());
    } catch (const Error&) {
      // A step AdaCons refuses (a zero gradient): its strategy refuses it alike; no reference.
    }
    methods::adasum(gradients, count, out.data());
    adasum_reference.assign(out.begin(), out.end());
  }

  for (Prepared* prepared : strategies) {
    Prepared& entry = *prepared;
    StrategyTiming timing;
    timing.strategy = entry.text;
    timing.reps = reps;
    // AdaCons' momentum belongs to the job's buffers, not to explored ones: a fresh instance each time.
    std::unique_ptr<comm::Strategy> fresh;
    if (entry.name.aggregator == Aggregator::AdaCons) fresh = comm::makeStrategy(entry.name, comm, dtype);
    comm::Strategy& strategy = fresh ? *fresh : *entry.strategy;
    std::optional<comm::RunStats> stats;
    try {
      stats = strategy.run(mem.input, mem.result, count);
      comm.synchronize();
    } catch (const Error&) {
      // AdaCons refuses a step that cannot be normalised on every rank alike: nothing to time.
      continue;
    }
    toHost(comm, host.result, mem.result, bytes);
    // Sums against the fp64 sum; the adaptive aggregators against methods:: on every rank's input
    // (a fresh AdaCons state), when the arena had room to gather them.
    const std::vector<double>* adaptive = entry.name.aggregator == Aggregator::AdaCons  ? &adacons_reference
                                          : entry.name.aggregator == Aggregator::AdaSum ? &adasum_reference
                                                                                        : nullptr;
    if (adaptive == nullptr || !adaptive->empty() || count == 0) {
      const double* reference = adaptive != nullptr ? adaptive->data() : host.reference;
      const auto metrics = methods::compareToReference(dtype, host.result, reference, count);
      timing.rel_l2_error = metrics.rel_l2;
      timing.max_abs_error = metrics.max_abs;
      timing.cosine = metrics.cosine;
      timing.overflow_count = static_cast<std::int64_t>(metrics.overflow + metrics.nan);
    }
    timing.overflow_count += static_cast<std::int64_t>(stats->wire.overflow + stats->wire.nan);

    for (int i = 0; i < warmup_reps; ++i) strategy.run(mem.input, mem.result, count);
    // OSU's loop: ranks meet at a barrier, then each repetition is timed on its own, to its completion
    // (NCCL: the communicator's stream synchronised).
    std::vector<double> times;
    times.reserve(static_cast<std::size_t>(reps));
    for (int i = 0; i < reps; ++i) {
      comm.barrier();
      const auto start = Clock::now();
      strategy.run(mem.input, mem.result, count);
      comm.synchronize();
      times.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    const std::size_t n = times.size();
    if (n > 0) {
      timing.min_ns = times.front();
      timing.max_ns = times.back();
      timing.median_ns = n % 2 == 1 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
      const auto p90 = static_cast<std::size_t>(std::ceil(0.9 * static_cast<double>(n)));
      timing.p90_ns = times[std::max<std::size_t>(p90, 1) - 1];
    }
    result.timings.push_back(std::move(timing));
  }
  if (!async_names_.empty()) asyncErrors(state, call, capture, /*sampled=*/true, result);
  return strategies.size();
}

// ---- explore: the async strategies' errors
// ------------------------------------------------------------------

void StrategyExtension::dropHistory(CommState& state, std::uint32_t ordinal) {
  const auto found = state.histories.find(ordinal);
  if (found == state.histories.end()) return;
  for (const auto& step : found->second.steps)
    history_bytes_.fetch_sub((step.sum.size() + step.input.size()) * sizeof(double),
                             std::memory_order_relaxed);
  state.histories.erase(found);
}

// What each async strategy would have returned at this step is computed from the steps kept: stale<K> the
// sum of step t-K, dga<K> that sum plus N·(g[t] - g[t-K]), both rounded once to the dtype (a sum by the
// job's own transport would differ from the fp64 sum by its rounding alone, far below these errors). The
// error is against this step's fp64 sum, as every strategy's is. A site that skipped a step, changed
// shape or whose history would exceed the memory allowed (the shadow arena's size) keeps nothing.
void StrategyExtension::asyncErrors(CommState& state, const ShadowCall& call, const Capture& capture,
                                    bool sampled, ExploreResult& result) {
  const std::uint32_t ordinal = call.site.ordinal;
  CommState::History& history = state.histories[ordinal];
  if (history.dtype != call.dtype || history.count != call.count || call.site.changed || call.site.reshaped ||
      call.site.step != history.last_step + 1) {
    dropHistory(state, ordinal);
    CommState::History& fresh = state.histories[ordinal];
    fresh.dtype = call.dtype;
    fresh.count = call.count;
  }
  CommState::History& site = state.histories[ordinal];
  const std::size_t count = call.count;
  const Capture::Side& host = capture.host;
  const double ranks = call.comm_size;
  std::vector<std::byte> returned(count * sizeOf(call.dtype));
  for (const StrategyName& name : async_names_) {
    const auto kept = std::find_if(site.steps.begin(), site.steps.end(), [&](const auto& step) {
      return step.step == call.site.step - name.staleness;
    });
    if (kept == site.steps.end()) continue;
    const bool dga = name.delay == StrategyName::Delay::Dga;
    for (std::size_t i = 0; i < count; ++i) {
      const double value =
          dga ? kept->sum[i] + ranks * (methods::loadElement(call.dtype, host.input, i) - kept->input[i])
              : kept->sum[i];
      methods::storeElement(call.dtype, returned.data(), i, value);
    }
    const auto metrics = methods::compareToReference(call.dtype, returned.data(), host.reference, count);
    StrategyTiming timing;
    timing.strategy = name.text();
    timing.rel_l2_error = metrics.rel_l2;
    timing.max_abs_error = metrics.max_abs;
    timing.cosine = metrics.cosine;
    timing.overflow_count = static_cast<std::int64_t>(metrics.overflow + metrics.nan);
    result.timings.push_back(std::move(timing));
  }
  // Keep this step, within the memory allowed.
  const std::size_t bytes = 2 * count * sizeof(double);
  if (history_bytes_.load(std::memory_order_relaxed) + bytes > settings_.shadow_bytes) {
    dropHistory(state, ordinal);
    return;
  }
  CommState::History::Step step;
  step.step = call.site.step;
  step.sum.assign(host.reference, host.reference + count);
  step.input.resize(count);
  for (std::size_t i = 0; i < count; ++i) step.input[i] = methods::loadElement(call.dtype, host.input, i);
  history_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  site.steps.push_front(std::move(step));
  while (site.steps.size() > static_cast<std::size_t>(async_depth_)) {
    const auto& oldest = site.steps.back();
    history_bytes_.fetch_sub((oldest.sum.size() + oldest.input.size()) * sizeof(double),
                             std::memory_order_relaxed);
    site.steps.pop_back();
  }
  site.last_step = call.site.step;
  site.follows_left = sampled ? async_depth_ : site.follows_left - 1;
  if (site.follows_left <= 0) dropHistory(state, ordinal);
}

bool StrategyExtension::follows(const ShadowCall& call) {
  if (async_names_.empty()) return false;
  CommState& state = stateOf(call.comm_index);
  const std::lock_guard lock(state.mutex);
  const auto found = state.histories.find(call.site.ordinal);
  if (found == state.histories.end()) return false;
  const CommState::History& history = found->second;
  if (history.follows_left > 0 && history.dtype == call.dtype && history.count == call.count &&
      !call.site.changed && !call.site.reshaped && call.site.step == history.last_step + 1)
    return true;
  dropHistory(state, call.site.ordinal);  // the site moved on without us
  return false;
}

ExploreResult StrategyExtension::follow(const ShadowCall& call, const BudgetState& budget) {
  CommState& state = stateOf(call.comm_index);
  const std::lock_guard lock(state.mutex);
  ExploreResult result;
  Capture capture = state.capture;
  state.capture = {};
  try {
    comm::Communicator& comm = duplicateOf(state, call);
    // One agreement: every rank captured, and none is over its budget (a follow costs one fp64 sum).
    double agreed[2] = {
        capture.slice == nullptr ? 1.0 : 0.0,
        budget.fraction < 1.0 && budget.spent_ns > budget.fraction * budget.elapsed_ns ? 1.0 : 0.0};
    maxOverRanks(comm, state, agreed, 2);
    if (agreed[0] != 0 || agreed[1] != 0) {
      dropHistory(state, call.site.ordinal);
      result.over_budget = agreed[1] != 0;
      result.skipped = agreed[0] != 0 ? "a rank had no room in its shadow arena" : "over budget";
    } else {
      afterJob(call, comm);
      computeReference(comm, call, capture);
      asyncErrors(state, call, capture, /*sampled=*/false, result);
      result.explored = true;
    }
  } catch (const std::exception& failure) {
    dropHistory(state, call.site.ordinal);
    result.explored = false;
    result.timings.clear();
    result.skipped = failure.what();
  }
  give(capture);
  return result;
}

// ---- apply: the async strategies
// ----------------------------------------------------------------------------

bool StrategyExtension::appliesAsync() const {
  return std::any_of(settings_.apply_strategies.begin(), settings_.apply_strategies.end(), isAsyncName);
}

// A call site runs its own strategy instance (its steps and buffers), restarted (its first K steps
// synchronous again) when it changes: built anew for another strategy, dtype or size; restarted with its
// buffers kept for a step skipped (a validation window without the plan) or a step of another shape, so
// that switching the plan at a window's edge allocates and frees nothing (over NCCL, freeing is a host
// wait). A change the job did not ask for is said once.
bool StrategyExtension::applyAsync(CommState& state, comm::Communicator& comm, const ShadowCall& call,
                                   const std::string& strategy, const void* send, void* recv,
                                   std::string& error) {
  if (!state.async_worker) {
    // Made with agreement: a rank that cannot run a second thread in MPI refuses for every rank.
    std::string local_error;
    try {
      state.async_worker = comm::AsyncWorker::make(comm, hooks_.own_thread);
    } catch (const std::exception& failure) {
      local_error = failure.what();
    }
    if (!agreeToBuild(comm, state, call, strategy, local_error, error)) {
      state.async_worker.reset();
      return false;
    }
  }
  if (call.site.reshaped)
    for (auto& [ordinal, site] : state.async_sites)
      if (site.strategy) site.strategy->restart();
  CommState::AsyncSite& site = state.async_sites[call.site.ordinal];
  const bool moved = call.site.changed || call.site.reshaped;
  const bool rebuild =
      !site.strategy || site.text != strategy || site.dtype != call.dtype || site.count != call.count;
  if (rebuild || call.site.step != site.last_step + 1 || moved) {
    std::string parse_error;
    const auto name = parseStrategyName(strategy, &parse_error);
    if (!name) fail("{}", parse_error);
    if (moved && speaksForAll() && !reported_moved_.exchange(true))
      log(fmt::format(
          "apply: {}: call {} of a step changed size or the steps changed shape; its sums restart, "
          "synchronous for {} step(s) (said once; if the job's steps are not detected, mark them with "
          "{} or {})",
          strategy, call.site.ordinal, name->staleness, env::kStepCalls, env::kStepNvtx));
    if (rebuild) {
      site.strategy.reset();
      site.strategy = std::make_unique<comm::AsyncStrategy>(*name, comm, call.dtype, state.async_worker);
      site.text = strategy;
      site.dtype = call.dtype;
      site.count = call.count;
    } else {
      site.strategy->restart();
    }
  }
  site.last_step = call.site.step;
  afterJob(call, comm);
  site.strategy->run(send != nullptr ? send : recv, recv, call.count);
  beforeJob(call, comm);
  return true;
}

}  // namespace gradscope::agent
