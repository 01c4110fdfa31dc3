#pragma once

// The link between the NCCL profiler plugin (libnccl-profiler-gradscope.so) and the LD_PRELOAD agent
// (libgradscope-agent.so), both loaded into one job process: what NCCL chose for a collective, handed
// from the plugin to the agent so that the agent's `calls` row of that collective gets it.
//
// The agent exports one C function, found by the plugin with dlsym(RTLD_DEFAULT, kNcclProfileSymbol).
// The record is plain data, versioned by its symbol name and sized by its first field: a newer plugin
// may pass a larger record (fields appended), an agent reads only the fields it knows and checks `size`
// covers them. Both sides are C++ of one gradscope tree or not: nothing here depends on either.
//
// Contract of gradscope_agent_nccl_profile_v1(record):
// - Called by the plugin from NCCL's startEvent of a collective, on the thread that launches it: the
//   job's thread inside ncclAllReduce (...) or inside its outermost ncclGroupEnd.
// - Returns kNcclProfileNotRecording when the agent is not recording (disabled, failed, not yet
//   activated, finished): the plugin then does nothing with the event.
// - Returns kNcclProfileMatched when the agent found the call on this thread and queued the facts for
//   its row, kNcclProfileUnmatched when no call of that shape is in flight on this thread (the agent
//   counts it under drops "nccl_profile").
// - Returns kNcclProfileNotInterposed, before anything else, while the agent has seen no NCCL call or
//   communicator of this process (it marks one before calling NCCL to create it): the NCCL that reports is
//   not one the agent interposes (linked into the job statically, as TensorFlow's packages do).
// - Called with nullptr (the plugin's probe at a communicator's init): kNcclProfileNotInterposed as above,
//   else kNcclProfileNotRecording; counts nothing. The plugin then records a communicator the agent does
//   not see itself, as without the agent. An agent older than this answers the probe with
//   kNcclProfileUnmatched (and counts it), so the plugin hands it every collective, as before.
// - Never blocks, allocates or takes a lock; safe from any thread.

#include <cstdint>

namespace gradscope {

inline constexpr const char* kNcclProfileSymbol = "gradscope_agent_nccl_profile_v1";

struct NcclProfileRecordV1 {
  std::uint32_t size = sizeof(NcclProfileRecordV1);  // bytes of the record as the caller built it
  std::uint32_t reserved = 0;
  std::uint64_t comm_hash = 0;   // NCCL's communicator hash (the plugin's init commId)
  std::uint64_t seq_number = 0;  // NCCL's sequence number: per communicator and collective function
  std::uint64_t count = 0;       // elements as passed to the API (recvcount for ReduceScatter)
  std::int32_t nranks = 0;       // the communicator's size and this rank in it
  std::int32_t rank = 0;
  std::uint8_t api = 0;       // gradscope::Api code (types.h); Unknown for what the agent does not record
  std::uint8_t dtype = 0;     // gradscope::DType code; DType::Other when NCCL named none the plugin knows
  std::int8_t algo = -1;      // NCCL algorithm code (types.h ncclAlgoName), -1 unknown
  std::int8_t proto = -1;     // NCCL protocol code (types.h ncclProtoName), -1 unknown
  std::int32_t channels = 0;  // channels NCCL runs the collective on, 0 unknown
};
static_assert(sizeof(NcclProfileRecordV1) == 48);

inline constexpr int kNcclProfileNotRecording = 0;
inline constexpr int kNcclProfileMatched = 1;
inline constexpr int kNcclProfileUnmatched = -1;
inline constexpr int kNcclProfileNotInterposed = 2;

using NcclProfileFunctionV1 = int (*)(const NcclProfileRecordV1* record);

}  // namespace gradscope
