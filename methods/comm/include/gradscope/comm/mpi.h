#pragma once

// The MPI communicator (Open MPI; any MPI-3 library should do).

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "gradscope/comm/communicator.h"

namespace gradscope::comm {

// True when this build has the MPI backend; otherwise false and `reason` says why.
bool mpiBuilt(std::string* reason = nullptr);

// True when this process was started by an MPI launcher (mpirun/mpiexec/srun: OMPI_COMM_WORLD_SIZE,
// PMIX_RANK, PMI_RANK or PMI_SIZE in the environment).
bool underMpiLauncher();

// The thread support asked for when gradscope initialises MPI itself: MPI_THREAD_SINGLE … MULTIPLE.
enum class MpiThreads { Single, Funneled, Serialized, Multiple };
std::string_view name(MpiThreads threads);  // "single", "funneled", "serialized", "multiple"
std::optional<MpiThreads> parseMpiThreads(std::string_view text);

// Initialises MPI if nobody has (at `threads`; with coll/tuned's dynamic rules switched on so that
// withAlgorithm() can force an all-reduce algorithm per communicator, unless the user set
// OMPI_MCA_coll_tuned_use_dynamic_rules) and returns a duplicate of MPI_COMM_WORLD (collective: our
// error handler, MPI_ERRORS_RETURN, and our messages stay off the application's communicator). MPI is
// finalised at exit if this call initialised it. Throws gradscope::Error when the build has no MPI.
//
// Single by default, as OSU's benchmarks start MPI: only the thread that initialised MPI ever calls it
// (gradscope's CPU pool threads run kernels, never MPI), and at any higher level Open MPI takes a lock
// at every progress step, which made small calls 8–34% slower here (docs/benchmarks.md). A job at a higher
// level (mpi4py asks for MULTIPLE) pays that lock; `gradscope bench --mpi-threads` measures it.
std::unique_ptr<Communicator> mpiWorld(MpiThreads threads = MpiThreads::Single);

// A communicator over a duplicate of the application's communicator `*comm_handle` (an MPI_Comm; a
// pointer keeps mpi.h out of this header). Collective over that communicator; MPI must be initialised.
// The duplicate has our error handler, and nothing sent on it can match the application's messages.
std::unique_ptr<Communicator> mpiDuplicateOf(const void* comm_handle);

}  // namespace gradscope::comm
