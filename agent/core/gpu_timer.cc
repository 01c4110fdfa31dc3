#include "core/gpu_timer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/clock.h"
#include "gradscope/common/job_environment.h"

namespace gradscope::agent {
namespace {

using cuda::CUresult;

// Tries on the slots after the cursor before a call gives up on GPU timing. The cursor goes round in
// the order pairs are released (records complete in order per stream), so the first try almost always
// succeeds; the bound keeps an exhausted pool cheap.
constexpr int kClaimTries = 8;

// Switches the calling thread to `context` for the lifetime of the object, then restores its own.
class ContextScope {
 public:
  ContextScope(const cuda::Driver& driver, cuda::CUcontext context) : driver_(driver) {
    if (driver_.ctxGetCurrent(&previous_) != cuda::CUDA_SUCCESS) previous_ = nullptr;
    switched_ = previous_ != context && driver_.ctxSetCurrent(context) == cuda::CUDA_SUCCESS;
  }
  ~ContextScope() {
    if (switched_) driver_.ctxSetCurrent(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const cuda::Driver& driver_;
  cuda::CUcontext previous_ = nullptr;
  bool switched_ = false;
};

// The relaxed capture mode for the calling thread while the object lives: the set-up calls (event and
// stream creation, one synchronisation of the private stream) are "potentially unsafe" calls that a
// global-mode capture on another thread would forbid, and that the job's capture must not see.
class RelaxedCaptureScope {
 public:
  explicit RelaxedCaptureScope(const cuda::Driver& driver) : driver_(driver) {
    saved_ = driver_.threadExchangeStreamCaptureMode(&mode_) == cuda::CUDA_SUCCESS;
  }
  ~RelaxedCaptureScope() {
    if (saved_) driver_.threadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  const cuda::Driver& driver_;
  cuda::CUstreamCaptureMode mode_ = cuda::CU_STREAM_CAPTURE_MODE_RELAXED;
  bool saved_ = false;
};

// True when nothing may be recorded on `stream` now; `captured` is set when that is because the stream
// is capturing a CUDA graph.
bool capturing(const cuda::Driver& driver, cuda::CUstream stream, bool& captured) {
  cuda::CUstreamCaptureStatus status = cuda::CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult rc = driver.streamIsCapturing(stream, &status);
  // An error (e.g. the legacy stream while another stream captures in global mode) also means: do not
  // record on it now.
  if (rc != cuda::CUDA_SUCCESS) return true;
  captured = status != cuda::CU_STREAM_CAPTURE_STATUS_NONE;
  return captured;
}

}  // namespace

CudaEventTimer::CudaEventTimer(const cuda::Driver& driver, Options options)
    : driver_(driver), options_(options) {}

CudaEventTimer::~CudaEventTimer() {
  const int n = domain_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Domain* domain = domains_[i].load(std::memory_order_relaxed);
    destroy(*domain);
    delete domain;
  }
}

int CudaEventTimer::domainOf(cuda::CUstream stream, std::string& error) {
  const std::lock_guard lock(mutex_);
  cuda::CUcontext context = nullptr;
  if (const CUresult rc = driver_.streamGetCtx(stream, &context);
      rc != cuda::CUDA_SUCCESS || context == nullptr) {
    error = fmt::format("cuStreamGetCtx failed (CUresult {})", static_cast<int>(rc));
    return kNoDomain;
  }
  const int n = domain_count_.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i)
    if (domains_[i].load(std::memory_order_relaxed)->context == context) return i;
  for (const cuda::CUcontext failed : failed_contexts_)
    if (failed == context) return kNoDomain;  // reported already
  bool captured = false;
  if (capturing(driver_, stream, captured)) return kDomainLater;
  if (n == kMaxDomains) {
    error = fmt::format("more than {} CUDA contexts; calls on the others are timed on the host", kMaxDomains);
  } else {
    auto domain = std::make_unique<Domain>(options_.pairs_per_domain);
    domain->context = context;
    if (setUp(*domain, error)) {
      domains_[n].store(domain.release(), std::memory_order_release);
      domain_count_.store(n + 1, std::memory_order_release);
      return n;
    }
    destroy(*domain);
  }
  for (cuda::CUcontext& failed : failed_contexts_)
    if (failed == nullptr) {
      failed = context;
      break;
    }
  return kNoDomain;
}

bool CudaEventTimer::setUp(Domain& domain, std::string& error) {
  const RelaxedCaptureScope relaxed(driver_);
  const ContextScope scope(driver_, domain.context);
  auto failed = [&](const char* what, CUresult rc) {
    error = fmt::format("{} failed (CUresult {})", what, static_cast<int>(rc));
    return false;
  };
  if (const CUresult rc = driver_.streamCreate(&domain.stream, cuda::kStreamNonBlocking);
      rc != cuda::CUDA_SUCCESS)
    return failed("cuStreamCreate", rc);
  for (std::uint32_t i = 0; i < options_.pairs_per_domain; ++i) {
    Pair& pair = domain.pairs[i];
    if (const CUresult rc = driver_.eventCreate(&pair.start, cuda::kEventDefault); rc != cuda::CUDA_SUCCESS)
      return failed("cuEventCreate", rc);
    if (const CUresult rc = driver_.eventCreate(&pair.end, cuda::kEventDefault); rc != cuda::CUDA_SUCCESS)
      return failed("cuEventCreate", rc);
    if (untimed_) {
      if (const CUresult rc = driver_.eventCreate(&pair.done, cuda::kEventDisableTiming);
          rc != cuda::CUDA_SUCCESS)
        return failed("cuEventCreate", rc);
    }
  }
  for (Reference& reference : domain.references)
    if (const CUresult rc = driver_.eventCreate(&reference.event, cuda::kEventDefault);
        rc != cuda::CUDA_SUCCESS)
      return failed("cuEventCreate", rc);
  if (!recordReference(domain, domain.references[0], true)) {
    error = "recording the reference event on the agent's own stream failed";
    return false;
  }
  domain.references[0].generation = 0;
  domain.current.store(0, std::memory_order_release);
  domain.referenced_at_ns = monotonicNs();
  return true;
}

void CudaEventTimer::destroy(Domain& domain) {
  const ContextScope scope(driver_, domain.context);
  for (std::uint32_t i = 0; i < options_.pairs_per_domain; ++i) {
    if (domain.pairs[i].start != nullptr) driver_.eventDestroy(domain.pairs[i].start);
    if (domain.pairs[i].end != nullptr) driver_.eventDestroy(domain.pairs[i].end);
    if (domain.pairs[i].done != nullptr) driver_.eventDestroy(domain.pairs[i].done);
  }
  for (Reference& reference : domain.references)
    if (reference.event != nullptr) driver_.eventDestroy(reference.event);
  if (domain.stream != nullptr) driver_.streamDestroy(domain.stream);
}

bool CudaEventTimer::recordReference(Domain& domain, Reference& reference, bool first) {
  // The first reference takes what it gets after a few tries; later ones wait for a tight pair of reads
  // (the previous reference stays in use meanwhile).
  const int tries = first ? 5 : 1;
  for (int i = 0; i < tries; ++i) {
    const std::int64_t before = options_.host_clock_ns();
    if (driver_.eventRecord(reference.event, domain.stream) != cuda::CUDA_SUCCESS) return false;
    if (driver_.eventSynchronize(reference.event) != cuda::CUDA_SUCCESS) return false;
    const std::int64_t width = options_.host_clock_ns() - before;
    if (width <= kReferenceWidthNs || (first && i + 1 == tries)) {
      reference.host_ns = before + width / 2;
      return true;
    }
  }
  return false;
}

CudaEventTimer::Pair* CudaEventTimer::claim(int domain_index, bool untimed, std::uint32_t& slot) {
  Domain& domain = *domains_[domain_index].load(std::memory_order_acquire);
  const std::uint32_t pairs = options_.pairs_per_domain;
  for (int i = 0; i < kClaimTries; ++i) {
    const std::uint32_t index = domain.cursor.fetch_add(1, std::memory_order_relaxed) % pairs;
    Pair& pair = domain.pairs[index];
    std::uint32_t expected = kFree;
    if (pair.state.compare_exchange_strong(expected, kBusy, std::memory_order_acquire,
                                           std::memory_order_relaxed)) {
      pair.refs.store(1, std::memory_order_relaxed);
      pair.reference = domain.current.load(std::memory_order_acquire);
      pair.failed = false;
      pair.resolved = false;
      pair.settled = false;
      ++pair.generation;
      pair.cupti_drops = cupti_ != nullptr ? cupti_->drops() : 0;
      pair.untimed = untimed;
      pair.cupti_seen_ns = 0;
      pair.siblings = 0;
      slot = static_cast<std::uint32_t>(domain_index) * pairs + index;
      return &pair;
    }
  }
  countDrop(DropKind::GpuTiming);
  return nullptr;
}

void CudaEventTimer::free(std::uint32_t slot) {
  Pair& pair = this->pair(slot);
  for (int i = 0; i < pair.siblings; ++i)
    this->pair(pair.sibling[i]).state.store(kFree, std::memory_order_release);
  pair.state.store(kFree, std::memory_order_release);
}

std::uint32_t CudaEventTimer::start(int domain, cuda::CUstream stream, bool& captured, bool nccl_kernels) {
  if (capturing(driver_, stream, captured)) return 0;
  std::uint32_t slot = 0;
  const bool untimed = nccl_kernels && untimedNow();
  Pair* pair = claim(domain, untimed, slot);
  if (pair == nullptr) return 0;
  if (!untimed && driver_.eventRecord(pair->start, stream) != cuda::CUDA_SUCCESS) {
    countDrop(DropKind::GpuTiming);
    free(slot);
    return 0;
  }
  return slot + 1;
}

void CudaEventTimer::stop(std::uint32_t gpu_slot, cuda::CUstream stream) {
  Pair& pair = this->pair(gpu_slot - 1);
  if (driver_.eventRecord(pair.untimed ? pair.done : pair.end, stream) != cuda::CUDA_SUCCESS)
    pair.failed = true;
}

void CudaEventTimer::startGroup(Group& group, const int* domains, const cuda::CUstream* streams, int n,
                                bool nccl_kernels) {
  group = Group{};
  for (int i = 0; i < n; ++i)
    if (domains[i] >= 0 && capturing(driver_, streams[i], group.captured)) return;
  const bool untimed = nccl_kernels && untimedNow();  // the same for every pair of the group
  for (int i = 0; i < n && group.count < kMaxGroupStreams; ++i) {
    if (domains[i] < 0) continue;
    std::uint32_t slot = 0;
    Pair* pair = claim(domains[i], untimed, slot);
    if (pair == nullptr) continue;
    if (!untimed && driver_.eventRecord(pair->start, streams[i]) != cuda::CUDA_SUCCESS) {
      countDrop(DropKind::GpuTiming);
      free(slot);
      continue;
    }
    if (group.count > 0) {
      Pair& leader = this->pair(group.ids[0]);
      leader.sibling[leader.siblings++] = slot;
    }
    group.ids[group.count] = slot;
    group.streams[group.count] = streams[i];
    ++group.count;
  }
  if (group.count > 0) group.leader = group.ids[0] + 1;
}

void CudaEventTimer::stopGroup(Group& group, std::int32_t members) {
  if (group.count == 0) return;
  Pair& leader = pair(group.ids[0]);
  for (int i = 0; i < group.count; ++i) {
    const Pair& member = pair(group.ids[i]);
    if (driver_.eventRecord(member.untimed ? member.done : member.end, group.streams[i]) !=
        cuda::CUDA_SUCCESS)
      leader.failed = true;
  }
  if (members <= 0) {
    free(group.ids[0]);
    group.leader = 0;
    return;
  }
  leader.refs.store(members, std::memory_order_relaxed);
}

void CudaEventTimer::useContextOf(const Domain& domain) {
  if (!background_relaxed_) {
    cuda::CUstreamCaptureMode mode = cuda::CU_STREAM_CAPTURE_MODE_RELAXED;
    driver_.threadExchangeStreamCaptureMode(&mode);
    background_relaxed_ = true;
  }
  if (background_context_ != domain.context && driver_.ctxSetCurrent(domain.context) == cuda::CUDA_SUCCESS)
    background_context_ = domain.context;
}

GpuTimer::Status CudaEventTimer::query(std::uint32_t slot, std::int64_t& start_epoch_ns,
                                       std::int64_t& end_epoch_ns) {
  Pair& leader = pair(slot);
  if (!leader.resolved) {
    if (leader.failed) return Status::Failed;
    std::int64_t first = INT64_MAX, last = INT64_MIN;
    for (int i = 0; i <= leader.siblings; ++i) {
      const std::uint32_t id = i == 0 ? slot : leader.sibling[i - 1];
      Domain& domain = domainOfSlot(id);
      const Pair& pair = this->pair(id);
      useContextOf(domain);
      const CUresult ready = driver_.eventQuery(pair.untimed ? pair.done : pair.end);
      if (ready == cuda::CUDA_ERROR_NOT_READY) return Status::Pending;
      if (pair.untimed) {  // complete; the span is CUPTI's alone
        if (ready == cuda::CUDA_SUCCESS) continue;
        leader.failed = true;
        return Status::Failed;
      }
      const Reference& reference = domain.references[pair.reference % kReferences];
      float start_ms = 0, end_ms = 0;
      if (ready != cuda::CUDA_SUCCESS || reference.generation != pair.reference ||
          driver_.eventElapsedTime(&start_ms, reference.event, pair.start) != cuda::CUDA_SUCCESS ||
          driver_.eventElapsedTime(&end_ms, reference.event, pair.end) != cuda::CUDA_SUCCESS) {
        leader.failed = true;
        return Status::Failed;
      }
      first = std::min(first, reference.host_ns + static_cast<std::int64_t>(
                                                      std::llround(static_cast<double>(start_ms) * 1e6)));
      last = std::max(last, reference.host_ns +
                                static_cast<std::int64_t>(std::llround(static_cast<double>(end_ms) * 1e6)));
    }
    leader.start_ns = leader.untimed ? 0 : first;
    leader.end_ns = leader.untimed ? 0 : last;
    leader.resolved = true;
    leader.settled = cupti_ == nullptr || !leader.correlated;
    if (!leader.settled) leader.cupti_seen_ns = monotonicNs();
  }
  if (!leader.settled) {
    // CUPTI hands a kernel's record over some time after the kernel (a buffer goes once all its records
    // are complete), so a flush may bring a group's first kernels and a later one its last: the span is
    // read from the first flush that began cupti_settle_ns after the events were seen complete.
    const std::int64_t waited = cupti_->lastFlushBeganNs() - leader.cupti_seen_ns;
    if (waited <= 0 || waited < options_.cupti_settle_ns) return Status::Pending;
    std::int64_t start = 0, end = 0;
    // Dropped records: a partial span would be wrong, the events' is not. No kernel: the events' too.
    // Without timing events there is nothing to fall back on: the call is host-timed.
    const bool complete = cupti_->drops() == leader.cupti_drops;
    if (complete && cupti_->span(correlationOf(slot), start, end)) {
      leader.start_ns = start;
      leader.end_ns = end;
    } else if (leader.untimed) {
      leader.failed = true;
      return complete ? Status::NoKernel : Status::Failed;
    }
    leader.settled = true;
  }
  start_epoch_ns = leader.start_ns;
  end_epoch_ns = leader.end_ns;
  return Status::Ready;
}

void CudaEventTimer::release(std::uint32_t slot) {
  if (pair(slot).refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (cupti_ != nullptr) cupti_->forget(correlationOf(slot));
  free(slot);
}

void CudaEventTimer::poll() {
  if (cupti_ != nullptr) {
    cupti_->onPoll(realtimeNs());
    cupti_->flush();
  }
  const int n = domain_count_.load(std::memory_order_acquire);
  const std::int64_t now = monotonicNs();
  for (int i = 0; i < n; ++i) {
    Domain& domain = *domains_[i].load(std::memory_order_acquire);
    if (now - domain.referenced_at_ns < options_.reference_interval_ns) continue;
    domain.referenced_at_ns = now;
    useContextOf(domain);
    const std::uint32_t generation = domain.current.load(std::memory_order_relaxed) + 1;
    Reference& reference = domain.references[generation % kReferences];
    // Pending calls that still refer to the reference being replaced will fail rather than read it.
    reference.generation = ~0u;
    if (!recordReference(domain, reference, false)) continue;
    reference.generation = generation;
    domain.current.store(generation, std::memory_order_release);
  }
}

GpuTimer::SpanSource CudaEventTimer::spanSource() const {
  if (cupti_ == nullptr) return {"events", cupti_off_};
  std::vector<std::string> notes;
  if (!untimedNow())
    notes.push_back(
        untimed_ ? std::string("CUPTI dropped kernel records; timing events since")
                 : fmt::format("CUPTI's kernel records are on inside the GPU windows only ({}=windows)",
                               env::kCupti));
  if (!cupti_->tracesGraphs()) {
    notes.emplace_back("CUDA graph replays are not traced");
  } else if (const KernelSpans::GraphCounts graphs = cupti_->graphCounts();
             graphs.nodes + graphs.kernels + graphs.other_kernels > 0) {
    // What graph tracing saw: a replay needs a captured call's node and NCCL kernels launched by it.
    notes.push_back(
        fmt::format("graph replays: {} nodes of captured calls, {} cloned; {} NCCL kernels of "
                    "graphs, {} of those nodes; {} other kernels of graphs",
                    graphs.nodes, graphs.clones, graphs.kernels, graphs.matched, graphs.other_kernels));
  }
  return {untimedNow() ? "cupti" : "cupti+events", fmt::format("{}", fmt::join(notes, "; "))};
}

std::uint32_t CudaEventTimer::pairsInUse() const {
  std::uint32_t busy = 0;
  const int n = domain_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    const Domain& domain = *domains_[i].load(std::memory_order_acquire);
    for (std::uint32_t p = 0; p < options_.pairs_per_domain; ++p)
      busy += domain.pairs[p].state.load(std::memory_order_relaxed) == kBusy ? 1u : 0u;
  }
  return busy;
}

}  // namespace gradscope::agent
