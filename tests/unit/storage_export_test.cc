// storage/export.h: Chrome trace JSON and CSV. Golden files pin the exact output of small deterministic
// traces; parsing the JSON checks what the format promises (one process per rank, one slice per call,
// microsecond times consistent with the database, clock offsets applied, strings escaped).

#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradscope/common/version.h"
#include "gradscope/storage/export.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using nlohmann::json;
using test::TempDir;

// A merged two-rank, two-step job with small buckets (1 MiB + 2 MiB + loss + metrics per step).
std::string writeSmallJob(const TempDir& dir, bool gpu) {
  testing::SyntheticJob job;
  job.ranks = 2;
  job.steps = 2;
  job.model_bytes = 3 << 20;
  job.gpu = gpu;
  std::vector<std::string> ranks;
  for (int rank = 0; rank < job.ranks; ++rank) {
    ranks.push_back(dir.file(fmt::format("rank-{}.db", rank)));
    testing::writeSyntheticRank(ranks.back(), job, rank);
  }
  const std::string merged = dir.file(gpu ? "gpu.db" : "cpu.db");
  mergeTraces(ranks, merged, {});
  for (const std::string& path : ranks) std::remove(path.c_str());
  return merged;
}

std::string chromeTrace(const TraceReader& reader) {
  std::ostringstream out;
  writeChromeTrace(reader, out);
  return out.str();
}

std::string csv(const TraceReader& reader, std::string_view table) {
  std::ostringstream out;
  writeCsv(reader, table, out);
  return out.str();
}

// The producer names this build's version; goldens must not change with every release.
std::string withoutVersion(const std::string& text) {
  return test::replaceAll(text, fmt::format("\"producer\":\"gradscope {}\"", kVersion),
                          "\"producer\":\"gradscope <version>\"");
}

std::int64_t nanoseconds(const json& microseconds) {
  return std::llround(microseconds.get<double>() * 1000.0);
}

// ---------------------------------------------------------------------------------------------------
// Goldens

TEST(ExportGolden, ChromeTraceOfAGpuJob) {
  TempDir dir;
  const TraceReader reader = TraceReader::open(writeSmallJob(dir, true));
  EXPECT_TRUE(test::matchesGolden("export_synthetic_gpu.json", withoutVersion(chromeTrace(reader))));
}

TEST(ExportGolden, CsvOfAGpuJob) {
  TempDir dir;
  const TraceReader reader = TraceReader::open(writeSmallJob(dir, true));
  EXPECT_TRUE(test::matchesGolden("export_synthetic_gpu.csv", csv(reader, "calls")));
}

TEST(ExportGolden, CsvOfAnMpiJob) {
  TempDir dir;
  const TraceReader reader = TraceReader::open(writeSmallJob(dir, false));
  EXPECT_TRUE(test::matchesGolden("export_synthetic_mpi.csv", csv(reader, "calls")));
}

TEST(ExportGolden, CsvOfMeasurements) {
  TempDir dir;
  const std::string path = dir.file("bench.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "bench";
    run.mode = "bench";
    const std::int64_t run_id = writer.addRun(run);
    writer.addRank({0, run_id, 0, "h", 1, "cpu", 0});
    Measurement m;
    m.run_id = run_id;
    m.strategy = "sum/ring/fp32";
    m.api = Api::MpiAllreduce;
    m.dtype = DType::Fp32;
    m.bytes = 1 << 20;
    m.world = 4;
    m.reps = 20;
    m.min_ns = 100'000;
    m.median_ns = 120'500.5;
    m.p90_ns = 130'000;
    m.max_ns = 150'000;
    m.algbw_gbs = 8.7;
    m.busbw_gbs = 13.05;
    writer.addMeasurement(m);
    m.strategy = "cast, \"bf16\"";  // needs quoting
    m.dtype = DType::Bf16;
    m.rank_id = 0;
    m.rel_l2_error = 0.0039;
    m.max_abs_error = 0.125;
    m.cosine = 0.99999;
    m.overflow_count = 3;
    writer.addMeasurement(m);
    writer.finish();
  }
  const TraceReader reader = TraceReader::open(path);
  EXPECT_TRUE(test::matchesGolden("export_measurements.csv", csv(reader, "measurements")));
}

// ---------------------------------------------------------------------------------------------------
// Chrome trace structure

TEST(ChromeTrace, OneProcessPerRankAndOneSlicePerCallAtDatabaseTimes) {
  TempDir dir;
  const TraceReader reader = TraceReader::open(writeSmallJob(dir, true));
  const json trace = json::parse(chromeTrace(reader));
  EXPECT_EQ(trace.at("displayTimeUnit"), "ns");
  EXPECT_EQ(trace.at("otherData").at("producer"), std::string("gradscope ") + kVersion);
  EXPECT_EQ(trace.at("otherData").at("run"), "00000000-0000-4000-8000-000000000001");
  EXPECT_EQ(trace.at("otherData").at("epoch_ns"), 1'795'000'000'000'000'000);

  std::map<std::int64_t, CallRecord> calls;
  reader.forEachCall([&](const CallRecord& call) {
    calls[call.id] = call;
    return true;
  });
  ASSERT_EQ(calls.size(), 16u);

  std::map<std::int64_t, std::string> process_names, thread_names;
  std::size_t slices = 0;
  for (const json& event : trace.at("traceEvents")) {
    const std::string phase = event.at("ph");
    if (phase == "M" && event.at("name") == "process_name") {
      EXPECT_TRUE(
          process_names.emplace(event.at("pid").get<std::int64_t>(), event.at("args").at("name")).second);
    } else if (phase == "M" && event.at("name") == "thread_name") {
      thread_names[event.at("tid").get<std::int64_t>()] = event.at("args").at("name");
    } else if (phase == "X") {
      ++slices;
      const json& args = event.at("args");
      const CallRecord& call = calls.at(args.at("id").get<std::int64_t>());
      SCOPED_TRACE(test::describe(call));
      EXPECT_EQ(event.at("name"), std::string(name(call.api)));
      EXPECT_EQ(event.at("cat"), "nccl");
      EXPECT_EQ(event.at("pid"), call.rank_id);
      EXPECT_EQ(event.at("tid"), call.comm_id);
      EXPECT_EQ(nanoseconds(event.at("ts")), call.start_ns);  // clock offsets are 0 here
      EXPECT_EQ(nanoseconds(event.at("dur")), call.end_ns - call.start_ns);
      EXPECT_EQ(args.at("seq"), call.seq);
      EXPECT_EQ(args.at("bytes"), call.bytes);
      EXPECT_EQ(args.at("count"), call.count);
      EXPECT_EQ(args.at("comm"), "world");
      EXPECT_EQ(args.at("dtype"), "fp32");
      EXPECT_EQ(args.at("step"), call.step);
      EXPECT_EQ(args.at("stream"), 1);
      EXPECT_EQ(args.at("algo"), call.bytes >= (1 << 20) ? "Ring" : "Tree");
      EXPECT_EQ(args.at("proto"), call.bytes >= (1 << 20) ? "Simple" : "LL");
      EXPECT_EQ(args.at("channels"), call.nccl_channels);
      if (call.op == ReduceOp::None) EXPECT_FALSE(args.contains("op"));
      else EXPECT_EQ(args.at("op"), "sum");
      if (call.enqueue_ns == call.start_ns) EXPECT_FALSE(args.contains("queued_ns"));
      else EXPECT_EQ(args.at("queued_ns"), call.start_ns - call.enqueue_ns);
    } else {
      EXPECT_EQ(event.at("name"), "process_sort_index") << event.dump();
    }
  }
  EXPECT_EQ(slices, calls.size());
  EXPECT_EQ(process_names,
            (std::map<std::int64_t, std::string>{{0, "rank 0 (node0)"}, {1, "rank 1 (node0)"}}));
  EXPECT_EQ(thread_names.size(), reader.comms().size());
  for (const auto& [id, label] : thread_names) EXPECT_EQ(label, "comm world (size 2)");
}

// A graph replay is a slice like any call, with its number; the CSV has it in a column of its own.
TEST(ChromeTrace, GraphReplaysCarryTheirNumber) {
  TempDir dir;
  const std::string path = writeSmallJob(dir, true);
  {
    test::RawDb db(path);
    db.exec("UPDATE gpu_calls SET replay = 2 WHERE call_id = 3");
  }
  const TraceReader reader = TraceReader::open(path);
  const json trace = json::parse(chromeTrace(reader));
  int replays = 0;
  for (const json& event : trace.at("traceEvents"))
    if (event.at("ph") == "X" && event.at("args").contains("graph_replay")) {
      ++replays;
      EXPECT_EQ(event.at("args").at("id"), 3);
      EXPECT_EQ(event.at("args").at("graph_replay"), 2);
    }
  EXPECT_EQ(replays, 1);
  const std::string text = csv(reader, "calls");
  EXPECT_NE(text.find(",nccl_channels,graph_replay,dest,"), std::string::npos) << text.substr(0, 300);
  // graph_replay is the 20th column (the peer columns follow it; no field of these rows holds a comma).
  const auto replayField = [](const std::string& line) {
    std::size_t at = 0;
    for (int column = 0; column < 19; ++column) at = line.find(',', at) + 1;
    return line.substr(at, line.find(',', at) - at);
  };
  std::istringstream lines(text);
  std::string line;
  int with_replay = 0;
  while (std::getline(lines, line))
    if (line.rfind("3,", 0) == 0) {
      EXPECT_EQ(replayField(line), "2") << line;
      ++with_replay;
    } else {
      EXPECT_EQ(replayField(line), line.rfind("id,", 0) == 0 ? "graph_replay" : "") << line;
    }
  EXPECT_EQ(with_replay, 1);
}

TEST(ChromeTrace, AppliesClockOffsetsEscapesStringsAndLabelsRuns) {
  TempDir dir;
  const std::string path = dir.file("odd.db");
  const std::string key = "k\"ey\\with\nnewline,comma";
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "run-1";
    run.command = "train --name \"x\" \t tab";
    const std::int64_t run1 = writer.addRun(run);
    run.uuid = "run-2";
    const std::int64_t run2 = writer.addRun(run);
    writer.addRank({0, run1, 0, "h\xc3\xa9llo", 1, "cpu", 0});      // UTF-8 host
    writer.addRank({0, run2, 0, "bad\xff\xfe", 2, "cpu", -1'500});  // invalid UTF-8, clock 1.5 us behind
    const std::int64_t comm0 = writer.addComm({0, 0, key, Backend::Mpi, 2, 0});
    const std::int64_t comm1 = writer.addComm({0, 1, "world", Backend::Mpi, 2, 1});
    CallRecord call;
    call.rank_id = 0;
    call.comm_id = comm0;
    call.api = Api::MpiBcast;
    call.dtype = DType::Uint8;
    call.start_ns = 123'456'789;
    call.enqueue_ns = call.start_ns;
    call.end_ns = call.start_ns + 1;
    CallRecord other = call;
    other.rank_id = 1;
    other.comm_id = comm1;
    other.start_ns = 0;
    other.enqueue_ns = 0;
    other.end_ns = 999;
    writer.appendCalls(std::vector<CallRecord>{call, other});
    writer.finish();
  }
  const TraceReader reader = TraceReader::open(path);
  const std::string text = chromeTrace(reader);
  EXPECT_NE(text.find(R"("ts":123456.789,"dur":0.001)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("ts":-1.500,"dur":0.999)"), std::string::npos) << text;  // 0 − 1.5 us
  json trace;
  ASSERT_NO_THROW(trace = json::parse(text)) << text;
  EXPECT_EQ(trace.at("otherData").at("command"), "train --name \"x\" \t tab");
  std::map<std::int64_t, std::string> process_names;
  std::vector<json> slices;
  for (const json& event : trace.at("traceEvents")) {
    if (event.at("name") == "process_name") process_names[event.at("pid")] = event.at("args").at("name");
    if (event.at("ph") == "X") slices.push_back(event);
  }
  ASSERT_EQ(process_names.size(), 2u);
  EXPECT_EQ(process_names[0], "run 1 rank 0 (h\xc3\xa9llo)");
  EXPECT_NE(process_names[1].find("run 2 rank 0 (bad"), std::string::npos);
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[0].at("args").at("comm"), key);
  EXPECT_EQ(slices[0].at("cat"), "mpi");
  EXPECT_FALSE(slices[0].at("args").contains("stream"));
  EXPECT_FALSE(slices[0].at("args").contains("algo"));
  EXPECT_FALSE(slices[0].at("args").contains("step"));
  EXPECT_EQ(nanoseconds(slices[1].at("ts")), -1'500);
}

TEST(ChromeTrace, EmptyTraceIsValidJson) {
  TempDir dir;
  const std::string path = dir.file("empty.db");
  TraceWriter::create(path).finish();
  const json trace = json::parse(chromeTrace(TraceReader::open(path)));
  EXPECT_TRUE(trace.at("traceEvents").empty());
  EXPECT_FALSE(trace.at("otherData").contains("run"));
}

// ---------------------------------------------------------------------------------------------------
// CSV

TEST(Csv, QuotesFieldsWithCommasQuotesAndNewlines) {
  TempDir dir;
  const std::string path = dir.file("quotes.db");
  {
    TraceWriter writer = TraceWriter::create(path);
    RunInfo run;
    run.uuid = "q";
    const std::int64_t run_id = writer.addRun(run);
    writer.addRank({0, run_id, 3, "h", 1, "cpu", 0});
    const std::int64_t a = writer.addComm({0, 3, "group a,\"b\"", Backend::Mpi, 2, 0});
    const std::int64_t b = writer.addComm({0, 3, "two\nlines", Backend::Mpi, 2, 0});
    const std::int64_t c = writer.addComm({0, 3, "plain", Backend::Mpi, 2, 0});
    CallRecord call;
    call.rank_id = 3;
    call.api = Api::MpiAllreduce;
    call.dtype = DType::Fp64;
    call.op = ReduceOp::Max;
    call.count = 2;
    call.bytes = 16;
    call.step = 0;
    call.start_ns = 10;
    call.end_ns = 25;
    std::vector<CallRecord> calls(3, call);
    calls[0].comm_id = a;
    calls[1].comm_id = b;
    calls[2].comm_id = c;
    writer.appendCalls(calls);
    writer.finish();
  }
  const std::string text = csv(TraceReader::open(path), "calls");
  EXPECT_EQ(text,
            "id,run_id,rank,comm,seq,step,api,dtype,op,count,bytes,enqueue_ns,start_ns,end_ns,dur_ns,stream,"
            "nccl_algo,"
            "nccl_proto,nccl_channels,graph_replay,dest,send_tag,source,recv_tag,recv_bytes,peer_max_bytes,"
            "peer_min_bytes\n"
            "1,1,3,\"group a,\"\"b\"\"\",0,0,MPI_Allreduce,fp64,max,2,16,0,10,25,15,,,,,,,,,,,,\n"
            "2,1,3,\"two\nlines\",0,0,MPI_Allreduce,fp64,max,2,16,0,10,25,15,,,,,,,,,,,,\n"
            "3,1,3,plain,0,0,MPI_Allreduce,fp64,max,2,16,0,10,25,15,,,,,,,,,,,,\n");
}

TEST(Csv, OneLinePerCallAndAHeader) {
  TempDir dir;
  const TraceReader reader = TraceReader::open(writeSmallJob(dir, true));
  const std::string text = csv(reader, "calls");
  EXPECT_EQ(static_cast<std::int64_t>(std::count(text.begin(), text.end(), '\n')), reader.callCount() + 1);
  EXPECT_EQ(csv(reader, "measurements"),
            "id,run_id,rank_id,call_id,strategy,api,dtype,bytes,world,reps,min_ns,median_ns,p90_ns,max_ns,"
            "algbw_gbs,"
            "busbw_gbs,rel_l2_error,max_abs_error,cosine,overflow_count\n");
}

TEST(Csv, RefusesAnUnknownTable) {
  TempDir dir;
  const std::string path = dir.file("t.db");
  TraceWriter::create(path).finish();
  const TraceReader reader = TraceReader::open(path);
  std::ostringstream out;
  EXPECT_GRADSCOPE_ERROR(writeCsv(reader, "runs", out), "unknown table 'runs'", "calls or measurements");
}

// ---------------------------------------------------------------------------------------------------
// exportTrace: files and standard output

TEST(ExportFile, WritesAPrivateFileOnlyWhenCompleteAndNeverClobbersByDefault) {
  TempDir dir;
  const std::string trace = writeSmallJob(dir, true);
  const TraceReader reader = TraceReader::open(trace);
  const std::string output = dir.file("out.json");
  exportTrace(reader, ExportFormat::ChromeTrace, "calls", output, false);
  EXPECT_EQ(test::readFile(output), chromeTrace(reader));
  EXPECT_EQ(test::fileMode(output), 0600u);
  EXPECT_EQ(test::listDirectory(dir.path()), (std::vector<std::string>{"gpu.db", "out.json"}));

  EXPECT_GRADSCOPE_ERROR(exportTrace(reader, ExportFormat::Csv, "calls", output, false), output,
                         "already exists");
  EXPECT_EQ(test::readFile(output), chromeTrace(reader));
  exportTrace(reader, ExportFormat::Csv, "calls", output, true);
  EXPECT_EQ(test::readFile(output), csv(reader, "calls"));
  EXPECT_EQ(test::listDirectory(dir.path()), (std::vector<std::string>{"gpu.db", "out.json"}));

  EXPECT_GRADSCOPE_ERROR(exportTrace(reader, ExportFormat::Csv, "bogus", dir.file("x.csv"), false),
                         "unknown table");
  EXPECT_EQ(test::listDirectory(dir.path()), (std::vector<std::string>{"gpu.db", "out.json"}));
  const std::string subdir = dir.makeSubdir("sub");
  EXPECT_GRADSCOPE_ERROR(exportTrace(reader, ExportFormat::Csv, "calls", subdir, true), subdir,
                         "is a directory");
}

TEST(ExportFile, DashMeansStandardOutput) {
  TempDir dir;
  const TraceReader reader = TraceReader::open(writeSmallJob(dir, false));
  std::ostringstream captured;
  std::streambuf* previous = std::cout.rdbuf(captured.rdbuf());
  try {
    exportTrace(reader, ExportFormat::Csv, "calls", "-", false);
  } catch (...) {
    std::cout.rdbuf(previous);
    throw;
  }
  std::cout.rdbuf(previous);
  EXPECT_EQ(captured.str(), csv(reader, "calls"));
  EXPECT_FALSE(test::exists("-"));
}

// A build without protobuf (the cpu-only preset) refuses the Perfetto format with the packages to install,
// before anything is written; builds with it test the format in storage_perfetto_export_test.cc.
TEST(ExportFile, PerfettoWithoutProtobufNamesThePackagesAndWritesNothing) {
  if (perfettoExportAvailable()) GTEST_SKIP() << "built with protobuf";
  TempDir dir;
  const TraceReader reader = TraceReader::open(writeSmallJob(dir, false));
  EXPECT_GRADSCOPE_ERROR(exportTrace(reader, ExportFormat::Perfetto, "calls", dir.file("t.pftrace"), false),
                         "without protobuf", "libprotobuf-dev", "protobuf-compiler");
  EXPECT_EQ(test::listDirectory(dir.path()), (std::vector<std::string>{"cpu.db"}));
}

TEST(ExportCommand, DefaultOutputNamesAndStandardOutput) {
  TempDir dir;
  const std::string trace = writeSmallJob(dir, true);
  const TraceReader reader = TraceReader::open(trace);
  const std::string stem = trace.substr(0, trace.size() - 3);

  auto result = test::runCli({"export", trace, "--format", "chrome-trace"});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(result.err, "wrote " + stem + ".json\n");
  EXPECT_EQ(test::readFile(stem + ".json"), chromeTrace(reader));

  result = test::runCli({"export", trace, "--format", "csv"});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(test::readFile(stem + ".csv"), csv(reader, "calls"));

  result = test::runCli({"export", trace, "--format", "csv", "--table", "measurements"});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(test::readFile(stem + ".measurements.csv"), csv(reader, "measurements"));

  result = test::runCli({"export", trace, "--format", "chrome-trace", "-o", "-"});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(result.out, chromeTrace(reader));
  EXPECT_TRUE(result.err.empty()) << result.err;

  // An existing output is refused without --force, replaced with it.
  test::expectCliError(test::runCli({"export", trace, "--format", "csv"}), {stem + ".csv", "already exists"});
  result = test::runCli(
      {"export", trace, "--format", "csv", "--force", "--table", "measurements", "-o", stem + ".csv"});
  ASSERT_EQ(result.exit_code, 0) << test::describe(result);
  EXPECT_EQ(test::readFile(stem + ".csv"), csv(reader, "measurements"));
}

}  // namespace
}  // namespace gradscope::storage
