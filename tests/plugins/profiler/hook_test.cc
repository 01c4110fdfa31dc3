// The plugin in agent mode: this executable exports gradscope_agent_nccl_profile_v1 (nccl_profile_link.h),
// as libgradscope-agent.so does, so the plugin asks NCCL for collectives only and hands each one to it on
// the launching thread, keeping nothing and writing no file. The stand-in records what it was given and
// answers "recording" or "not recording" as told; and, while told it interposes no NCCL (a job whose NCCL
// is linked in statically), answers so, and the plugin records the communicator itself.

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/common/nccl_profile_link.h"
#include "gradscope/common/types.h"
#include "nccl_abi/profiler.h"

namespace {

std::atomic<bool> g_recording{true};
std::atomic<bool> g_interposed{true};
std::atomic<int> g_calls{0};
thread_local gradscope::NcclProfileRecordV1 t_last;

}  // namespace

extern "C" __attribute__((visibility("default"))) int gradscope_agent_nccl_profile_v1(
    const gradscope::NcclProfileRecordV1* record) {
  if (!g_interposed.load()) return gradscope::kNcclProfileNotInterposed;
  if (record == nullptr) return gradscope::kNcclProfileNotRecording;  // the plugin's probe
  if (!g_recording.load()) return gradscope::kNcclProfileNotRecording;
  g_calls.fetch_add(1);
  t_last = *record;
  return gradscope::kNcclProfileMatched;
}

namespace {

using namespace gradscope::nccl_abi;

ncclProfiler_v5_t* table() {
  static void* library = dlopen(GRADSCOPE_NCCL_PROFILER_PATH, RTLD_NOW | RTLD_LOCAL);
  return library == nullptr ? nullptr : static_cast<ncclProfiler_v5_t*>(dlsym(library, "ncclProfiler_v5"));
}

TEST(ProfilerAgentMode, HandsEveryCollectiveToTheAgentOnTheLaunchingThread) {
  ASSERT_NE(table(), nullptr);
  const std::string folder =
      std::filesystem::temp_directory_path() / ("gradscope-hook-" + std::to_string(getpid()));
  std::filesystem::create_directories(folder);
  setenv("GRADSCOPE_OUTPUT", (folder + "/x.db").c_str(), 1);
  void* context = nullptr;
  int mask = 0;
  ASSERT_EQ(table()->init(&context, 0xfeed, &mask, "c", 1, 8, 3, nullptr), ncclSuccess);
  EXPECT_EQ(mask, ncclProfileColl);  // no children: the agent times the calls itself
  ncclProfilerEventDescr_v5_t d{};
  d.type = ncclProfileColl;
  d.coll.seqNumber = 41;
  d.coll.func = "AllGather";
  d.coll.count = 123;
  d.coll.datatype = "Unknown";  // NCCL 2.28's name for ncclUint8
  d.coll.nChannels = 12;
  d.coll.algo = "NVLS_TREE";
  d.coll.proto = "SIMPLE";
  void* handle = reinterpret_cast<void*>(0x1);
  ASSERT_EQ(table()->startEvent(context, &handle, &d), ncclSuccess);
  EXPECT_EQ(handle, nullptr);
  EXPECT_EQ(g_calls.load(), 1);
  EXPECT_EQ(t_last.size, sizeof(gradscope::NcclProfileRecordV1));
  EXPECT_EQ(t_last.comm_hash, 0xfeedu);
  EXPECT_EQ(t_last.seq_number, 41u);
  EXPECT_EQ(t_last.count, 123u);
  EXPECT_EQ(t_last.api, static_cast<std::uint8_t>(gradscope::Api::NcclAllGather));
  EXPECT_EQ(t_last.dtype, static_cast<std::uint8_t>(gradscope::DType::Other));
  EXPECT_EQ(t_last.algo, 5);
  EXPECT_EQ(t_last.proto, 2);
  EXPECT_EQ(t_last.channels, 12);
  EXPECT_EQ(t_last.nranks, 8);
  EXPECT_EQ(t_last.rank, 3);
  // From other threads at once; children and stops of null handles are no-ops.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        ncclProfilerEventDescr_v5_t mine = d;
        void* h = nullptr;
        table()->startEvent(context, &h, &mine);
        table()->stopEvent(h);
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(g_calls.load(), 4001);
  // The agent stops recording: the plugin does nothing more.
  g_recording.store(false);
  table()->startEvent(context, &handle, &d);
  EXPECT_EQ(g_calls.load(), 4001);
  ASSERT_EQ(table()->finalize(context), ncclSuccess);
  EXPECT_TRUE(std::filesystem::is_empty(folder));  // no file of its own
  std::filesystem::remove_all(folder);
}

// The agent is loaded but has seen no NCCL call: the NCCL reporting is one it does not interpose (linked
// into the job statically). The plugin records that communicator's collectives in a file of its own, with
// the kernel channels' children, and hands the agent nothing.
TEST(ProfilerAgentMode, ACommunicatorTheAgentDoesNotInterposeIsRecordedByThePlugin) {
  ASSERT_NE(table(), nullptr);
  g_interposed.store(false);
  const std::string folder =
      std::filesystem::temp_directory_path() / ("gradscope-hook-static-" + std::to_string(getpid()));
  std::filesystem::create_directories(folder);
  setenv("GRADSCOPE_OUTPUT", (folder + "/static-%p.db").c_str(), 1);
  void* context = nullptr;
  int mask = 0;
  ASSERT_EQ(table()->init(&context, 0xbeef, &mask, "c", 1, 2, 1, nullptr), ncclSuccess);
  EXPECT_EQ(mask, ncclProfileColl | ncclProfileProxyOp | ncclProfileKernelCh);
  ncclProfilerEventDescr_v5_t d{};
  d.type = ncclProfileColl;
  d.coll.seqNumber = 0;
  d.coll.func = "AllReduce";
  d.coll.count = 64;
  d.coll.datatype = "ncclFloat32";
  d.coll.nChannels = 0;  // no kernel channels to wait for: complete at its stop
  d.coll.algo = "RING";
  d.coll.proto = "SIMPLE";
  void* handle = nullptr;
  ASSERT_EQ(table()->startEvent(context, &handle, &d), ncclSuccess);
  EXPECT_NE(handle, nullptr);  // the plugin's own slot
  ASSERT_EQ(table()->stopEvent(handle), ncclSuccess);
  EXPECT_EQ(g_calls.load(), 0);
  ASSERT_EQ(table()->finalize(context), ncclSuccess);
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) files.push_back(entry.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_GT(std::filesystem::file_size(files.front()), 0u);
  std::filesystem::remove_all(folder);
}

}  // namespace
