// getCollInfo's cost through the dlopened plugin, the way NCCL calls it: a fresh 7x3 cost table per call
// (copied from a template, as NCCL fills one), then getCollInfo. BM_TableCopy times the copy alone so
// that the plugin's share is the difference. Sizes cycle through 16 values from 1 KiB to 1 GiB so that
// the branch predictor cannot learn one path.

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <benchmark/benchmark.h>

#include "nccl_abi/tuner.h"

namespace {

using namespace gradscope::nccl_abi;

constexpr int kAlgos = NCCL_NUM_ALGORITHMS_V5;
constexpr int kProtos = NCCL_NUM_PROTOCOLS_V5;
using Table = std::array<std::array<float, kProtos>, kAlgos>;

const Table kTemplate = {{{12.5f, 9.0f, 30.0f},
                          {15.0f, 11.0f, 20.0f},
                          {-1.0f, -1.0f, -1.0f},
                          {-1.0f, -1.0f, -1.0f},
                          {-1.0f, -1.0f, -1.0f},
                          {-1.0f, -1.0f, -1.0f},
                          {40.0f, -1.0f, 35.0f}}};

const ncclTuner_v5_t* plugin() {
  static const ncclTuner_v5_t* symbol = [] {
    void* handle = dlopen(GRADSCOPE_TUNER_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      std::fprintf(stderr, "dlopen: %s\n", dlerror());
      std::exit(2);
    }
    return static_cast<const ncclTuner_v5_t*>(dlsym(handle, "ncclTunerPlugin_v5"));
  }();
  return symbol;
}

std::string writeConfig(const std::string& name, const std::string& text) {
  const std::string path =
      std::string(P_tmpdir) + "/gradscope-tuner-bench-" + std::to_string(getpid()) + "-" + name;
  FILE* file = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), file);
  std::fclose(file);
  return path;
}

// `rules` all-reduce rules over disjoint byte ranges that together cover every size; node, rank and
// group fields are wildcards.
std::string rulesText(int rules) {
  std::string text = "# benchmark rules\n";
  const std::uint64_t span = (std::uint64_t{1} << 31) / static_cast<std::uint64_t>(rules);
  for (int i = 0; i < rules; ++i) {
    const std::uint64_t low = span * static_cast<std::uint64_t>(i);
    const std::uint64_t high = i + 1 == rules ? UINT64_MAX : low + span - 1;
    text += "allreduce," + std::to_string(low) + "," +
            (high == UINT64_MAX ? std::string("-1") : std::to_string(high)) +
            (i % 2 == 0 ? ",ring,ll128" : ",tree,ll") + ",-1,-1,-1\n";
  }
  return text;
}

void setup(const char* config_path, bool explore) {
  unsetenv("NCCL_TUNER_CONFIG_FILE");
  if (config_path != nullptr) {
    setenv("GRADSCOPE_TUNER_CONFIG", config_path, 1);
  } else {
    unsetenv("GRADSCOPE_TUNER_CONFIG");
  }
  if (explore) {
    setenv("GRADSCOPE_TUNER_EXPLORE", "1", 1);
  } else {
    unsetenv("GRADSCOPE_TUNER_EXPLORE");
  }
}

constexpr std::array<std::size_t, 16> kSizes = {1024,    4096,     16384,    65536,     262144,  1 << 20,
                                                4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, 3000,
                                                70000,   900000,   12000000, 500000000};

void run(benchmark::State& state, const char* config_path, bool explore) {
  setup(config_path, explore);
  const ncclTuner_v5_t* tuner = plugin();
  void* ctx = nullptr;
  tuner->init(&ctx, 42, 8, 1, nullptr, nullptr, nullptr);
  Table table;
  std::size_t i = 0;
  for (auto _ : state) {
    table = kTemplate;
    int channels = 0;
    tuner->getCollInfo(ctx, ncclFuncAllReduce, kSizes[i++ % kSizes.size()], 1,
                       reinterpret_cast<float**>(table.data()), kAlgos, kProtos, 0, &channels);
    benchmark::DoNotOptimize(table);
    benchmark::DoNotOptimize(channels);
  }
  tuner->finalize(ctx);
}

void BM_TableCopy(benchmark::State& state) {
  Table table;
  std::size_t i = 0;
  for (auto _ : state) {
    table = kTemplate;
    benchmark::DoNotOptimize(kSizes[i++ % kSizes.size()]);
    benchmark::DoNotOptimize(table);
  }
}
BENCHMARK(BM_TableCopy);

void BM_GetCollInfo_NoConfig(benchmark::State& state) {
  run(state, nullptr, false);
}
BENCHMARK(BM_GetCollInfo_NoConfig);

void BM_GetCollInfo_Rules(benchmark::State& state) {
  const int rules = static_cast<int>(state.range(0));
  const std::string path = writeConfig(std::to_string(rules) + ".csv", rulesText(rules));
  run(state, path.c_str(), false);
  std::remove(path.c_str());
}
BENCHMARK(BM_GetCollInfo_Rules)->Arg(1)->Arg(64)->Arg(1000);

void BM_GetCollInfo_Explore(benchmark::State& state) {
  run(state, nullptr, true);
}
BENCHMARK(BM_GetCollInfo_Explore);

}  // namespace

BENCHMARK_MAIN();
