#pragma once

// `gradscope report`: what happened in a trace, as text for people.

#include <cstddef>
#include <ostream>

#include "gradscope/storage/reader.h"

namespace gradscope::cli {

struct ReportOptions {
  std::size_t top_calls = 10;  // rows in "Slowest calls"
};

// Writes the report of `reader` to `out`: the run, time in collectives per API and size bucket, the
// slowest calls, the per-rank spread (time in collectives, lateness against the other ranks) and the
// events the agent dropped, and, when the trace holds the agent's own statistics (docs/agent.md), the
// agent's overhead per rank and in total. Deterministic for a given file (golden-tested).
void writeReport(const storage::TraceReader& reader, std::ostream& out, const ReportOptions& options = {});

}  // namespace gradscope::cli
