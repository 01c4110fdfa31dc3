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

// Kernels written with intrinsics (dispatch.h picks them) are compiled where the x86 intrinsics are.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GS_HAVE_X86_INTRINSICS 1
#endif
