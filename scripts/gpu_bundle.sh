#!/usr/bin/env bash
# Packs what the GPU tests and benchmark need to run on a machine that has CUDA and NCCL but no
# MPI or HDF5 (the workplace's lent GPU machine): the built binaries (stripped), our library, and
# the Debian runtime packages they link, plus env.sh to unpack and point at them there.
#   here:  ./scripts/gpu_bundle.sh [bundle dir, default .gpu]   (needs ./build with CUDA on)
#   there: . .gpu/env.sh && $MPIRUN -np 1 .gpu/bin/test_gpu
# The default bundle directory .gpu/ is git-ignored; carry it to the machine.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${H5CKPT_BUILD_DIR:-$ROOT/build}
OUTDIR=${1:-$ROOT/.gpu}
BINS=("$BUILD/mpi_tests/test_gpu" "$BUILD/mpi_tests/test_device" "$BUILD/perf/h5ckpt-bench")
for b in "${BINS[@]}"; do [[ -x $b ]] || { echo "gpu_bundle: $b not built" >&2; exit 1; }; done
# The planning and transfer benchmarks too, where built (server-class figures of issues 28 and 30).
for b in "$BUILD/perf/h5ckpt-scale" "$BUILD/perf/h5ckpt-transfer" "$BUILD/mpi_tests/test_transfer_gpu"; do [[ -x $b ]] && BINS+=("$b"); done
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR/bin" "$OUTDIR/lib" "$OUTDIR/debs"
for b in "${BINS[@]}"; do strip -o "$OUTDIR/bin/$(basename "$b")" "$b"; done
strip -o "$OUTDIR/lib/libh5ckpt.so.0" "$(readlink -f "$BUILD/src/libh5ckpt.so.0")"

# Debian packages of every library the binaries, mpirun and Open MPI's plugins load, except the
# C/C++ runtime the target image has in newer versions. NCCL comes from the target's own install.
libs=$( { for f in "${BINS[@]}" /usr/bin/orterun /usr/bin/orted \
            $(find /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 -name '*.so'); do
            ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'; done; } | sort -u)
pkgs=$(for l in $libs; do dpkg -S "$(readlink -f "$l")" 2>/dev/null | cut -d: -f1; done | sort -u |
       grep -v -E '^(libc6|libstdc\+\+6|libgcc-s1|libudev1|libuuid1)$' || true)
(cd "$OUTDIR/debs" && apt-get download $pkgs openmpi-bin openmpi-common >/dev/null)

cat > "$OUTDIR/env.sh" <<'ENV'
# Sourced on the GPU machine from the repository root: unpacks the Debian runtime into /opt/dx
# once, links Open MPI's and PMIx's fixed paths to it, and sets PATH, libraries and $MPIRUN.
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -d /opt/dx/usr ]; then
  mkdir -p /opt/dx; for f in "$D"/debs/*.deb; do dpkg -x "$f" /opt/dx; done
  for p in usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu/pmix2 usr/share/openmpi usr/share/pmix etc/openmpi; do
    [ -e /opt/dx/$p ] && [ ! -e /$p ] && ln -s /opt/dx/$p /$p
  done
fi
NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$NCCL_DIR" ] || NCCL_DIR=$(dirname "$(find / -name 'libnccl.so.2' 2>/dev/null | head -1)")
export OPAL_PREFIX=/opt/dx/usr PATH=/opt/dx/usr/bin:$PATH
export LD_LIBRARY_PATH=$D/lib:/opt/dx/usr/lib/x86_64-linux-gnu:/opt/dx/lib/x86_64-linux-gnu:/opt/dx/usr/lib/x86_64-linux-gnu/openmpi/lib:$NCCL_DIR
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export PMIX_MCA_pcompress_base_silence_warning=1
MPIRUN="orterun --allow-run-as-root --oversubscribe --bind-to none"
ENV
du -sh "$OUTDIR"
