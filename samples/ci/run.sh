#!/usr/bin/env bash
# gradscope in CI, runnable locally with one command: benchmark every aggregation strategy on this
# machine, make a recommendation from the results, and check them against a stored baseline.
#
#   samples/ci/run.sh [BUILD_DIR] [OUT_DIR]      # default: build/default, build/ci-sample
#
# Steps (each output lands in OUT_DIR):
#   1. current.db      gradscope bench over MPI (2 ranks, 8 B .. 1 MiB), the measurements of this run
#   2. recommendation  gradscope recommend current.db: recommendation.json (the file apply mode and the
#                      NCCL tuner plugin read) and recommendation.md for the job page
#   3. check           gradscope check --baseline BASELINE current.db: exit 1 on a regression beyond noise
#                      and tolerance; summary.md (markdown for CI job pages) and check.json
# The baseline is GRADSCOPE_CI_BASELINE (default OUT_DIR/baseline.db). When it does not exist yet the run
# becomes the baseline and the check is skipped (say so, exit 0): commit or cache it, as the workflow in
# github-workflow.yml does. GRADSCOPE_CI_TOLERANCE (default 5%) is check's --tolerance;
# GRADSCOPE_CI_STRATEGIES (default: every applicable one) is bench's --strategies.
# $GITHUB_STEP_SUMMARY, when set, receives the summary too. Exits with gradscope check's status.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$repo_root/build/default}
out=${2:-$repo_root/build/ci-sample}
gradscope=$build/cli/gradscope
baseline=${GRADSCOPE_CI_BASELINE:-$out/baseline.db}
tolerance=${GRADSCOPE_CI_TOLERANCE:-5%}

if [ ! -x "$gradscope" ]; then
  echo "samples/ci: no gradscope at $gradscope; build first (scripts/build.sh default) or pass BUILD_DIR" >&2
  exit 2
fi
mkdir -p "$out"
rm -f "$out/current.db" "$out/summary.md" "$out/check.json" "$out/recommendation.json" "$out/recommendation.md"

# Open MPI refuses root unless told; CI containers often run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "==> 1. benchmarking every strategy on 2 MPI ranks (gradscope bench)"
strategies=()
if [ -n "${GRADSCOPE_CI_STRATEGIES:-}" ]; then strategies=(--strategies "$GRADSCOPE_CI_STRATEGIES"); fi
mpirun --oversubscribe -np 2 "$gradscope" bench --backend mpi -b 8 -e 1M -f 4 -n 20 -w 5 --no-progress \
  "${strategies[@]}" -o "$out/current.db" > "$out/bench.txt"

echo "==> 2. recommending (gradscope recommend)"
"$gradscope" recommend "$out/current.db" --format json -o "$out/recommendation.json" --no-store
"$gradscope" recommend "$out/current.db" --format markdown -o "$out/recommendation.md" --no-store

if [ ! -f "$baseline" ]; then
  cp "$out/current.db" "$baseline"
  echo "==> 3. no baseline yet: this run is the baseline now ($baseline); the next run is checked against it"
  exit 0
fi

echo "==> 3. checking against the baseline $baseline (gradscope check, tolerance $tolerance)"
status=0
"$gradscope" check --baseline "$baseline" "$out/current.db" --tolerance "$tolerance" \
  --summary "$out/summary.md" --json "$out/check.json" || status=$?
cat "$out/recommendation.md" >> "$out/summary.md"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then cat "$out/summary.md" >> "$GITHUB_STEP_SUMMARY"; fi
echo "Summary: $out/summary.md   Result: $out/check.json   Recommendation: $out/recommendation.json"
exit $status
