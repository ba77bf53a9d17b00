#!/usr/bin/env bash
# gpu_bf16_sweep.sh — moec's bf16 error against transformers' own on tiny
# random models other than tests/data's (issue 15): for each family's tiny
# config (tests/data/NAME/config.json), at its own size and at a wider one
# (hidden and experts doubled, a layer more), with several weight seeds,
# writes the model (moec-sample), its fp32 golden and transformers' bf16
# error (scripts/make_goldens.py, teacher-forced), then moec's bf16 GPU
# error op by op and per logits row (build-gpu/tests/bf16_trace). Runs on
# the GPU machine after a build (scripts/gpu_build.sh); leaves
# $OUT/bf16_sweep.txt (the table) and $OUT/bf16_sweep_trace.txt.
# FAMILIES and SEEDS override the lists.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-gpu}
mkdir -p "$OUT"
source scripts/gpu_build.sh
[ -x build-gpu/tests/bf16_trace ] || gpu_build >"$OUT/sweep_build.txt" 2>&1 || exit 1
FAMILIES=${FAMILIES:-"deepseek_v2 deepseek_v3 qwen2_moe qwen3_moe deepseek_v32"}
SEEDS=${SEEDS:-"11 12"}
root=$(mktemp -d)
dirs=()
for fam in $FAMILIES; do
  for size in base wide; do
    for seed in $SEEDS; do
      [ "$size" = wide ] && [ "$seed" != "${SEEDS%% *}" ] && continue
      d=$root/${fam}_${size}_s$seed
      mkdir -p "$d"
      python3 - "tests/data/$fam/config.json" "$size" "$seed" "$d" <<'PY' || exit 1
import json, random, sys
src, size, seed, d = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
c = json.load(open(src))
if size == "wide":
    c["hidden_size"] *= 2
    c["num_hidden_layers"] += 1
    for k in ("mlp_layer_types", "layer_types"):
        if isinstance(c.get(k), list) and c[k]:
            c[k].append(c[k][-1])
    for k in ("n_routed_experts", "num_experts"):
        if k in c:
            c[k] *= 2
    if c.get("n_group", 1) > 1:
        c["n_group"] *= 2
json.dump(c, open(d + "/config.in.json", "w"), indent=1)
r = random.Random(seed)
json.dump({"prompt_ids": [r.randrange(c["vocab_size"]) for _ in range(8)]}, open(d + "/prompt.json", "w"))
PY
      build-gpu/moec-sample "$d/config.in.json" "$d" --seed "$seed" --force >/dev/null || exit 1
      dirs+=("$d")
    done
  done
done
python3 scripts/make_goldens.py --device cuda "${dirs[@]}" >"$OUT/sweep_goldens.txt" 2>&1 || {
  tail -20 "$OUT/sweep_goldens.txt"
  exit 1
}
{
  printf '%-28s %12s %12s %12s %8s %s\n' model transformers moec_gpu cpu_rounded ratio flips
  for d in "${dirs[@]}"; do
    build-gpu/tests/bf16_trace "$d" 8 >"$d/trace.txt" 2>&1
    { echo "== $d"; cat "$d/trace.txt"; } >>"$OUT/bf16_sweep_trace.txt"
    python3 - "$d" <<'PY'
import json, re, sys, os
d = sys.argv[1]
tf = json.load(open(d + "/golden.json"))["transformers_bf16"]
line = [l for l in open(d + "/trace.txt") if "logits rows" in l]
m = re.search(r"gpu ([0-9.e+-]+) \(argmax flips (\d+)\), cpu-rounded ([0-9.e+-]+)", line[-1]) if line else None
if not m:
    print(f"{os.path.basename(d):28s} trace failed")
else:
    g, fl, c = float(m.group(1)), int(m.group(2)), float(m.group(3))
    print(f"{os.path.basename(d):28s} {tf['worst_row_error']:12.4g} {g:12.4g} {c:12.4g} "
          f"{g / tf['worst_row_error']:8.2f} moec {fl} / transformers {tf['argmax_flips']}")
PY
  done
} | tee "$OUT/bf16_sweep.txt"
rm -rf "$root"
