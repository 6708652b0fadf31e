#!/usr/bin/env bash
# Sets up and builds if needed, then runs every test (unit, MPI at 1-8 ranks, end-to-end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${H5CKPT_BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 "$@"
