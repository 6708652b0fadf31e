#!/usr/bin/env bash
# SIGSTOPs one rank of a job that publishes a new version every step (transfer_probe loop) and
# checks that the job ends by itself within timeout + 10 s, naming a transfer phase and the
# stopped rank, with a non-zero exit code.
#   sigstop_transfer.sh PROBE WORKDIR NP STOP_RANK MPIEXEC [MPIEXEC_FLAGS...]
set -u
probe=$1 work=$2 np=$3 stop_rank=$4 mpiexec=$5
shift 5
flags=("$@")
timeout_s=5
limit=$((timeout_s + 10))
rm -rf "$work"
mkdir -p "$work"
log=$work/job.log
fail=0

alive() {
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $st != Z* ]]
}
cleanup() {
  for f in "$work"/pids/rank-*; do
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

H5CKPT_TIMEOUT_S=$timeout_s "$mpiexec" -np "$np" "${flags[@]}" --timeout 150 "$probe" loop "$work" >"$log" 2>&1 &
job=$!
for _ in $(seq 1200); do
  [[ -f $work/ready && -s $work/pids/rank-$stop_rank ]] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.05
done
if [[ ! -f $work/ready || ! -s $work/pids/rank-$stop_rank ]]; then
  echo "FAIL: no first transfer or no pid file"
  cat "$log"
  exit 1
fi
pid=$(cat "$work/pids/rank-$stop_rank")
sleep 0.3  # inside a later transfer
kill -STOP "$pid"
stopped_at=$(date +%s%3N)
echo "stopped rank $stop_rank (pid $pid)"
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
if ! grep -Eq "timeout in transfer/[a-z]+: .*timeout_s=$timeout_s" "$log"; then
  echo "FAIL: no timeout message naming a transfer phase"
  fail=1
fi
if ! grep -Eq "did not arrive: ([0-9,]*,)?$stop_rank(,|;|[^0-9])" "$log"; then
  echo "FAIL: the timeout message does not name rank $stop_rank as missing"
  fail=1
fi
sleep 1
if alive "$pid"; then
  echo "FAIL: the stopped rank was not torn down with the job"
  fail=1
fi
echo "--- job output ---"
cat "$log"
[[ $fail -eq 0 ]] && rm -rf "$work"
exit $fail
