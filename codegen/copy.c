/* copy.c — the data-movement ops: reshape, slice, concat and expand, and the
 * copies behind fork and join (a value handed to the other stream). A
 * reshape, fork or join whose result plan_memory put at its operand's offset
 * (an alias, the usual case) is the same bytes and emits nothing; one it
 * could not alias (the storage dtype changes, e.g. into the f32 logits)
 * becomes a copy kernel, like slice, concat and expand. Reshape, slice and concat
 * are one kernel shape: rows of the result assembled from segments of
 * operand rows, moved bit for bit (or converted where the storage dtypes
 * differ, e.g. moe_topk's f32 weights into the compute dtype), 16 bytes per
 * thread when every segment boundary allows.
 *
 * Kernels, grid ceil(units / 256), block 256, args (operands..., y):
 *   copy_n<per token>_t<T>_<dtypes>(x, y)                 reshape, fork, join
 *   slice_r<rows>_s<row>_o<start>_l<len>_t<T>_<dtypes>(x, y)
 *   concat_r<rows>_l<len>_<len of each operand>..._t<T>_<dtypes>(x0, ..., y)
 *   expand_<x dims>_<y dims>_t<T>_<dtypes>(x, y)           (dims per token) */
#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

/* dims of v with T substituted. */
static void dims_of(const ir_value *v, int T, int64_t *d)
{
    for (int i = 0; i < v->type.rank; i++)
        d[i] = v->type.dims[i] == IR_DIM_T ? T : v->type.dims[i];
}

static int64_t prod(const int64_t *d, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++)
        p *= d[i];
    return p;
}

/* Result rows of `len` elements; operand i fills [begin[i], begin[i] +
 * width[i]) of each from its own rows of `stride[i]` elements, starting at
 * element `offset[i]`. */
typedef struct segments {
    int64_t rows, len;
    int n;
    int64_t begin[IR_MAX_OPERANDS], width[IR_MAX_OPERANDS];
    int64_t stride[IR_MAX_OPERANDS], offset[IR_MAX_OPERANDS];
} segments;

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

static moec_status emit_segments(cg_ctx *c, const ir_op *op, const char *name, const segments *g)
{
    const ir_value *y = op->out[0];
    if (g->rows * g->len >= INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s %%%s: %lld elements are too many for one copy",
                        ir_op_name(op->kind), y->name, (long long)(g->rows * g->len));
    int64_t all = g->len;
    for (int i = 0; i < g->n; i++)
        all = ir_gcd(ir_gcd(ir_gcd(ir_gcd(all, g->begin[i]), g->width[i]), g->stride[i]), g->offset[i]);
    int vec = cg_vec_width(all);
    int64_t per_row = g->len / vec, units = g->rows * per_row;
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    if (is_new) {
        moec_buf *b = &c->src;
        moec_buf_printf(b,
                      "// %s (codegen/copy.c), first for %%%s\n"
                      "extern \"C\" __global__ void __launch_bounds__(256)\n%s(",
                      ir_op_name(op->kind), y->name, name);
        for (int i = 0; i < g->n; i++)
            moec_buf_printf(b, "const %s *__restrict__ x%d, ", cg_ctype(cg_storage(c, op->in[i])), i);
        moec_buf_printf(b,
                      "%s *__restrict__ y)\n"
                      "{\n"
                      "    const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                      "    if (i >= %lld)\n"
                      "        return;\n"
                      "    const int row = i / %lld, j = (i - row * %lld) * %d;\n"
                      "    %s *out = y + (long long)row * %lld + j;\n",
                      cg_ctype(cg_storage(c, y)), (long long)units, (long long)per_row,
                      (long long)per_row, vec, cg_ctype(cg_storage(c, y)), (long long)g->len);
        for (int i = 0; i < g->n; i++) {
            if (g->n == 1)
                moec_buf_printf(b, "    ");
            else if (i == g->n - 1)
                moec_buf_printf(b, "    else\n        ");
            else
                moec_buf_printf(b, "    %sif (j < %lld)\n        ", i ? "else " : "",
                              (long long)(g->begin[i] + g->width[i]));
            moec_buf_printf(b, "cpv<%d>(out, x%d + (long long)row * %lld + %lld + (j - %lld));\n",
                          vec, i, (long long)g->stride[i], (long long)g->offset[i],
                          (long long)g->begin[i]);
        }
        moec_buf_printf(b, "}\n\n");
    }
    ir_step *s = kernel_step(c, op, k, units);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    s->n_args = g->n + 1;
    for (int i = 0; i < g->n; i++)
        s->args[i] = cg_arg_act(op->in[i]);
    s->args[g->n] = cg_arg_act(y);
    return MOEC_OK;
}

static moec_status emit_expand(cg_ctx *c, const ir_op *op, const char *sig)
{
    const ir_value *x = op->in[0], *y = op->out[0];
    int64_t dx[4] = {1, 1, 1, 1}, dy[4] = {1, 1, 1, 1}, st[4], xs = 1;
    int r = y->type.rank;
    if (x->type.rank != r || r > 4)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "expand %%%s: %%%s has another rank", y->name,
                        x->name);
    dims_of(x, c->T, dx + 4 - r);
    dims_of(y, c->T, dy + 4 - r);
    for (int i = 3; i >= 0; i--) {
        if (dx[i] != dy[i] && dx[i] != 1)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "expand %%%s: %%%s does not expand to it",
                            y->name, x->name);
        st[i] = dx[i] == 1 && dy[i] != 1 ? 0 : xs;
        xs *= dx[i];
    }
    int64_t total = prod(dy, 0, 4);
    if (total >= INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "expand %%%s: too many elements", y->name);
    int vec = cg_vec_width(dy[3]);
    char name[256];
    int n = snprintf(name, sizeof name, "expand");
    for (int pass = 0; pass < 2; pass++) {
        const ir_value *v = pass ? y : x;
        for (int i = 1; i < v->type.rank && n > 0 && (size_t)n < sizeof name; i++)
            n += snprintf(name + n, sizeof name - (size_t)n, "%s%lld", i == 1 ? "_" : "x",
                          (long long)v->type.dims[i]);
    }
    snprintf(name + n, sizeof name - (size_t)n, "_t%d_%s", c->T, sig);
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "expand %%%s: out of memory", y->name);
    ir_dtype tx = cg_storage(c, x), ty = cg_storage(c, y);
    if (is_new) {
        moec_buf_printf(&c->src,
                      "// expand (codegen/copy.c), first for %%%s\n"
                      "extern \"C\" __global__ void __launch_bounds__(256)\n"
                      "%s(const %s *__restrict__ x, %s *__restrict__ y)\n"
                      "{\n"
                      "    const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                      "    if (i >= %lld)\n"
                      "        return;\n"
                      "    const int o = i * %d;\n"
                      "    const int e = o %% %lld, r = o / %lld;\n"
                      "    const int c = r %% %lld, r2 = r / %lld;\n"
                      "    const int b = r2 %% %lld, a = r2 / %lld;\n"
                      "    const long long src = (long long)a * %lld + (long long)b * %lld + "
                      "(long long)c * %lld + (long long)e * %lld;\n",
                      y->name, name, cg_ctype(tx), cg_ctype(ty), (long long)(total / vec), vec,
                      (long long)dy[3], (long long)dy[3], (long long)dy[2], (long long)dy[2],
                      (long long)dy[1], (long long)dy[1], (long long)st[0], (long long)st[1],
                      (long long)st[2], (long long)st[3]);
        if (st[3] == 0 && tx == ty)
            moec_buf_printf(&c->src,
                          "#pragma unroll\n"
                          "    for (int j = 0; j < %d; j++)\n"
                          "        y[o + j] = x[src];\n"
                          "}\n\n",
                          vec);
        else if (st[3] == 0)
            moec_buf_printf(&c->src,
                          "    float v[%d];\n"
                          "    const float s = ld(x + src);\n"
                          "#pragma unroll\n"
                          "    for (int j = 0; j < %d; j++)\n"
                          "        v[j] = s;\n"
                          "    stv<%d>(y + o, v);\n"
                          "}\n\n",
                          vec, vec, vec);
        else
            moec_buf_printf(&c->src, "    cpv<%d>(y + o, x + src);\n}\n\n", vec);
    }
    ir_step *s = kernel_step(c, op, k, total / vec);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "expand %%%s: out of memory", y->name);
    s->n_args = 2;
    s->args[0] = cg_arg_act(x);
    s->args[1] = cg_arg_act(y);
    return MOEC_OK;
}

moec_status cg_emit_copy(cg_ctx *c, const ir_op *op)
{
    const ir_value *y = op->out[0];
    char sig[128], name[512];
    cg_dtype_signature(c, op, sig, sizeof sig);
    for (int i = 0; i < op->n_in; i++)
        if ((cg_storage(c, op->in[i]) == IR_DTYPE_I32) != (cg_storage(c, y) == IR_DTYPE_I32))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: mixes i32 and float operands",
                            ir_op_name(op->kind), y->name);
    segments g = {0};
    int64_t dy[IR_MAX_RANK], d[IR_MAX_RANK];
    dims_of(y, c->T, dy);
    int r = y->type.rank;
    switch (op->kind) {
    case IR_OP_RESHAPE:
    case IR_OP_FORK:
    case IR_OP_JOIN: {
        const ir_value *x = op->in[0];
        int64_t n = ir_type_numel(&y->type, 1);
        if (ir_type_numel(&x->type, 1) != n)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: %%%s has another element count",
                            ir_op_name(op->kind), y->name, x->name);
        if (x->kind == IR_VALUE_OP && x->mem_offset == y->mem_offset) {
            /* the planner aliased them: nothing to move, unless the bytes
             * had to change type in place (threads would race) */
            if (cg_storage(c, x) != cg_storage(c, y))
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "%s %%%s: shares its arena offset with %%%s, which is stored as "
                                "%s, not %s: a converting copy needs its own bytes",
                                ir_op_name(op->kind), y->name, x->name,
                                ir_dtype_name(cg_storage(c, x)), ir_dtype_name(cg_storage(c, y)));
            return MOEC_OK;
        }
        g.rows = c->T;
        g.len = n;
        g.n = 1;
        g.width[0] = g.stride[0] = n;
        snprintf(name, sizeof name, "copy_n%lld_t%d_%s", (long long)n, c->T, sig);
        return emit_segments(c, op, name, &g);
    }
    case IR_OP_SLICE: {
        int64_t axis = ir_op_attr_int(op, "axis", -1), start = ir_op_attr_int(op, "start", -1),
                size = ir_op_attr_int(op, "size", -1);
        const ir_value *x = op->in[0];
        if (x->type.rank != r || axis < 1 || axis >= r || start < 0 || size < 0 ||
            start + size > x->type.dims[axis] || dy[axis] != size)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "slice %%%s: axis %lld [%lld, %lld) is outside %%%s", y->name,
                            (long long)axis, (long long)start, (long long)(start + size), x->name);
        dims_of(x, c->T, d);
        int64_t inner = prod(d, (int)axis + 1, r);
        g.rows = prod(d, 0, (int)axis);
        g.len = size * inner;
        g.n = 1;
        g.width[0] = g.len;
        g.stride[0] = d[axis] * inner;
        g.offset[0] = start * inner;
        snprintf(name, sizeof name, "slice_r%lld_s%lld_o%lld_l%lld_t%d_%s",
                 (long long)(g.rows / c->T), (long long)g.stride[0], (long long)g.offset[0],
                 (long long)g.len, c->T, sig);
        return emit_segments(c, op, name, &g);
    }
    case IR_OP_CONCAT: {
        int64_t axis = ir_op_attr_int(op, "axis", -1);
        if (axis < 1 || axis >= r)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "concat %%%s: axis %lld is outside rank %d",
                            y->name, (long long)axis, r);
        int64_t inner = prod(dy, (int)axis + 1, r), at = 0;
        g.rows = prod(dy, 0, (int)axis);
        g.len = dy[axis] * inner;
        g.n = op->n_in;
        int n = snprintf(name, sizeof name, "concat_r%lld_l%lld", (long long)(g.rows / c->T),
                         (long long)g.len);
        for (int i = 0; i < op->n_in; i++) {
            const ir_value *x = op->in[i];
            if (x->type.rank != r)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG, "concat %%%s: %%%s has another rank", y->name,
                                x->name);
            dims_of(x, c->T, d);
            g.begin[i] = at;
            g.width[i] = g.stride[i] = d[axis] * inner;
            at += g.width[i];
            if (n > 0 && (size_t)n < sizeof name)
                n += snprintf(name + n, sizeof name - (size_t)n, "_%lld", (long long)g.width[i]);
        }
        if (at != g.len)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "concat %%%s: operands sum to %lld, not %lld",
                            y->name, (long long)at, (long long)g.len);
        if (n > 0 && (size_t)n < sizeof name)
            snprintf(name + n, sizeof name - (size_t)n, "_t%d_%s", c->T, sig);
        return emit_segments(c, op, name, &g);
    }
    case IR_OP_EXPAND: return emit_expand(c, op, sig);
    default:
        return MOEC_ERR(MOEC_ERR_INTERNAL, "cg_emit_copy: %s %%%s is not a copy",
                        ir_op_name(op->kind), y->name);
    }
}
