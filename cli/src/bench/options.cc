// gradscope bench: the command line, the sweep's sizes and the choice of strategies.

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "gradscope/cli/bench.h"
#include "gradscope/comm/communicator.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/units.h"
#include "gradscope/methods/local_sum.h"

namespace gradscope::cli::bench {
namespace {

constexpr int kExitUsage = 2;

struct DTypeSpelling {
  std::string_view name;
  DType dtype;
};

// nccl-tests' names first (the ones printed), then the short forms used elsewhere in gradscope.
constexpr DTypeSpelling kDTypeSpellings[] = {
    {"float", DType::Fp32}, {"double", DType::Fp64}, {"half", DType::Fp16}, {"bfloat16", DType::Bf16},
    {"fp32", DType::Fp32},  {"fp64", DType::Fp64},   {"fp16", DType::Fp16}, {"bf16", DType::Bf16},
};

std::optional<DType> parseBenchDType(std::string_view text) {
  for (const auto& spelling : kDTypeSpellings)
    if (spelling.name == text) return spelling.dtype;
  return std::nullopt;
}

std::string joinArguments(int argc, const char* const* argv) {
  std::string line = "gradscope bench";
  for (int i = 1; i < argc; ++i) {
    line += ' ';
    line += argv[i];
  }
  return line;
}

// Checks that need the parsed values together; throws Error with the line to print.
void validate(const BenchOptions& options, const std::string& min_text, const std::string& max_text) {
  if (options.min_bytes > options.max_bytes)
    fail("-b {} is larger than -e {}; swap them", min_text, max_text);
  if (options.step_bytes == 0 && options.step_factor < 2)
    fail("-f {} never grows the size; use a factor of 2 or more, or -i BYTES", options.step_factor);
  if (options.step_bytes == 0 && options.min_bytes == 0 && options.max_bytes > 0)
    fail("-b 0 with -f never grows; start at -b 1 or more, or step with -i BYTES");
  if (options.iters < 1) fail("-n {}: need at least one timed iteration", options.iters);
  if (options.warmup_iters < 0) fail("-w {}: warm-up iterations cannot be negative", options.warmup_iters);
  if (options.inputs < 1) fail("-k {}: a local sum needs at least one input", options.inputs);
}

}  // namespace

std::string_view benchDTypeName(DType dtype) {
  for (const auto& spelling : kDTypeSpellings)
    if (spelling.dtype == dtype) return spelling.name;
  return name(dtype);
}

ParsedArguments parseBenchArguments(int argc, const char* const* argv) {
  CLI::App app{
      "gradscope bench: time aggregation strategies over a sweep of buffer sizes (nccl-tests conventions)",
      "gradscope bench"};
  app.footer(
      "Launch: mpirun -np N gradscope bench --backend mpi ...; gradscope bench --backend nccl ...\n"
      "(one rank per GPU, under mpirun for several); gradscope bench --backend local ... (sums of K\n"
      "buffers in one process).\n"
      "Exit status: 0 on success, 2 on an error (one line on stderr).");

  BenchOptions options;
  std::string backend, min_text = "8", max_text = "64M", step_text, dtype_text = "float";
  int check = 1;
  bool csv = false, json = false, no_progress = false;
  app.add_option("--backend", backend, "mpi, nccl or local (default: mpi under an MPI launcher, else local)")
      ->check(CLI::IsMember({"mpi", "nccl", "local"}));
  app.add_option("-b,--minbytes", min_text, "Smallest size (8, 1K, 64M: powers of 1024)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", max_text, "Largest size")->capture_default_str();
  auto* factor = app.add_option("-f,--stepfactor", options.step_factor, "Multiply the size by this factor")
                     ->capture_default_str();
  auto* step = app.add_option("-i,--stepbytes", step_text, "Add this many bytes instead of multiplying");
  factor->excludes(step);
  app.add_option("-n,--iters", options.iters, "Timed iterations per point")->capture_default_str();
  app.add_option("-w,--warmup_iters", options.warmup_iters, "Untimed iterations before them")
      ->capture_default_str();
  app.add_option("-d,--datatype", dtype_text, "float, double, half or bfloat16 (also fp32, fp64, fp16, bf16)")
      ->capture_default_str();
  app.add_option("-c,--check", check, "1: check results (#wrong, error vs fp64), 0: time only")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  app.add_option("--strategies", options.strategies,
                 "Comma-separated strategies, e.g. sum/native,sum/rs_ag/bf16 (default: all that apply)")
      ->delimiter(',');
  app.add_option("-k,--inputs", options.inputs, "Buffers a local sum adds (--backend local)")
      ->capture_default_str();
  auto* csv_flag = app.add_flag("--csv", csv, "CSV on standard output instead of the table");
  app.add_flag("--json", json, "One JSON document on standard output instead of the table")
      ->excludes(csv_flag);
  app.add_option("-o,--output", options.output, "Also write the results to this new trace file (.db)");
  app.add_flag("--no-progress", no_progress, "No progress bar on a terminal");
  std::string threads_text{comm::name(options.mpi_threads)};
  app.add_option("--mpi-threads", threads_text,
                 "Thread support to start MPI with: single (as OSU), funneled, serialized or multiple (as "
                 "mpi4py); above single Open MPI locks around every call")
      ->check(CLI::IsMember({"single", "funneled", "serialized", "multiple"}))
      ->capture_default_str();

  ParsedArguments parsed;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    parsed.message = app.help();
    return parsed;
  } catch (const CLI::ParseError& error) {
    parsed.exit_code = kExitUsage;
    parsed.message = fmt::format("{} (see gradscope bench --help)", error.what());
    return parsed;
  }

  try {
    options.mpi_threads = *comm::parseMpiThreads(threads_text);
    if (backend == "mpi") options.backend = Backend::Mpi;
    if (backend == "nccl") options.backend = Backend::Nccl;
    if (backend == "local") options.backend = Backend::Local;
    options.min_bytes = parseBytes(min_text);
    options.max_bytes = parseBytes(max_text);
    if (!step_text.empty()) {
      options.step_bytes = parseBytes(step_text);
      if (options.step_bytes == 0) fail("-i 0 never grows the size; give a step of 1 byte or more");
    }
    const auto dtype = parseBenchDType(dtype_text);
    if (!dtype) fail("-d {}: not a data type bench runs; use float, double, half or bfloat16", dtype_text);
    options.dtype = *dtype;
    options.check = check == 1;
    options.format = csv ? OutputFormat::Csv : json ? OutputFormat::Json : OutputFormat::Table;
    options.progress = !no_progress;
    options.command_line = joinArguments(argc, argv);
    validate(options, min_text, max_text);
  } catch (const Error& error) {
    parsed.exit_code = kExitUsage;
    parsed.message = error.what();
    return parsed;
  }
  parsed.options = std::move(options);
  return parsed;
}

std::vector<std::uint64_t> sweepSizes(const BenchOptions& options) {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t size = options.min_bytes; size <= options.max_bytes;) {
    sizes.push_back(size);
    const std::uint64_t next =
        options.step_bytes > 0 ? size + options.step_bytes : size * options.step_factor;
    if (next <= size) break;  // -b 0 -e 0, or wrapped around
    size = next;
  }
  return sizes;
}

std::vector<std::string> selectStrategies(const BenchOptions& options, const comm::Communicator* comm) {
  const bool local = comm == nullptr;
  if (local && !methods::localSumSupports(options.dtype))
    fail("local sums do not take {} input", benchDTypeName(options.dtype));
  if (options.strategies.empty()) {
    std::vector<std::string> names;
    if (local) {
      for (const auto method : methods::kLocalSumMethods) names.emplace_back(methods::strategyName(method));
    } else {
      for (const auto& name : comm::applicableStrategies(*comm, options.dtype)) names.push_back(name.text());
    }
    return names;
  }
  checkStrategyNames(options.strategies, local ? Backend::Local : comm->backend());
  return options.strategies;
}

void checkStrategyNames(const std::vector<std::string>& names, Backend backend) {
  for (const auto& text : names) {
    const bool local_name = text.starts_with("local/");
    if (local_name && !methods::parseLocalSumMethod(text))
      fail(
          "unknown strategy '{}'; local sums are local/add_n, local/tree, local/accumulate_n and local/kahan",
          text);
    if (!local_name) {
      std::string why;
      const auto name = parseStrategyName(text, &why);
      if (!name) throw Error(why);
      if (name->aggregator == Aggregator::Async)
        fail(
            "{} returns an earlier step's sum: its time is the step's, not the call's; explore it in the job "
            "(gradscope run --mode explore; docs/async.md)",
            text);
    }
    if (backend == Backend::Local && !local_name)
      fail("{} is a distributed strategy; run it with --backend mpi or nccl", text);
    if ((backend == Backend::Mpi || backend == Backend::Nccl) && local_name)
      fail("{} is a local sum; run it with --backend local", text);
  }
}

}  // namespace gradscope::cli::bench
