/* mla_absorb.c — MLA's absorbed up-projections as one strided-batched
 * cuBLASLt GEMM over the H heads (no generated kernel). kv_b [H*(dn+dv), r]
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
 * accumulation, as cuBLASLt's. */
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

/* (H100, 2026-11-24, V2-Lite shape: the kernels 2.5 us a layer faster than
   cuBLASLt at 1 token, 6 us slower at 8) */
#define ABSORB_MAX_T 2
#define ABS_Q_WARPS 16 /* qabsorb: warps per block, splitting dn */
#define ABS_V_WARPS 8  /* vabsorb: warps per block */
#define ABS_V_RPW 2    /* vabsorb: W_UV rows per warp */
#define ABS_Q_VW 2     /* qabsorb: columns per lane (64 a block: blocks for every SM) */

static const char QABSORB_BODY[] =
    "    constexpr int NT = NW * 32, COLS = 32 * VW;\n"
    "    __shared__ float xs[T][DN];\n"
    "    __shared__ __align__(16) float red[NW][COLS];\n"
    "    const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const int c0 = blockIdx.y * COLS + lane * VW;\n"
    "    for (int i = threadIdx.x; i < T * DN; i += NT)\n"
    "        xs[i / DN][i % DN] = ld(x + ((long long)(i / DN) * H + h) * DN + i % DN);\n"
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
    "            const int col = blockIdx.y * COLS + i;\n"
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
    "    const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    for (int i = threadIdx.x; i < T * R; i += NT)\n"
    "        xs[i / R][i % R] = ld(x + ((long long)(i / R) * H + h) * R + i % R);\n"
    "    __syncthreads();\n"
    "    const int v0 = (blockIdx.y * NW + warp) * RPW;\n"
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
    "        const long long d0 = (long long)blockIdx.y * DN / GY, d1 = (long long)(blockIdx.y + 1) * DN / GY;\n"
    "        moec_prefetch_rows(kv_b + ((long long)blockIdx.x * (DN + DV) + d0) * R, d1 - d0,\n"
    "                           (long long)R * (long long)sizeof(TW), PF_CAP);\n";
static const char VABSORB_PREFETCH[] =
    "        const long long v0 = (long long)blockIdx.y * NW * RPW, nv = DV - v0 < NW * RPW ? DV - v0 : NW * RPW;\n"
    "        moec_prefetch_rows(kv_b + ((long long)blockIdx.x * (DN + DV) + DN + v0) * R, nv,\n"
    "                           (long long)R * (long long)sizeof(TW), PF_CAP);\n";

/* The generated form of op for bucket c->T (see the top of the file). */
static moec_status emit_kernel(cg_ctx *c, const ir_op *op, int q, int64_t H, int64_t dn,
                               int64_t dv, int64_t r, ir_dtype da, ir_dtype db, ir_dtype dc)
{
    const ir_value *x = op->in[0], *kv_b = op->in[1], *y = op->out[0];
    int vw = cg_vec_width(r);
    if (q && vw > ABS_Q_VW)
        vw = ABS_Q_VW;
    char name[256];
    snprintf(name, sizeof name, "mla_%sabsorb_h%lld_dn%lld_dv%lld_r%lld_t%d_%s_%s_%s", q ? "q" : "v",
             (long long)H, (long long)dn, (long long)dv, (long long)r, c->T, ir_dtype_name(dc),
             ir_dtype_name(db), ir_dtype_name(da));
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    int nw = q ? ABS_Q_WARPS : ABS_V_WARPS;
    if (is_new) {
        moec_buf_printf(&c->src,
                        "// %s (codegen/mla_absorb.c), first for %%%s\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s "
                        "*__restrict__ x, const %s *__restrict__ kv_b, %s *__restrict__ y)\n{\n"
                        "    typedef %s TW;\n"
                        "    constexpr int T = %d, H = %lld, DN = %lld, DV = %lld, R = %lld, VW = %d, "
                        "NW = %d, RPW = %d;\n",
                        ir_op_name(op->kind), y->name, nw * 32, name, cg_ctype(db), cg_ctype(da),
                        cg_ctype(dc), cg_ctype(da), c->T, (long long)H, (long long)dn,
                        (long long)dv, (long long)r, vw, nw, ABS_V_RPW);
        cg_emit_prefetch(&c->src, cg_prefetch_bytes(c), q ? QABSORB_PREFETCH : VABSORB_PREFETCH);
        moec_buf_printf(&c->src, "%s}\n\n", q ? QABSORB_BODY : VABSORB_BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    s->kernel = k;
    s->grid[0] = (unsigned)H;
    s->grid[1] = q ? (unsigned)((r + 32 * vw - 1) / (32 * vw))
                   : (unsigned)((dv + nw * ABS_V_RPW - 1) / (nw * ABS_V_RPW));
    s->block[0] = (unsigned)(nw * 32);
    s->n_args = 3;
    s->args[0] = cg_arg_act(x);
    s->args[1] = cg_arg_act(kv_b);
    s->args[2] = cg_arg_act(y);
    return MOEC_OK;
}

moec_status cg_emit_mla_absorb(cg_ctx *c, const ir_op *op)
{
    int q = op->kind == IR_OP_MLA_QABSORB;
    const ir_value *x = op->in[0], *kv_b = op->in[1], *y = op->out[0];
    int64_t dn = ir_op_attr_int(op, "qk_nope_head_dim", -1),
            dv = ir_op_attr_int(op, "v_head_dim", -1);
    if (x->type.rank != 3 || kv_b->type.rank != 2 || y->type.rank != 3 || dn < 1 || dv < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: wants x [T, H, d], kv_b [H*(dn+dv), r] and the head dims",
                        ir_op_name(op->kind), y->name);
    int64_t H = x->type.dims[1], r = kv_b->type.dims[1];
    if (kv_b->type.dims[0] != H * (dn + dv) || x->type.dims[2] != (q ? dn : r) ||
        y->type.dims[1] != H || y->type.dims[2] != (q ? r : dv))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s %%%s: shapes do not agree with kv_b %%%s [%lld, %lld] for %lld heads "
                        "of dn %lld, dv %lld",
                        ir_op_name(op->kind), y->name, kv_b->name, (long long)kv_b->type.dims[0],
                        (long long)r, (long long)H, (long long)dn, (long long)dv);
    ir_dtype da = cg_storage(c, kv_b), db = cg_storage(c, x), dc = cg_storage(c, y);
    if (da != db || da == IR_DTYPE_I32 || dc == IR_DTYPE_I32)
        return MOEC_ERR(
            MOEC_ERR_UNSUPPORTED,
            "%s %%%s: kv_b %%%s is stored %s but %%%s %s; cuBLASLt wants one input type",
            ir_op_name(op->kind), y->name, kv_b->name, ir_dtype_name(da), x->name,
            ir_dtype_name(db));
    /* the kernel's shared memory: the tokens' rows of x, and qabsorb's
       partial sums */
    size_t smem = (size_t)c->T * (size_t)(q ? dn : r) * 4 + (q ? ABS_Q_WARPS * 32 * 8 * 4 : 0);
    if (c->T <= cg_env_int("MOEC_ABSORB_MAX_T", ABSORB_MAX_T, 0, 8) && da != IR_DTYPE_F8E4M3 &&
        smem <= 48 * 1024)
        return emit_kernel(c, op, q, H, dn, dv, r, da, db, dc);
    if (H * (dn + dv) * r > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s %%%s: kv_b is too large", ir_op_name(op->kind),
                        y->name);
    ir_step *s = cg_step(c, IR_STEP_GEMM, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    ir_gemm *g = &s->gemm;
    g->n = c->T;
    g->batch = (int)H;
    g->lda = r;
    g->stride_a = (dn + dv) * r;
    g->type_a = da;
    g->type_b = db;
    g->type_c = dc;
    g->alpha = 1.0f;
    g->a = cg_arg_act(kv_b);
    g->b = cg_arg_act(x);
    g->c = cg_arg_act(y);
    if (q) {
        g->trans_a = 0;
        g->m = (int)r;
        g->k = (int)dn;
        g->ldb = H * dn;
        g->stride_b = dn;
        g->ldc = H * r;
        g->stride_c = r;
    } else {
        g->trans_a = 1;
        g->m = (int)dv;
        g->k = (int)r;
        g->ldb = H * r;
        g->stride_b = r;
        g->ldc = H * dv;
        g->stride_c = dv;
        g->a.i = dn * r * (int64_t)ir_dtype_size(da);
    }
    return MOEC_OK;
}
