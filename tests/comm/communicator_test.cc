// comm/: the MPI communicator and the host LocalOps, run under mpiexec with 2 and 3 ranks.
//
// Inputs are small integers, so every order of addition is exact and results compare bit for bit with a
// host reference. The narrow types are checked the same way: their sums are exact in fp32 and
// representable in the wire type. fp8 scaled blocks are the exception: every hop re-encodes with a new
// block scale, so the result depends on the order MPI combined the ranks in; each record must equal the
// host's result for one of the possible orders (all of them coincide on 2 ranks).
//
// Every test is collective: all ranks run every test in the same order, so a test must not return early
// on one rank only (EXPECT, not ASSERT, around collectives).

#include "gradscope/comm/communicator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/comm/mpi.h"
#include "gradscope/common/error.h"
#include "gradscope/methods/adaptive.h"
#include "gradscope/methods/numeric.h"
#include "gradscope/methods/wire.h"
#include "host_local_ops.h"

namespace gradscope::comm {
namespace {

Communicator* world_communicator = nullptr;

Communicator& world() {
  return *world_communicator;
}

constexpr std::size_t kCounts[] = {0, 1, 7, 4099};

// Rank r's element i: a small integer in [-span, span] (never all zero across ranks).
int smallValue(int rank, std::size_t i, int span) {
  return static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3 + 1) %
                          static_cast<std::size_t>(2 * span + 1)) -
         span;
}

template <typename T>
std::vector<T> rankInput(int rank, std::size_t count, int span = 5) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<T>(smallValue(rank, i, span));
  return values;
}

template <typename T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return a + b;
    case ReduceOp::Prod: return a * b;
    case ReduceOp::Max: return std::max(a, b);
    case ReduceOp::Min: return std::min(a, b);
    default: ADD_FAILURE() << "no reference for " << name(op); return a;
  }
}

template <typename T>
std::vector<T> expectedReduction(std::size_t count, ReduceOp op, int ranks) {
  std::vector<T> result = rankInput<T>(0, count);
  for (int r = 1; r < ranks; ++r) {
    const std::vector<T> input = rankInput<T>(r, count);
    for (std::size_t i = 0; i < count; ++i) result[i] = combine(result[i], input[i], op);
  }
  return result;
}

template <typename T>
bool sameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <typename T>
DType dtypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::Fp32;
  if constexpr (std::is_same_v<T, double>) return DType::Fp64;
  if constexpr (std::is_same_v<T, std::int32_t>) return DType::Int32;
  if constexpr (std::is_same_v<T, std::int64_t>) return DType::Int64;
}

constexpr ReduceOp kNativeOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min};

// ---- Native types ----------------------------------------------------------------------------------------

template <typename T>
class NativeTypes : public ::testing::Test {};
using NativeTypeList = ::testing::Types<float, double, std::int32_t, std::int64_t>;
TYPED_TEST_SUITE(NativeTypes, NativeTypeList);

TYPED_TEST(NativeTypes, AllReduceEveryOpCountAndPlacement) {
  Communicator& comm = world();
  const Element element{dtypeOf<TypeParam>()};
  for (const ReduceOp op : kNativeOps)
    for (const std::size_t count : kCounts)
      for (const bool in_place : {false, true}) {
        const std::vector<TypeParam> input = rankInput<TypeParam>(comm.rank(), count);
        std::vector<TypeParam> send = input;
        std::vector<TypeParam> recv(count, TypeParam{99});
        comm.allReduce(send.data(), in_place ? send.data() : recv.data(), count, element, op);
        const std::vector<TypeParam>& result = in_place ? send : recv;
        EXPECT_TRUE(sameBits(result, expectedReduction<TypeParam>(count, op, comm.size())))
            << name(op) << " count " << count << (in_place ? " in place" : "");
        if (!in_place) {
          EXPECT_TRUE(sameBits(send, input)) << "send changed";
        }
      }
}

TYPED_TEST(NativeTypes, ReduceToEveryRoot) {
  Communicator& comm = world();
  const Element element{dtypeOf<TypeParam>()};
  for (int root = 0; root < comm.size(); ++root)
    for (const std::size_t count : kCounts)
      for (const bool in_place : {false, true}) {
        std::vector<TypeParam> send = rankInput<TypeParam>(comm.rank(), count);
        std::vector<TypeParam> recv(count, TypeParam{99});
        comm.reduce(send.data(), in_place ? send.data() : recv.data(), count, element, ReduceOp::Sum, root);
        if (comm.rank() == root) {
          EXPECT_TRUE(sameBits(in_place ? send : recv,
                               expectedReduction<TypeParam>(count, ReduceOp::Sum, comm.size())))
              << "root " << root << " count " << count << (in_place ? " in place" : "");
        }
      }
}

TYPED_TEST(NativeTypes, BroadcastFromEveryRoot) {
  Communicator& comm = world();
  for (int root = 0; root < comm.size(); ++root)
    for (const std::size_t count : kCounts) {
      std::vector<TypeParam> buffer = rankInput<TypeParam>(comm.rank(), count);
      comm.broadcast(buffer.data(), count, Element{dtypeOf<TypeParam>()}, root);
      EXPECT_TRUE(sameBits(buffer, rankInput<TypeParam>(root, count)))
          << "root " << root << " count " << count;
    }
}

// Uneven blocks: some ranks get nothing, the others different counts; the total is odd.
std::vector<std::vector<std::size_t>> unevenCounts(int ranks) {
  std::vector<std::vector<std::size_t>> patterns;
  for (const std::size_t base : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r)
      counts[static_cast<std::size_t>(r)] =
          base * static_cast<std::size_t>(r % 2) + static_cast<std::size_t>(r) * 3;
    patterns.push_back(counts);
  }
  patterns.push_back(std::vector<std::size_t>(static_cast<std::size_t>(ranks), 0));
  patterns.push_back(std::vector<std::size_t>(static_cast<std::size_t>(ranks), 1333));
  return patterns;
}

std::size_t offsetOf(const std::vector<std::size_t>& counts, int rank) {
  return std::accumulate(counts.begin(), counts.begin() + rank, std::size_t{0});
}

TYPED_TEST(NativeTypes, ReduceScatterUnevenCounts) {
  Communicator& comm = world();
  const Element element{dtypeOf<TypeParam>()};
  for (const std::vector<std::size_t>& counts : unevenCounts(comm.size()))
    for (const bool in_place : {false, true}) {
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      const std::size_t mine = counts[static_cast<std::size_t>(comm.rank())];
      std::vector<TypeParam> send = rankInput<TypeParam>(comm.rank(), total);
      std::vector<TypeParam> recv(mine, TypeParam{99});
      comm.reduceScatter(send.data(), in_place ? send.data() : recv.data(), counts, element, ReduceOp::Sum);
      const std::vector<TypeParam> full = expectedReduction<TypeParam>(total, ReduceOp::Sum, comm.size());
      const auto offset = static_cast<std::ptrdiff_t>(offsetOf(counts, comm.rank()));
      const std::vector<TypeParam> expected(full.begin() + offset,
                                            full.begin() + offset + static_cast<std::ptrdiff_t>(mine));
      const std::vector<TypeParam> result =
          in_place ? std::vector<TypeParam>(send.begin(), send.begin() + static_cast<std::ptrdiff_t>(mine))
                   : recv;
      EXPECT_TRUE(sameBits(result, expected)) << "my count " << mine << (in_place ? " in place" : "");
    }
}

TYPED_TEST(NativeTypes, AllGatherUnevenCounts) {
  Communicator& comm = world();
  const Element element{dtypeOf<TypeParam>()};
  for (const std::vector<std::size_t>& counts : unevenCounts(comm.size()))
    for (const bool in_place : {false, true}) {
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      std::vector<TypeParam> expected;
      for (int r = 0; r < comm.size(); ++r) {
        const std::vector<TypeParam> block = rankInput<TypeParam>(r, counts[static_cast<std::size_t>(r)]);
        expected.insert(expected.end(), block.begin(), block.end());
      }
      const std::vector<TypeParam> mine =
          rankInput<TypeParam>(comm.rank(), counts[static_cast<std::size_t>(comm.rank())]);
      std::vector<TypeParam> recv(total, TypeParam{99});
      const std::size_t offset = offsetOf(counts, comm.rank());
      if (in_place) std::copy(mine.begin(), mine.end(), recv.begin() + static_cast<std::ptrdiff_t>(offset));
      comm.allGather(in_place ? recv.data() + offset : mine.data(), recv.data(), counts, element);
      EXPECT_TRUE(sameBits(recv, expected)) << "total " << total << (in_place ? " in place" : "");
    }
}

TYPED_TEST(NativeTypes, SendRecvBetweenPairs) {
  Communicator& comm = world();
  const Element element{dtypeOf<TypeParam>()};
  // Ranks 2k and 2k+1 swap buffers (even sends first); a last odd rank sits out.
  const int peer = comm.rank() % 2 == 0 ? comm.rank() + 1 : comm.rank() - 1;
  if (peer >= comm.size()) return;
  for (const std::size_t count : kCounts) {
    const std::vector<TypeParam> mine = rankInput<TypeParam>(comm.rank(), count);
    std::vector<TypeParam> theirs(count, TypeParam{99});
    if (comm.rank() % 2 == 0) {
      comm.send(mine.data(), count, element, peer);
      comm.recv(theirs.data(), count, element, peer);
    } else {
      comm.recv(theirs.data(), count, element, peer);
      comm.send(mine.data(), count, element, peer);
    }
    EXPECT_TRUE(sameBits(theirs, rankInput<TypeParam>(peer, count))) << "count " << count;
  }
}

TYPED_TEST(NativeTypes, SendRecvIsAPairwiseExchange) {
  Communicator& comm = world();
  const Element element{dtypeOf<TypeParam>()};
  const int n = comm.size();
  // Step k of a pairwise exchange: every rank sends to rank + k and receives from rank − k at once,
  // with a different count in each direction (rank r sends count + r elements), including none.
  for (int k = 0; k < n; ++k)
    for (const std::size_t count : kCounts) {
      const int destination = (comm.rank() + k) % n;
      const int source = (comm.rank() - k + n) % n;
      const std::size_t sent = count + static_cast<std::size_t>(comm.rank());
      const std::size_t received = count + static_cast<std::size_t>(source);
      const std::vector<TypeParam> mine = rankInput<TypeParam>(comm.rank(), sent);
      std::vector<TypeParam> theirs(received, TypeParam{99});
      comm.sendRecv(mine.data(), sent, destination, theirs.data(), received, source, element);
      EXPECT_TRUE(sameBits(theirs, rankInput<TypeParam>(source, received)))
          << "step " << k << ", count " << count;
    }
}

// ---- Narrow types -----------------------------------------------------------------------------------------

struct NarrowCase {
  WireFormat format;
  int span;  // inputs in [-span, span]: every partial sum over 3 ranks is exact in the format
};

// e5m2 has 2 mantissa bits (integers exact up to 8), e4m3 3 (up to 16), fp16 and bf16 more.
constexpr NarrowCase kNarrowCases[] = {
    {WireFormat::Fp16, 5}, {WireFormat::Bf16, 5}, {WireFormat::Fp8E4M3, 4}, {WireFormat::Fp8E5M2, 2}};

// Plain codes of the rank's small integers (fp8 with scale 1: converted directly).
std::vector<std::uint8_t> plainCodes(WireFormat format, const std::vector<float>& values) {
  std::vector<std::uint8_t> codes(values.size() * methods::wireElementBytes(format));
  if (methods::isFp8(format)) {
    for (std::size_t i = 0; i < values.size(); ++i)
      codes[i] = format == WireFormat::Fp8E4M3 ? methods::fp32ToFp8E4M3(values[i])
                                               : methods::fp32ToFp8E5M2(values[i]);
  } else {
    methods::encode(format, values.data(), values.size(), codes.data(), nullptr);
  }
  return codes;
}

TEST(NarrowTypes, PlainCodeSumsAreExact) {
  Communicator& comm = world();
  for (const NarrowCase& narrow : kNarrowCases)
    for (const std::size_t count : kCounts)
      for (const bool in_place : {false, true}) {
        const Element element{methods::wireDType(narrow.format)};
        std::vector<float> sum(count, 0.0f);
        for (int r = 0; r < comm.size(); ++r) {
          const std::vector<float> input = rankInput<float>(r, count, narrow.span);
          for (std::size_t i = 0; i < count; ++i) sum[i] += input[i];
        }
        std::vector<std::uint8_t> send =
            plainCodes(narrow.format, rankInput<float>(comm.rank(), count, narrow.span));
        std::vector<std::uint8_t> recv(send.size(), 0xAA);
        comm.allReduce(send.data(), in_place ? send.data() : recv.data(), count, element, ReduceOp::Sum);
        EXPECT_TRUE(sameBits(in_place ? send : recv, plainCodes(narrow.format, sum)))
            << name(narrow.format) << " count " << count << (in_place ? " in place" : "");
      }
}

TEST(NarrowTypes, PlainFp8SumsSaturate) {
  Communicator& comm = world();
  // Every rank sends the largest finite value: every partial sum saturates back to it.
  for (const WireFormat format : {WireFormat::Fp8E4M3, WireFormat::Fp8E5M2}) {
    const std::vector<float> largest(5, methods::wireMax(format));
    std::vector<std::uint8_t> codes = plainCodes(format, largest);
    const std::vector<std::uint8_t> expected = codes;
    comm.allReduce(codes.data(), codes.data(), codes.size(), Element{methods::wireDType(format)},
                   ReduceOp::Sum);
    EXPECT_TRUE(sameBits(codes, expected)) << name(format);
  }
}

TEST(NarrowTypes, NarrowElementsMoveAndReduce) {
  Communicator& comm = world();
  // Reduce, reduce-scatter and broadcast on fp16 codes: the same operator, other collectives.
  const std::size_t count = 301;
  std::vector<float> sum(count, 0.0f);
  for (int r = 0; r < comm.size(); ++r) {
    const std::vector<float> input = rankInput<float>(r, count);
    for (std::size_t i = 0; i < count; ++i) sum[i] += input[i];
  }
  const std::vector<std::uint8_t> expected = plainCodes(WireFormat::Fp16, sum);
  const Element fp16{DType::Fp16};
  std::vector<std::uint8_t> send = plainCodes(WireFormat::Fp16, rankInput<float>(comm.rank(), count));
  std::vector<std::uint8_t> recv(send.size());
  comm.reduce(send.data(), recv.data(), count, fp16, ReduceOp::Sum, 0);
  comm.broadcast(recv.data(), count, fp16, 0);
  EXPECT_TRUE(sameBits(recv, expected));

  std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()),
                                  count / static_cast<std::size_t>(comm.size()));
  counts.back() += count % static_cast<std::size_t>(comm.size());
  const std::size_t mine = counts[static_cast<std::size_t>(comm.rank())];
  std::vector<std::uint8_t> part(mine * 2);
  comm.reduceScatter(send.data(), part.data(), counts, fp16, ReduceOp::Sum);
  std::vector<std::uint8_t> gathered(count * 2);
  comm.allGather(part.data(), gathered.data(), counts, fp16);
  EXPECT_TRUE(sameBits(gathered, expected));
}

// Broadcast, send/recv and all-gather move every narrow element (plain codes and scaled-block records)
// as opaque bytes.
TEST(NarrowTypes, EveryNarrowElementMovesUnchanged) {
  Communicator& comm = world();
  const Element elements[] = {{DType::Fp16},    {DType::Bf16},        {DType::Fp8E4M3},
                              {DType::Fp8E5M2}, {DType::Fp8E4M3, 32}, {DType::Fp8E5M2, 128}};
  auto bytesOf = [](int rank, std::size_t bytes) {
    std::vector<std::uint8_t> values(bytes);
    for (std::size_t i = 0; i < bytes; ++i)
      values[i] = static_cast<std::uint8_t>(i * 13 + static_cast<std::size_t>(rank) * 101);
    return values;
  };
  const int peer = comm.rank() % 2 == 0 ? comm.rank() + 1 : comm.rank() - 1;
  for (const Element element : elements)
    for (const std::size_t count : kCounts) {
      const std::size_t bytes = count * elementBytes(element);
      std::vector<std::uint8_t> buffer = bytesOf(comm.rank(), bytes);
      comm.broadcast(buffer.data(), count, element, comm.size() - 1);
      EXPECT_EQ(buffer, bytesOf(comm.size() - 1, bytes)) << name(element.dtype) << "/" << element.block;

      if (peer < comm.size()) {
        std::vector<std::uint8_t> theirs(bytes);
        const std::vector<std::uint8_t> mine = bytesOf(comm.rank(), bytes);
        if (comm.rank() % 2 == 0) {
          comm.send(mine.data(), count, element, peer);
          comm.recv(theirs.data(), count, element, peer);
        } else {
          comm.recv(theirs.data(), count, element, peer);
          comm.send(mine.data(), count, element, peer);
        }
        EXPECT_EQ(theirs, bytesOf(peer, bytes)) << name(element.dtype) << "/" << element.block;
      }

      const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), count);
      std::vector<std::uint8_t> gathered(bytes * counts.size());
      comm.allGather(bytesOf(comm.rank(), bytes).data(), gathered.data(), counts, element);
      std::vector<std::uint8_t> expected;
      for (int r = 0; r < comm.size(); ++r) {
        const std::vector<std::uint8_t> block = bytesOf(r, bytes);
        expected.insert(expected.end(), block.begin(), block.end());
      }
      EXPECT_EQ(gathered, expected) << name(element.dtype) << "/" << element.block;
    }
}

// ---- fp8 scaled blocks ------------------------------------------------------------------------------------

std::vector<std::uint8_t> encodeRecords(WireFormat format, const std::vector<float>& values,
                                        std::size_t block) {
  const std::size_t records = (values.size() + block - 1) / block;
  std::vector<std::uint8_t> out(records * (sizeof(float) + block));
  makeHostLocalOps()->encodeScaledBlocks(format, values.data(), values.size(), block, 1.0f, out.data());
  return out;
}

std::vector<float> decodeRecords(WireFormat format, const std::vector<std::uint8_t>& records,
                                 std::size_t block) {
  const std::size_t count = records.size() / (sizeof(float) + block) * block;
  std::vector<float> out(count);
  makeHostLocalOps()->decodeScaledBlocks(format, records.data(), count, block, 1.0f, out.data());
  return out;
}

// One hop of the operator as the host computes it: decode both, add in fp32, encode with the new scale.
std::vector<std::uint8_t> addRecords(WireFormat format, const std::vector<std::uint8_t>& a,
                                     const std::vector<std::uint8_t>& b, std::size_t block) {
  std::vector<float> x = decodeRecords(format, a, block);
  const std::vector<float> y = decodeRecords(format, b, block);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  return encodeRecords(format, x, block);
}

// Rank r's values: varied magnitudes, so that every block gets its own scale.
std::vector<float> blockInput(int rank, std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i)
    values[i] = static_cast<float>(smallValue(rank, i, 9)) *
                std::ldexp(1.0f, static_cast<int>(i / 64 % 7) - 3) * 0.37f;
  return values;
}

TEST(ScaledBlocks, SumEqualsSomeOrderOfHostHops) {
  Communicator& comm = world();
  ASSERT_TRUE(comm.supportsScaledBlocks());
  if (comm.size() > 3) GTEST_SKIP() << "the order check enumerates the combination orders of up to 3 ranks";
  for (const WireFormat format : {WireFormat::Fp8E4M3, WireFormat::Fp8E5M2})
    for (const std::size_t block : {std::size_t{1}, std::size_t{32}, std::size_t{128}})
      for (const std::size_t count : kCounts)
        for (const bool in_place : {false, true}) {
          const std::size_t records = (count + block - 1) / block;
          const std::size_t record_bytes = sizeof(float) + block;
          std::vector<std::vector<std::uint8_t>> inputs;
          for (int r = 0; r < comm.size(); ++r)
            inputs.push_back(encodeRecords(format, blockInput(r, count), block));
          // Every binary combination order over the ranks (commutative: for 3 ranks, which pair goes first).
          std::vector<std::vector<std::uint8_t>> candidates;
          if (comm.size() == 1) candidates.push_back(inputs[0]);
          for (int first = 0; first < comm.size() && comm.size() > 1; ++first)
            for (int second = first + 1; second < comm.size(); ++second) {
              std::vector<std::uint8_t> partial = addRecords(format, inputs[static_cast<std::size_t>(first)],
                                                             inputs[static_cast<std::size_t>(second)], block);
              for (int rest = 0; rest < comm.size(); ++rest)
                if (rest != first && rest != second)
                  partial = addRecords(format, partial, inputs[static_cast<std::size_t>(rest)], block);
              candidates.push_back(partial);
            }

          std::vector<std::uint8_t> send = inputs[static_cast<std::size_t>(comm.rank())];
          std::vector<std::uint8_t> recv(send.size(), 0xAA);
          comm.allReduce(send.data(), in_place ? send.data() : recv.data(), records,
                         Element{methods::wireDType(format), block}, ReduceOp::Sum);
          const std::vector<std::uint8_t>& result = in_place ? send : recv;
          std::size_t mismatched = 0;
          for (std::size_t r = 0; r < records; ++r) {
            const bool any = std::any_of(candidates.begin(), candidates.end(), [&](const auto& candidate) {
              return std::memcmp(candidate.data() + r * record_bytes, result.data() + r * record_bytes,
                                 record_bytes) == 0;
            });
            mismatched += any ? 0 : 1;
          }
          EXPECT_EQ(mismatched, 0u) << name(format) << " block " << block << " count " << count
                                    << (in_place ? " in place" : "");
        }
}

// ---- Scalars, split, nodes, algorithms --------------------------------------------------------------------

TEST(Scalars, AllGatherAndMax) {
  Communicator& comm = world();
  const std::vector<double> values = comm.allGatherScalars(comm.rank() * 1.5 - 0.25);
  ASSERT_EQ(values.size(), static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(values[static_cast<std::size_t>(r)], r * 1.5 - 0.25);
  EXPECT_EQ(comm.allReduceMax(comm.rank() == 1 ? 7.5 : -3.0), comm.size() > 1 ? 7.5 : -3.0);
  comm.barrier();
  comm.synchronize();
}

TEST(Scalars, SeveralValuesPerRankInRankOrder) {
  Communicator& comm = world();
  const double mine[3] = {comm.rank() + 0.5, -1.0 * comm.rank(), 1e300};
  const std::vector<double> all = comm.allGatherValues(mine);
  ASSERT_EQ(all.size(), 3u * static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    const auto at = static_cast<std::size_t>(3 * r);
    EXPECT_EQ(all[at], r + 0.5);
    EXPECT_EQ(all[at + 1], -1.0 * r);
    EXPECT_EQ(all[at + 2], 1e300);
  }
  EXPECT_TRUE(comm.allGatherValues({}).empty());
}

TEST(Split, ColorsAndKeys) {
  Communicator& comm = world();
  // Two groups by parity, each ordered by descending world rank.
  const std::unique_ptr<Communicator> part = comm.split(comm.rank() % 2, -comm.rank());
  std::vector<int> members;
  for (int r = comm.size() - 1; r >= 0; --r)
    if (r % 2 == comm.rank() % 2) members.push_back(r);
  EXPECT_EQ(part->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[static_cast<std::size_t>(part->rank())], comm.rank());
  const std::vector<double> ranks = part->allGatherScalars(comm.rank());
  for (std::size_t i = 0; i < members.size(); ++i) EXPECT_EQ(ranks[i], members[i]);
  std::int64_t sum = comm.rank();
  part->allReduce(&sum, &sum, 1, Element{DType::Int64}, ReduceOp::Sum);
  EXPECT_EQ(sum, std::accumulate(members.begin(), members.end(), std::int64_t{0}));
  EXPECT_THROW(comm.split(-1, 0), Error);
}

class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) old_ = old;
    if (value != nullptr) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnvironment() {
    if (old_.has_value()) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(Nodes, ColorFromHostOrRanksPerNode) {
  Communicator& comm = world();
  {
    // mpiexec on one machine: one node.
    ScopedEnvironment unset("GRADSCOPE_RANKS_PER_NODE", nullptr);
    EXPECT_EQ(comm.nodeColor(), 0);
  }
  {
    ScopedEnvironment two("GRADSCOPE_RANKS_PER_NODE", "2");
    EXPECT_EQ(comm.nodeColor(), comm.rank() / 2);
  }
  {
    ScopedEnvironment bad("GRADSCOPE_RANKS_PER_NODE", "two");
    EXPECT_THROW(comm.nodeColor(), Error);
  }
  EXPECT_NE(comm.description().find(fmt::format("MPI, {} ranks on 1 node (", comm.size())), std::string::npos)
      << comm.description();
}

TEST(Algorithms, EveryTunedAllReduceIsExact) {
  Communicator& comm = world();
  for (int algorithm = 1; algorithm <= 6; ++algorithm) {
    const std::unique_ptr<Communicator> forced = comm.withAlgorithm(algorithm, -1);
    EXPECT_EQ(forced->size(), comm.size());
    EXPECT_EQ(forced->rank(), comm.rank());
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{4099}, std::size_t{100003}}) {
      std::vector<float> values = rankInput<float>(comm.rank(), count);
      forced->allReduce(values.data(), values.data(), count, Element{DType::Fp32}, ReduceOp::Sum);
      EXPECT_TRUE(sameBits(values, expectedReduction<float>(count, ReduceOp::Sum, comm.size())))
          << "algorithm " << algorithm << " count " << count;
    }
    // The narrow operators under each algorithm (rabenseifner and the rings split the buffer).
    const std::size_t count = 1001;
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < comm.size(); ++r) {
      const std::vector<float> input = rankInput<float>(r, count);
      for (std::size_t i = 0; i < count; ++i) sum[i] += input[i];
    }
    std::vector<std::uint8_t> codes = plainCodes(WireFormat::Bf16, rankInput<float>(comm.rank(), count));
    forced->allReduce(codes.data(), codes.data(), count, Element{DType::Bf16}, ReduceOp::Sum);
    EXPECT_TRUE(sameBits(codes, plainCodes(WireFormat::Bf16, sum))) << "algorithm " << algorithm;
  }
  EXPECT_THROW(comm.withAlgorithm(0, -1), Error);
  EXPECT_THROW(comm.withAlgorithm(7, -1), Error);
  EXPECT_THROW(comm.withAlgorithm(4, 2), Error);
}

// ---- Refusals ---------------------------------------------------------------------------------------------

TEST(Errors, UnsupportedElementsAndOpsThrow) {
  Communicator& comm = world();
  std::string why;
  EXPECT_FALSE(comm.supports(Element{DType::Int8}, ReduceOp::Sum, &why));
  EXPECT_NE(why.find("int8"), std::string::npos) << why;
  EXPECT_FALSE(comm.supports(Element{DType::Fp32}, ReduceOp::Avg, &why));
  EXPECT_FALSE(comm.supports(Element{DType::Fp16}, ReduceOp::Max, &why));
  EXPECT_FALSE(comm.supports(Element{DType::Bf16, 128}, ReduceOp::Sum, &why));
  EXPECT_TRUE(comm.supports(Element{DType::Fp8E4M3, 128}, ReduceOp::Sum));
  EXPECT_TRUE(comm.supports(Element{DType::Int64}, ReduceOp::None));

  float value = 1;
  EXPECT_THROW(comm.allReduce(&value, &value, 1, Element{DType::Fp32}, ReduceOp::Avg), Error);
  EXPECT_THROW(comm.allReduce(&value, &value, 1, Element{DType::Fp16}, ReduceOp::Max), Error);
  EXPECT_THROW(comm.broadcast(&value, 1, Element{DType::Uint8}, 0), Error);
  const std::vector<std::size_t> wrong_counts(static_cast<std::size_t>(comm.size()) + 1, 0);
  EXPECT_THROW(comm.allGather(&value, &value, wrong_counts, Element{DType::Fp32}), Error);
  // Counts beyond MPI's int range are refused before any rank communicates (no buffer is touched).
  std::vector<std::size_t> huge(static_cast<std::size_t>(comm.size()), 1);
  huge[0] = static_cast<std::size_t>(std::numeric_limits<int>::max());
  EXPECT_THROW(comm.allGather(nullptr, nullptr, huge, Element{DType::Fp32}), Error);
  EXPECT_THROW(comm.reduceScatter(nullptr, nullptr, huge, Element{DType::Fp32}, ReduceOp::Sum), Error);
  // An MPI error comes back as an Error naming the call (a peer that does not exist).
  try {
    comm.send(&value, 1, Element{DType::Fp32}, comm.size());
    ADD_FAILURE() << "send to a rank outside the communicator did not throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MPI_Send failed: "), std::string::npos) << error.what();
  }
}

// ---- Host LocalOps (no communication) ---------------------------------------------------------------------

TEST(HostLocalOps, BuffersAndCopies) {
  const std::unique_ptr<LocalOps> ops = makeHostLocalOps();
  EXPECT_EQ(ops->memory(), Memory::Host);
  Buffer empty = ops->allocate(0);
  EXPECT_EQ(empty.get(), nullptr);
  Buffer buffer = ops->allocate(1000);
  ASSERT_NE(buffer.get(), nullptr);
  EXPECT_EQ(buffer.size(), 1000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.get()) % 64, 0u);
  ops->fillZero(buffer.get(), 1000);
  EXPECT_TRUE(std::all_of(buffer.as<std::uint8_t>(), buffer.as<std::uint8_t>() + 1000,
                          [](auto b) { return b == 0; }));
  const std::vector<std::uint8_t> pattern(1000, 0x5A);
  ops->upload(buffer.get(), pattern.data(), 1000);
  std::vector<std::uint8_t> back(1000);
  ops->download(back.data(), buffer.get(), 1000);
  EXPECT_EQ(back, pattern);

  Buffer moved = std::move(buffer);
  EXPECT_EQ(buffer.get(), nullptr);
  EXPECT_EQ(moved.size(), 1000u);
  moved = ops->allocate(8);
  EXPECT_EQ(moved.size(), 8u);
  moved.reset();
  EXPECT_EQ(moved.get(), nullptr);

  EXPECT_EQ(elementBytes(Element{DType::Fp32}), 4u);
  EXPECT_EQ(elementBytes(Element{DType::Bf16}), 2u);
  EXPECT_EQ(elementBytes(Element{DType::Fp8E5M2, 128}), 132u);
  EXPECT_THROW(elementBytes(Element{DType::Fp16, 128}), Error);
}

TEST(HostLocalOps, ScaledBlocksMatchWireEncoding) {
  const std::unique_ptr<LocalOps> ops = makeHostLocalOps();
  // 300000 elements take the parallel path; the others the inline one.
  for (const WireFormat format : {WireFormat::Fp8E4M3, WireFormat::Fp8E5M2})
    for (const std::size_t block : {std::size_t{1}, std::size_t{100}, std::size_t{128}})
      for (const std::size_t count :
           {std::size_t{0}, std::size_t{1}, std::size_t{129}, std::size_t{300000}}) {
        std::vector<float> values = blockInput(1, count);
        if (count > 5) values[3] = std::numeric_limits<float>::quiet_NaN();
        const float prescale = 0.5f;
        const std::size_t records = (count + block - 1) / block;
        std::vector<std::uint8_t> codes(count);
        std::vector<float> scales(records);
        const methods::EncodeStats expected_stats =
            methods::encode(format, values.data(), count, codes.data(), scales.data(),
                            {.prescale = prescale, .block = block});
        std::vector<std::uint8_t> out(records * (sizeof(float) + block), 0xAA);
        const methods::EncodeStats stats =
            ops->encodeScaledBlocks(format, values.data(), count, block, prescale, out.data());
        EXPECT_EQ(stats.nan, expected_stats.nan);
        EXPECT_EQ(stats.overflow, expected_stats.overflow);
        std::size_t wrong = 0;
        for (std::size_t r = 0; r < records; ++r) {
          const std::uint8_t* record = out.data() + r * (sizeof(float) + block);
          wrong += std::memcmp(record, &scales[r], sizeof(float)) != 0;
          for (std::size_t j = 0; j < block; ++j) {
            const std::size_t i = r * block + j;
            wrong += record[sizeof(float) + j] != (i < count ? codes[i] : 0);
          }
        }
        EXPECT_EQ(wrong, 0u) << name(format) << " block " << block << " count " << count;

        std::vector<float> expected(count), decoded(count);
        methods::decode(format, codes.data(), scales.data(), count, expected.data(), 2.0f, block);
        ops->decodeScaledBlocks(format, out.data(), count, block, 2.0f, decoded.data());
        EXPECT_TRUE(sameBits(decoded, expected)) << name(format) << " block " << block << " count " << count;
      }
  float value = 0;
  EXPECT_THROW(ops->encodeScaledBlocks(WireFormat::Fp16, &value, 1, 128, 1.0f, &value), Error);
  EXPECT_THROW(ops->decodeScaledBlocks(WireFormat::Fp8E4M3, &value, 1, 0, 1.0f, &value), Error);
}

TEST(HostLocalOps, ArithmeticMatchesTheMethodsLibrary) {
  const std::unique_ptr<LocalOps> ops = makeHostLocalOps();
  const std::size_t count = 300001;
  const std::vector<float> a = blockInput(0, count);
  const std::vector<float> b = blockInput(2, count);

  // dot: methods::dot's bits (adasumPair's a·b order), and adasumPair itself.
  const methods::DotProducts dots = ops->dotProducts(a.data(), b.data(), count);
  const methods::DotProducts expected_dots = methods::dotProducts(a.data(), b.data(), count);
  EXPECT_EQ(dots.ab, expected_dots.ab);
  EXPECT_EQ(dots.aa, expected_dots.aa);
  EXPECT_EQ(dots.bb, expected_dots.bb);
  EXPECT_EQ(ops->dotProducts(a.data(), b.data(), 0).ab, 0.0);
  std::vector<float> expected(count), result(count);
  methods::adasumPair(a.data(), b.data(), count, expected.data());
  ops->adasumPair(a.data(), b.data(), count, result.data());
  EXPECT_TRUE(sameBits(result, expected));

  std::vector<float> scaled(count);
  ops->scale(a.data(), count, 0.25f, scaled.data());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += scaled[i] != a[i] * 0.25f;
  EXPECT_EQ(wrong, 0u);

  std::vector<float> amax_input = a;
  amax_input[17] = std::numeric_limits<float>::infinity();
  amax_input[18] = -std::numeric_limits<float>::quiet_NaN();
  amax_input[count - 1] = -1e30f;
  EXPECT_EQ(ops->finiteAmax(amax_input.data(), count), 1e30f);
  EXPECT_EQ(ops->finiteAmax(amax_input.data(), 0), 0.0f);
  const float non_finite[] = {std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(ops->finiteAmax(non_finite, 2), 0.0f);
}

// Prints failures of ranks other than 0, prefixed with the rank (rank 0 keeps gtest's own output).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace gradscope::comm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<gradscope::comm::Communicator> world = gradscope::comm::mpiWorld();
  gradscope::comm::world_communicator = world.get();
  if (world->rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new gradscope::comm::RankFailurePrinter(world->rank()));
  }
  const int failed = RUN_ALL_TESTS();
  // One verdict for the job: a failure on any rank fails every rank's exit code.
  const double any_failed = world->allReduceMax(failed);
  world.reset();
  return any_failed != 0 ? 1 : 0;
}
