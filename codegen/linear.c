/* linear.c — a dense linear y[T, N] = alpha * x[T, K] w[N, K]^T (+ b).
 *
 * Buckets of up to GEMV_MAX_T tokens get a generated kernel: the step
 * streams the weight once, and for a handful of rows cuBLASLt's GEMM
 * kernels read it well below the copy bandwidth (H100, 2026-11-22: the 135
 * decode GEMMs of a DeepSeek-V2-Lite step at batch 1 took 1.7 ms for 1.6
 * GB; at 8 rows cuBLASLt stays ahead). A block owns a few weight rows, its
 * warps split K with 16-byte loads, fp32 accumulation; the epilogue
 * applies alpha and the bias.
 *
 * Larger buckets are one cuBLASLt step. cuBLASLt is column-major: row-major
 * y is C (m = N, n = T, ldc = N); row-major w [N, K] is a K x N column-major
 * matrix, transposed (lda = K); row-major x [T, K] is K x T (ldb = K).
 * MOEC_GEMV_MAX_T (0 to 16) moves the boundary, for comparisons. */
#include <math.h>
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

/* A numeric attribute whether written as an int or a float. */
static double num_attr(const ir_op *op, const char *key, double dflt)
{
    const ir_attr *a = ir_op_attr(op, key);
    if (a && a->kind == IR_ATTR_FLOAT)
        return a->f;
    return a && a->kind == IR_ATTR_INT ? (double)a->i : dflt;
}

#define GEMV_MAX_T 4
#define GEMV_WARPS 8

/* Each block owns RB weight rows; its NW warps split K (warp w takes the
 * 32 * VE wide chunks w, w + NW, ...), each lane's 16-byte loads of the RB
 * rows in flight together; the warps' partial sums meet in shared memory.
 * RB follows N so that even the router's 64 rows make 64 blocks. */
static const char GEMV_BODY[] =
    "    constexpr int KSTEP = 32 * VE, NSTEP = (K + KSTEP - 1) / KSTEP;\n"
    "    __shared__ float part[NW][RB * T];\n"
    "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
    "    const long long n0 = (long long)blockIdx.x * RB;\n"
    "    float acc[RB][T];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RB; r++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++)\n"
    "            acc[r][t] = 0.0f;\n"
    "    const TW *wr = w + n0 * K;\n"
    "#pragma unroll 2\n"
    "    for (int s = warp; s < NSTEP; s += NW) {\n"
    "        const int k = s * KSTEP + lane * VE;\n"
    "        if (K % KSTEP != 0 && k >= K)\n"
    "            break;\n"
    "        float wv[RB][VE];\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < RB; r++)\n"
    "            if (N % RB == 0 || n0 + r < N)\n"
    "                ldv<VE>(wr + (long long)r * K + k, wv[r]);\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++) {\n"
    "            float xv[VE];\n"
    "            ldv<VE>(x + (long long)t * K + k, xv);\n"
    "#pragma unroll\n"
    "            for (int r = 0; r < RB; r++)\n"
    "                if (N % RB == 0 || n0 + r < N)\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < VE; j++)\n"
    "                        acc[r][t] += wv[r][j] * xv[j];\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RB; r++)\n"
    "#pragma unroll\n"
    "        for (int t = 0; t < T; t++) {\n"
    "            const float v = warp_sum(acc[r][t]);\n"
    "            if (lane == 0)\n"
    "                part[warp][r * T + t] = v;\n"
    "        }\n"
    "    __syncthreads();\n"
    "    for (int i = threadIdx.x; i < RB * T; i += NW * 32) {\n"
    "        const int r = i / T, t = i % T;\n"
    "        if (N % RB != 0 && n0 + r >= N)\n"
    "            continue;\n"
    "        float v = 0.0f;\n"
    "#pragma unroll\n"
    "        for (int q = 0; q < NW; q++)\n"
    "            v += part[q][i];\n"
    "        v *= alpha;\n"
    "        if constexpr (HAS_BIAS)\n"
    "            v += ld(bias + n0 + r);\n"
    "        st(y + (long long)t * N + n0 + r, v);\n"
    "    }\n";

/* Rows per block: enough blocks to fill the GPU twice over (264 on an
 * H100's 132 SMs), at most 8 rows. */
static int gemv_rows_per_block(int64_t N)
{
    int rb = 1;
    while (rb < 8 && N / (2 * rb) >= 264)
        rb *= 2;
    return rb;
}

/* y = alpha x w^T (+ bias) by the generated kernel (dtypes checked). */
static moec_status emit_gemv(cg_ctx *c, const ir_op *op, int64_t N, int64_t K, double alpha)
{
    const ir_value *x = op->in[0], *w = op->in[1], *y = op->out[0];
    const ir_value *bias = op->n_in > 2 ? op->in[2] : NULL;
    ir_dtype dw = cg_storage(c, w), dx = cg_storage(c, x), dy = cg_storage(c, y);
    ir_dtype db = bias ? cg_storage(c, bias) : IR_DTYPE_F32;
    int ve = cg_vec_width(K), rb = gemv_rows_per_block(N);
    char name[200];
    snprintf(name, sizeof name, "linear_gemv_n%lld_k%lld_rb%d_t%d_%s_%s_%s%s%s", (long long)N,
             (long long)K, rb, c->T, ir_dtype_name(dw), ir_dtype_name(dx), ir_dtype_name(dy),
             bias ? "_b" : "", bias ? ir_dtype_name(db) : "");
    int is_new = 0;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    if (is_new)
        moec_buf_printf(&c->src,
                      "// linear: y = alpha x w^T (+ b) for a few rows (codegen/linear.c, "
                      "emit_gemv)\n"
                      "extern \"C\" __global__ void __launch_bounds__(%d) %s(const %s *__restrict__ x, "
                      "const %s *__restrict__ w, const %s *__restrict__ bias, float alpha, "
                      "%s *__restrict__ y)\n{\n"
                      "    typedef %s TW;\n"
                      "    constexpr long long N = %lldLL;\n"
                      "    constexpr int K = %lld, T = %d, VE = %d, RB = %d, NW = %d;\n"
                      "    constexpr bool HAS_BIAS = %s;\n%s}\n\n",
                      GEMV_WARPS * 32, name, cg_ctype(dx), cg_ctype(dw), cg_ctype(db),
                      cg_ctype(dy), cg_ctype(dw), (long long)N, (long long)K, c->T, ve, rb,
                      GEMV_WARPS, bias ? "true" : "false", GEMV_BODY);
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    s->kernel = k;
    s->grid[0] = (unsigned)((N + rb - 1) / rb);
    s->block[0] = GEMV_WARPS * 32;
    s->n_args = 5;
    s->args[0] = cg_arg_act(x);
    s->args[1] = cg_arg_act(w);
    s->args[2] = bias ? cg_arg_act(bias) : cg_arg_act(w); /* unread without a bias */
    s->args[3] = cg_arg_f32(alpha);
    s->args[4] = cg_arg_act(y);
    return MOEC_OK;
}

moec_status cg_emit_linear(cg_ctx *c, const ir_op *op)
{
    const ir_value *x = op->in[0], *w = op->in[1], *y = op->out[0];
    const ir_value *bias = op->n_in > 2 ? op->in[2] : NULL;
    if (x->type.rank != 2 || w->type.rank != 2 || w->type.dims[0] == IR_DIM_T ||
        x->type.dims[1] != w->type.dims[1] || y->type.rank != 2 ||
        y->type.dims[1] != w->type.dims[0] ||
        (bias && ir_type_numel(&bias->type, 1) != w->type.dims[0]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "linear %%%s: wants x [T, K], w [N, K], b [N] and a result [T, N]",
                        y->name);
    int64_t N = w->type.dims[0], K = w->type.dims[1];
    double alpha = num_attr(op, "alpha", 1.0);
    if (!isfinite(alpha))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "linear %%%s: alpha %g is not finite", y->name,
                        alpha);
    if (bias && alpha != 1.0)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "linear %%%s: alpha %g with a bias (%%%s): the GEMM step adds its bias "
                        "after alpha, the IR before",
                        y->name, alpha, bias->name);
    if (N > INT32_MAX || K > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "linear %%%s: %lld x %lld is too large for one GEMM",
                        y->name, (long long)N, (long long)K);
    ir_dtype da = cg_storage(c, w), db = cg_storage(c, x), dc = cg_storage(c, y);
    if (da != db)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "linear %%%s: weight %%%s is stored %s but its input %%%s %s; "
                        "cuBLASLt wants one input type",
                        y->name, w->name, ir_dtype_name(da), x->name, ir_dtype_name(db));
    if (da == IR_DTYPE_I32 || dc == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "linear %%%s: integer operands", y->name);
    if (c->T <= cg_env_int("MOEC_GEMV_MAX_T", GEMV_MAX_T, 0, 16) && (!bias || cg_storage(c, bias) != IR_DTYPE_I32))
        return emit_gemv(c, op, N, K, alpha);
    ir_step *s = cg_step(c, IR_STEP_GEMM, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    ir_gemm *g = &s->gemm;
    g->trans_a = 1;
    g->trans_b = 0;
    g->m = (int)N;
    g->n = c->T;
    g->k = (int)K;
    g->batch = 1;
    g->lda = K;
    g->ldb = K;
    g->ldc = N;
    g->type_a = da;
    g->type_b = db;
    g->type_c = dc;
    g->alpha = (float)alpha;
    g->a = cg_arg_act(w);
    g->b = cg_arg_act(x);
    g->c = cg_arg_act(y);
    if (bias) {
        ir_dtype dbias = cg_storage(c, bias);
        if (dbias != IR_DTYPE_F32 && dbias != dc)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "linear %%%s: bias %%%s is stored %s; the GEMM wants f32 or %s",
                            y->name, bias->name, ir_dtype_name(dbias), ir_dtype_name(dc));
        g->has_bias = 1;
        g->bias = cg_arg_act(bias);
        g->type_bias = dbias;
    }
    return MOEC_OK;
}
