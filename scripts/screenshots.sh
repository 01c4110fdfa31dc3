#!/usr/bin/env bash
# Renders every view of gradscope-gui to docs/screenshots/<view>.png (1400 × 900, offscreen), from a real
# trace: the MPI sample job profiled under `gradscope run --mode explore`, as scripts/demo.sh does, run
# twice so that the Runs view compares two real runs. Builds nothing: give it a build directory that has
# gradscope, the agent, the MPI sample and gradscope-gui (the default and ci presets do).
#
#   scripts/screenshots.sh BUILD_DIR [TRACE [BASELINE]] [-o OUT_DIR]
#
# With TRACE (and BASELINE for the Runs view) given, no job is run.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$repo_root/docs/screenshots"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ ${#args[@]} -lt 1 ]; then
  echo "usage: scripts/screenshots.sh BUILD_DIR [TRACE [BASELINE]] [-o OUT_DIR]" >&2
  exit 2
fi
build=$(cd "${args[0]}" && pwd)
trace=${args[1]:-}
baseline=${args[2]:-}
gui="$build/gui/gradscope-gui"
if [ ! -x "$gui" ]; then
  echo "screenshots.sh: $gui is missing; build it first (ninja -C $build gradscope-gui)" >&2
  exit 2
fi

if [ -z "$trace" ]; then
  gradscope="$build/cli/gradscope"
  sample="$build/samples/mpi_train/gradscope-sample-mpi-train"
  for tool in "$gradscope" "$sample" "$build/agent/libgradscope-agent.so"; do
    if [ ! -e "$tool" ]; then
      echo "screenshots.sh: $tool is missing; build gradscope, gradscope_agent, gradscope_agent_mpi and gradscope-sample-mpi-train, or pass a TRACE" >&2
      exit 2
    fi
  done
  data="$build/screenshots-data"
  rm -rf "$data"
  mkdir -p "$data"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Two runs of the demo's job (2 ranks, an MLP, explore mode): the second is the one shown, the first
  # its baseline in the Runs view.
  for run in baseline current; do
    echo "==> profiling the MPI sample job ($run run)"
    "$gradscope" run -o "$data/$run" --mode explore -- \
      mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 2 \
      "$sample" --steps 1500 --sleep-ms 2 --print-every 500
  done
  trace="$data/current/trace.db"
  baseline="$data/baseline/trace.db"
fi

mkdir -p "$out"
compare=()
[ -n "$baseline" ] && compare=(--compare "$baseline")
echo "==> rendering every view of $trace into $out"
QT_QPA_PLATFORM=offscreen QT_LOGGING_RULES='qt.qpa.*=false' XDG_CONFIG_HOME="$build/screenshots-config" \
  "$gui" --screenshots "$out" --size 1400x900 "${compare[@]}" "$trace"
