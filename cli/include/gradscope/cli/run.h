#pragma once

// `gradscope run [-o DIR] -- CMD [ARGS...]`: runs a job with the agent preloaded, then merges the per-rank
// files and prints a summary. The contract with the agent (environment variables, file locations) is
// docs/agent.md; this header is the command's side of it.
//
// Contract:
// - runJob() returns the job's exit code: its exit status, or 128 + S when it died of signal S. Problems
//   found before the job starts (no agent, an output directory that cannot be used, a command that
//   cannot be run) print one line on `log` and return 2 (127 for a command that does not exist, 126
//   for one that is not executable, as a shell does) without running anything. Problems after the job
//   (no trace written, a failed merge) print one line and never change the exit code; the per-rank files
//   are never deleted.
// - While the job runs, SIGINT, SIGTERM and SIGHUP that another process sends to gradscope are forwarded
//   to the job; the same signals from the terminal are not, because the terminal already delivered them
//   to the whole foreground process group, the job included. Either way gradscope keeps going, merges
//   what the ranks wrote and prints the summary. After the job has ended, a first such signal cuts the
//   wait for other ranks short; a second one ends gradscope with the default action.
// - Launched jobs: `gradscope run -- mpirun ...` passes the variables through the launcher (Open MPI's
//   -x); `mpirun -np N gradscope run -- ./train` runs one gradscope per rank (detectLaunch, launcher.h),
//   which agree on the directory and run id from the launcher's job id, and the instance of rank 0
//   merges once every rank's file is complete (or when --wait runs out).
//
// The functions below the runJob() are its parts, exposed for the tests: most are pure functions of
// their arguments.

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gradscope/common/job_environment.h"
#include "gradscope/common/launcher.h"

namespace gradscope::cli {

struct RunOptions {
  std::vector<std::string> command;    // the job: CMD ARGS...
  std::string output_directory;        // empty: a default (defaultOutputDirectory)
  bool force = false;                  // use a directory that already holds trace files
  std::chrono::seconds wait{60};       // launched job, rank 0: how long to wait for the other ranks
  std::size_t top_calls = 10;          // rows of "Slowest calls" in the summary
  Mode mode = Mode::Observe;           // GRADSCOPE_MODE
  std::string recommendation;          // apply: the file (GRADSCOPE_RECOMMENDATION, made absolute)
  bool allow_semantic_change = false;  // apply: GRADSCOPE_ALLOW_SEMANTIC_CHANGE=1
  std::string explore_budget;  // explore: GRADSCOPE_EXPLORE_BUDGET as given; empty: the agent's default
  // apply: > 0 follows the plan in alternate windows of this many calls per communicator
  // (GRADSCOPE_VALIDATE_WINDOW) and measures what it saves on the step (tuner/validate.h)
  std::int64_t validate_window = 0;
};

// Runs the job as described above; everything gradscope itself says goes to `log` (standard error in
// the command, so that the job's standard output stays the job's).
int runJob(const RunOptions& options, std::ostream& log);

// ---------------------------------------------------------------------------------------------------
// Parts of runJob().

using Environment = std::map<std::string, std::string>;
Environment currentEnvironment();

// Launchers whose command line needs changing (or not) to carry the environment to every rank.
enum class Launcher {
  None,     // not a launcher: the job is one process tree
  OpenMpi,  // mpirun/mpiexec/orterun/oshrun of Open MPI: remote ranks get only the variables named by -x
  Other,    // srun, torchrun, MPICH/Intel MPI's Hydra mpiexec: they pass the whole environment on
};

// Classifies the job's executable: `name` as typed (argv[0]) and `resolved`, its path after the PATH
// search (empty if unknown). mpirun, mpiexec and orterun resolving to Open MPI (a link to orterun or
// prterun, or ompi_info beside it) are OpenMpi; MPICH's mpiexec.hydra and srun/torchrun are Other.
Launcher classifyLauncher(const std::string& name, const std::string& resolved);

// The job's command line with Open MPI's `-x VAR` inserted right after the launcher for each of
// `variables` (in order), so that ranks on other nodes get them, and again after every ":" that
// starts another application context of an MPMD command; unchanged for other launchers.
std::vector<std::string> launcherCommand(const std::vector<std::string>& command, Launcher launcher,
                                         const std::vector<std::string>& variables);

// The private directory of the install whose bin/ is `executable_directory`: where the agent, its
// extensions, the NCCL plugins and the sample jobs are installed (<bin>/../lib/gradscope, with the
// install's library directory; cmake/GradscopeInstallFunctions.cmake). Not checked for existence.
std::string installedPrivateDirectory(const std::string& executable_directory);

// The agent to preload: GRADSCOPE_AGENT_PATH when set (it must exist), else the build tree's
// <dir>/../agent/libgradscope-agent.so, else the install's private directory (<dir>/../lib/gradscope,
// with the install's library directory: /usr/bin/../lib/x86_64-linux-gnu/gradscope for the Debian
// package) where <dir> holds the gradscope executable. Throws gradscope::Error naming the places looked
// at and the fixes. The result is absolute.
std::string findAgent(const Environment& environment, const std::string& executable_directory);

// The default output directory: gradscope-<job id> for a launched rank (the same on every rank),
// otherwise gradscope-YYYYmmdd-HHMMSS (local time). Throws for a launched rank without a job id, naming -o.
std::string defaultOutputDirectory(const std::optional<Launch>& launched,
                                   std::chrono::system_clock::time_point now);

// Creates `directory` (mode 0700, parents as needed) or checks the existing one, and returns its
// absolute path. `shared`: several gradscope instances of one launched job create it concurrently, and
// the trace files of the other ranks are expected in it. Otherwise an existing directory holding trace
// files (*.db) is refused unless `force`. With `pick_free_name` (the default name), a taken name gets
// -2, -3, ... appended instead. Throws gradscope::Error with the directory and the fix.
std::string prepareOutputDirectory(const std::string& directory, bool force, bool shared,
                                   bool pick_free_name = false);

// The command line as one string a POSIX shell would split back into `command`.
std::string shellJoin(const std::vector<std::string>& command);

// The job's environment: `parent` with the agent prepended to LD_PRELOAD (kept once), GRADSCOPE_OUTPUT
// (<directory>/rank%r-%h-%p.db), GRADSCOPE_RUN_ID and GRADSCOPE_COMMAND set; the rest passes through.
Environment jobEnvironment(const Environment& parent, const std::string& agent, const std::string& directory,
                           const std::string& run_id, const std::string& command_line);

// The agent's mode in the job's environment: GRADSCOPE_MODE, and for apply GRADSCOPE_RECOMMENDATION
// (absolute) and GRADSCOPE_ALLOW_SEMANTIC_CHANGE, for explore GRADSCOPE_EXPLORE_BUDGET. Both modes
// turn on Open MPI's coll/tuned dynamic rules (OMPI_MCA_coll_tuned_use_dynamic_rules=1, unless the
// environment sets it), so that the mpi.<algorithm> strategies can force an algorithm on the agent's
// own communicators; with no algorithm forced the job's collectives keep Open MPI's fixed decisions.
void setModeEnvironment(Environment& environment, const RunOptions& options);

// gradscope's NCCL plugins next to the agent: the build tree's <dir>/../plugins/nccl-{tuner,profiler},
// else the install's private directory (as findAgent). Empty where not found (NCCL then runs without).
struct NcclPlugins {
  std::string tuner;     // libnccl-tuner-gradscope.so, absolute
  std::string profiler;  // libnccl-profiler-gradscope.so, absolute
};
NcclPlugins findNcclPlugins(const std::string& executable_directory);

// Loads the plugins into the job's NCCL (docs/nccl-profiler-plugin.md, docs/nccl-tuner-plugin.md): the
// profiler in every mode (NCCL_PROFILER_PLUGIN), so that the trace says which algorithm, protocol and
// channels NCCL used; in apply mode also the tuner (NCCL_TUNER_PLUGIN) with GRADSCOPE_TUNER_CONFIG =
// the recommendation, so that NCCL's own choice follows its nccl.<algo>.<proto> rules. A plugin
// variable the environment already sets (another plugin, or `none`) is left alone; one that already
// names gradscope's tuner (`gradscope`, or a path to libnccl-tuner-gradscope.so: what `module load
// gradscope` sets) still gets the recommendation as GRADSCOPE_TUNER_CONFIG.
bool namesGradscopeTuner(const std::string& plugin);
void setNcclPluginEnvironment(Environment& environment, const NcclPlugins& plugins,
                              const RunOptions& options);

// What a launcher must pass on: LD_PRELOAD first, then the names of `environment` that are GRADSCOPE_*
// (known or not) or other rows of gradscope/common/job_environment.def (the NCCL plugins, NVTX, ...),
// except GRADSCOPE_TEST_CLOCK_OFFSET: a property of the host it is set on (scripts/cluster.sh sets it
// per host), which forwarding would carry to every host.
std::vector<std::string> variablesToForward(const Environment& environment);

// The exit code of a job from its wait status: its exit status, or 128 + S when signal S killed it.
int exitCode(int wait_status);

// The merged trace in an output directory; the per-rank files beside it are merged, never it.
inline constexpr const char* kMergedTraceName = "trace.db";

struct FinishOptions {
  std::string run_id;      // merge only the files of this run (others are ignored with a note); empty: all
  int expected_ranks = 0;  // > 0: first wait until this many files of the run are complete
  std::chrono::milliseconds wait{std::chrono::seconds(60)};
  std::function<bool()> stop_waiting;  // polled while waiting; true ends the wait early
  std::size_t top_calls = 10;
  // A validated apply run (RunOptions::validate_window): the plan it followed, and its windows. The
  // validation is stored in the merged trace (runs.config_json "validation") before the summary.
  std::string recommendation;
  std::int64_t validate_window = 0;
};

// After the job: waits for the ranks' files if asked, merges the run's per-rank files of `directory`
// into <directory>/trace.db and writes the summary (the report, then where the trace is) to `log`.
// Never throws for what it finds: no file (the job made no collective call), unreadable files or a
// failed merge each give one line. Returns the merged file's path, empty when there is none.
std::string finishRun(const std::string& directory, const FinishOptions& options, std::ostream& log);

}  // namespace gradscope::cli
