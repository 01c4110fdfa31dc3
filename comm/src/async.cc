// The async strategies of async.h: the two workers (a thread for host memory, a second stream for device
// memory) and the call sites that hand them sums and return stale (or corrected) results.

#include "gradscope/comm/async.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "gradscope/common/error.h"

namespace gradscope::comm {
namespace {

// The owner's concurrentCopy(), or gradscope::Error with why there is none.
std::unique_ptr<Communicator> copyOf(Communicator& owner) {
  std::string why_not;
  std::unique_ptr<Communicator> copy = owner.concurrentCopy(why_not);
  if (!copy) fail("{}", why_not);
  return copy;
}

// ---- Host memory: a thread --------------------------------------------------------------------------------

class ThreadWorker final : public AsyncWorker {
 public:
  ThreadWorker(Communicator& owner, std::function<void()> on_start) : comm_(copyOf(owner)) {
    thread_ = std::thread([this, on_start = std::move(on_start)] { loop(on_start); });
  }
  // Finishes what was handed over, then stops the thread and frees the communicator.
  ~ThreadWorker() override {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    posted_.notify_one();
    thread_.join();
  }
  ThreadWorker(const ThreadWorker&) = delete;
  ThreadWorker& operator=(const ThreadWorker&) = delete;

  Ticket post(const void* send, void* recv, std::size_t count, DType dtype) override {
    Ticket ticket = 0;
    {
      const std::lock_guard lock(mutex_);
      tasks_.push_back({send, recv, count, dtype});
      ticket = ++next_;
    }
    posted_.notify_one();
    return ticket;
  }

  void wait(Ticket ticket) override {
    std::unique_lock lock(mutex_);
    waitLocked(lock, ticket);
    if (!failure_.empty()) fail("{}", failure_);
  }

  void drain() override {
    std::unique_lock lock(mutex_);
    waitLocked(lock, next_);
  }

  int ranks() const override { return comm_->size(); }

 private:
  struct Task {
    const void* send;
    void* recv;
    std::size_t count;
    DType dtype;
  };

  void waitLocked(std::unique_lock<std::mutex>& lock, Ticket ticket) {
    if (done_ >= ticket) return;
    waiters_.fetch_add(1, std::memory_order_relaxed);
    completed_.wait(lock, [&] { return done_ >= ticket; });
    waiters_.fetch_sub(1, std::memory_order_relaxed);
  }

  void loop(const std::function<void()>& on_start);

  static constexpr std::chrono::microseconds kFirstPause{5}, kLongestPause{100};

  std::unique_ptr<Communicator> comm_;
  std::mutex mutex_;
  std::condition_variable posted_, completed_;
  std::deque<Task> tasks_;
  Ticket next_ = 0;  // tickets handed out
  Ticket done_ = 0;  // tickets complete (in order)
  bool stopping_ = false;
  std::atomic<int> waiters_{0};  // job threads waiting: the worker then yields instead of sleeping
  std::string failure_;
  std::thread thread_;
};

// The sums in flight are tested, not waited for in the library: MPI's blocking calls busy-poll, which on
// a machine whose cores the ranks keep busy takes the job's CPU for the whole reduction. Every sum handed
// over is started at once (they may be many per step: one per layer), in order, so that their rounds
// overlap; between tests the thread sleeps, from kFirstPause doubling to kLongestPause, and only yields
// while the job waits. They complete in order: a ticket is done once it and every one before it are.
// After a failure the rest are only marked complete (each wait() throws): the ranks may no longer agree
// on which sums were made.
void ThreadWorker::loop(const std::function<void()>& on_start) {
  if (on_start) on_start();
  std::deque<std::unique_ptr<PendingReduction>> flying;  // nullptr: failed, complete at once
  auto pause = kFirstPause;
  for (;;) {
    std::deque<Task> starting;
    bool failed = false;
    {
      std::unique_lock lock(mutex_);
      if (flying.empty()) posted_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (flying.empty() && tasks_.empty()) return;  // stopping, and everything handed over is done
      starting.swap(tasks_);
      failed = !failure_.empty();
    }
    std::string failure;
    for (const Task& task : starting) {
      if (failed || !failure.empty()) {
        flying.push_back(nullptr);
        continue;
      }
      try {
        flying.push_back(
            comm_->startAllReduce(task.send, task.recv, task.count, Element{task.dtype}, ReduceOp::Sum));
      } catch (const std::exception& error) {
        failure = error.what();
        flying.push_back(nullptr);
      }
    }
    if (!starting.empty()) pause = kFirstPause;
    Ticket finished = 0;
    try {
      while (!flying.empty() && (flying.front() == nullptr || flying.front()->test())) {
        flying.pop_front();
        ++finished;
      }
    } catch (const std::exception& error) {
      if (failure.empty()) failure = error.what();
      finished += flying.size();
      flying.clear();
    }
    if (finished > 0 || !failure.empty()) {
      const std::lock_guard lock(mutex_);
      if (!failure.empty() && failure_.empty()) failure_ = std::move(failure);
      done_ += finished;
      completed_.notify_all();
    }
    if (flying.empty()) continue;
    if (waiters_.load(std::memory_order_relaxed) > 0) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, kLongestPause);
    }
  }
}

// ---- Device memory: a second stream -----------------------------------------------------------------------
//
// The owner's calls come from the job's threads one at a time (the agent holds the communicator's lock),
// so no lock here. A ticket's mark lives until the owner has been made to wait for it.

class QueueWorker final : public AsyncWorker {
 public:
  explicit QueueWorker(Communicator& owner) : owner_(owner), copy_(copyOf(owner)) {}
  ~QueueWorker() override { drain(); }
  QueueWorker(const QueueWorker&) = delete;
  QueueWorker& operator=(const QueueWorker&) = delete;

  Ticket post(const void* send, void* recv, std::size_t count, DType dtype) override {
    if (const std::unique_ptr<QueueMark> written = owner_.markQueue()) copy_->waitForMark(*written);
    copy_->allReduce(send, recv, count, Element{dtype}, ReduceOp::Sum);
    marks_.emplace(++next_, copy_->markQueue());
    return next_;
  }

  void wait(Ticket ticket) override {
    const auto it = marks_.find(ticket);
    if (it == marks_.end()) return;  // waited for before
    if (it->second) owner_.waitForMark(*it->second);
    marks_.erase(it);
  }

  // Never throws: called where buffers are about to be freed. A failed stream fails the job's next call.
  void drain() override {
    try {
      copy_->synchronize();
      owner_.synchronize();
    } catch (const std::exception&) {
    }
  }

  int ranks() const override { return copy_->size(); }

 private:
  Communicator& owner_;
  std::unique_ptr<Communicator> copy_;
  std::map<Ticket, std::unique_ptr<QueueMark>> marks_;
  Ticket next_ = 0;
};

}  // namespace

std::shared_ptr<AsyncWorker> AsyncWorker::make(Communicator& owner, std::function<void()> on_start) {
  if (owner.memory() == Memory::Device) return std::make_shared<QueueWorker>(owner);
  return std::make_shared<ThreadWorker>(owner, std::move(on_start));
}

// ---- AsyncStrategy ----------------------------------------------------------------------------------------

AsyncStrategy::AsyncStrategy(const StrategyName& name, Communicator& comm, DType dtype,
                             std::shared_ptr<AsyncWorker> worker)
    : Strategy(name), local_(comm.local()), dtype_(dtype), worker_(std::move(worker)) {
  if (name.aggregator != Aggregator::Async || name.staleness < 1 || name.staleness > kMaxStaleness)
    fail("{} is not an async strategy", name.text());
  if (dtype != DType::Fp32 && dtype != DType::Fp64 && dtype != DType::Fp16 && dtype != DType::Bf16)
    fail("{} takes fp32, fp64, fp16 or bf16 input, not {}", name.text(), gradscope::name(dtype));
  slots_.resize(static_cast<std::size_t>(name.staleness));
}

AsyncStrategy::~AsyncStrategy() {
  settle();
}

void AsyncStrategy::waitFor(Slot& slot) {
  if (!slot.pending) return;
  slot.pending = false;
  worker_->wait(slot.ticket);
}

// On the GPU the drain is a host wait for the owner's stream, which has waited for the job's: only where
// buffers are freed (a change of size, the end), never at a step.
void AsyncStrategy::settle() noexcept {
  if (count_ == 0) return;  // nothing allocated, nothing posted
  for (Slot& slot : slots_) {
    try {
      waitFor(slot);
    } catch (const std::exception&) {
      // The sum failed: nothing of ours is still being written.
    }
  }
  worker_->drain();
}

void AsyncStrategy::restart(std::size_t count) {
  settle();
  const std::size_t bytes = count * sizeOf(dtype_);
  for (Slot& slot : slots_) {
    slot.input = local_.allocate(bytes);
    slot.sum = local_.allocate(bytes);
  }
  count_ = count;
  step_ = 0;
}

void AsyncStrategy::restart() {
  for (Slot& slot : slots_) waitFor(slot);
  step_ = 0;
}

RunStats AsyncStrategy::run(const void* send, void* recv, std::size_t count) {
  if (count == 0) return {};
  if (count != count_) restart(count);
  const std::size_t bytes = count * sizeOf(dtype_);
  Slot& slot = slots_[static_cast<std::size_t>(step_ % static_cast<std::int64_t>(slots_.size()))];
  if (step_ < static_cast<std::int64_t>(slots_.size())) {
    // Synchronous: the sum of this step, also kept for step t + K.
    local_.copy(slot.input.get(), send, bytes);
    slot.ticket = worker_->post(slot.input.get(), slot.sum.get(), count, dtype_);
    slot.pending = true;
    waitFor(slot);
    local_.copy(recv, slot.sum.get(), bytes);
  } else {
    waitFor(slot);  // the sum of step t - K, normally long done
    if (name().delay == StrategyName::Delay::Dga) {
      local_.delayedCorrection(dtype_, send, slot.input.get(), slot.sum.get(), recv, count_,
                               static_cast<double>(worker_->ranks()));
    } else {
      local_.copy(slot.input.get(), send, bytes);  // first: send may be recv
      local_.copy(recv, slot.sum.get(), bytes);
    }
    slot.ticket = worker_->post(slot.input.get(), slot.sum.get(), count, dtype_);
    slot.pending = true;
  }
  ++step_;
  return {};
}

}  // namespace gradscope::comm
