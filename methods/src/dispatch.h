#pragma once

// Internal: the one place that decides which instruction set the CPU kernels run.
//
// Kernels come two ways. Loops the compiler vectorises are GS_CPU_KERNEL functions (cpu_kernels.h):
// GCC compiles a clone per level below and the loader picks one. Kernels written with intrinsics (the
// fp16 conversion instructions, the AVX-512 fp8 encoder) come in one set per level, in a table indexed
// by Isa, and kernelsFor() reads the entry of activeIsa(). The levels are the x86-64 micro-architecture
// levels the clones are built for, so a CPU that runs a level's clones runs that level's intrinsics
// too, and one CPUID check (cpuIsa) answers for both. Every level computes the same bits: each
// intrinsics kernel has a portable twin, and the tests force each level in turn and compare.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gradscope::methods::detail {

// Portable: baseline x86-64 (SSE2), or any other architecture. Avx2: x86-64-v3 (AVX2, FMA, F16C).
// Avx512: x86-64-v4 (AVX-512 F, BW, CD, DQ, VL).
enum class Isa : std::uint8_t { Portable, Avx2, Avx512 };

inline constexpr Isa kIsas[] = {Isa::Portable, Isa::Avx2, Isa::Avx512};

// "portable", "avx2", "avx512".
std::string_view name(Isa isa);

// The highest level this CPU and its OS run (CPUID, asked once).
Isa cpuIsa();

// The level kernel tables are read at: cpuIsa(), unless a test chose a lower one
// (testing::useIsaForTesting). One relaxed atomic load.
Isa activeIsa();

// One kernel set per level, in the order of kIsas. A level with no kernels of its own repeats the
// set of the level below it.
template <class Set>
using IsaTable = std::array<Set, std::size(kIsas)>;

template <class Set>
const Set& kernelsFor(const IsaTable<Set>& table) {
  return table[static_cast<std::size_t>(activeIsa())];
}

}  // namespace gradscope::methods::detail

namespace gradscope::methods::testing {

// Makes every kernel table read the level named ("portable", "avx2", "avx512"; "" = back to
// cpuIsa()). Returns false, and changes nothing, for an unknown name or a level this CPU cannot run.
// Process-wide and not for production use: a seam for the unit tests, which compare every level's
// kernels bit for bit on one machine. (The GS_CPU_KERNEL clones stay the loader's choice.)
bool useIsaForTesting(std::string_view name);

}  // namespace gradscope::methods::testing
