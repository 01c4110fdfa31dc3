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
// Each site keeps K input and K result buffers (2K times the call's bytes) in the communicator's memory.
//
// The sums run on an AsyncWorker, which takes them in the order they are handed and leaves them to
// complete while the job computes. Every rank hands over the same reductions in the same order (the call
// sites are the same on every rank), so the worker's collectives match. Two kinds, by the communicator's
// memory:
// - Host (MPI): a thread with a communicator of its own (Communicator::concurrentCopy), which starts each
//   sum (Communicator::startAllReduce) and tests them between short sleeps, so that they progress whatever
//   the MPI library's own progress rules (Open MPI moves a nonblocking collective only inside MPI calls),
//   and it leaves the CPU to the job instead of busy-polling in a blocking call. MPI then needs
//   MPI_THREAD_MULTIPLE. The sums are MPI's nonblocking all-reduce, whose order of addition may differ
//   from the blocking one's (Open MPI's libnbc against coll/tuned, with 3 ranks): bit for bit the job's
//   own MPI_Iallreduce, not its MPI_Allreduce. wait() blocks the calling thread.
// - Device (NCCL): no thread. The copy is a second NCCL communicator with a CUDA stream of its own; a sum
//   is queued there behind a mark of the owner's stream (what the site copied in), and wait() makes the
//   owner's stream wait for the sum's own mark: the host never waits, and the sum overlaps whatever the
//   GPU runs meanwhile. Its bits are NCCL's all-reduce on a communicator of the same ranks.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gradscope/comm/communicator.h"
#include "gradscope/comm/strategy.h"

namespace gradscope::comm {

class AsyncWorker {
 public:
  using Ticket = std::uint64_t;

  // Collective over `owner`: the worker for its memory, with its concurrentCopy(). Throws gradscope::Error,
  // with the reason, where the copy cannot be made (on every rank alike where the reason is the process's
  // thread level). `on_start` runs first on a worker thread (the agent marks the thread as its own there).
  static std::shared_ptr<AsyncWorker> make(Communicator& owner, std::function<void()> on_start = {});
  // Finishes what was handed over.
  virtual ~AsyncWorker() = default;

  // recv = Σ over ranks of send, `count` elements of `dtype` (a sum the communicator supports), after the
  // owner's work so far (what wrote send). Neither buffer may be touched until wait() for the ticket.
  virtual Ticket post(const void* send, void* recv, std::size_t count, DType dtype) = 0;
  // The owner's work from now on sees that sum complete: host, the calling thread blocks until it is;
  // device, the owner's stream waits for it. Throws gradscope::Error when a sum failed (every later one
  // fails).
  virtual void wait(Ticket ticket) = 0;
  // Blocks until every sum handed over and the owner's work so far are complete: the buffers they use
  // may then be freed. Never throws (a failed sum shows at its wait(); a failed stream at the job's next
  // call).
  virtual void drain() = 0;
  virtual int ranks() const = 0;
};

// One call site under async/stale<K> or async/dga<K> (makeStrategy builds it; StrategyOptions::
// async_worker shares one worker between the sites of a communicator). fp32, fp64, fp16 and bf16.
class AsyncStrategy final : public Strategy {
 public:
  // `comm` is the communicator the call site's buffers are in (the worker's owner); it outlives the strategy.
  AsyncStrategy(const StrategyName& name, Communicator& comm, DType dtype,
                std::shared_ptr<AsyncWorker> worker);
  // Waits for the site's sums in flight (they write its buffers).
  ~AsyncStrategy() override;

  bool lossless() const override { return false; }
  // The site's next step; a count other than the last one's restarts it (its step 0 again).
  RunStats run(const void* send, void* recv, std::size_t count) override;
  // The next run is the site's step 0 again (a step was skipped, or the steps changed shape): its sums in
  // flight are waited for as run() waits (the host never does on the GPU), its buffers kept.
  void restart();

 private:
  struct Slot {
    Buffer input, sum;
    AsyncWorker::Ticket ticket = 0;
    bool pending = false;
  };
  void restart(std::size_t count);
  void waitFor(Slot& slot);
  void settle() noexcept;  // every slot waited for and drained: the buffers may go

  LocalOps& local_;
  DType dtype_;
  std::shared_ptr<AsyncWorker> worker_;
  std::vector<Slot> slots_;  // K of them: step t uses slot t % K
  std::size_t count_ = 0;
  std::int64_t step_ = 0;
};

}  // namespace gradscope::comm
