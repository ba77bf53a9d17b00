#!/usr/bin/env bash
# gpu_snapshot.sh — the tree a device call builds: HEAD (git archive, so that
# work in progress in the checkout never reaches the GPU machine), the cJSON
# carried in .dev/, and COMMIT naming the commit, in .snap/src (ignored by
# git: list /.snap/ in .git/info/exclude). Then, on the GPU machine (device
# tool, carry [".snap"]):  cd .snap/src && scripts/gpu_session.sh
# SNAP_TREES="COMMIT ..." adds each commit's tree under .snap/COMMIT (without
# tests/data but its configs, and without .dev, which scripts/gpu_trees.sh
# copies from .snap/src on the GPU machine), to time commits against each
# other in one call.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .snap
mkdir -p .snap/src
git archive HEAD | tar -x -C .snap/src
[ -d .dev ] && cp -r .dev .snap/src/
git log -1 --oneline >.snap/src/COMMIT
for c in ${SNAP_TREES:-}; do
  d=.snap/$(git rev-parse --short "$c")
  mkdir -p "$d"
  git archive "$c" | tar -x -C "$d"
  find "$d/tests/data" -mindepth 1 -maxdepth 1 ! -name configs -exec rm -rf {} +
  git log -1 --oneline "$c" >"$d/COMMIT"
done
du -sh .snap
