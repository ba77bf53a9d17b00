#!/usr/bin/env bash
# gpu_attn_fuse.sh — one device call for the GQA prologue run inside the
# attention kernel at one token (the default since the seventeenth round;
# MOEC_ATTN_FUSE_PROLOGUE=0 keeps the prologue kernel,
# codegen/attn_prologue.c), the last block's merge of only the splits that
# hold positions (MOEC_ATTN_MERGE=3) and the attention knobs beside them:
# builds, checks GQA's prologue cases against the interpreter with the
# fused form (MOEC_KERN_GQA_PRO_ONLY=1 gpu_kernels) and without it, its
# GQA attention cases under each MOEC_ATTN_MERGE in MERGES (default "3 2";
# empty: none), runs the GPU tests in CTESTS (default "gpu_model
# gpu_graphs") with the fused form, then times Qwen3-30B-A3B cut to LAYERS
# layers (default 16; 0: all 48) at batch 1 and 8 and the contexts in
# CONTEXTS (default 1024,8192): the default against VARIANTS
# (scripts/gpu_ab.sh: $OUT/ab.txt; logs in $OUT).
# On the GPU machine:
#   cd .snap/src && scripts/gpu_attn_fuse.sh
# The seventeenth round's last call (the whole model, the default against
# the prologue kernel):
#   CTESTS=gpu_graphs MERGES= LAYERS=0 CONTEXTS=1024 \
#     VARIANTS="unfused:MOEC_ATTN_FUSE_PROLOGUE=0" scripts/gpu_attn_fuse.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-attn-fuse}
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
# the GQA attention cases with the live merge (and with the merge in the
# kernel whatever the bytes, as it was timed before)
for mg in ${MERGES-3 2}; do
  MOEC_ATTN_MERGE=$mg MOEC_KERN_ATTN_ONLY=1 timeout 200 build-gpu/tests/gpu_kernels \
    >>"$OUT/attn-kernels.txt" 2>&1 || rc=1
  echo "gpu_kernels, GQA attention, MOEC_ATTN_MERGE=$mg: $(grep -E "passed|failed" "$OUT/attn-kernels.txt" | tail -1)"
done
for t in ${CTESTS-gpu_model gpu_graphs}; do
  (cd build-gpu && MOEC_ATTN_FUSE_PROLOGUE=1 timeout 300 ctest -R "$t" --output-on-failure \
    >"$OUT/ctest_$t.txt" 2>&1) || rc=1
  echo "$t (fused): $(tail -3 "$OUT/ctest_$t.txt" | head -1)"
done
[ $rc = 0 ] || { echo "a check failed: no timing"; exit 1; }
scripts/gpu_ab.sh tests/data/configs/qwen3_30b_a3b.json "${LAYERS:-16}" 1,8 "${CONTEXTS:-1024,8192}" \
  "${VARIANTS:-unfused:MOEC_ATTN_FUSE_PROLOGUE=0 live:MOEC_ATTN_MERGE=3 unfusedlive:MOEC_ATTN_FUSE_PROLOGUE=0,MOEC_ATTN_MERGE=3 livelpp4:MOEC_ATTN_MERGE=3,MOEC_ATTN_LPP=4 lpp4:MOEC_ATTN_LPP=4 ku1:MOEC_ATTN_KUNROLL=1}"
