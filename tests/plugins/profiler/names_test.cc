// NCCL's descriptor names to gradscope's codes (names.h), every name NCCL 2.28 prints and the older
// spellings.

#include "names.h"

#include <string>

#include <gtest/gtest.h>

namespace {

using namespace gradscope;
using namespace gradscope::nccl_profiler;

TEST(ProfilerNames, Functions) {
  EXPECT_EQ(apiFromNcclFunc("AllReduce"), Api::NcclAllReduce);
  EXPECT_EQ(apiFromNcclFunc("AllGather"), Api::NcclAllGather);
  EXPECT_EQ(apiFromNcclFunc("ReduceScatter"), Api::NcclReduceScatter);
  EXPECT_EQ(apiFromNcclFunc("Reduce"), Api::NcclReduce);
  EXPECT_EQ(apiFromNcclFunc("Broadcast"), Api::NcclBroadcast);
  for (const char* other : {"AlltoAll", "SendRecv", "Send", "Recv", "Gather", "Scatter", "Invalid", "", "A"})
    EXPECT_EQ(apiFromNcclFunc(other), Api::Unknown) << other;
  EXPECT_EQ(apiFromNcclFunc(nullptr), Api::Unknown);
}

TEST(ProfilerNames, Datatypes) {
  const std::pair<const char*, DType> cases[] = {
      {"ncclInt8", DType::Int8},     {"ncclUint8", DType::Uint8},        {"ncclInt32", DType::Int32},
      {"ncclUint32", DType::Uint32}, {"ncclInt64", DType::Int64},        {"ncclUint64", DType::Uint64},
      {"ncclFloat16", DType::Fp16},  {"ncclFloat32", DType::Fp32},       {"ncclFloat64", DType::Fp64},
      {"ncclBfloat16", DType::Bf16}, {"ncclFloat8e4m3", DType::Fp8E4M3}, {"ncclFloat8e5m2", DType::Fp8E5M2},
      {"Unknown", DType::Other},     {"ncclFloat", DType::Other},        {"", DType::Other}};
  for (const auto& [name, dtype] : cases) EXPECT_EQ(dtypeFromNcclName(name), dtype) << name;
  EXPECT_EQ(dtypeFromNcclName(nullptr), DType::Other);
}

TEST(ProfilerNames, AlgorithmsAndProtocols) {
  // NCCL 2.28's spelling, then the mixed-case one; each code's name is types.h's.
  const char* upper[] = {"TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
  const char* mixed[] = {"Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"};
  for (int algo = 0; algo < kNcclAlgoCount; ++algo) {
    EXPECT_EQ(algoFromNcclName(upper[algo]), algo) << upper[algo];
    EXPECT_EQ(algoFromNcclName(mixed[algo]), algo) << mixed[algo];
    EXPECT_EQ(algoFromNcclName(std::string(ncclAlgoName(algo)).c_str()), algo);
  }
  EXPECT_EQ(algoFromNcclName("Unknown"), -1);
  EXPECT_EQ(algoFromNcclName("COLLNET"), -1);  // names no CollNet variant
  EXPECT_EQ(algoFromNcclName(nullptr), -1);
  EXPECT_EQ(protoFromNcclName("LL"), 0);
  EXPECT_EQ(protoFromNcclName("LL128"), 1);
  EXPECT_EQ(protoFromNcclName("SIMPLE"), 2);
  EXPECT_EQ(protoFromNcclName("Simple"), 2);
  EXPECT_EQ(protoFromNcclName("L"), -1);
  EXPECT_EQ(protoFromNcclName("Unknown"), -1);
  EXPECT_EQ(protoFromNcclName(nullptr), -1);
  for (int proto = 0; proto < kNcclProtoCount; ++proto)
    EXPECT_EQ(protoFromNcclName(std::string(ncclProtoName(proto)).c_str()), proto);
}

}  // namespace
