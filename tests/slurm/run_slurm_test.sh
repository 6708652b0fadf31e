#!/usr/bin/env bash
# Starts a real single-node Slurm (slurmctld + slurmd on localhost, auth/none, MpiDefault=pmix,
# 8 CPUs declared, OverSubscribe) in a temporary directory and runs the slurm/*.sbatch scripts
# through sbatch with small sizes:
#   1. train.sbatch   4 ranks tp2.pp1.dp2 + ZeRO to step 6 (saves at 3 and 6), sbatch --wait
#   2. resume.sbatch  2 ranks tp1.pp2.dp1, no ZeRO, async off through a config file, to an
#                     unreachable step; stopped by `scancel --signal=USR1 --batch` through the
#                     script's trap: the trainer checkpoints at the next step and exits 0
#   3. verify.sbatch  `h5ckpt verify` of the resumed checkpoint on 2 ranks, sbatch --wait;
#                     and of a copy with one flipped byte, which must fail
#   4. bench.sbatch   when h5ckpt-bench is built: a tiny run that must print its summary
# Usage: run_slurm_test.sh SOURCE_DIR H5CKPT_TRAIN H5CKPT_CLI [H5CKPT_BENCH]
# Exit 77 (skipped) when Slurm is not installed and cannot be, or the daemons cannot start.
set -uo pipefail
SRC=$1 TRAIN=$2 CLI=$3 BENCH=${4:-}
SKIP=77

say() { echo "slurm test: $*"; }
skip() { say "SKIPPED: $*"; exit $SKIP; }
fail() { say "FAILED: $*"; exit 1; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    say "installing slurm-wlm"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm) \
      >/dev/null 2>&1 || skip "apt-get install slurm-wlm failed"
  else
    skip "slurm-wlm is not installed (and we are not root with apt-get to install it)"
  fi
fi
# slurmd runs jobs as their user and needs root for that; auth/none also wants SlurmUser=root here.
[[ $(id -u) == 0 ]] || skip "a private slurmd needs root"

WORK=$(mktemp -d /tmp/h5ckpt-slurm.XXXXXX)
CTLD_PID="" SLURMD_PID=""
cleanup() {
  # Our daemons only, by pid; then their state.
  [[ -n $SLURMD_PID ]] && kill "$SLURMD_PID" 2>/dev/null
  [[ -n $CTLD_PID ]] && kill "$CTLD_PID" 2>/dev/null
  for p in $SLURMD_PID $CTLD_PID; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  if [[ ${KEEP_WORK:-0} == 1 ]]; then say "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

HOST=$(hostname -s)
read -r CTLD_PORT SLURMD_PORT < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
mkdir -p "$WORK"/{state,spool,jobs}
export SLURM_CONF=$WORK/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=h5ckpttest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmix
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

slurmctld -D -i -f "$SLURM_CONF" >"$WORK/slurmctld.out" 2>&1 &
CTLD_PID=$!
slurmd -D -f "$SLURM_CONF" -N "$HOST" >"$WORK/slurmd.out" 2>&1 &
SLURMD_PID=$!
up=0
for _ in $(seq 150); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qx idle; then up=1; break; fi
  sleep 0.2
done
if ((!up)); then
  tail -n 20 "$WORK"/slurmctld.log "$WORK"/slurmd.log "$WORK"/*.out 2>/dev/null
  skip "slurmctld/slurmd did not come up (node not idle within 30 s)"
fi
say "slurm up on $HOST (ports $CTLD_PORT/$SLURMD_PORT) in $WORK"

# task/none cannot bind CPUs: no --cpu-bind, rather than an srun warning on every job.
export H5CKPT_SLURM_DIR=$SRC/slurm H5CKPT_TRAIN=$TRAIN H5CKPT=$CLI CPU_BIND=
[[ -n $BENCH ]] && export H5CKPT_BENCH=$BENCH
CKPT=$WORK/ckpt
MODEL="--layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 256 --seed 11"

show_job() {  # the job's output, for the log
  echo "----- $1"
  cat "$1" 2>/dev/null
  echo "-----"
}
job_field() { scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -n1 | cut -d= -f2; }

# 1. train, waiting for the job; sbatch --wait exits with the job's exit status.
out=$WORK/jobs/train.out
CKPT_DIR=$CKPT TP=2 PP=1 STEPS=6 SAVE_EVERY=3 ZERO=1 TRAIN_ARGS="$MODEL" \
  sbatch --wait --ntasks=4 --nodes=1 --time=5 -o "$out" "$SRC/slurm/train.sbatch" >/dev/null
rc=$?
show_job "$out"
((rc == 0)) || fail "train.sbatch exited $rc"
[[ $(cat "$CKPT/latest" 2>/dev/null) == step-00000006 ]] || fail "after training, latest is not step-00000006"
grep -q "as tp2.pp1.dp2" "$out" || fail "train job did not run as tp2.pp1.dp2"

# 2. resume on another layout with a config file (sync saves), stopped by USR1 via the trap.
cat >"$WORK/h5ckpt.toml" <<'EOF'
[checkpointer]
async = false
io_threads = 1
[logging]
level = "info"
EOF
out=$WORK/jobs/resume.out
job=$(CKPT_DIR=$CKPT TP=1 PP=2 STEPS=100000000 SAVE_EVERY=0 ZERO=0 CONFIG=$WORK/h5ckpt.toml TRAIN_ARGS="$MODEL" \
  sbatch --parsable --ntasks=2 --nodes=1 --time=5 -o "$out" "$SRC/slurm/resume.sbatch") || fail "sbatch resume.sbatch"
job=${job%%;*}
# Wait until it has resumed and is training, then signal the batch shell as --signal=B:USR1 would.
for _ in $(seq 600); do grep -q "training to step" "$out" 2>/dev/null && break; sleep 0.1; done
grep -q "training to step" "$out" || { show_job "$out"; scancel "$job"; fail "resume job did not start training"; }
scancel --signal=USR1 --batch "$job" || fail "scancel --signal=USR1 --batch $job"
for _ in $(seq 600); do
  state=$(job_field "$job" JobState)
  [[ $state == COMPLETED || $state == FAILED || $state == CANCELLED || $state == TIMEOUT ]] && break
  sleep 0.2
done
show_job "$out"
[[ $state == COMPLETED ]] || { scancel "$job"; fail "resume job ended $state (exit $(job_field "$job" ExitCode))"; }
[[ $(job_field "$job" ExitCode) == 0:0 ]] || fail "resume job exit code $(job_field "$job" ExitCode)"
grep -q "resumed .*step-00000006 at step 6 (saved as tp2.pp1.dp2) as tp1.pp2.dp1" "$out" ||
  fail "resume job did not resume step 6 as tp1.pp2.dp1"
grep -q "SIGUSR1: asking the trainer" "$out" || fail "the batch script's trap did not run"
stopped=$(sed -n 's/.*stop requested (SIGUSR1) at step \([0-9]*\).*/\1/p' "$out")
[[ -n $stopped ]] && ((stopped > 6)) || fail "trainer did not report stopping on SIGUSR1 after step 6"
latest=$(printf 'step-%08d' "$stopped")
[[ $(cat "$CKPT/latest") == "$latest" ]] || fail "latest is $(cat "$CKPT/latest"), expected $latest"
grep -q "saved step $stopped -> .*s$" "$out" || fail "the config file's async = false was not applied"
grep -q "\[h5ckpt rank 0\] \[info\]" "$out" || fail "the config file's log level (info) did not reach the library"
[[ -f $CKPT/$latest.save.json ]] || fail "no save metrics beside $latest"

# 3. verify the resumed checkpoint on 2 ranks; a corrupted copy must fail.
out=$WORK/jobs/verify.out
CKPT=$CKPT sbatch --wait --ntasks=2 --nodes=1 --time=5 -o "$out" "$SRC/slurm/verify.sbatch" >/dev/null
rc=$?
show_job "$out"
((rc == 0)) || fail "verify.sbatch exited $rc on a good checkpoint"
BAD=$WORK/bad
mkdir -p "$BAD"
cp -r "$CKPT/$latest" "$BAD/"
python3 - "$BAD/$latest" <<'EOF' || fail "could not corrupt the copy"
import json, sys
# Flip one byte inside the first tensor with data, at its recorded file offset.
d = sys.argv[1]
meta = json.load(open(d + "/metadata.json"))
def tensors(m):
    t = m.get("tensors")
    return t.values() if isinstance(t, dict) else t
off = next(int(t["file_offset"]) for t in tensors(meta) if int(t.get("file_offset", -1)) >= 0
           and int(t.get("nbytes", 1)) > 0)
with open(d + "/data.h5", "r+b") as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0xFF]))
EOF
out=$WORK/jobs/verify-bad.out
CKPT=$BAD/$latest sbatch --wait --ntasks=2 --nodes=1 --time=5 -o "$out" "$SRC/slurm/verify.sbatch" >/dev/null
rc=$?
show_job "$out"
((rc != 0)) || fail "verify.sbatch passed a corrupted checkpoint"

# 4. the benchmark, when built.
if [[ -n $BENCH && -x $BENCH ]]; then
  out=$WORK/jobs/bench.out
  BENCH_DIR=$WORK/bench TP=2 BENCH_ARGS="--layers 1 --hidden 256 --ffn 512 --vocab 1024 --repeats 1 --no-drop-caches" \
    sbatch --wait --ntasks=2 --nodes=1 --time=5 -o "$out" "$SRC/slurm/bench.sbatch" >/dev/null
  rc=$?
  show_job "$out"
  ((rc == 0)) || fail "bench.sbatch exited $rc"
  grep -q '"scenario":"summary"' "$out" || fail "bench.sbatch printed no summary"
else
  say "h5ckpt-bench not built: bench.sbatch not run"
fi
say "PASS"
