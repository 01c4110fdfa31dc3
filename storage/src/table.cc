#include "table.h"

#include <algorithm>

namespace gradscope::storage::detail {
namespace {

// Calls `line` with each '\n'-separated line of `text`.
template <typename Line>
void forEachLine(std::string_view text, Line&& line) {
  while (true) {
    const std::size_t end = text.find('\n');
    line(text.substr(0, end));
    if (end == std::string_view::npos) return;
    text.remove_prefix(end + 1);
  }
}

}  // namespace

// The layout of every table's text: names padded to the longest, one space, the type (with a comma
// unless it ends the table); comments at layout.comment_at, continuation lines under the first.
std::string tableDdl(const TableLayout& layout, std::span<const ColumnText> columns) {
  std::size_t name_width = 0;
  for (const ColumnText& column : columns) name_width = std::max(name_width, column.name.size());
  const auto comment_at = static_cast<std::size_t>(layout.comment_at);
  std::string out = "\n";
  if (!layout.about.empty())
    forEachLine(layout.about, [&](std::string_view line) { out.append("-- ").append(line).append("\n"); });
  out.append("CREATE TABLE ").append(layout.name).append(" (\n");
  for (std::size_t i = 0; i < columns.size(); ++i) {
    const ColumnText& column = columns[i];
    std::string definition(column.type);
    if (i + 1 < columns.size() || !layout.constraint.empty()) definition += ',';
    out.append("  ").append(column.name).append(name_width - column.name.size() + 1, ' ').append(definition);
    if (!column.comment.empty()) {
      const std::size_t gap = definition.size() < comment_at ? comment_at - definition.size() : 2;
      const std::string indent(2 + name_width + 1 + comment_at, ' ');
      bool first = true;
      forEachLine(column.comment, [&](std::string_view line) {
        if (first) out.append(gap, ' ');
        else out.append("\n").append(indent);
        out.append("-- ").append(line);
        first = false;
      });
    }
    out += '\n';
  }
  if (!layout.constraint.empty()) out.append("  ").append(layout.constraint).append("\n");
  out.append(layout.without_rowid ? ") WITHOUT ROWID;\n" : ");\n");
  if (!layout.indexes.empty()) out.append(layout.indexes).append("\n");
  return out;
}

std::string insertSql(std::string_view verb, std::string_view table, std::span<const ColumnText> columns,
                      int rows) {
  std::string names, row = "(";
  for (const ColumnText& column : columns) {
    if (!names.empty()) names += ", ", row += ',';
    names += column.name;
    row += '?';
  }
  row += ')';
  std::string out = std::string(verb) + " INTO " + std::string(table) + " (" + names + ") VALUES ";
  for (int r = 0; r < rows; ++r) out.append(r == 0 ? "" : ",").append(row);
  return out;
}

std::string selectList(std::span<const ColumnText> columns) {
  std::string out;
  for (const ColumnText& column : columns) {
    if (!out.empty()) out += ", ";
    out += column.select;
  }
  return out;
}

}  // namespace gradscope::storage::detail
