#pragma once

// What the kinds of the `drops` table mean (docs/schema.md), for every reader that explains them
// (gradscope report, the viewer): the agent's kinds as common/drop_kind.h declares them (docs/agent.md),
// the NCCL profiler plugin's own `nccl_profile_*` (docs/nccl-profiler-plugin.md), and any other kind, a
// newer agent's, in general terms.

#include <string>

namespace gradscope::storage {

// Whether events of this kind are calls that are missing from `calls` (the totals miss them), rather
// than detail missing from calls that are recorded.
bool dropLosesCalls(const std::string& kind);

// One line for a person: what was dropped and why (and the setting that changes it, where one does).
std::string dropMeaning(const std::string& kind);

}  // namespace gradscope::storage
