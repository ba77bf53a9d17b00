#!/usr/bin/env bash
# gpu_dsa_ab.sh — dsa_topk's fast kernels against its legacy ones
# (codegen/dsa_topk.c, MOEC_DSA_KERNEL), on the GPU machine in one call:
# builds tests/gpu_kernels (scripts/gpu_build.sh), runs its DSA cases
# (MOEC_KERN_DSA_ONLY=1: the sparse MLA over the indexer's selection at
# V3.2's shape, the fused indexer (pass fuse_dsa_indexer: dsa_prologue_k,
# dsa_topk reading q and the weights in place and rotating q) against the
# interpreter, then every form of the indexer against the reference at
# contexts 1000 to 16384, T = 1, 3 and 64, and the select on crafted score
# rows) with MOEC_KERN_BENCH=1 (each form's k_write, score and select times
# at T = 1 and 64, contexts 4096 and 16384), then compute-sanitizer's
# racecheck and synccheck on a small sample of the same (SAN_TOOLS="" skips
# them). Logs in $OUT/dsa_ab.tar.gz; prints the bench table and verdicts.
#   usage: scripts/gpu_dsa_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-dsa}
LOGS=${LOGS:-$(mktemp -d)/dsa_ab}
mkdir -p "$OUT" "$LOGS"
SAN=${SAN:-/usr/local/cuda/bin/compute-sanitizer}
SAN_TOOLS=${SAN_TOOLS-"racecheck synccheck"}
source scripts/gpu_build.sh
finish() {
  tar czf "$OUT/dsa_ab.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
  exit "$1"
}
{ nvidia-smi; date -u; cat COMMIT 2>/dev/null || git -C . log -1 --oneline; } >"$LOGS/env.txt" 2>&1
{ cmake "${GPU_CMAKE_ARGS[@]}" && cmake --build build-gpu -j"$(nproc)" --target gpu_kernels; } \
  >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; finish 1; }
rc=0
MOEC_KERN_DSA_ONLY=1 MOEC_KERN_BENCH=1 build-gpu/tests/gpu_kernels >"$LOGS/kernels.txt" 2>&1 || rc=1
grep -E "^(v32_dsa|odd_dsa|  bench dsa|dsa bench|FAIL|gpu_kernels)" "$LOGS/kernels.txt" | head -80
for tool in $SAN_TOOLS; do
  args=(--tool "$tool" --error-exitcode 3)
  [ "$tool" = racecheck ] && args+=(--racecheck-report all)
  MOEC_KERN_DSA_ONLY=1 MOEC_KERN_SANITIZE=1 "$SAN" "${args[@]}" build-gpu/tests/gpu_kernels \
    >"$LOGS/$tool.txt" 2>&1 || rc=1
  echo "$tool (exit $?): $(grep -E "(ERROR|RACECHECK) SUMMARY" "$LOGS/$tool.txt" | tr '\n' ' ')"
done
finish "$rc"
