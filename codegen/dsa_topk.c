/* dsa_topk.c — DeepSeek-V3.2's lightning indexer on the GPU (docs/IR.md,
 * dsa_topk): which cached positions each token's sparse MLA reads. Three
 * kernels:
 *
 *   dsa_k_write   this step's indexer keys into the op's paged key cache
 *                 (KV pool 0, Di values per position; none for padding).
 *   dsa_score     every cached position p <= pos of every token that has
 *                 more than top_k of them: sum_h (w[h] * weight_scale) *
 *                 relu(scale * q[h] . k[p]), into the index-score rows (KV
 *                 pool 1 of the module's first dsa_topk: f32 [tmax,
 *                 max_blocks * block size], shared by the layers, which run
 *                 one after another).
 *   dsa_select    per token, one block of 1024: with n = pos + 1 <= top_k
 *                 positions, all of them (0..pos, then -1s) and no scores
 *                 read; else the top_k best (ties: the lower position, as
 *                 the interpreter breaks them; -0 as +0; a NaN above
 *                 everything), written in ascending position order.
 *
 * Two forms of the last two, MOEC_DSA_KERNEL choosing at code generation:
 *
 * fast (the default). The score kernel, in bf16 with heads and channels in
 * sixteens, is a fixed grid of blocks that split every token's tiles of 64
 * positions evenly between them (tile after tile, token after token, so
 * that short and long contexts of one step share the GPU and a block loads
 * a token's q once per run of its tiles); each tile of keys is fetched by
 * cp.async while the block computes the one before, and four warps of 16
 * positions take S = K Q^T by m16n8k16 MMAs fed by ldmatrix (positions as
 * rows, heads as columns), then sum w[h] * relu(scale * S) over the heads
 * in registers. The select loads the score row once, as order-preserving
 * keys, into shared memory (up to a capacity fixed at code generation;
 * longer rows are read from global memory in each pass instead) with their
 * least and greatest key: radix passes of 11, 11 and 10 bits start below
 * the bits every key shares (a row of equal keys needs none) and stop once
 * the whole bin holding the top_k-th key is taken. Then a compaction by
 * 32-position words: ballots give each word its keys above the threshold
 * and equal to it, a scan of the words' counts places them, and the keys
 * above it and the first equal ones are staged in shared memory and
 * written out in position order.
 *
 * legacy (MOEC_DSA_KERNEL=legacy, kept to compare against). The score
 * kernel takes one token per grid row and a share of its tiles per block
 * (grid.y), its q (all heads) in shared memory beside a tile of keys: in
 * bf16 with heads and channels in sixteens on tensor cores (16 heads by 8
 * positions per MMA), otherwise eight threads share a position, each a
 * strided eighth of the heads, and sum by shuffles. The select reads the
 * scores from global memory in each of four passes of 8-bit digits, then
 * compacts: each thread a run of positions placed by two block scans of
 * its counts.
 *
 * Outside bf16 (or with heads or channels not in sixteens) the fast form
 * scores like the legacy one, on CUDA cores. Everything runs inside the
 * bucket's CUDA Graph: grids are fixed, the context length is read from
 * the positions on the device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

#define DSA_SMEM_MAX (46 * 1024)
#define DSA_HEAD_GROUPS 8     /* threads per position in the score kernel */
#define DSA_SELECT_THREADS 1024
#define DSA_TARGET_BLOCKS 528 /* legacy score blocks that keep an H100's SMs busy */
#define DSA_FAST_PT 64        /* positions of a fast score tile: 4 warps of 16 */
#define DSA_FAST_THREADS 128
#define DSA_SMS 132           /* an H100's SMs: the fast score's grid is a wave of them */
#define DSA_SM_SMEM (228 * 1024) /* shared memory of one of its SMs */
#define DSA_SELECT_CAP 32768  /* positions the fast select keeps in shared memory */
#define DSA_SELECT_STATIC (17 * 1024) /* the fast select's static shared memory, rounded up */

static const char WRITE_BODY[] =
    "    const int t = blockIdx.x;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks)\n"
    "        return;\n"
    "    const long long row = (long long)block_table[(long long)s * max_blocks + p / BS] * BS + p % BS;\n"
    "    for (int i = threadIdx.x; i < DI / V; i += blockDim.x)\n"
    "        cpv<V>(kpool + row * DI + i * V, k + (long long)t * DI + i * V);\n";

static const char SCORE_HEAD[] =
    "    __shared__ __align__(16) TQ q_s[HI][QLD];\n"
    "    __shared__ __align__(16) TS k_s[PT][KLD];\n"
    "    __shared__ float w_s[HI];\n"
    "    __shared__ long long row_s[PT];\n"
    "    const int t = blockIdx.x, tid = threadIdx.x;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    /* padding, or no more than K positions: every one is selected, nothing to score */\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks || p < K)\n"
    "        return;\n"
    "    const int n = p + 1, n_tiles = (n + PT - 1) / PT;\n"
    "    if ((int)blockIdx.y >= n_tiles)\n"
    "        return;\n";

static const char SCORE_TAIL[] =
    "    const int *bt = block_table + (long long)s * max_blocks;\n"
    "    float *srow = scores + (long long)t * max_blocks * BS;\n"
    "    const int pp = tid / HG, hg = tid % HG;\n"
    "    for (int tile = blockIdx.y; tile < n_tiles; tile += gridDim.y) {\n"
    "        const int p0 = tile * PT, nv = n - p0 < PT ? n - p0 : PT;\n"
    "        __syncthreads();\n"
    "        if (tid < nv)\n"
    "            row_s[tid] = (long long)bt[(p0 + tid) / BS] * BS + (p0 + tid) % BS;\n"
    "        __syncthreads();\n"
    "        for (int i = tid; i < nv * (DI / VE); i += NT) {\n"
    "            const int r = i / (DI / VE), j = (i % (DI / VE)) * VE;\n"
    "            cpv<VE>(&k_s[r][j], kpool + row_s[r] * DI + j);\n"
    "        }\n"
    "        __syncthreads();\n"
    "        float acc = 0.0f;\n"
    "        if (pp < nv) {\n"
    "            for (int h = hg; h < HI; h += HG) {\n"
    "                float dot = 0.0f;\n"
    "                for (int j = 0; j < DI; j += VE) {\n"
    "                    float a[VE], b[VE];\n"
    "                    ldv<VE>(&q_s[h][j], a);\n"
    "                    ldv<VE>(&k_s[pp][j], b);\n"
    "#pragma unroll\n"
    "                    for (int e = 0; e < VE; e++)\n"
    "                        dot += a[e] * b[e];\n"
    "                }\n"
    "                acc += w_s[h] * fmaxf(dot * scale, 0.0f);\n"
    "            }\n"
    "        }\n"
    "        /* the HG threads of a position are consecutive lanes of one warp */\n"
    "#pragma unroll\n"
    "        for (int o = 1; o < HG; o <<= 1)\n"
    "            acc += __shfl_xor_sync(0xffffffffu, acc, o);\n"
    "        if (hg == 0 && pp < nv)\n"
    "            srow[p0 + pp] = acc;\n"
    "    }\n";

/* Both legacy forms load the token's q heads (from its row: QS apart,
 * from column QC; VQ-wide) and head weights (WS apart, from WC) into shared
 * memory, then, with ROPE, rotate q there: dsa_topk's rope of q (pass
 * fuse_dsa_indexer), before the tile loop's first barrier. */
static const char SCORE_Q_LOAD[] =
    "    for (int i = tid; i < HI * (DI / VQ); i += NT) {\n"
    "        const int h = i / (DI / VQ), j = (i % (DI / VQ)) * VQ;\n"
    "        cpv<VQ>(&q_s[h][j], q + (long long)t * QS + QC + h * DI + j);\n"
    "    }\n"
    "    for (int h = tid; h < HI; h += NT)\n"
    "        w_s[h] = ld(w + (long long)t * WS + WC + h) * weight_scale;\n"
    "    if constexpr (ROPE) {\n"
    "        __shared__ float cs_s[RDH], sn_s[RDH];\n"
    "        dsa_rope_angles(cs_s, sn_s, RDH, (float)p, inv_freq, AF);\n"
    "        __syncthreads();\n"
    "        dsa_rope_rows<HI, RDH, NEOX, QLD>(&q_s[0][0], cs_s, sn_s);\n"
    "    }\n";

/* dsa_topk's rope of q, folded into the score kernels: the angles of
 * position p (pairs k < rdh, cos and sin times attn_factor, as rope.c
 * computes them), then each of HI heads (rows of LD in shared memory)
 * rotated in place, pairs (k, k + RDH) neox, (2k, 2k + 1) interleaved, each
 * pair read and written by one thread. */
static const char ROPE_HELPERS[] =
    "#ifndef MOEC_DSA_ROPE_HELPERS\n"
    "#define MOEC_DSA_ROPE_HELPERS\n"
    "__device__ __forceinline__ void dsa_rope_angles(float *cs, float *sn, int rdh, float p,\n"
    "                                                const float *inv_freq, float af)\n"
    "{\n"
    "    for (int k = threadIdx.x; k < rdh; k += blockDim.x) {\n"
    "        float s, c;\n"
    "        sincosf(p * inv_freq[k], &s, &c);\n"
    "        cs[k] = c * af;\n"
    "        sn[k] = s * af;\n"
    "    }\n"
    "}\n"
    "template <int HI, int RDH, bool NEOX, int LD, typename T>\n"
    "__device__ __forceinline__ void dsa_rope_rows(T *q, const float *cs, const float *sn)\n"
    "{\n"
    "    for (int i = threadIdx.x; i < HI * RDH; i += blockDim.x) {\n"
    "        const int h = i / RDH, k = i % RDH;\n"
    "        const int i0 = NEOX ? k : 2 * k, i1 = NEOX ? k + RDH : 2 * k + 1;\n"
    "        T *r = q + h * LD;\n"
    "        const float x0 = ld(r + i0), x1 = ld(r + i1);\n"
    "        st(r + i0, x0 * cs[k] - x1 * sn[k]);\n"
    "        st(r + i1, x1 * cs[k] + x0 * sn[k]);\n"
    "    }\n"
    "}\n"
    "#endif\n\n";

/* The tensor-core form of the scores (bf16, heads and channels in sixteens):
 * per tile of PT positions each warp takes 8 of them and every head, S = Q
 * K^T by m16n8k16 MMAs (16 heads by 8 positions, fp32 accumulators), then
 * sums w[h] * relu(scale * S) over the heads: its lanes' two rows per head
 * tile, then across the lanes of a position by shuffles. */
static const char SCORE_MMA_HEAD[] =
    "    constexpr int NW = NT / 32, MT = HI / 16;\n"
    "    __shared__ __align__(16) __nv_bfloat16 q_s[HI][QLD];\n"
    "    __shared__ __align__(16) __nv_bfloat16 k_s[PT][KLD];\n"
    "    __shared__ float w_s[HI];\n"
    "    __shared__ long long row_s[PT];\n"
    "    const int t = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;\n"
    "    const int g = lane >> 2, tq = lane & 3;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks || p < K)\n"
    "        return;\n"
    "    const int n = p + 1, n_tiles = (n + PT - 1) / PT;\n"
    "    if ((int)blockIdx.y >= n_tiles)\n"
    "        return;\n";

static const char SCORE_MMA_TAIL[] =
    "    const int *bt = block_table + (long long)s * max_blocks;\n"
    "    float *srow = scores + (long long)t * max_blocks * BS;\n"
    "    for (int tile = blockIdx.y; tile < n_tiles; tile += gridDim.y) {\n"
    "        const int p0 = tile * PT, nv = n - p0 < PT ? n - p0 : PT;\n"
    "        __syncthreads();\n"
    "        for (int r = tid; r < PT; r += NT)\n"
    "            row_s[r] = r < nv ? (long long)bt[(p0 + r) / BS] * BS + (p0 + r) % BS : -1;\n"
    "        __syncthreads();\n"
    "        /* rows past the context are zeros: their scores are not written */\n"
    "        for (int i = tid; i < PT * (DI / 8); i += NT) {\n"
    "            const int r = i / (DI / 8), j = (i % (DI / 8)) * 8;\n"
    "            if (row_s[r] < 0)\n"
    "                *reinterpret_cast<uint4 *>(&k_s[r][j]) = make_uint4(0u, 0u, 0u, 0u);\n"
    "            else\n"
    "                cpv<8>(&k_s[r][j], kpool + row_s[r] * DI + j);\n"
    "        }\n"
    "        __syncthreads();\n"
    "        for (int n0 = warp * 8; n0 < PT; n0 += NW * 8) {\n"
    "            /* this lane's part of positions n0 + 2tq and n0 + 2tq + 1 */\n"
    "            float a0 = 0.0f, a1 = 0.0f;\n"
    "            for (int mt = 0; mt < MT; mt++) {\n"
    "                const int h = mt * 16;\n"
    "                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    "#pragma unroll\n"
    "                for (int k0 = 0; k0 < DI; k0 += 16)\n"
    "                    moec_mma_bf16(c, dsa_ld32(&q_s[h + g][k0 + 2 * tq]),\n"
    "                                  dsa_ld32(&q_s[h + g + 8][k0 + 2 * tq]),\n"
    "                                  dsa_ld32(&q_s[h + g][k0 + 8 + 2 * tq]),\n"
    "                                  dsa_ld32(&q_s[h + g + 8][k0 + 8 + 2 * tq]),\n"
    "                                  dsa_ld32(&k_s[n0 + g][k0 + 2 * tq]),\n"
    "                                  dsa_ld32(&k_s[n0 + g][k0 + 8 + 2 * tq]));\n"
    "                const float w0 = w_s[h + g], w1 = w_s[h + g + 8];\n"
    "                a0 += w0 * fmaxf(c[0] * scale, 0.0f) + w1 * fmaxf(c[2] * scale, 0.0f);\n"
    "                a1 += w0 * fmaxf(c[1] * scale, 0.0f) + w1 * fmaxf(c[3] * scale, 0.0f);\n"
    "            }\n"
    "            /* the lanes of one tq hold the other rows: lanes tq + 4g */\n"
    "#pragma unroll\n"
    "            for (int o = 4; o < 32; o <<= 1) {\n"
    "                a0 += __shfl_xor_sync(0xffffffffu, a0, o);\n"
    "                a1 += __shfl_xor_sync(0xffffffffu, a1, o);\n"
    "            }\n"
    "            const int col = n0 + 2 * tq;\n"
    "            if (g == 0 && col < nv)\n"
    "                srow[p0 + col] = a0;\n"
    "            if (g == 0 && col + 1 < nv)\n"
    "                srow[p0 + col + 1] = a1;\n"
    "        }\n"
    "    }\n";

static const char MMA_HELPERS[] =
    "#ifndef MOEC_DSA_MMA_HELPERS\n"
    "#define MOEC_DSA_MMA_HELPERS\n"
    "__device__ __forceinline__ unsigned dsa_ld32(const __nv_bfloat16 *p)\n"
    "{\n"
    "    return *reinterpret_cast<const unsigned *>(p);\n"
    "}\n"
    "#endif\n\n";

/* x's inclusive prefix sum over the lanes of a warp, for every kernel here. */
static const char SCAN_HELPERS[] =
    "#ifndef MOEC_DSA_SCAN_HELPERS\n"
    "#define MOEC_DSA_SCAN_HELPERS\n"
    "template <typename T> __device__ __forceinline__ T dsa_warp_scan(T x)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31;\n"
    "#pragma unroll\n"
    "    for (int o = 1; o < 32; o <<= 1) {\n"
    "        const T y = __shfl_up_sync(0xffffffffu, x, o);\n"
    "        if (lane >= o)\n"
    "            x += y;\n"
    "    }\n"
    "    return x;\n"
    "}\n"
    "#endif\n\n";

/* The select kernel's helpers: the order-preserving key of a score, and an
 * exclusive prefix sum over the block with its total. */
static const char SELECT_HELPERS[] =
    "#ifndef MOEC_DSA_SELECT_HELPERS\n"
    "#define MOEC_DSA_SELECT_HELPERS\n"
    "/* keys order as the floats do; -0 and +0 give one key (the floats tie);\n"
    "   every NaN the largest key (a NaN ranks above everything, as in torch.topk) */\n"
    "__device__ __forceinline__ unsigned dsa_key(float v)\n"
    "{\n"
    "    const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);\n"
    "    return v != v ? 0xffffffffu : (u & 0x80000000u) ? ~u : (u | 0x80000000u);\n"
    "}\n"
    "/* v's exclusive prefix sum over the block (blockDim.x a multiple of 32, at\n"
    "   most 1024), the block's total into *total; ws: 33 ints of shared memory */\n"
    "__device__ __forceinline__ int dsa_block_scan(int v, int *total, int *ws)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
    "    const int x = dsa_warp_scan(v);\n"
    "    if (lane == 31)\n"
    "        ws[warp] = x;\n"
    "    __syncthreads();\n"
    "    if (warp == 0) {\n"
    "        const int s = dsa_warp_scan(lane < nw ? ws[lane] : 0);\n"
    "        if (lane < nw)\n"
    "            ws[lane] = s;\n"
    "        if (lane == 31)\n"
    "            ws[32] = s;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    const int r = (warp ? ws[warp - 1] : 0) + x - v;\n"
    "    *total = ws[32];\n"
    "    __syncthreads();\n"
    "    return r;\n"
    "}\n"
    "#endif\n\n";

/* Both selects begin alike: a padding token gets -1s, one with no more than
 * K positions all of them, and no scores are read; else its score row sr
 * of n positions. */
static const char SELECT_ENTRY[] =
    "    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    int *o = out + (long long)t * K;\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks) {\n"
    "        for (int i = tid; i < K; i += NT)\n"
    "            o[i] = -1;\n"
    "        return;\n"
    "    }\n"
    "    const int n = p + 1;\n"
    "    if (n <= K) {\n"
    "        for (int i = tid; i < K; i += NT)\n"
    "            o[i] = i < n ? i : -1;\n"
    "        return;\n"
    "    }\n"
    "    const float *sr = scores + (long long)t * max_blocks * BS;\n";

static const char SELECT_BODY[] =
    "    __shared__ unsigned hist[256];\n"
    "    __shared__ unsigned pick_s[2];\n"
    "    __shared__ int ws[33];\n"
    "    /* the K-th largest key, 8 bits a pass from the top; `remain`: its rank\n"
    "       among the keys that match the digits found so far */\n"
    "    unsigned prefix = 0u, mask = 0u;\n"
    "    int remain = K;\n"
    "    for (int shift = 24; shift >= 0; shift -= 8) {\n"
    "        for (int i = tid; i < 256; i += NT)\n"
    "            hist[i] = 0u;\n"
    "        __syncthreads();\n"
    "        /* whole warps per round, so that a warp adds its equal digits once:\n"
    "           scores crowd into few digits (the top ones share an exponent) */\n"
    "        for (int c0 = 0; c0 < n; c0 += NT) {\n"
    "            const int i = c0 + tid;\n"
    "            const unsigned key = i < n ? dsa_key(sr[i]) : 0u;\n"
    "            const bool hit = i < n && (key & mask) == prefix;\n"
    "            const unsigned d = hit ? (key >> shift) & 255u : 256u;\n"
    "            const unsigned peers = __match_any_sync(0xffffffffu, d);\n"
    "            if (hit && lane == __ffs(peers) - 1)\n"
    "                atomicAdd(&hist[d], (unsigned)__popc(peers));\n"
    "        }\n"
    "        __syncthreads();\n"
    "        if (tid < 32) {\n"
    "            /* lane l counts digits 255 - 8l down to 248 - 8l */\n"
    "            unsigned cnt = 0u;\n"
    "            for (int b = 0; b < 8; b++)\n"
    "                cnt += hist[255 - lane * 8 - b];\n"
    "            const unsigned incl = dsa_warp_scan(cnt);\n"
    "            unsigned cum = incl - cnt;\n"
    "            if (cum < (unsigned)remain && (unsigned)remain <= incl)\n"
    "                for (int b = 0; b < 8; b++) {\n"
    "                    const unsigned d = 255u - (unsigned)(lane * 8 + b), h = hist[d];\n"
    "                    if (cum + h >= (unsigned)remain) {\n"
    "                        pick_s[0] = d;\n"
    "                        pick_s[1] = (unsigned)remain - cum;\n"
    "                        break;\n"
    "                    }\n"
    "                    cum += h;\n"
    "                }\n"
    "        }\n"
    "        __syncthreads();\n"
    "        prefix |= pick_s[0] << shift;\n"
    "        mask |= 255u << shift;\n"
    "        remain = (int)pick_s[1];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    /* above the threshold key: taken; equal: the first `remain` of them.\n"
    "       Thread tid owns positions [i0, i1): its counts, scanned over the\n"
    "       block, say where its takes go, in position order */\n"
    "    const int L = (n + NT - 1) / NT, i0 = tid * L, i1 = i0 + L < n ? i0 + L : n;\n"
    "    int gt = 0, eq = 0;\n"
    "    for (int i = i0; i < i1; i++) {\n"
    "        const unsigned key = dsa_key(sr[i]);\n"
    "        gt += key > prefix;\n"
    "        eq += key == prefix;\n"
    "    }\n"
    "    int n_gt, n_eq;\n"
    "    const int gt_before = dsa_block_scan(gt, &n_gt, ws);\n"
    "    int eq_before = dsa_block_scan(eq, &n_eq, ws);\n"
    "    int at = gt_before + (eq_before < remain ? eq_before : remain);\n"
    "    for (int i = i0; i < i1; i++) {\n"
    "        const unsigned key = dsa_key(sr[i]);\n"
    "        const bool take = key > prefix || (key == prefix && eq_before++ < remain);\n"
    "        if (take && at < K)\n"
    "            o[at++] = i;\n"
    "    }\n";

/* ---- the fast form ---------------------------------------------------------- */

/* The fast score kernel (bf16, heads and channels in sixteens): the items
 * are every token's tiles of PT positions, numbered token after token;
 * block b takes items [b I / G, (b + 1) I / G). Per item: the next tile's
 * keys start loading (cp.async), this one's are waited for, and warp w
 * computes positions 16w..16w+15 against every head: A = 16 keys by 16
 * channels, B = 16 channels by 8 heads, fp32 accumulators c[head tile]; a
 * lane holds positions g and g + 8 for heads 8j + 2tq and 8j + 2tq + 1, sums
 * w[h] * relu(scale * S) over them, and the four lanes of a position add
 * theirs by shuffles. */
static const char SCORE_FAST_BODY[] =
    "    constexpr int NW = NT / 32, CH = DI / 8, NTN = HI / 8;\n"
    "    struct Smem {\n"
    "        __nv_bfloat16 q[HI][LD];\n"
    "        __nv_bfloat16 k[2][PT][LD];\n"
    "        float w[HI];\n"
    "        float cs[RDH], sn[RDH];\n"
    "        int first[TT + 1];\n"
    "    };\n"
    "    static_assert(sizeof(Smem) == SMEM, \"shared memory layout\");\n"
    "    static_assert(PT == NW * 16 && HI % 16 == 0 && DI % 16 == 0, \"tile shapes\");\n"
    "    extern __shared__ __align__(16) unsigned char smem_raw[];\n"
    "    Smem &sm = *reinterpret_cast<Smem *>(smem_raw);\n"
    "    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;\n"
    "    /* first[t]: token t's first item; padding, and tokens with no more than\n"
    "       K positions (every one selected), have none */\n"
    "    if (warp == 0) {\n"
    "        int carry = 0;\n"
    "        for (int t0 = 0; t0 < TT; t0 += 32) {\n"
    "            const int t = t0 + lane;\n"
    "            int nt = 0;\n"
    "            if (t < TT) {\n"
    "                const int s = slots[t], p = pos[t];\n"
    "                if (s >= 0 && p >= K && p / BS < max_blocks)\n"
    "                    nt = p / PT + 1;\n"
    "            }\n"
    "            const int x = dsa_warp_scan(nt);\n"
    "            if (t < TT)\n"
    "                sm.first[t] = carry + x - nt;\n"
    "            carry += __shfl_sync(0xffffffffu, x, 31);\n"
    "        }\n"
    "        if (lane == 0)\n"
    "            sm.first[TT] = carry;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    const long long total = sm.first[TT];\n"
    "    const int i0 = (int)(total * blockIdx.x / gridDim.x);\n"
    "    const int i1 = (int)(total * (blockIdx.x + 1) / gridDim.x);\n"
    "    if (i0 >= i1)\n"
    "        return;\n"
    "    /* tile j of token t into buffer b; rows past the token's position are zeros */\n"
    "    auto load_tile = [&](int t, int j, int b) {\n"
    "        const int n = pos[t] + 1, p0 = j * PT;\n"
    "        const int *bt = block_table + (long long)slots[t] * max_blocks;\n"
    "        for (int c = tid; c < PT * CH; c += NT) {\n"
    "            const int r = c / CH, col = (c % CH) * 8, x = p0 + r;\n"
    "            const __nv_bfloat16 *src = kpool;\n"
    "            if (x < n)\n"
    "                src = kpool + ((long long)bt[x / BS] * BS + x % BS) * DI + col;\n"
    "            moec_cp16(&sm.k[b][r][col], src, x < n);\n"
    "        }\n"
    "    };\n"
    "    int t = 0, qt = -1;\n"
    "    bool rot = false;\n"
    "    while (sm.first[t + 1] <= i0)\n"
    "        t++;\n"
    "    load_tile(t, i0 - sm.first[t], 0);\n"
    "    moec_cp_commit();\n"
    "    for (int i = i0; i < i1; i++) {\n"
    "        const int b = (i - i0) & 1;\n"
    "        while (sm.first[t + 1] <= i)\n"
    "            t++;\n"
    "        /* a new token: its q and head weights (the last tile's products are done) */\n"
    "        if (t != qt) {\n"
    "            for (int c = tid; c < HI * CH; c += NT) {\n"
    "                const int h = c / CH, col = (c % CH) * 8;\n"
    "                moec_cp16(&sm.q[h][col], q + (long long)t * QS + QC + h * DI + col, true);\n"
    "            }\n"
    "            for (int h = tid; h < HI; h += NT)\n"
    "                sm.w[h] = ld(w + (long long)t * WS + WC + h) * weight_scale;\n"
    "            if constexpr (ROPE)\n"
    "                dsa_rope_angles(sm.cs, sm.sn, RDH, (float)pos[t], inv_freq, AF);\n"
    "            rot = ROPE;\n"
    "            qt = t;\n"
    "        }\n"
    "        moec_cp_commit();\n"
    "        if (i + 1 < i1) {\n"
    "            int tn = t;\n"
    "            while (sm.first[tn + 1] <= i + 1)\n"
    "                tn++;\n"
    "            load_tile(tn, i + 1 - sm.first[tn], b ^ 1);\n"
    "        }\n"
    "        moec_cp_commit();\n"
    "        /* every group but the next tile's: this tile and q are in */\n"
    "        moec_cp_wait_group<1>();\n"
    "        __syncthreads();\n"
    "        /* a new token's q is in: rotated in place once (rot is the block's) */\n"
    "        if (rot) {\n"
    "            dsa_rope_rows<HI, RDH, NEOX, LD>(&sm.q[0][0], sm.cs, sm.sn);\n"
    "            __syncthreads();\n"
    "            rot = false;\n"
    "        }\n"
    "        const int p0 = (i - sm.first[t]) * PT, n = pos[t] + 1;\n"
    "        const int nv = n - p0 < PT ? n - p0 : PT;\n"
    "        if (warp * 16 < nv) {\n"
    "            float c[NTN][4];\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NTN; j++)\n"
    "                c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;\n"
    "#pragma unroll\n"
    "            for (int k0 = 0; k0 < DI; k0 += 16) {\n"
    "                unsigned a[4];\n"
    "                moec_ldmatrix<4, false>(a, &sm.k[b][warp * 16 + (lane & 15)][k0 + (lane >> 4) * 8]);\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < NTN / 2; j++) {\n"
    "                    unsigned bq[4];\n"
    "                    moec_ldmatrix<4, false>(bq, &sm.q[j * 16 + (lane >> 4) * 8 + (lane & 7)][k0 + ((lane >> 3) & 1) * 8]);\n"
    "                    moec_mma_bf16(c[2 * j], a[0], a[1], a[2], a[3], bq[0], bq[1]);\n"
    "                    moec_mma_bf16(c[2 * j + 1], a[0], a[1], a[2], a[3], bq[2], bq[3]);\n"
    "                }\n"
    "            }\n"
    "            float lo = 0.0f, hi = 0.0f;\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NTN; j++) {\n"
    "                const float w0 = sm.w[j * 8 + 2 * tq], w1 = sm.w[j * 8 + 2 * tq + 1];\n"
    "                lo += w0 * fmaxf(c[j][0] * scale, 0.0f) + w1 * fmaxf(c[j][1] * scale, 0.0f);\n"
    "                hi += w0 * fmaxf(c[j][2] * scale, 0.0f) + w1 * fmaxf(c[j][3] * scale, 0.0f);\n"
    "            }\n"
    "            lo += __shfl_xor_sync(0xffffffffu, lo, 1);\n"
    "            hi += __shfl_xor_sync(0xffffffffu, hi, 1);\n"
    "            lo += __shfl_xor_sync(0xffffffffu, lo, 2);\n"
    "            hi += __shfl_xor_sync(0xffffffffu, hi, 2);\n"
    "            float *srow = scores + (long long)t * max_blocks * BS + p0;\n"
    "            const int r = warp * 16 + g;\n"
    "            if (tq == 0 && r < nv)\n"
    "                srow[r] = lo;\n"
    "            if (tq == 0 && r + 8 < nv)\n"
    "                srow[r + 8] = hi;\n"
    "        }\n"
    "        /* every warp is done with buffer b and q before they are loaded again */\n"
    "        __syncthreads();\n"
    "    }\n";

/* The fast select's helpers: the least and greatest key of a warp, and the
 * pick of the histogram bin that holds a rank. */
static const char FAST_SELECT_HELPERS[] =
    "#ifndef MOEC_DSA_FAST_SELECT_HELPERS\n"
    "#define MOEC_DSA_FAST_SELECT_HELPERS\n"
    "__device__ __forceinline__ unsigned dsa_warp_min(unsigned v)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    return __reduce_min_sync(0xffffffffu, v);\n"
    "#else\n"
    "    for (int o = 16; o > 0; o >>= 1)\n"
    "        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    return v;\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ unsigned dsa_warp_max(unsigned v)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    return __reduce_max_sync(0xffffffffu, v);\n"
    "#else\n"
    "    for (int o = 16; o > 0; o >>= 1)\n"
    "        v = max(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    return v;\n"
    "#endif\n"
    "}\n"
    "/* The bin of h (B bins; each thread a run of them from the top) that holds\n"
    "   the remain-th largest key: pick[0] the bin, pick[1] the rank left inside\n"
    "   it, pick[2] its count; 1 <= remain <= the keys in h. ws: 32 words.\n"
    "   Every thread of a block of 32 warps calls it; pick is read after. */\n"
    "__device__ __forceinline__ void dsa_pick(const unsigned *h, int B, unsigned remain,\n"
    "                                         unsigned *pick, unsigned *ws)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "    const int per = (B + (int)blockDim.x - 1) / (int)blockDim.x;\n"
    "    const int top = B - 1 - (int)threadIdx.x * per;\n"
    "    unsigned cnt = 0u;\n"
    "    for (int b = 0; b < per && top - b >= 0; b++)\n"
    "        cnt += h[top - b];\n"
    "    const unsigned x = dsa_warp_scan(cnt);\n"
    "    if (lane == 31)\n"
    "        ws[warp] = x;\n"
    "    __syncthreads();\n"
    "    const unsigned wt = ws[lane], wi = dsa_warp_scan(wt);\n"
    "    unsigned cum = __shfl_sync(0xffffffffu, wi - wt, warp) + x - cnt;\n"
    "    if (cum < remain && remain <= cum + cnt)\n"
    "        for (int b = 0; b < per && top - b >= 0; b++) {\n"
    "            const unsigned hb = h[top - b];\n"
    "            if (cum + hb >= remain) {\n"
    "                pick[0] = (unsigned)(top - b);\n"
    "                pick[1] = remain - cum;\n"
    "                pick[2] = hb;\n"
    "                break;\n"
    "            }\n"
    "            cum += hb;\n"
    "        }\n"
    "    __syncthreads();\n"
    "}\n"
    "#endif\n\n";

/* The fast select (a block of 32 warps per token). Rows of up to CAP
 * positions are loaded once, as keys, into shared memory, with the least
 * and greatest key: the bits above the highest one where they differ are
 * common to every key, so the radix passes (11, 11, 10 bits) start below
 * them, and a row of equal keys needs none. Longer rows are read from
 * global memory in each pass. Each pass counts the digits of the keys that
 * match the threshold's bits found so far (plain shared atomics: cheaper
 * here than a warp's vote for equal digits), then picks the bin of the
 * K-th; a pass stops the search when that whole bin is taken. Compaction
 * in segments of 32 x 1024 positions: a warp's ballots give each 32-position
 * word its masks of keys above the threshold and equal to it, thread w
 * scans word w's counts over the block (above and equal packed in one
 * word), and takes its word's keys above the threshold and the first
 * equal ones still wanted, in position order; a row in shared memory is
 * staged there (its keys are read no more) and copied out coalesced. */
static const char SELECT_FAST_BODY[] =
    "    constexpr int NW = NT / 32, U = 4;\n"
    "    static_assert(NW == 32 && CAP <= 32 * NT, \"a word per thread, one segment in shared memory\");\n"
    "    extern __shared__ __align__(16) unsigned char smem_raw[];\n"
    "    unsigned *ks = reinterpret_cast<unsigned *>(smem_raw);\n"
    "    __shared__ unsigned hist[2][2048], ws[2][NW], pick_s[3];\n"
    "    const int warp = tid >> 5;\n"
    "    const bool in_smem = n <= CAP;\n"
    "    for (int i = tid; i < 2048; i += NT)\n"
    "        hist[0][i] = 0u;\n"
    "    /* the row as keys, whole float4s (none past n) then the rest */\n"
    "    const int n4 = in_smem && BS % 4 == 0 ? n >> 2 : 0;\n"
    "    unsigned lo = 0xffffffffu, hi = 0u;\n"
    "    for (int c = 0; c < n4; c += U * NT) {\n"
    "        float4 v[U];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++)\n"
    "            if (c + u * NT + tid < n4)\n"
    "                v[u] = reinterpret_cast<const float4 *>(sr)[c + u * NT + tid];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < U; u++)\n"
    "            if (c + u * NT + tid < n4) {\n"
    "                const uint4 k = make_uint4(dsa_key(v[u].x), dsa_key(v[u].y), dsa_key(v[u].z),\n"
    "                                           dsa_key(v[u].w));\n"
    "                reinterpret_cast<uint4 *>(ks)[c + u * NT + tid] = k;\n"
    "                lo = min(lo, min(min(k.x, k.y), min(k.z, k.w)));\n"
    "                hi = max(hi, max(max(k.x, k.y), max(k.z, k.w)));\n"
    "            }\n"
    "    }\n"
    "    for (int i = 4 * n4 + tid; in_smem && i < n; i += NT) {\n"
    "        const unsigned k = dsa_key(sr[i]);\n"
    "        ks[i] = k;\n"
    "        lo = min(lo, k);\n"
    "        hi = max(hi, k);\n"
    "    }\n"
    "    lo = dsa_warp_min(lo);\n"
    "    hi = dsa_warp_max(hi);\n"
    "    if (lane == 0) {\n"
    "        ws[0][warp] = lo;\n"
    "        ws[1][warp] = hi;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    lo = dsa_warp_min(ws[0][lane]);\n"
    "    hi = dsa_warp_max(ws[1][lane]);\n"
    "    /* the K-th largest key: `prefix` its bits under `mask` found so far,\n"
    "       `remain` its rank among the keys that match them; bits [0, low) open */\n"
    "    unsigned prefix = 0u, mask = 0u, remain = (unsigned)K;\n"
    "    int low = 32;\n"
    "    if (in_smem) {\n"
    "        low = lo == hi ? 0 : 32 - __clz(lo ^ hi);\n"
    "        mask = low == 32 ? 0u : 0xffffffffu << low;\n"
    "        prefix = lo & mask;\n"
    "    }\n"
    "    for (int pass = 0; low > 0; pass++) {\n"
    "        const int bits = low < 11 ? low : 11, shift = low - bits;\n"
    "        const unsigned B = 1u << bits;\n"
    "        unsigned *h = hist[pass & 1];\n"
    "        if (in_smem) {\n"
    "            for (int j = tid; j < n4; j += NT) {\n"
    "                const uint4 k = reinterpret_cast<const uint4 *>(ks)[j];\n"
    "                if ((k.x & mask) == prefix)\n"
    "                    atomicAdd(&h[(k.x >> shift) & (B - 1u)], 1u);\n"
    "                if ((k.y & mask) == prefix)\n"
    "                    atomicAdd(&h[(k.y >> shift) & (B - 1u)], 1u);\n"
    "                if ((k.z & mask) == prefix)\n"
    "                    atomicAdd(&h[(k.z >> shift) & (B - 1u)], 1u);\n"
    "                if ((k.w & mask) == prefix)\n"
    "                    atomicAdd(&h[(k.w >> shift) & (B - 1u)], 1u);\n"
    "            }\n"
    "            for (int i = 4 * n4 + tid; i < n; i += NT)\n"
    "                if ((ks[i] & mask) == prefix)\n"
    "                    atomicAdd(&h[(ks[i] >> shift) & (B - 1u)], 1u);\n"
    "        } else {\n"
    "            for (int c = 0; c < n; c += U * NT) {\n"
    "                float v[U];\n"
    "#pragma unroll\n"
    "                for (int u = 0; u < U; u++)\n"
    "                    v[u] = c + u * NT + tid < n ? sr[c + u * NT + tid] : 0.0f;\n"
    "#pragma unroll\n"
    "                for (int u = 0; u < U; u++) {\n"
    "                    const unsigned k = dsa_key(v[u]);\n"
    "                    if (c + u * NT + tid < n && (k & mask) == prefix)\n"
    "                        atomicAdd(&h[(k >> shift) & (B - 1u)], 1u);\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "        /* the next pass's bins: the last pick that read them is behind a barrier */\n"
    "        for (int i = tid; i < 2048; i += NT)\n"
    "            hist[(pass + 1) & 1][i] = 0u;\n"
    "        __syncthreads();\n"
    "        dsa_pick(h, (int)B, remain, pick_s, ws[0]);\n"
    "        prefix |= pick_s[0] << shift;\n"
    "        mask |= (B - 1u) << shift;\n"
    "        remain = pick_s[1];\n"
    "        low = shift;\n"
    "        /* every key of the bin taken: no tie to break inside it */\n"
    "        if (pick_s[2] == remain)\n"
    "            break;\n"
    "    }\n"
    "    /* taken: the keys above the threshold (under mask) and the first `remain`\n"
    "       equal to it; the histograms hold the words' masks now */\n"
    "    unsigned *am = hist[0], *tm = hist[1];\n"
    "    int *stage = in_smem ? reinterpret_cast<int *>(ks) : o;\n"
    "    unsigned above0 = 0u, tie0 = 0u; /* the counts of the segments before */\n"
    "    for (int s0 = 0; s0 < n; s0 += 32 * NT) {\n"
    "        const int nw = (n - s0 + 31) >> 5 < NT ? (n - s0 + 31) >> 5 : NT;\n"
    "        for (int w = warp; w < nw; w += NW) {\n"
    "            const int i = s0 + 32 * w + lane;\n"
    "            const unsigned km = (i < n ? (in_smem ? ks[i] : dsa_key(sr[i])) : 0u) & mask;\n"
    "            const unsigned a = __ballot_sync(0xffffffffu, i < n && km > prefix);\n"
    "            const unsigned e = __ballot_sync(0xffffffffu, i < n && km == prefix);\n"
    "            if (lane == 0) {\n"
    "                am[w] = a;\n"
    "                tm[w] = e;\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "        const unsigned ma = tid < nw ? am[tid] : 0u, me = tid < nw ? tm[tid] : 0u;\n"
    "        const unsigned cnt = (unsigned)__popc(ma) << 16 | (unsigned)__popc(me);\n"
    "        const unsigned x = dsa_warp_scan(cnt);\n"
    "        if (lane == 31)\n"
    "            ws[0][warp] = x;\n"
    "        __syncthreads();\n"
    "        const unsigned wt = ws[0][lane], wi = dsa_warp_scan(wt);\n"
    "        const unsigned total = __shfl_sync(0xffffffffu, wi, 31);\n"
    "        const unsigned before = __shfl_sync(0xffffffffu, wi - wt, warp) + x - cnt;\n"
    "        const unsigned ab = above0 + (before >> 16), eb = tie0 + (before & 0xffffu);\n"
    "        /* this word's keys above, and its first equal ones while some are wanted */\n"
    "        unsigned take = ma, left = remain > eb ? remain - eb : 0u, m = me;\n"
    "        if (left >= (unsigned)__popc(me))\n"
    "            take |= me;\n"
    "        else\n"
    "            for (; left; left--) {\n"
    "                take |= m & (0u - m);\n"
    "                m &= m - 1u;\n"
    "            }\n"
    "        int at = (int)(ab + (eb < remain ? eb : remain));\n"
    "        for (; take; take &= take - 1u, at++)\n"
    "            if (at < K)\n"
    "                stage[at] = s0 + 32 * tid + __ffs(take) - 1;\n"
    "        above0 += total >> 16;\n"
    "        tie0 += total & 0xffffu;\n"
    "        /* the masks and ws are rewritten by the next segment; stage is complete */\n"
    "        __syncthreads();\n"
    "    }\n"
    "    if (in_smem)\n"
    "        for (int i = tid; i < K; i += NT)\n"
    "            o[i] = stage[i];\n";

static long long round_up(long long n, long long m) { return (n + m - 1) / m * m; }

/* The module's first dsa_topk: its KV pool 1 holds the index scores of
 * every dsa_topk (the runtime allocates it there: runtime/cuda_memory.c). */
static const ir_op *first_dsa(const ir_module *m)
{
    for (int i = 0; i < m->n_ops; i++)
        if (m->ops[i]->kind == IR_OP_DSA_TOPK)
            return m->ops[i];
    return NULL;
}

/* pos, slots, block_table, max_blocks from args[i]. */
static void seq_args(ir_step *s, int i)
{
    s->args[i] = cg_arg_input(IR_INPUT_POSITIONS);
    s->args[i + 1] = cg_arg_input(IR_INPUT_SLOTS);
    s->args[i + 2] = cg_arg_input(IR_INPUT_BLOCK_TABLE);
    s->args[i + 3] = cg_arg_config(IR_CONFIG_MAX_BLOCKS);
}

/* The score kernels' arguments: q, w, then the sequence's, the key pool, the
 * score rows, scale and weight_scale. */
static void score_args(ir_step *s, const ir_op *op, const ir_op *pool_op)
{
    s->n_args = 10;
    s->args[0] = cg_arg_act(op->in[0]);
    s->args[1] = cg_arg_act(op->in[2]);
    seq_args(s, 2);
    s->args[6] = cg_arg_kv(op, 0);
    s->args[7] = cg_arg_kv(pool_op, 1);
    s->args[8] = cg_arg_f32(ir_op_attr_float(op, "scale", 1.0));
    s->args[9] = cg_arg_f32(ir_op_attr_float(op, "weight_scale", 1.0));
}

/* Where the score kernels find q and the head weights, and q's rope: the
 * kernels' QS, QC, WS, WC (token t's head h at q + t * QS + QC + h * DI,
 * its weight at w + t * WS + WC + h), ROPE, NEOX, RDH, AF and the frequency
 * table; sfx, what of it a kernel name says. */
typedef struct dsa_q {
    long long hi, di, qs, qc, ws, wc, rdh;
    int rope, neox;
    cg_rope rt;
    char sfx[96];
} dsa_q;

static moec_status dsa_q_init(const ir_op *op, dsa_q *dq)
{
    memset(dq, 0, sizeof *dq);
    const ir_value *q = op->in[0], *k = op->in[1], *w = op->in[2];
    dq->di = k->type.dims[1];
    if (ir_op_attr(op, "heads")) {
        dq->hi = ir_op_attr_int(op, "heads", 0);
        dq->qs = q->type.dims[1];
        dq->qc = ir_op_attr_int(op, "q_col", 0);
        dq->ws = w->type.dims[1];
        dq->wc = ir_op_attr_int(op, "w_col", 0);
    } else {
        dq->hi = q->type.dims[1];
        dq->qs = dq->hi * dq->di;
        dq->ws = dq->hi;
    }
    dq->rope = ir_op_attr(op, "style") != NULL;
    dq->rdh = 1;
    int n = 0;
    if (dq->qs != dq->hi * dq->di || dq->qc || dq->ws != dq->hi || dq->wc)
        n = snprintf(dq->sfx, sizeof dq->sfx, "_q%lld_%lld_w%lld_%lld", dq->qs, dq->qc, dq->ws,
                     dq->wc);
    if (!dq->rope)
        return MOEC_OK;
    const char *style = ir_op_attr_str(op, "style", "");
    dq->neox = !strcmp(style, "neox");
    long long rd = ir_op_attr_int(op, "rotary_dim", dq->di);
    if ((!dq->neox && strcmp(style, "interleave") != 0) || rd < 2 || rd > dq->di || rd % 2)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "dsa_topk %%%s: q's rope wants style \"neox\" or \"interleave\" and an "
                        "even rotary_dim <= %lld",
                        op->out[0]->name, dq->di);
    dq->rdh = rd / 2;
    MOEC_TRY(cg_rope_init(op, rd, &dq->rt));
    snprintf(dq->sfx + n, sizeof dq->sfx - (size_t)n, "_%s%lld_%08x", dq->neox ? "neox" : "il", rd,
             dq->rt.hash);
    return MOEC_OK;
}

/* The score kernels' constants and table of dq: before the kernel (the
 * table, named after it) and inside it. */
static void dsa_q_table(moec_buf *b, const dsa_q *dq, const char *kernel)
{
    if (dq->rope) {
        char sym[300];
        snprintf(sym, sizeof sym, "%s_inv_freq", kernel);
        cg_rope_emit_table(b, &dq->rt, sym);
    }
}

static void dsa_q_consts(moec_buf *b, const dsa_q *dq, const char *kernel)
{
    moec_buf_printf(b,
                    "    constexpr long long QS = %lld, QC = %lld, WS = %lld, WC = %lld;\n"
                    "    constexpr int RDH = %lld;\n"
                    "    constexpr bool ROPE = %s, NEOX = %s;\n"
                    "    constexpr float AF = %af;\n",
                    dq->qs, dq->qc, dq->ws, dq->wc, dq->rdh, dq->rope ? "true" : "false",
                    dq->neox ? "true" : "false", (double)(dq->rope ? dq->rt.attn_factor : 1.0f));
    if (dq->rope)
        moec_buf_printf(b, "    const float *inv_freq = %s_inv_freq;\n", kernel);
    else
        moec_buf_printf(b, "    const float *inv_freq = nullptr;\n");
    moec_buf_printf(b, "    (void)RDH;\n    (void)NEOX;\n    (void)AF;\n    (void)inv_freq;\n");
}

static moec_status emit_write(cg_ctx *c, const ir_op *op, long long DI, const char *kt,
                              const char *st, const char *tag)
{
    int bs = c->opt->kv_block_size, is_new;
    char name[256];
    snprintf(name, sizeof name, "dsa_k_write_d%lld_bs%d_t%d_%s", DI, bs, c->T, tag);
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", op->out[0]->name);
    if (is_new)
        moec_buf_printf(&c->src,
                        "// dsa_topk: the indexer's keys into its paged cache (codegen/dsa_topk.c)\n"
                        "extern \"C\" __global__ void __launch_bounds__(128) %s(const %s "
                        "*__restrict__ k, const int *__restrict__ pos, const int *__restrict__ "
                        "slots, const int *__restrict__ block_table, int max_blocks, %s "
                        "*__restrict__ kpool)\n{\n"
                        "    constexpr int DI = %lld, BS = %d, V = %d;\n%s}\n\n",
                        name, kt, st, DI, bs, cg_vec_width(DI), WRITE_BODY);
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", op->out[0]->name);
    s->kernel = k;
    s->grid[0] = (unsigned)c->T;
    s->block[0] = 128;
    s->n_args = 6;
    s->args[0] = cg_arg_act(op->in[1]);
    seq_args(s, 1);
    s->args[5] = cg_arg_kv(op, 0);
    return MOEC_OK;
}

/* The largest dynamic shared memory a block may opt in to on arch ("sm_XY"). */
static long long smem_optin(const char *arch)
{
    int v = 0;
    if (sscanf(arch, "sm_%d", &v) != 1)
        return 48 * 1024;
    if (v >= 120 || v == 86 || v == 89)
        return 99 * 1024;
    if (v >= 90)
        return 227 * 1024;
    if (v == 80 || v == 87)
        return 163 * 1024;
    return v >= 75 ? 64 * 1024 : 48 * 1024;
}

/* The fast score kernel (see SCORE_FAST_BODY); *done = 0 when its shared
 * memory does not fit, or q's rows are not 16-byte aligned for cp.async,
 * and another form must do. */
static moec_status emit_score_fast(cg_ctx *c, const ir_op *op, const dsa_q *dq, long long K,
                                   const ir_op *pool_op, const char *tag, int *done)
{
    const char *who = op->out[0]->name;
    long long HI = dq->hi, DI = dq->di;
    int bs = c->opt->kv_block_size, is_new;
    long long ld = DI + 8; /* ldmatrix's eight rows of a matrix on distinct banks */
    long long smem = HI * ld * 2 + 2LL * DSA_FAST_PT * ld * 2 + HI * 4 + 2 * dq->rdh * 4 +
                     (c->T + 1LL) * 4;
    *done = 0;
    if (smem > smem_optin(c->opt->arch) || dq->qs % 8 || dq->qc % 8)
        return MOEC_OK;
    /* blocks resident per SM: the grid is one full wave of them */
    long long per_sm = DSA_SM_SMEM / (smem + 1024);
    int grid = DSA_SMS * (int)(per_sm < 1 ? 1 : per_sm > 4 ? 4 : per_sm);
    char name[256];
    snprintf(name, sizeof name, "dsa_score_tc_h%lld_d%lld_k%lld_pt%d_g%d_bs%d_t%d_%s%s", HI, DI,
             K, DSA_FAST_PT, grid, bs, c->T, tag, dq->sfx);
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    if (is_new) {
        moec_buf_printf(&c->src, "%s%s", SCAN_HELPERS, ROPE_HELPERS);
        dsa_q_table(&c->src, dq, name);
        moec_buf_printf(&c->src,
                        "// dsa_topk: index scores over the paged key cache, every token's tiles "
                        "shared by a fixed grid, on tensor cores (codegen/dsa_topk.c)\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(const "
                        "__nv_bfloat16 *__restrict__ q, const %s *__restrict__ w, const int "
                        "*__restrict__ pos, const int *__restrict__ slots, const int "
                        "*__restrict__ block_table, int max_blocks, const __nv_bfloat16 "
                        "*__restrict__ kpool, float *__restrict__ scores, float scale, float "
                        "weight_scale)\n{\n"
                        "    constexpr int HI = %lld, DI = %lld, K = %lld, PT = %d, NT = %d, BS = "
                        "%d, TT = %d, LD = %lld, SMEM = %lld;\n",
                        DSA_FAST_THREADS, name, cg_ctype(cg_storage(c, op->in[2])), HI, DI, K,
                        DSA_FAST_PT, DSA_FAST_THREADS, bs, c->T, ld, smem);
        dsa_q_consts(&c->src, dq, name);
        moec_buf_printf(&c->src, "%s}\n\n", SCORE_FAST_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    s->kernel = k;
    s->grid[0] = (unsigned)grid;
    s->block[0] = DSA_FAST_THREADS;
    s->smem = (unsigned)smem;
    score_args(s, op, pool_op);
    *done = 1;
    return MOEC_OK;
}

static long long gcd(long long a, long long b) { return b ? gcd(b, a % b) : a; }

static moec_status emit_score(cg_ctx *c, const ir_op *op, const dsa_q *dq, long long K,
                              const ir_op *pool_op, const char *tag, int legacy)
{
    const char *who = op->out[0]->name;
    long long HI = dq->hi, DI = dq->di;
    int bs = c->opt->kv_block_size, is_new;
    ir_dtype qdt = cg_storage(c, op->in[0]), wdt = cg_storage(c, op->in[2]),
             sdt = c->opt->compute_dtype;
    long long qsz = (long long)ir_dtype_size(qdt), ssz = (long long)ir_dtype_size(sdt);
    long long qld = round_up(DI, 16 / qsz) + 16 / qsz, kld = round_up(DI, 16 / ssz) + 16 / ssz;
    long long rope_smem = dq->rope ? 2 * dq->rdh * 4 : 0;
    /* bf16 with heads and channels in sixteens: tensor cores, 64 positions a
       tile (fewer when the heads' q crowds shared memory); q's rows
       16-byte aligned for its 8-wide loads */
    int mma = qdt == IR_DTYPE_BF16 && sdt == IR_DTYPE_BF16 && HI % 16 == 0 && DI % 16 == 0 &&
              dq->qs % 8 == 0 && dq->qc % 8 == 0;
    if (mma && !legacy) {
        int done;
        MOEC_TRY(emit_score_fast(c, op, dq, K, pool_op, tag, &done));
        if (done)
            return MOEC_OK;
    }
#define SCORE_SMEM(pt) (HI * qld * qsz + (pt) * kld * ssz + HI * 4 + (pt) * 8 + rope_smem)
    int pt = mma ? 64 : 32, pt_min = mma ? 16 : 8;
    while (pt > pt_min && SCORE_SMEM(pt) > DSA_SMEM_MAX)
        pt /= 2;
    if (mma && SCORE_SMEM(pt) > DSA_SMEM_MAX) {
        mma = 0;
        pt = 32;
        while (pt > 8 && SCORE_SMEM(pt) > DSA_SMEM_MAX)
            pt /= 2;
    }
    if (SCORE_SMEM(pt) > DSA_SMEM_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "dsa_topk %%%s: %lld indexer heads of %lld channels do not fit shared "
                        "memory",
                        who, HI, DI);
#undef SCORE_SMEM
    int nt = mma ? 256 : pt * DSA_HEAD_GROUPS;
    int nb = (DSA_TARGET_BLOCKS + c->T - 1) / c->T;
    /* q's loads: 8 wide on tensor cores, else as wide as its rows' alignment allows */
    int vq = mma ? 8 : cg_vec_width(gcd(gcd(DI, dq->qs), dq->qc));
    char name[256];
    snprintf(name, sizeof name, "dsa_score%s_h%lld_d%lld_k%lld_pt%d_nb%d_bs%d_t%d_%s%s",
             mma ? "_mma" : "", HI, DI, K, pt, nb, bs, c->T, tag, dq->sfx);
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    if (is_new && mma)
        moec_buf_printf(&c->src, "%s", MMA_HELPERS);
    if (is_new) {
        moec_buf_printf(&c->src, "%s", ROPE_HELPERS);
        dsa_q_table(&c->src, dq, name);
        moec_buf_printf(&c->src,
                        "// dsa_topk: index scores over the paged key cache, one block per token "
                        "and tiles of positions (codegen/dsa_topk.c)\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s "
                        "*__restrict__ q, const %s *__restrict__ w, const int *__restrict__ pos, "
                        "const int *__restrict__ slots, const int *__restrict__ block_table, int "
                        "max_blocks, const %s *__restrict__ kpool, float *__restrict__ scores, "
                        "float scale, float weight_scale)\n{\n"
                        "    typedef %s TQ;\n    typedef %s TS;\n"
                        "    constexpr int HI = %lld, DI = %lld, K = %lld, PT = %d, HG = %d, NT = %d, "
                        "BS = %d, VE = %d, VQ = %d, QLD = %lld, KLD = %lld;\n",
                        nt, name, cg_ctype(qdt), cg_ctype(wdt), cg_ctype(sdt), cg_ctype(qdt),
                        cg_ctype(sdt), HI, DI, K, pt, DSA_HEAD_GROUPS, nt, bs, cg_vec_width(DI),
                        vq, qld, kld);
        dsa_q_consts(&c->src, dq, name);
        moec_buf_printf(&c->src, "%s%s%s}\n\n", mma ? SCORE_MMA_HEAD : SCORE_HEAD, SCORE_Q_LOAD,
                        mma ? SCORE_MMA_TAIL : SCORE_TAIL);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    s->kernel = k;
    s->grid[0] = (unsigned)c->T;
    s->grid[1] = (unsigned)nb;
    s->block[0] = (unsigned)nt;
    score_args(s, op, pool_op);
    return MOEC_OK;
}

/* The positions the fast select keeps in shared memory: MOEC_DSA_SELECT_CAP
 * (default and most 32768: one compaction segment; 0: none, every pass
 * reads the scores from global memory), at most what the arch lets a block
 * opt in to beside its static shared memory, and never just past the 48
 * KiB a launch gets without opting in (the runtime opts in beyond 48 KiB of
 * dynamic shared memory only). */
static int select_cap(const cg_ctx *c)
{
    long long fit = (smem_optin(c->opt->arch) - DSA_SELECT_STATIC) / 4 / 1024 * 1024;
    long long cap = cg_env_int("MOEC_DSA_SELECT_CAP", DSA_SELECT_CAP, 0, DSA_SELECT_CAP);
    if (cap > fit)
        cap = fit > 0 ? fit : 0;
    if (cap * 4 + DSA_SELECT_STATIC > 48 * 1024 && cap * 4 <= 48 * 1024)
        cap = (48 * 1024 - DSA_SELECT_STATIC) / 4;
    return (int)cap;
}

static moec_status emit_select(cg_ctx *c, const ir_op *op, long long K, const ir_op *pool_op,
                               int legacy)
{
    const char *who = op->out[0]->name;
    int bs = c->opt->kv_block_size, is_new, cap = legacy ? 0 : select_cap(c);
    char name[256];
    if (legacy)
        snprintf(name, sizeof name, "dsa_select_k%lld_bs%d_t%d", K, bs, c->T);
    else
        snprintf(name, sizeof name, "dsa_select_r11_k%lld_c%d_bs%d_t%d", K, cap, bs, c->T);
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    if (is_new) {
        char cap_line[64] = "";
        if (!legacy)
            snprintf(cap_line, sizeof cap_line, "    constexpr int CAP = %d;\n", cap);
        moec_buf_printf(&c->src, "%s%s", SCAN_HELPERS, SELECT_HELPERS);
        if (!legacy)
            moec_buf_printf(&c->src, "%s", FAST_SELECT_HELPERS);
        moec_buf_printf(&c->src,
                        "// dsa_topk: the top-k positions of each token by radix select, in "
                        "position order (codegen/dsa_topk.c)\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(const float "
                        "*__restrict__ scores, const int *__restrict__ pos, const int "
                        "*__restrict__ slots, int max_blocks, int *__restrict__ out)\n{\n"
                        "    constexpr int K = %lld, BS = %d, NT = %d;\n%s%s%s}\n\n",
                        DSA_SELECT_THREADS, name, K, bs, DSA_SELECT_THREADS, cap_line,
                        SELECT_ENTRY, legacy ? SELECT_BODY : SELECT_FAST_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    s->kernel = k;
    s->grid[0] = (unsigned)c->T;
    s->block[0] = DSA_SELECT_THREADS;
    s->smem = (unsigned)cap * 4u;
    s->n_args = 5;
    s->args[0] = cg_arg_kv(pool_op, 1);
    s->args[1] = cg_arg_input(IR_INPUT_POSITIONS);
    s->args[2] = cg_arg_input(IR_INPUT_SLOTS);
    s->args[3] = cg_arg_config(IR_CONFIG_MAX_BLOCKS);
    s->args[4] = cg_arg_act(op->out[0]);
    return MOEC_OK;
}

/* MOEC_DSA_KERNEL, read at code generation: "fast" (the default) or
 * "legacy" (the kernels before the fast score and select, kept so that one
 * GPU run can compare both). */
static moec_status dsa_form(const char *who, int *legacy)
{
    const char *e = getenv("MOEC_DSA_KERNEL");
    *legacy = e && !strcmp(e, "legacy");
    if (!e || !*e || *legacy || !strcmp(e, "fast"))
        return MOEC_OK;
    return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                    "dsa_topk %%%s: MOEC_DSA_KERNEL='%s' is not fast or legacy", who, e);
}

moec_status cg_emit_dsa_topk(cg_ctx *c, const ir_op *op)
{
    const char *who = op->out[0]->name;
    const ir_value *q = op->in[0], *k = op->in[1], *w = op->in[2], *y = op->out[0];
    int rows = ir_op_attr(op, "heads") != NULL;
    if (op->n_in != 4 || q->type.rank != (rows ? 2 : 3) || k->type.rank != 2 ||
        w->type.rank != 2 || y->type.rank != 2 ||
        (!rows && (k->type.dims[1] != q->type.dims[2] || w->type.dims[1] != q->type.dims[1])) ||
        cg_storage(c, y) != IR_DTYPE_I32 || cg_storage(c, q) == IR_DTYPE_I32 ||
        cg_storage(c, k) == IR_DTYPE_I32 || cg_storage(c, w) == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "dsa_topk %%%s: wants q [T, Hi, Di], k [T, Di], weights [T, Hi] (float; "
                        "or rows holding q and the weights, with heads), pos and an i32 result "
                        "[T, top_k]",
                        who);
    long long K = y->type.dims[1];
    const ir_op *pool_op = first_dsa(c->m);
    ir_dtype sdt = c->opt->compute_dtype, kdt = cg_storage(c, k);
    char tag[64], wtag[32];
    cg_dtype_signature(c, op, tag, sizeof tag);
    snprintf(wtag, sizeof wtag, "%s_%s", ir_dtype_name(kdt), ir_dtype_name(sdt));
    int legacy;
    MOEC_TRY(dsa_form(who, &legacy));
    dsa_q dq;
    MOEC_TRY(dsa_q_init(op, &dq));
    if (dq.hi < 1 || dq.qc < 0 || dq.wc < 0 || dq.qc + dq.hi * dq.di > dq.qs ||
        dq.wc + dq.hi > dq.ws) {
        cg_rope_free(&dq.rt);
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "dsa_topk %%%s: heads %lld of %lld channels at columns %lld and %lld are "
                        "past q's %lld or the weights' %lld",
                        who, dq.hi, dq.di, dq.qc, dq.wc, dq.qs, dq.ws);
    }
    /* the keys' cache write, unless the dsa_prologue_k that computes them writes it */
    const ir_op *pro = k->kind == IR_VALUE_OP ? k->def : NULL;
    moec_status st = MOEC_OK;
    if (!pro || cg_dsa_prologue_cache(c->m, pro) != op)
        st = emit_write(c, op, dq.di, cg_ctype(kdt), cg_ctype(sdt), wtag);
    if (st == MOEC_OK)
        st = emit_score(c, op, &dq, K, pool_op, tag, legacy);
    cg_rope_free(&dq.rt);
    MOEC_TRY(st);
    return emit_select(c, op, K, pool_op, legacy);
}
