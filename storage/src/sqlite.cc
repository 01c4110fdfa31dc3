#include "sqlite.h"

namespace gradscope::storage::sql {

Statement::Statement(Database& db, std::string_view sql, bool persistent) : db_(&db) {
  const int rc = sqlite3_prepare_v3(db.handle(), sql.data(), static_cast<int>(sql.size()),
                                    persistent ? SQLITE_PREPARE_PERSISTENT : 0, &stmt_, nullptr);
  if (rc != SQLITE_OK) db.raise(rc, "prepare");
}

void Statement::check(int rc) const {
  if (rc != SQLITE_OK) db_->raise(rc, "bind");
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  sqlite3_reset(stmt_);
  db_->raise(rc, "query");
}

Database::Database(const std::string& path, int flags) : path_(path) {
  const int rc = sqlite3_open_v2(path.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    close();
    if (rc == SQLITE_CANTOPEN) fail("{}: cannot open ({})", path, message);
    fail("{}: {}", path, message);
  }
  sqlite3_extended_result_codes(db_, 1);
}

void Database::close() {
  if (db_) sqlite3_close_v2(db_);
  db_ = nullptr;
}

void Database::exec(std::string_view sql) {
  std::string text(sql);
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) raise(rc, "statement");
}

std::int64_t Database::queryInt(std::string_view sql) {
  Statement statement(*this, sql);
  return statement.step() ? statement.int64(0) : 0;
}

void Database::raise(int rc, std::string_view what) const {
  const int primary = rc & 0xff;
  const std::string detail = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  switch (primary) {
    case SQLITE_NOTADB: fail("{}: not a gradscope trace (not an SQLite database)", path_);
    case SQLITE_CORRUPT:
      fail("{}: the database is corrupted ({}); re-create it or recover it with 'sqlite3 FILE .recover'",
           path_, detail);
    case SQLITE_FULL: fail("{}: disk full while writing; free space and run again", path_);
    case SQLITE_READONLY: fail("{}: cannot write: the file or its directory is read-only", path_);
    case SQLITE_CANTOPEN: fail("{}: cannot open ({})", path_, detail);
    case SQLITE_IOERR:
      fail("{}: I/O error ({}); the file may be truncated or the disk failing", path_, detail);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      fail("{}: the database is locked by another writer; gradscope allows one writer per file", path_);
    default: fail("{}: SQLite {} failed: {}", path_, what, detail);
  }
}

}  // namespace gradscope::storage::sql
