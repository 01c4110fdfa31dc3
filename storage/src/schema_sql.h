#pragma once

// Internal: the DDL of every schema version and the migrations between them.

#include <string_view>

namespace gradscope::storage::sql {
class Database;
}

namespace gradscope::storage::detail {

// Creates the current schema in an empty database (inside the caller's transaction) and fills `names`.
void createSchema(sql::Database& db);
// Creates schema v1 exactly as v1 writers did: used by migration tests to make old files.
void createSchemaV1(sql::Database& db);
// Upgrades a database at schema version `from` to kSchemaVersion, inside the caller's transaction.
void migrate(sql::Database& db, int from);

}  // namespace gradscope::storage::detail
