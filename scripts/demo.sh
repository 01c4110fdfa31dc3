#!/usr/bin/env bash
# The Quick start's main command: installs what is missing, builds, profiles a real data-parallel MPI
# job (samples/mpi_train, 2 ranks) with `gradscope run --mode explore` — the LD_PRELOAD agent records
# every gradient all-reduce and, within 10% of the run, times every aggregation strategy on copies of
# the job's own gradient buffers; gradscope merges the per-rank traces and prints the summary — exports
# its timeline for Perfetto, times every strategy over a sweep of sizes on 2 MPI ranks (gradscope
# bench) into build/demo/bench.db, and prints the recommendation for the job (gradscope recommend).
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

# Open MPI refuses root unless told; the demo may run as root in a container.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# 1500 steps with 2 ms of sleep standing for each step's compute: about 4 s, enough for explore mode's
# 10% budget to pay for its first exploration's one-off setup and to explore every size a few times.
echo "==> profiling a sample job: 2 MPI ranks training an MLP for 1500 steps, under gradscope run --mode explore"
"$bin/cli/gradscope" run -o "$out/run" --mode explore -- \
  mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 2 \
  "$bin/samples/mpi_train/gradscope-sample-mpi-train" --steps 1500 --sleep-ms 2 --print-every 500
echo "==> exporting the timeline"
"$bin/cli/gradscope" export "$out/run/trace.db" --format chrome-trace -o "$out/run.json"
"$bin/cli/gradscope" export "$out/run/trace.db" --format csv -o "$out/run.csv"
if [ -x "$bin/cli/gradscope-bench" ] && command -v mpirun >/dev/null 2>&1; then
  echo "==> every aggregation strategy on 2 MPI ranks, 8 B .. 4 MiB (gradscope bench)"
  mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 2 \
    "$bin/cli/gradscope" bench --backend mpi -b 8 -e 4M -f 32 -n 10 -w 2 --no-progress -o "$out/bench.db"
fi
# The job's own calls are the workload; the strategies explore mode timed on them and the benchmark's
# sweep are the measurements.
echo "==> the recommendation for this job (gradscope recommend)"
inputs=("$out/run/trace.db")
[ -f "$out/bench.db" ] && inputs+=("$out/bench.db")
recommendation="none: gradscope recommend could not make one (its message is above)"
if "$bin/cli/gradscope" recommend "${inputs[@]}" &&
   "$bin/cli/gradscope" recommend "${inputs[@]}" --format json --no-store -o "$out/recommendation.json"; then
  recommendation="$out/recommendation.json (apply it: $bin/cli/gradscope run --mode apply --recommendation
           $out/recommendation.json -- mpirun ...; other formats: gradscope recommend --format env|ddp|horovod|...)"
fi
if [ -x "$bin/gui/gradscope-gui" ]; then
  gui="$bin/gui/gradscope-gui $out/run/trace.db (the Qt viewer, docs/gui.md)"
else
  gui="not built here (it needs Qt 6: qt6-base-dev qt6-charts-dev; docs/gui.md)"
fi
cat <<MSG

Trace:     $out/run/trace.db (SQLite; try: $bin/cli/gradscope report $out/run/trace.db,
           or sqlite3 $out/run/trace.db 'SELECT * FROM call_view LIMIT 5')
GUI:       $gui
Recommend: $recommendation
Timeline:  $out/run.json (open in Perfetto or chrome://tracing)
CSV:       $out/run.csv
MSG
if [ -f "$out/bench.db" ]; then
  echo "Bench:     $out/bench.db (try: $bin/cli/gradscope export $out/bench.db --format csv --table measurements -o -)"
fi
