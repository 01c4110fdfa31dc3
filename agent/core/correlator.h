#pragma once

// The background thread's one join: what is known of a call once it is drained or written (its row id,
// its record) with what arrives about it from elsewhere, by the call's key, whichever of the two comes
// first. Used for NCCL's choices (the profiler plugin's reports), explorations and CUDA graph replays.
//
// Bound, and the one eviction rule: each side remembers what arrived within its last `bound` arrivals.
// A call is forgotten once `bound` newer calls were added: that costs nothing by itself (a report that
// comes for it later waits like any other). A report that waits is lost once `bound` newer reports
// waited, or at the end (drain()): it is handed to the caller's `lost`, and counted as one drop of the
// join's kind. A call stays after it matched (a captured call gets a report per replay); a report is
// used once. Memory: at most `bound` entries per side.
//
// Background thread only: no locks.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gradscope/common/drop_kind.h"

namespace gradscope::agent {

// (communicator, seq), the key of every join: which communicator numbering the join uses (registry index
// or trace row) is its own.
using CommSeq = std::pair<std::int64_t, std::int64_t>;
struct CommSeqHash {
  std::size_t operator()(const CommSeq& key) const {
    // In unsigned arithmetic: numbers of calls numbered apart carry call_event.h's kPeerSeqBit (2^62).
    return std::hash<std::uint64_t>()(static_cast<std::uint64_t>(key.second) * 4099u +
                                      static_cast<std::uint64_t>(key.first));
  }
};

template <typename Key, typename Call, typename Report, typename Hash = std::hash<Key>>
class BoundedCorrelator {
 public:
  BoundedCorrelator(std::size_t bound, DropKind counted_as) : bound_(bound), kind_(counted_as) {}

  // The call `key` is known as `call` (replacing an earlier call of that key). Reports that waited for it
  // are matched now, oldest first: match(Call&, Report&&).
  template <typename Match>
  void addCall(const Key& key, Call call, Match&& match) {
    const std::uint64_t serial = next_call_++;
    Call& stored = calls_.insert_or_assign(key, Stored{std::move(call), serial}).first->second.call;
    call_order_.push_back({key, serial});
    takeReports(key, [&](Report&& report) { match(stored, std::move(report)); });
    while (call_order_.size() > bound_) {
      const auto& [old_key, old_serial] = call_order_.front();
      if (const auto it = calls_.find(old_key); it != calls_.end() && it->second.serial == old_serial)
        calls_.erase(it);
      call_order_.pop_front();
    }
  }

  // A report about call `key`: matched now when the call is known (match(Call&, Report&&)), else it
  // waits; a waiting report pushed out by it goes to lost(Report&&) and is counted.
  template <typename Match, typename Lost>
  void addReport(const Key& key, Report report, Match&& match, Lost&& lost) {
    if (const auto it = calls_.find(key); it != calls_.end()) {
      match(it->second.call, std::move(report));
      return;
    }
    waiting_index_.emplace(key, next_report_++);
    waiting_.push_back({key, std::move(report), false});
    ++waiting_count_;
    while (waiting_.size() > bound_) {
      Waiting& oldest = waiting_.front();
      if (!oldest.done) {
        forget(oldest.key, first_report_);
        --waiting_count_;
        ++dropped_;
        lost(std::move(oldest.report));
      }
      waiting_.pop_front();
      ++first_report_;
    }
  }

  // The reports waiting for `key`, oldest first, taken: visit(Report&&). For a call about to be written
  // that is not remembered afterwards.
  template <typename Visit>
  void takeReports(const Key& key, Visit&& visit) {
    if (waiting_count_ == 0) return;
    const auto [begin, end] = waiting_index_.equal_range(key);
    if (begin == end) return;
    serials_.clear();
    for (auto it = begin; it != end; ++it) serials_.push_back(it->second);
    waiting_index_.erase(begin, end);
    std::sort(serials_.begin(), serials_.end());
    for (const std::uint64_t serial : serials_) {
      Waiting& entry = waiting_[serial - first_report_];
      entry.done = true;
      --waiting_count_;
      visit(std::move(entry.report));
    }
  }

  // The end: every report still waiting is lost (lost(Report&&), counted), oldest first.
  template <typename Lost>
  void drain(Lost&& lost) {
    for (Waiting& entry : waiting_)
      if (!entry.done) {
        ++dropped_;
        lost(std::move(entry.report));
      }
    first_report_ += waiting_.size();
    waiting_.clear();
    waiting_index_.clear();
    waiting_count_ = 0;
  }

  DropKind kind() const { return kind_; }
  std::size_t bound() const { return bound_; }
  std::size_t waitingReports() const { return waiting_count_; }
  std::size_t knownCalls() const { return calls_.size(); }
  // Reports lost since the last call (counted from 0 again).
  std::int64_t takeDropped() { return std::exchange(dropped_, 0); }

 private:
  struct Stored {
    Call call;
    std::uint64_t serial;
  };
  struct Waiting {
    Key key;
    Report report;
    bool done;
  };

  void forget(const Key& key, std::uint64_t serial) {
    const auto [begin, end] = waiting_index_.equal_range(key);
    for (auto it = begin; it != end; ++it)
      if (it->second == serial) {
        waiting_index_.erase(it);
        return;
      }
  }

  std::size_t bound_;
  DropKind kind_;
  std::unordered_map<Key, Stored, Hash> calls_;
  std::deque<std::pair<Key, std::uint64_t>> call_order_;
  std::uint64_t next_call_ = 0;
  // Waiting reports in arrival order (done: matched, its slot kept until it leaves the window), and where
  // each key's are: waiting_[serial - first_report_].
  std::deque<Waiting> waiting_;
  std::unordered_multimap<Key, std::uint64_t, Hash> waiting_index_;
  std::uint64_t next_report_ = 0, first_report_ = 0;
  std::size_t waiting_count_ = 0;
  std::vector<std::uint64_t> serials_;
  std::int64_t dropped_ = 0;
};

}  // namespace gradscope::agent
