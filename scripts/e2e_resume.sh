#!/usr/bin/env bash
# End-to-end resume check: train under layout A to step SPLIT, resume under layout B to step
# STEPS, train a reference under layout REF to STEPS without interruption, then require
#   - model/ and optimizer/ datasets of both final checkpoints bit-identical (h5ckpt-train
#     --compare, and h5diff on /model and /optimizer when the shapes agree),
#   - every data-loader sample consumed exactly once in both runs (ledger + loader state),
#   - the checkpoint at SPLIT different from the final one (training really moved the state).
#
# usage: e2e_resume.sh TRAIN_EXE MPIEXEC WORKDIR LAYOUT_A LAYOUT_B LAYOUT_REF [extra trainer args...]
#   LAYOUT: tp<N>.pp<N>.dp<N>[.cp<N>][.ep<N>][.zero][@<nodes>x<ranks per node>], e.g. tp2.pp2.dp2.zero,
#   tp1.pp1.dp2.cp2.ep2 (tp*pp*dp*cp ranks; ep splits the experts of --experts inside dp*cp) or
#   tp2.pp2.dp4.zero@4x4 (runs on the simulated cluster of scripts/cluster.sh: 4 nodes x 4 ranks;
#   @2x1+3: 2 nodes x 1 rank starting at node-3, other nodes than a job on node-1 and node-2)
# env: H5CKPT_MPIEXEC_PREFLAGS (space separated, e.g. "--oversubscribe --allow-run-as-root"),
#      E2E_SPLIT (default 6), E2E_STEPS (default 12), H5DIFF (default h5diff; "none" skips it),
#      E2E_TIMEOUT (seconds per training run, default 200),
#      E2E_CLUSTER_ARGS: more scripts/cluster.sh options for the @ layouts (space separated, e.g.
#      "--shared DIR/mnt --shared-volume DIR" for a GlusterFS volume of scripts/gluster.sh),
#      E2E_NODES=split: run @NODESxRPN layouts under plain mpirun with H5CKPT_RANKS_PER_NODE=RPN
#      (nodes cut out of this machine's one node: same leaders and tree, no namespaces or TCP),
#      E2E_CRASH_AT=latest::2: phase 1 dies between the commit of step SPLIT and the `latest` update
#      (H5CKPT_TEST_CRASH_AT); phase 2 must resume from the save before (SPLIT - 3) and re-save
#      step SPLIT over the committed copy
# Exit 77 (skipped) when a layout asks for the simulated cluster and this machine cannot host it.
set -euo pipefail

if [[ $# -lt 6 ]]; then
  sed -n '2,15p' "$0" >&2
  exit 2
fi
EXE=$1 MPIEXEC=$2 WORK=$3 LA=$4 LB=$5 LR=$6
shift 6
EXTRA=("$@")
SPLIT=${E2E_SPLIT:-6}
STEPS=${E2E_STEPS:-12}
H5DIFF=${H5DIFF:-h5diff}
TIMEOUT=${E2E_TIMEOUT:-200}
CLUSTER=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh
read -r -a PRE <<<"${H5CKPT_MPIEXEC_PREFLAGS:-}"
read -r -a CLUSTER_ARGS <<<"${E2E_CLUSTER_ARGS:-}"
# A small model (a few MB) so that a case takes seconds; kv-heads 4 allows tp up to 4.
MODEL=(--layers 4 --hidden 64 --heads 8 --kv-heads 4 --ffn 128 --vocab 256 --seed 7)

fail() { echo "e2e FAIL: $*" >&2; exit 1; }

# layout tag -> "N --tp a --pp b --dp c [--cp d] [--ep e] [--zero]"
layout() {
  local tag=$1 tp=1 pp=1 dp=1 cp=1 ep=1 zero="" more=""
  IFS=. read -r -a parts <<<"$tag"
  for p in "${parts[@]}"; do
    case $p in
      tp*) tp=${p#tp} ;; pp*) pp=${p#pp} ;; dp*) dp=${p#dp} ;; cp*) cp=${p#cp} ;; ep*) ep=${p#ep} ;;
      zero) zero=--zero ;;
      *) fail "bad layout '$tag'" ;;
    esac
  done
  ((cp != 1)) && more+=" --cp $cp"
  ((ep != 1)) && more+=" --ep $ep"
  echo "$((tp * pp * dp * cp)) --tp $tp --pp $pp --dp $dp$more $zero"
}

run() {  # run N args...
  local n=$1
  shift
  "$MPIEXEC" -n "$n" "${PRE[@]}" --timeout "$TIMEOUT" "$EXE" "$@"
}

run_on_cluster() {  # run_on_cluster NODESxRPN[+FIRST] N args...: N ranks on the simulated cluster
  local shape=${1%+*} first=1 n=$2 nodes rpn rc=0
  [[ $1 == *+* ]] && first=${1#*+}
  shift 2
  nodes=${shape%x*} rpn=${shape#*x}
  [[ $first =~ ^[1-9][0-9]*$ ]] || fail "bad first node in '$shape+$first'"
  [[ $nodes =~ ^[0-9]+$ && $rpn =~ ^[0-9]+$ ]] || fail "bad cluster shape '$shape' (expected NODESxRANKS)"
  ((nodes * rpn == n)) || fail "cluster shape $shape gives $((nodes * rpn)) ranks, the layout needs $n"
  if [[ ${E2E_NODES:-} == split ]]; then
    H5CKPT_RANKS_PER_NODE=$rpn run "$n" "$@"
    return
  fi
  "$CLUSTER" --nodes "$nodes" --ranks-per-node "$rpn" --first-node "$first" --timeout "$TIMEOUT" "${CLUSTER_ARGS[@]}" \
    -- "$EXE" "$@" || rc=$?
  if ((rc == 125)); then
    echo "e2e SKIPPED: this machine cannot host the simulated cluster (see the message above)"
    exit 77
  fi
  return "$rc"
}

train() {  # train LAYOUT[@NODESxRPN] CKPT LEDGER STEPS SAVE_EVERY
  local tag=${1%@*} shape="" spec
  [[ $1 == *@* ]] && shape=${1#*@}
  read -r -a spec <<<"$(layout "$tag")"
  local args=("${spec[@]:1}" "${MODEL[@]}" "${EXTRA[@]}" --ckpt-dir "$2" --ledger "$3"
              --steps "$4" --save-every "$5" --report "$WORK/report.jsonl")
  if [[ -n $shape ]]; then
    run_on_cluster "$shape" "${spec[0]}" "${args[@]}"
  else
    run "${spec[0]}" "${args[@]}"
  fi
}

rm -rf "$WORK"
mkdir -p "$WORK"
CHAIN=$WORK/chain REF=$WORK/ref

echo "== phase 1: $LA to step $SPLIT"
RESUME_AT=$SPLIT
if [[ -n ${E2E_CRASH_AT:-} ]]; then
  out=$(H5CKPT_TEST_CRASH_AT=$E2E_CRASH_AT train "$LA" "$CHAIN" "$WORK/chain.ledger" "$SPLIT" 3 2>&1) &&
    fail "phase 1 succeeded although H5CKPT_TEST_CRASH_AT=$E2E_CRASH_AT"
  echo "$out" | tail -5
  grep -q "H5CKPT_TEST_CRASH_AT=$E2E_CRASH_AT: exiting" <<<"$out" || fail "phase 1 did not die at $E2E_CRASH_AT"
  RESUME_AT=$((SPLIT - 3))
  crashed=$CHAIN/$(printf 'step-%08d' "$SPLIT")
  [[ -f $crashed/metadata.json ]] || fail "$crashed was not committed before the crash"
  [[ $(cat "$CHAIN/latest") == "$(printf 'step-%08d' "$RESUME_AT")" ]] ||
    fail "'latest' names $(cat "$CHAIN/latest"), expected the save before the crash (step $RESUME_AT)"
  echo "step $SPLIT committed, 'latest' still names step $RESUME_AT"
else
  train "$LA" "$CHAIN" "$WORK/chain.ledger" "$SPLIT" 3
fi
echo "== phase 2: $LB resumes to step $STEPS"
out=$(train "$LB" "$CHAIN" "$WORK/chain.ledger" "$STEPS" 3)
echo "$out"
grep -q "resumed .* at step $RESUME_AT" <<<"$out" || fail "phase 2 did not resume from step $RESUME_AT"
echo "== reference: $LR, uninterrupted to step $STEPS"
train "$LR" "$REF" "$WORK/ref.ledger" "$STEPS" 0

final_chain=$CHAIN/$(cat "$CHAIN/latest")
final_ref=$REF/$(cat "$REF/latest")
[[ $(basename "$final_chain") == "$(basename "$final_ref")" ]] || fail "final steps differ: $final_chain vs $final_ref"

echo "== compare final checkpoints (library reader, every model/ and optimizer/ dataset)"
run 1 --compare "$final_chain" "$final_ref" || fail "final checkpoints differ"

if [[ $H5DIFF != none ]]; then
  echo "== h5diff /model and /optimizer"
  for g in /model /optimizer; do
    if ! "$H5DIFF" -q "$final_chain/data.h5" "$final_ref/data.h5" "$g" "$g"; then
      fail "h5diff reports differences in $g"
    fi
  done
  echo "h5diff: /model and /optimizer identical"
fi

echo "== sanity: the checkpoint at step $SPLIT must differ from the final one"
if run 1 --quiet --compare "$CHAIN/$(printf 'step-%08d' "$SPLIT")" "$final_ref" >/dev/null 2>&1; then
  fail "step $SPLIT and step $STEPS are identical: training did not change the state"
fi

echo "== exactly-once: resumed chain and reference"
run 1 --verify-ledger "$WORK/chain.ledger" --ckpt-dir "$CHAIN" || fail "chain ledger"
run 1 --verify-ledger "$WORK/ref.ledger" --ckpt-dir "$REF" || fail "reference ledger"
echo "e2e PASS: $LA -> $LB == $LR at step $STEPS ${EXTRA[*]}"
