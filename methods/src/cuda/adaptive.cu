// adaptive.h on the GPU: AdaCons (α, weights, aggregate), AdaSum (pair and tree) and the consensus
// statistics.
//
// Every fp64 reduction runs in adaptive.cc's order (blocks of kStatsBlock elements, 16 lanes, lanes
// then blocks in order; common.cuh) with products rounded before they are added, and every
// per-element expression is the CPU's, operation for operation (__dmul_rn / __dadd_rn, so nvcc cannot
// fuse them). The scalar steps in between (α, the AdaCons weights through methods::adaconsWeights,
// coefficients, cosines) run on the host with the CPU's code. So the results are the CPU's bits,
// except that a NaN produced by GPU arithmetic has the canonical payload.
//
// Host synchronisation: adaconsAlpha, adacons and consensusStats return host values and synchronise
// the stream once (after the statistics). adasumPair and adasum only enqueue: the dot products stay on
// the device, a one-thread kernel turns them into AdaSum's two coefficients, and the combining kernel
// reads them from device memory.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

// common.cuh first: it configures fmt for nvcc before anything includes it.
// clang-format off
#include "common.cuh"
#include "../adaptive_scalars.h"
#include "../reduction_order.h"
// clang-format on

namespace gradscope::methods::cuda {
namespace {

using detail::kBlockThreads;
using detail::Pack;
using detail::PointerTable;
using methods::detail::checkGradients;
using methods::detail::cosine;
using methods::detail::GradientStats;

constexpr std::size_t kStatsBlock = methods::detail::kAdaptiveReductionBlock;
// Gradients whose dot products and norms one pass of the statistics kernel accumulates (registers);
// more gradients take more passes, each recomputing g_sum from all of them.
constexpr int kChunk = 8;

std::vector<const void*> pointersOf(Gradients gradients) {
  return {gradients.begin(), gradients.end()};
}

bool allAligned(Gradients gradients, const float* out) {
  bool aligned = detail::aligned(out, 16);
  for (const float* gradient : gradients) aligned = aligned && detail::aligned(gradient, 16);
  return aligned;
}

// ---- Statistics: ⟨g_sum, g_i⟩, ‖g_i‖², ‖g_sum‖² -----------------------------------------------------------

// Partials of the gradients [first, first + chunk): rows 0..chunk-1 the dots, rows chunk..2·chunk-1 the
// squares, row 2·chunk (when with_sum_squares) ‖g_sum‖²; each row `blocks` long.
template <int C>
__global__ void __launch_bounds__(kBlockThreads)
    statsKernel(const __grid_constant__ PointerTable gradients, int first, int chunk, bool with_sum_squares,
                std::size_t count, std::size_t blocks, double* partials) {
  const std::size_t block = detail::cpuBlockIndex();
  const unsigned lane = detail::cpuLane();
  double dot[C];
  double squares[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    dot[c] = 0.0;
    squares[c] = 0.0;
  }
  double sum_squares = 0.0;
  if (block < blocks) {
    const std::size_t begin = block * kStatsBlock;
    const std::size_t n = count - begin < kStatsBlock ? count - begin : kStatsBlock;
    for (std::size_t i = lane; i < n; i += detail::kCpuLanes) {
      const std::size_t e = begin + i;
      // g_sum in fp64: g_0, then + g_k in index order.
      double sum = 0.0;
      detail::streamInputs<float, 1>(gradients, e, [&](int k, const Pack<float, 1>& x) {
        const auto value = static_cast<double>(x.v[0]);
        sum = k == 0 ? value : __dadd_rn(sum, value);
      });
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (c < chunk) {
          const auto x = static_cast<double>(static_cast<const float*>(gradients[first + c])[e]);
          dot[c] = __dadd_rn(dot[c], __dmul_rn(sum, x));
          squares[c] = __dadd_rn(squares[c], __dmul_rn(x, x));
        }
      }
      if (with_sum_squares) sum_squares = __dadd_rn(sum_squares, __dmul_rn(sum, sum));
    }
  }
  const bool writer = lane == 0 && block < blocks;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    if (c < chunk) {  // uniform: the whole warp takes the same branch
      const double dot_total = detail::laneOrderSum(dot[c]);
      const double squares_total = detail::laneOrderSum(squares[c]);
      if (writer) {
        partials[static_cast<std::size_t>(c) * blocks + block] = dot_total;
        partials[static_cast<std::size_t>(chunk + c) * blocks + block] = squares_total;
      }
    }
  }
  if (with_sum_squares) {
    const double total = detail::laneOrderSum(sum_squares);
    if (writer) partials[static_cast<std::size_t>(2 * chunk) * blocks + block] = total;
  }
}

// One pass over the gradients per chunk of kChunk, then one synchronisation.
GradientStats gradientStats(Gradients gradients, std::size_t count, cudaStream_t stream) {
  const std::size_t n_grad = gradients.size();
  GradientStats stats;
  stats.dots.assign(n_grad, 0.0);
  stats.squares.assign(n_grad, 0.0);
  if (count == 0) return stats;
  const std::size_t blocks = (count + kStatsBlock - 1) / kStatsBlock;
  const std::size_t passes = (n_grad + kChunk - 1) / kChunk;
  constexpr std::size_t kRows = 2 * kChunk + 1;
  const std::vector<const void*> pointers = pointersOf(gradients);
  const detail::PointerTableBuilder table(pointers, stream);
  const detail::Scratch partials(kRows * blocks * sizeof(double), stream);
  const detail::Scratch totals(passes * kRows * sizeof(double), stream);
  for (std::size_t pass = 0; pass < passes; ++pass) {
    const int first = static_cast<int>(pass * kChunk);
    const int chunk = static_cast<int>(std::min<std::size_t>(kChunk, n_grad - pass * kChunk));
    const bool with_sum_squares = pass == 0;
    statsKernel<kChunk><<<detail::cpuOrderGrid(blocks), kBlockThreads, 0, stream>>>(
        table.table(), first, chunk, with_sum_squares, count, blocks, partials.as<double>());
    detail::checkLaunch("statsKernel");
    const int quantities = 2 * chunk + (with_sum_squares ? 1 : 0);
    detail::blockOrderSumKernel<><<<1, kBlockThreads, 0, stream>>>(partials.as<double>(), blocks, quantities,
                                                                   totals.as<double>() + pass * kRows);
    detail::checkLaunch("blockOrderSumKernel");
  }
  std::vector<double> host(passes * kRows);
  detail::check(cudaMemcpyAsync(host.data(), totals.as<double>(), host.size() * sizeof(double),
                                cudaMemcpyDeviceToHost, stream),
                "cudaMemcpyAsync (gradient statistics)");
  detail::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (std::size_t pass = 0; pass < passes; ++pass) {
    const std::size_t chunk = std::min<std::size_t>(kChunk, n_grad - pass * kChunk);
    const double* row = host.data() + pass * kRows;
    for (std::size_t c = 0; c < chunk; ++c) {
      stats.dots[pass * kChunk + c] = row[c];
      stats.squares[pass * kChunk + c] = row[chunk + c];
    }
    if (pass == 0) stats.sum_squares = row[2 * chunk];
  }
  return stats;
}

// ---- AdaCons aggregate
// -----------------------------------------------------------------------------------------

// out_e = fp32(c_0·g_0 + c_1·g_1 + ...), in fp64, in rank order (adaptive.cc's scale/axpy kernels).
template <int N>
__device__ __forceinline__ void weightedPack(const PointerTable& gradients, const double* coefficients,
                                             std::size_t index, float* out) {
  double acc[N];
  detail::streamInputs<float, N>(gradients, index, [&](int k, const Pack<float, N>& x) {
    const double c = coefficients[k];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const double term = __dmul_rn(c, static_cast<double>(x.v[j]));
      acc[j] = k == 0 ? term : __dadd_rn(acc[j], term);
    }
  });
  Pack<float, N> result;
#pragma unroll
  for (int j = 0; j < N; ++j) result.v[j] = __double2float_rn(acc[j]);
  *reinterpret_cast<Pack<float, N>*>(out + index) = result;
}

template <bool kVector>
__global__ void __launch_bounds__(kBlockThreads)
    weightedSumKernel(const __grid_constant__ PointerTable gradients, const double* coefficients,
                      std::size_t count, float* out) {
  constexpr int kPack = kVector ? 4 : 1;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t packs = count / kPack;
  for (std::size_t p = first; p < packs; p += stride)
    weightedPack<kPack>(gradients, coefficients, p * kPack, out);
  if constexpr (kVector) {
    for (std::size_t i = packs * kPack + first; i < count; i += stride)
      weightedPack<1>(gradients, coefficients, i, out);
  }
}

// ---- AdaSum
// --------------------------------------------------------------------------------------------------

struct PairCoefficients {
  double ca;
  double cb;
  int copy;  // 0: combine; 1: out = b (a is zero); 2: out = a (b is zero)
};

// Partials of a·b, a·a, b·b (rows 0, 1, 2) per block of the CPU order.
__global__ void __launch_bounds__(kBlockThreads)
    pairDotsKernel(const float* a, const float* b, std::size_t count, std::size_t blocks, double* partials) {
  const std::size_t block = detail::cpuBlockIndex();
  const unsigned lane = detail::cpuLane();
  double ab = 0.0;
  double aa = 0.0;
  double bb = 0.0;
  if (block < blocks) {
    const std::size_t begin = block * kStatsBlock;
    const std::size_t n = count - begin < kStatsBlock ? count - begin : kStatsBlock;
#pragma unroll 4
    for (std::size_t i = lane; i < n; i += detail::kCpuLanes) {
      const auto x = static_cast<double>(a[begin + i]);
      const auto y = static_cast<double>(b[begin + i]);
      ab = __dadd_rn(ab, __dmul_rn(x, y));
      aa = __dadd_rn(aa, __dmul_rn(x, x));
      bb = __dadd_rn(bb, __dmul_rn(y, y));
    }
  }
  ab = detail::laneOrderSum(ab);
  aa = detail::laneOrderSum(aa);
  bb = detail::laneOrderSum(bb);
  if (lane == 0 && block < blocks) {
    partials[block] = ab;
    partials[blocks + block] = aa;
    partials[2 * blocks + block] = bb;
  }
}

// The three totals in block order (one thread each), then AdaSum's coefficients (adaptive.cc).
__global__ void pairCoefficientsKernel(const double* partials, std::size_t blocks, PairCoefficients* out) {
  __shared__ double totals[3];
  if (threadIdx.x < 3) {
    const double* p = partials + threadIdx.x * blocks;
    double total = 0.0;
    for (std::size_t b = 0; b < blocks; ++b) total = __dadd_rn(total, p[b]);
    totals[threadIdx.x] = total;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const double ab = totals[0];
  const double aa = totals[1];
  const double bb = totals[2];
  PairCoefficients result{0.0, 0.0, 0};
  if (aa == 0 || bb == 0) {
    result.copy = aa == 0 ? 1 : 2;  // a zero vector is the identity
  } else {
    result.ca = __dsub_rn(1.0, __ddiv_rn(ab, __dmul_rn(2.0, aa)));
    result.cb = __dsub_rn(1.0, __ddiv_rn(ab, __dmul_rn(2.0, bb)));
  }
  *out = result;
}

__device__ __forceinline__ float combineOne(float a, float b, const PairCoefficients& c) {
  if (c.copy == 1) return b;
  if (c.copy == 2) return a;
  return __double2float_rn(
      __dadd_rn(__dmul_rn(c.ca, static_cast<double>(a)), __dmul_rn(c.cb, static_cast<double>(b))));
}

// out = fp32(ca·a + cb·b) (or a copy of the non-zero side). out may be a or b: each element is read
// before it is written, by the same thread.
template <bool kVector>
__global__ void __launch_bounds__(kBlockThreads)
    combineKernel(const float* a, const float* b, std::size_t count, float* out,
                  const PairCoefficients* coefficients) {
  const PairCoefficients c = *coefficients;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if constexpr (kVector) {
    const std::size_t packs = count / 4;
    for (std::size_t p = first; p < packs; p += stride) {
      const float4 x = reinterpret_cast<const float4*>(a)[p];
      const float4 y = reinterpret_cast<const float4*>(b)[p];
      reinterpret_cast<float4*>(out)[p] = make_float4(combineOne(x.x, y.x, c), combineOne(x.y, y.y, c),
                                                      combineOne(x.z, y.z, c), combineOne(x.w, y.w, c));
    }
    done = packs * 4;
  }
  for (std::size_t i = done + first; i < count; i += stride) out[i] = combineOne(a[i], b[i], c);
}

// Scratch for a sequence of pair steps on one stream (reused: the steps are ordered on the stream).
class PairWorkspace {
 public:
  PairWorkspace(std::size_t count, cudaStream_t stream)
      : blocks_((count + kStatsBlock - 1) / kStatsBlock),
        scratch_(3 * blocks_ * sizeof(double) + sizeof(PairCoefficients), stream),
        stream_(stream) {}

  // Enqueues out = a ⊕ b.
  void run(const float* a, const float* b, std::size_t count, float* out) const {
    auto* partials = scratch_.as<double>();
    auto* coefficients = reinterpret_cast<PairCoefficients*>(partials + 3 * blocks_);
    pairDotsKernel<<<detail::cpuOrderGrid(blocks_), kBlockThreads, 0, stream_>>>(a, b, count, blocks_,
                                                                                 partials);
    detail::checkLaunch("pairDotsKernel");
    pairCoefficientsKernel<<<1, 32, 0, stream_>>>(partials, blocks_, coefficients);
    detail::checkLaunch("pairCoefficientsKernel");
    const bool vector = detail::aligned(a, 16) && detail::aligned(b, 16) && detail::aligned(out, 16);
    if (vector) {
      combineKernel<true><<<detail::gridFor(count / 4 + count % 4), kBlockThreads, 0, stream_>>>(
          a, b, count, out, coefficients);
    } else {
      combineKernel<false>
          <<<detail::gridFor(count), kBlockThreads, 0, stream_>>>(a, b, count, out, coefficients);
    }
    detail::checkLaunch("combineKernel");
  }

 private:
  std::size_t blocks_;
  detail::Scratch scratch_;
  cudaStream_t stream_;
};

// cos = a·b / sqrt(|a|²|b|²), clamped (adaptive.cc).

}  // namespace

std::vector<double> adaconsAlpha(Gradients gradients, std::size_t count, double epsilon, Stream stream) {
  detail::requireDevice();
  checkGradients("AdaCons", gradients, count);
  return methods::detail::adaconsAlphaFromStats(gradientStats(gradients, count, detail::toCuda(stream)),
                                                epsilon, nullptr);
}

AdaConsStep adacons(Gradients gradients, std::size_t count, AdaConsState& state,
                    const AdaConsOptions& options, float* out, Stream stream) {
  detail::requireDevice();
  checkGradients("AdaCons", gradients, count);
  if (count > 0 && out == nullptr) fail("AdaCons: null output buffer");
  const cudaStream_t s = detail::toCuda(stream);
  const std::size_t n_grad = gradients.size();
  const GradientStats stats = gradientStats(gradients, count, s);
  AdaConsStep step = methods::detail::adaconsStepFromStats(stats, state, options);
  const std::vector<double> coefficients = methods::detail::adaconsCoefficients(step);
  if (count == 0) return step;

  const std::vector<const void*> pointers = pointersOf(gradients);
  const detail::PointerTableBuilder table(pointers, s);
  const detail::Scratch device_coefficients(n_grad * sizeof(double), s);
  // From pageable memory: staged before the call returns, so `coefficients` may go away.
  detail::check(cudaMemcpyAsync(device_coefficients.as<double>(), coefficients.data(),
                                n_grad * sizeof(double), cudaMemcpyHostToDevice, s),
                "cudaMemcpyAsync (AdaCons coefficients)");
  if (allAligned(gradients, out)) {
    weightedSumKernel<true><<<detail::gridFor(count / 4 + count % 4), kBlockThreads, 0, s>>>(
        table.table(), device_coefficients.as<double>(), count, out);
  } else {
    weightedSumKernel<false><<<detail::gridFor(count), kBlockThreads, 0, s>>>(
        table.table(), device_coefficients.as<double>(), count, out);
  }
  detail::checkLaunch("weightedSumKernel");
  return step;
}

void adasumPair(const float* a, const float* b, std::size_t count, float* out, Stream stream) {
  detail::requireDevice();
  if (count == 0) return;
  if (a == nullptr || b == nullptr || out == nullptr) fail("AdaSum: null buffer");
  const cudaStream_t s = detail::toCuda(stream);
  const PairWorkspace workspace(count, s);
  workspace.run(a, b, count, out);
}

// The per-block partials of adasumPair's a·b, ‖a‖², ‖b‖², added on the host in block order: IEEE fp64
// additions in the same order as adaptive.cc's, so the same bits.
DotProducts dotProducts(const float* a, const float* b, std::size_t count, Stream stream) {
  detail::requireDevice();
  if (count == 0) return {};
  if (a == nullptr || b == nullptr) fail("dotProducts: null buffer");
  const cudaStream_t s = detail::toCuda(stream);
  const std::size_t blocks = (count + kStatsBlock - 1) / kStatsBlock;
  const detail::Scratch partials(3 * blocks * sizeof(double), s);
  pairDotsKernel<<<detail::cpuOrderGrid(blocks), kBlockThreads, 0, s>>>(a, b, count, blocks,
                                                                        partials.as<double>());
  detail::checkLaunch("pairDotsKernel");
  std::vector<double> products(3 * blocks);  // rows of `blocks`: a·b, ‖a‖², ‖b‖²
  detail::check(cudaMemcpyAsync(products.data(), partials.as<double>(), 3 * blocks * sizeof(double),
                                cudaMemcpyDeviceToHost, s),
                "cudaMemcpyAsync");
  detail::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  DotProducts dots;
  for (std::size_t block = 0; block < blocks; ++block) {
    dots.ab += products[block];
    dots.aa += products[blocks + block];
    dots.bb += products[2 * blocks + block];
  }
  return dots;
}

// Each ⊕ is rounded to fp32 (adaptive.cc); out may be one of the gradients: only the last step writes it.
void adasum(Gradients gradients, std::size_t count, float* out, Stream stream) {
  detail::requireDevice();
  checkGradients("AdaSum", gradients, count);
  if (count == 0) return;
  if (out == nullptr) fail("AdaSum: null output buffer");
  const cudaStream_t s = detail::toCuda(stream);
  const std::size_t n_grad = gradients.size();
  if (n_grad == 1) {
    if (out != gradients[0]) {
      detail::check(cudaMemcpyAsync(out, gradients[0], count * sizeof(float), cudaMemcpyDeviceToDevice, s),
                    "cudaMemcpyAsync (AdaSum of one gradient)");
    }
    return;
  }
  std::size_t slot_count = 0;
  const std::vector<methods::detail::TreeStep> steps = methods::detail::treeSteps(n_grad, slot_count);
  // Slots are allocated on first use, in stream order, and freed in stream order at the end.
  std::vector<std::unique_ptr<detail::Scratch>> slots(slot_count);
  const auto slot = [&](std::size_t index) {
    if (!slots[index]) slots[index] = std::make_unique<detail::Scratch>(count * sizeof(float), s);
    return slots[index]->as<float>();
  };
  const PairWorkspace workspace(count, s);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const methods::detail::TreeStep& step = steps[i];
    const bool last = i + 1 == steps.size();
    switch (step.shape) {
      case methods::detail::TreeShape::InputInput:
        workspace.run(gradients[step.a], gradients[step.b], count, last ? out : slot(step.destination));
        break;
      case methods::detail::TreeShape::SlotInput:
        workspace.run(slot(step.a), gradients[step.b], count, last ? out : slot(step.a));
        break;
      case methods::detail::TreeShape::SlotSlot:
        workspace.run(slot(step.a), slot(step.b), count, last ? out : slot(step.b));
        break;
    }
  }
}

ConsensusStats consensusStats(Gradients gradients, std::size_t count, Stream stream) {
  detail::requireDevice();
  if (gradients.empty()) return {};
  checkGradients("consensus statistics", gradients, count);
  return methods::detail::consensusFromStats(gradientStats(gradients, count, detail::toCuda(stream)));
}

}  // namespace gradscope::methods::cuda
