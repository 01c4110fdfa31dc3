// nccl_abi/tuner.h against NCCL's plugin headers (NVIDIA/nccl src/include/plugin/tuner/tuner_v{3,4,5}.h,
// nccl_tuner.h, nccl_common.h at v2.28): sizes and offsets derived by hand from those declarations on
// x86-64/aarch64 Linux (LP64: pointers and size_t 8 bytes, int 4, double 8). NCCL installs no plugin
// header, so these numbers are the check; a mismatch fails the build, not a test.

#include <cstddef>

#include <gtest/gtest.h>

#include "nccl_abi/tuner.h"

namespace gradscope::nccl_tuner {
namespace {

using namespace nccl_abi;

// ncclNvlDomainInfo_v5_t: three ints.
static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12);
static_assert(offsetof(ncclNvlDomainInfo_v5_t, nNvlDomains) == 0);
static_assert(offsetof(ncclNvlDomainInfo_v5_t, minRanksPerNvlDomain) == 4);
static_assert(offsetof(ncclNvlDomainInfo_v5_t, maxRanksPerNvlDomain) == 8);

// ncclTunerConstants_v5_t: doubles [7][3], [3][7][3], then five [4][3] tables.
static_assert(offsetof(ncclTunerConstants_v5_t, baseLatencies) == 0);
static_assert(offsetof(ncclTunerConstants_v5_t, hwLatencies) == 7 * 3 * 8);                 // 168
static_assert(offsetof(ncclTunerConstants_v5_t, llMaxBws) == 168 + 3 * 7 * 3 * 8);          // 672
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxRingLL128Bws) == 672 + 4 * 3 * 8);  // 768
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxTreeLL128Bws) == 768 + 96);         // 864
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxTreeBws) == 864 + 96);              // 960
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxNVLSTreeBws) == 960 + 96);          // 1056
static_assert(sizeof(ncclTunerConstants_v5_t) == 1152);

// The plugin structs: a name pointer and three function pointers, in this order.
template <typename T>
constexpr bool fourPointers() {
  return sizeof(T) == 32 && offsetof(T, name) == 0 && offsetof(T, init) == 8 &&
         offsetof(T, getCollInfo) == 16;
}
static_assert(fourPointers<ncclTuner_v5_t>() && offsetof(ncclTuner_v5_t, finalize) == 24);
static_assert(fourPointers<ncclTuner_v4_t>() && offsetof(ncclTuner_v4_t, destroy) == 24);
static_assert(fourPointers<ncclTuner_v3_t>() && offsetof(ncclTuner_v3_t, destroy) == 24);

// Enumerations passed by value: int-sized, NCCL's values.
static_assert(sizeof(ncclFunc_t) == sizeof(int) && sizeof(ncclResult_t) == sizeof(int));
static_assert(sizeof(ncclDebugLogLevel) == sizeof(int));
static_assert(ncclFuncBroadcast == 0 && ncclFuncReduce == 1 && ncclFuncAllGather == 2 &&
              ncclFuncReduceScatter == 3 && ncclFuncAllReduce == 4 && NCCL_NUM_FUNCTIONS == 5);
static_assert(NCCL_ALGO_TREE == 0 && NCCL_ALGO_RING == 1 && NCCL_ALGO_COLLNET_DIRECT == 2 &&
              NCCL_ALGO_COLLNET_CHAIN == 3 && NCCL_ALGO_NVLS == 4 && NCCL_ALGO_NVLS_TREE == 5 &&
              NCCL_ALGO_PAT == 6 && NCCL_NUM_ALGORITHMS_V5 == 7);
static_assert(NCCL_PROTO_LL == 0 && NCCL_PROTO_LL128 == 1 && NCCL_PROTO_SIMPLE == 2 &&
              NCCL_NUM_PROTOCOLS_V5 == 3);
static_assert(NCCL_LOG_WARN == 2 && NCCL_LOG_INFO == 3 && NCCL_TUNING == 0x40);

TEST(Abi, LayoutsMatchNcclHeaders) {
  // The static_asserts above are the test; this records that they were compiled into the suite.
  SUCCEED();
}

}  // namespace
}  // namespace gradscope::nccl_tuner
