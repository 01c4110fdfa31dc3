#pragma once

// What the MPI samples share for experiments with slow ranks and replicas that may drift apart
// (docs/async.md): --straggler, --loss-csv and --check-replicas (samples/README.md).

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>

namespace gradscope::samples {

// --straggler R:F or any:F: which rank a step slows, and by how much of its own compute.
struct Straggler {
  double fraction = 0;    // F, the busy wait over the step's compute; 0: no straggler
  bool any_rank = false;  // any:F: a rank drawn anew every step (slowedRank)
  int rank = 0;           // R, when not any_rank
};

// --straggler's value: an empty string on success, else one line saying what is wrong and what to give
// (`example_rank` in the examples). Whether R is a rank of the job is checked once its size is known.
std::string parseStraggler(const char* text, Straggler& straggler, int example_rank);
// Empty, or why R is not a rank of a `world`-rank job.
std::string stragglerRankError(const Straggler& straggler, int world);
// The rank slowed in `step`: R, or for any:F one drawn from (seed, step), which every rank computes alike
// without communicating: lateness that moves from rank to rank, not one slow rank.
int slowedRank(const Straggler& straggler, std::uint64_t seed, std::int64_t step, int world);

// Busy-waits for `length`, spinning on the steady clock rather than sleeping: the core stays as busy as it
// would be computing, as on a slower rank.
void spinFor(std::chrono::duration<double> length);

// --loss-csv: rank 0's loss curve, "step,loss,seconds" with the seconds since the training loop started.
class LossCsv {
 public:
  // Opens `path` and writes the header; error() says why not when it failed.
  explicit LossCsv(const std::string& path);
  LossCsv(const LossCsv&) = delete;
  LossCsv& operator=(const LossCsv&) = delete;
  ~LossCsv();

  bool opened() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }
  int lastStep() const { return last_step_; }

  // One row, flushed at once (as the printed losses are), so that a job ended early keeps its curve.
  void write(int step, double loss, double seconds);
  // Closes the file; false (and error()) when a row could not be written.
  bool close();

 private:
  std::string path_;
  std::string error_;
  std::FILE* file_ = nullptr;
  int last_step_ = -1;
};

// Collective over MPI_COMM_WORLD: rank 0 opens `path` into `csv` and tells the others whether it could, so
// that a path it cannot write ends every rank alike before the first step. False on every rank when it
// could not (rank 0 has said why, as `program`). An empty path: true, no CSV, no communication.
bool openLossCsv(const std::string& path, int rank, const char* program, std::optional<LossCsv>& csv);

// --check-replicas: the largest |w_r - w_0| over every rank r and weight, on rank 0 (0 on the others).
// Collective: rank 0 broadcasts its weights, every rank compares its own with them in double (the
// difference of two floats, rounded once), and rank 0 gathers each rank's largest. A NaN difference stays
// NaN instead of vanishing in a max.
double replicaSpread(std::span<const float> weights, int rank, int world);
// Rank 0's line: "replicas: max |w_r - w_0| = X, relative Y", Y over rank 0's largest weight.
void printReplicaSpread(double spread, std::span<const float> weights);

}  // namespace gradscope::samples
