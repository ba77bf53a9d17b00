#!/usr/bin/env bash
# gpu_attn_lpp.sh — one device call for the GQA attention kernel's lanes a
# position (codegen/attention.c): builds, checks the GQA attention cases
# against the interpreter with the kernel's choice at run time
# (MOEC_ATTN_LPP=0) and with 1 (the default), 2, 4 and 8 lanes fixed
# (MOEC_KERN_ATTN_ONLY=1 gpu_kernels; logs in $OUT/kernels-ATTN-lppN.txt), runs
# the GPU tests named in CTESTS (default "gpu_model gpu_graphs"), then
# times Qwen3-30B-A3B cut to LAYERS layers (default 16) at batch 1 and 8
# and the contexts in CONTEXTS (default 1024,4096,8192), the default
# against the variants in VARIANTS (scripts/gpu_ab.sh: $OUT/ab.txt).
# On the GPU machine:
#   cd .snap/src && scripts/gpu_attn_lpp.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh
gpu_out_build attn-lpp || exit 1
rc=0
# the GQA attention cases at each lanes a position (0: chosen at run time)
for n in 0 1 2 4 8; do
  MOEC_ATTN_LPP=$n KERN_S=200 gpu_kern_parts "$OUT" "-lpp$n" ATTN || rc=1
done
# shellcheck disable=SC2086 # a list of test names
gpu_ctests "$OUT" ${CTESTS-gpu_model gpu_graphs} || rc=1
[ $rc = 0 ] || { echo "a check failed: no timing"; exit 1; }
scripts/gpu_ab.sh tests/data/configs/qwen3_30b_a3b.json "${LAYERS:-16}" 1,8 "${CONTEXTS:-1024,4096,8192}" \
  "${VARIANTS:-auto:MOEC_ATTN_LPP=0 lpp4:MOEC_ATTN_LPP=4}"
