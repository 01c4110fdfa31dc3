// Local multi-tensor sums on the CPU.
//
// Every method is defined by its per-element order (local_sum.h), and every path below computes exactly
// that order: results do not depend on the chunking, the number of threads or the instruction set.
//
// Direct kernels (the main path). The sums are memory-bound streams over K inputs. Each worker walks
// its chunk one 64-byte block of output at a time and reads that block of all K inputs, accumulating in
// registers, then stores the block once. Measured on the development machine (two cores), this beat
// the tile-array layout (per tile, one input after the other into L1-resident accumulator arrays) by a
// wide margin: Kahan fp32 K=8 ran at ~28 GB/s against ~21 GB/s, memcpy 26.5 GB/s. For K <= 16 the loop
// over inputs is unrolled at compile time (AddN, Kahan, and the Tree, whose order is then a fixed
// expression); larger K loop at run time (AddN, Kahan) or use the tile program (Tree). Every kernel also
// prefetches each input stream kPrefetchBytes ahead.
//
// Tile program (Tree with K > 16, and fp16 on CPUs without F16C). A small list of `destination = a + b`
// steps over inputs and tile-local accumulator slots (buildTreeProgram, buildAddNProgram), run tile by
// tile. Kahan has tile kernels too (sum and compensation arrays) for the fp16 software fallback.
//
// AccumulateN really makes K-1 passes over the whole output, each parallel and each rounding to the
// output type: moving those bytes is what it models.
//
// Kernels are GS_CPU_KERNEL templates (AVX-512, AVX2 and baseline clones). Their loops run over blocks
// of one 64-byte vector with a fixed inner trip count: GCC 12 at -O2 ("very cheap" cost model) only
// vectorises loops whose trip count it knows, and the fixed inner loop gives it one while the kernels
// still accept any length (a scalar loop handles the last partial block). A loop that both reads an
// input and writes the output does not vectorise (the output may alias an input), so results are
// finished in registers and stored by a separate loop.
//
// fp16 has its own kernel sets (HalfKernels): the same operations with the AVX-512F or F16C conversion
// instructions, one set per level of dispatch.h, and a software fallback that converts tiles with
// numeric.h's arithmetic and runs the fp32 tile kernels on them. On two cores the software conversion
// alone costs more than the memory traffic of a sum; the instructions cost almost nothing. bf16
// conversions are a shift and a rounding add, cheap enough to stay inline in the templates.
//
// NaN payloads are not part of the bit-for-bit contract: which operand's payload NaN + NaN keeps
// depends on the operand order a compiler picks for a commutative addition (and GPUs return a canonical
// NaN). NaN-ness is.

#include "gradscope/methods/local_sum.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <new>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu_kernels.h"
#include "dispatch.h"
#include "gradscope/common/error.h"
#include "gradscope/methods/numeric.h"

namespace gradscope::methods {
namespace {

// ---- fp16 conversions
// --------------------------------------------------------------------------------------
//
// The software conversions are numeric.h's fp16ToFp32 / fp32ToFp16 (the library is built with
// -fno-trapping-math, so their selects vectorise in every clone).
//
// The conversion instructions (VCVTPS2PH with an explicit round-to-nearest-even immediate, VCVTPH2PS)
// give the same bits for every input (checked exhaustively) but one case that cannot show in a
// sum: VCVTPH2PS quiets a signalling fp16 NaN where numeric.h keeps it signalling. Every converted value
// goes through at least one IEEE addition, which quiets it anyway.

constexpr std::size_t kHalfBlock = 32;

void halfToFloatSoftware(const std::uint16_t* GS_RESTRICT in, float* GS_RESTRICT out, std::size_t n) {
  const std::size_t full = n / kHalfBlock * kHalfBlock;
  for (std::size_t block = 0; block < full; block += kHalfBlock)
    for (std::size_t lane = 0; lane < kHalfBlock; ++lane) out[block + lane] = fp16ToFp32(in[block + lane]);
  for (std::size_t i = full; i < n; ++i) out[i] = fp16ToFp32(in[i]);
}

void floatToHalfSoftware(const float* GS_RESTRICT in, std::uint16_t* GS_RESTRICT out, std::size_t n) {
  const std::size_t full = n / kHalfBlock * kHalfBlock;
  for (std::size_t block = 0; block < full; block += kHalfBlock)
    for (std::size_t lane = 0; lane < kHalfBlock; ++lane) out[block + lane] = fp32ToFp16(in[block + lane]);
  for (std::size_t i = full; i < n; ++i) out[i] = fp32ToFp16(in[i]);
}

// ---- Element types
// ------------------------------------------------------------------------------------------

// Elem: the stored type; Acc: the accumulator (fp32 for 16-bit types, the type itself otherwise).
struct Fp32Type {
  using Elem = float;
  using Acc = float;
  static Acc load(Elem value) { return value; }
  static Elem store(Acc value) { return value; }
};
struct Fp64Type {
  using Elem = double;
  using Acc = double;
  static Acc load(Elem value) { return value; }
  static Elem store(Acc value) { return value; }
};
struct Bf16Type {
  using Elem = std::uint16_t;
  using Acc = float;
  static Acc load(Elem value) { return bf16ToFp32(value); }
  static Elem store(Acc value) { return fp32ToBf16(value); }
};
// fp16 element by element with the software conversions: the tails of the hand-written fp16 kernels.
struct HalfScalar {
  using Elem = std::uint16_t;
  using Acc = float;
  static Acc load(Elem value) { return fp16ToFp32(value); }
  static Elem store(Acc value) { return fp32ToFp16(value); }
};

// ---- Summation orders -------------------------------------------------------------------------------------
//
// Kahan's arithmetic and the tree's pairing, written once over a lane type A: float or double for one
// element (the tails, the tile kernels, and each lane of the portable kernels' 64-byte blocks), a whole
// block (Lanes below), or GCC's vector types (__m512, __m256 in the fp16 kernels, which take + and -
// lane by lane). The kernels differ only in how they load, store and walk their lanes. Values pass by
// reference: a vector passed by value to a template compiled without AVX would change the ABI.

// Kahan: the first two terms give the running sum and its rounding error; every later term is added
// compensated; the last one's compensation is not kept (classic Kahan returns the running sum).
template <class A>
[[gnu::always_inline]] inline void kahanFirst(const A& a, const A& b, A& sum, A& comp) {
  sum = a + b;
  comp = (sum - a) - b;
}

template <class A>
[[gnu::always_inline]] inline void kahanAdd(const A& x, A& sum, A& comp) {
  const A y = x - comp;
  const A t = sum + y;
  comp = (t - sum) - y;
  sum = t;
}

template <class A>
[[gnu::always_inline]] inline void kahanLast(const A& x, A& sum, const A& comp) {
  sum = sum + (x - comp);
}

template <class A>
[[gnu::always_inline]] inline void addInto(const A& a, const A& b, A& sum) {
  sum = a + b;
}

// AddN and Kahan over k inputs (k >= 2, k >= 3 for Kahan) known at run time; leaf(i, value) loads
// input i. The block kernels with K fixed at compile time unroll the same steps (AddNOrder, KahanOrder).
template <class A, class Leaf>
[[gnu::always_inline]] inline void addNSum(const Leaf& leaf, std::size_t k, A& sum) {
  A x;
  leaf(0, sum);
  leaf(1, x);
  addInto(sum, x, sum);
  for (std::size_t i = 2; i < k; ++i) {
    leaf(i, x);
    addInto(sum, x, sum);
  }
}

template <class A, class Leaf>
[[gnu::always_inline]] inline void kahanSum(const Leaf& leaf, std::size_t k, A& sum) {
  A a, b, comp;
  leaf(0, a);
  leaf(1, b);
  kahanFirst(a, b, sum, comp);
  for (std::size_t i = 2; i + 1 < k; ++i) {
    leaf(i, a);
    kahanAdd(a, sum, comp);
  }
  leaf(k - 1, a);
  kahanLast(a, sum, comp);
}

// The tree order of inputs First .. First + Remaining - 1 (local_sum.h) as an expression fixed at
// compile time; leaf(i, value) loads input i. A run of 2^m inputs is summed by halves ((x0 + x1) +
// (x2 + x3) for four), which is what the binary counter builds for it; the inputs split into runs of
// decreasing powers of two in input order (7: 4, 2, 1), and the runs are combined from the smallest
// up: run_4 + (run_2 + run_1), exactly the counter's leftovers.
template <std::size_t First, std::size_t Count, class A, class Leaf>
[[gnu::always_inline]] inline void treeRun(const Leaf& leaf, A& result) {
  if constexpr (Count == 1) {
    leaf(First, result);
  } else {
    A low, high;
    treeRun<First, Count / 2>(leaf, low);
    treeRun<First + Count / 2, Count / 2>(leaf, high);
    addInto(low, high, result);
  }
}

template <std::size_t First, std::size_t Remaining, class A, class Leaf>
[[gnu::always_inline]] inline void treeSum(const Leaf& leaf, A& result) {
  constexpr std::size_t run = std::bit_floor(Remaining);
  if constexpr (run == Remaining) {
    treeRun<First, run>(leaf, result);
  } else {
    A larger, rest;
    treeRun<First, run>(leaf, larger);
    treeSum<First + run, Remaining - run>(leaf, rest);
    addInto(larger, rest, result);
  }
}

// One element in each order: the tails of the block kernels.
template <class T>
struct ElementLeaf {
  const typename T::Elem* const* in;
  std::size_t e;
  [[gnu::always_inline]] void operator()(std::size_t i, typename T::Acc& value) const {
    value = T::load(in[i][e]);
  }
};

template <class T>
[[gnu::always_inline]] inline typename T::Acc addNElement(const typename T::Elem* const* in, std::size_t k,
                                                          std::size_t e) {
  typename T::Acc sum;
  addNSum(ElementLeaf<T>{in, e}, k, sum);
  return sum;
}

template <class T>
[[gnu::always_inline]] inline typename T::Acc kahanElement(const typename T::Elem* const* in, std::size_t k,
                                                           std::size_t e) {
  typename T::Acc sum;
  kahanSum(ElementLeaf<T>{in, e}, k, sum);
  return sum;
}

template <class T, std::size_t K>
[[gnu::always_inline]] inline typename T::Acc treeElement(const typename T::Elem* const* in, std::size_t e) {
  typename T::Acc sum;
  treeSum<0, K>(ElementLeaf<T>{in, e}, sum);
  return sum;
}

// ---- Direct kernels ---------------------------------------------------------------------------------------
//
// Inputs are in[i] + offset .. in[i] + offset + n, the output the same range of out; the output may be
// in[0] (each block of it is read before it is written).

// The largest K with unrolled AddN/Kahan/Tree kernels (and the largest Tree that runs direct at all).
constexpr std::size_t kMaxFixedK = 16;

// One 64-byte block of accumulators (registers, once inlined).
template <class T>
struct Lanes {
  static constexpr std::size_t kCount = 64 / sizeof(typename T::Elem);
  typename T::Acc value[kCount];
};

// sum = a + b lane by lane, written into its destination (a returned block would be one more copy).
template <class T>
[[gnu::always_inline]] inline void addInto(const Lanes<T>& a, const Lanes<T>& b, Lanes<T>& sum) {
  for (std::size_t j = 0; j < Lanes<T>::kCount; ++j) sum.value[j] = a.value[j] + b.value[j];
}

// Software prefetch this far ahead of every input stream. The hardware prefetchers alone keep fewer
// misses in flight than K interleaved streams need once a block costs more than a few instructions
// (16-bit conversions, Kahan): on two cores, fp16/bf16 AddN K=8 went from ~0.8 to ~0.9-1.0 of memcpy
// with it. (detail::prefetchAhead: a prefetch never faults, so running past a buffer's end is harmless.)
constexpr std::size_t kPrefetchBytes = 1024;

template <class Elem>
[[gnu::always_inline]] inline void prefetchInputs(const Elem* const* in, std::size_t k, std::size_t element) {
  for (std::size_t i = 0; i < k; ++i) detail::prefetchAhead(in[i] + element, kPrefetchBytes);
}

// AddN with K only known at run time (K > kMaxFixedK).
template <class T>
GS_CPU_KERNEL void addNDirectKernel(const typename T::Elem* const* in, std::size_t k, typename T::Elem* out,
                                    std::size_t offset, std::size_t n) {
  using Acc = typename T::Acc;
  constexpr std::size_t lanes = 64 / sizeof(typename T::Elem);
  const std::size_t full_end = offset + n / lanes * lanes;
  for (std::size_t block = offset; block < full_end; block += lanes) {
    prefetchInputs(in, k, block);
    Acc acc[lanes];
    const auto* x0 = in[0] + block;
    const auto* x1 = in[1] + block;
    for (std::size_t j = 0; j < lanes; ++j) acc[j] = T::load(x0[j]) + T::load(x1[j]);
    for (std::size_t i = 2; i < k; ++i) {
      const auto* x = in[i] + block;
      for (std::size_t j = 0; j < lanes; ++j) acc[j] = acc[j] + T::load(x[j]);
    }
    for (std::size_t j = 0; j < lanes; ++j) out[block + j] = T::store(acc[j]);
  }
  for (std::size_t e = full_end; e < offset + n; ++e) out[e] = T::store(addNElement<T>(in, k, e));
}

// Kahan with K only known at run time (K > kMaxFixedK).
template <class T>
GS_CPU_KERNEL void kahanDirectKernel(const typename T::Elem* const* in, std::size_t k, typename T::Elem* out,
                                     std::size_t offset, std::size_t n) {
  using Acc = typename T::Acc;
  constexpr std::size_t lanes = 64 / sizeof(typename T::Elem);
  const std::size_t full_end = offset + n / lanes * lanes;
  for (std::size_t block = offset; block < full_end; block += lanes) {
    prefetchInputs(in, k, block);
    Acc sum[lanes], comp[lanes];
    const auto* x0 = in[0] + block;
    const auto* x1 = in[1] + block;
    for (std::size_t j = 0; j < lanes; ++j) kahanFirst(T::load(x0[j]), T::load(x1[j]), sum[j], comp[j]);
    for (std::size_t i = 2; i + 1 < k; ++i) {
      const auto* x = in[i] + block;
      for (std::size_t j = 0; j < lanes; ++j) kahanAdd(T::load(x[j]), sum[j], comp[j]);
    }
    const auto* last = in[k - 1] + block;
    // Finish in registers, then store: a loop that both reads an input and writes the output would
    // not vectorise (the output may alias an input, so the compiler must keep them in order).
    for (std::size_t j = 0; j < lanes; ++j) kahanLast(T::load(last[j]), sum[j], comp[j]);
    for (std::size_t j = 0; j < lanes; ++j) out[block + j] = T::store(sum[j]);
  }
  for (std::size_t e = full_end; e < offset + n; ++e) out[e] = T::store(kahanElement<T>(in, k, e));
}

// AddN and Kahan with K fixed at compile time: the loop over inputs unrolled, so the loads of all K
// inputs are independent instructions and the accumulators never leave registers. (With a run-time K
// the compiler keeps the block's accumulators on the stack between inputs, and AddN K=4 on one core
// ran at 13 GB/s against 17 for the unrolled form.)
template <class T, std::size_t Index>
[[gnu::always_inline]] inline void addNStep(Lanes<T>& acc, const typename T::Elem* const* in,
                                            std::size_t block) {
  const typename T::Elem* x = in[Index] + block;
  for (std::size_t j = 0; j < Lanes<T>::kCount; ++j) acc.value[j] = acc.value[j] + T::load(x[j]);
}

// addNStep for Index = First .. Last - 1, in that order.
template <class T, std::size_t First, std::size_t Last>
[[gnu::always_inline]] inline void addNSteps(Lanes<T>& acc, const typename T::Elem* const* in,
                                             std::size_t block) {
  if constexpr (First < Last) {
    addNStep<T, First>(acc, in, block);
    addNSteps<T, First + 1, Last>(acc, in, block);
  }
}

template <class T, std::size_t Index>
[[gnu::always_inline]] inline void kahanStep(Lanes<T>& sum, Lanes<T>& comp, const typename T::Elem* const* in,
                                             std::size_t block) {
  const typename T::Elem* x = in[Index] + block;
  for (std::size_t j = 0; j < Lanes<T>::kCount; ++j) kahanAdd(T::load(x[j]), sum.value[j], comp.value[j]);
}

template <class T, std::size_t First, std::size_t Last>
[[gnu::always_inline]] inline void kahanSteps(Lanes<T>& sum, Lanes<T>& comp,
                                              const typename T::Elem* const* in, std::size_t block) {
  if constexpr (First < Last) {
    kahanStep<T, First>(sum, comp, in, block);
    kahanSteps<T, First + 1, Last>(sum, comp, in, block);
  }
}

struct AddNOrder {
  template <class T, std::size_t K>
  [[gnu::always_inline]] static Lanes<T> block(const typename T::Elem* const* in, std::size_t block) {
    Lanes<T> acc;
    const typename T::Elem* x0 = in[0] + block;
    const typename T::Elem* x1 = in[1] + block;
    for (std::size_t j = 0; j < Lanes<T>::kCount; ++j) acc.value[j] = T::load(x0[j]) + T::load(x1[j]);
    addNSteps<T, 2, K>(acc, in, block);
    return acc;
  }
  template <class T, std::size_t K>
  [[gnu::always_inline]] static typename T::Acc element(const typename T::Elem* const* in, std::size_t e) {
    return addNElement<T>(in, K, e);
  }
};

struct KahanOrder {  // K >= 3
  template <class T, std::size_t K>
  [[gnu::always_inline]] static Lanes<T> block(const typename T::Elem* const* in, std::size_t block) {
    Lanes<T> sum, comp;
    const typename T::Elem* x0 = in[0] + block;
    const typename T::Elem* x1 = in[1] + block;
    for (std::size_t j = 0; j < Lanes<T>::kCount; ++j)
      kahanFirst(T::load(x0[j]), T::load(x1[j]), sum.value[j], comp.value[j]);
    kahanSteps<T, 2, K - 1>(sum, comp, in, block);
    const typename T::Elem* last = in[K - 1] + block;
    for (std::size_t j = 0; j < Lanes<T>::kCount; ++j)
      kahanLast(T::load(last[j]), sum.value[j], comp.value[j]);
    return sum;
  }
  template <class T, std::size_t K>
  [[gnu::always_inline]] static typename T::Acc element(const typename T::Elem* const* in, std::size_t e) {
    return kahanElement<T>(in, K, e);
  }
};

struct TreeOrder {
  template <class T, std::size_t K>
  [[gnu::always_inline]] static Lanes<T> block(const typename T::Elem* const* in, std::size_t block) {
    Lanes<T> sum;
    treeSum<0, K>(
        [&](std::size_t i, Lanes<T>& x) {
          for (std::size_t j = 0; j < Lanes<T>::kCount; ++j) x.value[j] = T::load(in[i][block + j]);
        },
        sum);
    return sum;
  }
  template <class T, std::size_t K>
  [[gnu::always_inline]] static typename T::Acc element(const typename T::Elem* const* in, std::size_t e) {
    return treeElement<T, K>(in, e);
  }
};

// Sums [offset, offset + n) in Order with K inputs: whole 64-byte blocks, then the rest element by element.
template <class T, class Order, std::size_t K>
GS_CPU_KERNEL void fixedKernel(const typename T::Elem* const* in, typename T::Elem* out, std::size_t offset,
                               std::size_t n) {
  constexpr std::size_t lanes = Lanes<T>::kCount;
  const std::size_t full_end = offset + n / lanes * lanes;
  for (std::size_t block = offset; block < full_end; block += lanes) {
    prefetchInputs(in, K, block);
    const Lanes<T> sum = Order::template block<T, K>(in, block);
    for (std::size_t j = 0; j < lanes; ++j) out[block + j] = T::store(sum.value[j]);
  }
  for (std::size_t e = full_end; e < offset + n; ++e) out[e] = T::store(Order::template element<T, K>(in, e));
}

template <class Elem>
using FixedFunction = void (*)(const Elem* const*, Elem*, std::size_t, std::size_t);

// fixedKernel<T, Order, K> for K = First .. kMaxFixedK, indexed by K - First.
template <class T, class Order, std::size_t First, std::size_t... Offsets>
constexpr std::array<FixedFunction<typename T::Elem>, sizeof...(Offsets)> fixedTable(
    std::index_sequence<Offsets...>) {
  return {&fixedKernel<T, Order, Offsets + First>...};
}

// ---- Tile kernels -----------------------------------------------------------------------------------------
//
// One operation over n <= kTile elements: the steps of the tile programs (AddN, Tree), Kahan's tile
// steps (fp16 software fallback only), AccumulateN's passes and the fp64 reference.

// Elements per tile: the accumulator slots (4 KiB each in fp32) stay in L1 for small trees, in L2 for
// the deepest.
constexpr std::size_t kTile = 1024;

// Applies `op(i)` to [0, n) in a kernel templated on element type T: blocks of one 64-byte vector of
// T::Elem with a fixed inner trip count (vectorised), then the rest.
#define GS_FOR_EACH(n, op)                                                                 \
  do {                                                                                     \
    constexpr std::size_t gs_lanes = 64 / sizeof(typename T::Elem);                        \
    const std::size_t gs_full = (n) / gs_lanes * gs_lanes;                                 \
    for (std::size_t gs_block = 0; gs_block < gs_full; gs_block += gs_lanes)               \
      for (std::size_t gs_lane = 0; gs_lane < gs_lanes; ++gs_lane) op(gs_block + gs_lane); \
    for (std::size_t gs_rest = gs_full; gs_rest < (n); ++gs_rest) op(gs_rest);             \
  } while (false)

// Addition programs (AddN, Tree).

// slot = x + y
template <class T>
GS_CPU_KERNEL void pairKernel(typename T::Acc* GS_RESTRICT slot, const typename T::Elem* GS_RESTRICT x,
                              const typename T::Elem* GS_RESTRICT y, std::size_t n) {
#define GS_OP(i) slot[i] = T::load(x[i]) + T::load(y[i])
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

// out = round(x + y)
template <class T>
GS_CPU_KERNEL void pairStoreKernel(typename T::Elem* GS_RESTRICT out, const typename T::Elem* GS_RESTRICT x,
                                   const typename T::Elem* GS_RESTRICT y, std::size_t n) {
#define GS_OP(i) out[i] = T::store(T::load(x[i]) + T::load(y[i]))
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

// slot = slot + x
template <class T>
GS_CPU_KERNEL void addInputKernel(typename T::Acc* GS_RESTRICT slot, const typename T::Elem* GS_RESTRICT x,
                                  std::size_t n) {
#define GS_OP(i) slot[i] = slot[i] + T::load(x[i])
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

// out = round(slot + x)
template <class T>
GS_CPU_KERNEL void addInputStoreKernel(typename T::Elem* GS_RESTRICT out,
                                       const typename T::Acc* GS_RESTRICT slot,
                                       const typename T::Elem* GS_RESTRICT x, std::size_t n) {
#define GS_OP(i) out[i] = T::store(slot[i] + T::load(x[i]))
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

// slot = other + slot
template <class T>
GS_CPU_KERNEL void mergeKernel(typename T::Acc* GS_RESTRICT slot, const typename T::Acc* GS_RESTRICT other,
                               std::size_t n) {
#define GS_OP(i) slot[i] = other[i] + slot[i]
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

// out = round(other + slot)
template <class T>
GS_CPU_KERNEL void mergeStoreKernel(typename T::Elem* GS_RESTRICT out,
                                    const typename T::Acc* GS_RESTRICT other,
                                    const typename T::Acc* GS_RESTRICT slot, std::size_t n) {
#define GS_OP(i) out[i] = T::store(other[i] + slot[i])
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

// Kahan.

// The first step from sum = x, c = 0: y = z - 0 = z exactly (also for -0), so t = x + z, c = (t - x) - z.
template <class T>
GS_CPU_KERNEL void kahanFirstKernel(typename T::Acc* GS_RESTRICT sum, typename T::Acc* GS_RESTRICT comp,
                                    const typename T::Elem* GS_RESTRICT x,
                                    const typename T::Elem* GS_RESTRICT z, std::size_t n) {
#define GS_OP(i) kahanFirst(T::load(x[i]), T::load(z[i]), sum[i], comp[i])
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

// y = x - c; t = sum + y; c = (t - sum) - y; sum = t.
template <class T>
GS_CPU_KERNEL void kahanStepKernel(typename T::Acc* GS_RESTRICT sum, typename T::Acc* GS_RESTRICT comp,
                                   const typename T::Elem* GS_RESTRICT x, std::size_t n) {
#define GS_OP(i) kahanAdd(T::load(x[i]), sum[i], comp[i])
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

// The last step, stored: out = round(sum + (x - c)). The compensation of the last step is not applied
// (classic Kahan returns the running sum).
template <class T>
GS_CPU_KERNEL void kahanStepStoreKernel(typename T::Elem* GS_RESTRICT out,
                                        const typename T::Acc* GS_RESTRICT sum,
                                        const typename T::Acc* GS_RESTRICT comp,
                                        const typename T::Elem* GS_RESTRICT x, std::size_t n) {
#define GS_OP(i)                             \
  do {                                       \
    typename T::Acc last = sum[i];           \
    kahanLast(T::load(x[i]), last, comp[i]); \
    out[i] = T::store(last);                 \
  } while (false)
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

// AccumulateN in place: out = round(out + x). (The first pass, when out is not inputs[0], is
// pairStoreKernel.)
template <class T>
GS_CPU_KERNEL void accumulateKernel(typename T::Elem* GS_RESTRICT out, const typename T::Elem* GS_RESTRICT x,
                                    std::size_t n) {
  constexpr std::size_t lanes = 64 / sizeof(typename T::Elem);
  const std::size_t full = n / lanes * lanes;
  for (std::size_t block = 0; block < full; block += lanes) {
    detail::prefetchAhead(out + block, kPrefetchBytes);
    detail::prefetchAhead(x + block, kPrefetchBytes);
    for (std::size_t j = 0; j < lanes; ++j)
      out[block + j] = T::store(T::load(out[block + j]) + T::load(x[block + j]));
  }
  for (std::size_t i = full; i < n; ++i) out[i] = T::store(T::load(out[i]) + T::load(x[i]));
}

// The fp64 reference.

template <class T>
GS_CPU_KERNEL void referenceFirstKernel(double* GS_RESTRICT out, const typename T::Elem* GS_RESTRICT x,
                                        std::size_t n) {
#define GS_OP(i) out[i] = static_cast<double>(T::load(x[i]))
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

template <class T>
GS_CPU_KERNEL void referenceAddKernel(double* GS_RESTRICT out, const typename T::Elem* GS_RESTRICT x,
                                      std::size_t n) {
#define GS_OP(i) out[i] = out[i] + static_cast<double>(T::load(x[i]))
  GS_FOR_EACH(n, GS_OP);
#undef GS_OP
}

#undef GS_FOR_EACH

// ---- fp16 kernels -------------------------------------------------------------------------------------
//
// The fp16 counterparts of the kernels above (inputs and output fp16, accumulator fp32), one set per
// instruction set, generated from one text (GS_HALF_KERNELS) over a few vector helpers: the conversion
// instructions need per-function target attributes, which templates cannot carry. Tails (n not a
// multiple of the vector width) use the software conversions, which give the same bits. The sets with
// conversion instructions have direct kernels (Kahan has no tile form there: it always runs direct);
// the software set has only tile kernels, over staged fp32 copies of each tile.

#if defined(GS_HAVE_X86_INTRINSICS)
#define GS_HALF_KERNELS(TARGET)                                                                          \
  TARGET void pair(float* GS_RESTRICT slot, const std::uint16_t* GS_RESTRICT x,                          \
                   const std::uint16_t* GS_RESTRICT y, std::size_t n) {                                  \
    std::size_t i = 0;                                                                                   \
    for (; i + kWidth <= n; i += kWidth) store(slot + i, add(loadHalf(x + i), loadHalf(y + i)));         \
    for (; i < n; ++i) slot[i] = fp16ToFp32(x[i]) + fp16ToFp32(y[i]);                                    \
  }                                                                                                      \
  TARGET void pairStore(std::uint16_t* GS_RESTRICT out, const std::uint16_t* GS_RESTRICT x,              \
                        const std::uint16_t* GS_RESTRICT y, std::size_t n) {                             \
    std::size_t i = 0;                                                                                   \
    for (; i + kWidth <= n; i += kWidth) storeHalf(out + i, add(loadHalf(x + i), loadHalf(y + i)));      \
    for (; i < n; ++i) out[i] = fp32ToFp16(fp16ToFp32(x[i]) + fp16ToFp32(y[i]));                         \
  }                                                                                                      \
  TARGET void addInput(float* GS_RESTRICT slot, const std::uint16_t* GS_RESTRICT x, std::size_t n) {     \
    std::size_t i = 0;                                                                                   \
    for (; i + kWidth <= n; i += kWidth) store(slot + i, add(load(slot + i), loadHalf(x + i)));          \
    for (; i < n; ++i) slot[i] = slot[i] + fp16ToFp32(x[i]);                                             \
  }                                                                                                      \
  TARGET void addInputStore(std::uint16_t* GS_RESTRICT out, const float* GS_RESTRICT slot,               \
                            const std::uint16_t* GS_RESTRICT x, std::size_t n) {                         \
    std::size_t i = 0;                                                                                   \
    for (; i + kWidth <= n; i += kWidth) storeHalf(out + i, add(load(slot + i), loadHalf(x + i)));       \
    for (; i < n; ++i) out[i] = fp32ToFp16(slot[i] + fp16ToFp32(x[i]));                                  \
  }                                                                                                      \
  TARGET void mergeStore(std::uint16_t* GS_RESTRICT out, const float* GS_RESTRICT other,                 \
                         const float* GS_RESTRICT slot, std::size_t n) {                                 \
    std::size_t i = 0;                                                                                   \
    for (; i + kWidth <= n; i += kWidth) storeHalf(out + i, add(load(other + i), load(slot + i)));       \
    for (; i < n; ++i) out[i] = fp32ToFp16(other[i] + slot[i]);                                          \
  }                                                                                                      \
  /* The orders' leaves: not always_inline, since the shared order that calls them has no target; the    \
     compiler inlines them once the order is inlined here. */                                            \
  struct Leaf {                                                                                          \
    const std::uint16_t* const* in;                                                                      \
    std::size_t e;                                                                                       \
    TARGET void operator()(std::size_t i, Vec& value) const { value = loadHalf(in[i] + e); }             \
  };                                                                                                     \
  TARGET void addNDirect(const std::uint16_t* const* in, std::size_t k, std::uint16_t* out,              \
                         std::size_t offset, std::size_t n) {                                            \
    std::size_t e = offset;                                                                              \
    for (; e + kWidth <= offset + n; e += kWidth) {                                                      \
      prefetchInputs(in, k, e);                                                                          \
      Vec sum;                                                                                           \
      addNSum(Leaf{in, e}, k, sum);                                                                      \
      storeHalf(out + e, sum);                                                                           \
    }                                                                                                    \
    for (; e < offset + n; ++e) out[e] = HalfScalar::store(methods::addNElement<HalfScalar>(in, k, e));  \
  }                                                                                                      \
  TARGET void kahanDirect(const std::uint16_t* const* in, std::size_t k, std::uint16_t* out,             \
                          std::size_t offset, std::size_t n) {                                           \
    std::size_t e = offset;                                                                              \
    for (; e + kWidth <= offset + n; e += kWidth) {                                                      \
      prefetchInputs(in, k, e);                                                                          \
      Vec sum;                                                                                           \
      kahanSum(Leaf{in, e}, k, sum);                                                                     \
      storeHalf(out + e, sum);                                                                           \
    }                                                                                                    \
    for (; e < offset + n; ++e) out[e] = HalfScalar::store(methods::kahanElement<HalfScalar>(in, k, e)); \
  }                                                                                                      \
  template <std::size_t K>                                                                               \
  TARGET void treeDirect(const std::uint16_t* const* in, std::uint16_t* out, std::size_t offset,         \
                         std::size_t n) {                                                                \
    std::size_t e = offset;                                                                              \
    for (; e + kWidth <= offset + n; e += kWidth) {                                                      \
      prefetchInputs(in, K, e);                                                                          \
      Vec sum;                                                                                           \
      treeSum<0, K>(Leaf{in, e}, sum);                                                                   \
      storeHalf(out + e, sum);                                                                           \
    }                                                                                                    \
    for (; e < offset + n; ++e) out[e] = HalfScalar::store(methods::treeElement<HalfScalar, K>(in, e));  \
  }                                                                                                      \
  template <std::size_t... Offsets>                                                                      \
  constexpr std::array<FixedFunction<std::uint16_t>, sizeof...(Offsets)> treeTable(                      \
      std::index_sequence<Offsets...>) {                                                                 \
    return {&treeDirect<Offsets + 2>...};                                                                \
  }                                                                                                      \
  TARGET void toFloat(const std::uint16_t* GS_RESTRICT in, float* GS_RESTRICT out, std::size_t n) {      \
    std::size_t i = 0;                                                                                   \
    for (; i + kWidth <= n; i += kWidth) store(out + i, loadHalf(in + i));                               \
    for (; i < n; ++i) out[i] = fp16ToFp32(in[i]);                                                       \
  }                                                                                                      \
  TARGET void accumulate(std::uint16_t* GS_RESTRICT out, const std::uint16_t* GS_RESTRICT x,             \
                         std::size_t n) {                                                                \
    std::size_t i = 0;                                                                                   \
    for (; i + kWidth <= n; i += kWidth) storeHalf(out + i, add(loadHalf(out + i), loadHalf(x + i)));    \
    for (; i < n; ++i) out[i] = fp32ToFp16(fp16ToFp32(out[i]) + fp16ToFp32(x[i]));                       \
  }

// AVX-512F: 16 lanes. (The zero-masked conversions with an all-ones mask are the plain instructions; the
// unmasked intrinsics trip a GCC 12 -Wmaybe-uninitialized false positive inside avx512fintrin.h.)
namespace half_avx512 {
#define GS_VECTOR_HELPER __attribute__((target("avx512f"), always_inline)) inline
using Vec = __m512;
constexpr std::size_t kWidth = 16;
GS_VECTOR_HELPER Vec loadHalf(const std::uint16_t* p) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
GS_VECTOR_HELPER void storeHalf(std::uint16_t* p, Vec v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_maskz_cvtps_ph(0xFFFF, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
GS_VECTOR_HELPER Vec load(const float* p) {
  return _mm512_loadu_ps(p);
}
GS_VECTOR_HELPER void store(float* p, Vec v) {
  _mm512_storeu_ps(p, v);
}
GS_VECTOR_HELPER Vec add(Vec a, Vec b) {
  return _mm512_add_ps(a, b);
}
#undef GS_VECTOR_HELPER
GS_HALF_KERNELS(__attribute__((target("avx512f"))))
}  // namespace half_avx512

// AVX + F16C: 8 lanes (x86-64-v3 machines without AVX-512).
namespace half_f16c {
#define GS_VECTOR_HELPER __attribute__((target("avx,f16c"), always_inline)) inline
using Vec = __m256;
constexpr std::size_t kWidth = 8;
GS_VECTOR_HELPER Vec loadHalf(const std::uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
GS_VECTOR_HELPER void storeHalf(std::uint16_t* p, Vec v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
GS_VECTOR_HELPER Vec load(const float* p) {
  return _mm256_loadu_ps(p);
}
GS_VECTOR_HELPER void store(float* p, Vec v) {
  _mm256_storeu_ps(p, v);
}
GS_VECTOR_HELPER Vec add(Vec a, Vec b) {
  return _mm256_add_ps(a, b);
}
#undef GS_VECTOR_HELPER
GS_HALF_KERNELS(__attribute__((target("avx,f16c"))))
}  // namespace half_f16c
#undef GS_HALF_KERNELS
#endif

// Without the conversion instructions: convert tiles (n <= kTile) on the stack with the vectorised
// software conversions, then run the fp32 templates.
namespace half_software {
using Staging = std::array<float, kTile>;

void pair(float* GS_RESTRICT slot, const std::uint16_t* GS_RESTRICT x, const std::uint16_t* GS_RESTRICT y,
          std::size_t n) {
  Staging a, b;
  halfToFloatSoftware(x, a.data(), n);
  halfToFloatSoftware(y, b.data(), n);
  pairKernel<Fp32Type>(slot, a.data(), b.data(), n);
}
void pairStore(std::uint16_t* GS_RESTRICT out, const std::uint16_t* GS_RESTRICT x,
               const std::uint16_t* GS_RESTRICT y, std::size_t n) {
  Staging a;
  pair(a.data(), x, y, n);
  floatToHalfSoftware(a.data(), out, n);
}
void addInput(float* GS_RESTRICT slot, const std::uint16_t* GS_RESTRICT x, std::size_t n) {
  Staging a;
  halfToFloatSoftware(x, a.data(), n);
  addInputKernel<Fp32Type>(slot, a.data(), n);
}
void addInputStore(std::uint16_t* GS_RESTRICT out, const float* GS_RESTRICT slot,
                   const std::uint16_t* GS_RESTRICT x, std::size_t n) {
  Staging a, b;
  halfToFloatSoftware(x, a.data(), n);
  addInputStoreKernel<Fp32Type>(b.data(), slot, a.data(), n);
  floatToHalfSoftware(b.data(), out, n);
}
void mergeStore(std::uint16_t* GS_RESTRICT out, const float* GS_RESTRICT other, const float* GS_RESTRICT slot,
                std::size_t n) {
  Staging a;
  mergeStoreKernel<Fp32Type>(a.data(), other, slot, n);
  floatToHalfSoftware(a.data(), out, n);
}
void kahanFirst(float* GS_RESTRICT sum, float* GS_RESTRICT comp, const std::uint16_t* GS_RESTRICT x,
                const std::uint16_t* GS_RESTRICT z, std::size_t n) {
  Staging a, b;
  halfToFloatSoftware(x, a.data(), n);
  halfToFloatSoftware(z, b.data(), n);
  kahanFirstKernel<Fp32Type>(sum, comp, a.data(), b.data(), n);
}
void kahanStep(float* GS_RESTRICT sum, float* GS_RESTRICT comp, const std::uint16_t* GS_RESTRICT x,
               std::size_t n) {
  Staging a;
  halfToFloatSoftware(x, a.data(), n);
  kahanStepKernel<Fp32Type>(sum, comp, a.data(), n);
}
void kahanStepStore(std::uint16_t* GS_RESTRICT out, const float* GS_RESTRICT sum,
                    const float* GS_RESTRICT comp, const std::uint16_t* GS_RESTRICT x, std::size_t n) {
  Staging a, b;
  halfToFloatSoftware(x, a.data(), n);
  kahanStepStoreKernel<Fp32Type>(b.data(), sum, comp, a.data(), n);
  floatToHalfSoftware(b.data(), out, n);
}
void accumulate(std::uint16_t* GS_RESTRICT out, const std::uint16_t* GS_RESTRICT x, std::size_t n) {
  Staging a, b;
  halfToFloatSoftware(out, a.data(), n);
  halfToFloatSoftware(x, b.data(), n);
  addInputKernel<Fp32Type>(a.data(), b.data(), n);
  floatToHalfSoftware(a.data(), out, n);
}
}  // namespace half_software

// An fp16 kernel set, one per level (dispatch.h). The direct kernels are null in the software set,
// whose sums then run the tile programs; the Kahan tile kernels are only used there.
struct HalfKernels {
  void (*addNDirect)(const std::uint16_t* const*, std::size_t, std::uint16_t*, std::size_t,
                     std::size_t) = nullptr;
  void (*kahanDirect)(const std::uint16_t* const*, std::size_t, std::uint16_t*, std::size_t,
                      std::size_t) = nullptr;
  std::array<FixedFunction<std::uint16_t>, kMaxFixedK - 1> treeDirect{};
  void (*pair)(float*, const std::uint16_t*, const std::uint16_t*, std::size_t) = half_software::pair;
  void (*pairStore)(std::uint16_t*, const std::uint16_t*, const std::uint16_t*,
                    std::size_t) = half_software::pairStore;
  void (*addInput)(float*, const std::uint16_t*, std::size_t) = half_software::addInput;
  void (*addInputStore)(std::uint16_t*, const float*, const std::uint16_t*,
                        std::size_t) = half_software::addInputStore;
  void (*mergeStore)(std::uint16_t*, const float*, const float*, std::size_t) = half_software::mergeStore;
  void (*kahanFirst)(float*, float*, const std::uint16_t*, const std::uint16_t*,
                     std::size_t) = half_software::kahanFirst;
  void (*kahanStep)(float*, float*, const std::uint16_t*, std::size_t) = half_software::kahanStep;
  void (*kahanStepStore)(std::uint16_t*, const float*, const float*, const std::uint16_t*,
                         std::size_t) = half_software::kahanStepStore;
  void (*accumulate)(std::uint16_t*, const std::uint16_t*, std::size_t) = half_software::accumulate;
  void (*toFloat)(const std::uint16_t*, float*, std::size_t) = halfToFloatSoftware;
};

#if defined(GS_HAVE_X86_INTRINSICS)
#define GS_HALF_KERNEL_SET(ns)                                                      \
  [] {                                                                              \
    HalfKernels kernels;                                                            \
    kernels.addNDirect = ns::addNDirect;                                            \
    kernels.kahanDirect = ns::kahanDirect;                                          \
    kernels.treeDirect = ns::treeTable(std::make_index_sequence<kMaxFixedK - 1>{}); \
    kernels.pair = ns::pair;                                                        \
    kernels.pairStore = ns::pairStore;                                              \
    kernels.addInput = ns::addInput;                                                \
    kernels.addInputStore = ns::addInputStore;                                      \
    kernels.mergeStore = ns::mergeStore;                                            \
    kernels.accumulate = ns::accumulate;                                            \
    kernels.toFloat = ns::toFloat;                                                  \
    return kernels;                                                                 \
  }()
constexpr detail::IsaTable<HalfKernels> kHalfKernels{HalfKernels{}, GS_HALF_KERNEL_SET(half_f16c),
                                                     GS_HALF_KERNEL_SET(half_avx512)};
#undef GS_HALF_KERNEL_SET
#else
constexpr detail::IsaTable<HalfKernels> kHalfKernels{HalfKernels{}, HalfKernels{}, HalfKernels{}};
#endif

const HalfKernels& halfKernels() {
  return detail::kernelsFor(kHalfKernels);
}

// ---- Kernel sets the drivers run
// ---------------------------------------------------------------------------

// fp32, fp64, bf16: the templates.
template <class T>
struct TemplateOps {
  using Elem = typename T::Elem;
  using Acc = typename T::Acc;
  static void pair(Acc* s, const Elem* x, const Elem* y, std::size_t n) { pairKernel<T>(s, x, y, n); }
  static void pairStore(Elem* o, const Elem* x, const Elem* y, std::size_t n) {
    pairStoreKernel<T>(o, x, y, n);
  }
  static void addInput(Acc* s, const Elem* x, std::size_t n) { addInputKernel<T>(s, x, n); }
  static void addInputStore(Elem* o, const Acc* s, const Elem* x, std::size_t n) {
    addInputStoreKernel<T>(o, s, x, n);
  }
  static void merge(Acc* s, const Acc* other, std::size_t n) { mergeKernel<T>(s, other, n); }
  static void mergeStore(Elem* o, const Acc* other, const Acc* s, std::size_t n) {
    mergeStoreKernel<T>(o, other, s, n);
  }
  static void kahanFirst(Acc* s, Acc* c, const Elem* x, const Elem* z, std::size_t n) {
    kahanFirstKernel<T>(s, c, x, z, n);
  }
  static void kahanStep(Acc* s, Acc* c, const Elem* x, std::size_t n) { kahanStepKernel<T>(s, c, x, n); }
  static void kahanStepStore(Elem* o, const Acc* s, const Acc* c, const Elem* x, std::size_t n) {
    kahanStepStoreKernel<T>(o, s, c, x, n);
  }
  static void accumulate(Elem* o, const Elem* x, std::size_t n) { accumulateKernel<T>(o, x, n); }
  static void referenceFirst(double* o, const Elem* x, std::size_t n) { referenceFirstKernel<T>(o, x, n); }
  static void referenceAdd(double* o, const Elem* x, std::size_t n) { referenceAddKernel<T>(o, x, n); }

  static bool hasDirect() { return true; }
  // K <= kMaxFixedK: the unrolled kernels; larger K: the run-time loops (AddN, Kahan) or, for the tree,
  // the tile program (see localSumWith).
  static void addNDirect(const Elem* const* in, std::size_t k, Elem* o, std::size_t offset, std::size_t n) {
    static constexpr auto table = fixedTable<T, AddNOrder, 2>(std::make_index_sequence<kMaxFixedK - 1>{});
    if (k <= kMaxFixedK) table[k - 2](in, o, offset, n);
    else addNDirectKernel<T>(in, k, o, offset, n);
  }
  static void kahanDirect(const Elem* const* in, std::size_t k, Elem* o, std::size_t offset, std::size_t n) {
    static constexpr auto table = fixedTable<T, KahanOrder, 3>(std::make_index_sequence<kMaxFixedK - 2>{});
    if (k <= kMaxFixedK) table[k - 3](in, o, offset, n);
    else kahanDirectKernel<T>(in, k, o, offset, n);
  }
  static void treeDirect(const Elem* const* in, std::size_t k, Elem* o, std::size_t offset, std::size_t n) {
    static constexpr auto table = fixedTable<T, TreeOrder, 2>(std::make_index_sequence<kMaxFixedK - 1>{});
    table[k - 2](in, o, offset, n);
  }
};

// fp16: the kernel set chosen for this CPU.
struct HalfOps {
  using Elem = std::uint16_t;
  using Acc = float;
  const HalfKernels& k = halfKernels();
  void pair(Acc* s, const Elem* x, const Elem* y, std::size_t n) const { k.pair(s, x, y, n); }
  void pairStore(Elem* o, const Elem* x, const Elem* y, std::size_t n) const { k.pairStore(o, x, y, n); }
  void addInput(Acc* s, const Elem* x, std::size_t n) const { k.addInput(s, x, n); }
  void addInputStore(Elem* o, const Acc* s, const Elem* x, std::size_t n) const {
    k.addInputStore(o, s, x, n);
  }
  static void merge(Acc* s, const Acc* other, std::size_t n) { mergeKernel<Fp32Type>(s, other, n); }
  void mergeStore(Elem* o, const Acc* other, const Acc* s, std::size_t n) const {
    k.mergeStore(o, other, s, n);
  }
  void kahanFirst(Acc* s, Acc* c, const Elem* x, const Elem* z, std::size_t n) const {
    k.kahanFirst(s, c, x, z, n);
  }
  void kahanStep(Acc* s, Acc* c, const Elem* x, std::size_t n) const { k.kahanStep(s, c, x, n); }
  void kahanStepStore(Elem* o, const Acc* s, const Acc* c, const Elem* x, std::size_t n) const {
    k.kahanStepStore(o, s, c, x, n);
  }
  void accumulate(Elem* o, const Elem* x, std::size_t n) const { k.accumulate(o, x, n); }
  void referenceFirst(double* o, const Elem* x, std::size_t n) const {
    std::array<float, kTile> staged;
    k.toFloat(x, staged.data(), n);
    referenceFirstKernel<Fp32Type>(o, staged.data(), n);
  }
  void referenceAdd(double* o, const Elem* x, std::size_t n) const {
    std::array<float, kTile> staged;
    k.toFloat(x, staged.data(), n);
    referenceAddKernel<Fp32Type>(o, staged.data(), n);
  }
  bool hasDirect() const { return k.addNDirect != nullptr; }
  void addNDirect(const Elem* const* in, std::size_t kk, Elem* o, std::size_t offset, std::size_t n) const {
    k.addNDirect(in, kk, o, offset, n);
  }
  void kahanDirect(const Elem* const* in, std::size_t kk, Elem* o, std::size_t offset, std::size_t n) const {
    k.kahanDirect(in, kk, o, offset, n);
  }
  void treeDirect(const Elem* const* in, std::size_t kk, Elem* o, std::size_t offset, std::size_t n) const {
    k.treeDirect[kk - 2](in, o, offset, n);
  }
};

// ---- Addition programs -----------------------------------------------------------------------------------
//
// One step computes `a + b` per element. The shapes are restricted to what the kernels above do:
//   input + input      -> slot or output      (pairKernel / pairStoreKernel)
//   slot d + input     -> slot d or output    (addInputKernel / addInputStoreKernel)
//   slot s + slot d    -> slot d or output    (mergeKernel / mergeStoreKernel)
// The last step of a program writes the output; K = 1 has no steps (a copy).

enum class Shape : std::uint8_t { InputInput, SlotInput, SlotSlot };

struct Step {
  Shape shape;
  std::size_t a;  // InputInput: input; SlotInput: the slot (also the destination); SlotSlot: the other slot
  std::size_t b;  // InputInput, SlotInput: input; SlotSlot: the destination slot
  std::size_t destination;  // slot written (unused by the last step, which writes the output)
};

struct Program {
  std::vector<Step> steps;
  std::size_t slots = 0;
};

// ((x0 + x1) + x2) + ... in slot 0.
Program buildAddNProgram(std::size_t k) {
  Program program;
  if (k < 2) return program;
  program.slots = 1;
  program.steps.push_back({Shape::InputInput, 0, 1, 0});
  for (std::size_t i = 2; i < k; ++i) program.steps.push_back({Shape::SlotInput, 0, i, 0});
  return program;
}

// The binary-counter order of pairwise summation (local_sum.h). Slot l holds a partial sum of 2^(l+1)
// inputs. Inputs are paired (x[2j] + x[2j+1]); a new pair is merged with the partials of equal size
// already held (slot 0, then slot 1, ...: each step is `slot_l + running`), exactly like a carry
// propagating through a binary counter of pairs, and lands in the first free slot. At the end the
// partials left (the odd last input, if any, then the occupied slots from the lowest level up) are
// combined from the smallest to the largest: running = larger + running. For K = 7:
// ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + x6).
Program buildTreeProgram(std::size_t k) {
  Program program;
  if (k < 2) return program;
  std::size_t pairs = 0;
  for (std::size_t i = 1; i < k; i += 2) {
    const auto destination = static_cast<std::size_t>(std::countr_one(pairs));
    program.steps.push_back({Shape::InputInput, i - 1, i, destination});
    for (std::size_t level = 0; level < destination; ++level)
      program.steps.push_back({Shape::SlotSlot, level, destination, destination});
    ++pairs;
    program.slots = std::max(program.slots, destination + 1);
  }
  // Leftovers, smallest first. `running` is the slot holding the partials combined so far.
  bool have_running = false;
  std::size_t running = 0;
  bool odd_input = k % 2 == 1;
  for (std::size_t level = 0; level < program.slots; ++level) {
    if (((pairs >> level) & 1u) == 0) continue;
    if (odd_input) {
      program.steps.push_back({Shape::SlotInput, level, k - 1, level});
      odd_input = false;
    } else if (have_running) {
      program.steps.push_back({Shape::SlotSlot, running, level, level});
    }
    have_running = true;
    running = level;
  }
  return program;
}

// ---- Scratch ---------------------------------------------------------------------------------------------

// Tile-local accumulator slots, one slab per concurrently running chunk, allocated before the parallel
// loop (its body must not throw). 64-byte aligned so full-width vector loads never split cache lines.
template <class Acc>
class Scratch {
 public:
  Scratch(std::size_t slabs, std::size_t arrays_per_slab)
      : arrays_(std::max<std::size_t>(1, arrays_per_slab)),
        slabs_(slabs),
        data_(static_cast<Acc*>(::operator new (slabs* arrays_* kTile * sizeof(Acc), std::align_val_t{64}))) {
  }
  ~Scratch() { ::operator delete (data_, std::align_val_t{64}); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // A slab for one chunk: parallelFor runs at most one chunk per executor thread, each claims its own.
  Acc* claim() {
    const std::size_t slab = next_.fetch_add(1, std::memory_order_relaxed) % slabs_;
    return data_ + slab * arrays_ * kTile;
  }

 private:
  std::size_t arrays_;
  std::size_t slabs_;
  Acc* data_;
  std::atomic<std::size_t> next_{0};
};

// ---- Drivers ---------------------------------------------------------------------------------------------

template <class Ops>
void runProgramTile(const Program& program, const Ops& ops, const typename Ops::Elem* const* inputs,
                    typename Ops::Elem* out, typename Ops::Acc* slab, std::size_t offset, std::size_t n) {
  const auto slot = [&](std::size_t index) { return slab + index * kTile; };
  const auto input = [&](std::size_t index) { return inputs[index] + offset; };
  const std::size_t last = program.steps.size() - 1;
  for (std::size_t s = 0; s <= last; ++s) {
    const Step& step = program.steps[s];
    const bool to_output = s == last;
    switch (step.shape) {
      case Shape::InputInput:
        if (to_output) ops.pairStore(out + offset, input(step.a), input(step.b), n);
        else ops.pair(slot(step.destination), input(step.a), input(step.b), n);
        break;
      case Shape::SlotInput:
        if (to_output) ops.addInputStore(out + offset, slot(step.a), input(step.b), n);
        else ops.addInput(slot(step.a), input(step.b), n);
        break;
      case Shape::SlotSlot:
        if (to_output) ops.mergeStore(out + offset, slot(step.a), slot(step.b), n);
        else ops.merge(slot(step.b), slot(step.a), n);
        break;
    }
  }
}

template <class Ops>
void runProgram(const Program& program, const Ops& ops, const typename Ops::Elem* const* inputs,
                typename Ops::Elem* out, std::size_t k, std::size_t count, CpuExecutor& executor) {
  Scratch<typename Ops::Acc> scratch(static_cast<std::size_t>(executor.threads()), program.slots);
  executor.parallelFor(
      count, (k + 1) * sizeof(typename Ops::Elem), kTile, [&](std::size_t begin, std::size_t end) {
        auto* slab = scratch.claim();
        for (std::size_t offset = begin; offset < end; offset += kTile)
          runProgramTile(program, ops, inputs, out, slab, offset, std::min(kTile, end - offset));
      });
}

template <class Ops>
void runKahan(const Ops& ops, const typename Ops::Elem* const* inputs, typename Ops::Elem* out, std::size_t k,
              std::size_t count, CpuExecutor& executor) {
  Scratch<typename Ops::Acc> scratch(static_cast<std::size_t>(executor.threads()), 2);
  executor.parallelFor(count, (k + 1) * sizeof(typename Ops::Elem), kTile,
                       [&](std::size_t begin, std::size_t end) {
                         auto* const sum = scratch.claim();
                         auto* const comp = sum + kTile;
                         for (std::size_t offset = begin; offset < end; offset += kTile) {
                           const std::size_t n = std::min(kTile, end - offset);
                           if (k == 2) {
                             ops.pairStore(out + offset, inputs[0] + offset, inputs[1] + offset, n);
                             continue;
                           }
                           ops.kahanFirst(sum, comp, inputs[0] + offset, inputs[1] + offset, n);
                           for (std::size_t i = 2; i + 1 < k; ++i)
                             ops.kahanStep(sum, comp, inputs[i] + offset, n);
                           ops.kahanStepStore(out + offset, sum, comp, inputs[k - 1] + offset, n);
                         }
                       });
}

// K-1 passes over the whole output, each parallel, each rounding to the output type. Tiles only bound
// the length of a kernel call (the fp16 software fallback stages at most kTile elements).
template <class Ops>
void runAccumulate(const Ops& ops, const typename Ops::Elem* const* inputs, typename Ops::Elem* out,
                   std::size_t k, std::size_t count, CpuExecutor& executor) {
  for (std::size_t pass = 1; pass < k; ++pass) {
    executor.parallelFor(count, 3 * sizeof(typename Ops::Elem), kTile,
                         [&](std::size_t begin, std::size_t end) {
                           for (std::size_t offset = begin; offset < end; offset += kTile) {
                             const std::size_t n = std::min(kTile, end - offset);
                             if (pass == 1 && out != inputs[0])
                               ops.pairStore(out + offset, inputs[0] + offset, inputs[1] + offset, n);
                             else ops.accumulate(out + offset, inputs[pass] + offset, n);
                           }
                         });
  }
}

template <class Ops>
void runReference(const Ops& ops, const typename Ops::Elem* const* inputs, double* out, std::size_t k,
                  std::size_t count, CpuExecutor& executor) {
  executor.parallelFor(count, k * sizeof(typename Ops::Elem) + sizeof(double), kTile,
                       [&](std::size_t begin, std::size_t end) {
                         // The output tile is the accumulator: it stays in cache while the inputs stream.
                         for (std::size_t offset = begin; offset < end; offset += kTile) {
                           const std::size_t n = std::min(kTile, end - offset);
                           ops.referenceFirst(out + offset, inputs[0] + offset, n);
                           for (std::size_t i = 1; i < k; ++i)
                             ops.referenceAdd(out + offset, inputs[i] + offset, n);
                         }
                       });
}

enum class Direct : std::uint8_t { AddN, Kahan, Tree };

// One pass of a direct kernel over [0, count), split across the executor in 64-element-aligned chunks.
template <class Ops>
void runDirect(Direct kernel, const Ops& ops, const typename Ops::Elem* const* inputs,
               typename Ops::Elem* out, std::size_t k, std::size_t count, CpuExecutor& executor) {
  executor.parallelFor(count, (k + 1) * sizeof(typename Ops::Elem), 64,
                       [&](std::size_t begin, std::size_t end) {
                         switch (kernel) {
                           case Direct::AddN: ops.addNDirect(inputs, k, out, begin, end - begin); break;
                           case Direct::Kahan: ops.kahanDirect(inputs, k, out, begin, end - begin); break;
                           case Direct::Tree: ops.treeDirect(inputs, k, out, begin, end - begin); break;
                         }
                       });
}

template <class Ops>
void localSumWith(LocalSumMethod method, const Ops& ops, std::span<const void* const> raw_inputs,
                  void* raw_output, std::size_t count, CpuExecutor& executor) {
  using Elem = typename Ops::Elem;
  const std::size_t k = raw_inputs.size();
  std::vector<const Elem*> inputs(k);
  for (std::size_t i = 0; i < k; ++i) inputs[i] = static_cast<const Elem*>(raw_inputs[i]);
  auto* out = static_cast<Elem*>(raw_output);
  const bool direct = ops.hasDirect();
  switch (method) {
    case LocalSumMethod::AddN:
      if (direct) runDirect(Direct::AddN, ops, inputs.data(), out, k, count, executor);
      else runProgram(buildAddNProgram(k), ops, inputs.data(), out, k, count, executor);
      break;
    case LocalSumMethod::Tree:
      if (direct && k <= kMaxFixedK) runDirect(Direct::Tree, ops, inputs.data(), out, k, count, executor);
      else runProgram(buildTreeProgram(k), ops, inputs.data(), out, k, count, executor);
      break;
    case LocalSumMethod::Kahan:
      if (direct)  // K = 2 is one addition, the same as AddN's
        runDirect(k == 2 ? Direct::AddN : Direct::Kahan, ops, inputs.data(), out, k, count, executor);
      else runKahan(ops, inputs.data(), out, k, count, executor);
      break;
    case LocalSumMethod::AccumulateN: runAccumulate(ops, inputs.data(), out, k, count, executor); break;
  }
}

template <class Ops>
void referenceSumWith(const Ops& ops, std::span<const void* const> raw_inputs, double* out, std::size_t count,
                      CpuExecutor& executor) {
  using Elem = typename Ops::Elem;
  const std::size_t k = raw_inputs.size();
  std::vector<const Elem*> inputs(k);
  for (std::size_t i = 0; i < k; ++i) inputs[i] = static_cast<const Elem*>(raw_inputs[i]);
  runReference(ops, inputs.data(), out, k, count, executor);
}

void checkArguments(const char* what, DType dtype, std::span<const void* const> inputs, const void* output,
                    std::size_t count) {
  if (!localSumSupports(dtype))
    fail("{}: element type {} is not supported (fp32, fp16, bf16 and fp64 are)", what, name(dtype));
  if (inputs.empty()) fail("{}: no inputs (K = 0)", what);
  if (count == 0) return;
  if (output == nullptr) fail("{}: null output buffer", what);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == nullptr) fail("{}: input {} is a null buffer", what, i);
    if (i > 0 && inputs[i] == output)
      fail("{}: the output aliases input {} (only input 0 may be the output)", what, i);
  }
}

}  // namespace

std::string_view strategyName(LocalSumMethod method) {
  switch (method) {
    case LocalSumMethod::AddN: return "local/add_n";
    case LocalSumMethod::Tree: return "local/tree";
    case LocalSumMethod::AccumulateN: return "local/accumulate_n";
    case LocalSumMethod::Kahan: return "local/kahan";
  }
  return "local/unknown";
}

std::optional<LocalSumMethod> parseLocalSumMethod(std::string_view strategy) {
  for (LocalSumMethod method : kLocalSumMethods)
    if (strategyName(method) == strategy) return method;
  return std::nullopt;
}

bool localSumSupports(DType dtype) {
  return dtype == DType::Fp32 || dtype == DType::Fp16 || dtype == DType::Bf16 || dtype == DType::Fp64;
}

void localSum(LocalSumMethod method, DType dtype, std::span<const void* const> inputs, void* output,
              std::size_t count, CpuExecutor& executor) {
  checkArguments("local sum", dtype, inputs, output, count);
  if (count == 0) return;
  if (inputs.size() == 1) {
    // The sum of one term is that term, bit for bit (not converted through the accumulator).
    if (output != inputs[0]) std::memcpy(output, inputs[0], count * sizeOf(dtype));
    return;
  }
  switch (dtype) {
    case DType::Fp32: localSumWith(method, TemplateOps<Fp32Type>{}, inputs, output, count, executor); break;
    case DType::Fp64: localSumWith(method, TemplateOps<Fp64Type>{}, inputs, output, count, executor); break;
    case DType::Bf16: localSumWith(method, TemplateOps<Bf16Type>{}, inputs, output, count, executor); break;
    case DType::Fp16: localSumWith(method, HalfOps{}, inputs, output, count, executor); break;
    default: break;  // refused by checkArguments
  }
}

void referenceSum(DType dtype, std::span<const void* const> inputs, double* output, std::size_t count,
                  CpuExecutor& executor) {
  checkArguments("reference sum", dtype, inputs, output, count);
  if (count == 0) return;
  switch (dtype) {
    case DType::Fp32: referenceSumWith(TemplateOps<Fp32Type>{}, inputs, output, count, executor); break;
    case DType::Fp64: referenceSumWith(TemplateOps<Fp64Type>{}, inputs, output, count, executor); break;
    case DType::Bf16: referenceSumWith(TemplateOps<Bf16Type>{}, inputs, output, count, executor); break;
    case DType::Fp16: referenceSumWith(HalfOps{}, inputs, output, count, executor); break;
    default: break;
  }
}

// The bandwidth model of local_sum.h: (K + 1)·n·size for the one-pass methods (K input reads, one
// output write), 3(K - 1)·n·size for AccumulateN with K >= 2.
std::size_t localSumBytesMoved(LocalSumMethod method, DType dtype, std::size_t inputs, std::size_t count) {
  if (inputs == 0) return 0;
  const std::size_t bytes = count * sizeOf(dtype);
  // AccumulateN: the first pass reads x0 and x1 and writes the output, every later pass reads the
  // output and one input and writes the output back; with one input it is a copy like the others.
  if (method == LocalSumMethod::AccumulateN && inputs >= 2) return 3 * (inputs - 1) * bytes;
  return (inputs + 1) * bytes;
}

}  // namespace gradscope::methods
