#!/usr/bin/env bash
# Starts a real Slurm in a temporary directory (slurmctld + slurmd on localhost, auth/none,
# MpiDefault=pmix, OverSubscribe): node <hostname> with 8 CPUs for the single-node jobs, and in a
# partition "two" the nodes n1 and n2: two more slurmd on this host (`slurmd -N`, each on its own
# port, each in its own UTS namespace named n1 / n2 where unshare works), for a real two-node job:
#   0. two nodes  `srun -p two -N 2 -n 4`: SLURM_NODEID 0 and 1 with two tasks each, on n1 and n2,
#                 SLURM_JOB_NUM_NODES=2 everywhere; with the cluster probe (H5CKPT_CLUSTER_PROBE,
#                 set by CTest): MPI over PMIx across the two slurmd, one MPI_COMM_TYPE_SHARED
#                 communicator per node, messages between them
# then runs the slurm/*.sbatch scripts on the single node through sbatch with small sizes:
#   1. train.sbatch   4 ranks tp2.pp1.dp2 + ZeRO to step 6 (saves at 3 and 6), sbatch --wait
#   2. resume.sbatch  2 ranks tp1.pp2.dp1, no ZeRO, async off through a config file, to an
#                     unreachable step; stopped by `scancel --signal=USR1 --batch` through the
#                     script's trap: the trainer checkpoints at the next step and exits 0
#   3. verify.sbatch  `h5ckpt verify` of the resumed checkpoint on 2 ranks, sbatch --wait;
#                     and of a copy with one flipped byte, which must fail
#   4. bench.sbatch   when h5ckpt-bench is built: a tiny run that must print its summary
# Usage: run_slurm_test.sh SOURCE_DIR H5CKPT_TRAIN H5CKPT_CLI [H5CKPT_BENCH]
#        H5CKPT_SLURM_TWO_NODES_ONLY=1 run_slurm_test.sh SOURCE_DIR   (only step 0)
# Exit 77 (skipped) when Slurm is not installed and cannot be, or the daemons cannot start.
set -uo pipefail
SRC=$1 TRAIN=${2:-} CLI=${3:-} BENCH=${4:-}
SKIP=77

say() { echo "slurm test: $*"; }
skip() { say "SKIPPED: $*"; exit $SKIP; }
fail() { say "FAILED: $*"; exit 1; }
if [[ ${H5CKPT_SLURM_TWO_NODES_ONLY:-0} != 1 && ( -z $TRAIN || -z $CLI ) ]]; then
  fail "usage: run_slurm_test.sh SOURCE_DIR H5CKPT_TRAIN H5CKPT_CLI [H5CKPT_BENCH]"
fi

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
CTLD_PID="" SLURMD_PIDS=()
cleanup() {
  # Our daemons only, by pid; then their state.
  for p in "${SLURMD_PIDS[@]}" $CTLD_PID; do kill "$p" 2>/dev/null; done
  for p in "${SLURMD_PIDS[@]}" $CTLD_PID; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  if [[ ${KEEP_WORK:-0} == 1 ]]; then say "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

HOST=$(hostname -s)
read -r CTLD_PORT SLURMD_PORT N1_PORT N2_PORT < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(4)]
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
SlurmdSpoolDir=$WORK/spool/%n
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd-%n.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd-%n.log
# Per node: the PMIx plugin makes its client directory (spmix_appdir_<uid>_<job>.<step>) under
# TmpFS, which would collide between the slurmd of n1 and n2 (File exists) in a shared /tmp.
TmpFS=$WORK/tmp/%n
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
# Two more nodes on this host (Debian's slurmd is built with multiple-slurmd: -N picks the node).
NodeName=n1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$N1_PORT CPUs=4 RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$N2_PORT CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=two Nodes=n1,n2 Default=NO MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
for n in "$HOST" n1 n2; do mkdir -p "$WORK/spool/$n" "$WORK/tmp/$n"; done

slurmctld -D -i -f "$SLURM_CONF" >"$WORK/slurmctld.out" 2>&1 &
CTLD_PID=$!
slurmd -D -f "$SLURM_CONF" -N "$HOST" >"$WORK/slurmd-$HOST.out" 2>&1 &
SLURMD_PIDS+=($!)
# n1 and n2 each in a UTS namespace named after the node, so that their tasks' host names (and MPI
# processor names) differ as on two machines. Where namespaces are unavailable they keep this
# host's name and only the Slurm side of the two-node check runs.
UTS=0
unshare --uts true 2>/dev/null && UTS=1
for n in n1 n2; do
  if ((UTS)); then
    unshare --uts sh -c 'hostname "$1" && shift && exec "$@"' node "$n" \
      slurmd -D -f "$SLURM_CONF" -N "$n" >"$WORK/slurmd-$n.out" 2>&1 &
  else
    slurmd -D -f "$SLURM_CONF" -N "$n" >"$WORK/slurmd-$n.out" 2>&1 &
  fi
  SLURMD_PIDS+=($!)
done
up=0
for _ in $(seq 150); do
  if (($(sinfo -h -N -o '%T' 2>/dev/null | grep -cx idle) == 3)); then up=1; break; fi
  sleep 0.2
done
if ((!up)); then
  sinfo -N 2>&1
  tail -n 20 "$WORK"/slurmctld.log "$WORK"/slurmd-*.log "$WORK"/*.out 2>/dev/null
  skip "slurmctld/slurmd did not come up (3 nodes not idle within 30 s)"
fi
say "slurm up: $HOST, n1, n2 (ports $CTLD_PORT, $SLURMD_PORT/$N1_PORT/$N2_PORT) in $WORK"

# 0. a real two-node job: two slurmd, SLURM_NODEID 0 and 1 with two tasks each.
out=$(timeout 120 srun -p two -N 2 -n 4 --ntasks-per-node=2 --time=2 \
  bash -c 'echo "task $SLURM_PROCID node $SLURM_NODEID $SLURMD_NODENAME nodes $SLURM_JOB_NUM_NODES host $(hostname)"' 2>&1)
rc=$?
echo "$out"
((rc == 0)) || fail "srun -p two -N 2 -n 4 exited $rc"
for id in 0 1; do
  n=n$((id + 1))
  (($(grep -c "node $id $n nodes 2 " <<<"$out") == 2)) || fail "two-node job: not 2 tasks with SLURM_NODEID=$id on $n"
  if ((UTS)); then
    (($(grep -c "node $id $n nodes 2 host $n\$" <<<"$out") == 2)) || fail "two-node job: the tasks on $n do not see host name $n"
  fi
done
(($(grep -c " nodes 2 " <<<"$out") == 4)) || fail "two-node job: SLURM_JOB_NUM_NODES is not 2 in every task"
PROBE=${H5CKPT_CLUSTER_PROBE:-}
if [[ -n $PROBE && -x $PROBE ]] && ((UTS)); then
  # ob1 + TCP between the nodes (UCX or libfabric would see one machine); loopback, which the TCP
  # BTL skips by default, is the one interface every machine has.
  OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,vader,self OMPI_MCA_btl_tcp_if_include=lo \
    timeout 120 srun -p two -N 2 -n 4 --ntasks-per-node=2 --mpi=pmix --kill-on-bad-exit=1 --time=2 \
    "$PROBE" --nodes 2 --ranks-per-node 2 || fail "the cluster probe on 2 Slurm nodes exited $?"
else
  say "cluster probe not run on the two nodes (probe: ${PROBE:-H5CKPT_CLUSTER_PROBE unset}; UTS namespaces: $UTS)"
fi
if [[ ${H5CKPT_SLURM_TWO_NODES_ONLY:-0} == 1 ]]; then
  say "PASS (two-node check only: H5CKPT_SLURM_TWO_NODES_ONLY=1)"
  exit 0
fi

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
"$CLI" inspect --json "$BAD/$latest" > "$WORK/bad-inspect.json" || fail "h5ckpt inspect of the copy failed"
python3 - "$BAD/$latest" "$WORK/bad-inspect.json" <<'EOF' || fail "could not corrupt the copy"
import json, sys
# Flip one byte inside the first tensor with data, at the file offset the index records (the
# index lives in data.h5 since format v2: `h5ckpt inspect --json` lists it).
d, listing = sys.argv[1], json.load(open(sys.argv[2]))
off = next(t["file_offset"] for t in listing["tensors"] if t["file_offset"] >= 0 and t["nbytes"] > 0)
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
