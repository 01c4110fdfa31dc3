// gradscope-sample-mpi-train: a small data-parallel training job in C++ and MPI, the kind of job
// gradscope profiles. It trains a three-layer perceptron (64 -> 128 -> 32 -> 10, ReLU, softmax
// cross-entropy) on synthetic data, each rank on its own shard, and averages the gradients the way
// data-parallel frameworks do. --width W multiplies both hidden layers (64 -> 128W -> 32W -> 10), so the
// reductions grow with W (the 128x32 weight's by W²) while the calls stay the same:
//
//   setup      MPI_Bcast of the initial weights from rank 0 (one call, all parameters)
//   each step  one MPI_Allreduce(MPI_SUM, MPI_FLOAT, in place) per gradient tensor, issued during the
//              backward pass as soon as the tensor is ready (last layer first, as PyTorch DDP does);
//              the 128x32 weight's gradient goes through MPI_Iallreduce and is waited for after the
//              first layer's backward pass, overlapping communication with computation (--blocking:
//              MPI_Allreduce instead); then MPI_Allreduce(MPI_SUM, MPI_DOUBLE) of the loss for logging.
//
// So a step makes seven collectives of seven different sizes and two element types, in this order
// (element counts for the default width 1; W = 16 gives 5120, 160, 1048576, 512, 131072, 2048):
//   MPI_Allreduce 320 fp32 (layer 3 weight), MPI_Allreduce 10 fp32 (layer 3 bias),
//   MPI_Iallreduce 4096 fp32 (layer 2 weight), MPI_Allreduce 32 fp32 (layer 2 bias),
//   MPI_Allreduce 8192 fp32 (layer 1 weight), MPI_Allreduce 128 fp32 (layer 1 bias),
//   MPI_Allreduce 1 fp64 (loss).
//
// Everything is deterministic for a given rank count: data and weights come from a fixed-seed
// generator written here (not <random>'s distributions, whose output differs between standard
// libraries), and MPI's reductions are deterministic for a fixed communicator size. Rank 0 prints the
// final loss in hexadecimal floating point and an FNV-1a hash of the final weights, so two runs can be
// compared bit for bit — with and without a profiler, for example.
//
// For experiments with slow ranks and replicas that may drift apart:
//   --straggler R:F   rank R computes as if 1 + F times slower: each stretch of gradient computation
//                     (forward pass, loss and layer 3's backward pass; layer 2's; layer 1's) is followed
//                     by a busy wait F times as long, before the reductions that follow it. any:F slows one
//                     rank per step, drawn from the step alike on every rank. Only the timing changes.
//   --loss-csv PATH   rank 0 writes step,loss,seconds for every loss it prints and for the last step
//                     (one MPI_Bcast of an int before the weights', for whether rank 0 could open it).
//   --check-replicas  after the last step an MPI_Bcast of rank 0's parameters and an MPI_Gather of one
//                     double per rank: rank 0 prints the largest difference of any rank's from its own.
// Without them the job makes exactly the collectives listed above.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <mpi.h>

#include "experiment.h"

namespace {

namespace samples = gradscope::samples;

constexpr char kProgram[] = "gradscope-sample-mpi-train";

struct Options {
  int steps = 20;
  int width = 1;        // multiplier of the hidden layer widths
  int sleep_ms = 0;     // idle time per step, to make a long-running job out of a short one
  int print_every = 5;  // 0: only the final line
  bool nonblocking = true;
  bool print_pid = false;
  int exit_code = 0;      // returned after MPI_Finalize
  int hang_at_step = -1;  // -1: never; else hang_rank stops for good at the start of this step
  int hang_rank = 0;
  samples::Straggler straggler;
  std::string loss_csv;  // empty: no CSV
  bool check_replicas = false;
};

void printUsage(std::FILE* stream) {
  std::fprintf(stream,
               "usage: %s [--steps N] [--width W] [--sleep-ms M] [--print-every K]\n"
               "          [--nonblocking | --blocking] [--print-pid] [--exit-code C]\n"
               "          [--hang-at-step S [--hang-rank R]] [--straggler R:F | any:F]\n"
               "          [--loss-csv PATH] [--check-replicas]\n"
               "  --steps N        training steps (default 20)\n"
               "  --width W        hidden layers of 128W and 32W units, W from 1 to 64 (default 1)\n"
               "  --sleep-ms M     sleep M ms in every step (default 0)\n"
               "  --print-every K  rank 0 prints the loss every K steps; 0: only at the end (default 5)\n"
               "  --nonblocking    reduce one gradient with MPI_Iallreduce + MPI_Wait (the default)\n"
               "  --blocking       reduce every gradient with MPI_Allreduce\n"
               "  --print-pid      every rank prints its pid to stderr at start\n"
               "  --exit-code C    exit with status C after MPI_Finalize (default 0)\n"
               "  --hang-at-step S rank R stops for good at the start of step S (counted from 0), before\n"
               "                   its reductions, and the other ranks wait in that step's first\n"
               "                   collective: a hung job, to test what ends it (a signal ends it)\n"
               "  --hang-rank R    the rank that hangs (default 0)\n"
               "  --straggler R:F  rank R busy-waits F times as long as each part of its gradient\n"
               "                   computation took, before the reductions after it (0 < F <= 10); any:F\n"
               "                   slows one rank per step, drawn from the step; the results stay the same\n"
               "  --loss-csv PATH  rank 0 writes step,loss,seconds (since the first step) to PATH for every\n"
               "                   loss it prints and for the last step\n"
               "  --check-replicas rank 0 prints the largest difference of any rank's final weights from\n"
               "                   its own, absolute and relative to its largest weight\n",
               kProgram);
}

// 64 keeps every tensor's element count (up to 8192 x 2048 = 16M) well inside MPI's int counts, and the
// job within a few hundred MB per rank.
constexpr int kMaxWidth = 64;

bool parseInt(const char* text, int low, int high, int& value) {
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || parsed < low || parsed > high) return false;
  value = static_cast<int>(parsed);
  return true;
}

// Returns an empty string on success, else what is wrong with the command line.
std::string parseOptions(int argc, char** argv, Options& options, bool& help) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    const auto number = [&](int low, int high, int& target) {
      if (value == nullptr || !parseInt(value, low, high, target)) return false;
      ++i;
      return true;
    };
    if (arg == "--help" || arg == "-h") help = true;
    else if (arg == "--nonblocking") options.nonblocking = true;
    else if (arg == "--blocking") options.nonblocking = false;
    else if (arg == "--print-pid") options.print_pid = true;
    else if (arg == "--check-replicas") options.check_replicas = true;
    else if (arg == "--straggler") {
      if (std::string error = samples::parseStraggler(value, options.straggler, 1); !error.empty())
        return error;
      ++i;
    } else if (arg == "--loss-csv") {
      if (value == nullptr || *value == '\0')
        return "--loss-csv needs a file path (e.g. --loss-csv loss.csv)";
      options.loss_csv = argv[++i];
    } else if (arg == "--steps") {
      if (!number(0, 100'000'000, options.steps)) return "--steps needs a number from 0 to 100000000";
    } else if (arg == "--width") {
      if (!number(1, kMaxWidth, options.width)) return "--width needs a number from 1 to 64";
    } else if (arg == "--sleep-ms") {
      if (!number(0, 3'600'000, options.sleep_ms)) return "--sleep-ms needs a number from 0 to 3600000";
    } else if (arg == "--print-every") {
      if (!number(0, 100'000'000, options.print_every)) return "--print-every needs a number >= 0";
    } else if (arg == "--exit-code") {
      if (!number(0, 255, options.exit_code)) return "--exit-code needs a number from 0 to 255";
    } else if (arg == "--hang-at-step") {
      if (!number(0, 100'000'000, options.hang_at_step)) return "--hang-at-step needs a number >= 0";
    } else if (arg == "--hang-rank") {
      if (!number(0, 1'000'000, options.hang_rank)) return "--hang-rank needs a rank >= 0";
    } else {
      return "unknown argument '" + std::string(arg) + "'";
    }
  }
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

 private:
  std::uint64_t state_;
};

constexpr std::uint64_t kWeightSeed = 0x5eed'0001;
constexpr std::uint64_t kTeacherSeed = 0x5eed'0002;
constexpr std::uint64_t kDataSeed = 0x5eed'0003;
constexpr std::uint64_t kStragglerSeed = 0x5eed'0004;  // --straggler any:F's draws

// Layer widths at --width 1: the three weight gradients (64x128, 128x32, 32x10) and three bias gradients
// (128, 32, 10) give six reductions of six different sizes per step. --width W multiplies the two hidden
// widths; the input and output widths stay.
constexpr std::size_t kBaseWidths[] = {64, 128, 32, 10};
constexpr std::size_t kLayers = std::size(kBaseWidths) - 1;
constexpr std::size_t kInputs = kBaseWidths[0];
constexpr std::size_t kClasses = kBaseWidths[kLayers];
using Widths = std::array<std::size_t, kLayers + 1>;

Widths scaledWidths(int width) {
  const auto w = static_cast<std::size_t>(width);
  return {kBaseWidths[0], kBaseWidths[1] * w, kBaseWidths[2] * w, kBaseWidths[3]};
}

constexpr std::size_t kBatch = 32;          // samples per rank and step
constexpr std::size_t kShardSamples = 512;  // samples per rank, visited in order, batch by batch
constexpr float kLearningRate = 0.2f;

// A dense layer's parameters: weight (inputs x outputs, row-major) and bias, as views into one flat
// parameter vector (which makes the initial broadcast a single call).
struct Layer {
  std::size_t inputs = 0;
  std::size_t outputs = 0;
  std::span<float> weight;
  std::span<float> bias;
};

// The parameters of the whole network in one buffer, and views of it layer by layer. The gradients are
// a second object of this type: same layout, so the SGD update is one loop over the flat buffers.
class Parameters {
 public:
  explicit Parameters(const Widths& widths) {
    std::size_t total = 0;
    for (std::size_t l = 0; l < kLayers; ++l) total += widths[l] * widths[l + 1] + widths[l + 1];
    values_.resize(total);
    std::size_t offset = 0;
    for (std::size_t l = 0; l < kLayers; ++l) {
      Layer& layer = layers_[l];
      layer.inputs = widths[l];
      layer.outputs = widths[l + 1];
      layer.weight = std::span<float>(values_).subspan(offset, layer.inputs * layer.outputs);
      offset += layer.weight.size();
      layer.bias = std::span<float>(values_).subspan(offset, layer.outputs);
      offset += layer.bias.size();
    }
  }
  // The layers are views into values_: a copy would point into the original.
  Parameters(const Parameters&) = delete;
  Parameters& operator=(const Parameters&) = delete;

  const Layer& layer(std::size_t index) const { return layers_[index]; }
  std::span<float> all() { return values_; }
  std::span<const float> all() const { return values_; }

 private:
  std::vector<float> values_;
  Layer layers_[kLayers];
};

// He-style uniform initialisation (bound sqrt(6 / fan_in)); biases stay zero.
void initialise(Parameters& parameters) {
  Rng rng(kWeightSeed);
  for (std::size_t l = 0; l < kLayers; ++l) {
    const Layer& layer = parameters.layer(l);
    const float bound = std::sqrt(6.0f / static_cast<float>(layer.inputs));
    for (float& w : layer.weight) w = bound * rng.symmetric();
  }
}

// This rank's shard: inputs uniform in [-1, 1), labels from a fixed random linear "teacher" that every
// rank shares, so that there is something to learn.
struct Shard {
  std::vector<float> inputs;        // kShardSamples x kInputs
  std::vector<std::size_t> labels;  // kShardSamples
};

Shard makeShard(int rank) {
  Rng teacher_rng(kTeacherSeed);
  std::vector<float> teacher(kInputs * kClasses);
  for (float& t : teacher) t = teacher_rng.symmetric();
  Rng rng(kDataSeed + 0x1000193 * static_cast<std::uint64_t>(rank));
  Shard shard;
  shard.inputs.resize(kShardSamples * kInputs);
  shard.labels.resize(kShardSamples);
  for (float& x : shard.inputs) x = rng.symmetric();
  for (std::size_t s = 0; s < kShardSamples; ++s) {
    const float* x = &shard.inputs[s * kInputs];
    float best_score = -INFINITY;
    for (std::size_t c = 0; c < kClasses; ++c) {
      float score = 0.0f;
      for (std::size_t i = 0; i < kInputs; ++i) score += x[i] * teacher[i * kClasses + c];
      if (score > best_score) {
        best_score = score;
        shard.labels[s] = c;
      }
    }
  }
  return shard;
}

// out (rows x outputs) = in (rows x inputs) . weight + bias, then ReLU when asked.
void forward(const Layer& layer, const float* in, std::size_t rows, bool relu, std::vector<float>& out) {
  out.resize(rows * layer.outputs);
  for (std::size_t r = 0; r < rows; ++r) {
    float* o = &out[r * layer.outputs];
    std::copy(layer.bias.begin(), layer.bias.end(), o);
    for (std::size_t i = 0; i < layer.inputs; ++i) {
      const float x = in[r * layer.inputs + i];
      const float* w = &layer.weight[i * layer.outputs];
      for (std::size_t j = 0; j < layer.outputs; ++j) o[j] += x * w[j];
    }
    if (relu)
      for (std::size_t j = 0; j < layer.outputs; ++j) o[j] = std::max(o[j], 0.0f);
  }
}

// From dout (rows x outputs) and the layer's input `in`, fills the layer's weight and bias gradients
// and, when din is given, din = dout . weight^T masked by the ReLU that produced `in` (positive exactly
// where the ReLU let the value through).
void backward(const Layer& layer, const Layer& gradient, const float* in, const std::vector<float>& dout,
              std::size_t rows, std::vector<float>* din) {
  const std::size_t inputs = layer.inputs, outputs = layer.outputs;
  std::fill(gradient.weight.begin(), gradient.weight.end(), 0.0f);
  std::fill(gradient.bias.begin(), gradient.bias.end(), 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* d = &dout[r * outputs];
    for (std::size_t i = 0; i < inputs; ++i) {
      const float x = in[r * inputs + i];
      float* g = &gradient.weight[i * outputs];
      for (std::size_t j = 0; j < outputs; ++j) g[j] += x * d[j];
    }
    for (std::size_t j = 0; j < outputs; ++j) gradient.bias[j] += d[j];
  }
  if (din == nullptr) return;
  din->assign(rows * inputs, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < inputs; ++i) {
      if (in[r * inputs + i] <= 0.0f) continue;
      const float* w = &layer.weight[i * outputs];
      float sum = 0.0f;
      for (std::size_t j = 0; j < outputs; ++j) sum += w[j] * dout[r * outputs + j];
      (*din)[r * inputs + i] = sum;
    }
  }
}

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

// --straggler on the rank it slows in a step. A step's gradient computation comes in three stretches
// between its reductions (forward pass, loss and layer 3's backward pass; layer 2's backward pass; layer
// 1's); each is followed by a busy wait `fraction` times as long, before the reductions after it, so the
// rank reaches every reduction as late as a rank 1 + fraction times slower would. Fraction 0, on the ranks
// not slowed: nothing.
class Slowdown {
 public:
  explicit Slowdown(double fraction) : fraction_(fraction) {}

  void computeStarts() {
    if (fraction_ > 0) started_ = Clock::now();
  }
  void computeEnds() const {
    if (fraction_ > 0) samples::spinFor(fraction_ * (Clock::now() - started_));
  }

 private:
  double fraction_;
  Clock::time_point started_;
};

// In-place sum of a gradient tensor over all ranks: the data-parallel all-reduce.
void allreduce(std::span<float> tensor) {
  MPI_Allreduce(MPI_IN_PLACE, tensor.data(), static_cast<int>(tensor.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
}

MPI_Request startAllreduce(std::span<float> tensor) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, tensor.data(), static_cast<int>(tensor.size()), MPI_FLOAT, MPI_SUM,
                 MPI_COMM_WORLD, &request);
  return request;
}

// One training step on this rank's next batch; returns the loss averaged over all ranks' batches.
// `slowdown` is this rank's --straggler in this step (fraction 0: none).
double trainStep(Parameters& parameters, Parameters& gradients, const Shard& shard, int step, int world,
                 bool nonblocking, Slowdown slowdown) {
  const std::size_t first = static_cast<std::size_t>(step) * kBatch % kShardSamples;
  const float* x = &shard.inputs[first * kInputs];
  const std::size_t* labels = &shard.labels[first];

  slowdown.computeStarts();
  std::vector<float> h1, h2, logits;
  forward(parameters.layer(0), x, kBatch, true, h1);
  forward(parameters.layer(1), h1.data(), kBatch, true, h2);
  forward(parameters.layer(2), h2.data(), kBatch, false, logits);

  // Softmax cross-entropy, mean over the local batch; dlogits = (softmax - one_hot) / batch.
  double local_loss = 0.0;
  std::vector<float> dlogits(logits.size());
  for (std::size_t r = 0; r < kBatch; ++r) {
    const float* z = &logits[r * kClasses];
    const float top = *std::max_element(z, z + kClasses);
    double denominator = 0.0;
    for (std::size_t c = 0; c < kClasses; ++c) denominator += std::exp(static_cast<double>(z[c] - top));
    for (std::size_t c = 0; c < kClasses; ++c) {
      const double p = std::exp(static_cast<double>(z[c] - top)) / denominator;
      dlogits[r * kClasses + c] = static_cast<float>((p - (c == labels[r] ? 1.0 : 0.0)) / kBatch);
    }
    local_loss -= (static_cast<double>(z[labels[r]] - top) - std::log(denominator)) / kBatch;
  }

  // Backward pass, last layer first; each gradient is reduced as soon as it is complete.
  std::vector<float> dh2, dh1;
  backward(parameters.layer(2), gradients.layer(2), h2.data(), dlogits, kBatch, &dh2);
  slowdown.computeEnds();
  allreduce(gradients.layer(2).weight);
  allreduce(gradients.layer(2).bias);
  slowdown.computeStarts();
  backward(parameters.layer(1), gradients.layer(1), h1.data(), dh2, kBatch, &dh1);
  slowdown.computeEnds();
  // The nonblocking reduction runs while the first layer's backward pass computes. Other collectives on
  // the communicator may start meanwhile: MPI only asks that every rank issue them in the same order.
  MPI_Request pending = MPI_REQUEST_NULL;
  if (nonblocking) pending = startAllreduce(gradients.layer(1).weight);
  else allreduce(gradients.layer(1).weight);
  allreduce(gradients.layer(1).bias);
  slowdown.computeStarts();
  backward(parameters.layer(0), gradients.layer(0), x, dh1, kBatch, nullptr);
  slowdown.computeEnds();
  allreduce(gradients.layer(0).weight);
  allreduce(gradients.layer(0).bias);
  if (nonblocking) MPI_Wait(&pending, MPI_STATUS_IGNORE);

  // SGD on the mean gradient: the sums divided by the number of ranks.
  const float scale = kLearningRate / static_cast<float>(world);
  std::span<float> p = parameters.all();
  std::span<const float> g = gradients.all();
  for (std::size_t i = 0; i < p.size(); ++i) p[i] -= scale * g[i];

  double loss = 0.0;
  MPI_Allreduce(&local_loss, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return loss / world;
}

// --hang-at-step: what a rank stuck in a deadlock, a dead file system or an endless loop looks like to
// the others. pause() keeps the process idle, and it still dies of SIGTERM or SIGINT as a stuck rank
// would (a signal whose handler returns, such as a profiler's SIGPROF, must not end the hang).
[[noreturn]] void hangForever() {
  for (;;) pause();
}

// FNV-1a, 64 bits, over the bytes of the parameters: equal hashes mean (all but certainly) equal weights.
std::uint64_t fnv1a64(std::span<const float> values) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (std::size_t i = 0; i < values.size_bytes(); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  return hash;
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
  if (error.empty() && options.hang_rank >= world)
    error = "--hang-rank " + std::to_string(options.hang_rank) + " is not a rank of this job (ranks 0 to " +
            std::to_string(world - 1) + ")";
  if (error.empty()) error = samples::stragglerRankError(options.straggler, world);
  if (help || !error.empty()) {
    if (rank == 0) {
      if (!error.empty()) std::fprintf(stderr, "%s: %s\n", kProgram, error.c_str());
      printUsage(error.empty() ? stdout : stderr);
    }
    MPI_Finalize();
    return error.empty() ? 0 : 2;
  }
  if (options.print_pid) {
    std::fprintf(stderr, "%s: rank %d pid %ld\n", kProgram, rank, static_cast<long>(getpid()));
    std::fflush(stderr);
  }

  std::optional<samples::LossCsv> csv;
  if (!samples::openLossCsv(options.loss_csv, rank, kProgram, csv)) {
    MPI_Finalize();
    return 2;
  }

  // Rank 0 draws the initial weights; the broadcast gives every rank the same starting point.
  const Widths widths = scaledWidths(options.width);
  Parameters parameters(widths);
  Parameters gradients(widths);
  if (rank == 0) initialise(parameters);
  MPI_Bcast(parameters.all().data(), static_cast<int>(parameters.all().size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  const Shard shard = makeShard(rank);

  if (rank == 0) {
    std::printf("mlp %zu-%zu-%zu-%zu, %zu parameters, %d ranks x %zu samples per step, %d steps, %s\n",
                widths[0], widths[1], widths[2], widths[3], parameters.all().size(), world, kBatch,
                options.steps, options.nonblocking ? "nonblocking" : "blocking");
    std::fflush(stdout);
  }
  double loss = 0.0;
  const Clock::time_point start = Clock::now();
  for (int step = 0; step < options.steps; ++step) {
    if (step == options.hang_at_step && rank == options.hang_rank) hangForever();
    const bool slowed = options.straggler.fraction > 0 &&
                        samples::slowedRank(options.straggler, kStragglerSeed, step, world) == rank;
    loss = trainStep(parameters, gradients, shard, step, world, options.nonblocking,
                     Slowdown(slowed ? options.straggler.fraction : 0.0));
    const Clock::duration elapsed = Clock::now() - start;
    const bool printed = options.print_every > 0 && (step + 1) % options.print_every == 0;
    if (rank == 0 && printed) {
      std::printf("step %d loss %.6f\n", step + 1, loss);
      std::fflush(stdout);
    }
    // The CSV always ends with the last step, printed or not.
    if (csv && (printed || step + 1 == options.steps)) csv->write(step + 1, loss, seconds(elapsed));
    if (options.sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options.sleep_ms));
  }
  const double spread = options.check_replicas ? samples::replicaSpread(parameters.all(), rank, world) : 0.0;
  int status = options.exit_code;
  if (rank == 0) {
    std::printf("final loss %a weights fnv1a64 %016llx\n", loss,
                static_cast<unsigned long long>(fnv1a64(parameters.all())));
    std::fflush(stdout);
    if (options.check_replicas) samples::printReplicaSpread(spread, parameters.all());
    if (csv && !csv->close()) {
      std::fprintf(stderr, "%s: could not write the loss CSV '%s' (%s)\n", kProgram, csv->path().c_str(),
                   csv->error().c_str());
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
