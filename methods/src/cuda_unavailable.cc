// cuda.h in a build without CUDA: nothing is available, and every call says why instead of failing to
// link. Callers check available() first and fall back to the CPU kernels.

#include <string>
#include <utility>

#include "gradscope/common/error.h"
#include "gradscope/methods/cuda.h"

namespace gradscope::methods::cuda {
namespace {

constexpr const char* kReason = "built without CUDA (GRADSCOPE_WITH_CUDA=OFF or no toolkit)";

[[noreturn]] void unavailable() {
  throw Error(kReason);
}

}  // namespace

bool available(std::string* reason) {
  if (reason != nullptr) *reason = kReason;
  return false;
}

std::string deviceDescription() {
  unavailable();
}

DeviceBuffer::DeviceBuffer(std::size_t /*bytes*/) {
  unavailable();
}
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  data_ = std::exchange(other.data_, nullptr);
  bytes_ = std::exchange(other.bytes_, 0);
  return *this;
}
void DeviceBuffer::upload(const void*, std::size_t, Stream) {
  unavailable();
}
void DeviceBuffer::download(void*, std::size_t, Stream) const {
  unavailable();
}

void synchronize(Stream) {
  unavailable();
}

void localSum(LocalSumMethod, DType, std::span<const void* const>, void*, std::size_t, Stream) {
  unavailable();
}
void referenceSum(DType, std::span<const void* const>, double*, std::size_t, Stream) {
  unavailable();
}

void encode(WireFormat, const float*, std::size_t, void*, float*, const EncodeOptions&, std::uint64_t*,
            Stream) {
  unavailable();
}
void decode(WireFormat, const void*, const float*, std::size_t, float*, float, std::size_t, Stream) {
  unavailable();
}
void scale(const float*, std::size_t, float, float*, Stream) {
  unavailable();
}
float finiteAmax(const float*, std::size_t, Stream) {
  unavailable();
}
void delayedCorrection(DType, const void*, void*, const void*, void*, std::size_t, double, Stream) {
  unavailable();
}

ErrorMetrics compareToReference(DType, const void*, const double*, std::size_t, Stream) {
  unavailable();
}

void mean(Gradients, std::size_t, float*, Stream) {
  unavailable();
}
std::vector<double> adaconsAlpha(Gradients, std::size_t, double, Stream) {
  unavailable();
}
AdaConsStep adacons(Gradients, std::size_t, AdaConsState&, const AdaConsOptions&, float*, Stream) {
  unavailable();
}
void adasumPair(const float*, const float*, std::size_t, float*, Stream) {
  unavailable();
}
DotProducts dotProducts(const float*, const float*, std::size_t, Stream) {
  unavailable();
}
void adasum(Gradients, std::size_t, float*, Stream) {
  unavailable();
}
ConsensusStats consensusStats(Gradients, std::size_t, Stream) {
  unavailable();
}

void copy(void*, const void*, std::size_t, Stream) {
  unavailable();
}

}  // namespace gradscope::methods::cuda
