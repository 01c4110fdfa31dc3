// Kernels of gradscope-sample-nccl-allreduce (kernels.cu). Each returns the cudaError_t of its launch.
#pragma once

#include <cuda_runtime.h>

namespace sample {

// grad[i] = base(i, bucket, step) + rank, base an integer in [0, 1024): this rank's "gradient".
int launchFill(float* grad, unsigned long long n, int bucket, int step, int rank, cudaStream_t stream);
// Adds to *wrong the number of elements of `sum` that differ from the exact sum over `ranks` ranks.
int launchCheck(const float* sum, unsigned long long n, int bucket, int step, int ranks,
                unsigned long long* wrong, cudaStream_t stream);
// into[i] += from[i]: --mode sendrecv's sum of the rank's gradient and the one it received.
int launchAdd(float* into, const float* from, unsigned long long n, cudaStream_t stream);
// An SGD step with the mean gradient: weights -= lr * 1e-3 * (sum / ranks - its expected mean).
int launchSgd(float* weights, const float* sum, unsigned long long n, int ranks, float lr,
              cudaStream_t stream);

}  // namespace sample
