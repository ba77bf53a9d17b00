/* mla_attention.c — MLA decode attention over the compressed paged cache
 * (docs/IR.md, mla_attention): the cache holds only kv_c [r] and k_pe [dr]
 * per position; logits are scale * (q_c . kv_c[p] + q_pe . k_pe[p]) and the
 * values are kv_c[p] itself. Kernels: the cache write of this step's rows
 * (none for padding tokens; no kernel at all when the MLA prologue op that
 * computes kv_c and k_pe writes them, codegen/mla_prologue.c), then
 * attention. Every head of a token reads the same cache rows, so one block
 * takes one token and a group of heads: each tile of positions is read from
 * the cache once into shared memory and serves all the block's heads, with
 * an online softmax in fp32. In bf16 with heads in sixteens the products
 * run on tensor cores (16 heads per block, tiles double-buffered, brought
 * by bulk copies on sm_90 and by cp.async before it); otherwise on CUDA
 * cores (one thread per (head, position) for the scores, each thread a few
 * heads by a few channels for the output).
 * In the tensor-core form a block looks up its rows and loads its first
 * tiles before the programmatic wait where no kernel of the step writes
 * them (MLA_EARLY), and the softmax weights are 2^x in units of log2
 * (MLA_EX2).
 * When the bucket has too few blocks to fill the GPU (decode), the sequence
 * is split over blocks too, and the splits are merged by the last block of
 * each group to finish (tensor-core form; moec_attn_arrive_merge) or by a
 * third kernel. With
 * DeepSeek-V3.2's token selection (operand sel, from dsa_topk) the same
 * kernels read only the selected positions' cache rows: tile i of a token
 * holds sel[t][i * PT ...] instead of positions lo + i * PT on (KSEL, the
 * selection's width, is 0 in the dense kernels). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/attn_common.h"
#include "codegen/cg.h"
#include "err.h"

#define MLA_THREADS 256
#define MLA_SMEM_MAX (46 * 1024)
/* The tensor-core kernel: warps (MOEC_MLA_WARPS=16 for A/B runs), and
 * positions per tile. */
#define MMA_WARPS 8
#define MMA_PT 32
/* The tensor-core kernel's tiles by bulk copies (sm_90's TMA: two a row,
 * by one thread) instead of 16-byte cp.async by every thread
 * (MOEC_MLA_TMA=0|1 overrides it). (H100, 2026-11-24, V2-Lite step at
 * batch 1 / 32 / 64, three calls: 2.495 -> 2.512, 13.094 -> 12.921, 14.188
 * -> 14.213; 2.497 -> 2.508, 13.062 -> 12.873, 14.212 -> 14.207; at 32 / 64
 * 13.009 -> 12.996, 14.166 -> 14.160. 16-position tiles in 3 or 4 buffers
 * were slower, 14.372 / 14.396 at 64, and in 2 buffers at 3 blocks a SM,
 * 14.222.) */
#define MLA_TMA 1
/* ... and its tile buffers (MOEC_MLA_NBUF, 2 to 4; MOEC_MLA_PT=16|32 sets
 * the positions per tile): NBUF - 1 tiles in flight while one is used. */
#define MMA_NBUF 2
/* ... its online softmax with 16 / NW rows a warp at once, a row's
   maxima and sums over its lanes only, and no rescale of the outputs
   where no row's maximum moved (MOEC_MLA_SM2=0: a row a warp at a time,
   always rescaled). (H200, 2026-11-29: Nsight Compute at V2-Lite's 32
   tokens had the softmax at 22% of the stall samples, 0.44 eligible warps
   a scheduler; V2-Lite's whole step in one call, batch 1 / 32 / 64: 1.841
   / 9.223 / 10.174 ms against 1.849 / 9.251 / 10.222 with SM2=0. The
   scores' products in two chains of the even and odd k steps as well were
   level, 1.841 / 9.213 / 10.174: not kept.) */
#define MLA_SM2 1
/* ... and its scores' column tiles a warp: two, sharing each of q's
   fragments, in twice as many parts of k (half the loads of q from shared
   memory, the largest share of its ldmatrix); MOEC_MLA_CT=1: one. (H200,
   2026-11-29, V2-Lite's whole step in one call, batch 1 / 32 / 64: 1.844
   / 9.438 / 10.387 ms against 1.848 / 9.474 / 10.448 with one.) */
#define MLA_CT 2
/* ... and each warp's k steps of the scores unrolled whole from shared
   addresses taken once, where its part of k holds whole steps (V2-Lite's
   and V3's 36 over 4 or 2 parts; MOEC_MLA_QK2=0: a loop unrolled by 4 whose loads
   convert each step's generic address; Nsight Compute at V2-Lite's 64
   tokens had IMAD at 18.7% of the kernel's instructions). 67 registers
   against 70 (ptxas, sm_90). (H200, 2026-11-30, V2-Lite's whole step in
   one call, batch 1 / 32 / 64: bf16 1.836 / 8.990 / 9.852 ms against
   1.843 / 8.999 / 9.862, fp8 1.453 / 5.686 / 6.951 against 1.455 / 5.689
   / 6.949: level to 0.4% faster.) */
#define MLA_QK2 1
/* ... its softmax weights by the special function unit's 2^x alone
   (moec_ex2), the scores and maxima in units of log2 (MOEC_MLA_EX2=0:
   expf, about 8 instructions a weight; Nsight Compute at V2-Lite's 64
   tokens had the softmax at 23% of the stall samples, 34% of the
   instructions, the bulk copies' issue at 22%) ... */
#define MLA_EX2 1
/* ... and its first tiles loaded before the wait where no kernel of the
   step writes their rows (MOEC_MLA_EARLY=0: after it), in buckets of up to
   MLA_EARLY_MAX_T tokens (a warp scans the step's tokens). (H200,
   2026-11-30, V2-Lite's whole step in one call, batch 1 / 8 / 32 / 64:
   bf16 1.810 / 5.352 / 8.979 / 9.798 ms with both, 1.813 / 5.351 / 8.989
   / 9.802 early alone, 1.834 / 5.348 / 9.012 / 9.855 with neither; fp8
   1.452 / 3.579 / 5.460 / 6.552 against 1.475 / 3.585 / 5.518 / 6.620.
   The kernel timeline: 3.36 against 4.30 us a layer at batch 1 in fp8,
   28.6 against 30.6 at 64 in bf16. With them, fewer or smaller splits at
   1 to 4 tokens were still slower: fp8 1.472 / 1.910 / 2.680 ms with
   half the splits, 1.477 / 1.903 / 2.677 so in 3 buffers, 1.482 / 1.855
   / 2.576 with 16-position tiles in 3, against 1.452 / 1.821 / 2.544.) */
#define MLA_EARLY 1
#define MLA_EARLY_MAX_T 64
/* Measured and taken out: three barriers a tile instead of four, the next
   tile's bulk copies issued after the tile's first barrier (which every
   warp passes once done with the values of the tile before) instead of
   before its wait, so that no barrier ends a tile. V2-Lite's step at 1 /
   8 / 32 / 64 tokens: bf16 1.811 / 5.349 / 8.961 / 9.780 ms against 1.807
   / 5.348 / 8.964 / 9.809, fp8 1.452 / 3.583 / 5.465 / 6.570 against 1.450
   / 3.585 / 5.476 / 6.566 (H200, 2026-11-30, one call): level, so the
   barriers are not what bounds the tile. History at 82aa9ba (MOEC_MLA_B3;
   its first form left q's copies uncommitted where every tile was loaded
   before the wait, which the emulator's cp.async now catches). */

static const char WRITE_BODY[] =
    "    const int t = blockIdx.x;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks)\n"
    "        return;\n"
    "    const long long row = (long long)block_table[(long long)s * max_blocks + p / BS] * BS + p % BS;\n"
    "    for (int i = threadIdx.x; i < R / VR; i += blockDim.x)\n"
    "        cpv<VR>(kvpool + row * R + i * VR, kv_c + (long long)t * R + i * VR);\n"
    "    for (int i = threadIdx.x; i < DR / VD; i += blockDim.x)\n"
    "        cpv<VD>(pepool + row * DR + i * VD, k_pe + (long long)t * DR + i * VD);\n";

static const char ATTN_BODY[] =
    "    constexpr int NW = NT / 32, RS = R + DR, RG = R / CS, ITEMS = (HB / HS) * RG;\n"
    "    constexpr int NI = (ITEMS + NT - 1) / NT;\n"
    "    __shared__ __align__(16) TQ q_s[HB][QLD];\n"
    "    __shared__ __align__(16) TS kv_s[PT][LDK];\n"
    "    __shared__ float sc_s[HB][PT + 1];\n"
    "    __shared__ float p_s[PT][HB];\n"
    "    __shared__ float alpha_s[HB], m_s[HB], l_s[HB];\n"
    "    __shared__ long long row_s[PT];\n"
    "    const int t = blockIdx.x, h0 = blockIdx.y * HB;\n"
    "    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    TO *o = out + ((long long)t * H + h0) * R;\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks) {\n"
    "        if constexpr (NSPLIT == 1)\n"
    "            for (int i = tid; i < HB * R; i += NT)\n"
    "                st(o + i, 0.0f);\n"
    "        return;\n"
    "    }\n"
    "    for (int i = tid; i < HB * RS; i += NT) {\n"
    "        const int hh = i / RS, j = i % RS;\n"
    "        if (j < R)\n"
    "            q_s[hh][j] = q_c[((long long)t * H + h0 + hh) * R + j];\n"
    "        else\n"
    "            st(&q_s[hh][j], ld(q_pe + ((long long)t * H + h0 + hh) * DR + j - R));\n"
    "    }\n"
    "    if (tid < HB) {\n"
    "        m_s[tid] = MOEC_NEG_INF;\n"
    "        l_s[tid] = 0.0f;\n"
    "    }\n"
    "    float acc[NI][HS][CS];\n"
    "#pragma unroll\n"
    "    for (int ni = 0; ni < NI; ni++)\n"
    "#pragma unroll\n"
    "        for (int a = 0; a < HS; a++)\n"
    "#pragma unroll\n"
    "            for (int b = 0; b < CS; b++)\n"
    "                acc[ni][a][b] = 0.0f;\n"
    "    const int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;\n"
    "    /* the positions: lo..p, or with a selection sel[t][0 .. n_pos - 1] */\n"
    "    const int n_pos = KSEL > 0 ? (p + 1 < KSEL ? p + 1 : KSEL) : p - lo + 1;\n"
    "    const int n_tiles = (n_pos + PT - 1) / PT;\n"
    "    /* this block's share of the tiles when the sequence is split */\n"
    "    const int per_min = (MINPOS + PT - 1) / PT, per_even = (n_tiles + NSPLIT - 1) / NSPLIT;\n"
    "    const int per = per_even > per_min ? per_even : per_min, first = blockIdx.z * per;\n"
    "    const int last = first + per < n_tiles ? first + per : n_tiles;\n"
    "    if constexpr (NSPLIT > 1) {\n"
    "        if (first >= last) { /* no positions: weight 0 in the merge, no output */\n"
    "            const long long part = ((long long)t * H + h0) * NSPLIT + blockIdx.z;\n"
    "            if (tid < HB) {\n"
    "                part_ml[(part + (long long)tid * NSPLIT) * 2] = MOEC_NEG_INF;\n"
    "                part_ml[(part + (long long)tid * NSPLIT) * 2 + 1] = 0.0f;\n"
    "            }\n"
    "            return;\n"
    "        }\n"
    "    }\n"
    "    const int *bt = block_table + (long long)s * max_blocks;\n"
    "    for (int tile = first; tile < last; tile++) {\n"
    "        const int i0 = tile * PT;\n"
    "        const int nv = n_pos - i0 < PT ? n_pos - i0 : PT;\n"
    "        if (tid < nv) {\n"
    "            const int pp = KSEL > 0 ? sel[(long long)t * KSEL + i0 + tid] : lo + i0 + tid;\n"
    "            row_s[tid] = pp >= 0 && pp <= p ? (long long)bt[pp / BS] * BS + pp % BS : -1;\n"
    "        }\n"
    "        __syncthreads();\n"
    "        for (int i = tid; i < nv * (RS / VE); i += NT) {\n"
    "            const int r = i / (RS / VE), j = (i % (RS / VE)) * VE;\n"
    "            if (row_s[r] < 0) { /* a selection entry that is no position: masked */\n"
    "                float z[VE] = {};\n"
    "                stv<VE>(&kv_s[r][j], z);\n"
    "            } else if (j < R)\n"
    "                cpv<VE>(&kv_s[r][j], kvpool + row_s[r] * R + j);\n"
    "            else\n"
    "                cpv<VE>(&kv_s[r][j], pepool + row_s[r] * DR + (j - R));\n"
    "        }\n"
    "        __syncthreads();\n"
    "        for (int i = tid; i < HB * PT; i += NT) {\n"
    "            const int hh = i / PT, pp = i % PT;\n"
    "            float sc = MOEC_NEG_INF;\n"
    "            if (pp < nv && row_s[pp] >= 0) {\n"
    "                float dot = 0.0f;\n"
    "                for (int j = 0; j < RS; j += VE) {\n"
    "                    float a[VE], b[VE];\n"
    "                    ldv<VE>(&q_s[hh][j], a);\n"
    "                    ldv<VE>(&kv_s[pp][j], b);\n"
    "#pragma unroll\n"
    "                    for (int e = 0; e < VE; e++)\n"
    "                        dot += a[e] * b[e];\n"
    "                }\n"
    "                sc = dot * scale;\n"
    "            }\n"
    "            sc_s[hh][pp] = sc;\n"
    "        }\n"
    "        __syncthreads();\n"
    "        for (int hh = warp; hh < HB; hh += NW) {\n"
    "            const float v = lane < PT ? sc_s[hh][lane] : MOEC_NEG_INF;\n"
    "            const float mold = m_s[hh];\n"
    "            const float mnew = fmaxf(mold, warp_max(v));\n"
    "            const float pr = lane < nv ? expf(v - mnew) : 0.0f;\n"
    "            const float lsum = warp_sum(pr);\n"
    "            if (lane < PT)\n"
    "                p_s[lane][hh] = pr;\n"
    "            /* every lane has read m_s[hh] before lane 0 overwrites it */\n"
    "            __syncwarp();\n"
    "            if (lane == 0) {\n"
    "                const float alpha = expf(mold - mnew);\n"
    "                alpha_s[hh] = alpha;\n"
    "                l_s[hh] = l_s[hh] * alpha + lsum;\n"
    "                m_s[hh] = mnew;\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "#pragma unroll\n"
    "        for (int ni = 0; ni < NI; ni++) {\n"
    "            const int item = tid + ni * NT;\n"
    "            if (ITEMS % NT != 0 && item >= ITEMS)\n"
    "                continue;\n"
    "            const int c0 = (item % RG) * CS, hb = (item / RG) * HS;\n"
    "#pragma unroll\n"
    "            for (int a = 0; a < HS; a++) {\n"
    "                const float al = alpha_s[hb + a];\n"
    "#pragma unroll\n"
    "                for (int b = 0; b < CS; b++)\n"
    "                    acc[ni][a][b] *= al;\n"
    "            }\n"
    "            for (int pp = 0; pp < nv; pp++) {\n"
    "                float kv[CS];\n"
    "                ldv<CS>(&kv_s[pp][c0], kv);\n"
    "#pragma unroll\n"
    "                for (int a = 0; a < HS; a++) {\n"
    "                    const float pr = p_s[pp][hb + a];\n"
    "#pragma unroll\n"
    "                    for (int b = 0; b < CS; b++)\n"
    "                        acc[ni][a][b] += pr * kv[b];\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "    }\n"
    "    __syncthreads();\n"
    "    /* split: this block's softmax state (m, l) and unnormalised output */\n"
    "    const long long part = ((long long)t * H + h0) * NSPLIT + blockIdx.z;\n"
    "    if constexpr (NSPLIT > 1) {\n"
    "        if (tid < HB) {\n"
    "            part_ml[(part + (long long)tid * NSPLIT) * 2] = m_s[tid];\n"
    "            part_ml[(part + (long long)tid * NSPLIT) * 2 + 1] = l_s[tid];\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int ni = 0; ni < NI; ni++) {\n"
    "        const int item = tid + ni * NT;\n"
    "        if (ITEMS % NT != 0 && item >= ITEMS)\n"
    "            continue;\n"
    "        const int c0 = (item % RG) * CS, hb = (item / RG) * HS;\n"
    "#pragma unroll\n"
    "        for (int a = 0; a < HS; a++) {\n"
    "            if constexpr (NSPLIT > 1) {\n"
    "                stv<CS>(part_o + (part + (long long)(hb + a) * NSPLIT) * R + c0, acc[ni][a]);\n"
    "            } else {\n"
    "                const float l = l_s[hb + a];\n"
    "                float y[CS];\n"
    "#pragma unroll\n"
    "                for (int b = 0; b < CS; b++)\n"
    "                    y[b] = acc[ni][a][b] / l;\n"
    "                stv<CS>(o + (long long)(hb + a) * R + c0, y);\n"
    "            }\n"
    "        }\n"
    "    }\n";

/* The tensor-core form (bf16, 16 heads per block, m16n8k16 MMAs with fp32
 * accumulation): tiles of PT positions in NBUF buffers of shared memory,
 * loaded NBUF - 1 tiles ahead (on sm_90 by two bulk copies a row, issued by
 * one thread and completing on the buffer's mbarrier; else cp.async by every
 * thread); S = Q K^T for the 16 heads (one 8-position MMA column per warp),
 * the online softmax on S (P rounded to bf16 for the second product, l summed
 * from the rounded P), then O += P V with each warp owning R / 8 channels. */
static const char MMA_HEAD[] =
    "    constexpr int RS = R + DR, LD = RS + 8, PLD = PT + 8, SLD = PT + 4, CW = R / NW, NTN = CW / 8;\n"
    "    /* the scores' warps: NQ groups of CT 8-position column tiles (CT of\n"
    "       them sharing each A fragment) by KH parts of the k steps */\n"
    "    constexpr int NQ = PT / 8 / CT, KH = NW / NQ > 1 ? NW / NQ : 1, KS = RS / 16;\n"
    "    constexpr int RPW = SM2 ? 16 / NW : 1, LPR = 32 / RPW, PPL = PT / LPR > 1 ? PT / LPR : 1;\n"
    "    struct Smem {\n"
    "        __nv_bfloat16 q[16][LD];\n"
    "        __nv_bfloat16 kv[NBUF][PT][LD];\n"
    "        float s[KH][16][SLD];\n"
    "        __nv_bfloat16 p[16][PLD];\n"
    "        float m[16], l[16], alpha[16];\n"
    "        unsigned long long bar[NBUF];\n"
    "    };\n"
    "    static_assert(sizeof(Smem) == SMEM, \"shared memory layout\");\n"
    "    extern __shared__ __align__(16) unsigned char smem_raw[];\n"
    "    Smem &sm = *reinterpret_cast<Smem *>(smem_raw);\n"
    "    const int t = blockIdx.x, h0 = blockIdx.y * 16;\n"
    "    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    const bool pad = s < 0 || p < 0 || p / BS >= max_blocks;\n"
    "    const int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;\n"
    "    /* the positions: lo..p, or with a selection sel[t][0 .. n_pos - 1] */\n"
    "    const int n_pos = KSEL > 0 ? (p + 1 < KSEL ? p + 1 : KSEL) : p - lo + 1;\n"
    "    const int n_tiles = (n_pos + PT - 1) / PT;\n"
    "    const int per_min = (MINPOS + PT - 1) / PT, per_even = (n_tiles + NSPLIT - 1) / NSPLIT;\n"
    "    const int per = per_even > per_min ? per_even : per_min, first = blockIdx.z * per;\n"
    "    const int last = first + per < n_tiles ? first + per : n_tiles;\n"
    "    const int *bt = block_table + (long long)s * max_blocks;\n"
    /* a tile's loads: TPR threads a row, each row's cache row looked up
       once (row_of, issued a tile ahead so that its latency hides behind
       the products), its 16-byte chunks every TPR-th for the thread */
    "    constexpr int TPR = NT / PT, CPR = RS / 8;\n"
    "    static_assert(NT % PT == 0 && RS % 8 == 0, \"threads per tile row\");\n"
    "    const int lr = tid / TPR, lc = tid % TPR;\n"
    "    /* the cache row of tile row lr, -1 past the token's position or the selection */\n"
    "    auto row_of = [&](int tile) -> long long {\n"
    "        const int ir = tile * PT + lr;\n"
    "        const int pp = ir >= n_pos ? -1 : KSEL > 0 ? sel[(long long)t * KSEL + ir] : lo + ir;\n"
    "        return pp < 0 || pp > p ? -1LL : (long long)bt[pp / BS] * BS + pp % BS;\n"
    "    };\n"
    "    /* rows past the token's position are zeros: P is 0 there, and 0 * stale could be NaN */\n"
    "    auto load_tile = [&](long long row, int buf) {\n"
    "        if constexpr (TMA) { /* the row's two bulk copies, by its first thread */\n"
    "            if (row >= 0) {\n"
    "                if (lc == 0) {\n"
    "                    moec_mbar_arrive_tx(&sm.bar[buf], RS * 2);\n"
    "                    moec_bulk_g2s(&sm.kv[buf][lr][0], kvpool + row * R, R * 2, &sm.bar[buf]);\n"
    "                    moec_bulk_g2s(&sm.kv[buf][lr][R], pepool + row * DR, DR * 2, &sm.bar[buf]);\n"
    "                }\n"
    "                return;\n"
    "            }\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < (CPR + TPR - 1) / TPR; i++) {\n"
    "            const int j = (lc + i * TPR) * 8;\n"
    "            if (j >= RS)\n"
    "                break;\n"
    "            if (row < 0)\n"
    "                *reinterpret_cast<uint4 *>(&sm.kv[buf][lr][j]) = make_uint4(0u, 0u, 0u, 0u);\n"
    "            else if (j < R)\n"
    "                moec_cp16(&sm.kv[buf][lr][j], kvpool + row * R + j, true);\n"
    "            else\n"
    "                moec_cp16(&sm.kv[buf][lr][j], pepool + row * DR + (j - R), true);\n"
    "        }\n"
    "        if constexpr (TMA) { /* zeros: written before the buffer's next bulk copies */\n"
    "            moec_fence_async();\n"
    "            if (lc == 0)\n"
    "                moec_mbar_arrive(&sm.bar[buf]);\n"
    "        }\n"
    "    };\n"
    /* tile i in buffer (i - first) % NBUF: the first NBUF - 1 loaded first,
       then one more a tile, into the buffer the tile before used; with
       EARLY (bulk copies, no selection) those of the first ones whose rows
       no kernel of this step writes are loaded before the wait, while the
       kernel before this one runs: rows before the least position this
       step's tokens of the sequence hold, and none where another row's
       token writes a cache block this row maps there (rows that share
       blocks; TT tokens a step: the step inputs are the runtime's, written
       before the step's first kernel, and no kernel writes them) */
    "    /* a tile's buffer is full once each of its PT rows arrived (then the\n"
    "       block's barrier) */\n"
    "    auto init_bars = [&] {\n"
    "        if (tid == 0) {\n"
    "            for (int i = 0; i < NBUF; i++)\n"
    "                moec_mbar_init(&sm.bar[i], PT);\n"
    "            moec_mbar_init_fence();\n"
    "        }\n"
    "        __syncthreads();\n"
    "    };\n"
    "    long long row_next = -1LL;\n"
    "    int pre = 0;\n"
    "    if constexpr (EARLY) {\n"
    "        if (!pad && first < last) {\n"
    "            __shared__ int pmin_s;\n"
    "            if (warp == 0) {\n"
    "                /* blocks a .. b hold the first tiles' positions */\n"
    "                const int e = (first + NBUF - 1) * PT, ep = e < n_pos ? e : n_pos;\n"
    "                const int a = (lo + first * PT) / BS, b = (lo + ep - 1) / BS;\n"
    "                int mn = p;\n"
    "                for (int i = lane; i < TT; i += 32) {\n"
    "                    const int si = slots[i], pi = pos[i];\n"
    "                    if (si == s) {\n"
    "                        mn = pi < mn ? pi : mn;\n"
    "                    } else if (si >= 0 && pi >= 0 && pi / BS < max_blocks) {\n"
    "                        const int wb = block_table[(long long)si * max_blocks + pi / BS];\n"
    "                        for (int q = a; q <= b; q++)\n"
    "                            if (bt[q] == wb)\n"
    "                                mn = -1; /* another row writes one: none before */\n"
    "                    }\n"
    "                }\n"
    "#pragma unroll\n"
    "                for (int o2 = 16; o2 >= 1; o2 >>= 1) {\n"
    "                    const int other = __shfl_xor_sync(0xffffffffu, mn, o2);\n"
    "                    mn = other < mn ? other : mn;\n"
    "                }\n"
    "                if (lane == 0)\n"
    "                    pmin_s = mn;\n"
    "            }\n"
    "            init_bars();\n"
    "            const int pmin = pmin_s;\n"
    "            row_next = row_of(first);\n"
    "            for (; pre < NBUF - 1 && first + pre < last; pre++) {\n"
    "                const int e = (first + pre + 1) * PT, end = e < n_pos ? e : n_pos;\n"
    "                if (lo + end - 1 >= pmin)\n"
    "                    break;\n"
    "                load_tile(row_next, pre);\n"
    "                if (first + pre + 1 < last)\n"
    "                    row_next = row_of(first + pre + 1);\n"
    "            }\n"
    "        }\n"
    "    }\n";

/* The rest of MMA_HEAD's kernel, after the line "moec_pdl_enter();" where
 * EARLY (the emitter's) or before MMA_HEAD (cg_add_pdl_waits, else). */
static const char MMA_BODY[] =
    "    TO *o = out + ((long long)t * H + h0) * R;\n"
    "    if (pad) { /* padding: zeros, from one split */\n"
    "        if (NSPLIT == 1 || (MERGE && blockIdx.z == 0))\n"
    "            for (int i = tid; i < 16 * R; i += NT)\n"
    "                st(o + i, 0.0f);\n"
    "        return;\n"
    "    }\n"
    "    if constexpr (NSPLIT > 1) {\n"
    "        if (first >= last) { /* no positions: weight 0 in the merge, no output */\n"
    "            const long long part = ((long long)t * H + h0) * NSPLIT + blockIdx.z;\n"
    "            if (tid < 16) {\n"
    "                part_ml[(part + (long long)tid * NSPLIT) * 2] = MOEC_NEG_INF;\n"
    "                part_ml[(part + (long long)tid * NSPLIT) * 2 + 1] = 0.0f;\n"
    "            }\n"
    "            if constexpr (MERGE)\n"
    "                moec_attn_arrive_merge<NSPLIT, 16, R>(part_ml, part_o, ((long long)t * H + h0) * NSPLIT, o,\n"
    "                                                      cnt, ((long long)t * H + h0) / 16);\n"
    "            return;\n"
    "        }\n"
    "    }\n"
    "    for (int i = tid; i < 16 * (RS / 8); i += NT) {\n"
    "        const int r = i / (RS / 8), j = (i % (RS / 8)) * 8;\n"
    "        const long long qr = (long long)t * H + h0 + r;\n"
    "        if (j < R)\n"
    "            moec_cp16(&sm.q[r][j], q_c + qr * R + j, true);\n"
    "        else\n"
    "            moec_cp16(&sm.q[r][j], q_pe + qr * DR + (j - R), true);\n"
    "    }\n"
    "    if (tid < 16) {\n"
    "        sm.m[tid] = MOEC_NEG_INF;\n"
    "        sm.l[tid] = 0.0f;\n"
    "    }\n"
    "    if constexpr (TMA && !EARLY)\n"
    "        init_bars();\n"
    "    float acc[NTN][4];\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < NTN; n++)\n"
    "        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;\n"
    /* the scores and maxima in units of log2 (EX2: each weight by the special
       function unit alone), else natural ones; part_ml holds natural ones */
    "    const float sl = EX2 ? scale * MOEC_LOG2E : scale;\n"
    "    auto ex = [](float x) { return EX2 ? moec_ex2(x) : expf(x); };\n"
    "    if constexpr (!EARLY)\n"
    "        row_next = first < last ? row_of(first) : -1LL;\n"
    "#pragma unroll\n"
    "    for (int i = pre; i < NBUF - 1; i++) {\n"
    "        if (first + i < last)\n"
    "            load_tile(row_next, i);\n"
    "        moec_cp_commit();\n"
    "        if (first + i + 1 < last)\n"
    "            row_next = row_of(first + i + 1);\n"
    "    }\n"
    "    for (int tile = first; tile < last; tile++) {\n"
    "        const int it = tile - first, buf = it % NBUF, nxt = tile + NBUF - 1;\n"
    "        if (nxt < last)\n"
    "            load_tile(row_next, (nxt - first) % NBUF);\n"
    "        moec_cp_commit();\n"
    "        if (nxt + 1 < last)\n"
    "            row_next = row_of(nxt + 1);\n"
    "        if constexpr (TMA) {\n"
    "            if (tile == first)\n"
    "                moec_cp_wait_group<0>(); /* q */\n"
    "            moec_mbar_wait(&sm.bar[buf], (unsigned)(it / NBUF) & 1u);\n"
    "        } else {\n"
    "            moec_cp_wait_group<NBUF - 1>();\n"
    "        }\n"
    "        __syncthreads();\n"
    "        const int nv = n_pos - tile * PT < PT ? n_pos - tile * PT : PT;\n"
    "        /* each warp CT column tiles' products over its part of k (every warp\n"
    "           busy, the chains of dependent products KH times shorter) */\n"
    "        if (warp < NQ * KH) {\n"
    "            float c[CT][4];\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < CT; j++)\n"
    "                c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;\n"
    "            const int n0 = (warp % NQ) * 8 * CT, kh = warp / NQ;\n"
    /* A (16 heads by 16 k) and B (16 k by 8 positions) by ldmatrix: lane
       L gives row L & 15, column (L >> 4) * 8 of A and row L & 7, column
       (L >> 3 & 1) * 8 of B; two column tiles' B in one load, the second's
       rows from lanes 16..31 */
    "            const __nv_bfloat16 *qa = &sm.q[lane & 15][(lane >> 4) * 8];\n"
    "            const __nv_bfloat16 *kb =\n"
    "                &sm.kv[buf][n0 + (lane & 7) + (CT == 2 ? (lane >> 4) * 8 : 0)][((lane >> 3) & 1) * 8];\n"
    /* one k step: q's and the tile's fragments at these shared addresses,
       then the CT products */
    "            auto qk_step = [&](unsigned qaddr, unsigned kaddr) {\n"
    "                unsigned a[4], bk[2 * CT];\n"
    "                moec_ldmatrix_s<4, false>(a, qaddr);\n"
    "                moec_ldmatrix_s<2 * CT, false>(bk, kaddr);\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < CT; j++)\n"
    "                    moec_mma_bf16(c[j], a[0], a[1], a[2], a[3], bk[2 * j], bk[2 * j + 1]);\n"
    "            };\n"
    "            if constexpr (QK2) { /* KS % KH == 0 */\n"
    "                /* each warp's KS / KH steps unrolled from shared addresses taken\n"
    "                   once: each step's loads at a constant offset */\n"
    "                static_assert(!QK2 || KS % KH == 0, \"whole k steps a part\");\n"
    "                const unsigned qs = moec_smem_addr(qa) + kh * (KS / KH) * 32,\n"
    "                               ks = moec_smem_addr(kb) + kh * (KS / KH) * 32;\n"
    "#pragma unroll\n"
    "                for (int i = 0; i < KS / KH; i++)\n"
    "                    qk_step(qs + i * 32, ks + i * 32);\n"
    "            } else {\n"
    "#pragma unroll 4\n"
    "                for (int k0 = kh * KS / KH * 16; k0 < (kh + 1) * KS / KH * 16; k0 += 16)\n"
    "                    qk_step(moec_smem_addr(qa + k0), moec_smem_addr(kb + k0));\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < CT; j++) {\n"
    "                const int col = n0 + 8 * j + 2 * tq;\n"
    "                sm.s[kh][g][col] = c[j][0];\n"
    "                sm.s[kh][g][col + 1] = c[j][1];\n"
    "                sm.s[kh][g + 8][col] = c[j][2];\n"
    "                sm.s[kh][g + 8][col + 1] = c[j][3];\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    /* the online softmax: RPW rows a warp at once (SM2), LPR lanes a row,
       PPL positions a lane; the maxima and sums over a row's lanes */
    "        for (int r0 = warp * RPW; r0 < 16; r0 += NW * RPW) {\n"
    "            const int r = r0 + lane / LPR, j = lane % LPR;\n"
    "            float v[PPL], mx = MOEC_NEG_INF;\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < PPL; i++) {\n"
    "                const int col = j * PPL + i;\n"
    "                v[i] = MOEC_NEG_INF;\n"
    "                if (col < nv) {\n"
    "                    float x = sm.s[0][r][col];\n"
    "#pragma unroll\n"
    "                    for (int q = 1; q < KH; q++)\n"
    "                        x += sm.s[q][r][col];\n"
    "                    v[i] = x * sl;\n"
    "                }\n"
    "                mx = fmaxf(mx, v[i]);\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int o = LPR / 2; o >= 1; o >>= 1)\n"
    "                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));\n"
    "            const float mold = sm.m[r];\n"
    "            const float mnew = fmaxf(mold, mx);\n"
    "            float lsum = 0.0f;\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < PPL; i++) {\n"
    "                const int col = j * PPL + i;\n"
    "                const __nv_bfloat16 pb =\n"
    "                    __float2bfloat16(col < nv ? ex(v[i] - mnew) : 0.0f);\n"
    "                lsum += __bfloat162float(pb);\n"
    "                if (col < PT)\n"
    "                    sm.p[r][col] = pb;\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int o = LPR / 2; o >= 1; o >>= 1)\n"
    "                lsum += __shfl_xor_sync(0xffffffffu, lsum, o);\n"
    "            /* every lane has read sm.m[r] before the row's first lane overwrites it */\n"
    "            __syncwarp();\n"
    "            if (j == 0) {\n"
    "                const float al = ex(mold - mnew);\n"
    "                sm.alpha[r] = al;\n"
    "                sm.l[r] = sm.l[r] * al + lsum;\n"
    "                sm.m[r] = mnew;\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "        const float a_lo = sm.alpha[g], a_hi = sm.alpha[g + 8];\n"
    /* no row's maximum moved (every alpha 1): nothing to rescale */
    "        if (!SM2 || __any_sync(0xffffffffu, a_lo != 1.0f || a_hi != 1.0f)) {\n"
    "#pragma unroll\n"
    "            for (int n = 0; n < NTN; n++) {\n"
    "                acc[n][0] *= a_lo;\n"
    "                acc[n][1] *= a_lo;\n"
    "                acc[n][2] *= a_hi;\n"
    "                acc[n][3] *= a_hi;\n"
    "            }\n"
    "        }\n"
    /* A = P (16 heads by 16 positions) by ldmatrix, B = the values (16
       positions by 8 channels) by transposing ldmatrix, two channel tiles a
       load: lane L gives position kk + (L & 15), channel c0 + (L >> 4) * 8 */
    "#pragma unroll\n"
    "        for (int kk = 0; kk < PT; kk += 16) {\n"
    "            unsigned a[4];\n"
    "            moec_ldmatrix<4, false>(a, &sm.p[lane & 15][kk + (lane >> 4) * 8]);\n"
    "            const __nv_bfloat16 *vb = &sm.kv[buf][kk + (lane & 15)][warp * CW];\n"
    "#pragma unroll\n"
    "            for (int n = 0; n + 1 < NTN; n += 2) {\n"
    "                unsigned b[4];\n"
    "                moec_ldmatrix<4, true>(b, vb + n * 8 + (lane >> 4) * 8);\n"
    "                moec_mma_bf16(acc[n], a[0], a[1], a[2], a[3], b[0], b[1]);\n"
    "                moec_mma_bf16(acc[n + 1], a[0], a[1], a[2], a[3], b[2], b[3]);\n"
    "            }\n"
    "            if constexpr (NTN % 2 != 0) {\n"
    "                unsigned b[2];\n"
    "                moec_ldmatrix<2, true>(b, vb + (NTN - 1) * 8);\n"
    "                moec_mma_bf16(acc[NTN - 1], a[0], a[1], a[2], a[3], b[0], b[1]);\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "    }\n"
    "    moec_cp_wait_group<0>();\n"
    "    __syncthreads();\n"
    "    const long long part = ((long long)t * H + h0) * NSPLIT + blockIdx.z;\n"
    "    if constexpr (NSPLIT > 1) {\n"
    "        if (tid < 16) {\n"
    "            part_ml[(part + (long long)tid * NSPLIT) * 2] =\n"
    "                EX2 ? sm.m[tid] * MOEC_LN2 : sm.m[tid];\n"
    "            part_ml[(part + (long long)tid * NSPLIT) * 2 + 1] = sm.l[tid];\n"
    "        }\n"
    "    }\n"
    "    const float l_lo = sm.l[g], l_hi = sm.l[g + 8];\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < NTN; n++) {\n"
    "        const int ch = warp * CW + n * 8 + 2 * tq;\n"
    "        if constexpr (NSPLIT > 1) {\n"
    "            *reinterpret_cast<float2 *>(part_o + (part + (long long)g * NSPLIT) * R + ch) =\n"
    "                make_float2(acc[n][0], acc[n][1]);\n"
    "            *reinterpret_cast<float2 *>(part_o + (part + (long long)(g + 8) * NSPLIT) * R + ch) =\n"
    "                make_float2(acc[n][2], acc[n][3]);\n"
    "        } else {\n"
    "            float y0[2] = {acc[n][0] / l_lo, acc[n][1] / l_lo}, y1[2] = {acc[n][2] / l_hi, acc[n][3] / l_hi};\n"
    "            stv<2>(o + (long long)g * R + ch, y0);\n"
    "            stv<2>(o + (long long)(g + 8) * R + ch, y1);\n"
    "        }\n"
    "    }\n"
    "    if constexpr (MERGE)\n"
    "        moec_attn_arrive_merge<NSPLIT, 16, R>(part_ml, part_o, ((long long)t * H + h0) * NSPLIT, o, cnt,\n"
    "                                              ((long long)t * H + h0) / 16);\n";

static long long gcd(long long a, long long b) { return b ? gcd(b, a % b) : a; }

static long long round_up(long long n, long long m) { return (n + m - 1) / m * m; }

/* Shared memory of the attention kernel for hb heads and pt positions. */
static long long attn_smem(long long hb, long long pt, long long qld, long long ldk, long long qsz,
                           long long esz)
{
    return hb * qld * qsz + pt * ldk * esz + hb * (pt + 1) * 4 + pt * hb * 4 + 3 * hb * 4 + pt * 8;
}

/* MMA_BODY's KH: the parts of k the scores' warps split, where NQ groups
 * of CT column tiles (PT / 8 / CT) leave warps over */
static int mma_kparts(int pt, int ct, int nw)
{
    int nq = pt / 8 / ct;
    return nw / nq > 1 ? nw / nq : 1;
}

moec_status cg_emit_mla_attention(cg_ctx *c, const ir_op *op)
{
    const char *who = op->out[0]->name;
    const ir_value *qc = op->in[0], *qpe = op->in[1], *kvc = op->in[2], *kpe = op->in[3];
    /* DSA's token selection (dsa_topk): attend over its first min(K, pos + 1) entries */
    const ir_value *sel = op->n_in == 6 ? op->in[5] : NULL;
    if (op->n_in < 5 || op->n_in > 6 || qc->type.rank != 3 || qpe->type.rank != 3 ||
        kvc->type.rank != 2 || kpe->type.rank != 3 ||
        (sel && (sel->type.rank != 2 || cg_storage(c, sel) != IR_DTYPE_I32)))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "mla_attention %%%s: wants q_c [T, H, r], q_pe [T, H, dr], kv_c [T, r], "
                        "k_pe [T, 1, dr], pos and optionally sel i32 [T, K]",
                        who);
    long long ksel = sel ? sel->type.dims[1] : 0;
    if (sel && ir_op_attr_int(op, "window", 0) > 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "mla_attention %%%s: a window and a token selection together", who);
    long long H = qc->type.dims[1], R = qc->type.dims[2], DR = qpe->type.dims[2];
    if (qpe->type.dims[1] != H || kvc->type.dims[1] != R || kpe->type.dims[1] != 1 ||
        kpe->type.dims[2] != DR || H < 1 || R < 1 || DR < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "mla_attention %%%s: shapes of q_c, q_pe, kv_c, k_pe disagree", who);
    ir_dtype dt = c->opt->compute_dtype, qdt = cg_storage(c, qc), pdt = cg_storage(c, qpe),
             cdt = cg_storage(c, kvc), edt = cg_storage(c, kpe), odt = cg_storage(c, op->out[0]);
    if (qdt == IR_DTYPE_I32 || pdt == IR_DTYPE_I32 || cdt == IR_DTYPE_I32 || edt == IR_DTYPE_I32 ||
        odt == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "mla_attention %%%s: operands must be float", who);
    int bs = c->opt->kv_block_size;
    if (bs < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "mla_attention %%%s: kv_block_size %d", who, bs);
    long long esz = (long long)ir_dtype_size(dt), qsz = (long long)ir_dtype_size(qdt);
    long long RS = R + DR;
    int ve = cg_vec_width(gcd(R, DR));
    long long qld = round_up(RS, 16 / qsz), ldk = round_up(RS, 16 / esz) + 16 / esz;
    /* heads per block: the largest divisor of H up to 16; then positions per
       tile, then fewer heads, until shared memory fits */
    int hb = 0;
    for (int d = (int)(H < 16 ? H : 16); d >= 1; d--)
        if (H % d == 0) {
            hb = d;
            break;
        }
    int pt = 32;
    while (attn_smem(hb, pt, qld, ldk, qsz, esz) > MLA_SMEM_MAX) {
        if (pt > 8) {
            pt /= 2;
            continue;
        }
        int d = hb - 1;
        while (d >= 1 && H % d)
            d--;
        if (d < 1)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "mla_attention %%%s: r %lld + dr %lld do not fit shared memory", who, R,
                            DR);
        hb = d;
    }
    int cs = cg_vec_width(R);
    /* heads per thread: as many as keep the accumulators at 32 registers and
       all threads busy */
    int hs = 1;
    for (int d = hb; d >= 1; d--)
        if (hb % d == 0 && d * cs <= 32 && (hb / d) * (R / cs) >= MLA_THREADS) {
            hs = d;
            break;
        }
    long long items = (hb / hs) * (R / cs);
    if ((items + MLA_THREADS - 1) / MLA_THREADS * hs * cs > 64)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "mla_attention %%%s: r %lld needs more accumulators than registers hold", who,
                        R);
    /* bf16 with heads in sixteens: the tensor-core kernel */
    int mw = cg_env_int("MOEC_MLA_WARPS", MMA_WARPS, 8, 16) >= 16 ? 16 : 8;
    int mma = dt == IR_DTYPE_BF16 && qdt == IR_DTYPE_BF16 && pdt == IR_DTYPE_BF16 && H % 16 == 0 &&
              R % (8 * mw) == 0 && DR % 8 == 0 && RS % 16 == 0;
    if (mma)
        hb = 16;
    /* split the sequence when the bucket's blocks cannot fill the GPU */
    long long blocks = (long long)c->T * (H / hb);
    int ns = cg_attn_splits(blocks, mma);
    int minpos = ns > 1 ? cg_attn_split_min(1) : 1;
    /* the tensor-core kernel merges its own splits; the CUDA-core one's
       shared memory is already near the static limit */
    int merge = mma && cg_attn_self_merge(c, H, hb, R, ns);
    const char *ts = cg_ctype(dt);
    char tag[64];
    if (cdt == dt && edt == dt)
        snprintf(tag, sizeof tag, "%s", ir_dtype_name(dt));
    else
        snprintf(tag, sizeof tag, "%s_%s_%s", ir_dtype_name(dt), ir_dtype_name(cdt),
                 ir_dtype_name(edt));

    /* the cache write, unless the MLA prologue op that computes kv_c and
       k_pe writes their rows itself */
    const ir_op *pro = kvc->kind == IR_VALUE_OP ? kvc->def : NULL;
    int prewritten = pro && cg_mla_prologue_cache(c->m, pro) == op;
    char wname[256];
    snprintf(wname, sizeof wname, "mla_kv_write_r%lld_dr%lld_bs%d_t%d_%s", R, DR, bs, c->T, tag);
    int is_new = 0;
    int kw = prewritten ? 0 : cg_kernel(c, wname, &is_new);
    if (kw < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);
    if (!prewritten && is_new) {
        moec_buf_printf(&c->src,
                      "// mla_attention: cache write of kv_c and k_pe (codegen/mla_attention.c, "
                      "cg_emit_mla_attention)\n"
                      "extern \"C\" __global__ void __launch_bounds__(128) %s(const %s *__restrict__ "
                      "kv_c, const %s *__restrict__ k_pe, const int *__restrict__ pos, const int "
                      "*__restrict__ slots, const int *__restrict__ block_table, int max_blocks, %s "
                      "*__restrict__ kvpool, %s *__restrict__ pepool)\n{\n"
                      "    constexpr int R = %lld, DR = %lld, BS = %d, VR = %d, VD = %d;\n",
                      wname, cg_ctype(cdt), cg_ctype(edt), ts, ts, R, DR, bs, cg_vec_width(R), cg_vec_width(DR));
        moec_buf_printf(&c->src, "%s}\n\n", WRITE_BODY);
    }
    ir_step *s = prewritten ? NULL : cg_attn_write_step(c, op, kw, kvc, kpe);
    if (!prewritten && !s)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);

    char aname[256];
    if (qdt == dt && pdt == dt && odt == dt)
        snprintf(tag, sizeof tag, "%s", ir_dtype_name(dt));
    else
        snprintf(tag, sizeof tag, "%s_%s_%s_%s", ir_dtype_name(dt), ir_dtype_name(qdt),
                 ir_dtype_name(pdt), ir_dtype_name(odt));
    long long ld = RS + 8, smem = 0;
    int tma = 0, mpt = MMA_PT, nbuf = MMA_NBUF, sm2 = MLA_SM2, ct = MLA_CT, qk2 = MLA_QK2;
    int ex2 = 0, early = 0;
    if (mma) {
        /* the Smem struct of MMA_BODY: q, NBUF kv tiles, the scores' KH parts,
           P, m, l, alpha, NBUF mbarriers */
        mpt = cg_env_int("MOEC_MLA_PT", MMA_PT, 16, 32) >= 32 ? 32 : 16;
        nbuf = cg_env_int("MOEC_MLA_NBUF", MMA_NBUF, 2, 4);
        ct = cg_env_int("MOEC_MLA_CT", MLA_CT, 1, 2);
        /* two column tiles take twice the scores' k parts: one where they
           would not fit (sm_86 and sm_89's 99 KiB), unless asked for */
        for (;; ct--) {
            long long kh = mma_kparts(mpt, ct, mw);
            smem = 16 * ld * 2 + (long long)nbuf * mpt * ld * 2 + kh * 16LL * (mpt + 4) * 4 +
                   16LL * (mpt + 8) * 2 + 3 * 16 * 4 + nbuf * 8LL;
            if (ct == 1 || smem <= (long long)cg_smem_max(c->opt) || getenv("MOEC_MLA_CT"))
                break;
        }
        if (smem > (long long)cg_smem_max(c->opt))
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "mla_attention %%%s: %d buffers of %d positions need %lld bytes of "
                            "shared memory",
                            who, nbuf, mpt, smem);
        /* the tiles by bulk copies (sm_90): the rows of both pools are whole
           16-byte units already (R % 64 == 0 and DR % 8 == 0 above) */
        tma = c->opt && cg_arch_num(c->opt) >= 90 && cg_env_int("MOEC_MLA_TMA", MLA_TMA, 0, 1);
        sm2 = cg_env_int("MOEC_MLA_SM2", MLA_SM2, 0, 1);
        /* where each of the scores' KH parts of k holds whole steps */
        qk2 = cg_env_int("MOEC_MLA_QK2", MLA_QK2, 0, 1) &&
              (RS / 16) % mma_kparts(mpt, ct, mw) == 0;
        ex2 = cg_env_int("MOEC_MLA_EX2", MLA_EX2, 0, 1);
        /* the first tiles before the wait: by bulk copies, where the rows
           are the positions' (no selection, which a kernel writes), and
           where a warp scans the step's tokens for the sequence's own */
        early = tma && !sel && c->T <= MLA_EARLY_MAX_T &&
                cg_env_int("MOEC_MLA_EARLY", MLA_EARLY, 0, 1);
        snprintf(aname, sizeof aname,
                 "mla_attn_mma_h%lld_r%lld_dr%lld_pt%d_nb%d%s_ns%d_mp%d%s%s%s%s%s%s%s_bs%d_t%d_%s",
                 H, R, DR, mpt, nbuf, mw != MMA_WARPS ? "_w16" : "", ns, minpos,
                 sm2 ? "" : "_sm1", ct == 1 ? "_ct1" : "", qk2 ? "_qk2" : "", tma ? "_tma" : "",
                 ex2 ? "_ex2" : "", early ? "_early" : "", merge ? "_m" : "", bs, c->T, tag);
    } else {
        snprintf(aname, sizeof aname, "mla_attn_h%lld_r%lld_dr%lld_hb%d_pt%d_hs%d_ns%d_mp%d_bs%d_t%d_%s",
                 H, R, DR, hb, pt, hs, ns, minpos, bs, c->T, tag);
    }
    if (sel) /* the sparse form reads the positions from sel */
        snprintf(aname + strlen(aname), sizeof aname - strlen(aname), "_k%lld", ksel);
    const char *sel_param = sel ? "const int *__restrict__ sel, " : "";
    int ka = cg_kernel(c, aname, &is_new);
    if (ka < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);
    const char *params = cg_attn_part_params(ns, merge);
    if (is_new && mma) {
        moec_buf_printf(&c->src,
                      "// mla_attention: attention over the compressed cache on tensor cores, one "
                      "block per token and 16 heads (codegen/mla_attention.c, "
                      "cg_emit_mla_attention)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const __nv_bfloat16 "
                      "*__restrict__ q_c, const __nv_bfloat16 *__restrict__ q_pe, %sconst int "
                      "*__restrict__ pos, const int *__restrict__ slots, const int *__restrict__ "
                      "block_table, int max_blocks, const __nv_bfloat16 *__restrict__ kvpool, const "
                      "__nv_bfloat16 *__restrict__ pepool, %s *__restrict__ out, float scale, int "
                      "window%s)\n{\n"
                      "    typedef %s TO;\n"
                      "    constexpr int H = %lld, R = %lld, DR = %lld, PT = %d, NW = %d, BS = %d, NT = "
                      "%d, NSPLIT = %d, SMEM = %lld, KSEL = %lld, MINPOS = %d, NBUF = %d, CT = %d;\n"
                      "    constexpr bool TMA = %s, SM2 = %s, QK2 = %s, EX2 = %s, EARLY = %s;\n"
                      "    constexpr int TT = %d;\n",
                      mw * 32, aname, sel_param, cg_ctype(odt), params, cg_ctype(odt), H, R,
                      DR, mpt, mw, bs, mw * 32, ns, smem, ksel, minpos, nbuf, ct,
                      tma ? "true" : "false", sm2 ? "true" : "false", qk2 ? "true" : "false",
                      ex2 ? "true" : "false", early ? "true" : "false", c->T);
    } else if (is_new) {
        moec_buf_printf(&c->src,
                      "// mla_attention: attention over the compressed cache, one block per token "
                      "and head group (codegen/mla_attention.c, cg_emit_mla_attention)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s *__restrict__ "
                      "q_c, const %s *__restrict__ q_pe, %sconst int *__restrict__ pos, const int "
                      "*__restrict__ slots, const int *__restrict__ block_table, int max_blocks, const "
                      "%s *__restrict__ kvpool, const %s *__restrict__ pepool, %s *__restrict__ out, "
                      "float scale, int window%s)\n{\n"
                      "    typedef %s TQ;\n    typedef %s TS;\n    typedef %s TO;\n"
                      "    constexpr int H = %lld, R = %lld, DR = %lld, HB = %d, PT = %d, HS = %d, "
                      "CS = %d, VE = %d, QLD = %lld, LDK = %lld, BS = %d, NT = %d, NSPLIT = %d, "
                      "KSEL = %lld, MINPOS = %d;\n",
                      MLA_THREADS, aname, cg_ctype(qdt), cg_ctype(pdt), sel_param, ts, ts,
                      cg_ctype(odt), params, cg_ctype(qdt), ts, cg_ctype(odt), H, R, DR, hb, pt, hs,
                      cs, ve, qld, ldk, bs, MLA_THREADS, ns, ksel, minpos);
    }
    if (is_new) {
        cg_attn_emit_parts(&c->src, ns, merge);
        if (!sel) {
            moec_buf_printf(&c->src, "    const int *sel = nullptr;\n    (void)sel;\n");
            /* the head groups of a split share its rows out */
            cg_attn_emit_prefetch(c, "PT", "blockIdx.z", "blockIdx.y", "gridDim.y", "kvpool", "R",
                                  "pepool", "DR", !early);
        }
        if (mma)
            moec_buf_printf(&c->src, "%s%s%s}\n\n", MMA_HEAD,
                            early ? "    moec_pdl_enter();\n" : "", MMA_BODY);
        else
            moec_buf_printf(&c->src, "%s}\n\n", ATTN_BODY);
    }
    s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "mla_attention %%%s: no memory", who);
    s->kernel = ka;
    s->grid[0] = (unsigned)c->T;
    s->grid[1] = (unsigned)(H / hb);
    s->grid[2] = (unsigned)ns;
    s->block[0] = mma ? (unsigned)mw * 32 : MLA_THREADS;
    s->smem = (unsigned)smem;
    s->args[0] = cg_arg_act(qc);
    s->args[1] = cg_arg_act(qpe);
    if (sel)
        s->args[2] = cg_arg_act(sel);
    cg_attn_args(s, op, sel ? 3 : 2, ns, merge);
    if (ns == 1)
        return MOEC_OK;
    /* the splits' partial results, merged by a third kernel unless the
       attention kernel's last block of each group merges them */
    return cg_attn_emit_combine(c, op, s, "mla_attention", "mla", "r", H, R, ns, merge);
}
