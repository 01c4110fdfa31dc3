#include "thread_buffer.h"

#include <mutex>
#include <new>

namespace gradscope::agent {

ThreadBuffer::ThreadBuffer(std::uint32_t capacity)
    : capacity_(capacity),
      mask_(capacity - 1),
      // CallEvent is an aggregate of scalars (an implicit-lifetime type): storing into the raw
      // allocation starts each record's lifetime.
      slots_(static_cast<CallEvent*>(std::malloc(sizeof(CallEvent) * capacity))) {
  if (!slots_) throw std::bad_alloc();
}

ThreadBuffer* ThreadBufferTable::claim() {
  // Reuse a buffer whose thread exited and which the background thread has drained (it sets kFree).
  const std::size_t n = size();
  for (std::size_t i = 0; i < n; ++i) {
    ThreadBuffer* buffer = at(i);
    int expected = ThreadBuffer::kFree;
    if (buffer != nullptr && buffer->state.compare_exchange_strong(expected, ThreadBuffer::kOwned))
      return buffer;
  }
  // A new one. Claims are rare (once per thread), so a mutex keeps the append simple.
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  const std::size_t index = count_.load(std::memory_order_relaxed);
  if (index >= kMaxThreadBuffers) return nullptr;
  auto* buffer = new ThreadBuffer(capacity_);  // owned by the table until exit
  buffer->state.store(ThreadBuffer::kOwned, std::memory_order_relaxed);
  buffers_[index].store(buffer, std::memory_order_release);
  count_.store(index + 1, std::memory_order_release);
  return buffer;
}

}  // namespace gradscope::agent
