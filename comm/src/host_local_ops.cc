#include "host_local_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <vector>

#include "gradscope/common/error.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/cpu_executor.h"
#include "gradscope/methods/delayed.h"
#include "gradscope/methods/wire.h"

namespace gradscope::comm {
namespace {

using methods::CpuExecutor;
using methods::EncodeStats;

// Host buffers are aligned for the widest vector loads of the kernels (and a cache line).
constexpr std::size_t kAlignment = 64;

// Scaled-block records are produced a chunk of blocks at a time: methods::encode writes the codes and
// scales of a chunk into small per-thread arrays (they stay in L1/L2), which are then interleaved into
// records. This keeps methods::encode's vectorised kernels and costs one extra pass over cached data.
constexpr std::size_t kChunkElements = 16384;

void addStats(EncodeStats& into, const EncodeStats& from) {
  into.overflow += from.overflow;
  into.nan += from.nan;
}

void checkFp8(WireFormat format, std::size_t block, const char* what) {
  if (!methods::isFp8(format)) fail("{}: scaled blocks need an fp8 format, not {}", what, name(format));
  if (block == 0) fail("{}: block must be at least 1", what);
}

class HostLocalOps final : public LocalOps {
 public:
  Memory memory() const override { return Memory::Host; }

  Buffer allocate(std::size_t bytes) override {
    if (bytes == 0) return {};
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* data = std::aligned_alloc(kAlignment, rounded);
    if (data == nullptr) fail("host allocation of {} bytes failed", bytes);
    return Buffer(data, bytes, &std::free);
  }

  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
  }
  void fillZero(void* dst, std::size_t bytes) override {
    if (bytes != 0) std::memset(dst, 0, bytes);
  }
  void upload(void* dst, const void* host, std::size_t bytes) override { copy(dst, host, bytes); }
  void download(void* host, const void* src, std::size_t bytes) override { copy(host, src, bytes); }

  EncodeStats encode(WireFormat format, const float* in, std::size_t count, void* out, float* scales,
                     const methods::EncodeOptions& options) override {
    return methods::encode(format, in, count, out, scales, options);
  }
  void decode(WireFormat format, const void* in, const float* scales, std::size_t count, float* out,
              float postscale, std::size_t block) override {
    methods::decode(format, in, scales, count, out, postscale, block);
  }

  EncodeStats encodeScaledBlocks(WireFormat format, const float* in, std::size_t count, std::size_t block,
                                 float prescale, void* records) override {
    checkFp8(format, block, "encodeScaledBlocks");
    if (count == 0) return {};
    const std::size_t record_bytes = sizeof(float) + block;
    const std::size_t blocks = (count + block - 1) / block;
    const std::size_t blocks_per_chunk = std::max<std::size_t>(1, kChunkElements / block);
    auto* out = static_cast<std::uint8_t*>(records);
    std::mutex mutex;
    EncodeStats total;
    CpuExecutor::shared().parallelFor(
        blocks, block * (sizeof(float) + 1), blocks_per_chunk, [&](std::size_t begin, std::size_t end) {
          thread_local std::vector<std::uint8_t> codes;
          thread_local std::vector<float> scales;
          EncodeStats stats;
          for (std::size_t first = begin; first < end; first += blocks_per_chunk) {
            const std::size_t n_blocks = std::min(blocks_per_chunk, end - first);
            const std::size_t first_element = first * block;
            const std::size_t n = std::min(n_blocks * block, count - first_element);
            codes.resize(n_blocks * block);
            scales.resize(n_blocks);
            addStats(stats, methods::encode(format, in + first_element, n, codes.data(), scales.data(),
                                            {.prescale = prescale, .block = block}, serialExecutor()));
            // The unused codes of a short last block are zeros on the wire.
            std::fill(codes.begin() + static_cast<std::ptrdiff_t>(n), codes.end(), std::uint8_t{0});
            packRecords(scales.data(), codes.data(), n_blocks, block, out + first * record_bytes);
          }
          std::lock_guard lock(mutex);
          addStats(total, stats);
        });
    return total;
  }

  void decodeScaledBlocks(WireFormat format, const void* records, std::size_t count, std::size_t block,
                          float postscale, float* out) override {
    checkFp8(format, block, "decodeScaledBlocks");
    if (count == 0) return;
    const std::size_t record_bytes = sizeof(float) + block;
    const std::size_t blocks = (count + block - 1) / block;
    const std::size_t blocks_per_chunk = std::max<std::size_t>(1, kChunkElements / block);
    const auto* in = static_cast<const std::uint8_t*>(records);
    CpuExecutor::shared().parallelFor(
        blocks, block * (sizeof(float) + 1), blocks_per_chunk, [&](std::size_t begin, std::size_t end) {
          thread_local std::vector<std::uint8_t> codes;
          thread_local std::vector<float> scales;
          for (std::size_t first = begin; first < end; first += blocks_per_chunk) {
            const std::size_t n_blocks = std::min(blocks_per_chunk, end - first);
            const std::size_t first_element = first * block;
            const std::size_t n = std::min(n_blocks * block, count - first_element);
            codes.resize(n_blocks * block);
            scales.resize(n_blocks);
            unpackRecords(in + first * record_bytes, n_blocks, block, scales.data(), codes.data());
            methods::decode(format, codes.data(), scales.data(), n, out + first_element, postscale, block,
                            serialExecutor());
          }
        });
  }

  void scale(const float* in, std::size_t count, float factor, float* out) override {
    methods::scale(in, count, factor, out);
  }

  methods::DotProducts dotProducts(const float* a, const float* b, std::size_t count) override {
    return methods::dotProducts(a, b, count);
  }

  void adasumPair(const float* a, const float* b, std::size_t count, float* out) override {
    methods::adasumPair(a, b, count, out);
  }

  void delayedCorrection(DType dtype, const void* gradient, void* older, const void* sum, void* out,
                         std::size_t count, double ranks) override {
    methods::delayedCorrection(dtype, gradient, older, sum, out, count, ranks);
  }

  float finiteAmax(const float* in, std::size_t count) override {
    std::mutex mutex;
    float amax = 0;
    CpuExecutor::shared().parallelFor(count, sizeof(float), 16, [&](std::size_t begin, std::size_t end) {
      float local = 0;
      for (std::size_t i = begin; i < end; ++i) {
        const float magnitude = std::fabs(in[i]);
        // NaN compares false, Inf is excluded explicitly.
        local = magnitude > local && magnitude <= std::numeric_limits<float>::max() ? magnitude : local;
      }
      std::lock_guard lock(mutex);
      amax = std::max(amax, local);
    });
    return amax;
  }
};

}  // namespace

CpuExecutor& serialExecutor() {
  thread_local CpuExecutor executor(1);
  return executor;
}

void unpackRecords(const void* records, std::size_t n, std::size_t block, float* scales,
                   std::uint8_t* codes) {
  const auto* record = static_cast<const std::uint8_t*>(records);
  for (std::size_t r = 0; r < n; ++r, record += sizeof(float) + block) {
    std::memcpy(&scales[r], record, sizeof(float));
    std::memcpy(codes + r * block, record + sizeof(float), block);
  }
}

void packRecords(const float* scales, const std::uint8_t* codes, std::size_t n, std::size_t block,
                 void* records) {
  auto* record = static_cast<std::uint8_t*>(records);
  for (std::size_t r = 0; r < n; ++r, record += sizeof(float) + block) {
    std::memcpy(record, &scales[r], sizeof(float));
    std::memcpy(record + sizeof(float), codes + r * block, block);
  }
}

std::unique_ptr<LocalOps> makeHostLocalOps() {
  return std::make_unique<HostLocalOps>();
}

}  // namespace gradscope::comm
