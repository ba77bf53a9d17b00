#!/usr/bin/env bash
# gpu_sanitize.sh — compute-sanitizer over the GPU paths, every hazard or
# error a failure: racecheck, synccheck, initcheck and memcheck (with leak
# check) on `moec run` of every tiny model (the fp8 ones too), bf16 and fp32,
# CUDA Graphs on and off; then each tool on the real-shape kernel sample of
# tests/gpu_kernels.c (MOEC_KERN_SANITIZE=1, fp8 linears and experts among
# them) and on the device sampler's rounds of tests/gpu_sample.c
# (MOEC_SAMPLE_SANITIZE=1: every setting, eager and replayed). Runs JOBS
# sanitizer processes at once on the one
# GPU. Needs build-gpu/ (scripts/gpu_build.sh). Logs under $1 (a folder);
# prints one line per run and a total; exit 0 only when every run is clean.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?usage: gpu_sanitize.sh LOGDIR}
mkdir -p "$LOG"
SAN=${SAN:-/usr/local/cuda/bin/compute-sanitizer}
JOBS=${JOBS:-6}
TOOLS=${TOOLS:-"racecheck synccheck initcheck memcheck"}
MODELS=${MODELS:-"deepseek_v2 deepseek_v2_qlora deepseek_v3 qwen2_moe qwen3_moe deepseek_v3_fp8 qwen3_moe_fp8 deepseek_v32"}

# one TOOL DTYPE GRAPHS MODEL: one sanitized `moec run` (MODEL = kernels: the
# gpu_kernels sample; sampler: gpu_sample's); its verdict line on stdout.
one() {
  local tool=$1 dtype=$2 graphs=$3 model=$4
  local name=$tool.$model.$dtype.g$graphs log
  log=$LOG/$name.txt
  local args=(--tool "$tool" --error-exitcode 3)
  [ "$tool" = memcheck ] && args+=(--leak-check full)
  [ "$tool" = racecheck ] && args+=(--racecheck-report all)
  local prompt rc
  if [ "$model" = kernels ]; then
    MOEC_KERN_SANITIZE=1 "$SAN" "${args[@]}" build-gpu/tests/gpu_kernels >"$log" 2>&1
  elif [ "$model" = sampler ]; then
    MOEC_SAMPLE_SANITIZE=1 "$SAN" "${args[@]}" build-gpu/tests/gpu_sample >"$log" 2>&1
  else
    prompt=$(python3 -c "import json;print(','.join(map(str,json.load(open('tests/data/$model/prompt.json'))['prompt_ids'])))")
    MOEC_DTYPE=$dtype MOEC_DISABLE_GRAPHS=$((1 - graphs)) "$SAN" "${args[@]}" \
      build-gpu/moec run "tests/data/$model" --backend cuda --prompt-ids "$prompt" \
      --max-new-tokens 3 --ignore-eos >"$log" 2>&1
  fi
  rc=$?
  local summary
  summary=$(grep -E "(ERROR|RACECHECK|LEAK) SUMMARY" "$log" | tr '\n' ' ')
  local clean=1
  [ "$rc" = 0 ] || clean=0
  grep -qE "RACECHECK SUMMARY: [1-9]|ERROR SUMMARY: [1-9]" "$log" && clean=0
  [ -n "$summary" ] || clean=0
  echo "$([ $clean = 1 ] && echo clean || echo DIRTY) $name (exit $rc): $summary"
}
export -f one
export LOG SAN

{
  for tool in $TOOLS; do
    for model in $MODELS; do
      for dtype in bf16 fp32; do
        for graphs in 1 0; do
          echo "$tool $dtype $graphs $model"
        done
      done
    done
    echo "$tool bf16 0 kernels"
    echo "$tool fp32 0 sampler"
  done
} | xargs -P "$JOBS" -L 1 bash -c 'one "$@"' _ | sort | tee "$LOG/verdicts.txt"
total=$(wc -l <"$LOG/verdicts.txt")
dirty=$(grep -c '^DIRTY' "$LOG/verdicts.txt")
echo "sanitizers: $((total - dirty)) of $total runs clean"
[ "$dirty" = 0 ]
