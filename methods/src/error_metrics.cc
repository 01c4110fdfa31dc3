// Error metrics against an fp64 reference.
//
// Determinism: the sums run over fixed blocks of kBlock elements (whatever the thread count), each
// block accumulates in kLanes fixed lanes (element i of a block goes to lane i % kLanes), lanes are
// added in lane order and blocks in block order. The result therefore depends only on the inputs, not
// on the executor or the instruction set: the kernels are compiled without floating-point contraction
// (no FMA in the AVX2/AVX-512 clones that the baseline clone would not have), so all three clones
// compute the same bits.

#include "gradscope/methods/error_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_kernels.h"
#include "gradscope/common/error.h"
#include "gradscope/methods/numeric.h"
#include "reduction_order.h"

namespace gradscope::methods {
namespace {

constexpr std::size_t kBlock = detail::kMetricsReductionBlock;  // defines the sum order
constexpr std::size_t kLanes = 16;
constexpr std::uint64_t kSignBit = 0x8000000000000000ull;
constexpr std::uint64_t kExponentBits = 0x7FF0000000000000ull;

inline std::uint64_t doubleBits(double value) {
  std::uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline double bitsDouble(std::uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// numeric.h's fp16ToFp32 with integer-mask selects so that every ISA clone vectorises it (the same
// conversion as in local_sum.cc; see the note there).
inline float halfToFloat(std::uint16_t half) {
  const auto select = [](bool condition, std::uint32_t if_true, std::uint32_t if_false) {
    const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
    return (if_true & mask) | (if_false & ~mask);
  };
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t shifted = static_cast<std::uint32_t>(half & 0x7FFFu) << 13;
  const std::uint32_t exponent = shifted & 0x0F800000u;
  const std::uint32_t normal = shifted + 0x38000000u;
  const std::uint32_t special = shifted | 0x7F800000u;
  const float subnormal = bitsFloat(normal + 0x00800000u) - 6.103515625e-05f;
  std::uint32_t bits = select(exponent == 0x0F800000u, special, normal);
  bits = select(exponent == 0, floatBits(subnormal), bits);
  return bitsFloat(bits | sign);
}

struct Fp32Load {
  using Elem = float;
  static double load(float value) { return static_cast<double>(value); }
};
struct Fp64Load {
  using Elem = double;
  static double load(double value) { return value; }
};
struct Fp16Load {
  using Elem = std::uint16_t;
  static double load(std::uint16_t value) { return static_cast<double>(halfToFloat(value)); }
};
struct Bf16Load {
  using Elem = std::uint16_t;
  static double load(std::uint16_t value) { return static_cast<double>(bf16ToFp32(value)); }
};

// Sums over one block (or over everything, combined in order).
struct Partial {
  double diff_squares = 0;         // Σ (r - ref)²
  double reference_squares = 0;    // Σ ref²
  double result_squares = 0;       // Σ r²
  double products = 0;             // Σ r·ref
  std::uint64_t max_abs_bits = 0;  // bits of max |r - ref| (non-negative doubles order like their bits)
  std::uint64_t overflow = 0;
  std::uint64_t nan = 0;
};

// One block: lanes of sums, element i in lane i % kLanes. Non-finite result elements are masked out
// of every sum (their bits and the reference's are zeroed), so the loop has no branches.
template <class L>
GS_NO_CONTRACTION GS_CPU_KERNEL void compareBlock(const typename L::Elem* GS_RESTRICT result,
                                                  const double* GS_RESTRICT reference, std::size_t n,
                                                  Partial* GS_RESTRICT partial) {
  double diff_squares[kLanes] = {};
  double reference_squares[kLanes] = {};
  double result_squares[kLanes] = {};
  double products[kLanes] = {};
  std::uint64_t max_abs_bits[kLanes] = {};
  std::uint64_t overflow[kLanes] = {};
  std::uint64_t nan[kLanes] = {};
  const auto element = [&](std::size_t i, std::size_t lane) __attribute__((always_inline)) {
    const std::uint64_t r = doubleBits(L::load(result[i]));
    const std::uint64_t f = doubleBits(reference[i]);
    const bool r_finite = (r & kExponentBits) != kExponentBits;
    const bool f_finite = (f & kExponentBits) != kExponentBits;
    const bool r_nan = (r & ~kSignBit) > kExponentBits;
    const bool f_nan = (f & ~kSignBit) > kExponentBits;
    const std::uint64_t keep = 0 - static_cast<std::uint64_t>(r_finite);
    const double x = bitsDouble(r & keep);
    const double y = bitsDouble(f & keep);
    const double d = x - y;
    diff_squares[lane] += d * d;
    reference_squares[lane] += y * y;
    result_squares[lane] += x * x;
    products[lane] += x * y;
    const std::uint64_t abs_bits = doubleBits(d) & ~kSignBit;
    max_abs_bits[lane] = abs_bits > max_abs_bits[lane] ? abs_bits : max_abs_bits[lane];
    overflow[lane] += static_cast<std::uint64_t>(!r_finite && !r_nan && f_finite);
    nan[lane] += static_cast<std::uint64_t>(r_nan && !f_nan);
  };
  const std::size_t full = n / kLanes * kLanes;
  for (std::size_t block = 0; block < full; block += kLanes)
    for (std::size_t lane = 0; lane < kLanes; ++lane) element(block + lane, lane);
  for (std::size_t i = full; i < n; ++i) element(i, i - full);
  Partial sum;
  for (std::size_t lane = 0; lane < kLanes; ++lane) {
    sum.diff_squares += diff_squares[lane];
    sum.reference_squares += reference_squares[lane];
    sum.result_squares += result_squares[lane];
    sum.products += products[lane];
    sum.max_abs_bits = std::max(sum.max_abs_bits, max_abs_bits[lane]);
    sum.overflow += overflow[lane];
    sum.nan += nan[lane];
  }
  *partial = sum;
}

template <class L>
ErrorMetrics compareTyped(const void* raw_result, const double* reference, std::size_t count,
                          CpuExecutor& executor) {
  const auto* result = static_cast<const typename L::Elem*>(raw_result);
  const std::size_t blocks = (count + kBlock - 1) / kBlock;
  std::vector<Partial> partials(blocks);
  executor.parallelFor(blocks, kBlock * (sizeof(typename L::Elem) + sizeof(double)), 1,
                       [&](std::size_t begin, std::size_t end) {
                         for (std::size_t b = begin; b < end; ++b) {
                           const std::size_t first = b * kBlock;
                           compareBlock<L>(result + first, reference + first, std::min(kBlock, count - first),
                                           &partials[b]);
                         }
                       });
  Partial total;
  for (const Partial& p : partials) {
    total.diff_squares += p.diff_squares;
    total.reference_squares += p.reference_squares;
    total.result_squares += p.result_squares;
    total.products += p.products;
    total.max_abs_bits = std::max(total.max_abs_bits, p.max_abs_bits);
    total.overflow += p.overflow;
    total.nan += p.nan;
  }

  ErrorMetrics metrics;
  if (total.reference_squares == 0)
    metrics.rel_l2 = total.diff_squares == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  else metrics.rel_l2 = std::sqrt(total.diff_squares) / std::sqrt(total.reference_squares);
  metrics.max_abs = bitsDouble(total.max_abs_bits);
  if (total.result_squares == 0 && total.reference_squares == 0) {
    metrics.cosine = 1;
  } else if (total.result_squares == 0 || total.reference_squares == 0) {
    metrics.cosine = 0;  // one side is the zero vector: no direction to agree with
  } else {
    // sqrt(a·b) rather than sqrt(a)·sqrt(b): for r = ref it is exactly Σr², so the cosine is exactly 1.
    double norms = std::sqrt(total.result_squares * total.reference_squares);
    if (!std::isfinite(norms) || norms == 0)
      norms = std::sqrt(total.result_squares) * std::sqrt(total.reference_squares);
    metrics.cosine = std::clamp(total.products / norms, -1.0, 1.0);  // (a NaN stays NaN)
  }
  metrics.overflow = total.overflow;
  metrics.nan = total.nan;
  return metrics;
}

template <class L>
GS_CPU_KERNEL void absoluteLanes(const typename L::Elem* GS_RESTRICT x, std::size_t n,
                                 double* GS_RESTRICT lanes) {
  const std::size_t full = n / kLanes * kLanes;
  for (std::size_t block = 0; block < full; block += kLanes)
    for (std::size_t lane = 0; lane < kLanes; ++lane)
      lanes[lane] += bitsDouble(doubleBits(L::load(x[block + lane])) & ~kSignBit);
  for (std::size_t i = full; i < n; ++i) lanes[i - full] += bitsDouble(doubleBits(L::load(x[i])) & ~kSignBit);
}

template <class L>
double sumOfAbsolutesTyped(const void* const* inputs, std::size_t k, std::size_t count) {
  double total = 0;
  for (std::size_t input = 0; input < k; ++input) {
    double lanes[kLanes] = {};
    absoluteLanes<L>(static_cast<const typename L::Elem*>(inputs[input]), count, lanes);
    double sum = 0;
    for (double lane : lanes) sum += lane;
    total += sum;
  }
  return total;
}

}  // namespace

ErrorMetrics compareToReference(DType dtype, const void* result, const double* reference, std::size_t count,
                                CpuExecutor& executor) {
  if (count > 0 && (result == nullptr || reference == nullptr)) fail("error metrics: null buffer");
  switch (dtype) {
    case DType::Fp32: return compareTyped<Fp32Load>(result, reference, count, executor);
    case DType::Fp64: return compareTyped<Fp64Load>(result, reference, count, executor);
    case DType::Fp16: return compareTyped<Fp16Load>(result, reference, count, executor);
    case DType::Bf16: return compareTyped<Bf16Load>(result, reference, count, executor);
    default: break;
  }
  fail("error metrics: element type {} is not supported (fp32, fp16, bf16 and fp64 are)", name(dtype));
}

// Σ over inputs (in order) of Σ over elements of |x|, each input's elements summed in fixed lanes.
double sumOfAbsolutes(DType dtype, const void* const* inputs, std::size_t k, std::size_t count) {
  if (count > 0 && k > 0) {
    if (inputs == nullptr) fail("sum of absolutes: null input list");
    for (std::size_t i = 0; i < k; ++i)
      if (inputs[i] == nullptr) fail("sum of absolutes: input {} is a null buffer", i);
  }
  switch (dtype) {
    case DType::Fp32: return sumOfAbsolutesTyped<Fp32Load>(inputs, k, count);
    case DType::Fp64: return sumOfAbsolutesTyped<Fp64Load>(inputs, k, count);
    case DType::Fp16: return sumOfAbsolutesTyped<Fp16Load>(inputs, k, count);
    case DType::Bf16: return sumOfAbsolutesTyped<Bf16Load>(inputs, k, count);
    default: break;
  }
  fail("sum of absolutes: element type {} is not supported (fp32, fp16, bf16 and fp64 are)", name(dtype));
}

}  // namespace gradscope::methods
