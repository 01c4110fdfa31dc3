// ncclWorld(): the NCCL communicator over the launcher's ranks (nccl.h).

#include <cstdint>
#include <cstdlib>
#include <string>

#include "gradscope/comm/mpi.h"
#include "gradscope/comm/nccl.h"
#include "gradscope/common/error.h"
#include "nccl_internal.h"

namespace gradscope::comm {
namespace {

// This process's index among the launcher's ranks on its node (Open MPI, MPICH/Hydra, Slurm).
int localRank() {
  for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* text = std::getenv(variable); text != nullptr) return std::atoi(text);
  return 0;
}

}  // namespace

std::unique_ptr<Communicator> ncclWorld() {
  using detail::checkCuda;
  using detail::checkNccl;
  std::string reason;
  if (!ncclAvailable(&reason)) fail("NCCL: {}", reason);
  int ranks = 1;
  int rank = 0;
  ncclUniqueId id{};
  if (mpiBuilt() && underMpiLauncher()) {
    // Rank 0's id reaches the others over MPI (as an array of int32: the MPI backend moves whole types).
    static_assert(sizeof(ncclUniqueId) % sizeof(std::int32_t) == 0);
    const std::unique_ptr<Communicator> mpi = mpiWorld();
    ranks = mpi->size();
    rank = mpi->rank();
    if (rank == 0) checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    mpi->broadcast(&id, sizeof id / sizeof(std::int32_t), Element{DType::Int32}, 0);
  } else {
    checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  }
  int devices = 0;
  checkCuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  const int device = localRank() % devices;
  checkCuda(cudaSetDevice(device), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  checkNccl(ncclCommInitRank(&comm, ranks, id, rank), "ncclCommInitRank");
  return detail::ncclCommunicator(comm, device);
}

}  // namespace gradscope::comm
