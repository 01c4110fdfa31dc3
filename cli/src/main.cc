// The gradscope command. Under an MPI launcher (mpirun -np K, srun: common/launcher.h), the commands that
// read a run's directory of rank files become gradscope-mpi, which splits the reading across the K processes.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
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

// Whether this process runs inside a rank of the job whose launcher variables it sees: an ancestor that
// the launcher started (the ancestors up to the launcher's daemon carry its variables: detectLaunch) has an
// MPI library loaded, as a training script that reports its own run from a child process does. Such a child
// must not become an MPI process of that job (MPI_Init would fail, a second process with the rank's
// identity); it reads alone, as one process. Wrappers between the launcher and gradscope (time, numactl,
// a shell) load no MPI and do not count. An ancestor whose /proc entries cannot be read ends the search.
bool insideAnMpiRank() {
  const auto read = [](const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(file), {});
  };
  pid_t pid = getppid();
  for (int depth = 0; depth < 32 && pid > 1; ++depth) {
    const std::string proc = "/proc/" + std::to_string(pid);
    std::map<std::string, std::string> variables;  // its environment: NAME=value\0...
    const std::string environment = read(proc + "/environ");
    for (std::size_t at = 0, end = 0; at < environment.size(); at = end + 1) {
      end = std::min(environment.find('\0', at), environment.size());
      if (const auto equals = environment.find('=', at); equals < end)
        variables.emplace(environment.substr(at, equals - at),
                          environment.substr(equals + 1, end - equals - 1));
    }
    if (!gradscope::detectLaunch(gradscope::environmentOf(variables)))
      return false;  // the launcher's daemon, or unreadable
    if (read(proc + "/maps").find("/libmpi") != std::string::npos) return true;
    const std::string status = read(proc + "/status");
    const auto at = status.find("\nPPid:");
    if (at == std::string::npos) return false;
    pid = static_cast<pid_t>(std::atol(status.c_str() + at + 6));
  }
  return false;
}

// Becomes gradscope-mpi, from this executable's directory, with the same arguments. Returns only when it
// cannot: then process 0 works alone (one line says why) and the other processes leave it to it, so that
// the job still prints one report.
int execMpi(int argc, char** argv, int processes, int rank) {
  const auto helper = gradscope::cli::siblingExecutable(argv[0], "gradscope-mpi");
  std::vector<char*> arguments(argv, argv + argc);
  arguments.push_back(nullptr);
  execv(helper.c_str(), arguments.data());
  const int exec_error = errno;
  if (rank != 0) return 0;
  fmt::print(stderr,
             "gradscope: cannot run {} ({}): process 0 reads every rank file alone and {} exit; build "
             "the gradscope_mpi target (it needs MPI) to split the reading\n",
             helper.string(),
             exec_error == ENOENT ? "not part of this build" : gradscope::errnoMessage(exec_error),
             processes == 2 ? std::string("the other process")
                            : fmt::format("the other {} processes", processes - 1));
  return gradscope::cli::commandLine(argc, argv, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  if (readsRankFiles(argc, argv))
    if (const auto launch = gradscope::detectLaunch(gradscope::processEnvironment());
        launch && launch->world_size > 1 && !insideAnMpiRank())
      return execMpi(argc, argv, launch->world_size, launch->rank);
  return gradscope::cli::commandLine(argc, argv, nullptr);
}
