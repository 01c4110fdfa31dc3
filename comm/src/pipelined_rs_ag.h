#pragma once

// rs_ag on host memory (MPI), pipelined through the cache. The transport's plain form, a reduce-scatter
// and then an all-gather of the whole buffer, streams every byte through memory several times, and
// Open MPI's reductions add a temporary buffer mapped afresh for each large call. Here the buffer is
// cut into chunks of about 512 KiB that stay in cache from the send to the reduction to the
// all-gather:
//   for each chunk c, every rank r, for k = 1 … N−1 (pairwise exchange: all ranks send and receive
//   at once, so no step can deadlock): send part c of block r+k to rank r+k, receive part c of
//   block r from rank r−k, add it into the partial sum; then, for k = 1 … N−1, send the reduced part
//   to rank r+k and receive rank r−k's into its place.
// Blocks are as in the plain form: count/N elements, one more on the first count mod N ranks.
//
// With a wire precision the conversions run on the chunks too. Each rank encodes all of its input once,
// x·(1/N), its own part included. 2-byte codes are then summed hop by hop, as the backend's own wire
// reductions do (methods::addCodes: decode both, add in fp32, round back, in one pass); fp8 travels as
// scaled-block records (a chunk is a whole number of blocks), which the owner decodes, adds in fp32 and
// encodes once with the block amax of the sum. Every rank decodes the reduced part ×N, the owner
// included, so all ranks hold the same bits, within the bound of docs/methods.md.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gradscope/comm/communicator.h"
#include "gradscope/methods/wire.h"

namespace gradscope::comm {

class PipelinedRsAg {
 public:
  // `comm` must be a host communicator (Memory::Host) and outlive this.
  explicit PipelinedRsAg(Communicator& comm) : comm_(comm) {}

  // recv = Σ_r send_r in fp32; send may equal recv. Each element's sum is computed once, on its
  // block's owner, in the order own value, then ranks r−1, r−2, …
  void sum(const float* send, float* recv, std::size_t count);

  // The same with `format` on the wire (fp8: scaled blocks of `fp8_block` elements). Returns this
  // rank's encode of its input (RunStats::wire).
  methods::EncodeStats sumOnWire(WireFormat format, std::size_t fp8_block, const float* send, float* recv,
                                 std::size_t count);

  // Bytes of fp32 input per chunk.
  static constexpr std::size_t kChunkBytes = 512 * 1024;

 private:
  struct Wire;
  // Units of the exchange: elements, or fp8 blocks. Rank q's block is units [offset[q], offset[q] +
  // units[q]), its part c the chunk_units-long slice c of it.
  struct Part {
    std::size_t units = 0;
    std::size_t first = 0;   // first element
    std::size_t floats = 0;  // elements (the last part of the buffer may end inside a block)
  };
  void layout(std::size_t count, std::size_t unit);
  Part part(int rank, std::size_t chunk) const;
  methods::EncodeStats run(const float* send, float* recv, std::size_t count, const Wire* wire);

  Communicator& comm_;
  std::size_t count_ = 0;
  std::size_t unit_ = 1;  // elements per unit
  std::size_t chunk_units_ = 1;
  std::vector<std::size_t> units_, offsets_;
  // Chunk-sized scratch, reused across runs.
  std::vector<float> accumulator_, decoded_, incoming_floats_;
  std::vector<std::uint8_t> outgoing_, incoming_, own_;
  std::vector<std::uint8_t> fp8_codes_;
  std::vector<float> fp8_scales_;
};

}  // namespace gradscope::comm
