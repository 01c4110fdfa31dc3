#include "pipelined_rs_ag.h"

#include <algorithm>

#include "gradscope/common/error.h"
#include "host_local_ops.h"

namespace gradscope::comm {
namespace {

// out = a + b in fp32 (out may be a or b).
void add(const float* a, const float* b, std::size_t count, float* out) {
  for (std::size_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

template <typename T>
T* sized(std::vector<T>& buffer, std::size_t count) {
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

}  // namespace

struct PipelinedRsAg::Wire {
  WireFormat format;
  std::size_t block = 0;  // fp8: elements per scaled-block record; 0 for 2-byte codes
  Element element;        // what the exchange moves: codes or records
};

void PipelinedRsAg::layout(std::size_t count, std::size_t unit) {
  const auto ranks = static_cast<std::size_t>(comm_.size());
  const std::size_t units = (count + unit - 1) / unit;
  count_ = count;
  unit_ = unit;
  chunk_units_ = std::max<std::size_t>(1, kChunkBytes / (unit * sizeof(float)));
  units_.resize(ranks);
  offsets_.resize(ranks);
  std::size_t offset = 0;
  for (std::size_t q = 0; q < ranks; ++q) {
    units_[q] = units / ranks + (q < units % ranks ? 1 : 0);
    offsets_[q] = offset;
    offset += units_[q];
  }
}

PipelinedRsAg::Part PipelinedRsAg::part(int rank, std::size_t chunk) const {
  const auto q = static_cast<std::size_t>(rank);
  const std::size_t skip = chunk * chunk_units_;
  Part part;
  part.units = skip < units_[q] ? std::min(chunk_units_, units_[q] - skip) : 0;
  const std::size_t first_unit = offsets_[q] + std::min(skip, units_[q]);
  part.first = std::min(count_, first_unit * unit_);
  part.floats = std::min(count_, (first_unit + part.units) * unit_) - part.first;
  return part;
}

void PipelinedRsAg::sum(const float* send, float* recv, std::size_t count) {
  run(send, recv, count, nullptr);
}

methods::EncodeStats PipelinedRsAg::sumOnWire(WireFormat format, std::size_t fp8_block, const float* send,
                                              float* recv, std::size_t count) {
  Wire wire{.format = format, .block = methods::isFp8(format) ? fp8_block : 0, .element = {}};
  if (methods::isFp8(format) && fp8_block == 0)
    fail("rs_ag: the fp8 scaling block must be at least 1 element");
  wire.element = Element{methods::wireDType(format), wire.block};
  return run(send, recv, count, &wire);
}

methods::EncodeStats PipelinedRsAg::run(const float* send, float* recv, std::size_t count, const Wire* wire) {
  if (count == 0) return {};
  const int ranks = comm_.size();
  const int rank = comm_.rank();
  layout(count, wire != nullptr && wire->block > 0 ? wire->block : 1);
  const std::size_t chunks = (units_[0] + chunk_units_ - 1) / chunk_units_;  // rank 0 has the most units
  const float prescale = 1.0f / static_cast<float>(ranks);
  const auto postscale = static_cast<float>(ranks);
  const Element fp32{DType::Fp32};

  // A part's wire form: 2-byte codes, or records of a 4-byte scale and `block` codes (the unused codes of
  // a short last block zero).
  const std::size_t unit_bytes = wire != nullptr ? elementBytes(wire->element) : sizeof(float);
  const std::size_t part_bytes = chunk_units_ * unit_bytes;
  std::uint8_t* outgoing = wire != nullptr ? sized(outgoing_, part_bytes) : nullptr;
  std::uint8_t* incoming = wire != nullptr ? sized(incoming_, part_bytes) : nullptr;
  std::uint8_t* own = wire != nullptr ? sized(own_, part_bytes) : nullptr;
  // 2-byte codes are summed hop by hop like the backend's own wire reductions (methods::addCodes: decode
  // both, add in fp32, round back, in one pass); fp8 records accumulate in fp32 and are encoded once,
  // with the block amax of the sum.
  const bool records = wire != nullptr && wire->block > 0;
  const bool codes_hop = wire != nullptr && !records;
  float* accumulator = records ? sized(accumulator_, chunk_units_ * unit_) : nullptr;
  float* decoded = records ? sized(decoded_, chunk_units_ * unit_) : nullptr;
  float* incoming_floats = wire == nullptr ? sized(incoming_floats_, chunk_units_) : nullptr;

  const auto encode = [&](const float* in, const Part& p, float scale, void* out) {
    if (wire->block == 0)
      return methods::encode(wire->format, in, p.floats, out, nullptr, {.prescale = scale}, serialExecutor());
    std::uint8_t* codes = sized(fp8_codes_, p.units * wire->block);
    float* scales = sized(fp8_scales_, p.units);
    const methods::EncodeStats stats =
        methods::encode(wire->format, in, p.floats, codes, scales, {.prescale = scale, .block = wire->block},
                        serialExecutor());
    std::fill(codes + p.floats, codes + p.units * wire->block, std::uint8_t{0});
    packRecords(scales, codes, p.units, wire->block, out);
    return stats;
  };
  const auto decode = [&](const void* in, const Part& p, float scale, float* out) {
    if (wire->block == 0) {
      methods::decode(wire->format, in, nullptr, p.floats, out, scale, methods::EncodeOptions{}.block,
                      serialExecutor());
      return;
    }
    std::uint8_t* codes = sized(fp8_codes_, p.units * wire->block);
    float* scales = sized(fp8_scales_, p.units);
    unpackRecords(in, p.units, wire->block, scales, codes);
    methods::decode(wire->format, codes, scales, p.floats, out, scale, wire->block, serialExecutor());
  };

  methods::EncodeStats stats;
  const auto count_encode = [&stats](const methods::EncodeStats& more) {
    stats.overflow += more.overflow;
    stats.nan += more.nan;
  };
  for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
    const Part mine = part(rank, chunk);
    // Reduce-scatter: this rank's part of the chunk, summed over all ranks.
    if (wire != nullptr) {
      // Its own value goes through the wire precision like everyone else's.
      count_encode(encode(send + mine.first, mine, prescale, own));
      if (records) decode(own, mine, 1.0f, accumulator);
    } else if (ranks == 1 && send != recv) {
      std::copy_n(send + mine.first, mine.floats, recv + mine.first);
    }
    for (int k = 1; k < ranks; ++k) {
      const int destination = (rank + k) % ranks;
      const int source = (rank - k + ranks) % ranks;
      const Part theirs = part(destination, chunk);
      if (wire != nullptr) {
        count_encode(encode(send + theirs.first, theirs, prescale, outgoing));
        comm_.sendRecv(outgoing, theirs.units, destination, incoming, mine.units, source, wire->element);
        if (codes_hop) {
          methods::addCodes(wire->format, incoming, own, mine.floats);
        } else {
          decode(incoming, mine, 1.0f, decoded);
          add(accumulator, decoded, mine.floats, accumulator);
        }
      } else {
        // In place, send's part of another rank's block is overwritten only by the all-gather below.
        comm_.sendRecv(send + theirs.first, theirs.units, destination, incoming_floats, mine.units, source,
                       fp32);
        add(k == 1 ? send + mine.first : recv + mine.first, incoming_floats, mine.floats, recv + mine.first);
      }
    }
    if (wire != nullptr) {
      // Not counted: a sum of encoded values overflows only where an input did (counted above).
      if (records) encode(accumulator, mine, 1.0f, own);
      decode(own, mine, postscale, recv + mine.first);
    }
    // All-gather: the other ranks' reduced parts of the chunk, into place.
    for (int k = 1; k < ranks; ++k) {
      const int destination = (rank + k) % ranks;
      const int source = (rank - k + ranks) % ranks;
      const Part theirs = part(source, chunk);
      if (wire != nullptr) {
        comm_.sendRecv(own, mine.units, destination, incoming, theirs.units, source, wire->element);
        decode(incoming, theirs, postscale, recv + theirs.first);
      } else {
        comm_.sendRecv(recv + mine.first, mine.units, destination, recv + theirs.first, theirs.units, source,
                       fp32);
      }
    }
  }
  return stats;
}

}  // namespace gradscope::comm
