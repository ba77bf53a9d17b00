/* moe_routed.c — the routed experts of a MoE layer as grouped GEMMs (docs/IR.md,
 * moe_routed), the way vLLM's fused_moe runs them (seed 003): (1) align: the
 * token slots t*K+k sorted by expert and padded per expert to blocks of BM
 * rows, with the expert of each block and the number of blocks used; (2)
 * gate_up: for each block and a tile of I, silu(gate x) * up x into h
 * [T*K, I] (f32 scratch); (3) down: y[slot] = scale * w[t,k] * down_e h[slot]
 * (f32 scratch; the result itself when unsummed); (4) sum over k into the
 * result [T, H] (none when unsummed: the add_rms_norm that reads the
 * result sums it, pass fuse_moe_sum). Each expert's weights
 * are thus read once per block of BM of its tokens, not once per token.
 *
 * The GEMMs stream weight rows with 16-byte loads, one warp per few rows,
 * the block's BM activation rows in registers, fp32 accumulation on CUDA
 * cores. Decode puts a token or two on each expert, so BM follows the
 * bucket's expected rows per expert (1 to 8).
 *
 * fp8 expert weights (block-scaled e4m3, docs/IR.md) are read as fp8, their
 * scales from past their codes (ir_weight_scale_offset): on CUDA cores each
 * code is widened and multiplied by its block's scale as the interpreter
 * dequantizes; on tensor cores codes widen exactly to bf16 and each 32-wide
 * k chunk's products are added times the scale of the block they lie in. */
#include "codegen/moe_routed.h"

#include <stdio.h>

#include "codegen/fp8_tc.h"

#include "err.h"

#define MOE_WARPS 8
/* The tensor-core form's shape: warps per block (16 weight rows each), k
 * chunks of loads in flight per lane, and the CUDA-core rows per block from
 * which tensor cores take over. MOEC_MOE_MMA_WARPS, MOEC_MOE_MMA_U and
 * MOEC_MOE_MMA_MIN_BM override them for tuning (the kernel names say
 * which shape ran). */
/* (H100, 2026-11-22, scripts/gpu_moe_tune.sh: one-warp blocks with 8 chunks
 * in flight stream the V2-Lite experts at 2.6 to 2.8 TB/s of gate_up at
 * T = 8..32, 4-warp blocks at 1.9 to 2.1; CUDA cores stay ahead at one
 * or two rows per block.) */
#define MMA_WARPS 1
#define MMA_UNROLL 8
#define MMA_MIN_BM 4
/* fp8 experts take the staged tensor-core kernels (codegen/fp8_tc.c) from
 * this many CUDA-core rows a block (MOEC_MOE_FP8_TC_MIN_BM): they read each
 * expert once for all its slots, where blocks of 2 read an expert of 3
 * slots twice. (H200, 2026-11-29, V2-Lite in fp8, the step at 1 / 2 / 4 /
 * 8 tokens, blocks of 1, 1, 1 and 2 rows: the streaming kernels 1.517 /
 * 2.124 / 3.098 / 4.354 ms, the staged ones 2.415 / 2.856 / 3.234 /
 * 3.836: few experts make too few blocks of 16-row tiles. K split over
 * the block's warps as well, 1.762 at best at 1 token, 4.088 at 8 against
 * 3.804 unsplit: taken out, kept in history at 5254ff8.) */
#define FP8_TC_MIN_BM 2
/* The down GEMM's chunks in flight (MOEC_MOE_MMA_DN_U). (H100, 2026-11-24,
 * V2-Lite, whole step: 4 chunks 13.46 -> 12.97 ms at batch 32 and 14.52 ->
 * 14.20 at 64 against 8; two 16-row tiles a warp sharing h's fragments,
 * tried at e5ed283, -0.12 ms at 32 and +0.12 at 64: taken out.) */
#define MMA_DN_U 4
/* (H100, 2026-11-24, 7th round, scripts/gpu_moe_tune.sh at V2-Lite's shape,
 * T = 64, gate_up / down us: this register form 274 / 144; its loads
 * through a shared-memory ring of cp.async copies instead, 392-412 /
 * 396-418, bound by the MIO queue; bulk copies (TMA) of 256-wide stages,
 * 292 / 260 at the best depth: both taken out, kept in history at
 * 5c04770.) */
/* Tensor-core blocks hold 16 slots (two 8-column tiles over one read of the
 * weights) once experts average more than this many slots, else 8: an
 * expert with more slots than a block holds is read once per block.
 * MOEC_MOE_MMA_BM16 overrides it. */
#define MMA_BM16_MEAN 8
/* The streaming form's shape (GV_CONSTS, GV_ROWS): warps per block, rows
 * per warp of gate_up (each a gate and an up row) and of down, k chunks in flight, and
 * the largest expert block it takes (larger ones: the first CUDA-core
 * form). MOEC_MOE_GEMV=0 keeps the first form everywhere (an A/B in one
 * run); MOEC_MOE_GEMV_WARPS, _RW, _RWD, _U and _MAX_BM override the rest
 * (the kernel names say which shape ran). */
/* (H100, 2026-11-24, scripts/gpu_moe_ab.sh AB=v2, V2-Lite experts at T =
   1, 2, 3, 8: 4 chunks in flight stream bf16 gate_up / down at 2.81 / 2.56
   TB/s at T = 1 and fp8 at 2.38 / 1.75, 2 chunks 2.79 / 2.40 and 1.80 /
   1.48, the first form 2.73 / 2.16 and 1.70 / 1.23; 4 chunks lead or tie
   at every T. H200, 2026-11-29, fp8 V2-Lite's step at batch 1 with the
   codes widened by the conversion unit: 1.454 ms; 2 chunks 1.536, rows a
   warp 1 or 4 1.500 / 1.494, 8 or 2 warps 1.506 / 1.457, down's rows at
   one slot 4 1.509.) */
#define GV_WARPS 4
#define GV_RW 2
#define GV_RWD 4
/* down's rows a warp where a block holds one slot (H200, 2026-11-28,
   V2-Lite's down alone at T = 1: 10.2 us with 8 rows against 11.6 with 4;
   the step cut to 10 layers at batch 1, 0.766 against 0.773 ms in bf16,
   0.643 against 0.652 in fp8; at 8 tokens, blocks of 2 slots, fp8 lost:
   1.792 against 1.740) */
#define GV_RWD_BM1 8
#define GV_U 4
#define GV_MAX_BM 2
/* The tile-streaming form's warps a block and chunks in flight a warp:
 * gate_up's (MOEC_MOE_GT_WARPS, MOEC_MOE_GT_U), down's (MOEC_MOE_GT_DN_WARPS,
 * MOEC_MOE_GT_DN_U). gate_up's 32 chunks at 8 warps of 2 make 4224 warps for
 * V2-Lite's 6 experts at one token, each one round of loads, as the
 * streaming form's (H200, 2026-11-30, fp8 V2-Lite at context 1024 with
 * gate_up in tiles: 1.438 / 1.988 / 2.971 ms a step at 1 / 2 / 4 tokens
 * against 1.512 / 1.982 / 2.991 at 4 warps of 4; with down in tiles too,
 * its 4 of 4 1.482 / 2.057 / 3.046 against 8 of 2 1.509 / 2.109 / 3.144). */
#define GT_WARPS 8
#define GT_U 2
#define GT_DN_WARPS 4
#define GT_DN_U 4
/* 16-row tiles a warp of the tile-streaming form (MOEC_MOE_GT_RT,
 * MOEC_MOE_GT_DN_RT, 1 to 4), the activations a lane loads for a chunk
 * serving all of them: gate_up's 2 from GT_RT2_T tokens; with
 * MOEC_MOE_GT_KW / _DN_KW warps over a group's K (default: all of the
 * block's), the block's other warps taking the next groups' rows. (H200,
 * 2026-11-30, fp8 V2-Lite at context 1024, ms a step at 1 / 2 / 4 tokens:
 * gate_up at 2 tiles 1.410 / 1.803 / 2.554 against 1.397 / 1.823 /
 * 2.549. Down over tiles (MOEC_FP8_TILES=5) instead of rows: 1.494 /
 * 1.922 / 2.678, at 2 tiles and 8 warps of 3 chunks 1.473 / 1.857 /
 * 2.589, at 4 tiles 1.559 / 1.978 / 2.829: down stays in rows.) */
#define GT_RT2_T 2
#define GT_DN_RT 1
/* Measured and taken out: down over tiles in a half-tile streaming form
 * (a warp 8 rows, half a tile, over all of K: every chunk loaded before
 * the wait, as the streaming form over rows loads its rows; the slots'
 * activations a chunk at a time from L1; 128 registers, no spills), to
 * end down sooner after gate_up at 1 to 4 tokens: fp8 V2-Lite with every
 * expert weight in tiles, 1.511 / 2.170 / 3.214 / 5.489 / 6.654 ms at 1 /
 * 2 / 4 / 32 / 64 tokens against the tile-streaming form's 1.483 / 2.062 /
 * 3.046 / 5.488 / 6.652 (H200, 2026-11-30; history at a5a84ba,
 * MOEC_MOE_GH). */
/* fp8 codes widened by the conversion unit (e4m3 pairs to f16 pairs, then
 * to fp32) instead of integer and bf16x2 operations (sm_89 and later; names
 * carry _cvt; MOEC_MOE_GEMV_CVT=0: not): 6 operations for 4 codes instead
 * of about 14, where the streaming kernels at one token spent about 96
 * instructions a warp's 512 bytes of codes. (H200, 2026-11-29, V2-Lite in
 * fp8, the step at 1 / 4 tokens: 1.457 / 3.004 ms against 1.517 / 3.102.) */
#define GV_CVT 1

#define ALIGN_THREADS 256
#define SUM_THREADS 128

const char CG_MOE_ALIGN_BODY[] =
    "    constexpr int N = T * K;\n"
    "    __shared__ int cnt[E], off[E], fill[E];\n"
    "    const int tid = threadIdx.x, lane = tid & 31;\n"
    "    for (int e = tid; e < E; e += NT) {\n"
    "        cnt[e] = 0;\n"
    "        fill[e] = 0;\n"
    "    }\n"
    "    for (int i = tid; i < NB * BM; i += NT)\n"
    "        sorted[i] = -1;\n"
    "    for (int i = tid; i < NB; i += NT)\n"
    "        blk_expert[i] = -1;\n"
    "    __syncthreads();\n"
    "    for (int i = tid; i < N; i += NT) {\n"
    "        const int e = ids[i] - E0;\n"
    "        if (e >= 0 && e < E)\n"
    "            atomicAdd(&cnt[e], 1);\n"
    "    }\n"
    "    __syncthreads();\n"
    "    /* exclusive scan of the blocks of each expert, by warp 0 */\n"
    "    if (tid < 32) {\n"
    "        int run = 0;\n"
    "        for (int base = 0; base < E; base += 32) {\n"
    "            const int e = base + lane;\n"
    "            const int v = e < E ? (cnt[e] + BM - 1) / BM : 0;\n"
    "            int incl = v;\n"
    "#pragma unroll\n"
    "            for (int o = 1; o < 32; o <<= 1) {\n"
    "                const int u = __shfl_up_sync(0xffffffffu, incl, o);\n"
    "                if (lane >= o)\n"
    "                    incl += u;\n"
    "            }\n"
    "            if (e < E)\n"
    "                off[e] = run + incl - v;\n"
    "            run += __shfl_sync(0xffffffffu, incl, 31);\n"
    "        }\n"
    "        if (lane == 0)\n"
    "            *n_used = run;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    for (int e = tid; e < E; e += NT) {\n"
    "        const int nb = (cnt[e] + BM - 1) / BM;\n"
    "        for (int b = 0; b < nb; b++)\n"
    "            blk_expert[off[e] + b] = e;\n"
    "    }\n"
    "    for (int i = tid; i < N; i += NT) {\n"
    "        const int e = ids[i] - E0;\n"
    "        if (e >= 0 && e < E)\n"
    "            sorted[off[e] * BM + atomicAdd(&fill[e], 1)] = i;\n"
    "    }\n";

/* The first CUDA-core form's constants: VE elements a lane a k step. */
static const char GEMM_CONSTS[] =
    "    constexpr int BN = NW * RW, KSTEP = 32 * VE, NSTEP = (KD + KSTEP - 1) / KSTEP;\n"
    "    /* small blocks: several k steps' loads in flight at once */\n"
    "    constexpr int UNROLL = BM <= 2 ? 4 : 1;\n";

/* Shared by the CUDA-core forms' gate_up and down (after their constants,
 * BN among them): the block's expert, its BM slots (padding rows read row
 * 0 and are never stored) and the warp's first row n0. The align kernel
 * writes every block's expert, -1 past the count it used, so the expert
 * alone says whether a block works: one load ahead of the weights' instead
 * of two in a row. Both are read through L2 (__ldcg): a down kernel that
 * reads them before its wait (PRE) sees the align's stores there. */
static const char GEMM_HEAD[] =
    "    const int b = blockIdx.x;\n"
    "    (void)n_used;\n"
    "    const int e = __ldcg(blk_expert + b);\n"
    "    if (e < 0)\n"
    "        return;\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const int n0 = blockIdx.y * BN + warp * RW;\n"
    "    if (ND % BN != 0 && n0 >= ND)\n"
    "        return;\n"
    "    int sl[BM];\n"
    "#pragma unroll\n"
    "    for (int m = 0; m < BM; m++)\n"
    "        sl[m] = __ldcg(sorted + b * BM + m);\n";

static const char GATE_UP_BODY[] =
    "    const TX *xr[BM];\n"
    "#pragma unroll\n"
    "    for (int m = 0; m < BM; m++)\n"
    "        xr[m] = x + (long long)(sl[m] >= 0 ? sl[m] / K : 0) * KD;\n"
    "    const TW *gr = wg + (long long)e * GSTRIDE;\n"
    "    const TW *ur = wu + (long long)e * USTRIDE + UOFF;\n"
    "    float ag[RW][BM], au[RW][BM];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RW; r++)\n"
    "#pragma unroll\n"
    "        for (int m = 0; m < BM; m++)\n"
    "            ag[r][m] = au[r][m] = 0.0f;\n"
    "#pragma unroll(UNROLL)\n"
    "    for (int s = 0; s < NSTEP; s++) {\n"
    "        const int k = s * KSTEP + lane * VE;\n"
    "        if (KD % KSTEP != 0 && k >= KD)\n"
    "            break;\n"
    "        float xv[BM][VE];\n"
    "#pragma unroll\n"
    "        for (int m = 0; m < BM; m++)\n"
    "            ldv<VE>(xr[m] + k, xv[m]);\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RW; r++) {\n"
    "            if (ND % BN != 0 && n0 + r >= ND)\n"
    "                continue;\n"
    "            float gv[VE], uv[VE];\n"
    "            ldv<VE>(gr + moec_woff<TL, KD>(n0 + r, k), gv);\n"
    "            ldv<VE>(ur + moec_woff<TL, KD>(n0 + r, k), uv);\n"
    "            if constexpr (W8) {\n"
    "                /* each code times its block's scale, as the interpreter dequantizes */\n"
    "                const float sg = gsc[((long long)e * SR + (n0 + r) / SBN) * SC + k / SBK];\n"
    "                const float su = usc[((long long)e * SR + (UROW + n0 + r) / SBN) * SC + k / SBK];\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < VE; j++) {\n"
    "                    gv[j] *= sg;\n"
    "                    uv[j] *= su;\n"
    "                }\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int m = 0; m < BM; m++)\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < VE; j++) {\n"
    "                    ag[r][m] += gv[j] * xv[m][j];\n"
    "                    au[r][m] += uv[j] * xv[m][j];\n"
    "                }\n"
    "        }\n"
    "    }\n";

/* The CUDA-core forms' gate_up end: each row's and slot's sums over the
 * warp, silu(gate) * up stored by one lane. */
static const char GATE_UP_END[] =
    "#pragma unroll\n"
    "    for (int r = 0; r < RW; r++)\n"
    "#pragma unroll\n"
    "        for (int m = 0; m < BM; m++) {\n"
    "            const float g = warp_sum(ag[r][m]), u = warp_sum(au[r][m]);\n"
    "            if (lane == ((r * BM + m) & 31) && sl[m] >= 0 && (ND % BN == 0 || n0 + r < ND))\n"
    "                hbuf[(long long)sl[m] * ND + n0 + r] = g / (1.0f + expf(-g)) * u;\n"
    "        }\n";

static const char DOWN_BODY[] =
    "    const float *hr[BM];\n"
    "#pragma unroll\n"
    "    for (int m = 0; m < BM; m++)\n"
    "        hr[m] = hbuf + (long long)(sl[m] >= 0 ? sl[m] : 0) * KD;\n"
    "    const TW *dr = wd + (long long)e * ND * KD;\n"
    "    float acc[RW][BM];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RW; r++)\n"
    "#pragma unroll\n"
    "        for (int m = 0; m < BM; m++)\n"
    "            acc[r][m] = 0.0f;\n"
    "#pragma unroll(UNROLL)\n"
    "    for (int s = 0; s < NSTEP; s++) {\n"
    "        const int k = s * KSTEP + lane * VE;\n"
    "        if (KD % KSTEP != 0 && k >= KD)\n"
    "            break;\n"
    "        float hv[BM][VE];\n"
    "#pragma unroll\n"
    "        for (int m = 0; m < BM; m++)\n"
    "            ldv<VE>(hr[m] + k, hv[m]);\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RW; r++) {\n"
    "            if (ND % BN != 0 && n0 + r >= ND)\n"
    "                continue;\n"
    "            float wv[VE];\n"
    "            ldv<VE>(dr + moec_woff<TL, KD>(n0 + r, k), wv);\n"
    "            if constexpr (W8) {\n"
    "                const float sd = dsc[((long long)e * SR + (n0 + r) / SBN) * SC + k / SBK];\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < VE; j++)\n"
    "                    wv[j] *= sd;\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int m = 0; m < BM; m++)\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < VE; j++)\n"
    "                    acc[r][m] += wv[j] * hv[m][j];\n"
    "        }\n"
    "    }\n";

/* The CUDA-core forms' down end: each row's and slot's sum over the warp,
 * times scale and the slot's router weight when MULW, stored by one lane. */
static const char DOWN_END[] =
    "#pragma unroll\n"
    "    for (int r = 0; r < RW; r++)\n"
    "#pragma unroll\n"
    "        for (int m = 0; m < BM; m++) {\n"
    "            float v = warp_sum(acc[r][m]);\n"
    "            if (lane == ((r * BM + m) & 31) && sl[m] >= 0 && (ND % BN == 0 || n0 + r < ND)) {\n"
    "                if constexpr (MULW)\n"
    "                    v *= scale * ld(wts + sl[m]);\n"
    "                st(y + (long long)sl[m] * ND + n0 + r, v);\n"
    "            }\n"
    "        }\n";

/* The streaming forms (gv) of gate_up and down for blocks of one or two
 * slots: each lane reads 16 bytes of a weight row per k chunk (VW
 * elements: 8 bf16, 16 fp8 codes), a warp RW rows, and issues U chunks of
 * every row's loads (and the slots' activations, its scales) before it
 * uses any, so that U * RW (gate_up: twice that) 16-byte loads per lane
 * are in flight; small blocks of NW warps give the GPU many blocks even at
 * one token. fp8 codes widen by the conversion unit (sm_89 and later,
 * GV_CVT) or with integer operations (moec_w16) and each
 * lane's 16 products are summed before the one multiply by their block's
 * scale (16 | SBK: a lane's codes lie in one block). Rows past ND load
 * nothing and are never stored; padding slots read x row 0. */
static const char GV_CONSTS[] =
    "    constexpr int VW = 16 / (int)sizeof(TW), KSTEP = 32 * VW;\n"
    "    constexpr int NCH = (KD + KSTEP - 1) / KSTEP, BN = NW * RW, LR = RW;\n"
    "    constexpr int c0 = 0, c1 = NCH; /* the chunks STREAM_LOOP runs */\n"
    "    constexpr bool FULL = NCH % U == 0; /* every round of U chunks whole */\n"
    "    typedef int CO; /* a chunk's column offset */\n";

/* After GEMM_HEAD: which of the warp's rows exist. */
static const char GV_ROWS[] =
    "    /* live[r]: row n0 + r exists; rw[r]: the row read (n0 for dead rows,\n"
    "       whose loads are skipped) */\n"
    "    bool live[RW];\n"
    "    int rw[RW];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RW; r++) {\n"
    "        live[r] = ND % BN == 0 || n0 + r < ND;\n"
    "        rw[r] = live[r] ? n0 + r : n0;\n"
    "    }\n";

/* The streaming GEMM of both steps: NM weight matrices (gate_up: gate and
 * up, 2; down: 1), matrix i's row n of expert e at w[i] + e * WS[i] +
 * WO[i] + n * KD, its scales' row (WR[i] + n) / SBN of sc[i]; the slots'
 * activation rows from act (row slot / AK: x's token, or h's slot).
 * Leaves a[NM][RW][BM], the sums of this lane's products. */
static const char GV_BODY[] =
    "    const TX *ar[BM];\n"
    "#pragma unroll\n"
    "    for (int m = 0; m < BM; m++)\n"
    "        ar[m] = act + (long long)(sl[m] >= 0 ? sl[m] / AK : 0) * KD + lane * VW;\n"
    "    const TW *wr[NM][RW];\n"
    "    [[maybe_unused]] const float *sr[NM][RW];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < NM; i++)\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RW; r++) {\n"
    "            wr[i][r] = w[i] + (long long)e * WS[i] + WO[i] + moec_woff<TL, KD>(rw[r], lane * VW);\n"
    "            if constexpr (W8)\n"
    "                sr[i][r] = sc[i] + ((long long)e * SR + (WR[i] + rw[r]) / SBN) * SC;\n"
    "        }\n"
    "    float a[NM][RW][BM];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < NM; i++)\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RW; r++)\n"
    "#pragma unroll\n"
    "            for (int m = 0; m < BM; m++)\n"
    "                a[i][r][m] = 0.0f;\n"
    "    uint4 wv[U][NM][RW];\n"
    "    [[maybe_unused]] float sv[U][NM][RW];\n"
    "    /* the U chunks from cb of every row's weights (and their scales) */\n"
    "    auto load_w = [&](int cb) {\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            const int kc = (cb + u) * KSTEP, k = kc + lane * VW;\n"
    "            const bool ok = (NCH % U == 0 || cb + u < NCH) && (KD % KSTEP == 0 || k < KD);\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < NM; i++)\n"
    "#pragma unroll\n"
    "                for (int r = 0; r < RW; r++) {\n"
    "                    const bool on = ok && live[r];\n"
    "                    wv[u][i][r] = on ? moec_ldg16(wr[i][r] + (TL ? kc * 16LL : kc)) : make_uint4(0u, 0u, 0u, 0u);\n"
    "                    if constexpr (W8)\n"
    "                        sv[u][i][r] = on ? sr[i][r][k / SBK] : 0.0f;\n"
    "                }\n"
    "        }\n"
    "    };\n";
/* With PRE (down, both forms), the first chunks' weights are loaded before
 * the wait, while gate_up still runs: the block's expert and slots come
 * from the align kernel, which ended before gate_up passed its own wait,
 * and gate_up lets this kernel start only after that wait (moec_pdl_enter);
 * the loop then starts with their products. */
static const char DOWN_PRE[] = "    load_w(0);\n    moec_pdl_enter();\n";
/* The main loop of both streaming forms (gv, gt): chunks c0 .. c1 - 1 of
 * KSTEP columns, U at a time (their weights by load_w, the slots' VW
 * activations a lane from ar[m]), each lane's VW products of a weight
 * register (LR a chunk: gv's RW rows, gt's two halves of a tile) summed
 * and, in fp8, added times its block scale sv; FULL where every round of
 * U chunks is whole, CO the type of a chunk's column offset (each form's
 * own, as before the two shared this loop). Leaves a[NM][LR][BM]. */
static const char STREAM_LOOP[] =
    "#pragma unroll 1\n"
    "    for (int cb = c0; cb < c1; cb += U) {\n"
    "        if (!PRE || cb > c0)\n"
    "            load_w(cb);\n"
    "        float xv[U][BM][VW];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            const int kc = (cb + u) * KSTEP, k = kc + lane * VW;\n"
    "            const bool ok = (FULL || cb + u < c1) && (KD % KSTEP == 0 || k < KD);\n"
    "#pragma unroll\n"
    "            for (int m = 0; m < BM; m++) {\n"
    "                if (ok) {\n"
    "                    ldv<VW>(ar[m] + (CO)(cb + u) * KSTEP, xv[u][m]);\n"
    "                } else {\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < VW; j++)\n"
    "                        xv[u][m][j] = 0.0f;\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++)\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < NM; i++)\n"
    "#pragma unroll\n"
    "                for (int r = 0; r < LR; r++) {\n"
    "                    float wf[VW];\n"
    "                    moec_w16v<CVT8>(wv[u][i][r], wf, (const TW *)nullptr);\n"
    "#pragma unroll\n"
    "                    for (int m = 0; m < BM; m++) {\n"
    "                        float p = W8 ? 0.0f : a[i][r][m];\n"
    "#pragma unroll\n"
    "                        for (int j = 0; j < VW; j++)\n"
    "                            p = fmaf(wf[j], xv[u][m][j], p);\n"
    "                        if constexpr (W8)\n"
    "                            a[i][r][m] = fmaf(sv[u][i][r], p, a[i][r][m]);\n"
    "                        else\n"
    "                            a[i][r][m] = p;\n"
    "                    }\n"
    "                }\n"
    "    }\n";

/* GV_BODY's operands in gate_up (before it) and its sums' names (after). */
static const char GV_GATE_UP_IN[] =
    "    constexpr int NM = 2, AK = K;\n"
    "    const TX *act = x;\n"
    "    const TW *w[NM] = {wg, wu};\n"
    "    [[maybe_unused]] const float *sc[NM] = {gsc, usc};\n"
    "    constexpr long long WS[NM] = {GSTRIDE, USTRIDE}, WO[NM] = {0, UOFF}, WR[NM] = {0, UROW};\n";
static const char GV_GATE_UP_OUT[] = "    float(&ag)[RW][BM] = a[0], (&au)[RW][BM] = a[1];\n";
/* ... in down */
static const char GV_DOWN_IN[] =
    "    constexpr int NM = 1, AK = 1;\n"
    "    typedef float TX;\n"
    "    const TX *act = hbuf;\n"
    "    const TW *w[NM] = {wd};\n"
    "    [[maybe_unused]] const float *sc[NM] = {dsc};\n"
    "    constexpr long long WS[NM] = {(long long)ND * KD}, WO[NM] = {0}, WR[NM] = {0};\n";
static const char GV_DOWN_OUT[] = "    float(&acc)[RW][BM] = a[0];\n";

/* The tile-streaming forms (gt) of gate_up and down for blocks of one or
 * two slots over fp8 weights in fragment tiles (ir_weight_tiled), where
 * the streaming form's rows would read 64 bytes of each 1 KiB chunk at a
 * time (H200, 2026-11-29, V2-Lite in fp8 at 1 / 2 / 4 tokens: 1.655 /
 * 2.314 / 3.247 ms a step so, against 1.458 / 2.025 / 3.000 before the
 * tiles). A block takes NW / KW groups of RT 16-row tiles (BN rows from n0)
 * of each of its NM matrices; the KW warps of a group (warp / KW) each a
 * contiguous share of the 64-wide chunks; lane (g, q) loads the 16 codes
 * of rows g and g + 8 of each of its tiles at k 16q of a chunk (a warp 512
 * contiguous bytes a load), U chunks before their products, and
 * multiplies them with the slots' activations there (read once for the RT
 * tiles). The lanes of a quad then add up their k, the warps of a group
 * theirs in shared memory (red), and one thread a row and slot ends as the
 * streaming form does. Needs the scale blocks to hold whole tiles and
 * chunks (SBN % 16, SBK % 64). */
static const char GT_BODY[] =
    "    constexpr int CH = KD / 64, VW = 16, KSTEP = 64, LR = 2 * RT;\n"
    "    constexpr bool FULL = false; /* a warp's share of the chunks, any count */\n"
    "    typedef long long CO; /* a chunk's column offset */\n"
    "    const int g = lane >> 2, q = lane & 3, kw = warp % KW;\n"
    "    const int c0 = kw * CH / KW, c1 = (kw + 1) * CH / KW;\n"
    "    /* the warp's first row: its group's RT tiles; tiles past ND read\n"
    "       zeros and are never stored */\n"
    "    const int nt = n0 + warp / KW * (16 * RT);\n"
    "    bool live[RT];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RT; r++)\n"
    "        live[r] = nt + 16 * r < ND;\n"
    "    const TX *ar[BM];\n"
    "#pragma unroll\n"
    "    for (int m = 0; m < BM; m++)\n"
    "        ar[m] = act + (long long)(sl[m] >= 0 ? sl[m] / AK : 0) * KD + q * 16;\n"
    "    const TW *wt[NM][RT];\n"
    "    const float *sr[NM][RT];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < NM; i++)\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RT; r++) {\n"
    "            const int ra = live[r] ? nt + 16 * r : 0;\n"
    "            wt[i][r] = w[i] + (long long)e * WS[i] + WO[i] + (long long)ra * KD + lane * 16;\n"
    "            sr[i][r] = sc[i] + ((long long)e * SR + (WR[i] + ra) / SBN) * SC;\n"
    "        }\n"
    "    float a[NM][LR][BM];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < NM; i++)\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < LR; h++)\n"
    "#pragma unroll\n"
    "            for (int m = 0; m < BM; m++)\n"
    "                a[i][h][m] = 0.0f;\n"
    "    /* slot h = 2r + h' of a chunk: tile r's row g + 8h' (the warp's row 8h + g) */\n"
    "    uint4 wv[U][NM][LR];\n"
    "    float sv[U][NM][LR];\n"
    "    /* chunks cb .. cb + U - 1 of the tiles (zeros past c1) */\n"
    "    auto load_w = [&](int cb) {\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            const int c = cb + u;\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < NM; i++)\n"
    "#pragma unroll\n"
    "                for (int r = 0; r < RT; r++) {\n"
    "                    const bool on = c < c1 && live[r];\n"
    "                    const TW *p = wt[i][r] + (long long)c * 1024;\n"
    "#pragma unroll\n"
    "                    for (int h = 0; h < 2; h++)\n"
    "                        wv[u][i][2 * r + h] = on ? moec_ldg16(p + h * 512)\n"
    "                                                 : make_uint4(0u, 0u, 0u, 0u);\n"
    "                    const float f = on ? sr[i][r][(long long)c * 64 / SBK] : 0.0f;\n"
    "                    sv[u][i][2 * r] = sv[u][i][2 * r + 1] = f;\n"
    "                }\n"
    "        }\n"
    "    };\n";

/* With PRE (down), the warp's first chunks go out before the wait (as
 * DOWN_PRE). */
static const char GT_PRE[] = "    load_w(c0);\n    moec_pdl_enter();\n";

/* After STREAM_LOOP (gt): the lanes of a quad add up their k, the warps
 * theirs in shared memory. */
static const char GT_RED[] =
    "    __shared__ float red[NW][NM][LR][BM][8];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < NM; i++)\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < LR; h++)\n"
    "#pragma unroll\n"
    "            for (int m = 0; m < BM; m++) {\n"
    "                float v = a[i][h][m];\n"
    "                v += __shfl_xor_sync(0xffffffffu, v, 1);\n"
    "                v += __shfl_xor_sync(0xffffffffu, v, 2);\n"
    "                if (q == 0)\n"
    "                    red[warp][i][h][m][g] = v;\n"
    "            }\n"
    "    __syncthreads();\n"
    "    /* item t: row n0 + r (r = t % BN: group r / (16 RT), its row r % (16 RT)\n"
    "       = 8h + g) of slot m = t / BN, its sums s[i] over the group's KW warps;\n"
    "       the end (GT_*_END) closes the loop */\n"
    "    for (int t = threadIdx.x; t < BN * BM; t += NW * 32) {\n"
    "    const int r = t % BN, m = t / BN;\n"
    "    if (sl[m] < 0 || n0 + r >= ND)\n"
    "        continue;\n"
    "    const int gw = r / (16 * RT) * KW, rr = r % (16 * RT);\n"
    "    float s[NM];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < NM; i++) {\n"
    "        s[i] = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int w8 = 0; w8 < KW; w8++)\n"
    "            s[i] += red[gw + w8][i][rr >> 3][m][rr & 7];\n"
    "    }\n"
    "    const int row = n0 + r;\n";

static const char GT_GATE_UP_END[] =
    "    hbuf[(long long)sl[m] * ND + row] = s[0] / (1.0f + expf(-s[0])) * s[1];\n"
    "    }\n";

static const char GT_DOWN_END[] =
    "    float v = s[0];\n"
    "    if constexpr (MULW)\n"
    "        v *= scale * ld(wts + sl[m]);\n"
    "    st(y + (long long)sl[m] * ND + row, v);\n"
    "    }\n";

/* The tensor-core forms (bf16 weights and activations, fp32 accumulation):
 * each warp owns 16 weight rows and the block's BM slots (BM / 8 column
 * tiles of m16n8k16 products, the weights as the 16-row A operand and the
 * tokens as the 8-column B operand). A lane loads 16 bytes (8 elements) of
 * each of its two weight rows and of its token's row per 32-wide k chunk:
 * the reduction order over k does not matter, so the 8 elements a lane
 * holds stand for the k columns its fragments need (words 0 and 1 for the
 * first product's k 2q.. and 2q+8.., words 2 and 3 for the second's), the
 * same permutation on both operands. U chunks of loads are issued before
 * their products. */
static const char MMA_HEAD[] =
    "    constexpr int NTILE = BM / 8, NSTEP = KD / 32;\n"
    "    const int b = blockIdx.x;\n"
    "    (void)n_used;\n"
    "    const int e = __ldcg(blk_expert + b);\n"
    "    if (e < 0)\n"
    "        return;\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;\n"
    "    const int n0 = (blockIdx.y * NW + warp) * 16;\n"
    "    if (n0 >= ND)\n"
    "        return;\n"
    "    int sl[NTILE];\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NTILE; t++)\n"
    "        sl[t] = __ldcg(sorted + b * BM + t * 8 + g);\n";

static const char MMA_GATE_UP_BODY[] =
    "    const TX *xr[NTILE];\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NTILE; t++)\n"
    "        xr[t] = x + (long long)(sl[t] >= 0 ? sl[t] / K : 0) * KD + q * 8;\n"
    "    const TW *gb = wg + (long long)e * GSTRIDE, *ub = wu + (long long)e * USTRIDE + UOFF;\n"
    "    /* in rows, rows g of both at k q * 8: the loads step from there (an\n"
    "       offset through moec_woff at each load cost the bf16 experts 28% at\n"
    "       32 and 64 tokens: H200, 2026-11-29) */\n"
    "    const TW *g0 = gb + moec_woff<TL, KD>(n0 + g, q * 8);\n"
    "    const TW *u0 = ub + moec_woff<TL, KD>(n0 + g, q * 8);\n"
    "    float ag[NTILE][4], au[NTILE][4];\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NTILE; t++)\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < 4; i++)\n"
    "            ag[t][i] = au[t][i] = 0.0f;\n"
    "#pragma unroll 1\n"
    "    for (int s0 = 0; s0 < NSTEP; s0 += U) {\n"
    "        uint4 wa[U][4], xb[U][NTILE];\n"
    "        [[maybe_unused]] float sg[U], su[U];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            if (NSTEP % U != 0 && s0 + u >= NSTEP)\n"
    "                break;\n"
    "            const long long k = (long long)(s0 + u) * 32;\n"
    "            if constexpr (TL) {\n"
    "                wa[u][0] = moec_ld8(gb + moec_woff<TL, KD>(n0 + g, q * 8 + k));\n"
    "                wa[u][1] = moec_ld8(gb + moec_woff<TL, KD>(n0 + g + 8, q * 8 + k));\n"
    "                wa[u][2] = moec_ld8(ub + moec_woff<TL, KD>(n0 + g, q * 8 + k));\n"
    "                wa[u][3] = moec_ld8(ub + moec_woff<TL, KD>(n0 + g + 8, q * 8 + k));\n"
    "            } else {\n"
    "                wa[u][0] = moec_ld8(g0 + k);\n"
    "                wa[u][1] = moec_ld8(g0 + 8LL * KD + k);\n"
    "                wa[u][2] = moec_ld8(u0 + k);\n"
    "                wa[u][3] = moec_ld8(u0 + 8LL * KD + k);\n"
    "            }\n"
    "            if constexpr (W8) {\n"
    "                sg[u] = gsc[((long long)e * SR + n0 / SBN) * SC + k / SBK];\n"
    "                su[u] = usc[((long long)e * SR + (UROW + n0) / SBN) * SC + k / SBK];\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < NTILE; t++)\n"
    "                xb[u][t] = *reinterpret_cast<const uint4 *>(xr[t] + k);\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            if (NSTEP % U != 0 && s0 + u >= NSTEP)\n"
    "                break;\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < NTILE; t++) {\n"
    "                if constexpr (W8) {\n"
    "                    /* this chunk's products, times its blocks' scales */\n"
    "                    float pg[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pu[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    "                    moec_mma_bf16(pg, wa[u][0].x, wa[u][1].x, wa[u][0].y, wa[u][1].y, xb[u][t].x, xb[u][t].y);\n"
    "                    moec_mma_bf16(pg, wa[u][0].z, wa[u][1].z, wa[u][0].w, wa[u][1].w, xb[u][t].z, xb[u][t].w);\n"
    "                    moec_mma_bf16(pu, wa[u][2].x, wa[u][3].x, wa[u][2].y, wa[u][3].y, xb[u][t].x, xb[u][t].y);\n"
    "                    moec_mma_bf16(pu, wa[u][2].z, wa[u][3].z, wa[u][2].w, wa[u][3].w, xb[u][t].z, xb[u][t].w);\n"
    "#pragma unroll\n"
    "                    for (int i = 0; i < 4; i++) {\n"
    "                        ag[t][i] += sg[u] * pg[i];\n"
    "                        au[t][i] += su[u] * pu[i];\n"
    "                    }\n"
    "                } else {\n"
    "                    moec_mma_bf16(ag[t], wa[u][0].x, wa[u][1].x, wa[u][0].y, wa[u][1].y, xb[u][t].x, xb[u][t].y);\n"
    "                    moec_mma_bf16(ag[t], wa[u][0].z, wa[u][1].z, wa[u][0].w, wa[u][1].w, xb[u][t].z, xb[u][t].w);\n"
    "                    moec_mma_bf16(au[t], wa[u][2].x, wa[u][3].x, wa[u][2].y, wa[u][3].y, xb[u][t].x, xb[u][t].y);\n"
    "                    moec_mma_bf16(au[t], wa[u][2].z, wa[u][3].z, wa[u][2].w, wa[u][3].w, xb[u][t].z, xb[u][t].w);\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NTILE; t++)\n"
    "        moec_silu_mul_frag(hbuf, sorted + b * BM + t * 8, ND, n0, ag[t], au[t]);\n";

static const char MMA_DOWN_LOAD[] =
    "    const TH *hr[NTILE];\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NTILE; t++)\n"
    "        hr[t] = hbuf + (long long)(sl[t] >= 0 ? sl[t] : 0) * KD + q * 8;\n"
    "    const TW *db = wd + (long long)e * ND * KD;\n"
    "    const TW *d0 = db + moec_woff<TL, KD>(n0 + g, q * 8); /* in rows, as gate_up */\n"
    "    float acc[NTILE][4];\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NTILE; t++)\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < 4; i++)\n"
    "            acc[t][i] = 0.0f;\n"
    "    uint4 wa[U][2];\n"
    "    [[maybe_unused]] float sd[U];\n"
    "    /* the U chunks from s0 of the warp's 16 weight rows (and their scales) */\n"
    "    auto load_w = [&](int s0) {\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            if (NSTEP % U != 0 && s0 + u >= NSTEP)\n"
    "                break;\n"
    "            const long long k = (long long)(s0 + u) * 32;\n"
    "            if constexpr (TL) {\n"
    "                wa[u][0] = moec_ld8(db + moec_woff<TL, KD>(n0 + g, q * 8 + k));\n"
    "                wa[u][1] = moec_ld8(db + moec_woff<TL, KD>(n0 + g + 8, q * 8 + k));\n"
    "            } else {\n"
    "                wa[u][0] = moec_ld8(d0 + k);\n"
    "                wa[u][1] = moec_ld8(d0 + 8LL * KD + k);\n"
    "            }\n"
    "            if constexpr (W8)\n"
    "                sd[u] = dsc[((long long)e * SR + n0 / SBN) * SC + k / SBK];\n"
    "        }\n"
    "    };\n";

static const char MMA_DOWN_BODY[] =
    "#pragma unroll 1\n"
    "    for (int s0 = 0; s0 < NSTEP; s0 += U) {\n"
    "        if (!PRE || s0 > 0)\n"
    "            load_w(s0);\n"
    "        /* h: bf16 pairs (of f32 h: rounded here, as the bf16 h was stored) */\n"
    "        uint4 hb[U][NTILE];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            if (NSTEP % U != 0 && s0 + u >= NSTEP)\n"
    "                break;\n"
    "            const long long k = (long long)(s0 + u) * 32;\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < NTILE; t++) {\n"
    "                if constexpr (sizeof(TH) == 2) {\n"
    "                    hb[u][t] = *reinterpret_cast<const uint4 *>(hr[t] + k);\n"
    "                } else {\n"
    "                    const float4 h0 = *reinterpret_cast<const float4 *>(hr[t] + k);\n"
    "                    const float4 h1 = *reinterpret_cast<const float4 *>(hr[t] + k + 4);\n"
    "                    hb[u][t] = make_uint4(moec_pack_bf16(h0.x, h0.y), moec_pack_bf16(h0.z, h0.w),\n"
    "                                          moec_pack_bf16(h1.x, h1.y), moec_pack_bf16(h1.z, h1.w));\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++) {\n"
    "            if (NSTEP % U != 0 && s0 + u >= NSTEP)\n"
    "                break;\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < NTILE; t++) {\n"
    "                const unsigned b0 = hb[u][t].x, b1 = hb[u][t].y, b2 = hb[u][t].z, b3 = hb[u][t].w;\n"
    "                if constexpr (W8) {\n"
    "                    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    "                    moec_mma_bf16(p, wa[u][0].x, wa[u][1].x, wa[u][0].y, wa[u][1].y, b0, b1);\n"
    "                    moec_mma_bf16(p, wa[u][0].z, wa[u][1].z, wa[u][0].w, wa[u][1].w, b2, b3);\n"
    "#pragma unroll\n"
    "                    for (int i = 0; i < 4; i++)\n"
    "                        acc[t][i] += sd[u] * p[i];\n"
    "                } else {\n"
    "                    moec_mma_bf16(acc[t], wa[u][0].x, wa[u][1].x, wa[u][0].y, wa[u][1].y, b0, b1);\n"
    "                    moec_mma_bf16(acc[t], wa[u][0].z, wa[u][1].z, wa[u][0].w, wa[u][1].w, b2, b3);\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < NTILE; t++)\n"
    "        moec_down_frag<MULW>(y, sorted + b * BM + t * 8, ND, n0, acc[t], scale, wts);\n";

static const char SUM_BODY[] =
    "    const int t = blockIdx.x, h = (blockIdx.y * NT + threadIdx.x) * VE;\n"
    "    if (h >= H)\n"
    "        return;\n"
    "    float acc[VE];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < VE; j++)\n"
    "        acc[j] = 0.0f;\n"
    "    for (int k = 0; k < K; k++) {\n"
    "        const int e = ids[t * K + k] - E0;\n"
    "        if (e < 0 || e >= E)\n"
    "            continue;\n"
    "        float v[VE];\n"
    "        ldv<VE>(y + ((long long)t * K + k) * H + h, v);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < VE; j++)\n"
    "            acc[j] += v[j];\n"
    "    }\n"
    "    stv<VE>(out + (long long)t * H + h, acc);\n";

/* Rows of each expert block: the bucket's expected tokens per expert,
 * doubled for the skew of real routers, as a power of two in [1, 8]. */
static int rows_per_block(long long T, long long K, long long E)
{
    long long want = (2 * T * K + E - 1) / E;
    int bm = 1;
    while (bm < want && bm < 8)
        bm *= 2;
    return bm;
}

int cg_weight_tl(const cg_ctx *c, const ir_value *w)
{
    /* MOEC_FP8_ROWS_TIMING=1: tiled weights addressed as rows by the
       streaming and staged forms, the access pattern before tiles (the
       results are wrong: for timing only) */
    return c->opt && ir_weight_tiled(c->m, w, c->opt->fp8_tiles) &&
           !cg_env_int("MOEC_FP8_ROWS_TIMING", 0, 0, 1);
}

/* rows and columns per block, block rows per expert, block columns */
void cg_moe_scale_consts(const cg_ctx *c, const ir_value *w, long long urow, const char *names,
                         char *tag, size_t tcap, char *decl, size_t dcap)
{
    if (cg_storage(c, w) != IR_DTYPE_F8E4M3) {
        snprintf(tag, tcap, "%s", "");
        snprintf(decl, dcap,
                 "    constexpr bool W8 = false, TL = false;\n"
                 "    constexpr long long SBN = 1, SBK = 1, SR = 1, SC = 1, UROW = 0;\n"
                 "    [[maybe_unused]] const float %s;\n",
                 names);
        return;
    }
    const int64_t *b = w->scale.block, *dims = w->type.dims;
    int tl = cg_weight_tl(c, w);
    snprintf(tag, tcap, "_s%lldx%lld%s", (long long)b[0], (long long)b[1], tl ? "_tl" : "");
    snprintf(decl, dcap,
             "    constexpr bool W8 = true, TL = %s;\n"
             "    constexpr long long SBN = %lldLL, SBK = %lldLL, SR = %lldLL, SC = %lldLL, UROW = "
             "%lldLL;\n",
             tl ? "true" : "false", (long long)b[0], (long long)b[1],
             (long long)((dims[1] + b[0] - 1) / b[0]),
             (long long)((dims[2] + b[1] - 1) / b[1]), urow);
}

/* Whether an expert weight's codes can feed the tensor-core form: bf16, or
 * fp8 whose 16-row tiles (from row `urow`) and 32-wide k chunks each lie
 * in one scale block. */
static int mma_weight_ok(const cg_ctx *c, const ir_value *w, long long urow)
{
    ir_dtype dt = cg_storage(c, w);
    if (dt == IR_DTYPE_BF16)
        return 1;
    return dt == IR_DTYPE_F8E4M3 && w->scale.block[0] % 16 == 0 && urow % 16 == 0 &&
           w->scale.block[1] % 32 == 0;
}

/* The vector width of a row of n elements of an expert weight: an fp8
 * one's vectors must also lie in one block of scale columns. */
static int moe_vec_width(const cg_ctx *c, const ir_value *w, long long n)
{
    int ve = cg_vec_width(n);
    while (cg_storage(c, w) == IR_DTYPE_F8E4M3 && ve > 1 && w->scale.block[1] % ve)
        ve /= 2;
    return ve;
}

/* Whether the streaming form can read weight w (rows of n elements) 16
 * bytes a lane: rows in whole 16-byte vectors, an fp8 lane's 16 codes in
 * one column block, and bf16x2 arithmetic to widen them (sm_80). The
 * activation rows then come in whole vectors of as many elements. */
static int gv_weight_ok(const cg_ctx *c, const ir_value *w, long long n)
{
    ir_dtype dt = cg_storage(c, w);
    if (dt == IR_DTYPE_F8E4M3)
        return n % 16 == 0 && w->scale.block[1] % 16 == 0 && c->opt &&
               cg_arch_num(c->opt) >= 80;
    if (dt == IR_DTYPE_BF16 || dt == IR_DTYPE_F16)
        return n % 8 == 0;
    return dt == IR_DTYPE_F32 && n % 4 == 0;
}

/* Whether the tile-streaming form reads weight w: in fragment tiles, its
 * scale blocks whole tiles and chunks. */
static int gt_weight_ok(const cg_ctx *c, const ir_value *w)
{
    return cg_weight_tl(c, w) && ir_block_scale_tiles(w);
}

static moec_status oom(const cg_moe_desc *d)
{
    return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: no memory", ir_op_name(d->op->kind), d->out->name);
}

void cg_moe_gate_up_args(ir_step *s, const cg_moe_desc *d, const cg_moe_layout *l, int scales)
{
    int n = 0;
    s->args[n++] = cg_arg_act(d->x);
    s->args[n++] = cg_arg_act(d->gate);
    s->args[n++] = cg_arg_act(l->fused ? d->gate : d->up);
    if (scales) {
        s->args[n++] = cg_arg_scales(d->gate);
        s->args[n++] = cg_arg_scales(l->fused ? d->gate : d->up);
    }
    s->args[n++] = cg_arg_scratch(l->off_sorted);
    s->args[n++] = cg_arg_scratch(l->off_blk);
    s->args[n++] = cg_arg_scratch(l->off_used);
    s->args[n++] = cg_arg_scratch(l->off_h);
    s->n_args = n;
}

void cg_moe_down_args(ir_step *s, const cg_moe_desc *d, const cg_moe_layout *l, int scales)
{
    int n = 0;
    s->args[n++] = cg_arg_scratch(l->off_h);
    s->args[n++] = cg_arg_act(d->down);
    if (scales)
        s->args[n++] = cg_arg_scales(d->down);
    s->args[n++] = cg_arg_scratch(l->off_sorted);
    s->args[n++] = cg_arg_scratch(l->off_blk);
    s->args[n++] = cg_arg_scratch(l->off_used);
    if (d->w) {
        s->args[n++] = cg_arg_act(d->w);
        s->args[n++] = cg_arg_f32(d->scale);
        s->args[n++] = d->unsummed ? cg_arg_act(d->out) : cg_arg_scratch(l->off_y);
    } else {
        s->args[n++] = cg_arg_act(d->out);
    }
    s->n_args = n;
}

/* The CUDA-core and tensor-core forms of the GEMMs. */
enum { FORM_SIMT, FORM_MMA, FORM_GV, FORM_GT };

/* A GEMM step's shape: warps a block, rows a warp, a block's rows (their
 * product; the tile-streaming form's warps share one tile), the streaming
 * forms' chunks in flight, the kernel-name tag. */
typedef struct moe_shape {
    int warps, rows, bn, u, cvt;
    int rt, kw; /* the tile-streaming form's tiles a warp, warps over K */
    char tag[40];
} moe_shape;

/* Whether the streaming forms widen weight w's fp8 codes by the conversion
 * unit (sm_89 and later) */
static int moe_cvt(const cg_ctx *c, const ir_value *w)
{
    return cg_storage(c, w) == IR_DTYPE_F8E4M3 && c->opt && cg_arch_num(c->opt) >= 89 &&
           cg_env_int("MOEC_MOE_GEMV_CVT", GV_CVT, 0, 1);
}

/* The shape of form `form` for gate_up's GEMM, or down's (down), over k of
 * kd elements of weight w in blocks of bm slots: the first form's rows a
 * warp (gate_up 4, down 8), the streaming form's (MOEC_MOE_GEMV_RW, GV_RW;
 * MOEC_MOE_GEMV_RWD, GV_RWD or at one slot GV_RWD_BM1), the tensor-core
 * form's chunks in flight (MOEC_MOE_MMA_U, MMA_UNROLL; MOEC_MOE_MMA_DN_U,
 * MMA_DN_U). The streaming form takes U chunks at a time, evened out over
 * the row's chunks (6 chunks at U 4: two rounds of 3). */
static moe_shape moe_shape_of(const cg_ctx *c, int form, int down, const ir_value *w,
                              long long kd, int bm)
{
    moe_shape sh = {0};
    if (form == FORM_MMA) {
        sh.warps = cg_env_int("MOEC_MOE_MMA_WARPS", MMA_WARPS, 1, 8);
        sh.rows = 16;
        sh.u = down ? cg_env_int("MOEC_MOE_MMA_DN_U", MMA_DN_U, 1, 8)
                    : cg_env_int("MOEC_MOE_MMA_U", MMA_UNROLL, 1, 8);
        snprintf(sh.tag, sizeof sh.tag, "mma_w%d_u%d", sh.warps, sh.u);
    } else if (form == FORM_GT) {
        sh.warps = down ? cg_env_int("MOEC_MOE_GT_DN_WARPS", GT_DN_WARPS, 1, 8)
                        : cg_env_int("MOEC_MOE_GT_WARPS", GT_WARPS, 1, 8);
        sh.u = down ? cg_env_int("MOEC_MOE_GT_DN_U", GT_DN_U, 1, 8)
                    : cg_env_int("MOEC_MOE_GT_U", GT_U, 1, 8);
        /* tiles a warp and the warps that share a group's K (the rest
           of the block's warps take the next groups' rows) */
        sh.rt = down ? cg_env_int("MOEC_MOE_GT_DN_RT", GT_DN_RT, 1, 4)
                     : cg_env_int("MOEC_MOE_GT_RT", c->T >= GT_RT2_T ? 2 : 1, 1, 4);
        sh.kw = down ? cg_env_int("MOEC_MOE_GT_DN_KW", 0, 0, 8)
                     : cg_env_int("MOEC_MOE_GT_KW", 0, 0, 8);
        if (!sh.kw || sh.kw > sh.warps || sh.warps % sh.kw)
            sh.kw = sh.warps;
        sh.rows = 16;
        sh.bn = 16 * sh.rt * (sh.warps / sh.kw);
        sh.cvt = moe_cvt(c, w);
        char grp[24] = "";
        if (sh.rt > 1 || sh.kw < sh.warps)
            snprintf(grp, sizeof grp, "_rt%d_kw%d", sh.rt, sh.kw);
        snprintf(sh.tag, sizeof sh.tag, "gt_w%d_u%d%s%s", sh.warps, sh.u, grp,
                 sh.cvt ? "_cvt" : "");
    } else if (form == FORM_GV) {
        long long kstep = 32 * (16 / (long long)ir_dtype_size(cg_storage(c, w)));
        long long nch = (kd + kstep - 1) / kstep;
        int u = cg_env_int("MOEC_MOE_GEMV_U", GV_U, 1, 8);
        if (u > nch)
            u = (int)nch;
        long long rounds = (nch + u - 1) / u;
        sh.warps = cg_env_int("MOEC_MOE_GEMV_WARPS", GV_WARPS, 1, 8);
        sh.rows = down ? cg_env_int("MOEC_MOE_GEMV_RWD", bm == 1 ? GV_RWD_BM1 : GV_RWD, 1, 16)
                       : cg_env_int("MOEC_MOE_GEMV_RW", GV_RW, 1, 16);
        sh.u = (int)((nch + rounds - 1) / rounds);
        sh.cvt = moe_cvt(c, w);
        snprintf(sh.tag, sizeof sh.tag, "gv_w%d_r%d_u%d%s", sh.warps, sh.rows, sh.u,
                 sh.cvt ? "_cvt" : "");
    } else {
        sh.warps = MOE_WARPS;
        sh.rows = down ? 8 : 4;
        snprintf(sh.tag, sizeof sh.tag, "rw%d", sh.rows);
    }
    if (!sh.bn)
        sh.bn = sh.warps * sh.rows;
    return sh;
}

ir_step *cg_moe_gemm_step(cg_ctx *c, const cg_moe_desc *d, const cg_moe_layout *l, int k, int nw,
                          long long rows, long long nd, size_t smem)
{
    ir_step *s = cg_step(c, IR_STEP_KERNEL, d->op);
    if (!s)
        return NULL;
    s->kernel = k;
    s->grid[0] = (unsigned)l->nb;
    s->grid[1] = (unsigned)((nd + rows - 1) / rows);
    s->block[0] = (unsigned)nw * 32;
    s->smem = (unsigned)smem;
    return s;
}

/* (2) gate_up with silu_mul into h (f32), on CUDA cores (first form: 4
 * rows of gate and of up a warp, fewer measured slower at BM = 8 too: the
 * GEMMs are bound by issue there, not by registers; or streaming), or on
 * tensor cores. */
static moec_status emit_gate_up(cg_ctx *c, const cg_moe_desc *d, const cg_moe_layout *l, int form)
{
    const char *opname = ir_op_name(d->op->kind);
    long long H = l->H, K = l->K, E = l->E, I = l->I;
    int bm = l->bm, fused = l->fused, T = c->T, is_new = 0, mma = form == FORM_MMA;
    char name[200];
    ir_dtype xdt = cg_storage(c, d->x), gdt = cg_storage(c, d->gate);
    int g8 = gdt == IR_DTYPE_F8E4M3;
    int ve_h = moe_vec_width(c, d->gate, H);
    if (!fused && moe_vec_width(c, d->up, H) < ve_h)
        ve_h = moe_vec_width(c, d->up, H);
    char gtag[40], gdecl[400];
    cg_moe_scale_consts(c, d->gate, fused ? I : 0, "*gsc = nullptr, *usc = nullptr", gtag,
                        sizeof gtag, gdecl, sizeof gdecl);
    long long gstride = (fused ? 2 : 1) * I * H, uoff = fused ? I * H : 0;
    moe_shape sh = moe_shape_of(c, form, 0, d->gate, H, bm);
    snprintf(name, sizeof name, "moe_gate_up_e%lld_k%lld_h%lld_i%lld_bm%d_%s_t%d_%s_%s_%s%s%s", E,
             K, H, I, bm, sh.tag, T, ir_dtype_name(xdt), ir_dtype_name(gdt),
             fused ? "fused" : "split", gtag, l->h16 ? "_h16" : "");
    int k2 = cg_kernel(c, name, &is_new);
    if (k2 < 0)
        return oom(d);
    if (is_new) {
        moec_buf_printf(&c->src,
                      "// %s: gate_up GEMM with silu_mul%s (codegen/moe_routed.c, cg_moe_emit)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s *__restrict__ x, "
                      "const %s *__restrict__ wg, const %s *__restrict__ wu, %sconst int *__restrict__ "
                      "sorted, const int *__restrict__ blk_expert, const int *__restrict__ n_used, "
                      "%s *__restrict__ hbuf)\n{\n"
                      "    typedef %s TX;\n    typedef %s TW;\n"
                      "    constexpr int K = %lld, KD = %lld, ND = %lld, BM = %d, NW = %d;\n"
                      "    constexpr long long GSTRIDE = %lldLL, USTRIDE = %lldLL, UOFF = %lldLL;\n%s",
                      opname, mma ? " on tensor cores" : "", sh.warps * 32, name, cg_ctype(xdt),
                      cg_ctype(gdt), cg_ctype(gdt),
                      g8 ? "const float *__restrict__ gsc, const float *__restrict__ usc, " : "",
                      l->h16 ? "__nv_bfloat16" : "float", cg_ctype(xdt), cg_ctype(gdt), K, H, I, bm,
                      sh.warps, gstride, gstride, uoff,
                      gdecl);
        if (mma)
            moec_buf_printf(&c->src, "    constexpr int U = %d;\n%s%s}\n\n", sh.u, MMA_HEAD,
                          MMA_GATE_UP_BODY);
        else if (form == FORM_GV)
            moec_buf_printf(&c->src,
                          "    constexpr int RW = %d, U = %d;\n"
                          "    constexpr bool PRE = false, CVT8 = %s;\n"
                          "%s%s%s%s%s%s%s%s}\n\n",
                          sh.rows, sh.u, sh.cvt ? "true" : "false", GV_CONSTS, GEMM_HEAD,
                          GV_ROWS, GV_GATE_UP_IN, GV_BODY, STREAM_LOOP, GV_GATE_UP_OUT, GATE_UP_END);
        else if (form == FORM_GT)
            moec_buf_printf(&c->src,
                          "    constexpr int RT = %d, KW = %d, BN = %d, RW = 0, U = %d;\n"
                          "    constexpr bool PRE = false, CVT8 = %s;\n"
                          "%s%s%s%s%s%s}\n\n",
                          sh.rt, sh.kw, sh.bn, sh.u, sh.cvt ? "true" : "false", GEMM_HEAD,
                          GV_GATE_UP_IN, GT_BODY,
                          STREAM_LOOP, GT_RED, GT_GATE_UP_END);
        else
            moec_buf_printf(&c->src, "    constexpr int RW = %d, VE = %d;\n%s%s%s%s}\n\n", sh.rows,
                          ve_h, GEMM_CONSTS, GEMM_HEAD, GATE_UP_BODY, GATE_UP_END);
    }
    ir_step *s = cg_moe_gemm_step(c, d, l, k2, sh.warps, sh.bn, I, 0);
    if (!s)
        return oom(d);
    cg_moe_gate_up_args(s, d, l, g8);
    return MOEC_OK;
}

/* (3) down, times the router weight and scale when routed: 8 rows a warp
 * on CUDA cores (first form), streaming, or on tensor cores. */
static moec_status emit_down(cg_ctx *c, const cg_moe_desc *d, const cg_moe_layout *l, int form)
{
    const char *opname = ir_op_name(d->op->kind);
    long long H = l->H, K = l->K, E = l->E, I = l->I;
    int bm = l->bm, T = c->T, is_new = 0, mma = form == FORM_MMA;
    char name[200];
    ir_dtype ddt = cg_storage(c, d->down), odt = cg_storage(c, d->out);
    int d8 = ddt == IR_DTYPE_F8E4M3;
    int ve_i = moe_vec_width(c, d->down, I);
    char dtag[40], ddecl[400];
    cg_moe_scale_consts(c, d->down, 0, "*dsc = nullptr", dtag, sizeof dtag, ddecl, sizeof ddecl);
    ir_dtype ydt = d->w ? IR_DTYPE_F32 : odt;
    ir_dtype wdt = d->w ? cg_storage(c, d->w) : IR_DTYPE_F32;
    moe_shape sh = moe_shape_of(c, form, 1, d->down, I, bm);
    /* the first chunks' weights loaded before the wait (MOEC_MOE_DOWN_PRE=0:
       after it, for A/B runs) */
    int pre = form != FORM_SIMT && cg_env_int("MOEC_MOE_DOWN_PRE", 1, 0, 1);
    snprintf(name, sizeof name, "moe_down_e%lld_k%lld_h%lld_i%lld_bm%d_%s_t%d_%s_%s_%s%s%s%s", E,
             K, H, I, bm, sh.tag, T, ir_dtype_name(ddt), ir_dtype_name(ydt), d->w ? "w" : "now",
             dtag, l->h16 ? "_h16" : "", pre ? "_pre" : "");
    int k3 = cg_kernel(c, name, &is_new);
    if (k3 < 0)
        return oom(d);
    if (is_new) {
        moec_buf_printf(&c->src,
                      "// %s: down GEMM%s%s (codegen/moe_routed.c, cg_moe_emit)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s *__restrict__ "
                      "hbuf, const %s *__restrict__ wd, %sconst int *__restrict__ sorted, const int "
                      "*__restrict__ blk_expert, const int *__restrict__ n_used, ",
                      opname, d->w ? " times scale * router weight" : "",
                      mma ? " on tensor cores" : "", sh.warps * 32, name,
                      l->h16 ? "__nv_bfloat16" : "float", cg_ctype(ddt),
                      d8 ? "const float *__restrict__ dsc, " : "");
        if (d->w)
            moec_buf_printf(&c->src, "const %s *__restrict__ wts, float scale, ", cg_ctype(wdt));
        moec_buf_printf(&c->src,
                      "%s *__restrict__ y)\n{\n"
                      "    typedef %s TW;\n    typedef %s TH;\n"
                      "    constexpr int KD = %lld, ND = %lld, BM = %d, NW = %d;\n"
                      "    constexpr bool MULW = %s;\n%s",
                      cg_ctype(ydt), cg_ctype(ddt), l->h16 ? "__nv_bfloat16" : "float", I, H, bm,
                      sh.warps, d->w ? "true" : "false", ddecl);
        if (!d->w)
            moec_buf_printf(&c->src, "    const float *wts = nullptr, scale = 0.0f;\n"
                                   "    (void)wts;\n    (void)scale;\n");
        if (mma)
            moec_buf_printf(&c->src, "    constexpr int U = %d;\n    constexpr bool PRE = %s;\n%s%s%s%s}\n\n",
                          sh.u, pre ? "true" : "false", MMA_HEAD, MMA_DOWN_LOAD,
                          pre ? DOWN_PRE : "", MMA_DOWN_BODY);
        else if (form == FORM_GV)
            moec_buf_printf(&c->src,
                          "    constexpr int RW = %d, U = %d;\n"
                          "    constexpr bool PRE = %s, CVT8 = %s;\n"
                          "%s%s%s%s%s%s%s%s%s}\n\n",
                          sh.rows, sh.u, pre ? "true" : "false", sh.cvt ? "true" : "false",
                          GV_CONSTS, GEMM_HEAD, GV_ROWS,
                          GV_DOWN_IN, GV_BODY, pre ? DOWN_PRE : "", STREAM_LOOP, GV_DOWN_OUT, DOWN_END);
        else if (form == FORM_GT)
            moec_buf_printf(&c->src,
                          "    constexpr int RT = %d, KW = %d, BN = %d, RW = 0, U = %d;\n"
                          "    constexpr bool PRE = %s, CVT8 = %s;\n"
                          "%s%s%s%s%s%s%s}\n\n",
                          sh.rt, sh.kw, sh.bn, sh.u, pre ? "true" : "false",
                          sh.cvt ? "true" : "false", GEMM_HEAD,
                          GV_DOWN_IN, GT_BODY, pre ? GT_PRE : "", STREAM_LOOP, GT_RED,
                          GT_DOWN_END);
        else
            moec_buf_printf(&c->src, "    constexpr int RW = %d, VE = %d;\n%s%s%s%s}\n\n", sh.rows,
                          ve_i, GEMM_CONSTS, GEMM_HEAD, DOWN_BODY, DOWN_END);
    }
    ir_step *s = cg_moe_gemm_step(c, d, l, k3, sh.warps, sh.bn, H, 0);
    if (!s)
        return oom(d);
    cg_moe_down_args(s, d, l, d8);
    return MOEC_OK;
}

/* The expert blocks of d's bucket: rows per block, the tensor-core forms
 * (mma: CUDA-core GEMM bodies on tensor cores; tc: the staged fp8 kernels
 * of codegen/fp8_tc.c) and the blocks' count (an upper bound: the align
 * kernel writes the count used). */
static void moe_blocks(const cg_ctx *c, const cg_moe_desc *d, int *bm_out, int *mma_out,
                       int *tc_out, long long *nb_out)
{
    long long H = d->x->type.dims[1], K = d->ids->type.dims[1], E = d->down->type.dims[0],
              I = d->down->type.dims[2];
    int fused = d->up == NULL, T = c->T;
    ir_dtype xdt = cg_storage(c, d->x);
    long long N = (long long)T * K;
    int bm = rows_per_block(T, K, E);
    /* tensor cores for bf16 once CUDA-core blocks would hold four or more
       rows (one or two rows per block stream near the copy bandwidth on
       CUDA cores already); BM is then 8, or 16 when experts average more
       than MMA_BM16_MEAN slots: one or two 8-column tiles, since a product
       costs the same for 1 or 8 columns */
    int mode = c->opt ? c->opt->moe_kernel : CG_MOE_AUTO;
    long long urow = fused ? I : 0;
    int mma_ok = xdt == IR_DTYPE_BF16 && mma_weight_ok(c, d->gate, urow) &&
                 (fused || mma_weight_ok(c, d->up, 0)) && mma_weight_ok(c, d->down, 0) &&
                 H % 32 == 0 && I % 32 == 0 && mode != CG_MOE_SIMT;
    int mma = mma_ok && (mode == CG_MOE_MMA ||
                         bm >= cg_env_int("MOEC_MOE_MMA_MIN_BM", MMA_MIN_BM, 1, 1024));
    if (mma)
        bm = T * K > (long long)cg_env_int("MOEC_MOE_MMA_BM16", MMA_BM16_MEAN, 1, 1 << 20) * E ? 16
                                                                                          : 8;
    /* fp8 experts: the tensor-core kernels that stage x and h in shared
       memory (codegen/fp8_tc.c) where the shapes allow, from blocks of
       FP8_TC_MIN_BM rows (CG_FP8_TC: at every bucket; CG_FP8_OLD: never) */
    int f8mode = c->opt ? c->opt->fp8_kernel : CG_FP8_AUTO;
    int tc_bm = f8mode == CG_FP8_OLD || mode == CG_MOE_SIMT ? 0 : cg_fp8_tc_moe_rows(c, d, urow);
    int tc = tc_bm > 0 &&
             (mma || f8mode == CG_FP8_TC ||
              (mma_ok && bm >= cg_env_int("MOEC_MOE_FP8_TC_MIN_BM", FP8_TC_MIN_BM, 1, 1024)));
    if (tc) {
        bm = tc_bm;
        mma = 0;
    }
    long long nnz = N < E ? N : E;
    *nb_out = (N + (long long)(bm - 1) * nnz + bm - 1) / bm;
    *bm_out = bm;
    *mma_out = mma;
    *tc_out = tc;
}

moec_status cg_moe_emit(cg_ctx *c, const cg_moe_desc *d)
{
    const char *opname = ir_op_name(d->op->kind), *who = d->out->name;
    const ir_type *tx = &d->x->type, *ti = &d->ids->type, *tg = &d->gate->type,
                  *td = &d->down->type;
    if (tx->rank != 2 || ti->rank != 2 || tg->rank != 3 || td->rank != 3)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: wants x [T, H], ids [T, K], gate_up [E, 2I, H] (or gate and up "
                        "[E, I, H]), down [E, H, I]",
                        opname, who);
    long long H = tx->dims[1], K = ti->dims[1], E = td->dims[0], I = td->dims[2];
    int fused = d->up == NULL;
    if (td->dims[1] != H || tg->dims[0] != E || tg->dims[1] != (fused ? 2 * I : I) ||
        tg->dims[2] != H || (!fused && !ir_type_equal(&d->up->type, tg)) || K < 1 || E < 1 ||
        H < 1 || I < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: expert weights do not agree with x [T, %lld] and down [E, H, I]",
                        opname, who, H);
    if (d->w && (d->w->type.rank != 2 || d->w->type.dims[1] != K))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: weights %%%s must be [T, %lld]", opname,
                        who, d->w->name, K);
    if (cg_storage(c, d->ids) != IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: ids %%%s must be i32", opname, who,
                        d->ids->name);
    ir_dtype gdt = cg_storage(c, d->gate), odt = cg_storage(c, d->out);
    if (!fused && (cg_storage(c, d->up) != gdt ||
                   d->up->scale.block[0] != d->gate->scale.block[0] ||
                   d->up->scale.block[1] != d->gate->scale.block[1]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: gate and up must be stored alike (dtype and scale blocks)",
                        opname, who);
    if (E > 8192)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s %%%s: %lld experts (at most 8192)", opname, who,
                        E);
    int bm, mma, tc;
    long long nb;
    moe_blocks(c, d, &bm, &mma, &tc, &nb);
    long long N = (long long)c->T * K;
    /* the streaming form for the CUDA-core GEMMs of small blocks, each
       GEMM where its rows come in whole 16-byte vectors */
    int gv = !mma && !tc && cg_env_int("MOEC_MOE_GEMV", 1, 0, 1) &&
             bm <= cg_env_int("MOEC_MOE_GEMV_MAX_BM", GV_MAX_BM, 1, 8);
    int form_gu = mma ? FORM_MMA : FORM_SIMT, form_dn = form_gu;
    if (gv && gv_weight_ok(c, d->gate, H) && (fused || gv_weight_ok(c, d->up, H)))
        form_gu = gt_weight_ok(c, d->gate) ? FORM_GT : FORM_GV;
    if (gv && gv_weight_ok(c, d->down, I))
        form_dn = gt_weight_ok(c, d->down) ? FORM_GT : FORM_GV;

    /* the moe_topk before this op aligned the slots already (it reserved
       their scratch; h and y go past it) */
    int aligned = c->moe_aligned == d->op->id + 1;
    size_t off_sorted, off_blk, off_used;
    if (aligned) {
        off_sorted = c->moe_align_off[0];
        off_blk = c->moe_align_off[1];
        off_used = c->moe_align_off[2];
        int s = c->stream == 1;
        if (c->scratch_cur[s] < c->moe_align_off[3])
            c->scratch_cur[s] = c->moe_align_off[3];
        c->moe_aligned = 0;
    } else {
        off_sorted = cg_scratch(c, (size_t)(nb * bm) * 4);
        off_blk = cg_scratch(c, (size_t)nb * 4);
        off_used = cg_scratch(c, 4);
    }
    /* h: f32, bf16 for the tensor-core kernels (which round it to bf16 for
       their products anyway: the same values, half the bytes read;
       MOEC_MOE_MMA_H16=0 keeps f32 for the bf16 ones, for comparisons) */
    int h16 = tc || (mma && cg_env_int("MOEC_MOE_MMA_H16", 1, 0, 1));
    size_t off_h = cg_scratch(c, (size_t)(N * I) * (h16 ? 2 : 4));
    size_t off_y = d->w && !d->unsummed ? cg_scratch(c, (size_t)(N * H) * 4) : 0;
    cg_moe_layout lay = {.H = H, .K = K, .E = E, .I = I, .nb = nb, .bm = bm, .fused = fused,
                         .h16 = h16, .off_sorted = off_sorted, .off_blk = off_blk, .off_used = off_used,
                         .off_h = off_h, .off_y = off_y};
    char name[200];
    int is_new = 0;
    long long e0 = d->e0;
    char shard[32] = "";
    if (e0)
        snprintf(shard, sizeof shard, "_s%lld", e0);
    int T = c->T;
    if (!aligned) {
        /* (1) align */
        snprintf(name, sizeof name, "moe_align_e%lld%s_k%lld_bm%d_t%d", E, shard, K, bm, T);
        int k1 = cg_kernel(c, name, &is_new);
        if (k1 < 0)
            return oom(d);
        if (is_new) {
            moec_buf_printf(&c->src,
                          "// %s: align, slots sorted by expert and padded to blocks of BM "
                          "(codegen/moe_routed.c, cg_moe_emit)\n"
                          "extern \"C\" __global__ void __launch_bounds__(%d) %s(const int *__restrict__ "
                          "ids, int *__restrict__ sorted, int *__restrict__ blk_expert, int *__restrict__ "
                          "n_used)\n{\n"
                          "    constexpr int E = %lld, E0 = %lld, K = %lld, T = %d, BM = %d, NB = %lld, "
                          "NT = %d;\n",
                          opname, ALIGN_THREADS, name, E, e0, K, T, bm, nb, ALIGN_THREADS);
            moec_buf_printf(&c->src, "%s}\n\n", CG_MOE_ALIGN_BODY);
        }
        ir_step *s = cg_step(c, IR_STEP_KERNEL, d->op);
        if (!s)
            return oom(d);
        s->kernel = k1;
        s->block[0] = ALIGN_THREADS;
        s->n_args = 4;
        s->args[0] = cg_arg_act(d->ids);
        s->args[1] = cg_arg_scratch(off_sorted);
        s->args[2] = cg_arg_scratch(off_blk);
        s->args[3] = cg_arg_scratch(off_used);
    }
    /* (2) gate_up with silu_mul, (3) down */
    MOEC_TRY(tc ? cg_fp8_tc_moe_gate_up(c, d, &lay) : emit_gate_up(c, d, &lay, form_gu));
    MOEC_TRY(tc ? cg_fp8_tc_moe_down(c, d, &lay) : emit_down(c, d, &lay, form_dn));
    /* unsummed: the add_rms_norm that reads the result sums it */
    if (!d->w || d->unsummed)
        return MOEC_OK;

    /* (4) sum over k */
    int ve = cg_vec_width(H);
    snprintf(name, sizeof name, "moe_sum_e%lld%s_k%lld_h%lld_t%d_%s", E, shard, K, H, T,
             ir_dtype_name(odt));
    int k4 = cg_kernel(c, name, &is_new);
    if (k4 < 0)
        return oom(d);
    if (is_new) {
        moec_buf_printf(&c->src,
                      "// %s: sum of the weighted expert outputs over k (codegen/moe_routed.c, "
                      "cg_moe_emit)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const float *__restrict__ "
                      "y, const int *__restrict__ ids, %s *__restrict__ out)\n{\n"
                      "    constexpr int E = %lld, E0 = %lld, K = %lld, H = %lld, VE = %d, NT = %d;\n",
                      opname, SUM_THREADS, name, cg_ctype(odt), E, e0, K, H, ve, SUM_THREADS);
        moec_buf_printf(&c->src, "%s}\n\n", SUM_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, d->op);
    if (!s)
        return oom(d);
    s->kernel = k4;
    s->grid[0] = (unsigned)T;
    s->grid[1] = (unsigned)((H + (long long)SUM_THREADS * ve - 1) / ((long long)SUM_THREADS * ve));
    s->block[0] = SUM_THREADS;
    s->n_args = 3;
    s->args[0] = cg_arg_scratch(off_y);
    s->args[1] = cg_arg_act(d->ids);
    s->args[2] = cg_arg_act(d->out);
    return MOEC_OK;
}

static cg_moe_desc routed_desc(const ir_op *op)
{
    cg_moe_desc d = {
        .op = op,
        .x = op->in[0],
        .ids = op->in[1],
        .w = op->in[2],
        .gate = op->in[3],
        .up = op->n_in == 6 ? op->in[4] : NULL,
        .down = op->in[op->n_in - 1],
        .out = op->out[0],
        .scale = ir_op_attr_float(op, "scale", 1.0),
        .e0 = ir_op_attr_int(op, "expert_start", 0),
        .unsummed = ir_op_attr_int(op, "unsummed", 0) != 0,
    };
    return d;
}

const ir_op *cg_moe_topk_routed(const cg_ctx *c, const ir_op *topk, int max_t, int *bm,
                               long long *nb)
{
    const ir_module *m = c->m;
    if (c->T > max_t || topk->kind != IR_OP_MOE_TOPK || topk->n_out != 2 ||
        !cg_env_int("MOEC_MOE_TOPK_ALIGN", 1, 0, 1))
        return NULL;
    const ir_op *r = ir_module_single_user(m, topk->out[0]);
    if (!r || r->kind != IR_OP_MOE_ROUTED || (r->n_in != 5 && r->n_in != 6) ||
        ir_module_single_user(m, topk->out[1]) != r || r->in[1] != topk->out[0] ||
        r->in[2] != topk->out[1] || r->stream != topk->stream || r->id <= topk->id)
        return NULL;
    /* nothing between them on their stream uses its scratch */
    for (int k = topk->id + 1; k < r->id; k++)
        if (m->ops[k]->stream == topk->stream)
            return NULL;
    cg_moe_desc d = routed_desc(r);
    if (d.e0 != 0 || d.down->type.rank != 3 || d.x->type.rank != 2 || d.ids->type.rank != 2 ||
        d.down->type.dims[0] != topk->in[0]->type.dims[1])
        return NULL;
    int mma, tc;
    moe_blocks(c, &d, bm, &mma, &tc, nb);
    return r;
}

moec_status cg_emit_moe_routed(cg_ctx *c, const ir_op *op)
{
    if (op->n_in != 5 && op->n_in != 6)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moe_routed %%%s: %d operands (5 or 6)",
                        op->out[0]->name, op->n_in);
    cg_moe_desc d = routed_desc(op);
    if (d.unsummed && cg_storage(c, d.out) != IR_DTYPE_F32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moe_routed %%%s: unsummed, but stored as %s, not f32",
                        d.out->name, ir_dtype_name(cg_storage(c, d.out)));
    return cg_moe_emit(c, &d);
}
