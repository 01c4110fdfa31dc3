#pragma once

// Internal: creating the current schema (its tables declared in tables.h) and the migrations from older
// ones. The DDL of older versions is frozen where the migration tests build old files from it:
// tests/data/schema_v1.sql and schema_v2.sql.

#include <string_view>

namespace gradscope::storage::sql {
class Database;
}

namespace gradscope::storage::detail {

// Creates the current schema in an empty database (inside the caller's transaction) and fills `names`.
void createSchema(sql::Database& db);
// Upgrades a database at schema version `from` to kSchemaVersion, inside the caller's transaction.
void migrate(sql::Database& db, int from);

}  // namespace gradscope::storage::detail
