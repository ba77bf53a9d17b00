#!/usr/bin/env bash
# gpu_moe_tune.sh — times the routed-expert kernels (align, gate_up, down,
# sum) of the DeepSeek-V2-Lite and Qwen3-30B-A3B MoE shapes at every bucket
# on the GPU machine, for CUDA cores and for several shapes of the
# tensor-core form (tests/gpu_kernels with MOEC_KERN_MOE_ONLY and
# MOEC_KERN_BENCH, which also checks every result against the interpreter).
# Leaves $OUT/moe_tune.txt. usage: scripts/gpu_moe_tune.sh ["W U" ...]
# VARIANTS="name:ENV=V[,ENV=V] ..." times those settings instead (each as
# the build's defaults plus its settings; "base:" for none), e.g.
# VARIANTS="base: u4:MOEC_MOE_MMA_U=4,MOEC_MOE_MMA_DN_U=2"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-tune}
mkdir -p "$OUT"
source scripts/gpu_build.sh
gpu_build >"$OUT/tune_build.txt" 2>&1 || { tail -30 "$OUT/tune_build.txt"; exit 1; }
LOG=$OUT/moe_tune.txt
: >"$LOG"
run() { # LABEL ENV...
  local label=$1; shift
  echo "== $label" >>"$LOG"
  env MOEC_KERN_MOE_ONLY=1 MOEC_KERN_BENCH=1 "$@" build-gpu/tests/gpu_kernels 2>&1 |
    grep -E "bench .*(moe_gate_up|moe_down)|passed|failed|check failed" >>"$LOG"
}
if [ -n "${VARIANTS:-}" ]; then
  for v in $VARIANTS; do
    IFS=, read -ra envs <<<"${v#*:}"
    run "${v%%:*}" "${envs[@]}"
  done
  cat "$LOG"
  exit 0
fi
run simt MOEC_MOE_MMA_MIN_BM=1024
for wu in "${@:-4 4}"; do
  set -- $wu
  run "mma warps $1 unroll $2" MOEC_MOE_MMA_MIN_BM=1 MOEC_MOE_MMA_WARPS=$1 MOEC_MOE_MMA_U=$2
done
cat "$LOG"
