#pragma once

// A recommendation in the formats people deploy: text and markdown for reading, the JSON file for the
// agent's apply mode, NCCL's example tuner CSV, environment lines, and PyTorch DDP, TensorFlow and
// Horovod snippets. Settings that a format cannot express (a per-size choice in a global variable, a
// strategy the library lacks) become comments saying so, never a silent approximation.

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "gradscope/common/recommendation.h"
#include "gradscope/tuner/recommend.h"

namespace gradscope::tuner {

enum class Format { Text, Json, Markdown, NcclTuner, Env, Ddp, Tf, Horovod, Predictions };

// Every format, in the order the command's help, its errors and the viewer's export buttons list them.
inline constexpr std::array kFormats = {Format::Text,      Format::Json,    Format::Markdown,
                                        Format::NcclTuner, Format::Env,     Format::Ddp,
                                        Format::Tf,        Format::Horovod, Format::Predictions};

// "text", "json", "markdown", "nccl-tuner", "env", "ddp", "tf", "horovod", "predictions"; nullopt for
// anything else. `predictions` (CSV of every model's prediction at every workload size) needs a Result
// made with RecommendOptions::keep_predictions.
std::optional<Format> parseFormat(std::string_view text);
std::string_view name(Format format);
// The names of kFormats for help texts and errors: "text, json, ..., horovod or predictions".
std::string formatNames();

// The output, ending with a newline. Deterministic for given arguments (golden-tested).
std::string format(const Recommendation& recommendation, const Report& report, Format format);

}  // namespace gradscope::tuner
