#pragma once

// Human-readable sizes and durations, and parsing of the size arguments users type.

#include <cstdint>
#include <string>
#include <string_view>

namespace gradscope {

// "0 B", "512 B", "1.5 KiB", "64 MiB": binary units, at most three significant digits.
std::string formatBytes(std::uint64_t bytes);
// "850 ns", "12.3 us", "4.56 ms", "1.23 s".
std::string formatDuration(double nanoseconds);
// "1,234,567".
std::string formatCount(std::uint64_t count);

// Parses "4096", "64K", "64KiB", "1M", "1.5GB" (K/M/G/T are powers of 1024, as in nccl-tests).
// Throws gradscope::Error naming the bad text and the accepted forms.
std::uint64_t parseBytes(std::string_view text);

}  // namespace gradscope
