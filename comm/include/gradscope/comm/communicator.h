#pragma once

// Communicators: the collective operations the distributed strategies (strategy.h) are written against,
// once, for two implementations: MPI (host memory, any number of processes and nodes; mpi.h) and NCCL
// (device memory, one rank per GPU; nccl.h).
//
// Semantics shared by both:
// - Collectives are called by every rank of the communicator in the same order with matching
//   arguments (MPI rules). `send == recv` means in place.
// - MPI completes each call before returning. NCCL enqueues on the communicator's stream; work is
//   complete after synchronize(). Host results (scalars) always synchronise first.
// - Buffers live in memory(): Host for MPI, Device for NCCL. local() allocates such buffers and runs
//   the methods library's kernels on them (CPU executor or CUDA stream).
// - Errors throw gradscope::Error with one line naming the operation and the backend's message.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gradscope/common/types.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/wire.h"

namespace gradscope::comm {

enum class Memory { Host, Device };

// The element type of a buffer handed to a collective.
//   Fp32, Fp64, Int32, Int64: the backend's own types and reductions.
//   Fp16, Bf16: 2-byte codes; sums decode both operands to fp32, add, and round back to the wire type
//     at every hop (MPI: a user-defined operator; NCCL: its native half and bfloat16 reductions).
//   Fp8E4M3, Fp8E5M2 with block == 0: plain 1-byte codes, one scale for the whole buffer that the
//     caller agreed on beforehand (NCCL's native fp8 types; MPI: a user operator like fp16's).
//   Fp8E4M3, Fp8E5M2 with block > 0: *scaled blocks*: each element is one record of a 4-byte fp32
//     scale followed by `block` codes (wire.h's encoding of `block` values); a sum decodes both
//     records, adds in fp32 and re-encodes with the new block amax (MPI only: supportsScaledBlocks()).
struct Element {
  DType dtype = DType::Fp32;
  std::size_t block = 0;

  bool operator==(const Element&) const = default;
};

// Bytes of one element (a whole record for scaled fp8 blocks).
std::size_t elementBytes(Element element);

// A buffer in a communicator's memory, freed by its owner.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, std::size_t bytes, void (*release)(void*))
      : data_(data), bytes_(bytes), release_(release) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t size() const { return bytes_; }
  void reset();

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  void (*release_)(void*) = nullptr;
};

// Local work on a communicator's memory: the methods library on the CPU (Host) or on the
// communicator's CUDA stream (Device), ordered with its collectives.
class LocalOps {
 public:
  virtual ~LocalOps() = default;
  virtual Memory memory() const = 0;
  virtual Buffer allocate(std::size_t bytes) = 0;  // contents undefined
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void fillZero(void* dst, std::size_t bytes) = 0;
  // host -> memory(), and memory() -> host (download synchronises).
  virtual void upload(void* dst, const void* host, std::size_t bytes) = 0;
  virtual void download(void* host, const void* src, std::size_t bytes) = 0;

  // wire.h: separate codes and scales.
  virtual methods::EncodeStats encode(WireFormat format, const float* in, std::size_t count, void* out,
                                      float* scales, const methods::EncodeOptions& options) = 0;
  virtual void decode(WireFormat format, const void* in, const float* scales, std::size_t count, float* out,
                      float postscale, std::size_t block) = 0;
  // fp8 scaled-block records (Element{fp8, block}): ceil(count / block) records; the last block's
  // unused codes are written as zeros and ignored by decode. Only where the communicator
  // supportsScaledBlocks() (MPI); elsewhere these throw gradscope::Error.
  virtual methods::EncodeStats encodeScaledBlocks(WireFormat format, const float* in, std::size_t count,
                                                  std::size_t block, float prescale, void* records) = 0;
  virtual void decodeScaledBlocks(WireFormat format, const void* records, std::size_t count,
                                  std::size_t block, float postscale, float* out) = 0;

  // out = in · factor in fp32 (out may be in).
  virtual void scale(const float* in, std::size_t count, float factor, float* out) = 0;
  // a·b, ‖a‖², ‖b‖² in fp64, one pass, in adaptive.h's order (the bits of methods::dotProducts).
  virtual methods::DotProducts dotProducts(const float* a, const float* b, std::size_t count) = 0;
  // adaptive.h's a ⊕ b (out may alias a or b).
  virtual void adasumPair(const float* a, const float* b, std::size_t count, float* out) = 0;
  // Largest finite |x| (0 for an empty or all-non-finite buffer).
  virtual float finiteAmax(const float* in, std::size_t count) = 0;
  // methods/delayed.h (async/dga<K>): out = sum + ranks · (gradient − older), then older = gradient;
  // fp32, fp64, fp16, bf16 (out may be gradient).
  virtual void delayedCorrection(DType dtype, const void* gradient, void* older, const void* sum, void* out,
                                 std::size_t count, double ranks) = 0;
};

// A reduction in flight (Communicator::startAllReduce): test() says whether it is complete, and moves it
// on where the library moves reductions only when asked (MPI). Destroying it waits for it.
class PendingReduction {
 public:
  virtual ~PendingReduction() = default;
  virtual bool test() = 0;
};

// A point in a communicator's queue of work (NCCL: an event recorded on its stream), which another
// communicator's later work can wait for without the host waiting (Communicator::waitForMark).
class QueueMark {
 public:
  virtual ~QueueMark() = default;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual Backend backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Memory memory() const = 0;
  // Element{fp8, block > 0} reductions (MPI yes, NCCL no: it has per-buffer fp8 only).
  virtual bool supportsScaledBlocks() const = 0;
  // Whether `element` can be reduced with `op` / moved at all here, and if not why (one line).
  virtual bool supports(Element element, ReduceOp op, std::string* why_not = nullptr) const = 0;

  // recv = op over ranks of send, on every rank.
  virtual void allReduce(const void* send, void* recv, std::size_t count, Element type, ReduceOp op) = 0;
  // Uneven blocks: rank r receives counts[r] elements, the ones at offset Σ_{q<r} counts[q] of send.
  virtual void reduceScatter(const void* send, void* recv, std::span<const std::size_t> counts, Element type,
                             ReduceOp op) = 0;
  // Rank r contributes counts[r] elements; recv gets all of them in rank order. send may be recv +
  // offset of this rank (in place).
  virtual void allGather(const void* send, void* recv, std::span<const std::size_t> counts, Element type) = 0;
  // recv (significant on root only) = op over ranks of send.
  virtual void reduce(const void* send, void* recv, std::size_t count, Element type, ReduceOp op,
                      int root) = 0;
  virtual void broadcast(void* buffer, std::size_t count, Element type, int root) = 0;
  // Point to point (AdaSum's pairwise schedule). Both sides must call in matching order.
  virtual void send(const void* buffer, std::size_t count, Element type, int peer) = 0;
  virtual void recv(void* buffer, std::size_t count, Element type, int peer) = 0;
  // Sends `send_count` elements to `destination` while receiving `recv_count` from `source`, both at
  // once (one step of a pairwise exchange in which every rank sends and receives: it cannot deadlock).
  // recv_count must equal what the source sends; either count may be 0.
  virtual void sendRecv(const void* send, std::size_t send_count, int destination, void* recv,
                        std::size_t recv_count, int source, Element type) = 0;

  // Host values: every rank's `values` (the same number on every rank), in rank order: rank r's at
  // [r·k, r·k + k) for k = values.size(). One collective, whatever k.
  virtual std::vector<double> allGatherValues(std::span<const double> values) = 0;
  // Every rank's `value`, in rank order.
  std::vector<double> allGatherScalars(double value) { return allGatherValues({&value, 1}); }
  // The maximum over ranks.
  virtual double allReduceMax(double value) = 0;
  virtual void barrier() = 0;
  // Waits until enqueued collectives and local work are complete (NCCL: the stream; MPI: nothing).
  virtual void synchronize() = 0;

  // Ranks with equal `color` form a new communicator, ordered by `key` (then by rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // The two communicators of a hierarchical all-reduce (sum/hier): the ranks of this rank's node
  // (nodeColor()), and the nodes' first ranks (a communicator of its own for the others). Collective.
  // By default two splits; a backend may hand out ones it made before (a sealed MPI communicator).
  struct Hierarchy {
    std::unique_ptr<Communicator> node;
    std::unique_ptr<Communicator> leaders;
  };
  virtual Hierarchy hierarchy();
  // Which node this rank is on, as a small integer equal on ranks that share a node: ranks with the
  // same host name, or, when GRADSCOPE_RANKS_PER_NODE=k is set (to try hierarchical strategies on one
  // machine), rank / k. Collective.
  virtual int nodeColor() = 0;

  // A communicator over the same ranks whose own all-reduce uses one engine algorithm:
  //   MPI: Open MPI's coll/tuned all-reduce algorithm id (1 basic_linear, 2 nonoverlapping,
  //        3 recursive_doubling, 4 ring, 5 segmented_ring, 6 rabenseifner);
  //   NCCL: algorithm and protocol indices (types.h ncclAlgoName / ncclProtoName).
  // Collective. Throws gradscope::Error when the backend cannot force it (and says why).
  virtual std::unique_ptr<Communicator> withAlgorithm(int algorithm, int protocol) = 0;

  // allReduce started and left to complete: a thread that tests it now and then, instead of blocking in
  // the library (which busy-polls), leaves the CPU to the job (the async strategies' worker, async.h).
  // By default the blocking allReduce, complete on return.
  virtual std::unique_ptr<PendingReduction> startAllReduce(const void* send, void* recv, std::size_t count,
                                                           Element type, ReduceOp op);

  // A communicator over the same ranks whose collectives may run while this one's run (the async
  // strategies' sums, async.h): MPI, on another thread; NCCL, queued on a CUDA stream of its own. Collective.
  // nullptr, with one line in `why_not`, where this process cannot: MPI below MPI_THREAD_MULTIPLE, a sealed
  // MPI communicator not sealed with one (mpiDuplicateOf).
  virtual std::unique_ptr<Communicator> concurrentCopy(std::string& why_not);

  // Ordering between communicators whose work is queued (NCCL: each on its own stream), without the host
  // waiting: markQueue() marks everything queued here so far, and waitForMark(mark) makes the work queued
  // here from then on start after it, whichever communicator's queue the mark is from. Where every call
  // is complete when it returns (MPI), markQueue() is nullptr and waitForMark() has nothing to do.
  virtual std::unique_ptr<QueueMark> markQueue();
  virtual void waitForMark(const QueueMark& mark);

  virtual LocalOps& local() = 0;
  // One line for reports: "MPI, 2 ranks on 1 node (Open MPI 4.1.4)", "NCCL 2.28.9, 1 rank, NVIDIA H100".
  virtual std::string description() const = 0;
};

}  // namespace gradscope::comm
