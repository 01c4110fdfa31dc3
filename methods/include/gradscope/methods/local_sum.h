#pragma once

// Local multi-tensor sums: K buffers of one tensor summed into one, in one process (TensorFlow's
// AggregationMethod, gradient accumulation over micro-batches, single-process multi-device).
//
// Summation order, per element, defines each method's result exactly (CPU and CUDA agree bit for bit):
// - AddN: ((x0 + x1) + x2) + ... in one pass, accumulator fp32 for fp16/bf16 inputs (fp64 for fp64),
//   rounded once to the output type.
// - Tree: balanced pairwise: the binary-counter order of pairwise summation. Inputs are combined in
//   pairs (x0+x1), (x2+x3), ...; equal-sized partial sums are combined as soon as both exist; the
//   partials left at the end (K not a power of two) are combined from the smallest (most recent) to
//   the largest. Depth ceil(log2 K). Accumulator as AddN, rounded once.
// - AccumulateN: out = x0; out += x1; ...: K-1 passes over the output, each rounded to the output
//   type (what an in-place running sum of fp16 tensors really does).
// - Kahan: compensated summation in the accumulator type, rounded once.
// Error bounds (u = unit roundoff of the accumulator): AddN and AccumulateN (fp32) <= (K-1)·u·Σ|x|;
// Tree <= ceil(log2 K)·u·Σ|x|; Kahan <= 2u·Σ|x| + O(K u²)Σ|x|; plus one rounding of the result to
// the output type.

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

#include "gradscope/common/types.h"
#include "gradscope/methods/cpu_executor.h"

namespace gradscope::methods {

enum class LocalSumMethod { AddN, Tree, AccumulateN, Kahan };

inline constexpr LocalSumMethod kLocalSumMethods[] = {LocalSumMethod::AddN, LocalSumMethod::Tree,
                                                      LocalSumMethod::AccumulateN, LocalSumMethod::Kahan};

// "local/add_n", "local/tree", "local/accumulate_n", "local/kahan".
std::string_view strategyName(LocalSumMethod method);
std::optional<LocalSumMethod> parseLocalSumMethod(std::string_view strategy);

// Element types the local sums accept.
bool localSumSupports(DType dtype);  // Fp32, Fp16, Bf16, Fp64

// Sums `inputs` (K >= 1 buffers of `count` elements of `dtype`) into `output` (same dtype, may alias
// inputs[0], must not alias another input). Throws gradscope::Error for an unsupported dtype or K = 0.
void localSum(LocalSumMethod method, DType dtype, std::span<const void* const> inputs, void* output,
              std::size_t count, CpuExecutor& executor = CpuExecutor::shared());

// The fp64 reference: the inputs converted to fp64 and summed in fp64 (AddN order) into `output`.
void referenceSum(DType dtype, std::span<const void* const> inputs, double* output, std::size_t count,
                  CpuExecutor& executor = CpuExecutor::shared());

// Bytes the method reads and writes in memory for K inputs of `count` elements (the bandwidth model
// its benchmark reports): (K + 1)·n·size for the one-pass methods, 3(K - 1)·n·size for AccumulateN
// with K >= 2 (each pass reads the running sum and one input and writes the sum back).
std::size_t localSumBytesMoved(LocalSumMethod method, DType dtype, std::size_t inputs, std::size_t count);

}  // namespace gradscope::methods
