// ncclWorld(): the NCCL communicator over the launcher's ranks (nccl.h).

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gradscope/comm/mpi.h"
#include "gradscope/comm/nccl.h"
#include "gradscope/common/error.h"
#include "nccl_internal.h"

namespace gradscope::comm {
namespace {

using detail::checkCuda;
using detail::checkNccl;

// This process's index among the launcher's ranks on its node (Open MPI, MPICH/Hydra, Slurm).
int localRank() {
  for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* text = std::getenv(variable); text != nullptr) return std::atoi(text);
  return 0;
}

}  // namespace

std::unique_ptr<Communicator> ncclWorld() {
  std::string reason;
  if (!ncclAvailable(&reason)) fail("NCCL: {}", reason);
  if (!mpiBuilt() || !underMpiLauncher()) return ncclFromUniqueId(ncclNewUniqueId(), 0, 1);
  // Rank 0's id reaches the others over MPI (as an array of int32: the MPI backend moves whole types).
  static_assert(sizeof(ncclUniqueId) % sizeof(std::int32_t) == 0);
  const std::unique_ptr<Communicator> mpi = mpiWorld();
  ncclUniqueId id{};
  if (mpi->rank() == 0) checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  mpi->broadcast(&id, sizeof id / sizeof(std::int32_t), Element{DType::Int32}, 0);
  return ncclFromUniqueId(std::string_view(id.internal, sizeof id.internal), mpi->rank(), mpi->size());
}

std::string ncclNewUniqueId() {
  std::string reason;
  if (!ncclAvailable(&reason)) fail("NCCL: {}", reason);
  ncclUniqueId id{};
  checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof id.internal);
}

std::unique_ptr<Communicator> ncclFromUniqueId(std::string_view unique_id, int rank, int ranks, int device) {
  std::string reason;
  if (!ncclAvailable(&reason)) fail("NCCL: {}", reason);
  ncclUniqueId id{};
  if (unique_id.size() != sizeof id.internal)
    fail("NCCL: a unique id is {} bytes, not {} (ncclNewUniqueId() makes one)", sizeof id.internal,
         unique_id.size());
  if (ranks < 1 || rank < 0 || rank >= ranks) fail("NCCL: rank {} of {} ranks is not one", rank, ranks);
  unique_id.copy(id.internal, sizeof id.internal);
  int devices = 0;
  checkCuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (device >= devices) fail("NCCL: GPU {} asked for, but this process sees {}", device, devices);
  if (device < 0) device = localRank() % devices;
  checkCuda(cudaSetDevice(device), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  checkNccl(ncclCommInitRank(&comm, ranks, id, rank), "ncclCommInitRank");
  return detail::ncclCommunicator(comm, device);
}

}  // namespace gradscope::comm
