#!/usr/bin/env bash
# The Quick start's main command: installs what is missing, builds, produces the trace of a sample
# data-parallel job (4 ranks, one file per rank, as the agent writes them), merges it, prints the
# report and exports a timeline for Perfetto.
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
cat <<MSG

Trace:     $out/run.db (SQLite; try: sqlite3 $out/run.db 'SELECT * FROM call_view LIMIT 5')
Timeline:  $out/run.json (open in Perfetto or chrome://tracing)
CSV:       $out/run.csv
MSG
