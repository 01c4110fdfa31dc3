#pragma once

// A deterministic synthetic trace of a pipeline-parallel job, for tests, screenshots and demos of the
// point-to-point views: `replicas` copies of a `stages`-stage pipeline (rank = replica × stages + stage),
// trained GPipe-style. Per step and rank:
//   - forward, per microbatch: the activation from the previous stage arrives through an MPI_Irecv
//     posted at the start of the step and waited for when the stage needs it; the stage computes and
//     sends its activation on with a blocking MPI_Send (tag 1);
//   - backward, per microbatch: the gradient from the next stage arrives through a blocking MPI_Recv; the
//     stage computes and sends its gradient back with an MPI_Isend (tag 2), waited for at the end of the
//     backward pass;
//   - an MPI_Allreduce of the stage's gradients among the replicas (communicator "dp<stage>"), then an
//     MPI_Barrier on MPI_COMM_WORLD.
// One stage computes slower than the others, so the stages after it wait (the pipeline's bubbles).
// Times are simulated (compute, then latency + bytes over bandwidth per message), so every receive ends
// after its send began and the matching (storage/peers.h) pairs the k-th send with the k-th receive.

#include <cstdint>
#include <string>
#include <vector>

#include "gradscope/storage/records.h"

namespace gradscope::testing {

struct SyntheticPipeline {
  int stages = 4;
  int replicas = 2;
  int microbatches = 4;
  int steps = 6;
  std::int64_t activation_bytes = 8ll << 20;  // per microbatch, forward and backward
  std::int64_t gradient_bytes = 64ll << 20;   // per stage, all-reduced among the replicas
  std::int64_t forward_ns = 3'000'000;        // per microbatch and stage
  std::int64_t backward_ns = 6'000'000;
  int slow_stage = 1;  // computes 1.5× longer (-1: none)
  int ranks_per_host = 4;
  std::uint64_t seed = 1;
  std::int64_t epoch_ns = 1'795'000'000'000'000'000;
  std::string uuid = "00000000-0000-4000-8000-000000000002";
};

// Per rank (index = rank), its calls in issue order, ids unset; rank ids are `rank_ids[rank]`, the
// communicators `world_comm_ids[rank]` and `stage_comm_ids[rank]`.
std::vector<std::vector<storage::CallRecord>> pipelineCalls(const SyntheticPipeline& job,
                                                            const std::vector<std::int64_t>& rank_ids,
                                                            const std::vector<std::int64_t>& world_comm_ids,
                                                            const std::vector<std::int64_t>& stage_comm_ids);

// Writes the whole job as one trace (as `gradscope merge` would), every rank on one clock.
void writePipelineTrace(const std::string& path, const SyntheticPipeline& job);

}  // namespace gradscope::testing
