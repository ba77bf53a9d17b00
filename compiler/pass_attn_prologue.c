/* pass_attn_prologue.c — fuse_attn_prologue: what grouped-query attention
 * (Qwen2-MoE, Qwen3-MoE) does between the fused qkv projection and the
 * attention becomes one op (docs/IR.md, "attn_prologue"), so one kernel
 * reads a token's row of the projection once, normalizes and rotates q and
 * k, and writes q, k, v and the cache rows the attention reads, where the
 * slices, the q/k RMSNorms, the two ropes and the attention's cache write
 * were a kernel each (issue 15: at batch 1 a decode step is mostly kernel
 * boundaries).
 *
 * From each attention(q_rot, k_rot, v, pos) back:
 *   q_rot = rope([rms_norm](reshape(q_flat)), pos), q_flat columns
 *           [0, H D) of a [T, N] value X;
 *   k_rot the same of k_flat, columns [H D, (H + Hkv) D) of X;
 *   v     = reshape(v_flat), columns [(H + Hkv) D, (H + 2 Hkv) D) of X.
 * Both norms (Qwen3, with the same eps) or neither (Qwen2); both ropes with
 * the same attributes (rotary_dim included) at the attention's positions.
 * The new op's results take q_rot's, k_rot's and v's names and users; what
 * only they read is dropped. Anything else (another layout, one norm, ropes
 * that disagree, a token selection) is left alone. Matched by structure,
 * never by value names, so that a sharded module (pass shard: a rank's
 * heads) fuses alike. */
#include <string.h>

#include "compiler/passes.h"
#include "err.h"

/* q's or k's path, or v's (no rope, no norm), as found. */
typedef struct pro_side {
    ir_op *rope, *norm;
    ir_value *base;
    int64_t col, heads, dim;
} pro_side;

/* x [T, h, D] = reshape of D h columns of a [T, N] value: into s. */
static int match_heads(ir_value *x, pro_side *s)
{
    ir_op *rs = pass_def_of(x, IR_OP_RESHAPE);
    if (!pass_is_act(x, 3) || !rs || !pass_is_act(rs->in[0], 2))
        return 0;
    s->heads = x->type.dims[1];
    s->dim = x->type.dims[2];
    s->base = pass_col_base(rs->in[0], &s->col);
    return pass_is_act(s->base, 2);
}

/* v = rope(rms_norm?(heads), pos): into s. */
static int match_rotated(ir_value *v, const ir_value *pos, pro_side *s)
{
    s->rope = pass_def_of(v, IR_OP_ROPE);
    if (!s->rope || s->rope->in[1] != pos || !pass_is_act(v, 3))
        return 0;
    ir_value *x = s->rope->in[0];
    s->norm = pass_def_of(x, IR_OP_RMS_NORM);
    if (s->norm) {
        const ir_value *w = s->norm->in[1];
        if (w->type.rank != 1 || w->type.dims[0] == IR_DIM_T)
            return 0;
        x = s->norm->in[0];
    }
    return match_heads(x, s);
}

/* One attention's prologue, as found. */
typedef struct pro_site {
    pro_side q, k, v;
} pro_site;

static moec_status prologue_attrs(ir_module *m, ir_op *op, const void *user)
{
    const pro_site *s = user;
    MOEC_TRY(ir_op_set_int(m, op, "heads", s->q.heads));
    MOEC_TRY(ir_op_set_int(m, op, "kv_heads", s->k.heads));
    MOEC_TRY(ir_op_set_int(m, op, "head_dim", s->q.dim));
    if (s->q.norm)
        MOEC_TRY(ir_op_set_float(m, op, "eps", ir_op_attr_float(s->q.norm, "eps", 0)));
    return pass_copy_rope_attrs(m, op, s->q.rope, 1, "fuse_attn_prologue");
}

/* Rewrites the prologue of attention op att, when it matches. */
static moec_status fuse_site(ir_module *m, ir_op *att)
{
    pro_site s;
    memset(&s, 0, sizeof s);
    ir_value *pos = att->in[3];
    if (!match_rotated(att->in[0], pos, &s.q) || !match_rotated(att->in[1], pos, &s.k) ||
        !match_heads(att->in[2], &s.v))
        return MOEC_OK;
    int64_t H = s.q.heads, Hkv = s.k.heads, D = s.q.dim;
    if (s.k.base != s.q.base || s.v.base != s.q.base || s.k.dim != D || s.v.dim != D ||
        s.v.heads != Hkv || H % Hkv || s.q.col != 0 || s.k.col != H * D ||
        s.v.col != (H + Hkv) * D || !pass_ropes_agree(s.q.rope, s.k.rope, 1))
        return MOEC_OK;
    if (!s.q.norm != !s.k.norm ||
        (s.q.norm &&
         ir_op_attr_float(s.q.norm, "eps", -1) != ir_op_attr_float(s.k.norm, "eps", -2)))
        return MOEC_OK;
    ir_value *in[4] = {s.q.base, pos, NULL, NULL};
    int n_in = 2;
    if (s.q.norm) {
        in[n_in++] = s.q.norm->in[1];
        in[n_in++] = s.k.norm->in[1];
    }
    ir_value *old[3] = {att->in[0], att->in[1], att->in[2]};
    return pass_replace_values(m, IR_OP_ATTN_PROLOGUE, in, n_in, old, 3, NULL, prologue_attrs, &s,
                               "fuse_attn_prologue");
}

moec_status pass_fuse_attn_prologue(ir_module *m, const pass_options *opt)
{
    (void)opt;
    /* ops move and die as sites are rewritten: go by the attention ops'
       result names, found again each time */
    for (int i = 0; i < m->n_ops; i++) {
        ir_op *att = m->ops[i];
        if (att->kind != IR_OP_ATTENTION || att->n_in != 4)
            continue;
        const char *name = att->out[0]->name;
        MOEC_TRY(fuse_site(m, att));
        const ir_value *v = ir_module_find_value(m, name);
        if (!v || !v->def)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "fuse_attn_prologue: %%%s is gone", name);
        i = v->def->id;
    }
    return MOEC_OK;
}
