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
# sanitizer, five cases with the linears' clusters and both expert forms
# (no two threads' accesses unordered by a barrier: what racecheck would
# say; a thread a CUDA thread makes it slow). Needs a C++17 compiler with
# both sanitizers (g++: scripts/install_deps.sh).
set -u
source "${MOEC_SOURCE_DIR:-$(dirname "$0")/..}/tests/lib.sh"
source "${MOEC_SOURCE_DIR:-$(dirname "$0")/..}/tests/emu_lib.sh"
emu_check fp8_emu 9,16,17,31,38,45
finish test_fp8_emu
