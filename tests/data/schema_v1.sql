-- gradscope trace schema v1, frozen: the layout v1 writers created (DESIGN.md's starting layout).
-- Migration tests build old files from this text, so it must never change, whatever storage/ does.
-- Copied from storage/src/schema.cc (kCommonTables + kCallTablesV1) and the names it filled in.
-- Human-readable names of the integer codes stored in other tables (api, dtype, op, backend,
-- nccl_algo, nccl_proto). Codes never change meaning; see common/include/gradscope/common/types.h.
CREATE TABLE names (
  domain TEXT NOT NULL,     -- which column family the code belongs to, e.g. 'api'
  code   INTEGER NOT NULL,  -- the stored value
  name   TEXT NOT NULL,     -- e.g. 'MPI_Allreduce', 'fp32', 'sum'
  PRIMARY KEY (domain, code)
) WITHOUT ROWID;

-- One row per profiled run or benchmark.
CREATE TABLE runs (
  id           INTEGER PRIMARY KEY,  -- file-local run id
  uuid         TEXT NOT NULL UNIQUE, -- identifies the run across its per-rank files
  command      TEXT NOT NULL,        -- command line that was profiled, or the benchmark's
  mode         TEXT NOT NULL,        -- observe | explore | apply | bench | synthetic
  backend      INTEGER NOT NULL,     -- names.domain 'backend': 1 mpi, 2 nccl, 3 local, 0 unknown
  world_size   INTEGER NOT NULL,     -- ranks in the job
  host         TEXT NOT NULL,        -- host of the process that created the run's first file
  config_json  TEXT NOT NULL,        -- gradscope configuration in effect, as JSON
  tool_version TEXT NOT NULL,        -- gradscope version that wrote the run
  epoch_ns     INTEGER NOT NULL,     -- time origin of every *_ns column of this run, in Unix-epoch ns
  start_ns     INTEGER NOT NULL,     -- run start, relative to epoch_ns
  end_ns       INTEGER               -- run end, relative to epoch_ns; NULL while written or if the job died
);

-- One row per rank (process) of a run.
CREATE TABLE ranks (
  id              INTEGER PRIMARY KEY,           -- file-local id; equals rank in single-run files
  run_id          INTEGER NOT NULL REFERENCES runs(id),
  rank            INTEGER NOT NULL,              -- rank in the job's world
  host            TEXT NOT NULL,                 -- host the rank ran on
  pid             INTEGER NOT NULL,              -- process id
  device          TEXT NOT NULL,                 -- 'cpu' or 'cuda:N <device name>'
  clock_offset_ns INTEGER NOT NULL DEFAULT 0,    -- add to this rank's times to align them with rank 0
  UNIQUE (run_id, rank)
);

-- One row per communicator seen on a rank.
CREATE TABLE comms (
  id        INTEGER PRIMARY KEY,                 -- file-local id, referenced by calls.comm_id
  rank_id   INTEGER NOT NULL REFERENCES ranks(id),
  key       TEXT NOT NULL,                       -- equal on every rank of the communicator
  backend   INTEGER NOT NULL,                    -- names.domain 'backend'
  size      INTEGER NOT NULL,                    -- ranks in the communicator
  comm_rank INTEGER NOT NULL,                    -- this rank's index in the communicator
  UNIQUE (rank_id, key)
);

-- One row per strategy timed on an intercepted call (explore) or a benchmark point (bench).
CREATE TABLE measurements (
  id             INTEGER PRIMARY KEY,
  run_id         INTEGER NOT NULL REFERENCES runs(id),
  rank_id        INTEGER REFERENCES ranks(id),  -- rank that measured; NULL when aggregated over ranks
  call_id        INTEGER REFERENCES calls(id),  -- call the strategy was timed on; NULL for benchmarks
  strategy       TEXT NOT NULL,                 -- strategy name, e.g. 'sum/rs_ag/bf16' (DESIGN.md)
  api            INTEGER NOT NULL,              -- names.domain 'api': the collective measured
  dtype          INTEGER NOT NULL,              -- names.domain 'dtype': the job's element type
  bytes          INTEGER NOT NULL,              -- buffer size in bytes
  world          INTEGER NOT NULL,              -- ranks taking part
  reps           INTEGER NOT NULL,              -- timed repetitions (after warm-up)
  min_ns         REAL NOT NULL,                 -- fastest repetition
  median_ns      REAL NOT NULL,
  p90_ns         REAL NOT NULL,
  max_ns         REAL NOT NULL,
  algbw_gbs      REAL NOT NULL,                 -- bytes / median time, decimal GB/s (nccl-tests)
  busbw_gbs      REAL NOT NULL,                 -- algbw times the collective's bus factor
  rel_l2_error   REAL,                          -- ||result - fp64 reference|| / ||reference||; NULL if not checked
  max_abs_error  REAL,                          -- largest element-wise absolute error
  cosine         REAL,                          -- cosine similarity to the reference
  overflow_count INTEGER NOT NULL DEFAULT 0     -- elements that overflowed or became NaN
);
CREATE INDEX measurements_by_strategy ON measurements (strategy, dtype, bytes);

-- Consensus diagnostics: one row per step and rank.
CREATE TABLE consensus (
  id             INTEGER PRIMARY KEY,
  rank_id        INTEGER NOT NULL REFERENCES ranks(id),
  step           INTEGER NOT NULL,  -- training step
  alpha          REAL NOT NULL,     -- AdaCons alpha of this rank
  cosine_to_mean REAL NOT NULL,     -- cosine of this rank's gradient to the mean gradient
  grad_norm      REAL NOT NULL,     -- L2 norm of this rank's gradient
  diversity      REAL NOT NULL      -- gradient diversity of the step: sum ||g_i||^2 / ||sum g_i||^2
);
CREATE INDEX consensus_by_step ON consensus (step, rank_id);

-- Recommendations made from the run.
CREATE TABLE recommendations (
  id         INTEGER PRIMARY KEY,
  run_id     INTEGER REFERENCES runs(id),
  created_ns INTEGER NOT NULL,  -- Unix-epoch ns
  json       TEXT NOT NULL      -- the versioned recommendation file (DESIGN.md)
);

-- Events the agent dropped because its bounded buffers were full.
CREATE TABLE drops (
  rank_id INTEGER NOT NULL REFERENCES ranks(id),
  kind    TEXT NOT NULL,     -- what was dropped: 'call', 'cupti_record', ...
  count   INTEGER NOT NULL,  -- how many
  PRIMARY KEY (rank_id, kind)
) WITHOUT ROWID;
CREATE TABLE calls (
  id            INTEGER PRIMARY KEY,
  rank_id       INTEGER NOT NULL,
  comm_id       INTEGER NOT NULL,
  seq           INTEGER NOT NULL,
  step          INTEGER,
  api           INTEGER NOT NULL,
  dtype         INTEGER NOT NULL,
  op            INTEGER,
  count         INTEGER NOT NULL,
  bytes         INTEGER NOT NULL,
  stream        INTEGER,
  enqueue_ns    INTEGER NOT NULL,
  start_ns      INTEGER NOT NULL,
  end_ns        INTEGER NOT NULL,
  nccl_algo     INTEGER,
  nccl_proto    INTEGER,
  nccl_channels INTEGER
);
CREATE INDEX calls_by_rank_time ON calls (rank_id, start_ns);

INSERT INTO names (domain, code, name) VALUES
  ('api', 1, 'MPI_Allreduce'),
  ('api', 2, 'MPI_Iallreduce'),
  ('api', 3, 'MPI_Reduce'),
  ('api', 4, 'MPI_Reduce_scatter'),
  ('api', 5, 'MPI_Reduce_scatter_block'),
  ('api', 6, 'MPI_Allgather'),
  ('api', 7, 'MPI_Bcast'),
  ('api', 16, 'ncclAllReduce'),
  ('api', 17, 'ncclReduceScatter'),
  ('api', 18, 'ncclAllGather'),
  ('api', 19, 'ncclReduce'),
  ('api', 20, 'ncclBroadcast'),
  ('api', 21, 'ncclGroup'),
  ('backend', 0, 'unknown'),
  ('backend', 1, 'mpi'),
  ('backend', 2, 'nccl'),
  ('backend', 3, 'local'),
  ('dtype', 0, 'int8'),
  ('dtype', 1, 'uint8'),
  ('dtype', 2, 'int32'),
  ('dtype', 3, 'uint32'),
  ('dtype', 4, 'int64'),
  ('dtype', 5, 'uint64'),
  ('dtype', 6, 'fp16'),
  ('dtype', 7, 'fp32'),
  ('dtype', 8, 'fp64'),
  ('dtype', 9, 'bf16'),
  ('dtype', 10, 'fp8e4m3'),
  ('dtype', 11, 'fp8e5m2'),
  ('dtype', 254, 'other'),
  ('nccl_algo', 0, 'Tree'),
  ('nccl_algo', 1, 'Ring'),
  ('nccl_algo', 2, 'CollnetDirect'),
  ('nccl_algo', 3, 'CollnetChain'),
  ('nccl_algo', 4, 'NVLS'),
  ('nccl_algo', 5, 'NVLSTree'),
  ('nccl_algo', 6, 'PAT'),
  ('nccl_proto', 0, 'LL'),
  ('nccl_proto', 1, 'LL128'),
  ('nccl_proto', 2, 'Simple'),
  ('op', 0, 'sum'),
  ('op', 1, 'prod'),
  ('op', 2, 'max'),
  ('op', 3, 'min'),
  ('op', 4, 'avg'),
  ('op', 5, 'premulsum'),
  ('op', 254, 'other');

PRAGMA application_id = 1196639056;  -- 0x47534350, 'GSCP'
PRAGMA user_version = 1;
