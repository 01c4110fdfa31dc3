#pragma once

// `gradscope recommend`: reads trace files, makes a recommendation (tuner/recommend.h), writes it in one
// of the export formats, and stores its JSON in the first input's `recommendations` table.

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace gradscope::storage {
class MergeLink;
}

namespace gradscope::cli {

struct RecommendCommand {
  std::vector<std::string> inputs;  // trace files, at least one
  double max_rel_error = 0;
  bool allow_semantic_change = false;
  std::optional<int> world;
  std::string format = "text";  // tuner::parseFormat names
  std::string output;           // empty or "-": `out`
  bool store = true;            // store the JSON in the first input when it is writable
  std::string created;          // ISO 8601 UTC; empty: now (tests fix it)
  // The processes a directory's rank files are merged across (storage/merge.h MergeLink), or null.
  storage::MergeLink* merge_link = nullptr;
};

// Runs the command. The output goes to `command.output` (replaced if it exists) or `out`; notes (where
// the JSON was stored, or why not) go to `log`. Throws gradscope::Error with one line on bad input:
// unknown format, a negative error budget or world size, an input that is not a trace, no measurements.
void runRecommend(const RecommendCommand& command, std::ostream& out, std::ostream& log);

}  // namespace gradscope::cli
