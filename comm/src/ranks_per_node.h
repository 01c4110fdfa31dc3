#pragma once

// GRADSCOPE_RANKS_PER_NODE=k: pretend that every k consecutive ranks share a node (to try hierarchical
// strategies on one machine). Shared by the backends' nodeColor().

#include <climits>
#include <cstdlib>
#include <optional>

#include "gradscope/common/error.h"
#include "gradscope/common/job_environment.h"

namespace gradscope::comm::detail {

// k when the variable is set; throws gradscope::Error when it is set to anything but a positive integer.
inline std::optional<int> ranksPerNode() {
  const char* text = std::getenv(env::kRanksPerNode);
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  const long per_node = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || per_node < 1 || per_node > INT_MAX)
    fail("{}='{}': expected a positive number of ranks", env::kRanksPerNode, text);
  return static_cast<int>(per_node);
}

}  // namespace gradscope::comm::detail
