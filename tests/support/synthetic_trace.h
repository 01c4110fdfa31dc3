#pragma once

// Deterministic synthetic traces that look like a data-parallel training job: per step, DDP-style
// gradient buckets (a 1 MiB first bucket, 25 MiB buckets, a remainder), a scalar loss all-reduce and a
// metrics all-gather, with an alpha-beta cost per call, per-rank jitter and one straggler rank. Used by
// the tests, the benchmarks and the Quick start demo until real jobs can be profiled.

#include <cstdint>
#include <string>
#include <vector>

#include "gradscope/storage/records.h"

namespace gradscope::testing {

struct SyntheticJob {
  int ranks = 4;
  int steps = 20;
  std::uint64_t seed = 1;
  std::int64_t epoch_ns = 1'795'000'000'000'000'000;  // 2026-11-18: fixed so outputs are reproducible
  std::string uuid = "00000000-0000-4000-8000-000000000001";
  std::string host_prefix = "node";
  int ranks_per_host = 2;
  int straggler = 1;                       // rank that starts its collectives late (-1: none)
  std::int64_t model_bytes = 100ll << 20;  // gradient bytes per step
  bool gpu = false;                        // NCCL calls with stream/algorithm facts instead of MPI calls
};

// Writes the file one rank of `job` would write (what the agent writes per rank); a GPU job's file also
// has the GPU windows the agent's default sampling would keep (syntheticGpuActivity).
void writeSyntheticRank(const std::string& path, const SyntheticJob& job, int rank);

// A GPU job's sampled kernels for one rank's `calls` (syntheticRankCalls'): one window over steps 1 to 5
// (the agent's default, marked steps 1-4 of every 100 and the step after), and in each step the compute
// kernels of NVTX ranges "forward" (the first 10 ms of the compute phase) and "backward" (the rest, until
// the first bucket's all-reduce ends: that bucket is hidden), and the NCCL kernels, the calls' spans.
std::vector<storage::GpuActivityRecord> syntheticGpuActivity(const SyntheticJob& job,
                                                             const std::vector<storage::CallRecord>& calls);

// The calls of one rank, ids unset (0), for rank id `rank_id` and communicator id `comm_id`.
std::vector<storage::CallRecord> syntheticRankCalls(const SyntheticJob& job, int rank, std::int64_t rank_id,
                                                    std::int64_t comm_id);

// `count` call rows with realistic, varied values (sizes, gaps, durations), fast to generate: the
// input of the ingest benchmark and of large-file tests. Times increase; ids unset.
std::vector<storage::CallRecord> manyCalls(std::size_t count, std::int64_t rank_id, std::int64_t comm_id,
                                           std::uint64_t seed);

// A single-file trace with `calls` calls spread over `ranks` ranks (rank ids 0..ranks-1).
void writeLargeTrace(const std::string& path, std::int64_t calls, int ranks, std::uint64_t seed);

// A strategy of a synthetic benchmark that is twice as fast as sum/native from min_bytes to max_bytes and
// twice as slow at every other size.
struct BenchWinner {
  std::string strategy;  // e.g. "sum/mpi.ring"
  std::int64_t min_bytes = 0, max_bytes = 0;
};

// A trace as `gradscope bench --backend mpi` on `ranks` ranks writes it, with known winners: fp32
// MPI_Allreduce at every power of two from 1 KiB to 16 MiB, sum/native at costNs (the synthetic job's
// alpha-beta model) and each winner as above, each point's min/max within 2% of its median (intervals far
// apart). `gradscope recommend` on it gives one rule per winner, over the powers of two inside its range.
void writeBenchTrace(const std::string& path, int ranks, const std::vector<BenchWinner>& winners);

}  // namespace gradscope::testing
