// MPI interposition: the wrappers of mpi_functions.def, MPI_Iallreduce with its completion at the
// Wait/Test functions, initialisation and finalisation, and communicator creation.
//
// Built against the MPI headers only; the real functions (PMPI_*) and Open MPI's predefined handles
// are looked up at run time (symbols.h), so the agent loads into processes without MPI.

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
  std::array<std::pair<MPI_Op, ReduceOp>, 4> ops{};
};

// The predefined reduction handles, for the hot path without predefined()'s initialisation guard:
// filled by predefined(), which activation calls before any call is recorded.
std::array<std::pair<MPI_Op, ReduceOp>, 4> g_reduce_ops{};

const Predefined& predefined() {
  static const Predefined handles = [] {
    Predefined p;
#ifdef OPEN_MPI
    p.world = static_cast<MPI_Comm>(findDataSymbol("ompi_mpi_comm_world"));
    p.null_comm = static_cast<MPI_Comm>(findDataSymbol("ompi_mpi_comm_null"));
    p.byte = static_cast<MPI_Datatype>(findDataSymbol("ompi_mpi_byte"));
    p.ops = {{{static_cast<MPI_Op>(findDataSymbol("ompi_mpi_op_sum")), ReduceOp::Sum},
              {static_cast<MPI_Op>(findDataSymbol("ompi_mpi_op_max")), ReduceOp::Max},
              {static_cast<MPI_Op>(findDataSymbol("ompi_mpi_op_min")), ReduceOp::Min},
              {static_cast<MPI_Op>(findDataSymbol("ompi_mpi_op_prod")), ReduceOp::Prod}}};
#else
    p.world = MPI_COMM_WORLD;
    p.null_comm = MPI_COMM_NULL;
    p.byte = MPI_BYTE;
    p.ops = {{{MPI_SUM, ReduceOp::Sum},
              {MPI_MAX, ReduceOp::Max},
              {MPI_MIN, ReduceOp::Min},
              {MPI_PROD, ReduceOp::Prod}}};
#endif
    g_reduce_ops = p.ops;
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

// ---- nonblocking all-reduce --------------------------------------------------------------------------

// Iallreduce calls in flight, by request handle. Completion is noticed in the Wait/Test functions: a
// request handle they reset (to MPI_REQUEST_NULL) has completed. The table is bounded; beyond it,
// calls are dropped and counted ("iallreduce_table").
class PendingRequests {
 public:
  bool empty() const { return count_.load(std::memory_order_relaxed) == 0; }

  void add(MPI_Request request, const CallEvent& event) {
    const std::lock_guard lock(mutex_);
    for (Entry& entry : entries_)
      if (!entry.used) {
        entry = {true, request, event};
        count_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    countDrop(DropKind::IallreduceTable);
  }

  void complete(MPI_Request request, std::uint64_t end) {
    CallEvent event;
    {
      const std::lock_guard lock(mutex_);
      Entry* found = nullptr;
      for (Entry& entry : entries_)
        if (entry.used && entry.request == request) found = &entry;
      if (found == nullptr) return;
      event = found->event;
      found->used = false;
      count_.fetch_sub(1, std::memory_order_relaxed);
    }
    event.call.end = end;
    record(event);
  }

 private:
  struct Entry {
    bool used = false;
    MPI_Request request{};
    CallEvent event;
  };
  std::mutex mutex_;
  std::atomic<int> count_{0};
  std::array<Entry, 256> entries_{};
};
PendingRequests g_pending;

// Wraps one Wait/Test call: snapshots the request handles, calls, and completes the ones that changed.
template <typename Call>
int withCompletion(MPI_Request* requests, int n, Call&& call) {
  if (g_pending.empty() || requests == nullptr || n <= 0) return call();
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
  const int rc = call();
  const std::uint64_t end = ticks();
  for (int i = 0; i < n; ++i)
    if (requests[i] != before[i]) g_pending.complete(before[i], end);
  return rc;
}

// Every field of a host-timed call's record (the ring's slot holds an older record).
inline void fillHostCall(CallEvent& event, Api api, std::uint32_t comm, DType dtype, ReduceOp op,
                         std::int64_t count, std::int64_t bytes, std::int64_t seq, std::int64_t step,
                         std::uint64_t start, std::uint64_t end) {
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
}

// ---- explore and apply ---------------------------------------------------------------------------------

// Open MPI spells MPI_IN_PLACE with a C cast.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
inline bool isInPlace(const void* buffer) {
  return buffer == MPI_IN_PLACE;
}
#pragma GCC diagnostic pop

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
  const std::int64_t step = stepForCall();
  CallEvent event;
  fillHostCall(event, api, slot->index, type.dtype, op_code, count, bytes, call.seq, step, 0, 0);
  const auto finish_record = [&](int rc) {
    if (request != nullptr && rc == MPI_SUCCESS && event.call.strategy == 0) {
      g_pending.add(*request, event);  // recorded at completion, like any MPI_Iallreduce
    } else {
      event.call.end = ticks();
      if (recording()) record(event);
      else countCallNotRecorded();
    }
    return rc;
  };

  if (shadowMode(Backend::Mpi) == ShadowMode::Apply) {
    const RecommendationRule* rule = applyRuleFor(api, type.dtype, op_code, bytes, slot->size);
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

  // Explore.
  if (!explorePlan().sample(slot->index, api, type.dtype, op_code, bytes)) {
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
      record.result = extension(Backend::Mpi)->explore(call, budget);
    }
    explorePlan().done(slot->index, api, type.dtype, bytes, record.result.explored,
                       record.result.over_budget);
    record.comm = slot->index;
    record.seq = call.seq;
    record.step = step;
    record.api = api;
    record.dtype = type.dtype;
    record.bytes = bytes;
    record.world = slot->size;
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

// ---- the collectives (generated) ---------------------------------------------------------------------

#define GS_MPI_BLOCKING(NAME, API, PARAMS, ARGS, COUNT, ELEMENTS, DATATYPE, OP, COMM)                       \
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
    const std::int64_t step = stepForCall();                                                                \
    std::uint64_t start;                                                                                    \
    if (!startRecording(start)) return real_##NAME ARGS;                                                    \
    const int rc = real_##NAME ARGS;                                                                        \
    const std::uint64_t end = ticks();                                                                      \
    /* What the record needs besides the times, after them: a call that is not recorded never pays for */   \
    /* it, and a recorded one not inside its span. The arguments are as the caller passed them. */          \
    const TypeInfo type = g_types.lookup(DATATYPE);                                                         \
    const ReduceOp op_code = reduceOpOf(OP);                                                                \
    const std::int64_t count_value = COUNT;                                                                 \
    const std::int64_t bytes = static_cast<std::int64_t>(ELEMENTS) * type.size;                             \
    recordInPlace([&](CallEvent& event) {                                                                   \
      fillHostCall(event, Api::API, slot->index, type.dtype, op_code, count_value, bytes, seq, step, start, \
                   end);                                                                                    \
    });                                                                                                     \
    return rc;                                                                                              \
  }
#include "interpose/mpi_functions.def"
#undef GS_MPI_BLOCKING

GS_EXPORT int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                             MPI_Comm comm, MPI_Request* request) {
  GS_REAL(MPI_Iallreduce);
  if (real_MPI_Iallreduce == nullptr) return missingFunction("PMPI_Iallreduce");
  if (shadowHooks() && !t_internal && shadowMode(Backend::Mpi) != ShadowMode::Off)
    if (const std::optional<int> rc = shadowAllreduce(
            Api::MpiIallreduce, sendbuf, recvbuf, count, datatype, op, comm, request,
            [&] { return real_MPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request); }))
      return *rc;
  if (!recording() && !activateLate()) {
    countCallNotRecorded();
    return real_MPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  }
  CommSlot* const slot = commSlot(comm);
  if (slot == nullptr) return real_MPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  const TypeInfo type = g_types.lookup(datatype);
  CallEvent event;
  fillHostCall(event, Api::MpiIallreduce, slot->index, type.dtype, reduceOpOf(op), count,
               std::int64_t{count} * type.size, slot->nextSeq(), stepForCall(), ticks(), 0);
  const int rc = real_MPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  if (rc == MPI_SUCCESS && request != nullptr) {
    g_pending.add(*request, event);
  } else {
    event.call.end = ticks();
    record(event);
  }
  return rc;
}

// ---- completion of nonblocking calls (generated) -----------------------------------------------------

// GS_MPI_COMPLETION(NAME, PARAMS, ARGS, REQUESTS, N)
#define GS_MPI_COMPLETION_FUNCTIONS(X)                                                                     \
  X(MPI_Wait, (MPI_Request * request, MPI_Status * status), (request, status), request, 1)                 \
  X(MPI_Test, (MPI_Request * request, int* flag, MPI_Status* status), (request, flag, status), request, 1) \
  X(MPI_Waitall, (int count, MPI_Request requests[], MPI_Status statuses[]), (count, requests, statuses),  \
    requests, count)                                                                                       \
  X(MPI_Testall, (int count, MPI_Request requests[], int* flag, MPI_Status statuses[]),                    \
    (count, requests, flag, statuses), requests, count)                                                    \
  X(MPI_Waitany, (int count, MPI_Request requests[], int* index, MPI_Status* status),                      \
    (count, requests, index, status), requests, count)                                                     \
  X(MPI_Testany, (int count, MPI_Request requests[], int* index, int* flag, MPI_Status* status),           \
    (count, requests, index, flag, status), requests, count)                                               \
  X(MPI_Waitsome,                                                                                          \
    (int incount, MPI_Request requests[], int* outcount, int indices[], MPI_Status statuses[]),            \
    (incount, requests, outcount, indices, statuses), requests, incount)                                   \
  X(MPI_Testsome,                                                                                          \
    (int incount, MPI_Request requests[], int* outcount, int indices[], MPI_Status statuses[]),            \
    (incount, requests, outcount, indices, statuses), requests, incount)

#define GS_MPI_COMPLETION(NAME, PARAMS, ARGS, REQUESTS, N)                              \
  GS_EXPORT int NAME PARAMS {                                                           \
    GS_REAL(NAME);                                                                      \
    if (__builtin_expect(real_##NAME == nullptr, 0)) return missingFunction("P" #NAME); \
    return withCompletion(REQUESTS, N, [&] { return real_##NAME ARGS; });               \
  }
GS_MPI_COMPLETION_FUNCTIONS(GS_MPI_COMPLETION)
#undef GS_MPI_COMPLETION

// ---- initialisation and finalisation -----------------------------------------------------------------

GS_EXPORT int MPI_Init(int* argc, char*** argv) {
  GS_REAL(MPI_Init);
  if (real_MPI_Init == nullptr) return missingFunction("PMPI_Init");
  const int rc = real_MPI_Init(argc, argv);
  if (rc == MPI_SUCCESS) activateFromWorld();
  return rc;
}

GS_EXPORT int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  GS_REAL(MPI_Init_thread);
  if (real_MPI_Init_thread == nullptr) return missingFunction("PMPI_Init_thread");
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
  }
  comms().retire(*slot);
  return rc;
}
