// tuner/recommend.h and exporters.h, and `gradscope recommend` end to end: constraints (error budget,
// semantic changes, interval overlap), the workload, fusion and consensus notes, the world what-if, input
// errors, golden outputs per format, the NCCL tuner CSV parsed back, and storing into the trace.

#include "gradscope/tuner/recommend.h"

#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gradscope/cli/recommend.h"
#include "gradscope/common/error.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "gradscope/tuner/exporters.h"
#include "test_util.h"

namespace gradscope::tuner {
namespace {

using test::TempDir;

constexpr std::string_view kUuid = "00000000-0000-4000-8000-00000000000a";

// Three rows per size (x0.99, x1, x1.01 of time = alpha + bytes * ns_per_byte): a narrow, exact-ish
// interval, so that which strategy wins where is known in advance.
void addStrategy(Inputs& inputs, const std::string& strategy, double alpha, double ns_per_byte,
                 Backend backend, DType dtype = DType::Fp32, int world = 4,
                 std::optional<double> rel_error = std::nullopt, double spread = 0.01) {
  const Api api = backend == Backend::Nccl ? Api::NcclAllReduce : Api::MpiAllreduce;
  for (std::int64_t bytes = 1024; bytes <= (64 << 20); bytes *= 4)
    for (double factor : {1 - spread, 1.0, 1 + spread}) {
      MeasurementRow row;
      row.backend = backend;
      auto& m = row.measurement;
      m.run_id = 1;
      m.strategy = strategy;
      m.api = api;
      m.dtype = dtype;
      m.bytes = bytes;
      m.world = world;
      m.reps = 20;
      m.median_ns = factor * (alpha + static_cast<double>(bytes) * ns_per_byte);
      m.min_ns = m.median_ns * 0.98;
      m.max_ns = m.median_ns * 1.05;
      m.rel_l2_error = rel_error;
      inputs.measurements.push_back(row);
    }
}

storage::RunInfo run(Backend backend) {
  storage::RunInfo info;
  info.id = 1;
  info.uuid = std::string(kUuid);
  info.backend = backend;
  info.world_size = 4;
  info.mode = "explore";
  return info;
}

// An MPI job: many 4 KiB reductions per step (fusion) where recursive doubling wins, a few large ones where
// rs_ag wins.
Inputs mpiInputs() {
  Inputs inputs;
  inputs.runs.push_back(run(Backend::Mpi));
  addStrategy(inputs, "sum/native", 20000, 0.1, Backend::Mpi);
  addStrategy(inputs, "sum/rs_ag", 40000, 0.05, Backend::Mpi);
  addStrategy(inputs, "sum/native/bf16", 21000, 0.055, Backend::Mpi, DType::Fp32, 4, 0.004);
  addStrategy(inputs, "adacons/native", 15000, 0.03, Backend::Mpi);
  addStrategy(inputs, "sum/mpi.recursive_doubling", 12000, 0.15, Backend::Mpi);  // wins small sizes
  addStrategy(inputs, "sum/mpi.ring", 20000, 0.099, Backend::Mpi);  // 1% faster: inside the noise
  addStrategy(inputs, "sum/warp.drive", 1, 0.001, Backend::Mpi);    // not a strategy gradscope knows
  inputs.workload = {{Api::MpiAllreduce, DType::Fp32, 4096, 400},
                     {Api::MpiAllreduce, DType::Fp32, 1 << 20, 4},
                     {Api::MpiAllreduce, DType::Fp32, 16 << 20, 2}};
  inputs.steps_known = true;
  return inputs;
}

// An NCCL job where tree/LL wins small sizes and ring/Simple large ones.
Inputs ncclInputs() {
  Inputs inputs;
  inputs.runs.push_back(run(Backend::Nccl));
  addStrategy(inputs, "sum/native", 30000, 0.1, Backend::Nccl, DType::Fp16);
  addStrategy(inputs, "sum/nccl.tree.ll", 10000, 0.2, Backend::Nccl, DType::Fp16);
  addStrategy(inputs, "sum/nccl.ring.simple", 50000, 0.04, Backend::Nccl, DType::Fp16);
  inputs.workload = {{Api::NcclAllReduce, DType::Fp16, 4096, 10},
                     {Api::NcclAllReduce, DType::Fp16, 65536, 10},
                     {Api::NcclAllReduce, DType::Fp16, 4 << 20, 5},
                     {Api::NcclAllReduce, DType::Fp16, 64 << 20, 1}};
  inputs.steps_known = true;
  return inputs;
}

RecommendOptions options(double max_rel_error = 0, bool semantic = false) {
  RecommendOptions o;
  o.max_rel_error = max_rel_error;
  o.allow_semantic_change = semantic;
  o.created = "2026-11-22T12:00:00Z";
  return o;
}

bool mentions(const Report& report, std::string_view text) {
  for (const auto& line : report.reasoning)
    if (line.find(text) != std::string::npos) return true;
  return false;
}

std::string errorOf(const Inputs& inputs, const RecommendOptions& o) {
  try {
    recommend(inputs, o);
  } catch (const Error& error) {
    return error.what();
  }
  return {};
}

TEST(Recommend, LosslessByDefault) {
  const auto result = recommend(mpiInputs(), options());
  const auto& rules = result.recommendation.rules;
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[0].strategy, "sum/mpi.recursive_doubling");
  EXPECT_EQ(rules[0].min_bytes, 4096);
  EXPECT_EQ(rules[0].max_bytes, 4096);
  EXPECT_EQ(rules[1].strategy, "sum/rs_ag");
  EXPECT_EQ(rules[1].min_bytes, 1 << 20);
  EXPECT_EQ(rules[1].max_bytes, 16 << 20);
  EXPECT_EQ(rules[1].world_size, 4);
  EXPECT_EQ(rules[1].error_class, ErrorClass::Lossless);
  EXPECT_EQ(rules[1].baseline_strategy, "sum/native");
  EXPECT_EQ(rules[1].evidence, 3 * 9);
  ASSERT_TRUE(rules[1].predicted && rules[1].baseline);
  EXPECT_LT(rules[1].predicted->high_ns, rules[1].baseline->low_ns);
  EXPECT_EQ(result.recommendation.backend, Backend::Mpi);
  EXPECT_EQ(result.recommendation.source_runs, std::vector<std::string>{std::string(kUuid)});
  EXPECT_TRUE(mentions(result.report, "Excluded sum/native/bf16: lossy"));
  EXPECT_TRUE(mentions(result.report, "Excluded adacons/native: changes what the job computes"));
  EXPECT_TRUE(mentions(result.report, "sum/mpi.ring is faster at"));
  EXPECT_TRUE(mentions(result.report, "unknown strategies: sum/warp.drive"));
  // The JSON is a valid recommendation file and reads back equal.
  EXPECT_EQ(parseRecommendation(toJson(result.recommendation)), result.recommendation);
}

TEST(Recommend, ErrorBudgetAllowsMeasuredLossyStrategies) {
  const auto within = recommend(mpiInputs(), options(0.01));
  bool bf16 = false;
  for (const auto& rule : within.recommendation.rules)
    if (rule.strategy == "sum/native/bf16") {
      bf16 = true;
      EXPECT_EQ(rule.error_class, ErrorClass::Lossy);
      EXPECT_EQ(rule.measured_rel_error, 0.004);
    }
  EXPECT_TRUE(bf16);
  const auto below = recommend(mpiInputs(), options(0.001));
  EXPECT_TRUE(mentions(below.report, "worst measured relative error 0.004 is above the budget 0.001"));
  for (const auto& rule : below.recommendation.rules) EXPECT_NE(rule.strategy, "sum/native/bf16");
}

TEST(Recommend, SemanticStrategiesOnlyWhenAllowed) {
  const auto allowed = recommend(mpiInputs(), options(0, true));
  bool adacons = false;
  for (const auto& rule : allowed.recommendation.rules) adacons |= rule.strategy == "adacons/native";
  EXPECT_TRUE(adacons);
}

TEST(Recommend, PerStepTotalsAndFusion) {
  const auto result = recommend(mpiInputs(), options());
  const auto& report = result.report;
  ASSERT_TRUE(report.baseline_per_step && report.choice_per_step);
  // 400 x (20000 + 0.1 * 4096) + 4 x (20000 + 0.1 * 1 MiB) + 2 x (20000 + 0.1 * 16 MiB), at the measured
  // sizes.
  const double baseline = 400 * 20409.6 + 4 * (20000 + 0.1 * 1048576) + 2 * (20000 + 0.1 * 16777216);
  EXPECT_NEAR(report.baseline_per_step->median_ns, baseline, 1e-6 * baseline);
  EXPECT_LT(report.choice_per_step->median_ns, report.baseline_per_step->median_ns);
  ASSERT_TRUE(report.fusion.has_value());
  // 4 alpha / (1/beta) = 800,000 bytes: the next power-of-two MiB is 1 MiB.
  EXPECT_EQ(report.fusion->bucket_bytes, 1 << 20);
  EXPECT_GT(report.fusion->small_share, 0.5);
  EXPECT_GT(report.fusion->gain_ns, 0);
}

// The step model's exposure (storage/step_model.h): the 4 KiB reductions run hidden behind compute (none of
// their time exposed), the 1 MiB ones fully exposed, the 16 MiB ones exposed for 1 µs at their end. A
// size's step saving is its calls × min(baseline - best, exposed per call).
TEST(Recommend, OnTheStepOnlyTheExposedTimeCounts) {
  Inputs inputs = mpiInputs();
  inputs.step_ns = 50e6;
  inputs.exposure = {{Api::MpiAllreduce, DType::Fp32, 4096, 4000, 20000, 0},
                     {Api::MpiAllreduce, DType::Fp32, 1 << 20, 40, 125000, 125000},
                     {Api::MpiAllreduce, DType::Fp32, 16 << 20, 20, 1.7e6, 1000}};
  const auto result = recommend(inputs, options());
  const Report& report = result.report;
  ASSERT_EQ(report.sizes.size(), 3u);
  const double exposed[] = {0, 125000, 1000};
  double total = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const SizeRow& row = report.sizes[i];
    ASSERT_TRUE(row.step_saving_ns && row.baseline && row.best_time) << i;
    const double faster = row.baseline->median_ns - row.best_time->median_ns;
    EXPECT_GT(faster, 0) << i;
    EXPECT_DOUBLE_EQ(*row.step_saving_ns, row.calls_per_step * std::min(faster, exposed[i])) << i;
    total += *row.step_saving_ns;
  }
  EXPECT_EQ(report.sizes[0].step_saving_ns, 0.0);  // hidden: a faster reduction saves nothing
  ASSERT_TRUE(report.step_ns && report.step_saving_ns);
  EXPECT_DOUBLE_EQ(*report.step_ns, 50e6);
  EXPECT_DOUBLE_EQ(*report.step_saving_ns, total);
  EXPECT_TRUE(mentions(report,
                       "on the step 0 ns of 50.0 ms per step (0.00% faster): most of this reduction "
                       "is hidden behind compute"));
  const std::string text = format(result.recommendation, report, Format::Text);
  EXPECT_NE(text.find("on the step:"), std::string::npos) << text;
  ASSERT_TRUE(report.fusion && report.fusion->step_gain_ns);
  EXPECT_EQ(*report.fusion->step_gain_ns, 0.0);  // the small calls are hidden

  // Without a step model nothing is said about the step.
  const auto plain = recommend(mpiInputs(), options());
  EXPECT_FALSE(plain.report.step_saving_ns.has_value());
  EXPECT_EQ(format(plain.recommendation, plain.report, Format::Text).find("on the step"), std::string::npos);
}

TEST(Recommend, ConsensusDisagreementPointsToAdaCons) {
  Inputs inputs = mpiInputs();
  inputs.mean_cosine_to_mean = 0.3;
  const auto result = recommend(inputs, options());
  ASSERT_TRUE(result.report.consensus_note.has_value());
  EXPECT_NE(result.report.consensus_note->find("--allow-semantic-change with adacons"), std::string::npos);
  inputs.mean_cosine_to_mean = 0.9;
  EXPECT_FALSE(recommend(inputs, options()).report.consensus_note.has_value());
}

TEST(Recommend, WithoutCallsTheMeasuredSizesAreTheWorkload) {
  Inputs inputs = mpiInputs();
  inputs.workload.clear();
  const auto result = recommend(inputs, options());
  EXPECT_TRUE(result.report.workload_from_measurements);
  EXPECT_EQ(result.report.sizes.size(), 9u);  // 1 KiB .. 64 MiB by 4
  EXPECT_TRUE(mentions(result.report, "No observed all-reduce calls"));
  ASSERT_FALSE(result.recommendation.rules.empty());
  EXPECT_EQ(result.recommendation.rules.back().max_bytes, 64 << 20);
}

TEST(Recommend, InputErrorsAreOneLine) {
  Inputs empty;
  EXPECT_NE(errorOf(empty, options()).find("no all-reduce measurements"), std::string::npos);
  EXPECT_NE(errorOf(empty, options()).find("gradscope bench"), std::string::npos);

  Inputs mixed = mpiInputs();
  addStrategy(mixed, "sum/native", 30000, 0.1, Backend::Mpi, DType::Fp32, 8);
  EXPECT_NE(errorOf(mixed, options()).find("world sizes 4, 8: choose one with --world N"), std::string::npos);
  RecommendOptions at8 = options();
  at8.world = 8;
  EXPECT_EQ(errorOf(mixed, at8), "");

  Inputs unknown_only;
  addStrategy(unknown_only, "sum/warp.drive", 1, 0.001, Backend::Mpi);
  EXPECT_NE(errorOf(unknown_only, options()).find("no measurements of known strategies"), std::string::npos);

  RecommendOptions what_if = options();
  what_if.world = 16;
  EXPECT_NE(errorOf(mpiInputs(), what_if).find("--world 16 needs sum/native measured"), std::string::npos);
  for (const auto& message : {errorOf(empty, options()), errorOf(mixed, options())})
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// A job reducing thousands of distinct sizes: predicted per size class, rules still cover every size,
// and the text table stays short.
TEST(Recommend, ManyDistinctSizesArePredictedAsSizeClasses) {
  Inputs inputs = mpiInputs();
  inputs.workload.clear();
  for (std::int64_t bytes = 1024; bytes < 1024 + 20000 * 4; bytes += 4)
    inputs.workload.push_back({Api::MpiAllreduce, DType::Fp32, bytes, 1});
  const auto result = recommend(inputs, options());
  const auto& sizes = result.report.sizes;
  EXPECT_LT(sizes.size(), 4096u);
  EXPECT_TRUE(mentions(result.report, "The job reduces 20000 distinct sizes"));
  double calls = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    calls += sizes[i].calls_per_step;
    EXPECT_LE(sizes[i].min_bytes, sizes[i].bytes);
    EXPECT_LE(sizes[i].bytes, sizes[i].max_bytes);
    EXPECT_LE(static_cast<double>(sizes[i].max_bytes), static_cast<double>(sizes[i].min_bytes) * 1.0028);
    if (i > 0) {
      EXPECT_GT(sizes[i].min_bytes, sizes[i - 1].max_bytes);
    }
  }
  EXPECT_DOUBLE_EQ(calls, 20000);
  EXPECT_EQ(sizes.front().min_bytes, 1024);
  EXPECT_EQ(sizes.back().max_bytes, 1024 + 19999 * 4);
  // recursive doubling wins these small sizes: one rule over the whole range.
  ASSERT_EQ(result.recommendation.rules.size(), 1u);
  EXPECT_EQ(result.recommendation.rules[0].min_bytes, 1024);
  EXPECT_EQ(result.recommendation.rules[0].max_bytes, 1024 + 19999 * 4);
  const std::string text = format(result.recommendation, result.report, Format::Text);
  EXPECT_NE(text.find("1 KiB..2 KiB"), std::string::npos) << text;
  EXPECT_NE(text.find(" rows: runs of sizes within a power of two"), std::string::npos) << text;
  EXPECT_LT(std::count(text.begin(), text.end(), '\n'), 40) << text;
}

TEST(Recommend, WorldWhatIfIsFlaggedAsAPrediction) {
  Inputs inputs = mpiInputs();
  addStrategy(inputs, "sum/native", 30000, 0.12, Backend::Mpi, DType::Fp32, 8);
  addStrategy(inputs, "sum/rs_ag", 50000, 0.06, Backend::Mpi, DType::Fp32, 8);
  RecommendOptions o = options();
  o.world = 16;
  const auto result = recommend(inputs, o);
  EXPECT_TRUE(result.report.world_predicted);
  EXPECT_EQ(result.recommendation.world_size, 16);
  EXPECT_TRUE(mentions(result.report, "World size 16 was not measured"));
  ASSERT_FALSE(result.recommendation.rules.empty());
  EXPECT_EQ(result.recommendation.rules[0].strategy, "sum/rs_ag");
  EXPECT_EQ(result.recommendation.rules[0].world_size, 16);
  EXPECT_NE(format(result.recommendation, result.report, Format::Text).find("prediction"), std::string::npos);
}

// Golden outputs: one scenario per backend, every format.
TEST(RecommendExport, GoldenPerFormat) {
  const auto mpi = recommend(mpiInputs(), options(0.01));
  const auto nccl = recommend(ncclInputs(), options());
  for (Format f : kFormats) {
    if (f == Format::Predictions) continue;  // needs keep_predictions; its own tests
    auto mpi_recommendation = mpi.recommendation;
    auto nccl_recommendation = nccl.recommendation;
    // The version changes with every release; the goldens should not.
    mpi_recommendation.tool_version = nccl_recommendation.tool_version = "test";
    const std::string suffix = f == Format::Json ? "json" : f == Format::Markdown ? "md" : "txt";
    EXPECT_TRUE(test::matchesGolden(fmt::format("recommend_mpi_{}.{}", name(f), suffix),
                                    format(mpi_recommendation, mpi.report, f)));
    EXPECT_TRUE(test::matchesGolden(fmt::format("recommend_nccl_{}.{}", name(f), suffix),
                                    format(nccl_recommendation, nccl.report, f)));
  }
}

std::vector<std::string> split(const std::string& line, char separator) {
  std::vector<std::string> fields;
  std::stringstream stream(line);
  for (std::string field; std::getline(stream, field, separator);) fields.push_back(field);
  return fields;
}

TEST(RecommendExport, NcclTunerCsvParsesBackToTheRules) {
  const auto result = recommend(ncclInputs(), options());
  const auto& rules = result.recommendation.rules;
  ASSERT_EQ(rules.size(), 2u);
  std::stringstream csv(format(result.recommendation, result.report, Format::NcclTuner));
  std::size_t index = 0;
  for (std::string line; std::getline(csv, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto fields = split(line, ',');
    ASSERT_EQ(fields.size(), 8u) << line;
    ASSERT_LT(index, rules.size());
    EXPECT_EQ(fields[0], "allreduce");
    EXPECT_EQ(std::stoll(fields[1]), rules[index].min_bytes);
    EXPECT_EQ(std::stoll(fields[2]), rules[index].max_bytes);
    EXPECT_EQ(fmt::format("sum/nccl.{}.{}", fields[3], fields[4]), rules[index].strategy);
    EXPECT_EQ(fields[5], "-1");
    EXPECT_EQ(fields[6], "-1");
    EXPECT_EQ(fields[7], "4");
    ++index;
  }
  EXPECT_EQ(index, rules.size());
  // Without NCCL engine winners the file is comments only.
  const auto mpi = recommend(mpiInputs(), options());
  const std::string none = format(mpi.recommendation, mpi.report, Format::NcclTuner);
  for (const auto& line : split(none, '\n')) EXPECT_EQ(line.rfind('#', 0), 0u) << line;
}

// NCCL's tuner does not see the dtype: an fp32 rule overlapping an fp16 one with another engine would be
// decided by line order, so it is left out with a comment saying why.
TEST(RecommendExport, NcclTunerCsvLeavesOutRulesItCannotTellApart) {
  auto result = recommend(ncclInputs(), options());
  auto& rules = result.recommendation.rules;
  ASSERT_EQ(rules.size(), 2u);
  RecommendationRule other = rules[0];
  other.dtype = DType::Fp32;
  other.strategy = rules[0].strategy == "sum/nccl.ring.simple" ? "sum/nccl.tree.ll" : "sum/nccl.ring.simple";
  rules.push_back(other);
  RecommendationRule same = rules[1];
  same.dtype = DType::Fp32;  // the same engine as the fp16 line: no conflict, kept
  rules.push_back(same);
  const std::string csv = format(result.recommendation, result.report, Format::NcclTuner);
  int lines = 0;
  for (const auto& line : split(csv, '\n')) lines += !line.empty() && line[0] != '#';
  EXPECT_EQ(lines, 3) << csv;
  EXPECT_NE(csv.find("# left out: ncclAllReduce fp32"), std::string::npos) << csv;
}

TEST(RecommendExport, FormatNames) {
  for (Format f : kFormats) {
    EXPECT_EQ(parseFormat(name(f)), f);
    EXPECT_NE(formatNames().find(name(f)), std::string::npos) << name(f);
  }
  EXPECT_EQ(formatNames().rfind("text, json, ", 0), 0u) << formatNames();
  EXPECT_TRUE(formatNames().ends_with(" or predictions")) << formatNames();
  EXPECT_FALSE(parseFormat("yaml").has_value());
}

// A coll_tuned dynamic rules file as Open MPI 4.1 reads it (ompi/mca/coll/tuned/coll_tuned_dynamic_file.c:
// integers, '#' to the end of the line a comment) and decides with it (coll_tuned_dynamic_rules.c: the
// communicator entry with the largest size <= the communicator's, else the first; then the message rule
// with the largest start <= the bytes). Stricter than 4.1, which skips what it cannot read character by
// character and silently falls back on the fixed decision when the numbers stop making sense: every token
// outside comments must be a plain decimal integer (no leading zero: %li reads 010 as octal), the file
// must end where its counts say, message rules must start at 0 and increase.
struct OmpiRules {
  struct Message {
    std::int64_t from = 0;
    int algorithm = 0;
  };
  struct Comm {
    int ranks = 0;
    std::vector<Message> messages;
  };
  std::vector<Comm> allreduce;  // empty: no rules for MPI_Allreduce

  static OmpiRules parse(const std::string& text) {
    std::vector<std::int64_t> numbers;
    std::stringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      std::stringstream tokens(line.substr(0, line.find('#')));
      for (std::string token; tokens >> token;) {
        const bool plain =
            token.find_first_not_of("0123456789") == std::string::npos && (token == "0" || token[0] != '0');
        if (!plain) {
          ADD_FAILURE() << "not a plain integer outside a comment: '" << token << "' in: " << line;
        }
        numbers.push_back(plain ? std::stoll(token) : -1);
      }
    }
    std::size_t at = 0;
    const auto next = [&]() -> std::int64_t {
      if (at < numbers.size()) return numbers[at++];
      ADD_FAILURE() << "the file ends before its counts say";
      return 0;
    };
    OmpiRules rules;
    const std::int64_t collectives = next();
    for (std::int64_t c = 0; c < collectives; ++c) {
      const std::int64_t id = next();
      std::vector<Comm> comms(static_cast<std::size_t>(next()));
      for (auto& comm : comms) {
        comm.ranks = static_cast<int>(next());
        comm.messages.resize(static_cast<std::size_t>(next()));
        for (auto& message : comm.messages) {
          message.from = next();
          message.algorithm = static_cast<int>(next());
          EXPECT_EQ(next(), 0) << "fan in/out";
          EXPECT_EQ(next(), 0) << "segment size";
        }
        EXPECT_FALSE(comm.messages.empty());
        if (!comm.messages.empty()) {
          EXPECT_EQ(comm.messages[0].from, 0) << "4.1 refuses a first rule above 0";
        }
        for (std::size_t i = 1; i < comm.messages.size(); ++i)
          EXPECT_LT(comm.messages[i - 1].from, comm.messages[i].from);
      }
      for (std::size_t i = 1; i < comms.size(); ++i) EXPECT_LT(comms[i - 1].ranks, comms[i].ranks);
      if (id == 2) rules.allreduce = comms;  // ALLREDUCE in Open MPI's COLLTYPE_T
    }
    EXPECT_EQ(at, numbers.size()) << "numbers after the last rule";
    return rules;
  }

  // The algorithm coll_tuned runs for an MPI_Allreduce of `bytes` on `ranks` ranks (0: its own decision).
  int decide(int ranks, std::int64_t bytes) const {
    if (allreduce.empty()) return 0;
    const Comm* comm = &allreduce.front();
    for (const auto& entry : allreduce) {
      if (entry.ranks > ranks) break;
      comm = &entry;
    }
    int algorithm = 0;
    for (const auto& message : comm->messages) {
      if (message.from > bytes) break;
      algorithm = message.algorithm;
    }
    return algorithm;
  }
};

RecommendationRule ompiRule(Api api, DType dtype, std::int64_t min_bytes, std::int64_t max_bytes,
                            std::optional<int> world, std::string strategy) {
  RecommendationRule rule;
  rule.api = api;
  rule.dtype = dtype;
  rule.min_bytes = min_bytes;
  rule.max_bytes = max_bytes;
  rule.world_size = world;
  rule.strategy = std::move(strategy);
  return rule;
}

// Every communicator size and every byte boundary: the file decides what the recommendation says where
// it can, and Open MPI's own decision everywhere else.
TEST(RecommendExport, OmpiRulesDecideAsTheRecommendation) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  Recommendation recommendation;
  recommendation.backend = Backend::Mpi;
  recommendation.world_size = 4;
  recommendation.rules = {
      ompiRule(Api::MpiAllreduce, DType::Fp32, 1024, 16384, 4, "sum/mpi.ring"),
      ompiRule(Api::MpiAllreduce, DType::Fp32, 16385, 65536, 4, "sum/rs_ag"),  // gradscope's own
      ompiRule(Api::MpiAllreduce, DType::Fp32, 262144, 4194304, 4, "sum/mpi.recursive_doubling"),
      ompiRule(Api::MpiIallreduce, DType::Fp32, 1024, 2048, 4, "sum/mpi.ring"),  // coll/libnbc's call
      // Another dtype, other algorithm, overlapping bytes: Open MPI cannot tell them apart.
      ompiRule(Api::MpiAllreduce, DType::Fp64, 8192, 32768, 4, "sum/mpi.recursive_doubling"),
      // Another dtype, the same algorithm: nothing to tell apart.
      ompiRule(Api::MpiAllreduce, DType::Fp16, 2048, 20000, 4, "sum/mpi.ring"),
      ompiRule(Api::MpiAllreduce, DType::Fp32, 0, 1023, 2, "sum/mpi.rabenseifner"),
      ompiRule(Api::MpiAllreduce, DType::Fp32, 64 << 20, kMax, std::nullopt, "sum/mpi.segmented_ring"),
      ompiRule(Api::MpiAllreduce, DType::Fp32, 100, 200, 3, "sum/native/bf16"),  // a wire format
  };
  Report report;
  const std::string text = format(recommendation, report, Format::OmpiRules);
  const OmpiRules rules = OmpiRules::parse(text);
  ASSERT_FALSE(rules.allreduce.empty()) << text;
  const auto expected = [&](int ranks, std::int64_t bytes) {
    if (bytes >= (64 << 20)) return 5;  // any number of ranks
    if (ranks == 2 && bytes <= 1023) return 6;
    if (ranks == 4 && bytes >= 1024 && bytes <= 20000) return 4;  // fp32 to 16384, fp16 on to 20000
    if (ranks == 4 && bytes >= 262144 && bytes <= 4194304) return 3;
    return 0;
  };
  for (int ranks = 1; ranks <= 9; ++ranks)
    for (std::int64_t bytes :
         {std::int64_t{0}, std::int64_t{1}, std::int64_t{150}, std::int64_t{1023}, std::int64_t{1024},
          std::int64_t{8192}, std::int64_t{16384}, std::int64_t{16385}, std::int64_t{20000},
          std::int64_t{20001}, std::int64_t{65536}, std::int64_t{262143}, std::int64_t{262144},
          std::int64_t{4194304}, std::int64_t{4194305}, std::int64_t{(64 << 20) - 1}, std::int64_t{64 << 20},
          kMax})
      EXPECT_EQ(rules.decide(ranks, bytes), expected(ranks, bytes)) << ranks << " ranks, " << bytes << " B\n"
                                                                    << text;
  for (std::string_view part :
       {"OMPI_MCA_coll_tuned_use_dynamic_rules=1\n", "OMPI_MCA_coll_tuned_dynamic_rules_filename=",
        "# not expressed: MPI_Allreduce fp32 16 KiB..64 KiB -> sum/rs_ag: not one of Open MPI's algorithms; "
        "use "
        "gradscope run --mode apply",
        "# not expressed: MPI_Iallreduce fp32 1 KiB..2 KiB -> sum/mpi.ring: coll_tuned does not decide "
        "MPI_Iallreduce",
        "# not expressed: MPI_Allreduce fp32 100 B..200 B -> sum/native/bf16",
        "# left out: MPI_Allreduce fp64 8 KiB..32 KiB on 4 ranks -> sum/mpi.recursive_doubling overlaps "
        "MPI_Allreduce fp32 1 KiB..16 KiB -> sum/mpi.ring",
        "# MPI_Allreduce fp32 64 MiB..8 EiB on any number of ranks -> sum/mpi.segmented_ring: algorithm "
        "segmented_ring (5)",
        "segment size 0"})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
}

// Nothing Open MPI can do: still a file it reads, that changes nothing and says so.
TEST(RecommendExport, OmpiRulesWithoutMpiAlgorithmsChangeNothing) {
  const auto nccl = recommend(ncclInputs(), options());
  ASSERT_FALSE(nccl.recommendation.rules.empty());
  Recommendation empty;
  empty.backend = Backend::Mpi;
  Recommendation wires;
  wires.backend = Backend::Mpi;
  wires.rules = {ompiRule(Api::MpiAllreduce, DType::Fp32, 0, 4096, 2, "sum/rs_ag/bf16")};
  for (const Recommendation* recommendation :
       std::initializer_list<const Recommendation*>{&nccl.recommendation, &empty, &wires}) {
    const std::string text = format(*recommendation, nccl.report, Format::OmpiRules);
    const OmpiRules rules = OmpiRules::parse(text);
    EXPECT_TRUE(rules.allreduce.empty()) << text;
    EXPECT_NE(text.find("this file changes nothing"), std::string::npos) << text;
  }
  EXPECT_NE(format(nccl.recommendation, nccl.report, Format::OmpiRules).find("use --format nccl-tuner"),
            std::string::npos);
}

// A trace as explore mode writes it: 4 ranks, 5 steps, measurements, consensus rows.
// `self_sums`: each rank also sums 4 KiB twice a step on a communicator of its own (MPI_COMM_SELF).
std::string writeTrace(const TempDir& dir, const std::string& file, bool measurements = true, int world = 4,
                       bool self_sums = false) {
  const std::string path = dir.file(file);
  auto writer = storage::TraceWriter::create(path);
  storage::RunInfo info = run(Backend::Mpi);
  info.id = 0;
  info.world_size = world;
  const std::int64_t run_id = writer.addRun(info);
  std::vector<storage::CallRecord> calls;
  for (int rank = 0; rank < world; ++rank) {
    storage::RankInfo rank_info;
    rank_info.run_id = run_id;
    rank_info.rank = rank;
    const std::int64_t rank_id = writer.addRank(rank_info);
    storage::CommInfo comm;
    comm.rank_id = rank_id;
    comm.key = "world";
    comm.backend = Backend::Mpi;
    comm.size = world;
    comm.comm_rank = rank;
    const std::int64_t comm_id = writer.addComm(comm);
    comm.key = fmt::format("self-{}", rank);
    comm.size = 1;
    comm.comm_rank = 0;
    const std::int64_t self_id = self_sums ? writer.addComm(comm) : -1;
    std::int64_t t = 0, seq = 0, self_seq = 0;
    for (int step = 0; step < 5; ++step)
      for (std::int64_t bytes :
           {std::int64_t{4} << 10, std::int64_t{1} << 20, std::int64_t{4} << 10, std::int64_t{16} << 20}) {
        const bool self = bytes == std::int64_t{4} << 10;
        if (self && !self_sums) continue;
        storage::CallRecord call;
        call.rank_id = rank_id;
        call.comm_id = self ? self_id : comm_id;
        call.seq = self ? self_seq++ : seq++;
        call.step = step;
        call.api = Api::MpiAllreduce;
        call.dtype = DType::Fp32;
        call.op = ReduceOp::Sum;
        call.count = bytes / 4;
        call.bytes = bytes;
        call.enqueue_ns = call.start_ns = t;
        call.end_ns = t += 1000000;
        calls.push_back(call);
      }
  }
  writer.appendCalls(calls);
  if (measurements) {
    Inputs inputs;
    addStrategy(inputs, "sum/native", 20000, 0.1, Backend::Mpi, DType::Fp32, world);
    addStrategy(inputs, "sum/rs_ag", 40000, 0.05, Backend::Mpi, DType::Fp32, world);
    for (auto row : inputs.measurements) {
      row.measurement.run_id = run_id;
      writer.addMeasurement(row.measurement);
    }
  }
  writer.finish(1'000'000'000);
  return path;
}

TEST(RecommendCommand, ReadsTracesAndStoresTheJson) {
  TempDir dir;
  const std::string path = writeTrace(dir, "job.db");
  const Inputs inputs = readInputs({path});
  ASSERT_EQ(inputs.workload.size(), 2u);
  EXPECT_TRUE(inputs.steps_known);
  EXPECT_DOUBLE_EQ(inputs.workload[0].calls_per_step, 1);  // per rank and step

  cli::RecommendCommand command;
  command.inputs = {path};
  command.format = "json";
  command.created = "2026-11-22T12:00:00Z";
  std::ostringstream out, log;
  cli::runRecommend(command, out, log);
  const Recommendation parsed = parseRecommendation(out.str());
  ASSERT_EQ(parsed.rules.size(), 1u);
  EXPECT_EQ(parsed.rules[0].strategy, "sum/rs_ag");
  const auto stored = storage::TraceReader::open(path).recommendations();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].json, out.str());
  EXPECT_EQ(stored[0].run_id, 1);
}

TEST(RecommendCommand, ReductionCountsPerSize) {
  TempDir dir;
  const auto counts = storage::TraceReader::open(writeTrace(dir, "job.db")).reductionCounts();
  ASSERT_EQ(counts.sizes.size(), 2u);
  EXPECT_EQ(counts.sizes[0].bytes, 1 << 20);
  EXPECT_EQ(counts.sizes[0].calls, 4 * 5);
  EXPECT_EQ(counts.sizes[0].op, ReduceOp::Sum);
  EXPECT_EQ(counts.sizes[1].bytes, 16 << 20);
  EXPECT_EQ(counts.steps, 5);
  EXPECT_EQ(counts.ranks, 4);
  EXPECT_EQ(counts.single_rank_calls, 0);
}

// Sums on a communicator of one rank aggregate nothing: the workload leaves them out, counted, serially
// and in parallel ranges alike, and the tuner's workload is the world's sums alone.
TEST(RecommendCommand, ReductionCountsLeaveOutOneRankCommunicators) {
  TempDir dir;
  const std::string path = writeTrace(dir, "job.db", true, 4, /*self_sums=*/true);
  const auto reader = storage::TraceReader::open(path);
  for (const std::int64_t rows_per_thread : {storage::TraceReader::kRowsPerThread, std::int64_t{7}}) {
    const auto counts = reader.reductionCounts(rows_per_thread);
    ASSERT_EQ(counts.sizes.size(), 2u);
    EXPECT_EQ(counts.sizes[0].bytes, 1 << 20);
    EXPECT_EQ(counts.sizes[0].calls, 4 * 5);
    EXPECT_EQ(counts.sizes[1].bytes, 16 << 20);
    EXPECT_EQ(counts.single_rank_calls, 4 * 5 * 2);
    EXPECT_EQ(counts.steps, 5);
    EXPECT_EQ(counts.ranks, 4);
  }
  const Inputs inputs = readInputs({path});
  ASSERT_EQ(inputs.workload.size(), 2u);
  EXPECT_EQ(inputs.workload[0].bytes, 1 << 20);
  EXPECT_DOUBLE_EQ(inputs.workload[0].calls_per_step, 1);
}

TEST(RecommendCommand, ReductionCountsInParallelRangesAgree) {
  TempDir dir;
  const auto reader = storage::TraceReader::open(writeTrace(dir, "job.db"));
  const auto serial = reader.reductionCounts();
  const auto parallel = reader.reductionCounts(3);  // 40 calls: as many connections as cores
  ASSERT_EQ(parallel.sizes.size(), serial.sizes.size());
  for (std::size_t i = 0; i < serial.sizes.size(); ++i) {
    EXPECT_EQ(parallel.sizes[i].bytes, serial.sizes[i].bytes);
    EXPECT_EQ(parallel.sizes[i].calls, serial.sizes[i].calls);
  }
  EXPECT_EQ(parallel.steps, serial.steps);
  EXPECT_EQ(parallel.ranks, serial.ranks);
}

TEST(RecommendCommand, AppendRecommendationRefusesForeignFiles) {
  TempDir dir;
  test::writeFile(dir.file("not.db"), "hello");
  EXPECT_THROW(storage::appendRecommendation(dir.file("not.db"), {}), Error);
  EXPECT_THROW(storage::appendRecommendation(dir.file("missing.db"), {}), Error);
}

TEST(RecommendCommand, CommandLine) {
  TempDir dir;
  const std::string path = writeTrace(dir, "job.db");
  const auto ok = test::runCli({"recommend", path, "--format", "nccl-tuner", "--no-store"});
  ASSERT_EQ(ok.exit_code, 0) << test::describe(ok);
  EXPECT_EQ(ok.out.rfind("# gradscope", 0), 0u) << ok.out;
  EXPECT_TRUE(storage::TraceReader::open(path).recommendations().empty());

  const auto to_file = test::runCli({"recommend", path, "--format", "json", "-o", dir.file("plan.json")});
  ASSERT_EQ(to_file.exit_code, 0) << test::describe(to_file);
  EXPECT_NO_THROW(loadRecommendation(dir.file("plan.json")));
  EXPECT_EQ(test::fileMode(dir.file("plan.json")), 0600u);  // private, like the traces
  EXPECT_EQ(storage::TraceReader::open(path).recommendations().size(), 1u);
  // An existing file is replaced whole (never followed through a symlink), and becomes private.
  test::writeFile(dir.file("target.txt"), "someone else's file\n");
  std::filesystem::create_symlink(dir.file("target.txt"), dir.file("link.json"));
  const auto over_link =
      test::runCli({"recommend", path, "--format", "json", "-o", dir.file("link.json"), "--no-store"});
  ASSERT_EQ(over_link.exit_code, 0) << test::describe(over_link);
  EXPECT_EQ(test::readFile(dir.file("target.txt")), "someone else's file\n");
  EXPECT_NO_THROW(loadRecommendation(dir.file("link.json")));
  EXPECT_EQ(test::fileMode(dir.file("link.json")), 0600u);
  test::expectCliError(
      test::runCli({"recommend", path, "-o", dir.file("no-such-dir/plan.json"), "--no-store"}),
      {"no-such-dir", "does not exist"});

  test::expectCliError(test::runCli({"recommend", dir.file("missing.db")}), {"missing.db"});
  const std::string bare = writeTrace(dir, "bare.db", false);
  test::expectCliError(test::runCli({"recommend", bare}), {"no all-reduce measurements", "gradscope bench"});
  const std::string eight = writeTrace(dir, "eight.db", true, 8);
  test::expectCliError(test::runCli({"recommend", path, eight}), {"--world N"});
  test::expectCliError(test::runCli({"recommend", path, "--world", "64"}), {"--world 64 needs"});
  test::expectCliError(test::runCli({"recommend", path, "--format", "yaml"}), {"format", "ompi-rules"});

  // The rules file, and the two variables that load it by absolute path, wherever the job runs.
  const auto rules = test::runShell(fmt::format(
      "cd {} && {} recommend {} --format ompi-rules -o rules.conf --no-store", test::shellQuote(dir.path()),
      test::shellQuote(GRADSCOPE_CLI_PATH), test::shellQuote(path)));
  ASSERT_EQ(rules.exit_code, 0) << test::describe(rules);
  EXPECT_NO_THROW(OmpiRules::parse(test::readFile(dir.file("rules.conf"))));
  EXPECT_NE(rules.err.find("OMPI_MCA_coll_tuned_use_dynamic_rules=1\n"), std::string::npos) << rules.err;
  EXPECT_NE(rules.err.find("OMPI_MCA_coll_tuned_dynamic_rules_filename=" + dir.file("rules.conf") + "\n"),
            std::string::npos)
      << rules.err;
}

}  // namespace
}  // namespace gradscope::tuner
