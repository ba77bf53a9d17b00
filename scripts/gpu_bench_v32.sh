#!/usr/bin/env bash
# gpu_bench_v32.sh — DeepSeek-V3.2's sparse attention against dense MLA, on
# the GPU machine in one call: builds moec, writes a V3.2-shaped model cut to
# a few layers of the real shape (tests/data/configs/deepseek_v32.json with
# num_hidden_layers 4: three dense layers and one MoE layer as the published
# model begins, random bf16 weights, about 31 GB, not committed), compiles it
# twice ahead of time — as deepseek_v32 (the DSA indexer, index_topk 2048,
# the sparse MLA) and as deepseek_v3 over the same checkpoint (the same
# weights but the indexer's, dense MLA) — and runs `moec bench` on both
# plans at each context, then `--profile` of the V3.2 plan for the
# indexer's own time per layer. Leaves every log and the JSON lines in
# $OUT/bench_v32.tar.gz and prints a summary: ms per decode step, sparse vs
# dense, and the indexer's kernels per layer.
#   usage: scripts/gpu_bench_v32.sh [BATCH_SIZES] [CONTEXTS]
#   (defaults 1,8,32,64 and 4096,16384; LAYERS=N changes the cut)
# Note: `moec bench` decodes at position CONTEXT over a KV cache it does not
# write; this script has the runtime fill it with varied values
# (MOEC_KV_FILL=random; KV_FILL=zero for zeros, where the indexer's scores
# all tie and the select skips its radix passes).
set -uo pipefail
cd "$(dirname "$0")/.."
BATCHES=${1:-1,8,32,64}
CONTEXTS=${2:-4096,16384}
LAYERS=${LAYERS:-4}
OUT=${OUT:-/tmp/moec-bench}
LOGS=$(mktemp -d)/bench_v32
mkdir -p "$OUT" "$LOGS"
source scripts/gpu_build.sh
finish() {
  tar czf "$OUT/bench_v32.tar.gz" -C "$(dirname "$LOGS")" bench_v32
  cat "$LOGS"/summary.table 2>/dev/null
  exit "${1:-0}"
}
{ nvidia-smi; date -u; cat COMMIT 2>/dev/null || git -C . log -1 --oneline; } >"$LOGS/env.txt" 2>&1
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; finish 1; }

SPARSE=${MODEL_DIR:-/tmp/moec-bench-v32} # MODEL_DIR=/dev/shm/x where the disk is too small
DENSE=$SPARSE-dense
mkdir -p "$SPARSE" "$DENSE"
python3 - "$LAYERS" tests/data/configs/deepseek_v32.json "$SPARSE/config.json" "$DENSE/config.json" <<'PY'
import json, sys
layers, src, sparse, dense = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
c = json.load(open(src))
c["num_hidden_layers"] = layers
json.dump(c, open(sparse, "w"), indent=2)
# the same model with dense MLA: deepseek_v3 reads the same tensors but the indexer's
c["model_type"] = "deepseek_v3"
c["architectures"] = ["DeepseekV3ForCausalLM"]
json.dump(c, open(dense, "w"), indent=2)
PY
t0=$SECONDS
build-gpu/moec-sample "$SPARSE/config.json" "$SPARSE" --fast --force >"$LOGS/sample.txt" 2>&1 ||
  { tail "$LOGS/sample.txt"; finish 1; }
ln -sf "$SPARSE/model.safetensors" "$DENSE/model.safetensors"
echo "model written in $((SECONDS - t0)) s ($LAYERS layers)" | tee -a "$LOGS/env.txt"
df -h / /tmp >>"$LOGS/env.txt" 2>&1

for kind in sparse dense; do
  dir=$SPARSE
  [ "$kind" = dense ] && dir=$DENSE
  t0=$SECONDS
  build-gpu/moec compile "$dir" -o "$dir.moec" >"$LOGS/compile_$kind.txt" 2>&1 ||
    { tail "$LOGS/compile_$kind.txt"; finish 1; }
  echo "$kind plan compiled in $((SECONDS - t0)) s" | tee -a "$LOGS/env.txt"
done
# KV_FILL=random (default): the caches hold varied values, so the indexer's
# scores differ and the select does all its work (KV_FILL=zero: as before).
export MOEC_KV_FILL=${KV_FILL:-random}
# VARIANTS="name:ENV=V[,ENV=V] ...": both plans compiled and benched again
# under each (codegen knobs and runtime settings alike), e.g.
# VARIANTS="prio1:MOEC_STREAM_PRIORITY=1 nomerge:MOEC_ATTN_MERGE=0"
for variant in "" ${VARIANTS:-}; do
  name=${variant%%:*}
  envs=()
  [ -n "$variant" ] && IFS=, read -ra envs <<<"${variant#*:}"
  sfx=${name:+_$name}
  # the default plans are compiled above; a variant's under its settings
  for kind in ${variant:+sparse dense}; do
    dir=$SPARSE
    [ "$kind" = dense ] && dir=$DENSE
    env "${envs[@]}" build-gpu/moec compile "$dir" -o "$dir$sfx.moec" >"$LOGS/compile_$kind$sfx.txt" 2>&1 ||
      tail "$LOGS/compile_$kind$sfx.txt"
  done
  for ctx in ${CONTEXTS//,/ }; do
    for kind in sparse dense; do
      dir=$SPARSE
      [ "$kind" = dense ] && dir=$DENSE
      # BUDGET_S: no bench starts after that many seconds (the summary and
      # the logs still come out)
      [ "$SECONDS" -ge "${BUDGET_S:-1000000}" ] && { echo "budget: skipped ${kind}_$ctx$sfx"; continue; }
      flags=--json
      [ "$kind" = sparse ] && [ -z "$variant" ] && flags="--json --profile"
      env "${envs[@]}" build-gpu/moec bench "$dir$sfx.moec" --weights "$dir" --batch-sizes "$BATCHES" \
        --context "$ctx" $flags >"$LOGS/${kind}_$ctx$sfx.jsonl" 2>"$LOGS/${kind}_$ctx$sfx.err" ||
        tail -20 "$LOGS/${kind}_$ctx$sfx.err"
    done
  done
  [ -n "$variant" ] && rm -f "$SPARSE$sfx.moec" "$DENSE$sfx.moec"
done
rm -f "$SPARSE.moec" "$DENSE.moec"

python3 - "$LOGS" "$CONTEXTS" "$LAYERS" "${VARIANTS:-}" >"$LOGS/summary.table" <<'PY'
import json, os, re, sys
d, contexts, layers = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
variants = [""] + [v.split(":")[0] for v in sys.argv[4].split()]
def rows(name):
    p = os.path.join(d, name)
    out = {}
    if os.path.exists(p):
        for line in open(p):
            if line.startswith("{"):
                r = json.loads(line)
                if r["mode"] == "graph":
                    out[r["batch"]] = r
    return out
def indexer(name):
    """ms per layer of the dsa_* kernels (and layer_norm) per batch, from --profile."""
    p, out, batch = os.path.join(d, name), {}, None
    if not os.path.exists(p):
        return out
    for line in open(p):
        m = re.match(r"profile: batch (\d+)", line)
        if m:
            batch = int(m.group(1))
            out[batch] = {"dsa": 0.0, "layer_norm": 0.0, "mla_attn": 0.0}
            continue
        f = line.split()
        if batch is None or len(f) < 5:
            continue
        try:
            ms = float(f[0])
        except ValueError:
            continue
        for key in out[batch]:
            if f[4].startswith(key):
                out[batch][key] += ms / layers
    return out
meta = next(iter(rows(f"sparse_{contexts[0]}.jsonl").values()), None)
if meta:
    print(f"{meta['device']}, {meta['dtype']}, copy {meta['copy_tb_s']:.2f} TB/s; {layers} layers of "
          f"DeepSeek-V3.2's shape; index_topk 2048")
print("ms per decode step (CUDA Graph replay); indexer: its dsa_* kernels per layer (--profile)")
print(f"{'variant':>10} {'context':>8} {'batch':>5} {'sparse':>9} {'dense':>9} {'sparse/dense':>12} "
      f"{'sparse/floor':>12} {'dense/floor':>11} {'indexer ms/layer':>16} {'mla ms/layer':>12}")
for v in variants:
  sfx = "_" + v if v else ""
  for ctx in contexts:
    s, dn, ix = rows(f"sparse_{ctx}{sfx}.jsonl"), rows(f"dense_{ctx}{sfx}.jsonl"), indexer(f"sparse_{ctx}.err")
    for b in sorted(set(s) | set(dn)):
        a, c = s.get(b), dn.get(b)
        i = ix.get(b, {}) if not v else {}
        print(f"{v or 'default':>10} {ctx:>8} {b:>5} {a['ms'] if a else float('nan'):9.3f} {c['ms'] if c else float('nan'):9.3f} "
              f"{(a['ms'] / c['ms']) if a and c else float('nan'):12.2f} "
              f"{(a['ms'] / a['floor_ms']) if a else float('nan'):12.2f} "
              f"{(c['ms'] / c['floor_ms']) if c else float('nan'):11.2f} "
              f"{i.get('dsa', float('nan')):16.4f} {i.get('mla_attn', float('nan')):12.4f}")
PY
finish 0
