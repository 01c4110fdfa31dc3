#!/usr/bin/env bash
# The Debian packages built and installed for real (ctest label package; docs/architecture.md, "Packages"):
# cpack builds them from BUILD_DIR; debootstrap makes a fresh Debian 12 root from Debian's own packages
# (kept as a tarball in WORKDIR/cache, with the .debs apt downloaded, so that a rerun downloads nothing);
# apt-get installs the .debs into it, resolving their dependencies; then, inside the root, with nothing from
# the build tree, the installed command profiles an installed sample job, reports on it, recommends, the
# viewer renders its screenshots offscreen, and `module load gradscope` (Environment Modules and Lmod) sets
# up what it should.
#
#   tests/package/check_packages.sh --cpack CPACK BUILD_DIR WORKDIR
#
# Exit 0 when everything passes; 77 (ctest: skipped) with one line saying why when the check cannot run
# here: not root, no debootstrap or chroot, no network to the Debian mirror, a build without MPI, or a
# sanitizer build; otherwise 1 with a "check_packages: FAIL: ..." line. Every mount is undone on the way out,
# failure included; the whole run is in a mount namespace of its own where it can make one, so that even a
# killed run leaves no mount behind. GRADSCOPE_KEEP_PACKAGE_ROOT=1 keeps the installed root for a look.
set -euo pipefail

fail() {
  echo "check_packages: FAIL: $*" >&2
  exit 1
}
skip() {
  echo "check_packages: SKIPPED: $*"
  exit 77
}
# A command that fails where no check names the problem still says which.
trap 'echo "check_packages: FAIL: line $LINENO: $BASH_COMMAND exited with $?" >&2' ERR

cpack=
if [ "${1:-}" = --cpack ]; then
  cpack=$2
  shift 2
fi
[ $# -eq 2 ] && [ -n "$cpack" ] || { echo "usage: $0 --cpack CPACK BUILD_DIR WORKDIR" >&2; exit 2; }
[ -f "$1/CPackConfig.cmake" ] || fail "'$1' is not a configured gradscope build (no CPackConfig.cmake)"
build_dir=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)

cache_value() {
  sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt" | head -n 1
}
[ "$(id -u)" -eq 0 ] || skip "not root: debootstrap, chroot and mount need root"
for tool in debootstrap chroot mount umount dpkg-deb dpkg-shlibdeps readelf; do
  command -v "$tool" >/dev/null 2>&1 || skip "no $tool (scripts/bootstrap.sh installs debootstrap, dpkg-dev and binutils)"
done
case "$(cache_value CMAKE_CXX_FLAGS)" in
  *-fsanitize=*) skip "a sanitizer build: its packages would need the sanitizer's runtime; the ci preset tests the packages" ;;
esac
[ -x "$build_dir/samples/mpi_train/gradscope-sample-mpi-train" ] ||
  skip "this build has no MPI samples (GRADSCOPE_WITH_MPI); the installed sample job is what the packages are tried on"

# A mount namespace of our own: the mounts below vanish with it, even if ctest kills the run.
if [ -z "${GRADSCOPE_PACKAGE_NAMESPACE:-}" ] && unshare --mount --propagation private true 2>/dev/null; then
  exec env GRADSCOPE_PACKAGE_NAMESPACE=1 unshare --mount --propagation private -- "$0" --cpack "$cpack" "$build_dir" "$work"
fi
# The root needs /proc, /sys and /dev mounted in it: a container without CAP_SYS_ADMIN cannot.
probe=$(mktemp -d)
if ! mount -t tmpfs -o size=1m tmpfs "$probe" 2>/dev/null; then
  rmdir "$probe"
  skip "cannot mount here (a container without CAP_SYS_ADMIN?); the root needs /proc, /sys and /dev"
fi
umount "$probe"
rmdir "$probe"

started=$SECONDS
phase_started=$SECONDS
timings=()
phase_done() {
  timings+=("$1 $((SECONDS - phase_started)) s")
  phase_started=$SECONDS
}

# --- The mirror apt uses here, for bookworm and its updates ---------------------------------------------
# deb822 stanzas (*.sources) and one-line entries (*.list); the first http(s) URI serving SUITE's main.
mirror_for() {
  local suite=$1 uri
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$suite" '
    function flush() {
      if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " suite " ") &&
          (" " components " ") ~ / main / && uri == "") uri = first
      types = suites = components = first = ""; enabled = "yes"
    }
    /^[ \t]*$/ { flush(); next }
    /^Types:/ { sub(/^Types:[ \t]*/, ""); types = $0 }
    /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
    /^Components:/ { sub(/^Components:[ \t]*/, ""); components = $0 }
    /^Enabled:/ { sub(/^Enabled:[ \t]*/, ""); enabled = tolower($0) }
    /^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) { first = $i; break } }
    END { flush(); print uri }')
  if [ -z "$uri" ]; then
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      sed -n -E "s|^deb[ \t]+(\[[^]]*\][ \t]+)?(https?://[^ \t]+)[ \t]+${suite}[ \t].*main.*|\2|p" | head -n 1)
  fi
  echo "${uri%/}"
}
mirror=$(mirror_for bookworm)
mirror=${mirror:-http://deb.debian.org/debian}
security=$(mirror_for bookworm-security)
security=${security:-http://deb.debian.org/debian-security}
probe=$(mktemp)
if ! timeout 30 /usr/lib/apt/apt-helper download-file "$mirror/dists/bookworm/InRelease" "$probe" >/dev/null 2>&1; then
  rm -f "$probe"
  skip "no network to the Debian mirror $mirror (read from /etc/apt/sources.list*)"
fi
rm -f "$probe"

# --- The packages ---------------------------------------------------------------------------------------
debs="$work/debs"
rm -rf "$debs"
mkdir -p "$debs"
echo "==> building the packages (cpack) from $build_dir"
if ! "$cpack" --config "$build_dir/CPackConfig.cmake" -B "$debs" >"$work/cpack.log" 2>&1; then
  tail -n 30 "$work/cpack.log" >&2
  fail "cpack failed; the whole log is $work/cpack.log"
fi
rm -rf "$debs/_CPack_Packages"
expected=(gradscope gradscope-dev)
[ -x "$build_dir/gui/gradscope-gui" ] && expected+=(gradscope-gui)
deb_files=()
for package in "${expected[@]}"; do
  file=$(find "$debs" -maxdepth 1 -name "${package}_*.deb" | head -n 1)
  [ -n "$file" ] || fail "cpack made no ${package}_*.deb (it made: $(ls "$debs"))"
  deb_files+=("$file")
  printf '    %-14s %6s KiB  %s\n' "$package" "$(( $(stat -c %s "$file") / 1024 ))" "$(basename "$file")"
  for field in Version Installed-Size Depends Recommends Suggests; do
    value=$(dpkg-deb -f "$file" "$field")
    [ -n "$value" ] && printf '        %s: %s\n' "$field" "$value"
  done
done
[ "$(find "$debs" -maxdepth 1 -name '*.deb' | wc -l)" -eq ${#expected[@]} ] ||
  fail "cpack made other packages than ${expected[*]}: $(ls "$debs")"
phase_done "cpack"

# What each package must hold, and what it must not: no RPATH into the source or build tree, no Qt in
# gradscope, the Debian files.
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
private=usr/lib/$multiarch/gradscope
contents="$work/contents"
rm -rf "$contents"
for file in "${deb_files[@]}"; do
  package=$(dpkg-deb -f "$file" Package)
  mkdir -p "$contents/$package"
  dpkg-deb -x "$file" "$contents/$package"
  for doc in copyright changelog.Debian.gz; do
    [ -f "$contents/$package/usr/share/doc/$package/$doc" ] || fail "$package has no /usr/share/doc/$package/$doc"
  done
done
for path in usr/bin/gradscope usr/bin/gradscope-bench usr/bin/gradscope-mpi "$private/libgradscope-agent.so" \
  "$private/libgradscope-agent-mpi.so" "$private/libnccl-tuner-gradscope.so" "$private/libnccl-profiler-gradscope.so" \
  "$private/samples/gradscope-sample-mpi-train" "usr/share/modulefiles/gradscope/$(dpkg-deb -f "${deb_files[0]}" Version | sed 's/-[^-]*$//')"; do
  [ -e "$contents/gradscope/$path" ] || fail "package gradscope has no /$path"
done
[ -f "$contents/gradscope-dev/usr/lib/$multiarch/cmake/gradscope/gradscopeConfig.cmake" ] ||
  fail "package gradscope-dev has no /usr/lib/$multiarch/cmake/gradscope/gradscopeConfig.cmake"
case "$(dpkg-deb -f "${deb_files[0]}" Depends)" in
  *qt6*) fail "package gradscope depends on Qt: $(dpkg-deb -f "${deb_files[0]}" Depends)" ;;
esac
source_dir=$(cache_value CMAKE_HOME_DIRECTORY)
while IFS= read -r -d '' elf; do
  if readelf -d "$elf" 2>/dev/null | grep -E '\((RPATH|RUNPATH)\)' | grep -qF -e "$build_dir" -e "$source_dir"; then
    fail "${elf#"$contents"/} has an RPATH into the build or source tree: $(readelf -d "$elf" | grep -E 'R(UN)?PATH')"
  fi
done < <(find "$contents" -type f \( -name '*.so' -o -perm -u+x \) -print0)
# gradscope-dev as another project sees it: tests/install/consumer finds gradscope in the unpacked package
# alone (with this machine's compiler and the -dev packages gradscope-dev depends on), links its stripped
# static libraries and runs.
cmake=$(dirname "$cpack")/cmake
consumer="$work/consumer"
rm -rf "$consumer"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if ! { "$cmake" -S "$source_dir/tests/install/consumer" -B "$consumer" "${generator[@]}" \
         -DCMAKE_PREFIX_PATH="$contents/gradscope-dev/usr" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON &&
       "$cmake" --build "$consumer"; } >"$work/consumer.log" 2>&1; then
  tail -n 20 "$work/consumer.log" >&2
  fail "the consumer project does not build against gradscope-dev; the whole log is $work/consumer.log"
fi
case "$(sed -n 's/^gradscope_DIR:PATH=//p' "$consumer/CMakeCache.txt")" in
  "$contents/gradscope-dev/usr/lib/$multiarch/cmake/gradscope") ;;
  *) fail "the consumer found gradscope elsewhere than in gradscope-dev: $(grep '^gradscope_DIR' "$consumer/CMakeCache.txt")" ;;
esac
"$consumer/consumer" | grep -q "^gradscope version: " || fail "the consumer built against gradscope-dev does not run"
echo "    gradscope-dev: find_package(gradscope) from the package alone; the consumer links and runs"
phase_done "package contents"

# --- A fresh Debian 12 root -----------------------------------------------------------------------------
cache="$work/cache"
archives="$cache/archives"
mkdir -p "$archives/partial"
base="$cache/bookworm-minbase-$(dpkg --print-architecture)-$(echo "$mirror $security" | md5sum | cut -c1-8).tar.gz"
root="$work/root"

mounted_under() {
  # Mount points at or below $1, deepest first.
  awk -v dir="$1" '$5 == dir || index($5, dir "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r
}
unmount_root() {
  local point
  for point in $(mounted_under "$root"); do
    umount "$point" 2>/dev/null || umount -l "$point" || true
  done
}
remove_root() {
  unmount_root
  if [ -n "$(mounted_under "$root")" ]; then
    echo "check_packages: $root still has mounts ($(mounted_under "$root" | tr '\n' ' ')); not removing it" >&2
    return 1
  fi
  rm -rf --one-file-system "$root"
}
cleanup() {
  local status=$?
  if [ "${GRADSCOPE_KEEP_PACKAGE_ROOT:-0}" = 1 ]; then
    unmount_root
    echo "==> kept the installed root: $root (chroot $root /bin/bash)"
  else
    remove_root || status=1
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
remove_root || fail "cannot remove the root of an earlier run"

if [ ! -f "$base" ]; then
  echo "==> making a Debian 12 root: debootstrap --variant=minbase bookworm from $mirror (cached in $base)"
  if ! debootstrap --variant=minbase --cache-dir="$archives" bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 20 "$work/debootstrap.log" >&2
    fail "debootstrap failed; the whole log is $work/debootstrap.log"
  fi
  cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
EOF
  # Downloaded packages go to the cache, bind-mounted below; the root keeps none.
  echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >"$root/etc/apt/apt.conf.d/90gradscope-keep-debs"
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get update -q >"$work/apt-update.log" 2>&1 ||
    { tail -n 20 "$work/apt-update.log" >&2; fail "apt-get update in the new root failed"; }
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get clean
  tar -C "$root" -czf "$base.partial" . && mv "$base.partial" "$base"
  remove_root
  phase_done "debootstrap"
fi
mkdir -p "$root"
tar -C "$root" -xzf "$base"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
mount -t tmpfs -o mode=1777,size=1g tmpfs "$root/dev/shm"
mount --bind "$archives" "$root/var/cache/apt/archives"
mkdir -p "$root/tmp/debs"
cp "${deb_files[@]}" "$root/tmp/debs/"
phase_done "root"

# in_root COMMAND: a login-free shell in the root with a clean environment (no variable of this machine's).
in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 /bin/bash -c "$1"
}

# --- apt-get install ./gradscope*.deb -------------------------------------------------------------------
# openmpi-bin (mpirun) is gradscope's Recommends, installed by name because recommends are off here (they
# would bring Qt's themes and translations too); environment-modules is the first of the two module systems
# (they conflict: lmod replaces it below).
install="apt-get install -y -q --no-install-recommends $(printf '/tmp/debs/%s ' "${deb_files[@]##*/}")openmpi-bin environment-modules"
echo "==> in the root: $install"
if ! in_root "$install" >"$work/apt-install.log" 2>&1; then
  # The root's package lists may be older than the mirror (a cached root): refresh them once.
  if ! in_root "apt-get update -q && $install" >"$work/apt-install.log" 2>&1; then
    tail -n 25 "$work/apt-install.log" >&2
    fail "apt-get install of the packages failed; the whole log is $work/apt-install.log"
  fi
fi
echo "    $(grep -c '^Setting up ' "$work/apt-install.log") packages set up"

for package in "${expected[@]}"; do
  in_root "dpkg-query -W -f='\${Status}' $package" | grep -q 'install ok installed' || fail "$package is not installed"
done
phase_done "apt-get install"

# --- The installed command, on an installed sample ------------------------------------------------------
sample="/$private/samples/gradscope-sample-mpi-train"
# The budget lifted: this checks that the installed agent explores and the report shows it, not the budget
# (tested in the build tree), which a loaded machine can spend on the first exploration's setup alone.
job="gradscope run -o /tmp/run --mode explore --explore-budget 1 -- mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 2 $sample --steps 400 --sleep-ms 2 --print-every 0"
echo "==> in the root: $job"
in_root "cd /tmp && $job" >"$work/run.log" 2>&1 || { tail -n 30 "$work/run.log" >&2; fail "gradscope run failed"; }
grep -q '^final loss ' "$work/run.log" || fail "the sample job printed no final line: $(tail -n 20 "$work/run.log")"
grep -E '^final loss |^gradscope: ' "$work/run.log" | head -n 3 | sed 's/^/    /'
in_root "test -s /tmp/run/trace.db" || fail "gradscope run left no /tmp/run/trace.db"
phase_done "gradscope run"

echo "==> in the root: gradscope report /tmp/run/trace.db"
in_root "gradscope report /tmp/run/trace.db" >"$work/report.txt" 2>&1 || { cat "$work/report.txt" >&2; fail "gradscope report failed"; }
grep -q 'MPI_Allreduce' "$work/report.txt" || fail "the report names no MPI_Allreduce: $(head -n 20 "$work/report.txt")"
grep -q 'sum/' "$work/report.txt" || fail "the report shows no strategy explore mode measured"
echo "    $(wc -l <"$work/report.txt") lines, MPI_Allreduce and measured strategies in them"

echo "==> in the root: gradscope recommend /tmp/run/trace.db"
in_root "gradscope recommend /tmp/run/trace.db && gradscope recommend /tmp/run/trace.db --format json --no-store -o /tmp/plan.json" \
  >"$work/recommend.txt" 2>&1 || { cat "$work/recommend.txt" >&2; fail "gradscope recommend failed"; }
# A recommendation may well be "keep sum/native" on 2 ranks of one machine; it must be made, from the run.
grep -q '^gradscope recommendation: backend mpi, world size 2' "$work/recommend.txt" &&
  grep -qE '^  recommended: ' "$work/recommend.txt" ||
  fail "gradscope recommend made no recommendation: $(head -n 12 "$work/recommend.txt")"
in_root "grep -q '\"format\": \"gradscope-recommendation\"' /tmp/plan.json && grep -q '\"rules\"' /tmp/plan.json" ||
  fail "/tmp/plan.json is not a recommendation file"
grep -E '^(gradscope recommendation|  (baseline|recommended):|  none:|  [A-Za-z_]+ .*(sum|adacons|adasum|async)/)' \
  "$work/recommend.txt" | head -n 6 | sed 's/^/    /'
phase_done "report and recommend"

# --- The viewer, offscreen ------------------------------------------------------------------------------
if [ -f "$contents/gradscope-gui/usr/bin/gradscope-gui" ]; then
  echo "==> in the root: QT_QPA_PLATFORM=offscreen gradscope-gui --screenshots /tmp/shots /tmp/run/trace.db"
  in_root "QT_QPA_PLATFORM=offscreen XDG_RUNTIME_DIR=/tmp gradscope-gui --screenshots /tmp/shots /tmp/run/trace.db" \
    >"$work/gui.log" 2>&1 || { tail -n 20 "$work/gui.log" >&2; fail "gradscope-gui --screenshots failed"; }
  shots=("$root"/tmp/shots/*.png)
  [ -e "${shots[0]}" ] || fail "gradscope-gui wrote no PNG into /tmp/shots"
  # A real picture: PNG, 1400 x 900 (the default --size), and more than a blank window compresses to.
  for shot in "${shots[@]}"; do
    header=$(od -An -tx1 -N24 "$shot" | tr -d ' \n')
    [ "${header:0:16}" = 89504e470d0a1a0a ] || fail "${shot##*/} is not a PNG"
    [ "${header:32:16}" = 0000057800000384 ] || fail "${shot##*/} is not 1400 x 900 (IHDR ${header:32:16})"
    [ "$(stat -c %s "$shot")" -gt 20000 ] || fail "${shot##*/} is only $(stat -c %s "$shot") bytes: a blank window?"
  done
  echo "    ${#shots[@]} PNGs, 1400 x 900, $(du -ck "${shots[@]}" | tail -n 1 | cut -f1) KiB: $(cd "$root/tmp/shots" && ls -- *.png | tr '\n' ' ')"
  phase_done "gradscope-gui"
fi

# --- module load gradscope ------------------------------------------------------------------------------
# Each module system in a shell of its own, as its /etc/profile.d script sets it up. A tuner another module
# had named comes back on unload.
tuner="/$private/libnccl-tuner-gradscope.so"
profiler="/$private/libnccl-profiler-gradscope.so"
module_check='
  export NCCL_TUNER_PLUGIN=site-tuner
  before=$PATH
  module load gradscope || exit 1
  echo "gradscope=$(command -v gradscope)"
  echo "tuner=$NCCL_TUNER_PLUGIN"
  echo "profiler=$GRADSCOPE_NCCL_PROFILER_PLUGIN profiler_on=${NCCL_PROFILER_PLUGIN:-no}"
  [ "$PATH" = "$before" ] && echo "path=unchanged" || echo "path=$PATH"
  module unload gradscope
  echo "after=$NCCL_TUNER_PLUGIN profiler_after=${GRADSCOPE_NCCL_PROFILER_PLUGIN:-unset}"'
for system in "environment-modules:. /usr/share/modules/init/bash" "lmod:. /etc/profile.d/lmod.sh"; do
  name=${system%%:*}
  if [ "$name" = lmod ]; then
    in_root "apt-get install -y -q --no-install-recommends lmod" >"$work/apt-lmod.log" 2>&1 ||
      { tail -n 20 "$work/apt-lmod.log" >&2; fail "apt-get install lmod failed"; }
  fi
  echo "==> in the root, $name: module load gradscope"
  output=$(in_root "${system#*:}; $module_check" 2>&1) || { echo "$output" >&2; fail "$name: module load gradscope failed"; }
  for line in "gradscope=/usr/bin/gradscope" "tuner=$tuner" "profiler=$profiler profiler_on=no" "path=unchanged" \
    "after=site-tuner profiler_after=unset"; do
    grep -qxF "$line" <<<"$output" || fail "$name: expected '$line' after module load gradscope; got: $(echo "$output" | tr '\n' ' ')"
  done
  in_root "test -f $tuner && test -f $profiler" || fail "the module names $tuner and $profiler; one is not installed"
  echo "    gradscope on PATH (/usr/bin, left as it was), NCCL_TUNER_PLUGIN=$tuner, GRADSCOPE_NCCL_PROFILER_PLUGIN=$profiler; given back on unload"
done
phase_done "module load"

printf '==> time: %s\n' "${timings[@]}" "total $((SECONDS - started)) s"
echo "==> check_packages: OK (${expected[*]} installed into a fresh Debian 12 root and used there)"
