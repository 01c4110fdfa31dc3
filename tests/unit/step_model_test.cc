// storage/step_model.h: where each rank's step goes. Traces written by hand whose split is known exactly:
// blocking and nonblocking all-reduces with a late rank, a receive that waits for a late sender on a host
// whose clock is offset, the straggler summary (one slow rank against noise), merge storing the rows, and
// the report's section.

#include "gradscope/storage/step_model.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/cli/report.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using test::TempDir;

// One run of `ranks` ranks on one host (rank id = rank), each with a "world" communicator.
class StepTraceBuilder {
 public:
  StepTraceBuilder(const std::string& path, int ranks) : writer_(TraceWriter::create(path)) {
    RunInfo run;
    run.uuid = "00000000-0000-4000-8000-0000000000bb";
    run.command = "step-model-test";
    run.mode = "observe";
    run.backend = Backend::Mpi;
    run.world_size = ranks;
    run.host = "node0";
    run.epoch_ns = 1'795'000'000'000'000'000;
    run.tool_version = "test";
    const std::int64_t run_id = writer_.addRun(run);
    for (int rank = 0; rank < ranks; ++rank) {
      writer_.addRank({0, run_id, rank, "node0", 1000 + rank, "cpu", 0});
      world_.push_back(writer_.addComm({0, rank, "world", Backend::Mpi, ranks, rank}));
    }
  }

  // A collective: posted at `enqueue`, waited for from `start` (= enqueue for a blocking one) to `end`.
  void collective(int rank, std::int64_t seq, std::int64_t step, Api api, std::int64_t enqueue,
                  std::int64_t start, std::int64_t end, std::int64_t bytes = 1024,
                  DType dtype = DType::Fp32) {
    CallRecord call = base(rank, step, api, enqueue, start, end);
    call.seq = seq;
    call.bytes = bytes;
    call.count = bytes / 4;
    call.dtype = dtype;
    call.op = ReduceOp::Sum;
    add(call);
  }
  void send(int rank, std::int64_t seq, std::int64_t step, int dest, std::int64_t start, std::int64_t end) {
    CallRecord call = base(rank, step, Api::MpiSend, start, start, end);
    call.seq = seq;
    call.dest = dest;
    call.send_tag = 7;
    add(call);
  }
  void recv(int rank, std::int64_t seq, std::int64_t step, int source, std::int64_t start, std::int64_t end) {
    CallRecord call = base(rank, step, Api::MpiRecv, start, start, end);
    call.seq = seq;
    call.source = source;
    call.recv_tag = 7;
    call.recv_bytes = 1024;
    add(call);
  }
  // An NCCL all-reduce made at `enqueue` whose kernel ran from `start` to `end` on the GPU.
  void gpuCollective(int rank, std::int64_t seq, std::int64_t step, std::int64_t enqueue, std::int64_t start,
                     std::int64_t end, Api api = Api::NcclAllReduce) {
    CallRecord call = base(rank, step, api, enqueue, start, end);
    call.seq = seq;
    call.op = ReduceOp::Sum;
    add(call);
  }
  void activity(int rank, GpuActivityKind kind, std::int64_t start, std::int64_t end) {
    const GpuActivityRecord row{rank,        kind, start, end, kind == GpuActivityKind::Window ? 0 : 1,
                                std::nullopt};
    writer_.appendGpuActivity(std::span<const GpuActivityRecord>(&row, 1));
  }
  void setClockOffset(int rank, std::int64_t offset_ns) { writer_.setClockOffset(rank, offset_ns); }
  void finish() { writer_.finish(1'000'000); }

 private:
  CallRecord base(int rank, std::int64_t step, Api api, std::int64_t enqueue, std::int64_t start,
                  std::int64_t end) const {
    CallRecord call;
    call.rank_id = rank;
    call.comm_id = world_.at(static_cast<std::size_t>(rank));
    call.step = step;
    call.api = api;
    call.dtype = DType::Fp32;
    call.count = 256;
    call.bytes = 1024;
    call.enqueue_ns = enqueue;
    call.start_ns = start;
    call.end_ns = end;
    return call;
  }
  void add(const CallRecord& call) { writer_.appendCalls(std::span<const CallRecord>(&call, 1)); }

  TraceWriter writer_;
  std::vector<std::int64_t> world_;
};

// Three steps of 1,000 ns on two ranks. Each step: a blocking all-reduce that rank 0 joins 100 ns late,
// then a nonblocking one posted at +400 (rank 1) and +500 (rank 0), waited for from +700 (rank 1) and
// +520 (rank 0), both ending at +800.
void writeTwoRankSteps(const std::string& path) {
  StepTraceBuilder trace(path, 2);
  for (std::int64_t step = 0; step < 3; ++step) {
    const std::int64_t t = step * 1000;
    trace.collective(0, 2 * step, step, Api::MpiAllreduce, t + 100, t + 100, t + 300);
    trace.collective(1, 2 * step, step, Api::MpiAllreduce, t, t, t + 300);
    trace.collective(1, 2 * step + 1, step, Api::MpiIallreduce, t + 400, t + 700, t + 800);
    trace.collective(0, 2 * step + 1, step, Api::MpiIallreduce, t + 500, t + 520, t + 800);
  }
  trace.finish();
}

StepRecord row(std::int64_t rank, std::int64_t step, std::int64_t start, std::int64_t end,
               std::int64_t compute, std::int64_t exposed, std::int64_t waiting, std::int64_t hidden,
               std::int64_t caused) {
  return {rank, step, start, end, compute, exposed, waiting, hidden, caused, 2};
}

void expectRows(const std::vector<StepRecord>& got, const std::vector<StepRecord>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "rank " << want[i].rank_id << " step " << want[i].step);
    EXPECT_EQ(got[i].rank_id, want[i].rank_id);
    EXPECT_EQ(got[i].step, want[i].step);
    EXPECT_EQ(got[i].start_ns, want[i].start_ns);
    EXPECT_EQ(got[i].end_ns, want[i].end_ns);
    EXPECT_EQ(got[i].compute_ns, want[i].compute_ns);
    EXPECT_EQ(got[i].exposed_ns, want[i].exposed_ns);
    EXPECT_EQ(got[i].waiting_ns, want[i].waiting_ns);
    EXPECT_EQ(got[i].hidden_ns, want[i].hidden_ns);
    EXPECT_EQ(got[i].caused_ns, want[i].caused_ns);
    EXPECT_EQ(got[i].calls, want[i].calls);
  }
}

TEST(StepModel, SplitsEachRanksStepExactly) {
  TempDir dir;
  const std::string path = dir.file("steps.db");
  writeTwoRankSteps(path);
  const StepModel model = computeStepModel(TraceReader::open(path));
  // Rank 0: blocked [100, 300) and [520, 800) = 480 of each step; in flight [100, 300) and [500, 800):
  // 20 hidden; it arrived last at the blocking all-reduce, where rank 1 waited 100. Its last step ends
  // with its last call (800), 700 after it began.
  // Rank 1: blocked [0, 300) and [700, 800) = 400, 100 of it waiting for rank 0; in flight [0, 300) and
  // [400, 800): 300 hidden. It posted the nonblocking all-reduce first but waited only after rank 0 had.
  expectRows(model.steps, {
                              row(0, 0, 100, 1100, 520, 480, 0, 20, 100),
                              row(0, 1, 1100, 2100, 520, 480, 0, 20, 100),
                              row(0, 2, 2100, 2800, 220, 480, 0, 20, 100),
                              row(1, 0, 0, 1000, 600, 400, 100, 300, 0),
                              row(1, 1, 1000, 2000, 600, 400, 100, 300, 0),
                              row(1, 2, 2000, 2800, 400, 400, 100, 300, 0),
                          });
  // Transport (from the last arrival to the end) and its exposed part, per call, averaged over ranks:
  // the all-reduce 200 on both, all exposed; the nonblocking one 300 on both, exposed 280 (rank 0, which
  // waited from +520) and 100 (rank 1, from +700).
  ASSERT_EQ(model.exposure.size(), 2u);
  EXPECT_EQ(model.exposure[0].api, Api::MpiAllreduce);
  EXPECT_EQ(model.exposure[0].calls, 6);
  EXPECT_DOUBLE_EQ(model.exposure[0].transport_ns, 200);
  EXPECT_DOUBLE_EQ(model.exposure[0].exposed_ns, 200);
  EXPECT_EQ(model.exposure[1].api, Api::MpiIallreduce);
  EXPECT_DOUBLE_EQ(model.exposure[1].transport_ns, 300);
  EXPECT_DOUBLE_EQ(model.exposure[1].exposed_ns, 190);
}

// A job that reduces its tensors one by one: thousands of sizes, each call's transport known (rank 1
// arrives 10 ns after rank 0; both leave `size`-dependent ns later). The exposure has one entry per (api,
// dtype, size), in that order, each exact, whatever the order the sizes came in.
TEST(StepModel, ExposurePerSizeWithThousandsOfSizes) {
  TempDir dir;
  const std::string path = dir.file("sizes.db");
  constexpr int kSizes = 3000;
  {
    StepTraceBuilder trace(path, 2);
    std::int64_t t = 0, seq = 0;
    for (int step = 0; step < 2; ++step)
      for (int i = 0; i < kSizes; ++i) {
        // Sizes in a scrambled order, two dtypes alternating.
        const std::int64_t bytes = 4 * (1 + (i * 7919) % kSizes);
        const DType dtype = i % 2 == 0 ? DType::Fp32 : DType::Bf16;
        const std::int64_t transport = bytes % 97 + 1;
        trace.collective(0, seq, step, Api::MpiAllreduce, t, t, t + 10 + transport, bytes, dtype);
        trace.collective(1, seq, step, Api::MpiAllreduce, t + 10, t + 10, t + 10 + transport, bytes, dtype);
        ++seq, t += 200;
      }
    trace.finish();
  }
  const StepModel model = computeStepModel(TraceReader::open(path));
  ASSERT_EQ(model.exposure.size(), static_cast<std::size_t>(kSizes));
  for (std::size_t i = 0; i < model.exposure.size(); ++i) {
    const CallExposure& entry = model.exposure[i];
    SCOPED_TRACE(::testing::Message() << "entry " << i << ": " << entry.bytes << " bytes");
    if (i > 0) {
      const CallExposure& before = model.exposure[i - 1];
      EXPECT_LT(std::tie(before.api, before.dtype, before.bytes),
                std::tie(entry.api, entry.dtype, entry.bytes));
    }
    EXPECT_EQ(entry.api, Api::MpiAllreduce);
    EXPECT_EQ(entry.calls, 4);  // 2 ranks x 2 steps
    EXPECT_DOUBLE_EQ(entry.transport_ns, static_cast<double>(entry.bytes % 97 + 1));
    EXPECT_DOUBLE_EQ(entry.exposed_ns, entry.transport_ns);
  }
}

TEST(StepModel, AReceiveWaitsForItsSenderOnAnotherClock) {
  TempDir dir;
  const std::string path = dir.file("p2p.db");
  {
    StepTraceBuilder trace(path, 2);
    // Rank 1's clock reads 50 ns behind rank 0's (its offset +50). It waits in MPI_Recv from 100 to 470
    // on its clock (150..520 on rank 0's); rank 0 sends at 500 on its own, 450 on rank 1's clock: rank 1
    // waited 350 of its 370 for the sender.
    trace.setClockOffset(1, 50);
    trace.send(0, 0, 0, 1, 500, 510);
    trace.recv(1, 0, 0, 0, 100, 470);
    trace.finish();
  }
  const StepModel model = computeStepModel(TraceReader::open(path));
  ASSERT_EQ(model.steps.size(), 2u);
  EXPECT_EQ(model.steps[0].rank_id, 0);
  EXPECT_EQ(model.steps[0].exposed_ns, 10);
  EXPECT_EQ(model.steps[0].caused_ns, 350);
  EXPECT_EQ(model.steps[1].rank_id, 1);
  EXPECT_EQ(model.steps[1].end_ns - model.steps[1].start_ns, 370);
  EXPECT_EQ(model.steps[1].exposed_ns, 370);
  EXPECT_EQ(model.steps[1].waiting_ns, 350);
  EXPECT_EQ(model.steps[1].compute_ns, 0);
  EXPECT_TRUE(model.exposure.empty());  // point-to-point calls have no transport strategy to weigh
}

TEST(StepModel, CallsWithoutStepsHaveNoModel) {
  TempDir dir;
  const std::string path = dir.file("none.db");
  {
    StepTraceBuilder trace(path, 2);
    trace.collective(0, 0, -1, Api::MpiAllreduce, 0, 0, 10);
    trace.collective(1, 0, -1, Api::MpiAllreduce, 0, 0, 10);
    trace.finish();
  }
  EXPECT_TRUE(computeStepModel(TraceReader::open(path)).steps.empty());
  EXPECT_TRUE(readOrComputeSteps(TraceReader::open(path)).empty());
}

TEST(StepModel, TotalsAndStragglers) {
  // Rank 1 is last in four of five steps, rank 0 in one: a slow rank.
  std::vector<StepRecord> rows;
  for (std::int64_t step = 0; step < 5; ++step) {
    const bool rank1_late = step != 2;
    rows.push_back(row(0, step, 0, 1000, 800, 200, rank1_late ? 150 : 0, 0, rank1_late ? 0 : 40));
    rows.push_back(row(1, step, 0, 900, 850, 50, rank1_late ? 0 : 40, 0, rank1_late ? 150 : 0));
  }
  const auto totals = stepTotals(rows);
  ASSERT_EQ(totals.size(), 5u);
  EXPECT_EQ(totals[0].span_ns, 1000);
  EXPECT_DOUBLE_EQ(totals[0].compute_ns, 825);
  EXPECT_DOUBLE_EQ(totals[0].exposed_ns, 125);
  EXPECT_EQ(totals[0].lost_ns, 150);
  EXPECT_EQ(totals[0].last_rank_id, 1);
  EXPECT_EQ(totals[2].last_rank_id, 0);
  const Stragglers slow = stragglers(rows);
  EXPECT_EQ(slow.steps, 5);
  EXPECT_EQ(slow.lost_ns, 4 * 150 + 40);
  EXPECT_EQ(slow.rank_time_ns, 5 * 1900);
  ASSERT_EQ(slow.ranks.size(), 2u);
  EXPECT_EQ(slow.ranks[0].rank_id, 1);
  EXPECT_EQ(slow.ranks[0].steps_last, 4);
  EXPECT_EQ(slow.ranks[0].caused_ns, 600);
  EXPECT_TRUE(slow.persistent);

  // Alternating: noise.
  for (StepRecord& r : rows) {
    const bool rank1_late = r.step % 2 == 0;
    r.waiting_ns = (r.rank_id == 0) == rank1_late ? 100 : 0;
    r.caused_ns = (r.rank_id == 1) == rank1_late ? 100 : 0;
  }
  const Stragglers noise = stragglers(rows);
  EXPECT_EQ(noise.ranks[0].steps_last, 3);
  EXPECT_FALSE(noise.persistent);
}

// Two GPU ranks, three steps of 1,000 ns, one NCCL all-reduce a step: rank 1's kernel starts at +100 and
// waits for rank 0's, which starts at +300; both end at +600. Compute kernels: rank 0 [+0, +400), rank 1
// [+0, +200). Both ranks' window covers [0, 2400): each rank's last step ends past it.
void writeGpuSteps(const std::string& path) {
  StepTraceBuilder trace(path, 2);
  for (std::int64_t step = 0; step < 3; ++step) {
    const std::int64_t t = step * 1000;
    trace.gpuCollective(0, step, step, t + 250, t + 300, t + 600);
    trace.gpuCollective(1, step, step, t + 50, t + 100, t + 600);
    trace.activity(0, GpuActivityKind::Compute, t, t + 400);
    trace.activity(1, GpuActivityKind::Compute, t, t + 200);
    trace.activity(0, GpuActivityKind::Nccl, t + 300, t + 600);
    trace.activity(1, GpuActivityKind::Nccl, t + 100, t + 600);
  }
  trace.activity(0, GpuActivityKind::Window, 0, 2400);
  trace.activity(1, GpuActivityKind::Window, 0, 2400);
  trace.finish();
}

TEST(StepModel, GpuStepsFromTheSampledWindowsKernels) {
  TempDir dir;
  const std::string path = dir.file("gpu.db");
  writeGpuSteps(path);
  const StepModel model = computeStepModel(TraceReader::open(path));
  // Rank 0, step 0 [300, 1300): NCCL [300, 600) of which [300, 400) beside compute: hidden 100, exposed
  // 200; the GPU runs [300, 600) and [1000, 1300): idle 400. It arrived last: rank 1's exposed waiting
  // ([200, 300): before that, rank 1's own compute hid it) is charged to it, 100 a step.
  // Rank 1, step 0 [100, 1100): NCCL [100, 600), hidden [100, 200), exposed 400 of which [200, 300)
  // waiting; busy [100, 600) and [1000, 1100): idle 400.
  // Step 2 of both ends past the window: span only.
  auto gpu = [](std::int64_t rank, std::int64_t step, std::int64_t start, std::int64_t compute,
                std::int64_t exposed, std::int64_t waiting, std::int64_t caused) {
    StepRecord want = row(rank, step, start, start + 1000, compute, exposed, waiting, 100, caused);
    want.calls = 1;
    return want;
  };
  ASSERT_EQ(model.steps.size(), 6u);
  expectRows({model.steps[0], model.steps[1], model.steps[3], model.steps[4]},
             {gpu(0, 0, 300, 800, 200, 0, 100), gpu(0, 1, 1300, 800, 200, 0, 100),
              gpu(1, 0, 100, 600, 400, 100, 0), gpu(1, 1, 1100, 600, 400, 100, 0)});
  for (const std::size_t i : {0u, 1u, 3u, 4u}) {
    EXPECT_EQ(model.steps[i].basis, StepBasis::Gpu) << i;
    EXPECT_EQ(model.steps[i].idle_ns, 400) << i;
  }
  for (const std::size_t i : {2u, 5u}) {
    SCOPED_TRACE(i);
    EXPECT_EQ(model.steps[i].step, 2);
    EXPECT_EQ(model.steps[i].basis, StepBasis::GpuUnsampled);
    EXPECT_EQ(model.steps[i].calls, 1);
    EXPECT_EQ(model.steps[i].compute_ns + model.steps[i].exposed_ns + model.steps[i].hidden_ns +
                  model.steps[i].idle_ns + model.steps[i].caused_ns,
              0);
  }
  // The totals average the measured rows only; the step's time is still the longest span.
  const std::vector<StepTotals> totals = stepTotals(model.steps);
  ASSERT_EQ(totals.size(), 3u);
  EXPECT_EQ(totals[0].measured, 2);
  EXPECT_EQ(totals[0].gpu, 2);
  EXPECT_DOUBLE_EQ(totals[0].exposed_ns, 300);
  EXPECT_EQ(totals[2].measured, 0);
  EXPECT_DOUBLE_EQ(totals[2].exposed_ns, 0);

  // Merged, the report says where the breakdown comes from and how idle the GPU was.
  const std::string merged = dir.file("merged.db");
  mergeTraces({path}, merged, {});
  const TraceReader reader = TraceReader::open(merged);
  EXPECT_EQ(reader.gpuActivity().size(), 14u);
  std::ostringstream text;
  cli::writeReport(reader, text, {});
  const std::string report = text.str();
  EXPECT_NE(report.find("GPU ranks: measured on the GPU in 4 of 6 rank steps"), std::string::npos) << report;
  EXPECT_NE(report.find("GPU idle (no kernel running: the host launched too little) in the measured steps: "
                        "40.0% of their time"),
            std::string::npos)
      << report;
}

// NCCL sends and receives are numbered apart on each rank: equal numbers are not one collective, and a
// receive is not charged as waiting for a "late" send.
TEST(StepModel, GpuPointToPointCallsAreNotCollectives) {
  TempDir dir;
  const std::string path = dir.file("gpu-p2p.db");
  {
    StepTraceBuilder trace(path, 2);
    for (std::int64_t step = 0; step < 2; ++step) {
      const std::int64_t t = step * 1000;
      trace.gpuCollective(0, step, step, t, t + 100, t + 200, Api::NcclSend);
      trace.gpuCollective(1, step, step, t, t + 400, t + 500, Api::NcclRecv);
      trace.activity(0, GpuActivityKind::Nccl, t + 100, t + 200);
      trace.activity(1, GpuActivityKind::Nccl, t + 400, t + 500);
    }
    trace.activity(0, GpuActivityKind::Window, 0, 3000);
    trace.activity(1, GpuActivityKind::Window, 0, 3000);
    trace.finish();
  }
  for (const StepRecord& row : computeStepModel(TraceReader::open(path)).steps) {
    SCOPED_TRACE(::testing::Message() << "rank " << row.rank_id << " step " << row.step);
    EXPECT_EQ(row.waiting_ns, 0);
    EXPECT_EQ(row.caused_ns, 0);
  }
}

// Without windows (no CUPTI) a GPU rank's steps have their spans and no breakdown, and the report says why.
TEST(StepModel, GpuStepsWithoutWindowsHaveNoBreakdown) {
  TempDir dir;
  const std::string path = dir.file("gpu.db");
  {
    StepTraceBuilder trace(path, 1);
    for (std::int64_t step = 0; step < 3; ++step)
      trace.gpuCollective(0, step, step, step * 1000, step * 1000 + 50, step * 1000 + 300);
    trace.finish();
  }
  const TraceReader reader = TraceReader::open(path);
  const StepModel model = computeStepModel(reader);
  ASSERT_EQ(model.steps.size(), 3u);
  for (const StepRecord& step : model.steps) EXPECT_EQ(step.basis, StepBasis::GpuUnsampled);
  std::ostringstream text;
  cli::writeReport(reader, text, {});
  EXPECT_NE(text.str().find("no breakdown: NCCL runs on the GPU and no step lay inside a sampled GPU window"),
            std::string::npos)
      << text.str();
}

// gradscope-synth --gpu: every rank's steps 1-5 are measured on the GPU (ranks 50 and up have negative
// times in their own files: their clocks start after the first rank's), each with the straggler's waiting.
TEST(StepModel, SyntheticGpuJobsAreMeasuredInTheirWindows) {
  TempDir dir;
  testing::SyntheticJob job;
  job.ranks = 64;
  job.steps = 8;
  job.gpu = true;
  std::vector<std::string> files;
  for (int rank = 0; rank < job.ranks; ++rank) {
    files.push_back(dir.file("rank" + std::to_string(rank) + ".db"));
    testing::writeSyntheticRank(files.back(), job, rank);
  }
  const std::string merged = dir.file("merged.db");
  mergeTraces(files, merged, {});
  const std::vector<StepRecord> rows = TraceReader::open(merged).steps();
  ASSERT_EQ(rows.size(), 64u * 8u);
  for (const StepRecord& row : rows) {
    SCOPED_TRACE(::testing::Message() << "rank id " << row.rank_id << " step " << row.step);
    EXPECT_EQ(row.basis, row.step >= 1 && row.step <= 5 ? StepBasis::Gpu : StepBasis::GpuUnsampled);
  }
  const Stragglers late = stragglers(rows);
  ASSERT_FALSE(late.ranks.empty());
  EXPECT_TRUE(late.persistent);
  EXPECT_EQ(late.steps, 5);
}

// A faster transport saves at most the exposed time; a slower one costs what the hidden part cannot absorb.
TEST(StepModel, StepSavingOfAFasterOrSlowerTransport) {
  // A blocking call: 200 of transport, all exposed.
  EXPECT_DOUBLE_EQ(stepSavingNs(50, 200, 200), 50);
  EXPECT_DOUBLE_EQ(stepSavingNs(300, 200, 200), 200);
  EXPECT_DOUBLE_EQ(stepSavingNs(-80, 200, 200), -80);
  // A nonblocking call: 300 of transport, 100 exposed: 200 hidden.
  EXPECT_DOUBLE_EQ(stepSavingNs(150, 300, 100), 100);
  EXPECT_DOUBLE_EQ(stepSavingNs(-150, 300, 100), 0);    // its slack absorbs it
  EXPECT_DOUBLE_EQ(stepSavingNs(-250, 300, 100), -50);  // beyond the slack
  EXPECT_DOUBLE_EQ(stepSavingNs(0, 300, 100), 0);
}

void expectStepCalls(const std::vector<StepCallTime>& got, const std::vector<StepCallTime>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "row " << i);
    EXPECT_EQ(got[i].step, want[i].step);
    EXPECT_EQ(got[i].api, want[i].api);
    EXPECT_EQ(got[i].size_class, want[i].size_class);
    EXPECT_EQ(got[i].calls, want[i].calls);
    EXPECT_EQ(got[i].total_ns, want[i].total_ns);
  }
}

// The calls' time per step, API and size class, over the ranks: each call counted once, in the class of
// its bytes (1024 and 1500 bytes share [1 KiB, 2 KiB); 2048 is the next; 0 bytes its own), a call without
// a step nowhere.
TEST(StepModel, StepCallsSumEachStepsCallsByKind) {
  TempDir dir;
  const std::string path = dir.file("kinds.db");
  {
    StepTraceBuilder trace(path, 2);
    trace.collective(0, 0, 0, Api::MpiAllreduce, 0, 0, 100, 1024);
    trace.collective(1, 0, 0, Api::MpiAllreduce, 0, 0, 130, 1024);
    trace.collective(0, 1, 0, Api::MpiAllreduce, 200, 200, 207, 1500);
    trace.collective(1, 1, 0, Api::MpiAllreduce, 200, 200, 211, 2048);
    trace.collective(0, 2, 0, Api::MpiBarrier, 300, 300, 350, 0);
    trace.collective(1, 2, 0, Api::MpiBarrier, 300, 300, 320, 0);
    trace.collective(0, 3, -1, Api::MpiAllreduce, 400, 400, 900, 1024);  // an evaluation pass: no step
    trace.collective(1, 3, -1, Api::MpiAllreduce, 400, 400, 900, 1024);
    trace.collective(0, 4, 1, Api::MpiAllreduce, 1000, 1000, 1050, 1024);
    trace.collective(1, 4, 1, Api::MpiAllreduce, 1000, 1000, 1090, 1024);
    trace.finish();
  }
  const StepModel model = computeStepModel(TraceReader::open(path));
  expectStepCalls(model.step_calls, {
                                        {0, Api::MpiAllreduce, 10, 3, 100 + 130 + 7},
                                        {0, Api::MpiAllreduce, 11, 1, 11},
                                        {0, Api::MpiBarrier, -1, 2, 50 + 20},
                                        {1, Api::MpiAllreduce, 10, 2, 50 + 90},
                                    });
}

// More kinds in one rank's step than the tally sums in its short list (32), each kind twice, the second
// round after the list was flushed: every kind's two calls still add up to one row.
TEST(StepModel, StepCallsOfAStepWithManyKinds) {
  TempDir dir;
  const std::string path = dir.file("many.db");
  constexpr int kKinds = 40;
  {
    StepTraceBuilder trace(path, 1);
    std::int64_t t = 0, seq = 0;
    for (int round = 0; round < 2; ++round)
      for (int k = 0; k < kKinds; ++k, ++seq, t += 100)
        trace.collective(0, seq, 0, Api::MpiAllreduce, t, t, t + k + 1, std::int64_t{1} << k);
    trace.finish();
  }
  std::vector<StepCallTime> want;
  for (int k = 0; k < kKinds; ++k) want.push_back({0, Api::MpiAllreduce, k, 2, 2 * (k + 1)});
  expectStepCalls(computeStepModel(TraceReader::open(path)).step_calls, want);
}

TEST(StepModel, MergeStoresTheRowsAndTheReportShowsThem) {
  TempDir dir;
  const std::string input = dir.file("in.db"), merged = dir.file("merged.db");
  writeTwoRankSteps(input);
  const MergeSummary summary = mergeTraces({input}, merged, {});
  EXPECT_EQ(summary.step_rows, 6);
  const TraceReader reader = TraceReader::open(merged);
  expectRows(reader.steps(), computeStepModel(TraceReader::open(input)).steps);
  EXPECT_TRUE(TraceReader::open(input).steps().empty());  // written by merge only
  // The exposure too, bit for bit what the model computes; readOrComputeStepModel reads both back.
  const StepModel computed = computeStepModel(TraceReader::open(input));
  const auto sameExposure = [](const std::vector<CallExposure>& got, const std::vector<CallExposure>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].api, want[i].api);
      EXPECT_EQ(got[i].dtype, want[i].dtype);
      EXPECT_EQ(got[i].bytes, want[i].bytes);
      EXPECT_EQ(got[i].calls, want[i].calls);
      EXPECT_EQ(got[i].transport_ns, want[i].transport_ns);  // exact: REAL holds the double
      EXPECT_EQ(got[i].exposed_ns, want[i].exposed_ns);
    }
  };
  ASSERT_EQ(computed.exposure.size(), 2u);
  sameExposure(reader.exposure(), computed.exposure);
  const StepModel stored = readOrComputeStepModel(reader);
  expectRows(stored.steps, computed.steps);
  sameExposure(stored.exposure, computed.exposure);
  EXPECT_TRUE(TraceReader::open(input).exposure().empty());
  sameExposure(readOrComputeStepModel(TraceReader::open(input)).exposure, computed.exposure);
  // The calls' time per step and kind, and the tuner's reduction counts: stored as computed from the calls.
  ASSERT_EQ(computed.step_calls.size(), 6u);  // 3 steps x 2 APIs, all of 1 KiB
  expectStepCalls(reader.stepCalls(), computed.step_calls);
  expectStepCalls(stored.step_calls, computed.step_calls);
  EXPECT_TRUE(TraceReader::open(input).stepCalls().empty());
  const TraceReader::ReductionCounts counted = TraceReader::open(input).reductionCounts();
  const TraceReader::ReductionCounts read = reader.reductionCounts();
  EXPECT_EQ(read.steps, 3);
  EXPECT_EQ(read.ranks, 2);
  EXPECT_EQ(read.single_rank_calls, 0);
  ASSERT_EQ(read.sizes.size(), 2u);
  ASSERT_EQ(counted.sizes.size(), 2u);
  for (std::size_t i = 0; i < read.sizes.size(); ++i) {
    EXPECT_EQ(read.sizes[i].api, counted.sizes[i].api);
    EXPECT_EQ(read.sizes[i].dtype, counted.sizes[i].dtype);
    EXPECT_EQ(read.sizes[i].op, counted.sizes[i].op);
    EXPECT_EQ(read.sizes[i].bytes, counted.sizes[i].bytes);
    EXPECT_EQ(read.sizes[i].calls, 6);
    EXPECT_EQ(read.sizes[i].calls, counted.sizes[i].calls);
  }

  std::ostringstream text;
  cli::writeReport(reader, text, {});
  const std::string report = text.str();
  // Steps 0 and 1 last 1,000 ns, step 2 800: the median is step 0; rank 0 was last in every step.
  EXPECT_NE(report.find("Steps (3 steps on 2 ranks;"), std::string::npos) << report;
  EXPECT_NE(report.find("median (#0)"), std::string::npos) << report;
  EXPECT_NE(report.find("the ranks lost 300 ns waiting for the last to arrive"), std::string::npos) << report;
  EXPECT_NE(report.find("rank 0 was last in 3 of 3 steps, costing the others 300 ns: a slow rank or node"),
            std::string::npos)
      << report;
}

}  // namespace
}  // namespace gradscope::storage
