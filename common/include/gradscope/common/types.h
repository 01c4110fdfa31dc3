#pragma once

// Vocabulary shared by every part: which collective API was called, on what element type, with which
// reduction. The numeric codes are stored in trace files, so they are part of the file format: never
// renumber or reuse one; add new values with new codes.

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace gradscope {

enum class Backend : std::uint8_t { Unknown = 0, Mpi = 1, Nccl = 2, Local = 3 };

// An intercepted API entry point. Codes 1-15 and 32-63 are MPI's, 16-31 and 64-79 NCCL's (backendOf).
enum class Api : std::uint8_t {
  Unknown = 0,
  MpiAllreduce = 1,
  MpiIallreduce = 2,
  MpiReduce = 3,
  MpiReduceScatter = 4,
  MpiReduceScatterBlock = 5,
  MpiAllgather = 6,
  MpiBcast = 7,
  MpiSend = 8,
  MpiSsend = 9,
  MpiIsend = 10,
  MpiRecv = 11,
  MpiIrecv = 12,
  MpiSendrecv = 13,
  MpiSendrecvReplace = 14,
  MpiBarrier = 15,
  NcclAllReduce = 16,
  NcclReduceScatter = 17,
  NcclAllGather = 18,
  NcclReduce = 19,
  NcclBroadcast = 20,
  NcclGroup = 21,  // the launch of a ncclGroupStart/End block, timed as one unit (its members have rows too)
  NcclSend = 22,
  NcclRecv = 23,
  NcclAlltoAll = 24,
  NcclGather = 25,
  NcclScatter = 26,
  MpiAlltoall = 32,
  MpiAlltoallv = 33,
  MpiGather = 34,
  MpiScatter = 35,
  MpiAllgatherv = 36,
  MpiIbcast = 37,
  MpiIreduce = 38,
  MpiIallgather = 39,
  MpiIreduceScatter = 40,
  MpiIreduceScatterBlock = 41,
  MpiIalltoall = 42,
  MpiIbarrier = 43,
  MpiBsend = 44,
  MpiRsend = 45,
  MpiIssend = 46,
  MpiMrecv = 47,  // the receive of a message MPI_Mprobe/MPI_Improbe matched (mpi4py's recv)
  MpiImrecv = 48,
};

// What an API does, independent of the library: decides the bus-bandwidth factor.
enum class Collective : std::uint8_t {
  Unknown,
  AllReduce,
  ReduceScatter,
  AllGather,
  Reduce,
  Broadcast,
  Group,
  AllToAll,
  Gather,
  Scatter,
  Barrier,
  Send,      // point-to-point: sends to one peer
  Recv,      // receives from one peer
  SendRecv,  // both at once (MPI_Sendrecv, MPI_Sendrecv_replace)
};

// The report's families of calls: what moves data among a group (collective), between two ranks
// (point_to_point), or only orders ranks (synchronisation: barriers). An NCCL group launch is a family of
// its own: its members are counted in theirs, so totals over families leave groups out.
enum class ApiFamily : std::uint8_t { Collective, PointToPoint, Synchronization, Group };

// Codes 0..11 are NCCL's ncclDataType_t values (nccl.h); MPI types map onto them where they match.
enum class DType : std::uint8_t {
  Int8 = 0,
  Uint8 = 1,
  Int32 = 2,
  Uint32 = 3,
  Int64 = 4,
  Uint64 = 5,
  Fp16 = 6,
  Fp32 = 7,
  Fp64 = 8,
  Bf16 = 9,
  Fp8E4M3 = 10,
  Fp8E5M2 = 11,
  Other = 254,  // an MPI derived or otherwise unknown type: its size is only known per call
};

// Codes 0..4 are NCCL's ncclRedOp_t values.
enum class ReduceOp : std::uint8_t {
  Sum = 0,
  Prod = 1,
  Max = 2,
  Min = 3,
  Avg = 4,
  PreMulSum = 5,  // ncclRedOpCreatePreMulSum
  Other = 254,    // user-defined (MPI_Op_create, other dynamic NCCL ops)
  None = 255,     // the API has no reduction (all-gather, broadcast): stored as NULL
};

std::string_view name(Backend backend);
std::string_view name(Api api);
std::string_view name(Collective collective);
std::string_view name(ApiFamily family);
std::string_view name(DType dtype);
std::string_view name(ReduceOp op);

Backend backendOf(Api api);
Collective collectiveOf(Api api);
ApiFamily familyOf(Api api);
// Point-to-point calls (Send, Recv, SendRecv): numbered per communicator in a sequence of their own,
// since ranks make different numbers of them (calls.seq of collectives is equal on every rank).
bool isPointToPoint(Api api);
// Calls numbered per communicator apart from its collectives (calls.seq): point-to-point calls, and NCCL
// group launches (numbered on their first member's communicator), of which ranks make different numbers.
// Only the collectives' numbers are equal on every rank.
bool numberedApart(Api api);
// Nonblocking MPI calls: posted by the call, completed by MPI_Wait/MPI_Test and their kin.
bool isNonblocking(Api api);
// Size of one element in bytes; 0 for DType::Other.
std::size_t sizeOf(DType dtype);

// Reverse look-ups for names given by users (case-insensitive); nullopt when unknown.
std::optional<Api> parseApi(std::string_view text);
std::optional<DType> parseDType(std::string_view text);
std::optional<ReduceOp> parseReduceOp(std::string_view text);

// Every value with a name, in code order: used to fill the trace file's names table and to validate.
std::span<const Api> allApis();
std::span<const DType> allDTypes();
std::span<const ReduceOp> allReduceOps();
std::span<const Backend> allBackends();

// NCCL's algorithm and protocol enums (REFERENCE.md: Tree=0 ... PAT=6; LL=0, LL128=1, Simple=2), as
// stored in gpu_calls. Names as NCCL prints them; an empty view for a code outside the enum.
inline constexpr int kNcclAlgoCount = 7;
inline constexpr int kNcclProtoCount = 3;
std::string_view ncclAlgoName(int algo);
std::string_view ncclProtoName(int proto);
// The same codes as NVIDIA's example tuner spells them in its CSV files (ext-tuner/example), which the
// tuner plugin reads and `gradscope recommend --format nccl-tuner` writes: "tree", "ring",
// "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"; "ll", "ll128", "simple".
std::string_view ncclTunerAlgoName(int algo);
std::string_view ncclTunerProtoName(int proto);
// Either spelling in any letter case, '_' ignored ("CollnetDirect", "collnet_direct", "COLLNET_DIRECT"
// all give 2); nullopt for anything else.
std::optional<int> parseNcclAlgo(std::string_view text);
std::optional<int> parseNcclProto(std::string_view text);

// A narrower type a strategy sends a gradient in (the wire part of a strategy name, strategy_name.h);
// methods/wire.h converts to and from it. Not stored as a code: only its name is.
enum class WireFormat : std::uint8_t { Fp16, Bf16, Fp8E4M3, Fp8E5M2 };
inline constexpr WireFormat kWireFormats[] = {WireFormat::Fp16, WireFormat::Bf16, WireFormat::Fp8E4M3,
                                              WireFormat::Fp8E5M2};
// "fp16", "bf16", "fp8e4m3", "fp8e5m2": the names of the DTypes they are. The look-up is exact (lower
// case); strategy names are lower-cased before it.
std::string_view name(WireFormat format);
std::optional<WireFormat> parseWireFormat(std::string_view text);

// nccl-tests' bus-bandwidth factor for a collective over `ranks` ranks: 2(n-1)/n for all-reduce,
// (n-1)/n for reduce-scatter, all-gather, all-to-all, gather and scatter, 1 for broadcast, reduce and
// point-to-point, 0 for barriers and groups.
double busBandwidthFactor(Collective collective, int ranks);

}  // namespace gradscope
