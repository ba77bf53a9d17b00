#!/usr/bin/env bash
# gpu_timeline.sh — where a decode step's time goes inside the graph: a
# kernel trace records when every kernel of the graph replays starts and
# ends on each stream (Nsight Systems with --cuda-graph-trace=node where the
# machine has nsys, else bench/cupti_trace.c, CUPTI's activity API loaded
# through CUDA_INJECTION64_PATH), and bench/timeline.py sets
# one steady replay out: per kernel its start, its time, the gap before it
# on its stream (what the boundary costs there), and per kernel name the
# sums over the step, beside the step time. Unlike gpu_ncu.sh (each kernel
# timed alone) this is the step as it runs: the two streams overlapping,
# each kernel's L2 as the kernels before it left it.
# For each PROFILES entry CONFIG:LAYERS:BATCH[:fp8] (as gpu_ncu.sh) a model
# with random weights is written under /dev/shm; moec bench runs BATCH
# sequences at CONTEXT (default 1024) under nsys.
#   usage: scripts/gpu_timeline.sh   (on the GPU machine; see gpu_snapshot.sh)
#   env: PROFILES (default deepseek_v2_lite:0:1), CONTEXT, WARMUP and STEPS
#        (moec bench's, default 5 and 20), VARIANT="ENV=V ..."
#        (the environment moec bench, hence its compile, runs under)
#   leaves $OUT/timeline.tar.gz: per profile the bench JSON and the summary
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh
gpu_logs timeline
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys \
  /usr/local/cuda/nsight-systems-*/bin/nsys 2>/dev/null | head -1)
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; exit 1; }
if [ -z "$NSYS" ]; then
  CUPTI_LIB=$(ls -d /usr/local/cuda/extras/CUPTI/lib64 /usr/local/cuda/lib64 /usr/local/cuda/lib 2>/dev/null |
    while read -r d; do [ -e "$d/libcupti.so" ] && echo "$d"; done | head -1)
  CUPTI_INC=$(ls -d /usr/local/cuda/extras/CUPTI/include /usr/local/cuda/include 2>/dev/null |
    while read -r d; do [ -e "$d/cupti.h" ] && echo "$d"; done | head -1)
  { [ -n "$CUPTI_LIB" ] && [ -n "$CUPTI_INC" ] &&
    cc -O2 -shared -fPIC -I"$CUPTI_INC" -I/usr/local/cuda/include -o "$LOGS/libcupti_trace.so" \
      bench/cupti_trace.c -L"$CUPTI_LIB" -Wl,-rpath,"$CUPTI_LIB" -lcupti -lpthread; } \
    >"$LOGS/cupti_build.txt" 2>&1 ||
    { echo "no nsys, and no CUPTI to build bench/cupti_trace.c with"; cat "$LOGS/cupti_build.txt"; exit 1; }
fi
for spec in ${PROFILES:-deepseek_v2_lite:0:1}; do
  IFS=: read -r cfg layers batch fp8 <<<"$spec"
  name=$cfg-$layers-b$batch${fp8:+-fp8}
  M=/dev/shm/moec-tl-$name
  rm -rf /dev/shm/moec-tl-* /dev/shm/moec-ncu-* /dev/shm/moec-prof-*
  t0=$SECONDS
  gpu_sample_model "tests/data/configs/$cfg.json" "$layers" "$M" "$fp8" >"$LOGS/$name.sample.txt" 2>&1 ||
    { tail "$LOGS/$name.sample.txt"; continue; }
  BENCH=(build-gpu/moec bench "$M" --batch-sizes "$batch" --context "${CONTEXT:-1024}" --json
    --steps "${STEPS:-20}" --warmup "${WARMUP:-5}")
  if [ -n "$NSYS" ]; then
    # shellcheck disable=SC2086 # VARIANT is a list of assignments
    env ${VARIANT:-} timeout "${NSYS_S:-300}" "$NSYS" profile --cuda-graph-trace=node --trace=cuda \
      --sample=none --cpuctxsw=none -o "$LOGS/$name" --force-overwrite true "${BENCH[@]}" \
      >"$LOGS/$name.jsonl" 2>"$LOGS/$name.err" ||
      { echo "nsys on $name: exit $?"; tail -20 "$LOGS/$name.err"; continue; }
    "$NSYS" stats --report cuda_gpu_trace --format csv --output "$LOGS/$name" \
      "$LOGS/$name.nsys-rep" >"$LOGS/$name.stats.txt" 2>&1 || tail "$LOGS/$name.stats.txt"
    rm -f "$LOGS/$name.sqlite"
    csv=$(ls "$LOGS/$name"*cuda_gpu_trace*.csv 2>/dev/null | head -1)
  else
    csv=$LOGS/$name.trace.csv
    # shellcheck disable=SC2086 # VARIANT is a list of assignments
    env ${VARIANT:-} CUDA_INJECTION64_PATH="$LOGS/libcupti_trace.so" MOEC_CUPTI_OUT="$csv" \
      timeout "${NSYS_S:-300}" "${BENCH[@]}" >"$LOGS/$name.jsonl" 2>"$LOGS/$name.err" ||
      { echo "traced bench on $name: exit $?"; tail -20 "$LOGS/$name.err"; continue; }
  fi
  python3 bench/timeline.py "$LOGS/$name.jsonl" "$csv" "${WARMUP:-5}" "${STEPS:-20}" \
    >"$LOGS/$name.summary.txt" 2>&1
  gzip -f "$csv" "$LOGS/$name.nsys-rep" 2>/dev/null
  rm -rf "$M"
  echo "== $name ($((SECONDS - t0)) s)"
  head -80 "$LOGS/$name.summary.txt"
done
