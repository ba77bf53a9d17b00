#!/usr/bin/env bash
# test_torch_ref.sh — bench/torch_ref.py, the PyTorch reference behind the
# benchmark ratios, is faithful: its fp32 check passes on every tiny model in
# every MoE / MLA-cache / attention form, and fails on a perturbed golden, on
# a config whose routing or YaRN scale differs from the one the goldens were
# made with, on a missing tensor and on an unknown model_type.
# Needs a python with torch and safetensors: $MOEC_TORCH_PYTHON, else
# python3; without one it says so and passes (CI has no torch).
set -u
S=${MOEC_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
D=$S/tests/data
REF=$S/bench/torch_ref.py
PY=
for p in "${MOEC_TORCH_PYTHON:-}" python3; do
  if [ -n "$p" ] && "$p" -c 'import torch, safetensors' 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
  echo "SKIP: no python with torch and safetensors (set MOEC_TORCH_PYTHON)"
  exit 0
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"

# 1. Every tiny model, every form: 3 MLA models x 16 + 2 GQA models x 8.
out=$("$PY" "$REF" --check "$D/deepseek_v2" "$D/deepseek_v2_qlora" "$D/deepseek_v3" "$D/qwen2_moe" \
  "$D/qwen3_moe" 2>&1); rc=$?
[ "$rc" = 0 ] && ok || bad "check of the tiny models exited $rc: $out"
n=$(grep -c '^PASS ' <<<"$out")
[ "$n" = 64 ] && ok || bad "expected 64 PASS lines, got $n: $out"
grep -q '^FAIL' <<<"$out" && bad "a FAIL line in a passing check" || ok

# 2. Models that must not match their goldens.
mk() {  # mk NAME FROM: a copy of tests/data/FROM in $T/NAME
  mkdir -p "$T/$1" && cp "$D/$2"/{config.json,model.safetensors,prompt.json,golden.json,logits.bin} "$T/$1/"
}
mk logits qwen3_moe        # one golden logit moved by 1% of its row's max
"$PY" - "$T/logits/logits.bin" <<'EOF'
import sys, struct
p, vocab = sys.argv[1], 256
b = bytearray(open(p, "rb").read())
row = [struct.unpack_from("<f", b, 4 * (3 * vocab + i))[0] for i in range(vocab)]
struct.pack_into("<f", b, 4 * (3 * vocab + 7), row[7] + 0.01 * max(abs(x) for x in row))
open(p, "wb").write(b)
EOF
mk scale deepseek_v3       # routed_scaling_factor 2.5 -> 2.0
sed -i 's/"routed_scaling_factor": 2.5/"routed_scaling_factor": 2.0/' "$T/scale/config.json"
mk yarn deepseek_v2        # mscale_all_dim 0.707 -> 1.0: another softmax scale
sed -i 's/"mscale_all_dim": 0.707/"mscale_all_dim": 1.0/' "$T/yarn/config.json"
mk norm qwen3_moe          # norm_topk_prob true -> false
sed -i 's/"norm_topk_prob": true/"norm_topk_prob": false/' "$T/norm/config.json"
grep -q '"routed_scaling_factor": 2.0' "$T/scale/config.json" &&
  grep -q '"mscale_all_dim": 1.0' "$T/yarn/config.json" &&
  grep -q '"norm_topk_prob": false' "$T/norm/config.json" || bad "a config edit did not apply"
out=$("$PY" "$REF" --check "$T/logits" "$T/scale" "$T/yarn" "$T/norm" 2>&1); rc=$?
[ "$rc" = 1 ] && ok || bad "check of perturbed models exited $rc, want 1: $out"
for m in logits scale yarn norm; do
  np=$(grep -c "^PASS $T/$m " <<<"$out"); nf=$(grep -c "^FAIL $T/$m " <<<"$out")
  [ "$np" = 0 ] && [ "$nf" -gt 0 ] && ok || bad "$m: $np PASS / $nf FAIL lines, want only FAIL: $out"
done

# 3. Bad input: an error naming the tensor or field, exit status 2.
mk missing qwen3_moe
"$PY" - "$T/missing/model.safetensors" <<'EOF'
import sys
from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1])
del t["model.norm.weight"]
save_file(t, sys.argv[1])
EOF
out=$("$PY" "$REF" --check "$T/missing" 2>&1); rc=$?
[ "$rc" = 2 ] && ok || bad "missing tensor: exit $rc, want 2: $out"
grep -q "missing tensor model.norm.weight" <<<"$out" && ok || bad "missing tensor not named: $out"
mk llama qwen3_moe
sed -i 's/"model_type": "qwen3_moe"/"model_type": "llama"/' "$T/llama/config.json"
out=$("$PY" "$REF" --check "$T/llama" 2>&1); rc=$?
[ "$rc" = 2 ] && grep -q "model_type 'llama' is not supported" <<<"$out" && ok ||
  bad "unknown model_type: exit $rc: $out"

finish test_torch_ref
