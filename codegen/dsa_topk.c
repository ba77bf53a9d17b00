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
 *                 one after another). A block takes one token and tiles of
 *                 PT positions, its tokens' q (all heads) in shared memory
 *                 beside a tile of keys: in bf16 with heads and channels in
 *                 sixteens the products run on tensor cores (below),
 *                 otherwise eight threads share a position, each a strided
 *                 eighth of the heads, and sum by shuffles. The blocks of a
 *                 token (grid.y) stride over its tiles.
 *   dsa_select    per token, one block of 1024: with n = pos + 1 <= top_k
 *                 positions, all of them (0..pos, then -1s) and no scores
 *                 read; else a radix select of the top_k-th largest score
 *                 (four passes of 8-bit digits over order-preserving keys,
 *                 each warp adding its equal digits to the histogram once;
 *                 -0 taken as +0 so that keys tie exactly where floats
 *                 do), then a compaction in position order: every position
 *                 above the threshold and the first of those equal to it,
 *                 as many as top_k needs (ties: the lower position, as the
 *                 interpreter breaks them), each thread a run of positions
 *                 placed by two block scans of its counts. Output ascending,
 *                 as defined.
 *
 * Everything inside the bucket's CUDA Graph: grids are fixed, the context
 * length is read from the positions on the device. */
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

#define DSA_SMEM_MAX (46 * 1024)
#define DSA_HEAD_GROUPS 8     /* threads per position in the score kernel */
#define DSA_SELECT_THREADS 1024
#define DSA_TARGET_BLOCKS 528 /* score blocks that keep an H100's SMs busy */

static const char WRITE_BODY[] =
    "    const int t = blockIdx.x;\n"
    "    const int s = slots[t], p = pos[t];\n"
    "    if (s < 0 || p < 0 || p / BS >= max_blocks)\n"
    "        return;\n"
    "    const long long row = (long long)block_table[(long long)s * max_blocks + p / BS] * BS + p % BS;\n"
    "    for (int i = threadIdx.x; i < DI / V; i += blockDim.x)\n"
    "        cpv<V>(kpool + row * DI + i * V, k + (long long)t * DI + i * V);\n";

static const char SCORE_BODY[] =
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
    "        return;\n"
    "    for (int i = tid; i < HI * (DI / VE); i += NT) {\n"
    "        const int h = i / (DI / VE), j = (i % (DI / VE)) * VE;\n"
    "        cpv<VE>(&q_s[h][j], q + ((long long)t * HI + h) * DI + j);\n"
    "    }\n"
    "    for (int h = tid; h < HI; h += NT)\n"
    "        w_s[h] = ld(w + (long long)t * HI + h) * weight_scale;\n"
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

/* The tensor-core form of the scores (bf16, heads and channels in sixteens):
 * per tile of PT positions each warp takes 8 of them and every head, S = Q
 * K^T by m16n8k16 MMAs (16 heads by 8 positions, fp32 accumulators), then
 * sums w[h] * relu(scale * S) over the heads: its lanes' two rows per head
 * tile, then across the lanes of a position by shuffles. */
static const char SCORE_MMA_BODY[] =
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
    "        return;\n"
    "    for (int i = tid; i < HI * (DI / 8); i += NT) {\n"
    "        const int h = i / (DI / 8), j = (i % (DI / 8)) * 8;\n"
    "        cpv<8>(&q_s[h][j], q + ((long long)t * HI + h) * DI + j);\n"
    "    }\n"
    "    for (int h = tid; h < HI; h += NT)\n"
    "        w_s[h] = ld(w + (long long)t * HI + h) * weight_scale;\n"
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

/* The select kernel's helpers: the order-preserving key of a score, and an
 * exclusive prefix sum over the block with its total. */
static const char SELECT_HELPERS[] =
    "#ifndef MOEC_DSA_SELECT_HELPERS\n"
    "#define MOEC_DSA_SELECT_HELPERS\n"
    "/* keys order as the floats do; -0 and +0 give one key (the floats tie) */\n"
    "__device__ __forceinline__ unsigned dsa_key(float v)\n"
    "{\n"
    "    const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);\n"
    "    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);\n"
    "}\n"
    "/* v's exclusive prefix sum over the block (blockDim.x a multiple of 32, at\n"
    "   most 1024), the block's total into *total; ws: 33 ints of shared memory */\n"
    "__device__ __forceinline__ int dsa_block_scan(int v, int *total, int *ws)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
    "    int x = v;\n"
    "#pragma unroll\n"
    "    for (int o = 1; o < 32; o <<= 1) {\n"
    "        const int y = __shfl_up_sync(0xffffffffu, x, o);\n"
    "        if (lane >= o)\n"
    "            x += y;\n"
    "    }\n"
    "    if (lane == 31)\n"
    "        ws[warp] = x;\n"
    "    __syncthreads();\n"
    "    if (warp == 0) {\n"
    "        int s = lane < nw ? ws[lane] : 0;\n"
    "#pragma unroll\n"
    "        for (int o = 1; o < 32; o <<= 1) {\n"
    "            const int y = __shfl_up_sync(0xffffffffu, s, o);\n"
    "            if (lane >= o)\n"
    "                s += y;\n"
    "        }\n"
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

static const char SELECT_BODY[] =
    "    __shared__ unsigned hist[256];\n"
    "    __shared__ unsigned pick_s[2];\n"
    "    __shared__ int ws[33];\n"
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
    "    const float *sr = scores + (long long)t * max_blocks * BS;\n"
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
    "            unsigned incl = cnt;\n"
    "#pragma unroll\n"
    "            for (int d = 1; d < 32; d <<= 1) {\n"
    "                const unsigned y = __shfl_up_sync(0xffffffffu, incl, d);\n"
    "                if (lane >= d)\n"
    "                    incl += y;\n"
    "            }\n"
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

static moec_status emit_score(cg_ctx *c, const ir_op *op, long long HI, long long DI, long long K,
                              const ir_op *pool_op, const char *tag)
{
    const char *who = op->out[0]->name;
    int bs = c->opt->kv_block_size, is_new;
    ir_dtype qdt = cg_storage(c, op->in[0]), wdt = cg_storage(c, op->in[2]),
             sdt = c->opt->compute_dtype;
    long long qsz = (long long)ir_dtype_size(qdt), ssz = (long long)ir_dtype_size(sdt);
    long long qld = round_up(DI, 16 / qsz) + 16 / qsz, kld = round_up(DI, 16 / ssz) + 16 / ssz;
    /* bf16 with heads and channels in sixteens: tensor cores, 64 positions a
       tile (fewer when the heads' q crowds shared memory) */
    int mma = qdt == IR_DTYPE_BF16 && sdt == IR_DTYPE_BF16 && HI % 16 == 0 && DI % 16 == 0;
    int pt = mma ? 64 : 32, pt_min = mma ? 16 : 8;
    while (pt > pt_min && HI * qld * qsz + pt * kld * ssz + HI * 4 + pt * 8 > DSA_SMEM_MAX)
        pt /= 2;
    if (mma && HI * qld * qsz + pt * kld * ssz + HI * 4 + pt * 8 > DSA_SMEM_MAX) {
        mma = 0;
        pt = 32;
        while (pt > 8 && HI * qld * qsz + pt * kld * ssz + HI * 4 + pt * 8 > DSA_SMEM_MAX)
            pt /= 2;
    }
    if (HI * qld * qsz + pt * kld * ssz + HI * 4 + pt * 8 > DSA_SMEM_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "dsa_topk %%%s: %lld indexer heads of %lld channels do not fit shared "
                        "memory",
                        who, HI, DI);
    int nt = mma ? 256 : pt * DSA_HEAD_GROUPS;
    int nb = (DSA_TARGET_BLOCKS + c->T - 1) / c->T;
    char name[256];
    snprintf(name, sizeof name, "dsa_score%s_h%lld_d%lld_k%lld_pt%d_nb%d_bs%d_t%d_%s",
             mma ? "_mma" : "", HI, DI, K, pt, nb, bs, c->T, tag);
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    if (is_new && mma)
        moec_buf_printf(&c->src, "%s", MMA_HELPERS);
    if (is_new)
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
                        "BS = %d, VE = %d, QLD = %lld, KLD = %lld;\n%s}\n\n",
                        nt, name, cg_ctype(qdt), cg_ctype(wdt), cg_ctype(sdt), cg_ctype(qdt),
                        cg_ctype(sdt), HI, DI, K, pt, DSA_HEAD_GROUPS, nt, bs, cg_vec_width(DI), qld,
                        kld, mma ? SCORE_MMA_BODY : SCORE_BODY);
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    s->kernel = k;
    s->grid[0] = (unsigned)c->T;
    s->grid[1] = (unsigned)nb;
    s->block[0] = (unsigned)nt;
    s->n_args = 10;
    s->args[0] = cg_arg_act(op->in[0]);
    s->args[1] = cg_arg_act(op->in[2]);
    seq_args(s, 2);
    s->args[6] = cg_arg_kv(op, 0);
    s->args[7] = cg_arg_kv(pool_op, 1);
    s->args[8] = cg_arg_f32(ir_op_attr_float(op, "scale", 1.0));
    s->args[9] = cg_arg_f32(ir_op_attr_float(op, "weight_scale", 1.0));
    return MOEC_OK;
}

static moec_status emit_select(cg_ctx *c, const ir_op *op, long long K, const ir_op *pool_op)
{
    const char *who = op->out[0]->name;
    int bs = c->opt->kv_block_size, is_new;
    char name[256];
    snprintf(name, sizeof name, "dsa_select_k%lld_bs%d_t%d", K, bs, c->T);
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    if (is_new) {
        moec_buf_printf(&c->src, "%s", SELECT_HELPERS);
        moec_buf_printf(&c->src,
                        "// dsa_topk: the top-k positions of each token by radix select, in "
                        "position order (codegen/dsa_topk.c)\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(const float "
                        "*__restrict__ scores, const int *__restrict__ pos, const int "
                        "*__restrict__ slots, int max_blocks, int *__restrict__ out)\n{\n"
                        "    constexpr int K = %lld, BS = %d, NT = %d;\n%s}\n\n",
                        DSA_SELECT_THREADS, name, K, bs, DSA_SELECT_THREADS, SELECT_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "dsa_topk %%%s: no memory", who);
    s->kernel = k;
    s->grid[0] = (unsigned)c->T;
    s->block[0] = DSA_SELECT_THREADS;
    s->n_args = 5;
    s->args[0] = cg_arg_kv(pool_op, 1);
    s->args[1] = cg_arg_input(IR_INPUT_POSITIONS);
    s->args[2] = cg_arg_input(IR_INPUT_SLOTS);
    s->args[3] = cg_arg_config(IR_CONFIG_MAX_BLOCKS);
    s->args[4] = cg_arg_act(op->out[0]);
    return MOEC_OK;
}

moec_status cg_emit_dsa_topk(cg_ctx *c, const ir_op *op)
{
    const char *who = op->out[0]->name;
    const ir_value *q = op->in[0], *k = op->in[1], *w = op->in[2], *y = op->out[0];
    if (op->n_in != 4 || q->type.rank != 3 || k->type.rank != 2 || w->type.rank != 2 ||
        y->type.rank != 2 || k->type.dims[1] != q->type.dims[2] ||
        w->type.dims[1] != q->type.dims[1] || cg_storage(c, y) != IR_DTYPE_I32 ||
        cg_storage(c, q) == IR_DTYPE_I32 || cg_storage(c, k) == IR_DTYPE_I32 ||
        cg_storage(c, w) == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "dsa_topk %%%s: wants q [T, Hi, Di], k [T, Di], weights [T, Hi] (float), "
                        "pos and an i32 result [T, top_k]",
                        who);
    long long HI = q->type.dims[1], DI = q->type.dims[2], K = y->type.dims[1];
    const ir_op *pool_op = first_dsa(c->m);
    ir_dtype sdt = c->opt->compute_dtype, kdt = cg_storage(c, k);
    char tag[64], wtag[32];
    cg_dtype_signature(c, op, tag, sizeof tag);
    snprintf(wtag, sizeof wtag, "%s_%s", ir_dtype_name(kdt), ir_dtype_name(sdt));
    MOEC_TRY(emit_write(c, op, DI, cg_ctype(kdt), cg_ctype(sdt), wtag));
    MOEC_TRY(emit_score(c, op, HI, DI, K, pool_op, tag));
    return emit_select(c, op, K, pool_op);
}
