#pragma once

// Helpers shared by the unit tests: a self-removing temporary directory, golden-file comparison,
// running the gradscope command, running code as an unprivileged user, raw SQLite access for checks
// that must not go through the code under test, and printable forms of the storage records.

#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "gradscope/common/error.h"
#include "gradscope/storage/records.h"

namespace gradscope::test {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------------
// Files

inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The names a Markdown page's tables list first, in rows written | `name` | with name in [a-z_]+ (the
// docs tests compare them with what the code declares; variables in capitals do not match).
inline std::set<std::string> documentedNames(const std::string& page) {
  const std::regex row(R"(^\| `([a-z_]+)` \|)");
  std::set<std::string> names;
  std::istringstream lines(page);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch match;
    if (std::regex_search(line, match, row)) names.insert(match[1]);
  }
  return names;
}

inline void writeFile(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline void copyFile(const std::string& from, const std::string& to) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

inline unsigned fileMode(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return 0xffffffffu;
  return static_cast<unsigned>(info.st_mode) & 07777u;
}

inline bool exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}

// Names of the entries of a directory, sorted.
inline std::vector<std::string> listDirectory(const std::string& path) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(path)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/gradscope-test-XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) == nullptr)
      throw std::runtime_error("mkdtemp failed: " + std::string(std::strerror(errno)));
    path_ = buffer.data();
  }
  ~TempDir() {
    std::error_code ec;
    // Tests chmod things read-only; make everything writable again so removal works for non-root users.
    for (auto it = fs::recursive_directory_iterator(path_, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_directory(ec)) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(std::string_view name) const { return path_ + "/" + std::string(name); }
  std::string makeSubdir(std::string_view name) const {
    const std::string dir = file(name);
    fs::create_directories(dir);
    return dir;
  }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------------------------
// Errors

// Runs `body`, expecting a gradscope::Error; returns its message ("" and a test failure otherwise).
// Every gradscope error must be one line.
inline std::string errorMessage(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "error message is not one line: " << message;
    EXPECT_FALSE(message.empty());
    return message;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected gradscope::Error, got another exception: " << error.what();
    return {};
  }
  ADD_FAILURE() << "expected gradscope::Error, nothing was thrown";
  return {};
}

#define EXPECT_GRADSCOPE_ERROR(statement, ...)                                           \
  do {                                                                                   \
    const std::string gs_message_ = ::gradscope::test::errorMessage([&] { statement; }); \
    for (const std::string& gs_part_ : std::vector<std::string>{__VA_ARGS__})            \
      EXPECT_NE(gs_message_.find(gs_part_), std::string::npos)                           \
          << "error message \"" << gs_message_ << "\" lacks \"" << gs_part_ << "\"";     \
  } while (0)

// ---------------------------------------------------------------------------------------------------
// Golden files (STYLE.md "Storage"): expected output in tests/data/NAME; on a mismatch NAME.actual is
// written next to it and the failure shows `diff -u`. GRADSCOPE_UPDATE_GOLDEN=1 rewrites the expected
// files instead (then review them with git diff).

inline std::string goldenPath(std::string_view name) {
  return std::string(GRADSCOPE_TEST_DATA_DIR) + "/" + std::string(name);
}

inline std::string shellQuote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

inline std::string commandOutput(const std::string& command) {
  std::string out;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    std::size_t got = 0;
    while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, got);
    ::pclose(pipe);
  }
  return out;
}

inline ::testing::AssertionResult matchesGolden(std::string_view name, const std::string& actual) {
  const std::string expected_path = goldenPath(name);
  const std::string actual_path = expected_path + ".actual";
  const char* update = std::getenv("GRADSCOPE_UPDATE_GOLDEN");
  if (update && std::string_view(update) == "1") {
    writeFile(expected_path, actual);
    std::remove(actual_path.c_str());
    return ::testing::AssertionSuccess() << "updated " << expected_path;
  }
  if (!exists(expected_path)) {
    writeFile(actual_path, actual);
    return ::testing::AssertionFailure()
           << "golden file " << expected_path << " is missing; the output is in " << actual_path
           << " (run with GRADSCOPE_UPDATE_GOLDEN=1 to create it)";
  }
  if (readFile(expected_path) == actual) {
    std::remove(actual_path.c_str());
    return ::testing::AssertionSuccess();
  }
  writeFile(actual_path, actual);
  const std::string diff = commandOutput("diff -u " + shellQuote(expected_path) + " " +
                                         shellQuote(actual_path) + " 2>&1 | head -200");
  return ::testing::AssertionFailure()
         << "output differs from golden file " << expected_path << " (actual output in " << actual_path
         << "; GRADSCOPE_UPDATE_GOLDEN=1 accepts it):\n"
         << diff;
}

// Replaces every occurrence of `from` in `text` with `to`.
inline std::string replaceAll(std::string text, std::string_view from, std::string_view to) {
  if (from.empty()) return text;
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// ---------------------------------------------------------------------------------------------------
// Processes

struct CommandResult {
  bool exited = false;  // false: killed by a signal (a crash)
  int exit_code = -1;
  int signal = 0;
  std::string out, err;
};

// Runs a shell command line, capturing standard output and error.
inline CommandResult runShell(const std::string& command_line) {
  TempDir scratch;
  const std::string out = scratch.file("stdout"), err = scratch.file("stderr");
  const int status =
      std::system((command_line + " >" + shellQuote(out) + " 2>" + shellQuote(err) + " </dev/null").c_str());
  CommandResult result;
  if (status == -1) {
    result.err = "std::system failed";
    return result;
  }
  if (WIFEXITED(status)) {
    result.exited = true;
    result.exit_code = WEXITSTATUS(status);
    // The shell reports a child killed by a signal as 128 + signal.
    if (result.exit_code > 128 && result.exit_code < 128 + 65) {
      result.exited = false;
      result.signal = result.exit_code - 128;
    }
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  result.out = readFile(out);
  result.err = readFile(err);
  return result;
}

// Runs the gradscope command with `args` (each quoted).
inline CommandResult runCli(const std::vector<std::string>& args) {
  std::string line = shellQuote(GRADSCOPE_CLI_PATH);
  for (const std::string& arg : args) line += " " + shellQuote(arg);
  return runShell(line);
}

inline std::string describe(const CommandResult& result) {
  return fmt::format("exited={} code={} signal={}\n--- stdout ---\n{}\n--- stderr ---\n{}", result.exited,
                     result.exit_code, result.signal, result.out, result.err);
}

// Expects the command-line contract for errors: exit status 2, no crash, exactly one line on stderr
// starting "gradscope: " and containing each of `parts`.
inline void expectCliError(const CommandResult& result, std::initializer_list<std::string_view> parts) {
  EXPECT_TRUE(result.exited) << describe(result);
  EXPECT_EQ(result.exit_code, 2) << describe(result);
  EXPECT_EQ(result.err.rfind("gradscope: ", 0), 0u) << describe(result);
  ASSERT_FALSE(result.err.empty());
  EXPECT_EQ(result.err.back(), '\n') << describe(result);
  EXPECT_EQ(result.err.find('\n'), result.err.size() - 1) << "stderr is not one line: " << describe(result);
  for (std::string_view part : parts)
    EXPECT_NE(result.err.find(part), std::string::npos)
        << "stderr lacks \"" << part << "\": " << describe(result);
}

struct ChildResult {
  bool skipped = false;  // could not drop privileges
  std::string text;      // what the child's function returned, or the reason for skipping
  int status = 0;
};

// The uid/gid the unprivileged children run as (Debian's "nobody"/"nogroup").
inline constexpr uid_t kNobody = 65534;

// Runs `body` in a forked child that is not root: as root (where permission bits do not apply) it drops
// to uid/gid 65534 first; otherwise it runs as the current user. Returns the string `body` returned.
// The caller must make the files the child needs readable (and their directories searchable) by others.
inline ChildResult runUnprivileged(const std::function<std::string()>& body) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return {true, "pipe() failed", 0};
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return {true, "fork() failed", 0};
  if (pid == 0) {
    ::close(pipe_fds[0]);
    std::string text;
    int code = 0;
    if (::geteuid() == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
        text = fmt::format("cannot drop privileges to uid {}: {}", kNobody, std::strerror(errno));
        code = 77;
      } else if (::geteuid() == 0) {
        text = "still root after setuid";
        code = 77;
      }
    }
    if (code == 0) {
      try {
        text = body();
      } catch (const std::exception& error) {
        text = std::string("unexpected exception: ") + error.what();
      }
    }
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t wrote = ::write(pipe_fds[1], text.data() + done, text.size() - done);
      if (wrote <= 0) break;
      done += static_cast<std::size_t>(wrote);
    }
    ::close(pipe_fds[1]);
    ::_exit(code);
  }
  ::close(pipe_fds[1]);
  ChildResult result;
  char buffer[4096];
  ssize_t got = 0;
  while ((got = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0)
    result.text.append(buffer, static_cast<std::size_t>(got));
  ::close(pipe_fds[0]);
  ::waitpid(pid, &result.status, 0);
  result.skipped = WIFEXITED(result.status) && WEXITSTATUS(result.status) == 77;
  return result;
}

// In the child: the message of the gradscope::Error `body` throws, or a description of what happened.
inline std::string childErrorMessage(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& error) {
    return std::string("Error: ") + error.what();
  } catch (const std::exception& error) {
    return std::string("other exception: ") + error.what();
  }
  return "no error";
}

// ---------------------------------------------------------------------------------------------------
// Raw SQLite, for checks that must not go through the code under test.

class RawDb {
 public:
  explicit RawDb(const std::string& path, int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) {
    if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK)
      throw std::runtime_error("sqlite3_open_v2(" + path +
                               "): " + (db_ ? sqlite3_errmsg(db_) : "out of memory"));
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  void exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      std::string message = error ? error : "?";
      sqlite3_free(error);
      throw std::runtime_error("sqlite3_exec: " + message + " in: " + sql.substr(0, 200));
    }
  }

  // Rows of a query, every column as text ("NULL" for NULL).
  std::vector<std::vector<std::string>> rows(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK)
      throw std::runtime_error(std::string("prepare: ") + sqlite3_errmsg(db_) + " in: " + sql);
    std::vector<std::vector<std::string>> out;
    int rc = 0;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int c = 0; c < sqlite3_column_count(stmt); ++c) {
        const auto* text = sqlite3_column_text(stmt, c);
        row.push_back(sqlite3_column_type(stmt, c) == SQLITE_NULL ? "NULL"
                                                                  : reinterpret_cast<const char*>(text));
      }
      out.push_back(std::move(row));
    }
    const std::string error = rc == SQLITE_DONE ? "" : sqlite3_errmsg(db_);
    sqlite3_finalize(stmt);
    if (!error.empty()) throw std::runtime_error("step: " + error + " in: " + sql);
    return out;
  }

  std::string text(const std::string& sql) {
    const auto result = rows(sql);
    return result.empty() || result[0].empty() ? "" : result[0][0];
  }
  std::int64_t integer(const std::string& sql) { return std::stoll(text(sql)); }

  sqlite3* handle() const { return db_; }

 private:
  sqlite3* db_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------
// Printable records: comparing these strings compares every field and prints a readable difference.

template <typename T>
std::string optionalText(const std::optional<T>& value) {
  return value ? fmt::format("{}", *value) : std::string("unset");
}

inline std::string describe(const storage::RunInfo& r) {
  return fmt::format(
      "run{{id={} uuid={} command={} mode={} backend={} world={} host={} config={} version={} epoch={} "
      "start={} end={}}}",
      r.id, r.uuid, r.command, r.mode, static_cast<int>(r.backend), r.world_size, r.host, r.config_json,
      r.tool_version, r.epoch_ns, r.start_ns, optionalText(r.end_ns));
}

inline std::string describe(const storage::RankInfo& r) {
  return fmt::format("rank{{id={} run={} rank={} host={} pid={} device={} offset={}}}", r.id, r.run_id,
                     r.rank, r.host, r.pid, r.device, r.clock_offset_ns);
}

inline std::string describe(const storage::CommInfo& c) {
  return fmt::format("comm{{id={} rank_id={} key={} backend={} size={} comm_rank={}}}", c.id, c.rank_id,
                     c.key, static_cast<int>(c.backend), c.size, c.comm_rank);
}

inline std::string describe(const storage::CallRecord& c) {
  return fmt::format(
      "call{{id={} rank_id={} comm={} seq={} step={} api={} dtype={} op={} count={} bytes={} enq={} "
      "start={} end={} stream={} algo={} proto={} channels={}}}",
      c.id, c.rank_id, c.comm_id, c.seq, c.step, static_cast<int>(c.api), static_cast<int>(c.dtype),
      static_cast<int>(c.op), c.count, c.bytes, c.enqueue_ns, c.start_ns, c.end_ns, c.stream, c.nccl_algo,
      c.nccl_proto, c.nccl_channels);
}

inline std::string describe(const storage::Measurement& m) {
  return fmt::format(
      "measurement{{id={} run={} rank={} call={} strategy={} api={} dtype={} bytes={} world={} reps={} "
      "min={} median={} p90={} max={} algbw={} busbw={} rel_l2={} max_abs={} cosine={} overflow={}}}",
      m.id, m.run_id, optionalText(m.rank_id), optionalText(m.call_id), m.strategy, static_cast<int>(m.api),
      static_cast<int>(m.dtype), m.bytes, m.world, m.reps, m.min_ns, m.median_ns, m.p90_ns, m.max_ns,
      m.algbw_gbs, m.busbw_gbs, optionalText(m.rel_l2_error), optionalText(m.max_abs_error),
      optionalText(m.cosine), m.overflow_count);
}

inline std::string describe(const storage::ConsensusRecord& c) {
  return fmt::format("consensus{{id={} rank_id={} step={} alpha={} cos={} norm={} diversity={}}}", c.id,
                     c.rank_id, c.step, c.alpha, c.cosine_to_mean, c.grad_norm, c.diversity);
}

inline std::string describe(const storage::RecommendationRecord& r) {
  return fmt::format("recommendation{{id={} run={} created={} json={}}}", r.id, r.run_id, r.created_ns,
                     r.json);
}

inline std::string describe(const storage::DropRecord& d) {
  return fmt::format("drop{{rank_id={} kind={} count={}}}", d.rank_id, d.kind, d.count);
}

template <typename T>
std::vector<std::string> describeAll(const std::vector<T>& rows) {
  std::vector<std::string> out;
  out.reserve(rows.size());
  for (const T& row : rows) out.push_back(describe(row));
  return out;
}

}  // namespace gradscope::test
