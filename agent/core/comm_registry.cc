#include "core/comm_registry.h"

#include <fmt/format.h>

namespace gradscope::agent {
namespace {
// A retired slot's handle: never a valid MPI or NCCL handle value.
const void* const kRetired = reinterpret_cast<const void*>(~std::uintptr_t{0});
}  // namespace

constinit thread_local CommSlot* CommRegistry::t_last_ = nullptr;

std::string distinctKey(std::set<std::string>& used, const std::string& key, int rank) {
  std::string candidate = key;
  if (used.count(candidate) != 0) candidate = fmt::format("{}@{}", key, rank);
  for (int n = 1; used.count(candidate) != 0; ++n) candidate = fmt::format("{}@{}#{}", key, rank, n);
  used.insert(candidate);
  return candidate;
}

CommSlot* CommRegistry::findSlow(const void* handle) {
  const std::size_t n = size();
  // Newest first: a reused handle value is in the newest slot that holds it.
  for (std::size_t i = n; i-- > 0;) {
    if (slots_[i].handle.load(std::memory_order_acquire) == handle) {
      t_last_ = &slots_[i];
      return &slots_[i];
    }
  }
  return nullptr;
}

CommSlot* CommRegistry::add(const void* handle, const CommDescription& description) {
  const std::lock_guard lock(mutex_);
  const std::size_t n = count_.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < n; ++i)
    if (slots_[i].handle.load(std::memory_order_relaxed) == handle) slots_[i].handle.store(kRetired);
  if (n >= kMaxComms) return nullptr;
  CommSlot& slot = slots_[n];
  slot.index = static_cast<std::uint32_t>(n);
  slot.size = description.size;
  slot.rank = description.rank;
  slot.inter = description.inter;
  slot.prepared.store(false, std::memory_order_relaxed);
  slot.seq.store(0, std::memory_order_relaxed);
  slot.peer_seq.store(0, std::memory_order_relaxed);
  descriptions_.push_back(description);
  descriptions_.back().key = distinctKey(keys_, description.key, description.rank);
  slot.handle.store(handle, std::memory_order_release);
  count_.store(n + 1, std::memory_order_release);
  return &slot;
}

void CommRegistry::retire(const void* handle) {
  const std::lock_guard lock(mutex_);
  const std::size_t n = count_.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < n; ++i)
    if (slots_[i].handle.load(std::memory_order_relaxed) == handle) slots_[i].handle.store(kRetired);
  t_last_ = nullptr;
}

void CommRegistry::retire(CommSlot& slot) {
  const std::lock_guard lock(mutex_);
  slot.handle.store(kRetired);
  t_last_ = nullptr;
}

CommDescription CommRegistry::description(std::size_t index) {
  const std::lock_guard lock(mutex_);
  return descriptions_.at(index);
}

}  // namespace gradscope::agent
