#include "gradscope/common/types.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

namespace gradscope {
namespace {

constexpr std::array kApis = {Api::MpiAllreduce,
                              Api::MpiIallreduce,
                              Api::MpiReduce,
                              Api::MpiReduceScatter,
                              Api::MpiReduceScatterBlock,
                              Api::MpiAllgather,
                              Api::MpiBcast,
                              Api::MpiSend,
                              Api::MpiSsend,
                              Api::MpiIsend,
                              Api::MpiRecv,
                              Api::MpiIrecv,
                              Api::MpiSendrecv,
                              Api::MpiSendrecvReplace,
                              Api::MpiBarrier,
                              Api::NcclAllReduce,
                              Api::NcclReduceScatter,
                              Api::NcclAllGather,
                              Api::NcclReduce,
                              Api::NcclBroadcast,
                              Api::NcclGroup,
                              Api::NcclSend,
                              Api::NcclRecv,
                              Api::NcclAlltoAll,
                              Api::NcclGather,
                              Api::NcclScatter,
                              Api::MpiAlltoall,
                              Api::MpiAlltoallv,
                              Api::MpiGather,
                              Api::MpiScatter,
                              Api::MpiAllgatherv,
                              Api::MpiIbcast,
                              Api::MpiIreduce,
                              Api::MpiIallgather,
                              Api::MpiIreduceScatter,
                              Api::MpiIreduceScatterBlock,
                              Api::MpiIalltoall,
                              Api::MpiIbarrier,
                              Api::MpiBsend,
                              Api::MpiRsend,
                              Api::MpiIssend,
                              Api::MpiMrecv,
                              Api::MpiImrecv};
constexpr std::array kDTypes = {DType::Int8,    DType::Uint8,   DType::Int32, DType::Uint32, DType::Int64,
                                DType::Uint64,  DType::Fp16,    DType::Fp32,  DType::Fp64,   DType::Bf16,
                                DType::Fp8E4M3, DType::Fp8E5M2, DType::Other};
constexpr std::array kOps = {ReduceOp::Sum, ReduceOp::Prod,      ReduceOp::Max,  ReduceOp::Min,
                             ReduceOp::Avg, ReduceOp::PreMulSum, ReduceOp::Other};
constexpr std::array kBackends = {Backend::Mpi, Backend::Nccl, Backend::Local};

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

template <typename T, std::size_t N>
std::optional<T> parseByName(const std::array<T, N>& values, std::string_view text) {
  for (T value : values)
    if (equalsIgnoreCase(name(value), text)) return value;
  return std::nullopt;
}

// NCCL's algorithms and protocols by code, as NCCL prints them and as NVIDIA's example tuner spells them.
struct NcclName {
  std::string_view nccl, tuner;
};
constexpr NcclName kNcclAlgos[kNcclAlgoCount] = {{"Tree", "tree"},
                                                 {"Ring", "ring"},
                                                 {"CollnetDirect", "collnet_direct"},
                                                 {"CollnetChain", "collnet_chain"},
                                                 {"NVLS", "nvls"},
                                                 {"NVLSTree", "nvls_tree"},
                                                 {"PAT", "pat"}};
constexpr NcclName kNcclProtos[kNcclProtoCount] = {{"LL", "ll"}, {"LL128", "ll128"}, {"Simple", "simple"}};

template <std::size_t N>
NcclName nameAt(const NcclName (&names)[N], int code) {
  return code >= 0 && static_cast<std::size_t>(code) < N ? names[code] : NcclName{};
}

// Lower case without '_': NCCL's names ("CollnetDirect") and NVIDIA's tuner's ("collnet_direct") meet.
std::string foldedNcclName(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text)
    if (c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

template <std::size_t N>
std::optional<int> parseCode(std::string_view text, const NcclName (&names)[N]) {
  const std::string key = foldedNcclName(text);
  for (std::size_t code = 0; code < N; ++code)
    if (foldedNcclName(names[code].nccl) == key) return static_cast<int>(code);
  return std::nullopt;
}

}  // namespace

std::string_view name(Backend backend) {
  switch (backend) {
    case Backend::Mpi: return "mpi";
    case Backend::Nccl: return "nccl";
    case Backend::Local: return "local";
    case Backend::Unknown: break;
  }
  return "unknown";
}

std::string_view name(Api api) {
  switch (api) {
    case Api::MpiAllreduce: return "MPI_Allreduce";
    case Api::MpiIallreduce: return "MPI_Iallreduce";
    case Api::MpiReduce: return "MPI_Reduce";
    case Api::MpiReduceScatter: return "MPI_Reduce_scatter";
    case Api::MpiReduceScatterBlock: return "MPI_Reduce_scatter_block";
    case Api::MpiAllgather: return "MPI_Allgather";
    case Api::MpiBcast: return "MPI_Bcast";
    case Api::NcclAllReduce: return "ncclAllReduce";
    case Api::NcclReduceScatter: return "ncclReduceScatter";
    case Api::NcclAllGather: return "ncclAllGather";
    case Api::NcclReduce: return "ncclReduce";
    case Api::NcclBroadcast: return "ncclBroadcast";
    case Api::NcclGroup: return "ncclGroup";
    case Api::MpiSend: return "MPI_Send";
    case Api::MpiSsend: return "MPI_Ssend";
    case Api::MpiIsend: return "MPI_Isend";
    case Api::MpiRecv: return "MPI_Recv";
    case Api::MpiIrecv: return "MPI_Irecv";
    case Api::MpiSendrecv: return "MPI_Sendrecv";
    case Api::MpiSendrecvReplace: return "MPI_Sendrecv_replace";
    case Api::MpiBarrier: return "MPI_Barrier";
    case Api::NcclSend: return "ncclSend";
    case Api::NcclRecv: return "ncclRecv";
    case Api::NcclAlltoAll: return "ncclAlltoAll";
    case Api::NcclGather: return "ncclGather";
    case Api::NcclScatter: return "ncclScatter";
    case Api::MpiAlltoall: return "MPI_Alltoall";
    case Api::MpiAlltoallv: return "MPI_Alltoallv";
    case Api::MpiGather: return "MPI_Gather";
    case Api::MpiScatter: return "MPI_Scatter";
    case Api::MpiAllgatherv: return "MPI_Allgatherv";
    case Api::MpiIbcast: return "MPI_Ibcast";
    case Api::MpiIreduce: return "MPI_Ireduce";
    case Api::MpiIallgather: return "MPI_Iallgather";
    case Api::MpiIreduceScatter: return "MPI_Ireduce_scatter";
    case Api::MpiIreduceScatterBlock: return "MPI_Ireduce_scatter_block";
    case Api::MpiIalltoall: return "MPI_Ialltoall";
    case Api::MpiIbarrier: return "MPI_Ibarrier";
    case Api::MpiBsend: return "MPI_Bsend";
    case Api::MpiRsend: return "MPI_Rsend";
    case Api::MpiIssend: return "MPI_Issend";
    case Api::MpiMrecv: return "MPI_Mrecv";
    case Api::MpiImrecv: return "MPI_Imrecv";
    case Api::Unknown: break;
  }
  return "unknown";
}

std::string_view name(Collective collective) {
  switch (collective) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::Reduce: return "reduce";
    case Collective::Broadcast: return "broadcast";
    case Collective::Group: return "group";
    case Collective::AllToAll: return "all_to_all";
    case Collective::Gather: return "gather";
    case Collective::Scatter: return "scatter";
    case Collective::Barrier: return "barrier";
    case Collective::Send: return "send";
    case Collective::Recv: return "recv";
    case Collective::SendRecv: return "send_recv";
    case Collective::Unknown: break;
  }
  return "unknown";
}

std::string_view name(ApiFamily family) {
  switch (family) {
    case ApiFamily::Collective: return "collective";
    case ApiFamily::PointToPoint: return "point_to_point";
    case ApiFamily::Synchronization: return "synchronization";
    case ApiFamily::Group: return "group";
  }
  return "unknown";
}

std::string_view name(DType dtype) {
  switch (dtype) {
    case DType::Int8: return "int8";
    case DType::Uint8: return "uint8";
    case DType::Int32: return "int32";
    case DType::Uint32: return "uint32";
    case DType::Int64: return "int64";
    case DType::Uint64: return "uint64";
    case DType::Fp16: return "fp16";
    case DType::Fp32: return "fp32";
    case DType::Fp64: return "fp64";
    case DType::Bf16: return "bf16";
    case DType::Fp8E4M3: return "fp8e4m3";
    case DType::Fp8E5M2: return "fp8e5m2";
    case DType::Other: break;
  }
  return "other";
}

std::string_view name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::PreMulSum: return "premulsum";
    case ReduceOp::None: return "none";
    case ReduceOp::Other: break;
  }
  return "other";
}

Backend backendOf(Api api) {
  const auto code = static_cast<unsigned>(api);
  if ((code >= 1 && code < 16) || (code >= 32 && code < 64)) return Backend::Mpi;
  if ((code >= 16 && code < 32) || (code >= 64 && code < 80)) return Backend::Nccl;
  return Backend::Unknown;
}

Collective collectiveOf(Api api) {
  switch (api) {
    case Api::MpiAllreduce:
    case Api::MpiIallreduce:
    case Api::NcclAllReduce: return Collective::AllReduce;
    case Api::MpiReduceScatter:
    case Api::MpiReduceScatterBlock:
    case Api::MpiIreduceScatter:
    case Api::MpiIreduceScatterBlock:
    case Api::NcclReduceScatter: return Collective::ReduceScatter;
    case Api::MpiAllgather:
    case Api::MpiAllgatherv:
    case Api::MpiIallgather:
    case Api::NcclAllGather: return Collective::AllGather;
    case Api::MpiReduce:
    case Api::MpiIreduce:
    case Api::NcclReduce: return Collective::Reduce;
    case Api::MpiBcast:
    case Api::MpiIbcast:
    case Api::NcclBroadcast: return Collective::Broadcast;
    case Api::NcclGroup: return Collective::Group;
    case Api::MpiAlltoall:
    case Api::MpiAlltoallv:
    case Api::MpiIalltoall:
    case Api::NcclAlltoAll: return Collective::AllToAll;
    case Api::MpiGather:
    case Api::NcclGather: return Collective::Gather;
    case Api::MpiScatter:
    case Api::NcclScatter: return Collective::Scatter;
    case Api::MpiBarrier:
    case Api::MpiIbarrier: return Collective::Barrier;
    case Api::MpiSend:
    case Api::MpiSsend:
    case Api::MpiBsend:
    case Api::MpiRsend:
    case Api::MpiIsend:
    case Api::MpiIssend:
    case Api::NcclSend: return Collective::Send;
    case Api::MpiRecv:
    case Api::MpiIrecv:
    case Api::MpiMrecv:
    case Api::MpiImrecv:
    case Api::NcclRecv: return Collective::Recv;
    case Api::MpiSendrecv:
    case Api::MpiSendrecvReplace: return Collective::SendRecv;
    case Api::Unknown: break;
  }
  return Collective::Unknown;
}

ApiFamily familyOf(Api api) {
  switch (collectiveOf(api)) {
    case Collective::Send:
    case Collective::Recv:
    case Collective::SendRecv: return ApiFamily::PointToPoint;
    case Collective::Barrier: return ApiFamily::Synchronization;
    case Collective::Group: return ApiFamily::Group;
    default: return ApiFamily::Collective;
  }
}

bool isPointToPoint(Api api) {
  return familyOf(api) == ApiFamily::PointToPoint;
}

bool numberedApart(Api api) {
  return isPointToPoint(api) || familyOf(api) == ApiFamily::Group;
}

bool isNonblocking(Api api) {
  switch (api) {
    case Api::MpiIallreduce:
    case Api::MpiIsend:
    case Api::MpiIssend:
    case Api::MpiIrecv:
    case Api::MpiImrecv:
    case Api::MpiIbcast:
    case Api::MpiIreduce:
    case Api::MpiIallgather:
    case Api::MpiIreduceScatter:
    case Api::MpiIreduceScatterBlock:
    case Api::MpiIalltoall:
    case Api::MpiIbarrier: return true;
    default: return false;
  }
}

std::size_t sizeOf(DType dtype) {
  switch (dtype) {
    case DType::Int8:
    case DType::Uint8:
    case DType::Fp8E4M3:
    case DType::Fp8E5M2: return 1;
    case DType::Fp16:
    case DType::Bf16: return 2;
    case DType::Int32:
    case DType::Uint32:
    case DType::Fp32: return 4;
    case DType::Int64:
    case DType::Uint64:
    case DType::Fp64: return 8;
    case DType::Other: break;
  }
  return 0;
}

std::optional<Api> parseApi(std::string_view text) {
  return parseByName(kApis, text);
}
std::optional<DType> parseDType(std::string_view text) {
  return parseByName(kDTypes, text);
}
std::optional<ReduceOp> parseReduceOp(std::string_view text) {
  return parseByName(kOps, text);
}

std::span<const Api> allApis() {
  return kApis;
}
std::span<const DType> allDTypes() {
  return kDTypes;
}
std::span<const ReduceOp> allReduceOps() {
  return kOps;
}
std::span<const Backend> allBackends() {
  return kBackends;
}

std::string_view ncclAlgoName(int algo) {
  return nameAt(kNcclAlgos, algo).nccl;
}

std::string_view ncclProtoName(int proto) {
  return nameAt(kNcclProtos, proto).nccl;
}

std::string_view ncclTunerAlgoName(int algo) {
  return nameAt(kNcclAlgos, algo).tuner;
}

std::string_view ncclTunerProtoName(int proto) {
  return nameAt(kNcclProtos, proto).tuner;
}

std::optional<int> parseNcclAlgo(std::string_view text) {
  return parseCode(text, kNcclAlgos);
}

std::optional<int> parseNcclProto(std::string_view text) {
  return parseCode(text, kNcclProtos);
}

std::string_view name(WireFormat format) {
  static constexpr std::string_view kNames[] = {"fp16", "bf16", "fp8e4m3", "fp8e5m2"};  // by value
  const auto index = static_cast<std::size_t>(format);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

std::optional<WireFormat> parseWireFormat(std::string_view text) {
  for (WireFormat format : kWireFormats)
    if (text == name(format)) return format;
  return std::nullopt;
}

double busBandwidthFactor(Collective collective, int ranks) {
  if (ranks <= 0) return 0.0;
  const double n = ranks;
  switch (collective) {
    case Collective::AllReduce: return 2.0 * (n - 1.0) / n;
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll:
    case Collective::Gather:
    case Collective::Scatter: return (n - 1.0) / n;
    case Collective::Reduce:
    case Collective::Broadcast:
    case Collective::Send:
    case Collective::Recv:
    case Collective::SendRecv: return 1.0;
    case Collective::Barrier:
    case Collective::Group:
    case Collective::Unknown: break;
  }
  return 0.0;
}

}  // namespace gradscope
