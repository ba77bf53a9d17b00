/* collective.c — the collectives of a sharded module (pass shard) as plan
 * steps: a collective step the runtime hands to NCCL (or its one-shot
 * all-reduce) on the op's stream, so that CUDA Graph capture records it
 * with the kernels around it.
 *
 * all_reduce: one step, x into y (stored alike: ir_value_storage_dtype).
 * all_gather along axis a: the ranks' blocks land one after another
 * ([ranks][outer][inner], outer the rows before axis a, T included), so
 * unless there is one outer row the step gathers into scratch and a kernel
 * puts each rank's block in its place along the axis:
 *   gather_r<ranks>_o<outer>_i<inner>_<dtypes>(const X *g, Y *y)
 *   grid ceil(ranks * outer * inner / 256), block 256.
 * reduce_scatter along axis a: rank r's block of each row along the axis
 * is its share, and NCCL's ncclReduceScatter hands rank r the r-th of
 * `ranks` contiguous parts; so unless there is one outer row (and x is
 * stored as y) a kernel first packs x into scratch, block j of every row
 * together ([ranks][outer][block]), converting to y's storage:
 *   scatter_pack_r<ranks>_o<outer>_b<block>_<dtypes>(const X *x, G *g)
 *   grid ceil(ranks * outer * block / 256), block 256,
 * then the step reduce-scatters the packed parts into y.
 * all_to_all along axis a: block j of y's rows is rank j's block `rank`;
 * the step is grouped sends and receives (NCCL's ncclSend/ncclRecv), part
 * j of the send buffer to rank j, part j of the receive buffer from it.
 * With one outer row x and y are those buffers; else x is packed as above,
 * exchanged into a second scratch buffer, and the all_gather's kernel puts
 * each rank's block in its place. */
#include <stdio.h>

#include "codegen/cg.h"
#include "err.h"

#define GATHER_THREADS 256

static moec_status coll_step(cg_ctx *c, const ir_op *op, ir_op_kind kind, ir_dtype dt,
                             int64_t count, ir_arg send, ir_arg recv)
{
    ir_step *s = cg_step(c, IR_STEP_COLLECTIVE, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind),
                        op->out[0]->name);
    s->coll.op = kind;
    s->coll.dtype = dt;
    s->coll.count = count;
    s->coll.ranks = (int)ir_op_attr_int(op, "ranks", 1);
    s->coll.send = send;
    s->coll.recv = recv;
    return MOEC_OK;
}

/* The step of a kernel that moves n elements from `from` to `to`, a thread
 * each (gather's placing, the scatters' packing). */
static moec_status move_step(cg_ctx *c, const ir_op *op, int kernel, int64_t n, ir_arg from,
                             ir_arg to)
{
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind),
                        op->out[0]->name);
    s->kernel = kernel;
    s->grid[0] = (unsigned)((n + GATHER_THREADS - 1) / GATHER_THREADS);
    s->block[0] = GATHER_THREADS;
    s->n_args = 2;
    s->args[0] = from;
    s->args[1] = to;
    return MOEC_OK;
}

/* The kernel that moves rank j's gathered block (row o) to its place along
 * the axis: y[o][j][:] = g[j][o][:]. */
static moec_status gather_place(cg_ctx *c, const ir_op *op, int ranks, int64_t outer,
                                int64_t inner, ir_dtype dg, size_t off)
{
    const ir_value *y = op->out[0];
    ir_dtype dy = cg_storage(c, y);
    char name[200];
    snprintf(name, sizeof name, "gather_r%d_o%lld_i%lld_%s_%s", ranks, (long long)outer,
             (long long)inner, ir_dtype_name(dy), ir_dtype_name(dg));
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "all_gather %%%s: out of memory", y->name);
    if (is_new)
        moec_buf_printf(&c->src,
                        "// all_gather (codegen/collective.c): the ranks' blocks to their place "
                        "along the axis, first for %%%s\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d)\n"
                        "%s(const %s *__restrict__ g, %s *__restrict__ y)\n"
                        "{\n"
                        "    constexpr long long R = %d, O = %lld, I = %lld;\n"
                        "    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                        "    if (i >= R * O * I)\n"
                        "        return;\n"
                        "    const long long c = i %% I, j = (i / I) %% R, o = i / (I * R);\n"
                        "    st(y + i, ld(g + (j * O + o) * I + c));\n"
                        "}\n\n",
                        y->name, GATHER_THREADS, name, cg_ctype(dg), cg_ctype(dy), ranks,
                        (long long)outer, (long long)inner);
    return move_step(c, op, k, (int64_t)ranks * outer * inner, cg_arg_scratch(off),
                     cg_arg_act(y));
}

/* The kernel that packs block j of every row together, in y's storage:
 * g[j][o][:] = x[o][j * block ...]. */
static moec_status scatter_pack(cg_ctx *c, const ir_op *op, int ranks, int64_t outer,
                                int64_t block, ir_dtype dx, ir_dtype dg, size_t off)
{
    const ir_value *x = op->in[0], *y = op->out[0];
    char name[200];
    snprintf(name, sizeof name, "scatter_pack_r%d_o%lld_b%lld_%s_%s", ranks, (long long)outer,
             (long long)block, ir_dtype_name(dx), ir_dtype_name(dg));
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind), y->name);
    if (is_new)
        moec_buf_printf(&c->src,
                        "// %s (codegen/collective.c): each rank's block of every row together, "
                        "first for %%%s\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d)\n"
                        "%s(const %s *__restrict__ x, %s *__restrict__ g)\n"
                        "{\n"
                        "    constexpr long long R = %d, O = %lld, B = %lld;\n"
                        "    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                        "    if (i >= R * O * B)\n"
                        "        return;\n"
                        "    const long long c = i %% B, o = (i / B) %% O, j = i / (B * O);\n"
                        "    st(g + i, ld(x + (o * R + j) * B + c));\n"
                        "}\n\n",
                        ir_op_name(op->kind), y->name, GATHER_THREADS, name, cg_ctype(dx),
                        cg_ctype(dg), ranks, (long long)outer, (long long)block);
    return move_step(c, op, k, (int64_t)ranks * outer * block, cg_arg_act(x),
                     cg_arg_scratch(off));
}

/* reduce_scatter and all_to_all along the axis: ranks blocks of `block`
 * elements in each of `outer` rows. */
static moec_status emit_blocked(cg_ctx *c, const ir_op *op, int ranks, int64_t outer,
                                int64_t inner, ir_dtype dx, ir_dtype dy)
{
    const ir_value *x = op->in[0], *y = op->out[0];
    if (inner % ranks)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s %%%s: %lld elements a row do not split over %d "
                        "ranks", ir_op_name(op->kind), y->name, (long long)inner, ranks);
    int64_t block = inner / ranks, part = outer * block;
    size_t bytes = (size_t)ranks * (size_t)part * ir_dtype_size(dy);
    if (outer == 1 && dx == dy)
        return coll_step(c, op, op->kind, dy, part, cg_arg_act(x), cg_arg_act(y));
    size_t packed = cg_scratch(c, bytes);
    MOEC_TRY(scatter_pack(c, op, ranks, outer, block, dx, dy, packed));
    if (op->kind == IR_OP_REDUCE_SCATTER)
        return coll_step(c, op, op->kind, dy, part, cg_arg_scratch(packed), cg_arg_act(y));
    size_t got = cg_scratch(c, bytes);
    MOEC_TRY(coll_step(c, op, op->kind, dy, part, cg_arg_scratch(packed), cg_arg_scratch(got)));
    return gather_place(c, op, ranks, outer, block, dy, got);
}

moec_status cg_emit_collective(cg_ctx *c, const ir_op *op)
{
    const ir_value *x = op->in[0], *y = op->out[0];
    ir_dtype dx = cg_storage(c, x), dy = cg_storage(c, y);
    int ranks = (int)ir_op_attr_int(op, "ranks", 1);
    int64_t per_token = ir_type_numel(&x->type, 1);
    if (op->kind == IR_OP_ALL_REDUCE) {
        if (dx != dy)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "all_reduce %%%s: stored as %s, its operand as %s",
                            y->name, ir_dtype_name(dy), ir_dtype_name(dx));
        MOEC_TRY(cg_emit_oneshot(c, ranks, dx)); /* the runtime may run it instead of NCCL */
        return coll_step(c, op, IR_OP_ALL_REDUCE, dx, per_token * c->T, cg_arg_act(x),
                         cg_arg_act(y));
    }
    int axis = (int)ir_op_attr_int(op, "axis", 1);
    int64_t outer = c->T, inner = 1;
    for (int d = 1; d < x->type.rank; d++) {
        if (d < axis)
            outer *= x->type.dims[d];
        else
            inner *= x->type.dims[d];
    }
    if (op->kind != IR_OP_ALL_GATHER)
        return emit_blocked(c, op, ranks, outer, inner, dx, dy);
    if (outer == 1 && dx == dy)
        return coll_step(c, op, IR_OP_ALL_GATHER, dx, inner, cg_arg_act(x), cg_arg_act(y));
    size_t off = cg_scratch(c, (size_t)ranks * (size_t)(outer * inner) * ir_dtype_size(dx));
    MOEC_TRY(coll_step(c, op, IR_OP_ALL_GATHER, dx, outer * inner, cg_arg_act(x),
                       cg_arg_scratch(off)));
    return gather_place(c, op, ranks, outer, inner, dx, off);
}
