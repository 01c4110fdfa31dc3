#include "experiment.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include <mpi.h>

namespace gradscope::samples {
namespace {

bool parseRank(const std::string& text, int& rank) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0' || value < 0 || value > 1'000'000) return false;
  rank = static_cast<int>(value);
  return true;
}

bool parseFraction(const std::string& text, double& fraction) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || *end != '\0' || !std::isfinite(value) || value <= 0 || value > 10)
    return false;
  fraction = value;
  return true;
}

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a hash the same on every platform.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::string parseStraggler(const char* text, Straggler& straggler, int example_rank) {
  const std::string_view value = text != nullptr ? text : "";
  const std::string example = std::to_string(example_rank);
  const std::size_t colon = value.find(':');
  if (colon == std::string_view::npos)
    return "--straggler needs R:F, a rank (or any) and the fraction of its compute to add, 0 < F <= 10 (e.g. "
           "--straggler " +
           example + ":0.5 or --straggler any:0.5)";
  const std::string rank(value.substr(0, colon));
  straggler.any_rank = rank == "any";
  if (!straggler.any_rank && !parseRank(rank, straggler.rank))
    return "--straggler " + std::string(value) + ": R must be a rank >= 0 or any (e.g. --straggler " +
           example + ":0.5)";
  if (!parseFraction(std::string(value.substr(colon + 1)), straggler.fraction))
    return "--straggler " + std::string(value) + ": F must be a number with 0 < F <= 10 (e.g. --straggler " +
           rank + ":0.5)";
  return {};
}

std::string stragglerRankError(const Straggler& straggler, int world) {
  if (straggler.fraction == 0 || straggler.any_rank || straggler.rank < world) return {};
  return "--straggler " + std::to_string(straggler.rank) + ":F: rank " + std::to_string(straggler.rank) +
         " is not a rank of this " + std::to_string(world) + "-rank job; give R from 0 to " +
         std::to_string(world - 1) + ", or any";
}

int slowedRank(const Straggler& straggler, std::uint64_t seed, std::int64_t step, int world) {
  if (!straggler.any_rank) return straggler.rank;
  return static_cast<int>(mix(mix(seed) ^ static_cast<std::uint64_t>(step)) %
                          static_cast<std::uint64_t>(world));
}

void spinFor(std::chrono::duration<double> length) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(length);
  while (Clock::now() < end) {
  }
}

LossCsv::LossCsv(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "w")) {
  if (file_ == nullptr) error_ = std::strerror(errno);
  else std::fputs("step,loss,seconds\n", file_);
}

LossCsv::~LossCsv() {
  if (file_ != nullptr) std::fclose(file_);
}

void LossCsv::write(int step, double loss, double seconds) {
  std::fprintf(file_, "%d,%.9g,%.6f\n", step, loss, seconds);
  std::fflush(file_);
  last_step_ = step;
}

bool LossCsv::close() {
  const bool failed = std::ferror(file_) != 0;
  const int errno_write = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (failed || !closed) error_ = std::strerror(failed ? errno_write : errno);
  return !failed && closed;
}

bool openLossCsv(const std::string& path, int rank, const char* program, std::optional<LossCsv>& csv) {
  if (path.empty()) return true;
  int opened = 0;
  if (rank == 0) {
    csv.emplace(path);
    opened = csv->opened() ? 1 : 0;
    if (!csv->opened())
      std::fprintf(stderr, "%s: cannot write the loss CSV '%s' (%s): give --loss-csv a writable path\n",
                   program, path.c_str(), csv->error().c_str());
  }
  MPI_Bcast(&opened, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return opened != 0;
}

double replicaSpread(std::span<const float> weights, int rank, int world) {
  std::vector<float> reference(weights.begin(), weights.end());
  MPI_Bcast(reference.data(), static_cast<int>(reference.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  const auto largest = [](double a, double b) { return std::isnan(a) || a > b ? a : b; };
  double mine = 0;
  for (std::size_t i = 0; i < weights.size(); ++i)
    mine = largest(std::fabs(static_cast<double>(weights[i]) - static_cast<double>(reference[i])), mine);
  std::vector<double> spreads(rank == 0 ? static_cast<std::size_t>(world) : 0);
  MPI_Gather(&mine, 1, MPI_DOUBLE, spreads.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  double spread = 0;
  for (const double s : spreads) spread = largest(s, spread);
  return spread;
}

void printReplicaSpread(double spread, std::span<const float> weights) {
  double reference = 0;
  for (const float w : weights) reference = std::max(reference, std::fabs(static_cast<double>(w)));
  std::printf("replicas: max |w_r - w_0| = %.9g, relative %.9g\n", spread,
              spread / std::max(reference, 1e-30));
  std::fflush(stdout);
}

}  // namespace gradscope::samples
