#include "cupti_tracer.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "clock.h"
#include "recorder.h"

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

KernelSpans::KernelSpans() : correlations_(new Correlation[kCorrelations]), spans_(new Span[kSpans]) {}

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

int parseActivityBuffer(const cupti::Library& library, std::uint8_t* buffer, std::size_t valid_bytes,
                        KernelSpans& spans) {
  int records = 0;
  cupti::CUpti_Activity* record = nullptr;
  while (library.activityGetNextRecord(buffer, valid_bytes, &record) == cupti::CUPTI_SUCCESS) {
    ++records;
    if (record->kind == cupti::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        record->kind == cupti::CUPTI_ACTIVITY_KIND_KERNEL) {
      cupti::KernelRecordHead kernel;
      std::memcpy(&kernel, record, sizeof kernel);
      // NCCL's kernels are ncclDevKernel_* (ncclKernel_* before 2.19); other kernels never carry our ids.
      if (kernel.name != nullptr && std::strncmp(kernel.name, "nccl", 4) == 0)
        spans.addKernel(kernel.correlationId, kernel.start, kernel.end);
    } else if (record->kind == cupti::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
      cupti::CUpti_ActivityExternalCorrelation external;
      std::memcpy(&external, record, sizeof external);
      if (external.externalKind == cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
        spans.addExternal(external.correlationId, external.externalId);
    }
  }
  return records;
}

// ---- CuptiTracer ------------------------------------------------------------------------------------------

CuptiTracer::CuptiTracer(const cupti::Library& library)
    : library_(library), pool_(new std::uint8_t[kBuffers * kBufferBytes + 8]) {}

CuptiTracer* CuptiTracer::start(std::string& why) {
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
  if (const CUptiResult rc = library.activityEnable(cupti::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
      rc != cupti::CUPTI_SUCCESS)
    return failed("cuptiActivityEnable(CONCURRENT_KERNEL)", rc);
  return tracer;
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
    if (valid > 0) parseActivityBuffer(tracer->library_, buffer, valid, tracer->spans_);
  }
  const auto index = static_cast<std::size_t>(buffer - tracer->pool_.get()) / kBufferBytes;
  if (index < kBuffers) tracer->free_.fetch_or(1u << index, std::memory_order_acq_rel);
}

void CuptiTracer::countDropped(cuda::CUcontext context, std::uint32_t stream) {
  std::size_t dropped = 0;
  if (library_.activityGetNumDroppedRecords(context, stream, &dropped) != cupti::CUPTI_SUCCESS) return;
  if (dropped == 0) return;
  drops_.fetch_add(dropped, std::memory_order_acq_rel);
  for (std::size_t i = 0; i < dropped; ++i) countDrop("cupti_record");
}

void CuptiTracer::flush() {
  library_.activityFlushAll(0);
  countDropped(nullptr, 0);  // the global queue (the completion callback reads each buffer's own)
  ++flushes_;
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
