// common/: the recommendation file. Its reader runs inside the user's job (the agent's apply mode), so
// besides the round trip and matching, most of this file feeds it bad input: every refusal must be a
// gradscope::Error with one line naming the problem, whatever the bytes.

#include "gradscope/common/recommendation.h"

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradscope/common/error.h"
#include "gradscope/common/types.h"
#include "test_util.h"

namespace gradscope {
namespace {

using nlohmann::json;
using test::errorMessage;

// ---------------------------------------------------------------------------------------------------
// Fixtures

RecommendationRule lossyRule() {
  RecommendationRule rule;
  rule.api = Api::MpiAllreduce;
  rule.dtype = DType::Fp32;
  rule.min_bytes = 0;
  rule.max_bytes = 65536;
  rule.world_size = 2;
  rule.strategy = "sum/native/bf16";
  rule.error_class = ErrorClass::Lossy;
  rule.measured_rel_error = 0.0021;
  rule.predicted = TimeInterval{10400.5, 9800.25, 11300.125};
  rule.baseline = TimeInterval{15200, 14900, 15800};
  rule.baseline_strategy = "sum/native";
  rule.evidence = 12;
  return rule;
}

// Every field set, with values that are hard to print exactly (0.1, 1/3, subnormals, 2^53 + 1 bytes).
Recommendation fullRecommendation() {
  Recommendation r;
  r.backend = Backend::Mpi;
  r.world_size = 2;
  r.max_rel_error = 0.1;
  r.allow_semantic_change = true;
  r.created = "2024-05-01T12:00:00Z";
  r.tool_version = "0.1.0 \"dev\" \\ \xc3\xa9\t";  // quotes, backslash, UTF-8, a tab
  r.source_runs = {"6f1c2a9e-3d4b-4c5d-8e9f-0a1b2c3d4e5f", "b2", ""};
  r.rules.push_back(lossyRule());

  RecommendationRule semantic;
  semantic.api = Api::MpiIallreduce;
  semantic.dtype = DType::Bf16;
  semantic.min_bytes = 1;
  semantic.max_bytes = (std::int64_t{1} << 53) + 1;
  semantic.strategy = "adacons/native";
  semantic.error_class = ErrorClass::Semantic;
  semantic.measured_rel_error = 1.0 / 3.0;  // semantic rules are not held to max_rel_error
  semantic.predicted = TimeInterval{4.9e-324, 0, 1e300};
  semantic.evidence = std::numeric_limits<std::int64_t>::max();
  r.rules.push_back(semantic);

  RecommendationRule lossless;  // optional fields unset, a baseline strategy without times
  lossless.api = Api::MpiAllreduce;
  lossless.dtype = DType::Fp32;
  lossless.min_bytes = 65537;
  lossless.max_bytes = std::numeric_limits<std::int64_t>::max();
  lossless.world_size = 2;
  lossless.strategy = "sum/mpi.ring";
  lossless.error_class = ErrorClass::Lossless;
  lossless.baseline_strategy = "sum/native";
  r.rules.push_back(lossless);

  RecommendationRule times_only;  // baseline times without a strategy name
  times_only.api = Api::MpiAllreduce;
  times_only.dtype = DType::Fp64;
  times_only.min_bytes = 0;
  times_only.max_bytes = 0;
  times_only.strategy = "sum/rs_ag";
  times_only.error_class = ErrorClass::Lossy;
  times_only.baseline = TimeInterval{0.1, 0.1, 0.1};
  r.rules.push_back(times_only);
  return r;
}

// A small valid file as JSON, for tests that break one thing in it.
json validJson() {
  return json::parse(R"({
    "format": "gradscope-recommendation", "version": 1, "created": "2024-05-01T12:00:00Z",
    "tool_version": "0.1.0", "source_runs": ["u1"], "backend": "mpi", "world_size": 2,
    "max_rel_error": 0.01, "allow_semantic_change": false,
    "rules": [
      {"api": "MPI_Allreduce", "dtype": "fp32", "min_bytes": 0, "max_bytes": 65536, "world_size": 2,
       "strategy": "sum/native/bf16", "error_class": "lossy", "measured_rel_error": 0.0021,
       "predicted_ns": {"median": 1.0, "low": 0.9, "high": 1.1},
       "baseline": {"strategy": "sum/native", "median": 2.0, "low": 1.8, "high": 2.2}, "evidence": 12},
      {"api": "MPI_Allreduce", "dtype": "fp32", "min_bytes": 65537, "max_bytes": 1048576,
       "strategy": "sum/rs_ag", "error_class": "lossless"}
    ]})");
}

std::string describeRule(const RecommendationRule& r) {
  const auto interval = [](const std::optional<TimeInterval>& t) {
    return t ? fmt::format("{}/{}/{}", t->median_ns, t->low_ns, t->high_ns) : std::string("unset");
  };
  return fmt::format(
      "api={} dtype={} bytes={}..{} world={} strategy={} class={} measured={} predicted={} "
      "baseline={} {} evidence={}",
      name(r.api), name(r.dtype), r.min_bytes, r.max_bytes, test::optionalText(r.world_size), r.strategy,
      name(r.error_class), test::optionalText(r.measured_rel_error), interval(r.predicted),
      r.baseline_strategy, interval(r.baseline), r.evidence);
}

// Field by field, so that a failure names the field; exact comparison of doubles on purpose.
void expectSame(const Recommendation& a, const Recommendation& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.max_rel_error, b.max_rel_error);
  EXPECT_EQ(a.allow_semantic_change, b.allow_semantic_change);
  EXPECT_EQ(a.created, b.created);
  EXPECT_EQ(a.tool_version, b.tool_version);
  EXPECT_EQ(a.source_runs, b.source_runs);
  ASSERT_EQ(a.rules.size(), b.rules.size());
  for (std::size_t i = 0; i < a.rules.size(); ++i) {
    SCOPED_TRACE(fmt::format("rule {}", i + 1));
    const RecommendationRule& x = a.rules[i];
    const RecommendationRule& y = b.rules[i];
    EXPECT_EQ(x.api, y.api);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.min_bytes, y.min_bytes);
    EXPECT_EQ(x.max_bytes, y.max_bytes);
    EXPECT_EQ(x.world_size, y.world_size);
    EXPECT_EQ(x.strategy, y.strategy);
    EXPECT_EQ(x.error_class, y.error_class);
    EXPECT_EQ(x.measured_rel_error, y.measured_rel_error);
    EXPECT_EQ(x.predicted.has_value(), y.predicted.has_value());
    if (x.predicted && y.predicted) {
      EXPECT_EQ(x.predicted->median_ns, y.predicted->median_ns);
      EXPECT_EQ(x.predicted->low_ns, y.predicted->low_ns);
      EXPECT_EQ(x.predicted->high_ns, y.predicted->high_ns);
    }
    EXPECT_EQ(x.baseline.has_value(), y.baseline.has_value());
    if (x.baseline && y.baseline) {
      EXPECT_EQ(x.baseline->median_ns, y.baseline->median_ns);
      EXPECT_EQ(x.baseline->low_ns, y.baseline->low_ns);
      EXPECT_EQ(x.baseline->high_ns, y.baseline->high_ns);
    }
    EXPECT_EQ(x.baseline_strategy, y.baseline_strategy);
    EXPECT_EQ(x.evidence, y.evidence);
    EXPECT_EQ(describeRule(x), describeRule(y));
  }
  EXPECT_TRUE(a == b);
}

// Parses `text` expecting a refusal; returns the one-line message (checked by errorMessage).
std::string refusal(const std::string& text, std::string_view source = "plan.json") {
  return errorMessage([&] { parseRecommendation(text, source); });
}

#define EXPECT_REFUSED(text, ...) \
  EXPECT_GRADSCOPE_ERROR(parseRecommendation(text, "plan.json"), "plan.json: ", __VA_ARGS__)

// ---------------------------------------------------------------------------------------------------
// Error classes and strategy names

TEST(RecommendationErrorClass, NamesRoundTripAndAreOrdered) {
  for (ErrorClass c : {ErrorClass::Lossless, ErrorClass::Lossy, ErrorClass::Semantic})
    EXPECT_EQ(parseErrorClass(name(c)), c);
  EXPECT_EQ(name(ErrorClass::Lossless), "lossless");
  EXPECT_EQ(name(ErrorClass::Lossy), "lossy");
  EXPECT_EQ(name(ErrorClass::Semantic), "semantic");
  EXPECT_EQ(parseErrorClass("LOSSY"), ErrorClass::Lossy);
  EXPECT_EQ(parseErrorClass(""), std::nullopt);
  EXPECT_EQ(parseErrorClass("lossy "), std::nullopt);
  EXPECT_EQ(parseErrorClass("exact"), std::nullopt);
  EXPECT_LT(ErrorClass::Lossless, ErrorClass::Lossy);
  EXPECT_LT(ErrorClass::Lossy, ErrorClass::Semantic);
}

TEST(RecommendationErrorClass, StrategyClassFromItsParts) {
  const std::vector<std::pair<std::string, std::optional<ErrorClass>>> cases = {
      {"sum/native", ErrorClass::Lossless},
      {"sum/native/native", ErrorClass::Lossless},
      {"sum/rs_ag", ErrorClass::Lossless},
      {"sum/reduce_bcast", ErrorClass::Lossless},
      {"sum/hier", ErrorClass::Lossless},
      {"sum/nccl.ring.ll128", ErrorClass::Lossless},
      {"sum/nccl.tree.simple", ErrorClass::Lossless},
      {"sum/mpi.recursive_doubling", ErrorClass::Lossless},
      {"local/kahan", ErrorClass::Lossless},
      {"sum/native/fp16", ErrorClass::Lossy},
      {"sum/native/bf16", ErrorClass::Lossy},
      {"sum/rs_ag/bf16", ErrorClass::Lossy},
      {"sum/nccl.nvls.simple/fp8e4m3", ErrorClass::Lossy},
      {"sum/hier/fp8e5m2", ErrorClass::Lossy},
      {"sum/native/BF16", ErrorClass::Lossy},  // the agent's parser ignores case; so must the class
      {"adacons/native", ErrorClass::Semantic},
      {"adasum/native", ErrorClass::Semantic},
      {"adasum/native/bf16", ErrorClass::Semantic},  // semantic dominates lossy
      {"AdaSum/native", ErrorClass::Semantic},
      {"ADACONS/native", ErrorClass::Semantic},
      // Judged by parts only: unknown parts are the agent's strategy parser's business.
      {"frobnicate/teleport", ErrorClass::Lossless},
      {"sum/native/fp32", ErrorClass::Lossless},
      // Not aggregator/transport[/wire] at all.
      {"", std::nullopt},
      {"sum", std::nullopt},
      {"/", std::nullopt},
      {"sum/", std::nullopt},
      {"/native", std::nullopt},
      {"sum//bf16", std::nullopt},
      {"sum/native/", std::nullopt},
      {"sum/native/bf16/x", std::nullopt},
      {"sum/native bf16", std::nullopt},
      {" sum/native", std::nullopt},
      {"sum/native\n", std::nullopt},
      {"sum\\native", std::nullopt},
      {std::string("sum/na\0ive", 10), std::nullopt},
      {"sum/n\xc3\xa4tive", std::nullopt},
  };
  for (const auto& [strategy, expected] : cases)
    EXPECT_EQ(strategyErrorClass(strategy), expected) << "strategy \"" << strategy << "\"";
}

// ---------------------------------------------------------------------------------------------------
// Round trip

TEST(RecommendationFile, FullFileRoundTripsExactly) {
  const Recommendation original = fullRecommendation();
  const std::string text = toJson(original);
  const Recommendation parsed = parseRecommendation(text, "roundtrip.json");
  expectSame(parsed, original);
  // Writing what was read gives the same bytes: the writer is deterministic.
  EXPECT_EQ(toJson(parsed), text);
}

TEST(RecommendationFile, WriterOutputIsPrettyAndInDocumentedOrder) {
  const std::string text = toJson(fullRecommendation());
  EXPECT_EQ(text.rfind("{\n  \"format\": \"gradscope-recommendation\",\n  \"version\": 1,\n", 0), 0u) << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_LT(text.find("\"created\""), text.find("\"backend\""));
  EXPECT_LT(text.find("\"backend\""), text.find("\"rules\""));
  EXPECT_NE(text.find("\n    {\n      \"api\": \"MPI_Allreduce\",\n      \"dtype\": \"fp32\",\n"),
            std::string::npos)
      << text;
  // Unset optional fields are left out, not written as null.
  EXPECT_EQ(text.find("null"), std::string::npos) << text;
}

TEST(RecommendationFile, MinimalFileRoundTrips) {
  Recommendation empty;
  empty.backend = Backend::Nccl;
  const Recommendation parsed = parseRecommendation(toJson(empty));
  expectSame(parsed, empty);
  EXPECT_EQ(parsed.match(Api::NcclAllReduce, DType::Fp32, 0, 2), nullptr);
}

TEST(RecommendationFile, ReadsTheBriefExampleAndTheDocumentedExample) {
  const Recommendation from_test = parseRecommendation(validJson().dump(), "example");
  ASSERT_EQ(from_test.rules.size(), 2u);
  EXPECT_EQ(from_test.backend, Backend::Mpi);
  EXPECT_EQ(from_test.world_size, 2);
  EXPECT_EQ(from_test.max_rel_error, 0.01);
  EXPECT_EQ(from_test.source_runs, std::vector<std::string>{"u1"});
  const RecommendationRule& rule = from_test.rules[0];
  EXPECT_EQ(rule.strategy, "sum/native/bf16");
  EXPECT_EQ(rule.error_class, ErrorClass::Lossy);
  EXPECT_EQ(rule.measured_rel_error, 0.0021);
  ASSERT_TRUE(rule.predicted && rule.baseline);
  EXPECT_EQ(rule.predicted->low_ns, 0.9);
  EXPECT_EQ(rule.baseline->high_ns, 2.2);
  EXPECT_EQ(rule.baseline_strategy, "sum/native");
  EXPECT_EQ(rule.evidence, 12);
  EXPECT_EQ(from_test.rules[1].world_size, std::nullopt);
  EXPECT_EQ(from_test.rules[1].evidence, 0);

  // The first ```json block of docs/recommendation-file.md must be a valid file.
  const std::string doc = test::readFile(GRADSCOPE_SOURCE_DIR "/docs/recommendation-file.md");
  const std::size_t start = doc.find("```json\n");
  ASSERT_NE(start, std::string::npos) << "docs/recommendation-file.md has no json example";
  const std::size_t end = doc.find("```", start + 8);
  ASSERT_NE(end, std::string::npos);
  const std::string example = doc.substr(start + 8, end - start - 8);
  const Recommendation from_doc = parseRecommendation(example, "docs/recommendation-file.md");
  EXPECT_EQ(from_doc.rules.size(), 2u);
  // The example is what the writer writes, byte for byte.
  EXPECT_EQ(toJson(from_doc), example);
}

TEST(RecommendationFile, UnknownKeysAreIgnoredAndNullMeansUnset) {
  json doc = validJson();
  doc["comment"] = "made by hand";
  doc["future"] = {{"nested", json::array({1, 2, {{"deep", true}}})}};
  doc["rules"][0]["confidence"] = 0.95;
  doc["rules"][0]["predicted_ns"]["p99"] = 3.0;
  doc["rules"][0]["baseline"]["note"] = "x";
  doc["world_size"] = nullptr;
  doc["rules"][1]["measured_rel_error"] = nullptr;
  doc["rules"][1]["predicted_ns"] = nullptr;
  doc["rules"][1]["world_size"] = nullptr;
  const Recommendation r = parseRecommendation(doc.dump());
  EXPECT_EQ(r.world_size, std::nullopt);
  ASSERT_EQ(r.rules.size(), 2u);
  EXPECT_EQ(r.rules[1].measured_rel_error, std::nullopt);
  EXPECT_EQ(r.rules[1].predicted, std::nullopt);
  EXPECT_EQ(r.rules[1].world_size, std::nullopt);
  EXPECT_EQ(r.rules[0].predicted->high_ns, 1.1);
}

TEST(RecommendationFile, OptionalTopLevelKeysHaveSafeDefaults) {
  const Recommendation r = parseRecommendation(
      R"({"format": "gradscope-recommendation", "version": 1, "backend": "nccl", "rules": []})");
  EXPECT_EQ(r.max_rel_error, 0.0);
  EXPECT_FALSE(r.allow_semantic_change);
  EXPECT_EQ(r.world_size, std::nullopt);
  EXPECT_TRUE(r.created.empty());
  EXPECT_TRUE(r.source_runs.empty());
  EXPECT_TRUE(r.rules.empty());
}

TEST(RecommendationFile, NamesAreReadInAnyCaseAndWrittenCanonically) {
  json doc = validJson();
  doc["backend"] = "MPI";
  doc["rules"][0]["api"] = "mpi_allreduce";
  doc["rules"][0]["dtype"] = "FP32";
  doc["rules"][0]["error_class"] = "Lossy";
  const Recommendation r = parseRecommendation(doc.dump());
  EXPECT_EQ(r.backend, Backend::Mpi);
  EXPECT_EQ(r.rules[0].api, Api::MpiAllreduce);
  const std::string text = toJson(r);
  EXPECT_NE(text.find("\"api\": \"MPI_Allreduce\""), std::string::npos);
  EXPECT_NE(text.find("\"backend\": \"mpi\""), std::string::npos);
  EXPECT_NE(text.find("\"error_class\": \"lossy\""), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------
// Matching

Recommendation matchFixture() {
  Recommendation r;
  r.backend = Backend::Mpi;
  r.max_rel_error = 0.01;
  const auto add = [&](Api api, DType dtype, std::int64_t min, std::int64_t max, std::optional<int> world,
                       std::string strategy) {
    RecommendationRule rule;
    rule.api = api;
    rule.dtype = dtype;
    rule.min_bytes = min;
    rule.max_bytes = max;
    rule.world_size = world;
    rule.strategy = std::move(strategy);
    rule.error_class = ErrorClass::Lossy;
    r.rules.push_back(rule);
  };
  add(Api::MpiAllreduce, DType::Fp32, 1024, 4096, std::nullopt, "any-size/small");
  add(Api::MpiAllreduce, DType::Fp32, 4097, 1 << 20, std::nullopt, "any-size/large");
  add(Api::MpiAllreduce, DType::Fp32, 2048, 2048, 4, "four/exact");
  add(Api::MpiAllreduce, DType::Fp32, 0, 1 << 20, 8, "eight/all");
  add(Api::MpiAllreduce, DType::Bf16, 1024, 4096, std::nullopt, "bf16/small");
  add(Api::MpiIallreduce, DType::Fp32, 1024, 4096, std::nullopt, "nonblocking/small");
  return r;
}

std::string matched(const Recommendation& r, Api api, DType dtype, std::int64_t bytes, int world) {
  const RecommendationRule* rule = r.match(api, dtype, bytes, world);
  return rule ? rule->strategy : "none";
}

TEST(RecommendationMatch, RangeEdgesAreInclusive) {
  const Recommendation r = matchFixture();
  ASSERT_NO_THROW(toJson(r));  // a valid file: the cases below are what the agent would see
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 1023, 2), "none");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 1024, 2), "any-size/small");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 4096, 2), "any-size/small");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 4097, 2), "any-size/large");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 1 << 20, 2), "any-size/large");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, (1 << 20) + 1, 2), "none");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 0, 2), "none");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, -1, 2), "none");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, std::numeric_limits<std::int64_t>::max(), 2), "none");
}

TEST(RecommendationMatch, WorldSizeSpecificRuleWinsOverAnySize) {
  const Recommendation r = matchFixture();
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 2048, 4), "four/exact");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 2047, 4), "any-size/small");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 2049, 4), "any-size/small");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 2048, 3), "any-size/small");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 0, 8), "eight/all");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 5000, 8), "eight/all");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp32, 0, 4), "none");
}

TEST(RecommendationMatch, DtypeAndApiMustBeEqual) {
  const Recommendation r = matchFixture();
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Bf16, 2048, 2), "bf16/small");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Fp16, 2048, 2), "none");
  EXPECT_EQ(matched(r, Api::MpiAllreduce, DType::Other, 2048, 2), "none");
  EXPECT_EQ(matched(r, Api::MpiIallreduce, DType::Fp32, 2048, 2), "nonblocking/small");
  EXPECT_EQ(matched(r, Api::MpiIallreduce, DType::Fp32, 5000, 2), "none");
  EXPECT_EQ(matched(r, Api::NcclAllReduce, DType::Fp32, 2048, 2), "none");
  EXPECT_EQ(matched(r, Api::MpiReduce, DType::Fp32, 2048, 2), "none");
}

TEST(RecommendationMatch, AnswerDoesNotDependOnRuleOrder) {
  const Recommendation forward = matchFixture();
  Recommendation backward = forward;
  std::reverse(backward.rules.begin(), backward.rules.end());
  for (Api api : {Api::MpiAllreduce, Api::MpiIallreduce})
    for (DType dtype : {DType::Fp32, DType::Bf16})
      for (std::int64_t bytes : {0, 1023, 1024, 2047, 2048, 2049, 4096, 4097, 1 << 20, (1 << 20) + 1})
        for (int world : {1, 2, 4, 8})
          EXPECT_EQ(matched(forward, api, dtype, bytes, world), matched(backward, api, dtype, bytes, world))
              << name(api) << " " << name(dtype) << " " << bytes << " " << world;
}

// ---------------------------------------------------------------------------------------------------
// Refusals: the file as a whole

TEST(RecommendationRefusal, NotJsonSaysWhere) {
  EXPECT_REFUSED("{\"format\": \"gradscope-recommendation\",\n \"version\": 1,\n \"backend\" \"mpi\"}",
                 "not valid JSON", "line 3, column", "byte ");
  EXPECT_REFUSED("gradscope", "not valid JSON", "line 1, column 1");
  EXPECT_REFUSED("{\"a\": tru}", "not valid JSON");
  EXPECT_REFUSED("{} {}", "not valid JSON");
  EXPECT_REFUSED("{\"a\": \"\xff\xfe\"}", "not valid JSON");     // not UTF-8
  EXPECT_REFUSED("{\"a\": \"line\nbreak\"}", "not valid JSON");  // raw control character in a string
}

TEST(RecommendationRefusal, EveryTruncationIsRefusedCleanly) {
  const std::string text = toJson(fullRecommendation());
  const std::size_t last_brace = text.rfind('}');
  for (std::size_t length = 0; length < last_brace; ++length) {
    SCOPED_TRACE(fmt::format("first {} bytes", length));
    const std::string message = refusal(text.substr(0, length));
    EXPECT_TRUE(message.find("not valid JSON") != std::string::npos ||
                message.find("is empty") != std::string::npos)
        << message;
  }
}

TEST(RecommendationRefusal, EmptyOrBlankText) {
  EXPECT_REFUSED("", "is empty");
  EXPECT_REFUSED(" \n\t\r\n", "is empty");
}

TEST(RecommendationRefusal, NotAnObject) {
  EXPECT_REFUSED("[1, 2]", "not a gradscope recommendation file", "an array");
  EXPECT_REFUSED("42", "not a gradscope recommendation file", "42");
  EXPECT_REFUSED("\"text\"", "not a gradscope recommendation file");
  EXPECT_REFUSED("null", "not a gradscope recommendation file", "null");
}

TEST(RecommendationRefusal, FormatMissingOrDifferent) {
  json doc = validJson();
  doc.erase("format");
  EXPECT_REFUSED(doc.dump(), "not a gradscope recommendation file", "format", "gradscope-recommendation");
  doc["format"] = "nccl-tuner";
  EXPECT_REFUSED(doc.dump(), "not a gradscope recommendation file", "\"nccl-tuner\"");
  doc["format"] = 1;
  EXPECT_REFUSED(doc.dump(), "not a gradscope recommendation file");
  // A trace's config JSON, say: an object without our key.
  EXPECT_REFUSED(R"({"agent": {"ranks": 2}})", "not a gradscope recommendation file");
}

TEST(RecommendationRefusal, Version) {
  json doc = validJson();
  doc.erase("version");
  EXPECT_REFUSED(doc.dump(), "version is missing");
  doc["version"] = "1";
  EXPECT_REFUSED(doc.dump(), "version must be an integer", "\"1\"");
  doc["version"] = 1.0;
  EXPECT_REFUSED(doc.dump(), "version must be an integer", "not 1.0");
  doc["version"] = 2;
  EXPECT_REFUSED(doc.dump(), "made by a newer gradscope (version 2); this one reads up to 1", "upgrade");
  doc["version"] = std::numeric_limits<std::uint64_t>::max();
  EXPECT_REFUSED(doc.dump(), "made by a newer gradscope (version 18446744073709551615)");
  doc["version"] = 0;
  EXPECT_REFUSED(doc.dump(), "version 0", "start at 1");
  doc["version"] = -3;
  EXPECT_REFUSED(doc.dump(), "version -3", "start at 1");
  // A newer file is refused for its version before anything else it may have changed.
  doc = validJson();
  doc["version"] = 7;
  doc["backend"] = "quantum";
  doc["rules"] = "elsewhere";
  EXPECT_REFUSED(doc.dump(), "version 7");
}

TEST(RecommendationRefusal, Backend) {
  json doc = validJson();
  doc.erase("backend");
  EXPECT_REFUSED(doc.dump(), "backend is missing");
  doc["backend"] = "gloo";
  EXPECT_REFUSED(doc.dump(), "backend \"gloo\"", "use mpi or nccl");
  doc["backend"] = "local";
  EXPECT_REFUSED(doc.dump(), "backend \"local\"", "use mpi or nccl");
  doc["backend"] = 1;
  EXPECT_REFUSED(doc.dump(), "backend must be a string", "not 1");
}

TEST(RecommendationRefusal, TopLevelValues) {
  const std::vector<std::tuple<std::string, json, std::vector<std::string>>> cases = {
      {"world_size", 0, {"world_size must be a positive integer", "not 0"}},
      {"world_size", -2, {"world_size must be a positive integer", "not -2"}},
      {"world_size", 1.5, {"world_size must be a positive integer", "not 1.5"}},
      {"world_size", "2", {"world_size must be a positive integer", "not the string \"2\""}},
      {"world_size", 3000000000LL, {"world_size must be a positive integer", "not 3000000000"}},
      {"max_rel_error", -0.1, {"max_rel_error -0.1", "non-negative"}},
      {"max_rel_error", "0.1", {"max_rel_error must be a number"}},
      {"max_rel_error", true, {"max_rel_error must be a number", "not true"}},
      {"allow_semantic_change", "yes", {"allow_semantic_change must be true or false"}},
      {"allow_semantic_change", 1, {"allow_semantic_change must be true or false"}},
      {"created", 20240501, {"created must be a string"}},
      {"tool_version", json::array(), {"tool_version must be a string", "an array"}},
      {"source_runs", "uuid", {"source_runs must be an array"}},
      {"source_runs", json::array({"a", 5}), {"source_runs[1] must be a string", "not 5"}},
      {"rules", json::object(), {"rules must be an array", "an object"}},
      {"rules", "none", {"rules must be an array"}},
  };
  for (const auto& [key, value, parts] : cases) {
    json doc = validJson();
    doc[key] = value;
    SCOPED_TRACE(doc.dump());
    const std::string message = refusal(doc.dump());
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
    EXPECT_EQ(message.rfind("plan.json: ", 0), 0u) << message;
  }
  // Infinity cannot be written in JSON, and a number too large for a double is refused by the parser.
  std::string text = validJson().dump();
  text.replace(text.find("\"max_rel_error\":0.01"), 20, "\"max_rel_error\":1e999");
  EXPECT_REFUSED(text, "not valid JSON", "number overflow", "1e999");
  text.replace(text.find("1e999"), 5, std::string(5000, '9') + "e999");
  EXPECT_REFUSED(text, "not valid JSON", "number overflow");

  json doc = validJson();
  doc.erase("rules");
  EXPECT_REFUSED(doc.dump(), "rules is missing");
}

TEST(RecommendationRefusal, EmptyRulesAreAllowed) {
  json doc = validJson();
  doc["rules"] = json::array();
  const Recommendation r = parseRecommendation(doc.dump());
  EXPECT_TRUE(r.rules.empty());
  EXPECT_EQ(r.match(Api::MpiAllreduce, DType::Fp32, 1024, 2), nullptr);
}

// ---------------------------------------------------------------------------------------------------
// Refusals: one rule

// Sets rules[1] (the second rule, "rule 2" in messages) key to value, or erases it for a discarded value.
std::string withRuleKey(const std::string& key, const json& value) {
  json doc = validJson();
  if (value.is_discarded()) doc["rules"][1].erase(key);
  else doc["rules"][1][key] = value;
  return doc.dump();
}

TEST(RecommendationRefusal, RuleFieldTypesAndNames) {
  const json missing(json::value_t::discarded);
  const std::vector<std::tuple<std::string, json, std::vector<std::string>>> cases = {
      {"api", missing, {"rule 2: api is missing"}},
      {"api", "MPI_Allreducee", {"rule 2: api \"MPI_Allreducee\" is unknown", "MPI_Iallreduce"}},
      {"api", 3, {"rule 2: api must be a string", "not 3"}},
      {"api", "MPI_Bcast", {"rule 2: api MPI_Bcast is not an all-reduce", "remove the rule"}},
      {"api", "MPI_Reduce_scatter", {"rule 2: api MPI_Reduce_scatter is not an all-reduce"}},
      {"api", "ncclAllReduce", {"rule 2: api ncclAllReduce is a nccl call but the file's backend is mpi"}},
      {"dtype", missing, {"rule 2: dtype is missing"}},
      {"dtype", "fp42", {"rule 2: dtype \"fp42\" is unknown", "fp32"}},
      {"dtype", "other", {"rule 2: dtype \"other\" is unknown"}},
      {"dtype", json::array(), {"rule 2: dtype must be a string", "an array"}},
      {"min_bytes", missing, {"rule 2: min_bytes is missing"}},
      {"min_bytes", -1, {"rule 2: min_bytes must be a non-negative integer", "not -1"}},
      {"min_bytes", "1024", {"rule 2: min_bytes must be a non-negative integer", "\"1024\""}},
      {"min_bytes", 1024.5, {"rule 2: min_bytes must be a non-negative integer", "1024.5"}},
      {"max_bytes",
       std::numeric_limits<std::uint64_t>::max(),
       {"rule 2: max_bytes must be a non-negative integer", "18446744073709551615"}},
      {"max_bytes", 65536, {"rule 2: min_bytes 65537 is above max_bytes 65536"}},
      {"world_size", 0, {"rule 2: world_size must be a positive integer"}},
      {"world_size", true, {"rule 2: world_size must be a positive integer", "not true"}},
      {"strategy", missing, {"rule 2: strategy is missing"}},
      {"strategy", "", {"rule 2: strategy is empty"}},
      {"strategy", "sum", {"rule 2: strategy \"sum\" is not aggregator/transport[/wire]"}},
      {"strategy", "sum//bf16", {"rule 2: strategy \"sum//bf16\" is not aggregator/transport[/wire]"}},
      {"strategy", "sum/native/bf16/x", {"rule 2: strategy \"sum/native/bf16/x\" is not"}},
      {"strategy", "sum/native\nrm -rf", {"rule 2: strategy \"sum/native\\x0arm -rf\" is not"}},
      {"strategy", std::string(500, 'x'), {"rule 2: strategy \"xxxxxxxx", "...\" is not"}},
      {"strategy", 7, {"rule 2: strategy must be a string"}},
      {"error_class", missing, {"rule 2: error_class is missing"}},
      {"error_class", "fuzzy", {"rule 2: error_class \"fuzzy\" is unknown", "lossless, lossy or semantic"}},
      {"measured_rel_error", "small", {"rule 2: measured_rel_error must be a number"}},
      {"measured_rel_error", -0.5, {"rule 2: measured_rel_error -0.5 is not a non-negative number"}},
      {"predicted_ns", 5, {"rule 2: predicted_ns must be an object", "not 5"}},
      {"predicted_ns", json::object(), {"rule 2: predicted_ns has none of median, low and high"}},
      {"predicted_ns",
       {{"median", 1.0}, {"low", 0.5}},
       {"rule 2: predicted_ns needs all of median, low and high, or none"}},
      {"predicted_ns",
       {{"median", "1"}, {"low", 0.5}, {"high", 2}},
       {"rule 2: predicted_ns.median must be a number", "\"1\""}},
      {"predicted_ns",
       {{"median", 1.0}, {"low", 1.5}, {"high", 2.0}},
       {"rule 2: predicted_ns has low 1.5, median 1, high 2", "0 <= low <= median <= high"}},
      {"predicted_ns",
       {{"median", 3.0}, {"low", 1.5}, {"high", 2.0}},
       {"rule 2: predicted_ns has low 1.5, median 3"}},
      {"predicted_ns", {{"median", 0.0}, {"low", -1.0}, {"high", 2.0}}, {"rule 2: predicted_ns has low -1"}},
      {"baseline", "sum/native", {"rule 2: baseline must be an object"}},
      {"baseline", {{"strategy", 3}}, {"rule 2: baseline.strategy must be a string"}},
      {"baseline",
       {{"strategy", "native"}},
       {"rule 2: baseline.strategy \"native\" is not aggregator/transport"}},
      {"baseline",
       {{"strategy", "sum/native"}, {"median", 2.0}, {"low", 2.5}, {"high", 3.0}},
       {"rule 2: baseline has low 2.5, median 2, high 3"}},
      {"baseline", {{"median", 2.0}}, {"rule 2: baseline needs all of median, low and high"}},
      {"evidence", -1, {"rule 2: evidence must be a non-negative integer", "not -1"}},
      {"evidence", 2.5, {"rule 2: evidence must be a non-negative integer"}},
  };
  for (const auto& [key, value, parts] : cases) {
    const std::string text = withRuleKey(key, value);
    SCOPED_TRACE(text);
    const std::string message = refusal(text);
    EXPECT_EQ(message.rfind("plan.json: rule 2: ", 0), 0u) << message;
    EXPECT_NE(message.find(" ("), std::string::npos) << "no fix given: " << message;
    EXPECT_EQ(message.back(), ')') << message;
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST(RecommendationRefusal, RuleThatIsNotAnObject) {
  json doc = validJson();
  doc["rules"].push_back(5);
  EXPECT_REFUSED(doc.dump(), "rule 3: is 5, not an object");
  doc["rules"][2] = nullptr;
  EXPECT_REFUSED(doc.dump(), "rule 3: is null, not an object");
}

TEST(RecommendationRefusal, NcclFileRefusesMpiRules) {
  json doc = validJson();
  doc["backend"] = "nccl";
  doc["rules"][0]["api"] = "ncclAllReduce";
  EXPECT_REFUSED(doc.dump(), "rule 2: api MPI_Allreduce is a mpi call but the file's backend is nccl");
  doc["rules"][1]["api"] = "ncclAllReduce";
  EXPECT_NO_THROW(parseRecommendation(doc.dump()));
  doc["rules"][1]["api"] = "ncclReduceScatter";
  EXPECT_REFUSED(doc.dump(), "rule 2: api ncclReduceScatter is not an all-reduce");
}

TEST(RecommendationRefusal, StrategyAboveDeclaredClass) {
  // The example from the brief, word for word.
  json doc = validJson();
  doc["rules"][0]["error_class"] = "lossless";
  EXPECT_EQ(refusal(doc.dump()),
            "plan.json: rule 1: strategy sum/native/bf16 is lossy but the rule declares error_class lossless "
            "(regenerate it with gradscope recommend --max-rel-error)");

  doc = validJson();
  doc["rules"][1]["strategy"] = "adasum/native";
  EXPECT_REFUSED(doc.dump(),
                 "rule 2: strategy adasum/native is semantic but the rule declares error_class lossless",
                 "--allow-semantic-change");
  doc["rules"][1]["error_class"] = "lossy";
  EXPECT_REFUSED(doc.dump(),
                 "rule 2: strategy adasum/native is semantic but the rule declares error_class lossy");
  doc["rules"][1]["strategy"] = "AdaCons/native";  // the agent would read it as adacons
  EXPECT_REFUSED(doc.dump(), "rule 2: strategy AdaCons/native is semantic");

  // A higher declared class than the strategy needs is fine.
  doc = validJson();
  doc["rules"][1]["error_class"] = "lossy";
  EXPECT_NO_THROW(parseRecommendation(doc.dump()));
}

TEST(RecommendationRefusal, DeclaredClassOutsideTheFilesBudget) {
  json doc = validJson();
  doc["max_rel_error"] = 0;
  EXPECT_REFUSED(doc.dump(), "rule 1: declares error_class lossy but the file's max_rel_error is 0",
                 "--max-rel-error");

  doc = validJson();
  doc["rules"][1]["strategy"] = "adacons/native";
  doc["rules"][1]["error_class"] = "semantic";
  EXPECT_REFUSED(doc.dump(),
                 "rule 2: declares error_class semantic but the file's allow_semantic_change is false",
                 "--allow-semantic-change");
  doc["allow_semantic_change"] = true;
  EXPECT_NO_THROW(parseRecommendation(doc.dump()));

  doc = validJson();
  doc["rules"][0]["measured_rel_error"] = 0.02;
  EXPECT_REFUSED(doc.dump(), "rule 1: measured_rel_error 0.02 is above the file's max_rel_error 0.01");
  doc["rules"][0]["measured_rel_error"] = 0.01;  // at the budget is within it
  EXPECT_NO_THROW(parseRecommendation(doc.dump()));
  // Lossless rules are not held to the budget by their measured error (summation order differs).
  doc = validJson();
  doc["rules"][1]["measured_rel_error"] = 0.5;
  EXPECT_NO_THROW(parseRecommendation(doc.dump()));
}

TEST(RecommendationRefusal, OverlappingRules) {
  json rules = json::array();
  const auto rule = [](std::int64_t min, std::int64_t max, json world = nullptr, std::string dtype = "fp32",
                       std::string api = "MPI_Allreduce") {
    return json{
        {"api", api},          {"dtype", dtype},          {"min_bytes", min},         {"max_bytes", max},
        {"world_size", world}, {"strategy", "sum/rs_ag"}, {"error_class", "lossless"}};
  };
  json doc = validJson();
  doc["rules"] = json::array({rule(0, 1023), rule(0, 1023, 2), rule(8192, 9000), rule(0, 4096, 2, "bf16"),
                              rule(1024, 4096, nullptr, "fp32", "MPI_Iallreduce"), rule(4097, 8191)});
  ASSERT_NO_THROW(parseRecommendation(doc.dump())) << "touching ranges and other keys do not overlap";

  // Rules 2 and 5 in the brief's words.
  json overlapping = validJson();
  overlapping["rules"] =
      json::array({rule(0, 511), rule(1024, 4096), rule(5000, 6000), rule(6001, 7000), rule(0, 8192, 2)});
  EXPECT_NO_THROW(parseRecommendation(overlapping.dump()));
  overlapping["rules"][4]["world_size"] = nullptr;
  EXPECT_EQ(
      refusal(overlapping.dump()),
      "plan.json: rules 1 and 5 overlap for MPI_Allreduce fp32 from 0 to 511 bytes (give each byte range "
      "to one rule, or regenerate it with gradscope recommend --format json)");
  overlapping["rules"][0]["dtype"] = "fp16";
  EXPECT_REFUSED(overlapping.dump(), "rules 2 and 5 overlap for MPI_Allreduce fp32 from 1024 to 4096 bytes");

  // One byte in common, a range inside another, identical ranges, a world size in the message.
  doc = validJson();
  doc["rules"] = json::array({rule(0, 1024), rule(1024, 2048)});
  EXPECT_REFUSED(doc.dump(), "rules 1 and 2 overlap for MPI_Allreduce fp32 from 1024 to 1024 bytes");
  doc["rules"] = json::array({rule(2000, 2100), rule(0, 1 << 20), rule(4000, 4100)});
  EXPECT_REFUSED(doc.dump(), "rules 1 and 2 overlap for MPI_Allreduce fp32 from 2000 to 2100 bytes");
  doc["rules"] = json::array({rule(5, 5, 4), rule(5, 5, 4)});
  EXPECT_REFUSED(doc.dump(),
                 "rules 1 and 2 overlap for MPI_Allreduce fp32 at world size 4 from 5 to 5 bytes");
  // A long rule reaching past a short one still overlaps the next.
  doc["rules"] = json::array({rule(0, 100), rule(10, 20), rule(50, 60)});
  EXPECT_REFUSED(doc.dump(), "rules 1 and 2 overlap");
  doc["rules"] = json::array({rule(0, 20), rule(30, 40), rule(10, 100)});
  EXPECT_REFUSED(doc.dump(), "rules 1 and 3 overlap for MPI_Allreduce fp32 from 10 to 20 bytes");
}

TEST(RecommendationRefusal, ManyRules) {
  // A file with many rules (the overlap check sorts rather than comparing every pair).
  Recommendation r;
  r.backend = Backend::Nccl;
  for (std::int64_t i = 0; i < 10'000; ++i) {
    RecommendationRule rule;
    rule.api = Api::NcclAllReduce;
    rule.min_bytes = i * 16;
    rule.max_bytes = i * 16 + 15;
    rule.strategy = "sum/nccl.ring.simple";
    r.rules.push_back(rule);
  }
  const Recommendation parsed = parseRecommendation(toJson(r));
  EXPECT_EQ(parsed.rules.size(), r.rules.size());
  EXPECT_EQ(parsed.match(Api::NcclAllReduce, DType::Fp32, 16 * 3'137 + 7, 8), &parsed.rules[3'137]);
}

// ---------------------------------------------------------------------------------------------------
// Hostile input

TEST(RecommendationRefusal, DeeplyNestedGarbage) {
  EXPECT_REFUSED(std::string(100'000, '['), "nested deeper than 64 levels", "line 1, column 65");
  EXPECT_REFUSED(std::string(100'000, '[') + std::string(100'000, ']'), "nested deeper than 64 levels");
  std::string objects;
  for (int i = 0; i < 50'000; ++i) objects += "{\"a\":";
  EXPECT_REFUSED(objects, "nested deeper than 64 levels");
  // Deep inside an unknown key of an otherwise valid file.
  json doc = validJson();
  std::string text = doc.dump();
  text.insert(1, "\"junk\":" + std::string(65, '[') + std::string(65, ']') + ",");
  EXPECT_REFUSED(text, "nested deeper than 64 levels");
  // Brackets inside strings do not count, and 60 levels are fine.
  text = doc.dump();
  text.insert(1, "\"junk\":[\"" + std::string(1000, '[') + "\"," + std::string(60, '[') +
                     std::string(60, ']') + "],");
  EXPECT_NO_THROW(parseRecommendation(text));
}

TEST(RecommendationRefusal, RandomCorruptionOnlyEverThrowsError) {
  // Byte flips, deletions and insertions in a valid file: each result is either a valid file or a one-line
  // gradscope::Error, never another exception or a crash. Fixed seed: a failure reproduces.
  const std::string original = toJson(fullRecommendation());
  std::mt19937 random(20240501);
  const std::string alphabet = "{}[]\",:0123456789-+.eE \n\\/truefalsnul\xff\x80\xc3";
  int accepted = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::string text = original;
    const int edits = 1 + static_cast<int>(random() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const std::size_t at = random() % text.size();
      const char c = alphabet[random() % alphabet.size()];
      switch (random() % 3) {
        case 0: text[at] = c; break;
        case 1: text.erase(at, 1 + random() % 8); break;
        default: text.insert(at, 1, c); break;
      }
    }
    try {
      parseRecommendation(text, "fuzz");
      ++accepted;
    } catch (const Error& error) {
      const std::string message = error.what();
      ASSERT_EQ(message.find('\n'), std::string::npos) << message;
      ASSERT_EQ(message.rfind("fuzz: ", 0), 0u) << message;
    } catch (const std::exception& error) {
      FAIL() << "not a gradscope::Error: " << error.what() << "\ninput:\n" << text;
    }
  }
  EXPECT_LT(accepted, 3000);
}

TEST(RecommendationRefusal, SourceNameWithControlCharactersStaysOneLine) {
  const std::string message = refusal("[", "odd\nname.json");
  EXPECT_EQ(message.rfind("odd\\x0aname.json: not valid JSON", 0), 0u) << message;
}

// ---------------------------------------------------------------------------------------------------
// The writer refuses what the reader would refuse

TEST(RecommendationWriter, RefusesAnInvalidRecommendation) {
  Recommendation r = fullRecommendation();
  r.rules[0].error_class = ErrorClass::Lossless;
  EXPECT_GRADSCOPE_ERROR(toJson(r),
                         "recommendation: rule 1: strategy sum/native/bf16 is lossy but the rule declares "
                         "error_class lossless");
  r = fullRecommendation();
  r.backend = Backend::Local;
  EXPECT_GRADSCOPE_ERROR(toJson(r), "recommendation: backend local");
  r = fullRecommendation();
  r.version = 2;
  EXPECT_GRADSCOPE_ERROR(toJson(r), "recommendation: version 2");
  r = fullRecommendation();
  r.max_rel_error = std::nan("");
  EXPECT_GRADSCOPE_ERROR(toJson(r), "recommendation: max_rel_error nan");
  r = fullRecommendation();
  r.rules[0].predicted = TimeInterval{1, 2, 3};
  EXPECT_GRADSCOPE_ERROR(toJson(r), "rule 1: predicted_ns has low 2, median 1, high 3");
  r = fullRecommendation();
  r.rules[0].measured_rel_error = std::numeric_limits<double>::infinity();
  EXPECT_GRADSCOPE_ERROR(toJson(r), "rule 1: measured_rel_error inf");
  r = fullRecommendation();
  r.rules[1].api = Api::Unknown;
  EXPECT_GRADSCOPE_ERROR(toJson(r), "rule 2: api is unset");
  r = fullRecommendation();
  r.rules[1].dtype = DType::Other;
  EXPECT_GRADSCOPE_ERROR(toJson(r), "rule 2: dtype");
  r = fullRecommendation();
  r.rules[1].min_bytes = -5;
  EXPECT_GRADSCOPE_ERROR(toJson(r), "rule 2: min_bytes -5");
  r = fullRecommendation();
  r.rules[2].world_size = 0;
  EXPECT_GRADSCOPE_ERROR(toJson(r), "rule 3: world_size 0");
  r = fullRecommendation();
  r.rules[1].evidence = -1;
  EXPECT_GRADSCOPE_ERROR(toJson(r), "rule 2: evidence -1");
  r = fullRecommendation();
  r.created = "2024\xff";
  EXPECT_GRADSCOPE_ERROR(toJson(r), "recommendation: ", "not valid UTF-8");
}

// ---------------------------------------------------------------------------------------------------
// Files

TEST(RecommendationLoad, ReadsAFileTheWriterWrote) {
  test::TempDir dir;
  const std::string path = dir.file("plan.json");
  const Recommendation original = fullRecommendation();
  test::writeFile(path, toJson(original));
  expectSame(loadRecommendation(path), original);
}

TEST(RecommendationLoad, ErrorsInTheContentNameThePath) {
  test::TempDir dir;
  const std::string path = dir.file("plan.json");
  json doc = validJson();
  doc["version"] = 3;
  test::writeFile(path, doc.dump());
  EXPECT_GRADSCOPE_ERROR(loadRecommendation(path), path + ": made by a newer gradscope (version 3)");
}

TEST(RecommendationLoad, EmptyFile) {
  test::TempDir dir;
  const std::string path = dir.file("empty.json");
  test::writeFile(path, "");
  EXPECT_GRADSCOPE_ERROR(loadRecommendation(path), path + ": is empty", "gradscope recommend");
  test::writeFile(path, "\n\n");
  EXPECT_GRADSCOPE_ERROR(loadRecommendation(path), path + ": is empty");
}

TEST(RecommendationLoad, MissingFile) {
  test::TempDir dir;
  const std::string path = dir.file("nowhere/plan.json");
  EXPECT_GRADSCOPE_ERROR(loadRecommendation(path), path + ": cannot open the recommendation file",
                         "No such file or directory", "check the path");
  EXPECT_GRADSCOPE_ERROR(loadRecommendation(""), "cannot open the recommendation file");
}

TEST(RecommendationLoad, DirectoryInsteadOfAFile) {
  test::TempDir dir;
  EXPECT_GRADSCOPE_ERROR(loadRecommendation(dir.path()),
                         dir.path() + ": is a directory, not a recommendation file");
}

TEST(RecommendationLoad, FifoIsRefusedWithoutBlocking) {
  test::TempDir dir;
  const std::string path = dir.file("pipe");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  EXPECT_GRADSCOPE_ERROR(loadRecommendation(path), path + ": is not a regular file");
}

TEST(RecommendationLoad, TooLargeFile) {
  test::TempDir dir;
  const std::string path = dir.file("huge.json");
  test::writeFile(path, "");
  // Sparse: the size check comes before reading.
  ASSERT_EQ(::truncate(path.c_str(), kMaxRecommendationFileBytes + 1), 0);
  EXPECT_GRADSCOPE_ERROR(loadRecommendation(path), path + ": is 16 MiB (16777217 bytes)", "at most 16 MiB");
  // Exactly at the limit is read (and then refused as JSON: it is all zero bytes).
  ASSERT_EQ(::truncate(path.c_str(), kMaxRecommendationFileBytes), 0);
  EXPECT_GRADSCOPE_ERROR(loadRecommendation(path), path + ": not valid JSON");
}

TEST(RecommendationLoad, UnreadableFile) {
  test::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string path = dir.file("secret.json");
  test::writeFile(path, toJson(fullRecommendation()));
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);  // unreadable for its owner too, when the tests do not run as root
  const test::ChildResult child =
      test::runUnprivileged([&] { return test::childErrorMessage([&] { loadRecommendation(path); }); });
  if (child.skipped) GTEST_SKIP() << child.text;
  EXPECT_NE(child.text.find("Error: " + path + ": cannot open the recommendation file: Permission denied"),
            std::string::npos)
      << child.text;
  EXPECT_NE(child.text.find("readable"), std::string::npos) << child.text;
}

}  // namespace
}  // namespace gradscope
