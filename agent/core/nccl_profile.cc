#include "core/nccl_profile.h"

#include "core/recorder.h"
#include "core/shadow.h"

namespace gradscope::agent {

constinit thread_local NcclCallsInFlight t_nccl_in_flight __attribute__((tls_model("initial-exec")));
std::atomic<bool> g_nccl_profile_active{false};

namespace {

// NCCL describes a broadcast or an all-gather in bytes: ncclInfoSetDerived turns its count into bytes
// and its type into ncclInt8 before the profiler sees it.
bool sameBytes(const CallEvent& call, const NcclProfileRecordV1& report) {
  const Api api = call.header.api;
  const bool in_bytes = api == Api::NcclBroadcast || api == Api::NcclAllGather;
  return in_bytes && report.dtype == static_cast<std::uint8_t>(DType::Int8) &&
         call.call.count * static_cast<std::int64_t>(sizeOf(call.header.dtype)) ==
             static_cast<std::int64_t>(report.count);
}

bool sameShape(const CallEvent& call, const NcclProfileRecordV1& report) {
  if (static_cast<std::uint8_t>(call.header.api) != report.api) return false;
  // NCCL 2.28 has no name for ncclUint8 ("Unknown"): the plugin then says Other, which matches any type.
  const bool same_elements = call.call.count == static_cast<std::int64_t>(report.count) &&
                             (report.dtype == static_cast<std::uint8_t>(DType::Other) ||
                              static_cast<std::uint8_t>(call.header.dtype) == report.dtype);
  if (!same_elements && !sameBytes(call, report)) return false;
  const CommSlot& comm = comms().slot(call.header.comm);
  return comm.size == report.nranks && comm.rank == report.rank;
}

}  // namespace

const CallEvent* NcclCallsInFlight::match(const NcclProfileRecordV1& report) {
  if (single_ != nullptr) {
    if (single_profiled_ || !sameShape(*single_, report)) return nullptr;
    single_profiled_ = true;
    return single_;
  }
  for (GroupState::Member& member : members_)
    if (!member.profiled && sameShape(member.event, report)) {
      member.profiled = true;
      return &member.event;
    }
  return nullptr;
}

namespace {
std::atomic<bool> g_nccl_interposed{false};
}  // namespace

void markNcclInterposed() {
  if (!g_nccl_interposed.load(std::memory_order_relaxed))
    g_nccl_interposed.store(true, std::memory_order_relaxed);
}

int ncclProfileReceived(const NcclProfileRecordV1* report) {
  if (!g_nccl_interposed.load(std::memory_order_relaxed)) return kNcclProfileNotInterposed;
  if (report == nullptr) return kNcclProfileNotRecording;  // the plugin's probe
  if (!recording()) return kNcclProfileNotRecording;
  // The extension's own collectives (explore, apply) are not the job's: nothing to attach them to.
  if (t_internal) return kNcclProfileNotRecording;
  if (report == nullptr || report->size < sizeof(NcclProfileRecordV1)) {
    countDrop(DropKind::NcclProfile);
    return kNcclProfileUnmatched;
  }
  if (!g_nccl_profile_active.load(std::memory_order_relaxed))
    g_nccl_profile_active.store(true, std::memory_order_relaxed);
  const CallEvent* call = t_nccl_in_flight.match(*report);
  if (call == nullptr) {
    countDrop(DropKind::NcclProfile);
    return kNcclProfileUnmatched;
  }
  record(ncclInfoEvent(call->header, report->algo, report->proto, report->channels));
  return kNcclProfileMatched;
}

}  // namespace gradscope::agent
