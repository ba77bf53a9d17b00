/* reduce_sum.c — the sum over one axis (the unfused MoE's sum over the top-k
 * expert outputs): each thread owns up to 8 consecutive elements of the
 * result and adds the n slices in order, in fp32.
 *
 * Kernel reduce_sum_r<rows per token>_n<n>_i<inner>_t<T>_<dtypes>(const X
 * *x, Y *y); grid ceil(units / 256), block 256. */
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

moec_status cg_emit_reduce_sum(cg_ctx *c, const ir_op *op)
{
    const ir_value *x = op->in[0], *y = op->out[0];
    int64_t axis = ir_op_attr_int(op, "axis", -1);
    int r = x->type.rank;
    if (axis < 1 || axis >= r)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "reduce_sum %%%s: axis %lld is outside rank %d",
                        y->name, (long long)axis, r);
    int64_t outer = 1, n = x->type.dims[axis], inner = 1;
    for (int i = 1; i < axis; i++)
        outer *= x->type.dims[i];
    for (int i = (int)axis + 1; i < r; i++)
        inner *= x->type.dims[i];
    if (ir_type_numel(&y->type, 1) != outer * inner)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "reduce_sum %%%s: result has the wrong shape",
                        y->name);
    ir_dtype tx = cg_storage(c, x), ty = cg_storage(c, y);
    if (tx == IR_DTYPE_I32 || ty == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "reduce_sum %%%s: integer operands", y->name);
    if (outer * n * inner * c->T >= INT32_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "reduce_sum %%%s: too many elements", y->name);
    int vec = cg_vec_width(inner);
    int64_t per_row = inner / vec, units = outer * c->T * per_row;
    char name[256];
    if (tx == ty)
        snprintf(name, sizeof name, "reduce_sum_r%lld_n%lld_i%lld_t%d_%s", (long long)outer,
                 (long long)n, (long long)inner, c->T, ir_dtype_name(ty));
    else
        snprintf(name, sizeof name, "reduce_sum_r%lld_n%lld_i%lld_t%d_%s_%s", (long long)outer,
                 (long long)n, (long long)inner, c->T, ir_dtype_name(ty), ir_dtype_name(tx));
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "reduce_sum %%%s: out of memory", y->name);
    if (is_new)
        moec_buf_printf(&c->src,
                      "// reduce_sum (codegen/reduce_sum.c), first for %%%s\n"
                      "extern \"C\" __global__ void __launch_bounds__(256)\n"
                      "%s(const %s *__restrict__ x, %s *__restrict__ y)\n"
                      "{\n"
                      "    const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                      "    if (i >= %lld)\n"
                      "        return;\n"
                      "    const int o = i / %lld, j = (i - o * %lld) * %d;\n"
                      "    const %s *xo = x + (long long)o * %lld + j;\n"
                      "    float acc[%d] = {}, v[%d];\n"
                      "#pragma unroll 4\n"
                      "    for (int k = 0; k < %lld; k++) {\n"
                      "        ldv<%d>(xo + k * %lld, v);\n"
                      "#pragma unroll\n"
                      "        for (int q = 0; q < %d; q++)\n"
                      "            acc[q] += v[q];\n"
                      "    }\n"
                      "    stv<%d>(y + (long long)o * %lld + j, acc);\n"
                      "}\n\n",
                      y->name, name, cg_ctype(tx), cg_ctype(ty), (long long)units,
                      (long long)per_row, (long long)per_row, vec, cg_ctype(tx),
                      (long long)(n * inner), vec, vec, (long long)n, vec, (long long)inner, vec,
                      vec, (long long)inner);
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "reduce_sum %%%s: out of memory", y->name);
    s->kernel = k;
    s->grid[0] = (unsigned)((units + 255) / 256);
    s->block[0] = 256;
    s->n_args = 2;
    s->args[0] = cg_arg_act(x);
    s->args[1] = cg_arg_act(y);
    return MOEC_OK;
}
