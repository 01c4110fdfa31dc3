// libgradscope-agent-mpi.so: explore and apply over MPI communicators (extension.h says why this is
// a library of its own, and what the agent guarantees about the order of calls).
//
// Per job communicator the extension keeps a duplicate (its strategies' traffic never matches the
// job's messages), the strategies built on it (once per dtype, agreed on), and the strategies apply
// mode runs. The shadow arena is one host allocation made at start(); an explored call takes a slice
// of it for its input copy, the strategies' output and the fp64 reference, and gives it back when the
// exploration ends.

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "extension.h"
#include "gradscope/comm/communicator.h"
#include "gradscope/comm/mpi.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/error.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/error_metrics.h"
#include "gradscope/methods/numeric.h"

namespace gradscope::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kAlign = 64;

std::size_t alignUp(std::size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// The host arena: one mapping made at start; slices handed out first-fit under a mutex (explorations
// on different communicators may run at the same time on different threads).
class Arena {
 public:
  bool reserve(std::size_t bytes) {
    if (bytes == 0) return true;
    void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return false;
    base_ = static_cast<std::byte*>(memory);
    size_ = bytes;
    return true;
  }

  // A slice of `bytes`, or nullptr when no gap is large enough.
  std::byte* take(std::size_t bytes) {
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

  void give(std::byte* slice) {
    if (slice == nullptr) return;
    const std::lock_guard lock(mutex_);
    used_.erase(static_cast<std::size_t>(slice - base_));
  }

  std::size_t size() const { return size_; }

 private:
  std::mutex mutex_;
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  std::map<std::size_t, std::size_t> used_;  // offset -> bytes
};

// A dtype's values as doubles (the fp64 reference and the consensus products).
double loadAsDouble(DType dtype, const std::byte* data, std::size_t i) {
  switch (dtype) {
    case DType::Fp32: {
      float v;
      std::memcpy(&v, data + i * 4, 4);
      return v;
    }
    case DType::Fp64: {
      double v;
      std::memcpy(&v, data + i * 8, 8);
      return v;
    }
    case DType::Fp16: {
      std::uint16_t v;
      std::memcpy(&v, data + i * 2, 2);
      return methods::fp16ToFp32(v);
    }
    case DType::Bf16: {
      std::uint16_t v;
      std::memcpy(&v, data + i * 2, 2);
      return methods::bf16ToFp32(v);
    }
    default: return 0;
  }
}

bool explorable(DType dtype) {
  return dtype == DType::Fp32 || dtype == DType::Fp64 || dtype == DType::Fp16 || dtype == DType::Bf16;
}

struct Prepared {
  comm::StrategyName name;
  std::string text;
  std::unique_ptr<comm::Strategy> strategy;
};

// The slices of one exploration: [input | result | fp64 reference | every rank's fp32 input].
struct Capture {
  std::byte* slice = nullptr;
  std::byte* input = nullptr;
  std::byte* result = nullptr;
  double* reference = nullptr;
  float* gathered = nullptr;  // nullptr: no room for the adaptive aggregators' references
};

struct CommState {
  std::mutex mutex;  // the job orders collectives per communicator; this guards against misuse
  std::unique_ptr<comm::Communicator> duplicate;
  std::map<DType, std::vector<Prepared>> explore;
  // Apply: by (dtype, strategy, count). AdaCons keeps momentum per buffer: one instance per count, so
  // that a layer's weights are smoothed with its own history (docs/agent.md, "Apply mode").
  std::map<std::tuple<DType, std::string, std::size_t>, std::unique_ptr<comm::Strategy>> applied;
  std::map<std::pair<DType, std::string>, std::string> refused;  // agreed failures, with the reason
  Capture capture;
};

class MpiExtension final : public Extension {
 public:
  explicit MpiExtension(void (*log_line)(const char*)) : log_(log_line) {}

  bool start(const ExploreSettings& settings, const std::string& local_problem, std::string& error) override {
    settings_ = settings;
    // Names that do not parse are left out on every rank (the same names everywhere); said once.
    settings_.strategies.clear();
    std::vector<std::string> unknown;
    for (const std::string& text : settings.strategies) {
      if (comm::parseStrategyName(text)) settings_.strategies.push_back(text);
      else unknown.push_back(text);
    }
    if (!settings.strategies.empty() && settings_.strategies.empty()) settings_.strategies = {"sum/native"};
    std::string local_error = local_problem;
    if (local_error.empty() && !arena_.reserve(settings.shadow_bytes))
      local_error =
          fmt::format("cannot map the {}-byte shadow arena (GRADSCOPE_SHADOW_BYTES)", settings.shadow_bytes);
    const bool ok = local_error.empty();
    try {
      world_ = comm::mpiWorld();  // MPI is initialised: a duplicate of MPI_COMM_WORLD
      // The lowest failing rank says why; the others stay quiet (a bad file would say it N times).
      const auto failed = world_->allGatherScalars(ok ? 0.0 : 1.0);
      const auto first = std::find(failed.begin(), failed.end(), 1.0);
      if (first != failed.end()) {
        error = first - failed.begin() == world_->rank() ? local_error : std::string();
        return false;
      }
      if (!unknown.empty() && world_->rank() == 0)
        log(fmt::format(
            "GRADSCOPE_EXPLORE_STRATEGIES: {} not strategy names (DESIGN: aggregator/transport[/wire], "
            "e.g. sum/rs_ag/bf16); left out",
            fmt::join(unknown, ", ")));
    } catch (const std::exception& failure) {
      error = failure.what();
      return false;
    }
    return true;
  }

  bool capture(const ShadowCall& call, const void* input) override {
    CommState& state = stateOf(call.comm_index);
    const std::lock_guard lock(state.mutex);
    const std::size_t bytes = call.count * sizeOf(call.dtype);
    const std::size_t base = alignUp(bytes) * 2 + alignUp(call.count * sizeof(double));
    const std::size_t gather = alignUp(call.count * sizeof(float) * static_cast<std::size_t>(call.comm_size));
    Capture& capture = state.capture;
    arena_.give(capture.slice);
    capture = {};
    if (!explorable(call.dtype)) return false;
    std::byte* slice = nullptr;
    const bool adaptive = call.dtype == DType::Fp32;
    if (adaptive) slice = arena_.take(base + gather);
    const bool with_gather = slice != nullptr;
    if (slice == nullptr) slice = arena_.take(base);
    if (slice == nullptr) return false;
    capture.slice = slice;
    capture.input = slice;
    capture.result = slice + alignUp(bytes);
    capture.reference = reinterpret_cast<double*>(slice + 2 * alignUp(bytes));
    capture.gathered = with_gather ? reinterpret_cast<float*>(slice + base) : nullptr;
    if (bytes != 0) std::memcpy(capture.input, input, bytes);
    return true;
  }

  ExploreResult explore(const ShadowCall& call, const BudgetState& budget) override {
    CommState& state = stateOf(call.comm_index);
    const std::lock_guard lock(state.mutex);
    ExploreResult result;
    Capture capture = state.capture;
    state.capture = {};
    try {
      comm::Communicator& comm = duplicateOf(state, call);
      // 1. Agreement: did every rank capture (and with room for the adaptive references), and does the
      //    budget allow it on every rank? Maxima over ranks, so every rank decides alike.
      //    One all-reduce (max) of six values: a skipped exploration costs the job one small collective.
      //    The exploration's predicted cost: a one-off setup where this rank has not paid it yet (the
      //    engine strategies open an MPI_T session: about 0.2 s with Open MPI 4.1), then every
      //    strategy's runs at up to twice the job's own call time. That time is the smallest over the
      //    ranks: the others include waiting for the last rank to arrive, which the strategies, run
      //    right after the job's call has lined the ranks up, do not pay (0 before the call has run).
      const double setup_ns = wantsEngineStrategies() && !engines_prepared_ ? kEngineSetupNs : 0.0;
      double agreed[6] = {capture.slice == nullptr ? 1.0 : 0.0,
                          capture.gathered == nullptr ? 1.0 : 0.0,
                          budget.spent_ns,
                          -budget.elapsed_ns,
                          -budget.call_ns,
                          setup_ns};
      comm.allReduce(agreed, agreed, 6, comm::Element{DType::Fp64}, ReduceOp::Max);
      const double no_room = agreed[0], no_gather = agreed[1], spent = agreed[2], elapsed = -agreed[3];
      const double runs = static_cast<double>(settings_.reps + settings_.warmup_reps + 2);
      const double call_ns = -agreed[4];
      const double predicted =
          agreed[5] + 2.0 * call_ns * runs * static_cast<double>(expectedStrategies(state, comm, call.dtype));
      if (no_room != 0) {
        result.skipped = "a rank had no room in its shadow arena";
      } else if (budget.fraction < 1.0 && spent + predicted > budget.fraction * elapsed) {
        result.skipped = fmt::format("over budget ({:.1f}% of the run spent exploring, budget {:.1f}%)",
                                     100.0 * spent / std::max(elapsed, 1.0), 100.0 * budget.fraction);
      } else {
        run(state, comm, call, capture, no_gather == 0, result);
        result.explored = true;
      }
    } catch (const std::exception& failure) {
      result.explored = false;
      result.timings.clear();
      result.consensus.reset();
      result.skipped = failure.what();
    }
    arena_.give(capture.slice);
    return result;
  }

  bool apply(const ShadowCall& call, const void* send, void* recv, const std::string& strategy,
             std::string& error) override {
    CommState& state = stateOf(call.comm_index);
    const std::lock_guard lock(state.mutex);
    if (const auto refused = state.refused.find({call.dtype, strategy}); refused != state.refused.end()) {
      error = refused->second;
      return false;
    }
    try {
      comm::Communicator& comm = duplicateOf(state, call);
      const bool adacons = strategy.starts_with("adacons/");
      const auto key = std::make_tuple(call.dtype, strategy, adacons ? call.count : std::size_t{0});
      auto it = state.applied.find(key);
      if (it == state.applied.end()) {
        std::string local_error;
        std::unique_ptr<comm::Strategy> built;
        try {
          std::string parse_error;
          const auto name = comm::parseStrategyName(strategy, &parse_error);
          if (!name) fail("{}", parse_error);
          built = comm::makeStrategy(*name, comm, call.dtype);
        } catch (const std::exception& failure) {
          local_error = failure.what();
        }
        const auto failed = comm.allGatherScalars(local_error.empty() ? 0.0 : 1.0);
        const auto first = std::find(failed.begin(), failed.end(), 1.0);
        if (first != failed.end()) {
          const auto rank = first - failed.begin();
          error = rank == comm.rank() ? local_error : fmt::format("{} cannot run on rank {}", strategy, rank);
          state.refused[{call.dtype, strategy}] = error;
          return false;
        }
        it = state.applied.emplace(key, std::move(built)).first;
      }
      it->second->run(send != nullptr ? send : recv, recv, call.count);
      return true;
    } catch (const std::exception& failure) {
      // A failure in the middle of a collective cannot be agreed on; the call reports it.
      error = failure.what();
      state.refused[{call.dtype, strategy}] = error;
      return false;
    }
  }

  void forget(std::uint32_t comm_index) override {
    std::unique_ptr<CommState> state;
    {
      const std::lock_guard lock(states_mutex_);
      const auto it = states_.find(comm_index);
      if (it == states_.end()) return;
      state = std::move(it->second);
      states_.erase(it);
    }
    arena_.give(state->capture.slice);
  }

  void stop() override {
    const std::lock_guard lock(states_mutex_);
    for (auto& [index, state] : states_) arena_.give(state->capture.slice);
    states_.clear();
    world_.reset();
  }

 private:
  CommState& stateOf(std::uint32_t index) {
    const std::lock_guard lock(states_mutex_);
    auto& state = states_[index];
    if (!state) state = std::make_unique<CommState>();
    return *state;
  }

  // The duplicate is made at the communicator's first explored or applied call: collective over the
  // job's communicator, at the same call on every rank.
  comm::Communicator& duplicateOf(CommState& state, const ShadowCall& call) {
    if (!state.duplicate) state.duplicate = comm::mpiDuplicateOf(call.comm);
    return *state.duplicate;
  }

  // Whether the explored set includes an Open MPI engine strategy (sum/mpi.<algorithm>).
  bool wantsEngineStrategies() const {
    if (settings_.strategies.empty()) return true;
    return std::any_of(settings_.strategies.begin(), settings_.strategies.end(),
                       [](const std::string& name) { return name.starts_with("sum/mpi."); });
  }

  // How many strategies an exploration of `dtype` runs: the built set, or before it is built an estimate
  // (the same on every rank: it depends on the configuration only).
  std::size_t expectedStrategies(CommState& state, const comm::Communicator& comm, DType dtype) const {
    if (const auto found = state.explore.find(dtype); found != state.explore.end())
      return found->second.size();
    return settings_.strategies.empty() ? comm::applicableStrategies(comm, dtype).size()
                                        : settings_.strategies.size();
  }

  // The strategies explored for a dtype, built once with agreement: one that cannot be built on some
  // rank is left out on every rank (and said once).
  std::vector<Prepared>& strategiesFor(CommState& state, comm::Communicator& comm, DType dtype) {
    const auto found = state.explore.find(dtype);
    if (found != state.explore.end()) return found->second;
    std::vector<comm::StrategyName> names;
    if (settings_.strategies.empty()) {
      names = comm::applicableStrategies(comm, dtype);
    } else {
      for (const std::string& text : settings_.strategies)
        names.push_back(*comm::parseStrategyName(text));  // start() kept only names that parse
    }
    engines_prepared_ = true;  // building them opens MPI_T (once per process)
    std::vector<Prepared> prepared;
    for (const comm::StrategyName& name : names) {
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
      prepared.push_back({name, name.text(), std::move(strategy)});
    }
    return state.explore.emplace(dtype, std::move(prepared)).first->second;
  }

  void run(CommState& state, comm::Communicator& comm, const ShadowCall& call, const Capture& capture,
           bool adaptive_references, ExploreResult& result) {
    const std::size_t count = call.count;
    const DType dtype = call.dtype;
    const int ranks = comm.size();

    // The fp64 reference: every rank's values widened, summed in fp64 (its own rounding, about
    // N·2^-53 relative, is far below any error it measures).
    for (std::size_t i = 0; i < count; ++i) capture.reference[i] = loadAsDouble(dtype, capture.input, i);
    comm.allReduce(capture.reference, capture.reference, count, comm::Element{DType::Fp64}, ReduceOp::Sum);

    // Consensus diagnostics of this buffer (fp32 gradients): α, cosine to the sum, diversity.
    const auto* input_f32 = reinterpret_cast<const float*>(capture.input);
    if (dtype == DType::Fp32) {
      double dot = 0, own = 0, sum = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const double g = input_f32[i];
        dot += g * capture.reference[i];
        own += g * g;
        sum += capture.reference[i] * capture.reference[i];
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
    std::vector<Prepared>& strategies = strategiesFor(state, comm, dtype);
    const bool any_adaptive = std::any_of(strategies.begin(), strategies.end(), [](const Prepared& p) {
      return p.name.aggregator != comm::Aggregator::Sum;
    });
    if (adaptive_references && any_adaptive && dtype == DType::Fp32) {
      std::vector<std::size_t> counts(static_cast<std::size_t>(ranks), count);
      comm.allGather(capture.input, capture.gathered, counts, comm::Element{DType::Fp32});
      std::vector<const float*> gradients;
      for (int r = 0; r < ranks; ++r)
        gradients.push_back(capture.gathered + static_cast<std::size_t>(r) * count);
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

    for (Prepared& entry : strategies) {
      StrategyTiming timing;
      timing.strategy = entry.text;
      timing.reps = settings_.reps;
      // AdaCons' momentum belongs to the job's buffers, not to explored ones: a fresh instance each time.
      std::unique_ptr<comm::Strategy> fresh;
      if (entry.name.aggregator == comm::Aggregator::AdaCons)
        fresh = comm::makeStrategy(entry.name, comm, dtype);
      comm::Strategy& strategy = fresh ? *fresh : *entry.strategy;
      std::optional<comm::RunStats> stats;
      try {
        stats = strategy.run(capture.input, capture.result, count);
      } catch (const Error&) {
        // AdaCons refuses a step that cannot be normalised on every rank alike: nothing to time.
        continue;
      }
      // Sums against the fp64 sum; the adaptive aggregators against methods:: on every rank's input
      // (a fresh AdaCons state), when the arena had room to gather them.
      const std::vector<double>* adaptive =
          entry.name.aggregator == comm::Aggregator::AdaCons  ? &adacons_reference
          : entry.name.aggregator == comm::Aggregator::AdaSum ? &adasum_reference
                                                              : nullptr;
      if (adaptive == nullptr || !adaptive->empty() || count == 0) {
        const double* reference = adaptive != nullptr ? adaptive->data() : capture.reference;
        const auto metrics = methods::compareToReference(dtype, capture.result, reference, count);
        timing.rel_l2_error = metrics.rel_l2;
        timing.max_abs_error = metrics.max_abs;
        timing.cosine = metrics.cosine;
        timing.overflow_count = static_cast<std::int64_t>(metrics.overflow + metrics.nan);
      }
      timing.overflow_count += static_cast<std::int64_t>(stats->wire.overflow + stats->wire.nan);

      for (int i = 0; i < settings_.warmup_reps; ++i) strategy.run(capture.input, capture.result, count);
      // OSU's loop: ranks meet at a barrier, then each repetition is timed on its own.
      std::vector<double> times;
      times.reserve(static_cast<std::size_t>(settings_.reps));
      for (int i = 0; i < settings_.reps; ++i) {
        comm.barrier();
        const auto start = Clock::now();
        strategy.run(capture.input, capture.result, count);
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
  }

  void log(const std::string& line) const {
    if (log_ != nullptr) log_(line.c_str());
  }

  // The one-off cost the budget reserves for the first exploration (see explore()).
  static constexpr double kEngineSetupNs = 250e6;

  void (*log_)(const char*);
  ExploreSettings settings_;
  bool engines_prepared_ = false;
  Arena arena_;
  std::unique_ptr<comm::Communicator> world_;
  std::mutex states_mutex_;
  std::unordered_map<std::uint32_t, std::unique_ptr<CommState>> states_;
};

}  // namespace
}  // namespace gradscope::agent

extern "C" __attribute__((visibility("default"))) gradscope::agent::Extension* gradscope_agent_extension(
    int abi, void (*log)(const char* line)) {
  if (abi != gradscope::agent::kExtensionAbi) return nullptr;
  // Never destroyed: job threads may be inside it while the process exits, and its communicators
  // must not be freed after MPI_Finalize.
  return new gradscope::agent::MpiExtension(log);
}
