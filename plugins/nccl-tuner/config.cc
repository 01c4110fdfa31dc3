#include "config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <new>
#include <numeric>

#include <fmt/format.h>

#include "gradscope/common/error.h"
#include "gradscope/common/job_environment.h"
#include "gradscope/common/recommendation.h"
#include "gradscope/common/strategy_name.h"
#include "gradscope/common/types.h"

namespace gradscope::nccl_tuner {
namespace {

constexpr std::array<std::string_view, kCollectiveCount> kCollectives = {"broadcast", "reduce", "allgather",
                                                                         "reducescatter", "allreduce"};
constexpr std::string_view kCsvFields =
    "collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]";

// Lower case without underscores, so that "collnet_direct", "CollNetDirect" and "collnetdirect" meet.
std::string folded(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '_') continue;
    out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  return out;
}

template <std::size_t N>
std::optional<int> lookUp(const std::array<std::string_view, N>& names, std::string_view text) {
  const std::string key = folded(text);
  for (std::size_t i = 0; i < N; ++i)
    if (folded(names[i]) == key) return static_cast<int>(i);
  return std::nullopt;
}

std::string choices(int count, std::string_view (*name)(int)) {
  std::string out;
  for (int i = 0; i < count; ++i) out += fmt::format("{}{}", i == 0 ? "" : ", ", name(i));
  return out;
}

// Shown in messages: printable ASCII as is, anything else escaped, at most 40 characters.
std::string quoted(std::string_view text) {
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (text.size() > 40) out += "...";
  return out + "'";
}

// Offset of the first byte that does not belong to well-formed UTF-8 (no overlongs, no surrogates,
// nothing above U+10FFFF), or npos.
std::size_t firstInvalidUtf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = bytes[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    unsigned char low = 0x80, high = 0xbf;  // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      length = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      length = 3;
      if (c == 0xe0) low = 0xa0;
      if (c == 0xed) high = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      length = 4;
      if (c == 0xf0) low = 0x90;
      if (c == 0xf4) high = 0x8f;
    } else {
      return i;
    }
    if (i + length > text.size()) return i;
    if (bytes[i + 1] < low || bytes[i + 1] > high) return i;
    for (std::size_t k = 2; k < length; ++k)
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xbf) return i;
    i += length;
  }
  return std::string_view::npos;
}

std::size_t lineOf(std::string_view text, std::size_t offset) {
  return static_cast<std::size_t>(
             std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n')) +
         1;
}

std::string_view trimmed(std::string_view text) {
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  while (!text.empty() && blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && blank(text.back())) text.remove_suffix(1);
  return text;
}

std::string_view withoutByteOrderMark(std::string_view text) {
  if (text.starts_with("\xef\xbb\xbf")) text.remove_prefix(3);
  return text;
}

class CsvLine {
 public:
  CsvLine(std::string_view source, std::size_t line) : source_(source), line_(line) {}

  [[noreturn]] void fail(std::string_view what, std::string_view fix) const {
    throw Error(fmt::format("{}:{}: {} ({})", source_, line_, what, fix));
  }

  std::optional<std::uint64_t> digits(std::string_view field) const {
    if (field.empty() || field.size() > 20) return std::nullopt;
    std::uint64_t value = 0;
    for (char c : field) {
      if (c < '0' || c > '9') return std::nullopt;
      const auto digit = static_cast<std::uint64_t>(c - '0');
      if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
      value = value * 10 + digit;
    }
    return value;
  }

  // -1 (any) or a decimal byte count up to 2^64-1.
  std::optional<std::uint64_t> bytes(std::string_view field, std::string_view name) const {
    if (field == "-1") return std::nullopt;
    const bool all_digits = !field.empty() && std::all_of(field.begin(), field.end(),
                                                          [](char c) { return c >= '0' && c <= '9'; });
    const auto value = digits(field);
    if (!value) {
      if (all_digits)
        fail(fmt::format("{} {} is larger than 18446744073709551615", name, quoted(field)),
             "use -1 for no limit");
      fail(fmt::format("{} {} is not a byte count", name, quoted(field)),
           "write a decimal integer >= 0, or -1 for any");
    }
    return value;
  }

  // -1 (kAny) or an integer in [minimum, 2^31-1].
  int count(std::string_view field, std::string_view name, int minimum,
            std::string_view meaning_of_any) const {
    if (field == "-1") return kAny;
    const auto value = digits(field);
    if (!value || *value > static_cast<std::uint64_t>(INT32_MAX) ||
        *value < static_cast<std::uint64_t>(minimum))
      fail(fmt::format("{} {} is not -1 or an integer from {} to 2147483647", name, quoted(field), minimum),
           fmt::format("-1 means {}", meaning_of_any));
    return static_cast<int>(*value);
  }

 private:
  std::string_view source_;
  std::size_t line_;
};

Rule parseCsvRule(std::string_view text, const CsvLine& line, std::size_t line_number) {
  std::array<std::string_view, 10> fields;
  std::size_t count = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string_view field =
        trimmed(text.substr(start, comma == std::string_view::npos ? comma : comma - start));
    if (count == fields.size())
      line.fail(fmt::format("more than {} fields", fields.size()),
                fmt::format("the format is {}", kCsvFields));
    fields[count++] = field;
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (count < 8)
    line.fail(fmt::format("{} field{}, expected 8 to 10", count, count == 1 ? "" : "s"),
              fmt::format("the format is {}", kCsvFields));
  static constexpr std::array<std::string_view, 10> kNames = {
      "collective", "min_bytes", "max_bytes", "algorithm",  "protocol",
      "channels",   "nNodes",    "nRanks",    "numPipeOps", "regBuff"};
  for (std::size_t i = 0; i < count; ++i)
    if (fields[i].empty())
      line.fail(fmt::format("field {} ({}) is empty", i + 1, kNames[i]), "write -1 for any");

  Rule rule;
  rule.origin = static_cast<int>(line_number);
  const auto collective = lookUp(kCollectives, fields[0]);
  if (!collective)
    line.fail(fmt::format("unknown collective {}", quoted(fields[0])),
              "use " + choices(kCollectiveCount, collectiveName));
  rule.collective = *collective;
  rule.min_bytes = line.bytes(fields[1], "min_bytes").value_or(0);
  rule.max_bytes = line.bytes(fields[2], "max_bytes").value_or(UINT64_MAX);
  if (rule.min_bytes > rule.max_bytes)
    line.fail(fmt::format("min_bytes {} is larger than max_bytes {}", rule.min_bytes, rule.max_bytes),
              "the range is inclusive at both ends; swap them");
  const auto algorithm = parseNcclAlgo(fields[3]);
  if (!algorithm)
    line.fail(fmt::format("unknown algorithm {}", quoted(fields[3])),
              "use " + choices(kNcclAlgoCount, ncclTunerAlgoName));
  rule.algorithm = *algorithm;
  const auto protocol = parseNcclProto(fields[4]);
  if (!protocol)
    line.fail(fmt::format("unknown protocol {}", quoted(fields[4])),
              "use " + choices(kNcclProtoCount, ncclTunerProtoName));
  rule.protocol = *protocol;
  rule.channels = line.count(fields[5], "channels", 1, "NCCL's own channel count");
  rule.nodes = line.count(fields[6], "nNodes", 1, "any node count");
  rule.ranks = line.count(fields[7], "nRanks", 1, "any rank count");
  if (count > 8) rule.pipe_ops = line.count(fields[8], "numPipeOps", 1, "any number of operations");
  if (count > 9) {
    if (fields[9] == "0" || fields[9] == "1") {
      rule.reg_buff = fields[9][0] - '0';
    } else if (fields[9] != "-1") {
      line.fail(fmt::format("regBuff {} is not -1, 0 or 1", quoted(fields[9])),
                "0: unregistered buffers, 1: registered, -1: either");
    }
  }
  return rule;
}

[[noreturn]] void failWhole(std::string_view source, std::string_view what, std::string_view fix) {
  throw Error(fmt::format("{}: {} ({})", source, what, fix));
}

void checkIndexable(const Config& config) {
  RuleIndex::build(config.rules, std::nullopt);
}

}  // namespace

std::string_view collectiveName(int collective) {
  return collective >= 0 && collective < kCollectiveCount ? kCollectives[static_cast<std::size_t>(collective)]
                                                          : std::string_view();
}

Config parseCsvConfig(std::string_view text, std::string_view source) {
  try {
    if (text.size() > kMaxConfigBytes)
      failWhole(source, fmt::format("{} bytes, more than {}", text.size(), kMaxConfigBytes),
                "a tuner file is small");
    if (const std::size_t bad = firstInvalidUtf8(text); bad != std::string_view::npos)
      throw Error(fmt::format("{}:{}: byte 0x{:02x} at offset {} is not UTF-8 (save the file as UTF-8 text)",
                              source, lineOf(text, bad), static_cast<unsigned char>(text[bad]), bad));
    text = withoutByteOrderMark(text);
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
      failWhole(source, "empty file", "write one rule per line: " + std::string(kCsvFields));
    Config config;
    config.format = ConfigFormat::Csv;
    std::size_t line_number = 0;
    std::size_t start = 0;
    while (start < text.size()) {
      ++line_number;
      const std::size_t newline = text.find('\n', start);
      std::string_view line =
          text.substr(start, newline == std::string_view::npos ? newline : newline - start);
      start = newline == std::string_view::npos ? text.size() : newline + 1;
      const CsvLine context(source, line_number);
      if (line.size() > kMaxLineBytes)
        context.fail(fmt::format("line of {} bytes, longer than {}", line.size(), kMaxLineBytes),
                     "one rule per line");
      if (line.ends_with('\r')) line.remove_suffix(1);
      for (char c : line) {
        const auto byte = static_cast<unsigned char>(c);
        if ((byte < 0x20 && c != '\t') || byte == 0x7f)
          context.fail(fmt::format("control character 0x{:02x}", byte), "a tuner file is plain text");
      }
      line = trimmed(line);
      if (line.empty() || line.front() == '#') continue;
      if (config.rules.size() == kMaxRules)
        context.fail(fmt::format("more than {} rules", kMaxRules), "merge rules with byte ranges");
      config.rules.push_back(parseCsvRule(line, context, line_number));
    }
    return config;
  } catch (const std::bad_alloc&) {
    throw Error(fmt::format("{}: out of memory while reading it (use a smaller file)", source));
  }
}

Config parseRecommendationConfig(std::string_view text, std::string_view source) {
  const Recommendation recommendation = parseRecommendation(text, source);
  try {
    Config config;
    config.format = ConfigFormat::Recommendation;
    struct Candidate {
      Rule rule;
      std::size_t number;
      int world_size;  // kAny when the rule has none
      DType dtype;
    };
    std::vector<Candidate> candidates;
    for (std::size_t i = 0; i < recommendation.rules.size(); ++i) {
      const RecommendationRule& in = recommendation.rules[i];
      const std::size_t number = i + 1;
      // sum/nccl.*[/native] as written (the reader has checked the shape); other strategies are the agent's.
      const std::optional<StrategyParts> parts = splitStrategyName(in.strategy);
      const bool nccl_sum = parts && parts->aggregator == "sum" && parts->transport.starts_with("nccl.") &&
                            (!parts->wire || *parts->wire == "native");
      if (!nccl_sum || collectiveOf(in.api) != Collective::AllReduce || backendOf(in.api) != Backend::Nccl) {
        ++config.skipped_rules;
        continue;
      }
      // Read as the agent reads it. An algorithm or protocol it does not know refuses the file rather
      // than skipping the rule: the file meant NCCL to change.
      const std::optional<StrategyName> strategy = parseStrategyName(in.strategy);
      if (!strategy)
        failWhole(
            source,
            fmt::format("rule {}: strategy {} names no NCCL algorithm and protocol", number, in.strategy),
            fmt::format("use sum/nccl.<{}>.<{}>", choices(kNcclAlgoCount, ncclTunerAlgoName),
                        choices(kNcclProtoCount, ncclTunerProtoName)));
      Rule rule;
      rule.collective = 4;  // ncclFuncAllReduce
      rule.min_bytes = static_cast<std::uint64_t>(in.min_bytes);
      rule.max_bytes = static_cast<std::uint64_t>(in.max_bytes);
      rule.algorithm = strategy->algorithm;
      rule.protocol = strategy->protocol;
      rule.ranks = in.world_size ? *in.world_size : kAny;
      rule.origin = static_cast<int>(number);
      candidates.push_back({rule, number, rule.ranks, in.dtype});
    }
    // NCCL's tuner sees bytes, not dtypes: rules that differ only in dtype must agree where they overlap.
    // Sorted by (world size, min_bytes), every rule that overlaps the current one also overlaps the one
    // reaching furthest so far, which agrees with all earlier overlapping ones (induction).
    std::vector<std::size_t> order(candidates.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const Candidate& x = candidates[a];
      const Candidate& y = candidates[b];
      return std::tie(x.world_size, x.rule.min_bytes, x.number) <
             std::tie(y.world_size, y.rule.min_bytes, y.number);
    });
    const Candidate* furthest = nullptr;
    for (std::size_t index : order) {
      const Candidate& current = candidates[index];
      if (furthest && furthest->world_size == current.world_size &&
          current.rule.min_bytes <= furthest->rule.max_bytes &&
          (furthest->rule.algorithm != current.rule.algorithm ||
           furthest->rule.protocol != current.rule.protocol)) {
        const auto [a, b] = std::minmax(furthest->number, current.number);
        failWhole(
            source,
            fmt::format("rules {} and {} ({} and {}) ask NCCL for different algorithms from {} bytes on", a,
                        b, name(furthest->dtype), name(current.dtype), current.rule.min_bytes),
            "NCCL's tuner does not see the dtype; keep one of them, or apply them with the agent");
      }
      if (!furthest || furthest->world_size != current.world_size ||
          current.rule.max_bytes > furthest->rule.max_bytes)
        furthest = &current;
    }
    // A rule for this world size wins over one for any size (Recommendation::match): put those first.
    std::stable_partition(candidates.begin(), candidates.end(),
                          [](const Candidate& c) { return c.world_size != kAny; });
    for (const Candidate& candidate : candidates) config.rules.push_back(candidate.rule);
    return config;
  } catch (const std::bad_alloc&) {
    throw Error(fmt::format("{}: out of memory while reading it (use a smaller file)", source));
  }
}

Config parseConfig(std::string_view text, std::string_view source) {
  const std::string_view body = withoutByteOrderMark(text);
  const std::size_t first = body.find_first_not_of(" \t\r\n");
  Config config = first != std::string_view::npos && body[first] == '{'
                      ? parseRecommendationConfig(body, source)
                      : parseCsvConfig(text, source);
  try {
    checkIndexable(config);
  } catch (const Error& error) {
    throw Error(fmt::format("{}: {}", source, error.what()));
  }
  return config;
}

Config loadConfig(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    throw Error(fmt::format("{}: cannot open: {} (check GRADSCOPE_TUNER_CONFIG / NCCL_TUNER_CONFIG_FILE)",
                            path, errnoMessage(error)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    throw Error(fmt::format("{}: cannot stat: {}", path, errnoMessage(error)));
  }
  if (!S_ISREG(info.st_mode))
    throw Error(fmt::format("{}: not a regular file (name a tuner CSV or a recommendation JSON file)", path));
  if (info.st_size > static_cast<off_t>(kMaxConfigBytes))
    throw Error(fmt::format("{}: {} bytes, more than {} (a tuner file is small)", path, info.st_size,
                            kMaxConfigBytes));
  std::string text;
  try {
    text.resize(static_cast<std::size_t>(info.st_size));
  } catch (const std::bad_alloc&) {
    throw Error(fmt::format("{}: out of memory while reading it", path));
  }
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t got = ::read(fd, text.data() + done, text.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      throw Error(fmt::format("{}: cannot read: {}", path, errnoMessage(error)));
    }
    if (got == 0) break;  // shrank while we read: parse what is there
    done += static_cast<std::size_t>(got);
  }
  text.resize(done);
  return parseConfig(text, path);
}

std::optional<ConfigSource> configSourceFromEnvironment() {
  for (const char* variable : {gradscope::env::kTunerConfig, "NCCL_TUNER_CONFIG_FILE"}) {
    // secure_getenv: a setuid/setgid process does not read a file the invoking user's environment names.
    const char* value = ::secure_getenv(variable);
    if (value && *value) return ConfigSource{value, variable};
  }
  return std::nullopt;
}

RuleIndex RuleIndex::build(std::span<const Rule> rules, std::optional<Topology> topology) {
  RuleIndex index;
  std::size_t work = 0;
  const auto matches = [](int wanted, std::uint64_t actual) {
    return wanted == kAny || static_cast<std::uint64_t>(wanted) == actual;
  };
  // `a` makes `b` unreachable where both cover a byte: every field of a is a wildcard or equal.
  const auto covers = [](std::int32_t a, std::int32_t b) { return a == kAny || a == b; };
  std::vector<std::vector<Entry>> lists;
  for (int collective = 0; collective < kCollectiveCount; ++collective) {
    std::vector<std::uint32_t> selected;
    for (std::size_t i = 0; i < rules.size(); ++i) {
      const Rule& rule = rules[i];
      if (rule.collective != collective) continue;
      if (topology && (!matches(rule.nodes, topology->nodes) || !matches(rule.ranks, topology->ranks)))
        continue;
      selected.push_back(static_cast<std::uint32_t>(i));
    }
    PerCollective& per = index.collectives_[collective];
    if (selected.empty()) continue;
    per.starts.push_back(0);
    for (std::uint32_t i : selected) {
      per.starts.push_back(rules[i].min_bytes);
      if (rules[i].max_bytes != UINT64_MAX) per.starts.push_back(rules[i].max_bytes + 1);
    }
    std::sort(per.starts.begin(), per.starts.end());
    per.starts.erase(std::unique(per.starts.begin(), per.starts.end()), per.starts.end());
    const std::size_t segments = per.starts.size();
    lists.assign(segments, {});
    std::size_t listed = 0;  // entries in `lists`
    // next_open[s]: the first segment >= s whose list does not end in an always-matching rule
    // (path-halving union-find), so wildcard rules cost nothing in segments already decided.
    std::vector<std::uint32_t> next_open(segments + 1);
    std::iota(next_open.begin(), next_open.end(), std::uint32_t{0});
    const auto open = [&](std::uint32_t s) {
      while (next_open[s] != s) {
        next_open[s] = next_open[next_open[s]];
        s = next_open[s];
      }
      return s;
    };
    for (std::uint32_t i : selected) {
      const Rule& rule = rules[i];
      Entry entry{};
      entry.pipe_ops = rule.pipe_ops;
      entry.nodes = topology ? kAny : rule.nodes;
      entry.ranks = topology ? kAny : rule.ranks;
      entry.reg_buff = static_cast<std::int8_t>(rule.reg_buff);
      entry.algorithm = static_cast<std::int8_t>(rule.algorithm);
      entry.protocol = static_cast<std::int8_t>(rule.protocol);
      entry.channels = rule.channels;
      entry.rule = i;
      const bool always =
          entry.pipe_ops == kAny && entry.nodes == kAny && entry.ranks == kAny && entry.reg_buff == kAny;
      const auto first = static_cast<std::uint32_t>(
          std::upper_bound(per.starts.begin(), per.starts.end(), rule.min_bytes) - per.starts.begin() - 1);
      const auto end = static_cast<std::uint32_t>(
          rule.max_bytes == UINT64_MAX
              ? segments
              : static_cast<std::size_t>(
                    std::upper_bound(per.starts.begin(), per.starts.end(), rule.max_bytes) -
                    per.starts.begin()));
      for (std::uint32_t s = open(first); s < end; s = open(s + 1)) {
        std::vector<Entry>& list = lists[s];
        work += 1 + list.size();
        if (work > kMaxIndexWork)
          throw Error(fmt::format("too many overlapping rules to index (more than {} steps; merge rules)",
                                  kMaxIndexWork));
        const bool shadowed = std::any_of(list.begin(), list.end(), [&](const Entry& earlier) {
          return covers(earlier.pipe_ops, entry.pipe_ops) && covers(earlier.nodes, entry.nodes) &&
                 covers(earlier.ranks, entry.ranks) && covers(earlier.reg_buff, entry.reg_buff);
        });
        if (shadowed) continue;
        list.push_back(entry);
        if (index.entries_.size() + ++listed > kMaxIndexEntries)
          throw Error(fmt::format("too many overlapping rules to index (more than {} entries; merge rules)",
                                  kMaxIndexEntries));
        if (always) next_open[s] = s + 1;
      }
    }
    per.offsets.reserve(segments + 1);
    for (const auto& list : lists) {
      per.offsets.push_back(static_cast<std::uint32_t>(index.entries_.size()));
      index.entries_.insert(index.entries_.end(), list.begin(), list.end());
    }
    per.offsets.push_back(static_cast<std::uint32_t>(index.entries_.size()));
    index.rule_count_ += selected.size();
  }
  return index;
}

const RuleIndex::Entry* RuleIndex::find(int collective, std::uint64_t bytes, int pipe_ops,
                                        int reg_buff) const noexcept {
  const PerCollective& per = collectives_[collective];
  if (per.starts.empty()) return nullptr;
  // starts[0] == 0, so the segment always exists.
  const auto segment = static_cast<std::size_t>(
      std::upper_bound(per.starts.begin(), per.starts.end(), bytes) - per.starts.begin() - 1);
  const Entry* entry = entries_.data() + per.offsets[segment];
  const Entry* const end = entries_.data() + per.offsets[segment + 1];
  for (; entry != end; ++entry) {
    if ((entry->pipe_ops == kAny || entry->pipe_ops == pipe_ops) &&
        (entry->reg_buff == kAny || entry->reg_buff == reg_buff))
      return entry;
  }
  return nullptr;
}

}  // namespace gradscope::nccl_tuner
