#include "core/cupti_tracer.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/clock.h"
#include "core/recorder.h"

namespace gradscope::agent {
namespace cupti {

// Every function of GS_CUPTI_FUNCTIONS from `handle`; false, with the missing one in `why`.
bool resolve(void* handle, Library& library, std::string& why) {
#define GS_CUPTI_LOAD(MEMBER, SYMBOL, PARAMS)                                       \
  library.MEMBER = reinterpret_cast<CUptiResult(*) PARAMS>(dlsym(handle, #SYMBOL)); \
  if (library.MEMBER == nullptr) {                                                  \
    why = fmt::format("libcupti has no {}", #SYMBOL);                               \
    return false;                                                                   \
  }
  GS_CUPTI_FUNCTIONS(GS_CUPTI_LOAD)
#undef GS_CUPTI_LOAD
  return true;
}

}  // namespace cupti

namespace {

using cupti::CUptiResult;

// CUPTI's callbacks carry no user data: they find the one tracer here.
std::atomic<CuptiTracer*> g_tracer{nullptr};

}  // namespace

// ---- KernelSpans ------------------------------------------------------------------------------------------

KernelSpans::KernelSpans()
    : correlations_(new Correlation[kCorrelations]),
      spans_(new Span[kSpans]),
      graph_nodes_(new GraphNode[kGraphNodes]) {
  replays_.reserve(kReplays);
}

void KernelSpans::addExternal(std::uint32_t correlation, std::uint64_t id) {
  if (id == 0) return;
  correlations_[correlation % kCorrelations] = {correlation, id};
  // A kernel record may come before its correlation (another buffer delivered first).
  for (std::uint32_t i = 0; waiting_count_ > 0 && i < kWaiting; ++i)
    if (waiting_[i].correlation == correlation) {
      extend(id, waiting_[i].start, waiting_[i].end);
      waiting_[i].correlation = 0;
      --waiting_count_;
    }
}

void KernelSpans::addKernel(std::uint32_t correlation, std::uint64_t start, std::uint64_t end) {
  if (correlation == 0) return;
  const Correlation& known = correlations_[correlation % kCorrelations];
  if (known.id != 0 && known.correlation == correlation) {
    extend(known.id, start, end);
    return;
  }
  // Waits for its correlation in a ring: the oldest waiting kernel gives way.
  Kernel& slot = waiting_[waiting_next_];
  waiting_next_ = (waiting_next_ + 1) % kWaiting;
  if (slot.correlation == 0) ++waiting_count_;
  slot = {correlation, start, end};
}

void KernelSpans::extend(std::uint64_t id, std::uint64_t start, std::uint64_t end) {
  Span& span = spans_[id % kSpans];
  if (span.id != id) {
    span = {id, start, end};
    return;
  }
  span.start = std::min(span.start, start);
  span.end = std::max(span.end, end);
}

bool KernelSpans::span(std::uint64_t id, std::uint64_t& start, std::uint64_t& end) const {
  const Span& span = spans_[id % kSpans];
  if (id == 0 || span.id != id) return false;
  start = span.start;
  end = span.end;
  return true;
}

void KernelSpans::forget(std::uint64_t id) {
  Span& span = spans_[id % kSpans];
  if (span.id == id) span.id = 0;
}

void KernelSpans::addGraphNode(std::uint64_t node, std::uint32_t capture) {
  if (node == 0 || capture == 0) return;
  graph_nodes_[node % kGraphNodes] = {node, capture};
  ++graph_counts_.nodes;
}

void KernelSpans::cloneGraphNode(std::uint64_t original, std::uint64_t clone) {
  const GraphNode& known = graph_nodes_[original % kGraphNodes];
  if (original == 0 || known.node != original) return;
  addGraphNode(clone, known.capture);
  --graph_counts_.nodes;
  ++graph_counts_.clones;
}

bool KernelSpans::addGraphKernel(std::uint64_t node, std::uint32_t launch, std::uint64_t start,
                                 std::uint64_t end, std::uint64_t flush) {
  const GraphNode& known = graph_nodes_[node % kGraphNodes];
  ++graph_counts_.kernels;
  if (node == 0 || known.node != node) return false;
  ++graph_counts_.matched;
  // The kernels of one replay arrive together, so the newest replays are searched first.
  for (auto it = replays_.rbegin(); it != replays_.rend(); ++it)
    if (it->capture == known.capture && it->launch == launch) {
      it->start = std::min(it->start, start);
      it->end = std::max(it->end, end);
      it->flush = flush;
      return true;
    }
  if (replays_.size() == kReplays) {
    ++replay_drops_;
    return true;
  }
  replays_.push_back({known.capture, launch, start, end, flush});
  return true;
}

void KernelSpans::takeReplays(std::uint64_t last_flush, std::vector<Replay>& out) {
  const std::size_t first = out.size();
  std::size_t kept = 0;
  for (const Replay& replay : replays_) {
    if (replay.flush <= last_flush) out.push_back(replay);
    else replays_[kept++] = replay;
  }
  replays_.resize(kept);
  // Launch order: correlation ids grow with every CUDA call of the process.
  std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                   [](const Replay& a, const Replay& b) { return a.launch < b.launch; });
}

// ---- WindowKernels ----------------------------------------------------------------------------------------

WindowKernels::WindowKernels() : ranges_(new RangeOf[kRangeCorrelations]) {}

void WindowKernels::addRange(std::uint32_t correlation, std::uint32_t range) {
  ranges_[correlation % kRangeCorrelations] = {correlation, range};
}

bool WindowKernels::open(std::uint64_t at) {
  if (isOpen() || windows_.size() >= kMaxWindows) return false;
  Window& window = windows_.emplace_back();
  window.open = at;
  return true;
}

void WindowKernels::close(std::uint64_t at, std::uint64_t flush) {
  if (!isOpen()) return;
  windows_.back().close = std::max(at, windows_.back().open);
  windows_.back().closed_in_flush = flush;
}

void WindowKernels::addKernel(std::uint64_t start, std::uint64_t end, bool nccl, std::uint32_t correlation) {
  // The newest window the kernel overlaps (kernels arrive in bursts of recent ones): one that was running
  // when the window opened belongs to it too, as the first sampled step's span may hold part of it.
  for (auto it = windows_.rbegin(); it != windows_.rend(); ++it) {
    if (std::max(start, end) < it->open) continue;
    if (start >= it->close) return;
    if (kernels_ >= kMaxKernels) {
      ++drops_;
      return;
    }
    it->kernels.push_back({start, std::max(start, end), correlation, nccl});
    ++kernels_;
    return;
  }
}

void WindowKernels::take(std::uint64_t last_flush, std::vector<Row>& out) {
  std::size_t kept = 0;
  for (Window& window : windows_) {
    if (window.close == kOpen || window.closed_in_flush > last_flush) {
      if (&windows_[kept] != &window) windows_[kept] = std::move(window);  // (never onto itself)
      ++kept;
      continue;
    }
    out.push_back({storage::GpuActivityKind::Window, window.open, window.close, 0, 0});
    kernels_ -= window.kernels.size();
    // Each kernel's NVTX range, now that its window's records have all arrived (NCCL's kernels have none).
    std::vector<std::pair<std::uint32_t, Kernel>> keyed;  // (nccl ? UINT32_MAX : range, kernel)
    keyed.reserve(window.kernels.size());
    for (const Kernel& kernel : window.kernels) {
      const RangeOf& named = ranges_[kernel.correlation % kRangeCorrelations];
      const std::uint32_t range =
          kernel.correlation != 0 && named.correlation == kernel.correlation ? named.range : 0;
      keyed.emplace_back(kernel.nccl ? UINT32_MAX : range, kernel);
    }
    std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second.start < b.second.start;
    });
    // The unions of each kind (and range), in time order: an interval grows while the next kernel starts
    // inside it.
    for (std::size_t i = 0; i < keyed.size(); ++i) {
      const auto& [key, kernel] = keyed[i];
      if (i > 0 && keyed[i - 1].first == key && kernel.start <= out.back().end) {
        out.back().end = std::max(out.back().end, kernel.end);
        ++out.back().kernels;
      } else if (kernel.nccl) {
        out.push_back({storage::GpuActivityKind::Nccl, kernel.start, kernel.end, 1, 0});
      } else {
        out.push_back({storage::GpuActivityKind::Compute, kernel.start, kernel.end, 1, key});
      }
    }
  }
  windows_.resize(kept);
}

int parseActivityBuffer(const cupti::Library& library, std::uint8_t* buffer, std::size_t valid_bytes,
                        KernelSpans& spans, std::uint64_t flush, WindowKernels* windows) {
  int records = 0;
  cupti::CUpti_Activity* record = nullptr;
  while (library.activityGetNextRecord(buffer, valid_bytes, &record) == cupti::CUPTI_SUCCESS) {
    ++records;
    if (record->kind == cupti::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        record->kind == cupti::CUPTI_ACTIVITY_KIND_KERNEL) {
      cupti::KernelRecordHead kernel;
      std::memcpy(&kernel, record, sizeof kernel);
      // NCCL's kernels are ncclDevKernel_* (ncclKernel_* before 2.19); other kernels never carry our ids.
      const bool nccl = kernel.name != nullptr && std::strncmp(kernel.name, "nccl", 4) == 0;
      if (windows != nullptr) windows->addKernel(kernel.start, kernel.end, nccl, kernel.correlationId);
      if (!nccl) {
        if (kernel.graphNodeId != 0) spans.countOtherGraphKernel();
        continue;
      }
      if (kernel.graphNodeId != 0)
        spans.addGraphKernel(kernel.graphNodeId, kernel.correlationId, kernel.start, kernel.end, flush);
      else spans.addKernel(kernel.correlationId, kernel.start, kernel.end);
    } else if (record->kind == cupti::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
      cupti::CUpti_ActivityExternalCorrelation external;
      std::memcpy(&external, record, sizeof external);
      if (external.externalKind == cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
        spans.addExternal(external.correlationId, external.externalId);
      else if (external.externalKind == cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1 && windows != nullptr)
        windows->addRange(external.correlationId, static_cast<std::uint32_t>(external.externalId));
    }
  }
  return records;
}

// ---- CuptiTracer ------------------------------------------------------------------------------------------

CuptiTracer::CuptiTracer(const cupti::Library& library)
    : library_(library), pool_(new std::uint8_t[kBuffers * kBufferBytes + 8]) {}

CuptiTracer* CuptiTracer::start(std::string& why, bool spans) {
  if (g_tracer.load(std::memory_order_acquire) != nullptr) {
    why = "CUPTI is in use already";
    return nullptr;
  }
  // The loader's path first; then where the CUDA toolkit installs CUPTI, which is rarely on that path.
  void* handle = nullptr;
  for (const char* name :
       {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
        "/usr/local/cuda/lib64/libcupti.so.13"})
    if ((handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  if (handle == nullptr) {
    why.clear();  // no CUPTI here: the documented fallback, not worth a line
    return nullptr;
  }
  // The handle is kept (never dlclose'd): CUPTI's threads may call back until the process exits.
  cupti::Library library;
  if (!cupti::resolve(handle, library, why)) return nullptr;
  auto* tracer = new CuptiTracer(library);  // lives as long as the process: CUPTI may still call back
  tracer->spans_on_ = spans;
  if (!tracer->measureOffset()) {
    why = "cuptiGetTimestamp failed";
    return nullptr;
  }
  g_tracer.store(tracer, std::memory_order_release);
  auto failed = [&](const char* what, CUptiResult rc) -> CuptiTracer* {
    why = fmt::format("{} failed (CUptiResult {})", what, static_cast<int>(rc));
    library.activityDisable(cupti::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    library.activityDisable(cupti::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
    return nullptr;
  };
  if (const CUptiResult rc = library.activityRegisterCallbacks(&requestBuffer, &completeBuffer);
      rc != cupti::CUPTI_SUCCESS)
    return failed("cuptiActivityRegisterCallbacks", rc);
  if (const CUptiResult rc = library.activityEnable(cupti::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
      rc != cupti::CUPTI_SUCCESS)
    return failed("cuptiActivityEnable(EXTERNAL_CORRELATION)", rc);
  if (!spans) return tracer;  // kernel records while a window is open only; no calls to correlate
  if (const CUptiResult rc = library.activityEnable(cupti::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
      rc != cupti::CUPTI_SUCCESS)
    return failed("cuptiActivityEnable(CONCURRENT_KERNEL)", rc);
  // Without the graph-node callbacks (another subscriber has CUPTI's callback API) the calls' spans
  // still come from CUPTI; graph-captured calls then have no replays.
  std::string graphs_why;
  tracer->graphs_ = tracer->subscribeToGraphNodes(graphs_why);
  if (!tracer->graphs_)
    log("CUDA graph replays of NCCL calls are not traced ({}); other calls' spans are", graphs_why);
  return tracer;
}

bool CuptiTracer::subscribeToGraphNodes(std::string& why) {
  cupti::CUpti_SubscriberHandle subscriber = nullptr;
  if (const CUptiResult rc = library_.subscribe(&subscriber, &onCallback, this); rc != cupti::CUPTI_SUCCESS) {
    why = fmt::format("cuptiSubscribe failed (CUptiResult {})", static_cast<int>(rc));
    return false;
  }
  for (const cupti::CUpti_CallbackId cbid :
       {cupti::CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, cupti::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED})
    if (const CUptiResult rc = library_.enableCallback(1, subscriber, cupti::CUPTI_CB_DOMAIN_RESOURCE, cbid);
        rc != cupti::CUPTI_SUCCESS) {
      why = fmt::format("cuptiEnableCallback({}) failed (CUptiResult {})", cbid, static_cast<int>(rc));
      return false;
    }
  return true;
}

namespace {
// The capture the calling thread is recording (CuptiTracer::beginCapture), 0 when none.
thread_local std::uint32_t t_capture = 0;
}  // namespace

void CuptiTracer::onCallback(void* userdata, cupti::CUpti_CallbackDomain domain, cupti::CUpti_CallbackId cbid,
                             const void* data) {
  if (domain != cupti::CUPTI_CB_DOMAIN_RESOURCE || userdata == nullptr || data == nullptr) return;
  auto* tracer = static_cast<CuptiTracer*>(userdata);
  const auto* graph = static_cast<const cupti::CUpti_GraphData*>(
      static_cast<const cupti::CUpti_ResourceData*>(data)->resourceDescriptor);
  // Only kernel nodes have activity records; NCCL's captures also make host and event nodes, which would
  // only take places in the node table.
  if (graph == nullptr || graph->nodeType != cupti::kGraphKernelNode) return;
  if (cbid == cupti::CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED) {
    const std::uint32_t capture = t_capture;
    if (capture == 0) return;  // not made by an NCCL call being captured
    std::uint64_t node = 0;
    if (tracer->library_.getGraphNodeId(graph->node, &node) != cupti::CUPTI_SUCCESS) return;
    const std::lock_guard lock(tracer->mutex_);
    tracer->spans_.addGraphNode(node, capture);
  } else if (cbid == cupti::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) {
    std::uint64_t original = 0, clone = 0;
    if (tracer->library_.getGraphNodeId(graph->originalNode, &original) != cupti::CUPTI_SUCCESS ||
        tracer->library_.getGraphNodeId(graph->node, &clone) != cupti::CUPTI_SUCCESS)
      return;
    const std::lock_guard lock(tracer->mutex_);
    tracer->spans_.cloneGraphNode(original, clone);
  }
}

std::uint32_t CuptiTracer::beginCapture() {
  if (!graphs_) return 0;
  std::uint32_t capture = next_capture_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (capture == 0) capture = next_capture_.fetch_add(1, std::memory_order_relaxed) + 1;  // wrapped
  t_capture = capture;
  return capture;
}

void CuptiTracer::endCapture(std::uint32_t capture, std::span<const CapturedCall> calls) {
  t_capture = 0;
  if (capture == 0 || calls.empty()) return;
  const std::lock_guard lock(captures_mutex_);
  if (captures_.size() >= kMaxCaptures) {
    for (std::size_t i = 0; i < calls.size(); ++i) countDrop(DropKind::GraphCapture);
    return;
  }
  captures_[capture].assign(calls.begin(), calls.end());
}

KernelSpans::GraphCounts CuptiTracer::graphCounts() {
  const std::lock_guard lock(mutex_);
  return spans_.graphCounts();
}

void CuptiTracer::takeReplays(std::vector<ReplaySpan>& out, bool final) {
  if (!graphs_) return;
  taken_.clear();
  std::uint64_t drops = 0;
  {
    const std::lock_guard lock(mutex_);
    // A replay extended during the flush just finished may have kernels still to come.
    const std::uint64_t done = flushes_.load(std::memory_order_acquire);
    spans_.takeReplays(final ? UINT64_MAX : (done >= 2 ? done - 2 : 0), taken_);
    drops = spans_.replayDrops() - replay_drops_counted_;
    replay_drops_counted_ = spans_.replayDrops();
  }
  for (std::uint64_t i = 0; i < drops; ++i) countDrop(DropKind::GraphReplay);
  if (taken_.empty()) return;
  const std::lock_guard lock(captures_mutex_);
  for (const KernelSpans::Replay& replay : taken_) {
    const auto calls = captures_.find(replay.capture);
    if (calls == captures_.end()) continue;  // its capture was not noted (counted as graph_capture)
    for (const CapturedCall& call : calls->second)
      out.push_back({call.comm, call.seq, static_cast<std::int64_t>(replay.start) + offset_ns_,
                     static_cast<std::int64_t>(replay.end) + offset_ns_});
  }
}

bool CuptiTracer::measureOffset() {
  // The tightest of a few back-to-back reads of both clocks.
  std::int64_t best_width = INT64_MAX;
  for (int i = 0; i < 5; ++i) {
    std::uint64_t timestamp = 0;
    const std::int64_t before = realtimeNs();
    if (library_.getTimestamp(&timestamp) != cupti::CUPTI_SUCCESS) return false;
    const std::int64_t width = realtimeNs() - before;
    if (width < best_width) {
      best_width = width;
      offset_ns_ = before + width / 2 - static_cast<std::int64_t>(timestamp);
    }
  }
  return true;
}

void CuptiTracer::requestBuffer(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = nullptr;
  *size = 0;
  *max_records = 0;  // as many as fit
  CuptiTracer* tracer = g_tracer.load(std::memory_order_acquire);
  if (tracer == nullptr) return;
  std::uint32_t free = tracer->free_.load(std::memory_order_acquire);
  while (free != 0) {
    const int index = __builtin_ctz(free);
    if (tracer->free_.compare_exchange_weak(free, free & ~(1u << index), std::memory_order_acq_rel)) {
      // Records are 8-byte aligned (cupti_common.h ACTIVITY_RECORD_ALIGNMENT); new[] is 16-byte aligned.
      *buffer = tracer->pool_.get() + static_cast<std::size_t>(index) * kBufferBytes;
      *size = kBufferBytes;
      return;
    }
  }
  // None free: CUPTI drops the records that would have gone into it (counted by countDropped).
}

void CuptiTracer::completeBuffer(cuda::CUcontext context, std::uint32_t stream, std::uint8_t* buffer,
                                 std::size_t, std::size_t valid) {
  CuptiTracer* tracer = g_tracer.load(std::memory_order_acquire);
  if (tracer == nullptr || buffer == nullptr) return;
  tracer->countDropped(context, stream);
  {
    const std::lock_guard lock(tracer->mutex_);
    tracer->applyWindowEvents();
    if (valid > 0)
      parseActivityBuffer(tracer->library_, buffer, valid, tracer->spans_,
                          tracer->flushes_.load(std::memory_order_acquire),
                          tracer->windows_on_.load(std::memory_order_relaxed) ? &tracer->windows_ : nullptr);
  }
  const auto index = static_cast<std::size_t>(buffer - tracer->pool_.get()) / kBufferBytes;
  if (index < kBuffers) tracer->free_.fetch_or(1u << index, std::memory_order_acq_rel);
}

void CuptiTracer::countDropped(cuda::CUcontext context, std::uint32_t stream) {
  std::size_t dropped = 0;
  if (library_.activityGetNumDroppedRecords(context, stream, &dropped) != cupti::CUPTI_SUCCESS) return;
  if (dropped == 0) return;
  drops_.fetch_add(dropped, std::memory_order_acq_rel);
  for (std::size_t i = 0; i < dropped; ++i) countDrop(DropKind::CuptiRecord);
}

void CuptiTracer::flush() {
  last_flush_began_ns_.store(monotonicNs(), std::memory_order_release);
  library_.activityFlushAll(0);
  countDropped(nullptr, 0);  // the global queue (the completion callback reads each buffer's own)
  flushes_.fetch_add(1, std::memory_order_acq_rel);
}

void CuptiTracer::useWindows(const GpuWindowConfig& windows, bool steps_marked) {
  window_config_ = windows;
  windows_by_step_ = steps_marked;
  windows_on_.store(!windows.off, std::memory_order_release);
}

void CuptiTracer::onStep(std::int64_t step) {
  // Open through the step after the last sampled one: the last one's span ends at that step's first NCCL
  // kernel, which starts after its call began the step on the host. Kernel records (when they are not on
  // throughout) from the step before the first: the first one's span holds kernels launched before its
  // first NCCL call, and CUPTI records only the launches made while they are on.
  if (!windows_by_step_ || !windows_on_.load(std::memory_order_acquire)) return;
  const GpuWindowConfig& c = window_config_;
  const bool open = c.stepSampled(step) || c.stepSampled(step - 1);
  setWindow(open || c.stepSampled(step + 1), open);
}

void CuptiTracer::onPoll(std::int64_t epoch_ns) {
  // Kernel records from a tenth of the period before the window, for the same reason.
  if (windows_by_step_ || !windows_on_.load(std::memory_order_acquire)) return;
  const GpuWindowConfig& c = window_config_;
  const bool open = c.timeSampled(epoch_ns);
  setWindow(open || c.timeSampled(epoch_ns + c.every_ns / 10), open);
}

void CuptiTracer::setWindow(bool records, bool open) {
  if (window_open_.load(std::memory_order_relaxed) == open &&
      records_on_.load(std::memory_order_relaxed) == records)
    return;
  // CUPTI is switched under a lock of its own, never held by the buffer callbacks (which take mutex_): a
  // CUPTI call that delivered buffers on this thread must not find mutex_ held here.
  {
    const std::lock_guard lock(records_mutex_);
    if (!spans_on_ && records_on_.load(std::memory_order_relaxed) != records) {
      if (records) library_.activityEnable(cupti::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
      // The records of kernels that ran until now stay in CUPTI's buffers, delivered at the next flush.
      else library_.activityDisable(cupti::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    }
    records_on_.store(records, std::memory_order_relaxed);
  }
  // The opening or closing is queued, not applied: the thread that begins a step must not wait while the
  // buffer callback parses a buffer under mutex_. The queue is applied before the next buffer is parsed
  // (every record in it was written after the event) and before windows are taken.
  std::uint64_t now = 0;
  if (library_.getTimestamp(&now) != cupti::CUPTI_SUCCESS) return;
  const std::lock_guard lock(events_mutex_);
  if (window_open_.load(std::memory_order_relaxed) == open) return;  // another thread was first
  window_open_.store(open, std::memory_order_relaxed);
  if (window_events_.size() < kMaxWindowEvents) window_events_.push_back({now, open});
}

void CuptiTracer::applyWindowEvents() {
  {
    const std::lock_guard lock(events_mutex_);
    applying_.swap(window_events_);
  }
  for (const auto& [at, open] : applying_) {
    if (open) windows_.open(at);
    else windows_.close(at, flushes_.load(std::memory_order_acquire));
  }
  applying_.clear();
}

void CuptiTracer::takeActivity(std::vector<GpuActivitySpan>& out, bool final) {
  if (!windows_on_.load(std::memory_order_acquire)) return;
  window_rows_.clear();
  std::uint64_t drops = 0;
  {
    const std::lock_guard lock(mutex_);
    applyWindowEvents();
    if (final && windows_.isOpen()) {
      std::uint64_t now = 0;
      if (library_.getTimestamp(&now) == cupti::CUPTI_SUCCESS)
        windows_.close(now, flushes_.load(std::memory_order_acquire));
    }
    // A window closed during flush n may still get kernels at flushes n + 1 and n + 2 (as replays do).
    const std::uint64_t done = flushes_.load(std::memory_order_acquire);
    windows_.take(final ? UINT64_MAX : (done >= kGraceFlushes ? done - kGraceFlushes : 0), window_rows_);
    drops = windows_.drops() - window_drops_counted_;
    window_drops_counted_ = windows_.drops();
  }
  for (std::uint64_t i = 0; i < drops; ++i) countDrop(DropKind::GpuKernel);
  const std::lock_guard lock(names_mutex_);
  for (const WindowKernels::Row& row : window_rows_)
    out.push_back({static_cast<std::uint8_t>(row.kind), static_cast<std::int64_t>(row.start) + offset_ns_,
                   static_cast<std::int64_t>(row.end) + offset_ns_, row.kernels,
                   row.range < names_.size() ? names_[row.range] : std::string()});
}

namespace {
// The calling thread's NVTX nesting: its depth, and which of its first 64 levels pushed a CUSTOM1 id.
struct RangeStack {
  std::uint32_t depth = 0;
  std::uint64_t pushed = 0;
};
thread_local RangeStack t_ranges;
}  // namespace

void CuptiTracer::rangePushed(const char* name) {
  RangeStack& stack = t_ranges;
  const std::uint32_t level = stack.depth++;
  if (level >= 64 || name == nullptr || !windows_on_.load(std::memory_order_relaxed)) return;
  // Only while kernel records are wanted for a window: outside, a push costs the job nothing more.
  if (!window_open_.load(std::memory_order_relaxed) && !records_on_.load(std::memory_order_relaxed)) return;
  std::uint32_t id = 0;
  {
    const std::lock_guard lock(names_mutex_);
    const auto [it, inserted] = name_ids_.try_emplace(name, static_cast<std::uint32_t>(names_.size()));
    if (inserted) {
      if (names_.size() > kMaxRangeNames) {
        name_ids_.erase(it);
        return;
      }
      names_.emplace_back(name);
    }
    id = it->second;
  }
  if (library_.activityPushExternalCorrelationId(cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1, id) ==
      cupti::CUPTI_SUCCESS)
    stack.pushed |= std::uint64_t{1} << level;
}

void CuptiTracer::rangePopped() {
  RangeStack& stack = t_ranges;
  if (stack.depth == 0) return;  // a pop without its push (the job's, or one made before the agent)
  const std::uint32_t level = --stack.depth;
  if (level >= 64 || (stack.pushed & (std::uint64_t{1} << level)) == 0) return;
  stack.pushed &= ~(std::uint64_t{1} << level);
  std::uint64_t last = 0;
  library_.activityPopExternalCorrelationId(cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1, &last);
}

bool CuptiTracer::span(std::uint64_t id, std::int64_t& start_epoch_ns, std::int64_t& end_epoch_ns) {
  std::uint64_t start = 0, end = 0;
  {
    const std::lock_guard lock(mutex_);
    if (!spans_.span(id, start, end)) return false;
  }
  start_epoch_ns = static_cast<std::int64_t>(start) + offset_ns_;
  end_epoch_ns = static_cast<std::int64_t>(end) + offset_ns_;
  return true;
}

void CuptiTracer::forget(std::uint64_t id) {
  const std::lock_guard lock(mutex_);
  spans_.forget(id);
}

}  // namespace gradscope::agent
