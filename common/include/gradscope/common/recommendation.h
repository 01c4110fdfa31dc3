#pragma once

// The recommendation file: per (api, dtype, byte range[, world size]) the aggregation strategy to use,
// with the evidence behind it. `gradscope recommend` (the tuner) writes it; the agent's apply mode (an
// LD_PRELOAD library inside the user's job) and the NCCL tuner plugin read it. The format is described
// field by field in docs/recommendation-file.md.
//
// Reading is for hostile input: parseRecommendation and loadRecommendation throw nothing but
// gradscope::Error (never a JSON library exception or std::bad_alloc, and they never crash, whatever the
// bytes), and the Error's what() is one line "<source>: <what is wrong> (<how to fix it>)". A file that
// passes is self-consistent: every rule may be applied within the error budget the file declares.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradscope/common/types.h"

namespace gradscope {

// The newest format version this build reads and the one it writes. A reader refuses newer files
// (their meaning may have changed); within a version, new keys may be added and older readers ignore them.
inline constexpr int kRecommendationVersion = 1;

// How far a strategy's result may be from the sum the job would have computed. Ordered: a rule may use a
// strategy whose class is at most the class it declares.
//   Lossless: the same sum up to summation order (different algorithm or transport, same wire precision).
//   Lossy:    a narrower type on the wire (fp16, bf16, fp8); bounded by the file's max_rel_error.
//   Semantic: a different aggregate altogether (AdaCons, AdaSum, the async strategies); needs
//             allow_semantic_change.
enum class ErrorClass : std::uint8_t { Lossless, Lossy, Semantic };

std::string_view name(ErrorClass error_class);  // "lossless", "lossy", "semantic"
// Case-insensitive, like the other name look-ups in types.h; nullopt for anything else.
std::optional<ErrorClass> parseErrorClass(std::string_view text);

// The class of a strategy name judged by its parts (DESIGN.md "Strategy names": aggregator/transport[/wire]):
// adacons/* and adasum/* are Semantic; a wire part fp16, bf16, fp8e4m3 or fp8e5m2 is Lossy; everything else
// is Lossless. It does not check that the aggregator or transport exists (parseStrategyName,
// strategy_name.h, does); nullopt for text that is not two or three non-empty parts of [A-Za-z0-9_.-] joined
// by '/'.
std::optional<ErrorClass> strategyErrorClass(std::string_view strategy);

// A 95% interval of a time, in nanoseconds: 0 <= low_ns <= median_ns <= high_ns in a valid file.
struct TimeInterval {
  double median_ns = 0;
  double low_ns = 0;
  double high_ns = 0;
  friend bool operator==(const TimeInterval&, const TimeInterval&) = default;
};

struct RecommendationRule {
  // The reduction it replaces: MPI_Allreduce, MPI_Iallreduce or ncclAllReduce, of the file's backend
  // (other APIs are refused: only all-reduce strategies exist so far).
  Api api = Api::Unknown;
  DType dtype = DType::Fp32;
  std::int64_t min_bytes = 0;  // inclusive byte range of the call's payload (count * element size)
  std::int64_t max_bytes = 0;
  std::optional<int> world_size;                  // unset: any communicator size
  std::string strategy;                           // e.g. "sum/native/bf16"
  ErrorClass error_class = ErrorClass::Lossless;  // declared; the strategy's own class must not exceed it
  std::optional<double> measured_rel_error;       // relative L2 error measured against an fp64 sum
  std::optional<TimeInterval> predicted;          // time of `strategy` on such a call
  std::optional<TimeInterval> baseline;           // time of `baseline_strategy` on such a call
  std::string baseline_strategy;                  // what the job does without the rule, e.g. "sum/native"
  std::int64_t evidence = 0;                      // measurements behind the choice
  friend bool operator==(const RecommendationRule&, const RecommendationRule&) = default;
};

struct Recommendation {
  int version = kRecommendationVersion;
  Backend backend = Backend::Unknown;     // Mpi or Nccl
  std::optional<int> world_size;          // the world size it was made for; unset: several or unknown
  double max_rel_error = 0;               // error budget it was made under; 0 = lossless strategies only
  bool allow_semantic_change = false;     // whether Semantic rules (AdaCons, AdaSum) are allowed
  std::string created;                    // ISO 8601 UTC, e.g. "2024-05-01T12:00:00Z"
  std::string tool_version;               // gradscope version that made it
  std::vector<std::string> source_runs;   // uuids of the runs it was made from
  std::vector<RecommendationRule> rules;  // no two overlap (same api, dtype and world_size, shared bytes)
  // What the plan saves per step, where that is not what its rules' call times say: async rules change
  // the step (docs/async.md), not the call. `gradscope run --validate` compares with it. JSON:
  // "predicted_step_saving_ns" {median, low, high}.
  std::optional<TimeInterval> step_saving;

  // The rule covering a call, or nullptr: api and dtype equal, min_bytes <= bytes <= max_bytes, and
  // world_size equal or unset. A rule for this world size wins over one for any size (a valid file has at
  // most one of each, so the answer does not depend on rule order). Linear in the number of rules, no
  // allocation, no state: every rank asking about the same call gets the same rule, which the agent's
  // collective safety relies on. The pointer lives as long as `rules` is not modified.
  const RecommendationRule* match(Api api, DType dtype, std::int64_t bytes, int world_size) const noexcept;

  friend bool operator==(const Recommendation&, const Recommendation&) = default;
};

// Parses and validates a recommendation file's text. `source_name` (the path, usually) starts every error
// message. Throws gradscope::Error and nothing else.
Recommendation parseRecommendation(std::string_view json_text,
                                   std::string_view source_name = "recommendation");

// Reads and parses the file at `path`. A missing, unreadable, empty, non-regular (a directory, a FIFO that
// could block the job) or too large (over kMaxRecommendationFileBytes) file is an Error naming the path.
inline constexpr std::int64_t kMaxRecommendationFileBytes = 16 << 20;
Recommendation loadRecommendation(const std::string& path);

// The file's text: pretty-printed (2-space indent), keys in the documented order, optional fields left out
// when unset; parseRecommendation(toJson(r)) == r. Refuses (gradscope::Error, source "recommendation") a
// Recommendation that parseRecommendation would refuse, so a writer can never produce a file the agent
// rejects.
std::string toJson(const Recommendation& recommendation);

}  // namespace gradscope
