#!/usr/bin/env bash
# gpu_bench.sh — the decode benchmark of BENCHMARKS.md, run on the GPU
# machine in one call: builds moec, writes a DeepSeek-V2-Lite-shaped model
# with random bf16 weights (tests/data/configs/deepseek_v2_lite.json; about
# 31 GB, not committed), compiles it ahead of time (`moec compile`), runs
# `moec bench` on the plan file (load time, capture time, graph/eager x
# two streams/one, a per-kernel profile), then the PyTorch reference
# (bench/torch_ref.py) on the same weights, batch sizes and context; then
# the same shape with block-scaled fp8 weights (FP8=1, the default: about 16
# GB more on disk; FP8=0 skips it), written by `moec-sample --fp8` (or with
# FP8_FROM=quantize, the bf16 model quantized by `moec compile --quantize
# fp8`), compiled and benched the same way, each row with its own floor (the
# fp8 bytes and their scales), and again under each of FP8_VARIANTS (e.g.
# "old:MOEC_FP8_KERNEL=old": the fp8 kernels before the staged ones); and
# leaves every log and the JSON lines in $OUT/bench.tar.gz. The summary puts
# the fp8 step beside the bf16 one, each fp8 variant's beside both, and the
# fp8 linears' and expert GEMMs' profiled ms per step of each fp8 run.
#   usage: scripts/gpu_bench.sh [CONFIG_JSON] [BATCH_SIZES] [CONTEXT]
# TORCH_MODES picks the PyTorch modes (default eager-grouped,graph-grouped,
# compile-graph with TORCH_COMPILE_MODE, default "default";
# eager-loop, the per-expert loop transformers runs, takes minutes); TORCH=0
# leaves the PyTorch reference out (an A/B of moec variants alone).
set -uo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-tests/data/configs/deepseek_v2_lite.json}
BATCHES=${2:-1,8,32,64}
CONTEXT=${3:-1024}
OUT=${OUT:-/tmp/moec-bench}
LOGS=$(mktemp -d)/bench
mkdir -p "$OUT" "$LOGS"
source scripts/gpu_build.sh
export PYTHONUNBUFFERED=1
finish() {
  tar czf "$OUT/bench.tar.gz" -C "$(dirname "$LOGS")" bench
  cat "$LOGS"/*.table 2>/dev/null
  exit "${1:-0}"
}
{ nvidia-smi; date -u; cat COMMIT 2>/dev/null || git -C . log -1 --oneline; } >"$LOGS/env.txt" 2>&1 # COMMIT: written beside a snapshot
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; finish 1; }

MODEL=${MODEL_DIR:-/tmp/moec-bench-model} # MODEL_DIR=/dev/shm/x where the disk is too small
mkdir -p "$MODEL"
cp "$CONFIG" "$MODEL/config.json"
t0=$SECONDS
build-gpu/moec-sample "$MODEL/config.json" "$MODEL" --fast --force >"$LOGS/sample.txt" 2>&1 || { tail "$LOGS/sample.txt"; finish 1; }
echo "model written in $((SECONDS - t0)) s" | tee -a "$LOGS/env.txt"

df -h / /tmp >>"$LOGS/env.txt" 2>&1
t0=$SECONDS
build-gpu/moec compile "$MODEL" -o "$MODEL.moec" >"$LOGS/compile.txt" 2>&1 || { tail "$LOGS/compile.txt"; finish 1; }
echo "plan compiled in $((SECONDS - t0)) s" | tee -a "$LOGS/env.txt"
build-gpu/moec bench "$MODEL.moec" --weights "$MODEL" --batch-sizes "$BATCHES" --context "$CONTEXT" \
  ${MOEC_BENCH_FLAGS:---profile} --json >"$LOGS/moec.jsonl" 2>"$LOGS/moec.err" || tail -20 "$LOGS/moec.err"
rm -f "$MODEL.moec"
# VARIANTS="name:ENV=V[,ENV=V] ...": the same plan compiled and benched under
# each variant's environment (graph replay rows only; at VARIANT_BATCHES,
# default BATCHES, as FP8_VARIANTS below), e.g.
# VARIANTS="simt:MOEC_MOE_KERNEL=simt nopdl:MOEC_PDL=0"
# PREV_DIR=DIR: another source tree (e.g. an earlier commit's snapshot,
# with its .dev) built in DIR/build-gpu and benched as the variant "prev".
VB=${VARIANT_BATCHES:-$BATCHES}
# variant_bench MODEL KIND NAME MOEC_BINARY [ENV=V ...]: MODEL compiled and
# benched at VB under the settings, into $LOGS/${KIND}variant_NAME.* (its
# compile log appended to compile.txt, or compile_fp8.txt for KIND fp8,
# which also runs the bench's per-kernel profile, as its base run does)
variant_bench() {
  local model=$1 kind=$2 vname=$3 bin=$4 clog=compile.txt flags=()
  shift 4
  if [ "$kind" = fp8 ]; then
    clog=compile_fp8.txt
    read -ra flags <<<"${MOEC_BENCH_FLAGS:---profile}"
  fi
  env "$@" "$bin" compile "$model" -o "$model.$vname.moec" >>"$LOGS/$clog" 2>&1 &&
  env "$@" "$bin" bench "$model.$vname.moec" --weights "$model" --batch-sizes "$VB" \
    --context "$CONTEXT" "${flags[@]}" --json >"$LOGS/${kind}variant_$vname.jsonl" \
    2>"$LOGS/${kind}variant_$vname.err" || tail -20 "$LOGS/${kind}variant_$vname.err"
  rm -f "$model.$vname.moec"
}
for variant in ${VARIANTS:-}; do
  venv=${variant#*:}
  # shellcheck disable=SC2086 # the variant's ENV=V words
  variant_bench "$MODEL" "" "${variant%%:*}" build-gpu/moec ${venv//,/ }
done
if [ -n "${PREV_DIR:-}" ]; then
  if (cd "$PREV_DIR" && source scripts/gpu_build.sh && gpu_build) >"$LOGS/build_prev.txt" 2>&1; then
    variant_bench "$MODEL" "" prev "$PREV_DIR/build-gpu/moec" \
      MOEC_CACHE_DIR="$PREV_DIR/build-gpu/nvrtc-cache"
  else
    tail -20 "$LOGS/build_prev.txt"
  fi
fi
if [ "${FP8:-1}" = 1 ]; then
  F8=$MODEL-fp8
  rm -rf "$F8" "$F8.tmp"* "$F8.moec"
  t0=$SECONDS
  if [ "${FP8_FROM:-sample}" = quantize ]; then
    build-gpu/moec compile "$MODEL" -o "$F8.moec" --quantize fp8 --quantized-dir "$F8" \
      >"$LOGS/compile_fp8.txt" 2>&1 || tail "$LOGS/compile_fp8.txt"
  else
    build-gpu/moec-sample "$CONFIG" "$F8" --fast --force --fp8 >"$LOGS/sample_fp8.txt" 2>&1 &&
      build-gpu/moec compile "$F8" -o "$F8.moec" >"$LOGS/compile_fp8.txt" 2>&1 ||
      tail "$LOGS/sample_fp8.txt" "$LOGS/compile_fp8.txt"
  fi
  echo "fp8 model (${FP8_FROM:-sample}) written and compiled in $((SECONDS - t0)) s" | tee -a "$LOGS/env.txt"
  build-gpu/moec bench "$F8.moec" --weights "$F8" --batch-sizes "$BATCHES" --context "$CONTEXT" \
    ${MOEC_BENCH_FLAGS:---profile} --json >"$LOGS/moec_fp8.jsonl" 2>"$LOGS/moec_fp8.err" ||
    tail -20 "$LOGS/moec_fp8.err"
  rm -f "$F8.moec"
  # FP8_VARIANTS="name:ENV=V[,ENV=V] ...": the fp8 model compiled and benched
  # (with the per-kernel profile) under each variant's environment, e.g.
  # FP8_VARIANTS="old:MOEC_FP8_KERNEL=old" for the kernels before the staged ones
  for variant in ${FP8_VARIANTS:-}; do
    venv=${variant#*:}
    # shellcheck disable=SC2086 # the variant's ENV=V words
    variant_bench "$F8" fp8 "${variant%%:*}" build-gpu/moec ${venv//,/ }
  done
fi
if [ -f bench/torch_ref.py ] && [ "${TORCH:-1}" = 1 ]; then
  python3 bench/torch_ref.py "$MODEL" --batch-sizes "$BATCHES" --context "$CONTEXT" \
    --modes "${TORCH_MODES:-eager-grouped,graph-grouped,compile-graph}" \
    --compile-mode "${TORCH_COMPILE_MODE:-default}" \
    >"$LOGS/torch.jsonl" 2>"$LOGS/torch.table" || tail -20 "$LOGS/torch.table"
fi
python3 - "$LOGS" >"$LOGS/summary.table" <<'PY'
import json, os, sys
d = sys.argv[1]
rows, meta = {}, {}
variants = sorted(f for f in os.listdir(d) if f.startswith("variant_") and f.endswith(".jsonl"))
fp8v = sorted(f for f in os.listdir(d) if f.startswith("fp8variant_") and f.endswith(".jsonl"))
for name, impl in ([("moec.jsonl", None), ("moec_fp8.jsonl", "moec_fp8")] +
                   [(f, "moec_" + f[8:-6]) for f in variants] +
                   [(f, "moec_fp8_" + f[11:-6]) for f in fp8v] + [("torch.jsonl", None)]):
    p = os.path.join(d, name)
    if os.path.exists(p):
        for line in open(p):
            if line.startswith("{"):
                r = json.loads(line)
                if impl and r["mode"] != "graph":
                    continue
                rows.setdefault(r["batch"], {})[(impl or r["impl"]) + ":" + r["mode"]] = r
                if r["impl"] == "moec" and not impl:
                    meta = r
cols = sorted({k for r in rows.values() for k in r})
if meta:
    print(f"moec: {meta['device']}, {meta['dtype']}, copy {meta['copy_tb_s']:.2f} TB/s, "
          f"plan load + upload {meta['setup_s']:.2f} s, capture of all buckets {meta['capture_s']:.3f} s")
print("ms per decode step")
print("batch " + " ".join(f"{c:>20}" for c in cols) + "  floor_ms graph/floor graph/torch-graph"
      "  fp8_floor_ms fp8/fp8_floor fp8/bf16")
for b in sorted(rows):
    r = rows[b]
    g = r.get("moec:graph", {})
    fl = g.get("floor_ms")
    line = f"{b:5d} " + " ".join(f"{r[c]['ms']:20.3f}" if c in r else f"{'-':>20}" for c in cols)
    if fl:
        line += f"  {fl:8.3f} {g['ms'] / fl:11.2f}"
        tg = r.get("torch:graph-grouped")
        line += f" {g['ms'] / tg['ms']:17.2f}" if tg else f" {'-':>17}"
    f8 = r.get("moec_fp8:graph", {})
    if f8.get("floor_ms"):
        line += f"  {f8['floor_ms']:12.3f} {f8['ms'] / f8['floor_ms']:13.2f}"
        if g.get("ms"):
            line += f" {f8['ms'] / g['ms']:8.2f}"
    for f in fp8v:
        v = r.get("moec_fp8_" + f[11:-6] + ":graph", {})
        if v.get("floor_ms") and g.get("ms"):
            line += f"  {f[11:-6]}: /floor {v['ms'] / v['floor_ms']:.2f} /bf16 {v['ms'] / g['ms']:.2f}"
    print(line)
# the fp8 weights' kernels (linears, expert GEMMs) summed from each fp8
# run's per-kernel profile (moec bench --profile), ms per step
fp8k = ("linear_gemv_", "linear_mma_", "linear_f8tc_", "moe_gate_up_", "moe_down_")
runs = [("default", "moec_fp8.err")] + [(f[11:-6], f[:-6] + ".err") for f in fp8v]
prof = {}
for label, err in runs:
    p = os.path.join(d, err)
    if not os.path.exists(p):
        continue
    batch = None
    for line in open(p):
        if line.startswith("profile: batch"):
            batch = int(line.split()[2])
            continue
        parts = line.split()
        if batch is not None and len(parts) == 5 and parts[4].startswith(fp8k):
            prof.setdefault(batch, {}).setdefault(label, 0.0)
            prof[batch][label] += float(parts[0])
if prof:
    print("fp8 linears and expert GEMMs, ms per step (--profile, one stream): " +
          ", ".join(f"batch {b}: " + " ".join(f"{k} {v:.3f}" for k, v in prof[b].items())
                    for b in sorted(prof)))
PY
# the picture of BENCHMARKS.md, where the machine has matplotlib: $OUT/bench.png
if python3 -c "import matplotlib" 2>/dev/null; then
  plots=("$LOGS/moec.jsonl")
  [ -s "$LOGS/moec_fp8.jsonl" ] && plots+=("$LOGS/moec_fp8.jsonl")
  [ -s "$LOGS/torch.jsonl" ] && plots+=("$LOGS/torch.jsonl")
  python3 scripts/plot_bench.py "$OUT/bench.png" "${plots[@]}" >"$LOGS/plot.txt" 2>&1 ||
    tail -3 "$LOGS/plot.txt"
fi
finish 0
