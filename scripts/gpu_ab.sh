#!/usr/bin/env bash
# gpu_ab.sh — a quick A/B of compile-time knobs on one model, in one device
# call: builds moec, writes CONFIG's model with random weights once (cut to
# its first LAYERS layers; 0 keeps them all) under /dev/shm, then for each
# context in CONTEXTS runs `moec bench` (compiling the model itself, so that
# each variant's environment reaches codegen) once with the default
# environment and once under each variant, in that order, and prints the
# graph-replay ms a step at each batch size beside its floor. Each result
# line is appended to $OUT/ab.txt as it comes, so a call cut short still
# brings back what it measured.
#   usage: scripts/gpu_ab.sh CONFIG LAYERS BATCHES CONTEXTS "NAME:ENV=V[,ENV=V] ..."
#   e.g.:  scripts/gpu_ab.sh tests/data/configs/qwen3_30b_a3b.json 16 1,8 \
#            1024,8192 "merge2:MOEC_ATTN_MERGE=2"
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 5 ] || { sed -n 2,14p "$0"; exit 2; }
CONFIG=$1 LAYERS=$2 BATCHES=$3 CONTEXTS=$4 VARIANTS=$5
OUT=${OUT:-/tmp/moec-ab}
mkdir -p "$OUT"
source scripts/gpu_build.sh
gpu_build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
M=/dev/shm/moec-ab
rm -rf "$M"
gpu_sample_model "$CONFIG" "$LAYERS" "$M" >"$OUT/sample.txt" 2>&1 || { tail "$OUT/sample.txt"; exit 1; }
{ date -u; git log -1 --oneline 2>/dev/null || cat COMMIT; echo "$CONFIG, $LAYERS layers"; } >>"$OUT/ab.txt"
printf '%-28s %7s %5s %9s %9s %7s\n' variant context batch graph_ms floor_ms x_floor | tee -a "$OUT/ab.txt"
IFS=, read -ra ctxs <<<"$CONTEXTS"
for ctx in "${ctxs[@]}"; do
  for v in "default:" $VARIANTS; do
    name=${v%%:*} envs=${v#*:}
    IFS=, read -ra assign <<<"$envs"
    env "${assign[@]}" timeout 120 build-gpu/moec bench "$M" --batch-sizes "$BATCHES" --context "$ctx" \
      --json --steps 50 --warmup 10 >"$OUT/$name-$ctx.jsonl" 2>"$OUT/$name-$ctx.err" ||
      { echo "$name at $ctx: exit $?"; tail -5 "$OUT/$name-$ctx.err"; continue; }
    python3 - "$name" "$ctx" "$OUT/$name-$ctx.jsonl" <<'PY' | tee -a "$OUT/ab.txt"
import json, sys
name, ctx = sys.argv[1], sys.argv[2]
for line in open(sys.argv[3]):
    r = json.loads(line)
    if r.get("mode") == "graph":
        print(f"{name:<28} {ctx:>7} {r['batch']:>5} {r['ms']:>9.3f} {r['floor_ms']:>9.3f} {r['ms'] / r['floor_ms']:>7.2f}")
PY
  done
done
rm -rf "$M"
