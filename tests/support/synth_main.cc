// gradscope-synth: writes the per-rank trace files of a synthetic data-parallel job, or (--pipeline) one
// trace of a synthetic pipeline-parallel job.

#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "gradscope/common/error.h"
#include "gradscope/common/units.h"
#include "pipeline_trace.h"
#include "synthetic_trace.h"

int main(int argc, char** argv) {
  gradscope::testing::SyntheticJob job;
  std::string directory;
  std::int64_t large_calls = 0;
  std::string large_path;
  CLI::App app{"gradscope-synth: synthetic traces of a data-parallel job (one file per rank)"};
  app.add_option("-o,--output-dir", directory, "Directory for rank-N.db files (created if missing)");
  app.add_option("--ranks", job.ranks, "Ranks")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--steps", job.steps, "Training steps")
      ->check(CLI::Range(0, 1'000'000))
      ->capture_default_str();
  app.add_option("--seed", job.seed, "Random seed")->capture_default_str();
  app.add_option("--straggler", job.straggler, "Rank that arrives late (-1: none)")->capture_default_str();
  app.add_flag("--gpu", job.gpu, "NCCL calls on GPUs instead of MPI calls");
  app.add_option("--large", large_calls, "Instead: write one file with this many calls (benchmarks)");
  app.add_option("--large-file", large_path, "File for --large");
  gradscope::testing::SyntheticPipeline pipeline;
  std::string pipeline_path;
  app.add_option("--pipeline", pipeline_path,
                 "Instead: write one trace of a pipeline-parallel job (point-to-point calls) to this file");
  app.add_option("--stages", pipeline.stages, "--pipeline: stages")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--replicas", pipeline.replicas, "--pipeline: data-parallel copies of the pipeline")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--microbatches", pipeline.microbatches, "--pipeline: microbatches per step")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  std::string bench_path;
  std::vector<std::string> winners;
  app.add_option("--bench", bench_path,
                 "Instead: write one trace of a gradscope bench run over MPI on --ranks ranks with known "
                 "winners (--wins) to this file");
  app.add_option("--wins", winners,
                 "--bench: STRATEGY=MIN..MAX, twice as fast as sum/native from MIN to MAX bytes and twice as "
                 "slow elsewhere (e.g. sum/mpi.ring=1K..16K)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!bench_path.empty()) {
      std::vector<gradscope::testing::BenchWinner> parsed;
      for (const std::string& winner : winners) {
        const auto equals = winner.find('='), dots = winner.find("..");
        if (equals == std::string::npos || dots == std::string::npos || dots < equals)
          gradscope::fail("--wins {}: write STRATEGY=MIN..MAX, e.g. sum/mpi.ring=1K..16K", winner);
        parsed.push_back(
            {winner.substr(0, equals),
             static_cast<std::int64_t>(gradscope::parseBytes(winner.substr(equals + 1, dots - equals - 1))),
             static_cast<std::int64_t>(gradscope::parseBytes(winner.substr(dots + 2)))});
      }
      gradscope::testing::writeBenchTrace(bench_path, job.ranks, parsed);
      fmt::print("wrote {} (a benchmark on {} ranks, {} winners)\n", bench_path, job.ranks, parsed.size());
      return 0;
    }
    if (!pipeline_path.empty()) {
      if (app.count("--steps") > 0) pipeline.steps = job.steps;
      pipeline.seed = job.seed;
      gradscope::testing::writePipelineTrace(pipeline_path, pipeline);
      fmt::print("wrote {} ({} stages × {} replicas, {} steps)\n", pipeline_path, pipeline.stages,
                 pipeline.replicas, pipeline.steps);
      return 0;
    }
    if (large_calls > 0) {
      if (large_path.empty()) gradscope::fail("--large needs --large-file");
      gradscope::testing::writeLargeTrace(large_path, large_calls, job.ranks, job.seed);
      fmt::print("wrote {} ({} calls over {} ranks)\n", large_path, large_calls, job.ranks);
      return 0;
    }
    if (directory.empty()) gradscope::fail("name an output directory with -o");
    std::filesystem::create_directories(directory);
    for (int rank = 0; rank < job.ranks; ++rank) {
      const std::string path = (std::filesystem::path(directory) / fmt::format("rank-{}.db", rank)).string();
      gradscope::testing::writeSyntheticRank(path, job, rank);
    }
    fmt::print("wrote {} rank files of a {}-step job into {}\n", job.ranks, job.steps, directory);
  } catch (const std::exception& error) {
    fmt::print(stderr, "gradscope-synth: {}\n", error.what());
    return 2;
  }
  return 0;
}
