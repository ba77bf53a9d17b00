#!/usr/bin/env bash
# gpu_plain_ab.sh — one device call: which latency-bound kernels of the
# batch-1 step gain from a plain launch (MOEC_PDL_OFF, no rebuild), on
# Qwen3-30B-A3B (cut to Q3_LAYERS, default 16, contexts 1024 and 8192) and
# DeepSeek-V2-Lite (cut to V2_LAYERS, default 10); then the GQA attention
# kernel of the one-token bucket under Nsight Compute with its warp-stall
# reasons, for each lanes-a-position setting in LPPS (default "1 4 0": one,
# four, the run-time choice); then the Qwen3 step's kernel timeline.
# Leaves $OUT/q3.txt, $OUT/v2.txt, $OUT/ncu-LPP.txt, $OUT/timeline.txt and
# their logs in $OUT/logs.tar.gz.
# On the GPU machine:  cd .snap/src && scripts/gpu_plain_ab.sh
# Parts can be skipped: Q3_VARIANTS= / V2_VARIANTS= / LPPS= / TIMELINE=0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/gpu_build.sh
gpu_out_build plain-ab logs || exit 1
Q3V=${Q3_VARIANTS-topk:MOEC_PDL_OFF=moe_topk comb:MOEC_PDL_OFF=attn_combine gu:MOEC_PDL_OFF=moe_gate_up dn:MOEC_PDL_OFF=moe_down}
V2V=${V2_VARIANTS-topk:MOEC_PDL_OFF=moe_topk comb:MOEC_PDL_OFF=mla_combine vabs:MOEC_PDL_OFF=mla_vabsorb attn:MOEC_PDL_OFF=mla_attn pro:MOEC_PDL_OFF=mla_prologue}
if [ -n "$Q3V" ]; then
  OUT=$OUT/ab-q3 timeout 420 scripts/gpu_ab.sh tests/data/configs/qwen3_30b_a3b.json "${Q3_LAYERS:-16}" 1,8 \
    "${Q3_CONTEXTS:-1024,8192}" "$Q3V" >"$OUT/q3.txt" 2>&1
  mv "$OUT/ab-q3/ab-logs.tar.gz" "$OUT/logs/ab-q3-logs.tar.gz" 2>/dev/null
fi
if [ -n "$V2V" ]; then
  OUT=$OUT/ab-v2 timeout 300 scripts/gpu_ab.sh tests/data/configs/deepseek_v2_lite.json "${V2_LAYERS:-10}" 1,8 \
    1024 "$V2V" >"$OUT/v2.txt" 2>&1
  mv "$OUT/ab-v2/ab-logs.tar.gz" "$OUT/logs/ab-v2-logs.tar.gz" 2>/dev/null
fi
for l in ${LPPS-1 4 0}; do
  (OUT=$OUT/ncu-$l MOEC_ATTN_LPP=$l STALLS=1 PROFILE=qwen3_30b_a3b:2:1 KERNELS=attn_h32 \
    timeout 240 scripts/gpu_ncu_kernel.sh) >"$OUT/ncu-$l.txt" 2>&1
  mv "$OUT/ncu-$l/ncu_kernel.tar.gz" "$OUT/logs/ncu-$l.tar.gz" 2>/dev/null
done
if [ "${TIMELINE:-1}" = 1 ]; then
  (OUT=$OUT/tl PROFILES=qwen3_30b_a3b:4:1 timeout 200 scripts/gpu_timeline.sh) >"$OUT/timeline.txt" 2>&1
  mv "$OUT/tl/timeline.tar.gz" "$OUT/logs/timeline.tar.gz" 2>/dev/null
fi
rm -rf "$OUT"/ab-q3 "$OUT"/ab-v2 "$OUT"/ncu-?/ "$OUT"/tl
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
