// delayed.h on the GPU: one grid-stride pass, each element through delayedValue() as on the CPU.

#include "common.cuh"
#include "gradscope/methods/delayed.h"

namespace gradscope::methods::cuda {
namespace {

template <typename Type>
__global__ void __launch_bounds__(detail::kBlockThreads)
    delayedKernel(const typename Type::Storage* gradient, typename Type::Storage* older,
                  const typename Type::Storage* sum, typename Type::Storage* out, std::size_t count,
                  double ranks) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const typename Type::Storage now = gradient[i];  // first: out may be gradient
    const double value =
        delayedValue(Type::toDouble(sum[i]), Type::toDouble(now), Type::toDouble(older[i]), ranks);
    if constexpr (sizeof(typename Type::Storage) == 8) out[i] = value;
    else out[i] = Type::fromAcc(__double2float_rn(value));
    older[i] = now;
  }
}

template <typename Type>
void launch(const void* gradient, void* older, const void* sum, void* out, std::size_t count, double ranks,
            cudaStream_t stream) {
  using Storage = typename Type::Storage;
  delayedKernel<Type><<<detail::gridFor(count), detail::kBlockThreads, 0, stream>>>(
      static_cast<const Storage*>(gradient), static_cast<Storage*>(older), static_cast<const Storage*>(sum),
      static_cast<Storage*>(out), count, ranks);
  detail::checkLaunch("delayedKernel");
}

}  // namespace

void delayedCorrection(DType dtype, const void* gradient, void* older, const void* sum, void* out,
                       std::size_t count, double ranks, Stream stream) {
  detail::requireDevice();
  if (count == 0) return;
  const cudaStream_t s = detail::toCuda(stream);
  switch (dtype) {
    case DType::Fp32: return launch<detail::Fp32Type>(gradient, older, sum, out, count, ranks, s);
    case DType::Fp64: return launch<detail::Fp64Type>(gradient, older, sum, out, count, ranks, s);
    case DType::Fp16: return launch<detail::Fp16Type>(gradient, older, sum, out, count, ranks, s);
    case DType::Bf16: return launch<detail::Bf16Type>(gradient, older, sum, out, count, ranks, s);
    default: fail("delayed correction: {} is not fp32, fp64, fp16 or bf16", name(dtype));
  }
}

}  // namespace gradscope::methods::cuda
