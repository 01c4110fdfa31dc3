#pragma once

// The fixed-size record an intercepted call writes on its own thread. No strings, no pointers to
// memory the job owns: the background thread resolves communicators and times later.

#include <cstdint>

#include "gradscope/common/types.h"

namespace gradscope::agent {

struct CallEvent {
  std::uint64_t enqueue = 0;  // ticks when the API was called
  std::uint64_t start = 0;    // ticks (host-timed calls) or, with kEpochTimes, Unix-epoch ns
  std::uint64_t end = 0;
  std::int64_t count = 0;
  std::int64_t bytes = 0;
  std::int64_t seq = 0;
  std::int64_t step = -1;
  std::uint32_t comm = 0;      // CommRegistry index
  std::uint32_t gpu_slot = 0;  // 0: host-timed; else GpuTimer slot + 1, resolved by the background thread
  std::uint16_t stream = 0;    // per-process stream index, 0 = none
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  ReduceOp op = ReduceOp::None;
  std::uint8_t flags = 0;
  std::uint16_t strategy = 0;  // apply mode: shadow.h's applied strategy index; 0 = the job's own call
};
static_assert(sizeof(CallEvent) == 72);

inline constexpr std::uint8_t kEpochTimes = 1;  // start/end are already Unix-epoch ns
// The stream was capturing a CUDA graph, so the call was timed on the host (its GPU work runs whenever
// the graph is launched: its replays, cupti_tracer.h).
inline constexpr std::uint8_t kGraphCaptured = 2;
inline constexpr std::uint8_t kSampled = 4;  // explore mode sampled this call
// Not a call: what NCCL chose for call (comm, seq), reported by the NCCL profiler plugin
// (nccl_profile.h). The NCCL algorithm code is in `count`, the protocol code in `bytes` (-1 unknown), the
// channels in `stream`. The background thread attaches it to the call's row and writes no row of its own.
inline constexpr std::uint8_t kNcclInfo = 8;

// One GPU execution (CUDA graph replay) of a graph-captured call, named by the call's communicator
// (CommRegistry index) and sequence number: what the GPU timer hands the background thread.
struct ReplaySpan {
  std::uint32_t comm = 0;
  std::int64_t seq = 0;
  std::int64_t start_epoch_ns = 0, end_epoch_ns = 0;
};

inline CallEvent ncclInfoEvent(std::uint32_t comm, std::int64_t seq, int algo, int proto, int channels) {
  CallEvent event;
  event.flags = kNcclInfo;
  event.comm = comm;
  event.seq = seq;
  event.count = algo;
  event.bytes = proto;
  event.stream = static_cast<std::uint16_t>(channels < 0 ? 0 : channels);
  return event;
}

}  // namespace gradscope::agent
