#!/usr/bin/env bash
# A real distributed file system for the simulated cluster: a GlusterFS volume on this machine, one
# brick per simulated storage server, and one FUSE client (its own glusterfs process, its own
# caches) per simulated node.
#
#   scripts/gluster.sh start --dir DIR [--bricks B] [--clients N] [--brick-size SIZE] [--shard]
#   scripts/gluster.sh stop --dir DIR
#   scripts/gluster.sh status --dir DIR
#   scripts/gluster.sh kill-brick --dir DIR I        # kill -9 brick I (1..B): a dead storage server
#   scripts/gluster.sh restart-brick --dir DIR       # bring dead bricks back; waits until every client is reconnected
#   scripts/gluster.sh run --dir DIR [--bricks B] [--clients N] [--brick-size SIZE] [--shard] -- COMMAND ARGS...
#
# start: bricks are DIR/bricks/b1..bB (B = 2 by default), the volume is distributed over them and
# named after DIR; DIR/mnt is a client for the caller, DIR/clients/node-1..node-N (N = 4 by default)
# one client each for the nodes of scripts/cluster.sh (--shared-volume DIR bind-mounts node i's
# client at the shared path inside node i). Mount options stay at GlusterFS's defaults (1 s entry and
# attribute caches), which is what a shared-storage test must survive. --brick-size gives each brick
# a file system of its own of that size (a tmpfs, `mount -o size=SIZE`): storage servers that fill.
# --shard turns on GlusterFS's sharding (features.shard, 64 MB pieces placed over the bricks), so
# that one large file, such as a checkpoint's data file, is spread over every brick instead of
# living on one (as Lustre's striping does). Waits until every client
# answers. glusterd is shared by every volume on the machine: started if none runs, and stopped by
# the last stop of a volume whose start started it. Volumes left behind by a caller that died are
# cleaned up by the next start.
# stop: unmounts the clients, stops and deletes the volume, ends the brick and client processes and
# (last user) glusterd, each by pid, and removes DIR/bricks. Safe to call twice.
# run: start, run COMMAND with H5CKPT_GLUSTER_DIR=DIR in its environment, stop (also on a signal);
# exits with COMMAND's status.
#
# Exit status: 0; 2 usage; 125 when this machine cannot host a volume (not root, no /dev/fuse, no
# GlusterFS: Debian packages glusterfs-server glusterfs-client, see scripts/setup.sh); 1 otherwise.
set -euo pipefail

SETUP_FAILED=125
STATE_ROOT=/run/h5ckpt-gluster   # machine-wide: the lock, glusterd's pid if we started it, users
[[ -d /run && -w /run ]] || STATE_ROOT=/tmp/h5ckpt-gluster
VOL_RUN=/var/run/gluster/vols    # where glusterd writes the bricks' pid files

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }
die() { echo "gluster.sh: $1" >&2; exit "${2:-1}"; }
say() { [[ ${GLUSTER_QUIET:-0} == 1 ]] || echo "gluster.sh: $*" >&2; }
gcli() { gluster --mode=script "$@"; }

CMD=${1:-}
(($#)) && shift
DIR="" BRICKS=2 CLIENTS=4 BRICK_NO="" BRICK_SIZE="" SHARD=0
while (($#)); do
  case $1 in
    --dir) DIR=${2:?--dir needs a path}; shift 2 ;;
    --bricks) BRICKS=${2:?--bricks needs a count}; shift 2 ;;
    --clients) CLIENTS=${2:?--clients needs a count}; shift 2 ;;
    --brick-size) BRICK_SIZE=${2:?--brick-size needs a size}; shift 2 ;;
    --shard) SHARD=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    [0-9]*) BRICK_NO=$1; shift ;;
    *) die "unknown argument '$1'" 2 ;;
  esac
done
[[ -n $CMD && $CMD != -h && $CMD != --help ]] || usage
[[ -n $DIR ]] || die "--dir is required" 2
[[ $BRICKS =~ ^[1-9][0-9]?$ ]] || die "--bricks must be 1..99 (got '$BRICKS')" 2
[[ $CLIENTS =~ ^[0-9]+$ ]] && ((CLIENTS <= 254)) || die "--clients must be 0..254 (got '$CLIENTS')" 2
[[ -z $BRICK_SIZE || $BRICK_SIZE =~ ^[1-9][0-9]*[kKmMgG]?$ ]] || die "--brick-size must be a size such as 64m (got '$BRICK_SIZE')" 2
DIR=$(realpath -m -- "$DIR")
STATE=$DIR/state

check_machine() {
  (($(id -u) == 0)) || die "needs root (glusterd, FUSE mounts)" "$SETUP_FAILED"
  [[ -c /dev/fuse ]] || die "no /dev/fuse here (FUSE mounts impossible)" "$SETUP_FAILED"
  local c
  for c in glusterd gluster glusterfs; do
    command -v "$c" >/dev/null || die "$c not found (Debian: apt-get install glusterfs-server glusterfs-client)" "$SETUP_FAILED"
  done
}

# Everything that touches glusterd's users runs under one machine-wide lock.
with_lock() {
  mkdir -p "$STATE_ROOT/users"
  exec 8>"$STATE_ROOT/lock"
  flock -w 120 8 || die "timed out waiting for $STATE_ROOT/lock"
  "$@"
  local rc=$?
  exec 8>&-
  return $rc
}

alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }

wait_gone() {  # wait_gone PID SECONDS: SIGTERM was sent; SIGKILL after SECONDS
  local pid=$1 t=$(($2 * 10))
  while alive "$pid" && ((t-- > 0)); do sleep 0.1; done
  alive "$pid" && kill -9 "$pid" 2>/dev/null || true
  t=50
  while alive "$pid" && ((t-- > 0)); do sleep 0.1; done
  return 0
}

glusterd_pid() { pgrep -x glusterd | head -n1; }

ensure_glusterd() {
  if gcli volume list >/dev/null 2>&1; then return 0; fi
  if [[ -n $(glusterd_pid) ]]; then
    # Running but not answering yet (another caller just started it).
    local t=300
    while ! gcli volume list >/dev/null 2>&1; do
      ((t-- > 0)) || die "glusterd (pid $(glusterd_pid)) does not answer 'gluster volume list'"
      sleep 0.1
    done
    return 0
  fi
  say "starting glusterd"
  # 8>&-: the daemon must not inherit (and so hold forever) the lock of with_lock.
  glusterd -p "$STATE_ROOT/glusterd.pid" --log-file="$STATE_ROOT/glusterd.log" 8>&- ||
    die "glusterd did not start (see $STATE_ROOT/glusterd.log)"
  local t=300
  while ! gcli volume list >/dev/null 2>&1; do
    ((t-- > 0)) || die "glusterd started but does not answer (see $STATE_ROOT/glusterd.log)"
    sleep 0.1
  done
  echo started >"$STATE_ROOT/glusterd.ours"
}

# Client mount points of a volume's state file, one per line.
client_mounts() { local d=$1; echo "$d/mnt"; ls -d "$d"/clients/node-* 2>/dev/null || true; }

# Unmounts a client and sends its glusterfs process SIGTERM; prints the pid to wait for.
stop_client() {
  local mnt=$1 pidf pid
  pidf=$(dirname "$mnt")/.$(basename "$mnt").pid
  pid=$(cat "$pidf" 2>/dev/null || true)
  if mountpoint -q "$mnt" 2>/dev/null; then
    umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  fi
  if alive "$pid" && grep -q glusterfs "/proc/$pid/comm" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    echo "$pid"
  fi
  rm -f "$pidf"
}

# Tears down the volume described by state directory $1 (its own or a dead caller's).
teardown() {
  local d=$1 vol="" pid mnt
  [[ -f $d/state ]] && vol=$(sed -n 's/^VOL=//p' "$d/state")
  # All clients told to stop first, then waited for: each takes about 2 s to exit after SIGTERM.
  local stopping=()
  while IFS= read -r mnt; do
    pid=$(stop_client "$mnt")
    [[ -z $pid ]] || stopping+=("$pid")
  done < <(client_mounts "$d")
  for pid in "${stopping[@]}"; do wait_gone "$pid" 5; done
  if [[ -n $vol ]]; then
    local pids=()
    for f in "$VOL_RUN/$vol"/*.pid; do
      [[ -f $f ]] && pids+=("$(cat "$f")")
    done
    if gcli volume info "$vol" >/dev/null 2>&1; then
      gcli volume stop "$vol" force >/dev/null 2>&1 || true
      gcli volume delete "$vol" >/dev/null 2>&1 || say "could not delete volume $vol"
    fi
    for pid in "${pids[@]}"; do
      if alive "$pid" && grep -q glusterfsd "/proc/$pid/comm" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait_gone "$pid" 5
      fi
    done
    rm -f "$STATE_ROOT/users/$vol"
  fi
  unmount_bricks "$d"
  rm -rf "$d/bricks" "$d/state"
}

# The file systems of sized bricks (--brick-size), if any.
unmount_bricks() {
  local m
  for m in "$1"/bricks/b*; do
    if mountpoint -q "$m" 2>/dev/null; then umount "$m" 2>/dev/null || umount -l "$m" || true; fi
  done
}

# Last user gone and glusterd is ours: end it by its pid.
maybe_stop_glusterd() {
  [[ -z $(ls -A "$STATE_ROOT/users" 2>/dev/null) ]] || return 0
  [[ -f $STATE_ROOT/glusterd.ours ]] || return 0
  local pid
  pid=$(cat "$STATE_ROOT/glusterd.pid" 2>/dev/null || true)
  if alive "$pid"; then
    say "stopping glusterd (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    wait_gone "$pid" 10
  fi
  rm -f "$STATE_ROOT/glusterd.ours" "$STATE_ROOT/glusterd.pid"
}

clean_stale() {  # volumes whose owner died without stopping them
  local u owner d
  for u in "$STATE_ROOT"/users/*; do
    [[ -f $u ]] || continue
    owner=$(sed -n 's/^OWNER=//p' "$u") d=$(sed -n 's/^DIR=//p' "$u")
    alive "$owner" && continue
    say "cleaning up volume $(basename "$u") left by dead process $owner ($d)"
    teardown "$d"
    rm -f "$u"
  done
}

mount_client() {  # mount_client MOUNTPOINT: one glusterfs FUSE client with default options
  local mnt=$1 vol=$2 pidf t
  pidf=$(dirname "$mnt")/.$(basename "$mnt").pid
  mkdir -p "$mnt"
  glusterfs --process-name fuse --volfile-server="$(hostname)" --volfile-id="/$vol" \
    --pid-file="$pidf" --log-file="$DIR/logs/client-$(basename "$mnt").log" "$mnt" 8>&- ||
    die "mounting $vol at $mnt failed (see $DIR/logs/client-$(basename "$mnt").log)"
  t=300
  until mountpoint -q "$mnt" && stat "$mnt/." >/dev/null 2>&1 && [[ $(stat -f -c %T "$mnt") == fuseblk || $(stat -f -c %T "$mnt") == fuse* ]]; do
    ((t-- > 0)) || die "$mnt did not come up (see $DIR/logs/client-$(basename "$mnt").log)"
    sleep 0.1
  done
}

do_start() {
  check_machine
  [[ ! -f $STATE ]] || die "$DIR already holds a volume ($(sed -n 's/^VOL=//p' "$STATE")); stop it first"
  mkdir -p "$DIR/logs"
  local vol i bricks=() owner=${GLUSTER_OWNER:-$PPID}
  # Volume names: letters, digits, - and _; unique per directory.
  vol=h5ckpt-$(printf '%s' "$DIR" | md5sum | cut -c1-10)
  start_locked() {
    clean_stale
    ensure_glusterd
    printf 'OWNER=%s\nDIR=%s\n' "$owner" "$DIR" >"$STATE_ROOT/users/$vol"
  }
  with_lock start_locked
  printf 'VOL=%s\nBRICKS=%s\nCLIENTS=%s\n' "$vol" "$BRICKS" "$CLIENTS" >"$STATE"
  if gcli volume info "$vol" >/dev/null 2>&1; then  # a leftover of a crashed run in the same DIR
    gcli volume stop "$vol" force >/dev/null 2>&1 || true
    gcli volume delete "$vol" >/dev/null 2>&1 || true
  fi
  unmount_bricks "$DIR"
  rm -rf "$DIR/bricks"
  for ((i = 1; i <= BRICKS; i++)); do
    mkdir -p "$DIR/bricks/b$i"
    if [[ -n $BRICK_SIZE ]]; then
      mount -t tmpfs -o "size=$BRICK_SIZE" "h5ckpt-brick-b$i" "$DIR/bricks/b$i" || die "could not mount a $BRICK_SIZE file system for brick $i"
    fi
    bricks+=("$(hostname):$DIR/bricks/b$i")
  done
  # force: the bricks sit on the root file system (a real cluster gives each its own disk).
  gcli volume create "$vol" "${bricks[@]}" force >/dev/null || die "gluster volume create $vol failed"
  if ((SHARD)); then
    gcli volume set "$vol" features.shard on >/dev/null || die "gluster volume set $vol features.shard on failed"
  fi
  gcli volume start "$vol" >/dev/null || die "gluster volume start $vol failed"
  mount_client "$DIR/mnt" "$vol"
  for ((i = 1; i <= CLIENTS; i++)); do mount_client "$DIR/clients/node-$i" "$vol"; done
  say "volume $vol: $BRICKS bricks under $DIR/bricks, client at $DIR/mnt, $CLIENTS node clients under $DIR/clients$( ((SHARD)) && echo ", sharded")"
}

do_stop() {
  [[ -f $STATE ]] || { say "nothing to stop in $DIR"; return 0; }
  local vol
  vol=$(sed -n 's/^VOL=//p' "$STATE")
  stop_locked() {
    teardown "$DIR"
    maybe_stop_glusterd
  }
  with_lock stop_locked
  say "stopped volume $vol"
}

brick_pid() {  # brick_pid VOL I: glusterd names the pid file HOST-<brick path with / as ->.pid
  local f
  f=$(ls "$VOL_RUN/$1"/*-bricks-b"$2".pid 2>/dev/null | head -n1)
  [[ -n $f ]] && cat "$f"
}

do_status() {
  [[ -f $STATE ]] || die "no volume in $DIR"
  local vol
  vol=$(sed -n 's/^VOL=//p' "$STATE")
  gcli volume status "$vol"
}

do_kill_brick() {
  [[ -f $STATE ]] || die "no volume in $DIR"
  [[ -n $BRICK_NO ]] || die "kill-brick needs a brick number" 2
  local vol pid
  vol=$(sed -n 's/^VOL=//p' "$STATE")
  pid=$(brick_pid "$vol" "$BRICK_NO") || true
  alive "$pid" || die "brick $BRICK_NO of $vol is not running"
  kill -9 "$pid"
  wait_gone "$pid" 5
  echo "$pid"
}

do_restart_brick() {
  [[ -f $STATE ]] || die "no volume in $DIR"
  local vol
  vol=$(sed -n 's/^VOL=//p' "$STATE")
  gcli volume start "$vol" force >/dev/null || die "gluster volume start $vol force failed"
  local i t
  for ((i = 1; i <= $(sed -n 's/^BRICKS=//p' "$STATE"); i++)); do
    t=100
    until alive "$(brick_pid "$vol" "$i" || true)"; do
      ((t-- > 0)) || die "brick $i of $vol did not come back"
      sleep 0.1
    done
  done
  # A live brick is not yet a usable one: each client reconnects on its own timer (about 2 s here),
  # and until then files on that brick look absent. Wait until every client's protocol translator
  # reports itself connected (the mount's virtual .meta tree).
  local mnt x
  while IFS= read -r mnt; do
    t=300
    for x in "$mnt"/.meta/graphs/active/"$vol"-client-*; do
      until grep -q '^connected = 1' "$x/private" 2>/dev/null; do
        ((t-- > 0)) || die "client $mnt did not reconnect to $(basename "$x") of $vol"
        sleep 0.1
      done
    done
  done < <(client_mounts "$DIR")
}

case $CMD in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  kill-brick) do_kill_brick ;;
  restart-brick) do_restart_brick ;;
  run)
    (($#)) || die "run needs a command after --" 2
    GLUSTER_OWNER=$$ do_start
    CHILD=""
    on_exit() { GLUSTER_QUIET=${GLUSTER_QUIET:-0} do_stop; }
    trap on_exit EXIT
    trap 'if [[ -n $CHILD ]]; then kill -TERM "$CHILD" 2>/dev/null || true; wait "$CHILD" 2>/dev/null || true; fi; exit 143' TERM INT HUP
    rc=0
    H5CKPT_GLUSTER_DIR=$DIR "$@" <&0 &
    CHILD=$!
    wait "$CHILD" || rc=$?
    CHILD=""
    exit "$rc"
    ;;
  *) die "unknown command '$CMD' (start, stop, status, kill-brick, restart-brick, run)" 2 ;;
esac
