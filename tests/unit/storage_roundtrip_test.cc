// storage/: TraceWriter → file → TraceReader round trips of every table, the writer's file-level
// promises (mode 0600, never clobbering, no WAL left after finish, crash safety), the self-describing
// schema, and the migrations v1 → v3 and v2 → v3 (built from the frozen tests/data/schema_v1.sql and
// schema_v2.sql).

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/common/version.h"
#include "gradscope/storage/call_columns.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/schema.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using test::describe;
using test::describeAll;
using test::RawDb;
using test::TempDir;

constexpr std::int64_t kEpoch = 1'795'000'000'000'000'000;

// ---------------------------------------------------------------------------------------------------
// Every table, field by field

struct WrittenTrace {
  std::vector<RunInfo> runs;
  std::vector<RankInfo> ranks;
  std::vector<CommInfo> comms;
  std::vector<CallRecord> calls;
  std::vector<Measurement> measurements;
  std::vector<ConsensusRecord> consensus;
  std::vector<AppliedCall> applied;
  std::vector<RecommendationRecord> recommendations;
  std::vector<DropRecord> drops;
  std::int64_t before_ns = 0, after_ns = 0;  // around the default created_ns of a recommendation
};

CallRecord makeCall(std::int64_t rank_id, std::int64_t comm_id, std::int64_t seq, Api api, DType dtype,
                    ReduceOp op, std::int64_t count, std::int64_t start_ns, std::int64_t duration_ns) {
  CallRecord call;
  call.rank_id = rank_id;
  call.comm_id = comm_id;
  call.seq = seq;
  call.api = api;
  call.dtype = dtype;
  call.op = op;
  call.count = count;
  call.bytes = count * static_cast<std::int64_t>(std::max<std::size_t>(1, sizeOf(dtype)));
  call.enqueue_ns = start_ns - 7;
  call.start_ns = start_ns;
  call.end_ns = start_ns + duration_ns;
  return call;
}

// Writes one row or more into every table and returns what a reader must give back.
WrittenTrace writeEveryTable(const std::string& path) {
  WrittenTrace expected;
  TraceWriter writer = TraceWriter::create(path);

  RunInfo run_a;
  run_a.uuid = "run-a";
  run_a.command = R"(python train.py --lr 0.1 --name "it's, quoted")";
  run_a.mode = "observe";
  run_a.backend = Backend::Nccl;
  run_a.world_size = 4;
  run_a.host = "host-a";
  run_a.config_json = R"({"buffer":[1,2,3],"mode":"observe"})";
  run_a.tool_version = "9.9.9";
  run_a.epoch_ns = kEpoch;
  run_a.start_ns = 5;
  run_a.end_ns = std::nullopt;  // still running
  run_a.id = writer.addRun(run_a);
  EXPECT_EQ(run_a.id, 1);

  RunInfo run_b;
  run_b.uuid = "run-b";
  run_b.command = "";
  run_b.mode = "bench";
  run_b.backend = Backend::Local;
  run_b.world_size = 2;
  run_b.host = "host-b";
  run_b.config_json = "";   // stored as "{}"
  run_b.tool_version = "";  // stored as this build's version
  run_b.epoch_ns = kEpoch + 77;
  run_b.start_ns = -3;
  run_b.end_ns = 123'456'789;
  run_b.id = writer.addRun(run_b);
  EXPECT_EQ(run_b.id, 2);
  run_b.config_json = "{}";
  run_b.tool_version = kVersion;
  expected.runs = {run_a, run_b};

  // Rank ids: `rank` when free, explicit when given, else the next free id.
  RankInfo r0{0, run_a.id, 0, "host-a", 100, "cuda:0 NVIDIA H100 80GB HBM3", 0};
  RankInfo r1{0, run_a.id, 1, "host-a", 101, "cuda:1 NVIDIA H100 80GB HBM3", -250};
  RankInfo r7{7, run_b.id, 0, "host-b", 200, "cpu", 0};
  RankInfo r8{0, run_b.id, 1, "host-b", 201, "cpu", 0};
  r0.id = writer.addRank(r0);
  r1.id = writer.addRank(r1);
  r7.id = writer.addRank(r7);
  r8.id = writer.addRank(r8);
  EXPECT_EQ(r0.id, 0);
  EXPECT_EQ(r1.id, 1);
  EXPECT_EQ(r7.id, 7);
  EXPECT_EQ(r8.id, 8);  // id 1 (its rank) is taken: max + 1
  writer.setClockOffset(r1.id, 4'242);
  r1.clock_offset_ns = 4'242;
  expected.ranks = {r0, r1, r7, r8};

  CommInfo world{0, r0.id, "world", Backend::Nccl, 4, 0};
  CommInfo odd{0, r1.id, "key,with \"quote\"", Backend::Mpi, 2, 1};
  world.id = writer.addComm(world);
  odd.id = writer.addComm(odd);
  EXPECT_EQ(world.id, 1);
  EXPECT_EQ(odd.id, 2);
  expected.comms = {world, odd};

  std::vector<CallRecord> calls;
  CallRecord gpu = makeCall(r0.id, world.id, 0, Api::NcclAllReduce, DType::Bf16, ReduceOp::Sum, 1000, 20, 30);
  gpu.step = 3;
  gpu.stream = 2;
  gpu.nccl_algo = 1;
  gpu.nccl_proto = 2;
  gpu.nccl_channels = 8;
  calls.push_back(gpu);
  CallRecord no_step =
      makeCall(r0.id, world.id, 1, Api::NcclAllGather, DType::Fp16, ReduceOp::None, 3, 70, 20);
  no_step.step = -1;  // stored as NULL
  calls.push_back(no_step);
  CallRecord host = makeCall(r1.id, odd.id, 0, Api::MpiAllreduce, DType::Other, ReduceOp::Other, 1, 100, 1);
  host.bytes = 12'345;  // derived type: size known per call only
  host.step = 0;
  calls.push_back(host);
  CallRecord stream_only =
      makeCall(r1.id, odd.id, 1, Api::NcclBroadcast, DType::Uint8, ReduceOp::None, 9, -40, 0);
  stream_only.step = 1;
  stream_only.stream = 5;  // stream known, NCCL facts not (yet)
  calls.push_back(stream_only);
  const std::int64_t first_id = writer.appendCalls(calls);
  EXPECT_EQ(first_id, 1);
  for (std::size_t i = 0; i < calls.size(); ++i) calls[i].id = first_id + static_cast<std::int64_t>(i);

  // Explicit ids may jump ahead; id 0 continues after the last one.
  std::vector<CallRecord> more = {
      makeCall(r7.id, world.id, 0, Api::MpiReduceScatterBlock, DType::Int64, ReduceOp::Max, 1 << 20,
               1'000'000, 5'000'000),
      makeCall(r8.id, world.id, 0, Api::MpiBcast, DType::Fp64, ReduceOp::None, 2, 2'000'000, 1)};
  more[0].id = 100;
  more[0].step = 12;
  more[1].step = 12;
  EXPECT_EQ(writer.appendCalls(more), 100);
  more[1].id = 101;
  calls.insert(calls.end(), more.begin(), more.end());
  EXPECT_EQ(writer.appendCalls(std::vector<CallRecord>{}), 0);

  // NCCL facts reported later by the profiler plugin: for a call without a GPU row, and for one with.
  writer.setNcclInfo(calls[2].id, 0, 1, 4);
  calls[2].nccl_algo = 0;
  calls[2].nccl_proto = 1;
  calls[2].nccl_channels = 4;
  writer.setNcclInfo(calls[0].id, 6, 0, 32);  // replaces algo/proto/channels, keeps the stream
  calls[0].nccl_algo = 6;
  calls[0].nccl_proto = 0;
  calls[0].nccl_channels = 32;
  expected.calls = calls;
  EXPECT_EQ(writer.callCount(), 6);

  Measurement full;
  full.run_id = run_a.id;
  full.rank_id = r0.id;
  full.call_id = calls[0].id;
  full.strategy = "sum/rs_ag/bf16";
  full.api = Api::NcclAllReduce;
  full.dtype = DType::Bf16;
  full.bytes = 2000;
  full.world = 4;
  full.reps = 20;
  full.min_ns = 1000.5;
  full.median_ns = 1100.25;
  full.p90_ns = 1200;
  full.max_ns = 1500;
  full.algbw_gbs = 1.8125;
  full.busbw_gbs = 2.71875;
  full.rel_l2_error = 1.5e-3;
  full.max_abs_error = 0.5;
  full.cosine = 0.999;
  full.overflow_count = 2;
  Measurement bare;
  bare.run_id = run_b.id;
  bare.strategy = "baseline";
  bare.api = Api::MpiAllreduce;
  bare.dtype = DType::Fp32;
  bare.bytes = 1 << 20;
  bare.world = 2;
  bare.reps = 50;
  bare.min_ns = 1;
  bare.median_ns = 2;
  bare.p90_ns = 3;
  bare.max_ns = 4;
  bare.algbw_gbs = 5;
  bare.busbw_gbs = 6;
  full.id = writer.addMeasurement(full);
  bare.id = writer.addMeasurement(bare);
  EXPECT_EQ(full.id, 1);
  EXPECT_EQ(bare.id, 2);
  expected.measurements = {bare, full};  // ordered by strategy

  // Explore mode's rows name their call; the step may be unknown (-1) until a merge.
  std::vector<ConsensusRecord> consensus = {{0, r1.id, 4, 0.5, 0.75, 12.5, 1.25, 3},
                                            {0, r0.id, 4, 0.25, 0.875, 3.0, 1.25, 1},
                                            {0, r0.id, 3, 1.0, 1.0, 2.0, 1.0, std::nullopt},
                                            {0, r1.id, -1, 0.75, 0.5, 1.5, 0.5, 101}};
  writer.appendConsensus(consensus);
  writer.appendConsensus(std::vector<ConsensusRecord>{});
  for (std::size_t i = 0; i < consensus.size(); ++i) consensus[i].id = static_cast<std::int64_t>(i) + 1;
  expected.consensus = {consensus[3], consensus[2], consensus[1], consensus[0]};  // by step, then rank

  expected.applied = {{1, "sum/rs_ag/bf16"}, {4, "sum/native"}};
  writer.appendApplied(std::vector<AppliedCall>{expected.applied[1], expected.applied[0]});
  writer.appendApplied(std::vector<AppliedCall>{});

  RecommendationRecord rec_a{0, run_a.id, 1'234, R"({"version":1,"rules":[]})"};
  rec_a.id = writer.addRecommendation(rec_a);
  expected.before_ns = unixTimeNs();
  RecommendationRecord rec_free{0, 0, 0, "{}"};  // no run (stored NULL), created now
  rec_free.id = writer.addRecommendation(rec_free);
  expected.after_ns = unixTimeNs();
  expected.recommendations = {rec_a, rec_free};

  writer.addDrops(r0.id, "call", 5);
  writer.addDrops(r0.id, "call", 7);  // accumulates
  writer.addDrops(r1.id, "cupti_record", 3);
  writer.addDrops(r1.id, "call", 0);  // nothing dropped: no row
  expected.drops = {{r0.id, "call", 12}, {r1.id, "cupti_record", 3}};

  writer.finish();  // no end time: run_a stays open
  return expected;
}

TEST(StorageRoundTrip, EveryTableReadsBackFieldByField) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  const WrittenTrace expected = writeEveryTable(path);

  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.path(), path);
  EXPECT_EQ(reader.schemaVersion(), kSchemaVersion);
  EXPECT_EQ(describeAll(reader.runs()), describeAll(expected.runs));
  EXPECT_EQ(describeAll(reader.ranks()), describeAll(expected.ranks));
  EXPECT_EQ(describeAll(reader.comms()), describeAll(expected.comms));
  EXPECT_EQ(reader.callCount(), 6);
  std::vector<CallRecord> calls;
  reader.forEachCall([&](const CallRecord& call) {
    calls.push_back(call);
    return true;
  });
  EXPECT_EQ(describeAll(calls), describeAll(expected.calls));
  EXPECT_EQ(describeAll(reader.measurements()), describeAll(expected.measurements));
  EXPECT_EQ(describeAll(reader.measurements("sum/rs_ag/bf16")),
            describeAll(std::vector{expected.measurements[1]}));
  EXPECT_TRUE(reader.measurements("no such strategy").empty());
  const auto consensus = reader.consensus();
  EXPECT_EQ(describeAll(consensus), describeAll(expected.consensus));
  ASSERT_EQ(consensus.size(), expected.consensus.size());
  for (std::size_t i = 0; i < consensus.size(); ++i)
    EXPECT_EQ(consensus[i].call_id, expected.consensus[i].call_id) << describe(consensus[i]);
  const auto applied = reader.appliedCalls();
  ASSERT_EQ(applied.size(), expected.applied.size());
  for (std::size_t i = 0; i < applied.size(); ++i) {
    EXPECT_EQ(applied[i].call_id, expected.applied[i].call_id);
    EXPECT_EQ(applied[i].strategy, expected.applied[i].strategy);
  }
  const auto recommendations = reader.recommendations();
  ASSERT_EQ(recommendations.size(), 2u);
  EXPECT_EQ(describe(recommendations[0]), describe(expected.recommendations[0]));
  EXPECT_EQ(recommendations[1].id, expected.recommendations[1].id);
  EXPECT_EQ(recommendations[1].run_id, 0);
  EXPECT_EQ(recommendations[1].json, "{}");
  EXPECT_GE(recommendations[1].created_ns, expected.before_ns);
  EXPECT_LE(recommendations[1].created_ns, expected.after_ns);
  EXPECT_EQ(describeAll(reader.drops()), describeAll(expected.drops));

  // forEachCall stops when asked to.
  int visited = 0;
  reader.forEachCall([&](const CallRecord&) { return ++visited < 2; });
  EXPECT_EQ(visited, 2);
}

TEST(StorageRoundTrip, UnknownValuesAreStoredAsNull) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  writeEveryTable(path);
  RawDb db(path, SQLITE_OPEN_READONLY);
  // step -1 and op None are NULL; GPU facts live in gpu_calls, only for calls that have any.
  EXPECT_EQ(db.rows("SELECT id, step, op FROM calls WHERE step IS NULL OR op IS NULL ORDER BY id"),
            (std::vector<std::vector<std::string>>{
                {"2", "NULL", "NULL"}, {"4", "1", "NULL"}, {"101", "12", "NULL"}}));
  EXPECT_EQ(db.rows("SELECT call_id, stream, algo, proto, channels FROM gpu_calls ORDER BY call_id"),
            (std::vector<std::vector<std::string>>{
                {"1", "2", "6", "0", "32"}, {"3", "0", "0", "1", "4"}, {"4", "5", "NULL", "NULL", "NULL"}}));
  EXPECT_EQ(db.rows("SELECT end_ns FROM runs ORDER BY id"),
            (std::vector<std::vector<std::string>>{{"NULL"}, {"123456789"}}));
  EXPECT_EQ(
      db.rows("SELECT rank_id, call_id, rel_l2_error, max_abs_error, cosine FROM measurements WHERE id = 2"),
      (std::vector<std::vector<std::string>>{{"NULL", "NULL", "NULL", "NULL", "NULL"}}));
  EXPECT_EQ(db.text("SELECT run_id FROM recommendations WHERE id = 2"), "NULL");
  EXPECT_EQ(db.rows("SELECT id, step, call_id FROM consensus ORDER BY id"),
            (std::vector<std::vector<std::string>>{
                {"1", "4", "3"}, {"2", "4", "1"}, {"3", "3", "NULL"}, {"4", "-1", "101"}}));
  // The call_view names what apply mode ran instead of a call, NULL for calls that ran as issued.
  EXPECT_EQ(db.rows("SELECT id, strategy FROM call_view WHERE id <= 4 ORDER BY id"),
            (std::vector<std::vector<std::string>>{
                {"1", "sum/rs_ag/bf16"}, {"2", "NULL"}, {"3", "NULL"}, {"4", "sum/native"}}));
  // The call_view resolves codes through the names table.
  EXPECT_EQ(db.rows("SELECT rank, comm, api, dtype, op, dur_ns, stream, algo, proto, channels FROM call_view "
                    "WHERE id IN (1, 2) ORDER BY id"),
            (std::vector<std::vector<std::string>>{
                {"0", "world", "ncclAllReduce", "bf16", "sum", "30", "2", "PAT", "LL", "32"},
                {"0", "world", "ncclAllGather", "fp16", "NULL", "20", "NULL", "NULL", "NULL", "NULL"}}));
}

TEST(StorageRoundTrip, FinishWithEndTimeClosesOnlyOpenRuns) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo open_run;
    open_run.uuid = "open";
    RunInfo ended = open_run;
    ended.uuid = "ended";
    ended.end_ns = 50;
    writer.addRun(open_run);
    const std::int64_t ended_id = writer.addRun(ended);
    RunInfo later = open_run;
    later.uuid = "set-later";
    const std::int64_t later_id = writer.addRun(later);
    writer.setRunEnd(later_id, 70);
    EXPECT_EQ(ended_id, 2);
    writer.finish(999);
  }
  const auto runs = TraceReader::open(path).runs();
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].end_ns, 999);
  EXPECT_EQ(runs[1].end_ns, 50);
  EXPECT_EQ(runs[2].end_ns, 70);
}

// The agent's finish when its process dies of a signal next: the end and every row committed, the WAL
// folded in at close (no -wal left), the file read like a tidied one.
TEST(StorageRoundTrip, FinishQuicklyKeepsEverythingAndLeavesOneFile) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  const auto calls = testing::manyCalls(20'000, 0, 1, 3);
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "quick";
    const std::int64_t run_id = writer.addRun(run);
    writer.addRank({0, run_id, 0, "host", 1, "cpu", 0});
    writer.addComm({0, 0, "world", Backend::Mpi, 1, 0});
    writer.appendCalls(calls);
    writer.finishQuickly(4242);
    writer.finishQuickly(1);  // a second finish is a no-op, as finish() is
  }
  EXPECT_FALSE(test::exists(path + "-wal"));
  EXPECT_FALSE(test::exists(path + "-journal"));
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.runs().at(0).end_ns, 4242);
  EXPECT_EQ(reader.callCount(), static_cast<std::int64_t>(calls.size()));
  EXPECT_EQ(test::fileMode(path), 0600u);
}

// A failed write rolls back the open transaction and stops the writer (its ids and tiles no longer match
// the file); closeAfterFailure() still records what that cost (drops, the run's configuration, its end)
// without touching a call, so the trace never claims nothing was lost.
TEST(StorageRoundTrip, AfterAFailedWriteTheLossIsStillRecorded) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  auto calls = testing::manyCalls(16, 0, 1, 3);
  for (std::size_t i = 0; i < calls.size(); ++i) calls[i].seq = static_cast<std::int64_t>(i);
  calls.back().seq = 1000;  // the one a trigger refuses, as a full or broken store would
  std::int64_t run_id = 0;
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "failed";
    run_id = writer.addRun(run);
    const std::int64_t rank_id = writer.addRank({0, run_id, 0, "host", 1, "cpu", 0});
    writer.addComm({0, rank_id, "world", Backend::Mpi, 1, 0});
    writer.appendCalls(std::span(calls).first(10));
    writer.commit();
    test::RawDb(path).exec(
        "CREATE TRIGGER refuse BEFORE INSERT ON calls WHEN NEW.seq >= 1000 BEGIN SELECT RAISE(ABORT, "
        "'refused'); "
        "END");
    writer.appendCalls(std::span(calls).subspan(10, 5));  // not committed
    EXPECT_EQ(writer.callsRolledBack(), 0);
    EXPECT_THROW(writer.appendCalls(std::span(calls).last(1)), Error);
    EXPECT_EQ(writer.callsRolledBack(), 5);
    EXPECT_GRADSCOPE_ERROR(writer.addDrops(rank_id, "call", 1), "earlier error");
    writer.closeAfterFailure(run_id, rank_id, {{"recording_stopped", 6}, {"call_rate", 2}},
                             R"({"agent":{"recording_stopped":"refused"}})", 777);
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.callCount(), 10);
  const auto runs = reader.runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].end_ns, 777);
  EXPECT_NE(runs[0].config_json.find("refused"), std::string::npos) << runs[0].config_json;
  std::map<std::string, std::int64_t> drops;
  for (const auto& drop : reader.drops()) drops[drop.kind] += drop.count;
  EXPECT_EQ(drops, (std::map<std::string, std::int64_t>{{"call_rate", 2}, {"recording_stopped", 6}}));
}

// ---------------------------------------------------------------------------------------------------
// File-level promises of the writer

TEST(StorageWriter, CreatesFilesWithModeExactly0600WhateverTheUmask) {
  TempDir dir;
  for (const mode_t mask : {mode_t{0}, mode_t{022}, mode_t{077}}) {
    SCOPED_TRACE(mask);
    const mode_t previous = ::umask(mask);
    const std::string path = dir.file(fmt::format("trace-{:o}.db", mask));
    {
      TraceWriter writer = TraceWriter::create(path);
      EXPECT_EQ(test::fileMode(path), 0600u);
      writer.finish();
    }
    ::umask(previous);
    EXPECT_EQ(test::fileMode(path), 0600u);
  }
}

TEST(StorageWriter, RefusesToOverwriteAnExistingFile) {
  TempDir dir;
  const std::string path = dir.file("precious.db");
  test::writeFile(path, "keep me");
  EXPECT_GRADSCOPE_ERROR(TraceWriter::create(path), path, "already exists");
  EXPECT_EQ(test::readFile(path), "keep me");
  EXPECT_FALSE(test::exists(path + "-wal"));
  EXPECT_FALSE(test::exists(path + "-shm"));
}

TEST(StorageWriter, RefusesAMissingDirectory) {
  TempDir dir;
  const std::string path = dir.file("missing/trace.db");
  EXPECT_GRADSCOPE_ERROR(TraceWriter::create(path), path, "does not exist");
  EXPECT_FALSE(test::exists(dir.file("missing")));
}

TEST(StorageWriter, RefusesADirectoryItCannotWrite) {
  TempDir dir;
  const std::string locked = dir.makeSubdir("locked");
  ::chmod(dir.path().c_str(), 0755);
  ::chmod(locked.c_str(), 0555);
  const auto child = test::runUnprivileged(
      [&] { return test::childErrorMessage([&] { TraceWriter::create(locked + "/trace.db"); }); });
  if (child.skipped) GTEST_SKIP() << child.text;
  EXPECT_NE(child.text.find("Error: " + locked + "/trace.db: cannot create: directory"), std::string::npos)
      << child.text;
  EXPECT_NE(child.text.find("not writable"), std::string::npos) << child.text;
  EXPECT_TRUE(test::listDirectory(locked).empty());
}

TEST(StorageWriter, WritesInWalModeAndFinishLeavesOneSelfContainedFile) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  TraceWriter writer = TraceWriter::create(path);
  RunInfo run;
  run.uuid = "wal";
  writer.addRun(run);
  writer.appendCalls(
      std::vector<CallRecord>(10, makeCall(0, 0, 0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 1, 0, 5)));
  writer.commit();
  EXPECT_TRUE(test::exists(path + "-wal"));
  {
    RawDb db(path, SQLITE_OPEN_READONLY);
    EXPECT_EQ(db.text("PRAGMA journal_mode"), "wal");
  }
  writer.finish();
  writer.finish();  // idempotent
  EXPECT_FALSE(test::exists(path + "-wal"));
  EXPECT_FALSE(test::exists(path + "-shm"));
  EXPECT_FALSE(test::exists(path + "-journal"));
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.text("PRAGMA journal_mode"), "delete");
  EXPECT_EQ(db.integer("SELECT count(*) FROM calls"), 10);
  EXPECT_EQ(db.integer("PRAGMA application_id"), kApplicationId);
  EXPECT_EQ(db.integer("PRAGMA user_version"), kSchemaVersion);
}

TEST(StorageWriter, DestroyedWithoutFinishCommitsWhatItHasAndLeavesTheRunOpen) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "unfinished";
    writer.addRun(run);
    writer.addRank({0, 1, 0, "h", 1, "cpu", 0});
    std::vector<CallRecord> calls(
        40, makeCall(0, 0, 0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 4, 100, 10));
    writer.appendCalls(calls);
    writer.commit();
    writer.appendCalls(std::span(calls).first(5));  // not committed explicitly
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.callCount(), 45);
  ASSERT_EQ(reader.runs().size(), 1u);
  EXPECT_FALSE(reader.runs()[0].end_ns.has_value());
  EXPECT_EQ(reader.callsInWindow(0, 0, 1'000).size(), 45u);
}

TEST(StorageWriter, ProcessCrashKeepsEveryCommittedCall) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    try {
      // Leaked on purpose: _exit below stands for a crash, no destructor runs.
      auto* writer = new TraceWriter(TraceWriter::create(path, TraceWriter::Options{/*commit_rows=*/100}));
      RunInfo run;
      run.uuid = "crashed";
      writer->addRun(run);
      writer->addRank({0, 1, 0, "h", 1, "cpu", 0});
      std::vector<CallRecord> calls;
      for (int i = 0; i < 250; ++i)
        calls.push_back(makeCall(0, 0, i, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 4, 1'000 * i, 500));
      writer->appendCalls(
          std::span(calls).first(230));  // over commit_rows: committed at the end of the batch
      writer->commit();                  // 230
      writer->appendCalls(std::span(calls).subspan(230));  // 20 more, never committed
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.callCount(), 230);
  EXPECT_FALSE(reader.runs().at(0).end_ns.has_value());
  const auto window = reader.callsInWindow(0, 0, 1'000'000);
  ASSERT_EQ(window.size(), 230u);
  EXPECT_EQ(window.back().seq, 229);
}

TEST(StorageWriter, AutoCommitMakesRowsVisibleToReaders) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  TraceWriter writer = TraceWriter::create(path, TraceWriter::Options{/*commit_rows=*/64});
  RunInfo run;
  run.uuid = "auto";
  writer.addRun(run);
  writer.commit();
  const TraceReader reader = TraceReader::open(path);
  std::vector<CallRecord> calls(50,
                                makeCall(0, 0, 0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 4, 0, 1));
  writer.appendCalls(calls);
  EXPECT_EQ(reader.callCount(), 0);  // 50 < 64: still in the open transaction
  writer.appendCalls(calls);
  EXPECT_EQ(reader.callCount(), 100);  // 100 >= 64: committed
  writer.appendCalls(std::span(calls).first(10));
  EXPECT_EQ(reader.callCount(), 100);
  writer.commit();
  EXPECT_EQ(reader.callCount(), 110);
  writer.finish();
  EXPECT_EQ(reader.callCount(), 110);
}

TEST(StorageWriter, RefusesExplicitCallIdsThatGoBackwards) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  TraceWriter writer = TraceWriter::create(path);
  CallRecord call = makeCall(0, 0, 0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 1, 0, 1);
  call.id = 10;
  writer.appendCalls(std::span(&call, 1));
  call.id = 5;
  EXPECT_GRADSCOPE_ERROR(writer.appendCalls(std::span(&call, 1)), path, "call id 5", "last id written (10)",
                         "ids must increase");
  call.id = 10;
  EXPECT_GRADSCOPE_ERROR(writer.appendCalls(std::span(&call, 1)), "call id 10");  // equal is not above
  // Within one batch, and the whole batch is refused before anything is written.
  std::vector<CallRecord> batch(3, call);
  batch[0].id = 20;
  batch[1].id = 0;  // 21
  batch[2].id = 21;
  EXPECT_GRADSCOPE_ERROR(writer.appendCalls(batch), "call id 21", "last id written (21)");
  EXPECT_EQ(writer.callCount(), 1);
  // The writer is still usable; id 0 continues after the last id written.
  call.id = 0;
  EXPECT_EQ(writer.appendCalls(std::span(&call, 1)), 11);
  writer.finish();
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.rows("SELECT id FROM calls ORDER BY id"),
            (std::vector<std::vector<std::string>>{{"10"}, {"11"}}));
}

TEST(StorageWriter, ACallIsRecordedAsAppliedOnce) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  TraceWriter writer = TraceWriter::create(path);
  writer.appendApplied(std::vector<AppliedCall>{{5, "sum/rs_ag"}});
  EXPECT_GRADSCOPE_ERROR(writer.appendApplied(std::vector<AppliedCall>{{5, "sum/native"}}), path,
                         "applied_calls");
  writer.finish();
  ASSERT_EQ(TraceReader::open(path).appliedCalls().size(), 1u);
  EXPECT_EQ(TraceReader::open(path).appliedCalls()[0].strategy, "sum/rs_ag");
}

// A graph replay is a call row with its number in gpu_calls.replay; the summary groups them by API.
TEST(StorageRoundTrip, GraphReplaysReadBackAndSumUpPerApi) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "graph-run";
    RankInfo rank;
    rank.run_id = writer.addRun(run);
    rank.id = writer.addRank(rank);
    const std::int64_t comm = writer.addComm({0, rank.id, "world", Backend::Nccl, 1, 0});
    std::vector<CallRecord> calls = {
        makeCall(rank.id, comm, 0, Api::NcclAllReduce, DType::Fp32, ReduceOp::Sum, 128, 10, 1),
        makeCall(rank.id, comm, 1, Api::NcclAllGather, DType::Fp32, ReduceOp::None, 64, 20, 1)};
    for (const auto& [base, replay, start, duration] :
         {std::tuple{0, 1, 100, 50}, {1, 1, 160, 5}, {0, 2, 300, 60}}) {
      CallRecord call = calls[static_cast<std::size_t>(base)];
      call.graph_replay = replay;
      call.enqueue_ns = call.start_ns = start;
      call.end_ns = start + duration;
      calls.push_back(call);
    }
    calls[0].stream = 3;  // a capture with its stream; replays without one still get a gpu_calls row
    writer.appendCalls(calls);
    writer.finish();
  }
  const TraceReader reader = TraceReader::open(path);
  std::vector<std::vector<std::int64_t>> rows;
  reader.forEachCall([&](const CallRecord& call) {
    rows.push_back({call.seq, call.graph_replay, call.start_ns, call.end_ns, call.stream});
    return true;
  });
  EXPECT_EQ(rows, (std::vector<std::vector<std::int64_t>>{{0, 0, 10, 11, 3},
                                                          {1, 0, 20, 21, 0},
                                                          {0, 1, 100, 150, 0},
                                                          {1, 1, 160, 165, 0},
                                                          {0, 2, 300, 360, 0}}));
  const auto summary = reader.replaySummary();
  ASSERT_EQ(summary.size(), 2u);
  EXPECT_EQ(summary[0].api, Api::NcclAllReduce);
  EXPECT_EQ(summary[0].captured_calls, 1);
  EXPECT_EQ(summary[0].replays, 2);
  EXPECT_EQ(summary[0].total_ns, 110);
  EXPECT_EQ(summary[1].api, Api::NcclAllGather);
  EXPECT_EQ(summary[1].replays, 1);
  EXPECT_EQ(summary[1].total_ns, 5);
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.rows("SELECT id, replay FROM call_view WHERE replay IS NOT NULL ORDER BY id"),
            (std::vector<std::vector<std::string>>{{"3", "1"}, {"4", "1"}, {"5", "2"}}));
  EXPECT_NE(db.text("SELECT sql FROM sqlite_master WHERE name = 'gpu_calls'")
                .find("-- k >= 1: the k-th GPU execution"),
            std::string::npos);
}

// A query of its own (the viewer's calls table) reads whole calls with the store's select list and decoder,
// the unknown values (no step, no op, no GPU facts) included.
TEST(StorageCallColumns, AQueryOfItsOwnReadsTheCallsTheReaderReads) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    CallRecord host = makeCall(0, 1, 0, Api::MpiAllgather, DType::Int32, ReduceOp::None, 8, 10, 5);
    CallRecord gpu = makeCall(0, 1, 1, Api::NcclAllReduce, DType::Bf16, ReduceOp::Max, 64, 20, 5);
    gpu.step = 3;
    gpu.stream = 2;
    gpu.nccl_algo = 1;
    gpu.nccl_proto = 0;
    gpu.nccl_channels = 4;
    CallRecord replay = gpu;
    replay.start_ns = 40;
    replay.end_ns = 45;
    replay.graph_replay = 2;
    writer.appendCalls(std::vector<CallRecord>{host, gpu, replay});
    writer.finish();
  }
  std::vector<CallRecord> expected;
  TraceReader::open(path).forEachCall([&](const CallRecord& call) {
    expected.push_back(call);
    return true;
  });
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(expected[0].step, -1);
  EXPECT_EQ(expected[0].op, ReduceOp::None);
  EXPECT_EQ(expected[0].nccl_algo, -1);

  RawDb db(path, SQLITE_OPEN_READONLY);
  sqlite3_stmt* query = nullptr;
  const std::string sql =
      fmt::format("SELECT 'before', {}, 'after' FROM {} ORDER BY c.id", callColumns(), kCallsFrom);
  ASSERT_EQ(sqlite3_prepare_v2(db.handle(), sql.c_str(), -1, &query, nullptr), SQLITE_OK) << sql;
  std::vector<CallRecord> calls;
  while (sqlite3_step(query) == SQLITE_ROW) {
    calls.push_back(readCall(query, 1));
    EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(query, 1 + callColumnCount())), "after");
  }
  sqlite3_finalize(query);
  ASSERT_EQ(calls.size(), expected.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(describe(calls[i]), describe(expected[i]));
    EXPECT_EQ(calls[i].graph_replay, expected[i].graph_replay);
  }

  EXPECT_EQ(callColumn("step"), "coalesce(c.step, -1)");
  EXPECT_EQ(callColumn("op"), "coalesce(c.op, 255)");
  EXPECT_EQ(callColumn("bytes"), "c.bytes");
  EXPECT_EQ(callColumn("replay"), "coalesce(g.replay, 0)");
  EXPECT_GRADSCOPE_ERROR(callColumn("nothing"), "nothing");
}

TEST(StorageWriter, UseAfterFinishIsAnErrorNotACrash) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  TraceWriter writer = TraceWriter::create(path);
  writer.finish(5);
  CallRecord call;
  EXPECT_GRADSCOPE_ERROR(writer.appendCalls(std::span(&call, 1)), path);
  EXPECT_GRADSCOPE_ERROR(writer.finish(6), path);
  writer.finish();  // finish() itself is idempotent
}

// ---------------------------------------------------------------------------------------------------
// The schema documents itself

TEST(StorageSchema, TheFileCarriesTheCommentedSchema) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  TraceWriter::create(path).finish();
  RawDb db(path, SQLITE_OPEN_READONLY);
  const std::string calls = db.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'calls'");
  EXPECT_NE(calls.find("-- per-communicator sequence number"), std::string::npos) << calls;
  EXPECT_NE(calls.find("-- training step; NULL when unknown"), std::string::npos) << calls;
  const std::string runs = db.text("SELECT sql FROM sqlite_master WHERE name = 'runs'");
  EXPECT_NE(runs.find("-- time origin of every *_ns column"), std::string::npos) << runs;
  const std::string tiles = db.text("SELECT sql FROM sqlite_master WHERE name = 'call_tiles'");
  EXPECT_NE(tiles.find("-- tile width is 2^level ns"), std::string::npos) << tiles;
  const std::string consensus = db.text("SELECT sql FROM sqlite_master WHERE name = 'consensus'");
  EXPECT_NE(consensus.find("-- explored call whose buffer"), std::string::npos) << consensus;
  const std::string applied = db.text("SELECT sql FROM sqlite_master WHERE name = 'applied_calls'");
  EXPECT_NE(applied.find("-- strategy that ran instead"), std::string::npos) << applied;

  std::set<std::string> tables;
  // sqlite_stat1 (PRAGMA optimize) belongs to SQLite.
  for (const auto& row :
       db.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"))
    tables.insert(row[0]);
  std::set<std::string> expected;
  for (std::string_view name : tableNames()) expected.insert(std::string(name));
  EXPECT_EQ(tables, expected);
  EXPECT_EQ(db.text("SELECT type FROM sqlite_master WHERE name = 'call_view'"), "view");
  EXPECT_EQ(db.integer("SELECT count(*) FROM pragma_table_info('call_view') WHERE name = 'strategy'"), 1);
  EXPECT_EQ(db.integer("PRAGMA application_id"), 0x47534350);
  EXPECT_EQ(db.integer("SELECT count(*) FROM names"), 77);
  EXPECT_EQ(db.text("SELECT name FROM names WHERE domain = 'nccl_proto' AND code = 2"), "Simple");
}

// The DDL is generated from the table declarations (storage/src/tables.h), and files store it byte for
// byte: it must be the text of its schema version, column alignment and comments included, since a
// migrated file is compared with a new one text for text (StorageMigration.*) and old files keep what their
// version wrote. A change of the text is a new schema version, whose golden file joins the frozen ones.
TEST(StorageSchema, TheGeneratedDdlIsTheTextOfItsSchemaVersion) {
  const std::string header = fmt::format(
      "-- gradscope trace schema v{}: the DDL every new file is created with, as storage::schemaSql() "
      "generates it\n"
      "-- from the table declarations (storage/src/tables.h); a test compares the two byte for byte. Once a "
      "later\n"
      "-- version exists, this is the frozen v{} layout, like schema_v1.sql and schema_v2.sql.\n",
      kSchemaVersion, kSchemaVersion);
  EXPECT_TRUE(test::matchesGolden(fmt::format("schema_v{}.sql", kSchemaVersion), header + schemaSql()));

  TempDir dir;
  const std::string path = dir.file("trace.db");
  TraceWriter::create(path).finish();
  RawDb db(path, SQLITE_OPEN_READONLY);
  const std::string sql = schemaSql();
  for (const auto& row : db.rows("SELECT name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite%'"))
    EXPECT_NE(sql.find(row[1] + ";\n"), std::string::npos) << row[0] << " is stored as\n" << row[1];
}

// ---------------------------------------------------------------------------------------------------
// Migration from schema v1

// Every schema object of a file (type, name, table, DDL text): a migrated file must store the same
// definitions as a new one, comments and references to other tables included.
std::vector<std::vector<std::string>> schemaObjects(const std::string& path) {
  RawDb db(path, SQLITE_OPEN_READONLY);
  return db.rows(
      "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite%' "
      "ORDER BY type, name");
}

std::vector<std::vector<std::string>> newFileSchemaObjects(const TempDir& dir) {
  const std::string path = dir.file("new.db");
  if (!test::exists(path)) TraceWriter::create(path).finish();
  return schemaObjects(path);
}

// A v1 trace built from the frozen DDL, with calls of both ranks, some carrying GPU columns.
std::vector<CallRecord> makeV1Trace(const std::string& path, int count = 2'000) {
  RawDb db(path);
  db.exec(test::readFile(test::goldenPath("schema_v1.sql")));
  db.exec(R"sql(
    INSERT INTO runs VALUES (1, 'v1-run', 'old job', 'observe', 2, 2, 'h0', '{}', '0.0.1', 1795000000000000000, 0,
                             900000000);
    INSERT INTO ranks VALUES (0, 1, 0, 'h0', 10, 'cuda:0 X', 0), (1, 1, 1, 'h0', 11, 'cuda:1 X', 35);
    INSERT INTO comms VALUES (1, 0, 'world', 2, 2, 0), (2, 1, 'world', 2, 2, 1);
    INSERT INTO measurements (run_id, rank_id, call_id, strategy, api, dtype, bytes, world, reps, min_ns, median_ns,
                              p90_ns, max_ns, algbw_gbs, busbw_gbs)
      VALUES (1, 0, 7, 'baseline', 16, 7, 4096, 2, 10, 1, 2, 3, 4, 5, 6);
    INSERT INTO consensus (rank_id, step, alpha, cosine_to_mean, grad_norm, diversity) VALUES (1, 0, 0.5, 1, 2, 3);
    INSERT INTO recommendations (run_id, created_ns, json) VALUES (1, 42, '{}');
    INSERT INTO drops VALUES (1, 'call', 17);
  )sql");
  std::vector<CallRecord> calls;
  std::mt19937_64 random(7);
  db.exec("BEGIN");
  sqlite3_stmt* insert = nullptr;
  sqlite3_prepare_v2(db.handle(), "INSERT INTO calls VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", -1, &insert,
                     nullptr);
  std::int64_t now[2] = {1'000, 2'000};
  for (int i = 1; i <= count; ++i) {
    const int rank = static_cast<int>(random() % 2);
    CallRecord c;
    c.id = i;
    c.rank_id = rank;
    c.comm_id = rank + 1;
    c.seq = i / 2;
    c.step = i % 5 == 0 ? -1 : i / 10;
    c.api = i % 3 == 0 ? Api::NcclAllGather : Api::NcclAllReduce;
    c.dtype = DType::Fp32;
    c.op = c.api == Api::NcclAllGather ? ReduceOp::None : ReduceOp::Sum;
    c.count = static_cast<std::int64_t>(random() % 100'000);
    c.bytes = c.count * 4;
    c.enqueue_ns = now[rank];
    c.start_ns = now[rank] + 100;
    // Mostly short calls, now and then a long one that overlaps many others.
    c.end_ns = c.start_ns + (i % 97 == 0 ? 40'000'000 : static_cast<std::int64_t>(1'000 + random() % 50'000));
    now[rank] = c.start_ns + static_cast<std::int64_t>(500 + random() % 60'000);
    const int kind = i % 4;  // 0: no GPU columns; 1: all; 2: stream only; 3: NCCL facts, stream NULL
    if (kind == 1 || kind == 2) c.stream = 1 + rank;
    if (kind == 1 || kind == 3) {
      c.nccl_algo = i % 7;
      c.nccl_proto = i % 3;
      c.nccl_channels = 1 + i % 32;
    }
    sqlite3_bind_int64(insert, 1, c.id);
    sqlite3_bind_int64(insert, 2, c.rank_id);
    sqlite3_bind_int64(insert, 3, c.comm_id);
    sqlite3_bind_int64(insert, 4, c.seq);
    if (c.step >= 0) sqlite3_bind_int64(insert, 5, c.step);
    else sqlite3_bind_null(insert, 5);
    sqlite3_bind_int64(insert, 6, static_cast<int>(c.api));
    sqlite3_bind_int64(insert, 7, static_cast<int>(c.dtype));
    if (c.op != ReduceOp::None) sqlite3_bind_int64(insert, 8, static_cast<int>(c.op));
    else sqlite3_bind_null(insert, 8);
    sqlite3_bind_int64(insert, 9, c.count);
    sqlite3_bind_int64(insert, 10, c.bytes);
    if (kind == 1 || kind == 2) sqlite3_bind_int64(insert, 11, c.stream);
    else sqlite3_bind_null(insert, 11);
    sqlite3_bind_int64(insert, 12, c.enqueue_ns);
    sqlite3_bind_int64(insert, 13, c.start_ns);
    sqlite3_bind_int64(insert, 14, c.end_ns);
    for (int col = 15; col <= 17; ++col) sqlite3_bind_null(insert, col);
    if (kind == 1 || kind == 3) {
      sqlite3_bind_int64(insert, 15, c.nccl_algo);
      sqlite3_bind_int64(insert, 16, c.nccl_proto);
      sqlite3_bind_int64(insert, 17, c.nccl_channels);
    }
    if (sqlite3_step(insert) != SQLITE_DONE) throw std::runtime_error(sqlite3_errmsg(db.handle()));
    sqlite3_reset(insert);
    calls.push_back(c);
  }
  sqlite3_finalize(insert);
  db.exec("COMMIT");
  return calls;
}

TEST(StorageMigration, OpeningAV1TraceUpgradesItInPlace) {
  TempDir dir;
  const std::string path = dir.file("v1.db");
  const std::vector<CallRecord> expected = makeV1Trace(path);
  {
    RawDb db(path, SQLITE_OPEN_READONLY);
    ASSERT_EQ(db.integer("PRAGMA user_version"), 1);
  }

  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.schemaVersion(), kSchemaVersion);
  EXPECT_EQ(reader.callCount(), static_cast<std::int64_t>(expected.size()));
  std::vector<CallRecord> calls;
  reader.forEachCall([&](const CallRecord& call) {
    calls.push_back(call);
    return true;
  });
  EXPECT_EQ(describeAll(calls), describeAll(expected));

  // Other tables are untouched.
  ASSERT_EQ(reader.runs().size(), 1u);
  EXPECT_EQ(reader.runs()[0].uuid, "v1-run");
  EXPECT_EQ(reader.runs()[0].end_ns, 900'000'000);
  ASSERT_EQ(reader.ranks().size(), 2u);
  EXPECT_EQ(reader.ranks()[1].clock_offset_ns, 35);
  EXPECT_EQ(reader.comms().size(), 2u);
  ASSERT_EQ(reader.measurements().size(), 1u);
  EXPECT_EQ(reader.measurements()[0].call_id, 7);
  ASSERT_EQ(reader.consensus().size(), 1u);
  EXPECT_FALSE(reader.consensus()[0].call_id.has_value());
  EXPECT_TRUE(reader.appliedCalls().empty());
  EXPECT_EQ(reader.recommendations().size(), 1u);
  EXPECT_EQ(describeAll(reader.drops()), describeAll(std::vector<DropRecord>{{1, "call", 17}}));

  // The time index was rebuilt: windows and extents agree with a scan of the calls.
  TimeExtent brute{std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()};
  for (const CallRecord& call : expected) {
    brute.begin_ns = std::min(brute.begin_ns, call.start_ns);
    brute.end_ns = std::max(brute.end_ns, call.end_ns);
  }
  const TimeExtent extent = reader.timeExtent();
  EXPECT_EQ(extent.begin_ns, brute.begin_ns);
  EXPECT_EQ(extent.end_ns, brute.end_ns);
  for (std::int64_t rank : {0, 1}) {
    for (const auto& [t0, t1] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {0, brute.end_ns + 1}, {5'000'000, 6'000'000}, {20'000'000, 20'000'100}}) {
      std::vector<std::int64_t> want;
      std::vector<const CallRecord*> matching;
      for (const CallRecord& call : expected)
        if (call.rank_id == rank && call.start_ns < t1 && call.end_ns > t0) matching.push_back(&call);
      std::stable_sort(matching.begin(), matching.end(),
                       [](const CallRecord* a, const CallRecord* b) { return a->start_ns < b->start_ns; });
      for (const CallRecord* call : matching) want.push_back(call->id);
      std::vector<std::int64_t> got;
      for (const CallRecord& call : reader.callsInWindow(rank, t0, t1)) got.push_back(call.id);
      EXPECT_EQ(got, want) << "rank " << rank << " window [" << t0 << ", " << t1 << ")";
    }
  }

  EXPECT_EQ(schemaObjects(path), newFileSchemaObjects(dir));
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.integer("PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(db.integer("PRAGMA application_id"), kApplicationId);
  // Moving calls aside did not leave references to the copy (measurements.call_id -> calls).
  EXPECT_TRUE(db.rows("PRAGMA foreign_key_check").empty());
  EXPECT_EQ(db.integer("SELECT count(*) FROM sqlite_master WHERE name IN ('calls_v1', 'calls_by_rank_time')"),
            0);
  EXPECT_GT(db.integer("SELECT count(*) FROM call_tiles"), 0);
  EXPECT_EQ(
      db.integer("SELECT count(*) FROM gpu_calls"),
      std::count_if(expected.begin(), expected.end(), [](const CallRecord& c) { return c.id % 4 != 0; }));
  EXPECT_EQ(
      db.integer("SELECT count(*) FROM gpu_calls WHERE stream = 0"),
      std::count_if(expected.begin(), expected.end(), [](const CallRecord& c) { return c.id % 4 == 3; }));
  EXPECT_EQ(db.integer("SELECT count(*) FROM pragma_table_info('calls') WHERE name = 'stream'"), 0);
  EXPECT_NE(db.text("SELECT sql FROM sqlite_master WHERE name = 'calls'")
                .find("-- per-communicator sequence number"),
            std::string::npos);
  EXPECT_EQ(db.text("PRAGMA integrity_check"), "ok");
}

TEST(StorageMigration, ReopeningAnUpgradedTraceChangesNothing) {
  TempDir dir;
  const std::string path = dir.file("v1.db");
  makeV1Trace(path, 300);
  const std::int64_t count = TraceReader::open(path).callCount();
  const std::string bytes = test::readFile(path);
  const TraceReader again = TraceReader::open(path);
  EXPECT_EQ(again.schemaVersion(), kSchemaVersion);
  EXPECT_EQ(again.callCount(), count);
  EXPECT_EQ(test::readFile(path), bytes);
}

TEST(StorageMigration, AFailedUpgradeLeavesTheV1FileAsItWas) {
  TempDir dir;
  const std::string path = dir.file("v1.db");
  makeV1Trace(path, 300);
  {
    RawDb db(path);
    db.exec("CREATE TABLE call_tiles (x)");  // clashes with a table v2 creates: the upgrade must fail
  }
  EXPECT_GRADSCOPE_ERROR(TraceReader::open(path), path, "call_tiles");
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.integer("PRAGMA user_version"), 1);
  EXPECT_EQ(db.integer("SELECT count(*) FROM calls"), 300);
  EXPECT_EQ(db.integer("SELECT count(*) FROM pragma_table_info('calls') WHERE name = 'stream'"), 1);
  EXPECT_EQ(db.integer("SELECT count(*) FROM sqlite_master WHERE name IN ('calls_v1', 'gpu_calls')"), 0);
  EXPECT_EQ(db.integer("SELECT count(*) FROM sqlite_master WHERE name = 'calls_by_rank_time'"), 1);
}

TEST(StorageMigration, AReadOnlyV1TraceIsRefusedWithAClearMessage) {
  TempDir dir;
  ::chmod(dir.path().c_str(), 0755);
  const std::string path = dir.file("readonly-v1.db");
  makeV1Trace(path, 100);
  ::chmod(path.c_str(), 0444);
  const auto child =
      test::runUnprivileged([&] { return test::childErrorMessage([&] { TraceReader::open(path); }); });
  if (child.skipped) GTEST_SKIP() << child.text;
  EXPECT_EQ(child.text.rfind("Error: " + path + ": ", 0), 0u) << child.text;
  EXPECT_NE(child.text.find("schema v1"), std::string::npos) << child.text;
  EXPECT_NE(child.text.find("needs write access"), std::string::npos) << child.text;
  EXPECT_EQ(child.text.find('\n'), std::string::npos) << child.text;
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.integer("PRAGMA user_version"), 1);
}

TEST(StorageMigration, AV1TraceInAReadOnlyDirectoryIsRefusedWithAClearMessage) {
  TempDir dir;
  const std::string locked = dir.makeSubdir("locked");
  const std::string path = locked + "/v1.db";
  makeV1Trace(path, 100);
  ::chmod(dir.path().c_str(), 0755);
  ::chmod(path.c_str(),
          0666);  // the file is writable, its directory is not: no room for the rollback journal
  ::chmod(locked.c_str(), 0555);
  const auto child =
      test::runUnprivileged([&] { return test::childErrorMessage([&] { TraceReader::open(path); }); });
  if (child.skipped) GTEST_SKIP() << child.text;
  EXPECT_EQ(child.text.rfind("Error: " + path + ": ", 0), 0u) << child.text;
  EXPECT_NE(child.text.find("read-only"), std::string::npos) << child.text;
  EXPECT_EQ(child.text.find('\n'), std::string::npos) << child.text;
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.integer("PRAGMA user_version"), 1);
}

// ---------------------------------------------------------------------------------------------------
// Migration from schema v2 (tests/data/schema_v2.sql)

// A v2 trace: a run of two ranks with a few calls (their tiles as the v2 writer kept them), a
// measurement of one of them, consensus rows whose ids have gaps, a recommendation and drops.
void makeV2Trace(const std::string& path) {
  RawDb db(path);
  db.exec(test::readFile(test::goldenPath("schema_v2.sql")));
  db.exec(R"sql(
    INSERT INTO runs VALUES (1, 'v2-run', 'old job', 'explore', 2, 2, 'h0', '{}', '0.0.2', 1795000000000000000, 0,
                             900000000);
    INSERT INTO ranks VALUES (0, 1, 0, 'h0', 10, 'cpu', 0), (1, 1, 1, 'h0', 11, 'cpu', 35);
    INSERT INTO comms VALUES (1, 0, 'world', 2, 2, 0), (2, 1, 'world', 2, 2, 1);
    INSERT INTO calls VALUES (1, 0, 1, 0, 0, 16, 7, 0, 1024, 4096, 100, 110, 500),
                             (2, 1, 2, 0, 0, 16, 7, 0, 1024, 4096, 120, 130, 450),
                             (3, 0, 1, 1, NULL, 18, 7, NULL, 16, 64, 600, 610, 700),
                             (4, 1, 2, 1, NULL, 18, 7, NULL, 16, 64, 640, 650, 720);
    INSERT INTO gpu_calls VALUES (2, 1, 1, 2, 8);
    INSERT INTO call_tiles SELECT 38, rank_id, start_ns >> 38, api, count(*), sum(end_ns - start_ns), sum(bytes),
                                  max(end_ns - start_ns), min(id), max(id)
                           FROM calls GROUP BY rank_id, start_ns >> 38, api;
    INSERT INTO measurements (run_id, rank_id, call_id, strategy, api, dtype, bytes, world, reps, min_ns, median_ns,
                              p90_ns, max_ns, algbw_gbs, busbw_gbs)
      VALUES (1, 0, 1, 'sum/rs_ag', 16, 7, 4096, 2, 10, 1, 2, 3, 4, 5, 6);
    INSERT INTO consensus VALUES (5, 0, 0, 0.5, 0.25, 2, 0.75), (9, 1, 0, 1.5, 0.125, 3, 0.75);
    INSERT INTO recommendations (run_id, created_ns, json) VALUES (1, 42, '{}');
    INSERT INTO drops VALUES (1, 'call', 17);
  )sql");
}

TEST(StorageMigration, OpeningAV2TraceUpgradesItInPlace) {
  TempDir dir;
  const std::string path = dir.file("v2.db");
  makeV2Trace(path);
  {
    RawDb db(path, SQLITE_OPEN_READONLY);
    ASSERT_EQ(db.integer("PRAGMA user_version"), 2);
  }

  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.schemaVersion(), kSchemaVersion);
  // Calls, their GPU facts and their time index are untouched.
  std::vector<std::string> calls;
  reader.forEachCall([&](const CallRecord& call) {
    calls.push_back(describe(call));
    return true;
  });
  ASSERT_EQ(calls.size(), 4u);
  CallRecord second = makeCall(1, 2, 0, Api::NcclAllReduce, DType::Fp32, ReduceOp::Sum, 1024, 130, 320);
  second.id = 2;
  second.step = 0;
  second.enqueue_ns = 120;
  second.stream = 1;
  second.nccl_algo = 1;
  second.nccl_proto = 2;
  second.nccl_channels = 8;
  EXPECT_EQ(calls[1], describe(second));
  ASSERT_EQ(reader.callsInWindow(1, 0, 1'000).size(), 2u);
  EXPECT_EQ(reader.callsInWindow(1, 0, 1'000)[1].id, 4);

  // Consensus rows keep their ids and values, without a call; nothing was applied.
  const auto consensus = reader.consensus();
  ASSERT_EQ(consensus.size(), 2u);
  EXPECT_EQ(describe(consensus[0]), describe(ConsensusRecord{5, 0, 0, 0.5, 0.25, 2, 0.75, std::nullopt}));
  EXPECT_EQ(describe(consensus[1]), describe(ConsensusRecord{9, 1, 0, 1.5, 0.125, 3, 0.75, std::nullopt}));
  EXPECT_FALSE(consensus[0].call_id.has_value());
  EXPECT_FALSE(consensus[1].call_id.has_value());
  EXPECT_TRUE(reader.appliedCalls().empty());
  EXPECT_TRUE(reader.appliedSummary().strategies.empty());

  // Other tables are untouched.
  ASSERT_EQ(reader.runs().size(), 1u);
  EXPECT_EQ(reader.runs()[0].uuid, "v2-run");
  EXPECT_EQ(reader.ranks().at(1).clock_offset_ns, 35);
  EXPECT_EQ(reader.comms().size(), 2u);
  ASSERT_EQ(reader.measurements().size(), 1u);
  EXPECT_EQ(reader.measurements()[0].call_id, 1);
  EXPECT_EQ(reader.recommendations().size(), 1u);
  EXPECT_EQ(describeAll(reader.drops()), describeAll(std::vector<DropRecord>{{1, "call", 17}}));

  // The file now stores exactly what a new file does, and nothing of the move.
  EXPECT_EQ(schemaObjects(path), newFileSchemaObjects(dir));
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.integer("PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(db.integer("SELECT count(*) FROM sqlite_master WHERE name = 'consensus_v2'"), 0);
  EXPECT_TRUE(db.rows("PRAGMA foreign_key_check").empty());
  EXPECT_EQ(db.rows("SELECT id, api, strategy FROM call_view ORDER BY id"),
            (std::vector<std::vector<std::string>>{{"1", "ncclAllReduce", "NULL"},
                                                   {"2", "ncclAllReduce", "NULL"},
                                                   {"3", "ncclAllGather", "NULL"},
                                                   {"4", "ncclAllGather", "NULL"}}));
  EXPECT_EQ(db.text("PRAGMA integrity_check"), "ok");
}

// A v3 file is a v4 file whose gpu_calls has no replay column: opening one rebuilds gpu_calls with it,
// keeping every row.
TEST(StorageMigration, OpeningAV3TraceAddsTheReplayColumn) {
  TempDir dir;
  const std::string path = dir.file("v3.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    CallRecord call = makeCall(0, 0, 0, Api::NcclAllReduce, DType::Fp32, ReduceOp::Sum, 128, 10, 1);
    call.stream = 2;
    call.nccl_algo = 1;
    writer.appendCalls(std::vector<CallRecord>{call});
    writer.finish();
    RawDb db(path);
    db.exec(
        "DROP VIEW call_view; DROP INDEX gpu_calls_replays; ALTER TABLE gpu_calls DROP COLUMN replay;"
        "PRAGMA user_version = 3;");
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.schemaVersion(), kSchemaVersion);
  std::vector<CallRecord> calls;
  reader.forEachCall([&](const CallRecord& call) {
    calls.push_back(call);
    return true;
  });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].stream, 2);
  EXPECT_EQ(calls[0].nccl_algo, 1);
  EXPECT_EQ(calls[0].graph_replay, 0);
  EXPECT_EQ(schemaObjects(path), newFileSchemaObjects(dir));
}

// A v4 file, made from the frozen v4 DDL, opens as v5: its calls read with no peers, and it stores the
// definitions a new file does (peer_calls, the view with its columns).
TEST(StorageMigration, OpeningAV4TraceAddsPeerCalls) {
  TempDir dir;
  const std::string path = dir.file("v4.db");
  {
    RawDb db(path);
    db.exec(test::readFile(test::goldenPath("schema_v4.sql")));
    db.exec(R"sql(
      INSERT INTO runs VALUES (1, 'v4-run', 'old job', 'observe', 1, 2, 'h0', '{}', '0.0.4', 1795000000000000000, 0,
                               900000000);
      INSERT INTO ranks VALUES (0, 1, 0, 'h0', 10, 'cpu', 0);
      INSERT INTO comms VALUES (1, 0, 'world', 1, 2, 0);
      INSERT INTO calls VALUES (1, 0, 1, 0, 3, 1, 7, 0, 256, 1024, 100, 110, 900);
      PRAGMA application_id = 1196639056;
      PRAGMA user_version = 4;
    )sql");
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.schemaVersion(), kSchemaVersion);
  std::vector<CallRecord> calls;
  reader.forEachCall([&](const CallRecord& call) {
    calls.push_back(call);
    return true;
  });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].api, Api::MpiAllreduce);
  EXPECT_EQ(calls[0].bytes, 1024);
  EXPECT_FALSE(calls[0].hasPeerInfo());
  EXPECT_EQ(schemaObjects(path), newFileSchemaObjects(dir));
}

// A v6 file, made from the frozen v6 DDL, opens as v7: its derived steps rows are dropped with the table
// (readers derive them again), gpu_activity is added, and it stores the definitions a new file does.
TEST(StorageMigration, OpeningAV6TraceRebuildsStepsAndAddsGpuActivity) {
  TempDir dir;
  const std::string path = dir.file("v6.db");
  {
    RawDb db(path);
    db.exec(test::readFile(test::goldenPath("schema_v6.sql")));
    db.exec(R"sql(
      INSERT INTO runs VALUES (1, 'v6-run', 'old job', 'observe', 1, 1, 'h0', '{}', '0.0.6', 1795000000000000000, 0,
                               900000000);
      INSERT INTO ranks VALUES (0, 1, 0, 'h0', 10, 'cpu', 0);
      INSERT INTO comms VALUES (1, 0, 'world', 1, 1, 0);
      INSERT INTO calls VALUES (1, 0, 1, 0, 3, 1, 7, 0, 256, 1024, 100, 110, 900);
      INSERT INTO steps VALUES (0, 0, 100, 900, 10, 790, 0, 0, 0, 1);
      PRAGMA application_id = 1196639056;
      PRAGMA user_version = 6;
    )sql");
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.schemaVersion(), kSchemaVersion);
  EXPECT_TRUE(reader.steps().empty());
  EXPECT_TRUE(reader.gpuActivity().empty());
  EXPECT_EQ(schemaObjects(path), newFileSchemaObjects(dir));
}

// A v7 file, made from the frozen v7 DDL, opens as v8: the exposure table is added and the derived steps
// rows are dropped (readers derive both again: steps rows in a v8 file come with their exposure), and it
// stores the definitions a new file does.
TEST(StorageMigration, OpeningAV7TraceAddsTheExposure) {
  TempDir dir;
  const std::string path = dir.file("v7.db");
  {
    RawDb db(path);
    db.exec(test::readFile(test::goldenPath("schema_v7.sql")));
    db.exec(R"sql(
      INSERT INTO runs VALUES (1, 'v7-run', 'old job', 'observe', 1, 1, 'h0', '{}', '0.0.7', 1795000000000000000, 0,
                               900000000);
      INSERT INTO ranks VALUES (0, 1, 0, 'h0', 10, 'cpu', 0);
      INSERT INTO comms VALUES (1, 0, 'world', 1, 1, 0);
      INSERT INTO calls VALUES (1, 0, 1, 0, 3, 1, 7, 0, 256, 1024, 100, 110, 900);
      INSERT INTO steps VALUES (0, 3, 100, 900, 10, 790, 0, 0, 0, 1, 0, 0);
      PRAGMA application_id = 1196639056;
      PRAGMA user_version = 7;
    )sql");
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.schemaVersion(), kSchemaVersion);
  EXPECT_TRUE(reader.steps().empty());
  EXPECT_TRUE(reader.exposure().empty());
  EXPECT_EQ(schemaObjects(path), newFileSchemaObjects(dir));
}

// A v8 file, made from the frozen v8 DDL, opens as v9: step_calls, reduction_sizes and reduction_totals are
// added, empty; the derived steps and exposure rows go (readers derive them again with the step_calls), the
// calls stay and are counted from them; and it stores the definitions a new file does.
TEST(StorageMigration, OpeningAV8TraceAddsTheStepCallsAndTheReductionCounts) {
  TempDir dir;
  const std::string path = dir.file("v8.db");
  {
    RawDb db(path);
    db.exec(test::readFile(test::goldenPath("schema_v8.sql")));
    db.exec(R"sql(
      INSERT INTO runs VALUES (1, 'v8-run', 'old job', 'observe', 1, 2, 'h0', '{}', '0.0.8', 1795000000000000000, 0,
                               900000000);
      INSERT INTO ranks VALUES (0, 1, 0, 'h0', 10, 'cpu', 0);
      INSERT INTO comms VALUES (1, 0, 'world', 1, 2, 0);
      INSERT INTO calls VALUES (1, 0, 1, 0, 3, 1, 7, 0, 256, 1024, 100, 110, 900);
      INSERT INTO steps VALUES (0, 3, 100, 900, 10, 790, 0, 0, 0, 1, 0, 0);
      INSERT INTO exposure VALUES (1, 7, 1024, 1, 790.0, 790.0);
      PRAGMA application_id = 1196639056;
      PRAGMA user_version = 8;
    )sql");
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.schemaVersion(), kSchemaVersion);
  EXPECT_TRUE(reader.steps().empty());
  EXPECT_TRUE(reader.exposure().empty());
  EXPECT_TRUE(reader.stepCalls().empty());
  const TraceReader::ReductionCounts counts = reader.reductionCounts();
  ASSERT_EQ(counts.sizes.size(), 1u);
  EXPECT_EQ(counts.sizes[0].bytes, 1024);
  EXPECT_EQ(counts.sizes[0].calls, 1);
  EXPECT_EQ(counts.steps, 1);
  EXPECT_EQ(schemaObjects(path), newFileSchemaObjects(dir));
}

// The step calls and the reduction counts come back as written, ordered by their keys: the stored counts
// are what reductionCounts() returns in place of counting the calls (a file without calls here).
TEST(StorageRoundTrip, StepCallsAndReductionCounts) {
  TempDir dir;
  const std::string path = dir.file("derived.db");
  const std::vector<StepCallTime> step_calls = {{2, Api::MpiAllreduce, 10, 4, 9'000'000'000'000},
                                                {0, Api::MpiBarrier, -1, 2, 70},
                                                {0, Api::MpiAllreduce, 62, 1, 1}};
  const std::vector<ReductionCount> sizes = {{Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 4096, 12},
                                             {Api::MpiAllreduce, DType::Bf16, ReduceOp::Max, 8, 3}};
  {
    TraceWriter writer = TraceWriter::create(path);
    writer.appendStepCalls(step_calls);
    writer.setReductionCounts(sizes, ReductionTotals{5, 2, 7});
    writer.finish();
  }
  const TraceReader reader = TraceReader::open(path);
  const std::vector<StepCallTime> read = reader.stepCalls();
  ASSERT_EQ(read.size(), 3u);
  const std::vector<std::size_t> order = {2, 1, 0};  // by (step, api, size_class)
  for (std::size_t i = 0; i < read.size(); ++i) {
    const StepCallTime& want = step_calls[order[i]];
    EXPECT_EQ(read[i].step, want.step);
    EXPECT_EQ(read[i].api, want.api);
    EXPECT_EQ(read[i].size_class, want.size_class);
    EXPECT_EQ(read[i].calls, want.calls);
    EXPECT_EQ(read[i].total_ns, want.total_ns);
  }
  const TraceReader::ReductionCounts counts = reader.reductionCounts();
  EXPECT_EQ(counts.steps, 5);
  EXPECT_EQ(counts.ranks, 2);
  EXPECT_EQ(counts.single_rank_calls, 7);
  ASSERT_EQ(counts.sizes.size(), 2u);
  EXPECT_EQ(counts.sizes[0].dtype, DType::Fp32);  // by (api, dtype, op, bytes): fp32 is code 7, bf16 9
  EXPECT_EQ(counts.sizes[0].calls, 12);
  EXPECT_EQ(counts.sizes[1].op, ReduceOp::Max);
  EXPECT_EQ(counts.sizes[1].bytes, 8);
  EXPECT_EQ(counts.sizes[1].calls, 3);
}

// Exposure rows come back as written, ordered by (api, dtype, bytes), their doubles exact.
TEST(StorageRoundTrip, Exposure) {
  TempDir dir;
  const std::string path = dir.file("exposure.db");
  const std::vector<CallExposure> written = {{Api::MpiIallreduce, DType::Fp32, 4096, 8, 1.0 / 3.0, 0.1},
                                             {Api::MpiAllreduce, DType::Bf16, 1 << 20, 2, 12345.678, 0},
                                             {Api::MpiAllreduce, DType::Fp32, 64, 40, 900.5, 900.5}};
  {
    TraceWriter writer = TraceWriter::create(path);
    writer.appendExposure(written);
    writer.finish();
  }
  const auto read = TraceReader::open(path).exposure();
  ASSERT_EQ(read.size(), 3u);
  std::vector<CallExposure> want = written;
  std::sort(want.begin(), want.end(), [](const CallExposure& a, const CallExposure& b) {
    return std::tie(a.api, a.dtype, a.bytes) < std::tie(b.api, b.dtype, b.bytes);
  });
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(read[i].api, want[i].api);
    EXPECT_EQ(read[i].dtype, want[i].dtype);
    EXPECT_EQ(read[i].bytes, want[i].bytes);
    EXPECT_EQ(read[i].calls, want[i].calls);
    EXPECT_EQ(read[i].transport_ns, want[i].transport_ns);
    EXPECT_EQ(read[i].exposed_ns, want[i].exposed_ns);
  }
}

// GPU activity rows come back as written.
TEST(StorageRoundTrip, GpuActivity) {
  TempDir dir;
  const std::string path = dir.file("gpu.db");
  const std::vector<GpuActivityRecord> written = {{0, GpuActivityKind::Window, 100, 900, 0, std::nullopt},
                                                  {0, GpuActivityKind::Compute, 120, 400, 3, "forward"},
                                                  {0, GpuActivityKind::Nccl, 300, 500, 1, std::nullopt}};
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "gpu-run";
    run.epoch_ns = 1;
    const std::int64_t run_id = writer.addRun(run);
    writer.addRank({0, run_id, 0, "h0", 1, "cuda:0", 0});
    writer.appendGpuActivity(written);
    writer.finish();
  }
  const std::vector<GpuActivityRecord> read = TraceReader::open(path).gpuActivity();
  ASSERT_EQ(read.size(), written.size());
  for (std::size_t i = 0; i < read.size(); ++i) {
    EXPECT_EQ(read[i].kind, written[i].kind) << i;
    EXPECT_EQ(read[i].start_ns, written[i].start_ns) << i;
    EXPECT_EQ(read[i].end_ns, written[i].end_ns) << i;
    EXPECT_EQ(read[i].kernels, written[i].kernels) << i;
    EXPECT_EQ(read[i].range, written[i].range) << i;
  }
}

// Point-to-point facts go to peer_calls and come back with their calls; calls without any have no row.
TEST(StorageRoundTrip, PeersOfPointToPointCallsAndTheSpreadOfAllToAlls) {
  TempDir dir;
  const std::string path = dir.file("peers.db");
  std::vector<CallRecord> written;
  {
    TraceWriter writer = TraceWriter::create(path);
    CallRecord send = makeCall(0, 0, 0, Api::MpiSend, DType::Fp32, ReduceOp::None, 8, 10, 20);
    send.dest = 1;
    send.send_tag = 7;
    CallRecord recv = makeCall(0, 0, 1, Api::MpiRecv, DType::Fp32, ReduceOp::None, 8, 30, 40);
    recv.source = 1;
    recv.recv_tag = 9;
    recv.recv_bytes = 32;
    CallRecord both = makeCall(0, 0, 2, Api::MpiSendrecv, DType::Int32, ReduceOp::None, 4, 50, 60);
    both.dest = 1;
    both.send_tag = 0;
    both.source = 1;
    both.recv_tag = 0;
    both.recv_bytes = 12;
    CallRecord spread = makeCall(0, 0, 0, Api::MpiAlltoallv, DType::Int32, ReduceOp::None, 10, 70, 80);
    spread.peer_max_bytes = 28;
    spread.peer_min_bytes = 12;
    const CallRecord plain = makeCall(0, 0, 1, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 8, 90, 95);
    written = {send, recv, both, spread, plain};
    writer.appendCalls(written);
    writer.finish();
  }
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.integer("SELECT count(*) FROM peer_calls"), 4);
  EXPECT_EQ(db.rows("SELECT p.dest, p.send_tag, p.source, p.recv_tag, p.recv_bytes, p.peer_max_bytes FROM "
                    "peer_calls p JOIN calls c ON c.id = p.call_id WHERE c.api = 13"),
            (std::vector<std::vector<std::string>>{{"1", "0", "1", "0", "12", "NULL"}}));
  std::vector<CallRecord> read;
  TraceReader::open(path).forEachCall([&](const CallRecord& call) {
    read.push_back(call);
    return true;
  });
  ASSERT_EQ(read.size(), written.size());
  for (std::size_t i = 0; i < read.size(); ++i) {
    EXPECT_EQ(read[i].dest, written[i].dest) << i;
    EXPECT_EQ(read[i].send_tag, written[i].send_tag) << i;
    EXPECT_EQ(read[i].source, written[i].source) << i;
    EXPECT_EQ(read[i].recv_tag, written[i].recv_tag) << i;
    EXPECT_EQ(read[i].recv_bytes, written[i].recv_bytes) << i;
    EXPECT_EQ(read[i].peer_max_bytes, written[i].peer_max_bytes) << i;
    EXPECT_EQ(read[i].peer_min_bytes, written[i].peer_min_bytes) << i;
  }
}

TEST(StorageMigration, AFailedUpgradeLeavesTheV2FileAsItWas) {
  TempDir dir;
  const std::string path = dir.file("v2.db");
  makeV2Trace(path);
  {
    RawDb db(path);
    db.exec("CREATE TABLE applied_calls (x)");  // clashes with a table v3 creates: the upgrade must fail
  }
  EXPECT_GRADSCOPE_ERROR(TraceReader::open(path), path, "applied_calls");
  RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.integer("PRAGMA user_version"), 2);
  EXPECT_EQ(db.rows("SELECT id FROM consensus ORDER BY id"),
            (std::vector<std::vector<std::string>>{{"5"}, {"9"}}));
  EXPECT_EQ(db.integer("SELECT count(*) FROM pragma_table_info('consensus') WHERE name = 'call_id'"), 0);
  EXPECT_EQ(
      db.integer("SELECT count(*) FROM sqlite_master WHERE name IN ('consensus_v2', 'consensus_by_step', "
                 "'call_view')"),
      2);
}

}  // namespace
}  // namespace gradscope::storage
