#!/usr/bin/env bash
# gpu_step_ab.sh — one device call that checks a change to default kernels
# and times it in whole steps: builds; runs gpu_kernels once for each part
# named in KERNS (default "ROUTER": MOEC_KERN_<PART>_ONLY=1, e.g. "ROUTER NORM
# MOE ATTN GQA_PRO"); runs the GPU tests in CTESTS (default "gpu_model
# gpu_graphs gpu_engine", one at a time: gpu_graphs checks the device's
# free memory); then scripts/gpu_ab.sh at context 1024 on Qwen3-30B-A3B
# (Q3_LAYERS, default 0: all 48; Q3_BATCHES, default 1,8) and on
# DeepSeek-V2-Lite (V2_LAYERS, default 0: all 27; V2_BATCHES, default
# 1,8,32,64), the default against VARIANTS ("NAME:ENV=V[,ENV=V] ..."; empty
# Q3_BATCHES or V2_BATCHES skips that model), and V2-Lite's default in the
# other dtype (bf16 where FP8=1, else fp8; OTHER_DTYPE=0 skips it) against
# OTHER_VARIANTS (default none: that dtype's knobs may differ).
# CHECK_ENV ("ENV=V ...") applies to the gpu_kernels parts and the tests
# only, e.g. to check a variant's kernels while the A/B's default stays the
# default. Leaves
# $OUT/ab.txt (both models' tables) and $OUT/logs.tar.gz.
# On the GPU machine:
#   cd .snap/src && VARIANTS="nowpre:MOEC_NORM_WPRE=0" scripts/gpu_step_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/gpu_build.sh
gpu_out_build step-ab logs || exit 1
rc=0
( # shellcheck disable=SC2086,SC2163 # a list of assignments
  [ -z "${CHECK_ENV:-}" ] || export ${CHECK_ENV}
  r=0
  # shellcheck disable=SC2086 # a list of parts
  gpu_kern_parts "$OUT/logs" "" ${KERNS-ROUTER} || r=1
  # shellcheck disable=SC2086 # a list of test names
  gpu_ctests "$OUT/logs" ${CTESTS-gpu_model gpu_graphs gpu_engine} || r=1
  exit $r
) || rc=1
[ $rc = 0 ] || echo "a check failed"
ab() { # NAME CONFIG LAYERS BATCHES
  [ -n "$4" ] || return 0
  timeout "${AB_S:-300}" scripts/gpu_ab.sh "$2" "$3" "$4" 1024 "${VARIANTS:-}" >"$OUT/logs/ab-$1.txt" 2>&1
  mv "$OUT/ab-logs.tar.gz" "$OUT/logs/ab-$1-logs.tar.gz" 2>/dev/null
}
ab q3 tests/data/configs/qwen3_30b_a3b.json "${Q3_LAYERS:-0}" "${Q3_BATCHES-1,8}"
ab v2 tests/data/configs/deepseek_v2_lite.json "${V2_LAYERS:-0}" "${V2_BATCHES-1,8,32,64}"
# the other dtype's default too, without the variants: a change to kernel
# text both dtypes share can slow the one not under study (the twenty-sixth
# round's fragment-tile addressing cost bf16 28% at 32 and 64 tokens
# unseen); OTHER_DTYPE=0 leaves it out
if [ "${OTHER_DTYPE:-1}" = 1 ] && [ -n "${V2_BATCHES-1,8,32,64}" ]; then
  if [ "${FP8:-0}" = 1 ]; then other=0; else other=1; fi
  FP8=$other VARIANTS="${OTHER_VARIANTS:-}" ab "v2-other-fp8_$other" tests/data/configs/deepseek_v2_lite.json \
    "${V2_LAYERS:-0}" "${V2_BATCHES-1,8,32,64}"
fi
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
exit $rc
