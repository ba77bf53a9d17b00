#!/usr/bin/env bash
# gpu_profile.sh — where a decode step's time goes, kernel by kernel: for
# each PROFILES entry CONFIG:LAYERS:BATCHES[:fp8] a model with random weights
# of that config (tests/data/configs/CONFIG.json; LAYERS > 0 cuts it to its
# first LAYERS layers, 0 keeps them all; fp8: block-scaled fp8 weights from
# `moec-sample --fp8`) is written under /dev/shm and `moec bench --profile`
# runs on it (graph replay and eager rows, then the per-kernel profile: one
# stream, an event between launches) at context CONTEXT (1024). Before that,
# CTEST_R (a ctest -R regex, default gpu_kernels; "" for none) runs from the
# GPU build. Leaves $OUT/profile.tar.gz and prints the graph rows and the
# profiles' top kernels.
#   usage: scripts/gpu_profile.sh   (on the GPU machine; see gpu_snapshot.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh
gpu_logs profile
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; exit 1; }
if [ -n "${CTEST_R-gpu_kernels}" ]; then
  (cd build-gpu && ctest -R "${CTEST_R-gpu_kernels}" --output-on-failure) >"$LOGS/ctest.txt" 2>&1
  echo "ctest -R ${CTEST_R-gpu_kernels}: exit $?"; grep -E "tests passed|Failed|\*\*\*" "$LOGS/ctest.txt"
fi
for spec in ${PROFILES:-deepseek_v2_lite:0:1,64 deepseek_v2_lite:0:1:fp8 qwen3_30b_a3b:8:1}; do
  IFS=: read -r cfg layers batches fp8 <<<"$spec"
  name=$cfg-$layers${fp8:+-fp8}
  M=/dev/shm/moec-prof-$name
  rm -rf /dev/shm/moec-prof-*
  t0=$SECONDS
  gpu_sample_model "tests/data/configs/$cfg.json" "$layers" "$M" "$fp8" >"$LOGS/$name.sample.txt" 2>&1 ||
    { tail "$LOGS/$name.sample.txt"; continue; }
  build-gpu/moec bench "$M" --batch-sizes "$batches" --context "${CONTEXT:-1024}" --profile --json \
    >"$LOGS/$name.jsonl" 2>"$LOGS/$name.err" || tail -20 "$LOGS/$name.err"
  echo "== $name (batches $batches, $((SECONDS - t0)) s)"
  python3 - "$LOGS/$name.jsonl" "$LOGS/$name.err" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"  batch {r['batch']} {r['mode']}: {r['ms']:.3f} ms, floor {r.get('floor_ms', 0):.3f}")
batch, rows = None, []
def dump():
    if batch is not None:
        tot = sum(r[0] for r in rows)
        print(f"  profile batch {batch}: {len(rows)} kernels, {tot:.3f} ms summed; top:")
        for r in sorted(rows, reverse=True)[:14]:
            print(f"    {r[0]:8.3f} ms {r[1]}")
for line in open(sys.argv[2]):
    if line.startswith("profile: batch"):
        dump(); batch, rows = int(line.split()[2]), []
        continue
    p = line.split()
    if batch is not None and len(p) >= 5:
        try:
            rows.append((float(p[0]), f"{int(p[2]):4d} x {float(p[3]):7.2f} us  " + " ".join(p[4:])))
        except ValueError:
            pass
dump()
PY
done
rm -rf /dev/shm/moec-prof-*
