#pragma once

// Merging the per-rank files of a run into one file.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gradscope::storage {

// Messages between the processes of a merge split across processes (`mpirun -np K gradscope report DIR`:
// gradscope-mpi implements it over MPI; the tests over threads). Process 0 writes the output. The others
// are readers: reader r validates and decodes the inputs i with i % K == r on its cores and sends them to
// process 0, which decodes the inputs i % K == 0 itself and writes every input's rows in input order, as
// one process would: the output does not depend on K. Messages from one process to another arrive in
// the order they were sent; a reader's send may wait until process 0 takes the message, which keeps what
// is in flight bounded (MPI's rendezvous protocol for messages of this size).
class MergeLink {
 public:
  virtual ~MergeLink() = default;
  virtual int size() const = 0;  // processes, process 0 included
  virtual int rank() const = 0;
  // Process 0 to reader `to`, which waits for the next one or looks without waiting.
  virtual void sendControl(int to, std::string message) = 0;
  virtual std::string receiveControl() = 0;
  virtual std::optional<std::string> pollControl() = 0;
  // A reader to process 0, which takes reader `from`'s next message, waiting for it.
  virtual void sendData(std::string message) = 0;
  virtual std::string receiveData(int from) = 0;

  // Process 0: a failed merge stopped the readers (serveMerges returned): no merge can use them again.
  bool readers_stopped = false;
};

// A reader's part: serves process 0's merges, one after the other, until process 0 ends them
// (endMerges) or stops them (a merge failed). Reads each input on `jobs` threads (0: one per core).
// Returns the exit status process 0 ended them with, or -1 when it stopped them; process 0 says what
// failed.
int serveMerges(MergeLink& link, int jobs = 0);

// Process 0, once its command is over: ends the readers' serveMerges with the command's exit status.
// Does nothing when the readers were stopped already.
void endMerges(MergeLink& link, int status);

struct MergeOptions {
  // Merge files of different runs (each keeps its own run row). Runs that a run of the inputs spawned
  // (MPI_Comm_spawn; "spawned_by" in runs.config_json) are merged with it without this.
  bool allow_different_runs = false;
  bool overwrite = false;    // replace an existing output file
  bool detect_steps = true;  // fill calls.step of ranks that have no explicit steps (steps.h)
  int jobs = 0;  // threads that read the inputs; 0: one per core. The output does not depend on it
  // Split across the link's processes (this one is process 0): see MergeLink. Unset or one process:
  // this process reads every input.
  MergeLink* link = nullptr;
};

struct MergeSummary {
  int files = 0;
  int runs = 0;
  int ranks = 0;
  std::int64_t calls = 0;
  std::int64_t measurements = 0;
  std::int64_t steps_detected = 0;  // most steps detected on one rank; 0 when none were
  std::int64_t step_rows = 0;       // rows of the step model written (steps table: rank x step)
  // Hosts whose clock offset to the run's first host was estimated (ranks.clock_offset_ns), and the
  // largest offset in absolute value.
  int hosts_aligned = 0;
  std::int64_t largest_offset_ns = 0;
};

// Expands the command line's inputs: a directory stands for the trace files (*.db) directly inside it,
// in name order; `exclude` (the output) is skipped. Throws when nothing is left.
std::vector<std::string> expandTraceInputs(const std::vector<std::string>& inputs,
                                           const std::string& exclude);

// Merges `inputs` into a new file `output`, keeping every row: calls, measurements, consensus, applied
// calls, recommendations and drops, with ids remapped and each run's times rebased onto its earliest time
// origin. A consensus row without a step (-1) that names its call takes that call's step in the output
// (explicit or detected; it stays -1 when the call has none). A run's config_json is its first file's,
// except that the agent's statistics of every rank ("agent" in a per-rank file) are gathered into
// "agent_ranks", one object per rank with "rank" added (docs/agent.md). Refuses (before writing anything)
// files of different runs unless allowed, the same rank of a run in two files, and unreadable inputs. The
// output appears only when complete.
//
// With detect_steps, each rank whose calls all have step -1 (no explicit markers) gets the steps
// detectSteps() finds in its calls; ranks with any explicit step keep theirs. Detection reads each input
// file's calls once more before copying them (until each of its ranks has shown an explicit step), so the
// steps are written with the calls.
//
// Threads and memory. Validation opens each input, reads its runs and ranks and closes it again. Then
// `jobs` threads read the inputs (steps detected, calls in batches of 4096, the rows that refer to them)
// and this thread remaps and writes them, in input order: the output is the same rows with the same ids
// whatever `jobs` is. A thread takes an input only within 2 x jobs inputs of the one being written, and
// an input's queue holds at most 4 batches; so what the merge holds grows with jobs and with the calls of
// one input, not with the number of inputs: per input being read, detection's 8 bytes (signature) per
// call of its step-less ranks, then detectSteps' 12 bytes and 8-byte result per call of one rank, and 8
// bytes (step) per call while it is copied; the clock samples, 24 bytes per (host, all-reduce) for the
// first 4096 all-reduces of each communicator. The step model written at the end (computeStepModel over
// the output: the steps, exposure and step_calls tables) holds one rank's calls at a time, the rows, 96
// bytes per (rank, step), the exposure, about 100 bytes per distinct collective size, and the step calls,
// about 64 bytes per (step, api, size class); the tuner's workload after it (TraceReader::reductionCounts
// over the output: reduction_sizes, reduction_totals), 48-96 bytes per distinct reduction size and thread. A
// per-rank file holds one rank.
//
// Across processes (options.link): the readers validate their inputs first and process 0 refuses, before
// writing anything, what one process would refuse, with the same message (the failure of the lowest
// input); the clock samples, the remapping and the step model stay on process 0, where the rows are
// written. A failure anywhere stops every reader before this throws.
MergeSummary mergeTraces(const std::vector<std::string>& inputs, const std::string& output,
                         const MergeOptions& options);

}  // namespace gradscope::storage
