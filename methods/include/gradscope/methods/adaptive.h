#pragma once

// Adaptive aggregators as math on N gradient vectors g_0..g_{N-1} (fp32, `count` elements each). The
// distributed strategies compute the same quantities with collectives and call the scalar parts here.
// All dot products and norms accumulate in fp64.

#include <cstddef>
#include <span>
#include <vector>

#include "gradscope/methods/cpu_executor.h"

namespace gradscope::methods {

using Gradients = std::span<const float* const>;

// out = in · factor in fp32 (out may be in): each rank's weighting before a weighted all-reduce.
void scale(const float* in, std::size_t count, float factor, float* out,
           CpuExecutor& executor = CpuExecutor::shared());

// out = (1/N) Σ g_i.
void mean(Gradients gradients, std::size_t count, float* out, CpuExecutor& executor = CpuExecutor::shared());

// ---- AdaCons (Choukroun, Azoulay, Kisilev, arXiv 2411.03742) -----------------------------------------
//
// α_i = ⟨g_sum, g_i⟩ / (‖g_i‖ + ε) / N with g_sum = Σ g_j. The α are sorted ascending; an exponential
// moving average with momentum β is kept over the *sorted* vector (m ← β·m + (1−β)·sorted, m starts at
// the first sorted vector); the smoothed values are mapped back to ranks with the *inverse* of the sort
// permutation (rank p[k] gets m[k] when sorted[k] = α[p[k]]): the published sample indexes with the
// permutation itself, which is only right when the permutation is its own inverse. Weights
// w_i = α̃_i / Σ α̃; the aggregate is Σ w_i · g_i / ‖g_i‖ (zero-norm gradients contribute nothing).
// Scale: the paper's aggregate is a weighted mean of unit vectors; AdaConsScale::MatchSumNorm multiplies
// it by ‖Σ g_i‖ so it can replace a sum in a job that expects one (apply mode), MatchMeanNorm by
// ‖Σ g_i‖/N.

enum class AdaConsScale { Paper, MatchSumNorm, MatchMeanNorm };

struct AdaConsOptions {
  double beta = 0.9;      // momentum of the sorted-α moving average
  double epsilon = 1e-8;  // added to ‖g_i‖ in α_i
  AdaConsScale scale = AdaConsScale::Paper;
};

// Momentum state carried across steps (one per tensor or bucket).
struct AdaConsState {
  std::vector<double> sorted_momentum;  // empty until the first step
};

struct AdaConsStep {
  std::vector<double> alpha;     // raw α_i, by rank
  std::vector<double> smoothed;  // α̃_i after momentum and the inverse permutation, by rank
  std::vector<double> weights;   // α̃_i / Σ α̃
  std::vector<double> norms;     // ‖g_i‖
  double scale = 1;              // factor applied to Σ w_i g_i/‖g_i‖
};

// The scalar part from per-rank α (what ranks all-gather): sort, momentum, inverse permutation,
// normalisation. Updates `state`. Throws gradscope::Error when Σ α̃ is 0 or not finite.
AdaConsStep adaconsWeights(std::span<const double> alpha, AdaConsState& state, const AdaConsOptions& options);

// The whole step on local vectors: α from the gradients, weights, and the aggregate into `out`.
AdaConsStep adacons(Gradients gradients, std::size_t count, AdaConsState& state,
                    const AdaConsOptions& options, float* out, CpuExecutor& executor = CpuExecutor::shared());

// ---- AdaSum (Maleki et al.) ----------------------------------------------------------------------------
//
// a ⊕ b = (1 − a·b / (2‖a‖²))·a + (1 − a·b / (2‖b‖²))·b, dot products in fp64; a zero vector is the
// identity (0 ⊕ b = b). Equals a + b for orthogonal inputs and a for a = b (the average of equal inputs).
void adasumPair(const float* a, const float* b, std::size_t count, float* out,
                CpuExecutor& executor = CpuExecutor::shared());

// a·b, ‖a‖² and ‖b‖² in fp64, in one pass and in the order adasumPair uses (dotProducts(a, a).ab has
// the bits of ‖a‖²): for distributed forms that compute those products piecewise. Zeros for count 0.
struct DotProducts {
  double ab = 0, aa = 0, bb = 0;
};
DotProducts dotProducts(const float* a, const float* b, std::size_t count,
                        CpuExecutor& executor = CpuExecutor::shared());

// The recursive form over N vectors, combined in the Tree order of local_sum.h (pairs, then pairs of
// pairs; for N not a power of two the leftover partials are combined smallest first).
void adasum(Gradients gradients, std::size_t count, float* out,
            CpuExecutor& executor = CpuExecutor::shared());

// ---- Consensus diagnostics -------------------------------------------------------------------------------

struct ConsensusStats {
  std::vector<double> norms;           // ‖g_i‖
  std::vector<double> cosine_to_mean;  // cos(g_i, mean); 0 when either is zero
  double diversity = 0;  // Σ‖g_i‖² / ‖Σ g_i‖² (Inf when the sum is zero and a g_i is not)
};

ConsensusStats consensusStats(Gradients gradients, std::size_t count,
                              CpuExecutor& executor = CpuExecutor::shared());

}  // namespace gradscope::methods
