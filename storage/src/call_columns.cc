#include "gradscope/storage/call_columns.h"

#include "gradscope/common/error.h"
#include "tables.h"

namespace gradscope::storage {

const std::string& callColumns() {
  static const std::string columns = detail::kCalls.selectList("c") + ", " +
                                     detail::kGpuCalls.selectList<detail::Part::Values>("g") + ", " +
                                     detail::kPeerCalls.selectList<detail::Part::Values>("p");
  return columns;
}

int callColumnCount() {
  return detail::kCalls.count() + detail::kGpuCalls.count<detail::Part::Values>() +
         detail::kPeerCalls.count<detail::Part::Values>();
}

std::string callColumn(std::string_view name) {
  for (const detail::ColumnText& column : detail::kCalls.columnText("c"))
    if (column.name == name) return column.select;
  for (const detail::ColumnText& column : detail::kGpuCalls.columnText<detail::Part::Values>("g"))
    if (column.name == name) return column.select;
  for (const detail::ColumnText& column : detail::kPeerCalls.columnText<detail::Part::Values>("p"))
    if (column.name == name) return column.select;
  fail("no column '{}' in calls, gpu_calls or peer_calls", name);
}

CallRecord readCall(sqlite3_stmt* row, int first) {
  CallRecord call;
  detail::kCalls.read(row, first, call);
  const int gpu_first = first + detail::kCalls.count();
  detail::kGpuCalls.read<detail::Part::Values>(row, gpu_first, call);
  detail::kPeerCalls.read<detail::Part::Values>(
      row, gpu_first + detail::kGpuCalls.count<detail::Part::Values>(), call);
  return call;
}

}  // namespace gradscope::storage
