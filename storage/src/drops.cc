#include "gradscope/storage/drops.h"

namespace gradscope::storage {

bool dropLosesCalls(const std::string& kind) {
  return kind == "call" || kind == "call_rate" || kind == "thread_buffer" || kind == "comm_table" ||
         kind == "iallreduce_table" || kind == "recording_stopped";
}

std::string dropMeaning(const std::string& kind) {
  if (kind == "call" || kind == "thread_buffer")
    return "calls not recorded: the agent's per-thread buffer was full (GRADSCOPE_BUFFER_CALLS)";
  if (kind == "call_rate")
    return "calls not recorded: the thread made more calls per second than the agent records "
           "(GRADSCOPE_MAX_CALL_RATE, 250000 by default; 0 records them all)";
  if (kind == "comm_table") return "calls not recorded: the agent's table of communicators was full";
  if (kind == "iallreduce_table")
    return "MPI_Iallreduce calls not recorded: the agent's table of requests in flight was full";
  if (kind == "stream_table")
    return "calls recorded without their stream, timed on the host: the agent's table of streams was full";
  if (kind == "group_table")
    return "group members timed on their own, on the host: the group had more calls than the agent holds";
  if (kind == "gpu_timing")
    return "calls timed on the host instead of the GPU (no CUDA event pair free, or a CUDA error)";
  if (kind == "cupti_record")
    return "CUPTI kernel records lost: those calls' spans come from their CUDA events";
  if (kind == "nccl_profile")
    return "NCCL profiler reports that matched no call: those calls lack NCCL's algorithm, protocol and "
           "channels";
  if (kind.starts_with("nccl_profile_"))
    return "the NCCL profiler plugin's own bounded pool or queue was full: collectives it did not record";
  if (kind == "graph_capture")
    return "graph-captured calls whose replays are not traced: the agent's table of captures was full";
  if (kind == "graph_replay")
    return "CUDA graph replays not recorded: their captured call was not recorded, or the agent's table of "
           "replays in progress was full";
  if (kind == "explore_result") return "explore measurements not stored (the agent's result queue was full)";
  if (kind == "recording_stopped")
    return "calls not recorded: recording stopped after an error in the agent (its line on the job's "
           "stderr says which)";
  return "events the agent could not record";
}

}  // namespace gradscope::storage
