#include "synthetic_trace.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "gradscope/storage/writer.h"

namespace gradscope::testing {
namespace {

// Cost model of one all-reduce: latency plus bytes over bus bandwidth (about 10 GB/s).
std::int64_t costNs(std::int64_t bytes, int ranks) {
  const double factor = 2.0 * (ranks - 1) / ranks;
  return 20'000 + static_cast<std::int64_t>(static_cast<double>(bytes) * factor / 10.0);
}

}  // namespace

std::vector<storage::CallRecord> syntheticRankCalls(const SyntheticJob& job, int rank, std::int64_t rank_id,
                                                    std::int64_t comm_id) {
  // The same seed for every rank keeps the schedule identical across ranks (as in a real job); a
  // second generator seeded by rank gives each rank its own jitter.
  std::mt19937_64 shared(job.seed);
  std::mt19937_64 local(job.seed * 1'000'003 + static_cast<std::uint64_t>(rank));
  std::uniform_int_distribution<std::int64_t> compute_jitter(0, 2'000'000);
  std::uniform_int_distribution<std::int64_t> jitter(0, 40'000);
  std::uniform_real_distribution<double> bandwidth_noise(0.0, 0.15);

  std::vector<std::int64_t> buckets;
  std::int64_t remaining = job.model_bytes;
  buckets.push_back(std::min<std::int64_t>(remaining, 1 << 20));
  remaining -= buckets.back();
  while (remaining > 0) {
    buckets.push_back(std::min<std::int64_t>(remaining, 25ll << 20));
    remaining -= buckets.back();
  }
  const Api allreduce = job.gpu ? Api::NcclAllReduce : Api::MpiAllreduce;
  const Api allgather = job.gpu ? Api::NcclAllGather : Api::MpiAllgather;

  std::vector<storage::CallRecord> calls;
  std::int64_t now = 50'000'000;  // start-up before the first step
  std::int64_t seq = 0;
  const auto add = [&](Api api, DType dtype, ReduceOp op, std::int64_t bytes, std::int64_t step) {
    storage::CallRecord call;
    call.rank_id = rank_id;
    call.comm_id = comm_id;
    call.seq = seq++;
    call.step = step;
    call.api = api;
    call.dtype = dtype;
    call.op = op;
    call.bytes = bytes;
    call.count = bytes / static_cast<std::int64_t>(sizeOf(dtype));
    call.enqueue_ns = now;
    // Every rank enters at a shared schedule point plus its own jitter; the straggler adds 300 us.
    const std::int64_t late = rank == job.straggler ? 300'000 : 0;
    call.start_ns = now + jitter(local) + late;
    if (job.gpu) {
      call.stream = 1;
      call.nccl_algo = bytes >= (1 << 20) ? 1 : 0;   // Ring for large, Tree for small
      call.nccl_proto = bytes >= (1 << 20) ? 2 : 0;  // Simple / LL
      call.nccl_channels = bytes >= (1 << 20) ? 16 : 2;
    }
    // A collective completes for everyone once the last rank has arrived.
    // Same draw on every rank (shared generator): the network is shared, so is its noise.
    const double noise = 1.0 + bandwidth_noise(shared);
    call.end_ns = now + (job.straggler >= 0 ? 340'000 : 40'000) +
                  static_cast<std::int64_t>(static_cast<double>(costNs(bytes, job.ranks)) * noise);
    now = call.end_ns + 5'000;
    calls.push_back(call);
  };
  for (int step = 0; step < job.steps; ++step) {
    now += 30'000'000 + compute_jitter(shared);  // forward + backward compute
    for (auto it = buckets.rbegin(); it != buckets.rend(); ++it)
      add(allreduce, DType::Fp32, ReduceOp::Sum, *it, step);
    add(allreduce, DType::Fp32, ReduceOp::Sum, 4, step);    // loss
    add(allgather, DType::Fp32, ReduceOp::None, 64, step);  // metrics
  }
  return calls;
}

void writeSyntheticRank(const std::string& path, const SyntheticJob& job, int rank) {
  storage::TraceWriter writer = storage::TraceWriter::create(path);
  storage::RunInfo run;
  run.uuid = job.uuid;
  run.command = fmt::format("synthetic-ddp --ranks {} --steps {}", job.ranks, job.steps);
  run.mode = "synthetic";
  run.backend = job.gpu ? Backend::Nccl : Backend::Mpi;
  run.world_size = job.ranks;
  run.host = fmt::format("{}{}", job.host_prefix, rank / std::max(1, job.ranks_per_host));
  run.tool_version = "test";
  // Each rank starts its own clock a little later, as real processes do; merge rebases them.
  run.epoch_ns = job.epoch_ns + rank * 1'000'000ll;
  run.start_ns = 0;
  const std::int64_t run_id = writer.addRun(run);
  storage::RankInfo info;
  info.run_id = run_id;
  info.rank = rank;
  info.host = run.host;
  info.pid = 1000 + rank;
  info.device = job.gpu ? fmt::format("cuda:{} synthetic", rank % job.ranks_per_host) : "cpu";
  const std::int64_t rank_id = writer.addRank(info);
  storage::CommInfo comm;
  comm.rank_id = rank_id;
  comm.key = "world";
  comm.backend = run.backend;
  comm.size = job.ranks;
  comm.comm_rank = rank;
  const std::int64_t comm_id = writer.addComm(comm);
  auto calls = syntheticRankCalls(job, rank, rank_id, comm_id);
  // Shift into this rank's own time origin.
  for (auto& call : calls) {
    call.enqueue_ns -= rank * 1'000'000ll;
    call.start_ns -= rank * 1'000'000ll;
    call.end_ns -= rank * 1'000'000ll;
  }
  writer.appendCalls(calls);
  if (job.gpu) writer.appendGpuActivity(syntheticGpuActivity(job, calls));
  writer.finish(calls.empty() ? 0 : calls.back().end_ns + 10'000'000);
}

std::vector<storage::GpuActivityRecord> syntheticGpuActivity(const SyntheticJob& job,
                                                             const std::vector<storage::CallRecord>& calls) {
  std::vector<storage::GpuActivityRecord> rows;
  if (!job.gpu || calls.empty()) return rows;
  const std::int64_t rank_id = calls.front().rank_id;
  const auto row = [&](storage::GpuActivityKind kind, std::int64_t start, std::int64_t end,
                       std::int64_t kernels, std::optional<std::string> range = std::nullopt) {
    rows.push_back({rank_id, kind, start, end, kernels, std::move(range)});
  };
  // Each step's calls: [first, last] indices; its compute phase ends where its first call begins.
  constexpr int kFirstSampled = 1, kAfterSampled = 6;  // steps 1..5 lie inside the window
  // (A rank's times may be negative: its own time origin comes after the job's first rank's.)
  std::optional<std::int64_t> window_start, window_end;
  std::int64_t previous_end = INT64_MIN;
  for (std::size_t i = 0; i < calls.size();) {
    const std::int64_t step = calls[i].step;
    std::size_t last = i;
    while (last + 1 < calls.size() && calls[last + 1].step == step) ++last;
    const std::int64_t compute_end = calls[i].start_ns,
                       compute_start = std::max(previous_end, compute_end - 30'000'000);
    if (step == kFirstSampled) window_start = compute_start;
    if (step == kAfterSampled) window_end = calls[i].start_ns + 1;
    if (step >= kFirstSampled && step <= kAfterSampled) {
      const std::int64_t forward_end = std::min(compute_end, compute_start + 10'000'000);
      row(storage::GpuActivityKind::Compute, compute_start, forward_end, 40, "forward");
      row(storage::GpuActivityKind::Compute, forward_end, calls[i].end_ns, 80, "backward");
      for (std::size_t k = i; k <= last; ++k)
        row(storage::GpuActivityKind::Nccl, calls[k].start_ns, calls[k].end_ns, 1);
    }
    previous_end = calls[last].end_ns;
    i = last + 1;
  }
  if (!window_start) return {};
  rows.insert(rows.begin(), {rank_id, storage::GpuActivityKind::Window, *window_start,
                             window_end.value_or(previous_end + 1), 0, std::nullopt});
  return rows;
}

std::vector<storage::CallRecord> manyCalls(std::size_t count, std::int64_t rank_id, std::int64_t comm_id,
                                           std::uint64_t seed) {
  std::vector<storage::CallRecord> calls(count);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  const auto next = [&state] {  // xorshift64*: cheap and good enough for test data
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 2685821657736338717ull;
  };
  std::int64_t now = 1'000'000;
  for (std::size_t i = 0; i < count; ++i) {
    storage::CallRecord& call = calls[i];
    const std::uint64_t r = next();
    call.rank_id = rank_id;
    call.comm_id = comm_id;
    call.seq = static_cast<std::int64_t>(i);
    call.step = static_cast<std::int64_t>(i / 64);
    call.api = (r & 15) == 0 ? Api::MpiAllgather : Api::MpiAllreduce;
    call.dtype = DType::Fp32;
    call.op = call.api == Api::MpiAllreduce ? ReduceOp::Sum : ReduceOp::None;
    call.count = static_cast<std::int64_t>(1 + ((r >> 8) % (1 << ((r >> 40) % 22))));
    call.bytes = call.count * 4;
    now += 2'000 + static_cast<std::int64_t>((r >> 20) % 8'000);
    call.enqueue_ns = now;
    call.start_ns = now;
    call.end_ns = now + 1'000 + call.bytes / 8;
    now = call.end_ns;
  }
  return calls;
}

namespace {

// An MPI run of `ranks` ranks on one host, "node0", and one of its ranks (pid 100 + rank, on the CPU).
storage::RunInfo oneHostRun(std::string uuid, std::string command, std::string mode, int ranks) {
  storage::RunInfo run;
  run.uuid = std::move(uuid);
  run.command = std::move(command);
  run.mode = std::move(mode);
  run.backend = Backend::Mpi;
  run.world_size = ranks;
  run.host = "node0";
  run.epoch_ns = 1'795'000'000'000'000'000;
  return run;
}

storage::RankInfo oneHostRank(std::int64_t run_id, int rank) {
  storage::RankInfo info;
  info.run_id = run_id;
  info.rank = rank;
  info.host = "node0";
  info.pid = 100 + rank;
  info.device = "cpu";
  return info;
}

}  // namespace

void writeLargeTrace(const std::string& path, std::int64_t calls, int ranks, std::uint64_t seed) {
  storage::TraceWriter writer = storage::TraceWriter::create(path);
  const std::int64_t run_id = writer.addRun(oneHostRun(fmt::format("00000000-0000-4000-8000-{:012x}", seed),
                                                       "large synthetic trace", "synthetic", ranks));
  const std::int64_t per_rank = calls / ranks;
  for (int rank = 0; rank < ranks; ++rank) {
    const std::int64_t rank_id = writer.addRank(oneHostRank(run_id, rank));
    storage::CommInfo comm{0, rank_id, "world", Backend::Mpi, ranks, rank};
    const std::int64_t comm_id = writer.addComm(comm);
    const std::int64_t n = rank == ranks - 1 ? calls - per_rank * (ranks - 1) : per_rank;
    constexpr std::int64_t kChunk = 1 << 20;
    std::int64_t shift = 0;
    for (std::int64_t done = 0; done < n; done += kChunk) {
      auto chunk = manyCalls(static_cast<std::size_t>(std::min(kChunk, n - done)), rank_id, comm_id,
                             seed + static_cast<std::uint64_t>(rank * 7919 + done));
      for (auto& call : chunk) {
        call.seq += done;
        call.enqueue_ns += shift;
        call.start_ns += shift;
        call.end_ns += shift;
      }
      shift = chunk.back().end_ns;
      writer.appendCalls(chunk);
    }
  }
  writer.finish();
}

void writeBenchTrace(const std::string& path, int ranks, const std::vector<BenchWinner>& winners) {
  storage::TraceWriter writer = storage::TraceWriter::create(path);
  const std::int64_t run_id = writer.addRun(oneHostRun(
      "00000000-0000-4000-8000-0000000000b0", "gradscope bench --backend mpi (synthetic)", "bench", ranks));
  for (int rank = 0; rank < ranks; ++rank) writer.addRank(oneHostRank(run_id, rank));
  const auto add = [&](const std::string& strategy, std::int64_t bytes, double median_ns) {
    storage::Measurement row;
    row.run_id = run_id;
    row.strategy = strategy;
    row.api = Api::MpiAllreduce;
    row.dtype = DType::Fp32;
    row.bytes = bytes;
    row.world = ranks;
    row.reps = 20;
    row.min_ns = median_ns * 0.98;
    row.median_ns = median_ns;
    row.p90_ns = median_ns * 1.01;
    row.max_ns = median_ns * 1.02;
    writer.addMeasurement(row);
  };
  for (std::int64_t bytes = 1024; bytes <= (16 << 20); bytes *= 2) {
    const auto native = static_cast<double>(costNs(bytes, ranks));
    add("sum/native", bytes, native);
    for (const auto& winner : winners)
      add(winner.strategy, bytes,
          bytes >= winner.min_bytes && bytes <= winner.max_bytes ? native / 2 : native * 2);
  }
  writer.finish(1'000'000'000);
}

}  // namespace gradscope::testing
