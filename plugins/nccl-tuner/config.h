#pragma once

// The tuner plugin's configuration: which NCCL algorithm, protocol and channel count to ask for, per
// collective, byte range, communicator shape and group shape. Two inputs (docs/nccl-tuner-plugin.md):
//   - a CSV in NVIDIA's example tuner format (ext-tuner/example), one rule per line:
//       collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]
//     -1 = any (channels: keep NCCL's); '#' starts a comment line; the first matching line wins;
//   - a gradscope recommendation file (JSON, common/recommendation.h), whose sum/nccl.<algo>.<proto> rules
//     become all-reduce rules (other strategies are the agent's business and are skipped).
//
// Parsing is for hostile input, like the recommendation reader: everything throws gradscope::Error and
// nothing else, never crashes, and the message is one line "<file>:<line>: <what is wrong> (<fix>)".
// A file is taken whole or not at all: the plugin logs the message once and leaves every NCCL choice
// alone (a half-applied file would make decisions nobody asked for).
//
// RuleIndex is the hot path's form of a rule list: per collective, the byte axis cut into the segments
// that rule boundaries define, each with the rules covering it in file order, shadowed ones dropped.
// A look-up is one binary search plus a scan of a short list; no allocation, no lock, no strings.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gradscope::nccl_tuner {

inline constexpr int kAny = -1;             // wildcard of every integer field (channels: keep NCCL's count)
inline constexpr int kCollectiveCount = 5;  // ncclFunc_t Broadcast..AllReduce, the ones getCollInfo sees
inline constexpr std::size_t kMaxConfigBytes = 16 << 20;  // same cap as a recommendation file
inline constexpr std::size_t kMaxLineBytes = 4096;
inline constexpr std::size_t kMaxRules = 10000;
// Bounds the index built from one file: entries (a rule in a segment's list) and the work to place them.
// Only files whose rules overlap pathologically reach it; they are refused like any malformed file.
inline constexpr std::size_t kMaxIndexEntries = std::size_t{1} << 20;
inline constexpr std::size_t kMaxIndexWork = std::size_t{1} << 24;

struct Rule {
  int collective = 4;                    // ncclFunc_t value 0..4
  std::uint64_t min_bytes = 0;           // inclusive range of getCollInfo's nBytes
  std::uint64_t max_bytes = UINT64_MAX;  // inclusive
  int algorithm = 0;                     // NCCL_ALGO_* (0..6)
  int protocol = 0;                      // NCCL_PROTO_* (0..2)
  int channels = kAny;                   // > 0: at most this many channels; kAny: NCCL decides
  int nodes = kAny;                      // communicator's node count, or kAny
  int ranks = kAny;                      // communicator's rank count, or kAny
  int pipe_ops = kAny;                   // numPipeOps, or kAny
  int reg_buff = kAny;                   // 0 or 1, or kAny
  int origin = 0;                        // CSV line number, or recommendation rule number (from 1)
  friend bool operator==(const Rule&, const Rule&) = default;
};

enum class ConfigFormat { Csv, Recommendation };

struct Config {
  ConfigFormat format = ConfigFormat::Csv;
  std::vector<Rule> rules;        // matching order: the first rule that matches a call wins
  std::size_t skipped_rules = 0;  // recommendation rules whose strategy is not sum/nccl.<algo>.<proto>
};

// CSV in NVIDIA's example format. Beyond what NVIDIA's parser accepts: names in any letter case,
// NCCL's own algorithm spellings (collnetdirect = collnet_direct), -1 as min_bytes (= 0), spaces around
// fields. Refused where NVIDIA's parser guesses: unknown names, non-numbers, negative numbers other than
// -1, 0 channels/nodes/ranks/numPipeOps, regBuff other than -1/0/1, min_bytes > max_bytes, numbers that
// overflow, fewer than 8 or more than 10 fields, lines over kMaxLineBytes, control characters, text that
// is not UTF-8, a file with no bytes but whitespace, more than kMaxRules rules.
Config parseCsvConfig(std::string_view text, std::string_view source);

// A recommendation file (parseRecommendation's checks first). Rules with strategy sum/nccl.<algo>.<proto>
// (optionally /native) become AllReduce rules with the rule's byte range and world_size as nRanks; rules
// for one world size come before rules for any size, as in Recommendation::match. NCCL's tuner does not
// see the dtype, so two such rules that share a byte and a world size but ask for different algorithms
// or protocols (they can differ in dtype only) are refused. A sum/nccl.* strategy with an unknown
// algorithm or protocol is refused; other strategies are counted in skipped_rules.
Config parseRecommendationConfig(std::string_view text, std::string_view source);

// Either of the above: JSON when the first byte that is not whitespace (after a UTF-8 byte order mark)
// is '{', CSV otherwise. Also checks that the rules fit a RuleIndex (kMaxIndexEntries).
Config parseConfig(std::string_view text, std::string_view source);

// Reads `path` (a regular file of at most kMaxConfigBytes; a directory or FIFO is refused) and parses it.
Config loadConfig(const std::string& path);

// The file the environment names: GRADSCOPE_TUNER_CONFIG, else NCCL_TUNER_CONFIG_FILE (NVIDIA's
// variable); nullopt when neither is set or both are empty. No default file is looked for.
struct ConfigSource {
  std::string path;
  std::string variable;  // the variable it came from, for messages
};
std::optional<ConfigSource> configSourceFromEnvironment();

// Collectives as named in files: "broadcast", "reduce", "allgather", "reducescatter", "allreduce".
// Algorithms and protocols are read with parseNcclAlgo/parseNcclProto and written in NVIDIA's example
// spelling, ncclTunerAlgoName/ncclTunerProtoName (common/types.h).
std::string_view collectiveName(int collective);

// The communicator a RuleIndex is built for.
struct Topology {
  std::uint64_t nodes = 0;
  std::uint64_t ranks = 0;
};

class RuleIndex {
 public:
  struct Entry {
    std::int32_t pipe_ops;
    std::int32_t nodes;  // kAny in an index built for one topology
    std::int32_t ranks;
    std::int8_t reg_buff;
    std::int8_t algorithm;
    std::int8_t protocol;
    std::int32_t channels;
    std::uint32_t rule;  // position in the rule list it was built from
  };

  RuleIndex() = default;

  // Keeps the rules whose nodes and ranks match `topology` (all of them without one). Throws
  // gradscope::Error past kMaxIndexEntries or kMaxIndexWork (a message without a source name).
  static RuleIndex build(std::span<const Rule> rules, std::optional<Topology> topology);

  // The first rule (in list order) matching the call, or nullptr. Only valid for an index built for a
  // topology. collective must be 0..kCollectiveCount-1. noexcept, allocation-free.
  const Entry* find(int collective, std::uint64_t bytes, int pipe_ops, int reg_buff) const noexcept;

  std::size_t entryCount() const noexcept { return entries_.size(); }
  std::size_t ruleCount() const noexcept { return rule_count_; }

 private:
  struct PerCollective {
    std::vector<std::uint64_t> starts;   // segment i covers [starts[i], starts[i+1]); starts[0] == 0
    std::vector<std::uint32_t> offsets;  // segment i's entries: entries_[offsets[i] .. offsets[i+1])
  };
  PerCollective collectives_[kCollectiveCount];
  std::vector<Entry> entries_;
  std::size_t rule_count_ = 0;
};

}  // namespace gradscope::nccl_tuner
