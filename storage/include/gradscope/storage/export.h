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
void writeChromeTrace(const TraceReader& reader, std::ostream& out);

// CSV with a header line. `table` is "calls" (codes resolved to names) or "measurements".
void writeCsv(const TraceReader& reader, std::string_view table, std::ostream& out);

// Writes `format` to `path` ("-" = standard output). A file appears only once complete (mode 0600);
// an existing one is replaced only with `overwrite`.
void exportTrace(const TraceReader& reader, ExportFormat format, std::string_view table,
                 const std::string& path, bool overwrite);

}  // namespace gradscope::storage
