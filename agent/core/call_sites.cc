#include "core/call_sites.h"

#include <algorithm>

namespace gradscope::agent {

CallSite CallSites::next(std::uint32_t comm, std::int64_t marked_step, std::size_t count, DType dtype,
                         ReduceOp op) {
  const Shape shape{count, dtype, op};
  const std::lock_guard lock(mutex_);
  Comm& state = comms_[comm];
  bool begins = false;
  std::int64_t step = state.step;
  if (marked_step >= 0) {
    begins = marked_step != state.step;
    step = marked_step;
  } else if (!state.started) {
    state.head = shape;
    begins = true;
    step = 0;
  } else if (shape == state.head && state.calls > 0) {
    begins = true;
    step = state.step + 1;
  }
  CallSite site;
  if (begins) {
    // The step that ended had state.calls calls; the one before it state.previous.
    site.reshaped = state.started && state.previous != 0 && state.calls != state.previous;
    if (state.started) state.previous = state.calls;
    state.calls = 0;
    state.step = step;
  }
  state.started = true;
  site.step = state.step;
  site.ordinal = std::min(state.calls, kMaxSites - 1);
  if (state.calls < kMaxSites) ++state.calls;
  if (site.ordinal >= state.sites.size()) state.sites.resize(site.ordinal + 1);
  Shape& known = state.sites[site.ordinal];
  site.changed = known.dtype != DType::Other && !(known == shape);
  known = shape;
  return site;
}

void CallSites::forget(std::uint32_t comm) {
  const std::lock_guard lock(mutex_);
  comms_.erase(comm);
}

CallSites& callSites() {
  static CallSites* const sites = new CallSites();  // never destroyed: job threads may call at exit
  return *sites;
}

}  // namespace gradscope::agent
