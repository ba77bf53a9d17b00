#!/usr/bin/env bash
# gpu_attn_lpp.sh — one device call for the GQA attention kernel's lanes a
# position (MOEC_ATTN_LPP, codegen/attention.c): builds, checks the GQA
# attention cases against the interpreter with 1, 2, 4 and 8 lanes
# (MOEC_KERN_ATTN_ONLY=1 gpu_kernels; logs in $OUT/attn-kernels.txt), then
# times Qwen3-30B-A3B cut to LAYERS layers (default 16) at batch 1 and 8,
# context 1024 and 8192, with each N against the default
# (scripts/gpu_ab.sh: $OUT/ab.txt). On the GPU machine:
#   cd .snap/src && scripts/gpu_attn_lpp.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-attn-lpp}
export OUT
mkdir -p "$OUT"
source scripts/gpu_build.sh
gpu_build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
rc=0
for n in 1 2 4 8; do
  MOEC_ATTN_LPP=$n MOEC_KERN_ATTN_ONLY=1 timeout 200 build-gpu/tests/gpu_kernels \
    >>"$OUT/attn-kernels.txt" 2>&1 || rc=1
  echo "gpu_kernels, GQA attention, $n lanes a position: $(grep -E "passed|failed" "$OUT/attn-kernels.txt" | tail -1)"
done
[ $rc = 0 ] || { echo "a check failed: no timing"; exit 1; }
scripts/gpu_ab.sh tests/data/configs/qwen3_30b_a3b.json "${LAYERS:-16}" 1,8 1024,8192 \
  "lpp2:MOEC_ATTN_LPP=2 lpp4:MOEC_ATTN_LPP=4 lpp8:MOEC_ATTN_LPP=8"
