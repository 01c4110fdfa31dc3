#include "gradscope/storage/steps.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace gradscope::storage {
namespace {

// Polynomial hashing modulo the Mersenne prime 2^61 - 1 compares two windows of the sequence in O(1).
// The base is fixed, not random, so that the result is a pure function of the input; a collision only
// costs a call-by-call comparison that rejects it, never a wrong step.
constexpr std::uint64_t kModulus = (std::uint64_t{1} << 61) - 1;
constexpr std::uint64_t kBase = 0x3C6EF372FE94F82Bull % kModulus;

__extension__ typedef unsigned __int128 Wide;  // GCC and Clang; -Wpedantic wants the __extension__

std::uint64_t reduce(std::uint64_t value) {
  value = (value & kModulus) + (value >> 61);
  return value >= kModulus ? value - kModulus : value;
}

std::uint64_t mulMod(std::uint64_t a, std::uint64_t b) {
  const Wide product = static_cast<Wide>(a) * b;
  return reduce(static_cast<std::uint64_t>(product & kModulus) + static_cast<std::uint64_t>(product >> 61));
}

std::uint64_t powMod(std::uint64_t base, std::uint64_t exponent) {
  std::uint64_t result = 1;
  for (; exponent > 0; exponent >>= 1) {
    if (exponent & 1) result = mulMod(result, base);
    base = mulMod(base, base);
  }
  return result;
}

// splitmix64's finaliser: spreads small or similar inputs over all bits.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<std::int64_t> detectSteps(std::span<const std::uint64_t> signatures,
                                      const StepDetectionOptions& options) {
  const std::size_t n = signatures.size();
  std::vector<std::int64_t> steps(n, -1);
  if (n == 0 || options.max_period < 1) return steps;
  const std::uint64_t repeats = static_cast<std::uint64_t>(std::max(options.min_repeats, 2));
  // Periods that could still fit min_repeats times; also keeps next-occurrence distances in 32 bits.
  const std::uint64_t max_period =
      std::min<std::uint64_t>({static_cast<std::uint64_t>(options.max_period), n / repeats,
                               std::numeric_limits<std::uint32_t>::max()});
  if (max_period == 0) return steps;
  const std::span<const std::uint64_t> s = signatures;

  // next[i]: distance to the next call with the same signature, 0 when there is none within max_period.
  std::vector<std::uint32_t> next(n, 0);
  {
    std::unordered_map<std::uint64_t, std::size_t> last_seen;
    for (std::size_t i = 0; i < n; ++i) {
      const auto [it, inserted] = last_seen.try_emplace(s[i], i);
      if (inserted) continue;
      if (i - it->second <= max_period) next[it->second] = static_cast<std::uint32_t>(i - it->second);
      it->second = i;
    }
  }

  // prefix[k]: hash of s[0..k); window(a, P) hashes the (repeats - 1)·P calls from a, with the factor
  // base^((repeats - 1)·P) from shift[P].
  std::vector<std::uint64_t> prefix(n + 1, 0);
  for (std::size_t k = 0; k < n; ++k) prefix[k + 1] = reduce(mulMod(prefix[k], kBase) + mix(s[k]) % kModulus);
  std::vector<std::uint64_t> shift(max_period + 1, 1);
  const std::uint64_t period_factor = powMod(kBase, repeats - 1);
  for (std::size_t p = 1; p <= max_period; ++p) shift[p] = mulMod(shift[p - 1], period_factor);
  const auto window = [&](std::size_t a, std::size_t period) {
    const std::uint64_t end = prefix[a + (repeats - 1) * period];
    return reduce(end + kModulus - mulMod(prefix[a], shift[period]));
  };

  // Moves `occurrence` along the chain of its signature's next occurrences to the first one at or after
  // `at_least`; false when the chain ends first (or leaves max_period behind).
  const auto advance = [&](std::size_t& occurrence, std::size_t at_least) {
    do {
      const std::uint32_t distance = next[occurrence];
      if (distance == 0) return false;
      occurrence += distance;
    } while (occurrence < at_least);
    return true;
  };

  std::int64_t next_step = 0;
  std::size_t i = 0;
  while (i < n) {
    std::size_t best_period = 0, best_end = i;
    std::size_t occurrence = i;      // walks the chain of s[i]'s next occurrences
    std::size_t skip_below = i + 1;  // the next candidate occurrence is at or after this
    for (int tries = 0; tries < kMaxCandidates && best_end < n && advance(occurrence, skip_below); ++tries) {
      const std::size_t period = occurrence - i;
      if (period > max_period || i + repeats * period > n) break;  // neither fits, nor any longer one
      if (window(i, period) != window(i + period, period)) continue;
      std::size_t end = i + period;  // confirm (a hash collision fails here) and extend call by call
      while (end < n && s[end] == s[end - period]) ++end;
      if (end - i < repeats * period) continue;
      if (end > best_end) {
        best_end = end;
        best_period = period;
      }
      // A longer period with a longer stretch must exceed this run minus its period (else the run would
      // have continued), and s[i] recurs there.
      skip_below = end - period + 1;
    }
    if (best_period == 0) {
      ++i;
      continue;
    }
    for (std::size_t k = i, in_period = 0; k < best_end; ++k) {
      steps[k] = next_step;
      if (++in_period == best_period) {
        in_period = 0;
        ++next_step;
      }
    }
    if ((best_end - i) % best_period != 0) ++next_step;  // the final partial period
    i = best_end;
  }
  return steps;
}

std::uint64_t callSignature(std::string_view comm_key, Api api, DType dtype, ReduceOp op,
                            std::int64_t count) {
  std::uint64_t key = 0xCBF29CE484222325ull;  // FNV-1a: stable across builds, unlike std::hash
  for (const char c : comm_key) key = (key ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  std::uint64_t h = mix(key);
  h = mix(h ^ (static_cast<std::uint64_t>(api) << 16 | static_cast<std::uint64_t>(dtype) << 8 |
               static_cast<std::uint64_t>(op)));
  return mix(h ^ static_cast<std::uint64_t>(count));
}

}  // namespace gradscope::storage
