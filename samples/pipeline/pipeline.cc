// gradscope-sample-pipeline: a pipeline-parallel training job in C++ and MPI, the point-to-point traffic
// gradscope profiles next to the collectives. A four-layer perceptron (32 -> H -> H -> 10, ReLU, softmax
// cross-entropy; H = --hidden, default 256) is cut into two pipeline stages, and each stage is
// replicated for data parallelism:
//
//   4 ranks: 2 stages x 2 replicas (ranks 0, 1: stage 0; ranks 2, 3: stage 1; replica r = rank mod 2)
//   2 ranks: 2 stages x 1 replica
//   stage 0: layer 1 (32 -> H, ReLU); stage 1: layers 2 and 3 (H -> H, ReLU; H -> 10) and the loss.
//
// Every step takes --micro-batches M micro-batches of 32 samples through the pipeline: stage 0 sends
// each micro-batch's activations (32 x H floats) forward to stage 1, which sends the gradient of the loss
// with respect to them back. --schedule picks the order:
//
//   gpipe  every forward pass, then every backward pass (last micro-batch first), with blocking MPI_Send
//          and MPI_Recv;
//   1f1b   one forward, one backward: stage 0 runs one micro-batch ahead, stage 1 does each micro-batch's
//          backward pass right after its forward pass; MPI_Isend and MPI_Irecv posted ahead, completed by
//          MPI_Wait (receives) and MPI_Waitall (the step's sends).
//
// The micro-batches' gradients are kept apart and summed in micro-batch order once the schedule is done,
// so that both schedules compute bit-identical weights: the schedule changes when things happen, not what
// is computed. Then each stage's replicas average their gradients, one in-place MPI_Allreduce (MPI_SUM,
// MPI_FLOAT) per tensor over the stage's communicator (MPI_Comm_split by stage), last layer first, and
// stage 1 sums the loss over its replicas (MPI_Allreduce of one double). Setup: an MPI_Bcast of each
// stage's initial weights within the stage.
//
// Deterministic for a given number of ranks: data and weights come from a fixed-seed generator written
// here, and MPI's reductions are deterministic for a fixed communicator size. At the end rank 0 prints the
// final loss in hexadecimal floating point and an FNV-1a hash of both stages' weights (stage 1's hash
// comes from its first replica), so that runs with and without a profiler, or with either schedule, can
// be compared bit for bit; the replicas of a stage are checked to hold identical weights. The wall time of
// the training loop goes to stderr, so that stdout is the same in every run.

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <mpi.h>

namespace {

constexpr char kProgram[] = "gradscope-sample-pipeline";

enum class Schedule { GPipe, OneForwardOneBackward };

struct Options {
  Schedule schedule = Schedule::OneForwardOneBackward;
  int micro_batches = 4;
  int steps = 20;
  int hidden = 256;
};

void printUsage(std::FILE* stream) {
  std::fprintf(stream,
               "usage: %s [--schedule gpipe|1f1b] [--micro-batches M] [--steps N] [--hidden H]\n"
               "  runs on 2 ranks (2 pipeline stages) or 4 (2 stages x 2 data-parallel replicas)\n"
               "  --schedule S       gpipe: all forward passes, then all backward passes, blocking\n"
               "                     sends and receives; 1f1b: one forward, one backward, nonblocking\n"
               "                     (default 1f1b)\n"
               "  --micro-batches M  micro-batches of 32 samples per step, 1 to 64 (default 4)\n"
               "  --steps N          training steps (default 20)\n"
               "  --hidden H         width of the hidden layers, 16 to 4096 (default 256)\n",
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
    } else if (arg == "--schedule") {
      const std::string_view name = value != nullptr ? value : "";
      if (name == "gpipe") options.schedule = Schedule::GPipe;
      else if (name == "1f1b") options.schedule = Schedule::OneForwardOneBackward;
      else return "--schedule needs gpipe or 1f1b";
      ++i;
    } else if (arg == "--micro-batches") {
      if (!number(1, 64, options.micro_batches)) return "--micro-batches needs a number from 1 to 64";
    } else if (arg == "--steps") {
      if (!number(0, 100'000'000, options.steps)) return "--steps needs a number from 0 to 100000000";
    } else if (arg == "--hidden") {
      if (!number(16, 4096, options.hidden)) return "--hidden needs a number from 16 to 4096";
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

constexpr std::uint64_t kWeightSeed = 0x5eed'0101;
constexpr std::uint64_t kTeacherSeed = 0x5eed'0102;
constexpr std::uint64_t kDataSeed = 0x5eed'0103;

constexpr std::size_t kInputs = 32;
constexpr std::size_t kClasses = 10;
constexpr std::size_t kMicroBatch = 32;      // samples per micro-batch
constexpr std::size_t kShardSamples = 1024;  // samples per replica, visited in order
constexpr float kLearningRate = 0.1f;
constexpr int kStages = 2;

// A dense layer's parameters, weight (inputs x outputs, row-major) and bias, as views into one flat
// vector of the stage's parameters; the gradients are another vector of the same layout.
struct Layer {
  std::size_t inputs = 0;
  std::size_t outputs = 0;
  std::size_t offset = 0;  // of the weight in the flat vector; the bias follows it

  std::span<float> weight(std::vector<float>& flat) const { return {flat.data() + offset, inputs * outputs}; }
  std::span<const float> weight(const std::vector<float>& flat) const {
    return {flat.data() + offset, inputs * outputs};
  }
  std::span<float> bias(std::vector<float>& flat) const {
    return {flat.data() + offset + inputs * outputs, outputs};
  }
  std::span<const float> bias(const std::vector<float>& flat) const {
    return {flat.data() + offset + inputs * outputs, outputs};
  }
};

// The layers of one stage, laid out one after the other.
struct StageModel {
  std::vector<Layer> layers;
  std::size_t parameters = 0;
};

StageModel stageModel(int stage, std::size_t hidden) {
  const std::vector<std::size_t> widths = stage == 0 ? std::vector<std::size_t>{kInputs, hidden}
                                                     : std::vector<std::size_t>{hidden, hidden, kClasses};
  StageModel model;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    model.layers.push_back({widths[l], widths[l + 1], model.parameters});
    model.parameters += widths[l] * widths[l + 1] + widths[l + 1];
  }
  return model;
}

// He-style uniform initialisation (bound sqrt(6 / fan_in)), a generator per stage; biases stay zero.
void initialise(const StageModel& model, int stage, std::vector<float>& parameters) {
  Rng rng(kWeightSeed + static_cast<std::uint64_t>(stage));
  for (const Layer& layer : model.layers) {
    const float bound = std::sqrt(6.0f / static_cast<float>(layer.inputs));
    for (float& w : layer.weight(parameters)) w = bound * rng.symmetric();
  }
}

// A replica's shard: inputs uniform in [-1, 1), labels from a fixed random linear "teacher". Both stages
// of a replica make the same shard: stage 0 reads its inputs, stage 1 its labels.
struct Shard {
  std::vector<float> inputs;        // kShardSamples x kInputs
  std::vector<std::size_t> labels;  // kShardSamples
};

Shard makeShard(int replica) {
  Rng teacher_rng(kTeacherSeed);
  std::vector<float> teacher(kInputs * kClasses);
  for (float& t : teacher) t = teacher_rng.symmetric();
  Rng rng(kDataSeed + 0x1000193 * static_cast<std::uint64_t>(replica));
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
void forward(const Layer& layer, const std::vector<float>& parameters, const float* in, std::size_t rows,
             bool relu, std::vector<float>& out) {
  const std::span<const float> weight = layer.weight(parameters), bias = layer.bias(parameters);
  out.resize(rows * layer.outputs);
  for (std::size_t r = 0; r < rows; ++r) {
    float* o = &out[r * layer.outputs];
    std::copy(bias.begin(), bias.end(), o);
    for (std::size_t i = 0; i < layer.inputs; ++i) {
      const float x = in[r * layer.inputs + i];
      const float* w = &weight[i * layer.outputs];
      for (std::size_t j = 0; j < layer.outputs; ++j) o[j] += x * w[j];
    }
    if (relu)
      for (std::size_t j = 0; j < layer.outputs; ++j) o[j] = std::max(o[j], 0.0f);
  }
}

// From dout (rows x outputs) and the layer's input `in`: the layer's weight and bias gradients into
// `gradients` (overwritten) and, when din is given, din = dout . weight^T, masked by the ReLU that produced
// `in` when `in_relu` (positive exactly where the ReLU let the value through).
void backward(const Layer& layer, const std::vector<float>& parameters, std::vector<float>& gradients,
              const float* in, const float* dout, std::size_t rows, bool in_relu, std::vector<float>* din) {
  const std::size_t inputs = layer.inputs, outputs = layer.outputs;
  const std::span<float> dw = layer.weight(gradients), db = layer.bias(gradients);
  std::fill(dw.begin(), dw.end(), 0.0f);
  std::fill(db.begin(), db.end(), 0.0f);
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
  const std::span<const float> weight = layer.weight(parameters);
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

// Softmax cross-entropy, mean over the rows; dlogits = (softmax - one_hot) / rows. Returns the loss.
double softmaxCrossEntropy(const std::vector<float>& logits, const std::size_t* labels, std::size_t rows,
                           std::vector<float>& dlogits) {
  double loss = 0.0;
  dlogits.resize(logits.size());
  for (std::size_t r = 0; r < rows; ++r) {
    const float* z = &logits[r * kClasses];
    const float top = *std::max_element(z, z + kClasses);
    double denominator = 0.0;
    for (std::size_t c = 0; c < kClasses; ++c) denominator += std::exp(static_cast<double>(z[c] - top));
    for (std::size_t c = 0; c < kClasses; ++c) {
      const double p = std::exp(static_cast<double>(z[c] - top)) / denominator;
      dlogits[r * kClasses + c] =
          static_cast<float>((p - (c == labels[r] ? 1.0 : 0.0)) / static_cast<double>(rows));
    }
    loss -= (static_cast<double>(z[labels[r]] - top) - std::log(denominator)) / static_cast<double>(rows);
  }
  return loss;
}

// FNV-1a, 64 bits, over the bytes of the parameters: equal hashes mean (all but certainly) equal weights.
std::uint64_t fnv1a64(std::span<const float> values, std::uint64_t hash = 0xcbf29ce484222325ULL) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (std::size_t i = 0; i < values.size_bytes(); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  return hash;
}

int count(std::size_t n) {
  return static_cast<int>(n);
}

// One rank of the pipeline: its stage's layers, the communicators, and one step's state per micro-batch.
//
// Messages between the two stages of a replica go over `pipe` (MPI_Comm_split by replica: stage s is rank s
// there), tagged by micro-batch: activations kActivationTag + m, their gradients kGradientTag + m.
class PipelineRank {
 public:
  static constexpr int kActivationTag = 0;
  static constexpr int kGradientTag = 1000;

  PipelineRank(int stage, int replica, std::size_t hidden, int micro_batches, MPI_Comm pipe, MPI_Comm data)
      : stage_(stage),
        hidden_(hidden),
        micro_batches_(static_cast<std::size_t>(micro_batches)),
        pipe_(pipe),
        data_(data),
        model_(stageModel(stage, hidden)),
        parameters_(model_.parameters),
        gradient_sum_(model_.parameters),
        shard_(makeShard(replica)),
        inputs_(micro_batches_),
        hidden1_(micro_batches_),
        hidden2_(micro_batches_),
        messages_(micro_batches_),
        gradients_(micro_batches_, std::vector<float>(model_.parameters)),
        losses_(micro_batches_) {
    int data_rank = 0;
    MPI_Comm_rank(data_, &data_rank);
    if (data_rank == 0) initialise(model_, stage_, parameters_);
    MPI_Bcast(parameters_.data(), count(parameters_.size()), MPI_FLOAT, 0, data_);
  }

  std::size_t parameters() const { return model_.parameters; }

  // One training step; returns the loss averaged over the replicas (stage 1) or 0 (stage 0).
  double step(int step_index, Schedule schedule) {
    first_sample_ = static_cast<std::size_t>(step_index) * micro_batches_ * kMicroBatch % kShardSamples;
    if (schedule == Schedule::GPipe) runGPipe();
    else runOneForwardOneBackward();
    return update();
  }

  const std::vector<float>& weights() const { return parameters_; }

 private:
  const float* inputsOf(std::size_t m) const {
    return &shard_.inputs[(first_sample_ + m * kMicroBatch) % kShardSamples * kInputs];
  }
  const std::size_t* labelsOf(std::size_t m) const {
    return &shard_.labels[(first_sample_ + m * kMicroBatch) % kShardSamples];
  }
  int peer() const { return 1 - stage_; }
  int messageElements() const { return count(kMicroBatch * hidden_); }

  // Stage 0: layer 1 of micro-batch m; a copy of its output is the message to send.
  void forwardFirst(std::size_t m) {
    forward(model_.layers[0], parameters_, inputsOf(m), kMicroBatch, true, hidden1_[m]);
    messages_[m] = hidden1_[m];
  }
  // Stage 0: `dout`, the gradient of layer 1's output, arrived; the ReLU's mask is applied here.
  void backwardFirst(std::size_t m, std::vector<float>& dout) {
    for (std::size_t i = 0; i < dout.size(); ++i)
      if (hidden1_[m][i] <= 0.0f) dout[i] = 0.0f;
    backward(model_.layers[0], parameters_, gradients_[m], inputsOf(m), dout.data(), kMicroBatch, false,
             nullptr);
  }
  // Stage 1: layers 2 and 3 of micro-batch m, whose input arrived in messages_[m].
  void forwardLast(std::size_t m) {
    inputs_[m] = messages_[m];
    forward(model_.layers[0], parameters_, inputs_[m].data(), kMicroBatch, true, hidden2_[m]);
    forward(model_.layers[1], parameters_, hidden2_[m].data(), kMicroBatch, false, hidden1_[m]);
  }
  // Stage 1: the loss and the backward pass of micro-batch m; messages_[m] becomes the gradient to send.
  void backwardLast(std::size_t m) {
    std::vector<float> dlogits, dhidden;
    losses_[m] = softmaxCrossEntropy(hidden1_[m], labelsOf(m), kMicroBatch, dlogits);
    backward(model_.layers[1], parameters_, gradients_[m], hidden2_[m].data(), dlogits.data(), kMicroBatch,
             true, &dhidden);
    // The gradient with respect to stage 0's output (the ReLU applied there masks it there).
    backward(model_.layers[0], parameters_, gradients_[m], inputs_[m].data(), dhidden.data(), kMicroBatch,
             false, &messages_[m]);
  }

  // GPipe: every forward pass, then every backward pass, last micro-batch first; blocking calls.
  void runGPipe() {
    const std::size_t n = micro_batches_;
    for (std::size_t m = 0; m < n; ++m) {
      messages_[m].resize(kMicroBatch * hidden_);
      if (stage_ == 0) {
        forwardFirst(m);
        MPI_Send(messages_[m].data(), messageElements(), MPI_FLOAT, peer(), kActivationTag + count(m), pipe_);
      } else {
        MPI_Recv(messages_[m].data(), messageElements(), MPI_FLOAT, peer(), kActivationTag + count(m), pipe_,
                 MPI_STATUS_IGNORE);
        forwardLast(m);
      }
    }
    for (std::size_t k = n; k-- > 0;) {
      if (stage_ == 0) {
        MPI_Recv(messages_[k].data(), messageElements(), MPI_FLOAT, peer(), kGradientTag + count(k), pipe_,
                 MPI_STATUS_IGNORE);
        backwardFirst(k, messages_[k]);
      } else {
        backwardLast(k);
        MPI_Send(messages_[k].data(), messageElements(), MPI_FLOAT, peer(), kGradientTag + count(k), pipe_);
      }
    }
  }

  // 1F1B on two stages: stage 0 runs one micro-batch ahead (its forward pass of m + 1 overlaps stage 1's
  // work on m), stage 1 runs each micro-batch's backward pass right after its forward pass. Receives are
  // posted one micro-batch ahead and completed by MPI_Wait; the step's sends by one MPI_Waitall.
  void runOneForwardOneBackward() {
    const std::size_t n = micro_batches_;
    std::vector<MPI_Request> sends(n, MPI_REQUEST_NULL), receives(n, MPI_REQUEST_NULL);
    for (std::vector<float>& message : messages_) message.resize(kMicroBatch * hidden_);
    // Stage 0 receives its gradients into buffers of their own: messages_[m] may still be being sent.
    incoming_.resize(stage_ == 0 ? n : 0);
    for (std::vector<float>& message : incoming_) message.resize(kMicroBatch * hidden_);
    const auto post_receive = [&](std::size_t m) {
      if (stage_ == 0)
        MPI_Irecv(incoming_[m].data(), messageElements(), MPI_FLOAT, peer(), kGradientTag + count(m), pipe_,
                  &receives[m]);
      else
        MPI_Irecv(messages_[m].data(), messageElements(), MPI_FLOAT, peer(), kActivationTag + count(m), pipe_,
                  &receives[m]);
    };
    if (stage_ == 0) {
      const auto forward_and_send = [&](std::size_t m) {
        forwardFirst(m);
        post_receive(m);
        MPI_Isend(messages_[m].data(), messageElements(), MPI_FLOAT, peer(), kActivationTag + count(m), pipe_,
                  &sends[m]);
      };
      const auto receive_and_backward = [&](std::size_t m) {
        MPI_Wait(&receives[m], MPI_STATUS_IGNORE);
        backwardFirst(m, incoming_[m]);
      };
      forward_and_send(0);
      for (std::size_t m = 1; m < n; ++m) {
        forward_and_send(m);
        receive_and_backward(m - 1);
      }
      receive_and_backward(n - 1);
    } else {
      post_receive(0);
      for (std::size_t m = 0; m < n; ++m) {
        MPI_Wait(&receives[m], MPI_STATUS_IGNORE);
        if (m + 1 < n) post_receive(m + 1);
        forwardLast(m);
        backwardLast(m);
        MPI_Isend(messages_[m].data(), messageElements(), MPI_FLOAT, peer(), kGradientTag + count(m), pipe_,
                  &sends[m]);
      }
    }
    MPI_Waitall(count(n), sends.data(), MPI_STATUSES_IGNORE);
  }

  // The micro-batches' gradients summed in micro-batch order (the same sums whatever the schedule), the
  // replicas' sums added up tensor by tensor, last layer first, then SGD on the mean.
  double update() {
    std::fill(gradient_sum_.begin(), gradient_sum_.end(), 0.0f);
    for (const std::vector<float>& gradient : gradients_)
      for (std::size_t i = 0; i < gradient.size(); ++i) gradient_sum_[i] += gradient[i];
    for (std::size_t l = model_.layers.size(); l-- > 0;) {
      const Layer& layer = model_.layers[l];
      for (const std::span<float> tensor : {layer.weight(gradient_sum_), layer.bias(gradient_sum_)})
        MPI_Allreduce(MPI_IN_PLACE, tensor.data(), count(tensor.size()), MPI_FLOAT, MPI_SUM, data_);
    }
    int replicas = 1;
    MPI_Comm_size(data_, &replicas);
    const float scale =
        kLearningRate / static_cast<float>(micro_batches_ * static_cast<std::size_t>(replicas));
    for (std::size_t i = 0; i < parameters_.size(); ++i) parameters_[i] -= scale * gradient_sum_[i];
    if (stage_ == 0) return 0.0;
    double local = 0.0, total = 0.0;
    for (const double loss : losses_) local += loss;
    MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, data_);
    return total / static_cast<double>(micro_batches_ * static_cast<std::size_t>(replicas));
  }

  const int stage_;
  const std::size_t hidden_;
  const std::size_t micro_batches_;
  const MPI_Comm pipe_;
  const MPI_Comm data_;
  const StageModel model_;
  std::vector<float> parameters_;
  std::vector<float> gradient_sum_;
  const Shard shard_;
  std::size_t first_sample_ = 0;
  // Per micro-batch: stage 1's input (a copy of the message), the hidden activations (stage 0: layer 1's
  // output; stage 1: layer 2's output and the logits), the message (activations forward, their gradient
  // backward) and the parameter gradients; stage 1's loss.
  std::vector<std::vector<float>> inputs_, hidden1_, hidden2_, messages_, gradients_;
  std::vector<std::vector<float>> incoming_;  // 1F1B, stage 0: the gradients received
  std::vector<double> losses_;
};

// Whether every replica of the stage holds the same weights (their hashes' minimum and maximum agree).
bool replicasAgree(std::uint64_t hash, MPI_Comm data) {
  std::uint64_t low = 0, high = 0;
  MPI_Allreduce(&hash, &low, 1, MPI_UINT64_T, MPI_MIN, data);
  MPI_Allreduce(&hash, &high, 1, MPI_UINT64_T, MPI_MAX, data);
  return low == high;
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
  if (error.empty() && !help && world != 2 && world != 4)
    error = "needs 2 ranks (2 pipeline stages) or 4 (2 stages x 2 data-parallel replicas), not " +
            std::to_string(world);
  if (help || !error.empty()) {
    if (rank == 0) {
      if (!error.empty()) std::fprintf(stderr, "%s: %s\n", kProgram, error.c_str());
      if (help) printUsage(stdout);
    }
    MPI_Finalize();
    return error.empty() ? 0 : 2;
  }

  const int replicas = world / kStages;
  const int stage = rank / replicas, replica = rank % replicas;
  MPI_Comm pipe = MPI_COMM_NULL, data = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, replica, stage, &pipe);  // the replica's two stages: rank = stage
  MPI_Comm_split(MPI_COMM_WORLD, stage, replica, &data);  // the stage's replicas
  const auto hidden = static_cast<std::size_t>(options.hidden);
  PipelineRank pipeline(stage, replica, hidden, options.micro_batches, pipe, data);

  if (rank == 0) {
    std::printf(
        "mlp %zu-%zu | %zu-%zu-%zu, 2 stages x %d replica%s, %d micro-batches of %zu samples, %d steps, %s\n",
        kInputs, hidden, hidden, hidden, kClasses, replicas, replicas == 1 ? "" : "s", options.micro_batches,
        kMicroBatch, options.steps, options.schedule == Schedule::GPipe ? "gpipe" : "1f1b");
    std::fflush(stdout);
  }
  const double started = MPI_Wtime();
  double loss = 0.0;
  for (int step = 0; step < options.steps; ++step) loss = pipeline.step(step, options.schedule);
  const double elapsed = MPI_Wtime() - started;

  // Rank 0 (stage 0, replica 0) learns stage 1's loss and weights' hash from stage 1's first replica.
  const std::uint64_t hash = fnv1a64(pipeline.weights());
  const bool agree = replicasAgree(hash, data);
  int all_agree = agree ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_agree, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  struct {
    double loss;
    std::uint64_t hash;
  } last{loss, hash};
  const int last_stage_first = replicas;  // world rank of stage 1, replica 0
  if (rank == last_stage_first) MPI_Send(&last, count(sizeof last), MPI_BYTE, 0, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    MPI_Recv(&last, count(sizeof last), MPI_BYTE, last_stage_first, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    // Both stages' weights: stage 0's hash, continued over stage 1's.
    const std::array<std::uint64_t, 2> hashes{hash, last.hash};
    std::uint64_t digest = 0xcbf29ce484222325ULL;
    for (const std::uint64_t h : hashes)
      for (int byte = 0; byte < 8; ++byte) digest = (digest ^ ((h >> (8 * byte)) & 0xff)) * 0x100000001b3ULL;
    std::printf("final loss %a weights fnv1a64 %016llx\n", last.loss,
                static_cast<unsigned long long>(digest));
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %d steps in %.3f s (%.1f ms per step)\n", kProgram, options.steps, elapsed,
                 options.steps > 0 ? 1e3 * elapsed / options.steps : 0.0);
    if (all_agree == 0)
      std::fprintf(stderr, "%s: the replicas of a stage hold different weights\n", kProgram);
  }
  MPI_Comm_free(&data);
  MPI_Comm_free(&pipe);
  MPI_Finalize();
  return all_agree != 0 ? 0 : 1;
}
