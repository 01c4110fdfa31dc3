#include "dispatch.h"

#include <atomic>

namespace gradscope::methods::detail {
namespace {

// activeIsa() before its first call: unset, so that the CPUID check runs on first use rather than at
// static initialisation (a kernel may run from another library's static constructor).
constexpr std::uint8_t kUnset = 0xFF;
std::atomic<std::uint8_t> active_isa{kUnset};

}  // namespace

std::string_view name(Isa isa) {
  constexpr std::string_view kNames[] = {"portable", "avx2", "avx512"};  // in the order of kIsas
  return kNames[static_cast<std::size_t>(isa)];
}

Isa cpuIsa() {
#if defined(__x86_64__) && defined(__GNUC__)
  // The same test the loader's resolver makes for the GS_CPU_KERNEL clones (it also checks that the
  // OS saves the vector registers).
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return Isa::Avx512;
    if (__builtin_cpu_supports("x86-64-v3")) return Isa::Avx2;
    return Isa::Portable;
  }();
  return isa;
#else
  return Isa::Portable;
#endif
}

Isa activeIsa() {
  std::uint8_t isa = active_isa.load(std::memory_order_relaxed);
  if (isa == kUnset) [[unlikely]] {
    // A test's choice made meanwhile wins over the CPU's.
    std::uint8_t expected = kUnset;
    const auto best = static_cast<std::uint8_t>(cpuIsa());
    isa = active_isa.compare_exchange_strong(expected, best, std::memory_order_relaxed) ? best : expected;
  }
  return static_cast<Isa>(isa);
}

}  // namespace gradscope::methods::detail

namespace gradscope::methods::testing {

bool useIsaForTesting(std::string_view name) {
  using detail::Isa;
  Isa chosen = detail::cpuIsa();
  if (!name.empty()) {
    bool known = false;
    for (Isa isa : detail::kIsas) {
      if (detail::name(isa) == name) {
        chosen = isa;
        known = true;
      }
    }
    if (!known || chosen > detail::cpuIsa()) return false;
  }
  detail::active_isa.store(static_cast<std::uint8_t>(chosen), std::memory_order_relaxed);
  return true;
}

}  // namespace gradscope::methods::testing
