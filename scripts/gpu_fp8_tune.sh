#!/usr/bin/env bash
# gpu_fp8_tune.sh — the fp8 kernels before and after the staged ones
# (codegen/fp8_tc.c), kernel by kernel, on the GPU machine: tests/gpu_kernels
# with MOEC_KERN_FP8 and MOEC_KERN_BENCH runs DeepSeek-V2-Lite's fp8 linears
# (qkv_a, o_proj, shared gate_up and down, dense gate and down) and experts,
# Qwen3-30B's and DeepSeek-V3's experts at T = 1, 3, 8, 32, 64, 128 with
# MOEC_FP8_KERNEL=old and =tc, checks every result against the interpreter
# and times every step (mean of 20 launches); then the same under each
# variant of the staged kernels' shape knobs. Leaves $OUT/fp8_tune.txt (the
# timing and check lines, then per shape and bucket the old and the staged
# time and their ratio) and every log in $OUT/fp8_tune.tar.gz.
#   usage: scripts/gpu_fp8_tune.sh ["NAME:ENV=V[,ENV=V]" ...]
#   e.g.   scripts/gpu_fp8_tune.sh "w8:MOEC_FP8_TC_WARPS=8" "u4:MOEC_FP8_TC_U=4"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-tune}
LOGS=$(mktemp -d)/fp8_tune
mkdir -p "$OUT" "$LOGS"
LOG=$OUT/fp8_tune.txt
: >"$LOG"
finish() {
  tar czf "$OUT/fp8_tune.tar.gz" -C "$(dirname "$LOGS")" fp8_tune
  cat "$LOG"
  exit "$1"
}
source scripts/gpu_build.sh
gpu_build >"$LOGS/build.txt" 2>&1 || { tail -30 "$LOGS/build.txt" >>"$LOG"; finish 1; }
rc=0
run() { # LABEL ENV...
  local label=$1; shift
  echo "== $label" >>"$LOG"
  env MOEC_KERN_FP8=1 MOEC_KERN_BENCH=1 "$@" build-gpu/tests/gpu_kernels >"$LOGS/$label.txt" 2>&1 || rc=1
  grep -E "bench |worst error|e4m3|passed|failed|FAIL|check failed" "$LOGS/$label.txt" >>"$LOG"
}
run default
for v in "$@"; do
  name=${v%%:*}
  venv=${v#*:}
  # shellcheck disable=SC2086
  run "$name" ${venv//,/ }
done
# per shape and bucket: the old kernels' total against the staged ones'
python3 - "$LOG" >>"$LOG" <<'PY'
import re, sys
label, tot = None, {}
for line in open(sys.argv[1]):
    if line.startswith("== "):
        label = line[3:].strip()
    m = re.match(r"\s*bench (\S+) T=(\d+) (\w+)\s+total ([\d.]+) us, (\d+) GB/s", line)
    if m:
        name, t, mode, us, gbs = m.groups()
        tot[(label, name, int(t), mode)] = (float(us), int(gbs))
print("\n== summary: total us of the shape's steps (GB/s of weights), old / staged")
print(f"{'variant':10} {'shape':20} {'T':>4} {'old us':>10} {'tc us':>10} {'tc/old':>7}")
for (lab, name, t, mode) in sorted(tot):
    if mode != "tc":
        continue
    new = tot[(lab, name, t, "tc")]
    old = tot.get((lab, name, t, "old"))
    o = f"{old[0]:7.1f} ({old[1]:4d})" if old else "-"
    r = f"{new[0] / old[0]:7.2f}" if old else "-"
    print(f"{lab:10} {name:20} {t:4d} {o:>16} {new[0]:7.1f} ({new[1]:4d}) {r}")
PY
finish $rc
