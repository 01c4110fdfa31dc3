#pragma once

// The same methods as CUDA kernels, on device buffers the caller owns, ordered on the caller's stream.
// Results are bit-identical to the CPU kernels (same summation orders, same conversions) except where
// noted. Functions that return host values (statistics, metrics) synchronise the stream; all others
// only enqueue. `Stream` is a cudaStream_t (nullptr = the legacy default stream); device pointers are
// passed as plain pointers so this header needs no CUDA headers.
//
// Without a usable GPU (built without CUDA, no driver, no device) available() says why, and every
// other function throws gradscope::Error with that reason: callers fall back to the CPU kernels.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "gradscope/common/types.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/error_metrics.h"
#include "gradscope/methods/local_sum.h"
#include "gradscope/methods/wire.h"

namespace gradscope::methods::cuda {

using Stream = void*;

// True when CUDA kernels can run here; otherwise false and `reason` (if given) says why in one line.
bool available(std::string* reason = nullptr);
// Name and compute capability of the current device, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
std::string deviceDescription();

// Device memory owned by RAII, for tests, benchmarks and the agent's shadow buffers.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t size() const { return bytes_; }
  void upload(const void* host, std::size_t bytes, Stream stream = nullptr);
  void download(void* host, std::size_t bytes, Stream stream = nullptr) const;  // synchronises

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

void synchronize(Stream stream);

// local_sum.h on the GPU: `inputs` is a host array of K device pointers.
void localSum(LocalSumMethod method, DType dtype, std::span<const void* const> inputs, void* output,
              std::size_t count, Stream stream);
void referenceSum(DType dtype, std::span<const void* const> inputs, double* output, std::size_t count,
                  Stream stream);

// wire.h on the GPU. `stats` is a device array of 2 uint64 (overflow, nan) that encode adds to.
void encode(WireFormat format, const float* in, std::size_t count, void* out, float* scales,
            const EncodeOptions& options, std::uint64_t* stats, Stream stream);
void decode(WireFormat format, const void* in, const float* scales, std::size_t count, float* out,
            float postscale, std::size_t block, Stream stream);
// out = in · factor in fp32 (out may be in).
void scale(const float* in, std::size_t count, float factor, float* out, Stream stream);
// Largest finite |x|; 0 for an empty or all-non-finite buffer (synchronises).
float finiteAmax(const float* in, std::size_t count, Stream stream);

// error_metrics.h on the GPU (synchronises).
ErrorMetrics compareToReference(DType dtype, const void* result, const double* reference, std::size_t count,
                                Stream stream);

// adaptive.h on the GPU: `gradients` is a host array of N device pointers.
void mean(Gradients gradients, std::size_t count, float* out, Stream stream);
// Per-rank fp64 dot products and norms the AdaCons α need (synchronises): returns α (adaptive.h).
std::vector<double> adaconsAlpha(Gradients gradients, std::size_t count, double epsilon, Stream stream);
AdaConsStep adacons(Gradients gradients, std::size_t count, AdaConsState& state,
                    const AdaConsOptions& options, float* out, Stream stream);
void adasumPair(const float* a, const float* b, std::size_t count, float* out, Stream stream);
// adaptive.h's dotProducts: the same block order and bits as the CPU (synchronises).
DotProducts dotProducts(const float* a, const float* b, std::size_t count, Stream stream);
void adasum(Gradients gradients, std::size_t count, float* out, Stream stream);
ConsensusStats consensusStats(Gradients gradients, std::size_t count, Stream stream);

// delayed.h on the GPU: out = sum + ranks · (gradient − older), older = gradient (the CPU's bits).
void delayedCorrection(DType dtype, const void* gradient, void* older, const void* sum, void* out,
                       std::size_t count, double ranks, Stream stream);

// Device-to-device copy bandwidth reference for benchmarks: copies `bytes` from src to dst.
void copy(void* dst, const void* src, std::size_t bytes, Stream stream);

}  // namespace gradscope::methods::cuda
