/* rms_norm.c — RMSNorm over the last dim: y = x / sqrt(mean(x^2) + eps) * w,
 * in fp32 as the interpreter computes it. Short rows (per-head q/k norms,
 * the tiny models) take one warp each, four rows to a block; long rows
 * (the hidden size) one block each. Each thread keeps its share of the row
 * in registers between the sum and the scaling unless that share is large.
 *
 * Kernel rms_norm[_h<rows per token>]_d<D>_t<T>_<dtypes>(const X *x,
 * const W *w, Y *y, float eps). Warp form: grid ceil(rows / 4), block 128;
 * block form: grid rows, block up to 1024 (a multiple of 32). */
#include <stdio.h>

#include "codegen/cg.h"
#include "codegen/norm_rows.h"
#include "err.h"

/* "bf16", or the result's dtype then each float operand's when they differ. */
static void dtype_sig(const cg_ctx *c, const ir_op *op, char *buf, size_t cap)
{
    ir_dtype dy = cg_storage(c, op->out[0]);
    int same = 1;
    for (int i = 0; i < op->n_in; i++)
        same &= cg_storage(c, op->in[i]) == dy || cg_storage(c, op->in[i]) == IR_DTYPE_I32;
    int n = snprintf(buf, cap, "%s", ir_dtype_name(dy));
    for (int i = 0; !same && i < op->n_in && n > 0 && (size_t)n < cap; i++)
        if (cg_storage(c, op->in[i]) != IR_DTYPE_I32)
            n += snprintf(buf + n, cap - (size_t)n, "_%s", ir_dtype_name(cg_storage(c, op->in[i])));
}

moec_status cg_emit_rms_norm(cg_ctx *c, const ir_op *op)
{
    const ir_value *x = op->in[0], *w = op->in[1], *y = op->out[0];
    const ir_attr *eps = ir_op_attr(op, "eps");
    int r = x->type.rank;
    if (r < 2 || !eps || (eps->kind != IR_ATTR_FLOAT && eps->kind != IR_ATTR_INT) ||
        ir_type_numel(&w->type, 1) != x->type.dims[r - 1] ||
        ir_type_numel(&y->type, 1) != ir_type_numel(&x->type, 1))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rms_norm %%%s: wants x [T, ..., D], w [D] and an eps attribute", y->name);
    int64_t D = x->type.dims[r - 1];
    int64_t per_token = ir_type_numel(&x->type, 1) / D;
    int64_t rows = per_token * c->T;
    cg_norm_rows l = cg_norm_rows_of(D);
    int vec = l.vec;
    ir_dtype dx = cg_storage(c, x), dw = cg_storage(c, w), dy = cg_storage(c, y);
    char sig[64], name[256];
    dtype_sig(c, op, sig, sizeof sig);
    if (per_token == 1)
        snprintf(name, sizeof name, "rms_norm_d%lld_t%d_%s", (long long)D, c->T, sig);
    else
        snprintf(name, sizeof name, "rms_norm_h%lld_d%lld_t%d_%s", (long long)per_token,
                 (long long)D, c->T, sig);
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "rms_norm %%%s: out of memory", y->name);
    if (is_new) {
        moec_buf *b = &c->src;
        moec_buf_printf(
            b,
            "// rms_norm (codegen/rms_norm.c), first for %%%s\n"
            "extern \"C\" __global__ void __launch_bounds__(%d)\n"
            "%s(const %s *__restrict__ x, const %s *__restrict__ w, %s *__restrict__ y, float eps)\n"
            "{\n",
            y->name, cg_norm_rows_threads(&l), name, cg_ctype(dx), cg_ctype(dw), cg_ctype(dy));
        cg_norm_rows_prefetch(c, b, &l, D);
        cg_norm_rows_begin(b, &l, (long long)rows);
        moec_buf_printf(b,
                      "    const %s *xr = x + (long long)row * %lld;\n"
                      "    %s *yr = y + (long long)row * %lld;\n"
                      "    float ss = 0.0f;\n",
                      cg_ctype(dx), (long long)D, cg_ctype(dy), (long long)D);
        if (l.cache)
            moec_buf_printf(b, "    float v[%d][%d];\n", l.nch, vec);
        moec_buf_printf(b,
                      "#pragma unroll\n"
                      "    for (int i = 0; i < %d; i++) {\n"
                      "        const int c = lane + i * %d;\n"
                      "        if (c < %lld) {\n"
                      "            float t[%d];\n"
                      "            ldv<%d>(xr + c * %d, t);\n"
                      "#pragma unroll\n"
                      "            for (int j = 0; j < %d; j++) {\n",
                      l.nch, l.stride, (long long)l.chunks, vec, vec, vec, vec);
        cg_norm_rows_finish(b, &l, D, "xr");
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "rms_norm %%%s: out of memory", y->name);
    s->kernel = k;
    cg_norm_rows_launch(s, &l, rows);
    s->n_args = 4;
    s->args[0] = cg_arg_act(x);
    s->args[1] = cg_arg_act(w);
    s->args[2] = cg_arg_act(y);
    s->args[3] = cg_arg_f32(eps->kind == IR_ATTR_FLOAT ? eps->f : (double)eps->i);
    return MOEC_OK;
}
