#!/usr/bin/env bash
# ptdp set-up: installs the Debian 12 packages ptdp needs (only those missing; as root, or via
# sudo), configures and builds. Safe to re-run: incremental builds take seconds.
#   PTDP_BUILD_DIR   build folder (default: build)
#   PTDP_CMAKE_ARGS  extra CMake arguments (e.g. -DPTDP_ENABLE_CUDA=OFF)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config ccache
          libsimgrid-dev libeigen3-dev libboost-graph-dev libyaml-cpp-dev libgtest-dev
          libopenmpi-dev openmpi-bin nlohmann-json3-dev libcli11-dev libsqlite3-dev python3-matplotlib python3-scipy
          clang libclang-rt-14-dev)  # clang + libFuzzer: scripts/fuzz.sh (CI fuzzes 60 s per target)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "ptdp setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

build_dir=${PTDP_BUILD_DIR:-build}
if [ ! -f "$build_dir/build.ninja" ]; then
  # shellcheck disable=SC2086
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${PTDP_CMAKE_ARGS:-} >&2
fi
cmake --build "$build_dir" -j "$(nproc)" >&2
