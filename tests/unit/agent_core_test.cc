// The agent's recorder parts that need no MPI or NCCL: configuration, output templates, run ids,
// the per-thread buffers, the communicator registry and the clock conversion.

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/clock.h"
#include "core/comm_registry.h"
#include "core/config.h"
#include "core/recorder.h"
#include "core/shadow.h"
#include "core/thread_buffer.h"

namespace gradscope::agent {
namespace {

Environment environment(const std::map<std::string, std::string>& values) {
  return [values](const char* name) -> const char* {
    const auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  };
}

Config parse(const std::map<std::string, std::string>& values, std::vector<std::string>& errors) {
  return parseConfig(environment(values), errors);
}

TEST(AgentConfig, DefaultsWhenNothingIsSet) {
  std::vector<std::string> errors;
  const Config config = parse({}, errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_FALSE(config.disabled);
  EXPECT_EQ(config.output, "gradscope-%h-%p.db");
  EXPECT_EQ(config.flush_interval_ns, 50'000'000);
  EXPECT_EQ(config.buffer_calls, 65536u);
  EXPECT_EQ(config.max_call_rate, 50'000);
  EXPECT_EQ(config.step_calls, 0);
  EXPECT_TRUE(config.step_nvtx.empty());
  EXPECT_TRUE(config.run_id.empty());
  EXPECT_FALSE(config.env_rank.has_value());
  EXPECT_TRUE(config.writer_any_cpu);
}

TEST(AgentConfig, ParsesEveryVariable) {
  std::vector<std::string> errors;
  const Config config = parse({{"GRADSCOPE_OUTPUT", "/tmp/x/rank%r.db"},
                               {"GRADSCOPE_MODE", "observe"},
                               {"GRADSCOPE_FLUSH_INTERVAL", "2s"},
                               {"GRADSCOPE_BUFFER_CALLS", "1024"},
                               {"GRADSCOPE_MAX_CALL_RATE", "0"},
                               {"GRADSCOPE_STEP_CALLS", "7"},
                               {"GRADSCOPE_DISABLE", "0"},
                               {"GRADSCOPE_COMMAND", "train --fast"},
                               {"GRADSCOPE_WRITER_CPUS", "rank"},
                               {"OMPI_COMM_WORLD_RANK", "3"},
                               {"OMPI_COMM_WORLD_SIZE", "4"}},
                              errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(config.output, "/tmp/x/rank%r.db");
  EXPECT_EQ(config.flush_interval_ns, 2'000'000'000);
  EXPECT_EQ(config.buffer_calls, 1024u);
  EXPECT_EQ(config.max_call_rate, 0);
  EXPECT_EQ(config.step_calls, 7);
  EXPECT_EQ(config.command, "train --fast");
  EXPECT_FALSE(config.writer_any_cpu);
  EXPECT_EQ(config.env_rank, 3);
  EXPECT_EQ(config.env_world_size, 4);
}

TEST(AgentConfig, DurationsInEveryUnit) {
  for (const auto& [text, ns] : std::vector<std::pair<std::string, std::int64_t>>{
           {"50ms", 50'000'000}, {"100", 100'000'000}, {"1s", 1'000'000'000}, {"2000us", 2'000'000}}) {
    std::vector<std::string> errors;
    EXPECT_EQ(parse({{"GRADSCOPE_FLUSH_INTERVAL", text}}, errors).flush_interval_ns, ns) << text;
    EXPECT_TRUE(errors.empty()) << text;
  }
}

TEST(AgentConfig, EveryBadValueIsOneLineNamingTheVariable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"GRADSCOPE_FLUSH_INTERVAL", "banana"},
      {"GRADSCOPE_FLUSH_INTERVAL", "0ms"},
      {"GRADSCOPE_FLUSH_INTERVAL", "20s"},
      {"GRADSCOPE_FLUSH_INTERVAL", "-5ms"},
      {"GRADSCOPE_BUFFER_CALLS", "7"},
      {"GRADSCOPE_BUFFER_CALLS", "3000"},
      {"GRADSCOPE_BUFFER_CALLS", "99999999999"},
      {"GRADSCOPE_MAX_CALL_RATE", "-1"},
      {"GRADSCOPE_MAX_CALL_RATE", "9"},
      {"GRADSCOPE_MAX_CALL_RATE", "fast"},
      {"GRADSCOPE_MODE", "warp"},
      {"GRADSCOPE_EXPLORE_BUDGET", "0"},
      {"GRADSCOPE_EXPLORE_BUDGET", "150%"},
      {"GRADSCOPE_EXPLORE_BUDGET", "lots"},
      {"GRADSCOPE_EXPLORE_SAMPLES", "0"},
      {"GRADSCOPE_EXPLORE_REPS", "-1"},
      {"GRADSCOPE_EXPLORE_WARMUP", "x"},
      {"GRADSCOPE_SHADOW_BYTES", "64M"},
      {"GRADSCOPE_ALLOW_SEMANTIC_CHANGE", "perhaps"},
      {"GRADSCOPE_STEP_CALLS", "0"},
      {"GRADSCOPE_STEP_CALLS", "x"},
      {"GRADSCOPE_DISABLE", "maybe"},
      {"GRADSCOPE_WRITER_CPUS", "all"},
      {"GRADSCOPE_STEP_NVTX", ""},
      {"GRADSCOPE_VALIDATE_WINDOW", "-1"},
      {"GRADSCOPE_VALIDATE_WINDOW", "wide"},
      {"GRADSCOPE_VALIDATE_WINDOW", "20"},  // without apply mode
      {"GRADSCOPE_GPU_WINDOWS", "on"},
      {"GRADSCOPE_GPU_WINDOWS", "5/4"},
      {"GRADSCOPE_GPU_WINDOWS", "0/10"},
      {"GRADSCOPE_GPU_WINDOWS", "1s/500ms"},
      {"GRADSCOPE_GPU_WINDOWS", "1us/1s"},
      {"GRADSCOPE_GPU_WINDOWS", "1s/2h"}};
  for (const auto& [name, value] : bad) {
    std::vector<std::string> errors;
    parse({{name, value}}, errors);
    ASSERT_EQ(errors.size(), 1u) << name << "=" << value;
    EXPECT_NE(errors[0].find(name), std::string::npos) << errors[0];
    EXPECT_EQ(errors[0].find('\n'), std::string::npos) << errors[0];
  }
}

TEST(AgentConfig, ExploreAndApplySettings) {
  std::vector<std::string> errors;
  const Config explore =
      parse({{"GRADSCOPE_MODE", "explore"},
             {"GRADSCOPE_EXPLORE_BUDGET", "25%"},
             {"GRADSCOPE_EXPLORE_SAMPLES", "5"},
             {"GRADSCOPE_EXPLORE_WARMUP", "0"},
             {"GRADSCOPE_EXPLORE_SPACING", "3"},
             {"GRADSCOPE_EXPLORE_REPS", "4"},
             {"GRADSCOPE_EXPLORE_WARMUP_REPS", "1"},
             {"GRADSCOPE_EXPLORE_STRATEGIES", " sum/native, sum/rs_ag/bf16 ,,adacons/native"},
             {"GRADSCOPE_SHADOW_BYTES", "1048576"},
             {"GRADSCOPE_EXPLORE_LINKS", "0"}},
            errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(explore.mode, Mode::Explore);
  EXPECT_DOUBLE_EQ(explore.explore.budget, 0.25);
  EXPECT_EQ(explore.explore.samples, 5);
  EXPECT_EQ(explore.explore.warmup, 0);
  EXPECT_EQ(explore.explore.spacing, 3);
  EXPECT_EQ(explore.explore.reps, 4);
  EXPECT_EQ(explore.explore.warmup_reps, 1);
  EXPECT_EQ(explore.explore.strategies,
            (std::vector<std::string>{"sum/native", "sum/rs_ag/bf16", "adacons/native"}));
  EXPECT_EQ(explore.explore.shadow_bytes, 1 << 20);
  EXPECT_EQ(explore.explore.links, 0);
  EXPECT_EQ(parse({}, errors).explore.links, 1);
  std::vector<std::string> bad_links;
  parse({{"GRADSCOPE_EXPLORE_LINKS", "2"}}, bad_links);
  EXPECT_EQ(bad_links.size(), 1u);
  EXPECT_DOUBLE_EQ(parse({{"GRADSCOPE_EXPLORE_BUDGET", "0.05"}}, errors).explore.budget, 0.05);

  const Config apply = parse({{"GRADSCOPE_MODE", "apply"},
                              {"GRADSCOPE_RECOMMENDATION", "/plans/p.json"},
                              {"GRADSCOPE_ALLOW_SEMANTIC_CHANGE", "1"}},
                             errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(apply.mode, Mode::Apply);
  EXPECT_EQ(apply.recommendation, "/plans/p.json");
  EXPECT_TRUE(apply.allow_semantic_change);
  EXPECT_EQ(modeName(apply.mode), "apply");

  // Apply mode without a file is a configuration error: the job then runs untouched.
  std::vector<std::string> missing;
  parse({{"GRADSCOPE_MODE", "apply"}}, missing);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_NE(missing[0].find("GRADSCOPE_RECOMMENDATION"), std::string::npos) << missing[0];
}

// Every rank of a communicator sees the same calls in the same order, so the plan must come out the
// same from the same sequence whatever else happens; these pin the sequence itself.
TEST(ExplorePlan, SamplesEachKeyAfterItsWarmupAndStopsAtTheSampleCount) {
  ExplorePlan plan({.samples = 2, .warmup = 1, .spacing = 1, .max_bytes = 1 << 20});
  std::vector<int> sampled;
  for (int step = 0; step < 6; ++step) {
    const bool small = plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 400);
    const bool large = plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 40000);
    if (small) plan.done(0, Api::MpiAllreduce, DType::Fp32, 400, true);
    if (large) plan.done(0, Api::MpiAllreduce, DType::Fp32, 40000, true);
    sampled.push_back(int{small} + 2 * int{large});
  }
  EXPECT_EQ(sampled, (std::vector<int>{0, 3, 3, 0, 0, 0}));
}

TEST(ExplorePlan, SizesInOneBucketShareAKeyAndOtherKeysAreSeparate) {
  ExplorePlan plan({.samples = 1, .warmup = 0, .spacing = 1, .max_bytes = 1 << 20});
  EXPECT_TRUE(plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 1024));
  plan.done(0, Api::MpiAllreduce, DType::Fp32, 1024, true);
  EXPECT_FALSE(plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 2047));  // same bucket
  EXPECT_TRUE(plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 2048));   // next bucket
  EXPECT_TRUE(plan.sample(1, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 1024));   // other communicator
  EXPECT_TRUE(plan.sample(0, Api::MpiIallreduce, DType::Fp32, ReduceOp::Sum, 1024));  // other api
  EXPECT_TRUE(plan.sample(0, Api::MpiAllreduce, DType::Fp64, ReduceOp::Sum, 1024));   // other dtype
  EXPECT_EQ(ExplorePlan::bucketOf(1), 0);
  EXPECT_EQ(ExplorePlan::bucketOf(1024), 10);
  EXPECT_EQ(ExplorePlan::bucketOf(2047), 10);
}

TEST(ExplorePlan, OnlySumsOfFloatingPointThatFitTheArena) {
  ExplorePlan plan({.samples = 9, .warmup = 0, .spacing = 1, .max_bytes = 4096});
  EXPECT_FALSE(plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Max, 64));
  EXPECT_FALSE(plan.sample(0, Api::MpiAllreduce, DType::Int32, ReduceOp::Sum, 64));
  EXPECT_FALSE(plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 0));
  EXPECT_FALSE(plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 8192));
  EXPECT_TRUE(plan.sample(0, Api::MpiAllreduce, DType::Bf16, ReduceOp::Sum, 4096));
}

TEST(ExplorePlan, SpacingAndBackOffAfterARefusal) {
  ExplorePlan plan({.samples = 3, .warmup = 0, .spacing = 3, .max_bytes = 1 << 20});
  std::vector<int> tried;
  // Occurrences 0..: explored at 0, then 3; refused at 6 (back-off 1: next try 7), refused at 7
  // (back-off 2: next 9), explored at 9, the third sample.
  for (int occurrence = 0; occurrence < 16; ++occurrence) {
    if (!plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 100)) continue;
    tried.push_back(occurrence);
    plan.done(0, Api::MpiAllreduce, DType::Fp32, 100, occurrence != 6 && occurrence != 7);
  }
  EXPECT_EQ(tried, (std::vector<int>{0, 3, 6, 7, 9}));
}

// The budget goes to the calls that carry the most time first: while a key at least twice as heavy
// waits for the budget, a lighter key defers; once the heavy one is explored (or after 64 deferrals), the
// light one has its turn.
TEST(ExplorePlan, LighterKeysDeferToAHeavierOneWaitingForTheBudget) {
  ExplorePlan plan({.samples = 1, .warmup = 1, .spacing = 1, .max_bytes = 1 << 30});
  constexpr std::int64_t kLight = 64, kHeavy = 1 << 20;
  const auto step = [&](bool heavy_fits) {
    std::string tried;
    if (plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, kHeavy)) {
      tried += "H";
      plan.done(0, Api::MpiAllreduce, DType::Fp32, kHeavy, heavy_fits, !heavy_fits);
    }
    if (plan.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, kLight)) {
      tried += "L";
      plan.done(0, Api::MpiAllreduce, DType::Fp32, kLight, true);
    }
    return tried;
  };
  EXPECT_EQ(step(false), "");   // warm-up
  EXPECT_EQ(step(false), "H");  // the heavy key refused for the budget: the light one defers
  EXPECT_EQ(step(false), "H");  // retried (back-off 1), refused again; back-off 2 from here
  EXPECT_EQ(step(false), "");   // the heavy one waits out its back-off; the light one still defers
  EXPECT_EQ(step(true), "HL");  // the heavy one explored: the light one's turn
  EXPECT_EQ(step(true), "");

  // A heavy key on another communicator, or one seen no more, holds nothing up.
  ExplorePlan other({.samples = 1, .warmup = 0, .spacing = 1, .max_bytes = 1 << 30});
  EXPECT_TRUE(other.sample(1, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, kHeavy));
  other.done(1, Api::MpiAllreduce, DType::Fp32, kHeavy, false, true);
  EXPECT_TRUE(other.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, kLight));
  for (std::int64_t i = 0; i < ExplorePlan::kRecentCalls + 1; ++i)
    other.sample(1, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 2048);
  EXPECT_TRUE(other.sample(1, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, 64));

  // A heavy key the budget never fits holds a light one up at most kMaxDeferrals times.
  ExplorePlan stuck({.samples = 1, .warmup = 0, .spacing = 1, .max_bytes = 1 << 30});
  int deferred = 0;
  for (int i = 0; i < 200; ++i) {
    if (stuck.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, kHeavy))
      stuck.done(0, Api::MpiAllreduce, DType::Fp32, kHeavy, false, true);
    if (stuck.sample(0, Api::MpiAllreduce, DType::Fp32, ReduceOp::Sum, kLight)) break;
    ++deferred;
  }
  EXPECT_EQ(deferred, ExplorePlan::kMaxDeferrals);
}

// GRADSCOPE_GPU_WINDOWS: marked steps 1..S of every N (and the steps after them kept open by the tracer);
// otherwise the first D of every P of the Unix epoch; each form keeps the other's default.
TEST(AgentConfig, GpuWindows) {
  std::vector<std::string> errors;
  const GpuWindowConfig defaults = parse({}, errors).gpu_windows;
  EXPECT_FALSE(defaults.off);
  EXPECT_TRUE(defaults.stepSampled(1) && defaults.stepSampled(4) && defaults.stepSampled(101));
  EXPECT_FALSE(defaults.stepSampled(0) || defaults.stepSampled(5) || defaults.stepSampled(100));
  const GpuWindowConfig steps = parse({{"GRADSCOPE_GPU_WINDOWS", "2/4"}}, errors).gpu_windows;
  std::vector<std::int64_t> sampled;
  for (std::int64_t step = 0; step < 12; ++step)
    if (steps.stepSampled(step)) sampled.push_back(step);
  EXPECT_EQ(sampled, (std::vector<std::int64_t>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(steps.time_ns, defaults.time_ns);
  const GpuWindowConfig time = parse({{"GRADSCOPE_GPU_WINDOWS", "500ms/10s"}}, errors).gpu_windows;
  EXPECT_EQ(time.steps, defaults.steps);
  EXPECT_TRUE(time.timeSampled(1'795'000'000'000'000'000 + 499'999'999));
  EXPECT_FALSE(time.timeSampled(1'795'000'000'000'000'000 + 500'000'000));
  EXPECT_TRUE(parse({{"GRADSCOPE_GPU_WINDOWS", "off"}}, errors).gpu_windows.off);
  EXPECT_FALSE(parse({{"GRADSCOPE_GPU_WINDOWS", "off"}}, errors).gpu_windows.stepSampled(1));
  EXPECT_TRUE(errors.empty()) << errors.front();
}

TEST(AgentConfig, BothStepMarkersAreRefused) {
  std::vector<std::string> errors;
  parse({{"GRADSCOPE_STEP_CALLS", "4"}, {"GRADSCOPE_STEP_NVTX", "step"}}, errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("keep one"), std::string::npos);
}

TEST(AgentConfig, OutputTemplate) {
  EXPECT_EQ(expandOutputTemplate("out/rank%r-%h-%p.db", 2, 1234, "node7"), "out/rank2-node7-1234.db");
  EXPECT_EQ(expandOutputTemplate("100%%-%x-%", 0, 1, "h"), "100%-%x-%");
  EXPECT_EQ(expandOutputTemplate("plain.db", 0, 1, "h"), "plain.db");
}

// Whatever the host is called, %h stays one name inside the template's directory (issue 10: output
// templates cannot escape the chosen directory).
TEST(AgentConfig, OutputTemplateNeverLeavesItsDirectory) {
  EXPECT_EQ(expandOutputTemplate("out/%h/r.db", 0, 1, ".."), "out/__/r.db");
  EXPECT_EQ(expandOutputTemplate("out/%h/r.db", 0, 1, "."), "out/_/r.db");
  EXPECT_EQ(expandOutputTemplate("out/%h.db", 0, 1, "../../etc/passwd"), "out/.._.._etc_passwd.db");
  EXPECT_EQ(expandOutputTemplate("out/%h.db", 0, 1, "/abs"), "out/_abs.db");
  EXPECT_EQ(expandOutputTemplate("out/%h.db", 0, 1, ""), "out/host.db");
  EXPECT_EQ(expandOutputTemplate("out/r%r-%p.db", -1, -5, "h"), "out/r-1--5.db");
  EXPECT_EQ(gradscope::fileNameComponent("node-7.cluster_a"), "node-7.cluster_a");
  EXPECT_EQ(gradscope::fileNameComponent("a b\nc"), "a_b_c");
}

TEST(AgentConfig, HostNameIsSafeInAFileName) {
  const std::string host = hostName();
  EXPECT_FALSE(host.empty());
  EXPECT_TRUE(std::regex_match(host, std::regex("[A-Za-z0-9._-]+"))) << host;
}

TEST(AgentConfig, RunIdIsSharedByTheRanksOfOneJobAndDiffersBetweenJobs) {
  const std::regex uuid("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  // A uuid derived from a key is version 8 (launcher.h uuidFromKey), a random one version 4.
  const std::regex derived("[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  const std::string job_a = runIdFromLauncher(
      environment({{"OMPI_MCA_orte_precondition_transports", "abc-def"}, {"PMIX_NAMESPACE", "42"}}));
  const std::string job_a_again = runIdFromLauncher(
      environment({{"OMPI_MCA_orte_precondition_transports", "abc-def"}, {"PMIX_NAMESPACE", "42"}}));
  const std::string job_b = runIdFromLauncher(
      environment({{"OMPI_MCA_orte_precondition_transports", "abc-deg"}, {"PMIX_NAMESPACE", "42"}}));
  EXPECT_TRUE(std::regex_match(job_a, derived)) << job_a;
  EXPECT_EQ(job_a, job_a_again);
  EXPECT_NE(job_a, job_b);
  EXPECT_EQ(runIdFromLauncher(environment({{"GRADSCOPE_RUN_ID", "given"}, {"PMIX_NAMESPACE", "1"}})),
            "given");
  EXPECT_EQ(runIdFromLauncher(environment({})), "");
  EXPECT_TRUE(std::regex_match(randomUuid(), uuid));
  EXPECT_NE(randomUuid(), randomUuid());
}

// A job started with MPI_Comm_spawn inherits GRADSCOPE_RUN_ID, but is a world of its own: a run id of its
// own, the same on all its processes, different for each spawned job and from the parent's.
TEST(AgentConfig, ASpawnedJobHasARunOfItsOwn) {
  const std::string first = spawnedRunId("parent", environment({{"PMIX_NAMESPACE", "prterun-vm-1@2"}}));
  EXPECT_EQ(first, spawnedRunId("parent", environment({{"PMIX_NAMESPACE", "prterun-vm-1@2"}})));
  EXPECT_NE(first, spawnedRunId("parent", environment({{"PMIX_NAMESPACE", "prterun-vm-1@3"}})));
  EXPECT_NE(first, spawnedRunId("other", environment({{"PMIX_NAMESPACE", "prterun-vm-1@2"}})));
  EXPECT_NE(first, "parent");
  EXPECT_EQ(spawnedRunId("parent", environment({})), "");
}

CallEvent event(std::int64_t seq) {
  CallEvent e;
  e.header.seq = seq;
  e.call.count = seq * 3;
  return e;
}

TEST(ThreadBuffer, DrainsInOrderAndDropsWhenFull) {
  ThreadBuffer buffer(4);
  for (int i = 0; i < 6; ++i) buffer.push(event(i));
  EXPECT_EQ(buffer.dropped(), 2u);
  std::vector<std::int64_t> seen;
  EXPECT_EQ(buffer.drain([&](const CallEvent& e) { seen.push_back(e.header.seq); }), 4u);
  EXPECT_EQ(seen, (std::vector<std::int64_t>{0, 1, 2, 3}));
  // Once space is freed, recording resumes within kFullRecheck calls (the full ring re-reads the
  // consumer's position only that often); every call is either recorded, in order, or counted.
  const std::int64_t more = ThreadBuffer::kFullRecheck + 2;
  for (std::int64_t i = 6; i < 6 + more; ++i) buffer.push(event(i));
  seen.clear();
  buffer.drain([&](const CallEvent& e) { seen.push_back(e.header.seq); });
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(static_cast<std::int64_t>(seen.size() + buffer.dropped()), 6 + more - 4);
  EXPECT_EQ(seen.back(), 6 + more - 1);
}

// The in-place form writes straight into the ring.
TEST(ThreadBuffer, ReserveAndPublish) {
  ThreadBuffer buffer(4);
  CallEvent* slot = buffer.reserve();
  ASSERT_NE(slot, nullptr);
  *slot = event(7);
  EXPECT_EQ(buffer.drain([](const CallEvent&) {}), 0u);  // not visible before publish()
  buffer.publish();
  std::vector<std::int64_t> seen;
  buffer.drain([&](const CallEvent& e) { seen.push_back(e.header.seq); });
  EXPECT_EQ(seen, (std::vector<std::int64_t>{7}));
}

// The ring's pages are resident before the first record: a first-touch page fault on the hot path cost
// more than the rest of the agent (docs/agent.md, "Memory").
TEST(ThreadBuffer, EveryPageIsResidentBeforeTheFirstRecord) {
  constexpr std::uint32_t kCapacity = 65536;
  ThreadBuffer buffer(kCapacity);
  auto* first = reinterpret_cast<unsigned char*>(buffer.reserve());
  ASSERT_NE(first, nullptr);
  const long page = ::sysconf(_SC_PAGESIZE);
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(first) % static_cast<std::uintptr_t>(page), 0u);
  const std::size_t bytes = sizeof(CallEvent) * kCapacity;
  std::vector<unsigned char> resident((bytes + static_cast<std::size_t>(page) - 1) /
                                      static_cast<std::size_t>(page));
  ASSERT_EQ(::mincore(first, bytes, resident.data()), 0) << std::strerror(errno);
  EXPECT_EQ(std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1) == 0; }), 0)
      << "of " << resident.size() << " pages";
}

TEST(ThreadBuffer, DrainsAtMostTheBatchAskedFor) {
  ThreadBuffer buffer(8);
  for (int i = 0; i < 5; ++i) buffer.push(event(i));
  std::vector<std::int64_t> seen;
  EXPECT_EQ(buffer.drain([&](const CallEvent& e) { seen.push_back(e.header.seq); }, 3), 3u);
  EXPECT_EQ(buffer.drain([&](const CallEvent& e) { seen.push_back(e.header.seq); }, 3), 2u);
  EXPECT_EQ(buffer.drain([&](const CallEvent& e) { seen.push_back(e.header.seq); }, 3), 0u);
  EXPECT_EQ(seen, (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
}

// A producer and a consumer on two threads (run under TSan in CI): every record arrives once, in
// order, intact, or is counted as dropped.
TEST(ThreadBuffer, ConcurrentProducerAndConsumerLoseNothingUncounted) {
  ThreadBuffer buffer(1024);
  constexpr std::int64_t kRecords = 200000;
  std::atomic<bool> done{false};
  std::thread producer([&] {
    for (std::int64_t i = 0; i < kRecords; ++i) buffer.push(event(i));
    done.store(true);
  });
  std::int64_t received = 0, last = -1;
  bool ordered = true, intact = true;
  auto visit = [&](const CallEvent& e) {
    ordered = ordered && e.header.seq > last;
    intact = intact && e.call.count == e.header.seq * 3;
    last = e.header.seq;
    ++received;
  };
  while (!done.load()) buffer.drain(visit);
  buffer.drain(visit);
  producer.join();
  EXPECT_TRUE(ordered);
  EXPECT_TRUE(intact);
  EXPECT_EQ(received + static_cast<std::int64_t>(buffer.dropped()), kRecords);
}

// The recording rate limit, on a fake clock: `calls` records per window, the rest counted and not timed
// (the clock is read only every kRateRecheck calls over the limit), a new window once the clock passes
// the end of the last.
TEST(ThreadBuffer, RateLimitAdmitsAWindowsCallsAndCountsTheRestWithoutTimingThem) {
  ThreadBuffer buffer(1024);
  const ThreadBuffer::RateLimit limit{/*window_ticks=*/1000, /*window_calls=*/3};
  std::uint64_t clock = 5000;
  int reads = 0;
  const auto now = [&] {
    ++reads;
    return clock;
  };
  std::uint64_t start = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(buffer.admit(limit, now, start)) << i;
    EXPECT_EQ(start, clock);
    clock += 10;
  }
  EXPECT_EQ(reads, 3);
  // Over the limit: 2 × kRateRecheck calls, of which 2 look at the clock (the window has not ended).
  for (std::uint32_t i = 0; i < 2 * ThreadBuffer::kRateRecheck; ++i)
    EXPECT_FALSE(buffer.admit(limit, now, start));
  EXPECT_EQ(reads, 5);
  EXPECT_EQ(buffer.rateDropped(), 2u * ThreadBuffer::kRateRecheck);
  // The window (from tick 5000) ends at 6000: the next look at the clock opens a new one.
  clock = 6000;
  int admitted = 0;
  for (std::uint32_t i = 0; i < ThreadBuffer::kRateRecheck; ++i)
    admitted += buffer.admit(limit, now, start) ? 1 : 0;
  EXPECT_EQ(admitted, 3);  // the call that saw the new window and the window's other two
  EXPECT_EQ(buffer.rateDropped(), 3u * ThreadBuffer::kRateRecheck - 3);
}

// A window ends by the clock even when its calls are not spent: the next window has all its calls.
TEST(ThreadBuffer, RateLimitWindowEndsByTheClock) {
  ThreadBuffer buffer(16);
  const ThreadBuffer::RateLimit limit{/*window_ticks=*/1000, /*window_calls=*/3};
  std::uint64_t clock = 0, start = 0;
  const auto now = [&] { return clock; };
  ASSERT_TRUE(buffer.admit(limit, now, start));
  clock = 1500;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(buffer.admit(limit, now, start)) << i;
  EXPECT_FALSE(buffer.admit(limit, now, start));
  EXPECT_EQ(buffer.rateDropped(), 1u);
}

TEST(ThreadBuffer, NoRateLimitTimesEveryCall) {
  ThreadBuffer buffer(16);
  std::uint64_t clock = 0, start = 0;
  for (int i = 0; i < 1000; ++i)
    ASSERT_TRUE(buffer.admit(
        {}, [&] { return ++clock; }, start));
  EXPECT_EQ(start, 1000u);
  EXPECT_EQ(buffer.rateDropped(), 0u);
}

// A buffer reused by a new thread starts a window at that thread's first call, whatever its last owner
// left.
TEST(ThreadBufferTable, AReusedBufferStartsANewRateWindow) {
  ThreadBufferTable table(1024);
  ThreadBuffer* buffer = table.claim();
  ASSERT_NE(buffer, nullptr);
  const ThreadBuffer::RateLimit limit{1'000'000, 1};
  std::uint64_t start = 0;
  const auto now = [] { return std::uint64_t{100}; };
  ASSERT_TRUE(buffer->admit(limit, now, start));
  EXPECT_FALSE(buffer->admit(limit, now, start));  // spent, and the window lasts
  ThreadBufferTable::release(buffer);
  buffer->state.store(ThreadBuffer::kFree);
  ASSERT_EQ(table.claim(), buffer);
  EXPECT_TRUE(buffer->admit(limit, now, start));
}

TEST(ThreadBufferTable, ReusesTheBufferOfAnExitedThreadOnlyOnceFree) {
  ThreadBufferTable table(1024);
  ThreadBuffer* first = table.claim();
  ASSERT_NE(first, nullptr);
  ThreadBufferTable::release(first);
  ThreadBuffer* second = table.claim();  // orphaned, not yet drained: not reused
  EXPECT_NE(second, first);
  first->state.store(ThreadBuffer::kFree);  // what the background thread does after draining it
  EXPECT_EQ(table.claim(), first);
  EXPECT_EQ(table.size(), 2u);
}

TEST(ThreadBufferTable, FullTableReturnsNull) {
  ThreadBufferTable table(1024);
  for (std::size_t i = 0; i < ThreadBufferTable::kMaxThreadBuffers; ++i) ASSERT_NE(table.claim(), nullptr);
  EXPECT_EQ(table.claim(), nullptr);
}

// The background writer leaves its rank's one-core binding: a thread pinned to one CPU, as a launcher
// pins a rank's threads, may afterwards run on every CPU the process was allowed before the pinning.
TEST(WriterAffinity, AThreadPinnedToOneCpuIsUnboundToEveryAllowedCpu) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  const int cpus = CPU_COUNT(&allowed);
  if (cpus < 2) GTEST_SKIP() << "one CPU allowed: nothing to unbind to";
  std::size_t first = 0;
  while (!CPU_ISSET(first, &allowed)) ++first;
  int before = 0, after = 0;
  bool unbound = false;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    cpu_set_t now;
    pthread_getaffinity_np(pthread_self(), sizeof now, &now);
    before = CPU_COUNT(&now);
    unbound = unbindCallingThread();
    pthread_getaffinity_np(pthread_self(), sizeof now, &now);
    after = CPU_COUNT(&now);
  }).join();
  EXPECT_EQ(before, 1);
  EXPECT_TRUE(unbound);
  EXPECT_EQ(after, cpus);
}

TEST(CommRegistry, FindsAddsAndRetires) {
  CommRegistry registry;
  int a = 0, b = 0;
  EXPECT_EQ(registry.find(&a), nullptr);
  CommSlot* slot_a = registry.add(&a, {Backend::Mpi, "world", 4, 1});
  ASSERT_NE(slot_a, nullptr);
  CommSlot* slot_b = registry.add(&b, {Backend::Mpi, "world/s0@0", 2, 0});
  EXPECT_EQ(registry.find(&a), slot_a);
  EXPECT_EQ(registry.find(&b), slot_b);
  EXPECT_EQ(registry.find(&a), slot_a);
  EXPECT_EQ(slot_a->index, 0u);
  EXPECT_EQ(slot_b->index, 1u);
  EXPECT_EQ(slot_b->size, 2);
  EXPECT_EQ(registry.description(1).key, "world/s0@0");

  // A freed handle that the library hands out again is a new communicator: a new slot, seq from 0.
  slot_a->seq.store(5);
  registry.retire(&a);
  EXPECT_EQ(registry.find(&a), nullptr);
  CommSlot* again = registry.add(&a, {Backend::Mpi, "world/d1@0", 4, 1});
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->index, 2u);
  EXPECT_EQ(again->seq.load(), 0);
  EXPECT_EQ(registry.find(&a), again);
  EXPECT_EQ(registry.size(), 3u);
}

// A key given before (a communicator registered again under the same name) never reaches the trace twice:
// the comms table's UNIQUE (rank_id, key) would refuse it and stop the recording.
TEST(CommRegistry, AKeyGivenBeforeIsMadeDistinct) {
  CommRegistry registry;
  int a = 0, b = 0, c = 0;
  ASSERT_NE(registry.add(&a, {Backend::Mpi, "world", 2, 1}), nullptr);
  registry.retire(&a);
  ASSERT_NE(registry.add(&b, {Backend::Mpi, "world", 2, 1}), nullptr);
  ASSERT_NE(registry.add(&c, {Backend::Mpi, "world", 2, 1}), nullptr);
  EXPECT_EQ(registry.description(0).key, "world");
  EXPECT_EQ(registry.description(1).key, "world@1");
  EXPECT_EQ(registry.description(2).key, "world@1#1");
}

// The background thread converts each batch of records after refining the rate, so consecutive calls
// are converted under different refinements. A first rate 0.2% too low (the TSC really runs at 1 tick
// per ns here) must not make a later tick convert to an earlier time, and the map must come onto the
// true clock as it learns the rate.
TEST(ClockConversion, LaterTicksNeverConvertEarlierAcrossRefinements) {
  constexpr std::int64_t kMono0 = 1'000'000'000, kEpoch = 1'700'000'000'000'000'000;
  ClockConversion clock(/*tsc=*/true, /*anchor_ticks=*/5000, kMono0, kEpoch - kMono0, /*ticks_per_ns=*/0.998);
  std::int64_t last = kEpoch, worst_backwards = 0;
  std::uint64_t tick = 5000;
  for (std::int64_t ms = 1; ms <= 2000; ++ms) {
    // A flush every 50 ms: refine, then convert the calls of the last 50 ms (one per 10 µs).
    if (ms % 50 != 0) continue;
    const std::uint64_t now = 5000 + static_cast<std::uint64_t>(ms) * 1'000'000;
    clock.refineAt(now, kMono0 + ms * 1'000'000);
    for (; tick < now; tick += 10'000) {
      const std::int64_t converted = clock.toEpochNs(tick);
      worst_backwards = std::max(worst_backwards, last - converted);
      last = converted;
    }
  }
  EXPECT_LE(worst_backwards, 0) << "a later tick converted " << worst_backwards << " ns earlier";
  // After 2 s the map is on the true clock (epoch + ticks since the anchor) within a microsecond.
  const std::uint64_t end = 5000 + 2'000'000'000ULL;
  EXPECT_NEAR(static_cast<double>(clock.toEpochNs(end)), static_cast<double>(kEpoch + 2'000'000'000LL),
              1000.0);
  EXPECT_NEAR(clock.ticksPerNs(), 1.0, 1e-9);
}

// Refinements come at intervals that grow with the run: a day of flushes every 50 ms adds a few hundred
// segments, not 1.7 million.
TEST(ClockConversion, ADayOfFlushesKeepsAFewHundredSegments) {
  ClockConversion clock(/*tsc=*/true, 0, 0, 0, /*ticks_per_ns=*/2.5);
  for (std::int64_t ms = 50; ms <= 86'400'000; ms += 50)
    clock.refineAt(static_cast<std::uint64_t>(ms) * 2'500'000, ms * 1'000'000);
  EXPECT_LT(clock.segments(), 400u);
  EXPECT_NEAR(static_cast<double>(clock.toEpochNs(86'400'000ULL * 2'500'000)), 86'400'000'000'000.0, 1000.0);
}

// A calibration pair is the clock read between two tick reads, the tightest of a few tries: a read that
// stalls (the first clock_gettime of a process binds its symbol, tens of µs) is not the one kept. Two plain
// reads in a row took that stall into the anchor and made the first rate 2% off.
TEST(ClockConversion, ACalibrationPairSkipsAStalledRead) {
  static int mono_reads = 0;
  mono_reads = 0;
  const auto fake_ticks = [] { return static_cast<std::uint64_t>(monotonicNs()); };  // ticks in ns
  const auto stalling_mono = [] {
    if (mono_reads++ == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    return monotonicNs();
  };
  const ClockPair pair = readClockPair(fake_ticks, stalling_mono);
  EXPECT_EQ(mono_reads, 5);
  // Off by half the kept bracket at most: a few µs even on a loaded machine, not the 200 µs stall.
  EXPECT_LT(std::llabs(pair.mono_ns - static_cast<std::int64_t>(pair.tick)), 20'000);
}

TEST(ClockConversion, TicksConvertToTheWallClock) {
  chooseTickSource();
  ClockConversion clock;
  // The wall clock read between two tick reads, the tightest of a few tries.
  const auto error_now = [&] {
    const ClockPair wall = readClockPair(ticks, realtimeNs);
    return clock.toEpochNs(wall.tick) - wall.mono_ns;
  };
  // 20 ms on the first rate alone, then after a refinement. Calibration pairs read within ~100 ns of each
  // other put the first rate within 1e-4 (2 µs at 20 ms); when each pair was two plain reads in a row, a
  // slow first clock_gettime made the rate 2% off (400 µs at 20 ms). 50 µs leaves room for a loaded
  // machine and the sanitizers' clocks.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_LT(std::llabs(error_now()), 50'000) << "ticks are TSC: " << g_ticks_are_tsc;
  clock.refine();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_LT(std::llabs(error_now()), 50'000) << "ticks are TSC: " << g_ticks_are_tsc;
  // Monotonic: later ticks never convert to earlier times.
  const std::uint64_t t0 = ticks();
  const std::uint64_t t1 = ticks();
  EXPECT_LE(clock.toEpochNs(t0), clock.toEpochNs(t1));
}

}  // namespace
}  // namespace gradscope::agent
