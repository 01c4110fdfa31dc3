#pragma once

// The agent's clock. The hot path reads raw ticks (the TSC where it is invariant, else
// CLOCK_MONOTONIC in ns); the background thread turns ticks into Unix-epoch nanoseconds with a
// calibration it refines over the whole run, so a rate error does not grow with run length.

#include <cstdint>
#include <ctime>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace gradscope::agent {

// True when ticks() reads the TSC. Decided once, at load, before any thread records.
extern bool g_ticks_are_tsc;

inline std::int64_t monotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

inline std::int64_t realtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Hot path: ~8 ns with the TSC (no serialisation: the order against the intercepted call does not
// need to be exact to a few cycles), ~20 ns through the vDSO otherwise.
inline std::uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  if (g_ticks_are_tsc) return __rdtsc();
#endif
  return static_cast<std::uint64_t>(monotonicNs());
}

// Chooses the tick source: the TSC when the CPU says it is invariant (constant rate, runs in every
// C-state), unless GRADSCOPE_CLOCK=monotonic. Called from the library constructor.
void chooseTickSource();

// Ticks → Unix-epoch ns. Not thread-safe: owned by the background thread (and by the thread that
// creates it, before handing it over).
class ClockConversion {
 public:
  // Takes the anchor point: ticks, monotonic and realtime now.
  ClockConversion();
  // Re-measures the tick rate over [anchor, now]; a no-op for monotonic ticks and before 5 ms passed.
  void refine();
  std::int64_t toEpochNs(std::uint64_t tick) const;
  std::int64_t epochNsNow() const { return toEpochNs(ticks()); }
  double ticksPerNs() const { return ticks_per_ns_; }

 private:
  std::uint64_t anchor_ticks_;
  std::int64_t anchor_mono_ns_;
  std::int64_t mono_to_epoch_ns_;
  double ticks_per_ns_ = 1.0;
};

}  // namespace gradscope::agent
