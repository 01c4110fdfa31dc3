#pragma once

// Which call site a reduction is, step after step: what "the same call in the previous step" means to the
// async strategies (docs/async.md, "Call sites"). A site is a communicator and the ordinal of the call
// among that communicator's candidate reductions (sum all-reduces explore and apply may take) in its
// step; it is expected to keep its (count, dtype, op) from step to step.
//
// The step is the job's marked step (GRADSCOPE_STEP_CALLS, GRADSCOPE_STEP_NVTX) where it marks them.
// Otherwise it is counted here, per communicator: a step begins when the communicator's first candidate
// call's (count, dtype, op) comes again. That rule fails for a job whose first reduction's size recurs
// inside a step; its sites then change size, which the async strategies refuse (they run the step
// synchronously and say so), and marking the steps fixes it.
//
// A pure function of each communicator's sequence of candidate calls: the same on every rank. Called
// from the interposers on every candidate call while explore or apply is on; one lock (communicators on
// different threads).

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "gradscope/common/types.h"

namespace gradscope::agent {

struct CallSite {
  std::uint32_t ordinal = 0;  // among the communicator's candidate calls of its step, from 0
  std::int64_t step = 0;      // the communicator's step (marked, or counted here from 0)
  bool changed = false;       // the ordinal held another (count, dtype, op) the last time it was called
  bool reshaped = false;      // the first call of a step after one with another number of calls than its own
                              // predecessor: every site of the communicator may have moved
};

class CallSites {
 public:
  // `marked_step`: the job's step of the call, -1 where it marks none.
  CallSite next(std::uint32_t comm, std::int64_t marked_step, std::size_t count, DType dtype, ReduceOp op);
  // The communicator is freed: a new one may take its index.
  void forget(std::uint32_t comm);

  static constexpr std::uint32_t kMaxSites = 4096;  // per communicator and step; later calls share the last

 private:
  struct Shape {
    std::size_t count = 0;
    DType dtype = DType::Other;
    ReduceOp op = ReduceOp::None;
    bool operator==(const Shape&) const = default;
  };
  struct Comm {
    bool started = false;
    Shape head;                  // the first call's (counted steps)
    std::int64_t step = -1;      // the step in progress
    std::uint32_t calls = 0;     // candidate calls in it so far
    std::uint32_t previous = 0;  // calls of the step before it (0: none yet)
    std::vector<Shape> sites;    // by ordinal
  };
  std::mutex mutex_;
  std::unordered_map<std::uint32_t, Comm> comms_;
};

CallSites& callSites();

}  // namespace gradscope::agent
