#!/usr/bin/env bash
# gpu_fuse_probe.sh — one device call after a change to default kernels'
# source text: builds, runs the GPU tests in CTESTS (default "gpu_model
# gpu_graphs gpu_engine") and then the whole of gpu_kernels (KERN=0 leaves it
# out), one at a time: gpu_graphs asserts that the device's free memory is
# the same after its replays, which another process on the GPU breaks;
# then, with nothing else on the GPU, the step's
# kernel timeline (scripts/gpu_timeline.sh, PROFILES default
# qwen3_30b_a3b:4:1) once with the default environment and once under each
# of TL_VARIANTS ("NAME:ENV=V,ENV=V ...", default the GQA prologue fused
# into the attention kernel), so that a knob that lost in scripts/gpu_ab.sh
# shows which kernel it slowed. Leaves $OUT/probe.txt and one
# $OUT/timeline-NAME.tar.gz per variant.
# On the GPU machine:
#   cd .snap/src && scripts/gpu_fuse_probe.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-fuse-probe}
export OUT
mkdir -p "$OUT"
P=$OUT/probe.txt
source scripts/gpu_build.sh
gpu_build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
rc=0
for t in ${CTESTS-gpu_model gpu_graphs gpu_engine}; do
  (cd build-gpu && timeout "${CTEST_S:-300}" ctest -R "^$t\$" --output-on-failure >"$OUT/ctest_$t.txt" 2>&1) || rc=1
  echo "$t: $(grep -E "tests passed|tests failed" "$OUT/ctest_$t.txt" | tail -1)" | tee -a "$P"
done
if [ "${KERN:-1}" != 0 ]; then
  stdbuf -oL timeout "${KERN_S:-360}" build-gpu/tests/gpu_kernels >"$OUT/gpu_kernels.txt" 2>&1 || rc=1
  echo "gpu_kernels (all): $(grep -E "passed|FAIL" "$OUT/gpu_kernels.txt" | tail -1)" | tee -a "$P"
fi
[ $rc = 0 ] || echo "a check failed" | tee -a "$P"
for v in "default:" ${TL_VARIANTS-fpro:MOEC_ATTN_FUSE_PROLOGUE=1}; do
  name=${v%%:*} envs=${v#*:}
  (OUT=$OUT/tl-$name PROFILES=${PROFILES:-qwen3_30b_a3b:4:1} VARIANT=${envs//,/ } \
    timeout "${TL_S:-150}" scripts/gpu_timeline.sh >"$OUT/tl-$name.txt" 2>&1)
  mv "$OUT/tl-$name/timeline.tar.gz" "$OUT/timeline-$name.tar.gz" 2>/dev/null
  echo "== timeline, $name (${envs:-default})" >>"$P"
  head -60 "$OUT/tl-$name.txt" >>"$P"
done
rm -rf "$OUT"/tl-*/
mkdir -p "$OUT/logs"
mv "$OUT"/build.txt "$OUT"/gpu_kernels.txt "$OUT"/ctest_*.txt "$OUT"/tl-*.txt "$OUT/logs/" 2>/dev/null
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
exit $rc
