#!/usr/bin/env bash
# h5ckpt on a real distributed file system: a GlusterFS volume (scripts/gluster.sh: 2 bricks, one
# FUSE client per simulated node, caches at their defaults) shared by the nodes of the simulated
# cluster (scripts/cluster.sh --shared). One case per call:
#   resume     save on 4 nodes (TP2 DP2 ZeRO), resume on 2 other nodes (TP1 DP2), bit-identical to an
#              uninterrupted TP2 run, every sample once (scripts/e2e_resume.sh)
#   sharded    the same on a sharded volume (gluster.sh --shard, 4 MB pieces) with a model of 28 MB,
#              whose data files are spread over both bricks: the tuning the user guide recommends
#   multilevel the same with the node-local level on: saves on the nodes' private disks, every 3rd
#              step persisted to the volume; the resuming nodes have empty disks and load from it
#   latest     a job saves every step on node-1..2 while node-3's client reads `latest` in a loop;
#              the moment each save commits, a load through node-3's client must select it; one
#              through node-2's client (whose rank wrote part of it) too, at step 21; then
#              node-1's client points `latest` at older steps and node-3 must select exactly those
#   lock       a save on node-1..2 is held in its write phase; a job on node-3..4 saving into the
#              same directory is refused, naming the holder; the first save then commits
#   brick      the brick holding the data file is killed mid-save: the job fails within its
#              deadline, nothing is committed, the last good checkpoint loads (brick back);
#              a brick killed before a load: the load fails with an error naming the file, or
#              selects an older checkpoint that validates
#   odirect    O_DIRECT refused at open (injected EINVAL): the save still succeeds, bit-identical
#              to one written with O_DIRECT
#   fullbrick  bricks of 24 MiB each (scripts/gluster.sh --brick-size) filled through a client: the
#              next save fails on every rank with ENOSPC naming the checkpoint, nothing is committed,
#              the last good checkpoint loads; once there is room again the next save commits
# Usage: run_gluster_test.sh SOURCE_DIR H5CKPT_TRAIN H5CKPT_CLI CASE
# Exit 77 (skipped) only when this machine cannot host a volume or the cluster (not root, no
# /dev/fuse, GlusterFS not installed, no namespaces).
set -euo pipefail
SRC=$1 TRAIN=$2 CLI=$3 CASE=$4
SKIP=77
MODEL=(--layers 4 --hidden 64 --heads 8 --kv-heads 4 --ffn 128 --vocab 256 --seed 7)
export H5CKPT_MPIEXEC_PREFLAGS="--allow-run-as-root --oversubscribe --bind-to none"

say() { echo "gluster test $CASE: $*"; }
skip() { say "SKIPPED: $*"; exit $SKIP; }
fail() { say "FAILED: $*"; exit 1; }

[[ $(id -u) == 0 ]] || skip "needs root (glusterd, FUSE mounts, namespaces)"
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
command -v glusterd >/dev/null || skip "GlusterFS is not installed (scripts/setup.sh installs glusterfs-server glusterfs-client)"
err=$(unshare --uts --mount --propagation private true 2>&1) || skip "UTS + mount namespaces are unavailable: $err"
[[ -x $TRAIN && -x $CLI ]] || fail "h5ckpt-train ($TRAIN) or h5ckpt ($CLI) is not built"

WORK=$(mktemp -d /tmp/h5ckpt-gluster-test.XXXXXX)
VOL=$WORK/vol
SH=$VOL/mnt  # the shared path: the host's client here, node i's own client inside node i
BG=()
cleanup() {
  local p rc=$? left
  for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  GLUSTER_QUIET=1 "$SRC/scripts/gluster.sh" stop --dir "$VOL" || true
  # The stop must have ended every process it started (clients and bricks name $VOL on their
  # command lines) and unmounted every client, by the time it returns.
  left=$( (pgrep -af -- "$VOL" || true; grep -F -- " $VOL" /proc/mounts || true) | grep -v "run_gluster_test" || true)
  if [[ -n $left ]]; then
    say "FAILED: 'gluster.sh stop' returned with these left behind:"$'\n'"$left"
    ((rc)) || rc=1
  fi
  if [[ ${KEEP_WORK:-0} == 1 ]]; then say "kept $WORK"; else rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
rc=0
START_ARGS=(--bricks 2 --clients 4)
[[ $CASE == fullbrick ]] && START_ARGS+=(--brick-size 24m)
[[ $CASE == sharded ]] && START_ARGS+=(--shard)
GLUSTER_OWNER=$$ "$SRC/scripts/gluster.sh" start --dir "$VOL" "${START_ARGS[@]}" || rc=$?
((rc == 125)) && skip "this machine cannot host a GlusterFS volume (see above)"
((rc == 0)) || fail "scripts/gluster.sh start exited $rc"

cluster() {  # cluster NODES FIRST [cluster.sh options] -- PROGRAM...: one rank per node
  local n=$1 first=$2
  shift 2
  "$SRC/scripts/cluster.sh" --nodes "$n" --ranks-per-node 1 --first-node "$first" --shared "$SH" \
    --shared-volume "$VOL" --timeout 120 "$@"
}
train_args() { echo "${MODEL[@]}"; }

# The step of the checkpoint a load selects in DIR (through the client of DIR's mount).
selected_step() {
  local out
  out=$("$CLI" verify "$1" 2>&1) || { echo "$out" >&2; return 1; }
  sed -n 's|^OK: .*/step-0*\([0-9][0-9]*\):.*|\1|p' <<<"$out"
}

case $CASE in
  resume)
    E2E_CLUSTER_ARGS="--shared $SH --shared-volume $VOL" E2E_TIMEOUT=150 H5DIFF=none \
      bash "$SRC/scripts/e2e_resume.sh" "$TRAIN" mpirun "$SH/e2e" tp2.pp1.dp2.zero@4x1 tp1.pp1.dp2@2x1+3 tp2.pp1.dp1@2x1 ||
      fail "save on 4 nodes / resume on 2 other nodes"
    # The data really is on the volume: its bricks hold the files.
    ls "$VOL"/bricks/b*/e2e/chain/step-00000012/data.h5 >/dev/null 2>&1 || fail "no data file of step 12 on any brick"
    ;;

  sharded)
    vol_name=$(sed -n 's/^VOL=//p' "$VOL/state")
    gluster --mode=script volume set "$vol_name" features.shard-block-size 4MB >/dev/null ||
      fail "could not set the volume's shard size"
    E2E_CLUSTER_ARGS="--shared $SH --shared-volume $VOL" E2E_TIMEOUT=200 H5DIFF=none \
      bash "$SRC/scripts/e2e_resume.sh" "$TRAIN" mpirun "$SH/e2e" tp2.pp1.dp2.zero@4x1 tp1.pp1.dp2@2x1+3 tp2.pp1.dp1@2x1 \
      --hidden 256 --ffn 512 || fail "save on 4 nodes / resume on 2 other nodes, sharded volume"
    # The data files really are spread: each brick holds pieces of them.
    for b in "$VOL"/bricks/b*; do
      n=0
      [[ -d $b/.shard ]] && n=$(find "$b/.shard" -type f | wc -l)
      ((n > 0)) || fail "brick $(basename "$b") holds no shard: the files were not spread"
      say "$(basename "$b"): $n shards"
    done
    ;;

  multilevel)
    E2E_CLUSTER_ARGS="--shared $SH --shared-volume $VOL --node-local $WORK/nl --node-disks $WORK/disks" \
      E2E_TIMEOUT=150 H5DIFF=none \
      bash "$SRC/scripts/e2e_resume.sh" "$TRAIN" mpirun "$SH/e2e" tp2.pp1.dp2.zero@4x1 tp1.pp1.dp2@2x1+3 tp2.pp1.dp1@2x1 \
      --local-dir "$WORK/nl" --persist-every 3 || fail "multi-level save on 4 nodes / resume on 2 other nodes"
    # Persists of the first job (steps 3 and 6) landed on the volume and validate there.
    for s in 3 6; do
      d=$SH/e2e/chain/step-0000000$s
      [[ -f $d/metadata.json ]] || fail "step $s was not persisted to the volume ($d)"
      "$CLI" verify "$d" >/dev/null || fail "persisted step $s on the volume does not verify"
    done
    # Nodes 3 and 4 started with empty disks: the resume must have come from the volume.
    for i in 3 4; do
      [[ -d $WORK/disks/node-$i ]] || fail "node-$i's disk was never used"
    done
    ;;

  latest)
    C=$SH/lt/c
    READER=$VOL/clients/node-3/lt/c  # node-3's client: caches of its own
    mkdir -p "$C"
    # Keep node-3's cached name and attributes of `latest` warm all along (a lookup, no listing: a
    # FUSE listing (READDIRPLUS) would refresh the cached names and hide the problem).
    (while :; do cat "$READER/latest" >/dev/null 2>&1; stat "$READER/latest" >/dev/null 2>&1; sleep 0.05; done) &
    BG+=($!)
    # save_every_step STEPS NAME: a background job on node-1..2 saving every step up to STEPS into
    # $C, synchronously (the report line of a step, $WORK/NAME.jsonl, is appended as soon as its
    # save has committed); its pid in SAVER, its output in $WORK/NAME.log.
    save_every_step() {
      : >"$WORK/$2.jsonl"
      # shellcheck disable=SC2046
      H5CKPT_ASYNC=0 cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) --steps "$1" --save-every 1 --ckpt-dir "$C" \
        --report "$WORK/$2.jsonl" --quiet >"$WORK/$2.log" 2>&1 &
      SAVER=$!
      BG+=("$SAVER")
    }
    REPORT=$WORK/saver.jsonl
    save_every_step 20 saver
    seen=0 checked=0
    # The trainer appends a report line after each save has committed; check each one at once.
    while :; do
      n=$(grep -c '"op":"save"' "$REPORT" || true)
      if ((n > seen)); then
        step=$(grep '"op":"save"' "$REPORT" | sed -n "${n}p" | sed -n 's/.*"step":\([0-9]*\).*/\1/p')
        [[ -n $step ]] || continue  # a line still being written
        got=$(selected_step "$READER") || fail "a load through node-3's client failed right after step $step committed"
        [[ -n $got ]] || fail "no step in the verify output"
        ((got >= step)) || fail "right after step $step committed, node-3's client selected step $got (an older checkpoint)"
        say "step $step committed: node-3 selects step $got"
        seen=$n checked=$((checked + 1))
        continue
      fi
      kill -0 "$SAVER" 2>/dev/null || break
      sleep 0.01
    done
    wait "$SAVER" || { cat "$WORK/saver.log"; fail "the saving job failed"; }
    ((checked >= 5)) || fail "only $checked saves were checked as they committed"
    # A node whose rank wrote part of a checkpoint loads it the moment it commits: its client cached
    # the data file's size before the coordinator on node-1 appended the index tables, and keeps it
    # for up to a second (the CI failure of stop 37: "table 'tensors' lies outside the data file").
    REPORT2=$WORK/saver2.jsonl
    save_every_step 21 saver2
    until grep -q '"op":"save"' "$REPORT2"; do
      kill -0 "$SAVER" 2>/dev/null || { cat "$WORK/saver2.log"; fail "the job saving step 21 ended without a save"; }
      sleep 0.01
    done
    t0=$(date +%s%N)
    got=$(selected_step "$VOL/clients/node-2/lt/c") ||
      fail "a load through node-2's client (a writer of step 21) failed right after step 21 committed"
    [[ $got == 21 ]] || fail "right after step 21 committed, node-2's client selected step $got"
    say "step 21 committed: node-2 (one of its writers) selects it, in $((($(date +%s%N) - t0) / 1000000)) ms"
    wait "$SAVER" || { cat "$WORK/saver2.log"; fail "the job saving step 21 failed"; }
    # Its resume from step 20 read from the volume with two threads per rank (io_threads 0: a
    # network file system).
    grep '"op":"load"' "$REPORT2" | grep -q '"io_threads":2' ||
      fail "the resume on the volume did not read with 2 threads per rank: $(grep '"op":"load"' "$REPORT2")"
    # Sharper, and independent of "newest": another client points `latest` at older checkpoints too
    # (tmp + rename, as update_latest does); 0.2 s later node-3 must select exactly what it names.
    WRITER=$VOL/clients/node-1/lt/c
    for s in 3 9 5 12 2 7; do
      cat "$READER/latest" >/dev/null
      printf 'step-%08d\n' "$s" >"$WRITER/latest.tmp.test"
      mv "$WRITER/latest.tmp.test" "$WRITER/latest"
      sleep 0.2
      got=$(selected_step "$READER") || fail "a load through node-3's client failed after 'latest' named step $s"
      [[ $got == "$s" ]] || fail "node-1 pointed 'latest' at step $s; 0.2 s later node-3's client selected step $got"
    done
    ;;

  lock)
    C=$SH/lk/c
    mkdir -p "$C"
    # Job A's first save stalls 8 s in its write phase (the coordinator's fsync), holding the lock.
    # shellcheck disable=SC2046
    H5CKPT_FAULT="op=fsync,phase=write,delay_ms=8000" cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) --steps 1 \
      --save-every 1 --ckpt-dir "$C" >"$WORK/a.log" 2>&1 &
    A=$!
    BG+=("$A")
    t=0
    until compgen -G "$C/.step-00000001.inprogress-*" >/dev/null; do
      ((t++ < 600)) || fail "job A's save never started"
      sleep 0.1
    done
    rc=0
    # shellcheck disable=SC2046
    out=$(cluster 2 3 -- "$TRAIN" --tp 2 $(train_args) --steps 1 --save-every 1 --ckpt-dir "$C" 2>&1) || rc=$?
    kill -0 "$A" 2>/dev/null || { cat "$WORK/a.log"; fail "job A ended before job B was checked"; }
    ((rc != 0)) || { echo "$out"; fail "job B on node-3..4 saved while job A on node-1..2 held the lock"; }
    grep -q "another save into '.*' is in progress (lock .* held by host=node-[12] pid=" <<<"$out" ||
      { echo "$out"; fail "job B's error does not name the holder on node-1 or node-2"; }
    wait "$A" || { cat "$WORK/a.log"; fail "job A failed"; }
    [[ $(cat "$C/latest") == step-00000001 ]] || fail "latest is '$(cat "$C/latest")' after job A"
    [[ $(selected_step "$C") == 1 ]] || fail "job A's checkpoint does not load"
    ;;

  brick)
    C=$SH/bk/c
    mkdir -p "$C"
    # shellcheck disable=SC2046
    cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) --steps 2 --save-every 1 --ckpt-dir "$C" --quiet ||
      fail "the first job failed"
    [[ $(selected_step "$C") == 2 ]] || fail "step 2 is not selected before the kill"
    # Step 3's save stalls 6 s after its pieces are written (coordinator's fsync); meanwhile the
    # brick that holds its data file dies.
    # shellcheck disable=SC2046
    H5CKPT_FAULT="op=fsync,phase=write,rank=0,delay_ms=6000" cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) \
      --steps 3 --save-every 1 --ckpt-dir "$C" --timeout-s 60 >"$WORK/kill.log" 2>&1 &
    J=$!
    BG+=("$J")
    t=0 brick=""
    while [[ -z $brick ]]; do
      f=$(compgen -G "$VOL/bricks/b*/bk/c/.step-00000003.inprogress-*/data.h5" | head -n1 || true)
      [[ -n $f ]] && brick=$(sed -n 's|.*/bricks/b\([0-9]*\)/.*|\1|p' <<<"$f")
      ((t++ < 600)) || { cat "$WORK/kill.log"; fail "step 3's data file never appeared on a brick"; }
      sleep 0.1
    done
    sleep 1
    t0=$SECONDS
    "$SRC/scripts/gluster.sh" kill-brick --dir "$VOL" "$brick" >/dev/null
    say "killed brick $brick mid-save"
    rc=0
    wait "$J" || rc=$?
    elapsed=$((SECONDS - t0))
    cat "$WORK/kill.log"
    ((rc != 0)) || fail "the save succeeded although the brick holding its data file died"
    ((elapsed <= 90)) || fail "the job took ${elapsed}s to fail after the kill (deadline 60 s)"
    # The error every rank reports: the same, naming what failed.
    nerr=$(grep -c "save .*step-00000003.*\(Transport endpoint\|Input/output\|No such file\|Stale\|not connected\|failed on rank\)" "$WORK/kill.log" || true)
    ((nerr >= 1)) || fail "no clear error naming the failed operation and file"
    "$SRC/scripts/gluster.sh" restart-brick --dir "$VOL"
    sleep 1
    [[ $(cat "$C/latest") == step-00000002 ]] || fail "latest is '$(cat "$C/latest")' after the failed save"
    [[ ! -e $C/step-00000003 ]] || fail "step 3 was committed although its save failed"
    [[ $(selected_step "$C") == 2 ]] || fail "the last good checkpoint (step 2) does not load after the brick is back"
    # A brick dead before a load: kill the one holding step 2's data file.
    f=$(compgen -G "$VOL/bricks/b*/bk/c/step-00000002/data.h5" | head -n1)
    brick=$(sed -n 's|.*/bricks/b\([0-9]*\)/.*|\1|p' <<<"$f")
    "$SRC/scripts/gluster.sh" kill-brick --dir "$VOL" "$brick" >/dev/null
    # Which files went with it decides the answer (latest, the step directories' files): say so.
    say "killed brick $brick before a load; it held: $(cd "$VOL/bricks/b$brick/bk/c" && find . -type f ! -path '*/.glusterfs/*' | sort | tr '\n' ' ')"
    rc=0
    # shellcheck disable=SC2046
    out=$(cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) --steps 3 --save-every 0 --ckpt-dir "$C" --timeout-s 60 2>&1) || rc=$?
    echo "$out" | tail -n 5
    if ((rc == 0)); then
      grep -q "resumed .* at step 1" <<<"$out" ||
        fail "the load succeeded with step 2's data file on a dead brick, without falling back to step 1"
    else
      grep -q "step-0000000[12]" <<<"$out" ||
        { echo "$out"; fail "the failed load does not name the checkpoint it could not read"; }
    fi
    "$SRC/scripts/gluster.sh" restart-brick --dir "$VOL"
    [[ $(selected_step "$C") == 2 ]] || fail "step 2 is not selected once its brick is back"
    ;;

  odirect)
    C=$SH/od
    mkdir -p "$C"
    # The saving ranks' O_DIRECT opens fail with EINVAL, as on a file system that refuses O_DIRECT
    # (the coordinator opens the file once more, to preallocate it, before its writer does).
    # shellcheck disable=SC2046
    H5CKPT_LOG_LEVEL=info H5CKPT_FAULT="op=open,phase=write,rank=0,nth=3,errno=EINVAL;op=open,phase=write,rank=1,nth=2,errno=EINVAL" \
      cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) --steps 2 --save-every 2 --ckpt-dir "$C/refused" >"$WORK/refused.log" 2>&1 ||
      { cat "$WORK/refused.log"; fail "the save failed when O_DIRECT was refused"; }
    # shellcheck disable=SC2046
    H5CKPT_LOG_LEVEL=info cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) --steps 2 --save-every 2 --ckpt-dir "$C/direct" \
      >"$WORK/direct.log" 2>&1 || { cat "$WORK/direct.log"; fail "the save with O_DIRECT failed"; }
    grep -q "with O_DIRECT" "$WORK/direct.log" || fail "the volume took no O_DIRECT write (nothing to compare)"
    ! grep -q "([1-9][0-9]* with O_DIRECT)" "$WORK/refused.log" || fail "O_DIRECT was used although its open was refused"
    "$CLI" diff "$C/refused" "$C/direct" >/dev/null || fail "the checkpoint saved without O_DIRECT differs"
    ;;

  fullbrick)
    C=$SH/fb/c
    mkdir -p "$C"
    # shellcheck disable=SC2046
    cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) --steps 1 --save-every 1 --ckpt-dir "$C" --quiet ||
      fail "the first job failed"
    [[ $(selected_step "$C") == 1 ]] || fail "step 1 is not selected before the bricks fill"
    # Fill the volume through the caller's client until every brick refuses more (the volume places
    # new files on the brick with room, so a few refusals in a row mean both are full).
    k=0 refused=0
    while ((refused < 4 && k < 100)); do
      k=$((k + 1))
      if dd if=/dev/zero of="$SH/fb/fill-$k" bs=1M count=8 status=none 2>/dev/null; then refused=0; else refused=$((refused + 1)); fi
    done
    ((refused >= 4)) || fail "the bricks never filled ($k files of 8 MiB written)"
    say "bricks full after $k files: $(df -h --output=avail "$VOL"/bricks/b* | tr '\n' ' ')"
    rc=0
    # shellcheck disable=SC2046
    cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) --steps 2 --save-every 1 --ckpt-dir "$C" --timeout-s 60 \
      >"$WORK/full.log" 2>&1 || rc=$?
    ((rc != 0)) || { cat "$WORK/full.log"; fail "the save succeeded on full bricks"; }
    grep -q "step-00000002.*No space left on device" "$WORK/full.log" ||
      { cat "$WORK/full.log"; fail "no error naming the checkpoint and 'No space left on device'"; }
    grep "No space left on device" "$WORK/full.log" | head -n 2
    rm -f "$SH"/fb/fill-*
    # The bricks see the room again only once each brick's free-space check has run again (a
    # directory is made on every brick, so a probe directory and file succeed once all of them do).
    t=0
    until mkdir "$SH/fb/probe" 2>/dev/null && dd if=/dev/zero of="$SH/fb/probe/f" bs=1M count=4 status=none 2>/dev/null; do
      rm -rf "$SH/fb/probe"
      ((t++ < 120)) || fail "the volume still refuses writes 60 s after the fill files were removed"
      sleep 0.5
    done
    rm -rf "$SH/fb/probe"
    [[ $(cat "$C/latest") == step-00000001 ]] || fail "latest is '$(cat "$C/latest")' after the failed save"
    [[ ! -e $C/step-00000002 ]] || fail "step 2 was committed although its save failed"
    [[ $(selected_step "$C") == 1 ]] || fail "the last good checkpoint (step 1) does not load after the failed save"
    # shellcheck disable=SC2046
    cluster 2 1 -- "$TRAIN" --tp 2 $(train_args) --steps 2 --save-every 1 --ckpt-dir "$C" --quiet ||
      fail "the save failed once the bricks had room again"
    [[ $(selected_step "$C") == 2 ]] || fail "step 2 is not selected after it committed"
    ;;

  *) fail "unknown case '$CASE'" ;;
esac
say "PASSED"
