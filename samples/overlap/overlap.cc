// gradscope-sample-overlap: an MPI job whose every step has a known split into compute and communication,
// to check gradscope's per-step breakdown against. Each step, on every rank:
//
//   1. spin --compute-us A microseconds (default 400): the "forward pass";
//   2. post MPI_Iallreduce (MPI_SUM, MPI_FLOAT) of --bytes B bytes (default 1 MiB) into a buffer of its own;
//   3. spin --overlap-us C (default 600): compute that hides the nonblocking reduction;
//   4. MPI_Wait for it;
//   5. on rank --late-rank R only (default -1: none), spin --late-us D more (default 0): the straggler;
//   6. MPI_Allreduce (MPI_SUM, MPI_FLOAT) of 8 floats: a blocking reduction every other rank waits in for R.
//
// "Spin" is a busy loop on clock_gettime(CLOCK_MONOTONIC), not a sleep: the rank stays on its core, as a
// rank computing does. With --truth PATH every rank writes what it measured itself (see TruthFile): the
// same clock read around each spin and each MPI call, so that a profiler's numbers can be compared with
// the job's own. The readings are chained, each interval starting where the last one ended, so a step's
// compute and blocked times add up to its wall time exactly.
//
// Deterministic: each rank's data are small integers from a fixed-seed generator written here, whose sums
// floats hold exactly. At the end every rank checks its reduced buffers against the sums it computes itself
// (exit status 1 on a difference), and rank 0 prints an FNV-1a hash of them, so that runs with and without
// a profiler can be compared bit for bit. The wall time of the loop goes to stderr.

#include <time.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <mpi.h>

namespace {

constexpr char kProgram[] = "gradscope-sample-overlap";

constexpr long long kMaxMicroseconds = 10'000'000;  // 10 s: more is a typo, not a step
constexpr long long kMaxBytes = 1LL << 30;          // the element count stays an int
constexpr int kBlockingFloats = 8;                  // step 6's reduction

struct Options {
  long long compute_us = 400;
  long long bytes = 1 << 20;
  long long overlap_us = 600;
  long long late_rank = -1;
  long long late_us = 0;
  long long steps = 50;
  std::string truth;  // empty: no truth file
};

void printUsage(std::FILE* stream) {
  std::fprintf(stream,
               "usage: %s [--steps N] [--compute-us A] [--bytes B] [--overlap-us C] [--late-rank R]\n"
               "       [--late-us D] [--truth PATH]\n"
               "  each step: spin A us, post MPI_Iallreduce of B bytes, spin C us, MPI_Wait, spin D us more\n"
               "  on rank R only, MPI_Allreduce of 8 floats\n"
               "  --steps N       steps, 1 to 1000000 (default 50)\n"
               "  --compute-us A  the spin before the nonblocking reduction (default 400)\n"
               "  --bytes B       the nonblocking reduction's size, a multiple of 4 from 4 to 1073741824\n"
               "                  (default 1048576)\n"
               "  --overlap-us C  the spin while it is in flight (default 600)\n"
               "  --late-rank R   the rank that arrives late at the blocking reduction, -1 for none\n"
               "                  (default -1)\n"
               "  --late-us D     how late it arrives (default 0)\n"
               "  --truth PATH    each rank writes the times it measured as JSON to PATH, %%r replaced by\n"
               "                  its rank in MPI_COMM_WORLD\n"
               "  durations in microseconds, 0 to 10000000\n",
               kProgram);
}

bool parseInteger(const char* text, long long low, long long high, long long& value) {
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || parsed < low || parsed > high) return false;
  value = parsed;
  return true;
}

// Returns an empty string on success, else one sentence saying what is wrong and how to put it right.
std::string parseOptions(int argc, char** argv, Options& options, bool& help) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    const auto given = [&] { return "'" + std::string(value != nullptr ? value : "") + "'"; };
    const auto number = [&](long long low, long long high, long long& target) {
      if (value == nullptr || !parseInteger(value, low, high, target)) return false;
      ++i;
      return true;
    };
    const auto microseconds = [&](long long& target) {
      if (number(0, kMaxMicroseconds, target)) return std::string();
      return std::string(arg) + " needs a whole number of microseconds from 0 to 10000000, not " + given();
    };
    std::string error;
    if (arg == "--help" || arg == "-h") {
      help = true;
    } else if (arg == "--steps") {
      if (!number(1, 1'000'000, options.steps))
        error = "--steps needs a number of steps from 1 to 1000000, not " + given();
    } else if (arg == "--compute-us") {
      error = microseconds(options.compute_us);
    } else if (arg == "--overlap-us") {
      error = microseconds(options.overlap_us);
    } else if (arg == "--late-us") {
      error = microseconds(options.late_us);
    } else if (arg == "--bytes") {
      if (!number(4, kMaxBytes, options.bytes) || options.bytes % 4 != 0)
        error = "--bytes needs a multiple of 4 (the size of a float) from 4 to 1073741824, not " + given();
    } else if (arg == "--late-rank") {
      if (!number(-1, 1'000'000'000, options.late_rank))
        error = "--late-rank needs a rank, or -1 for none, not " + given();
    } else if (arg == "--truth") {
      if (value == nullptr || *value == '\0') error = "--truth needs a file path, e.g. truth-%r.json";
      else options.truth = argv[++i];
    } else {
      error = "unknown option '" + std::string(arg) + "': --help lists the options";
    }
    if (!error.empty()) return error;
  }
  return {};
}

// This process's rank as the launcher set it, or 0 without a launcher: who reports a bad command line,
// which is refused before MPI_Init so that no rank starts MPI for nothing.
int launcherRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* value = std::getenv(name); value != nullptr) return std::atoi(value);
  return 0;
}

std::int64_t clockNs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

// Busy-waits until CLOCK_MONOTONIC reaches `deadline`; returns the first reading at or past it.
std::int64_t spinUntil(std::int64_t deadline) {
  std::int64_t now = clockNs();
  while (now < deadline) now = clockNs();
  return now;
}

// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and the same numbers on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // An integer in [-64, 64) as a float: sums over up to 2^17 ranks stay exact (below 2^24).
  float smallInteger() { return static_cast<float>(static_cast<int>(next() >> 57) - 64); }

 private:
  std::uint64_t state_;
};

constexpr std::uint64_t kDataSeed = 0x5eed'0401;

// Rank r's input of the nonblocking reduction; every rank can make every other rank's.
void fillInput(int rank, std::vector<float>& input) {
  Rng rng(kDataSeed + 0x1000193 * static_cast<std::uint64_t>(rank));
  for (float& x : input) x = rng.smallInteger();
}

// Rank r's input of the blocking reduction in step k: small integers that change with the step.
float blockingInput(int rank, long long step, int j) {
  return static_cast<float>((step % 1024 + 1) * (j + 1) + rank);
}

std::uint64_t fnv1a64(const std::vector<float>& values, std::uint64_t hash = 0xcbf29ce484222325ULL) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (std::size_t i = 0; i < values.size() * sizeof(float); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  return hash;
}

// What one rank measured in one step, in nanoseconds of CLOCK_MONOTONIC. The intervals follow each other
// without a gap, in this order, from start_ns on.
struct StepTimes {
  std::int64_t start_ns = 0;      // the clock when the step began: the ranks of one machine share it
  std::int64_t forward_ns = 0;    // 1. the spin before posting
  std::int64_t post_ns = 0;       // 2. MPI_Iallreduce
  std::int64_t overlap_ns = 0;    // 3. the spin while the reduction is in flight
  std::int64_t wait_ns = 0;       // 4. MPI_Wait
  std::int64_t late_ns = 0;       // 5. the late rank's extra spin (0 elsewhere)
  std::int64_t allreduce_ns = 0;  // 6. MPI_Allreduce

  std::int64_t computeNs() const { return forward_ns + overlap_ns + late_ns; }
  std::int64_t blockedNs() const { return post_ns + wait_ns + allreduce_ns; }
};

// The truth file (--truth): {"rank": r, "steps": [{...}, ...]}, one object per step, in step order, with
// compute_ns (spins 1, 3 and 5), blocked_ns (inside MPI_Iallreduce, MPI_Wait and MPI_Allreduce), late_ns
// (spin 5) and each field of StepTimes on its own. Opened before the loop, so that a path no rank can
// write is refused before the job runs; written after it, so that no file I/O happens between the steps.
class TruthFile {
 public:
  // Opens `pattern` with %r replaced by `rank`; error() says why not when it failed.
  TruthFile(const std::string& pattern, int rank) : rank_(rank) {
    for (std::size_t i = 0; i < pattern.size(); ++i) {
      if (pattern.compare(i, 2, "%r") == 0) {
        path_ += std::to_string(rank);
        ++i;
      } else {
        path_ += pattern[i];
      }
    }
    file_ = std::fopen(path_.c_str(), "w");
    if (file_ == nullptr) error_ = std::strerror(errno);
  }
  TruthFile(const TruthFile&) = delete;
  TruthFile& operator=(const TruthFile&) = delete;
  ~TruthFile() {
    if (file_ != nullptr) std::fclose(file_);
  }

  bool opened() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

  // Removes the file: another rank could not open its own, and the job does not run.
  void discard() {
    std::fclose(file_);
    file_ = nullptr;
    std::remove(path_.c_str());
  }

  // Writes every step and closes the file; false (and error()) when something could not be written.
  bool write(const std::vector<StepTimes>& steps) {
    std::fprintf(file_, "{\"rank\": %d, \"steps\": [", rank_);
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const StepTimes& t = steps[k];
      std::fprintf(
          file_,
          "%s\n  {\"compute_ns\": %lld, \"blocked_ns\": %lld, \"late_ns\": %lld, \"start_ns\": %lld, "
          "\"forward_ns\": %lld, \"post_ns\": %lld, \"overlap_ns\": %lld, \"wait_ns\": %lld, "
          "\"allreduce_ns\": %lld}",
          k == 0 ? "" : ",", static_cast<long long>(t.computeNs()), static_cast<long long>(t.blockedNs()),
          static_cast<long long>(t.late_ns), static_cast<long long>(t.start_ns),
          static_cast<long long>(t.forward_ns), static_cast<long long>(t.post_ns),
          static_cast<long long>(t.overlap_ns), static_cast<long long>(t.wait_ns),
          static_cast<long long>(t.allreduce_ns));
    }
    std::fprintf(file_, "\n]}\n");
    const bool failed = std::ferror(file_) != 0;
    const int errno_write = errno;
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    if (failed || !closed) error_ = std::strerror(failed ? errno_write : errno);
    return !failed && closed;
  }

 private:
  const int rank_;
  std::string path_;
  std::string error_;
  std::FILE* file_ = nullptr;
};

// Whether every rank's `ok` is true (one MPI_Allreduce over the world).
bool everyRank(bool ok) {
  const int mine = ok ? 1 : 0;
  int all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all != 0;
}

// The buffers of the two reductions: the nonblocking one's (input, a separate output) and the blocking
// one's, whose input changes with the step.
struct Buffers {
  std::vector<float> input, reduced;
  std::vector<float> blocking_in = std::vector<float>(kBlockingFloats);
  std::vector<float> blocking_out = std::vector<float>(kBlockingFloats);
};

// The loop: every step's six parts, timed. Each clock reading ends one interval and starts the next. What
// little the loop does besides spinning and calling MPI (filling blocking_in, storing the readings) falls
// inside the spin that follows it, whose deadline counts from the reading before.
std::vector<StepTimes> runSteps(const Options& options, int rank, Buffers& buffers) {
  std::vector<StepTimes> times(static_cast<std::size_t>(options.steps));
  const bool late = rank == options.late_rank;
  const std::int64_t compute_ns = options.compute_us * 1000, overlap_ns = options.overlap_us * 1000,
                     late_ns = options.late_us * 1000;
  const int floats = static_cast<int>(buffers.input.size());
  std::int64_t now = clockNs();
  for (long long step = 0; step < options.steps; ++step) {
    StepTimes& t = times[static_cast<std::size_t>(step)];
    for (int j = 0; j < kBlockingFloats; ++j)
      buffers.blocking_in[static_cast<std::size_t>(j)] = blockingInput(rank, step, j);
    const std::int64_t forward_end = spinUntil(now + compute_ns);
    t.start_ns = now;
    t.forward_ns = forward_end - now;

    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Iallreduce(buffers.input.data(), buffers.reduced.data(), floats, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                   &request);
    const std::int64_t posted = clockNs();
    t.post_ns = posted - forward_end;

    const std::int64_t overlap_end = spinUntil(posted + overlap_ns);
    t.overlap_ns = overlap_end - posted;

    MPI_Wait(&request, MPI_STATUS_IGNORE);
    const std::int64_t waited = clockNs();
    t.wait_ns = waited - overlap_end;

    std::int64_t late_end = waited;
    if (late) {
      late_end = spinUntil(waited + late_ns);
      t.late_ns = late_end - waited;
    }

    MPI_Allreduce(buffers.blocking_in.data(), buffers.blocking_out.data(), kBlockingFloats, MPI_FLOAT,
                  MPI_SUM, MPI_COMM_WORLD);
    now = clockNs();
    t.allreduce_ns = now - late_end;
  }
  return times;
}

// Whether the last step's reductions made exactly the sums of every rank's inputs, which this rank makes
// again itself (small integers: any order of addition gives the same floats).
bool sumsExact(const Buffers& buffers, int world, long long last_step) {
  std::vector<float> expected(buffers.input.size(), 0.0f), other(buffers.input.size());
  std::vector<float> expected_blocking(kBlockingFloats, 0.0f);
  for (int r = 0; r < world; ++r) {
    fillInput(r, other);
    for (std::size_t i = 0; i < other.size(); ++i) expected[i] += other[i];
    for (int j = 0; j < kBlockingFloats; ++j)
      expected_blocking[static_cast<std::size_t>(j)] += blockingInput(r, last_step, j);
  }
  return buffers.reduced == expected && buffers.blocking_out == expected_blocking;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  bool help = false;
  const std::string error = parseOptions(argc, argv, options, help);
  if (help || !error.empty()) {
    if (launcherRank() == 0) {
      if (!error.empty()) std::fprintf(stderr, "%s: %s\n", kProgram, error.c_str());
      else printUsage(stdout);
    }
    return error.empty() ? 0 : 2;
  }

  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (options.late_rank >= world) {
    // Every rank sees the same: all of them leave, rank 0 says why.
    if (rank == 0)
      std::fprintf(stderr,
                   "%s: --late-rank %lld is not a rank of this %d-rank job: give 0 to %d, or -1 for none\n",
                   kProgram, options.late_rank, world, world - 1);
    MPI_Finalize();
    return 2;
  }
  std::optional<TruthFile> truth;
  if (!options.truth.empty()) {
    truth.emplace(options.truth, rank);
    if (!truth->opened())
      std::fprintf(stderr,
                   "%s: rank %d cannot write the truth file '%s' (%s): give --truth a path in a "
                   "writable directory\n",
                   kProgram, rank, truth->path().c_str(), truth->error().c_str());
    // Every rank runs the loop or none does: a rank alone in it would wait for the others forever.
    if (!everyRank(truth->opened())) {
      if (truth->opened()) truth->discard();
      MPI_Finalize();
      return 2;
    }
  }

  const auto floats = static_cast<std::size_t>(options.bytes) / sizeof(float);
  Buffers buffers{.input = std::vector<float>(floats), .reduced = std::vector<float>(floats)};
  fillInput(rank, buffers.input);
  const std::int64_t started = clockNs();
  const std::vector<StepTimes> times = runSteps(options, rank, buffers);
  const double elapsed = 1e-9 * static_cast<double>(clockNs() - started);

  int status = 0;
  if (!sumsExact(buffers, world, options.steps - 1)) {
    std::fprintf(stderr, "%s: rank %d: the reduced buffers differ from the sums of every rank's inputs\n",
                 kProgram, rank);
    status = 1;
  }
  if (truth && !truth->write(times)) {
    std::fprintf(stderr, "%s: rank %d could not write the truth file '%s' (%s)\n", kProgram, rank,
                 truth->path().c_str(), truth->error().c_str());
    status = 1;
  }
  if (rank == 0) {
    std::printf("overlap %d ranks, %lld steps, %zu + %d floats reduced: fnv1a64 %016llx\n", world,
                options.steps, floats, kBlockingFloats,
                static_cast<unsigned long long>(fnv1a64(buffers.blocking_out, fnv1a64(buffers.reduced))));
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %lld steps in %.3f s (%.3f ms per step)\n", kProgram, options.steps, elapsed,
                 1e3 * elapsed / static_cast<double>(options.steps));
  }
  MPI_Finalize();
  return status;
}
