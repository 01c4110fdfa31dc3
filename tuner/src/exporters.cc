// Exporters: one recommendation, many deployment formats.

#include "gradscope/tuner/exporters.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "gradscope/common/strategy_name.h"
#include "gradscope/common/units.h"

namespace gradscope::tuner {
namespace {

// The rule's strategy as the agent reads it; nullopt for a name the agent would refuse (a hand-made or
// newer file), which no format can express either.
std::optional<StrategyName> strategyOf(const RecommendationRule& rule) {
  return parseStrategyName(rule.strategy);
}

// nccl.<algo>.<proto> -> NCCL's algorithm and protocol codes; nullopt for other transports.
std::optional<std::pair<int, int>> ncclEngine(const std::optional<StrategyName>& strategy) {
  if (!strategy || strategy->transport != Transport::Engine || strategy->engine != Backend::Nccl)
    return std::nullopt;
  return std::pair{strategy->algorithm, strategy->protocol};
}

// mpi.<algorithm> -> its coll_tuned_allreduce_algorithm value; nullopt for other transports.
std::optional<int> mpiAlgorithm(const std::optional<StrategyName>& strategy) {
  if (!strategy || strategy->transport != Transport::Engine || strategy->engine != Backend::Mpi)
    return std::nullopt;
  return strategy->algorithm;
}

// A plain sum in the job's dtype: what an engine's environment variables can express.
bool isPlainSum(const std::optional<StrategyName>& strategy) {
  return strategy && strategy->aggregator == Aggregator::Sum && !strategy->wire;
}

std::string bytes(std::int64_t value) {
  return formatBytes(static_cast<std::uint64_t>(value));
}

std::string range(const RecommendationRule& rule) {
  if (rule.min_bytes == rule.max_bytes)
    return fmt::format("{} {} {}", name(rule.api), name(rule.dtype), bytes(rule.min_bytes));
  return fmt::format("{} {} {}..{}", name(rule.api), name(rule.dtype), bytes(rule.min_bytes),
                     bytes(rule.max_bytes));
}

std::string interval(const TimeInterval& time) {
  return fmt::format("{} [{}, {}]", formatDuration(time.median_ns), formatDuration(time.low_ns),
                     formatDuration(time.high_ns));
}

std::string budget(const Recommendation& recommendation) {
  return fmt::format("{}; semantic changes {}",
                     recommendation.max_rel_error > 0
                         ? fmt::format("max relative error {:.3g}", recommendation.max_rel_error)
                         : std::string("lossless only"),
                     recommendation.allow_semantic_change ? "allowed" : "not allowed");
}

std::string worldText(const Recommendation& recommendation, const Report& report) {
  return fmt::format("world size {}{}", recommendation.world_size.value_or(report.world),
                     report.world_predicted ? " (prediction: not measured)" : "");
}

std::string perStep(const Report& report) {
  if (report.workload_from_measurements) return "per measured size set";
  return report.steps_known ? "per step" : "per run";
}

double savedShare(const Report& report) {
  if (!report.baseline_per_step || report.baseline_per_step->median_ns <= 0) return 0;
  return 1 - report.choice_per_step->median_ns / report.baseline_per_step->median_ns;
}

std::string header(std::string_view comment, const Recommendation& recommendation, const Report& report) {
  std::string text =
      fmt::format("{} gradscope {} recommendation: {}, {}; {}\n", comment, recommendation.tool_version,
                  name(recommendation.backend), worldText(recommendation, report), budget(recommendation));
  if (!recommendation.source_runs.empty()) {
    text += fmt::format("{} from run", comment);
    for (const auto& run : recommendation.source_runs) text += " " + run;
    text += "\n";
  }
  return text;
}

// The size table's rows: one per size (or size class) when a reader can take them in, else runs of
// sizes within one power of two that share the winner, with calls summed and the times of an average
// call of the run.
constexpr std::size_t kMaxTableRows = 64;

struct TableRow {
  Api api = Api::Unknown;
  DType dtype = DType::Fp32;
  std::int64_t min_bytes = 0, max_bytes = 0;
  double calls_per_step = 0;
  std::optional<TimeInterval> baseline;
  std::string best;
  bool extrapolated = false;
  double gain = 0;
  std::size_t sizes = 0;  // rows of the report it stands for
};

std::vector<TableRow> tableRows(const Report& report) {
  std::vector<TableRow> rows;
  const bool group = report.sizes.size() > kMaxTableRows;
  TimeInterval baseline, best;
  const auto close = [&] {
    auto& row = rows.back();
    if (row.sizes < 2 || !row.baseline || row.calls_per_step <= 0) return;  // one row: as the report has it
    row.baseline = TimeInterval{baseline.median_ns / row.calls_per_step, baseline.low_ns / row.calls_per_step,
                                baseline.high_ns / row.calls_per_step};
    row.gain = baseline.median_ns > 0 ? 1 - best.median_ns / baseline.median_ns : 0;
  };
  for (const auto& size : report.sizes) {
    const bool same = group && !rows.empty() && rows.back().api == size.api &&
                      rows.back().dtype == size.dtype && rows.back().best == size.best &&
                      rows.back().baseline.has_value() == size.baseline.has_value() &&
                      std::bit_width(static_cast<std::uint64_t>(rows.back().min_bytes)) ==
                          std::bit_width(static_cast<std::uint64_t>(size.min_bytes));
    const double calls = size.calls_per_step;
    if (!same) {
      if (!rows.empty()) close();
      rows.push_back({size.api, size.dtype, size.min_bytes, size.max_bytes, 0, size.baseline, size.best,
                      false, size.gain, 0});
      baseline = best = TimeInterval{};
    }
    auto& row = rows.back();
    row.max_bytes = size.max_bytes;
    row.calls_per_step += calls;
    row.extrapolated |= size.extrapolated;
    ++row.sizes;
    if (size.baseline) {
      baseline.median_ns += size.baseline->median_ns * calls;
      baseline.low_ns += size.baseline->low_ns * calls;
      baseline.high_ns += size.baseline->high_ns * calls;
      best.median_ns += size.best_time->median_ns * calls;
    }
  }
  if (!rows.empty()) close();
  return rows;
}

std::string sizeText(const TableRow& row) {
  const std::string text = row.min_bytes == row.max_bytes
                               ? bytes(row.min_bytes)
                               : fmt::format("{}..{}", bytes(row.min_bytes), bytes(row.max_bytes));
  return text + (row.extrapolated ? "*" : "");
}

std::string formatText(const Recommendation& recommendation, const Report& report, bool markdown) {
  std::string out;
  const std::string_view bullet = markdown ? "- " : "  ";
  if (markdown) out += "# gradscope recommendation\n\n";
  out += fmt::format("{}{} {}, {}; {}.\n",
                     markdown ? "" : "gradscope recommendation: ", markdown ? "Backend" : "backend",
                     name(recommendation.backend), worldText(recommendation, report), budget(recommendation));
  out += fmt::format("Workload: {}.\n\n",
                     report.workload_from_measurements
                         ? "no observed calls, one call of each measured size"
                         : fmt::format("the job's observed all-reduce calls, {}", perStep(report)));
  if (report.baseline_per_step) {
    out += fmt::format("{}Predicted reduction time {} (95% intervals){}\n", markdown ? "## " : "",
                       perStep(report), markdown ? "\n" : ":");
    out += fmt::format("{}baseline sum/native: {}\n", bullet, interval(*report.baseline_per_step));
    if (!report.async_choice.empty())
      out += fmt::format(
          "{}recommended:         {} for every reduction (the synchronous choices below are what "
          "it outdoes on the step)\n",
          bullet, report.async_choice);
    else
      out += fmt::format("{}recommended:         {} ({:.1f}% less)\n", bullet,
                         interval(*report.choice_per_step), 100 * savedShare(report));
    // The step is what the user waits for: what of the reductions' saving it keeps (storage/step_model.h).
    if (report.step_ns && report.step_saving_ns && *report.step_ns > 0) {
      const double reductions_saved = report.baseline_per_step->median_ns - report.choice_per_step->median_ns;
      out += fmt::format("{}on the step:         {} of {} per step ({:.2f}% faster){}\n", bullet,
                         formatDuration(*report.step_saving_ns), formatDuration(*report.step_ns),
                         100 * *report.step_saving_ns / *report.step_ns,
                         reductions_saved > 0 && *report.step_saving_ns < 0.5 * reductions_saved
                             ? ": most of this reduction is hidden behind compute"
                             : "");
    }
    out += "\n";
  }
  const auto rows = tableRows(report);
  if (markdown) {
    out +=
        "## Sizes\n\n| api | dtype | size | calls | baseline | best | gain "
        "|\n|---|---|---:|---:|---|---|---:|\n";
    for (const auto& row : rows)
      out += fmt::format("| {} | {} | {} | {:.4g} | {} | {} | {:.1f}% |\n", name(row.api), name(row.dtype),
                         sizeText(row), row.calls_per_step, row.baseline ? interval(*row.baseline) : "-",
                         row.baseline ? row.best : "-", 100 * row.gain);
  } else {
    std::size_t size_width = 11;
    for (const auto& row : rows) size_width = std::max(size_width, sizeText(row).size());
    out += fmt::format("{:<15} {:<6} {:>{}} {:>9}  {:<32} {:<28} {:>6}\n", "api", "dtype", "size", size_width,
                       "calls", "baseline", "best", "gain");
    for (const auto& row : rows)
      out += fmt::format("{:<15} {:<6} {:>{}} {:>9.4g}  {:<32} {:<28} {:>5.1f}%\n", name(row.api),
                         name(row.dtype), sizeText(row), size_width, row.calls_per_step,
                         row.baseline ? interval(*row.baseline) : "-", row.baseline ? row.best : "-",
                         100 * row.gain);
  }
  if (rows.size() < report.sizes.size())
    out += fmt::format(
        "{}({} sizes in {} rows: runs of sizes within a power of two with the same winner; "
        "times per average call)\n",
        markdown ? "\n" : "", report.sizes.size(), rows.size());
  out += fmt::format("\n{}Rules{}\n{}", markdown ? "## " : "", markdown ? "" : ":", markdown ? "\n" : "");
  if (recommendation.rules.empty()) out += fmt::format("{}none: keep sum/native\n", bullet);
  for (const auto& rule : recommendation.rules)
    out += fmt::format("{}{} -> {} ({}, {} measurements)\n", bullet, range(rule), rule.strategy,
                       name(rule.error_class), rule.evidence);
  if (report.fusion)
    out += fmt::format(
        "\n{}Fusion{}\n{}{}fuse calls under 64 KiB ({:.0f}% of the baseline's time) into {} buckets: "
        "predicted "
        "saving {} {}{}; DDP bucket_cap_mb={}, HOROVOD_FUSION_THRESHOLD={}, TF bytes_per_pack={}\n",
        markdown ? "## " : "", markdown ? "" : ":", markdown ? "\n" : "", bullet,
        100 * report.fusion->small_share, bytes(report.fusion->bucket_bytes),
        formatDuration(report.fusion->gain_ns), perStep(report),
        report.fusion->step_gain_ns
            ? fmt::format(" ({} of it on the step)", formatDuration(*report.fusion->step_gain_ns))
            : std::string(),
        report.fusion->bucket_bytes >> 20, report.fusion->bucket_bytes, report.fusion->bucket_bytes);
  out += fmt::format("\n{}Reasoning{}\n{}", markdown ? "## " : "", markdown ? "" : ":", markdown ? "\n" : "");
  for (const auto& line : report.reasoning) out += fmt::format("{}{}\n", markdown ? "- " : "  - ", line);
  if (report.consensus_note)
    out += fmt::format("\n{}Note: {}\n", markdown ? "**" : "", *report.consensus_note);
  return out;
}

std::string formatNcclTuner(const Recommendation& recommendation, const Report& report) {
  std::string out = header("#", recommendation, report);
  out += "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks\n";
  int lines = 0;
  // NCCL's tuner sees bytes, not the dtype: a rule of another dtype whose bytes overlap an earlier line
  // with a different engine would be decided by line order. It is left out, and says so.
  struct Line {
    std::int64_t min_bytes, max_bytes;
    std::pair<int, int> engine;
  };
  std::vector<Line> written;
  for (const auto& rule : recommendation.rules) {
    const auto engine = ncclEngine(strategyOf(rule));
    if (!engine || recommendation.backend != Backend::Nccl) continue;
    const auto conflict = std::find_if(written.begin(), written.end(), [&](const Line& line) {
      return line.min_bytes <= rule.max_bytes && rule.min_bytes <= line.max_bytes && line.engine != *engine;
    });
    if (conflict != written.end()) {
      out += fmt::format(
          "# left out: {} -> {} overlaps an earlier line with another algorithm/protocol; NCCL's tuner does "
          "not see the dtype (gradscope run --mode apply does)\n",
          range(rule), rule.strategy);
      continue;
    }
    written.push_back({rule.min_bytes, rule.max_bytes, *engine});
    out += fmt::format("allreduce,{},{},{},{},-1,-1,{}\n", rule.min_bytes, rule.max_bytes,
                       ncclTunerAlgoName(engine->first), ncclTunerProtoName(engine->second),
                       rule.world_size ? std::to_string(*rule.world_size) : std::string("-1"));
    ++lines;
  }
  if (lines == 0)
    out += "# no nccl.<algorithm>.<protocol> strategy was recommended: NCCL keeps its own choice\n";
  return out;
}

// ---- Open MPI's coll_tuned dynamic rules file ------------------------------------------------------------
//
// What Open MPI 4.1 reads when OMPI_MCA_coll_tuned_use_dynamic_rules=1 and
// OMPI_MCA_coll_tuned_dynamic_rules_filename name the file (ompi/mca/coll/tuned/coll_tuned_dynamic_file.c;
// 5.0 reads the same): integers separated by white space, '#' starting a comment to the end of its line.
//   <collectives>
//   per collective:        <collective id> <communicator sizes>
//   per communicator size: <ranks> <message rules>
//   per message rule:      <from bytes> <algorithm> <fan in/out> <segment size>
// For a call, coll_tuned takes the communicator entry with the largest size <= the communicator's (the first
// entry when every one is larger: hence an entry from 1 rank), then the message rule with the largest
// `from` <= count x datatype size (so the first one starts at 0). Algorithm 0 hands the call to the fixed
// decision, as without the file. 4.1's reader ignores a file it cannot parse without a word (its messages
// are compiled into debug builds only), so this writer keeps to the grammar exactly: nothing but integers
// outside comments, and no leading zeros (the reader's %li takes 010 for octal).
constexpr int kOmpiAllreduceId = 2;  // ALLREDUCE in COLLTYPE_T, ompi/mca/coll/base/coll_base_functions.h

// The coll_tuned all-reduce algorithm of a rule, or nullopt and why the file cannot express it.
std::optional<int> ompiAlgorithm(const RecommendationRule& rule, std::string& why) {
  const auto strategy = strategyOf(rule);
  if (rule.api == Api::NcclAllReduce) {
    why = "an NCCL all-reduce, not Open MPI's: use --format nccl-tuner";
    return std::nullopt;
  }
  if (rule.api != Api::MpiAllreduce) {
    why = fmt::format(
        "coll_tuned does not decide {} (coll/libnbc serves nonblocking collectives); use gradscope run "
        "--mode apply --recommendation FILE",
        name(rule.api));
    return std::nullopt;
  }
  if (isPlainSum(strategy) && strategy->transport == Transport::Native) return 0;
  if (const auto algorithm = mpiAlgorithm(strategy); algorithm && isPlainSum(strategy)) return *algorithm;
  why = "not one of Open MPI's algorithms; use gradscope run --mode apply --recommendation FILE";
  return std::nullopt;
}

std::string ompiAlgorithmText(int algorithm) {
  return algorithm == 0 ? std::string("Open MPI's own decision")
                        : fmt::format("{} ({})", mpiAlgorithmName(algorithm), algorithm);
}

std::string ranksText(std::optional<int> world) {
  return world ? fmt::format("{} ranks", *world) : std::string("any number of ranks");
}

struct OmpiSegment {
  std::int64_t min_bytes = 0, max_bytes = 0;
  int algorithm = 0;
  const RecommendationRule* rule = nullptr;
};

// The message rules of one communicator entry: from 0 bytes, algorithm 0 wherever no segment is; one line
// each, and how many.
struct OmpiMessageRules {
  std::size_t count = 0;
  std::string lines;
};

OmpiMessageRules ompiMessageRules(std::vector<OmpiSegment> segments) {
  std::sort(segments.begin(), segments.end(),
            [](const OmpiSegment& a, const OmpiSegment& b) { return a.min_bytes < b.min_bytes; });
  std::vector<std::pair<std::int64_t, int>> starts;  // from bytes, algorithm
  const auto start = [&](std::int64_t from, int algorithm) {
    if (starts.empty() || starts.back().second != algorithm) starts.emplace_back(from, algorithm);
  };
  std::int64_t next = 0;  // the first byte count not yet decided
  bool open_ended = true;
  for (const auto& segment : segments) {
    if (!open_ended || segment.max_bytes < next) continue;  // covered already, by the same algorithm
    if (segment.min_bytes > next) start(next, 0);
    start(std::max(segment.min_bytes, next), segment.algorithm);
    if (segment.max_bytes == std::numeric_limits<std::int64_t>::max()) open_ended = false;
    else next = segment.max_bytes + 1;
  }
  if (open_ended) start(next, 0);
  OmpiMessageRules rules{starts.size(), {}};
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const auto [from, algorithm] = starts[i];
    const std::int64_t to = i + 1 < starts.size() ? starts[i + 1].first - 1 : -1;
    const std::string span = to < 0       ? fmt::format("{} B and more", from)
                             : to == from ? fmt::format("{} B", from)
                                          : fmt::format("{}..{} B", from, to);
    rules.lines += fmt::format("{:<24} # {}: {}\n", fmt::format("{} {} 0 0", from, algorithm), span,
                               ompiAlgorithmText(algorithm));
  }
  return rules;
}

std::string formatOmpiRules(const Recommendation& recommendation, const Report& report) {
  std::string out = header("#", recommendation, report);
  out +=
      "# Open MPI coll_tuned dynamic rules, read by Open MPI 4.1 and 5.0: the algorithm of every\n"
      "# MPI_Allreduce by communicator size and message size (count x datatype size), whatever its\n"
      "# datatype and operation; algorithm 0 is Open MPI's own decision. Every rank loads it with\n"
      "#   OMPI_MCA_coll_tuned_use_dynamic_rules=1\n"
      "#   OMPI_MCA_coll_tuned_dynamic_rules_filename=<this file's absolute path>\n"
      "# (mpirun -x NAME=VALUE passes them on). Open MPI 4.1 ignores a file it cannot read without\n"
      "# a word: docs/deploy.md shows how to see that it took effect.\n";
  // Rules by communicator size (nullopt: any), in file order. Open MPI sees neither the dtype nor the api, so
  // a rule whose bytes overlap an earlier one of another algorithm on the same communicators is left out.
  std::map<std::optional<int>, std::vector<OmpiSegment>> by_world;
  std::string notes;
  bool ring = false, segmented_ring = false;
  for (const auto& rule : recommendation.rules) {
    std::string why;
    const auto algorithm = ompiAlgorithm(rule, why);
    if (!algorithm) {
      notes += fmt::format("# not expressed: {} -> {}: {}\n", range(rule), rule.strategy, why);
      continue;
    }
    const std::optional<int> world = rule.world_size;
    const OmpiSegment* conflict = nullptr;
    for (const auto& [other_world, segments] : by_world) {
      if (world && other_world && *world != *other_world) continue;  // never on the same communicator
      for (const auto& segment : segments)
        if (segment.min_bytes <= rule.max_bytes && rule.min_bytes <= segment.max_bytes &&
            segment.algorithm != *algorithm && !conflict)
          conflict = &segment;
    }
    if (conflict) {
      notes += fmt::format(
          "# left out: {} on {} -> {} overlaps {} -> {} with another algorithm; Open MPI sees bytes, not the "
          "datatype (gradscope run --mode apply does)\n",
          range(rule), ranksText(world), rule.strategy, range(*conflict->rule), conflict->rule->strategy);
      continue;
    }
    by_world[world].push_back({rule.min_bytes, rule.max_bytes, *algorithm, &rule});
    segmented_ring |= mpiAlgorithmName(*algorithm) == "segmented_ring";
    ring |= segmented_ring || mpiAlgorithmName(*algorithm) == "ring";
    out += fmt::format("# {} on {} -> {}: algorithm {}\n", range(rule), ranksText(world), rule.strategy,
                       ompiAlgorithmText(*algorithm));
  }
  if (ring)
    out +=
        "# ring and segmented_ring do not support non-commutative operations (Open MPI's own decision\n"
        "# avoids them there, this file cannot): a job reducing with such an MPI_Op at these sizes\n"
        "# needs apply mode, which changes sums only\n";
  if (segmented_ring)
    out +=
        "# segmented_ring with segment size 0, as gradscope measured it: Open MPI then runs the ring\n"
        "# unsegmented\n";
  out += notes;
  if (by_world.empty()) {
    out +=
        "# no rule is an Open MPI algorithm (sum/mpi.<algorithm>) for MPI_Allreduce:\n"
        "# this file changes nothing, Open MPI keeps its own decisions\n"
        "0                        # collectives with rules\n";
    return out;
  }

  // Communicator entries: from 1 rank (rules for any size, else Open MPI's own decision), and for each size
  // with rules, that size and, from the next size on, the rules for any size again.
  const std::vector<OmpiSegment> any =
      by_world.contains(std::nullopt) ? by_world[std::nullopt] : std::vector<OmpiSegment>{};
  std::set<int> entries = {1};
  for (const auto& [world, segments] : by_world) {
    if (!world) continue;
    entries.insert(*world);
    if (*world < std::numeric_limits<int>::max()) entries.insert(*world + 1);
  }
  out += fmt::format("{:<24} # collectives with rules\n{:<24} # MPI_Allreduce\n{:<24} # communicator sizes\n",
                     1, kOmpiAllreduceId, entries.size());
  for (auto entry = entries.begin(); entry != entries.end(); ++entry) {
    const auto next = std::next(entry);
    const std::string sizes = next == entries.end() ? (*entry == 1 ? std::string("any number of ranks")
                                                                   : fmt::format("{} ranks and more", *entry))
                              : *next == *entry + 1 ? fmt::format("{} rank{}", *entry, *entry == 1 ? "" : "s")
                                                    : fmt::format("{} to {} ranks", *entry, *next - 1);
    std::vector<OmpiSegment> segments = any;
    if (const auto found = by_world.find(*entry); found != by_world.end() && found->first)
      segments.insert(segments.end(), found->second.begin(), found->second.end());
    const OmpiMessageRules rules = ompiMessageRules(segments);
    out += fmt::format("{:<24} # {}: {} message rule{}\n{}", fmt::format("{} {}", *entry, rules.count), sizes,
                       rules.count, rules.count == 1 ? "" : "s", rules.lines);
  }
  return out;
}

// The engine setting every rule of the kind agrees on; several different ones cannot be one variable.
template <typename Key>
std::optional<Key> single(const std::vector<Key>& keys) {
  if (keys.empty() || std::any_of(keys.begin(), keys.end(), [&](const Key& k) { return k != keys.front(); }))
    return std::nullopt;
  return keys.front();
}

std::string formatEnv(const Recommendation& recommendation, const Report& report) {
  std::string out = header("#", recommendation, report);
  std::vector<std::pair<int, int>> nccl;
  std::vector<int> mpi;
  std::string comments;
  for (const auto& rule : recommendation.rules) {
    const auto strategy = strategyOf(rule);
    if (const auto engine = ncclEngine(strategy); engine && isPlainSum(strategy)) nccl.push_back(*engine);
    else if (const auto algorithm = mpiAlgorithm(strategy); algorithm && isPlainSum(strategy))
      mpi.push_back(*algorithm);
    else
      comments += fmt::format(
          "# {}: {} has no environment setting; use gradscope run --mode apply --recommendation FILE\n",
          range(rule), rule.strategy);
  }
  // Environment variables are global: exact only when every rule of the engine agrees and the rules cover
  // what the job does (calls outside them would switch too, which the comment says).
  if (const auto engine = single(nccl)) {
    out += fmt::format("NCCL_ALGO={}\nNCCL_PROTO={}\n", ncclAlgoName(engine->first),
                       ncclProtoName(engine->second));
    out +=
        "# NCCL_ALGO/NCCL_PROTO apply to every size; the nccl-tuner format limits them to the rules' "
        "ranges\n";
  } else if (!nccl.empty()) {
    out +=
        "# the rules choose different NCCL algorithms by size, which NCCL_ALGO/NCCL_PROTO cannot express: "
        "use "
        "--format nccl-tuner\n";
  }
  if (const auto algorithm = single(mpi)) {
    out += fmt::format(
        "OMPI_MCA_coll_tuned_use_dynamic_rules=1\nOMPI_MCA_coll_tuned_allreduce_algorithm={}\n", *algorithm);
    out += fmt::format(
        "# {} for every all-reduce size, not only the rules' ranges; the ompi-rules format limits it to "
        "them\n",
        mpiAlgorithmName(*algorithm));
  } else if (!mpi.empty()) {
    out +=
        "# the rules choose different Open MPI algorithms by size, which "
        "OMPI_MCA_coll_tuned_allreduce_algorithm "
        "cannot express: use --format ompi-rules (a coll_tuned dynamic rules file and the two variables that "
        "load it)\n";
  }
  out += comments;
  if (recommendation.rules.empty()) out += "# no rules: nothing to set\n";
  if (report.fusion)
    out += fmt::format("# fusion: buckets of {} (DDP bucket_cap_mb={}, HOROVOD_FUSION_THRESHOLD={})\n",
                       bytes(report.fusion->bucket_bytes), report.fusion->bucket_bytes >> 20,
                       report.fusion->bucket_bytes);
  return out;
}

// The wire precision most of the rules' sizes use, for frameworks that compress every bucket alike.
std::string dominantWire(const Recommendation& recommendation, std::string& comments,
                         std::string_view comment) {
  std::map<std::string, std::int64_t> wires;
  for (const auto& rule : recommendation.rules)
    if (const auto strategy = strategyOf(rule); strategy && strategy->wire)
      wires[std::string(name(*strategy->wire))] += 1;
  std::string best;
  for (const auto& [wire, count] : wires)
    if (best.empty() || count > wires[best]) best = wire;
  for (const auto& rule : recommendation.rules) {
    const auto strategy = strategyOf(rule);
    if (!strategy || !strategy->wire || name(*strategy->wire) == best) continue;
    comments += fmt::format("{} {}: {} not expressible here (one compression for all buckets)\n", comment,
                            range(rule), rule.strategy);
  }
  return best;
}

std::string formatDdp(const Recommendation& recommendation, const Report& report) {
  std::string out = header("#", recommendation, report);
  std::string comments;
  const std::string wire = dominantWire(recommendation, comments, "#");
  out += "import torch\n";
  const std::string cap =
      report.fusion ? fmt::format(", bucket_cap_mb={}", report.fusion->bucket_bytes >> 20) : "";
  out += fmt::format("model = torch.nn.parallel.DistributedDataParallel(model{})\n", cap);
  if (wire == "bf16" || wire == "fp16") {
    out += "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n";
    out += fmt::format("model.register_comm_hook(state=None, hook=default_hooks.{}_compress_hook)\n", wire);
    out += "# the hook compresses every bucket, also sizes outside the rules' ranges\n";
  } else if (!wire.empty()) {
    out += fmt::format(
        "# {} on the wire has no DDP hook: use gradscope run --mode apply --recommendation FILE\n", wire);
  }
  for (const auto& rule : recommendation.rules) {
    const auto strategy = strategyOf(rule);
    if (strategy && strategy->wire) continue;
    if (ncclEngine(strategy)) {
      out += fmt::format(
          "# {}: {} is an NCCL algorithm and protocol, not a DDP setting: gradscope recommend --format "
          "nccl-tuner (NCCL's example tuner "
          "plugin) "
          "or --format env\n",
          range(rule), rule.strategy);
    } else {
      out +=
          fmt::format("# {}: {} has no DDP setting; use gradscope run --mode apply --recommendation FILE\n",
                      range(rule), rule.strategy);
    }
  }
  out += comments;
  if (recommendation.rules.empty() && !report.fusion) out += "# no change recommended: keep the defaults\n";
  return out;
}

std::string formatTf(const Recommendation& recommendation, const Report& report) {
  std::string out = header("#", recommendation, report);
  std::set<Transport> transports;
  for (const auto& rule : recommendation.rules)
    if (const auto strategy = strategyOf(rule)) transports.insert(strategy->transport);
  out += "import tensorflow as tf\n";
  // Only the transports TensorFlow has: reduce to one device (reduce_bcast) and hierarchical copy (hier).
  if (transports.contains(Transport::ReduceBcast))
    out +=
        "strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.ReductionToOneDevice())\n";
  else if (transports.contains(Transport::Hier))
    out +=
        "strategy = "
        "tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.HierarchicalCopyAllReduce())\n";
  else
    out += fmt::format(
        "strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce({}))\n",
        report.fusion ? "num_packs=1" : "");
  if (report.fusion)
    out += fmt::format(
        "options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack={})  # pass to "
        "strategy.reduce / MultiWorkerMirroredStrategy(communication_options=options)\n",
        report.fusion->bucket_bytes);
  for (const auto& rule : recommendation.rules) {
    const auto strategy = strategyOf(rule);
    if (!strategy ||
        (strategy->transport != Transport::ReduceBcast && strategy->transport != Transport::Hier))
      out += fmt::format(
          "# {}: {} has no tf.distribute setting; use gradscope run --mode apply --recommendation FILE\n",
          range(rule), rule.strategy);
  }
  if (recommendation.rules.empty() && !report.fusion) out += "# no change recommended: keep the defaults\n";
  return out;
}

std::string formatHorovod(const Recommendation& recommendation, const Report& report) {
  std::string out = header("#", recommendation, report);
  std::set<Aggregator> aggregators;
  std::set<Transport> transports;
  std::set<WireFormat> wires;
  for (const auto& rule : recommendation.rules) {
    const auto strategy = strategyOf(rule);
    if (!strategy) continue;
    aggregators.insert(strategy->aggregator);
    transports.insert(strategy->transport);
    if (strategy->wire) wires.insert(*strategy->wire);
  }
  if (report.fusion) out += fmt::format("export HOROVOD_FUSION_THRESHOLD={}\n", report.fusion->bucket_bytes);
  if (transports.contains(Transport::Hier)) out += "export HOROVOD_HIERARCHICAL_ALLREDUCE=1\n";
  // Horovod compresses with fp16 only; bf16 and fp8 wire winners have no Horovod equivalent.
  const bool fp16 = wires.contains(WireFormat::Fp16) || wires.contains(WireFormat::Bf16);
  const bool adasum = aggregators.contains(Aggregator::AdaSum);
  out += "import horovod.torch as hvd\n";
  out += fmt::format(
      "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(){}{})\n",
      fp16 ? ", compression=hvd.Compression.fp16" : "", adasum ? ", op=hvd.Adasum" : "");
  if (wires.contains(WireFormat::Bf16))
    out += "# bf16 on the wire was recommended; Horovod offers fp16 compression only\n";
  for (const auto& rule : recommendation.rules) {
    const auto strategy = strategyOf(rule);
    const bool expressed =
        strategy && (strategy->transport == Transport::Hier || strategy->aggregator == Aggregator::AdaSum ||
                     (strategy->transport == Transport::Native &&
                      (strategy->wire == WireFormat::Fp16 || strategy->wire == WireFormat::Bf16)));
    if (!expressed)
      out += fmt::format(
          "# {}: {} has no Horovod setting; use gradscope run --mode apply --recommendation FILE\n",
          range(rule), rule.strategy);
  }
  if (recommendation.rules.empty() && !report.fusion) out += "# no change recommended: keep the defaults\n";
  return out;
}

// Every model's prediction at every workload size, for plots and for judging the models against
// measurements they did not see (bench/tuner_holdout.py).
std::string formatPredictions(const Report& report) {
  std::string out =
      "api,dtype,bytes,strategy,allowed,median_ns,low_ns,high_ns,extrapolated,predicted_world\n";
  for (const auto& p : report.predictions)
    out += fmt::format("{},{},{},{},{},{:.6g},{:.6g},{:.6g},{},{}\n", name(p.api), name(p.dtype), p.bytes,
                       p.strategy, p.allowed ? 1 : 0, p.prediction.time.median_ns, p.prediction.time.low_ns,
                       p.prediction.time.high_ns, p.prediction.extrapolated ? 1 : 0,
                       p.prediction.predicted_world ? 1 : 0);
  return out;
}

}  // namespace

std::optional<Format> parseFormat(std::string_view text) {
  for (Format format : kFormats)
    if (name(format) == text) return format;
  return std::nullopt;
}

std::string formatNames() {
  std::string names;
  for (std::size_t i = 0; i < kFormats.size(); ++i)
    names += fmt::format("{}{}", i == 0 ? "" : i + 1 == kFormats.size() ? " or " : ", ", name(kFormats[i]));
  return names;
}

std::string_view name(Format format) {
  switch (format) {
    case Format::Text: return "text";
    case Format::Json: return "json";
    case Format::Markdown: return "markdown";
    case Format::NcclTuner: return "nccl-tuner";
    case Format::OmpiRules: return "ompi-rules";
    case Format::Env: return "env";
    case Format::Ddp: return "ddp";
    case Format::Tf: return "tf";
    case Format::Horovod: return "horovod";
    case Format::Predictions: return "predictions";
  }
  return "text";
}

std::string format(const Recommendation& recommendation, const Report& report, Format format) {
  switch (format) {
    case Format::Text: return formatText(recommendation, report, false);
    case Format::Markdown: return formatText(recommendation, report, true);
    case Format::Json: return toJson(recommendation);
    case Format::NcclTuner: return formatNcclTuner(recommendation, report);
    case Format::OmpiRules: return formatOmpiRules(recommendation, report);
    case Format::Env: return formatEnv(recommendation, report);
    case Format::Ddp: return formatDdp(recommendation, report);
    case Format::Tf: return formatTf(recommendation, report);
    case Format::Horovod: return formatHorovod(recommendation, report);
    case Format::Predictions: return formatPredictions(report);
  }
  return {};
}

}  // namespace gradscope::tuner
