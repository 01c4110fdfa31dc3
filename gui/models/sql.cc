#include "models/sql.h"

#include <sqlite3.h>

#include "gradscope/common/error.h"

namespace gradscope::gui {

ReadOnlyDatabase::ReadOnlyDatabase(const std::string& path) : path_(path) {
  const int rc = sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string message = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error(path + ": cannot open for reading: " + message);
  }
  // The agent may hold the write lock for a commit of a live trace: wait for it rather than fail.
  sqlite3_busy_timeout(db_, 2000);
}

ReadOnlyDatabase::~ReadOnlyDatabase() {
  sqlite3_close(db_);
}

std::int64_t ReadOnlyDatabase::scalar(const std::string& sql) const {
  Statement statement = prepare(sql);
  return statement.step() ? statement.int64(0) : 0;
}

void ReadOnlyDatabase::interrupt() {
  sqlite3_interrupt(db_);
}

ReadOnlyDatabase::Statement::Statement(sqlite3* db, const std::string& sql) : db_(db), statement_(nullptr) {
  if (sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size()), &statement_, nullptr) != SQLITE_OK) {
    const std::string message = sqlite3_errmsg(db);
    sqlite3_finalize(statement_);
    throw Error("query failed: " + message);
  }
}

ReadOnlyDatabase::Statement::Statement(Statement&& other) noexcept
    : db_(other.db_), statement_(other.statement_) {
  other.statement_ = nullptr;
}

ReadOnlyDatabase::Statement::~Statement() {
  sqlite3_finalize(statement_);
}

void ReadOnlyDatabase::Statement::bind(int index, std::int64_t value) {
  sqlite3_bind_int64(statement_, index, static_cast<sqlite3_int64>(value));
}

void ReadOnlyDatabase::Statement::bind(int index, double value) {
  sqlite3_bind_double(statement_, index, value);
}

bool ReadOnlyDatabase::Statement::step() {
  const int rc = sqlite3_step(statement_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  throw Error(std::string("query failed: ") + sqlite3_errmsg(db_));
}

bool ReadOnlyDatabase::Statement::isNull(int column) const {
  return sqlite3_column_type(statement_, column) == SQLITE_NULL;
}

std::int64_t ReadOnlyDatabase::Statement::int64(int column) const {
  return static_cast<std::int64_t>(sqlite3_column_int64(statement_, column));
}

double ReadOnlyDatabase::Statement::real(int column) const {
  return sqlite3_column_double(statement_, column);
}

std::string ReadOnlyDatabase::Statement::text(int column) const {
  const unsigned char* value = sqlite3_column_text(statement_, column);
  return value != nullptr ? std::string(reinterpret_cast<const char*>(value)) : std::string();
}

}  // namespace gradscope::gui
