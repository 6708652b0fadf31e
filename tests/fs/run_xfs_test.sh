#!/usr/bin/env bash
# h5ckpt on xfs: a sparse image formatted with mkfs.xfs and loop-mounted here, then the checks whose
# guarantees rest on the file system run with their checkpoints on it:
#   - the trainer saves as TP2·ZeRO·DP2 and resumes as PP2·DP2 (scripts/e2e_resume.sh): final
#     model and optimizer bit-identical to an uninterrupted run, every sample once;
#   - O_DIRECT is taken there (the trainer's save reports bytes written with it);
#   - the commit protocol (test_commit_safety: renameat2 exchange and the rename-aside fallback,
#     the save lock, selection over damaged checkpoints) and aggregated writes (test_aggregated_write)
#     with their temporary directories (TMPDIR) on the volume.
# usage: run_xfs_test.sh SRC_DIR TRAIN_EXE MPI_TESTS_DIR MPIEXEC [mpiexec preflags...]
# Exit 77 (skipped) when this machine cannot loop-mount an xfs image (not root, no mkfs.xfs, no
# loop devices, or the kernel has no xfs).
set -euo pipefail
SRC=$1 TRAIN=$2 TESTS=$3 MPIEXEC=$4
shift 4
PREFLAGS=("$@")
say() { echo "xfs test: $*"; }
skip() { say "skipped: $*"; exit 77; }
fail() { say "FAILED: $*"; exit 1; }

[[ $(id -u) == 0 ]] || skip "not root (loop mounts need it)"
command -v mkfs.xfs >/dev/null || skip "mkfs.xfs is missing (Debian package xfsprogs)"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/h5ckpt-xfs-test.XXXXXX")
MNT=$WORK/mnt
cleanup() {
  mountpoint -q "$MNT" && umount "$MNT"
  rm -rf "$WORK"
}
trap cleanup EXIT
# Sparse: the image takes only what the checkpoints write.
truncate -s 4G "$WORK/xfs.img"
mkfs.xfs -q -f "$WORK/xfs.img" || skip "mkfs.xfs failed"
mkdir -p "$MNT"
mount -o loop "$WORK/xfs.img" "$MNT" 2>"$WORK/mount.err" || skip "cannot loop-mount xfs: $(cat "$WORK/mount.err")"
[[ $(stat -f -c %T "$MNT") == xfs ]] || fail "the mount at $MNT is $(stat -f -c %T "$MNT"), not xfs"
say "xfs mounted at $MNT"

# 1. Save, resume in another layout, compare with an uninterrupted run.
H5CKPT_MPIEXEC_PREFLAGS="${PREFLAGS[*]}" H5DIFF=none E2E_SPLIT=4 E2E_STEPS=8 \
  bash "$SRC/scripts/e2e_resume.sh" "$TRAIN" "$MPIEXEC" "$MNT/e2e" \
  tp2.pp1.dp2.zero tp1.pp2.dp2 tp1.pp1.dp1 || fail "the resume on xfs did not match the uninterrupted run"

# 2. O_DIRECT on xfs: taken, not refused.
H5CKPT_LOG_LEVEL=info "$MPIEXEC" -np 2 "${PREFLAGS[@]}" "$TRAIN" --tp 2 --steps 1 \
  --save-every 1 --ckpt-dir "$MNT/direct" >"$WORK/direct.log" 2>&1 || { cat "$WORK/direct.log"; fail "the save on xfs failed"; }
grep -q "([1-9][0-9]* with O_DIRECT)" "$WORK/direct.log" || { cat "$WORK/direct.log"; fail "no byte was written with O_DIRECT on xfs"; }

# 3. The commit protocol and aggregated writes with their files on xfs.
for t in "test_commit_safety 2" "test_aggregated_write 4"; do
  read -r exe np <<<"$t"
  TMPDIR=$MNT "$MPIEXEC" -np "$np" "${PREFLAGS[@]}" "$TESTS/$exe" --gtest_brief=1 >"$WORK/$exe.log" 2>&1 ||
    { tail -n 40 "$WORK/$exe.log"; fail "$exe failed with its checkpoints on xfs"; }
  grep -q "PASSED" "$WORK/$exe.log" || { tail -n 20 "$WORK/$exe.log"; fail "$exe ran no test"; }
  say "$exe passed on xfs"
done
say "passed"
