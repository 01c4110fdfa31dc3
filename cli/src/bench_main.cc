// gradscope-bench: `gradscope bench` (the gradscope command execs it, so that the command itself needs
// neither MPI nor CUDA). Parses the arguments, opens the communicator, runs the sweep from
// gradscope_bench_lib and prints on rank 0.

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "gradscope/cli/bench.h"
#include "gradscope/comm/communicator.h"
#include "gradscope/comm/mpi.h"
#include "gradscope/comm/nccl.h"
#include "gradscope/common/launcher.h"
#include "gradscope/common/units.h"

namespace {

using namespace gradscope;
using namespace gradscope::cli::bench;

constexpr int kExitError = 2;

// The rank the launcher gave this process, known before MPI is initialised (argument errors are found
// then, identically on every rank, and only rank 0 should print them). 0 outside a launcher.
int launcherRank() {
  const std::optional<Launch> launch = detectLaunch(processEnvironment());
  return launch ? launch->rank : 0;
}

bool underLauncher() {
  return detectLaunch(processEnvironment()).has_value();
}

void printError(const std::string& message) {
  fmt::print(stderr, "gradscope bench: {}\n", message);
}

std::size_t terminalColumns(int fd) {
  winsize size{};
  if (ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

// Whether the process that started this one writes its stdout to a terminal: on Linux, its fd 1 is a
// terminal device. For a rank on mpirun's own node the parent is mpirun; elsewhere it is a daemon whose
// stdout is no terminal.
bool parentStdoutIsTerminal() {
  std::error_code error;
  const std::string target =
      std::filesystem::read_symlink(fmt::format("/proc/{}/fd/1", getppid()), error).string();
  return !error && (target.starts_with("/dev/pts/") || target.starts_with("/dev/tty"));
}

// Where the progress line goes, if anywhere. Alone: stderr, when it is a terminal. Under a launcher
// neither of the rank's own streams tells: Open MPI gives every rank's stdout a pty of its own, whatever
// mpirun's stdout is, and its stderr a pipe (so that with stderr alone the line never showed). There the
// line goes to stdout, which mpirun forwards partial line by partial line, when mpirun's own stdout is
// a terminal; never into a CSV piped to a file.
std::FILE* progressStream(bool wanted) {
  if (!wanted) return nullptr;
  if (underLauncher()) return isatty(STDOUT_FILENO) == 1 && parentStdoutIsTerminal() ? stdout : nullptr;
  return isatty(STDERR_FILENO) == 1 ? stderr : nullptr;
}

// Rank 0's view of the run: prints points as they arrive, keeps them for JSON and the trace file,
// and draws the progress line on a terminal (erased before each output line, so that the two never
// interleave when they share the terminal).
class Printer {
 public:
  Printer(const BenchOptions& options, const BenchContext& context,
          const std::vector<std::string>& strategies, std::size_t total_points)
      : options_(options),
        context_(context),
        table_(strategies),
        total_(total_points),
        progress_(progressStream(options.progress)),
        columns_(progress_ != nullptr ? terminalColumns(fileno(progress_)) - 1 : 0) {}

  void start() {
    if (options_.format == OutputFormat::Table) emit(table_.header(context_, options_));
    if (options_.format == OutputFormat::Csv) emit(formatCsvHeader());
    drawProgress("");
  }

  void add(const BenchPoint& point) {
    points_.push_back(point);
    if (options_.format == OutputFormat::Table) emit(table_.row(point));
    if (options_.format == OutputFormat::Csv) emit(formatCsvRow(point, context_, options_.dtype));
    drawProgress(fmt::format("{} {}", point.strategy, formatBytes(point.bytes)));
  }

  void finish() {
    erase();
    if (options_.format == OutputFormat::Json) emit(formatJson(context_, options_, points_));
  }

 private:
  void emit(const std::string& text) {
    erase();
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }
  void erase() {
    if (progress_ != nullptr) std::fputs("\r\033[K", progress_);
  }
  void drawProgress(const std::string& label) {
    if (progress_ == nullptr) return;
    std::fputs(formatProgress(points_.size(), total_, label, columns_).c_str(), progress_);
    std::fflush(progress_);
  }

  const BenchOptions& options_;
  const BenchContext& context_;
  TableFormat table_;
  std::size_t total_;
  std::FILE* progress_;  // null: no progress line
  std::size_t columns_;
  std::vector<BenchPoint> points_;
};

int runLocal(const BenchOptions& options) {
  const auto strategies = selectStrategies(options, nullptr);
  const BenchContext context = localContext(options);
  std::optional<BenchTraceWriter> trace;
  if (!options.output.empty()) {
    trace.emplace(options.output, context, options);
    trace->addRanks({getpid()}, "cpu");
  }
  Printer printer(options, context, strategies, sweepSizes(options).size() * strategies.size());
  printer.start();
  runLocalSweep(options, strategies, [&](const BenchPoint& point) {
    printer.add(point);
    if (trace) trace->addPoint(point, options.dtype);
  });
  printer.finish();
  if (trace) trace->finish();
  return 0;
}

int runDistributed(comm::Communicator& comm, const BenchOptions& options) {
  const bool root = comm.rank() == 0;
  const auto strategies = selectStrategies(options, &comm);
  const BenchContext context = commContext(comm);
  CommSweep sweep(comm, options, strategies);

  // Rank 0 alone writes the trace; whether it could create the file decides for every rank.
  std::optional<BenchTraceWriter> trace;
  std::string trace_error;
  if (root && !options.output.empty()) {
    try {
      trace.emplace(options.output, context, options);
    } catch (const Error& error) {
      trace_error = error.what();
    }
  }
  if (comm.allReduceMax(trace_error.empty() ? 0.0 : 1.0) > 0) throw BenchError(trace_error, root);
  const auto pids = comm.allGatherScalars(static_cast<double>(getpid()));
  if (trace) {
    std::vector<std::int64_t> rank_pids(pids.begin(), pids.end());
    trace->addRanks(rank_pids, comm.memory() == comm::Memory::Device ? "cuda" : "cpu");
  }

  std::optional<Printer> printer;
  if (root) {
    printer.emplace(options, context, strategies, sweepSizes(options).size() * strategies.size());
    printer->start();
  }
  sweep.run([&](const BenchPoint& point) {
    if (printer) printer->add(point);
    if (trace) trace->addPoint(point, options.dtype);
  });
  if (printer) printer->finish();
  if (trace) trace->finish();
  return 0;
}

// Which backend, and whether it can run here; throws Error with the line to print.
Backend resolveBackend(Backend requested) {
  const Backend backend = requested != Backend::Unknown ? requested
                          : comm::underMpiLauncher()    ? Backend::Mpi
                                                        : Backend::Local;
  std::string reason;
  if (backend == Backend::Mpi) {
    if (!comm::mpiBuilt(&reason)) fail("--backend mpi: {}", reason);
    if (!comm::underMpiLauncher())
      fail("--backend mpi needs an MPI launcher: mpirun -np N gradscope bench --backend mpi ...");
  }
  if (backend == Backend::Nccl && !comm::ncclAvailable(&reason)) fail("--backend nccl: {}", reason);
  return backend;
}

}  // namespace

int main(int argc, char** argv) {
  const bool launcher_root = launcherRank() == 0;
  const ParsedArguments parsed = parseBenchArguments(argc, argv);
  if (!parsed.options) {
    if (launcher_root && parsed.exit_code == 0) fmt::print("{}", parsed.message);
    if (launcher_root && parsed.exit_code != 0) printError(parsed.message);
    return parsed.exit_code;
  }
  BenchOptions options = *parsed.options;

  // Until the communicator exists, every failure is the same on every rank: the launcher's rank 0
  // reports it. Afterwards rank 0 reports the failures all ranks share, and BenchError says who
  // reports the others.
  bool report = launcher_root;
  try {
    checkStrategyNames(options.strategies, options.backend);
    options.backend = resolveBackend(options.backend);
    if (options.backend == Backend::Local) return runLocal(options);
    const auto comm =
        options.backend == Backend::Mpi ? comm::mpiWorld(options.mpi_threads) : comm::ncclWorld();
    report = comm->rank() == 0;
    return runDistributed(*comm, options);
  } catch (const BenchError& error) {
    if (error.reportHere()) printError(error.what());
  } catch (const Error& error) {
    if (report) printError(error.what());
  } catch (const std::exception& error) {
    printError(fmt::format("internal error: {}", error.what()));
  }
  return kExitError;
}
