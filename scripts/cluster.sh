#!/usr/bin/env bash
# A simulated cluster on one machine: runs PROGRAM under Open MPI's mpirun as N nodes x R ranks.
#
#   scripts/cluster.sh --nodes N --ranks-per-node R [--first-node K]
#                      [--node-local PATH --node-disks ROOT] [--shared PATH --shared-volume DIR]
#                      [--keep-env] [--env NAME[=VALUE]]... [--timeout SECONDS]
#                      [--mca KEY VALUE]... [--mpirun-arg ARG]... [--wire-rate RATE]
#                      [--verbose] -- PROGRAM ARGS...
#
# Node i (1..N) is called node-i, on its own loopback address 127.0.1.i (added to /etc/hosts).
# mpirun "logs in" to it with scripts/cluster_node_launcher.sh instead of ssh, which starts the
# node's daemon here in its own UTS + mount namespace: MPI_Get_processor_name says node-i,
# MPI_COMM_TYPE_SHARED splits per node, traffic between nodes goes over TCP (loopback), and with
# --node-local PATH the ranks of node i see ROOT/node-i at PATH, and no other node's disk. The disks
# persist across jobs; delete ROOT/node-i to simulate losing node i's local disk.
# --first-node K: the job runs on node-K .. node-(K+N-1) (another set of nodes than a job on node-1..).
# --shared PATH --shared-volume DIR: the ranks of node i see node i's own client of the GlusterFS
# volume that `scripts/gluster.sh start --dir DIR` started (DIR/clients/node-i, a separate FUSE
# client with its own caches) at PATH: a shared file system every node mounts, as on a real cluster.
# --wire-rate RATE (tc's syntax: 10gbit, 500mbit): the wire between nodes gets that bandwidth. All
# nodes share the loopback, which moves bytes at memory speed; a real cluster's link is slower. The
# job's MPI TCP connections use ports 30720-30783, and a tc htb class on lo limits them to RATE (one
# class for both directions, as one half-duplex link); it is removed on exit. Shaped jobs take turns
# (a lock). Needs tc (iproute2) and the kernel's htb and u32.
#
# Environment: like ssh, a node starts with a login-like environment (PATH, LD_LIBRARY_PATH, HOME,
# ...); the ranks get H5CKPT_* and OMPI_MCA_* from the caller's environment and the --env ones
# (NAME=VALUE sets it, NAME forwards the caller's value). --keep-env gives the nodes the caller's
# whole environment instead. Standard input goes to rank 0 as with plain mpirun.
#
# Exit status: mpirun's (the program's, or non-zero on a launch failure or --timeout);
# 2 for a usage error; 125 when the cluster cannot be set up here (not root, no unshare, no
# namespaces, /etc/hosts not writable), before anything is launched.
# Needs root: host names in /etc/hosts, namespaces and mounts. See docs/testing.md.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAUNCHER=$SCRIPT_DIR/cluster_node_launcher.sh
HOSTS_FILE=/etc/hosts
SETUP_FAILED=125

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }
die() { echo "cluster.sh: $1" >&2; exit "${2:-2}"; }
unavailable() { die "$1" "$SETUP_FAILED"; }

NODES="" RPN="" FIRST=1 LOCAL="" DISKS="" SHARED="" VOLUME="" KEEP_ENV=0 TIMEOUT=0 VERBOSE=0 WIRE_RATE=""
ENV_NAMES=() EXTRA=()
while (($#)); do
  case $1 in
    --nodes) NODES=${2:?--nodes needs a value}; shift 2 ;;
    --ranks-per-node) RPN=${2:?--ranks-per-node needs a value}; shift 2 ;;
    --first-node) FIRST=${2:?--first-node needs a value}; shift 2 ;;
    --shared) SHARED=${2:?--shared needs a path}; shift 2 ;;
    --shared-volume) VOLUME=${2:?--shared-volume needs a directory}; shift 2 ;;
    --node-local) LOCAL=${2:?--node-local needs a path}; shift 2 ;;
    --node-disks) DISKS=${2:?--node-disks needs a path}; shift 2 ;;
    --keep-env) KEEP_ENV=1; shift ;;
    --env)
      e=${2:?--env needs NAME or NAME=VALUE}
      name=${e%%=*}
      [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "--env: bad variable name '$name'"
      [[ $e == *=* ]] && export "$name=${e#*=}"
      ENV_NAMES+=("$name"); shift 2 ;;
    --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift 2 ;;
    --mca) EXTRA+=(--mca "${2:?--mca needs KEY VALUE}" "${3:?--mca needs KEY VALUE}"); shift 3 ;;
    --mpirun-arg) EXTRA+=("${2:?--mpirun-arg needs a value}"); shift 2 ;;
    --wire-rate) WIRE_RATE=${2:?--wire-rate needs a rate, e.g. 10gbit}; shift 2 ;;
    --verbose) VERBOSE=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) die "unknown option '$1' (the program goes after --; --help for usage)" ;;
  esac
done
(($#)) || die "no program given (usage: cluster.sh --nodes N --ranks-per-node R [...] -- PROGRAM ARGS...)"
[[ $NODES =~ ^[1-9][0-9]*$ ]] && ((NODES <= 254)) || die "--nodes must be 1..254 (got '${NODES}')"
[[ $FIRST =~ ^[1-9][0-9]*$ ]] && ((FIRST + NODES - 1 <= 254)) || die "--first-node must be 1..$((255 - NODES)) (got '${FIRST}')"
[[ $RPN =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-node must be a positive integer (got '${RPN}')"
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds (got '$TIMEOUT')"
[[ -z $WIRE_RATE || $WIRE_RATE =~ ^[0-9]+(\.[0-9]+)?[kmgt]?(bit|bps)$ ]] ||
  die "--wire-rate takes tc's rate syntax, e.g. 10gbit or 800mbit (got '$WIRE_RATE')"
if [[ -n $LOCAL || -n $DISKS ]]; then
  [[ -n $LOCAL && -n $DISKS ]] || die "--node-local and --node-disks go together"
  # Absolute, so that every node's namespace resolves them the same way.
  LOCAL=$(realpath -m -- "$LOCAL")
  DISKS=$(realpath -m -- "$DISKS")
  [[ $LOCAL != / ]] || die "--node-local cannot be /"
  [[ $LOCAL != "$DISKS" && $LOCAL != "$DISKS"/* ]] || die "--node-local must not be inside --node-disks"
fi

if [[ -n $SHARED || -n $VOLUME ]]; then
  [[ -n $SHARED && -n $VOLUME ]] || die "--shared and --shared-volume go together"
  SHARED=$(realpath -m -- "$SHARED")
  VOLUME=$(realpath -m -- "$VOLUME")
  [[ $SHARED != / ]] || die "--shared cannot be /"
  [[ -z $LOCAL || ($SHARED != "$LOCAL" && $SHARED != "$LOCAL"/* && $LOCAL != "$SHARED"/*) ]] ||
    die "--shared and --node-local must not contain each other"
  for ((i = FIRST; i < FIRST + NODES; i++)); do
    mountpoint -q "$VOLUME/clients/node-$i" ||
      die "$VOLUME/clients/node-$i is not a mounted client (scripts/gluster.sh start --dir $VOLUME --clients $((FIRST + NODES - 1)))"
  done
fi

# --- can this machine host the cluster? --------------------------------------------------------
(($(id -u) == 0)) || unavailable "needs root (host names in /etc/hosts, namespaces and bind mounts); run as root"
command -v unshare >/dev/null || unavailable "unshare not found (Debian: apt-get install util-linux)"
command -v mpirun >/dev/null || unavailable "mpirun not found (Debian: apt-get install openmpi-bin)"
[[ -x $LAUNCHER ]] || unavailable "$LAUNCHER is missing or not executable"
if ! err=$(unshare --uts --mount --propagation private true 2>&1); then
  unavailable "cannot create UTS + mount namespaces here (unshare: $err); a container needs CAP_SYS_ADMIN"
fi
if [[ -n $WIRE_RATE ]]; then
  command -v tc >/dev/null || unavailable "--wire-rate needs tc (Debian: apt-get install iproute2)"
fi
if ! mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  unavailable "mpirun is not Open MPI's ($(mpirun --version 2>&1 | head -n1)); the launcher relies on plm_rsh_agent"
fi

# --- host names: node-i on 127.0.1.i ---------------------------------------------------------
# Open MPI refuses a hostfile entry that resolves to 127.0.0.1 (it is "this host"); any other
# loopback address works and reaches this machine. Added once, under a lock, since parallel tests
# may race here; an existing different mapping is an error rather than silently replaced.
add_host_names() {
  local i addr name missing=()
  for ((i = FIRST; i < FIRST + NODES; i++)); do
    addr=127.0.1.$i name=node-$i
    if grep -Eq "^[[:space:]]*${addr//./\\.}([[:space:]].*)?[[:space:]]${name}([[:space:]]|\$)" "$HOSTS_FILE"; then
      continue
    fi
    if grep -Eq "^[^#]*[[:space:]]${name}([[:space:]]|\$)" "$HOSTS_FILE"; then
      die "$HOSTS_FILE maps $name to another address: $(grep -E "[[:space:]]${name}([[:space:]]|\$)" "$HOSTS_FILE" | head -n1); expected $addr" "$SETUP_FAILED"
    fi
    missing+=("$addr $name")
  done
  ((${#missing[@]})) || return 0
  # Appended in place (not replaced by rename): /etc/hosts may be a bind mount in a container.
  { [[ -z $(tail -c1 "$HOSTS_FILE") ]] || echo; printf '%s\n' "${missing[@]}"; } >>"$HOSTS_FILE" ||
    die "cannot add the node names to $HOSTS_FILE (read-only?)" "$SETUP_FAILED"
}
LOCK_DIR=/run/lock
[[ -d $LOCK_DIR && -w $LOCK_DIR ]] || LOCK_DIR=/tmp
(
  # flock on a separate file: editors replace /etc/hosts by rename, which would drop a lock on it.
  exec 9>"$LOCK_DIR/h5ckpt-cluster-hosts.lock"
  flock -w 30 9 || die "timed out waiting for the lock on $HOSTS_FILE" "$SETUP_FAILED"
  add_host_names
)
for ((i = FIRST; i < FIRST + NODES; i++)); do
  got=$(getent hosts "node-$i" | awk '{print $1; exit}')
  [[ $got == "127.0.1.$i" ]] || unavailable "node-$i resolves to '${got}', not 127.0.1.$i (check /etc/hosts and nsswitch.conf)"
done

# --- the job ------------------------------------------------------------------------------------
HOSTFILE=$(mktemp "${TMPDIR:-/tmp}/h5ckpt-cluster-hosts.XXXXXX")
MPIRUN_PID=""
SHAPED=0
cleanup() {
  rm -f "$HOSTFILE"
  if ((SHAPED)); then tc qdisc del dev lo root 2>/dev/null || true; fi
}
trap cleanup EXIT
# A test harness's timeout (SIGTERM) must end mpirun, which ends its daemons and their namespaces.
on_signal() {
  if [[ -n $MPIRUN_PID ]]; then
    kill -TERM "$MPIRUN_PID" 2>/dev/null || true
    wait "$MPIRUN_PID" 2>/dev/null || true
  fi
  exit 143
}
trap on_signal TERM INT HUP
for ((i = FIRST; i < FIRST + NODES; i++)); do echo "node-$i slots=$RPN"; done >"$HOSTFILE"

# What the launcher needs to know, through mpirun's environment (the agent inherits it).
export H5CKPT_CLUSTER_NODE_LOCAL=$LOCAL H5CKPT_CLUSTER_NODE_DISKS=$DISKS H5CKPT_CLUSTER_KEEP_ENV=$KEEP_ENV
export H5CKPT_CLUSTER_SHARED=$SHARED H5CKPT_CLUSTER_SHARED_CLIENTS=${VOLUME:+$VOLUME/clients}
if [[ -n $DISKS ]]; then mkdir -p "$DISKS"; fi

# shellcheck disable=SC2054  # commas inside MCA values, not array separators
ARGS=(--hostfile "$HOSTFILE" -np $((NODES * RPN)) --map-by slot
      --allow-run-as-root --oversubscribe --bind-to none
      # Start every node's daemon from mpirun through our launcher; without no_tree_spawn the
      # daemons of the first nodes would launch the later ones from inside their own namespaces.
      --mca plm_rsh_agent "$LAUNCHER" --mca plm_rsh_no_tree_spawn 1
      # Between nodes only TCP: ob1 with tcp (vader within a node, self). UCX or libfabric would
      # see one machine and could use shared memory across the simulated nodes.
      --mca pml ob1 --mca btl tcp,vader,self
      # The TCP BTL skips 127.0.0.0/8 by default and uses the machine's other interfaces; where there
      # is none (a container without a network), ranks on different nodes "are unable to reach each
      # other". Loopback always works and keeps the job off the real network.
      --mca btl_tcp_if_include lo
      # Same for mpirun <-> daemons (not needed where there is a real interface, harmless).
      --mca oob_tcp_if_include lo)
((TIMEOUT > 0)) && ARGS+=(--timeout "$TIMEOUT")
if [[ -n $WIRE_RATE ]]; then
  # Ports 0x7800-0x783F: a range u32 matches with one mask, below the kernel's ephemeral ports
  # (32768 up), so the connecting end of no other connection lands in it. Both directions of a
  # connection carry a listening port.
  WIRE_PORT=30720 WIRE_MASK=0xffc0
  ARGS+=(--mca btl_tcp_port_min_v4 $WIRE_PORT --mca btl_tcp_port_range_v4 64)
  # Held until this script exits: lo has one root qdisc, so shaped jobs take turns.
  exec 8>"$LOCK_DIR/h5ckpt-cluster-wire.lock"
  flock -w 900 8 || unavailable "timed out waiting for another job's shaped wire (lock $LOCK_DIR/h5ckpt-cluster-wire.lock)"
  if tc qdisc show dev lo | grep -q '^qdisc htb'; then
    unavailable "lo already has an htb qdisc that this script did not add ($(tc qdisc show dev lo | head -n1)); remove it with: tc qdisc del dev lo root"
  fi
  SHAPED=1
  shape_wire() {
    tc qdisc add dev lo root handle 1: htb default 1 || return  # no class 1: other traffic unshaped
    tc class add dev lo parent 1: classid 1:2 htb rate "$WIRE_RATE" ceil "$WIRE_RATE" burst 1m cburst 1m \
      quantum 200000 || return
    local field
    for field in dport sport; do
      tc filter add dev lo protocol ip parent 1: prio 1 u32 match ip protocol 6 0xff \
        match ip "$field" $WIRE_PORT $WIRE_MASK flowid 1:2 || return
    done
  }
  shape_wire || unavailable "could not shape lo with tc (htb and u32 in the kernel?)"
fi
# Every node's ranks share this machine's cores, but each node declares slots=R, so Open MPI does
# not see the oversubscription and its ranks spin while they wait. Over TCP a message then waits
# for both ends to be scheduled between the spinners: a 4x2 trainer job took 50 s instead of 5.
if ((NODES * RPN > $(nproc))) && [[ -z ${OMPI_MCA_mpi_yield_when_idle:-} ]]; then
  ARGS+=(--mca mpi_yield_when_idle 1)
fi
# The ranks' environment: H5CKPT_* and OMPI_MCA_* from the caller (not the launcher's own
# settings), plus --env ones.
while IFS= read -r name; do
  [[ $name == H5CKPT_CLUSTER_* ]] && continue
  ARGS+=(-x "$name")
done < <(compgen -e | grep -E '^(H5CKPT_|OMPI_MCA_)' || true)
for name in "${ENV_NAMES[@]}"; do ARGS+=(-x "$name"); done
ARGS+=("${EXTRA[@]}")

((VERBOSE)) && echo "cluster.sh: $NODES nodes x $RPN ranks from node-$FIRST${LOCAL:+, node-local $LOCAL on $DISKS/node-i}${SHARED:+, shared $SHARED on $VOLUME/clients/node-i}${WIRE_RATE:+, wire $WIRE_RATE}:" \
  "mpirun ${ARGS[*]} $*" >&2
((VERBOSE)) && export H5CKPT_CLUSTER_DEBUG=1

# In the background so that the signal trap can run while mpirun does; stdin passed explicitly
# (a background job would otherwise get /dev/null).
# mpirun races with the launcher's exec for setpgid and then warns "plm:rsh: Warning: setpgid(...)
# failed in parent with errno=Permission denied" at random: harmless (the child sets its own
# group), so that line alone is filtered out of stderr.
RUN=(mpirun)
# A second line of defence if mpirun itself hangs (e.g. a daemon never calls back).
((TIMEOUT > 0)) && RUN=(timeout --kill-after=10 $((TIMEOUT + 30)) mpirun)
rc=0
"${RUN[@]}" "${ARGS[@]}" "$@" <&0 8>&- 2> >(grep --line-buffered -v 'plm:rsh: Warning: setpgid(' >&2) &
MPIRUN_PID=$!
wait "$MPIRUN_PID" || rc=$?
MPIRUN_PID=""
exit "$rc"
