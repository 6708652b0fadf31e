#!/bin/sh
# CTest driver of the minimal example: train and save on 4 ranks as TP2 x DP2, then resume the
# same directory on 2 ranks as PP2 (another layout) and train on. The example checks every
# loaded and final value itself and exits non-zero on any mismatch.
# Usage: run_minimal_trainer.sh EXE CKPT_DIR MPIEXEC NUMPROC_FLAG [MPIEXEC_FLAGS...]
set -eu
exe=$1 dir=$2 mpiexec=$3 np=$4
shift 4
rm -rf "$dir"
"$mpiexec" "$np" 4 "$@" "$exe" --tp 2 --dp 2 --steps 6 --save-every 3 --expect-start 0 "$dir"
"$mpiexec" "$np" 2 "$@" "$exe" --pp 2 --steps 9 --save-every 3 --expect-start 6 "$dir"
