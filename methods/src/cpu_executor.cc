#include "gradscope/methods/cpu_executor.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "dispatch.h"
#include "gradscope/common/job_environment.h"

namespace gradscope::methods {

// A fixed pool: workers sleep on a condition variable between jobs; the caller runs chunk 0 itself and
// waits for the rest. One job at a time (jobs from different threads queue on `submit`), which is what
// kernels that each want every core need.
struct CpuExecutor::Impl {
  int threads = 1;
  std::vector<std::thread> workers;
  std::mutex submit;  // serialises jobs
  std::mutex mutex;   // guards the fields below
  std::condition_variable wake, done;
  const std::function<void(std::size_t, std::size_t)>* body = nullptr;
  std::vector<std::pair<std::size_t, std::size_t>> chunks;
  std::uint64_t generation = 0;
  int pending = 0;
  bool stopping = false;

  void work(int index) {
    std::uint64_t seen = 0;
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return stopping || generation != seen; });
      if (stopping) return;
      seen = generation;
      const auto chunk = chunks[static_cast<std::size_t>(index)];
      const auto* job = body;
      lock.unlock();
      if (chunk.second > chunk.first) (*job)(chunk.first, chunk.second);
      lock.lock();
      if (--pending == 0) done.notify_one();
    }
  }
};

namespace {

// A positive integer from the environment, or 0 when the variable is unset or not one.
int positiveFromEnvironment(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return 0;
  const std::string_view view(text);
  int value = 0;
  const auto [end, error] = std::from_chars(view.data(), view.data() + view.size(), value);
  return error == std::errc() && end == view.data() + view.size() && value > 0 ? value : 0;
}

}  // namespace

int CpuExecutor::defaultThreads() {
  if (const int forced = positiveFromEnvironment(env::kThreads)) return forced;
  if (const char* text = std::getenv(env::kThreads))
    std::fprintf(stderr, "gradscope: %s=%s is not a positive integer; ignoring it\n", env::kThreads, text);
  cpu_set_t allowed;
  int cpus = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  if (cpus <= 0) cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Ranks an MPI launcher started on this node (Open MPI, MPICH/Hydra, Slurm): they share the cores.
  int local_ranks = 1;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const int ranks = positiveFromEnvironment(name)) {
      local_ranks = ranks;
      break;
    }
  }
  return std::max(1, cpus / local_ranks);
}

CpuExecutor& CpuExecutor::shared() {
  static CpuExecutor executor(defaultThreads());
  return executor;
}

CpuExecutor::CpuExecutor(int threads) : impl_(new Impl) {
  impl_->threads = std::max(1, threads);
  impl_->chunks.resize(static_cast<std::size_t>(impl_->threads));
  for (int i = 1; i < impl_->threads; ++i) impl_->workers.emplace_back([this, i] { impl_->work(i); });
}

CpuExecutor::~CpuExecutor() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  for (std::thread& worker : impl_->workers) worker.join();
  delete impl_;
}

int CpuExecutor::threads() const {
  return impl_->threads;
}

void CpuExecutor::parallelFor(std::size_t count, std::size_t bytes_per_element, std::size_t align,
                              const std::function<void(std::size_t, std::size_t)>& body) {
  if (count == 0) return;
  align = std::max<std::size_t>(1, align);
  if (impl_->threads == 1 || count * bytes_per_element < kParallelBytes) {
    body(0, count);
    return;
  }
  std::lock_guard job(impl_->submit);
  const auto n = static_cast<std::size_t>(impl_->threads);
  // Equal chunks rounded up to `align` (vector width, scaling block); the last takes the rest.
  const std::size_t per = (count / n + align - 1) / align * align;
  {
    std::lock_guard lock(impl_->mutex);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t begin = std::min(count, i * per);
      const std::size_t end = i + 1 == n ? count : std::min(count, begin + per);
      impl_->chunks[i] = {begin, end};
    }
    impl_->body = &body;
    impl_->pending = impl_->threads - 1;
    ++impl_->generation;
  }
  impl_->wake.notify_all();
  body(impl_->chunks[0].first, impl_->chunks[0].second);
  std::unique_lock lock(impl_->mutex);
  impl_->done.wait(lock, [&] { return impl_->pending == 0; });
}

std::string_view cpuKernelIsa() {
  switch (detail::cpuIsa()) {
    case detail::Isa::Avx512: return "x86-64-v4 (AVX-512)";
    case detail::Isa::Avx2: return "x86-64-v3 (AVX2, FMA, F16C)";
    case detail::Isa::Portable: break;
  }
#if defined(__x86_64__)
  return "x86-64 baseline (SSE2)";
#else
  return "generic";
#endif
}

}  // namespace gradscope::methods
