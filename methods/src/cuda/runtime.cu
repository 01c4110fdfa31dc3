// The CUDA runtime behind cuda.h: whether a GPU is usable, RAII device memory, copies, and the error
// checking every other .cu file uses. Nothing here exits or aborts: every CUDA error becomes a
// gradscope::Error with one line naming the call.

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "common.cuh"
#include "gradscope/common/error.h"
#include "gradscope/methods/cuda.h"

namespace gradscope::methods::cuda {
namespace detail {

void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  // Clear a non-sticky error so that it does not resurface from an unrelated later call.
  (void)cudaGetLastError();
  fail("CUDA error in {}: {} ({})", call, cudaGetErrorString(status), cudaGetErrorName(status));
}

void checkLaunch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    fail("CUDA error launching {}: {} ({})", kernel, cudaGetErrorString(status), cudaGetErrorName(status));
  }
}

namespace {

struct Availability {
  bool ok = false;
  std::string reason;
};

// The oldest compute capability this library has code for (x10: 800 = sm_80). Every listed
// architecture is compiled to SASS and to PTX (CMake's "80;90" means both), so any newer GPU runs
// the kernels through the driver's JIT.
constexpr int minimumArch() {
#if defined(__CUDA_ARCH_LIST__)
  constexpr int archs[] = {__CUDA_ARCH_LIST__};
  int lowest = archs[0];
  for (int arch : archs) lowest = arch < lowest ? arch : lowest;
  return lowest;
#else
  return 800;
#endif
}

// Decided once per process. Only queries that need no CUDA context (device count, attributes), so
// asking does not create a context on device 0 behind a multi-GPU application's back.
Availability probe() {
  Availability result;
  int devices = 0;
  // Without a driver this returns "CUDA driver version is insufficient" (or "no CUDA-capable device");
  // any error at all means no GPU here.
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    result.reason = fmt::format("no usable GPU: cudaGetDeviceCount failed: {} ({})",
                                cudaGetErrorString(status), cudaGetErrorName(status));
    return result;
  }
  if (devices <= 0) {
    result.reason = "no usable GPU: the CUDA driver reports no devices";
    return result;
  }
  int device = 0;
  int major = 0;
  int minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    const cudaError_t error = cudaGetLastError();
    result.reason =
        fmt::format("no usable GPU: cannot query device properties: {}", cudaGetErrorString(error));
    return result;
  }
  const int arch = major * 100 + minor * 10;
  if (arch < minimumArch()) {
    result.reason =
        fmt::format("no usable GPU: device {} is sm_{}{}, gradscope's CUDA kernels need sm_{} or newer",
                    device, major, minor, minimumArch() / 10);
    return result;
  }
  result.ok = true;
  return result;
}

const Availability& availability() {
  static const Availability cached = probe();  // thread-safe one-time initialisation
  return cached;
}

// Streaming multiprocessors per device, queried once per device.
constexpr int kMaxDevices = 64;
std::atomic<int> multiprocessors[kMaxDevices];
std::atomic<int> threads_per_multiprocessor[kMaxDevices];

}  // namespace

void requireDevice() {
  const Availability& state = availability();
  if (!state.ok) throw Error(state.reason);
}

unsigned gridFor(std::size_t items) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  int sms = 0;
  int threads = 0;
  if (device >= 0 && device < kMaxDevices) {
    sms = multiprocessors[device].load(std::memory_order_relaxed);
    threads = threads_per_multiprocessor[device].load(std::memory_order_relaxed);
  }
  if (sms == 0) {
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device),
          "cudaDeviceGetAttribute");
    if (device >= 0 && device < kMaxDevices) {
      threads_per_multiprocessor[device].store(threads, std::memory_order_relaxed);
      multiprocessors[device].store(sms, std::memory_order_relaxed);
    }
  }
  // Every SM full of resident threads (2048 per SM on Ampere and Hopper: 8 blocks of 256); the
  // grid-stride loops absorb the rest, so one wave does all the work without a tail.
  const std::size_t resident =
      static_cast<std::size_t>(sms) * static_cast<std::size_t>(std::max(threads, 256)) / kBlockThreads;
  const std::size_t needed = (items + kBlockThreads - 1) / kBlockThreads;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(needed, resident)));
}

Scratch::Scratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes > 0) check(cudaMallocAsync(&data_, bytes, stream), "cudaMallocAsync");
}

Scratch::~Scratch() {
  if (data_ != nullptr) (void)cudaFreeAsync(data_, stream_);
}

PointerTableBuilder::PointerTableBuilder(std::span<const void* const> pointers, cudaStream_t stream)
    : stream_(stream) {
  table_.count = static_cast<int>(pointers.size());
  table_.device_pointers = nullptr;
  if (pointers.size() <= static_cast<std::size_t>(kInlinePointers)) {
    std::copy(pointers.begin(), pointers.end(), table_.inline_pointers);
    return;
  }
  const std::size_t bytes = pointers.size() * sizeof(void*);
  check(cudaMallocAsync(&device_, bytes, stream), "cudaMallocAsync");
  // From pageable memory: the runtime stages the bytes before returning, so `pointers` may go away.
  const cudaError_t status = cudaMemcpyAsync(device_, pointers.data(), bytes, cudaMemcpyHostToDevice, stream);
  if (status != cudaSuccess) {
    (void)cudaFreeAsync(device_, stream);
    check(status, "cudaMemcpyAsync (input pointer table)");
  }
  table_.device_pointers = static_cast<const void* const*>(device_);
}

PointerTableBuilder::~PointerTableBuilder() {
  if (device_ != nullptr) (void)cudaFreeAsync(device_, stream_);
}

}  // namespace detail

bool available(std::string* reason) {
  const auto& state = detail::availability();
  if (reason != nullptr) *reason = state.ok ? std::string() : state.reason;
  return state.ok;
}

std::string deviceDescription() {
  detail::requireDevice();
  int device = 0;
  detail::check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp properties{};
  detail::check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return fmt::format("{} (sm_{}{})", properties.name, properties.major, properties.minor);
}

// ---- DeviceBuffer ----------------------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  detail::requireDevice();
  if (bytes == 0) return;
  const cudaError_t status = cudaMalloc(&data_, bytes);
  if (status != cudaSuccess) {
    data_ = nullptr;
    (void)cudaGetLastError();
    fail("CUDA error in cudaMalloc({} bytes): {} ({})", bytes, cudaGetErrorString(status),
         cudaGetErrorName(status));
  }
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  // cudaFree waits for work using the memory; its error (e.g. a sticky kernel fault) is reported by
  // the next checked call, never thrown from a destructor.
  if (data_ != nullptr) (void)cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

// Enqueued on `stream`. From pageable memory the runtime has copied `host` by the time this returns;
// from pinned memory the caller keeps `host` unchanged until the stream reaches the copy.
void DeviceBuffer::upload(const void* host, std::size_t bytes, Stream stream) {
  detail::requireDevice();
  if (bytes > bytes_) fail("DeviceBuffer::upload: {} bytes do not fit a buffer of {} bytes", bytes, bytes_);
  if (bytes == 0) return;
  detail::check(cudaMemcpyAsync(data_, host, bytes, cudaMemcpyHostToDevice, detail::toCuda(stream)),
                "cudaMemcpyAsync (host to device)");
}

void DeviceBuffer::download(void* host, std::size_t bytes, Stream stream) const {
  detail::requireDevice();
  if (bytes > bytes_)
    fail("DeviceBuffer::download: {} bytes requested from a buffer of {} bytes", bytes, bytes_);
  if (bytes > 0) {
    detail::check(cudaMemcpyAsync(host, data_, bytes, cudaMemcpyDeviceToHost, detail::toCuda(stream)),
                  "cudaMemcpyAsync (device to host)");
  }
  detail::check(cudaStreamSynchronize(detail::toCuda(stream)), "cudaStreamSynchronize");
}

void synchronize(Stream stream) {
  detail::requireDevice();
  detail::check(cudaStreamSynchronize(detail::toCuda(stream)), "cudaStreamSynchronize");
}

void copy(void* dst, const void* src, std::size_t bytes, Stream stream) {
  detail::requireDevice();
  if (bytes == 0) return;
  detail::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, detail::toCuda(stream)),
                "cudaMemcpyAsync (device to device)");
}

}  // namespace gradscope::methods::cuda
