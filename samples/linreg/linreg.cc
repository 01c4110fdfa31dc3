// gradscope-sample-linreg: data-parallel stochastic linear regression, the experiment of the AdaCons
// paper (Choukroun, Azoulay, Kisilev, arXiv 2411.03742), with the gradient aggregator as the variable.
//
// N MPI ranks fit y = x·w* for a fixed ground truth w* of dimension D. Every step each rank draws its
// own mini-batch of B samples, x with independent unit-variance entries and y = x·w* + ε_r, computes the
// gradient of the mean squared error at the current weights, and the ranks aggregate their gradients
// with --aggregator:
//
//   mean     one MPI_Allreduce(MPI_SUM, MPI_FLOAT, in place) on MPI_COMM_WORLD: the call gradscope's
//            agent intercepts, and in apply mode may replace;
//   adacons  gradscope::comm's adacons/native strategy, run on a duplicate of MPI_COMM_WORLD, the way a
//   adasum   user integrating AdaCons (or AdaSum) into an MPI job would: the library's own collectives.
//
// Every aggregator stands in for the sum, and the SGD step divides it by N as the mean does:
// adacons/native scales its aggregate for that (AdaConsScale::MatchSumNorm, strategy.h: the norm of the
// sum when the gradients agree), and AdaSum is treated the same way (Horovod instead applies AdaSum's
// output undivided, which is `--lr` times N here). This is what apply mode does when it replaces the
// mean's all-reduce with adacons/native, so with the strategy's default options the two runs should end
// on the same weights.
//
// The ranks' data differ in quality: rank r's label noise ε_r has standard deviation
// noise · spread^(r/(N−1)), from --noise on rank 0 to --noise × --noise-spread on the last rank (data
// sources of unequal quality, the case where weighting the workers could matter). The loss printed is
// the mean squared error against the noiseless targets x·w* on a fixed held-out set of 1024 samples,
// the same for every aggregator and every rank count.
//
// Everything is deterministic for a given rank count and arguments: the data come from a fixed-seed
// generator written here (not <random>'s distributions, whose output differs between standard
// libraries), every rank starts from w = 0, and the reductions are deterministic for a fixed
// communicator size. Rank 0 ends with the held-out loss in hexadecimal floating point and an FNV-1a hash
// of the final weights, so that two runs can be compared bit for bit.
//
// For experiments with slow ranks and replicas that may drift apart:
//   --straggler R:F   rank R busy-waits F times its gradient computation in every step, before the
//                     aggregation; any:F slows one rank per step, drawn from (--seed, step) alike on every
//                     rank. Only the timing changes: the weights and the loss stay the same to the bit.
//   --loss-csv PATH   rank 0 writes step,loss,seconds for every loss it prints and for the last step.
//   --check-replicas  after the last step rank 0 broadcasts its weights, every rank compares its own
//                     with them, and rank 0 gathers the largest differences and prints the largest.
// Without them the job makes exactly the collectives described above.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <mpi.h>

#include "experiment.h"
#include "gradscope/comm/mpi.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/error.h"

namespace {

namespace samples = gradscope::samples;

constexpr char kProgram[] = "gradscope-sample-linreg";

enum class Aggregator { Mean, AdaCons, AdaSum };

struct Options {
  int steps = 1000;
  int batch = 16;  // samples per rank and step
  int dim = 1000;  // the dimension of the AdaCons paper's sample
  // SGD on this problem with the mean of N·B samples contracts (in expectation) while
  // lr < N·B / (N·B + D + 1): 0.016 at the default batch on one rank, 0.031 at N = 8, B = 4.
  double learning_rate = 0.01;
  double noise = 1.0;          // label noise of rank 0 (standard deviation)
  double noise_spread = 10.0;  // the last rank's label noise over rank 0's
  Aggregator aggregator = Aggregator::Mean;
  std::uint64_t seed = 1;
  int print_every = 100;  // 0: only the final line
  bool timing = false;
  samples::Straggler straggler;
  std::string loss_csv;  // empty: no CSV
  bool check_replicas = false;
};

std::string_view aggregatorName(Aggregator aggregator) {
  switch (aggregator) {
    case Aggregator::Mean: return "mean";
    case Aggregator::AdaCons: return "adacons";
    case Aggregator::AdaSum: return "adasum";
  }
  return "?";
}

void printUsage(std::FILE* stream) {
  std::fprintf(stream,
               "usage: %s [--aggregator mean|adacons|adasum] [--steps N] [--batch B] [--dim D]\n"
               "          [--lr R] [--noise S] [--noise-spread F] [--seed X] [--print-every K] [--timing]\n"
               "          [--straggler R:F | any:F] [--loss-csv PATH] [--check-replicas]\n"
               "  --aggregator A    mean: MPI_Allreduce of the gradients, divided by the ranks;\n"
               "                    adacons, adasum: gradscope's adacons/native or adasum/native strategy\n"
               "                    standing in for the sum, also divided by the ranks (default mean)\n"
               "  --steps N         SGD steps (default 1000)\n"
               "  --batch B         samples per rank and step, 1 to 65536 (default 16)\n"
               "  --dim D           dimension of the weights, 1 to 1048576 (default 1000)\n"
               "  --lr R            learning rate (default 0.01)\n"
               "  --noise S         label noise (standard deviation) of rank 0 (default 1)\n"
               "  --noise-spread F  the last rank's label noise is F times rank 0's, log-spaced between\n"
               "                    (default 10; 1: the same on every rank)\n"
               "  --seed X          seed of w*, the held-out set and the ranks' data (default 1)\n"
               "  --print-every K   rank 0 prints the held-out loss every K steps; 0: only at the end\n"
               "                    (default 100)\n"
               "  --timing          rank 0 prints to stderr the time of the steps and of the aggregation\n"
               "                    calls in them (which includes waiting for the slowest rank)\n"
               "  --straggler R:F   in every step rank R busy-waits F times as long as its gradient\n"
               "                    took, before the aggregation (0 < F <= 10); any:F: one rank per step,\n"
               "                    drawn from --seed and the step. The results stay the same to the bit\n"
               "  --loss-csv PATH   rank 0 writes step,loss,seconds (since the first step) to PATH for\n"
               "                    every loss it prints and for the last step\n"
               "  --check-replicas  rank 0 prints how far any rank's final weights are from its own,\n"
               "                    absolute and relative to its largest weight\n",
               kProgram);
}

// Bounds one rank's batch of inputs (B x D floats) to 256 MiB.
constexpr long long kMaxBatchValues = 1LL << 26;

bool parseInt(const char* text, long low, long high, int& value) {
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || parsed < low || parsed > high) return false;
  value = static_cast<int>(parsed);
  return true;
}

bool parseUnsigned(const char* text, std::uint64_t& value) {
  char* end = nullptr;
  errno = 0;
  if (*text == '-') return false;  // strtoull would wrap it around
  const unsigned long long parsed = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return false;
  value = parsed;
  return true;
}

// A finite number in [low, high]; `open_low` excludes low itself.
bool parseReal(const char* text, double low, double high, bool open_low, double& value) {
  char* end = nullptr;
  errno = 0;
  const double parsed = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(parsed)) return false;
  if (parsed < low || (open_low && parsed == low) || parsed > high) return false;
  value = parsed;
  return true;
}

// Returns an empty string on success, else one line: what is wrong and what to pass instead.
std::string parseOptions(int argc, char** argv, Options& options, bool& help) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    const auto take = [&] { return value != nullptr ? (++i, true) : false; };
    if (arg == "--help" || arg == "-h") {
      help = true;
    } else if (arg == "--timing") {
      options.timing = true;
    } else if (arg == "--check-replicas") {
      options.check_replicas = true;
    } else if (arg == "--straggler") {
      if (std::string error = samples::parseStraggler(value, options.straggler, 3); !error.empty())
        return error;
      ++i;
    } else if (arg == "--loss-csv") {
      if (!take() || *value == '\0') return "--loss-csv needs a file path (e.g. --loss-csv loss.csv)";
      options.loss_csv = value;
    } else if (arg == "--aggregator") {
      const std::string_view name = value != nullptr ? value : "";
      if (name == "mean") options.aggregator = Aggregator::Mean;
      else if (name == "adacons") options.aggregator = Aggregator::AdaCons;
      else if (name == "adasum") options.aggregator = Aggregator::AdaSum;
      else if (value == nullptr)
        return "--aggregator needs one of mean, adacons, adasum (e.g. --aggregator adacons)";
      else return "unknown aggregator '" + std::string(name) + "': pass --aggregator mean, adacons or adasum";
      ++i;
    } else if (arg == "--steps") {
      if (!take() || !parseInt(value, 0, 100'000'000, options.steps))
        return "--steps needs a whole number from 0 to 100000000 (e.g. --steps 1000)";
    } else if (arg == "--batch") {
      if (!take() || !parseInt(value, 1, 65536, options.batch))
        return "--batch needs a whole number from 1 to 65536 (e.g. --batch 16)";
    } else if (arg == "--dim") {
      if (!take() || !parseInt(value, 1, 1 << 20, options.dim))
        return "--dim needs a whole number from 1 to 1048576 (e.g. --dim 1000)";
    } else if (arg == "--lr") {
      if (!take() || !parseReal(value, 0.0, 1e6, true, options.learning_rate))
        return "--lr needs a positive number (e.g. --lr 0.01)";
    } else if (arg == "--noise") {
      if (!take() || !parseReal(value, 0.0, 1e6, false, options.noise))
        return "--noise needs a number >= 0 (e.g. --noise 1)";
    } else if (arg == "--noise-spread") {
      if (!take() || !parseReal(value, 1.0, 1e6, false, options.noise_spread))
        return "--noise-spread needs a number >= 1 (e.g. --noise-spread 10; 1 for equal noise)";
    } else if (arg == "--seed") {
      if (!take() || !parseUnsigned(value, options.seed))
        return "--seed needs a whole number from 0 to 18446744073709551615 (e.g. --seed 1)";
    } else if (arg == "--print-every") {
      if (!take() || !parseInt(value, 0, 100'000'000, options.print_every))
        return "--print-every needs a whole number >= 0 (e.g. --print-every 100; 0 for the final line only)";
    } else {
      return "unknown argument '" + std::string(arg) + "'; --help lists the options";
    }
  }
  if (static_cast<long long>(options.batch) * options.dim > kMaxBatchValues)
    return "--batch x --dim must be at most 67108864 (256 MiB of inputs per rank); pass a smaller --batch or "
           "--dim";
  return {};
}

// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and the same numbers on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform in [-1, 1), from the top 24 bits: exactly representable in a float.
  float symmetric() { return static_cast<float>(next() >> 40) * 0x1p-23f - 1.0f; }

  // Mean 0, variance 1 − 2^-32, approximately normal: the sum of four uniforms (Irwin–Hall) from the
  // four 16-bit quarters of one draw, centred and scaled by √3. An integer sum and one rounding, so the
  // same bits everywhere and no libm; bounded by ±2√3, which least squares does not mind (its gradients
  // depend on E[x xᵀ] = I), and several times cheaper than Box–Muller.
  float gaussian() {
    const std::uint64_t bits = next();
    const auto sum = static_cast<std::int64_t>((bits & 0xffff) + ((bits >> 16) & 0xffff) +
                                               ((bits >> 32) & 0xffff) + (bits >> 48));
    // Each (quarter + 1/2) / 65536 has mean 1/2 and variance 1/12: (their sum − 2) · √3.
    constexpr float kScale = 1.7320508075688772f / 65536.0f;
    return static_cast<float>(sum + 2 - 2 * 65536) * kScale;
  }

 private:
  std::uint64_t state_;
};

// Independent streams from one --seed: w*, the held-out set, and rank r's data (stream 2 + r).
std::uint64_t streamSeed(std::uint64_t seed, std::uint64_t stream) {
  Rng mix(seed ^ (stream * 0xd1b54a32d192ed03ULL));
  mix.next();
  return mix.next();
}

constexpr std::uint64_t kTruthStream = 0;
constexpr std::uint64_t kHeldOutStream = 1;
constexpr std::uint64_t kFirstRankStream = 2;
constexpr std::size_t kHeldOutSamples = 1024;

// w*: entries uniform in [-1, 1), so the loss at w = 0 is about D/3.
std::vector<float> makeTruth(std::uint64_t seed, std::size_t dim) {
  Rng rng(streamSeed(seed, kTruthStream));
  std::vector<float> truth(dim);
  for (float& w : truth) w = rng.symmetric();
  return truth;
}

// Mean squared error against the noiseless targets x·w* over the held-out set, in fp64: the excess risk
// over the label noise. The set is the same on every rank and in every run with the same --seed and
// --dim; it is drawn again at each evaluation rather than kept (1024 x D floats).
double heldOutLoss(std::uint64_t seed, std::span<const float> truth, std::span<const float> weights) {
  Rng rng(streamSeed(seed, kHeldOutStream));
  double total = 0;
  for (std::size_t s = 0; s < kHeldOutSamples; ++s) {
    double error = 0;
    for (std::size_t i = 0; i < weights.size(); ++i)
      error += static_cast<double>(rng.gaussian()) *
               (static_cast<double>(weights[i]) - static_cast<double>(truth[i]));
    total += error * error;
  }
  return total / static_cast<double>(kHeldOutSamples);
}

// One rank's data stream: a fresh mini-batch every step (the online setting of the paper's experiment).
class Worker {
 public:
  Worker(const Options& options, const std::vector<float>& truth, int rank, int world)
      : rng_(streamSeed(options.seed, kFirstRankStream + static_cast<std::uint64_t>(rank))),
        truth_(truth),
        batch_(static_cast<std::size_t>(options.batch)),
        inputs_(batch_ * truth.size()),
        residuals_(batch_) {
    const double position = world > 1 ? static_cast<double>(rank) / (world - 1) : 0.0;
    noise_ = static_cast<float>(options.noise * std::pow(options.noise_spread, position));
  }

  // gradient = (2/B) Σ_b x_b (x_b·w − y_b) on a new batch, with y_b = x_b·w* + noise·z_b.
  void gradient(std::span<const float> weights, std::span<float> gradient) {
    const std::size_t dim = weights.size();
    for (float& x : inputs_) x = rng_.gaussian();
    for (std::size_t b = 0; b < batch_; ++b) {
      const float* x = &inputs_[b * dim];
      float prediction = 0, target = 0;
      for (std::size_t i = 0; i < dim; ++i) {
        prediction += x[i] * weights[i];
        target += x[i] * truth_[i];
      }
      target += noise_ * rng_.gaussian();
      residuals_[b] = prediction - target;
    }
    std::fill(gradient.begin(), gradient.end(), 0.0f);
    for (std::size_t b = 0; b < batch_; ++b) {
      const float* x = &inputs_[b * dim];
      const float r = residuals_[b];
      for (std::size_t i = 0; i < dim; ++i) gradient[i] += x[i] * r;
    }
    const float scale = 2.0f / static_cast<float>(batch_);
    for (float& g : gradient) g *= scale;
  }

 private:
  Rng rng_;
  const std::vector<float>& truth_;
  std::size_t batch_;
  std::vector<float> inputs_;
  std::vector<float> residuals_;
  float noise_ = 0;
};

// FNV-1a, 64 bits, over the bytes of the weights: equal hashes mean (all but certainly) equal weights.
std::uint64_t fnv1a64(std::span<const float> values) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (std::size_t i = 0; i < values.size_bytes(); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  return hash;
}

// Whether the weights are farther from w* than where training started (w = 0), or not finite.
bool divergedFrom(std::span<const float> truth, std::span<const float> weights) {
  double distance = 0, initial = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double error = static_cast<double>(weights[i]) - static_cast<double>(truth[i]);
    distance += error * error;
    initial += static_cast<double>(truth[i]) * static_cast<double>(truth[i]);
  }
  return !(distance <= initial);
}

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

// The training loop; returns the exit status. Collective: every rank runs it with the same options.
// `csv` is rank 0's --loss-csv, or null.
int train(const Options& options, int rank, int world, samples::LossCsv* csv) {
  const auto dim = static_cast<std::size_t>(options.dim);
  const std::vector<float> truth = makeTruth(options.seed, dim);
  Worker worker(options, truth, rank, world);

  // The adaptive aggregators run on gradscope's MPI communicator: mpiWorld() finds MPI initialised by
  // main() and duplicates MPI_COMM_WORLD, so the strategy's own collectives never mix with this job's.
  // They are destroyed before main() calls MPI_Finalize.
  std::unique_ptr<gradscope::comm::Communicator> comm;
  std::unique_ptr<gradscope::comm::Strategy> strategy;
  std::string strategy_text = "MPI_Allreduce";
  if (options.aggregator != Aggregator::Mean) {
    const std::string name = std::string(aggregatorName(options.aggregator)) + "/native";
    comm = gradscope::comm::mpiWorld();
    strategy =
        gradscope::comm::makeStrategy(*gradscope::parseStrategyName(name), *comm, gradscope::DType::Fp32);
    strategy_text = strategy->name().text();
  }

  if (rank == 0) {
    std::printf(
        "linreg dim %zu, %d workers x %d samples per step, %d steps, lr %g, label noise %g (rank 0) to %g "
        "(rank %d), aggregator %s (%s)\n",
        dim, world, options.batch, options.steps, options.learning_rate, options.noise,
        world > 1 ? options.noise * options.noise_spread : options.noise, world - 1,
        std::string(aggregatorName(options.aggregator)).c_str(), strategy_text.c_str());
    std::fflush(stdout);
  }

  std::vector<float> weights(dim, 0.0f);
  std::vector<float> gradient(dim);
  const float learning_rate = static_cast<float>(options.learning_rate);
  const auto workers = static_cast<float>(world);
  Clock::duration aggregation{};
  const Clock::time_point start = Clock::now();
  for (int step = 0; step < options.steps; ++step) {
    const Clock::time_point computing = Clock::now();
    worker.gradient(weights, gradient);
    if (options.straggler.fraction > 0 &&
        samples::slowedRank(options.straggler, options.seed, step, world) == rank)
      samples::spinFor(options.straggler.fraction * (Clock::now() - computing));
    const Clock::time_point before = Clock::now();
    if (strategy == nullptr) {
      MPI_Allreduce(MPI_IN_PLACE, gradient.data(), options.dim, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
      try {
        strategy->run(gradient.data(), gradient.data(), dim);
      } catch (const gradscope::Error& failure) {
        // AdaCons refuses a step it cannot normalise, on every rank alike; here the usual cause is a
        // learning rate too large for the batch, which drives the weights away until the gradients overflow.
        const bool diverged = divergedFrom(truth, weights);
        throw gradscope::Error("step " + std::to_string(step + 1) + ": " + failure.what() +
                               (diverged ? "; the weights diverged: try a smaller --lr" : ""));
      }
    }
    aggregation += Clock::now() - before;
    // Every aggregate stands in for the sum: divided (not multiplied by 1/N, inexact for N not a power
    // of two) by the number of workers, as a mean.
    for (std::size_t i = 0; i < dim; ++i) weights[i] -= learning_rate * (gradient[i] / workers);
    if (rank == 0 && options.print_every > 0 && (step + 1) % options.print_every == 0) {
      const Clock::duration elapsed = Clock::now() - start;
      const double loss = heldOutLoss(options.seed, truth, weights);
      std::printf("step %d loss %.6g\n", step + 1, loss);
      std::fflush(stdout);
      if (csv != nullptr) csv->write(step + 1, loss, seconds(elapsed));
    }
  }
  const Clock::duration total = Clock::now() - start;

  const double spread = options.check_replicas ? samples::replicaSpread(weights, rank, world) : 0.0;
  int status = 0;
  if (rank == 0) {
    const double loss = heldOutLoss(options.seed, truth, weights);
    // The last step's row, unless it was printed: the curve always ends where training did.
    if (csv != nullptr && csv->lastStep() != options.steps) csv->write(options.steps, loss, seconds(total));
    std::printf("final loss %.6g (%a) aggregator %s workers %d batch %d weights fnv1a64 %016llx\n", loss,
                loss, std::string(aggregatorName(options.aggregator)).c_str(), world, options.batch,
                static_cast<unsigned long long>(fnv1a64(weights)));
    std::fflush(stdout);
    if (options.check_replicas) samples::printReplicaSpread(spread, weights);
    if (csv != nullptr && !csv->close()) {
      std::fprintf(stderr, "%s: could not write the loss CSV '%s' (%s)\n", kProgram, csv->path().c_str(),
                   csv->error().c_str());
      status = 1;
    }
    if (options.timing) {
      const double steps = std::max(options.steps, 1);
      std::fprintf(stderr, "%s: rank 0: %d steps in %.3f s, aggregation %.3f s (%.1f us per step)\n",
                   kProgram, options.steps, seconds(total), seconds(aggregation),
                   1e6 * seconds(aggregation) / steps);
    }
    if (divergedFrom(truth, weights)) {
      std::fprintf(stderr,
                   "%s: the weights diverged (farther from w* than at the start); try a smaller --lr\n",
                   kProgram);
      status = 1;
    }
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  Options options;
  bool help = false;
  std::string error = parseOptions(argc, argv, options, help);
  if (error.empty()) error = samples::stragglerRankError(options.straggler, world);
  if (help || !error.empty()) {
    if (rank == 0) {
      if (error.empty()) printUsage(stdout);
      else std::fprintf(stderr, "%s: %s\n", kProgram, error.c_str());
    }
    MPI_Finalize();
    return error.empty() ? 0 : 2;
  }

  std::optional<samples::LossCsv> csv;
  if (!samples::openLossCsv(options.loss_csv, rank, kProgram, csv)) {
    MPI_Finalize();
    return 2;
  }

  int status = 0;
  try {
    status = train(options, rank, world, csv ? &*csv : nullptr);
  } catch (const std::exception& failure) {
    // gradscope::comm throws on every rank alike (a step AdaCons cannot normalise, say, once the
    // weights diverge), so every rank gets here and MPI can still be finalised in step.
    if (rank == 0) std::fprintf(stderr, "%s: %s\n", kProgram, failure.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
