#!/usr/bin/env bash
# Crash campaign ("never hang, never lose"). Not part of the default CI run (several minutes).
#
# A small synthetic model is trained under MPI with a save at every step into one checkpoint
# directory (async saves, the trainer's default; retention --keep-last), continuing from the newest
# checkpoint each iteration. At a random moment one random rank gets `kill -9`; mpirun must then
# tear the job down. After every kill:
#   - mpirun exits within --hang-timeout (else: a hang, everything is killed, the campaign fails),
#     and no rank process is left behind;
#   - `h5ckpt verify DIR` exits 0 (the checkpoint a load selects is complete), every other
#     committed checkpoint verifies too, and no step-* directory lacks its metadata.json;
#   - the selected step never goes backwards and equals what `latest` names, and the trainer resumed
#     from the previous one (never "starting from step 0" while a checkpoint exists). A committed
#     step newer than `latest` is the one window a kill may leave (between the commit's rename and
#     the pointer update): it must verify, be the only one, and the next run must re-save that step
#     over it (no "already exists"); after the final uninterrupted run none may remain;
#   - temporary directories (.NAME.inprogress-*) may exist right after a crash, but those left
#     before an iteration that then committed two saves must be gone (every commit removes them);
#   - at most --keep-last + 2 committed checkpoints remain (retention keeps up, even across crashes);
#   - the data-loader ledger (the trainer appends a step's rows before saving it; a resume from an
#     older checkpoint appends "# resumed-at N", which drops the rows past N) holds, once the
#     markers are applied, for every step it has exactly the rows of the uninterrupted reference
#     (same DP, so the same loader shards), no step twice and none more than two steps past the
#     committed step (the saves in flight at the kill). Steps it lacks are counted, not failed.
# Every --check-every iterations, and at the end, a copy of the chain directory is resumed under
# another layout (TP1·DP4, TP4·DP1, TP1·PP2·DP2, TP2·PP2·DP1 for 4 ranks; ZeRO off) to the next
# multiple of --ref-every (at the end: to the fixed final step) and must end bit-identical
# (`h5ckpt-train --compare`) to the uninterrupted reference, made once at the start (TP1·DP<R/2>,
# saving every --ref-every steps), with every data-loader sample consumed exactly once
# (`--verify-ledger` on the reference's ledger up to the resumed step plus the resumed rows), and
# the resumed run's commit must have removed the crash leftovers it inherited. Before that final
# check one last chain run goes uninterrupted and must leave no temporary directory.
#
# usage: scripts/crash_campaign.sh [--iterations N] [--seed S] [--ranks R] [--workdir DIR]
#          [--timeout SEC] [--hang-timeout SEC] [--steps-per-iter T] [--check-every K]
#          [--ref-every G] [--keep-last N] [--build DIR] [--keep-going] [--keep-workdir]
#   --iterations N     kills (default 200)          --seed S        random seed (default 1)
#   --ranks R          ranks of the chain, even (default 4: TP2·DP2 + ZeRO)
#   --workdir DIR      default /tmp/h5ckpt-crash-campaign (wiped first; checkpoints removed
#                      at the end when everything passed, logs and campaign.csv kept)
#   --timeout SEC      limit of one uninterrupted job (mpirun --timeout; default 300)
#   --hang-timeout SEC how long mpirun may take to exit after the kill (default 30)
#   --steps-per-iter T each iteration trains to newest + T (default 10)
#   --check-every K    resume check every K iterations (default 20)
#   --ref-every G      the reference saves every G steps (default 20)
#   --keep-going       do not stop at the first failure
# Run it niced on a shared machine: nice -n 10 scripts/crash_campaign.sh --iterations 200
# Env: MPIEXEC (default mpirun). Exit status 0 only when every check passed.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=200 SEED=1 RANKS=4 WORK=/tmp/h5ckpt-crash-campaign TIMEOUT=300 HANG=30 T=10 K=20 G=20 KEEP_LAST=3
BUILD=$ROOT/build KEEP_GOING=0 KEEP_WORK=0

usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; }
while (($#)); do
  case $1 in
    --iterations) N=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --workdir) WORK=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --hang-timeout) HANG=$2; shift 2 ;;
    --steps-per-iter) T=$2; shift 2 ;;
    --check-every) K=$2; shift 2 ;;
    --ref-every) G=$2; shift 2 ;;
    --keep-last) KEEP_LAST=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --keep-going) KEEP_GOING=1; shift ;;
    --keep-workdir) KEEP_WORK=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "crash_campaign: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in N SEED RANKS TIMEOUT HANG T K G KEEP_LAST; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "crash_campaign: $v must be a non-negative integer" >&2; exit 2; }
done
((RANKS >= 2 && RANKS % 2 == 0)) || { echo "crash_campaign: --ranks must be even and >= 2" >&2; exit 2; }
((N >= 1 && T >= 2 && K >= 1 && G >= 1 && KEEP_LAST >= 1)) || { echo "crash_campaign: bad sizes" >&2; exit 2; }

TRAIN=$BUILD/src/trainer/h5ckpt-train
TOOL=$BUILD/src/tools/h5ckpt
MPIRUN=${MPIEXEC:-mpirun}
for x in "$TRAIN" "$TOOL"; do [[ -x $x ]] || { echo "crash_campaign: missing $x (build first)" >&2; exit 2; }; done
PRE=(--oversubscribe --bind-to none)
[[ $(id -u) == 0 ]] && PRE+=(--allow-run-as-root)
# Small model (~0.5 MB of state); kv-heads 4 allows TP up to 4, vocab 256 divides by 4.
MODEL=(--layers 2 --hidden 32 --heads 4 --kv-heads 4 --ffn 64 --vocab 256 --seed 7)
DPC=$((RANKS / 2))
CHAIN_LAYOUT=tp2.pp1.dp$DPC.zero
REF_LAYOUT=tp1.pp1.dp$DPC # the chain's DP: same loader shards, so the reference ledger is the chain's
if ((RANKS % 4 == 0)); then
  RESUME_LAYOUTS=(tp1.pp1.dp$RANKS tp4.pp1.dp$((RANKS / 4)) tp1.pp2.dp$DPC tp2.pp2.dp$((RANKS / 4)))
else
  RESUME_LAYOUTS=(tp1.pp1.dp$RANKS tp1.pp2.dp$DPC tp2.pp1.dp$DPC)
fi

CHAIN=$WORK/chain REF=$WORK/ref CL=$WORK/chain.ledger REFL=$WORK/ref.ledger LOGS=$WORK/logs
CSV=$WORK/campaign.csv
RANDOM=$SEED

now_ms() { echo $((${EPOCHREALTIME/./} / 1000)); }
T_START=$(now_ms)
say() { printf '[crash %6.1fs] %s\n' "$(awk -v a="$(now_ms)" -v b="$T_START" 'BEGIN{print (a-b)/1000}')" "$*"; }

# layout tag -> "N --tp a --pp b --dp c [--zero]"
layout() {
  local tag=$1 tp=1 pp=1 dp=1 zero="" p parts
  IFS=. read -r -a parts <<<"$tag"
  for p in "${parts[@]}"; do
    case $p in tp*) tp=${p#tp} ;; pp*) pp=${p#pp} ;; dp*) dp=${p#dp} ;; zero) zero=--zero ;; esac
  done
  echo "$((tp * pp * dp)) --tp $tp --pp $pp --dp $dp $zero"
}

# ---- jobs ----------------------------------------------------------------------------------
JOB_PID="" JOB_TAG=""
alive() { # a pid that exists and is not a zombie
  local s
  s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $s && $s != Z ]]
}
rank_pids() { pgrep -P "$1" 2>/dev/null; }
strays() { [[ -n $1 ]] && pgrep -f -- "$1" 2>/dev/null; } # processes whose command line holds TAG
kill_everything() {                                        # kill_everything MPIRUN_PID TAG
  local p
  for p in $(rank_pids "$1") $(strays "$2"); do kill -9 "$p" 2>/dev/null; done
  kill -9 "$1" 2>/dev/null
}
cleanup_on_exit() {
  if [[ -n $JOB_PID ]] && alive "$JOB_PID"; then kill_everything "$JOB_PID" "$JOB_TAG"; fi
  if [[ -n $JOB_TAG ]]; then local p; for p in $(strays "$JOB_TAG"); do kill -9 "$p" 2>/dev/null; done; fi
}
trap cleanup_on_exit EXIT
trap 'echo "crash_campaign: interrupted" >&2; exit 130' INT TERM

# launch LOG TAG NP args...: mpirun in the background; the trainer's --report TAG.jsonl makes its
# ranks findable (pgrep -f) even if mpirun dies before them.
launch() {
  local log=$1 tag=$2 np=$3
  shift 3
  JOB_TAG=$tag
  "$MPIRUN" -n "$np" "${PRE[@]}" --timeout "$TIMEOUT" "$TRAIN" "$@" --report "$tag.jsonl" >"$log" 2>&1 &
  JOB_PID=$!
}
wait_exit() { # wait_exit PID SECONDS: 0 when it exited in time
  local deadline=$(($(now_ms) + $2 * 1000))
  while alive "$1"; do
    (($(now_ms) > deadline)) && return 1
    sleep 0.05
  done
  return 0
}
# run_job LOG TAG NP args...: run to completion; returns the exit status (124: hung, killed)
run_job() {
  local log=$1 tag=$2 rc
  launch "$@"
  if ! wait_exit "$JOB_PID" $((TIMEOUT + 30)); then
    kill_everything "$JOB_PID" "$tag"
    wait "$JOB_PID" 2>/dev/null
    echo "crash_campaign: job hung past $((TIMEOUT + 30)) s, killed: $log" >>"$log"
    rc=124
  else
    wait "$JOB_PID"
    rc=$?
  fi
  JOB_PID=""
  sleep 0.2
  if [[ -n $(strays "$tag") ]]; then
    echo "crash_campaign: processes left behind after the job: $(strays "$tag" | tr '\n' ' ')" >>"$log"
    for p in $(strays "$tag"); do kill -9 "$p" 2>/dev/null; done
    ((rc == 0)) && rc=125
  fi
  rm -f "$tag.jsonl"
  return $rc
}
# train_args LAYOUT: sets NP and ARGS
train_args() {
  local spec
  read -r -a spec <<<"$(layout "$1")"
  NP=${spec[0]}
  ARGS=("${spec[@]:1}" "${MODEL[@]}")
}

# ---- checks of the chain directory ---------------------------------------------------------
temps_of() { ls -A "$1" 2>/dev/null | grep -E '^\..*\.inprogress-' || true; }
step_of() { local b=${1##*/}; b=${b#step-}; echo $((10#$b)); }

FAILS=0 FAIL_MSGS=()
ITER=0
fail() {
  FAILS=$((FAILS + 1))
  FAIL_MSGS+=("iteration $ITER: $*")
  echo "crash_campaign: FAIL (iteration $ITER): $*" >&2
  local d=$WORK/failures/it-$ITER
  mkdir -p "$d"
  {
    echo "FAIL: $*"
    echo "--- ls -la chain"; ls -la "$CHAIN"
    echo "--- temporary directories"; for t in $(temps_of "$CHAIN"); do ls -la "$CHAIN/$t"; done
    echo "--- latest: $(cat "$CHAIN/latest" 2>/dev/null)"
    echo "--- h5ckpt inspect"; "$TOOL" inspect "$CHAIN" 2>&1
    echo "--- h5ckpt verify"; "$TOOL" verify "$CHAIN" 2>&1
    echo "--- tail of the chain ledger"; tail -5 "$CL" 2>/dev/null
    echo "--- processes"; ps aux | grep -E 'mpirun|orted|h5ckpt' | grep -v grep
  } >"$d/state.txt" 2>&1
  cp "$LOGS"/it-"$ITER".* "$d/" 2>/dev/null
  echo "crash_campaign: evidence in $d" >&2
}

LEDGER_FIXES=0 LEDGER_LOST=0 MAX_TEMPS=0 MAX_COMMITTED=0 TEMPS_AFTER_KILL=0 AHEAD=0 AHEAD_N=0 STRICT_LATEST=0
# check_chain: everything that must hold whenever no job runs. Sets NEWEST, COMMITTED, TEMPS.
check_chain() {
  local out rc path latest d s newest_committed=-1 n=0 ok=1
  AHEAD=0
  out=$("$TOOL" verify "$CHAIN" 2>&1)
  rc=$?
  if ((rc != 0)); then
    fail "h5ckpt verify $CHAIN exited $rc: $(head -c 600 <<<"$out")"
    return 1
  fi
  path=$(sed -n 's/^OK: \([^:]*\): .*/\1/p' <<<"$out")
  NEWEST=$(step_of "$path")
  latest=$(tr -d '\n' <"$CHAIN/latest" 2>/dev/null)
  [[ $latest == "${path##*/}" ]] || { fail "verify selected ${path##*/}, 'latest' names '$latest'"; ok=0; }
  for d in "$CHAIN"/step-*; do
    [[ -d $d ]] || continue
    if [[ ! -f $d/metadata.json ]]; then fail "$d has no metadata.json (a half checkpoint with a final name)"; ok=0; continue; fi
    n=$((n + 1))
    s=$(step_of "$d")
    ((s > newest_committed)) && newest_committed=$s
    ((s > NEWEST)) && AHEAD=$((AHEAD + 1))
    if [[ $d != "$path" ]] && ! out=$("$TOOL" verify "$d" 2>&1); then
      fail "committed checkpoint $d does not verify: $(head -c 600 <<<"$out")"; ok=0
    fi
  done
  COMMITTED=$n
  ((n > MAX_COMMITTED)) && MAX_COMMITTED=$n
  # A kill between the rename and the `latest` update leaves one committed step past the selected
  # one; the trainer re-saves over it. Two such, or one after an uninterrupted run, is a bug.
  if ((AHEAD > 1 || (AHEAD == 1 && STRICT_LATEST))); then
    fail "$AHEAD committed checkpoints past the selected step $NEWEST (newest step-$newest_committed; 'latest' was not updated)"
    ok=0
  fi
  ((n > KEEP_LAST + 2)) && { fail "$n committed checkpoints with --keep-last $KEEP_LAST: retention does not keep up"; ok=0; }
  TEMPS=$(temps_of "$CHAIN")
  local nt
  nt=$(grep -c . <<<"$TEMPS")
  ((nt > MAX_TEMPS)) && MAX_TEMPS=$nt
  # ledger: a line cut by the kill is a trainer artifact; drop it
  if [[ -s $CL && $(tail -c1 "$CL" | wc -l) -eq 0 ]]; then
    head -n "$(wc -l <"$CL")" "$CL" >"$CL.tmp" && mv "$CL.tmp" "$CL"
    LEDGER_FIXES=$((LEDGER_FIXES + 1))
  fi
  if [[ -s $CL ]]; then
    # The trainer appends a step's rows before saving it, and a resume from an older checkpoint
    # appends "# resumed-at N" (the rows past N were re-run): the ledger that counts is what remains
    # after each marker drops the rows past its step (as --verify-ledger reads it).
    local EL=$CL.effective
    awk '/^# resumed-at / {n = $3; k = 0; for (i = 1; i <= m; i++) if (st[i] <= n) {ln[++k] = ln[i]; st[k] = st[i]}; m = k; next}
         /^#/ {next}
         {ln[++m] = $0; st[m] = $1}
         END {for (i = 1; i <= m; i++) print ln[i]}' "$CL" >"$EL"
    # Rows of the saves still in flight at the kill (the async one and the next) may follow the
    # committed step; the next run's marker drops them. Anything further is a bug.
    if ! awk -v S="$((NEWEST + 2))" '$1 > S {bad = 1} END {exit bad}' "$EL"; then
      fail "the chain ledger has rows more than two steps past the committed step $NEWEST"; ok=0
    fi
    if ! cmp -s <(sort "$EL") <(awk 'FNR == NR {s[$1] = 1; next} ($1 in s)' "$EL" "$REFL" | sort); then
      fail "the chain ledger's rows differ from the reference's for the same steps (duplicated or different samples): $(diff <(sort "$EL") <(awk 'FNR == NR {s[$1] = 1; next} ($1 in s)' "$EL" "$REFL" | sort) | head -5 | tr '\n' ' ')"
      ok=0
    fi
    LEDGER_LOST=$((NEWEST - $(awk -v S="$NEWEST" '$1 <= S && !($1 in s) {s[$1] = 1; n++} END {print n + 0}' "$EL")))
  fi
  ((ok))
}

# ---- resume under another layout, compare with the reference -------------------------------
RESUME_OK=0 RESUME_FAIL=0 RESUME_N=0 RESUME_LOG=()
resume_check() { # resume_check TARGET_STEP
  local tgt=$1 lay=${RESUME_LAYOUTS[$((RESUME_N % ${#RESUME_LAYOUTS[@]}))]} d=$WORK/resume s=$NEWEST rc t0 why=""
  RESUME_N=$((RESUME_N + 1))
  t0=$(now_ms)
  rm -rf "$d" && mkdir -p "$d"
  cp -a "$CHAIN" "$d/ckpt" # with whatever a crash left there
  local inherited
  inherited=$(temps_of "$d/ckpt" | grep -c .)
  awk -v S="$s" '$1 <= S' "$REFL" >"$d/ledger"
  train_args "$lay"
  run_job "$d/train.log" "$d/train" "$NP" "${ARGS[@]}" --steps "$tgt" --save-every 0 --keep-last "$KEEP_LAST" \
    --ckpt-dir "$d/ckpt" --ledger "$d/ledger"
  rc=$?
  if ((rc != 0)); then why="resume run exited $rc"
  elif ! grep -q "resumed .* at step $s (saved as" "$d/train.log"; then why="did not resume from step $s"
  elif ! run_job "$d/compare.log" "$d/compare" 1 --compare "$d/ckpt/$(printf 'step-%08d' "$tgt")" \
    "$REF/$(printf 'step-%08d' "$tgt")"; then why="not bit-identical to the reference at step $tgt"
  elif ! run_job "$d/ledger.log" "$d/vledger" 1 --verify-ledger "$d/ledger" --ckpt-dir "$d/ckpt"; then
    why="data-loader ledger not exactly-once"
  elif ! "$TOOL" verify "$d/ckpt" >"$d/verify.log" 2>&1; then why="resumed checkpoint does not verify"
  elif [[ -n $(temps_of "$d/ckpt") ]]; then why="temporary directories left after the resumed run's commit: $(temps_of "$d/ckpt" | tr '\n' ' ')"
  fi
  local line
  line=$(printf '%s -> %s to step %s (%s inherited temp dirs): %s (%.1fs)' "$s" "$lay" "$tgt" "$inherited" \
    "${why:-bit-identical, exactly-once}" "$(awk -v a="$(now_ms)" -v b="$t0" 'BEGIN{print (a-b)/1000}')")
  RESUME_LOG+=("$line")
  if [[ -n $why ]]; then
    RESUME_FAIL=$((RESUME_FAIL + 1))
    mkdir -p "$WORK/failures/resume-$RESUME_N" && cp "$d"/*.log "$WORK/failures/resume-$RESUME_N/" 2>/dev/null
    fail "resume check $RESUME_N: $line (logs: $WORK/failures/resume-$RESUME_N, copy: $d)"
    return 1
  fi
  RESUME_OK=$((RESUME_OK + 1))
  say "resume check $RESUME_N passed: $line"
  rm -rf "$d"
}

# ---- set-up: reference, calibration ---------------------------------------------------------
rm -rf "$WORK"
mkdir -p "$LOGS"
FINAL=$((((N + 3) * T + G - 1) / G * G)) # beyond anything the chain can reach
say "h5ckpt crash campaign: $N iterations, seed $SEED, chain $CHAIN_LAYOUT on $RANKS ranks, save every step, keep-last $KEEP_LAST, +$T steps per iteration; work dir $WORK"
say "git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), trainer built $(date -r "$TRAIN" '+%F %T')"
say "reference: $REF_LAYOUT, uninterrupted to step $FINAL, saving every $G steps"
train_args "$REF_LAYOUT"
if ! run_job "$LOGS/ref.log" "$WORK/ref-run" "$NP" "${ARGS[@]}" --steps "$FINAL" --save-every "$G" --keep-last 0 \
  --ckpt-dir "$REF" --ledger "$REFL"; then
  echo "crash_campaign: the reference run failed:" >&2; tail -20 "$LOGS/ref.log" >&2; exit 1
fi
if ! run_job "$LOGS/ref-ledger.log" "$WORK/ref-vl" 1 --verify-ledger "$REFL" --ckpt-dir "$REF"; then
  echo "crash_campaign: the reference ledger is not exactly-once" >&2; cat "$LOGS/ref-ledger.log" >&2; exit 1
fi

say "calibration: $CHAIN_LAYOUT from step 0 to $T, uninterrupted (the chain's first checkpoints)"
train_args "$CHAIN_LAYOUT"
CHAIN_ARGS=("${ARGS[@]}" --save-every 1 --keep-last "$KEEP_LAST" --ckpt-dir "$CHAIN" --ledger "$CL")
t0=$(now_ms)
launch "$LOGS/calibration.log" "$WORK/calib" "$NP" "${CHAIN_ARGS[@]}" --steps "$T"
STARTUP_MS=""
while alive "$JOB_PID"; do
  [[ -z $STARTUP_MS ]] && grep -qs '^\[h5ckpt-train\] layout ' "$LOGS/calibration.log" && STARTUP_MS=$(($(now_ms) - t0))
  sleep 0.02
done
RUN_MS=$(($(now_ms) - t0))
wait "$JOB_PID" || { echo "crash_campaign: calibration run failed" >&2; cat "$LOGS/calibration.log" >&2; exit 1; }
JOB_PID=""
rm -f "$WORK/calib.jsonl"
STARTUP_MS=${STARTUP_MS:-$((RUN_MS / 2))}
DMIN=$((STARTUP_MS / 2)) DMAX=$((RUN_MS * 95 / 100))
((DMAX > DMIN + 100)) || DMAX=$((DMIN + 100))
say "calibration: startup (MPI init, checkpoint lookup) ${STARTUP_MS} ms, $T steps with $T saves ${RUN_MS} ms in all; kill delays uniform in [$DMIN, $DMAX] ms after launch"
check_chain || { echo "crash_campaign: the calibration run left a bad chain" >&2; exit 1; }
echo "iter,victim_rank,delay_ms,phase,outcome,rc,teardown_ms,start_step,newest_step,committed,temp_dirs,ledger_steps_lost" >"$CSV"

# ---- the campaign ---------------------------------------------------------------------------
declare -A PHASE_N VICTIM_N
KILLS=0 COMPLETED=0 HANGS=0 ADVANCED=0 MAX_TEARDOWN=0 STEP0=$NEWEST
PREV=$NEWEST PREV_TEMPS=$TEMPS
for ((ITER = 1; ITER <= N; ITER++)); do
  [[ $FAILS -gt 0 && $KEEP_GOING == 0 ]] && break
  tgt=$((PREV + T))
  ((tgt >= FINAL)) && { fail "the chain reached step $PREV, too close to the reference's $FINAL"; break; }
  delay=$((DMIN + ((RANDOM << 15) | RANDOM) % (DMAX - DMIN + 1)))
  victim=$((RANDOM % NP))
  log=$LOGS/it-$ITER.log
  pre_temps=$(temps_of "$CHAIN")
  t0=$(now_ms)
  launch "$log" "$WORK/it-$ITER" "$NP" "${CHAIN_ARGS[@]}" --steps "$tgt"
  mp=$JOB_PID
  while alive "$mp" && (($(now_ms) - t0 < delay)); do sleep 0.01; done
  # the victim's pid (ranks are mpirun's children; OMPI_COMM_WORLD_RANK names them)
  vpid=""
  while alive "$mp" && [[ -z $vpid ]] && (($(now_ms) - t0 < TIMEOUT * 1000)); do
    for p in $(rank_pids "$mp"); do
      if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim"; then vpid=$p; fi
    done
    [[ -z $vpid ]] && sleep 0.01
  done
  outcome=killed phase=-
  if [[ -n $vpid ]] && alive "$mp"; then
    # what the job is doing, from its log and the checkpoint directory, just before the kill
    if grep -q '^\[h5ckpt-train\] done:' "$log"; then phase=finishing
    elif ! grep -q '^\[h5ckpt-train\] layout ' "$log"; then phase=startup/load
    else
      phase=train/plan/snapshot
      # a step directory newer than what `latest` names: between the commit's rename and the update
      lt=$(tr -d '\n' <"$CHAIN/latest" 2>/dev/null)
      nd=$(ls -d "$CHAIN"/step-* 2>/dev/null | sort | tail -1)
      [[ -n $nd && -n $lt && ${nd##*/} > $lt ]] && phase=latest
      for t in $(temps_of "$CHAIN"); do
        grep -qxF -- "$t" <<<"$pre_temps" && continue
        case $t in
          *.inprogress-deleting-*) phase=retention ;;
          *) if [[ -e $CHAIN/$t/metadata.json || -e $CHAIN/$t/metadata.json.tmp ]]; then phase=commit; else phase=write; fi ;;
        esac
      done
    fi
    kill -9 "$vpid" 2>/dev/null || outcome=completed
  else
    outcome=completed
  fi
  tk=$(now_ms)
  if ! wait_exit "$mp" "$HANG"; then
    HANGS=$((HANGS + 1))
    {
      echo "--- still running $HANG s after kill -9 of rank $victim (pid $vpid):"
      ps -o pid,ppid,stat,etime,wchan:20,cmd -p "$mp" $(rank_pids "$mp" | sed 's/^/-p /') 2>/dev/null | cut -c1-200
    } >>"$log"
    kill_everything "$mp" "$WORK/it-$ITER"
    wait "$mp" 2>/dev/null
    JOB_PID=""
    fail "hang: mpirun still running $HANG s after kill -9 of rank $victim in phase $phase (delay $delay ms)"
    echo "$ITER,$victim,$delay,$phase,hang,-,-,$PREV,-,-,-,-" >>"$CSV"
    continue
  fi
  wait "$mp"
  rc=$?
  JOB_PID=""
  teardown=$(($(now_ms) - tk))
  sleep 0.2
  if [[ -n $(strays "$WORK/it-$ITER") ]]; then
    fail "rank processes left behind after mpirun exited: $(strays "$WORK/it-$ITER" | tr '\n' ' ')"
    for p in $(strays "$WORK/it-$ITER"); do kill -9 "$p" 2>/dev/null; done
  fi
  rm -f "$WORK/it-$ITER.jsonl"
  if [[ $outcome == completed ]]; then
    COMPLETED=$((COMPLETED + 1))
    ((rc == 0)) || fail "the job exited $rc by itself before the kill: $(grep -m3 -i error "$log" | tr '\n' ' ')"
    teardown=-
  else
    KILLS=$((KILLS + 1))
    PHASE_N[$phase]=$((${PHASE_N[$phase]:-0} + 1))
    VICTIM_N[$victim]=$((${VICTIM_N[$victim]:-0} + 1))
    ((teardown > MAX_TEARDOWN)) && MAX_TEARDOWN=$teardown
  fi
  # the run must have resumed from the newest checkpoint (when it got that far)
  if grep -q "no checkpoint in" "$log"; then fail "the run started from step 0 although step $PREV was committed"; fi
  r=$(sed -n 's/^\[h5ckpt-train\] resumed .* at step \([0-9]*\) (saved as.*/\1/p' "$log")
  [[ -n $r && $r != "$PREV" ]] && fail "the run resumed from step $r, the newest checkpoint was step $PREV"
  grep -q "already exists" "$log" &&
    fail "the run refused to re-save a step a killed run had committed past 'latest': $(grep -m1 "already exists" "$log")"
  if check_chain; then
    AHEAD_N=$((AHEAD_N + AHEAD))
    ((NEWEST < PREV)) && fail "the newest checkpoint went back from step $PREV to $NEWEST"
    ((NEWEST > PREV)) && ADVANCED=$((ADVANCED + 1))
    # leftovers from before this iteration must be gone once two saves committed after them
    if ((NEWEST >= PREV + 2)); then
      for t in $PREV_TEMPS; do
        [[ -e $CHAIN/$t ]] && fail "temporary directory $t survived two committed saves"
      done
    fi
    new_temps=0
    for t in $TEMPS; do grep -qxF -- "$t" <<<"$pre_temps" || new_temps=$((new_temps + 1)); done
    TEMPS_AFTER_KILL=$((TEMPS_AFTER_KILL + new_temps))
  fi
  ntemps=$(grep -c . <<<"$TEMPS")
  echo "$ITER,$victim,$delay,$phase,$outcome,$rc,$teardown,$PREV,$NEWEST,$COMMITTED,$ntemps,$LEDGER_LOST" >>"$CSV"
  if [[ $outcome == killed ]]; then
    what=$(printf 'rank %d killed after %4d ms (%s)' "$victim" "$delay" "$phase")
  else
    what=$(printf 'no kill: the job completed within %d ms' "$delay")
  fi
  printf '[crash] it %3d: %s: step %d -> %d, %d committed, %d temp dirs, mpirun gone in %s ms\n' \
    "$ITER" "$what" "$PREV" "$NEWEST" "$COMMITTED" "$ntemps" "$teardown"
  PREV=$NEWEST PREV_TEMPS=$TEMPS
  ((FAILS == 0)) && rm -f "$log"
  if ((ITER % K == 0 && ITER < N)) && [[ $FAILS -eq 0 || $KEEP_GOING == 1 ]]; then
    resume_check $(((NEWEST / G + 1) * G))
  fi
done
ITER_DONE=$((ITER - 1))

# ---- the end: one uninterrupted chain run, then the resume to the fixed final step -----------
if [[ $FAILS -eq 0 || $KEEP_GOING == 1 ]]; then
  ITER=final STRICT_LATEST=1
  tgt=$((PREV + 2))
  say "final uninterrupted chain run: step $PREV -> $tgt (its commits must remove every leftover)"
  if run_job "$LOGS/it-final.log" "$WORK/it-final" "$NP" "${CHAIN_ARGS[@]}" --steps "$tgt"; then
    if check_chain; then
      ((NEWEST == tgt)) || fail "after the uninterrupted run the newest step is $NEWEST, not $tgt"
      [[ -z $TEMPS ]] || fail "temporary directories left after an uninterrupted run: $(tr '\n' ' ' <<<"$TEMPS")"
    fi
  else
    fail "the uninterrupted chain run failed: $(tail -3 "$LOGS/it-final.log" | tr '\n' ' ')"
  fi
  [[ $FAILS -eq 0 || $KEEP_GOING == 1 ]] && resume_check "$FINAL"
fi

# ---- summary --------------------------------------------------------------------------------
METRICS_FILES=$(ls "$CHAIN" 2>/dev/null | grep -c '\.save\.json$')
TOTAL_S=$(awk -v a="$(now_ms)" -v b="$T_START" 'BEGIN{printf "%.0f", (a-b)/1000}')
echo
echo "==== crash campaign summary ===="
echo "iterations:            $ITER_DONE of $N (seed $SEED, $CHAIN_LAYOUT on $RANKS ranks, +$T steps per run)"
echo "kills delivered:       $KILLS; jobs that completed before the kill: $COMPLETED"
printf 'kills by phase:       '; for p in "${!PHASE_N[@]}"; do printf ' %s=%d' "$p" "${PHASE_N[$p]}"; done; echo
printf 'kills by rank:        '; for p in $(printf '%s\n' "${!VICTIM_N[@]}" | sort -n); do printf ' rank%s=%d' "$p" "${VICTIM_N[$p]}"; done; echo " (rank 0 coordinates the commit)"
echo "mpirun teardown:       at most $MAX_TEARDOWN ms after the kill; hangs: $HANGS"
echo "newest step:           $STEP0 -> $NEWEST; advanced in $ADVANCED of $ITER_DONE iterations"
echo "committed checkpoints: at most $MAX_COMMITTED at once (keep-last $KEEP_LAST); $AHEAD_N iterations ended with one past 'latest' (a kill between the rename and the pointer update; the next run re-saves it)"
echo "temp dirs:             $TEMPS_AFTER_KILL left by crashes in all, at most $MAX_TEMPS at once, $(temps_of "$CHAIN" | grep -c .) at the end"
echo "ledger:                $LEDGER_LOST committed steps without ledger rows (crash between commit and the trainer's append), $LEDGER_FIXES cut lines dropped"
echo "metrics files:         $METRICS_FILES <step>.save.json in the chain directory (retention does not remove them)"
echo "resume checks:         $RESUME_OK passed, $RESUME_FAIL failed (reference $REF_LAYOUT to step $FINAL)"
for l in "${RESUME_LOG[@]}"; do echo "   $l"; done
echo "failures:              $FAILS"
for m in "${FAIL_MSGS[@]}"; do echo "   $m"; done
echo "total time:            ${TOTAL_S} s; per-iteration record: $CSV"
if ((FAILS == 0)); then
  ((KEEP_WORK)) || rm -rf "$CHAIN" "$REF" "$WORK/resume" "$CL" "$REFL"
  echo "crash campaign PASS"
  exit 0
fi
echo "crash campaign FAIL (work directory kept: $WORK)"
exit 1
