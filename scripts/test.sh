#!/usr/bin/env bash
# What CI runs: install dependencies, build the `ci` preset (RelWithDebInfo, -Werror) and run every test.
#
#   scripts/test.sh [CTEST_ARGS...]   # extra arguments go to ctest, e.g. -R storage or --repeat until-fail:3
#
# Works from any directory. The exit code is ctest's (0 only when every test passed).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

scripts/build.sh ci
echo "==> running tests (ctest --preset ci)"
status=0
ctest --preset ci "$@" || status=$?
if [ "$status" -eq 0 ]; then
  echo "==> all tests passed"
else
  echo "==> tests failed (ctest exit code $status); logs in build/ci/Testing/Temporary/LastTest.log" >&2
fi
exit "$status"
