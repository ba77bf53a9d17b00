#!/usr/bin/env bash
# gpu_ncu_kernel.sh — why one kernel runs below the floor: Nsight Compute's
# full report (--set full: throughput, memory, occupancy, warp stalls,
# source counters) of the first launch of each kernel named in KERNELS
# (regexes, one report each, e.g. KERNELS="mla_attn moe_down") in a decode
# step of PROFILE (CONFIG:LAYERS:BATCH[:fp8] as in gpu_ncu.sh: a model of
# tests/data/configs/CONFIG.json with random weights, cut to LAYERS layers,
# written under /dev/shm; BATCH sequences at CONTEXT, default 1024).
#   usage: PROFILE=deepseek_v2_lite:2:64 KERNELS="mla_attn moe_down" \
#          scripts/gpu_ncu_kernel.sh     (on the GPU machine)
#   STALLS=1 adds a second pass per kernel: every warp-stall reason's
#   cycles per issued instruction (NAME.stalls.txt), e.g. to tell a kernel
#   waiting on memory from one waiting on its instructions' fetch.
#   LEAN=1 instead runs Nsight Compute once over the first launch of each
#   kernel of KERNELS (one regex of them all, LAUNCHES launches, default 8)
#   with a few metrics only (time, instructions, registers, grid, DRAM and
#   L2 bytes, every stall reason): lean.csv, and lean.txt a line a launch.
#   SOURCE=1 instead takes, for each kernel of KERNELS, its first launch's
#   source counters (warp stall samples and instructions executed at each
#   SASS instruction): NAME.ncu-rep and NAME.sass.csv (ncu --page source).
#   leaves $OUT/ncu_kernel.tar.gz: per kernel its report (NAME.txt)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh
gpu_logs ncu_kernel
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt"; exit 1; }
IFS=: read -r cfg layers batch fp8 <<<"${PROFILE:-deepseek_v2_lite:2:64}"
M=/dev/shm/moec-ncuk
rm -rf "$M"
gpu_sample_model "tests/data/configs/$cfg.json" "$layers" "$M" "$fp8" >"$LOGS/sample.txt" 2>&1 ||
  { tail "$LOGS/sample.txt"; exit 1; }
if [ "${SOURCE:-0}" = 1 ]; then
  for k in ${KERNELS:-mla_attn moe_down}; do
    timeout "${NCU_S:-180}" "$NCU" --clock-control none --kernel-name "regex:$k" --launch-count 1 \
      --section SourceCounters --section WarpStateStats --section LaunchStats -o "$LOGS/$k" -f \
      build-gpu/moec bench "$M" --batch-sizes "$batch" --context "${CONTEXT:-1024}" --steps 1 \
      --warmup 0 >"$LOGS/$k.log" 2>&1 || echo "ncu source on $k: exit $?"
    "$NCU" -i "$LOGS/$k.ncu-rep" --page source --csv --print-source sass >"$LOGS/$k.sass.csv" 2>&1 ||
      echo "ncu source page of $k: exit $?"
    echo "== $k: $(wc -l <"$LOGS/$k.sass.csv") SASS lines"
  done
  rm -rf "$M"
  exit 0
fi
if [ "${LEAN:-0}" = 1 ]; then
  re=$(echo ${KERNELS:-mla_attn moe_down} | tr ' ' '|')
  timeout "${NCU_S:-300}" "$NCU" --clock-control none --kernel-name "regex:$re" \
    --launch-count "${LAUNCHES:-8}" --csv --page raw --print-units base \
    --metrics 'regex:^(smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|smsp__inst_executed\.sum|gpu__time_duration\.sum|launch__registers_per_thread|launch__grid_size|launch__block_size|dram__bytes_read\.sum|lts__t_bytes\.sum|sm__warps_active\.avg\.pct_of_peak_sustained_active)$' \
    build-gpu/moec bench "$M" --batch-sizes "$batch" --context "${CONTEXT:-1024}" --steps 1 \
    --warmup 0 >"$LOGS/lean.raw" 2>&1 || echo "ncu lean: exit $?"
  grep '^"' "$LOGS/lean.raw" >"$LOGS/lean.csv"
  python3 - "$LOGS/lean.csv" <<'PY' | tee "$LOGS/lean.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3:
    sys.exit("no rows")
head = rows[0]
col = {h: i for i, h in enumerate(head)}
def g(r, m):
    i = col.get(m)
    return r[i] if i is not None else ""
for r in rows[2:]:
    name = g(r, "Kernel Name")[:60]
    print(f"{name}: {g(r, 'gpu__time_duration.sum')} ns, grid {g(r, 'launch__grid_size')} x "
          f"{g(r, 'launch__block_size')}, regs {g(r, 'launch__registers_per_thread')}, "
          f"inst {g(r, 'smsp__inst_executed.sum')}, dram {g(r, 'dram__bytes_read.sum')} B, "
          f"l2 {g(r, 'lts__t_bytes.sum')} B, warps active {g(r, 'sm__warps_active.avg.pct_of_peak_sustained_active')}%")
    st = []
    for h, i in col.items():
        if "stalled_" in h:
            try:
                v = float(r[i].replace(",", ""))
            except ValueError:
                continue
            if v >= 0.3:
                st.append((v, h.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", "")))
    print("   stalls (cycles an instruction): " + ", ".join(f"{n} {v:.2f}" for v, n in sorted(st, reverse=True)))
PY
  rm -rf "$M"
  exit 0
fi
for k in ${KERNELS:-mla_attn moe_down}; do
  t0=$SECONDS
  timeout "${NCU_S:-180}" "$NCU" --set full --clock-control none --kernel-name "regex:$k" \
    --launch-count 1 --print-units base \
    build-gpu/moec bench "$M" --batch-sizes "$batch" --context "${CONTEXT:-1024}" --steps 1 \
    --warmup 0 >"$LOGS/$k.txt" 2>&1 || echo "ncu on $k: exit $?"
  echo "== $k ($((SECONDS - t0)) s)"
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|L2 Hit|Compute \(SM\)" \
    "$LOGS/$k.txt" | head -30
  if [ "${STALLS:-0}" = 1 ]; then
    timeout "${NCU_S:-180}" "$NCU" --clock-control none --kernel-name "regex:$k" --launch-count 1 \
      --metrics 'regex:^(smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|smsp__inst_executed\.sum|gpu__time_duration\.sum)$' \
      --print-units base build-gpu/moec bench "$M" --batch-sizes "$batch" --context "${CONTEXT:-1024}" \
      --steps 1 --warmup 0 >"$LOGS/$k.stalls.txt" 2>&1 || echo "ncu stalls on $k: exit $?"
    # the stall reasons above 0.5 cycles an instruction, largest first
    grep -E "stalled_|inst_executed|time_duration" "$LOGS/$k.stalls.txt" |
      awk '{v=$NF; gsub(",","",v); if ($1 !~ /stalled/ || v+0 >= 0.5) print}' | sort -k3 -g -r | head -14
  fi
done
rm -rf "$M"
