#!/usr/bin/env bash
# gpu_session.sh — one device call that does everything: scripts/gpu_check.sh
# (build, GPU tests, CLI goldens, memcheck) and then scripts/gpu_bench.sh (the
# DeepSeek-V2-Lite-shape benchmark with the PyTorch reference), each under a
# time limit, leaving $OUT/gpu_check.tar.gz, $OUT/bench.tar.gz and
# $OUT/summary.txt. CHECK_S / BENCH_S set the limits (seconds); SKIP_CHECK=1
# or SKIP_BENCH=1 leave a part out. Extra arguments go to gpu_bench.sh.
# GOLDENS="tests/data/A ..." first recomputes those goldens
# (scripts/gpu_goldens.sh; BF16_ONLY=1: only transformers' bf16 error);
# TRACE="tests/data/A ..." runs build-gpu/tests/bf16_trace on each (the bf16
# error op by op, GPU against the CPU) into $OUT/trace.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moec-gpu}
export OUT
mkdir -p "$OUT"
rc=0
if [ -n "${GOLDENS:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${GOLDENS_S:-180}" scripts/gpu_goldens.sh $GOLDENS >"$OUT/goldens.txt" 2>&1 || rc=1
  echo "goldens: $([ $rc = 0 ] && echo ok || echo FAILED) ($GOLDENS)" | tee -a "$OUT/summary.txt"
fi
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  timeout "${CHECK_S:-300}" scripts/gpu_check.sh || rc=1
fi
if [ -n "${TRACE:-}" ]; then
  source scripts/gpu_build.sh
  [ -x build-gpu/tests/bf16_trace ] || gpu_build >"$OUT/trace_build.txt" 2>&1
  for d in $TRACE; do
    timeout 120 build-gpu/tests/bf16_trace "$d" 8 >>"$OUT/trace.txt" 2>&1 || echo "trace $d: FAILED" >>"$OUT/summary.txt"
  done
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_S:-270}" scripts/gpu_bench.sh "$@" >"$OUT/bench_stdout.txt" 2>&1 || rc=1
  cat "$OUT/bench_stdout.txt" >>"$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
exit $rc
