/* pass_dsa.c — fuse_dsa_indexer: DeepSeek-V3.2's lightning indexer in
 * three kernels a layer instead of nine (issue 12: at batch 1 the sparse
 * step lost to dense MLA on the indexer's launches).
 *
 * From each dsa_topk(q, k, w, pos) back:
 *   key:  k = [reshape] rope([reshape] layer_norm(k_raw)) {rotating a head
 *         [1, D] at pos}, k_raw columns [col, col + D) of a [T, N] value B
 *         (slices of it; or B itself, col 0, when wk is a linear of its own,
 *         as in fp8 checkpoints): one dsa_prologue_k(B, pos, ln weight, ln bias)
 *         {col, eps, the rope's attributes}, which on the GPU also writes the
 *         key into dsa_topk's cache (docs/IR.md, "dsa_prologue_k").
 *   q:    q = rope(q0) at pos: dsa_topk rotates q itself (the rope's
 *         attributes on dsa_topk). When q0 = reshape(q_flat [T, Hi * Di])
 *         dsa_topk reads q_flat's and w's rows where slices took them from
 *         ({heads, q_col, w_col}), so neither slice copies.
 * The new ops' results take the values' names and users; what only they
 * read is dropped. Matched by structure, never by value names. */
#include <stdio.h>
#include <string.h>

#include "compiler/passes.h"
#include "err.h"

static ir_value *skip_reshapes(ir_value *v)
{
    for (ir_op *r = pass_def_of(v, IR_OP_RESHAPE); r; r = pass_def_of(v, IR_OP_RESHAPE))
        v = r->in[0];
    return v;
}

/* Adds op `kind` (operands in, one result replacing `old` under its name),
 * placed before `anchor`; set_attrs sets its attributes. */
static moec_status replace_with(ir_module *m, ir_op_kind kind, ir_value *const *in, int n_in,
                                ir_value *old, const ir_op *anchor, pass_attr_fn set_attrs,
                                const void *user)
{
    return pass_replace_values(m, kind, in, n_in, &old, 1, anchor, set_attrs, user,
                               "fuse_dsa_indexer");
}

/* ---- the key --------------------------------------------------------------- */

typedef struct key_site {
    ir_op *rope, *ln;
    ir_value *base;
    int64_t col;
} key_site;

static moec_status key_attrs(ir_module *m, ir_op *op, const void *user)
{
    const key_site *s = user;
    MOEC_TRY(ir_op_set_int(m, op, "col", s->col));
    MOEC_TRY(ir_op_set_float(m, op, "eps", ir_op_attr_float(s->ln, "eps", 0)));
    return pass_copy_rope_attrs(m, op, s->rope, 1, "fuse_dsa_indexer");
}

/* dsa_topk d's key path, when it matches: one dsa_prologue_k. */
static moec_status fuse_key(ir_module *m, ir_op *d)
{
    key_site s;
    ir_value *k = d->in[1], *pos = d->in[3];
    s.rope = pass_def_of(skip_reshapes(k), IR_OP_ROPE);
    if (!s.rope || s.rope->in[1] != pos || !pass_is_act(s.rope->in[0], 3) ||
        s.rope->in[0]->type.dims[1] != 1)
        return MOEC_OK;
    s.ln = pass_def_of(skip_reshapes(s.rope->in[0]), IR_OP_LAYER_NORM);
    if (!s.ln || !pass_is_act(s.ln->in[0], 2) || !pass_is_act(k, 2))
        return MOEC_OK;
    /* k_raw's columns of the fused projection (or k_raw itself, column 0,
       where wk stays a linear of its own: fp8 blocks keep it out of qkv_a) */
    s.base = pass_col_base(s.ln->in[0], &s.col);
    if (!pass_is_act(s.base, 2))
        return MOEC_OK;
    ir_value *in[4] = {s.base, pos, s.ln->in[1], s.ln->in[2]};
    return replace_with(m, IR_OP_DSA_PROLOGUE_K, in, 4, k, s.ln, key_attrs, &s);
}

/* ---- q and the head weights ------------------------------------------------ */

typedef struct q_site {
    const ir_op *d, *rope;
    int rows;
    int64_t heads, q_col, w_col;
} q_site;

static moec_status topk_attrs(ir_module *m, ir_op *op, const void *user)
{
    const q_site *s = user;
    static const char *const keys[] = {"top_k", "scale", "weight_scale"};
    for (int i = 0; i < 3; i++) {
        const ir_attr *a = ir_op_attr(s->d, keys[i]);
        if (a && a->kind == IR_ATTR_INT)
            MOEC_TRY(ir_op_set_int(m, op, a->key, a->i));
        else if (a && a->kind == IR_ATTR_FLOAT)
            MOEC_TRY(ir_op_set_float(m, op, a->key, a->f));
    }
    if (s->rows) {
        MOEC_TRY(ir_op_set_int(m, op, "heads", s->heads));
        MOEC_TRY(ir_op_set_int(m, op, "q_col", s->q_col));
        MOEC_TRY(ir_op_set_int(m, op, "w_col", s->w_col));
    }
    return pass_copy_rope_attrs(m, op, s->rope, 1, "fuse_dsa_indexer");
}

/* dsa_topk d's q rope, and the slices of q and w, into a new dsa_topk. */
static moec_status fuse_q(ir_module *m, ir_op *d)
{
    q_site s;
    memset(&s, 0, sizeof s);
    s.d = d;
    ir_value *q = d->in[0], *w = d->in[2], *pos = d->in[3];
    s.rope = pass_def_of(q, IR_OP_ROPE);
    if (!s.rope || s.rope->in[1] != pos || !pass_is_act(s.rope->in[0], 3) ||
        ir_op_attr(d, "heads") || ir_op_attr(d, "style"))
        return MOEC_OK;
    ir_value *q0 = s.rope->in[0], *qb = q0, *wb = w;
    ir_op *rs = pass_def_of(q0, IR_OP_RESHAPE);
    if (rs && pass_is_act(rs->in[0], 2) && pass_is_act(w, 2)) {
        qb = pass_col_base(rs->in[0], &s.q_col);
        wb = pass_col_base(w, &s.w_col);
        s.rows = pass_is_act(qb, 2) && pass_is_act(wb, 2);
        s.heads = q0->type.dims[1];
        if (!s.rows) {
            qb = q0;
            wb = w;
        }
    }
    ir_value *in[4] = {qb, d->in[1], wb, pos};
    return replace_with(m, IR_OP_DSA_TOPK, in, 4, d->out[0], d, topk_attrs, &s);
}

moec_status pass_fuse_dsa_indexer(ir_module *m, const pass_options *opt)
{
    (void)opt;
    /* ops move and die as sites are rewritten: go by the dsa_topk ops'
       result names, found again each time */
    for (int i = 0; i < m->n_ops; i++) {
        if (m->ops[i]->kind != IR_OP_DSA_TOPK || m->ops[i]->n_in != 4)
            continue;
        const char *name = m->ops[i]->out[0]->name;
        MOEC_TRY(fuse_key(m, m->ops[i]));
        const ir_value *v = ir_module_find_value(m, name);
        if (!v || !v->def)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "fuse_dsa_indexer: %%%s is gone", name);
        MOEC_TRY(fuse_q(m, v->def));
        v = ir_module_find_value(m, name);
        if (!v || !v->def)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "fuse_dsa_indexer: %%%s is gone", name);
        i = v->def->id;
    }
    return MOEC_OK;
}
