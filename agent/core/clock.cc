#include "core/clock.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "gradscope/common/job_environment.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace gradscope::agent {

bool g_ticks_are_tsc = false;
std::int64_t g_test_clock_offset_ns = 0;

void chooseTickSource() {
  g_ticks_are_tsc = false;
  g_test_clock_offset_ns = 0;
  if (const char* offset = std::getenv(env::kTestClockOffset)) {
    // A test setting: a value that does not parse whole is ignored rather than reported.
    char* end = nullptr;
    const long long value = std::strtoll(offset, &end, 10);
    if (end != offset && *end == '\0') g_test_clock_offset_ns = value;
  }
  const char* choice = std::getenv(env::kClock);
  if (choice != nullptr && std::strcmp(choice, "monotonic") == 0) return;
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  // CPUID 0x80000007 EDX bit 8: invariant TSC (Intel SDM vol. 3 17.17.1; AMD "TscInvariant").
  if (__get_cpuid(0x80000000u, &eax, &ebx, &ecx, &edx) && eax >= 0x80000007u &&
      __get_cpuid(0x80000007u, &eax, &ebx, &ecx, &edx))
    g_ticks_are_tsc = (edx & (1u << 8)) != 0;
#endif
}

ClockPair readClockPair(std::uint64_t (*read_ticks)(), std::int64_t (*read_mono_ns)()) {
  // Five tries: one is nearly always undisturbed (a bracket of a few tens of ns).
  ClockPair best{};
  std::uint64_t best_bracket = UINT64_MAX;
  for (int i = 0; i < 5; ++i) {
    const std::uint64_t before = read_ticks();
    const std::int64_t mono = read_mono_ns();
    const std::uint64_t after = read_ticks();
    if (after >= before && after - before < best_bracket) {
      best_bracket = after - before;
      best = {before + (after - before) / 2, mono};
    }
  }
  return best;
}

ClockPair readClockPair() {
  if (!g_ticks_are_tsc) {
    const std::int64_t now = monotonicNs();
    return {static_cast<std::uint64_t>(now), now};
  }
  return readClockPair(ticks, monotonicNs);
}

namespace {

// mono_to_epoch: realtime − monotonic, the realtime read between two monotonic reads (readClockPair).
std::int64_t monoToEpochNs() {
  const ClockPair pair = readClockPair([] { return static_cast<std::uint64_t>(monotonicNs()); }, realtimeNs);
  return pair.mono_ns - static_cast<std::int64_t>(pair.tick);
}

constexpr std::int64_t kMinRefineIntervalNs = 5'000'000;
constexpr double kMaxSlew = 0.01;  // a segment's slope is within 1% of the measured rate's

}  // namespace

ClockConversion::ClockConversion(ClockPair anchor)
    : tsc_(g_ticks_are_tsc),
      anchor_ticks_(anchor.tick),
      anchor_mono_ns_(anchor.mono_ns),
      mono_to_epoch_ns_(monoToEpochNs()),
      last_refine_mono_ns_(anchor_mono_ns_) {
  if (!tsc_) return;
  // A first rate from a 2 ms interval (pairs read within ~50 ns of each other: 25 ppm); refine() improves
  // on it.
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const ClockPair now = readClockPair();
  ticks_per_ns_ = static_cast<double>(now.tick - anchor_ticks_) /
                  static_cast<double>(std::max<std::int64_t>(1, now.mono_ns - anchor_mono_ns_));
  segments_.push_back({anchor_ticks_, 0.0, 1.0 / ticks_per_ns_});
  last_refine_mono_ns_ = now.mono_ns;
}

ClockConversion::ClockConversion(bool tsc, std::uint64_t anchor_ticks, std::int64_t anchor_mono_ns,
                                 std::int64_t mono_to_epoch_ns, double ticks_per_ns)
    : tsc_(tsc),
      anchor_ticks_(anchor_ticks),
      anchor_mono_ns_(anchor_mono_ns),
      mono_to_epoch_ns_(mono_to_epoch_ns),
      ticks_per_ns_(ticks_per_ns),
      last_refine_mono_ns_(anchor_mono_ns) {
  if (tsc_) segments_.push_back({anchor_ticks_, 0.0, 1.0 / ticks_per_ns_});
}

void ClockConversion::refineAt(std::uint64_t tick, std::int64_t mono_ns) {
  if (!tsc_ || tick <= segments_.back().tick) return;
  const std::int64_t elapsed = mono_ns - anchor_mono_ns_;
  const std::int64_t since_last = mono_ns - last_refine_mono_ns_;
  if (elapsed <= 0 || since_last < std::max(kMinRefineIntervalNs, elapsed / 16)) return;
  ticks_per_ns_ = static_cast<double>(tick - anchor_ticks_) / static_cast<double>(elapsed);
  // From where the map stands at `tick`, aim at the best line (through the anchor at the measured rate)
  // one interval like the last one ahead.
  const double here = monoNsAt(tick);
  const double horizon_ns = static_cast<double>(since_last);
  const double target = static_cast<double>(elapsed) + horizon_ns;
  const double rate_slope = 1.0 / ticks_per_ns_;
  const double slope = std::clamp((target - here) / (horizon_ns * ticks_per_ns_),
                                  rate_slope * (1.0 - kMaxSlew), rate_slope * (1.0 + kMaxSlew));
  segments_.push_back({tick, here, slope});
  last_refine_mono_ns_ = mono_ns;
}

double ClockConversion::monoNsAt(std::uint64_t tick) const {
  // Records come mostly in order: the segment is nearly always the last or close to it.
  auto it = segments_.end() - 1;
  while (it != segments_.begin() && tick < it->tick) --it;
  const double delta = static_cast<double>(static_cast<std::int64_t>(tick - it->tick));
  return it->mono_ns + delta * it->ns_per_tick;
}

std::int64_t ClockConversion::toEpochNs(std::uint64_t tick) const {
  if (!tsc_) return static_cast<std::int64_t>(tick) + mono_to_epoch_ns_;
  return anchor_mono_ns_ + static_cast<std::int64_t>(monoNsAt(tick)) + mono_to_epoch_ns_;
}

}  // namespace gradscope::agent
