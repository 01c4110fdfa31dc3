#include "gradscope/common/units.h"

#include <cctype>
#include <charconv>
#include <cmath>

#include "gradscope/common/error.h"

namespace gradscope {

namespace {

// At most three significant digits; decided on the magnitude so negative values read the same.
std::string threeDigits(double value) {
  const double magnitude = std::fabs(value);
  if (magnitude >= 99.95) return fmt::format("{:.0f}", value);
  if (magnitude >= 9.995) return fmt::format("{:.1f}", value);
  return fmt::format("{:.2f}", value);
}

}  // namespace

std::string formatBytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  auto value = static_cast<double>(bytes);
  int unit = 0;
  // Move up a unit when the value would print as 1024 or more after rounding ("1024 KiB" -> "1 MiB").
  while (value >= 1023.5 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  std::string digits = threeDigits(value);
  // Drop trailing zeros so exact powers read "64 KiB", not "64.0 KiB".
  if (digits.find('.') != std::string::npos) {
    while (digits.back() == '0') digits.pop_back();
    if (digits.back() == '.') digits.pop_back();
  }
  return fmt::format("{} {}", digits, kUnits[unit]);
}

std::string formatDuration(double nanoseconds) {
  // Thresholds sit where rounding to three digits would print 1000 of the smaller unit.
  const double magnitude = std::fabs(nanoseconds);
  if (magnitude < 999.5) return fmt::format("{:.0f} ns", nanoseconds);
  if (magnitude < 999.5e3) return threeDigits(nanoseconds / 1e3) + " us";
  if (magnitude < 999.5e6) return threeDigits(nanoseconds / 1e6) + " ms";
  return threeDigits(nanoseconds / 1e9) + " s";
}

std::string formatCount(std::uint64_t count) {
  std::string digits = std::to_string(count);
  std::string out;
  const std::size_t lead = digits.size() % 3;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (i - lead) % 3 == 0 && i >= lead) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::uint64_t parseBytes(std::string_view text) {
  const auto bad = [&]() -> std::uint64_t {
    fail("invalid size '{}': use a number of bytes with an optional K, M, G or T suffix (e.g. 4096, 64K, 1M)",
         text);
  };
  std::string_view rest = text;
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) rest.remove_prefix(1);
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.remove_suffix(1);
  if (rest.empty() || rest.front() == '-' || rest.front() == '+') return bad();
  double number = 0.0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), number);
  if (ec != std::errc{} || !std::isfinite(number)) return bad();
  std::string suffix(end, rest.data() + rest.size());
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1.0;
  if (suffix.empty() || suffix == "B") {
    scale = 1.0;
  } else {
    const char unit = suffix[0];
    const std::string_view tail = std::string_view(suffix).substr(1);
    if (!(tail.empty() || tail == "B" || tail == "IB")) return bad();
    switch (unit) {
      case 'K': scale = 0x1p10; break;
      case 'M': scale = 0x1p20; break;
      case 'G': scale = 0x1p30; break;
      case 'T': scale = 0x1p40; break;
      default: return bad();
    }
  }
  const double bytes = number * scale;
  if (bytes >= 0x1p63) fail("size '{}' is too large (at most 8 EiB)", text);
  if (bytes != std::floor(bytes)) fail("size '{}' is not a whole number of bytes", text);
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace gradscope
