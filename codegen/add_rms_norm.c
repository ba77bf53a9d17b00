/* add_rms_norm.c — the residual add fused with the RMSNorm after it:
 * sum = a + alpha * b, y = sum / sqrt(mean(sum^2) + eps) * w, per token row.
 * One kernel reads the residual and the branch output once and writes both
 * the new residual and its normalized form, where add then rms_norm would
 * write the sum and read it back. The norm is taken of the sum as stored
 * (rounded to its storage dtype), so the result is what the unfused pair
 * computes; fp32 math with the same formulas as eltwise.c and rms_norm.c.
 * With a second addend c (the shared experts' output beside the routed
 * ones': fuse_add3_rms_norm) sum = a + alpha * (b + c), b + c in fp32.
 * A b of [T, K, D] (the unsummed routed experts' K weighted outputs,
 * fuse_moe_sum) is summed over K first, as moe_routed sums (double, k
 * order) and rounded to the compute dtype as its summed result was stored:
 * the moe_sum launch it replaces computed the same.
 *
 * Short rows take one warp each, four rows to a block; long rows (the
 * hidden size of real models) one block each. Each thread keeps its share
 * of the row in registers between the sum and the scaling unless that share
 * is large, and then reads back the sum it wrote itself.
 *
 * Kernel add_rms_norm[3][_sum<K>_<dtype>]_d<D>_t<T>_<dtypes>(const A *a, const B *b, const W
 * *w, [const C *c,] S *sum, Y *y, float alpha, float eps). Warp form: grid
 * ceil(T / 4), block 128; block form: grid T, block up to 1024 (a multiple
 * of 32). */
#include <math.h>
#include <stdio.h>

#include "codegen/cg.h"
#include "codegen/norm_rows.h"
#include "err.h"

/* Blocks a row in the cluster form (codegen/norm_rows.h) in buckets of up
 * to NORM_CL_MAX_T tokens: NORM_CL_SUM where the routed sum reads K fp32
 * rows, NORM_CL for the other sums (MOEC_NORM_CL_SUM, MOEC_NORM_CL and
 * MOEC_NORM_CL_MAX_T at codegen; 1 keeps one block a row). H200,
 * 2026-11-29: Qwen3-30B's routed-sum norm at one token added 3.0 us to
 * the step in the cluster against 4.2 in one block (timelines), the whole
 * step 2.959 against 2.986 ms; V2-Lite level to 0.1% at 1, 8 and 64
 * tokens; clustering the other norms too (NORM_CL 8) level. */
#define NORM_CL_SUM 8
#define NORM_CL 1
#define NORM_CL_MAX_T 64

/* "bf16" when every operand and result is stored alike, else the dtypes of
 * sum, normed, a, b, w (and c) in that order. */
static void dtype_sig(const cg_ctx *c, const ir_op *op, char *buf, size_t cap)
{
    ir_dtype d[6] = {cg_storage(c, op->out[0]), cg_storage(c, op->out[1]),
                     cg_storage(c, op->in[0]),  cg_storage(c, op->in[1]),
                     cg_storage(c, op->in[2]),  cg_storage(c, op->in[op->n_in - 1])};
    int nd = op->n_in == 4 ? 6 : 5, same = 1;
    for (int i = 1; i < nd; i++)
        same &= d[i] == d[0];
    int n = snprintf(buf, cap, "%s", ir_dtype_name(d[0]));
    for (int i = 1; !same && i < nd && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "_%s", ir_dtype_name(d[i]));
}

/* A numeric attribute whether written as an int or a float. */
static int num_attr(const ir_op *op, const char *key, double *out)
{
    const ir_attr *a = ir_op_attr(op, key);
    if (a && a->kind == IR_ATTR_FLOAT)
        *out = a->f;
    else if (a && a->kind == IR_ATTR_INT)
        *out = (double)a->i;
    else
        return 0;
    return 1;
}

moec_status cg_emit_add_rms_norm(cg_ctx *c, const ir_op *op)
{
    const ir_value *a = op->in[0], *b = op->in[1], *w = op->in[2];
    const ir_value *b2 = op->n_in == 4 ? op->in[3] : NULL;
    const ir_value *s = op->out[0], *y = op->out[1];
    double eps, alpha = 1.0;
    int64_t D = a->type.rank == 2 ? a->type.dims[1] : 0;
    int64_t kb = b->type.rank == 3 ? b->type.dims[1] : 1;
    if (a->type.rank != 2 || (b->type.rank != 2 && b->type.rank != 3) ||
        b->type.dims[b->type.rank - 1] != D ||
        (b2 && (b2->type.rank != 2 || b2->type.dims[1] != D)) ||
        ir_type_numel(&w->type, 1) != D || ir_type_numel(&s->type, 1) != D ||
        ir_type_numel(&y->type, 1) != D || !num_attr(op, "eps", &eps))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "add_rms_norm %%%s: wants a [T, D], b [T, D] or [T, K, D], w [D] and an "
                        "eps attribute",
                        s->name);
    if (ir_op_attr(op, "alpha") && !num_attr(op, "alpha", &alpha))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "add_rms_norm %%%s: alpha must be a number",
                        s->name);
    if (!isfinite(alpha) || !isfinite(eps))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "add_rms_norm %%%s: alpha %g and eps %g must be finite",
                        s->name, alpha, eps);
    ir_dtype da = cg_storage(c, a), db = cg_storage(c, b), dw = cg_storage(c, w);
    ir_dtype ds = cg_storage(c, s), dy = cg_storage(c, y), dc = b2 ? cg_storage(c, b2) : db;
    if (da == IR_DTYPE_I32 || db == IR_DTYPE_I32 || dw == IR_DTYPE_I32 || ds == IR_DTYPE_I32 ||
        dy == IR_DTYPE_I32 || dc == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "add_rms_norm %%%s: integer operands", s->name);
    /* the routed sum over K is rounded to the compute dtype's storage */
    ir_dtype dsum = c->opt->compute_dtype;
    if (b->type.rank == 3 && db != IR_DTYPE_F32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "add_rms_norm %%%s: b %%%s of [T, K, D] is stored %s, not f32", s->name,
                        b->name, ir_dtype_name(db));
    int rows = c->T;
    cg_norm_rows l = cg_norm_rows_of(D);
    /* (thread block clusters: sm_90) */
    if (cg_arch_num(c->opt) >= 90 &&
        rows <= cg_env_int("MOEC_NORM_CL_MAX_T", NORM_CL_MAX_T, 0, 1 << 20))
        cg_norm_rows_cluster(&l, b->type.rank == 3
                                     ? cg_env_int("MOEC_NORM_CL_SUM", NORM_CL_SUM, 1, 8)
                                     : cg_env_int("MOEC_NORM_CL", NORM_CL, 1, 8));
    int vec = l.vec;
    char sig[64], name[256], sumk[32] = "", clt[16] = "", attrs[40];
    dtype_sig(c, op, sig, sizeof sig);
    if (b->type.rank == 3)
        snprintf(sumk, sizeof sumk, "_sum%lld_%s", (long long)kb, ir_dtype_name(dsum));
    if (l.cl > 1)
        snprintf(clt, sizeof clt, "_cl%d", l.cl);
    cg_norm_rows_attrs(attrs, sizeof attrs, &l);
    snprintf(name, sizeof name, "add%s_rms_norm%s_d%lld%s_t%d_%s", b2 ? "3" : "", sumk,
             (long long)D, clt, c->T, sig);
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "add_rms_norm %%%s: out of memory", s->name);
    if (is_new) {
        moec_buf *src = &c->src;
        char cparam[64] = "";
        if (b2)
            snprintf(cparam, sizeof cparam, " const %s *__restrict__ c2,", cg_ctype(dc));
        moec_buf_printf(src,
                      "// add_rms_norm (codegen/add_rms_norm.c), first for %%%s, %%%s\n"
                      "extern \"C\" __global__ void %s__launch_bounds__(%d)\n"
                      "%s(const %s *__restrict__ a, const %s *__restrict__ b,\n"
                      "    const %s *__restrict__ w,%s %s *__restrict__ sum, %s *__restrict__ y,\n"
                      "    float alpha, float eps)\n"
                      "{\n",
                      s->name, y->name, attrs, cg_norm_rows_threads(&l), name, cg_ctype(da),
                      cg_ctype(db), cg_ctype(dw), cparam, cg_ctype(ds), cg_ctype(dy));
        cg_norm_rows_prefetch(c, src, &l, D);
        cg_norm_rows_begin(src, &l, rows);
        moec_buf_printf(src,
                      "    const long long base = (long long)row * %lld;\n"
                      "    const %s *ar = a + base;\n"
                      "    const %s *br = b + base * %lld;\n"
                      "    %s *sr = sum + base;\n"
                      "    %s *yr = y + base;\n"
                      "    float ss = 0.0f;\n",
                      (long long)D, cg_ctype(da), cg_ctype(db), (long long)kb, cg_ctype(ds),
                      cg_ctype(dy));
        if (l.cache)
            moec_buf_printf(src, "    float v[%d][%d];\n", l.nch, vec);
        moec_buf_printf(src,
                      "#pragma unroll\n"
                      "    for (int i = 0; i < %d; i++) {\n"
                      "        const int c = lane + i * %d;\n"
                      "        if (c < %lld) {\n"
                      "            float t[%d], u[%d];\n"
                      "            ldv<%d>(ar + c * %d, t);\n",
                      l.nch, l.stride, (long long)l.chunks, vec, vec, vec, vec);
        if (b->type.rank == 2)
            moec_buf_printf(src, "            ldv<%d>(br + c * %d, u);\n", vec, vec);
        else {
            /* the routed sum: the K slots in k order, in double, as moe_routed sums */
            moec_buf_printf(src,
                          "            {\n"
                          "                double acc[%d];\n"
                          "#pragma unroll\n"
                          "                for (int j = 0; j < %d; j++)\n"
                          "                    acc[j] = 0.0;\n"
                          "#pragma unroll\n"
                          "                for (int k = 0; k < %lld; k++) {\n"
                          "                    float yk[%d];\n"
                          "                    ldv<%d>(br + k * %lldLL + c * %d, yk);\n"
                          "#pragma unroll\n"
                          "                    for (int j = 0; j < %d; j++)\n"
                          "                        acc[j] += (double)yk[j];\n"
                          "                }\n"
                          "#pragma unroll\n"
                          "                for (int j = 0; j < %d; j++) {\n"
                          "                    u[j] = (float)acc[j];\n",
                          vec, vec, (long long)kb, vec, vec, (long long)D, vec, vec, vec);
            if (dsum != IR_DTYPE_F32)
                moec_buf_printf(src,
                              "                    %s q;\n"
                              "                    st(&q, u[j]);\n"
                              "                    u[j] = ld(&q);\n",
                              cg_ctype(dsum));
            moec_buf_printf(src, "                }\n"
                                 "            }\n");
        }
        if (b2) /* b + c first, in fp32: add(b, c), then the residual add */
            moec_buf_printf(src,
                          "            {\n"
                          "                float u2[%d];\n"
                          "                ldv<%d>(c2 + base + c * %d, u2);\n"
                          "#pragma unroll\n"
                          "                for (int j = 0; j < %d; j++)\n"
                          "                    u[j] = u[j] + u2[j];\n"
                          "            }\n",
                          vec, vec, vec, vec);
        moec_buf_printf(src,
                      "#pragma unroll\n"
                      "            for (int j = 0; j < %d; j++)\n"
                      "                t[j] = t[j] + alpha * u[j];\n"
                      "            stv<%d>(sr + c * %d, t);\n"
                      "#pragma unroll\n"
                      "            for (int j = 0; j < %d; j++) {\n",
                      vec, vec, vec, vec);
        if (ds != IR_DTYPE_F32)
            moec_buf_printf(src,
                          "                %s q;\n"
                          "                st(&q, t[j]);\n"
                          "                t[j] = ld(&q);\n",
                          cg_ctype(ds));
        cg_norm_rows_finish(src, &l, D, "sr");
    }
    ir_step *st = cg_step(c, IR_STEP_KERNEL, op);
    if (!st)
        return MOEC_ERR(MOEC_ERR_OOM, "add_rms_norm %%%s: out of memory", s->name);
    st->kernel = k;
    cg_norm_rows_launch(st, &l, rows);
    int i = 0;
    st->args[i++] = cg_arg_act(a);
    st->args[i++] = cg_arg_act(b);
    st->args[i++] = cg_arg_act(w);
    if (b2)
        st->args[i++] = cg_arg_act(b2);
    st->args[i++] = cg_arg_act(s);
    st->args[i++] = cg_arg_act(y);
    st->args[i++] = cg_arg_f32(alpha);
    st->args[i++] = cg_arg_f32(eps);
    st->n_args = i;
    return MOEC_OK;
}
