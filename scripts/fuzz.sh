#!/usr/bin/env bash
# Runs the libFuzzer targets of the fuzz preset (tests/fuzz/, docs/reliability.md) for a while each.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   # default: $GRADSCOPE_FUZZ_SECONDS or 15 s, every target
#   scripts/fuzz.sh 600 trace_reader        # one target for ten minutes
#
# Needs the fuzz preset built (cmake --preset fuzz && cmake --build --preset fuzz, or scripts/build.sh fuzz).
# Each target fuzzes a copy of its seed corpus in build/fuzz/corpus/<target>: the inputs it finds go there,
# never into tests/fuzz/ (copy the interesting ones by hand, minimised with -merge=1). Targets run one after
# another; run two of these scripts with different targets to use two cores. Exits non-zero when any target
# finds something (a crash, a sanitizer report, an unexpected exception, an input slower than 10 s or a
# leak): the input is in build/fuzz/findings/<target>/, the fuzzer's log in build/fuzz/logs/<target>.log.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$repo_root/build/fuzz"
seconds=${1:-${GRADSCOPE_FUZZ_SECONDS:-15}}
[ $# -gt 0 ] && shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for dir in "$repo_root"/tests/fuzz/*/; do
    [ -f "$dir/fuzz.cc" ] && targets+=("$(basename "$dir")")
  done
fi

# UBSan findings are fatal in the build (-fno-sanitize-recover); ask for their stack too.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for target in "${targets[@]}"; do
  binary="$build/tests/fuzz/gradscope_fuzz_$target"
  if [ ! -x "$binary" ]; then
    echo "fuzz.sh: $binary not built; run: cmake --preset fuzz && cmake --build --preset fuzz" >&2
    exit 2
  fi
  corpus="$build/corpus/$target"
  findings="$build/findings/$target"
  log="$build/logs/$target.log"
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  cp -n "$repo_root/tests/fuzz/$target/corpus/"* "$corpus/"
  options=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
    -artifact_prefix="$findings/")
  dict="$repo_root/tests/fuzz/$target/fuzz.dict"
  [ -f "$dict" ] && options+=(-dict="$dict")
  status=0
  "$binary" "${options[@]}" "$corpus" >"$log" 2>&1 || status=$?
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  if [ "$status" -ne 0 ]; then
    echo "==> fuzz $target: FINDING (exit code $status) after ${executions:-?} executions; input in $findings/, log $log" >&2
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|.*terminate called|.*ALARM)' "$log" | head -n 5 >&2 || true
    failed+=("$target")
  else
    echo "==> fuzz $target: ${executions:-?} executions in ${seconds} s (${rate:-?}/s), $(ls "$corpus" | wc -l) inputs in the corpus copy, no finding"
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "==> fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
