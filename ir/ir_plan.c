/* plan.c — freeing a launch plan, and the one rule both codegen and the
 * runtime follow for how each value is stored on the GPU (plan.h). */
#include <stdio.h>
#include <stdlib.h>

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

size_t ir_weight_storage_bytes(const ir_module *m, const ir_value *w, ir_dtype compute)
{
    size_t off = ir_weight_scale_offset(w);
    if (off) {
        ir_type st = ir_block_scale_type(w);
        return off + (size_t)ir_type_numel(&st, 0) * sizeof(float);
    }
    return (size_t)ir_type_numel(&w->type, 0) * ir_dtype_size(ir_value_storage_dtype(m, w, compute));
}
