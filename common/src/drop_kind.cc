#include "gradscope/common/drop_kind.h"

namespace gradscope {
namespace {

struct Entry {
  std::string_view name;
  bool loses_calls;
  std::string_view meaning;
};

constexpr Entry kEntries[kDropKinds] = {
    {"call", true, "calls not recorded: the agent's per-thread buffer was full (GRADSCOPE_BUFFER_CALLS)"},
    {"call_rate", true,
     "calls not recorded: the thread made more calls per second than the agent records "
     "(GRADSCOPE_MAX_CALL_RATE, 50000 by default; 0 records them all)"},
    {"thread_buffer", true,
     "calls not recorded: the agent's per-thread buffer was full (GRADSCOPE_BUFFER_CALLS)"},
    {"comm_table", true, "calls not recorded: the agent's table of communicators was full"},
    {"gpu_timing", false,
     "calls timed on the host instead of the GPU (no CUDA event pair free, or a CUDA error)"},
    {"iallreduce_table", true,
     "nonblocking MPI calls not recorded: the agent's table of requests in flight (16,384) was full"},
    {"stream_table", false,
     "calls recorded without their stream, timed on the host: the agent's table of streams was full"},
    {"group_table", false,
     "group members timed on their own, on the host: the group had more calls than the agent holds"},
    {"cupti_record", false, "CUPTI kernel records lost: those calls' spans come from their CUDA events"},
    {"explore_result", false, "explore measurements not stored (the agent's result queue was full)"},
    {"explore_link", false,
     "explore measurements stored without their call: the call was not recorded, or more explorations "
     "waited for their calls than the agent holds"},
    {"nccl_profile", false,
     "NCCL profiler reports that matched no call: those calls lack NCCL's algorithm, protocol and channels"},
    {"graph_capture", false,
     "graph-captured calls whose replays are not traced: the agent's table of captures was full"},
    {"graph_replay", false,
     "CUDA graph replays not recorded: their captured call was not recorded, or the agent's table of "
     "replays in progress was full"},
    {"recording_stopped", true,
     "calls not recorded: recording stopped after an error in the agent (its line on the job's stderr says "
     "which)"},
    {"gpu_kernel", false,
     "GPU kernels of a sampled window not kept (the agent's table of window kernels was full): the steps "
     "of that window have no GPU breakdown (GRADSCOPE_GPU_WINDOWS)"},
};

}  // namespace

std::string_view name(DropKind kind) {
  return kEntries[static_cast<std::size_t>(kind)].name;
}

std::optional<DropKind> parseDropKind(std::string_view text) {
  for (std::size_t i = 0; i < kDropKinds; ++i)
    if (kEntries[i].name == text) return static_cast<DropKind>(i);
  return std::nullopt;
}

std::string_view meaning(DropKind kind) {
  return kEntries[static_cast<std::size_t>(kind)].meaning;
}

bool losesCalls(DropKind kind) {
  return kEntries[static_cast<std::size_t>(kind)].loses_calls;
}

}  // namespace gradscope
