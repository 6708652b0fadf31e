# Sourced by the slurm/*.sbatch scripts: binary paths, layout, srun flags, signal forwarding.
# The sbatch scripts find it through $H5CKPT_SLURM_DIR, else $SLURM_SUBMIT_DIR/slurm (submit
# from the repository root). Settings are environment variables (sbatch exports them).

# Binaries: a build tree ($H5CKPT_BUILD_DIR, default <submit dir>/build) or an install on PATH.
h5ckpt_find() {  # h5ckpt_find VAR build-relative-path installed-name
  local var=$1 rel=$2 name=$3 build=${H5CKPT_BUILD_DIR:-$SLURM_SUBMIT_DIR/build}
  if [[ -n ${!var:-} ]]; then return; fi
  if [[ -x $build/$rel ]]; then printf -v "$var" '%s' "$build/$rel"
  elif command -v "$name" >/dev/null; then printf -v "$var" '%s' "$(command -v "$name")"
  else echo "h5ckpt job: $name not found (set $var, or H5CKPT_BUILD_DIR to a build tree)" >&2; exit 2
  fi
}

# TP x PP x DP must equal the task count; DP defaults to ntasks / (TP*PP).
h5ckpt_layout() {
  NTASKS=${SLURM_NTASKS:?not inside an allocation (submit with sbatch)}
  TP=${TP:-1} PP=${PP:-1}
  if (( NTASKS % (TP * PP) )); then
    echo "h5ckpt job: $NTASKS tasks are not a multiple of TP*PP = $((TP * PP))" >&2; exit 2
  fi
  DP=${DP:-$((NTASKS / (TP * PP)))}
  if (( TP * PP * DP != NTASKS )); then
    echo "h5ckpt job: TP*PP*DP = $((TP * PP * DP)) but the job has $NTASKS tasks" >&2; exit 2
  fi
}

# One MPI rank per task through PMIx (Open MPI's mpirun is not needed inside an allocation).
# CPU_BIND (default cores) pins ranks where the cluster's task plugin binds; GPUS_PER_TASK gives
# each rank its own GPU(s), GPU_BIND (default closest) the one nearest to its CPUs.
h5ckpt_srun_flags() {
  SRUN_FLAGS=(--mpi=pmix --kill-on-bad-exit=1)
  # CPU_BIND unset: cores; set but empty: no --cpu-bind at all (srun warns even about "none"
  # where the task plugin cannot bind).
  [[ -n ${CPU_BIND-cores} ]] && SRUN_FLAGS+=("--cpu-bind=${CPU_BIND-cores}")
  if [[ -n ${GPUS_PER_TASK:-} ]]; then
    SRUN_FLAGS+=("--gpus-per-task=$GPUS_PER_TASK" "--gpu-bind=${GPU_BIND:-closest}")
  fi
}

# Runs a command (srun ...) in the background and forwards SIGUSR1 to it: with
# `#SBATCH --signal=B:USR1@120` Slurm signals this batch shell 120 s before the time limit, and
# srun passes USR1 on to every task, where h5ckpt-train checkpoints at the next step and stops.
# (bash runs a trap only between commands, hence the background job and the wait loop.)
h5ckpt_run_forwarding_usr1() {
  "$@" &
  local pid=$!
  trap "echo \"h5ckpt job: \$(date +%T) SIGUSR1: asking the trainer to checkpoint and stop\"; kill -USR1 $pid 2>/dev/null" USR1
  while kill -0 "$pid" 2>/dev/null; do
    wait "$pid" || true
  done
  trap - USR1
  wait "$pid"  # the job's exit status (bash keeps it after the loop reaped it)
}

# Prints `step-N` of CKPT_DIR/latest, or nothing.
h5ckpt_latest() { [[ -f $1/latest ]] && cat "$1/latest" || true; }
