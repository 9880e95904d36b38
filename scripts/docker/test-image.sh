#!/usr/bin/env bash
# Container test: builds the base image and the p2ptrain image (scripts/docker/build.sh), then
# trains the embedded quickstart inside the image under `mpirun -np 2` and checks that it exits 0
# and reaches the quickstart's accuracy (at least 93% on the 297 test digits, as tests/cli.rs).
#
#   scripts/docker/test-image.sh [TAG]      # default p2ptrain:latest
set -euo pipefail
cd "$(dirname "$0")/../.."
tag="${1:-p2ptrain:latest}"
t() { date +%s; }

t0=$(t)
scripts/docker/build.sh "$tag"
t1=$(t)
echo "container test: image $tag built in $((t1 - t0)) s"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
docker run --rm "$tag" mpirun --oversubscribe --bind-to none -np 2 p2ptrain --no-progress >"$log" 2>&1
rc=$?
set -e
t2=$(t)
cat "$log"
echo "container test: quickstart under mpirun -np 2 in the image: exit $rc, $((t2 - t1)) s"
[ "$rc" -eq 0 ] || { echo "FAILED: the quickstart in the image exited with $rc" >&2; exit 1; }
acc="$(sed -n 's/^test: loss [0-9.]*, accuracy \([0-9.]*\)% over 297 samples$/\1/p' "$log")"
[ -n "$acc" ] || { echo "FAILED: no final 'test: ... accuracy ...% over 297 samples' line" >&2; exit 1; }
awk -v a="$acc" 'BEGIN { exit !(a >= 93.0) }' \
  || { echo "FAILED: quickstart accuracy in the image $acc% < 93%" >&2; exit 1; }
echo "container test: passed (accuracy $acc%)"
