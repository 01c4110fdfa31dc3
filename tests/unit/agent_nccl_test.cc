// The NCCL interposer's pure parts (agent/core/nccl_state.h, the rows of nccl_functions.def, the numbering
// of sends, receives and group launches) and the CUDA-event GPU timer (agent/core/gpu_timer.h) on a fake
// driver: a GPU clock the test advances by hand, streams whose work ends at a cursor, events that complete
// when the clock passes them; and the join of CUPTI's activity records into spans
// (agent/core/cupti_tracer.h). No CUDA, no GPU. The wrappers themselves run in tests/agent/nccl
// (check_nccl.py, ctest -L agent: the exact rows of sends, receives and group launches on the fake NCCL,
// and a job on an NCCL without the 2.28 functions, agent.nccl.old-nccl).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/clock.h"
#include "core/comm_registry.h"
#include "core/gpu_timer.h"
#include "core/nccl_state.h"

namespace gradscope::agent {

// The fake driver's objects.
struct cuda::CUevent_st {
  std::int64_t time_ns = 0;
  bool recorded = false;
  cuda::CUstream stream = nullptr;
};

namespace {

using cuda::CUresult;
using cuda::CUstream;

// ---- communicator keys and codes ---------------------------------------------------------------------

nccl::ncclUniqueId patternId(int n) {
  nccl::ncclUniqueId id;
  for (std::size_t i = 0; i < nccl::kUniqueIdBytes; ++i)
    id.internal[i] = static_cast<char>((7 * i + 13 * static_cast<std::size_t>(n)) & 0xff);
  return id;
}

TEST(AgentNcclKeys, UniqueIdKeyIsTheFnvHashOfTheIdBytes) {
  // Computed independently by tests/agent/nccl/check_nccl.py for the fake NCCL's first id.
  const nccl::ncclUniqueId id = patternId(0);
  EXPECT_EQ(uniqueIdKey(&id, 1), "nccl:c184c66f3c78b125");
  const nccl::ncclUniqueId other = patternId(1);
  EXPECT_NE(uniqueIdKey(&other, 1), uniqueIdKey(&id, 1));
  const nccl::ncclUniqueId both[] = {id, other};
  EXPECT_NE(uniqueIdKey(both, 2), uniqueIdKey(&id, 1));
  EXPECT_EQ(uniqueIdKey(both, 2), uniqueIdKey(both, 2));
}

TEST(AgentNcclKeys, DerivedKeys) {
  EXPECT_EQ(initAllKey(0), "nccl:all#0");
  EXPECT_EQ(initAllKey(12), "nccl:all#12");
  EXPECT_EQ(splitKey("nccl:00000000000000ab", 1, 3), "nccl:00000000000000ab/split1:3");
  EXPECT_EQ(splitKey(splitKey("nccl:x", 0, 1), 0, 0), "nccl:x/split0:1/split0:0");
  EXPECT_EQ(unseenKey(8, 2), "nccl:unseen:8#2");
}

TEST(AgentNcclKeys, SeveralRanksOfOneCommunicatorInAProcessGetDistinctKeys) {
  std::set<std::string> used;
  EXPECT_EQ(distinctKey(used, "nccl:all#0", 0), "nccl:all#0");
  EXPECT_EQ(distinctKey(used, "nccl:all#0", 1), "nccl:all#0@1");
  EXPECT_EQ(distinctKey(used, "nccl:all#0", 1), "nccl:all#0@1#1");
  EXPECT_EQ(distinctKey(used, "nccl:all#1", 1), "nccl:all#1");
  EXPECT_EQ(used.size(), 4u);
}

TEST(AgentNcclCodes, DataTypesAndOperators) {
  EXPECT_EQ(dtypeOf(nccl::ncclInt8), DType::Int8);
  EXPECT_EQ(dtypeOf(nccl::ncclFloat16), DType::Fp16);
  EXPECT_EQ(dtypeOf(nccl::ncclFloat32), DType::Fp32);
  EXPECT_EQ(dtypeOf(nccl::ncclBfloat16), DType::Bf16);
  EXPECT_EQ(dtypeOf(nccl::ncclFloat8e5m2), DType::Fp8E5M2);
  for (int code = 0; code < nccl::ncclNumTypes; ++code)
    EXPECT_EQ(static_cast<int>(dtypeOf(static_cast<nccl::ncclDataType_t>(code))), code);
  EXPECT_EQ(dtypeOf(nccl::ncclNumTypes), DType::Other);
  EXPECT_EQ(sizeOf(dtypeOf(nccl::ncclFloat64)), 8u);

  EXPECT_EQ(reduceOpOf(nccl::ncclSum), ReduceOp::Sum);
  EXPECT_EQ(reduceOpOf(nccl::ncclProd), ReduceOp::Prod);
  EXPECT_EQ(reduceOpOf(nccl::ncclMax), ReduceOp::Max);
  EXPECT_EQ(reduceOpOf(nccl::ncclMin), ReduceOp::Min);
  EXPECT_EQ(reduceOpOf(nccl::ncclAvg), ReduceOp::Avg);
  EXPECT_EQ(reduceOpOf(nccl::ncclNumOps), ReduceOp::Other);  // the first ncclRedOpCreatePreMulSum operator
  EXPECT_EQ(reduceOpOf(nccl::ncclMaxRedOp), ReduceOp::Other);
}

// ---- streams ------------------------------------------------------------------------------------------

const void* handle(std::uintptr_t value) {
  return reinterpret_cast<const void*>(value);
}

TEST(AgentNcclStreams, NumberedInFirstSeenOrder) {
  auto table = std::make_unique<StreamTable>();
  StreamTable::Entry* a = table->find(handle(0x5000));
  StreamTable::Entry* none = table->find(nullptr);  // the legacy default stream is a stream too
  StreamTable::Entry* b = table->find(handle(0x6000));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(none, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->index, 1);
  EXPECT_EQ(none->index, 2);
  EXPECT_EQ(b->index, 3);
  EXPECT_EQ(table->find(handle(0x5000)), a);
  EXPECT_EQ(table->find(handle(0x5000)), a);  // the thread's last hit
  EXPECT_EQ(table->find(nullptr), none);
  EXPECT_EQ(a->domain.load(), StreamTable::kDomainUnknown);
  EXPECT_EQ(table->size(), 3u);
}

TEST(AgentNcclStreams, TablesDoNotShareTheLastHit) {
  auto first = std::make_unique<StreamTable>();
  auto second = std::make_unique<StreamTable>();
  first->find(handle(1));
  StreamTable::Entry* in_second = second->find(handle(2));
  EXPECT_EQ(first->find(handle(2))->index, 2);
  EXPECT_EQ(second->find(handle(2)), in_second);
  EXPECT_EQ(in_second->index, 1);
}

TEST(AgentNcclStreams, BoundedAndDropsBeyond) {
  auto table = std::make_unique<StreamTable>();
  for (std::uintptr_t i = 1; i <= StreamTable::kMaxStreams; ++i) ASSERT_NE(table->find(handle(i)), nullptr);
  EXPECT_EQ(table->find(handle(StreamTable::kMaxStreams + 1)), nullptr);
  EXPECT_EQ(table->find(handle(StreamTable::kMaxStreams))->index, StreamTable::kMaxStreams);
}

TEST(AgentNcclStreams, ConcurrentFirstSightsGiveOneEntryPerStream) {
  auto table = std::make_unique<StreamTable>();
  constexpr int kThreads = 4, kStreams = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&table, t] {
      for (int i = 0; i < kStreams; ++i)
        table->find(handle(static_cast<std::uintptr_t>(1 + (i * (t + 1)) % kStreams)));
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(table->size(), static_cast<std::size_t>(kStreams));
  std::set<int> indices;
  for (int i = 1; i <= kStreams; ++i)
    indices.insert(table->find(handle(static_cast<std::uintptr_t>(i)))->index);
  EXPECT_EQ(indices.size(), static_cast<std::size_t>(kStreams));
  EXPECT_EQ(*indices.begin(), 1);
  EXPECT_EQ(*indices.rbegin(), kStreams);
}

// ---- groups -------------------------------------------------------------------------------------------

TEST(AgentNcclGroups, NestedGroupsEndAtTheOutermost) {
  GroupState group;
  EXPECT_FALSE(group.end());  // an end without a start: the depth stays at 0
  group.start();
  group.start();
  EXPECT_EQ(group.depth(), 2);
  EXPECT_FALSE(group.end());
  EXPECT_TRUE(group.end());
  EXPECT_EQ(group.depth(), 0);
}

TEST(AgentNcclGroups, MembersAndTheirDistinctStreams) {
  GroupState group;
  const auto s1 = reinterpret_cast<nccl::cudaStream_t>(0x10), s2 = reinterpret_cast<nccl::cudaStream_t>(0x20);
  CallEvent event;
  for (int i = 0; i < 3; ++i) {
    event.header.seq = i;
    ASSERT_TRUE(group.add(event, i == 1 ? s2 : s1, i == 1 ? 1 : 0));
  }
  ASSERT_EQ(group.members().size(), 3u);
  EXPECT_EQ(group.members()[2].event.header.seq, 2);
  nccl::cudaStream_t streams[GroupState::kMaxStreams];
  int domains[GroupState::kMaxStreams];
  ASSERT_EQ(group.distinctStreams(streams, domains), 2);
  EXPECT_EQ(streams[0], s1);
  EXPECT_EQ(domains[0], 0);
  EXPECT_EQ(streams[1], s2);
  EXPECT_EQ(domains[1], 1);
  group.clear();
  EXPECT_TRUE(group.members().empty());
  for (std::uintptr_t i = 1; i <= 20; ++i) group.add(event, reinterpret_cast<nccl::cudaStream_t>(i), 0);
  EXPECT_EQ(group.distinctStreams(streams, domains), GroupState::kMaxStreams);
}

TEST(AgentNcclGroups, TheOutermostStartIssuesTheGroup) {
  GroupState group;
  EXPECT_EQ(group.started(), 0u);
  group.start(1000);
  group.start(2000);  // nested: still the outermost's
  EXPECT_EQ(group.started(), 1000u);
  EXPECT_FALSE(group.end());
  EXPECT_TRUE(group.end());
  group.start(3000);
  EXPECT_EQ(group.started(), 3000u);
}

// A member as the wrappers make it: api, peer, count and bytes, on communicator `comm`.
GroupState::Member member(Api api, std::uint32_t comm, std::int64_t seq, std::int64_t count, DType dtype,
                          int peer, std::uint64_t issued) {
  GroupState::Member m;
  m.event.header.api = api;
  m.event.header.comm = comm;
  m.event.header.seq = seq;
  m.event.header.dtype = dtype;
  m.event.call.count = count;
  m.event.call.bytes = count * static_cast<std::int64_t>(sizeOf(dtype));
  m.event.call.peer = peer;
  m.event.call.enqueue = issued;
  m.event.call.step = 7;
  m.event.call.stream = 2;
  return m;
}

TEST(AgentNcclGroups, ALaunchOfTwoSendsAndTwoReceivesIsOneRecordOfFourMembers) {
  const GroupState::Member members[] = {
      member(Api::NcclSend, 3, 0, 40, DType::Fp32, 1, 500),
      member(Api::NcclSend, 4, 0, 24, DType::Bf16, 0, 510),
      member(Api::NcclRecv, 3, 1, 24, DType::Bf16, 1, 520),
      member(Api::NcclRecv, 4, 1, 40, DType::Fp32, 0, 530),
  };
  const CallEvent launch = groupLaunchEvent(members, 2, 400);
  EXPECT_EQ(launch.header.kind, EventKind::Call);
  EXPECT_EQ(launch.header.api, Api::NcclGroup);
  EXPECT_EQ(launch.header.comm, 3u);  // the first member's communicator
  EXPECT_EQ(launch.header.seq, 2);
  EXPECT_EQ(launch.header.dtype, DType::Other);
  EXPECT_EQ(launch.header.op, ReduceOp::None);
  EXPECT_EQ(launch.call.count, 4);
  EXPECT_EQ(launch.call.bytes, 40 * 4 + 24 * 2 + 24 * 2 + 40 * 4);
  EXPECT_EQ(launch.call.enqueue, 400u);  // the outermost ncclGroupStart
  EXPECT_EQ(launch.call.step, 7);
  EXPECT_EQ(launch.call.stream, 2);
  EXPECT_EQ(launch.call.peer, -1);
  EXPECT_EQ(launch.call.tag, -1);
  EXPECT_EQ(launch.call.gpu_slot, 0u);  // the caller times it like its members
  // A group whose start was not seen (recording started inside it) is issued with its first member.
  EXPECT_EQ(groupLaunchEvent(members, 2, 0).call.enqueue, 500u);
  EXPECT_EQ(groupLaunchEvent(members, 2, 900).call.enqueue, 500u);
}

TEST(AgentNcclNumbering, SendsReceivesAndLaunchesAreNumberedApartFromCollectives) {
  for (const Api api : {Api::NcclSend, Api::NcclRecv, Api::NcclGroup})
    EXPECT_TRUE(numberedApart(api)) << name(api);
  for (const Api api :
       {Api::NcclAllReduce, Api::NcclBroadcast, Api::NcclAlltoAll, Api::NcclGather, Api::NcclScatter})
    EXPECT_FALSE(numberedApart(api)) << name(api);
  // The joins tell a send #5 and a launch #5 from the collective #5 of the same communicator.
  EXPECT_NE(joinSeq(Api::NcclSend, 5), joinSeq(Api::NcclAllReduce, 5));
  EXPECT_EQ(joinSeq(Api::NcclRecv, 5), joinSeq(Api::NcclGroup, 5));  // one sequence: never both #5
  EXPECT_EQ(joinSeq(Api::NcclAllReduce, 5), 5);

  // As the wrappers number them: a rank's sends and receives do not move its collectives' numbers, which
  // stay equal on every rank however many each makes.
  CommSlot busy, quiet;
  EXPECT_EQ(busy.nextSeq(), 0);
  EXPECT_EQ(quiet.nextSeq(), 0);
  for (int i = 0; i < 3; ++i) busy.nextPeerSeq();
  EXPECT_EQ(busy.nextSeq(), 1);
  EXPECT_EQ(quiet.nextSeq(), 1);
  EXPECT_EQ(busy.nextPeerSeq(), 3);
  EXPECT_EQ(quiet.nextPeerSeq(), 0);
}

// The table's recorded rows: every API code names its function and is NCCL's, sends and receives are the
// point-to-point rows, and every row a job on NCCL 2.28 can call is there.
struct TableRow {
  std::string name;
  Api api;
  bool point_to_point;
};
std::vector<TableRow> recordedRows() {
  std::vector<TableRow> rows;
#define GS_NCCL_COLLECTIVE(NAME, API, PARAMS, ARGS, COUNT, ELEMENTS, DATATYPE, OP, COMM, STREAM) \
  rows.push_back({#NAME, Api::API, false});
#define GS_NCCL_POINT_TO_POINT(NAME, API, PARAMS, ARGS, COUNT, DATATYPE, PEER, COMM, STREAM) \
  rows.push_back({#NAME, Api::API, true});
#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS)
  using namespace nccl;
#include "interpose/nccl_functions.def"
#undef GS_NCCL_FUNCTION
  return rows;
}

TEST(AgentNcclTable, RecordedRowsNameTheirApis) {
  const std::vector<TableRow> rows = recordedRows();
  std::set<std::string> names;
  for (const TableRow& row : rows) {
    names.insert(row.name);
    EXPECT_EQ(name(row.api), row.name);
    EXPECT_EQ(backendOf(row.api), Backend::Nccl) << row.name;
    EXPECT_EQ(isPointToPoint(row.api), row.point_to_point) << row.name;
  }
  EXPECT_EQ(names, (std::set<std::string>{"ncclReduce", "ncclBroadcast", "ncclAllReduce", "ncclReduceScatter",
                                          "ncclAllGather", "ncclAlltoAll", "ncclGather", "ncclScatter",
                                          "ncclSend", "ncclRecv"}));
}

TEST(AgentNcclGroups, BoundedMembers) {
  GroupState group;
  CallEvent event;
  for (std::size_t i = 0; i < GroupState::kMaxMembers; ++i) ASSERT_TRUE(group.add(event, nullptr, 0));
  EXPECT_FALSE(group.add(event, nullptr, 0));
  EXPECT_EQ(group.members().size(), GroupState::kMaxMembers);
}

// ---- the GPU timer on a fake driver ------------------------------------------------------------------

// The fake GPU: one clock, advanced by the test; a stream's work ends at its cursor.
struct FakeGpu {
  std::int64_t now_ns = 5'000'000'000;
  std::map<CUstream, std::int64_t> cursor;
  std::set<CUstream> capturing;
  std::set<CUstream> own_streams;  // created through the driver (the timer's)
  std::map<CUstream, cuda::CUcontext> contexts;
  cuda::CUcontext current = nullptr;
  int events_created = 0;
  int fail_event_create_at = -1;  // the n-th creation fails
  bool fail_record = false;
  int records = 0;
  int job_stream_syncs = 0;
  std::vector<cuda::CUevent> events;

  // The host's Unix-epoch clock as the timer reads it around references (hostClock): each read moves it
  // on by host_step_ns, so the width of a reference read is exactly that, however the test is scheduled.
  std::int64_t host_ns = 1'700'000'000'000'000'000;
  std::int64_t host_step_ns = 1'000;

  void launch(CUstream stream, std::int64_t ns) { cursor[stream] = std::max(now_ns, cursor[stream]) + ns; }
  void advance(std::int64_t ns) { now_ns += ns; }
};
FakeGpu* g_gpu = nullptr;

std::int64_t hostClock() {
  return g_gpu->host_ns += g_gpu->host_step_ns;
}

cuda::CUcontext contextObject(std::uintptr_t n) {
  return reinterpret_cast<cuda::CUcontext>(0x1000 * n);
}

cuda::Driver fakeDriver() {
  cuda::Driver d;
  d.ctxGetCurrent = [](cuda::CUcontext* context) {
    *context = g_gpu->current;
    return cuda::CUDA_SUCCESS;
  };
  d.ctxSetCurrent = [](cuda::CUcontext context) {
    g_gpu->current = context;
    return cuda::CUDA_SUCCESS;
  };
  d.ctxGetDevice = [](cuda::CUdevice* device) {
    *device = 0;
    return cuda::CUDA_SUCCESS;
  };
  d.deviceGet = [](cuda::CUdevice* device, int ordinal) {
    *device = ordinal;
    return cuda::CUDA_SUCCESS;
  };
  d.deviceGetName = [](char* name, int, cuda::CUdevice) {
    name[0] = '\0';
    return cuda::CUDA_SUCCESS;
  };
  d.streamCreate = [](CUstream* stream, unsigned) {
    *stream = reinterpret_cast<CUstream>(0xF000 + g_gpu->own_streams.size());
    g_gpu->own_streams.insert(*stream);
    return cuda::CUDA_SUCCESS;
  };
  d.streamDestroy = [](CUstream) { return cuda::CUDA_SUCCESS; };
  d.streamGetCtx = [](CUstream stream, cuda::CUcontext* context) {
    const auto it = g_gpu->contexts.find(stream);
    *context = it != g_gpu->contexts.end() ? it->second : contextObject(1);
    return cuda::CUDA_SUCCESS;
  };
  d.streamIsCapturing = [](CUstream stream, cuda::CUstreamCaptureStatus* status) {
    *status = g_gpu->capturing.count(stream) != 0 ? cuda::CU_STREAM_CAPTURE_STATUS_ACTIVE
                                                  : cuda::CU_STREAM_CAPTURE_STATUS_NONE;
    return cuda::CUDA_SUCCESS;
  };
  d.threadExchangeStreamCaptureMode = [](cuda::CUstreamCaptureMode*) { return cuda::CUDA_SUCCESS; };
  d.eventCreate = [](cuda::CUevent* event, unsigned) {
    if (g_gpu->events_created++ == g_gpu->fail_event_create_at) return cuda::CUDA_ERROR_INVALID_VALUE;
    *event = new cuda::CUevent_st;
    g_gpu->events.push_back(*event);
    return cuda::CUDA_SUCCESS;
  };
  d.eventDestroy = [](cuda::CUevent event) {
    g_gpu->events.erase(std::find(g_gpu->events.begin(), g_gpu->events.end(), event));
    delete event;
    return cuda::CUDA_SUCCESS;
  };
  d.eventRecord = [](cuda::CUevent event, CUstream stream) {
    if (g_gpu->fail_record) return cuda::CUDA_ERROR_INVALID_HANDLE;
    ++g_gpu->records;
    std::int64_t& cursor = g_gpu->cursor[stream];
    cursor = std::max(cursor, g_gpu->now_ns);
    *event = {cursor, true, stream};
    return cuda::CUDA_SUCCESS;
  };
  d.eventQuery = [](cuda::CUevent event) {
    return event->time_ns <= g_gpu->now_ns ? cuda::CUDA_SUCCESS : cuda::CUDA_ERROR_NOT_READY;
  };
  d.eventSynchronize = [](cuda::CUevent event) {
    if (g_gpu->own_streams.count(event->stream) == 0) ++g_gpu->job_stream_syncs;
    g_gpu->now_ns = std::max(g_gpu->now_ns, event->time_ns);
    return cuda::CUDA_SUCCESS;
  };
  d.eventElapsedTime = [](float* ms, cuda::CUevent start, cuda::CUevent end) {
    if (!start->recorded || !end->recorded) return cuda::CUDA_ERROR_INVALID_HANDLE;
    if (start->time_ns > g_gpu->now_ns || end->time_ns > g_gpu->now_ns) return cuda::CUDA_ERROR_NOT_READY;
    *ms = static_cast<float>(static_cast<double>(end->time_ns - start->time_ns) / 1e6);
    return cuda::CUDA_SUCCESS;
  };
  return d;
}

class AgentGpuTimer : public ::testing::Test {
 protected:
  void SetUp() override { g_gpu = &gpu_; }
  void TearDown() override { g_gpu = nullptr; }

  std::unique_ptr<CudaEventTimer> timer(CudaEventTimer::Options options = {}) {
    return std::make_unique<CudaEventTimer>(driver_, options);
  }

  int domainOf(CudaEventTimer& timer, CUstream stream) {
    std::string error;
    const int domain = timer.domainOf(stream, error);
    EXPECT_TRUE(error.empty()) << error;
    return domain;
  }

  FakeGpu gpu_;
  const cuda::Driver driver_ = fakeDriver();
  const CUstream s1_ = reinterpret_cast<CUstream>(0x100);
  const CUstream s2_ = reinterpret_cast<CUstream>(0x200);
};

TEST_F(AgentGpuTimer, CallSpanIsItsKernelsInEpochTime) {
  auto t = timer();
  const int domain = domainOf(*t, s1_);
  ASSERT_EQ(domain, 0);
  bool captured = false;
  const std::uint32_t slot = t->start(domain, s1_, captured);
  ASSERT_NE(slot, 0u);
  EXPECT_FALSE(captured);
  gpu_.launch(s1_, 3'000'000);
  t->stop(slot, s1_);
  std::int64_t start = 0, end = 0;
  EXPECT_EQ(t->query(slot - 1, start, end), GpuTimer::Status::Pending);
  gpu_.advance(2'999'999);
  EXPECT_EQ(t->query(slot - 1, start, end), GpuTimer::Status::Pending);
  gpu_.advance(1);
  ASSERT_EQ(t->query(slot - 1, start, end), GpuTimer::Status::Ready);
  EXPECT_NEAR(static_cast<double>(end - start), 3e6, 1e3);
  // The reference was taken at the host's time of set-up: the span is near now, in Unix-epoch ns.
  EXPECT_NEAR(static_cast<double>(start), static_cast<double>(realtimeNs()), 1e9);
  EXPECT_EQ(t->pairsInUse(), 1u);
  t->release(slot - 1);
  EXPECT_EQ(t->pairsInUse(), 0u);
  EXPECT_EQ(gpu_.job_stream_syncs, 0);
  EXPECT_EQ(gpu_.own_streams.size(), 1u);
}

TEST_F(AgentGpuTimer, CallsQueuedBehindOthersStartWhenTheStreamGetsToThem) {
  auto t = timer();
  const int domain = domainOf(*t, s1_);
  bool captured = false;
  const std::uint32_t first = t->start(domain, s1_, captured);
  gpu_.launch(s1_, 1'000'000);
  t->stop(first, s1_);
  const std::uint32_t second = t->start(domain, s1_, captured);
  gpu_.launch(s1_, 2'000'000);
  t->stop(second, s1_);
  gpu_.advance(3'000'000);
  std::int64_t a0 = 0, a1 = 0, b0 = 0, b1 = 0;
  ASSERT_EQ(t->query(second - 1, b0, b1), GpuTimer::Status::Ready);  // any order
  ASSERT_EQ(t->query(first - 1, a0, a1), GpuTimer::Status::Ready);
  EXPECT_NEAR(static_cast<double>(a1 - a0), 1e6, 1e3);
  EXPECT_NEAR(static_cast<double>(b0 - a1), 0, 1e3);
  EXPECT_NEAR(static_cast<double>(b1 - b0), 2e6, 1e3);
}

TEST_F(AgentGpuTimer, CapturingStreamIsHostTimed) {
  auto t = timer();
  const int domain = domainOf(*t, s1_);
  const int records = gpu_.records;
  gpu_.capturing.insert(s1_);
  bool captured = false;
  EXPECT_EQ(t->start(domain, s1_, captured), 0u);
  EXPECT_TRUE(captured);
  EXPECT_EQ(gpu_.records, records);  // nothing recorded on the capturing stream
  EXPECT_EQ(t->pairsInUse(), 0u);
}

TEST_F(AgentGpuTimer, StreamFirstSeenWhileCapturingIsSetUpLater) {
  auto t = timer();
  gpu_.capturing.insert(s1_);
  EXPECT_EQ(domainOf(*t, s1_), CudaEventTimer::kDomainLater);
  EXPECT_EQ(gpu_.events_created, 0);
  gpu_.capturing.clear();
  EXPECT_EQ(domainOf(*t, s1_), 0);
}

TEST_F(AgentGpuTimer, ExhaustedPoolFallsBackToHostTiming) {
  auto t = timer({.pairs_per_domain = 4});
  const int domain = domainOf(*t, s1_);
  bool captured = false;
  std::vector<std::uint32_t> slots;
  for (int i = 0; i < 4; ++i) {
    slots.push_back(t->start(domain, s1_, captured));
    ASSERT_NE(slots.back(), 0u);
    t->stop(slots.back(), s1_);
  }
  EXPECT_EQ(t->start(domain, s1_, captured), 0u);
  EXPECT_FALSE(captured);
  t->release(slots[2] - 1);
  const std::uint32_t again = t->start(domain, s1_, captured);
  EXPECT_EQ(again, slots[2]);
  EXPECT_EQ(std::set<std::uint32_t>(slots.begin(), slots.end()).size(), 4u);
}

TEST_F(AgentGpuTimer, GroupMembersShareTheUnionOfItsStreamsSpans) {
  auto t = timer();
  const int domains[] = {domainOf(*t, s1_), domainOf(*t, s2_)};
  const CUstream streams[] = {s1_, s2_};
  CudaEventTimer::Group group;
  t->startGroup(group, domains, streams, 2);
  ASSERT_NE(group.leader, 0u);
  EXPECT_EQ(group.count, 2);
  gpu_.launch(s1_, 2'000'000);
  gpu_.launch(s2_, 5'000'000);
  t->stopGroup(group, 3);
  EXPECT_EQ(t->pairsInUse(), 2u);
  gpu_.advance(4'000'000);
  std::int64_t start = 0, end = 0;
  EXPECT_EQ(t->query(group.leader - 1, start, end), GpuTimer::Status::Pending);  // s2 still running
  gpu_.advance(1'000'000);
  ASSERT_EQ(t->query(group.leader - 1, start, end), GpuTimer::Status::Ready);
  EXPECT_NEAR(static_cast<double>(end - start), 5e6, 1e3);
  std::int64_t again_start = 0, again_end = 0;
  ASSERT_EQ(t->query(group.leader - 1, again_start, again_end), GpuTimer::Status::Ready);
  EXPECT_EQ(again_start, start);
  EXPECT_EQ(again_end, end);
  t->release(group.leader - 1);
  t->release(group.leader - 1);
  EXPECT_EQ(t->pairsInUse(), 2u);
  t->release(group.leader - 1);  // the last member frees the leader and its sibling
  EXPECT_EQ(t->pairsInUse(), 0u);
}

TEST_F(AgentGpuTimer, GroupWithACapturingStreamIsHostTimed) {
  auto t = timer();
  const int domains[] = {domainOf(*t, s1_), domainOf(*t, s2_)};
  const CUstream streams[] = {s1_, s2_};
  gpu_.capturing.insert(s2_);
  CudaEventTimer::Group group;
  t->startGroup(group, domains, streams, 2);
  EXPECT_EQ(group.leader, 0u);
  EXPECT_TRUE(group.captured);
  t->stopGroup(group, 3);
  EXPECT_EQ(t->pairsInUse(), 0u);
}

TEST_F(AgentGpuTimer, GroupOfUntimedStreamsOrWithoutMembers) {
  auto t = timer();
  const int untimed[] = {CudaEventTimer::kNoDomain};
  const CUstream streams[] = {s1_};
  CudaEventTimer::Group group;
  t->startGroup(group, untimed, streams, 1);
  EXPECT_EQ(group.leader, 0u);
  const int domains[] = {domainOf(*t, s1_)};
  t->startGroup(group, domains, streams, 1);
  ASSERT_NE(group.leader, 0u);
  t->stopGroup(group, 0);  // nobody will carry it
  EXPECT_EQ(group.leader, 0u);
  EXPECT_EQ(t->pairsInUse(), 0u);
}

TEST_F(AgentGpuTimer, FailedRecordMakesTheCallHostTimed) {
  auto t = timer();
  const int domain = domainOf(*t, s1_);
  bool captured = false;
  gpu_.fail_record = true;
  EXPECT_EQ(t->start(domain, s1_, captured), 0u);
  EXPECT_EQ(t->pairsInUse(), 0u);
  gpu_.fail_record = false;
  const std::uint32_t slot = t->start(domain, s1_, captured);
  gpu_.fail_record = true;
  t->stop(slot, s1_);
  gpu_.fail_record = false;
  std::int64_t start = 0, end = 0;
  EXPECT_EQ(t->query(slot - 1, start, end), GpuTimer::Status::Failed);
  t->release(slot - 1);
  EXPECT_EQ(t->pairsInUse(), 0u);
}

TEST_F(AgentGpuTimer, AbandonedCallGivesItsPairBack) {
  auto t = timer({.pairs_per_domain = 1});
  const int domain = domainOf(*t, s1_);
  bool captured = false;
  const std::uint32_t slot = t->start(domain, s1_, captured);
  ASSERT_NE(slot, 0u);
  t->abandon(slot);  // e.g. ncclInProgress: NCCL enqueues the work after the end event would be
  EXPECT_EQ(t->pairsInUse(), 0u);
  EXPECT_EQ(t->start(domain, s1_, captured), slot);
}

TEST_F(AgentGpuTimer, SetUpFailureIsReportedOnceAndLeavesTheContextUntimed) {
  gpu_.fail_event_create_at = 10;
  auto t = timer();
  std::string error;
  EXPECT_EQ(t->domainOf(s1_, error), CudaEventTimer::kNoDomain);
  EXPECT_NE(error.find("cuEventCreate"), std::string::npos) << error;
  error.clear();
  EXPECT_EQ(t->domainOf(s2_, error), CudaEventTimer::kNoDomain);  // same context
  EXPECT_TRUE(error.empty()) << error;
  EXPECT_TRUE(gpu_.events.empty());  // what was created is destroyed again
}

TEST_F(AgentGpuTimer, OneDomainPerContextAndBounded) {
  auto t = timer({.pairs_per_domain = 2});
  for (std::uintptr_t i = 0; i <= CudaEventTimer::kMaxDomains; ++i)
    gpu_.contexts[reinterpret_cast<CUstream>(0x100 * (i + 1))] = contextObject(i + 1);
  for (int i = 0; i < CudaEventTimer::kMaxDomains; ++i)
    EXPECT_EQ(domainOf(*t, reinterpret_cast<CUstream>(0x100 * static_cast<std::uintptr_t>(i + 1))), i);
  EXPECT_EQ(domainOf(*t, s1_), 0);  // 0x100: context 1 again
  std::string error;
  EXPECT_EQ(t->domainOf(reinterpret_cast<CUstream>(0x100 * (CudaEventTimer::kMaxDomains + 1)), error),
            CudaEventTimer::kNoDomain);
  EXPECT_FALSE(error.empty());
  // A call in the second domain is timed with that domain's events.
  bool captured = false;
  const std::uint32_t slot = t->start(1, s2_, captured);
  ASSERT_NE(slot, 0u);
  EXPECT_EQ((slot - 1) / 2, 1u);
}

TEST_F(AgentGpuTimer, ReferencesAreRenewedAndAnOverwrittenOneFailsTheCall) {
  // The fake host clock: with the real one, a renewal the scheduler stretches past kReferenceWidthNs is
  // (rightly) not used, and the old reference would not have been overwritten after kReferences polls.
  auto t = timer({.pairs_per_domain = 8, .reference_interval_ns = 0, .host_clock_ns = hostClock});
  const int domain = domainOf(*t, s1_);
  bool captured = false;
  const std::uint32_t old_call = t->start(domain, s1_, captured);
  t->stop(old_call, s1_);
  for (std::uint32_t i = 0; i < CudaEventTimer::kReferences; ++i) t->poll();
  const std::uint32_t new_call = t->start(domain, s1_, captured);
  gpu_.launch(s1_, 1'000'000);
  t->stop(new_call, s1_);
  gpu_.advance(1'000'000);
  std::int64_t start = 0, end = 0;
  EXPECT_EQ(t->query(old_call - 1, start, end), GpuTimer::Status::Failed);
  ASSERT_EQ(t->query(new_call - 1, start, end), GpuTimer::Status::Ready);
  EXPECT_NEAR(static_cast<double>(end - start), 1e6, 1e3);
  EXPECT_EQ(gpu_.job_stream_syncs, 0);  // references are synchronised on the timer's own stream only
}

TEST_F(AgentGpuTimer, AReferenceReadTooWideIsNotUsed) {
  auto t = timer({.pairs_per_domain = 8, .reference_interval_ns = 0, .host_clock_ns = hostClock});
  const int domain = domainOf(*t, s1_);
  const std::int64_t set_up_at = gpu_.host_ns;
  bool captured = false;
  const std::uint32_t call = t->start(domain, s1_, captured);
  gpu_.launch(s1_, 1'000'000);
  t->stop(call, s1_);
  gpu_.advance(1'000'000);
  // Every renewal's host reads are one step too far apart: none replaces the set-up's reference, so the
  // call's reference survives a full round of polls.
  gpu_.host_step_ns = CudaEventTimer::kReferenceWidthNs + 1;
  for (std::uint32_t i = 0; i < CudaEventTimer::kReferences; ++i) t->poll();
  std::int64_t start = 0, end = 0;
  ASSERT_EQ(t->query(call - 1, start, end), GpuTimer::Status::Ready);
  EXPECT_NEAR(static_cast<double>(end - start), 1e6, 1e3);
  // The span is placed by the set-up's reference: within its host reads of the set-up time.
  EXPECT_NEAR(static_cast<double>(start), static_cast<double>(set_up_at), 1e6);
  // A read just narrow enough is used: a call started after it is timed against it.
  gpu_.host_step_ns = CudaEventTimer::kReferenceWidthNs;
  const std::int64_t renewed_before = gpu_.host_ns;
  t->poll();
  const std::uint32_t later = t->start(domain, s1_, captured);
  gpu_.launch(s1_, 2'000'000);
  t->stop(later, s1_);
  gpu_.advance(2'000'000);
  ASSERT_EQ(t->query(later - 1, start, end), GpuTimer::Status::Ready);
  EXPECT_NEAR(static_cast<double>(end - start), 2e6, 1e3);
  EXPECT_GE(start, renewed_before);
}

}  // namespace
}  // namespace gradscope::agent

// ---- CUPTI's records joined into spans (cupti_tracer.h) ------------------------------------------------

namespace gradscope::agent {
namespace {

TEST(AgentCuptiSpans, KernelsOfOneIdGiveMinStartToMaxEnd) {
  KernelSpans spans;
  spans.addExternal(7, 42);
  spans.addExternal(8, 42);  // a group: two kernels under one id
  spans.addKernel(7, 1000, 2000);
  spans.addKernel(8, 1500, 3000);
  std::uint64_t start = 0, end = 0;
  ASSERT_TRUE(spans.span(42, start, end));
  EXPECT_EQ(start, 1000u);
  EXPECT_EQ(end, 3000u);
  EXPECT_FALSE(spans.span(43, start, end));
  spans.forget(42);
  EXPECT_FALSE(spans.span(42, start, end));
}

TEST(AgentCuptiSpans, AKernelBeforeItsCorrelationWaits) {
  KernelSpans spans;
  spans.addKernel(9, 500, 600);  // delivered in an earlier buffer than its correlation
  std::uint64_t start = 0, end = 0;
  EXPECT_FALSE(spans.span(5, start, end));
  spans.addExternal(9, 5);
  ASSERT_TRUE(spans.span(5, start, end));
  EXPECT_EQ(start, 500u);
  EXPECT_EQ(end, 600u);
}

TEST(AgentCuptiSpans, ANewerIdReplacesTheOldOneInItsEntry) {
  KernelSpans spans;
  const std::uint64_t old_id = (std::uint64_t{1} << 32) | 3, new_id = (std::uint64_t{2} << 32) | 3;
  spans.addExternal(1, old_id);
  spans.addKernel(1, 10, 20);
  spans.addExternal(2, new_id);
  spans.addKernel(2, 30, 40);
  std::uint64_t start = 0, end = 0;
  EXPECT_FALSE(spans.span(old_id, start, end));
  ASSERT_TRUE(spans.span(new_id, start, end));
  EXPECT_EQ(start, 30u);
}

// A buffer of records as CUPTI lays them out, walked by a stand-in for cuptiActivityGetNextRecord.
cupti::CUptiResult nextRecord(std::uint8_t* buffer, std::size_t valid, cupti::CUpti_Activity** record) {
  std::uint8_t* next = buffer;
  if (*record != nullptr)
    next = reinterpret_cast<std::uint8_t*>(*record) +
           ((*record)->kind == cupti::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION
                ? sizeof(cupti::CUpti_ActivityExternalCorrelation)
                : cupti::kKernelRecordSize);
  if (next >= buffer + valid) return cupti::CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<cupti::CUpti_Activity*>(next);
  return cupti::CUPTI_SUCCESS;
}

// Records written as CUPTI lays them out, for parseActivityBuffer with nextRecord.
struct ActivityBuffer {
  alignas(8) std::uint8_t bytes[4 * cupti::kKernelRecordSize] = {};
  std::size_t used = 0;

  void external(std::uint32_t correlation, std::uint64_t id, cupti::CUpti_ExternalCorrelationKind kind) {
    cupti::CUpti_ActivityExternalCorrelation record{};
    record.kind = cupti::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    record.externalKind = kind;
    record.externalId = id;
    record.correlationId = correlation;
    std::memcpy(bytes + used, &record, sizeof record);
    used += sizeof record;
  }
  // `node`: the graph node that launched it, 0 for a kernel launched directly.
  void kernel(std::uint32_t correlation, const char* name, std::uint64_t start, std::uint64_t end,
              std::uint64_t node = 0) {
    cupti::KernelRecordHead record{};
    record.kind = cupti::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    record.correlationId = correlation;
    record.name = name;
    record.start = start;
    record.end = end;
    record.graphNodeId = node;
    std::memcpy(bytes + used, &record, sizeof record);
    used += cupti::kKernelRecordSize;
  }
  int parse(KernelSpans& spans, std::uint64_t flush = 0, WindowKernels* windows = nullptr) {
    cupti::Library library;
    library.activityGetNextRecord = &nextRecord;
    return parseActivityBuffer(library, bytes, used, spans, flush, windows);
  }
};

TEST(AgentCuptiSpans, ParsesNcclKernelsAndCustomCorrelationsOnly) {
  ActivityBuffer buffer;
  buffer.external(1, 77, cupti::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
  buffer.external(2, 88, static_cast<cupti::CUpti_ExternalCorrelationKind>(1));  // another tool's kind
  buffer.kernel(1, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 200);
  buffer.kernel(1, "vectorAdd", 50, 900);  // not NCCL's
  KernelSpans spans;
  EXPECT_EQ(buffer.parse(spans), 4);
  std::uint64_t start = 0, end = 0;
  ASSERT_TRUE(spans.span(77, start, end));
  EXPECT_EQ(start, 100u);
  EXPECT_EQ(end, 200u);
  EXPECT_FALSE(spans.span(88, start, end));
}

// ---- graph replays ----------------------------------------------------------------------------------------

std::vector<KernelSpans::Replay> takeAll(KernelSpans& spans, std::uint64_t last_flush = UINT64_MAX) {
  std::vector<KernelSpans::Replay> out;
  spans.takeReplays(last_flush, out);
  return out;
}

// (capture, launch, start, end) of a replay.
std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t> fields(const KernelSpans::Replay& r) {
  return {r.capture, r.launch, r.start, r.end};
}
using Fields = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;

TEST(AgentCuptiGraphs, KernelsOfCopiedNodesJoinPerLaunchInLaunchOrder) {
  KernelSpans spans;
  spans.addGraphNode(10, 1);     // capture 1 made node 10 (the call) ...
  spans.addGraphNode(11, 1);     // ... and node 11 (a second stream of its group)
  spans.cloneGraphNode(10, 20);  // instantiation copied them
  spans.cloneGraphNode(11, 21);
  spans.cloneGraphNode(99, 22);  // a node of someone else's graph: not ours
  EXPECT_FALSE(spans.addGraphKernel(22, 5, 0, 1, 0));
  EXPECT_FALSE(spans.addGraphKernel(0, 5, 0, 1, 0));
  // Launch 7 delivered before launch 5 (another buffer first); launch 5's kernels on two streams.
  EXPECT_TRUE(spans.addGraphKernel(20, 7, 700, 800, 0));
  EXPECT_TRUE(spans.addGraphKernel(20, 5, 100, 200, 0));
  EXPECT_TRUE(spans.addGraphKernel(21, 5, 150, 260, 0));
  // The original nodes' ids serve too (a graph launched as captured, without a copy, e.g. by a driver
  // that reports the original).
  EXPECT_TRUE(spans.addGraphKernel(11, 9, 900, 950, 0));
  const auto replays = takeAll(spans);
  ASSERT_EQ(replays.size(), 3u);
  EXPECT_EQ(fields(replays[0]), Fields(1, 5, 100, 260));
  EXPECT_EQ(fields(replays[1]), Fields(1, 7, 700, 800));
  EXPECT_EQ(fields(replays[2]), Fields(1, 9, 900, 950));
  EXPECT_TRUE(takeAll(spans).empty()) << "taken replays are forgotten";
}

TEST(AgentCuptiGraphs, AReplayIsTakenOnlyAfterAFlushWithoutItsKernels) {
  KernelSpans spans;
  spans.addGraphNode(10, 3);
  spans.addGraphKernel(10, 1, 100, 200, /*flush=*/4);
  spans.addGraphKernel(10, 2, 300, 400, /*flush=*/5);
  // After flush 5, flush 4's replay is complete; flush 5's may get more kernels.
  auto replays = takeAll(spans, 4);
  ASSERT_EQ(replays.size(), 1u);
  EXPECT_EQ(fields(replays[0]), Fields(3, 1, 100, 200));
  spans.addGraphKernel(10, 2, 250, 420, /*flush=*/6);
  EXPECT_TRUE(takeAll(spans, 5).empty());
  replays = takeAll(spans, 6);
  ASSERT_EQ(replays.size(), 1u);
  EXPECT_EQ(fields(replays[0]), Fields(3, 2, 250, 420));
}

TEST(AgentCuptiGraphs, BoundedReplaysInProgressCountWhatTheyLose) {
  KernelSpans spans;
  spans.addGraphNode(10, 1);
  for (std::uint32_t launch = 1; launch <= KernelSpans::kReplays + 5; ++launch)
    EXPECT_TRUE(spans.addGraphKernel(10, launch, launch, launch + 1, 0));
  EXPECT_EQ(spans.replayDrops(), 5u);
  EXPECT_EQ(takeAll(spans).size(), KernelSpans::kReplays);
  // A newer node in the same entry of the node table replaces the older one.
  spans.addGraphNode(10 + KernelSpans::kGraphNodes, 2);
  EXPECT_FALSE(spans.addGraphKernel(10, 1, 0, 1, 0));
}

TEST(AgentCuptiGraphs, GraphKernelsInABufferGoToTheReplays) {
  ActivityBuffer buffer;
  buffer.kernel(41, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 200, /*node=*/20);
  buffer.kernel(41, "vectorAdd", 50, 900, 20);                             // not NCCL's
  buffer.kernel(42, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 400);  // not a graph's
  KernelSpans spans;
  spans.addGraphNode(20, 6);
  spans.addExternal(42, 77);
  EXPECT_EQ(buffer.parse(spans, /*flush=*/3), 3);
  const auto replays = takeAll(spans);
  ASSERT_EQ(replays.size(), 1u);
  EXPECT_EQ(fields(replays[0]), Fields(6, 41, 100, 200));
  EXPECT_EQ(replays[0].flush, 3u);
  std::uint64_t start = 0, end = 0;
  ASSERT_TRUE(spans.span(77, start, end));
  EXPECT_EQ(start, 300u);
}

// ---- the sampled windows' kernels (cupti_tracer.h, "Windows") -------------------------------------------

using Row = WindowKernels::Row;
std::vector<std::tuple<storage::GpuActivityKind, std::uint64_t, std::uint64_t, std::int64_t>> rowsOf(
    const std::vector<Row>& rows) {
  std::vector<std::tuple<storage::GpuActivityKind, std::uint64_t, std::uint64_t, std::int64_t>> out;
  for (const Row& row : rows) out.emplace_back(row.kind, row.start, row.end, row.kernels);
  return out;
}
constexpr auto kWindow = storage::GpuActivityKind::Window, kCompute = storage::GpuActivityKind::Compute,
               kNccl = storage::GpuActivityKind::Nccl;

TEST(AgentCuptiWindows, KeepsTheKernelsThatRanInsideAWindowAsUnionsPerKind) {
  WindowKernels windows;
  windows.addKernel(10, 20, false);  // before any window
  ASSERT_TRUE(windows.open(100));
  EXPECT_FALSE(windows.open(110));     // one at a time
  windows.addKernel(90, 150, false);   // running when it opened: kept
  windows.addKernel(160, 200, false);  // touches the next: one interval of two kernels
  windows.addKernel(200, 260, false);
  windows.addKernel(300, 320, false);
  windows.addKernel(150, 210, true);
  windows.addKernel(180, 190, true);  // inside the previous
  windows.close(400, /*flush=*/5);
  windows.addKernel(390, 450, true);   // started before the close: kept whole
  windows.addKernel(400, 420, false);  // after it: not
  std::vector<Row> rows;
  windows.take(4, rows);  // its last kernels may still come
  EXPECT_TRUE(rows.empty());
  windows.take(5, rows);
  EXPECT_EQ(rowsOf(rows), (decltype(rowsOf(rows)){{kWindow, 100, 400, 0},
                                                  {kCompute, 90, 150, 1},
                                                  {kCompute, 160, 260, 2},
                                                  {kCompute, 300, 320, 1},
                                                  {kNccl, 150, 210, 2},
                                                  {kNccl, 390, 450, 1}}));
  rows.clear();
  windows.take(100, rows);
  EXPECT_TRUE(rows.empty());  // taken once
  EXPECT_EQ(windows.drops(), 0u);
}

TEST(AgentCuptiWindows, KernelsGoToTheWindowTheyRanInAndTheTableIsBounded) {
  WindowKernels windows;
  ASSERT_TRUE(windows.open(100));
  windows.close(200, 1);
  ASSERT_TRUE(windows.open(300));
  windows.addKernel(150, 160, false);  // the first window's, delivered late
  windows.addKernel(250, 260, false);  // between the two: neither's
  windows.addKernel(310, 320, true);
  windows.close(400, 2);
  std::vector<Row> rows;
  windows.take(1, rows);
  EXPECT_EQ(rowsOf(rows), (decltype(rowsOf(rows)){{kWindow, 100, 200, 0}, {kCompute, 150, 160, 1}}));
  rows.clear();
  windows.take(2, rows);
  EXPECT_EQ(rowsOf(rows), (decltype(rowsOf(rows)){{kWindow, 300, 400, 0}, {kNccl, 310, 320, 1}}));

  // At most kMaxKernels kept over the windows not yet taken: the rest are counted.
  ASSERT_TRUE(windows.open(1000));
  for (std::size_t i = 0; i < WindowKernels::kMaxKernels + 3; ++i)
    windows.addKernel(1000 + i, 1001 + i, false);
  EXPECT_EQ(windows.drops(), 3u);
  // At most kMaxWindows open or waiting: a window over the bound is not opened.
  windows.close(5'000'000, 3);
  for (std::size_t i = 1; i < WindowKernels::kMaxWindows; ++i) {
    ASSERT_TRUE(windows.open(10'000'000 + i * 10));
    windows.close(10'000'000 + i * 10 + 5, 3);
  }
  EXPECT_FALSE(windows.open(20'000'000));
  rows.clear();
  windows.take(3, rows);
  EXPECT_EQ(std::count_if(rows.begin(), rows.end(), [](const Row& row) { return row.kind == kWindow; }),
            static_cast<std::ptrdiff_t>(WindowKernels::kMaxWindows));
  EXPECT_TRUE(windows.open(20'000'000));
}

// A compute kernel takes the NVTX range its launch was made in (a CUSTOM1 correlation, which may arrive
// after the kernel): one union per range; unnamed kernels and NCCL's have range 0.
TEST(AgentCuptiWindows, ComputeKernelsAreUnitedPerNvtxRange) {
  WindowKernels windows;
  ASSERT_TRUE(windows.open(0));
  windows.addKernel(10, 20, false, /*correlation=*/1);
  windows.addKernel(20, 30, false, 2);
  windows.addKernel(25, 40, false, 3);  // unnamed, overlapping the others
  windows.addKernel(50, 60, true, 4);
  windows.addRange(1, 7);
  windows.addRange(2, 7);
  windows.addRange(4, 9);  // NCCL's kernels keep no range
  windows.close(100, 0);
  std::vector<Row> rows;
  windows.take(0, rows);
  std::vector<std::tuple<storage::GpuActivityKind, std::uint64_t, std::uint64_t, std::uint32_t>> got;
  for (const Row& row : rows) got.emplace_back(row.kind, row.start, row.end, row.range);
  EXPECT_EQ(got,
            (decltype(got){
                {kWindow, 0, 100, 0}, {kCompute, 25, 40, 0}, {kCompute, 10, 30, 7}, {kNccl, 50, 60, 0}}));
}

// In a buffer, every kernel (NCCL's or not) is offered to the windows; only NCCL's make call spans.
TEST(AgentCuptiWindows, ABufferOffersEveryKernelToTheWindows) {
  ActivityBuffer buffer;
  buffer.kernel(1, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 200);
  buffer.kernel(2, "vectorAdd", 50, 900);
  KernelSpans spans;
  WindowKernels windows;
  ASSERT_TRUE(windows.open(0));
  windows.close(1000, 0);
  EXPECT_EQ(buffer.parse(spans, 0, &windows), 2);
  std::vector<Row> rows;
  windows.take(0, rows);
  EXPECT_EQ(rowsOf(rows),
            (decltype(rowsOf(rows)){{kWindow, 0, 1000, 0}, {kCompute, 50, 900, 1}, {kNccl, 100, 200, 1}}));
}

}  // namespace
}  // namespace gradscope::agent
