#!/usr/bin/env bash
# gpu_order.sh — whether a batch's decode time depends on the batches
# `moec bench` ran before it in the same process. moec bench draws every
# batch's tokens from one generator, so batch B after other batches decodes
# other tokens (with random weights: other experts chosen, other loads per
# expert) than batch B alone. Benches one plan of CONFIG (default V2-Lite)
# under each LISTS entry (batch lists, default "64 41,64 1,8,32,64": 64 alone
# and after 41 tokens' draws, the tokens of 64 in "1,8,32,64") and prints
# each run's rows of batch LAST (default 64): mode, ms, floor, experts hit.
#   usage: scripts/gpu_order.sh [CONFIG_JSON]   (on the GPU machine)
#   env: LISTS, LAST, CONTEXT (default 1024), MODEL_DIR (default /dev/shm/moec-order)
#   leaves $OUT/order.tar.gz: each run's JSON lines and stderr
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh
gpu_logs order
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; exit 1; }
CONFIG=${1:-tests/data/configs/deepseek_v2_lite.json}
M=${MODEL_DIR:-/dev/shm/moec-order}
mkdir -p "$M"
cp "$CONFIG" "$M/config.json"
build-gpu/moec-sample "$M/config.json" "$M" --fast --force >"$LOGS/sample.txt" 2>&1 ||
  { tail "$LOGS/sample.txt"; exit 1; }
build-gpu/moec compile "$M" -o "$M.moec" >"$LOGS/compile.txt" 2>&1 || { tail "$LOGS/compile.txt"; exit 1; }
LAST=${LAST:-64}
for list in ${LISTS:-64 41,64 1,8,32,64}; do
  f=$LOGS/run_${list//,/_}.jsonl
  build-gpu/moec bench "$M.moec" --weights "$M" --batch-sizes "$list" --context "${CONTEXT:-1024}" \
    --json >"$f" 2>"${f%.jsonl}.err" || tail -5 "${f%.jsonl}.err"
  python3 - "$f" "$list" "$LAST" <<'PY'
import json, sys
f, lst, last = sys.argv[1], sys.argv[2], int(sys.argv[3])
for line in open(f):
    if line.startswith("{"):
        r = json.loads(line)
        if r["batch"] == last:
            print("after %-12s %-13s %8.3f ms  floor %7.3f  x%.3f  experts hit %d of %d" % (
                lst, r["mode"], r["ms"], r["floor_ms"], r["ms"] / r["floor_ms"],
                r["experts_hit"], r["experts_total"]))
PY
done | tee "$LOGS/summary.txt"
rm -rf "$M" "$M.moec"
