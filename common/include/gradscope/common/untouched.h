#pragma once

// Why explore and apply leave a reduction to the job's library exactly as the job issued it, whatever the
// plan or the budget say: no strategy may stand in for it. The agent counts each reason per rank
// (runs.config_json "agent.shadow.untouched", by name) and records the calls as observe mode does;
// gradscope report says what each means. docs/agent.md and docs/reliability.md list them.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace gradscope {

enum class Untouched : std::uint8_t {
  Intercommunicator,  // an MPI intercommunicator: its sum is the remote group's, and Open MPI crashes
                      // making the node split every strategy starts with
  InvalidArguments,   // a negative count or a null buffer: the library refuses it (or so it should)
  NotPrepared,        // a communicator the agent could not prepare when the job created it, where it
                      // must (MPI at MPI_THREAD_MULTIPLE)
  SingleRank,         // a communicator of one rank (MPI_COMM_SELF, a split of one): the sum is the input,
                      // and a strategy's time there says nothing of the job's reductions
};
inline constexpr std::size_t kUntouchedReasons = 4;

// "intercommunicator", "invalid_arguments", "not_prepared", "single_rank": the names in the trace.
std::string_view name(Untouched reason);
std::optional<Untouched> parseUntouched(std::string_view text);
// One line for a person: which calls, and why no strategy ran on them.
std::string_view meaning(Untouched reason);

}  // namespace gradscope
