// error_metrics.h's compareToReference and adaptive.h's mean on the GPU.
//
// compareToReference: the four fp64 sums (Σd², Σref², Σr², Σr·ref) are accumulated in exactly the order
// of error_metrics.cc (blocks of kMetricsBlock elements, 16 lanes, lanes then blocks in order; see
// common.cuh), with the same masking of non-finite results, so the totals are the CPU's bits; the
// maximum and the counters are order-free. The metrics are then derived on the host with the CPU's
// formulas. The only difference left is a NaN produced by GPU arithmetic (canonical bits, where x86
// keeps an input's payload): a NaN metric is NaN on both sides.
//
// mean: out_e = fp32((g_0[e] + ... + g_{N-1}[e]) / N), the sum in fp64 in index order (for N = 1,
// 0.0 + g_0[e], as adaptive.cc's zero-filled accumulator does), divided, rounded once: the CPU's bits.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../reduction_order.h"
#include "common.cuh"

namespace gradscope::methods::cuda {
namespace {

using detail::kBlockThreads;
using detail::Pack;
using detail::PointerTable;

constexpr std::size_t kMetricsBlock = methods::detail::kMetricsReductionBlock;

constexpr unsigned long long kSignBit = 0x8000000000000000ull;
constexpr unsigned long long kExponentBits = 0x7FF0000000000000ull;

// Per block: the four sums, then max |d| bits, overflow and NaN counts. Quantity-major.
struct MetricTotals {
  double diff_squares;
  double reference_squares;
  double result_squares;
  double products;
  unsigned long long max_abs_bits;
  unsigned long long overflow;
  unsigned long long nan;
};

template <typename E>
__global__ void __launch_bounds__(kBlockThreads)
    compareKernel(const typename E::Storage* result, const double* reference, std::size_t count,
                  std::size_t blocks, double* sums, unsigned long long* others) {
  const std::size_t block = detail::cpuBlockIndex();
  const unsigned lane = detail::cpuLane();
  double diff_squares = 0.0;
  double reference_squares = 0.0;
  double result_squares = 0.0;
  double products = 0.0;
  unsigned long long max_abs_bits = 0;
  unsigned long long overflow = 0;
  unsigned long long nan = 0;
  if (block < blocks) {
    const std::size_t first = block * kMetricsBlock;
    const std::size_t n = count - first < kMetricsBlock ? count - first : kMetricsBlock;
    const typename E::Storage* r_block = result + first;
    const double* f_block = reference + first;
#pragma unroll 4
    for (std::size_t i = lane; i < n; i += detail::kCpuLanes) {
      const auto r = static_cast<unsigned long long>(__double_as_longlong(E::toDouble(r_block[i])));
      const auto f = static_cast<unsigned long long>(__double_as_longlong(f_block[i]));
      const bool r_finite = (r & kExponentBits) != kExponentBits;
      const bool f_finite = (f & kExponentBits) != kExponentBits;
      const bool r_nan = (r & ~kSignBit) > kExponentBits;
      const bool f_nan = (f & ~kSignBit) > kExponentBits;
      // Non-finite results take no part in the sums: both operands become +0 (error_metrics.cc).
      const unsigned long long keep = r_finite ? ~0ull : 0ull;
      const double x = __longlong_as_double(static_cast<long long>(r & keep));
      const double y = __longlong_as_double(static_cast<long long>(f & keep));
      const double d = __dsub_rn(x, y);
      diff_squares = __dadd_rn(diff_squares, __dmul_rn(d, d));
      reference_squares = __dadd_rn(reference_squares, __dmul_rn(y, y));
      result_squares = __dadd_rn(result_squares, __dmul_rn(x, x));
      products = __dadd_rn(products, __dmul_rn(x, y));
      const auto abs_bits = static_cast<unsigned long long>(__double_as_longlong(d)) & ~kSignBit;
      max_abs_bits = abs_bits > max_abs_bits ? abs_bits : max_abs_bits;
      overflow += (!r_finite && !r_nan && f_finite) ? 1u : 0u;
      nan += (r_nan && !f_nan) ? 1u : 0u;
    }
  }
  diff_squares = detail::laneOrderSum(diff_squares);
  reference_squares = detail::laneOrderSum(reference_squares);
  result_squares = detail::laneOrderSum(result_squares);
  products = detail::laneOrderSum(products);
  max_abs_bits = detail::laneMax(max_abs_bits);
  overflow = detail::laneTotal(overflow);
  nan = detail::laneTotal(nan);
  if (lane == 0 && block < blocks) {
    sums[0 * blocks + block] = diff_squares;
    sums[1 * blocks + block] = reference_squares;
    sums[2 * blocks + block] = result_squares;
    sums[3 * blocks + block] = products;
    others[0 * blocks + block] = max_abs_bits;
    others[1 * blocks + block] = overflow;
    others[2 * blocks + block] = nan;
  }
}

// The order-free part of the totals: the largest |d| and the two counts, over all blocks.
__global__ void combineOthersKernel(const unsigned long long* others, std::size_t blocks,
                                    MetricTotals* totals) {
  const unsigned q = threadIdx.x;
  if (q >= 3) return;
  const unsigned long long* p = others + q * blocks;
  unsigned long long value = 0;
  for (std::size_t b = 0; b < blocks; ++b) value = q == 0 ? (p[b] > value ? p[b] : value) : value + p[b];
  if (q == 0) totals->max_abs_bits = value;
  if (q == 1) totals->overflow = value;
  if (q == 2) totals->nan = value;
}

// error_metrics.cc's formulas, on the same totals.
ErrorMetrics metricsFrom(const MetricTotals& total) {
  ErrorMetrics metrics;
  if (total.reference_squares == 0)
    metrics.rel_l2 = total.diff_squares == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  else metrics.rel_l2 = std::sqrt(total.diff_squares) / std::sqrt(total.reference_squares);
  std::uint64_t bits = total.max_abs_bits;
  std::memcpy(&metrics.max_abs, &bits, sizeof bits);
  if (total.result_squares == 0 && total.reference_squares == 0) {
    metrics.cosine = 1;
  } else if (total.result_squares == 0 || total.reference_squares == 0) {
    metrics.cosine = 0;
  } else {
    double norms = std::sqrt(total.result_squares * total.reference_squares);
    if (!std::isfinite(norms) || norms == 0)
      norms = std::sqrt(total.result_squares) * std::sqrt(total.reference_squares);
    metrics.cosine = std::clamp(total.products / norms, -1.0, 1.0);
  }
  metrics.overflow = total.overflow;
  metrics.nan = total.nan;
  return metrics;
}

template <typename E>
ErrorMetrics compareTyped(const void* result, const double* reference, std::size_t count,
                          cudaStream_t stream) {
  MetricTotals host{};
  if (count > 0) {
    const std::size_t blocks = (count + kMetricsBlock - 1) / kMetricsBlock;
    // One allocation: partial sums, partial others, totals.
    const std::size_t sums_bytes = 4 * blocks * sizeof(double);
    const std::size_t others_bytes = 3 * blocks * sizeof(unsigned long long);
    const detail::Scratch scratch(sums_bytes + others_bytes + sizeof(MetricTotals), stream);
    auto* sums = scratch.as<double>();
    auto* others = reinterpret_cast<unsigned long long*>(scratch.as<char>() + sums_bytes);
    auto* totals = reinterpret_cast<MetricTotals*>(scratch.as<char>() + sums_bytes + others_bytes);
    compareKernel<E><<<detail::cpuOrderGrid(blocks), kBlockThreads, 0, stream>>>(
        static_cast<const typename E::Storage*>(result), reference, count, blocks, sums, others);
    detail::checkLaunch("compareKernel");
    // MetricTotals starts with the four sums, in this order.
    detail::blockOrderSumKernel<><<<1, 32, 0, stream>>>(sums, blocks, 4, reinterpret_cast<double*>(totals));
    detail::checkLaunch("blockOrderSumKernel");
    combineOthersKernel<<<1, 32, 0, stream>>>(others, blocks, totals);
    detail::checkLaunch("combineOthersKernel");
    detail::check(cudaMemcpyAsync(&host, totals, sizeof host, cudaMemcpyDeviceToHost, stream),
                  "cudaMemcpyAsync (error metrics)");
    detail::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  return metricsFrom(host);
}

// ---- mean
// ----------------------------------------------------------------------------------------------------

template <int N>
__device__ __forceinline__ void meanPack(const PointerTable& gradients, std::size_t index, float* out) {
  const int total = gradients.count;
  double acc[N];
  detail::streamInputs<float, N>(gradients, index, [&](int k, const Pack<float, N>& x) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const auto value = static_cast<double>(x.v[j]);
      // adaptive.cc: acc = g_0 (0.0 + g_0 when N = 1), then acc + g_k; divided by N once.
      acc[j] = k == 0 ? (total == 1 ? __dadd_rn(0.0, value) : value) : __dadd_rn(acc[j], value);
    }
  });
  Pack<float, N> result;
#pragma unroll
  for (int j = 0; j < N; ++j) result.v[j] = __double2float_rn(__ddiv_rn(acc[j], static_cast<double>(total)));
  *reinterpret_cast<Pack<float, N>*>(out + index) = result;
}

template <bool kVector>
__global__ void __launch_bounds__(kBlockThreads)
    meanKernel(const __grid_constant__ PointerTable gradients, std::size_t count, float* out) {
  constexpr int kPack = kVector ? 4 : 1;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t packs = count / kPack;
  for (std::size_t p = first; p < packs; p += stride) meanPack<kPack>(gradients, p * kPack, out);
  if constexpr (kVector) {
    for (std::size_t i = packs * kPack + first; i < count; i += stride) meanPack<1>(gradients, i, out);
  }
}

}  // namespace

ErrorMetrics compareToReference(DType dtype, const void* result, const double* reference, std::size_t count,
                                Stream stream) {
  detail::requireDevice();
  if (count > 0 && (result == nullptr || reference == nullptr)) fail("error metrics: null buffer");
  const cudaStream_t s = detail::toCuda(stream);
  switch (dtype) {
    case DType::Fp32: return compareTyped<detail::Fp32Type>(result, reference, count, s);
    case DType::Fp64: return compareTyped<detail::Fp64Type>(result, reference, count, s);
    case DType::Fp16: return compareTyped<detail::Fp16Type>(result, reference, count, s);
    case DType::Bf16: return compareTyped<detail::Bf16Type>(result, reference, count, s);
    default: break;
  }
  fail("error metrics: element type {} is not supported (fp32, fp16, bf16 and fp64 are)", name(dtype));
}

void mean(Gradients gradients, std::size_t count, float* out, Stream stream) {
  detail::requireDevice();
  if (gradients.empty()) fail("mean: no gradients (N = 0)");
  if (count == 0) return;
  for (std::size_t i = 0; i < gradients.size(); ++i) {
    if (gradients[i] == nullptr) fail("mean: gradient {} is a null buffer", i);
  }
  if (out == nullptr) fail("mean: null output buffer");
  if (gradients.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    fail("mean: too many gradients");
  const cudaStream_t s = detail::toCuda(stream);
  const std::vector<const void*> pointers(gradients.begin(), gradients.end());
  const detail::PointerTableBuilder table(pointers, s);
  bool vector = detail::aligned(out, 16);
  for (const float* gradient : gradients) vector = vector && detail::aligned(gradient, 16);
  if (vector) {
    meanKernel<true>
        <<<detail::gridFor(count / 4 + count % 4), kBlockThreads, 0, s>>>(table.table(), count, out);
  } else {
    meanKernel<false><<<detail::gridFor(count), kBlockThreads, 0, s>>>(table.table(), count, out);
  }
  detail::checkLaunch("meanKernel");
}

}  // namespace gradscope::methods::cuda
