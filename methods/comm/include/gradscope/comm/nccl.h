#pragma once

// The NCCL communicator: one rank per GPU, device buffers, work ordered on one CUDA stream per
// communicator. Ranks find each other through MPI when started by an MPI launcher (the unique id is
// broadcast over MPI_COMM_WORLD, each rank uses GPU local_rank % device_count), else the job is a
// single rank.

#include <memory>
#include <string>

#include "gradscope/comm/communicator.h"

namespace gradscope::comm {

// True when this build has NCCL and a GPU is usable; otherwise false and `reason` says why.
bool ncclAvailable(std::string* reason = nullptr);

// Creates the world communicator (collective over the launcher's ranks). Throws gradscope::Error with
// the reason when NCCL or a GPU is not available.
std::unique_ptr<Communicator> ncclWorld();

}  // namespace gradscope::comm
