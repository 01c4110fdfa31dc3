#pragma once

// Internal: the host-side scalar parts of the adaptive aggregators, shared by the CPU (adaptive.cc) and
// CUDA (cuda/adaptive.cu) implementations. Both compute the same fp64 sums over the gradients
// (GradientStats, in the order of reduction_order.h) and finish here, so the scalar results agree.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "gradscope/common/error.h"
#include "gradscope/methods/adaptive.h"

namespace gradscope::methods::detail {

// fp64 sums over N gradients g_i and their sum g_sum.
struct GradientStats {
  std::vector<double> dots;     // ⟨g_sum, g_i⟩
  std::vector<double> squares;  // ‖g_i‖²
  double sum_squares = 0;       // ‖g_sum‖²
};

inline void checkGradients(const char* what, Gradients gradients, std::size_t count) {
  if (gradients.empty()) fail("{}: no gradients (N = 0)", what);
  if (gradients.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    fail("{}: too many gradients", what);
  if (count == 0) return;
  for (std::size_t i = 0; i < gradients.size(); ++i)
    if (gradients[i] == nullptr) fail("{}: gradient {} is a null buffer", what, i);
}

// cos = a·b / sqrt(|a|²|b|²), 0 when either is zero, clamped to [-1, 1].
inline double cosine(double dot, double squares_a, double squares_b) {
  if (squares_a == 0 || squares_b == 0) return 0;
  double norms = std::sqrt(squares_a * squares_b);
  if (!std::isfinite(norms) || norms == 0) norms = std::sqrt(squares_a) * std::sqrt(squares_b);
  return std::clamp(dot / norms, -1.0, 1.0);
}

// α_i = ⟨g_sum, g_i⟩ / (‖g_i‖ + ε) / N; the norms ‖g_i‖ go to `norms` when given.
inline std::vector<double> adaconsAlphaFromStats(const GradientStats& stats, double epsilon,
                                                 std::vector<double>* norms) {
  const std::size_t n = stats.dots.size();
  const auto ranks = static_cast<double>(n);
  std::vector<double> alpha(n), norm(n);
  for (std::size_t i = 0; i < n; ++i) {
    norm[i] = std::sqrt(stats.squares[i]);
    alpha[i] = stats.dots[i] / (norm[i] + epsilon) / ranks;
  }
  if (norms != nullptr) *norms = std::move(norm);
  return alpha;
}

// The AdaCons step from the sums: α, weights (adaconsWeights, which updates `state`), norms and scale.
inline AdaConsStep adaconsStepFromStats(const GradientStats& stats, AdaConsState& state,
                                        const AdaConsOptions& options) {
  std::vector<double> norms;
  const std::vector<double> alpha = adaconsAlphaFromStats(stats, options.epsilon, &norms);
  AdaConsStep step = adaconsWeights(alpha, state, options);
  step.norms = std::move(norms);
  const auto ranks = static_cast<double>(stats.dots.size());
  switch (options.scale) {
    case AdaConsScale::Paper: step.scale = 1; break;
    case AdaConsScale::MatchSumNorm: step.scale = std::sqrt(stats.sum_squares); break;
    case AdaConsScale::MatchMeanNorm: step.scale = std::sqrt(stats.sum_squares) / ranks; break;
  }
  return step;
}

// c_i = scale·(w_i / ‖g_i‖), 0 for a zero gradient: out_e = fp32(Σ_i c_i·g_i[e]) in fp64, rank order.
inline std::vector<double> adaconsCoefficients(const AdaConsStep& step) {
  std::vector<double> coefficients(step.weights.size(), 0.0);
  for (std::size_t i = 0; i < coefficients.size(); ++i)
    if (step.norms[i] > 0) coefficients[i] = step.scale * (step.weights[i] / step.norms[i]);
  return coefficients;
}

inline ConsensusStats consensusFromStats(const GradientStats& stats) {
  ConsensusStats result;
  double total_squares = 0;
  for (std::size_t i = 0; i < stats.squares.size(); ++i) {
    result.norms.push_back(std::sqrt(stats.squares[i]));
    // cos(g_i, mean) = cos(g_i, g_sum): the mean is g_sum scaled by 1/N > 0.
    result.cosine_to_mean.push_back(cosine(stats.dots[i], stats.squares[i], stats.sum_squares));
    total_squares += stats.squares[i];
  }
  if (stats.sum_squares == 0)
    result.diversity = total_squares == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  else result.diversity = total_squares / stats.sum_squares;
  return result;
}

}  // namespace gradscope::methods::detail
