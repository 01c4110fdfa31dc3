#include "core/nccl_state.h"

#include <fmt/format.h>

namespace gradscope::agent {

std::string uniqueIdKey(const nccl::ncclUniqueId* ids, int count) {
  std::uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (int i = 0; i < count; ++i)
    for (const char byte : ids[i].internal) {
      hash ^= static_cast<unsigned char>(byte);
      hash *= 0x100000001b3ull;
    }
  return fmt::format("nccl:{:016x}", hash);
}

std::string initAllKey(std::int64_t ordinal) {
  return fmt::format("nccl:all#{}", ordinal);
}

std::string splitKey(const std::string& parent, std::int64_t ordinal, int color) {
  return fmt::format("{}/split{}:{}", parent, ordinal, color);
}

std::string unseenKey(int size, int ordinal) {
  return fmt::format("nccl:unseen:{}#{}", size, ordinal);
}

constinit thread_local StreamTable::LastHit StreamTable::t_last_;

StreamTable::Entry* StreamTable::findSlow(const void* stream) {
  std::size_t n = size();
  for (std::size_t i = 0; i < n; ++i)
    if (entries_[i].handle.load(std::memory_order_relaxed) == stream) {
      t_last_ = {this, &entries_[i]};
      return &entries_[i];
    }
  const std::lock_guard lock(mutex_);
  n = count_.load(std::memory_order_relaxed);  // another thread may have added it meanwhile
  for (std::size_t i = 0; i < n; ++i)
    if (entries_[i].handle.load(std::memory_order_relaxed) == stream) {
      t_last_ = {this, &entries_[i]};
      return &entries_[i];
    }
  if (n == kMaxStreams) return nullptr;
  Entry& entry = entries_[n];
  entry.index = static_cast<std::uint16_t>(n + 1);
  entry.handle.store(stream, std::memory_order_relaxed);
  count_.store(n + 1, std::memory_order_release);
  t_last_ = {this, &entry};
  return &entry;
}

bool GroupState::add(const CallEvent& event, nccl::cudaStream_t stream, int domain, CommSlot* slot) {
  if (size_ == kMaxMembers) return false;
  if (!members_) members_.reset(new Member[kMaxMembers]);
  members_[size_++] = {event, stream, domain, false, slot};
  return true;
}

int GroupState::distinctStreams(nccl::cudaStream_t* streams, int* domains) const {
  int n = 0;
  for (std::size_t i = 0; i < size_ && n < kMaxStreams; ++i) {
    const Member& member = members_[i];
    bool seen = false;
    for (int j = 0; j < n && !seen; ++j) seen = streams[j] == member.stream;
    if (seen) continue;
    streams[n] = member.stream;
    domains[n] = member.domain;
    ++n;
  }
  return n;
}

CallEvent groupLaunchEvent(std::span<const GroupState::Member> members, std::int64_t seq,
                           std::uint64_t started) {
  const CallEvent& first = members.front().event;
  CallEvent launch;
  launch.header.seq = seq;
  launch.header.comm = first.header.comm;
  launch.header.api = Api::NcclGroup;
  launch.header.dtype = DType::Other;
  launch.header.op = ReduceOp::None;
  launch.call.count = static_cast<std::int64_t>(members.size());
  for (const GroupState::Member& member : members) launch.call.bytes += member.event.call.bytes;
  launch.call.step = first.call.step;
  launch.call.stream = first.call.stream;
  launch.call.enqueue = started != 0 && started <= first.call.enqueue ? started : first.call.enqueue;
  return launch;
}

}  // namespace gradscope::agent
