/* eltwise.c — the elementwise ops: add (a + alpha * b) and mul with b
 * broadcast where its dim is 1, silu, sigmoid, and the fused silu_mul
 * (silu of the first half of the last dim times the second half). fp32
 * math with the interpreter's formulas (expf, not the fast intrinsic);
 * each thread handles up to 8 consecutive elements of the result (16-byte
 * accesses in bf16).
 *
 * Kernels, grid ceil(units / 256), block 256:
 *   add_n<per token>_t<T>_<dtypes>(a, b, y, float alpha)   same shapes
 *   add_<a dims>_b<b dims>_t<T>_<dtypes>(a, b, y, float alpha)   broadcast
 *   mul_... (a, b, y)                                        likewise, no alpha
 *   silu_n<per token>_t<T>_<dtypes>(x, y), sigmoid_n..._(x, y)
 *   silu_mul_r<rows per token>_i<I>_t<T>_<dtypes>(x, y) */
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

static moec_status oom(const ir_op *op)
{
    return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), op->out[0]->name);
}

static ir_step *kernel_step(cg_ctx *c, const ir_op *op, int k, int64_t units)
{
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return NULL;
    s->kernel = k;
    s->block[0] = 256;
    s->grid[0] = (unsigned)((units + 255) / 256);
    return s;
}

static void kernel_head(cg_ctx *c, const ir_op *op, const char *name, const char *params,
                        int64_t units)
{
    moec_buf_printf(&c->src,
                  "// %s (codegen/eltwise.c), first for %%%s\n"
                  "extern \"C\" __global__ void __launch_bounds__(256)\n"
                  "%s(%s)\n"
                  "{\n"
                  "    const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                  "    if (i >= %lld)\n"
                  "        return;\n",
                  ir_op_name(op->kind), op->out[0]->name, name, params, (long long)units);
}

static int is_float(ir_dtype dt) { return dt != IR_DTYPE_I32; }

static moec_status emit_binary(cg_ctx *c, const ir_op *op, const char *sig)
{
    const ir_value *a = op->in[0], *b = op->in[1], *y = op->out[0];
    int add = op->kind == IR_OP_ADD;
    int r = a->type.rank;
    double alpha = add ? num_attr(op, "alpha", 1.0) : 1.0;
    if (r > 4 || b->type.rank != r || ir_type_numel(&y->type, 1) != ir_type_numel(&a->type, 1))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: %%%s and %%%s differ in rank",
                        ir_op_name(op->kind), y->name, a->name, b->name);
    if (!isfinite(alpha))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "add %%%s: alpha %g is not finite", y->name, alpha);
    int64_t da[4] = {1, 1, 1, 1}, db[4] = {1, 1, 1, 1}, st[4], bs = 1;
    int bcast = 0;
    for (int i = 0; i < r; i++) {
        da[4 - r + i] = a->type.dims[i] == IR_DIM_T ? c->T : a->type.dims[i];
        db[4 - r + i] = b->type.dims[i] == IR_DIM_T ? c->T : b->type.dims[i];
    }
    for (int i = 3; i >= 0; i--) {
        if (db[i] != da[i] && db[i] != 1)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: %%%s does not broadcast to %%%s",
                            ir_op_name(op->kind), y->name, b->name, a->name);
        st[i] = db[i] == 1 && da[i] != 1 ? 0 : bs;
        bcast |= st[i] == 0;
        bs *= db[i];
    }
    int64_t total = da[0] * da[1] * da[2] * da[3];
    if (total >= INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s %%%s: too many elements", ir_op_name(op->kind),
                        y->name);
    int vec = cg_vec_width(bcast ? da[3] : ir_type_numel(&a->type, 1));
    char name[256];
    int n = snprintf(name, sizeof name, "%s", ir_op_name(op->kind));
    if (!bcast)
        n += snprintf(name + n, sizeof name - (size_t)n, "_n%lld",
                      (long long)ir_type_numel(&a->type, 1));
    else
        for (int pass = 0; pass < 2; pass++) {
            const ir_value *v = pass ? b : a;
            for (int i = 0; i < r && n > 0 && (size_t)n < sizeof name; i++) {
                const char *sep = i == 0 ? (pass ? "_b" : "_") : "x";
                if (v->type.dims[i] == IR_DIM_T)
                    n += snprintf(name + n, sizeof name - (size_t)n, "%sT", sep);
                else
                    n += snprintf(name + n, sizeof name - (size_t)n, "%s%lld", sep,
                                  (long long)v->type.dims[i]);
            }
        }
    if (n > 0 && (size_t)n < sizeof name)
        snprintf(name + n, sizeof name - (size_t)n, "_t%d_%s", c->T, sig);
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return oom(op);
    ir_dtype ta = cg_storage(c, a), tb = cg_storage(c, b), ty = cg_storage(c, y);
    if (!is_float(ta) || !is_float(tb) || !is_float(ty))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: integer operands", ir_op_name(op->kind),
                        y->name);
    int64_t units = total / vec;
    if (is_new) {
        char params[256];
        snprintf(params, sizeof params,
                 "const %s *__restrict__ a, const %s *__restrict__ b, %s *__restrict__ y%s",
                 cg_ctype(ta), cg_ctype(tb), cg_ctype(ty), add ? ", float alpha" : "");
        kernel_head(c, op, name, params, units);
        moec_buf *s = &c->src;
        moec_buf_printf(s,
                      "    const int o = i * %d;\n"
                      "    float va[%d], vb[%d];\n"
                      "    ldv<%d>(a + o, va);\n",
                      vec, vec, vec, vec);
        if (!bcast)
            moec_buf_printf(s, "    ldv<%d>(b + o, vb);\n", vec);
        else {
            moec_buf_printf(s,
                          "    const int e = o %% %lld, r = o / %lld;\n"
                          "    const int c = r %% %lld, r2 = r / %lld;\n"
                          "    const int d1 = r2 %% %lld, d0 = r2 / %lld;\n"
                          "    const int bi = d0 * %lld + d1 * %lld + c * %lld + e * %lld;\n",
                          (long long)da[3], (long long)da[3], (long long)da[2], (long long)da[2],
                          (long long)da[1], (long long)da[1], (long long)st[0], (long long)st[1],
                          (long long)st[2], (long long)st[3]);
            if (st[3] == 0)
                moec_buf_printf(s,
                              "    const float sb = ld(b + bi);\n"
                              "#pragma unroll\n"
                              "    for (int j = 0; j < %d; j++)\n"
                              "        vb[j] = sb;\n",
                              vec);
            else
                moec_buf_printf(s, "    ldv<%d>(b + bi, vb);\n", vec);
        }
        moec_buf_printf(s,
                      "#pragma unroll\n"
                      "    for (int j = 0; j < %d; j++)\n"
                      "        va[j] = %s;\n"
                      "    stv<%d>(y + o, va);\n"
                      "}\n\n",
                      vec, add ? "va[j] + alpha * vb[j]" : "va[j] * vb[j]", vec);
    }
    ir_step *s = kernel_step(c, op, k, units);
    if (!s)
        return oom(op);
    s->n_args = add ? 4 : 3;
    s->args[0] = cg_arg_act(a);
    s->args[1] = cg_arg_act(b);
    s->args[2] = cg_arg_act(y);
    if (add)
        s->args[3] = cg_arg_f32(alpha);
    return MOEC_OK;
}

/* The kernel `name` of a unary op's x (stored tx) into y (stored ty) over
 * `units` threads: its index, its head written when new (*is_new; the
 * caller writes the body), -1 when out of memory. */
static int unary_kernel(cg_ctx *c, const ir_op *op, const char *name, ir_dtype tx, ir_dtype ty,
                        int64_t units, int *is_new)
{
    int k = cg_kernel(c, name, is_new);
    if (k >= 0 && *is_new) {
        char params[128];
        snprintf(params, sizeof params, "const %s *__restrict__ x, %s *__restrict__ y",
                 cg_ctype(tx), cg_ctype(ty));
        kernel_head(c, op, name, params, units);
    }
    return k;
}

/* The step of kernel k over `units` threads: x into dst. */
static moec_status unary_step(cg_ctx *c, const ir_op *op, int k, int64_t units,
                              const ir_value *x, ir_arg dst)
{
    ir_step *s = k >= 0 ? kernel_step(c, op, k, units) : NULL;
    if (!s)
        return oom(op);
    s->n_args = 2;
    s->args[0] = cg_arg_act(x);
    s->args[1] = dst;
    return MOEC_OK;
}

/* silu(x[..., :I]) * x[..., I:] of x (rows of 2I per token, stored tx)
 * into dst (rows of I, stored ty): the silu_mul op's kernel, and the one a
 * linear with act silu_mul runs ahead of its GEMM (codegen/linear.c). */
moec_status cg_emit_silu_mul(cg_ctx *c, const ir_op *op, const ir_value *x, int64_t half,
                             ir_dtype ty, ir_arg dst)
{
    ir_dtype tx = cg_storage(c, x);
    int64_t nx = ir_type_numel(&x->type, 1), ny = nx / 2;
    if (ny * c->T >= INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s %%%s: too many elements", ir_op_name(op->kind),
                        op->out[0]->name);
    int vec = cg_vec_width(half);
    int64_t units = ny * c->T / vec;
    char name[256];
    /* the dtypes as cg_dtype_signature writes them: y's, then x's if other */
    snprintf(name, sizeof name, "silu_mul_r%lld_i%lld_t%d_%s%s%s", (long long)(ny / half),
             (long long)half, c->T, ir_dtype_name(ty), ty != tx ? "_" : "",
             ty != tx ? ir_dtype_name(tx) : "");
    int is_new = 0;
    int k = unary_kernel(c, op, name, tx, ty, units, &is_new);
    if (k >= 0 && is_new)
        moec_buf_printf(&c->src,
                      "    const int row = i / %lld, j = (i - row * %lld) * %d;\n"
                      "    float g[%d], u[%d];\n"
                      "    ldv<%d>(x + (long long)row * %lld + j, g);\n"
                      "    ldv<%d>(x + (long long)row * %lld + %lld + j, u);\n"
                      "#pragma unroll\n"
                      "    for (int q = 0; q < %d; q++)\n"
                      "        g[q] = g[q] / (1.0f + expf(-g[q])) * u[q];\n"
                      "    stv<%d>(y + (long long)row * %lld + j, g);\n"
                      "}\n\n",
                      (long long)(half / vec), (long long)(half / vec), vec, vec, vec, vec,
                      (long long)(2 * half), vec, (long long)(2 * half), (long long)half, vec,
                      vec, (long long)half);
    return unary_step(c, op, k, units, x, dst);
}

static moec_status emit_unary(cg_ctx *c, const ir_op *op, const char *sig)
{
    const ir_value *x = op->in[0], *y = op->out[0];
    int silu_mul = op->kind == IR_OP_SILU_MUL;
    int64_t nx = ir_type_numel(&x->type, 1), ny = ir_type_numel(&y->type, 1);
    int r = x->type.rank;
    int64_t half = silu_mul ? x->type.dims[r - 1] / 2 : 0;
    if (silu_mul ? (r < 2 || x->type.dims[r - 1] % 2 || y->type.dims[r - 1] != half || nx != 2 * ny)
                 : nx != ny)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: result does not fit %%%s",
                        ir_op_name(op->kind), y->name, x->name);
    ir_dtype tx = cg_storage(c, x), ty = cg_storage(c, y);
    if (!is_float(tx) || !is_float(ty))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: integer operands", ir_op_name(op->kind),
                        y->name);
    if (silu_mul)
        return cg_emit_silu_mul(c, op, x, half, ty, cg_arg_act(y));
    if (ny * c->T >= INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s %%%s: too many elements", ir_op_name(op->kind),
                        y->name);
    int vec = cg_vec_width(nx);
    int64_t units = ny * c->T / vec;
    char name[256];
    snprintf(name, sizeof name, "%s_n%lld_t%d_%s", ir_op_name(op->kind), (long long)nx, c->T, sig);
    int is_new = 0;
    int k = unary_kernel(c, op, name, tx, ty, units, &is_new);
    if (k >= 0 && is_new)
        moec_buf_printf(&c->src,
                      "    float v[%d];\n"
                      "    ldv<%d>(x + i * %d, v);\n"
                      "#pragma unroll\n"
                      "    for (int q = 0; q < %d; q++)\n"
                      "        v[q] = %s;\n"
                      "    stv<%d>(y + i * %d, v);\n"
                      "}\n\n",
                      vec, vec, vec, vec,
                      op->kind == IR_OP_SILU ? "v[q] / (1.0f + expf(-v[q]))"
                                             : "1.0f / (1.0f + expf(-v[q]))",
                      vec, vec);
    return unary_step(c, op, k, units, x, cg_arg_act(y));
}

moec_status cg_emit_eltwise(cg_ctx *c, const ir_op *op)
{
    char sig[64];
    cg_dtype_signature(c, op, sig, sizeof sig);
    switch (op->kind) {
    case IR_OP_ADD:
    case IR_OP_MUL: return emit_binary(c, op, sig);
    case IR_OP_SILU:
    case IR_OP_SIGMOID:
    case IR_OP_SILU_MUL: return emit_unary(c, op, sig);
    default:
        return MOEC_ERR(MOEC_ERR_INTERNAL, "cg_emit_eltwise: %s %%%s is not elementwise",
                        ir_op_name(op->kind), op->out[0]->name);
    }
}
