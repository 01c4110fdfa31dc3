#pragma once

// Exporting a trace to formats other tools open.

#include <ostream>
#include <string>
#include <string_view>

#include "gradscope/storage/reader.h"

namespace gradscope::storage {

enum class ExportFormat { ChromeTrace, Csv };

// Chrome trace-event JSON (opens in Perfetto and chrome://tracing): one process track per rank (named
// "rank N (host)"), one thread track per communicator, one complete ("X") slice per call with its
// arguments. Times are microseconds on the run's clock, with each rank's clock offset applied.
// Point-to-point slices carry their peers (dest, source: ranks in the communicator; dest_rank,
// source_rank: world ranks when the trace can tell) and tags; all-to-alls their peer_max/min_bytes. Each
// message (storage/peers.h matchPeerMessages) is a flow arrow, category "p2p", name "message", id = the
// send's call id: a flow start ("ph":"s") in the middle of the send's slice and a flow end ("ph":"f",
// "bp":"e": bound to the enclosing slice) in the middle of the receive's.
void writeChromeTrace(const TraceReader& reader, std::ostream& out);

// CSV with a header line. `table` is "calls" (codes resolved to names; the peer_calls columns last, empty
// when unknown, so that the columns of earlier versions keep their places) or "measurements".
void writeCsv(const TraceReader& reader, std::string_view table, std::ostream& out);

// Writes `format` to `path` ("-" = standard output). A file appears only once complete (mode 0600);
// an existing one is replaced only with `overwrite`.
void exportTrace(const TraceReader& reader, ExportFormat format, std::string_view table,
                 const std::string& path, bool overwrite);

}  // namespace gradscope::storage
