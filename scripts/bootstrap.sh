#!/usr/bin/env bash
# Installs the Debian packages gradscope builds and tests with (shared list: DESIGN.md "Dependencies").
# Idempotent: silent when everything is present, prints what it installs, exits non-zero with one clear
# line when it cannot (not root and no sudo, no package index, a package apt cannot find).
set -euo pipefail

packages=(
  cmake g++ ninja-build pkg-config
  libsqlite3-dev sqlite3
  libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # gradscope export --format perfetto: the protobuf library and protoc (optional: left out without them).
  libprotobuf-dev protobuf-compiler
  libopenmpi-dev openmpi-bin
  # scripts/cluster.sh (hosts as network namespaces, links shaped with tc; the ctest label cluster).
  iproute2
  # The Debian packages (scripts/package.sh, cpack): dpkg-shlibdeps and dpkg-architecture (dpkg-dev),
  # file (CPack's DEB generator needs it); and their test (label package), which makes a Debian root.
  dpkg-dev file debootstrap
  # libqt6opengl6-dev is only a Recommends of qt6-base-dev, which --no-install-recommends skips, but
  # Qt6ChartsConfig.cmake needs Qt6OpenGL: without it find_package(Qt6 COMPONENTS Charts) fails.
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev
  python3-mpi4py python3-numpy
  xvfb
  # The fuzz preset (tests/fuzz): clang and its runtime libraries, libFuzzer's among them.
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "bootstrap: need root to install ${missing[*]}; run as root or install them with your package manager" >&2
  exit 1
fi

echo "bootstrap: installing ${missing[*]}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt_install() {
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >"$log" 2>&1
}
# Try with the current package index first; refresh it only when that fails (a fresh machine has none).
if ! apt_install; then
  if ! "${sudo[@]}" apt-get update -q >"$log" 2>&1; then
    echo "bootstrap: 'apt-get update' failed (no network to the Debian mirror?); see below" >&2
    tail -n 5 "$log" >&2
    exit 1
  fi
  if ! apt_install; then
    echo "bootstrap: could not install ${missing[*]}; apt said:" >&2
    grep -E '^(E:|W:)' "$log" | head -n 5 >&2 || tail -n 5 "$log" >&2
    exit 1
  fi
fi
echo "bootstrap: done"
