#pragma once

// Who talks to whom: the point-to-point and all-to-all analysis of a trace (schema v5's peer_calls), for
// the report, the Chrome/Perfetto export and the viewer, written once.
//
// Ranks. The agent records a peer as its rank in the call's communicator (peer_calls.dest, .source);
// everything here speaks world ranks (ranks.rank), translated through the comms rows of the ranks that
// share the communicator's key in the same run (each row gives one member's comm_rank). A peer whose world
// rank the trace cannot tell (a member's file is missing) keeps no place in the matrix and is counted in
// `unresolved`. A peer of -1 (none: MPI_PROC_NULL) is no message at all and is not counted.
//
// Matching. MPI delivers the messages of one (communicator, sender, receiver, tag) in the order they were
// sent (the non-overtaking rule, which also holds for MPI_ANY_SOURCE/MPI_ANY_TAG receives once their
// matched source and tag are known), and NCCL those of one (communicator, sender, receiver). So the k-th
// send from s to r with tag t on a communicator is the k-th receive on r from s with tag t, both in the
// order the calls were issued (enqueue_ns, then seq). A send or receive whose partner is not in the trace
// (dropped, or in a missing file) is counted in `unmatched` and joins nothing. MPI_Sendrecv (and
// MPI_Sendrecv_replace) is both a send (to dest) and a receive (from source): each half is counted apart.
//
// Cost. Each function streams the calls that have peers once (TraceReader::forEachPeerCall, driven by
// peer_calls) or the narrow per-API totals (TraceReader::apiTotals); none queries per call. Matching keeps
// 48 bytes per point-to-point half in memory and sorts them.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gradscope/storage/reader.h"

namespace gradscope::storage {

// World ranks of the peers of calls, as described above: built once from the trace's ranks and comms rows
// (no call is read), then a look-up per call. For readers that translate one call at a time (the export).
class CommunicatorRanks {
 public:
  explicit CommunicatorRanks(const TraceReader& reader);
  CommunicatorRanks(CommunicatorRanks&&) noexcept;
  CommunicatorRanks& operator=(CommunicatorRanks&&) noexcept;
  ~CommunicatorRanks();

  // The world rank of member `comm_rank` of the communicator whose row (on the calling rank) is
  // `comm_id`; -1 when the trace cannot tell.
  int worldRank(std::int64_t comm_id, int comm_rank) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One message: a send joined to the receive that took it.
struct PeerMessage {
  std::int64_t send_call_id = 0;  // calls.id on the sending rank
  std::int64_t recv_call_id = 0;  // calls.id on the receiving rank
  int from_rank = 0;              // world ranks
  int to_rank = 0;
  int tag = -1;            // -1: NCCL (no tags)
  std::int64_t bytes = 0;  // as the sender recorded them
};

struct PeerMessages {
  std::vector<PeerMessage> messages;  // ordered by send_call_id
  // Sends and receives (a Sendrecv's halves one each) without a partner in the trace, the unresolved
  // ones included.
  std::int64_t unmatched = 0;
  std::int64_t unresolved = 0;  // sends and receives whose peer (or own communicator) has no world rank
};
PeerMessages matchPeerMessages(const TraceReader& reader);

// The matched messages as flows, for the exporters' arrows from a send's slice to its receive's: asked
// about each call in increasing id order (the order TraceReader::forEachCall gives), whether the call
// sent a message (the flow's id is then the call's id) and which messages it received (their send call
// ids). One cursor per list: no lookup structure beyond the receives sorted once.
class MessageFlows {
 public:
  explicit MessageFlows(PeerMessages matched);
  bool sends(std::int64_t call_id);
  std::vector<std::int64_t> receives(std::int64_t call_id);

 private:
  PeerMessages matched_;
  std::vector<std::pair<std::int64_t, std::int64_t>> received_;  // (recv_call_id, send_call_id)
  std::vector<PeerMessage>::const_iterator next_sent_;
  std::size_t next_received_ = 0;
};

// Rank × peer totals of point-to-point calls: row = the calling rank, column = its peer, both world ranks
// (index = rank). A send counts at (sender, receiver), a receive at (receiver, sender); MPI_Sendrecv at
// both, its whole duration in each (one call did both). Bytes are what the calls moved; time is the calls'
// duration (end - start), so a receive's time is mostly waiting for its sender, and a nonblocking call's
// the wait that completed it.
struct PeerMatrix {
  int ranks = 0;                         // world size: the matrices are ranks × ranks, row-major
  std::vector<std::int64_t> sent_bytes;  // [from * ranks + to]
  std::vector<std::int64_t> send_calls;  // sends, [from * ranks + to]
  std::vector<std::int64_t> send_ns;     // time in sends, [from * ranks + to]
  std::vector<std::int64_t> recv_ns;     // time in receives, [to * ranks + from]: row = the receiver
  std::vector<std::int64_t> recv_calls;  // receives, [to * ranks + from]
  // Point-to-point calls, [rank * ranks + peer]; a Sendrecv once at each of its two peers (once when they
  // are the same rank).
  std::vector<std::int64_t> calls;
  std::int64_t unresolved = 0;  // as PeerMessages::unresolved
};
PeerMatrix peerMatrix(const TraceReader& reader);

// Pipeline stages and their bubbles. Between two ranks that exchange point-to-point messages, the one that
// sent first (the forward pass's activations precede the backward pass's gradients, in GPipe, 1F1B and
// interleaved schedules alike) is upstream; the bytes cannot tell, since an activation and its gradient
// have the same size. Ties (equal first-send times on rank 0's clock) go to the direction that carried
// more bytes, then to the lower rank. A rank's stage is its place in the chain these edges form: ranks fed
// by no upstream rank are stage 0, a rank fed by stage k is stage k + 1 (the longest chain of upstream
// ranks before it). Ranks on a cycle (a ring of MPI_Sendrecv) share one stage, so a ring is one stage.
// `blocked_ns` is the time the rank spent in receives from its upstream ranks (blocking receives, and
// waits that completed nonblocking ones): the pipeline bubble as that rank saw it. `downstream_ns` the
// time in receives from downstream ranks (the gradients of the backward pass): stage 0 waits there.
// Ranks with no resolved point-to-point call are not listed; empty when the trace has none.
struct PipelineRank {
  int rank = 0;
  int stage = 0;
  std::int64_t blocked_ns = 0;     // in receives from upstream ranks
  std::int64_t recv_calls = 0;     // those receives
  std::int64_t downstream_ns = 0;  // in receives from downstream ranks
  std::int64_t downstream_calls = 0;
  std::int64_t busy_ns = 0;  // the rank's span from its first to its last call (any call), for a share
};
std::vector<PipelineRank> pipelineBubbles(const TraceReader& reader);  // ordered by stage, then rank

// All-to-all imbalance: per rank and API, how unevenly its all-to-all calls spread bytes over the peers.
// imbalance = peer_max_bytes / (bytes / communicator size) averaged over the calls, 1 = even. Only calls
// that recorded their spread (peer_max_bytes) are counted.
struct AllToAllBalance {
  int rank = 0;
  Api api = Api::Unknown;
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
  std::int64_t max_peer_bytes = 0;  // the largest peer_max_bytes of the calls
  std::int64_t min_peer_bytes = 0;  // the smallest peer_min_bytes
  double mean_imbalance = 1.0;
  double worst_imbalance = 1.0;
  std::int64_t time_ns = 0;
};
std::vector<AllToAllBalance> allToAllBalance(const TraceReader& reader);  // ordered by rank, api

// Time and bytes per API family (common/types.h familyOf) and rank; ApiFamily::Group (NCCL group
// launches) is listed but its members are counted in their own families.
struct FamilyTotals {
  int rank = 0;
  ApiFamily family = ApiFamily::Collective;
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
  std::int64_t time_ns = 0;
};
std::vector<FamilyTotals> familyTotals(const TraceReader& reader);  // ordered by rank, family

// The links between the job's hosts, as explore mode timed them at start (docs/agent.md, "Links between
// hosts"): a host's lowest rank exchanged `bytes` both ways at once with another host's, `ns` the fastest
// of a few tries as `host` measured it. Read from the agent's statistics in the runs' configurations
// ("links" of "shadow" in "agent", or of every entry of "agent_ranks"); empty when none were timed.
struct LinkMeasurement {
  std::string host, peer;
  std::int64_t bytes = 0;
  std::int64_t ns = 0;
};
std::vector<LinkMeasurement> linkMeasurements(const std::vector<RunInfo>& runs);

// The pairs of hosts and their exchanges' speed, and the host whose link is slow when one stands out:
// every exchange it took part in ran at most at half the median speed of the exchanges it had no part in.
// Lateness cannot tell that host (a ring all-reduce makes the rank after a slow link late, not the
// link's own host: docs/benchmarks.md, "Across hosts"); the exchanges can, given three hosts or more (with
// two, a slow link could be either end's).
struct HostLinks {
  struct Pair {
    std::string host, peer;  // host < peer
    std::int64_t bytes = 0;  // sent each way
    std::int64_t ns = 0;     // the slower of the two ends' measurements
    double bytesPerSecond() const {
      return ns > 0 ? static_cast<double>(bytes) * 1e9 / static_cast<double>(ns) : 0;
    }
  };
  std::vector<Pair> pairs;             // slowest first
  std::string slow_host;               // empty: none stands out
  double slow_bytes_per_second = 0;    // the slow host's fastest exchange
  double others_bytes_per_second = 0;  // the median of the exchanges without it
};
HostLinks analyzeLinks(std::span<const LinkMeasurement> measurements);

}  // namespace gradscope::storage
