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
source scripts/gpu_build.sh
gpu_out_build attn-fuse || exit 1
rc=0
# the GQA prologue cases fused and not (MOEC_ATTN_FUSE_PROLOGUE)
for f in 1 0; do
  MOEC_ATTN_FUSE_PROLOGUE=$f KERN_S=200 gpu_kern_parts "$OUT" "-fused$f" GQA_PRO || rc=1
done
# the GQA attention cases with the live merge (and with the merge in the
# kernel whatever the bytes, as it was timed before)
for mg in ${MERGES-3 2}; do
  MOEC_ATTN_MERGE=$mg KERN_S=200 gpu_kern_parts "$OUT" "-merge$mg" ATTN || rc=1
done
# shellcheck disable=SC2086 # a list of test names
MOEC_ATTN_FUSE_PROLOGUE=1 gpu_ctests "$OUT" ${CTESTS-gpu_model gpu_graphs} || rc=1
[ $rc = 0 ] || { echo "a check failed: no timing"; exit 1; }
scripts/gpu_ab.sh tests/data/configs/qwen3_30b_a3b.json "${LAYERS:-16}" 1,8 "${CONTEXTS:-1024,8192}" \
  "${VARIANTS:-unfused:MOEC_ATTN_FUSE_PROLOGUE=0 live:MOEC_ATTN_MERGE=3 unfusedlive:MOEC_ATTN_FUSE_PROLOGUE=0,MOEC_ATTN_MERGE=3 livelpp4:MOEC_ATTN_MERGE=3,MOEC_ATTN_LPP=4 lpp4:MOEC_ATTN_LPP=4 ku1:MOEC_ATTN_KUNROLL=1}"
