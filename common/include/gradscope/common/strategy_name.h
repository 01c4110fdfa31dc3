#pragma once

// Strategy names (shared/DESIGN.md "Strategy names"): aggregator/transport[/wire], e.g. "sum/native",
// "sum/rs_ag/bf16", "sum/nccl.tree.ll128", "sum/mpi.ring", "adacons/native". They are stored in traces
// and recommendation files and read by the agent, the bench, the tuner, its exporters and the NCCL tuner
// plugin, all through this one grammar: a name means the same strategy to every part, or none.
// Printed in lower case; parsed case-insensitively.

#include <optional>
#include <string>
#include <string_view>

#include "gradscope/common/types.h"

namespace gradscope {

// Async: the job stops waiting for the other ranks (docs/async.md); its "transport" part names how
// stale the result is, and the reduction runs on the backend's own all-reduce.
enum class Aggregator : std::uint8_t { Sum, AdaCons, AdaSum, Async };
std::string_view name(Aggregator aggregator);  // "sum", "adacons", "adasum", "async"
// Case-insensitive, like the look-ups of types.h; nullopt for anything else.
std::optional<Aggregator> parseAggregator(std::string_view text);

// native: the backend's own all-reduce; rs_ag: reduce-scatter + all-gather; reduce_bcast: reduce to
// rank 0 + broadcast; hier: node-local reduce, leaders' all-reduce, node-local broadcast; engine:
// the backend's all-reduce with one algorithm forced (nccl.<algo>.<proto>, mpi.<algorithm>).
enum class Transport : std::uint8_t { Native, RsAg, ReduceBcast, Hier, Engine };

struct StrategyName {
  Aggregator aggregator = Aggregator::Sum;
  Transport transport = Transport::Native;
  Backend engine = Backend::Unknown;  // Transport::Engine: Mpi or Nccl
  int algorithm = -1;                 // Engine: Open MPI tuned id (mpiAlgorithmName), or NCCL algorithm code
  int protocol = -1;                  // Engine with NCCL: protocol code
  std::optional<WireFormat> wire;     // unset: the job's own dtype
  // Aggregator::Async (transport Native): at step t >= K a call site returns
  //   Stale: the sum of the same call site at step t-K (every rank the same value),
  //   Dga:   that sum corrected by this rank's own gradients, sum[t-K] + N * (g[t] - g[t-K]) (delayed
  //          gradient averaging, Zhu et al., NeurIPS 2021);
  // and steps t < K are synchronous. Written "async/stale<K>", "async/dga<K>", K from 1 to kMaxStaleness.
  enum class Delay : std::uint8_t { None, Stale, Dga };
  Delay delay = Delay::None;
  int staleness = 0;

  // The canonical spelling: "sum/native", "sum/rs_ag/bf16", "sum/nccl.tree.ll128", "sum/mpi.ring".
  std::string text() const;
  bool operator==(const StrategyName&) const = default;
};

// The parts of aggregator/transport[/wire] as written, unchecked: the text before the first '/', between
// it and the next one, and everything after that (unset when there is no second '/'). For readers that
// must tell names they do not know apart (an unknown NCCL algorithm from another strategy); nullopt
// without a '/'.
struct StrategyParts {
  std::string_view aggregator, transport;
  std::optional<std::string_view> wire;
};
std::optional<StrategyParts> splitStrategyName(std::string_view text);

inline constexpr int kMaxStaleness = 4;

// Parses a strategy name in any letter case; a wire part "native" is the job's dtype (left unset).
// NCCL algorithms and protocols are taken in either of NCCL's spellings (parseNcclAlgo). Refused, with
// nullopt and one line in `error` that lists the valid forms: unknown parts, a wire precision for
// adacons or adasum (they need the gradients themselves), adasum over anything but native, an async name
// other than stale<K> or dga<K> with K from 1 to kMaxStaleness.
std::optional<StrategyName> parseStrategyName(std::string_view text, std::string* error = nullptr);

// The Open MPI tuned all-reduce algorithms a strategy can force, by their coll_tuned_allreduce_algorithm
// value (Open MPI 4.1 coll_tuned_allreduce_decision.c, also what OMPI_MCA_coll_tuned_allreduce_algorithm
// takes): 1 basic_linear, 2 nonoverlapping, 3 recursive_doubling, 4 ring, 5 segmented_ring,
// 6 rabenseifner. Value 0 ("ignore": let the decision rules choose) is Transport::Native and has no
// name here, so ids 1..kMpiAlgorithmCount are exactly the mpi.<algorithm> transports.
inline constexpr int kMpiAlgorithmCount = 6;
// An empty view for an id outside 1..kMpiAlgorithmCount.
std::string_view mpiAlgorithmName(int id);
// Case-insensitive; nullopt for an unknown name (and for "ignore").
std::optional<int> parseMpiAlgorithm(std::string_view name);

}  // namespace gradscope
