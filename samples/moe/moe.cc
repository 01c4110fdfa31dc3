// gradscope-sample-moe: an expert-parallel (mixture-of-experts) training job in C++ and MPI, the
// all-to-all traffic gradscope profiles. Every rank holds one expert, and the same copy of the layers
// around it:
//
//   x (32 inputs) -> input layer (32 -> 64, ReLU) = h -> gate: one expert per token
//     -> the token's expert (64 -> F -> 64, ReLU in between; F = --expert-hidden, default 128) = y
//     -> z = h + y -> output layer (64 -> 16) -> squared error against a fixed random "teacher"
//
// The gate is a fixed function, not learned: a token goes to the expert with the highest score h . g_e +
// skew_e, where the g_e are fixed random vectors and skew_e falls from expert 0 to the last. The experts
// get deliberately uneven loads (on 4 ranks the busiest about 4 times the idlest's), which change from
// step to step with the data. Every step, each rank takes --tokens T tokens of its own (default 256):
//
//   forward   MPI_Alltoall of the number of tokens this rank sends to each expert (one int per rank);
//             MPI_Alltoallv of the tokens themselves (64 floats each) to their experts (dispatch), and of
//             the experts' outputs back (combine);
//   backward  the same two MPI_Alltoallv the other way round: the outputs' gradients to the experts, the
//             gradients of the experts' inputs back;
//   update    one MPI_Allreduce (MPI_SUM, MPI_FLOAT, in place) of the gradients of the layers every rank
//             holds, and one of the loss (MPI_DOUBLE); each expert is updated where it lives.
//
// The busiest expert's rank computes the most, and every rank waits for it in the next exchange: the
// imbalance a profile of this job shows. Runs on any number of ranks (one expert each).
//
// Deterministic for a given number of ranks: data and weights come from a fixed-seed generator written
// here, the exchanges move data without arithmetic, and MPI's reductions are deterministic for a fixed
// communicator size. At the end rank 0 prints the last step's loads per expert and the final loss in
// hexadecimal floating point with an FNV-1a hash of every rank's weights, so that runs with and without
// a profiler can be compared bit for bit. The wall time of the training loop goes to stderr.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <mpi.h>

namespace {

constexpr char kProgram[] = "gradscope-sample-moe";

struct Options {
  int steps = 20;
  int tokens = 256;
  int expert_hidden = 128;
};

void printUsage(std::FILE* stream) {
  std::fprintf(stream,
               "usage: %s [--steps N] [--tokens T] [--expert-hidden F]\n"
               "  one expert per rank, any number of ranks\n"
               "  --steps N          training steps (default 20)\n"
               "  --tokens T         tokens per rank and step, 1 to 65536 (default 256)\n"
               "  --expert-hidden F  width of each expert's hidden layer, 8 to 4096 (default 128)\n",
               kProgram);
}

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
    if (arg == "--help" || arg == "-h") {
      help = true;
    } else if (arg == "--steps") {
      if (!number(0, 100'000'000, options.steps)) return "--steps needs a number from 0 to 100000000";
    } else if (arg == "--tokens") {
      if (!number(1, 65536, options.tokens)) return "--tokens needs a number from 1 to 65536";
    } else if (arg == "--expert-hidden") {
      if (!number(8, 4096, options.expert_hidden)) return "--expert-hidden needs a number from 8 to 4096";
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

constexpr std::uint64_t kSharedSeed = 0x5eed'0201;  // the layers every rank holds
constexpr std::uint64_t kExpertSeed = 0x5eed'0202;  // + the expert's rank
constexpr std::uint64_t kGateSeed = 0x5eed'0203;
constexpr std::uint64_t kTeacherSeed = 0x5eed'0204;
constexpr std::uint64_t kDataSeed = 0x5eed'0205;

constexpr std::size_t kInputs = 32;
constexpr std::size_t kModel = 64;  // the width of h, y and z: one token on the wire
constexpr std::size_t kOutputs = 16;
constexpr float kLearningRate = 0.05f;
constexpr float kSkew = 1.5f;  // expert 0's score bonus over the last expert's (the loads' unevenness)

int count(std::size_t n) {
  return static_cast<int>(n);
}

// A dense layer (weight inputs x outputs, row-major, then bias) at `offset` of a flat parameter vector; the
// gradients are another vector of the same layout.
struct Layer {
  std::size_t inputs = 0;
  std::size_t outputs = 0;
  std::size_t offset = 0;

  std::size_t size() const { return inputs * outputs + outputs; }
  const float* weight(const std::vector<float>& flat) const { return flat.data() + offset; }
  float* weight(std::vector<float>& flat) const { return flat.data() + offset; }
  const float* bias(const std::vector<float>& flat) const { return flat.data() + offset + inputs * outputs; }
  float* bias(std::vector<float>& flat) const { return flat.data() + offset + inputs * outputs; }
};

// Uniform initialisation, biases zero: He's bound sqrt(6 / fan_in) for a layer followed by a ReLU, a
// smaller sqrt(1 / fan_in) for the others, so that the residual sum and the output start small.
void initialise(const Layer& layer, bool relu, Rng& rng, std::vector<float>& flat) {
  const float bound = std::sqrt((relu ? 6.0f : 1.0f) / static_cast<float>(layer.inputs));
  float* w = layer.weight(flat);
  for (std::size_t i = 0; i < layer.inputs * layer.outputs; ++i) w[i] = bound * rng.symmetric();
}

// out (rows x outputs) = in (rows x inputs) . weight + bias, then ReLU when asked.
void forward(const Layer& layer, const std::vector<float>& flat, const float* in, std::size_t rows, bool relu,
             std::vector<float>& out) {
  const float* weight = layer.weight(flat);
  const float* bias = layer.bias(flat);
  out.resize(rows * layer.outputs);
  for (std::size_t r = 0; r < rows; ++r) {
    float* o = &out[r * layer.outputs];
    std::copy(bias, bias + layer.outputs, o);
    for (std::size_t i = 0; i < layer.inputs; ++i) {
      const float x = in[r * layer.inputs + i];
      const float* w = &weight[i * layer.outputs];
      for (std::size_t j = 0; j < layer.outputs; ++j) o[j] += x * w[j];
    }
    if (relu)
      for (std::size_t j = 0; j < layer.outputs; ++j) o[j] = std::max(o[j], 0.0f);
  }
}

// From dout (rows x outputs) and the layer's input `in`: the weight and bias gradients into `gradients`
// (overwritten) and, when din is given, din = dout . weight^T, masked by the ReLU that produced `in` when
// `in_relu`.
void backward(const Layer& layer, const std::vector<float>& flat, std::vector<float>& gradients,
              const float* in, const float* dout, std::size_t rows, bool in_relu, std::vector<float>* din) {
  const std::size_t inputs = layer.inputs, outputs = layer.outputs;
  float* dw = layer.weight(gradients);
  float* db = layer.bias(gradients);
  std::fill(dw, dw + inputs * outputs, 0.0f);
  std::fill(db, db + outputs, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* d = &dout[r * outputs];
    for (std::size_t i = 0; i < inputs; ++i) {
      const float x = in[r * inputs + i];
      float* g = &dw[i * outputs];
      for (std::size_t j = 0; j < outputs; ++j) g[j] += x * d[j];
    }
    for (std::size_t j = 0; j < outputs; ++j) db[j] += d[j];
  }
  if (din == nullptr) return;
  const float* weight = layer.weight(flat);
  din->assign(rows * inputs, 0.0f);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < inputs; ++i) {
      if (in_relu && in[r * inputs + i] <= 0.0f) continue;
      const float* w = &weight[i * outputs];
      float sum = 0.0f;
      for (std::size_t j = 0; j < outputs; ++j) sum += w[j] * dout[r * outputs + j];
      (*din)[r * inputs + i] = sum;
    }
}

// FNV-1a, 64 bits, over bytes: equal hashes mean (all but certainly) equal weights.
std::uint64_t fnv1a64(const void* data, std::size_t size, std::uint64_t hash = 0xcbf29ce484222325ULL) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  return hash;
}

// Which rows of a token matrix go to which rank, and where they are on either side: the counts and
// displacements of an MPI_Alltoallv of whole tokens (kModel floats each).
struct Exchange {
  std::vector<int> send_tokens, receive_tokens;                               // per rank
  std::vector<int> send_counts, send_displs, receive_counts, receive_displs;  // in floats

  void plan(int world) {
    const auto n = static_cast<std::size_t>(world);
    send_counts.assign(n, 0);
    send_displs.assign(n, 0);
    receive_counts.assign(n, 0);
    receive_displs.assign(n, 0);
    for (std::size_t r = 0; r < n; ++r) {
      send_counts[r] = send_tokens[r] * count(kModel);
      receive_counts[r] = receive_tokens[r] * count(kModel);
      if (r > 0) {
        send_displs[r] = send_displs[r - 1] + send_counts[r - 1];
        receive_displs[r] = receive_displs[r - 1] + receive_counts[r - 1];
      }
    }
  }
  std::size_t received() const {
    return static_cast<std::size_t>(std::accumulate(receive_tokens.begin(), receive_tokens.end(), 0));
  }
  // To the experts (dispatch): what this rank's tokens send, in expert order; the answer comes back with
  // the counts swapped (combine).
  void toExperts(const std::vector<float>& packed, std::vector<float>& at_expert) const {
    at_expert.resize(received() * kModel);
    MPI_Alltoallv(packed.data(), send_counts.data(), send_displs.data(), MPI_FLOAT, at_expert.data(),
                  receive_counts.data(), receive_displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
  }
  void fromExperts(const std::vector<float>& at_expert, std::vector<float>& packed) const {
    MPI_Alltoallv(at_expert.data(), receive_counts.data(), receive_displs.data(), MPI_FLOAT, packed.data(),
                  send_counts.data(), send_displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
  }
};

class MoeRank {
 public:
  MoeRank(int rank, int world, const Options& options)
      : rank_(rank),
        world_(world),
        tokens_(static_cast<std::size_t>(options.tokens)),
        input_{kInputs, kModel, 0},
        output_{kModel, kOutputs, kInputs * kModel + kModel},
        expert_in_{kModel, static_cast<std::size_t>(options.expert_hidden), 0},
        expert_out_{static_cast<std::size_t>(options.expert_hidden), kModel, expert_in_.size()},
        shared_(input_.size() + output_.size()),
        shared_gradients_(shared_.size()),
        expert_(expert_in_.size() + expert_out_.size()),
        expert_gradients_(expert_.size()),
        gates_(kModel * static_cast<std::size_t>(world)),
        teacher_(kInputs * kOutputs) {
    Rng shared_rng(kSharedSeed);
    initialise(input_, true, shared_rng, shared_);
    initialise(output_, false, shared_rng, shared_);
    Rng expert_rng(kExpertSeed + static_cast<std::uint64_t>(rank));
    initialise(expert_in_, true, expert_rng, expert_);
    initialise(expert_out_, false, expert_rng, expert_);
    Rng gate_rng(kGateSeed);
    for (float& g : gates_) g = gate_rng.symmetric();
    Rng teacher_rng(kTeacherSeed);
    for (float& t : teacher_) t = teacher_rng.symmetric();
  }

  // One training step; returns the loss averaged over all ranks' tokens.
  double step(int step_index) {
    makeBatch(step_index);
    // Forward: the input layer, the gate, the exchange of counts and tokens, the experts, back, the output.
    forward(input_, shared_, x_.data(), tokens_, true, h_);
    route();
    MPI_Alltoall(exchange_.send_tokens.data(), 1, MPI_INT, exchange_.receive_tokens.data(), 1, MPI_INT,
                 MPI_COMM_WORLD);
    exchange_.plan(world_);
    pack(h_, packed_);
    exchange_.toExperts(packed_, expert_input_);
    const std::size_t arrived = exchange_.received();
    forward(expert_in_, expert_, expert_input_.data(), arrived, true, expert_hidden_);
    forward(expert_out_, expert_, expert_hidden_.data(), arrived, false, expert_output_);
    exchange_.fromExperts(expert_output_, packed_);
    unpack(packed_, y_);
    z_.resize(tokens_ * kModel);
    for (std::size_t i = 0; i < z_.size(); ++i) z_[i] = h_[i] + y_[i];
    forward(output_, shared_, z_.data(), tokens_, false, out_);

    // The loss: half the squared error, mean over this rank's tokens.
    double local_loss = 0.0;
    dout_.resize(out_.size());
    for (std::size_t t = 0; t < tokens_; ++t)
      for (std::size_t o = 0; o < kOutputs; ++o) {
        const float error = out_[t * kOutputs + o] - target_[t * kOutputs + o];
        local_loss +=
            0.5 * static_cast<double>(error) * static_cast<double>(error) / static_cast<double>(tokens_);
        dout_[t * kOutputs + o] = error / static_cast<float>(tokens_);
      }

    // Backward: the output layer, the experts (through the same exchanges the other way), the input layer.
    backward(output_, shared_, shared_gradients_, z_.data(), dout_.data(), tokens_, false, &dz_);
    pack(dz_, packed_);
    exchange_.toExperts(packed_, dexpert_output_);
    backward(expert_out_, expert_, expert_gradients_, expert_hidden_.data(), dexpert_output_.data(), arrived,
             true, &dexpert_hidden_);
    backward(expert_in_, expert_, expert_gradients_, expert_input_.data(), dexpert_hidden_.data(), arrived,
             false, &dexpert_input_);
    exchange_.fromExperts(dexpert_input_, packed_);
    unpack(packed_, dh_);
    for (std::size_t i = 0; i < dh_.size(); ++i) dh_[i] = h_[i] > 0.0f ? dh_[i] + dz_[i] : 0.0f;
    backward(input_, shared_, shared_gradients_, x_.data(), dh_.data(), tokens_, false, nullptr);

    // Update: the shared layers' gradients summed over the ranks; each expert's own are complete here (its
    // tokens came from every rank). The objective is the mean of the ranks' losses.
    MPI_Allreduce(MPI_IN_PLACE, shared_gradients_.data(), count(shared_gradients_.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    const float scale = kLearningRate / static_cast<float>(world_);
    for (std::size_t i = 0; i < shared_.size(); ++i) shared_[i] -= scale * shared_gradients_[i];
    for (std::size_t i = 0; i < expert_.size(); ++i) expert_[i] -= scale * expert_gradients_[i];
    double loss = 0.0;
    MPI_Allreduce(&local_loss, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return loss / world_;
  }

  // Tokens this rank's expert processed in the last step.
  int load() const { return count(exchange_.received()); }
  std::uint64_t sharedHash() const { return fnv1a64(shared_.data(), shared_.size() * sizeof(float)); }
  std::uint64_t expertHash() const { return fnv1a64(expert_.data(), expert_.size() * sizeof(float)); }

 private:
  // This rank's tokens of step s, and their targets: tanh of a fixed random linear map of the inputs.
  void makeBatch(int step_index) {
    constexpr std::uint64_t kRankStride = 0x1000193, kStepStride = 0x100000001b3;
    Rng rng(kDataSeed + kRankStride * static_cast<std::uint64_t>(rank_) +
            kStepStride * static_cast<std::uint64_t>(step_index));
    x_.resize(tokens_ * kInputs);
    for (float& v : x_) v = rng.symmetric();
    target_.assign(tokens_ * kOutputs, 0.0f);
    for (std::size_t t = 0; t < tokens_; ++t)
      for (std::size_t o = 0; o < kOutputs; ++o) {
        float sum = 0.0f;
        for (std::size_t i = 0; i < kInputs; ++i) sum += x_[t * kInputs + i] * teacher_[i * kOutputs + o];
        target_[t * kOutputs + o] = std::tanh(sum);
      }
  }

  // The gate: each token's expert, the highest of h . g_e + skew_e (ties to the lower rank), and how many
  // tokens go to each.
  void route() {
    const auto experts = static_cast<std::size_t>(world_);
    expert_of_.resize(tokens_);
    exchange_.send_tokens.assign(experts, 0);
    exchange_.receive_tokens.assign(experts, 0);
    for (std::size_t t = 0; t < tokens_; ++t) {
      std::size_t best = 0;
      float best_score = -INFINITY;
      for (std::size_t e = 0; e < experts; ++e) {
        float score = experts > 1
                          ? kSkew * static_cast<float>(experts - 1 - e) / static_cast<float>(experts - 1)
                          : 0.0f;
        for (std::size_t i = 0; i < kModel; ++i) score += h_[t * kModel + i] * gates_[e * kModel + i];
        if (score > best_score) {
          best_score = score;
          best = e;
        }
      }
      expert_of_[t] = best;
      ++exchange_.send_tokens[best];
    }
  }

  // Token rows in expert order (stable: a token's place among those for the same expert is its own order).
  void pack(const std::vector<float>& rows, std::vector<float>& packed) const {
    packed.resize(tokens_ * kModel);
    std::vector<std::size_t> next(static_cast<std::size_t>(world_));
    for (std::size_t e = 0; e < next.size(); ++e)
      next[e] = static_cast<std::size_t>(exchange_.send_displs[e]) / kModel;
    for (std::size_t t = 0; t < tokens_; ++t) {
      const std::size_t slot = next[expert_of_[t]]++;
      std::copy(&rows[t * kModel], &rows[t * kModel] + kModel, &packed[slot * kModel]);
    }
  }
  void unpack(const std::vector<float>& packed, std::vector<float>& rows) const {
    rows.resize(tokens_ * kModel);
    std::vector<std::size_t> next(static_cast<std::size_t>(world_));
    for (std::size_t e = 0; e < next.size(); ++e)
      next[e] = static_cast<std::size_t>(exchange_.send_displs[e]) / kModel;
    for (std::size_t t = 0; t < tokens_; ++t) {
      const std::size_t slot = next[expert_of_[t]]++;
      std::copy(&packed[slot * kModel], &packed[slot * kModel] + kModel, &rows[t * kModel]);
    }
  }
  const int rank_;
  const int world_;
  const std::size_t tokens_;
  const Layer input_, output_;          // in shared_
  const Layer expert_in_, expert_out_;  // in expert_
  std::vector<float> shared_, shared_gradients_, expert_, expert_gradients_;
  std::vector<float> gates_, teacher_;
  Exchange exchange_;
  std::vector<std::size_t> expert_of_;
  // One step's activations and gradients. packed_: this rank's token rows in expert order, as sent and
  // received; expert_*: the tokens at this rank's expert, from every rank.
  std::vector<float> x_, target_, h_, packed_, y_, z_, out_, dout_, dz_, dh_;
  std::vector<float> expert_input_, expert_hidden_, expert_output_, dexpert_output_, dexpert_hidden_,
      dexpert_input_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  Options options;
  bool help = false;
  const std::string error = parseOptions(argc, argv, options, help);
  if (help || !error.empty()) {
    if (rank == 0) {
      if (!error.empty()) std::fprintf(stderr, "%s: %s\n", kProgram, error.c_str());
      printUsage(error.empty() ? stdout : stderr);
    }
    MPI_Finalize();
    return error.empty() ? 0 : 2;
  }

  MoeRank moe(rank, world, options);
  if (rank == 0) {
    std::printf("moe %zu-%zu | %d experts %zu-%d-%zu | %zu-%zu, %d ranks x %d tokens per step, %d steps\n",
                kInputs, kModel, world, kModel, options.expert_hidden, kModel, kModel, kOutputs, world,
                options.tokens, options.steps);
    std::fflush(stdout);
  }
  const double started = MPI_Wtime();
  double loss = 0.0;
  for (int step = 0; step < options.steps; ++step) loss = moe.step(step);
  const double elapsed = MPI_Wtime() - started;

  // Rank 0 gathers every expert's load and weights' hash; the shared layers are the same everywhere.
  const auto ranks = static_cast<std::size_t>(world);
  std::vector<int> loads(ranks);
  std::vector<std::uint64_t> hashes(ranks);
  const int load = moe.load();
  const std::uint64_t hash = moe.expertHash();
  MPI_Gather(&load, 1, MPI_INT, loads.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Gather(&hash, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    std::string line = "expert loads in the last step:";
    for (const int l : loads) line += " " + std::to_string(l);
    std::printf("%s tokens\n", line.c_str());
    std::uint64_t digest = moe.sharedHash();
    digest = fnv1a64(hashes.data(), hashes.size() * sizeof(std::uint64_t), digest);
    std::printf("final loss %a weights fnv1a64 %016llx\n", loss, static_cast<unsigned long long>(digest));
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %d steps in %.3f s (%.1f ms per step)\n", kProgram, options.steps, elapsed,
                 options.steps > 0 ? 1e3 * elapsed / options.steps : 0.0);
  }
  MPI_Finalize();
  return 0;
}
