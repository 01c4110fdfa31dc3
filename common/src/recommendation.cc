#include "gradscope/common/recommendation.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <numeric>
#include <tuple>

#include <nlohmann/json.hpp>

#include "gradscope/common/error.h"
#include "gradscope/common/strategy_name.h"
#include "gradscope/common/units.h"

namespace gradscope {
namespace {

// Reading uses nlohmann::json; writing uses ordered_json so that keys come out in the documented order.
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kFormat = "gradscope-recommendation";
constexpr std::string_view kRegenerate = "regenerate it with gradscope recommend --format json";

// A valid file nests four levels (file, rules, rule, predicted_ns). nlohmann's parser is iterative, but
// copying, dumping and comparing a value recurse once per level: refusing deep nesting before parsing
// keeps a hostile file from overflowing the stack of the job the agent lives in.
constexpr int kMaxDepth = 64;

// Longest piece of file content quoted in a message, in bytes: enough to recognise a value.
constexpr std::size_t kMaxQuoted = 60;

constexpr std::array kAllReduceApis = {Api::MpiAllreduce, Api::MpiIallreduce, Api::NcclAllReduce};

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// Messages are one line whatever the input: control characters (a newline in a path or in a value) are
// written as escapes.
std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) out += fmt::format("\\x{:02x}", byte);
    else out.push_back(c);
  }
  return out;
}

// "text" with quotes, escaped, cut to kMaxQuoted bytes (at a UTF-8 character boundary) with "...".
std::string quote(std::string_view text) {
  std::string_view shown = text;
  bool cut = false;
  if (shown.size() > kMaxQuoted) {
    std::size_t end = kMaxQuoted;
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) --end;
    shown = text.substr(0, end);
    cut = true;
  }
  std::string out = "\"";
  for (char c : shown) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return printable(out) + (cut ? "...\"" : "\"");
}

// A JSON value as a message shows it: numbers and booleans as written, strings quoted, containers by kind
// (their content could be anything, and dumping it recurses).
std::string describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return value.get<bool>() ? "true" : "false";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return value.dump();
    // dump() keeps "1.0" distinct from 1, but writes an infinity (1e999 in the file) as null.
    case Json::value_t::number_float:
      return std::isfinite(value.get<double>()) ? value.dump() : fmt::format("{}", value.get<double>());
    case Json::value_t::string: return "the string " + quote(value.get_ref<const std::string&>());
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::binary:
    case Json::value_t::discarded: break;
  }
  return "an unreadable value";
}

// Line and column (1-based, in bytes) of a byte offset, for syntax errors in a file someone may open in an
// editor.
std::pair<std::size_t, std::size_t> lineAndColumn(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  const std::string_view before = text.substr(0, offset);
  const std::size_t line = 1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
  const std::size_t last_newline = before.rfind('\n');
  const std::size_t column = last_newline == std::string_view::npos ? offset + 1 : offset - last_newline;
  return {line, column};
}

// Where in the file a message is about: "<source>: " or "<source>: rule 3: ".
class Place {
 public:
  explicit Place(std::string prefix) : prefix_(std::move(prefix)) {}
  Place rule(std::size_t index) const { return Place(fmt::format("{}rule {}: ", prefix_, index + 1)); }

  // Throws the one-line Error: "<source>: [rule N: ]<what> (<fix>)".
  [[noreturn]] void refuse(std::string_view what, std::string_view fix = kRegenerate) const {
    fail("{}{} ({})", prefix_, what, fix);
  }
  [[noreturn]] void wrongType(std::string_view key, std::string_view expected, const Json& value) const {
    refuse(fmt::format("{} must be {}, not {}", key, expected, describe(value)),
           fmt::format("fix the value or {}", kRegenerate));
  }

 private:
  std::string prefix_;
};

// ---------------------------------------------------------------------------------------------------
// Typed access to the keys of a JSON object. A missing key and an explicit null both mean "not given";
// every other value of the wrong type is an error naming the key.

const Json* member(const Json& object, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

const Json& required(const Json& object, std::string_view key, const Place& place) {
  const Json* value = member(object, key);
  if (value == nullptr)
    place.refuse(fmt::format("{} is missing", key), fmt::format("add it or {}", kRegenerate));
  return *value;
}

std::optional<std::int64_t> asInt64(const Json& value) {
  if (value.is_number_unsigned()) {
    const auto unsigned_value = value.get<std::uint64_t>();
    if (unsigned_value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return {};
    return static_cast<std::int64_t>(unsigned_value);
  }
  if (value.is_number_integer()) return value.get<std::int64_t>();
  return {};
}

std::int64_t nonNegativeInteger(const Json& value, std::string_view key, const Place& place) {
  const std::optional<std::int64_t> number = asInt64(value);
  if (!number || *number < 0) place.wrongType(key, "a non-negative integer", value);
  return *number;
}

int positiveInt(const Json& value, std::string_view key, const Place& place) {
  const std::optional<std::int64_t> number = asInt64(value);
  if (!number || *number < 1 || *number > std::numeric_limits<int>::max())
    place.wrongType(key, fmt::format("a positive integer (at most {})", std::numeric_limits<int>::max()),
                    value);
  return static_cast<int>(*number);
}

// Any JSON number. JSON has no NaN or infinity and nlohmann refuses numbers beyond a double (parseJson
// reports those); the check keeps that assumption from ever reaching validate() unchecked.
double finiteNumber(const Json& value, std::string_view key, const Place& place) {
  if (!value.is_number()) place.wrongType(key, "a number", value);
  const auto number = value.get<double>();
  if (!std::isfinite(number)) place.wrongType(key, "a finite number", value);
  return number;
}

const std::string& string(const Json& value, std::string_view key, const Place& place) {
  if (!value.is_string()) place.wrongType(key, "a string", value);
  return value.get_ref<const std::string&>();
}

const Json& object(const Json& value, std::string_view key, const Place& place) {
  if (!value.is_object()) place.wrongType(key, "an object", value);
  return value;
}

// {"median": m, "low": l, "high": h} (and, in "baseline", other keys): all three or none.
std::optional<TimeInterval> interval(const Json& value, std::string_view key, const Place& place) {
  const Json* median = member(value, "median");
  const Json* low = member(value, "low");
  const Json* high = member(value, "high");
  if (median == nullptr && low == nullptr && high == nullptr) return std::nullopt;
  if (median == nullptr || low == nullptr || high == nullptr)
    place.refuse(fmt::format("{} needs all of median, low and high, or none of them", key),
                 fmt::format("add the missing ones or {}", kRegenerate));
  TimeInterval times;
  times.median_ns = finiteNumber(*median, fmt::format("{}.median", key), place);
  times.low_ns = finiteNumber(*low, fmt::format("{}.low", key), place);
  times.high_ns = finiteNumber(*high, fmt::format("{}.high", key), place);
  return times;
}

// ---------------------------------------------------------------------------------------------------
// Names

std::optional<Backend> parseBackendName(std::string_view text) {
  for (Backend backend : allBackends())
    if (equalsIgnoreCase(name(backend), text)) return backend;
  return std::nullopt;
}

bool isAllReduce(Api api) {
  return std::find(kAllReduceApis.begin(), kAllReduceApis.end(), api) != kAllReduceApis.end();
}

// DType::Other (an MPI derived type) has no element type a strategy could reduce.
bool isNamedDType(DType dtype) {
  const auto all = allDTypes();
  return dtype != DType::Other && std::find(all.begin(), all.end(), dtype) != all.end();
}

// ---------------------------------------------------------------------------------------------------
// Reading: JSON types and names into the struct. What the values mean together is validate()'s job.

// Refuses nesting deeper than kMaxDepth without building anything. Brackets inside strings do not count;
// on malformed text the count may be off, which only matters for a file the parser refuses anyway.
void checkDepth(std::string_view text, const Place& place) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (std::size_t at = 0; at < text.size(); ++at) {
    const char c = text[at];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) {
        const auto [line, column] = lineAndColumn(text, at);
        place.refuse(fmt::format("nested deeper than {} levels at line {}, column {} (byte {})", kMaxDepth,
                                 line, column, at + 1),
                     fmt::format("a recommendation file nests 4 levels; {}", kRegenerate));
      }
    } else if (c == '}' || c == ']') {
      depth = std::max(0, depth - 1);
    }
  }
}

Json parseJson(std::string_view text, const Place& place) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    place.refuse("is empty", fmt::format("expected a gradscope recommendation; {}", kRegenerate));
  checkDepth(text, place);
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& error) {
    // nlohmann's message: "[json.exception.parse_error.101] parse error at line 1, column 2: <reason>";
    // the reason (e.g. "syntax error while parsing value - unexpected end of input") is the useful part.
    std::string_view reason = error.what();
    if (const std::size_t at = reason.find("parse error"); at != std::string_view::npos) {
      reason.remove_prefix(at);
      if (const std::size_t colon = reason.find(": "); colon != std::string_view::npos)
        reason.remove_prefix(colon + 2);
    }
    if (reason.size() > 200) reason = reason.substr(0, 200);
    // error.byte is 1-based and points at the last character read.
    const std::size_t offset = error.byte > 0 ? error.byte - 1 : 0;
    const auto [line, column] = lineAndColumn(text, offset);
    place.refuse(fmt::format("not valid JSON at line {}, column {} (byte {}): {}", line, column, error.byte,
                             printable(reason)),
                 fmt::format("fix the syntax or {}", kRegenerate));
  } catch (const Json::exception& error) {
    // Not a syntax error but a value JSON allows and a double cannot hold ("number overflow parsing
    // '1e999'", out_of_range.406); nlohmann gives no position for it.
    std::string_view reason = error.what();
    if (const std::size_t at = reason.find("] "); at != std::string_view::npos) reason.remove_prefix(at + 2);
    if (reason.size() > 200) reason = reason.substr(0, 200);
    place.refuse(fmt::format("not valid JSON: {}", printable(reason)),
                 fmt::format("fix the value or {}", kRegenerate));
  }
}

RecommendationRule readRule(const Json& value, const Place& place) {
  if (!value.is_object())
    place.refuse(fmt::format("is {}, not an object", describe(value)),
                 fmt::format("fix it or {}", kRegenerate));
  RecommendationRule rule;

  const std::string& api_text = string(required(value, "api", place), "api", place);
  const std::optional<Api> api = parseApi(api_text);
  if (!api)
    place.refuse(fmt::format("api {} is unknown", quote(api_text)),
                 "use MPI_Allreduce, MPI_Iallreduce or ncclAllReduce");
  rule.api = *api;

  const std::string& dtype_text = string(required(value, "dtype", place), "dtype", place);
  const std::optional<DType> dtype = parseDType(dtype_text);
  if (!dtype || !isNamedDType(*dtype))
    place.refuse(fmt::format("dtype {} is unknown", quote(dtype_text)),
                 "use int8, uint8, int32, uint32, int64, uint64, fp16, fp32, fp64, bf16, fp8e4m3 or fp8e5m2");
  rule.dtype = *dtype;

  rule.min_bytes = nonNegativeInteger(required(value, "min_bytes", place), "min_bytes", place);
  rule.max_bytes = nonNegativeInteger(required(value, "max_bytes", place), "max_bytes", place);
  if (const Json* world = member(value, "world_size"))
    rule.world_size = positiveInt(*world, "world_size", place);

  rule.strategy = string(required(value, "strategy", place), "strategy", place);
  const std::string& class_text = string(required(value, "error_class", place), "error_class", place);
  const std::optional<ErrorClass> error_class = parseErrorClass(class_text);
  if (!error_class)
    place.refuse(fmt::format("error_class {} is unknown", quote(class_text)),
                 "use lossless, lossy or semantic");
  rule.error_class = *error_class;

  if (const Json* measured = member(value, "measured_rel_error"))
    rule.measured_rel_error = finiteNumber(*measured, "measured_rel_error", place);
  if (const Json* predicted = member(value, "predicted_ns")) {
    rule.predicted = interval(object(*predicted, "predicted_ns", place), "predicted_ns", place);
    if (!rule.predicted)
      place.refuse("predicted_ns has none of median, low and high",
                   fmt::format("give all three or leave predicted_ns out; {}", kRegenerate));
  }
  if (const Json* baseline = member(value, "baseline")) {
    object(*baseline, "baseline", place);
    if (const Json* strategy = member(*baseline, "strategy"))
      rule.baseline_strategy = string(*strategy, "baseline.strategy", place);
    rule.baseline = interval(*baseline, "baseline", place);
  }
  if (const Json* evidence = member(value, "evidence"))
    rule.evidence = nonNegativeInteger(*evidence, "evidence", place);
  return rule;
}

Recommendation readRecommendation(const Json& root, const Place& place) {
  if (!root.is_object())
    place.refuse(fmt::format("not a gradscope recommendation file: the top level is {}, not an object",
                             describe(root)),
                 "pass the JSON file gradscope recommend --format json wrote");
  const auto it = root.find("format");
  if (it == root.end())
    place.refuse(
        "not a gradscope recommendation file: it has no \"format\" key",
        fmt::format("expected \"format\": \"{}\"; pass the file gradscope recommend --format json wrote",
                    kFormat));
  if (!it->is_string() || it->get_ref<const std::string&>() != kFormat)
    place.refuse(
        fmt::format("not a gradscope recommendation file: format is {}", describe(*it)),
        fmt::format("expected \"format\": \"{}\"; pass the file gradscope recommend --format json wrote",
                    kFormat));

  Recommendation recommendation;
  // The version decides how to read everything else, so it comes first.
  const Json& version = required(root, "version", place);
  if (!version.is_number_integer()) place.wrongType("version", "an integer", version);
  if (version.is_number_unsigned() && version.get<std::uint64_t>() > kRecommendationVersion)
    place.refuse(fmt::format("made by a newer gradscope (version {}); this one reads up to {}",
                             version.dump(), kRecommendationVersion),
                 "upgrade gradscope, or regenerate the file with this gradscope's recommend --format json");
  if (!version.is_number_unsigned() || version.get<std::uint64_t>() < 1)
    place.refuse(fmt::format("version {} is not a valid version (versions start at 1)", version.dump()),
                 fmt::format("fix it or {}", kRegenerate));
  recommendation.version = static_cast<int>(version.get<std::uint64_t>());

  const std::string& backend_text = string(required(root, "backend", place), "backend", place);
  const std::optional<Backend> backend = parseBackendName(backend_text);
  if (!backend || (*backend != Backend::Mpi && *backend != Backend::Nccl))
    place.refuse(fmt::format("backend {} is not one a recommendation can apply to", quote(backend_text)),
                 "use mpi or nccl");
  recommendation.backend = *backend;

  if (const Json* world = member(root, "world_size"))
    recommendation.world_size = positiveInt(*world, "world_size", place);
  if (const Json* budget = member(root, "max_rel_error"))
    recommendation.max_rel_error = finiteNumber(*budget, "max_rel_error", place);
  if (const Json* semantic = member(root, "allow_semantic_change")) {
    if (!semantic->is_boolean()) place.wrongType("allow_semantic_change", "true or false", *semantic);
    recommendation.allow_semantic_change = semantic->get<bool>();
  }
  if (const Json* created = member(root, "created"))
    recommendation.created = string(*created, "created", place);
  if (const Json* tool = member(root, "tool_version"))
    recommendation.tool_version = string(*tool, "tool_version", place);
  if (const Json* runs = member(root, "source_runs")) {
    if (!runs->is_array()) place.wrongType("source_runs", "an array of run uuids", *runs);
    for (std::size_t index = 0; index < runs->size(); ++index)
      recommendation.source_runs.push_back(
          string((*runs)[index], fmt::format("source_runs[{}]", index), place));
  }

  if (const Json* saving = member(root, "predicted_step_saving_ns")) {
    recommendation.step_saving =
        interval(object(*saving, "predicted_step_saving_ns", place), "predicted_step_saving_ns", place);
    if (!recommendation.step_saving)
      place.refuse("predicted_step_saving_ns has none of median, low and high",
                   fmt::format("give all three or leave predicted_step_saving_ns out; {}", kRegenerate));
  }
  const Json& rules = required(root, "rules", place);
  if (!rules.is_array()) place.wrongType("rules", "an array (empty for a file that changes nothing)", rules);
  recommendation.rules.reserve(rules.size());
  for (std::size_t index = 0; index < rules.size(); ++index)
    recommendation.rules.push_back(readRule(rules[index], place.rule(index)));
  return recommendation;
}

// ---------------------------------------------------------------------------------------------------
// Validation of what the values mean together; shared by the reader and the writer.

void validateInterval(const std::optional<TimeInterval>& times, std::string_view key, const Place& place) {
  if (!times) return;
  const TimeInterval& t = *times;
  if (!std::isfinite(t.low_ns) || !std::isfinite(t.median_ns) || !std::isfinite(t.high_ns) || t.low_ns < 0 ||
      t.low_ns > t.median_ns || t.median_ns > t.high_ns)
    place.refuse(fmt::format("{} has low {}, median {}, high {}; 0 <= low <= median <= high is required", key,
                             t.low_ns, t.median_ns, t.high_ns),
                 fmt::format("fix the times or {}", kRegenerate));
}

void validateRule(const RecommendationRule& rule, const Recommendation& file, const Place& place) {
  if (rule.api == Api::Unknown)
    place.refuse("api is unset", "use MPI_Allreduce, MPI_Iallreduce or ncclAllReduce");
  if (!isAllReduce(rule.api))
    place.refuse(
        fmt::format("api {} is not an all-reduce, and only all-reduce strategies exist", name(rule.api)),
        "use MPI_Allreduce, MPI_Iallreduce or ncclAllReduce, or remove the rule");
  if (backendOf(rule.api) != file.backend)
    place.refuse(fmt::format("api {} is a {} call but the file's backend is {}", name(rule.api),
                             name(backendOf(rule.api)), name(file.backend)),
                 fmt::format("put {} rules in a file for backend {}", name(backendOf(rule.api)),
                             name(backendOf(rule.api))));
  if (!isNamedDType(rule.dtype))
    place.refuse(fmt::format("dtype {} is unknown", static_cast<int>(rule.dtype)),
                 "use int8, uint8, int32, uint32, int64, uint64, fp16, fp32, fp64, bf16, fp8e4m3 or fp8e5m2");
  if (rule.min_bytes < 0 || rule.max_bytes < 0)
    place.refuse(
        fmt::format("min_bytes {} and max_bytes {} must not be negative", rule.min_bytes, rule.max_bytes),
        fmt::format("fix the range or {}", kRegenerate));
  if (rule.min_bytes > rule.max_bytes)
    place.refuse(fmt::format("min_bytes {} is above max_bytes {}", rule.min_bytes, rule.max_bytes),
                 fmt::format("the range is inclusive: min_bytes <= max_bytes; fix it or {}", kRegenerate));
  if (rule.world_size && *rule.world_size < 1)
    place.refuse(fmt::format("world_size {} is not a positive integer", *rule.world_size),
                 "use a communicator size, or leave world_size out for any size");

  if (rule.strategy.empty())
    place.refuse("strategy is empty", fmt::format("name one such as sum/native/bf16, or {}", kRegenerate));
  const std::optional<ErrorClass> strategy_class = strategyErrorClass(rule.strategy);
  if (!strategy_class)
    place.refuse(fmt::format("strategy {} is not aggregator/transport[/wire]", quote(rule.strategy)),
                 "use a strategy name such as sum/native, sum/rs_ag/bf16 or adacons/native");
  if (rule.error_class > ErrorClass::Semantic)
    place.refuse(fmt::format("error_class {} is unknown", static_cast<int>(rule.error_class)),
                 "use lossless, lossy or semantic");
  if (*strategy_class > rule.error_class)
    place.refuse(fmt::format("strategy {} is {} but the rule declares error_class {}", rule.strategy,
                             name(*strategy_class), name(rule.error_class)),
                 *strategy_class == ErrorClass::Semantic
                     ? "regenerate it with gradscope recommend --allow-semantic-change"
                     : "regenerate it with gradscope recommend --max-rel-error");
  if (rule.error_class == ErrorClass::Lossy && file.max_rel_error == 0)
    place.refuse(
        "declares error_class lossy but the file's max_rel_error is 0, which allows lossless strategies only",
        "regenerate it with gradscope recommend --max-rel-error");
  if (rule.error_class == ErrorClass::Semantic && !file.allow_semantic_change)
    place.refuse("declares error_class semantic but the file's allow_semantic_change is false",
                 "regenerate it with gradscope recommend --allow-semantic-change");
  if (rule.measured_rel_error) {
    const double measured = *rule.measured_rel_error;
    if (!std::isfinite(measured) || measured < 0)
      place.refuse(fmt::format("measured_rel_error {} is not a non-negative number", measured),
                   fmt::format("fix it or {}", kRegenerate));
    if (rule.error_class == ErrorClass::Lossy && measured > file.max_rel_error)
      place.refuse(
          fmt::format("measured_rel_error {} is above the file's max_rel_error {}", measured,
                      file.max_rel_error),
          "regenerate it with gradscope recommend, or raise --max-rel-error if that error is acceptable");
  }
  validateInterval(rule.predicted, "predicted_ns", place);
  validateInterval(rule.baseline, "baseline", place);
  if (!rule.baseline_strategy.empty() && !strategyErrorClass(rule.baseline_strategy))
    place.refuse(
        fmt::format("baseline.strategy {} is not aggregator/transport[/wire]", quote(rule.baseline_strategy)),
        "use a strategy name such as sum/native");
  if (rule.evidence < 0)
    place.refuse(fmt::format("evidence {} is negative", rule.evidence),
                 fmt::format("fix it or {}", kRegenerate));
}

// Two rules for the same (api, dtype, world_size) must not share a byte: match() would have two answers.
// Sorting by range start finds an overlap in O(n log n); a file may hold many thousands of rules.
void validateNoOverlap(const std::vector<RecommendationRule>& rules, const Place& place) {
  // world_size 0 stands for "any": validateRule has refused 0 as a real size.
  const auto group = [&](std::size_t index) {
    const RecommendationRule& rule = rules[index];
    return std::tuple(rule.api, rule.dtype, rule.world_size.value_or(0));
  };
  std::vector<std::size_t> order(rules.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tuple(group(a), rules[a].min_bytes, a) < std::tuple(group(b), rules[b].min_bytes, b);
  });
  // Within a group, the rule reaching farthest so far: the first one a later range start can overlap.
  std::size_t widest = 0;
  for (std::size_t at = 0; at < order.size(); ++at) {
    const std::size_t index = order[at];
    if (at == 0 || group(index) != group(widest)) {
      widest = index;
      continue;
    }
    const RecommendationRule& rule = rules[index];
    const RecommendationRule& reach = rules[widest];
    if (rule.min_bytes <= reach.max_bytes) {
      const std::string world = rule.world_size ? fmt::format(" at world size {}", *rule.world_size) : "";
      place.refuse(
          fmt::format("rules {} and {} overlap for {} {}{} from {} to {} bytes", std::min(index, widest) + 1,
                      std::max(index, widest) + 1, name(rule.api), name(rule.dtype), world, rule.min_bytes,
                      std::min(rule.max_bytes, reach.max_bytes)),
          fmt::format("give each byte range to one rule, or {}", kRegenerate));
    }
    if (rule.max_bytes > reach.max_bytes) widest = index;
  }
}

void validate(const Recommendation& recommendation, const Place& place) {
  if (recommendation.version < 1 || recommendation.version > kRecommendationVersion)
    place.refuse(fmt::format("version {} is not one this gradscope writes or reads (1 to {})",
                             recommendation.version, kRecommendationVersion),
                 "use kRecommendationVersion");
  validateInterval(recommendation.step_saving, "predicted_step_saving_ns", place);
  if (recommendation.backend != Backend::Mpi && recommendation.backend != Backend::Nccl)
    place.refuse(
        fmt::format("backend {} is not one a recommendation can apply to", name(recommendation.backend)),
        "use mpi or nccl");
  if (recommendation.world_size && *recommendation.world_size < 1)
    place.refuse(fmt::format("world_size {} is not a positive integer", *recommendation.world_size),
                 "use the job's world size, or leave world_size out");
  if (!std::isfinite(recommendation.max_rel_error) || recommendation.max_rel_error < 0)
    place.refuse(fmt::format("max_rel_error {} is not a non-negative number", recommendation.max_rel_error),
                 "use 0 for lossless strategies only, or the relative error the job tolerates (e.g. 0.01)");
  for (std::size_t index = 0; index < recommendation.rules.size(); ++index)
    validateRule(recommendation.rules[index], recommendation, place.rule(index));
  validateNoOverlap(recommendation.rules, place);
}

// Everything the agent may meet (a JSON library exception, an allocation failure, anything else) becomes
// the one exception type it is prepared for.
template <typename Body>
auto onlyGradscopeErrors(std::string_view source, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail("{}: out of memory while handling the recommendation (free memory, or use a smaller file)",
         printable(source));
  } catch (const std::exception& error) {
    fail("{}: unexpected error while handling the recommendation: {} ({})", printable(source),
         printable(error.what()), kRegenerate);
  }
}

OrderedJson intervalJson(const TimeInterval& times) {
  OrderedJson out = OrderedJson::object();
  out["median"] = times.median_ns;
  out["low"] = times.low_ns;
  out["high"] = times.high_ns;
  return out;
}

// open(2) failures get a fix that fits the cause.
std::string_view openFix(int errnum) {
  switch (errnum) {
    case ENOENT:
    case ENOTDIR: return "check the path; gradscope recommend TRACE --format json > FILE makes one";
    case EACCES:
    case EPERM: return "make the file readable by the user the job runs as";
    default: return "check the path and the file";
  }
}

std::string readFileText(const std::string& path) {
  const std::string shown = printable(path);
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, and the agent must never
  // hang the job. Regular files ignore it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int errnum = errno;
    fail("{}: cannot open the recommendation file: {} ({})", shown, errnoMessage(errnum), openFix(errnum));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int errnum = errno;
    fail("{}: cannot read the recommendation file: {} (check the file)", shown, errnoMessage(errnum));
  }
  if (S_ISDIR(info.st_mode))
    fail(
        "{}: is a directory, not a recommendation file (pass the JSON file gradscope recommend --format json "
        "wrote)",
        shown);
  if (!S_ISREG(info.st_mode))
    fail(
        "{}: is not a regular file (copy the recommendation into a regular file: reading a pipe or a device "
        "could block the job)",
        shown);
  const auto too_large = [&](std::int64_t size) {
    fail(
        "{}: is {} ({} bytes); a recommendation file is at most {} (pass the JSON file gradscope recommend "
        "--format json wrote)",
        shown, formatBytes(static_cast<std::uint64_t>(size)), size,
        formatBytes(static_cast<std::uint64_t>(kMaxRecommendationFileBytes)));
  };
  if (info.st_size > kMaxRecommendationFileBytes) too_large(info.st_size);

  // Read to the end rather than trusting st_size: the file may be growing while we read it.
  std::string text(static_cast<std::size_t>(info.st_size) + 1, '\0');
  std::size_t used = 0;
  for (;;) {
    if (used == text.size()) {
      if (static_cast<std::int64_t>(used) > kMaxRecommendationFileBytes)
        too_large(static_cast<std::int64_t>(used));
      text.resize(
          std::min(text.size() * 2 + 4096, static_cast<std::size_t>(kMaxRecommendationFileBytes) + 1));
    }
    const ssize_t got = ::read(fd, text.data() + used, text.size() - used);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int errnum = errno;
      fail("{}: cannot read the recommendation file: {} (check the file)", shown, errnoMessage(errnum));
    }
    if (got == 0) break;
    used += static_cast<std::size_t>(got);
  }
  text.resize(used);
  if (static_cast<std::int64_t>(used) > kMaxRecommendationFileBytes)
    too_large(static_cast<std::int64_t>(used));
  if (used == 0) fail("{}: is empty (expected a gradscope recommendation; {})", shown, kRegenerate);
  return text;
}

}  // namespace

std::string_view name(ErrorClass error_class) {
  switch (error_class) {
    case ErrorClass::Lossless: return "lossless";
    case ErrorClass::Lossy: return "lossy";
    case ErrorClass::Semantic: return "semantic";
  }
  return "unknown";
}

std::optional<ErrorClass> parseErrorClass(std::string_view text) {
  for (ErrorClass error_class : {ErrorClass::Lossless, ErrorClass::Lossy, ErrorClass::Semantic})
    if (equalsIgnoreCase(name(error_class), text)) return error_class;
  return std::nullopt;
}

std::optional<ErrorClass> strategyErrorClass(std::string_view strategy) {
  // Split into 2 or 3 non-empty parts of [A-Za-z0-9_.-]. parseStrategyName ignores case, so the class
  // must too: "AdaSum/native" is as semantic as "adasum/native".
  std::string_view parts[3];
  std::size_t count = 0;
  std::size_t start = 0;
  for (std::size_t at = 0; at <= strategy.size(); ++at) {
    if (at < strategy.size() && strategy[at] != '/') {
      const auto c = static_cast<unsigned char>(strategy[at]);
      if (!std::isalnum(c) && c != '_' && c != '.' && c != '-') return std::nullopt;
      continue;
    }
    if (at == start || count == 3) return std::nullopt;
    parts[count++] = strategy.substr(start, at - start);
    start = at + 1;
  }
  if (count < 2) return std::nullopt;
  if (const auto aggregator = parseAggregator(parts[0]); aggregator && *aggregator != Aggregator::Sum)
    return ErrorClass::Semantic;
  if (count == 3)
    for (WireFormat wire : kWireFormats)
      if (equalsIgnoreCase(parts[2], name(wire))) return ErrorClass::Lossy;
  return ErrorClass::Lossless;
}

const RecommendationRule* Recommendation::match(Api api, DType dtype, std::int64_t bytes,
                                                int world) const noexcept {
  const RecommendationRule* any_size = nullptr;
  for (const RecommendationRule& rule : rules) {
    if (rule.api != api || rule.dtype != dtype || bytes < rule.min_bytes || bytes > rule.max_bytes) continue;
    if (!rule.world_size) {
      if (any_size == nullptr) any_size = &rule;
    } else if (*rule.world_size == world) {
      return &rule;
    }
  }
  return any_size;
}

Recommendation parseRecommendation(std::string_view json_text, std::string_view source_name) {
  return onlyGradscopeErrors(source_name, [&] {
    const Place place(printable(source_name) + ": ");
    const Json root = parseJson(json_text, place);
    Recommendation recommendation = readRecommendation(root, place);
    validate(recommendation, place);
    return recommendation;
  });
}

Recommendation loadRecommendation(const std::string& path) {
  const std::string text = onlyGradscopeErrors(path, [&] { return readFileText(path); });
  return parseRecommendation(text, path);
}

std::string toJson(const Recommendation& recommendation) {
  return onlyGradscopeErrors("recommendation", [&] {
    validate(recommendation, Place("recommendation: "));
    OrderedJson out = OrderedJson::object();
    out["format"] = kFormat;
    out["version"] = recommendation.version;
    out["created"] = recommendation.created;
    out["tool_version"] = recommendation.tool_version;
    out["source_runs"] = recommendation.source_runs;
    out["backend"] = name(recommendation.backend);
    if (recommendation.world_size) out["world_size"] = *recommendation.world_size;
    out["max_rel_error"] = recommendation.max_rel_error;
    out["allow_semantic_change"] = recommendation.allow_semantic_change;
    if (recommendation.step_saving)
      out["predicted_step_saving_ns"] = intervalJson(*recommendation.step_saving);
    OrderedJson rules = OrderedJson::array();
    for (const RecommendationRule& rule : recommendation.rules) {
      OrderedJson entry = OrderedJson::object();
      entry["api"] = name(rule.api);
      entry["dtype"] = name(rule.dtype);
      entry["min_bytes"] = rule.min_bytes;
      entry["max_bytes"] = rule.max_bytes;
      if (rule.world_size) entry["world_size"] = *rule.world_size;
      entry["strategy"] = rule.strategy;
      entry["error_class"] = name(rule.error_class);
      if (rule.measured_rel_error) entry["measured_rel_error"] = *rule.measured_rel_error;
      if (rule.predicted) entry["predicted_ns"] = intervalJson(*rule.predicted);
      if (rule.baseline || !rule.baseline_strategy.empty()) {
        OrderedJson baseline = OrderedJson::object();
        if (!rule.baseline_strategy.empty()) baseline["strategy"] = rule.baseline_strategy;
        if (rule.baseline) baseline.update(intervalJson(*rule.baseline));
        entry["baseline"] = std::move(baseline);
      }
      entry["evidence"] = rule.evidence;
      rules.push_back(std::move(entry));
    }
    out["rules"] = std::move(rules);
    try {
      return out.dump(2) + "\n";
    } catch (const OrderedJson::type_error&) {
      // The strategy names are plain ASCII by now; the free-text strings are the caller's.
      fail(
          "recommendation: created, tool_version or a source_runs entry is not valid UTF-8 (pass UTF-8 "
          "text)");
    }
  });
}

}  // namespace gradscope
