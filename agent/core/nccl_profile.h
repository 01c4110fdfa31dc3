#pragma once

// The agent's side of the NCCL profiler plugin link (gradscope/common/nccl_profile_link.h): which of
// this thread's NCCL calls a profiler report belongs to.
//
// NCCL starts a collective's profiler event on the thread that launches it: inside the job's
// ncclAllReduce (...) — within the agent's wrapper, around the real call — or inside the outermost
// ncclGroupEnd for the calls of a group. So the wrappers name, in a thread-local, the calls being launched
// on this thread ("in flight") before they call NCCL, and the plugin's report, arriving on the same
// thread, is matched to one of them by its shape: API, count, datatype (unless NCCL gave none the plugin
// knows) and the communicator's size and this rank in it; among equal shapes the first not yet matched
// (NCCL may reorder a group's collectives). The facts go into the thread's record ring as an NcclInfo
// record ahead of the call's own record, and the background thread attaches them to the call's row.
//
// Hot path: no lock, no allocation; setting and clearing the in-flight calls is two thread-local stores.

#include <cstdint>
#include <span>

#include "core/call_event.h"
#include "core/nccl_state.h"
#include "gradscope/common/nccl_profile_link.h"

namespace gradscope::agent {

class NcclCallsInFlight {
 public:
  void setSingle(const CallEvent* event) {
    single_ = event;
    single_profiled_ = false;
    members_ = {};
  }
  void setGroup(std::span<GroupState::Member> members) {
    single_ = nullptr;
    members_ = members;
  }
  void clear() {
    single_ = nullptr;
    members_ = {};
  }
  // The first call in flight of the report's shape that has none yet (then marked), or nullptr.
  const CallEvent* match(const NcclProfileRecordV1& report);

 private:
  const CallEvent* single_ = nullptr;
  bool single_profiled_ = false;
  std::span<GroupState::Member> members_;
};

extern constinit thread_local NcclCallsInFlight t_nccl_in_flight __attribute__((tls_model("initial-exec")));

// Whether a plugin has reported since recording started: the background thread then remembers written
// calls for reports that come after them.
extern std::atomic<bool> g_nccl_profile_active;

// The interposer saw an NCCL communicator or call of this process (any thread; idempotent).
void markNcclInterposed();

// The body of gradscope_agent_nccl_profile_v1: kNcclProfileNotInterposed (no NCCL call or communicator
// of this process came through the interposer), kNcclProfileNotRecording (also the answer to the
// plugin's probe, a null report), kNcclProfileMatched or kNcclProfileUnmatched (counted as an
// "nccl_profile" drop).
int ncclProfileReceived(const NcclProfileRecordV1* report);

}  // namespace gradscope::agent
