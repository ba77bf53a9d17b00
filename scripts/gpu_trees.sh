#!/usr/bin/env bash
# gpu_trees.sh — which commit made a step slower: times the default step of
# one model in each tree that `SNAP_TREES="COMMIT ..." scripts/gpu_snapshot.sh`
# put under .snap/ and in .snap/src (HEAD), in one device call, with
# scripts/gpu_ab.sh (no variants) run in each tree in turn: the same
# machine, one model written once for all of them (a tree whose gpu_ab.sh
# predates AB_MODEL writes its own), one line a batch and tree in $OUT/ab.txt, each tree's logs in
# $OUT/ab-TREE-logs.tar.gz.
#   usage (on the GPU machine, from .snap/src):
#     scripts/gpu_trees.sh CONFIG LAYERS BATCHES      (FP8=1: fp8 weights)
#   e.g.: scripts/gpu_trees.sh tests/data/configs/deepseek_v2_lite.json 0 32,64
# AB_S (default 150) bounds each tree's seconds.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1 # .snap
[ $# -eq 3 ] || { sed -n 2,12p "$0"; exit 2; }
OUT=${OUT:-/tmp/moec-trees}
export OUT
mkdir -p "$OUT"
export AB_MODEL=/dev/shm/moec-trees
rm -rf "$AB_MODEL"
trap 'rm -rf "$AB_MODEL"' EXIT
rc=0
for d in */; do
  d=${d%/}
  [ -f "$d/scripts/gpu_ab.sh" ] || continue
  [ -d "$d/.dev" ] || [ ! -d src/.dev ] || cp -r src/.dev "$d/"
  (cd "$d" && timeout "${AB_S:-150}" scripts/gpu_ab.sh "$1" "$2" "$3" 1024 "") >/dev/null 2>&1 || rc=1
  mv "$OUT/ab-logs.tar.gz" "$OUT/ab-$d-logs.tar.gz" 2>/dev/null
done
cat "$OUT/ab.txt"
exit $rc
