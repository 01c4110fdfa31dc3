#pragma once

// The MPI communicator (Open MPI; any MPI-3 library should do).

#include <memory>
#include <optional>
#include <span>
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

// A communicator over a private copy of the application's intracommunicator `*comm_handle` (an MPI_Comm;
// a pointer keeps mpi.h out of this header). Collective over that communicator; MPI must be initialised.
// The copy has our error handler, nothing sent on it can match the application's messages, and, unlike
// MPI_Comm_dup, making it runs none of the application's attribute copy callbacks. Refuses an
// intercommunicator (gradscope::Error).
//
// `sealed`: also makes now every communicator the strategies would create on it later (the node split
// and the leaders' split of sum/hier), and from then on it creates none: for a job at
// MPI_THREAD_MULTIPLE, where Open MPI 4.1 can deadlock when two threads create communicators at once
// (open-mpi/ompi#2025) and the job's threads may create theirs at any moment, the agent makes its
// copies only inside the job's own creation calls, and seals them. `concurrent` (sealed only): also the
// copy that concurrentCopy() hands out once, for the async strategies' worker thread.
std::unique_ptr<Communicator> mpiDuplicateOf(const void* comm_handle, bool sealed = false,
                                             bool concurrent = false);

// Forcing Open MPI's all-reduce algorithm (Communicator::withAlgorithm) sets a process-wide MPI_T
// variable while a communicator is created: a communicator another thread creates meanwhile gets the
// algorithm as well. By default withAlgorithm() forces lazily, which is safe where no other thread can
// create a communicator at the same time (gradscope bench; a job below MPI_THREAD_MULTIPLE, from the
// thread of its intercepted call). In a job at MPI_THREAD_MULTIPLE there is no such moment once
// MPI_Init_thread has returned: call this inside it, collectively over MPI_COMM_WORLD, with the
// algorithms that will be wanted. It makes one communicator per algorithm over MPI_COMM_WORLD now;
// from then on withAlgorithm() shares them with copies of the job's MPI_COMM_WORLD (mpiDuplicateOf of
// it, mpiWorld()), whose calls the job itself serialises, and refuses on every other communicator.
// `world` is a communicator over MPI_COMM_WORLD that the ranks agree over first: where some rank cannot
// force algorithms (no MPI_T, no coll/tuned, dynamic rules off) none does, and every rank throws
// gradscope::Error (withAlgorithm() then refuses everywhere). Once per process.
void mpiPrepareForcedAlgorithms(Communicator& world, std::span<const int> algorithms);
// Frees the communicators mpiPrepareForcedAlgorithms() made (before MPI_Finalize).
void mpiReleaseForcedAlgorithms();

}  // namespace gradscope::comm
