// The GPU side of gradscope-sample-nccl-allreduce (README.md): the "backward pass" that produces each
// rank's gradient, the sum of two ranks' gradients (--mode sendrecv), the check of the all-reduced sum,
// and the SGD update. Launched on the caller's
// stream; nothing here synchronises.
//
// Gradients are small integers stored as floats, so that their sum over the ranks is exact in fp32 in
// any order and under any NCCL algorithm or protocol: the check compares bit for bit.
#include <cuda_runtime.h>

#include "kernels.h"

namespace {

// The base value of element i of bucket `bucket` at step `step`: an integer in [0, 1024).
__device__ __forceinline__ unsigned baseValue(unsigned long long i, int bucket, int step) {
  unsigned long long x = i * 0x9E3779B97F4A7C15ull +
                         static_cast<unsigned long long>(bucket) * 0xBF58476D1CE4E5B9ull +
                         static_cast<unsigned long long>(step) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<unsigned>(x & 1023u);
}

__global__ void fillKernel(float* grad, unsigned long long n, int bucket, int step, int rank) {
  for (unsigned long long i = blockIdx.x * 1ull * blockDim.x + threadIdx.x; i < n;
       i += 1ull * gridDim.x * blockDim.x) {
    grad[i] = static_cast<float>(baseValue(i, bucket, step) + static_cast<unsigned>(rank));
  }
}

// sum over r of (base + r) = ranks * base + ranks * (ranks - 1) / 2, an integer below 2^24 for up to
// about 4000 ranks, so exact in fp32.
__global__ void checkKernel(const float* sum, unsigned long long n, int bucket, int step, int ranks,
                            unsigned long long* wrong) {
  unsigned long long local = 0;
  const unsigned triangle = static_cast<unsigned>(ranks) * static_cast<unsigned>(ranks - 1) / 2u;
  for (unsigned long long i = blockIdx.x * 1ull * blockDim.x + threadIdx.x; i < n;
       i += 1ull * gridDim.x * blockDim.x) {
    const float expected =
        static_cast<float>(static_cast<unsigned>(ranks) * baseValue(i, bucket, step) + triangle);
    if (sum[i] != expected) ++local;
  }
  if (local != 0) atomicAdd(wrong, local);
}

// w -= lr * (sum / ranks - 511.5 - (ranks - 1) / 2): the mean gradient, centred so the weights drift
// slowly instead of growing with every step.
__global__ void sgdKernel(float* weights, const float* sum, unsigned long long n, int ranks, float lr) {
  const float centre = 511.5f + 0.5f * static_cast<float>(ranks - 1);
  const float inv = 1.0f / static_cast<float>(ranks);
  for (unsigned long long i = blockIdx.x * 1ull * blockDim.x + threadIdx.x; i < n;
       i += 1ull * gridDim.x * blockDim.x) {
    weights[i] -= lr * (sum[i] * inv - centre) * 1e-3f;
  }
}

__global__ void addKernel(float* into, const float* from, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * 1ull * blockDim.x + threadIdx.x; i < n;
       i += 1ull * gridDim.x * blockDim.x) {
    into[i] += from[i];
  }
}

unsigned blocksFor(unsigned long long n) {
  const unsigned long long blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1024 ? (blocks == 0 ? 1 : blocks) : 1024);
}

}  // namespace

namespace sample {

int launchFill(float* grad, unsigned long long n, int bucket, int step, int rank, cudaStream_t stream) {
  fillKernel<<<blocksFor(n), 256, 0, stream>>>(grad, n, bucket, step, rank);
  return static_cast<int>(cudaGetLastError());
}

int launchCheck(const float* sum, unsigned long long n, int bucket, int step, int ranks,
                unsigned long long* wrong, cudaStream_t stream) {
  checkKernel<<<blocksFor(n), 256, 0, stream>>>(sum, n, bucket, step, ranks, wrong);
  return static_cast<int>(cudaGetLastError());
}

int launchAdd(float* into, const float* from, unsigned long long n, cudaStream_t stream) {
  addKernel<<<blocksFor(n), 256, 0, stream>>>(into, from, n);
  return static_cast<int>(cudaGetLastError());
}

int launchSgd(float* weights, const float* sum, unsigned long long n, int ranks, float lr,
              cudaStream_t stream) {
  sgdKernel<<<blocksFor(n), 256, 0, stream>>>(weights, sum, n, ranks, lr);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace sample
