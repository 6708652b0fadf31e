#!/usr/bin/env bash
# A run resuming with another vocabulary size is refused with a message that says so (padding
# for another TP size is the only shape change a resume accepts), and the checkpoint survives.
# usage: refuse_other_vocab.sh TRAIN_EXE MPIEXEC WORKDIR
set -euo pipefail
EXE=$1 MPIEXEC=$2 WORK=$3
read -r -a PRE <<<"${H5CKPT_MPIEXEC_PREFLAGS:-}"
rm -rf "$WORK" && mkdir -p "$WORK"
MODEL=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --seed 3)
run() { "$MPIEXEC" -n "$1" "${PRE[@]}" --timeout 120 "$EXE" "${@:2}"; }
run 2 --tp 2 "${MODEL[@]}" --vocab 250 --steps 2 --save-every 2 --ckpt-dir "$WORK/ckpt" >"$WORK/save.log" 2>&1
# Another TP size pads 250 to another multiple: accepted.
run 1 --tp 1 "${MODEL[@]}" --vocab 250 --steps 3 --save-every 100 --ckpt-dir "$WORK/ckpt" >"$WORK/ok.log" 2>&1 ||
  { cat "$WORK/ok.log"; echo "FAIL: resuming with the same vocabulary under tp 1 failed"; exit 1; }
# Another vocabulary (252 rows either way under tp 4 vs tp 2 padding of 250): refused.
if run 1 --tp 1 "${MODEL[@]}" --vocab 240 --steps 3 --save-every 100 --ckpt-dir "$WORK/ckpt" >"$WORK/bad.log" 2>&1; then
  cat "$WORK/bad.log"; echo "FAIL: a resume with another vocabulary size was accepted"; exit 1
fi
grep -q "trained with a vocabulary of 250 tokens, this run has 240" "$WORK/bad.log" ||
  { cat "$WORK/bad.log"; echo "FAIL: the refusal does not say why"; exit 1; }
echo "refused as expected: $(grep -o 'trained with a vocabulary[^"]*' "$WORK/bad.log" | head -1)"
