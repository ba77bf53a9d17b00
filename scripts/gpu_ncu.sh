#!/usr/bin/env bash
# gpu_ncu.sh — where a decode step's time goes when every kernel is timed
# alone: Nsight Compute (ncu, --clock-control none) times each kernel of one
# graph replay (node by node; NCU_CACHE=all flushes L2 before each, the
# default none leaves it as the step before left it), and the sum
# is set beside the step's graph replay time; the difference is what the
# kernel boundaries cost in the graph (launch, ramp-up, drain, waits) less
# what the two streams overlap. bench/boundary.cu measures a boundary on its
# own first (BOUNDARY=0 skips it). For each PROFILES entry
# CONFIG:LAYERS:BATCH[:fp8] (as gpu_profile.sh) a model with random weights
# is written under /dev/shm and one step of BATCH sequences is timed.
#   usage: scripts/gpu_ncu.sh   (on the GPU machine; see gpu_snapshot.sh)
#   leaves $OUT/ncu.tar.gz: boundary.txt, per model the bench JSON, ncu CSV
#   and summary (kernels by name: count, us summed, us each)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh
gpu_logs ncu
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ "${BOUNDARY:-1}" = 1 ]; then
  nvcc -O3 -arch=sm_90 -o "$LOGS/boundary" bench/boundary.cu >"$LOGS/boundary.txt" 2>&1 &&
    "$LOGS/boundary" >>"$LOGS/boundary.txt" 2>&1
  cat "$LOGS/boundary.txt"
fi
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; exit 1; }
for spec in ${PROFILES:-deepseek_v2_lite:0:1 qwen3_30b_a3b:8:1}; do
  IFS=: read -r cfg layers batch fp8 <<<"$spec"
  name=$cfg-$layers-b$batch${fp8:+-fp8}
  M=/dev/shm/moec-ncu-$name
  rm -rf /dev/shm/moec-ncu-* /dev/shm/moec-prof-*
  t0=$SECONDS
  gpu_sample_model "tests/data/configs/$cfg.json" "$layers" "$M" "$fp8" >"$LOGS/$name.sample.txt" 2>&1 ||
    { tail "$LOGS/$name.sample.txt"; continue; }
  build-gpu/moec bench "$M" --batch-sizes "$batch" --context "${CONTEXT:-1024}" --json --profile \
    >"$LOGS/$name.jsonl" 2>"$LOGS/$name.err" || tail -20 "$LOGS/$name.err"
  timeout "${NCU_S:-240}" "$NCU" --clock-control none --cache-control "${NCU_CACHE:-none}" \
    --metrics gpu__time_duration.sum --csv \
    --print-units base --launch-count "${NCU_COUNT:-1000}" --log-file "$LOGS/$name.ncu.csv" \
    build-gpu/moec bench "$M" --batch-sizes "$batch" --context "${CONTEXT:-1024}" --steps 1 --warmup 0 \
    >"$LOGS/$name.ncu.out" 2>&1 || echo "ncu on $name: exit $?"
  echo "== $name ($((SECONDS - t0)) s)"
  python3 - "$LOGS/$name.jsonl" "$LOGS/$name.ncu.csv" >"$LOGS/$name.summary.txt" <<'PY'
import csv, json, re, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"bench batch {r['batch']} {r['mode']}: {r['ms']:.3f} ms, floor {r.get('floor_ms', 0):.3f}")
rows = []
with open(sys.argv[2]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") == "gpu__time_duration.sum":
        rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", "")) / 1000.0, r.get("Grid Size", ""),
                     r.get("Block Size", "")))
# steps start at the embedding kernel; the bench's order is graph (two
# streams), graph (one stream), eager, eager (one stream)
starts = [i for i, r in enumerate(rows) if r[0].startswith("embedding")]
segs = [rows[a:b] for a, b in zip(starts, starts[1:] + [len(rows)])]
for i, s in enumerate(segs):
    print(f"step {i}: {len(s)} kernels, {sum(r[1] for r in s):.1f} us summed")
if segs:
    s = segs[0]
    agg = {}
    for name, us, g, b in s:
        key = re.sub(r"_[0-9a-f]{8,}$", "", name)
        a = agg.setdefault(key, [0, 0.0, g, b])
        a[0] += 1
        a[1] += us
    print(f"\nfirst step by kernel ({len(s)} kernels, {sum(r[1] for r in s):.1f} us):")
    for k, (n, us, g, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{us:9.1f} us {n:4d} x {us / n:7.2f} us  grid {g} block {b}  {k}")
    print("\nfirst step in order (first 40):")
    for name, us, g, b in s[:40]:
        print(f"{us:8.2f} us  grid {g:>14} block {b:>12}  {name}")
PY
  head -60 "$LOGS/$name.summary.txt"
done
rm -rf /dev/shm/moec-ncu-*
