// common/: human-readable units, size parsing, the vocabulary types and their file-format codes.

#include "gradscope/common/units.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "gradscope/common/error.h"
#include "gradscope/common/types.h"
#include "test_util.h"

namespace gradscope {
namespace {

// ---------------------------------------------------------------------------------------------------
// formatBytes

TEST(FormatBytes, BelowOneKibIsExactBytes) {
  EXPECT_EQ(formatBytes(0), "0 B");
  EXPECT_EQ(formatBytes(1), "1 B");
  EXPECT_EQ(formatBytes(512), "512 B");
  EXPECT_EQ(formatBytes(1023), "1023 B");
}

TEST(FormatBytes, BinaryUnitsWithoutTrailingZeros) {
  EXPECT_EQ(formatBytes(1024), "1 KiB");
  EXPECT_EQ(formatBytes(1536), "1.5 KiB");
  EXPECT_EQ(formatBytes(1280), "1.25 KiB");
  EXPECT_EQ(formatBytes(64 * 1024), "64 KiB");
  EXPECT_EQ(formatBytes(10 * 1024 + 512), "10.5 KiB");
  EXPECT_EQ(formatBytes(1000 * 1024), "1000 KiB");
  EXPECT_EQ(formatBytes(1ull << 20), "1 MiB");
  EXPECT_EQ(formatBytes(64ull << 20), "64 MiB");
  EXPECT_EQ(formatBytes(25ull << 20), "25 MiB");
  EXPECT_EQ(formatBytes(3ull << 29), "1.5 GiB");
  EXPECT_EQ(formatBytes(1ull << 40), "1 TiB");
  EXPECT_EQ(formatBytes(1ull << 50), "1 PiB");
}

TEST(FormatBytes, AtMostThreeSignificantDigits) {
  EXPECT_EQ(formatBytes(1234), "1.21 KiB");       // 1.2051 KiB
  EXPECT_EQ(formatBytes(12'345), "12.1 KiB");     // 12.056 KiB
  EXPECT_EQ(formatBytes(123'456), "121 KiB");     // 120.56 KiB
  EXPECT_EQ(formatBytes(1'234'567), "1.18 MiB");  // 1.1774 MiB
}

TEST(FormatBytes, ExbibytesCoverTheWholeRange) {
  EXPECT_EQ(formatBytes(1ull << 50), "1 PiB");
  EXPECT_EQ(formatBytes(1ull << 60), "1 EiB");
  EXPECT_EQ(formatBytes(std::numeric_limits<std::uint64_t>::max()), "16 EiB");
}

// BUG (minor, cosmetic): a value just below a unit boundary rounds to "1024 KiB" instead of moving up to
// "1 MiB" (common/src/units.cc formatBytes: the unit is chosen before rounding to three digits).
TEST(FormatBytes, RoundingUpMovesToTheNextUnit) {
  EXPECT_EQ(formatBytes((1ull << 20) - 1), "1 MiB");
  EXPECT_EQ(formatBytes((1ull << 30) - 1), "1 GiB");
}

// ---------------------------------------------------------------------------------------------------
// formatDuration

TEST(FormatDuration, LadderOfUnits) {
  EXPECT_EQ(formatDuration(0), "0 ns");
  EXPECT_EQ(formatDuration(1), "1 ns");
  EXPECT_EQ(formatDuration(850), "850 ns");
  EXPECT_EQ(formatDuration(999), "999 ns");
  EXPECT_EQ(formatDuration(1'000), "1.00 us");
  EXPECT_EQ(formatDuration(1'500), "1.50 us");
  EXPECT_EQ(formatDuration(12'300), "12.3 us");
  EXPECT_EQ(formatDuration(123'000), "123 us");
  EXPECT_EQ(formatDuration(1'000'000), "1.00 ms");
  EXPECT_EQ(formatDuration(4'560'000), "4.56 ms");
  EXPECT_EQ(formatDuration(45'600'000), "45.6 ms");
  EXPECT_EQ(formatDuration(1'230'000'000), "1.23 s");
  EXPECT_EQ(formatDuration(3'600e9), "3600 s");
}

TEST(FormatDuration, FractionalNanosecondsRound) {
  EXPECT_EQ(formatDuration(0.4), "0 ns");
  EXPECT_EQ(formatDuration(12.6), "13 ns");
}

TEST(FormatDuration, NegativeDurationsKeepTheirSign) {
  EXPECT_EQ(formatDuration(-500), "-500 ns");
  EXPECT_EQ(formatDuration(-1'500), "-1.50 us");
  EXPECT_EQ(formatDuration(-2'000'000'000), "-2.00 s");
}

// BUG (minor): threeDigits() in common/src/units.cc tests `value >= 100` / `value >= 10` on the signed
// value, so negative durations always get two decimals: -150 us prints "-150.00 us", -12.3 ms "-12.30 ms".
TEST(FormatDuration, NegativeDurationsHaveThreeSignificantDigits) {
  EXPECT_EQ(formatDuration(-150'000), "-150 us");
  EXPECT_EQ(formatDuration(-12'300'000), "-12.3 ms");
}

// BUG (minor, cosmetic): like formatBytes, a value that rounds up to 1000 stays in the smaller unit:
// 999.6 ns prints "1000 ns" and 999,999 ns "1000 us" instead of "1.00 us" / "1.00 ms".
TEST(FormatDuration, RoundingUpMovesToTheNextUnit) {
  EXPECT_EQ(formatDuration(999.6), "1.00 us");
  EXPECT_EQ(formatDuration(999'999), "1.00 ms");
  EXPECT_EQ(formatDuration(999'999'999), "1.00 s");
}

// ---------------------------------------------------------------------------------------------------
// formatCount

TEST(FormatCount, ThousandsSeparators) {
  EXPECT_EQ(formatCount(0), "0");
  EXPECT_EQ(formatCount(7), "7");
  EXPECT_EQ(formatCount(999), "999");
  EXPECT_EQ(formatCount(1'000), "1,000");
  EXPECT_EQ(formatCount(12'345), "12,345");
  EXPECT_EQ(formatCount(100'000), "100,000");
  EXPECT_EQ(formatCount(999'999), "999,999");
  EXPECT_EQ(formatCount(1'000'000), "1,000,000");
  EXPECT_EQ(formatCount(1'234'567), "1,234,567");
  EXPECT_EQ(formatCount(std::numeric_limits<std::uint64_t>::max()), "18,446,744,073,709,551,615");
}

// ---------------------------------------------------------------------------------------------------
// parseBytes

TEST(ParseBytes, AcceptsPlainNumbersAndBinarySuffixes) {
  EXPECT_EQ(parseBytes("0"), 0u);
  EXPECT_EQ(parseBytes("4096"), 4096u);
  EXPECT_EQ(parseBytes("4096B"), 4096u);
  EXPECT_EQ(parseBytes("64K"), 65536u);
  EXPECT_EQ(parseBytes("64KB"), 65536u);
  EXPECT_EQ(parseBytes("64KiB"), 65536u);
  EXPECT_EQ(parseBytes("64k"), 65536u);
  EXPECT_EQ(parseBytes("64kib"), 65536u);
  EXPECT_EQ(parseBytes("1M"), 1048576u);
  EXPECT_EQ(parseBytes("1MiB"), 1048576u);
  EXPECT_EQ(parseBytes("1G"), 1ull << 30);
  EXPECT_EQ(parseBytes("1.5G"), 3ull << 29);
  EXPECT_EQ(parseBytes("1.5GB"), 3ull << 29);
  EXPECT_EQ(parseBytes("0.5K"), 512u);
  EXPECT_EQ(parseBytes("2T"), 2ull << 40);
  EXPECT_EQ(parseBytes("  8M  "), 8ull << 20);  // surrounding spaces are ignored
}

TEST(ParseBytes, LargestAcceptedValue) {
  // 8 EiB is refused; the largest whole number of TiB below it is not.
  EXPECT_EQ(parseBytes("8388607T"), (8388607ull) << 40);
  EXPECT_EQ(parseBytes("9223372036854774784"), 9223372036854774784ull);  // the largest double below 2^63
}

TEST(ParseBytes, RejectsMalformedTextNamingIt) {
  for (const char* bad : {"", "   ", "-1", "+1", "abc", "12Q", "1KK", "1 K", "K", "1.5.5", "inf", "nan",
                          "0x10", "1KiBB", "64Ki"}) {
    SCOPED_TRACE(bad);
    const std::string message = test::errorMessage([&] { parseBytes(bad); });
    EXPECT_NE(message.find(fmt::format("'{}'", bad)), std::string::npos) << message;
    EXPECT_NE(message.find("64K"), std::string::npos) << "should show the accepted forms: " << message;
  }
}

TEST(ParseBytes, RejectsFractionalBytes) {
  EXPECT_GRADSCOPE_ERROR(parseBytes("1.5"), "'1.5'", "whole number");
  EXPECT_GRADSCOPE_ERROR(parseBytes("0.1K"), "'0.1K'", "whole number");
}

TEST(ParseBytes, RejectsHugeValues) {
  EXPECT_GRADSCOPE_ERROR(parseBytes("8388608T"), "'8388608T'", "too large");
  EXPECT_GRADSCOPE_ERROR(parseBytes("9223372036854775808"), "too large");
  EXPECT_GRADSCOPE_ERROR(parseBytes("99999999999999999999999999"), "too large");
  EXPECT_GRADSCOPE_ERROR(parseBytes("1e300"), "too large");
  EXPECT_GRADSCOPE_ERROR(parseBytes("1e400"), "'1e400'");  // out of range for a double: malformed
}

// ---------------------------------------------------------------------------------------------------
// types.h

TEST(Types, FileFormatCodesNeverChange) {
  // These numbers are stored in trace files (types.h): a change here breaks every existing trace.
  EXPECT_EQ(static_cast<int>(Api::MpiAllreduce), 1);
  EXPECT_EQ(static_cast<int>(Api::MpiBcast), 7);
  EXPECT_EQ(static_cast<int>(Api::NcclAllReduce), 16);
  EXPECT_EQ(static_cast<int>(Api::NcclGroup), 21);
  EXPECT_EQ(static_cast<int>(Api::MpiSend), 8);
  EXPECT_EQ(static_cast<int>(Api::MpiBarrier), 15);
  EXPECT_EQ(static_cast<int>(Api::NcclSend), 22);
  EXPECT_EQ(static_cast<int>(Api::NcclScatter), 26);
  EXPECT_EQ(static_cast<int>(Api::MpiAlltoall), 32);
  EXPECT_EQ(static_cast<int>(Api::MpiIbarrier), 43);
  EXPECT_EQ(static_cast<int>(Api::MpiImrecv), 48);
  EXPECT_EQ(static_cast<int>(DType::Int8), 0);
  EXPECT_EQ(static_cast<int>(DType::Fp32), 7);
  EXPECT_EQ(static_cast<int>(DType::Bf16), 9);
  EXPECT_EQ(static_cast<int>(DType::Fp8E5M2), 11);
  EXPECT_EQ(static_cast<int>(DType::Other), 254);
  EXPECT_EQ(static_cast<int>(ReduceOp::Sum), 0);
  EXPECT_EQ(static_cast<int>(ReduceOp::Avg), 4);
  EXPECT_EQ(static_cast<int>(ReduceOp::PreMulSum), 5);
  EXPECT_EQ(static_cast<int>(ReduceOp::None), 255);
  EXPECT_EQ(static_cast<int>(Backend::Nccl), 2);
}

template <typename T>
void expectStrictlyIncreasingCodes(std::span<const T> values) {
  for (std::size_t i = 1; i < values.size(); ++i)
    EXPECT_LT(static_cast<int>(values[i - 1]), static_cast<int>(values[i])) << "at index " << i;
}

TEST(Types, ListsAreInCodeOrder) {
  EXPECT_EQ(allApis().size(), 43u);
  EXPECT_EQ(allDTypes().size(), 13u);
  EXPECT_EQ(allReduceOps().size(), 7u);
  EXPECT_EQ(allBackends().size(), 3u);
  expectStrictlyIncreasingCodes(allApis());
  expectStrictlyIncreasingCodes(allDTypes());
  expectStrictlyIncreasingCodes(allReduceOps());
  expectStrictlyIncreasingCodes(allBackends());
  // Unknown/None are not listed: they are never stored under a name.
  EXPECT_EQ(std::count(allApis().begin(), allApis().end(), Api::Unknown), 0);
  EXPECT_EQ(std::count(allReduceOps().begin(), allReduceOps().end(), ReduceOp::None), 0);
}

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

TEST(Types, ApiNamesRoundTrip) {
  std::set<std::string_view> names;
  for (Api api : allApis()) {
    SCOPED_TRACE(name(api));
    EXPECT_NE(name(api), "unknown");
    EXPECT_TRUE(names.insert(name(api)).second) << "duplicate name";
    EXPECT_EQ(parseApi(name(api)), api);
    EXPECT_EQ(parseApi(upper(name(api))), api);  // case-insensitive
  }
  EXPECT_EQ(name(Api::Unknown), "unknown");
  EXPECT_EQ(name(Api::MpiAllreduce), "MPI_Allreduce");
  EXPECT_EQ(name(Api::NcclAllReduce), "ncclAllReduce");
  EXPECT_EQ(parseApi("mpi_allreduce"), Api::MpiAllreduce);
  EXPECT_EQ(parseApi("unknown"), std::nullopt);
  EXPECT_EQ(parseApi(""), std::nullopt);
  EXPECT_EQ(parseApi("MPI_Allreduce "), std::nullopt);
}

TEST(Types, DTypeNamesRoundTrip) {
  std::set<std::string_view> names;
  for (DType dtype : allDTypes()) {
    SCOPED_TRACE(name(dtype));
    EXPECT_TRUE(names.insert(name(dtype)).second) << "duplicate name";
    EXPECT_EQ(parseDType(name(dtype)), dtype);
    EXPECT_EQ(parseDType(upper(name(dtype))), dtype);
  }
  EXPECT_EQ(name(DType::Bf16), "bf16");
  EXPECT_EQ(name(DType::Fp8E4M3), "fp8e4m3");
  EXPECT_EQ(parseDType("FP32"), DType::Fp32);
  EXPECT_EQ(parseDType("float"), std::nullopt);
}

TEST(Types, ReduceOpNamesRoundTrip) {
  std::set<std::string_view> names;
  for (ReduceOp op : allReduceOps()) {
    SCOPED_TRACE(name(op));
    EXPECT_TRUE(names.insert(name(op)).second) << "duplicate name";
    EXPECT_EQ(parseReduceOp(name(op)), op);
    EXPECT_EQ(parseReduceOp(upper(name(op))), op);
  }
  EXPECT_EQ(name(ReduceOp::None), "none");
  EXPECT_EQ(name(ReduceOp::PreMulSum), "premulsum");
  EXPECT_EQ(parseReduceOp("Sum"), ReduceOp::Sum);
  EXPECT_EQ(parseReduceOp("add"), std::nullopt);
}

TEST(Types, BackendNames) {
  EXPECT_EQ(name(Backend::Mpi), "mpi");
  EXPECT_EQ(name(Backend::Nccl), "nccl");
  EXPECT_EQ(name(Backend::Local), "local");
  EXPECT_EQ(name(Backend::Unknown), "unknown");
}

TEST(Types, BackendAndCollectiveOfEveryApi) {
  for (Api api : allApis()) {
    SCOPED_TRACE(name(api));
    const bool nccl = name(api).starts_with("nccl");
    EXPECT_EQ(backendOf(api), nccl ? Backend::Nccl : Backend::Mpi);
    EXPECT_NE(collectiveOf(api), Collective::Unknown);
  }
  EXPECT_EQ(backendOf(Api::Unknown), Backend::Unknown);
  EXPECT_EQ(collectiveOf(Api::Unknown), Collective::Unknown);
  EXPECT_EQ(collectiveOf(Api::MpiAllreduce), Collective::AllReduce);
  EXPECT_EQ(collectiveOf(Api::MpiIallreduce), Collective::AllReduce);
  EXPECT_EQ(collectiveOf(Api::NcclAllReduce), Collective::AllReduce);
  EXPECT_EQ(collectiveOf(Api::MpiReduceScatterBlock), Collective::ReduceScatter);
  EXPECT_EQ(collectiveOf(Api::NcclReduceScatter), Collective::ReduceScatter);
  EXPECT_EQ(collectiveOf(Api::MpiAllgather), Collective::AllGather);
  EXPECT_EQ(collectiveOf(Api::NcclAllGather), Collective::AllGather);
  EXPECT_EQ(collectiveOf(Api::MpiReduce), Collective::Reduce);
  EXPECT_EQ(collectiveOf(Api::MpiBcast), Collective::Broadcast);
  EXPECT_EQ(collectiveOf(Api::NcclBroadcast), Collective::Broadcast);
  EXPECT_EQ(collectiveOf(Api::NcclGroup), Collective::Group);
  EXPECT_EQ(name(Collective::AllReduce), "all_reduce");
  EXPECT_EQ(name(Collective::Group), "group");
}

// Every API belongs to its library and to one family; the report's totals per family rest on it.
TEST(Types, EveryApiHasItsBackendAndFamily) {
  for (Api api : allApis()) {
    SCOPED_TRACE(name(api));
    EXPECT_EQ(backendOf(api), name(api).starts_with("MPI_") ? Backend::Mpi : Backend::Nccl);
    EXPECT_NE(collectiveOf(api), Collective::Unknown);
    EXPECT_EQ(isNonblocking(api), name(api).starts_with("MPI_I"));
  }
  for (Api api : {Api::MpiSend, Api::MpiSsend, Api::MpiBsend, Api::MpiRsend, Api::MpiIsend, Api::MpiIssend,
                  Api::MpiRecv, Api::MpiIrecv, Api::MpiMrecv, Api::MpiImrecv, Api::MpiSendrecv,
                  Api::MpiSendrecvReplace, Api::NcclSend, Api::NcclRecv}) {
    EXPECT_EQ(familyOf(api), ApiFamily::PointToPoint) << name(api);
    EXPECT_TRUE(isPointToPoint(api)) << name(api);
  }
  EXPECT_EQ(familyOf(Api::MpiBarrier), ApiFamily::Synchronization);
  EXPECT_EQ(familyOf(Api::MpiIbarrier), ApiFamily::Synchronization);
  EXPECT_EQ(familyOf(Api::NcclGroup), ApiFamily::Group);
  EXPECT_EQ(familyOf(Api::MpiAlltoallv), ApiFamily::Collective);
  EXPECT_EQ(familyOf(Api::NcclAlltoAll), ApiFamily::Collective);
  EXPECT_FALSE(isPointToPoint(Api::MpiAlltoall));
  EXPECT_EQ(collectiveOf(Api::MpiSendrecvReplace), Collective::SendRecv);
  EXPECT_EQ(collectiveOf(Api::MpiIalltoall), Collective::AllToAll);
  EXPECT_EQ(collectiveOf(Api::NcclGather), Collective::Gather);
  EXPECT_EQ(name(ApiFamily::PointToPoint), "point_to_point");
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::AllToAll, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Send, 4), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Barrier, 4), 0.0);
}

TEST(Types, SizeOfEveryDType) {
  EXPECT_EQ(sizeOf(DType::Int8), 1u);
  EXPECT_EQ(sizeOf(DType::Uint8), 1u);
  EXPECT_EQ(sizeOf(DType::Fp8E4M3), 1u);
  EXPECT_EQ(sizeOf(DType::Fp8E5M2), 1u);
  EXPECT_EQ(sizeOf(DType::Fp16), 2u);
  EXPECT_EQ(sizeOf(DType::Bf16), 2u);
  EXPECT_EQ(sizeOf(DType::Int32), 4u);
  EXPECT_EQ(sizeOf(DType::Uint32), 4u);
  EXPECT_EQ(sizeOf(DType::Fp32), 4u);
  EXPECT_EQ(sizeOf(DType::Int64), 8u);
  EXPECT_EQ(sizeOf(DType::Uint64), 8u);
  EXPECT_EQ(sizeOf(DType::Fp64), 8u);
  EXPECT_EQ(sizeOf(DType::Other), 0u);
}

TEST(Types, BusBandwidthFactorsFollowNcclTests) {
  // Exactly representable results: compare exactly.
  EXPECT_EQ(busBandwidthFactor(Collective::AllReduce, 4), 1.5);
  EXPECT_EQ(busBandwidthFactor(Collective::AllReduce, 2), 1.0);
  EXPECT_EQ(busBandwidthFactor(Collective::AllReduce, 8), 1.75);
  EXPECT_EQ(busBandwidthFactor(Collective::AllReduce, 1), 0.0);
  EXPECT_EQ(busBandwidthFactor(Collective::ReduceScatter, 4), 0.75);
  EXPECT_EQ(busBandwidthFactor(Collective::AllGather, 4), 0.75);
  EXPECT_EQ(busBandwidthFactor(Collective::AllGather, 2), 0.5);
  EXPECT_EQ(busBandwidthFactor(Collective::Broadcast, 4), 1.0);
  EXPECT_EQ(busBandwidthFactor(Collective::Reduce, 16), 1.0);
  EXPECT_EQ(busBandwidthFactor(Collective::Group, 4), 0.0);
  EXPECT_EQ(busBandwidthFactor(Collective::Unknown, 4), 0.0);
  EXPECT_EQ(busBandwidthFactor(Collective::AllReduce, 0), 0.0);
  EXPECT_EQ(busBandwidthFactor(Collective::AllReduce, -3), 0.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::AllReduce, 3), 4.0 / 3.0);
}

// ---------------------------------------------------------------------------------------------------
// error.h

TEST(Errors, FailFormatsOneGradscopeError) {
  EXPECT_GRADSCOPE_ERROR(fail("{}: bad value {}", "file.db", 42), "file.db: bad value 42");
  EXPECT_THROW(fail("x"), std::runtime_error);  // Error is a runtime_error
}

TEST(Errors, ErrnoMessage) {
  EXPECT_EQ(errnoMessage(ENOENT), "No such file or directory");
  EXPECT_EQ(errnoMessage(EACCES), "Permission denied");
  EXPECT_FALSE(errnoMessage(123456).empty());
}

}  // namespace
}  // namespace gradscope
