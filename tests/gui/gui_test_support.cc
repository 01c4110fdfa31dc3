#include "gui_test_support.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <sqlite3.h>

#include "gradscope/storage/merge.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"

namespace gradscope::gui::testing {

void exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) throw std::runtime_error("cannot open " + path);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  const std::string message = error != nullptr ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  if (rc != SQLITE_OK) throw std::runtime_error(path + ": " + message);
}

namespace {
std::string inDir(const QTemporaryDir& dir, const char* name) {
  return dir.filePath(QString::fromLatin1(name)).toStdString();
}
}  // namespace

std::string writeTestTrace(const std::string& path, const TraceOptions& options) {
  std::filesystem::remove(path);
  storage::TraceWriter writer = storage::TraceWriter::create(path);
  storage::RunInfo run;
  run.uuid = "00000000-0000-4000-8000-0000000000aa";
  run.command = "mpirun -np 4 train";
  run.mode = "explore";
  run.backend = Backend::Mpi;
  run.world_size = options.ranks;
  run.host = "node0";
  run.tool_version = "test";
  run.epoch_ns = 1'795'000'000'000'000'000;
  const std::int64_t run_id = writer.addRun(run);
  gradscope::testing::SyntheticJob job;
  job.ranks = options.ranks;
  job.steps = options.steps;
  std::int64_t last_end = 0;
  std::vector<std::int64_t> first_calls;
  for (int rank = 0; rank < options.ranks; ++rank) {
    storage::RankInfo info;
    info.run_id = run_id;
    info.rank = rank;
    info.host = "node" + std::to_string(rank / 2);
    info.pid = 1000 + rank;
    info.device = "cpu";
    const std::int64_t rank_id = writer.addRank(info);
    storage::CommInfo comm;
    comm.rank_id = rank_id;
    comm.key = "world";
    comm.backend = Backend::Mpi;
    comm.size = options.ranks;
    comm.comm_rank = rank;
    const std::int64_t comm_id = writer.addComm(comm);
    std::vector<storage::CallRecord> calls =
        gradscope::testing::syntheticRankCalls(job, rank, rank_id, comm_id);
    for (const storage::CallRecord& call : calls) last_end = std::max(last_end, call.end_ns);
    first_calls.push_back(writer.appendCalls(calls));
  }
  // Three strategies at four sizes, eight rows each (ranks × explored calls), with errors.
  const char* strategies[] = {"sum/native", "sum/rs_ag", "sum/native/bf16"};
  const double speed[] = {1.0, 0.8, 0.6};
  const double error[] = {1e-7, 1.2e-7, 3e-3};
  for (int s = 0; s < 3; ++s) {
    for (const std::int64_t bytes :
         {std::int64_t{4} << 10, std::int64_t{256} << 10, std::int64_t{1} << 20, std::int64_t{25} << 20}) {
      for (int row = 0; row < 8; ++row) {
        storage::Measurement m;
        m.run_id = run_id;
        m.rank_id = row % options.ranks;
        m.strategy = strategies[s];
        m.api = Api::MpiAllreduce;
        m.dtype = DType::Fp32;
        m.bytes = bytes;
        m.world = options.ranks;
        m.reps = 5;
        const double base = (20e3 + static_cast<double>(bytes) * 0.4) * speed[s] * options.slowdown;
        m.median_ns = base * (1 + 0.01 * row);
        m.min_ns = m.median_ns * 0.95;
        m.p90_ns = m.median_ns * 1.05;
        m.max_ns = m.median_ns * 1.2;
        m.algbw_gbs = static_cast<double>(bytes) / m.median_ns;
        m.busbw_gbs = m.algbw_gbs * 2 * (options.ranks - 1) / options.ranks;
        m.rel_l2_error = error[s];
        m.cosine = 1 - error[s];
        writer.addMeasurement(m);
      }
    }
  }
  std::vector<storage::ConsensusRecord> consensus;
  for (int step = 0; step < options.steps; ++step) {
    for (int rank = 0; rank < options.ranks; ++rank) {
      storage::ConsensusRecord r;
      r.rank_id = rank;
      r.step = step;
      r.alpha = 1.0 / options.ranks + 0.01 * (rank - 1.5) * (1 + 0.1 * step);
      r.cosine_to_mean = 0.9 - 0.02 * rank + 0.005 * step;
      r.grad_norm = 1.0 + 0.1 * rank;
      r.diversity = 1.3 + 0.05 * step;
      consensus.push_back(r);
    }
  }
  writer.appendConsensus(consensus);
  std::vector<storage::AppliedCall> applied;
  for (std::int64_t id = first_calls[0]; id < first_calls[0] + 10; ++id) applied.push_back({id, "sum/rs_ag"});
  writer.appendApplied(applied);
  if (options.finish) {
    writer.finish(last_end);
  } else {
    writer.commit();
  }
  return path;
}

std::string writeEmptyFile(const QTemporaryDir& dir) {
  const std::string path = inDir(dir, "empty.db");
  std::ofstream(path).close();
  return path;
}

std::string writeTextFile(const QTemporaryDir& dir) {
  const std::string path = inDir(dir, "text.db");
  std::ofstream(path) << "timestamp,rank,bytes\n1,0,4096\n";
  return path;
}

std::string writeForeignSqlite(const QTemporaryDir& dir) {
  const std::string path = inDir(dir, "foreign.db");
  exec(path,
       "CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO photos VALUES (1, 'cat');");
  return path;
}

std::string writeTruncatedTrace(const QTemporaryDir& dir) {
  const std::string path = inDir(dir, "truncated.db");
  writeTestTrace(path);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  return path;
}

std::string writeNewerSchemaTrace(const QTemporaryDir& dir) {
  const std::string path = inDir(dir, "newer.db");
  writeTestTrace(path);
  exec(path, "PRAGMA user_version = 999;");
  return path;
}

ObservedRuns writeObservedRuns(const QTemporaryDir& dir) {
  const auto write = [&](const std::string& name, const gradscope::testing::SyntheticJob& job) {
    std::vector<std::string> files;
    for (int rank = 0; rank < job.ranks; ++rank) {
      files.push_back(inDir(dir, (name + "-rank-" + std::to_string(rank) + ".db").c_str()));
      gradscope::testing::writeSyntheticRank(files.back(), job, rank);
    }
    const std::string merged = inDir(dir, (name + ".db").c_str());
    storage::mergeTraces(files, merged, {});
    return merged;
  };
  gradscope::testing::SyntheticJob job;
  job.steps = 40;
  ObservedRuns runs;
  runs.before = write("before", job);
  job.seed = 7;                   // the same job, other noise,
  job.model_bytes = 200ll << 20;  // and twice the gradients: twice the reductions' time, exposed
  runs.after = write("after", job);
  return runs;
}

}  // namespace gradscope::gui::testing
