#pragma once

// NCCL's tuner plugin interface, declared by gradscope so that libnccl-tuner-gradscope.so builds without
// NCCL or CUDA headers (NCCL installs only nccl.h, never the plugin headers). Written from NVIDIA/nccl
// src/include/plugin/nccl_tuner.h, src/include/plugin/tuner/tuner_v{3,4,5}.h and the loaders
// src/plugin/tuner.cc and src/plugin/tuner/tuner_v{3,4,5}.cc (NCCL 2.28); what it shares with nccl.h and
// the profiler is in nccl_abi/nccl.h. The layouts are proved in
// tests/plugins/tuner/abi_test.cc (sizes and offsets derived from those headers).
//
// How NCCL 2.28 drives a tuner (src/plugin/tuner.cc):
//   - The library is dlopen'ed when the first communicator is created (NCCL_TUNER_PLUGIN=<name> loads
//     libnccl-tuner-<name>.so, or a path; "none" disables) and dlclose'd when the last communicator that
//     loaded it is destroyed. NCCL looks for ncclTunerPlugin_v6 (newer NCCL only), then _v5, _v4, _v3, _v2,
//     and uses the first it finds; older versions go through adapters that NCCL writes around them.
//   - init is called once per communicator, during communicator creation, on the thread that creates it
//     (several communicators may be created concurrently on different threads).
//   - getCollInfo is called for every collective (or aggregated group of them) NCCL schedules, on the
//     thread that enqueues it (the application's thread, inside ncclAllReduce/ncclGroupEnd). Calls for one
//     communicator are serialised by NCCL; calls for different communicators may run concurrently.
//   - finalize (destroy before v5) is called once per communicator when it is destroyed; no getCollInfo
//     for that context runs at the same time or afterwards.
//
// Names are NCCL's own so that this file reads like NCCL's headers.

#include <cstddef>
#include <cstdint>

#include "nccl_abi/nccl.h"

namespace gradscope::nccl_abi {

// nccl_common.h. A tuner sees only the first NCCL_NUM_FUNCTIONS (5) values: Send/Recv and the newer
// functions (up to ncclNumFuncs = 15 in recent NCCL) never reach getCollInfo, but the enum is wider, so
// getCollInfo range-checks it. The fixed underlying type (int, what NCCL's C enum has) makes every value
// NCCL might pass a valid one here.
enum ncclFunc_t : int {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
};
inline constexpr int NCCL_NUM_FUNCTIONS = 5;

// nccl_tuner.h: row and column indexes of the cost table.
inline constexpr int NCCL_ALGO_UNDEF = -1;
inline constexpr int NCCL_ALGO_TREE = 0;
inline constexpr int NCCL_ALGO_RING = 1;
inline constexpr int NCCL_ALGO_COLLNET_DIRECT = 2;
inline constexpr int NCCL_ALGO_COLLNET_CHAIN = 3;
inline constexpr int NCCL_ALGO_NVLS = 4;
inline constexpr int NCCL_ALGO_NVLS_TREE = 5;
inline constexpr int NCCL_ALGO_PAT = 6;
inline constexpr int NCCL_NUM_ALGORITHMS_V5 = 7;

inline constexpr int NCCL_PROTO_UNDEF = -1;
inline constexpr int NCCL_PROTO_LL = 0;
inline constexpr int NCCL_PROTO_LL128 = 1;
inline constexpr int NCCL_PROTO_SIMPLE = 2;
inline constexpr int NCCL_NUM_PROTOCOLS_V5 = 3;

// A cost-table entry NCCL will not use (excluded by NCCL_ALGO/NCCL_PROTO, or unsupported here).
inline constexpr float NCCL_ALGO_PROTO_IGNORE = -1.0f;

inline constexpr int NCCL_NUM_HW_LINKS_V5 = 3;       // NVLink, PCI, network
inline constexpr int NCCL_NUM_COMPCAPS_V5 = 4;       // Volta, Ampere, Hopper, Blackwell
inline constexpr int NCCL_NUM_TUNING_SCALES_V5 = 3;  // 1, 2, 4 nodes

// tuner_v5.h: NVLink domains of the communicator. Read-only input to init; may be null.
struct ncclNvlDomainInfo_v5_t {
  int nNvlDomains;           // number of NVLink domains
  int minRanksPerNvlDomain;  // fewest ranks in one domain
  int maxRanksPerNvlDomain;  // most ranks in one domain
};

// tuner_v5.h: the constants of NCCL's own cost model, which init may adjust before NCCL computes the cost
// tables of this communicator. gradscope never touches them: it steers per call through the table.
struct ncclTunerConstants_v5_t {
  double baseLatencies[NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double hwLatencies[NCCL_NUM_HW_LINKS_V5][NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double llMaxBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
};

// getCollInfo, the same in v3 (without regBuff), v4 and v5.
//   context       what init stored in *ctx.
//   collType      the collective; nBytes its size as NCCL sizes it: the larger of the send and receive
//                 buffers, so the total (count x nRanks x element size) for AllGather and ReduceScatter.
//   numPipeOps    number of operations NCCL aggregated into this one (1 outside groups).
//   collCostTable really float[numAlgo][numProto] (row = algorithm, column = protocol) passed as float**:
//                 index it as a flat row-major array, never as float*[] (NVIDIA's 2.28 example does, and
//                 reads pointers out of float bits). Entries are NCCL's predicted times in microseconds;
//                 NCCL_ALGO_PROTO_IGNORE (-1) marks combinations NCCL will not run. NCCL picks the smallest
//                 entry >= 0 after the call. The plugin may lower entries; it must set both algorithm and
//                 protocol (one entry), never only one of them, and must not write outside the table.
//   regBuff       whether the user buffers are registered (or graph-registered); v5 and v4 only.
//   nChannels     in: 0; out: the most channels NCCL may use for this call (0 keeps NCCL's own).
// Returning anything but ncclSuccess makes NCCL fall back to its default tuning for this call.
// No allocation, no blocking: it runs on the application's thread inside every collective.
using GetCollInfoFunction = ncclResult_t (*)(void* context, ncclFunc_t collType, size_t nBytes,
                                             int numPipeOps, float** collCostTable, int numAlgo, int numProto,
                                             int regBuff, int* nChannels);

// tuner_v5.h: the interface NCCL 2.28 prefers.
struct ncclTuner_v5_t {
  const char* name;  // printed by NCCL ("TUNER/Plugin: Using <name> (v5)")
  // Once per communicator at creation. commId identifies the communicator (equal on all its ranks);
  // nRanks, nNodes its size. logFunction stays valid until finalize. nvlDomainInfo (may be null) is input
  // only; constants may be adjusted (we do not). Writes the context to *ctx. An error here makes NCCL
  // fail the communicator's creation, so gradscope returns ncclSuccess for every configuration problem.
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  GetCollInfoFunction getCollInfo;
  // Once per communicator at its destruction: frees the context; nothing uses it afterwards.
  ncclResult_t (*finalize)(void* context);
};

// tuner_v4.h (older NCCL; 2.28 still loads it). No communicator id, no constants, and the
// context is the last argument of init; getCollInfo is v5's; destroy is v5's finalize.
struct ncclTuner_v4_t {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  GetCollInfoFunction getCollInfo;
  ncclResult_t (*destroy)(void* context);
};

// tuner_v3.h (older NCCL; 2.28 still loads it): v4 without the regBuff argument of getCollInfo.
struct ncclTuner_v3_t {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* context);
};

// v2 (the oldest that 2.28 loads) returns one algorithm and protocol without seeing the cost table, so the
// plugin could neither check that NCCL can run them nor explore; gradscope does not export it.

}  // namespace gradscope::nccl_abi
