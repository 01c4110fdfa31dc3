#pragma once

// GPU timing of NCCL calls with CUDA events: the GpuTimer of recorder.h.
//
// Design. Every CUDA context that a timed stream belongs to is a *domain*: a fixed pool of event pairs
// created when the domain is first seen, a private non-blocking stream, and a ring of reference events.
// A call claims a pair (a CAS on the slot a round-robin cursor points at), records the start event on
// the job's stream just before the NCCL call and the end event just after it, and carries the pair in
// its record (CallEvent::gpu_slot). The background thread asks query() until the end event has
// completed, then converts both events to Unix-epoch ns through the reference that was current when
// the call was made: a reference is recorded on the private stream and synchronised between two reads
// of the host clock, so epoch(e) = host time of the reference + cuEventElapsedTime(reference, e).
// poll() renews the reference every 200 ms (Options): elapsed time is a float of milliseconds, so its
// resolution is ~120 ns a second after the reference but ~0.2 ms an hour after. The job's streams are never
// synchronised, only the private one.
//
// Groups. NCCL launches a group's work at the outermost ncclGroupEnd, so the group is timed there: one
// pair per distinct stream used in the group, recorded around the real ncclGroupEnd. The first pair
// leads, the others are its siblings; every member's record carries the leader and is given the union
// of the pairs' spans. A pair returns to the pool when the last record carrying it is released.
//
// Bounds and failures. kMaxDomains contexts, Options::pairs_per_domain pairs each. With no pair free
// the call is host-timed and counted as a "gpu_timing" drop. A stream that is capturing a CUDA graph is
// never recorded on (the record would become a graph node): the call is host-timed and flagged. A CUDA
// error while setting a domain up leaves that context's calls host-timed (the caller logs it once);
// an error while recording or querying makes that call host-timed ("gpu_timing" drop).
//
// CUPTI. With a CuptiTracer (useCupti) whose kernel records are on (always, or around a GPU step window with
// GRADSCOPE_CUPTI=windows), the pair's id (correlationOf) is pushed as CUPTI's external correlation id
// around the real NCCL call (enterCall/leaveCall), and query() prefers the span of the kernels CUPTI
// reports for it (exact, and from the kernels themselves rather than the events around
// them). CUPTI hands a kernel's record over some time after the kernel ran, so the span is read from
// the first flush of its buffers that began Options::cupti_settle_ns after the events were seen complete
// (half the agent's flush interval: records later than that would be missed). So a span may be known
// settleNs() after the call's work ran (the recorder waits that long at the end).
//
// Which events. A timing event costs ~1.4 us of host time to record, one without timing ~0.2 us (H100,
// docs/benchmarks.md). With the kernel records on throughout and none dropped yet, CUPTI gives every span,
// so a call records no timing event: one event without timing (the pair's `done`) after the call tells
// the background thread that its work completed. Such a call whose kernels CUPTI has not reported by then
// is host-timed: a "gpu_timing" drop when CUPTI dropped records meanwhile, else Status::NoKernel (NCCL
// launched nothing). From CUPTI's first dropped record on, and with the records on inside windows only,
// calls record the timing pair, whose span is the fallback. spanSource() says which applies now.
//
// Threads. start/stop/startGroup/stopGroup: any job thread, lock-free, no allocation. domainOf: any
// thread, serialised by a mutex (first sight of a stream). query/release/poll: the background thread
// only, which keeps the context of the domain it works on current and uses the relaxed capture mode,
// so that a job thread's graph capture neither forbids nor is invalidated by its calls.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "core/clock.h"
#include "core/cuda_driver.h"
#include "core/cupti_tracer.h"
#include "core/recorder.h"

namespace gradscope::agent {

class CudaEventTimer final : public GpuTimer {
 public:
  static constexpr int kMaxDomains = 8;
  static constexpr std::uint32_t kReferences = 256;  // 51 s of history at one reference per 200 ms
  static constexpr int kMaxGroupStreams = 8;
  // A renewed reference is kept only when the host clock reads around it are this close: half of it
  // is the reference's uncertainty.
  static constexpr std::int64_t kReferenceWidthNs = 250'000;

  // domainOf() results other than a domain index.
  static constexpr int kNoDomain = -1;     // not timed on the GPU
  static constexpr int kDomainLater = -2;  // ask again at a later call (the stream was capturing)

  struct Options {
    std::uint32_t pairs_per_domain = 4096;
    std::int64_t reference_interval_ns = 200'000'000;  // how often poll() renews a domain's reference
    // The host clock read around each reference (Unix-epoch ns). Tests give one that the scheduler
    // cannot stretch past kReferenceWidthNs.
    std::int64_t (*host_clock_ns)() = realtimeNs;
    // How long after a call's events were seen complete CUPTI's records of its kernels are waited for.
    std::int64_t cupti_settle_ns = 25'000'000;
  };

  // `driver` must stay valid as long as the timer.
  explicit CudaEventTimer(const cuda::Driver& driver) : CudaEventTimer(driver, Options{}) {}
  CudaEventTimer(const cuda::Driver& driver, Options options);
  // Destroys the events and streams. Only when no call is being timed and no record is pending.
  ~CudaEventTimer() override;
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;

  // The domain of the stream's context, set up on first sight. On kNoDomain, `error` says why (the
  // first time a context fails only).
  int domainOf(cuda::CUstream stream, std::string& error);

  // Hot path. Claims a pair in `domain` and records its start event on `stream`. Returns the value for
  // CallEvent::gpu_slot, or 0 when the call is to be host-timed (`captured` is set when the stream was
  // capturing a CUDA graph). `nccl_kernels`: NCCL runs the call as kernels of its own, which CUPTI's spans
  // are made of; not so on a communicator of one rank (NCCL copies, or runs a kernel of another name), whose
  // calls record the timing pair.
  std::uint32_t start(int domain, cuda::CUstream stream, bool& captured, bool nccl_kernels = true);
  // Records the end event of a start() that returned `gpu_slot` != 0, on the same stream.
  void stop(std::uint32_t gpu_slot, cuda::CUstream stream);
  // Hot path, around the real NCCL call (or the group's real ncclGroupEnd, with the leader): the call's
  // CUPTI external correlation, when CUPTI is in use, its kernel records are on (throughout, or inside a
  // GPU step window with GRADSCOPE_CUPTI=windows) and the call is GPU-timed. Returns whether it pushed one:
  // only then does query() wait for CUPTI's span, and leaveCall pops it.
  bool enterCall(std::uint32_t gpu_slot) {
    if (gpu_slot == 0) return false;
    const bool correlated = cupti_ != nullptr && cupti_->correlating();
    pair(gpu_slot - 1).correlated = correlated;
    if (correlated) cupti_->push(correlationOf(gpu_slot - 1));
    return correlated;
  }
  void leaveCall(bool correlated) const {
    if (correlated) cupti_->pop();
  }
  // Before any call is timed (and any domain is set up). The timer does not own the tracer.
  void useCupti(CuptiTracer* tracer) {
    cupti_ = tracer;
    untimed_ = tracer != nullptr && tracer->spansThroughout();
  }
  // Why CUPTI does not time the calls (no libcupti, GRADSCOPE_CUPTI=0, ...), for spanSource().
  void noteCuptiOff(std::string why) { cupti_off_ = std::move(why); }
  // Where the calls' GPU spans come from now: "cupti" (kernel records; events without timing for completion),
  // "cupti+events" (CUPTI's, with timing events as the fallback: records inside windows only, or after CUPTI
  // dropped some), or "events" (no CUPTI).
  SpanSource spanSource() const override;  // not a hot path: may take the tracer's lock
  // CUPTI's external id of a claimed pair: its generation (bumped at each claim) and index.
  std::uint64_t correlationOf(std::uint32_t slot) const {
    return (static_cast<std::uint64_t>(pair(slot).generation) << 32) | slot;
  }
  // Around the real call (or group) of a start() that found its stream capturing: the graph nodes the
  // call creates meanwhile stand for it, so that its replays are traced (cupti_tracer.h). beginCapture
  // returns 0 when they are not (no CUPTI, or no graph callbacks); endCapture takes what it returned.
  std::uint32_t beginCapture() const { return cupti_ != nullptr ? cupti_->beginCapture() : 0; }
  void endCapture(std::uint32_t capture, std::span<const CuptiTracer::CapturedCall> calls) const {
    if (capture != 0) cupti_->endCapture(capture, calls);
  }
  // Gives the pair of a start() back instead, when the call turns out not to be timed on the GPU.
  void abandon(std::uint32_t gpu_slot) { free(gpu_slot - 1); }

  // A group's timing: startGroup() before the real ncclGroupEnd with the distinct streams used in the
  // group (domains[i] from domainOf; streams outside a domain are skipped), stopGroup() after it with
  // the number of records that will carry `leader` (0: none, the pairs are given back and leader is 0).
  struct Group {
    std::uint32_t leader = 0;  // CallEvent::gpu_slot of every member, 0: host-timed
    bool captured = false;     // a stream of the group was capturing: host-timed
    int count = 0;
    std::uint32_t ids[kMaxGroupStreams] = {};
    cuda::CUstream streams[kMaxGroupStreams] = {};
  };
  void startGroup(Group& group, const int* domains, const cuda::CUstream* streams, int n,
                  bool nccl_kernels = true);
  void stopGroup(Group& group, std::int32_t members);

  // GpuTimer (background thread).
  Status query(std::uint32_t slot, std::int64_t& start_epoch_ns, std::int64_t& end_epoch_ns) override;
  void release(std::uint32_t slot) override;
  void poll() override;
  std::int64_t settleNs() const override { return cupti_ != nullptr ? options_.cupti_settle_ns : 0; }
  void takeGraphReplays(std::vector<ReplaySpan>& out, bool final) override {
    if (cupti_ != nullptr) cupti_->takeReplays(out, final);
  }
  // The tracer's sampled GPU windows (cupti_tracer.h), which poll() drives.
  void takeGpuActivity(std::vector<GpuActivitySpan>& out, bool final) override {
    if (cupti_ != nullptr) cupti_->takeActivity(out, final);
  }

  // Pairs not in the pool now (claimed, or carried by records not yet released). For tests.
  std::uint32_t pairsInUse() const;

 private:
  enum : std::uint32_t { kFree = 0, kBusy = 1 };
  struct Pair {
    std::atomic<std::uint32_t> state{kFree};
    std::atomic<std::int32_t> refs{0};  // records still to be released
    cuda::CUevent start = nullptr;      // timing events
    cuda::CUevent end = nullptr;
    cuda::CUevent done = nullptr;  // without timing: the call's completion when CUPTI gives the span
    bool untimed = false;          // this claim records `done` only (Which events, above)
    std::uint32_t reference = 0;   // generation of the domain's reference when the start was recorded
    bool failed = false;
    bool resolved = false;           // start_ns/end_ns hold the events' span (set by query)
    bool settled = false;            // start_ns/end_ns are final (CUPTI's span, or the events' one)
    std::uint32_t generation = 0;    // claims of this pair so far
    std::uint64_t cupti_drops = 0;   // CUPTI's drop count when claimed
    bool correlated = false;         // enterCall pushed its id: CUPTI may give its span
    std::int64_t cupti_seen_ns = 0;  // monotonic time at which the events were seen complete
    std::int64_t start_ns = 0, end_ns = 0;
    int siblings = 0;
    std::uint32_t sibling[kMaxGroupStreams - 1] = {};
  };
  struct Reference {
    cuda::CUevent event = nullptr;
    std::int64_t host_ns = 0;
    std::uint32_t generation = ~0u;  // ~0u: being renewed or never recorded
  };
  struct Domain {
    explicit Domain(std::uint32_t pair_count) : pairs(new Pair[pair_count]) {}
    cuda::CUcontext context = nullptr;
    cuda::CUstream stream = nullptr;  // the timer's own
    std::unique_ptr<Pair[]> pairs;
    std::atomic<std::uint32_t> cursor{0};
    Reference references[kReferences];
    std::atomic<std::uint32_t> current{0};  // generation of the newest reference
    std::int64_t referenced_at_ns = 0;      // monotonic time of the newest reference (background thread)
  };

  Domain& domainOfSlot(std::uint32_t slot) const {
    return *domains_[slot / options_.pairs_per_domain].load(std::memory_order_acquire);
  }
  Pair& pair(std::uint32_t slot) const { return domainOfSlot(slot).pairs[slot % options_.pairs_per_domain]; }
  // Whether a call claimed now records `done` only: CUPTI times every call and has dropped nothing so far.
  bool untimedNow() const { return untimed_ && cupti_->drops() == 0; }
  // A free pair of `domain`, marked busy, recording `done` only when `untimed`; its id in `slot`. nullptr
  // when none is free (counted).
  Pair* claim(int domain, bool untimed, std::uint32_t& slot);
  void free(std::uint32_t slot);
  bool setUp(Domain& domain, std::string& error);
  void destroy(Domain& domain);
  bool recordReference(Domain& domain, Reference& reference, bool first);
  void useContextOf(const Domain& domain);

  const cuda::Driver& driver_;
  const Options options_;
  std::mutex mutex_;  // domainOf
  std::atomic<int> domain_count_{0};
  std::atomic<Domain*> domains_[kMaxDomains] = {};
  cuda::CUcontext failed_contexts_[kMaxDomains] = {};  // reported once each
  // Background thread: the context it made current and whether it switched to the relaxed capture mode.
  cuda::CUcontext background_context_ = nullptr;
  bool background_relaxed_ = false;
  CuptiTracer* cupti_ = nullptr;
  bool untimed_ = false;  // CUPTI's kernel records are on throughout (useCupti)
  std::string cupti_off_;
};

}  // namespace gradscope::agent
