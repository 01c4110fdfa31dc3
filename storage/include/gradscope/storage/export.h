#pragma once

// Exporting a trace to formats other tools open.

#include <ostream>
#include <string>
#include <string_view>

#include "gradscope/storage/reader.h"

namespace gradscope::storage {

enum class ExportFormat { ChromeTrace, Csv, Perfetto };

// Chrome trace-event JSON (opens in Perfetto and chrome://tracing): one process track per rank (named
// "rank N (host)"), one thread track per communicator, one complete ("X") slice per call with its
// arguments. Times are microseconds on the run's clock, with each rank's clock offset applied.
// Point-to-point slices carry their peers (dest, source: ranks in the communicator; dest_rank,
// source_rank: world ranks when the trace can tell) and tags; all-to-alls their peer_max/min_bytes. Each
// message (storage/peers.h matchPeerMessages) is a flow arrow, category "p2p", name "message", id = the
// send's call id: a flow start ("ph":"s") in the middle of the send's slice and a flow end ("ph":"f",
// "bp":"e": bound to the enclosing slice) in the middle of the receive's.
void writeChromeTrace(const TraceReader& reader, std::ostream& out);

// Perfetto's native protobuf trace (opens in ui.perfetto.dev and trace_processor), the same content as the
// Chrome trace in a fifth of its size or less, written packet by packet: memory does not grow with the
// number of calls. Tracks: one per host, under it one per rank ("rank N", ordered by rank), under that
// one per communicator ("comm KEY (size N)"; calls of one communicator that overlap without nesting go to
// further tracks "... #2" and on). Each call is a slice named by its API (begin and end events), times in
// nanoseconds: the run's epoch plus the call's time with the rank's clock offset applied. Its arguments
// are debug annotations: id, seq, bytes, step, comm, dtype, count, op, and what the Chrome trace adds when
// known (queued_ns, stream, algo, proto, channels, graph_replay, peers and tags, peer byte bounds); each
// message is a flow from the send's slice to the receive's. The packets go in deflate-compressed bundles
// (TracePacket.compressed_packets, which trace_processor and the Perfetto UI inflate) unless `compress`
// is false. Refuses (gradscope::Error, nothing written) a trace without calls, and every trace in a build
// without protobuf (the message names the packages).
struct PerfettoOptions {
  bool compress = true;
};
void writePerfettoTrace(const TraceReader& reader, std::ostream& out, const PerfettoOptions& options = {});

// Whether this build can write Perfetto traces (it was built with protobuf).
bool perfettoExportAvailable();

// CSV with a header line. `table` is "calls" (codes resolved to names; the peer_calls columns last, empty
// when unknown, so that the columns of earlier versions keep their places) or "measurements".
void writeCsv(const TraceReader& reader, std::string_view table, std::ostream& out);

// Writes `format` to `path` ("-" = standard output). A file appears only once complete (mode 0600);
// an existing one is replaced only with `overwrite`.
void exportTrace(const TraceReader& reader, ExportFormat format, std::string_view table,
                 const std::string& path, bool overwrite);

}  // namespace gradscope::storage
