#pragma once

// A recommendation in the formats people deploy: text and markdown for reading, the JSON file for the
// agent's apply mode, NCCL's example tuner CSV, Open MPI's coll_tuned dynamic rules file, environment
// lines, and PyTorch DDP, TensorFlow and Horovod snippets (docs/deploy.md: who reads each, and how to see
// that it took effect). Settings that a format cannot express (a per-size choice in a global variable, a
// strategy the library lacks) become comments saying so, never a silent approximation.

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "gradscope/common/recommendation.h"
#include "gradscope/tuner/recommend.h"

namespace gradscope::tuner {

enum class Format { Text, Json, Markdown, NcclTuner, OmpiRules, Env, Ddp, Tf, Horovod, Predictions };

// Every format, in the order the command's help, its errors and the viewer's export buttons list them.
inline constexpr std::array kFormats = {
    Format::Text, Format::Json, Format::Markdown, Format::NcclTuner, Format::OmpiRules,
    Format::Env,  Format::Ddp,  Format::Tf,       Format::Horovod,   Format::Predictions};

// "text", "json", "markdown", "nccl-tuner", "ompi-rules", "env", "ddp", "tf", "horovod", "predictions";
// nullopt for anything else. `predictions` (CSV of every model's prediction at every workload size) needs
// a Result made with RecommendOptions::keep_predictions.
std::optional<Format> parseFormat(std::string_view text);
std::string_view name(Format format);
// The names of kFormats for help texts and errors: "text, json, ..., horovod or predictions".
std::string formatNames();

// The output, ending with a newline. Deterministic for given arguments (golden-tested).
//
// OmpiRules is a file in the format Open MPI 4.1's coll_tuned reads (5.0 reads it too; no
// rule-file-version line, which 4.1 cannot read): MPI_Allreduce's algorithm per communicator size and message
// size (count x datatype size, the recommendation's bytes), for the rules whose strategy is
// sum/mpi.<algorithm> and whose communicator size is the rule's world_size (unset: any size). Every other
// communicator size and byte gets algorithm 0, Open MPI's own decision. What it cannot express (other
// strategies, MPI_Iallreduce, which coll_tuned does not serve, rules of another dtype overlapping in bytes
// with another algorithm) becomes a '#' comment pointing to apply mode; with nothing to express it is still a
// valid file that changes nothing, and says so.
std::string format(const Recommendation& recommendation, const Report& report, Format format);

}  // namespace gradscope::tuner
