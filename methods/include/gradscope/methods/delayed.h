#pragma once

// Delayed gradient averaging's correction (async/dga<K>, comm/async.h): a rank's stale sum of step t−K,
// corrected by its own newer gradient,
//
//   out[i] = sum[i] + ranks · (gradient[i] − older[i]),   then older[i] = gradient[i],
//
// computed in fp64 from the elements' values and rounded once to the element type (fp16 and bf16 by way
// of fp32, as element.h stores them). fp32, fp64, fp16 and bf16. `out` may be `gradient` (in place):
// each element is read before it is written. The CPU here and the GPU (cuda.h's delayedCorrection)
// compute every element with delayedValue(), so both give the same bits.

#include <cstddef>

#include "gradscope/common/types.h"
#include "gradscope/methods/numeric.h"

namespace gradscope::methods {

// One element: a product and a sum, each rounded (no fused multiply-add on either side).
GS_HOST_DEVICE double delayedValue(double sum, double gradient, double older, double ranks) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(sum, __dmul_rn(ranks, __dsub_rn(gradient, older)));
#else
  return sum + ranks * (gradient - older);
#endif
}

// Throws gradscope::Error for another dtype.
void delayedCorrection(DType dtype, const void* gradient, void* older, const void* sum, void* out,
                       std::size_t count, double ranks);

}  // namespace gradscope::methods
