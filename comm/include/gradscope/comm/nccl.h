#pragma once

// The NCCL communicator: one rank per GPU, device buffers, work ordered on one CUDA stream per
// communicator. Ranks find each other through MPI when started by an MPI launcher (the unique id is
// broadcast over MPI_COMM_WORLD, each rank uses GPU local_rank % device_count), else the job is a
// single rank.

#include <memory>
#include <string>
#include <string_view>

#include "gradscope/comm/communicator.h"

namespace gradscope::comm {

// True when this build has NCCL and a GPU is usable; otherwise false and `reason` says why.
bool ncclAvailable(std::string* reason = nullptr);

// Creates the world communicator (collective over the launcher's ranks). Throws gradscope::Error with
// the reason when NCCL or a GPU is not available.
std::unique_ptr<Communicator> ncclWorld();

// For ranks started by something other than an MPI launcher (a test that starts its own processes, a
// job's launcher): rank 0 makes the id (ncclGetUniqueId's bytes), hands it to the others by its own
// means, and every rank creates its communicator from it, collectively. `device` is the GPU this rank
// uses; -1 takes the launcher's local rank modulo the GPUs, as ncclWorld() does. Throws gradscope::Error
// with the reason when NCCL or a GPU is not available, or the id is not one.
std::string ncclNewUniqueId();
std::unique_ptr<Communicator> ncclFromUniqueId(std::string_view unique_id, int rank, int ranks,
                                               int device = -1);

// The agent's explore and apply modes (agent/extensions/nccl_extension.cc), inside a job that drives NCCL
// itself.
//
// A communicator over the ranks of the job's communicator `job_comm` (an ncclComm_t): ncclCommSplit of
// it, blocking whatever the job's configuration. Collective over `job_comm`, on the GPU the job uses
// with it. A rank that passes join = false takes part in the split without joining (NCCL_SPLIT_NOCOLOR)
// and gets nullptr; the others then get a communicator smaller than the job's, which tells them.
std::unique_ptr<Communicator> ncclDuplicateOf(void* job_comm, bool join);

// The CUDA stream (a cudaStream_t) on which an NCCL communicator from this header enqueues its work.
void* ncclStreamOf(Communicator& comm);

}  // namespace gradscope::comm
