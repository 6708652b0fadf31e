#!/usr/bin/env bash
# Installs the Debian packages h5ckpt needs (only those missing), then configures and builds
# into ./build. Safe to run again: the second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
          libspdlog-dev libfabric-dev libgtest-dev libxxhash-dev nlohmann-json3-dev libcli11-dev
          python3 python3-numpy python3-h5py libtomlplusplus-dev slurm-wlm
          python3-dev pybind11-dev python3-pybind11 python3-mpi4py python3-torch libsodium-dev
          glusterfs-server glusterfs-client  # the shared file system of the gluster tests
          xfsprogs  # mkfs.xfs for the xfs test (mpi_tests/xfs.cmake)
          clang-format)  # scripts/check_format.sh, run by .ci/run
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- simulated cluster (scripts/cluster.sh, tests/cluster.cmake) ---------------------------------
# Needs these commands (in Debian's base system, but minimal images may lack some): unshare and
# flock (util-linux), mount, hostname, getent (libc-bin), tc (iproute2: the shaped wire of
# --wire-rate). Open MPI and Slurm come from above.
cluster_missing=()
for c in unshare:util-linux flock:util-linux mount:mount hostname:hostname getent:libc-bin tc:iproute2; do
  command -v "${c%%:*}" >/dev/null || cluster_missing+=("${c#*:}")
done
if ((${#cluster_missing[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${cluster_missing[*]} for scripts/cluster.sh"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${cluster_missing[@]}" >/dev/null
  else
    echo "setup: scripts/cluster.sh needs ${cluster_missing[*]} (and root to run); skipping" >&2
  fi
fi

BUILD_DIR=${H5CKPT_BUILD_DIR:-build}
JOBS=${H5CKPT_JOBS:-$(nproc)}
CONFIG=(-DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}")
# H5CKPT_DEBUG_LEVEL=1: line tables only (CI sets it; see CMakeLists.txt).
[[ -z ${H5CKPT_DEBUG_LEVEL:-} ]] || CONFIG+=(-DH5CKPT_DEBUG_LEVEL="$H5CKPT_DEBUG_LEVEL")
cmake -S . -B "$BUILD_DIR" "${CONFIG[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "setup: built in $BUILD_DIR"
