#pragma once

// Runs a data-parallel loop on all cores for large buffers and inline for small ones. The pool is
// created once (lazily) and reused, so a kernel call costs no thread creation.

#include <cstddef>
#include <functional>
#include <string_view>

namespace gradscope::methods {

class CpuExecutor {
 public:
  // The process-wide pool of defaultThreads() workers (including the caller).
  static CpuExecutor& shared();
  // GRADSCOPE_THREADS when it is a positive integer; otherwise the CPUs this process may run on
  // divided by the ranks an MPI launcher started on this node (OMPI_COMM_WORLD_LOCAL_SIZE,
  // MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE), at least 1: ranks that share a node would otherwise each
  // start a thread per core and time-slice against each other.
  static int defaultThreads();
  // A pool of `threads` workers (1 = everything inline on the caller).
  explicit CpuExecutor(int threads);
  ~CpuExecutor();
  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  int threads() const;

  // Calls body(begin, end) over [0, count) in contiguous chunks, one per worker, each a multiple of
  // `align` elements except the last; runs inline when count * bytes_per_element is below
  // kParallelBytes. Blocks until every chunk is done. `body` must not throw.
  void parallelFor(std::size_t count, std::size_t bytes_per_element, std::size_t align,
                   const std::function<void(std::size_t, std::size_t)>& body);

  // Below this many bytes touched, splitting costs more than it gains.
  static constexpr std::size_t kParallelBytes = 1 << 20;

 private:
  struct Impl;
  Impl* impl_;
};

// The instruction set the CPU kernels dispatched to at run time, e.g. "avx512", "avx2", "baseline".
std::string_view cpuKernelIsa();

}  // namespace gradscope::methods
