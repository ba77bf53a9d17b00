#!/usr/bin/env bash
# test_attn_emu.sh — the GQA attention kernels over the paged cache
# (codegen/attention.c: the split attention and its merge kernel, with 1,
# 2, 4 and 8 lanes a position, MOEC_ATTN_LPP, the kernel's choice
# at run time, each token's count checked from the splits that hold
# positions, and the tensor cores' form, MOEC_ATTN_TC, tiles of 16
# positions each) run without a GPU:
# attn_emu_gen writes their generated source for a set of cases
# (tests/attn_emu_gen.c), which compiles as C++ with the CPU emulation of
# the CUDA they use (tests/cuda_emu.h) and the harness that checks them
# against a double-precision reference (tests/attn_emu.cc): once under the
# address sanitizer, every case (every global and shared memory access in
# bounds, every L2 prefetch within the pools), once under the thread
# sanitizer, every case too (no two threads' accesses unordered by a
# barrier: among them the fused prologue's, whose cache row is written by
# one warp and read by all after the block's barrier, and the MLA
# attention on tensor cores, tiles by bulk copies on mbarriers, split, and
# merged by the last block). The fused prologue's cases
# (MOEC_ATTN_FUSE_PROLOGUE=1) compare the one kernel with the two. The MLA
# cases (codegen/mla_attention.c's tensor-core kernel at tiny shapes, by
# bulk copies or cp.async, either softmax form, 8 or 16 warps, 2 or 3
# buffers, one or two column tiles a warp, the first tiles before the
# programmatic wait or after it, weights by 2^x or expf, and a prefill
# chunk and two sequences sharing a block, whose step's rows stay NaN
# until each block's wait) are checked against a double-precision
# reference.
# Needs a C++17 compiler with both sanitizers (g++: scripts/install_deps.sh).
set -u
source "${MOEC_SOURCE_DIR:-$(dirname "$0")/..}/tests/lib.sh"
source "${MOEC_SOURCE_DIR:-$(dirname "$0")/..}/tests/emu_lib.sh"
emu_check attn_emu all
finish test_attn_emu
