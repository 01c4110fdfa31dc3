// libgradscope-fake-nccl.so: a one-rank NCCL on host memory, for testing the agent's NCCL interposer on
// machines without a GPU. Like libnccl.so.2 it exports every API function of agent/src/nccl_functions.def
// twice, as a strong pncclX (the implementation) and a weak ncclX alias, with NCCL 2.28's signatures
// (nccl_abi.h, checked against nccl.h by agent/src/abi_check.cc).
//
// Semantics: communicators have one rank (ncclCommInitAll and ncclCommSplit included), so every
// collective copies its send buffer to its receive buffer. Inside ncclGroupStart/End the calls are
// queued and run at the outermost ncclGroupEnd, as NCCL launches them. ncclGetUniqueId is
// deterministic: byte i of the n-th id (from 0) is (7·i + 13·n) mod 256, so tests can compute the
// agent's communicator keys.
//
// Fake GPU: when GRADSCOPE_FAKE_CUDA names the fake driver (fake_cuda.cc), the first communicator
// loads it (as NCCL loads libcuda through the CUDA runtime) and every collective queues a kernel of
// GRADSCOPE_FAKE_KERNEL_NS nanoseconds (default 1 ms) on its stream.

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "nccl_abi.h"

using namespace gradscope::agent::nccl;

struct gradscope::agent::nccl::ncclComm {
  int nranks = 1;
  int rank = 0;
  int device = 0;
};

namespace {

using Launch = void (*)(cudaStream_t stream, std::int64_t duration_ns);
Launch g_launch = nullptr;
std::int64_t g_kernel_ns = 1'000'000;

void loadFakeCuda() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("GRADSCOPE_FAKE_CUDA");
    if (path == nullptr || *path == '\0') return;
    void* library = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr) return;
    g_launch = reinterpret_cast<Launch>(dlsym(library, "fakeCudaLaunch"));
    if (const char* ns = std::getenv("GRADSCOPE_FAKE_KERNEL_NS")) g_kernel_ns = std::atoll(ns);
  });
}

std::size_t sizeOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

thread_local int t_group_depth = 0;
thread_local std::vector<std::function<void()>> t_group_work;

// Runs `work` now, or at the outermost ncclGroupEnd; each run is one kernel on `stream`.
ncclResult_t submit(ncclComm_t comm, ncclDataType_t type, cudaStream_t stream, std::function<void()> work) {
  if (comm == nullptr || sizeOf(type) == 0) return ncclInvalidArgument;
  auto run = [stream, work = std::move(work)] {
    work();
    if (g_launch != nullptr) g_launch(stream, g_kernel_ns);
  };
  if (t_group_depth > 0) t_group_work.push_back(std::move(run));
  else run();
  return ncclSuccess;
}

void copy(void* to, const void* from, std::size_t count, ncclDataType_t type) {
  if (to != from && count > 0) std::memmove(to, from, count * sizeOf(type));
}

ncclResult_t newComm(ncclComm_t* comm, int nranks, int rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  loadFakeCuda();
  *comm = new ncclComm{nranks, rank, 0};
  return ncclSuccess;
}

}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  static std::atomic<int> ids{0};
  const int n = ids.fetch_add(1);
  for (std::size_t i = 0; i < kUniqueIdBytes; ++i)
    uniqueId->internal[i] = static_cast<char>((7 * i + 13 * static_cast<std::size_t>(n)) & 0xff);
  return ncclSuccess;
}

FAKE_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error" : "fake NCCL error";
}

FAKE_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr) return ncclInvalidArgument;
  *device = comm->device;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId, int rank,
                                                 ncclConfig_t*) {
  if (nranks != 1 || rank != 0) return ncclInvalidArgument;
  return newComm(comm, nranks, rank);
}

FAKE_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return pncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

FAKE_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nId,
                                                   ncclUniqueId*, ncclConfig_t*) {
  if (nranks != 1 || rank != 0 || nId < 1) return ncclInvalidArgument;
  return newComm(comm, nranks, rank);
}

FAKE_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int*) {
  if (comm == nullptr || ndev < 1) return ncclInvalidArgument;
  for (int i = 0; i < ndev; ++i) newComm(&comm[i], ndev, i);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int, ncclComm_t* newcomm, ncclConfig_t*) {
  if (comm == nullptr || newcomm == nullptr) return ncclInvalidArgument;
  if (color == kSplitNoColor) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  return newComm(newcomm, 1, 0);
}

FAKE_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  if (comm != nullptr && root != comm->rank) return ncclInvalidArgument;
  return submit(comm, datatype, stream, [=] { copy(recvbuff, sendbuff, count, datatype); });
}

FAKE_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream) {
  if (comm != nullptr && root != comm->rank) return ncclInvalidArgument;
  return submit(comm, datatype, stream, [=] { copy(recvbuff, sendbuff, count, datatype); });
}

FAKE_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t, ncclComm_t comm,
                                        cudaStream_t stream) {
  return submit(comm, datatype, stream, [=] { copy(recvbuff, sendbuff, count, datatype); });
}

FAKE_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                            ncclDataType_t datatype, ncclRedOp_t, ncclComm_t comm,
                                            cudaStream_t stream) {
  return submit(comm, datatype, stream, [=] { copy(recvbuff, sendbuff, recvcount, datatype); });
}

FAKE_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, datatype, stream, [=] { copy(recvbuff, sendbuff, sendcount, datatype); });
}

FAKE_EXPORT ncclResult_t pncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclGroupEnd() {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth == 0) {
    for (auto& work : t_group_work) work();
    t_group_work.clear();
  }
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t*) {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth == 0) t_group_work.clear();
  return ncclSuccess;
}

// The weak ncclX of every row, aliases of the pncclX above (what `nm -D libnccl.so.2` shows: W and T).
#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS) \
  FAKE_EXPORT RESULT NAME PARAMS __attribute__((weak, alias("p" #NAME)));
#include "nccl_functions.def"
#undef GS_NCCL_FUNCTION
