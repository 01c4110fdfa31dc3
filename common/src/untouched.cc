#include "gradscope/common/untouched.h"

namespace gradscope {
namespace {

struct Entry {
  std::string_view name;
  std::string_view meaning;
};

constexpr Entry kEntries[kUntouchedReasons] = {
    {"intercommunicator",
     "calls on MPI intercommunicators: a sum there is the other group's, and the strategies run on "
     "intracommunicators"},
    {"invalid_arguments", "calls with a negative count or a null buffer, which the library refuses"},
    {"not_prepared",
     "calls on communicators the agent did not see created, in a job at MPI_THREAD_MULTIPLE: there it makes "
     "its own communicators only inside the job's creation calls (Open MPI can deadlock when threads create "
     "communicators at once), and MPI_Comm_idup, MPI_Comm_spawn and the like are not wrapped"},
    {"single_rank",
     "calls on communicators of one rank (MPI_COMM_SELF, a split of one): the sum is the input, so no "
     "strategy has anything to aggregate, and times measured there would stand for no reduction of the job"},
};

}  // namespace

std::string_view name(Untouched reason) {
  return kEntries[static_cast<std::size_t>(reason)].name;
}

std::optional<Untouched> parseUntouched(std::string_view text) {
  for (std::size_t i = 0; i < kUntouchedReasons; ++i)
    if (kEntries[i].name == text) return static_cast<Untouched>(i);
  return std::nullopt;
}

std::string_view meaning(Untouched reason) {
  return kEntries[static_cast<std::size_t>(reason)].meaning;
}

}  // namespace gradscope
