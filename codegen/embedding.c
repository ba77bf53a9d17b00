/* embedding.c — the token embedding gather: row ids[t] of the table into
 * row t of the result, 16 bytes per thread where the row length allows.
 * An id outside the table (only padding can carry one, or, on a rank of a
 * vocab-parallel embedding, an id another rank holds: the table then holds
 * ids vocab_start ..) gives zeros rather than a read out of bounds.
 *
 * Kernel embedding_v<V>_h<H>[_s<vocab_start>]_t<T>_<dtypes>(const int *ids,
 * const Table *table, Y *y); grid (ceil(H / vec / block), T), block up to
 * 256. */
#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

/* The largest of 8, 4, 2, 1 elements that divides n. */
moec_status cg_emit_embedding(cg_ctx *c, const ir_op *op)
{
    const ir_value *ids = op->in[0], *table = op->in[1], *y = op->out[0];
    if (table->type.rank != 2 || table->type.dims[0] == IR_DIM_T ||
        ir_type_numel(&ids->type, 1) != 1 || ir_type_numel(&y->type, 1) != table->type.dims[1] ||
        cg_storage(c, ids) != IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "embedding %%%s: wants ids i32[T] and a table [V, H] (table %%%s)", y->name,
                        table->name);
    int64_t V = table->type.dims[0], H = table->type.dims[1];
    long long start = (long long)ir_op_attr_int(op, "vocab_start", 0);
    char shard[32] = "";
    if (start)
        snprintf(shard, sizeof shard, "_s%lld", start);
    ir_dtype dt = cg_storage(c, table), dy = cg_storage(c, y);
    int vec = cg_vec_width(H);
    int64_t chunks = H / vec;
    int block = chunks >= 256 ? 256 : (int)((chunks + 31) / 32 * 32);
    char name[256];
    if (dt == dy)
        snprintf(name, sizeof name, "embedding_v%lld_h%lld%s_t%d_%s", (long long)V, (long long)H,
                 shard, c->T, ir_dtype_name(dy));
    else
        snprintf(name, sizeof name, "embedding_v%lld_h%lld%s_t%d_%s_%s", (long long)V,
                 (long long)H, shard, c->T, ir_dtype_name(dy), ir_dtype_name(dt));
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "embedding %%%s: out of memory", y->name);
    if (is_new)
        moec_buf_printf(
            &c->src,
            "// embedding (codegen/embedding.c), first for %%%s\n"
            "extern \"C\" __global__ void __launch_bounds__(%d)\n"
            "%s(const int *__restrict__ ids, const %s *__restrict__ table, %s *__restrict__ y)\n"
            "{\n"
            "    const int t = blockIdx.y;\n"
            "    const int c = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (c >= %lld)\n"
            "        return;\n"
            "    const int id = ids[t] - %lld;\n"
            "    %s *out = y + (long long)t * %lld + c * %d;\n"
            "    if (id < 0 || id >= %lld) {\n"
            "        float zero[%d] = {};\n"
            "        stv<%d>(out, zero);\n"
            "        return;\n"
            "    }\n"
            "    cpv<%d>(out, table + (long long)id * %lld + c * %d);\n"
            "}\n\n",
            y->name, block, name, cg_ctype(dt), cg_ctype(dy), (long long)chunks, start, cg_ctype(dy),
            (long long)H, vec, (long long)V, vec, vec, vec, (long long)H, vec);
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "embedding %%%s: out of memory", y->name);
    s->kernel = k;
    s->grid[0] = (unsigned)((chunks + block - 1) / block);
    s->grid[1] = (unsigned)c->T;
    s->block[0] = (unsigned)block;
    s->n_args = 3;
    s->args[0] = cg_arg_act(ids);
    s->args[1] = cg_arg_act(table);
    s->args[2] = cg_arg_act(y);
    return MOEC_OK;
}
