#pragma once

// A recommendation in the formats people deploy: text and markdown for reading, the JSON file for the
// agent's apply mode, NCCL's example tuner CSV, environment lines, and PyTorch DDP, TensorFlow and
// Horovod snippets. Settings that a format cannot express (a per-size choice in a global variable, a
// strategy the library lacks) become comments saying so, never a silent approximation.

#include <optional>
#include <string>
#include <string_view>

#include "gradscope/common/recommendation.h"
#include "gradscope/tuner/recommend.h"

namespace gradscope::tuner {

enum class Format { Text, Json, Markdown, NcclTuner, Env, Ddp, Tf, Horovod, Predictions };

// "text", "json", "markdown", "nccl-tuner", "env", "ddp", "tf", "horovod", "predictions"; nullopt for
// anything else. `predictions` (CSV of every model's prediction at every workload size) needs a Result
// made with RecommendOptions::keep_predictions.
std::optional<Format> parseFormat(std::string_view text);
std::string_view name(Format format);

// The output, ending with a newline. Deterministic for given arguments (golden-tested).
std::string format(const Recommendation& recommendation, const Report& report, Format format);

}  // namespace gradscope::tuner
