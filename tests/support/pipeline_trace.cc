#include "pipeline_trace.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>

#include "gradscope/common/error.h"
#include "gradscope/storage/writer.h"

namespace gradscope::testing {
namespace {

constexpr std::int64_t kPostNs = 3'000;     // posting a nonblocking call
constexpr std::int64_t kMinWaitNs = 4'000;  // a wait or receive whose data is there already
constexpr std::int64_t kOptimizerNs = 1'000'000;

// One message: latency plus bytes over a 12 GB/s link.
std::int64_t transferNs(std::int64_t bytes) {
  return 20'000 + bytes / 12;
}

}  // namespace

std::vector<std::vector<storage::CallRecord>> pipelineCalls(const SyntheticPipeline& job,
                                                            const std::vector<std::int64_t>& rank_ids,
                                                            const std::vector<std::int64_t>& world_comm_ids,
                                                            const std::vector<std::int64_t>& stage_comm_ids) {
  const int stages = job.stages;
  const int ranks = job.stages * job.replicas;
  const int microbatches = job.microbatches;
  if (stages < 1 || job.replicas < 1 || microbatches < 1)
    fail("a pipeline needs a stage, a replica and a microbatch");
  const auto index = [](int i) { return static_cast<std::size_t>(i); };
  std::vector<std::vector<storage::CallRecord>> calls(index(ranks));
  std::vector<std::int64_t> now(index(ranks), 0);
  std::vector<std::int64_t> p2p_seq(index(ranks), 0);
  std::vector<std::mt19937_64> jitter;
  for (int rank = 0; rank < ranks; ++rank)
    jitter.emplace_back(job.seed * 1'000'003 + static_cast<std::uint64_t>(rank));
  std::uniform_real_distribution<double> compute_noise(0.97, 1.03);
  std::uniform_int_distribution<std::int64_t> start_noise(0, 50'000);

  const auto base = [&](int rank, std::int64_t comm_id, Api api, std::int64_t step) {
    storage::CallRecord call;
    call.rank_id = rank_ids[index(rank)];
    call.comm_id = comm_id;
    call.step = step;
    call.api = api;
    return call;
  };
  const auto message = [&](int rank, Api api, std::int64_t step) {
    storage::CallRecord call = base(rank, world_comm_ids[index(rank)], api, step);
    call.seq = p2p_seq[index(rank)]++;
    call.dtype = DType::Bf16;
    call.bytes = job.activation_bytes;
    call.count = job.activation_bytes / 2;
    return call;
  };
  const auto compute = [&](int rank, std::int64_t ns) {
    const double slow = rank % stages == job.slow_stage ? 1.5 : 1.0;
    return static_cast<std::int64_t>(static_cast<double>(ns) * slow * compute_noise(jitter[index(rank)]));
  };

  std::int64_t step_start = 50'000'000;
  for (int step = 0; step < job.steps; ++step) {
    for (int rank = 0; rank < ranks; ++rank) now[index(rank)] = step_start + start_noise(jitter[index(rank)]);
    for (int replica = 0; replica < job.replicas; ++replica) {
      // arrival[s][m]: when stage s has microbatch m's activation (forward) or gradient (backward).
      std::vector<std::vector<std::int64_t>> arrival(index(stages),
                                                     std::vector<std::int64_t>(index(microbatches), 0));
      for (int stage = 0; stage < stages; ++stage) {
        const int rank = replica * stages + stage;
        std::int64_t cursor = now[index(rank)];
        std::vector<storage::CallRecord> receives;
        if (stage > 0) {
          for (int m = 0; m < microbatches; ++m) {
            storage::CallRecord receive = message(rank, Api::MpiIrecv, step);
            receive.source = rank - 1;
            receive.recv_tag = 1;
            receive.recv_bytes = job.activation_bytes;
            receive.enqueue_ns = cursor;
            cursor += kPostNs;
            receives.push_back(receive);
          }
        }
        for (int m = 0; m < microbatches; ++m) {
          if (stage > 0) {
            storage::CallRecord& receive = receives[index(m)];
            receive.start_ns = cursor;
            receive.end_ns = std::max(cursor + kMinWaitNs, arrival[index(stage)][index(m)]);
            cursor = receive.end_ns;
            calls[index(rank)].push_back(receive);
          }
          cursor += compute(rank, job.forward_ns);
          if (stage + 1 < stages) {
            storage::CallRecord send = message(rank, Api::MpiSend, step);
            send.dest = rank + 1;
            send.send_tag = 1;
            send.enqueue_ns = send.start_ns = cursor;
            send.end_ns = cursor + transferNs(job.activation_bytes);
            arrival[index(stage + 1)][index(m)] = send.end_ns;
            cursor = send.end_ns;
            calls[index(rank)].push_back(send);
          }
        }
        now[index(rank)] = cursor;
      }
      for (int stage = stages - 1; stage >= 0; --stage) {
        const int rank = replica * stages + stage;
        std::int64_t cursor = now[index(rank)];
        std::vector<std::pair<storage::CallRecord, std::int64_t>> sends;  // and when each completes
        for (int m = 0; m < microbatches; ++m) {
          if (stage + 1 < stages) {
            storage::CallRecord receive = message(rank, Api::MpiRecv, step);
            receive.source = rank + 1;
            receive.recv_tag = 2;
            receive.recv_bytes = job.activation_bytes;
            receive.enqueue_ns = receive.start_ns = cursor;
            receive.end_ns = std::max(cursor + kMinWaitNs, arrival[index(stage)][index(m)]);
            cursor = receive.end_ns;
            calls[index(rank)].push_back(receive);
          }
          cursor += compute(rank, job.backward_ns);
          if (stage > 0) {
            storage::CallRecord send = message(rank, Api::MpiIsend, step);
            send.dest = rank - 1;
            send.send_tag = 2;
            send.enqueue_ns = cursor;
            const std::int64_t done = cursor + transferNs(job.activation_bytes);
            arrival[index(stage - 1)][index(m)] = done;
            cursor += kPostNs;
            sends.emplace_back(send, done);
          }
        }
        for (auto& [send, done] : sends) {  // MPI_Waitall at the end of the backward pass
          send.start_ns = cursor;
          send.end_ns = std::max(cursor + kMinWaitNs / 2, done);
          cursor = send.end_ns;
          calls[index(rank)].push_back(send);
        }
        now[index(rank)] = cursor;
      }
    }
    // The stage's gradients among its replicas: done for all once the last has arrived.
    for (int stage = 0; stage < stages; ++stage) {
      std::int64_t last = 0;
      for (int replica = 0; replica < job.replicas; ++replica)
        last = std::max(last, now[index(replica * stages + stage)]);
      const double factor = 2.0 * (job.replicas - 1) / job.replicas;
      const std::int64_t end =
          last + 20'000 + static_cast<std::int64_t>(static_cast<double>(job.gradient_bytes) * factor / 12.0);
      for (int replica = 0; replica < job.replicas; ++replica) {
        const int rank = replica * stages + stage;
        storage::CallRecord reduce = base(rank, stage_comm_ids[index(rank)], Api::MpiAllreduce, step);
        reduce.seq = step;
        reduce.dtype = DType::Fp32;
        reduce.op = ReduceOp::Sum;
        reduce.bytes = job.gradient_bytes;
        reduce.count = job.gradient_bytes / 4;
        reduce.enqueue_ns = reduce.start_ns = now[index(rank)];
        reduce.end_ns = end;
        now[index(rank)] = end;
        calls[index(rank)].push_back(reduce);
      }
    }
    const std::int64_t last = *std::max_element(now.begin(), now.end());
    for (int rank = 0; rank < ranks; ++rank) {
      storage::CallRecord barrier = base(rank, world_comm_ids[index(rank)], Api::MpiBarrier, step);
      barrier.seq = step;
      barrier.dtype = DType::Other;
      barrier.enqueue_ns = barrier.start_ns = now[index(rank)];
      barrier.end_ns = last + 15'000;
      calls[index(rank)].push_back(barrier);
    }
    step_start = last + 15'000 + kOptimizerNs;
  }
  // In issue order: the forward receives are posted before the sends and receives that precede their waits.
  for (auto& list : calls) {
    std::stable_sort(list.begin(), list.end(),
                     [](const storage::CallRecord& a, const storage::CallRecord& b) {
                       return a.enqueue_ns < b.enqueue_ns;
                     });
  }
  return calls;
}

void writePipelineTrace(const std::string& path, const SyntheticPipeline& job) {
  storage::TraceWriter writer = storage::TraceWriter::create(path);
  const int ranks = job.stages * job.replicas;
  storage::RunInfo run;
  run.uuid = job.uuid;
  run.command = fmt::format("synthetic-pipeline --stages {} --replicas {} --microbatches {} --steps {}",
                            job.stages, job.replicas, job.microbatches, job.steps);
  run.mode = "synthetic";
  run.backend = Backend::Mpi;
  run.world_size = ranks;
  run.host = "node0";
  run.tool_version = "test";
  run.epoch_ns = job.epoch_ns;
  const std::int64_t run_id = writer.addRun(run);
  std::vector<std::int64_t> rank_ids, world_comms, stage_comms;
  for (int rank = 0; rank < ranks; ++rank) {
    storage::RankInfo info;
    info.run_id = run_id;
    info.rank = rank;
    info.host = fmt::format("node{}", rank / std::max(1, job.ranks_per_host));
    info.pid = 1000 + rank;
    info.device = "cpu";
    rank_ids.push_back(writer.addRank(info));
    world_comms.push_back(writer.addComm({0, rank_ids.back(), "world", Backend::Mpi, ranks, rank}));
    const int stage = rank % job.stages;
    stage_comms.push_back(writer.addComm(
        {0, rank_ids.back(), fmt::format("dp{}", stage), Backend::Mpi, job.replicas, rank / job.stages}));
  }
  std::int64_t end = 0;
  for (const std::vector<storage::CallRecord>& list :
       pipelineCalls(job, rank_ids, world_comms, stage_comms)) {
    for (const storage::CallRecord& call : list) end = std::max(end, call.end_ns);
    writer.appendCalls(list);
  }
  writer.finish(end + 1'000'000);
}

}  // namespace gradscope::testing
