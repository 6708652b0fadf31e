#!/usr/bin/env bash
# Installs the built tree into a temporary prefix and builds a consumer against it, once with
# find_package(h5ckpt) and once with pkg-config, then runs both under mpiexec.
set -euo pipefail
BUILD_DIR=$1; SRC_DIR=$2; MPIEXEC=$3; shift 3
PREFIX=$(mktemp -d)
trap 'rm -rf "$PREFIX"' EXIT
cmake --install "$BUILD_DIR" --prefix "$PREFIX" >/dev/null
cmake -S "$SRC_DIR" -B "$PREFIX/consumer-build" -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$PREFIX/consumer-build" >/dev/null
"$MPIEXEC" -n 2 "$@" "$PREFIX/consumer-build/consumer" "$PREFIX/ckpt-cmake"
# pkg-config route (mpicxx supplies MPI flags)
LIBDIR=$(ls -d "$PREFIX"/lib*/pkgconfig | head -n1)
mpicxx -std=c++20 "$SRC_DIR/main.cpp" -o "$PREFIX/consumer-pc" \
  $(PKG_CONFIG_PATH="$LIBDIR" pkg-config --cflags --libs h5ckpt) -Wl,-rpath,"$(dirname "$LIBDIR")"
"$MPIEXEC" -n 2 "$@" "$PREFIX/consumer-pc" "$PREFIX/ckpt-pc"
