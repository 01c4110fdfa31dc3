-- gradscope trace schema v9: the DDL every new file is created with, as storage::schemaSql() generates it
-- from the table declarations (storage/src/tables.h); a test compares the two byte for byte. Once a later
-- version exists, this is the frozen v9 layout, like schema_v1.sql and schema_v2.sql.

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

-- Recommendations made from the run.
CREATE TABLE recommendations (
  id         INTEGER PRIMARY KEY,
  run_id     INTEGER REFERENCES runs(id),
  created_ns INTEGER NOT NULL,  -- Unix-epoch ns
  json       TEXT NOT NULL      -- the versioned recommendation file (DESIGN.md)
);

-- Events the agent could not record: its bounded buffers were full, or recording stopped after an
-- error. What each kind means: storage/include/gradscope/storage/drops.h, gradscope report.
CREATE TABLE drops (
  rank_id INTEGER NOT NULL REFERENCES ranks(id),
  kind    TEXT NOT NULL,     -- what was dropped: 'call', 'cupti_record', ...
  count   INTEGER NOT NULL,  -- how many
  PRIMARY KEY (rank_id, kind)
) WITHOUT ROWID;

-- One row per intercepted collective on a rank. Kept narrow on purpose: the agent writes millions.
-- Columns other than step and op are never NULL; the writer guarantees it (NOT NULL checks cost
-- about 5% of the insert rate).
CREATE TABLE calls (
  id         INTEGER PRIMARY KEY,  -- file-local; increases with insertion, contiguous per rank file
  rank_id    INTEGER,  -- ranks.id of the calling rank
  comm_id    INTEGER,  -- comms.id of the communicator
  seq        INTEGER,  -- per-communicator sequence number: equal on all ranks for one collective
  step       INTEGER,  -- training step; NULL when unknown
  api        INTEGER,  -- names.domain 'api'
  dtype      INTEGER,  -- names.domain 'dtype'
  op         INTEGER,  -- names.domain 'op'; NULL when the API has no reduction
  count      INTEGER,  -- elements, as passed to the API
  bytes      INTEGER,  -- bytes of the send buffer
  enqueue_ns INTEGER,  -- host time of the API call (relative to runs.epoch_ns)
  start_ns   INTEGER,  -- operation start (GPU time for NCCL when known)
  end_ns     INTEGER   -- operation end
);

-- Aggregates of the calls that start in each 2^level-ns tile, per rank and API: the zoomed-out
-- timeline, and the time index of calls (first_id..last_id). Levels: schema.h kTileLevels.
CREATE TABLE call_tiles (
  level    INTEGER NOT NULL,  -- tile width is 2^level ns
  rank_id  INTEGER NOT NULL,  -- ranks.id
  tile     INTEGER NOT NULL,  -- start_ns >> level
  api      INTEGER NOT NULL,  -- names.domain 'api'
  calls    INTEGER NOT NULL,  -- calls starting in the tile
  busy_ns  INTEGER NOT NULL,  -- sum of their durations (may exceed the tile width)
  bytes    INTEGER NOT NULL,  -- sum of their bytes
  max_ns   INTEGER NOT NULL,  -- longest duration among them
  first_id INTEGER NOT NULL,  -- smallest calls.id among them
  last_id  INTEGER NOT NULL,  -- largest calls.id among them
  PRIMARY KEY (level, rank_id, tile, api)
) WITHOUT ROWID;

-- GPU-side facts of calls enqueued on a CUDA stream; absent for host (MPI) calls.
CREATE TABLE gpu_calls (
  call_id  INTEGER PRIMARY KEY REFERENCES calls(id),
  stream   INTEGER NOT NULL,  -- per-rank stream index (0 = unknown)
  algo     INTEGER,           -- names.domain 'nccl_algo'; NULL unknown
  proto    INTEGER,           -- names.domain 'nccl_proto'; NULL unknown
  channels INTEGER,           -- channels NCCL used; NULL unknown
  replay   INTEGER            -- k >= 1: the k-th GPU execution (CUDA graph launch) of the graph-captured
                              -- call with this seq on this communicator, timed on the GPU; NULL for
                              -- every other call
);
CREATE INDEX gpu_calls_replays ON gpu_calls (call_id) WHERE replay IS NOT NULL;

-- Whom a point-to-point call sent to or received from, and how an all-to-all spread its bytes
-- over the peers; absent for other calls. Ranks are ranks in the call's communicator.
CREATE TABLE peer_calls (
  call_id        INTEGER PRIMARY KEY REFERENCES calls(id),
  dest           INTEGER,           -- rank sent to; NULL when nothing was sent
  send_tag       INTEGER,           -- the send's tag; NULL for NCCL
  source         INTEGER,           -- rank received from (MPI_ANY_SOURCE: the matched one)
  recv_tag       INTEGER,           -- the received message's tag (MPI_ANY_TAG: the matched one)
  recv_bytes     INTEGER,           -- bytes received; NULL when nothing was received
  peer_max_bytes INTEGER,           -- all-to-all: most bytes sent to one peer
  peer_min_bytes INTEGER            -- all-to-all: fewest bytes sent to one peer
);

-- Consensus diagnostics: one row per rank and explored reduction (call_id), grouped by step.
CREATE TABLE consensus (
  id             INTEGER PRIMARY KEY,
  rank_id        INTEGER NOT NULL REFERENCES ranks(id),
  step           INTEGER NOT NULL,  -- training step; -1 when unknown (merge takes call_id's step)
  alpha          REAL NOT NULL,     -- AdaCons alpha of this rank
  cosine_to_mean REAL NOT NULL,     -- cosine of this rank's gradient to the mean gradient
  grad_norm      REAL NOT NULL,     -- L2 norm of this rank's gradient
  diversity      REAL NOT NULL,     -- gradient diversity of the step: sum ||g_i||^2 / ||sum g_i||^2
  call_id        INTEGER REFERENCES calls(id)  -- explored call whose buffer it was computed on; NULL: v2 row
);
CREATE INDEX consensus_by_step ON consensus (step, rank_id);

-- Calls that apply mode replaced with a recommended strategy, and which. A call without a row ran as the
-- job issued it.
CREATE TABLE applied_calls (
  call_id  INTEGER PRIMARY KEY REFERENCES calls(id),
  strategy TEXT NOT NULL  -- strategy that ran instead, e.g. 'sum/rs_ag/bf16' (DESIGN.md)
);

-- Where each rank's training step went (derived at merge from the calls; docs/schema.md):
-- compute_ns + exposed_ns = end_ns - start_ns, waiting_ns is part of exposed_ns.
CREATE TABLE steps (
  rank_id    INTEGER NOT NULL REFERENCES ranks(id),
  step       INTEGER NOT NULL,  -- calls.step
  start_ns   INTEGER NOT NULL,  -- posting of the step's first call
  end_ns     INTEGER NOT NULL,  -- posting of the next step's first call (the last step: its last end)
  compute_ns INTEGER NOT NULL,  -- time not blocked in communication
  exposed_ns INTEGER NOT NULL,  -- time blocked in a communication call or a wait
  waiting_ns INTEGER NOT NULL,  -- of exposed_ns: before the last rank arrived (or the sender posted)
  hidden_ns  INTEGER NOT NULL,  -- nonblocking communication in flight while not blocked
  caused_ns  INTEGER NOT NULL,  -- other ranks' waiting in calls this rank arrived at last
  calls      INTEGER NOT NULL,  -- calls posted in the step
  basis      INTEGER NOT NULL,  -- 0 host calls; 1 GPU kernels (a sampled window); 2 GPU, not sampled:
                                -- span and calls only, the breakdown columns 0
  idle_ns    INTEGER NOT NULL,  -- basis 1: of compute_ns, the GPU ran no kernel; else 0
  PRIMARY KEY (rank_id, step)
) WITHOUT ROWID;

-- GPU kernels inside the agent's sampled windows (CUPTI), as intervals per kind; merge derives
-- the GPU steps' breakdown from them (docs/schema.md, "GPU steps").
CREATE TABLE gpu_activity (
  rank_id    INTEGER NOT NULL REFERENCES ranks(id),
  kind       INTEGER NOT NULL,  -- 0 a window; 1 compute kernels; 2 NCCL kernels
  start_ns   INTEGER NOT NULL,  -- GPU time
  end_ns     INTEGER NOT NULL,  -- GPU time
  kernels    INTEGER NOT NULL,  -- kernels merged into the interval (they overlap or touch); 0: a
                                -- window
  nvtx_range TEXT               -- compute kernels: the job's innermost NVTX range on the thread that
                                -- launched them; NULL: none, or not a compute row
);
CREATE INDEX gpu_activity_by_rank ON gpu_activity (rank_id, start_ns);

-- What a faster transport could take off the step, per kind of MPI collective (derived at
-- merge from the calls with the steps; docs/schema.md, "Steps").
CREATE TABLE exposure (
  api          INTEGER NOT NULL,  -- names.domain 'api'
  dtype        INTEGER NOT NULL,  -- names.domain 'dtype'
  bytes        INTEGER NOT NULL,  -- calls.bytes
  calls        INTEGER NOT NULL,  -- calls of this kind, over every rank
  transport_ns REAL NOT NULL,     -- mean time from the last rank's arrival to the call's end
  exposed_ns   REAL NOT NULL,     -- mean part of transport_ns the rank spent blocked
  PRIMARY KEY (api, dtype, bytes)
) WITHOUT ROWID;

-- The calls of each step by API and size class, over every rank (derived at merge with the
-- steps; docs/schema.md, "Derived at merge").
CREATE TABLE step_calls (
  step       INTEGER NOT NULL,  -- calls.step
  api        INTEGER NOT NULL,  -- names.domain 'api'
  size_class INTEGER NOT NULL,  -- floor(log2(bytes)): calls of 2^k up to 2^(k+1) bytes; -1: 0 bytes
  calls      INTEGER NOT NULL,  -- calls of the class in the step
  total_ns   INTEGER NOT NULL,  -- their end_ns - start_ns, summed
  PRIMARY KEY (step, api, size_class)
) WITHOUT ROWID;

-- The reductions of the trace by kind, over every rank, leaving out those on communicators of
-- one rank (derived at merge; docs/schema.md, "Derived at merge").
CREATE TABLE reduction_sizes (
  api   INTEGER NOT NULL,  -- names.domain 'api'
  dtype INTEGER NOT NULL,  -- names.domain 'dtype'
  op    INTEGER NOT NULL,  -- names.domain 'op'
  bytes INTEGER NOT NULL,  -- calls.bytes
  calls INTEGER NOT NULL,  -- calls of this kind
  PRIMARY KEY (api, dtype, op, bytes)
) WITHOUT ROWID;

-- One row, written by merge with reduction_sizes (a file without it has its reductions
-- counted from the calls).
CREATE TABLE reduction_totals (
  steps             INTEGER NOT NULL,  -- distinct known steps of those reductions; 0: none known
  ranks             INTEGER NOT NULL,  -- distinct ranks that issued them
  single_rank_calls INTEGER NOT NULL   -- reductions left out: on communicators of one rank
);

-- Calls with names instead of codes, for people querying with the sqlite3 shell; `strategy` is what
-- apply mode ran instead of the call, NULL when the call ran as the job issued it; `replay` numbers the
-- GPU executions of a graph-captured call; dest and source are the peers of point-to-point calls (ranks in
-- the communicator), peer_max_bytes and peer_min_bytes an all-to-all's spread over its peers.
CREATE VIEW call_view AS
SELECT c.id, r.run_id, r.rank, r.host, m.key AS comm, c.seq, c.step,
       na.name AS api, nd.name AS dtype, no.name AS op, c.count, c.bytes,
       c.enqueue_ns, c.start_ns, c.end_ns, c.end_ns - c.start_ns AS dur_ns,
       g.stream, ng.name AS algo, np.name AS proto, g.channels, a.strategy, g.replay,
       p.dest, p.send_tag, p.source, p.recv_tag, p.recv_bytes, p.peer_max_bytes, p.peer_min_bytes
FROM calls c
JOIN ranks r ON r.id = c.rank_id
LEFT JOIN comms m ON m.id = c.comm_id
LEFT JOIN names na ON na.domain = 'api' AND na.code = c.api
LEFT JOIN names nd ON nd.domain = 'dtype' AND nd.code = c.dtype
LEFT JOIN names no ON no.domain = 'op' AND no.code = c.op
LEFT JOIN gpu_calls g ON g.call_id = c.id
LEFT JOIN names ng ON ng.domain = 'nccl_algo' AND ng.code = g.algo
LEFT JOIN names np ON np.domain = 'nccl_proto' AND np.code = g.proto
LEFT JOIN applied_calls a ON a.call_id = c.id
LEFT JOIN peer_calls p ON p.call_id = c.id;
