// libgradscope-fake-nccl.so: a one-rank NCCL on host memory, for testing the agent's NCCL interposer on
// machines without a GPU. Like libnccl.so.2 it exports every API function of
// agent/interpose/nccl_functions.def twice, as a strong pncclX (the implementation) and a weak ncclX alias,
// with NCCL 2.28's signatures (nccl_abi/nccl.h, checked against nccl.h by nccl_abi/abi_check.cc).
//
// Semantics: communicators have one rank (ncclCommInitAll and ncclCommSplit included), so every
// collective copies its send buffer to its receive buffer (this rank's own block, where a buffer holds
// one per rank). A send puts a copy of its buffer in a mailbox per (communicator, sender, receiver); a
// receive takes the oldest message of its mailbox, so one process can hold both sides (a rank sending to
// itself, or both ranks of an ncclCommInitAll communicator), and a receive without a message is an error
// (NCCL would wait for ever). Inside ncclGroupStart/End the calls are queued and run at the outermost
// ncclGroupEnd, as NCCL launches them: the collectives, then the sends, then the receives, so that a
// group may hold both sides of an exchange. ncclGetUniqueId is deterministic: byte i of the n-th id (from
// 0) is (7·i + 13·n) mod 256, so tests can compute the agent's communicator keys. ncclGetVersion says
// 2.28.9.
//
// GRADSCOPE_FAKE_NCCL_2_27 (the same source built into the folder fake-nccl-2.27): an NCCL older than the
// agent's table, without the functions NCCL 2.28 added (ncclAlltoAll, ncclGather, ncclScatter;
// nccl_functions.def), saying 2.27.7.
//
// Fake GPU: when GRADSCOPE_FAKE_CUDA names the fake driver (fake_cuda.cc), the first communicator
// loads it (as NCCL loads libcuda through the CUDA runtime) and every call (collective, send or receive)
// queues a kernel of GRADSCOPE_FAKE_KERNEL_NS nanoseconds (default 1 ms) on its stream.
//
// Profiler plugin: loaded and driven the way NCCL 2.28 does (src/plugin/profiler.cc; declarations in
// nccl_abi/include/nccl_abi/profiler.h). NCCL_PROFILER_PLUGIN names it ("none" disables it; unset:
// libnccl-profiler.so): dlopen of the name as given, then of libnccl-profiler-<name>.so; ncclProfiler_v5,
// else ncclProfiler_v4 (GRADSCOPE_FAKE_PROFILER_V4=1 skips v5). Loaded at every communicator's creation
// (reference counted; dlclosed at the last finalize), init per communicator with commHash = FNV-1a of
// its unique id (splits and ncclCommInitAll: of the parent's hash and the colour, of the call's ordinal),
// on the creating thread. A launch (a call outside a group, or the outermost ncclGroupEnd) starts, per
// communicator, a Group event and a Coll event per collective — in NCCL's order, largest first — with
// the algorithm, protocol and channels chosen for it (below), runs the work, stops them, and hands each
// Coll to a proxy thread that starts and stops a ProxyOp and a KernelCh event per channel (KernelCh with
// ncclProfilerKernelChStop), after the Coll's stop as NCCL's proxy does. ncclCommDestroy waits for that
// proxy work, then finalizes the context.
//
// Tuner plugin: loaded and driven the way NCCL 2.28 does (src/plugin/tuner.cc, src/plugin/plugin_open.cc,
// ncclGetAlgoInfo in src/enqueue.cc and topoGetAlgoInfo; declarations in nccl_abi/include/nccl_abi/tuner.h).
// At every communicator's creation, NCCL_TUNER_PLUGIN is read ("none" disables; unset:
// libnccl-tuner.so): dlopen of the value as given, then — when it has no '/' and is not already a
// lib*.so name — of libnccl-tuner-<name>.so; ncclTunerPlugin_v5, else _v4, else _v3
// (GRADSCOPE_FAKE_TUNER_VERSION=4 or 3 skips the newer symbols; v2 is not emulated and counts as
// unsupported). A failed load is not retried for the process's life, as in NCCL; a loaded library is
// reference counted per communicator and dlclosed with the last one. init runs per communicator on the
// creating thread (v5: commId = the commHash above, nRanks, nNodes = 1, the logger, NVLink domain info
// {1 domain of nRanks}, zeroed constants; v4/v3: nRanks, nNodes, logger, ctx); an error from it fails the
// communicator's creation. Per collective task (numPipeOps 1: the fake does not aggregate, regBuff 0) the
// fake computes a float[7][3] cost table (costTable below: fakeChoice's entry cheapest, the other Tree and
// Ring entries dearer, CollNet/NVLS/NVLSTree/PAT −1, unusable on one node, and −1 for what NCCL_ALGO /
// NCCL_PROTO exclude, as "^LL128" or "ring,tree" lists) and calls getCollInfo with it,
// nBytes as NCCL sizes the operation and *nChannels = 0. The choice is the smallest entry >= 0, the first
// in algorithm-major order on ties; channels are *nChannels when the tuner set it > 0 (at most 32,
// NCCL's MAXCHANNELS), else fakeChoice's. A getCollInfo error leaves the call to the default table (the
// contract of nccl_abi/tuner.h); a table with no usable entry fails the launch with ncclInternalError, like
// NCCL's "no algorithm/protocol available". finalize (destroy before v5) at ncclCommDestroy/Abort.
// Without a tuner, or with one that leaves the table alone, every choice is fakeChoice's (check_nccl.py's
// fake_choice mirrors it). The logger given to both plugins prints NCCL-style lines
// ("host:pid:tid [dev] NCCL WARN ..." / "NCCL INFO ...") to stderr when NCCL_DEBUG allows the level
// (VERSION, WARN, INFO, TRACE) and, for INFO, NCCL_DEBUG_SUBSYS the subsystem (default INIT,BOOTSTRAP,ENV;
// ALL, ^ to invert); real NCCL writes to stdout unless NCCL_DEBUG_FILE says otherwise, the fake uses
// stderr so that the job's stdout stays comparable.

#include <dlfcn.h>
#include <link.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/nccl_types.h"
#include "nccl_abi/profiler.h"
#include "nccl_abi/tuner.h"

using namespace gradscope::agent::nccl;

struct gradscope::agent::nccl::ncclComm {
  int nranks = 1;
  int rank = 0;
  int device = 0;
  std::uint64_t hash = 0;     // NCCL's commHash
  void* profiler = nullptr;   // the plugin's context (nullptr: none, or its init failed)
  std::uint64_t seq[5] = {};  // NCCL's comm->seqNumber, per function (nccl_abi/profiler.h)
  int tuner_version = 0;      // 5, 4 or 3: the loaded tuner's table this communicator uses; 0: none
  void* tuner = nullptr;      // the tuner's context (comm->tunerContext)
};

namespace {

using Launch = void (*)(cudaStream_t stream, std::int64_t duration_ns);
Launch g_launch = nullptr;
std::int64_t g_kernel_ns = 1'000'000;

void loadFakeCuda() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("GRADSCOPE_FAKE_CUDA");
    if (path == nullptr || *path == '\0') return;
    void* library = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr) return;
    g_launch = reinterpret_cast<Launch>(dlsym(library, "fakeCudaLaunch"));
    if (const char* ns = std::getenv("GRADSCOPE_FAKE_KERNEL_NS")) g_kernel_ns = std::atoll(ns);
  });
}

std::size_t sizeOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

// ---- the profiler plugin ------------------------------------------------------------------------------

std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t hash = 0xcbf29ce484222325ull) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// ---- NCCL's logger -------------------------------------------------------------------------------------

// NCCL_DEBUG (NONE 0, VERSION 1, WARN 2, INFO 3, ABORT 4, TRACE 5; unset: none) and NCCL_DEBUG_SUBSYS, as
// NCCL reads them once.
struct DebugSettings {
  int level = 0;
  unsigned long mask = 0x1 | 0x1000 | 0x80;  // INIT, BOOTSTRAP, ENV: NCCL's default subsystems
};

const DebugSettings& debugSettings() {
  static const DebugSettings settings = [] {
    DebugSettings result;
    if (const char* level = std::getenv("NCCL_DEBUG")) {
      if (strcasecmp(level, "VERSION") == 0) result.level = 1;
      else if (strcasecmp(level, "WARN") == 0) result.level = 2;
      else if (strcasecmp(level, "INFO") == 0) result.level = 3;
      else if (strcasecmp(level, "ABORT") == 0) result.level = 4;
      else if (strcasecmp(level, "TRACE") == 0) result.level = 5;
    }
    if (const char* subsys = std::getenv("NCCL_DEBUG_SUBSYS")) {
      static constexpr struct {
        const char* name;
        unsigned long bit;
      } kSubsystems[] = {{"INIT", 0x1},         {"COLL", 0x2},   {"P2P", 0x4},        {"SHM", 0x8},
                         {"NET", 0x10},         {"GRAPH", 0x20}, {"TUNING", 0x40},    {"ENV", 0x80},
                         {"ALLOC", 0x100},      {"CALL", 0x200}, {"PROXY", 0x400},    {"NVLS", 0x800},
                         {"BOOTSTRAP", 0x1000}, {"REG", 0x2000}, {"PROFILE", 0x4000}, {"RAS", 0x8000},
                         {"ALL", ~0ul}};
      std::string text = subsys;
      const bool invert = !text.empty() && text[0] == '^';
      if (invert) text.erase(0, 1);
      unsigned long mask = 0;
      std::size_t begin = 0;
      while (begin <= text.size()) {
        std::size_t end = text.find(',', begin);
        if (end == std::string::npos) end = text.size();
        const std::string name = text.substr(begin, end - begin);
        for (const auto& subsystem : kSubsystems)
          if (strcasecmp(name.c_str(), subsystem.name) == 0) mask |= subsystem.bit;
        begin = end + 1;
      }
      result.mask = invert ? ~mask : mask;
    }
    return result;
  }();
  return settings;
}

// NCCL's ncclDebugLog, with the line layout of src/debug.cc: WARN lines name the source file and line,
// INFO lines do not. One fprintf per line under a lock, so lines of concurrent callers do not interleave.
void ncclDebugLog(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  const DebugSettings& settings = debugSettings();
  if (level > settings.level || level <= 0) return;
  if (level == 3 && (flags & settings.mask) == 0) return;  // INFO: only the chosen subsystems
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  if (char* dot = std::strchr(host, '.')) *dot = '\0';
  char message[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  const long tid = syscall(SYS_gettid);
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  if (level == 2) {
    const char* base = file != nullptr ? std::strrchr(file, '/') : nullptr;
    std::fprintf(stderr, "%s:%d:%ld [0] %s:%d NCCL WARN %s\n", host, static_cast<int>(getpid()), tid,
                 base != nullptr ? base + 1 : (file != nullptr ? file : "?"), line, message);
  } else {
    std::fprintf(stderr, "%s:%d:%ld [0] NCCL %s %s\n", host, static_cast<int>(getpid()), tid,
                 level == 1   ? "VERSION"
                 : level == 3 ? "INFO"
                 : level == 4 ? "ABORT"
                              : "TRACE",
                 message);
  }
  std::fflush(stderr);
}

#define FAKE_INFO(flags, ...) ncclDebugLog(3, (flags), __FILE__, __LINE__, __VA_ARGS__)
#define FAKE_WARN(...) ncclDebugLog(2, 0, __FILE__, __LINE__, __VA_ARGS__)

// The logger NCCL hands both plugins (nccl_abi/nccl.h's ncclDebugLogger_t).
void pluginLogger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                  ...) {
  char message[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  ncclDebugLog(static_cast<int>(level), flags, file, line, "%s", message);
}

// The loaded plugin, as one v5 table (a v4 plugin's functions are called through adapters below).
struct Plugin {
  std::mutex mutex;
  void* library = nullptr;
  int references = 0;
  bool failed = false;  // tried and not found: NCCL does not retry
  ncclProfiler_v5_t* v5 = nullptr;
  ncclProfiler_v4_t* v4 = nullptr;
  int mask = 0;  // NCCL's process-wide ncclProfilerEventMask
} g_plugin;

void* openPlugin() {
  const char* name = std::getenv("NCCL_PROFILER_PLUGIN");
  if (name != nullptr && strcasecmp(name, "none") == 0) return nullptr;
  if (name == nullptr || *name == '\0') return dlopen("libnccl-profiler.so", RTLD_NOW | RTLD_LOCAL);
  if (void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return library;
  const std::string prefixed = std::string("libnccl-profiler-") + name + ".so";
  return dlopen(prefixed.c_str(), RTLD_NOW | RTLD_LOCAL);
}

// At every communicator's creation: loads the plugin (once) and inits a context for the communicator.
void profilerInit(ncclComm_t comm) {
  const std::lock_guard lock(g_plugin.mutex);
  if (g_plugin.failed) return;
  if (g_plugin.library == nullptr) {
    g_plugin.library = openPlugin();
    if (g_plugin.library != nullptr) {
      const char* v4_only = std::getenv("GRADSCOPE_FAKE_PROFILER_V4");
      if (v4_only == nullptr || std::strcmp(v4_only, "1") != 0)
        g_plugin.v5 = static_cast<ncclProfiler_v5_t*>(dlsym(g_plugin.library, "ncclProfiler_v5"));
      if (g_plugin.v5 == nullptr)
        g_plugin.v4 = static_cast<ncclProfiler_v4_t*>(dlsym(g_plugin.library, "ncclProfiler_v4"));
    }
    if (g_plugin.v5 == nullptr && g_plugin.v4 == nullptr) {
      if (g_plugin.library != nullptr) dlclose(g_plugin.library);
      g_plugin.library = nullptr;
      g_plugin.failed = true;
      return;
    }
  }
  ++g_plugin.references;
  const int rc = g_plugin.v5 != nullptr ? g_plugin.v5->init(&comm->profiler, comm->hash, &g_plugin.mask, "",
                                                            1, comm->nranks, comm->rank, pluginLogger)
                                        : g_plugin.v4->init(&comm->profiler, &g_plugin.mask, "", comm->hash,
                                                            1, comm->nranks, comm->rank, pluginLogger);
  if (rc != 0) comm->profiler = nullptr;  // NCCL: "Continue without profiler"
}

int profilerMask() {
  const std::lock_guard lock(g_plugin.mutex);
  return g_plugin.mask;
}

// The fake's events, converted for a v4 plugin when that is what was loaded.
void startEvent(void* context, void** handle, ncclProfilerEventDescr_v5_t& d) {
  *handle = nullptr;
  if (g_plugin.v5 != nullptr) {
    g_plugin.v5->startEvent(context, handle, &d);
    return;
  }
  ncclProfilerEventDescr_v4_t v4{};
  v4.type = static_cast<std::uint8_t>(d.type);
  v4.parentObj = d.type == ncclProfileColl ? d.coll.parentGroup : d.parentObj;
  v4.rank = d.rank;
  if (d.type == ncclProfileColl) {
    v4.coll.seqNumber = d.coll.seqNumber;
    v4.coll.func = d.coll.func;
    v4.coll.sendBuff = d.coll.sendBuff;
    v4.coll.recvBuff = d.coll.recvBuff;
    v4.coll.count = d.coll.count;
    v4.coll.root = d.coll.root;
    v4.coll.datatype = d.coll.datatype;
    v4.coll.nChannels = d.coll.nChannels;
    v4.coll.nWarps = d.coll.nWarps;
    v4.coll.algo = d.coll.algo;
    v4.coll.proto = d.coll.proto;
  } else if (d.type == ncclProfileProxyOp) {
    v4.proxyOp.pid = d.proxyOp.pid;
    v4.proxyOp.channelId = d.proxyOp.channelId;
  } else if (d.type == ncclProfileKernelCh) {
    v4.kernelCh.channelId = d.kernelCh.channelId;
    v4.kernelCh.pTimer = d.kernelCh.pTimer;
  }
  g_plugin.v4->startEvent(context, handle, &v4);
}
void stopEvent(void* handle) {
  if (handle == nullptr) return;
  if (g_plugin.v5 != nullptr) g_plugin.v5->stopEvent(handle);
  else g_plugin.v4->stopEvent(handle);
}
void kernelStop(void* handle, std::uint64_t timer) {
  if (handle == nullptr) return;
  ncclProfilerEventStateArgs_v5_t args{};
  args.kernelCh.pTimer = timer;
  if (g_plugin.v5 != nullptr) {
    g_plugin.v5->recordEventState(handle, ncclProfilerKernelChStop, &args);
  } else {
    ncclProfilerEventStateArgs_v4_t v4{};
    v4.kernelCh.pTimer = timer;
    g_plugin.v4->recordEventState(handle, ncclProfilerKernelChStop, &v4);
  }
}

// NCCL's proxy thread, for the children of collectives: one thread, work in launch order.
class Proxy {
 public:
  struct Work {
    void* context;
    void* coll;
    int channels;
    int rank;
    int mask;
  };
  ~Proxy() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void post(const Work& work) {
    {
      const std::lock_guard lock(mutex_);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      queue_.push_back(work);
    }
    wake_.notify_all();
  }
  // Waits until every posted work item is done (ncclCommDestroy: the proxy finishes first).
  void drain() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return queue_.empty() && busy_ == 0; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const Work work = queue_.front();
      queue_.pop_front();
      ++busy_;
      lock.unlock();
      children(work);
      lock.lock();
      --busy_;
      idle_.notify_all();
    }
  }
  static void children(const Work& work) {
    for (int channel = 0; channel < work.channels; ++channel) {
      void* op = nullptr;
      if ((work.mask & ncclProfileProxyOp) != 0) {
        ncclProfilerEventDescr_v5_t d{};
        d.type = ncclProfileProxyOp;
        d.parentObj = work.coll;
        d.rank = work.rank;
        d.proxyOp.pid = getpid();
        d.proxyOp.channelId = static_cast<std::uint8_t>(channel);
        d.proxyOp.nSteps = 8;
        startEvent(work.context, &op, d);
      }
      if ((work.mask & ncclProfileKernelCh) != 0) {
        ncclProfilerEventDescr_v5_t d{};
        d.type = ncclProfileKernelCh;
        d.parentObj = work.coll;
        d.rank = work.rank;
        d.kernelCh.channelId = static_cast<std::uint8_t>(channel);
        d.kernelCh.pTimer = 1000;
        void* kernel = nullptr;
        startEvent(work.context, &kernel, d);
        kernelStop(kernel, 2000);
        stopEvent(kernel);
      }
      stopEvent(op);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Work> queue_;
  int busy_ = 0;
  bool stop_ = false;
  std::thread thread_;
} g_proxy;

void profilerFinalize(ncclComm_t comm) {
  if (comm->profiler == nullptr && g_plugin.library == nullptr) return;
  g_proxy.drain();
  const std::lock_guard lock(g_plugin.mutex);
  if (g_plugin.library == nullptr) return;
  if (comm->profiler != nullptr) {
    if (g_plugin.v5 != nullptr) g_plugin.v5->finalize(comm->profiler);
    else g_plugin.v4->finalize(comm->profiler);
    comm->profiler = nullptr;
  }
  if (--g_plugin.references == 0) {  // NCCL unloads the plugin with its last communicator
    dlclose(g_plugin.library);
    g_plugin.library = nullptr;
    g_plugin.v5 = nullptr;
    g_plugin.v4 = nullptr;
    g_plugin.mask = 0;
  }
}

// ---- the tuner plugin and the choice of algorithm, protocol and channels ---------------------------------

// What the fake "chooses" for a collective of `bytes` (NCCL's nBytes) when no tuner steers it
// (check_nccl.py's fake_choice mirrors it). Indexes of nccl_abi/tuner.h.
struct Choice {
  int algo;
  int proto;
  int channels;
};
Choice fakeChoice(std::size_t bytes) {
  if (bytes <= 1024) return {NCCL_ALGO_TREE, NCCL_PROTO_LL, 1};
  if (bytes <= 8192) return {NCCL_ALGO_RING, NCCL_PROTO_LL128, 2};
  return {NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 4};
}

// The names NCCL 2.28 gives the profiler (ncclAlgoToString, ncclProtoToString).
constexpr const char* kAlgoNames[NCCL_NUM_ALGORITHMS_V5] = {
    "TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
constexpr const char* kProtoNames[NCCL_NUM_PROTOCOLS_V5] = {"LL", "LL128", "SIMPLE"};
constexpr int kNumAlgo = NCCL_NUM_ALGORITHMS_V5;
constexpr int kNumProto = NCCL_NUM_PROTOCOLS_V5;
constexpr int kMaxChannels = 32;  // NCCL's MAXCHANNELS

using CostTable = float[kNumAlgo][kNumProto];

// NCCL_ALGO / NCCL_PROTO as a mask of allowed indexes: a comma-separated list of names (any case), or
// "^" and the names to exclude. NCCL 2.24's per-function form ("allreduce:tree;...") is not emulated: such
// a value is ignored with a WARN.
unsigned allowedMask(const char* variable, const char* const* names, int count, const char* const* aliases) {
  const unsigned all = (1u << count) - 1;
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return all;
  std::string text = value;
  if (text.find(':') != std::string::npos) {
    FAKE_WARN("%s=%s: per-function rules are not emulated by the fake NCCL; ignored", variable, value);
    return all;
  }
  const bool exclude = text[0] == '^';
  if (exclude) text.erase(0, 1);
  unsigned listed = 0;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string name = text.substr(begin, end - begin);
    for (int i = 0; i < count; ++i)
      if (strcasecmp(name.c_str(), names[i]) == 0 || strcasecmp(name.c_str(), aliases[i]) == 0)
        listed |= 1u << i;
    begin = end + 1;
  }
  return exclude ? all & ~listed : listed;
}

// NCCL's updateCollCostTable for the fake's one-node world: Tree and Ring with every protocol are usable,
// CollNet, NVLS, NVLSTree and PAT are not (−1), nor what NCCL_ALGO / NCCL_PROTO exclude. Predicted
// "times" in microseconds: fakeChoice's entry is the cheapest (1 + nBytes/1e6), every other usable one
// dearer by 1 us per step away from it in algorithm-major order, so that a tuner lowering any usable
// entry to 0 wins.
void costTable(std::size_t bytes, CostTable& table) {
  static constexpr const char* kAlgoAliases[kNumAlgo] = {
      "Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"};
  static constexpr const char* kProtoAliases[kNumProto] = {"LL", "LL128", "Simple"};
  static const unsigned algos = allowedMask("NCCL_ALGO", kAlgoNames, kNumAlgo, kAlgoAliases);
  static const unsigned protos = allowedMask("NCCL_PROTO", kProtoNames, kNumProto, kProtoAliases);
  for (auto& row : table)
    for (float& entry : row) entry = NCCL_ALGO_PROTO_IGNORE;
  const Choice choice = fakeChoice(bytes);
  const int chosen = choice.algo * kNumProto + choice.proto;
  const float base = 1.0f + static_cast<float>(bytes) / 1e6f;
  for (const int algo : {NCCL_ALGO_TREE, NCCL_ALGO_RING})
    for (int proto = 0; proto < kNumProto; ++proto)
      if ((algos & (1u << algo)) != 0 && (protos & (1u << proto)) != 0)
        table[algo][proto] = base + static_cast<float>(std::abs(algo * kNumProto + proto - chosen));
}

// topoGetAlgoInfo's pick: the smallest entry >= 0, the first in algorithm-major order on ties.
bool cheapest(const CostTable& table, int& algo, int& proto) {
  float best = -1.0f;
  algo = proto = -1;
  for (int a = 0; a < kNumAlgo; ++a)
    for (int p = 0; p < kNumProto; ++p)
      if (table[a][p] >= 0.0f && (best < 0.0f || table[a][p] < best)) {
        best = table[a][p];
        algo = a;
        proto = p;
      }
  return algo >= 0;
}

// The loaded tuner (NCCL's tunerPluginLib, tunerSymbol, tunerPluginRefCount, status).
struct Tuner {
  std::mutex mutex;
  void* library = nullptr;
  int references = 0;
  bool failed = false;  // a load failed: NCCL never tries again in this process
  int version = 0;
  const ncclTuner_v5_t* v5 = nullptr;
  const ncclTuner_v4_t* v4 = nullptr;
  const ncclTuner_v3_t* v3 = nullptr;
} g_tuner;

// plugin_open.cc openPluginLib: the name as given (unset or empty: libnccl-tuner.so), then, for a bare
// name (no '/', not already lib*.so), libnccl-tuner-<name>.so.
void* openTuner(const char* name) {
  const bool named = name != nullptr && *name != '\0';
  const std::string first = named ? name : "libnccl-tuner.so";
  if (void* library = dlopen(first.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
  if (!named || std::strchr(name, '/') != nullptr) return nullptr;
  const std::size_t length = std::strlen(name);
  if (std::strncmp(name, "lib", 3) == 0 && length >= 3 && std::strcmp(name + length - 3, ".so") == 0)
    return nullptr;
  const std::string prefixed = std::string("libnccl-tuner-") + name + ".so";
  if (void* library = dlopen(prefixed.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
  FAKE_INFO(0x1 | 0x40, "TUNER/Plugin: Could not find: %s %s", first.c_str(), prefixed.c_str());
  return nullptr;
}

// Under g_tuner.mutex: NCCL's ncclTunerPluginLoad for a communicator. Returns whether a tuner is loaded.
bool loadTuner() {
  if (g_tuner.failed) return false;
  if (g_tuner.library != nullptr) return true;
  const char* name = std::getenv("NCCL_TUNER_PLUGIN");
  if (name != nullptr) {
    FAKE_INFO(0x80 | 0x40, "NCCL_TUNER_PLUGIN set by environment to %s", name);
    if (strcasecmp(name, "none") == 0) {
      g_tuner.failed = true;
      return false;
    }
  }
  void* library = openTuner(name);
  if (library == nullptr) {
    g_tuner.failed = true;
    return false;
  }
  const char* only = std::getenv("GRADSCOPE_FAKE_TUNER_VERSION");
  const int newest = only != nullptr && *only != '\0' ? std::atoi(only) : 5;
  if (newest >= 5) g_tuner.v5 = static_cast<const ncclTuner_v5_t*>(dlsym(library, "ncclTunerPlugin_v5"));
  if (g_tuner.v5 == nullptr && newest >= 4)
    g_tuner.v4 = static_cast<const ncclTuner_v4_t*>(dlsym(library, "ncclTunerPlugin_v4"));
  if (g_tuner.v5 == nullptr && g_tuner.v4 == nullptr && newest >= 3)
    g_tuner.v3 = static_cast<const ncclTuner_v3_t*>(dlsym(library, "ncclTunerPlugin_v3"));
  g_tuner.version = g_tuner.v5 != nullptr ? 5 : g_tuner.v4 != nullptr ? 4 : g_tuner.v3 != nullptr ? 3 : 0;
  if (g_tuner.version == 0) {
    if (name != nullptr) FAKE_WARN("External tuner plugin %s is unsupported", name);
    dlclose(library);
    g_tuner.failed = true;
    return false;
  }
  g_tuner.library = library;
  const char* plugin = g_tuner.v5 != nullptr   ? g_tuner.v5->name
                       : g_tuner.v4 != nullptr ? g_tuner.v4->name
                                               : g_tuner.v3->name;
  // NCCL names the file the dynamic linker found (ncclPluginLibPaths).
  link_map* map = nullptr;
  const char* path = dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr ? map->l_name : name;
  FAKE_INFO(0x1 | 0x40, "Successfully loaded external tuner plugin %s", path != nullptr ? path : "");
  FAKE_INFO(0x1 | 0x40, "TUNER/Plugin: Using %s (v%d)", plugin, g_tuner.version);
  return true;
}

// Under g_tuner.mutex, with no communicator left: NCCL's ncclClosePluginLib; the next one loads again.
void unloadTuner() {
  dlclose(g_tuner.library);
  g_tuner.library = nullptr;
  g_tuner.version = 0;
  g_tuner.v5 = nullptr;
  g_tuner.v4 = nullptr;
  g_tuner.v3 = nullptr;
}

// At every communicator's creation: loads the tuner (once) and inits a context. An init error fails the
// creation, as in NCCL.
ncclResult_t tunerInit(ncclComm_t comm) {
  const std::lock_guard lock(g_tuner.mutex);
  if (!loadTuner()) return ncclSuccess;
  ++g_tuner.references;
  comm->tuner_version = g_tuner.version;
  ncclResult_t rc = ncclSuccess;
  const auto ranks = static_cast<std::size_t>(comm->nranks);
  if (g_tuner.v5 != nullptr) {
    ncclNvlDomainInfo_v5_t nvl{1, comm->nranks, comm->nranks};
    ncclTunerConstants_v5_t constants{};  // NCCL's cost-model constants; the fake has no model to feed
    rc = g_tuner.v5->init(&comm->tuner, comm->hash, ranks, 1, pluginLogger, &nvl, &constants);
  } else if (g_tuner.v4 != nullptr) {
    rc = g_tuner.v4->init(ranks, 1, pluginLogger, &comm->tuner);
  } else {
    rc = g_tuner.v3->init(ranks, 1, pluginLogger, &comm->tuner);
  }
  if (rc == ncclSuccess) return ncclSuccess;
  FAKE_WARN("tuner plugin init failed: %d", static_cast<int>(rc));
  comm->tuner_version = 0;
  comm->tuner = nullptr;
  if (--g_tuner.references == 0) unloadTuner();
  return static_cast<ncclResult_t>(rc);
}

// ncclTunerPluginUnload, after finalize (destroy) of the communicator's context.
void tunerFinalize(ncclComm_t comm) {
  if (comm->tuner_version == 0) return;
  const std::lock_guard lock(g_tuner.mutex);
  if (g_tuner.v5 != nullptr) g_tuner.v5->finalize(comm->tuner);
  else if (g_tuner.v4 != nullptr) g_tuner.v4->destroy(comm->tuner);
  else if (g_tuner.v3 != nullptr) g_tuner.v3->destroy(comm->tuner);
  comm->tuner = nullptr;
  comm->tuner_version = 0;
  if (--g_tuner.references == 0) {
    FAKE_INFO(0x40, "TUNER/Plugin: Closing tuner");
    unloadTuner();
  }
}

constexpr const char* kFunctionNames[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};

// ncclGetAlgoInfo for one task: the cost table, the tuner's say, the cheapest entry. False when no entry
// is usable (NCCL: "no algorithm/protocol available").

bool chooseFor(ncclComm_t comm, int function, std::size_t bytes, Choice& choice) {
  CostTable table;
  costTable(bytes, table);
  int channels = 0;
  if (comm->tuner_version != 0) {
    // The communicator's library stays loaded while it lives: no lock (NCCL takes none either).
    auto* flat = reinterpret_cast<float**>(&table[0][0]);
    const auto func = static_cast<ncclFunc_t>(function);
    ncclResult_t rc = ncclSuccess;
    if (comm->tuner_version == 5)
      rc = g_tuner.v5->getCollInfo(comm->tuner, func, bytes, 1, flat, kNumAlgo, kNumProto, 0, &channels);
    else if (comm->tuner_version == 4)
      rc = g_tuner.v4->getCollInfo(comm->tuner, func, bytes, 1, flat, kNumAlgo, kNumProto, 0, &channels);
    else rc = g_tuner.v3->getCollInfo(comm->tuner, func, bytes, 1, flat, kNumAlgo, kNumProto, &channels);
    if (rc != ncclSuccess) {
      FAKE_WARN("tuner plugin getCollInfo failed: %d; default tuning for this call", static_cast<int>(rc));
      costTable(bytes, table);
      channels = 0;
    }
  }
  if (!cheapest(table, choice.algo, choice.proto)) {
    FAKE_WARN("Error : no algorithm/protocol available for function %s with %zu bytes",
              kFunctionNames[function], bytes);
    return false;
  }
  choice.channels = channels > 0 ? std::min(channels, kMaxChannels) : fakeChoice(bytes).channels;
  return true;
}

// ncclDatatypeToString of NCCL 2.28 (which has no name for ncclUint8).
const char* datatypeName(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: return "ncclInt8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    case ncclFloat8e4m3: return "ncclFloat8e4m3";
    case ncclFloat8e5m2: return "ncclFloat8e5m2";
    default: return "Unknown";
  }
}

// ---- launches ------------------------------------------------------------------------------------------

// ncclFunc_t's values, then the functions that never reach the tuner nor appear in the profiler as a
// collective with an API code (its Coll events are for the first five; nccl_abi/tuner.h).
enum Function {
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kSend,
  kRecv,
  kAlltoAll,
  kGather,
  kScatter
};
bool tuned(Function function) {
  return function <= kAllReduce;
}

struct Task {
  ncclComm_t comm;
  Function function;
  std::size_t count;
  ncclDataType_t type;
  std::size_t bytes;       // the send buffer's
  std::size_t nccl_bytes;  // NCCL's nBytes: the larger buffer (count x nRanks x size for AllGather)
  cudaStream_t stream;
  std::function<bool()> work;  // false: the call cannot complete (a receive without a message)
};

thread_local int t_group_depth = 0;
thread_local std::vector<Task> t_group_work;

// One launch: the choice of algorithm per task (the tuner's say included), then NCCL's profiler events
// around the work (each task is one kernel on its stream). Fails, running nothing, when a task has no
// usable algorithm.
ncclResult_t launch(std::vector<Task>& tasks) {
  // NCCL orders a launch's collectives largest first (its task sorter); equal sizes keep call order. The
  // other calls follow, the sends first (a group's receives may need them), each kind in call order.
  const auto rank = [](const Task& task) {
    return tuned(task.function) ? 0 : task.function == kSend ? 1 : 2;
  };
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return rank(a) == 0 && a.bytes > b.bytes;
  });
  std::vector<Choice> choices(tasks.size());
  for (std::size_t t = 0; t < tasks.size(); ++t)
    if (tuned(tasks[t].function) &&
        !chooseFor(tasks[t].comm, tasks[t].function, tasks[t].nccl_bytes, choices[t]))
      return ncclInternalError;
  const int mask = profilerMask();
  const bool profiled =
      (mask & (ncclProfileGroup | ncclProfileColl | ncclProfileProxyOp | ncclProfileKernelCh)) != 0;
  std::vector<ncclComm_t> comms;
  for (const Task& task : tasks)
    if (std::find(comms.begin(), comms.end(), task.comm) == comms.end()) comms.push_back(task.comm);
  std::vector<void*> groups(comms.size(), nullptr);
  std::vector<void*> colls(tasks.size(), nullptr);
  std::vector<int> channels(tasks.size(), 0);
  for (std::size_t c = 0; c < comms.size(); ++c) {
    ncclComm_t comm = comms[c];
    if (comm->profiler == nullptr || !profiled) continue;
    ncclProfilerEventDescr_v5_t group{};
    group.type = ncclProfileGroup;
    startEvent(comm->profiler, &groups[c], group);
    for (std::size_t t = 0; t < tasks.size(); ++t) {
      const Task& task = tasks[t];
      if (task.comm != comm || !tuned(task.function)) continue;
      const Choice& choice = choices[t];
      ncclProfilerEventDescr_v5_t d{};
      d.type = ncclProfileColl;
      d.rank = comm->rank;
      d.coll.seqNumber = comm->seq[task.function]++;
      d.coll.func = kFunctionNames[task.function];
      // As NCCL's ncclInfoSetDerived: a broadcast or an all-gather is described in bytes, as ncclInt8.
      const bool in_bytes = task.function == kBroadcast || task.function == kAllGather;
      d.coll.count = in_bytes ? task.count * sizeOf(task.type) : task.count;
      d.coll.datatype = datatypeName(in_bytes ? ncclInt8 : task.type);
      d.coll.nChannels = static_cast<std::uint8_t>(choice.channels);
      d.coll.nWarps = 16;
      d.coll.algo = kAlgoNames[choice.algo];
      d.coll.proto = kProtoNames[choice.proto];
      d.coll.parentGroup = groups[c];
      channels[t] = choice.channels;
      startEvent(comm->profiler, &colls[t], d);
    }
  }
  ncclResult_t rc = ncclSuccess;
  for (Task& task : tasks) {
    if (!task.work()) rc = ncclInvalidUsage;
    if (g_launch != nullptr) g_launch(task.stream, g_kernel_ns);
  }
  for (void* coll : colls) stopEvent(coll);
  for (void* group : groups) stopEvent(group);
  for (std::size_t t = 0; t < tasks.size(); ++t)
    if (colls[t] != nullptr && (mask & (ncclProfileProxyOp | ncclProfileKernelCh)) != 0)
      g_proxy.post({tasks[t].comm->profiler, colls[t], channels[t], tasks[t].comm->rank, mask});
  return rc;
}

// Runs the task now, or at the outermost ncclGroupEnd.
ncclResult_t submit(ncclComm_t comm, Function function, std::size_t count, std::size_t send_elements,
                    std::size_t nccl_elements, ncclDataType_t type, cudaStream_t stream,
                    std::function<bool()> work) {
  if (comm == nullptr || sizeOf(type) == 0) return ncclInvalidArgument;
  Task task{comm,   function,       count, type, send_elements * sizeOf(type), nccl_elements * sizeOf(type),
            stream, std::move(work)};
  if (t_group_depth > 0) {
    t_group_work.push_back(std::move(task));
    return ncclSuccess;
  }
  std::vector<Task> tasks;
  tasks.push_back(std::move(task));
  return launch(tasks);
}

bool copy(void* to, const void* from, std::size_t count, ncclDataType_t type) {
  if (to != from && count > 0) std::memmove(to, from, count * sizeOf(type));
  return true;
}

// ---- point-to-point --------------------------------------------------------------------------------------

// Messages sent and not yet received, per (communicator hash, sender, receiver), oldest first. The ranks
// of an ncclCommInitAll communicator share its hash.
struct Mailboxes {
  std::mutex mutex;
  std::map<std::tuple<std::uint64_t, int, int>, std::deque<std::vector<unsigned char>>> messages;
} g_mailboxes;

bool post(ncclComm_t comm, int peer, const void* data, std::size_t bytes) {
  const auto* begin = static_cast<const unsigned char*>(data);
  const std::lock_guard lock(g_mailboxes.mutex);
  g_mailboxes.messages[{comm->hash, comm->rank, peer}].emplace_back(begin, begin + bytes);
  return true;
}

bool take(ncclComm_t comm, int peer, void* data, std::size_t bytes) {
  const std::lock_guard lock(g_mailboxes.mutex);
  auto& box = g_mailboxes.messages[{comm->hash, peer, comm->rank}];
  if (box.empty() || box.front().size() != bytes) {
    FAKE_WARN("rank %d: ncclRecv of %zu bytes from rank %d finds %s", comm->rank, bytes, peer,
              box.empty() ? "no message" : "a message of another size");
    return false;
  }
  std::memcpy(data, box.front().data(), bytes);
  box.pop_front();
  return true;
}

ncclResult_t newComm(ncclComm_t* comm, int nranks, int rank, std::uint64_t hash) {
  if (comm == nullptr) return ncclInvalidArgument;
  loadFakeCuda();
  *comm = new ncclComm{nranks, rank, 0, hash, nullptr, {}};
  if (const ncclResult_t rc = tunerInit(*comm); rc != ncclSuccess) {
    delete *comm;
    *comm = nullptr;
    return rc;
  }
  profilerInit(*comm);
  return ncclSuccess;
}

void destroyComm(ncclComm_t comm) {
  if (comm == nullptr) return;
  profilerFinalize(comm);
  tunerFinalize(comm);
  delete comm;
}

}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_EXPORT ncclResult_t pncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
#ifdef GRADSCOPE_FAKE_NCCL_2_27
  *version = 22707;
#else
  *version = 22809;
#endif
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  static std::atomic<int> ids{0};
  const int n = ids.fetch_add(1);
  for (std::size_t i = 0; i < kUniqueIdBytes; ++i)
    uniqueId->internal[i] = static_cast<char>((7 * i + 13 * static_cast<std::size_t>(n)) & 0xff);
  return ncclSuccess;
}

FAKE_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error" : "fake NCCL error";
}

FAKE_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr) return ncclInvalidArgument;
  *device = comm->device;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                                 ncclConfig_t*) {
  if (nranks != 1 || rank != 0) return ncclInvalidArgument;
  return newComm(comm, nranks, rank, fnv1a(id.internal, sizeof id.internal));
}

FAKE_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return pncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

FAKE_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nId,
                                                   ncclUniqueId* ids, ncclConfig_t*) {
  if (nranks != 1 || rank != 0 || nId < 1) return ncclInvalidArgument;
  return newComm(comm, nranks, rank, fnv1a(ids, sizeof(ncclUniqueId) * static_cast<std::size_t>(nId)));
}

FAKE_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int*) {
  if (comm == nullptr || ndev < 1) return ncclInvalidArgument;
  static std::atomic<std::uint64_t> calls{0};
  const std::uint64_t ordinal = calls.fetch_add(1);
  for (int i = 0; i < ndev; ++i) {
    if (const ncclResult_t rc = newComm(&comm[i], ndev, i, fnv1a(&ordinal, sizeof ordinal, 0x1234));
        rc != ncclSuccess) {
      for (int j = 0; j < i; ++j) destroyComm(comm[j]);
      return rc;
    }
  }
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  destroyComm(comm);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  destroyComm(comm);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int, ncclComm_t* newcomm, ncclConfig_t*) {
  if (comm == nullptr || newcomm == nullptr) return ncclInvalidArgument;
  if (color == kSplitNoColor) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  return newComm(newcomm, 1, 0, fnv1a(&color, sizeof color, comm->hash));
}

FAKE_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  if (comm != nullptr && root != comm->rank) return ncclInvalidArgument;
  return submit(comm, kReduce, count, count, count, datatype, stream,
                [=] { return copy(recvbuff, sendbuff, count, datatype); });
}

FAKE_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream) {
  if (comm != nullptr && root != comm->rank) return ncclInvalidArgument;
  return submit(comm, kBroadcast, count, count, count, datatype, stream,
                [=] { return copy(recvbuff, sendbuff, count, datatype); });
}

FAKE_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t, ncclComm_t comm,
                                        cudaStream_t stream) {
  return submit(comm, kAllReduce, count, count, count, datatype, stream,
                [=] { return copy(recvbuff, sendbuff, count, datatype); });
}

FAKE_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                            ncclDataType_t datatype, ncclRedOp_t, ncclComm_t comm,
                                            cudaStream_t stream) {
  const std::size_t ranks = comm != nullptr ? static_cast<std::size_t>(comm->nranks) : 1;
  return submit(comm, kReduceScatter, recvcount, recvcount * ranks, recvcount * ranks, datatype, stream,
                [=] { return copy(recvbuff, sendbuff, recvcount, datatype); });
}

FAKE_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  const std::size_t ranks = comm != nullptr ? static_cast<std::size_t>(comm->nranks) : 1;
  return submit(comm, kAllGather, sendcount, sendcount, sendcount * ranks, datatype, stream,
                [=] { return copy(recvbuff, sendbuff, sendcount, datatype); });
}

#ifndef GRADSCOPE_FAKE_NCCL_2_27
FAKE_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr) return ncclInvalidArgument;
  const std::size_t ranks = static_cast<std::size_t>(comm->nranks),
                    own = static_cast<std::size_t>(comm->rank);
  const std::size_t size = sizeOf(datatype);
  return submit(comm, kAlltoAll, count, count * ranks, count * ranks, datatype, stream, [=] {
    return copy(static_cast<char*>(recvbuff) + own * count * size,
                static_cast<const char*>(sendbuff) + own * count * size, count, datatype);
  });
}

FAKE_EXPORT ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  if (comm == nullptr || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
  const std::size_t own = static_cast<std::size_t>(comm->rank), size = sizeOf(datatype);
  const bool at_root = comm->rank == root;
  return submit(comm, kGather, count, count, count, datatype, stream, [=] {
    return !at_root || copy(static_cast<char*>(recvbuff) + own * count * size, sendbuff, count, datatype);
  });
}

FAKE_EXPORT ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
  if (comm == nullptr || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
  const std::size_t own = static_cast<std::size_t>(comm->rank), size = sizeOf(datatype);
  const bool at_root = comm->rank == root;
  return submit(comm, kScatter, count, count, count, datatype, stream, [=] {
    return !at_root ||
           copy(recvbuff, static_cast<const char*>(sendbuff) + own * count * size, count, datatype);
  });
}
#endif

FAKE_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                   ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr || peer < 0 || peer >= comm->nranks) return ncclInvalidArgument;
  const std::size_t bytes = count * sizeOf(datatype);
  return submit(comm, kSend, count, count, count, datatype, stream,
                [=] { return post(comm, peer, sendbuff, bytes); });
}

FAKE_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                   ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr || peer < 0 || peer >= comm->nranks) return ncclInvalidArgument;
  const std::size_t bytes = count * sizeOf(datatype);
  return submit(comm, kRecv, count, count, count, datatype, stream,
                [=] { return take(comm, peer, recvbuff, bytes); });
}

FAKE_EXPORT ncclResult_t pncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclGroupEnd() {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth == 0) {
    std::vector<Task> tasks = std::move(t_group_work);
    t_group_work.clear();
    return launch(tasks);
  }
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t*) {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth == 0) t_group_work.clear();
  return ncclSuccess;
}

// The weak ncclX of every row, aliases of the pncclX above (what `nm -D libnccl.so.2` shows: W and T).
#ifdef GRADSCOPE_FAKE_NCCL_2_27
#define GS_NCCL_OLDER_THAN_2_28
#endif
#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS) \
  FAKE_EXPORT RESULT NAME PARAMS __attribute__((weak, alias("p" #NAME)));
#include "interpose/nccl_functions.def"
#undef GS_NCCL_FUNCTION
