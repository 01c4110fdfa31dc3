#pragma once

// Communicators the agent has seen, by the job's handle (an MPI_Comm or ncclComm_t value).
//
// Hot path: find() compares the handle with a thread-local last hit, then scans the published
// slots (jobs use a handful of communicators). Slots are added under a mutex (communicator creation is
// rare) and published with a release store of the count; a freed communicator's slot is retired, so a
// handle value the library reuses later gets a new slot (and a new row in `comms`).

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gradscope/common/types.h"

namespace gradscope::agent {

struct CommSlot {
  std::atomic<const void*> handle{nullptr};
  // Per-communicator sequence number. Collectives on one communicator are ordered by the caller (MPI
  // and NCCL require it), so a load and a store — not a read-modify-write — suffice.
  std::atomic<std::int64_t> seq{0};
  // The next call's sequence number (see seq).
  std::int64_t nextSeq() {
    const std::int64_t value = seq.load(std::memory_order_relaxed);
    seq.store(value + 1, std::memory_order_relaxed);
    return value;
  }
  // Point-to-point calls are numbered apart (ranks make different numbers of them, which would make the
  // collectives' numbers differ between ranks) and may come from several threads at once: an atomic add.
  std::atomic<std::int64_t> peer_seq{0};
  std::int64_t nextPeerSeq() { return peer_seq.fetch_add(1, std::memory_order_relaxed); }
  // Communicators created from this one so far (same rule as seq): names the children identically on
  // every rank.
  std::atomic<std::int64_t> created{0};
  std::uint32_t index = 0;  // position in the table: the id the records carry
  int size = 0;             // ranks in the communicator (an intercommunicator: in this rank's group)
  int rank = 0;             // this process's index in it
  bool inter = false;       // an MPI intercommunicator: explore and apply pass its calls through
  // Explore and apply made its duplicate when the job created it (Extension::prepare).
  std::atomic<bool> prepared{false};
};

struct CommDescription {
  Backend backend = Backend::Unknown;
  std::string key;  // identical on every rank of the communicator
  int size = 0;
  int rank = 0;
  bool inter = false;
};

// The trace holds one row per key on a rank (comms: UNIQUE (rank_id, key)), but one process may hold
// several ranks of a communicator (ncclCommInitAll, or a thread per GPU), and a key may come back (a
// communicator the library gave a handle the agent saw before). The first communicator with a key in
// this process keeps it; the others get "@<rank>" (and "#<n>" should that be taken too): the same on
// every rank that meets the same communicators. `used` holds the keys given so far.
std::string distinctKey(std::set<std::string>& used, const std::string& key, int rank);

class CommRegistry {
 public:
  static constexpr std::size_t kMaxComms = 4096;

  CommSlot* find(const void* handle) {
    CommSlot* last = t_last_;
    if (last != nullptr && last->handle.load(std::memory_order_relaxed) == handle) return last;
    return findSlow(handle);
  }

  // Adds a communicator; if the handle is already present, retires the old slot first. A key given before
  // is made distinct (distinctKey), so that no row of the trace refuses it. Returns nullptr when the
  // table is full (its calls are then dropped and counted).
  CommSlot* add(const void* handle, const CommDescription& description);
  // The communicator was freed or destroyed.
  void retire(const void* handle);
  // The same for the communicator of this slot, whatever its handle value means by now.
  void retire(CommSlot& slot);

  // For the background thread: descriptions of slots [from, size()).
  std::size_t size() const { return count_.load(std::memory_order_acquire); }
  CommDescription description(std::size_t index);
  const CommSlot& slot(std::size_t index) const { return slots_[index]; }

 private:
  __attribute__((noinline)) CommSlot* findSlow(const void* handle);

  static constinit thread_local CommSlot* t_last_;
  std::mutex mutex_;  // guards add/retire and descriptions_
  std::atomic<std::size_t> count_{0};
  CommSlot slots_[kMaxComms];
  std::vector<CommDescription> descriptions_;
  std::set<std::string> keys_;  // every key given, for distinctKey
};

}  // namespace gradscope::agent
