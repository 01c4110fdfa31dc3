// delayed.h on the CPU: one pass over the elements; fp32 and fp64 in a loop the compiler vectorises.

#include "gradscope/methods/delayed.h"

#include <cstdint>

#include "gradscope/common/error.h"

namespace gradscope::methods {
namespace {

template <typename T>
void correctNative(const void* gradient, void* older, const void* sum, void* out, std::size_t count,
                   double ranks) {
  const auto* g = static_cast<const T*>(gradient);
  auto* old = static_cast<T*>(older);
  const auto* s = static_cast<const T*>(sum);
  auto* o = static_cast<T*>(out);
  for (std::size_t i = 0; i < count; ++i) {
    const T now = g[i];  // first: out may be gradient
    o[i] = static_cast<T>(delayedValue(s[i], now, old[i], ranks));
    old[i] = now;
  }
}

template <float (*kDecode)(std::uint16_t), std::uint16_t (*kEncode)(float)>
void correctHalf(const void* gradient, void* older, const void* sum, void* out, std::size_t count,
                 double ranks) {
  const auto* g = static_cast<const std::uint16_t*>(gradient);
  auto* old = static_cast<std::uint16_t*>(older);
  const auto* s = static_cast<const std::uint16_t*>(sum);
  auto* o = static_cast<std::uint16_t*>(out);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint16_t now = g[i];
    const double value = delayedValue(kDecode(s[i]), kDecode(now), kDecode(old[i]), ranks);
    o[i] = kEncode(static_cast<float>(value));
    old[i] = now;
  }
}

}  // namespace

void delayedCorrection(DType dtype, const void* gradient, void* older, const void* sum, void* out,
                       std::size_t count, double ranks) {
  switch (dtype) {
    case DType::Fp32: return correctNative<float>(gradient, older, sum, out, count, ranks);
    case DType::Fp64: return correctNative<double>(gradient, older, sum, out, count, ranks);
    case DType::Fp16: return correctHalf<fp16ToFp32, fp32ToFp16>(gradient, older, sum, out, count, ranks);
    case DType::Bf16: return correctHalf<bf16ToFp32, fp32ToBf16>(gradient, older, sum, out, count, ranks);
    default: fail("delayed correction: {} is not fp32, fp64, fp16 or bf16", name(dtype));
  }
}

}  // namespace gradscope::methods
