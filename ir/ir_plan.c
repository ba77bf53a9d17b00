/* plan.c — freeing a launch plan, and the one rule both codegen and the
 * runtime follow for how each value is stored on the GPU (plan.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "ir/ir_plan.h"

void ir_plan_free(ir_plan *p)
{
    if (!p)
        return;
    for (int b = 0; b < p->n_buckets && p->buckets; b++) {
        ir_bucket *bk = &p->buckets[b];
        free(bk->cubin);
        for (int k = 0; k < bk->n_kernels && bk->kernel_names; k++)
            free(bk->kernel_names[k]);
        free(bk->kernel_names);
        free(bk->steps);
    }
    free(p->buckets);
    free(p);
}

int ir_buckets_default(int out[IR_BUCKETS_MAX])
{
    int n = 0;
    for (int t = 1; t <= 64; t *= 2)
        out[n++] = t;
    return n;
}

moec_status ir_buckets_check(const int *buckets, int n)
{
    if (n < 1 || n > IR_BUCKETS_MAX)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%d batch buckets (want 1 to %d)", n,
                        IR_BUCKETS_MAX);
    for (int i = 0; i < n; i++)
        if (buckets[i] < 1 || buckets[i] > IR_BUCKET_TOKENS_MAX ||
            (i && buckets[i] <= buckets[i - 1]))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "batch bucket %d is %d: buckets must ascend, from 1 to %d tokens", i,
                            buckets[i], IR_BUCKET_TOKENS_MAX);
    return MOEC_OK;
}

void ir_oneshot_kernel_name(char *buf, size_t cap, int ranks, ir_dtype dt)
{
    snprintf(buf, cap, "allreduce_oneshot_r%d_%s", ranks, ir_dtype_name(dt));
}

const ir_bucket *ir_plan_bucket_for(const ir_plan *p, int n)
{
    for (int b = 0; b < p->n_buckets; b++)
        if (p->buckets[b].T >= n)
            return &p->buckets[b];
    return NULL;
}

int ir_steps_before_op(const ir_step *steps, int n, int stop_op)
{
    if (stop_op < 0)
        return n;
    int end = 0;
    for (int i = 0; i < n; i++)
        if (steps[i].op_id >= 0 && steps[i].op_id < stop_op)
            end = i + 1;
    return end;
}

/* Whether v is an operand or a result of some moe_topk op. */
static int touches_topk(const ir_module *m, const ir_value *v)
{
    if (v->kind == IR_VALUE_OP && v->def && v->def->kind == IR_OP_MOE_TOPK)
        return 1;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (op->kind != IR_OP_MOE_TOPK)
            continue;
        for (int i = 0; i < op->n_in; i++)
            if (op->in[i] == v)
                return 1;
    }
    return 0;
}

ir_dtype ir_value_storage_dtype(const ir_module *m, const ir_value *v, ir_dtype compute)
{
    if (v->type.dtype == IR_DTYPE_I32)
        return IR_DTYPE_I32;
    if (v->kind == IR_VALUE_WEIGHT)
        return v->type.dtype == IR_DTYPE_F32 || v->type.dtype == IR_DTYPE_F8E4M3 ? v->type.dtype
                                                                                : compute;
    for (int i = 0; i < m->n_outputs; i++)
        if (m->outputs[i] == v)
            return IR_DTYPE_F32;
    /* an unsummed moe_routed's K weighted expert outputs stay fp32 until
     * the add_rms_norm that sums them, as the sum's own scratch was */
    if (v->kind == IR_VALUE_OP && v->def && v->def->kind == IR_OP_MOE_ROUTED &&
        ir_op_attr_int(v->def, "unsummed", 0))
        return IR_DTYPE_F32;
    /* a collective moves bytes as they are: its operand is stored like its
     * result (the vocab-parallel logits gathered into the f32 output) */
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if ((op->kind == IR_OP_ALL_REDUCE || op->kind == IR_OP_ALL_GATHER ||
             op->kind == IR_OP_REDUCE_SCATTER || op->kind == IR_OP_ALL_TO_ALL) &&
            op->in[0] == v)
            return ir_value_storage_dtype(m, op->out[0], compute);
    }
    return touches_topk(m, v) ? IR_DTYPE_F32 : compute;
}

size_t ir_weight_scale_offset(const ir_value *w)
{
    if (w->kind != IR_VALUE_WEIGHT || w->type.dtype != IR_DTYPE_F8E4M3)
        return 0;
    return ((size_t)ir_type_numel(&w->type, 0) + 15) / 16 * 16;
}

/* Whether operand j of op is one of its experts' weights; *fused: the
 * fused gate_up */
static int expert_operand(const ir_op *op, int j, int *fused)
{
    int first = op->kind == IR_OP_MOE_ROUTED ? 3 : op->kind == IR_OP_MOE_EXPERTS ? 2 : -1;
    int n = op->kind == IR_OP_MOE_ROUTED ? 5 : 4; /* operands with a fused gate_up */
    *fused = op->n_in == n && j == first;
    return first >= 0 && j >= first;
}

/* Whether dense weight w [N, K] lies in tiles under IR_FP8_TILES_LINEAR:
 * whole tiles and chunks, scale blocks too, read only as linears' weight. */
static int linear_weight_tiled(const ir_module *m, const ir_value *w)
{
    const ir_type *t = &w->type;
    if (t->dims[0] % 16 != 0 || t->dims[1] % 64 != 0 || !ir_block_scale_tiles(w))
        return 0;
    int used = 0;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        for (int j = 0; j < op->n_in; j++)
            if (op->in[j] == w) {
                if (op->kind != IR_OP_LINEAR || j != 1)
                    return 0;
                used = 1;
            }
    }
    return used;
}

int ir_weight_tiled(const ir_module *m, const ir_value *w, int mode)
{
    const ir_type *t = &w->type;
    if (w->kind != IR_VALUE_WEIGHT || t->dtype != IR_DTYPE_F8E4M3)
        return 0;
    if (t->rank == 2)
        return (mode & IR_FP8_TILES_LINEAR) && linear_weight_tiled(m, w);
    mode &= IR_FP8_TILES_EXPERTS;
    if (mode == IR_FP8_TILES_NONE || t->rank != 3 || t->dims[1] % 16 != 0 ||
        t->dims[2] % 64 != 0)
        return 0;
    int used = 0;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        for (int j = 0; j < op->n_in; j++) {
            int fused = 0;
            if (op->in[j] != w)
                continue;
            if (!expert_operand(op, j, &fused) || (fused && t->dims[1] % 32 != 0) ||
                (mode == IR_FP8_TILES_DOWN && j != op->n_in - 1) ||
                (mode == IR_FP8_TILES_GATE_UP && j == op->n_in - 1))
                return 0;
            used = 1;
        }
    }
    return used;
}

int ir_tile_codes(uint8_t *codes, int64_t rows, int64_t K)
{
    uint8_t *tmp = malloc((size_t)(16 * K));
    if (!tmp)
        return -1;
    for (int64_t t = 0; t < rows; t += 16) {
        uint8_t *tile = codes + t * K;
        memcpy(tmp, tile, (size_t)(16 * K));
        for (int64_t r = 0; r < 16; r++)
            for (int64_t k = 0; k < K; k += 16)
                memcpy(tile + ir_tile_offset(r, k, K), tmp + r * K + k, 16);
    }
    free(tmp);
    return 0;
}

size_t ir_weight_storage_bytes(const ir_module *m, const ir_value *w, ir_dtype compute)
{
    size_t off = ir_weight_scale_offset(w);
    if (off) {
        ir_type st = ir_block_scale_type(w);
        return off + (size_t)ir_type_numel(&st, 0) * sizeof(float);
    }
    return (size_t)ir_type_numel(&w->type, 0) * ir_dtype_size(ir_value_storage_dtype(m, w, compute));
}
