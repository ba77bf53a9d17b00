/* pass_fuse_norm.c — fuse_add_rms_norm: a residual add whose result an
 * rms_norm normalizes becomes one add_rms_norm, so one kernel reads the
 * residual and the branch output once and writes both the new residual and
 * its normalized form (issue 4, "RMSNorm with the residual add fused").
 * fuse_add3_rms_norm, later: an add of two branches that only such an
 * add_rms_norm reads (the routed and the shared experts' outputs) becomes
 * its second addend, one kernel less per MoE layer (issue 15).
 *
 * The add's result usually has other users (it is the residual stream, read
 * again by the next residual add): they read the fused op's first result,
 * which takes the add's value name; the second result takes the rms_norm's.
 * Only rank-2 values whose operands have the same shape (no broadcast) are
 * fused. Matched by structure, never by value names. */
#include <stdio.h>

#include "compiler/passes.h"
#include "err.h"

/* The add (same-shape float [T, D] operands) that rms_norm op n normalizes,
 * when the pair can become one op placed where the add is; else NULL. */
static ir_op *fusable_add(const ir_op *n)
{
    const ir_value *x = n->in[0], *w = n->in[1];
    if (x->kind != IR_VALUE_OP || !x->def || x->def->kind != IR_OP_ADD || x->type.rank != 2)
        return NULL;
    ir_op *add = x->def;
    const ir_value *a = add->in[0], *b = add->in[1];
    if (add->stream != n->stream || a->type.rank != 2 || !ir_type_equal(&a->type, &b->type) ||
        a->type.dims[1] != x->type.dims[1] || a->type.dtype == IR_DTYPE_I32)
        return NULL;
    /* The fused op sits where the add was: the weight must exist by then. */
    if (w->kind == IR_VALUE_OP && (!w->def || w->def->id >= add->id))
        return NULL;
    return add;
}

/* Replaces add and rms_norm op n by one add_rms_norm where the add was. */
static moec_status fuse_pair(ir_module *m, ir_op *add, ir_op *n, ir_op **fused)
{
    ir_value *sum = add->out[0], *normed = n->out[0];
    const char *sum_name = sum->name, *normed_name = normed->name;
    const char *tmp[2] = {ir_module_unique_name(m, sum_name), NULL};
    if (tmp[0])
        tmp[1] = ir_module_unique_name(m, normed_name);
    if (!tmp[0] || !tmp[1])
        return MOEC_ERR(MOEC_ERR_OOM, "fuse_add_rms_norm %%%s: out of memory", sum_name);
    ir_value *in[3] = {add->in[0], add->in[1], n->in[1]};
    ir_op *op = ir_module_add_op(m, IR_OP_ADD_RMS_NORM, in, 3, tmp, 2);
    if (!op)
        return moec_err_wrap(MOEC_ERR_INTERNAL, "fuse_add_rms_norm %%%s", sum_name);
    MOEC_TRY(ir_op_set_float(m, op, "eps", ir_op_attr_float(n, "eps", 0)));
    if (ir_op_attr(add, "alpha"))
        MOEC_TRY(ir_op_set_float(m, op, "alpha", ir_op_attr_float(add, "alpha", 1.0)));
    moec_status st = ir_op_finish(m, op, NULL);
    if (st != MOEC_OK)
        return moec_err_wrap(st, "fuse_add_rms_norm %%%s", sum_name);
    op->stream = add->stream;
    MOEC_TRY(ir_module_move_op_before(m, op, add));
    ir_module_replace_uses(m, sum, op->out[0]);
    ir_module_replace_uses(m, normed, op->out[1]);
    MOEC_TRY(ir_module_dce(m));
    /* The add and the rms_norm are gone with their values: the fused op's
     * results take over their names (arena strings, still valid). */
    ir_value_rename(m, op->out[0], sum_name);
    ir_value_rename(m, op->out[1], normed_name);
    *fused = op;
    return MOEC_OK;
}

moec_status pass_fuse_add_rms_norm(ir_module *m, const pass_options *opt)
{
    (void)opt;
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *n = m->ops[i];
        if (n->kind != IR_OP_RMS_NORM)
            continue;
        ir_op *add = fusable_add(n), *fused = NULL;
        if (!add)
            continue;
        MOEC_TRY(fuse_pair(m, add, n, &fused));
        i = fused->id;
    }
    return MOEC_OK;
}

/* An add_rms_norm(a, b, w) whose b is add(p, q) (no alpha, same shape, on
 * the same stream), read by nothing else: add_rms_norm(a, p, w, q). With
 * alpha 1 the add may be a, the two addends swapped (a + b is b + a in
 * fp32). */
static int fusable_sum(const ir_module *m, ir_op *n, int *slot)
{
    if (n->n_in != 3)
        return 0;
    for (*slot = 1; *slot >= 0; (*slot)--) {
        if (*slot == 0 && ir_op_attr_float(n, "alpha", 1.0) != 1.0)
            return 0;
        const ir_value *b = n->in[*slot];
        ir_op *add = b->kind == IR_VALUE_OP ? b->def : NULL;
        if (add && add->kind == IR_OP_ADD && ir_op_attr_float(add, "alpha", 1.0) == 1.0 &&
            add->stream == n->stream && ir_type_equal(&add->in[0]->type, &b->type) &&
            ir_type_equal(&add->in[1]->type, &b->type) && ir_module_single_user(m, b) == n &&
            n->in[1 - *slot] != b)
            return 1;
    }
    return 0;
}

moec_status pass_fuse_add3_rms_norm(ir_module *m, const pass_options *opt)
{
    (void)opt;
    int changed = 0;
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *n = m->ops[i];
        int slot;
        if (n->kind != IR_OP_ADD_RMS_NORM || !fusable_sum(m, n, &slot))
            continue;
        ir_op *add = n->in[slot]->def;
        if (slot == 0)
            n->in[0] = n->in[1];
        n->in[1] = add->in[0];
        n->in[3] = add->in[1];
        n->n_in = 4;
        moec_status st = ir_op_finish(m, n, NULL);
        if (st != MOEC_OK)
            return moec_err_wrap(st, "fuse_add3_rms_norm %%%s", n->out[0]->name);
        changed = 1;
    }
    return changed ? ir_module_dce(m) : MOEC_OK;
}
