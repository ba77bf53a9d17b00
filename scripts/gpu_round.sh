#!/usr/bin/env bash
# gpu_round.sh — one device call for a kernel change: builds, runs the
# gpu_kernels cases it touches (KERN: names of MOEC_KERN_<NAME>_ONLY modes,
# default "MOE ROUTER"; "ALL" runs the whole of gpu_kernels), the GPU tests
# named in CTESTS (ctest regexes, default "gpu_model gpu_graphs"), then the
# V2-Lite-shape decode step, bf16 and fp8, with the A/B variants in VARIANTS
# (and FP8_VARIANTS, default the same) in one scripts/gpu_bench.sh call.
# On the GPU machine:
#   cd .snap/src && scripts/gpu_round.sh     (leaves $OUT/round.tar.gz)
# env: KERN, CTESTS, VARIANTS, FP8_VARIANTS, VARIANT_BATCHES (default 1,8,32,64),
#      BATCHES (default 1,8,32,64), FP8 (default 1), BENCH=0 (no benchmark),
#      BENCH_S (its time limit, default 330)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh
gpu_logs round
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; exit 1; }
for k in ${KERN-MOE ROUTER}; do
  if [ "$k" = ALL ]; then
    timeout 400 build-gpu/tests/gpu_kernels >"$LOGS/gpu_kernels.txt" 2>&1
  else
    env "MOEC_KERN_${k}_ONLY=1" timeout 200 build-gpu/tests/gpu_kernels >"$LOGS/gpu_kernels_$k.txt" 2>&1
  fi
  echo "gpu_kernels ($k): exit $?"
  grep -hE "FAIL|passed|failed" "$LOGS"/gpu_kernels*.txt | tail -4
done
for t in ${CTESTS-gpu_model gpu_graphs}; do
  (cd build-gpu && timeout 300 ctest -R "$t" --output-on-failure >"$LOGS/ctest_$t.txt" 2>&1)
  echo "$t: exit $?"; tail -3 "$LOGS/ctest_$t.txt"
done
if [ "${BENCH:-1}" != 0 ]; then
  v=${VARIANTS:-}
  MODEL_DIR=/dev/shm/v2l FP8=${FP8:-1} TORCH=0 MOEC_BENCH_FLAGS=" " \
    VARIANT_BATCHES="${VARIANT_BATCHES:-1,8,32,64}" VARIANTS="$v" FP8_VARIANTS="${FP8_VARIANTS-$v}" \
    timeout "${BENCH_S:-330}" scripts/gpu_bench.sh tests/data/configs/deepseek_v2_lite.json \
    "${BATCHES:-1,8,32,64}" 1024 >"$LOGS/bench.txt" 2>&1
  echo "bench: exit $?"; tail -40 "$LOGS/bench.txt"
  rm -rf /dev/shm/v2l*
fi
