#pragma once

// One element of a floating-point buffer of any float dtype (fp32, fp64, fp16, bf16) as a double, and
// back, rounded once (fp16 and bf16 through fp32, as numeric.h rounds). For code that reads buffers of the
// job's dtype element by element (fp64 references, the async strategies' corrections), not for kernels.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gradscope/common/types.h"
#include "gradscope/methods/numeric.h"

namespace gradscope::methods {

// 0 for a dtype that is not one of the four.
inline double loadElement(DType dtype, const std::byte* data, std::size_t i) {
  switch (dtype) {
    case DType::Fp32: {
      float v;
      std::memcpy(&v, data + i * 4, 4);
      return v;
    }
    case DType::Fp64: {
      double v;
      std::memcpy(&v, data + i * 8, 8);
      return v;
    }
    case DType::Fp16:
    case DType::Bf16: {
      std::uint16_t v;
      std::memcpy(&v, data + i * 2, 2);
      return dtype == DType::Fp16 ? fp16ToFp32(v) : bf16ToFp32(v);
    }
    default: return 0;
  }
}

// Nothing for a dtype that is not one of the four.
inline void storeElement(DType dtype, std::byte* data, std::size_t i, double value) {
  switch (dtype) {
    case DType::Fp32: {
      const auto v = static_cast<float>(value);
      std::memcpy(data + i * 4, &v, 4);
      break;
    }
    case DType::Fp64: std::memcpy(data + i * 8, &value, 8); break;
    case DType::Fp16:
    case DType::Bf16: {
      const auto single = static_cast<float>(value);
      const std::uint16_t v = dtype == DType::Fp16 ? fp32ToFp16(single) : fp32ToBf16(single);
      std::memcpy(data + i * 2, &v, 2);
      break;
    }
    default: break;
  }
}

}  // namespace gradscope::methods
