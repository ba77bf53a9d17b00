/* pass_mla.c — absorb_mla: DeepSeek's multi-head latent attention as the
 * frontend writes it (kv_b_proj up-projects the cached latent kv_c into full
 * per-head keys and values, then plain attention) becomes attention over the
 * compressed cache itself: the k up-projection is absorbed into the query
 * (mla_qabsorb) and the v up-projection into the output (mla_vabsorb), so the
 * KV cache holds only kv_c and the shared rotary key k_pe — the reason MLA
 * decode is cheap. The pattern is matched on structure, not names, so it
 * holds whether or not the fusion passes ran first.
 *
 * Absorption can also be done at load time ("folded": W_UK multiplied into
 * the q projection, W_UV into o_proj). The pass weighs both by the bytes a
 * decode step reads at the compiled batch sizes and records the choice and
 * the numbers in the module metas mla_absorb and mla_absorb_why.
 *
 * An fp8 kv_b_proj (block-scaled) becomes a weight of the compute dtype,
 * still bound to its fp8 codes and scales: the loader dequantizes it, and the
 * absorb ops read W_UK and W_UV as any other weight. It is read once per step
 * at r x H*(dn+dv), small beside the layer's fp8 projections. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/passes.h"
#include "err.h"

/* One MLA attention found in the module, with its dimensions. */
typedef struct mla_site {
    ir_op *att;                                     /* the attention op */
    ir_value *q_nope, *q_pe, *kv_c, *k_pe, *kv_b, *pos;
    ir_value *sel; /* DSA's token selection (dsa_topk), or NULL */
    int64_t H, dn, dr, dv, r;
    int64_t q_in;   /* columns of the q projection (q_lora_rank or hidden) */
    int64_t hidden; /* rows of o_proj */
} mla_site;

/* Weight elements and activation elements per token that one MLA layer's
 * projections read and write in each absorption form. */
typedef struct mla_cost {
    int64_t runtime_w, folded_w;
    int64_t runtime_a, folded_a;
} mla_cost;

static int slice_is(const ir_op *op, int64_t axis, int64_t start, int64_t size)
{
    return op && ir_op_attr_int(op, "axis", -1) == axis && ir_op_attr_int(op, "start", -1) == start &&
           ir_op_attr_int(op, "size", -1) == size;
}

/* Columns of the linear whose output x is a reshape/slice of, or 0. */
static int64_t projection_columns(const ir_value *x)
{
    for (int hops = 0; x && x->kind == IR_VALUE_OP && x->def && hops < 8; hops++) {
        const ir_op *op = x->def;
        if (op->kind == IR_OP_LINEAR)
            return op->n_in >= 2 && op->in[1]->type.rank == 2 ? op->in[1]->type.dims[1] : 0;
        if (op->kind != IR_OP_SLICE && op->kind != IR_OP_RESHAPE)
            return 0;
        x = op->in[0];
    }
    return 0;
}

/* Matches attention(concat(q_nope, q_pe), concat(k_nope, expand(k_pe)), v, pos
 * [, sel]) with k_nope and v the two slices of reshape(linear(kv_c, kv_b)). */
static int match_site(const ir_module *m, ir_op *att, mla_site *s)
{
    memset(s, 0, sizeof *s);
    if (att->kind != IR_OP_ATTENTION || att->n_in < 4 || att->n_in > 5 || att->n_out != 1)
        return 0;
    ir_op *qc = pass_def_of(att->in[0], IR_OP_CONCAT), *kc = pass_def_of(att->in[1], IR_OP_CONCAT);
    if (!qc || !kc || qc->n_in != 2 || kc->n_in != 2 || ir_op_attr_int(qc, "axis", -1) != 2 ||
        ir_op_attr_int(kc, "axis", -1) != 2)
        return 0;
    ir_value *q_nope = qc->in[0], *q_pe = qc->in[1], *k_nope = kc->in[0], *v = att->in[2];
    ir_op *ex = pass_def_of(kc->in[1], IR_OP_EXPAND);
    ir_op *sk = pass_def_of(k_nope, IR_OP_SLICE), *sv = pass_def_of(v, IR_OP_SLICE);
    if (!ex || !sk || !sv || sk->in[0] != sv->in[0])
        return 0;
    ir_value *k_pe = ex->in[0], *kv = sk->in[0];
    if (!pass_is_act(q_nope, 3) || !pass_is_act(q_pe, 3) || !pass_is_act(k_pe, 3) || !pass_is_act(kv, 3) ||
        !pass_is_act(v, 3) || !pass_is_act(att->out[0], 3))
        return 0;
    int64_t H = q_nope->type.dims[1], dn = q_nope->type.dims[2], dr = q_pe->type.dims[2];
    int64_t dv = v->type.dims[2];
    if (q_pe->type.dims[1] != H || k_pe->type.dims[1] != 1 || k_pe->type.dims[2] != dr ||
        kv->type.dims[1] != H || kv->type.dims[2] != dn + dv || v->type.dims[1] != H ||
        !slice_is(sk, 2, 0, dn) || !slice_is(sv, 2, dn, dv))
        return 0;
    ir_op *rs = pass_def_of(kv, IR_OP_RESHAPE);
    ir_op *lin = rs ? pass_def_of(rs->in[0], IR_OP_LINEAR) : NULL;
    if (!lin || lin->n_in != 2 || ir_op_attr_float(lin, "alpha", 1.0) != 1.0 ||
        !pass_is_act(rs->in[0], 2) || rs->in[0]->type.dims[1] != H * (dn + dv))
        return 0;
    ir_value *kv_c = lin->in[0], *kv_b = lin->in[1];
    if (!pass_is_act(kv_c, 2) || kv_b->kind != IR_VALUE_WEIGHT || kv_b->type.rank != 2 ||
        kv_b->type.dims[0] != H * (dn + dv) || kv_b->type.dims[1] != kv_c->type.dims[1])
        return 0;
    s->att = att;
    s->q_nope = q_nope;
    s->q_pe = q_pe;
    s->kv_c = kv_c;
    s->k_pe = k_pe;
    s->kv_b = kv_b;
    s->pos = att->in[3];
    s->sel = att->n_in > 4 ? att->in[4] : NULL;
    s->H = H;
    s->dn = dn;
    s->dr = dr;
    s->dv = dv;
    s->r = kv_c->type.dims[1];
    /* q_nope = slice(reshape(q projection [T, H*(dn+dr)])) */
    ir_op *qs = pass_def_of(q_nope, IR_OP_SLICE);
    ir_op *qr = qs ? pass_def_of(qs->in[0], IR_OP_RESHAPE) : NULL;
    s->q_in = qr ? projection_columns(qr->in[0]) : 0;
    if (!s->q_in)
        s->q_in = ir_module_meta_int(m, "hidden_size", 0);
    /* the result goes reshape -> o_proj linear [hidden, H*dv] */
    ir_op *orsh = ir_module_single_user(m, att->out[0]);
    ir_op *olin = orsh && orsh->kind == IR_OP_RESHAPE ? ir_module_single_user(m, orsh->out[0]) : NULL;
    if (olin && olin->kind == IR_OP_LINEAR && olin->in[0] == orsh->out[0] &&
        olin->in[1]->type.rank == 2)
        s->hidden = olin->in[1]->type.dims[0];
    else
        s->hidden = ir_module_meta_int(m, "hidden_size", 0);
    return 1;
}

static mla_cost site_cost(const mla_site *s)
{
    int64_t H = s->H, dn = s->dn, dr = s->dr, dv = s->dv, r = s->r;
    mla_cost c;
    /* runtime: q projection, kv_b (read by both absorb ops: once per step,
     * counted once) and o_proj as they are */
    c.runtime_w = H * (dn + dr) * s->q_in + H * (dn + dv) * r + s->hidden * H * dv;
    /* folded: q projection [H*(r+dr), q_in] and o_proj [hidden, H*r] */
    c.folded_w = H * (r + dr) * s->q_in + s->hidden * H * r;
    /* activations per token that differ: runtime writes q [H*(dn+dr)], then
     * q_nope in / q_c out, o_c in / o out, o_proj reads o; folded writes
     * q [H*(r+dr)] and o_proj reads o_c */
    c.runtime_a = H * (dn + dr) + H * dn + H * r + H * r + H * dv + H * dv;
    c.folded_a = H * (r + dr) + H * r;
    return c;
}

static const char *new_name(ir_module *m, const ir_value *like, const char *what)
{
    char base[256];
    const char *dot = strrchr(like->name, '.');
    int keep = dot ? (int)(dot - like->name) : (int)strlen(like->name);
    snprintf(base, sizeof base, "%.*s.%s", keep, like->name, what);
    return ir_module_unique_name(m, base);
}

static moec_status add_placed(ir_module *m, ir_op_kind kind, ir_value *const *in, int n_in,
                              const char *name, const ir_op *anchor, ir_op **out)
{
    if (!name)
        return MOEC_ERR(MOEC_ERR_OOM, "absorb_mla: out of memory naming a value");
    const char *names[1] = {name};
    ir_op *op = ir_module_add_op(m, kind, in, n_in, names, 1);
    if (!op)
        return moec_err_wrap(MOEC_ERR_INTERNAL, "absorb_mla: adding %s %%%s", ir_op_name(kind), name);
    *out = op;
    return ir_module_move_op_before(m, op, anchor);
}

static moec_status rewrite_site(ir_module *m, const mla_site *s)
{
    ir_op *att = s->att, *qa, *ma, *va;
    ir_value *in_q[2] = {s->q_nope, s->kv_b};
    MOEC_TRY(add_placed(m, IR_OP_MLA_QABSORB, in_q, 2, new_name(m, att->out[0], "q_c"), att, &qa));
    MOEC_TRY(ir_op_set_int(m, qa, "qk_nope_head_dim", s->dn));
    MOEC_TRY(ir_op_set_int(m, qa, "v_head_dim", s->dv));
    MOEC_TRY(ir_op_finish(m, qa, NULL));

    ir_value *in_a[6] = {qa->out[0], s->q_pe, s->kv_c, s->k_pe, s->pos, s->sel};
    MOEC_TRY(add_placed(m, IR_OP_MLA_ATTENTION, in_a, s->sel ? 6 : 5,
                        new_name(m, att->out[0], "o_c"), att, &ma));
    MOEC_TRY(ir_op_set_float(m, ma, "scale", ir_op_attr_float(att, "scale", 0)));
    if (ir_op_attr(att, "window"))
        MOEC_TRY(ir_op_set_int(m, ma, "window", ir_op_attr_int(att, "window", 0)));
    MOEC_TRY(ir_op_finish(m, ma, NULL));

    /* The absorbed result takes the attention result's name; the old value
     * is renamed and dropped with the rest. */
    ir_value *old = att->out[0];
    const char *keep = old->name;
    char dead[256];
    snprintf(dead, sizeof dead, "%s.unabsorbed", keep);
    const char *dead_name = ir_module_unique_name(m, dead);
    if (!dead_name)
        return MOEC_ERR(MOEC_ERR_OOM, "absorb_mla: out of memory renaming %%%s", keep);
    ir_value_rename(m, old, dead_name);
    ir_value *in_v[2] = {ma->out[0], s->kv_b};
    MOEC_TRY(add_placed(m, IR_OP_MLA_VABSORB, in_v, 2, keep, att, &va));
    MOEC_TRY(ir_op_set_int(m, va, "qk_nope_head_dim", s->dn));
    MOEC_TRY(ir_op_set_int(m, va, "v_head_dim", s->dv));
    MOEC_TRY(ir_op_finish(m, va, NULL));
    if (!ir_type_equal(&va->out[0]->type, &old->type))
        return MOEC_ERR(MOEC_ERR_INTERNAL, "absorb_mla: %%%s: absorbed result type differs", keep);
    ir_module_replace_uses(m, old, va->out[0]);
    return MOEC_OK;
}

/* kv_b, if kept in fp8, to be dequantized at load into the compute dtype. */
static void dequantize_kv_b(ir_value *kv_b, const pass_options *opt)
{
    if (kv_b->type.dtype == IR_DTYPE_F8E4M3)
        kv_b->type.dtype = opt->compute_dtype;
}

/* Records the decision and its numbers in the metas. */
static moec_status record_decision(ir_module *m, const pass_options *opt, const mla_site *first,
                                   int n_layers, mla_cost total)
{
    size_t es = ir_dtype_size(opt->compute_dtype);
    int nb = opt->n_buckets > 0 ? opt->n_buckets : 1;
    int64_t run_b = 0, fold_b = 0;
    int b_lo = 1, b_hi = 1;
    for (int i = 0; i < nb; i++) {
        int64_t B = opt->n_buckets > 0 ? opt->buckets[i] : 1;
        if (i == 0 || B < b_lo)
            b_lo = (int)B;
        if (i == 0 || B > b_hi)
            b_hi = (int)B;
        run_b += (int64_t)es * (total.runtime_w + B * total.runtime_a);
        fold_b += (int64_t)es * (total.folded_w + B * total.folded_a);
    }
    char why[1024];
    int n = snprintf(why, sizeof why,
                     "runtime reads %" PRId64 " weight elements per decode step, folded %" PRId64
                     " (%" PRId64 " and %" PRId64 " per layer, %d MLA layers; r=%" PRId64
                     " %s dn=%" PRId64 ", H=%" PRId64 ", dr=%" PRId64 ", dv=%" PRId64
                     ", q_in=%" PRId64 ", hidden=%" PRId64 "); with activations, summed over "
                     "batch sizes %d..%d in %s: runtime %" PRId64 " bytes, folded %" PRId64,
                     total.runtime_w, total.folded_w, total.runtime_w / n_layers,
                     total.folded_w / n_layers, n_layers, first->r,
                     first->r > first->dn ? ">" : first->r < first->dn ? "<" : "=", first->dn,
                     first->H, first->dr, first->dv, first->q_in, first->hidden, b_lo, b_hi,
                     ir_dtype_name(opt->compute_dtype), run_b, fold_b);
    if (fold_b < run_b && n > 0 && (size_t)n < sizeof why)
        snprintf(why + n, sizeof why - (size_t)n,
                 "; folded would read fewer bytes but needs load-time weight products "
                 "(W_UK into the q projection, W_UV into o_proj), which the loader does not "
                 "support yet, so the runtime form is emitted");
    MOEC_TRY(ir_module_set_meta_str(m, "mla_absorb", "runtime"));
    return ir_module_set_meta_str(m, "mla_absorb_why", why);
}

moec_status pass_absorb_mla(ir_module *m, const pass_options *opt)
{
    pass_options defaults;
    if (!opt) {
        pass_options_default(&defaults);
        opt = &defaults;
    }
    int n_sites = 0;
    mla_site first = {0};
    mla_cost total = {0, 0, 0, 0};
    /* Ops move as sites are rewritten: collect the attention ops first. */
    int n_att = 0;
    for (int i = 0; i < m->n_ops; i++)
        n_att += m->ops[i]->kind == IR_OP_ATTENTION;
    if (!n_att)
        return MOEC_OK;
    ir_op **atts = malloc(sizeof *atts * (size_t)n_att);
    if (!atts)
        return MOEC_ERR(MOEC_ERR_OOM, "absorb_mla: out of memory");
    for (int i = 0, k = 0; i < m->n_ops; i++)
        if (m->ops[i]->kind == IR_OP_ATTENTION)
            atts[k++] = m->ops[i];
    moec_status st = MOEC_OK;
    for (int k = 0; k < n_att && st == MOEC_OK; k++) {
        mla_site s;
        if (!match_site(m, atts[k], &s))
            continue;
        mla_cost c = site_cost(&s);
        total.runtime_w += c.runtime_w;
        total.folded_w += c.folded_w;
        total.runtime_a += c.runtime_a;
        total.folded_a += c.folded_a;
        if (!n_sites++)
            first = s;
        st = rewrite_site(m, &s);
        dequantize_kv_b(s.kv_b, opt);
    }
    free(atts);
    if (st != MOEC_OK || !n_sites)
        return st;
    MOEC_TRY(ir_module_dce(m));
    return record_decision(m, opt, &first, n_sites, total);
}
