/* layer_norm.c — LayerNorm over the last dim (DeepSeek-V3.2's indexer k_norm):
 * y = (x - mean) / sqrt(var + eps) * w + b, the mean and biased variance in
 * fp32 as the interpreter computes them. The rows are short (index_head_dim
 * 128), so one warp takes a row, four rows to a block, reading the row
 * three times (mean, variance, output) from L1 rather than keeping it.
 *
 * Kernel layer_norm_r<rows per token>_d<D>_t<T>_<dtypes>(const X *x,
 * const W *w, const B *b, Y *y, float eps): grid ceil(rows / 4), block 128. */
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

static const char BODY[] =
    "    const int row = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;\n"
    "    if (row >= ROWS)\n"
    "        return;\n"
    "    const TX *xr = x + (long long)row * D;\n"
    "    TY *yr = y + (long long)row * D;\n"
    "    float s = 0.0f;\n"
    "    for (int c = lane; c < D / V; c += 32) {\n"
    "        float t[V];\n"
    "        ldv<V>(xr + c * V, t);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < V; j++)\n"
    "            s += t[j];\n"
    "    }\n"
    "    const float mean = warp_sum(s) / (float)D;\n"
    "    float ss = 0.0f;\n"
    "    for (int c = lane; c < D / V; c += 32) {\n"
    "        float t[V];\n"
    "        ldv<V>(xr + c * V, t);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < V; j++)\n"
    "            ss += (t[j] - mean) * (t[j] - mean);\n"
    "    }\n"
    "    const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)D + eps);\n"
    "    for (int c = lane; c < D / V; c += 32) {\n"
    "        float t[V], wv[V], bv[V];\n"
    "        ldv<V>(xr + c * V, t);\n"
    "        ldv<V>(w + c * V, wv);\n"
    "        ldv<V>(b + c * V, bv);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < V; j++)\n"
    "            t[j] = (t[j] - mean) * inv * wv[j] + bv[j];\n"
    "        stv<V>(yr + c * V, t);\n"
    "    }\n";

moec_status cg_emit_layer_norm(cg_ctx *c, const ir_op *op)
{
    const ir_value *x = op->in[0], *w = op->in[1], *b = op->in[2], *y = op->out[0];
    const ir_attr *eps = ir_op_attr(op, "eps");
    int r = x->type.rank;
    if (op->n_in != 3 || r < 2 || !eps || eps->kind != IR_ATTR_FLOAT ||
        ir_type_numel(&w->type, 1) != x->type.dims[r - 1] ||
        ir_type_numel(&b->type, 1) != x->type.dims[r - 1] ||
        ir_type_numel(&y->type, 1) != ir_type_numel(&x->type, 1))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "layer_norm %%%s: wants x [T, ..., D], w [D], b [D] and an eps attribute",
                        y->name);
    long long D = x->type.dims[r - 1];
    long long per_token = ir_type_numel(&x->type, 1) / D, rows = per_token * c->T;
    char sig[64], name[256];
    cg_dtype_signature(c, op, sig, sizeof sig);
    snprintf(name, sizeof name, "layer_norm_r%lld_d%lld_t%d_%s", per_token, D, c->T, sig);
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "layer_norm %%%s: out of memory", y->name);
    if (is_new) {
        moec_buf_printf(&c->src,
                        "// layer_norm (codegen/layer_norm.c), first for %%%s\n"
                        "extern \"C\" __global__ void __launch_bounds__(128)\n"
                        "%s(const %s *__restrict__ x, const %s *__restrict__ w, const %s "
                        "*__restrict__ b, %s *__restrict__ y, float eps)\n"
                        "{\n"
                        "    typedef %s TX;\n    typedef %s TY;\n"
                        "    constexpr long long ROWS = %lld;\n"
                        "    constexpr int D = %lld, V = %d;\n"
                        "%s}\n\n",
                        y->name, name, cg_ctype(cg_storage(c, x)), cg_ctype(cg_storage(c, w)),
                        cg_ctype(cg_storage(c, b)), cg_ctype(cg_storage(c, y)),
                        cg_ctype(cg_storage(c, x)), cg_ctype(cg_storage(c, y)), rows, D,
                        cg_vec_width(D), BODY);
    }
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "layer_norm %%%s: out of memory", y->name);
    s->kernel = k;
    s->grid[0] = (unsigned)((rows + 3) / 4);
    s->block[0] = 128;
    s->n_args = 5;
    s->args[0] = cg_arg_act(x);
    s->args[1] = cg_arg_act(w);
    s->args[2] = cg_arg_act(b);
    s->args[3] = cg_arg_act(y);
    s->args[4] = cg_arg_f32(eps->f);
    return MOEC_OK;
}
