// libFuzzer target for the tuner configuration parser (config.h): any bytes give a Config or a
// gradscope::Error, never a crash or another exception; and for an accepted file, RuleIndex::find agrees
// with a plain first-match scan of the rules at every rule boundary. Run: scripts/fuzz.sh 60
// nccl_tuner_config (docs/reliability.md).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "config.h"
#include "gradscope/common/error.h"

namespace {

using namespace gradscope::nccl_tuner;

// The meaning of first-match-wins, written the slow way.
long firstMatch(const Config& config, int collective, std::uint64_t bytes, Topology topology, int pipe_ops,
                int reg_buff) {
  const auto any_or = [](int wanted, std::uint64_t actual) {
    return wanted == kAny || static_cast<std::uint64_t>(wanted) == actual;
  };
  for (std::size_t i = 0; i < config.rules.size(); ++i) {
    const Rule& rule = config.rules[i];
    if (rule.collective == collective && rule.min_bytes <= bytes && bytes <= rule.max_bytes &&
        any_or(rule.nodes, topology.nodes) && any_or(rule.ranks, topology.ranks) &&
        any_or(rule.pipe_ops, static_cast<std::uint64_t>(pipe_ops)) &&
        (rule.reg_buff == kAny || rule.reg_buff == reg_buff))
      return static_cast<long>(i);
  }
  return -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const Config config = parseConfig(text, "fuzz");
    std::vector<std::uint64_t> probes = {0, 1, 4096, UINT64_MAX};
    for (const Rule& rule : config.rules) {
      probes.push_back(rule.min_bytes);
      probes.push_back(rule.max_bytes);
      if (rule.min_bytes > 0) probes.push_back(rule.min_bytes - 1);
      if (rule.max_bytes < UINT64_MAX) probes.push_back(rule.max_bytes + 1);
    }
    for (const Topology topology : {Topology{1, 8}, Topology{2, 16}}) {
      const RuleIndex index = RuleIndex::build(config.rules, topology);
      for (int collective = 0; collective < kCollectiveCount; ++collective)
        for (std::uint64_t bytes : probes)
          for (int pipe_ops : {1, 2})
            for (int reg_buff : {0, 1}) {
              const RuleIndex::Entry* entry = index.find(collective, bytes, pipe_ops, reg_buff);
              const long expected = firstMatch(config, collective, bytes, topology, pipe_ops, reg_buff);
              if ((entry == nullptr ? -1 : static_cast<long>(entry->rule)) != expected) std::abort();
            }
    }
  } catch (const gradscope::Error&) {
    // Refused: the expected outcome for most inputs.
  }
  return 0;
}
