#pragma once

// Whole calls for readers that query them with SQL of their own (the viewer's sorted, paged calls table):
// the columns that make a CallRecord and their decoder, generated from the same table declarations as
// TraceReader's (storage/src/tables.h), so such a query reads every column the store has.
//
//   SELECT <callColumns()>, <more> FROM <kCallsFrom> [more joins] WHERE ...
//
// and readCall(statement, 0) per row; <more> starts at column callColumnCount().

#include <string>
#include <string_view>

#include "gradscope/storage/records.h"

struct sqlite3_stmt;

namespace gradscope::storage {

// `calls` as `c` with its GPU facts as `g` and its peers as `p` (a call without any reads their unknown
// values).
inline constexpr std::string_view kCallsFrom =
    "calls c LEFT JOIN gpu_calls g ON g.call_id = c.id LEFT JOIN peer_calls p ON p.call_id = c.id";

// The select list, e.g. "c.id, c.rank_id, ..., coalesce(c.step, -1), ...". A column whose member has an
// "unknown" value (CallRecord::step -1, op ReduceOp::None, the NCCL facts) is selected as
// coalesce(column, that value): the expressions sort and compare as the members do.
const std::string& callColumns();
int callColumnCount();
// The expression callColumns() selects `name` (a column of calls, gpu_calls or peer_calls) as; throws
// gradscope::Error for a name that is neither.
std::string callColumn(std::string_view name);

// Decodes columns first .. first + callColumnCount() - 1 of the statement's current row.
CallRecord readCall(sqlite3_stmt* row, int first = 0);

}  // namespace gradscope::storage
