/* mla_absorb.c — MLA's absorbed up-projections: one strided-batched
 * cuBLASLt GEMM over the H heads, or a generated kernel (below). kv_b [H*(dn+dv), r]
 * holds per head h the rows W_UK[h] (dn of them) then W_UV[h] (dv).
 *
 * mla_qabsorb, q_c[t,h,:] = q_nope[t,h,:] W_UK[h] ([dn, r] row-major): in
 * cuBLASLt's column-major terms per head C (r x T, ldc = H*r) = A (W_UK[h]
 * read as r x dn, lda = r, not transposed) * B (q_nope[:,h,:] read as dn x T,
 * ldb = H*dn); batch strides (dn+dv)*r, dn, r.
 *
 * mla_vabsorb, o[t,h,:] = W_UV[h] ([dv, r]) o_c[t,h,:]: C (dv x T, ldc =
 * H*dv) = A^T (W_UV[h] read as r x dv, lda = r, transposed) * B (o_c[:,h,:]
 * read as r x T, ldb = H*r); batch strides (dn+dv)*r, r, dv. A starts dn
 * rows into kv_b: the weight argument's i is that byte offset.
 *
 * Buckets of up to ABSORB_MAX_T tokens (MOEC_ABSORB_MAX_T at codegen; 0:
 * cuBLASLt always) run a generated kernel instead: at a token or two the
 * GEMM is a 2 MB (V2-Lite) to 16 MB (V3) read that cuBLASLt's batched
 * launch takes ~7 us for. qabsorb: a block per head and 64 columns of r,
 * its warps splitting the dn rows of W_UK[h] (every load of the block in
 * flight at once), the tokens' q_nope rows in shared memory, the warps'
 * partial sums added in shared memory. vabsorb: a block per head and
 * ABS_ROWS rows of W_UV[h], a warp per few rows, lanes along r against the
 * tokens' o_c rows in shared memory, a warp sum per row and token. fp32
 * accumulation, as cuBLASLt's. Past them, up to ABS_MMA_MAX_T tokens, a
 * tensor-core form (MMA_BODY) where bf16 and the sizes allow; cuBLASLt
 * otherwise. qabsorb with head_stride reads q_nope in place in the q
 * projection (ldb and the batch stride of B in the GEMM); the MLA
 * prologue's kernel may run its generated form (cg_mla_qabsorb_part). */
#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

/* (H100, 2026-11-24, V2-Lite shape: the kernels 2.5 us a layer faster than
   cuBLASLt at 1 token, 6 us slower at 8) */
#define ABSORB_MAX_T 2
#define ABS_Q_WARPS 16 /* qabsorb: warps per block, splitting dn */
#define ABS_V_WARPS 8  /* vabsorb: warps per block */
#define ABS_V_RPW 2    /* vabsorb: W_UV rows per warp */
#define ABS_Q_VW 2     /* qabsorb: columns per lane (64 a block: blocks for every SM) */
/* Measured and taken out: vabsorb's CUDA-core kernel merging the split
 * MLA attention's partial states itself, each block its head's (the
 * merge kernel's moec_attn_merge, rounded as that kernel stores it), in
 * place of the merge kernel at 1 and 2 tokens: one launch fewer a layer.
 * The CPU emulator's six cases (r 64 to 512, 1 to 64 splits, a padding
 * token) and gpu_model, gpu_graphs and gpu_engine passed, but V2-Lite at
 * context 1024, ms a step at 1 / 2 tokens: bf16 1.831 / 2.918 against
 * 1.833 / 2.824 with the merge kernel, fp8 1.407 / 1.881 against 1.402 /
 * 1.800 (H200, 2026-12-01, one call). Each of a head's 8 blocks merges
 * the head's splits before its products, token after token: the merge's
 * reads stay on the path, and the launch saved bought nothing. History at
 * a5301b2 (MOEC_MLA_VABSORB_MERGE). */
/* The tensor-core form: buckets past ABSORB_MAX_T up to ABS_MMA_MAX_T tokens
 * (MOEC_ABSORB_MMA_MAX_T at codegen; 0: cuBLASLt there), bf16 */
#define ABS_MMA_MAX_T 64
#define ABS_MMA_WARPS 8
#define ABS_MMA_SMEM (200 * 1024)

/* The tensor-core form's body after its constants (T tokens in MT tiles of
 * 16, the block's NB output columns NB0 = by * NB of head h = bx, K the
 * reduced dim, x's strides XT and XH, kv_b's rows of head h from WR0 on,
 * BT: B held [n][k], k along kv_b's rows, as vabsorb's W_UV; else [k][n],
 * n along them, as qabsorb's W_UK): the block's weight columns into shared
 * memory by cp.async before the wait (they do not depend on the kernel
 * before), then the tokens' rows of x (zeros past T), then m16n8k16
 * products, each warp a 16-row by 16-column tile over all of K. fp32
 * accumulation, as cuBLASLt's. */
static const char MMA_BODY[] =
    "    constexpr int NT = NW * 32, LA = K + 8, LB = BT ? K + 8 : NB + 8;\n"
    "    extern __shared__ __align__(16) unsigned char smem_raw[];\n"
    "    __nv_bfloat16 *As = reinterpret_cast<__nv_bfloat16 *>(smem_raw);\n"
    "    __nv_bfloat16 *Bs = As + MT * 16 * LA;\n"
    "    const int h = bx, nb0 = by * NB, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const int g = lane >> 2, tq = lane & 3;\n"
    "    const TW *w = kv_b + ((long long)h * (DN + DV) + WR0) * R;\n"
    "    if constexpr (BT) { /* B[n][k] = w[(nb0 + n) * R + k] */\n"
    "        for (int i = threadIdx.x; i < NB * (K / 8); i += NT) {\n"
    "            const int n = i / (K / 8), k = (i % (K / 8)) * 8;\n"
    "            moec_cp16(&Bs[n * LB + k], w + (long long)(nb0 + n) * R + k, true);\n"
    "        }\n"
    "    } else { /* B[k][n] = w[k * R + nb0 + n] */\n"
    "        for (int i = threadIdx.x; i < K * (NB / 8); i += NT) {\n"
    "            const int k = i / (NB / 8), n = (i % (NB / 8)) * 8;\n"
    "            moec_cp16(&Bs[k * LB + n], w + (long long)k * R + nb0 + n, true);\n"
    "        }\n"
    "    }\n"
    "    moec_cp_commit();\n"
    "    moec_pdl_enter();\n"
    "    for (int i = threadIdx.x; i < MT * 16 * (K / 8); i += NT) {\n"
    "        const int t = i / (K / 8), k = (i % (K / 8)) * 8;\n"
    "        moec_cp16(&As[t * LA + k], x + (long long)(t < T ? t : 0) * XT + (long long)h * XH + k, t < T);\n"
    "    }\n"
    "    moec_cp_commit();\n"
    "    moec_cp_wait_group<0>();\n"
    "    __syncthreads();\n"
    "    constexpr int NP = NB / 16;\n"
    "    for (int tile = warp; tile < MT * NP; tile += NW) {\n"
    "        const int m0 = (tile / NP) * 16, c0 = (tile % NP) * 16;\n"
    "        float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};\n"
    "#pragma unroll 4\n"
    "        for (int k0 = 0; k0 < K; k0 += 16) {\n"
    "            unsigned a[4], b[4];\n"
    "            moec_ldmatrix<4, false>(a, &As[(m0 + (lane & 15)) * LA + k0 + (lane >> 4) * 8]);\n"
    "            if constexpr (BT)\n"
    "                moec_ldmatrix<4, false>(b, &Bs[(c0 + (lane & 7) + ((lane >> 4) << 3)) * LB + k0 +\n"
    "                                              ((lane >> 3) & 1) * 8]);\n"
    "            else\n"
    "                moec_ldmatrix<4, true>(b, &Bs[(k0 + (lane & 15)) * LB + c0 + (lane >> 4) * 8]);\n"
    "            moec_mma_bf16(c[0], a[0], a[1], a[2], a[3], b[0], b[1]);\n"
    "            moec_mma_bf16(c[1], a[0], a[1], a[2], a[3], b[2], b[3]);\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 2; j++) {\n"
    "            const int col = nb0 + c0 + j * 8 + 2 * tq;\n"
    "            if (m0 + g < T) {\n"
    "                st(y + ((long long)(m0 + g) * H + h) * N + col, c[j][0]);\n"
    "                st(y + ((long long)(m0 + g) * H + h) * N + col + 1, c[j][1]);\n"
    "            }\n"
    "            if (m0 + g + 8 < T) {\n"
    "                st(y + ((long long)(m0 + g + 8) * H + h) * N + col, c[j][2]);\n"
    "                st(y + ((long long)(m0 + g + 8) * H + h) * N + col + 1, c[j][3]);\n"
    "            }\n"
    "        }\n"
    "    }\n";

static const char QABSORB_BODY[] =
    "    constexpr int NT = NW * 32, COLS = 32 * VW;\n"
    "    __shared__ float xs[T][DN];\n"
    "    __shared__ __align__(16) float red[NW][COLS];\n"
    "    const int h = bx, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const int c0 = by * COLS + lane * VW;\n"
    "    for (int i = threadIdx.x; i < T * DN; i += NT)\n"
    "        xs[i / DN][i % DN] = ld(x + (long long)(i / DN) * XT + (long long)h * XH + i % DN);\n"
    "    __syncthreads();\n"
    "    const TW *w = kv_b + (long long)h * (DN + DV) * R;\n"
    "    float acc[T][VW];\n"
    "#pragma unroll\n"
    "    for (int t = 0; t < T; t++)\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < VW; j++)\n"
    "            acc[t][j] = 0.0f;\n"
    "    if (c0 < R) {\n"
    "#pragma unroll 8\n"
    "        for (int d = warp; d < DN; d += NW) {\n"
    "            float wv[VW];\n"
    "            ldv<VW>(w + (long long)d * R + c0, wv);\n"
    "#pragma unroll\n"
    "            for (int t = 0; t < T; t++) {\n"
    "                const float q = xs[t][d];\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < VW; j++)\n"
    "                    acc[t][j] += q * wv[j];\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "    for (int t = 0; t < T; t++) {\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < VW; j++)\n"
    "            red[warp][lane * VW + j] = acc[t][j];\n"
    "        __syncthreads();\n"
    "        for (int i = threadIdx.x; i < COLS; i += NT) {\n"
    "            const int col = by * COLS + i;\n"
    "            if (col < R) {\n"
    "                float a = 0.0f;\n"
    "#pragma unroll\n"
    "                for (int k = 0; k < NW; k++)\n"
    "                    a += red[k][i];\n"
    "                st(y + ((long long)t * H + h) * R + col, a);\n"
    "            }\n"
    "        }\n"
    "        __syncthreads();\n"
    "    }\n";

static const char VABSORB_BODY[] =
    "    constexpr int NT = NW * 32;\n"
    "    __shared__ __align__(16) float xs[T][R];\n"
    "    const int h = bx, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    for (int i = threadIdx.x; i < T * R; i += NT)\n"
    "        xs[i / R][i % R] = ld(x + ((long long)(i / R) * H + h) * R + i % R);\n"
    "    __syncthreads();\n"
    "    const int v0 = (by * NW + warp) * RPW;\n"
    "    const TW *w = kv_b + ((long long)h * (DN + DV) + DN) * R;\n"
    "    float acc[RPW][T];\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < RPW; k++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++)\n"
    "            acc[k][t] = 0.0f;\n"
    "    for (int c = lane * VW; c < R; c += 32 * VW) {\n"
    "        float wv[RPW][VW];\n"
    "#pragma unroll\n"
    "        for (int k = 0; k < RPW; k++)\n"
    "            if (v0 + k < DV)\n"
    "                ldv<VW>(w + (long long)(v0 + k) * R + c, wv[k]);\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++) {\n"
    "            float xv[VW];\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < VW; j++)\n"
    "                xv[j] = xs[t][c + j];\n"
    "#pragma unroll\n"
    "            for (int k = 0; k < RPW; k++) {\n"
    "                if (v0 + k >= DV)\n"
    "                    continue;\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < VW; j++)\n"
    "                    acc[k][t] += wv[k][j] * xv[j];\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < RPW; k++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++) {\n"
    "            const float a = warp_sum(acc[k][t]);\n"
    "            if (lane == 0 && v0 + k < DV)\n"
    "                st(y + ((long long)t * H + h) * DV + v0 + k, a);\n"
    "        }\n";

/* Before the wait (cg_emit_prefetch), rows of kv_b the head's blocks read:
 * qabsorb's blocks of a head (its columns of every W_UK[h] row) share
 * W_UK[h]'s rows out, a contiguous share each; vabsorb's block its
 * W_UV[h] rows. */
static const char QABSORB_PREFETCH[] =
    "        constexpr int GY = (R + 32 * VW - 1) / (32 * VW);\n"
    "        const long long d0 = (long long)by * DN / GY, d1 = (long long)(by + 1) * DN / GY;\n"
    "        moec_prefetch_rows(kv_b + ((long long)bx * (DN + DV) + d0) * R, d1 - d0,\n"
    "                           (long long)R * (long long)sizeof(TW), PF_CAP);\n";
static const char VABSORB_PREFETCH[] =
    "        const long long v0 = (long long)by * NW * RPW, nv = DV - v0 < NW * RPW ? DV - v0 : NW * RPW;\n"
    "        moec_prefetch_rows(kv_b + ((long long)bx * (DN + DV) + DN + v0) * R, nv,\n"
    "                           (long long)R * (long long)sizeof(TW), PF_CAP);\n";

/* The generated kernel's shape for op at bucket c->T: which absorption,
 * the head dims, x's strides (elements between tokens' rows and between
 * heads: qabsorb with head_stride reads the q projection in place), the
 * dtypes, columns a lane, warps and the grid. */
typedef struct absorb_gen {
    int q, vw, nw;
    int64_t H, dn, dv, r, xt, xh;
    ir_dtype da, db, dc;
    unsigned gx, gy;
    /* the tensor-core form: its block's output columns, the token tiles,
       the reduced dim, dynamic shared memory */
    int mma, nb, mt;
    int64_t k;
    unsigned smem;
} absorb_gen;

/* op's shapes into g; 0 when they do not hold (the emitter's error). */
static int absorb_shape(const cg_ctx *c, const ir_op *op, absorb_gen *g)
{
    memset(g, 0, sizeof *g);
    g->q = op->kind == IR_OP_MLA_QABSORB;
    const ir_value *x = op->in[0], *kv_b = op->in[1], *y = op->out[0];
    g->dn = ir_op_attr_int(op, "qk_nope_head_dim", -1);
    g->dv = ir_op_attr_int(op, "v_head_dim", -1);
    int64_t S = g->q ? ir_op_attr_int(op, "head_stride", 0) : 0;
    if (x->type.rank != (S > 0 ? 2 : 3) || kv_b->type.rank != 2 || y->type.rank != 3 ||
        g->dn < 1 || g->dv < 1)
        return 0;
    g->H = S > 0 ? ir_op_attr_int(op, "heads", 0) : x->type.dims[1];
    g->r = kv_b->type.dims[1];
    g->xh = S > 0 ? S : g->q ? g->dn : g->r;
    g->xt = S > 0 ? x->type.dims[1] : g->H * g->xh;
    if (g->H < 1 || kv_b->type.dims[0] != g->H * (g->dn + g->dv) ||
        (S > 0 ? S < g->dn || (g->H - 1) * S + g->dn > g->xt
               : x->type.dims[2] != (g->q ? g->dn : g->r)) ||
        y->type.dims[1] != g->H || y->type.dims[2] != (g->q ? g->r : g->dv))
        return 0;
    g->da = cg_storage(c, kv_b);
    g->db = cg_storage(c, x);
    g->dc = cg_storage(c, y);
    g->vw = cg_vec_width(g->r);
    if (g->q && g->vw > ABS_Q_VW)
        g->vw = ABS_Q_VW;
    g->nw = g->q ? ABS_Q_WARPS : ABS_V_WARPS;
    g->gx = (unsigned)g->H;
    g->gy = g->q ? (unsigned)((g->r + 32 * g->vw - 1) / (32 * g->vw))
                 : (unsigned)((g->dv + g->nw * ABS_V_RPW - 1) / (g->nw * ABS_V_RPW));
    return 1;
}

/* The tensor-core form at bucket c->T into g: bf16 weights and x, the
 * reduced dim in 16s, the output columns of a head in 16s; 128 to 256
 * blocks where the columns allow (qabsorb at V2-Lite's shape: 8 blocks of
 * 64 columns a head; vabsorb: 8 of 16); its shared memory within
 * ABS_MMA_SMEM. 0 when it does not apply. */
static int absorb_mma(const cg_ctx *c, absorb_gen *g)
{
    int64_t n = g->q ? g->r : g->dv;
    g->k = g->q ? g->dn : g->r;
    if (c->T > cg_env_int("MOEC_ABSORB_MMA_MAX_T", ABS_MMA_MAX_T, 0, 256) || c->T < 1 ||
        g->da != IR_DTYPE_BF16 || g->db != IR_DTYPE_BF16 || g->k % 16 || n % 16 ||
        (g->q ? g->xh % 8 || g->xt % 8 : 0))
        return 0;
    /* the widest column block (a multiple of 16 dividing n, at most 64)
       that still gives every head at least 8 blocks, or 16 */
    g->nb = 16;
    for (int nb = 64; nb > 16; nb /= 2)
        if (n % nb == 0 && n / nb >= 8) {
            g->nb = nb;
            break;
        }
    g->mt = (c->T + 15) / 16;
    int64_t smem = ((int64_t)g->mt * 16 * (g->k + 8) +
                    (g->q ? g->k * (g->nb + 8) : (int64_t)g->nb * (g->k + 8))) * 2;
    if (smem > ABS_MMA_SMEM || smem > (int64_t)cg_smem_max(c->opt))
        return 0;
    g->mma = 1;
    g->smem = (unsigned)smem;
    g->nw = ABS_MMA_WARPS;
    g->gx = (unsigned)g->H;
    g->gy = (unsigned)(n / g->nb);
    return 1;
}

/* Whether op runs as a generated kernel at bucket c->T (else one cuBLASLt
 * GEMM): up to MOEC_ABSORB_MAX_T tokens the CUDA-core form (bf16 or f32
 * weights of x's dtype, the tokens' rows within its shared memory), past
 * them up to MOEC_ABSORB_MMA_MAX_T the tensor-core one (absorb_mma). */
static int absorb_generated(const cg_ctx *c, const ir_op *op, absorb_gen *g)
{
    if (!absorb_shape(c, op, g) || g->da != g->db || g->da == IR_DTYPE_I32 ||
        g->dc == IR_DTYPE_I32 || g->da == IR_DTYPE_F8E4M3)
        return 0;
    /* the tokens' rows of x, and qabsorb's partial sums */
    size_t smem = (size_t)c->T * (size_t)(g->q ? g->dn : g->r) * 4 +
                  (g->q ? ABS_Q_WARPS * 32 * 8 * 4 : 0);
    if (c->T <= cg_env_int("MOEC_ABSORB_MAX_T", ABSORB_MAX_T, 0, 8))
        return smem <= 48 * 1024;
    return absorb_mma(c, g);
}

/* The kernel's types and constants (inside a scope of its own). */
static void emit_consts(moec_buf *b, const cg_ctx *c, const absorb_gen *g)
{
    moec_buf_printf(b,
                    "    typedef %s TW;\n"
                    "    constexpr int T = %d, H = %lld, DN = %lld, DV = %lld, R = %lld, VW = %d, "
                    "NW = %d, RPW = %d;\n"
                    "    constexpr long long XT = %lld, XH = %lld;\n"
                    "    (void)T;\n    (void)H;\n    (void)RPW;\n    (void)XT;\n    (void)XH;\n",
                    cg_ctype(g->da), c->T, (long long)g->H, (long long)g->dn, (long long)g->dv,
                    (long long)g->r, g->vw, g->nw, ABS_V_RPW, (long long)g->xt, (long long)g->xh);
    if (g->mma)
        moec_buf_printf(b,
                        "    constexpr int MT = %d, NB = %d, K = %lld, N = %lld, WR0 = %lld;\n"
                        "    constexpr bool BT = %s;\n",
                        g->mt, g->nb, (long long)g->k, (long long)(g->q ? g->r : g->dv),
                        (long long)(g->q ? 0 : g->dn), g->q ? "false" : "true");
}

/* The code after the constants: the CUDA-core form's prefetch, the wait
 * (without a prefetch only when `wait`: else cg_add_pdl_waits puts it first)
 * and its body, or the tensor-core form (which waits itself). */
static void emit_code(moec_buf *b, const cg_ctx *c, const absorb_gen *g, int wait)
{
    if (g->mma) {
        moec_buf_printf(b, "%s", MMA_BODY);
        return;
    }
    long long pf = cg_prefetch_bytes(c);
    if (pf > 0)
        cg_emit_prefetch(b, pf, g->q ? QABSORB_PREFETCH : VABSORB_PREFETCH);
    else if (wait)
        moec_buf_printf(b, "    moec_pdl_enter();\n");
    moec_buf_printf(b, "%s", g->q ? QABSORB_BODY : VABSORB_BODY);
}

/* The generated form of op for bucket c->T (see the top of the file). */
static moec_status emit_kernel(cg_ctx *c, const ir_op *op, const absorb_gen *g)
{
    const ir_value *x = op->in[0], *kv_b = op->in[1], *y = op->out[0];
    char name[256], stride[64] = "";
    if (g->q && ir_op_attr(op, "head_stride"))
        snprintf(stride, sizeof stride, "_xs%lld_%lld", (long long)g->xt, (long long)g->xh);
    char form[32] = "";
    if (g->mma)
        snprintf(form, sizeof form, "_mma_nb%d", g->nb);
    snprintf(name, sizeof name, "mla_%sabsorb%s_h%lld_dn%lld_dv%lld_r%lld%s_t%d_%s_%s_%s",
             g->q ? "q" : "v", form, (long long)g->H, (long long)g->dn, (long long)g->dv,
             (long long)g->r, stride, c->T, ir_dtype_name(g->dc), ir_dtype_name(g->db),
             ir_dtype_name(g->da));
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    if (is_new) {
        moec_buf_printf(&c->src,
                        "// %s (codegen/mla_absorb.c), first for %%%s\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s "
                        "*__restrict__ x, const %s *__restrict__ kv_b, %s *__restrict__ y)\n{\n",
                        ir_op_name(op->kind), y->name, g->nw * 32, name, cg_ctype(g->db),
                        cg_ctype(g->da), cg_ctype(g->dc));
        emit_consts(&c->src, c, g);
        moec_buf_printf(&c->src, "    const int bx = blockIdx.x, by = blockIdx.y;\n");
        emit_code(&c->src, c, g, 0);
        moec_buf_printf(&c->src, "}\n\n");
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    s->kernel = k;
    s->grid[0] = g->gx;
    s->grid[1] = g->gy;
    s->block[0] = (unsigned)(g->nw * 32);
    s->smem = g->mma ? g->smem : 0;
    s->n_args = 3;
    s->args[0] = cg_arg_act(x);
    s->args[1] = cg_arg_act(kv_b);
    s->args[2] = cg_arg_act(y);
    return MOEC_OK;
}

int cg_mla_qabsorb_part(const cg_ctx *c, const ir_op *qa, cg_qabsorb_part *p)
{
    absorb_gen g;
    if (qa->kind != IR_OP_MLA_QABSORB || !ir_op_attr(qa, "head_stride") ||
        !absorb_generated(c, qa, &g))
        return 0;
    p->blocks = g.gx * g.gy;
    p->grid_x = g.gx;
    p->threads = (unsigned)(g.nw * 32);
    p->smem = g.mma ? g.smem : 0;
    p->dw = g.da;
    p->dy = g.dc;
    snprintf(p->tag, sizeof p->tag, "%sdv%lld_r%lld_%s_%s", g.mma ? "mma_" : "", (long long)g.dv,
             (long long)g.r, ir_dtype_name(g.dc), ir_dtype_name(g.da));
    return 1;
}

void cg_mla_qabsorb_emit_part(moec_buf *b, const cg_ctx *c, const ir_op *qa)
{
    absorb_gen g;
    if (!absorb_generated(c, qa, &g))
        return;
    moec_buf_printf(b, "    {\n");
    emit_consts(b, c, &g);
    emit_code(b, c, &g, 1);
    moec_buf_printf(b, "    }\n");
}

moec_status cg_emit_mla_absorb(cg_ctx *c, const ir_op *op)
{
    int q = op->kind == IR_OP_MLA_QABSORB;
    const ir_value *kv_b = op->in[1], *y = op->out[0];
    absorb_gen g;
    if (!absorb_shape(c, op, &g))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: wants x [T, H, d] (or with head_stride q [T, N]), kv_b "
                        "[H*(dn+dv), r] and the head dims, shapes that agree",
                        ir_op_name(op->kind), y->name);
    /* run inside the MLA prologue's kernel before it (codegen/mla_prologue.c) */
    if (q && op->id > 0 && cg_mla_prologue_qabsorb(c, c->m->ops[op->id - 1], NULL) == op)
        return MOEC_OK;
    if (g.da != g.db || g.da == IR_DTYPE_I32 || g.dc == IR_DTYPE_I32)
        return MOEC_ERR(
            MOEC_ERR_UNSUPPORTED,
            "%s %%%s: kv_b %%%s is stored %s but %%%s %s; cuBLASLt wants one input type",
            ir_op_name(op->kind), y->name, kv_b->name, ir_dtype_name(g.da), op->in[0]->name,
            ir_dtype_name(g.db));
    if (absorb_generated(c, op, &g))
        return emit_kernel(c, op, &g);
    int64_t H = g.H, dn = g.dn, dv = g.dv, r = g.r;
    if (H * (dn + dv) * r > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s %%%s: kv_b is too large", ir_op_name(op->kind),
                        y->name);
    ir_step *s = cg_step(c, IR_STEP_GEMM, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    ir_gemm *gm = &s->gemm;
    gm->n = c->T;
    gm->batch = (int)H;
    gm->lda = r;
    gm->stride_a = (dn + dv) * r;
    gm->type_a = g.da;
    gm->type_b = g.db;
    gm->type_c = g.dc;
    gm->alpha = 1.0f;
    gm->a = cg_arg_act(kv_b);
    gm->b = cg_arg_act(op->in[0]);
    gm->c = cg_arg_act(y);
    gm->ldb = g.xt;
    gm->stride_b = g.xh;
    if (q) {
        gm->trans_a = 0;
        gm->m = (int)r;
        gm->k = (int)dn;
        gm->ldc = H * r;
        gm->stride_c = r;
    } else {
        gm->trans_a = 1;
        gm->m = (int)dv;
        gm->k = (int)r;
        gm->ldc = H * dv;
        gm->stride_c = dv;
        gm->a.i = dn * r * (int64_t)ir_dtype_size(g.da);
    }
    return MOEC_OK;
}
