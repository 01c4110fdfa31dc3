#pragma once

// NCCL's names in a collective's descriptor (nccl_abi/profiler.h) to gradscope's codes, on the thread that
// launches the collective: a few character comparisons each, no string compare, no table walk. Both
// spellings NCCL has used are accepted (NCCL 2.28 prints "RING"/"SIMPLE"; older logs and the tuner use
// "Ring"/"Simple"). A name not listed maps to "unknown" (Api::Unknown, DType::Other, -1).

#include <cstdint>

#include "gradscope/common/types.h"

namespace gradscope::nccl_profiler {

inline char upper(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
}

inline std::size_t length(const char* text, std::size_t max) {
  std::size_t n = 0;
  while (n < max && text[n] != '\0') ++n;
  return n;
}

// ncclFuncToString: "AllReduce", "AllGather", "ReduceScatter", "Reduce", "Broadcast"; anything else
// (SendRecv, AlltoAll, Gather, ...) is not a collective the trace has an API code for.
inline Api apiFromNcclFunc(const char* func) {
  if (func == nullptr) return Api::Unknown;
  switch (func[0]) {
    case 'A':
      if (func[1] != 'l' || func[2] != 'l') return Api::Unknown;
      if (func[3] == 'R' && length(func, 10) == 9) return Api::NcclAllReduce;
      if (func[3] == 'G' && length(func, 10) == 9) return Api::NcclAllGather;
      return Api::Unknown;
    case 'R': {
      const std::size_t n = length(func, 14);
      if (n == 6 && func[1] == 'e') return Api::NcclReduce;
      if (n == 13 && func[6] == 'S') return Api::NcclReduceScatter;
      return Api::Unknown;
    }
    case 'B': return length(func, 10) == 9 && func[1] == 'r' ? Api::NcclBroadcast : Api::Unknown;
    default: return Api::Unknown;
  }
}

// ncclDatatypeToString: "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
// "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2".
inline DType dtypeFromNcclName(const char* name) {
  if (name == nullptr || name[0] != 'n' || name[1] != 'c' || name[2] != 'c' || name[3] != 'l')
    return DType::Other;
  const char* rest = name + 4;
  const std::size_t n = length(rest, 12);
  switch (rest[0]) {
    case 'I':  // Int8 Int32 Int64
      if (n == 4 && rest[3] == '8') return DType::Int8;
      if (n == 5 && rest[3] == '3') return DType::Int32;
      if (n == 5 && rest[3] == '6') return DType::Int64;
      return DType::Other;
    case 'U':  // Uint8 Uint32 Uint64
      if (n == 5 && rest[4] == '8') return DType::Uint8;
      if (n == 6 && rest[4] == '3') return DType::Uint32;
      if (n == 6 && rest[4] == '6') return DType::Uint64;
      return DType::Other;
    case 'F':  // Float16 Float32 Float64 Float8e4m3 Float8e5m2
      if (n == 7 && rest[5] == '1') return DType::Fp16;
      if (n == 7 && rest[5] == '3') return DType::Fp32;
      if (n == 7 && rest[5] == '6') return DType::Fp64;
      if (n == 10 && rest[5] == '8') return rest[7] == '4' ? DType::Fp8E4M3 : DType::Fp8E5M2;
      return DType::Other;
    case 'B': return n == 8 ? DType::Bf16 : DType::Other;  // Bfloat16
    default: return DType::Other;
  }
}

// ncclAlgoToString, as the codes of types.h (ncclAlgoName): Tree 0, Ring 1, CollNetDirect 2,
// CollNetChain 3, NVLS 4, NVLSTree 5, PAT 6. Upper or mixed case, with or without '_'.
inline int algoFromNcclName(const char* name) {
  if (name == nullptr) return -1;
  switch (upper(name[0])) {
    case 'T': return 0;
    case 'R': return 1;
    case 'C': {            // COLLNET_DIRECT / CollnetDirect, COLLNET_CHAIN / CollnetChain
      std::size_t at = 0;  // the first letter after "COLLNET" / "Collnet"
      while (at < 7 && name[at] != '\0') ++at;
      if (at < 7) return -1;
      if (name[at] == '_') ++at;
      const char c = upper(name[at]);
      if (c == 'D') return 2;
      if (c == 'C' && upper(name[at + 1]) == 'H') return 3;
      return -1;
    }
    case 'N': return length(name, 5) == 4 ? 4 : 5;  // NVLS, NVLS_TREE / NVLSTree
    case 'P': return 6;
    default: return -1;
  }
}

// ncclProtoToString: LL 0, LL128 1, Simple 2.
inline int protoFromNcclName(const char* name) {
  if (name == nullptr) return -1;
  switch (upper(name[0])) {
    case 'L':
      if (upper(name[1]) != 'L') return -1;
      return name[2] == '\0' ? 0 : (name[2] == '1' ? 1 : -1);
    case 'S': return 2;
    default: return -1;
  }
}

}  // namespace gradscope::nccl_profiler
