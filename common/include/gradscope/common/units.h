#pragma once

// Human-readable sizes and durations, and parsing of the size arguments users type.

#include <bit>
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

// The power-of-two class of a buffer of `bytes`: k for [2^k, 2^(k+1)) bytes, -1 for none. How the
// report's time table, the stored step calls and `gradscope check` group calls by size.
inline int sizeClass(std::int64_t bytes) {
  return bytes > 0 ? static_cast<int>(std::bit_width(static_cast<std::uint64_t>(bytes))) - 1 : -1;
}

// Parses "4096", "64K", "64KiB", "1M", "1.5GB" (K/M/G/T are powers of 1024, as in nccl-tests).
// Throws gradscope::Error naming the bad text and the accepted forms.
std::uint64_t parseBytes(std::string_view text);

}  // namespace gradscope
