#!/usr/bin/env bash
# What CI runs: install dependencies, then build and run the whole test suite three times:
#   ci    RelWithDebInfo with -Werror
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer
#   tsan  ThreadSanitizer
#
#   scripts/test.sh [CTEST_ARGS...]   # extra arguments go to every ctest run, e.g. -R storage
#   GRADSCOPE_TEST_PRESETS="ci" scripts/test.sh   # only some presets
#
# Works from any directory. Exits non-zero when any preset fails to build or any test fails.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

presets=${GRADSCOPE_TEST_PRESETS:-ci asan tsan}
failed=()
for preset in $presets; do
  scripts/build.sh "$preset"
  echo "==> running tests (ctest --preset $preset)"
  status=0
  ctest --preset "$preset" "$@" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "==> $preset: tests failed (ctest exit code $status); log: build/$preset/Testing/Temporary/LastTest.log" >&2
    failed+=("$preset")
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "==> FAILED presets: ${failed[*]}" >&2
  exit 1
fi
echo "==> all tests passed in: $presets"
