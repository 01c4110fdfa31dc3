#include "gradscope/storage/merge.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "file_util.h"
#include "gradscope/common/error.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/step_model.h"
#include "gradscope/storage/steps.h"
#include "gradscope/storage/writer.h"
#include "sqlite.h"
#include "tables.h"

namespace gradscope::storage {
namespace {

// An input as validation found it: its runs and ranks. Its reader is closed again (an open reader holds
// SQLite's page cache and schema, which for thousands of rank files was most of the merge's memory); the
// rest is read when it is copied (DecodePipeline).
struct Source {
  std::string path;
  std::vector<RunInfo> runs;
  std::vector<RankInfo> ranks;
};

// The agent's own statistics (docs/agent.md): a per-rank file stores them in its run's config_json as
// the object "agent"; a merged file keeps every rank's under "agent_ranks", an array of those objects
// with "rank" added, ordered by rank. Collects the entries `config_json` carries into `by_rank`; `rank` is
// the rank of a single-rank run (-1 when the run has several, whose "agent" could not be attributed).
void collectAgentStats(const std::string& config_json, int rank, std::map<int, nlohmann::json>& by_rank) {
  const auto config = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return;
  if (const auto agent = config.find("agent"); agent != config.end() && agent->is_object() && rank >= 0) {
    nlohmann::json entry = *agent;
    entry["rank"] = rank;
    by_rank.emplace(rank, std::move(entry));
  }
  if (const auto ranks = config.find("agent_ranks"); ranks != config.end() && ranks->is_array())
    for (const auto& entry : *ranks)
      if (entry.is_object() && entry.contains("rank") && entry["rank"].is_number_integer())
        by_rank.emplace(entry["rank"].get<int>(), entry);
}

// The merged run's configuration: the first file's, with the agent statistics of every rank.
std::string mergedConfig(const std::string& first_config, const std::map<int, nlohmann::json>& agent_stats) {
  if (agent_stats.empty()) return first_config;  // nothing to gather: keep the text as it was
  auto config = nlohmann::json::parse(first_config, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) config = nlohmann::json::object();
  config.erase("agent");
  config["agent_ranks"] = nlohmann::json::array();
  for (const auto& [rank, entry] : agent_stats) config["agent_ranks"].push_back(entry);
  return config.dump();
}

// The steps detected for one rank's calls, in call order, and the next one to hand out.
struct DetectedSteps {
  std::vector<std::int64_t> steps;
  std::size_t next = 0;
};

// Steps detected (steps.h) for the ranks of `source` whose calls all have step -1, by file-local rank
// id; `comm_keys` names the file's communicators (file-local id -> key). One read of the file's calls,
// before they are copied, so that the steps are written with them (an UPDATE pass over the output
// afterwards measured three times the cost). The read takes the calls table alone: with it detection adds
// about 25% to a merge, with TraceReader::forEachCall (calls joined with gpu_calls) 45%
// (BM_MergeDetectSteps).
// The scan stops once each of the file's `ranks` has an explicit step: a file with markers is not read
// through (a second read of every call, a third of a 4096-rank merge's time).
std::map<std::int64_t, DetectedSteps> detectMissingSteps(const TraceReader& reader,
                                                         const std::map<std::int64_t, std::string>& comm_keys,
                                                         std::size_t ranks) {
  std::map<std::int64_t, std::vector<std::uint64_t>> signatures;  // by rank id, in id order
  std::map<std::int64_t, std::vector<std::int64_t>> enqueued;     // the calls' enqueue times, likewise
  std::map<std::int64_t, std::vector<std::pair<std::int64_t, std::int64_t>>> comm_seq;  // (comm id, seq)
  std::set<std::int64_t> marked;  // ranks with an explicit step
  std::int64_t current_rank = -1;
  std::vector<std::uint64_t>* current = nullptr;  // signatures of current_rank; null once marked
  const std::string no_comm;                      // calls whose communicator the file does not name
  // Graph replays share their captured call's seq: they keep the places their times give them.
  constexpr std::int64_t kReplay = INT64_MIN;  // their "communicator" in comm_seq: never reordered
  constexpr std::int64_t kPeerSequence = std::int64_t{1} << 62;
  reader.forEachCallWithoutGpuFacts([&](const CallRecord& call) {
    if (call.rank_id != current_rank) {
      current_rank = call.rank_id;
      current = marked.count(current_rank) ? nullptr : &signatures[current_rank];
    }
    if (call.step >= 0) {
      marked.insert(current_rank);
      signatures.erase(current_rank);
      enqueued.erase(current_rank);
      comm_seq.erase(current_rank);
      current = nullptr;
    }
    if (current) {
      // Communicator keys, not file-local ids, so that every rank of a communicator agrees.
      const auto key = comm_keys.find(call.comm_id);
      current->push_back(callSignature(key == comm_keys.end() ? no_comm : key->second, call.api, call.dtype,
                                       call.op, call.count));
      enqueued[current_rank].push_back(call.enqueue_ns);
      // Point-to-point calls and NCCL group launches are numbered apart from the collectives of their
      // communicator (numberedApart): a sequence of their own.
      const std::int64_t sequence = call.graph_replay != 0    ? kReplay
                                    : numberedApart(call.api) ? call.comm_id | kPeerSequence
                                                              : call.comm_id;
      comm_seq[current_rank].emplace_back(sequence, call.seq);
    }
    return marked.size() < ranks;
  });
  // The pattern is the order in which the rank issued its calls (enqueue time), which is not always the
  // order they were written in: a nonblocking call is recorded when it completes, after calls issued
  // later. Detect in issue order, then hand the steps out in id order.
  std::map<std::int64_t, DetectedSteps> detected;
  for (auto& [rank_id, rank_signatures] : signatures) {
    const std::vector<std::int64_t>& times = enqueued[rank_id];
    std::vector<std::uint32_t> order(rank_signatures.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return times[a] < times[b]; });
    // Within a communicator the sequence number is the exact issue order; enqueue times only interleave
    // communicators. (The agent converts times batch by batch with a clock rate it refines between
    // batches, so calls microseconds apart can swap.) Each communicator's calls keep the places the
    // times gave them, in seq order.
    const auto& calls = comm_seq[rank_id];
    std::map<std::int64_t, std::vector<std::size_t>> places;  // comm id -> places in `order`
    for (std::size_t place = 0; place < order.size(); ++place)
      if (calls[order[place]].first != kReplay) places[calls[order[place]].first].push_back(place);
    std::vector<std::uint32_t> members;
    for (const auto& [comm, where] : places) {
      members.clear();
      for (const std::size_t place : where) members.push_back(order[place]);
      std::stable_sort(members.begin(), members.end(),
                       [&](std::uint32_t a, std::uint32_t b) { return calls[a].second < calls[b].second; });
      for (std::size_t k = 0; k < where.size(); ++k) order[where[k]] = members[k];
    }
    comm_seq.erase(rank_id);
    std::vector<std::uint64_t> issued(rank_signatures.size());
    for (std::size_t i = 0; i < order.size(); ++i) issued[i] = rank_signatures[order[i]];
    rank_signatures = std::vector<std::uint64_t>();  // freed as soon as it is reordered
    enqueued.erase(rank_id);
    const std::vector<std::int64_t> steps = detectSteps(issued);
    std::vector<std::int64_t>& by_id = detected[rank_id].steps;
    by_id.resize(steps.size());
    for (std::size_t i = 0; i < order.size(); ++i) by_id[order[i]] = steps[i];
  }
  return detected;
}

// Clock offsets between hosts. Ranks on one host share its clock; hosts' clocks differ by however well
// NTP/PTP keeps them, which misaligns a multi-node timeline by up to milliseconds. The job's all-reduces
// (the same communicator key and sequence number on every rank) give two estimates of the offset to add
// to a host's times:
// - Bounds. No rank leaves an all-reduce before every rank has entered it, so the offset lies between
//   (reference host's last start - this host's first end) and (reference's first end - this host's last
//   start) for every all-reduce. The lower bound is tight only over all-reduces the reference host entered
//   last, the upper only over those this host entered last; where each host was last in at least a tenth
//   of them, the interval is narrow and its middle is the estimate (it assumes the fastest way from one
//   host to the other as fast as the way back).
// - Ends. Every rank leaves once the last rank's data has arrived, so the hosts' last ends happen at
//   nearly the same true time: the median of their difference, kept inside the interval. It assumes the
//   ranks leave together, which algorithms do not promise (a ring lets the ranks after a slow link leave
//   late), and is the estimate where one host nearly always arrives last (a straggler's host), which
//   leaves one side of the interval loose.
// Measured between namespace hosts (scripts/cluster.sh, tests/cluster), each host last in about half the
// all-reduces: 1 Gbit/s links, intervals 19-23 us wide, the middle 0.04-3 us from the offset injected
// where the ends were 0.02-10.6 us off (later, 2 ranks per host and 1000 steps: intervals 25-50 us, the
// middle within 0.5 us in 8 runs, and 2.2-5.7 us in 6 runs beside a busy loop on one of the 2 cores); one
// link at 100 Mbit/s, a 156 us interval whose middle was 53 us off, the ends' median 350-620 us outside it.
// Bounds that contradict each other (a clock that drifted during the run) leave the ends' median. Only the
// first kClockSamples all-reduces of each communicator are kept, as one aggregate per host, and at least
// kMinClockMatches all-reduces seen on both hosts are needed for an estimate.
constexpr std::int64_t kClockSamples = 4096;
constexpr std::size_t kMinClockMatches = 8;
constexpr std::size_t kBothLastShare = 10;  // each host last in at least 1 / kBothLastShare of them

// One host's ranks in one all-reduce, on its clock; last_end == INT64_MIN: the host has no such call.
struct HostTimes {
  std::int64_t last_start = INT64_MIN, first_end = INT64_MAX, last_end = INT64_MIN;
  bool seen() const { return last_end != INT64_MIN; }
  void add(std::int64_t start_ns, std::int64_t end_ns) {
    last_start = std::max(last_start, start_ns);
    first_end = std::min(first_end, end_ns);
    last_end = std::max(last_end, end_ns);
  }
};

struct ClockSamples {
  struct Host {
    std::string run_uuid, name;
  };
  std::vector<Host> hosts;                                             // by dense index
  std::map<std::pair<std::string, std::string>, std::uint32_t> index;  // (run uuid, host) -> index
  std::map<std::string, std::uint32_t> reference;                      // run uuid -> its lowest rank's host
  // (run uuid, communicator key) -> per host index, its ranks' times in each sampled all-reduce by seq:
  // 24 bytes per (host, all-reduce), whatever the number of ranks per host.
  std::map<std::pair<std::string, std::string>, std::map<std::uint32_t, std::vector<HostTimes>>> times;

  std::uint32_t hostIndex(const std::string& run_uuid, const std::string& host) {
    const auto [it, inserted] = index.try_emplace({run_uuid, host}, static_cast<std::uint32_t>(hosts.size()));
    if (inserted) hosts.push_back({run_uuid, host});
    return it->second;
  }
  static void add(std::vector<HostTimes>& host_times, std::int64_t seq, std::int64_t start,
                  std::int64_t end) {
    const auto at = static_cast<std::size_t>(seq);
    if (host_times.size() <= at) host_times.resize(at + 1);
    host_times[at].add(start, end);
  }
};

bool alignsEnds(Api api) {
  return api == Api::MpiAllreduce || api == Api::NcclAllReduce;
}

// Offsets per (run uuid, host) for the hosts other than each run's reference host (the lowest rank's).
std::map<std::pair<std::string, std::string>, std::int64_t> estimateClockOffsets(
    const ClockSamples& samples) {
  struct Evidence {
    std::vector<std::int64_t> end_differences;       // reference's last end - this host's
    std::vector<std::int64_t> start_differences;     // reference's last start - this host's
    std::int64_t low = INT64_MIN, high = INT64_MAX;  // the interval every all-reduce allows
  };
  std::map<std::pair<std::string, std::string>, Evidence> evidence;
  for (const auto& [key, by_host] : samples.times) {
    const auto reference = samples.reference.find(key.first);
    if (reference == samples.reference.end()) continue;
    const auto reference_times = by_host.find(reference->second);
    if (reference_times == by_host.end()) continue;
    for (const auto& [host, times] : by_host) {
      if (host == reference->second) continue;
      Evidence& e = evidence[{key.first, samples.hosts[host].name}];
      const std::size_t seqs = std::min(times.size(), reference_times->second.size());
      for (std::size_t seq = 0; seq < seqs; ++seq) {
        const HostTimes& r = reference_times->second[seq];
        const HostTimes& h = times[seq];
        if (!r.seen() || !h.seen()) continue;
        e.end_differences.push_back(r.last_end - h.last_end);
        e.start_differences.push_back(r.last_start - h.last_start);
        e.low = std::max(e.low, r.last_start - h.first_end);
        e.high = std::min(e.high, r.first_end - h.last_start);
      }
    }
  }
  std::map<std::pair<std::string, std::string>, std::int64_t> offsets;
  for (auto& [host, e] : evidence) {
    const std::size_t n = e.end_differences.size();
    if (n < kMinClockMatches) continue;
    const auto middle = e.end_differences.begin() + static_cast<std::ptrdiff_t>(n / 2);
    std::nth_element(e.end_differences.begin(), middle, e.end_differences.end());
    if (e.low > e.high) {  // bounds that contradict each other: a clock that drifted
      offsets[host] = *middle;
      continue;
    }
    const std::int64_t ends = std::clamp(*middle, e.low, e.high);
    // Which host arrived last, on the clocks the ends align: the upper bound is tight only if this host
    // was sometimes last, the lower only if the reference was.
    const auto this_last = static_cast<std::size_t>(std::count_if(
        e.start_differences.begin(), e.start_differences.end(), [&](std::int64_t d) { return d < ends; }));
    const bool both_last = this_last * kBothLastShare >= n && (n - this_last) * kBothLastShare >= n;
    offsets[host] = both_last ? e.low + (e.high - e.low) / 2 : ends;
  }
  return offsets;
}

// What one input holds besides its runs and ranks, read by a decoding thread and handed to the writer in
// input order: first its communicators, then its calls in batches (in id order, steps detected and
// filled in, ids and times as the file has them), then the rows that refer to them.
struct DecodedItem {
  enum class Kind { Header, Calls, Tail } kind = Kind::Header;
  // Header
  std::vector<CommInfo> comms;
  std::int64_t steps_detected = 0;  // most steps detected on one of its ranks
  // Calls
  std::vector<CallRecord> calls;
  // Tail. Consensus rows without a step that name a call have its step (old call ids).
  std::vector<Measurement> measurements;
  std::vector<ConsensusRecord> consensus;
  std::vector<AppliedCall> applied;
  std::vector<RecommendationRecord> recommendations;
  std::vector<GpuActivityRecord> gpu;
  std::vector<DropRecord> drops;
};

// The batch the writer appends at once, as before the decoding moved to threads.
constexpr std::size_t kCallBatch = 4096;

// Reads the input at `path` into items for `emit`, which returns false to stop (the merge failed).
void decodeInput(const std::string& path, bool detect_steps, const std::function<bool(DecodedItem&&)>& emit) {
  const TraceReader reader = TraceReader::open(path);
  DecodedItem header;
  header.comms = reader.comms();
  std::map<std::int64_t, std::string> comm_keys;  // old id -> key
  for (const CommInfo& comm : header.comms) comm_keys[comm.id] = comm.key;
  std::map<std::int64_t, DetectedSteps> detected;  // ranks without explicit steps, by old id
  if (detect_steps) detected = detectMissingSteps(reader, comm_keys, reader.ranks().size());
  for (const auto& [rank_id, rank] : detected)
    if (!rank.steps.empty())
      header.steps_detected =
          std::max(header.steps_detected, *std::max_element(rank.steps.begin(), rank.steps.end()) + 1);
  if (!emit(std::move(header))) return;

  // Consensus rows the agent wrote without a step take their call's step, known once the call is read
  // (detection may have given it one): old call id -> step.
  DecodedItem tail;
  tail.kind = DecodedItem::Kind::Tail;
  tail.consensus = reader.consensus();
  std::map<std::int64_t, std::int64_t> step_of_call;
  for (const ConsensusRecord& row : tail.consensus)
    if (row.step < 0 && row.call_id) step_of_call.emplace(*row.call_id, -1);
  std::int64_t detected_rank = -1;
  DetectedSteps* rank_steps = nullptr;  // detected[detected_rank], if any
  DecodedItem batch;
  batch.kind = DecodedItem::Kind::Calls;
  batch.calls.reserve(kCallBatch);
  bool stopped = false;
  reader.forEachCall([&](const CallRecord& original) {
    CallRecord call = original;
    if (original.rank_id != detected_rank) {
      detected_rank = original.rank_id;
      const auto it = detected.find(detected_rank);
      rank_steps = it == detected.end() ? nullptr : &it->second;
    }
    // (A call appended after detection read the file, which can only be so while it is still being
    // written, keeps step -1.)
    if (rank_steps && call.step < 0 && rank_steps->next < rank_steps->steps.size())
      call.step = rank_steps->steps[rank_steps->next++];
    if (!step_of_call.empty())
      if (const auto wanted = step_of_call.find(original.id); wanted != step_of_call.end())
        wanted->second = call.step;
    batch.calls.push_back(call);
    if (batch.calls.size() == kCallBatch) {
      if (!emit(std::move(batch))) {
        stopped = true;
        return false;
      }
      batch.calls.clear();
      batch.calls.reserve(kCallBatch);
    }
    return true;
  });
  if (stopped || (!batch.calls.empty() && !emit(std::move(batch)))) return;
  detected.clear();

  for (ConsensusRecord& row : tail.consensus)
    if (row.step < 0 && row.call_id) row.step = step_of_call.at(*row.call_id);
  tail.measurements = reader.measurements();
  tail.applied = reader.appliedCalls();
  tail.recommendations = reader.recommendations();
  tail.gpu = reader.gpuActivity();
  tail.drops = reader.drops();
  emit(std::move(tail));
}

// Reads the inputs on `threads` threads and hands their items to one consumer (the writer) in input
// order, so that the output does not depend on the number of threads. Memory is bounded by the threads,
// not the inputs: a thread takes an input only within a window of 2 x threads inputs of the one being
// consumed, and an input's queue holds at most kQueuedItems items (call batches of 4096 calls, ~0.5 MiB)
// before its thread waits. A failure is handed over in its input's place, after the items read before it.
class DecodePipeline {
 public:
  DecodePipeline(const std::vector<std::string>& paths, int threads, bool detect_steps)
      : paths_(paths), channels_(paths.size()), window_(2 * static_cast<std::size_t>(threads)) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this, detect_steps] { work(detect_steps); });
  }
  DecodePipeline(const DecodePipeline&) = delete;
  DecodePipeline& operator=(const DecodePipeline&) = delete;
  ~DecodePipeline() {
    {
      const std::lock_guard lock(mutex_);
      cancelled_ = true;
    }
    consumed_.notify_all();
    threads_.clear();  // joins
  }

  // The next item of input `input` (taken in increasing order), waiting for it; nullopt when the input
  // has no more. Rethrows the input's failure.
  std::optional<DecodedItem> next(std::size_t input) {
    std::unique_lock lock(mutex_);
    if (current_ != input) {
      current_ = input;
      consumed_.notify_all();
    }
    Channel& channel = channels_[input];
    produced_.wait(lock, [&] { return !channel.items.empty() || channel.done; });
    if (channel.items.empty()) {
      if (channel.error) std::rethrow_exception(channel.error);
      return std::nullopt;
    }
    DecodedItem item = std::move(channel.items.front());
    channel.items.pop_front();
    consumed_.notify_all();
    return item;
  }

 private:
  static constexpr std::size_t kQueuedItems = 4;

  struct Channel {
    std::deque<DecodedItem> items;
    bool done = false;
    std::exception_ptr error;
  };

  void work(bool detect_steps) {
    for (;;) {
      std::size_t input = 0;
      {
        std::unique_lock lock(mutex_);
        consumed_.wait(lock, [&] {
          return cancelled_ || next_input_ >= paths_.size() || next_input_ < current_ + window_;
        });
        if (cancelled_ || next_input_ >= paths_.size()) return;
        input = next_input_++;
      }
      Channel& channel = channels_[input];
      try {
        decodeInput(paths_[input], detect_steps, [&](DecodedItem&& item) {
          std::unique_lock lock(mutex_);
          consumed_.wait(lock, [&] { return cancelled_ || channel.items.size() < kQueuedItems; });
          if (cancelled_) return false;
          channel.items.push_back(std::move(item));
          produced_.notify_all();
          return true;
        });
      } catch (...) {
        const std::lock_guard lock(mutex_);
        channel.error = std::current_exception();
      }
      {
        const std::lock_guard lock(mutex_);
        channel.done = true;
      }
      produced_.notify_all();
    }
  }

  const std::vector<std::string>& paths_;
  std::mutex mutex_;
  std::condition_variable produced_, consumed_;
  std::vector<Channel> channels_;
  const std::size_t window_;
  std::size_t next_input_ = 0;  // the next input a thread takes
  std::size_t current_ = 0;     // the input being consumed
  bool cancelled_ = false;
  std::vector<std::jthread> threads_;  // last: joined before the state above goes
};

// Across processes (MergeLink).
//
// Process 0 sends a reader Go (the inputs, step detection) for each merge, Stop when it fails, End after
// its command. A reader answers Go with, per input of its share in input order, the input's Source, then
// (once every Source is sent) per input its items and InputEnd; then Finished. A failure of its own is
// sent as Failed in the place of what it could not read, after which it sends nothing more; Stop makes it
// send Stopped. Finished, Failed and Stopped end what a reader sends for a merge.

// A message's first byte: what it is.
enum class Message : char {
  // Control: process 0 to a reader.
  Go = 'G',
  Stop = 'S',
  End = 'E',
  // Data: a reader to process 0.
  Source = 'R',
  Item = 'I',
  InputEnd = 'N',
  Failed = 'X',
  Finished = 'F',
  Stopped = 'P',
};

// A message's contents, written (Encoder) and read (Decoder) by the same functions: codeFields below call
// `field` and `list` on either, in one order.
class Encoder;
class Decoder;
template <typename Coder, typename Row>
void codeFields(Coder& c, Row& row);

class Encoder {
 public:
  explicit Encoder(Message kind) { out_.push_back(static_cast<char>(kind)); }
  template <typename T>
  requires std::is_arithmetic_v<T> || std::is_enum_v<T>
  void field(T value) { out_.append(reinterpret_cast<const char*>(&value), sizeof value); }
  void field(const std::string& value) {
    field(static_cast<std::uint64_t>(value.size()));
    out_.append(value);
  }
  template <typename T>
  void field(const std::optional<T>& value) {
    field(value.has_value());
    if (value) field(*value);
  }
  template <typename T>
  void list(const std::vector<T>& rows) {
    field(static_cast<std::uint64_t>(rows.size()));
    for (const T& row : rows) codeFields(*this, row);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Decoder {
 public:
  explicit Decoder(const std::string& in) : in_(in) {
    if (in_.empty()) fail("merge: an empty message from another process");
  }
  Message kind() const { return static_cast<Message>(in_[0]); }
  template <typename T>
  requires std::is_arithmetic_v<T> || std::is_enum_v<T>
  void field(T& value) {
    need(sizeof value);
    std::memcpy(&value, in_.data() + pos_, sizeof value);
    pos_ += sizeof value;
  }
  void field(std::string& value) {
    const auto size = get<std::uint64_t>();
    need(size);
    value.assign(in_, pos_, size);
    pos_ += size;
  }
  template <typename T>
  void field(std::optional<T>& value) {
    value.reset();
    if (get<bool>()) field(value.emplace());
  }
  template <typename T>
  void list(std::vector<T>& rows) {
    const auto size = get<std::uint64_t>();
    need(size);  // at least a byte per row: a corrupt size cannot reserve memory unbounded
    rows.resize(size);
    for (T& row : rows) codeFields(*this, row);
  }
  template <typename T>
  T get() {
    T value{};
    field(value);
    return value;
  }

 private:
  void need(std::uint64_t bytes) const {
    if (bytes > in_.size() - pos_) fail("merge: a truncated message from another process");
  }
  const std::string& in_;
  std::size_t pos_ = 1;
};

// Every member of each row type of records.h, in declaration order. A member added there and not here
// would be lost across processes: the sizes below then fail to compile, unless the member fits in padding
// (taken on LP64 with libstdc++; the split-merge test compares every table row for row).
#if defined(__GLIBCXX__) && __SIZEOF_POINTER__ == 8
static_assert(sizeof(RunInfo) == 240 && sizeof(RankInfo) == 104 && sizeof(CommInfo) == 64);
static_assert(sizeof(CallRecord) == 160 && sizeof(Measurement) == 208 && sizeof(ConsensusRecord) == 72);
static_assert(sizeof(AppliedCall) == 40 && sizeof(RecommendationRecord) == 56);
static_assert(sizeof(GpuActivityRecord) == 80 && sizeof(DropRecord) == 48);
#endif
template <typename Coder, typename Row>
void codeFields(Coder& c, Row& r) {
  using T = std::remove_const_t<Row>;
  if constexpr (std::is_same_v<T, RunInfo>) {
    c.field(r.id), c.field(r.uuid), c.field(r.command), c.field(r.mode), c.field(r.backend),
        c.field(r.world_size), c.field(r.host), c.field(r.config_json), c.field(r.tool_version),
        c.field(r.epoch_ns), c.field(r.start_ns), c.field(r.end_ns);
  } else if constexpr (std::is_same_v<T, RankInfo>) {
    c.field(r.id), c.field(r.run_id), c.field(r.rank), c.field(r.host), c.field(r.pid), c.field(r.device),
        c.field(r.clock_offset_ns);
  } else if constexpr (std::is_same_v<T, CommInfo>) {
    c.field(r.id), c.field(r.rank_id), c.field(r.key), c.field(r.backend), c.field(r.size),
        c.field(r.comm_rank);
  } else if constexpr (std::is_same_v<T, CallRecord>) {
    c.field(r.id), c.field(r.rank_id), c.field(r.comm_id), c.field(r.seq), c.field(r.step), c.field(r.api),
        c.field(r.dtype), c.field(r.op), c.field(r.count), c.field(r.bytes), c.field(r.enqueue_ns),
        c.field(r.start_ns), c.field(r.end_ns), c.field(r.stream), c.field(r.nccl_algo),
        c.field(r.nccl_proto), c.field(r.nccl_channels), c.field(r.graph_replay), c.field(r.dest),
        c.field(r.send_tag), c.field(r.source), c.field(r.recv_tag), c.field(r.recv_bytes),
        c.field(r.peer_max_bytes), c.field(r.peer_min_bytes);
  } else if constexpr (std::is_same_v<T, Measurement>) {
    c.field(r.id), c.field(r.run_id), c.field(r.rank_id), c.field(r.call_id), c.field(r.strategy),
        c.field(r.api), c.field(r.dtype), c.field(r.bytes), c.field(r.world), c.field(r.reps),
        c.field(r.min_ns), c.field(r.median_ns), c.field(r.p90_ns), c.field(r.max_ns), c.field(r.algbw_gbs),
        c.field(r.busbw_gbs), c.field(r.rel_l2_error), c.field(r.max_abs_error), c.field(r.cosine),
        c.field(r.overflow_count);
  } else if constexpr (std::is_same_v<T, ConsensusRecord>) {
    c.field(r.id), c.field(r.rank_id), c.field(r.step), c.field(r.alpha), c.field(r.cosine_to_mean),
        c.field(r.grad_norm), c.field(r.diversity), c.field(r.call_id);
  } else if constexpr (std::is_same_v<T, AppliedCall>) {
    c.field(r.call_id), c.field(r.strategy);
  } else if constexpr (std::is_same_v<T, RecommendationRecord>) {
    c.field(r.id), c.field(r.run_id), c.field(r.created_ns), c.field(r.json);
  } else if constexpr (std::is_same_v<T, GpuActivityRecord>) {
    c.field(r.rank_id), c.field(r.kind), c.field(r.start_ns), c.field(r.end_ns), c.field(r.kernels),
        c.field(r.range);
  } else if constexpr (std::is_same_v<T, DropRecord>) {
    c.field(r.rank_id), c.field(r.kind), c.field(r.count);
  } else if constexpr (std::is_same_v<T, Source>) {  // the path is process 0's own
    c.list(r.runs), c.list(r.ranks);
  } else {
    static_assert(std::is_same_v<T, DecodedItem>);
    c.field(r.kind);
    switch (r.kind) {
      case DecodedItem::Kind::Header: c.list(r.comms), c.field(r.steps_detected); return;
      case DecodedItem::Kind::Calls: c.list(r.calls); return;
      case DecodedItem::Kind::Tail:
        c.list(r.measurements), c.list(r.consensus), c.list(r.applied), c.list(r.recommendations),
            c.list(r.gpu), c.list(r.drops);
        return;
    }
    fail("merge: a message from another process holds an unknown item");
  }
}

template <typename Row>
std::string encodeMessage(Message kind, const Row& row) {
  Encoder out(kind);
  codeFields(out, row);
  return out.take();
}

std::string encodeFailure(const std::exception_ptr& error) {
  Encoder out(Message::Failed);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    out.field(true);
    out.field(std::string(e.what()));
  } catch (const std::exception& e) {
    out.field(false);
    out.field(std::string(e.what()));
  } catch (...) {
    out.field(false);
    out.field(std::string("unknown exception"));
  }
  return out.take();
}

// A reader's failure, thrown on process 0 as it was on the reader: gradscope::Error (a user's problem) or
// another exception (what main() calls an internal error).
[[noreturn]] void throwFailure(Decoder& in) {
  const bool user_error = in.get<bool>();
  const std::string what = in.get<std::string>();
  if (user_error) throw Error(what);
  throw std::runtime_error(what);
}

// Runs `task(i)` for i in [0, count) on `threads` threads; rethrows the failure of the lowest i.
void parallelFor(std::size_t count, int threads, const std::function<void(std::size_t)>& task) {
  std::vector<std::exception_ptr> errors(count);
  std::atomic<std::size_t> next{0};
  const auto run = [&] {
    for (std::size_t i = next++; i < count; i = next++) {
      try {
        task(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  {
    std::vector<std::jthread> workers;
    for (int i = 1; i < threads; ++i) workers.emplace_back(run);
    run();
  }
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
}

// The inputs of `share` (process `rank` of `size`): i % size == rank, in input order.
std::vector<std::string> shareOf(const std::vector<std::string>& inputs, int rank, int size) {
  std::vector<std::string> share;
  for (std::size_t i = static_cast<std::size_t>(rank); i < inputs.size(); i += static_cast<std::size_t>(size))
    share.push_back(inputs[i]);
  return share;
}

// Validates `paths` (opens each, reads its runs and ranks, closes it) on `threads` threads: the sources,
// and each input's failure where it had one.
std::vector<Source> validateInputs(const std::vector<std::string>& paths, int threads,
                                   std::vector<std::exception_ptr>& errors) {
  std::vector<Source> sources(paths.size());
  errors.assign(paths.size(), nullptr);
  parallelFor(paths.size(), threads, [&](std::size_t i) {
    try {
      const TraceReader reader = TraceReader::open(paths[i]);
      sources[i] = Source{paths[i], reader.runs(), reader.ranks()};
      if (sources[i].runs.empty()) fail("{}: has no run; it is not a complete gradscope trace", paths[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  });
  return sources;
}

// Where process 0 takes each input's source and items from: its own threads for its share, the reader
// whose share it is for the others. Constructing it starts the readers on this merge; destroying it before
// finish() stops them (the merge failed) and takes what they still send, so that none is left waiting.
class InputFeed {
 public:
  InputFeed(const std::vector<std::string>& inputs, int threads, bool detect_steps, MergeLink* link)
      : inputs_(inputs),
        threads_(threads),
        detect_steps_(detect_steps),
        link_(link),
        processes_(link ? link->size() : 1),
        stride_(static_cast<std::size_t>(processes_)),
        ended_(stride_, false),
        own_(shareOf(inputs, 0, processes_)) {
    if (!link_) return;
    Encoder go(Message::Go);
    go.field(static_cast<std::uint64_t>(inputs.size()));
    for (const std::string& input : inputs) go.field(input);
    go.field(detect_steps);
    const std::string message = go.take();
    for (int reader = 1; reader < processes_; ++reader) link_->sendControl(reader, message);
  }
  InputFeed(const InputFeed&) = delete;
  InputFeed& operator=(const InputFeed&) = delete;
  ~InputFeed() {
    if (!link_ || finished_) return;
    local_.reset();
    try {
      for (int reader = 1; reader < processes_; ++reader)
        link_->sendControl(reader, Encoder(Message::Stop).take());
      for (int reader = 1; reader < processes_; ++reader)
        while (!ended(reader)) ended(reader) = isLast(Decoder(link_->receiveData(reader)).kind());
    } catch (...) {
      // The link itself failed: the readers' launcher ends them with this process.
    }
    link_->readers_stopped = true;
  }

  // Every input's runs and ranks; throws the failure of the lowest input that has one, as one process.
  std::vector<Source> validate() {
    std::vector<std::exception_ptr> own_errors;
    std::vector<Source> own = validateInputs(own_, threads_, own_errors);
    std::vector<Source> sources(inputs_.size());
    std::exception_ptr first_error;
    for (std::size_t i = 0; i < inputs_.size() && !first_error; ++i) {
      const int owner = ownerOf(i);
      if (owner == 0) {
        first_error = own_errors[i / stride_];
        sources[i] = std::move(own[i / stride_]);
        continue;
      }
      const std::string message = link_->receiveData(owner);
      Decoder in(message);
      if (in.kind() == Message::Source) {
        sources[i].path = inputs_[i];
        codeFields(in, sources[i]);
      } else {
        first_error = failure(owner, in);
      }
    }
    if (first_error) std::rethrow_exception(first_error);
    local_ = std::make_unique<DecodePipeline>(own_, threads_, detect_steps_);
    return sources;
  }

  // The next item of input `input` (taken in increasing order); nullopt when the input has no more.
  std::optional<DecodedItem> next(std::size_t input) {
    const int owner = ownerOf(input);
    if (owner == 0) return local_->next(input / stride_);
    const std::string message = link_->receiveData(owner);
    Decoder in(message);
    if (in.kind() == Message::Item) {
      DecodedItem item;
      codeFields(in, item);
      return item;
    }
    if (in.kind() == Message::InputEnd) return std::nullopt;
    std::rethrow_exception(failure(owner, in));
  }

  // Every input taken: the readers' last messages of this merge.
  void finish() {
    for (int reader = 1; reader < processes_; ++reader) {
      const std::string message = link_->receiveData(reader);
      Decoder in(message);
      if (in.kind() != Message::Finished) std::rethrow_exception(failure(reader, in));
      ended(reader) = true;
    }
    finished_ = true;
  }

 private:
  static bool isLast(Message kind) {
    return kind == Message::Finished || kind == Message::Failed || kind == Message::Stopped;
  }
  int ownerOf(std::size_t input) const { return static_cast<int>(input % stride_); }
  std::vector<bool>::reference ended(int process) { return ended_[static_cast<std::size_t>(process)]; }
  // A reader's message where it should have sent a source or an item: its failure (it sends no more).
  std::exception_ptr failure(int reader, Decoder& in) {
    ended(reader) = isLast(in.kind());
    try {
      if (in.kind() == Message::Failed) throwFailure(in);
      fail("merge: process {} sent an unexpected message ('{}')", reader, static_cast<char>(in.kind()));
    } catch (...) {
      return std::current_exception();
    }
  }

  const std::vector<std::string>& inputs_;
  const int threads_;
  const bool detect_steps_;
  MergeLink* const link_;
  const int processes_;
  const std::size_t stride_;  // processes_, as an index
  std::vector<bool> ended_;   // by process: its last message of this merge taken
  bool finished_ = false;
  std::vector<std::string> own_;  // this process's share
  std::unique_ptr<DecodePipeline> local_;
};

// A reader's part of one merge (Go received): false when process 0 stopped it.
bool serveShare(MergeLink& link, const std::vector<std::string>& inputs, bool detect_steps, int threads) {
  const std::vector<std::string> own = shareOf(inputs, link.rank(), link.size());
  const auto send = [&](std::string message) {
    if (link.pollControl()) {  // only Stop comes during a merge
      link.sendData(Encoder(Message::Stopped).take());
      return false;
    }
    link.sendData(std::move(message));
    return true;
  };
  std::vector<std::exception_ptr> errors;
  const std::vector<Source> sources = validateInputs(own, threads, errors);
  for (std::size_t j = 0; j < own.size(); ++j) {
    if (errors[j]) return send(encodeFailure(errors[j]));  // its last message of this merge
    if (!send(encodeMessage(Message::Source, sources[j]))) return false;
  }
  try {
    DecodePipeline pipeline(own, threads, detect_steps);
    for (std::size_t j = 0; j < own.size(); ++j) {
      while (std::optional<DecodedItem> item = pipeline.next(j))
        if (!send(encodeMessage(Message::Item, *item))) return false;
      if (!send(Encoder(Message::InputEnd).take())) return false;
    }
  } catch (...) {
    return send(encodeFailure(std::current_exception()));
  }
  return send(Encoder(Message::Finished).take());
}

int decodingThreads(int jobs) {
  if (jobs > 0) return jobs;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

std::vector<std::string> expandTraceInputs(const std::vector<std::string>& inputs,
                                           const std::string& exclude) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  const fs::path excluded = exclude.empty() ? fs::path() : fs::weakly_canonical(exclude, ec);
  for (const std::string& input : inputs) {
    if (fs::is_directory(input, ec)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(input, ec))
        if (entry.is_regular_file() && entry.path().extension() == ".db" &&
            entry.path().filename().string().front() != '.' &&
            (excluded.empty() || fs::weakly_canonical(entry.path(), ec) != excluded))
          found.push_back(entry.path().string());
      if (ec) fail("{}: cannot list directory: {}", input, ec.message());
      if (found.empty()) fail("{}: no trace files (*.db) in this directory", input);
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(input);
    }
  }
  if (files.empty()) fail("no input traces given");
  return files;
}

MergeSummary mergeTraces(const std::vector<std::string>& inputs, const std::string& output,
                         const MergeOptions& options) {
  const int threads = decodingThreads(options.jobs);
  MergeLink* const link =
      options.link && options.link->size() > 1 && !options.link->readers_stopped ? options.link : nullptr;
  // This process's threads read its inputs (all of them without a link), the readers theirs.
  InputFeed feed(inputs, threads, options.detect_steps, link);
  // Validate every input before creating anything: open it, read its runs and ranks, close it.
  const std::vector<Source> sources = feed.validate();

  // Runs by uuid, and the checks that make a merge meaningful.
  struct MergedRun {
    RunInfo info;
    std::int64_t epoch_ns = 0;
    bool any_open = false;
    std::int64_t new_id = 0;
    std::map<int, nlohmann::json> agent_stats;  // by rank
  };
  std::map<std::string, MergedRun> runs;
  std::map<std::pair<std::string, int>, std::string> rank_owner;
  std::map<std::string, std::pair<int, std::string>> lowest_rank;  // run uuid -> (lowest rank, its host)
  for (const Source& source : sources) {
    for (const RunInfo& run : source.runs) {
      auto [it, inserted] = runs.try_emplace(run.uuid);
      MergedRun& merged = it->second;
      const std::int64_t start_abs = run.epoch_ns + run.start_ns;
      if (inserted) {
        merged.info = run;
        merged.epoch_ns = run.epoch_ns;
        merged.info.start_ns = start_abs;  // absolute until the end of the scan
        merged.info.end_ns = run.end_ns ? std::optional(run.epoch_ns + *run.end_ns) : std::nullopt;
      } else {
        merged.epoch_ns = std::min(merged.epoch_ns, run.epoch_ns);
        merged.info.start_ns = std::min(merged.info.start_ns, start_abs);
        if (run.end_ns && merged.info.end_ns)
          merged.info.end_ns = std::max(*merged.info.end_ns, run.epoch_ns + *run.end_ns);
        merged.info.world_size = std::max(merged.info.world_size, run.world_size);
      }
      if (!run.end_ns) merged.any_open = true;
      int single_rank = -1, rank_count = 0;
      for (const RankInfo& rank : source.ranks)
        if (rank.run_id == run.id) single_rank = rank_count++ == 0 ? rank.rank : -1;
      collectAgentStats(run.config_json, single_rank, merged.agent_stats);
    }
    for (const RankInfo& rank : source.ranks) {
      const auto run = std::find_if(source.runs.begin(), source.runs.end(),
                                    [&](const RunInfo& r) { return r.id == rank.run_id; });
      if (run == source.runs.end()) fail("{}: rank {} refers to a missing run", source.path, rank.rank);
      const auto [it, inserted] = rank_owner.try_emplace({run->uuid, rank.rank}, source.path);
      if (!inserted)
        fail("rank {} of run {} appears in both {} and {}; merge each rank's file once", rank.rank, run->uuid,
             it->second, source.path);
      const auto [lowest, first] = lowest_rank.try_emplace(run->uuid, rank.rank, rank.host);
      if (!first && rank.rank < lowest->second.first) lowest->second = {rank.rank, rank.host};
    }
  }
  // A run that another run of the inputs started (MPI_Comm_spawn: "spawned_by" in its configuration, set by
  // the agent) belongs with it: one job, several worlds, each a run of its own in the output.
  std::vector<std::string> independent;
  for (const auto& [uuid, merged] : runs) {
    const auto config = nlohmann::json::parse(merged.info.config_json, nullptr, false);
    const bool spawned = config.is_object() && config.contains("spawned_by") &&
                         config["spawned_by"].is_string() &&
                         runs.contains(config["spawned_by"].get<std::string>());
    if (!spawned) independent.push_back(uuid);
  }
  if (independent.size() > 1 && !options.allow_different_runs) {
    fail(
        "the inputs belong to {} different runs ({}, {}, ...); pass --allow-different-runs to merge them "
        "anyway",
        independent.size(), independent[0], independent[1]);
  }

  detail::AtomicOutput out(output, options.overwrite, /*create_empty=*/false);
  MergeSummary summary;
  ClockSamples clock;
  for (const auto& [uuid, lowest] : lowest_rank) clock.reference[uuid] = clock.hostIndex(uuid, lowest.second);
  std::vector<std::pair<std::int64_t, std::uint32_t>> host_of_rank;  // (merged rank id, host index)
  {
    TraceWriter writer = TraceWriter::create(out.temporaryPath());
    for (auto& [uuid, merged] : runs) {
      RunInfo info = merged.info;
      info.epoch_ns = merged.epoch_ns;
      info.config_json = mergedConfig(merged.info.config_json, merged.agent_stats);
      info.start_ns = merged.info.start_ns - merged.epoch_ns;
      info.end_ns = merged.any_open || !merged.info.end_ns
                        ? std::nullopt
                        : std::optional(*merged.info.end_ns - merged.epoch_ns);
      merged.new_id = writer.addRun(info);
    }
    // Threads (and readers) decode the inputs; this one remaps and writes their rows in input order.
    std::int64_t last_call_id = 0;
    for (std::size_t input = 0; input < sources.size(); ++input) {
      const Source& source = sources[input];
      std::map<std::int64_t, std::int64_t> run_ids, rank_ids, comm_ids, shifts;  // old -> new
      std::map<std::int64_t, std::string> comm_keys;                             // old id -> key
      for (const RunInfo& run : source.runs) {
        const MergedRun& merged = runs.at(run.uuid);
        run_ids[run.id] = merged.new_id;
        shifts[run.id] = run.epoch_ns - merged.epoch_ns;
      }
      std::map<std::int64_t, std::int64_t> rank_shift;
      std::map<std::int64_t, std::string> run_of_rank;  // old rank id -> run uuid
      std::map<std::int64_t, std::uint32_t> host_of;    // old rank id -> host index
      for (RankInfo rank : source.ranks) {
        const std::int64_t old_id = rank.id;
        rank_shift[old_id] = shifts.at(rank.run_id);
        const std::string& uuid = std::find_if(source.runs.begin(), source.runs.end(), [&](const RunInfo& r) {
                                    return r.id == rank.run_id;
                                  })->uuid;
        rank.run_id = run_ids.at(rank.run_id);
        rank.id = 0;
        rank_ids[old_id] = writer.addRank(rank);
        run_of_rank[old_id] = uuid;
        host_of[old_id] = clock.hostIndex(uuid, rank.host);
        host_of_rank.emplace_back(rank_ids[old_id], host_of[old_id]);
      }
      const auto remapRank = [&](std::int64_t old_id) {
        const auto it = rank_ids.find(old_id);
        if (it == rank_ids.end())
          fail("{}: a row refers to rank id {}, which is not in the ranks table", source.path, old_id);
        return it->second;
      };

      // Calls keep their order; ids move up by a constant so references to them stay easy to remap.
      std::int64_t call_offset = 0;
      bool first_call = true;
      // The clock samples of the last (communicator, rank) seen: its host's times.
      std::pair<std::int64_t, std::int64_t> sampled{-1, -1};
      std::vector<HostTimes>* sampled_times = nullptr;
      while (std::optional<DecodedItem> item = feed.next(input)) {
        if (item->kind == DecodedItem::Kind::Header) {
          for (CommInfo comm : item->comms) {
            const std::int64_t old_id = comm.id;
            const auto rank = rank_ids.find(comm.rank_id);
            if (rank == rank_ids.end())
              fail("{}: communicator {} refers to a missing rank", source.path, comm.key);
            comm.rank_id = rank->second;
            comm_ids[old_id] = writer.addComm(comm);
            comm_keys[old_id] = comm.key;
          }
          summary.steps_detected = std::max(summary.steps_detected, item->steps_detected);
        } else if (item->kind == DecodedItem::Kind::Calls) {
          for (CallRecord& call : item->calls) {
            const CallRecord original = call;
            if (first_call) {
              call_offset = last_call_id + 1 - original.id;
              first_call = false;
            }
            call.id = original.id + call_offset;
            const auto shift = rank_shift.find(original.rank_id);
            const std::int64_t by = shift == rank_shift.end() ? 0 : shift->second;
            call.rank_id = remapRank(original.rank_id);
            const auto comm = comm_ids.find(original.comm_id);
            call.comm_id = comm == comm_ids.end() ? 0 : comm->second;
            call.enqueue_ns += by;
            call.start_ns += by;
            call.end_ns += by;
            // (A graph replay shares its captured call's seq: not a sample of its own.)
            if (alignsEnds(call.api) && call.graph_replay == 0 && call.seq >= 0 && call.seq < kClockSamples &&
                call.end_ns > 0) {
              if (sampled != std::pair{original.comm_id, original.rank_id}) {
                sampled = {original.comm_id, original.rank_id};
                const auto key = comm_keys.find(original.comm_id);
                sampled_times = key == comm_keys.end()
                                    ? nullptr
                                    : &clock.times[{run_of_rank.at(original.rank_id), key->second}]
                                                  [host_of.at(original.rank_id)];
              }
              if (sampled_times) ClockSamples::add(*sampled_times, call.seq, call.start_ns, call.end_ns);
            }
            last_call_id = call.id;
          }
          writer.appendCalls(item->calls);
          summary.calls += static_cast<std::int64_t>(item->calls.size());
        } else {
          for (Measurement& m : item->measurements) {
            m.run_id = run_ids.count(m.run_id) ? run_ids[m.run_id] : runs.begin()->second.new_id;
            if (m.rank_id) m.rank_id = remapRank(*m.rank_id);
            if (m.call_id) m.call_id = *m.call_id + call_offset;
            writer.addMeasurement(m);
            ++summary.measurements;
          }
          for (ConsensusRecord& row : item->consensus) {
            row.rank_id = remapRank(row.rank_id);
            if (row.call_id) row.call_id = *row.call_id + call_offset;
          }
          writer.appendConsensus(item->consensus);
          for (AppliedCall& row : item->applied) row.call_id += call_offset;
          writer.appendApplied(item->applied);
          for (RecommendationRecord& recommendation : item->recommendations) {
            recommendation.run_id = run_ids.count(recommendation.run_id) ? run_ids[recommendation.run_id] : 0;
            writer.addRecommendation(recommendation);
          }
          for (GpuActivityRecord& row : item->gpu) {
            const auto shift = rank_shift.find(row.rank_id);
            const std::int64_t by = shift == rank_shift.end() ? 0 : shift->second;
            row.rank_id = remapRank(row.rank_id);
            row.start_ns += by;
            row.end_ns += by;
          }
          writer.appendGpuActivity(item->gpu);
          for (const DropRecord& drop : item->drops)
            writer.addDrops(remapRank(drop.rank_id), drop.kind, drop.count);
        }
      }
      summary.ranks += static_cast<int>(source.ranks.size());
      ++summary.files;
    }
    feed.finish();
    const auto offsets = estimateClockOffsets(clock);
    clock.times.clear();  // before the step model, the merge's other large part
    for (const auto& [rank_id, host] : host_of_rank)
      if (const auto offset = offsets.find({clock.hosts[host].run_uuid, clock.hosts[host].name});
          offset != offsets.end())
        writer.setClockOffset(rank_id, offset->second);
    summary.hosts_aligned = static_cast<int>(offsets.size());
    for (const auto& [host, offset] : offsets)
      summary.largest_offset_ns = std::max(summary.largest_offset_ns, offset < 0 ? -offset : offset);
    // The step model needs every rank's calls, their steps and the clocks' offsets: read back what was
    // just written (committed, so a reader of the WAL sees it), then store its rows with the rest.
    writer.commit();
    {
      // The tuner's workload too, counted once here rather than by every recommend and check: beside the
      // model (one thread), through a connection of its own.
      auto counts_later = std::async(std::launch::async, [path = out.temporaryPath()] {
        return TraceReader::open(path).reductionCounts();
      });
      const StepModel model = computeStepModel(TraceReader::open(out.temporaryPath()));
      const TraceReader::ReductionCounts counts = counts_later.get();
      writer.appendSteps(model.steps);
      writer.appendExposure(model.exposure);
      writer.appendStepCalls(model.step_calls);
      writer.setReductionCounts(counts.sizes, counts);
      summary.step_rows = static_cast<std::int64_t>(model.steps.size());
    }
    writer.finish();
  }
  out.commit();
  summary.runs = static_cast<int>(runs.size());
  return summary;
}

int serveMerges(MergeLink& link, int jobs) {
  const int threads = decodingThreads(jobs);
  for (;;) {
    const std::string message = link.receiveControl();
    Decoder in(message);
    switch (in.kind()) {
      case Message::End: return in.get<int>();
      case Message::Go: {
        std::vector<std::string> inputs(in.get<std::uint64_t>());
        for (std::string& input : inputs) in.field(input);
        if (!serveShare(link, inputs, in.get<bool>(), threads)) return -1;
        break;
      }
      default:  // Stop
        return -1;
    }
  }
}

void endMerges(MergeLink& link, int status) {
  if (link.size() <= 1 || link.readers_stopped) return;
  Encoder end(Message::End);
  end.field(status);
  const std::string message = end.take();
  for (int reader = 1; reader < link.size(); ++reader) link.sendControl(reader, message);
  link.readers_stopped = true;
}

}  // namespace gradscope::storage
