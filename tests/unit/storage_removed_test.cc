// A trace file removed behind its writer's back (the user cleans the output directory while the job
// runs): removed() notices, recreate() writes everything committed so far into a new file at the same
// path, and writing goes on there; nothing committed is lost and the new file is 0600.

#include <sys/stat.h>

#include <filesystem>
#include <span>
#include <string>

#include <gtest/gtest.h>

#include "gradscope/common/error.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using test::TempDir;

TraceWriter startTrace(const std::string& path) {
  TraceWriter writer = TraceWriter::create(path);
  RunInfo run;
  run.uuid = "removed";
  const std::int64_t run_id = writer.addRun(run);
  writer.addRank({0, run_id, 0, "host", 1, "cpu", 0});
  writer.addComm({0, 0, "world", Backend::Mpi, 1, 0});
  return writer;
}

void expectCalls(const std::string& path, const std::vector<CallRecord>& calls) {
  const TraceReader reader = TraceReader::open(path);
  ASSERT_EQ(reader.callCount(), static_cast<std::int64_t>(calls.size()));
  std::size_t index = 0;
  reader.forEachCall([&](const CallRecord& call) {
    EXPECT_EQ(call.start_ns, calls[index].start_ns) << "call " << index;
    EXPECT_EQ(call.bytes, calls[index].bytes) << "call " << index;
    ++index;
    return true;
  });
  EXPECT_EQ(index, calls.size());
}

TEST(StorageRemoved, ADirectoryRemovedMidRunIsWrittenAgainWithEverythingCommitted) {
  TempDir dir;
  const std::string directory = dir.file("out");
  std::filesystem::create_directory(directory);
  const std::string path = directory + "/rank0.db";
  const auto calls = testing::manyCalls(300'000, 0, 1, 3);
  const auto part = [&](std::size_t from, std::size_t to) {
    return std::span(calls).subspan(from, to - from);
  };

  TraceWriter writer = startTrace(path);
  writer.appendCalls(part(0, 100'000));
  writer.commit();
  EXPECT_FALSE(writer.removed());

  std::filesystem::remove_all(directory);
  EXPECT_TRUE(writer.removed());
  // Uncommitted rows at the time of the removal are kept too: recreate() commits first.
  writer.appendCalls(part(100'000, 150'000));
  std::filesystem::create_directory(directory);
  writer.recreate();
  EXPECT_FALSE(writer.removed());
  EXPECT_EQ(test::fileMode(path), 0600u);
  EXPECT_EQ(writer.callCount(), 150'000);

  writer.appendCalls(part(150'000, calls.size()));
  writer.addDrops(0, "call", 7);
  writer.finish(12345);
  expectCalls(path, calls);
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(reader.runs().at(0).end_ns, 12345);
  EXPECT_EQ(reader.drops().at(0).count, 7);
}

TEST(StorageRemoved, AFileInTheRemovedOnesPlaceIsNeverOverwritten) {
  TempDir dir;
  const std::string path = dir.file("rank0.db");
  const auto calls = testing::manyCalls(1000, 0, 1, 3);
  TraceWriter writer = startTrace(path);
  writer.appendCalls(std::span(calls).first(500));
  writer.commit();
  std::filesystem::remove(path);
  test::writeFile(path, "someone else's file\n");
  EXPECT_TRUE(writer.removed());
  const std::string message = test::errorMessage([&] { writer.recreate(); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(test::readFile(path), "someone else's file\n");
  // The writer still writes (the unlinked file): no exception, the job's recording is not broken.
  writer.appendCalls(std::span(calls).subspan(500));
  writer.commit();
}

}  // namespace
}  // namespace gradscope::storage
