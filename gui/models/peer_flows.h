#pragma once

// The messages of a trace's point-to-point calls as the timeline draws them: each send joined to the
// receive that took it (storage/peers.h matchPeerMessages, the one matching rule), with the two calls'
// ranks and times, so that selecting either call draws an arrow from the send's end to the receive's end
// without a query. Loaded once per trace on the thread pool (jobs.h) and shared read-only with the GUI
// thread.

#include <cstdint>
#include <span>
#include <vector>

#include "gradscope/storage/reader.h"

namespace gradscope::gui {

struct PeerFlow {
  std::int64_t send_call_id = 0, recv_call_id = 0;
  std::int64_t send_rank_id = 0, recv_rank_id = 0;  // ranks.id: the timeline's rows
  // As stored (the timeline adds clock offsets).
  std::int64_t send_start_ns = 0, send_end_ns = 0;
  std::int64_t recv_start_ns = 0, recv_end_ns = 0;
  std::int64_t bytes = 0;
  int tag = -1;                    // -1: NCCL
  int from_rank = 0, to_rank = 0;  // world ranks
};

class PeerFlows {
 public:
  PeerFlows() = default;
  // Takes flows in any order.
  explicit PeerFlows(std::vector<PeerFlow> flows, std::int64_t unmatched = 0, std::int64_t unresolved = 0);

  std::span<const PeerFlow> all() const { return flows_; }  // ordered by send call id
  bool empty() const { return flows_.empty(); }
  // The messages a call took part in: one for a send or a receive, two for an MPI_Sendrecv (as the
  // sender of one and the receiver of the other), none for a call without a matched partner.
  std::vector<const PeerFlow*> of(std::int64_t call_id) const;
  std::int64_t unmatched() const { return unmatched_; }
  std::int64_t unresolved() const { return unresolved_; }

 private:
  std::vector<PeerFlow> flows_;
  std::vector<std::uint32_t> by_receive_;  // indices into flows_, ordered by recv_call_id
  std::int64_t unmatched_ = 0, unresolved_ = 0;
};

// matchPeerMessages, then the two calls' ranks and times (one pass over the calls with peer facts,
// TraceReader::forEachPeerCall). Throws gradscope::Error as the reader does.
PeerFlows loadPeerFlows(const storage::TraceReader& reader);

}  // namespace gradscope::gui
