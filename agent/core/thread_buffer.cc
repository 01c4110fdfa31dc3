#include "core/thread_buffer.h"

#include <sys/mman.h>

#include <mutex>
#include <new>

namespace gradscope::agent {

void ThreadBuffer::Unmap::operator()(CallEvent* p) const {
  ::munmap(p, bytes);
}

namespace {

std::unique_ptr<CallEvent[], ThreadBuffer::Unmap> mapPopulated(std::uint32_t capacity) {
  const std::size_t bytes = sizeof(CallEvent) * capacity;
  void* memory =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (memory == MAP_FAILED) throw std::bad_alloc();
  // CallEvent is an aggregate of scalars (an implicit-lifetime type): storing into the raw mapping
  // starts each record's lifetime.
  return {static_cast<CallEvent*>(memory), ThreadBuffer::Unmap{bytes}};
}

}  // namespace

ThreadBuffer::ThreadBuffer(std::uint32_t capacity)
    : capacity_(capacity), mask_(capacity - 1), slots_(mapPopulated(capacity)) {}

ThreadBuffer* ThreadBufferTable::claim() noexcept {
  // Reuse a buffer whose thread exited and which the background thread has drained (it sets kFree).
  const std::size_t n = size();
  for (std::size_t i = 0; i < n; ++i) {
    ThreadBuffer* buffer = at(i);
    int expected = ThreadBuffer::kFree;
    if (buffer != nullptr && buffer->state.compare_exchange_strong(expected, ThreadBuffer::kOwned)) {
      buffer->restartRateWindow();
      return buffer;
    }
  }
  // A new one. Claims are rare (once per thread), so a mutex keeps the append simple.
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  const std::size_t index = count_.load(std::memory_order_relaxed);
  if (index >= kMaxThreadBuffers) return nullptr;
  ThreadBuffer* buffer = nullptr;
  try {
    buffer = new ThreadBuffer(capacity_);  // owned by the table until exit
  } catch (const std::bad_alloc&) {
    return nullptr;  // the caller counts the call as dropped; a later call tries again
  }
  buffer->state.store(ThreadBuffer::kOwned, std::memory_order_relaxed);
  buffers_[index].store(buffer, std::memory_order_release);
  count_.store(index + 1, std::memory_order_release);
  return buffer;
}

}  // namespace gradscope::agent
