#pragma once

// The fixed-size record a job thread writes into its ring (thread_buffer.h), as a header and a payload
// named by the header's kind, the way Tracy's queue items are (public/common/TracyQueue.hpp: a
// QueueHeader, then a union of one struct per QueueType). No strings, no pointers to memory the job owns:
// the background thread resolves communicators and times later.
//
// Every record is about one collective call: the header names it (communicator and sequence number,
// the key the background thread joins on) with its shape; the payload says what the record adds.

#include <cstdint>
#include <string>
#include <type_traits>

#include "gradscope/common/types.h"

namespace gradscope::agent {

enum class EventKind : std::uint8_t {
  Call,      // the call itself, timed: `call`
  NcclInfo,  // what NCCL chose for it, reported by the NCCL profiler plugin (nccl_profile.h): `nccl_info`
  // What a call with a second side adds (the receive half of MPI_Sendrecv, the per-peer spread of an
  // all-to-all(v)): `peer_extra`, written by the calling thread just before the call's own record.
  PeerExtra,
};

// The call a record is about. Point-to-point calls and NCCL group launches (numberedApart, common/types.h)
// are numbered by CommSlot::nextPeerSeq, a sequence of their own. The NCCL profiler's report names its call
// by the same shape (api, dtype; nccl_profile.cc), so both kinds fill all of it.
struct EventHeader {
  std::int64_t seq = 0;    // the call's number on its communicator
  std::uint32_t comm = 0;  // CommRegistry index
  EventKind kind = EventKind::Call;
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  ReduceOp op = ReduceOp::None;
};

// The stream index's width: the flags share its 16 bits, so that a call fits the record's 80 bytes.
inline constexpr std::uint16_t kMaxStreamIndex = (1u << 14) - 1;

struct CallPayload {
  std::uint64_t enqueue = 0;  // ticks when the API was called
  std::uint64_t start = 0;    // ticks
  std::uint64_t end = 0;
  std::int64_t count = 0;  // elements, as the job passed them
  std::int64_t bytes = 0;
  std::int64_t step = -1;
  std::uint32_t gpu_slot = 0;     // 0: host-timed; else GpuTimer slot + 1, resolved by the background thread
  std::uint16_t strategy = 0;     // apply mode: shadow.h's applied strategy index; 0 = the job's own call
  std::uint16_t stream : 14 = 0;  // per-process stream index (nccl_state.h StreamTable), 0 = none
  // The stream was capturing a CUDA graph, so the call was timed on the host (its GPU work runs whenever
  // the graph is launched: its replays, cupti_tracer.h).
  bool graph_captured : 1 = false;
  bool sampled : 1 = false;  // explore mode sampled this call
  // Point-to-point: the peer's rank in the communicator (a send's destination, a receive's matched
  // source) and the tag (a receive's matched tag; NCCL has none). -1: none (collectives, MPI_PROC_NULL).
  std::int32_t peer = -1;
  std::int32_t tag = -1;
};

// NCCL's codes, as the plugin reports them (nccl_profile_link.h). No initialisers: a union's other
// members must be trivial for the record to default-construct as a call.
struct NcclInfoPayload {
  std::int32_t algo;      // -1: not reported
  std::int32_t proto;     // -1: not reported
  std::int32_t channels;  // 0: not reported
};

// The second side of a call, for the record that follows (same header). -1: not known.
struct PeerExtraPayload {
  std::int32_t source;          // MPI_Sendrecv: the matched source's rank in the communicator
  std::int32_t recv_tag;        // ... and the matched tag
  std::int64_t recv_bytes;      // bytes received
  std::int64_t peer_max_bytes;  // all-to-all(v): the most bytes this rank sent to one peer
  std::int64_t peer_min_bytes;  // ... and the least
};

struct CallEvent {
  EventHeader header;
  union {
    CallPayload call{};
    NcclInfoPayload nccl_info;
    PeerExtraPayload peer_extra;
  };
};
// The ring's slot: the hot path copies it with a few stores, and the ring holds records as raw memory
// (thread_buffer.cc), so it stays this size and trivially copyable.
static_assert(sizeof(EventHeader) == 16 && sizeof(CallPayload) == 64);
static_assert(sizeof(CallEvent) == 80);
static_assert(std::is_trivially_copyable_v<CallEvent> && std::is_standard_layout_v<CallEvent>);

// The number the background thread's joins (correlator.h) know a call by: calls numbered apart have
// their numbers set apart by a bit.
inline constexpr std::int64_t kPeerSeqBit = std::int64_t{1} << 62;
inline std::int64_t joinSeq(Api api, std::int64_t seq) {
  return numberedApart(api) ? seq | kPeerSeqBit : seq;
}

// One GPU execution (CUDA graph replay) of a graph-captured call, named by the call's communicator
// (CommRegistry index) and joinSeq of its sequence number: what the GPU timer hands the background
// thread.
// A row of a sampled GPU window (storage::GpuActivityRecord's), from the CUPTI tracer.
struct GpuActivitySpan {
  std::uint8_t kind = 0;  // storage::GpuActivityKind
  std::int64_t start_epoch_ns = 0, end_epoch_ns = 0;
  std::int64_t kernels = 0;
  std::string range;  // compute kernels: the job's NVTX range they were launched in, if any
};

struct ReplaySpan {
  std::uint32_t comm = 0;
  std::int64_t seq = 0;
  std::int64_t start_epoch_ns = 0, end_epoch_ns = 0;
};

// NCCL's choices for `call`, a record of its own ahead of the call's.
inline CallEvent ncclInfoEvent(const EventHeader& call, int algo, int proto, int channels) {
  CallEvent event;
  event.header = call;
  event.header.kind = EventKind::NcclInfo;
  event.nccl_info = {algo, proto, channels < 0 ? 0 : channels};
  return event;
}

// The second side of `call`, a record of its own ahead of the call's.
inline CallEvent peerExtraEvent(const EventHeader& call, const PeerExtraPayload& extra) {
  CallEvent event;
  event.header = call;
  event.header.kind = EventKind::PeerExtra;
  event.peer_extra = extra;
  return event;
}

}  // namespace gradscope::agent
