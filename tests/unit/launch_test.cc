// Launch identity (gradscope/common/launcher.h detectLaunch): one rule for every launcher, and for every
// part that asks (the agent here; `gradscope run` in run_test.cc), table by table.

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config.h"
#include "gradscope/common/launcher.h"

namespace gradscope {

void PrintTo(const Launch& launch, std::ostream* out) {
  *out << "Launch{" << launch.rank << ", " << launch.world_size << ", \"" << launch.job_id << "\"}";
}

namespace {

struct LaunchCase {
  const char* what;
  std::map<std::string, std::string> variables;
  std::optional<Launch> expected;
};

const std::vector<LaunchCase> kLaunchCases = {
    {"no launcher", {}, std::nullopt},
    {"a shell", {{"HOME", "/root"}, {"PATH", "/usr/bin"}, {"LOCAL_RANK", "0"}}, std::nullopt},

    {"Open MPI 4",
     {{"OMPI_COMM_WORLD_RANK", "1"},
      {"OMPI_COMM_WORLD_SIZE", "4"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
      {"OMPI_MCA_ess_base_jobid", "216399873"},
      {"OMPI_MCA_orte_precondition_transports", "a1b2c3d4e5f60718-0918a7b6c5d4e3f2"}},
     Launch{1, 4, "216399873"}},
    {"Open MPI 5 (PMIx namespace wins, sanitised)",
     {{"OMPI_COMM_WORLD_RANK", "0"},
      {"OMPI_COMM_WORLD_SIZE", "2"},
      {"OMPI_MCA_ess_base_jobid", "1"},
      {"PMIX_RANK", "0"},
      {"PMIX_NAMESPACE", "prterun-node7-4711@1"}},
     Launch{0, 2, "prterun-node7-4711_1"}},
    {"Open MPI under a shell that leaked RANK",
     {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"RANK", "7"}, {"WORLD_SIZE", "8"}},
     Launch{2, 4, ""}},
    {"Hydra (MPICH, Intel MPI): no job id", {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}, Launch{1, 2, ""}},

    {"Slurm srun: the step's tasks, job.step",
     {{"SLURM_PROCID", "3"},
      {"SLURM_NTASKS", "8"},
      {"SLURM_STEP_NUM_TASKS", "4"},
      {"SLURM_JOB_ID", "991"},
      {"SLURM_STEP_ID", "0"}},
     Launch{3, 4, "991.0"}},
    {"Slurm srun without SLURM_STEP_NUM_TASKS",
     {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "991"}, {"SLURM_STEP_ID", "2"}},
     Launch{3, 8, "991.2"}},
    {"Slurm srun with PMIx",
     {{"SLURM_PROCID", "1"},
      {"SLURM_NTASKS", "2"},
      {"SLURM_JOB_ID", "991"},
      {"SLURM_STEP_ID", "0"},
      {"PMIX_RANK", "1"},
      {"PMIX_NAMESPACE", "slurm.pmix.991.0"}},
     Launch{1, 2, "slurm.pmix.991.0"}},
    {"a Slurm batch script is no rank",
     {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "991"}},
     std::nullopt},

    {"torchrun",
     {{"RANK", "1"},
      {"LOCAL_RANK", "1"},
      {"WORLD_SIZE", "2"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"TORCHELASTIC_RUN_ID", "job-a/7"}},
     Launch{1, 2, "job-a_7"}},
    {"torchrun without --rdzv-id: 'none' is no id",
     {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "none"}},
     Launch{0, 2, ""}},
    {"bare RANK (PyTorch's env:// convention, set by hand or by the script)",
     {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}},
     std::nullopt},
    {"bare RANK with an empty run id",
     {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", ""}},
     std::nullopt},
    {"PMIx alone names no size", {{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "prterun-x@1"}}, std::nullopt},

    {"rank outside the world", {{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}, std::nullopt},
    {"not a number", {{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "4"}}, std::nullopt},
    {"negative", {{"PMI_RANK", "-1"}, {"PMI_SIZE", "4"}}, std::nullopt},
    {"empty world", {{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}, std::nullopt},
    {"empty values are unset", {{"OMPI_COMM_WORLD_RANK", ""}, {"OMPI_COMM_WORLD_SIZE", ""}}, std::nullopt},
    {"a bad pair falls through to the next launcher",
     {{"OMPI_COMM_WORLD_RANK", "9"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "4"}},
     Launch{1, 4, ""}},
};

TEST(DetectLaunch, EveryLauncherByTheOneRule) {
  for (const LaunchCase& launch : kLaunchCases)
    EXPECT_EQ(detectLaunch(environmentOf(launch.variables)), launch.expected) << launch.what;
}

// The agent and `gradscope run` take their launch from the same rule (`gradscope run` uses detectLaunch
// directly; run_test.cc covers what it does with it).
TEST(DetectLaunch, TheAgentLabelsItsRankByTheSameRule) {
  for (const LaunchCase& launch : kLaunchCases) {
    std::vector<std::string> errors;
    const agent::Config config = agent::parseConfig(environmentOf(launch.variables), errors);
    EXPECT_EQ(config.env_rank, launch.expected ? std::optional(launch.expected->rank) : std::nullopt)
        << launch.what;
    EXPECT_EQ(config.env_world_size,
              launch.expected ? std::optional(launch.expected->world_size) : std::nullopt)
        << launch.what;
  }
}

}  // namespace
}  // namespace gradscope
