// The gradscope command. Under an MPI launcher (mpirun -np K, srun), the commands that read a run's
// directory of rank files become gradscope-mpi, which splits the reading across the K processes.

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "command_line.h"
#include "gradscope/common/error.h"

namespace {

// The processes an MPI launcher started this one among and this one's rank in them: Open MPI's mpirun,
// the PMI launchers (MPICH's and Intel MPI's hydra, srun --mpi=pmi2) and a Slurm job step. {1, 0} when
// there is none.
std::pair<int, int> launcherWorld() {
  constexpr std::pair<const char*, const char*> kLaunchers[] = {
      {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
      {"PMI_SIZE", "PMI_RANK"},
      {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID"},
  };
  for (const auto& [size_name, rank_name] : kLaunchers) {
    const char* size = std::getenv(size_name);
    const char* rank = std::getenv(rank_name);
    if (size && rank) return {std::atoi(size), std::atoi(rank)};
  }
  return {1, 0};
}

// The commands whose directory of rank files several processes can read (storage/merge.h MergeLink).
bool readsRankFiles(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string_view command = argv[1];
  return command == "report" || command == "recommend" || command == "export" || command == "merge";
}

// Becomes gradscope-mpi, from this executable's directory, with the same arguments. Returns only when it
// cannot: then process 0 works alone (one line says why) and the other processes leave it to it, so that
// the job still prints one report.
int execMpi(int argc, char** argv, int processes, int rank) {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  const auto helper = (error ? std::filesystem::path(argv[0]) : self).parent_path() / "gradscope-mpi";
  std::vector<char*> arguments(argv, argv + argc);
  arguments.push_back(nullptr);
  execv(helper.c_str(), arguments.data());
  const int exec_error = errno;
  if (rank != 0) return 0;
  fmt::print(stderr,
             "gradscope: cannot run {} ({}): process 0 reads every rank file alone and the other {} "
             "process{} exit; build the gradscope_mpi target (it needs MPI) to split the reading\n",
             helper.string(),
             exec_error == ENOENT ? "not part of this build" : gradscope::errnoMessage(exec_error),
             processes - 1, processes == 2 ? "" : "es");
  return gradscope::cli::commandLine(argc, argv, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  if (readsRankFiles(argc, argv)) {
    const auto [processes, rank] = launcherWorld();
    if (processes > 1) return execMpi(argc, argv, processes, rank);
  }
  return gradscope::cli::commandLine(argc, argv, nullptr);
}
