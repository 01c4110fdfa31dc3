// cli/bench: the command line, the sweep's sizes, the outputs and the trace file of `gradscope bench`,
// and a small local sweep end to end (the MPI runs are tests/bench/).

#include "gradscope/cli/bench.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gradscope/storage/reader.h"
#include "test_util.h"

namespace gradscope::cli::bench {
namespace {

ParsedArguments parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gradscope bench");
  std::vector<const char*> argv;
  for (const auto& arg : args) argv.push_back(arg.c_str());
  return parseBenchArguments(static_cast<int>(argv.size()), argv.data());
}

BenchOptions options(std::vector<std::string> args) {
  auto parsed = parse(std::move(args));
  EXPECT_TRUE(parsed.options) << parsed.message;
  return parsed.options.value_or(BenchOptions{});
}

std::string errorOf(std::vector<std::string> args) {
  const auto parsed = parse(std::move(args));
  EXPECT_FALSE(parsed.options);
  EXPECT_EQ(parsed.exit_code, 2);
  EXPECT_EQ(parsed.message.find('\n'), std::string::npos) << "errors are one line: " << parsed.message;
  return parsed.message;
}

TEST(BenchOptions, DefaultsFollowNcclTests) {
  const auto o = options({});
  EXPECT_EQ(o.backend, Backend::Unknown);
  EXPECT_EQ(o.min_bytes, 8u);
  EXPECT_EQ(o.max_bytes, 64u << 20);
  EXPECT_EQ(o.step_factor, 2u);
  EXPECT_EQ(o.step_bytes, 0u);
  EXPECT_EQ(o.iters, 20);
  EXPECT_EQ(o.warmup_iters, 5);
  EXPECT_EQ(o.dtype, DType::Fp32);
  EXPECT_TRUE(o.check);
  EXPECT_TRUE(o.strategies.empty());
  EXPECT_EQ(o.inputs, 8);
  EXPECT_EQ(o.format, OutputFormat::Table);
  EXPECT_EQ(o.mpi_threads, comm::MpiThreads::Single);  // as OSU's benchmarks start MPI
  EXPECT_EQ(o.command_line, "gradscope bench");
}

TEST(BenchOptions, ParsesEveryOption) {
  const auto o = options({"--backend", "local", "-b",    "1K", "-e",           "1M",
                          "-i",        "4K",    "-n",    "7",  "-w",           "0",
                          "-d",        "bf16",  "-c",    "0",  "--strategies", "local/tree,local/kahan",
                          "-k",        "3",     "--csv", "-o", "out.db",       "--no-progress"});
  EXPECT_EQ(o.backend, Backend::Local);
  EXPECT_EQ(o.min_bytes, 1024u);
  EXPECT_EQ(o.max_bytes, 1u << 20);
  EXPECT_EQ(o.step_bytes, 4096u);
  EXPECT_EQ(o.iters, 7);
  EXPECT_EQ(o.warmup_iters, 0);
  EXPECT_EQ(o.dtype, DType::Bf16);
  EXPECT_FALSE(o.check);
  EXPECT_EQ(o.strategies, (std::vector<std::string>{"local/tree", "local/kahan"}));
  EXPECT_EQ(o.inputs, 3);
  EXPECT_EQ(o.format, OutputFormat::Csv);
  EXPECT_EQ(o.output, "out.db");
  EXPECT_FALSE(o.progress);
  EXPECT_EQ(options({"-d", "double"}).dtype, DType::Fp64);
  EXPECT_EQ(options({"-d", "half"}).dtype, DType::Fp16);
  EXPECT_EQ(options({"--json"}).format, OutputFormat::Json);
  EXPECT_EQ(options({"--mpi-threads", "funneled"}).mpi_threads, comm::MpiThreads::Funneled);
  EXPECT_EQ(options({"--mpi-threads", "multiple"}).mpi_threads, comm::MpiThreads::Multiple);
}

TEST(BenchOptions, BadArgumentsAreOneLine) {
  EXPECT_EQ(errorOf({"-b", "1M", "-e", "64K"}), "-b 1M is larger than -e 64K; swap them");
  EXPECT_NE(errorOf({"-d", "int8"}).find("float, double, half or bfloat16"), std::string::npos);
  EXPECT_NE(errorOf({"-f", "1"}).find("-f 1"), std::string::npos);
  EXPECT_NE(errorOf({"-b", "0", "-e", "1K"}).find("-b 0"), std::string::npos);
  EXPECT_NE(errorOf({"-i", "0"}).find("-i 0"), std::string::npos);
  EXPECT_NE(errorOf({"-n", "0"}).find("-n 0"), std::string::npos);
  EXPECT_NE(errorOf({"-b", "12Q"}).find("12Q"), std::string::npos);
  errorOf({"-f", "4", "-i", "8"});
  errorOf({"--csv", "--json"});
  errorOf({"-c", "2"});
  errorOf({"--backend", "tpu"});
  EXPECT_NE(errorOf({"--mpi-threads", "many"}).find("--mpi-threads"), std::string::npos);
}

TEST(BenchOptions, HelpExitsZeroWithText) {
  const auto parsed = parse({"--help"});
  EXPECT_FALSE(parsed.options);
  EXPECT_EQ(parsed.exit_code, 0);
  EXPECT_NE(parsed.message.find("--stepfactor"), std::string::npos);
}

TEST(BenchSizes, SweepLikeNcclTests) {
  EXPECT_EQ(sweepSizes(options({"-b", "8", "-e", "64K", "-f", "8"})),
            (std::vector<std::uint64_t>{8, 64, 512, 4096, 32768}));
  EXPECT_EQ(sweepSizes(options({})).size(), 24u);  // 8 B .. 64 MiB
  EXPECT_EQ(sweepSizes(options({"-b", "100", "-e", "350", "-i", "100"})),
            (std::vector<std::uint64_t>{100, 200, 300}));
  EXPECT_EQ(sweepSizes(options({"-b", "0", "-e", "0"})), (std::vector<std::uint64_t>{0}));
  EXPECT_EQ(sweepSizes(options({"-b", "5", "-e", "5"})), (std::vector<std::uint64_t>{5}));
}

TEST(BenchStrategies, LocalNamesAndErrors) {
  EXPECT_EQ(selectStrategies(options({"--backend", "local"}), nullptr),
            (std::vector<std::string>{"local/add_n", "local/tree", "local/accumulate_n", "local/kahan"}));
  EXPECT_THROW(selectStrategies(options({"--strategies", "local/bogus"}), nullptr), Error);
  EXPECT_THROW(selectStrategies(options({"--strategies", "sum/bogus"}), nullptr), Error);
  try {
    selectStrategies(options({"--strategies", "sum/native"}), nullptr);
    ADD_FAILURE() << "sum/native ran locally";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("--backend mpi or nccl"), std::string::npos);
  }
}

BenchPoint samplePoint(bool lossy) {
  BenchPoint point;
  point.strategy = lossy ? "sum/rs_ag/bf16" : "sum/native";
  point.bytes = 4096;
  point.count = 1024;
  point.reps = 20;
  point.time = {10.0, 12.5, 14.0, 15.0};
  point.median_call = {9.0, 9.5, 10.0, 10.5};
  point.algbw_gbs = 4096 / 12.5e3;
  point.busbw_gbs = point.algbw_gbs;
  if (!lossy) point.wrong = 0;
  point.error = methods::ErrorMetrics{.rel_l2 = lossy ? 2.5e-3 : 3e-8, .max_abs = 1e-3};
  return point;
}

TEST(BenchOutput, TableColumnsLineUpWithTheHeader) {
  const BenchContext context{Backend::Mpi, "MPI, 2 ranks on 1 node", 2, "OSU loop"};
  const TableFormat table({"sum/native", "sum/rs_ag/bf16"});
  const std::string header = table.header(context, options({}));
  const std::string lossless = table.row(samplePoint(false));
  const std::string lossy = table.row(samplePoint(true));
  EXPECT_NE(header.find("MPI, 2 ranks on 1 node"), std::string::npos);
  EXPECT_NE(header.find("2(n-1)/n"), std::string::npos);
  // The column titles' line: each title ends where the row's value ends.
  const std::string titles = header.substr(header.rfind("#  strategy"));
  EXPECT_EQ(titles.size(), lossless.size());
  EXPECT_EQ(lossless.size(), lossy.size());
  EXPECT_EQ(titles.find("rel_err") + 7, lossless.size() - 1);
  EXPECT_EQ(titles.find("#wrong") + 6, lossy.find("n/a") + 3);
  EXPECT_NE(lossless.find(" 3.00e-08"), std::string::npos);
  EXPECT_NE(lossy.find(" 2.50e-03"), std::string::npos);
}

TEST(BenchOutput, CsvHasOneFieldPerColumnAndEmptyUnsetValues) {
  const BenchContext context{Backend::Mpi, "MPI", 2, "OSU loop"};
  const std::string header = formatCsvHeader();
  const auto columns = std::count(header.begin(), header.end(), ',');
  for (bool lossy : {false, true}) {
    const std::string row = formatCsvRow(samplePoint(lossy), context, DType::Fp32);
    EXPECT_EQ(std::count(row.begin(), row.end(), ','), columns) << row;
    EXPECT_EQ(row.find("n/a"), std::string::npos);
    EXPECT_EQ(row.rfind("sum/", 0), 0u);
  }
  EXPECT_NE(formatCsvRow(samplePoint(true), context, DType::Fp32).find(",,0.0025,"), std::string::npos);
  BenchPoint unchecked = samplePoint(false);
  unchecked.wrong.reset();
  unchecked.error.reset();
  const std::string row = formatCsvRow(unchecked, context, DType::Fp32);
  EXPECT_EQ(row.substr(row.size() - 7), ",,,,,,\n");
}

TEST(BenchOutput, JsonHasNullForUnsetValues) {
  const BenchContext context{Backend::Mpi, "MPI", 2, "OSU loop"};
  const auto document =
      nlohmann::json::parse(formatJson(context, options({}), {samplePoint(false), samplePoint(true)}));
  ASSERT_EQ(document["points"].size(), 2u);
  EXPECT_EQ(document["points"][0]["wrong"], 0);
  EXPECT_TRUE(document["points"][1]["wrong"].is_null());
  EXPECT_EQ(document["points"][1]["rel_err"], 2.5e-3);
  EXPECT_EQ(document["points"][0]["time_us"]["median"], 12.5);
  EXPECT_EQ(document["points"][0]["median_call_us"]["median"], 9.5);
  EXPECT_EQ(document["world_size"], 2);
  EXPECT_EQ(document["dtype"], "float");
}

TEST(BenchOutput, ProgressFillsItsWidth) {
  EXPECT_EQ(formatProgress(12, 48, "sum/native 1 MiB", 60).size(), 60u);
  EXPECT_EQ(formatProgress(0, 48, "", 40).rfind("[......", 0), 0u);
  EXPECT_EQ(formatProgress(48, 48, "", 40).rfind("[######", 0), 0u);
  EXPECT_EQ(formatProgress(1, 2, std::string(200, 'x'), 50).size(), 50u);  // never wraps
}

TEST(BenchLocal, EveryPointExactAndWithinTheTreeOrSequentialBound) {
  auto o = options({"--backend", "local", "-b", "2", "-e", "4K", "-f", "4", "-n", "2", "-w", "1", "-k", "5"});
  const auto strategies = selectStrategies(o, nullptr);
  std::vector<BenchPoint> points;
  runLocalSweep(o, strategies, [&](const BenchPoint& point) { points.push_back(point); });
  ASSERT_EQ(points.size(), 6u * strategies.size());  // 2, 8, 32, 128, 512, 2048 bytes
  for (const auto& point : points) {
    SCOPED_TRACE(point.strategy + " " + std::to_string(point.bytes));
    EXPECT_EQ(point.count * 4, point.bytes);
    ASSERT_TRUE(point.wrong);
    EXPECT_EQ(*point.wrong, 0u);
    ASSERT_TRUE(point.error);
    EXPECT_LE(point.error->rel_l2, 2 * 5 * 0x1.0p-24);  // (K-1)u·Σ|x| plus one rounding; Σ|x|/|Σx| < 2
    EXPECT_GT(point.time.median_us, 0);
    EXPECT_EQ(point.time.min_us, point.time.max_us);  // one process
    EXPECT_GT(point.median_call.median_us, 0);
    EXPECT_EQ(point.median_call.min_us, point.median_call.max_us);
  }
  EXPECT_EQ(points.front().bytes, 0u);  // 2 B holds no float: a count-0 point, as nccl-tests prints
}

TEST(BenchTrace, RunAndMeasurementsReadBack) {
  test::TempDir dir;
  const std::string path = dir.path() + "/bench.db";
  auto o = options({"--backend", "mpi", "-b", "8", "-e", "8"});
  o.backend = Backend::Mpi;
  const BenchContext context{Backend::Mpi, "MPI, 2 ranks", 2, "OSU loop"};
  {
    BenchTraceWriter writer(path, context, o);
    writer.addRanks({100, 101}, "cpu");
    writer.addPoint(samplePoint(false), DType::Fp32);
    writer.addPoint(samplePoint(true), DType::Fp32);
    writer.finish();
  }
  EXPECT_THROW(BenchTraceWriter(path, context, o), Error);  // never overwrites
  const auto reader = storage::TraceReader::open(path);
  const auto runs = reader.runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].mode, "bench");
  EXPECT_EQ(runs[0].backend, Backend::Mpi);
  EXPECT_EQ(runs[0].world_size, 2);
  EXPECT_EQ(runs[0].command, "gradscope bench --backend mpi -b 8 -e 8");
  EXPECT_EQ(nlohmann::json::parse(runs[0].config_json)["maxbytes"], 8);
  EXPECT_TRUE(runs[0].end_ns.has_value());
  const auto rows = reader.measurements();
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    EXPECT_EQ(row.api, Api::MpiAllreduce);
    EXPECT_EQ(row.bytes, 4096);
    EXPECT_EQ(row.world, 2);
    EXPECT_EQ(row.reps, 20);
    // The trace holds the ranks' median calls, not their averages (a stalled call would move those).
    EXPECT_DOUBLE_EQ(row.min_ns, 9000);
    EXPECT_DOUBLE_EQ(row.median_ns, 9500);
    EXPECT_DOUBLE_EQ(row.p90_ns, 10000);
    EXPECT_DOUBLE_EQ(row.max_ns, 10500);
    EXPECT_FALSE(row.rank_id.has_value());
  }
}

}  // namespace
}  // namespace gradscope::cli::bench
