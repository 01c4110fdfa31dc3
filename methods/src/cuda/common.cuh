#pragma once

// Shared by the CUDA translation units of gradscope_methods (never installed): error checking, launch
// geometry, stream-ordered scratch memory, the kernel-parameter table of K input pointers, the element
// types of the method catalogue, and fp64 reductions in the CPU kernels' summation order.
//
// Bit-exactness rules every kernel here follows (the CPU kernels define the results):
// - Conversions go through numeric.h (the same GS_HOST_DEVICE code the CPU runs).
// - Products that feed a sum are written with __fmul_rn / __dmul_rn and sums with __fadd_rn /
//   __dadd_rn where a fused multiply-add could otherwise form: nvcc contracts a*b+c into an FMA by
//   default (--fmad=true), which rounds once instead of twice and would differ from the CPU.
// - No fast-math, no flush-to-zero: fp32 subnormals are kept, as on the CPU. Where the CPU divides,
//   IEEE division (__fdiv_rn / __ddiv_rn), never an approximate reciprocal.
// - fp64 reductions add in exactly the CPU's order (see "fp64 reductions" below), so sums, norms and
//   dot products are the CPU's bits too, not just close to them.
// - NaN results carry the GPU's canonical NaN (0x7FFFFFFF) where the CPU's x86 arithmetic propagates
//   an input's payload; only arithmetic that produces a NaN differs, and tests compare NaN as NaN.

// fmt 9 switches its constexpr support off under nvcc (FMT_USE_CONSTEXPR) and then does not compile in
// C++20 mode: the consteval format-string check calls a helper that is no longer constexpr. nvcc 12+
// compiles fmt's constexpr code fine, so turn it back on; every .cu file includes this header first.
#ifndef FMT_USE_CONSTEXPR
#define FMT_USE_CONSTEXPR 1
#endif

#include <cstddef>
#include <cstdint>
#include <span>

#include <cuda_runtime.h>

#include "gradscope/common/error.h"
#include "gradscope/methods/cuda.h"
#include "gradscope/methods/numeric.h"

namespace gradscope::methods::cuda::detail {

// Throws gradscope::Error("<call>: <cudaGetErrorString>") unless status is cudaSuccess.
void check(cudaError_t status, const char* call);
// Throws gradscope::Error with available()'s reason when there is no usable GPU.
void requireDevice();
// After a <<<...>>> launch: turns a launch error into gradscope::Error naming the kernel.
void checkLaunch(const char* kernel);

inline cudaStream_t toCuda(Stream stream) {
  return static_cast<cudaStream_t>(stream);
}

inline constexpr unsigned kBlockThreads = 256;

// Blocks for a grid-stride loop over `items` work items of kBlockThreads threads each: enough to fill
// every SM of the current device (its resident-thread limit), never more than the work needs.
unsigned gridFor(std::size_t items);

// Device memory allocated and freed in stream order (cudaMallocAsync / cudaFreeAsync), for per-call
// temporaries: the free is enqueued behind the kernels that use the memory, so no host sync is needed.
class Scratch {
 public:
  Scratch(std::size_t bytes, cudaStream_t stream);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

// ---- K input pointers as a kernel parameter ------------------------------------------------------------
//
// Up to kInlinePointers pointers travel inside the kernel's parameter block (read through the constant
// cache, uniform across a warp); more are uploaded into stream-ordered scratch memory. Kernels take
// the table as `const __grid_constant__ PointerTable`, so indexing it with a run-time k reads the
// parameter space directly instead of copying the table to local memory.

inline constexpr int kInlinePointers = 64;

struct PointerTable {
  const void* inline_pointers[kInlinePointers];
  const void* const* device_pointers;  // non-null when count > kInlinePointers
  int count;

  __device__ __forceinline__ const void* operator[](int k) const {
    return device_pointers != nullptr ? device_pointers[k] : inline_pointers[k];
  }
};

// Builds the table for `pointers`; when they do not fit inline it uploads them and frees the copy in
// stream order when it goes out of scope (after the launches that use it have been enqueued).
class PointerTableBuilder {
 public:
  PointerTableBuilder(std::span<const void* const> pointers, cudaStream_t stream);
  ~PointerTableBuilder();
  PointerTableBuilder(const PointerTableBuilder&) = delete;
  PointerTableBuilder& operator=(const PointerTableBuilder&) = delete;
  const PointerTable& table() const { return table_; }

 private:
  PointerTable table_{};
  void* device_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// N elements moved by one load or store (16 bytes by default: the widest vector access).
template <typename T, int N = 16 / static_cast<int>(sizeof(T))>
struct alignas(sizeof(T) * static_cast<std::size_t>(N)) Pack {
  static constexpr int kCount = N;
  T v[static_cast<std::size_t>(N)];
};

// The N elements at `index` of the buffer at `base`, in one load.
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> loadPack(const void* base, std::size_t index) {
  return *reinterpret_cast<const Pack<T, N>*>(static_cast<const T*>(base) + index);
}

// Calls visit(k, pack_k) for k = 0..K-1 in order, with the N elements at `index` of each input. Loads
// are issued four inputs at a time (and the last 1-3 together) before their packs are visited, so a
// thread has several independent 16-byte requests in flight instead of one per addition.
template <typename T, int N, typename Visit>
__device__ __forceinline__ void streamInputs(const PointerTable& inputs, std::size_t index, Visit&& visit) {
  const int total = inputs.count;
  int k = 0;
  for (; k + 4 <= total; k += 4) {
    Pack<T, N> x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = loadPack<T, N>(inputs[k + u], index);
#pragma unroll
    for (int u = 0; u < 4; ++u) visit(k + u, x[u]);
  }
  const int rest = total - k;
  if (rest > 0) {
    Pack<T, N> x[3] = {};
#pragma unroll
    for (int u = 0; u < 3; ++u) {
      if (u < rest) x[u] = loadPack<T, N>(inputs[k + u], index);
    }
#pragma unroll
    for (int u = 0; u < 3; ++u) {
      if (u < rest) visit(k + u, x[u]);
    }
  }
}

// True when `pointer` is aligned to `alignment` bytes (a power of two).
inline bool aligned(const void* pointer, std::size_t alignment) {
  return (reinterpret_cast<std::uintptr_t>(pointer) & (alignment - 1)) == 0;
}

// ---- Element types ---------------------------------------------------------------------------------------
//
// Storage is the type in memory, Acc the accumulator of local_sum.h (fp32 for fp16/bf16 inputs).

struct Fp32Type {
  using Storage = float;
  using Acc = float;
  static __device__ __forceinline__ Acc toAcc(Storage x) { return x; }
  static __device__ __forceinline__ Storage fromAcc(Acc x) { return x; }
  static __device__ __forceinline__ double toDouble(Storage x) { return static_cast<double>(x); }
};

struct Fp64Type {
  using Storage = double;
  using Acc = double;
  static __device__ __forceinline__ Acc toAcc(Storage x) { return x; }
  static __device__ __forceinline__ Storage fromAcc(Acc x) { return x; }
  static __device__ __forceinline__ double toDouble(Storage x) { return x; }
};

struct Fp16Type {
  using Storage = std::uint16_t;
  using Acc = float;
  static __device__ __forceinline__ Acc toAcc(Storage x) { return fp16ToFp32(x); }
  static __device__ __forceinline__ Storage fromAcc(Acc x) { return fp32ToFp16(x); }
  static __device__ __forceinline__ double toDouble(Storage x) { return static_cast<double>(fp16ToFp32(x)); }
};

struct Bf16Type {
  using Storage = std::uint16_t;
  using Acc = float;
  static __device__ __forceinline__ Acc toAcc(Storage x) { return bf16ToFp32(x); }
  static __device__ __forceinline__ Storage fromAcc(Acc x) { return fp32ToBf16(x); }
  static __device__ __forceinline__ double toDouble(Storage x) { return static_cast<double>(bf16ToFp32(x)); }
};

// ---- fp64 reductions in the CPU kernels' order
// ---------------------------------------------------------------
//
// adaptive.cc and error_metrics.cc fix their summation order independently of threads and ISA: the
// elements are cut into blocks of a fixed size; within a block, element i is added to lane i % 16
// (each lane in ascending element order, starting from 0.0); a block's value is lane 0 + lane 1 + ...
// + lane 15 (starting from 0.0); the total is block 0 + block 1 + ... (starting from 0.0). Products
// are rounded before they are added (the CPU kernels are built with fp-contract=off).
//
// The GPU reproduces that order exactly, so its sums are the CPU's bits: one thread per (block, lane)
// accumulates its lane (blocks of 16 threads = 16 lanes; 16 blocks per 256-thread CUDA block), the 16
// lanes are added in lane order through shuffles, one partial per block is written quantity-major, and
// a final kernel adds each quantity's partials in block order, one thread per quantity. The price is a
// sequential final sum of count / block_size terms per quantity (16 K terms for 64 Mi elements at
// 4096 per block, tens of microseconds), paid for identical results on both sides.

inline constexpr int kCpuLanes = 16;
inline constexpr unsigned kCpuBlocksPerCudaBlock = kBlockThreads / kCpuLanes;

// The reduction block (of the CPU order) this thread works on, and its lane.
__device__ __forceinline__ std::size_t cpuBlockIndex() {
  return static_cast<std::size_t>(blockIdx.x) * kCpuBlocksPerCudaBlock + threadIdx.x / kCpuLanes;
}
__device__ __forceinline__ unsigned cpuLane() {
  return threadIdx.x % kCpuLanes;
}

// CUDA blocks for `cpu_blocks` reduction blocks.
inline unsigned cpuOrderGrid(std::size_t cpu_blocks) {
  const std::size_t grid = (cpu_blocks + kCpuBlocksPerCudaBlock - 1) / kCpuBlocksPerCudaBlock;
  return static_cast<unsigned>(grid == 0 ? 1 : grid);
}

// (((0 + lane 0) + lane 1) + ... + lane 15) over the 16 threads of this thread's group, valid in
// every thread of the group. The whole warp must call it (both of its groups).
__device__ __forceinline__ double laneOrderSum(double value) {
  const int base = static_cast<int>(threadIdx.x & 16u);
  double sum = 0.0;
#pragma unroll
  for (int lane = 0; lane < kCpuLanes; ++lane)
    sum = __dadd_rn(sum, __shfl_sync(0xFFFFFFFFu, value, base + lane));
  return sum;
}

// Largest value of the group (bits of non-negative doubles, or counts: any order gives the same).
__device__ __forceinline__ unsigned long long laneMax(unsigned long long value) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xFFFFFFFFu, value, offset);
    value = other > value ? other : value;
  }
  return value;
}
__device__ __forceinline__ unsigned long long laneTotal(unsigned long long value) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
  return value;
}

// totals[q] = ((0 + partials[q·blocks]) + partials[q·blocks + 1]) + ...: block order, one thread per
// quantity. Loads run ahead of the dependent additions (unrolled), which is what bounds the time.
template <int kUnroll = 8>
__global__ void blockOrderSumKernel(const double* partials, std::size_t blocks, int quantities,
                                    double* totals) {
  const int q = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (q >= quantities) return;
  const double* p = partials + static_cast<std::size_t>(q) * blocks;
  double total = 0.0;
  std::size_t b = 0;
  for (; b + kUnroll <= blocks; b += kUnroll) {
    double x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = p[b + static_cast<std::size_t>(u)];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) total = __dadd_rn(total, x[u]);
  }
  for (; b < blocks; ++b) total = __dadd_rn(total, p[b]);
  totals[q] = total;
}

// Sum over the whole block of a 64-bit count (exact in any order); valid in thread 0.
__device__ __forceinline__ unsigned long long blockCount(unsigned long long value) {
  __shared__ unsigned long long shared[kBlockThreads / 32];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kBlockThreads / 32 ? shared[lane] : 0ull;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
  }
  __syncthreads();
  return value;
}

}  // namespace gradscope::methods::cuda::detail
