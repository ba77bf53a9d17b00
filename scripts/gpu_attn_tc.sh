#!/usr/bin/env bash
# gpu_attn_tc.sh — one device call for the GQA attention on tensor cores
# (codegen/attention.c, ATTN_BODY_TC; MOEC_ATTN_TC=0 keeps the lanes'
# form): builds, checks gpu_kernels' GQA attention cases and its GQA
# prologue cases (the attention that runs the prologue) against the
# interpreter with the tensor cores' form and with the lanes' form, runs
# the GPU tests in CTESTS (default "gpu_model gpu_graphs gpu_engine", one
# at a time: gpu_graphs checks the device's free memory), then times
# Qwen3-30B-A3B cut to LAYERS layers (default 16; 0: all 48) at batch 1 and
# 8 and the contexts in CONTEXTS (default 1024,8192): the default against
# VARIANTS (scripts/gpu_ab.sh: $OUT/ab.txt; logs in $OUT/logs.tar.gz), and
# with V2_VARIANTS DeepSeek-V2-Lite cut to 10 layers against those.
# CHECKS=0 skips the checks; CHECK_KERN=0 the gpu_kernels cases alone.
# On the GPU machine:
#   cd .snap/src && scripts/gpu_attn_tc.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/gpu_build.sh
gpu_out_build attn-tc logs || exit 1
rc=0
if [ "${CHECKS:-1}" != 0 ]; then
  # the GQA attention and GQA prologue cases, with MOEC_ATTN_TC=1 and 0
  for tc in $([ "${CHECK_KERN:-1}" != 0 ] && echo 1 0); do
    MOEC_ATTN_TC=$tc KERN_S=200 gpu_kern_parts "$OUT/logs" "-tc$tc" ATTN GQA_PRO || rc=1
  done
  # shellcheck disable=SC2086 # a list of test names
  gpu_ctests "$OUT/logs" ${CTESTS-gpu_model gpu_graphs gpu_engine} || rc=1
  [ $rc = 0 ] || echo "a check failed"
fi
timeout "${AB_S:-400}" scripts/gpu_ab.sh tests/data/configs/qwen3_30b_a3b.json "${LAYERS:-16}" 1,8 \
  "${CONTEXTS:-1024,8192}" \
  "${VARIANTS-lanes:MOEC_ATTN_TC=0 min16:MOEC_ATTN_SPLIT_MIN=16 min32:MOEC_ATTN_SPLIT_MIN=32 min128:MOEC_ATTN_SPLIT_MIN=128}" \
  >"$OUT/logs/ab-stdout.txt" 2>&1
mv "$OUT/ab-logs.tar.gz" "$OUT/logs/" 2>/dev/null
# V2_VARIANTS set: the same A/B on DeepSeek-V2-Lite cut to 10 layers, context
# 1024 (appended to $OUT/ab.txt)
if [ -n "${V2_VARIANTS:-}" ]; then
  timeout "${AB_S:-400}" scripts/gpu_ab.sh tests/data/configs/deepseek_v2_lite.json 10 1,8 1024 \
    "$V2_VARIANTS" >"$OUT/logs/ab-v2-stdout.txt" 2>&1
  mv "$OUT/ab-logs.tar.gz" "$OUT/logs/ab-v2-logs.tar.gz" 2>/dev/null
fi
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
exit $rc
