#pragma once

// Small output files gradscope writes for the user (recommendations, check results): private and never
// half-written.

#include <string>
#include <string_view>

namespace gradscope::storage {

// Writes `text` to `path` through a mode-0600 temporary file beside it, renamed over `path` once complete:
// readers never see a partial file, a symlink at `path` is replaced rather than followed, and the file is
// private (0600) like every trace. Throws gradscope::Error with a one-line message naming `path`.
void writePrivateFile(const std::string& path, std::string_view text);

}  // namespace gradscope::storage
