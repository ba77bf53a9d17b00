/* ir_liveness.c — when each activation's bytes are needed, the one
 * definition that the memory planner (plan_memory) places by and that the
 * verifier checks a plan against: from the op that defines a value (inputs:
 * before the first op) to its last use (outputs: past the last op), and,
 * since the two streams run in any interleaving between a fork and its
 * join, every value an op in that interval touches over the whole interval.
 * Also which ops may share their operand's storage (docs/IR.md). */
#include <stdlib.h>

#include "ir/ir_internal.h"

int ir_op_may_alias(ir_op_kind kind)
{
    return kind == IR_OP_RESHAPE || kind == IR_OP_FORK || kind == IR_OP_JOIN;
}

/* Stretches every value an op in [from, to] touches over that interval. */
static void stretch_interval(const ir_module *m, int from, int to, int *start, int *end)
{
    for (int k = from; k <= to; k++) {
        const ir_op *op = m->ops[k];
        for (int i = 0; i < op->n_in + op->n_out; i++) {
            const ir_value *v = i < op->n_in ? op->in[i] : op->out[i - op->n_in];
            if (!v || v->kind == IR_VALUE_WEIGHT)
                continue;
            if (start[v->id] > from)
                start[v->id] = from;
            if (end[v->id] < to)
                end[v->id] = to;
        }
    }
}

int ir_module_live_ranges(const ir_module *m, int *start, int *end)
{
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        start[i] = v->kind == IR_VALUE_OP && v->def ? v->def->id : -1;
        end[i] = start[i];
    }
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        for (int i = 0; i < op->n_in; i++)
            if (op->in[i] && end[op->in[i]->id] < k)
                end[op->in[i]->id] = k;
    }
    for (int i = 0; i < m->n_outputs; i++)
        end[m->outputs[i]->id] = m->n_ops;
    /* fork_at[v]: the fork v descends from through side-stream ops (the
     * first operand, in order, that has one), -1 when none: the fork a join
     * of v waits for. One pass in op order, operands before results. */
    unsigned char *paired = calloc((size_t)m->n_ops + 1, 1);
    int *fork_at = malloc(sizeof *fork_at * ((size_t)m->n_values + 1));
    if (!paired || !fork_at) {
        free(paired);
        free(fork_at);
        return -1;
    }
    for (int i = 0; i < m->n_values; i++)
        fork_at[i] = -1;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        int f = -1;
        if (op->kind == IR_OP_FORK)
            f = k;
        else if (op->stream == 1)
            for (int i = 0; i < op->n_in && f < 0; i++)
                if (op->in[i])
                    f = fork_at[op->in[i]->id];
        for (int i = 0; i < op->n_out; i++)
            fork_at[op->out[i]->id] = f;
    }
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (op->kind != IR_OP_JOIN)
            continue;
        int f = fork_at[op->in[0]->id];
        if (f < 0 || paired[f]) /* no traceable fork: the latest unpaired one */
            for (f = k - 1; f >= 0 && (m->ops[f]->kind != IR_OP_FORK || paired[f]); f--)
                ;
        if (f < 0)
            continue;
        paired[f] = 1;
        stretch_interval(m, f, k, start, end);
    }
    /* A fork never joined: its side stream may run to the end. */
    for (int k = 0; k < m->n_ops; k++)
        if (m->ops[k]->kind == IR_OP_FORK && !paired[k])
            stretch_interval(m, k, m->n_ops - 1, start, end);
    free(paired);
    free(fork_at);
    return 0;
}
