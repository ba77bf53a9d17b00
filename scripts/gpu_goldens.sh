#!/usr/bin/env bash
# Runs on the GPU machine (where torch and transformers are installed):
# recomputes the transformers reference logits of every tiny model in
# tests/data on CUDA in fp32 (TF32 off) and packs them into $OUT/goldens.tar
# for copying back into tests/data/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 scripts/make_goldens.py --device cuda
tar cf "${OUT:-/tmp}/goldens.tar" tests/data/*/logits.bin tests/data/*/golden.json
