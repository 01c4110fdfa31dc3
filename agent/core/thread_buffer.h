#pragma once

// Per-thread record buffers: a single-producer, single-consumer ring per thread that calls an
// intercepted API, drained by the background thread.
//
// Hot path (push): one load of the producer's cached view of the tail, an 80-byte copy, one release
// store of the head. When the ring is full the record is dropped and counted, never waited for.
// Buffers are claimed from a fixed table on a thread's first call (the only allocation, once per
// thread; the thread that activates the agent claims its buffer then) and returned to it, drained,
// when the thread exits, so memory is bounded by the number of threads alive at once × the capacity,
// not by the run's length.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/call_event.h"

namespace gradscope::agent {

class ThreadBuffer {
 public:
  static constexpr std::uint64_t kFullRecheck = 64;

  explicit ThreadBuffer(std::uint32_t capacity);
  ThreadBuffer(const ThreadBuffer&) = delete;
  ThreadBuffer& operator=(const ThreadBuffer&) = delete;

  // Producer (the owning thread).
  bool push(const CallEvent& event) {
    CallEvent* slot = reserve();
    if (slot == nullptr) return false;
    *slot = event;
    publish();
    return true;
  }

  // push() in two halves, so that the caller writes the record straight into the ring: the slot to fill
  // (nullptr when the ring is full: dropped and counted), then publish() makes it visible. Nothing may be
  // pushed on this thread in between.
  //
  // While the ring is full, the consumer's tail is re-read only every kFullRecheck drops: reading it
  // on every call would fetch a cache line the consumer keeps writing, which made a dropped call cost
  // more than a recorded one. At most kFullRecheck − 1 calls are dropped after space was freed.
  CallEvent* reserve() {
    return roomOrDrop() ? &slots_[head_.load(std::memory_order_relaxed) & mask_] : nullptr;
  }

  // Whether a record fits now; when it does not, the record is dropped and counted here. The wrappers ask
  // before they time a call, so that a call whose record would be dropped is not timed at all.
  bool roomOrDrop() {
    const std::uint64_t head = head_.load(std::memory_order_relaxed);
    if (head - cached_tail_ < capacity_) return true;
    const std::uint64_t dropped = dropped_.load(std::memory_order_relaxed);
    if (dropped % kFullRecheck == 0) cached_tail_ = tail_.load(std::memory_order_acquire);
    if (head - cached_tail_ < capacity_) return true;
    dropped_.store(dropped + 1, std::memory_order_relaxed);
    return false;
  }
  void publish() { head_.store(head_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

  // Consumer (the background thread): calls `visit` on at most `max` published records, oldest first,
  // then frees their slots. Returns how many were visited.
  template <typename Visit>
  std::size_t drain(Visit&& visit, std::size_t max = SIZE_MAX) {
    const std::uint64_t tail = tail_.load(std::memory_order_relaxed);
    std::uint64_t head = head_.load(std::memory_order_acquire);
    if (head - tail > max) head = tail + max;
    for (std::uint64_t i = tail; i != head; ++i) visit(slots_[i & mask_]);
    tail_.store(head, std::memory_order_release);
    return static_cast<std::size_t>(head - tail);
  }

  // The recording rate limit (GRADSCOPE_MAX_CALL_RATE) of the owning thread: at most `window_calls`
  // records per window of `window_ticks` clock ticks; window_calls 0: no limit.
  struct RateLimit {
    std::uint64_t window_ticks = 0;
    std::uint32_t window_calls = 0;
  };
  static constexpr std::uint32_t kRateRecheck = 64;

  // Producer, before a call is timed: true and the call's start tick (read from `now`) when the call is to
  // be recorded; false when this window's calls are spent, the call then being counted (rateDropped()) and
  // not timed. While they are spent, the clock is read only every kRateRecheck calls, to see whether the
  // window has ended: a call over the limit costs a few ns, not two clock reads.
  template <typename Now>
  bool admit(const RateLimit& limit, Now&& now, std::uint64_t& start) {
    if (limit.window_calls == 0) {
      start = now();
      return true;
    }
    if (window_left_ == 0 && (window_skips_++ % kRateRecheck != 0 || (start = now()) < window_end_)) {
      rate_dropped_.store(rate_dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return false;
    }
    if (window_left_ != 0) start = now();
    if (start >= window_end_) {
      window_end_ = start + limit.window_ticks;
      window_left_ = limit.window_calls;
      window_skips_ = 0;
    }
    --window_left_;
    return true;
  }

  // A new owner starts a new window at its first call (the owner calls this, on claiming the buffer).
  void restartRateWindow() {
    window_end_ = 0;
    window_left_ = 0;
    window_skips_ = 0;
  }

  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  std::uint64_t rateDropped() const { return rate_dropped_.load(std::memory_order_relaxed); }
  std::uint32_t capacity() const { return static_cast<std::uint32_t>(capacity_); }

  struct Unmap {
    std::size_t bytes;
    void operator()(CallEvent* p) const;
  };

  // Ownership, for reuse after the owning thread exits.
  enum State : int { kFree = 0, kOwned = 1, kOrphaned = 2 };
  std::atomic<int> state{kFree};

 private:
  // Producer-side line: head and the producer's last view of the tail.
  alignas(64) std::atomic<std::uint64_t> head_{0};
  std::uint64_t cached_tail_ = 0;
  std::atomic<std::uint64_t> dropped_{0};
  // The rate limit's window (producer only) and the calls it left out (read by the consumer).
  std::uint64_t window_end_ = 0;
  std::uint32_t window_left_ = 0;
  std::uint32_t window_skips_ = 0;
  std::atomic<std::uint64_t> rate_dropped_{0};
  // Consumer-side line.
  alignas(64) std::atomic<std::uint64_t> tail_{0};
  alignas(64) std::uint64_t capacity_;
  std::uint64_t mask_;
  // Mapped with every page populated up front: a ring whose pages the producer first touches costs a
  // page fault (1–2 µs on a VM) every 57 records, which more than doubled the agent's cost per call
  // until the ring had wrapped once (docs/benchmarks.md, "The agent's overhead").
  std::unique_ptr<CallEvent[], Unmap> slots_;
};

// The table of every buffer ever claimed (at most kMaxThreadBuffers at once; later threads' calls are
// dropped and counted under "thread_buffer").
class ThreadBufferTable {
 public:
  static constexpr std::size_t kMaxThreadBuffers = 256;

  explicit ThreadBufferTable(std::uint32_t capacity) : capacity_(capacity) {}
  // The agent never destroys its table (job threads may record while the process exits); tests do.
  ~ThreadBufferTable() {
    for (std::size_t i = 0; i < size(); ++i) delete at(i);
  }
  ThreadBufferTable(const ThreadBufferTable&) = delete;
  ThreadBufferTable& operator=(const ThreadBufferTable&) = delete;

  // A free buffer for the calling thread (reusing a drained orphan), or nullptr when the table is full
  // or the memory cannot be had.
  ThreadBuffer* claim() noexcept;
  // The owning thread is gone: the background thread frees the buffer once it is drained.
  static void release(ThreadBuffer* buffer) {
    buffer->state.store(ThreadBuffer::kOrphaned, std::memory_order_release);
  }

  std::size_t size() const { return count_.load(std::memory_order_acquire); }
  ThreadBuffer* at(std::size_t i) const { return buffers_[i].load(std::memory_order_acquire); }
  std::uint32_t capacity() const { return capacity_; }

 private:
  std::uint32_t capacity_;
  std::atomic<std::size_t> count_{0};
  std::atomic<ThreadBuffer*> buffers_[kMaxThreadBuffers] = {};
};

}  // namespace gradscope::agent
