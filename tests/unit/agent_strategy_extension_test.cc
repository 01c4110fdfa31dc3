// StrategyExtension (agent/extensions/strategy_extension.h), the half of explore and apply shared by MPI and
// NCCL, on a one-rank communicator whose buffers count as device memory: the extension then keeps a
// host mirror of every slice and agrees through a device buffer, as over NCCL, so these paths run here
// without a GPU. The MPI half runs in tests/agent/check_shadow.py on real mpirun jobs.

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "extensions/strategy_extension.h"
#include "gradscope/comm/communicator.h"
#include "gradscope/common/error.h"
#include "host_local_ops.h"

namespace gradscope::agent {
namespace {

// One rank: every reduction is a copy. Host memory underneath, reported as the GPU's.
class LoopbackCommunicator final : public comm::Communicator {
 public:
  // `copies`: where concurrentCopy() counts the copies it makes; nullptr: it refuses.
  explicit LoopbackCommunicator(int* synchronizations, int* copies = nullptr)
      : synchronizations_(synchronizations), copies_(copies) {}

  Backend backend() const override { return Backend::Nccl; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  comm::Memory memory() const override { return comm::Memory::Device; }
  bool supportsScaledBlocks() const override { return false; }
  bool supports(comm::Element element, ReduceOp, std::string* why_not) const override {
    if (element.block == 0) return true;
    if (why_not != nullptr) *why_not = "no scaled blocks here";
    return false;
  }
  void allReduce(const void* send, void* recv, std::size_t count, comm::Element type, ReduceOp) override {
    copy(send, recv, count * comm::elementBytes(type));
  }
  void reduceScatter(const void* send, void* recv, std::span<const std::size_t> counts, comm::Element type,
                     ReduceOp) override {
    copy(send, recv, counts[0] * comm::elementBytes(type));
  }
  void allGather(const void* send, void* recv, std::span<const std::size_t> counts,
                 comm::Element type) override {
    copy(send, recv, counts[0] * comm::elementBytes(type));
  }
  void reduce(const void* send, void* recv, std::size_t count, comm::Element type, ReduceOp, int) override {
    copy(send, recv, count * comm::elementBytes(type));
  }
  void broadcast(void*, std::size_t, comm::Element, int) override {}
  void send(const void*, std::size_t, comm::Element, int) override { fail("loopback: no peers"); }
  void recv(void*, std::size_t, comm::Element, int) override { fail("loopback: no peers"); }
  void sendRecv(const void*, std::size_t, int, void*, std::size_t, int, comm::Element) override {
    fail("loopback: no peers");
  }
  std::vector<double> allGatherValues(std::span<const double> values) override {
    return {values.begin(), values.end()};
  }
  double allReduceMax(double value) override { return value; }
  void barrier() override {}
  void synchronize() override { ++*synchronizations_; }
  std::unique_ptr<comm::Communicator> split(int, int) override {
    return std::make_unique<LoopbackCommunicator>(synchronizations_);
  }
  int nodeColor() override { return 0; }
  // Every call is complete on return: the queue marks stay the base class's (nothing to wait for).
  std::unique_ptr<comm::Communicator> concurrentCopy(std::string& why_not) override {
    if (copies_ == nullptr) {
      why_not = "loopback: no second queue";
      return nullptr;
    }
    ++*copies_;
    return std::make_unique<LoopbackCommunicator>(synchronizations_);
  }
  std::unique_ptr<comm::Communicator> withAlgorithm(int, int) override {
    fail("loopback: no engine algorithms");
  }
  comm::LocalOps& local() override { return *local_; }
  std::string description() const override { return "loopback, 1 rank"; }

 private:
  static void copy(const void* send, void* recv, std::size_t bytes) {
    if (send != recv && bytes != 0) std::memmove(recv, send, bytes);
  }
  int* synchronizations_;
  int* copies_;
  std::unique_ptr<comm::LocalOps> local_ = comm::makeHostLocalOps();
};

// The backend half, as NCCL's: a "device" arena and a host arena of the same size, distinct slices.
class TestExtension final : public StrategyExtension {
 public:
  TestExtension() : StrategyExtension(AgentHooks{}) {}

  int joins = 0, copies = 0, after = 0, before = 0, synchronizations = 0, concurrent_copies = 0;
  bool refuse_duplicate = false, refuse_concurrent = false;

 protected:
  bool agreeToStart(const std::string& local_problem, std::string& error) override {
    error = local_problem;
    return local_problem.empty();
  }
  bool reserve(std::size_t bytes) override {
    device_memory_.resize(bytes);
    host_memory_.resize(bytes);
    device_.assign(device_memory_.data(), bytes);
    host_.assign(host_memory_.data(), bytes);
    return true;
  }
  std::unique_ptr<comm::Communicator> duplicate(const ShadowCall&, bool join, bool) override {
    ++joins;
    if (refuse_duplicate || !join) fail("rank 1 could not start");
    return std::make_unique<LoopbackCommunicator>(&synchronizations,
                                                  refuse_concurrent ? nullptr : &concurrent_copies);
  }
  bool take(const ShadowCall& call, std::size_t input_bytes, bool want_gather, Capture& capture) override {
    const std::size_t bytes = Capture::baseBytes(input_bytes, call.count) +
                              (want_gather ? Capture::gatherBytes(call.count, call.comm_size) : 0);
    std::byte* slice = device_.take(bytes);
    std::byte* host_slice = slice != nullptr ? host_.take(bytes) : nullptr;
    if (host_slice == nullptr) {
      device_.give(slice);
      return false;
    }
    capture = Capture::layout(slice, host_slice, input_bytes, call.count, want_gather);
    return true;
  }
  void give(Capture& capture) override {
    device_.give(capture.slice);
    host_.give(capture.host_slice);
    capture = {};
  }
  void copyInput(const ShadowCall&, void* dst, const void* src, std::size_t bytes) override {
    ++copies;
    std::memcpy(dst, src, bytes);
  }
  void afterJob(const ShadowCall&, comm::Communicator&) override { ++after; }
  void beforeJob(const ShadowCall&, comm::Communicator&) override { ++before; }

 private:
  std::vector<std::byte> device_memory_, host_memory_;
  SliceArena device_, host_;
};

ShadowCall fp32Call(std::size_t count, std::int64_t seq) {
  ShadowCall call;
  call.api = Api::NcclAllReduce;
  call.dtype = DType::Fp32;
  call.op = ReduceOp::Sum;
  call.count = count;
  call.seq = seq;
  return call;
}

std::vector<float> gradient(std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 0.25f;
  return values;
}

ExploreSettings settings(std::vector<std::string> strategies, std::size_t shadow_bytes = 1 << 20) {
  ExploreSettings s;
  s.reps = 3;
  s.warmup_reps = 1;
  s.strategies = std::move(strategies);
  s.shadow_bytes = shadow_bytes;
  return s;
}

TEST(AgentStrategyExtension, ExploresDeviceBuffersThroughTheirHostMirror) {
  TestExtension extension;
  std::string error;
  ASSERT_TRUE(extension.start(settings({}), "", error)) << error;
  const ShadowCall call = fp32Call(1000, 4);
  ASSERT_TRUE(extension.join(call, error)) << error;
  const std::vector<float> input = gradient(call.count);
  ASSERT_TRUE(extension.capture(call, input.data()));
  EXPECT_EQ(extension.copies, 1);
  BudgetState budget;
  budget.fraction = 1.0;
  const ExploreResult result = extension.explore(call, budget);
  ASSERT_TRUE(result.explored) << result.skipped;
  EXPECT_EQ(extension.after, 1);  // the duplicate waited for the job's call once
  EXPECT_GT(extension.synchronizations, 0);

  std::vector<std::string> names;
  for (const StrategyTiming& timing : result.timings) {
    names.push_back(timing.strategy);
    EXPECT_EQ(timing.reps, 3) << timing.strategy;
    EXPECT_GT(timing.median_ns, 0) << timing.strategy;
    EXPECT_LE(timing.min_ns, timing.median_ns) << timing.strategy;
    EXPECT_LE(timing.median_ns, timing.max_ns) << timing.strategy;
    // Errors come from the host mirror of the result against the fp64 reference: a stale or unmirrored
    // buffer would not be within these bounds.
    ASSERT_TRUE(timing.rel_l2_error.has_value()) << timing.strategy;
    if (timing.strategy.find('/', timing.strategy.find('/') + 1) == std::string::npos &&
        timing.strategy.starts_with("sum/"))
      EXPECT_EQ(*timing.rel_l2_error, 0.0) << timing.strategy;      // lossless: exact on one rank
    else EXPECT_LT(*timing.rel_l2_error, 0.07) << timing.strategy;  // wire formats and adaptive aggregators
  }
  for (const char* expected : {"sum/native", "sum/rs_ag", "sum/reduce_bcast", "sum/native/bf16",
                               "sum/native/fp16", "adacons/native", "adasum/native"})
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  // The engine strategies cannot be built on this communicator: left out.
  for (const std::string& name : names) EXPECT_FALSE(name.starts_with("sum/nccl.")) << name;

  ASSERT_TRUE(result.consensus.has_value());
  double norm2 = 0;
  for (const float v : input) norm2 += static_cast<double>(v) * static_cast<double>(v);
  EXPECT_NEAR(result.consensus->grad_norm, std::sqrt(norm2), 1e-9);
  EXPECT_NEAR(result.consensus->cosine_to_mean, 1.0, 1e-12);
  EXPECT_NEAR(result.consensus->diversity, 1.0, 1e-12);
}

TEST(AgentStrategyExtension, ApplyIsOrderedAroundTheJobAndRefusalsAreRemembered) {
  TestExtension extension;
  std::string error;
  ASSERT_TRUE(extension.start(settings({}, 0), "", error)) << error;
  const ShadowCall call = fp32Call(257, 0);
  ASSERT_TRUE(extension.join(call, error)) << error;
  const std::vector<float> send = gradient(call.count);
  std::vector<float> recv(call.count, -1.0f);
  ASSERT_TRUE(extension.apply(call, send.data(), recv.data(), "sum/rs_ag", error)) << error;
  EXPECT_EQ(recv, send);  // one rank: the sum is the input, bit for bit
  EXPECT_EQ(extension.after, 1);
  EXPECT_EQ(extension.before, 1);
  // In place.
  std::vector<float> buffer = send;
  ASSERT_TRUE(extension.apply(call, nullptr, buffer.data(), "sum/native/bf16", error)) << error;
  for (std::size_t i = 0; i < buffer.size(); ++i) EXPECT_NEAR(buffer[i], send[i], 1e-2) << i;

  EXPECT_FALSE(extension.apply(call, send.data(), recv.data(), "sum/sideways", error));
  EXPECT_FALSE(error.empty());
  const int ordered = extension.after;
  error.clear();
  EXPECT_FALSE(extension.apply(call, send.data(), recv.data(), "sum/sideways", error));
  EXPECT_FALSE(error.empty());
  EXPECT_EQ(extension.after, ordered);  // refused at once, nothing enqueued
}

TEST(AgentStrategyExtension, NoRoomInTheArenaSkipsTheExploration) {
  TestExtension extension;
  std::string error;
  ASSERT_TRUE(extension.start(settings({"sum/native"}, 4096), "", error)) << error;
  const ShadowCall call = fp32Call(4096, 0);  // 16 KiB of input: no slice fits
  ASSERT_TRUE(extension.join(call, error)) << error;
  const std::vector<float> input = gradient(call.count);
  EXPECT_FALSE(extension.capture(call, input.data()));
  BudgetState budget;
  budget.fraction = 1.0;
  const ExploreResult result = extension.explore(call, budget);
  EXPECT_FALSE(result.explored);
  EXPECT_EQ(result.skipped, "a rank had no room in its shadow arena");
  EXPECT_EQ(extension.after, 0);
}

TEST(AgentStrategyExtension, ACommunicatorThatCouldNotJoinIsLeftAloneForGood) {
  TestExtension extension;
  extension.refuse_duplicate = true;
  std::string error;
  ASSERT_TRUE(extension.start(settings({"sum/native"}), "", error)) << error;
  const ShadowCall call = fp32Call(16, 0);
  EXPECT_FALSE(extension.join(call, error));
  EXPECT_EQ(error, "rank 1 could not start");
  EXPECT_FALSE(extension.capture(call, gradient(16).data()));
  BudgetState budget;
  const ExploreResult result = extension.explore(call, budget);
  EXPECT_FALSE(result.explored);
  EXPECT_EQ(result.skipped, "rank 1 could not start");
  std::vector<float> recv(16);
  EXPECT_FALSE(extension.apply(call, gradient(16).data(), recv.data(), "sum/native", error));
  EXPECT_EQ(extension.joins, 1);  // never split again
}

TEST(AgentStrategyExtension, ARankThatCouldNotStartStillJoinsWithoutJoining) {
  TestExtension extension;
  std::string error;
  EXPECT_FALSE(extension.start(settings({}), "plan.json: not found", error));
  EXPECT_EQ(error, "plan.json: not found");
  EXPECT_FALSE(extension.join(fp32Call(16, 0), error));
  EXPECT_EQ(extension.joins, 1);  // it took part in the split (join = false there)
}

}  // namespace
}  // namespace gradscope::agent

namespace gradscope::agent {
namespace {

// A call site's step t of a 1000-element fp32 gradient, different in every step.
std::vector<float> stepGradient(std::int64_t step, std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i)
    values[i] =
        static_cast<float>((static_cast<int>((i * 7 + static_cast<std::size_t>(step) * 13) % 11) - 5)) *
        0.125f;
  return values;
}

// ‖a - b‖ / ‖b‖ in fp64.
double relativeL2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    norm += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

const StrategyTiming* timingOf(const ExploreResult& result, const std::string& name) {
  for (const StrategyTiming& timing : result.timings)
    if (timing.strategy == name) return &timing;
  return nullptr;
}

// One rank: the sum of a step is its gradient, so stale<K> returns g[t-K] and its error against this
// step's sum is ‖g[t-K] - g[t]‖ / ‖g[t]‖; dga<K> returns g[t-K] + (g[t] - g[t-K]) = g[t] (error 0).
TEST(AgentStrategyExtension, AsyncErrorsFollowACallSiteStepByStep) {
  TestExtension extension;
  std::string error;
  ASSERT_TRUE(
      extension.start(settings({"sum/native", "async/stale1", "async/stale2", "async/dga1"}), "", error))
      << error;
  BudgetState budget;
  budget.fraction = 1.0;
  constexpr std::size_t kCount = 1000;
  std::vector<std::vector<float>> inputs;
  for (std::int64_t step = 0; step < 4; ++step) {
    ShadowCall call = fp32Call(kCount, 10 + step);
    call.site.ordinal = 3;
    call.site.step = step;
    inputs.push_back(stepGradient(step, kCount));
    if (step == 0) {
      ASSERT_TRUE(extension.join(call, error)) << error;
      EXPECT_FALSE(extension.follows(call));  // nothing kept yet
      ASSERT_TRUE(extension.capture(call, inputs.back().data()));
      const ExploreResult explored = extension.explore(call, budget);
      ASSERT_TRUE(explored.explored) << explored.skipped;
      EXPECT_EQ(timingOf(explored, "async/stale1"), nullptr);  // no earlier step
      continue;
    }
    // Followed for the largest K (2) after the exploration, then left.
    ASSERT_EQ(extension.follows(call), step <= 2) << "step " << step;
    if (step > 2) break;
    ASSERT_TRUE(extension.capture(call, inputs.back().data()));
    const ExploreResult followed = extension.follow(call, budget);
    ASSERT_TRUE(followed.explored) << followed.skipped;
    const StrategyTiming* stale1 = timingOf(followed, "async/stale1");
    const StrategyTiming* dga1 = timingOf(followed, "async/dga1");
    ASSERT_NE(stale1, nullptr);
    ASSERT_NE(dga1, nullptr);
    EXPECT_EQ(stale1->reps, 0);
    const auto at = static_cast<std::size_t>(step);
    EXPECT_NEAR(*stale1->rel_l2_error, relativeL2(inputs[at - 1], inputs[at]), 1e-12);
    EXPECT_EQ(*dga1->rel_l2_error, 0.0);
    const StrategyTiming* stale2 = timingOf(followed, "async/stale2");
    if (step == 2) {
      ASSERT_NE(stale2, nullptr);
      EXPECT_NEAR(*stale2->rel_l2_error, relativeL2(inputs[0], inputs[2]), 1e-12);
    } else {
      EXPECT_EQ(stale2, nullptr);
    }
  }
}

// A step skipped, or a site that changed size, ends the following: nothing kept can be compared.
TEST(AgentStrategyExtension, AsyncFollowingEndsWhenTheSiteSkipsOrChanges) {
  TestExtension extension;
  std::string error;
  ASSERT_TRUE(extension.start(settings({"sum/native", "async/stale1"}), "", error)) << error;
  BudgetState budget;
  budget.fraction = 1.0;
  ShadowCall call = fp32Call(64, 0);
  ASSERT_TRUE(extension.join(call, error)) << error;
  const std::vector<float> input = stepGradient(0, 64);
  ASSERT_TRUE(extension.capture(call, input.data()));
  ASSERT_TRUE(extension.explore(call, budget).explored);
  ShadowCall skipped = call;
  skipped.site.step = 2;
  EXPECT_FALSE(extension.follows(skipped));
  skipped.site.step = 1;
  EXPECT_FALSE(extension.follows(skipped));  // dropped at the skip

  ASSERT_TRUE(extension.capture(call, input.data()));
  ASSERT_TRUE(extension.explore(call, budget).explored);
  ShadowCall resized = fp32Call(65, 1);
  resized.site.step = 1;
  EXPECT_FALSE(extension.follows(resized));
}

// On a communicator of device memory (NCCL's) the async strategies run on a second queue, a concurrent
// copy of the duplicate, made once for the communicator's sites; the duplicate waits for the job's call
// before each step and the job for the duplicate after it, as for every applied strategy. One rank: the
// sum of a step is its gradient, so stale1 returns the gradient of the step before (of this one at the
// first step), and dga1 always this step's.
TEST(AgentStrategyExtension, AsyncRunsOnDeviceMemoryThroughAQueueOfItsOwn) {
  TestExtension extension;
  std::string error;
  ASSERT_TRUE(extension.start(settings({}, 0), "", error)) << error;
  constexpr std::size_t kCount = 16;
  for (std::int64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    for (const std::uint32_t ordinal : {0u, 1u}) {
      ShadowCall call = fp32Call(kCount, 2 * step + ordinal);
      call.site.ordinal = ordinal;
      call.site.step = step;
      if (step == 0 && ordinal == 0) {
        ASSERT_TRUE(extension.join(call, error)) << error;
      }
      const std::vector<float> send = stepGradient(step + 10 * ordinal, kCount);
      std::vector<float> recv(kCount, -1.0f);
      const char* strategy = ordinal == 0 ? "async/stale1" : "async/dga1";
      ASSERT_TRUE(extension.apply(call, send.data(), recv.data(), strategy, error)) << error;
      const std::int64_t source = ordinal == 0 && step > 0 ? step - 1 : step;
      EXPECT_EQ(recv, stepGradient(source + 10 * ordinal, kCount)) << strategy;
    }
  }
  EXPECT_EQ(extension.concurrent_copies, 1);  // one queue for both sites
  EXPECT_EQ(extension.after, 8);
  EXPECT_EQ(extension.before, 8);
}

// A step the site skips (a validation window without the plan) restarts it: synchronous again, on the
// same instance and queue.
TEST(AgentStrategyExtension, AsyncSiteRestartsAfterASkippedStep) {
  TestExtension extension;
  std::string error;
  ASSERT_TRUE(extension.start(settings({}, 0), "", error)) << error;
  constexpr std::size_t kCount = 8;
  for (const std::int64_t step : {0, 1, 2, 5, 6}) {
    ShadowCall call = fp32Call(kCount, step);
    call.site.step = step;
    if (step == 0) {
      ASSERT_TRUE(extension.join(call, error)) << error;
    }
    const std::vector<float> send = stepGradient(step, kCount);
    std::vector<float> recv(kCount);
    ASSERT_TRUE(extension.apply(call, send.data(), recv.data(), "async/stale1", error)) << error;
    const std::int64_t source = step == 0 || step == 5 ? step : step - 1;  // 5 follows a gap: synchronous
    EXPECT_EQ(recv, stepGradient(source, kCount)) << "step " << step;
  }
  EXPECT_EQ(extension.concurrent_copies, 1);
}

// A communicator that cannot queue a second copy refuses them with its reason, and remembers it.
TEST(AgentStrategyExtension, AsyncIsRefusedWhereNoSecondQueueCanBeMade) {
  TestExtension extension;
  extension.refuse_concurrent = true;
  std::string error;
  ASSERT_TRUE(extension.start(settings({}, 0), "", error)) << error;
  const ShadowCall call = fp32Call(16, 0);
  ASSERT_TRUE(extension.join(call, error)) << error;
  const std::vector<float> send = stepGradient(0, 16);
  std::vector<float> recv(16);
  EXPECT_FALSE(extension.apply(call, send.data(), recv.data(), "async/stale1", error));
  EXPECT_NE(error.find("no second queue"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(extension.apply(call, send.data(), recv.data(), "async/stale1", error));
  EXPECT_NE(error.find("no second queue"), std::string::npos) << error;
  EXPECT_EQ(extension.after, 0);  // nothing ran
}

}  // namespace
}  // namespace gradscope::agent
