// storage/merge.h: merging the per-rank files of a run keeps every row, rebases times without moving
// any call in absolute time, remaps ids and references, and refuses what would not make sense.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using test::RawDb;
using test::TempDir;

std::vector<std::string> writeJob(const TempDir& dir, const testing::SyntheticJob& job,
                                  const std::string& prefix = "rank") {
  std::vector<std::string> paths;
  for (int rank = 0; rank < job.ranks; ++rank) {
    paths.push_back(dir.file(fmt::format("{}-{}.db", prefix, rank)));
    testing::writeSyntheticRank(paths.back(), job, rank);
  }
  return paths;
}

// Every call of a file in a form independent of ids and time origins: run uuid, rank, communicator key,
// absolute (Unix-epoch) times and everything else a call carries.
std::vector<std::string> absoluteCalls(const TraceReader& reader) {
  std::map<std::int64_t, RunInfo> runs;
  for (const RunInfo& run : reader.runs()) runs[run.id] = run;
  std::map<std::int64_t, RankInfo> ranks;
  for (const RankInfo& rank : reader.ranks()) ranks[rank.id] = rank;
  std::map<std::int64_t, std::string> comms;
  for (const CommInfo& comm : reader.comms()) comms[comm.id] = comm.key;
  std::vector<std::string> out;
  reader.forEachCall([&](const CallRecord& c) {
    const RankInfo& rank = ranks.at(c.rank_id);
    const RunInfo& run = runs.at(rank.run_id);
    out.push_back(
        fmt::format("run={} rank={} comm={} seq={} step={} api={} dtype={} op={} count={} bytes={} enq={} "
                    "start={} end={} stream={} algo={} proto={} channels={}",
                    run.uuid, rank.rank, comms.at(c.comm_id), c.seq, c.step, name(c.api), name(c.dtype),
                    name(c.op), c.count, c.bytes, run.epoch_ns + c.enqueue_ns, run.epoch_ns + c.start_ns,
                    run.epoch_ns + c.end_ns, c.stream, c.nccl_algo, c.nccl_proto, c.nccl_channels));
    return true;
  });
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> absoluteCalls(const std::vector<std::string>& paths) {
  std::vector<std::string> all;
  for (const std::string& path : paths) {
    const auto calls = absoluteCalls(TraceReader::open(path));
    all.insert(all.end(), calls.begin(), calls.end());
  }
  std::sort(all.begin(), all.end());
  return all;
}

// The merged id of the call of rank `rank` with sequence number `seq`.
std::int64_t callIdOf(const TraceReader& reader, int rank, std::int64_t seq) {
  std::map<std::int64_t, int> rank_of;
  for (const RankInfo& info : reader.ranks()) rank_of[info.id] = info.rank;
  std::int64_t found = 0;
  reader.forEachCall([&](const CallRecord& call) {
    if (rank_of.at(call.rank_id) == rank && call.seq == seq) found = call.id;
    return found == 0;
  });
  return found;
}

class MergeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_.ranks = 3;
    job_.steps = 10;
    job_.gpu = true;
    inputs_ = writeJob(dir_, job_);
  }
  TempDir dir_;
  testing::SyntheticJob job_;
  std::vector<std::string> inputs_;
};

TEST_F(MergeTest, KeepsEveryCallAtTheSameAbsoluteTime) {
  const std::vector<std::string> before = absoluteCalls(inputs_);
  std::int64_t calls_in_inputs = 0;
  for (const std::string& path : inputs_) calls_in_inputs += TraceReader::open(path).callCount();

  const std::string output = dir_.file("merged.db");
  const MergeSummary summary = mergeTraces(inputs_, output, {});
  EXPECT_EQ(summary.files, 3);
  EXPECT_EQ(summary.runs, 1);
  EXPECT_EQ(summary.ranks, 3);
  EXPECT_EQ(summary.calls, calls_in_inputs);
  EXPECT_EQ(summary.measurements, 0);
  EXPECT_EQ(test::fileMode(output), 0600u);

  const TraceReader merged = TraceReader::open(output);
  EXPECT_EQ(merged.callCount(), calls_in_inputs);
  EXPECT_EQ(absoluteCalls(merged), before);

  // One run with the earliest time origin (rank 0's) and the latest end.
  const auto runs = merged.runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].uuid, job_.uuid);
  EXPECT_EQ(runs[0].epoch_ns, job_.epoch_ns);
  EXPECT_EQ(runs[0].start_ns, 0);
  EXPECT_EQ(runs[0].world_size, 3);
  EXPECT_EQ(runs[0].tool_version, "test");
  std::int64_t latest_end = 0;
  for (const std::string& path : inputs_) {
    const RunInfo run = TraceReader::open(path).runs().at(0);
    latest_end = std::max(latest_end, run.epoch_ns + run.end_ns.value());
  }
  ASSERT_TRUE(runs[0].end_ns.has_value());
  EXPECT_EQ(runs[0].epoch_ns + *runs[0].end_ns, latest_end);

  const auto ranks = merged.ranks();
  ASSERT_EQ(ranks.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)].id, r);
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)].rank, r);
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)].pid, 1000 + r);
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)].run_id, runs[0].id);
  }
  EXPECT_EQ(merged.comms().size(), 3u);

  // Ids are contiguous and each rank's calls keep their order.
  std::int64_t expected_id = 1;
  std::map<std::int64_t, std::int64_t> last_seq;
  merged.forEachCall([&](const CallRecord& call) {
    EXPECT_EQ(call.id, expected_id++);
    auto [it, fresh] = last_seq.try_emplace(call.rank_id, -1);
    EXPECT_EQ(call.seq, it->second + 1);
    it->second = call.seq;
    return true;
  });

  // The time index of the merged file finds every call of each rank.
  const TimeExtent extent = merged.timeExtent();
  for (const RankInfo& rank : ranks)
    EXPECT_EQ(static_cast<std::int64_t>(merged.callsInWindow(rank.id, extent.begin_ns, extent.end_ns).size()),
              merged.callCount() / 3);

  // Rebased times make cross-rank comparisons meaningful: rank 1 (the straggler) starts every
  // collective 300 us late, the others within the 40 us jitter.
  const auto lateness = merged.lateness();
  ASSERT_EQ(lateness.size(), 3u);
  for (const auto& late : lateness) {
    SCOPED_TRACE(late.rank_id);
    EXPECT_EQ(late.matched, merged.callCount() / 3);
    if (late.rank_id == 1) {
      EXPECT_GE(late.mean_ns, 260'000);
      EXPECT_LE(late.max_ns, 340'000);
    } else {
      EXPECT_LE(late.max_ns, 40'000);
    }
  }
}

TEST_F(MergeTest, InputOrderDoesNotChangeTimes) {
  const std::vector<std::string> reversed(inputs_.rbegin(), inputs_.rend());
  const std::string output = dir_.file("merged.db");
  mergeTraces(reversed, output, {});
  const TraceReader merged = TraceReader::open(output);
  EXPECT_EQ(absoluteCalls(merged), absoluteCalls(inputs_));
  EXPECT_EQ(merged.runs().at(0).epoch_ns, job_.epoch_ns);  // still the earliest origin
  std::int64_t first_rank = -1;
  merged.forEachCall([&](const CallRecord& call) {
    first_rank = call.rank_id;
    return false;
  });
  EXPECT_EQ(first_rank, 2);  // rank 2's file came first; rank ids still equal ranks
}

TEST_F(MergeTest, RemapsReferencesToCallsRanksAndRuns) {
  // Rows that refer to ids of rank 2's file: a measurement of one of its calls, consensus, drops, and a
  // recommendation; and drops in rank 1's file.
  constexpr std::int64_t kSeq = 17;
  std::int64_t call_id_in_file = 0;
  {
    RawDb db(inputs_[2]);
    call_id_in_file = db.integer(fmt::format("SELECT id FROM calls WHERE seq = {}", kSeq));
    db.exec(
        fmt::format("INSERT INTO measurements (run_id, rank_id, call_id, strategy, api, dtype, bytes, world, "
                    "reps, min_ns, "
                    "median_ns, p90_ns, max_ns, algbw_gbs, busbw_gbs, cosine) VALUES (1, 2, {}, "
                    "'sum/ring/fp32', 16, 7, 4096, "
                    "3, 10, 1, 2, 3, 4, 5, 6, 0.5)",
                    call_id_in_file));
    db.exec(
        "INSERT INTO consensus (rank_id, step, alpha, cosine_to_mean, grad_norm, diversity) "
        "VALUES (2, 3, 0.25, 0.5, 2, 1.5)");
    db.exec("INSERT INTO drops VALUES (2, 'call', 11)");
    db.exec("INSERT INTO recommendations (run_id, created_ns, json) VALUES (1, 1234, '{\"r\":2}')");
  }
  {
    RawDb db(inputs_[1]);
    db.exec("INSERT INTO drops VALUES (1, 'call', 4), (1, 'cupti_record', 9)");
  }
  ASSERT_GT(call_id_in_file, 0);

  const std::string output = dir_.file("merged.db");
  const MergeSummary summary = mergeTraces(inputs_, output, {});
  EXPECT_EQ(summary.measurements, 1);
  const TraceReader merged = TraceReader::open(output);
  const std::int64_t merged_call = callIdOf(merged, 2, kSeq);
  ASSERT_GT(merged_call, 0);
  EXPECT_NE(merged_call, call_id_in_file);  // rank 0's and rank 1's calls come first

  const auto measurements = merged.measurements();
  ASSERT_EQ(measurements.size(), 1u);
  EXPECT_EQ(measurements[0].call_id, merged_call);
  EXPECT_EQ(measurements[0].rank_id, 2);
  EXPECT_EQ(measurements[0].run_id, merged.runs().at(0).id);
  EXPECT_EQ(measurements[0].strategy, "sum/ring/fp32");
  EXPECT_EQ(measurements[0].cosine, 0.5);
  EXPECT_FALSE(measurements[0].rel_l2_error.has_value());

  const auto consensus = merged.consensus();
  ASSERT_EQ(consensus.size(), 1u);
  EXPECT_EQ(consensus[0].rank_id, 2);
  EXPECT_EQ(consensus[0].step, 3);
  EXPECT_EQ(consensus[0].alpha, 0.25);

  EXPECT_EQ(test::describeAll(merged.drops()), test::describeAll(std::vector<DropRecord>{
                                                   {1, "call", 4}, {1, "cupti_record", 9}, {2, "call", 11}}));
  const auto recommendations = merged.recommendations();
  ASSERT_EQ(recommendations.size(), 1u);
  EXPECT_EQ(recommendations[0].run_id, merged.runs().at(0).id);
  EXPECT_EQ(recommendations[0].created_ns, 1234);  // Unix-epoch time: not rebased
  EXPECT_EQ(recommendations[0].json, R"({"r":2})");
}

// Explore mode's consensus rows and apply mode's applied calls name calls of their file: merged, they
// name the same calls, and a consensus row without a step takes its call's.
TEST_F(MergeTest, ConsensusRowsAndAppliedCallsFollowTheirCalls) {
  constexpr std::int64_t kSeq = 17;
  std::int64_t call_in_file = 0;
  {
    RawDb db(inputs_[2]);
    call_in_file = db.integer(fmt::format("SELECT id FROM calls WHERE seq = {}", kSeq));
    db.exec(fmt::format(
        "INSERT INTO consensus (id, rank_id, step, alpha, cosine_to_mean, grad_norm, diversity, call_id) "
        "VALUES (1, 2, -1, 0.1, 0.25, 2, 0.75, {0}), (2, 2, 7, 0.2, 0.25, 2, 0.75, {0}), "
        "(3, 2, -1, 0.3, 0.25, 2, 0.75, NULL)",
        call_in_file));
    db.exec(fmt::format("INSERT INTO applied_calls VALUES ({}, 'sum/rs_ag/bf16'), ({}, 'sum/native')",
                        call_in_file, call_in_file + 1));
  }
  {
    RawDb db(inputs_[0]);
    db.exec("INSERT INTO applied_calls VALUES (1, 'sum/native')");
  }
  ASSERT_GT(call_in_file, 0);

  const std::string output = dir_.file("merged.db");
  mergeTraces(inputs_, output, {});
  const TraceReader merged = TraceReader::open(output);
  const std::int64_t merged_call = callIdOf(merged, 2, kSeq);
  ASSERT_GT(merged_call, 0);
  ASSERT_NE(merged_call, call_in_file);
  std::int64_t step = -1;
  merged.forEachCall([&](const CallRecord& call) {
    if (call.id == merged_call) step = call.step;
    return call.id < merged_call;
  });
  ASSERT_GE(step, 0) << "the synthetic job marks its steps";
  ASSERT_NE(step, 7);

  auto consensus = merged.consensus();
  // Identified by alpha: the rows of a step-less call move when they get a step.
  std::sort(consensus.begin(), consensus.end(),
            [](const ConsensusRecord& a, const ConsensusRecord& b) { return a.alpha < b.alpha; });
  ASSERT_EQ(consensus.size(), 3u);
  EXPECT_EQ(consensus[0].step, step);  // -1 in the file: the call's step
  EXPECT_EQ(consensus[0].call_id, merged_call);
  EXPECT_EQ(consensus[1].step, 7);  // a step the agent knew is kept
  EXPECT_EQ(consensus[1].call_id, merged_call);
  EXPECT_EQ(consensus[2].step, -1);  // no call to take it from
  EXPECT_FALSE(consensus[2].call_id.has_value());
  for (const ConsensusRecord& row : consensus) EXPECT_EQ(row.rank_id, 2);

  const auto applied = merged.appliedCalls();
  ASSERT_EQ(applied.size(), 3u);
  EXPECT_EQ(applied[0].call_id, 1);  // rank 0's file comes first: its ids stay
  EXPECT_EQ(applied[0].strategy, "sum/native");
  EXPECT_EQ(applied[1].call_id, merged_call);
  EXPECT_EQ(applied[1].strategy, "sum/rs_ag/bf16");
  EXPECT_EQ(applied[2].call_id, merged_call + 1);
  EXPECT_EQ(applied[2].strategy, "sum/native");
}

// Graph replays are calls of their own (gpu_calls.replay): merged, they keep their number and move with
// their rank's times like every call.
TEST_F(MergeTest, GraphReplaysKeepTheirNumberAndTheirCallsSeq) {
  constexpr std::int64_t kSeq = 17;
  {
    RawDb db(inputs_[2]);
    const std::int64_t last = db.integer("SELECT max(id) FROM calls");
    db.exec(fmt::format(
        "INSERT INTO calls (id, rank_id, comm_id, seq, step, api, dtype, op, count, bytes, enqueue_ns, "
        "start_ns, "
        "end_ns) SELECT {0} + r.k, rank_id, comm_id, seq, step, api, dtype, op, count, bytes, start_ns + "
        "1000 * r.k, "
        "start_ns + 1000 * r.k, start_ns + 1000 * r.k + 500 FROM calls, (SELECT 1 AS k UNION ALL SELECT 2) r "
        "WHERE seq = {1} ORDER BY r.k",
        last, kSeq));
    db.exec(fmt::format(
        "INSERT INTO gpu_calls (call_id, stream, replay) VALUES ({0} + 1, 0, 1), ({0} + 2, 0, 2)", last));
  }
  const std::string output = dir_.file("merged.db");
  mergeTraces(inputs_, output, {});
  const TraceReader merged = TraceReader::open(output);
  std::vector<CallRecord> same;  // rank 2's calls with seq kSeq: the call, then its replays
  merged.forEachCall([&](const CallRecord& call) {
    if (call.seq == kSeq && call.rank_id == 2) same.push_back(call);
    return true;
  });
  ASSERT_EQ(same.size(), 3u);
  EXPECT_EQ(same[0].graph_replay, 0);
  for (std::size_t k = 1; k < same.size(); ++k) {
    EXPECT_EQ(same[k].graph_replay, static_cast<std::int64_t>(k));
    EXPECT_EQ(same[k].comm_id, same[0].comm_id);
    EXPECT_EQ(same[k].start_ns - same[0].start_ns, 1000 * static_cast<std::int64_t>(k));
  }
  const auto summary = merged.replaySummary();
  ASSERT_EQ(summary.size(), 1u);
  EXPECT_EQ(summary[0].captured_calls, 1);
  EXPECT_EQ(summary[0].replays, 2);
  EXPECT_EQ(summary[0].total_ns, 1000);
}

TEST_F(MergeTest, AnOpenRankKeepsTheMergedRunOpen) {
  {
    RawDb db(inputs_[1]);
    db.exec("UPDATE runs SET end_ns = NULL");
  }
  const std::string output = dir_.file("merged.db");
  mergeTraces(inputs_, output, {});
  EXPECT_FALSE(TraceReader::open(output).runs().at(0).end_ns.has_value());
}

TEST_F(MergeTest, RefusesFilesOfDifferentRunsUnlessAllowed) {
  testing::SyntheticJob other = job_;
  other.uuid = "00000000-0000-4000-8000-0000000000aa";
  other.seed = 2;
  other.steps = 4;
  other.epoch_ns = job_.epoch_ns - 5'000'000'000;  // started earlier
  const std::vector<std::string> others = writeJob(dir_, other, "other");
  std::vector<std::string> all = inputs_;
  all.insert(all.end(), others.begin(), others.end());

  const std::string output = dir_.file("merged.db");
  EXPECT_GRADSCOPE_ERROR(mergeTraces(all, output, {}), "2 different runs", job_.uuid, other.uuid,
                         "--allow-different-runs");
  EXPECT_FALSE(test::exists(output));

  MergeOptions options;
  options.allow_different_runs = true;
  const MergeSummary summary = mergeTraces(all, output, options);
  EXPECT_EQ(summary.runs, 2);
  EXPECT_EQ(summary.ranks, 6);
  const TraceReader merged = TraceReader::open(output);
  const auto runs = merged.runs();
  ASSERT_EQ(runs.size(), 2u);
  std::map<std::int64_t, std::string> uuid_of;
  for (const RunInfo& run : runs) uuid_of[run.id] = run.uuid;
  // Each run keeps its own time origin.
  for (const RunInfo& run : runs)
    EXPECT_EQ(run.epoch_ns, run.uuid == job_.uuid ? job_.epoch_ns : other.epoch_ns) << run.uuid;

  // Rank ids are unique; every (run, rank) pair is there once.
  const auto ranks = merged.ranks();
  ASSERT_EQ(ranks.size(), 6u);
  std::set<std::int64_t> ids;
  std::set<std::pair<std::string, int>> run_ranks;
  for (const RankInfo& rank : ranks) {
    ids.insert(rank.id);
    run_ranks.insert({uuid_of.at(rank.run_id), rank.rank});
  }
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(run_ranks.size(), 6u);

  // Calls go to the right run and rank, at the same absolute times.
  EXPECT_EQ(absoluteCalls(merged), absoluteCalls(all));
  // Collectives are matched within a run only: every call has partners on the two other ranks of its run.
  for (const auto& late : merged.lateness()) {
    const auto rank =
        std::find_if(ranks.begin(), ranks.end(), [&](const RankInfo& r) { return r.id == late.rank_id; });
    ASSERT_NE(rank, ranks.end());
    EXPECT_EQ(late.matched, uuid_of.at(rank->run_id) == job_.uuid ? 10 * 7 : 4 * 7);
  }
}

// A job that MPI_Comm_spawn's another: a world of its own, whose ranks are 0, 1, ... again. The agent gives
// it a run of its own that names the run it came from; merge takes both without --allow-different-runs,
// each rank in its own run, while an unrelated run is still refused.
TEST_F(MergeTest, RunsSpawnedByARunOfTheInputsBelongWithIt) {
  testing::SyntheticJob spawned = job_;
  spawned.uuid = "00000000-0000-4000-8000-0000000000bb";
  spawned.ranks = 2;
  spawned.steps = 4;
  std::vector<std::string> children = writeJob(dir_, spawned, "spawned");
  for (const std::string& child : children) {
    RawDb db(child);
    db.exec(fmt::format("UPDATE runs SET config_json = '{{\"spawned_by\": \"{}\"}}'", job_.uuid));
  }
  std::vector<std::string> all = inputs_;
  all.insert(all.end(), children.begin(), children.end());
  const std::string output = dir_.file("merged.db");
  const MergeSummary summary = mergeTraces(all, output, {});
  EXPECT_EQ(summary.runs, 2);
  EXPECT_EQ(summary.ranks, 5);
  const auto runs = TraceReader::open(output).runs();
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_NE(runs[0].config_json.find(job_.uuid) == std::string::npos,
            runs[1].config_json.find(job_.uuid) == std::string::npos)
      << "the spawned run keeps its spawned_by";

  testing::SyntheticJob unrelated = job_;
  unrelated.uuid = "00000000-0000-4000-8000-0000000000cc";
  const std::vector<std::string> others = writeJob(dir_, unrelated, "unrelated");
  all.insert(all.end(), others.begin(), others.end());
  MergeOptions overwrite;
  overwrite.overwrite = true;
  EXPECT_GRADSCOPE_ERROR(mergeTraces(all, output, overwrite), "2 different runs", "--allow-different-runs");
}

TEST_F(MergeTest, RefusesTheSameRankTwice) {
  const std::string copy = dir_.file("copy-of-rank-0.db");
  test::copyFile(inputs_[0], copy);
  const std::string output = dir_.file("merged.db");
  EXPECT_GRADSCOPE_ERROR(mergeTraces({inputs_[0], inputs_[1], copy}, output, {}),
                         "rank 0 of run " + job_.uuid, inputs_[0], copy);
  EXPECT_FALSE(test::exists(output));
  MergeOptions options;
  options.allow_different_runs = true;
  options.overwrite = true;
  EXPECT_GRADSCOPE_ERROR(mergeTraces({inputs_[0], copy}, output, options), "appears in both");
}

TEST_F(MergeTest, RefusesAnExistingOutputUnlessOverwriting) {
  const std::string output = dir_.file("merged.db");
  test::writeFile(output, "previous");
  EXPECT_GRADSCOPE_ERROR(mergeTraces(inputs_, output, {}), output, "already exists");
  EXPECT_EQ(test::readFile(output), "previous");

  MergeOptions options;
  options.overwrite = true;
  mergeTraces(inputs_, output, options);
  EXPECT_EQ(TraceReader::open(output).callCount(), 3 * 10 * 7);
  EXPECT_EQ(test::fileMode(output), 0600u);
  // Only the output is left: no temporary file.
  const auto names = test::listDirectory(dir_.path());
  EXPECT_EQ(names, (std::vector<std::string>{"merged.db", "rank-0.db", "rank-1.db", "rank-2.db"}));
  // An output that is a directory is refused even with overwrite.
  const std::string directory = dir_.makeSubdir("out.db");
  EXPECT_GRADSCOPE_ERROR(mergeTraces(inputs_, directory, options), directory, "is a directory");
}

TEST_F(MergeTest, MergingAMergedFileAgainWorks) {
  const std::string first = dir_.file("merged.db");
  mergeTraces(inputs_, first, {});
  const std::string second = dir_.file("merged-again.db");
  const MergeSummary summary = mergeTraces({first}, second, {});
  EXPECT_EQ(summary.files, 1);
  EXPECT_EQ(summary.ranks, 3);
  const TraceReader a = TraceReader::open(first), b = TraceReader::open(second);
  EXPECT_EQ(absoluteCalls(b), absoluteCalls(a));
  EXPECT_EQ(test::describeAll(b.ranks()), test::describeAll(a.ranks()));
  EXPECT_EQ(test::describeAll(b.runs()), test::describeAll(a.runs()));

  // Incrementally: ranks 0 and 1 merged, then rank 2 added.
  const std::string partial = dir_.file("partial.db");
  mergeTraces({inputs_[0], inputs_[1]}, partial, {});
  const std::string whole = dir_.file("whole.db");
  mergeTraces({partial, inputs_[2]}, whole, {});
  EXPECT_EQ(absoluteCalls(TraceReader::open(whole)), absoluteCalls(a));
}

// Two hosts whose clocks disagree by 3 ms: the merge estimates the offset from the aligned ends of the
// all-reduces, stores it for the second host's ranks (the first host's keep 0), and the readers that
// compare ranks (lateness) then see the same job as with agreeing clocks.
TEST_F(MergeTest, EstimatesTheClockOffsetsOfOtherHostsFromAllReduceEnds) {
  testing::SyntheticJob job;
  job.ranks = 4;  // node0: ranks 0, 1; node1: ranks 2, 3
  job.steps = 10;
  const auto agreeing = writeJob(dir_, job, "agree");
  const auto skewed = writeJob(dir_, job, "skew");
  constexpr std::int64_t kSkew = 3'000'000;  // node1's clock reads 3 ms ahead
  for (int rank : {2, 3}) {
    RawDb db(skewed[static_cast<std::size_t>(rank)]);
    db.exec(fmt::format("UPDATE runs SET epoch_ns = epoch_ns + {}", kSkew));
  }
  const std::string reference = dir_.file("agree.db"), merged = dir_.file("skew.db");
  const MergeSummary plain = mergeTraces(agreeing, reference, {});
  EXPECT_EQ(plain.largest_offset_ns, 0);
  const MergeSummary summary = mergeTraces(skewed, merged, {});
  EXPECT_EQ(summary.hosts_aligned, 1);
  EXPECT_EQ(summary.largest_offset_ns, kSkew);
  const TraceReader reader = TraceReader::open(merged);
  for (const RankInfo& rank : reader.ranks())
    EXPECT_EQ(rank.clock_offset_ns, rank.host == "node1" ? -kSkew : 0) << rank.rank;

  const auto describe = [](const std::vector<TraceReader::Lateness>& rows) {
    std::vector<std::string> out;
    for (const auto& row : rows)
      out.push_back(fmt::format("{} {} {} {}", row.rank_id, row.matched, row.mean_ns, row.max_ns));
    return out;
  };
  EXPECT_EQ(describe(reader.lateness()), describe(TraceReader::open(reference).lateness()));

  // Too few all-reduces to tell: no offset rather than a guess.
  testing::SyntheticJob tiny = job;
  tiny.steps = 1;
  tiny.model_bytes = 1 << 20;  // one bucket: one all-reduce per step
  const auto few = writeJob(dir_, tiny, "few");
  for (int rank : {2, 3}) {
    RawDb db(few[static_cast<std::size_t>(rank)]);
    db.exec(fmt::format("UPDATE runs SET epoch_ns = epoch_ns + {}", kSkew));
  }
  EXPECT_EQ(mergeTraces(few, dir_.file("few.db"), {}).hosts_aligned, 0);
}

// Every row of every table of `path`, in stored order, as text: two files with equal dumps have the same
// content (ids included), whatever their pages look like.
std::vector<std::string> dumpTables(const std::string& path) {
  RawDb db(path, SQLITE_OPEN_READONLY);
  std::vector<std::string> out;
  for (const auto& table : db.rows("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")) {
    out.push_back("table " + table[0]);
    for (const auto& row : db.rows("SELECT * FROM \"" + table[0] + "\"")) {
      std::string line;
      for (const std::string& value : row) line += value + "|";
      out.push_back(std::move(line));
    }
  }
  return out;
}

// The inputs are read on threads and written by one in input order: one thread or several, the output is
// the same rows with the same ids.
// Rank files with what each part of the merge handles: ranks whose steps are detected (step -1 in their
// files), consensus rows without a step, drops, and hosts whose clocks differ (9 ranks on node0..node4,
// two each but the last; the largest offset 2 ms, 4 hosts to align).
std::vector<std::string> writeVariedJob(const TempDir& dir, const std::string& prefix) {
  testing::SyntheticJob job;
  job.ranks = 9;
  job.steps = 12;
  const auto inputs = writeJob(dir, job, prefix);
  for (int rank : {1, 4, 7}) {
    RawDb db(inputs[static_cast<std::size_t>(rank)]);
    db.exec("UPDATE calls SET step = -1");
    db.exec(
        "INSERT INTO consensus (rank_id, step, call_id, alpha, cosine_to_mean, grad_norm, diversity) "
        "SELECT rank_id, -1, max(id), 0.5, 0.9, 1.0, 0.1 FROM calls");
    db.exec("INSERT INTO drops (rank_id, kind, count) SELECT id, 'call', 3 FROM ranks");
  }
  for (int rank : {2, 3, 8}) {
    RawDb db(inputs[static_cast<std::size_t>(rank)]);
    db.exec(fmt::format("UPDATE runs SET epoch_ns = epoch_ns + {}", rank == 8 ? -700'000 : 2'000'000));
  }
  return inputs;
}

TEST_F(MergeTest, TheOutputDoesNotDependOnTheNumberOfThreads) {
  const auto inputs = writeVariedJob(dir_, "threads");
  MergeOptions one;
  one.jobs = 1;
  const std::string reference = dir_.file("one-thread.db");
  const MergeSummary expected = mergeTraces(inputs, reference, one);
  EXPECT_GT(expected.steps_detected, 0);
  EXPECT_EQ(expected.hosts_aligned, 4);
  EXPECT_EQ(expected.largest_offset_ns, 2'000'000);
  const auto rows = dumpTables(reference);
  for (int jobs : {2, 4, 16}) {
    MergeOptions options;
    options.jobs = jobs;
    const std::string output = dir_.file(fmt::format("{}-threads.db", jobs));
    const MergeSummary summary = mergeTraces(inputs, output, options);
    EXPECT_EQ(summary.calls, expected.calls) << jobs;
    EXPECT_EQ(summary.steps_detected, expected.steps_detected) << jobs;
    EXPECT_EQ(summary.step_rows, expected.step_rows) << jobs;
    EXPECT_EQ(summary.largest_offset_ns, expected.largest_offset_ns) << jobs;
    EXPECT_EQ(dumpTables(output), rows) << jobs << " threads";
  }
}

// A failure found while the inputs are copied (here: the writer's, with threads still reading the inputs
// after it) stops the merge with that input's message, and no output is left.
TEST_F(MergeTest, AFailureWhileCopyingStopsTheMergeAndItsThreads) {
  testing::SyntheticJob job;
  job.ranks = 12;
  const auto inputs = writeJob(dir_, job, "failing");
  {
    RawDb db(inputs[2]);
    db.exec("UPDATE comms SET rank_id = 99");
  }
  MergeOptions options;
  options.jobs = 3;
  const std::string output = dir_.file("merged.db");
  try {
    mergeTraces(inputs, output, options);
    ADD_FAILURE() << "merged an input whose communicator names a missing rank";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(inputs[2]), std::string::npos) << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(output));
}

// A merge split across processes (MergeLink): here threads that share only messages.

// Mailboxes between K "processes" of one test: process 0's control messages to each reader, and each
// reader's data messages to process 0, in the order they were sent (what MPI promises per pair and tag).
class Mailboxes {
 public:
  explicit Mailboxes(int processes)
      : control_(static_cast<std::size_t>(processes)), data_(static_cast<std::size_t>(processes)) {}
  void put(bool control, int process, std::string message) {
    {
      const std::lock_guard lock(mutex_);
      box(control, process).push_back(std::move(message));
    }
    changed_.notify_all();
  }
  std::optional<std::string> take(bool control, int process, bool wait) {
    std::unique_lock lock(mutex_);
    auto& queue = box(control, process);
    if (wait) changed_.wait(lock, [&] { return !queue.empty(); });
    if (queue.empty()) return std::nullopt;
    std::string message = std::move(queue.front());
    queue.pop_front();
    return message;
  }
  // Messages no one took: none once every process is done.
  std::size_t left() {
    const std::lock_guard lock(mutex_);
    std::size_t count = 0;
    for (const auto& queue : control_) count += queue.size();
    for (const auto& queue : data_) count += queue.size();
    return count;
  }

 private:
  std::deque<std::string>& box(bool control, int process) {
    return (control ? control_ : data_)[static_cast<std::size_t>(process)];
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::deque<std::string>> control_, data_;
};

class ThreadLink final : public MergeLink {
 public:
  ThreadLink(Mailboxes& boxes, int size, int rank) : boxes_(boxes), size_(size), rank_(rank) {}
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  void sendControl(int to, std::string message) override { boxes_.put(true, to, std::move(message)); }
  std::string receiveControl() override { return *boxes_.take(true, rank_, true); }
  std::optional<std::string> pollControl() override { return boxes_.take(true, rank_, false); }
  void sendData(std::string message) override { boxes_.put(false, rank_, std::move(message)); }
  std::string receiveData(int from) override { return *boxes_.take(false, from, true); }

 private:
  Mailboxes& boxes_;
  const int size_, rank_;
};

// K processes: process 0's link, and the readers serving its merges on threads of their own.
class SplitMerge {
 public:
  explicit SplitMerge(int processes) : boxes_(processes), writer_(boxes_, processes, 0) {
    for (int rank = 1; rank < processes; ++rank) {
      links_.push_back(std::make_unique<ThreadLink>(boxes_, processes, rank));
      readers_.push_back(
          std::async(std::launch::async, [link = links_.back().get()] { return serveMerges(*link, 2); }));
    }
  }
  MergeLink& link() { return writer_; }
  // Ends the readers (endMerges) and returns what their serveMerges returned.
  std::vector<int> end(int status) {
    endMerges(writer_, status);
    std::vector<int> codes;
    for (auto& reader : readers_) codes.push_back(reader.get());
    return codes;
  }
  std::size_t messagesLeft() { return boxes_.left(); }

 private:
  Mailboxes boxes_;
  ThreadLink writer_;
  std::vector<std::unique_ptr<ThreadLink>> links_;
  std::vector<std::future<int>> readers_;
};

// Split across K processes (each reading the inputs i % K == its rank), the merge writes the file one
// process writes, row for row, ids included; the readers then serve a second merge (recommend's several
// directories) and end with the status process 0 gives them. More processes than inputs leaves some with
// nothing.
TEST_F(MergeTest, TheOutputDoesNotDependOnTheNumberOfProcesses) {
  const auto inputs = writeVariedJob(dir_, "split");
  const std::string reference = dir_.file("one-process.db");
  const MergeSummary expected = mergeTraces(inputs, reference, MergeOptions{});
  EXPECT_GT(expected.steps_detected, 0);
  EXPECT_EQ(expected.hosts_aligned, 4);
  const auto rows = dumpTables(reference);
  for (int processes : {2, 3, 4, 12}) {
    SplitMerge split(processes);
    for (int merge = 0; merge < 2; ++merge) {
      MergeOptions options;
      options.link = &split.link();
      options.jobs = 1 + merge;
      const std::string output = dir_.file(fmt::format("{}-processes-{}.db", processes, merge));
      const MergeSummary summary = mergeTraces(inputs, output, options);
      EXPECT_EQ(summary.calls, expected.calls) << processes;
      EXPECT_EQ(summary.files, expected.files) << processes;
      EXPECT_EQ(summary.steps_detected, expected.steps_detected) << processes;
      EXPECT_EQ(summary.step_rows, expected.step_rows) << processes;
      EXPECT_EQ(summary.largest_offset_ns, expected.largest_offset_ns) << processes;
      EXPECT_EQ(dumpTables(output), rows) << processes << " processes, merge " << merge;
    }
    EXPECT_EQ(split.end(3), std::vector<int>(static_cast<std::size_t>(processes - 1), 3)) << processes;
    EXPECT_EQ(split.messagesLeft(), 0u) << processes;
  }
}

// A bad input in any process's share fails the split merge with the message one process gives, before
// anything is written or once rows are (a reader's failure, or process 0's on a reader's rows); every
// reader stops (serveMerges returns -1), no message is left untaken and no output is left.
TEST_F(MergeTest, ABadInputInAnyShareStopsEveryProcessWithOneProcesssMessage) {
  testing::SyntheticJob job;
  job.ranks = 7;
  job.steps = 6;
  struct Case {
    const char* what;
    std::size_t input;
    std::function<void(const std::string&)> spoil;
  };
  const std::vector<Case> cases = {
      {"not a trace", 5, [](const std::string& path) { test::writeFile(path, "not a trace\n"); }},
      {"no run", 3, [](const std::string& path) { RawDb(path).exec("DELETE FROM runs"); }},
      {"a communicator of a missing rank", 4,
       [](const std::string& path) { RawDb(path).exec("UPDATE comms SET rank_id = 99"); }},
      {"a table missing, found once its calls are read", 6,
       [](const std::string& path) { RawDb(path).exec("DROP TABLE applied_calls"); }},
  };
  for (const Case& bad : cases) {
    const TempDir dir;
    const auto inputs = writeJob(dir, job, "bad");
    bad.spoil(inputs[bad.input]);
    std::string expected;
    try {
      mergeTraces(inputs, dir.file("one.db"), MergeOptions{});
      ADD_FAILURE() << bad.what << ": one process merged it";
    } catch (const std::exception& error) {
      expected = error.what();
    }
    for (int processes : {2, 3, 4}) {
      SplitMerge split(processes);
      MergeOptions options;
      options.link = &split.link();
      const std::string output = dir.file(fmt::format("split-{}.db", processes));
      try {
        mergeTraces(inputs, output, options);
        ADD_FAILURE() << bad.what << ": merged across " << processes << " processes";
      } catch (const std::exception& error) {
        EXPECT_EQ(std::string(error.what()), expected) << bad.what << ", " << processes << " processes";
      }
      EXPECT_TRUE(split.link().readers_stopped) << bad.what;
      EXPECT_EQ(split.end(2), std::vector<int>(static_cast<std::size_t>(processes - 1), -1)) << bad.what;
      EXPECT_EQ(split.messagesLeft(), 0u) << bad.what << ", " << processes << " processes";
      EXPECT_FALSE(std::filesystem::exists(output)) << bad.what;
    }
  }
}

// The offsets from the latest end of each all-reduce per host are those the per-rank ends gave (ranks on
// one host share its clock): computed here the way the merge did before, one sample per rank and
// all-reduce, on three hosts with different clocks.
TEST_F(MergeTest, ClockOffsetsPerHostAreThoseOfThePerRankEstimate) {
  testing::SyntheticJob job;
  job.ranks = 6;  // node0: 0, 1; node1: 2, 3; node2: 4, 5
  job.steps = 12;
  const auto inputs = writeJob(dir_, job, "hosts");
  const std::map<std::string, std::int64_t> skew{{"node0", 0}, {"node1", 2'500'000}, {"node2", -900'000}};
  for (int rank = 0; rank < job.ranks; ++rank) {
    RawDb db(inputs[static_cast<std::size_t>(rank)]);
    db.exec(fmt::format("UPDATE runs SET epoch_ns = epoch_ns + {}",
                        skew.at(fmt::format("node{}", rank / job.ranks_per_host))));
  }
  // (seq) -> per rank: (host, absolute end) of the blocking all-reduces, from the inputs.
  std::map<std::int64_t, std::vector<std::pair<std::string, std::int64_t>>> ends;
  for (const std::string& path : inputs) {
    const TraceReader reader = TraceReader::open(path);
    const RunInfo run = reader.runs().at(0);
    const RankInfo rank = reader.ranks().at(0);
    reader.forEachCall([&](const CallRecord& call) {
      if (call.api == Api::MpiAllreduce && call.seq >= 0)
        ends[call.seq].emplace_back(rank.host, run.epoch_ns + call.end_ns);
      return true;
    });
  }
  std::map<std::string, std::vector<std::int64_t>> differences;
  for (const auto& [seq, by_rank] : ends) {
    std::int64_t reference = INT64_MIN;
    for (const auto& [host, end] : by_rank)
      if (host == "node0") reference = std::max(reference, end);
    for (const auto& [host, end] : by_rank)
      if (host != "node0") differences[host].push_back(reference - end);
  }
  const std::string output = dir_.file("merged.db");
  const MergeSummary summary = mergeTraces(inputs, output, {});
  EXPECT_EQ(summary.hosts_aligned, 2);
  for (const RankInfo& rank : TraceReader::open(output).ranks()) {
    std::int64_t expected = 0;
    if (rank.host != "node0") {
      auto& values = differences.at(rank.host);
      std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2),
                       values.end());
      expected = values[values.size() / 2];
    }
    EXPECT_EQ(rank.clock_offset_ns, expected) << rank.rank;
    EXPECT_EQ(rank.clock_offset_ns, -skew.at(rank.host)) << rank.rank;
  }
}

TEST_F(MergeTest, ExpandsDirectoriesToTheirTraceFilesInNameOrder) {
  const std::string jobdir = dir_.makeSubdir("job");
  for (const char* name : {"rank-2.db", "rank-0.db", "rank-10.db", "rank-1.db"})
    test::writeFile(jobdir + "/" + name, "x");
  test::writeFile(jobdir + "/.rank-3.db", "hidden");          // dotfiles (our temporary files) are skipped
  test::writeFile(jobdir + "/.merged.db.tmp-1234abcd", "t");  // a temporary output
  test::writeFile(jobdir + "/notes.txt", "not a trace");
  test::writeFile(jobdir + "/merged.db", "the output");
  dir_.makeSubdir("job/sub.db");  // a directory, even if named *.db

  const std::vector<std::string> expected = {jobdir + "/rank-0.db", jobdir + "/rank-1.db",
                                             jobdir + "/rank-10.db", jobdir + "/rank-2.db"};
  EXPECT_EQ(expandTraceInputs({jobdir}, jobdir + "/merged.db"), expected);
  // The output is recognised however it is spelled.
  EXPECT_EQ(expandTraceInputs({jobdir}, jobdir + "/../job/./merged.db"), expected);
  std::vector<std::string> with_output = expected;
  with_output.insert(with_output.begin(), jobdir + "/merged.db");
  EXPECT_EQ(expandTraceInputs({jobdir}, ""), with_output);
  // Files are passed through as given, in the given order, next to expanded directories.
  EXPECT_EQ(expandTraceInputs({"b.db", jobdir, "a.db"}, dir_.file("out.db")),
            (std::vector<std::string>{"b.db", with_output[0], expected[0], expected[1], expected[2],
                                      expected[3], "a.db"}));

  const std::string empty = dir_.makeSubdir("empty");
  test::writeFile(empty + "/readme.txt", "nothing here");
  EXPECT_GRADSCOPE_ERROR(expandTraceInputs({empty}, ""), empty, "no trace files");
  EXPECT_GRADSCOPE_ERROR(expandTraceInputs({}, ""), "no input traces");
}

TEST_F(MergeTest, CommandMergesADirectoryAndSkipsItsOwnOutput) {
  const std::string output = dir_.file("merged.db");
  auto result = test::runCli({"merge", dir_.path(), "-o", output});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(result.out,
            fmt::format("merged 3 files (1 run, 3 ranks, 210 calls, 0 measurements) into {}\n", output));
  EXPECT_EQ(TraceReader::open(output).callCount(), 210);
  // Again: the existing output is refused, then replaced with --force, without being merged into itself.
  result = test::runCli({"merge", dir_.path(), "-o", output});
  test::expectCliError(result, {output, "already exists", "--force"});
  result = test::runCli({"merge", dir_.path(), "-o", output, "--force"});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(TraceReader::open(output).callCount(), 210);
  EXPECT_EQ(test::listDirectory(dir_.path()),
            (std::vector<std::string>{"merged.db", "rank-0.db", "rank-1.db", "rank-2.db"}));
}

}  // namespace
}  // namespace gradscope::storage
