/* moe_topk.c — the MoE router's top-k (docs/IR.md, moe_topk): scores by
 * softmax or sigmoid, a bias used for selection only, grouped selection
 * (group score max or top2_sum), top_k experts by descending biased score
 * with ties to the lower index, weights from the unbiased scores, optional
 * renormalisation (+1e-20) and scaling. One warp per token: E is at most a
 * few hundred, so a token's scores sit in shared memory and every
 * selection is a warp arg-max. E, K and the grouping are literals; the
 * scaling factor is an argument (layers share the kernel).
 *
 * In buckets of up to 8 tokens, where its ids and weights feed only the
 * moe_routed after it (cg_moe_topk_routed), the kernel is one block of a
 * warp per token that, once every token has chosen, also sorts the slots
 * by expert into that op's blocks (codegen/moe_routed.c's align body):
 * one launch instead of two. Where the logits come from the router's
 * linear alone and its weight is small (router_of), that kernel computes
 * them too: a cluster of eight blocks splits the experts' rows, block 0
 * gathers the logits from their shared memory and goes on alone, and the
 * linear emits nothing (one launch instead of three). */
#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "codegen/moe_routed.h"
#include "err.h"

/* Warp `warp` of the block takes token t (TOPK_HEAD); TOPK_BODY, for a t
 * below T, reads its logits (row t - t0 of logits), chooses and writes its
 * ids and weights (my_id: lane j's choice j, for what follows). */
static const char TOPK_HEAD[] =
    "    __shared__ float s_s[NW][E], s_c[NW][E], s_g[NW][NG];\n"
    "    __shared__ unsigned char s_keep[NW][NG];\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const int t = blockIdx.x * NW + warp, t0 = 0;\n";

static const char TOPK_BODY[] =
    "    float *s = s_s[warp], *c = s_c[warp];\n"
    "    const float *l = logits + (long long)(t - t0) * E;\n"
    "    if constexpr (SOFTMAX) {\n"
    "        float mx = MOEC_NEG_INF;\n"
    "        for (int e = lane; e < E; e += 32)\n"
    "            mx = fmaxf(mx, l[e]);\n"
    "        mx = warp_max(mx);\n"
    "        float sum = 0.0f;\n"
    "        for (int e = lane; e < E; e += 32) {\n"
    "            float v = expf(l[e] - mx);\n"
    "            s[e] = v;\n"
    "            sum += v;\n"
    "        }\n"
    "        sum = warp_sum(sum);\n"
    "        for (int e = lane; e < E; e += 32)\n"
    "            s[e] = s[e] / sum;\n"
    "    } else {\n"
    "        for (int e = lane; e < E; e += 32)\n"
    "            s[e] = 1.0f / (1.0f + expf(-l[e]));\n"
    "    }\n"
    "    for (int e = lane; e < E; e += 32) {\n"
    "        float v = s[e];\n"
    "        if constexpr (HAS_BIAS)\n"
    "            v += ld(bias + e);\n"
    "        c[e] = v;\n"
    "    }\n"
    "    __syncwarp();\n"
    "    if constexpr (NG > 1) {\n"
    "        /* each lane scores whole groups, scanning in index order as the\n"
    "           interpreter does (first maximum wins) */\n"
    "        for (int g = lane; g < NG; g += 32) {\n"
    "            const float *cg = c + g * GS;\n"
    "            int a = 0;\n"
    "            for (int i = 1; i < GS; i++)\n"
    "                if (cg[i] > cg[a])\n"
    "                    a = i;\n"
    "            float score = cg[a];\n"
    "            if constexpr (TOP2) {\n"
    "                int b = -1;\n"
    "                for (int i = 0; i < GS; i++)\n"
    "                    if (i != a && (b < 0 || cg[i] > cg[b]))\n"
    "                        b = i;\n"
    "                score += cg[b];\n"
    "            }\n"
    "            s_g[warp][g] = score;\n"
    "            s_keep[warp][g] = 0;\n"
    "        }\n"
    "        __syncwarp();\n"
    "        for (int j = 0; j < TG; j++) {\n"
    "            float bv = MOEC_NEG_INF;\n"
    "            int bi = NG;\n"
    "            for (int g = lane; g < NG; g += 32)\n"
    "                if (!s_keep[warp][g] && (bi == NG || s_g[warp][g] > bv)) { bv = s_g[warp][g]; bi = g; }\n"
    "            bi = moec_warp_argmax(bv, bi, NG);\n"
    "            if (lane == (bi & 31))\n"
    "                s_keep[warp][bi] = 1;\n"
    "            __syncwarp();\n"
    "        }\n"
    "        for (int e = lane; e < E; e += 32)\n"
    "            if (!s_keep[warp][e / GS])\n"
    "                c[e] = MOEC_NEG_INF;\n"
    "        __syncwarp();\n"
    "    }\n"
    "    /* top_k: lane e & 31 owns experts e, e + 32, ...: their selection\n"
    "       scores in registers, a bit each once taken; each choice a warp\n"
    "       arg-max, ties to the lower index */\n"
    "    constexpr int EL = (E + 31) / 32;\n"
    "    float cv[EL];\n"
    "    unsigned tk = 0u;\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < EL; i++) {\n"
    "        const int e = lane + 32 * i;\n"
    "        cv[i] = e < E ? c[e] : MOEC_NEG_INF;\n"
    "        if (e >= E)\n"
    "            tk |= 1u << i;\n"
    "    }\n"
    "    int my_id = 0;\n"
    "    float my_w = 0.0f;\n"
    "    for (int j = 0; j < K; j++) {\n"
    "        float bv = MOEC_NEG_INF;\n"
    "        int bi = E;\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < EL; i++)\n"
    "            if (!(tk >> i & 1u) && (bi == E || cv[i] > bv)) { bv = cv[i]; bi = lane + 32 * i; }\n"
    "        bi = moec_warp_argmax(bv, bi, E);\n"
    "        if (bi >= E)\n"
    "            bi = 0;\n"
    "        if (lane == (bi & 31))\n"
    "            tk |= 1u << (bi >> 5);\n"
    "        if (lane == j) {\n"
    "            my_id = bi;\n"
    "            my_w = s[bi];\n"
    "        }\n"
    "    }\n"
    "    float sum = warp_sum(lane < K ? my_w : 0.0f);\n"
    "    if (lane < K) {\n"
    "        float w = my_w;\n"
    "        if constexpr (NORM)\n"
    "            w /= sum + 1e-20f;\n"
    "        w *= scaling;\n"
    "        ids[(long long)t * K + lane] = my_id;\n"
    "        wts[(long long)t * K + lane] = w;\n"
    "    }\n";

/* The router's linear inside the aligning top-k kernel: the logits'
 * linear (no bias, act or alpha; weight and input of one dtype; at most
 * ROUTER_MAX_BYTES of weight) whose only reader is a moe_topk that aligns
 * (cg_moe_topk_routed), on the same stream, its input still live after the
 * top-k (plan_memory placed it by the IR's uses), on sm_90 (a thread block
 * cluster computes the logits). Two forms:
 *  - ROUTER_GEMV, one token (bf16 or f32): a warp per expert row
 *    (ROUTER_OPEN .. ROUTER_GATHER), block 0 chooses and aligns alone.
 *  - ROUTER_MMA, 2 to ROUTER_MMA_MAX_T tokens (bf16, H in 32-wide chunks):
 *    each block of the cluster takes an eighth of the k chunks for every
 *    token and expert on m16n8k16 products (the experts' rows as A, the
 *    tokens as B) and stores its partial logits into the shared memory of
 *    the block that owns their token (TPB consecutive tokens a block); each
 *    block sums its tokens' partials in rank order and chooses for them (a
 *    warp a token), sends the choices to block 0, which aligns
 *    (ROUTER_MMA_BODY). One launch instead of a GEMM, a top-k and an align.
 * MOEC_MOE_ROUTER_FUSE=0 keeps the separate launches, and
 * MOEC_MOE_ROUTE_MMA_MAX_T the largest bucket of the second form (1: none),
 * for comparisons. */
#define ROUTER_MAX_BYTES (2 << 20)
/* the most registers a thread holds of the router's weight before the wait
   (the one-token form; H200, 2026-11-29, Qwen3-30B cut to 16 layers at
   batch 1: 1.101 ms against 1.117 with the L2 prefetch alone; V2-Lite
   level) */
#define ROUTER_WPRE_REGS 64
#define ROUTER_CLUSTER 8
#define ROUTER_MMA_MAX_T 64
/* the static shared memory the ROUTER_MMA kernel may take */
#define ROUTER_MMA_SMEM (46 * 1024)

typedef enum { ROUTER_NONE, ROUTER_GEMV, ROUTER_MMA } router_form;

/* The ROUTER_MMA kernel's shape: warps WM by WN over the experts' 16-row
 * tiles and the tokens' 8-column tiles (the grid that reads the fewest
 * bytes a warp, at most 64 accumulators), MTW by NTW tiles a warp, U k
 * chunks' loads in flight, TPB tokens a block; its shared memory. */
typedef struct {
    int cl, wm, wn, mtw, ntw, u, tpb;
    long long smem;
} router_mma_shape;

static router_mma_shape mma_shape(long long E, long long K, long long NG, int T)
{
    router_mma_shape r = {0};
    long long mt = (E + 15) / 16, nt = (T + 7) / 8, best = -1;
    for (int wm = 1; wm <= 8; wm *= 2) {
        long long mtw = (mt + wm - 1) / wm, ntw = (nt + 8 / wm - 1) / (8 / wm);
        long long cost = mtw * 16 + ntw * 8;
        if (mtw * ntw * 4 > 64 || (best >= 0 && cost >= best))
            continue;
        best = cost;
        r.wm = wm;
        r.wn = 8 / wm;
        r.mtw = (int)mtw;
        r.ntw = (int)ntw;
    }
    if (best < 0)
        return r;
    r.u = (int)(24 / (2 * r.mtw + r.ntw));
    r.u = r.u < 1 ? 1 : r.u > 4 ? 4 : r.u;
    /* the cluster's blocks (MOEC_MOE_ROUTE_MMA_CL: 2, 4 or 8) */
    r.cl = cg_env_int("MOEC_MOE_ROUTE_MMA_CL", ROUTER_CLUSTER, 2, ROUTER_CLUSTER);
    r.cl = r.cl >= 8 ? 8 : r.cl >= 4 ? 4 : 2;
    r.tpb = (T + r.cl - 1) / r.cl;
    /* s_red, s_all, the top-k's per-warp state, the align's counts */
    r.smem = 4LL * r.cl * r.tpb * E + 4LL * T * K + 8LL * (E * 8 + NG * 5) + 12 * E;
    return r;
}

/* 1 when the bucket replays a side stream beside the main one from the MoE
 * input on (the runtime's rule: up to IR_DUAL_STREAM_MAX_T tokens,
 * docs/CUDA.md; from from_t up the side stream forks after the routing,
 * cg_place_forks, which the ROUTER_MMA kernel is there). There the
 * ROUTER_MMA kernel ran slower than the three launches it replaces (H100,
 * V2-Lite step, bf16 at 64 tokens, the fork then before it: 16.4-16.5 ms
 * against 13.9-14.0 in three calls, level on one stream; at 8: 7.415
 * against 7.336 and fp8 5.464 against 5.305 in one call, level in
 * another), so such buckets keep those; on one stream it
 * gained at 32 in four calls (bf16 0.03-0.24 ms, fp8 0.05-0.12). Why (a
 * kernel timeline at 64): without the router's GEMM before it, the routed
 * gate_up's blocks take every SM before the side stream's silu_mul starts,
 * which then waits about 200 us a layer, as does the shared down. */
static int side_stream_beside(const cg_ctx *c)
{
    if (cg_env_int("MOEC_MOE_ROUTE_MMA_ANY_STREAM", 0, 0, 1)) /* for A/B runs */
        return 0;
    if (cg_two_streams(c) != 1)
        return 0;
    for (int k = 0; k < c->m->n_ops; k++)
        if (c->m->ops[k]->stream == 1)
            return 1;
    return 0;
}

static const ir_op *router_of(const cg_ctx *c, const ir_op *topk, router_form *form)
{
    int bm = 0;
    long long nb = 0;
    int mma = c->T >= 2 &&
              c->T <= cg_env_int("MOEC_MOE_ROUTE_MMA_MAX_T", ROUTER_MMA_MAX_T, 1, 256) &&
              !side_stream_beside(c);
    *form = ROUTER_NONE;
    if (topk->kind != IR_OP_MOE_TOPK || (c->T > 1 && !mma) || cg_arch_num(c->opt) < 90 ||
        !cg_env_int("MOEC_MOE_ROUTER_FUSE", 1, 0, 1) ||
        !cg_moe_topk_routed(c, topk, mma ? c->T : 1, &bm, &nb))
        return NULL;
    const ir_value *lg = topk->in[0];
    const ir_op *lin = lg->kind == IR_VALUE_OP ? lg->def : NULL;
    if (!lin || lin->kind != IR_OP_LINEAR || lin->n_in != 2 || lin->n_out != 1 ||
        ir_op_attr(lin, "act") || ir_op_attr(lin, "alpha") || lin->stream != topk->stream ||
        ir_module_single_user(c->m, lg) != topk)
        return NULL;
    const ir_value *x = lin->in[0], *w = lin->in[1];
    ir_dtype dw = cg_storage(c, w);
    if (x->type.rank != 2 || w->type.rank != 2 || lg->type.rank != 2 ||
        cg_storage(c, x) != dw || (dw != IR_DTYPE_BF16 && dw != IR_DTYPE_F32) ||
        cg_storage(c, lg) != IR_DTYPE_F32 || w->type.dims[0] != lg->type.dims[1] ||
        x->type.dims[1] != w->type.dims[1] ||
        w->type.dims[0] * w->type.dims[1] * (long long)ir_dtype_size(dw) > ROUTER_MAX_BYTES ||
        !cg_read_after(c->m, x, topk->id))
        return NULL;
    long long E = w->type.dims[0], H = w->type.dims[1], NG = ir_op_attr_int(topk, "n_group", 1);
    if (mma) {
        router_mma_shape r = mma_shape(E, ir_op_attr_int(topk, "top_k", 1), NG, c->T);
        if (dw != IR_DTYPE_BF16 || H % 32 || !r.wm || r.smem > ROUTER_MMA_SMEM)
            return NULL;
        *form = ROUTER_MMA;
        return lin;
    }
    /* shared memory: eight warps' top-k state, the align's counts, this
       block's logits and block 0's gathered ones */
    long long epb = (E + ROUTER_CLUSTER - 1) / ROUTER_CLUSTER;
    if ((E * 8 + NG * 5) * 8 + 12 * E + 4 * (long long)c->T * (E + epb) > 40 * 1024)
        return NULL;
    *form = ROUTER_GEMV;
    return lin;
}

/* The moe_routed the top-k kernel aligns, given router_of's answer. */
static const ir_op *aligned_with(const cg_ctx *c, const ir_op *topk, const ir_op *router, int *bm,
                                 long long *nb)
{
    return cg_moe_topk_routed(c, topk, router ? c->T : CG_MOE_TOPK_ALIGN_MAX_T, bm, nb);
}

const ir_op *cg_moe_topk_aligned(const cg_ctx *c, const ir_op *topk, int *bm, long long *nb)
{
    router_form f;
    return aligned_with(c, topk, router_of(c, topk, &f), bm, nb);
}

int cg_linear_in_topk(const cg_ctx *c, const ir_op *lin)
{
    const ir_op *topk = ir_module_single_user(c->m, lin->out[0]);
    router_form f;
    return topk && router_of(c, topk, &f) == lin;
}

/* The cluster's logits: block `rank` of ROUTER_CLUSTER computes experts
 * rank * EPB .. + EPB - 1 (a warp per expert row, 16-byte loads of w and
 * x, fp32 sums) into its shared memory; block 0 then gathers all of them
 * and goes on as the top-k kernel, the others leave. In pieces, emitted in
 * this order: ROUTER_OPEN, ROUTER_RPW (not in the wpre form, whose head
 * declares RPW), ROUTER_ACC, ROUTER_LOAD or ROUTER_WPRE_LOAD (a k step's
 * weights), ROUTER_PRODUCTS (its products with x, the same in both
 * forms), ROUTER_GATHER. */
static const char ROUTER_OPEN[] =
    "    __shared__ float s_rl[T][EPB], s_lg[T * E];\n"
    "    {\n"
    "        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n";

static const char ROUTER_RPW[] =
    "        const int rank = blockIdx.x;\n"
    "        /* the warp's RPW rows together, UNR k steps of them in flight */\n"
    "        constexpr int RPW = (EPB + NW - 1) / NW, UNR = RPW >= 4 ? 2 : RPW >= 2 ? 4 : 8;\n";

static const char ROUTER_ACC[] =
    "        float acc[RPW][T];\n"
    "#pragma unroll\n"
    "        for (int q = 0; q < RPW; q++)\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < T; t++)\n"
    "                acc[q][t] = 0.0f;\n";

static const char ROUTER_LOAD[] =
    "#pragma unroll UNR\n"
    "        for (int k = lane * VE; k < H; k += 32 * VE) {\n"
    "            float wv[RPW][VE];\n"
    "#pragma unroll\n"
    "            for (int q = 0; q < RPW; q++) {\n"
    "                const int r = warp + q * NW;\n"
    "                if (r < EPB && rank * EPB + r < E)\n"
    "                    ldv<VE>(w + (long long)(rank * EPB + r) * H + k, wv[q]);\n"
    "                else\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < VE; j++)\n"
    "                        wv[q][j] = 0.0f;\n"
    "            }\n";

/* Where the block's rows of a bf16 router weight fit in registers
 * (router_wpre): each lane's 16-byte chunks of its warp's rows read before
 * the programmatic wait (ROUTER_WPRE_HEAD, while the kernel before it
 * runs: the weight is a constant), then after it only x (ROUTER_WPRE_LOAD
 * unpacks a k step's). */
static const char ROUTER_WPRE_HEAD[] =
    "    constexpr int RPW = (EPB + NW - 1) / NW, NKC = (int)(H / (32 * VE));\n"
    "    uint4 wpre[RPW][NKC];\n"
    "    {\n"
    "        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rank = blockIdx.x;\n"
    "#pragma unroll\n"
    "        for (int q = 0; q < RPW; q++) {\n"
    "            const int r = warp + q * NW;\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < NKC; i++)\n"
    "                wpre[q][i] = r < EPB && rank * EPB + r < E\n"
    "                    ? __ldg(reinterpret_cast<const uint4 *>(w + (long long)(rank * EPB + r) * H + (lane + i * 32) * VE))\n"
    "                    : make_uint4(0u, 0u, 0u, 0u);\n"
    "        }\n"
    "    }\n"
    "    moec_pdl_enter();\n";

static const char ROUTER_WPRE_LOAD[] =
    "#pragma unroll\n"
    "        for (int i = 0; i < NKC; i++) {\n"
    "            const int k = (lane + i * 32) * VE;\n"
    "            float wv[RPW][VE];\n"
    "#pragma unroll\n"
    "            for (int q = 0; q < RPW; q++) {\n"
    "                const unsigned u[4] = {wpre[q][i].x, wpre[q][i].y, wpre[q][i].z, wpre[q][i].w};\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < 4; j++) {\n"
    "                    wv[q][2 * j] = __uint_as_float(u[j] << 16);\n"
    "                    wv[q][2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);\n"
    "                }\n"
    "            }\n";

static const char ROUTER_PRODUCTS[] =
    "#pragma unroll\n"
    "            for (int t = 0; t < T; t++) {\n"
    "                float xv[VE];\n"
    "                ldv<VE>(x + (long long)t * H + k, xv);\n"
    "#pragma unroll\n"
    "                for (int q = 0; q < RPW; q++)\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < VE; j++)\n"
    "                        acc[q][t] += wv[q][j] * xv[j];\n"
    "            }\n"
    "        }\n";

/* Both router bodies' end: the warps' sums into the block's shared memory,
 * block 0 gathers the cluster's logits. */
static const char ROUTER_GATHER[] =
    "#pragma unroll\n"
    "        for (int q = 0; q < RPW; q++) {\n"
    "            const int r = warp + q * NW;\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < T; t++) {\n"
    "                const float v = warp_sum(acc[q][t]);\n"
    "                if (lane == 0 && r < EPB)\n"
    "                    s_rl[t][r] = v;\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "    moec_cluster_sync();\n"
    "    if (blockIdx.x == 0)\n"
    "        for (int i = threadIdx.x; i < T * E; i += NW * 32)\n"
    "            s_lg[i] = moec_ld_cluster(&s_rl[i / E][(i % E) % EPB], (unsigned)((i % E) / EPB));\n"
    "    moec_cluster_sync(); /* no block leaves while block 0 reads it */\n"
    "    if (blockIdx.x != 0)\n"
    "        return;\n"
    "    const float *logits = s_lg;\n";

/* ROUTER_MMA's kernel after its wait (router_of): constants E, K, T, NW, H,
 * CL, TPB, WM, WN, MTW, NTW, U in scope, then the top-k (TOPK_BODY) and
 * block 0's align (CG_MOE_ALIGN_BODY) follow. A lane (g, q) loads 16 bytes
 * at k 8q of a 32-wide chunk from rows g and g + 8 of its expert tile and
 * row g of its token tile; of each 16 bytes, words 0, 1 are the fragments
 * of one m16n8k16 product and words 2, 3 of a second (the two products
 * sum the chunk's k in another order than the k index, alike in A and B). */
static const char ROUTER_MMA_BODY[] =
    "    __shared__ float s_red[CL][TPB][E];\n"
    "    __shared__ int s_all[T * K];\n"
    "    const unsigned rank = blockIdx.x;\n"
    "    const int tb = (int)rank * TPB;\n"
    "    {\n"
    "        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;\n"
    "        const int wm = warp % WM, wn = warp / WM;\n"
    "        constexpr int MT = (E + 15) / 16, NTT = (T + 7) / 8, NCH = H / 32;\n"
    "        float acc[MTW][NTW][4];\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < MTW; i++)\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NTW; j++)\n"
    "                acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;\n"
    "        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);\n"
    "        const int c0 = (int)rank * NCH / CL, c1 = ((int)rank + 1) * NCH / CL;\n"
    "        for (int cb = c0; wm < MT && wn < NTT && cb < c1; cb += U) {\n"
    "            uint4 a[U][MTW][2], b[U][NTW];\n"
    "#pragma unroll\n"
    "            for (int u = 0; u < U; u++) {\n"
    "                const int k = (cb + u) * 32 + 8 * q;\n"
    "                const bool in = cb + u < c1;\n"
    "#pragma unroll\n"
    "                for (int i = 0; i < MTW; i++) {\n"
    "                    const int e = (wm + i * WM) * 16 + g;\n"
    "                    a[u][i][0] = in && e < E ? *reinterpret_cast<const uint4 *>(w + (long long)e * H + k) : zero;\n"
    "                    a[u][i][1] = in && e + 8 < E ? *reinterpret_cast<const uint4 *>(w + (long long)(e + 8) * H + k) : zero;\n"
    "                }\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < NTW; j++) {\n"
    "                    const int t = (wn + j * WN) * 8 + g;\n"
    "                    b[u][j] = in && t < T ? *reinterpret_cast<const uint4 *>(x + (long long)t * H + k) : zero;\n"
    "                }\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int u = 0; u < U; u++)\n"
    "#pragma unroll\n"
    "                for (int i = 0; i < MTW; i++)\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < NTW; j++) {\n"
    "                        moec_mma_bf16(acc[i][j], a[u][i][0].x, a[u][i][1].x, a[u][i][0].y, a[u][i][1].y,\n"
    "                                      b[u][j].x, b[u][j].y);\n"
    "                        moec_mma_bf16(acc[i][j], a[u][i][0].z, a[u][i][1].z, a[u][i][0].w, a[u][i][1].w,\n"
    "                                      b[u][j].z, b[u][j].w);\n"
    "                    }\n"
    "        }\n"
    "        /* accumulator h holds expert row g (+ 8 for h >= 2), token column 2q (+ 1 for odd h) */\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < MTW; i++)\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NTW; j++)\n"
    "#pragma unroll\n"
    "                for (int h = 0; h < 4; h++) {\n"
    "                    const int e = (wm + i * WM) * 16 + g + (h >> 1) * 8, t = (wn + j * WN) * 8 + 2 * q + (h & 1);\n"
    "                    if (e < E && t < T)\n"
    "                        moec_st_cluster(&s_red[rank][t % TPB][e], __float_as_uint(acc[i][j][h]), (unsigned)(t / TPB));\n"
    "                }\n"
    "    }\n"
    "    moec_cluster_sync();\n"
    "    /* this block's tokens' logits: the partials summed in rank order, into s_red[0] */\n"
    "    for (int i = threadIdx.x; i < TPB * E; i += NW * 32) {\n"
    "        float v = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < CL; r++)\n"
    "            v += s_red[r][i / E][i % E];\n"
    "        s_red[0][i / E][i % E] = v;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    const float *logits = &s_red[0][0][0];\n";

/* ROUTER_MMA's top-k (a warp a token of the block's, then the choices to
 * block 0) and align (block 0, from the gathered ids) */
static const char ROUTER_MMA_TAIL[] =
    "    {\n"
    "    __shared__ float s_s[NW][E], s_c[NW][E], s_g[NW][NG];\n"
    "    __shared__ unsigned char s_keep[NW][NG];\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const int t0 = tb;\n"
    "    for (int t = tb + warp; t < tb + TPB && t < T; t += NW) {\n"
    "%s"
    "        if (lane < K)\n"
    "            moec_st_cluster(&s_all[t * K + lane], (unsigned)my_id, 0u);\n"
    "        __syncwarp(); /* the warp's scores are rewritten for its next token */\n"
    "    }\n"
    "    }\n"
    "    moec_cluster_sync();\n"
    "    if (rank != 0)\n"
    "        return;\n"
    "    {\n"
    "        const int *ids = s_all;\n"
    "        constexpr int E0 = 0, BM = %d, NT = NW * 32;\n"
    "        constexpr long long NB = %lldLL;\n"
    "%s    }\n"
    "}\n\n";

moec_status cg_emit_moe_topk(cg_ctx *c, const ir_op *op)
{
    const char *who = op->out[0]->name;
    const ir_value *logits = op->in[0];
    const ir_value *bias = op->n_in > 1 ? op->in[1] : NULL;
    if (logits->type.rank != 2 || op->n_out != 2)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moe_topk %%%s: logits must be [T, E]", who);
    long long E = logits->type.dims[1];
    long long K = ir_op_attr_int(op, "top_k", 0);
    long long NG = ir_op_attr_int(op, "n_group", 1);
    long long TG = ir_op_attr_int(op, "topk_group", 1);
    int norm = ir_op_attr_int(op, "norm_topk_prob", 0) != 0;
    const char *scoring = ir_op_attr_str(op, "scoring", "");
    const char *gscore = ir_op_attr_str(op, "group_score", "max");
    int softmax = !strcmp(scoring, "softmax");
    int top2 = !strcmp(gscore, "top2_sum");
    if (!softmax && strcmp(scoring, "sigmoid"))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moe_topk %%%s: scoring \"%s\"", who, scoring);
    if (!top2 && strcmp(gscore, "max"))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moe_topk %%%s: group_score \"%s\"", who, gscore);
    if (K < 1 || K > E || NG < 1 || E % NG || TG < 1 || TG > NG || (top2 && NG > 1 && E / NG < 2) ||
        (NG > 1 && K > TG * (E / NG)))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "moe_topk %%%s: top_k %lld, n_group %lld, topk_group %lld do not fit %lld "
                        "experts",
                        who, K, NG, TG, E);
    if (K > 32)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "moe_topk %%%s: top_k %lld > 32 (one lane per choice)",
                        who, K);
    if (E > 1024)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "moe_topk %%%s: %lld experts > 1024 (a lane holds at most 32 of them)", who,
                        E);
    if (cg_storage(c, logits) != IR_DTYPE_F32 || cg_storage(c, op->out[0]) != IR_DTYPE_I32 ||
        cg_storage(c, op->out[1]) != IR_DTYPE_F32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "moe_topk %%%s: logits and weights must be stored as f32, ids as i32", who);
    /* shared memory per warp: s, c (floats), group scores and flags */
    long long per_warp = E * 8 + NG * 5;
    int nw = 4;
    while (nw > 1 && per_warp * nw > 40 * 1024)
        nw--;
    if (per_warp > 40 * 1024)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "moe_topk %%%s: %lld experts do not fit shared memory",
                        who, E);
    ir_dtype bdt = bias ? cg_storage(c, bias) : IR_DTYPE_F32;
    /* the moe_routed after it aligned here: a warp per token in one block,
       and the align's counts (3 ints per expert) beside them */
    int bm = 0;
    long long nb = 0;
    /* (router_of, for the router's linear too, sizes its own forms) */
    router_form rf = ROUTER_NONE;
    const ir_op *router = router_of(c, op, &rf), *routed = aligned_with(c, op, router, &bm, &nb);
    router_mma_shape rs = rf == ROUTER_MMA ? mma_shape(E, K, NG, c->T) : (router_mma_shape){0};
    int cl = rf == ROUTER_MMA ? rs.cl : ROUTER_CLUSTER;
    /* MOEC_MOE_ROUTE_MMA_LATE=1: the kernel after it is launched only as
       this one's blocks exit */
    int late = rf == ROUTER_MMA && cg_env_int("MOEC_MOE_ROUTE_MMA_LATE", 0, 0, 1);
    if (routed && !router && per_warp * c->T + 12 * E > 40 * 1024)
        routed = NULL;
    if (routed)
        nw = c->T;
    const ir_value *rx = router ? router->in[0] : NULL, *rw = router ? router->in[1] : NULL;
    long long H = rw ? rw->type.dims[1] : 0;
    int ve = rw ? cg_vec_width(H) : 1;
    if (router)
        nw = 8; /* GEMV: warps 0 .. T-1 of block 0 choose; all eight align */
    char name[240], align[48] = "", rtag[80] = "";
    if (routed)
        snprintf(align, sizeof align, "_align_bm%d", bm);
    if (router)
        snprintf(rtag, sizeof rtag, "_router%s_h%lld_%s", rf == ROUTER_MMA ? "mma" : "", H,
                 ir_dtype_name(cg_storage(c, rw)));
    if (late)
        snprintf(rtag + strlen(rtag), sizeof rtag - strlen(rtag), "_late");
    if (rf == ROUTER_MMA && cl != ROUTER_CLUSTER)
        snprintf(rtag + strlen(rtag), sizeof rtag - strlen(rtag), "_cl%d", cl);
    /* the GEMV form's weight rows read into registers before the wait:
       bf16, whole 16-byte chunks, at most ROUTER_WPRE_REGS registers of
       them a thread (MOEC_MOE_ROUTER_WPRE=0: the L2 prefetch only) */
    int wpre = 0;
    if (rf == ROUTER_GEMV && cg_storage(c, rw) == IR_DTYPE_BF16 && ve == 8 && H % 256 == 0 &&
        cg_env_int("MOEC_MOE_ROUTER_WPRE", 1, 0, 1)) {
        long long epb = (E + ROUTER_CLUSTER - 1) / ROUTER_CLUSTER, rpw = (epb + 7) / 8;
        wpre = rpw * (H / 256) * 4 <= ROUTER_WPRE_REGS;
    }
    if (wpre)
        snprintf(rtag + strlen(rtag), sizeof rtag - strlen(rtag), "_wpre");
    /* MOEC_MOE_TOPK_PF_KB=N (one-block aligning forms): as each token's
       choices are made, the first N KiB of every chosen expert's gate and
       up rows are asked into L2, so that the DRAM starts on the routed
       gate_up's weights before that kernel's blocks pass their wait */
    long long pf = 0, gsb = 0, uoffb = 0;
    const ir_value *pf_g = NULL, *pf_u = NULL;
    int64_t pf_e0 = 0;
    if (routed && rf != ROUTER_MMA && (pf = 1024LL * cg_env_int("MOEC_MOE_TOPK_PF_KB", 0, 0, 1 << 16))) {
        /* routed's operands: x, ids, w, gate_up | gate, up, down */
        pf_g = routed->in[3];
        pf_u = routed->n_in == 6 ? routed->in[4] : NULL;
        pf_e0 = ir_op_attr_int(routed, "expert_start", 0);
        long long es = (long long)ir_dtype_size(cg_storage(c, pf_g));
        gsb = pf_g->type.dims[1] * pf_g->type.dims[2] * es;
        uoffb = pf_u ? 0 : gsb / 2;
        snprintf(rtag + strlen(rtag), sizeof rtag - strlen(rtag), "_pf%lld", pf / 1024);
    }
    snprintf(name, sizeof name, "moe_topk%s%s_e%lld_k%lld_%s_g%lld_tg%lld_%s_n%d_b%s_t%d", align,
             rtag, E, K, softmax ? "softmax" : "sigmoid", NG, TG, top2 ? "top2" : "max", norm,
             bias ? ir_dtype_name(bdt) : "0", c->T);
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "moe_topk %%%s: no memory", who);
    char pf_src[512] = "";
    if (pf)
        snprintf(pf_src, sizeof pf_src,
                 "    if (lane < K && my_id >= %lld && my_id - %lld < %lld) {\n"
                 "        const long long eb = (long long)(my_id - %lld) * %lldLL;\n"
                 "        moec_prefetch_l2(pf_g + eb, %lldULL);\n"
                 "        moec_prefetch_l2(pf_u + eb + %lldLL, %lldULL);\n"
                 "    }\n",
                 (long long)pf_e0, (long long)pf_e0, (long long)pf_g->type.dims[0], (long long)pf_e0,
                 gsb, pf < gsb ? pf : gsb, uoffb, pf < gsb ? pf : gsb);
    if (is_new && router) {
        ir_dtype dt = cg_storage(c, rw);
        moec_buf_printf(&c->src,
                      "// moe_topk: the router's logits (linear %%%s) in a cluster of %d blocks, "
                      "then %s grouped top-k, one warp per token, and the slots aligned "
                      "for the moe_routed after it (codegen/moe_topk.c, cg_emit_moe_topk)\n"
                      "extern \"C\" __global__ void __cluster_dims__(%d, 1, 1) __launch_bounds__(%d) "
                      "%s(const %s *__restrict__ x, const %s *__restrict__ w, ",
                      router->out[0]->name, cl,
                      rf == ROUTER_MMA ? "each block's" : "block 0's", cl, nw * 32, name,
                      cg_ctype(dt), cg_ctype(dt));
    } else if (is_new) {
        moec_buf_printf(&c->src,
                      "// moe_topk: router scores and grouped top-k, one warp per token%s "
                      "(codegen/moe_topk.c, cg_emit_moe_topk)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const float *__restrict__ "
                      "logits, ",
                      routed ? ", then the slots aligned for the moe_routed after it" : "",
                      nw * 32, name);
    }
    if (is_new) {
        if (bias)
            moec_buf_printf(&c->src, "const %s *__restrict__ bias, ", cg_ctype(bdt));
        moec_buf_printf(&c->src, "int *__restrict__ ids, float *__restrict__ wts, float scaling%s%s",
                      routed ? ", int *__restrict__ sorted, int *__restrict__ blk_expert, "
                               "int *__restrict__ n_used"
                             : "",
                      pf ? ", const char *__restrict__ pf_g, const char *__restrict__ pf_u" : "");
        moec_buf_printf(&c->src,
                      ")\n{\n"
                      "    constexpr int E = %lld, K = %lld, NG = %lld, TG = %lld, GS = E / NG, T = %d, "
                      "NW = %d;\n"
                      "    constexpr bool SOFTMAX = %s, TOP2 = %s, NORM = %s, HAS_BIAS = %s;\n",
                      E, K, NG, TG, c->T, nw, softmax ? "true" : "false", top2 ? "true" : "false",
                      norm ? "true" : "false", bias ? "true" : "false");
        if (!bias)
            moec_buf_printf(&c->src, "    const float *bias = nullptr;\n    (void)bias;\n");
        if (rf == ROUTER_MMA) {
            moec_buf_printf(&c->src,
                            "    constexpr int H = %lld, CL = %d, TPB = %d, WM = %d, WN = %d, "
                            "MTW = %d, NTW = %d, U = %d;\n",
                            H, rs.cl, rs.tpb, rs.wm, rs.wn, rs.mtw, rs.ntw, rs.u);
            /* before the wait: the router weight into L2, a CL-th of its
               rows a block (it is small: no cap) */
            if (cg_env_int("MOEC_PREFETCH_KB", CG_PREFETCH_KB, 0, CG_PREFETCH_KB_MAX) > 0)
                moec_buf_printf(&c->src,
                                "    if (threadIdx.x == 0) {\n"
                                "        const int r0 = blockIdx.x * E / CL, r1 = (blockIdx.x + 1) * E / CL;\n"
                                "        moec_prefetch_l2(w + (long long)r0 * H, (unsigned long long)(r1 - r0) * H * 2);\n"
                                "    }\n");
            moec_buf_printf(&c->src, "    moec_pdl_%s();\n", late ? "wait" : "enter");
            moec_buf_printf(&c->src, "%s", ROUTER_MMA_BODY);
        } else if (router) {
            moec_buf_printf(&c->src, "    typedef %s TW;\n    constexpr long long H = %lldLL;\n"
                                   "    constexpr int VE = %d, CL = %d, EPB = (E + CL - 1) / CL;\n",
                            cg_ctype(cg_storage(c, rw)), H, ve, ROUTER_CLUSTER);
            /* before the wait: the block's rows of the router weight into
               registers (router_wpre), else into L2 */
            if (wpre)
                moec_buf_printf(&c->src, "%s", ROUTER_WPRE_HEAD);
            else
                cg_emit_prefetch(&c->src, cg_prefetch_bytes(c),
                             "        const long long r0 = (long long)blockIdx.x * EPB, "
                             "nr = E - r0 < EPB ? E - r0 : EPB;\n"
                             "        if (nr > 0)\n"
                             "            moec_prefetch_rows(w + r0 * H, nr, H * (long long)sizeof(TW), "
                             "PF_CAP);\n");
            moec_buf_printf(&c->src, "%s%s%s%s%s%s", ROUTER_OPEN, wpre ? "" : ROUTER_RPW,
                            ROUTER_ACC, wpre ? ROUTER_WPRE_LOAD : ROUTER_LOAD, ROUTER_PRODUCTS,
                            ROUTER_GATHER);
        }
        if (rf == ROUTER_MMA)
            moec_buf_printf(&c->src, ROUTER_MMA_TAIL, TOPK_BODY, bm, nb, CG_MOE_ALIGN_BODY);
        else if (!routed)
            moec_buf_printf(&c->src, "%s    if (t >= T)\n        return;\n%s}\n\n", TOPK_HEAD,
                            TOPK_BODY);
        else /* the warps of tokens choose, every warp aligns, from the
                choices kept in shared memory too (not read back from ids) */
            moec_buf_printf(&c->src,
                          "    __shared__ int s_ids[T * K];\n"
                          "    {\n%s    if (t < T) {\n%s"
                          "    if (lane < K)\n        s_ids[t * K + lane] = my_id;\n"
                          "%s"
                          "    }\n    }\n"
                          "    __syncthreads();\n"
                          "    {\n"
                          "        const int *ids = s_ids;\n"
                          "        constexpr int E0 = 0, BM = %d, NT = NW * 32;\n"
                          "        constexpr long long NB = %lldLL;\n"
                          "%s    }\n"
                          "}\n\n",
                          TOPK_HEAD, TOPK_BODY, pf_src, bm, nb, CG_MOE_ALIGN_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "moe_topk %%%s: no memory", who);
    s->kernel = k;
    s->grid[0] = router ? (unsigned)cl : (unsigned)((c->T + nw - 1) / nw);
    s->block[0] = (unsigned)(nw * 32);
    int n = 0;
    if (router) {
        s->args[n++] = cg_arg_act(rx);
        s->args[n++] = cg_arg_weight(rw);
    } else
        s->args[n++] = cg_arg_act(logits);
    if (bias)
        s->args[n++] = cg_arg_act(bias);
    s->args[n++] = cg_arg_act(op->out[0]);
    s->args[n++] = cg_arg_act(op->out[1]);
    s->args[n++] = cg_arg_f32(ir_op_attr_float(op, "scaling", 1.0));
    if (routed) {
        /* the moe_routed's sorted slots, block experts and count used, in
           its order (codegen/moe_routed.c) */
        c->moe_aligned = routed->id + 1;
        c->moe_align_off[0] = cg_scratch(c, (size_t)(nb * bm) * 4);
        c->moe_align_off[1] = cg_scratch(c, (size_t)nb * 4);
        c->moe_align_off[2] = cg_scratch(c, 4);
        c->moe_align_off[3] = c->scratch_cur[c->stream == 1];
        for (int i = 0; i < 3; i++)
            s->args[n++] = cg_arg_scratch(c->moe_align_off[i]);
    }
    if (pf) {
        s->args[n++] = cg_arg_weight(pf_g);
        s->args[n++] = cg_arg_weight(pf_u ? pf_u : pf_g);
    }
    s->n_args = n;
    return MOEC_OK;
}
