// The layouts nccl_abi/profiler.h declares, pinned to the offsets of NVIDIA/nccl's headers (NCCL 2.28,
// src/include/plugin/profiler/profiler_v5.h and profiler_v4.h; 2.29's profiler_v6.h) on LP64 Linux, derived
// by hand from the field order and C's alignment rules. A change to a declaration that moves any field fails
// the build.

#include <cstddef>

#include <gtest/gtest.h>

#include "nccl_abi/profiler.h"

namespace {

using namespace gradscope::nccl_abi;
using D5 = ncclProfilerEventDescr_v5_t;
using D4 = ncclProfilerEventDescr_v4_t;

// v5 descriptor: type (8) at 0, parentObj at 8, rank at 16, the union at 24 (8-aligned).
static_assert(offsetof(D5, type) == 0 && offsetof(D5, parentObj) == 8 && offsetof(D5, rank) == 16);
static_assert(offsetof(D5, coll) == 24);
static_assert(offsetof(D5, coll.seqNumber) == 24 && offsetof(D5, coll.func) == 32 &&
              offsetof(D5, coll.sendBuff) == 40 && offsetof(D5, coll.recvBuff) == 48 &&
              offsetof(D5, coll.count) == 56 && offsetof(D5, coll.root) == 64 &&
              offsetof(D5, coll.datatype) == 72 && offsetof(D5, coll.nChannels) == 80 &&
              offsetof(D5, coll.nWarps) == 81 && offsetof(D5, coll.algo) == 88 &&
              offsetof(D5, coll.proto) == 96 && offsetof(D5, coll.parentGroup) == 104);
static_assert(offsetof(D5, groupApi.graphCaptured) == 24 && offsetof(D5, groupApi.groupDepth) == 28);
static_assert(offsetof(D5, collApi.func) == 24 && offsetof(D5, collApi.count) == 32 &&
              offsetof(D5, collApi.datatype) == 40 && offsetof(D5, collApi.root) == 48 &&
              offsetof(D5, collApi.stream) == 56 && offsetof(D5, collApi.graphCaptured) == 64);
static_assert(offsetof(D5, p2p.func) == 24 && offsetof(D5, p2p.buff) == 32 &&
              offsetof(D5, p2p.datatype) == 40 && offsetof(D5, p2p.count) == 48 &&
              offsetof(D5, p2p.peer) == 56 && offsetof(D5, p2p.nChannels) == 60 &&
              offsetof(D5, p2p.parentGroup) == 64);
static_assert(offsetof(D5, proxyOp.pid) == 24 && offsetof(D5, proxyOp.channelId) == 28 &&
              offsetof(D5, proxyOp.peer) == 32 && offsetof(D5, proxyOp.nSteps) == 36 &&
              offsetof(D5, proxyOp.chunkSize) == 40 && offsetof(D5, proxyOp.isSend) == 44);
static_assert(offsetof(D5, kernelCh.channelId) == 24 && offsetof(D5, kernelCh.pTimer) == 32);
static_assert(offsetof(D5, netPlugin.id) == 24 && offsetof(D5, netPlugin.data) == 32);
static_assert(sizeof(D5) == 112);  // the coll member is the largest: 24 + 88

// v4 descriptor: a one-byte type, then the same header; no API members and no parentGroup.
static_assert(offsetof(D4, type) == 0 && offsetof(D4, parentObj) == 8 && offsetof(D4, rank) == 16);
static_assert(offsetof(D4, coll.seqNumber) == 24 && offsetof(D4, coll.func) == 32 &&
              offsetof(D4, coll.count) == 56 && offsetof(D4, coll.datatype) == 72 &&
              offsetof(D4, coll.nChannels) == 80 && offsetof(D4, coll.algo) == 88 &&
              offsetof(D4, coll.proto) == 96);
static_assert(offsetof(D4, proxyOp.pid) == 24 && offsetof(D4, kernelCh.pTimer) == 32);
static_assert(sizeof(D4) == 104);

// State arguments: one 8-byte member at 0 each.
static_assert(sizeof(ncclProfilerEventStateArgs_v5_t) == 8 && sizeof(ncclProfilerEventStateArgs_v4_t) == 8);
static_assert(offsetof(ncclProfilerEventStateArgs_v5_t, kernelCh.pTimer) == 0);

// The tables: name and five function pointers.
static_assert(sizeof(ncclProfiler_v5_t) == 48 && offsetof(ncclProfiler_v5_t, init) == 8 &&
              offsetof(ncclProfiler_v5_t, startEvent) == 16 && offsetof(ncclProfiler_v5_t, stopEvent) == 24 &&
              offsetof(ncclProfiler_v5_t, recordEventState) == 32 &&
              offsetof(ncclProfiler_v5_t, finalize) == 40);
static_assert(sizeof(ncclProfiler_v4_t) == 48 && offsetof(ncclProfiler_v4_t, finalize) == 40);

// v6 (NCCL 2.29, profiler_v6.h): v5's members at v5's offsets, the CE members beside them, the same size.
// These offsets were read off NCCL's own v2.29.2 header, compiled as C (offsetof) on this machine.
using D6 = ncclProfilerEventDescr_v6_t;
static_assert(sizeof(D6) == 112 && sizeof(D6) == sizeof(D5) && offsetof(D6, groupApi) == 24);
static_assert(offsetof(D6, coll.proto) == 96 && offsetof(D6, coll.proto) == offsetof(D5, coll.proto) &&
              offsetof(D6, kernelCh.pTimer) == 32 &&
              offsetof(D6, p2p.parentGroup) == offsetof(D5, p2p.parentGroup));
static_assert(offsetof(D6, ceColl.syncStrategy) == 80 && offsetof(D6, ceColl.intraBatchSync) == 88 &&
              offsetof(D6, ceColl.batchSize) == 92 && offsetof(D6, ceColl.ceSeqNum) == 100 &&
              offsetof(D6, ceColl.stream) == 104);
static_assert(offsetof(D6, ceCollSync.nRanks) == 28 && offsetof(D6, ceCollBatch.totalBytes) == 32 &&
              offsetof(D6, ceCollBatch.useIntraSync) == 40);
static_assert(sizeof(ncclProfiler_v6_t) == 48 && offsetof(ncclProfiler_v6_t, recordEventState) == 32 &&
              offsetof(ncclProfiler_v6_t, finalize) == 40);
static_assert(ncclProfileCeColl == 4096 && ncclProfileCeSync == 8192 && ncclProfileCeBatch == 16384);

// Values fixed by NCCL.
static_assert(ncclProfileColl == 2 && ncclProfileProxyOp == 8 && ncclProfileKernelCh == 64 &&
              ncclProfileKernelLaunch == 2048);
static_assert(ncclProfilerKernelChStop == 22 && ncclProfilerGroupEndApiStart == 24);
static_assert(sizeof(ncclResult_t) == 4 && ncclInProgress == 7);

TEST(ProfilerAbi, LayoutsAreNcclsAtCompileTime) {
  // Everything above is checked by the compiler; this names the check in the test list.
  SUCCEED();
}

}  // namespace
