// Adaptive aggregators: AdaCons against a plain fp64 reference (own sort, momentum over the sorted α,
// the inverse-permutation mapping), AdaSum's identities and recursive tree order, the mean, and the
// consensus diagnostics.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/common/error.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/numeric.h"

namespace gradscope::methods {
namespace {

using Vectors = std::vector<std::vector<float>>;
using Sizes = std::initializer_list<std::size_t>;

std::vector<const float*> pointers(const Vectors& vectors) {
  std::vector<const float*> result;
  for (const auto& v : vectors) result.push_back(v.data());
  return result;
}

Vectors randomGradients(std::size_t n, std::size_t count, std::uint32_t seed, double mean = 0.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> value(mean, 1.0);
  Vectors g(n, std::vector<float>(count));
  for (auto& v : g)
    for (float& x : v) x = static_cast<float>(value(rng));
  return g;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Relative closeness of doubles computed with different (but fixed) summation orders.
void expectClose(double actual, double expected, double relative, const char* what) {
  EXPECT_LE(std::fabs(actual - expected), relative * std::fabs(expected) + 1e-300)
      << what << ": " << actual << " vs " << expected;
}

// ---- The fp64 reference of AdaCons (naive loops, written from the paper's description) -------------------

struct Reference {
  std::vector<double> alpha, smoothed, weights, norms;
  double sum_norm = 0;  // ‖Σ g_i‖
};

std::vector<double> referenceAlpha(const Vectors& g, double epsilon, std::vector<double>* norms,
                                   double* sum_norm) {
  const std::size_t n = g.size(), count = g[0].size();
  std::vector<double> sum(count, 0.0);
  for (const auto& v : g)
    for (std::size_t e = 0; e < count; ++e) sum[e] += static_cast<double>(v[e]);
  std::vector<double> alpha(n);
  norms->assign(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    double dot = 0, squares = 0;
    for (std::size_t e = 0; e < count; ++e) {
      dot += sum[e] * static_cast<double>(g[i][e]);
      squares += static_cast<double>(g[i][e]) * static_cast<double>(g[i][e]);
    }
    (*norms)[i] = std::sqrt(squares);
    alpha[i] = dot / ((*norms)[i] + epsilon) / static_cast<double>(n);
  }
  double sum_squares = 0;
  for (double s : sum) sum_squares += s * s;
  *sum_norm = std::sqrt(sum_squares);
  return alpha;
}

// Insertion sort of rank indices by (α, rank): ascending, ties in rank order.
std::vector<std::size_t> sortPermutation(const std::vector<double>& alpha) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < alpha.size(); ++i) {
    std::size_t at = order.size();
    while (at > 0 && alpha[order[at - 1]] > alpha[i]) --at;
    order.insert(order.begin() + static_cast<long>(at), i);
  }
  return order;
}

// One step of the weights. `inverse` = true is the documented mapping (rank order[k] gets m[k]);
// false is the published sample's (rank k gets m[order[k]]).
Reference referenceWeights(const std::vector<double>& alpha, std::vector<double>& momentum, double beta,
                           bool inverse = true) {
  const std::size_t n = alpha.size();
  const std::vector<std::size_t> order = sortPermutation(alpha);
  std::vector<double> sorted(n);
  for (std::size_t k = 0; k < n; ++k) sorted[k] = alpha[order[k]];
  if (momentum.empty()) {
    momentum = sorted;
  } else {
    for (std::size_t k = 0; k < n; ++k) momentum[k] = beta * momentum[k] + (1 - beta) * sorted[k];
  }
  Reference r;
  r.alpha = alpha;
  r.smoothed.assign(n, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    if (inverse) r.smoothed[order[k]] = momentum[k];
    else r.smoothed[k] = momentum[order[k]];
  }
  double total = 0;
  for (double s : r.smoothed) total += s;
  for (double s : r.smoothed) r.weights.push_back(s / total);
  return r;
}

std::vector<double> referenceAggregate(const Vectors& g, const Reference& r, double scale) {
  const std::size_t count = g[0].size();
  std::vector<double> out(count, 0.0);
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (r.norms[i] == 0) continue;
    for (std::size_t e = 0; e < count; ++e)
      out[e] += r.weights[i] * static_cast<double>(g[i][e]) / r.norms[i] * scale;
  }
  return out;
}

// out (fp32) within an fp32 rounding of the fp64 reference, plus room for the different fp64 orders.
void expectNearReference(const std::vector<float>& out, const std::vector<double>& reference,
                         const char* what) {
  double scale = 0;
  for (double r : reference) scale = std::max(scale, std::fabs(r));
  std::size_t wrong = 0;
  for (std::size_t e = 0; e < out.size(); ++e) {
    const double tolerance = std::ldexp(std::fabs(reference[e]), -23) + 1e-12 * scale;
    if (std::fabs(static_cast<double>(out[e]) - reference[e]) > tolerance && wrong++ < 3)
      ADD_FAILURE() << what << " element " << e << ": " << out[e] << " vs " << reference[e];
  }
  EXPECT_EQ(wrong, 0u) << what;
}

// ---- AdaCons
// ------------------------------------------------------------------------------------------------

TEST(AdaCons, MatchesTheFp64ReferenceOverSeveralSteps) {
  for (std::size_t n : Sizes{1, 2, 3, 5, 8}) {
    const std::size_t count = 10'007;
    AdaConsState state;
    std::vector<double> momentum;  // the reference's state
    AdaConsOptions options;
    options.beta = 0.8;
    for (std::uint32_t step = 0; step < 5; ++step) {
      // A shared direction plus noise: α positive, and its order changes from step to step.
      const Vectors g = randomGradients(n, count, 100 * static_cast<std::uint32_t>(n) + step, 0.3);
      std::vector<float> out(count);
      const AdaConsStep got = adacons(pointers(g), count, state, options, out.data());
      Reference r;
      const std::vector<double> alpha = referenceAlpha(g, options.epsilon, &r.norms, &r.sum_norm);
      const std::vector<double> norms = r.norms;
      r = referenceWeights(alpha, momentum, options.beta);
      r.norms = norms;
      ASSERT_EQ(got.alpha.size(), n);
      for (std::size_t i = 0; i < n; ++i) {
        expectClose(got.alpha[i], r.alpha[i], 1e-12, "alpha");
        expectClose(got.smoothed[i], r.smoothed[i], 1e-12, "smoothed");
        expectClose(got.weights[i], r.weights[i], 1e-11, "weight");
        expectClose(got.norms[i], r.norms[i], 1e-12, "norm");
      }
      EXPECT_EQ(got.scale, 1.0);
      expectNearReference(out, referenceAggregate(g, r, 1.0), "AdaCons aggregate");
      ASSERT_EQ(state.sorted_momentum.size(), n);
      for (std::size_t k = 0; k < n; ++k)
        expectClose(state.sorted_momentum[k], momentum[k], 1e-12, "momentum");
    }
  }
}

TEST(AdaCons, WeightsSumToOne) {
  AdaConsState state;
  const Vectors g = randomGradients(7, 5000, 3, 0.5);
  std::vector<float> out(5000);
  const AdaConsStep step = adacons(pointers(g), 5000, state, {}, out.data());
  double total = 0;
  for (double w : step.weights) total += w;
  EXPECT_NEAR(total, 1.0, 1e-14);
}

// The momentum is kept over the sorted α and mapped back with the inverse of the sort permutation. With
// α whose sorting permutation is a 3-cycle (not its own inverse), indexing with the permutation itself
// gives other weights: the check below would catch that mistake.
TEST(AdaCons, MomentumMapsBackWithTheInversePermutation) {
  // Step 1 sorts as the identity; steps 2 and 3 need a 3-cycle (α = [2, 3, 1]: sorted position 0 holds
  // rank 2, 1 holds rank 0, 2 holds rank 1) and its inverse (α = [3, 1, 2]).
  const std::vector<std::vector<double>> steps = {{1, 2, 4}, {2, 3, 1}, {3, 1, 2}, {5, 1, 2}};
  AdaConsOptions options;
  options.beta = 0.5;
  AdaConsState state;
  std::vector<double> momentum, wrong_momentum;
  bool told_apart = false;
  for (const auto& alpha : steps) {
    const AdaConsStep got = adaconsWeights(alpha, state, options);
    const Reference right = referenceWeights(alpha, momentum, options.beta, /*inverse=*/true);
    const Reference wrong = referenceWeights(alpha, wrong_momentum, options.beta, /*inverse=*/false);
    for (std::size_t i = 0; i < alpha.size(); ++i) {
      EXPECT_EQ(got.alpha[i], alpha[i]);
      EXPECT_EQ(got.smoothed[i], right.smoothed[i]) << "rank " << i;
      EXPECT_EQ(got.weights[i], right.weights[i]) << "rank " << i;
      if (got.weights[i] != wrong.weights[i]) told_apart = true;
    }
    EXPECT_EQ(state.sorted_momentum, momentum);
  }
  EXPECT_TRUE(told_apart) << "the permutation itself gave the same weights: the test does not distinguish";

  // The 3-cycle step by hand: momentum after step 1 is [1, 2, 4]; step 2 sorts α to [1, 2, 3], so
  // m = 0.5·[1, 2, 4] + 0.5·[1, 2, 3] = [1, 2, 3.5], and rank 2 (smallest α) gets 1, rank 0 gets 2,
  // rank 1 gets 3.5.
  AdaConsState fresh;
  adaconsWeights(steps[0], fresh, options);
  const AdaConsStep second = adaconsWeights(steps[1], fresh, options);
  EXPECT_EQ(second.smoothed, (std::vector<double>{2, 3.5, 1}));
  EXPECT_EQ(second.weights, (std::vector<double>{2 / 6.5, 3.5 / 6.5, 1 / 6.5}));
}

TEST(AdaCons, TiesSortStablyByRank) {
  AdaConsOptions options;
  options.beta = 0.5;
  AdaConsState state;
  adaconsWeights(std::vector<double>{1, 2, 3}, state, options);
  // All equal: the stable sort keeps rank order, so rank i gets m[i] = 0.5·[1, 2, 3] + 0.5·[5, 5, 5].
  const AdaConsStep step = adaconsWeights(std::vector<double>{5, 5, 5}, state, options);
  EXPECT_EQ(step.smoothed, (std::vector<double>{3, 3.5, 4}));
}

TEST(AdaCons, ScaleOptions) {
  const Vectors g = randomGradients(4, 3001, 9, 0.4);
  std::vector<float> paper(3001), sum_norm(3001), mean_norm(3001);
  AdaConsState s1, s2, s3;
  AdaConsOptions options;
  const AdaConsStep a = adacons(pointers(g), 3001, s1, options, paper.data());
  options.scale = AdaConsScale::MatchSumNorm;
  const AdaConsStep b = adacons(pointers(g), 3001, s2, options, sum_norm.data());
  options.scale = AdaConsScale::MatchMeanNorm;
  const AdaConsStep c = adacons(pointers(g), 3001, s3, options, mean_norm.data());

  Reference r;
  std::vector<double> momentum;
  const std::vector<double> alpha = referenceAlpha(g, options.epsilon, &r.norms, &r.sum_norm);
  const std::vector<double> norms = r.norms;
  const double sum_norm_reference = r.sum_norm;
  r = referenceWeights(alpha, momentum, options.beta);
  r.norms = norms;
  EXPECT_EQ(a.scale, 1.0);
  expectClose(b.scale, sum_norm_reference, 1e-12, "MatchSumNorm scale");
  expectClose(c.scale, sum_norm_reference / 4, 1e-12, "MatchMeanNorm scale");
  expectNearReference(paper, referenceAggregate(g, r, 1.0), "Paper");
  expectNearReference(sum_norm, referenceAggregate(g, r, sum_norm_reference), "MatchSumNorm");
  expectNearReference(mean_norm, referenceAggregate(g, r, sum_norm_reference / 4), "MatchMeanNorm");

  // The paper's aggregate is a weighted mean of unit vectors: its norm is at most 1.
  double squares = 0;
  for (float x : paper) squares += static_cast<double>(x) * static_cast<double>(x);
  EXPECT_LE(std::sqrt(squares), 1.0 + 1e-6);
}

TEST(AdaCons, IdenticalGradientsGiveTheGradientDirection) {
  const Vectors one = randomGradients(1, 2000, 4);
  const Vectors g(3, one[0]);
  std::vector<float> out(2000);
  AdaConsState state;
  AdaConsOptions options;
  options.scale = AdaConsScale::MatchMeanNorm;  // ‖Σg‖/N = ‖g‖: the aggregate is g itself
  const AdaConsStep step = adacons(pointers(g), 2000, state, options, out.data());
  for (double w : step.weights) EXPECT_NEAR(w, 1.0 / 3, 1e-15);
  for (std::size_t e = 0; e < 2000; ++e)
    EXPECT_NEAR(out[e], one[0][e], 1e-6 * (1 + std::fabs(static_cast<double>(one[0][e]))));
}

TEST(AdaCons, ZeroGradientsContributeNothingAndAllZeroIsRefused) {
  Vectors g = randomGradients(3, 1000, 8, 0.5);
  std::fill(g[1].begin(), g[1].end(), 0.0f);
  std::vector<float> out(1000);
  AdaConsState state;
  const AdaConsStep step = adacons(pointers(g), 1000, state, {}, out.data());
  EXPECT_EQ(step.alpha[1], 0.0);
  EXPECT_EQ(step.norms[1], 0.0);
  for (float x : out) EXPECT_TRUE(std::isfinite(x));

  const Vectors zeros(3, std::vector<float>(1000, 0.0f));
  AdaConsState untouched;
  EXPECT_THROW(adacons(pointers(zeros), 1000, untouched, {}, out.data()), Error);
  EXPECT_TRUE(untouched.sorted_momentum.empty()) << "a refused step must not change the state";
}

TEST(AdaCons, RefusesBadWeightsAndMismatchedState) {
  AdaConsState state;
  EXPECT_THROW(adaconsWeights(std::vector<double>{1, -1}, state, {}), Error);  // Σ = 0
  EXPECT_THROW(adaconsWeights(std::vector<double>{1, std::numeric_limits<double>::quiet_NaN()}, state, {}),
               Error);
  EXPECT_THROW(adaconsWeights(std::vector<double>{1, std::numeric_limits<double>::infinity()}, state, {}),
               Error);
  EXPECT_THROW(adaconsWeights(std::vector<double>{}, state, {}), Error);
  EXPECT_TRUE(state.sorted_momentum.empty());
  adaconsWeights(std::vector<double>{1, 2}, state, {});
  EXPECT_THROW(adaconsWeights(std::vector<double>{1, 2, 3}, state, {}), Error);
  EXPECT_EQ(state.sorted_momentum.size(), 2u);
  std::vector<float> out(4);
  EXPECT_THROW(adacons(Gradients{}, 4, state, {}, out.data()), Error);
}

// ---- AdaSum -----------------------------------------------------------------------------------------------

std::vector<double> referencePair(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t e = 0; e < a.size(); ++e) {
    ab += static_cast<double>(a[e]) * static_cast<double>(b[e]);
    aa += static_cast<double>(a[e]) * static_cast<double>(a[e]);
    bb += static_cast<double>(b[e]) * static_cast<double>(b[e]);
  }
  std::vector<double> out(a.size());
  for (std::size_t e = 0; e < a.size(); ++e) {
    if (aa == 0) out[e] = static_cast<double>(b[e]);
    else if (bb == 0) out[e] = static_cast<double>(a[e]);
    else
      out[e] =
          (1 - ab / (2 * aa)) * static_cast<double>(a[e]) + (1 - ab / (2 * bb)) * static_cast<double>(b[e]);
  }
  return out;
}

std::vector<float> toFloat(const std::vector<double>& x) {
  std::vector<float> out;
  for (double v : x) out.push_back(static_cast<float>(v));
  return out;
}

std::vector<float> pair(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(a.size());
  adasumPair(a.data(), b.data(), a.size(), out.data());
  return out;
}

TEST(AdaSum, OrthogonalInputsAddExactly) {
  // Disjoint supports, and a general orthogonal pair whose dot product is exactly 0.
  std::vector<float> a = {1.5f, 0, -2, 0, 7}, b = {0, 3, 0, -0.25f, 0};
  std::vector<float> sum(5);
  for (std::size_t e = 0; e < 5; ++e) sum[e] = a[e] + b[e];
  EXPECT_TRUE(sameBits(pair(a, b), sum));
  const std::vector<float> c = {1, 1, 0, 3}, d = {1, -1, 2, 0};
  EXPECT_TRUE(sameBits(pair(c, d), (std::vector<float>{2, 0, 2, 3})));
}

TEST(AdaSum, EqualInputsGiveTheInput) {
  const Vectors g = randomGradients(1, 100'003, 12);
  EXPECT_TRUE(sameBits(pair(g[0], g[0]), g[0]));
}

TEST(AdaSum, ZeroIsTheIdentity) {
  const Vectors g = randomGradients(1, 1000, 13);
  const std::vector<float> zero(1000, 0.0f);
  EXPECT_TRUE(sameBits(pair(zero, g[0]), g[0]));
  EXPECT_TRUE(sameBits(pair(g[0], zero), g[0]));
  EXPECT_TRUE(sameBits(pair(zero, zero), zero));
}

TEST(AdaSum, PairMatchesTheFormulaIsSymmetricAndWorksInPlace) {
  const Vectors g = randomGradients(2, 200'003, 14, 0.2);
  const std::vector<float> forward = pair(g[0], g[1]);
  expectNearReference(forward, referencePair(g[0], g[1]), "a ⊕ b");
  EXPECT_TRUE(sameBits(pair(g[1], g[0]), forward));
  std::vector<float> a = g[0], b = g[1];
  adasumPair(a.data(), b.data(), a.size(), a.data());
  EXPECT_TRUE(sameBits(a, forward));
  a = g[0];
  adasumPair(a.data(), b.data(), b.size(), b.data());
  EXPECT_TRUE(sameBits(b, forward));
}

// The tree order of local_sum.h, with every ⊕ rounded to fp32.
std::vector<float> referenceAdasum(const Vectors& g) {
  std::vector<std::pair<std::vector<float>, std::size_t>> stack;
  for (const auto& v : g) {
    stack.emplace_back(v, 1);
    while (stack.size() >= 2 && stack[stack.size() - 1].second == stack[stack.size() - 2].second) {
      auto newer = stack.back();
      stack.pop_back();
      stack.back() = {toFloat(referencePair(stack.back().first, newer.first)), stack.back().second * 2};
    }
  }
  std::vector<float> acc = stack.back().first;
  for (std::size_t i = stack.size() - 1; i-- > 0;) acc = toFloat(referencePair(stack[i].first, acc));
  return acc;
}

std::vector<float> sequentialAdasum(const Vectors& g) {
  std::vector<float> acc = g[0];
  for (std::size_t i = 1; i < g.size(); ++i) acc = toFloat(referencePair(acc, g[i]));
  return acc;
}

double maxDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t e = 0; e < a.size(); ++e)
    worst = std::max(worst, std::fabs(static_cast<double>(a[e]) - static_cast<double>(b[e])));
  return worst;
}

// dotProducts() is adasumPair's fp64 a·b, ‖a‖², ‖b‖², in the order reduction_order.h defines: blocks of
// 4096 elements, 16 lanes per block (element i into lane i % 16), lanes added in order, then blocks in
// order.
double blockLaneDot(const std::vector<float>& a, const std::vector<float>& b) {
  double total = 0;
  for (std::size_t first = 0; first < a.size(); first += 4096) {
    double lanes[16] = {};
    for (std::size_t i = first; i < std::min(a.size(), first + 4096); ++i)
      lanes[(i - first) % 16] += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    double block = 0;
    for (const double lane : lanes) block += lane;
    total += block;
  }
  return total;
}

TEST(DotProducts, FollowTheBlockLaneOrderForAnyThreadCount) {
  std::mt19937 random(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (const std::size_t count : {0u, 1u, 17u, 4096u, 4097u, 300001u}) {
    std::vector<float> a(count), b(count);
    for (std::size_t i = 0; i < count; ++i) {
      a[i] = value(random);
      b[i] = value(random) * 1e3f;
    }
    CpuExecutor serial(1);
    for (CpuExecutor* executor : {&CpuExecutor::shared(), &serial}) {
      const DotProducts dots = dotProducts(a.data(), b.data(), count, *executor);
      EXPECT_EQ(dots.ab, blockLaneDot(a, b)) << count;
      EXPECT_EQ(dots.aa, blockLaneDot(a, a)) << count;
      EXPECT_EQ(dots.bb, blockLaneDot(b, b)) << count;
    }
  }
}

TEST(AdaSum, RecursiveFollowsTheTreeOrder) {
  for (std::size_t n = 1; n <= 9; ++n) {
    const Vectors g = randomGradients(n, 4099, 20 + static_cast<std::uint32_t>(n), 0.3);
    std::vector<float> out(4099);
    adasum(pointers(g), 4099, out.data());
    const std::vector<float> expected = referenceAdasum(g);
    double scale = 0;
    for (float x : expected) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    EXPECT_LE(maxDifference(out, expected), 1e-5 * scale) << "N=" << n;
    // Another order is measurably different (⊕ is not associative), so the check tells orders apart.
    if (n >= 4) {
      EXPECT_GT(maxDifference(sequentialAdasum(g), expected), 1e-3 * scale) << "N=" << n;
    }
  }
}

TEST(AdaSum, RecursiveIdentitiesAreExact) {
  for (std::size_t n = 1; n <= 9; ++n) {
    // N copies of one gradient: every ⊕ is of equal vectors, so the result is the gradient itself.
    const Vectors one = randomGradients(1, 1000, 40);
    const Vectors same(n, one[0]);
    std::vector<float> out(1000);
    adasum(pointers(same), 1000, out.data());
    EXPECT_TRUE(sameBits(out, one[0])) << "N=" << n;
    // Disjoint supports: every partial is orthogonal to the next, so the result is the plain sum.
    Vectors disjoint(n, std::vector<float>(9 * 10, 0.0f));
    std::vector<float> sum(9 * 10, 0.0f);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t e = 0; e < 10; ++e) {
        disjoint[i][i * 10 + e] = static_cast<float>(e) - 4.5f;
        sum[i * 10 + e] = static_cast<float>(e) - 4.5f;
      }
    std::vector<float> total(90);
    adasum(pointers(disjoint), 90, total.data());
    EXPECT_TRUE(sameBits(total, sum)) << "N=" << n;
  }
}

TEST(AdaSum, OutputMayBeAGradient) {
  const Vectors g = randomGradients(5, 3000, 41, 0.3);
  std::vector<float> separate(3000);
  adasum(pointers(g), 3000, separate.data());
  Vectors copy = g;
  adasum(pointers(copy), 3000, copy[0].data());
  EXPECT_TRUE(sameBits(copy[0], separate));
}

// ---- Mean ------------------------------------------------------------------------------------------------

TEST(Mean, ExactOnSmallIntegersAndCorrectlyRounded) {
  for (std::size_t n : Sizes{1, 2, 3, 4, 7}) {
    Vectors g(n, std::vector<float>(1001));
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t e = 0; e < 1001; ++e)
        g[i][e] = static_cast<float>(static_cast<int>((e * 3 + i * 5) % 11) - 5);
    std::vector<float> out(1001);
    mean(pointers(g), 1001, out.data());
    for (std::size_t e = 0; e < 1001; ++e) {
      double sum = 0;
      for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(g[i][e]);
      ASSERT_EQ(out[e], static_cast<float>(sum / static_cast<double>(n))) << "N=" << n << " element " << e;
    }
  }
  EXPECT_THROW(mean(Gradients{}, 4, nullptr), Error);
}

// ---- Consensus diagnostics
// ---------------------------------------------------------------------------------

TEST(ConsensusStats, IdenticalGradients) {
  for (std::size_t n : Sizes{1, 2, 3, 8}) {
    const std::vector<float> g = {1, -2, 3, 0, 4};
    const Vectors same(n, g);
    const ConsensusStats stats = consensusStats(pointers(same), g.size());
    EXPECT_EQ(stats.diversity, 1.0 / static_cast<double>(n)) << "N=" << n;  // Σ‖g‖² / ‖Ng‖² = 1/N
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(stats.norms[i], std::sqrt(30.0));
      EXPECT_EQ(stats.cosine_to_mean[i], 1.0);
    }
  }
}

TEST(ConsensusStats, OrthogonalEqualNorms) {
  for (std::size_t n : Sizes{2, 3, 5}) {
    Vectors g(n, std::vector<float>(2 * n, 0.0f));
    for (std::size_t i = 0; i < n; ++i) {
      g[i][2 * i] = 3;
      g[i][2 * i + 1] = -4;
    }
    const ConsensusStats stats = consensusStats(pointers(g), 2 * n);
    EXPECT_EQ(stats.diversity, 1.0) << "N=" << n;
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(stats.norms[i], 5.0);
      EXPECT_DOUBLE_EQ(stats.cosine_to_mean[i], 1.0 / std::sqrt(static_cast<double>(n)));
    }
  }
}

TEST(ConsensusStats, CosinesZerosAndOpposites) {
  const Vectors g = {{3, 0}, {-1, 1}};  // sum (2, 1)
  const ConsensusStats stats = consensusStats(pointers(g), 2);
  EXPECT_DOUBLE_EQ(stats.cosine_to_mean[0], 6.0 / std::sqrt(9.0 * 5.0));
  EXPECT_DOUBLE_EQ(stats.cosine_to_mean[1], -1.0 / std::sqrt(2.0 * 5.0));
  EXPECT_DOUBLE_EQ(stats.diversity, 11.0 / 5.0);

  const Vectors opposite = {{1, 2}, {-1, -2}};  // the sum is zero, the gradients are not
  const ConsensusStats o = consensusStats(pointers(opposite), 2);
  EXPECT_EQ(o.diversity, std::numeric_limits<double>::infinity());
  EXPECT_EQ(o.cosine_to_mean[0], 0.0);

  const Vectors zeros = {{0, 0}, {0, 0}};
  const ConsensusStats z = consensusStats(pointers(zeros), 2);
  EXPECT_EQ(z.diversity, 0.0);
  EXPECT_EQ(z.norms[0], 0.0);
  EXPECT_EQ(z.cosine_to_mean[1], 0.0);

  EXPECT_TRUE(consensusStats(Gradients{}, 0).norms.empty());
}

// ---- Determinism -----------------------------------------------------------------------------------------

TEST(Adaptive, ResultsDoNotDependOnTheThreadCount) {
  const std::size_t count = 1'000'003;
  const Vectors g = randomGradients(5, count, 77, 0.1);
  CpuExecutor one(1), three(3);
  std::vector<float> a(count), b(count);

  AdaConsState s1, s2;
  const AdaConsStep x = adacons(pointers(g), count, s1, {}, a.data(), one);
  const AdaConsStep y = adacons(pointers(g), count, s2, {}, b.data(), three);
  EXPECT_EQ(x.alpha, y.alpha);
  EXPECT_EQ(x.weights, y.weights);
  EXPECT_TRUE(sameBits(a, b));

  adasum(pointers(g), count, a.data(), one);
  adasum(pointers(g), count, b.data(), three);
  EXPECT_TRUE(sameBits(a, b));

  mean(pointers(g), count, a.data(), one);
  mean(pointers(g), count, b.data(), three);
  EXPECT_TRUE(sameBits(a, b));

  const ConsensusStats p = consensusStats(pointers(g), count, one);
  const ConsensusStats q = consensusStats(pointers(g), count, three);
  EXPECT_EQ(p.norms, q.norms);
  EXPECT_EQ(p.cosine_to_mean, q.cosine_to_mean);
  EXPECT_EQ(p.diversity, q.diversity);
}

}  // namespace
}  // namespace gradscope::methods

namespace gradscope::methods {
namespace {

TEST(Scale, MultipliesInFp32InPlaceAndOutOfPlace) {
  std::vector<float> in(100003);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 1000) * 0.37f - 100.0f;
  std::vector<float> out(in.size());
  scale(in.data(), in.size(), 1.0f / 3.0f, out.data());
  for (std::size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], in[i] * (1.0f / 3.0f)) << i;
  std::vector<float> same = in;
  scale(same.data(), same.size(), 1.0f / 3.0f, same.data());
  EXPECT_EQ(same, out);
  EXPECT_NO_THROW(scale(nullptr, 0, 2.0f, nullptr));
  EXPECT_THROW(scale(nullptr, 1, 2.0f, out.data()), Error);
}

// Sets an environment variable for one scope.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(CpuExecutorThreads, FollowTheEnvironmentAndTheRanksSharingTheNode) {
  const ScopedEnvironment no_slurm("SLURM_NTASKS_PER_NODE", nullptr);
  const ScopedEnvironment no_mpich("MPI_LOCALNRANKS", nullptr);
  {
    const ScopedEnvironment threads("GRADSCOPE_THREADS", "3");
    EXPECT_EQ(CpuExecutor::defaultThreads(), 3);
  }
  const ScopedEnvironment no_threads("GRADSCOPE_THREADS", nullptr);
  int all = 0;
  {
    const ScopedEnvironment alone("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr);
    all = CpuExecutor::defaultThreads();
    EXPECT_GE(all, 1);
  }
  {
    const ScopedEnvironment shared("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    EXPECT_EQ(CpuExecutor::defaultThreads(), std::max(1, all / 2));
  }
  {
    const ScopedEnvironment crowded("OMPI_COMM_WORLD_LOCAL_SIZE", "1000");
    EXPECT_EQ(CpuExecutor::defaultThreads(), 1);
  }
  {
    const ScopedEnvironment bad("GRADSCOPE_THREADS", "many");  // ignored with one line on stderr
    const ScopedEnvironment alone("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr);
    EXPECT_EQ(CpuExecutor::defaultThreads(), all);
  }
}

}  // namespace
}  // namespace gradscope::methods
