#pragma once

// What the agent could not record, by kind: the agent counts each kind (bounded memory: drop and count,
// never block) and writes the counts to the trace's `drops` table by name; gradscope report and the
// viewer say what each means (storage/drops.h, which also reads the NCCL profiler plugin's own kinds).
// docs/agent.md and docs/schema.md describe them.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace gradscope {

enum class DropKind : std::uint8_t {
  Call,              // a job thread's ring was full
  CallRate,          // the thread was over the recording rate limit
  ThreadBuffer,      // no ring left for a new thread
  CommTable,         // the table of communicators was full
  GpuTiming,         // no CUDA event pair free, or a CUDA error: timed on the host
  RequestTable,      // the table of nonblocking MPI requests in flight was full ("iallreduce_table")
  StreamTable,       // the table of CUDA streams was full: recorded without its stream
  GroupTable,        // an NCCL group held more calls than the agent keeps: timed on its own
  CuptiRecord,       // CUPTI lost kernel records
  ExploreResult,     // the queue of explore results was full
  ExploreLink,       // an exploration found no call to link to: stored without it
  NcclProfile,       // an NCCL profiler report found no call
  GraphCapture,      // the table of graph-captured calls was full
  GraphReplay,       // a graph replay found no captured call
  RecordingStopped,  // calls after recording stopped on an error
  GpuKernel,         // a sampled window's kernel: the agent's table of window kernels was full
};
inline constexpr std::size_t kDropKinds = 16;

// "call", "call_rate", "thread_buffer", ...: the names in the trace, which never change.
std::string_view name(DropKind kind);
std::optional<DropKind> parseDropKind(std::string_view text);
// One line for a person: what was dropped and why (and the setting that changes it, where one does).
std::string_view meaning(DropKind kind);
// Whether the kind's events are calls missing from `calls` (the totals miss them), rather than detail
// missing from calls that are recorded.
bool losesCalls(DropKind kind);

}  // namespace gradscope
