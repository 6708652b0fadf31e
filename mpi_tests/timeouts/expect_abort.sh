#!/usr/bin/env bash
# Runs an MPI job that must time out: it has to end with a non-zero exit code within LIMIT_S
# seconds and print every PATTERN (extended regular expressions).
#   expect_abort.sh LIMIT_S PATTERN... -- COMMAND...
set -u
limit=$1
shift
patterns=()
while [[ $# -gt 0 && $1 != "--" ]]; do
  patterns+=("$1")
  shift
done
shift  # --
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s%3N)
# A hard stop well past the limit, so a regression fails instead of hanging the test run.
timeout -k 10 $((limit + 60)) "$@" >"$log" 2>&1
rc=$?
elapsed_ms=$(($(date +%s%3N) - start))
elapsed=$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))
fail=0
if [[ $rc -eq 0 ]]; then
  echo "FAIL: the job exited 0 (it should have been aborted)"
  fail=1
fi
if ((elapsed_ms > limit * 1000)); then
  echo "FAIL: the job took ${elapsed}s, more than ${limit}s"
  fail=1
fi
for p in "${patterns[@]}"; do
  if ! grep -Eq -- "$p" "$log"; then
    echo "FAIL: no line matches: $p"
    fail=1
  fi
done
echo "--- job output (exit code $rc, ${elapsed}s) ---"
cat "$log"
exit $fail
