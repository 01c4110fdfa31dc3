// `gradscope recommend`: trace files in, a deployable recommendation out.

#include "gradscope/cli/recommend.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradscope/common/error.h"
#include "gradscope/storage/files.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/trace_input.h"
#include "gradscope/storage/writer.h"
#include "gradscope/tuner/exporters.h"
#include "gradscope/tuner/recommend.h"

namespace gradscope::cli {

void runRecommend(const RecommendCommand& command, std::ostream& out, std::ostream& log) {
  if (command.inputs.empty()) fail("recommend needs at least one trace file");
  const auto format = tuner::parseFormat(command.format);
  if (!format) fail("unknown format '{}' ({})", command.format, tuner::formatNames());
  if (!(command.max_rel_error >= 0) || !std::isfinite(command.max_rel_error))
    fail("--max-rel-error must be a number >= 0 (0 allows lossless strategies only)");
  if (command.world && *command.world < 1) fail("--world must be a positive number of ranks");

  // A run's directory of rank files is merged into a temporary copy first (storage/trace_input.h).
  std::vector<std::unique_ptr<storage::TraceInput>> opened;
  std::vector<std::string> files;
  for (const std::string& input : command.inputs) {
    opened.push_back(std::make_unique<storage::TraceInput>(input, 0, command.merge_link));
    files.push_back(opened.back()->file());
  }
  const tuner::Inputs inputs = tuner::readInputs(files);
  const tuner::Result result =
      tuner::recommend(inputs, {command.max_rel_error, command.allow_semantic_change, command.world,
                                command.created, *format == tuner::Format::Predictions});
  const std::string text = tuner::format(result.recommendation, result.report, *format);

  if (command.output.empty() || command.output == "-") {
    out << text;
    out.flush();
    if (!out) fail("cannot write the recommendation to standard output");
  } else {
    storage::writePrivateFile(command.output, text);
    log << fmt::format("wrote {}\n", command.output);
    // The file does nothing until every rank's Open MPI is told to read it, by absolute path (the ranks'
    // working directory may differ from ours).
    if (*format == tuner::Format::OmpiRules)
      log << fmt::format(
          "load it in every rank:\n  OMPI_MCA_coll_tuned_use_dynamic_rules=1\n"
          "  OMPI_MCA_coll_tuned_dynamic_rules_filename={}\n",
          std::filesystem::absolute(command.output).lexically_normal().string());
  }

  // Stored where the evidence is, so that the GUI and a later `gradscope check` find it; a read-only
  // input (a CI artifact, a shared file) is not an error: the output above is what the user asked for.
  if (!command.store) return;
  const std::string& first = command.inputs.front();
  if (opened.front()->merged()) {
    log << fmt::format(
        "note: {} is a directory of rank files, merged for this command only; the recommendation was not "
        "stored (gradscope merge {} -o FILE keeps a merged trace that stores it)\n",
        first, first);
    return;
  }
  if (::access(first.c_str(), W_OK) != 0) {
    log << fmt::format("note: {} is read-only; the recommendation was not stored in it\n", first);
    return;
  }
  storage::RecommendationRecord record;
  // Run ids are file-local: the first file's own first run.
  if (const auto runs = storage::TraceReader::open(first).runs(); !runs.empty())
    record.run_id = runs.front().id;
  record.json = toJson(result.recommendation);
  storage::appendRecommendation(first, record);
}

}  // namespace gradscope::cli
