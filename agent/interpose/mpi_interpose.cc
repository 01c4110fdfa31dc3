// MPI interposition: the wrappers of mpi_functions.def, MPI_Iallreduce with its completion at the
// Wait/Test functions, initialisation and finalisation, and communicator creation.
//
// Built against the MPI headers only; the real functions (PMPI_*) and Open MPI's predefined handles
// are looked up at run time (symbols.h), so the agent loads into processes without MPI.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <mpi.h>

#include "core/recorder.h"
#include "core/shadow.h"
#include "core/symbols.h"

#define GS_EXPORT extern "C" __attribute__((visibility("default")))

namespace gradscope::agent {
namespace {

// ---- real functions ---------------------------------------------------------------------------------

template <typename Function>
Function resolve(const char* name) {
  return reinterpret_cast<Function>(findNextSymbol(name));
}

// Looked up on first use (thread-safe static initialisation: one predictable branch afterwards).
#define GS_REAL(NAME) static const auto real_##NAME = resolve<decltype(&P##NAME)>("P" #NAME)

int missingFunction(const char* name) {
  log("{} not found in any loaded MPI library; the call fails with MPI_ERR_INTERN", name);
  return MPI_ERR_INTERN;
}

// Open MPI's predefined handles are addresses of objects in libmpi; the agent does not link libmpi, so
// it looks the objects up by name once MPI is loaded. Other MPIs define them as constants.
struct Predefined {
  MPI_Comm world{};
  MPI_Comm null_comm{};
  MPI_Datatype byte{};
  // The request a nonblocking call returns when it completed as it was posted: Open MPI hands every eager
  // send the same one (ompi_request_empty), so it is no call's own handle.
  MPI_Request completed{};
  std::array<std::pair<MPI_Op, ReduceOp>, 4> ops{};
};

// The predefined reduction handles, for the hot path without predefined()'s initialisation guard:
// filled by predefined(), which activation calls before any call is recorded.
std::array<std::pair<MPI_Op, ReduceOp>, 4> g_reduce_ops{};
MPI_Request g_completed_request{};  // Predefined::completed, for the hot path likewise

const Predefined& predefined() {
  static const Predefined handles = [] {
    Predefined p;
#ifdef OPEN_MPI
    p.world = static_cast<MPI_Comm>(findDataSymbol("ompi_mpi_comm_world"));
    p.null_comm = static_cast<MPI_Comm>(findDataSymbol("ompi_mpi_comm_null"));
    p.byte = static_cast<MPI_Datatype>(findDataSymbol("ompi_mpi_byte"));
    p.completed = static_cast<MPI_Request>(findDataSymbol("ompi_request_empty"));
    p.ops = {{{static_cast<MPI_Op>(findDataSymbol("ompi_mpi_op_sum")), ReduceOp::Sum},
              {static_cast<MPI_Op>(findDataSymbol("ompi_mpi_op_max")), ReduceOp::Max},
              {static_cast<MPI_Op>(findDataSymbol("ompi_mpi_op_min")), ReduceOp::Min},
              {static_cast<MPI_Op>(findDataSymbol("ompi_mpi_op_prod")), ReduceOp::Prod}}};
#else
    p.world = MPI_COMM_WORLD;
    p.null_comm = MPI_COMM_NULL;
    p.byte = MPI_BYTE;
    p.completed = MPI_REQUEST_NULL;
    p.ops = {{{MPI_SUM, ReduceOp::Sum},
              {MPI_MAX, ReduceOp::Max},
              {MPI_MIN, ReduceOp::Min},
              {MPI_PROD, ReduceOp::Prod}}};
#endif
    g_reduce_ops = p.ops;
    g_completed_request = p.completed;
    return p;
  }();
  return handles;
}

// ---- handles → vocabulary ----------------------------------------------------------------------------

// A marker for the collectives without a reduction.
struct NoOp {};
constexpr NoOp kNoOp{};

ReduceOp reduceOpOf(NoOp) {
  return ReduceOp::None;
}
ReduceOp reduceOpOf(MPI_Op op) {
  for (const auto& [handle, code] : g_reduce_ops)
    if (handle == op) return code;
  return ReduceOp::Other;
}

struct TypeInfo {
  DType dtype = DType::Other;
  std::int64_t size = 0;
};

DType dtypeFromName(std::string_view name) {
  static constexpr std::pair<std::string_view, DType> kNames[] = {
      {"MPI_FLOAT", DType::Fp32},
      {"MPI_REAL4", DType::Fp32},
      {"MPI_DOUBLE", DType::Fp64},
      {"MPI_REAL8", DType::Fp64},
      {"MPI_INT", DType::Int32},
      {"MPI_INT32_T", DType::Int32},
      {"MPI_INTEGER4", DType::Int32},
      {"MPI_UNSIGNED", DType::Uint32},
      {"MPI_UINT32_T", DType::Uint32},
      {"MPI_LONG", DType::Int64},
      {"MPI_INT64_T", DType::Int64},
      {"MPI_LONG_LONG", DType::Int64},
      {"MPI_LONG_LONG_INT", DType::Int64},
      {"MPI_INTEGER8", DType::Int64},
      {"MPI_UNSIGNED_LONG", DType::Uint64},
      {"MPI_UINT64_T", DType::Uint64},
      {"MPI_UNSIGNED_LONG_LONG", DType::Uint64},
      {"MPI_CHAR", DType::Int8},
      {"MPI_SIGNED_CHAR", DType::Int8},
      {"MPI_INT8_T", DType::Int8},
      {"MPI_BYTE", DType::Uint8},
      {"MPI_UNSIGNED_CHAR", DType::Uint8},
      {"MPI_UINT8_T", DType::Uint8},
  };
  for (const auto& [text, dtype] : kNames)
    if (text == name) return dtype;
  return DType::Other;
}

// Predefined datatypes are cached by handle (they are never freed); derived ones are sized per call,
// because a freed derived type's handle may come back as a different type.
class TypeCache {
 public:
  TypeInfo lookup(MPI_Datatype type) {
    if (type == t_last_type_) return t_last_info_;
    const std::size_t n = count_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n; ++i)
      if (entries_[i].type == type) return remember(type, entries_[i].info);
    return slow(type);
  }

 private:
  struct Entry {
    MPI_Datatype type{};
    TypeInfo info;
  };

  TypeInfo remember(MPI_Datatype type, TypeInfo info) {
    t_last_type_ = type;
    t_last_info_ = info;
    return info;
  }

  TypeInfo slow(MPI_Datatype type) {
    GS_REAL(MPI_Type_size);
    GS_REAL(MPI_Type_get_name);
    TypeInfo info;
    int size = 0;
    if (real_MPI_Type_size != nullptr && real_MPI_Type_size(type, &size) == MPI_SUCCESS) info.size = size;
    char name[MPI_MAX_OBJECT_NAME] = {};
    int length = 0;
    if (real_MPI_Type_get_name != nullptr && real_MPI_Type_get_name(type, name, &length) == MPI_SUCCESS) {
      const DType dtype =
          dtypeFromName(std::string_view(name, static_cast<std::size_t>(std::max(0, length))));
      if (dtype != DType::Other && static_cast<std::int64_t>(sizeOf(dtype)) == info.size) info.dtype = dtype;
    }
    if (info.dtype == DType::Other) return info;  // derived: not cached
    const std::lock_guard lock(mutex_);
    const std::size_t n = count_.load(std::memory_order_relaxed);
    if (n < entries_.size()) {
      entries_[n] = {type, info};
      count_.store(n + 1, std::memory_order_release);
    }
    return remember(type, info);
  }

  static constinit thread_local MPI_Datatype t_last_type_;
  static constinit thread_local TypeInfo t_last_info_;
  std::mutex mutex_;
  std::atomic<std::size_t> count_{0};
  std::array<Entry, 64> entries_{};
};
constinit thread_local MPI_Datatype TypeCache::t_last_type_{};
constinit thread_local TypeInfo TypeCache::t_last_info_{};
TypeCache g_types;

std::int64_t sumOfCounts(const int counts[], int n) {
  std::int64_t total = 0;
  for (int i = 0; i < n; ++i) total += counts[i];
  return total;
}

// ---- communicators -----------------------------------------------------------------------------------

int worldRankOfLeader(MPI_Comm comm) {
  GS_REAL(MPI_Comm_group);
  GS_REAL(MPI_Group_translate_ranks);
  GS_REAL(MPI_Group_free);
  if (!real_MPI_Comm_group || !real_MPI_Group_translate_ranks || !real_MPI_Group_free) return -1;
  MPI_Group group{}, world_group{};
  if (real_MPI_Comm_group(comm, &group) != MPI_SUCCESS) return -1;
  if (real_MPI_Comm_group(predefined().world, &world_group) != MPI_SUCCESS) {
    real_MPI_Group_free(&group);
    return -1;
  }
  const int zero = 0;
  int leader = -1;
  real_MPI_Group_translate_ranks(group, 1, &zero, world_group, &leader);
  real_MPI_Group_free(&group);
  real_MPI_Group_free(&world_group);
  return leader;
}

CommSlot* registerComm(MPI_Comm comm, const std::string& key) {
  GS_REAL(MPI_Comm_size);
  GS_REAL(MPI_Comm_rank);
  GS_REAL(MPI_Comm_test_inter);
  CommDescription description;
  description.backend = Backend::Mpi;
  description.key = key;
  if (real_MPI_Comm_size) real_MPI_Comm_size(comm, &description.size);
  if (real_MPI_Comm_rank) real_MPI_Comm_rank(comm, &description.rank);
  int inter = 0;
  if (real_MPI_Comm_test_inter && real_MPI_Comm_test_inter(comm, &inter) == MPI_SUCCESS)
    description.inter = inter != 0;
  CommSlot* slot = comms().add(comm, description);
  if (slot == nullptr) countDrop(DropKind::CommTable);
  return slot;
}

// A communicator the agent did not see being created (before activation, or by a function it does
// not wrap): named by its leader's world rank, its size and how many such communicators this process
// met before — the same on every member when they create communicators in the same order.
CommSlot* registerUnknownComm(MPI_Comm comm) {
  // MPI_COMM_NULL is no communicator: the call fails in the library, unrecorded (and the agent's own
  // queries must not raise the job's error handler on it).
  if (comm == predefined().null_comm) return nullptr;
  if (comm == predefined().world) return registerComm(comm, "world");
  static std::mutex mutex;
  static std::vector<std::pair<std::pair<int, int>, int>> seen;
  GS_REAL(MPI_Comm_size);
  int size = 0;
  if (real_MPI_Comm_size) real_MPI_Comm_size(comm, &size);
  const int leader = worldRankOfLeader(comm);
  int ordinal = 0;
  {
    const std::lock_guard lock(mutex);
    for (auto& [id, n] : seen)
      if (id == std::make_pair(leader, size)) ordinal = ++n;
    if (ordinal == 0) seen.push_back({{leader, size}, 0});
  }
  return registerComm(comm, fmt::format("mpi:{}:{}#{}", leader, size, ordinal));
}

// Hot path: inlined into every wrapper; the registration is the cold call.
__attribute__((always_inline)) inline CommSlot* commSlot(MPI_Comm comm) {
  if (CommSlot* slot = comms().find(comm)) return slot;
  return registerUnknownComm(comm);
}

// A communicator created by a collective over `parent`: the parent's key, the kind of creation, the
// parent's creation ordinal (equal on every rank of the parent) and the new communicator's leader
// (which tells apart the pieces of one split).
// `kind` 0: a communicator whose members have no parent in common (MPI_Intercomm_merge: each group's
// is its own), named as one the agent did not see created.
void registerChild(MPI_Comm parent, MPI_Comm child, char kind) {
  if (!recording() || child == predefined().null_comm) return;
  if (kind == 0) {
    registerUnknownComm(child);
    return;
  }
  CommSlot* parent_slot = commSlot(parent);
  if (parent_slot == nullptr) return;
  const std::int64_t ordinal = parent_slot->created.load(std::memory_order_relaxed);
  parent_slot->created.store(ordinal + 1, std::memory_order_relaxed);
  const std::string parent_key = comms().description(parent_slot->index).key;
  registerComm(child, fmt::format("{}/{}{}@{}", parent_key, kind, ordinal, worldRankOfLeader(child)));
}

// Explore and apply at MPI_THREAD_MULTIPLE: the communicator the job has just created (or MPI_COMM_WORLD
// at MPI_Init) gets its duplicate now, inside the job's own creation, on every member
// (recording or not: it is collective). Its calls are left untouched otherwise (Untouched::NotPrepared).
void prepareForShadow(MPI_Comm comm) {
  if (!shadowHooks() || shadowMode(Backend::Mpi) == ShadowMode::Off || !preparesAtCreation(Backend::Mpi) ||
      comm == predefined().null_comm)
    return;
  CommSlot* const slot = commSlot(comm);
  if (slot == nullptr || slot->inter) return;
  ShadowCall call;
  call.comm = &comm;
  call.comm_index = slot->index;
  call.comm_size = slot->size;
  call.comm_rank = slot->rank;
  const std::int64_t start = monotonicNs();
  {
    InternalScope internal;
    extension(Backend::Mpi)->prepare(call);
  }
  if (shadowMode(Backend::Mpi) == ShadowMode::Explore) addSpentNs(monotonicNs() - start);
  slot->prepared.store(true, std::memory_order_relaxed);
}

// ---- activation --------------------------------------------------------------------------------------

void activateFromWorld() {
  GS_REAL(MPI_Comm_rank);
  GS_REAL(MPI_Comm_size);
  Activation activation;
  activation.backend = Backend::Mpi;
  if (real_MPI_Comm_rank) real_MPI_Comm_rank(predefined().world, &activation.rank);
  if (real_MPI_Comm_size) real_MPI_Comm_size(predefined().world, &activation.world_size);
  GS_REAL(MPI_Comm_get_parent);
  MPI_Comm parent = predefined().null_comm;
  if (real_MPI_Comm_get_parent && real_MPI_Comm_get_parent(&parent) == MPI_SUCCESS)
    activation.spawned = parent != predefined().null_comm;
  if (activate(activation)) commSlot(predefined().world);
  // Explore and apply: every rank takes part in the agreement, recording or not (shadow.h).
  startShadow(Backend::Mpi, activation.world_size, recording());
  prepareForShadow(predefined().world);
}

// MPI initialised without passing through the agent's MPI_Init (PMPI_Init called directly, or the
// agent's wrapper not bound): noticed at the first collective.
std::atomic<bool> g_late_activation_checked{false};
bool activateLate() {
  if (g_late_activation_checked.load(std::memory_order_relaxed)) return recording();
  if (g_late_activation_checked.exchange(true) || activated()) return recording();
  GS_REAL(MPI_Initialized);
  GS_REAL(MPI_Finalized);
  int initialized = 0, finalized = 0;
  if (real_MPI_Initialized) real_MPI_Initialized(&initialized);
  if (real_MPI_Finalized) real_MPI_Finalized(&finalized);
  if (initialized && !finalized) activateFromWorld();
  return recording();
}

// ---- arguments ---------------------------------------------------------------------------------------

// Open MPI spells MPI_IN_PLACE and MPI_STATUS(ES)_IGNORE with C casts.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
inline bool isInPlace(const void* buffer) {
  return buffer == MPI_IN_PLACE;
}
inline bool ignoresStatus(const MPI_Status* status) {
  return status == MPI_STATUS_IGNORE;
}
inline bool ignoresStatuses(const MPI_Status* statuses) {
  return statuses == MPI_STATUSES_IGNORE;
}
#pragma GCC diagnostic pop

// A marker for the calls without a datatype (barriers).
struct NoType {};
constexpr NoType kNoType{};

// An all-to-all's bytes per peer, in elements of its datatype (the wrapper multiplies by its size).
struct Spread {
  bool known = false;
  std::int64_t max_count = 0, min_count = 0;
};
constexpr Spread kNoSpread{};
// The same count to every peer (MPI_Alltoall): the record's count.
struct EvenSpread {};
constexpr EvenSpread evenSpread{};
// One count per peer (MPI_Alltoallv).
struct CountsSpread {
  const int* counts;
};
CountsSpread countsSpread(const int counts[]) {
  return {counts};
}

constexpr Spread spreadOf(Spread spread, std::int64_t, int) {
  return spread;
}
constexpr Spread spreadOf(EvenSpread, std::int64_t count, int) {
  return {true, count, count};
}
Spread spreadOf(CountsSpread spread, std::int64_t, int peers) {
  if (spread.counts == nullptr || peers <= 0) return {};
  Spread out{true, spread.counts[0], spread.counts[0]};
  for (int i = 1; i < peers; ++i) {
    out.max_count = std::max<std::int64_t>(out.max_count, spread.counts[i]);
    out.min_count = std::min<std::int64_t>(out.min_count, spread.counts[i]);
  }
  return out;
}

// A peer as the record stores it: MPI_PROC_NULL, MPI_ANY_SOURCE and the like are none.
inline std::int32_t peerOf(int rank) {
  return rank < 0 ? -1 : rank;
}
inline std::int32_t tagOf(int tag) {
  return tag < 0 ? -1 : tag;
}

// The bytes a completed receive took, from its status; `posted` where the MPI keeps them private.
inline std::int64_t receivedBytes(const MPI_Status& status, std::int64_t posted) {
#ifdef OPEN_MPI
  (void)posted;
  return static_cast<std::int64_t>(status._ucount);
#else
  return posted;
#endif
}

inline bool wasCancelled(const MPI_Status& status) {
#ifdef OPEN_MPI
  return status._cancelled != 0;
#else
  GS_REAL(MPI_Test_cancelled);
  int flag = 0;
  return real_MPI_Test_cancelled != nullptr && real_MPI_Test_cancelled(&status, &flag) == MPI_SUCCESS && flag;
#endif
}

// Every field of a host-timed call's record (the ring's slot holds an older record).
inline void fillHostCall(CallEvent& event, Api api, std::uint32_t comm, DType dtype, ReduceOp op,
                         std::int64_t count, std::int64_t bytes, std::int64_t seq, std::int64_t step,
                         std::uint64_t start, std::uint64_t end, std::int32_t peer = -1,
                         std::int32_t tag = -1) {
  event.header.seq = seq;
  event.header.comm = comm;
  event.header.kind = EventKind::Call;
  event.header.api = api;
  event.header.dtype = dtype;
  event.header.op = op;
  event.call.enqueue = start;
  event.call.start = start;
  event.call.end = end;
  event.call.count = count;
  event.call.bytes = bytes;
  event.call.step = step;
  event.call.gpu_slot = 0;
  event.call.strategy = 0;
  event.call.stream = 0;
  event.call.graph_captured = false;
  event.call.sampled = false;
  event.call.peer = peer;
  event.call.tag = tag;
}

inline EventHeader callHeader(Api api, std::uint32_t comm, std::int64_t seq, DType dtype, ReduceOp op) {
  EventHeader header;
  header.seq = seq;
  header.comm = comm;
  header.api = api;
  header.dtype = dtype;
  header.op = op;
  return header;
}

// An all-to-all's spread, as the record ahead of its call's.
inline void recordSpread(const EventHeader& call, const Spread& spread, std::int64_t type_size) {
  PeerExtraPayload extra{-1, -1, -1, spread.max_count * type_size, spread.min_count * type_size};
  record(peerExtraEvent(call, extra));
}

// ---- nonblocking calls in flight ---------------------------------------------------------------------

// Nonblocking calls in flight, by request handle: the record made when the call was posted, finished when
// a completion function (MPI_Wait, MPI_Test and their kin) returns the request completed, which it does by
// setting the handle to MPI_REQUEST_NULL. Persistent requests are not the job's calls the agent records
// (MPI_Send_init ... are not wrapped) and stay out of it.
//
// Any thread may post or complete (MPI_THREAD_MULTIPLE), so the table takes no lock: open addressing
// over kSlots slots, each claimed and released with a compare-and-swap on its state, and a request's slot
// is one of the kWindow after its hash. A slot is looked for in the whole window (freed slots leave
// holes), which is two cache lines of states and keys. A handle the library reuses for a new request
// while the old one's completion is still being noted here can stand in the window twice: the older
// posting is the one completed. A full window drops the call ("iallreduce_table").
class RequestTable {
 public:
  static constexpr std::size_t kSlots = 16384;
  static constexpr std::size_t kWindow = 8;

  bool empty() const { return count_.load(std::memory_order_relaxed) == 0; }

  void add(MPI_Request request, const CallEvent& event, std::int64_t spread_bytes = -1) {
    const std::size_t first = home(request);
    for (std::size_t i = first; i < first + kWindow; ++i) {
      std::uint8_t expected = kEmpty;
      if (!state_[i].compare_exchange_strong(expected, kBusy, std::memory_order_acquire)) continue;
      key_[i].store(keyOf(request), std::memory_order_relaxed);
      posted_[i].store(event.call.enqueue, std::memory_order_relaxed);
      entry_[i].event = event;
      entry_[i].spread_bytes = spread_bytes;
      entry_[i].wait_start.store(0, std::memory_order_relaxed);
      count_.fetch_add(1, std::memory_order_relaxed);
      state_[i].store(kFull, std::memory_order_release);
      return;
    }
    countDrop(DropKind::RequestTable);
  }

  struct Taken {
    CallEvent event;
    std::uint64_t wait_start = 0;
    std::int64_t spread_bytes = -1;
  };
  // Removes the request's entry (the oldest posting, should there be two); false when it has none.
  bool take(MPI_Request request, Taken& out) {
    const std::size_t first = home(request);
    const std::uintptr_t key = keyOf(request);
    for (;;) {
      std::size_t found = kSlots + kWindow;
      for (std::size_t i = first; i < first + kWindow; ++i)
        if (state_[i].load(std::memory_order_acquire) == kFull &&
            key_[i].load(std::memory_order_relaxed) == key &&
            (found == kSlots + kWindow ||
             posted_[i].load(std::memory_order_relaxed) < posted_[found].load(std::memory_order_relaxed)))
          found = i;
      if (found == kSlots + kWindow) return false;
      std::uint8_t expected = kFull;
      if (!state_[found].compare_exchange_strong(expected, kBusy, std::memory_order_acquire))
        continue;  // another thread took it first: look again
      out.event = entry_[found].event;
      out.wait_start = entry_[found].wait_start.load(std::memory_order_relaxed);
      out.spread_bytes = entry_[found].spread_bytes;
      count_.fetch_sub(1, std::memory_order_relaxed);
      state_[found].store(kEmpty, std::memory_order_release);
      return true;
    }
  }

  // The rank began waiting for the request at `when` (a completion function returned it unfinished);
  // the first time counts.
  void waiting(MPI_Request request, std::uint64_t when) {
    const std::size_t first = home(request);
    const std::uintptr_t key = keyOf(request);
    for (std::size_t i = first; i < first + kWindow; ++i)
      if (state_[i].load(std::memory_order_acquire) == kFull &&
          key_[i].load(std::memory_order_relaxed) == key) {
        std::uint64_t none = 0;
        entry_[i].wait_start.compare_exchange_strong(none, when, std::memory_order_relaxed);
      }
  }

 private:
  static constexpr std::uint8_t kEmpty = 0, kBusy = 1, kFull = 2;
  struct Entry {
    CallEvent event;
    std::atomic<std::uint64_t> wait_start{0};
    std::int64_t spread_bytes = -1;  // an MPI_Ialltoall's bytes per peer
  };

  static std::uintptr_t keyOf(MPI_Request request) {
    std::uintptr_t key = 0;
    std::memcpy(&key, &request, std::min(sizeof key, sizeof request));
    return key;
  }
  static std::size_t home(MPI_Request request) {
    return static_cast<std::size_t>((keyOf(request) * 0x9E3779B97F4A7C15ull) >> 50);  // 14 bits: kSlots
  }
  static_assert(kSlots == std::size_t{1} << 14);

  std::atomic<int> count_{0};
  std::atomic<std::uint8_t> state_[kSlots + kWindow]{};
  std::atomic<std::uintptr_t> key_[kSlots + kWindow]{};
  // When each slot's call was posted: which of two postings of one handle is older, read without owning
  // the slots.
  std::atomic<std::uint64_t> posted_[kSlots + kWindow]{};
  Entry entry_[kSlots + kWindow];
};

// Made at the first nonblocking call (1.8 MiB) and never destroyed: calls may complete while the process
// exits.
RequestTable* g_requests_table = nullptr;
std::once_flag g_requests_once;
RequestTable& requestsInFlight() {
  if (__builtin_expect(g_requests_table == nullptr, 0))
    std::call_once(g_requests_once, [] { g_requests_table = new RequestTable; });
  return *g_requests_table;
}
inline bool anyRequestInFlight() {
  return g_requests_table != nullptr && !g_requests_table->empty();
}

// A nonblocking call whose request is the one MPI hands out for calls complete at posting (Open MPI's
// eager sends): it is recorded at once, ending as it was posted, since its handle is shared and its
// completion tells nothing.
inline bool completedAtPosting(MPI_Request request) {
  return request == g_completed_request && g_completed_request != MPI_Request{};
}
void recordCompletedAtPosting(CallEvent& event, std::int64_t spread_bytes) {
  event.call.start = event.call.end = ticks();
  if (spread_bytes >= 0) record(peerExtraEvent(event.header, {-1, -1, -1, spread_bytes, spread_bytes}));
  record(event);
}

// Records a nonblocking call the completion function returned completed: posted at its record's enqueue
// time, waited for from `wait_start` (this call's entry, or the first completion function that returned
// it unfinished), finished at `end`. A receive takes the matched source, tag and size from its status.
void completed(RequestTable::Taken& taken, std::uint64_t wait_start, std::uint64_t end,
               const MPI_Status* status) {
  CallEvent& event = taken.event;
  if (status != nullptr && wasCancelled(*status)) return;  // it moved nothing
  if (taken.wait_start != 0) wait_start = std::min(wait_start, taken.wait_start);
  event.call.start = std::max(wait_start, event.call.enqueue);
  event.call.end = std::max(end, event.call.start);
  if (status != nullptr && collectiveOf(event.header.api) == Collective::Recv) {
    event.call.peer = peerOf(status->MPI_SOURCE);
    event.call.tag = event.call.peer < 0 ? -1 : tagOf(status->MPI_TAG);
    event.call.bytes = event.call.peer < 0 ? 0 : receivedBytes(*status, event.call.bytes);
  }
  if (taken.spread_bytes >= 0)
    record(peerExtraEvent(event.header, {-1, -1, -1, taken.spread_bytes, taken.spread_bytes}));
  record(event);
}

// Wraps one completion function over `requests[0, n)`: snapshots the handles, calls, and finishes the
// calls whose handles the function reset. `status_of(i)` gives request i's status after the call (or
// null), from the statuses the function filled: the job's, or the agent's own where the job passed
// MPI_STATUS(ES)_IGNORE (the wrappers substitute them only while a call is in flight).
template <typename Call, typename StatusOf>
int withCompletion(MPI_Request* requests, int n, Call&& call, StatusOf&& status_of) {
  if (!anyRequestInFlight() || requests == nullptr || n <= 0) return call();
  constexpr int kOnStack = 64;
  MPI_Request stack[kOnStack];
  std::vector<MPI_Request> heap;
  MPI_Request* before = stack;
  if (n > kOnStack) {
    heap.assign(requests, requests + n);
    before = heap.data();
  } else {
    std::memcpy(stack, requests, sizeof(MPI_Request) * static_cast<std::size_t>(n));
  }
  const std::uint64_t start = ticks();
  const int rc = call();
  const std::uint64_t end = ticks();
  RequestTable& table = *g_requests_table;
  RequestTable::Taken taken;
  for (int i = 0; i < n; ++i) {
    if (requests[i] == before[i]) {
      table.waiting(before[i], start);
    } else if (table.take(before[i], taken)) {
      completed(taken, start, end, status_of(i));
    }
  }
  return rc;
}

// Statuses for completion functions of many requests: the job's array, or the agent's own.
class StatusArray {
 public:
  StatusArray(MPI_Status* statuses, int n) {
    if (!ignoresStatuses(statuses) || !anyRequestInFlight() || n <= 0) {
      data_ = statuses;
    } else if (n <= kOnStack) {
      data_ = stack_;
    } else {
      heap_.resize(static_cast<std::size_t>(n));
      data_ = heap_.data();
    }
  }
  MPI_Status* data() const { return data_; }
  const MPI_Status* at(int i) const { return ignoresStatuses(data_) ? nullptr : data_ + i; }

 private:
  static constexpr int kOnStack = 16;
  MPI_Status* data_ = nullptr;
  MPI_Status stack_[kOnStack];
  std::vector<MPI_Status> heap_;
};

// A generalized request that is already complete: what MPI_Iallreduce hands back when apply mode ran
// the reduction to completion (MPI_Wait and MPI_Test on it return at once, MPI_Request_free works).
int completedRequest(MPI_Request* request) {
  GS_REAL(MPI_Grequest_start);
  GS_REAL(MPI_Grequest_complete);
  if (real_MPI_Grequest_start == nullptr || real_MPI_Grequest_complete == nullptr)
    return missingFunction("PMPI_Grequest_start");
  const auto query = [](void*, MPI_Status* status) {
    GS_REAL(MPI_Status_set_elements);
    GS_REAL(MPI_Status_set_cancelled);
    if (real_MPI_Status_set_elements) real_MPI_Status_set_elements(status, predefined().byte, 0);
    if (real_MPI_Status_set_cancelled) real_MPI_Status_set_cancelled(status, 0);
    status->MPI_SOURCE = MPI_UNDEFINED;
    status->MPI_TAG = MPI_UNDEFINED;
    return MPI_SUCCESS;
  };
  const auto free_state = [](void*) { return MPI_SUCCESS; };
  const auto cancel = [](void*, int) { return MPI_SUCCESS; };
  int rc = real_MPI_Grequest_start(query, free_state, cancel, nullptr, request);
  if (rc == MPI_SUCCESS) rc = real_MPI_Grequest_complete(*request);
  return rc;
}

// Explore or apply for one all-reduce (MPI_Allreduce, and MPI_Iallreduce with `request`). Runs on
// every call while a mode is on, whether this rank still records or not: the decisions below lead to
// collectives and must come out the same on every rank. Returns nothing for a call no strategy may
// stand in for (Untouched, counted): the caller then records it as observe mode does, and nothing of
// the agent's state has changed.
template <typename Real>
std::optional<int> shadowAllreduce(Api api, const void* sendbuf, void* recvbuf, int count,
                                   MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Request* request,
                                   Real&& real) {
  CommSlot* const slot = commSlot(comm);
  if (slot == nullptr) return std::nullopt;
  const bool in_place = isInPlace(sendbuf);
  if (slot->inter) {
    countUntouched(Untouched::Intercommunicator);
    return std::nullopt;
  }
  // Explored there, its measurements (world 1) would sit beside the job's real ones, and recommend
  // would ask which world size to plan for.
  if (slot->size == 1) {
    countUntouched(Untouched::SingleRank);
    return std::nullopt;
  }
  if (preparesAtCreation(Backend::Mpi) && !slot->prepared.load(std::memory_order_relaxed)) {
    countUntouched(Untouched::NotPrepared);
    return std::nullopt;
  }
  if (count < 0 || (count > 0 && (recvbuf == nullptr || (!in_place && sendbuf == nullptr)))) {
    countUntouched(Untouched::InvalidArguments);
    return std::nullopt;
  }
  const TypeInfo type = g_types.lookup(datatype);
  const ReduceOp op_code = reduceOpOf(op);
  const std::int64_t bytes = std::int64_t{count} * type.size;
  ShadowCall call;
  call.comm = &comm;
  call.comm_index = slot->index;
  call.api = api;
  call.dtype = type.dtype;
  call.op = op_code;
  call.count = static_cast<std::size_t>(count);
  call.seq = slot->nextSeq();
  call.comm_size = slot->size;
  call.comm_rank = slot->rank;
  const std::int64_t step = stepForCall(api);
  // Only a sum of a float type is a call site (call_sites.h): another call must not move a site's steps.
  const bool has_site = callSitesWanted() && op_code == ReduceOp::Sum && explorableDType(type.dtype);
  if (has_site) call.site = callSites().next(slot->index, step, call.count, type.dtype, op_code);
  CallEvent event;
  fillHostCall(event, api, slot->index, type.dtype, op_code, count, bytes, call.seq, step, 0, 0);
  const auto finish_record = [&](int rc) {
    if (request != nullptr && rc == MPI_SUCCESS && event.call.strategy == 0 &&
        !completedAtPosting(*request)) {
      requestsInFlight().add(*request, event);  // recorded at completion, like any MPI_Iallreduce
    } else {
      event.call.end = ticks();
      if (recording()) record(event);
      else countCallNotRecorded();
    }
    return rc;
  };

  if (shadowMode(Backend::Mpi) == ShadowMode::Apply) {
    const RecommendationRule* rule =
        applyRuleFor(api, type.dtype, op_code, bytes, slot->size, call.seq, step);
    if (rule == nullptr) {
      event.call.enqueue = event.call.start = ticks();
      return finish_record(real());
    }
    event.call.enqueue = event.call.start = ticks();
    std::string error;
    bool applied = false;
    {
      InternalScope internal;
      applied =
          extension(Backend::Mpi)->apply(call, in_place ? nullptr : sendbuf, recvbuf, rule->strategy, error);
    }
    countApplied(applied);
    if (!applied) {
      reportApplyFailure(rule->strategy, type.dtype, error);
      return finish_record(real());
    }
    event.call.strategy = appliedStrategyIndex(*rule);
    int rc = MPI_SUCCESS;
    if (request != nullptr) rc = completedRequest(request);
    return finish_record(rc);
  }

  // Explore: a sampled call, or the next step of a call site an exploration follows (the async errors).
  const bool sampled = explorePlan().sample(slot->index, api, type.dtype, op_code, bytes);
  bool following = false;
  if (!sampled && has_site) {
    InternalScope internal;
    following = extension(Backend::Mpi)->follows(call);
  }
  if (!sampled && !following) {
    event.call.enqueue = event.call.start = ticks();
    return finish_record(real());
  }
  const std::int64_t t0 = monotonicNs();
  {
    InternalScope internal;
    extension(Backend::Mpi)->capture(call, in_place ? recvbuf : sendbuf);
  }
  event.call.sampled = true;
  // A blocking call runs first and is explored after; a nonblocking one is explored before it is
  // issued (its buffers belong to MPI until it completes).
  double call_ns = 0;  // the job's call, when it ran before the exploration
  const auto explore = [&] {
    const BudgetState budget = budgetNow(call_ns);
    ExploreRecord record;
    {
      InternalScope internal;
      record.result = sampled ? extension(Backend::Mpi)->explore(call, budget)
                              : extension(Backend::Mpi)->follow(call, budget);
    }
    if (sampled)
      explorePlan().done(slot->index, api, type.dtype, bytes, record.result.explored,
                         record.result.over_budget);
    record.comm = slot->index;
    record.seq = call.seq;
    record.step = step;
    record.api = api;
    record.dtype = type.dtype;
    record.bytes = bytes;
    record.world = slot->size;
    record.follow = !sampled;
    submitExplore(std::move(record));
  };
  std::int64_t spent = monotonicNs() - t0;
  int rc = MPI_SUCCESS;
  if (request != nullptr) {
    const std::int64_t t1 = monotonicNs();
    explore();
    addSpentNs(spent + monotonicNs() - t1);
    event.call.enqueue = event.call.start = ticks();
    rc = real();
    return finish_record(rc);
  }
  event.call.enqueue = event.call.start = ticks();
  const std::int64_t call_start = monotonicNs();
  rc = real();
  call_ns = static_cast<double>(monotonicNs() - call_start);
  finish_record(rc);
  const std::int64_t t1 = monotonicNs();
  explore();
  addSpentNs(spent + monotonicNs() - t1);
  return rc;
}

// The interposers' hook: only the all-reduce wrappers have a shadow path.
template <Api>
struct ShadowHook {
  static constexpr bool kActive = false;
  template <typename... Args>
  static std::optional<int> call(Args...) {
    return std::nullopt;
  }
};
template <>
struct ShadowHook<Api::MpiAllreduce> {
  static constexpr bool kActive = true;
  static std::optional<int> call(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype,
                                 MPI_Op op, MPI_Comm comm) {
    GS_REAL(MPI_Allreduce);
    return shadowAllreduce(Api::MpiAllreduce, sendbuf, recvbuf, count, datatype, op, comm, nullptr,
                           [&] { return real_MPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm); });
  }
};

}  // namespace
}  // namespace gradscope::agent

using namespace gradscope;
using namespace gradscope::agent;

// ---- the recorded calls (generated) ------------------------------------------------------------------

namespace gradscope::agent {
namespace {

// MPI_Mrecv and MPI_Imrecv name no communicator: the message MPI_Mprobe or MPI_Improbe matched does, and
// the thread that probed is the one that receives it (mpi4py's recv does exactly that). The probing
// thread remembers its last matched message's communicator.
struct MatchedMessage {
  MPI_Message message{};
  MPI_Comm comm{};
  bool known = false;
};
constinit thread_local MatchedMessage t_matched;

// The communicator of `*message`, which the calling thread matched; MPI_COMM_NULL (a call left unrecorded)
// for any other message.
inline MPI_Comm matchedComm(const MPI_Message* message) {
  if (message == nullptr || !t_matched.known || t_matched.message != *message) return predefined().null_comm;
  t_matched.known = false;
  return t_matched.comm;
}

inline TypeInfo typeOf(MPI_Datatype type) {
  return g_types.lookup(type);
}
inline TypeInfo typeOf(NoType) {
  return {};
}

// Request i's status after MPI_Waitsome or MPI_Testsome, which list the completed ones in `indices`.
const MPI_Status* statusOfSome(int i, const int* outcount, const int* indices, const StatusArray& used) {
  if (outcount == nullptr || indices == nullptr || *outcount == MPI_UNDEFINED) return nullptr;
  for (int k = 0; k < *outcount; ++k)
    if (indices[k] == i) return used.at(k);
  return nullptr;
}

}  // namespace
}  // namespace gradscope::agent

// Every wrapper starts alike: the real function, the extension's own calls (which pass unrecorded),
// recording or not, and the communicator's slot.
#define GS_MPI_PROLOGUE(NAME, ARGS, COMM)                                             \
  GS_REAL(NAME);                                                                      \
  if (__builtin_expect(real_##NAME == nullptr, 0)) return missingFunction("P" #NAME); \
  if (__builtin_expect(shadowHooks(), 0) && t_internal) return real_##NAME ARGS;      \
  if (__builtin_expect(!recording(), 0) && !activateLate()) {                         \
    countCallNotRecorded();                                                           \
    return real_##NAME ARGS;                                                          \
  }                                                                                   \
  CommSlot* const slot = commSlot(COMM);                                              \
  if (__builtin_expect(slot == nullptr, 0)) return real_##NAME ARGS

// What a record needs besides its times is read after them: a call that is not recorded never pays for
// it, and a recorded one not inside its span. The arguments are as the caller passed them, and are only
// read when the call succeeded (a failed call's may be anything: it is recorded with no elements).
#define GS_MPI_BLOCKING(NAME, API, PARAMS, ARGS, COUNT, ELEMENTS, DATATYPE, OP, COMM, SPREAD)               \
  GS_EXPORT int NAME PARAMS {                                                                               \
    GS_REAL(NAME);                                                                                          \
    if (__builtin_expect(real_##NAME == nullptr, 0)) return missingFunction("P" #NAME);                     \
    if (__builtin_expect(shadowHooks(), 0)) {                                                               \
      if (t_internal) return real_##NAME ARGS;                                                              \
      if (ShadowHook<Api::API>::kActive && shadowMode(Backend::Mpi) != ShadowMode::Off)                     \
        if (const std::optional<int> shadow_rc = ShadowHook<Api::API>::call ARGS) return *shadow_rc;        \
    }                                                                                                       \
    if (__builtin_expect(!recording(), 0) && !activateLate()) {                                             \
      countCallNotRecorded();                                                                               \
      return real_##NAME ARGS;                                                                              \
    }                                                                                                       \
    CommSlot* const slot = commSlot(COMM);                                                                  \
    if (__builtin_expect(slot == nullptr, 0)) return real_##NAME ARGS;                                      \
    const std::int64_t seq = slot->nextSeq();                                                               \
    const std::int64_t step = stepForCall(Api::API);                                                        \
    std::uint64_t start;                                                                                    \
    if (!startRecording(start)) return real_##NAME ARGS;                                                    \
    const int rc = real_##NAME ARGS;                                                                        \
    const std::uint64_t end = ticks();                                                                      \
    const TypeInfo type = typeOf(DATATYPE);                                                                 \
    const ReduceOp op_code = reduceOpOf(OP);                                                                \
    const bool ok = rc == MPI_SUCCESS;                                                                      \
    const std::int64_t count_value = ok ? static_cast<std::int64_t>(COUNT) : 0;                             \
    const std::int64_t bytes = ok ? static_cast<std::int64_t>(ELEMENTS) * type.size : 0;                    \
    if (const Spread spread = ok ? spreadOf(SPREAD, count_value, slot->size) : kNoSpread; spread.known)     \
      recordSpread(callHeader(Api::API, slot->index, seq, type.dtype, op_code), spread, type.size);         \
    recordInPlace([&](CallEvent& event) {                                                                   \
      fillHostCall(event, Api::API, slot->index, type.dtype, op_code, count_value, bytes, seq, step, start, \
                   end);                                                                                    \
    });                                                                                                     \
    return rc;                                                                                              \
  }

#define GS_MPI_SEND(NAME, API, PARAMS, ARGS, COUNT, DATATYPE, PEER, TAG, COMM)                           \
  GS_EXPORT int NAME PARAMS {                                                                            \
    GS_MPI_PROLOGUE(NAME, ARGS, COMM);                                                                   \
    const std::int64_t step = stepForCall(Api::API);                                                     \
    std::uint64_t start;                                                                                 \
    if (!startRecording(start)) return real_##NAME ARGS;                                                 \
    const int rc = real_##NAME ARGS;                                                                     \
    const std::uint64_t end = ticks();                                                                   \
    const TypeInfo type = typeOf(DATATYPE);                                                              \
    const bool ok = rc == MPI_SUCCESS && PEER >= 0;                                                      \
    const std::int64_t count_value = ok ? COUNT : 0;                                                     \
    const std::int64_t bytes = count_value * type.size;                                                  \
    recordInPlace([&](CallEvent& event) {                                                                \
      fillHostCall(event, Api::API, slot->index, type.dtype, ReduceOp::None, count_value, bytes,         \
                   slot->nextPeerSeq(), step, start, end, ok ? peerOf(PEER) : -1, ok ? tagOf(TAG) : -1); \
    });                                                                                                  \
    return rc;                                                                                           \
  }

// The matched source and tag, and the size received, come from the status: the job's, or the agent's own
// where the job ignores it.
#define GS_MPI_RECV(NAME, API, PARAMS, ARGS, COUNT, DATATYPE, PEER, TAG, COMM, STATUS)           \
  GS_EXPORT int NAME PARAMS {                                                                    \
    GS_MPI_PROLOGUE(NAME, ARGS, COMM);                                                           \
    const std::int64_t step = stepForCall(Api::API);                                             \
    std::uint64_t start;                                                                         \
    if (!startRecording(start)) return real_##NAME ARGS;                                         \
    MPI_Status own_status;                                                                       \
    if (ignoresStatus(STATUS)) STATUS = &own_status;                                             \
    const int rc = real_##NAME ARGS;                                                             \
    const std::uint64_t end = ticks();                                                           \
    const TypeInfo type = typeOf(DATATYPE);                                                      \
    const bool ok = rc == MPI_SUCCESS && STATUS->MPI_SOURCE >= 0;                                \
    const std::int64_t count_value = ok ? COUNT : 0;                                             \
    const std::int64_t bytes = ok ? receivedBytes(*STATUS, count_value * type.size) : 0;         \
    recordInPlace([&](CallEvent& event) {                                                        \
      fillHostCall(event, Api::API, slot->index, type.dtype, ReduceOp::None, count_value, bytes, \
                   slot->nextPeerSeq(), step, start, end, ok ? peerOf(STATUS->MPI_SOURCE) : -1,  \
                   ok ? tagOf(STATUS->MPI_TAG) : -1);                                            \
    });                                                                                          \
    return rc;                                                                                   \
  }

// The send half is the call's record; the receive half the record ahead of it.
#define GS_MPI_SENDRECV(NAME, API, PARAMS, ARGS, SENDCOUNT, SENDTYPE, DEST, SENDTAG, RECVCOUNT, RECVTYPE,  \
                        SOURCE, RECVTAG, COMM, STATUS)                                                     \
  GS_EXPORT int NAME PARAMS {                                                                              \
    GS_MPI_PROLOGUE(NAME, ARGS, COMM);                                                                     \
    const std::int64_t step = stepForCall(Api::API);                                                       \
    std::uint64_t start;                                                                                   \
    if (!startRecording(start)) return real_##NAME ARGS;                                                   \
    MPI_Status own_status;                                                                                 \
    if (ignoresStatus(STATUS)) STATUS = &own_status;                                                       \
    const int rc = real_##NAME ARGS;                                                                       \
    const std::uint64_t end = ticks();                                                                     \
    const TypeInfo send_type = typeOf(SENDTYPE);                                                           \
    const bool ok = rc == MPI_SUCCESS;                                                                     \
    const bool sent = ok && DEST >= 0;                                                                     \
    const bool received = ok && STATUS->MPI_SOURCE >= 0;                                                   \
    const std::int64_t send_count = sent ? SENDCOUNT : 0;                                                  \
    const std::int64_t send_bytes = send_count * send_type.size;                                           \
    const EventHeader header =                                                                             \
        callHeader(Api::API, slot->index, slot->nextPeerSeq(), send_type.dtype, ReduceOp::None);           \
    if (received)                                                                                          \
      record(peerExtraEvent(header, {peerOf(STATUS->MPI_SOURCE), tagOf(STATUS->MPI_TAG),                   \
                                     receivedBytes(*STATUS, RECVCOUNT * typeOf(RECVTYPE).size), -1, -1})); \
    recordInPlace([&](CallEvent& event) {                                                                  \
      fillHostCall(event, Api::API, slot->index, send_type.dtype, ReduceOp::None, send_count, send_bytes,  \
                   header.seq, step, start, end, sent ? peerOf(DEST) : -1, sent ? tagOf(SENDTAG) : -1);    \
    });                                                                                                    \
    return rc;                                                                                             \
  }

// Recorded when a completion function finishes it (withCompletion); a call that fails at once is
// recorded now.
#define GS_MPI_NONBLOCKING(NAME, API, PARAMS, ARGS, COUNT, ELEMENTS, DATATYPE, OP, COMM, SPREAD, PEER, TAG, \
                           REQUEST)                                                                         \
  GS_EXPORT int NAME PARAMS {                                                                               \
    GS_MPI_PROLOGUE(NAME, ARGS, COMM);                                                                      \
    static const bool numbered_apart = numberedApart(Api::API); /* the row's: once, not per call */         \
    const std::int64_t seq = numbered_apart ? slot->nextPeerSeq() : slot->nextSeq();                        \
    const std::int64_t step = stepForCall(Api::API);                                                        \
    std::uint64_t start;                                                                                    \
    if (!startRecording(start)) return real_##NAME ARGS;                                                    \
    const int rc = real_##NAME ARGS;                                                                        \
    const TypeInfo type = typeOf(DATATYPE);                                                                 \
    const ReduceOp op_code = reduceOpOf(OP);                                                                \
    const bool ok = rc == MPI_SUCCESS && REQUEST != nullptr;                                                \
    const std::int64_t count_value = ok ? static_cast<std::int64_t>(COUNT) : 0;                             \
    CallEvent event;                                                                                        \
    fillHostCall(event, Api::API, slot->index, type.dtype, op_code, count_value,                            \
                 ok ? static_cast<std::int64_t>(ELEMENTS) * type.size : 0, seq, step, start, start,         \
                 peerOf(PEER), tagOf(TAG));                                                                 \
    if (!ok) {                                                                                              \
      event.call.end = ticks();                                                                             \
      record(event);                                                                                        \
      return rc;                                                                                            \
    }                                                                                                       \
    const Spread spread = spreadOf(SPREAD, count_value, slot->size);                                        \
    const std::int64_t spread_bytes = spread.known ? spread.max_count * type.size : -1;                     \
    if (completedAtPosting(*REQUEST)) {                                                                     \
      recordCompletedAtPosting(event, spread_bytes);                                                        \
      return rc;                                                                                            \
    }                                                                                                       \
    requestsInFlight().add(*REQUEST, event, spread_bytes);                                                  \
    return rc;                                                                                              \
  }

#include "interpose/mpi_functions.def"
#undef GS_MPI_PROLOGUE

GS_EXPORT int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                             MPI_Comm comm, MPI_Request* request) {
  GS_REAL(MPI_Iallreduce);
  if (real_MPI_Iallreduce == nullptr) return missingFunction("PMPI_Iallreduce");
  if (shadowHooks() && !t_internal && shadowMode(Backend::Mpi) != ShadowMode::Off)
    if (const std::optional<int> rc = shadowAllreduce(
            Api::MpiIallreduce, sendbuf, recvbuf, count, datatype, op, comm, request,
            [&] { return real_MPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request); }))
      return *rc;
  if (shadowHooks() && t_internal)
    return real_MPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  if (!recording() && !activateLate()) {
    countCallNotRecorded();
    return real_MPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  }
  CommSlot* const slot = commSlot(comm);
  if (slot == nullptr) return real_MPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  const TypeInfo type = g_types.lookup(datatype);
  CallEvent event;
  fillHostCall(event, Api::MpiIallreduce, slot->index, type.dtype, reduceOpOf(op), count,
               std::int64_t{count} * type.size, slot->nextSeq(), stepForCall(Api::MpiIallreduce), ticks(), 0);
  const int rc = real_MPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  if (rc == MPI_SUCCESS && request != nullptr && completedAtPosting(*request)) {
    recordCompletedAtPosting(event, -1);
  } else if (rc == MPI_SUCCESS && request != nullptr) {
    event.call.start = event.call.enqueue;
    requestsInFlight().add(*request, event);
  } else {
    event.call.end = ticks();
    record(event);
  }
  return rc;
}

// ---- probes: the communicator of the message MPI_Mrecv and MPI_Imrecv receive (matchedComm) ---------------

GS_EXPORT int MPI_Mprobe(int source, int tag, MPI_Comm comm, MPI_Message* message, MPI_Status* status) {
  GS_REAL(MPI_Mprobe);
  if (__builtin_expect(real_MPI_Mprobe == nullptr, 0)) return missingFunction("PMPI_Mprobe");
  const int rc = real_MPI_Mprobe(source, tag, comm, message, status);
  if (rc == MPI_SUCCESS && message != nullptr) t_matched = {*message, comm, true};
  return rc;
}

GS_EXPORT int MPI_Improbe(int source, int tag, MPI_Comm comm, int* flag, MPI_Message* message,
                          MPI_Status* status) {
  GS_REAL(MPI_Improbe);
  if (__builtin_expect(real_MPI_Improbe == nullptr, 0)) return missingFunction("PMPI_Improbe");
  const int rc = real_MPI_Improbe(source, tag, comm, flag, message, status);
  if (rc == MPI_SUCCESS && flag != nullptr && *flag && message != nullptr) t_matched = {*message, comm, true};
  return rc;
}

// ---- completion of nonblocking calls -----------------------------------------------------------------
//
// Each passes the agent's own statuses while a call is in flight and the job ignores them, so that a
// completed receive's matched source, tag and size are known.

GS_EXPORT int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  GS_REAL(MPI_Wait);
  if (__builtin_expect(real_MPI_Wait == nullptr, 0)) return missingFunction("PMPI_Wait");
  MPI_Status own_status;
  if (ignoresStatus(status) && anyRequestInFlight()) status = &own_status;
  return withCompletion(
      request, 1, [&] { return real_MPI_Wait(request, status); },
      [&](int) { return ignoresStatus(status) ? nullptr : status; });
}

GS_EXPORT int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  GS_REAL(MPI_Test);
  if (__builtin_expect(real_MPI_Test == nullptr, 0)) return missingFunction("PMPI_Test");
  MPI_Status own_status;
  if (ignoresStatus(status) && anyRequestInFlight()) status = &own_status;
  return withCompletion(
      request, 1, [&] { return real_MPI_Test(request, flag, status); },
      [&](int) { return ignoresStatus(status) ? nullptr : status; });
}

GS_EXPORT int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  GS_REAL(MPI_Waitall);
  if (__builtin_expect(real_MPI_Waitall == nullptr, 0)) return missingFunction("PMPI_Waitall");
  const StatusArray used(statuses, count);
  return withCompletion(
      requests, count, [&] { return real_MPI_Waitall(count, requests, used.data()); },
      [&](int i) { return used.at(i); });
}

GS_EXPORT int MPI_Testall(int count, MPI_Request requests[], int* flag, MPI_Status statuses[]) {
  GS_REAL(MPI_Testall);
  if (__builtin_expect(real_MPI_Testall == nullptr, 0)) return missingFunction("PMPI_Testall");
  const StatusArray used(statuses, count);
  return withCompletion(
      requests, count, [&] { return real_MPI_Testall(count, requests, flag, used.data()); },
      [&](int i) { return used.at(i); });
}

GS_EXPORT int MPI_Waitany(int count, MPI_Request requests[], int* index, MPI_Status* status) {
  GS_REAL(MPI_Waitany);
  if (__builtin_expect(real_MPI_Waitany == nullptr, 0)) return missingFunction("PMPI_Waitany");
  MPI_Status own_status;
  if (ignoresStatus(status) && anyRequestInFlight()) status = &own_status;
  return withCompletion(
      requests, count, [&] { return real_MPI_Waitany(count, requests, index, status); },
      [&](int i) { return ignoresStatus(status) || index == nullptr || *index != i ? nullptr : status; });
}

GS_EXPORT int MPI_Testany(int count, MPI_Request requests[], int* index, int* flag, MPI_Status* status) {
  GS_REAL(MPI_Testany);
  if (__builtin_expect(real_MPI_Testany == nullptr, 0)) return missingFunction("PMPI_Testany");
  MPI_Status own_status;
  if (ignoresStatus(status) && anyRequestInFlight()) status = &own_status;
  return withCompletion(
      requests, count, [&] { return real_MPI_Testany(count, requests, index, flag, status); },
      [&](int i) { return ignoresStatus(status) || index == nullptr || *index != i ? nullptr : status; });
}

// The statuses of Waitsome and Testsome are in the order of `indices`.
GS_EXPORT int MPI_Waitsome(int incount, MPI_Request requests[], int* outcount, int indices[],
                           MPI_Status statuses[]) {
  GS_REAL(MPI_Waitsome);
  if (__builtin_expect(real_MPI_Waitsome == nullptr, 0)) return missingFunction("PMPI_Waitsome");
  const StatusArray used(statuses, incount);
  return withCompletion(
      requests, incount, [&] { return real_MPI_Waitsome(incount, requests, outcount, indices, used.data()); },
      [&](int i) { return statusOfSome(i, outcount, indices, used); });
}

GS_EXPORT int MPI_Testsome(int incount, MPI_Request requests[], int* outcount, int indices[],
                           MPI_Status statuses[]) {
  GS_REAL(MPI_Testsome);
  if (__builtin_expect(real_MPI_Testsome == nullptr, 0)) return missingFunction("PMPI_Testsome");
  const StatusArray used(statuses, incount);
  return withCompletion(
      requests, incount, [&] { return real_MPI_Testsome(incount, requests, outcount, indices, used.data()); },
      [&](int i) { return statusOfSome(i, outcount, indices, used); });
}

// A request the job frees before it completes leaves the agent's table too: its call is recorded as
// finished when it was freed (when it really completes, nothing says).
GS_EXPORT int MPI_Request_free(MPI_Request* request) {
  GS_REAL(MPI_Request_free);
  if (__builtin_expect(real_MPI_Request_free == nullptr, 0)) return missingFunction("PMPI_Request_free");
  if (!anyRequestInFlight() || request == nullptr) return real_MPI_Request_free(request);
  const MPI_Request before = *request;
  const std::uint64_t start = ticks();
  const int rc = real_MPI_Request_free(request);
  RequestTable::Taken taken;
  if (rc == MPI_SUCCESS && g_requests_table->take(before, taken)) completed(taken, start, ticks(), nullptr);
  return rc;
}
// ---- initialisation and finalisation -----------------------------------------------------------------

// Apply mode with async rules asks for MPI_THREAD_MULTIPLE (shadow.h, applyNeedsMpiThreads): MPI may
// provide more than a job requires, and the job learns the level it got from `provided`.
GS_EXPORT int MPI_Init(int* argc, char*** argv) {
  GS_REAL(MPI_Init);
  if (real_MPI_Init == nullptr) return missingFunction("PMPI_Init");
  int rc = MPI_SUCCESS;
  if (applyNeedsMpiThreads()) {
    GS_REAL(MPI_Init_thread);
    int provided = MPI_THREAD_SINGLE;
    rc = real_MPI_Init_thread != nullptr ? real_MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided)
                                         : real_MPI_Init(argc, argv);
  } else {
    rc = real_MPI_Init(argc, argv);
  }
  if (rc == MPI_SUCCESS) activateFromWorld();
  return rc;
}

GS_EXPORT int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  GS_REAL(MPI_Init_thread);
  if (real_MPI_Init_thread == nullptr) return missingFunction("PMPI_Init_thread");
  if (applyNeedsMpiThreads()) required = MPI_THREAD_MULTIPLE;
  const int rc = real_MPI_Init_thread(argc, argv, required, provided);
  if (rc == MPI_SUCCESS) activateFromWorld();
  return rc;
}

// The trace is finished after the library's MPI_Finalize, not before: the extension's communicators must
// go first (they need MPI), but the file needs none, and time spent before MPI_Finalize is time the other
// processes may wait for. Open MPI 4.1's MPI_Comm_spawn hangs now and then when spawned processes take
// tens of ms more before their MPI_Finalize (mpi4py's test_spawn: 5 of 6 runs with a 30 ms delay there,
// none with it after MPI_Init); a finished trace is tens of ms of SQLite.
GS_EXPORT int MPI_Finalize() {
  GS_REAL(MPI_Finalize);
  if (real_MPI_Finalize == nullptr) return missingFunction("PMPI_Finalize");
  stopShadow(Backend::Mpi);
  const int rc = real_MPI_Finalize();
  finish();
  return rc;
}

// ---- communicator creation (generated) ----------------------------------------------------------------

// X(NAME, PARAMS, ARGS, PARENT, CHILD, KIND)
#define GS_MPI_COMM_CREATION_FUNCTIONS(X)                                                                    \
  X(MPI_Comm_dup, (MPI_Comm comm, MPI_Comm * newcomm), (comm, newcomm), comm, newcomm, 'd')                  \
  X(MPI_Comm_dup_with_info, (MPI_Comm comm, MPI_Info info, MPI_Comm * newcomm), (comm, info, newcomm), comm, \
    newcomm, 'd')                                                                                            \
  X(MPI_Comm_split, (MPI_Comm comm, int color, int key, MPI_Comm* newcomm), (comm, color, key, newcomm),     \
    comm, newcomm, 's')                                                                                      \
  X(MPI_Comm_split_type, (MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm* newcomm),         \
    (comm, split_type, key, info, newcomm), comm, newcomm, 't')                                              \
  X(MPI_Comm_create, (MPI_Comm comm, MPI_Group group, MPI_Comm * newcomm), (comm, group, newcomm), comm,     \
    newcomm, 'c')                                                                                            \
  X(MPI_Comm_create_group, (MPI_Comm comm, MPI_Group group, int tag, MPI_Comm* newcomm),                     \
    (comm, group, tag, newcomm), comm, newcomm, 'g')                                                         \
  X(MPI_Intercomm_merge, (MPI_Comm intercomm, int high, MPI_Comm* newcomm), (intercomm, high, newcomm),      \
    intercomm, newcomm, 0)                                                                                   \
  X(MPI_Cart_create,                                                                                         \
    (MPI_Comm comm, int ndims, const int dims[], const int periods[], int reorder, MPI_Comm* newcomm),       \
    (comm, ndims, dims, periods, reorder, newcomm), comm, newcomm, 'k')                                      \
  X(MPI_Cart_sub, (MPI_Comm comm, const int remain_dims[], MPI_Comm* newcomm), (comm, remain_dims, newcomm), \
    comm, newcomm, 'b')                                                                                      \
  X(MPI_Graph_create,                                                                                        \
    (MPI_Comm comm, int nnodes, const int index[], const int edges[], int reorder, MPI_Comm* newcomm),       \
    (comm, nnodes, index, edges, reorder, newcomm), comm, newcomm, 'r')                                      \
  X(MPI_Dist_graph_create,                                                                                   \
    (MPI_Comm comm, int n, const int nodes[], const int degrees[], const int targets[], const int weights[], \
     MPI_Info info, int reorder, MPI_Comm* newcomm),                                                         \
    (comm, n, nodes, degrees, targets, weights, info, reorder, newcomm), comm, newcomm, 'x')                 \
  X(MPI_Dist_graph_create_adjacent,                                                                          \
    (MPI_Comm comm, int indegree, const int sources[], const int sourceweights[], int outdegree,             \
     const int destinations[], const int destweights[], MPI_Info info, int reorder, MPI_Comm* newcomm),      \
    (comm, indegree, sources, sourceweights, outdegree, destinations, destweights, info, reorder, newcomm),  \
    comm, newcomm, 'a')

// The new communicator is registered where this rank records, and prepared for explore and apply
// where that must happen now (prepareForShadow), on every member alike.
#define GS_MPI_COMM_CREATION(NAME, PARAMS, ARGS, PARENT, CHILD, KIND)                   \
  GS_EXPORT int NAME PARAMS {                                                           \
    GS_REAL(NAME);                                                                      \
    if (__builtin_expect(real_##NAME == nullptr, 0)) return missingFunction("P" #NAME); \
    if (shadowHooks() && t_internal) return real_##NAME ARGS;                           \
    const int rc = real_##NAME ARGS;                                                    \
    if (rc != MPI_SUCCESS) return rc;                                                   \
    if (recording() || activateLate()) registerChild(PARENT, *CHILD, KIND);             \
    prepareForShadow(*CHILD);                                                           \
    return rc;                                                                          \
  }
GS_MPI_COMM_CREATION_FUNCTIONS(GS_MPI_COMM_CREATION)
#undef GS_MPI_COMM_CREATION

// The agent forgets a communicator only once the library has freed it: a free that fails (of
// MPI_COMM_WORLD, say, which mpi4py's tests try) leaves the communicator in use, its slot and sequence
// numbers with it.
GS_EXPORT int MPI_Comm_free(MPI_Comm* comm) {
  GS_REAL(MPI_Comm_free);
  if (real_MPI_Comm_free == nullptr) return missingFunction("PMPI_Comm_free");
  if (shadowHooks() && t_internal) return real_MPI_Comm_free(comm);
  // The slot is looked up before the call: once freed, the handle value may come back at once for a
  // communicator another thread creates, whose slot must stay.
  CommSlot* const slot = comm != nullptr && *comm != predefined().null_comm ? comms().find(*comm) : nullptr;
  const int rc = real_MPI_Comm_free(comm);
  if (rc != MPI_SUCCESS || slot == nullptr) return rc;
  if (shadowMode(Backend::Mpi) != ShadowMode::Off) {
    InternalScope internal;
    extension(Backend::Mpi)->forget(slot->index);
    callSites().forget(slot->index);
  }
  comms().retire(*slot);
  return rc;
}
