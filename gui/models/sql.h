#pragma once

// A read-only SQLite connection for the viewer's own queries (the paged calls table, applied
// strategies of a window), beside TraceReader. Only opened on a file TraceReader has validated.
// RAII for the connection and every statement; errors are gradscope::Error with SQLite's message.
// Not thread-safe: one per thread, like TraceReader.

#include <cstdint>
#include <string>

struct sqlite3;
struct sqlite3_stmt;

namespace gradscope::gui {

class ReadOnlyDatabase {
 public:
  explicit ReadOnlyDatabase(const std::string& path);
  ReadOnlyDatabase(const ReadOnlyDatabase&) = delete;
  ReadOnlyDatabase& operator=(const ReadOnlyDatabase&) = delete;
  ~ReadOnlyDatabase();

  class Statement {
   public:
    Statement(sqlite3* db, const std::string& sql);
    Statement(Statement&& other) noexcept;
    Statement(const Statement&) = delete;
    Statement& operator=(const Statement&) = delete;
    ~Statement();
    void bind(int index, std::int64_t value);
    void bind(int index, double value);
    bool step();  // true while a row is available
    bool isNull(int column) const;
    std::int64_t int64(int column) const;
    double real(int column) const;
    std::string text(int column) const;
    // For decoders of whole rows (storage::readCall).
    sqlite3_stmt* handle() const { return statement_; }

   private:
    sqlite3* db_;
    sqlite3_stmt* statement_;
  };

  Statement prepare(const std::string& sql) const { return Statement(db_, sql); }
  std::int64_t scalar(const std::string& sql) const;
  // Makes a running query on this connection return early (sqlite3_interrupt); thread-safe.
  void interrupt();

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

}  // namespace gradscope::gui
