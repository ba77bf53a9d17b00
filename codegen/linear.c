/* linear.c — a dense linear y[T, N] = alpha * x[T, K] w[N, K]^T (+ b) as one
 * cuBLASLt step, no generated kernel. cuBLASLt is column-major: row-major
 * y is C (m = N, n = T, ldc = N); row-major w [N, K] is a K x N column-major
 * matrix, transposed (lda = K); row-major x [T, K] is K x T (ldb = K). */
#include <math.h>

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
    rt_step *s = cg_step(c, RT_STEP_GEMM, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "linear %%%s: out of memory", y->name);
    rt_gemm *g = &s->gemm;
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
