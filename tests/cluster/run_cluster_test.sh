#!/usr/bin/env bash
# The simulated cluster of scripts/cluster.sh, checked by tests/cluster/cluster_probe.c:
#   1. a fresh job on N nodes x R ranks: node names, one MPI_COMM_TYPE_SHARED communicator per
#      node, transport across nodes, each node sees only its own node-local files; the ranks get
#      H5CKPT_* and --env variables but not the rest of the caller's environment;
#   2. a second job on the same disks: every node finds the files of its own ranks from job 1
#      (with --keep-env: the caller's whole environment);
#   3. node-2's disk deleted: node 2 starts empty, the others still find theirs;
#   6. --wire-rate: a wire of 500 Mbit/s between nodes carries 32 MiB no faster than that (and the
#      same check fails on the unshaped loopback), and lo is left as it was;
# plus checks from outside: the disks hold what each node wrote, nothing leaked into the host's
# node-local path or mount table, the probe does fail when the cluster is not what it expects, and
# the script returns the program's exit status.
# Usage: run_cluster_test.sh SOURCE_DIR PROBE NODES RANKS_PER_NODE
# Exit 77 (skipped) when not root or when UTS/mount namespaces cannot be created here.
set -euo pipefail
SRC=$1 PROBE=$2 NODES=$3 RPN=$4
SKIP=77
CLUSTER=$SRC/scripts/cluster.sh

say() { echo "cluster test ${NODES}x${RPN}: $*"; }
skip() { say "SKIPPED: $*"; exit $SKIP; }
fail() { say "FAILED: $*"; exit 1; }

[[ $(id -u) == 0 ]] || skip "needs root (host names in /etc/hosts, namespaces, bind mounts)"
command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"
err=$(unshare --uts --mount --propagation private true 2>&1) ||
  skip "UTS + mount namespaces are unavailable here: $err"
[[ -x $PROBE ]] || fail "probe $PROBE is not built"

WORK=$(mktemp -d /tmp/h5ckpt-cluster-test.XXXXXX)
LOCAL=$WORK/node-local  # what the ranks see; a distinct path per test run, so tests may run in parallel
DISKS=$WORK/disks       # the nodes' disks: $DISKS/node-i
cleanup() { if [[ ${KEEP_WORK:-0} == 1 ]]; then say "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

cluster() { "$CLUSTER" --nodes "$NODES" --ranks-per-node "$RPN" --node-local "$LOCAL" --node-disks "$DISKS" \
  --timeout 60 "$@"; }
probe_args=(--nodes "$NODES" --ranks-per-node "$RPN" --node-local "$LOCAL")
# Ranks of node i under --map-by slot: (i-1)*R .. i*R-1.
expect_disk() {  # expect_disk I: the files on node i's disk, seen from the host
  local i=$1 r want="" got
  for ((r = (i - 1) * RPN; r < i * RPN; r++)); do want+="rank-$r "; done
  got=$(cd "$DISKS/node-$i" && ls -1 | sort -V | tr '\n' ' ') || fail "no disk $DISKS/node-$i"
  [[ $got == "$want" ]] || fail "disk of node-$i holds '$got', expected '$want'"
  for ((r = (i - 1) * RPN; r < i * RPN; r++)); do
    [[ $(cat "$DISKS/node-$i/rank-$r") == "node-$i" ]] || fail "$DISKS/node-$i/rank-$r was not written on node-$i"
  done
}
no_leaks() {  # nothing of the nodes is visible on the host
  [[ -z $(ls -A "$LOCAL" 2>/dev/null) ]] || fail "node-local files leaked into the host's $LOCAL: $(ls -A "$LOCAL")"
  ! grep -q " $LOCAL " /proc/self/mountinfo || fail "a node's mount of $LOCAL is visible on the host"
}

start=$SECONDS
say "1. fresh disks"
H5CKPT_PROBE_VAR=forwarded PROBE_PRIVATE=not-forwarded cluster --env PROBE_EXTRA=by-env -- \
  "$PROBE" "${probe_args[@]}" --expect-env H5CKPT_PROBE_VAR=forwarded --expect-env PROBE_EXTRA=by-env \
  --expect-unset PROBE_PRIVATE || fail "job 1 (fresh disks) exited $?"
for ((i = 1; i <= NODES; i++)); do expect_disk "$i"; done
no_leaks

say "2. same disks again: files persist on their node"
PROBE_PRIVATE=kept cluster --keep-env -- "$PROBE" "${probe_args[@]}" --expect-persisted --expect-env PROBE_PRIVATE=kept ||
  fail "job 2 (persisted) exited $?"
no_leaks

say "3. node-2 lost its disk"
rm -rf "$DISKS/node-2"
cluster -- "$PROBE" "${probe_args[@]}" --lost-node node-2 || fail "job 3 (node-2 lost its disk) exited $?"
for ((i = 1; i <= NODES; i++)); do expect_disk "$i"; done  # node-2 rewrote its files
no_leaks

say "4. the probe notices a cluster that is not the expected one"
if out=$(cluster -- "$PROBE" --nodes $((NODES + 1)) --ranks-per-node "$RPN" 2>&1); then
  echo "$out"; fail "the probe passed with a wrong node count"
fi
grep -q "distinct processor names, expected $((NODES + 1)) nodes" <<<"$out" || { echo "$out"; fail "the probe did not say why it failed"; }

say "5. the program's exit status comes back"
rc=0
cluster -- sh -c 'exit 3' >/dev/null 2>&1 || rc=$?
((rc == 3)) || fail "cluster.sh returned $rc for a program that exits 3"

say "6. a shaped wire between nodes"
qdisc_before=$(tc qdisc show dev lo)
wire=(--nodes "$NODES" --ranks-per-node "$RPN" --wire-mib 32 --wire-gbit-at-most 0.5)  # node-local checked above
cluster --wire-rate 500mbit -- "$PROBE" "${wire[@]}" ||
  fail "the probe failed on a 500 Mbit/s wire (exit $?)"
[[ $(tc qdisc show dev lo) == "$qdisc_before" ]] || fail "lo's qdisc changed: $(tc qdisc show dev lo)"
if out=$(cluster -- "$PROBE" "${wire[@]}" 2>&1); then
  echo "$out"; fail "the probe's wire check passed on an unshaped loopback"
fi
grep -q "faster than the 0.50 Gbit/s" <<<"$out" || { echo "$out"; fail "the wire check did not say why it failed"; }

say "PASS in $((SECONDS - start)) s"
