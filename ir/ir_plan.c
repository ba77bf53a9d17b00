/* plan.c — freeing a launch plan, and the one rule both codegen and the
 * runtime follow for how each value is stored on the GPU (plan.h). */
#include <stdlib.h>

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
        return v->type.dtype == IR_DTYPE_F32 ? IR_DTYPE_F32 : compute;
    for (int i = 0; i < m->n_outputs; i++)
        if (m->outputs[i] == v)
            return IR_DTYPE_F32;
    return touches_topk(m, v) ? IR_DTYPE_F32 : compute;
}
