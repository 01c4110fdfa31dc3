#include "gradscope/storage/drops.h"

#include "gradscope/common/drop_kind.h"

namespace gradscope::storage {

bool dropLosesCalls(const std::string& kind) {
  const std::optional<DropKind> known = parseDropKind(kind);
  return known && losesCalls(*known);
}

std::string dropMeaning(const std::string& kind) {
  if (const std::optional<DropKind> known = parseDropKind(kind)) return std::string(meaning(*known));
  if (kind.starts_with("nccl_profile_"))
    return "the NCCL profiler plugin's own bounded pool or queue was full: collectives it did not record";
  return "events the agent could not record";
}

}  // namespace gradscope::storage
