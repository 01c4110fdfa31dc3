#include "gradscope/common/strategy_name.h"

#include <algorithm>
#include <array>
#include <cctype>

#include <fmt/format.h>

namespace gradscope {
namespace {

// Index = coll_tuned_allreduce_algorithm value; 0 ("ignore") is Transport::Native and stays nameless.
constexpr std::array<std::string_view, kMpiAlgorithmCount + 1> kMpiAlgorithms = {
    "", "basic_linear", "nonoverlapping", "recursive_doubling", "ring", "segmented_ring", "rabenseifner"};

constexpr std::string_view kAggregatorNames[] = {"sum", "adacons", "adasum", "async"};  // by Aggregator value

std::string lowerCase(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower;
}

// "a|b|c" of a name table in lower case, for the list of valid forms.
std::string alternatives(int first, int end, std::string_view (*name)(int)) {
  std::string out;
  for (int code = first; code < end; ++code) out += (code == first ? "" : "|") + lowerCase(name(code));
  return out;
}

const std::string& validForms() {
  static const std::string text = [] {
    std::string wires;
    for (std::size_t i = 0; i < std::size(kWireFormats); ++i) {
      if (i > 0) wires += i + 1 == std::size(kWireFormats) ? " or " : ", ";
      wires += name(kWireFormats[i]);
    }
    return fmt::format(
        "valid: sum/<transport>[/<wire>], adacons/<transport>, adasum/native, async/stale<K>, async/dga<K> "
        "(K 1 to {}); transport native, rs_ag, "
        "reduce_bcast, hier, nccl.<{}>.<{}> or mpi.<{}>; wire {}",
        kMaxStaleness, alternatives(0, kNcclAlgoCount, ncclAlgoName),
        alternatives(0, kNcclProtoCount, ncclProtoName),
        alternatives(1, kMpiAlgorithmCount + 1, mpiAlgorithmName), wires);
  }();
  return text;
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
    const std::optional<int> algorithm = parseNcclAlgo(rest.substr(0, dot));
    const std::optional<int> protocol = parseNcclProto(rest.substr(dot + 1));
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

// Fills the delay of an async name from "stale2", "dga1", ...; false when unknown or K is out of range.
bool parseDelay(std::string_view text, StrategyName& name) {
  std::string_view digits;
  if (text.starts_with("stale")) name.delay = StrategyName::Delay::Stale, digits = text.substr(5);
  else if (text.starts_with("dga")) name.delay = StrategyName::Delay::Dga, digits = text.substr(3);
  else return false;
  if (digits.size() != 1 || digits[0] < '1' || digits[0] > '0' + kMaxStaleness) return false;
  name.staleness = digits[0] - '0';
  name.transport = Transport::Native;
  return true;
}

std::optional<StrategyName> refuse(std::string_view text, std::string_view reason, std::string* error) {
  if (error != nullptr) *error = fmt::format("bad strategy name '{}' ({}); {}", text, reason, validForms());
  return std::nullopt;
}

}  // namespace

std::string_view name(Aggregator aggregator) {
  const auto index = static_cast<std::size_t>(aggregator);
  return index < std::size(kAggregatorNames) ? kAggregatorNames[index] : "unknown";
}

std::optional<Aggregator> parseAggregator(std::string_view text) {
  const std::string lower = lowerCase(text);
  for (std::size_t index = 0; index < std::size(kAggregatorNames); ++index)
    if (lower == kAggregatorNames[index]) return static_cast<Aggregator>(index);
  return std::nullopt;
}

std::string_view mpiAlgorithmName(int id) {
  return id >= 1 && id <= kMpiAlgorithmCount ? kMpiAlgorithms[static_cast<std::size_t>(id)]
                                             : std::string_view();
}

std::optional<int> parseMpiAlgorithm(std::string_view name) {
  const std::string lower = lowerCase(name);
  for (int id = 1; id <= kMpiAlgorithmCount; ++id)
    if (lower == kMpiAlgorithms[static_cast<std::size_t>(id)]) return id;
  return std::nullopt;
}

std::string StrategyName::text() const {
  std::string text = fmt::format("{}/", name(aggregator));
  if (aggregator == Aggregator::Async)
    return text + fmt::format("{}{}", delay == Delay::Dga ? "dga" : "stale", staleness);
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
  if (wire) text += fmt::format("/{}", name(*wire));
  return text;
}

std::optional<StrategyParts> splitStrategyName(std::string_view text) {
  const std::size_t first = text.find('/');
  if (first == std::string_view::npos) return std::nullopt;
  const std::size_t second = text.find('/', first + 1);
  StrategyParts parts;
  parts.aggregator = text.substr(0, first);
  parts.transport =
      text.substr(first + 1, second == std::string_view::npos ? std::string_view::npos : second - first - 1);
  if (second != std::string_view::npos) parts.wire = text.substr(second + 1);
  return parts;
}

std::optional<StrategyName> parseStrategyName(std::string_view text, std::string* error) {
  const std::string lower = lowerCase(text);
  const std::optional<StrategyParts> parts = splitStrategyName(lower);
  if (!parts) return refuse(text, "no transport", error);

  StrategyName name;
  const std::optional<Aggregator> aggregator = parseAggregator(parts->aggregator);
  if (!aggregator) return refuse(text, fmt::format("unknown aggregator '{}'", parts->aggregator), error);
  name.aggregator = *aggregator;
  if (name.aggregator == Aggregator::Async) {
    if (!parseDelay(parts->transport, name))
      return refuse(text, fmt::format("unknown delay '{}'", parts->transport), error);
    if (parts->wire) return refuse(text, "async takes no wire precision", error);
    return name;
  }
  if (!parseTransport(parts->transport, name))
    return refuse(text, fmt::format("unknown transport '{}'", parts->transport), error);
  // "native" is the job's own dtype, which the printed form leaves out.
  if (parts->wire && *parts->wire != "native") {
    name.wire = parseWireFormat(*parts->wire);
    if (!name.wire) return refuse(text, fmt::format("unknown wire precision '{}'", *parts->wire), error);
  }
  // AdaCons and AdaSum need the gradients themselves (dot products), not codes of a narrower type.
  // AdaCons' two all-reduces are sums that any transport can carry; AdaSum is its own pairwise schedule.
  if (name.aggregator != Aggregator::Sum && name.wire)
    return refuse(text, "adacons and adasum take no wire precision", error);
  if (name.aggregator == Aggregator::AdaSum && name.transport != Transport::Native)
    return refuse(text, "adasum only runs as adasum/native", error);
  return name;
}

}  // namespace gradscope
