#pragma once

// A table of the trace store declared once: its columns in file order, each with its SQL name, type and
// constraints, comment, and the record member it stores (tables.h declares every table). From that one
// declaration come the table's DDL with the comments `sqlite3 FILE .schema` shows, the writer's INSERT and
// its binds, and the readers' SELECT lists and their decoders, so that a column is added in one place and
// never read at a position typed by hand (as perfetto's src/trace_processor/tables/*.py, in C++).
//
// Binds and decoders are folds over the column list, unrolled at compile time: the writer's insert loop
// binds exactly what it bound when written out by hand, with no lookup or indirect call per column.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "sqlite.h"

namespace gradscope::storage::detail {

// How a member is stored. Plain: integers and enums (their code) as INTEGER, double as REAL, strings as
// TEXT; an unset std::optional as NULL.
struct Plain {};
// An integer or enum member whose value `Unknown` (for an integer, anything below it too) means "not
// known": stored as NULL, read back as Unknown. Selected as coalesce(column, Unknown), so the selected
// expression also sorts and compares as the member does.
template <auto Unknown>
struct NullWhen {
  static constexpr auto unknown = Unknown;
};

// A column's declaration. A key column is the row's file-local id, which the writer assigns (or leaves
// to SQLite): inserts and selects that take Part::Values leave it out, and it is always first.
template <auto Member, typename Codec, bool Key>
struct Column {
  using member_pointer = decltype(Member);
  using codec = Codec;
  static constexpr auto member = Member;
  static constexpr bool key = Key;
  std::string_view name;
  std::string_view type;     // SQL type and column constraints
  std::string_view comment;  // '\n' separates lines; empty: none
};

template <auto Member, typename Codec = Plain>
constexpr Column<Member, Codec, false> column(std::string_view name, std::string_view type,
                                              std::string_view comment = {}) {
  return {name, type, comment};
}
template <auto Member>
constexpr Column<Member, Plain, true> key(std::string_view name, std::string_view type,
                                          std::string_view comment = {}) {
  return {name, type, comment};
}

// What the DDL says besides the columns.
struct TableLayout {
  std::string_view name = {};
  std::string_view about = {};  // the comment above CREATE TABLE; '\n' separates lines
  // Where column comments start, counted from the start of the column's type; a longer type has its
  // comment two spaces after it. Chosen per table when its text was first written, and kept: files store
  // the text, and a migrated file must store the same text as a new one.
  int comment_at = 0;
  std::string_view constraint = {};  // table constraint after the columns, e.g. "PRIMARY KEY (domain, code)"
  bool without_rowid = false;
  std::string_view indexes = {};  // CREATE INDEX statements that follow the table, as SQL
};

struct ColumnText {
  std::string_view name, type, comment;
  std::string select;  // the expression a SELECT reads it as
};

// The text generators behind Table (table.cc).
std::string tableDdl(const TableLayout& layout, std::span<const ColumnText> columns);
std::string insertSql(std::string_view verb, std::string_view table, std::span<const ColumnText> columns,
                      int rows);
std::string selectList(std::span<const ColumnText> columns);

template <typename T>
inline constexpr bool kIsOptional = false;
template <typename T>
inline constexpr bool kIsOptional<std::optional<T>> = true;

enum class Part {
  All,     // every column
  Values,  // every column but the key
};

template <typename Record, typename... Columns>
class Table {
 public:
  using record_type = Record;

  constexpr Table(TableLayout layout, Columns... columns) : layout_(layout), columns_(columns...) {}

  constexpr std::string_view name() const { return layout_.name; }

  template <Part P = Part::All>
  static constexpr int count() {
    return static_cast<int>(sizeof...(Columns)) - (P == Part::Values ? kKeys : 0);
  }

  // CREATE TABLE with its comments, then its indexes; starts with an empty line.
  std::string ddl() const { return tableDdl(layout_, columnText()); }

  // `verb` INTO table (columns) VALUES (?, ...) for `rows` rows at once; an upsert appends its ON CONFLICT
  // clause.
  template <Part P = Part::All>
  std::string insertSql(int rows = 1, std::string_view verb = "INSERT") const {
    return detail::insertSql(verb, layout_.name, columnText<P>(), rows);
  }

  // The columns as a SELECT reads them, each qualified with `alias` when given.
  template <Part P = Part::All>
  std::string selectList(std::string_view alias = {}) const {
    return detail::selectList(columnText<P>(alias));
  }

  // The columns' text, each select expression qualified with `alias` when given.
  template <Part P = Part::All>
  std::vector<ColumnText> columnText(std::string_view alias = {}) const {
    std::vector<ColumnText> out;
    out.reserve(sizeof...(Columns));
    forEach<P>([&](const auto& column) {
      using C = std::remove_cvref_t<decltype(column)>;
      std::string select(column.name);
      if (!alias.empty()) select = std::string(alias) + "." + select;
      if constexpr (requires { C::codec::unknown; })
        select =
            "coalesce(" + select + ", " + std::to_string(static_cast<std::int64_t>(C::codec::unknown)) + ")";
      out.push_back({column.name, column.type, column.comment, std::move(select)});
    });
    return out;
  }

  // Binds the record's columns to parameters first, first + 1, ... of an insertSql<P>().
  template <Part P = Part::All>
  void bind(sql::Statement& statement, int first, const Record& record) const {
    int index = first;
    forEach<P>([&](const auto& column) {
      using C = std::remove_cvref_t<decltype(column)>;
      bindValue<typename C::codec>(statement, index++, record.*C::member);
    });
  }

  // Decodes columns first, first + 1, ... of the current row of a selectList<P>() into `record`.
  template <Part P = Part::All>
  void read(sqlite3_stmt* row, int first, Record& record) const {
    int index = first;
    forEach<P>([&](const auto& column) {
      using C = std::remove_cvref_t<decltype(column)>;
      readValue(row, index++, record.*C::member);
    });
  }

 private:
  static constexpr int kKeys = (0 + ... + (Columns::key ? 1 : 0));
  static_assert(kKeys <= 1, "a table has at most one key column");
  static_assert(kKeys == 0 || std::tuple_element_t<0, std::tuple<Columns...>>::key,
                "the key column comes first");

  template <Part P, typename Visit>
  void forEach(Visit&& visit) const {
    std::apply([&](const auto&... column) { (visitOne<P>(column, visit), ...); }, columns_);
  }
  template <Part P, typename C, typename Visit>
  static void visitOne(const C& column, Visit& visit) {
    if constexpr (P == Part::All || !C::key) visit(column);
  }

  template <typename Codec, typename T>
  static void bindValue(sql::Statement& statement, int index, const T& value) {
    if constexpr (kIsOptional<T>) {
      if (value) bindValue<Codec>(statement, index, *value);
      else statement.bindNullFast(index);
    } else if constexpr (requires { Codec::unknown; }) {
      constexpr auto unknown = static_cast<T>(Codec::unknown);
      bool is_unknown = false;
      if constexpr (std::is_enum_v<T>) is_unknown = value == unknown;
      else is_unknown = value <= unknown;
      if (is_unknown) statement.bindNullFast(index);
      else statement.bindFast(index, static_cast<std::int64_t>(value));
    } else if constexpr (std::is_enum_v<T> || std::is_integral_v<T>) {
      statement.bindFast(index, static_cast<std::int64_t>(value));
    } else if constexpr (std::is_floating_point_v<T>) {
      statement.bind(index, static_cast<double>(value));
    } else {
      statement.bind(index, std::string_view(value));
    }
  }

  template <typename T>
  static void readValue(sqlite3_stmt* row, int index, T& out) {
    if constexpr (kIsOptional<T>) {
      if (sqlite3_column_type(row, index) == SQLITE_NULL) {
        out.reset();
      } else {
        typename T::value_type value{};
        readValue(row, index, value);
        out = value;
      }
    } else if constexpr (std::is_enum_v<T> || std::is_integral_v<T>) {
      out = static_cast<T>(sqlite3_column_int64(row, index));
    } else if constexpr (std::is_floating_point_v<T>) {
      out = sqlite3_column_double(row, index);
    } else {
      const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(row, index));
      out = text ? T(text, static_cast<std::size_t>(sqlite3_column_bytes(row, index))) : T();
    }
  }

  TableLayout layout_;
  std::tuple<Columns...> columns_;
};

// The record type a column's member pointer belongs to.
template <typename MemberPointer>
struct RecordOf;
template <typename Record, typename T>
struct RecordOf<T Record::*> {
  using type = Record;
};

// table(layout, columns...): the record type is the one every column's member belongs to.
template <typename First, typename... Rest>
constexpr auto table(TableLayout layout, First first, Rest... rest) {
  using Record = typename RecordOf<typename First::member_pointer>::type;
  static_assert((std::is_same_v<Record, typename RecordOf<typename Rest::member_pointer>::type> && ...),
                "every column of a table stores a member of the same record");
  return Table<Record, First, Rest...>(layout, first, rest...);
}

}  // namespace gradscope::storage::detail
