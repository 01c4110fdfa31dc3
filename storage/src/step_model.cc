#include "gradscope/storage/step_model.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "gradscope/common/units.h"
#include "gradscope/storage/peers.h"

namespace gradscope::storage {
namespace {

// An MPI call as the model needs it. Times are the rank's own; `last` is when the last of the call's
// parties arrived, on the same clock (the call's own posting when nobody else is known).
struct Call {
  std::int64_t id = 0;
  std::int64_t enqueue = 0, start = 0, end = 0;
  std::int64_t last = 0;
  std::int64_t seq = 0;
  std::int64_t bytes = 0;
  std::uint32_t rank = 0;  // index into the ranks
  std::int32_t comm = -1;  // dense communicator-key index; -1 unknown
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  std::uint16_t replay = 0;
  bool exposure = true;  // counted in the exposure (exposure_of)
};

struct Interval {
  std::int64_t begin = 0, end = 0;
};

// Sorts and merges `spans` into disjoint intervals, in place.
void unite(std::vector<Interval>& spans) {
  std::erase_if(spans, [](const Interval& span) { return span.end <= span.begin; });
  std::sort(spans.begin(), spans.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::size_t out = 0;
  for (const Interval& span : spans) {
    if (out > 0 && span.begin <= spans[out - 1].end)
      spans[out - 1].end = std::max(spans[out - 1].end, span.end);
    else spans[out++] = span;
  }
  spans.resize(out);
}

// The time in both of two sets of disjoint, sorted intervals, as such a set.
std::vector<Interval> intersect(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const std::int64_t begin = std::max(a[i].begin, b[j].begin), end = std::min(a[i].end, b[j].end);
    if (begin < end) out.push_back({begin, end});
    if (a[i].end < b[j].end) ++i;
    else ++j;
  }
  return out;
}

// The time in `a` and not in `b` (both disjoint and sorted), as such a set.
std::vector<Interval> subtract(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  std::size_t j = 0;
  for (Interval rest : a) {
    while (j < b.size() && b[j].end <= rest.begin) ++j;
    for (std::size_t k = j; k < b.size() && b[k].begin < rest.end; ++k) {
      if (b[k].begin > rest.begin) out.push_back({rest.begin, b[k].begin});
      rest.begin = std::max(rest.begin, b[k].end);
      if (rest.begin >= rest.end) break;
    }
    if (rest.begin < rest.end) out.push_back(rest);
  }
  return out;
}

// One rank's steps: their spans are consecutive, [begin of step i, begin of step i + 1).
struct RankSteps {
  std::span<StepRecord> rows;  // in time order; held by the model's rows (or gpuSteps')
  // The row whose span holds time t, or nullptr.
  StepRecord* at(std::int64_t t) {
    auto it = std::upper_bound(rows.begin(), rows.end(), t,
                               [](std::int64_t time, const StepRecord& row) { return time < row.start_ns; });
    if (it == rows.begin()) return nullptr;
    --it;
    return t < it->end_ns ? &*it : nullptr;
  }
  // Adds the time of each disjoint interval that falls in a step's span to that step's `field`.
  void add(const std::vector<Interval>& spans, std::int64_t StepRecord::*field) {
    for (const Interval& span : spans) {
      auto it =
          std::upper_bound(rows.begin(), rows.end(), span.begin,
                           [](std::int64_t time, const StepRecord& row) { return time < row.start_ns; });
      if (it != rows.begin()) --it;
      for (; it != rows.end() && it->start_ns < span.end; ++it) {
        const std::int64_t overlap = std::min(span.end, it->end_ns) - std::max(span.begin, it->start_ns);
        if (overlap > 0) (*it).*field += overlap;
      }
    }
  }
};

// A rank's rows from their bounds (first posting, calls), appended to `into` in time order, each running
// to the next one's start: the steps' numbers follow time unless markers went back, and the spans must not
// overlap. Returns them (valid until `into` grows).
RankSteps appendConsecutiveSpans(const std::map<std::int64_t, StepRecord>& bounds,
                                 std::vector<StepRecord>& into) {
  const std::size_t first = into.size();
  for (const auto& [step, row] : bounds) into.push_back(row);
  RankSteps out{std::span<StepRecord>(into).subspan(first)};
  std::stable_sort(out.rows.begin(), out.rows.end(),
                   [](const StepRecord& a, const StepRecord& b) { return a.start_ns < b.start_ns; });
  for (std::size_t i = 0; i + 1 < out.rows.size(); ++i)
    out.rows[i].end_ns = std::max(out.rows[i].start_ns, out.rows[i + 1].start_ns);
  return out;
}

// A collective: a call every rank of its communicator makes under the same (key, seq, replay).
bool isCollective(const Call& call) {
  return call.comm >= 0 && !numberedApart(call.api);
}

// Entries by key: open addressing over a flat array, one probe per call for most calls (a node-based map
// costs a cache miss per level, and a job that reduces tensors one by one has hundreds of thousands of
// sizes). `Key` has == and hash(); the entries come out in no order.
template <typename Key, typename Entry>
class FlatTable {
 public:
  FlatTable() : slots_(64) {}

  // The entry of that key, value-initialised when new.
  Entry& at(const Key& key) {
    if (last_ != nullptr && last_->key == key) return last_->entry;
    if (2 * (used_ + 1) > slots_.size()) grow();
    Slot& found = slots_[find(key)];
    if (!found.used) {
      found.used = true;
      found.key = key;
      ++used_;
    }
    return (last_ = &found)->entry;
  }
  // Every (key, entry), in no order; the table is empty afterwards.
  template <typename Visit>
  void take(Visit&& visit) {
    for (const Slot& slot : slots_)
      if (slot.used) visit(slot.key, slot.entry);
    *this = FlatTable();
  }
  std::size_t size() const { return used_; }

 private:
  struct Slot {
    bool used = false;
    Key key;
    Entry entry{};
  };
  // The slot holding the key, or the empty one where it goes.
  std::size_t find(const Key& key) const {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = static_cast<std::size_t>(key.hash()) & mask;
    while (slots_[i].used && !(slots_[i].key == key)) i = (i + 1) & mask;
    return i;
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& slot : old)
      if (slot.used) slots_[find(slot.key)] = slot;
    last_ = nullptr;
  }

  std::vector<Slot> slots_;
  std::size_t used_ = 0;
  Slot* last_ = nullptr;
};

std::uint64_t mixHash(std::uint64_t h) {
  return h ^ (h >> 29);
}

// A kind of collective, for the exposure.
struct ExposureKey {
  Api api = Api::Unknown;
  DType dtype = DType::Other;
  std::int64_t bytes = 0;
  bool operator==(const ExposureKey&) const = default;
  std::uint64_t hash() const {
    return mixHash(static_cast<std::uint64_t>(bytes) * 0x9E3779B97F4A7C15ull ^
                   (static_cast<std::uint64_t>(api) << 16 | static_cast<std::uint64_t>(dtype)));
  }
};

// A step's calls of one API and size class (StepCallTime).
struct StepCallKey {
  std::int64_t step = 0;
  Api api = Api::Unknown;
  int size_class = -1;
  bool operator==(const StepCallKey&) const = default;
  std::uint64_t hash() const {
    const auto kind = static_cast<std::uint64_t>(api) << 8 | static_cast<std::uint8_t>(size_class + 1);
    return mixHash(static_cast<std::uint64_t>(step) * 0x9E3779B97F4A7C15ull ^ kind);
  }
};

// The calls' time per (step, api, size class). A rank's calls of one step come together and fall into a few
// kinds, summed in a short list first: the table of every step's kinds (hundreds of thousands of entries
// in a long run) is probed once per kind and rank step, not once per call.
class StepCallTally {
 public:
  void add(std::uint32_t rank, std::int64_t step, Api api, int size_class, std::int64_t ns) {
    if (rank != rank_ || step != step_ || current_.size() == kCurrentKinds) {
      flush();
      rank_ = rank, step_ = step;
    }
    for (StepCallTime& kind : current_)
      if (kind.api == api && kind.size_class == size_class) {
        ++kind.calls, kind.total_ns += ns;
        return;
      }
    current_.push_back({step, api, size_class, 1, ns});
  }
  // Every (step, api, size class), in that order; the tally is empty afterwards.
  std::vector<StepCallTime> take() {
    flush();
    std::vector<StepCallTime> rows;
    rows.reserve(table_.size());
    table_.take([&](const StepCallKey& key, StepCallTime row) {
      row.step = key.step, row.api = key.api, row.size_class = key.size_class;
      rows.push_back(row);
    });
    std::sort(rows.begin(), rows.end(), [](const StepCallTime& a, const StepCallTime& b) {
      return std::tie(a.step, a.api, a.size_class) < std::tie(b.step, b.api, b.size_class);
    });
    *this = StepCallTally();
    return rows;
  }

 private:
  static constexpr std::size_t kCurrentKinds = 32;  // searched linearly; past that, summed in part
  void flush() {
    for (const StepCallTime& kind : current_) {
      StepCallTime& sum = table_.at({kind.step, kind.api, kind.size_class});
      sum.calls += kind.calls, sum.total_ns += kind.total_ns;
    }
    current_.clear();
  }

  FlatTable<StepCallKey, StepCallTime> table_;
  std::vector<StepCallTime> current_;
  std::uint32_t rank_ = 0;
  std::int64_t step_ = -1;
};

// Who posted each collective last (its enqueue, compared on rank 0's clock), by (communicator, seq,
// replay): one entry per collective, however many ranks made it.
class ArrivalIndex {
 public:
  struct Arrival {
    std::int64_t last = 0;  // aligned
    std::uint32_t rank = 0;
    std::int32_t ranks = 0;
    std::int64_t waited = 0;  // the other ranks' waiting for `rank`, summed (computeStepModel)
  };
  // Counts `call`'s posting when it is a collective; the first of equal postings stays the last.
  void post(const Call& call, const std::vector<std::int64_t>& offsets) {
    if (!isCollective(call)) return;
    Arrival& arrival = arrivals_[keyOf(call)];
    const std::int64_t posted = call.enqueue + offsets[call.rank];
    if (arrival.ranks++ == 0 || posted > arrival.last) arrival.last = posted, arrival.rank = call.rank;
  }
  // The arrival of `call`'s collective; nullptr when it is not a collective or was not posted.
  Arrival* find(const Call& call) {
    if (!isCollective(call)) return nullptr;
    const auto it = arrivals_.find(keyOf(call));
    return it == arrivals_.end() ? nullptr : &it->second;
  }
  void forEach(const std::function<void(const Arrival&)>& visit) const {
    for (const auto& [key, arrival] : arrivals_) visit(arrival);
  }

 private:
  struct Key {
    std::int64_t comm, seq, replay;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const {
      return std::hash<std::int64_t>()((key.comm << 40) ^ key.seq ^ (key.replay << 20));
    }
  };
  static Key keyOf(const Call& call) { return Key{call.comm, call.seq, call.replay}; }
  std::unordered_map<Key, Arrival, KeyHash> arrivals_;
};

// Who posted each collective among `calls` last (compared on rank 0's clock: `offsets`). Sets every such
// call's `last` to that time on its own clock and returns, per call, the rank that was last; -1 for a
// call that is not a collective or that no other rank made.
std::vector<std::int32_t> markLastArrivals(std::vector<Call>& calls,
                                           const std::vector<std::int64_t>& offsets) {
  ArrivalIndex arrivals;
  for (const Call& call : calls) arrivals.post(call, offsets);
  std::vector<std::int32_t> late(calls.size(), -1);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const ArrivalIndex::Arrival* arrival = arrivals.find(calls[i]);
    if (!arrival || arrival->ranks < 2) continue;
    calls[i].last = arrival->last - offsets[calls[i].rank];
    late[i] = static_cast<std::int32_t>(arrival->rank);
  }
  return late;
}

// The steps of the GPU ranks (with NCCL calls that have steps), from the kernels of the agent's sampled
// windows (gpu_activity). A GPU step runs from its first NCCL call's GPU start to the next step's, as a
// host step does from posting to posting. Inside a window: exposed = NCCL kernels' time not overlapped by
// compute kernels, hidden = the overlapped part, idle = neither running, waiting = exposed time of an NCCL
// call before the last rank's kernel of it started (charged to that rank as caused_ns). Outside: the
// span only (StepBasis::GpuUnsampled). `steps` holds the host rows, replaced here for GPU ranks.
void gpuSteps(const TraceReader& reader, const std::vector<std::int64_t>& offsets,
              const std::unordered_map<std::int64_t, std::uint32_t>& rank_index,
              std::vector<std::map<std::int64_t, StepRecord>>& gpu_bounds, std::vector<Call>& gpu_calls,
              std::vector<RankSteps>& steps) {
  if (gpu_calls.empty()) return;
  std::vector<std::vector<Interval>> windows(offsets.size()), compute(offsets.size()), nccl(offsets.size());
  for (const GpuActivityRecord& row : reader.gpuActivity()) {
    const auto rank = rank_index.find(row.rank_id);
    if (rank == rank_index.end()) continue;
    auto& into = row.kind == GpuActivityKind::Window    ? windows
                 : row.kind == GpuActivityKind::Compute ? compute
                                                        : nccl;
    into[rank->second].push_back({row.start_ns, row.end_ns});
  }
  // Who started each NCCL collective last (a GPU call is posted as its kernel starts): its kernels wait
  // for that rank's.
  const std::vector<std::int32_t> late = markLastArrivals(gpu_calls, offsets);
  const auto waits = [&](std::size_t i) {
    return late[i] >= 0 && static_cast<std::uint32_t>(late[i]) != gpu_calls[i].rank &&
           std::min(gpu_calls[i].end, gpu_calls[i].last) > gpu_calls[i].start;
  };
  std::vector<std::vector<Interval>> waiting(offsets.size()), exposed(offsets.size());
  for (std::size_t i = 0; i < gpu_calls.size(); ++i)
    if (waits(i))
      waiting[gpu_calls[i].rank].push_back(
          {gpu_calls[i].start, std::min(gpu_calls[i].end, gpu_calls[i].last)});
  std::vector<std::vector<StepRecord>> gpu_rows(offsets.size());
  std::vector<RankSteps> gpu(offsets.size());
  for (std::size_t r = 0; r < offsets.size(); ++r) {
    if (gpu_bounds[r].empty()) continue;
    gpu_rows[r].reserve(gpu_bounds[r].size());
    gpu[r] = appendConsecutiveSpans(gpu_bounds[r], gpu_rows[r]);
    auto& rows = gpu[r].rows;
    unite(windows[r]), unite(compute[r]), unite(nccl[r]), unite(waiting[r]);
    const std::vector<Interval> hidden = intersect(nccl[r], compute[r]);
    exposed[r] = subtract(nccl[r], compute[r]);
    std::vector<Interval> busy = compute[r];
    busy.insert(busy.end(), nccl[r].begin(), nccl[r].end());
    unite(busy);
    RankSteps& measured = gpu[r];
    measured.add(exposed[r], &StepRecord::exposed_ns);
    measured.add(hidden, &StepRecord::hidden_ns);
    measured.add(intersect(waiting[r], exposed[r]), &StepRecord::waiting_ns);
    measured.add(busy, &StepRecord::idle_ns);  // busy, for now
    for (StepRecord& row : rows) {
      const std::int64_t span = row.end_ns - row.start_ns;
      row.compute_ns = span - row.exposed_ns;
      row.idle_ns = span - row.idle_ns;
    }
  }
  // The last rank is charged the others' exposed waiting, in its step that holds its arrival.
  for (std::size_t i = 0; i < gpu_calls.size(); ++i) {
    if (!waits(i)) continue;
    const Call& call = gpu_calls[i];
    std::int64_t waited = 0;
    for (const Interval& part : intersect({{call.start, std::min(call.end, call.last)}}, exposed[call.rank]))
      waited += part.end - part.begin;
    const auto rank = static_cast<std::uint32_t>(late[i]);
    if (StepRecord* row = gpu[rank].at(call.last + offsets[call.rank] - offsets[rank]))
      row->caused_ns += waited;
  }
  // A step is measured when its GPU span lies inside one window; the host rows of a GPU rank give way.
  for (std::size_t r = 0; r < offsets.size(); ++r) {
    if (gpu[r].rows.empty()) continue;
    std::map<std::int64_t, const StepRecord*> sampled;
    for (const StepRecord& row : gpu[r].rows) {
      const auto window = std::upper_bound(windows[r].begin(), windows[r].end(), row.start_ns,
                                           [](std::int64_t t, const Interval& w) { return t < w.begin; });
      if (window != windows[r].begin() && row.end_ns <= std::prev(window)->end) sampled[row.step] = &row;
    }
    for (StepRecord& row : steps[r].rows) {
      if (const auto it = sampled.find(row.step); it != sampled.end()) {
        const std::int64_t calls = row.calls;
        row = *it->second;
        row.calls = calls;
      } else {
        row.basis = StepBasis::GpuUnsampled;
        row.compute_ns = row.exposed_ns = row.waiting_ns = row.hidden_ns = row.caused_ns = row.idle_ns = 0;
      }
    }
  }
}

}  // namespace

StepModel computeStepModel(const TraceReader& reader,
                           const std::function<bool(const CallRecord&)>& exposure_of) {
  StepModel model;
  // Ranks by file id, and their offsets to rank 0's clock.
  std::unordered_map<std::int64_t, std::uint32_t> rank_index;
  std::vector<std::int64_t> rank_ids, offsets;
  for (const RankInfo& rank : reader.ranks()) {
    rank_index.emplace(rank.id, static_cast<std::uint32_t>(rank_ids.size()));
    rank_ids.push_back(rank.id);
    offsets.push_back(rank.clock_offset_ns);
  }
  // Communicators by key (and run), as in lateness(): equal keys are one communicator.
  std::unordered_map<std::int64_t, std::int32_t> comm_key;
  {
    std::map<std::pair<std::int64_t, std::string>, std::int32_t> keys;
    const auto ranks = reader.ranks();
    std::unordered_map<std::int64_t, std::int64_t> run_of;
    for (const RankInfo& rank : ranks) run_of[rank.id] = rank.run_id;
    for (const CommInfo& comm : reader.comms()) {
      const auto [it, inserted] =
          keys.try_emplace({run_of[comm.rank_id], comm.key}, static_cast<std::int32_t>(keys.size()));
      comm_key[comm.id] = it->second;
    }
  }

  const auto hostCall = [&](const CallRecord& record, std::uint32_t rank) {
    Call call;
    call.id = record.id;
    // A blocking call is posted as it starts (the agent writes enqueue = start; a trace that says
    // otherwise, as gradscope-synth's schedule points do, is taken at its start); a nonblocking one at its
    // enqueue, its start being the wait.
    call.enqueue = isNonblocking(record.api) ? record.enqueue_ns : record.start_ns;
    call.start = std::max(record.start_ns, call.enqueue);
    call.end = std::max(record.end_ns, call.start);
    call.last = call.enqueue;
    call.seq = record.seq;
    call.bytes = record.bytes;
    call.rank = rank;
    if (const auto comm = comm_key.find(record.comm_id); comm != comm_key.end()) call.comm = comm->second;
    call.api = record.api;
    call.dtype = record.dtype;
    call.replay = static_cast<std::uint16_t>(std::min<std::int64_t>(record.graph_replay, 0xffff));
    return call;
  };

  // Two passes over the calls, so that memory follows one rank's calls and the collectives, not the
  // trace's calls (a merged 4096-rank file has millions). The first finds who posted each collective
  // last, where each rank's calls end (their last id), the point-to-point calls' postings and the GPU
  // calls; the second builds each rank's steps from its calls, one rank at a time when the file keeps a
  // rank's calls together (merged and per-rank files do).
  ArrivalIndex arrivals;
  std::vector<std::int64_t> last_id(rank_ids.size(), -1);
  struct Posting {
    std::uint32_t rank = 0;
    std::int64_t enqueue = 0;  // on the rank's clock
  };
  std::unordered_map<std::int64_t, Posting> peer_postings;  // point-to-point calls by id
  // GPU ranks (NCCL calls with steps): the bounds from the calls' GPU spans, and the calls.
  std::vector<std::map<std::int64_t, StepRecord>> gpu_bounds(rank_ids.size());
  std::vector<Call> gpu_calls;
  // Each rank's distinct steps, to size the rows; the last one added, to skip the set for most calls.
  std::vector<std::set<std::int64_t>> rank_steps(rank_ids.size());
  std::vector<std::int64_t> last_step(rank_ids.size(), -1);
  reader.forEachCallWithoutGpuFacts([&](const CallRecord& record) {
    const auto rank = rank_index.find(record.rank_id);
    if (rank == rank_index.end()) return true;
    last_id[rank->second] = record.id;
    if (record.step >= 0 && record.step != last_step[rank->second])
      rank_steps[rank->second].insert(last_step[rank->second] = record.step);
    if (backendOf(record.api) != Backend::Mpi) {
      if (record.step < 0 || record.end_ns <= record.start_ns) return true;
      auto [it, inserted] = gpu_bounds[rank->second].try_emplace(record.step);
      StepRecord& row = it->second;
      if (inserted) {
        row.rank_id = record.rank_id, row.step = record.step, row.basis = StepBasis::Gpu;
        row.start_ns = record.start_ns, row.end_ns = record.end_ns;
      }
      row.start_ns = std::min(row.start_ns, record.start_ns);
      row.end_ns = std::max(row.end_ns, record.end_ns);
      ++row.calls;
      Call call;
      call.id = record.id;
      call.enqueue = call.start = call.last = record.start_ns;
      call.end = record.end_ns;
      call.seq = record.seq;
      call.rank = rank->second;
      if (const auto comm = comm_key.find(record.comm_id); comm != comm_key.end()) call.comm = comm->second;
      call.api = record.api;
      call.replay = static_cast<std::uint16_t>(std::min<std::int64_t>(record.graph_replay, 0xffff));
      gpu_calls.push_back(call);
      return true;
    }
    const Call call = hostCall(record, rank->second);
    arrivals.post(call, offsets);
    if (isPointToPoint(record.api)) peer_postings.emplace(call.id, Posting{call.rank, call.enqueue});
    return true;
  });
  std::size_t step_rows = 0;
  for (const auto& distinct : rank_steps) step_rows += distinct.size();
  rank_steps = std::vector<std::set<std::int64_t>>();
  if (step_rows == 0) return model;

  // Receives: their senders' postings, in the order of the messages (by send id) per receive.
  struct Received {
    std::int64_t recv_id = 0;
    Posting sender;
  };
  std::vector<Received> received;
  if (!peer_postings.empty()) {
    for (const PeerMessage& message : matchPeerMessages(reader).messages) {
      const auto send = peer_postings.find(message.send_call_id);
      if (send == peer_postings.end() || !peer_postings.contains(message.recv_call_id)) continue;
      received.push_back({message.recv_call_id, send->second});
    }
    std::stable_sort(received.begin(), received.end(),
                     [](const Received& a, const Received& b) { return a.recv_id < b.recv_id; });
  }
  peer_postings = std::unordered_map<std::int64_t, Posting>();
  std::size_t next_received = 0;

  // Who caused waiting: another rank's waiting, charged to (rank, its local arrival). A collective's
  // waiting is summed in its arrival (every waiting rank charges the same time); a receive's is listed.
  struct Charge {
    std::uint32_t rank = 0;
    std::int64_t at = 0;
    std::int64_t waited = 0;
  };
  std::vector<Charge> charged;
  const auto aligned = [&](std::uint32_t rank, std::int64_t t) { return t + offsets[rank]; };

  // The second pass. Per rank: the steps' bounds and call counts, and the unions of blocked, in-flight and
  // waiting time, spread over the steps' spans.
  // Every rank's rows are held once, in model.steps (sized by the first pass), in the order the ranks'
  // last calls come; `placed` says where each rank's are.
  std::vector<StepRecord>& rows = model.steps;
  rows.reserve(step_rows);
  std::vector<std::pair<std::size_t, std::size_t>> placed(rank_ids.size());  // (first row, rows)
  const auto stepsOf = [&](std::uint32_t r) {
    return RankSteps{std::span<StepRecord>(rows).subspan(placed[r].first, placed[r].second)};
  };
  std::vector<std::uint32_t> finished;  // ranks in the order their rows were placed
  std::vector<std::map<std::int64_t, StepRecord>> bounds(rank_ids.size());
  std::vector<std::vector<Call>> pending(rank_ids.size());  // a rank's MPI calls until its last
  // Exposure per (api, dtype, bytes) and the calls' time per (step, api, size class), in flat hash tables:
  // a job that reduces tensors one by one has hundreds of thousands of sizes, on which an ordered map took
  // a third of `gradscope recommend`; the entries are sorted once at the end.
  FlatTable<ExposureKey, CallExposure> exposure;
  StepCallTally step_calls;
  std::vector<Interval> blocked, in_flight, waiting;
  const auto finishRank = [&](std::uint32_t r) {
    RankSteps rank = appendConsecutiveSpans(bounds[r], rows);
    placed[r] = {rows.size() - rank.rows.size(), rank.rows.size()};
    finished.push_back(r);
    bounds[r].clear();
    if (!rank.rows.empty()) {
      blocked.clear(), in_flight.clear(), waiting.clear();
      for (const Call& call : pending[r]) {
        blocked.push_back({call.start, call.end});
        in_flight.push_back({call.enqueue, call.end});
        waiting.push_back({call.start, std::min(call.end, call.last)});
      }
      unite(blocked), unite(in_flight), unite(waiting);
      rank.add(blocked, &StepRecord::exposed_ns);
      rank.add(in_flight, &StepRecord::hidden_ns);  // in flight at all, for now
      rank.add(waiting, &StepRecord::waiting_ns);
      for (StepRecord& row : rank.rows) {
        row.hidden_ns -= row.exposed_ns;  // every blocked span lies inside its call's flight
        row.compute_ns = row.end_ns - row.start_ns - row.exposed_ns;
      }
    }
    pending[r] = std::vector<Call>();  // (`= {}` would keep the capacity)
  };
  reader.forEachCallWithoutGpuFacts([&](const CallRecord& record) {
    const auto found = rank_index.find(record.rank_id);
    if (found == rank_index.end()) return true;
    const std::uint32_t r = found->second;
    if (record.id > last_id[r]) return true;  // written after the first pass (a trace being written)
    const bool host = backendOf(record.api) == Backend::Mpi;
    if (record.step >= 0) {
      step_calls.add(r, record.step, record.api, sizeClass(record.bytes), record.end_ns - record.start_ns);
      auto [it, inserted] = bounds[r].try_emplace(record.step);
      StepRecord& row = it->second;
      const std::int64_t finish = host ? record.end_ns : record.enqueue_ns;
      if (inserted) {
        row.rank_id = record.rank_id, row.step = record.step;
        row.start_ns = record.enqueue_ns, row.end_ns = finish;
      }
      row.start_ns = std::min(row.start_ns, record.enqueue_ns);
      row.end_ns = std::max(row.end_ns, finish);
      ++row.calls;
    }
    if (host) {
      Call call = hostCall(record, r);
      call.exposure = !exposure_of || exposure_of(record);
      // Who arrived last. Collectives: the latest posting among the ranks that issued the same
      // (communicator, seq, replay). Receives: their senders' postings.
      if (ArrivalIndex::Arrival* arrival = arrivals.find(call); arrival && arrival->ranks >= 2) {
        call.last = arrival->last - offsets[r];
        const std::int64_t waited = std::min(call.end, call.last) - call.start;
        if (arrival->rank != r && waited > 0) arrival->waited += waited;
      }
      while (next_received < received.size() && received[next_received].recv_id < call.id) ++next_received;
      for (; next_received < received.size() && received[next_received].recv_id == call.id; ++next_received) {
        const Posting& sender = received[next_received].sender;
        call.last = std::max(call.last, aligned(sender.rank, sender.enqueue) - offsets[r]);
        const std::int64_t waited = std::min(call.end, call.last) - call.start;
        if (waited > 0 && sender.rank != r) charged.push_back({sender.rank, sender.enqueue, waited});
      }
      // Exposure per kind of collective, in id order.
      if (!isPointToPoint(call.api) && call.exposure) {
        const std::int64_t arrived = std::max(call.enqueue, call.last);
        CallExposure& entry = exposure.at({call.api, call.dtype, call.bytes});
        ++entry.calls;
        entry.transport_ns += static_cast<double>(std::max<std::int64_t>(0, call.end - arrived));
        entry.exposed_ns +=
            static_cast<double>(std::max<std::int64_t>(0, call.end - std::max(call.start, arrived)));
      }
      pending[r].push_back(call);
    }
    if (record.id == last_id[r]) finishRank(r);
    return true;
  });

  arrivals.forEach([&](const ArrivalIndex::Arrival& arrival) {
    if (arrival.waited > 0)
      charged.push_back({arrival.rank, arrival.last - offsets[arrival.rank], arrival.waited});
  });
  for (const Charge& charge : charged)
    if (StepRecord* row = stepsOf(charge.rank).at(charge.at)) row->caused_ns += charge.waited;
  charged = std::vector<Charge>();
  {
    std::vector<RankSteps> steps(rank_ids.size());
    for (std::uint32_t r = 0; r < rank_ids.size(); ++r) steps[r] = stepsOf(r);
    gpuSteps(reader, offsets, rank_index, gpu_bounds, gpu_calls, steps);
  }
  // Ordered by rank (id), step: in place, a rank at a time when the ranks came in that order.
  for (std::uint32_t r = 0; r < rank_ids.size(); ++r)
    std::sort(stepsOf(r).rows.begin(), stepsOf(r).rows.end(),
              [](const StepRecord& a, const StepRecord& b) { return a.step < b.step; });
  if (!std::is_sorted(finished.begin(), finished.end()))
    std::stable_sort(rows.begin(), rows.end(), [&](const StepRecord& a, const StepRecord& b) {
      return rank_index.at(a.rank_id) < rank_index.at(b.rank_id);
    });

  model.exposure.reserve(exposure.size());
  exposure.take([&](const ExposureKey& key, CallExposure entry) {
    entry.api = key.api, entry.dtype = key.dtype, entry.bytes = key.bytes;
    model.exposure.push_back(entry);
  });
  model.step_calls = step_calls.take();
  for (CallExposure& entry : model.exposure) {
    entry.transport_ns /= static_cast<double>(entry.calls);
    entry.exposed_ns /= static_cast<double>(entry.calls);
  }
  std::sort(model.exposure.begin(), model.exposure.end(), [](const CallExposure& a, const CallExposure& b) {
    return std::tie(a.api, a.dtype, a.bytes) < std::tie(b.api, b.dtype, b.bytes);
  });
  return model;
}

double stepSavingNs(double faster_ns, double transport_ns, double exposed_ns) {
  exposed_ns = std::max(0.0, exposed_ns);
  if (faster_ns >= 0) return std::min(faster_ns, exposed_ns);
  const double slack = std::max(0.0, transport_ns - exposed_ns);
  return std::min(0.0, faster_ns + slack);
}

std::vector<StepRecord> readOrComputeSteps(const TraceReader& reader) {
  std::vector<StepRecord> rows = reader.steps();
  // (Not a conditional expression: its result would be a copy of `rows`, 79 MB at 4096 ranks x 200 steps.)
  if (!rows.empty()) return rows;
  return computeStepModel(reader).steps;
}

StepModel readOrComputeStepModel(const TraceReader& reader, StoredParts parts) {
  StepModel model;
  model.steps = reader.steps();
  if (model.steps.empty()) return computeStepModel(reader);
  // Written with the steps: the exposure (schema v8; empty where no MPI collective is) and the step calls
  // (v9).
  if (parts.exposure) model.exposure = reader.exposure();
  if (parts.step_calls) model.step_calls = reader.stepCalls();
  return model;
}

std::vector<StepTotals> stepTotals(std::span<const StepRecord> rows) {
  std::map<std::int64_t, StepTotals> by_step;
  std::map<std::int64_t, std::int64_t> most_caused;
  for (const StepRecord& row : rows) {
    StepTotals& totals = by_step[row.step];
    totals.step = row.step;
    ++totals.ranks;
    totals.span_ns = std::max(totals.span_ns, row.end_ns - row.start_ns);
    if (row.basis == StepBasis::GpuUnsampled) continue;
    ++totals.measured;
    if (row.basis == StepBasis::Gpu) ++totals.gpu;
    totals.compute_ns += static_cast<double>(row.compute_ns);
    totals.exposed_ns += static_cast<double>(row.exposed_ns);
    totals.waiting_ns += static_cast<double>(row.waiting_ns);
    totals.hidden_ns += static_cast<double>(row.hidden_ns);
    totals.lost_ns += row.waiting_ns;
    if (row.caused_ns > 0 && row.caused_ns > most_caused[row.step]) {
      most_caused[row.step] = row.caused_ns;
      totals.last_rank_id = row.rank_id;
    }
  }
  std::vector<StepTotals> out;
  for (auto& [step, totals] : by_step) {
    const double ranks = std::max(totals.measured, 1);
    totals.compute_ns /= ranks, totals.exposed_ns /= ranks, totals.waiting_ns /= ranks,
        totals.hidden_ns /= ranks;
    out.push_back(totals);
  }
  return out;
}

Stragglers stragglers(std::span<const StepRecord> rows) {
  Stragglers out;
  std::map<std::int64_t, StragglerRank> ranks;
  for (const StepRecord& row : rows) {
    if (row.basis == StepBasis::GpuUnsampled) continue;  // its waiting is not measured either
    out.rank_time_ns += row.end_ns - row.start_ns;
    if (row.caused_ns > 0) {
      StragglerRank& rank = ranks[row.rank_id];
      rank.rank_id = row.rank_id;
      rank.caused_ns += row.caused_ns;
    }
  }
  for (const StepTotals& step : stepTotals(rows)) {
    out.lost_ns += step.lost_ns;
    if (step.lost_ns <= 0) continue;
    ++out.steps;
    if (step.last_rank_id >= 0) ++ranks[step.last_rank_id].steps_last;
  }
  for (const auto& [id, rank] : ranks) out.ranks.push_back(rank);
  std::sort(out.ranks.begin(), out.ranks.end(), [](const StragglerRank& a, const StragglerRank& b) {
    return a.steps_last != b.steps_last ? a.steps_last > b.steps_last : a.caused_ns > b.caused_ns;
  });
  out.persistent = !out.ranks.empty() && out.ranks.front().steps_last >= 3 &&
                   4 * out.ranks.front().steps_last >= 3 * out.steps;
  return out;
}

GpuRanges gpuRangeTimes(const TraceReader& reader, std::span<const StepRecord> rows) {
  GpuRanges out;
  std::map<std::int64_t, std::vector<const StepRecord*>> measured;  // by rank id, in time order
  for (const StepRecord& row : rows)
    if (row.basis == StepBasis::Gpu) {
      measured[row.rank_id].push_back(&row);
      ++out.steps;
      out.span_ns += row.end_ns - row.start_ns;
    }
  if (measured.empty()) return out;
  for (auto& [rank, steps] : measured)
    std::sort(steps.begin(), steps.end(),
              [](const StepRecord* a, const StepRecord* b) { return a->start_ns < b->start_ns; });
  std::map<std::string, std::int64_t> by_range;
  for (const GpuActivityRecord& row : reader.gpuActivity()) {
    if (row.kind != GpuActivityKind::Compute) continue;
    const auto rank = measured.find(row.rank_id);
    if (rank == measured.end()) continue;
    const auto& steps = rank->second;
    auto it = std::upper_bound(steps.begin(), steps.end(), row.start_ns,
                               [](std::int64_t t, const StepRecord* step) { return t < step->start_ns; });
    if (it != steps.begin()) --it;
    std::int64_t& ns = by_range[row.range.value_or("")];
    for (; it != steps.end() && (*it)->start_ns < row.end_ns; ++it)
      ns += std::max<std::int64_t>(
          0, std::min(row.end_ns, (*it)->end_ns) - std::max(row.start_ns, (*it)->start_ns));
  }
  for (const auto& [range, ns] : by_range)
    if (ns > 0) out.ranges.push_back({range, ns});
  std::sort(out.ranges.begin(), out.ranges.end(),
            [](const GpuRangeTime& a, const GpuRangeTime& b) { return a.ns > b.ns; });
  return out;
}

}  // namespace gradscope::storage
