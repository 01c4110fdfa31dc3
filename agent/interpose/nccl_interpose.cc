// NCCL interposition: the wrappers of nccl_functions.def (collectives, sends and receives, communicator
// creation and destruction) and the one-of-a-kind ones (ncclCommInitAll, ncclCommSplit, the group calls).
//
// Built against nccl_types.h (nccl_abi/nccl.h) only: the real functions (pncclX, the strong aliases of NCCL's
// weak ncclX) are looked up at run time (symbols.h), and CUDA is used only through the libcuda.so.1 the job
// has loaded (cuda_driver.h), so the agent loads into processes without either.
//
// Hot path of a collective: a communicator look-up, a stream look-up, a capture check and two pooled
// event records (when the stream's context is timed) with a CUPTI correlation push/pop around the call
// (when CUPTI is in use), two clock reads and one record(); no lock, no allocation, no string. Inside a
// group a member only reads the clock and waits in its thread's group state; the outermost ncclGroupEnd
// times the group (gpu_timer.h) and records every member, then the launch itself (Api::NcclGroup). Sends
// and receives take the same path; they are numbered apart from the collectives (CommSlot::nextPeerSeq),
// and so is a group's launch.
//
// Recording starts (activate) at the first communicator the process creates. Communicators are named
// identically on all their ranks (nccl_state.h): by the hash of the unique id, by the ordinal of the
// ncclCommInitAll call, or by the parent, its creation ordinal and the colour for ncclCommSplit.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cuda_driver.h"
#include "core/gpu_timer.h"
#include "core/nccl_profile.h"
#include "core/nccl_state.h"
#include "core/nccl_types.h"
#include "core/recorder.h"
#include "core/shadow.h"
#include "core/symbols.h"

#define GS_EXPORT extern "C" __attribute__((visibility("default")))

namespace gradscope::agent {
namespace {

using namespace nccl;

// ---- real functions ---------------------------------------------------------------------------------

#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS) using NAME##_function = RESULT(*) PARAMS;
#include "interpose/nccl_functions.def"
#undef GS_NCCL_FUNCTION

template <typename Function>
Function resolve(const char* name) {
  return reinterpret_cast<Function>(findNextSymbol(name));
}

// Looked up on first use (thread-safe static initialisation: one predictable branch afterwards). NCCL
// exports every API function as a weak ncclX and a strong pncclX: the agent's ncclX comes first in the
// search order, pncclX is the library's.
#define GS_NCCL_REAL(NAME) static const auto real_##NAME = resolve<NAME##_function>("p" #NAME)

// The job called a function its NCCL lacks (an older library than the agent's table: a 2.28 function on
// NCCL 2.27, say), or before any NCCL was loaded. Said once per function (`said`, the wrapper's own).
ncclResult_t missingFunction(const char* name, std::atomic<bool>& said) {
  if (!said.exchange(true, std::memory_order_relaxed))
    log("{} not found in any loaded NCCL library; calls to it fail with ncclInternalError (said once)", name);
  return ncclInternalError;
}
#define GS_NCCL_MISSING(NAME)                \
  [] {                                       \
    static std::atomic<bool> said{false};    \
    return missingFunction("p" #NAME, said); \
  }()

// A marker for the collectives without a reduction.
struct NoOp {};
constexpr NoOp kNoOp{};
ReduceOp reduceOpOf(NoOp) {
  return ReduceOp::None;
}

// ---- GPU timing ---------------------------------------------------------------------------------------

StreamTable g_streams;
cuda::Driver g_driver;
// Set once (before any stream is given a domain); read on the hot path after a domain.
std::atomic<CudaEventTimer*> g_timer{nullptr};
// The tracer of the sampled GPU windows, told of marked steps (cupti_tracer.h, "Windows").
std::atomic<CuptiTracer*> g_window_tracer{nullptr};

void logTimingOff(const std::string& why) {
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) log("no GPU timing ({}); the NCCL calls concerned are timed on the host", why);
}

CudaEventTimer* gpuTimer() {
  static CudaEventTimer* const timer = []() -> CudaEventTimer* {
    std::string why;
    if (!cuda::loadDriver(g_driver, why)) {
      logTimingOff(why);
      return nullptr;
    }
    // Lives as long as the process: records may refer to it. CUPTI's records of a call's kernels are
    // waited for half a flush interval after its events are seen complete: the next flush reads them.
    CudaEventTimer::Options options;
    options.cupti_settle_ns = config().flush_interval_ns / 2;
    auto* created = new CudaEventTimer(g_driver, options);
    // CUPTI's kernel records give exact spans and the sampled windows' kernels; GRADSCOPE_CUPTI=windows
    // keeps to the events for the calls and takes kernel records inside the windows only; 0: no CUPTI.
    const char* cupti = std::getenv(env::kCupti);
    if (cupti == nullptr || std::strcmp(cupti, "0") != 0) {
      const bool spans = cupti == nullptr || std::strcmp(cupti, "windows") != 0;
      std::string cupti_why;
      CuptiTracer* tracer = CuptiTracer::start(cupti_why, spans);
      if (tracer != nullptr) {
        // With windows only, the calls made while the records are on still get their spans from them (the
        // windows' kernels and those spans then share CUPTI's clock); the others keep their events'.
        created->useCupti(tracer);
        tracer->useWindows(config().gpu_windows, g_step_marker != StepMarker::None);
        g_window_tracer.store(tracer, std::memory_order_release);
        setStepListener([](std::int64_t step) {
          if (CuptiTracer* windows = g_window_tracer.load(std::memory_order_acquire)) windows->onStep(step);
        });
        setNvtxRangeListener({[](const char* name) {
                                if (CuptiTracer* windows = g_window_tracer.load(std::memory_order_acquire))
                                  windows->rangePushed(name);
                              },
                              [] {
                                if (CuptiTracer* windows = g_window_tracer.load(std::memory_order_acquire))
                                  windows->rangePopped();
                              }});
        // The timer comes with the job's first GPU-timed call, inside a step that has begun already.
        if (const std::int64_t step = currentStep(); step >= 0) tracer->onStep(step);
      }
      if (tracer == nullptr && !cupti_why.empty())
        log("no CUPTI kernel spans ({}); NCCL calls are timed with CUDA events and steps are not broken "
            "down on the GPU (GRADSCOPE_CUPTI=0 silences this)",
            cupti_why);
      if (tracer == nullptr)
        created->noteCuptiOff(
            cupti_why.empty() ? "no libcupti.so.13 on the loader's path or in /usr/local/cuda" : cupti_why);
    } else {
      created->noteCuptiOff(fmt::format("{}=0", env::kCupti));
    }
    g_timer.store(created, std::memory_order_release);
    return created;
  }();
  return timer;
}

// Slow path (first sight of a stream, or a retry after it was capturing): the timer's domain for it.
int timingDomain(StreamTable::Entry& entry, cudaStream_t stream) {
  CudaEventTimer* timer = gpuTimer();
  int domain = CudaEventTimer::kNoDomain;
  if (timer != nullptr) {
    std::string error;
    domain = timer->domainOf(stream, error);
    if (domain >= 0) setGpuTimer(timer);
    if (!error.empty()) logTimingOff(error);
  }
  entry.domain.store(domain, std::memory_order_release);
  return domain;
}

// The stream's index for the record and its timing domain (kNoDomain: host timing).
int streamOf(cudaStream_t stream, CallEvent& event) {
  StreamTable::Entry* entry = g_streams.find(stream);
  if (entry == nullptr) {
    countDrop(DropKind::StreamTable);
    return CudaEventTimer::kNoDomain;
  }
  event.call.stream = entry->index & kMaxStreamIndex;  // fits: StreamTable's bound (nccl_state.h)
  const int domain = entry->domain.load(std::memory_order_acquire);
  if (__builtin_expect(domain >= CudaEventTimer::kNoDomain, 1)) return domain;
  return timingDomain(*entry, stream);
}

// ---- groups -------------------------------------------------------------------------------------------

thread_local GroupState t_group __attribute__((tls_model("initial-exec")));

// Times and records a call outside a group; inside one, parks it until the outermost ncclGroupEnd.
// `slot`: the call's communicator.
template <typename Call>
ncclResult_t timed(CallEvent& event, CommSlot* slot, cudaStream_t stream, Call&& call) {
  const int domain = streamOf(stream, event);
  event.call.enqueue = event.call.start = ticks();
  if (t_group.depth() > 0) {
    if (__builtin_expect(t_group.add(event, stream, domain, slot), 1)) return call();
    countDrop(DropKind::GroupTable);  // the group is full: this member is timed on its own, on the host
    const ncclResult_t rc = call();
    event.call.end = ticks();
    record(event);
    return rc;
  }
  bool captured = false;
  CudaEventTimer* const timer = domain >= 0 ? g_timer.load(std::memory_order_relaxed) : nullptr;
  // A one-rank communicator's calls run no NCCL kernel for CUPTI to time (gpu_timer.h, start).
  std::uint32_t gpu_slot =
      timer != nullptr ? timer->start(domain, stream, captured, slot == nullptr || slot->size != 1) : 0;
  const bool correlated = timer != nullptr && timer->enterCall(gpu_slot);
  // Captured into a graph: the nodes NCCL creates meanwhile stand for the call at every replay.
  const std::uint32_t capture = captured ? timer->beginCapture() : 0;
  // NCCL launches the call inside: the profiler plugin's report for it arrives on this thread meanwhile.
  t_nccl_in_flight.setSingle(&event);
  const ncclResult_t rc = call();
  t_nccl_in_flight.clear();
  if (timer != nullptr) timer->leaveCall(correlated);
  if (captured) {
    const CuptiTracer::CapturedCall call_id{event.header.comm, joinSeq(event.header.api, event.header.seq)};
    timer->endCapture(capture,
                      rc == ncclSuccess ? std::span(&call_id, 1) : std::span<CuptiTracer::CapturedCall>());
  }
  if (gpu_slot != 0) {
    // ncclInProgress (a nonblocking communicator): NCCL enqueues the work later, after this event.
    if (rc == ncclInProgress) {
      timer->abandon(gpu_slot);
      gpu_slot = 0;
    } else {
      timer->stop(gpu_slot, stream);
    }
  }
  event.call.end = ticks();
  event.call.gpu_slot = gpu_slot;
  event.call.graph_captured = captured;
  record(event);
  return rc;
}

// ---- communicators ------------------------------------------------------------------------------------

CommSlot* registerComm(ncclComm_t comm, const std::string& key, int size, int rank) {
  CommDescription description;
  description.backend = Backend::Nccl;
  description.key = key;  // made distinct by the registry (several ranks of one communicator here)
  description.size = size;
  description.rank = rank;
  CommSlot* slot = comms().add(comm, description);
  if (slot == nullptr) countDrop(DropKind::CommTable);
  return slot;
}

// Size and rank from NCCL (0 when it cannot tell yet, e.g. a nonblocking communicator still in progress).
std::pair<int, int> sizeAndRank(ncclComm_t comm) {
  GS_NCCL_REAL(ncclCommCount);
  GS_NCCL_REAL(ncclCommUserRank);
  int size = 0, rank = 0;
  if (real_ncclCommCount == nullptr || real_ncclCommCount(comm, &size) != ncclSuccess) size = 0;
  if (real_ncclCommUserRank == nullptr || real_ncclCommUserRank(comm, &rank) != ncclSuccess) rank = 0;
  return {size, rank};
}

// A communicator the agent did not see being created (by a function it does not wrap, such as
// ncclCommShrink): named by its size and how many such communicators of that size came before.
CommSlot* registerUnseenComm(ncclComm_t comm) {
  markNcclInterposed();  // a communicator whose creation the wrappers did not see (those mark their own)
  static std::mutex mutex;
  static std::vector<std::pair<int, int>> seen;  // (size, communicators of that size so far)
  const auto [size, rank] = sizeAndRank(comm);
  int ordinal = 0;
  {
    const std::lock_guard lock(mutex);
    bool found = false;
    for (auto& [known_size, n] : seen)
      if (known_size == size) {
        ordinal = n++;
        found = true;
      }
    if (!found) seen.emplace_back(size, 1);
  }
  return registerComm(comm, unseenKey(size, ordinal), size, rank);
}

CommSlot* commSlot(ncclComm_t comm) {
  if (CommSlot* slot = comms().find(comm)) return slot;
  if (comm == nullptr) return nullptr;
  return registerUnseenComm(comm);
}

// "cuda:<ordinal> <name>" as far as NCCL and the driver can tell.
std::string deviceOf(ncclComm_t comm) {
  GS_NCCL_REAL(ncclCommCuDevice);
  int ordinal = -1;
  // Inside a group NCCL initialises communicators only at ncclGroupEnd: do not ask it yet.
  if (t_group.depth() > 0 || real_ncclCommCuDevice == nullptr ||
      real_ncclCommCuDevice(comm, &ordinal) != ncclSuccess)
    ordinal = -1;
  cuda::Driver driver;
  std::string why;
  if (!cuda::loadDriver(driver, why)) return ordinal >= 0 ? fmt::format("cuda:{}", ordinal) : "cuda";
  cuda::CUdevice device = 0;
  if (ordinal >= 0) {
    if (driver.deviceGet(&device, ordinal) != cuda::CUDA_SUCCESS) return fmt::format("cuda:{}", ordinal);
  } else {
    if (driver.ctxGetDevice(&device) != cuda::CUDA_SUCCESS) return "cuda";
    ordinal = device;
  }
  char name[256] = {};
  if (driver.deviceGetName(name, sizeof name - 1, device) != cuda::CUDA_SUCCESS)
    return fmt::format("cuda:{}", ordinal);
  return fmt::format("cuda:{} {}", ordinal, name);
}

// Recording starts at the first communicator: this rank and the world are the launcher's when it says,
// else the communicator's.
void activateAt(ncclComm_t comm, int nranks, int rank) {
  if (activated()) return;
  Activation activation;
  activation.backend = Backend::Nccl;
  activation.rank = config().env_rank.value_or(rank);
  activation.world_size = config().env_world_size.value_or(nranks);
  activation.device = deviceOf(comm);
  activate(activation);
}

// Explore and apply: the NCCL extension starts at the first communicator, on this rank alone (also in
// a job that MPI_Init activated); the ranks of each communicator agree at its first explorable
// all-reduce (joinNow below).
void startNcclShadow(int nranks) {
  if (activated()) startShadow(Backend::Nccl, config().env_world_size.value_or(nranks), recording());
}

void onCreated(ncclResult_t rc, ncclComm_t* newcomm, int nranks, int rank, const ncclUniqueId* ids,
               int count) {
  // ncclInProgress: a nonblocking communicator, usable once NCCL says so; its handle is set already.
  if ((rc != ncclSuccess && rc != ncclInProgress) || newcomm == nullptr || *newcomm == nullptr) return;
  activateAt(*newcomm, nranks, rank);
  startNcclShadow(nranks);
  // A rank that stopped recording still takes part in explore and apply (their agreements need it).
  if ((recording() || shadowHooks()) && ids != nullptr && count > 0)
    registerComm(*newcomm, uniqueIdKey(ids, count), nranks, rank);
}

// ---- explore and apply (shadow.h, extension.h) ------------------------------------------------------

// Collective safety (docs/agent.md, "Explore and apply"): every decision below that leads to the
// extension's collectives depends on the communicator's call sequence and the configuration only, and
// is taken whether this rank records or not.

// Whether a communicator joined the extension's agreement (Extension::join), made on every rank at its
// first explorable all-reduce.
enum class JoinState : std::uint8_t { Unknown, Joined, Refused };
std::mutex g_joins_mutex;
std::unordered_map<std::uint32_t, JoinState> g_joins;

JoinState joinState(std::uint32_t comm) {
  const std::lock_guard lock(g_joins_mutex);
  const auto it = g_joins.find(comm);
  return it == g_joins.end() ? JoinState::Unknown : it->second;
}

JoinState joinNow(const ShadowCall& call) {
  std::string error;
  bool joined = false;
  {
    InternalScope internal;
    joined = extension(Backend::Nccl)->join(call, error);
  }
  if (!joined) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      log("{} mode leaves an NCCL communicator of {} ranks alone: {} (said once)", modeName(config().mode),
          call.comm_size, error);
  }
  const JoinState state = joined ? JoinState::Joined : JoinState::Refused;
  const std::lock_guard lock(g_joins_mutex);
  g_joins[call.comm_index] = state;
  return state;
}

// The communicator is being destroyed (every rank does it): its duplicate goes with it.
void forgetComm(ncclComm_t comm) {
  CommSlot* const slot = comms().find(comm);
  Extension* const extension = gradscope::agent::extension(Backend::Nccl);
  if (slot == nullptr || extension == nullptr || joinState(slot->index) != JoinState::Joined) return;
  {
    InternalScope internal;
    extension->forget(slot->index);
  }
  callSites().forget(slot->index);
  const std::lock_guard lock(g_joins_mutex);
  g_joins.erase(slot->index);
}

// Whether work on `stream` is being captured into a CUDA graph now (or the driver cannot tell): the
// extension's work cannot be ordered with a graph, so such calls run untouched.
bool capturing(cudaStream_t stream) {
  if (gpuTimer() == nullptr) return false;  // no CUDA driver in this process: nothing is captured
  cuda::CUstreamCaptureStatus status = cuda::CU_STREAM_CAPTURE_STATUS_NONE;
  return g_driver.streamIsCapturing(reinterpret_cast<cuda::CUstream>(stream), &status) !=
             cuda::CUDA_SUCCESS ||
         status != cuda::CU_STREAM_CAPTURE_STATUS_NONE;
}

// `sampled`: an exploration the plan chose; else the next step of a site one follows (follows()).
void exploreNow(const ShadowCall& call, std::int64_t step, bool sampled) {
  const std::int64_t t0 = monotonicNs();
  const auto bytes = static_cast<std::int64_t>(call.count * sizeOf(call.dtype));
  ExploreRecord record;
  {
    InternalScope internal;
    // The job's call time is not known on the host (NCCL returns once it is enqueued): 0.
    record.result = sampled ? extension(Backend::Nccl)->explore(call, budgetNow(0))
                            : extension(Backend::Nccl)->follow(call, budgetNow(0));
  }
  if (sampled)
    explorePlan().done(call.comm_index, call.api, call.dtype, bytes, record.result.explored,
                       record.result.over_budget);
  record.comm = call.comm_index;
  record.seq = call.seq;
  record.step = step;
  record.api = call.api;
  record.dtype = call.dtype;
  record.bytes = bytes;
  record.world = call.comm_size;
  record.follow = !sampled;
  submitExplore(std::move(record));
  addSpentNs(monotonicNs() - t0);
}

// Runs the rule's strategy in place of the call; false (said once per strategy and dtype) when the
// extension could not, and the caller then runs the job's own call.
bool applyNow(const ShadowCall& call, const void* send, void* recv, const RecommendationRule& rule,
              CallEvent& event) {
  std::string error;
  bool applied = false;
  {
    InternalScope internal;
    applied =
        extension(Backend::Nccl)->apply(call, send == recv ? nullptr : send, recv, rule.strategy, error);
  }
  countApplied(applied);
  if (applied) event.call.strategy = appliedStrategyIndex(rule);
  else reportApplyFailure(rule.strategy, call.dtype, error);
  return applied;
}

// Shadow work on a group's members waits for the outermost ncclGroupEnd: NCCL launches the group
// there, and the extension's own NCCL calls must not join the job's group. A member to apply is not
// handed to NCCL at all; its strategy runs after the group, ordered on the member's stream.
struct DeferredShadow {
  enum class Kind : std::uint8_t { Join, Explore, Apply };
  Kind kind = Kind::Join;
  ShadowCall call;  // call.comm is set to &comm when the work runs
  ncclComm_t comm = nullptr;
  CallEvent event;
  const void* send = nullptr;
  void* recv = nullptr;
  const RecommendationRule* rule = nullptr;
  bool sampled = true;  // Explore: sampled by the plan, or a followed site's next step
};
thread_local std::vector<DeferredShadow> t_deferred;

void defer(DeferredShadow::Kind kind, const ShadowCall& call, ncclComm_t comm, const CallEvent& event,
           const void* send = nullptr, void* recv = nullptr, const RecommendationRule* rule = nullptr) {
  t_deferred.push_back(DeferredShadow{kind, call, comm, event, send, recv, rule});
}

void runDeferred() {
  std::vector<DeferredShadow> work;
  work.swap(t_deferred);
  GS_NCCL_REAL(ncclAllReduce);
  for (DeferredShadow& item : work) {
    item.call.comm = &item.comm;
    JoinState joined = joinState(item.call.comm_index);
    if (joined == JoinState::Unknown) joined = joinNow(item.call);
    switch (item.kind) {
      case DeferredShadow::Kind::Join: break;
      case DeferredShadow::Kind::Explore:
        if (joined == JoinState::Joined) exploreNow(item.call, item.event.call.step, item.sampled);
        break;
      case DeferredShadow::Kind::Apply: {
        // Outside the group now: timed like a call of its own.
        const auto stream = static_cast<cudaStream_t>(item.call.stream);
        const auto apply_or_run = [&] {
          if (joined == JoinState::Joined &&
              applyNow(item.call, item.send, item.recv, *item.rule, item.event))
            return ncclSuccess;
          return real_ncclAllReduce(item.send, item.recv, item.call.count,
                                    static_cast<ncclDataType_t>(item.event.header.dtype), ncclSum, item.comm,
                                    stream);
        };
        if (recording()) {
          timed(item.event, nullptr, stream, apply_or_run);  // outside the group: no slot needed
        } else {
          countCallNotRecorded();
          apply_or_run();
        }
        break;
      }
    }
  }
}

// ncclAllReduce while the NCCL extension is loaded. `real` runs the job's own call.
template <typename Real>
ncclResult_t shadowAllReduce(CommSlot* slot, CallEvent& event, Real&& real, const void* sendbuff,
                             void* recvbuff, std::size_t count, ncclComm_t comm, cudaStream_t stream) {
  const auto plain = [&] {
    if (recording()) return timed(event, slot, stream, real);
    countCallNotRecorded();
    return real();
  };
  if (event.header.op != ReduceOp::Sum || count == 0 || !explorableDType(event.header.dtype) ||
      capturing(stream))
    return plain();
  ShadowCall call;
  call.comm = &comm;
  call.comm_index = slot->index;
  call.stream = stream;
  call.api = event.header.api;
  call.dtype = event.header.dtype;
  call.op = event.header.op;
  call.count = count;
  call.seq = event.header.seq;
  call.comm_size = slot->size;
  call.comm_rank = slot->rank;
  if (callSitesWanted())
    call.site = callSites().next(slot->index, event.call.step, count, call.dtype, call.op);
  const bool in_group = t_group.depth() > 0;
  JoinState joined = joinState(slot->index);
  if (joined == JoinState::Unknown) {
    if (in_group) {
      defer(DeferredShadow::Kind::Join, call, comm, event);
      return plain();
    }
    joined = joinNow(call);
  }
  const ShadowMode mode = shadowMode(Backend::Nccl);
  if (joined != JoinState::Joined || mode == ShadowMode::Off) return plain();

  if (mode == ShadowMode::Apply) {
    const RecommendationRule* rule =
        applyRuleFor(event.header.api, event.header.dtype, event.header.op, event.call.bytes, slot->size,
                     event.header.seq, event.call.step);
    // sum/nccl.<algo>.<proto> rules act inside NCCL, through the tuner plugin (gradscope run loads it).
    if (rule == nullptr || rule->strategy.starts_with("sum/nccl.")) return plain();
    if (in_group) {
      defer(DeferredShadow::Kind::Apply, call, comm, event, sendbuff, recvbuff, rule);
      return ncclSuccess;
    }
    // Timed like the job's call: the events around it bracket the strategy, which the job's stream
    // waits for.
    const auto apply_or_run = [&] {
      return applyNow(call, sendbuff, recvbuff, *rule, event) ? ncclSuccess : real();
    };
    if (recording()) return timed(event, slot, stream, apply_or_run);
    countCallNotRecorded();
    return apply_or_run();
  }

  // Explore: the input copy goes onto the stream ahead of the call; the exploration follows the call. A
  // call the plan did not sample may be the next step of a site an exploration follows (async errors).
  const bool sampled = explorePlan().sample(slot->index, event.header.api, event.header.dtype,
                                            event.header.op, event.call.bytes);
  bool following = false;
  if (!sampled) {
    InternalScope internal;
    following = extension(Backend::Nccl)->follows(call);
  }
  if (!sampled && !following) return plain();
  const std::int64_t t0 = monotonicNs();
  {
    InternalScope internal;
    extension(Backend::Nccl)->capture(call, sendbuff);
  }
  addSpentNs(monotonicNs() - t0);
  event.call.sampled = true;
  const ncclResult_t rc = plain();
  if (in_group) {
    defer(DeferredShadow::Kind::Explore, call, comm, event);
    t_deferred.back().sampled = sampled;
    return rc;
  }
  exploreNow(call, event.call.step, sampled);
  return rc;
}

// The interposers' hook: only ncclAllReduce has a shadow path.
template <Api>
struct ShadowHook {
  static constexpr bool kActive = false;
  template <typename... Args>
  static ncclResult_t call(Args&&...) {
    return ncclInternalError;  // never called: kActive is false
  }
};
template <>
struct ShadowHook<Api::NcclAllReduce> {
  static constexpr bool kActive = true;
  template <typename Real>
  static ncclResult_t call(CommSlot* slot, CallEvent& event, Real&& real, const void* sendbuff,
                           void* recvbuff, std::size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t comm,
                           cudaStream_t stream) {
    return shadowAllReduce(slot, event, real, sendbuff, recvbuff, count, comm, stream);
  }
};

}  // namespace
}  // namespace gradscope::agent

using namespace gradscope;
using namespace gradscope::agent;
using namespace gradscope::agent::nccl;

// ---- the collectives and communicator life cycle (generated) ---------------------------------------

#define GS_UNPAREN(...) __VA_ARGS__

// With an extension loaded (explore, apply), the extension's own calls pass straight through, and
// the all-reduce takes the shadow path, whether this rank records or not.
#define GS_NCCL_COLLECTIVE(NAME, API, PARAMS, ARGS, COUNT, ELEMENTS, DATATYPE, OP, COMM, STREAM)     \
  GS_EXPORT ncclResult_t NAME PARAMS {                                                               \
    GS_NCCL_REAL(NAME);                                                                              \
    if (__builtin_expect(real_##NAME == nullptr, 0)) return GS_NCCL_MISSING(NAME);                   \
    const bool shadow = __builtin_expect(shadowHooks(), 0);                                          \
    if (shadow && t_internal) return real_##NAME ARGS;                                               \
    const bool hooked = shadow && ShadowHook<Api::API>::kActive;                                     \
    if (__builtin_expect(!recording() && !hooked, 0)) {                                              \
      countCallNotRecorded();                                                                        \
      return real_##NAME ARGS;                                                                       \
    }                                                                                                \
    CommSlot* const slot = commSlot(COMM);                                                           \
    if (__builtin_expect(slot == nullptr, 0)) return real_##NAME ARGS;                               \
    CallEvent event;                                                                                 \
    event.header.api = Api::API;                                                                     \
    event.header.comm = slot->index;                                                                 \
    event.header.dtype = dtypeOf(DATATYPE);                                                          \
    event.header.op = reduceOpOf(OP);                                                                \
    event.call.count = static_cast<std::int64_t>(COUNT);                                             \
    event.call.bytes =                                                                               \
        static_cast<std::int64_t>(ELEMENTS) * static_cast<std::int64_t>(sizeOf(event.header.dtype)); \
    event.header.seq = slot->nextSeq();                                                              \
    event.call.step = stepForCall(Api::API);                                                         \
    const auto real = [&] { return real_##NAME ARGS; };                                              \
    if (hooked) return ShadowHook<Api::API>::call(slot, event, real, GS_UNPAREN ARGS);               \
    return timed(event, slot, STREAM, real);                                                         \
  }

// Sends and receives: the collectives' path without explore and apply (the extension's own sends and
// receives pass straight through), numbered apart from the collectives.
#define GS_NCCL_POINT_TO_POINT(NAME, API, PARAMS, ARGS, COUNT, DATATYPE, PEER, COMM, STREAM)      \
  GS_EXPORT ncclResult_t NAME PARAMS {                                                            \
    GS_NCCL_REAL(NAME);                                                                           \
    if (__builtin_expect(real_##NAME == nullptr, 0)) return GS_NCCL_MISSING(NAME);                \
    if (__builtin_expect(shadowHooks(), 0) && t_internal) return real_##NAME ARGS;                \
    if (__builtin_expect(!recording(), 0)) {                                                      \
      countCallNotRecorded();                                                                     \
      return real_##NAME ARGS;                                                                    \
    }                                                                                             \
    CommSlot* const slot = commSlot(COMM);                                                        \
    if (__builtin_expect(slot == nullptr, 0)) return real_##NAME ARGS;                            \
    CallEvent event;                                                                              \
    event.header.api = Api::API;                                                                  \
    event.header.comm = slot->index;                                                              \
    event.header.dtype = dtypeOf(DATATYPE);                                                       \
    event.call.count = static_cast<std::int64_t>(COUNT);                                          \
    event.call.bytes =                                                                            \
        static_cast<std::int64_t>(COUNT) * static_cast<std::int64_t>(sizeOf(event.header.dtype)); \
    event.call.peer = PEER;                                                                       \
    event.header.seq = slot->nextPeerSeq();                                                       \
    event.call.step = stepForCall(Api::API);                                                      \
    return timed(event, slot, STREAM, [&] { return real_##NAME ARGS; });                          \
  }

#define GS_NCCL_COMM_INIT(NAME, PARAMS, ARGS, NEWCOMM, NRANKS, RANK, IDS, NIDS) \
  GS_EXPORT ncclResult_t NAME PARAMS {                                          \
    GS_NCCL_REAL(NAME);                                                         \
    if (real_##NAME == nullptr) return GS_NCCL_MISSING(NAME);                   \
    markNcclInterposed(); /* before NCCL initialises the profiler plugin */     \
    const ncclResult_t rc = real_##NAME ARGS;                                   \
    onCreated(rc, NEWCOMM, NRANKS, RANK, IDS, NIDS);                            \
    return rc;                                                                  \
  }

// The slot is retired before NCCL frees the handle, so a communicator created meanwhile at the same
// address is a new one. ncclCommDestroy (which every rank calls) destroys the extension's duplicate
// too; after ncclCommAbort the duplicate is left as it is (a job aborts when a peer failed, and
// destroying it might wait for that peer).
#define GS_NCCL_COMM_END(NAME, PARAMS, ARGS, COMM)                                                          \
  GS_EXPORT ncclResult_t NAME PARAMS {                                                                      \
    GS_NCCL_REAL(NAME);                                                                                     \
    if (real_##NAME == nullptr) return GS_NCCL_MISSING(NAME);                                               \
    if (shadowHooks() && t_internal) return real_##NAME ARGS;                                               \
    if (COMM != nullptr && shadowHooks() && std::string_view(#NAME) == "ncclCommDestroy") forgetComm(COMM); \
    if (COMM != nullptr) comms().retire(COMM);                                                              \
    return real_##NAME ARGS;                                                                                \
  }

#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS)
#include "interpose/nccl_functions.def"
#undef GS_NCCL_FUNCTION

// ---- communicators (one of a kind) -------------------------------------------------------------------

GS_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  GS_NCCL_REAL(ncclCommInitAll);
  if (real_ncclCommInitAll == nullptr) return GS_NCCL_MISSING(ncclCommInitAll);
  markNcclInterposed();
  const ncclResult_t rc = real_ncclCommInitAll(comm, ndev, devlist);
  // One process holds every rank, so the ordinal of the call names the communicators.
  static std::atomic<std::int64_t> calls{0};
  const std::int64_t ordinal = calls.fetch_add(1, std::memory_order_relaxed);
  if (rc != ncclSuccess || comm == nullptr || ndev <= 0) return rc;
  activateAt(comm[0], ndev, 0);
  startNcclShadow(ndev);
  if (!recording() && !shadowHooks()) return rc;
  for (int i = 0; i < ndev; ++i)
    if (comm[i] != nullptr) registerComm(comm[i], initAllKey(ordinal), ndev, i);
  return rc;
}

GS_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                     ncclConfig_t* config) {
  GS_NCCL_REAL(ncclCommSplit);
  if (real_ncclCommSplit == nullptr) return GS_NCCL_MISSING(ncclCommSplit);
  if (shadowHooks() && t_internal) return real_ncclCommSplit(comm, color, key, newcomm, config);
  markNcclInterposed();
  const ncclResult_t rc = real_ncclCommSplit(comm, color, key, newcomm, config);
  if (!recording() && !shadowHooks()) return rc;
  CommSlot* parent = commSlot(comm);
  if (parent == nullptr) return rc;
  // Every rank of the parent takes part in the split (with NCCL_SPLIT_NOCOLOR too), so the ordinal is
  // the same on all of them.
  const std::int64_t ordinal = parent->created.load(std::memory_order_relaxed);
  parent->created.store(ordinal + 1, std::memory_order_relaxed);
  if ((rc != ncclSuccess && rc != ncclInProgress) || newcomm == nullptr || *newcomm == nullptr ||
      color == kSplitNoColor)
    return rc;
  const auto [size, rank] = sizeAndRank(*newcomm);
  registerComm(*newcomm, splitKey(comms().description(parent->index).key, ordinal, color), size, rank);
  return rc;
}

// ---- groups --------------------------------------------------------------------------------------------

GS_EXPORT ncclResult_t ncclGroupStart() {
  GS_NCCL_REAL(ncclGroupStart);
  if (real_ncclGroupStart == nullptr) return GS_NCCL_MISSING(ncclGroupStart);
  if (shadowHooks() && t_internal) return real_ncclGroupStart();
  t_group.start(recording() ? ticks() : 0);  // the group launch's issue time (its enqueue_ns)
  return real_ncclGroupStart();
}

GS_EXPORT ncclResult_t ncclGroupEnd() {
  GS_NCCL_REAL(ncclGroupEnd);
  if (real_ncclGroupEnd == nullptr) return GS_NCCL_MISSING(ncclGroupEnd);
  if (shadowHooks() && t_internal) return real_ncclGroupEnd();
  const bool outermost = t_group.end();
  if (!outermost || t_group.members().empty()) {
    const ncclResult_t rc = real_ncclGroupEnd();
    if (outermost && !t_deferred.empty()) runDeferred();
    return rc;
  }
  // The outermost end launches the group's work: time it on each distinct stream. The launch is a record
  // of its own, numbered here (after its members) on its first member's communicator.
  const auto members = t_group.members();
  CommSlot* const first_slot = members.front().slot;
  CallEvent launch =
      groupLaunchEvent(members, first_slot != nullptr ? first_slot->nextPeerSeq() : -1, t_group.started());
  cudaStream_t streams[GroupState::kMaxStreams];
  int domains[GroupState::kMaxStreams];
  const int n = t_group.distinctStreams(streams, domains);
  CudaEventTimer* const timer = g_timer.load(std::memory_order_acquire);
  CudaEventTimer::Group timing;
  const bool nccl_kernels = std::none_of(
      members.begin(), members.end(),
      [](const GroupState::Member& member) { return member.slot != nullptr && member.slot->size == 1; });
  if (timer != nullptr) timer->startGroup(timing, domains, streams, n, nccl_kernels);
  const std::uint64_t start = ticks();
  const bool correlated = timer != nullptr && timer->enterCall(timing.leader);
  const std::uint32_t capture = timing.captured ? timer->beginCapture() : 0;
  t_nccl_in_flight.setGroup(members);  // the profiler plugin's reports for them arrive meanwhile
  const ncclResult_t rc = real_ncclGroupEnd();
  t_nccl_in_flight.clear();
  if (timer != nullptr) timer->leaveCall(correlated);
  if (timing.captured) {
    // Every replay of the graph is a replay of each member and of the launch.
    std::vector<CuptiTracer::CapturedCall> captured;
    if (capture != 0 && rc == ncclSuccess) {
      for (const GroupState::Member& member : members)
        captured.push_back(
            {member.event.header.comm, joinSeq(member.event.header.api, member.event.header.seq)});
      if (first_slot != nullptr)
        captured.push_back({launch.header.comm, joinSeq(Api::NcclGroup, launch.header.seq)});
    }
    timer->endCapture(capture, captured);
  }
  // With nonblocking communicators (ncclInProgress) NCCL launches the group later: timed on the host.
  // The members' records and the launch's carry the timing.
  const auto carriers = static_cast<std::int32_t>(members.size()) + 1;
  if (timer != nullptr) timer->stopGroup(timing, rc == ncclInProgress ? 0 : carriers);
  const std::uint64_t end = ticks();
  for (GroupState::Member& member : members) {
    member.event.call.start = start;
    member.event.call.end = end;
    member.event.call.gpu_slot = timing.leader;
    member.event.call.graph_captured = timing.captured;
    record(member.event);
  }
  launch.call.start = start;
  launch.call.end = end;
  launch.call.gpu_slot = timing.leader;
  launch.call.graph_captured = timing.captured;
  record(launch);
  t_group.clear();
  if (!t_deferred.empty()) runDeferred();  // explore and apply of the group's members
  return rc;
}

// Ends the group without launching it: its members never run, so they are not recorded.
GS_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  GS_NCCL_REAL(ncclGroupSimulateEnd);
  if (real_ncclGroupSimulateEnd == nullptr) return GS_NCCL_MISSING(ncclGroupSimulateEnd);
  if (shadowHooks() && t_internal) return real_ncclGroupSimulateEnd(simInfo);
  if (t_group.end()) {
    t_group.clear();
    t_deferred.clear();  // nothing ran, so nothing is explored; members to apply were never launched
  }
  return real_ncclGroupSimulateEnd(simInfo);
}

// ---- the NCCL profiler plugin's link (gradscope/common/nccl_profile_link.h) ------------------------------

GS_EXPORT int gradscope_agent_nccl_profile_v1(const gradscope::NcclProfileRecordV1* record) {
  return ncclProfileReceived(record);
}
