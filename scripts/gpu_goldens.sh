#!/usr/bin/env bash
# Runs on the GPU machine (where torch and transformers are installed):
# recomputes the transformers reference logits of the tiny models named as
# arguments (tests/data/NAME folders; every tiny model in tests/data when
# none is named) on CUDA in fp32 (TF32 off) and packs them into
# $OUT/goldens.tar for copying back into tests/data/, with transformers'
# own bf16 error on each (golden.json's transformers_bf16).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
# BF16_ONLY=1: only transformers' bf16 error on the existing goldens
flags=()
[ "${BF16_ONLY:-0}" = 1 ] && flags+=(--bf16-error)
python3 scripts/make_goldens.py --device cuda "${flags[@]}" "$@"
if [ $# -gt 0 ]; then
  files=()
  for d in "$@"; do files+=("$d/logits.bin" "$d/golden.json"); done
  tar cf "${OUT:-/tmp}/goldens.tar" "${files[@]}"
else
  tar cf "${OUT:-/tmp}/goldens.tar" tests/data/*/logits.bin tests/data/*/golden.json
fi
