// storage/peers.h: who talks to whom. Traces written by hand with TraceWriter (2, 3 and 4 ranks) whose
// answers are known exactly: messages matched in issue order by (communicator, sender, receiver, tag),
// MPI_ANY_SOURCE receives, sub-communicators, a Sendrecv ring, a 2-stage x 2-replica pipeline and its
// bubble, uneven all-to-alls, NCCL's tagless sends in a group, a rank whose file is missing. Then what the
// user sees of them: the report (golden report_pipeline.txt) and the Chrome trace's flow arrows (golden
// export_pipeline.json).

#include "gradscope/storage/peers.h"

#include <cstdint>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradscope/cli/report.h"
#include "gradscope/common/version.h"
#include "gradscope/storage/export.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using test::TempDir;

constexpr std::int64_t kPeerEpochNs = 1'795'000'000'000'000'000;  // 2026-11-18, as the synthetic job

// Writes a trace by hand: one run, the given ranks (rank id = rank) each with a "world" communicator, and
// calls appended one at a time so that each call's id is known. Point-to-point calls are numbered in a
// sequence of their own per (rank, communicator), as the agent numbers them.
class PeerTraceBuilder {
 public:
  PeerTraceBuilder(const std::string& path, int world, const std::vector<int>& ranks,
                   Backend backend = Backend::Mpi)
      : writer_(TraceWriter::create(path)), backend_(backend) {
    RunInfo run;
    run.uuid = "00000000-0000-4000-8000-0000000000aa";
    run.command = "peers-test";
    run.mode = "observe";
    run.backend = backend;
    run.world_size = world;
    run.host = "node0";
    run.epoch_ns = kPeerEpochNs;
    run.tool_version = "test";
    run_id_ = writer_.addRun(run);
    for (int rank : ranks) {
      writer_.addRank({0, run_id_, rank, "node0", 1000 + rank, "cpu", 0});
      world_[rank] = comm(rank, backend == Backend::Nccl ? "nccl-world" : "world", world, rank);
    }
  }

  std::int64_t comm(int rank, const std::string& key, int size, int comm_rank) {
    return writer_.addComm({0, rank, key, backend_, size, comm_rank});
  }
  std::int64_t world(int rank) const { return world_.at(rank); }

  std::int64_t add(CallRecord call) {
    auto& next = (isPointToPoint(call.api) ? peer_seq_ : collective_seq_)[{call.rank_id, call.comm_id}];
    call.seq = next++;
    return writer_.appendCalls(std::span<const CallRecord>(&call, 1));
  }

  // A send to `dest` (a rank in the communicator) of `bytes`, issued at `enqueue` (its start unless it is
  // nonblocking: then `start` is when the rank began waiting for it).
  std::int64_t send(int rank, std::int64_t comm, Api api, int dest, int tag, std::int64_t bytes,
                    std::int64_t start, std::int64_t end, std::int64_t enqueue = -1) {
    CallRecord call = base(rank, comm, api, bytes, start, end, enqueue);
    call.dest = dest;
    call.send_tag = tag;
    return add(call);
  }
  std::int64_t recv(int rank, std::int64_t comm, Api api, int source, int tag, std::int64_t bytes,
                    std::int64_t start, std::int64_t end, std::int64_t enqueue = -1) {
    CallRecord call = base(rank, comm, api, bytes, start, end, enqueue);
    call.source = source;
    call.recv_tag = tag;
    call.recv_bytes = bytes;
    return add(call);
  }
  std::int64_t sendrecv(int rank, std::int64_t comm, int dest, int source, int tag, std::int64_t bytes,
                        std::int64_t start, std::int64_t end) {
    CallRecord call = base(rank, comm, Api::MpiSendrecv, bytes, start, end, -1);
    call.dest = dest;
    call.send_tag = tag;
    call.source = source;
    call.recv_tag = tag;
    call.recv_bytes = bytes;
    return add(call);
  }
  std::int64_t collective(int rank, std::int64_t comm, Api api, std::int64_t bytes, std::int64_t start,
                          std::int64_t end) {
    CallRecord call = base(rank, comm, api, bytes, start, end, -1);
    if (bytes > 0) {
      call.dtype = DType::Fp32;
      call.count = bytes / 4;
    }
    if (collectiveOf(api) == Collective::AllReduce) call.op = ReduceOp::Sum;
    return add(call);
  }
  std::int64_t allToAll(int rank, std::int64_t comm, Api api, std::int64_t bytes, std::int64_t peer_max,
                        std::int64_t peer_min, std::int64_t start, std::int64_t end) {
    CallRecord call = base(rank, comm, api, bytes, start, end, -1);
    call.peer_max_bytes = peer_max;
    call.peer_min_bytes = peer_min;
    return add(call);
  }

  void finish(std::int64_t end_ns) { writer_.finish(end_ns); }

 private:
  static CallRecord base(int rank, std::int64_t comm, Api api, std::int64_t bytes, std::int64_t start,
                         std::int64_t end, std::int64_t enqueue) {
    CallRecord call;
    call.rank_id = rank;
    call.comm_id = comm;
    call.api = api;
    call.dtype = DType::Uint8;
    call.count = bytes;
    call.bytes = bytes;
    call.enqueue_ns = enqueue >= 0 ? enqueue : start;
    call.start_ns = start;
    call.end_ns = end;
    return call;
  }

  TraceWriter writer_;
  Backend backend_;
  std::int64_t run_id_ = 0;
  std::map<int, std::int64_t> world_;
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> peer_seq_, collective_seq_;
};

std::string describeMessage(const PeerMessage& m) {
  return fmt::format("{}->{} ranks {}->{} tag {} bytes {}", m.send_call_id, m.recv_call_id, m.from_rank,
                     m.to_rank, m.tag, m.bytes);
}

std::vector<std::string> describeMessages(const PeerMessages& messages) {
  std::vector<std::string> out;
  for (const PeerMessage& m : messages.messages) out.push_back(describeMessage(m));
  return out;
}

// The 2-stage x 2-replica pipeline (ranks 0, 1: stage 0; ranks 2, 3: stage 1; 0 feeds 2 and 1 feeds 3),
// two micro-batches, then an all-reduce, an all-to-all(v) and a barrier over all four ranks. Per
// micro-batch m (T = m ms) and stage-0 rank s (d = s + 2 its partner, k = s):
//   s: MPI_Send to d, tag 0, 4 KiB             T+100 us .. T+110 us
//   d: MPI_Recv from s, tag 0 (waits from T)   T+0      .. T+112 us + k us
//   d: MPI_Isend to s, tag 1 (posted T+300 us) T+301 us .. T+305 us
//   s: MPI_Irecv from d, tag 1 (posted T+110.5 us) waited T+200 us .. T+306 us + k us
// Activations and their gradients have the same size: who sent first (s) is upstream.
// Call ids: rank 0 1-7, rank 1 8-14, rank 2 15-21, rank 3 22-28 (in the order of the lines above, per
// micro-batch, then the three collectives).
void writePipelineTrace(const std::string& path) {
  PeerTraceBuilder trace(path, 4, {0, 1, 2, 3});
  for (int rank = 0; rank < 4; ++rank) {
    const std::int64_t world = trace.world(rank);
    const bool upstream = rank < 2;
    const int partner = upstream ? rank + 2 : rank - 2;
    const std::int64_t k = upstream ? rank : rank - 2;
    for (std::int64_t m = 0; m < 2; ++m) {
      const std::int64_t t = m * 1'000'000;
      if (upstream) {
        trace.send(rank, world, Api::MpiSend, partner, 0, 4096, t + 100'000, t + 110'000);
        trace.recv(rank, world, Api::MpiIrecv, partner, 1, 4096, t + 200'000, t + 306'000 + k * 1'000,
                   t + 110'500);
      } else {
        trace.recv(rank, world, Api::MpiRecv, partner, 0, 4096, t, t + 112'000 + k * 1'000);
        trace.send(rank, world, Api::MpiIsend, partner, 1, 4096, t + 301'000, t + 305'000, t + 300'000);
      }
    }
    trace.collective(rank, world, Api::MpiAllreduce, 4096, 2'000'000 + rank * 1'000, 2'050'000);
    // All-to-all(v) of 4000 bytes: an even share is 1000 per peer.
    const std::int64_t most[] = {1000, 1500, 2000, 1000}, least[] = {1000, 500, 0, 1000};
    trace.allToAll(rank, world, rank == 1 || rank == 2 ? Api::MpiAlltoallv : Api::MpiAlltoall, 4000,
                   most[rank], least[rank], 2'060'000, 2'080'000 + rank * 100);
    trace.collective(rank, world, Api::MpiBarrier, 0, 2'100'000, 2'110'000 + rank * 100);
  }
  trace.finish(3'000'000);
}

// ---------------------------------------------------------------------------------------------------
// Matching

TEST(PeerMatching, TwoRanksMatchInIssueOrderPerTag) {
  TempDir dir;
  const std::string path = dir.file("two.db");
  {
    PeerTraceBuilder trace(path, 2, {0, 1});
    // Rank 0 sends tag 5, tag 7, tag 5; rank 1 posts the tag-7 receive first. The file holds rank 1's
    // receives in completion order, not issue order: the match follows the issue order (enqueue).
    trace.send(0, trace.world(0), Api::MpiSend, 1, 5, 100, 1'000, 2'000);          // 1
    trace.send(0, trace.world(0), Api::MpiSsend, 1, 7, 200, 3'000, 4'000);         // 2
    trace.send(0, trace.world(0), Api::MpiIsend, 1, 5, 300, 5'500, 6'000, 5'000);  // 3
    trace.recv(1, trace.world(1), Api::MpiIrecv, 0, 5, 100, 2'500, 2'600, 600);    // 4: the second issued
    trace.recv(1, trace.world(1), Api::MpiIrecv, 0, 7, 200, 4'500, 4'600, 500);    // 5: the first issued
    trace.recv(1, trace.world(1), Api::MpiRecv, 0, 5, 300, 700, 6'100);            // 6: the third
    trace.finish(10'000);
  }
  const TraceReader reader = TraceReader::open(path);
  const PeerMessages matched = matchPeerMessages(reader);
  EXPECT_EQ(describeMessages(matched),
            (std::vector<std::string>{"1->4 ranks 0->1 tag 5 bytes 100", "2->5 ranks 0->1 tag 7 bytes 200",
                                      "3->6 ranks 0->1 tag 5 bytes 300"}));
  EXPECT_EQ(matched.unmatched, 0);
  EXPECT_EQ(matched.unresolved, 0);

  const PeerMatrix matrix = peerMatrix(reader);
  ASSERT_EQ(matrix.ranks, 2);
  EXPECT_EQ(matrix.sent_bytes, (std::vector<std::int64_t>{0, 600, 0, 0}));
  EXPECT_EQ(matrix.send_calls, (std::vector<std::int64_t>{0, 3, 0, 0}));
  EXPECT_EQ(matrix.send_ns, (std::vector<std::int64_t>{0, 1'000 + 1'000 + 500, 0, 0}));
  EXPECT_EQ(matrix.recv_ns, (std::vector<std::int64_t>{0, 0, 100 + 100 + 5'400, 0}));  // row = receiver 1
  EXPECT_EQ(matrix.recv_calls, (std::vector<std::int64_t>{0, 0, 3, 0}));
  EXPECT_EQ(matrix.calls, (std::vector<std::int64_t>{0, 3, 3, 0}));
  EXPECT_EQ(matrix.unresolved, 0);
}

TEST(PeerMatching, AnySourceReceivesMatchByTheSourceTheyGot) {
  TempDir dir;
  const std::string path = dir.file("any.db");
  {
    PeerTraceBuilder trace(path, 3, {0, 1, 2});
    // Rank 0 posts four MPI_ANY_SOURCE receives; the agent records the source each matched: 2, 1, 1, 2.
    // They complete (and are written) in another order than they were posted.
    trace.recv(0, trace.world(0), Api::MpiRecv, 1, 3, 11, 20, 21, 20);  // 1: posted second
    trace.recv(0, trace.world(0), Api::MpiRecv, 2, 3, 22, 10, 11, 10);  // 2: posted first
    trace.recv(0, trace.world(0), Api::MpiRecv, 2, 3, 44, 40, 41, 40);  // 3: posted fourth
    trace.recv(0, trace.world(0), Api::MpiRecv, 1, 3, 33, 30, 31, 30);  // 4: posted third
    trace.send(1, trace.world(1), Api::MpiSend, 0, 3, 11, 5, 6);        // 5
    trace.send(1, trace.world(1), Api::MpiSend, 0, 3, 33, 25, 26);      // 6
    trace.send(2, trace.world(2), Api::MpiSend, 0, 3, 22, 1, 2);        // 7
    trace.send(2, trace.world(2), Api::MpiSend, 0, 3, 44, 35, 36);      // 8
    trace.finish(100);
  }
  const PeerMessages matched = matchPeerMessages(TraceReader::open(path));
  EXPECT_EQ(describeMessages(matched),
            (std::vector<std::string>{"5->1 ranks 1->0 tag 3 bytes 11", "6->4 ranks 1->0 tag 3 bytes 33",
                                      "7->2 ranks 2->0 tag 3 bytes 22", "8->3 ranks 2->0 tag 3 bytes 44"}));
  EXPECT_EQ(matched.unmatched, 0);
}

TEST(PeerMatching, PeersOfASubCommunicatorAreWorldRanks) {
  TempDir dir;
  const std::string path = dir.file("sub.db");
  std::int64_t odd3 = 0;
  {
    PeerTraceBuilder trace(path, 4, {0, 1, 2, 3});
    // "odd" holds world ranks 1 and 3 as its ranks 0 and 1. The same tag on "world" is another message.
    const std::int64_t odd1 = trace.comm(1, "odd", 2, 0);
    odd3 = trace.comm(3, "odd", 2, 1);
    trace.send(1, odd1, Api::MpiSend, 1, 0, 64, 10, 20);             // 1: to odd's 1 = world 3
    trace.send(1, trace.world(1), Api::MpiSend, 3, 0, 128, 30, 40);  // 2: to world 3
    trace.recv(3, trace.world(3), Api::MpiRecv, 1, 0, 128, 5, 45);   // 3
    trace.recv(3, odd3, Api::MpiRecv, 0, 0, 64, 6, 25);              // 4: from odd's 0 = world 1
    trace.finish(100);
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(describeMessages(matchPeerMessages(reader)),
            (std::vector<std::string>{"1->4 ranks 1->3 tag 0 bytes 64", "2->3 ranks 1->3 tag 0 bytes 128"}));
  const PeerMatrix matrix = peerMatrix(reader);
  ASSERT_EQ(matrix.ranks, 4);
  EXPECT_EQ(matrix.sent_bytes[1 * 4 + 3], 192);
  EXPECT_EQ(matrix.recv_ns[3 * 4 + 1], 40 + 19);
  EXPECT_EQ(matrix.calls[1 * 4 + 3], 2);
  EXPECT_EQ(matrix.calls[3 * 4 + 1], 2);
  EXPECT_EQ(std::accumulate(matrix.sent_bytes.begin(), matrix.sent_bytes.end(), std::int64_t{0}), 192);
  const CommunicatorRanks ranks(reader);
  EXPECT_EQ(ranks.worldRank(odd3, 0), 1);
  EXPECT_EQ(ranks.worldRank(odd3, 1), 3);
  EXPECT_EQ(ranks.worldRank(odd3, 2), -1);
  EXPECT_EQ(ranks.worldRank(999, 0), -1);
}

TEST(PeerMatching, SendrecvRingIsOneStage) {
  TempDir dir;
  const std::string path = dir.file("ring.db");
  {
    PeerTraceBuilder trace(path, 4, {0, 1, 2, 3});
    // Two rounds of a ring: rank r sends to r + 1 and receives from r - 1. Call id = 2r + round + 1.
    for (int rank = 0; rank < 4; ++rank)
      for (std::int64_t round = 0; round < 2; ++round) {
        const std::int64_t start = round * 100'000 + rank * 10;
        trace.sendrecv(rank, trace.world(rank), (rank + 1) % 4, (rank + 3) % 4, 0, 1000, start,
                       start + 5'000);
      }
    trace.finish(200'000);
  }
  const TraceReader reader = TraceReader::open(path);
  const PeerMessages matched = matchPeerMessages(reader);
  EXPECT_EQ(
      describeMessages(matched),
      (std::vector<std::string>{"1->3 ranks 0->1 tag 0 bytes 1000", "2->4 ranks 0->1 tag 0 bytes 1000",
                                "3->5 ranks 1->2 tag 0 bytes 1000", "4->6 ranks 1->2 tag 0 bytes 1000",
                                "5->7 ranks 2->3 tag 0 bytes 1000", "6->8 ranks 2->3 tag 0 bytes 1000",
                                "7->1 ranks 3->0 tag 0 bytes 1000", "8->2 ranks 3->0 tag 0 bytes 1000"}));
  EXPECT_EQ(matched.unmatched, 0);

  const PeerMatrix matrix = peerMatrix(reader);
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(rank);
    const int next = (rank + 1) % 4, previous = (rank + 3) % 4;
    EXPECT_EQ(matrix.sent_bytes[static_cast<std::size_t>(rank * 4 + next)], 2000);
    EXPECT_EQ(matrix.send_ns[static_cast<std::size_t>(rank * 4 + next)], 10'000);
    EXPECT_EQ(matrix.recv_ns[static_cast<std::size_t>(rank * 4 + previous)], 10'000);  // the whole Sendrecv
    EXPECT_EQ(matrix.calls[static_cast<std::size_t>(rank * 4 + next)], 2);
    EXPECT_EQ(matrix.calls[static_cast<std::size_t>(rank * 4 + previous)], 2);
    EXPECT_EQ(matrix.sent_bytes[static_cast<std::size_t>(rank * 4 + previous)], 0);
  }

  // A ring is a cycle: every rank is upstream of the next, so all share stage 0, and none waits upstream.
  const auto stages = pipelineBubbles(reader);
  ASSERT_EQ(stages.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const PipelineRank& row = stages[static_cast<std::size_t>(rank)];
    EXPECT_EQ(
        std::tie(row.rank, row.stage, row.blocked_ns, row.recv_calls, row.downstream_ns, row.busy_ns),
        std::make_tuple(rank, 0, std::int64_t{0}, std::int64_t{0}, std::int64_t{0}, std::int64_t{105'000}));
  }
}

TEST(PeerMatching, SendrecvWithOnePeerCountsOnceInTheCallsMatrix) {
  TempDir dir;
  const std::string path = dir.file("exchange.db");
  {
    PeerTraceBuilder trace(path, 2, {0, 1});
    trace.sendrecv(0, trace.world(0), 1, 1, 4, 512, 0, 700);    // 1
    trace.sendrecv(1, trace.world(1), 0, 0, 4, 512, 100, 600);  // 2
    trace.finish(1'000);
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(describeMessages(matchPeerMessages(reader)),
            (std::vector<std::string>{"1->2 ranks 0->1 tag 4 bytes 512", "2->1 ranks 1->0 tag 4 bytes 512"}));
  const PeerMatrix matrix = peerMatrix(reader);
  EXPECT_EQ(matrix.calls, (std::vector<std::int64_t>{0, 1, 1, 0}));
  EXPECT_EQ(matrix.send_ns, (std::vector<std::int64_t>{0, 700, 500, 0}));
  EXPECT_EQ(matrix.recv_ns, (std::vector<std::int64_t>{0, 700, 500, 0}));
}

TEST(PeerMatching, NcclSendsAndReceivesInAGroupMatchWithoutTags) {
  TempDir dir;
  const std::string path = dir.file("nccl.db");
  {
    PeerTraceBuilder trace(path, 2, {0, 1}, Backend::Nccl);
    for (int rank = 0; rank < 2; ++rank) {
      const std::int64_t comm = trace.world(rank);
      trace.collective(rank, comm, Api::NcclGroup, 0, 0, 50'000);                          // 1, 4
      trace.send(rank, comm, Api::NcclSend, 1 - rank, -1, 1 << 20, 1'000, 40'000);         // 2, 5
      trace.recv(rank, comm, Api::NcclRecv, 1 - rank, -1, 1 << 20, 1'000, 41'000 + rank);  // 3, 6
    }
    trace.finish(100'000);
  }
  const TraceReader reader = TraceReader::open(path);
  const PeerMessages matched = matchPeerMessages(reader);
  EXPECT_EQ(describeMessages(matched), (std::vector<std::string>{"2->6 ranks 0->1 tag -1 bytes 1048576",
                                                                 "5->3 ranks 1->0 tag -1 bytes 1048576"}));
  EXPECT_EQ(matched.unmatched, 0);

  std::vector<std::string> families;
  for (const FamilyTotals& row : familyTotals(reader))
    families.push_back(fmt::format("rank {} {} calls {} bytes {} time {}", row.rank, name(row.family),
                                   row.calls, row.bytes, row.time_ns));
  EXPECT_EQ(families, (std::vector<std::string>{
                          "rank 0 point_to_point calls 2 bytes 2097152 time 79000",
                          "rank 0 group calls 1 bytes 0 time 50000",
                          "rank 1 point_to_point calls 2 bytes 2097152 time 79001",
                          "rank 1 group calls 1 bytes 0 time 50000",
                      }));
}

// A rank's file is missing from the merge: what was sent to it or received from it has no world rank
// (unresolved), and a send rank 1 never received stays unmatched.
TEST(PeerMatching, AMissingRankFileLeavesCallsUnresolved) {
  TempDir dir;
  const std::string rank0 = dir.file("rank-0.db"), rank1 = dir.file("rank-1.db");
  {
    PeerTraceBuilder trace(rank0, 3, {0});
    trace.send(0, trace.world(0), Api::MpiSend, 2, 0, 10, 100, 200);  // to the missing rank
    trace.send(0, trace.world(0), Api::MpiSend, 1, 0, 20, 300, 400);  // received
    trace.send(0, trace.world(0), Api::MpiSend, 1, 9, 30, 500, 600);  // never received
    trace.finish(1'000);
  }
  {
    PeerTraceBuilder trace(rank1, 3, {1});
    trace.recv(1, trace.world(1), Api::MpiRecv, 0, 0, 20, 50, 450);
    trace.recv(1, trace.world(1), Api::MpiRecv, 2, 0, 5, 460, 900);  // from the missing rank
    trace.finish(1'000);
  }
  const std::string merged = dir.file("merged.db");
  mergeTraces({rank0, rank1}, merged, {});
  const TraceReader reader = TraceReader::open(merged);
  const PeerMessages matched = matchPeerMessages(reader);
  EXPECT_EQ(describeMessages(matched), (std::vector<std::string>{"2->4 ranks 0->1 tag 0 bytes 20"}));
  EXPECT_EQ(matched.unresolved, 2);
  EXPECT_EQ(matched.unmatched, 3);  // the two unresolved and the send never received

  const PeerMatrix matrix = peerMatrix(reader);
  ASSERT_EQ(matrix.ranks, 3);  // the run's world, though rank 2 is missing
  EXPECT_EQ(matrix.unresolved, 2);
  EXPECT_EQ(matrix.sent_bytes, (std::vector<std::int64_t>{0, 50, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(matrix.recv_ns, (std::vector<std::int64_t>{0, 0, 0, 400, 0, 0, 0, 0, 0}));

  const auto stages = pipelineBubbles(reader);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(std::tie(stages[0].rank, stages[0].stage, stages[0].blocked_ns),
            std::make_tuple(0, 0, std::int64_t{0}));
  EXPECT_EQ(std::tie(stages[1].rank, stages[1].stage, stages[1].blocked_ns, stages[1].recv_calls,
                     stages[1].busy_ns),
            std::make_tuple(1, 1, std::int64_t{400}, std::int64_t{1}, std::int64_t{850}));
}

// ---------------------------------------------------------------------------------------------------
// The pipeline

TEST(PeerPipeline, MatchesTheMicroBatchesOfEachStagePair) {
  TempDir dir;
  const std::string path = dir.file("pipeline.db");
  writePipelineTrace(path);
  const TraceReader reader = TraceReader::open(path);
  const PeerMessages matched = matchPeerMessages(reader);
  EXPECT_EQ(
      describeMessages(matched),
      (std::vector<std::string>{"1->15 ranks 0->2 tag 0 bytes 4096", "3->17 ranks 0->2 tag 0 bytes 4096",
                                "8->22 ranks 1->3 tag 0 bytes 4096", "10->24 ranks 1->3 tag 0 bytes 4096",
                                "16->2 ranks 2->0 tag 1 bytes 4096", "18->4 ranks 2->0 tag 1 bytes 4096",
                                "23->9 ranks 3->1 tag 1 bytes 4096", "25->11 ranks 3->1 tag 1 bytes 4096"}));
  EXPECT_EQ(matched.unmatched, 0);

  std::vector<std::int64_t> peer_calls;
  reader.forEachPeerCall([&](const CallRecord& call) {
    peer_calls.push_back(call.id);
    return true;
  });
  // The point-to-point calls and the all-to-alls: no all-reduce, no barrier.
  EXPECT_EQ(peer_calls, (std::vector<std::int64_t>{1,  2,  3,  4,  6,  8,  9,  10, 11, 13,
                                                   15, 16, 17, 18, 20, 22, 23, 24, 25, 27}));
}

TEST(PeerPipeline, MatrixCellsAreTheStagePairs) {
  TempDir dir;
  const std::string path = dir.file("pipeline.db");
  writePipelineTrace(path);
  const PeerMatrix matrix = peerMatrix(TraceReader::open(path));
  ASSERT_EQ(matrix.ranks, 4);
  EXPECT_EQ(matrix.sent_bytes,
            (std::vector<std::int64_t>{0, 0, 8192, 0, 0, 0, 0, 8192, 8192, 0, 0, 0, 0, 8192, 0, 0}));
  EXPECT_EQ(matrix.send_calls, (std::vector<std::int64_t>{0, 0, 2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 2, 0, 0}));
  EXPECT_EQ(matrix.send_ns,
            (std::vector<std::int64_t>{0, 0, 20'000, 0, 0, 0, 0, 20'000, 8'000, 0, 0, 0, 0, 8'000, 0, 0}));
  // Row = the receiver: stage 0 waits for the gradients (Irecv waits), stage 1 for the activations.
  EXPECT_EQ(matrix.recv_ns, (std::vector<std::int64_t>{0, 0, 212'000, 0, 0, 0, 0, 214'000, 224'000, 0, 0, 0,
                                                       0, 226'000, 0, 0}));
  EXPECT_EQ(matrix.calls, (std::vector<std::int64_t>{0, 0, 4, 0, 0, 0, 0, 4, 4, 0, 0, 0, 0, 4, 0, 0}));
}

TEST(PeerPipeline, StagesAndBubbles) {
  TempDir dir;
  const std::string path = dir.file("pipeline.db");
  writePipelineTrace(path);
  std::vector<std::string> rows;
  for (const PipelineRank& row : pipelineBubbles(TraceReader::open(path)))
    rows.push_back(fmt::format("rank {} stage {} blocked {} in {} downstream {} in {} span {}", row.rank,
                               row.stage, row.blocked_ns, row.recv_calls, row.downstream_ns,
                               row.downstream_calls, row.busy_ns));
  EXPECT_EQ(rows, (std::vector<std::string>{
                      "rank 0 stage 0 blocked 0 in 0 downstream 212000 in 2 span 2010000",
                      "rank 1 stage 0 blocked 0 in 0 downstream 214000 in 2 span 2010100",
                      "rank 2 stage 1 blocked 224000 in 2 downstream 0 in 0 span 2110200",
                      "rank 3 stage 1 blocked 226000 in 2 downstream 0 in 0 span 2110300",
                  }));
}

TEST(PeerPipeline, FamilyTotalsAndLatenessLeavePointToPointApart) {
  TempDir dir;
  const std::string path = dir.file("pipeline.db");
  writePipelineTrace(path);
  const TraceReader reader = TraceReader::open(path);
  std::vector<std::string> families;
  for (const FamilyTotals& row : familyTotals(reader))
    if (row.rank == 0 || row.rank == 2)
      families.push_back(fmt::format("rank {} {} calls {} bytes {} time {}", row.rank, name(row.family),
                                     row.calls, row.bytes, row.time_ns));
  EXPECT_EQ(families, (std::vector<std::string>{
                          "rank 0 collective calls 2 bytes 8096 time 70000",
                          "rank 0 point_to_point calls 4 bytes 16384 time 232000",
                          "rank 0 synchronization calls 1 bytes 0 time 10000",
                          "rank 2 collective calls 2 bytes 8096 time 68200",
                          "rank 2 point_to_point calls 4 bytes 16384 time 232000",
                          "rank 2 synchronization calls 1 bytes 0 time 10200",
                      }));
  // Point-to-point seq numbers are their own and differ between ranks: only the all-reduce, the
  // all-to-all and the barrier are matched across ranks.
  const auto late = reader.lateness();
  ASSERT_EQ(late.size(), 4u);
  for (const auto& rank : late) {
    EXPECT_EQ(rank.matched, 3) << rank.rank_id;
    EXPECT_EQ(rank.max_ns, rank.rank_id * 1'000) << rank.rank_id;  // the all-reduce starts 1 us apart
  }
}

// ---------------------------------------------------------------------------------------------------
// All-to-all

TEST(PeerAllToAll, ImbalanceOfUnevenAlltoallv) {
  TempDir dir;
  const std::string path = dir.file("alltoall.db");
  {
    PeerTraceBuilder trace(path, 3, {0, 1, 2});
    // An even share over 3 peers is bytes / 3.
    trace.allToAll(0, trace.world(0), Api::MpiAlltoallv, 900, 600, 0, 0, 1'000);        // 600 / 300 = 2
    trace.allToAll(0, trace.world(0), Api::MpiAlltoallv, 900, 300, 300, 2'000, 2'500);  // even
    trace.allToAll(1, trace.world(1), Api::MpiAlltoall, 300, 100, 100, 0, 700);
    trace.allToAll(2, trace.world(2), Api::MpiAlltoallv, 0, 0, 0, 0, 800);  // sent nothing: even
    trace.finish(10'000);
  }
  std::vector<std::string> rows;
  for (const AllToAllBalance& row : allToAllBalance(TraceReader::open(path)))
    rows.push_back(fmt::format("rank {} {} calls {} bytes {} peers {}..{} mean {} worst {} time {}", row.rank,
                               name(row.api), row.calls, row.bytes, row.min_peer_bytes, row.max_peer_bytes,
                               row.mean_imbalance, row.worst_imbalance, row.time_ns));
  EXPECT_EQ(rows, (std::vector<std::string>{
                      "rank 0 MPI_Alltoallv calls 2 bytes 1800 peers 0..600 mean 1.5 worst 2 time 1500",
                      "rank 1 MPI_Alltoall calls 1 bytes 300 peers 100..100 mean 1 worst 1 time 700",
                      "rank 2 MPI_Alltoallv calls 1 bytes 0 peers 0..0 mean 1 worst 1 time 800",
                  }));
}

TEST(PeerAllToAll, NothingForATraceWithoutPeers) {
  TempDir dir;
  const std::string path = dir.file("plain.db");
  {
    PeerTraceBuilder trace(path, 2, {0, 1});
    trace.collective(0, trace.world(0), Api::MpiAllreduce, 64, 0, 10);
    trace.collective(1, trace.world(1), Api::MpiAllreduce, 64, 0, 12);
    trace.finish(100);
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_TRUE(matchPeerMessages(reader).messages.empty());
  EXPECT_TRUE(pipelineBubbles(reader).empty());
  EXPECT_TRUE(allToAllBalance(reader).empty());
  const PeerMatrix matrix = peerMatrix(reader);
  EXPECT_EQ(matrix.ranks, 2);
  EXPECT_EQ(matrix.calls, (std::vector<std::int64_t>{0, 0, 0, 0}));
}

// ---------------------------------------------------------------------------------------------------
// What the user sees

std::string peerReport(const std::string& path) {
  std::ostringstream out;
  cli::writeReport(TraceReader::open(path), out);
  return out.str();
}

TEST(PeerReport, GoldenForAPipeline) {
  TempDir dir;
  const std::string path = dir.file("pipeline.db");
  writePipelineTrace(path);
  EXPECT_TRUE(
      test::matchesGolden("report_pipeline.txt", test::replaceAll(peerReport(path), dir.path(), "<dir>")));
}

TEST(PeerReport, ARingHasPairsButNoPipeline) {
  TempDir dir;
  const std::string path = dir.file("ring.db");
  {
    PeerTraceBuilder trace(path, 3, {0, 1, 2});
    for (int rank = 0; rank < 3; ++rank)
      trace.sendrecv(rank, trace.world(rank), (rank + 1) % 3, (rank + 2) % 3, 0, 1000, 0, 5'000);
    trace.send(0, trace.world(0), Api::MpiSend, 1, 7, 8, 6'000, 6'100);  // never received
    trace.finish(10'000);
  }
  const std::string text = peerReport(path);
  EXPECT_NE(text.find("\nPoint-to-point: 3 messages matched between 3 rank pairs\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("\n  1 send or receive without a partner in the trace (dropped by the agent?)\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("Pipeline"), std::string::npos) << text;
  EXPECT_EQ(text.find("All-to-all"), std::string::npos) << text;
  EXPECT_NE(text.find("\n  point-to-point"), std::string::npos) << text;
}

std::string peerChromeTrace(const TraceReader& reader) {
  std::ostringstream out;
  writeChromeTrace(reader, out);
  return test::replaceAll(out.str(), fmt::format("\"producer\":\"gradscope {}\"", kVersion),
                          "\"producer\":\"gradscope <version>\"");
}

TEST(PeerExport, GoldenChromeTraceOfAPipeline) {
  TempDir dir;
  const std::string path = dir.file("pipeline.db");
  writePipelineTrace(path);
  EXPECT_TRUE(test::matchesGolden("export_pipeline.json", peerChromeTrace(TraceReader::open(path))));
}

// Every message is one flow: its start inside the send's slice, its end ("bp":"e") inside the receive's,
// on the slices' own tracks.
TEST(PeerExport, EachMessageIsAFlowFromTheSendToTheReceive) {
  TempDir dir;
  const std::string path = dir.file("pipeline.db");
  writePipelineTrace(path);
  const TraceReader reader = TraceReader::open(path);
  const nlohmann::json trace = nlohmann::json::parse(peerChromeTrace(reader));
  std::map<std::int64_t, nlohmann::json> slices;
  std::map<std::int64_t, nlohmann::json> starts, ends;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    const std::string phase = event.at("ph");
    if (phase == "X") slices[event.at("args").at("id").get<std::int64_t>()] = event;
    if (phase == "s") {
      EXPECT_TRUE(starts.emplace(event.at("id").get<std::int64_t>(), event).second);
    }
    if (phase == "f") {
      EXPECT_EQ(event.at("bp"), "e");
      EXPECT_TRUE(ends.emplace(event.at("id").get<std::int64_t>(), event).second);
    }
  }
  const PeerMessages matched = matchPeerMessages(reader);
  ASSERT_EQ(starts.size(), matched.messages.size());
  ASSERT_EQ(ends.size(), matched.messages.size());
  const auto inside = [](const nlohmann::json& flow, const nlohmann::json& slice) {
    const double ts = flow.at("ts").get<double>(), begin = slice.at("ts").get<double>();
    return flow.at("pid") == slice.at("pid") && flow.at("tid") == slice.at("tid") &&
           flow.at("cat") == "p2p" && ts >= begin && ts <= begin + slice.at("dur").get<double>();
  };
  for (const PeerMessage& message : matched.messages) {
    SCOPED_TRACE(describeMessage(message));
    EXPECT_TRUE(inside(starts.at(message.send_call_id), slices.at(message.send_call_id)));
    EXPECT_TRUE(inside(ends.at(message.send_call_id), slices.at(message.recv_call_id)));
  }
  // Peers and tags as arguments: rank 2's receive of micro-batch 0 and its Isend back.
  const nlohmann::json& receive = slices.at(15).at("args");
  EXPECT_EQ(receive.at("source"), 0);
  EXPECT_EQ(receive.at("source_rank"), 0);
  EXPECT_EQ(receive.at("recv_tag"), 0);
  EXPECT_EQ(receive.at("recv_bytes"), 4096);
  EXPECT_FALSE(receive.contains("dest"));
  const nlohmann::json& send = slices.at(16).at("args");
  EXPECT_EQ(send.at("dest"), 0);
  EXPECT_EQ(send.at("send_tag"), 1);
  EXPECT_EQ(send.at("queued_ns"), 1'000);  // posted at T+300 us, waited for from T+301 us
  EXPECT_EQ(slices.at(13).at("args").at("peer_max_bytes"), 1500);
}

TEST(PeerExport, CsvHasThePeerColumnsLast) {
  TempDir dir;
  const std::string path = dir.file("exchange.db");
  {
    PeerTraceBuilder trace(path, 2, {0, 1});
    trace.sendrecv(0, trace.world(0), 1, 1, 4, 512, 0, 700);
    trace.allToAll(1, trace.world(1), Api::MpiAlltoallv, 900, 600, 0, 800, 900);
    trace.finish(1'000);
  }
  std::ostringstream out;
  writeCsv(TraceReader::open(path), "calls", out);
  EXPECT_EQ(out.str(),
            "id,run_id,rank,comm,seq,step,api,dtype,op,count,bytes,enqueue_ns,start_ns,end_ns,dur_ns,stream,"
            "nccl_algo,nccl_proto,nccl_channels,graph_replay,dest,send_tag,source,recv_tag,recv_bytes,"
            "peer_max_bytes,peer_min_bytes\n"
            "1,1,0,world,0,,MPI_Sendrecv,uint8,,512,512,0,0,700,700,,,,,,1,4,1,4,512,,\n"
            "2,1,1,world,0,,MPI_Alltoallv,uint8,,900,900,800,800,900,100,,,,,,,,,,,600,0\n");
}

}  // namespace
// The links explore timed between hosts: one host whose every exchange is slow stands out against the
// exchanges it had no part in; with two hosts nobody can say which end is slow.
TEST(HostLinks, NamesTheHostWhoseEveryExchangeIsSlow) {
  const std::int64_t mib = 1 << 20;
  // 1 MiB each way: 10 ms between fast hosts (105 MB/s), 85 ms to host c (12 MB/s), each end's
  // measurement of the same exchange a little apart.
  const std::vector<LinkMeasurement> three = {{"a", "b", mib, 10'000'000}, {"b", "a", mib, 10'500'000},
                                              {"a", "c", mib, 85'000'000}, {"c", "a", mib, 84'000'000},
                                              {"b", "c", mib, 86'000'000}, {"c", "b", mib, 87'000'000}};
  const HostLinks links = analyzeLinks(three);
  ASSERT_EQ(links.pairs.size(), 3u);
  EXPECT_EQ(links.pairs[0].host, "b");  // slowest first; each pair once, at its slower end's figure
  EXPECT_EQ(links.pairs[0].peer, "c");
  EXPECT_EQ(links.pairs[0].ns, 87'000'000);
  EXPECT_EQ(links.pairs[2].ns, 10'500'000);
  EXPECT_EQ(links.slow_host, "c");
  EXPECT_DOUBLE_EQ(links.slow_bytes_per_second, static_cast<double>(mib) * 1e9 / 85'000'000);
  EXPECT_DOUBLE_EQ(links.others_bytes_per_second, static_cast<double>(mib) * 1e9 / 10'500'000);

  // No host stands out: a fast pair per host, or a slow one short of half the others' speed.
  std::vector<LinkMeasurement> even = three;
  for (auto& link : even) link.ns = 10'000'000 + (link.host == "c" || link.peer == "c" ? 9'000'000 : 0);
  EXPECT_EQ(analyzeLinks(even).slow_host, "");
  // Two hosts: one pair, nothing to compare it with.
  const HostLinks two = analyzeLinks(std::vector<LinkMeasurement>{{"a", "b", mib, 85'000'000}});
  EXPECT_EQ(two.pairs.size(), 1u);
  EXPECT_EQ(two.slow_host, "");
  // Nonsense is left out rather than divided by.
  EXPECT_TRUE(
      analyzeLinks(std::vector<LinkMeasurement>{{"a", "a", mib, 1}, {"a", "b", 0, 5}, {"a", "b", mib, 0}})
          .pairs.empty());
}

TEST(HostLinks, AreReadFromEveryRanksAgentStatistics) {
  RunInfo merged;
  merged.config_json = R"({"agent_ranks": [
      {"rank": 0, "shadow": {"links": [{"host": "a", "peer": "b", "bytes": 1048576, "ns": 10000000}]}},
      {"rank": 1, "shadow": {"explored": 3}},
      {"rank": 2, "shadow": {"links": [{"host": "b", "peer": "a", "bytes": 1048576, "ns": 11000000},
                                       {"host": "b", "bytes": 1, "ns": 2}]}}]})";
  RunInfo single;
  single.config_json =
      R"({"agent": {"shadow": {"links": [{"host": "c", "peer": "a", "bytes": 8, "ns": 9}]}}})";
  RunInfo broken;
  broken.config_json = "{not json";
  const auto links = linkMeasurements({merged, single, broken});
  ASSERT_EQ(links.size(), 3u);  // the entry without a peer is left out
  EXPECT_EQ(links[0].host, "a");
  EXPECT_EQ(links[1].ns, 11'000'000);
  EXPECT_EQ(links[2].peer, "a");
}

}  // namespace gradscope::storage
