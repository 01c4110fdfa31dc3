#!/usr/bin/env bash
# Installs a configured and built gradscope build tree into a fresh prefix, then configures, builds and
# runs tests/install/consumer against it with find_package(gradscope). Proves the installed package is
# complete: headers, libraries, gradscopeConfig.cmake and its dependencies, no paths back into the tree.
#
#   tests/install/check_install.sh BUILD_DIR
#
# Exit 0 when the consumer prints what it should; non-zero with a "check_install: FAIL" line otherwise.
# Set GRADSCOPE_KEEP_INSTALL_CHECK=1 to keep the temporary prefix and consumer build for a look.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
consumer_src="$script_dir/consumer"

fail() {
  echo "check_install: FAIL: $*" >&2
  exit 1
}

[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
[ -f "$1/CMakeCache.txt" ] || fail "'$1' is not a configured CMake build directory (no CMakeCache.txt)"
build_dir=$(cd "$1" && pwd)

# The consumer must compile and link like the build it checks: a sanitizer build's static libraries
# need the same -fsanitize flags at link time.
cache_value() {
  sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt" | head -n 1
}
cxx_compiler=$(cache_value CMAKE_CXX_COMPILER)
cxx_flags=$(cache_value CMAKE_CXX_FLAGS)
exe_linker_flags=$(cache_value CMAKE_EXE_LINKER_FLAGS)
build_type=$(cache_value CMAKE_BUILD_TYPE)
generator=$(cache_value CMAKE_GENERATOR)

work=$(mktemp -d "${TMPDIR:-/tmp}/gradscope-install-check.XXXXXX")
cleanup() {
  if [ "${GRADSCOPE_KEEP_INSTALL_CHECK:-0}" = 1 ]; then
    echo "==> kept $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
prefix="$work/prefix"
consumer_build="$work/consumer-build"
log="$work/log"

run_logged() {
  local what=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    fail "$what failed (command: $*)"
  fi
}

echo "==> installing $build_dir into $prefix"
run_logged "cmake --install" cmake --install "$build_dir" --prefix "$prefix"

package_dir=$(find "$prefix" -path '*/cmake/gradscope/gradscopeConfig.cmake' -printf '%h\n' | head -n 1)
[ -n "$package_dir" ] || fail "the install has no lib*/cmake/gradscope/gradscopeConfig.cmake"
for f in gradscopeConfigVersion.cmake gradscopeTargets.cmake; do
  [ -f "$package_dir/$f" ] || fail "the install has no $f next to gradscopeConfig.cmake"
done
# An installed package must not point back into the source or build tree (it would break once those go).
if leaks=$(grep -rlF -e "$repo_root/" -e "$build_dir/" "$package_dir"); then
  fail "installed CMake files refer to the source or build tree: $leaks"
fi
version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$package_dir/gradscopeConfigVersion.cmake")
[ -n "$version" ] || fail "cannot read PACKAGE_VERSION from gradscopeConfigVersion.cmake"

# The environment-modules file names this prefix's paths (written at install time), and puts a bin/ that
# is not /usr/bin on PATH; the tuner plugin it names is installed.
modulefile="$prefix/share/modulefiles/gradscope/$version"
if [ -f "$modulefile" ]; then
  grep -qxF "prepend-path PATH \"$prefix/bin\"" "$modulefile" ||
    fail "$modulefile does not put $prefix/bin on PATH"
  tuner=$(sed -n 's/^pushenv NCCL_TUNER_PLUGIN "\(.*\)"$/\1/p' "$modulefile")
  [ -n "$tuner" ] && [ -f "$tuner" ] || fail "$modulefile names the tuner plugin '$tuner', which is not installed"
  case "$tuner" in "$prefix"/*) ;; *) fail "$modulefile names a tuner outside $prefix: $tuner" ;; esac
  echo "==> module file: $modulefile (PATH, NCCL_TUNER_PLUGIN=$tuner)"
elif [ -f "$prefix/bin/gradscope" ]; then
  fail "the install has the gradscope command but no module file $modulefile"
fi

echo "==> configuring the consumer against gradscope $version"
configure=(cmake -S "$consumer_src" -B "$consumer_build"
  -DCMAKE_PREFIX_PATH="$prefix"
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
  -DCMAKE_CXX_COMPILER="$cxx_compiler"
  -DCMAKE_CXX_FLAGS="$cxx_flags"
  -DCMAKE_EXE_LINKER_FLAGS="$exe_linker_flags"
  -DCMAKE_BUILD_TYPE="$build_type")
[ -n "$generator" ] && configure+=(-G "$generator")
run_logged "configuring the consumer" "${configure[@]}"
found_dir=$(sed -n 's/^gradscope_DIR:[A-Z]*=//p' "$consumer_build/CMakeCache.txt")
[ "$found_dir" -ef "$package_dir" ] ||
  fail "find_package(gradscope) used $found_dir, not the fresh install in $package_dir"

echo "==> building the consumer"
run_logged "building the consumer" cmake --build "$consumer_build"

echo "==> running the consumer"
output=$("$consumer_build/consumer" 2>&1) || { echo "$output" >&2; fail "the consumer exited non-zero"; }
echo "$output" | sed 's/^/    /'

expect_line() {
  grep -qxF -- "$1" <<<"$output" || fail "expected the line '$1' in the consumer's output"
}
expect_line "gradscope version: $version"
expect_line "formatBytes(1536): 1.5 KiB"
if grep -q 'gradscope::storage' "$package_dir"/gradscopeTargets*.cmake; then
  grep -qE '^storage schema v[0-9]+ with [1-9][0-9]* tables$' <<<"$output" ||
    fail "gradscope::storage is installed but the consumer did not report its schema"
  grep -qE '^perfetto export: (yes|no)$' <<<"$output" ||
    fail "the consumer could not link the Perfetto exporter of gradscope::storage"
fi
echo "==> check_install: OK (gradscope $version installed and usable from $prefix)"
