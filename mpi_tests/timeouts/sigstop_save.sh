#!/usr/bin/env bash
# SIGSTOPs one rank in the middle of a save and checks that the job ends by itself within the
# timeout + 10 s with the timeout message, and that the checkpoint `latest` names is complete:
# `h5ckpt verify` passes and a load on 2 ranks finds every value.
#   sigstop_save.sh PROBE CLI WORKDIR NP STOP_RANK ASYNC(0|1) MPIEXEC [MPIEXEC_FLAGS...]
# env: SIGSTOP_PHASE_RE, the phases the timeout message may name (default: a save's); H5CKPT_*
# settings reach the job and the load (e.g. a local level: the load then reads the newest level).
set -u
probe=$1 cli=$2 work=$3 np=$4 stop_rank=$5 async=$6 mpiexec=$7
shift 7
flags=("$@")
timeout_s=5
limit=$((timeout_s + 10))
rm -rf "$work"
mkdir -p "$work"
ckpt=$work/ckpt
log=$work/job.log
fail=0
pids=()

# Alive: exists and is not a zombie waiting to be reaped.
alive() {
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $st != Z* ]]
}

cleanup() {
  # Nothing may outlive the test: a stopped rank that the abort missed is killed here.
  for f in "$ckpt"/pids/rank-*; do
    [[ -f $f ]] || continue
    p=$(cat "$f")
    if alive "$p"; then
      echo "note: rank pid $p still alive after the job; killing it"
      kill -KILL "$p" 2>/dev/null
    fi
  done
  [[ -n ${job:-} ]] && kill -0 "$job" 2>/dev/null && kill -KILL "$job" 2>/dev/null
}
trap cleanup EXIT

H5CKPT_TIMEOUT_S=$timeout_s H5CKPT_ASYNC=$async H5CKPT_METRICS=0 \
  "$mpiexec" -np "$np" "${flags[@]}" --timeout 150 "$probe" save-loop "$ckpt" >"$log" 2>&1 &
job=$!

# Wait for the first commit and the pid of the rank to stop.
for _ in $(seq 1200); do
  [[ -f $ckpt/latest && -s $ckpt/pids/rank-$stop_rank ]] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.05
done
if [[ ! -f $ckpt/latest || ! -s $ckpt/pids/rank-$stop_rank ]]; then
  echo "FAIL: no committed checkpoint or pid file appeared"
  cat "$log"
  exit 1
fi
pid=$(cat "$ckpt/pids/rank-$stop_rank")

# Stop it in the write phase of a later save: when one of its threads is in a pwrite64 (x86-64
# syscall 18) of at least 1 MiB, a tensor piece (HDF5's own metadata writes are small), its peers
# are past every collective HDF5 call of the save and wait for it in the write agreement. If that
# is not seen within 20 s, stop it wherever it is.
where="anywhere (no tensor write seen)"
deadline=$(($(date +%s) + 20))
while (($(date +%s) < deadline)); do
  for f in /proc/"$pid"/task/*/syscall; do
    { read -r nr _ _ count _ <"$f"; } 2>/dev/null || continue
    if [[ $nr == 18 ]] && ((count >= 1 << 20)); then
      where="in a pwrite64 of $((count)) bytes"
      break 2
    fi
  done
done
latest_before=$(cat "$ckpt/latest")
kill -STOP "$pid"
stopped_at=$(date +%s%3N)
echo "stopped rank $stop_rank (pid $pid) $where; latest was $latest_before"

wait "$job"
rc=$?
took_ms=$(($(date +%s%3N) - stopped_at))
echo "job ended with exit code $rc, $((took_ms / 1000)).$(printf %03d $((took_ms % 1000))) s after the stop"
if [[ $rc -eq 0 ]]; then
  echo "FAIL: the job exited 0"
  fail=1
fi
if ((took_ms > limit * 1000)); then
  echo "FAIL: the job took longer than timeout + 10 s = ${limit} s to end"
  fail=1
fi
if ! grep -Eq "timeout in ${SIGSTOP_PHASE_RE:-save(_async)?/[a-z]+}: .*timeout_s=$timeout_s" "$log"; then
  echo "FAIL: no timeout message naming the save phase"
  fail=1
fi
if ! grep -Eq "did not arrive: ([0-9,]*,)?$stop_rank(,|;)" "$log"; then
  echo "FAIL: the timeout message does not name rank $stop_rank as missing"
  fail=1
fi
sleep 1  # the job's end reaps its ranks
if alive "$pid"; then
  echo "FAIL: the stopped rank was not torn down with the job"
  fail=1
fi
cleanup

latest=$(cat "$ckpt/latest")
echo "latest names $latest"
if ! "$cli" verify "$ckpt" >"$work/verify.log" 2>&1; then
  echo "FAIL: h5ckpt verify $ckpt"
  cat "$work/verify.log"
  fail=1
fi
if ! "$mpiexec" -np 2 "${flags[@]}" --timeout 120 "$probe" load "$ckpt" "$np" >"$work/load.log" 2>&1; then
  echo "FAIL: loading $ckpt"
  fail=1
fi
cat "$work/load.log"
echo "--- job output ---"
cat "$log"
[[ $fail -eq 0 ]] && rm -rf "$work"
exit $fail
