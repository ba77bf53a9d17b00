#!/usr/bin/env bash
# gpu_snapshot.sh — the tree a device call builds: HEAD (git archive, so that
# work in progress in the checkout never reaches the GPU machine), the cJSON
# carried in .dev/, and COMMIT naming the commit, in .snap/src (ignored by
# git: list /.snap/ in .git/info/exclude). Then, on the GPU machine (device
# tool, carry [".snap"]):  cd .snap/src && scripts/gpu_session.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .snap
mkdir -p .snap/src
git archive HEAD | tar -x -C .snap/src
[ -d .dev ] && cp -r .dev .snap/src/
git log -1 --oneline >.snap/src/COMMIT
du -sh .snap
