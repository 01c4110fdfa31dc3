#pragma once

// `gradscope bench`: an nccl-tests-style sweep of aggregation strategies over buffer sizes.
//
// The pieces the gradscope-bench executable wires together, public so that tests link them:
// - parseBenchArguments(): the command line (nccl-tests spelling: -b -e -f/-i -n -w -d -c) into
//   BenchOptions, with every check that needs no communicator. It is a pure function of the arguments,
//   so every rank of a job reaches the same verdict and no collective is needed to agree on it.
// - sweepSizes(), selectStrategies(): what will be measured.
// - CommSweep (MPI, NCCL) and runLocalSweep() (local multi-tensor sums): the measurements.
// - TableFormat, formatCsv*(), formatJson() and BenchTraceWriter: the outputs.
//
// Measurement (docs/benchmarks.md, "gradscope bench", has the user-facing version):
// - Timing. MPI: OSU's osu_allreduce loop — a steady clock read before and after each call, a barrier
//   between iterations, the per-rank average over `iters` calls. NCCL: nccl-tests' loop — `iters` calls
//   enqueued back to back, one stream synchronisation, the average. Local sums: each call timed on its
//   own, averaged. Every loop follows `warmup_iters` untimed calls. The per-rank averages are gathered;
//   a point reports their min, median, 90th percentile and max.
// - algbw = bytes / median time (decimal GB/s); busbw = algbw · busBandwidthFactor(AllReduce, ranks)
//   for the distributed strategies, and bytes moved in memory (localSumBytesMoved) / median time for
//   the local sums.
// - Checks (unless check is off). #wrong: lossless strategies reduce *verifiable* inputs (small
//   positive integers, for which every order of addition is exact) and every result element must equal
//   the exact sum bit for bit; #wrong counts the elements that differ, summed over ranks. Lossy
//   strategies (wire precisions, adacons, adasum) have no #wrong. Error metrics: every strategy also
//   reduces pseudo-random inputs, compared (error_metrics.h) with an fp64 reference that every rank
//   computes by regenerating all ranks' inputs: the fp64 sum for sum/*, methods::adacons and
//   methods::adasum for the adaptive aggregators; a point reports the worst rank.
// - Collective safety: every decision that changes which collectives run is taken from arguments that
//   all ranks share; a failure on some ranks (a strategy that cannot be built, buffers that cannot be
//   allocated, an output that cannot be created) is agreed on collectively before anyone leaves.
// - Memory per rank and size: two communicator buffers, three host copies, the fp64 reference, and for
//   adacons/adasum every rank's fp32 input (N · size): the adaptive references need all of them.
// - Results are out-of-place only: strategies leave their input unchanged, so every call reduces the
//   same data (an in-place loop would grow it each call, to Inf for fp16 and the adaptive aggregators'
//   refusal of non-finite norms).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradscope/comm/mpi.h"
#include "gradscope/common/error.h"
#include "gradscope/common/types.h"
#include "gradscope/methods/error_metrics.h"

namespace gradscope::comm {
class Communicator;
}

namespace gradscope::cli::bench {

enum class OutputFormat { Table, Csv, Json };

struct BenchOptions {
  Backend backend = Backend::Unknown;  // Unknown: MPI under an MPI launcher, else Local
  std::uint64_t min_bytes = 8;
  std::uint64_t max_bytes = 64ull << 20;
  std::uint64_t step_factor = 2;  // used when step_bytes == 0
  std::uint64_t step_bytes = 0;   // > 0: arithmetic steps
  int iters = 20;
  int warmup_iters = 5;
  DType dtype = DType::Fp32;
  bool check = true;
  std::vector<std::string> strategies;  // as given; empty: every applicable strategy
  int inputs = 8;                       // K, the buffers a local sum adds
  OutputFormat format = OutputFormat::Table;
  std::string output;  // trace file to create; empty: none
  bool progress = true;
  // --backend mpi: the thread support asked of MPI (comm::mpiWorld; single, as OSU's benchmarks start it).
  comm::MpiThreads mpi_threads = comm::MpiThreads::Single;
  std::string command_line;  // the arguments as typed, for the trace store
};

// What parsing decided: run with `options`, or exit with `exit_code` after printing `message`
// (--help text to standard output when exit_code is 0, else one error line for standard error,
// without the "gradscope bench: " prefix).
struct ParsedArguments {
  std::optional<BenchOptions> options;
  int exit_code = 0;
  std::string message;
};

ParsedArguments parseBenchArguments(int argc, const char* const* argv);

// nccl-tests' sweep: min, then ×factor (or +step) while <= max.
std::vector<std::uint64_t> sweepSizes(const BenchOptions& options);

// "float", "double", "half", "bfloat16" (nccl-tests' names) for the dtypes bench accepts.
std::string_view benchDTypeName(DType dtype);

// A failure that some ranks saw and all agreed on (collectively), one line for the user. `reportHere()`
// is true on the one rank that should print it (the lowest rank that saw it), so a job prints it once.
// Failures that every rank sees alike are plain gradscope::Error, printed by rank 0.
class BenchError : public Error {
 public:
  BenchError(const std::string& message, bool report_here) : Error(message), report_here_(report_here) {}
  bool reportHere() const { return report_here_; }

 private:
  bool report_here_;
};

// Time of one point over ranks, in microseconds.
struct RankTimes {
  double min_us = 0, median_us = 0, p90_us = 0, max_us = 0;
};

struct BenchPoint {
  std::string strategy;
  std::uint64_t bytes = 0;  // count × element size: what was reduced
  std::uint64_t count = 0;  // elements
  RankTimes time;           // each rank's average call (OSU, nccl-tests): the table, CSV and JSON `time`
  RankTimes median_call;    // each rank's median call, which one stalled call does not move: the trace's
                            // times and what the tuner models (the nccl-tests loop times only the
                            // average: equal to `time` there)
  int reps = 0;             // timed calls per rank
  double algbw_gbs = 0, busbw_gbs = 0;
  std::optional<std::uint64_t> wrong;          // unset: lossy strategy, or checks off
  std::optional<methods::ErrorMetrics> error;  // unset: checks off
};

// What the header lines and the trace's runs row say about the run.
struct BenchContext {
  Backend backend = Backend::Unknown;
  std::string description;  // communicator description, or "local sums of K inputs, N threads (isa)"
  int world_size = 1;
  std::string timing;  // how a point's time was taken, one line
};

using PointCallback = std::function<void(const BenchPoint&)>;

// Strategies to measure, in order: the given names, or every applicable one (comm == nullptr: the
// local sums). Throws gradscope::Error, the same on every rank, for a name that does not parse or
// belongs to another backend, and for a dtype the local sums do not take.
std::vector<std::string> selectStrategies(const BenchOptions& options, const comm::Communicator* comm);

// The faults of the names themselves, found before any backend starts, so that a misspelt strategy is
// reported first rather than after the launcher or the GPU it would need: names that do not parse, and
// (for a backend that is known, not Unknown) names of the other kind. Throws gradscope::Error.
void checkStrategyNames(const std::vector<std::string>& names, Backend backend);

// The sweep on a communicator. Every call is collective: make it on every rank with the same options.
class CommSweep {
 public:
  // Builds every strategy (so that one that does not apply is reported before any output); throws
  // BenchError when one cannot be built on some rank.
  CommSweep(comm::Communicator& comm, const BenchOptions& options,
            const std::vector<std::string>& strategies);
  ~CommSweep();
  CommSweep(const CommSweep&) = delete;
  CommSweep& operator=(const CommSweep&) = delete;

  // Measures every (size, strategy) point, sizes outermost; `on_point` is called on every rank after
  // each point, with values that are the same on every rank.
  void run(const PointCallback& on_point);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The sweep of the local sums, in this process.
void runLocalSweep(const BenchOptions& options, const std::vector<std::string>& strategies,
                   const PointCallback& on_point);

BenchContext localContext(const BenchOptions& options);
BenchContext commContext(const comm::Communicator& comm);

// Outputs. The table and CSV are written a line at a time as points arrive; JSON is one document.
// The table is aligned like nccl-tests': its strategy column is as wide as the longest name measured.
class TableFormat {
 public:
  explicit TableFormat(const std::vector<std::string>& strategies);
  // The "#" lines: tool, backend, ranks, dtype, iterations, how time and bandwidth were taken, columns.
  std::string header(const BenchContext& context, const BenchOptions& options) const;
  std::string row(const BenchPoint& point) const;

 private:
  std::size_t strategy_width_;
};

std::string formatCsvHeader();
std::string formatCsvRow(const BenchPoint& point, const BenchContext& context, DType dtype);
std::string formatJson(const BenchContext& context, const BenchOptions& options,
                       const std::vector<BenchPoint>& points);

// One progress line for a terminal: "[#####.....] 12/48 sum/rs_ag 1 MiB" padded to `width` columns.
std::string formatProgress(std::size_t done, std::size_t total, const std::string& label, std::size_t width);

// Writes the run (mode "bench") and one Measurement per point to a new trace file. Throws
// gradscope::Error naming the file when it cannot be created or written.
class BenchTraceWriter {
 public:
  BenchTraceWriter(const std::string& path, const BenchContext& context, const BenchOptions& options);
  ~BenchTraceWriter();
  BenchTraceWriter(const BenchTraceWriter&) = delete;
  BenchTraceWriter& operator=(const BenchTraceWriter&) = delete;

  // One rank row per rank (pids in rank order; the host is known for this process only).
  void addRanks(const std::vector<std::int64_t>& pids, const std::string& device);
  void addPoint(const BenchPoint& point, DType dtype);
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradscope::cli::bench
