#!/usr/bin/env bash
# Builds gradscope's Debian packages — gradscope, gradscope-gui, gradscope-dev — from a build of their own
# (the package preset: build/package, RelWithDebInfo at -O2, prefix /usr, no tests), and prints their paths.
# docs/user-guide.md, "Install from the packages", says how to install them; docs/architecture.md,
# "Packages", what goes where.
#
#   scripts/package.sh [--fresh]   # --fresh: remove build/package first (what a release should do)
#
# Works from any directory; installs what is missing first (scripts/bootstrap.sh). The packages are in
# build/package/debs. Exit 0 with their paths on stdout; non-zero with a "package.sh: ..." line otherwise.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
case "${1:-}" in
  "") ;;
  --fresh) rm -rf build/package ;;
  -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; exit 0 ;;
  *) echo "package.sh: unknown argument '$1'; the only option is --fresh" >&2; exit 2 ;;
esac

echo "==> checking dependencies (scripts/bootstrap.sh)" >&2
scripts/bootstrap.sh >&2
debs=build/package/debs
rm -rf "$debs"
echo "==> configuring, building and packaging (cmake --workflow --preset package)" >&2
cmake --workflow --preset package >&2
rm -rf "$debs/_CPack_Packages"
shopt -s nullglob
made=("$debs"/*.deb)
if [ ${#made[@]} -eq 0 ]; then
  echo "package.sh: cpack made no package in $debs" >&2
  exit 1
fi
for deb in "${made[@]}"; do
  echo "$repo_root/$deb"
done
