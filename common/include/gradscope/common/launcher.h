#pragma once

// What a process learns about its place in a job without communicating: its rank, the job's size and
// id from the launcher's variables, a run id shared by every rank, the host name, and the trace file name
// from an output template. Shared by the LD_PRELOAD agent, the NCCL profiler plugin (which name and
// label their per-rank files alike) and `gradscope run` (which, started by a launcher, must agree with
// the other ranks' instances). Every function that reads the environment takes it as a function, so
// tests cover every value without touching the process environment.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace gradscope {

// Looks up an environment variable: its value, or nullptr when unset.
using Environment = std::function<const char*(const char* name)>;
// The process environment (std::getenv).
Environment processEnvironment();
// Looks names up in `variables`, which must outlive the result; an absent name reads as nullptr.
Environment environmentOf(const std::map<std::string, std::string>& variables);

// Expands %r (rank), %p (pid), %h (host name) and %% in an output template. A substitution never
// leaves the directory the template names: the host goes through fileNameComponent.
std::string expandOutputTemplate(const std::string& pattern, int rank, long pid, const std::string& host);

// This process as one rank of a launched job.
struct Launch {
  int rank = 0;
  int world_size = 1;
  std::string job_id;  // the same on every rank of the job, sanitised to [A-Za-z0-9._-]; empty if unknown

  bool operator==(const Launch&) const = default;
};

// The launch this process belongs to, from the first launcher whose variables are all there and agree
// (0 <= rank < size; an empty value counts as unset):
//   Open MPI          OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE
//   Hydra, other PMI  PMI_RANK / PMI_SIZE (MPICH, Intel MPI)
//   Slurm's srun      SLURM_PROCID / SLURM_STEP_NUM_TASKS, else SLURM_NTASKS, with SLURM_STEP_ID (a batch
//                     script has SLURM_PROCID too, but no step: it is no rank)
//   torchrun          RANK / WORLD_SIZE with TORCHELASTIC_RUN_ID
// RANK and WORLD_SIZE without TORCHELASTIC_RUN_ID are no launch. They are PyTorch's env:// convention,
// which scripts set for themselves (samples/pytorch_ddp/train.py does) and shells leak, so they tell
// neither which launcher started the process nor that its peers exist. The users of the answer weigh a
// wrong one unequally: `gradscope run` would take a false launch for one of several instances (the
// non-zero "ranks" never merge, rank 0 waits for files that never come, and without a job id it refuses
// to start), and the agent and the profiler plugin would label a file with a stale rank, colliding at
// merge; a missed launch costs them nothing, since they then take the rank MPI or the job's first NCCL
// communicator gives, which for an env:// job (one default process group) is the same number.
// The job id is the first of PMIX_NAMESPACE (Open MPI 4 and 5, Slurm's PMIx), OMPI_MCA_ess_base_jobid
// (older Open MPI), SLURM_JOB_ID.SLURM_STEP_ID and TORCHELASTIC_RUN_ID (which torchrun sets to "none"
// unless told an id, so it comes last and "none" is no id).
std::optional<Launch> detectLaunch(const Environment& env);

// A run id shared by every rank of one job without communicating: GRADSCOPE_RUN_ID, else a uuid
// derived from every per-job value the launcher gave (Open MPI's random per-job transport key, the PMIx
// namespace, torchrun's run id, Slurm's job and step: unlike Launch::job_id, which names a directory,
// this must differ between any two jobs), else empty (the caller makes a fresh one).
std::string runIdFromLauncher(const Environment& env);

// The run id of a job a run started with MPI_Comm_spawn: its processes inherit the parent's
// GRADSCOPE_RUN_ID (`inherited`), but they are a world of their own, whose ranks 0, 1, ... would collide
// with the parent's. A uuid derived from `inherited` and the spawned job's namespace (PMIX_NAMESPACE, Open
// MPI's job id): the same on every process of one spawned job, different for every job. Empty when the
// environment names no job (the caller then makes a fresh one per process).
std::string spawnedRunId(const std::string& inherited, const Environment& env);

// A random uuid (version 4), and one derived from `key` alone (version 8: same key, same uuid), both
// formatted 8-4-4-4-12 in lower-case hex. Every uuid gradscope makes comes from these two.
std::string randomUuid();
std::string uuidFromKey(std::string_view key);

// `text` as one file-name component: characters outside [A-Za-z0-9._-] become '_', and a name of dots
// only ("." or "..", which would name a directory) becomes underscores; empty becomes "host".
std::string fileNameComponent(std::string_view text);

// The host name, sanitised for file names (fileNameComponent).
std::string hostName();

// This process's command line (/proc/self/cmdline), arguments joined by spaces: the command a trace
// records when `gradscope run` did not name it.
std::string processCommandLine();

}  // namespace gradscope
