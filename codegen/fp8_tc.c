/* fp8_tc.c — fp8 weights on tensor cores with the activations staged in
 * shared memory (fp8_tc.h): the dense linear and the routed experts'
 * gate_up and down GEMMs.
 *
 * Why: the first tensor-core fp8 kernels (linear.c's emit_fp8_mma,
 * moe_routed.c's tensor-core form) give every 16 weight rows their own
 * block or warp, which reads its tokens' activations from L2 again: at
 * 32 to 64 tokens that is more bytes than the fp8 weights themselves (h of
 * the down GEMM, f32, twice the weights at 8 slots). And they widen codes
 * with three conversions a pair (e4m3 to f16, to f32, to bf16). (The
 * programming guide's table gives an SM 16 conversions a cycle; measured
 * on an H200, bench/widen_probe.cu, the e4m3-pair-to-f16-pair conversion
 * alone runs about 30 a cycle, the integer form below widens 27 codes a
 * cycle, and an SM's share of the memory brings about 16.) Here a block
 * copies its tokens' x (or h, kept bf16 for these kernels) into shared
 * memory once (cp.async, 16 bytes a copy) and its warps stream 16 to 32
 * weight rows each, U 64-wide chunks of 16-byte loads in flight per lane;
 * codes widen with integer and bf16x2
 * operations (moec_e4m3x4_bf16) and each chunk's products are added times
 * its block scale (moec_tc_chunk). The dense linear splits K over up to
 * 8 blocks where its rows alone make too few blocks for the GPU (264: two
 * per H100 SM), the blocks of a row slab one thread block cluster (sm_90)
 * whose blocks add their partial sums up in distributed shared memory: no
 * second launch, no scratch.
 *
 * MOEC_FP8_TC_WARPS (warps a block), MOEC_FP8_TC_RT (16-row tiles a warp,
 * the linear's and down's), MOEC_FP8_TC_U (chunks in flight),
 * MOEC_FP8_TC_SPLIT (the linear's K splits) and MOEC_FP8_TC_TG (the
 * linear's most tokens a block) override the shapes for tuning
 * (scripts/gpu_fp8_tune.sh); kernel names say which ran. */
#include "codegen/fp8_tc.h"

#include <stdio.h>

#include "err.h"

#define TC_WARPS 4
/* blocks that fill an H100 twice (132 SMs) */
#define TC_BLOCKS 264
/* the linear's K splits at most: a portable cluster */
#define TC_SPLIT_MAX 8
/* the share of TC_BLOCKS (%) that clusters of more than 2 blocks may take
 * where two blocks fit an SM (MOEC_FP8_TC_FIT; 0: no bound) */
#define TC_FIT 85
/* 64-wide chunks in flight a lane, whatever the tiles, in the experts'
 * kernels and the linear's groups of 32 tokens and more, TC_HALVES_U from
 * TC_HALVES_T tokens (MOEC_FP8_TC_U; 0:
 * the rule by kernel, 4 over the tiles, the experts' gate_up 2 past 16
 * slots a block). (H200, 2026-11-29, V2-Lite in fp8 at context 1024, 6
 * everywhere against the rule in the same call, two calls: 6.332 / 6.465
 * and 6.319 / 6.439 ms at batch 32, 7.554 / 7.608 and 7.498 / 7.583 at 64;
 * but 4.418 / 4.365 at 8, where only the linears, groups of 8 tokens, take
 * these kernels: they keep the rule; with that, 4.994 / 5.219 at 16. 8
 * was slower, 7.053 at 32 and 8.721 at 64. The experts at 8 and 16
 * tokens, once they took these kernels from two slots a block: 4 in
 * flight 4.062 / 5.336 against 3.857 / 5.035 with 6, Qwen3-30B cut to 16
 * layers at 16 tokens 2.950 against 2.880.) bf16 weights keep the rule
 * (twice the bytes a chunk). Fewer registers for more blocks an SM spill
 * these chunks: at 64 tokens gate_up runs 161 registers a thread, 17% of
 * the warp slots active, down 96 and 28% (Nsight Compute), and bounding
 * gate_up to 4 blocks an SM (__launch_bounds__(128, 4)) took the step at
 * 32 / 64 tokens to 7.794 / 9.425 ms against 5.844 / 7.207, and down
 * bounded to 6 to 6.206 / 7.686 (H200, 2026-11-29; the knobs are in
 * history at 1bee9ac). */
#define TC_U 6

/* Measured and taken out (H200, 2026-11-29, fp8 V2-Lite at context 1024):
 * - codes widened to f16 by the conversion unit (one conversion a pair
 *   instead of about 5 integer and bf16x2 operations), x staged as f16
 *   rows each scaled by a power of two (exact from 2^-29 of the row's
 *   largest magnitude, no overflow), f16 products: the experts level, ms a
 *   step at 8 / 32 / 64 tokens 3.728 / 5.893 / 7.246 against 3.731 /
 *   5.828 / 7.227, in the timeline at 64 gate_up 111.0 against 110.1 us a
 *   layer and down 64.0 against 63.5; the experts' and the linears'
 *   kernels both so, 6.090 / 7.832 at 32 / 64. So the experts' kernels do
 *   not wait on issue: their instructions went from about 2.5 a code for
 *   the widening to 0.5 and nothing moved. Kept in history at aa511ef
 *   (MOEC_FP8_TC_XF16), with its emulator cases (x rows 2^-30 to 2^24)
 *   and the check of the f16 widening of all 256 codes. Measured again
 *   with the rows made f16 all at once (G lanes a row, every row in
 *   flight; a warp a row in turn before) once bench/widen_probe.cu had
 *   an H200 SM widen 61 codes a cycle by the conversion unit against 27
 *   by the integer and bf16x2 operations (the HBM brings about 16): ms a
 *   step at 8 / 32 / 64 tokens, the experts so 3.564 / 5.507 / 6.670, the
 *   linears 3.604 / 5.508 / 6.710, both 3.574 / 5.559 / 6.827, against
 *   3.592 / 5.492 / 6.563 (H200, 2026-11-30; gpu_kernels' fp8 part
 *   passed; history at fe3f2ab). Fewer instructions do not make these
 *   kernels faster.
 * - the timeline at 64 tokens with 2 warps a block: gate_up 175.7 us, down
 *   106.3; 8 warps: 144.7 and 68.3; weights in fragment tiles 120.0 and
 *   58.7.
 * - down's blocks prefetching their rows into L2 before the wait (the
 *   blocks the GPU places during gate_up's last wave): 5.934 / 7.345 ms at
 *   32 / 64 against 5.769 / 7.137. History at 9d42f8f (MOEC_FP8_TC_DN_PF).
 * - each chunk's block scale folded into its widened codes (bf16 of the
 *   scale times 2^120 as the widening's multiplier), the products added
 *   straight into the sums: no products from zero and no multiply-add of
 *   them, 64 fewer registers. At 64 tokens the linear's instructions are
 *   about 575 a warp and chunk for 64 products (Nsight Compute, the dense
 *   down: 12.3 thousand a warp at 4.4 cycles each, one warp a scheduler);
 *   this took 128 of them off. fp8 V2-Lite at 8 / 32 / 64 tokens: 3.692 /
 *   5.684 / 6.915 ms with the linears so, 3.803 / 5.900 / 7.087 with the
 *   experts too, against 3.679 / 5.696 / 6.963 (H200, 2026-11-30). The
 *   weights rounded to bf16 twice (the scale, then the product) tripled
 *   the emulator's worst row errors (0.0105 against 0.0036). History at
 *   d42bb90 (MOEC_FP8_TC_WS).
 * - x quantized to e4m3 as the linear stages it (one scale a token and
 *   128-wide block, amax / 448, as vLLM runs `activation_scheme: dynamic`)
 *   and the products on mma.sync's e4m3 form (m16n8k32): sm_90 emulates
 *   it. ptxas gave o_proj's kernel at 64 tokens the same 256 HMMA as the
 *   bf16 form plus 407 F2FP and 563 FADD (3920 SASS instructions against
 *   3000), and the linears ran about 40% slower in V2-Lite's 4-layer
 *   timeline (q_proj with kv_a 18.7 against 13.1 us, o_proj 11.7 against
 *   8.4). On Hopper only wgmma multiplies e4m3 as it is (H200,
 *   2026-11-30; history at 91eefe3, MOEC_FP8_TC_AQ). cuBLASLt's
 *   block-scaled fp8 (bench/fp8_lt_probe.py, torch's _scaled_mm) was
 *   slower than bf16 for V2-Lite's linears but the dense gate_up.
 * - the experts' down or gate_up alone at 6 or 8 chunks in flight
 *   (MOEC_FP8_TC_DN_U, _GU_U; down at 8: 123 registers against 69, so
 *   as many bytes in flight an SM): fp8 V2-Lite at 32 / 64 tokens 5.679
 *   to 5.698 / 6.982 to 7.059 ms against 5.672 / 6.918 (H200,
 *   2026-11-30; history at 6ba915a).
 * - down on the tensor-core form bf16's down runs (codegen/moe_routed.c:
 *   a warp a 16-row tile, h read from L2 by every warp, no staging) after
 *   this file's gate_up, since at 64 tokens the staged down streamed its
 *   184.5 MB at 2.7 TB/s a layer against gate_up's 3.7 and bf16's down's
 *   3.9 (the kernel timeline, 4 layers): gpu_kernels' fp8 part (450 of
 *   450) and gpu_model passed, but fp8 V2-Lite at 8 / 32 / 64 tokens
 *   3.855 / 5.875 / 7.081 ms against 3.627 / 5.571 / 6.648, with 8 chunks
 *   in flight 4.532 / 6.851 / 8.392 (H200, 2026-12-01; history at
 *   22af4f2, MOEC_FP8_TC_DOWN).
 * - down over several slabs of rows a block (SPB: the block stages its
 *   slots' h once, then runs SPB slabs of 64 rows in turn; fewer,
 *   longer-lived blocks, as many warps an SM): gpu_kernels' fp8 part (450
 *   of 450, 3 slabs) and gpu_model passed, but fp8 V2-Lite at 8 / 32 / 64
 *   tokens 3.664 / 5.763 / 6.763 ms with 2 slabs, 4.286 / 5.691 / 6.732
 *   with 4, against 3.592 / 5.502 / 6.590 (H200, 2026-12-01; history at
 *   a587fca, MOEC_FP8_TC_DN_SPB, with its emulator cases). So neither the
 *   staging of h nor the blocks' count is what holds down at 2.7 TB/s.
 * - the side stream's staged linears (the shared expert, which at 64
 *   tokens runs beside the routed down: 220 blocks of 255-register
 *   threads at 5 K splits) at fewer or other splits, so that the routed
 *   blocks keep more of the registers: fp8 V2-Lite at 32 / 64 tokens
 *   5.610 / 6.723 ms at 1 split (2 at 64, where x needs 2), 5.524 / 6.763
 *   at 3, against 5.569 / 6.613 (H200, 2026-12-01; history at 53a43ea,
 *   MOEC_FP8_TC_SIDE_SPLIT).
 * - down bounded to 8 blocks an SM (__launch_bounds__(128, 8): 64
 *   registers, where ptxas gives it 69 and 7 blocks fit), since Nsight
 *   Compute had its warps waiting twice gate_up's cycles on their loads:
 *   fp8 V2-Lite at 32 / 64 tokens 7.087 / 6.945 ms against 5.586 / 6.623
 *   (H200, 2026-12-01; at 32 tokens down takes 6 chunks in flight, which
 *   64 registers cannot hold). History at 1ba80ca (MOEC_FP8_TC_DN_MINB).
 * - down started per expert block (a counter a block of slots that each
 *   gate_up warp raises once its h is written, zeroed by the align; down's
 *   blocks, launched once every gate_up block had begun, waited on their
 *   own counter instead of for the whole grid): gpu_kernels' fp8 part
 *   passed (450 of 450), but fp8 V2-Lite at 8 / 32 / 64 tokens 3.709 /
 *   5.767 / 7.026 ms against 3.716 / 5.761 / 6.981 (H200, 2026-11-30;
 *   history at 5687c89, MOEC_MOE_EARLY_DOWN). Gate_up's last wave does
 *   not leave the DRAM idle: down's early blocks only share it.
 * - the q/kv projection's trigger at its end (the wait alone after its
 *   first loads), so that the MLA prologue behind it is a programmatic
 *   dependent again, not a plain launch: 5.689 / 6.881 ms at 32 / 64
 *   tokens against 5.697 / 6.879; every fp8 staged linear so 5.717 /
 *   6.902 (H200, 2026-11-30; history at 7023c9b, MOEC_FP8_TC_LATE).
 * - the linear's products on sm_90a's warpgroup MMA (wgmma m64nTGk16, A the
 *   widened codes in registers, x by descriptor from shared memory staged
 *   in the widening's k order as unswizzled core matrices; a plan for
 *   sm_90a): gpu_kernels' fp8 linears passed, but in V2-Lite's fp8 step at
 *   8 / 32 / 64 tokens a chunk at a time 3.758 / 5.880 / 7.197 ms against
 *   3.731 / 5.774 / 7.074, and pipelined (chunk k's products beside k - 1's
 *   scaling and k + 1's widening, one tile a warp) 3.788 / 6.060 / 7.840.
 *   In the kernel timeline at 64 every linear was slower (o_proj 9.5 and
 *   10.2-16.1 us against 8.4). Nsight Compute: the widening (LOP3, SHF,
 *   PRMT, HMUL2: about 3.6 instructions a code with the addressing) and
 *   the scale's FFMA, not the products, are most of a chunk's
 *   instructions; the MMA's 64 HMMA a chunk became 8 HGMMA and the
 *   kernels ran as many instructions as before (H200, 2026-11-30).
 *   History at 5b6f238 (MOEC_FP8_TC_WG).
 * - the experts' tiles through a ring of bulk copies (TMA) a warp: lane 0
 *   issued one copy a tile and stage of CB chunks into the warp's NS
 *   stages, completing on the stage's mbarrier, the warp's lanes read the
 *   codes from shared memory (no weight registers in flight). fp8 V2-Lite
 *   at 8 / 32 / 64 tokens, gate_up so: 3.842 / 5.896 / 7.080 ms against
 *   3.626 / 5.571 / 6.640; down in tiles too (MOEC_FP8_TILES=5), 4 stages
 *   of 2 chunks 3.759 / 5.764 / 7.145, of 1 3.795 / 5.909 / 7.290, 8 of 1
 *   4.099 / 6.415 / 7.994, 2 of 4 3.719 / 5.686 / 6.963, against the
 *   register form over the same tiles 3.663 / 5.460 / 6.537 (H200,
 *   2026-11-30): the more stages, the slower, so a stage's wait and issue,
 *   not the bytes in flight, bound it. History at 14c4cf1
 *   (MOEC_FP8_TC_BULK, _NS, _CB; its emulator cases).
 * - the linears' chunks in flight alone (MOEC_FP8_TC_LIN_U), fp8 V2-Lite
 *   at 32 / 64 tokens: 2 5.484 / 6.600 ms, 3 5.503 / 6.559, 6 5.509 /
 *   6.590, against 4's 5.509 / 6.561 (H200, 2026-11-30): level, so at 64
 *   tokens their bytes in flight do not bound them either. History at
 *   354c08c.
 * - the weights in flight in a ring in shared memory, not in registers:
 *   each lane copied its own 16-byte pieces of a chunk into stage c % R
 *   of its warp's ring (cp.async, a group a chunk), read them back once
 *   the group landed and refilled the stage after the chunk's products.
 *   At 64 tokens ptxas gave the linears 168-200 registers and no spills
 *   (255 and spills before), gate_up 68 (127), down 54 (69); the
 *   emulator and gpu_kernels' fp8 part (450 of 450) passed. Yet every
 *   ring was slower, fp8 V2-Lite at 8 / 32 / 64 tokens: the linears' 4
 *   stages 4.082 / 5.762 / 6.884 ms, 6 stages 4.071 / 5.962 / 7.765,
 *   gate_up's 3 3.751 / 5.757 / 6.800, down's 4 3.721 / 5.629 / 6.745,
 *   against 3.592 / 5.504 / 6.572 (H200, 2026-11-30). As with the bulk
 *   copies above: more bytes in flight through shared memory, slower.
 *   History at b1ad730 (MOEC_FP8_TC_LIN_RING, _GU_RING, _DN_RING). */

/* The experts' down: 16-row tiles a warp. One tile holds a lane's U
 * chunks in half the registers of two, so that more warps fit an SM.
 * (H200, 2026-11-29, V2-Lite in fp8 at context 1024, down in the step
 * with one tile against two: 50.5 against 56.2 us a layer at 32 tokens,
 * 59.1 against 62.0 at 64.) */
#define TC_DN_RT 1

/* How the main loop refills the weight slots (TC_LOOP; MOEC_FP8_TC_ROLL):
 * 0, all U after the last one's products; 1, each as soon as it is used;
 * N from 2 (to 8), in N groups of ceil(U / N) slots: 2 by halves, 3 by
 * thirds. Nsight Compute at 64 tokens had gate_up's warps stalled mostly
 * on the first use of a round's loads (19% of the samples on its first
 * byte permute; 2.0 cycles an instruction on the long scoreboard),
 * hence 2. (H200, 2026-11-29, fp8 V2-Lite, the step at 32 / 64 tokens,
 * one call: 0 5.755 / 7.125 ms, 2 5.861 / 7.090, 2 with 4 chunks in
 * flight 5.800 / 7.037, 1 6.292 / 7.481; a second call, 2 with 4
 * against 0 with 6 at 64: 7.144 / 7.247; a third call, thirds with 6
 * 5.983 / 7.204 and halves with 5 6.053 / 7.315 against the default's
 * 5.848 / 7.156.) So from TC_HALVES_T tokens the
 * staged kernels refill by halves, those of fp8 weights with TC_HALVES_U
 * chunks in flight (tc_u; buckets past 64 not timed); below, TC_ROLL.
 * MOEC_FP8_TC_ROLL and MOEC_FP8_TC_U override both. */
#define TC_ROLL 0
#define TC_HALVES_T 64
#define TC_HALVES_U 4

/* Experts' weights in fragment tiles (ir_weight_tiled) refill by halves
 * at TC_HALVES_U in every bucket of the staged kernels: a warp's loads of
 * a chunk are 512 contiguous bytes there, not 64 of each of 8 rows.
 * (H200, 2026-11-30, fp8 V2-Lite at context 1024, the experts and linears
 * so with MOEC_FP8_TILES=1: 3.719 / 5.519 ms a step at 8 / 32 tokens
 * against 3.776 / 5.865 with the rows' rule, and 3.725 / 5.771 in rows.) */
static int tc_halves(const cg_ctx *c, int tl) { return tl || c->T >= TC_HALVES_T; }

/* the staged kernels' refill order (tl: the weights lie in tiles) */
static int tc_roll(const cg_ctx *c, int tl)
{
    return cg_env_int("MOEC_FP8_TC_ROLL", tc_halves(c, tl) ? 2 : TC_ROLL, 0, 8);
}

/* the staged kernels' chunks in flight by default (fp8 weights) */
static int tc_u(const cg_ctx *c, int tl) { return tc_halves(c, tl) ? TC_HALVES_U : TC_U; }

/* a kernel name's refill order: "", "_roll", "_roll2" .. "_roll8" */
static const char *roll_tag(int roll)
{
    static const char *const tags[] = {"",       "_roll",  "_roll2", "_roll3", "_roll4",
                                       "_roll5", "_roll6", "_roll7", "_roll8"};
    return tags[roll];
}

/* The main loop every staged kernel shares: TC_LOAD declares the
 * weights' registers and their loads, TC_LOOP runs the products. In scope:
 * W8 (fp8 codes and their block scales, else bf16 weights: the dense
 * linear's bf16 form), PRE (the first load went out before the
 * programmatic wait), the warp's RT tiles (live[r]: the tile has rows;
 * w0[r], w1[r]: this lane's rows g and g + 8 at k 16q; sr[r]: the tile's
 * row of block scales), chunks c0 .. c1 - 1, the staged rows xs (XS
 * elements apart, chunk c0 first) and the thread's lane coordinates g, q.
 * Each lane loads U chunks of its rows (16 bytes each in fp8, 32 in bf16)
 * and their scales, then runs their products while the other warps load;
 * the first loads go out before the wait for the staged rows. With ROLL
 * (MOEC_FP8_TC_ROLL=1, TC_ROLL) each slot's next chunk goes out as soon as
 * its products are taken, so that U - 1 chunks stay in flight, not 0 to U;
 * ROLL N from 2 refills the slots in N groups, each once its products are
 * taken (2: the first half, then the second).
 * Leaves acc[RT][NT][4] (moec_tc_chunk's fragments). */
static const char TC_LOAD[] =
    "    constexpr int LW = W8 ? 1 : 2; /* 16-byte loads a row a chunk */\n"
    "    uint4 wa[U][RT][2 * LW];\n"
    "    float sc[U][RT];\n"
    "    /* chunk c into slot u */\n"
    "    auto load_one = [&](int u, int c) {\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RT; r++) {\n"
    "            sc[u][r] = 0.0f;\n"
    "            if (live[r] && c < c1) {\n"
    "#pragma unroll\n"
    "                for (int h = 0; h < LW; h++) {\n"
    "                    wa[u][r][h] = moec_ldg16(w0[r] + (long long)c * CS + h * 8);\n"
    "                    wa[u][r][LW + h] = moec_ldg16(w1[r] + (long long)c * CS + h * 8);\n"
    "                }\n"
    "                if constexpr (W8)\n"
    "                    sc[u][r] = sr[r][(long long)c * 64 / SBK];\n"
    "            } else {\n"
    "#pragma unroll\n"
    "                for (int h = 0; h < 2 * LW; h++)\n"
    "                    wa[u][r][h] = make_uint4(0u, 0u, 0u, 0u);\n"
    "            }\n"
    "        }\n"
    "    };\n"
    "    auto load = [&](int cb) {\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++)\n"
    "            load_one(u, cb + u);\n"
    "    };\n";

static const char TC_LOOP[] =
    "    float acc[RT][NT][4];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RT; r++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < NT; t++)\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++)\n"
    "                acc[r][t][i] = 0.0f;\n"
    "    const __nv_bfloat16 *xl = xs + g * XS + q * 16;\n"
    "    if (!PRE && live[0])\n"
    "        load(c0);\n"
    "    moec_cp_wait();\n"
    "    __syncthreads();\n"
    "    if (live[0] && ROLL > 0) {\n"
    "        /* groups of GS slots: each group's products, then its refill */\n"
    "        constexpr int GS = ROLL > 1 ? (U + ROLL - 1) / ROLL : 1;\n"
    "        for (int cb = c0; cb < c1; cb += U) {\n"
    "#pragma unroll\n"
    "            for (int ga = 0; ga < U; ga += GS) {\n"
    "#pragma unroll\n"
    "                for (int u = ga; u < ga + GS && u < U; u++)\n"
    "                    if (cb + u < c1)\n"
    "                        moec_tc_chunk<RT, NT, XS>(acc, wa[u], sc[u], xl + (cb + u - c0) * 64);\n"
    "#pragma unroll\n"
    "                for (int u = ga; u < ga + GS && u < U; u++)\n"
    "                    if (cb + u + U < c1)\n"
    "                        load_one(u, cb + u + U);\n"
    "            }\n"
    "        }\n"
    "    } else if (live[0]) {\n"
    "        for (int cb = c0;;) {\n"
    "#pragma unroll\n"
    "            for (int u = 0; u < U; u++)\n"
    "                if (cb + u < c1)\n"
    "                    moec_tc_chunk<RT, NT, XS>(acc, wa[u], sc[u], xl + (cb + u - c0) * 64);\n"
    "            cb += U;\n"
    "            if (cb >= c1)\n"
    "                break;\n"
    "            load(cb);\n"
    "        }\n"
    "    }\n";

/* ---- the dense linear ---------------------------------------------------- */

/* A block: TG tokens (blockIdx.y's group), the BN rows of slab blockIdx.x /
 * S and chunks c0 .. c1 - 1 of K (split blockIdx.x % S): its warps' rows. */
static const char LINEAR_HEAD[] =
    "    extern __shared__ __align__(16) unsigned char moec_smem[];\n"
    "    __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(moec_smem);\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;\n"
    "    const int split = (int)(blockIdx.x % S);\n"
    "    const long long rb = blockIdx.x / S;\n"
    "    const int c0 = split * CH / S, c1 = (split + 1) * CH / S, t0 = blockIdx.y * TG;\n"
    "    /* this warp's RT tiles of 16 rows; rows past N read row N - 1 and are\n"
    "       never stored */\n"
    "    const long long n0 = rb * BN + warp * 16 * RT;\n"
    "    bool live[RT];\n"
    "    const TW *w0[RT], *w1[RT];\n"
    "    [[maybe_unused]] const float *sr[RT];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RT; r++) {\n"
    "        const long long a = n0 + 16 * r;\n"
    "        live[r] = a < N;\n"
    "        const long long ra = a + g < N ? a + g : N - 1, rc = a + g + 8 < N ? a + g + 8 : N - 1;\n"
    "        w0[r] = w + moec_woff<TL, K>(ra, q * 16);\n"
    "        w1[r] = w + moec_woff<TL, K>(rc, q * 16);\n"
    "        if constexpr (W8)\n"
    "            sr[r] = ws + (live[r] ? a : 0) / SBN * SC;\n"
    "    }\n";

/* PRE: the warp's first U chunks of weights, which do not depend on the
 * kernel before, loaded before the programmatic wait. */
static const char LINEAR_PRE[] = "    if (live[0])\n        load(c0);\n    moec_pdl_enter();\n";

/* x's tokens t0 .. t0 + TG - 1 (zeros past T) at chunks c0 .. c1 - 1 into
 * shared memory; with ACT, h = silu(gate) * up of x [T, 2K], rounded to
 * bf16 as the silu_mul kernel stores it, each thread's next HB pieces of
 * gate and up loaded before any is used (the loads' latency once a round,
 * not once a piece: the dense down's 1563 columns a split at 64 tokens
 * took 275 us a piece at a time, 2026-11-29). */
static const char LINEAR_STAGE[] =
    "    {\n"
    "        const int seg = (c1 - c0) * 8;\n"
    "        if constexpr (ACT) {\n"
    "            constexpr int HB = 4;\n"
    "            for (int i0 = threadIdx.x; i0 < TG * seg; i0 += HB * NW * 32) {\n"
    "                uint4 gv[HB], uv[HB];\n"
    "#pragma unroll\n"
    "                for (int b = 0; b < HB; b++) {\n"
    "                    const int i = i0 + b * NW * 32, r = i / seg, s = i - r * seg;\n"
    "                    gv[b] = uv[b] = make_uint4(0u, 0u, 0u, 0u);\n"
    "                    if (i < TG * seg && t0 + r < T) {\n"
    "                        const __nv_bfloat16 *p = x + (long long)(t0 + r) * 2 * K + c0 * 64 + s * 8;\n"
    "                        gv[b] = *reinterpret_cast<const uint4 *>(p);\n"
    "                        uv[b] = *reinterpret_cast<const uint4 *>(p + K);\n"
    "                    }\n"
    "                }\n"
    "#pragma unroll\n"
    "                for (int b = 0; b < HB; b++) {\n"
    "                    const int i = i0 + b * NW * 32, r = i / seg, s = i - r * seg;\n"
    "                    if (i < TG * seg)\n"
    "                        *reinterpret_cast<uint4 *>(xs + r * XS + s * 8) =\n"
    "                            t0 + r < T ? moec_silu_mul8(gv[b], uv[b]) : make_uint4(0u, 0u, 0u, 0u);\n"
    "                }\n"
    "            }\n"
    "        } else {\n"
    "            for (int i = threadIdx.x; i < TG * seg; i += NW * 32) {\n"
    "                const int r = i / seg, s = i - r * seg, tok = t0 + r;\n"
    "                moec_cp16(xs + r * XS + s * 8,\n"
    "                          x + (long long)(tok < T ? tok : 0) * K + c0 * 64 + s * 8, tok < T);\n"
    "            }\n"
    "        }\n"
    "    }\n";

/* Before the wait (cg_emit_prefetch): the slab's rows (fewer in the last
 * slab) and their block scales' rows, the S blocks of a cluster (its K
 * splits, which read every row's share of columns) a contiguous share of
 * the rows each: together what the cluster reads. */
static const char LINEAR_PREFETCH[] =
    "        const long long sp = blockIdx.x % S, a = (long long)(blockIdx.x / S) * BN;\n"
    "        const long long nr = N - a < BN ? N - a : BN, p0 = a + sp * nr / S, p1 = a + (sp + 1) * nr / S;\n"
    "        moec_prefetch_rows(w + p0 * K, p1 - p0, K * (long long)sizeof(TW), PF_CAP);\n"
    "        if constexpr (W8)\n"
    "            if (p1 > p0)\n"
    "                moec_prefetch_l2(ws + p0 / SBN * SC,\n"
    "                                 (unsigned long long)((p1 - 1) / SBN - p0 / SBN + 1) * SC * 4ull);\n";
/* fragment i of tile (r, t) of lane (g, q): row 16 r + g + 8 (i / 2), token
 * 8 t + 2 q + i % 2. One split writes y; S splits put their sums in their
 * shared memory, and each block of the cluster adds up a share of them. */
static const char LINEAR_TAIL[] =
    "    if constexpr (S == 1) {\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RT; r++)\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < NT; t++)\n"
    "#pragma unroll\n"
    "                for (int i = 0; i < 4; i++) {\n"
    "                    const long long row = n0 + 16 * r + g + 8 * (i >> 1);\n"
    "                    const int tok = t0 + 8 * t + 2 * q + (i & 1);\n"
    "                    if (row < N && tok < T) {\n"
    "                        float v = acc[r][t][i] * alpha;\n"
    "                        if constexpr (HAS_BIAS)\n"
    "                            v += ld(bias + row);\n"
    "                        st(y + (long long)tok * N + row, v);\n"
    "                    }\n"
    "                }\n"
    "    } else {\n"
    "        __syncthreads(); /* every warp is done with xs */\n"
    "        float *part = reinterpret_cast<float *>(moec_smem);\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RT; r++)\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < NT; t++)\n"
    "#pragma unroll\n"
    "                for (int i = 0; i < 4; i++)\n"
    "                    part[(((warp * RT + r) * NT + t) * 4 + i) * 32 + lane] = acc[r][t][i];\n"
    "        moec_cluster_sync();\n"
    "        __syncthreads(); /* the cluster barrier orders this block's part too; said\n"
    "                            again for tools that know only the block barrier */\n"
    "        /* this block's share: elements split, split + S, ... of NW * 32 each;\n"
    "           every remote read issued before the first sum */\n"
    "        constexpr int E = NW * RT * NT * 128, PER = (E + S * NW * 32 - 1) / (S * NW * 32);\n"
    "        float v[PER][S];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < PER; j++) {\n"
    "            const int idx = (j * S + split) * NW * 32 + threadIdx.x;\n"
    "#pragma unroll\n"
    "            for (int k = 0; k < S; k++)\n"
    "                v[j][k] = idx < E ? moec_ld_cluster(part + idx, (unsigned)k) : 0.0f;\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < PER; j++) {\n"
    "            const int idx = (j * S + split) * NW * 32 + threadIdx.x;\n"
    "            const int l = idx & 31, i = (idx >> 5) & 3, t = (idx >> 7) % NT, tile = (idx >> 7) / NT;\n"
    "            const long long row = rb * BN + 16 * tile + (l >> 2) + 8 * (i >> 1);\n"
    "            const int tok = t0 + 8 * t + 2 * (l & 3) + (i & 1);\n"
    "            if (idx < E && row < N && tok < T) {\n"
    "                float sum = 0.0f;\n"
    "#pragma unroll\n"
    "                for (int k = 0; k < S; k++)\n"
    "                    sum += v[j][k];\n"
    "                sum *= alpha;\n"
    "                if constexpr (HAS_BIAS)\n"
    "                    sum += ld(bias + row);\n"
    "                st(y + (long long)tok * N + row, sum);\n"
    "            }\n"
    "        }\n"
    "        moec_cluster_sync(); /* no block leaves while the others read it */\n"
    "    }\n";

typedef struct tc_shape {
    int tg, nw, rt, u, s;
    size_t smem;
} tc_shape;

/* The linear's shared memory: x's tg token rows over the most chunks a
 * split holds, 8 elements of padding (rows 16 bytes apart modulo 128: the
 * 16-byte fragment reads free of bank conflicts), or the partial sums. */
static size_t linear_smem(const tc_shape *sh, long long ch)
{
    long long per = (ch + sh->s - 1) / sh->s;
    size_t x = (size_t)sh->tg * (size_t)(per * 64 + 8) * 2;
    size_t part = sh->s > 1 ? (size_t)sh->nw * (size_t)sh->rt * (size_t)(sh->tg / 8) * 128 * 4 : 0;
    return x > part ? x : part;
}

/* The linear's shape for bucket T: tokens a group (up to 64), warps, tiles
 * a warp (two from 32 tokens, so that a warp's x fragments serve 32
 * rows; bf16 weights, twice the bytes a fragment of x serves, only where
 * the slabs of 32 rows a warp still fill the GPU twice over 8 splits),
 * chunks in flight (fp8 groups of 32 tokens and more: TC_U; else U times
 * RT 4, in bf16 twice fp8's bytes a chunk), and K splits
 * (on sm_90: up to 8, until the blocks fill the GPU twice and x fits);
 * fewer tokens a group while x does not fit. 0 when even 8 tokens do
 * not. nw warps a block. */
static int linear_shape_nw(const cg_ctx *c, long long N, long long K, int w8, int nw,
                           tc_shape *sh)
{
    int T = c->T, cluster = cg_arch_num(c->opt) >= 90;
    long long ch = K / 64;
    size_t max = cg_smem_max(c->opt);
    sh->nw = nw;
    /* MOEC_FP8_TC_TG (8 to 64, in eights): the most tokens a group, for A/B runs */
    int tgmax = cg_env_int("MOEC_FP8_TC_TG", 64, 8, 64) / 8 * 8;
    sh->tg = T >= tgmax ? tgmax : (T + 7) / 8 * 8;
    sh->rt = cg_env_int("MOEC_FP8_TC_RT", 0, 0, 2);
    if (!sh->rt)
        sh->rt = sh->tg >= 32 && (w8 || (N + 32LL * sh->nw - 1) / (32LL * sh->nw) * TC_SPLIT_MAX >=
                                               TC_BLOCKS)
                     ? 2
                     : 1;
    sh->u = w8 ? cg_env_int("MOEC_FP8_TC_U", sh->tg >= 32 ? tc_u(c, 0) : 0, 0, 8) : 0;
    if (!sh->u)
        sh->u = 4 / sh->rt;
    int want = cg_env_int("MOEC_FP8_TC_SPLIT", 0, 0, TC_SPLIT_MAX);
    long long rows = 16LL * sh->rt * sh->nw, slabs = (N + rows - 1) / rows;
    for (;;) {
        long long groups = (T + sh->tg - 1) / sh->tg;
        int s = want;
        if (!s) {
            for (s = 1; s < TC_SPLIT_MAX && slabs * groups * s < TC_BLOCKS; s++)
                ;
            /* groups of 32 tokens and more hold two blocks an SM (170 to
               232 registers): a grid of more clusters than fit at once
               runs a second wave for its last few (H200, 2026-11-29,
               V2-Lite's shared gate_up at 32 tokens: 44 clusters of 6, 39
               at once, 16.7 us alone; 12.4 us in the step, 9.2 with 5
               splits; fp8 V2-Lite at 32 tokens 6.282 against 6.361 ms).
               At two blocks an SM an H100 holds (bench/
               cluster_fit.cu, 2026-11-24) clusters of 2 in all 264 block
               slots, of 3 in 237, 4: 248, 5: 235, 6: 234, 7: 224, 8: 240
               (how GPCs are laid out varies from chip to chip): clusters
               of more than 2 take at most fit% of TC_BLOCKS, fewer splits
               where more would not, as long as that leaves 3/4 of
               TC_BLOCKS (V2-Lite's dense gate at 64 tokens: 344 blocks of
               4 splits 24 us, 172 of 2 38 us in the step). */
            int fit = cg_env_int("MOEC_FP8_TC_FIT", TC_FIT, 0, 100), f = s;
            while (cluster && fit && sh->tg >= 32 && f > 2 &&
                   slabs * groups * f > fit * TC_BLOCKS / 100)
                f--;
            if (slabs * groups * f >= TC_BLOCKS * 3 / 4)
                s = f;
        }
        sh->s = !cluster ? 1 : s > ch ? (int)ch : s;
        while (cluster && sh->s < TC_SPLIT_MAX && sh->s < ch && linear_smem(sh, ch) > max)
            sh->s++;
        sh->smem = linear_smem(sh, ch);
        if (sh->smem <= max)
            return 1;
        if (sh->tg <= 8)
            return 0;
        sh->tg /= 2;
    }
}

/* a shape's grid: its slabs' K splits by its token groups */
static void linear_grid(const cg_ctx *c, long long N, const tc_shape *sh, long long g[2])
{
    long long rows = 16LL * sh->rt * sh->nw;
    g[0] = (N + rows - 1) / rows * sh->s;
    g[1] = (c->T + sh->tg - 1) / sh->tg;
}

/* a shape's blocks */
static long long linear_blocks(const cg_ctx *c, long long N, const tc_shape *sh)
{
    long long g[2];
    linear_grid(c, N, sh, g);
    return g[0] * g[1];
}

/* The linear's shape (linear_shape_nw) with MOEC_FP8_TC_WARPS warps a
 * block, else TC_WARPS, or in fp8 groups of 64 tokens 8 (a block an SM by
 * registers: 255 a thread) where that makes TC_FIT% of an SM a block (112
 * of 132) in one wave, or where TC_WARPS' blocks would run a second wave
 * at one block an SM (x's shared memory) and 8's would not; on the main
 * stream only (MOEC_FP8_TC_LIN_W8=0: never; 2: the side stream's too, as
 * first tried in bbbdb68). At 64 tokens a warp's chain of instructions bounds
 * these kernels, one or two warps a scheduler (Nsight Compute, H200,
 * 2026-11-30: V2-Lite's dense down 575 instructions a warp and chunk at
 * 4.4 cycles each); fp8 V2-Lite's 4-layer step in the timeline, 8 warps
 * against 4, us added a layer: q_proj with kv_a (120 blocks against 203)
 * 11.2 against 13.1, the dense down (64 in one wave against 128 in two)
 * 39.0 against 57.7, but o_proj (64 against 128: half the SMs) 10.2
 * against 8.4, which keeps 4. In the whole step at 64 tokens (H200,
 * 2026-11-30, fp8 V2-Lite, one call, in this order): the main stream's
 * 6.975 ms, never 7.049, the side stream's too 7.098, the main stream's
 * 6.969, never 7.050. The side stream's shared gate_up (5632 rows) at 8
 * warps, a block of 255-register threads a whole SM, runs beside the
 * routed experts: bbbdb68 had it so and was slower in the step (7.104
 * against 7.030). The dense gate and up (215 blocks at 8 warps, two
 * waves) took 8 in that call and were level in the timeline (29.7
 * against 29.4 us); Qwen3-30B's q/k/v (160 blocks at 8) took 8 under
 * bbbdb68, whose step was slower there too (2.282 against 2.269 ms, 8
 * layers at 64 tokens): both keep 4 by the one-wave bound, not timed
 * since. */
static int linear_shape(const cg_ctx *c, long long N, long long K, int w8, tc_shape *sh)
{
    int nw = cg_env_int("MOEC_FP8_TC_WARPS", 0, 1, 8);
    if (nw)
        return linear_shape_nw(c, N, K, w8, nw, sh);
    if (!linear_shape_nw(c, N, K, w8, TC_WARPS, sh))
        return 0;
    tc_shape s8;
    int rule = cg_env_int("MOEC_FP8_TC_LIN_W8", 1, 0, 2);
    if (w8 && sh->tg >= 64 && rule && (rule == 2 || c->stream == 0) &&
        linear_shape_nw(c, N, K, w8, 8, &s8)) {
        long long cap = TC_BLOCKS / 2 * TC_FIT / 100, b4 = linear_blocks(c, N, sh),
                  b8 = linear_blocks(c, N, &s8);
        int one_a_sm = sh->smem > cg_smem_max(c->opt) / 2;
        if ((b8 >= cap && b8 <= TC_BLOCKS / 2) || (one_a_sm && b4 > cap && b8 <= cap))
            *sh = s8;
    }
    return 1;
}

/* Whether the linear's weight takes the staged kernel: fp8 codes whose
 * scale blocks hold whole chunks and tiles, or bf16; with act, a bf16
 * compute dtype (h rounded as the silu_mul kernel stores it). */
static int linear_weight_fits(const cg_ctx *c, const ir_op *op)
{
    const ir_value *w = op->in[1];
    ir_dtype dw = cg_storage(c, w);
    if (ir_op_attr(op, "act") && c->opt->compute_dtype != IR_DTYPE_BF16)
        return 0;
    if (dw == IR_DTYPE_F8E4M3)
        return ir_block_scale_tiles(w);
    return dw == IR_DTYPE_BF16;
}

/* Whether the staged kernel takes op, and then its shape in *sh. */
static int tc_linear_shape(const cg_ctx *c, const ir_op *op, tc_shape *sh)
{
    const ir_value *x = op->in[0], *w = op->in[1];
    long long N = w->type.dims[0], K = w->type.dims[1];
    return cg_arch_num(c->opt) >= 80 && cg_storage(c, x) == IR_DTYPE_BF16 &&
           linear_weight_fits(c, op) && K % 64 == 0 &&
           linear_shape(c, N, K, cg_storage(c, w) == IR_DTYPE_F8E4M3, sh);
}

int cg_tc_linear_fits(const cg_ctx *c, const ir_op *op)
{
    tc_shape sh;
    return tc_linear_shape(c, op, &sh);
}

moec_status cg_tc_linear(cg_ctx *c, const ir_op *op, double alpha, const char *io,
                         const char *decl)
{
    const ir_value *w = op->in[1], *y = op->out[0];
    const ir_value *bias = op->n_in > 2 ? op->in[2] : NULL;
    long long N = w->type.dims[0], K = w->type.dims[1];
    int w8 = cg_storage(c, w) == IR_DTYPE_F8E4M3, act = ir_op_attr(op, "act") != NULL;
    tc_shape sh;
    if (!tc_linear_shape(c, op, &sh))
        return MOEC_ERR(MOEC_ERR_INTERNAL, "linear %%%s: the staged kernel does not fit",
                        y->name);
    ir_dtype dy = cg_storage(c, y), db = bias ? cg_storage(c, bias) : IR_DTYPE_F32;
    long long per = (K / 64 + sh.s - 1) / sh.s, pf = cg_prefetch_bytes(c);
    /* the first weights before the wait where no prefetch takes its place */
    int pre = pf <= 0 && cg_env_int("MOEC_LINEAR_TC_PRE", 1, 0, 1);
    char name[300], cluster[48] = "";
    /* weights in fragment tiles (ir_weight_tiled) keep the rows' refill
       rule: the experts' over tiles (by halves at TC_HALVES_U in every
       bucket) was level to slower for the linears (H200, 2026-11-30, fp8
       V2-Lite with the linears in tiles at 1 / 2 / 4 / 8 / 32 / 64 tokens:
       1.494 / 1.900 / 2.784 / 3.626 / 5.606 / 6.698 ms against 1.496 /
       1.901 / 2.781 / 3.619 / 5.579 / 6.695) */
    int roll = tc_roll(c, 0);
    snprintf(name, sizeof name, "linear_%s_n%lld_k%lld_t%d_tg%d_w%d_rt%d_s%d_u%d%s%s%s_%s_%s",
             w8 ? "f8tc" : "tc", N, K, c->T, sh.tg, sh.nw, sh.rt, sh.s, sh.u, pre ? "_pre" : "",
             roll_tag(roll), act ? "_silu" : "", w8 ? "f8e4m3" : "bf16", io);
    if (sh.s > 1)
        snprintf(cluster, sizeof cluster, "__cluster_dims__(%d, 1, 1) ", sh.s);
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    if (is_new) {
        const char *tw = w8 ? "__nv_fp8_e4m3" : "__nv_bfloat16";
        moec_buf_printf(
            &c->src,
            "// linear: y = alpha x w^T (+ b), %s w on tensor cores, x staged in shared memory "
            "(codegen/fp8_tc.c)\n"
            "extern \"C\" __global__ void %s__launch_bounds__(%d) %s(const __nv_bfloat16 "
            "*__restrict__ x, const %s *__restrict__ w, %sconst %s *__restrict__ bias, float "
            "alpha, %s *__restrict__ y)\n{\n"
            "    typedef %s TW;\n"
            "    constexpr long long N = %lldLL;\n"
            "    constexpr int K = %lld, T = %d, TG = %d, NT = TG / 8, NW = %d, RT = %d, S = %d, "
            "U = %d, CH = K / 64, XS = %lld, BN = 16 * RT * NW;\n"
            "    constexpr bool HAS_BIAS = %s, PRE = %s, ACT = %s;\n"
            "    constexpr int ROLL = %d;\n%s"
            "    constexpr int CS = TL ? 1024 : 64;\n",
            w8 ? "fp8" : "bf16", cluster, sh.nw * 32, name, tw,
            w8 ? "const float *__restrict__ ws, " : "", cg_ctype(db), cg_ctype(dy), tw, N, K, c->T,
            sh.tg, sh.nw, sh.rt, sh.s, sh.u, per * 64 + 8, bias ? "true" : "false",
            pre ? "true" : "false", act ? "true" : "false", roll, decl);
        cg_emit_prefetch(&c->src, pf, LINEAR_PREFETCH);
        moec_buf_printf(&c->src, "%s%s%s%s%s%s}\n\n", LINEAR_HEAD, TC_LOAD, pre ? LINEAR_PRE : "",
                        LINEAR_STAGE, TC_LOOP, LINEAR_TAIL);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    long long g[2];
    linear_grid(c, N, &sh, g);
    s->kernel = k;
    s->grid[0] = (unsigned)g[0];
    s->grid[1] = (unsigned)g[1];
    s->block[0] = (unsigned)sh.nw * 32;
    s->smem = (unsigned)sh.smem;
    cg_mma_linear_args(s, op, alpha, w8);
    return MOEC_OK;
}

void cg_mma_linear_args(ir_step *s, const ir_op *op, double alpha, int scales)
{
    const ir_value *w = op->in[1], *bias = op->n_in > 2 ? op->in[2] : NULL;
    int n = 0;
    s->args[n++] = cg_arg_act(op->in[0]);
    s->args[n++] = cg_arg_act(w);
    if (scales)
        s->args[n++] = cg_arg_scales(w);
    s->args[n++] = bias ? cg_arg_act(bias) : cg_arg_act(w); /* unread without a bias */
    s->args[n++] = cg_arg_f32(alpha);
    s->args[n++] = cg_arg_act(op->out[0]);
    s->n_args = n;
}

/* ---- the routed experts -------------------------------------------------- */

/* A block of either expert GEMM: expert block blockIdx.x (its expert e,
 * BM slots, padding -1) and the rows of its slots staged from row(slot)
 * (the kernel's lambda). The align writes every block's expert, -1 past
 * the count it used, so the expert alone says whether a block works (as
 * in codegen/moe_routed.c's heads): one load before the rows', not two. */
static const char EXPERT_HEAD[] =
    "    const int b = blockIdx.x;\n"
    "    (void)n_used;\n"
    "    const int e = blk_expert[b];\n"
    "    if (e < 0)\n"
    "        return;\n"
    "    extern __shared__ __align__(16) unsigned char moec_smem[];\n"
    "    __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(moec_smem);\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;\n"
    "    /* padding slots: zeros, nothing read */\n"
    "    for (int i = threadIdx.x; i < BM * CH * 8; i += NW * 32) {\n"
    "        const int m = i / (CH * 8), s = i - m * (CH * 8), sl = sorted[b * BM + m];\n"
    "        moec_cp16(xs + m * XS + s * 8, row(sl >= 0 ? sl : 0) + s * 8, sl >= 0);\n"
    "    }\n"
    "    constexpr int c0 = 0, c1 = CH;\n";

/* gate_up: NW warps of 16 rows of gate (tile 0) and the same 16 of up (tile 1) */
static const char GATE_UP_HEAD[] =
    "    auto row = [&](int sl) { return x + (long long)(sl / K) * KD; };\n"
    "%s"
    "    const int n0 = blockIdx.y * (NW * 16) + warp * 16, r0 = n0 < ND ? n0 : 0;\n"
    "    const bool live[RT] = {n0 < ND, n0 < ND};\n"
    "    const __nv_fp8_e4m3 *gb = wg + (long long)e * GSTRIDE;\n"
    "    const __nv_fp8_e4m3 *ub = wu + (long long)e * USTRIDE + UOFF;\n"
    "    const __nv_fp8_e4m3 *w0[RT] = {gb + moec_woff<TL, KD>(r0 + g, q * 16),\n"
    "                                   ub + moec_woff<TL, KD>(r0 + g, q * 16)};\n"
    "    const __nv_fp8_e4m3 *w1[RT] = {gb + moec_woff<TL, KD>(r0 + g + 8, q * 16),\n"
    "                                   ub + moec_woff<TL, KD>(r0 + g + 8, q * 16)};\n"
    "    const float *sr[RT] = {gsc + ((long long)e * SR + r0 / SBN) * SC,\n"
    "                           usc + ((long long)e * SR + (UROW + r0) / SBN) * SC};\n";

static const char GATE_UP_TAIL[] =
    "    if (!live[0])\n"
    "        return;\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NT; t++)\n"
    "        moec_silu_mul_frag(hbuf, sorted + b * BM + t * 8, ND, n0, acc[0][t], acc[1][t]);\n";

/* down: NW warps of RT tiles of 16 rows */
static const char DOWN_HEAD[] =
    "    auto row = [&](int sl) { return hbuf + (long long)sl * KD; };\n"
    "%s"
    "    const int n0 = blockIdx.y * (NW * 16 * RT) + warp * 16 * RT;\n"
    "    bool live[RT];\n"
    "    const __nv_fp8_e4m3 *w0[RT], *w1[RT];\n"
    "    const float *sr[RT];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RT; r++) {\n"
    "        const int a = n0 + 16 * r, ra = a < ND ? a : 0;\n"
    "        live[r] = a < ND;\n"
    "        w0[r] = wd + (long long)e * ND * KD + moec_woff<TL, KD>(ra + g, q * 16);\n"
    "        w1[r] = wd + (long long)e * ND * KD + moec_woff<TL, KD>(ra + g + 8, q * 16);\n"
    "        sr[r] = dsc + ((long long)e * SR + ra / SBN) * SC;\n"
    "    }\n";

static const char DOWN_TAIL[] =
    "    if (!live[0])\n"
    "        return;\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RT; r++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < NT; t++)\n"
    "            if (live[r])\n"
    "                moec_down_frag<MULW>(y, sorted + b * BM + t * 8, ND, n0 + 16 * r, acc[r][t],\n"
    "                                     scale, wts);\n";

/* A block's staged rows: bm slots of kd + 8 bf16 (as linear_smem). */
static size_t moe_smem(int bm, long long kd) { return (size_t)bm * (size_t)(kd + 8) * 2; }

static int weight_fits(const cg_ctx *c, const ir_value *w)
{
    return !w || (cg_storage(c, w) == IR_DTYPE_F8E4M3 && ir_block_scale_tiles(w));
}

int cg_fp8_tc_moe_fits(const cg_ctx *c, const cg_moe_desc *d, long long urow, int bm)
{
    long long H = d->x->type.dims[1], I = d->down->type.dims[2];
    size_t max = cg_smem_max(c->opt);
    return cg_arch_num(c->opt) >= 80 && cg_storage(c, d->x) == IR_DTYPE_BF16 &&
           weight_fits(c, d->gate) && weight_fits(c, d->up) && weight_fits(c, d->down) &&
           urow % 16 == 0 && H % 64 == 0 && I % 64 == 0 && bm >= 8 && bm % 8 == 0 &&
           moe_smem(bm, H) <= max && moe_smem(bm, I) <= max;
}

int cg_fp8_tc_moe_rows(const cg_ctx *c, const cg_moe_desc *d, long long urow)
{
    long long slots = (long long)c->T * d->ids->type.dims[1], E = d->down->type.dims[0];
    /* blocks of at least the mean slots times MOEC_FP8_TC_BM_HEAD (A/B:
       H200, 2026-11-29, fp8 V2-Lite at 32 / 64 tokens, 2 (16 slots a block
       at 64) 5.851 / 8.517 ms, 4 7.336 / 11.199, against 5.854 / 7.199;
       at 64 with 16 gate_up 121.6 us a layer and down 102.3, against
       110.1 and 63.5: an expert of 9 to 16 slots read twice costs less) */
    long long head = cg_env_int("MOEC_FP8_TC_BM_HEAD", 1, 1, 8);
    int bm = 8;
    while (bm < 64 && slots * head > (long long)bm * E)
        bm *= 2;
    while (bm > 8 && !cg_fp8_tc_moe_fits(c, d, urow, bm))
        bm /= 2;
    return cg_fp8_tc_moe_fits(c, d, urow, bm) ? bm : 0;
}

static moec_status oom(const cg_moe_desc *d)
{
    return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: no memory", ir_op_name(d->op->kind), d->out->name);
}

moec_status cg_fp8_tc_moe_gate_up(cg_ctx *c, const cg_moe_desc *d, const cg_moe_layout *l)
{
    int nw = cg_env_int("MOEC_FP8_TC_WARPS", TC_WARPS, 1, 8);
    int tl = cg_weight_tl(c, d->gate);
    int u = cg_env_int("MOEC_FP8_TC_U", tc_u(c, tl), 0, 8);
    if (!u)
        u = l->bm <= 16 ? 4 : 2;
    long long urow = l->fused ? l->I : 0;
    char tag[40], decl[400], name[200];
    cg_moe_scale_consts(c, d->gate, urow, "*gsc = nullptr, *usc = nullptr", tag, sizeof tag, decl,
                        sizeof decl);
    long long gstride = (l->fused ? 2 : 1) * l->I * l->H, uoff = l->fused ? l->I * l->H : 0;
    int roll = tc_roll(c, tl);
    snprintf(name, sizeof name,
             "moe_gate_up_e%lld_k%lld_h%lld_i%lld_bm%d_f8tc_w%d_u%d%s_t%d_bf16_f8e4m3_%s%s", l->E,
             l->K, l->H, l->I, l->bm, nw, u, roll_tag(roll), c->T,
             l->fused ? "fused" : "split", tag);
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return oom(d);
    if (is_new) {
        moec_buf_printf(
            &c->src,
            "// %s: gate_up GEMM with silu_mul, fp8 on tensor cores, x staged in shared memory "
            "(codegen/fp8_tc.c)\n"
            "extern \"C\" __global__ void __launch_bounds__(%d) %s(const __nv_bfloat16 "
            "*__restrict__ x, const __nv_fp8_e4m3 *__restrict__ wg, const __nv_fp8_e4m3 "
            "*__restrict__ wu, const float *__restrict__ gsc, const float *__restrict__ usc, const "
            "int *__restrict__ sorted, const int *__restrict__ blk_expert, const int *__restrict__ "
            "n_used, __nv_bfloat16 *__restrict__ hbuf)\n{\n"
            "    constexpr int K = %lld, KD = %lld, ND = %lld, BM = %d, NT = BM / 8, NW = %d, RT = "
            "2, U = %d, CH = KD / 64, XS = KD + 8;\n"
            "    constexpr long long GSTRIDE = %lldLL, USTRIDE = %lldLL, UOFF = %lldLL;\n"
            "    constexpr bool PRE = false;\n"
            "    constexpr int ROLL = %d;\n%s"
            "    constexpr int CS = TL ? 1024 : 64;\n",
            ir_op_name(d->op->kind), nw * 32, name, l->K, l->H, l->I, l->bm, nw, u, gstride,
            gstride, uoff, roll, decl);
        moec_buf_printf(&c->src, GATE_UP_HEAD, EXPERT_HEAD);
        moec_buf_printf(&c->src, "%s%s%s}\n\n", TC_LOAD, TC_LOOP, GATE_UP_TAIL);
    }
    ir_step *s = cg_moe_gemm_step(c, d, l, k, nw, 16LL * nw, l->I, moe_smem(l->bm, l->H));
    if (!s)
        return oom(d);
    cg_moe_gate_up_args(s, d, l, 1);
    return MOEC_OK;
}

moec_status cg_fp8_tc_moe_down(cg_ctx *c, const cg_moe_desc *d, const cg_moe_layout *l)
{
    int nw = cg_env_int("MOEC_FP8_TC_WARPS", TC_WARPS, 1, 8);
    /* tiles a warp: MOEC_FP8_TC_RT (the linear's too), else
       MOEC_FP8_TC_DN_RT (TC_DN_RT; 0: two where the blocks still fill the
       GPU twice) */
    int rt = cg_env_int("MOEC_FP8_TC_RT", 0, 0, 2);
    if (!rt)
        rt = cg_env_int("MOEC_FP8_TC_DN_RT", TC_DN_RT, 0, 2);
    if (!rt)
        rt = l->nb * ((l->H + 32LL * nw - 1) / (32LL * nw)) >= TC_BLOCKS ? 2 : 1;
    int tl = cg_weight_tl(c, d->down);
    int u = cg_env_int("MOEC_FP8_TC_U", tc_u(c, tl), 0, 8);
    if (!u)
        u = l->bm <= 16 ? 4 : 4 / rt;
    ir_dtype ydt = d->w ? IR_DTYPE_F32 : cg_storage(c, d->out);
    ir_dtype wdt = d->w ? cg_storage(c, d->w) : IR_DTYPE_F32;
    char tag[40], decl[400], name[200];
    cg_moe_scale_consts(c, d->down, 0, "*dsc = nullptr", tag, sizeof tag, decl, sizeof decl);
    int roll = tc_roll(c, tl);
    snprintf(name, sizeof name,
             "moe_down_e%lld_k%lld_h%lld_i%lld_bm%d_f8tc_w%d_rt%d_u%d%s_t%d_f8e4m3_%s_%s%s", l->E,
             l->K, l->H, l->I, l->bm, nw, rt, u, roll_tag(roll), c->T, ir_dtype_name(ydt),
             d->w ? "w" : "now", tag);
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return oom(d);
    if (is_new) {
        moec_buf_printf(&c->src,
                        "// %s: down GEMM%s, fp8 on tensor cores, h staged in shared memory "
                        "(codegen/fp8_tc.c)\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(const __nv_bfloat16 "
                        "*__restrict__ hbuf, const __nv_fp8_e4m3 *__restrict__ wd, const float "
                        "*__restrict__ dsc, const int *__restrict__ sorted, const int "
                        "*__restrict__ blk_expert, const int *__restrict__ n_used, ",
                        ir_op_name(d->op->kind), d->w ? " times scale * router weight" : "",
                        nw * 32, name);
        if (d->w)
            moec_buf_printf(&c->src, "const %s *__restrict__ wts, float scale, ", cg_ctype(wdt));
        moec_buf_printf(&c->src,
                        "%s *__restrict__ y)\n{\n"
                        "    constexpr int KD = %lld, ND = %lld, BM = %d, NT = BM / 8, NW = %d, RT "
                        "= %d, U = %d, CH = KD / 64, XS = KD + 8;\n"
                        "    constexpr bool MULW = %s, PRE = false;\n"
                        "    constexpr int ROLL = %d;\n%s"
                        "    constexpr int CS = TL ? 1024 : 64;\n",
                        cg_ctype(ydt), l->I, l->H, l->bm, nw, rt, u, d->w ? "true" : "false",
                        roll, decl);
        if (!d->w)
            moec_buf_printf(&c->src, "    const float *wts = nullptr, scale = 0.0f;\n"
                                     "    (void)wts;\n    (void)scale;\n");
        moec_buf_printf(&c->src, DOWN_HEAD, EXPERT_HEAD);
        moec_buf_printf(&c->src, "%s%s%s}\n\n", TC_LOAD, TC_LOOP, DOWN_TAIL);
    }
    ir_step *s = cg_moe_gemm_step(c, d, l, k, nw, 16LL * nw * rt, l->H, moe_smem(l->bm, l->I));
    if (!s)
        return oom(d);
    cg_moe_down_args(s, d, l, 1);
    return MOEC_OK;
}
