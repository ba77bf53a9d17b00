#!/usr/bin/env bash
# gpu_fuse_check.sh — one device call for the GQA prologue run inside the
# one-token bucket's attention kernel (the default; MOEC_ATTN_FUSE_PROLOGUE=0
# keeps the prologue kernel): builds, checks GQA's prologue and attention
# cases against the interpreter (gpu_kernels, MOEC_KERN_GQA_PRO_ONLY=1) with
# the default and with the prologue kernel, runs the GPU tests in CTESTS
# (default gpu_graphs: graph replays against eager steps, the fused kernel
# launched plainly among programmatic dependents), then times Qwen3-30B-A3B
# with LAYERS layers (default 0: all 48) at batch 1 and 8, context 1024
# (CONTEXTS), the default against the prologue kernel
# (scripts/gpu_ab.sh: $OUT/ab.txt).
# On the GPU machine:
#   cd .snap/src && scripts/gpu_fuse_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-fuse-check}
export OUT
mkdir -p "$OUT"
source scripts/gpu_build.sh
gpu_build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
rc=0
for f in 1 0; do
  MOEC_ATTN_FUSE_PROLOGUE=$f MOEC_KERN_GQA_PRO_ONLY=1 timeout 200 build-gpu/tests/gpu_kernels \
    >>"$OUT/gqa-pro-kernels.txt" 2>&1 || rc=1
  echo "gpu_kernels, GQA prologue, fused $f: $(grep -E "passed|failed" "$OUT/gqa-pro-kernels.txt" | tail -1)"
done
for t in ${CTESTS-gpu_graphs}; do
  (cd build-gpu && timeout 300 ctest -R "^$t\$" --output-on-failure >"$OUT/ctest_$t.txt" 2>&1) || rc=1
  echo "$t: $(grep -E "tests passed|tests failed" "$OUT/ctest_$t.txt" | tail -1)"
done
[ $rc = 0 ] || { echo "a check failed: no timing"; exit 1; }
scripts/gpu_ab.sh tests/data/configs/qwen3_30b_a3b.json "${LAYERS:-0}" 1,8 "${CONTEXTS:-1024}" \
  "${VARIANTS:-unfused:MOEC_ATTN_FUSE_PROLOGUE=0}"
