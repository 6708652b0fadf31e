#!/usr/bin/env bash
# Server-class figures (docs/performance.md) on the lent GPU machine, from the bundle that
# scripts/gpu_bundle.sh makes here (a CUDA build): h5ckpt-bench with its floors in the same run at
# 1 rank, 4 ranks TP2 ZeRO, 8 ranks TP2 ZeRO and 1 rank from CUDA memory, and h5ckpt-scale's
# planning CPU. One JSON summary line per run goes to $OUT (the device tool's folder) or ./gpu-figures.
#   here:  scripts/gpu_bundle.sh
#   there: run(command="perf/gpu_figures.sh", carry=[".gpu"])
# REPEATS (default 3) and RUNS (default "np1 np4 np4off np8 cuda scale transfer transfer_cuda") trim it
# to the time at hand.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. .gpu/env.sh
DEST=${OUT:-$PWD/gpu-figures}
mkdir -p "$DEST"
REPEATS=${REPEATS:-3}
BENCH=.gpu/bin/h5ckpt-bench
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$DEST/machine.txt" 2>&1
{ nproc; grep -m1 "model name" /proc/cpuinfo; df -h /tmp | tail -1; } >>"$DEST/machine.txt"
bench() {  # bench NAME RANKS ARGS...
  local name=$1 n=$2
  shift 2
  local t0=$SECONDS
  timeout -s KILL 240 $MPIRUN -np "$n" "$BENCH" --repeats "$REPEATS" --dir "/tmp/gpu-figures-$name" "$@" \
    >"$DEST/bench-$name.jsonl" 2>"$DEST/bench-$name.err"
  echo "$name: exit $? in $((SECONDS - t0)) s"
  rm -rf "/tmp/gpu-figures-$name"
}
for r in ${RUNS:-np1 np4 np4off np8 cuda scale transfer transfer_cuda}; do
  case $r in
    np1) bench np1 1 ;;
    np4) bench np4 4 --tp 2 --zero ;;
    np4off)  # the same with aggregated writes off: what they cost on a local NVMe disk
      (export H5CKPT_AGGREGATE_WRITES=off; MPIRUN="$MPIRUN -x H5CKPT_AGGREGATE_WRITES"; bench np4off 4 --tp 2 --zero) ;;
    np8) bench np8 8 --tp 2 --zero ;;
    cuda) bench cuda 1 --device cuda ;;
    transfer)  # live state between 2 sources and 2 destinations, host buffers, 1 GiB
      t0=$SECONDS
      timeout -s KILL 150 $MPIRUN -np 4 .gpu/bin/h5ckpt-transfer --mib 1024 --tensors 8 --repeats "$REPEATS" \
        >"$DEST/transfer.jsonl" 2>"$DEST/transfer.err"
      echo "transfer: exit $? in $((SECONDS - t0)) s" ;;
    transfer_cuda)  # the same between device buffers (1 source, 1 destination sharing the GPU)
      t0=$SECONDS
      timeout -s KILL 150 $MPIRUN -np 2 .gpu/bin/h5ckpt-transfer --mib 1024 --tensors 8 --repeats "$REPEATS" \
        --device cuda >"$DEST/transfer_cuda.jsonl" 2>"$DEST/transfer_cuda.err"
      echo "transfer_cuda: exit $? in $((SECONDS - t0)) s" ;;
    scale)
      if [[ -x .gpu/bin/h5ckpt-scale ]]; then
        t0=$SECONDS
        timeout -s KILL 120 .gpu/bin/h5ckpt-scale >"$DEST/scale.jsonl" 2>"$DEST/scale.err"
        echo "scale: exit $? in $((SECONDS - t0)) s"
      fi ;;
  esac
done
tail -qn1 "$DEST"/bench-*.jsonl "$DEST"/scale.jsonl "$DEST"/transfer*.jsonl 2>/dev/null | cut -c1-3000
