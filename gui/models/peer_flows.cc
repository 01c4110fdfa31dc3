#include "models/peer_flows.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "gradscope/common/error.h"
#include "gradscope/storage/peers.h"

namespace gradscope::gui {

PeerFlows::PeerFlows(std::vector<PeerFlow> flows, std::int64_t unmatched, std::int64_t unresolved)
    : flows_(std::move(flows)), unmatched_(unmatched), unresolved_(unresolved) {
  if (flows_.size() > std::numeric_limits<std::uint32_t>::max()) fail("too many point-to-point messages");
  std::stable_sort(flows_.begin(), flows_.end(),
                   [](const PeerFlow& a, const PeerFlow& b) { return a.send_call_id < b.send_call_id; });
  by_receive_.resize(flows_.size());
  std::iota(by_receive_.begin(), by_receive_.end(), std::uint32_t{0});
  std::stable_sort(by_receive_.begin(), by_receive_.end(), [this](std::uint32_t a, std::uint32_t b) {
    return flows_[a].recv_call_id < flows_[b].recv_call_id;
  });
}

std::vector<const PeerFlow*> PeerFlows::of(std::int64_t call_id) const {
  std::vector<const PeerFlow*> found;
  const auto sends =
      std::lower_bound(flows_.begin(), flows_.end(), call_id,
                       [](const PeerFlow& flow, std::int64_t id) { return flow.send_call_id < id; });
  for (auto it = sends; it != flows_.end() && it->send_call_id == call_id; ++it) found.push_back(&*it);
  const auto receives = std::lower_bound(
      by_receive_.begin(), by_receive_.end(), call_id,
      [this](std::uint32_t index, std::int64_t id) { return flows_[index].recv_call_id < id; });
  for (auto it = receives; it != by_receive_.end() && flows_[*it].recv_call_id == call_id; ++it)
    found.push_back(&flows_[*it]);
  return found;
}

PeerFlows loadPeerFlows(const storage::TraceReader& reader) {
  const storage::PeerMessages messages = storage::matchPeerMessages(reader);
  if (messages.messages.empty()) return PeerFlows({}, messages.unmatched, messages.unresolved);
  // A matched call has peer facts (its dest or source): one pass over those calls gives both ends' rows.
  struct CallFacts {
    std::int64_t rank_id = 0;
    std::int64_t start_ns = 0, end_ns = 0;
    bool read = false;
  };
  std::unordered_map<std::int64_t, CallFacts> facts;
  facts.reserve(2 * messages.messages.size());
  for (const storage::PeerMessage& message : messages.messages) {
    facts.emplace(message.send_call_id, CallFacts{});
    facts.emplace(message.recv_call_id, CallFacts{});
  }
  reader.forEachPeerCall([&facts](const storage::CallRecord& call) {
    const auto found = facts.find(call.id);
    if (found != facts.end()) found->second = {call.rank_id, call.start_ns, call.end_ns, true};
    return true;
  });
  std::vector<PeerFlow> flows;
  flows.reserve(messages.messages.size());
  for (const storage::PeerMessage& message : messages.messages) {
    const CallFacts& send = facts.at(message.send_call_id);
    const CallFacts& receive = facts.at(message.recv_call_id);
    if (!send.read || !receive.read) fail("{}: matched call without peer facts", reader.path());
    PeerFlow flow;
    flow.send_call_id = message.send_call_id;
    flow.recv_call_id = message.recv_call_id;
    flow.send_rank_id = send.rank_id;
    flow.recv_rank_id = receive.rank_id;
    flow.send_start_ns = send.start_ns;
    flow.send_end_ns = send.end_ns;
    flow.recv_start_ns = receive.start_ns;
    flow.recv_end_ns = receive.end_ns;
    flow.bytes = message.bytes;
    flow.tag = message.tag;
    flow.from_rank = message.from_rank;
    flow.to_rank = message.to_rank;
    flows.push_back(flow);
  }
  return PeerFlows(std::move(flows), messages.unmatched, messages.unresolved);
}

}  // namespace gradscope::gui
