#!/usr/bin/env bash
# gpu_refcheck.sh — the transformers side of the references, checked on the
# GPU machine (torch and transformers there): 1. the tiny models' goldens
# recomputed by scripts/make_goldens.py into copies of tests/data/NAME and
# compared with the stored ones (greedy ids equal; the worst logit
# difference over the row's largest, 0 where the device and versions are
# the ones golden.json names); 2. the fp8 twins make_goldens.py writes with
# numpy and in plain Python (MOEC_GOLDENS_PURE=1), compared byte for byte;
# 3. scripts/hf_tokenizer_probe.py; 4. the tokenizer fixtures and their
# goldens written again by scripts/make_tokenizers.py (the tokenizers package
# is there) and compared with the stored ones: each file byte for byte, the
# goldens' texts and ids (not the version they name); the stored ones put
# back after; 5. unless SHAPES=0, scripts/gpu_shapes.sh
# with HF=1 (MODELS, DTYPES, MODES passed on; MODES default fp32).
# Logs under $OUT (refcheck.txt, tokenizer_probe.json, shapes.tar.gz or,
# cut short, shapes-partial.tar.gz).
#   cd .snap/src && MODELS="qwen3_30b_a3b" DTYPES=bf16 scripts/gpu_refcheck.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/moec-refcheck}
mkdir -p "$OUT" || exit 1
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rc=0
log=$OUT/refcheck.txt
{
  echo "== goldens recomputed ($(date -u +%FT%TZ))"
  dirs=()
  for d in tests/data/*/; do
    [ -f "$d/prompt.json" ] || continue
    cp -r "$d" "$work/$(basename "$d")"
    dirs+=("$work/$(basename "$d")")
  done
  python3 scripts/make_goldens.py --device cuda "${dirs[@]}" || rc=1
  python3 - "$work" <<'PY' || rc=1
import json, os, sys
import numpy as np
bad = 0
for name in sorted(os.listdir(sys.argv[1])):
    new, old = os.path.join(sys.argv[1], name), os.path.join("tests/data", name)
    g0, g1 = (json.load(open(os.path.join(d, "golden.json"))) for d in (old, new))
    a = np.fromfile(os.path.join(old, "logits.bin"), "<f4").reshape(g0["rows"], -1)
    b = np.fromfile(os.path.join(new, "logits.bin"), "<f4").reshape(g1["rows"], -1)
    err = float((np.abs(a - b).max(1) / np.abs(a).max(1)).max()) if a.shape == b.shape else -1
    same = g0["greedy_ids"] == g1["greedy_ids"]
    bad += not same or err < 0 or err > 1e-4
    print(f"{name}: greedy {'same' if same else 'DIFFER'}, worst row {err:.3g} "
          f"(stored on {g0['device']}, now {g1['device']}); bf16 error "
          f"{g0.get('transformers_bf16', {}).get('worst_row_error')} -> "
          f"{g1.get('transformers_bf16', {}).get('worst_row_error')}")
sys.exit(1 if bad else 0)
PY
  echo "== fp8 twins: numpy against plain Python"
  for d in tests/data/*fp8*/; do
    n=$(basename "$d")
    if python3 scripts/make_goldens.py --dequantize "$d" "$work/fast-$n" &&
      MOEC_GOLDENS_PURE=1 python3 scripts/make_goldens.py --dequantize "$d" "$work/pure-$n" &&
      cmp "$work/fast-$n/model.safetensors" "$work/pure-$n/model.safetensors"; then
      echo "$n: the same bytes"
    else
      echo "$n: DIFFER"
      rc=1
    fi
  done
  echo "== tokenizer probe"
  python3 scripts/hf_tokenizer_probe.py "$OUT" || rc=1
  echo "== tokenizer fixtures written again"
  cp -r tests/data/tokenizers "$work/tokenizers"
  python3 scripts/make_tokenizers.py || rc=1
  python3 - "$work/tokenizers" tests/data/tokenizers <<'PY' || rc=1
import filecmp, json, os, sys
old, new = sys.argv[1:]
bad = 0
for d in sorted(os.listdir(old)):
    if os.path.isdir(os.path.join(old, d)):
        names = set(os.listdir(os.path.join(old, d))) | set(os.listdir(os.path.join(new, d)))
        for f in sorted(names):
            a, b = os.path.join(old, d, f), os.path.join(new, d, f)
            same = os.path.isfile(a) and os.path.isfile(b) and filecmp.cmp(a, b, shallow=False)
            bad += not same
            print(f"{d}/{f}: {'the same bytes' if same else 'DIFFER'}")
g0, g1 = (json.load(open(os.path.join(x, "goldens.json"))) for x in (old, new))
for k in sorted(set(g0["tokenizers"]) | set(g1["tokenizers"])):
    same = g0["texts"] == g1["texts"] and g0["tokenizers"].get(k) == g1["tokenizers"].get(k)
    bad += not same
    print(f"goldens {k}: {'the same' if same else 'DIFFER'}")
sys.exit(1 if bad else 0)
PY
  rm -rf tests/data/tokenizers && cp -r "$work/tokenizers" tests/data/tokenizers
} >"$log" 2>&1
cat "$log"
# the shapes within SHAPES_S seconds (default 420): what ran by then is
# tarred even when the rest did not (compare it with compare_logits.py)
if [ "${SHAPES:-1}" = 1 ]; then
  HF=1 MODES=${MODES:-fp32} setsid scripts/gpu_shapes.sh &
  pid=$!
  for ((t = 0; t < ${SHAPES_S:-420}; t += 5)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 5
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "gpu_refcheck: the shapes cut short after ${SHAPES_S:-420} s"
    kill -- -"$pid" 2>/dev/null
    rc=1
  fi
  wait "$pid" || rc=1
  # shellcheck disable=SC2046 # the folders that exist, plain names
  [ -f "$OUT/shapes.tar.gz" ] ||
    tar -czf "$OUT/shapes-partial.tar.gz" -C "$OUT" $(cd "$OUT" && ls -d shapes hf 2>/dev/null)
fi
exit $rc
