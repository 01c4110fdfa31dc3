#include "gradscope/cli/run.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "gradscope/cli/report.h"
#include "gradscope/common/error.h"
#include "gradscope/common/job_environment.h"
#include "gradscope/common/launcher.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "gradscope/tuner/validate.h"

extern char** environ;

namespace gradscope::cli {
namespace {

namespace fs = std::filesystem;

constexpr int kExitError = 2;
constexpr int kExitNotFound = 127;       // as a shell: no such command
constexpr int kExitNotExecutable = 126;  // as a shell: found, but cannot be executed
constexpr const char* kAgentName = "libgradscope-agent.so";

std::optional<std::string> lookup(const Environment& environment, const std::string& name) {
  const auto it = environment.find(name);
  if (it == environment.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

std::string baseName(const std::string& path) {
  return fs::path(path).filename().string();
}

bool isRegularFile(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

// The file execve() would run for `name`: itself when it holds a '/', else the first executable
// regular file of that name in PATH (a shell's search). Sets `error` to ENOENT or EACCES when none.
std::string resolveExecutable(const std::string& name, const Environment& environment, int& error) {
  error = 0;
  const auto usable = [&error](const std::string& candidate) {
    struct stat info {};
    if (::stat(candidate.c_str(), &info) != 0) return false;
    if (!S_ISREG(info.st_mode) || ::access(candidate.c_str(), X_OK) != 0) {
      error = EACCES;  // remembered, but a later PATH entry may still have an executable one
      return false;
    }
    return true;
  };
  if (name.empty()) {
    error = ENOENT;
    return {};
  }
  if (name.find('/') != std::string::npos) {
    if (usable(name)) return name;
    if (error == 0) error = ENOENT;
    return {};
  }
  const std::string path = lookup(environment, "PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  for (std::size_t begin = 0;;) {
    const std::size_t end = path.find(':', begin);
    const std::string directory = path.substr(begin, end == std::string::npos ? end : end - begin);
    const std::string candidate = (directory.empty() ? std::string(".") : directory) + "/" + name;
    if (usable(candidate)) {
      error = 0;
      return candidate;
    }
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  if (error == 0) error = ENOENT;
  return {};
}

// Shown to people: relative to the working directory when inside it, else absolute.
std::string displayPath(const std::string& path) {
  std::error_code error;
  const fs::path relative = fs::relative(path, fs::current_path(error), error);
  if (error || relative.empty() || *relative.begin() == "..") return path;
  return relative.string();
}

// ---------------------------------------------------------------------------------------------------
// Signals (see run.h): the handler only reads and writes lock-free atomics and calls kill(), sigaction()
// and raise(), all async-signal-safe.

std::atomic<pid_t> g_job{0};              // the running job, 0 when none (before it starts, once it ended)
std::atomic<int> g_signals_after_job{0};  // signals received after the job ended
static_assert(std::atomic<pid_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

constexpr std::array<int, 3> kForwardedSignals = {SIGINT, SIGTERM, SIGHUP};

void onSignal(int signal, siginfo_t* info, void*) {
  const pid_t job = g_job.load();
  if (job > 0) {
    // si_code <= 0 (SI_USER, SI_QUEUE, SI_TKILL): another process sent it to gradscope alone, so the job
    // has not seen it. Kernel-generated ones (the terminal's Ctrl-C, hang-up) went to the whole
    // foreground process group, the job included: forwarding them would deliver them twice.
    if (info == nullptr || info->si_code <= 0) {
      const int saved_errno = errno;
      ::kill(job, signal);
      errno = saved_errno;
    }
    return;
  }
  if (g_signals_after_job.fetch_add(1) >= 1) {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    ::sigaction(signal, &default_action, nullptr);
    ::raise(signal);
  }
}

// Installs onSignal for the forwarded signals for its lifetime and remembers what was there, which the
// job gets back (an ignored SIGINT, as under nohup, stays ignored for it).
class SignalForwarding {
 public:
  SignalForwarding() {
    g_job.store(0);
    g_signals_after_job.store(0);
    struct sigaction action {};
    action.sa_sigaction = onSignal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (std::size_t i = 0; i < kForwardedSignals.size(); ++i)
      ::sigaction(kForwardedSignals[i], &action, &original_[i]);
  }
  ~SignalForwarding() {
    for (std::size_t i = 0; i < kForwardedSignals.size(); ++i)
      ::sigaction(kForwardedSignals[i], &original_[i], nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

  // In the forked child, before exec: async-signal-safe.
  void restoreInChild() const {
    for (std::size_t i = 0; i < kForwardedSignals.size(); ++i)
      ::sigaction(kForwardedSignals[i], &original_[i], nullptr);
  }

 private:
  std::array<struct sigaction, kForwardedSignals.size()> original_{};
};

struct Spawned {
  int exec_errno = 0;  // non-zero: the job could not be started
  int status = 0;      // wait status
};

// Runs `executable` with `arguments` and `environment` and waits for it, forwarding signals meanwhile.
Spawned spawnAndWait(const std::string& executable, const std::vector<std::string>& arguments,
                     const Environment& environment, const SignalForwarding& signals) {
  // Everything the child needs is built before fork(): between fork() and exec() only async-signal-safe
  // calls are allowed.
  std::vector<char*> argv;
  for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> entries;
  for (const auto& [name, value] : environment) entries.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);

  // The child reports a failed exec() through this pipe; a successful one closes it (O_CLOEXEC).
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) fail("cannot create a pipe: {}", errnoMessage(errno));

  // Blocked across fork() so that no forwarded signal finds g_job unset while the child exists, and the
  // child cannot run our handler before it restores the original dispositions.
  sigset_t blocked, previous;
  sigemptyset(&blocked);
  for (int signal : kForwardedSignals) sigaddset(&blocked, signal);
  ::sigprocmask(SIG_BLOCK, &blocked, &previous);
  const pid_t pid = ::fork();
  if (pid == 0) {
    signals.restoreInChild();
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::execve(executable.c_str(), argv.data(), envp.data());
    const int error = errno;
    [[maybe_unused]] const ssize_t wrote = ::write(report[1], &error, sizeof error);
    ::_exit(kExitNotFound);
  }
  const int fork_errno = errno;
  if (pid > 0) g_job.store(pid);
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    fail("cannot start the job: fork failed: {}", errnoMessage(fork_errno));
  }

  Spawned result;
  int error = 0;
  ssize_t got = 0;
  while ((got = ::read(report[0], &error, sizeof error)) < 0 && errno == EINTR) {
  }
  ::close(report[0]);
  if (got == static_cast<ssize_t>(sizeof error)) result.exec_errno = error;

  // Wait without reaping first, so that the pid cannot be reused while the handler may still signal it.
  // Polled every 10 ms rather than blocking in waitid(): ThreadSanitizer runs signal handlers only when
  // the program next enters a function it intercepts, which a blocking waitid() never does.
  for (;;) {
    siginfo_t info{};
    const int waited = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT | WNOHANG);
    if (waited == 0 && info.si_pid == pid) break;
    if (waited != 0 && errno != EINTR) break;
    ::poll(nullptr, 0, 10);
  }
  g_job.store(0);
  while (::waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
  }
  return result;
}

// ---------------------------------------------------------------------------------------------------
// After the job.

struct TraceFile {
  std::string path;
  std::string uuid;        // of its first run; empty when unreadable
  std::string spawned_by;  // the run that started this one with MPI_Comm_spawn (runs.config_json)
  bool complete = false;   // runs.end_ns set: the agent's final flush happened
  std::string error;       // why it cannot be read
};

// The per-rank files in `directory`: *.db directly inside, except the merged trace and dotfiles.
std::vector<TraceFile> scanTraceFiles(const std::string& directory) {
  std::vector<std::string> paths;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file(error) && entry.path().extension() == ".db" && name.front() != '.' &&
        name != kMergedTraceName)
      paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<TraceFile> files;
  for (const std::string& path : paths) {
    TraceFile file{path, {}, {}, false, {}};
    try {
      const auto runs = storage::TraceReader::open(path).runs();
      if (runs.empty()) {
        file.error = "it has no run yet";
      } else {
        file.uuid = runs.front().uuid;
        file.complete = runs.front().end_ns.has_value();
        const auto config = nlohmann::json::parse(runs.front().config_json, nullptr, false);
        if (config.is_object() && config.contains("spawned_by") && config["spawned_by"].is_string())
          file.spawned_by = config["spawned_by"].get<std::string>();
      }
    } catch (const Error& failure) {
      file.error = failure.what();
    }
    files.push_back(std::move(file));
  }
  return files;
}

// Which path recorded each rank of an NCCL job (docs/user-guide.md, "TensorFlow and other statically linked
// NCCL"): the agent, the agent with NCCL's choices from the profiler plugin, or the plugin alone (a trace
// of its own: the agent never saw that rank's NCCL). Nothing for a job without NCCL ranks. A rank the plugin
// alone recorded gets one more line: why the agent saw nothing there, and what is and is not recorded.
void writeRecordingPaths(const std::vector<std::string>& inputs, std::ostream& log) {
  std::map<std::string, std::vector<int>> by_path;  // "agent", "both", "plugin: <agent>"
  for (const std::string& path : inputs) {
    try {
      const storage::TraceReader reader = storage::TraceReader::open(path);
      const auto runs = reader.runs();
      const auto ranks = reader.ranks();
      if (runs.empty()) continue;
      const int rank = ranks.empty() ? -1 : ranks.front().rank;
      const auto config = nlohmann::json::parse(runs.front().config_json, nullptr, false);
      const auto text = [&config](const char* key) {
        return config.is_object() && config.contains(key) && config[key].is_string()
                   ? config[key].get<std::string>()
                   : std::string();
      };
      if (text("source") == "nccl-profiler") {
        by_path["plugin: " + text("agent")].push_back(rank);
      } else if (runs.front().backend == Backend::Nccl) {
        bool facts = false;
        reader.forEachCall([&facts](const storage::CallRecord& call) {
          facts = call.nccl_algo >= 0;
          return !facts;
        });
        by_path[facts ? "both" : "agent"].push_back(rank);
      }
    } catch (const Error&) {
      // Read again, and said, by the merge and the report.
    }
  }
  if (by_path.empty()) return;
  const auto ranksText = [](const std::vector<int>& ranks) {
    return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", rankList(ranks));
  };
  std::vector<std::string> parts;
  for (const auto& [how, ranks] : by_path)
    parts.push_back(fmt::format("{} on {}",
                                how == "agent"  ? "by the agent"
                                : how == "both" ? "by the agent, with NCCL's choices from the profiler plugin"
                                                : "by the NCCL profiler plugin alone",
                                ranksText(ranks)));
  log << fmt::format("gradscope: NCCL calls recorded {}\n", fmt::join(parts, "; "));
  for (const auto& [how, ranks] : by_path) {
    if (!how.starts_with("plugin: ")) continue;
    const bool loaded = how == "plugin: not interposing";
    log << fmt::format(
        "gradscope: on {} the agent saw no NCCL call: {}. The plugin recorded every collective (all-reduce, "
        "all-gather, reduce-scatter, reduce, broadcast) with NCCL's algorithm, protocol and channels and its "
        "host times; not recorded there: point-to-point and all-to-all calls, GPU spans, explore and apply "
        "(a plan's algorithm and protocol still apply through the tuner plugin). docs/user-guide.md, "
        "\"TensorFlow and other statically linked NCCL\"\n",
        ranksText(ranks),
        loaded ? "the agent was loaded, but the job's NCCL is linked into it statically (as in TensorFlow's "
                 "packages), which LD_PRELOAD cannot interpose"
               : "the agent was not loaded there (LD_PRELOAD did not reach those processes)");
  }
}

bool ofRun(const TraceFile& file, const std::string& run_id) {
  return file.error.empty() && (run_id.empty() || file.uuid == run_id);
}

// The run and the runs it spawned (MPI_Comm_spawn: worlds of their own, with runs of their own that say
// where they came from), transitively: what the merged trace holds, each run apart.
std::set<std::string> runAndSpawned(const std::vector<TraceFile>& files, const std::string& run_id) {
  std::set<std::string> family{run_id};
  for (bool grew = true; grew;) {
    grew = false;
    for (const TraceFile& file : files)
      if (file.error.empty() && family.contains(file.spawned_by))
        grew = family.insert(file.uuid).second || grew;
  }
  return family;
}

}  // namespace

// -----------------------------------------------------------------------------------------------------
// Parts

Environment currentEnvironment() {
  Environment environment;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::size_t equals = text.find('=');
    if (equals == std::string_view::npos || equals == 0) continue;
    environment.emplace(std::string(text.substr(0, equals)), std::string(text.substr(equals + 1)));
  }
  return environment;
}

Launcher classifyLauncher(const std::string& name, const std::string& resolved) {
  const std::string base = baseName(name);
  static const std::vector<std::string> kEnvironmentPassing = {"srun", "torchrun", "mpiexec.hydra",
                                                               "mpirun.mpich", "mpiexec.mpich"};
  if (std::find(kEnvironmentPassing.begin(), kEnvironmentPassing.end(), base) != kEnvironmentPassing.end())
    return Launcher::Other;
  static const std::vector<std::string> kOpenMpiOnly = {"orterun", "prterun", "oshrun", "mpirun.openmpi",
                                                        "mpiexec.openmpi"};
  if (std::find(kOpenMpiOnly.begin(), kOpenMpiOnly.end(), base) != kOpenMpiOnly.end())
    return Launcher::OpenMpi;
  if (base != "mpirun" && base != "mpiexec") return Launcher::None;

  // mpirun and mpiexec belong to several MPIs. Decide from what the name leads to (Debian's
  // alternatives: mpirun -> mpirun.openmpi -> orterun, or -> mpiexec.hydra), else from ompi_info, which
  // every Open MPI installs beside mpirun. Without evidence: not Open MPI, since -x would break Hydra's
  // mpiexec, while a missing -x only loses the ranks on other nodes.
  if (resolved.empty()) return Launcher::Other;
  std::error_code error;
  const fs::path target = fs::canonical(resolved, error);
  const std::string target_name = error ? std::string() : target.filename().string();
  if (target_name.find("hydra") != std::string::npos || target_name.find("mpich") != std::string::npos)
    return Launcher::Other;
  if (target_name == "orterun" || target_name == "prterun" ||
      target_name.find("openmpi") != std::string::npos)
    return Launcher::OpenMpi;
  for (const fs::path& directory : {fs::path(resolved).parent_path(), target.parent_path()})
    if (!directory.empty() && isRegularFile(directory / "ompi_info")) return Launcher::OpenMpi;
  return Launcher::Other;
}

std::vector<std::string> launcherCommand(const std::vector<std::string>& command, Launcher launcher,
                                         const std::vector<std::string>& variables) {
  if (launcher != Launcher::OpenMpi || command.empty()) return command;
  // Open MPI applies -x to one application context: in an MPMD command (contexts separated by a ":"
  // argument) every context needs its own, or the ranks of the later ones run without the agent (and
  // in explore or apply mode the others would wait for them in collectives they never make).
  const auto exports = [&](std::vector<std::string>& out) {
    for (const std::string& variable : variables) {
      out.push_back("-x");
      out.push_back(variable);
    }
  };
  std::vector<std::string> out{command.front()};
  exports(out);
  for (auto it = command.begin() + 1; it != command.end(); ++it) {
    out.push_back(*it);
    if (*it == ":") exports(out);
  }
  return out;
}

std::string installedPrivateDirectory(const std::string& executable_directory) {
  return (fs::path(executable_directory) / GRADSCOPE_BIN_TO_PKGLIBDIR).lexically_normal().string();
}

std::string findAgent(const Environment& environment, const std::string& executable_directory) {
  if (const auto configured = lookup(environment, env::kAgentPath)) {
    if (!isRegularFile(*configured))
      fail("{}={} is not a file; point it at {} or unset it", env::kAgentPath, *configured, kAgentName);
    return fs::absolute(*configured).lexically_normal().string();
  }
  const fs::path bin(executable_directory);
  std::string looked;
  for (const fs::path& directory :
       {bin / ".." / "agent", fs::path(installedPrivateDirectory(executable_directory))}) {
    const fs::path candidate = (directory / kAgentName).lexically_normal();
    if (isRegularFile(candidate)) return fs::absolute(candidate).string();
    looked += (looked.empty() ? "" : ", ") + directory.lexically_normal().string();
  }
  fail(
      "cannot find the agent {} (looked in {}); build the gradscope_agent target, reinstall the gradscope "
      "package, or set {}",
      kAgentName, looked, env::kAgentPath);
}

NcclPlugins findNcclPlugins(const std::string& executable_directory) {
  const fs::path bin(executable_directory);
  const auto find = [&](const char* build_directory, const char* name) -> std::string {
    for (const fs::path& directory : {bin / ".." / "plugins" / build_directory,
                                      fs::path(installedPrivateDirectory(executable_directory))}) {
      const fs::path candidate = (directory / name).lexically_normal();
      if (isRegularFile(candidate)) return fs::absolute(candidate).string();
    }
    return {};
  };
  return {find("nccl-tuner", "libnccl-tuner-gradscope.so"),
          find("nccl-profiler", "libnccl-profiler-gradscope.so")};
}

std::string defaultOutputDirectory(const std::optional<Launch>& launched,
                                   std::chrono::system_clock::time_point now) {
  if (launched) {
    if (launched->job_id.empty())
      fail(
          "rank {} of a launched job, but the launcher's job id is unknown (no PMIX_NAMESPACE, "
          "OMPI_MCA_ess_base_jobid or SLURM_JOB_ID): pass -o DIR, the same directory on every rank",
          launched->rank);
    return "gradscope-" + launched->job_id;
  }
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  std::tm local{};
  ::localtime_r(&seconds, &local);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &local);
  return std::string("gradscope-") + text;
}

std::string prepareOutputDirectory(const std::string& directory, bool force, bool shared,
                                   bool pick_free_name) {
  if (directory.empty()) fail("the output directory is empty; pass -o DIR");
  const std::string fix = "pass -o with a directory you can write to";
  fs::path path(directory);
  std::error_code error;
  if (const fs::path parent = fs::absolute(path, error).parent_path(); !parent.empty()) {
    fs::create_directories(parent, error);
    if (error) fail("cannot create output directory {}: {}; {}", directory, error.message(), fix);
  }
  bool created = false;
  for (int attempt = 1; attempt <= 100; ++attempt) {
    const fs::path candidate = attempt == 1 ? path : fs::path(directory + "-" + std::to_string(attempt));
    if (::mkdir(candidate.c_str(), 0700) == 0) {
      path = candidate;
      created = true;
      break;
    }
    // EEXIST is fine: another rank of a launched job, or the user, made it.
    if (errno != EEXIST)
      fail("cannot create output directory {}: {}; {}", candidate.string(), errnoMessage(errno), fix);
    if (!pick_free_name) break;
  }
  if (!fs::is_directory(path, error))
    fail("output directory {} exists and is not a directory; {}", path.string(), fix);
  if (!created && !shared && !force) {
    for (const auto& entry : fs::directory_iterator(path, error))
      if (entry.path().extension() == ".db")
        fail(
            "output directory {} already holds trace files (*.db); pass another -o DIR, or --force to add "
            "this run to it",
            path.string());
  }
  if (::access(path.c_str(), W_OK | X_OK) != 0)
    fail("cannot write to output directory {}: {}; {}", path.string(), errnoMessage(errno), fix);
  return fs::absolute(path).lexically_normal().string();
}

std::string shellJoin(const std::vector<std::string>& command) {
  std::string out;
  for (const std::string& argument : command) {
    if (!out.empty()) out += ' ';
    const bool plain = !argument.empty() && std::all_of(argument.begin(), argument.end(), [](char c) {
      return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
    });
    if (plain) {
      out += argument;
      continue;
    }
    out += '\'';
    for (char c : argument) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

Environment jobEnvironment(const Environment& parent, const std::string& agent, const std::string& directory,
                           const std::string& run_id, const std::string& command_line) {
  Environment environment = parent;
  // ld.so splits LD_PRELOAD on colons and spaces; the agent goes first, once — after any sanitizer
  // runtime, which must be the first library loaded (a sanitizer build of the agent depends on it).
  std::string sanitizers, others;
  const std::string existing = lookup(parent, env::kLdPreload).value_or("");
  for (std::size_t begin = 0; begin < existing.size();) {
    const std::size_t end = std::min(existing.find_first_of(": ", begin), existing.size());
    const std::string entry = existing.substr(begin, end - begin);
    begin = end + 1;
    if (entry.empty() || entry == agent) continue;
    const std::string name = fs::path(entry).filename().string();
    const bool sanitizer = name.rfind("libasan", 0) == 0 || name.rfind("libtsan", 0) == 0 ||
                           name.rfind("libubsan", 0) == 0 || name.rfind("liblsan", 0) == 0;
    (sanitizer ? sanitizers : others) += entry + ":";
  }
  environment[env::kLdPreload] =
      sanitizers + agent + (others.empty() ? "" : ":" + others.substr(0, others.size() - 1));
  environment[env::kOutput] = (fs::path(directory) / "rank%r-%h-%p.db").string();
  environment[env::kRunId] = run_id;
  environment[env::kCommand] = command_line;
  // An NVTX step marker needs the agent as the process's NVTX injection library (NVTX v3 calls only
  // the library this variable names); one the user chose already is left alone.
  if (lookup(parent, env::kStepNvtx) && !lookup(parent, env::kNvtxInjectionPath))
    environment[env::kNvtxInjectionPath] = agent;
  return environment;
}

void setModeEnvironment(Environment& environment, const RunOptions& options) {
  environment[env::kMode] = modeName(options.mode);
  if (options.mode == Mode::Apply) {
    std::error_code error;
    const fs::path absolute = fs::absolute(options.recommendation, error);
    environment[env::kRecommendation] = error ? options.recommendation : absolute.string();
    environment[env::kAllowSemanticChange] = options.allow_semantic_change ? "1" : "0";
    if (options.validate_window > 0)
      environment[env::kValidateWindow] = std::to_string(options.validate_window);
  }
  if (options.mode == Mode::Explore && !options.explore_budget.empty())
    environment[env::kExploreBudget] = options.explore_budget;
  if (options.mode != Mode::Observe) environment.try_emplace(env::kOmpiDynamicRules, "1");
}

bool namesGradscopeTuner(const std::string& plugin) {
  // NCCL resolves a bare name N to libnccl-tuner-N.so; a path is loaded as it is.
  return plugin == "gradscope" || fs::path(plugin).filename() == "libnccl-tuner-gradscope.so";
}

void setNcclPluginEnvironment(Environment& environment, const NcclPlugins& plugins,
                              const RunOptions& options) {
  if (!plugins.profiler.empty()) environment.try_emplace(env::kNcclProfilerPlugin, plugins.profiler);
  if (options.mode != Mode::Apply) return;
  if (const auto named = lookup(environment, env::kNcclTunerPlugin)) {
    // Another tuner, or none: left alone, and it reads no gradscope plan.
    if (!namesGradscopeTuner(*named)) return;
  } else if (plugins.tuner.empty()) {
    return;
  } else {
    environment[env::kNcclTunerPlugin] = plugins.tuner;
  }
  if (const auto recommendation = lookup(environment, env::kRecommendation))
    environment[env::kTunerConfig] = *recommendation;
}

std::vector<std::string> variablesToForward(const Environment& environment) {
  std::vector<std::string> names{env::kLdPreload};
  for (const auto& [name, value] : environment)
    if (name != env::kLdPreload && name != env::kTestClockOffset &&
        (name.starts_with(env::kPrefix) || env::findVariable(name) != nullptr))
      names.push_back(name);
  return names;
}

int exitCode(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return kExitError;
}

std::string finishRun(const std::string& directory, const FinishOptions& options, std::ostream& log) {
  const std::string shown = displayPath(directory);
  const auto countOfRun = [&](const std::vector<TraceFile>& files, bool complete_only) {
    return std::count_if(files.begin(), files.end(), [&](const TraceFile& file) {
      return ofRun(file, options.run_id) && (!complete_only || file.complete);
    });
  };
  std::vector<TraceFile> files = scanTraceFiles(directory);

  // A launched job: the other ranks may still be writing. A rank's file appears at its first
  // collective call, so when no rank of the run has written one by now, the job made none.
  if (options.expected_ranks > 0 && countOfRun(files, false) > 0) {
    const auto deadline = std::chrono::steady_clock::now() + options.wait;
    for (;;) {
      const auto complete = countOfRun(files, true);
      if (complete >= options.expected_ranks) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        log << fmt::format(
            "gradscope: waited {:g} s for the traces of {} ranks and {} are complete; merging what there "
            "is (a rank may have been killed; --wait SECONDS waits longer)\n",
            std::chrono::duration<double>(options.wait).count(), options.expected_ranks, complete);
        break;
      }
      if (options.stop_waiting && options.stop_waiting()) {
        log << fmt::format(
            "gradscope: interrupted while waiting for the traces of {} ranks ({} complete); merging what "
            "there is\n",
            options.expected_ranks, complete);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      files = scanTraceFiles(directory);
    }
  }

  std::vector<std::string> inputs;
  std::size_t unreadable = 0, other_runs = 0, spawned = 0;
  const TraceFile* first_unreadable = nullptr;
  const std::set<std::string> family = runAndSpawned(files, options.run_id);
  for (const TraceFile& file : files) {
    if (!file.error.empty()) {
      if (unreadable++ == 0) first_unreadable = &file;
    } else if (!ofRun(file, options.run_id) && !family.contains(file.uuid)) {
      ++other_runs;
    } else {
      if (!ofRun(file, options.run_id)) ++spawned;
      inputs.push_back(file.path);
    }
  }
  if (spawned > 0)
    log << fmt::format(
        "gradscope: {} trace file{} of jobs the run spawned (MPI_Comm_spawn) merged as run{} of their own\n",
        spawned, spawned == 1 ? "" : "s", family.size() > 2 ? "s" : "");
  if (other_runs > 0)
    log << fmt::format("gradscope: left out {} trace file{} of other runs in {}\n", other_runs,
                       other_runs == 1 ? "" : "s", shown);
  if (unreadable > 0)
    log << fmt::format("gradscope: left out {} unreadable trace file{} ({}: {})\n", unreadable,
                       unreadable == 1 ? "" : "s", displayPath(first_unreadable->path),
                       first_unreadable->error);
  if (inputs.empty()) {
    log << fmt::format(
        "gradscope: no collective calls were recorded: no rank wrote a trace to {} (the agent records a "
        "process once it calls MPI or NCCL; check that the job does, and that LD_PRELOAD reaches it through "
        "scripts and launchers)\n",
        shown);
    return {};
  }

  const std::string merged = (fs::path(directory) / kMergedTraceName).string();
  try {
    storage::MergeOptions merge_options;
    merge_options.overwrite = true;  // with --force, a previous run's merged trace is replaced
    storage::mergeTraces(inputs, merged, merge_options);
  } catch (const Error& error) {
    log << fmt::format("gradscope: cannot merge the traces in {} (the per-rank files are kept): {}\n", shown,
                       error.what());
    return {};
  }
  const std::string merged_shown = displayPath(merged);
  writeRecordingPaths(inputs, log);
  if (options.validate_window > 0) {
    try {
      const auto validation =
          tuner::validateRun(storage::TraceReader::open(merged), loadRecommendation(options.recommendation),
                             options.validate_window);
      if (validation) storage::setRunConfigValue(merged, "validation", tuner::validationJson(*validation));
      else
        log << fmt::format(
            "gradscope: --validate {}: the run was too short to compare two windows with the plan and two "
            "without "
            "(give more steps, or a smaller window)\n",
            options.validate_window);
    } catch (const Error& error) {
      log << fmt::format("gradscope: cannot validate the plan in {}: {}\n", merged_shown, error.what());
    }
  }
  try {
    ReportOptions report_options;
    report_options.top_calls = options.top_calls;
    writeReport(storage::TraceReader::open(merged_shown), log, report_options);
  } catch (const Error& error) {
    log << fmt::format("gradscope: cannot summarise {}: {}\n", merged_shown, error.what());
  }
  log << fmt::format(
      "\nTrace: {} ({} rank file{} merged; they stay in {}). Open it with: gradscope report {}, or "
      "gradscope-gui {}\n",
      merged_shown, inputs.size(), inputs.size() == 1 ? "" : "s", shown, merged_shown, merged_shown);
  log.flush();
  return merged;
}

// -----------------------------------------------------------------------------------------------------
// The command

int runJob(const RunOptions& options, std::ostream& log) {
  if (options.command.empty()) {
    log << "gradscope: run needs a command: gradscope run [-o DIR] -- CMD [ARGS...]\n";
    return kExitError;
  }
  const Environment environment = currentEnvironment();
  int not_runnable = 0;
  const std::string executable = resolveExecutable(options.command.front(), environment, not_runnable);
  if (not_runnable != 0) {
    log << fmt::format("gradscope: cannot run '{}': {}\n", options.command.front(),
                       errnoMessage(not_runnable));
    return not_runnable == ENOENT ? kExitNotFound : kExitNotExecutable;
  }
  const Launcher launcher = classifyLauncher(options.command.front(), executable);
  // A launcher in the command means this gradscope starts the job; otherwise it may be one rank of it.
  const auto launched = launcher == Launcher::None ? detectLaunch(environmentOf(environment)) : std::nullopt;

  std::string agent, directory, run_id;
  NcclPlugins plugins;
  try {
    std::error_code error;
    const fs::path self = fs::read_symlink("/proc/self/exe", error);
    agent = findAgent(environment, self.parent_path().string());
    plugins = findNcclPlugins(self.parent_path().string());
    const bool default_directory = options.output_directory.empty();
    directory = prepareOutputDirectory(
        default_directory ? defaultOutputDirectory(launched, std::chrono::system_clock::now())
                          : options.output_directory,
        options.force, /*shared=*/launched.has_value(), /*pick_free_name=*/default_directory && !launched);
    // Every rank of a launched job must arrive at the same id without talking to the others.
    if (const auto given = lookup(environment, env::kRunId)) run_id = *given;
    else if (launched) run_id = uuidFromKey(launched->job_id.empty() ? directory : launched->job_id);
    else run_id = randomUuid();
  } catch (const Error& error) {
    log << "gradscope: " << error.what() << "\n";
    return kExitError;
  }

  Environment job = jobEnvironment(environment, agent, directory, run_id, shellJoin(options.command));
  setModeEnvironment(job, options);
  setNcclPluginEnvironment(job, plugins, options);
  const auto arguments = launcherCommand(options.command, launcher, variablesToForward(job));
  // Installed until gradscope returns: after the job, a signal cuts the wait for the other ranks short.
  SignalForwarding signals;
  Spawned spawned;
  try {
    spawned = spawnAndWait(executable, arguments, job, signals);
  } catch (const Error& error) {
    log << "gradscope: " << error.what() << "\n";
    return kExitError;
  }
  if (spawned.exec_errno != 0) {
    log << fmt::format("gradscope: cannot run '{}': {}\n", options.command.front(),
                       errnoMessage(spawned.exec_errno));
    return spawned.exec_errno == ENOENT ? kExitNotFound : kExitNotExecutable;
  }
  const int code = exitCode(spawned.status);
  if (launched && launched->rank != 0) return code;  // rank 0's gradscope merges

  FinishOptions finish;
  finish.run_id = run_id;
  finish.expected_ranks = launched ? launched->world_size : 0;
  finish.wait = options.wait;
  finish.stop_waiting = [] { return g_signals_after_job.load() > 0; };
  finish.top_calls = options.top_calls;
  if (options.mode == Mode::Apply) {
    finish.recommendation = options.recommendation;
    finish.validate_window = options.validate_window;
  }
  finishRun(directory, finish, log);
  return code;
}

}  // namespace gradscope::cli
