/* attention.c — GQA attention over the paged KV cache (docs/IR.md,
 * attention; docs/CUDA.md, KV cache). q, k, v arrive normed and rotated.
 * Kernels: the cache write of this step's k and v rows (padding tokens,
 * slot -1, write nothing; no kernel at all when the attn_prologue that
 * computes k and v writes them, codegen/attn_prologue.c), then attention of each token over its cached
 * positions (causal p <= pos, optional window) with an online softmax in
 * fp32. One block per (token, kv head, group of query heads): the heads of
 * a GQA group share every k and v row the block reads. Warps take tiles of
 * 32 positions (one per lane for the scores, then all lanes over the value
 * channels) and merge their partial softmax states at the end. When the
 * bucket has too few blocks to fill the GPU (decode), the sequence is also
 * split over blocks, and the last block of each group to finish merges
 * the splits' partial states (moec_attn_arrive_merge; a third kernel where
 * the split counters do not reach, or MOEC_ATTN_MERGE=0).
 * Lanes a position (MOEC_ATTN_LPP=N at codegen, 1, 2, 4 or 8, default 1):
 * each position's key may be shared by N lanes (16-byte chunks dealt round
 * them, the partial dots summed by shuffles), so that a warp's tile holds
 * 32 / N positions and a split at least 4 * 32 / N; names carry `_lppN`.
 * At one token, Qwen3-30B's 64 splits of 4 kv heads then hold positions
 * in 33 splits at context 1024 where they had 9, each lane a quarter of
 * the products. With N = 0 the kernel holds the body for 1, 2 and 4 and
 * picks one for each token from its positions (`_lppa`): four while the
 * splits of 32 positions are not all full, two while those of 64 are not,
 * else one. H200, 2026-11-28, 16 layers at batch 1: 1.181 ms with 4 fixed
 * against 1.235 with 1 at context 1024, but 1.498 against 1.442 at 8192
 * and 3.108 against 2.859 at batch 8, 1024, where the splits were full;
 * the choice at run time 1.268 at 1024, 1.394 at 8192, 2.960 at batch 8:
 * A/B knobs, the default stays 1.
 * Where one lane a position would run, a bf16 cache takes the tensor
 * cores' form instead (ATTN_BODY_TC, names `_tc`; MOEC_ATTN_TC=0 keeps
 * the lanes'): tiles of 16 positions a warp on m16n8k16 products, splits
 * of at least 64 positions, one wave of blocks (two a SM). H200,
 * 2026-11-29, Qwen3-30B cut to 16 layers: 1.126 against 1.191 ms at batch
 * 1 and context 1024, 1.238 against 1.382 at 8192, 3.307 against 4.181
 * at batch 8 and 8192 (docs/CUDA.md).
 * In a bucket of one token the kernel runs the token's attn_prologue too
 * (unless MOEC_ATTN_FUSE_PROLOGUE=0): the qkv row in place of q, no
 * prologue kernel (codegen/attn_prologue.c, cg_attn_prologue_fused; names
 * carry `_pro_...`). That kernel is launched plainly (its step's plain),
 * not as a programmatic dependent: as one, its blocks became resident
 * while the qkv GEMM still ran, and the step lost (H200, 2026-11-28,
 * Qwen3-30B cut to 16 layers, batch 1, context 1024: 1.343 ms against
 * 1.224 without the fusion; launched plainly 1.192, at 8192 1.383 against
 * 1.431). Which SMs the early blocks took is a guess, not measured; the
 * kernel alone (Nsight Compute) took 14.8 us against 13.2 + 4.5 for the
 * two. */
#include <stdio.h>
#include <stdlib.h>

#include "codegen/attn_common.h"
#include "codegen/cg.h"
#include "err.h"

/* Positions per warp tile (one per lane) and warps per block. */
#define ATTN_TILE 32
#define ATTN_WARPS 4
/* The fewest positions a split of a sequence takes: four tiles, one per
 * warp (with MOEC_ATTN_LPP=N, tiles of 32 / N positions; H100,
 * 2026-11-24, Qwen3-30B-A3B at context 1024: 4.303 against 4.358 ms at
 * batch 1, 10.863 against 10.978 at 8, with 1; the same call in the round
 * before, 4.265 against 4.329). MLA keeps 1 (mla_attention.c). */
#define ATTN_SPLIT_MIN (ATTN_TILE * ATTN_WARPS)
/* The tensor cores' form (ATTN_BODY_TC): positions a warp's tile, and the
 * fewest a split takes by default (a tile for each of the block's warps);
 * MOEC_ATTN_TC=0 keeps the lanes' form, MOEC_ATTN_SPLIT_MIN moves the
 * fewest. */
#define ATTN_TC_TILE 16
#define ATTN_TC_SPLIT_MIN (ATTN_TC_TILE * ATTN_WARPS)

static const char WRITE_BODY[] =
    "    const int t = blockIdx.x;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks)\n"
    "        return;\n"
    "    const long long row = (long long)block_table[(long long)s * max_blocks + p / BS] * BS + p % BS;\n"
    "    const TK *ks = k + (long long)t * KROW;\n"
    "    const TV *vs = v + (long long)t * VROW;\n"
    "    TS *kd = kpool + row * KROW;\n"
    "    TS *vd = vpool + row * VROW;\n"
    "    for (int i = threadIdx.x; i < KROW / KV; i += blockDim.x)\n"
    "        cpv<KV>(kd + i * KV, ks + i * KV);\n"
    "    for (int i = threadIdx.x; i < VROW / VV; i += blockDim.x)\n"
    "        cpv<VV>(vd + i * VV, vs + i * VV);\n";

/* The kernel's shared memory, sized for its fewest lanes a position
 * (TMAX positions a warp's tile), outside the body so that every lanes'
 * variant of the body shares it. */
static const char ATTN_SHARED[] =
    "    constexpr int G = H / HKV, NW = NT / 32, CPL = (DV + 31) / 32;\n"
    "    __shared__ float q_s[GB][DK];\n"
    "    __shared__ float p_s[NW][TMAX][GB];\n"
    "    __shared__ long long row_s[NW][TMAX];\n"
    "    __shared__ float m_s[NW][GB], l_s[NW][GB];\n"
    "    __shared__ float acc_s[NW][GB][DV];\n";

/* The body of one lanes' variant, inside `run` (LPP, TILE and MINPOS
 * its constants), in four parts: the block's token (ATTN_BODY_TOKEN), its
 * query heads into shared memory (ATTN_BODY_Q), its split's tiles
 * (ATTN_BODY_SPLIT), the rest (ATTN_BODY_EMPTY, then ATTN_BODY_LANES or
 * the tensor cores' ATTN_BODY_TC, then ATTN_BODY_TAIL and _OUT). A kernel that runs its
 * token's attn_prologue itself puts that prologue in place of
 * ATTN_BODY_Q, after the split's tiles (codegen/attn_prologue.c). */
static const char ATTN_BODY_TOKEN[] =
    "    const int t = blockIdx.x, kh = blockIdx.y, split = blockIdx.z % NSPLIT;\n"
    "    const int h0 = kh * G + blockIdx.z / NSPLIT * GB;\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    TO *o = out + ((long long)t * H + h0) * DV;\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks) { /* padding: zeros, from one split */\n"
    "        if (NSPLIT == 1 || (MERGE && split == 0))\n"
    "            for (int i = threadIdx.x; i < GB * DV; i += NT)\n"
    "                st(o + i, 0.0f);\n"
    "        return;\n"
    "    }\n";

static const char ATTN_BODY_Q[] =
    "    const TQ *qt = q + ((long long)t * H + h0) * DK;\n"
    "    for (int i = threadIdx.x; i < GB * DK; i += NT)\n"
    "        q_s[i / DK][i % DK] = ld(qt + i);\n"
    "    __syncthreads();\n";

static const char ATTN_BODY_SPLIT[] =
    "    const int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;\n"
    "    const int n_tiles = (p - lo + TILE) / TILE;\n"
    "    /* this block's share of the tiles when the sequence is split */\n"
    "    const int per_min = (MINPOS + TILE - 1) / TILE, per_even = (n_tiles + NSPLIT - 1) / NSPLIT;\n"
    "    const int per = per_even > per_min ? per_even : per_min, first = split * per;\n"
    "    const int last = first + per < n_tiles ? first + per : n_tiles;\n"
    "    /* the last block's merge (MERGE): of every split, or (LIVE) of those\n"
    "       that may hold positions */\n"
    "    auto arrive = [&]() {\n"
    "        const long long part = ((long long)t * H + h0) * NSPLIT, ci = ((long long)t * H + h0) / GB;\n"
    "        if constexpr (LIVE)\n"
    "            moec_attn_arrive_merge_live<NSPLIT, GB, DV, NT>(part_ml, part_o, part, o, cnt, ci,\n"
    "                                                            (n_tiles + per - 1) / per);\n"
    "        else\n"
    "            moec_attn_arrive_merge<NSPLIT, GB, DV>(part_ml, part_o, part, o, cnt, ci);\n"
    "    };\n";

static const char ATTN_BODY_EMPTY[] =
    "    if constexpr (NSPLIT > 1) {\n"
    "        if (first >= last) { /* no positions: weight 0 in the merge, no output */\n"
    "            if (threadIdx.x < GB) {\n"
    "                const long long part = ((long long)t * H + h0 + threadIdx.x) * NSPLIT + split;\n"
    "                part_ml[part * 2] = MOEC_NEG_INF;\n"
    "                part_ml[part * 2 + 1] = 0.0f;\n"
    "            }\n"
    "            if constexpr (MERGE)\n"
    "                arrive();\n"
    "            return;\n"
    "        }\n"
    "    }\n"
    "    const int *bt = block_table + (long long)s * max_blocks;\n";

/* The lanes' loop over the warp's tiles (LPP lanes a position, CUDA
 * cores), ending with the warp's softmax state in m_s, l_s and acc_s. */
static const char ATTN_BODY_LANES[] =
    "    float m[GB], lsum[GB], acc[GB][CPL];\n"
    "#pragma unroll\n"
    "    for (int g = 0; g < GB; g++) {\n"
    "        m[g] = MOEC_NEG_INF;\n"
    "        lsum[g] = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int c = 0; c < CPL; c++)\n"
    "            acc[g][c] = 0.0f;\n"
    "    }\n"
    "    for (int tile = first + warp; tile < last; tile += NW) {\n"
    "        /* LPP lanes a position: lane sub of them takes the 16-byte chunks\n"
    "           sub, sub + LPP, ... of its key */\n"
    "        const int p0 = lo + tile * TILE, pp = p0 + lane / LPP, sub = lane % LPP;\n"
    "        const bool valid = pp <= p;\n"
    "        float sc[GB], dot[GB];\n"
    "#pragma unroll\n"
    "        for (int g = 0; g < GB; g++)\n"
    "            dot[g] = 0.0f;\n"
    "        if (valid) {\n"
    "            const long long row = (long long)bt[pp / BS] * BS + pp % BS;\n"
    "            if (sub == 0)\n"
    "                row_s[warp][lane / LPP] = row;\n"
    "            const TS *kr = kpool + (row * HKV + kh) * DK;\n"
    "            /* a trip count known at compile time: the chunks' loads unrolled\n"
    "               (KUN at a time; by default all), in flight at once */\n"
    "#pragma unroll(KUN)\n"
    "            for (int i = 0; i < (DK / KV + LPP - 1) / LPP; i++) {\n"
    "                const int d = (i * LPP + sub) * KV;\n"
    "                if (DK % (KV * LPP) != 0 && d >= DK)\n"
    "                    break;\n"
    "                float kf[KV];\n"
    "                ldv<KV>(kr + d, kf);\n"
    "#pragma unroll\n"
    "                for (int g = 0; g < GB; g++)\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < KV; j++)\n"
    "                        dot[g] += q_s[g][d + j] * kf[j];\n"
    "            }\n"
    "        }\n"
    "        if constexpr (LPP > 1) {\n"
    "            /* every lane of the warp: a position's lanes are all valid or not */\n"
    "#pragma unroll\n"
    "            for (int g = 0; g < GB; g++)\n"
    "#pragma unroll\n"
    "                for (int o = LPP / 2; o > 0; o >>= 1)\n"
    "                    dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int g = 0; g < GB; g++)\n"
    "            sc[g] = valid ? dot[g] * scale : MOEC_NEG_INF;\n"
    "#pragma unroll\n"
    "        for (int g = 0; g < GB; g++) {\n"
    "            const float mnew = fmaxf(m[g], warp_max(sc[g]));\n"
    "            const float alpha = expf(m[g] - mnew);\n"
    "            const float pr = valid ? expf(sc[g] - mnew) : 0.0f;\n"
    "            /* a position's weight counted once, by its first lane */\n"
    "            lsum[g] = lsum[g] * alpha + (sub == 0 ? pr : 0.0f);\n"
    "            m[g] = mnew;\n"
    "            if (sub == 0)\n"
    "                p_s[warp][lane / LPP][g] = pr;\n"
    "#pragma unroll\n"
    "            for (int c = 0; c < CPL; c++)\n"
    "                acc[g][c] *= alpha;\n"
    "        }\n"
    "        __syncwarp();\n"
    "        const int n_valid = p - p0 + 1 < TILE ? p - p0 + 1 : TILE;\n"
    "        /* VUN (8) rows' loads in flight: one at a time is a memory latency each */\n"
    "#pragma unroll(VUN)\n"
    "        for (int i = 0; i < n_valid; i++) {\n"
    "            const TS *vr = vpool + (row_s[warp][i] * HKV + kh) * DV;\n"
    "            float vf[CPL];\n"
    "            if constexpr (DV % 32 == 0) {\n"
    "                ldv<CPL>(vr + lane * CPL, vf);\n"
    "            } else {\n"
    "#pragma unroll\n"
    "                for (int c = 0; c < CPL; c++)\n"
    "                    vf[c] = lane * CPL + c < DV ? ld(vr + lane * CPL + c) : 0.0f;\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int g = 0; g < GB; g++) {\n"
    "                const float pg = p_s[warp][i][g];\n"
    "#pragma unroll\n"
    "                for (int c = 0; c < CPL; c++)\n"
    "                    acc[g][c] += pg * vf[c];\n"
    "            }\n"
    "        }\n"
    "        __syncwarp();\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int g = 0; g < GB; g++) {\n"
    "        const float l = warp_sum(lsum[g]);\n"
    "        if (lane == 0) {\n"
    "            m_s[warp][g] = m[g];\n"
    "            l_s[warp][g] = l;\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int c = 0; c < CPL; c++)\n"
    "            if (lane * CPL + c < DV)\n"
    "                acc_s[warp][g][lane * CPL + c] = acc[g][c];\n"
    "    }\n";

/* The tiles on tensor cores (TC; bf16 cache, GB <= 8, DK % 32 == 0, DV %
 * 64 == 0): tiles of 16 positions, each a warp's m16n8k16 products. Lane
 * (r, c) = (lane / 4, lane % 4). Scores S = Q K^T with the query heads as
 * A's rows (r < GB; rows 8..15 zero) and two 8-position column tiles of
 * keys as B: column r of tile j is position p0 + 8 j + r. The 16-wide k
 * steps take a key's channels permuted (a sum: any order that A and B
 * share): within each 32 channels, lane c's 16-byte load of channels
 * 8c..8c+7 is its fragment of two k steps (4 channels each), so every key
 * load is one 16-byte vector. Then O += P V, P (bf16) as A straight from
 * S's accumulators (position k of the 16 is p0 + 2c + {0, 1} and
 * p0 + 8 + 2c + {0, 1}, as S's columns lie) and V as B: column r of
 * output tile u (of 8 a 64-channel half) is channel 64 h + 8 r + u, so the
 * lane's 16-byte loads at 8 r of the four rows it needs hold its
 * fragments (paired by byte_perm). Output (head r, column 2c + e of tile
 * u) is channel 64 h + 8 (2c + e) + u. Each weight is rounded to bf16 once
 * and summed as rounded, so numerator and denominator agree. */
static const char ATTN_BODY_TC[] =
    "    const int r = lane >> 2, c4 = lane & 3;\n"
    "    constexpr int KC = DK / 32, VH = DV / 64;\n"
    "    auto word = [](const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; };\n"
    "    unsigned qa[KC][2][2];\n"
    "#pragma unroll\n"
    "    for (int ch = 0; ch < KC; ch++)\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 2; j++) {\n"
    "            const float *qr = q_s[r < GB ? r : 0] + ch * 32 + c4 * 8 + 4 * j;\n"
    "            qa[ch][j][0] = r < GB ? moec_pack_bf16(qr[0], qr[1]) : 0u;\n"
    "            qa[ch][j][1] = r < GB ? moec_pack_bf16(qr[2], qr[3]) : 0u;\n"
    "        }\n"
    "    float m_r = MOEC_NEG_INF, l_r = 0.0f, oacc[VH][8][4];\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < VH; h++)\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < 8; u++)\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 4; e++)\n"
    "                oacc[h][u][e] = 0.0f;\n"
    "    for (int tile = first + warp; tile < last; tile += NW) {\n"
    "        const int p0 = lo + tile * TILE;\n"
    "        /* every load first (positions past p: zeros, never the pool's\n"
    "           bytes, so that no NaN there meets a weight of 0) */\n"
    "        uint4 kq[2][KC], vq[4][VH];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 2; j++) {\n"
    "            const int pp = p0 + 8 * j + r;\n"
    "            const long long row = pp <= p ? (long long)bt[pp / BS] * BS + pp % BS : 0;\n"
    "            const TS *kr = kpool + (row * HKV + kh) * DK + c4 * 8;\n"
    "#pragma unroll\n"
    "            for (int ch = 0; ch < KC; ch++)\n"
    "                kq[j][ch] = pp <= p ? *reinterpret_cast<const uint4 *>(kr + ch * 32)\n"
    "                                    : make_uint4(0u, 0u, 0u, 0u);\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < 4; i++) {\n"
    "            const int pp = p0 + (i >> 1) * 8 + 2 * c4 + (i & 1);\n"
    "            const long long row = pp <= p ? (long long)bt[pp / BS] * BS + pp % BS : 0;\n"
    "            const TS *vr = vpool + (row * HKV + kh) * DV + r * 8;\n"
    "#pragma unroll\n"
    "            for (int h = 0; h < VH; h++)\n"
    "                vq[i][h] = pp <= p ? *reinterpret_cast<const uint4 *>(vr + h * 64)\n"
    "                                   : make_uint4(0u, 0u, 0u, 0u);\n"
    "        }\n"
    "        float sc[2][4];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 2; j++) {\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 4; e++)\n"
    "                sc[j][e] = 0.0f;\n"
    "#pragma unroll\n"
    "            for (int ch = 0; ch < KC; ch++) {\n"
    "                moec_mma_bf16(sc[j], qa[ch][0][0], 0u, qa[ch][0][1], 0u, kq[j][ch].x, kq[j][ch].y);\n"
    "                moec_mma_bf16(sc[j], qa[ch][1][0], 0u, qa[ch][1][1], 0u, kq[j][ch].z, kq[j][ch].w);\n"
    "            }\n"
    "        }\n"
    "        /* head r's scores at positions p0 + 8 j + 2 c + e: sc[j][e] */\n"
    "        float tmax = MOEC_NEG_INF;\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 2; j++)\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 2; e++) {\n"
    "                sc[j][e] = p0 + 8 * j + 2 * c4 + e <= p ? sc[j][e] * scale : MOEC_NEG_INF;\n"
    "                tmax = fmaxf(tmax, sc[j][e]);\n"
    "            }\n"
    "        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));\n"
    "        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));\n"
    "        const float mnew = fmaxf(m_r, tmax), alpha = expf(m_r - mnew);\n"
    "        unsigned pa[2];\n"
    "        float psum = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 2; j++) {\n"
    "            pa[j] = moec_pack_bf16(sc[j][0] == MOEC_NEG_INF ? 0.0f : expf(sc[j][0] - mnew),\n"
    "                                   sc[j][1] == MOEC_NEG_INF ? 0.0f : expf(sc[j][1] - mnew));\n"
    "            psum += __uint_as_float(pa[j] << 16) + __uint_as_float(pa[j] & 0xffff0000u);\n"
    "        }\n"
    "        l_r = l_r * alpha + psum;\n"
    "        m_r = mnew;\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < VH; h++)\n"
    "#pragma unroll\n"
    "            for (int u = 0; u < 8; u++) {\n"
    "                oacc[h][u][0] *= alpha;\n"
    "                oacc[h][u][1] *= alpha;\n"
    "                const unsigned sel = u & 1 ? 0x7632u : 0x5410u;\n"
    "                moec_mma_bf16(oacc[h][u], pa[0], 0u, pa[1], 0u,\n"
    "                              __byte_perm(word(vq[0][h], u >> 1), word(vq[1][h], u >> 1), sel),\n"
    "                              __byte_perm(word(vq[2][h], u >> 1), word(vq[3][h], u >> 1), sel));\n"
    "            }\n"
    "    }\n"
    "    /* head r's sum over its row's four lanes; its state for the merge */\n"
    "    l_r += __shfl_xor_sync(0xffffffffu, l_r, 1);\n"
    "    l_r += __shfl_xor_sync(0xffffffffu, l_r, 2);\n"
    "    if (r < GB) {\n"
    "        if (c4 == 0) {\n"
    "            m_s[warp][r] = m_r;\n"
    "            l_s[warp][r] = l_r;\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < VH; h++)\n"
    "#pragma unroll\n"
    "            for (int u = 0; u < 8; u++) {\n"
    "                acc_s[warp][r][64 * h + 16 * c4 + u] = oacc[h][u][0];\n"
    "                acc_s[warp][r][64 * h + 16 * c4 + 8 + u] = oacc[h][u][1];\n"
    "            }\n"
    "    }\n";

/* The block's warps' states merged (then ATTN_BODY_TAIL_OUT: the split's
 * partial state, or the output where the sequence is not split), each
 * head's warp weights taken once (H200, 2026-11-29, Qwen3-30B at batch 1:
 * 2.937 ms a step against 2.964 when each value channel's thread took
 * them itself, ATTN_BODY_TAIL_CH). */
static const char ATTN_BODY_TAIL[] =
    "    __syncthreads();\n"
    "    /* each head's warp weights once (a thread a head), then a thread a\n"
    "       value channel: the same sums in the same order as taking the\n"
    "       weights at every channel */\n"
    "    __shared__ float f_s[NW][GB], mx_s[GB], lt_s[GB];\n"
    "    if (threadIdx.x < GB) {\n"
    "        const int g = threadIdx.x;\n"
    "        float mx = MOEC_NEG_INF;\n"
    "#pragma unroll\n"
    "        for (int w = 0; w < NW; w++)\n"
    "            mx = fmaxf(mx, m_s[w][g]);\n"
    "        float l = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int w = 0; w < NW; w++) {\n"
    "            float f = 0.0f;\n"
    "            if (m_s[w][g] != MOEC_NEG_INF) {\n"
    "                f = expf(m_s[w][g] - mx);\n"
    "                l += l_s[w][g] * f;\n"
    "            }\n"
    "            f_s[w][g] = f;\n"
    "        }\n"
    "        mx_s[g] = mx;\n"
    "        lt_s[g] = l;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    for (int i = threadIdx.x; i < GB * DV; i += NT) {\n"
    "        const int g = i / DV, c = i % DV;\n"
    "        const float mx = mx_s[g], l = lt_s[g];\n"
    "        float a = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int w = 0; w < NW; w++)\n"
    "            if (m_s[w][g] != MOEC_NEG_INF)\n"
    "                a += acc_s[w][g][c] * f_s[w][g];\n";

/* The merge as before the head weights (MOEC_ATTN_HEAD_WEIGHTS=0, for
 * A/Bs): every value channel's thread takes its head's warp weights. */
static const char ATTN_BODY_TAIL_CH[] =
    "    __syncthreads();\n"
    "    for (int i = threadIdx.x; i < GB * DV; i += NT) {\n"
    "        const int g = i / DV, c = i % DV;\n"
    "        float mx = MOEC_NEG_INF;\n"
    "#pragma unroll\n"
    "        for (int w = 0; w < NW; w++)\n"
    "            mx = fmaxf(mx, m_s[w][g]);\n"
    "        float l = 0.0f, a = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int w = 0; w < NW; w++) {\n"
    "            if (m_s[w][g] == MOEC_NEG_INF)\n"
    "                continue;\n"
    "            const float f = expf(m_s[w][g] - mx);\n"
    "            l += l_s[w][g] * f;\n"
    "            a += acc_s[w][g][c] * f;\n"
    "        }\n";

/* Both merges' end: the split's state, or the output. */
static const char ATTN_BODY_TAIL_OUT[] =
    "        if constexpr (NSPLIT > 1) {\n"
    "            /* this split's softmax state and unnormalised output */\n"
    "            const long long part = ((long long)t * H + h0 + g) * NSPLIT + split;\n"
    "            part_o[part * DV + c] = a;\n"
    "            if (c == 0) {\n"
    "                part_ml[part * 2] = mx;\n"
    "                part_ml[part * 2 + 1] = l;\n"
    "            }\n"
    "        } else {\n"
    "            st(o + i, a / l);\n"
    "        }\n"
    "    }\n"
    "    if constexpr (MERGE)\n"
    "        arrive();\n";

/* "bf16" when the cache dtype and both operands' dtypes agree, else all three. */
static void dtype_tag(char *buf, size_t cap, ir_dtype pool, ir_dtype a, ir_dtype b)
{
    if (a == pool && b == pool)
        snprintf(buf, cap, "%s", ir_dtype_name(pool));
    else
        snprintf(buf, cap, "%s_%s_%s", ir_dtype_name(pool), ir_dtype_name(a), ir_dtype_name(b));
}

/* MOEC_ATTN_LPP at codegen: lanes a position, 1, 2, 4 or 8, or 0 (the
 * default) for the kernel's choice at run time (see the top). */
static int attn_lanes_per_pos(void)
{
    int n = cg_env_int("MOEC_ATTN_LPP", 1, 0, 8);
    return n == 0 || n == 2 || n == 4 || n == 8 ? n : 1;
}

/* The counts the kernel chooses among at run time: bit N set for N lanes
 * (1 always): MOEC_ATTN_LPP_AUTO at codegen, digits of 1, 2 and 4 (default
 * 124), for A/Bs. */
static unsigned attn_lpp_set(void)
{
    const char *e = getenv("MOEC_ATTN_LPP_AUTO");
    unsigned set = 1u << 1;
    if (!e || !*e)
        e = "124";
    for (; *e; e++)
        if (*e == '2' || *e == '4')
            set |= 1u << (*e - '0');
    return set;
}

/* 1 where the tensor cores' form (ATTN_BODY_TC) takes the attention:
 * a bf16 cache (the compute dtype), at most 8 query heads a block (A's
 * rows), key channels in 32s and value channels in 64s, sm_80 or later,
 * and MOEC_ATTN_TC (default 1) not 0. */
static int attn_tc_fits(const cg_ctx *c, long long DK, long long DV, int gb)
{
    return c->opt->compute_dtype == IR_DTYPE_BF16 && gb <= 8 && DK % 32 == 0 && DV % 64 == 0 &&
           cg_arch_num(c->opt) >= 80 && cg_env_int("MOEC_ATTN_TC", 1, 0, 1);
}

/* Query heads per block: the largest divisor of the group size G, at most
 * 8 (registers), whose shared memory fits. */
static int heads_per_block(long long G, long long DK, long long DV)
{
    for (int gb = (int)(G < 8 ? G : 8); gb >= 1; gb--) {
        if (G % gb)
            continue;
        long long smem = (long long)gb * DK * 4 + (long long)ATTN_WARPS * ATTN_TILE * gb * 4 +
                         (long long)ATTN_WARPS * ATTN_TILE * 8 + 2LL * ATTN_WARPS * gb * 4 +
                         (long long)ATTN_WARPS * gb * DV * 4;
        if (smem <= 44 * 1024)
            return gb;
    }
    return 0;
}

static moec_status emit_attention_kernel(cg_ctx *c, const ir_op *op, const cg_attn_fused_pro *fp,
                                         const char *pro_tag, int ns, int merge, int gb, int lpp,
                                         int tc, unsigned set, int mp1, int kun, int vun);

moec_status cg_emit_attention(cg_ctx *c, const ir_op *op)
{
    const char *who = op->out[0]->name;
    const ir_value *q = op->in[0], *kv = op->in[1], *vv = op->in[2];
    if (op->n_in == 5)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "attention %%%s: a token selection (DeepSeek-V3.2's DSA) runs on the GPU "
                        "as mla_attention over the compressed cache: run the pass pipeline "
                        "through absorb_mla",
                        who);
    if (op->n_in != 4 || q->type.rank != 3 || kv->type.rank != 3 || vv->type.rank != 3)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "attention %%%s: wants q [T, H, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv], pos",
                        who);
    long long H = q->type.dims[1], DK = q->type.dims[2], HKV = kv->type.dims[1],
              DV = vv->type.dims[2];
    if (HKV < 1 || H % HKV || kv->type.dims[2] != DK || vv->type.dims[1] != HKV)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "attention %%%s: q heads %lld must be a multiple of kv heads %lld, with "
                        "matching head dims",
                        who, H, HKV);
    ir_dtype dt = c->opt->compute_dtype, qdt = cg_storage(c, q), kdt = cg_storage(c, kv),
             vdt = cg_storage(c, vv), odt = cg_storage(c, op->out[0]);
    if (qdt == IR_DTYPE_I32 || kdt == IR_DTYPE_I32 || vdt == IR_DTYPE_I32 || odt == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "attention %%%s: q, k, v must be float", who);
    int bs = c->opt->kv_block_size;
    if (bs < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "attention %%%s: kv_block_size %d", who, bs);
    long long G = H / HKV;
    int gb = heads_per_block(G, DK, DV);
    if (gb == 0)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "attention %%%s: head dims %lld, %lld do not fit shared memory", who, DK, DV);
    const char *ts = cg_ctype(dt);
    char tag[64];
    dtype_tag(tag, sizeof tag, dt, kdt, vdt);
    long long krow = HKV * DK, vrow = HKV * DV;

    /* kernel 1: cache write, unless the attn_prologue that computes k and v
       writes their rows itself */
    const ir_op *pro = kv->kind == IR_VALUE_OP ? kv->def : NULL;
    int prewritten = pro && cg_attn_prologue_cache(c->m, pro) == op;
    char wname[256];
    snprintf(wname, sizeof wname, "attn_kv_write_hkv%lld_dk%lld_dv%lld_bs%d_t%d_%s", HKV, DK, DV,
             bs, c->T, tag);
    int is_new = 0;
    int kw = prewritten ? 0 : cg_kernel(c, wname, &is_new);
    if (kw < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "attention %%%s: no memory", who);
    if (!prewritten && is_new) {
        moec_buf_printf(&c->src,
                      "// attention: cache write of k and v (codegen/attention.c, cg_emit_attention)\n"
                      "extern \"C\" __global__ void __launch_bounds__(128) %s(const %s *__restrict__ k, "
                      "const %s *__restrict__ v, const int *__restrict__ pos, const int *__restrict__ "
                      "slots, const int *__restrict__ block_table, int max_blocks, %s *__restrict__ "
                      "kpool, %s *__restrict__ vpool)\n{\n"
                      "    typedef %s TK;\n    typedef %s TV;\n    typedef %s TS;\n"
                      "    constexpr int BS = %d, KROW = %lld, VROW = %lld, KV = %d, VV = %d;\n",
                      wname, cg_ctype(kdt), cg_ctype(vdt), ts, ts, cg_ctype(kdt), cg_ctype(vdt), ts, bs,
                      krow, vrow, cg_vec_width(krow), cg_vec_width(vrow));
        moec_buf_printf(&c->src, "%s}\n\n", WRITE_BODY);
    }
    ir_step *s = prewritten ? NULL : cg_attn_write_step(c, op, kw, kv, vv);
    if (!prewritten && !s)
        return MOEC_ERR(MOEC_ERR_OOM, "attention %%%s: no memory", who);

    /* kernel 2: attention over the cache, the sequence split when the
       bucket's blocks cannot fill the GPU */
    long long blocks = (long long)c->T * HKV * (G / gb);
    /* lanes a position: fixed, or chosen by each token's positions (0:
       one, two or four; one where the sequence is not split); the tensor
       cores' form where one lane would run and the shapes fit it. Its
       registers (about 180) hold two blocks a SM: its splits fill one
       wave of the target's blocks, not more */
    int lpp = attn_lanes_per_pos();
    int tc = lpp == 1 && attn_tc_fits(c, DK, DV, gb);
    int ns = cg_attn_splits(blocks, tc);
    if (lpp == 0 && ns == 1)
        lpp = 1;
    /* MP1, the fewest positions of a split at one lane a position; a
       variant of LPP lanes takes MP1 / LPP */
    int mp1 = ns == 1 ? 1
              : tc    ? cg_attn_split_min(ATTN_TC_SPLIT_MIN)
              : lpp   ? cg_attn_split_min(ATTN_SPLIT_MIN / lpp) * lpp
                      : cg_attn_split_min(ATTN_SPLIT_MIN);
    unsigned set = lpp ? 0 : attn_lpp_set();
    /* the key chunks' and the value rows' loops unrolled by (A/B knobs at
       codegen, names _kuN, _vuN): all of a key's chunks, 8 rows */
    int kun = cg_env_int("MOEC_ATTN_KUNROLL", 0, 0, 64);
    int vun = cg_env_int("MOEC_ATTN_VUNROLL", 8, 1, 32);
    /* 1: the last block merges the splits, 2: only those that may hold
       positions (MOEC_ATTN_MERGE=3) */
    int merge = cg_attn_self_merge(c, H, gb, DV, ns);
    if (merge && cg_attn_merge_live())
        merge = 2;
    /* the token's attn_prologue run here too (one token, an A/B knob) */
    const ir_op *fused = cg_attn_prologue_fused(c, op);
    cg_attn_fused_pro fp;
    char pro_tag[128] = "";
    if (fused) {
        MOEC_TRY(cg_attn_fused_pro_init(c, fused, &fp));
        cg_attn_fused_pro_tag(&fp, pro_tag, sizeof pro_tag);
    }
    moec_status st = emit_attention_kernel(c, op, fused ? &fp : NULL, pro_tag, ns, merge, gb, lpp,
                                           tc, set, mp1, kun, vun);
    if (fused)
        cg_attn_fused_pro_free(&fp);
    return st;
}

/* The attention kernel's step (kernel 2), and its merge's (kernel 3),
 * with fp the token's prologue that it runs too, or NULL. */
static moec_status emit_attention_kernel(cg_ctx *c, const ir_op *op, const cg_attn_fused_pro *fp,
                                         const char *pro_tag, int ns, int merge, int gb, int lpp,
                                         int tc, unsigned set, int mp1, int kun, int vun)
{
    const char *who = op->out[0]->name;
    const ir_value *q = op->in[0], *kv = op->in[1], *vv = op->in[2];
    long long H = q->type.dims[1], DK = q->type.dims[2], HKV = kv->type.dims[1],
              DV = vv->type.dims[2];
    ir_dtype dt = c->opt->compute_dtype, qdt = cg_storage(c, q), odt = cg_storage(c, op->out[0]);
    const char *ts = cg_ctype(dt);
    int bs = c->opt->kv_block_size, is_new = 0;
    char tag[64];
    char aname[256], lpp_tag[16] = "";
    if (lpp == 0)
        snprintf(lpp_tag, sizeof lpp_tag, "_lppa%s%s", set & (1u << 2) ? "" : "_no2",
                 set & (1u << 4) ? "" : "_no4");
    else if (lpp > 1)
        snprintf(lpp_tag, sizeof lpp_tag, "_lpp%d", lpp);
    else if (tc)
        snprintf(lpp_tag, sizeof lpp_tag, "_tc");
    dtype_tag(tag, sizeof tag, dt, qdt, odt);
    char un_tag[32] = "";
    if (kun > 0 || vun != 8)
        snprintf(un_tag, sizeof un_tag, "_ku%d_vu%d", kun, vun);
    const char *merge_tag = merge == 2 ? "_ml" : merge ? "_m" : "";
    snprintf(aname, sizeof aname, "attn_h%lld_hkv%lld_dk%lld_dv%lld_gb%d_ns%d_mp%d%s%s%s%s_bs%d_t%d_%s",
             H, HKV, DK, DV, gb, ns, mp1, lpp_tag, un_tag, merge_tag, pro_tag, bs, c->T, tag);
    int ka = cg_kernel(c, aname, &is_new);
    if (ka < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "attention %%%s: no memory", who);
    if (is_new) {
        /* with the prologue: the qkv row (and the norms) in place of q, and
           pools it writes (the block's own reads of them follow a barrier:
           no read-only path) */
        moec_buf first = {0};
        if (fp) {
            cg_attn_fused_pro_decls(&c->src, fp, aname);
            cg_attn_fused_pro_params(&first, fp);
        } else {
            moec_buf_printf(&first, "const %s *__restrict__ q", cg_ctype(qdt));
        }
        const char *pool_q = fp ? "" : "const ", *pool_r = fp ? "" : "__restrict__ ";
        moec_buf_printf(&c->src,
                      "// attention: GQA over the paged cache, online softmax "
                      "(codegen/attention.c, cg_emit_attention)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d%s) %s(%s, "
                      "const int *__restrict__ pos, const int *__restrict__ slots, const int "
                      "*__restrict__ block_table, int max_blocks, %s%s *%skpool, %s"
                      "%s *%svpool, %s *__restrict__ out, float scale, int window%s)\n{\n"
                      "    typedef %s TQ;\n    typedef %s TS;\n    typedef %s TO;\n"
                      "    constexpr int H = %lld, HKV = %lld, DK = %lld, DV = %lld, GB = %d, BS = %d, "
                      "NT = %d, TMAX = %d, KV = %d, NSPLIT = %d, MP1 = %d;\n"
                      "    constexpr bool LIVE = %s;\n",
                      ATTN_WARPS * 32, lpp ? "" : ", 1", aname, first.data ? first.data : "",
                      pool_q, ts, pool_r, pool_q, ts, pool_r, cg_ctype(odt),
                      cg_attn_part_params(ns, merge), cg_ctype(qdt), ts, cg_ctype(odt), H, HKV,
                      DK, DV, gb, bs, ATTN_WARPS * 32, tc ? ATTN_TC_TILE : 32 / (lpp ? lpp : 1), cg_vec_width(DK), ns,
                      mp1, merge == 2 ? "true" : "false");
        if (first.oom)
            c->src.oom = 1;
        moec_buf_free(&first);
        if (fp)
            cg_attn_fused_pro_consts(&c->src, fp, aname);
        cg_attn_emit_parts(&c->src, ns, merge);
        moec_buf_printf(&c->src, "%s", ATTN_SHARED);
        char tile[16] = "32 / LPP";
        if (tc)
            snprintf(tile, sizeof tile, "%d", ATTN_TC_TILE);
        moec_buf_printf(&c->src,
                        "    /* one variant of the body, LPP lanes a position */\n"
                        "    auto run = [&](auto lc) {\n"
                        "    constexpr int LPP = decltype(lc)::value, TILE = %s,\n"
                        "                  MINPOS = MP1 / LPP > 0 ? MP1 / LPP : 1,\n"
                        "                  KUN = %d > 0 ? %d : (DK / KV + LPP - 1) / LPP, VUN = %d;\n",
                        tile, kun, kun, vun);
        /* a position's rows hold every kv head: the blocks of a split (kv
           heads, then query-head groups) share them out */
        cg_attn_emit_prefetch(c, "TILE", "blockIdx.z % NSPLIT",
                              "(long long)blockIdx.y * (gridDim.z / NSPLIT) + blockIdx.z / NSPLIT",
                              "(long long)gridDim.y * (gridDim.z / NSPLIT)", "kpool", "HKV * DK",
                              "vpool", "HKV * DV", 1);
        moec_buf_printf(&c->src, "%s%s%s", ATTN_BODY_TOKEN, fp ? "" : ATTN_BODY_Q, ATTN_BODY_SPLIT);
        if (fp)
            cg_attn_fused_pro_body(&c->src);
        moec_buf_printf(&c->src, "%s%s%s%s    };\n", ATTN_BODY_EMPTY,
                        tc ? ATTN_BODY_TC : ATTN_BODY_LANES,
                        cg_env_int("MOEC_ATTN_HEAD_WEIGHTS", 1, 0, 1) ? ATTN_BODY_TAIL
                                                                      : ATTN_BODY_TAIL_CH,
                        ATTN_BODY_TAIL_OUT);
        if (lpp)
            moec_buf_printf(&c->src, "    run(moec_ic<%d>());\n}\n\n", lpp);
        else { /* four lanes a position while the token's positions fill
                  no more than NSPLIT splits of MP1 / 4, two while they
                  fill no more than NSPLIT of MP1 / 2, else one: more lanes
                  where splits would idle, fewer where each lane has work
                  enough */
            moec_buf_printf(&c->src,
                            "    const int pq = pos[blockIdx.x];\n"
                            "    const int nq = pq - (window > 0 && pq - window + 1 > 0 ? pq - "
                            "window + 1 : 0) + 1;\n");
            for (int n = 4; n > 1; n /= 2)
                if (set & (1u << n))
                    moec_buf_printf(&c->src,
                                    "    if (nq <= NSPLIT * (MP1 / %d)) {\n"
                                    "        run(moec_ic<%d>());\n"
                                    "        return;\n"
                                    "    }\n",
                                    n, n);
            moec_buf_printf(&c->src, "    run(moec_ic<1>());\n"
                                     "}\n\n");
        }
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "attention %%%s: no memory", who);
    s->kernel = ka;
    s->grid[0] = (unsigned)c->T;
    s->grid[1] = (unsigned)HKV;
    s->grid[2] = (unsigned)(H / HKV / gb * ns);
    s->block[0] = ATTN_WARPS * 32;
    /* launched plainly when it runs the prologue: as a programmatic
       dependent its blocks became resident while the qkv GEMM still ran,
       and the step lost (see the head of this file) */
    s->plain = fp != NULL;
    int i = 1;
    if (fp)
        i = cg_attn_fused_pro_args(s, fp);
    else
        s->args[0] = cg_arg_act(q);
    cg_attn_args(s, op, i, ns, merge);
    if (ns == 1)
        return MOEC_OK;
    /* the splits' partial states, and kernel 3, their merge, unless the
       attention kernel's last block of each group merges them */
    return cg_attn_emit_combine(c, op, s, "attention", "attn", "dv", H, DV, ns, merge);
}
