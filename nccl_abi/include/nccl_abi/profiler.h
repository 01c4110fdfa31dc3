#pragma once

// NCCL's profiler plugin interface, versions 6, 5 and 4, declared by gradscope (no NCCL or CUDA header is
// needed to build the plugin; what it shares with nccl.h and the tuner is in nccl_abi/nccl.h). Checked
// field by field against NVIDIA/nccl src/include/plugin/nccl_profiler.h,
// src/include/plugin/profiler/profiler_v5.h and profiler_v4.h (NCCL 2.28), profiler_v6.h (NCCL 2.29, whose
// loader tries v6, then v5, v4, ...; 2.28's starts at v5) and the example plugin (ext-profiler/example);
// tests/plugins/profiler/abi_layout_test.cc pins every offset derived here for LP64 Linux. Versions 1-3
// (NCCL 2.23-2.25) are not served: their init names no communicator, its size or this rank, which the
// plugin's trace needs.
//
// How NCCL 2.28 drives a plugin (src/plugin/profiler.cc):
// - Loading. With NCCL_PROFILER_PLUGIN=<name> NCCL dlopens <name>, then libnccl-profiler-<name>.so
//   ("none" disables profiling), and takes the newest table it finds: ncclProfiler_v5, then v4, ... (2.29
//   and later: ncclProfiler_v6 first)
//   The library is loaded at the first communicator's init and reference counted per communicator;
//   NCCL dlcloses it at the last finalize, so nothing of the plugin may outlive that call (threads).
// - init, once per communicator, on the thread creating it (inside ncclCommInitRank and friends), with
//   NCCL's lock on plugin loading. commId (v5) / commHash (v4) is comm->commHash: a 64-bit hash NCCL
//   derives from the communicator's unique id (for ncclCommSplit from the parent's hash and the colour),
//   equal on every rank of the communicator. The plugin writes the event types it wants into
//   *eActivationMask. That mask is one process-wide variable in NCCL (ncclProfilerEventMask): the last
//   init's value applies to every communicator, so a plugin must ask for the same mask every time. A
//   non-zero return disables the plugin for that communicator only (NCCL logs it and carries on); the
//   context is then never used.
// - startEvent(context, &handle, descriptor). Group and Coll/P2p events: on the thread that launches
//   the work, i.e. the job's thread inside the collective call (a call outside a group is an implicit
//   group) or inside its outermost ncclGroupEnd (NCCL's own thread for nonblocking communicators).
//   ProxyOp, ProxyStep and KernelCh events: on the communicator's proxy progress thread; a KernelCh event
//   is started, given ncclProfilerKernelChStop with the GPU stop timer, and stopped when the proxy sees
//   that channel of the kernel finish. A child's descriptor names its collective through parentObj (the
//   collective's handle). The plugin may set *handle to nullptr (not interested, or out of memory): NCCL
//   then passes nullptr to its children's parentObj and never stops it, and calls it nothing else.
// - stopEvent(handle): on the thread that started the event. For a Coll it means "enqueued" (the kernel
//   is launched), not "finished"; completion is known only from the children.
// - recordEventState(handle, state, args): state changes of proxy and kernel events, same thread as
//   the event's stop; args may be nullptr.
// - finalize(context): at ncclCommDestroy/ncclCommAbort, on that thread, after the communicator's proxy
//   work has ended.
// Every function but init should return ncclSuccess: NCCL ignores their results.
//
// Collective descriptor fields (NCCL 2.28 ncclProfilerStartTaskEvents):
// - seqNumber: comm->seqNumber[func], a counter per communicator *and per collective function*
//   (AllReduce, Broadcast, ...), incremented after each launch of that function on the communicator
//   (graph-captured launches are counted only when KernelCh events are active). It is equal on every rank
//   for one collective, but two functions on one communicator count independently.
// - func: ncclFuncToString: "AllReduce", "AllGather", "ReduceScatter", "Reduce", "Broadcast",
//   "SendRecv", "AlltoAll", ...; datatype: ncclDatatypeToString: "ncclFloat32", ... ("Unknown" for
//   ncclUint8 in NCCL 2.28, which has no name for it); algo: ncclAlgoToString: "TREE", "RING",
//   "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"; proto: "LL", "LL128", "SIMPLE".
//   The pointers are NCCL's static strings.
// - count: the count passed to the API (recvcount for ReduceScatter, sendcount for AllGather).
// - nChannels, nWarps: what NCCL chose for the collective.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "nccl_abi/nccl.h"

namespace gradscope::nccl_abi {

// ---- shared vocabulary (nccl_profiler.h; results and the logger are nccl_abi/nccl.h's) ---

typedef pid_t ncclPid_t;

// Event types: the bits of the activation mask (an int) and the `type` of a descriptor.
enum : int {
  ncclProfileGroup = 1u << 0,         // a launch (group) of collectives and point-to-point operations
  ncclProfileColl = 1u << 1,          // one collective of a launch
  ncclProfileP2p = 1u << 2,           // one send or receive of a launch
  ncclProfileProxyOp = 1u << 3,       // proxy (network) work of one channel of a Coll/P2p
  ncclProfileProxyStep = 1u << 4,     // one step of a ProxyOp
  ncclProfileProxyCtrl = 1u << 5,     // proxy thread activity
  ncclProfileKernelCh = 1u << 6,      // one channel of the kernel running a Coll/P2p
  ncclProfileNetPlugin = 1u << 7,     // network plugin's own events
  ncclProfileGroupApi = 1u << 8,      // v5: ncclGroupStart..End as the job called it
  ncclProfileCollApi = 1u << 9,       // v5: a collective API call
  ncclProfileP2pApi = 1u << 10,       // v5: a send/recv API call
  ncclProfileKernelLaunch = 1u << 11  // v5: the kernel launch of a group
};

// Event states (one enum for every version; values are fixed by NCCL).
typedef enum {
  ncclProfilerProxyOpSendPosted = 0,  // 0..7: v1-v3 proxy-op states, deprecated in v4
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,       // args->kernelCh.pTimer: the channel's GPU stop timer
  ncclProfilerGroupStartApiStop = 23,  // v5 GroupApi
  ncclProfilerGroupEndApiStart = 24,   // v5 GroupApi
} ncclProfilerEventState_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v4_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v5_t;

// ---- version 5 (NCCL 2.26 and later) ------------------------------------------------------------------
// NCCL declares each descriptor's members as anonymous structs inside an anonymous union, which C
// allows and C++ does not (an anonymous union holds data members only; clang -Wpedantic rejects it).
// Here each member's type is a named type of the descriptor, declared before the union: the same
// layout, pinned by tests/plugins/profiler/abi_layout_test.cc.

struct ncclProfilerEventDescr_v5_t {
  std::uint64_t type;  // one ncclProfile* bit
  void* parentObj;     // Coll: its CollApi event's handle (nullptr unless CollApi is active); children:
                       // their Coll/P2p's handle
  int rank;            // the communicator rank that originated the event
  struct GroupApi {
    bool graphCaptured;
    int groupDepth;
  };
  struct CollApi {
    const char* func;
    size_t count;
    const char* datatype;
    int root;
    void* stream;
    bool graphCaptured;
  };
  struct P2pApi {
    const char* func;
    size_t count;
    const char* datatype;
    void* stream;
    bool graphCaptured;
  };
  struct KernelLaunch {
    void* stream;
  };
  struct Coll {
    std::uint64_t seqNumber;  // per communicator and function (see above)
    const char* func;
    const void* sendBuff;
    void* recvBuff;
    size_t count;
    int root;
    const char* datatype;
    std::uint8_t nChannels;
    std::uint8_t nWarps;
    const char* algo;
    const char* proto;
    void* parentGroup;  // the Group event's handle (v4's parentObj)
  };
  struct P2p {
    const char* func;
    void* buff;
    const char* datatype;
    size_t count;
    int peer;
    std::uint8_t nChannels;
    void* parentGroup;
  };
  struct ProxyOp {
    ncclPid_t pid;  // process that posted the operation (a parent in another process is not ours)
    std::uint8_t channelId;
    int peer;
    int nSteps;
    int chunkSize;
    int isSend;
  };
  struct ProxyStep {
    int step;
  };
  struct KernelCh {
    std::uint8_t channelId;
    std::uint64_t pTimer;  // GPU global timer at the channel's start (raw GPU clock)
  };
  struct NetPlugin {
    std::int64_t id;
    void* data;
  };
  union {
    GroupApi groupApi;
    CollApi collApi;
    P2pApi p2pApi;
    KernelLaunch kernelLaunch;
    Coll coll;
    P2p p2p;
    ProxyOp proxyOp;
    ProxyStep proxyStep;
    KernelCh kernelCh;
    NetPlugin netPlugin;
  };
};

union ncclProfilerEventStateArgs_v5_t {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    std::uint64_t pTimer;  // GPU global timer at the channel's stop
  } kernelCh;
};

struct ncclProfiler_v5_t {
  const char* name;
  ncclResult_t (*init)(void** context, std::uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};

// ---- version 6 (NCCL 2.29 and later) ------------------------------------------------------------------
// v5's descriptor with three copy-engine (CE) events added to its union (ncclProfileCeColl = 1 << 12,
// CeSync = 1 << 13, CeBatch = 1 << 14, started only when the plugin asks for them; CE events record no
// states); v5's members keep their layout and the descriptor its size (112 bytes), and init, the states and
// their arguments are v5's.
inline constexpr int ncclProfileCeColl = 1 << 12;
inline constexpr int ncclProfileCeSync = 1 << 13;
inline constexpr int ncclProfileCeBatch = 1 << 14;
typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;
typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v6_t;

struct ncclProfilerEventDescr_v6_t {
  std::uint64_t type;
  void* parentObj;
  int rank;
  struct CeColl {
    std::uint64_t seqNumber;
    const char* func;
    const void* sendBuff;
    void* recvBuff;
    size_t count;
    int root;
    const char* datatype;
    const char* syncStrategy;
    bool intraBatchSync;
    std::uint32_t batchSize;
    std::uint32_t numBatches;
    std::uint32_t ceSeqNum;
    void* stream;
  };
  struct CeCollSync {
    bool isComplete;
    int nRanks;
  };
  struct CeCollBatch {
    int numOps;
    size_t totalBytes;
    bool useIntraSync;
  };
  union {
    ncclProfilerEventDescr_v5_t::GroupApi groupApi;
    ncclProfilerEventDescr_v5_t::CollApi collApi;
    ncclProfilerEventDescr_v5_t::P2pApi p2pApi;
    ncclProfilerEventDescr_v5_t::KernelLaunch kernelLaunch;
    ncclProfilerEventDescr_v5_t::Coll coll;
    ncclProfilerEventDescr_v5_t::P2p p2p;
    ncclProfilerEventDescr_v5_t::ProxyOp proxyOp;
    ncclProfilerEventDescr_v5_t::ProxyStep proxyStep;
    ncclProfilerEventDescr_v5_t::KernelCh kernelCh;
    ncclProfilerEventDescr_v5_t::NetPlugin netPlugin;
    CeColl ceColl;
    CeCollSync ceCollSync;
    CeCollBatch ceCollBatch;
  };
};

struct ncclProfiler_v6_t {
  const char* name;
  ncclResult_t (*init)(void** context, std::uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v6_t eState,
                                   ncclProfilerEventStateArgs_v6_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};

// ---- version 4 (NCCL 2.25) ------------------------------------------------------------------------------
// Differences from v5: `type` is one byte; no API or kernel-launch events; a Coll's parentObj is its
// Group event; init takes the communicator name before the hash.

struct ncclProfilerEventDescr_v4_t {
  std::uint8_t type;
  void* parentObj;
  int rank;
  struct Coll {
    std::uint64_t seqNumber;
    const char* func;
    const void* sendBuff;
    void* recvBuff;
    size_t count;
    int root;
    const char* datatype;
    std::uint8_t nChannels;
    std::uint8_t nWarps;
    const char* algo;
    const char* proto;
  };
  struct P2p {
    const char* func;
    void* buff;
    const char* datatype;
    size_t count;
    int peer;
    std::uint8_t nChannels;
  };
  struct ProxyOp {
    ncclPid_t pid;
    std::uint8_t channelId;
    int peer;
    int nSteps;
    int chunkSize;
    int isSend;
  };
  struct ProxyStep {
    int step;
  };
  struct KernelCh {
    std::uint8_t channelId;
    std::uint64_t pTimer;
  };
  struct NetPlugin {
    std::int64_t id;
    void* data;
  };
  union {
    Coll coll;
    P2p p2p;
    ProxyOp proxyOp;
    ProxyStep proxyStep;
    KernelCh kernelCh;
    NetPlugin netPlugin;
  };
};

union ncclProfilerEventStateArgs_v4_t {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    std::uint64_t pTimer;
  } kernelCh;
};

struct ncclProfiler_v4_t {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName, std::uint64_t commHash,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v4_t eState,
                                   ncclProfilerEventStateArgs_v4_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};

}  // namespace gradscope::nccl_abi
