#pragma once

// `gradscope report`: what happened in a trace, as text for people.

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "gradscope/storage/reader.h"

namespace gradscope::cli {

struct ReportOptions {
  std::size_t top_calls = 10;  // rows in "Slowest calls"
  std::string name;            // what the header names; empty: the reader's file (a directory's merged copy
                               // is named by its directory)
};

// Writes the report of `reader` to `out`: the run, time in collectives per API and size bucket, the
// slowest calls, the per-rank spread (time in collectives, lateness against the other ranks), the
// strategies benchmarked, and the events the agent dropped. Sections appear when the trace has what
// they show: time per API family (when there is more than collectives: point-to-point calls, barriers,
// NCCL group launches apart), the point-to-point messages and the rank pairs that moved the most bytes,
// the pipeline's stages and each rank's bubble (when the messages form more than one stage), the
// all-to-alls' imbalance between peers (storage/peers.h), the strategies explore mode timed on the job's
// calls (per API, dtype and size, against sum/native), the consensus diagnostics of those calls, the
// calls apply mode replaced (per strategy, and the reductions it left alone), and the agent's overhead
// per rank and in total (docs/agent.md). Deterministic for a given file (golden-tested: a data-parallel
// job in report_synthetic.txt, a pipeline in report_pipeline.txt).
void writeReport(const storage::TraceReader& reader, std::ostream& out, const ReportOptions& options = {});

// "0-3, 8, 10-11": ascending rank numbers, runs of consecutive ones as ranges.
std::string rankList(std::vector<int> ranks);

}  // namespace gradscope::cli
