#pragma once

// The profiler plugin's state: one Context per communicator (NCCL's init), a fixed pool of collective
// slots per context, and the process-wide Sink that writes completed collectives.
//
// Design.
// - Two modes, fixed at the first init of the process. Agent mode: libgradscope-agent.so is loaded and
//   exports gradscope_agent_nccl_profile_v1 (nccl_profile_link.h); the plugin asks NCCL for Coll events
//   only and hands each collective's algorithm, protocol and channels to the agent from startEvent, on
//   the launching thread, keeping nothing. Standalone mode: no agent; the plugin asks for Coll, ProxyOp
//   and KernelCh events, follows every collective to its completion and writes its own trace.
// - Handles. A collective's handle is its slot (64-byte aligned). Children get no memory of their own:
//   a KernelCh handle is the parent slot's address | 1, a ProxyOp handle | 2; a Group handle is the
//   context's address | 3 and is never used (it only tells NCCL the launch is profiled). Any other event
//   type, a parent the plugin does not know and an exhausted pool get nullptr.
// - Completion. A slot holds references: one for the collective until its stopEvent, one for "waiting
//   for its kernel channels" (when KernelCh is active and NCCL named nChannels > 0; dropped by the
//   nChannels-th KernelCh stop) and one per live child. The thread that drops the last reference — the
//   job's thread at stopEvent or the proxy thread at a child's stop — finishes the record: completion is
//   the host time of the last child's stop (unknown when no child stopped), and the slot is free again.
//   A collective whose children never come keeps its slot until finalize, which writes it without a
//   completion.
// - The Sink's queue is a bounded multi-producer, single-consumer array queue (one compare-and-swap
//   per record); a full queue drops the record and counts it. One background thread drains it every
//   50 ms into a TraceWriter. Nothing on NCCL's threads waits for I/O or a lock.
//
// Threads: init/finalize on the communicator's creating/destroying thread; Coll start/stop on the
// launching thread; children on NCCL's proxy thread; the Sink's writer thread. Lock order: the Sink's
// lifecycle mutex, then its comm-table mutex; neither is taken on an event path.

#include <atomic>
#include <cstdint>

#include "gradscope/common/nccl_profile_link.h"
#include "gradscope/common/types.h"
#include "nccl_abi/profiler.h"

namespace gradscope::nccl_profiler {

// The plugin speaks NCCL's names (nccl_abi/profiler.h).
using namespace nccl_abi;

// One collective as the plugin writes it (times: Unix-epoch ns from CLOCK_REALTIME).
struct CollRecord {
  std::int64_t seq = 0;          // this context's ordinal of the collective (per communicator)
  std::uint64_t nccl_seq = 0;    // NCCL's seqNumber (per communicator and function)
  std::int64_t count = 0;        // elements as passed to the API
  std::int64_t start_ns = 0;     // startEvent: NCCL launches it
  std::int64_t stop_ns = 0;      // stopEvent: enqueued on the GPU
  std::int64_t complete_ns = 0;  // the last child's stop; 0 unknown
  std::uint32_t comm = 0;        // the Sink's communicator index
  std::int32_t nranks = 0;
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  std::int8_t algo = -1;
  std::int8_t proto = -1;
  std::uint8_t channels = 0;
};

struct Context;

struct alignas(64) CollSlot {
  std::atomic<std::uint32_t> state{0};  // kFree or kLive
  std::atomic<std::uint32_t> refs{0};
  std::atomic<std::uint32_t> kernel_stops{0};
  std::uint32_t kernel_expected = 0;
  std::atomic<std::int64_t> stop_ns{0};
  std::atomic<std::int64_t> last_child_stop_ns{0};
  Context* context = nullptr;
  CollRecord record;  // written by the starting thread before NCCL sees the handle
};

struct alignas(64) Context {
  static constexpr std::uint32_t kPoolSize = 1024;  // collectives in flight per communicator

  std::uint64_t comm_hash = 0;
  int rank = 0;
  int nranks = 0;
  std::uint32_t comm = 0;                // Sink's communicator index (standalone)
  NcclProfileFunctionV1 hook = nullptr;  // agent mode
  bool kernel_children = false;          // KernelCh events were asked for
  std::atomic<std::int64_t> next_seq{0};
  std::atomic<std::uint32_t> next_slot{0};
  CollSlot slots[kPoolSize];
};

// The plugin's functions (the v5 table's; the v4 table adapts to them).
ncclResult_t init(void** context, std::uint64_t comm_hash, int* activation_mask, const char* comm_name,
                  int nodes, int nranks, int rank, ncclDebugLogger_t logger);
ncclResult_t startEvent(void* context, void** handle, ncclProfilerEventDescr_v5_t* descriptor);
ncclResult_t stopEvent(void* handle);
ncclResult_t recordEventState(void* handle, ncclProfilerEventState_t state,
                              ncclProfilerEventStateArgs_v5_t* args);
ncclResult_t finalize(void* context);

}  // namespace gradscope::nccl_profiler
