// local_sum.h on the GPU: K device buffers summed element by element, in the exact order of each
// method, so that every element comes out bit-identical to the CPU kernel (local_sum.cc).
//
// Every element is independent, so each thread owns a 16-byte pack of elements (4 fp32, 8 fp16/bf16,
// 2 fp64) and runs the method's per-element recurrence over the K inputs for each element of its pack,
// with the same accumulator type and the same additions, in the same order, as the CPU:
// - K = 1: a copy of the input, bit for bit, for every method (as the CPU's memcpy).
// - AddN: acc = x0; acc = acc + x_k for k = 1..K-1; rounded once to the storage type.
// - AccumulateN: the same chain rounded to the storage type after every addition: identical to what
//   K-1 passes over an fp16/bf16 output do, in one pass (no intermediate writes to memory), computed in
//   fp16/bf16 arithmetic (addFp16, addBf16: the same function, without conversions). For fp32 and
//   fp64 the rounding is the identity, so it runs the AddN kernel.
// - Kahan: compensated summation in the accumulator type (see KahanMethod); the final compensation is
//   not applied (classic Kahan returns the running sum), as on the CPU.
// - Tree: the binary-counter pairwise order (see TreeMethod).
// Loads of four inputs are issued before their additions so each thread keeps several 16-byte
// requests in flight (detail::streamInputs); the additions still happen strictly in input order.
//
// The output may alias inputs[0]: a thread reads all inputs of its pack before writing it.

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common.cuh"

namespace gradscope::methods::cuda {
namespace {

using detail::kBlockThreads;
using detail::Pack;
using detail::PointerTable;

// ---- Methods: per-element state machines ---------------------------------------------------------------

struct AddNMethod {
  template <typename E>
  struct State {
    typename E::Acc sum;
    __device__ __forceinline__ void first(typename E::Acc x) { sum = x; }
    __device__ __forceinline__ void add(int, typename E::Acc x) { sum = sum + x; }
    __device__ __forceinline__ typename E::Acc result(int) const { return sum; }
  };
};

struct AccumulateNMethod {
  template <typename E>
  struct State {
    typename E::Acc sum;  // always a value of the storage type
    __device__ __forceinline__ void first(typename E::Acc x) { sum = x; }
    __device__ __forceinline__ void add(int, typename E::Acc x) { sum = E::toAcc(E::fromAcc(sum + x)); }
    __device__ __forceinline__ typename E::Acc result(int) const { return sum; }
  };
};

// Kahan's compensated summation started from sum = x0, c = 0. The first step's y = x1 - 0 is x1 exactly
// (also for -0), so it is local_sum.cc's kahanFirstKernel (t = x0 + x1, c = (t - x0) - x1), and the
// last step's sum + (x - c) is its kahanStepStoreKernel.
struct KahanMethod {
  template <typename E>
  struct State {
    using Acc = typename E::Acc;
    Acc sum;
    Acc compensation;
    __device__ __forceinline__ void first(Acc x) {
      sum = x;
      compensation = Acc(0);
    }
    __device__ __forceinline__ void add(int, Acc x) {
      const Acc y = x - compensation;
      const Acc t = sum + y;
      compensation = (t - sum) - y;
      sum = t;
    }
    __device__ __forceinline__ Acc result(int) const { return sum; }
  };
};

// Pairwise summation in binary-counter order. slot[j] holds the partial sum of the most recent complete
// run of 2^j inputs; adding input i is incrementing a binary counter: the carry (the new input) merges
// with slot[j] for every set low bit j of i (older partial on the left) and settles in the first clear
// bit. After K inputs the occupied slots are the set bits of K; they are combined from the smallest
// (most recent) to the largest. This is local_sum.cc's pair program with every level shifted by one:
// its "pair" is our carry out of slot 0, its odd last input our slot 0, and both merge the new partial
// into the older ones from the lowest level up and combine the leftovers from the smallest; floating-
// point addition is commutative, so only the grouping matters and it is the same.
// kLevels bits cover K <= 2^kLevels - 1; all slot indices are compile-time constants after unrolling,
// so the slots live in registers.
template <int kLevels>
struct TreeMethod {
  template <typename E>
  struct State {
    using Acc = typename E::Acc;
    Acc slot[static_cast<std::size_t>(kLevels)];
    __device__ __forceinline__ void first(Acc x) { slot[0] = x; }
    __device__ __forceinline__ void add(int i, Acc x) {
      Acc carry = x;
      bool placed = false;
#pragma unroll
      for (int j = 0; j < kLevels; ++j) {
        if (!placed) {
          if ((i >> j) & 1) {
            carry = slot[j] + carry;
          } else {
            slot[j] = carry;
            placed = true;
          }
        }
      }
    }
    __device__ __forceinline__ Acc result(int k) const {
      Acc total = Acc(0);
      bool have = false;
#pragma unroll
      for (int j = 0; j < kLevels; ++j) {
        if ((k >> j) & 1) {
          total = have ? slot[j] + total : slot[j];
          have = true;
        }
      }
      return total;
    }
  };
};

// ---- Kernels ---------------------------------------------------------------------------------------------

// fp16 + fp16 rounded to fp16 in one instruction. AccumulateN's fp32 addition then rounding to fp16 is
// the same function: fp32 holds 24 >= 2 * 11 + 2 significant bits, so rounding the fp32 sum of two fp16
// values to fp16 is rounding their exact sum (double rounding is innocuous at that width), overflow
// included; a NaN result is the canonical NaN either way on the GPU.
__device__ __forceinline__ std::uint16_t addFp16(std::uint16_t a, std::uint16_t b) {
  std::uint16_t sum;
  asm("add.rn.f16 %0, %1, %2;" : "=h"(sum) : "h"(a), "h"(b));
  return sum;
}

// The same for bf16 (24 >= 2 * 8 + 2): a fused multiply-add by 1.0 (0x3F80) is an exact product plus
// one rounding, and runs on sm_80 (add.bf16 needs sm_90).
__device__ __forceinline__ std::uint16_t addBf16(std::uint16_t a, std::uint16_t b) {
  std::uint16_t sum;
  asm("fma.rn.bf16 %0, %1, %2, %3;" : "=h"(sum) : "h"(a), "h"(static_cast<std::uint16_t>(0x3F80u)), "h"(b));
  return sum;
}

// Sums the N elements starting at `index`.
template <typename E, typename Method, int N>
__device__ __forceinline__ void sumPack(const PointerTable& inputs, std::size_t index,
                                        typename E::Storage* out) {
  using Storage = typename E::Storage;
  constexpr bool kFp16 = std::is_same_v<E, detail::Fp16Type>;
  if constexpr ((kFp16 || std::is_same_v<E, detail::Bf16Type>)&&std::is_same_v<Method, AccumulateNMethod>) {
    // Two conversions per addition made this kernel conversion-bound (fp16 0.63-0.70, bf16 0.85-0.90 of
    // copy bandwidth on an H100); in 16-bit arithmetic it needs none.
    Pack<Storage, N> sum{};
    detail::streamInputs<Storage, N>(inputs, index, [&](int k, const Pack<Storage, N>& x) {
#pragma unroll
      for (int j = 0; j < N; ++j)
        sum.v[j] = k == 0 ? x.v[j] : (kFp16 ? addFp16(sum.v[j], x.v[j]) : addBf16(sum.v[j], x.v[j]));
    });
    *reinterpret_cast<Pack<Storage, N>*>(out + index) = sum;
    return;
  }
  typename Method::template State<E> state[N];
  detail::streamInputs<Storage, N>(inputs, index, [&](int k, const Pack<Storage, N>& x) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (k == 0) {
        state[j].first(E::toAcc(x.v[j]));
      } else {
        state[j].add(k, E::toAcc(x.v[j]));
      }
    }
  });
  Pack<Storage, N> result;
#pragma unroll
  for (int j = 0; j < N; ++j) result.v[j] = E::fromAcc(state[j].result(inputs.count));
  *reinterpret_cast<Pack<Storage, N>*>(out + index) = result;
}

// kVector: every input and the output are 16-byte aligned; packs of 16 bytes, then a scalar tail.
template <typename E, typename Method, bool kVector>
__global__ void __launch_bounds__(kBlockThreads)
    localSumKernel(const __grid_constant__ PointerTable inputs, typename E::Storage* out, std::size_t count) {
  constexpr int kPack = kVector ? 16 / static_cast<int>(sizeof(typename E::Storage)) : 1;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t packs = count / kPack;
  for (std::size_t p = first; p < packs; p += stride) sumPack<E, Method, kPack>(inputs, p * kPack, out);
  if constexpr (kVector) {
    for (std::size_t i = packs * kPack + first; i < count; i += stride) sumPack<E, Method, 1>(inputs, i, out);
  }
}

// The fp64 reference: x0 converted to fp64, then + x_k converted, k = 1..K-1.
template <typename E, int N>
__device__ __forceinline__ void referencePack(const PointerTable& inputs, std::size_t index, double* out) {
  using Storage = typename E::Storage;
  double sum[N];
  detail::streamInputs<Storage, N>(inputs, index, [&](int k, const Pack<Storage, N>& x) {
#pragma unroll
    for (int j = 0; j < N; ++j)
      sum[j] = k == 0 ? E::toDouble(x.v[j]) : __dadd_rn(sum[j], E::toDouble(x.v[j]));
  });
  if constexpr (N == 1) {
    out[index] = sum[0];
  } else {
#pragma unroll
    for (int j = 0; j < N; j += 2)
      reinterpret_cast<double2*>(out + index)[j / 2] = make_double2(sum[j], sum[j + 1]);
  }
}

template <typename E, bool kVector>
__global__ void __launch_bounds__(kBlockThreads)
    referenceSumKernel(const __grid_constant__ PointerTable inputs, double* out, std::size_t count) {
  constexpr int kPack = kVector ? 16 / static_cast<int>(sizeof(typename E::Storage)) : 1;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t packs = count / kPack;
  for (std::size_t p = first; p < packs; p += stride) referencePack<E, kPack>(inputs, p * kPack, out);
  if constexpr (kVector) {
    for (std::size_t i = packs * kPack + first; i < count; i += stride) referencePack<E, 1>(inputs, i, out);
  }
}

// ---- Launch
// ------------------------------------------------------------------------------------------------

bool allAligned(std::span<const void* const> inputs, const void* output) {
  if (!detail::aligned(output, 16)) return false;
  for (const void* input : inputs) {
    if (!detail::aligned(input, 16)) return false;
  }
  return true;
}

// The same refusals as local_sum.cc's checkArguments.
void validate(const char* what, DType dtype, std::span<const void* const> inputs, const void* output,
              std::size_t count) {
  if (!localSumSupports(dtype)) {
    fail("{}: element type {} is not supported (fp32, fp16, bf16 and fp64 are)", what, name(dtype));
  }
  if (inputs.empty()) fail("{}: no inputs (K = 0)", what);
  if (inputs.size() > static_cast<std::size_t>(INT_MAX))
    fail("{}: {} inputs are too many", what, inputs.size());
  if (count == 0) return;
  if (output == nullptr) fail("{}: null output buffer", what);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == nullptr) fail("{}: input {} is a null buffer", what, i);
    if (i > 0 && inputs[i] == output)
      fail("{}: the output aliases input {} (only input 0 may be the output)", what, i);
  }
}

template <typename E, typename Method, bool kScalarOnly = false>
void launchSum(const PointerTable& table, bool vector, void* output, std::size_t count, cudaStream_t stream) {
  constexpr std::size_t kPack = 16 / sizeof(typename E::Storage);
  auto* out = static_cast<typename E::Storage*>(output);
  if constexpr (kScalarOnly) {
    localSumKernel<E, Method, false><<<detail::gridFor(count), kBlockThreads, 0, stream>>>(table, out, count);
  } else if (vector) {
    const unsigned grid = detail::gridFor(count / kPack + count % kPack);
    localSumKernel<E, Method, true><<<grid, kBlockThreads, 0, stream>>>(table, out, count);
  } else {
    localSumKernel<E, Method, false><<<detail::gridFor(count), kBlockThreads, 0, stream>>>(table, out, count);
  }
  detail::checkLaunch("localSumKernel");
}

template <typename E>
void dispatchMethod(LocalSumMethod method, const PointerTable& table, bool vector, void* output,
                    std::size_t count, cudaStream_t stream) {
  const int k = table.count;
  switch (method) {
    case LocalSumMethod::AddN: launchSum<E, AddNMethod>(table, vector, output, count, stream); return;
    case LocalSumMethod::AccumulateN:
      // Rounding an fp32 / fp64 accumulator to its own type changes nothing: AddN is the same chain.
      if constexpr (std::is_same_v<typename E::Acc, typename E::Storage>) {
        launchSum<E, AddNMethod>(table, vector, output, count, stream);
      } else {
        launchSum<E, AccumulateNMethod>(table, vector, output, count, stream);
      }
      return;
    case LocalSumMethod::Kahan: launchSum<E, KahanMethod>(table, vector, output, count, stream); return;
    case LocalSumMethod::Tree:
      // As few slots as K needs: each is a register per element of the pack.
      if (k < (1 << 3)) {
        launchSum<E, TreeMethod<3>>(table, vector, output, count, stream);
      } else if (k < (1 << 4)) {
        launchSum<E, TreeMethod<4>>(table, vector, output, count, stream);
      } else if (k < (1 << 8)) {
        launchSum<E, TreeMethod<8>>(table, vector, output, count, stream);
      } else {
        // Very many inputs: 31 slots per element, one element per thread to bound the registers.
        launchSum<E, TreeMethod<31>, true>(table, false, output, count, stream);
      }
      return;
  }
  throw Error("cuda::localSum: unknown method " + std::to_string(static_cast<int>(method)));
}

template <typename E>
void launchReference(const PointerTable& table, bool vector, double* output, std::size_t count,
                     cudaStream_t stream) {
  constexpr std::size_t kPack = 16 / sizeof(typename E::Storage);
  if (vector) {
    const unsigned grid = detail::gridFor(count / kPack + count % kPack);
    referenceSumKernel<E, true><<<grid, kBlockThreads, 0, stream>>>(table, output, count);
  } else {
    referenceSumKernel<E, false><<<detail::gridFor(count), kBlockThreads, 0, stream>>>(table, output, count);
  }
  detail::checkLaunch("referenceSumKernel");
}

}  // namespace

void localSum(LocalSumMethod method, DType dtype, std::span<const void* const> inputs, void* output,
              std::size_t count, Stream stream) {
  detail::requireDevice();
  validate("CUDA local sum", dtype, inputs, output, count);
  if (count == 0) return;
  const cudaStream_t s = detail::toCuda(stream);
  if (inputs.size() == 1) {
    // As on the CPU: the sum of one term is that term bit for bit (no trip through the accumulator,
    // which would quiet a signalling NaN).
    if (output != inputs[0]) {
      detail::check(cudaMemcpyAsync(output, inputs[0], count * sizeOf(dtype), cudaMemcpyDeviceToDevice, s),
                    "cudaMemcpyAsync (local sum of one input)");
    }
    return;
  }
  const detail::PointerTableBuilder pointers(inputs, s);
  const bool vector = allAligned(inputs, output);
  switch (dtype) {
    case DType::Fp32:
      dispatchMethod<detail::Fp32Type>(method, pointers.table(), vector, output, count, s);
      return;
    case DType::Fp64:
      dispatchMethod<detail::Fp64Type>(method, pointers.table(), vector, output, count, s);
      return;
    case DType::Fp16:
      dispatchMethod<detail::Fp16Type>(method, pointers.table(), vector, output, count, s);
      return;
    case DType::Bf16:
      dispatchMethod<detail::Bf16Type>(method, pointers.table(), vector, output, count, s);
      return;
    default: return;  // rejected by validate()
  }
}

void referenceSum(DType dtype, std::span<const void* const> inputs, double* output, std::size_t count,
                  Stream stream) {
  detail::requireDevice();
  validate("CUDA reference sum", dtype, inputs, output, count);
  if (count == 0) return;
  const cudaStream_t s = detail::toCuda(stream);
  const detail::PointerTableBuilder pointers(inputs, s);
  const bool vector = allAligned(inputs, output);
  switch (dtype) {
    case DType::Fp32: launchReference<detail::Fp32Type>(pointers.table(), vector, output, count, s); return;
    case DType::Fp64: launchReference<detail::Fp64Type>(pointers.table(), vector, output, count, s); return;
    case DType::Fp16: launchReference<detail::Fp16Type>(pointers.table(), vector, output, count, s); return;
    case DType::Bf16: launchReference<detail::Bf16Type>(pointers.table(), vector, output, count, s); return;
    default: return;
  }
}

}  // namespace gradscope::methods::cuda
