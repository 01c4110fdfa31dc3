#!/usr/bin/env bash
# What CI runs: install dependencies, then build and run the whole test suite three times, then fuzz:
#   ci    RelWithDebInfo with -Werror
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer
#   tsan  ThreadSanitizer
#   fuzz  the libFuzzer targets (clang), each for GRADSCOPE_FUZZ_SECONDS (default 15) on a copy of its
#         corpus (scripts/fuzz.sh, docs/reliability.md); skipped with one line when clang is missing
#
#   scripts/test.sh [CTEST_ARGS...]   # extra arguments go to every ctest run, e.g. -R storage
#                                     (asan runs the unit tests as shards unit.shardN: GTEST_FILTER=... picks among them)
#   GRADSCOPE_TEST_PRESETS="ci" scripts/test.sh   # only some presets
#   GRADSCOPE_FUZZ_SECONDS=60 scripts/test.sh       # fuzz longer
#
# Works from any directory. Exits non-zero when any preset fails to build or any test fails.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

presets=${GRADSCOPE_TEST_PRESETS:-ci asan tsan fuzz}
failed=()
timings=()
for preset in $presets; do
  preset_start=$SECONDS
  if [ "$preset" = fuzz ]; then
    # Not a test suite: build the fuzz targets alone and run each briefly; any finding fails the run.
    runtime_dir=$(clang++ -print-runtime-dir 2>/dev/null || true)
    if ! command -v clang++ >/dev/null 2>&1 || ! ls "$runtime_dir"/libclang_rt.fuzzer-*.a >/dev/null 2>&1; then
      echo "==> fuzz: skipped: clang++ with libFuzzer not found (scripts/bootstrap.sh installs clang and libclang-rt-14-dev)"
      continue
    fi
    status=0
    { scripts/build.sh fuzz && scripts/fuzz.sh; } || status=$?
    [ "$status" -ne 0 ] && failed+=(fuzz)
    timings+=("fuzz $((SECONDS - preset_start)) s")
    continue
  fi
  scripts/build.sh "$preset"
  built_at=$SECONDS
  echo "==> running tests (ctest --preset $preset)"
  status=0
  ctest --preset "$preset" "$@" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "==> $preset: tests failed (ctest exit code $status); log: build/$preset/Testing/Temporary/LastTest.log" >&2
    failed+=("$preset")
  fi
  timings+=("$preset $((SECONDS - preset_start)) s (build $((built_at - preset_start)) s, tests $((SECONDS - built_at)) s)")
done
# The failing tests again, at the end where a CI log's tail shows them: each one's name and the last lines
# of its output (ctest's LastTest.log). Up to 5 tests per preset; the log has them all.
report_failures() {
  local preset=$1 dir=build/$1/Testing/Temporary shown=0 name
  [ -s "$dir/LastTestsFailed.log" ] || return 0
  echo "==> $preset: failed tests: $(cut -d: -f2- "$dir/LastTestsFailed.log" | tr '\n' ' ')" >&2
  while IFS= read -r name && [ "$shown" -lt 5 ]; do
    shown=$((shown + 1))
    echo "==> $preset: the end of $name's output:" >&2
    awk -v test="$name" '
      $0 ~ /^[0-9]+\/[0-9]+ Test: / { current = substr($0, index($0, "Test: ") + 6); next }
      current == test && /^Output:$/ { keep = 1; n = 0; next }
      keep && /^<end of output>$/ { keep = 0; for (i = (n > 30 ? n - 30 : 0); i < n; i++) print "    " lines[i]; next }
      keep { lines[n++] = $0 }' "$dir/LastTest.log" | grep -v '^    -*$' >&2 || true
  done < <(cut -d: -f2- "$dir/LastTestsFailed.log")
}

# Where CI's time goes (README: the whole suite stays under 45 minutes on 2 cores).
printf '==> time: %s\n' "${timings[@]}" "total $SECONDS s"
if [ ${#failed[@]} -ne 0 ]; then
  for preset in "${failed[@]}"; do
    [ "$preset" = fuzz ] || report_failures "$preset"
  done
  echo "==> FAILED presets: ${failed[*]}" >&2
  exit 1
fi
echo "==> all tests passed in: $presets"
