#!/usr/bin/env bash
# The Quick start's main command: installs what is missing, builds, produces the trace of a sample
# data-parallel job (4 ranks, one file per rank, as the agent writes them), merges it, prints the
# report and exports a timeline for Perfetto; then times every aggregation strategy on 2 MPI ranks
# (gradscope bench) into build/demo/bench.db.
#
# Until the LD_PRELOAD agent lands, the sample job is synthetic (gradscope-synth); later releases
# profile a real MPI job here end to end and print the recommendation.
#
#   scripts/demo.sh [OUTPUT_DIR]     # default: build/demo
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
out=${1:-build/demo}

scripts/build.sh default
bin=build/default
rm -rf "$out"
mkdir -p "$out"

echo "==> sample job: 4 ranks, 50 steps of a 100 MiB model (synthetic)"
"$bin/tests/support/gradscope-synth" -o "$out/ranks" --ranks 4 --steps 50
echo "==> merging the per-rank traces"
"$bin/cli/gradscope" merge "$out/ranks" -o "$out/run.db"
echo "==> report"
"$bin/cli/gradscope" report "$out/run.db"
echo "==> exporting the timeline"
"$bin/cli/gradscope" export "$out/run.db" --format chrome-trace -o "$out/run.json"
"$bin/cli/gradscope" export "$out/run.db" --format csv -o "$out/run.csv"
if [ -x "$bin/cli/gradscope-bench" ] && command -v mpirun >/dev/null 2>&1; then
  echo "==> every aggregation strategy on 2 MPI ranks, 8 B .. 4 MiB (gradscope bench)"
  # Open MPI refuses root unless told; the demo may run as root in a container.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 2 \
    "$bin/cli/gradscope" bench --backend mpi -b 8 -e 4M -f 32 -n 10 -w 2 --no-progress -o "$out/bench.db"
fi
cat <<MSG

Trace:     $out/run.db (SQLite; try: sqlite3 $out/run.db 'SELECT * FROM call_view LIMIT 5')
Timeline:  $out/run.json (open in Perfetto or chrome://tracing)
CSV:       $out/run.csv
MSG
if [ -f "$out/bench.db" ]; then
  echo "Bench:     $out/bench.db (try: $bin/cli/gradscope export $out/bench.db --format csv --table measurements -o -)"
fi
