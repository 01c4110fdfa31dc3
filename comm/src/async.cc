// The async strategies of async.h: a worker thread that sums in the order it is handed sums, and the
// call sites that hand them over and return stale (or corrected) results.

#include "gradscope/comm/async.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "gradscope/common/error.h"
#include "gradscope/methods/element.h"

namespace gradscope::comm {

// ---- AsyncWorker ------------------------------------------------------------------------------------------

AsyncWorker::AsyncWorker(Communicator& comm, std::function<void()> on_start) {
  std::string why_not;
  comm_ = comm.concurrentCopy(why_not);
  if (!comm_) fail("{}", why_not);
  ranks_ = comm_->size();
  thread_ = std::thread([this, on_start = std::move(on_start)] { loop(on_start); });
}

AsyncWorker::~AsyncWorker() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  posted_.notify_one();
  thread_.join();
}

AsyncWorker::Ticket AsyncWorker::post(const void* send, void* recv, std::size_t count, DType dtype) {
  Ticket ticket = 0;
  {
    const std::lock_guard lock(mutex_);
    tasks_.push_back({send, recv, count, dtype});
    ticket = ++next_;
  }
  posted_.notify_one();
  return ticket;
}

void AsyncWorker::wait(Ticket ticket) {
  std::unique_lock lock(mutex_);
  if (done_ < ticket) {
    waiters_.fetch_add(1, std::memory_order_relaxed);
    completed_.wait(lock, [&] { return done_ >= ticket; });
    waiters_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (!failure_.empty()) fail("{}", failure_);
}

// The sums in flight are tested, not waited for in the library: MPI's blocking calls busy-poll, which on
// a machine whose cores the ranks keep busy takes the job's CPU for the whole reduction. Every sum handed
// over is started at once (they may be many per step: one per layer), in order, so that their rounds
// overlap; between tests the thread sleeps, from kFirstPause doubling to kLongestPause, and only yields
// while the job waits. They complete in order: a ticket is done once it and every one before it are.
// After a failure the rest are only marked complete (each wait() throws): the ranks may no longer agree
// on which sums were made.
void AsyncWorker::loop(const std::function<void()>& on_start) {
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

// ---- AsyncStrategy ----------------------------------------------------------------------------------------

AsyncStrategy::AsyncStrategy(const StrategyName& name, DType dtype, std::shared_ptr<AsyncWorker> worker)
    : Strategy(name), dtype_(dtype), worker_(std::move(worker)) {
  if (name.aggregator != Aggregator::Async || name.staleness < 1 || name.staleness > kMaxStaleness)
    fail("{} is not an async strategy", name.text());
  if (dtype != DType::Fp32 && dtype != DType::Fp64 && dtype != DType::Fp16 && dtype != DType::Bf16)
    fail("{} takes fp32, fp64, fp16 or bf16 input, not {}", name.text(), gradscope::name(dtype));
  slots_.resize(static_cast<std::size_t>(name.staleness));
}

AsyncStrategy::~AsyncStrategy() {
  for (Slot& slot : slots_) {
    try {
      waitFor(slot);
    } catch (const std::exception&) {
      // The worker failed: nothing of ours is still being written.
    }
  }
}

void AsyncStrategy::waitFor(Slot& slot) {
  if (!slot.pending) return;
  slot.pending = false;
  worker_->wait(slot.ticket);
}

void AsyncStrategy::restart(std::size_t count) {
  for (Slot& slot : slots_) waitFor(slot);
  const std::size_t bytes = count * sizeOf(dtype_);
  for (Slot& slot : slots_) {
    slot.input.assign(bytes, std::byte{0});
    slot.sum.assign(bytes, std::byte{0});
  }
  count_ = count;
  step_ = 0;
}

namespace {

// dga's correction for a type the CPU computes in (fp32, fp64): one pass the compiler vectorises.
template <typename T>
void correctTyped(const void* send, void* input, const void* sum, void* recv, std::size_t count,
                  double ranks) {
  const auto* g = static_cast<const T*>(send);
  auto* older = static_cast<T*>(input);
  const auto* s = static_cast<const T*>(sum);
  auto* out = static_cast<T*>(recv);
  for (std::size_t i = 0; i < count; ++i) {
    const T now = g[i];  // read first: send may be recv
    out[i] = static_cast<T>(static_cast<double>(s[i]) +
                            ranks * (static_cast<double>(now) - static_cast<double>(older[i])));
    older[i] = now;
  }
}

}  // namespace

void AsyncStrategy::correct(const void* send, Slot& slot, void* recv) const {
  const auto ranks = static_cast<double>(worker_->ranks());
  if (dtype_ == DType::Fp32)
    return correctTyped<float>(send, slot.input.data(), slot.sum.data(), recv, count_, ranks);
  if (dtype_ == DType::Fp64)
    return correctTyped<double>(send, slot.input.data(), slot.sum.data(), recv, count_, ranks);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  for (std::size_t i = 0; i < count_; ++i) {
    const double gradient = methods::loadElement(dtype_, in, i);
    const double older = methods::loadElement(dtype_, slot.input.data(), i);
    const double sum = methods::loadElement(dtype_, slot.sum.data(), i);
    methods::storeElement(dtype_, slot.input.data(), i, gradient);
    methods::storeElement(dtype_, out, i, sum + ranks * (gradient - older));
  }
}

RunStats AsyncStrategy::run(const void* send, void* recv, std::size_t count) {
  if (count == 0) return {};
  if (count != count_) restart(count);
  const std::size_t bytes = count * sizeOf(dtype_);
  Slot& slot = slots_[static_cast<std::size_t>(step_ % static_cast<std::int64_t>(slots_.size()))];
  if (step_ < static_cast<std::int64_t>(slots_.size())) {
    // Synchronous: the sum of this step, also kept for step t + K.
    std::memcpy(slot.input.data(), send, bytes);
    slot.ticket = worker_->post(slot.input.data(), slot.sum.data(), count, dtype_);
    slot.pending = true;
    waitFor(slot);
    std::memcpy(recv, slot.sum.data(), bytes);
  } else {
    waitFor(slot);  // the sum of step t - K, normally long done
    if (name().delay == StrategyName::Delay::Dga) {
      correct(send, slot, recv);
    } else {
      std::memcpy(slot.input.data(), send, bytes);  // first: send may be recv
      std::memcpy(recv, slot.sum.data(), bytes);
    }
    slot.ticket = worker_->post(slot.input.data(), slot.sum.data(), count, dtype_);
    slot.pending = true;
  }
  ++step_;
  return {};
}

}  // namespace gradscope::comm
