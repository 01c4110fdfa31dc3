// storage/ and the gradscope command facing bad input: missing, foreign, truncated, corrupted and
// newer-schema files, and outputs that cannot be written. Every refusal is a gradscope::Error with one
// line naming the file and the problem (exit status 2 and one "gradscope: " line from the command), never
// a crash; a failed merge or export leaves neither its output nor a temporary file behind.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/cli/report.h"
#include "gradscope/storage/export.h"
#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using test::expectCliError;
using test::RawDb;
using test::runCli;
using test::TempDir;

// The page size the writer chose, from the SQLite header (bytes 16-17, big-endian; 1 means 65536).
std::int64_t pageSizeOf(const std::string& path) {
  const std::string header = test::readFile(path).substr(0, 100);
  const int raw = (static_cast<unsigned char>(header[16]) << 8) | static_cast<unsigned char>(header[17]);
  return raw == 1 ? 65536 : raw;
}

class BadInput : public ::testing::Test {
 protected:
  // A real trace: one rank of a synthetic job, 7 calls per step.
  std::string writeTrace(const std::string& name, int steps = 500, int rank = 0, int ranks = 2) {
    const std::string path = dir_.file(name);
    testing::SyntheticJob job;
    job.ranks = ranks;
    job.steps = steps;
    testing::writeSyntheticRank(path, job, rank);
    return path;
  }

  // Expects TraceReader::open and `gradscope report` to refuse `path` with a message naming it and
  // containing every one of `parts`.
  void expectRefused(const std::string& path, std::initializer_list<std::string_view> parts) {
    const std::string message = test::errorMessage([&] { TraceReader::open(path); });
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << "message does not start with the file name: " << message;
    for (std::string_view part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "\"" << message << "\" lacks \"" << part << "\"";
    const auto result = runCli({"report", path});
    std::vector<std::string_view> cli_parts(parts);
    cli_parts.push_back(path);
    expectCliError(result, {});
    for (std::string_view part : cli_parts)
      EXPECT_NE(result.err.find(part), std::string::npos)
          << "stderr lacks \"" << part << "\": " << result.err;
    EXPECT_TRUE(result.out.empty()) << result.out;
  }

  TempDir dir_;
};

// Overwrites `count` bytes at `offset` with pseudo-random garbage.
void scribble(const std::string& path, std::int64_t offset, std::int64_t count, std::uint64_t seed) {
  std::string bytes = test::readFile(path);
  ASSERT_LE(offset + count, static_cast<std::int64_t>(bytes.size()));
  std::mt19937_64 random(seed);
  for (std::int64_t i = 0; i < count; ++i)
    bytes[static_cast<std::size_t>(offset + i)] = static_cast<char>(random());
  test::writeFile(path, bytes);
}

// Pages (1-based) holding leaves of the calls table, from SQLite's dbstat table; empty when the SQLite
// library lacks it.
std::vector<std::int64_t> callLeafPages(const std::string& path) {
  std::vector<std::int64_t> pages;
  try {
    RawDb db(path, SQLITE_OPEN_READONLY);
    for (const auto& row :
         db.rows("SELECT pageno FROM dbstat WHERE name = 'calls' AND pagetype = 'leaf' ORDER BY pageno"))
      pages.push_back(std::stoll(row[0]));
  } catch (const std::exception&) {
  }
  return pages;
}

// A trace whose header and schema are intact but with garbage in leaf pages of the calls table past the
// first one: open() succeeds, a full scan of the calls fails.
std::string corruptCallPages(const std::string& path) {
  const std::vector<std::int64_t> leaves = callLeafPages(path);
  if (leaves.size() < 8) return "dbstat is not available or the calls table is too small";
  for (std::size_t i = leaves.size() / 2; i < leaves.size() / 2 + 3; ++i)
    scribble(path, (leaves[i] - 1) * pageSizeOf(path), pageSizeOf(path),
             static_cast<std::uint64_t>(leaves[i]));
  return {};
}

// ---------------------------------------------------------------------------------------------------
// Files that are not (complete) gradscope traces

TEST_F(BadInput, MissingFile) {
  expectRefused(dir_.file("nope.db"), {"no such file"});
}

// The reader takes files only; the command reads a directory as its rank files merged, and refuses one
// holding none.
TEST_F(BadInput, Directory) {
  const std::string path = dir_.makeSubdir("traces.db");
  const std::string message = test::errorMessage([&] { TraceReader::open(path); });
  EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
  const auto result = runCli({"report", path});
  expectCliError(result, {path, "no trace files (*.db) in this directory"});
  EXPECT_TRUE(result.out.empty()) << result.out;
}

TEST_F(BadInput, EmptyFile) {
  const std::string path = dir_.file("empty.db");
  test::writeFile(path, "");
  expectRefused(path, {"empty file", "not a gradscope trace"});
}

TEST_F(BadInput, TextFile) {
  const std::string path = dir_.file("notes.db");
  test::writeFile(path, "These are my notes, not a database.\nLine two.\n");
  expectRefused(path, {"not a gradscope trace", "not an SQLite database"});
}

TEST_F(BadInput, BinaryGarbage) {
  const std::string path = dir_.file("garbage.db");
  test::writeFile(path, std::string(20'000, '\xA5'));
  expectRefused(path, {"not an SQLite database"});
}

TEST_F(BadInput, ForeignSqliteDatabase) {
  const std::string path = dir_.file("photos.db");
  {
    RawDb db(path);
    db.exec(
        "CREATE TABLE photos (id INTEGER PRIMARY KEY, data BLOB); INSERT INTO photos (data) VALUES "
        "(x'00ff')");
  }
  expectRefused(path, {"not a gradscope trace", "another application"});
}

TEST_F(BadInput, TooShortForAnSqliteHeader) {
  const std::string whole = writeTrace("whole.db", 20);
  const std::string path = dir_.file("stub.db");
  test::writeFile(path, test::readFile(whole).substr(0, 50));
  expectRefused(path, {"truncated trace", "50 bytes"});
}

TEST_F(BadInput, TruncatedCopy) {
  const std::string whole = writeTrace("whole.db");
  const std::string bytes = test::readFile(whole);
  ASSERT_GT(static_cast<std::int64_t>(bytes.size()), 20 * pageSizeOf(whole))
      << "the trace should span many pages";
  const std::string path = dir_.file("half.db");
  test::writeFile(path, bytes.substr(0, bytes.size() / 2));
  expectRefused(path, {"truncated trace", std::to_string(bytes.size()), std::to_string(bytes.size() / 2),
                       "copy it again"});
}

TEST_F(BadInput, TruncatedAtAPageBoundary) {
  const std::string whole = writeTrace("whole.db");
  const std::string bytes = test::readFile(whole);
  const std::string path = dir_.file("cut.db");
  test::writeFile(path, bytes.substr(0, bytes.size() - static_cast<std::size_t>(pageSizeOf(whole))));
  expectRefused(path, {"truncated trace"});
}

TEST_F(BadInput, NewerSchema) {
  const std::string path = writeTrace("future.db", 5);
  {
    RawDb db(path);
    db.exec("PRAGMA user_version = 99");
  }
  expectRefused(path, {"newer gradscope", "v99", "upgrade gradscope"});
}

TEST_F(BadInput, IncompleteTraceWithoutSchemaVersion) {
  const std::string path = dir_.file("incomplete.db");
  {
    RawDb db(path);
    db.exec("PRAGMA application_id = 1196639056; CREATE TABLE runs (id INTEGER PRIMARY KEY)");
  }
  expectRefused(path, {"incomplete gradscope trace"});
}

TEST_F(BadInput, TraceWithATableMissing) {
  const std::string path = writeTrace("damaged.db", 5);
  {
    RawDb db(path);
    db.exec("DROP TABLE drops");
  }
  expectRefused(path, {"drops"});
}

// BUG (message): a trace copied while its job was running, or after the job died, without its -wal
// file holds nothing but the SQLite header page (everything else is still in the write-ahead log), and
// is refused as "an SQLite database of another application" (storage/src/reader.cc, open(): the
// application_id of the bare header is 0). checkFile() could see that the header says WAL mode (bytes
// 18-19 are 2), that FILE-wal is absent and that the file is one page, and say to copy FILE-wal too.
TEST_F(BadInput, ALiveTraceCopiedWithoutItsWalSaysWhatIsMissing) {
  const std::string live = dir_.file("live.db");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      auto* writer = new TraceWriter(TraceWriter::create(live));  // never finished: the job "dies"
      RunInfo run;
      run.uuid = "live";
      writer->addRun(run);
      writer->appendCalls(std::vector<CallRecord>(100));
      writer->commit();
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(test::exists(live + "-wal"));
  const std::string copy = dir_.file("copied.db");
  test::copyFile(live, copy);  // without copied.db-wal
  expectRefused(copy, {"-wal"});
  EXPECT_EQ(TraceReader::open(live).callCount(), 100);  // with its log the trace is fine
}

TEST_F(BadInput, CorruptedPagesAreAnErrorNotACrash) {
  const std::string path = writeTrace("corrupt.db");
  const std::string bytes = test::readFile(path);
  const std::int64_t page = pageSizeOf(path);
  const auto pages = static_cast<std::int64_t>(bytes.size()) / page;
  // Garbage over four whole pages in the middle of the file.
  scribble(path, (pages / 2 - 2) * page, 4 * page, 99);
  const std::string message = test::errorMessage([&] {
    const TraceReader reader = TraceReader::open(path);
    std::ostringstream report;
    cli::writeReport(reader, report);
  });
  EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
  EXPECT_NE(message.find("corrupt"), std::string::npos) << message;
  const auto result = runCli({"report", path});
  expectCliError(result, {path, "corrupt"});
}

TEST_F(BadInput, GarbageAnywhereNeverCrashesTheCommand) {
  const std::string original = writeTrace("original.db", 200);
  const std::int64_t size = static_cast<std::int64_t>(test::readFile(original).size());
  // Header fields first (page size, page count, user_version, application_id), then spread over the file.
  std::vector<std::int64_t> offsets = {0, 16, 28, 60, 68, 100, 2'000};
  for (int i = 1; i <= 12; ++i) offsets.push_back(size * i / 13 + 37 * i);
  int refused = 0;
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    SCOPED_TRACE(fmt::format("garbage at offset {}", offsets[i]));
    const std::string path = dir_.file(fmt::format("damaged-{}.db", i));
    test::copyFile(original, path);
    scribble(path, offsets[i], std::min<std::int64_t>(512, size - offsets[i]), i + 1);
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"report", path}, {"export", path, "--format", "csv", "-o", path + ".csv"}}) {
      const auto result = runCli(args);
      ASSERT_TRUE(result.exited) << test::describe(result);
      if (result.exit_code == 2) {
        ++refused;
        expectCliError(result, {path});
      } else {
        EXPECT_EQ(result.exit_code, 0) << test::describe(result);
      }
    }
  }
  EXPECT_GT(refused, 0);
}

// ---------------------------------------------------------------------------------------------------
// Outputs that cannot be written

class BadOutput : public BadInput {
 protected:
  void SetUp() override {
    rank0_ = writeTrace("rank-0.db", 5, 0);
    rank1_ = writeTrace("rank-1.db", 5, 1);
  }
  std::string rank0_, rank1_;
};

TEST_F(BadOutput, MergeIntoAMissingDirectory) {
  const std::string output = dir_.file("missing/merged.db");
  EXPECT_GRADSCOPE_ERROR(mergeTraces({rank0_, rank1_}, output, {}), output, "does not exist");
  EXPECT_FALSE(test::exists(dir_.file("missing")));
  expectCliError(runCli({"merge", rank0_, rank1_, "-o", output}), {output, "does not exist"});
}

TEST_F(BadOutput, ExportIntoAMissingDirectory) {
  const std::string output = dir_.file("missing/trace.json");
  const TraceReader reader = TraceReader::open(rank0_);
  EXPECT_GRADSCOPE_ERROR(exportTrace(reader, ExportFormat::ChromeTrace, "calls", output, false), output,
                         "does not exist");
  expectCliError(runCli({"export", rank0_, "--format", "chrome-trace", "-o", output}),
                 {output, "does not exist"});
}

TEST_F(BadOutput, MergeAndExportIntoAReadOnlyDirectory) {
  const std::string locked = dir_.makeSubdir("locked");
  ::chmod(dir_.path().c_str(), 0755);
  ::chmod(rank0_.c_str(), 0644);
  ::chmod(rank1_.c_str(), 0644);
  ::chmod(locked.c_str(), 0555);
  const auto child = test::runUnprivileged([&] {
    const std::string merged = test::childErrorMessage([&] {
      mergeTraces({rank0_, rank1_}, locked + "/merged.db", {});
    });
    const std::string exported = test::childErrorMessage([&] {
      const TraceReader reader = TraceReader::open(rank0_);
      exportTrace(reader, ExportFormat::Csv, "calls", locked + "/calls.csv", false);
    });
    return merged + "\n" + exported;
  });
  if (child.skipped) GTEST_SKIP() << child.text;
  const auto newline = child.text.find('\n');
  ASSERT_NE(newline, std::string::npos) << child.text;
  const std::string merged = child.text.substr(0, newline), exported = child.text.substr(newline + 1);
  EXPECT_EQ(merged,
            "Error: " + locked + "/merged.db: cannot create: directory '" + locked + "' is not writable");
  EXPECT_EQ(exported,
            "Error: " + locked + "/calls.csv: cannot create: directory '" + locked + "' is not writable");
  EXPECT_TRUE(test::listDirectory(locked).empty());
}

TEST_F(BadOutput, AFailedMergeOfDifferentRunsLeavesNothing) {
  testing::SyntheticJob other;
  other.uuid = "00000000-0000-4000-8000-0000000000ff";
  other.steps = 5;
  const std::string foreign = dir_.file("other-run.db");
  testing::writeSyntheticRank(foreign, other, 1);
  const auto before = test::listDirectory(dir_.path());
  const std::string output = dir_.file("merged.db");
  EXPECT_GRADSCOPE_ERROR(mergeTraces({rank0_, foreign}, output, {}), "2 different runs",
                         "--allow-different-runs");
  EXPECT_EQ(test::listDirectory(dir_.path()), before);
  expectCliError(runCli({"merge", rank0_, foreign, "-o", output}), {"different runs"});
  EXPECT_EQ(test::listDirectory(dir_.path()), before);
}

TEST_F(BadOutput, AMergeFailingHalfwayLeavesNoOutputAndNoTemporaryFile) {
  const std::string damaged = writeTrace("rank-1-damaged.db", 1'500, 1);
  if (const std::string why = corruptCallPages(damaged); !why.empty()) GTEST_SKIP() << why;
  ASSERT_NO_THROW(TraceReader::open(damaged)) << "the damage should only show when the calls are read";
  const auto before = test::listDirectory(dir_.path());
  const std::string output = dir_.file("merged.db");
  // rank 0 is merged first (its calls are written to the temporary output), then rank 1's calls fail.
  EXPECT_GRADSCOPE_ERROR(mergeTraces({rank0_, damaged}, output, {}), damaged, "corrupt");
  EXPECT_EQ(test::listDirectory(dir_.path()), before);
  expectCliError(runCli({"merge", rank0_, damaged, "-o", output}), {damaged, "corrupt"});
  EXPECT_EQ(test::listDirectory(dir_.path()), before);
}

TEST_F(BadOutput, AnExportFailingHalfwayLeavesNoOutputAndNoTemporaryFile) {
  const std::string damaged = writeTrace("damaged.db", 1'500);
  if (const std::string why = corruptCallPages(damaged); !why.empty()) GTEST_SKIP() << why;
  const auto before = test::listDirectory(dir_.path());
  const TraceReader reader = TraceReader::open(damaged);
  for (const ExportFormat format : {ExportFormat::ChromeTrace, ExportFormat::Csv}) {
    const std::string output = dir_.file("export.out");
    EXPECT_GRADSCOPE_ERROR(exportTrace(reader, format, "calls", output, false), damaged, "corrupt");
    EXPECT_EQ(test::listDirectory(dir_.path()), before);
    // Replacing an existing output: the old one stays as it was.
    test::writeFile(output, "old");
    EXPECT_GRADSCOPE_ERROR(exportTrace(reader, format, "calls", output, true), "corrupt");
    EXPECT_EQ(test::readFile(output), "old");
    std::remove(output.c_str());
    EXPECT_EQ(test::listDirectory(dir_.path()), before);
  }
  expectCliError(runCli({"export", damaged, "--format", "csv"}), {damaged, "corrupt"});
  expectCliError(runCli({"export", damaged, "--format", "chrome-trace", "-o", dir_.file("x.json")}),
                 {"corrupt"});
  EXPECT_EQ(test::listDirectory(dir_.path()), before);
}

TEST_F(BadOutput, AnInputThatIsNotATraceIsRefusedBeforeAnythingIsWritten) {
  const std::string bogus = dir_.file("rank-2.db");
  test::writeFile(bogus, "not a trace");
  const auto before = test::listDirectory(dir_.path());
  const std::string output = dir_.file("merged.db");
  EXPECT_GRADSCOPE_ERROR(mergeTraces({rank0_, rank1_, bogus}, output, {}), bogus, "not an SQLite database");
  EXPECT_EQ(test::listDirectory(dir_.path()), before);
  expectCliError(runCli({"merge", dir_.path(), "-o", output}), {bogus, "not an SQLite database"});
  EXPECT_EQ(test::listDirectory(dir_.path()), before);
}

}  // namespace
}  // namespace gradscope::storage
