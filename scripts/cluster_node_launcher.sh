#!/usr/bin/env bash
# The "ssh" of scripts/cluster.sh (mpirun --mca plm_rsh_agent THIS): mpirun calls it as
#   cluster_node_launcher.sh [ssh options] HOST COMMAND...
# to start its daemon (orted) on HOST. Instead of logging in somewhere, it starts COMMAND here, in a
# new UTS + mount namespace that plays node HOST: the host name is HOST, and the node-local path
# ($H5CKPT_CLUSTER_NODE_LOCAL) is a bind mount of the node's own disk
# ($H5CKPT_CLUSTER_NODE_DISKS/HOST), which no other node sees. Everything the daemon starts (the
# ranks of that node) inherits the namespaces; they vanish when the daemon exits, the disk stays.
# With $H5CKPT_CLUSTER_SHARED, node HOST's own client of the shared volume
# ($H5CKPT_CLUSTER_SHARED_CLIENTS/HOST, mounted by scripts/gluster.sh) is bind-mounted there.
# Without $H5CKPT_CLUSTER_KEEP_ENV=1 the daemon starts with a login-like environment, as over ssh:
# only what mpirun forwards with -x reaches the ranks.
set -euo pipefail

die() { echo "cluster_node_launcher: $*" >&2; exit 255; }  # 255: what ssh returns on failure

# Open MPI passes no options to an agent that is not ssh/rsh, but skip any, as ssh would take them.
while (($#)) && [[ $1 == -* ]]; do
  case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;  # ssh options that take a value
    *) shift ;;
  esac
done
(($# >= 2)) || die "usage: $0 HOST COMMAND..."
HOST=$1
shift
[[ $HOST =~ ^[A-Za-z0-9][A-Za-z0-9.-]*$ ]] || die "bad host name '$HOST'"

LOCAL=${H5CKPT_CLUSTER_NODE_LOCAL:-}
DISKS=${H5CKPT_CLUSTER_NODE_DISKS:-}
if [[ -n $LOCAL || -n $DISKS ]]; then
  [[ $LOCAL == /* && $DISKS == /* ]] ||
    die "H5CKPT_CLUSTER_NODE_LOCAL and H5CKPT_CLUSTER_NODE_DISKS must both be absolute paths"
fi

# Like ssh, the remote command is one string for the remote shell: Open MPI quotes the orted's
# arguments for it (e.g. -mca orte_hnp_uri "…;tcp://…"), so join them and let bash parse them.
COMMAND="$*"

# What runs inside the node's namespaces. $1 = host, $2 = node-local path, $3 = its disk, $4 = command,
# $5 = shared path, $6 = this node's client of the shared volume.
# rprivate first, so that the bind mount does not propagate back into the host's namespace.
# The node-local path is created if missing: it must exist to be a mount point (on the host it
# stays an empty directory).
NODE_SETUP='
set -e
hostname "$1"
mount --make-rprivate /
if [ -n "$2" ]; then
  mkdir -p "$3" "$2"
  mount --bind "$3" "$2"
fi
if [ -n "$5" ]; then
  mkdir -p "$5"
  mount --bind "$6" "$5"
fi
eval "exec $4"
'

if [[ -n $LOCAL ]]; then DISK=$DISKS/$HOST; else DISK=""; fi
SHARED=${H5CKPT_CLUSTER_SHARED:-} CLIENT=""
if [[ -n $SHARED ]]; then
  [[ $SHARED == /* && ${H5CKPT_CLUSTER_SHARED_CLIENTS:-} == /* ]] ||
    die "H5CKPT_CLUSTER_SHARED and H5CKPT_CLUSTER_SHARED_CLIENTS must both be absolute paths"
  CLIENT=$H5CKPT_CLUSTER_SHARED_CLIENTS/$HOST
  mountpoint -q "$CLIENT" || die "$CLIENT (node $HOST's client of the shared volume) is not mounted"
fi
if [[ ${H5CKPT_CLUSTER_DEBUG:-0} == 1 ]]; then
  echo "cluster_node_launcher: $HOST: disk ${DISK:-none} at ${LOCAL:-none}, shared ${CLIENT:-none} at ${SHARED:-none}: $COMMAND" >&2
fi

ENV_PREFIX=()
if [[ ${H5CKPT_CLUSTER_KEEP_ENV:-0} != 1 ]]; then
  # A login-like environment, as sshd gives; PATH and LD_LIBRARY_PATH as on a cluster whose nodes
  # share the software (and the same loaded modules).
  ENV_PREFIX=(env -i)
  for v in PATH LD_LIBRARY_PATH HOME USER LOGNAME SHELL LANG LC_ALL TERM TMPDIR; do
    [[ -n ${!v:-} ]] && ENV_PREFIX+=("$v=${!v}")
  done
fi

exec "${ENV_PREFIX[@]}" unshare --uts --mount --propagation private \
  bash -c "$NODE_SETUP" node-setup "$HOST" "$LOCAL" "$DISK" "$COMMAND" "$SHARED" "$CLIENT"
