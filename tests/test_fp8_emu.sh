#!/usr/bin/env bash
# test_fp8_emu.sh — the staged fp8 kernels (codegen/fp8_tc.c), the few-token
# fp8 linear (codegen/linear.c) and the
# streaming fp8 expert GEMMs (codegen/moe_routed.c) run without a GPU: fp8_emu_gen writes their generated source for a set of odd cases
# (tests/fp8_emu_gen.c), which compiles as C++ with the CPU emulation of
# the CUDA they use (tests/cuda_emu.h) and the harness that checks them
# against a double-precision reference (tests/fp8_emu.cc): once under the
# address sanitizer, every case (every global and shared memory access in
# bounds, every cp.async and 16-byte load aligned, every L2 prefetch
# within the weights), once under the thread
# sanitizer, three cases with the linear's clusters and both expert forms
# (no two threads' accesses unordered by a barrier: what racecheck would
# say; a thread a CUDA thread makes it slow). Needs a C++17 compiler with
# both sanitizers (g++: scripts/install_deps.sh).
set -u
source "${MOEC_SOURCE_DIR:-$(dirname "$0")/..}/tests/lib.sh"
S=${MOEC_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
B=${MOEC_BUILD_DIR:-$S/build}
CXX=${CXX:-c++}
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "SKIP: no C++ compiler ($CXX; run scripts/install_deps.sh)"; exit 0
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$B/tests/fp8_emu_gen" "$T/cases.inc" && ok || bad "fp8_emu_gen failed"
for san in address thread; do
  cases=
  [ $san = thread ] && cases=9,16,17
  if "$CXX" -std=c++17 -O1 -g -fsanitize=$san -fno-omit-frame-pointer -pthread -w \
      -DEMU_CASES="\"$T/cases.inc\"" -I"$S/tests" "$S/tests/fp8_emu.cc" -o "$T/emu_$san" \
      2>"$T/cxx_$san.txt"; then
    ok
  else
    bad "compiling the emulated kernels ($san): $(head -20 "$T/cxx_$san.txt")"
    continue
  fi
  ASAN_OPTIONS=detect_leaks=1 TSAN_OPTIONS=halt_on_error=1 "$T/emu_$san" $cases >"$T/run_$san.txt" 2>&1
  rc=$?
  grep -E "^(ok|FAIL)|fp8_emu:|Sanitizer" "$T/run_$san.txt" | sed "s/^/$san: /"
  [ $rc = 0 ] && grep -qE "^fp8_emu: ([0-9]+) of \1 cases passed" "$T/run_$san.txt" && ok ||
    bad "the emulated kernels under the $san sanitizer (exit $rc): $(tail -30 "$T/run_$san.txt")"
done
finish test_fp8_emu
