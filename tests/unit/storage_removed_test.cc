// Trace files that a job's end left in an unusual state:
// - removed behind the writer's back (the user cleans the output directory while the job runs):
//   removed() notices, recreate() writes everything committed so far into a new file at the same path,
//   and writing goes on there; nothing committed is lost and the new file is 0600;
// - left with a hot rollback journal (the writer killed in the middle of an update, as when a launcher's
//   SIGKILL follows its SIGTERM while the agent finishes the file): every reader rolls it back and reads
//   the complete trace, or says what to do when it may not write.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <span>
#include <string>

#include <gtest/gtest.h>
#include <sqlite3.h>

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

// A child process opens the finished trace, changes every call in a transaction whose pages spill to the
// file before the commit (a one-page cache), and dies without committing: a hot journal.
void leaveHotJournal(const std::string& path) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) ::_exit(10);
    const int rc = sqlite3_exec(db,
                                "PRAGMA journal_mode = DELETE; PRAGMA cache_size = 1; BEGIN; "
                                "UPDATE calls SET bytes = bytes + 1;",
                                nullptr, nullptr, nullptr);
    ::_exit(rc == SQLITE_OK ? 0 : 11);  // no COMMIT, no close: as if killed
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_TRUE(test::exists(path + "-journal"));
}

TEST(StorageHotJournal, ReadersRollBackAWriterKilledMidUpdate) {
  TempDir dir;
  const std::string path = dir.file("rank0.db");
  const auto calls = testing::manyCalls(50'000, 0, 1, 3);
  TraceWriter writer = startTrace(path);
  writer.appendCalls(calls);
  writer.finish(777);
  leaveHotJournal(path);

  // Read-only, as merge opens its inputs: the journal is rolled back first, and the data is the committed
  // one.
  expectCalls(path, calls);
  EXPECT_FALSE(test::exists(path + "-journal"));
  EXPECT_EQ(TraceReader::open(path).runs().at(0).end_ns, 777);
}

TEST(StorageHotJournal, WithoutWriteAccessTheErrorSaysWhatToDo) {
  TempDir dir;
  const std::string path = dir.file("rank0.db");
  TraceWriter writer = startTrace(path);
  writer.appendCalls(testing::manyCalls(20'000, 0, 1, 3));
  writer.finish(777);
  leaveHotJournal(path);
  // Root writes anywhere whatever the mode bits say: the read-only case runs as another user.
  ::chmod(dir.path().c_str(), 0755);
  ::chmod(path.c_str(), 0644);
  ::chmod((path + "-journal").c_str(), 0644);
  const test::ChildResult child =
      test::runUnprivileged([&] { return test::childErrorMessage([&] { TraceReader::open(path); }); });
  if (child.skipped) GTEST_SKIP() << child.text;
  EXPECT_NE(child.text.find("-journal must be rolled back"), std::string::npos) << child.text;
  EXPECT_NE(child.text.find("copy both files to a writable directory"), std::string::npos) << child.text;
  EXPECT_EQ(child.text.find('\n'), std::string::npos) << child.text;
  // The file was left as it was: once readable by its owner, it reads complete.
  EXPECT_TRUE(test::exists(path + "-journal"));
  EXPECT_EQ(TraceReader::open(path).callCount(), 20'000);
}

}  // namespace
}  // namespace gradscope::storage
