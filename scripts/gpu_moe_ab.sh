#!/usr/bin/env bash
# gpu_moe_ab.sh — the routed-expert GEMMs' streaming form against the first
# CUDA-core form (codegen/moe_routed.c, MOEC_MOE_GEMV), on the GPU machine
# in one call: builds tests/gpu_kernels (scripts/gpu_build.sh) and runs its
# A/B (MOEC_KERN_MOE_AB=1): V2-Lite's experts in bf16 and fp8 under every
# variant (old, gv and its shapes), Qwen3-30B's, DeepSeek-V3's and the odd
# edge shapes old and new, at T = 1, 2, 3 and 8, each result checked
# against the interpreter and each gate_up and down timed in a CUDA graph
# of 64 launches over 8 copies of the weights (TB/s of the chosen experts'
# bytes). Log in $OUT/moe_ab.txt; prints the A/B lines and the verdict.
# AB=v2 runs V2-Lite's variants only (about a third of the time).
#   usage: [AB=v2] scripts/gpu_moe_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-moe-ab}
mkdir -p "$OUT"
source scripts/gpu_build.sh
{ cmake "${GPU_CMAKE_ARGS[@]}" && cmake --build build-gpu -j"$(nproc)" --target gpu_kernels; } \
  >"$OUT/moe_ab_build.txt" 2>&1 || { tail -30 "$OUT/moe_ab_build.txt"; exit 1; }
rc=0
# line-buffered, so that a fault lands after the last variant that finished
MOEC_KERN_MOE_AB=${AB:-1} stdbuf -oL -eL build-gpu/tests/gpu_kernels >"$OUT/moe_ab.txt" 2>&1 || rc=1
grep -E "^(  ab |FAIL|gpu_kernels|compiled|total)|A/B worst" "$OUT/moe_ab.txt" | head -400
exit "$rc"
