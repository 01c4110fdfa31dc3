// libnccl-profiler-gradscope.so in standalone mode (no agent in this process), through dlopen and the
// tables NCCL looks up, called the way NCCL 2.28 calls them: argument checks, null handles, pool
// exhaustion, completion from children, many threads at once (also under TSan), and the v4 table. Each
// test finalizes every context it made, so the plugin finishes its trace, which the test then reads.

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "nccl_abi/profiler.h"

namespace {

using namespace gradscope::nccl_abi;

struct Plugin {
  void* library = nullptr;
  ncclProfiler_v6_t* v6 = nullptr;
  ncclProfiler_v5_t* v5 = nullptr;
  ncclProfiler_v4_t* v4 = nullptr;
};

const Plugin& plugin() {
  static const Plugin loaded = [] {
    Plugin p;
    p.library = dlopen(GRADSCOPE_NCCL_PROFILER_PATH, RTLD_NOW | RTLD_LOCAL);
    if (p.library != nullptr) {
      p.v6 = static_cast<ncclProfiler_v6_t*>(dlsym(p.library, "ncclProfiler_v6"));
      p.v5 = static_cast<ncclProfiler_v5_t*>(dlsym(p.library, "ncclProfiler_v5"));
      p.v4 = static_cast<ncclProfiler_v4_t*>(dlsym(p.library, "ncclProfiler_v4"));
    }
    return p;
  }();
  return loaded;
}

// A fresh output file per test; the plugin opens it at the first init after the previous trace finished.
class ProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(plugin().v5, nullptr) << dlerror();
    folder_ = std::filesystem::temp_directory_path() /
              ("gradscope-profiler-test-" + std::to_string(getpid()) + "-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(folder_);
    path_ = (folder_ / "trace.db").string();
    setenv("GRADSCOPE_OUTPUT", path_.c_str(), 1);
  }
  void TearDown() override { std::filesystem::remove_all(folder_); }

  // One integer from a query on the finished trace.
  std::int64_t query(const std::string& sql) const {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_stmt* statement = nullptr;
    std::int64_t value = -1;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &statement, nullptr) == SQLITE_OK &&
        sqlite3_step(statement) == SQLITE_ROW)
      value = sqlite3_column_int64(statement, 0);
    else ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db);
    sqlite3_finalize(statement);
    sqlite3_close(db);
    return value;
  }

  std::filesystem::path folder_;
  std::string path_;
};

void* initContext(int rank = 0, int nranks = 1, std::uint64_t hash = 0x42) {
  void* context = nullptr;
  int mask = 0;
  EXPECT_EQ(plugin().v5->init(&context, hash, &mask, "test", 1, nranks, rank, nullptr), ncclSuccess);
  EXPECT_EQ(mask, ncclProfileColl | ncclProfileProxyOp | ncclProfileKernelCh);
  return context;
}

ncclProfilerEventDescr_v5_t collDescriptor(std::uint64_t seq, std::size_t count, std::uint8_t channels) {
  ncclProfilerEventDescr_v5_t d{};
  d.type = ncclProfileColl;
  d.coll.seqNumber = seq;
  d.coll.func = "AllReduce";
  d.coll.count = count;
  d.coll.datatype = "ncclFloat32";
  d.coll.nChannels = channels;
  d.coll.algo = "RING";
  d.coll.proto = "LL128";
  return d;
}

// A collective and its kernel channels, as NCCL sends them (children after the collective's stop).
void collective(void* context, std::uint64_t seq, std::size_t count, std::uint8_t channels) {
  const ncclProfilerEventDescr_v5_t coll = collDescriptor(seq, count, channels);
  void* handle = nullptr;
  plugin().v5->startEvent(context, &handle, const_cast<ncclProfilerEventDescr_v5_t*>(&coll));
  ASSERT_NE(handle, nullptr);
  plugin().v5->stopEvent(handle);
  for (std::uint8_t channel = 0; channel < channels; ++channel) {
    ncclProfilerEventDescr_v5_t child{};
    child.type = ncclProfileKernelCh;
    child.parentObj = handle;
    child.kernelCh.channelId = channel;
    void* kernel = nullptr;
    plugin().v5->startEvent(context, &kernel, &child);
    ASSERT_NE(kernel, nullptr);
    ncclProfilerEventStateArgs_v5_t args{};
    args.kernelCh.pTimer = 5;
    plugin().v5->recordEventState(kernel, ncclProfilerKernelChStop, &args);
    plugin().v5->stopEvent(kernel);
  }
}

TEST_F(ProfilerTest, ExportsOnlyTheTables) {
  ASSERT_NE(plugin().v6, nullptr);
  EXPECT_EQ(std::string(plugin().v6->name), "gradscope");
  EXPECT_EQ(std::string(plugin().v5->name), "gradscope");
  EXPECT_EQ(std::string(plugin().v4->name), "gradscope");
  EXPECT_EQ(
      dlsym(plugin().library,
            "_ZN9gradscope13nccl_profiler4initEPPvmPiPKciiiPFvNS_8nccl_abi17ncclDebugLogLevelEmS5_iS5_zE"),
      nullptr);
  EXPECT_EQ(dlsym(plugin().library, "_ZN9gradscope7storage11TraceWriter6commitEv"),
            nullptr);  // storage: private
}

TEST_F(ProfilerTest, InitRefusesBadArguments) {
  int mask = 0;
  void* context = nullptr;
  EXPECT_NE(plugin().v5->init(nullptr, 1, &mask, "x", 1, 1, 0, nullptr), ncclSuccess);
  EXPECT_NE(plugin().v5->init(&context, 1, nullptr, "x", 1, 1, 0, nullptr), ncclSuccess);
  EXPECT_NE(plugin().v5->init(&context, 1, &mask, "x", 1, 0, 0, nullptr), ncclSuccess);
  EXPECT_NE(plugin().v5->init(&context, 1, &mask, "x", 1, 2, 2, nullptr), ncclSuccess);
  EXPECT_NE(plugin().v5->init(&context, 1, &mask, "x", 1, 2, -1, nullptr), ncclSuccess);
  EXPECT_EQ(context, nullptr);
  EXPECT_EQ(mask, 0);
  EXPECT_FALSE(std::filesystem::exists(path_));  // nothing opened for refused communicators
}

TEST_F(ProfilerTest, NullHandlesAndDescriptorsEverywhere) {
  const auto& p = *plugin().v5;
  void* handle = reinterpret_cast<void*>(0x1);
  ncclProfilerEventDescr_v5_t coll = collDescriptor(0, 8, 1);
  EXPECT_EQ(p.startEvent(nullptr, &handle, &coll), ncclSuccess);
  EXPECT_EQ(handle, nullptr);
  EXPECT_EQ(p.startEvent(nullptr, nullptr, &coll), ncclSuccess);
  EXPECT_EQ(p.stopEvent(nullptr), ncclSuccess);
  EXPECT_EQ(p.recordEventState(nullptr, ncclProfilerKernelChStop, nullptr), ncclSuccess);
  EXPECT_EQ(p.finalize(nullptr), ncclSuccess);
  void* context = initContext();
  handle = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(p.startEvent(context, &handle, nullptr), ncclSuccess);
  EXPECT_EQ(handle, nullptr);
  // Children of a null parent (NCCL passes the null handle it was given), of an unknown pointer, and
  // event types the plugin did not ask for: null handles, harmless stops.
  ncclProfilerEventDescr_v5_t child{};
  child.type = ncclProfileKernelCh;
  EXPECT_EQ(p.startEvent(context, &handle, &child), ncclSuccess);
  EXPECT_EQ(handle, nullptr);
  int unrelated = 0;
  child.parentObj = &unrelated;
  EXPECT_EQ(p.startEvent(context, &handle, &child), ncclSuccess);
  EXPECT_EQ(handle, nullptr);
  ncclProfilerEventDescr_v5_t step{};
  step.type = ncclProfileProxyStep;
  EXPECT_EQ(p.startEvent(context, &handle, &step), ncclSuccess);
  EXPECT_EQ(handle, nullptr);
  // A collective NCCL profiles but the trace has no API for.
  ncclProfilerEventDescr_v5_t alltoall = collDescriptor(0, 8, 1);
  alltoall.coll.func = "AlltoAll";
  EXPECT_EQ(p.startEvent(context, &handle, &alltoall), ncclSuccess);
  EXPECT_EQ(handle, nullptr);
  // A group gets a handle that only stops.
  ncclProfilerEventDescr_v5_t group{};
  group.type = ncclProfileGroup;
  EXPECT_EQ(p.startEvent(context, &handle, &group), ncclSuccess);
  EXPECT_NE(handle, nullptr);
  EXPECT_EQ(p.recordEventState(handle, ncclProfilerGroupEndApiStart, nullptr), ncclSuccess);
  EXPECT_EQ(p.stopEvent(handle), ncclSuccess);
  EXPECT_EQ(p.finalize(context), ncclSuccess);
  EXPECT_EQ(query("SELECT count(*) FROM calls"), 0);
}

TEST_F(ProfilerTest, RecordsCollectivesWithCompletionFromChildren) {
  void* context = initContext(1, 4, 0xabc);
  collective(context, 0, 1000, 2);
  collective(context, 1, 64, 1);
  // A collective whose children never come: written at finalize, without a completion.
  ncclProfilerEventDescr_v5_t waiting = collDescriptor(2, 32, 3);
  void* handle = nullptr;
  plugin().v5->startEvent(context, &handle, &waiting);
  plugin().v5->stopEvent(handle);
  ASSERT_EQ(plugin().v5->finalize(context), ncclSuccess);
  EXPECT_EQ(query("SELECT count(*) FROM calls"), 3);
  EXPECT_EQ(query("SELECT bytes FROM calls WHERE seq = 0"), 4000);
  EXPECT_EQ(query("SELECT count(*) FROM calls c JOIN gpu_calls g ON g.call_id = c.id "
                  "WHERE g.algo = 1 AND g.proto = 1 AND c.api = 16 AND c.dtype = 7"),
            3);
  EXPECT_EQ(query("SELECT channels FROM gpu_calls g JOIN calls c ON c.id = g.call_id WHERE c.seq = 0"), 2);
  EXPECT_EQ(query("SELECT count(*) FROM calls WHERE enqueue_ns <= start_ns AND start_ns <= end_ns"), 3);
  EXPECT_EQ(query("SELECT json_extract(config_json, '$.profiler.collectives_completed') FROM runs"), 2);
  EXPECT_EQ(query("SELECT rank FROM ranks"), 1);
  EXPECT_EQ(query("SELECT size FROM comms"), 4);
  EXPECT_EQ(query("SELECT count(*) FROM runs WHERE end_ns IS NOT NULL AND mode = 'observe' AND backend = 2"),
            1);
  EXPECT_EQ(std::filesystem::status(path_).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST_F(ProfilerTest, ExhaustedPoolGivesNullHandlesAndCountsDrops) {
  void* context = initContext();
  constexpr int kExtra = 10;
  std::vector<void*> handles;
  int null_handles = 0;
  for (int i = 0; i < 1024 + kExtra; ++i) {  // never stopped: the pool (1024 per context) runs out
    ncclProfilerEventDescr_v5_t coll = collDescriptor(static_cast<std::uint64_t>(i), 8, 1);
    void* handle = nullptr;
    plugin().v5->startEvent(context, &handle, &coll);
    if (handle == nullptr) ++null_handles;
    else handles.push_back(handle);
  }
  EXPECT_EQ(null_handles, kExtra);
  for (void* handle : handles) plugin().v5->stopEvent(handle);  // then completed by finalize
  ASSERT_EQ(plugin().v5->finalize(context), ncclSuccess);
  EXPECT_EQ(query("SELECT count FROM drops WHERE kind = 'nccl_profile_pool'"), kExtra);
  EXPECT_EQ(query("SELECT count(*) FROM calls"), 1024);
}

TEST_F(ProfilerTest, ConcurrentEventsFromManyThreads) {
  // Four communicators, each with its launching thread and its proxy thread, as NCCL runs them.
  constexpr int kComms = 4, kCollectives = 2000;
  std::vector<void*> contexts;
  for (int c = 0; c < kComms; ++c) contexts.push_back(initContext(0, 1, 100 + static_cast<std::uint64_t>(c)));
  std::vector<std::thread> threads;
  std::atomic<int> started{0};
  for (int c = 0; c < kComms; ++c) {
    threads.emplace_back([&, c] {
      struct Work {
        void* handle;
      };
      std::vector<void*> launched(kCollectives, nullptr);
      std::atomic<int> published{0};
      std::thread proxy([&] {
        for (int i = 0; i < kCollectives; ++i) {
          while (published.load(std::memory_order_acquire) <= i) std::this_thread::yield();
          for (std::uint8_t channel = 0; channel < 2; ++channel) {
            ncclProfilerEventDescr_v5_t child{};
            child.type = ncclProfileKernelCh;
            child.parentObj = launched[static_cast<std::size_t>(i)];
            void* kernel = nullptr;
            plugin().v5->startEvent(contexts[static_cast<std::size_t>(c)], &kernel, &child);
            plugin().v5->stopEvent(kernel);
          }
        }
      });
      started.fetch_add(1);
      for (int i = 0; i < kCollectives; ++i) {
        ncclProfilerEventDescr_v5_t coll = collDescriptor(static_cast<std::uint64_t>(i), 256, 2);
        void* handle = nullptr;
        plugin().v5->startEvent(contexts[static_cast<std::size_t>(c)], &handle, &coll);
        launched[static_cast<std::size_t>(i)] = handle;
        published.store(i + 1, std::memory_order_release);
        plugin().v5->stopEvent(handle);
      }
      proxy.join();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (void* context : contexts) ASSERT_EQ(plugin().v5->finalize(context), ncclSuccess);
  const std::int64_t drops = query("SELECT coalesce(sum(count), 0) FROM drops");
  EXPECT_EQ(query("SELECT count(*) FROM calls") + drops, kComms * kCollectives);
  EXPECT_EQ(query("SELECT count(DISTINCT comm_id) FROM calls"), kComms);
  EXPECT_EQ(query("SELECT json_extract(config_json, '$.profiler.collectives_completed') FROM runs"),
            query("SELECT count(*) FROM calls"));
}

TEST_F(ProfilerTest, VersionFourTable) {
  const auto& p = *plugin().v4;
  void* context = nullptr;
  int mask = 0;
  ASSERT_EQ(p.init(&context, &mask, "v4", 0x77, 1, 2, 1, nullptr), ncclSuccess);
  EXPECT_EQ(mask, ncclProfileColl | ncclProfileProxyOp | ncclProfileKernelCh);
  EXPECT_NE(p.init(nullptr, &mask, "v4", 0x77, 1, 2, 1, nullptr), ncclSuccess);
  ncclProfilerEventDescr_v4_t coll{};
  coll.type = static_cast<std::uint8_t>(ncclProfileColl);
  coll.coll.seqNumber = 9;
  coll.coll.func = "ReduceScatter";
  coll.coll.count = 16;
  coll.coll.datatype = "ncclBfloat16";
  coll.coll.nChannels = 1;
  coll.coll.algo = "Tree";
  coll.coll.proto = "Simple";
  void* handle = nullptr;
  ASSERT_EQ(p.startEvent(context, &handle, &coll), ncclSuccess);
  ASSERT_NE(handle, nullptr);
  EXPECT_EQ(p.stopEvent(handle), ncclSuccess);
  ncclProfilerEventDescr_v4_t proxy{};
  proxy.type = static_cast<std::uint8_t>(ncclProfileProxyOp);
  proxy.parentObj = handle;
  proxy.proxyOp.pid = getpid();
  void* op = nullptr;
  ASSERT_EQ(p.startEvent(context, &op, &proxy), ncclSuccess);
  EXPECT_NE(op, nullptr);
  ncclProfilerEventDescr_v4_t kernel{};
  kernel.type = static_cast<std::uint8_t>(ncclProfileKernelCh);
  kernel.parentObj = handle;
  void* channel = nullptr;
  ASSERT_EQ(p.startEvent(context, &channel, &kernel), ncclSuccess);
  ncclProfilerEventStateArgs_v4_t args{};
  EXPECT_EQ(p.recordEventState(channel, ncclProfilerKernelChStop, &args), ncclSuccess);
  EXPECT_EQ(p.stopEvent(channel), ncclSuccess);
  EXPECT_EQ(p.stopEvent(op), ncclSuccess);
  ASSERT_EQ(p.finalize(context), ncclSuccess);
  EXPECT_EQ(
      query(
          "SELECT count(*) FROM calls c JOIN gpu_calls g ON g.call_id = c.id WHERE c.api = 17 AND "
          "c.dtype = 9 AND c.count = 16 AND c.bytes = 64 AND g.algo = 0 AND g.proto = 2 AND g.channels = 1"),
      1);
  EXPECT_EQ(query("SELECT json_extract(config_json, '$.profiler.collectives_completed') FROM runs"), 1);
}

// NCCL 2.29 and later take the v6 table: v5's events in v6's descriptor, completed by their kernel channel.
TEST_F(ProfilerTest, VersionSixTable) {
  const auto& p = *plugin().v6;
  void* context = nullptr;
  int mask = 0;
  ASSERT_EQ(p.init(&context, 0x66, &mask, "v6", 1, 2, 0, nullptr), ncclSuccess);
  EXPECT_EQ(mask, ncclProfileColl | ncclProfileProxyOp | ncclProfileKernelCh);  // no copy-engine events
  ncclProfilerEventDescr_v6_t coll{};
  coll.type = ncclProfileColl;
  coll.coll.seqNumber = 3;
  coll.coll.func = "AllReduce";
  coll.coll.count = 1024;
  coll.coll.datatype = "ncclFloat32";
  coll.coll.nChannels = 1;
  coll.coll.algo = "RING";
  coll.coll.proto = "LL128";
  void* handle = nullptr;
  ASSERT_EQ(p.startEvent(context, &handle, &coll), ncclSuccess);
  ASSERT_NE(handle, nullptr);
  EXPECT_EQ(p.stopEvent(handle), ncclSuccess);
  ncclProfilerEventDescr_v6_t kernel{};
  kernel.type = ncclProfileKernelCh;
  kernel.parentObj = handle;
  void* channel = nullptr;
  ASSERT_EQ(p.startEvent(context, &channel, &kernel), ncclSuccess);
  ncclProfilerEventStateArgs_v6_t args{};
  EXPECT_EQ(p.recordEventState(channel, ncclProfilerKernelChStop, &args), ncclSuccess);
  EXPECT_EQ(p.stopEvent(channel), ncclSuccess);
  ASSERT_EQ(p.finalize(context), ncclSuccess);
  EXPECT_EQ(query("SELECT count(*) FROM calls c JOIN gpu_calls g ON g.call_id = c.id WHERE c.api = 16 AND "
                  "c.count = 1024 AND c.bytes = 4096 AND g.algo = 1 AND g.proto = 1 AND g.channels = 1"),
            1);
  EXPECT_EQ(query("SELECT json_extract(config_json, '$.profiler.collectives_completed') FROM runs"), 1);
}

}  // namespace
