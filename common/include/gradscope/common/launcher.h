#pragma once

// What a process learns about its place in a job without communicating: its rank and the job's size
// from the launcher's variables, a run id shared by every rank, the host name, and the trace file name
// from an output template. Shared by the LD_PRELOAD agent and the NCCL profiler plugin, which name and
// label their per-rank files alike. Every function that reads the environment takes it as a function, so
// tests cover every value without touching the process environment.

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace gradscope {

// Looks up an environment variable: its value, or nullptr when unset.
using Environment = std::function<const char*(const char* name)>;
// The process environment (std::getenv).
Environment processEnvironment();

// Expands %r (rank), %p (pid), %h (host name) and %% in an output template. A substitution never
// leaves the directory the template names: the host goes through fileNameComponent.
std::string expandOutputTemplate(const std::string& pattern, int rank, long pid, const std::string& host);

// The rank and the world size the launcher gave this process (Open MPI, PMI/PMIx, torchrun, Slurm), the
// first of those variables that holds a whole number from 0 to INT32_MAX; nullopt when none does.
std::optional<int> rankFromLauncher(const Environment& env);
std::optional<int> worldSizeFromLauncher(const Environment& env);

// A run id shared by every rank of one job without communicating: GRADSCOPE_RUN_ID, else a uuid
// derived from the launcher's per-job values (Open MPI's per-job transport key and namespace,
// torchrun's run id, Slurm's job and step), else empty (the caller makes a fresh one).
std::string runIdFromLauncher(const Environment& env);

// The run id of a job a run started with MPI_Comm_spawn: its processes inherit the parent's
// GRADSCOPE_RUN_ID (`inherited`), but they are a world of their own, whose ranks 0, 1, ... would collide
// with the parent's. A uuid derived from `inherited` and the spawned job's namespace (PMIX_NAMESPACE, Open
// MPI's job id): the same on every process of one spawned job, different for every job. Empty when the
// environment names no job (the caller then makes a fresh one per process).
std::string spawnedRunId(const std::string& inherited, const Environment& env);

// A random uuid (version 4 format).
std::string randomUuid();

// `text` as one file-name component: characters outside [A-Za-z0-9._-] become '_', and a name of dots
// only ("." or "..", which would name a directory) becomes underscores; empty becomes "host".
std::string fileNameComponent(std::string_view text);

// The host name, sanitised for file names (fileNameComponent).
std::string hostName();

}  // namespace gradscope
