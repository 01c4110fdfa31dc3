#pragma once

// The distributed aggregation strategies of shared/DESIGN.md ("Strategy names"; their names are
// common/strategy_name.h), written once against communicator.h. A strategy aggregates one buffer of `count`
// elements from every rank into every rank's output:
//   sum/*     recv = Σ_r send_r: bit for bit like sum/native on verifiable inputs (small integers, for
//             which every order of addition is exact) for the lossless strategies, and within the bound
//             of docs/methods.md ("Distributed strategies") for the wire precisions;
//   adacons/* the AdaCons aggregate (adaptive.h; StrategyOptions picks the scale, MatchSumNorm by default
//             so that it can stand in for a sum): the scalars bit-identical to methods::adacons over the
//             ranks' vectors in rank order whenever the fp32 sum of the gradients is exact, the aggregate
//             within (N+2)·2^-24·Σ_i|c_i·g_i| of it (docs/methods.md);
//   adasum/*  the AdaSum aggregate in adaptive.h's tree order, bit-identical to methods::adasum over the
//             ranks' vectors in rank order, for any number of ranks;
//   async/*   one call site's stale (or corrected) sums, async.h: not a function of this run's inputs.
// Every strategy works for any count (0 is a no-op without communication that leaves AdaCons' momentum
// alone; 1; not divisible by the number of ranks), in place (send == recv) and out of place, on every
// rank, and leaves `send` unchanged when out of place.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradscope/comm/communicator.h"
#include "gradscope/common/strategy_name.h"
#include "gradscope/common/types.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/wire.h"

namespace gradscope::comm {

class AsyncWorker;

struct StrategyOptions {
  std::size_t fp8_block = 128;  // scaling block of fp8 wire formats on backends with scaled blocks
  // false: RunStats::wire stays 0. Apply mode reads no statistics, and on NCCL counting costs a host
  // synchronisation per run (the counters are read back), which would stall the job's thread.
  bool wire_stats = true;
  methods::AdaConsOptions adacons{.beta = 0.9, .epsilon = 1e-8, .scale = methods::AdaConsScale::MatchSumNorm};
  // async/*: the worker the call site hands its sums to (one per communicator serves all its sites, made
  // with AsyncWorker::make of that communicator); null: the strategy makes its own, collectively, and
  // `async_thread_start` runs first on its thread (host memory).
  std::shared_ptr<AsyncWorker> async_worker;
  std::function<void()> async_thread_start;
};

// What one run did beyond the result.
struct RunStats {
  // This rank's encode of its input into the wire precision: finite values that overflowed the wire type
  // and NaNs (wire.h). Partial sums that overflow on the way (possible only when some |input| exceeds
  // the wire type's range) are not counted here; they show as non-finite results.
  methods::EncodeStats wire;
  // AdaCons: the step's scalars (α, smoothed α, weights, norms, scale; the same on every rank); null for
  // the other aggregators. Held by pointer so that RunStats stays three words: returning a 128-byte
  // RunStats{} from every sum cost a `rep stos` of 0.05 µs per call, an eighth of an 8-byte MPI
  // all-reduce (docs/benchmarks.md).
  std::unique_ptr<const methods::AdaConsStep> adacons;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  const StrategyName& name() const { return name_; }
  // Lossless: bit-identical to sum/native on verifiable inputs (small integers), for which every order
  // of addition is exact. False for the wire precisions and for AdaCons and AdaSum (not sums).
  virtual bool lossless() const = 0;
  // Collective. `send` and `recv` are `count` elements of `dtype` in the communicator's memory. AdaCons
  // throws gradscope::Error on every rank alike when a step cannot be normalised (adaptive.h).
  virtual RunStats run(const void* send, void* recv, std::size_t count) = 0;

 protected:
  explicit Strategy(StrategyName name) : name_(std::move(name)) {}

 private:
  StrategyName name_;
};

// Creates the strategy for `dtype` on `comm` (collective: it may split or duplicate the communicator,
// and it keeps a reference to `comm`, which must outlive it). Throws gradscope::Error with one line
// when the strategy does not apply (e.g. "sum/native/fp16 needs fp32 input, not fp64", "sum/nccl.ring.ll
// needs the nccl backend, not mpi"). A strategy keeps its scratch buffers (wire codes, partial results)
// in the communicator's memory, sized for the largest count it has run, and AdaCons its momentum.
std::unique_ptr<Strategy> makeStrategy(const StrategyName& name, Communicator& comm, DType dtype,
                                       const StrategyOptions& options = {});

// Every strategy that applies to `dtype` on `comm`, in a stable order (the default of gradscope bench).
// Not the async ones: their time is the step's, not the call's (docs/async.md).
std::vector<StrategyName> applicableStrategies(const Communicator& comm, DType dtype);

}  // namespace gradscope::comm
