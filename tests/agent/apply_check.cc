// apply-check: a small MPI job for the apply-mode tests (check_shadow.py), in two runs.
//
//   apply-check --expect FILE --rule API:MIN:MAX:STRATEGY ...   without the agent
//   apply-check --check FILE --rule API:MIN:MAX:STRATEGY ...    under the agent in apply mode
//
// Both runs make the same calls: each round (a step of 30 collectives) reduces, for every size in
// kCounts, pseudo-random fp32 data (different on every rank and round), in place and out of place, with
// MPI_Allreduce and with MPI_Iallreduce + MPI_Wait, then an fp64 buffer that no rule covers. The rules
// repeat the recommendation file's (the test writes both). An async rule's calls return an earlier
// round's sum (docs/async.md): each call is a call site, each round a step (GRADSCOPE_STEP_CALLS=30).
// --expect writes, per rank (FILE.<rank>), the bits every call must return: the recommended strategy's
//   result where a rule covers the call (comm/ run by this job itself, AdaCons with momentum per
//   buffer size as apply mode keeps it), the library's own sum elsewhere. Without the agent, so that
//   the strategies' own MPI calls are not replaced in turn.
// --check makes the calls the job's way and compares every result bit for bit; an uncovered call is
//   also compared with PMPI_Allreduce (the job's own result, bypassing the agent) right there.
// Prints "apply-check: N calls checked, M replaced, W wrong" on rank 0; exits 0 when nothing is wrong.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "gradscope/comm/mpi.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/types.h"

namespace {

using gradscope::Api;
using gradscope::DType;

struct Rule {
  Api api = Api::Unknown;
  std::int64_t min_bytes = 0, max_bytes = 0;
  std::string strategy;
};

constexpr int kCounts[] = {1, 7, 100, 1000, 4099, 65536};

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float value(int rank, int round, int count, std::size_t i) {
  const std::uint64_t key =
      splitmix((std::uint64_t(rank) << 48) ^ (std::uint64_t(round) << 32) ^ (std::uint64_t(count) << 20) ^ i);
  return static_cast<float>(static_cast<double>(key >> 40) * 0x1p-24 - 0.5) *
         (1.0f + static_cast<float>(rank));
}

const Rule* ruleFor(const std::vector<Rule>& rules, Api api, std::int64_t bytes) {
  for (const Rule& rule : rules)
    if (rule.api == api && rule.min_bytes <= bytes && bytes <= rule.max_bytes) return &rule;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  std::vector<Rule> rules;
  int rounds = 2;
  std::string expect_file, check_file;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (arg == "--expect" && i + 1 < argc) {
      expect_file = std::string(argv[++i]) + "." + std::to_string(rank);
    } else if (arg == "--check" && i + 1 < argc) {
      check_file = std::string(argv[++i]) + "." + std::to_string(rank);
    } else if (arg == "--rule" && i + 1 < argc) {
      const std::string text = argv[++i];
      Rule rule;
      const auto a = text.find(':'), b = text.find(':', a + 1), c = text.find(':', b + 1);
      if (c == std::string::npos) {
        std::fprintf(stderr, "apply-check: bad --rule %s (API:MIN:MAX:STRATEGY)\n", text.c_str());
        return 2;
      }
      const auto api = gradscope::parseApi(text.substr(0, a));
      rule.api = api ? *api : Api::Unknown;
      rule.min_bytes = std::stoll(text.substr(a + 1, b - a - 1));
      rule.max_bytes = std::stoll(text.substr(b + 1, c - b - 1));
      rule.strategy = text.substr(c + 1);
      rules.push_back(rule);
    } else {
      std::fprintf(stderr, "apply-check: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }

  if (expect_file.empty() == check_file.empty()) {
    std::fprintf(stderr, "apply-check: give one of --expect FILE and --check FILE\n");
    return 2;
  }
  const bool writing = !expect_file.empty();
  std::vector<std::vector<char>> expectations;
  if (!writing) {
    std::ifstream in(check_file, std::ios::binary);
    std::uint64_t bytes = 0;
    while (in.read(reinterpret_cast<char*>(&bytes), sizeof bytes)) {
      std::vector<char> data(bytes);
      in.read(data.data(), static_cast<std::streamsize>(bytes));
      expectations.push_back(std::move(data));
    }
  }
  std::ofstream out_file;
  if (writing) out_file.open(expect_file, std::ios::binary | std::ios::trunc);
  std::size_t next_expectation = 0;
  // Writing: remembers `data` as call N's result; checking: compares with it.
  const auto expectation = [&](const void* data, std::size_t bytes) {
    if (writing) {
      const std::uint64_t n = bytes;
      out_file.write(reinterpret_cast<const char*>(&n), sizeof n);
      out_file.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
      return true;
    }
    if (next_expectation >= expectations.size()) return false;
    const std::vector<char>& expected = expectations[next_expectation++];
    return expected.size() == bytes && std::memcmp(expected.data(), data, bytes) == 0;
  };

  // The expected results: the strategies on the job's own duplicate of the world. AdaCons keeps
  // momentum per buffer size, as apply mode does.
  std::unique_ptr<gradscope::comm::Communicator> world;
  if (writing) world = gradscope::comm::mpiWorld();
  std::map<std::pair<std::string, int>, std::unique_ptr<gradscope::comm::Strategy>> strategies;
  // The async strategies return an earlier round's sum (every call site of a round is a step of its own
  // site, and each round is a step: GRADSCOPE_STEP_CALLS): the library's own nonblocking sums of the
  // rounds' inputs.
  std::map<std::pair<int, int>, std::vector<float>> round_sums;  // (round, count) -> sum
  const auto inputOf = [&](int of_round, int count) {
    std::vector<float> values(static_cast<std::size_t>(count));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = value(rank, of_round, count, i);
    return values;
  };
  const auto sumOf = [&](int of_round, int count) -> const std::vector<float>& {
    auto& sum = round_sums[{of_round, count}];
    if (sum.empty()) {
      const std::vector<float> values = inputOf(of_round, count);
      sum.resize(values.size());
      // The worker's sums are the library's nonblocking all-reduce, whose order of addition may differ
      // from the blocking one's (Open MPI: libnbc against coll/tuned, at 3 ranks).
      MPI_Request request = MPI_REQUEST_NULL;
      PMPI_Iallreduce(values.data(), sum.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
      PMPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    return sum;
  };
  const auto asyncExpected = [&](const gradscope::StrategyName& name, int round, int count) {
    const int k = name.staleness;
    if (round < k) return sumOf(round, count);
    std::vector<float> out = sumOf(round - k, count);
    if (name.delay == gradscope::StrategyName::Delay::Dga) {
      const std::vector<float> now = inputOf(round, count), then = inputOf(round - k, count);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = static_cast<float>(static_cast<double>(out[i]) +
                                    size * (static_cast<double>(now[i]) - static_cast<double>(then[i])));
    }
    return out;
  };
  const auto expected = [&](const Rule& rule, const std::vector<float>& input, int count, bool in_place,
                            int round) {
    const auto name = gradscope::parseStrategyName(rule.strategy);
    if (name && name->aggregator == gradscope::Aggregator::Async) return asyncExpected(*name, round, count);
    const bool adacons = rule.strategy.starts_with("adacons/");
    auto& strategy = strategies[{rule.strategy, adacons ? count : 0}];
    if (!strategy)
      strategy =
          gradscope::comm::makeStrategy(*gradscope::parseStrategyName(rule.strategy), *world, DType::Fp32);
    std::vector<float> out(input.size());
    if (in_place) {
      out = input;
      strategy->run(out.data(), out.data(), static_cast<std::size_t>(count));
    } else {
      strategy->run(input.data(), out.data(), static_cast<std::size_t>(count));
    }
    return out;
  };

  long checked = 0, replaced = 0, wrong = 0;
  for (int round = 0; round < rounds; ++round) {
    for (const int count : kCounts) {
      std::vector<float> input(static_cast<std::size_t>(count));
      for (std::size_t i = 0; i < input.size(); ++i) input[i] = value(rank, round, count, i);
      const std::int64_t bytes = std::int64_t{count} * 4;
      for (const Api api : {Api::MpiAllreduce, Api::MpiIallreduce}) {
        for (const bool in_place : {false, true}) {
          const Rule* rule = ruleFor(rules, api, bytes);
          if (rule != nullptr) ++replaced;
          ++checked;
          if (writing) {
            std::vector<float> reference(input.size());
            if (rule != nullptr) reference = expected(*rule, input, count, in_place, round);
            else PMPI_Allreduce(input.data(), reference.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            expectation(reference.data(), reference.size() * sizeof(float));
            continue;
          }
          std::vector<float> own;  // the library's own sum, for an uncovered call
          if (rule == nullptr) {
            own.resize(input.size());
            PMPI_Allreduce(input.data(), own.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          }
          std::vector<float> result = in_place ? input : std::vector<float>(input.size());
          const void* send = in_place ? MPI_IN_PLACE : input.data();
          if (api == Api::MpiAllreduce) {
            MPI_Allreduce(send, result.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          } else {
            MPI_Request request = MPI_REQUEST_NULL;
            MPI_Iallreduce(send, result.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
            MPI_Status status;
            MPI_Wait(&request, &status);
            if (request != MPI_REQUEST_NULL) {
              std::fprintf(stderr, "apply-check: rank %d: MPI_Wait left the request set\n", rank);
              ++wrong;
            }
          }
          const bool matches = expectation(result.data(), result.size() * sizeof(float)) &&
                               (own.empty() || std::memcmp(own.data(), result.data(), own.size() * 4) == 0);
          if (!matches) {
            std::fprintf(stderr, "apply-check: rank %d: %s count %d %s round %d (%s): result differs\n", rank,
                         std::string(gradscope::name(api)).c_str(), count,
                         in_place ? "in place" : "out of place", round,
                         rule != nullptr ? rule->strategy.c_str() : "untouched");
            ++wrong;
          }
        }
      }
      // fp64: never covered (the rules are fp32): the job's own result, bit for bit.
      std::vector<double> wide(input.begin(), input.end()), wide_reference(wide.size()),
          wide_result(wide.size());
      PMPI_Allreduce(wide.data(), wide_reference.data(), count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      ++checked;
      if (writing) {
        expectation(wide_reference.data(), wide_reference.size() * sizeof(double));
        continue;
      }
      MPI_Allreduce(wide.data(), wide_result.data(), count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      if (!expectation(wide_result.data(), wide_result.size() * sizeof(double)) ||
          std::memcmp(wide_result.data(), wide_reference.data(), wide.size() * sizeof(double)) != 0) {
        std::fprintf(stderr, "apply-check: rank %d: fp64 count %d differs from PMPI_Allreduce\n", rank,
                     count);
        ++wrong;
      }
    }
  }
  long total_wrong = 0;
  PMPI_Allreduce(&wrong, &total_wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("apply-check: %s: %ld calls, %ld covered by a rule, %ld wrong\n",
                writing ? "expected" : "checked", checked, replaced, total_wrong);
  world.reset();
  MPI_Finalize();
  return total_wrong == 0 ? 0 : 1;
}
