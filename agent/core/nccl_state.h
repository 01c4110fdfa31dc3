#pragma once

// The NCCL interposer's own state and vocabulary, kept free of NCCL and CUDA calls so that unit tests
// cover it (tests/unit/agent_nccl_test.cc): communicator keys, the per-process stream index, a thread's
// ncclGroupStart/End state, and NCCL's codes in gradscope's terms.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>

#include "core/call_event.h"
#include "core/comm_registry.h"
#include "core/nccl_types.h"
#include "gradscope/common/types.h"

namespace gradscope::agent {

// ---- communicator keys (identical on every rank of a communicator) -----------------------------------

// ncclCommInitRank*: "nccl:" and the FNV-1a 64 hash of the unique ids' bytes in hex (16 digits).
std::string uniqueIdKey(const nccl::ncclUniqueId* ids, int count);
// ncclCommInitAll: one key per call, by the call's ordinal in the process: "nccl:all#N".
std::string initAllKey(std::int64_t ordinal);
// ncclCommSplit: the parent's key, the parent's creation ordinal (CommSlot::created) and the colour:
// "<parent>/split<ordinal>:<color>".
std::string splitKey(const std::string& parent, std::int64_t ordinal, int color);
// A communicator whose creation the agent did not see (made by a function it does not wrap): by size
// and how many such communicators of that size this process met before, "nccl:unseen:<size>#<n>".
std::string unseenKey(int size, int ordinal);

// ---- codes --------------------------------------------------------------------------------------------

// DType codes are NCCL's; a type newer than this build is Other.
inline DType dtypeOf(nccl::ncclDataType_t type) {
  const auto code = static_cast<int>(type);
  return code >= 0 && code < nccl::ncclNumTypes ? static_cast<DType>(code) : DType::Other;
}
// Sum..Avg map directly; dynamic operators (ncclRedOpCreatePreMulSum, >= ncclNumOps) are Other.
inline ReduceOp reduceOpOf(nccl::ncclRedOp_t op) {
  const auto code = static_cast<int>(op);
  return code >= 0 && code < nccl::ncclNumOps ? static_cast<ReduceOp>(code) : ReduceOp::Other;
}

// ---- streams ------------------------------------------------------------------------------------------

// Streams by handle, numbered 1, 2, ... in first-seen order (CallEvent::stream; 0 is "none"). Handles
// are never retired (the agent does not see cudaStreamDestroy), so a handle value the runtime reuses
// keeps its number.
//
// Hot path: find() compares with the calling thread's last hit, then scans the published entries; a new
// handle is added under a mutex (once per stream) and published with a release store of the count.
class StreamTable {
 public:
  static constexpr std::size_t kMaxStreams = 1024;
  static_assert(kMaxStreams <= kMaxStreamIndex, "a stream's index must fit CallPayload::stream");
  // Entry::domain before the GPU timer has looked at the stream.
  static constexpr int kDomainUnknown = -3;

  struct Entry {
    std::atomic<const void*> handle{nullptr};
    std::uint16_t index = 0;
    // The GPU timer's domain of the stream (CudaEventTimer::domainOf), set by the interposer.
    std::atomic<int> domain{kDomainUnknown};
  };

  // The stream's entry, added on first sight; nullptr when the table is full.
  Entry* find(const void* stream) {
    if (t_last_.table == this && t_last_.entry->handle.load(std::memory_order_relaxed) == stream)
      return t_last_.entry;
    return findSlow(stream);
  }
  std::size_t size() const { return count_.load(std::memory_order_acquire); }

 private:
  Entry* findSlow(const void* stream);

  struct LastHit {
    const StreamTable* table = nullptr;
    Entry* entry = nullptr;
  };
  static constinit thread_local LastHit t_last_;
  std::mutex mutex_;  // guards appends
  std::atomic<std::size_t> count_{0};
  Entry entries_[kMaxStreams];
};

// ---- groups -------------------------------------------------------------------------------------------

// One thread's ncclGroupStart/End state. NCCL's group depth is per thread, and so is this. The depth is
// counted for every call, recorded or not, so that it stays right when recording starts inside a group.
// Members wait here, in call order, until the outermost ncclGroupEnd times them.
class GroupState {
 public:
  static constexpr std::size_t kMaxMembers = 1024;
  static constexpr int kMaxStreams = 8;

  struct Member {
    CallEvent event;
    nccl::cudaStream_t stream = nullptr;
    int domain = StreamTable::kDomainUnknown;
    bool profiled = false;     // the profiler plugin reported NCCL's choices for it (nccl_profile.h)
    CommSlot* slot = nullptr;  // its communicator (the first member's numbers the group's launch)
  };

  int depth() const { return depth_; }
  // `now`: the tick of the call (0 when not recording); the outermost start's is the group's issue time.
  void start(std::uint64_t now = 0) {
    if (depth_++ == 0) started_ = now;
  }
  // Returns true when this end closes the outermost group (NCCL launches the group's work then).
  // An end without a start (the job's error, which NCCL reports) leaves the depth at 0.
  bool end() {
    if (depth_ == 0) return false;
    return --depth_ == 0;
  }
  // The tick of the outermost ncclGroupStart of the group being built (0: not known).
  std::uint64_t started() const { return started_; }

  // A call made inside a group; false when the group already holds kMaxMembers (the caller then records
  // the call on its own). The member table is allocated at a thread's first member.
  bool add(const CallEvent& event, nccl::cudaStream_t stream, int domain, CommSlot* slot = nullptr);
  std::span<Member> members() { return {members_.get(), size_}; }
  void clear() { size_ = 0; }

  // The distinct streams of the members, in first-seen order, with their domains; at most kMaxStreams.
  // Returns how many.
  int distinctStreams(nccl::cudaStream_t* streams, int* domains) const;

 private:
  int depth_ = 0;
  std::uint64_t started_ = 0;
  std::size_t size_ = 0;
  std::unique_ptr<Member[]> members_;
};

// The record of a group's launch (Api::NcclGroup), beside its members' own: on the first member's
// communicator with sequence number `seq` (the caller takes it from that communicator's point-to-point
// numbering, call_event.h numberedApart), count = the members, bytes = the sum of theirs, dtype Other, no
// reduction; the first member's step and stream; issued at `started` (the outermost ncclGroupStart; 0:
// the first member's issue). The caller sets its span and GPU slot, as it does the members'. `members`
// must not be empty.
CallEvent groupLaunchEvent(std::span<const GroupState::Member> members, std::int64_t seq,
                           std::uint64_t started);

}  // namespace gradscope::agent
