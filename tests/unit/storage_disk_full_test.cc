// A writer that runs out of space: a clear error, no further writes, and a file that still holds
// everything committed before. The limit is RLIMIT_FSIZE in a forked child (works as root, needs no
// mount), with SIGXFSZ ignored so writes fail with EFBIG as they would on a full disk.

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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

// Child exit codes.
constexpr int kAsExpected = 0, kNoError = 10, kWrongMessage = 11, kNotStopped = 12;

TEST(StorageDiskFull, AFailedWriteStopsTheWriterAndKeepsWhatWasCommitted) {
  TempDir dir;
  const std::string path = dir.file("trace.db");
  const auto calls = testing::manyCalls(400'000, 0, 1, 3);
  constexpr std::size_t kCommitted = 20'000;

  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    int code = kNoError;
    try {
      TraceWriter writer = TraceWriter::create(path);
      RunInfo run;
      run.uuid = "disk-full";
      const std::int64_t run_id = writer.addRun(run);
      writer.addRank({0, run_id, 0, "host", 1, "cpu", 0});
      writer.addComm({0, 0, "world", Backend::Mpi, 1, 0});
      writer.appendCalls(std::span(calls).first(kCommitted));
      writer.commit();
      const rlimit limit{4 << 20, 4 << 20};  // the file and its WAL may not grow past 4 MiB
      ::setrlimit(RLIMIT_FSIZE, &limit);
      try {
        for (std::size_t i = kCommitted; i < calls.size(); i += 4096)
          writer.appendCalls(std::span(calls).subspan(i, std::min<std::size_t>(4096, calls.size() - i)));
        writer.commit();
      } catch (const Error& error) {
        const std::string message = error.what();
        code = message.find(path) != std::string::npos && message.find('\n') == std::string::npos
                   ? kAsExpected
                   : kWrongMessage;
      }
      if (code == kAsExpected) {
        try {
          writer.appendCalls(std::span(calls).first(1));
          code = kNotStopped;
        } catch (const Error& error) {
          if (std::string(error.what()).find("earlier error") == std::string::npos) code = kNotStopped;
        }
      }
    } catch (...) {
      code = kWrongMessage;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), kAsExpected) << "child exit code " << WEXITSTATUS(status);

  // The file is valid and holds at least the committed calls, each intact, in order.
  const TraceReader reader = TraceReader::open(path);
  const std::int64_t count = reader.callCount();
  EXPECT_GE(count, static_cast<std::int64_t>(kCommitted));
  EXPECT_LT(count, static_cast<std::int64_t>(calls.size()));
  std::int64_t index = 0;
  reader.forEachCall([&](const CallRecord& call) {
    EXPECT_EQ(call.start_ns, calls[static_cast<std::size_t>(index)].start_ns);
    EXPECT_EQ(call.bytes, calls[static_cast<std::size_t>(index)].bytes);
    ++index;
    return true;
  });
  EXPECT_EQ(index, count);
}

}  // namespace
}  // namespace gradscope::storage
