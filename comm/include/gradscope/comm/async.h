#pragma once

// Asynchronous aggregation: what a call site returns when its ranks stop waiting for each other at every
// reduction (docs/async.md). Names: async/stale<K> and async/dga<K> (common/strategy_name.h).
//
// An AsyncStrategy is one call site of the job: its n-th run() is the site's step n (counted from its
// first run, or from the last change of size, which restarts it). At step t the site's gradient g[t] is
// handed to the worker to be summed over the ranks, and run() returns
//   t < K       the sum of step t, waited for (the first K steps are synchronous);
//   stale<K>    the sum of step t-K, the same on every rank, so replicas stay identical;
//   dga<K>      sum[t-K] + N * (g[t] - g[t-K]), computed in fp64 and rounded once to the dtype: this
//               rank's own newer gradient corrects the stale sum (delayed gradient averaging, Zhu et al.,
//               NeurIPS 2021). Summed over steps the corrections telescope: a replica's weights differ
//               from stale<K>'s by the local term of its last K steps only.
// Each site keeps K input and K result buffers (2K times the call's bytes), in host memory.
//
// The sums run on an AsyncWorker: a thread with a communicator of its own (Communicator::
// concurrentCopy), which starts what it is handed in the order it was handed, all at once. Every rank hands
// over the same reductions in the same order (the call sites are the same on every rank), so the worker's
// collectives match. They progress while the job computes, whatever the MPI library's own progress rules
// (Open MPI moves a nonblocking collective only inside MPI calls): the worker starts each sum
// (Communicator::startAllReduce) and tests them between short sleeps, so that it leaves the CPU to the job
// instead of busy-polling in a blocking call. MPI then needs MPI_THREAD_MULTIPLE. The sums are MPI's
// nonblocking all-reduce, whose order of addition may differ from the blocking one's (Open MPI's libnbc
// against coll/tuned, with 3 ranks): bit for bit the job's own MPI_Iallreduce, not its MPI_Allreduce.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gradscope/comm/communicator.h"
#include "gradscope/comm/strategy.h"

namespace gradscope::comm {

class AsyncWorker {
 public:
  using Ticket = std::uint64_t;

  // Collective over `comm`: takes its concurrentCopy(). Throws gradscope::Error, with the reason, where
  // the copy cannot be made (on every rank alike where the reason is the process's thread level).
  // `on_start` runs first on the worker thread (the agent marks the thread as its own there).
  explicit AsyncWorker(Communicator& comm, std::function<void()> on_start = {});
  // Finishes what was handed over, then stops the thread and frees the communicator.
  ~AsyncWorker();
  AsyncWorker(const AsyncWorker&) = delete;
  AsyncWorker& operator=(const AsyncWorker&) = delete;

  // recv = Σ over ranks of send, `count` elements of `dtype` (a sum the communicator supports). Neither
  // buffer may be touched until wait() for the ticket returned.
  Ticket post(const void* send, void* recv, std::size_t count, DType dtype);
  // Blocks until that sum is complete. Throws gradscope::Error when a sum failed (every later one fails).
  void wait(Ticket ticket);
  int ranks() const { return ranks_; }

 private:
  struct Task {
    const void* send;
    void* recv;
    std::size_t count;
    DType dtype;
  };
  void loop(const std::function<void()>& on_start);

  static constexpr std::chrono::microseconds kFirstPause{5}, kLongestPause{100};

  std::unique_ptr<Communicator> comm_;
  int ranks_ = 1;
  std::mutex mutex_;
  std::condition_variable posted_, completed_;
  std::deque<Task> tasks_;
  Ticket next_ = 0;  // tickets handed out
  Ticket done_ = 0;  // tickets complete (in order)
  bool stopping_ = false;
  std::atomic<int> waiters_{0};  // job threads in wait(): the worker then yields instead of sleeping
  std::string failure_;
  std::thread thread_;
};

// One call site under async/stale<K> or async/dga<K> (makeStrategy builds it; StrategyOptions::
// async_worker shares one worker between the sites of a communicator). fp32, fp64, fp16 and bf16.
class AsyncStrategy final : public Strategy {
 public:
  AsyncStrategy(const StrategyName& name, DType dtype, std::shared_ptr<AsyncWorker> worker);
  // Waits for the site's sums in flight (they write its buffers).
  ~AsyncStrategy() override;

  bool lossless() const override { return false; }
  // The site's next step; a count other than the last one's restarts it (its step 0 again).
  RunStats run(const void* send, void* recv, std::size_t count) override;

 private:
  struct Slot {
    std::vector<std::byte> input, sum;
    AsyncWorker::Ticket ticket = 0;
    bool pending = false;
  };
  void restart(std::size_t count);
  void waitFor(Slot& slot);
  // recv = sum + N * (send - input), input = send (element by element: send may be recv).
  void correct(const void* send, Slot& slot, void* recv) const;

  DType dtype_;
  std::shared_ptr<AsyncWorker> worker_;
  std::vector<Slot> slots_;  // K of them: step t uses slot t % K
  std::size_t count_ = 0;
  std::int64_t step_ = 0;
};

}  // namespace gradscope::comm
