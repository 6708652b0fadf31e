#!/usr/bin/env bash
# Multi-level checkpoints end to end, on the simulated cluster (scripts/cluster.sh: 4 nodes x 2
# ranks, each node with its own private local disk) or on nodes cut out of this machine
# (E2E_NODES=split: H5CKPT_RANKS_PER_NODE=2 and one local directory per node).
#
# The job, TP2.DP4 with ZeRO, saves locally every step (one partner copy per node) and persists
# every 4th step to the shared directory. After each scenario the run ends at step 8, and its
# final checkpoint must be bit-identical (every model/ and optimizer/ dataset) to an uninterrupted
# run's, with every data-loader sample consumed exactly once.
#
# usage: e2e_multilevel.sh TRAIN_EXE MPIEXEC WORKDIR SCENARIOS
#   SCENARIOS: "levels" (lost node -> partner copies; two lost partners -> shared level;
#   another layout from the local level), "kills" (kill -9 of a rank during a local save,
#   while nodes commit, and during a persist) or "moe" (expert, context and fused layouts
#   resumed from the local level under another layout and node count).
# env: H5CKPT_MPIEXEC_PREFLAGS, E2E_TIMEOUT (seconds per run, default 200), E2E_NODES.
# Exit 77 (skipped) when the simulated cluster cannot be hosted here.
set -euo pipefail

[[ $# -eq 4 ]] || { sed -n '2,17p' "$0" >&2; exit 2; }
EXE=$1 MPIEXEC=$2 WORK=$3 WHAT=$4
TIMEOUT=${E2E_TIMEOUT:-200}
CLUSTER=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh
read -r -a PRE <<<"${H5CKPT_MPIEXEC_PREFLAGS:-}"
MODEL=(--layers 4 --hidden 64 --heads 8 --kv-heads 4 --ffn 128 --vocab 256 --seed 7)
NODES=4 RPN=2
DISKS=$WORK/disks
SPLIT=$([[ ${E2E_NODES:-} == split ]] && echo 1 || echo 0)

fail() { echo "e2e-multilevel FAIL: $*" >&2; exit 1; }
disk() { if ((SPLIT)); then echo "$DISKS/n$1"; else echo "$DISKS/node-$(($1 + 1))"; fi; }  # node index -> disk
step() { printf 'step-%08d' "$1"; }

# on_cluster NODES RPN args...: one job of NODES x RPN ranks, each node seeing its own disk.
on_cluster() {
  local nodes=$1 rpn=$2 rc=0
  shift 2
  if ((SPLIT)); then
    H5CKPT_RANKS_PER_NODE=$rpn "$MPIEXEC" -n $((nodes * rpn)) "${PRE[@]}" --timeout "$TIMEOUT" "$EXE" "$@" \
      --local-dir "$DISKS/n{node}" || rc=$?
    return "$rc"
  fi
  local env=()
  [[ -n ${H5CKPT_TEST_KILL_AT:-} ]] && env=(--env H5CKPT_TEST_KILL_AT)
  "$CLUSTER" --nodes "$nodes" --ranks-per-node "$rpn" --node-local /h5ckpt-local --node-disks "$DISKS" \
    --timeout "$TIMEOUT" "${env[@]}" -- "$EXE" "$@" --local-dir /h5ckpt-local || rc=$?
  if ((rc == 125)); then
    echo "e2e-multilevel SKIPPED: this machine cannot host the simulated cluster (see above)"
    exit 77
  fi
  return "$rc"
}
one() { "$MPIEXEC" -n 1 "${PRE[@]}" --timeout "$TIMEOUT" "$EXE" "$@"; }

# train NODES RPN STEPS args...: the chain job (local level every step, persist every 4).
train() {
  local nodes=$1 rpn=$2 steps=$3
  shift 3
  on_cluster "$nodes" "$rpn" "${MODEL[@]}" --ckpt-dir "$WORK/chain" --ledger "$WORK/chain.ledger" \
    --steps "$steps" --save-every 1 --persist-every 4 --report "$WORK/report.jsonl" "$@"
}
A=(--tp 2 --pp 1 --dp 4 --zero)

check_final() {  # the chain's step 8 against the reference, and exactly-once
  [[ $(cat "$WORK/chain/latest") == "$(step 8)" ]] || fail "$1: the shared level does not end at step 8"
  one --compare "$WORK/chain/$(step 8)" "$WORK/ref/$(step 8)" || fail "$1: final checkpoints differ"
  one --verify-ledger "$WORK/chain.ledger" --ckpt-dir "$WORK/chain" || fail "$1: exactly-once"
  echo "== $1: bit-identical to the uninterrupted run, every sample once"
}

# Phase A: steps 1..6 from scratch, saved state kept aside so every scenario starts from it.
phase_a() {
  rm -rf "$WORK/chain" "$WORK/chain.ledger" "$DISKS"
  mkdir -p "$DISKS"
  train $NODES $RPN 6 "${A[@]}" "$@"
}
keep_state() { rm -rf "$WORK/saved"; mkdir -p "$WORK/saved"; cp -a "$WORK/chain" "$WORK/chain.ledger" "$DISKS" "$WORK/saved/"; }
restore_state() {
  rm -rf "$WORK/chain" "$WORK/chain.ledger" "$DISKS"
  cp -a "$WORK/saved/chain" "$WORK/saved/chain.ledger" "$WORK/saved/disks" "$WORK/"
}

rm -rf "$WORK"
mkdir -p "$WORK"
echo "== reference: TP2.DP4.zero on one node, uninterrupted to step 8, shared level only"
"$MPIEXEC" -n 8 "${PRE[@]}" --timeout "$TIMEOUT" "$EXE" "${A[@]}" "${MODEL[@]}" --ckpt-dir "$WORK/ref" \
  --ledger "$WORK/ref.ledger" --steps 8 --save-every 0 >/dev/null

case $WHAT in
levels)
  echo "== phase A: 4 nodes x 2 ranks to step 6 (local every step, persist every 4)"
  phase_a
  [[ $(cat "$WORK/chain/latest") == "$(step 4)" ]] || fail "the shared level should end at step 4"
  for n in 0 1 2 3; do
    [[ -f $(disk $n)/$(step 6)/manifest.bin && -d $(disk $n)/$(step 5) ]] || fail "node $n lacks local steps 5 and 6"
    [[ ! -e $(disk $n)/$(step 4) ]] || fail "node $n keeps step 4: local retention (2) not applied"
  done
  keep_state

  echo "== scenario 1: node 2 replaced (empty local disk); resume in the same layout"
  rm -rf "$(disk 2)"
  out=$(train $NODES $RPN 8 "${A[@]}") || fail "scenario 1 run"
  echo "$out" | grep -E "resum|level" || true
  grep -q "resuming from the local level" <<<"$out" || fail "scenario 1 did not resume from the local level"
  grep -q "resumed .* at step 6" <<<"$out" || fail "scenario 1 did not resume at step 6"
  check_final "scenario 1"

  echo "== scenario 2: nodes 0 and 1 lost (node 1 held node 0's copy); falls back to the shared level"
  restore_state
  rm -rf "$(disk 0)" "$(disk 1)"
  out=$(train $NODES $RPN 8 "${A[@]}") || fail "scenario 2 run"
  echo "$out" | grep -E "resum|level" || true
  grep -q "resuming from the shared level" <<<"$out" || fail "scenario 2 did not fall back to the shared level"
  grep -q "ranks 0,1 (saved on node 0)" <<<"$out" || fail "scenario 2's message does not name the missing pieces"
  grep -q "resumed .* at step 4" <<<"$out" || fail "scenario 2 did not resume at step 4"
  check_final "scenario 2"

  echo "== scenario 3: resume under TP4.DP2 (4 nodes x 2 ranks) from the local level"
  restore_state
  out=$(train $NODES $RPN 8 --tp 4 --pp 1 --dp 2 --zero) || fail "scenario 3 run"
  echo "$out" | grep -E "resum|level" || true
  grep -q "resuming from the local level" <<<"$out" || fail "scenario 3 did not resume from the local level"
  grep -q "resumed .* at step 6" <<<"$out" || fail "scenario 3 did not resume at step 6"
  check_final "scenario 3"
  ;;
kills)
  # kill -9 of one rank at a point of the nth save; the job dies; the next run resumes from the
  # newest checkpoint that is complete and must end bit-identical.
  kill_case() {  # name point rank nth expected-resume-steps...
    local name=$1 point=$2 rank=$3 nth=$4
    shift 4
    echo "== $name: H5CKPT_TEST_KILL_AT=$point:$rank:$nth"
    rm -rf "$WORK/chain" "$WORK/chain.ledger" "$DISKS"
    mkdir -p "$DISKS"
    if H5CKPT_TEST_KILL_AT=$point:$rank:$nth train $NODES $RPN 6 "${A[@]}" >"$WORK/$name.log" 2>&1; then
      fail "$name: the job survived the kill"
    fi
    grep -q "kills itself" "$WORK/$name.log" || fail "$name: the kill point was not reached"
    out=$(train $NODES $RPN 8 "${A[@]}") || fail "$name: the resumed run"
    echo "$out" | grep -E "resum|level" || true
    local ok=0 s
    for s in "$@"; do grep -q "resumed .* at step $s" <<<"$out" && ok=1; done
    ((ok)) || fail "$name: did not resume at one of steps $*"
    check_final "$name"
  }
  kill_case kill_in_local_save local_replica 3 6 5   # step 6 never committed: step 5 is the newest
  kill_case kill_in_local_commit local_commit 2 6 5 6  # some nodes renamed, some not
  kill_case kill_in_persist persist_write 5 1 4      # step 4: local committed, shared not
  ;;
moe)
  # Expert, context and fused-SwiGLU layouts through the local level, each resumed under another
  # layout and node count (tiny model; reference: the same model uninterrupted on 2 ranks).
  TINY=(--layers 2 --hidden 16 --heads 4 --kv-heads 2 --ffn 32 --vocab 37 --seed 7)
  moe_case() {  # name flags(reference) save-shape save-flags resume-shape resume-flags
    local name=$1 ref=$2 s_shape=$3 s_flags=$4 r_shape=$5 r_flags=$6
    echo "== $name"
    rm -rf "$WORK/chain" "$WORK/chain.ledger" "$WORK/ref" "$WORK/ref.ledger" "$DISKS"
    mkdir -p "$DISKS"
    # shellcheck disable=SC2086
    "$MPIEXEC" -n 2 "${PRE[@]}" --timeout "$TIMEOUT" "$EXE" ${ref} "${TINY[@]}" --ckpt-dir "$WORK/ref" \
      --ledger "$WORK/ref.ledger" --steps 4 --save-every 0 >/dev/null
    # shellcheck disable=SC2086
    on_cluster ${s_shape/x/ } "${TINY[@]}" ${s_flags} --ckpt-dir "$WORK/chain" --ledger "$WORK/chain.ledger" \
      --steps 3 --save-every 1 --persist-every 4 >/dev/null || fail "$name: first run"
    # shellcheck disable=SC2086
    out=$(on_cluster ${r_shape/x/ } "${TINY[@]}" ${r_flags} --ckpt-dir "$WORK/chain" --ledger "$WORK/chain.ledger" \
      --steps 4 --save-every 1 --persist-every 4) || fail "$name: resumed run"
    echo "$out" | grep -E "resum" || true
    grep -q "resuming from the local level" <<<"$out" || fail "$name: not resumed from the local level"
    grep -q "resumed .* at step 3" <<<"$out" || fail "$name: did not resume at step 3"
    one --compare "$WORK/chain/$(step 4)" "$WORK/ref/$(step 4)" || fail "$name: final checkpoints differ"
    one --verify-ledger "$WORK/chain.ledger" --ckpt-dir "$WORK/chain" || fail "$name: exactly-once"
    echo "== $name: bit-identical, every sample once"
  }
  MOE="--experts 4 --moe-every 2 --swiglu --zero"
  moe_case "EP2.TP2 (2 nodes x 2) -> EP4.TP1 (4 nodes x 1), fused SwiGLU, ZeRO" "--tp 2 $MOE" \
    2x2 "--tp 2 --dp 2 --ep 2 $MOE" 4x1 "--tp 1 --dp 4 --ep 4 $MOE"
  moe_case "CP2.DP2 (2 nodes x 2) -> DP4 (2 nodes x 2), ZeRO" "--tp 2 --zero" \
    2x2 "--cp 2 --dp 2 --zero" 2x2 "--dp 4 --zero"
  ;;
*) fail "unknown scenarios '$WHAT' (levels, kills or moe)" ;;
esac
echo "e2e-multilevel PASS: $WHAT"
