#pragma once

// The gradscope command line, shared by the two executables that run it: `gradscope` (main.cc) and
// `gradscope-mpi` (mpi_main.cc), which `gradscope` becomes under an MPI launcher for the commands that
// read a run's directory of rank files, so that the launcher's processes share the reading.

#include <filesystem>

namespace gradscope::storage {
class MergeLink;
}

namespace gradscope::cli {

// Exit codes: 0 success; 1 reserved for `gradscope check` finding a regression; 2 any error.
inline constexpr int kExitError = 2;

// The executable `name` beside this one (gradscope-bench, gradscope-mpi): in the directory of
// /proc/self/exe, else of `argv0`.
std::filesystem::path siblingExecutable(const char* argv0, const char* name);

// Parses argv and runs the command. `merge_link`: the processes a directory's rank files are merged
// across (storage/merge.h; this process is their process 0), or null for this process alone.
int commandLine(int argc, char** argv, storage::MergeLink* merge_link);

}  // namespace gradscope::cli
