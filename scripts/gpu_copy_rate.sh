#!/usr/bin/env bash
# gpu_copy_rate.sh — how steady the copy rate is that `moec bench` divides
# a step's bytes by (its floor): builds, writes a small model (CONFIG,
# default DeepSeek-V2-Lite's, cut to LAYERS layers, default 2) and runs
# `moec bench` at one batch size RUNS times (default 6), each a new
# process, printing each run's copy_tb_s and their spread. Leaves
# $OUT/copy_rate.txt.
# On the GPU machine:  cd .snap/src && scripts/gpu_copy_rate.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/gpu_build.sh
gpu_out_build copy-rate || exit 1
M=/dev/shm/moec-copy-rate
rm -rf "$M"
gpu_sample_model "${CONFIG:-tests/data/configs/deepseek_v2_lite.json}" "${LAYERS:-2}" "$M" \
  >"$OUT/sample.txt" 2>&1 || { tail "$OUT/sample.txt"; exit 1; }
for i in $(seq "${RUNS:-6}"); do
  "$GPU_ROOT/build-gpu/moec" bench "$M" --batch-sizes 1 --json 2>>"$OUT/bench.err" |
    grep -o '"copy_tb_s": [0-9.]*' | head -1
done | awk '{v[NR] = $2; print}
  END {mn = v[1]; mx = v[1]; for (i in v) { if (v[i] < mn) mn = v[i]; if (v[i] > mx) mx = v[i] }
    printf "copy_tb_s over %d runs: %.3f to %.3f (%.1f%% apart)\n", NR, mn, mx,
      (mn > 0 ? 100 * (mx - mn) / mn : 0) }' | tee "$OUT/copy_rate.txt"
rm -rf "$M"
