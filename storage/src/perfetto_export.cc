// The Perfetto export (export.h writePerfettoTrace), on the classes protoc generates from our own
// perfetto_trace.proto.
//
// Layout of the file. Packets are written one at a time (field 1 of Trace, length-delimited), so memory
// holds the tracks and the per-sequence state, never the calls. Each slice track is a packet sequence of
// its own, because three of Perfetto's size savings are scoped to a sequence:
// - the sequence's TracePacketDefaults name its track, so no event carries a track uuid;
// - a sequence-scoped incremental clock (ClockSnapshot, clock 64, anchored to BOOTTIME at the
//   sequence's first timestamp) makes every timestamp the nanoseconds since the sequence's previous one,
//   a varint of 2-4 bytes instead of 9; a track's calls come in start order and never overlap (see
//   lanes), so the deltas are never negative;
// - names, annotation names and repeated string values are interned per sequence: defined in the first
//   packet of the sequence that uses them, referred to by a small iid afterwards.
// trace_processor sorts the events of all sequences by time, and keeps the file order of events with
// equal times, so a call's end and the next call's begin at the same nanosecond stay in that order.
//
// Lanes. Slices on one track must nest. Calls of one communicator usually follow each other, but
// nonblocking calls overlap (posted before the previous one completed) and the calls come in id order,
// not start order. A call goes to the first track of its communicator whose last call ended by its
// start; when none has, a new track ("comm KEY (size N) #2") opens, up to kMaxLanes.

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/gzip_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradscope/common/error.h"
#include "gradscope/common/version.h"
#include "gradscope/storage/export.h"
#include "gradscope/storage/peers.h"
#include "perfetto_trace.pb.h"

namespace gradscope::storage {
namespace {

namespace pb = gradscope::perfetto;

// Tags of Trace.packet (field 1) and TracePacket.compressed_packets (field 50), both length-delimited.
constexpr std::uint32_t kPacketTag = (1 << 3) | 2;
constexpr std::uint32_t kCompressedPacketsTag = (50 << 3) | 2;
// Packets per compressed bundle, in bytes before compression. Perfetto wants each compressed_packets
// packet under 512 KB; deflate cannot grow 256 KiB past that, and larger bundles compressed no better.
constexpr std::size_t kBundleBytes = 256 << 10;
// zlib's fastest level: on the first 64 MiB of packets of the 5.7 M-call trace of docs/benchmarks.md,
// level 6 made the bundles 18% smaller and took 3.3 times as long to compress.
constexpr int kCompressionLevel = 1;
// Sequence-scoped clock ids are 64..127 (Perfetto's clock_snapshot.proto).
constexpr std::uint32_t kIncrementalClock = 64;
// Overlapping calls one communicator may have before the export gives up: memory stays bounded by the
// communicators, and no timeline shows a thousand rows of one communicator usefully.
constexpr std::size_t kMaxLanes = 1024;

// Debug annotation names, interned per sequence; the iid is the enumerator.
enum class Arg : std::uint64_t {
  Id = 1,
  Seq,
  Bytes,
  Step,
  Comm,
  Dtype,
  Count,
  Op,
  QueuedNs,
  Stream,
  Algo,
  Proto,
  Channels,
  GraphReplay,
  Dest,
  DestRank,
  SendTag,
  Source,
  SourceRank,
  RecvTag,
  RecvBytes,
  PeerMaxBytes,
  PeerMinBytes,
};
// The annotation's name: the Chrome trace's argument name.
constexpr std::string_view argName(Arg arg) {
  switch (arg) {
    case Arg::Id: return "id";
    case Arg::Seq: return "seq";
    case Arg::Bytes: return "bytes";
    case Arg::Step: return "step";
    case Arg::Comm: return "comm";
    case Arg::Dtype: return "dtype";
    case Arg::Count: return "count";
    case Arg::Op: return "op";
    case Arg::QueuedNs: return "queued_ns";
    case Arg::Stream: return "stream";
    case Arg::Algo: return "algo";
    case Arg::Proto: return "proto";
    case Arg::Channels: return "channels";
    case Arg::GraphReplay: return "graph_replay";
    case Arg::Dest: return "dest";
    case Arg::DestRank: return "dest_rank";
    case Arg::SendTag: return "send_tag";
    case Arg::Source: return "source";
    case Arg::SourceRank: return "source_rank";
    case Arg::RecvTag: return "recv_tag";
    case Arg::RecvBytes: return "recv_bytes";
    case Arg::PeerMaxBytes: return "peer_max_bytes";
    case Arg::PeerMinBytes: return "peer_min_bytes";
  }
  return "";
}

// What a sequence has defined of the interning tables, by table and iid.
enum class Table : std::uint64_t { EventName, ArgName, StringValue };

// One slice track and the packet sequence that writes it.
struct Lane {
  std::uint32_t sequence = 0;
  std::uint64_t track_uuid = 0;
  bool started = false;                 // its first packet (defaults, clock) is written
  std::int64_t last_ts = 0;             // the incremental clock's value: the sequence's latest timestamp
  std::int64_t last_end = 0;            // end of its latest call
  std::vector<std::uint64_t> interned;  // (table << 56 | iid), sorted
};

struct CommTracks {
  std::uint64_t rank_uuid = 0;
  std::string label;
  std::vector<Lane> lanes;
};

class PerfettoWriter {
 public:
  PerfettoWriter(const TraceReader& reader, std::ostream& out, const PerfettoOptions& options)
      : reader_(reader), options_(options), stream_(&out), coded_(&stream_) {}

  void write() {
    const std::vector<RunInfo> runs = reader_.runs();
    base_ns_ = runs.empty() ? 0 : runs.front().epoch_ns;
    describeTracks(runs);
    writeCalls();
    flushBundle();
    coded_.Trim();
    if (coded_.HadError()) fail("writing the Perfetto trace failed (disk full?)");
  }

 private:
  std::uint64_t newUuid() { return next_uuid_++; }

  // Writes a packet: straight to the file, or into the bundle being gathered for compression.
  void emit(const pb::TracePacket& packet) {
    const auto size = static_cast<std::uint32_t>(packet.ByteSizeLong());
    if (!options_.compress) {
      coded_.WriteTag(kPacketTag);
      coded_.WriteVarint32(size);
      packet.SerializeWithCachedSizes(&coded_);
      return;
    }
    std::uint8_t header[1 + 5];  // the tag and a 32-bit varint
    header[0] = kPacketTag;
    const std::uint8_t* header_end =
        google::protobuf::io::CodedOutputStream::WriteVarint32ToArray(size, header + 1);
    bundle_.append(reinterpret_cast<const char*>(header), static_cast<std::size_t>(header_end - header));
    const std::size_t at = bundle_.size();
    bundle_.resize(at + size);
    packet.SerializeWithCachedSizesToArray(reinterpret_cast<std::uint8_t*>(bundle_.data() + at));
    if (bundle_.size() >= kBundleBytes) flushBundle();
  }

  // The gathered packets as one packet of deflate-compressed packets (TracePacket.compressed_packets).
  void flushBundle() {
    if (bundle_.empty()) return;
    compressed_.clear();
    {
      google::protobuf::io::StringOutputStream sink(&compressed_);
      google::protobuf::io::GzipOutputStream::Options zlib;
      zlib.format = google::protobuf::io::GzipOutputStream::ZLIB;
      zlib.compression_level = kCompressionLevel;
      google::protobuf::io::GzipOutputStream deflate(&sink, zlib);
      bool written = false;
      {
        google::protobuf::io::CodedOutputStream bundle(&deflate);
        bundle.WriteRaw(bundle_.data(), static_cast<int>(bundle_.size()));
        bundle.Trim();
        written = !bundle.HadError();
      }
      if (!written || !deflate.Close()) fail("compressing the Perfetto trace failed");
    }
    const auto compressed_size = static_cast<std::uint32_t>(compressed_.size());
    coded_.WriteTag(kPacketTag);
    coded_.WriteVarint32(static_cast<std::uint32_t>(
        google::protobuf::io::CodedOutputStream::VarintSize32(kCompressedPacketsTag) +
        google::protobuf::io::CodedOutputStream::VarintSize32(compressed_size) + compressed_size));
    coded_.WriteTag(kCompressedPacketsTag);
    coded_.WriteVarint32(compressed_size);
    coded_.WriteRaw(compressed_.data(), static_cast<int>(compressed_size));
    bundle_.clear();
  }

  void describeTrack(std::uint64_t uuid, std::uint64_t parent, const std::string& name, int order,
                     pb::TrackDescriptor::ChildTracksOrdering children, const std::string& description = {}) {
    packet_.Clear();
    pb::TrackDescriptor* track = packet_.mutable_track_descriptor();
    track->set_uuid(uuid);
    if (parent != 0) track->set_parent_uuid(parent);
    track->set_name(name);
    if (!description.empty()) track->set_description(description);
    if (children != pb::TrackDescriptor::UNKNOWN) track->set_child_ordering(children);
    track->set_sibling_order_rank(order);
    emit(packet_);
  }

  // The run (a track of its own that holds no events: producer, run and command, as the Chrome
  // trace's otherData), one track per host, one per rank under its host, one per communicator under
  // its rank.
  void describeTracks(const std::vector<RunInfo>& runs) {
    for (const RunInfo& run : runs)
      describeTrack(newUuid(), 0, fmt::format("gradscope {}: run {}", kVersion, run.uuid), 0,
                    pb::TrackDescriptor::UNKNOWN,
                    fmt::format("command: {}\nepoch_ns: {}", run.command, run.epoch_ns));
    std::map<std::string, std::uint64_t> host_uuid;
    int host_order = 0;
    for (const RankInfo& rank : reader_.ranks()) {
      auto [host, added] = host_uuid.emplace(rank.host, 0);
      if (added) {
        host->second = newUuid();
        describeTrack(host->second, 0, fmt::format("host {}", rank.host), host_order++,
                      pb::TrackDescriptor::EXPLICIT);
      }
      const std::uint64_t uuid = newUuid();
      rank_uuid_[rank.id] = uuid;
      offset_ns_[rank.id] = rank.clock_offset_ns;
      describeTrack(uuid, host->second,
                    runs.size() > 1 ? fmt::format("run {} rank {}", rank.run_id, rank.rank)
                                    : fmt::format("rank {}", rank.rank),
                    rank.rank, pb::TrackDescriptor::EXPLICIT);
    }
    for (const CommInfo& comm : reader_.comms()) {
      CommTracks& tracks = comms_[comm.id];
      tracks.label = fmt::format("comm {} (size {})", comm.key, comm.size);
      comm_key_[comm.id] = comm.key;
      const auto rank = rank_uuid_.find(comm.rank_id);
      tracks.rank_uuid = rank == rank_uuid_.end() ? 0 : rank->second;
      addLane(tracks);
    }
  }

  Lane& addLane(CommTracks& tracks) {
    Lane& lane = tracks.lanes.emplace_back();
    lane.sequence = next_sequence_++;
    lane.track_uuid = newUuid();
    const std::size_t number = tracks.lanes.size();
    describeTrack(lane.track_uuid, tracks.rank_uuid,
                  number == 1 ? tracks.label : fmt::format("{} #{}", tracks.label, number),
                  static_cast<int>(number), pb::TrackDescriptor::UNKNOWN);
    return lane;
  }

  // A call's track: the first lane of its communicator free at its start.
  Lane& laneFor(const CallRecord& call, std::int64_t start) {
    auto found = comms_.find(call.comm_id);
    if (found == comms_.end()) {
      // A call whose communicator row is missing (never written by the agent): a track of its own.
      CommTracks& tracks = comms_[call.comm_id];
      tracks.label = fmt::format("comm #{}", call.comm_id);
      const auto rank = rank_uuid_.find(call.rank_id);
      tracks.rank_uuid = rank == rank_uuid_.end() ? 0 : rank->second;
      found = comms_.find(call.comm_id);
    }
    CommTracks& tracks = found->second;
    for (Lane& lane : tracks.lanes)
      if (!lane.started || lane.last_end <= start) return lane;
    if (tracks.lanes.size() >= kMaxLanes)
      fail(
          "{}: more than {} calls of {} overlap; the Perfetto export cannot lay them out (--format "
          "chrome-trace can)",
          reader_.path(), kMaxLanes, tracks.label);
    return addLane(tracks);
  }

  // Starts a packet on `lane` at `ts` (nanoseconds on the export's timeline). The sequence's first
  // packet also clears its incremental state and sets its defaults and clock.
  pb::TracePacket& packetOn(Lane& lane, std::int64_t ts) {
    if (!lane.started) {
      packet_.Clear();
      packet_.set_trusted_packet_sequence_id(lane.sequence);
      packet_.set_first_packet_on_sequence(true);
      packet_.set_sequence_flags(pb::TracePacket::SEQ_INCREMENTAL_STATE_CLEARED);
      pb::TracePacketDefaults* defaults = packet_.mutable_trace_packet_defaults();
      defaults->set_timestamp_clock_id(kIncrementalClock);
      defaults->mutable_track_event_defaults()->set_track_uuid(lane.track_uuid);
      pb::ClockSnapshot* snapshot = packet_.mutable_clock_snapshot();
      pb::ClockSnapshot::Clock* incremental = snapshot->add_clocks();
      incremental->set_clock_id(kIncrementalClock);
      incremental->set_timestamp(static_cast<std::uint64_t>(ts));
      incremental->set_is_incremental(true);
      pb::ClockSnapshot::Clock* boottime = snapshot->add_clocks();
      boottime->set_clock_id(pb::ClockSnapshot::Clock::BOOTTIME);
      boottime->set_timestamp(static_cast<std::uint64_t>(ts));
      emit(packet_);
      lane.started = true;
      lane.last_ts = ts;
    }
    packet_.Clear();
    packet_.set_trusted_packet_sequence_id(lane.sequence);
    packet_.set_timestamp(static_cast<std::uint64_t>(ts - lane.last_ts));
    lane.last_ts = ts;
    return packet_;
  }

  // Whether `lane` still has to define (table, iid); remembers that it now has.
  static bool needsDefinition(Lane& lane, Table table, std::uint64_t iid) {
    const std::uint64_t key = static_cast<std::uint64_t>(table) << 56 | iid;
    const auto at = std::lower_bound(lane.interned.begin(), lane.interned.end(), key);
    if (at != lane.interned.end() && *at == key) return false;
    lane.interned.insert(at, key);
    return true;
  }

  std::uint64_t eventName(Lane& lane, pb::TracePacket& packet, Api api) {
    const auto iid = static_cast<std::uint64_t>(api) + 1;
    if (needsDefinition(lane, Table::EventName, iid)) {
      pb::EventName* entry = packet.mutable_interned_data()->add_event_names();
      entry->set_iid(iid);
      entry->set_name(std::string(name(api)));
    }
    return iid;
  }

  pb::DebugAnnotation* annotation(Lane& lane, pb::TracePacket& packet, Arg arg) {
    const auto iid = static_cast<std::uint64_t>(arg);
    if (needsDefinition(lane, Table::ArgName, iid)) {
      pb::DebugAnnotationName* entry = packet.mutable_interned_data()->add_debug_annotation_names();
      entry->set_iid(iid);
      entry->set_name(std::string(argName(arg)));
    }
    pb::DebugAnnotation* annotation = packet.mutable_track_event()->add_debug_annotations();
    annotation->set_name_iid(iid);
    return annotation;
  }

  void number(Lane& lane, pb::TracePacket& packet, Arg arg, std::int64_t value) {
    if (value >= 0) annotation(lane, packet, arg)->set_uint_value(static_cast<std::uint64_t>(value));
    else annotation(lane, packet, arg)->set_int_value(value);
  }

  // A string annotation whose values repeat (dtype, op, communicator keys, NCCL's names): interned.
  void text(Lane& lane, pb::TracePacket& packet, Arg arg, std::string_view value) {
    auto [entry, added] = string_iid_.emplace(std::string(value), string_iid_.size() + 1);
    const std::uint64_t iid = entry->second;
    pb::DebugAnnotation* annotated = annotation(lane, packet, arg);
    if (needsDefinition(lane, Table::StringValue, iid)) {
      pb::InternedString* defined = packet.mutable_interned_data()->add_debug_annotation_string_values();
      defined->set_iid(iid);
      defined->set_str(entry->first);
    }
    annotated->set_string_value_iid(iid);
  }

  void writeCalls() {
    // Messages as flows from the send's slice to the receive's, as in the Chrome trace.
    MessageFlows flows(matchPeerMessages(reader_));
    const CommunicatorRanks peer_ranks(reader_);

    reader_.forEachCall([&](const CallRecord& call) {
      const auto offset = offset_ns_.find(call.rank_id);
      const std::int64_t shift = base_ns_ + (offset == offset_ns_.end() ? 0 : offset->second);
      const std::int64_t start = call.start_ns + shift;
      const std::int64_t end = std::max(call.end_ns + shift, start);
      if (start < 0)
        fail("{}: call {} starts before the clock's origin; the Perfetto export cannot place it",
             reader_.path(), call.id);
      Lane& lane = laneFor(call, start);

      pb::TracePacket& begin = packetOn(lane, start);
      pb::TrackEvent* event = begin.mutable_track_event();
      event->set_type(pb::TrackEvent::TYPE_SLICE_BEGIN);
      event->set_name_iid(eventName(lane, begin, call.api));
      number(lane, begin, Arg::Id, call.id);
      number(lane, begin, Arg::Seq, call.seq);
      number(lane, begin, Arg::Bytes, call.bytes);
      if (call.step >= 0) number(lane, begin, Arg::Step, call.step);
      const auto key = comm_key_.find(call.comm_id);
      if (key != comm_key_.end()) text(lane, begin, Arg::Comm, key->second);
      text(lane, begin, Arg::Dtype, name(call.dtype));
      number(lane, begin, Arg::Count, call.count);
      if (call.op != ReduceOp::None) text(lane, begin, Arg::Op, name(call.op));
      if (call.enqueue_ns != call.start_ns)
        number(lane, begin, Arg::QueuedNs, call.start_ns - call.enqueue_ns);
      if (call.stream != 0) number(lane, begin, Arg::Stream, call.stream);
      if (!ncclAlgoName(call.nccl_algo).empty()) text(lane, begin, Arg::Algo, ncclAlgoName(call.nccl_algo));
      if (!ncclProtoName(call.nccl_proto).empty())
        text(lane, begin, Arg::Proto, ncclProtoName(call.nccl_proto));
      if (call.nccl_channels > 0) number(lane, begin, Arg::Channels, call.nccl_channels);
      if (call.graph_replay > 0) number(lane, begin, Arg::GraphReplay, call.graph_replay);
      const auto peer = [&](Arg arg, Arg world_arg, int comm_rank) {
        if (comm_rank < 0) return;
        number(lane, begin, arg, comm_rank);
        if (const int world = peer_ranks.worldRank(call.comm_id, comm_rank); world >= 0)
          number(lane, begin, world_arg, world);
      };
      peer(Arg::Dest, Arg::DestRank, call.dest);
      if (call.send_tag >= 0) number(lane, begin, Arg::SendTag, call.send_tag);
      peer(Arg::Source, Arg::SourceRank, call.source);
      if (call.recv_tag >= 0) number(lane, begin, Arg::RecvTag, call.recv_tag);
      if (call.recv_bytes >= 0) number(lane, begin, Arg::RecvBytes, call.recv_bytes);
      if (call.peer_max_bytes >= 0) number(lane, begin, Arg::PeerMaxBytes, call.peer_max_bytes);
      if (call.peer_min_bytes >= 0) number(lane, begin, Arg::PeerMinBytes, call.peer_min_bytes);
      // A flow starts at the send's slice (id = the send's call id) and ends at the receive's.
      if (flows.sends(call.id)) event->add_flow_ids(static_cast<std::uint64_t>(call.id));
      for (const std::int64_t send : flows.receives(call.id))
        event->add_terminating_flow_ids(static_cast<std::uint64_t>(send));
      emit(begin);

      pb::TracePacket& finish = packetOn(lane, end);
      finish.mutable_track_event()->set_type(pb::TrackEvent::TYPE_SLICE_END);
      emit(finish);
      lane.last_end = end;
      return true;
    });
  }

  const TraceReader& reader_;
  const PerfettoOptions options_;
  std::string bundle_;      // packets gathered for the next compressed bundle
  std::string compressed_;  // that bundle compressed
  google::protobuf::io::OstreamOutputStream stream_;
  google::protobuf::io::CodedOutputStream coded_;
  pb::TracePacket packet_;  // reused: Clear() keeps its allocations
  std::int64_t base_ns_ = 0;
  std::uint64_t next_uuid_ = 1;
  std::uint32_t next_sequence_ = 1;
  std::map<std::int64_t, std::uint64_t> rank_uuid_;
  std::map<std::int64_t, std::int64_t> offset_ns_;
  std::map<std::int64_t, std::string> comm_key_;
  std::map<std::int64_t, CommTracks> comms_;
  std::map<std::string, std::uint64_t, std::less<>> string_iid_;
};

}  // namespace

bool perfettoExportAvailable() {
  return true;
}

void writePerfettoTrace(const TraceReader& reader, std::ostream& out, const PerfettoOptions& options) {
  if (reader.callCount() == 0) fail("{}: the trace has no calls; there is nothing to export", reader.path());
  PerfettoWriter(reader, out, options).write();
}

}  // namespace gradscope::storage
