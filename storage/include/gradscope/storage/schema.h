#pragma once

// The trace-store file format: an SQLite database whose PRAGMA application_id marks it as gradscope's
// and whose PRAGMA user_version is the schema version below. The DDL with a comment on every column is
// generated from the table declarations (storage/src/tables.h) and stored in the file itself
// (`sqlite3 FILE .schema` shows it).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace gradscope::storage {

// "GSCP" in ASCII.
inline constexpr std::int32_t kApplicationId = 0x47534350;
// History: v1 = DESIGN.md's starting layout (GPU columns inline in calls, a (rank, start) index);
// v2 = GPU facts moved to gpu_calls and the index replaced by call_tiles; v3 = consensus.call_id and
// applied_calls, for the agent's explore and apply modes; v4 = gpu_calls.replay, the GPU executions of
// graph-captured calls; v5 = peer_calls, the peers of point-to-point calls and the spread of all-to-alls
// (see docs/schema.md); v6 = steps, where each rank's step went (the step model, written by merge);
// v7 = gpu_activity, the GPU kernels of the agent's sampled windows, and steps.basis/idle_ns, GPU steps;
// v8 = exposure, the step model's exposure per kind of collective, written by merge with the steps;
// v9 = step_calls, the calls' time per step and kind, written with the steps, and reduction_sizes and
// reduction_totals, the workload the tuner weighs: what check and recommend read instead of every call.
inline constexpr int kSchemaVersion = 9;
inline constexpr int kOldestMigratableVersion = 1;

// Tile levels of call_tiles: a level-L tile spans 2^L ns (4.2 ms up to 4.6 minutes, a factor 16 apart).
// The finest level bounds the cost: every tile row is an upsert at commit, and 1 ms tiles on a busy
// rank cost a fifth of the ingest rate (bench/storage_bench); below 4 ms the calls themselves are read.
inline constexpr int kTileLevels[] = {22, 26, 30, 34, 38};

// Tables of the current schema, in creation order.
std::span<const std::string_view> tableNames();

// The DDL a new file is created with: every table with its comments and indexes, then the call_view
// view. Files store it as it is, so it changes only with kSchemaVersion (tests/data/schema_v6.sql).
std::string schemaSql();

}  // namespace gradscope::storage
