// gradscope bench: results into the trace store (a runs row with mode "bench", one measurement per point).

#include <unistd.h>

#include <climits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/cli/bench.h"
#include "gradscope/common/version.h"
#include "gradscope/storage/writer.h"

namespace gradscope::cli::bench {
namespace {

std::string hostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof name) != 0) return "unknown";
  return name;
}

std::string configJson(const BenchOptions& options) {
  nlohmann::json config = {
      {"minbytes", options.min_bytes},
      {"maxbytes", options.max_bytes},
      {"iters", options.iters},
      {"warmup_iters", options.warmup_iters},
      {"datatype", benchDTypeName(options.dtype)},
      {"check", options.check},
      {"strategies", options.strategies},
  };
  if (options.step_bytes > 0) config["stepbytes"] = options.step_bytes;
  else config["stepfactor"] = options.step_factor;
  if (options.backend == Backend::Local) config["inputs"] = options.inputs;
  return config.dump();
}

Api apiOf(Backend backend) {
  switch (backend) {
    case Backend::Mpi: return Api::MpiAllreduce;
    case Backend::Nccl: return Api::NcclAllReduce;
    case Backend::Local:
    case Backend::Unknown: break;
  }
  return Api::Unknown;
}

}  // namespace

struct BenchTraceWriter::Impl {
  storage::TraceWriter writer;
  std::int64_t run_id = 0;
  std::int64_t epoch_ns = 0;  // the file's time origin: the run starts at 0
  Backend backend = Backend::Unknown;
  int world = 1;
};

BenchTraceWriter::BenchTraceWriter(const std::string& path, const BenchContext& context,
                                   const BenchOptions& options)
    : impl_(std::make_unique<Impl>(Impl{storage::TraceWriter::create(path)})) {
  storage::RunInfo run;
  run.uuid = fmt::format("bench-{}-{}-{}", hostName(), getpid(), storage::unixTimeNs());
  run.command = options.command_line;
  run.mode = "bench";
  run.backend = context.backend;
  run.world_size = context.world_size;
  run.host = hostName();
  run.config_json = configJson(options);
  run.tool_version = kVersion;
  run.epoch_ns = storage::unixTimeNs();
  run.start_ns = 0;
  impl_->run_id = impl_->writer.addRun(run);
  impl_->epoch_ns = run.epoch_ns;
  impl_->backend = context.backend;
  impl_->world = context.world_size;
}

BenchTraceWriter::~BenchTraceWriter() = default;

void BenchTraceWriter::addRanks(const std::vector<std::int64_t>& pids, const std::string& device) {
  for (std::size_t rank = 0; rank < pids.size(); ++rank) {
    storage::RankInfo info;
    info.run_id = impl_->run_id;
    info.rank = static_cast<int>(rank);
    info.host = rank == 0 ? hostName() : "";
    info.pid = pids[rank];
    info.device = device;
    impl_->writer.addRank(info);
  }
}

void BenchTraceWriter::addPoint(const BenchPoint& point, DType dtype) {
  constexpr double kNsPerUs = 1e3;
  storage::Measurement row;
  row.run_id = impl_->run_id;
  row.strategy = point.strategy;
  row.api = apiOf(impl_->backend);
  row.dtype = dtype;
  row.bytes = static_cast<std::int64_t>(point.bytes);
  row.world = impl_->world;
  row.reps = point.reps;
  // Each rank's median call, over ranks: the tuner and the CI gate model typical calls, not stalls.
  row.min_ns = point.median_call.min_us * kNsPerUs;
  row.median_ns = point.median_call.median_us * kNsPerUs;
  row.p90_ns = point.median_call.p90_us * kNsPerUs;
  row.max_ns = point.median_call.max_us * kNsPerUs;
  row.algbw_gbs = point.algbw_gbs;
  row.busbw_gbs = point.busbw_gbs;
  if (point.error) {
    row.rel_l2_error = point.error->rel_l2;
    row.max_abs_error = point.error->max_abs;
    row.cosine = point.error->cosine;
    row.overflow_count = static_cast<std::int64_t>(point.error->overflow + point.error->nan);
  }
  impl_->writer.addMeasurement(row);
}

void BenchTraceWriter::finish() {
  impl_->writer.finish(storage::unixTimeNs() - impl_->epoch_ns);
}

}  // namespace gradscope::cli::bench
