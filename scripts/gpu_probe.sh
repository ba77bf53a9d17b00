#!/usr/bin/env bash
# gpu_probe.sh — one device call that looks before a change: builds; runs
# gpu_kernels once for each part in KERNS (MOEC_KERN_<PART>_ONLY=1, e.g.
# "NORM ROUTER"; default none); Nsight Compute's lean pass
# (scripts/gpu_ncu_kernel.sh LEAN=1) over NCU_KERNELS (regexes) in a step of
# NCU_PROFILE (default qwen3_30b_a3b:2:1; LEAN=0 SOURCE=1: the
# source-counter pass instead, per kernel); then a kernel timeline
# (scripts/gpu_timeline.sh) of TL_PROFILES (default qwen3_30b_a3b:4:1) for
# each of TL_VARIANTS ("NAME:ENV=V[,ENV=V] ...", default "default:").
# Leaves $OUT/build.txt, $OUT/kernels-PART.txt, $OUT/ncu/ncu_kernel.tar.gz
# and $OUT/tl-NAME/timeline.tar.gz.
# On the GPU machine:
#   cd .snap/src && NCU_KERNELS="add_rms attn_h" TL_VARIANTS="default: m3:MOEC_ATTN_MERGE=3" \
#     scripts/gpu_probe.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/gpu_build.sh
gpu_out_build probe || exit 1
# shellcheck disable=SC2086 # a list of parts
gpu_kern_parts "$OUT" "" ${KERNS-}
if [ -n "${NCU_KERNELS:-}" ]; then
  OUT=$OUT/ncu LEAN=${LEAN:-1} KERNELS="$NCU_KERNELS" PROFILE=${NCU_PROFILE:-qwen3_30b_a3b:2:1} \
    scripts/gpu_ncu_kernel.sh
fi
for v in ${TL_VARIANTS-default:}; do
  name=${v%%:*}
  envs=${v#*:}
  echo "== timeline $name (${envs:-no environment})"
  OUT=$OUT/tl-$name VARIANT="${envs//,/ }" PROFILES=${TL_PROFILES:-qwen3_30b_a3b:4:1} \
    scripts/gpu_timeline.sh | grep -E "^==|bench batch .* graph:|^  s " | head -24
done
