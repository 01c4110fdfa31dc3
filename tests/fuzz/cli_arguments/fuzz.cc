// libFuzzer target for the size, fraction and percentage arguments users type: parseBytes
// (gradscope/common/units.h; gradscope bench's -b, -e and -i go through it, cli/src/bench/options.cc) and
// tuner::parseTolerance (gradscope check --tolerance). Both accept, with a value in range, or refuse with a
// one-line gradscope::Error; never a crash or another exception. Both run on every input.
// Run: scripts/fuzz.sh 60 cli_arguments (docs/reliability.md).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "gradscope/common/error.h"
#include "gradscope/common/units.h"
#include "gradscope/tuner/check.h"

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

void requireOneLine(const gradscope::Error& error) {
  require(std::string_view(error.what()).find('\n') == std::string_view::npos);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // The messages quote the argument: a one-line argument must give a one-line message.
  const bool one_line = text.find('\n') == std::string_view::npos;
  try {
    require(gradscope::parseBytes(text) < (std::uint64_t{1} << 63));
  } catch (const gradscope::Error& error) {
    if (one_line) requireOneLine(error);
  }
  try {
    const double tolerance = gradscope::tuner::parseTolerance(text);
    require(std::isfinite(tolerance) && tolerance >= 0);
  } catch (const gradscope::Error& error) {
    if (one_line) requireOneLine(error);
  }
  return 0;
}
