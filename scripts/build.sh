#!/usr/bin/env bash
# Installs what gradscope needs (scripts/bootstrap.sh), then configures and builds one CMake preset.
#
#   scripts/build.sh [PRESET]     # PRESET from CMakePresets.json; default: default (build/default)
#
# Works from any directory. Re-running is incremental: an existing build directory is reconfigured
# only when CMake thinks it must, and Ninja rebuilds only what changed.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preset=${1:-default}
cd "$repo_root"

echo "==> checking dependencies (scripts/bootstrap.sh)"
scripts/bootstrap.sh
if ! cmake --list-presets=configure 2>/dev/null | grep -q "^  \"$preset\""; then
  echo "build.sh: no configure preset '$preset'; choose one of:" >&2
  cmake --list-presets=configure >&2 || true
  exit 2
fi
echo "==> configuring preset '$preset'"
cmake --preset "$preset"
echo "==> building preset '$preset'"
cmake --build --preset "$preset" --parallel 2
echo "==> built preset '$preset' in $repo_root/build/$preset"
