#!/usr/bin/env bash
# gpu_ab.sh — a quick A/B of compile-time knobs on one model, in one device
# call: builds moec, writes CONFIG's model with random weights once (cut to
# its first LAYERS layers; 0 keeps them all) under /dev/shm, then for each
# context in CONTEXTS runs `moec bench` (compiling the model itself, so that
# each variant's environment reaches codegen) once with the default
# environment and once under each variant, in that order, and prints the
# graph-replay ms a step at each batch size beside its floor. Each result
# line is appended to $OUT/ab.txt as it comes, so a call cut short still
# brings back what it measured; the logs (build, sample, each run's JSON
# lines and stderr) go to $OUT/ab-logs.tar.gz when the script exits (the
# device tool brings back at most 8 files). FP8=1 writes the model's
# weights in block-scaled fp8 (moec-sample --fp8); AB_MODEL=DIR uses (and
# keeps) the model there, writing it first where DIR holds none.
#   usage: scripts/gpu_ab.sh CONFIG LAYERS BATCHES CONTEXTS "NAME:ENV=V[,ENV=V] ..."
#   e.g.:  scripts/gpu_ab.sh tests/data/configs/qwen3_30b_a3b.json 16 1,8 \
#            1024,8192 "merge2:MOEC_ATTN_MERGE=2"
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 5 ] || { sed -n 2,15p "$0"; exit 2; }
CONFIG=$1 LAYERS=$2 BATCHES=$3 CONTEXTS=$4 VARIANTS=$5
OUT=${OUT:-/tmp/moec-ab}
LOGS=$(mktemp -d)/ab-logs
mkdir -p "$OUT" "$LOGS"
# shellcheck disable=SC2064 # the paths as they are now
trap "tar czf '$OUT/ab-logs.tar.gz' -C '$(dirname "$LOGS")' ab-logs" EXIT
source scripts/gpu_build.sh
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; exit 1; }
fp8=
[ "${FP8:-0}" = 1 ] && fp8=fp8
# AB_MODEL=DIR: the caller's model folder, written here only where it holds
# no model yet and kept (scripts/gpu_trees.sh shares one between trees)
M=${AB_MODEL:-/dev/shm/moec-ab}
if [ -z "${AB_MODEL:-}" ] || [ ! -f "$M/config.json" ]; then
  rm -rf "$M"
  gpu_sample_model "$CONFIG" "$LAYERS" "$M" $fp8 >"$LOGS/sample.txt" 2>&1 || { tail "$LOGS/sample.txt"; exit 1; }
fi
{ date -u; cat COMMIT 2>/dev/null || git log -1 --oneline; echo "$CONFIG, $LAYERS layers${fp8:+, fp8}"; } >>"$OUT/ab.txt"
printf '%-28s %7s %5s %9s %9s %7s\n' variant context batch graph_ms floor_ms x_floor | tee -a "$OUT/ab.txt"
IFS=, read -ra ctxs <<<"$CONTEXTS"
for ctx in "${ctxs[@]}"; do
  for v in "default:" $VARIANTS; do
    name=${v%%:*} envs=${v#*:}
    IFS=, read -ra assign <<<"$envs"
    env "${assign[@]}" timeout 120 build-gpu/moec bench "$M" --batch-sizes "$BATCHES" --context "$ctx" \
      --json --steps 50 --warmup 10 >"$LOGS/$name-$ctx.jsonl" 2>"$LOGS/$name-$ctx.err" ||
      { echo "$name at $ctx: exit $?"; tail -5 "$LOGS/$name-$ctx.err"; continue; }
    python3 - "$name" "$ctx" "$LOGS/$name-$ctx.jsonl" <<'PY' | tee -a "$OUT/ab.txt"
import json, sys
name, ctx = sys.argv[1], sys.argv[2]
for line in open(sys.argv[3]):
    r = json.loads(line)
    if r.get("mode") == "graph":
        print(f"{name:<28} {ctx:>7} {r['batch']:>5} {r['ms']:>9.3f} {r['floor_ms']:>9.3f} {r['ms'] / r['floor_ms']:>7.2f}")
PY
  done
done
[ -n "${AB_MODEL:-}" ] || rm -rf "$M"
