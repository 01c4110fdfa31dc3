// A one-rank NCCL job that makes every NCCL call the agent interposes, for the agent's tests:
// check_nccl.py runs it with and without the agent and compares its output and the trace with the
// calls listed in check_nccl.py (keep the two in step).
//
// Two builds of the same source:
// - against the fake NCCL (libgradscope-fake-nccl.so) on host memory, with no CUDA at all: streams are
//   plain handles, and the fake driver (when the test loads it) times them;
// - with GRADSCOPE_JOB_REAL_NCCL, against the real NCCL and CUDA runtime on one GPU (scripts/gpu_check.sh).
// With GRADSCOPE_JOB_NVTX the steps are marked with NVTX ranges named "step" (NVTX v3, header-only).
//
// Prints one line per result buffer: what it was and a checksum of its bytes. Exit status 0, or 1 with
// the failing call on stderr.
//
// The functions NCCL 2.28 added (ncclAlltoAll, ncclGather, ncclScatter) are called only when
// ncclGetVersion says 2.28 or later, as a job built for several NCCL versions does. --probe-newer (fake
// NCCL only): at the end, look ncclAlltoAll up as a job probing for it would (dlsym), call it twice if
// found and say on stderr what it returned: on the fake NCCL 2.27 under the agent that is the agent's
// wrapper, whose library lacks the function (check_nccl.py old-nccl).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#ifdef GRADSCOPE_JOB_REAL_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#else
#include <dlfcn.h>

#include "core/nccl_types.h"
using namespace gradscope::agent::nccl;
#define NCCL_SPLIT_NOCOLOR kSplitNoColor
extern "C" {
#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS) RESULT NAME PARAMS;
#include "interpose/nccl_functions.def"
#undef GS_NCCL_FUNCTION
}
#endif

#ifdef GRADSCOPE_JOB_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace {

// The graph of the captured all-reduce is launched this often (check_nccl.py GRAPH_LAUNCHES).
constexpr int kGraphLaunches = 3;

[[noreturn]] void fail(const char* what, const char* detail) {
  std::fprintf(stderr, "nccl_job: %s failed: %s\n", what, detail);
  std::exit(1);
}

void check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) fail(what, ncclGetErrorString(rc));
}

// ---- device memory and streams ------------------------------------------------------------------------

#ifdef GRADSCOPE_JOB_REAL_NCCL
void checkCuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) fail(what, cudaGetErrorString(rc));
}
void* deviceAlloc(std::size_t bytes) {
  void* p = nullptr;
  checkCuda(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
void deviceFree(void* p) {
  checkCuda(cudaFree(p), "cudaFree");
}
void upload(void* to, const void* from, std::size_t bytes) {
  checkCuda(cudaMemcpy(to, from, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}
void download(void* to, const void* from, std::size_t bytes) {
  checkCuda(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}
cudaStream_t newStream() {
  cudaStream_t stream = nullptr;
  checkCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return stream;
}
void synchronize(cudaStream_t stream) {
  checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}
// Captures what `enqueue` puts on `stream` into a CUDA graph, then runs the graph kGraphLaunches times.
template <typename Enqueue>
void captured(cudaStream_t stream, Enqueue&& enqueue) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  checkCuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  enqueue();
  checkCuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  checkCuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int i = 0; i < kGraphLaunches; ++i) checkCuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  synchronize(stream);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}
#else
void* deviceAlloc(std::size_t bytes) {
  void* p = std::calloc(1, bytes);
  if (p == nullptr) fail("calloc", "out of memory");
  return p;
}
void deviceFree(void* p) {
  std::free(p);
}
void upload(void* to, const void* from, std::size_t bytes) {
  std::memcpy(to, from, bytes);
}
void download(void* to, const void* from, std::size_t bytes) {
  std::memcpy(to, from, bytes);
}
// The fake driver's functions, when the test loaded it (through the fake NCCL).
template <typename Function>
Function fakeDriver(const char* name) {
  return reinterpret_cast<Function>(dlsym(RTLD_DEFAULT, name));
}
cudaStream_t newStream() {
  static int tokens[8];
  static int used = 0;
  return reinterpret_cast<cudaStream_t>(&tokens[used++]);
}
void synchronize(cudaStream_t stream) {
  if (auto sync = fakeDriver<int (*)(cudaStream_t)>("cuStreamSynchronize")) sync(stream);
}
template <typename Enqueue>
void captured(cudaStream_t stream, Enqueue&& enqueue) {
  auto begin = fakeDriver<int (*)(cudaStream_t, int)>("cuStreamBeginCapture_v2");
  auto end = fakeDriver<int (*)(cudaStream_t, void**)>("cuStreamEndCapture");
  auto instantiate = fakeDriver<int (*)(void**, void*, unsigned long long)>("cuGraphInstantiateWithFlags");
  auto launch = fakeDriver<int (*)(void*, cudaStream_t)>("cuGraphLaunch");
  auto destroy_exec = fakeDriver<int (*)(void*)>("cuGraphExecDestroy");
  auto destroy = fakeDriver<int (*)(void*)>("cuGraphDestroy");
  if (begin == nullptr) return enqueue();  // no fake driver: nothing is captured
  void* graph = nullptr;
  void* exec = nullptr;
  begin(stream, 0);
  enqueue();
  end(stream, &graph);
  instantiate(&exec, graph, 0);
  for (int i = 0; i < kGraphLaunches; ++i) launch(exec, stream);
  synchronize(stream);
  destroy_exec(exec);
  destroy(graph);
}
#endif

// ---- buffers ---------------------------------------------------------------------------------------------

std::size_t elementSize(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}

// A send buffer with distinct, exactly representable contents and a receive buffer, on the device.
struct Buffers {
  Buffers(const char* label, std::size_t send_elements, std::size_t recv_elements, ncclDataType_t type)
      : name(label), bytes(recv_elements * elementSize(type)) {
    const std::size_t send_bytes = send_elements * elementSize(type);
    std::vector<unsigned char> host(send_bytes);
    // Small integers in every element type: bytes 0..63 keep floats finite and bf16/fp16 exact.
    for (std::size_t i = 0; i < send_bytes; ++i) host[i] = static_cast<unsigned char>((i * 37 + 11) % 64);
    send = deviceAlloc(send_bytes);
    recv = deviceAlloc(bytes);
    upload(send, host.data(), send_bytes);
  }
  ~Buffers() {
    deviceFree(send);
    deviceFree(recv);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  void print() const {
    std::vector<unsigned char> host(bytes);
    download(host.data(), recv, bytes);
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < bytes; ++i) sum = sum * 31 + host[i];
    std::printf("%-28s %8zu bytes  checksum %016llx\n", name, bytes, static_cast<unsigned long long>(sum));
  }

  const char* name;
  std::size_t bytes;
  void* send = nullptr;
  void* recv = nullptr;
};

// ---- steps ----------------------------------------------------------------------------------------------

constexpr int kSteps = 3;

// Step s starts with a push of the range "step", in one of NVTX's three forms, and has a nested range
// of another name that must not count as a step.
void startStep([[maybe_unused]] int step) {
#ifdef GRADSCOPE_JOB_NVTX
  if (step % 3 == 0) {
    nvtxRangePushA("step");
  } else if (step % 3 == 1) {
    nvtxEventAttributes_t attributes = {};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = "step";
    nvtxRangePushEx(&attributes);
  } else {
    nvtxRangePushW(L"step");
  }
  nvtxRangePushA("forward");
  nvtxRangePop();
#endif
}

void endStep() {
#ifdef GRADSCOPE_JOB_NVTX
  nvtxRangePop();
#endif
}

}  // namespace

int main(int argc, char** argv) {
  [[maybe_unused]] bool probe_newer = false;  // the fake NCCL only
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--probe-newer") probe_newer = true;
    else fail("arguments", argv[i]);
  }
  cudaStream_t first = newStream();
  cudaStream_t second = newStream();

  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, 1, id, 0), "ncclCommInitRank");

  Buffers f32("allreduce fp32 1000", 1000, 1000, ncclFloat32);
  Buffers f64("allreduce fp64 10 max", 10, 10, ncclFloat64);
  Buffers i32("allreduce int32 4096", 4096, 4096, ncclInt32);
  Buffers bf16("allreduce bf16 2048 avg", 2048, 2048, ncclBfloat16);
  Buffers group_a("group allreduce fp32 256", 256, 256, ncclFloat32);
  Buffers group_b("group allreduce fp32 512", 512, 512, ncclFloat32);
  Buffers group_c("group broadcast int8 100", 100, 100, ncclInt8);
  for (int step = 0; step < kSteps; ++step) {
    startStep(step);
    check(ncclAllReduce(f32.send, f32.recv, 1000, ncclFloat32, ncclSum, comm, first), "ncclAllReduce");
    check(ncclAllReduce(f64.send, f64.recv, 10, ncclFloat64, ncclMax, comm, first), "ncclAllReduce");
    check(ncclAllReduce(i32.send, i32.recv, 4096, ncclInt32, ncclSum, comm, second), "ncclAllReduce");
    check(ncclAllReduce(bf16.send, bf16.recv, 2048, ncclBfloat16, ncclAvg, comm, first), "ncclAllReduce");
    check(ncclGroupStart(), "ncclGroupStart");
    check(ncclAllReduce(group_a.send, group_a.recv, 256, ncclFloat32, ncclSum, comm, first), "ncclAllReduce");
    check(ncclGroupStart(), "ncclGroupStart");  // nested: still one group
    check(ncclAllReduce(group_b.send, group_b.recv, 512, ncclFloat32, ncclProd, comm, first),
          "ncclAllReduce");
    check(ncclGroupEnd(), "ncclGroupEnd");
    check(ncclBroadcast(group_c.send, group_c.recv, 100, ncclInt8, 0, comm, first), "ncclBroadcast");
    check(ncclGroupEnd(), "ncclGroupEnd");
    endStep();
  }

  Buffers reduce_scatter("reducescatter fp32 64", 64, 64, ncclFloat32);
  Buffers all_gather("allgather fp32 32", 32, 32, ncclFloat32);
  Buffers broadcast("broadcast uint8 200", 200, 200, ncclUint8);
  Buffers reduce("reduce fp64 16 min", 16, 16, ncclFloat64);
  Buffers graph("captured allreduce fp32 128", 128, 128, ncclFloat32);
  Buffers graph_a("captured group allreduce fp32 64", 64, 64, ncclFloat32);
  Buffers graph_b("captured group allreduce fp32 32", 32, 32, ncclFloat32);
  check(ncclReduceScatter(reduce_scatter.send, reduce_scatter.recv, 64, ncclFloat32, ncclSum, comm, first),
        "ncclReduceScatter");
  check(ncclAllGather(all_gather.send, all_gather.recv, 32, ncclFloat32, comm, first), "ncclAllGather");
  check(ncclBroadcast(broadcast.send, broadcast.recv, 200, ncclUint8, 0, comm, second), "ncclBroadcast");
  check(ncclReduce(reduce.send, reduce.recv, 16, ncclFloat64, ncclMin, 0, comm, first), "ncclReduce");

  // Point-to-point: two sends to this rank itself and their receives in one group (NCCL needs both sides
  // of an exchange with itself in one group). One stream: a group on several spans from the earliest
  // stream's start to the latest one's end, which the test cannot predict exactly.
  Buffers exchange_a("send/recv fp32 300", 300, 300, ncclFloat32);
  Buffers exchange_b("send/recv int32 50", 50, 50, ncclInt32);
  check(ncclGroupStart(), "ncclGroupStart");
  check(ncclSend(exchange_a.send, 300, ncclFloat32, 0, comm, first), "ncclSend");
  check(ncclSend(exchange_b.send, 50, ncclInt32, 0, comm, first), "ncclSend");
  check(ncclRecv(exchange_a.recv, 300, ncclFloat32, 0, comm, first), "ncclRecv");
  check(ncclRecv(exchange_b.recv, 50, ncclInt32, 0, comm, first), "ncclRecv");
  check(ncclGroupEnd(), "ncclGroupEnd");
  int version = 0;
  check(ncclGetVersion(&version), "ncclGetVersion");
  const bool has_2_28 = version >= 22800;
  Buffers all_to_all("alltoall fp32 16", 16, 16, ncclFloat32);
  Buffers gather("gather fp32 8", 8, 8, ncclFloat32);
  Buffers scatter("scatter fp32 8", 8, 8, ncclFloat32);
#if !defined(GRADSCOPE_JOB_REAL_NCCL) || NCCL_VERSION_CODE >= 22800
  if (has_2_28) {
    check(ncclAlltoAll(all_to_all.send, all_to_all.recv, 16, ncclFloat32, comm, first), "ncclAlltoAll");
    check(ncclGather(gather.send, gather.recv, 8, ncclFloat32, 0, comm, first), "ncclGather");
    check(ncclScatter(scatter.send, scatter.recv, 8, ncclFloat32, 0, comm, second), "ncclScatter");
  }
#endif
  synchronize(first);
  synchronize(second);
  // One graph: a call, then a group of two (each launch runs the three kernels).
  captured(first, [&] {
    check(ncclAllReduce(graph.send, graph.recv, 128, ncclFloat32, ncclSum, comm, first), "ncclAllReduce");
    check(ncclGroupStart(), "ncclGroupStart");
    check(ncclAllReduce(graph_a.send, graph_a.recv, 64, ncclFloat32, ncclSum, comm, first), "ncclAllReduce");
    check(ncclAllReduce(graph_b.send, graph_b.recv, 32, ncclFloat32, ncclSum, comm, first), "ncclAllReduce");
    check(ncclGroupEnd(), "ncclGroupEnd");
  });

  // A split (colour 3), and one this rank stays out of.
  ncclComm_t child = nullptr, none = nullptr;
  check(ncclCommSplit(comm, 3, 0, &child, nullptr), "ncclCommSplit");
  check(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr), "ncclCommSplit");
  if (child == nullptr || none != nullptr) fail("ncclCommSplit", "unexpected communicators");
  Buffers split("split allreduce fp32 8", 8, 8, ncclFloat32);
  check(ncclAllReduce(split.send, split.recv, 8, ncclFloat32, ncclSum, child, first), "ncclAllReduce");

  // ncclCommInitAll over the one device, and ncclCommInitRankConfig with NCCL's default configuration.
  ncclComm_t all = nullptr;
  const int devices[] = {0};
  check(ncclCommInitAll(&all, 1, devices), "ncclCommInitAll");
  Buffers init_all("initall allreduce fp32 4", 4, 4, ncclFloat32);
  check(ncclAllReduce(init_all.send, init_all.recv, 4, ncclFloat32, ncclSum, all, first), "ncclAllReduce");
  ncclUniqueId config_id;
  check(ncclGetUniqueId(&config_id), "ncclGetUniqueId");
  ncclComm_t configured = nullptr;
  check(ncclCommInitRankConfig(&configured, 1, config_id, 0, nullptr), "ncclCommInitRankConfig");
  Buffers config("config allreduce fp32 16", 16, 16, ncclFloat32);
  check(ncclAllReduce(config.send, config.recv, 16, ncclFloat32, ncclSum, configured, first),
        "ncclAllReduce");
#ifndef GRADSCOPE_JOB_REAL_NCCL
  // The fake NCCL only: one process holding both ranks of a two-rank communicator (as with one thread
  // per GPU), whose collectives the fake runs locally. Checks the keys of ranks sharing a process and
  // the bytes of a reduce-scatter over more than one rank.
  ncclComm_t pair[2] = {nullptr, nullptr};
  const int two_devices[] = {0, 1};
  check(ncclCommInitAll(pair, 2, two_devices), "ncclCommInitAll");
  // Both ranks' sides of two exchanges (the fake passes messages between them): a send and its receive
  // on their own, then a group of two sends and two receives, one each way. The collectives after them
  // are still their communicators' first.
  Buffers pair_single("pair send/recv fp64 12", 12, 12, ncclFloat64);
  Buffers pair_up("pair group send/recv fp32 40", 40, 40, ncclFloat32);
  Buffers pair_down("pair group send/recv bf16 24", 24, 24, ncclBfloat16);
  check(ncclSend(pair_single.send, 12, ncclFloat64, 1, pair[0], first), "ncclSend");
  check(ncclRecv(pair_single.recv, 12, ncclFloat64, 0, pair[1], second), "ncclRecv");
  check(ncclGroupStart(), "ncclGroupStart");
  check(ncclSend(pair_up.send, 40, ncclFloat32, 1, pair[0], first), "ncclSend");
  check(ncclSend(pair_down.send, 24, ncclBfloat16, 0, pair[1], first), "ncclSend");
  check(ncclRecv(pair_down.recv, 24, ncclBfloat16, 1, pair[0], first), "ncclRecv");
  check(ncclRecv(pair_up.recv, 40, ncclFloat32, 0, pair[1], first), "ncclRecv");
  check(ncclGroupEnd(), "ncclGroupEnd");
  pair_single.print();
  pair_up.print();
  pair_down.print();
  Buffers pair_scatter("pair reducescatter fp32 8", 16, 8, ncclFloat32);
  Buffers pair_gather("pair allgather fp32 8", 8, 8, ncclFloat32);
  check(ncclReduceScatter(pair_scatter.send, pair_scatter.recv, 8, ncclFloat32, ncclSum, pair[1], first),
        "ncclReduceScatter");
  check(ncclAllGather(pair_gather.send, pair_gather.recv, 8, ncclFloat32, pair[0], first), "ncclAllGather");
  pair_scatter.print();
  pair_gather.print();
  check(ncclCommDestroy(pair[0]), "ncclCommDestroy");
  check(ncclCommDestroy(pair[1]), "ncclCommDestroy");
#endif
  synchronize(first);
  synchronize(second);

  for (const Buffers* buffers :
       {&f32, &f64, &i32, &bf16, &group_a, &group_b, &group_c, &reduce_scatter, &all_gather, &broadcast,
        &reduce, &exchange_a, &exchange_b, &graph, &split, &init_all, &config})
    buffers->print();
  if (has_2_28)
    for (const Buffers* buffers : {&all_to_all, &gather, &scatter}) buffers->print();
#ifndef GRADSCOPE_JOB_REAL_NCCL
  if (probe_newer) {
    using AlltoAll = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    const auto alltoall = reinterpret_cast<AlltoAll>(dlsym(RTLD_DEFAULT, "ncclAlltoAll"));
    if (alltoall == nullptr) std::fprintf(stderr, "nccl_job: no ncclAlltoAll\n");
    for (int i = 0; i < 2 && alltoall != nullptr; ++i) {
      const ncclResult_t rc = alltoall(all_to_all.send, all_to_all.recv, 16, ncclFloat32, comm, first);
      std::fprintf(stderr, "nccl_job: ncclAlltoAll returned %d\n", static_cast<int>(rc));
    }
  }
#endif

  check(ncclCommDestroy(child), "ncclCommDestroy");
  check(ncclCommDestroy(all), "ncclCommDestroy");
  check(ncclCommAbort(configured), "ncclCommAbort");
  check(ncclCommDestroy(comm), "ncclCommDestroy");
  std::printf("nccl_job: done\n");
  return 0;
}
