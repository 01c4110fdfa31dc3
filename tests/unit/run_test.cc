// cli/run.h: `gradscope run`. Its pure parts (launcher rewriting, rank detection, names, environment),
// the post-job merge and summary on files written here, and the command end to end with a stand-in
// agent (libc, which preloading leaves unchanged) and jobs that are plain shell commands: no MPI needed.

#include "gradscope/cli/run.h"

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradscope/cli/report.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::cli {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

const std::vector<std::string> kVariables = {"LD_PRELOAD", "GRADSCOPE_OUTPUT", "GRADSCOPE_RUN_ID"};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------------
// Launchers

TEST(RunLauncher, OpenMpiGetsTheVariablesRightAfterTheLauncher) {
  const std::vector<std::string> command = {"mpirun", "-np", "4", "./train", "--lr", "0.1"};
  EXPECT_EQ(launcherCommand(command, Launcher::OpenMpi, kVariables),
            (std::vector<std::string>{"mpirun", "-x", "LD_PRELOAD", "-x", "GRADSCOPE_OUTPUT", "-x",
                                      "GRADSCOPE_RUN_ID", "-np", "4", "./train", "--lr", "0.1"}));
  // Launchers that pass the environment on, and plain commands, are left alone.
  EXPECT_EQ(launcherCommand({"srun", "-n", "4", "./train"}, Launcher::Other, kVariables),
            (std::vector<std::string>{"srun", "-n", "4", "./train"}));
  EXPECT_EQ(launcherCommand({"./train"}, Launcher::None, kVariables), (std::vector<std::string>{"./train"}));
  EXPECT_EQ(launcherCommand({"/opt/ompi/bin/mpirun"}, Launcher::OpenMpi, {"LD_PRELOAD"}),
            (std::vector<std::string>{"/opt/ompi/bin/mpirun", "-x", "LD_PRELOAD"}));
}

TEST(RunLauncher, EveryApplicationContextOfAnMpmdCommandGetsTheVariables) {
  EXPECT_EQ(
      launcherCommand({"mpirun", "-np", "1", "./a", ":", "-np", "2", "./b", "x:y"}, Launcher::OpenMpi,
                      {"LD_PRELOAD", "GRADSCOPE_MODE"}),
      (std::vector<std::string>{"mpirun", "-x", "LD_PRELOAD", "-x", "GRADSCOPE_MODE", "-np", "1", "./a", ":",
                                "-x", "LD_PRELOAD", "-x", "GRADSCOPE_MODE", "-np", "2", "./b", "x:y"}));
}

TEST(RunMode, ExploreAndApplyReachTheJobsEnvironment) {
  RunOptions explore;
  explore.mode = Mode::Explore;
  explore.explore_budget = "5%";
  Environment job = jobEnvironment({}, "/a/agent.so", "/out", "u", "x");
  setModeEnvironment(job, explore);
  EXPECT_EQ(job.at("GRADSCOPE_MODE"), "explore");
  EXPECT_EQ(job.at("GRADSCOPE_EXPLORE_BUDGET"), "5%");
  // Dynamic rules let the agent force an algorithm on its own communicators; the user's choice stays.
  EXPECT_EQ(job.at("OMPI_MCA_coll_tuned_use_dynamic_rules"), "1");
  const auto forwarded = variablesToForward(job);
  EXPECT_NE(std::find(forwarded.begin(), forwarded.end(), "OMPI_MCA_coll_tuned_use_dynamic_rules"),
            forwarded.end());
  Environment mine =
      jobEnvironment({{"OMPI_MCA_coll_tuned_use_dynamic_rules", "0"}}, "/a/agent.so", "/out", "u", "x");
  setModeEnvironment(mine, explore);
  EXPECT_EQ(mine.at("OMPI_MCA_coll_tuned_use_dynamic_rules"), "0");

  RunOptions apply;
  apply.mode = Mode::Apply;
  apply.recommendation = "plan.json";
  apply.allow_semantic_change = true;
  Environment applied = jobEnvironment({}, "/a/agent.so", "/out", "u", "x");
  setModeEnvironment(applied, apply);
  EXPECT_EQ(applied.at("GRADSCOPE_MODE"), "apply");
  EXPECT_TRUE(applied.at("GRADSCOPE_RECOMMENDATION").starts_with("/")) << "made absolute for the ranks";
  EXPECT_TRUE(applied.at("GRADSCOPE_RECOMMENDATION").ends_with("/plan.json"));
  EXPECT_EQ(applied.at("GRADSCOPE_ALLOW_SEMANTIC_CHANGE"), "1");
  EXPECT_EQ(applied.at("OMPI_MCA_coll_tuned_use_dynamic_rules"), "1");  // for mpi.<algorithm> rules
}

TEST(RunNcclPlugins, FoundInTheBuildTreeOrTheInstallAndLoadedIntoNccl) {
  const TempDir dir;
  const std::string bin = dir.makeSubdir("bin");
  EXPECT_TRUE(findNcclPlugins(bin).tuner.empty());
  EXPECT_TRUE(findNcclPlugins(bin).profiler.empty());
  const std::string installed = installedPrivateDirectory(bin);
  std::filesystem::create_directories(installed);
  test::writeFile(installed + "/libnccl-tuner-gradscope.so", "elf");
  test::writeFile(installed + "/libnccl-profiler-gradscope.so", "elf");
  EXPECT_EQ(findNcclPlugins(bin).tuner, installed + "/libnccl-tuner-gradscope.so");
  dir.makeSubdir("plugins");
  dir.makeSubdir("plugins/nccl-profiler");  // the build tree comes first
  test::writeFile(dir.file("plugins/nccl-profiler/libnccl-profiler-gradscope.so"), "elf");
  const NcclPlugins plugins = findNcclPlugins(bin);
  EXPECT_EQ(plugins.profiler, dir.file("plugins/nccl-profiler/libnccl-profiler-gradscope.so"));

  // Observe: the profiler only; apply: the tuner too, reading the recommendation.
  RunOptions observe;
  Environment job = jobEnvironment({}, "/a/agent.so", "/out", "u", "x");
  setModeEnvironment(job, observe);
  setNcclPluginEnvironment(job, plugins, observe);
  EXPECT_EQ(job.at("NCCL_PROFILER_PLUGIN"), plugins.profiler);
  EXPECT_EQ(job.count("NCCL_TUNER_PLUGIN"), 0u);
  RunOptions apply;
  apply.mode = Mode::Apply;
  apply.recommendation = "/plans/plan.json";
  Environment applied = jobEnvironment({}, "/a/agent.so", "/out", "u", "x");
  setModeEnvironment(applied, apply);
  setNcclPluginEnvironment(applied, plugins, apply);
  EXPECT_EQ(applied.at("NCCL_TUNER_PLUGIN"), plugins.tuner);
  EXPECT_EQ(applied.at("GRADSCOPE_TUNER_CONFIG"), "/plans/plan.json");
  const auto forwarded = variablesToForward(applied);
  for (const char* name : {"NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "GRADSCOPE_TUNER_CONFIG"})
    EXPECT_NE(std::find(forwarded.begin(), forwarded.end(), name), forwarded.end()) << name;
  // The user's own plugin choices (another plugin, or none) stay.
  Environment mine = jobEnvironment({{"NCCL_TUNER_PLUGIN", "none"}, {"NCCL_PROFILER_PLUGIN", "inspector"}},
                                    "/a/agent.so", "/out", "u", "x");
  setModeEnvironment(mine, apply);
  setNcclPluginEnvironment(mine, plugins, apply);
  EXPECT_EQ(mine.at("NCCL_TUNER_PLUGIN"), "none");
  EXPECT_EQ(mine.at("NCCL_PROFILER_PLUGIN"), "inspector");
  EXPECT_EQ(mine.count("GRADSCOPE_TUNER_CONFIG"), 0u);
  // gradscope's own tuner named already (module load gradscope sets the installed one's path): kept, and
  // it gets the plan, or apply mode would leave NCCL's choices alone.
  for (const char* named : {"gradscope", "/opt/gs/lib/gradscope/libnccl-tuner-gradscope.so"}) {
    Environment loaded = jobEnvironment({{"NCCL_TUNER_PLUGIN", named}}, "/a/agent.so", "/out", "u", "x");
    setModeEnvironment(loaded, apply);
    setNcclPluginEnvironment(loaded, NcclPlugins{}, apply);
    EXPECT_EQ(loaded.at("NCCL_TUNER_PLUGIN"), named);
    EXPECT_EQ(loaded.at("GRADSCOPE_TUNER_CONFIG"), "/plans/plan.json") << named;
  }
  EXPECT_FALSE(namesGradscopeTuner("/opt/aws/lib/libnccl-tuner-ofi.so"));
  EXPECT_FALSE(namesGradscopeTuner("none"));
}

TEST(RunLauncher, ClassifiesLaunchersByNameAndByWhatTheyLeadTo) {
  const TempDir dir;
  const auto file = [&](const std::string& name) {
    test::writeFile(dir.file(name), "#!/bin/sh\n");
    return dir.file(name);
  };
  const auto link = [&](const std::string& name, const std::string& target) {
    fs::create_symlink(target, dir.file(name));
    return dir.file(name);
  };
  EXPECT_EQ(classifyLauncher("./train", dir.file("train")), Launcher::None);
  EXPECT_EQ(classifyLauncher("python3", "/usr/bin/python3"), Launcher::None);
  EXPECT_EQ(classifyLauncher("srun", "/usr/bin/srun"), Launcher::Other);
  EXPECT_EQ(classifyLauncher("torchrun", "/usr/bin/torchrun"), Launcher::Other);
  EXPECT_EQ(classifyLauncher("orterun", "/usr/bin/orterun"), Launcher::OpenMpi);
  EXPECT_EQ(classifyLauncher("oshrun", ""), Launcher::OpenMpi);

  const TempDir other;  // mpirun with no evidence of its MPI: not Open MPI, so no -x that Hydra refuses
  test::writeFile(other.file("mpirun"), "#!/bin/sh\n");
  EXPECT_EQ(classifyLauncher("mpirun", other.file("mpirun")), Launcher::Other);
  EXPECT_EQ(classifyLauncher("mpirun", ""), Launcher::Other);

  // Debian's alternatives: mpirun -> orterun (Open MPI), mpiexec -> mpiexec.hydra (MPICH).
  link("mpirun", file("orterun"));
  link("mpiexec", file("mpiexec.hydra"));
  EXPECT_EQ(classifyLauncher("mpirun", dir.file("mpirun")), Launcher::OpenMpi);
  EXPECT_EQ(classifyLauncher("mpiexec", dir.file("mpiexec")), Launcher::Other);
  // A plain mpirun with ompi_info beside it (Open MPI built from source).
  const TempDir ompi;
  test::writeFile(ompi.file("mpiexec"), "#!/bin/sh\n");
  test::writeFile(ompi.file("ompi_info"), "#!/bin/sh\n");
  EXPECT_EQ(classifyLauncher("mpiexec", ompi.file("mpiexec")), Launcher::OpenMpi);
}

// ---------------------------------------------------------------------------------------------------
// A gradscope started by a launcher

TEST(RunLaunchedRank, DetectsOpenMpiPmiSlurmAndTorchrun) {
  EXPECT_FALSE(detectLaunch(environmentOf({})).has_value());
  EXPECT_FALSE(
      detectLaunch(environmentOf({{"HOME", "/root"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}})).has_value());

  auto rank = detectLaunch(environmentOf({{"OMPI_COMM_WORLD_RANK", "3"},
                                          {"OMPI_COMM_WORLD_SIZE", "4"},
                                          {"OMPI_MCA_ess_base_jobid", "216399873"}}));
  ASSERT_TRUE(rank.has_value());
  EXPECT_EQ(rank->rank, 3);
  EXPECT_EQ(rank->world_size, 4);
  EXPECT_EQ(rank->job_id, "216399873");

  // Open MPI 5's namespace, sanitised; it wins over the older jobid.
  rank = detectLaunch(environmentOf({{"OMPI_COMM_WORLD_RANK", "0"},
                                     {"OMPI_COMM_WORLD_SIZE", "2"},
                                     {"OMPI_MCA_ess_base_jobid", "1"},
                                     {"PMIX_NAMESPACE", "prterun-node 7/12@1"}}));
  ASSERT_TRUE(rank.has_value());
  EXPECT_EQ(rank->job_id, "prterun-node_7_12_1");

  rank = detectLaunch(environmentOf({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));  // Hydra: no job id
  ASSERT_TRUE(rank.has_value());
  EXPECT_EQ(rank->rank, 1);
  EXPECT_EQ(rank->job_id, "");

  rank = detectLaunch(environmentOf({{"SLURM_PROCID", "5"},
                                     {"SLURM_NTASKS", "8"},
                                     {"SLURM_STEP_NUM_TASKS", "6"},
                                     {"SLURM_JOB_ID", "991"},
                                     {"SLURM_STEP_ID", "2"}}));
  ASSERT_TRUE(rank.has_value());
  EXPECT_EQ(rank->rank, 5);
  EXPECT_EQ(rank->world_size, 6);  // the step's tasks, not the allocation's
  EXPECT_EQ(rank->job_id, "991.2");
  // A batch script has SLURM_PROCID but is no step: not a rank.
  EXPECT_FALSE(
      detectLaunch(environmentOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "991"}}))
          .has_value());

  rank = detectLaunch(environmentOf({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "run-a"}}));
  ASSERT_TRUE(rank.has_value());
  EXPECT_EQ(rank->job_id, "run-a");

  // Nonsense values are not a launch.
  EXPECT_FALSE(detectLaunch(environmentOf({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}))
                   .has_value());
  EXPECT_FALSE(detectLaunch(environmentOf({{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "4"}}))
                   .has_value());
  EXPECT_FALSE(detectLaunch(environmentOf({{"PMI_RANK", "-1"}, {"PMI_SIZE", "4"}})).has_value());
}

TEST(RunLaunchedRank, UuidsAreWellFormedAndJobUuidsAgree) {
  const std::regex form("[0-9a-f]{8}-[0-9a-f]{4}-([0-9a-f])[0-9a-f]{3}-([89ab])[0-9a-f]{3}-[0-9a-f]{12}");
  std::smatch match;
  const std::string random = randomUuid();
  ASSERT_TRUE(std::regex_match(random, match, form)) << random;
  EXPECT_EQ(match[1], "4");
  EXPECT_NE(randomUuid(), random);

  const std::string job = uuidFromKey("216399873");
  ASSERT_TRUE(std::regex_match(job, match, form)) << job;
  EXPECT_EQ(match[1], "8");
  EXPECT_EQ(uuidFromKey("216399873"), job);  // every rank computes the same
  EXPECT_NE(uuidFromKey("216399874"), job);
  EXPECT_NE(uuidFromKey(""), job);
}

// ---------------------------------------------------------------------------------------------------
// Output directory, agent, environment

TEST(RunOutputDirectory, DefaultsAreTimestampedOrTheJobsId) {
  const std::string name = defaultOutputDirectory(std::nullopt, std::chrono::system_clock::now());
  EXPECT_TRUE(std::regex_match(name, std::regex("gradscope-[0-9]{8}-[0-9]{6}"))) << name;
  EXPECT_EQ(defaultOutputDirectory(Launch{1, 4, "job.7"}, {}), "gradscope-job.7");
  EXPECT_GRADSCOPE_ERROR(defaultOutputDirectory(Launch{1, 4, ""}, {}), "job id", "-o DIR");
}

TEST(RunOutputDirectory, CreatesPrivateDirectoriesAndRefusesOnesWithTraces) {
  const TempDir dir;
  const std::string fresh = prepareOutputDirectory(dir.file("a/b/out"), false, false);
  EXPECT_EQ(fresh, dir.file("a/b/out"));
  EXPECT_EQ(test::fileMode(fresh), 0700u);
  // An existing directory without traces is fine; with traces it needs --force, unless shared by the
  // ranks of a launched job.
  EXPECT_EQ(prepareOutputDirectory(fresh, false, false), fresh);
  test::writeFile(fresh + "/rank0-node-1.db", "x");
  EXPECT_GRADSCOPE_ERROR(prepareOutputDirectory(fresh, false, false), fresh, "already holds trace files",
                         "--force");
  EXPECT_EQ(prepareOutputDirectory(fresh, true, false), fresh);
  EXPECT_EQ(prepareOutputDirectory(fresh, false, true), fresh);
  // The default name moves on instead of mixing two runs.
  EXPECT_EQ(prepareOutputDirectory(fresh, false, false, /*pick_free_name=*/true), fresh + "-2");
  EXPECT_EQ(prepareOutputDirectory(fresh, false, false, /*pick_free_name=*/true), fresh + "-3");
  // Relative paths come back absolute.
  const std::string cwd = fs::current_path();
  fs::current_path(dir.path());
  EXPECT_EQ(prepareOutputDirectory("rel", false, false), dir.file("rel"));
  fs::current_path(cwd);

  test::writeFile(dir.file("plain"), "a file");
  EXPECT_GRADSCOPE_ERROR(prepareOutputDirectory(dir.file("plain"), false, false), dir.file("plain"),
                         "not a directory");
  EXPECT_GRADSCOPE_ERROR(prepareOutputDirectory(dir.file("plain/sub"), false, false), dir.file("plain/sub"),
                         "cannot create output directory", "-o");
}

TEST(RunOutputDirectory, UnwritableDirectoriesAreRefusedWithTheFix) {
  const TempDir dir;
  const std::string locked = dir.makeSubdir("locked");
  fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec);
  fs::permissions(locked, fs::perms::owner_all | fs::perms::others_read | fs::perms::others_exec);
  const auto result = test::runUnprivileged([&] {
    return test::childErrorMessage([&] { prepareOutputDirectory(locked, false, false); }) + "\n" +
           test::childErrorMessage([&] { prepareOutputDirectory(locked + "/new", false, false); });
  });
  if (result.skipped) GTEST_SKIP() << result.text;
  EXPECT_TRUE(contains(result.text, "Error: cannot write to output directory " + locked)) << result.text;
  EXPECT_TRUE(contains(result.text, "Error: cannot create output directory " + locked + "/new"))
      << result.text;
  EXPECT_TRUE(contains(result.text, "pass -o with a directory you can write to")) << result.text;
}

TEST(RunAgent, FoundFromTheEnvironmentTheBuildTreeOrTheInstall) {
  const TempDir dir;
  EXPECT_GRADSCOPE_ERROR(findAgent({{"GRADSCOPE_AGENT_PATH", dir.file("none.so")}}, dir.path()),
                         "GRADSCOPE_AGENT_PATH=" + dir.file("none.so"), "unset it");
  const std::string bin = dir.makeSubdir("bin");
  // The install's private directory: <prefix>/lib[/<multiarch>]/gradscope, beside bin/.
  const std::string installed = installedPrivateDirectory(bin);
  EXPECT_TRUE(installed.starts_with(dir.file("lib/"))) << installed;
  EXPECT_TRUE(installed.ends_with("/gradscope")) << installed;
  EXPECT_GRADSCOPE_ERROR(findAgent({}, bin), "cannot find the agent libgradscope-agent.so", dir.file("agent"),
                         installed, "build the gradscope_agent target", "reinstall the gradscope package",
                         "GRADSCOPE_AGENT_PATH");
  std::filesystem::create_directories(installed);
  test::writeFile(installed + "/libgradscope-agent.so", "elf");
  EXPECT_EQ(findAgent({}, bin), installed + "/libgradscope-agent.so");
  dir.makeSubdir("agent");  // the build tree comes first
  test::writeFile(dir.file("agent/libgradscope-agent.so"), "elf");
  EXPECT_EQ(findAgent({}, bin), dir.file("agent/libgradscope-agent.so"));
  test::writeFile(dir.file("mine.so"), "elf");
  EXPECT_EQ(findAgent({{"GRADSCOPE_AGENT_PATH", dir.file("mine.so")}}, bin), dir.file("mine.so"));
}

TEST(RunEnvironment, PreloadsTheAgentFirstAndNamesTheRun) {
  const Environment parent = {{"PATH", "/usr/bin"},
                              {"LD_PRELOAD", "/lib/libfoo.so /a/agent.so:/lib/libbar.so"},
                              {"GRADSCOPE_FLUSH_INTERVAL", "10ms"},
                              {"GRADSCOPE_OUTPUT", "ignored-%p.db"}};
  const Environment job = jobEnvironment(parent, "/a/agent.so", "/out", "uuid-1", "./train --x 'a b'");
  EXPECT_EQ(job.at("LD_PRELOAD"), "/a/agent.so:/lib/libfoo.so:/lib/libbar.so");
  EXPECT_EQ(job.at("GRADSCOPE_OUTPUT"), "/out/rank%r-%h-%p.db");
  EXPECT_EQ(job.at("GRADSCOPE_RUN_ID"), "uuid-1");
  EXPECT_EQ(job.at("GRADSCOPE_COMMAND"), "./train --x 'a b'");
  EXPECT_EQ(job.at("GRADSCOPE_FLUSH_INTERVAL"), "10ms");
  EXPECT_EQ(job.at("PATH"), "/usr/bin");
  EXPECT_EQ(jobEnvironment({}, "/a/agent.so", "/out", "u", "x").at("LD_PRELOAD"), "/a/agent.so");
  EXPECT_EQ(jobEnvironment({{"LD_PRELOAD", "/lib/libfoo.so /usr/lib/libasan.so.8"}}, "/a/agent.so", "/out",
                           "u", "x")
                .at("LD_PRELOAD"),
            "/usr/lib/libasan.so.8:/a/agent.so:/lib/libfoo.so");
  EXPECT_EQ(variablesToForward(job),
            (std::vector<std::string>{"LD_PRELOAD", "GRADSCOPE_COMMAND", "GRADSCOPE_FLUSH_INTERVAL",
                                      "GRADSCOPE_OUTPUT", "GRADSCOPE_RUN_ID"}));
  // A host's test clock offset stays on its host.
  EXPECT_EQ(
      variablesToForward(
          jobEnvironment({{"GRADSCOPE_TEST_CLOCK_OFFSET", "5000"}}, "/a/agent.so", "/out", "u", "x")),
      (std::vector<std::string>{"LD_PRELOAD", "GRADSCOPE_COMMAND", "GRADSCOPE_OUTPUT", "GRADSCOPE_RUN_ID"}));
}

TEST(RunEnvironment, AnNvtxStepMarkerMakesTheAgentTheNvtxInjectionLibrary) {
  const Environment job =
      jobEnvironment({{"GRADSCOPE_STEP_NVTX", "train_step"}}, "/a/agent.so", "/out", "u", "x");
  EXPECT_EQ(job.at("NVTX_INJECTION64_PATH"), "/a/agent.so");
  EXPECT_NE(
      std::find(variablesToForward(job).begin(), variablesToForward(job).end(), "NVTX_INJECTION64_PATH"),
      variablesToForward(job).end());
  // The user's own injection library stays; without the marker nothing is set.
  EXPECT_EQ(jobEnvironment({{"GRADSCOPE_STEP_NVTX", "s"}, {"NVTX_INJECTION64_PATH", "/mine.so"}},
                           "/a/agent.so", "/out", "u", "x")
                .at("NVTX_INJECTION64_PATH"),
            "/mine.so");
  EXPECT_EQ(jobEnvironment({}, "/a/agent.so", "/out", "u", "x").count("NVTX_INJECTION64_PATH"), 0u);
}

TEST(RunEnvironment, CommandLinesAreShellQuotedWhereNeeded) {
  EXPECT_EQ(shellJoin({"mpirun", "-np", "4", "./train", "--lr=0.1", "a/b.py"}),
            "mpirun -np 4 ./train --lr=0.1 a/b.py");
  EXPECT_EQ(shellJoin({"sh", "-c", "echo 'hi' $HOME", ""}), R"(sh -c 'echo '\''hi'\'' $HOME' '')");
}

TEST(RunExitCode, IsTheJobsStatusOr128PlusItsSignal) {
  EXPECT_EQ(exitCode(W_EXITCODE(0, 0)), 0);
  EXPECT_EQ(exitCode(W_EXITCODE(3, 0)), 3);
  EXPECT_EQ(exitCode(W_EXITCODE(255, 0)), 255);
  EXPECT_EQ(exitCode(W_EXITCODE(0, SIGTERM)), 143);
  EXPECT_EQ(exitCode(W_EXITCODE(0, SIGKILL)), 137);
  EXPECT_EQ(exitCode(W_EXITCODE(0, SIGINT)), 130);
}

// ---------------------------------------------------------------------------------------------------
// After the job: merge and summary

constexpr const char* kRun = "00000000-0000-4000-8000-0000000000aa";

// The agent's statistics of a rank as the agent stores them (docs/agent.md).
void setAgentStats(const std::string& path, double recorded, double dropped, double hot_path_ns) {
  test::RawDb db(path);
  db.exec(fmt::format(
      R"(UPDATE runs SET config_json = '{{"mode":"observe","agent":{{"calls_recorded":{},"calls_dropped":{},)"
      R"("hot_path_ns":{},"flusher_cpu_ns":2500000,"buffer_bytes":4194304}}}}')",
      recorded, dropped, hot_path_ns));
}

std::vector<std::string> writeRanks(const std::string& directory, int ranks, const std::string& uuid,
                                    bool agent_stats) {
  testing::SyntheticJob job;
  job.ranks = ranks;
  job.steps = 3;
  job.uuid = uuid;
  std::vector<std::string> paths;
  for (int rank = 0; rank < ranks; ++rank) {
    paths.push_back(fmt::format("{}/rank{}-node-{}.db", directory, rank, 100 + rank));
    testing::writeSyntheticRank(paths.back(), job, rank);
    if (agent_stats) setAgentStats(paths.back(), 1000, rank == 1 ? 24 : 0, rank == 1 ? 35 : 25);
  }
  return paths;
}

TEST(RunFinish, MergesTheRanksIntoTraceDbAndSummarises) {
  const TempDir dir;
  const auto ranks = writeRanks(dir.path(), 2, kRun, /*agent_stats=*/true);
  FinishOptions options;
  options.run_id = kRun;
  std::ostringstream log;
  const std::string merged = finishRun(dir.path(), options, log);
  EXPECT_EQ(merged, dir.file("trace.db"));
  const std::string text = log.str();
  EXPECT_TRUE(contains(text, "Time in collectives by API and size")) << text;
  EXPECT_TRUE(contains(text, "Per rank")) << text;
  EXPECT_TRUE(contains(text, "Dropped events")) << text;
  EXPECT_TRUE(contains(text, "Agent overhead")) << text;
  EXPECT_TRUE(
      contains(text, "agent overhead: ~30 ns per call on the calling thread x 2,024 calls = 60.8 us ("))
      << text;
  EXPECT_TRUE(contains(text, "background thread 5.00 ms CPU; buffers 8 MiB")) << text;
  // The last line says where the trace is and how to open it.
  EXPECT_TRUE(std::regex_search(text, std::regex("\nTrace: .*trace\\.db \\(2 rank files merged; they stay in "
                                                 ".*\\)\\. Open it with: gradscope report .*trace\\.db, or "
                                                 "gradscope-gui .*trace\\.db\n$")))
      << text;
  // The per-rank files stay.
  EXPECT_EQ(test::listDirectory(dir.path()),
            (std::vector<std::string>{"rank0-node-100.db", "rank1-node-101.db", "trace.db"}));
  EXPECT_EQ(storage::TraceReader::open(merged).ranks().size(), 2u);

  // Again (a --force run into the same directory): trace.db is replaced, never merged into itself.
  std::ostringstream again;
  EXPECT_EQ(finishRun(dir.path(), options, again), merged);
  EXPECT_TRUE(contains(again.str(), "(2 rank files merged")) << again.str();
}

// Since the agent measures what an unrecorded call costs (dropped_call_ns), the summary counts the calls
// it turned away at that cost, not at the cost of a record.
TEST(RunFinish, CallsNotRecordedCostWhatTheAgentMeasuredForThem) {
  const TempDir dir;
  const auto ranks = writeRanks(dir.path(), 1, kRun, /*agent_stats=*/false);
  {
    test::RawDb db(ranks.at(0));
    db.exec(
        R"(UPDATE runs SET config_json = '{"mode":"observe","agent":{"calls_recorded":1000,"calls_dropped":9000,)"
        R"("hot_path_ns":20,"dropped_call_ns":2,"flusher_cpu_ns":2500000,"buffer_bytes":4194304}}')");
  }
  FinishOptions options;
  options.run_id = kRun;
  std::ostringstream log;
  finishRun(dir.path(), options, log);
  // 1,000 x 20 ns + 9,000 x 2 ns = 38 us over 10,000 calls.
  EXPECT_TRUE(
      contains(log.str(), "agent overhead: ~4 ns per call on the calling thread x 10,000 calls = 38.0 us"))
      << log.str();
}

TEST(RunFinish, MergeGathersEveryRanksAgentStatistics) {
  const TempDir dir;
  const auto ranks = writeRanks(dir.path(), 3, kRun, /*agent_stats=*/true);
  const std::string merged = dir.file("merged.db");
  storage::mergeTraces(ranks, merged, {});
  const auto config = nlohmann::json::parse(storage::TraceReader::open(merged).runs().at(0).config_json);
  EXPECT_EQ(config["mode"], "observe");  // the rest of the first file's configuration stays
  EXPECT_FALSE(config.contains("agent"));
  ASSERT_EQ(config["agent_ranks"].size(), 3u);
  for (std::size_t rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(config["agent_ranks"][rank]["rank"], rank);
    EXPECT_EQ(config["agent_ranks"][rank]["calls_recorded"], 1000);
  }
  EXPECT_EQ(config["agent_ranks"][1]["calls_dropped"], 24);
  // Merging merged files keeps them: again, and incrementally.
  storage::mergeTraces({merged}, dir.file("again.db"), {});
  EXPECT_EQ(storage::TraceReader::open(dir.file("again.db")).runs().at(0).config_json,
            storage::TraceReader::open(merged).runs().at(0).config_json);
  storage::mergeTraces({ranks[0], ranks[1]}, dir.file("partial.db"), {});
  storage::mergeTraces({dir.file("partial.db"), ranks[2]}, dir.file("whole.db"), {});
  EXPECT_EQ(storage::TraceReader::open(dir.file("whole.db")).runs().at(0).config_json,
            storage::TraceReader::open(merged).runs().at(0).config_json);
  // A per-rank file's report shows its own statistics too.
  std::ostringstream report;
  writeReport(storage::TraceReader::open(ranks[1]), report);
  EXPECT_TRUE(contains(report.str(), "x 1,024 calls = 35.8 us")) << report.str();
}

TEST(RunFinish, WithoutAgentStatisticsTheReportHasNoOverheadSection) {
  const TempDir dir;
  writeRanks(dir.path(), 2, kRun, /*agent_stats=*/false);
  std::ostringstream log;
  ASSERT_FALSE(finishRun(dir.path(), {}, log).empty());
  EXPECT_FALSE(contains(log.str(), "Agent overhead")) << log.str();
}

TEST(RunFinish, NoFileMeansNoCollectiveCalls) {
  const TempDir dir;
  test::writeFile(dir.file("notes.txt"), "not a trace");
  std::ostringstream log;
  EXPECT_EQ(finishRun(dir.path(), {}, log), "");
  EXPECT_EQ(log.str().rfind("gradscope: no collective calls were recorded: no rank wrote a trace to ", 0), 0u)
      << log.str();
  const std::string text = log.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
  EXPECT_TRUE(contains(log.str(), "LD_PRELOAD")) << log.str();
}

TEST(RunFinish, LeavesOutOtherRunsAndUnreadableFiles) {
  const TempDir dir;
  writeRanks(dir.path(), 2, kRun, false);
  const std::string old = dir.makeSubdir("old");
  writeRanks(old, 1, "00000000-0000-4000-8000-0000000000bb", false);
  fs::rename(old + "/rank0-node-100.db", dir.file("rank0-old-1.db"));
  test::writeFile(dir.file("rank2-node-102.db"), "garbage, not SQLite");
  FinishOptions options;
  options.run_id = kRun;
  std::ostringstream log;
  ASSERT_EQ(finishRun(dir.path(), options, log), dir.file("trace.db")) << log.str();
  EXPECT_TRUE(contains(log.str(), "gradscope: left out 1 trace file of other runs in ")) << log.str();
  EXPECT_TRUE(contains(log.str(), "gradscope: left out 1 unreadable trace file (")) << log.str();
  EXPECT_TRUE(contains(log.str(), "(2 rank files merged")) << log.str();
}

TEST(RunFinish, AFailedMergeIsOneLineAndKeepsTheFiles) {
  const TempDir dir;
  const auto ranks = writeRanks(dir.path(), 2, kRun, false);
  test::copyFile(ranks[1], dir.file("rank1-copy-1.db"));  // the same rank twice
  std::ostringstream log;
  EXPECT_EQ(finishRun(dir.path(), {}, log), "");
  EXPECT_EQ(log.str().rfind("gradscope: cannot merge the traces in ", 0), 0u) << log.str();
  EXPECT_TRUE(contains(log.str(), "the per-rank files are kept")) << log.str();
  const std::string text = log.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
  EXPECT_EQ(test::listDirectory(dir.path()).size(), 3u);
}

TEST(RunFinish, RankZeroWaitsBoundedForTheOtherRanks) {
  const TempDir dir;
  const auto ranks = writeRanks(dir.path(), 2, kRun, false);
  {  // rank 1 is still running (or was killed): no end recorded
    test::RawDb db(ranks[1]);
    db.exec("UPDATE runs SET end_ns = NULL");
  }
  FinishOptions options;
  options.run_id = kRun;
  options.expected_ranks = 2;
  options.wait = std::chrono::milliseconds(300);
  std::ostringstream log;
  auto start = std::chrono::steady_clock::now();
  ASSERT_FALSE(finishRun(dir.path(), options, log).empty());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_TRUE(contains(log.str(),
                       "gradscope: waited 0.3 s for the traces of 2 ranks and 1 are complete; merging "
                       "what there is"))
      << log.str();

  // A signal ends the wait early.
  options.wait = std::chrono::seconds(30);
  options.stop_waiting = [] { return true; };
  std::ostringstream interrupted;
  start = std::chrono::steady_clock::now();
  ASSERT_FALSE(finishRun(dir.path(), options, interrupted).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(contains(interrupted.str(), "gradscope: interrupted while waiting")) << interrupted.str();

  // A rank that finishes while rank 0 waits is picked up.
  options.stop_waiting = nullptr;
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    test::RawDb db(ranks[1]);
    db.exec("UPDATE runs SET end_ns = start_ns + 1000");
  });
  std::ostringstream waited;
  ASSERT_FALSE(finishRun(dir.path(), options, waited).empty());
  finisher.join();
  EXPECT_FALSE(contains(waited.str(), "waited")) << waited.str();
  EXPECT_TRUE(storage::TraceReader::open(dir.file("trace.db")).runs().at(0).end_ns.has_value());
}

// ---------------------------------------------------------------------------------------------------
// The command end to end

// libc stands in for the agent: preloading it changes nothing.
std::string standInAgent() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&::getpid), &info) == 0 || info.dli_fname == nullptr) return {};
  return info.dli_fname;
}

// The gradscope command line under a clean launch environment (tests may run inside srun or mpirun).
std::string runCommandLine(const std::vector<std::string>& args, const std::string& prefix = "") {
  std::string line =
      "env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMI_SIZE -u PMI_RANK -u SLURM_PROCID "
      "-u TORCHELASTIC_RUN_ID -u GRADSCOPE_RUN_ID GRADSCOPE_AGENT_PATH=" +
      test::shellQuote(standInAgent()) + " " + prefix + " " + test::shellQuote(GRADSCOPE_CLI_PATH) + " run";
  for (const std::string& arg : args) line += " " + test::shellQuote(arg);
  return line;
}

TEST(RunCommand, ReturnsTheJobsExitCodeAndSaysNothingWasRecorded) {
  const TempDir dir;
  const std::string out = dir.file("out");
  const auto result = test::runShell(runCommandLine({"-o", out, "--", "/bin/sh", "-c", "echo job; exit 3"}));
  EXPECT_TRUE(result.exited) << test::describe(result);
  EXPECT_EQ(result.exit_code, 3) << test::describe(result);
  EXPECT_EQ(result.out, "job\n");  // the job's output is the job's alone
  EXPECT_TRUE(contains(result.err, "gradscope: no collective calls were recorded")) << test::describe(result);
  EXPECT_EQ(test::fileMode(out), 0700u);

  // The job saw the contract's variables.
  const auto seen =
      test::runShell(runCommandLine({"-o", dir.file("env"), "--", "/bin/sh", "-c",
                                     "echo \"$LD_PRELOAD|$GRADSCOPE_OUTPUT|$GRADSCOPE_COMMAND\""}));
  EXPECT_EQ(seen.exit_code, 0) << test::describe(seen);
  EXPECT_EQ(seen.out, standInAgent() + "|" + dir.file("env") +
                          "/rank%r-%h-%p.db|/bin/sh -c 'echo \"$LD_PRELOAD|" +
                          "$GRADSCOPE_OUTPUT|$GRADSCOPE_COMMAND\"'\n")
      << test::describe(seen);
}

TEST(RunCommand, RefusalsBeforeTheJobAreOneLineAndRunNothing) {
  const TempDir dir;
  auto result = test::runShell(runCommandLine({"-o", dir.file("a"), "--", "/nonexistent"}));
  EXPECT_EQ(result.exit_code, 127) << test::describe(result);
  EXPECT_EQ(result.err, "gradscope: cannot run '/nonexistent': No such file or directory\n");
  EXPECT_FALSE(test::exists(dir.file("a")));  // nothing created for a job that cannot start

  result = test::runShell(runCommandLine({"-o", dir.file("a"), "--", "no-such-command-gradscope"}));
  EXPECT_EQ(result.exit_code, 127) << test::describe(result);
  test::writeFile(dir.file("data.txt"), "not a program");
  result = test::runShell(runCommandLine({"-o", dir.file("a"), "--", dir.file("data.txt")}));
  EXPECT_EQ(result.exit_code, 126) << test::describe(result);

  test::expectCliError(test::runShell(runCommandLine({"-o", dir.file("a")})), {"run needs a command"});
  test::expectCliError(test::runShell(runCommandLine({"--"})), {"run needs a command"});

  // No agent: exit 2 without running the job, the fix named.
  const std::string marker = dir.file("ran");
  result = test::runShell(runCommandLine({"-o", dir.file("b"), "--", "/bin/sh", "-c", "touch " + marker},
                                         "GRADSCOPE_AGENT_PATH=" + dir.file("missing.so")));
  test::expectCliError(result, {"GRADSCOPE_AGENT_PATH=", "missing.so"});
  EXPECT_FALSE(test::exists(marker));

  // A directory holding another run's traces.
  dir.makeSubdir("used");
  test::writeFile(dir.file("used/rank0-x-1.db"), "x");
  result = test::runShell(runCommandLine({"-o", dir.file("used"), "--", "/bin/sh", "-c", "touch " + marker}));
  test::expectCliError(result, {dir.file("used"), "already holds trace files", "--force"});
  EXPECT_FALSE(test::exists(marker));
  // ... is used with --force (the old file, unreadable here, is left out with a note).
  result = test::runShell(
      runCommandLine({"-o", dir.file("used"), "--force", "--", "/bin/sh", "-c", "touch " + marker}));
  EXPECT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_TRUE(test::exists(marker));
  EXPECT_TRUE(test::exists(dir.file("used/rank0-x-1.db")));
}

TEST(RunCommand, TheDefaultDirectoryIsTimestampedInTheWorkingDirectory) {
  const TempDir dir;
  const auto result =
      test::runShell("(cd " + test::shellQuote(dir.path()) + " && " + runCommandLine({"--", "/bin/true"}) +
                     " && " + runCommandLine({"--", "/bin/true"}) + ")");
  EXPECT_EQ(result.exit_code, 0) << test::describe(result);
  const auto names = test::listDirectory(dir.path());
  ASSERT_GE(names.size(), 1u);
  for (const std::string& name : names)
    EXPECT_TRUE(std::regex_match(name, std::regex("gradscope-[0-9]{8}-[0-9]{6}(-2)?"))) << name;
}

// Starts gradscope run in the background with stderr to `err`, waits until the job has written
// `marker`, sends `signal` to gradscope alone, and returns gradscope's wait status (-1 on a timeout).
int signalDuringJob(const TempDir& dir, int signal, const std::string& err) {
  const std::string marker = dir.file("started");
  const std::string cli = GRADSCOPE_CLI_PATH, agent = standInAgent(), out = dir.file("out");
  const std::string script = "touch " + test::shellQuote(marker) + "; exec sleep 30";
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("GRADSCOPE_AGENT_PATH", agent.c_str(), 1);
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"})
      ::unsetenv(name);
    if (std::freopen(err.c_str(), "w", stderr) == nullptr) ::_exit(99);
    ::execl(cli.c_str(), cli.c_str(), "run", "-o", out.c_str(), "--", "/bin/sh", "-c", script.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(98);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!test::exists(marker) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(pid, signal);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

TEST(RunCommand, ForwardsSigtermToTheJobAndReturns143) {
  const TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const int status = signalDuringJob(dir, SIGTERM, dir.file("stderr"));
  ASSERT_NE(status, -1) << "gradscope run did not end after SIGTERM";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));  // not sleep's 30 s
  ASSERT_TRUE(WIFEXITED(status)) << "gradscope itself died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 143);
  // ... after the post-job work.
  EXPECT_TRUE(contains(test::readFile(dir.file("stderr")), "no collective calls were recorded"))
      << test::readFile(dir.file("stderr"));
}

TEST(RunCommand, ForwardsSigintSentByAnotherProcess) {
  const TempDir dir;
  const int status = signalDuringJob(dir, SIGINT, dir.file("stderr"));
  ASSERT_NE(status, -1);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
}

// `mpirun -np 2 gradscope run -- JOB`, simulated: each gradscope sees the launcher's variables, and the
// job "writes" its rank's file by copying one made here.
TEST(RunCommand, RanksOfALaunchedJobAgreeAndRankZeroMerges) {
  const TempDir dir;
  const std::string job_id = "4242";
  const std::string staged = dir.makeSubdir("staged");
  writeRanks(staged, 2, uuidFromKey(job_id), true);
  const auto rankCommand = [&](int rank, const std::string& file) {
    return "cd " + test::shellQuote(dir.path()) + " && " +
           runCommandLine(
               {"--wait", "5", "--", "/bin/sh", "-c",
                "cp " + test::shellQuote(staged + "/" + file) + " \"$(dirname \"$GRADSCOPE_OUTPUT\")/\""},
               fmt::format("OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK={} PMIX_NAMESPACE={}", rank, job_id));
  };
  const auto rank1 = test::runShell(rankCommand(1, "rank1-node-101.db"));
  EXPECT_EQ(rank1.exit_code, 0) << test::describe(rank1);
  EXPECT_EQ(rank1.err, "");  // only rank 0 reports
  EXPECT_FALSE(test::exists(dir.file("gradscope-4242/trace.db")));

  const auto rank0 = test::runShell(rankCommand(0, "rank0-node-100.db"));
  EXPECT_EQ(rank0.exit_code, 0) << test::describe(rank0);
  EXPECT_TRUE(contains(rank0.err, "Trace: gradscope-4242/trace.db (2 rank files merged")) << rank0.err;
  EXPECT_TRUE(contains(rank0.err, "Agent overhead")) << rank0.err;
  EXPECT_EQ(storage::TraceReader::open(dir.file("gradscope-4242/trace.db")).ranks().size(), 2u);
}

}  // namespace
}  // namespace gradscope::cli
