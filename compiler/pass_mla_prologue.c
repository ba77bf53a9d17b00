/* pass_mla_prologue.c — fuse_mla_prologue: what MLA does between the fused
 * q/kv projection and the attention becomes one op (docs/IR.md,
 * "mla_prologue"), so one kernel reads a row of the projection once and
 * writes what the attention and mla_qabsorb read, where the slices, the
 * RMSNorms and the ropes were a kernel each (issue 15: at batch 1 a decode
 * step is mostly kernel boundaries).
 *
 * From each mla_attention(q_c, q_pe_rot, kv_c_norm, k_pe_rot, pos) back:
 *   kv side: kv_c_norm = rms_norm(kv_c), k_pe_rot = rope(reshape(k_pe_flat)),
 *            kv_c and k_pe_flat adjacent columns of one [T, N] value B
 *            (slices of slices of it);
 *   q side:  q_pe_rot = rope(q_pe), q_nope = mla_qabsorb's operand, both
 *            slices of reshape(q_flat) [T, H, dn + dr], q_flat the first
 *            H * (dn + dr) columns of a value Q.
 * Without q LoRA (DeepSeek-V2, V2-Lite) Q is B and the kv columns follow the
 * q ones: one mla_prologue. With it (V3, V3.2) B's first columns are the q
 * latent an rms_norm reads (q_a_norm, which q_b_proj reads): one
 * mla_prologue_kv for it and the kv side, and one mla_prologue_q for the q
 * side after q_b_proj. Columns of B or Q past these (DeepSeek-V3.2's
 * indexer projections) stay where they are, read by their own slices.
 *
 * The attention's mla_qabsorb is then pointed at the q projection itself
 * (heads and head_stride dn + dr: q_nope read in place), so that it no
 * longer waits for the prologue, whose q_nope result nothing reads; on the
 * GPU one launch may run both (codegen/mla_prologue.c).
 *
 * The new op's results take the values' names and users; what only they
 * read is dropped. Both ropes must carry the same attributes (no
 * rotary_dim), the two norms the same eps. Matched by structure, never by
 * value names. */
#include <stdio.h>
#include <string.h>

#include "compiler/passes.h"
#include "err.h"

/* One MLA attention's prologue, as found. */
typedef struct pro_site {
    ir_op *att;
    ir_value *pos;
    /* kv side: kv_norm = rms_norm(kv_c), k_rope = rope(k_pe); kv_c at
       column kv_col of base, k_pe_flat right after it */
    ir_op *kv_norm, *k_rope;
    ir_value *base;
    int64_t kv_col, r;
    /* q side: q_rope = rope(q_pe); q_nope; both of the first columns of q_base */
    ir_op *q_rope;
    ir_value *q_nope, *q_base;
    int q_ok;
    int64_t H, dn, dr;
    /* q LoRA: the rms_norm of base's columns [0, kv_col) */
    ir_op *q_norm;
} pro_site;

/* rope(x [T, h, dr], pos) rotating all dr channels: its input, else NULL. */
static ir_value *full_rope_input(const ir_op *rope)
{
    const ir_value *x = rope->in[0];
    if (!pass_is_act(x, 3) || !pass_is_act(rope->out[0], 3) ||
        ir_op_attr_int(rope, "rotary_dim", x->type.dims[2]) != x->type.dims[2])
        return NULL;
    return rope->in[0];
}

/* The kv side of att into s; 0 when it does not match. */
static int match_kv(ir_op *att, pro_site *s)
{
    s->kv_norm = pass_def_of(att->in[2], IR_OP_RMS_NORM);
    s->k_rope = pass_def_of(att->in[3], IR_OP_ROPE);
    if (!s->kv_norm || !s->k_rope || s->k_rope->in[1] != s->pos)
        return 0;
    ir_value *kv_c = s->kv_norm->in[0], *k_pe = full_rope_input(s->k_rope);
    ir_op *rs = k_pe ? pass_def_of(k_pe, IR_OP_RESHAPE) : NULL;
    if (!pass_is_act(kv_c, 2) || !rs || !pass_is_act(rs->in[0], 2) || k_pe->type.dims[1] != 1)
        return 0;
    int64_t c_col, p_col;
    ir_value *b = pass_col_base(kv_c, &c_col), *bp = pass_col_base(rs->in[0], &p_col);
    s->r = kv_c->type.dims[1];
    s->dr = k_pe->type.dims[2];
    if (b != bp || b == kv_c || !pass_is_act(b, 2) || p_col != c_col + s->r || s->dr % 2)
        return 0;
    s->base = b;
    s->kv_col = c_col;
    return 1;
}

/* The q side of att into s: q_pe and q_nope the two slices of one
 * reshape(q_flat) [T, H, dn + dr], q_flat the first columns of q_base. */
static void match_q(ir_op *att, pro_site *s)
{
    s->q_ok = 0;
    ir_op *qa = pass_def_of(att->in[0], IR_OP_MLA_QABSORB);
    s->q_rope = pass_def_of(att->in[1], IR_OP_ROPE);
    if (!qa || !s->q_rope || !pass_ropes_agree(s->q_rope, s->k_rope, 0))
        return;
    ir_value *q_pe = full_rope_input(s->q_rope);
    s->q_nope = qa->in[0];
    ir_op *sp = q_pe ? pass_def_of(q_pe, IR_OP_SLICE) : NULL, *sn = pass_def_of(s->q_nope, IR_OP_SLICE);
    if (!sp || !sn || sp->in[0] != sn->in[0] || !pass_is_act(s->q_nope, 3))
        return;
    ir_value *q = sp->in[0];
    ir_op *rs = pass_def_of(q, IR_OP_RESHAPE);
    if (!pass_is_act(q, 3) || !rs || !pass_is_act(rs->in[0], 2))
        return;
    s->H = q->type.dims[1];
    s->dn = s->q_nope->type.dims[2];
    if (q->type.dims[2] != s->dn + s->dr || q_pe->type.dims[2] != s->dr ||
        ir_op_attr_int(sn, "axis", 0) != 2 || ir_op_attr_int(sn, "start", -1) != 0 ||
        ir_op_attr_int(sp, "axis", 0) != 2 || ir_op_attr_int(sp, "start", -1) != s->dn)
        return;
    int64_t col;
    s->q_base = pass_col_base(rs->in[0], &col);
    s->q_ok = col == 0 && pass_is_act(s->q_base, 2);
}

/* q LoRA: the rms_norm of base's columns [0, kv_col), with the kv norm's eps. */
static ir_op *find_q_norm(const ir_module *m, const pro_site *s)
{
    if (s->kv_col < 1)
        return NULL;
    double eps = ir_op_attr_float(s->kv_norm, "eps", -1);
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *n = m->ops[i];
        int64_t col;
        if (n->kind == IR_OP_RMS_NORM && pass_is_act(n->in[0], 2) &&
            n->in[0]->type.dims[1] == s->kv_col && pass_col_base(n->in[0], &col) == s->base &&
            col == 0 && ir_op_attr_float(n, "eps", -2) == eps)
            return n;
    }
    return NULL;
}

/* The prologue op being built: the site and its kind. */
typedef struct pro_build {
    const pro_site *s;
    ir_op_kind kind;
} pro_build;

/* The prologue op's attributes: the ropes' and those of its kind. */
static moec_status prologue_attrs(ir_module *m, ir_op *op, const void *user)
{
    const pro_build *b = user;
    const pro_site *s = b->s;
    if (b->kind != IR_OP_MLA_PROLOGUE_KV) {
        MOEC_TRY(ir_op_set_int(m, op, "heads", s->H));
        MOEC_TRY(ir_op_set_int(m, op, "qk_nope_head_dim", s->dn));
    }
    MOEC_TRY(ir_op_set_int(m, op, "qk_rope_head_dim", s->dr));
    if (b->kind != IR_OP_MLA_PROLOGUE_Q)
        MOEC_TRY(ir_op_set_float(m, op, "eps", ir_op_attr_float(s->kv_norm, "eps", 0)));
    return pass_copy_rope_attrs(m, op, s->k_rope, 0, "fuse_mla_prologue");
}

/* Adds the prologue op `kind` (operands in, results replacing `old`, each
 * value's name taken over), placed before the first op defining one of
 * them. */
static moec_status add_prologue(ir_module *m, const pro_site *s, ir_op_kind kind,
                                ir_value *const *in, int n_in, ir_value *const *old, int n_out)
{
    pro_build b = {s, kind};
    return pass_replace_values(m, kind, in, n_in, old, n_out, NULL, prologue_attrs, &b,
                               "fuse_mla_prologue");
}

/* mla_qabsorb's attributes as it reads the q projection in place. */
static moec_status qabsorb_attrs(ir_module *m, ir_op *op, const void *user)
{
    const pro_site *s = user;
    const ir_op *qa = s->att->in[0]->def;
    MOEC_TRY(ir_op_set_int(m, op, "qk_nope_head_dim", s->dn));
    MOEC_TRY(ir_op_set_int(m, op, "v_head_dim", ir_op_attr_int(qa, "v_head_dim", 0)));
    MOEC_TRY(ir_op_set_int(m, op, "heads", s->H));
    return ir_op_set_int(m, op, "head_stride", s->dn + s->dr);
}

/* The q side's mla_qabsorb then reads q_nope where it lies in the q
 * projection (heads of dn + dr columns from column 0 of q_base) instead of
 * the prologue's copy, which nothing reads any more: the absorption no
 * longer waits for the prologue, so the two may run as one launch
 * (codegen/mla_prologue.c). */
static moec_status qabsorb_in_place(ir_module *m, const pro_site *s)
{
    ir_op *qa = pass_def_of(s->att->in[0], IR_OP_MLA_QABSORB);
    if (!qa || ir_op_attr(qa, "head_stride"))
        return MOEC_OK;
    ir_value *in[2] = {s->q_base, qa->in[1]};
    ir_value *old[1] = {qa->out[0]};
    return pass_replace_values(m, IR_OP_MLA_QABSORB, in, 2, old, 1, NULL, qabsorb_attrs, s,
                               "fuse_mla_prologue");
}

/* Rewrites the prologue of attention op att, when it matches. */
static moec_status fuse_site(ir_module *m, ir_op *att)
{
    pro_site s;
    memset(&s, 0, sizeof s);
    s.att = att;
    s.pos = att->in[4];
    if (!match_kv(att, &s))
        return MOEC_OK;
    match_q(att, &s);
    if (s.q_ok && s.q_base == s.base && s.kv_col == s.H * (s.dn + s.dr)) {
        ir_value *in[3] = {s.base, s.pos, s.kv_norm->in[1]};
        ir_value *old[4] = {s.q_nope, s.q_rope->out[0], s.kv_norm->out[0], s.k_rope->out[0]};
        MOEC_TRY(add_prologue(m, &s, IR_OP_MLA_PROLOGUE, in, 3, old, 4));
        return qabsorb_in_place(m, &s);
    }
    /* the q side first: the kv side's op moves values the q side's match saw */
    ir_op *q_norm = find_q_norm(m, &s);
    if (s.q_ok && s.q_base != s.base) {
        ir_value *in[2] = {s.q_base, s.pos};
        ir_value *old[2] = {s.q_nope, s.q_rope->out[0]};
        MOEC_TRY(add_prologue(m, &s, IR_OP_MLA_PROLOGUE_Q, in, 2, old, 2));
        MOEC_TRY(qabsorb_in_place(m, &s));
    }
    if (q_norm) {
        ir_value *in[4] = {s.base, s.pos, s.kv_norm->in[1], q_norm->in[1]};
        ir_value *old[3] = {q_norm->out[0], s.kv_norm->out[0], s.k_rope->out[0]};
        return add_prologue(m, &s, IR_OP_MLA_PROLOGUE_KV, in, 4, old, 3);
    }
    return MOEC_OK;
}

moec_status pass_fuse_mla_prologue(ir_module *m, const pass_options *opt)
{
    (void)opt;
    /* ops move and die as sites are rewritten: go by the attention ops'
       result names, found again each time */
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *att = m->ops[i];
        if (att->kind != IR_OP_MLA_ATTENTION || att->n_in < 5)
            continue;
        const char *name = att->out[0]->name;
        MOEC_TRY(fuse_site(m, att));
        const ir_value *v = ir_module_find_value(m, name);
        if (!v || !v->def)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "fuse_mla_prologue: %%%s is gone", name);
        i = v->def->id;
    }
    return MOEC_OK;
}
