#include "gradscope/storage/export.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "file_util.h"
#include "gradscope/common/error.h"
#include "gradscope/common/version.h"
#include "gradscope/storage/peers.h"

namespace gradscope::storage {
namespace {

// JSON string literal with escaping, for the few free-form strings (hosts, command, keys).
std::string jsonString(std::string_view text) {
  return nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Microseconds with nanosecond precision, as Chrome's trace format wants.
std::string micros(std::int64_t ns) {
  const bool negative = ns < 0;
  const std::uint64_t magnitude =
      negative ? static_cast<std::uint64_t>(-(ns + 1)) + 1 : static_cast<std::uint64_t>(ns);
  return fmt::format("{}{}.{:03}", negative ? "-" : "", magnitude / 1000, magnitude % 1000);
}

std::string csvField(std::string_view text) {
  if (text.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string optionalNumber(const std::optional<double>& value) {
  return value ? fmt::format("{}", *value) : std::string();
}

}  // namespace

void writeChromeTrace(const TraceReader& reader, std::ostream& out) {
  const std::vector<RunInfo> runs = reader.runs();
  const std::vector<RankInfo> ranks = reader.ranks();
  std::map<std::int64_t, const RankInfo*> rank_by_id;
  for (const RankInfo& rank : ranks) rank_by_id[rank.id] = &rank;
  std::map<std::int64_t, CommInfo> comm_by_id;
  for (const CommInfo& comm : reader.comms()) comm_by_id[comm.id] = comm;

  out << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"gradscope " << kVersion << "\"";
  if (!runs.empty())
    out << ",\"run\":" << jsonString(runs.front().uuid) << ",\"command\":" << jsonString(runs.front().command)
        << ",\"epoch_ns\":" << runs.front().epoch_ns;
  out << "},\"traceEvents\":[";
  bool first = true;
  const auto event = [&](const std::string& text) {
    out << (first ? "\n" : ",\n") << text;
    first = false;
  };
  for (const RankInfo& rank : ranks) {
    const std::string label = runs.size() > 1
                                  ? fmt::format("run {} rank {} ({})", rank.run_id, rank.rank, rank.host)
                                  : fmt::format("rank {} ({})", rank.rank, rank.host);
    event(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"tid":0,"args":{{"name":{}}}}})", rank.id,
                      jsonString(label)));
    event(
        fmt::format(R"({{"ph":"M","name":"process_sort_index","pid":{},"tid":0,"args":{{"sort_index":{}}}}})",
                    rank.id, rank.id));
  }
  for (const auto& [id, comm] : comm_by_id)
    event(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})",
                      comm.rank_id, id, jsonString(fmt::format("comm {} (size {})", comm.key, comm.size))));

  // Messages as flow arrows from the send's slice to the receive's. Both lists are in call id order, as
  // the calls come, so one cursor each finds a call's flows.
  MessageFlows flows(matchPeerMessages(reader));
  const CommunicatorRanks peer_ranks(reader);

  reader.forEachCall([&](const CallRecord& call) {
    const auto rank = rank_by_id.find(call.rank_id);
    const std::int64_t offset = rank == rank_by_id.end() ? 0 : rank->second->clock_offset_ns;
    const auto comm = comm_by_id.find(call.comm_id);
    std::string args =
        fmt::format(R"("id":{},"seq":{},"comm":{},"dtype":"{}","count":{},"bytes":{})", call.id, call.seq,
                    comm == comm_by_id.end() ? "null" : jsonString(comm->second.key), name(call.dtype),
                    call.count, call.bytes);
    if (call.op != ReduceOp::None) args += fmt::format(R"(,"op":"{}")", name(call.op));
    if (call.step >= 0) args += fmt::format(R"(,"step":{})", call.step);
    if (call.enqueue_ns != call.start_ns)
      args += fmt::format(R"(,"queued_ns":{})", call.start_ns - call.enqueue_ns);
    if (call.stream != 0) args += fmt::format(R"(,"stream":{})", call.stream);
    if (!ncclAlgoName(call.nccl_algo).empty())
      args += fmt::format(R"(,"algo":"{}")", ncclAlgoName(call.nccl_algo));
    if (!ncclProtoName(call.nccl_proto).empty())
      args += fmt::format(R"(,"proto":"{}")", ncclProtoName(call.nccl_proto));
    if (call.nccl_channels > 0) args += fmt::format(R"(,"channels":{})", call.nccl_channels);
    if (call.graph_replay > 0) args += fmt::format(R"(,"graph_replay":{})", call.graph_replay);
    // Peers as recorded (ranks in the communicator) and as world ranks when the trace can tell.
    const auto peer = [&](std::string_view key, std::string_view world_key, int comm_rank) {
      if (comm_rank < 0) return;
      args += fmt::format(R"(,"{}":{})", key, comm_rank);
      if (const int world = peer_ranks.worldRank(call.comm_id, comm_rank); world >= 0)
        args += fmt::format(R"(,"{}":{})", world_key, world);
    };
    peer("dest", "dest_rank", call.dest);
    if (call.send_tag >= 0) args += fmt::format(R"(,"send_tag":{})", call.send_tag);
    peer("source", "source_rank", call.source);
    if (call.recv_tag >= 0) args += fmt::format(R"(,"recv_tag":{})", call.recv_tag);
    if (call.recv_bytes >= 0) args += fmt::format(R"(,"recv_bytes":{})", call.recv_bytes);
    if (call.peer_max_bytes >= 0) args += fmt::format(R"(,"peer_max_bytes":{})", call.peer_max_bytes);
    if (call.peer_min_bytes >= 0) args += fmt::format(R"(,"peer_min_bytes":{})", call.peer_min_bytes);
    event(
        fmt::format(R"({{"ph":"X","name":"{}","cat":"{}","pid":{},"tid":{},"ts":{},"dur":{},"args":{{{}}}}})",
                    name(call.api), name(backendOf(call.api)), call.rank_id, call.comm_id,
                    micros(call.start_ns + offset), micros(call.end_ns - call.start_ns), args));
    // A flow event binds to the slice that encloses its time on its track: the middle of the call is
    // inside it even when the call is short ("bp":"e" asks the same of the flow's end, which otherwise
    // binds to the next slice to begin).
    const std::string middle = micros(call.start_ns + offset + (call.end_ns - call.start_ns) / 2);
    if (flows.sends(call.id))
      event(fmt::format(R"({{"ph":"s","id":{},"name":"message","cat":"p2p","pid":{},"tid":{},"ts":{}}})",
                        call.id, call.rank_id, call.comm_id, middle));
    for (const std::int64_t send : flows.receives(call.id))
      event(fmt::format(
          R"({{"ph":"f","bp":"e","id":{},"name":"message","cat":"p2p","pid":{},"tid":{},"ts":{}}})", send,
          call.rank_id, call.comm_id, middle));
    return true;
  });
  out << "\n]}\n";
}

void writeCsv(const TraceReader& reader, std::string_view table, std::ostream& out) {
  if (table == "calls") {
    std::map<std::int64_t, const RankInfo*> rank_by_id;
    const std::vector<RankInfo> ranks = reader.ranks();
    for (const RankInfo& rank : ranks) rank_by_id[rank.id] = &rank;
    std::map<std::int64_t, std::string> comm_key;
    for (const CommInfo& comm : reader.comms()) comm_key[comm.id] = comm.key;
    // The peer columns come last, after those of earlier versions, so that readers by position keep theirs.
    out << "id,run_id,rank,comm,seq,step,api,dtype,op,count,bytes,enqueue_ns,start_ns,end_ns,dur_ns,stream,"
           "nccl_algo,nccl_proto,nccl_channels,graph_replay,dest,send_tag,source,recv_tag,recv_bytes,"
           "peer_max_bytes,peer_min_bytes\n";
    const auto known = [](std::int64_t value) { return value >= 0 ? std::to_string(value) : std::string(); };
    reader.forEachCall([&](const CallRecord& c) {
      const auto rank = rank_by_id.find(c.rank_id);
      out << fmt::format(
          "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", c.id,
          rank == rank_by_id.end() ? 0 : rank->second->run_id,
          rank == rank_by_id.end() ? c.rank_id : rank->second->rank, csvField(comm_key[c.comm_id]), c.seq,
          c.step >= 0 ? std::to_string(c.step) : std::string(), name(c.api), name(c.dtype),
          c.op == ReduceOp::None ? std::string_view() : name(c.op), c.count, c.bytes, c.enqueue_ns,
          c.start_ns, c.end_ns, c.end_ns - c.start_ns, c.stream != 0 ? std::to_string(c.stream) : "",
          ncclAlgoName(c.nccl_algo), ncclProtoName(c.nccl_proto),
          c.nccl_channels > 0 ? std::to_string(c.nccl_channels) : "",
          c.graph_replay > 0 ? std::to_string(c.graph_replay) : "", known(c.dest), known(c.send_tag),
          known(c.source), known(c.recv_tag), known(c.recv_bytes), known(c.peer_max_bytes),
          known(c.peer_min_bytes));
      return true;
    });
  } else if (table == "measurements") {
    out << "id,run_id,rank_id,call_id,strategy,api,dtype,bytes,world,reps,min_ns,median_ns,p90_ns,max_ns,"
           "algbw_gbs,"
           "busbw_gbs,rel_l2_error,max_abs_error,cosine,overflow_count\n";
    for (const Measurement& m : reader.measurements())
      out << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", m.id, m.run_id,
                         m.rank_id ? std::to_string(*m.rank_id) : "",
                         m.call_id ? std::to_string(*m.call_id) : "", csvField(m.strategy), name(m.api),
                         name(m.dtype), m.bytes, m.world, m.reps, m.min_ns, m.median_ns, m.p90_ns, m.max_ns,
                         m.algbw_gbs, m.busbw_gbs, optionalNumber(m.rel_l2_error),
                         optionalNumber(m.max_abs_error), optionalNumber(m.cosine), m.overflow_count);
  } else {
    fail("unknown table '{}' for CSV export: use calls or measurements", table);
  }
}

void exportTrace(const TraceReader& reader, ExportFormat format, std::string_view table,
                 const std::string& path, bool overwrite) {
  // What can be refused before anything is written is refused first: nothing on standard output, no file.
  if (format == ExportFormat::Perfetto) {
    if (!perfettoExportAvailable()) writePerfettoTrace(reader, std::cout);  // fails, naming the packages
    if (reader.callCount() == 0)
      fail("{}: the trace has no calls; there is nothing to export", reader.path());
  }
  const auto write = [&](std::ostream& out) {
    if (format == ExportFormat::ChromeTrace) writeChromeTrace(reader, out);
    else if (format == ExportFormat::Perfetto) writePerfettoTrace(reader, out);
    else writeCsv(reader, table, out);
  };
  if (path == "-") {
    write(std::cout);
    std::cout.flush();
    if (!std::cout) fail("cannot write to standard output");
    return;
  }
  detail::AtomicOutput output(path, overwrite);
  {
    std::ofstream file(output.temporaryPath(), std::ios::binary | std::ios::trunc);
    if (!file) fail("{}: cannot write: {}", path, errnoMessage(errno));
    write(file);
    file.flush();
    if (!file) fail("{}: write failed (disk full?); nothing was written", path);
  }
  output.commit();
}

}  // namespace gradscope::storage
