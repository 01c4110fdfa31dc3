// Strategy names (shared/DESIGN.md "Strategy names"): aggregator/transport[/wire], printed in lower case
// and parsed case-insensitively.

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <string_view>

#include "gradscope/comm/strategy.h"
#include "gradscope/common/error.h"

namespace gradscope::comm {
namespace {

// Open MPI's coll/tuned all-reduce algorithm ids (coll_tuned_allreduce_decision.c); 0 is "let the
// decision rules choose", which is what Transport::Native already is.
constexpr std::array<std::string_view, 7> kMpiAlgorithms = {
    "", "basic_linear", "nonoverlapping", "recursive_doubling", "ring", "segmented_ring", "rabenseifner"};

constexpr std::string_view kValidForms =
    "valid: sum/<transport>[/<wire>], adacons/<transport>, adasum/native; transport native, rs_ag, "
    "reduce_bcast, "
    "hier, nccl.<tree|ring|collnetdirect|collnetchain|nvls|nvlstree|pat>.<ll|ll128|simple> or "
    "mpi.<basic_linear|nonoverlapping|recursive_doubling|ring|segmented_ring|rabenseifner>; wire fp16, bf16, "
    "fp8e4m3 or fp8e5m2";

std::string lowerCase(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower;
}

std::optional<int> parseNcclIndex(std::string_view text, int count, std::string_view (*name)(int)) {
  for (int index = 0; index < count; ++index)
    if (text == lowerCase(name(index))) return index;
  return std::nullopt;
}

std::optional<Aggregator> parseAggregator(std::string_view text) {
  if (text == "sum") return Aggregator::Sum;
  if (text == "adacons") return Aggregator::AdaCons;
  if (text == "adasum") return Aggregator::AdaSum;
  return std::nullopt;
}

// Fills the transport fields of `name` from "native", "nccl.ring.ll128", ...; false when unknown.
bool parseTransport(std::string_view text, StrategyName& name) {
  if (text == "native") name.transport = Transport::Native;
  else if (text == "rs_ag") name.transport = Transport::RsAg;
  else if (text == "reduce_bcast") name.transport = Transport::ReduceBcast;
  else if (text == "hier") name.transport = Transport::Hier;
  else if (text.starts_with("mpi.")) {
    const std::optional<int> algorithm = parseMpiAlgorithm(text.substr(4));
    if (!algorithm) return false;
    name.transport = Transport::Engine;
    name.engine = Backend::Mpi;
    name.algorithm = *algorithm;
  } else if (text.starts_with("nccl.")) {
    const std::string_view rest = text.substr(5);
    const std::size_t dot = rest.find('.');
    if (dot == std::string_view::npos) return false;
    const std::optional<int> algorithm = parseNcclIndex(rest.substr(0, dot), kNcclAlgoCount, ncclAlgoName);
    const std::optional<int> protocol = parseNcclIndex(rest.substr(dot + 1), kNcclProtoCount, ncclProtoName);
    if (!algorithm || !protocol) return false;
    name.transport = Transport::Engine;
    name.engine = Backend::Nccl;
    name.algorithm = *algorithm;
    name.protocol = *protocol;
  } else {
    return false;
  }
  return true;
}

std::optional<StrategyName> refuse(std::string_view text, std::string_view reason, std::string* error) {
  if (error != nullptr) *error = fmt::format("bad strategy name '{}' ({}); {}", text, reason, kValidForms);
  return std::nullopt;
}

}  // namespace

std::string_view mpiAlgorithmName(int id) {
  return id >= 1 && id < static_cast<int>(kMpiAlgorithms.size())
             ? kMpiAlgorithms[static_cast<std::size_t>(id)]
             : std::string_view();
}

std::optional<int> parseMpiAlgorithm(std::string_view name) {
  const std::string lower = lowerCase(name);
  for (std::size_t id = 1; id < kMpiAlgorithms.size(); ++id)
    if (lower == kMpiAlgorithms[id]) return static_cast<int>(id);
  return std::nullopt;
}

std::string StrategyName::text() const {
  std::string text;
  switch (aggregator) {
    case Aggregator::Sum: text = "sum/"; break;
    case Aggregator::AdaCons: text = "adacons/"; break;
    case Aggregator::AdaSum: text = "adasum/"; break;
  }
  switch (transport) {
    case Transport::Native: text += "native"; break;
    case Transport::RsAg: text += "rs_ag"; break;
    case Transport::ReduceBcast: text += "reduce_bcast"; break;
    case Transport::Hier: text += "hier"; break;
    case Transport::Engine:
      if (engine == Backend::Mpi) text += fmt::format("mpi.{}", mpiAlgorithmName(algorithm));
      else
        text +=
            fmt::format("nccl.{}.{}", lowerCase(ncclAlgoName(algorithm)), lowerCase(ncclProtoName(protocol)));
      break;
  }
  if (wire) text += fmt::format("/{}", methods::name(*wire));
  return text;
}

std::optional<StrategyName> parseStrategyName(std::string_view text, std::string* error) {
  const std::string lower = lowerCase(text);
  const std::string_view rest = lower;
  const std::size_t first = rest.find('/');
  if (first == std::string_view::npos) return refuse(text, "no transport", error);
  const std::size_t second = rest.find('/', first + 1);
  const std::string_view aggregator_text = rest.substr(0, first);
  const std::string_view transport_text =
      rest.substr(first + 1, second == std::string_view::npos ? std::string_view::npos : second - first - 1);

  StrategyName name;
  const std::optional<Aggregator> aggregator = parseAggregator(aggregator_text);
  if (!aggregator) return refuse(text, fmt::format("unknown aggregator '{}'", aggregator_text), error);
  name.aggregator = *aggregator;
  if (!parseTransport(transport_text, name))
    return refuse(text, fmt::format("unknown transport '{}'", transport_text), error);
  if (second != std::string_view::npos) {
    const std::string_view wire_text = rest.substr(second + 1);
    // "native" is the job's own dtype, which the printed form leaves out.
    if (wire_text != "native") {
      name.wire = methods::parseWireFormat(wire_text);
      if (!name.wire) return refuse(text, fmt::format("unknown wire precision '{}'", wire_text), error);
    }
  }
  // AdaCons and AdaSum need the gradients themselves (dot products), not codes of a narrower type.
  // AdaCons' two all-reduces are sums that any transport can carry; AdaSum is its own pairwise schedule.
  if (name.aggregator != Aggregator::Sum && name.wire)
    return refuse(text, "adacons and adasum take no wire precision", error);
  if (name.aggregator == Aggregator::AdaSum && name.transport != Transport::Native)
    return refuse(text, "adasum only runs as adasum/native", error);
  return name;
}

}  // namespace gradscope::comm
