// The time the profiler plugin adds per NCCL event: a collective's startEvent and stopEvent and two
// children (KernelCh events, as NCCL's proxy thread sends them) started and stopped, through the table
// NCCL uses (dlopen + dlsym of ncclProfiler_v5).
//
// Two builds of this file:
// - gradscope_nccl_profiler_bench: standalone mode (no agent): slots, completion, the record queue, and the
//   plugin's writer thread draining it into its own trace.
// - gradscope_nccl_profiler_agent_bench (GRADSCOPE_BENCH_AGENT): the agent's hook is present (this
//   executable exports gradscope_agent_nccl_profile_v1 over the agent's own code, recording): the plugin
//   maps the descriptor's names and calls the hook, which matches the call in flight on this thread and
//   writes its record into the thread's ring. The children cost nothing there (not requested).
// Reported per iteration (one collective, five events: Coll start+stop, 2 × child start+stop) and per
// event (counter "ns_per_event"). The output goes to a temporary folder removed at the end.

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <benchmark/benchmark.h>

#include "nccl_abi/profiler.h"

#ifdef GRADSCOPE_BENCH_AGENT
#include "core/nccl_profile.h"
#include "core/recorder.h"
#include "gradscope/common/nccl_profile_link.h"

extern "C" __attribute__((visibility("default"))) int gradscope_agent_nccl_profile_v1(
    const gradscope::NcclProfileRecordV1* record) {
  return gradscope::agent::ncclProfileReceived(record);
}
#endif

namespace {

using namespace gradscope::nccl_abi;

ncclProfiler_v5_t* g_plugin = nullptr;

void collWithChildren(benchmark::State& state) {
  void* context = nullptr;
  int mask = 0;
  if (g_plugin->init(&context, 0x1234, &mask, "bench", 1, 1, 0, nullptr) != ncclSuccess) {
    state.SkipWithError("init failed");
    return;
  }
#ifdef GRADSCOPE_BENCH_AGENT
  using namespace gradscope::agent;
  static const int comm_handle = 0;
  CommSlot* comm = comms().find(&comm_handle);
  if (comm == nullptr) comm = comms().add(&comm_handle, {gradscope::Backend::Nccl, "bench", 1, 0});
  gradscope::agent::CallEvent call;
  call.header.api = gradscope::Api::NcclAllReduce;
  call.header.dtype = gradscope::DType::Fp32;
  call.call.count = 1 << 20;
  call.header.comm = comm->index;
#endif
  ncclProfilerEventDescr_v5_t coll{};
  coll.type = ncclProfileColl;
  coll.coll.func = "AllReduce";
  coll.coll.datatype = "ncclFloat32";
  coll.coll.count = 1 << 20;
  coll.coll.algo = "RING";
  coll.coll.proto = "SIMPLE";
  coll.coll.nChannels = 2;
  ncclProfilerEventDescr_v5_t child{};
  child.type = ncclProfileKernelCh;
  std::uint64_t seq = 0;
  for (auto _ : state) {
    coll.coll.seqNumber = seq++;
    void* handle = nullptr;
#ifdef GRADSCOPE_BENCH_AGENT
    t_nccl_in_flight.setSingle(&call);
#endif
    g_plugin->startEvent(context, &handle, &coll);
#ifdef GRADSCOPE_BENCH_AGENT
    t_nccl_in_flight.clear();
#endif
    g_plugin->stopEvent(handle);
    child.parentObj = handle;
    for (int channel = 0; channel < 2; ++channel) {
      void* child_handle = nullptr;
      child.kernelCh.channelId = static_cast<std::uint8_t>(channel);
      g_plugin->startEvent(context, &child_handle, &child);
      g_plugin->stopEvent(child_handle);
    }
    benchmark::DoNotOptimize(handle);
  }
  g_plugin->finalize(context);
  state.SetItemsProcessed(state.iterations() * 5);
  state.counters["ns_per_event"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 5, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(collWithChildren)->Repetitions(5)->ReportAggregatesOnly(false)->DisplayAggregatesOnly(true);

}  // namespace

int main(int argc, char** argv) {
  // The traces go to a private folder; the agent reads its configuration when it loads, so the
  // variable is set before this process starts again.
  if (std::getenv("GRADSCOPE_OUTPUT") == nullptr) {
    char folder[] = "/tmp/gradscope-profiler-bench-XXXXXX";
    if (mkdtemp(folder) == nullptr) return 2;
    setenv("GRADSCOPE_OUTPUT", (std::string(folder) + "/trace-%p.db").c_str(), 1);
    setenv("GRADSCOPE_BENCH_FOLDER", folder, 1);
    execv("/proc/self/exe", argv);
    return 2;
  }
#ifdef GRADSCOPE_BENCH_AGENT
  gradscope::agent::Activation activation;
  activation.backend = gradscope::Backend::Nccl;
  if (!gradscope::agent::activate(activation)) {
    std::fprintf(stderr, "the agent's recorder did not start\n");
    return 2;
  }
#endif
  void* library = dlopen(GRADSCOPE_NCCL_PROFILER_PATH, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  g_plugin = static_cast<ncclProfiler_v5_t*>(dlsym(library, "ncclProfiler_v5"));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
#ifdef GRADSCOPE_BENCH_AGENT
  gradscope::agent::finish();
#endif
  if (const char* folder = std::getenv("GRADSCOPE_BENCH_FOLDER")) {
    std::error_code ec;
    std::filesystem::remove_all(folder, ec);
  }
  return 0;
}
