#!/usr/bin/env bash
# A rank lost inside the exchange of an aggregated (two-phase) write: its bytes are owed to other
# ranks' windows and theirs to its own. The trainer saves step 1 (TP2·ZeRO·DP2: row-split tensors,
# short runs, aggregated writes on), then resumes and saves step 2 with one rank
#   stop:  SIGSTOPped after posting its sends (H5CKPT_TEST_STOP_AT=aggregate_exchange:RANK): the
#          others must end the job by their deadline (timeout_s = 5), with the timeout message
#          naming the save phase and the missing rank;
#   kill:  SIGKILLed there (H5CKPT_TEST_KILL_AT): the job ends;
# and in both cases nothing is committed, `latest` still names step 1, which verifies, and the
# trainer resumes from it and saves step 2.
#   rank_lost_in_exchange.sh TRAIN CLI WORKDIR MODE(stop|kill) RANK MPIEXEC [MPIEXEC_FLAGS...]
set -u
train=$1 cli=$2 work=$3 mode=$4 rank=$5 mpiexec=$6
shift 6
flags=("$@")
timeout_s=5
rm -rf "$work"
mkdir -p "$work"
ckpt=$work/ckpt
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run STEPS [env...]: the trainer on 4 ranks
  local steps=$1
  shift
  env "$@" "$mpiexec" -np 4 "${flags[@]}" --timeout 60 "$train" --tp 2 --dp 2 --zero --steps "$steps" --save-every 1 \
    --ckpt-dir "$ckpt" --timeout-s "$timeout_s" --layers 2 --hidden 64 --heads 4 --kv-heads 4 --ffn 256 --vocab 512
}

run 1 >"$work/first.log" 2>&1 || { cat "$work/first.log"; fail "the first save failed"; }
[[ $(cat "$ckpt/latest") == step-00000001 ]] || fail "latest is not step 1 after the first save"

var=H5CKPT_TEST_KILL_AT
[[ $mode == stop ]] && var=H5CKPT_TEST_STOP_AT
t0=$(date +%s%3N)
run 2 "$var=aggregate_exchange:$rank" H5CKPT_LOG_LEVEL=info >"$work/lost.log" 2>&1 &
job=$!
wait "$job"
rc=$?
took_ms=$(($(date +%s%3N) - t0))
# Whatever the abort missed is killed here (a stopped rank must not outlive the test).
pkill -KILL -f "$ckpt" 2>/dev/null
cat "$work/lost.log"
echo "job ended with exit code $rc after $((took_ms / 1000)) s"
((rc != 0)) || fail "the job exited 0 although rank $rank was lost in the exchange"
grep -q "rank $rank $( [[ $mode == stop ]] && echo stops || echo kills) itself" "$work/lost.log" ||
  fail "the exchange point was not reached (no aggregated write?)"
if [[ $mode == stop ]]; then
  ((took_ms < (timeout_s + 25) * 1000)) || fail "the job took $((took_ms / 1000)) s to end (timeout_s = $timeout_s)"
  grep -Eq "timeout in save[a-z_]*/[a-z_]+: .*timeout_s=$timeout_s" "$work/lost.log" ||
    fail "no timeout message naming the save phase"
  grep -Eq "did not arrive: ([0-9,]*,)?$rank(,|;)" "$work/lost.log" || fail "the timeout message does not name rank $rank"
fi
[[ $(cat "$ckpt/latest") == step-00000001 ]] || fail "latest is '$(cat "$ckpt/latest")', not step 1"
[[ ! -e $ckpt/step-00000002 ]] || fail "step 2 was committed although a rank was lost in its save"
"$cli" verify "$ckpt" >"$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "h5ckpt verify after the loss"; }
grep -q "step-00000001" "$work/verify.log" || fail "verify did not select step 1"
run 2 >"$work/resume.log" 2>&1 || { cat "$work/resume.log"; fail "the resume after the loss failed"; }
grep -q "resumed .*step-00000001 at step 1" "$work/resume.log" || { cat "$work/resume.log"; fail "did not resume from step 1"; }
[[ $(cat "$ckpt/latest") == step-00000002 ]] || fail "the resumed job did not commit step 2"
echo "passed"
rm -rf "$work"
