#pragma once

// What nccl_communicator.cc shares with nccl_world.cc. ncclWorld() lives in a file of its own because it
// finds the other ranks through MPI: a library that only wraps communicators the job made (the agent's
// NCCL extension) then links no MPI.

#include <memory>
#include <string_view>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "gradscope/comm/communicator.h"

namespace gradscope::comm::detail {

// Throw gradscope::Error "<what> failed: <the library's message>".
void checkNccl(ncclResult_t result, std::string_view what);
void checkCuda(cudaError_t status, std::string_view what);

// The communicator over `comm` on GPU `device`, which it owns from now on.
std::unique_ptr<Communicator> ncclCommunicator(ncclComm_t comm, int device);

}  // namespace gradscope::comm::detail
