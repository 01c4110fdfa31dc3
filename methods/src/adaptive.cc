// Adaptive aggregators (AdaCons, AdaSum), the mean, and consensus diagnostics on the CPU.
//
// Determinism: every reduction over elements (dot products, norms) runs over fixed blocks of kBlock
// elements whatever the thread count; within a block, element i accumulates into lane i % kLanes; lanes
// are added in lane order, blocks in block order. Results depend only on the inputs, never on the
// executor. The kernels are compiled without floating-point contraction, so the AVX-512, AVX2 and
// baseline clones give the same bits too (an FMA in one clone and not another would not).
//
// Per-element arithmetic is fp64 throughout (g_sum, the weighted aggregate, the mean, AdaSum's
// combination) and is rounded to fp32 once, when the output element is stored.

#include "gradscope/methods/adaptive.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "adaptive_scalars.h"
#include "cpu_kernels.h"
#include "gradscope/common/error.h"
#include "reduction_order.h"

namespace gradscope::methods {
namespace {

using detail::checkGradients;
using detail::cosine;
using detail::GradientStats;

constexpr std::size_t kBlock = detail::kAdaptiveReductionBlock;  // defines the sum order
constexpr std::size_t kLanes = 16;                               // accumulator lanes per block
constexpr std::size_t kSubTile = 512;         // elements per step within a block (the g_sum tile stays in L1)
constexpr std::size_t kPrefetchBytes = 1024;  // software prefetch distance of the streaming passes

// ---- Kernels --------------------------------------------------------------------------------------------
//
// Element-wise passes over N gradients stream all N together, one block of kLanes elements at a time,
// with the fp64 accumulators in registers, and prefetch each stream kPrefetchBytes ahead (the layout
// that keeps the local sums at memcpy speed; see local_sum.cc). Gradients are g[i] + offset.

// s[e - offset] = (g_0[e] + g_1[e]) + ... in fp64.
GS_NO_CONTRACTION GS_CPU_KERNEL void sumKernel(const float* const* g, std::size_t n_grad,
                                               double* GS_RESTRICT s, std::size_t offset, std::size_t n) {
  const std::size_t full = n / kLanes * kLanes;
  for (std::size_t block = 0; block < full; block += kLanes) {
    for (std::size_t i = 0; i < n_grad; ++i) detail::prefetchAhead(g[i] + offset + block, kPrefetchBytes);
    double acc[kLanes];
    const float* g0 = g[0] + offset + block;
    for (std::size_t j = 0; j < kLanes; ++j) acc[j] = static_cast<double>(g0[j]);
    for (std::size_t i = 1; i < n_grad; ++i) {
      const float* x = g[i] + offset + block;
      for (std::size_t j = 0; j < kLanes; ++j) acc[j] = acc[j] + static_cast<double>(x[j]);
    }
    for (std::size_t j = 0; j < kLanes; ++j) s[block + j] = acc[j];
  }
  for (std::size_t e = full; e < n; ++e) {
    double acc = static_cast<double>(g[0][offset + e]);
    for (std::size_t i = 1; i < n_grad; ++i) acc = acc + static_cast<double>(g[i][offset + e]);
    s[e] = acc;
  }
}

// dot[lane] += s·g, squares[lane] += g·g
GS_NO_CONTRACTION GS_CPU_KERNEL void dotLanesKernel(const double* GS_RESTRICT s, const float* GS_RESTRICT g,
                                                    std::size_t n, double* GS_RESTRICT dot,
                                                    double* GS_RESTRICT squares) {
  const std::size_t full = n / kLanes * kLanes;
  for (std::size_t i = 0; i < full; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) {
      const double x = static_cast<double>(g[i + j]);
      dot[j] += s[i + j] * x;
      squares[j] += x * x;
    }
  for (std::size_t i = full; i < n; ++i) {
    const double x = static_cast<double>(g[i]);
    dot[i - full] += s[i] * x;
    squares[i - full] += x * x;
  }
}

// squares[lane] += s·s
GS_NO_CONTRACTION GS_CPU_KERNEL void squareLanesKernel(const double* GS_RESTRICT s, std::size_t n,
                                                       double* GS_RESTRICT squares) {
  const std::size_t full = n / kLanes * kLanes;
  for (std::size_t i = 0; i < full; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) squares[j] += s[i + j] * s[i + j];
  for (std::size_t i = full; i < n; ++i) squares[i - full] += s[i] * s[i];
}

// ab[lane] += a·b, aa[lane] += a·a, bb[lane] += b·b
GS_NO_CONTRACTION GS_CPU_KERNEL void pairDotLanesKernel(const float* GS_RESTRICT a,
                                                        const float* GS_RESTRICT b, std::size_t n,
                                                        double* GS_RESTRICT ab, double* GS_RESTRICT aa,
                                                        double* GS_RESTRICT bb) {
  const std::size_t full = n / kLanes * kLanes;
  for (std::size_t i = 0; i < full; i += kLanes) {
    detail::prefetchAhead(a + i, kPrefetchBytes);
    detail::prefetchAhead(b + i, kPrefetchBytes);
    for (std::size_t j = 0; j < kLanes; ++j) {
      const double x = static_cast<double>(a[i + j]);
      const double y = static_cast<double>(b[i + j]);
      ab[j] += x * y;
      aa[j] += x * x;
      bb[j] += y * y;
    }
  }
  for (std::size_t i = full; i < n; ++i) {
    const double x = static_cast<double>(a[i]);
    const double y = static_cast<double>(b[i]);
    ab[i - full] += x * y;
    aa[i - full] += x * x;
    bb[i - full] += y * y;
  }
}

// out[i] = in[i] · factor (out may be in: no restrict, GCC checks the overlap once and vectorises).
GS_CPU_KERNEL void scaleKernel(const float* in, std::size_t n, float factor, float* out) {
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    detail::prefetchAhead(in + i, kPrefetchBytes);
    detail::prefetchForWrite(out + i, kPrefetchBytes);
    for (std::size_t j = 0; j < kLanes; ++j) out[i + j] = in[i + j] * factor;
  }
  for (; i < n; ++i) out[i] = in[i] * factor;
}

// out[e] = fp32(((c_0·g_0[e] + c_1·g_1[e]) + c_2·g_2[e]) + ...)
GS_NO_CONTRACTION GS_CPU_KERNEL void weightedSumKernel(const float* const* g, const double* c,
                                                       std::size_t n_grad, float* out, std::size_t offset,
                                                       std::size_t n) {
  const std::size_t full_end = offset + n / kLanes * kLanes;
  for (std::size_t block = offset; block < full_end; block += kLanes) {
    for (std::size_t i = 0; i < n_grad; ++i) detail::prefetchAhead(g[i] + block, kPrefetchBytes);
    double acc[kLanes];
    const float* g0 = g[0] + block;
    for (std::size_t j = 0; j < kLanes; ++j) acc[j] = c[0] * static_cast<double>(g0[j]);
    for (std::size_t i = 1; i < n_grad; ++i) {
      const float* x = g[i] + block;
      const double ci = c[i];
      for (std::size_t j = 0; j < kLanes; ++j) acc[j] = acc[j] + ci * static_cast<double>(x[j]);
    }
    for (std::size_t j = 0; j < kLanes; ++j) out[block + j] = static_cast<float>(acc[j]);
  }
  for (std::size_t e = full_end; e < offset + n; ++e) {
    double acc = c[0] * static_cast<double>(g[0][e]);
    for (std::size_t i = 1; i < n_grad; ++i) acc = acc + c[i] * static_cast<double>(g[i][e]);
    out[e] = static_cast<float>(acc);
  }
}

// out[e] = fp32(((g_0[e] + g_1[e]) + ...) / N), the sum in fp64.
GS_NO_CONTRACTION GS_CPU_KERNEL void meanKernel(const float* const* g, std::size_t n_grad, float* out,
                                                std::size_t offset, std::size_t n) {
  const auto divisor = static_cast<double>(n_grad);
  const std::size_t full_end = offset + n / kLanes * kLanes;
  for (std::size_t block = offset; block < full_end; block += kLanes) {
    for (std::size_t i = 0; i < n_grad; ++i) detail::prefetchAhead(g[i] + block, kPrefetchBytes);
    double acc[kLanes];
    const float* g0 = g[0] + block;
    for (std::size_t j = 0; j < kLanes; ++j) acc[j] = static_cast<double>(g0[j]);
    for (std::size_t i = 1; i < n_grad; ++i) {
      const float* x = g[i] + block;
      for (std::size_t j = 0; j < kLanes; ++j) acc[j] = acc[j] + static_cast<double>(x[j]);
    }
    for (std::size_t j = 0; j < kLanes; ++j) acc[j] = acc[j] / divisor;
    for (std::size_t j = 0; j < kLanes; ++j) out[block + j] = static_cast<float>(acc[j]);
  }
  for (std::size_t e = full_end; e < offset + n; ++e) {
    double acc = static_cast<double>(g[0][e]);
    for (std::size_t i = 1; i < n_grad; ++i) acc = acc + static_cast<double>(g[i][e]);
    out[e] = static_cast<float>(acc / divisor);
  }
}

// out = fp32(ca·a + cb·b)
GS_NO_CONTRACTION GS_CPU_KERNEL void combineKernel(float* GS_RESTRICT out, const float* GS_RESTRICT a,
                                                   const float* GS_RESTRICT b, double ca, double cb,
                                                   std::size_t n) {
  for (std::size_t i = 0; i < n / kLanes * kLanes; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j)
      out[i + j] =
          static_cast<float>(ca * static_cast<double>(a[i + j]) + cb * static_cast<double>(b[i + j]));
  for (std::size_t i = n / kLanes * kLanes; i < n; ++i)
    out[i] = static_cast<float>(ca * static_cast<double>(a[i]) + cb * static_cast<double>(b[i]));
}

// a = fp32(ca·a + cb·b): the in-place form of combineKernel (the same bits: + is commutative).
GS_NO_CONTRACTION GS_CPU_KERNEL void combineInPlaceKernel(float* GS_RESTRICT a, const float* GS_RESTRICT b,
                                                          double ca, double cb, std::size_t n) {
  for (std::size_t i = 0; i < n / kLanes * kLanes; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j)
      a[i + j] = static_cast<float>(ca * static_cast<double>(a[i + j]) + cb * static_cast<double>(b[i + j]));
  for (std::size_t i = n / kLanes * kLanes; i < n; ++i)
    a[i] = static_cast<float>(ca * static_cast<double>(a[i]) + cb * static_cast<double>(b[i]));
}

double sumLanes(const std::array<double, kLanes>& lanes) {
  double sum = 0;
  for (double lane : lanes) sum += lane;
  return sum;
}

std::size_t blockCount(std::size_t count) {
  return (count + kBlock - 1) / kBlock;
}

// ---- Statistics shared by AdaCons and the consensus diagnostics -------------------------------------------

// One pass over the gradients: per block, g_sum in fp64 (g_0 + g_1 + ... in index order), then its
// dot product with each g_i, each ‖g_i‖² and ‖g_sum‖². A block is processed in sub-tiles of kSubTile
// elements so that g_sum and the gradients' sub-tiles stay in L1 between the passes; the lanes carry
// on across sub-tiles, so the sums are the same as over the whole block at once.
GradientStats gradientStats(Gradients gradients, std::size_t count, CpuExecutor& executor) {
  const std::size_t n_grad = gradients.size();
  const std::size_t blocks = blockCount(count);
  const std::size_t stride = 2 * n_grad + 1;
  std::vector<double> partials(blocks * stride);
  // Lanes per block: dot products and squares of each gradient, then the squares of g_sum.
  std::vector<double> lane_scratch(static_cast<std::size_t>(executor.threads()) * stride * kLanes);
  std::atomic<std::size_t> next_scratch{0};
  executor.parallelFor(blocks, kBlock * n_grad * sizeof(float), 1, [&](std::size_t begin, std::size_t end) {
    double* lanes = &lane_scratch[(next_scratch.fetch_add(1) % static_cast<std::size_t>(executor.threads())) *
                                  stride * kLanes];
    std::array<double, kSubTile> sum;
    for (std::size_t block = begin; block < end; ++block) {
      const std::size_t first = block * kBlock;
      const std::size_t block_end = std::min(first + kBlock, count);
      std::fill_n(lanes, stride * kLanes, 0.0);
      for (std::size_t tile = first; tile < block_end; tile += kSubTile) {
        const std::size_t n = std::min(kSubTile, block_end - tile);
        sumKernel(gradients.data(), n_grad, sum.data(), tile, n);
        for (std::size_t i = 0; i < n_grad; ++i)
          dotLanesKernel(sum.data(), gradients[i] + tile, n, lanes + i * kLanes,
                         lanes + (n_grad + i) * kLanes);
        squareLanesKernel(sum.data(), n, lanes + 2 * n_grad * kLanes);
      }
      double* partial = &partials[block * stride];
      for (std::size_t q = 0; q < stride; ++q) {
        double total = 0;
        for (std::size_t lane = 0; lane < kLanes; ++lane) total += lanes[q * kLanes + lane];
        partial[q] = total;
      }
    }
  });
  GradientStats stats;
  stats.dots.assign(n_grad, 0.0);
  stats.squares.assign(n_grad, 0.0);
  for (std::size_t block = 0; block < blocks; ++block) {
    const double* partial = &partials[block * stride];
    for (std::size_t i = 0; i < n_grad; ++i) {
      stats.dots[i] += partial[i];
      stats.squares[i] += partial[n_grad + i];
    }
    stats.sum_squares += partial[2 * n_grad];
  }
  return stats;
}

// cos = a·b / sqrt(|a|²|b|²), clamped to [-1, 1]; sqrt of the product (not the product of square roots)
// makes parallel vectors come out exactly 1.

// ---- AdaCons weights
// ---------------------------------------------------------------------------------------

// m ← β·m + (1−β)·sorted, as two roundings per term (no contraction: the same on every machine).
GS_NO_CONTRACTION void updateMomentum(std::vector<double>& momentum, const std::vector<double>& sorted,
                                      double beta) {
  for (std::size_t k = 0; k < sorted.size(); ++k) momentum[k] = beta * momentum[k] + (1.0 - beta) * sorted[k];
}

// ---- AdaSum in the tree order
// ------------------------------------------------------------------------------

}  // namespace

// ---- Mean
// ----------------------------------------------------------------------------------------------------

// out_e = fp32((g_0[e] + g_1[e] + ... ) / N), the sum in fp64 in index order, divided (not multiplied by
// 1/N, which is inexact for N not a power of two) and rounded once.
void scale(const float* in, std::size_t count, float factor, float* out, CpuExecutor& executor) {
  if (count == 0) return;
  if (in == nullptr || out == nullptr) fail("scale: null buffer");
  executor.parallelFor(count, 2 * sizeof(float), kLanes, [&](std::size_t begin, std::size_t end) {
    scaleKernel(in + begin, end - begin, factor, out + begin);
  });
}

void mean(Gradients gradients, std::size_t count, float* out, CpuExecutor& executor) {
  checkGradients("mean", gradients, count);
  if (count == 0) return;
  if (out == nullptr) fail("mean: null output buffer");
  const std::size_t n_grad = gradients.size();
  executor.parallelFor(count, (n_grad + 1) * sizeof(float), kLanes, [&](std::size_t begin, std::size_t end) {
    meanKernel(gradients.data(), n_grad, out, begin, end - begin);
  });
}

// ---- AdaCons
// -------------------------------------------------------------------------------------------------

AdaConsStep adaconsWeights(std::span<const double> alpha, AdaConsState& state,
                           const AdaConsOptions& options) {
  const std::size_t n = alpha.size();
  if (n == 0) fail("AdaCons: no ranks (N = 0)");
  if (!state.sorted_momentum.empty() && state.sorted_momentum.size() != n)
    fail(
        "AdaCons: the momentum state holds {} ranks but this step has {}; use one state per tensor and world "
        "size",
        state.sorted_momentum.size(), n);

  // Sort ascending, stably (ties keep rank order, so every rank computes the same permutation); NaN
  // sorts last so the order stays a strict weak order.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return !std::isnan(alpha[x]) && (std::isnan(alpha[y]) || alpha[x] < alpha[y]);
  });
  std::vector<double> sorted(n);
  for (std::size_t k = 0; k < n; ++k) sorted[k] = alpha[order[k]];

  std::vector<double> momentum = state.sorted_momentum;
  if (momentum.empty()) momentum = sorted;  // the first step starts the average at the first sorted vector
  else updateMomentum(momentum, sorted, options.beta);

  // Back to ranks with the inverse permutation: sorted position k came from rank order[k], so rank
  // order[k] gets momentum[k]. (Indexing momentum by order[k] instead, as the published sample does,
  // is only the same when the permutation is its own inverse.)
  AdaConsStep step;
  step.alpha.assign(alpha.begin(), alpha.end());
  step.smoothed.assign(n, 0.0);
  for (std::size_t k = 0; k < n; ++k) step.smoothed[order[k]] = momentum[k];
  double total = 0;
  for (double value : step.smoothed) total += value;
  if (total == 0 || !std::isfinite(total))
    fail(
        "AdaCons: the smoothed weights sum to {} (all gradients zero or orthogonal to their sum, or not "
        "finite); "
        "the step cannot be normalised",
        total);
  step.weights.resize(n);
  for (std::size_t i = 0; i < n; ++i) step.weights[i] = step.smoothed[i] / total;
  state.sorted_momentum = std::move(momentum);  // only once the step is known to be good
  return step;
}

AdaConsStep adacons(Gradients gradients, std::size_t count, AdaConsState& state,
                    const AdaConsOptions& options, float* out, CpuExecutor& executor) {
  checkGradients("AdaCons", gradients, count);
  if (count > 0 && out == nullptr) fail("AdaCons: null output buffer");
  const std::size_t n_grad = gradients.size();
  const GradientStats stats = gradientStats(gradients, count, executor);
  AdaConsStep step = detail::adaconsStepFromStats(stats, state, options);
  const std::vector<double> coefficient = detail::adaconsCoefficients(step);
  if (count == 0) return step;
  executor.parallelFor(count, (n_grad + 1) * sizeof(float), kLanes, [&](std::size_t begin, std::size_t end) {
    weightedSumKernel(gradients.data(), coefficient.data(), n_grad, out, begin, end - begin);
  });
  return step;
}

// ---- AdaSum
// --------------------------------------------------------------------------------------------------

namespace {

// a·b, ‖a‖², ‖b‖² in the block order of this file: the one definition of AdaSum's dot products and of
// dotProducts() below, so a distributed AdaSum that computes them piecewise gets the same bits.
DotProducts pairDots(const float* a, const float* b, std::size_t count, CpuExecutor& executor) {
  const std::size_t blocks = blockCount(count);
  std::vector<std::array<double, 3>> partials(blocks);
  executor.parallelFor(blocks, kBlock * 2 * sizeof(float), 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t block = begin; block < end; ++block) {
      const std::size_t first = block * kBlock;
      std::array<double, kLanes> ab{}, aa{}, bb{};
      pairDotLanesKernel(a + first, b + first, std::min(kBlock, count - first), ab.data(), aa.data(),
                         bb.data());
      partials[block] = {sumLanes(ab), sumLanes(aa), sumLanes(bb)};
    }
  });
  DotProducts dots;
  for (const auto& partial : partials) {
    dots.ab += partial[0];
    dots.aa += partial[1];
    dots.bb += partial[2];
  }
  return dots;
}

}  // namespace

DotProducts dotProducts(const float* a, const float* b, std::size_t count, CpuExecutor& executor) {
  if (count == 0) return {};
  if (a == nullptr || b == nullptr) fail("dotProducts: null buffer");
  return pairDots(a, b, count, executor);
}

// out may be a or b (in place); other overlaps are not supported.
void adasumPair(const float* a, const float* b, std::size_t count, float* out, CpuExecutor& executor) {
  if (count == 0) return;
  if (a == nullptr || b == nullptr || out == nullptr) fail("AdaSum: null buffer");
  const auto [ab, aa, bb] = pairDots(a, b, count, executor);
  // A zero vector is the identity (the formula would divide by zero).
  if (aa == 0 || bb == 0) {
    const float* other = aa == 0 ? b : a;
    if (out != other) std::memmove(out, other, count * sizeof(float));
    return;
  }
  const double ca = 1.0 - ab / (2.0 * aa);
  const double cb = 1.0 - ab / (2.0 * bb);
  executor.parallelFor(count, 3 * sizeof(float), kLanes, [&](std::size_t begin, std::size_t end) {
    const std::size_t n = end - begin;
    if (out == a) combineInPlaceKernel(out + begin, b + begin, ca, cb, n);
    else if (out == b) combineInPlaceKernel(out + begin, a + begin, cb, ca, n);
    else combineKernel(out + begin, a + begin, b + begin, ca, cb, n);
  });
}

// Each ⊕ is rounded to fp32 (as the distributed form exchanges fp32 vectors). out may be one of the
// gradients: it is written only by the last step.
void adasum(Gradients gradients, std::size_t count, float* out, CpuExecutor& executor) {
  checkGradients("AdaSum", gradients, count);
  if (count == 0) return;
  if (out == nullptr) fail("AdaSum: null output buffer");
  const std::size_t n_grad = gradients.size();
  if (n_grad == 1) {
    if (out != gradients[0]) std::memmove(out, gradients[0], count * sizeof(float));
    return;
  }
  std::size_t slot_count = 0;
  const std::vector<detail::TreeStep> steps = detail::treeSteps(n_grad, slot_count);
  // Partial results, allocated when first needed and not zero-filled (every element is written first).
  std::vector<std::unique_ptr<float[]>> slots(slot_count);
  const auto slot = [&](std::size_t index) {
    if (!slots[index]) slots[index] = std::make_unique_for_overwrite<float[]>(count);
    return slots[index].get();
  };
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const detail::TreeStep& step = steps[s];
    const bool last = s + 1 == steps.size();
    switch (step.shape) {
      case detail::TreeShape::InputInput:
        adasumPair(gradients[step.a], gradients[step.b], count, last ? out : slot(step.destination),
                   executor);
        break;
      case detail::TreeShape::SlotInput:
        adasumPair(slot(step.a), gradients[step.b], count, last ? out : slot(step.a), executor);
        break;
      case detail::TreeShape::SlotSlot:
        adasumPair(slot(step.a), slot(step.b), count, last ? out : slot(step.b), executor);
        break;
    }
  }
}

// ---- Consensus diagnostics
// -----------------------------------------------------------------------------------

ConsensusStats consensusStats(Gradients gradients, std::size_t count, CpuExecutor& executor) {
  if (gradients.empty()) return {};
  checkGradients("consensus statistics", gradients, count);
  return detail::consensusFromStats(gradientStats(gradients, count, executor));
}

}  // namespace gradscope::methods
