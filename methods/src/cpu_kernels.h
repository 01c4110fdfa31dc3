#pragma once

// Runtime ISA dispatch for CPU kernels: a kernel function marked GS_CPU_KERNEL is compiled three times
// (AVX-512, AVX2+FMA+F16C, baseline x86-64) and the dynamic loader picks the best one for the CPU at
// start-up (GCC function multi-versioning), so one binary runs everywhere and vectorises wide where it
// can. Write kernels as plain loops over restrict pointers with branch-free bodies (numeric.h).

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define GS_CPU_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GS_CPU_KERNEL
#endif

#define GS_RESTRICT __restrict__

#include <cstddef>
#include <cstdint>

namespace gradscope::methods::detail {

// How far ahead of a streaming loop's reads and writes to prefetch by default. This VM's hardware
// prefetchers alone leave a streaming kernel with little computation at 60-85% of memcpy's bandwidth;
// software prefetches 4 KiB ahead bring it to memcpy's (bf16 encode 34 -> 53 GB/s, fp8 decode 42 -> 48
// GB/s). Kernels that stream many inputs at once (local sums, adaptive passes) pass a shorter distance
// per stream so that all of them stay in flight together.
inline constexpr std::size_t kPrefetchDistance = 4096;

// Prefetches the cache line `distance` bytes past `p` for reading. Integer arithmetic, so a line past
// the end of the buffer is no out-of-range pointer; a prefetch never faults.
[[gnu::always_inline]] inline void prefetchAhead(const void* p, std::size_t distance = kPrefetchDistance) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) + distance));
}

// The same for a line about to be written (prefetchw): the line arrives owned, so the store does not
// wait for the read-for-ownership. Worth it for outputs wider than the inputs (decoders).
[[gnu::always_inline]] inline void prefetchForWrite(const void* p, std::size_t distance = kPrefetchDistance) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) + distance), 1);
}

}  // namespace gradscope::methods::detail

// Plain multiply and add, never fused: the same bits from every ISA clone. (GCC contracts a*b + c
// into an FMA by default in C++, and only the AVX2/AVX-512 clones have FMA. Clang builds no clones;
// the pragma keeps it from contracting too.)
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define GS_NO_CONTRACTION
#else
#define GS_NO_CONTRACTION __attribute__((optimize("fp-contract=off")))
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define GS_HAVE_X86_HALF_INSTRUCTIONS 1

namespace gradscope::methods::detail {

// AVX (which also checks that the OS saves the vector registers) and F16C (CPUID leaf 1, ECX bit 29;
// asked directly because not every compiler's __builtin_cpu_supports knows "f16c").
inline bool cpuHasAvxAndF16c() {
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
         (ecx & (1u << 29)) != 0;
}

inline bool cpuHasAvx512f() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

}  // namespace gradscope::methods::detail
#endif
