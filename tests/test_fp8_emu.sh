#!/usr/bin/env bash
# test_fp8_emu.sh — the staged fp8 kernels (codegen/fp8_tc.c), the few-token
# fp8 linear (codegen/linear.c) and the
# streaming, tile-streaming and tensor-core expert GEMMs (codegen/moe_routed.c)
# run without a GPU: fp8_emu_gen writes their generated source for a set of odd cases
# (tests/fp8_emu_gen.c), which compiles as C++ with the CPU emulation of
# the CUDA they use (tests/cuda_emu.h) and the harness that checks them
# against a double-precision reference (tests/fp8_emu.cc): once under the
# address sanitizer, every case (every global and shared memory access in
# bounds, every cp.async and 16-byte load aligned and its bytes landed only
# once a wait covers it, every L2 prefetch
# within the weights), once under the thread
# sanitizer, the 46 cases that take at most a second or two there (no two
# threads' accesses unordered by a barrier: what racecheck would say;
# every kernel form, the linears' clusters among them; all 85 take over
# three minutes); first, that the thread sanitizer reports a missing
# barrier there at all (tests/emu_race.cc). Needs a C++17 compiler with
# both sanitizers (g++:
# scripts/install_deps.sh).
set -u
source "${MOEC_SOURCE_DIR:-$(dirname "$0")/..}/tests/lib.sh"
source "${MOEC_SOURCE_DIR:-$(dirname "$0")/..}/tests/emu_lib.sh"
emu_race_check
emu_check fp8_emu 1,2,6,8,9,10,12,16,17,19,27,28,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,47,49,53,54,55,57,58,60,61,70,73,74,75,76,77,78,79,82,84
finish test_fp8_emu
