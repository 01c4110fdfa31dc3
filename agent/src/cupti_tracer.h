#pragma once

// Exact GPU spans of NCCL calls from CUPTI's activity records, preferred by the CUDA event timer
// (gpu_timer.h) wherever CUPTI is available.
//
// Design. Around each real NCCL call (and each real ncclGroupEnd that launches a group) the timer pushes
// an external correlation id of kind CUSTOM0 that names the call's event pair; CUPTI then writes, for
// every kernel launched meanwhile, an EXTERNAL_CORRELATION record (its correlationId → our id) and,
// once the kernel has run, a CONCURRENT_KERNEL record (correlationId, start, end). KernelSpans joins the
// two into one span per id: min start .. max end over the id's kernels, so a group's members share it.
//
// Bounds. kBuffers buffers of kBufferBytes, allocated once, are all CUPTI ever gets: when none is free
// the request callback hands out none and CUPTI drops records (counted as "cupti_record" drops). The
// join tables are fixed: a kernel whose correlation has not been seen waits in a small ring, and spans
// live in a table indexed by id (an entry is replaced by a newer id).
//
// Threads. push/pop: any job thread, no lock (CUPTI keeps the id stack per thread). The buffer request
// callback: any thread CUPTI calls it on, lock-free. The completion callback: CUPTI's thread or the one
// calling flush(); it takes `mutex_`, as do span() and forget() (background thread only): the job's
// threads never do.
//
// Not loaded into a process that does not use CUDA: the timer starts it at the first NCCL communicator
// of a process that has loaded the driver, and libcupti is dlopen'ed (never linked).

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cupti_abi.h"

namespace gradscope::agent {

// The join of external correlation records and kernel records (pure: unit-tested without CUPTI).
class KernelSpans {
 public:
  static constexpr std::uint32_t kCorrelations = 1u << 14;  // correlationId → id, by correlationId
  static constexpr std::uint32_t kWaiting = 256;            // kernels whose correlation is not known yet
  static constexpr std::uint32_t kSpans = 1u << 15;         // spans, by id (the timer's pair index)

  KernelSpans();
  void addExternal(std::uint32_t correlation, std::uint64_t id);
  void addKernel(std::uint32_t correlation, std::uint64_t start, std::uint64_t end);
  // The span of `id` in CUPTI's clock, when a kernel of it has been seen.
  bool span(std::uint64_t id, std::uint64_t& start, std::uint64_t& end) const;
  void forget(std::uint64_t id);

 private:
  struct Correlation {
    std::uint32_t correlation = 0;
    std::uint64_t id = 0;  // 0: none
  };
  struct Kernel {
    std::uint32_t correlation = 0;  // 0: none
    std::uint64_t start = 0, end = 0;
  };
  struct Span {
    std::uint64_t id = 0;  // 0: none
    std::uint64_t start = 0, end = 0;
  };
  void extend(std::uint64_t id, std::uint64_t start, std::uint64_t end);

  std::unique_ptr<Correlation[]> correlations_;
  Kernel waiting_[kWaiting];
  std::uint32_t waiting_next_ = 0, waiting_count_ = 0;
  std::unique_ptr<Span[]> spans_;
};

// Reads the records of one completed CUPTI buffer into `spans`: kernels whose name starts with "nccl"
// and CUSTOM0 external correlations. Returns the number of records read.
int parseActivityBuffer(const cupti::Library& library, std::uint8_t* buffer, std::size_t valid_bytes,
                        KernelSpans& spans);

class CuptiTracer {
 public:
  static constexpr int kBuffers = 8;
  // Big enough that a flush every few ms never fills the pool (~4800 kernel records a buffer), small
  // enough that the pool costs little (kineto uses buffers of the same order).
  static constexpr std::size_t kBufferBytes = 1u << 20;

  // Loads libcupti (libcupti.so.13, then libcupti.so), registers the buffer callbacks and enables the
  // kernel and external-correlation records. nullptr on any failure (the caller then times with events
  // only), with the reason in `why`, empty when there is no libcupti to load. At most one per process:
  // CUPTI's callbacks are process-wide.
  static CuptiTracer* start(std::string& why);

  // Hot path, around the real NCCL call.
  void push(std::uint64_t id) const {
    library_.activityPushExternalCorrelationId(cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
  }
  void pop() const {
    std::uint64_t last = 0;
    library_.activityPopExternalCorrelationId(cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
  }
  // Records dropped so far (by CUPTI, for want of a buffer). Any thread.
  std::uint64_t drops() const { return drops_.load(std::memory_order_acquire); }

  // Background thread: delivers the completed buffers (cuptiActivityFlushAll(0)) and counts drops.
  void flush();
  std::uint64_t flushes() const { return flushes_; }
  // Background thread: the span of `id` as Unix-epoch ns, once a kernel record of it has arrived.
  bool span(std::uint64_t id, std::int64_t& start_epoch_ns, std::int64_t& end_epoch_ns);
  void forget(std::uint64_t id);

 private:
  explicit CuptiTracer(const cupti::Library& library);
  static void requestBuffer(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records);
  static void completeBuffer(cuda::CUcontext context, std::uint32_t stream, std::uint8_t* buffer,
                             std::size_t size, std::size_t valid);
  bool measureOffset();
  void countDropped(cuda::CUcontext context, std::uint32_t stream);

  const cupti::Library library_;
  std::unique_ptr<std::uint8_t[]> pool_;
  std::atomic<std::uint32_t> free_{(1u << kBuffers) - 1};  // bit i: buffer i is free
  std::atomic<std::uint64_t> drops_{0};
  std::int64_t offset_ns_ = 0;  // Unix-epoch ns − CUPTI timestamp
  std::uint64_t flushes_ = 0;
  std::mutex mutex_;  // spans_
  KernelSpans spans_;
};

}  // namespace gradscope::agent
