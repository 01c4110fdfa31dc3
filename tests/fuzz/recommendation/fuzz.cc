// libFuzzer target for the recommendation file (gradscope/common/recommendation.h), which the agent's
// apply mode reads inside the user's job: any bytes give a Recommendation or a one-line gradscope::Error,
// never a crash or another exception; an accepted file survives toJson and parseRecommendation unchanged
// (the writer can always write what the reader accepts), and match() answers without crashing.
// Run: scripts/fuzz.sh 60 recommendation (docs/reliability.md).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gradscope/common/error.h"
#include "gradscope/common/recommendation.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  gradscope::Recommendation recommendation;
  try {
    recommendation = gradscope::parseRecommendation(text, "fuzz");
  } catch (const gradscope::Error& error) {
    if (std::string_view(error.what()).find('\n') != std::string_view::npos) std::abort();  // one line
    return 0;
  }
  // Accepted: the round trip is exact and toJson refuses nothing parseRecommendation accepted.
  if (gradscope::parseRecommendation(gradscope::toJson(recommendation), "fuzz") != recommendation)
    std::abort();
  for (const auto& rule : recommendation.rules) {
    for (const std::int64_t bytes : {rule.min_bytes, rule.max_bytes}) {
      const auto* match = recommendation.match(rule.api, rule.dtype, bytes, rule.world_size.value_or(1));
      // The rule itself covers the call, so some rule must (it, or one for this exact world size).
      if (match == nullptr) std::abort();
    }
  }
  return 0;
}
