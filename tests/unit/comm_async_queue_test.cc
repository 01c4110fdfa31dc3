// The async strategies' device path (async.h, QueueWorker) without a GPU: a communicator of "device"
// memory whose work really is queued, as on a CUDA stream. Every collective and local operation is run
// later, in order, by the communicator's own thread; markQueue()/waitForMark() order two such queues as
// CUDA events do; download() waits for the queue, as a device-to-host copy synchronises. Reductions take
// a while (kReduceDelay), so a result read before its reduction is done, or an input overwritten while
// the reduction still reads it, shows as a wrong value. One rank: the sum of a step is its gradient.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/comm/async.h"
#include "gradscope/comm/communicator.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/error.h"
#include "gradscope/common/strategy_name.h"
#include "host_local_ops.h"

namespace gradscope::comm::queue_test {
namespace {

constexpr auto kReduceDelay = std::chrono::milliseconds(2);

// Work run in order by a thread of its own; positions count what was queued, from 1.
class WorkQueue {
 public:
  WorkQueue() : thread_([this] { loop(); }) {}
  ~WorkQueue() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  std::uint64_t push(std::function<void()> work) {
    const std::lock_guard lock(mutex_);
    work_.push_back(std::move(work));
    changed_.notify_all();
    return ++queued_;
  }
  std::uint64_t queued() {
    const std::lock_guard lock(mutex_);
    return queued_;
  }
  void waitFor(std::uint64_t position) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return done_ >= position; });
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || !work_.empty(); });
      if (work_.empty()) return;
      std::function<void()> work = std::move(work_.front());
      work_.pop_front();
      lock.unlock();
      work();
      lock.lock();
      ++done_;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> work_;
  std::uint64_t queued_ = 0, done_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

struct Mark final : QueueMark {
  Mark(std::shared_ptr<WorkQueue> on, std::uint64_t at) : queue(std::move(on)), position(at) {}
  std::shared_ptr<WorkQueue> queue;
  std::uint64_t position;
};

// Host LocalOps whose work goes onto the queue (what the async strategies use of them).
class QueuedLocalOps final : public LocalOps {
 public:
  explicit QueuedLocalOps(std::shared_ptr<WorkQueue> queue) : queue_(std::move(queue)) {}
  Memory memory() const override { return Memory::Device; }
  Buffer allocate(std::size_t bytes) override { return host_->allocate(bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    queue_->push([=, this] { host_->copy(dst, src, bytes); });
  }
  void fillZero(void* dst, std::size_t bytes) override {
    queue_->push([=, this] { host_->fillZero(dst, bytes); });
  }
  void upload(void* dst, const void* host, std::size_t bytes) override {
    auto staged = std::make_shared<std::vector<std::byte>>(static_cast<const std::byte*>(host),
                                                           static_cast<const std::byte*>(host) + bytes);
    queue_->push([=] { std::memcpy(dst, staged->data(), bytes); });
  }
  void download(void* host, const void* src, std::size_t bytes) override {
    queue_->waitFor(queue_->queued());
    std::memcpy(host, src, bytes);
  }
  void delayedCorrection(DType dtype, const void* gradient, void* older, const void* sum, void* out,
                         std::size_t count, double ranks) override {
    queue_->push([=, this] { host_->delayedCorrection(dtype, gradient, older, sum, out, count, ranks); });
  }

  methods::EncodeStats encode(WireFormat, const float*, std::size_t, void*, float*,
                              const methods::EncodeOptions&) override {
    fail("queued ops: not used");
  }
  void decode(WireFormat, const void*, const float*, std::size_t, float*, float, std::size_t) override {
    fail("queued ops: not used");
  }
  methods::EncodeStats encodeScaledBlocks(WireFormat, const float*, std::size_t, std::size_t, float,
                                          void*) override {
    fail("queued ops: not used");
  }
  void decodeScaledBlocks(WireFormat, const void*, std::size_t, std::size_t, float, float*) override {
    fail("queued ops: not used");
  }
  void scale(const float*, std::size_t, float, float*) override { fail("queued ops: not used"); }
  methods::DotProducts dotProducts(const float*, const float*, std::size_t) override {
    fail("queued ops: not used");
  }
  void adasumPair(const float*, const float*, std::size_t, float*) override { fail("queued ops: not used"); }
  float finiteAmax(const float*, std::size_t) override { fail("queued ops: not used"); }

 private:
  std::shared_ptr<WorkQueue> queue_;
  std::unique_ptr<LocalOps> host_ = makeHostLocalOps();
};

// One rank; `copies` counts concurrentCopy().
class QueuedCommunicator final : public Communicator {
 public:
  explicit QueuedCommunicator(int* copies) : copies_(copies) {}

  Backend backend() const override { return Backend::Nccl; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Memory memory() const override { return Memory::Device; }
  bool supportsScaledBlocks() const override { return false; }
  bool supports(Element, ReduceOp, std::string*) const override { return true; }
  void allReduce(const void* send, void* recv, std::size_t count, Element type, ReduceOp) override {
    const std::size_t bytes = count * elementBytes(type);
    queue_->push([=] {
      std::this_thread::sleep_for(kReduceDelay);
      std::memmove(recv, send, bytes);
    });
  }
  void reduceScatter(const void*, void*, std::span<const std::size_t>, Element, ReduceOp) override {
    unused();
  }
  void allGather(const void*, void*, std::span<const std::size_t>, Element) override { unused(); }
  void reduce(const void*, void*, std::size_t, Element, ReduceOp, int) override { unused(); }
  void broadcast(void*, std::size_t, Element, int) override { unused(); }
  void send(const void*, std::size_t, Element, int) override { unused(); }
  void recv(void*, std::size_t, Element, int) override { unused(); }
  void sendRecv(const void*, std::size_t, int, void*, std::size_t, int, Element) override { unused(); }
  std::vector<double> allGatherValues(std::span<const double> values) override {
    return {values.begin(), values.end()};
  }
  double allReduceMax(double value) override { return value; }
  void barrier() override {}
  void synchronize() override { queue_->waitFor(queue_->queued()); }
  std::unique_ptr<Communicator> split(int, int) override { unused(); }
  int nodeColor() override { return 0; }
  std::unique_ptr<Communicator> withAlgorithm(int, int) override { unused(); }
  std::unique_ptr<Communicator> concurrentCopy(std::string&) override {
    ++*copies_;
    return std::make_unique<QueuedCommunicator>(copies_);
  }
  std::unique_ptr<QueueMark> markQueue() override { return std::make_unique<Mark>(queue_, queue_->queued()); }
  void waitForMark(const QueueMark& mark) override {
    const auto& queued = dynamic_cast<const Mark&>(mark);
    queue_->push([queue = queued.queue, position = queued.position] { queue->waitFor(position); });
  }
  LocalOps& local() override { return local_; }
  std::string description() const override { return "queued, 1 rank"; }

 private:
  [[noreturn]] static void unused() { fail("queued communicator: not used"); }

  int* copies_;
  std::shared_ptr<WorkQueue> queue_ = std::make_shared<WorkQueue>();
  QueuedLocalOps local_{queue_};
};

std::vector<float> gradientOf(std::int64_t step, std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i)
    values[i] = static_cast<float>(static_cast<int>((i * 5 + static_cast<std::size_t>(step) * 11) % 13) - 6);
  return values;
}

// Steps of three sites on one queued communicator, in and out of place, a size change on one of them:
// each result is what the strategy returns on one rank (stale<K>: the gradient of K steps before, the
// first K steps their own; dga: this step's), read back after the step.
TEST(AsyncOnAQueue, EveryResultIsOrderedBehindItsReduction) {
  int copies = 0;
  QueuedCommunicator comm(&copies);
  const std::shared_ptr<AsyncWorker> worker = AsyncWorker::make(comm);
  EXPECT_EQ(copies, 1);
  StrategyOptions options;
  options.async_worker = worker;
  struct Site {
    const char* text;
    int staleness;
    std::unique_ptr<Strategy> strategy;
  };
  Site sites[] = {{"async/stale1", 1, nullptr}, {"async/stale2", 2, nullptr}, {"async/dga1", 1, nullptr}};
  for (Site& site : sites)
    site.strategy = makeStrategy(*parseStrategyName(site.text), comm, DType::Fp32, options);
  constexpr std::int64_t kSteps = 12, kResizeAt = 7;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    for (std::size_t s = 0; s < std::size(sites); ++s) {
      Site& site = sites[s];
      const bool resized = s == 1 && step >= kResizeAt;  // stale2 changes size: its step 0 again
      const std::size_t count = resized ? 300 : 1000 + s;
      const std::int64_t local = resized ? step - kResizeAt : step;
      const std::int64_t base = resized ? kResizeAt : 0;
      const std::int64_t seed = step + 100 * static_cast<std::int64_t>(s);
      const std::vector<float> gradient = gradientOf(seed, count);
      const bool in_place = (step + static_cast<std::int64_t>(s)) % 2 == 0;
      Buffer send = comm.local().allocate(count * sizeof(float));
      Buffer recv = comm.local().allocate(count * sizeof(float));
      comm.local().upload(send.get(), gradient.data(), count * sizeof(float));
      site.strategy->run(send.get(), in_place ? send.get() : recv.get(), count);
      std::vector<float> got(count);
      comm.local().download(got.data(), in_place ? send.get() : recv.get(), count * sizeof(float));
      std::int64_t source = step;
      if (std::string(site.text).starts_with("async/stale") && local >= site.staleness)
        source = base + local - site.staleness;
      ASSERT_EQ(got, gradientOf(source + 100 * static_cast<std::int64_t>(s), count))
          << site.text << " step " << step << (in_place ? " in place" : "");
      // The buffers are freed now: the queue must be done with them (the next step's sums read the
      // site's own copies, not these).
      comm.synchronize();
    }
  }
  EXPECT_EQ(copies, 1);  // one queue served the three sites
}

}  // namespace
}  // namespace gradscope::comm::queue_test
