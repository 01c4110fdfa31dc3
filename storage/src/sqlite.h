#pragma once

// Thin RAII over the SQLite C API: every handle and statement is owned by exactly one object, and every
// failure becomes a gradscope::Error whose message names the file. Internal to storage/.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <sqlite3.h>

#include "gradscope/common/error.h"

namespace gradscope::storage::sql {

class Database;

class Statement {
 public:
  Statement() = default;
  Statement(Database& db, std::string_view sql, bool persistent = false);
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(Statement&& other) noexcept
      : stmt_(std::exchange(other.stmt_, nullptr)), db_(std::exchange(other.db_, nullptr)) {}
  Statement& operator=(Statement&& other) noexcept {
    if (this != &other) {
      sqlite3_finalize(stmt_);
      stmt_ = std::exchange(other.stmt_, nullptr);
      db_ = std::exchange(other.db_, nullptr);
    }
    return *this;
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // Binding (1-based index, as in SQLite).
  void bind(int index, std::int64_t value) { check(sqlite3_bind_int64(stmt_, index, value)); }
  void bind(int index, int value) { check(sqlite3_bind_int64(stmt_, index, value)); }
  void bind(int index, double value) { check(sqlite3_bind_double(stmt_, index, value)); }
  void bind(int index, std::string_view value) {
    check(sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  void bind(int index, const char* value) { bind(index, std::string_view(value)); }
  void bind(int index, const std::string& value) { bind(index, std::string_view(value)); }
  void bindNull(int index) { check(sqlite3_bind_null(stmt_, index)); }
  template <typename T>
  void bind(int index, const std::optional<T>& value) {
    if (value) bind(index, *value);
    else bindNull(index);
  }
  // Hot path: unchecked integer and NULL binds (the statement and index are known good).
  void bindFast(int index, std::int64_t value) { sqlite3_bind_int64(stmt_, index, value); }
  void bindNullFast(int index) { sqlite3_bind_null(stmt_, index); }

  // Runs one step: true while a row is available, false when done. Throws on error.
  bool step();
  // Runs a statement that returns no rows, then resets it for reuse.
  void run() {
    step();
    reset();
  }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  std::int64_t int64(int column) const { return sqlite3_column_int64(stmt_, column); }
  int int32(int column) const { return sqlite3_column_int(stmt_, column); }
  double real(int column) const { return sqlite3_column_double(stmt_, column); }
  bool isNull(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }
  std::string text(int column) const {
    const auto* data = sqlite3_column_text(stmt_, column);
    return data ? std::string(reinterpret_cast<const char*>(data),
                              static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column)))
                : std::string();
  }
  std::optional<std::int64_t> optionalInt64(int column) const {
    return isNull(column) ? std::nullopt : std::optional<std::int64_t>(int64(column));
  }
  std::optional<double> optionalReal(int column) const {
    return isNull(column) ? std::nullopt : std::optional<double>(real(column));
  }

  sqlite3_stmt* handle() const { return stmt_; }

 private:
  void check(int rc) const;
  sqlite3_stmt* stmt_ = nullptr;
  Database* db_ = nullptr;
};

class Database {
 public:
  Database() = default;
  // Opens `path` with SQLite flags; throws with a message naming the file.
  Database(const std::string& path, int flags);
  ~Database() { close(); }
  Database(Database&& other) noexcept
      : db_(std::exchange(other.db_, nullptr)), path_(std::move(other.path_)) {}
  Database& operator=(Database&& other) noexcept {
    if (this != &other) {
      close();
      db_ = std::exchange(other.db_, nullptr);
      path_ = std::move(other.path_);
    }
    return *this;
  }
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  void exec(std::string_view sql);
  // First column of the first row of a query as an integer (0 when no row).
  std::int64_t queryInt(std::string_view sql);
  void close();

  sqlite3* handle() const { return db_; }
  const std::string& path() const { return path_; }
  bool isOpen() const { return db_ != nullptr; }

  // Throws the Error for a failed SQLite call, translating SQLite codes into what the user can do.
  [[noreturn]] void raise(int rc, std::string_view what) const;

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

// RAII transaction: BEGIN on construction, ROLLBACK unless commit() was called.
class Transaction {
 public:
  explicit Transaction(Database& db, bool immediate = true) : db_(&db) {
    db.exec(immediate ? "BEGIN IMMEDIATE" : "BEGIN");
  }
  ~Transaction() {
    if (db_) sqlite3_exec(db_->handle(), "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit() {
    db_->exec("COMMIT");
    db_ = nullptr;
  }

 private:
  Database* db_;
};

}  // namespace gradscope::storage::sql
