#pragma once

// Cost models of aggregation strategies, built from the `measurements` rows of trace files.
//
// A model is kept per (collective, strategy, dtype, world size, backend). Per measured size it holds the
// median of the rows' median_ns and a bootstrap 95% interval of that median; between measured sizes it
// interpolates in log-log space, and outside them it extrapolates with an alpha-beta fit
// (time = alpha + bytes * ns_per_byte) whose quality is reported. Every prediction says whether it was
// extrapolated (outside the measured sizes) or predicted for an unmeasured world size, so that no caller
// can pass one off as measured.
//
// Everything here except loadMeasurements is a pure function: deterministic (the bootstrap uses a fixed
// seed) and free of I/O, so the tests check it on synthetic rows.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradscope/common/recommendation.h"
#include "gradscope/common/types.h"
#include "gradscope/storage/reader.h"

namespace gradscope::tuner {

// A measurements row and the backend of the run it belongs to (run ids are file-local, so the backend is
// resolved while the file is open).
struct MeasurementRow {
  storage::Measurement measurement;
  Backend backend = Backend::Unknown;
};

// The trace's measurements, one row per collective measured: a bench row as it is (already aggregated
// over ranks), and the explore rows of one exploration — the same strategy timed on the same call of
// every rank (run, communicator key, sequence number) — merged into one (collapseRanks). The ranks of an
// exploration time one collective together, so their rows are not independent samples: counted as
// such, two ranks would double the evidence a test or an interval sees. In id order of each row's
// first member, with its run's backend.
std::vector<MeasurementRow> loadMeasurements(const storage::TraceReader& reader);

// One row from the rows of one collective measurement on several ranks: median_ns, p90_ns and the
// bandwidths are the medians over the ranks, min_ns the smallest and max_ns the largest, the errors the
// worst (largest relative and absolute error, smallest cosine), overflows summed; rank_id unset, the
// rest from the first row. `rows` must not be empty.
storage::Measurement collapseRanks(std::span<const storage::Measurement> rows);

struct ModelKey {
  Collective collective = Collective::Unknown;  // MPI_Allreduce and MPI_Iallreduce are both AllReduce
  std::string strategy;
  DType dtype = DType::Fp32;
  int world = 1;
  Backend backend = Backend::Unknown;
  friend auto operator<=>(const ModelKey&, const ModelKey&) = default;
};

// One measured size of a model.
struct SizePoint {
  std::int64_t bytes = 0;
  TimeInterval time;  // median of the rows' medians with its bootstrap 95% interval
  int rows = 0;
};

// time = alpha_ns + bytes * ns_per_byte (ns_per_byte = 1/beta), fitted to the medians.
struct AlphaBetaFit {
  bool valid = false;  // false with fewer than two sizes, or a fit without a positive bandwidth
  double alpha_ns = 0;
  double ns_per_byte = 0;
  double r_squared = 0;     // of the medians against the fit
  double relative_rms = 0;  // root mean square of (fit - median) / median
  double predict(double bytes) const { return alpha_ns + bytes * ns_per_byte; }
};

struct StrategyModel {
  ModelKey key;
  std::vector<SizePoint> points;  // ordered by bytes, at least one
  AlphaBetaFit fit;
  std::int64_t rows = 0;                  // measurements behind the model
  std::optional<double> worst_rel_error;  // largest rel_l2_error of its rows; unset when none was measured
  bool predicted_world = false;           // made by modelAtWorld, not measured at key.world
};

struct Prediction {
  TimeInterval time;
  bool extrapolated = false;     // outside the measured sizes: from the alpha-beta fit
  bool predicted_world = false;  // at a world size that was not measured (modelAtWorld)
};

// The sample median (the mean of the two middle values for an even count); 0 for no values.
double median(std::vector<double> values);

// The median of `values` with a 95% percentile-bootstrap interval: `resamples` resamples drawn with a
// SplitMix64 generator seeded with `seed`, so the same values always give the same interval.
// Needs at least one value.
TimeInterval bootstrapMedian(std::span<const double> values, int resamples = 1000,
                             std::uint64_t seed = 0x6772616473636f70ULL);

// Least squares fit of the points' medians, weighted by 1/median^2. Sizes span many decades: an
// unweighted fit would follow the largest sizes only and make alpha (the latency that decides fusion)
// meaningless; relative weights make every size count.
AlphaBetaFit fitAlphaBeta(std::span<const SizePoint> points);

// Groups the rows into models (rows of one key and size make one SizePoint; a row alone gives the
// interval [min_ns, max_ns] of its own repetitions). Rows without a positive size or time are skipped.
// Ordered by key.
std::vector<StrategyModel> buildModels(std::span<const MeasurementRow> rows);

// The model's time at `bytes`: the point itself at a measured size, log-log interpolation of median, low
// and high between two measured sizes, the alpha-beta fit outside them (extrapolated; the interval is
// widened by the fit's relative RMS and the nearest point's relative width). nullopt when the size is
// outside the measured ones and the fit is not valid, or when `bytes` is not positive.
std::optional<Prediction> predict(const StrategyModel& model, std::int64_t bytes);

// A model of the same collective, strategy, dtype and backend at an unmeasured world size, from models
// measured at two or more world sizes: alpha and ns_per_byte are fitted linearly in log(world), and the
// points are the measured sizes of the nearest world, rescaled by the ratio of the fits. Every
// prediction from it is flagged predicted_world. nullopt with fewer than two valid fits or when the
// fitted parameters are not positive at `world`.
std::optional<StrategyModel> modelAtWorld(std::span<const StrategyModel* const> models, int world);

}  // namespace gradscope::tuner
