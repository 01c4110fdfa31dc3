// storage/steps.h: step detection from the repeating pattern of calls, on hand-made sequences with
// exact expected steps, against a brute-force form of the documented rule, and applied by merge.

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/steps.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using Steps = std::vector<std::int64_t>;

// One signature per letter: "XYABCABC" is two setup calls, then a loop of three calls.
std::vector<std::uint64_t> calls(std::string_view letters) {
  return {letters.begin(), letters.end()};
}

std::string repeat(std::string_view block, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += block;
  return out;
}

Steps detect(std::string_view letters, const StepDetectionOptions& options = {}) {
  return detectSteps(calls(letters), options);
}

TEST(StepDetection, SetupCallsThenLoop) {
  EXPECT_EQ(detect("XY" + repeat("ABC", 4)), (Steps{-1, -1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}));
}

TEST(StepDetection, LoopWithARepeatedCall) {
  EXPECT_EQ(detect(repeat("AAB", 4)), (Steps{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}));
}

TEST(StepDetection, RunOfIdenticalCallsInsideAStepIsNotAStep) {
  // [A A A] repeats three times from the first call, but the loop [A A A B] reaches farther.
  EXPECT_EQ(detect(repeat("AAAB", 4)), (Steps{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  // Identical layers: [A B] five times, then a last call, per step.
  Steps expected;
  for (std::int64_t step = 0; step < 4; ++step) expected.insert(expected.end(), 11, step);
  EXPECT_EQ(detect(repeat(repeat("AB", 5) + "C", 4)), expected);
}

TEST(StepDetection, IdenticalCallsAreOneStepEach) {
  EXPECT_EQ(detect("AAAAA"), (Steps{0, 1, 2, 3, 4}));
}

TEST(StepDetection, EvaluationPhaseInTheMiddleIsNotCounted) {
  EXPECT_EQ(detect(repeat("ABC", 3) + "DEFG" + repeat("ABC", 3)),
            (Steps{0, 0, 0, 1, 1, 1, 2, 2, 2, -1, -1, -1, -1, 3, 3, 3, 4, 4, 4, 5, 5, 5}));
}

TEST(StepDetection, PartialLastPeriodIsOneMoreStep) {
  EXPECT_EQ(detect(repeat("ABCD", 3) + "AB"), (Steps{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3}));
}

TEST(StepDetection, TooFewRepeatsDetectNothing) {
  EXPECT_EQ(detect("ABCABCX"), (Steps(7, -1)));
  EXPECT_EQ(detect("ABCABCX", {.max_period = 4096, .min_repeats = 2}), (Steps{0, 0, 0, 1, 1, 1, -1}));
  // Fewer than two repeats is taken as two: a single occurrence never makes a step.
  EXPECT_EQ(detect("ABCABCX", {.max_period = 4096, .min_repeats = 1}), (Steps{0, 0, 0, 1, 1, 1, -1}));
}

TEST(StepDetection, PeriodsLongerThanTheMaximumAreNotSteps) {
  const std::string sequence = repeat("ABCDE", 4);
  EXPECT_EQ(detect(sequence, {.max_period = 4, .min_repeats = 3}), (Steps(20, -1)));
  EXPECT_EQ(detect(sequence, {.max_period = 5, .min_repeats = 3}),
            (Steps{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3}));
  EXPECT_EQ(detect(sequence, {.max_period = 0, .min_repeats = 3}), (Steps(20, -1)));
}

TEST(StepDetection, EmptyInput) {
  EXPECT_EQ(detect(""), Steps{});
}

TEST(StepDetection, SetupCallLikeTheLoopsLastCallShiftsThePhase) {
  // The documented ambiguity: C, A B C, A B C, ... repeats from the first call with period 3.
  EXPECT_EQ(detect("C" + repeat("ABC", 3)), (Steps{0, 0, 0, 1, 1, 1, 2, 2, 2, 3}));
}

// The documented rule, tried for every period: at each position the repeating period whose stretch
// reaches farthest (ties: the smallest). Short sequences keep the implementation's candidate limit out
// of play (a period needs min_repeats · P <= n, so fewer than kMaxCandidates periods fit).
Steps bruteForce(const std::vector<std::uint64_t>& s, std::size_t repeats) {
  const std::size_t n = s.size();
  Steps steps(n, -1);
  std::int64_t next_step = 0;
  for (std::size_t i = 0; i < n;) {
    std::size_t best_period = 0, best_end = i;
    for (std::size_t period = 1; i + repeats * period <= n; ++period) {
      std::size_t end = i + period;
      while (end < n && s[end] == s[end - period]) ++end;
      if (end - i >= repeats * period && end > best_end) {
        best_end = end;
        best_period = period;
      }
    }
    if (best_period == 0) {
      ++i;
      continue;
    }
    for (std::size_t k = i; k < best_end; ++k)
      steps[k] = next_step + static_cast<std::int64_t>((k - i) / best_period);
    next_step += static_cast<std::int64_t>((best_end - i + best_period - 1) / best_period);
    i = best_end;
  }
  return steps;
}

TEST(StepDetection, MatchesTheRuleOnRandomSequences) {
  constexpr std::size_t kLength = 32;
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 5000; ++trial) {
    // Blocks of a small alphabet, each repeated a few times: loops, runs and noise.
    const auto alphabet = 2 + random() % 3;
    std::vector<std::uint64_t> s;
    while (s.size() < kLength) {
      std::vector<std::uint64_t> block(1 + random() % 6);
      for (auto& value : block) value = random() % alphabet;
      for (auto times = random() % 5; times > 0; --times) s.insert(s.end(), block.begin(), block.end());
    }
    s.resize(kLength);
    const auto repeats = static_cast<int>(2 + trial % 3);
    ASSERT_LE(kLength / static_cast<std::size_t>(repeats), std::size_t{kMaxCandidates});
    EXPECT_EQ(detectSteps(s, {.max_period = 4096, .min_repeats = repeats}),
              bruteForce(s, static_cast<std::size_t>(repeats)))
        << "trial " << trial;
  }
}

TEST(StepDetection, FindsTheStepsOfASyntheticTrainingJob) {
  // Per step: buckets of 24, 25, 25, 25 and 1 MiB (three equal in a row), the loss and the metrics.
  testing::SyntheticJob job;
  const auto synthetic = testing::syntheticRankCalls(job, 0, 0, 1);
  std::vector<std::uint64_t> signatures;
  Steps expected;
  for (const CallRecord& call : synthetic) {
    signatures.push_back(callSignature("world", call.api, call.dtype, call.op, call.count));
    expected.push_back(call.step);
  }
  EXPECT_EQ(detectSteps(signatures), expected);
}

TEST(StepDetection, SignatureDependsOnEveryField) {
  const auto base = callSignature("world", Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 100);
  EXPECT_EQ(base, callSignature("world", Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 100));
  EXPECT_NE(base, callSignature("other", Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 100));
  EXPECT_NE(base, callSignature("world", Api::MpiAllgather, DType::Fp32, ReduceOp::Sum, 100));
  EXPECT_NE(base, callSignature("world", Api::MpiAllreduce, DType::Bf16, ReduceOp::Sum, 100));
  EXPECT_NE(base, callSignature("world", Api::MpiAllreduce, DType::Fp32, ReduceOp::Max, 100));
  EXPECT_NE(base, callSignature("world", Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 101));
}

// ---------------------------------------------------------------------------------------------------
// Applied by merge

struct LoopCall {
  std::string comm;  // communicator key
  std::int64_t count = 0;
};

// Two setup calls, then five steps of [A A B C] on two communicators, then a partial step [A A]: the
// steps detection must find, and the calls' explicit step (-1 for none).
std::vector<LoopCall> loopCalls() {
  std::vector<LoopCall> calls = {{"world", 1}, {"world", 2}};
  for (int step = 0; step < 5; ++step)
    calls.insert(calls.end(), {{"world", 1000}, {"world", 1000}, {"pipeline", 1000}, {"world", 4}});
  calls.insert(calls.end(), {{"world", 1000}, {"world", 1000}});
  return calls;
}
const Steps kLoopSteps = {-1, -1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5};

// A per-rank file of the run "steps-run" holding `calls`. `unrelated_comms` communicators are added
// first, so that the same key gets a different file-local id on each rank.
// With `late_pipeline`, the calls on "pipeline" stand for nonblocking ones that the agent records when they
// complete: in every other step such a call is written after the call issued next (enqueue times keep
// the issue order).
void writeRankFile(const std::string& path, int rank, const std::vector<LoopCall>& loop,
                   const std::vector<std::int64_t>& explicit_steps, int unrelated_comms,
                   bool late_pipeline = false, bool skewed_times = false) {
  TraceWriter writer = TraceWriter::create(path);
  RunInfo run;
  run.uuid = "00000000-0000-4000-8000-00000000abcd";
  run.mode = "observe";
  run.world_size = 3;
  run.epoch_ns = 1'795'000'000'000'000'000;
  const std::int64_t run_id = writer.addRun(run);
  const std::int64_t rank_id = writer.addRank({0, run_id, rank, "node0", 100 + rank, "cpu", 0});
  for (int i = 0; i < unrelated_comms; ++i)
    writer.addComm({0, rank_id, fmt::format("unused-{}", i), Backend::Mpi, 1, 0});
  std::map<std::string, std::int64_t> comm_ids;
  for (const char* key : {"world", "pipeline"})
    comm_ids[key] = writer.addComm({0, rank_id, key, Backend::Mpi, 3, rank});
  std::vector<CallRecord> calls;
  for (std::size_t i = 0; i < loop.size(); ++i) {
    CallRecord call;
    call.rank_id = rank_id;
    call.comm_id = comm_ids.at(loop[i].comm);
    call.seq = static_cast<std::int64_t>(i);
    call.step = explicit_steps.empty() ? -1 : explicit_steps[i];
    call.api = Api::MpiAllreduce;
    call.dtype = DType::Fp32;
    call.op = ReduceOp::Sum;
    call.count = loop[i].count;
    call.bytes = 4 * call.count;
    call.start_ns = 1'000 * static_cast<std::int64_t>(i);
    call.enqueue_ns = call.start_ns;
    // Some calls' enqueue times a little before their predecessor's on the same communicator.
    if (skewed_times && i % 3 == 1 && loop[i].comm == "world" && loop[i - 1].comm == "world")
      call.enqueue_ns -= 1'500;
    call.end_ns = call.start_ns + 500;
    calls.push_back(call);
  }
  if (late_pipeline) {
    int pipeline_calls = 0;
    for (std::size_t i = 0; i + 1 < calls.size(); ++i)
      if (loop[i].comm == "pipeline" && pipeline_calls++ % 2 == 0) std::swap(calls[i], calls[i + 1]);
  }
  writer.appendCalls(calls);
  writer.finish(1'000'000);
}

// The steps of each rank's calls in call order, by rank number.
std::map<int, Steps> stepsByRank(const std::string& path) {
  const TraceReader reader = TraceReader::open(path);
  std::map<std::int64_t, int> rank_of;
  for (const RankInfo& rank : reader.ranks()) rank_of[rank.id] = rank.rank;
  std::map<int, Steps> steps;
  reader.forEachCall([&](const CallRecord& call) {
    steps[rank_of.at(call.rank_id)].push_back(call.step);
    return true;
  });
  return steps;
}

TEST(MergeSteps, DetectsStepsOfRanksWithoutMarkersAndKeepsExplicitOnes) {
  test::TempDir dir;
  const std::vector<LoopCall> loop = loopCalls();
  // Rank 2 marks its steps itself, differently from what detection would find.
  Steps marked(loop.size());
  for (std::size_t i = 0; i < marked.size(); ++i) marked[i] = 100 + static_cast<std::int64_t>(i / 8);
  writeRankFile(dir.file("rank-0.db"), 0, loop, {}, 0);
  writeRankFile(dir.file("rank-1.db"), 1, loop, {}, 2);
  writeRankFile(dir.file("rank-2.db"), 2, loop, marked, 1);

  const std::vector<std::string> inputs = {dir.file("rank-0.db"), dir.file("rank-1.db"),
                                           dir.file("rank-2.db")};
  const MergeSummary summary = mergeTraces(inputs, dir.file("merged.db"), {});
  EXPECT_EQ(summary.steps_detected, 6);
  const std::map<int, Steps> steps = stepsByRank(dir.file("merged.db"));
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps.at(0), kLoopSteps);
  EXPECT_EQ(steps.at(1), kLoopSteps);
  EXPECT_EQ(steps.at(2), marked);
  // Unknown steps stay NULL in the file, as the agent writes them.
  test::RawDb raw(dir.file("merged.db"));
  EXPECT_EQ(raw.integer("SELECT count(*) FROM calls WHERE step IS NULL"), 4);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM calls WHERE step < 0"), 0);
}

// Steps follow the order the rank issued its calls in, not the order they were written in.
TEST(MergeSteps, NonblockingCallsWrittenAtCompletionKeepTheirStep) {
  test::TempDir dir;
  writeRankFile(dir.file("rank-0.db"), 0, loopCalls(), {}, 0, /*late_pipeline=*/true);
  const MergeSummary summary = mergeTraces({dir.file("rank-0.db")}, dir.file("merged.db"), {});
  EXPECT_EQ(summary.steps_detected, 6);
  // Each swap stays within a step, so the steps in written order are the loop's.
  EXPECT_EQ(stepsByRank(dir.file("merged.db")).at(0), kLoopSteps);
}

// Enqueue times that disagree with the sequence numbers within a communicator (the agent converts
// times batch by batch, with a refined clock rate): seq decides.
TEST(MergeSteps, SequenceNumbersOrderTheCallsOfACommunicator) {
  test::TempDir dir;
  writeRankFile(dir.file("rank-0.db"), 0, loopCalls(), {}, 0, /*late_pipeline=*/false, /*skewed_times=*/true);
  const MergeSummary summary = mergeTraces({dir.file("rank-0.db")}, dir.file("merged.db"), {});
  EXPECT_EQ(summary.steps_detected, 6);
  EXPECT_EQ(stepsByRank(dir.file("merged.db")).at(0), kLoopSteps);
}

TEST(MergeSteps, DetectionCanBeTurnedOff) {
  test::TempDir dir;
  writeRankFile(dir.file("rank-0.db"), 0, loopCalls(), {}, 0);
  MergeOptions options;
  options.detect_steps = false;
  const MergeSummary summary = mergeTraces({dir.file("rank-0.db")}, dir.file("merged.db"), options);
  EXPECT_EQ(summary.steps_detected, 0);
  EXPECT_EQ(stepsByRank(dir.file("merged.db")).at(0), Steps(loopCalls().size(), -1));
}

// A graph-captured job: two calls captured once, then replayed (same seq as their capture) at every
// launch. Replays keep the places their times give them; ordered by seq they would come out A A A B B B.
TEST(MergeSteps, GraphReplaysArePlacedByTime) {
  test::TempDir dir;
  const std::string path = dir.file("rank-0.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "graph-run";
    const std::int64_t run_id = writer.addRun(run);
    const std::int64_t rank_id = writer.addRank({0, run_id, 0, "node0", 100, "gpu", 0});
    const std::int64_t comm = writer.addComm({0, rank_id, "world", Backend::Nccl, 1, 0});
    std::vector<CallRecord> calls;
    for (std::int64_t launch = 0; launch <= 4; ++launch)  // launch 0: the capture itself
      for (std::int64_t seq = 0; seq < 2; ++seq) {
        CallRecord call;
        call.rank_id = rank_id;
        call.comm_id = comm;
        call.seq = seq;
        call.graph_replay = launch;
        call.api = Api::NcclAllReduce;
        call.dtype = DType::Fp32;
        call.op = ReduceOp::Sum;
        call.count = seq == 0 ? 1024 : 256;
        call.bytes = 4 * call.count;
        call.enqueue_ns = call.start_ns = 1'000 * (2 * launch + seq);
        call.end_ns = call.start_ns + 500;
        calls.push_back(call);
      }
    writer.appendCalls(calls);
    writer.finish(1'000'000);
  }
  const MergeSummary summary = mergeTraces({path}, dir.file("merged.db"), {});
  EXPECT_EQ(summary.steps_detected, 5);
  EXPECT_EQ(stepsByRank(dir.file("merged.db")).at(0), (Steps{0, 0, 1, 1, 2, 2, 3, 3, 4, 4}));
}

TEST(MergeSteps, DetectsTheRanksOfAMergedFileWithoutSteps) {
  test::TempDir dir;
  writeRankFile(dir.file("rank-0.db"), 0, loopCalls(), {}, 0);
  writeRankFile(dir.file("rank-1.db"), 1, loopCalls(), {}, 3);
  MergeOptions without;
  without.detect_steps = false;
  mergeTraces({dir.file("rank-0.db"), dir.file("rank-1.db")}, dir.file("plain.db"), without);
  const MergeSummary summary = mergeTraces({dir.file("plain.db")}, dir.file("merged.db"), {});
  EXPECT_EQ(summary.steps_detected, 6);
  EXPECT_EQ(stepsByRank(dir.file("merged.db")), (std::map<int, Steps>{{0, kLoopSteps}, {1, kLoopSteps}}));
}

TEST(MergeSteps, ARankWithSomeMarkersIsLeftAlone) {
  test::TempDir dir;
  const std::vector<LoopCall> loop = loopCalls();
  Steps partly(loop.size(), -1);
  partly[10] = 7;
  writeRankFile(dir.file("rank-0.db"), 0, loop, partly, 0);
  const MergeSummary summary = mergeTraces({dir.file("rank-0.db")}, dir.file("merged.db"), {});
  EXPECT_EQ(summary.steps_detected, 0);
  EXPECT_EQ(stepsByRank(dir.file("merged.db")).at(0), partly);
}

// Explore mode writes consensus rows with step -1 when the job marks no steps: merge gives them the step
// it detected for their call (the row's call_id), in every file, whatever the file's id offset.
TEST(MergeSteps, ConsensusRowsWithoutAStepTakeTheDetectedStepOfTheirCall) {
  test::TempDir dir;
  const std::vector<LoopCall> loop = loopCalls();
  writeRankFile(dir.file("rank-0.db"), 0, loop, {}, 0);
  writeRankFile(dir.file("rank-1.db"), 1, loop, {}, 2);
  // Calls are ids 1.. in each file, in loop order: loop index i is id i + 1.
  for (const char* name : {"rank-0.db", "rank-1.db"}) {
    test::RawDb db(dir.file(name));
    const std::int64_t rank_id = db.integer("SELECT id FROM ranks");
    db.exec(fmt::format(
        "INSERT INTO consensus (rank_id, step, alpha, cosine_to_mean, grad_norm, diversity, call_id) "
        "VALUES ({0}, -1, 0.1, 1, 1, 0.5, 1), ({0}, -1, 0.2, 1, 1, 0.5, 6), ({0}, -1, 0.3, 1, 1, 0.5, 24)",
        rank_id));
  }
  const std::int64_t offset =
      static_cast<std::int64_t>(loop.size());  // rank 1's ids move up by rank 0's calls

  const auto consensusOf = [](const std::string& path) {
    const TraceReader reader = TraceReader::open(path);
    std::map<std::pair<std::int64_t, double>, std::pair<std::int64_t, std::int64_t>> out;  // (rank, alpha)
    for (const ConsensusRecord& row : reader.consensus())
      out[{row.rank_id, row.alpha}] = {row.step, row.call_id.value_or(0)};
    return out;
  };
  mergeTraces({dir.file("rank-0.db"), dir.file("rank-1.db")}, dir.file("merged.db"), {});
  // Loop index 0 is a setup call (no step), 5 is in step 0, 23 in step 5 (kLoopSteps).
  using Rows = std::map<std::pair<std::int64_t, double>, std::pair<std::int64_t, std::int64_t>>;
  EXPECT_EQ(consensusOf(dir.file("merged.db")), (Rows{{{0, 0.1}, {-1, 1}},
                                                      {{0, 0.2}, {kLoopSteps[5], 6}},
                                                      {{0, 0.3}, {kLoopSteps[23], 24}},
                                                      {{1, 0.1}, {-1, 1 + offset}},
                                                      {{1, 0.2}, {kLoopSteps[5], 6 + offset}},
                                                      {{1, 0.3}, {kLoopSteps[23], 24 + offset}}}));
  EXPECT_EQ(kLoopSteps[5], 0);
  EXPECT_EQ(kLoopSteps[23], 5);

  // Without detection the steps stay unknown; the calls are still followed.
  MergeOptions without;
  without.detect_steps = false;
  mergeTraces({dir.file("rank-0.db"), dir.file("rank-1.db")}, dir.file("plain.db"), without);
  EXPECT_EQ(consensusOf(dir.file("plain.db")), (Rows{{{0, 0.1}, {-1, 1}},
                                                     {{0, 0.2}, {-1, 6}},
                                                     {{0, 0.3}, {-1, 24}},
                                                     {{1, 0.1}, {-1, 1 + offset}},
                                                     {{1, 0.2}, {-1, 6 + offset}},
                                                     {{1, 0.3}, {-1, 24 + offset}}}));
}

}  // namespace
}  // namespace gradscope::storage
