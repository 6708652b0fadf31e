#!/usr/bin/env bash
# The crash campaign (scripts/crash_campaign.sh) with its work directory on a GlusterFS volume of
# scripts/gluster.sh: every kill must leave a checkpoint that verifies, resumes bit-identically
# and never goes backwards, as on a local disk.
# Usage: run_gluster_campaign.sh SOURCE_DIR BUILD_DIR [ITERATIONS]   Exit 77: no GlusterFS here.
set -euo pipefail
SRC=$1 BUILD=$2 N=${3:-3}
[[ $(id -u) == 0 && -c /dev/fuse ]] || { echo "SKIPPED: needs root and /dev/fuse"; exit 77; }
command -v glusterd >/dev/null || { echo "SKIPPED: GlusterFS is not installed"; exit 77; }
WORK=$(mktemp -d /tmp/h5ckpt-gluster-campaign.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
rc=0
"$SRC/scripts/gluster.sh" run --dir "$WORK/vol" --clients 0 -- \
  bash "$SRC/scripts/crash_campaign.sh" --iterations "$N" --check-every "$N" --workdir "$WORK/vol/mnt/cc" \
  --build "$BUILD" || rc=$?
((rc == 125)) && { echo "SKIPPED: this machine cannot host a GlusterFS volume"; exit 77; }
exit "$rc"
