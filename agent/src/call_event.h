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
inline constexpr std::uint8_t kSampled = 4;     // explore mode sampled this call (2: nccl_state.h)

}  // namespace gradscope::agent
