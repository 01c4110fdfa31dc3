// libnccl-profiler-gradscope.so: the tables NCCL looks up (ncclProfiler_v6 from NCCL 2.29, then
// ncclProfiler_v5, then ncclProfiler_v4) and the v6 and v4 adapters. Only these three symbols are
// exported (exports.map).

#include <cstring>

#include "profiler.h"

namespace gradscope::nccl_profiler {
namespace {

// v4 differs from v5 in init's argument order and in the descriptor's layout (a one-byte type, no API
// events, the Group as a Coll's parentObj): copy the fields the plugin reads into a v5 descriptor.
ncclResult_t initV4(void** context, int* activation_mask, const char* comm_name, std::uint64_t comm_hash,
                    int nodes, int nranks, int rank, ncclDebugLogger_t logger) {
  return init(context, comm_hash, activation_mask, comm_name, nodes, nranks, rank, logger);
}

ncclResult_t startEventV4(void* context, void** handle, ncclProfilerEventDescr_v4_t* descriptor) {
  if (descriptor == nullptr) return startEvent(context, handle, nullptr);
  ncclProfilerEventDescr_v5_t v5{};
  v5.type = descriptor->type;
  v5.parentObj = descriptor->parentObj;
  v5.rank = descriptor->rank;
  switch (descriptor->type) {
    case ncclProfileColl: {
      const auto& from = descriptor->coll;
      auto& to = v5.coll;
      to.seqNumber = from.seqNumber;
      to.func = from.func;
      to.sendBuff = from.sendBuff;
      to.recvBuff = from.recvBuff;
      to.count = from.count;
      to.root = from.root;
      to.datatype = from.datatype;
      to.nChannels = from.nChannels;
      to.nWarps = from.nWarps;
      to.algo = from.algo;
      to.proto = from.proto;
      to.parentGroup = descriptor->parentObj;
      v5.parentObj = nullptr;  // v5: a Coll's parentObj is its CollApi event, which v4 does not have
      break;
    }
    case ncclProfileProxyOp:
      v5.proxyOp.pid = descriptor->proxyOp.pid;
      v5.proxyOp.channelId = descriptor->proxyOp.channelId;
      v5.proxyOp.peer = descriptor->proxyOp.peer;
      v5.proxyOp.nSteps = descriptor->proxyOp.nSteps;
      v5.proxyOp.chunkSize = descriptor->proxyOp.chunkSize;
      v5.proxyOp.isSend = descriptor->proxyOp.isSend;
      break;
    case ncclProfileKernelCh:
      v5.kernelCh.channelId = descriptor->kernelCh.channelId;
      v5.kernelCh.pTimer = descriptor->kernelCh.pTimer;
      break;
    default: break;
  }
  return startEvent(context, handle, &v5);
}

// v6's descriptor is v5's with copy-engine events added to its union: the plugin asks for none of them, so
// a descriptor's first bytes (v5's size: the two are the same size) are v5's.
ncclResult_t startEventV6(void* context, void** handle, ncclProfilerEventDescr_v6_t* descriptor) {
  static_assert(sizeof(ncclProfilerEventDescr_v6_t) == sizeof(ncclProfilerEventDescr_v5_t));
  if (descriptor == nullptr) return startEvent(context, handle, nullptr);
  ncclProfilerEventDescr_v5_t v5;
  std::memcpy(&v5, descriptor, sizeof v5);
  return startEvent(context, handle, &v5);
}

ncclResult_t recordEventStateV4(void* handle, ncclProfilerEventState_v4_t state,
                                ncclProfilerEventStateArgs_v4_t* /*args*/) {
  // The plugin reads no state arguments (profiler.cc), so none need converting.
  return recordEventState(handle, state, nullptr);
}

}  // namespace
}  // namespace gradscope::nccl_profiler

using namespace gradscope::nccl_profiler;

extern "C" {

__attribute__((visibility("default"))) ncclProfiler_v6_t ncclProfiler_v6 = {
    "gradscope", init, startEventV6, stopEvent, recordEventState, finalize,
};

__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {
    "gradscope", init, startEvent, stopEvent, recordEventState, finalize,
};

__attribute__((visibility("default"))) ncclProfiler_v4_t ncclProfiler_v4 = {
    "gradscope", initV4, startEventV4, stopEvent, recordEventStateV4, finalize,
};

}  // extern "C"
