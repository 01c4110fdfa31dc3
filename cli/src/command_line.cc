// The gradscope command line: parses arguments and hands over to the libraries (command_line.h).

#include "command_line.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "gradscope/cli/check.h"
#include "gradscope/cli/recommend.h"
#include "gradscope/cli/report.h"
#include "gradscope/cli/run.h"
#include "gradscope/common/error.h"
#include "gradscope/common/job_environment.h"
#include "gradscope/common/units.h"
#include "gradscope/common/version.h"
#include "gradscope/storage/export.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/trace_input.h"
#include "gradscope/tuner/exporters.h"

namespace {

using gradscope::cli::kExitError;

// `gradscope bench ARGS` runs gradscope-bench from this executable's directory with ARGS unchanged:
// bench links MPI and CUDA, which the gradscope command must not need, and an exec (rather than a child
// process) keeps `mpirun -np N gradscope bench ...` one process per rank. Returns only on failure.
int execBench(int argc, char** argv) {
  const auto bench = gradscope::cli::siblingExecutable(argv[0], "gradscope-bench");
  std::vector<char*> arguments{const_cast<char*>("gradscope bench")};
  for (int i = 2; i < argc; ++i) arguments.push_back(argv[i]);
  arguments.push_back(nullptr);
  execv(bench.c_str(), arguments.data());
  if (errno == ENOENT)
    fmt::print(
        stderr,
        "gradscope: bench is not part of this build ({} is missing); build the gradscope_bench target\n",
        bench.string());
  else fmt::print(stderr, "gradscope: cannot run {}: {}\n", bench.string(), gradscope::errnoMessage(errno));
  return kExitError;
}

// traces.db -> traces.json; a run's directory traces/ -> traces.json beside it, not a hidden file inside.
std::string defaultExportPath(const std::string& input, const std::string& extension) {
  std::filesystem::path path = std::filesystem::path(input).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  if (std::filesystem::is_directory(path)) {
    path += extension;
    return path.string();
  }
  path.replace_extension(extension);
  return path.string();
}

}  // namespace

std::filesystem::path gradscope::cli::siblingExecutable(const char* argv0, const char* name) {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  return (error ? std::filesystem::path(argv0) : self).parent_path() / name;
}

int gradscope::cli::commandLine(int argc, char** argv, storage::MergeLink* merge_link) {
  using namespace gradscope;
  // Before CLI11 sees them: every argument after "bench", --help included, belongs to gradscope-bench.
  if (argc >= 2 && std::string_view(argv[1]) == "bench") return execBench(argc, argv);

  CLI::App app{"gradscope: observe, measure and tune gradient aggregation in distributed training"};
  app.set_version_flag("--version", std::string("gradscope ") + kVersion);
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 on success, 2 on an error (one line on stderr says what and how to fix it).\n"
      "gradscope run returns the job's exit code instead (127 when the command does not exist).\n"
      "gradscope check returns 1 on a regression and 3 on a changed recommendation (--fail-on-change).\n"
      "The viewer is a program of its own: gradscope-gui TRACE.db (timelines, comparisons, "
      "recommendations).");

  // bench: listed for --help; main() hands it to gradscope-bench before parsing.
  app.add_subcommand(
      "bench",
      "Time aggregation strategies over a sweep of sizes, nccl-tests style (MPI, NCCL or local "
      "sums; gradscope bench --help)");

  // run
  cli::RunOptions run_options;
  int run_wait_seconds = static_cast<int>(run_options.wait.count());
  std::string run_mode(modeName(run_options.mode));
  std::vector<std::string> mode_names;
  for (const Mode mode : kModes) mode_names.emplace_back(modeName(mode));
  auto* run = app.add_subcommand(
      "run",
      "Run a job with the agent preloaded, merge its per-rank traces and print a summary: gradscope run "
      "[-o DIR] -- CMD [ARGS...]");
  run->add_option("-o,--output", run_options.output_directory,
                  "Directory for the traces (created 0700); default gradscope-YYYYmmdd-HHMMSS, or "
                  "gradscope-<job id> when started by a launcher");
  run->add_flag("-f,--force", run_options.force, "Use an output directory that already holds traces");
  run->add_option("--wait", run_wait_seconds,
                  "Started by a launcher: seconds rank 0 waits for the other ranks' traces")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  run->add_option("--top", run_options.top_calls, "Slowest calls to list in the summary")
      ->capture_default_str();
  run->add_option("--mode", run_mode,
                  "observe: record every collective; explore: also time every aggregation strategy on "
                  "copies of sampled gradient buffers; apply: replace reductions as --recommendation says")
      ->check(CLI::IsMember(mode_names))
      ->capture_default_str();
  run->add_option("--recommendation", run_options.recommendation,
                  "Recommendation file (JSON, from gradscope recommend) that apply mode follows");
  run->add_flag("--allow-semantic-change", run_options.allow_semantic_change,
                "Apply mode: let AdaCons and AdaSum rules replace sums (they change what the job computes)");
  run->add_option("--validate", run_options.validate_window,
                  "Apply mode: follow the plan in alternate windows of N steps (when the job marks them) or "
                  "N calls per communicator, and measure what it saves on the step against the prediction "
                  "(stored in the trace; check --min-step-gain)")
      ->check(CLI::PositiveNumber);
  run->add_option("--explore-budget", run_options.explore_budget,
                  "Explore mode: the largest fraction of the run spent exploring (e.g. 0.1 or 10%)");
  // The job's command: everything from the first argument that is not one of run's options on, or after
  // "--" (split off before CLI11 parses: CLI11 would take the job's options for its own).
  run->prefix_command();
  std::vector<std::string> job_command;
  int parsed_arguments = argc;
  if (argc >= 2 && std::string_view(argv[1]) == "run")
    for (int i = 2; i < argc; ++i)
      if (std::string_view(argv[i]) == "--") {
        job_command.assign(argv + i + 1, argv + argc);
        parsed_arguments = i;
        break;
      }

  // report
  std::string report_file;
  cli::ReportOptions report_options;
  auto* report = app.add_subcommand("report",
                                    "What happened: time in collectives per API and size, slowest calls, "
                                    "per-rank spread, dropped events");
  report->add_option("FILE", report_file, "Trace file (.db), or a run's directory of rank files")->required();
  report->add_option("--top", report_options.top_calls, "Slowest calls to list")->capture_default_str();

  // recommend
  cli::RecommendCommand recommend_command;
  int recommend_world = 0;
  auto* recommend = app.add_subcommand(
      "recommend",
      "Recommend the aggregation strategy per all-reduce size from measurements and the job's calls");
  recommend
      ->add_option("FILES", recommend_command.inputs,
                   "Trace files (.db) with measurements, or runs' directories of rank files")
      ->required();
  recommend
      ->add_option("--max-rel-error", recommend_command.max_rel_error,
                   "Allow lossy strategies whose worst measured relative L2 error is at most this "
                   "(default 0: lossless only)")
      ->check(CLI::NonNegativeNumber);
  recommend->add_flag("--allow-semantic-change", recommend_command.allow_semantic_change,
                      "Allow AdaCons and AdaSum (they change what the job computes)");
  recommend
      ->add_option("--world", recommend_world,
                   "Predict for this world size from fits over the measured ones (a prediction)")
      ->check(CLI::PositiveNumber);
  recommend
      ->add_option(
          "--format", recommend_command.format,
          tuner::formatNames() +
              " (docs/deploy.md: who reads each; predictions: CSV of every model's prediction per size)")
      ->capture_default_str();
  recommend->add_option("-o,--output", recommend_command.output, "Output file (default: standard output)");
  recommend->add_flag("!--no-store", recommend_command.store,
                      "Do not store the recommendation in the first trace file");

  // check
  cli::CheckCommandOptions check_options;
  auto* check = app.add_subcommand(
      "check",
      "CI gate: compare measurements with a baseline; exit 1 on a regression beyond noise and tolerance");
  check->add_option("--baseline", check_options.baseline, "Baseline trace (.db)");
  check->add_option("CURRENT", check_options.current, "Current trace (.db)")->required();
  check->add_option("--tolerance", check_options.tolerance, "Allowed slowdown, e.g. 5% or 0.05")
      ->capture_default_str();
  check->add_option("--summary", check_options.summary_path,
                    "Append a markdown summary to FILE (e.g. $GITHUB_STEP_SUMMARY)");
  check->add_option("--json", check_options.json_path, "Write the result as JSON to FILE");
  check->add_flag("--fail-on-change", check_options.fail_on_change,
                  "Exit 3 when the recommendation made from the current trace differs from the baseline's");
  check->add_option(
      "--min-step-gain", check_options.min_step_gain,
      "Exit 1 unless the plan of a validated apply run (gradscope run --validate) made the step at "
      "least this much faster over the whole 95% interval of its measurement, e.g. 2% (--baseline may be "
      "left out)");

  // merge
  std::vector<std::string> merge_inputs;
  std::string merge_output;
  storage::MergeOptions merge_options;
  auto* merge = app.add_subcommand("merge", "Merge the per-rank trace files of a run into one file");
  merge->add_option("INPUTS", merge_inputs, "Trace files, or directories of them")->required();
  merge->add_option("-o,--output", merge_output, "Merged trace to create")->required();
  merge->add_flag("--allow-different-runs", merge_options.allow_different_runs,
                  "Merge files of different runs (each keeps its own run)");
  merge->add_flag("-f,--force", merge_options.overwrite, "Replace the output if it exists");
  merge->add_option("-j,--jobs", merge_options.jobs, "Threads that read the input files (0: one per core)")
      ->check(CLI::Range(0, 1024))
      ->default_val(0);

  // export
  std::string export_file, export_format, export_table = "calls", export_output;
  bool export_force = false;
  auto* exporter =
      app.add_subcommand("export", "Export a trace for other tools: Perfetto, Chrome trace JSON or CSV");
  exporter->add_option("FILE", export_file, "Trace file (.db), or a run's directory of rank files")
      ->required();
  exporter
      ->add_option("--format", export_format, "perfetto (native protobuf trace), chrome-trace (JSON) or csv")
      ->required()
      ->check(CLI::IsMember({"perfetto", "chrome-trace", "csv"}));
  exporter->add_option("--table", export_table, "CSV only: calls or measurements")
      ->check(CLI::IsMember({"calls", "measurements"}))
      ->capture_default_str();
  exporter->add_option("-o,--output", export_output,
                       "Output file ('-' for standard output); default: FILE with "
                       ".pftrace, .json or .csv");
  exporter->add_flag("-f,--force", export_force, "Replace the output if it exists");

  try {
    app.parse(parsed_arguments, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : kExitError;
  }

  if (*run) {
    run_options.command = run->remaining();
    if (!run_options.command.empty() && run_options.command.front().rfind('-', 0) == 0) {
      fmt::print(stderr, "gradscope: run has no option {}; put the job's command after \"--\"\n",
                 run_options.command.front());
      return kExitError;
    }
    if (parsed_arguments != argc) {
      // `gradscope run CMD ... -- ...`: the "--" was the job's.
      if (!run_options.command.empty()) run_options.command.push_back("--");
      run_options.command.insert(run_options.command.end(), job_command.begin(), job_command.end());
    }
    run_options.wait = std::chrono::seconds(run_wait_seconds);
    run_options.mode = parseMode(run_mode).value();  // IsMember checked it
    if (run_options.mode == Mode::Apply && run_options.recommendation.empty()) {
      fmt::print(stderr,
                 "gradscope: run --mode apply needs --recommendation FILE (made by gradscope recommend)\n");
      return 2;
    }
    if (run_options.mode != Mode::Apply &&
        (!run_options.recommendation.empty() || run_options.allow_semantic_change ||
         run_options.validate_window > 0)) {
      fmt::print(
          stderr,
          "gradscope: --recommendation, --allow-semantic-change and --validate belong to --mode apply\n");
      return 2;
    }
    if (run_options.mode != Mode::Explore && !run_options.explore_budget.empty()) {
      fmt::print(stderr, "gradscope: --explore-budget belongs to --mode explore\n");
      return 2;
    }
    return cli::runJob(run_options, std::cerr);
  }

  try {
    if (*report) {
      const storage::TraceInput input(report_file, 0, merge_link);
      const auto reader = storage::TraceReader::open(input.file());
      report_options.name = input.name();
      cli::writeReport(reader, std::cout, report_options);
      std::cout.flush();
      if (!std::cout) fail("cannot write the report to standard output");
    } else if (*recommend) {
      if (recommend_world > 0) recommend_command.world = recommend_world;
      recommend_command.merge_link = merge_link;
      cli::runRecommend(recommend_command, std::cout, std::cerr);
    } else if (*check) {
      // The recommendation compared by --fail-on-change: the default one (lossless), as
      // `gradscope recommend FILE --format json` makes it, not stored anywhere.
      const cli::RecommendJson recommend_json = [](const std::string& trace) {
        cli::RecommendCommand command;
        command.inputs = {trace};
        command.format = "json";
        command.store = false;
        command.created = "1970-01-01T00:00:00Z";
        std::ostringstream json, notes;
        cli::runRecommend(command, json, notes);
        return json.str();
      };
      return cli::runCheck(check_options, recommend_json, std::cout, std::cerr);
    } else if (*merge) {
      const auto inputs = storage::expandTraceInputs(merge_inputs, merge_output);
      merge_options.link = merge_link;
      const auto summary = storage::mergeTraces(inputs, merge_output, merge_options);
      fmt::print("merged {} file{} ({} run{}, {} rank{}, {} calls, {} measurements{}{}) into {}\n",
                 summary.files, summary.files == 1 ? "" : "s", summary.runs, summary.runs == 1 ? "" : "s",
                 summary.ranks, summary.ranks == 1 ? "" : "s", summary.calls, summary.measurements,
                 summary.steps_detected > 0 ? fmt::format(", {} steps detected", summary.steps_detected) : "",
                 summary.largest_offset_ns > 0
                     ? fmt::format(", clocks of {} host{} aligned (largest offset {})", summary.hosts_aligned,
                                   summary.hosts_aligned == 1 ? "" : "s",
                                   gradscope::formatDuration(static_cast<double>(summary.largest_offset_ns)))
                     : "",
                 merge_output);
    } else if (*exporter) {
      const storage::ExportFormat format = export_format == "perfetto" ? storage::ExportFormat::Perfetto
                                           : export_format == "chrome-trace"
                                               ? storage::ExportFormat::ChromeTrace
                                               : storage::ExportFormat::Csv;
      if (export_output.empty())
        export_output =
            defaultExportPath(export_file, format == storage::ExportFormat::Perfetto      ? ".pftrace"
                                           : format == storage::ExportFormat::ChromeTrace ? ".json"
                                           : export_table == "calls"                      ? ".csv"
                                                                     : ".measurements.csv");
      const storage::TraceInput input(export_file, 0, merge_link);
      const auto reader = storage::TraceReader::open(input.file());
      storage::exportTrace(reader, format, export_table, export_output, export_force);
      if (export_output != "-") fmt::print(stderr, "wrote {}\n", export_output);
    }
  } catch (const Error& error) {
    fmt::print(stderr, "gradscope: {}\n", error.what());
    return kExitError;
  } catch (const std::exception& error) {
    fmt::print(stderr, "gradscope: internal error: {}\n", error.what());
    return kExitError;
  }
  return 0;
}
