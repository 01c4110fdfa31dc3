// The gradscope command. Under an MPI launcher (mpirun -np K, srun: common/launcher.h), the commands that read a run's
// directory of rank files become gradscope-mpi, which splits the reading across the K processes.

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "command_line.h"
#include "gradscope/common/error.h"
#include "gradscope/common/launcher.h"

namespace {

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
  if (readsRankFiles(argc, argv))
    if (const auto launch = gradscope::detectLaunch(gradscope::processEnvironment());
        launch && launch->world_size > 1)
      return execMpi(argc, argv, launch->world_size, launch->rank);
  return gradscope::cli::commandLine(argc, argv, nullptr);
}
