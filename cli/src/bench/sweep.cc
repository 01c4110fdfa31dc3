// gradscope bench: the measurements (bench.h explains the method; this file is its implementation).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gradscope/cli/bench.h"
#include "gradscope/comm/communicator.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/units.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/cpu_executor.h"
#include "gradscope/methods/local_sum.h"
#include "gradscope/methods/numeric.h"

namespace gradscope::cli::bench {
namespace {

using Clock = std::chrono::steady_clock;

double microsecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// ---- Host buffers of one dtype ---------------------------------------------------------------------------

// A host buffer of `count` elements of one of bench's dtypes, read and written as doubles.
class HostValues {
 public:
  HostValues(DType dtype, std::size_t count) : dtype_(dtype), bytes_(count * sizeOf(dtype)) {}

  void set(std::size_t i, double value) {
    switch (dtype_) {
      case DType::Fp64: store(i, value); break;
      case DType::Fp32: store(i, static_cast<float>(value)); break;
      case DType::Fp16: store(i, methods::fp32ToFp16(static_cast<float>(value))); break;
      case DType::Bf16: store(i, methods::fp32ToBf16(static_cast<float>(value))); break;
      default: fail("gradscope bench has no {} buffers", name(dtype_));
    }
  }
  double get(std::size_t i) const {
    switch (dtype_) {
      case DType::Fp64: return load<double>(i);
      case DType::Fp32: return static_cast<double>(load<float>(i));
      case DType::Fp16: return static_cast<double>(methods::fp16ToFp32(load<std::uint16_t>(i)));
      case DType::Bf16: return static_cast<double>(methods::bf16ToFp32(load<std::uint16_t>(i)));
      default: return 0;
    }
  }
  // `value` as it reads back after a round trip through this dtype.
  double rounded(double value) const {
    switch (dtype_) {
      case DType::Fp64: return value;
      case DType::Fp32: return static_cast<double>(static_cast<float>(value));
      case DType::Fp16:
        return static_cast<double>(methods::fp16ToFp32(methods::fp32ToFp16(static_cast<float>(value))));
      case DType::Bf16:
        return static_cast<double>(methods::bf16ToFp32(methods::fp32ToBf16(static_cast<float>(value))));
      default: return 0;
    }
  }

  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  std::size_t bytes() const { return bytes_.size(); }

 private:
  template <typename T>
  void store(std::size_t i, T value) {
    std::memcpy(bytes_.data() + i * sizeof(T), &value, sizeof(T));
  }
  template <typename T>
  T load(std::size_t i) const {
    T value;
    std::memcpy(&value, bytes_.data() + i * sizeof(T), sizeof(T));
    return value;
  }

  DType dtype_;
  std::vector<std::byte> bytes_;
};

// ---- Inputs
// ------------------------------------------------------------------------------------------------

// Verifiable inputs (after nccl-tests' verifiable/): small positive integers, so that every partial sum
// of `contributors` of them is an integer the dtype holds exactly and every order of addition gives the
// same bits. Positive, so that a result element left unwritten (zero) is always wrong.
int verifiableModulus(DType dtype, int contributors) {
  // Largest integer up to which every integer is exact: 2^(significand bits + 1).
  const double exact_limit = dtype == DType::Bf16 ? 256.0 : dtype == DType::Fp16 ? 2048.0 : 16777216.0;
  return static_cast<int>(std::clamp(exact_limit / contributors, 1.0, 8.0));
}

double verifiableValue(int contributor, std::size_t index, int modulus) {
  const auto m = static_cast<std::size_t>(modulus);
  return static_cast<double>(1 + (index + 3 * static_cast<std::size_t>(contributor)) % m);
}

double verifiableSum(int contributors, std::size_t index, int modulus) {
  double sum = 0;
  for (int c = 0; c < contributors; ++c) sum += verifiableValue(c, index, modulus);
  return sum;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double uniform(std::uint64_t key) {  // [-1, 1)
  return static_cast<double>(splitmix64(key) >> 11) * 0x1.0p-52 - 1.0;
}

// Pseudo-random inputs for the error metrics, a pure function of (contributor, index) so that every
// rank can regenerate every rank's input. A component shared by all contributors plus one of their own:
// gradients of data-parallel ranks are correlated, which is what the adaptive aggregators weigh.
double randomValue(int contributor, std::size_t index) {
  const auto i = static_cast<std::uint64_t>(index);
  const auto c = static_cast<std::uint64_t>(contributor) + 1;
  return 0.5 * uniform(i) + uniform(i ^ (c << 40) ^ 0x5bd1e995ull);
}

// ---- Timing over ranks -----------------------------------------------------------------------------------

RankTimes summarise(std::vector<double> per_rank_us) {
  std::sort(per_rank_us.begin(), per_rank_us.end());
  const std::size_t n = per_rank_us.size();
  RankTimes times;
  times.min_us = per_rank_us.front();
  times.max_us = per_rank_us.back();
  times.median_us = n % 2 == 1 ? per_rank_us[n / 2] : 0.5 * (per_rank_us[n / 2 - 1] + per_rank_us[n / 2]);
  // Nearest-rank percentile: the smallest value with at least 90% of the ranks at or below it.
  const auto p90_rank = static_cast<std::size_t>(std::ceil(0.9 * static_cast<double>(n)));
  times.p90_us = per_rank_us[std::max<std::size_t>(p90_rank, 1) - 1];
  return times;
}

double gigabytesPerSecond(double bytes, double microseconds) {
  return microseconds > 0 ? bytes / microseconds * 1e-3 : 0.0;
}

// ---- Distributed strategies
// --------------------------------------------------------------------------------

struct PreparedStrategy {
  std::string text;
  StrategyName name;
  std::unique_ptr<comm::Strategy> strategy;
};

// Agreement on a failure that some ranks may have seen (`error` non-empty there): collective. If any
// rank failed, every rank throws BenchError, and the lowest failing rank is the one that reports it.
void agreeOnFailure(comm::Communicator& comm, const std::string& error) {
  const auto failed = comm.allGatherScalars(error.empty() ? 0.0 : 1.0);
  const auto first = std::find(failed.begin(), failed.end(), 1.0);
  if (first == failed.end()) return;
  const bool here = first - failed.begin() == comm.rank();
  throw BenchError(here ? error : "another rank failed", here);
}

std::unique_ptr<comm::Strategy> makeAgreedStrategy(comm::Communicator& comm, const StrategyName& name,
                                                   DType dtype) {
  std::unique_ptr<comm::Strategy> strategy;
  std::string error;
  // No wire statistics: bench reports overflow and NaN from the decoded result (compareToReference), and
  // on NCCL counting them reads the counters back, a stream synchronisation inside every timed call of
  // the launch loop.
  comm::StrategyOptions options;
  options.wire_stats = false;
  try {
    strategy = comm::makeStrategy(name, comm, dtype, options);
  } catch (const Error& failure) {
    error = failure.what();
  } catch (const std::exception& failure) {
    error = fmt::format("{}: internal error: {}", name.text(), failure.what());
  }
  agreeOnFailure(comm, error);
  return strategy;
}

// The worst rank's metrics (the max of each distance, the min of the cosine).
methods::ErrorMetrics worstOverRanks(comm::Communicator& comm, const methods::ErrorMetrics& mine) {
  methods::ErrorMetrics worst;
  worst.rel_l2 = comm.allReduceMax(mine.rel_l2);
  worst.max_abs = comm.allReduceMax(mine.max_abs);
  worst.cosine = -comm.allReduceMax(-mine.cosine);
  worst.overflow = static_cast<std::uint64_t>(comm.allReduceMax(static_cast<double>(mine.overflow)));
  worst.nan = static_cast<std::uint64_t>(comm.allReduceMax(static_cast<double>(mine.nan)));
  return worst;
}

// fp64 references of one size, built from every rank's regenerated random input.
struct References {
  std::vector<double> sum;
  std::vector<double> adacons;  // only when an adacons strategy is measured
  std::vector<double> adasum;   // only when an adasum strategy is measured
};

References buildReferences(DType dtype, int ranks, std::size_t count, bool adacons, bool adasum) {
  References refs;
  const HostValues rounding(dtype, 0);
  refs.sum.assign(count, 0.0);
  std::vector<std::vector<float>> inputs(adacons || adasum ? static_cast<std::size_t>(ranks) : 0);
  for (int r = 0; r < ranks; ++r) {
    if (!inputs.empty()) inputs[static_cast<std::size_t>(r)].resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      const double value = rounding.rounded(randomValue(r, i));
      refs.sum[i] += value;
      if (!inputs.empty()) inputs[static_cast<std::size_t>(r)][i] = static_cast<float>(value);
    }
  }
  if (inputs.empty()) return refs;
  std::vector<const float*> gradients;
  for (const auto& input : inputs) gradients.push_back(input.data());
  std::vector<float> out(count);
  const auto widen = [&out] { return std::vector<double>(out.begin(), out.end()); };
  if (adacons) {
    // A fresh momentum state: the check runs a fresh strategy once (see CommSweep::run).
    methods::AdaConsState state;
    methods::adacons(gradients, count, state, comm::StrategyOptions{}.adacons, out.data());
    refs.adacons = widen();
  }
  if (adasum) {
    methods::adasum(gradients, count, out.data());
    refs.adasum = widen();
  }
  return refs;
}

// One size's buffers: the communicator's send and receive buffers, the host-side inputs and results,
// and the references.
struct SizeData {
  comm::Buffer send, recv;
  HostValues random, verifiable, result;
  References refs;
};

SizeData prepareSize(comm::Communicator& comm, DType dtype, std::size_t count, bool check, int modulus,
                     bool adacons, bool adasum) {
  const std::size_t bytes = count * sizeOf(dtype);
  SizeData data{comm.local().allocate(bytes),         comm.local().allocate(bytes), HostValues(dtype, count),
                HostValues(dtype, check ? count : 0), HostValues(dtype, count),     {}};
  for (std::size_t i = 0; i < count; ++i) data.random.set(i, randomValue(comm.rank(), i));
  if (check) {
    for (std::size_t i = 0; i < count; ++i) data.verifiable.set(i, verifiableValue(comm.rank(), i, modulus));
    data.refs = buildReferences(dtype, comm.size(), count, adacons, adasum);
  }
  return data;
}

const std::vector<double>& referenceFor(const References& refs, Aggregator aggregator) {
  switch (aggregator) {
    case Aggregator::AdaCons: return refs.adacons;
    case Aggregator::AdaSum: return refs.adasum;
    case Aggregator::Sum:
    case Aggregator::Async: break;
  }
  return refs.sum;
}

// One rank's timed calls: the average (what OSU and nccl-tests report) and the median call. On a shared
// machine one call now and then stalls for hundreds of microseconds (the process is descheduled); that
// moves a 20-call average of a 10 µs collective by 100% and its median not at all.
struct CallTimes {
  double mean_us = 0, median_us = 0;
};

CallTimes summariseCalls(std::vector<double> calls_us) {
  CallTimes times;
  if (calls_us.empty()) return times;
  double total = 0;
  for (const double us : calls_us) total += us;
  times.mean_us = total / static_cast<double>(calls_us.size());
  times.median_us = summarise(std::move(calls_us)).median_us;
  return times;
}

// OSU's osu_allreduce loop: time each call on its own, barrier between calls.
CallTimes timeEachCallWithBarrier(comm::Communicator& comm, comm::Strategy& strategy, const void* send,
                                  void* recv, std::size_t count, int iters) {
  std::vector<double> calls_us(static_cast<std::size_t>(iters));
  for (auto& call_us : calls_us) {
    const auto start = Clock::now();
    strategy.run(send, recv, count);
    call_us = microsecondsSince(start);
    comm.barrier();
  }
  return summariseCalls(std::move(calls_us));
}

// nccl-tests' loop: enqueue every call, wait once, average (the calls overlap their launch latency).
// The caller has synchronised and met the other ranks at a barrier, as nccl-tests does before its timer.
double timeLaunchLoop(comm::Communicator& comm, comm::Strategy& strategy, const void* send, void* recv,
                      std::size_t count, int iters) {
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) strategy.run(send, recv, count);
  comm.synchronize();
  return microsecondsSince(start) / iters;
}

}  // namespace

BenchContext commContext(const comm::Communicator& comm) {
  BenchContext context;
  context.backend = comm.backend();
  context.description = comm.description();
  context.world_size = comm.size();
  context.timing =
      comm.backend() == Backend::Nccl
          ? "nccl-tests loop: n calls enqueued, one stream sync, average per rank"
          : "OSU loop: clock around each call, barrier between calls, average per rank (trace: median call)";
  return context;
}

BenchContext localContext(const BenchOptions& options) {
  BenchContext context;
  context.backend = Backend::Local;
  auto& executor = methods::CpuExecutor::shared();
  context.description =
      fmt::format("local sums of {} inputs, {} thread{} ({})", options.inputs, executor.threads(),
                  executor.threads() == 1 ? "" : "s", methods::cpuKernelIsa());
  context.world_size = 1;
  context.timing = "each call timed on its own, average (trace: median call)";
  return context;
}

struct CommSweep::Impl {
  comm::Communicator& comm;
  const BenchOptions& options;
  std::vector<PreparedStrategy> prepared;
  bool any_adacons = false;
  bool any_adasum = false;
};

CommSweep::CommSweep(comm::Communicator& comm, const BenchOptions& options,
                     const std::vector<std::string>& strategies)
    : impl_(std::make_unique<Impl>(Impl{comm, options, {}})) {
  for (const auto& text : strategies) {
    // Names were validated by selectStrategies on every rank alike.
    auto name = *parseStrategyName(text);
    impl_->any_adacons = impl_->any_adacons || name.aggregator == Aggregator::AdaCons;
    impl_->any_adasum = impl_->any_adasum || name.aggregator == Aggregator::AdaSum;
    auto strategy = makeAgreedStrategy(comm, name, options.dtype);
    impl_->prepared.push_back({text, std::move(name), std::move(strategy)});
  }
}

CommSweep::~CommSweep() = default;

void CommSweep::run(const PointCallback& on_point) {
  auto& comm = impl_->comm;
  const auto& options = impl_->options;
  const DType dtype = options.dtype;
  const int ranks = comm.size();
  const std::size_t element = sizeOf(dtype);
  auto& local = comm.local();

  const int modulus = verifiableModulus(dtype, ranks);
  for (const std::uint64_t size : sweepSizes(options)) {
    const std::size_t count = size / element;
    const std::size_t bytes = count * element;
    // Collective from here on: a rank that cannot allocate (a large size, typically) must not leave
    // the others waiting in the next collective.
    std::optional<SizeData> data;
    std::string error;
    try {
      data.emplace(
          prepareSize(comm, dtype, count, options.check, modulus, impl_->any_adacons, impl_->any_adasum));
    } catch (const std::exception& failure) {
      error = fmt::format("cannot set up the {} point: {}", formatBytes(bytes), failure.what());
    }
    agreeOnFailure(comm, error);
    auto& [send, recv, random, verifiable, result, refs] = *data;

    for (auto& entry : impl_->prepared) {
      BenchPoint point;
      point.strategy = entry.text;
      point.bytes = bytes;
      point.count = count;
      point.reps = options.iters;

      if (options.check) {
        if (entry.strategy->lossless()) {
          local.upload(send.get(), verifiable.data(), bytes);
          local.fillZero(recv.get(), bytes);
          entry.strategy->run(send.get(), recv.get(), count);
          local.download(result.data(), recv.get(), bytes);
          double wrong = 0;
          for (std::size_t i = 0; i < count; ++i)
            wrong += result.get(i) != verifiableSum(ranks, i, modulus) ? 1.0 : 0.0;
          double total = 0;
          for (const double rank_wrong : comm.allGatherScalars(wrong)) total += rank_wrong;
          point.wrong = static_cast<std::uint64_t>(total);
        }
        // AdaCons keeps momentum across calls; a fresh instance's first call is what the reference
        // (fresh state) computes.
        std::unique_ptr<comm::Strategy> fresh;
        if (entry.name.aggregator == Aggregator::AdaCons) fresh = makeAgreedStrategy(comm, entry.name, dtype);
        comm::Strategy& checked = fresh ? *fresh : *entry.strategy;
        local.upload(send.get(), random.data(), bytes);
        local.fillZero(recv.get(), bytes);
        checked.run(send.get(), recv.get(), count);
        local.download(result.data(), recv.get(), bytes);
        const auto mine = methods::compareToReference(
            dtype, result.data(), referenceFor(refs, entry.name.aggregator).data(), count);
        point.error = worstOverRanks(comm, mine);
      } else {
        local.upload(send.get(), random.data(), bytes);
      }

      // Timed on the random inputs (the send buffer holds them: strategies leave it unchanged).
      for (int i = 0; i < options.warmup_iters; ++i) entry.strategy->run(send.get(), recv.get(), count);
      comm.synchronize();
      comm.barrier();
      if (comm.backend() == Backend::Nccl) {
        point.time = summarise(comm.allGatherScalars(
            timeLaunchLoop(comm, *entry.strategy, send.get(), recv.get(), count, options.iters)));
        point.median_call = point.time;
      } else {
        const CallTimes calls =
            timeEachCallWithBarrier(comm, *entry.strategy, send.get(), recv.get(), count, options.iters);
        point.time = summarise(comm.allGatherScalars(calls.mean_us));
        point.median_call = summarise(comm.allGatherScalars(calls.median_us));
      }
      point.algbw_gbs = gigabytesPerSecond(static_cast<double>(bytes), point.time.median_us);
      point.busbw_gbs = point.algbw_gbs * busBandwidthFactor(Collective::AllReduce, ranks);
      on_point(point);
    }
  }
}

void runLocalSweep(const BenchOptions& options, const std::vector<std::string>& strategies,
                   const PointCallback& on_point) {
  const DType dtype = options.dtype;
  const int k = options.inputs;
  const std::size_t element = sizeOf(dtype);
  const int modulus = verifiableModulus(dtype, k);

  std::vector<methods::LocalSumMethod> methods_to_run;
  for (const auto& text : strategies) methods_to_run.push_back(*methods::parseLocalSumMethod(text));

  for (const std::uint64_t size : sweepSizes(options)) {
    const std::size_t count = size / element;
    const std::size_t bytes = count * element;
    std::vector<HostValues> inputs(static_cast<std::size_t>(k), HostValues(dtype, count));
    std::vector<const void*> pointers;
    for (const auto& input : inputs) pointers.push_back(input.data());
    HostValues output(dtype, count);

    // The random inputs go last: they stay in place for the timing.
    const auto fill = [&](auto value_of) {
      for (int c = 0; c < k; ++c)
        for (std::size_t i = 0; i < count; ++i) inputs[static_cast<std::size_t>(c)].set(i, value_of(c, i));
    };

    for (std::size_t m = 0; m < methods_to_run.size(); ++m) {
      const auto method = methods_to_run[m];
      BenchPoint point;
      point.strategy = strategies[m];
      point.bytes = bytes;
      point.count = count;
      point.reps = options.iters;

      if (options.check) {
        fill([modulus](int c, std::size_t i) { return verifiableValue(c, i, modulus); });
        if (count != 0) std::memset(output.data(), 0, output.bytes());  // data() is null when empty
        methods::localSum(method, dtype, pointers, output.data(), count);
        std::uint64_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i)
          wrong += output.get(i) != verifiableSum(k, i, modulus) ? 1u : 0u;
        point.wrong = wrong;
      }
      fill([](int c, std::size_t i) { return randomValue(c, i); });
      if (options.check) {
        std::vector<double> reference(count);
        methods::referenceSum(dtype, pointers, reference.data(), count);
        if (count != 0) std::memset(output.data(), 0, output.bytes());  // data() is null when empty
        methods::localSum(method, dtype, pointers, output.data(), count);
        point.error = methods::compareToReference(dtype, output.data(), reference.data(), count);
      }

      for (int i = 0; i < options.warmup_iters; ++i)
        methods::localSum(method, dtype, pointers, output.data(), count);
      std::vector<double> calls_us(static_cast<std::size_t>(options.iters));
      for (auto& call_us : calls_us) {
        const auto start = Clock::now();
        methods::localSum(method, dtype, pointers, output.data(), count);
        call_us = microsecondsSince(start);
      }
      const CallTimes calls = summariseCalls(std::move(calls_us));
      point.time = summarise({calls.mean_us});
      point.median_call = summarise({calls.median_us});
      point.algbw_gbs = gigabytesPerSecond(static_cast<double>(bytes), point.time.median_us);
      const auto moved = methods::localSumBytesMoved(method, dtype, static_cast<std::size_t>(k), count);
      point.busbw_gbs = gigabytesPerSecond(static_cast<double>(moved), point.time.median_us);
      on_point(point);
    }
  }
}

}  // namespace gradscope::cli::bench
