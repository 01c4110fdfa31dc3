#pragma once

// The agent's clock. The hot path reads raw ticks (the TSC where it is invariant, else
// CLOCK_MONOTONIC in ns); the background thread turns ticks into Unix-epoch nanoseconds with a
// calibration it refines over the whole run, so a rate error does not grow with run length, and slews
// rather than steps, so a thread's calls keep their order in time.

#include <cstdint>
#include <ctime>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace gradscope::agent {

// True when ticks() reads the TSC. Decided once, at load, before any thread records.
extern bool g_ticks_are_tsc;
// GRADSCOPE_TEST_CLOCK_OFFSET: added to every wall-clock time read, as if this host's clock were off by
// that much (tests of merge's clock alignment). Decided once, at load, with the tick source.
extern std::int64_t g_test_clock_offset_ns;

inline std::int64_t monotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

inline std::int64_t realtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec + g_test_clock_offset_ns;
}

// Hot path: ~8 ns with the TSC (no serialisation: the order against the intercepted call does not
// need to be exact to a few cycles), ~20 ns through the vDSO otherwise.
inline std::uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  if (g_ticks_are_tsc) return __rdtsc();
#endif
  return static_cast<std::uint64_t>(monotonicNs());
}

// A tick and the CLOCK_MONOTONIC time at one instant: the clock read between two tick reads, the tightest
// of a few tries, placed at the middle of its bracket. Two plain reads in a row can be tens of µs apart (the
// first clock_gettime of a process binds its symbol; an interrupt), and a calibration carries that gap into
// every time it converts: it made a first rate 2% off, and ranks' clocks 3-25 µs apart for a whole run.
struct ClockPair {
  std::uint64_t tick;
  std::int64_t mono_ns;
};
ClockPair readClockPair();
// The same from given clocks: `read_mono_ns` read between two reads of `read_ticks` (tests, and the
// realtime − monotonic offset, which reads realtime between two monotonic reads).
ClockPair readClockPair(std::uint64_t (*read_ticks)(), std::int64_t (*read_mono_ns)());

// Chooses the tick source: the TSC when the CPU says it is invariant (constant rate, runs in every
// C-state), unless GRADSCOPE_CLOCK=monotonic; and the test clock offset. Called from the library
// constructor.
void chooseTickSource();

// Ticks → Unix-epoch ns. Not thread-safe: owned by the background thread (and by the thread that
// creates it, before handing it over).
//
// With TSC ticks the map is piecewise linear and continuous: each refine() starts a new segment where the
// current one stands, with a slope that takes the map back onto the best line through the whole run by
// the next refinement (a slew of at most 1%, never a step). Records are converted when they are drained,
// each by the segment its tick falls in, so later ticks never convert to earlier times, whenever they are
// converted. (A map that simply took each new rate jumped: under TSan, a call was written 34 µs before
// the call issued just ahead of it.) Refinements come at growing intervals (1/16 of the run so far, at
// least 5 ms), so a day's run has a few hundred segments.
class ClockConversion {
 public:
  // Takes the anchor point (ticks, monotonic and realtime now) and a first rate over 2 ms.
  ClockConversion() : ClockConversion(readClockPair()) {}
  // A conversion from given points, for tests: `ticks_per_ns` is the first rate.
  ClockConversion(bool tsc, std::uint64_t anchor_ticks, std::int64_t anchor_mono_ns,
                  std::int64_t mono_to_epoch_ns, double ticks_per_ns);
  // Re-measures the tick rate over [anchor, now] and bends the map toward it; a no-op for monotonic ticks,
  // and until the interval since the last refinement is long enough.
  void refine() {
    const ClockPair now = readClockPair();
    refineAt(now.tick, now.mono_ns);
  }
  void refineAt(std::uint64_t tick, std::int64_t mono_ns);
  std::int64_t toEpochNs(std::uint64_t tick) const;
  std::int64_t epochNsNow() const { return toEpochNs(ticks()); }
  // The best estimate of the tick rate (the whole run's).
  double ticksPerNs() const { return ticks_per_ns_; }
  std::size_t segments() const { return segments_.size(); }

 private:
  struct Segment {
    std::uint64_t tick;  // where it starts
    double mono_ns;      // the map there, ns since the anchor
    double ns_per_tick;  // its slope
  };
  explicit ClockConversion(ClockPair anchor);
  double monoNsAt(std::uint64_t tick) const;

  bool tsc_;
  std::uint64_t anchor_ticks_;
  std::int64_t anchor_mono_ns_;
  std::int64_t mono_to_epoch_ns_;
  double ticks_per_ns_ = 1.0;
  std::int64_t last_refine_mono_ns_;
  std::vector<Segment> segments_;  // ascending ticks; the first starts at the anchor
};

}  // namespace gradscope::agent
