#!/bin/bash
# Runs a command (mpiexec ... test_faults --gtest_filter=*FullDisk.*) with H5CKPT_TEST_FULL_DISK
# naming an 8 MiB tmpfs. The tmpfs lives in a private mount namespace, so it cannot outlive the
# command even when the command is killed. Exit 77 (CTest: skipped) when not root.
set -u
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: mounting a tmpfs needs root"
  exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/h5ckpt-full-disk-XXXXXX") || exit 1
unshare --mount --propagation private bash -c '
  dir=$1
  shift
  if ! mount -t tmpfs -o size=8m h5ckpt-full-disk "$dir"; then
    echo "SKIP: cannot mount a tmpfs on $dir"
    exit 77
  fi
  H5CKPT_TEST_FULL_DISK=$dir "$@"
  rc=$?
  umount "$dir"
  exit $rc' full_disk "$dir" "$@"
rc=$?
rmdir "$dir"
exit $rc
