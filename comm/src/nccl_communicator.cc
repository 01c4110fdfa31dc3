// The NCCL communicator: one rank per GPU, one non-blocking CUDA stream per communicator on which its
// collectives and its LocalOps are enqueued in call order.
//
// Element types are NCCL's own (DType codes 0..11 are ncclDataType_t values): fp16, bf16 and the fp8
// types reduce with NCCL's native kernels (fp8 needs compute capability 9.0). Scaled fp8 blocks are an
// MPI-only format: NCCL has no user-defined reductions (supportsScaledBlocks() is false).
//
// Uneven reduce-scatter and all-gather: NCCL moves equal blocks, so ranks' blocks are padded to the
// largest count in stream-ordered scratch buffers, and only the real elements are copied out.
//
// withAlgorithm(): NCCL reads NCCL_ALGO and NCCL_PROTO when a communicator computes its tuning model,
// at creation; the variables are set to "allreduce:<name>" around an ncclCommSplit and restored. That
// setenv is process-wide for its duration, so no other thread may create NCCL communicators meanwhile.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "gradscope/comm/nccl.h"
#include "gradscope/common/error.h"
#include "gradscope/methods/cuda.h"
#include "nccl_internal.h"
#include "ranks_per_node.h"

namespace gradscope::comm {

void detail::checkNccl(ncclResult_t result, std::string_view what) {
  if (result != ncclSuccess) fail("{} failed: {}", what, ncclGetErrorString(result));
}

void detail::checkCuda(cudaError_t status, std::string_view what) {
  if (status != cudaSuccess) fail("{} failed: {}", what, cudaGetErrorString(status));
}

namespace {

namespace cuda = methods::cuda;
using detail::checkCuda;
using detail::checkNccl;

void freeDevice(void* data) {
  cudaFree(data);
}

// ---- LocalOps on the communicator's stream ----------------------------------------------------------------

class DeviceLocalOps final : public LocalOps {
 public:
  explicit DeviceLocalOps(cudaStream_t stream)
      : stream_(stream), encode_counters_(2 * sizeof(std::uint64_t)) {}

  Memory memory() const override { return Memory::Device; }

  Buffer allocate(std::size_t bytes) override {
    if (bytes == 0) return {};
    void* data = nullptr;
    checkCuda(cudaMalloc(&data, bytes), "cudaMalloc");
    return Buffer(data, bytes, &freeDevice);
  }

  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes != 0 && dst != src)
      checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  }
  void fillZero(void* dst, std::size_t bytes) override {
    if (bytes != 0) checkCuda(cudaMemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
  }
  // From pageable memory cudaMemcpyAsync returns once `host` has been staged, so the caller may reuse it.
  void upload(void* dst, const void* host, std::size_t bytes) override {
    if (bytes != 0)
      checkCuda(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  }
  void download(void* host, const void* src, std::size_t bytes) override {
    if (bytes != 0)
      checkCuda(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    checkCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  // Synchronises: the counters come back to the host.
  methods::EncodeStats encode(WireFormat format, const float* in, std::size_t count, void* out, float* scales,
                              const methods::EncodeOptions& options) override {
    auto* counters = encode_counters_.as<std::uint64_t>();
    if (!options.count) {
      cuda::encode(format, in, count, out, scales, options, counters, stream_);  // counts nobody reads
      return {};
    }
    checkCuda(cudaMemsetAsync(counters, 0, 2 * sizeof(std::uint64_t), stream_), "cudaMemsetAsync");
    cuda::encode(format, in, count, out, scales, options, counters, stream_);
    std::uint64_t host[2] = {};
    download(host, counters, sizeof host);
    return {.overflow = host[0], .nan = host[1]};
  }
  void decode(WireFormat format, const void* in, const float* scales, std::size_t count, float* out,
              float postscale, std::size_t block) override {
    cuda::decode(format, in, scales, count, out, postscale, block, stream_);
  }

  methods::EncodeStats encodeScaledBlocks(WireFormat, const float*, std::size_t, std::size_t, float,
                                          void*) override {
    fail("NCCL: no fp8 scaled-block records (supportsScaledBlocks() is false; NCCL has no user reductions)");
  }
  void decodeScaledBlocks(WireFormat, const void*, std::size_t, std::size_t, float, float*) override {
    fail("NCCL: no fp8 scaled-block records (supportsScaledBlocks() is false; NCCL has no user reductions)");
  }

  void scale(const float* in, std::size_t count, float factor, float* out) override {
    cuda::scale(in, count, factor, out, stream_);
  }
  methods::DotProducts dotProducts(const float* a, const float* b, std::size_t count) override {
    return cuda::dotProducts(a, b, count, stream_);
  }
  void adasumPair(const float* a, const float* b, std::size_t count, float* out) override {
    cuda::adasumPair(a, b, count, out, stream_);
  }
  float finiteAmax(const float* in, std::size_t count) override {
    return cuda::finiteAmax(in, count, stream_);
  }
  void delayedCorrection(DType dtype, const void* gradient, void* older, const void* sum, void* out,
                         std::size_t count, double ranks) override {
    cuda::delayedCorrection(dtype, gradient, older, sum, out, count, ranks, stream_);
  }

 private:
  cudaStream_t stream_;
  cuda::DeviceBuffer encode_counters_;
};

// ---- Types, operations, environment -----------------------------------------------------------------------

constexpr int kLastNcclDType = static_cast<int>(DType::Fp8E5M2);

bool isFp8(DType dtype) {
  return dtype == DType::Fp8E4M3 || dtype == DType::Fp8E5M2;
}

ncclDataType_t ncclType(DType dtype) {
  return static_cast<ncclDataType_t>(dtype);  // types.h: the codes are NCCL's
}

ncclRedOp_t ncclOp(ReduceOp op) {
  return static_cast<ncclRedOp_t>(op);
}

// Sets an environment variable for the lifetime of the object and restores the previous state.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnvironment() {
    if (old_.has_value()) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string ncclVersion() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "NCCL";
  return fmt::format("NCCL {}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
}

// ---- The communicator -------------------------------------------------------------------------------------

// An event recorded on a communicator's stream. Destroying it while a stream still waits for it is
// allowed: CUDA releases the event once that wait is over.
struct StreamMark final : QueueMark {
  StreamMark() = default;
  StreamMark(const StreamMark&) = delete;
  StreamMark& operator=(const StreamMark&) = delete;
  ~StreamMark() override {
    if (event != nullptr) cudaEventDestroy(event);
  }
  cudaEvent_t event = nullptr;
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`, whose rank uses `device`.
  NcclCommunicator(ncclComm_t comm, int device) : comm_(comm), device_(device) {
    activate();
    cudaStream_t stream = nullptr;
    checkCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    stream_.reset(stream);
    local_ = std::make_unique<DeviceLocalOps>(stream);
    checkNccl(ncclCommCount(comm, &size_), "ncclCommCount");
    checkNccl(ncclCommUserRank(comm, &rank_), "ncclCommUserRank");
    checkCuda(cudaDeviceGetAttribute(&compute_major_, cudaDevAttrComputeCapabilityMajor, device_),
              "cudaDeviceGetAttribute");
    device_description_ = cuda::deviceDescription();
  }
  ~NcclCommunicator() override {
    // Work still queued on the stream may use the communicator and the scratch buffers (members are
    // destroyed after this: scratch, local ops, stream, then the communicator).
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream());
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  Backend backend() const override { return Backend::Nccl; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Memory memory() const override { return Memory::Device; }
  bool supportsScaledBlocks() const override { return false; }

  bool supports(Element element, ReduceOp op, std::string* why_not) const override {
    auto refuse = [&](std::string reason) {
      if (why_not != nullptr) *why_not = std::move(reason);
      return false;
    };
    if (element.block > 0)
      return refuse("NCCL backend: no fp8 scaled blocks (NCCL has no user-defined reductions)");
    if (static_cast<int>(element.dtype) > kLastNcclDType)
      return refuse(fmt::format("NCCL backend: no {} elements", name(element.dtype)));
    if (op == ReduceOp::None) return true;
    if (static_cast<int>(op) > static_cast<int>(ReduceOp::Avg))
      return refuse(fmt::format("NCCL backend: no {} reduction here (sum, prod, max, min, avg)", name(op)));
    if (isFp8(element.dtype) && compute_major_ < 9)
      return refuse(
          fmt::format("NCCL backend: {} reductions need compute capability 9.0 or newer (this GPU: {})",
                      name(element.dtype), device_description_));
    return true;
  }

  void allReduce(const void* send, void* recv, std::size_t count, Element type, ReduceOp op) override {
    require(type, op, "NCCL allReduce");
    if (count == 0) return;
    activate();
    checkNccl(ncclAllReduce(send, recv, count, ncclType(type.dtype), ncclOp(op), comm_.get(), stream()),
              "ncclAllReduce");
  }

  // NCCL's own in-place form (recv = send + rank·count) is not ours (send == recv: the result at recv's
  // start), so in place and uneven counts go through the padded scratch buffers.
  void reduceScatter(const void* send, void* recv, std::span<const std::size_t> counts, Element type,
                     ReduceOp op) override {
    require(type, op, "NCCL reduceScatter");
    checkCounts(counts, "NCCL reduceScatter");
    const std::size_t largest = *std::max_element(counts.begin(), counts.end());
    if (largest == 0) return;
    activate();
    const std::size_t bytes = elementBytes(type);
    const ncclDataType_t dtype = ncclType(type.dtype);
    const bool even = std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == largest; });
    if (even && send != recv) {
      checkNccl(ncclReduceScatter(send, recv, largest, dtype, ncclOp(op), comm_.get(), stream()),
                "ncclReduceScatter");
      return;
    }
    auto* padded = static_cast<char*>(scratch(scratch_in_, largest * bytes * counts.size()));
    auto* mine = scratch(scratch_out_, largest * bytes);
    std::size_t offset = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      char* block = padded + r * largest * bytes;
      local_->copy(block, static_cast<const char*>(send) + offset * bytes, counts[r] * bytes);
      local_->fillZero(block + counts[r] * bytes, (largest - counts[r]) * bytes);
      offset += counts[r];
    }
    checkNccl(ncclReduceScatter(padded, mine, largest, dtype, ncclOp(op), comm_.get(), stream()),
              "ncclReduceScatter");
    local_->copy(recv, mine, counts[static_cast<std::size_t>(rank_)] * bytes);
  }

  void allGather(const void* send, void* recv, std::span<const std::size_t> counts, Element type) override {
    require(type, ReduceOp::None, "NCCL allGather");
    checkCounts(counts, "NCCL allGather");
    const std::size_t largest = *std::max_element(counts.begin(), counts.end());
    if (largest == 0) return;
    activate();
    const std::size_t bytes = elementBytes(type);
    const ncclDataType_t dtype = ncclType(type.dtype);
    if (std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == largest; })) {
      // NCCL's in place (send = recv + rank·count) is ours too.
      checkNccl(ncclAllGather(send, recv, largest, dtype, comm_.get(), stream()), "ncclAllGather");
      return;
    }
    auto* mine = scratch(scratch_in_, largest * bytes);
    auto* padded = static_cast<char*>(scratch(scratch_out_, largest * bytes * counts.size()));
    local_->copy(mine, send, counts[static_cast<std::size_t>(rank_)] * bytes);
    checkNccl(ncclAllGather(mine, padded, largest, dtype, comm_.get(), stream()), "ncclAllGather");
    std::size_t offset = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      local_->copy(static_cast<char*>(recv) + offset * bytes, padded + r * largest * bytes,
                   counts[r] * bytes);
      offset += counts[r];
    }
  }

  void reduce(const void* send, void* recv, std::size_t count, Element type, ReduceOp op, int root) override {
    require(type, op, "NCCL reduce");
    if (count == 0) return;
    activate();
    checkNccl(ncclReduce(send, recv, count, ncclType(type.dtype), ncclOp(op), root, comm_.get(), stream()),
              "ncclReduce");
  }

  void broadcast(void* buffer, std::size_t count, Element type, int root) override {
    require(type, ReduceOp::None, "NCCL broadcast");
    if (count == 0) return;
    activate();
    checkNccl(ncclBroadcast(buffer, buffer, count, ncclType(type.dtype), root, comm_.get(), stream()),
              "ncclBroadcast");
  }

  void send(const void* buffer, std::size_t count, Element type, int peer) override {
    require(type, ReduceOp::None, "NCCL send");
    if (count == 0) return;
    activate();
    checkNccl(ncclSend(buffer, count, ncclType(type.dtype), peer, comm_.get(), stream()), "ncclSend");
  }

  void recv(void* buffer, std::size_t count, Element type, int peer) override {
    require(type, ReduceOp::None, "NCCL recv");
    if (count == 0) return;
    activate();
    checkNccl(ncclRecv(buffer, count, ncclType(type.dtype), peer, comm_.get(), stream()), "ncclRecv");
  }

  void sendRecv(const void* send, std::size_t send_count, int destination, void* recv, std::size_t recv_count,
                int source, Element type) override {
    require(type, ReduceOp::None, "NCCL sendRecv");
    if (send_count == 0 && recv_count == 0) return;
    activate();
    // Grouped, the send and the receive progress together (NCCL's pairwise exchange pattern).
    // The group is always closed, even when a call in it failed.
    checkNccl(ncclGroupStart(), "ncclGroupStart");
    const ncclResult_t sent = send_count == 0 ? ncclSuccess
                                              : ncclSend(send, send_count, ncclType(type.dtype), destination,
                                                         comm_.get(), stream());
    const ncclResult_t received =
        recv_count == 0 ? ncclSuccess
                        : ncclRecv(recv, recv_count, ncclType(type.dtype), source, comm_.get(), stream());
    const ncclResult_t ended = ncclGroupEnd();
    checkNccl(sent, "ncclSend");
    checkNccl(received, "ncclRecv");
    checkNccl(ended, "ncclGroupEnd");
  }

  std::vector<double> allGatherValues(std::span<const double> values) override {
    activate();
    const std::size_t k = values.size();
    std::vector<double> result(k * static_cast<std::size_t>(size_));
    if (k == 0) return result;
    auto* all = static_cast<double*>(scratch(scratch_out_, sizeof(double) * result.size()));
    double* mine = all + static_cast<std::size_t>(rank_) * k;
    local_->upload(mine, values.data(), k * sizeof(double));
    checkNccl(ncclAllGather(mine, all, k, ncclFloat64, comm_.get(), stream()), "ncclAllGather");
    local_->download(result.data(), all, result.size() * sizeof(double));
    return result;
  }

  double allReduceMax(double value) override {
    activate();
    auto* device_value = static_cast<double*>(scratch(scratch_out_, sizeof(double)));
    local_->upload(device_value, &value, sizeof value);
    checkNccl(ncclAllReduce(device_value, device_value, 1, ncclFloat64, ncclMax, comm_.get(), stream()),
              "ncclAllReduce");
    double result = 0;
    local_->download(&result, device_value, sizeof result);
    return result;
  }

  // NCCL has no barrier: a one-element all-reduce that every rank waits for.
  void barrier() override { allReduceMax(0.0); }

  void synchronize() override {
    activate();
    checkCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) fail("NCCL split: color must be non-negative, not {}", color);
    return splitWith(color, key);
  }

  int nodeColor() override {
    if (const std::optional<int> per_node = detail::ranksPerNode()) return rank_ / *per_node;
    // Host names, all-gathered as fixed-size byte strings; nodes numbered by their lowest rank.
    constexpr std::size_t kNameBytes = 256;
    std::vector<char> names(kNameBytes * static_cast<std::size_t>(size_), '\0');
    char* mine = names.data() + kNameBytes * static_cast<std::size_t>(rank_);
    if (gethostname(mine, kNameBytes - 1) != 0)
      fail("NCCL nodeColor: gethostname failed: {}", errnoMessage(errno));
    activate();
    auto* device_names = static_cast<char*>(scratch(scratch_out_, names.size()));
    local_->upload(device_names + kNameBytes * static_cast<std::size_t>(rank_), mine, kNameBytes);
    checkNccl(ncclAllGather(device_names + kNameBytes * static_cast<std::size_t>(rank_), device_names,
                            kNameBytes, ncclUint8, comm_.get(), stream()),
              "ncclAllGather");
    local_->download(names.data(), device_names, names.size());
    auto name_of = [&](std::size_t r) { return std::string_view(names.data() + r * kNameBytes); };
    int color = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(size_); ++r) {
      bool first_of_node = true;
      for (std::size_t q = 0; q < r && first_of_node; ++q) first_of_node = name_of(q) != name_of(r);
      if (name_of(r) == name_of(static_cast<std::size_t>(rank_))) return color;
      if (first_of_node) ++color;
    }
    return color;
  }

  std::unique_ptr<Communicator> withAlgorithm(int algorithm, int protocol) override {
    const std::string_view algorithm_name = ncclAlgoName(algorithm);
    if (algorithm_name.empty())
      fail("NCCL withAlgorithm: unknown algorithm {} (0..{}: types.h ncclAlgoName)", algorithm,
           kNcclAlgoCount - 1);
    const std::string_view protocol_name = ncclProtoName(protocol);
    if (protocol != -1 && protocol_name.empty())
      fail("NCCL withAlgorithm: unknown protocol {} (-1 for NCCL's choice, 0..{}: types.h ncclProtoName)",
           protocol, kNcclProtoCount - 1);
    // Per-function rules (NCCL 2.24+) leave the other collectives on NCCL's own choice.
    const ScopedEnvironment algo("NCCL_ALGO", fmt::format("allreduce:{}", algorithm_name));
    std::optional<ScopedEnvironment> proto;
    if (protocol != -1) proto.emplace("NCCL_PROTO", fmt::format("allreduce:{}", protocol_name));
    return splitWith(0, rank_);
  }

  // A split over the same ranks: its own NCCL communicator and stream, so that its collectives run
  // beside this one's (ordered with markQueue / waitForMark).
  std::unique_ptr<Communicator> concurrentCopy(std::string&) override { return splitWith(0, rank_); }

  std::unique_ptr<QueueMark> markQueue() override {
    activate();
    auto mark = std::make_unique<StreamMark>();
    checkCuda(cudaEventCreateWithFlags(&mark->event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    checkCuda(cudaEventRecord(mark->event, stream()), "cudaEventRecord");
    return mark;
  }
  void waitForMark(const QueueMark& mark) override {
    const auto* event = dynamic_cast<const StreamMark*>(&mark);
    if (event == nullptr) fail("NCCL waitForMark: the mark is not from an NCCL communicator's stream");
    activate();
    checkCuda(cudaStreamWaitEvent(stream(), event->event, 0), "cudaStreamWaitEvent");
  }

  LocalOps& local() override { return *local_; }

  std::string description() const override {
    return fmt::format("{}, {} rank{}, {}", ncclVersion(), size_, size_ == 1 ? "" : "s", device_description_);
  }

  cudaStream_t stream() const { return stream_.get(); }

 private:
  // cudaGetDevice reads a thread-local; cudaSetDevice costs a driver call, which an all-reduce of a few
  // bytes (5-6 us) would feel on every call.
  void activate() const {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device_) return;
    checkCuda(cudaSetDevice(device_), "cudaSetDevice");
  }

  void require(Element element, ReduceOp op, std::string_view what) const {
    std::string why;
    if (!supports(element, op, &why)) fail("{}: {}", what, why);
  }

  void checkCounts(std::span<const std::size_t> counts, std::string_view what) const {
    if (counts.size() != static_cast<std::size_t>(size_))
      fail("{}: {} counts for {} ranks", what, counts.size(), size_);
  }

  // A scratch buffer of at least `bytes`. Growing frees the old one with cudaFree, which waits for the
  // work queued on it.
  void* scratch(cuda::DeviceBuffer& buffer, std::size_t bytes) {
    if (buffer.size() < bytes) {
      buffer = {};
      buffer = cuda::DeviceBuffer(bytes);
    }
    return buffer.get();
  }

  std::unique_ptr<Communicator> splitWith(int color, int key) {
    activate();
    checkCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    ncclComm_t part = nullptr;
    checkNccl(ncclCommSplit(comm_.get(), color, key, &part, nullptr), "ncclCommSplit");
    return std::make_unique<NcclCommunicator>(part, device_);
  }

  struct CommDestroy {
    void operator()(ncclComm_t comm) const { ncclCommDestroy(comm); }
  };
  struct StreamDestroy {
    void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
  };

  std::unique_ptr<ncclComm, CommDestroy> comm_;
  int device_;
  std::unique_ptr<CUstream_st, StreamDestroy> stream_;
  int rank_ = 0;
  int size_ = 1;
  int compute_major_ = 0;
  std::string device_description_;
  std::unique_ptr<LocalOps> local_;
  cuda::DeviceBuffer scratch_in_;
  cuda::DeviceBuffer scratch_out_;
};

}  // namespace

bool ncclAvailable(std::string* reason) {
  return cuda::available(reason);
}

std::unique_ptr<Communicator> detail::ncclCommunicator(ncclComm_t comm, int device) {
  return std::make_unique<NcclCommunicator>(comm, device);
}

std::unique_ptr<Communicator> ncclDuplicateOf(void* job_comm, bool join) {
  auto* const parent = static_cast<ncclComm_t>(job_comm);
  int device = -1;
  checkNccl(ncclCommCuDevice(parent, &device), "ncclCommCuDevice");
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device)
    checkCuda(cudaSetDevice(device), "cudaSetDevice");
  int rank = 0;
  checkNccl(ncclCommUserRank(parent, &rank), "ncclCommUserRank");
  // The job's communicator may be nonblocking; the strategies expect every call to be complete or
  // enqueued when it returns.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t part = nullptr;
  checkNccl(ncclCommSplit(parent, join ? 0 : NCCL_SPLIT_NOCOLOR, rank, &part, &config), "ncclCommSplit");
  if (part == nullptr) return nullptr;
  return std::make_unique<NcclCommunicator>(part, device);
}

void* ncclStreamOf(Communicator& comm) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl == nullptr) fail("ncclStreamOf: not an NCCL communicator ({})", comm.description());
  return nccl->stream();
}

}  // namespace gradscope::comm
