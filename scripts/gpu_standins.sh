#!/usr/bin/env bash
# gpu_standins.sh — fp8 DeepSeek-V2-Lite against configs that stand in for
# changes not built (BENCHMARKS.md, thirty-fourth round), one device call:
# scripts/gpu_ab.sh's default at BATCHES (default 1,32,64) for each of
#   v2lite  the config as it is;
#   fold    66 routed experts, 8 a token, no shared expert: the shared
#           expert as routed experts every token takes, the same bytes a
#           step at batch 1 and 64 (also run in bf16 with BF16=1);
#   attn16  q_proj, kv_a_proj_with_mqa and o_proj kept bf16
#           (modules_to_not_convert), so on cuBLASLt: fp8 linears as fast
#           as cuBLASLt's bf16 ones, in the attention;
#   all16   every linear but the routed experts' kept bf16.
# STANDINS="fold attn16" picks some. Leaves $OUT/ab.txt (one table each).
# On the GPU machine:  cd .snap/src && OUT=/tmp/si scripts/gpu_standins.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/moec-standins}
export OUT
CFG=tests/data/configs/deepseek_v2_lite.json
D=$(mktemp -d)
python3 - "$CFG" "$D" <<'PY' || exit 1
import json, sys
c = json.load(open(sys.argv[1]))
q = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
     "weight_block_size": [128, 128]}
attn = ["q_proj", "kv_a_proj_with_mqa", "o_proj"]
mlps = [f"{m}.{p}_proj" for m in ("shared_experts", "mlp") for p in ("gate", "up", "down")]
out = {
    "v2lite": dict(c),
    "fold": dict(c, n_routed_experts=66, n_shared_experts=0, num_experts_per_tok=8),
    "attn16": dict(c, quantization_config=dict(q, modules_to_not_convert=attn)),
    "all16": dict(c, quantization_config=dict(q, modules_to_not_convert=attn + mlps)),
}
for name, cfg in out.items():
    json.dump(cfg, open(f"{sys.argv[2]}/{name}.json", "w"), indent=1)
PY
rc=0
for s in ${STANDINS:-v2lite fold attn16 all16}; do
  FP8=1 timeout "${AB_S:-200}" scripts/gpu_ab.sh "$D/$s.json" 0 "${BATCHES:-1,32,64}" 1024 "" \
    >"$OUT/ab-$s.txt" 2>&1 || rc=1
  if [ "${BF16:-0}" = 1 ] && { [ "$s" = v2lite ] || [ "$s" = fold ]; }; then
    FP8=0 timeout "${AB_S:-200}" scripts/gpu_ab.sh "$D/$s.json" 0 "${BATCHES:-1,32,64}" 1024 "" \
      >"$OUT/ab-$s-bf16.txt" 2>&1 || rc=1
  fi
done
rm -rf "$D"
cat "$OUT/ab.txt"
exit $rc
