#!/usr/bin/env bash
# gpu_shapes.sh — published models' shapes end to end: for each model of
# scripts/published_shapes.py (MODELS, default all; cut to two layers, fewer
# routed experts, a 4096-token vocabulary), a random-weight checkpoint
# (moec-sample --fast, seed 1) in bf16 and in block-scaled fp8, then
# `moec run` of one 70-token prompt (a chunk of the 64-token bucket, then
# one of 8) and 3 greedy decode steps, with --logits-out, in each of MODES
# (default "bf16 fp32": the CUDA backend in bf16, and in fp32 with
# MOEC_DTYPE=fp32; "cpu": the reference interpreter); DTYPES (default
# "bf16 fp8") picks the checkpoints' weights.
# Leaves $OUT/shapes/NAME-DT-MODE.{bin,txt} (logits, generated ids and
# stderr; DT is bf16 or fp8) and $OUT/shapes.tar.gz (with $OUT/hf under
# HF=1). Compare two runs' files with scripts/compare_logits.py (REF=DIR: with the references in
# DIR at the end, its table in $OUT/compare.txt, failing where it fails).
# HF=1 also runs each checkpoint in transformers (float32, on the GPU:
# scripts/hf_shapes.py) into $OUT/hf and compares the runs with it, the
# table in $OUT/compare-hf.txt: the published configs as the reference
# implementation reads them. With MODES=fp32 on the H200 (2026-12-01,
# make_goldens.py's dequantization on numpy), the four Qwen models' eight
# checkpoints took a call of 3 minutes (gpu_refcheck.sh's other checks
# included) and the other seven models' fourteen one of 5: name about half
# the MODELS a call.
#   On the GPU machine:  cd .snap/src && scripts/gpu_shapes.sh
#   The references, anywhere:  MODES=cpu OUT=/tmp/ref scripts/gpu_shapes.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/gpu_build.sh
if [ "${MODES:-bf16 fp32}" = cpu ] && [ -x "${BIN:-build}/moec" ]; then
  OUT=${OUT:-/tmp/moec-shapes}
  mkdir -p "$OUT/shapes" || exit 1
  BIN=${BIN:-build}
else
  gpu_out_build shapes shapes || exit 1
  BIN=build-gpu
fi
work=$(mktemp -d)
mkdir -p "$work/ck"
trap 'rm -rf "$work"' EXIT
python3 scripts/published_shapes.py "$work/cfg" ${MODELS:-} >/dev/null || exit 1
ids=$(python3 -c "print(','.join(str((i * 37 + 11) % 4000 + 2) for i in range(70)))")
rc=0
for cfg in "$work"/cfg/*.json; do
  name=$(basename "$cfg" .json)
  for dt in ${DTYPES:-bf16 fp8}; do
    m=$work/m
    [ "${HF:-0}" = 1 ] && m=$work/ck/$name-$dt # kept for transformers
    rm -rf "$m"
    flag=""
    [ "$dt" = bf16 ] || flag=--fp8
    # shellcheck disable=SC2086 # empty or one flag
    if ! "$BIN/moec-sample" "$cfg" "$m" --fast $flag >"$OUT/shapes/$name-$dt-sample.txt" 2>&1; then
      echo "$name $dt: moec-sample failed"
      rc=1
      continue
    fi
    for mode in ${MODES:-bf16 fp32}; do
      f=$OUT/shapes/$name-$dt-$mode
      backend=cuda
      dtype=bf16
      [ "$mode" = cpu ] && backend=cpu
      [ "$mode" = fp32 ] && dtype=fp32
      start=$(date +%s%N)
      if MOEC_DTYPE=$dtype timeout "${RUN_S:-300}" "$BIN/moec" run "$m" --backend "$backend" \
        --prompt-ids "$ids" --max-new-tokens 3 --logits-out "$f.bin" >"$f.txt" 2>"$f.err"; then
        echo "$name $dt $mode: $(cat "$f.txt") ($((($(date +%s%N) - start) / 1000000)) ms)"
      else
        echo "$name $dt $mode: failed: $(tail -2 "$f.err" | tr '\n' ' ')"
        rc=1
      fi
    done
  done
done
if [ "${HF:-0}" = 1 ]; then
  python3 scripts/hf_shapes.py "$work/ck" "$OUT/hf" "$ids" 3 >"$OUT/hf.txt" 2>&1 || rc=1
  cat "$OUT/hf.txt"
  python3 scripts/compare_logits.py "$OUT/hf" "$OUT/shapes" >"$OUT/compare-hf.txt" || rc=1
  cat "$OUT/compare-hf.txt"
fi
rm -rf "$work"
if [ -n "${REF:-}" ]; then
  python3 scripts/compare_logits.py "$REF" "$OUT/shapes" >"$OUT/compare.txt" || rc=1
  cat "$OUT/compare.txt"
fi
tar -czf "$OUT/shapes.tar.gz" -C "$OUT" shapes $([ -d "$OUT/hf" ] && echo hf)
exit $rc
