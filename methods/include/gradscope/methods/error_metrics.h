#pragma once

// How far a result is from the fp64 reference of the same inputs.

#include <cstddef>
#include <cstdint>

#include "gradscope/common/types.h"
#include "gradscope/methods/cpu_executor.h"

namespace gradscope::methods {

struct ErrorMetrics {
  double rel_l2 = 0;           // ||result - reference||_2 / ||reference||_2 (0 when both are zero; Inf when
                               // only the reference is zero). Non-finite result elements are left out of
                               // the norms and counted below.
  double max_abs = 0;          // max |result_i - reference_i| over finite result elements
  double cosine = 1;           // <result, reference> / (||result|| ||reference||) (1 when both are zero)
  std::uint64_t overflow = 0;  // result elements that are ±Inf where the reference is finite
  std::uint64_t nan = 0;       // result elements that are NaN where the reference is not
};

// `result` holds `count` elements of `dtype` (Fp32, Fp16, Bf16 or Fp64).
ErrorMetrics compareToReference(DType dtype, const void* result, const double* reference, std::size_t count,
                                CpuExecutor& executor = CpuExecutor::shared());

// Σ|x_i| over K inputs per element, summed over elements: the scale of the summation error bounds.
double sumOfAbsolutes(DType dtype, const void* const* inputs, std::size_t k, std::size_t count);

}  // namespace gradscope::methods
