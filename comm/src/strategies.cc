// The distributed strategies of strategy.h, each written once against communicator.h.
//
// A sum is one all-reduce of some element type: the job's dtype, or a wire precision that the input is
// encoded into first and decoded from afterwards. TransportPath implements that all-reduce for every
// transport (native, rs_ag, reduce_bcast, hier, engine) parameterised by the Element, so that the wire
// precisions run over exactly the same code as the job's own dtype.
//
// Sub-communicators (hier's node and leaders communicators, an engine communicator) may order their work
// on streams of their own (NCCL): work is handed from one communicator to another with synchronize()
// on the one that did the previous work. On MPI synchronize() does nothing, so this costs nothing there.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "adaptive_scalars.h"
#include "gradscope/comm/async.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/error.h"
#include "pipelined_rs_ag.h"
#include "reduction_order.h"

namespace gradscope::comm {
namespace {

// A scratch buffer in a communicator's memory that grows to the largest size asked for and is then
// reused, so that repeated runs (a benchmark's iterations) do not allocate.
class Scratch {
 public:
  void* get(LocalOps& local, std::size_t bytes) {
    if (buffer_.size() < bytes || buffer_.get() == nullptr) {
      buffer_.reset();
      buffer_ = local.allocate(std::max<std::size_t>(bytes, 1));
    }
    return buffer_.get();
  }
  template <typename T>
  T* as(LocalOps& local, std::size_t count) {
    return static_cast<T*>(get(local, count * sizeof(T)));
  }
  void* data() const { return buffer_.get(); }

 private:
  Buffer buffer_;
};

constexpr Element kFp32{DType::Fp32};

bool isSumDType(DType dtype) {
  return dtype == DType::Fp32 || dtype == DType::Fp64 || dtype == DType::Fp16 || dtype == DType::Bf16;
}

// How a wire precision travels on `comm`: fp16/bf16 as 2-byte codes; fp8 as scaled-block records where
// the backend can reduce them (MPI), else as plain codes under one scale per buffer (NCCL's fp8 types).
Element wireElement(const Communicator& comm, WireFormat format, std::size_t fp8_block) {
  const bool scaled_blocks = methods::isFp8(format) && comm.supportsScaledBlocks();
  return Element{methods::wireDType(format), scaled_blocks ? fp8_block : 0};
}

// ---- Transports --------------------------------------------------------------------------------------

// recv = Σ_r send_r of `count` elements of any Element, by one transport. Built once per strategy
// (collective: hier splits the communicator, an engine transport duplicates it).
class TransportPath {
 public:
  TransportPath(const StrategyName& name, Communicator& comm) : transport_(name.transport), comm_(comm) {
    switch (transport_) {
      case Transport::Hier: {
        Communicator::Hierarchy hierarchy = comm.hierarchy();
        node_ = std::move(hierarchy.node);
        leaders_ = std::move(hierarchy.leaders);
        break;
      }
      case Transport::Engine: engine_ = comm.withAlgorithm(name.algorithm, name.protocol); break;
      case Transport::RsAg:
        if (comm.memory() == Memory::Host) pipelined_ = std::make_unique<PipelinedRsAg>(comm);
        break;
      case Transport::Native:
      case Transport::ReduceBcast: break;
    }
  }

  // rs_ag on host memory: the pipelined form that fp32 sums and the wire precisions take
  // (pipelined_rs_ag.h); null for other transports and on devices, where the backend's own
  // reduce-scatter and all-gather run.
  PipelinedRsAg* pipelined() const { return pipelined_.get(); }

  // send may equal recv. The native transport alone is a tail call, with no frame: the other transports'
  // code inlined here gave every 8-byte call a frame of saved registers.
  void allReduce(const void* send, void* recv, std::size_t count, Element element) {
    if (transport_ == Transport::Native) return comm_.allReduce(send, recv, count, element, ReduceOp::Sum);
    allReduceOther(send, recv, count, element);
  }

 private:
  [[gnu::noinline]] void allReduceOther(const void* send, void* recv, std::size_t count, Element element) {
    switch (transport_) {
      case Transport::Native: comm_.allReduce(send, recv, count, element, ReduceOp::Sum); break;
      case Transport::RsAg:
        if (pipelined_ && element == kFp32) {
          pipelined_->sum(static_cast<const float*>(send), static_cast<float*>(recv), count);
        } else {
          reduceScatterAllGather(send, recv, count, element);
        }
        break;
      case Transport::ReduceBcast:
        comm_.reduce(send, recv, count, element, ReduceOp::Sum, 0);
        comm_.broadcast(recv, count, element, 0);
        break;
      case Transport::Hier: hierarchical(send, recv, count, element); break;
      case Transport::Engine:
        comm_.synchronize();
        engine_->allReduce(send, recv, count, element, ReduceOp::Sum);
        engine_->synchronize();
        break;
    }
  }

  // Rank r reduces block r (count/N elements, one more on the first count % N ranks), then every rank
  // gathers all blocks. Out of place the block is reduced straight into its place in recv and gathered
  // in place; in place it cannot be (recv is still the input), so it goes through a scratch block.
  void reduceScatterAllGather(const void* send, void* recv, std::size_t count, Element element) {
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto rank = static_cast<std::size_t>(comm_.rank());
    counts_.resize(ranks);
    std::size_t offset = 0;
    for (std::size_t q = 0; q < ranks; ++q) {
      counts_[q] = count / ranks + (q < count % ranks ? 1 : 0);
      if (q < rank) offset += counts_[q];
    }
    const std::size_t bytes = elementBytes(element);
    void* block = send == recv ? block_.get(comm_.local(), counts_[rank] * bytes)
                               : static_cast<char*>(recv) + offset * bytes;
    comm_.reduceScatter(send, block, counts_, element, ReduceOp::Sum);
    comm_.allGather(block, recv, counts_, element);
  }

  // Node-local reduce to the node's first rank, all-reduce among the node leaders, node-local broadcast.
  void hierarchical(const void* send, void* recv, std::size_t count, Element element) {
    comm_.synchronize();
    node_->reduce(send, recv, count, element, ReduceOp::Sum, 0);
    if (node_->rank() == 0) {
      node_->synchronize();
      leaders_->allReduce(recv, recv, count, element, ReduceOp::Sum);
      leaders_->synchronize();
    }
    node_->broadcast(recv, count, element, 0);
    node_->synchronize();
  }

  Transport transport_;
  Communicator& comm_;
  std::unique_ptr<Communicator> node_;        // hier: the ranks of this node
  std::unique_ptr<Communicator> leaders_;     // hier: the first rank of every node
  std::unique_ptr<Communicator> engine_;      // engine: the all-reduce algorithm forced
  std::unique_ptr<PipelinedRsAg> pipelined_;  // rs_ag on the host
  std::vector<std::size_t> counts_;           // rs_ag: elements per rank
  Scratch block_;                             // rs_ag in place: this rank's reduced block
};

// ---- sum -------------------------------------------------------------------------------------------------

class SumStrategy final : public Strategy {
 public:
  SumStrategy(const StrategyName& name, Communicator& comm, DType dtype, const StrategyOptions& options)
      : Strategy(name), comm_(comm), dtype_(dtype), options_(options), path_(name, comm) {}

  bool lossless() const override { return !name().wire; }

  RunStats run(const void* send, void* recv, std::size_t count) override {
    if (count == 0) return {};
    if (!name().wire) {
      path_.allReduce(send, recv, count, Element{dtype_});
      return {};
    }
    return runOnWire(*name().wire, static_cast<const float*>(send), static_cast<float*>(recv), count);
  }

 private:
  // Each rank encodes x_r · (1/N) so that the sum of N values stays within the wire type's range, the
  // transport sums the codes (rounding to the wire type at every hop), and the result is decoded with
  // postscale N. The transport runs in place on one wire buffer. rs_ag on the host does the same chunk
  // by chunk, the conversions fused into its pipeline (pipelined_rs_ag.h).
  [[gnu::noinline]] RunStats runOnWire(WireFormat format, const float* send, float* recv, std::size_t count) {
    LocalOps& local = comm_.local();
    const auto ranks = static_cast<float>(comm_.size());
    const float prescale = 1.0f / ranks;
    const Element element = wireElement(comm_, format, options_.fp8_block);
    RunStats stats;
    if (PipelinedRsAg* pipelined = path_.pipelined();
        pipelined && (!methods::isFp8(format) || element.block > 0)) {
      stats.wire = pipelined->sumOnWire(format, options_.fp8_block, send, recv, count);
    } else if (!methods::isFp8(format)) {
      void* codes = wire_.get(local, count * elementBytes(element));
      stats.wire = local.encode(format, send, count, codes, nullptr,
                                {.prescale = prescale, .count = options_.wire_stats});
      path_.allReduce(codes, codes, count, element);
      local.decode(format, codes, nullptr, count, recv, ranks, options_.fp8_block);
    } else if (element.block > 0) {
      const std::size_t records = (count + element.block - 1) / element.block;
      void* data = wire_.get(local, records * elementBytes(element));
      stats.wire = local.encodeScaledBlocks(format, send, count, element.block, prescale, data);
      path_.allReduce(data, data, records, element);
      local.decodeScaledBlocks(format, data, count, element.block, ranks, recv);
    } else {
      void* codes = wire_.get(local, count + 1);
      stats.wire = encodeWithAgreedScale(format, send, count, prescale, codes);
      path_.allReduce(codes, codes, count, element);
      local.decode(format, codes, scale_.as<float>(local, 1), count, recv, ranks, count + 1);
    }
    return stats;
  }

  // Plain fp8 codes need one scale that every rank uses, and room for the sum of N codes: scale =
  // A / fp8_max with A the largest finite |x| over all ranks, applied to x · (1/N), so every code is
  // at most fp8_max / N and the N-rank sum of codes stays in range. (A scale from the prescaled values
  // themselves would cancel the 1/N and let the sum saturate.) LocalOps::encode derives its scale from
  // the block's largest |x · prescale|, so the input is encoded as one block with A · N appended: that
  // element's v is A (to an ulp), above every other |x| / N, on every rank, hence the same scale
  // everywhere; its own code is not sent. `codes` has room for count + 1; the scale goes to scale_.
  methods::EncodeStats encodeWithAgreedScale(WireFormat format, const float* send, std::size_t count,
                                             float prescale, void* codes) {
    LocalOps& local = comm_.local();
    const auto amax = static_cast<float>(comm_.allReduceMax(local.finiteAmax(send, count)));
    const float anchor = amax * static_cast<float>(comm_.size());
    float* staged = staging_.as<float>(local, count + 1);
    local.copy(staged, send, count * sizeof(float));
    local.upload(staged + count, &anchor, sizeof(float));
    return local.encode(format, staged, count + 1, codes, scale_.as<float>(local, 1),
                        {.prescale = prescale, .block = count + 1, .count = options_.wire_stats});
  }

  Communicator& comm_;
  DType dtype_;
  StrategyOptions options_;
  TransportPath path_;
  Scratch wire_;     // the codes or scaled-block records
  Scratch staging_;  // plain fp8: the input and the agreed amax
  Scratch scale_;    // plain fp8: the agreed scale
};

// ---- adacons ---------------------------------------------------------------------------------------------

// The AdaCons step of adaptive.h with collectives: g_sum = Σ g_j by an fp32 all-reduce over the
// strategy's transport; this rank's ⟨g_sum, g_i⟩,
// ‖g_i‖² and ‖g_sum‖² as methods::dot in the methods library's block order; the per-rank sums all-gathered
// into the same GradientStats methods::adacons builds, so its scalar code (adaptive_scalars.h: α, the
// weights with momentum, the norms, the scale, the coefficients) runs unchanged on every rank; then
// Σ_i c_i · g_i by a second all-reduce over the same transport.
//
// Bit for bit: methods::adacons sums g_sum in fp64, the all-reduce in fp32, so the scalars are the same
// bits whenever the fp32 sum is exact (verifiable inputs), and close to them otherwise. The aggregate
// cannot be: methods::adacons accumulates Σ_i c_i·g_i[e] in fp64 and rounds once, while here each rank
// rounds c_i and c_i·g_i to fp32 and the all-reduce adds in fp32, within (N+2)·2^-24·Σ_i|c_i·g_i[e]|
// of it (docs/methods.md). An fp64 second all-reduce would match bit for bit for N = 2 (one addition,
// which commutes) but moves twice the bytes.
class AdaConsStrategy final : public Strategy {
 public:
  AdaConsStrategy(const StrategyName& name, Communicator& comm, const StrategyOptions& options)
      : Strategy(name), comm_(comm), options_(options.adacons), path_(name, comm) {}

  bool lossless() const override { return false; }

  RunStats run(const void* send_bytes, void* recv_bytes, std::size_t count) override {
    if (count == 0) return {};
    const auto* send = static_cast<const float*>(send_bytes);
    auto* recv = static_cast<float*>(recv_bytes);
    LocalOps& local = comm_.local();

    // g_sum goes to recv when it is free: in place, the input is still needed until the last pass.
    float* sum = send == recv ? sum_.as<float>(local, count) : recv;
    path_.allReduce(send, sum, count, kFp32);
    methods::detail::GradientStats stats;
    // ⟨g_sum, g_i⟩, ‖g_sum‖² (for the scale) and ‖g_i‖² in one pass over both vectors.
    const methods::DotProducts dots = local.dotProducts(sum, send, count);
    // Both per-rank scalars in one all-gather: (⟨g_sum, g_i⟩, ‖g_i‖²) of rank r at [2r, 2r + 2).
    const double mine[2] = {dots.ab, dots.bb};
    const std::vector<double> all = comm_.allGatherValues(mine);
    stats.dots.resize(all.size() / 2);
    stats.squares.resize(all.size() / 2);
    for (std::size_t r = 0; r < stats.dots.size(); ++r) {
      stats.dots[r] = all[2 * r];
      stats.squares[r] = all[2 * r + 1];
    }
    if (options_.scale != methods::AdaConsScale::Paper) stats.sum_squares = dots.aa;

    RunStats result;
    result.adacons = std::make_unique<const methods::AdaConsStep>(
        methods::detail::adaconsStepFromStats(stats, state_, options_));
    const double coefficient =
        methods::detail::adaconsCoefficients(*result.adacons)[static_cast<std::size_t>(comm_.rank())];
    local.scale(send, count, static_cast<float>(coefficient), recv);
    path_.allReduce(recv, recv, count, kFp32);
    return result;
  }

 private:
  Communicator& comm_;
  methods::AdaConsOptions options_;
  TransportPath path_;
  methods::AdaConsState state_;  // momentum, carried across runs
  Scratch sum_;                  // g_sum when running in place
};

// ---- adasum ----------------------------------------------------------------------------------------------

// AdaSum over the ranks in the order of methods::adasum: every rank walks the same list of tree steps
// (reduction_order.h). Input i lives on rank i; a step's result lives on one rank, which owns that slot.
// A step x ⊕ y runs on the rank that owns its destination (for a new slot, the rank of its first input),
// after the rank holding the other operand has sent it over; operands keep adaptive.cc's order, so each
// step is the same adasumPair call with the same bits. The last step writes recv on its rank, which then
// broadcasts it.
//
// It cannot deadlock: the first step in the list that is not complete has both its ranks waiting on it,
// since each rank takes its steps in list order. For N not a power of two the steps are those of the
// local recursive form: pairs, pairs of pairs, and the leftover partials combined smallest first.
class AdaSumStrategy final : public Strategy {
 public:
  AdaSumStrategy(const StrategyName& name, Communicator& comm) : Strategy(name), comm_(comm) {
    steps_ = methods::detail::treeSteps(static_cast<std::size_t>(comm.size()), slot_count_);
    slots_.resize(slot_count_);
  }

  bool lossless() const override { return false; }

  RunStats run(const void* send_bytes, void* recv_bytes, std::size_t count) override {
    if (count == 0) return {};
    const auto* send = static_cast<const float*>(send_bytes);
    auto* recv = static_cast<float*>(recv_bytes);
    LocalOps& local = comm_.local();
    if (steps_.empty()) {  // one rank
      if (send != recv) local.copy(recv, send, count * sizeof(float));
      return {};
    }
    const int rank = comm_.rank();
    std::vector<int> slot_owner(slot_count_, -1);
    int root = 0;
    for (std::size_t s = 0; s < steps_.size(); ++s) {
      const methods::detail::TreeStep& step = steps_[s];
      // The operands in adaptive.cc's order, where each lives, and where the result goes.
      Operand left, right;
      std::size_t destination = 0;
      switch (step.shape) {
        case methods::detail::TreeShape::InputInput:
          left = input(step.a);
          right = input(step.b);
          destination = step.destination;
          slot_owner[destination] = left.owner;
          break;
        case methods::detail::TreeShape::SlotInput:
          left = slot(step.a, slot_owner);
          right = input(step.b);
          destination = step.a;
          break;
        case methods::detail::TreeShape::SlotSlot:
          left = slot(step.a, slot_owner);
          right = slot(step.b, slot_owner);
          destination = step.b;
          break;
      }
      const int worker = slot_owner[destination];
      // At most one operand is elsewhere (every rank holds one input and owns at most one slot at a time,
      // but the code does not rely on it).
      const bool left_is_remote = left.owner != worker;
      const Operand& remote = left_is_remote ? left : right;
      const bool transfer = remote.owner != worker;
      const bool last = s + 1 == steps_.size();
      if (transfer && rank == remote.owner) comm_.send(data(remote, send), count, kFp32, worker);
      if (rank == worker) {
        const float* incoming = nullptr;
        if (transfer) {
          float* buffer = incoming_.as<float>(local, count);
          comm_.recv(buffer, count, kFp32, remote.owner);
          incoming = buffer;
        }
        const float* a = transfer && left_is_remote ? incoming : data(left, send);
        const float* b = transfer && !left_is_remote ? incoming : data(right, send);
        float* out = last ? recv : slots_[destination].as<float>(local, count);
        local.adasumPair(a, b, count, out);
      }
      if (last) root = worker;
    }
    comm_.broadcast(recv, count, kFp32, root);
    return {};
  }

 private:
  struct Operand {
    bool is_slot = false;
    std::size_t index = 0;
    int owner = 0;
  };
  static Operand input(std::size_t index) { return {false, index, static_cast<int>(index)}; }
  static Operand slot(std::size_t index, const std::vector<int>& owner) {
    return {true, index, owner[index]};
  }
  // Valid on the operand's owner only.
  const float* data(const Operand& operand, const float* send) const {
    return operand.is_slot ? static_cast<const float*>(slots_[operand.index].data()) : send;
  }

  Communicator& comm_;
  std::vector<methods::detail::TreeStep> steps_;
  std::size_t slot_count_ = 0;
  std::vector<Scratch> slots_;  // partial results this rank owns, by slot
  Scratch incoming_;            // the other operand of a step this rank computes
};

// ---- makeStrategy ------------------------------------------------------------------------------------

void checkSumInput(const StrategyName& name, const Communicator& comm, DType dtype,
                   const StrategyOptions& options) {
  std::string why;
  if (name.wire) {
    if (dtype != DType::Fp32) fail("{} needs fp32 input, not {}", name.text(), gradscope::name(dtype));
    if (methods::isFp8(*name.wire) && options.fp8_block == 0)
      fail("{}: the fp8 scaling block must be at least 1 element", name.text());
    const Element element = wireElement(comm, *name.wire, options.fp8_block);
    if (!comm.supports(element, ReduceOp::Sum, &why)) fail("{} is not available here: {}", name.text(), why);
    return;
  }
  if (!isSumDType(dtype))
    fail("{} takes fp32, fp64, fp16 or bf16 input, not {}", name.text(), gradscope::name(dtype));
  if (!comm.supports(Element{dtype}, ReduceOp::Sum, &why))
    fail("{} on {} input is not available here: {}", name.text(), gradscope::name(dtype), why);
}

}  // namespace

std::unique_ptr<Strategy> makeStrategy(const StrategyName& name, Communicator& comm, DType dtype,
                                       const StrategyOptions& options) {
  if (name.transport == Transport::Engine) {
    const bool mpi = name.engine == Backend::Mpi && !mpiAlgorithmName(name.algorithm).empty();
    const bool nccl = name.engine == Backend::Nccl && !ncclAlgoName(name.algorithm).empty() &&
                      !ncclProtoName(name.protocol).empty();
    if (!mpi && !nccl) fail("strategy name with an engine transport but no valid MPI or NCCL algorithm");
    if (name.engine != comm.backend())
      fail("{} needs the {} backend, not {}", name.text(), gradscope::name(name.engine),
           gradscope::name(comm.backend()));
  }
  if (name.aggregator == Aggregator::Async) {
    if (name.wire || name.transport != Transport::Native)
      fail("{}: async takes no transport or wire", name.text());
    auto worker =
        options.async_worker ? options.async_worker : AsyncWorker::make(comm, options.async_thread_start);
    return std::make_unique<AsyncStrategy>(name, comm, dtype, std::move(worker));
  }
  if (name.aggregator != Aggregator::Sum && name.wire)
    fail("{}: adacons and adasum take no wire precision", name.text());
  if (name.aggregator == Aggregator::AdaSum && name.transport != Transport::Native)
    fail("{}: adasum only runs as adasum/native", name.text());
  if (name.aggregator != Aggregator::Sum && dtype != DType::Fp32)
    fail("{} needs fp32 input, not {}", name.text(), gradscope::name(dtype));

  switch (name.aggregator) {
    case Aggregator::Sum:
      checkSumInput(name, comm, dtype, options);
      return std::make_unique<SumStrategy>(name, comm, dtype, options);
    case Aggregator::AdaCons: return std::make_unique<AdaConsStrategy>(name, comm, options);
    case Aggregator::AdaSum: return std::make_unique<AdaSumStrategy>(name, comm);
    case Aggregator::Async: break;  // above
  }
  fail("unknown aggregator in strategy name");
}

std::vector<StrategyName> applicableStrategies(const Communicator& comm, DType dtype) {
  std::vector<StrategyName> names;
  if (!isSumDType(dtype) || !comm.supports(Element{dtype}, ReduceOp::Sum)) return names;
  const auto add = [&names](Aggregator aggregator, Transport transport,
                            std::optional<WireFormat> wire = std::nullopt) -> StrategyName& {
    StrategyName& name = names.emplace_back();
    name.aggregator = aggregator;
    name.transport = transport;
    name.wire = wire;
    return name;
  };
  constexpr Transport kTransports[] = {Transport::Native, Transport::RsAg, Transport::ReduceBcast,
                                       Transport::Hier};
  for (Transport transport : kTransports) add(Aggregator::Sum, transport);
  if (dtype == DType::Fp32) {
    const std::size_t block = StrategyOptions{}.fp8_block;
    for (Transport transport : kTransports)
      for (WireFormat format : kWireFormats)
        if (comm.supports(wireElement(comm, format, block), ReduceOp::Sum))
          add(Aggregator::Sum, transport, format);
  }
  if (comm.backend() == Backend::Mpi) {
    for (int algorithm = 1; !mpiAlgorithmName(algorithm).empty(); ++algorithm) {
      StrategyName& name = add(Aggregator::Sum, Transport::Engine);
      name.engine = Backend::Mpi;
      name.algorithm = algorithm;
    }
  } else if (comm.backend() == Backend::Nccl) {
    // NCCL's usual choices for all-reduce; CollNet, NVLS and PAT need hardware or versions most
    // machines lack (they can still be named explicitly).
    constexpr int kRing = 1, kTree = 0;
    for (int algorithm : {kRing, kTree})
      for (int protocol = 0; protocol < kNcclProtoCount; ++protocol) {
        StrategyName& name = add(Aggregator::Sum, Transport::Engine);
        name.engine = Backend::Nccl;
        name.algorithm = algorithm;
        name.protocol = protocol;
      }
  }
  if (dtype == DType::Fp32) {
    add(Aggregator::AdaCons, Transport::Native);
    add(Aggregator::AdaCons, Transport::RsAg);
    add(Aggregator::AdaSum, Transport::Native);
  }
  return names;
}

}  // namespace gradscope::comm
