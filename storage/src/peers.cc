#include "gradscope/storage/peers.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscope::storage {
namespace {

// The trace's ranks and communicators as the peer analysis needs them: world rank of every rank row, and
// per communicator (its key within its run: a "group") the world rank of each member by comm rank.
class Topology {
 public:
  struct Comm {
    int group = -1;
    int comm_rank = -1;  // the owning rank's index in the communicator
    int size = 0;
  };

  explicit Topology(const TraceReader& reader) {
    for (const RunInfo& run : reader.runs()) world_ = std::max(world_, run.world_size);
    std::unordered_map<std::int64_t, std::int64_t> run_of;
    for (const RankInfo& rank : reader.ranks()) {
      rank_of_[rank.id] = rank.rank;
      run_of[rank.id] = rank.run_id;
      offset_of_[rank.id] = rank.clock_offset_ns;
      world_ = std::max(world_, rank.rank + 1);
    }
    std::map<std::pair<std::int64_t, std::string>, int> groups;
    for (const CommInfo& info : reader.comms()) {
      const auto run = run_of.find(info.rank_id);
      const auto [group, inserted] = groups.try_emplace({run == run_of.end() ? -1 : run->second, info.key},
                                                        static_cast<int>(groups.size()));
      if (inserted) members_.emplace_back();
      comms_[info.id] = {group->second, info.comm_rank, info.size};
      const auto world = rank_of_.find(info.rank_id);
      if (world != rank_of_.end() && info.comm_rank >= 0) {
        auto& members = members_[static_cast<std::size_t>(group->second)];
        if (members.size() <= static_cast<std::size_t>(info.comm_rank))
          members.resize(static_cast<std::size_t>(info.comm_rank) + 1, -1);
        members[static_cast<std::size_t>(info.comm_rank)] = world->second;
      }
    }
  }

  const Comm* comm(std::int64_t comm_id) const {
    const auto it = comms_.find(comm_id);
    return it == comms_.end() ? nullptr : &it->second;
  }
  // -1 when the trace has no row for it.
  int rankOf(std::int64_t rank_id) const {
    const auto it = rank_of_.find(rank_id);
    return it == rank_of_.end() ? -1 : it->second;
  }
  int worldRank(int group, int comm_rank) const {
    const auto& members = members_[static_cast<std::size_t>(group)];
    return comm_rank >= 0 && static_cast<std::size_t>(comm_rank) < members.size()
               ? members[static_cast<std::size_t>(comm_rank)]
               : -1;
  }
  std::int64_t clockOffset(std::int64_t rank_id) const {
    const auto it = offset_of_.find(rank_id);
    return it == offset_of_.end() ? 0 : it->second;
  }
  int world() const { return world_; }

 private:
  std::unordered_map<std::int64_t, int> rank_of_;
  std::unordered_map<std::int64_t, std::int64_t> offset_of_;
  std::unordered_map<std::int64_t, Comm> comms_;
  std::vector<std::vector<int>> members_;  // [group][comm rank] = world rank, -1 unknown
  int world_ = 0;
};

// One direction of a point-to-point call: its send (to dest) or its receive (from source). An MPI_Sendrecv
// has both.
struct Half {
  bool is_send = false;
  int group = -1;  // -1: the call's own communicator has no row
  int from_comm_rank = -1, to_comm_rank = -1;
  int tag = -1;
  int from = -1, to = -1;  // world ranks, -1 when the trace cannot tell
  bool resolved() const { return group >= 0 && from >= 0 && to >= 0; }
};

template <typename Visit>
void forEachHalf(const CallRecord& call, const Topology& topology, Visit&& visit) {
  if (!isPointToPoint(call.api)) return;
  const Collective kind = collectiveOf(call.api);
  const Topology::Comm* comm = topology.comm(call.comm_id);
  const int self = topology.rankOf(call.rank_id);
  const auto half = [&](bool is_send, int peer, int tag) {
    if (peer < 0) return;  // none (MPI_PROC_NULL): no message
    Half h;
    h.is_send = is_send;
    h.tag = tag;
    int own_comm_rank = -1, peer_world = -1;
    if (comm != nullptr) {
      h.group = comm->group;
      own_comm_rank = comm->comm_rank;
      peer_world = topology.worldRank(comm->group, peer);
    }
    if (is_send) {
      h.from_comm_rank = own_comm_rank, h.to_comm_rank = peer;
      h.from = self, h.to = peer_world;
    } else {
      h.from_comm_rank = peer, h.to_comm_rank = own_comm_rank;
      h.from = peer_world, h.to = self;
    }
    visit(h);
  };
  if (kind == Collective::Send || kind == Collective::SendRecv) half(true, call.dest, call.send_tag);
  if (kind == Collective::Recv || kind == Collective::SendRecv) half(false, call.source, call.recv_tag);
}

// A send or receive waiting for its partner, 48 bytes: millions of them may be held at once.
struct Pending {
  std::int32_t group, from, to, tag;  // the matching key: communicator and comm ranks
  std::int64_t enqueue_ns, seq, call_id, bytes;

  auto key() const { return std::tie(group, from, to, tag); }
  // Issue order within a key; the call id settles equal times (it is file order on one rank).
  bool operator<(const Pending& other) const {
    return std::tie(group, from, to, tag, enqueue_ns, seq, call_id) <
           std::tie(other.group, other.from, other.to, other.tag, other.enqueue_ns, other.seq, other.call_id);
  }
};

// Per directed pair of world ranks (from → to): the sender's sends and the receiver's receives.
struct PairTotals {
  std::int64_t sent_bytes = 0, send_calls = 0, send_ns = 0;
  std::int64_t recv_calls = 0, recv_ns = 0;
  // The earliest send's issue time on rank 0's clock: which of two ranks spoke first.
  std::int64_t first_send_ns = std::numeric_limits<std::int64_t>::max();
};

struct PeerTraffic {
  int world = 0;
  std::map<std::pair<int, int>, PairTotals> pairs;    // (from, to), ordered: deterministic output
  std::map<std::pair<int, int>, std::int64_t> calls;  // (rank, peer): point-to-point calls
  std::int64_t unresolved = 0;
};

PeerTraffic peerTraffic(const TraceReader& reader, const Topology& topology) {
  PeerTraffic traffic;
  traffic.world = topology.world();
  reader.forEachPeerCall([&](const CallRecord& call) {
    const std::int64_t duration = call.end_ns - call.start_ns;
    int counted_peer = -1;  // a Sendrecv with one peer on both sides counts once there
    forEachHalf(call, topology, [&](const Half& half) {
      if (!half.resolved()) {
        ++traffic.unresolved;
        return;
      }
      traffic.world = std::max({traffic.world, half.from + 1, half.to + 1});
      PairTotals& pair = traffic.pairs[{half.from, half.to}];
      const int self = half.is_send ? half.from : half.to;
      const int peer = half.is_send ? half.to : half.from;
      if (half.is_send) {
        pair.sent_bytes += call.bytes;
        ++pair.send_calls;
        pair.send_ns += duration;
        pair.first_send_ns =
            std::min(pair.first_send_ns, call.enqueue_ns + topology.clockOffset(call.rank_id));
      } else {
        ++pair.recv_calls;
        pair.recv_ns += duration;
      }
      if (peer != counted_peer) ++traffic.calls[{self, peer}];
      counted_peer = peer;
    });
    return true;
  });
  return traffic;
}

// Strongly connected components of a small graph (the ranks), in topological order of the graph of
// components (Kosaraju: the components come out of the second pass sources first). Iterative: a pipeline
// can be thousands of ranks deep.
std::vector<int> componentsInTopologicalOrder(const std::vector<std::vector<int>>& edges, int& count) {
  const auto n = edges.size();
  std::vector<std::vector<int>> reverse(n);
  for (std::size_t u = 0; u < n; ++u)
    for (int v : edges[u]) reverse[static_cast<std::size_t>(v)].push_back(static_cast<int>(u));
  std::vector<int> finished;
  std::vector<char> seen(n, 0);
  for (std::size_t root = 0; root < n; ++root) {
    if (seen[root]) continue;
    std::vector<std::pair<int, std::size_t>> stack{{static_cast<int>(root), 0}};
    seen[root] = 1;
    while (!stack.empty()) {
      auto& [u, next] = stack.back();
      const auto& out = edges[static_cast<std::size_t>(u)];
      if (next < out.size()) {
        const int v = out[next++];
        if (!seen[static_cast<std::size_t>(v)]) {
          seen[static_cast<std::size_t>(v)] = 1;
          stack.emplace_back(v, 0);
        }
      } else {
        finished.push_back(u);
        stack.pop_back();
      }
    }
  }
  std::vector<int> component(n, -1);
  count = 0;
  for (auto it = finished.rbegin(); it != finished.rend(); ++it) {
    if (component[static_cast<std::size_t>(*it)] >= 0) continue;
    std::vector<int> stack{*it};
    component[static_cast<std::size_t>(*it)] = count;
    while (!stack.empty()) {
      const int u = stack.back();
      stack.pop_back();
      for (int v : reverse[static_cast<std::size_t>(u)])
        if (component[static_cast<std::size_t>(v)] < 0) {
          component[static_cast<std::size_t>(v)] = count;
          stack.push_back(v);
        }
    }
    ++count;
  }
  return component;
}

}  // namespace

struct CommunicatorRanks::Impl {
  Topology topology;
};

CommunicatorRanks::CommunicatorRanks(const TraceReader& reader)
    : impl_(std::make_unique<Impl>(Impl{Topology(reader)})) {}
CommunicatorRanks::CommunicatorRanks(CommunicatorRanks&&) noexcept = default;
CommunicatorRanks& CommunicatorRanks::operator=(CommunicatorRanks&&) noexcept = default;
CommunicatorRanks::~CommunicatorRanks() = default;

int CommunicatorRanks::worldRank(std::int64_t comm_id, int comm_rank) const {
  const Topology::Comm* comm = impl_->topology.comm(comm_id);
  return comm == nullptr ? -1 : impl_->topology.worldRank(comm->group, comm_rank);
}

PeerMessages matchPeerMessages(const TraceReader& reader) {
  const Topology topology(reader);
  PeerMessages result;
  std::vector<Pending> sends, receives;
  reader.forEachPeerCall([&](const CallRecord& call) {
    forEachHalf(call, topology, [&](const Half& half) {
      if (!half.resolved()) {
        ++result.unresolved;
        ++result.unmatched;
        return;
      }
      (half.is_send ? sends : receives)
          .push_back({half.group, half.from_comm_rank, half.to_comm_rank, half.tag, call.enqueue_ns, call.seq,
                      call.id, call.bytes});
    });
    return true;
  });
  std::sort(sends.begin(), sends.end());
  std::sort(receives.begin(), receives.end());
  // Both lists in (key, issue order): the k-th send of a key meets the k-th receive of the same key.
  std::size_t s = 0, r = 0;
  while (s < sends.size() || r < receives.size()) {
    if (r == receives.size() || (s < sends.size() && sends[s].key() < receives[r].key())) {
      ++result.unmatched, ++s;
    } else if (s == sends.size() || receives[r].key() < sends[s].key()) {
      ++result.unmatched, ++r;
    } else {
      const Pending& send = sends[s++];
      const Pending& receive = receives[r++];
      result.messages.push_back({send.call_id, receive.call_id, topology.worldRank(send.group, send.from),
                                 topology.worldRank(send.group, send.to), send.tag, send.bytes});
    }
  }
  std::sort(result.messages.begin(), result.messages.end(),
            [](const PeerMessage& a, const PeerMessage& b) { return a.send_call_id < b.send_call_id; });
  return result;
}

PeerMatrix peerMatrix(const TraceReader& reader) {
  const Topology topology(reader);
  const PeerTraffic traffic = peerTraffic(reader, topology);
  PeerMatrix matrix;
  matrix.ranks = traffic.world;
  matrix.unresolved = traffic.unresolved;
  const auto cells = static_cast<std::size_t>(matrix.ranks) * static_cast<std::size_t>(matrix.ranks);
  for (auto* cellsOf : {&matrix.sent_bytes, &matrix.send_calls, &matrix.send_ns, &matrix.recv_ns,
                        &matrix.recv_calls, &matrix.calls})
    cellsOf->assign(cells, 0);
  const auto at = [&](int row, int column) {
    return static_cast<std::size_t>(row) * static_cast<std::size_t>(matrix.ranks) +
           static_cast<std::size_t>(column);
  };
  for (const auto& [pair, totals] : traffic.pairs) {
    const auto [from, to] = pair;
    matrix.sent_bytes[at(from, to)] += totals.sent_bytes;
    matrix.send_calls[at(from, to)] += totals.send_calls;
    matrix.send_ns[at(from, to)] += totals.send_ns;
    matrix.recv_ns[at(to, from)] += totals.recv_ns;
    matrix.recv_calls[at(to, from)] += totals.recv_calls;
  }
  for (const auto& [pair, calls] : traffic.calls) matrix.calls[at(pair.first, pair.second)] += calls;
  return matrix;
}

std::vector<PipelineRank> pipelineBubbles(const TraceReader& reader) {
  const Topology topology(reader);
  const PeerTraffic traffic = peerTraffic(reader, topology);
  if (traffic.pairs.empty()) return {};

  // The ranks that talk, densely numbered.
  std::map<int, int> index;
  for (const auto& [pair, totals] : traffic.pairs)
    index.try_emplace(pair.first), index.try_emplace(pair.second);
  std::vector<int> rank_of;
  for (auto& [rank, i] : index) {
    i = static_cast<int>(rank_of.size());
    rank_of.push_back(rank);
  }

  // One edge per pair that talked, from the upstream rank: the one that sent first.
  const PairTotals none;
  const auto totalsOf = [&](int from, int to) -> const PairTotals& {
    const auto it = traffic.pairs.find({from, to});
    return it == traffic.pairs.end() ? none : it->second;
  };
  std::vector<std::vector<int>> edges(rank_of.size());
  std::map<std::pair<int, int>, bool> upstream;  // (a, b), a < b: true when a is upstream of b
  for (const auto& [pair, totals] : traffic.pairs) {
    const int a = std::min(pair.first, pair.second), b = std::max(pair.first, pair.second);
    if (a == b || upstream.contains({a, b})) continue;
    const PairTotals& ab = totalsOf(a, b);
    const PairTotals& ba = totalsOf(b, a);
    const bool a_first =
        std::tie(ab.first_send_ns, ba.sent_bytes) < std::tie(ba.first_send_ns, ab.sent_bytes) ||
        (ab.first_send_ns == ba.first_send_ns && ab.sent_bytes == ba.sent_bytes);
    upstream[{a, b}] = a_first;
    const int from = a_first ? a : b, to = a_first ? b : a;
    edges[static_cast<std::size_t>(index.at(from))].push_back(index.at(to));
  }

  // Stages: the longest chain of upstream components before each component.
  int components = 0;
  const std::vector<int> component = componentsInTopologicalOrder(edges, components);
  std::vector<std::vector<int>> members(static_cast<std::size_t>(components));
  for (std::size_t i = 0; i < component.size(); ++i)
    members[static_cast<std::size_t>(component[i])].push_back(static_cast<int>(i));
  std::vector<int> stage_of_component(static_cast<std::size_t>(components), 0);
  for (int c = 0; c < components; ++c)
    for (int u : members[static_cast<std::size_t>(c)])
      for (int v : edges[static_cast<std::size_t>(u)]) {
        const int target = component[static_cast<std::size_t>(v)];
        if (target != c)
          stage_of_component[static_cast<std::size_t>(target)] =
              std::max(stage_of_component[static_cast<std::size_t>(target)],
                       stage_of_component[static_cast<std::size_t>(c)] + 1);
      }
  const auto stageOf = [&](int rank) {
    return stage_of_component[static_cast<std::size_t>(component[static_cast<std::size_t>(index.at(rank))])];
  };

  // Spans from the per-API totals (every call of the rank, not only point-to-point ones).
  std::map<int, std::pair<std::int64_t, std::int64_t>> span;
  for (const TraceReader::ApiTotal& total : reader.apiTotals()) {
    const int rank = topology.rankOf(total.rank_id);
    if (rank < 0 || !index.contains(rank)) continue;
    const auto [it, inserted] = span.try_emplace(rank, total.first_ns, total.last_ns);
    it->second.first = std::min(it->second.first, total.first_ns);
    it->second.second = std::max(it->second.second, total.last_ns);
  }

  std::vector<PipelineRank> out;
  for (const int rank : rank_of) {
    PipelineRank row;
    row.rank = rank;
    row.stage = stageOf(rank);
    if (const auto it = span.find(rank); it != span.end()) row.busy_ns = it->second.second - it->second.first;
    out.push_back(row);
  }
  for (const auto& [pair, totals] : traffic.pairs) {
    const auto [from, to] = pair;  // `to` received from `from`
    if (totals.recv_calls == 0 || from == to) continue;
    const int from_stage = stageOf(from), to_stage = stageOf(to);
    PipelineRank& row = out[static_cast<std::size_t>(index.at(to))];
    if (from_stage < to_stage) {
      row.blocked_ns += totals.recv_ns;
      row.recv_calls += totals.recv_calls;
    } else if (from_stage > to_stage) {
      row.downstream_ns += totals.recv_ns;
      row.downstream_calls += totals.recv_calls;
    }
  }
  std::sort(out.begin(), out.end(), [](const PipelineRank& a, const PipelineRank& b) {
    return std::tie(a.stage, a.rank) < std::tie(b.stage, b.rank);
  });
  return out;
}

std::vector<AllToAllBalance> allToAllBalance(const TraceReader& reader) {
  const Topology topology(reader);
  struct Sum {
    AllToAllBalance row;
    double imbalance_sum = 0;
  };
  std::map<std::pair<int, int>, Sum> sums;
  reader.forEachPeerCall([&](const CallRecord& call) {
    if (collectiveOf(call.api) != Collective::AllToAll || call.peer_max_bytes < 0) return true;
    const int rank = topology.rankOf(call.rank_id);
    auto [it, inserted] = sums.try_emplace({rank, static_cast<int>(call.api)});
    AllToAllBalance& row = it->second.row;
    const Topology::Comm* comm = topology.comm(call.comm_id);
    // The even share of one peer is bytes / size; a call that sent nothing is even.
    const double even = comm != nullptr && comm->size > 0 ? static_cast<double>(call.bytes) / comm->size : 0;
    const double imbalance = even > 0 ? static_cast<double>(call.peer_max_bytes) / even : 1.0;
    if (inserted) {
      row.rank = rank;
      row.api = call.api;
      row.max_peer_bytes = call.peer_max_bytes;
      row.min_peer_bytes = call.peer_min_bytes >= 0 ? call.peer_min_bytes : call.peer_max_bytes;
      row.worst_imbalance = imbalance;
    }
    ++row.calls;
    row.bytes += call.bytes;
    row.time_ns += call.end_ns - call.start_ns;
    row.max_peer_bytes = std::max(row.max_peer_bytes, call.peer_max_bytes);
    if (call.peer_min_bytes >= 0) row.min_peer_bytes = std::min(row.min_peer_bytes, call.peer_min_bytes);
    row.worst_imbalance = std::max(row.worst_imbalance, imbalance);
    it->second.imbalance_sum += imbalance;
    return true;
  });
  std::vector<AllToAllBalance> out;
  for (auto& [key, sum] : sums) {
    sum.row.mean_imbalance = sum.imbalance_sum / static_cast<double>(sum.row.calls);
    out.push_back(sum.row);
  }
  return out;
}

std::vector<FamilyTotals> familyTotals(const TraceReader& reader) {
  const Topology topology(reader);
  std::map<std::pair<int, ApiFamily>, FamilyTotals> totals;
  for (const TraceReader::ApiTotal& total : reader.apiTotals()) {
    const int known = topology.rankOf(total.rank_id);
    const int rank = known >= 0 ? known : static_cast<int>(total.rank_id);
    const ApiFamily family = familyOf(total.api);
    FamilyTotals& row = totals[{rank, family}];
    row.rank = rank;
    row.family = family;
    row.calls += total.calls;
    row.bytes += total.bytes;
    row.time_ns += total.total_ns;
  }
  std::vector<FamilyTotals> out;
  out.reserve(totals.size());
  for (const auto& [key, row] : totals) out.push_back(row);
  return out;
}

MessageFlows::MessageFlows(PeerMessages matched) : matched_(std::move(matched)) {
  received_.reserve(matched_.messages.size());
  for (const PeerMessage& message : matched_.messages)
    received_.emplace_back(message.recv_call_id, message.send_call_id);
  std::sort(received_.begin(), received_.end());
  next_sent_ = matched_.messages.begin();
}

bool MessageFlows::sends(std::int64_t call_id) {
  while (next_sent_ != matched_.messages.end() && next_sent_->send_call_id < call_id) ++next_sent_;
  return next_sent_ != matched_.messages.end() && next_sent_->send_call_id == call_id;
}

std::vector<std::int64_t> MessageFlows::receives(std::int64_t call_id) {
  while (next_received_ < received_.size() && received_[next_received_].first < call_id) ++next_received_;
  std::vector<std::int64_t> sends;
  for (; next_received_ < received_.size() && received_[next_received_].first == call_id; ++next_received_)
    sends.push_back(received_[next_received_].second);
  return sends;
}

std::vector<LinkMeasurement> linkMeasurements(const std::vector<RunInfo>& runs) {
  std::vector<LinkMeasurement> out;
  const auto read = [&out](const nlohmann::json& agent) {
    if (!agent.is_object()) return;
    const auto shadow = agent.find("shadow");
    if (shadow == agent.end() || !shadow->is_object()) return;
    const auto links = shadow->find("links");
    if (links == shadow->end() || !links->is_array()) return;
    for (const auto& link : *links) {
      if (!link.is_object() || !link.contains("host") || !link["host"].is_string() ||
          !link.contains("peer") || !link["peer"].is_string() || !link.contains("bytes") ||
          !link["bytes"].is_number_integer() || !link.contains("ns") || !link["ns"].is_number_integer())
        continue;
      out.push_back({link["host"].get<std::string>(), link["peer"].get<std::string>(),
                     link["bytes"].get<std::int64_t>(), link["ns"].get<std::int64_t>()});
    }
  };
  for (const RunInfo& run : runs) {
    const auto config = nlohmann::json::parse(run.config_json, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) continue;
    if (const auto agent = config.find("agent"); agent != config.end()) read(*agent);
    if (const auto ranks = config.find("agent_ranks"); ranks != config.end() && ranks->is_array())
      for (const auto& entry : *ranks) read(entry);
  }
  return out;
}

HostLinks analyzeLinks(std::span<const LinkMeasurement> measurements) {
  HostLinks links;
  std::map<std::pair<std::string, std::string>, HostLinks::Pair> pairs;
  for (const LinkMeasurement& m : measurements) {
    if (m.host == m.peer || m.bytes <= 0 || m.ns <= 0) continue;
    const auto key = std::minmax(m.host, m.peer);
    auto [it, fresh] = pairs.try_emplace(key, HostLinks::Pair{key.first, key.second, m.bytes, m.ns});
    if (!fresh) it->second.ns = std::max(it->second.ns, m.ns);
  }
  for (const auto& [key, pair] : pairs) links.pairs.push_back(pair);
  std::stable_sort(links.pairs.begin(), links.pairs.end(),
                   [](const auto& a, const auto& b) { return a.bytesPerSecond() < b.bytesPerSecond(); });
  std::set<std::string> hosts;
  for (const auto& pair : links.pairs) hosts.insert({pair.host, pair.peer});
  for (const std::string& host : hosts) {
    double fastest = 0;
    std::vector<double> others;
    for (const auto& pair : links.pairs) {
      if (pair.host == host || pair.peer == host) fastest = std::max(fastest, pair.bytesPerSecond());
      else others.push_back(pair.bytesPerSecond());
    }
    if (others.empty()) continue;
    const auto middle = others.begin() + static_cast<std::ptrdiff_t>(others.size() / 2);
    std::nth_element(others.begin(), middle, others.end());
    // The slowest such host when several qualify (a slow host also slows its partners' medians).
    if (fastest <= 0.5 * *middle && (links.slow_host.empty() || fastest < links.slow_bytes_per_second)) {
      links.slow_host = host;
      links.slow_bytes_per_second = fastest;
      links.others_bytes_per_second = *middle;
    }
  }
  return links;
}

}  // namespace gradscope::storage
