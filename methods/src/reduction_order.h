#pragma once

// Internal: the orders that define results bit for bit and that the CPU (adaptive.cc, error_metrics.cc)
// and CUDA (cuda/adaptive.cu, cuda/reduce.cu) implementations must share. Changing a value here
// changes results on both sides together.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradscope::methods::detail {

// fp64 reductions run over fixed blocks of elements (16 lanes per block, lanes then blocks in order).
inline constexpr std::size_t kAdaptiveReductionBlock = 4096;  // adaptive.h dot products and norms
inline constexpr std::size_t kMetricsReductionBlock = 16384;  // error_metrics.h sums

// The binary-counter pairwise order of local_sum.h's Tree as a list of `destination = a ⊕ b` steps over
// inputs and slots; the last step produces the result. Used by AdaSum's recursive form.
enum class TreeShape : std::uint8_t { InputInput, SlotInput, SlotSlot };
struct TreeStep {
  TreeShape shape;
  std::size_t a;  // InputInput: input; SlotInput: slot (also the destination); SlotSlot: the other slot
  std::size_t b;  // InputInput, SlotInput: input; SlotSlot: the destination slot
  std::size_t destination;
};

inline std::vector<TreeStep> treeSteps(std::size_t n, std::size_t& slots) {
  std::vector<TreeStep> steps;
  slots = 0;
  std::size_t pairs = 0;
  for (std::size_t i = 1; i < n; i += 2) {
    const auto destination = static_cast<std::size_t>(std::countr_one(pairs));
    steps.push_back({TreeShape::InputInput, i - 1, i, destination});
    for (std::size_t level = 0; level < destination; ++level)
      steps.push_back({TreeShape::SlotSlot, level, destination, destination});
    ++pairs;
    slots = std::max(slots, destination + 1);
  }
  bool have_running = false;
  std::size_t running = 0;
  bool odd_input = n % 2 == 1;
  for (std::size_t level = 0; level < slots; ++level) {
    if (((pairs >> level) & 1u) == 0) continue;
    if (odd_input) {
      steps.push_back({TreeShape::SlotInput, level, n - 1, level});
      odd_input = false;
    } else if (have_running) {
      steps.push_back({TreeShape::SlotSlot, running, level, level});
    }
    have_running = true;
    running = level;
  }
  return steps;
}

}  // namespace gradscope::methods::detail
