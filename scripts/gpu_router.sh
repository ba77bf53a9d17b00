#!/usr/bin/env bash
# gpu_router.sh — the router's logits in the top-k kernel (codegen/moe_topk.c):
# builds, checks that kernel's forms against the interpreter at the real
# shapes (MOEC_KERN_ROUTER_ONLY=1 gpu_kernels, with each case's time), runs
# the tiny models' GPU tests (gpu_model, every bucket) and then the
# V2-Lite-shape step with the tensor-core form against it off
# (MOEC_MOE_ROUTE_MMA_MAX_T=1) at 8, 32 and 64 tokens, bf16 and fp8, in one
# scripts/gpu_bench.sh call (VARIANTS, the same for fp8, replaces that
# comparison). On the GPU machine:
#   cd .snap/src && scripts/gpu_router.sh     (leaves $OUT/router.tar.gz)
# TESTS=0 skips the tests, BENCH=0 the benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh
gpu_logs router
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; exit 1; }
if [ "${TESTS:-1}" != 0 ]; then
  MOEC_KERN_ROUTER_ONLY=1 MOEC_KERN_BENCH=1 timeout 200 build-gpu/tests/gpu_kernels \
    >"$LOGS/gpu_kernels_router.txt" 2>&1
  echo "gpu_kernels (router): exit $?"; grep -E "worst|FAIL|passed" "$LOGS/gpu_kernels_router.txt" | tail -12
  (cd build-gpu && timeout 200 ctest -R "gpu_model" --output-on-failure >"$LOGS/gpu_model.txt" 2>&1)
  echo "gpu_model: exit $?"; tail -3 "$LOGS/gpu_model.txt"
fi
if [ "${BENCH:-1}" != 0 ]; then
  v=${VARIANTS:-nomma:MOEC_MOE_ROUTE_MMA_MAX_T=1}
  MODEL_DIR=/dev/shm/v2l FP8=1 TORCH=0 MOEC_BENCH_FLAGS=" " VARIANT_BATCHES="${VARIANT_BATCHES:-8,32,64}" \
    VARIANTS="$v" FP8_VARIANTS="$v" \
    timeout "${BENCH_S:-330}" scripts/gpu_bench.sh tests/data/configs/deepseek_v2_lite.json "${BATCHES:-1,8,32,64}" 1024 \
    >"$LOGS/bench.txt" 2>&1
  echo "bench: exit $?"; tail -30 "$LOGS/bench.txt"
  rm -rf /dev/shm/v2l*
fi
