// storage/export.h writePerfettoTrace, read back with the classes protoc generates from our
// perfetto_trace.proto: every call is one slice (begin and end on one track) with its name, nanosecond
// times and arguments; overlapping calls of one communicator get tracks of their own; the compressed
// bundles hold exactly the packets of the uncompressed file. Built only with protobuf.

#include <google/protobuf/io/gzip_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/storage/export.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "perfetto_trace.pb.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

namespace pb = gradscope::perfetto;
using test::TempDir;

// A merged two-rank, two-step GPU job (1 MiB + 2 MiB buckets, loss, metrics: 16 calls).
std::string writePerfettoJob(const TempDir& dir) {
  testing::SyntheticJob job;
  job.ranks = 2;
  job.steps = 2;
  job.model_bytes = 3 << 20;
  job.gpu = true;
  std::vector<std::string> ranks;
  for (int rank = 0; rank < job.ranks; ++rank) {
    ranks.push_back(dir.file(fmt::format("rank-{}.db", rank)));
    testing::writeSyntheticRank(ranks.back(), job, rank);
  }
  const std::string merged = dir.file("job.db");
  mergeTraces(ranks, merged, {});
  return merged;
}

pb::Trace perfettoTrace(const TraceReader& reader, bool compress) {
  std::ostringstream out;
  writePerfettoTrace(reader, out, {.compress = compress});
  pb::Trace trace;
  EXPECT_TRUE(trace.ParseFromString(out.str()));
  return trace;
}

// The packets of compressed bundles, inflatedPerfetto, in place of their bundles.
pb::Trace inflatedPerfetto(const pb::Trace& trace) {
  pb::Trace out;
  for (const pb::TracePacket& packet : trace.packet()) {
    if (!packet.has_compressed_packets()) {
      *out.add_packet() = packet;
      continue;
    }
    EXPECT_LT(packet.ByteSizeLong(), 512u << 10);
    google::protobuf::io::ArrayInputStream bytes(packet.compressed_packets().data(),
                                                 static_cast<int>(packet.compressed_packets().size()));
    google::protobuf::io::GzipInputStream inflate(&bytes, google::protobuf::io::GzipInputStream::ZLIB);
    pb::Trace bundle;
    EXPECT_TRUE(bundle.ParseFromZeroCopyStream(&inflate));
    for (const pb::TracePacket& inner : bundle.packet()) *out.add_packet() = inner;
  }
  return out;
}

struct PerfettoSlice {
  std::string name;
  std::int64_t start = 0, end = 0;
  std::uint64_t track = 0;
  std::map<std::string, std::string> args;  // values as text
};

struct PerfettoReplay {
  std::map<std::uint64_t, pb::TrackDescriptor> tracks;
  std::map<std::int64_t, PerfettoSlice> slices;  // by call id
  int begins = 0, ends = 0;
};

// Reads the packets as trace_processor does: per sequence its interning, defaults and incremental
// clock; per track a stack of open slices.
PerfettoReplay replayPerfetto(const pb::Trace& trace) {
  struct Sequence {
    std::map<std::uint64_t, std::string> names, arg_names, strings;
    std::uint64_t track = 0;
    std::int64_t clock = 0;
  };
  PerfettoReplay out;
  std::map<std::uint32_t, Sequence> sequences;
  std::map<std::uint64_t, std::vector<PerfettoSlice>> open;
  for (const pb::TracePacket& packet : trace.packet()) {
    if (packet.has_track_descriptor()) {
      out.tracks[packet.track_descriptor().uuid()] = packet.track_descriptor();
      continue;
    }
    if (packet.sequence_flags() & pb::TracePacket::SEQ_INCREMENTAL_STATE_CLEARED)
      sequences[packet.trusted_packet_sequence_id()] = {};
    Sequence& sequence = sequences.at(packet.trusted_packet_sequence_id());
    if (packet.has_trace_packet_defaults()) {
      EXPECT_EQ(packet.trace_packet_defaults().timestamp_clock_id(), 64u);
      sequence.track = packet.trace_packet_defaults().track_event_defaults().track_uuid();
    }
    for (const pb::EventName& name : packet.interned_data().event_names())
      sequence.names[name.iid()] = name.name();
    for (const pb::DebugAnnotationName& name : packet.interned_data().debug_annotation_names())
      sequence.arg_names[name.iid()] = name.name();
    for (const pb::InternedString& value : packet.interned_data().debug_annotation_string_values())
      sequence.strings[value.iid()] = value.str();
    if (packet.has_clock_snapshot()) {
      const auto& clocks = packet.clock_snapshot().clocks();
      EXPECT_EQ(clocks.size(), 2);
      EXPECT_EQ(clocks[0].clock_id(), 64u);
      EXPECT_TRUE(clocks[0].is_incremental());
      EXPECT_EQ(clocks[1].clock_id(), 6u);  // BOOTTIME, the trace's clock
      EXPECT_EQ(clocks[1].timestamp(), clocks[0].timestamp());
      sequence.clock = static_cast<std::int64_t>(clocks[0].timestamp());
      continue;
    }
    if (!packet.has_track_event()) continue;
    const pb::TrackEvent& event = packet.track_event();
    sequence.clock += static_cast<std::int64_t>(packet.timestamp());
    const std::uint64_t track = event.has_track_uuid() ? event.track_uuid() : sequence.track;
    if (event.type() == pb::TrackEvent::TYPE_SLICE_BEGIN) {
      ++out.begins;
      PerfettoSlice slice{sequence.names.at(event.name_iid()), sequence.clock, 0, track, {}};
      for (const pb::DebugAnnotation& annotation : event.debug_annotations())
        slice.args[sequence.arg_names.at(annotation.name_iid())] =
            annotation.has_string_value_iid() ? sequence.strings.at(annotation.string_value_iid())
            : annotation.has_uint_value()     ? std::to_string(annotation.uint_value())
                                              : std::to_string(annotation.int_value());
      open[track].push_back(slice);
    } else {
      EXPECT_EQ(event.type(), pb::TrackEvent::TYPE_SLICE_END);
      ++out.ends;
      EXPECT_FALSE(open[track].empty());
      if (open[track].empty()) continue;
      PerfettoSlice slice = open[track].back();
      open[track].pop_back();
      slice.end = sequence.clock;
      out.slices[std::stoll(slice.args.at("id"))] = slice;
    }
  }
  for (const auto& [track, stack] : open) EXPECT_TRUE(stack.empty()) << "track " << track;
  return out;
}

std::vector<CallRecord> perfettoCalls(const TraceReader& reader) {
  std::vector<CallRecord> calls;
  reader.forEachCall([&](const CallRecord& call) {
    calls.push_back(call);
    return true;
  });
  return calls;
}

TEST(PerfettoExport, EveryCallIsOneSliceWithItsNameTimesAndArguments) {
  TempDir dir;
  const TraceReader reader = TraceReader::open(writePerfettoJob(dir));
  const PerfettoReplay replayed = replayPerfetto(perfettoTrace(reader, false));
  const std::vector<CallRecord> calls = perfettoCalls(reader);
  ASSERT_EQ(calls.size(), 16u);
  EXPECT_EQ(replayed.begins, 16);
  EXPECT_EQ(replayed.ends, 16);
  const std::int64_t epoch = reader.runs().front().epoch_ns;
  for (const CallRecord& call : calls) {
    SCOPED_TRACE(test::describe(call));
    ASSERT_TRUE(replayed.slices.count(call.id));
    const PerfettoSlice& slice = replayed.slices.at(call.id);
    EXPECT_EQ(slice.name, name(call.api));
    EXPECT_EQ(slice.start, epoch + call.start_ns);  // clock offsets are 0 here
    EXPECT_EQ(slice.end, epoch + call.end_ns);
    EXPECT_EQ(slice.args.at("seq"), std::to_string(call.seq));
    EXPECT_EQ(slice.args.at("bytes"), std::to_string(call.bytes));
    EXPECT_EQ(slice.args.at("count"), std::to_string(call.count));
    EXPECT_EQ(slice.args.at("step"), std::to_string(call.step));
    EXPECT_EQ(slice.args.at("comm"), "world");
    EXPECT_EQ(slice.args.at("dtype"), "fp32");
    EXPECT_EQ(slice.args.at("algo"), call.bytes >= (1 << 20) ? "Ring" : "Tree");
    EXPECT_EQ(slice.args.count("op"), call.op == ReduceOp::None ? 0u : 1u);
    // The slice's track is its communicator's, under its rank's, under its host's.
    const pb::TrackDescriptor& comm = replayed.tracks.at(slice.track);
    EXPECT_EQ(comm.name(), "comm world (size 2)");
    const pb::TrackDescriptor& rank = replayed.tracks.at(comm.parent_uuid());
    EXPECT_EQ(rank.name(), fmt::format("rank {}", call.rank_id));
    EXPECT_EQ(rank.sibling_order_rank(), call.rank_id);
    EXPECT_EQ(replayed.tracks.at(rank.parent_uuid()).name(), "host node0");
  }
}

TEST(PerfettoExport, CompressedBundlesHoldThePacketsOfTheUncompressedFile) {
  TempDir dir;
  const TraceReader reader = TraceReader::open(writePerfettoJob(dir));
  const pb::Trace compressed = perfettoTrace(reader, true);
  const pb::Trace plain = perfettoTrace(reader, false);
  ASSERT_GT(compressed.packet_size(), 0);
  for (const pb::TracePacket& packet : compressed.packet()) EXPECT_TRUE(packet.has_compressed_packets());
  EXPECT_EQ(inflatedPerfetto(compressed).SerializeAsString(), plain.SerializeAsString());
}

// Calls of one communicator that overlap without nesting cannot share a track: the second opens
// "#2", and a later call returns to the first track once it is free.
TEST(PerfettoExport, OverlappingCallsOfOneCommunicatorGetTracksOfTheirOwn) {
  TempDir dir;
  const std::string path = dir.file("overlap.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "00000000-0000-4000-8000-00000000000a";
    run.epoch_ns = 1'000'000'000;
    const std::int64_t run_id = writer.addRun(run);
    const std::int64_t rank_id = writer.addRank({0, run_id, 0, "h", 1, "cpu", 0});
    const std::int64_t comm_id = writer.addComm({0, rank_id, "world", Backend::Mpi, 2, 0});
    std::vector<CallRecord> calls;
    const auto add = [&](Api api, std::int64_t start, std::int64_t end) {
      CallRecord call;
      call.rank_id = rank_id;
      call.comm_id = comm_id;
      call.seq = static_cast<std::int64_t>(calls.size());
      call.api = api;
      call.enqueue_ns = call.start_ns = start;
      call.end_ns = end;
      calls.push_back(call);
    };
    add(Api::MpiIsend, 1'000, 5'000);
    add(Api::MpiIrecv, 2'000, 9'000);      // overlaps the send: a second track
    add(Api::MpiAllreduce, 6'000, 7'000);  // the first track is free again
    add(Api::MpiBarrier, 9'000, 9'000);    // starts as the receive ends: still its track
    writer.appendCalls(calls);
    writer.finish();
  }
  const TraceReader reader = TraceReader::open(path);
  const PerfettoReplay replayed = replayPerfetto(perfettoTrace(reader, false));
  ASSERT_EQ(replayed.slices.size(), 4u);
  const auto track = [&](std::int64_t id) { return replayed.tracks.at(replayed.slices.at(id).track).name(); };
  EXPECT_EQ(track(1), "comm world (size 2)");
  EXPECT_EQ(track(2), "comm world (size 2) #2");
  EXPECT_EQ(track(3), "comm world (size 2)");
  EXPECT_EQ(track(4), "comm world (size 2)");
  EXPECT_EQ(replayed.slices.at(2).start, 1'000'002'000);
  EXPECT_EQ(replayed.slices.at(2).end, 1'000'009'000);
}

TEST(PerfettoExport, ATraceWithoutCallsIsRefusedAndNothingIsWritten) {
  TempDir dir;
  const std::string path = dir.file("empty.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "00000000-0000-4000-8000-00000000000b";
    writer.addRun(run);
    writer.finish();
  }
  const TraceReader reader = TraceReader::open(path);
  std::ostringstream out;
  EXPECT_GRADSCOPE_ERROR(writePerfettoTrace(reader, out), path, "no calls");
  EXPECT_TRUE(out.str().empty());
  const std::string output = dir.file("empty.pftrace");
  EXPECT_GRADSCOPE_ERROR(exportTrace(reader, ExportFormat::Perfetto, "calls", output, false), "no calls");
  EXPECT_EQ(test::listDirectory(dir.path()), (std::vector<std::string>{"empty.db"}));
  EXPECT_TRUE(perfettoExportAvailable());
}

}  // namespace
}  // namespace gradscope::storage
