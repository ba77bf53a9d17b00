/* ir_ops.c — the op table (name, operand and result counts, attributes with
 * their kind and whether they are required), attribute lookup, and shape
 * and dtype inference for every op: the one place that says which operands
 * an op accepts and what it produces (docs/IR.md, "Ops"). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "ir/ir_internal.h"

#define OP_MAX_ATTR_SPECS 16

typedef struct attr_spec {
    const char *key;
    ir_attr_kind kind;
    int required;
} attr_spec;

typedef struct op_info {
    const char *name;
    int min_in, max_in, n_out;
    attr_spec attrs[OP_MAX_ATTR_SPECS];
} op_info;

/* rope's attributes, which the MLA prologue ops take too (docs/IR.md, rope). */
#define ROPE_ATTRS                                                                               \
    {"style", IR_ATTR_STR, 1}, {"theta", IR_ATTR_FLOAT, 1}, {"scaling", IR_ATTR_STR, 0},           \
        {"factor", IR_ATTR_FLOAT, 0}, {"yarn_low", IR_ATTR_FLOAT, 0},                            \
        {"yarn_high", IR_ATTR_FLOAT, 0}, {"attn_factor", IR_ATTR_FLOAT, 0}

/* The same, all optional: dsa_topk's rope of q, present or not as a whole
 * (infer_dsa_topk checks them like rope's once one is there). */
#define ROPE_ATTRS_OPT                                                                           \
    {"style", IR_ATTR_STR, 0}, {"theta", IR_ATTR_FLOAT, 0}, {"scaling", IR_ATTR_STR, 0},           \
        {"factor", IR_ATTR_FLOAT, 0}, {"yarn_low", IR_ATTR_FLOAT, 0},                            \
        {"yarn_high", IR_ATTR_FLOAT, 0}, {"attn_factor", IR_ATTR_FLOAT, 0},                      \
        {"rotary_dim", IR_ATTR_INT, 0}

static const op_info OPS[IR_OP_COUNT] = {
    [IR_OP_EMBEDDING] = {"embedding", 2, 2, 1,
                         {{"vocab_start", IR_ATTR_INT, 0}, {"vocab_size", IR_ATTR_INT, 0}}},
    [IR_OP_RMS_NORM] = {"rms_norm", 2, 2, 1, {{"eps", IR_ATTR_FLOAT, 1}}},
    [IR_OP_LINEAR] = {"linear", 2, 3, 1, {{"alpha", IR_ATTR_FLOAT, 0}, {"act", IR_ATTR_STR, 0}}},
    [IR_OP_RESHAPE] = {"reshape", 1, 1, 1, {{0}}},
    [IR_OP_SLICE] = {"slice", 1, 1, 1,
                     {{"axis", IR_ATTR_INT, 1}, {"start", IR_ATTR_INT, 1}, {"size", IR_ATTR_INT, 1}}},
    [IR_OP_CONCAT] = {"concat", 2, IR_MAX_OPERANDS, 1, {{"axis", IR_ATTR_INT, 1}}},
    [IR_OP_EXPAND] = {"expand", 1, 1, 1, {{0}}},
    [IR_OP_ADD] = {"add", 2, 2, 1, {{"alpha", IR_ATTR_FLOAT, 0}}},
    [IR_OP_MUL] = {"mul", 2, 2, 1, {{0}}},
    [IR_OP_SILU] = {"silu", 1, 1, 1, {{0}}},
    [IR_OP_SIGMOID] = {"sigmoid", 1, 1, 1, {{0}}},
    [IR_OP_ROPE] = {"rope", 2, 2, 1, {ROPE_ATTRS, {"rotary_dim", IR_ATTR_INT, 0}}},
    [IR_OP_ATTENTION] = {"attention", 4, 5, 1,
                         {{"scale", IR_ATTR_FLOAT, 1}, {"window", IR_ATTR_INT, 0}}},
    [IR_OP_MOE_TOPK] = {"moe_topk", 1, 2, 2,
                        {{"scoring", IR_ATTR_STR, 1},
                         {"top_k", IR_ATTR_INT, 1},
                         {"n_group", IR_ATTR_INT, 0},
                         {"topk_group", IR_ATTR_INT, 0},
                         {"group_score", IR_ATTR_STR, 0},
                         {"norm_topk_prob", IR_ATTR_INT, 0},
                         {"scaling", IR_ATTR_FLOAT, 0}}},
    [IR_OP_MOE_EXPERTS] = {"moe_experts", 4, 5, 1, {{"act", IR_ATTR_STR, 0}}},
    [IR_OP_REDUCE_SUM] = {"reduce_sum", 1, 1, 1, {{"axis", IR_ATTR_INT, 1}}},
    [IR_OP_SILU_MUL] = {"silu_mul", 1, 1, 1, {{0}}},
    [IR_OP_MOE_ROUTED] = {"moe_routed", 5, 6, 1,
                          {{"scale", IR_ATTR_FLOAT, 0},
                           {"expert_start", IR_ATTR_INT, 0},
                           {"n_experts", IR_ATTR_INT, 0},
                           {"unsummed", IR_ATTR_INT, 0}}},
    [IR_OP_MLA_QABSORB] = {"mla_qabsorb", 2, 2, 1,
                           {{"qk_nope_head_dim", IR_ATTR_INT, 1},
                            {"v_head_dim", IR_ATTR_INT, 1},
                            {"heads", IR_ATTR_INT, 0},
                            {"head_stride", IR_ATTR_INT, 0}}},
    [IR_OP_MLA_ATTENTION] = {"mla_attention", 5, 6, 1,
                             {{"scale", IR_ATTR_FLOAT, 1}, {"window", IR_ATTR_INT, 0}}},
    [IR_OP_MLA_VABSORB] = {"mla_vabsorb", 2, 2, 1,
                           {{"qk_nope_head_dim", IR_ATTR_INT, 1}, {"v_head_dim", IR_ATTR_INT, 1}}},
    [IR_OP_FORK] = {"fork", 1, 1, 1, {{0}}},
    [IR_OP_JOIN] = {"join", 1, 1, 1, {{0}}},
    [IR_OP_ADD_RMS_NORM] = {"add_rms_norm", 3, 4, 2,
                            {{"eps", IR_ATTR_FLOAT, 1}, {"alpha", IR_ATTR_FLOAT, 0}}},
    [IR_OP_ALL_REDUCE] = {"all_reduce", 1, 1, 1, {{"ranks", IR_ATTR_INT, 1}}},
    [IR_OP_ALL_GATHER] = {"all_gather", 1, 1, 1,
                          {{"axis", IR_ATTR_INT, 1}, {"ranks", IR_ATTR_INT, 1}}},
    [IR_OP_REDUCE_SCATTER] = {"reduce_scatter", 1, 1, 1,
                              {{"axis", IR_ATTR_INT, 1}, {"ranks", IR_ATTR_INT, 1}}},
    [IR_OP_ALL_TO_ALL] = {"all_to_all", 1, 1, 1,
                          {{"axis", IR_ATTR_INT, 1}, {"ranks", IR_ATTR_INT, 1}}},
    [IR_OP_LAYER_NORM] = {"layer_norm", 3, 3, 1, {{"eps", IR_ATTR_FLOAT, 1}}},
    [IR_OP_DSA_TOPK] = {"dsa_topk", 4, 4, 1,
                        {{"top_k", IR_ATTR_INT, 1},
                         {"scale", IR_ATTR_FLOAT, 1},
                         {"weight_scale", IR_ATTR_FLOAT, 1},
                         {"heads", IR_ATTR_INT, 0},
                         {"q_col", IR_ATTR_INT, 0},
                         {"w_col", IR_ATTR_INT, 0},
                         ROPE_ATTRS_OPT}},
    [IR_OP_MLA_PROLOGUE] = {"mla_prologue", 3, 3, 4,
                            {{"heads", IR_ATTR_INT, 1},
                             {"qk_nope_head_dim", IR_ATTR_INT, 1},
                             {"qk_rope_head_dim", IR_ATTR_INT, 1},
                             {"eps", IR_ATTR_FLOAT, 1},
                             ROPE_ATTRS}},
    [IR_OP_MLA_PROLOGUE_KV] = {"mla_prologue_kv", 4, 4, 3,
                               {{"qk_rope_head_dim", IR_ATTR_INT, 1},
                                {"eps", IR_ATTR_FLOAT, 1},
                                ROPE_ATTRS}},
    [IR_OP_MLA_PROLOGUE_Q] = {"mla_prologue_q", 2, 2, 2,
                              {{"heads", IR_ATTR_INT, 1},
                               {"qk_nope_head_dim", IR_ATTR_INT, 1},
                               {"qk_rope_head_dim", IR_ATTR_INT, 1},
                               ROPE_ATTRS}},
    [IR_OP_DSA_PROLOGUE_K] = {"dsa_prologue_k", 4, 4, 1,
                              {{"col", IR_ATTR_INT, 1},
                               {"eps", IR_ATTR_FLOAT, 1},
                               ROPE_ATTRS,
                               {"rotary_dim", IR_ATTR_INT, 0}}},
    [IR_OP_ATTN_PROLOGUE] = {"attn_prologue", 2, 4, 3,
                             {{"heads", IR_ATTR_INT, 1},
                              {"kv_heads", IR_ATTR_INT, 1},
                              {"head_dim", IR_ATTR_INT, 1},
                              {"eps", IR_ATTR_FLOAT, 0},
                              ROPE_ATTRS,
                              {"rotary_dim", IR_ATTR_INT, 0}}},
};

static const char *const ATTR_KIND_NAMES[] = {"an int", "a float", "a string", "an int list"};

static const op_info *op_info_get(ir_op_kind k)
{
    if ((int)k < 0 || k >= IR_OP_COUNT)
        return NULL;
    return &OPS[k];
}

const char *ir_op_name(ir_op_kind k)
{
    const op_info *info = op_info_get(k);
    return info ? info->name : "?";
}

int ir_op_kind_from_name(const char *name, ir_op_kind *out)
{
    if (!name)
        return -1;
    for (int i = 0; i < IR_OP_COUNT; i++) {
        if (OPS[i].name && !strcmp(name, OPS[i].name)) {
            if (out)
                *out = (ir_op_kind)i;
            return 0;
        }
    }
    return -1;
}

int ir_op_arity(ir_op_kind kind, int *min_in, int *max_in, int *n_out)
{
    const op_info *info = op_info_get(kind);
    if (!info)
        return 0;
    if (min_in)
        *min_in = info->min_in;
    if (max_in)
        *max_in = info->max_in;
    if (n_out)
        *n_out = info->n_out;
    return 1;
}

static const attr_spec *attr_spec_find(ir_op_kind kind, const char *key)
{
    const op_info *info = op_info_get(kind);
    if (!info || !key)
        return NULL;
    for (int i = 0; i < OP_MAX_ATTR_SPECS && info->attrs[i].key; i++)
        if (!strcmp(info->attrs[i].key, key))
            return &info->attrs[i];
    return NULL;
}

int ir_op_attr_spec(ir_op_kind kind, const char *key, ir_attr_kind *akind, int *required)
{
    const attr_spec *s = attr_spec_find(kind, key);
    if (!s)
        return 0;
    if (akind)
        *akind = s->kind;
    if (required)
        *required = s->required;
    return 1;
}

const char *ir_op_attr_key(ir_op_kind kind, const char *key)
{
    const attr_spec *s = attr_spec_find(kind, key);
    return s ? s->key : NULL;
}

/* ---- attribute lookup ----------------------------------------------------- */

const ir_attr *ir_op_attr(const ir_op *op, const char *key)
{
    if (!op || !key)
        return NULL;
    int n = op->n_attr < 0 ? 0 : op->n_attr > IR_MAX_ATTRS ? IR_MAX_ATTRS : op->n_attr;
    for (int i = 0; i < n; i++)
        if (op->attrs[i].key && !strcmp(op->attrs[i].key, key))
            return &op->attrs[i];
    return NULL;
}

int64_t ir_op_attr_int(const ir_op *op, const char *key, int64_t dflt)
{
    const ir_attr *a = ir_op_attr(op, key);
    return a && a->kind == IR_ATTR_INT ? a->i : dflt;
}

double ir_op_attr_float(const ir_op *op, const char *key, double dflt)
{
    const ir_attr *a = ir_op_attr(op, key);
    return a && a->kind == IR_ATTR_FLOAT ? a->f : dflt;
}

const char *ir_op_attr_str(const ir_op *op, const char *key, const char *dflt)
{
    const ir_attr *a = ir_op_attr(op, key);
    return a && a->kind == IR_ATTR_STR && a->s ? a->s : dflt;
}

/* ---- messages ------------------------------------------------------------- */

void ir_op_label(const ir_op *op, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return;
    if (!op) {
        snprintf(buf, cap, "(null op)");
        return;
    }
    const char *name = ir_op_name(op->kind);
    if (op->n_out >= 1 && op->n_out <= IR_MAX_RESULTS && op->out[0] && op->out[0]->name)
        snprintf(buf, cap, "%%%s: %s", op->out[0]->name, name);
    else
        snprintf(buf, cap, "op #%d: %s", op->id, name);
}

typedef struct infer_ctx {
    const ir_op *op;
    char *msg;
    size_t cap;
} infer_ctx;

static moec_status fail(infer_ctx *c, const char *fmt, ...) MOEC_PRINTF(2, 3);
static moec_status fail(infer_ctx *c, const char *fmt, ...)
{
    if (c->msg && c->cap) {
        char label[256];
        ir_op_label(c->op, label, sizeof label);
        int n = snprintf(c->msg, c->cap, "%s: ", label);
        if (n >= 0 && (size_t)n < c->cap) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->msg + n, c->cap - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return MOEC_ERR_INVALID_ARG;
}

static const char *vname(const ir_value *v) { return v && v->name ? v->name : "?"; }

typedef struct tbuf {
    char s[96];
} tbuf;

static tbuf tfmt(const ir_type *t)
{
    tbuf b;
    ir_type_format(t, b.s, sizeof b.s);
    return b;
}

static int is_float(ir_dtype dt) { return dt == IR_DTYPE_F32 || dt == IR_DTYPE_F16 || dt == IR_DTYPE_BF16; }

/* ---- attribute checks ----------------------------------------------------- */

moec_status ir_op_check_attrs(const ir_op *op, char *msg, size_t cap)
{
    infer_ctx c = {op, msg, cap};
    const op_info *info = op ? op_info_get(op->kind) : NULL;
    if (!info)
        return fail(&c, "unknown op kind %d", op ? (int)op->kind : -1);
    if (op->n_attr < 0 || op->n_attr > IR_MAX_ATTRS)
        return fail(&c, "attribute count %d out of range", op->n_attr);
    for (int i = 0; i < op->n_attr; i++) {
        const ir_attr *a = &op->attrs[i];
        if (!a->key)
            return fail(&c, "attribute %d has no key", i);
        const attr_spec *s = attr_spec_find(op->kind, a->key);
        if (!s)
            return fail(&c, "unknown attribute '%s'", a->key);
        if (a->kind != s->kind)
            return fail(&c, "attribute '%s' must be %s", a->key, ATTR_KIND_NAMES[s->kind]);
        if (a->kind == IR_ATTR_STR && !a->s)
            return fail(&c, "attribute '%s' has no string", a->key);
        if (a->kind == IR_ATTR_INTS && (a->n < 0 || (a->n > 0 && !a->ints)))
            return fail(&c, "attribute '%s' has a bad int list", a->key);
        for (int j = 0; j < i; j++)
            if (op->attrs[j].key && !strcmp(op->attrs[j].key, a->key))
                return fail(&c, "duplicate attribute '%s'", a->key);
    }
    for (int i = 0; i < OP_MAX_ATTR_SPECS && info->attrs[i].key; i++)
        if (info->attrs[i].required && !ir_op_attr(op, info->attrs[i].key))
            return fail(&c, "missing required attribute '%s'", info->attrs[i].key);
    return MOEC_OK;
}

/* ---- operand checks ------------------------------------------------------- */

/* An activation: T first, rank in [min_rank, max_rank], float or i32. */
static moec_status need_act(infer_ctx *c, const ir_value *v, const char *role, int min_rank,
                            int max_rank, int want_float)
{
    const ir_type *t = &v->type;
    if (!ir_type_has_t(t))
        return fail(c, "%s %%%s must have T as its first dimension, got %s", role, vname(v),
                    tfmt(t).s);
    if (t->rank < min_rank || t->rank > max_rank) {
        if (min_rank == max_rank)
            return fail(c, "%s %%%s must have rank %d, got %s", role, vname(v), min_rank,
                        tfmt(t).s);
        return fail(c, "%s %%%s must have rank %d to %d, got %s", role, vname(v), min_rank,
                    max_rank, tfmt(t).s);
    }
    if (want_float && !is_float(t->dtype))
        return fail(c, "%s %%%s must be a float, got %s", role, vname(v), tfmt(t).s);
    if (!want_float && t->dtype != IR_DTYPE_I32)
        return fail(c, "%s %%%s must be i32, got %s", role, vname(v), tfmt(t).s);
    return MOEC_OK;
}

/* A weight-like operand: no T, float, given rank. */
static moec_status need_static(infer_ctx *c, const ir_value *v, const char *role, int rank)
{
    const ir_type *t = &v->type;
    if (ir_type_has_t(t))
        return fail(c, "%s %%%s must not have T, got %s", role, vname(v), tfmt(t).s);
    if (t->rank != rank)
        return fail(c, "%s %%%s must have rank %d, got %s", role, vname(v), rank, tfmt(t).s);
    if (!is_float(t->dtype))
        return fail(c, "%s %%%s must be a float, got %s", role, vname(v), tfmt(t).s);
    return MOEC_OK;
}

/* A weight the op multiplies by (linear, experts, kv_b): as need_static, or
 * f8e4m3 (block-scaled; the verifier checks its scales). */
static moec_status need_matrix(infer_ctx *c, const ir_value *v, const char *role, int rank)
{
    const ir_type *t = &v->type;
    if (t->dtype == IR_DTYPE_F8E4M3 && !ir_type_has_t(t) && t->rank == rank)
        return MOEC_OK;
    return need_static(c, v, role, rank);
}

/* The norms' eps attribute: finite and >= 0. */
static moec_status need_eps(infer_ctx *c)
{
    double eps = ir_op_attr_float(c->op, "eps", 0);
    if (!isfinite(eps) || eps < 0)
        return fail(c, "eps %g must be finite and >= 0", eps);
    return MOEC_OK;
}

static moec_status need_pos(infer_ctx *c, const ir_value *v)
{
    return need_act(c, v, "positions", 1, 1, 0);
}

static ir_dtype act_dtype(ir_dtype in) { return in == IR_DTYPE_I32 ? IR_DTYPE_I32 : IR_DTYPE_F32; }

static ir_type type_like(const ir_type *t, ir_dtype dt)
{
    ir_type r = *t;
    r.dtype = dt;
    return r;
}

static ir_type type_make(ir_dtype dt, int rank, int64_t d0, int64_t d1, int64_t d2)
{
    ir_type r = {dt, rank, {d0, d1, d2, 0}};
    for (int i = rank; i < IR_MAX_RANK; i++)
        r.dims[i] = 0;
    return r;
}

static moec_status axis_attr(infer_ctx *c, const char *key, int rank, int *axis)
{
    int64_t a = ir_op_attr_int(c->op, key, 0);
    if (a < 1 || a >= rank)
        return fail(c, "%s %" PRId64 " out of range [1, %d]", key, a, rank - 1);
    *axis = (int)a;
    return MOEC_OK;
}

static int str_is(const char *s, const char *a, const char *b, const char *d)
{
    return s && ((a && !strcmp(s, a)) || (b && !strcmp(s, b)) || (d && !strcmp(s, d)));
}

/* The declared result type of RESHAPE / EXPAND. */
static moec_status declared_result(infer_ctx *c, ir_dtype want_dt, ir_type *r)
{
    const ir_type *t = &c->op->out[0]->type;
    if (t->rank == 0)
        return fail(c, "result type not given");
    if (!ir_type_valid(t, 1))
        return fail(c, "result type %s is not a valid type", tfmt(t).s);
    if (!ir_type_has_t(t))
        return fail(c, "result type %s must have T as its first dimension", tfmt(t).s);
    if (t->dtype != want_dt)
        return fail(c, "result type %s must be %s", tfmt(t).s, ir_dtype_name(want_dt));
    *r = *t;
    return MOEC_OK;
}

/* ---- per-op inference ----------------------------------------------------- */

static moec_status infer_embedding(infer_ctx *c, ir_type *out)
{
    const ir_value *ids = c->op->in[0], *table = c->op->in[1];
    MOEC_TRY(need_act(c, ids, "ids", 1, 1, 0));
    MOEC_TRY(need_static(c, table, "table", 2));
    /* a vocab-parallel rank's table holds rows [vocab_start, vocab_start + V)
     * of a vocabulary of vocab_size ids */
    int64_t V = table->type.dims[0];
    int64_t start = ir_op_attr_int(c->op, "vocab_start", 0);
    int64_t size = ir_op_attr_int(c->op, "vocab_size", V);
    if (start < 0 || size < 1 || size > IR_DIM_MAX || start > size - V)
        return fail(c, "table %%%s's %" PRId64 " rows from vocab_start %" PRId64
                       " do not fit vocab_size %" PRId64,
                    vname(table), V, start, size);
    out[0] = type_make(IR_DTYPE_F32, 2, IR_DIM_T, table->type.dims[1], 0);
    return MOEC_OK;
}

static moec_status infer_rms_norm(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0], *w = c->op->in[1];
    MOEC_TRY(need_act(c, x, "input", 2, IR_MAX_RANK, 1));
    MOEC_TRY(need_static(c, w, "weight", 1));
    int64_t d = x->type.dims[x->type.rank - 1];
    if (w->type.dims[0] != d)
        return fail(c, "weight %%%s has %" PRId64 " elements, input's last dim is %" PRId64,
                    vname(w), w->type.dims[0], d);
    MOEC_TRY(need_eps(c));
    out[0] = type_like(&x->type, IR_DTYPE_F32);
    return MOEC_OK;
}

static moec_status infer_linear(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0], *w = c->op->in[1];
    MOEC_TRY(need_act(c, x, "input", 2, 2, 1));
    MOEC_TRY(need_matrix(c, w, "weight", 2));
    /* act = "silu_mul": x holds gate then up, [T, 2K] */
    const char *act = ir_op_attr_str(c->op, "act", NULL);
    if (act && strcmp(act, "silu_mul"))
        return fail(c, "act \"%s\" is not \"silu_mul\"", act);
    int64_t kx = act ? x->type.dims[1] / 2 : x->type.dims[1];
    if (act && x->type.dims[1] % 2)
        return fail(c, "act \"silu_mul\" wants an even input width (gate, then up), got %" PRId64,
                    x->type.dims[1]);
    if (w->type.dims[1] != kx)
        return fail(c, "weight %%%s has %" PRId64 " columns, input has %" PRId64 "%s", vname(w),
                    w->type.dims[1], kx, act ? " after silu_mul" : "");
    if (c->op->n_in == 3) {
        const ir_value *b = c->op->in[2];
        MOEC_TRY(need_static(c, b, "bias", 1));
        if (b->type.dims[0] != w->type.dims[0])
            return fail(c, "bias %%%s has %" PRId64 " elements, weight %%%s has %" PRId64 " rows",
                        vname(b), b->type.dims[0], vname(w), w->type.dims[0]);
    }
    if (!isfinite(ir_op_attr_float(c->op, "alpha", 1)))
        return fail(c, "alpha must be finite");
    out[0] = type_make(IR_DTYPE_F32, 2, IR_DIM_T, w->type.dims[0], 0);
    return MOEC_OK;
}

static moec_status infer_reshape(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0];
    if (!ir_type_has_t(&x->type))
        return fail(c, "input %%%s must have T as its first dimension, got %s", vname(x),
                    tfmt(&x->type).s);
    ir_type r;
    MOEC_TRY(declared_result(c, act_dtype(x->type.dtype), &r));
    int64_t nx = ir_type_numel(&x->type, 0), nr = ir_type_numel(&r, 0);
    if (nx != nr)
        return fail(c, "result %s has %" PRId64 " elements per token, input %%%s (%s) has %" PRId64,
                    tfmt(&r).s, nr, vname(x), tfmt(&x->type).s, nx);
    out[0] = r;
    return MOEC_OK;
}

static moec_status infer_slice(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0];
    const ir_type *t = &x->type;
    if (!ir_type_has_t(t) || t->rank < 2)
        return fail(c, "input %%%s must be [T, ...] of rank >= 2, got %s", vname(x), tfmt(t).s);
    int axis = 0;
    MOEC_TRY(axis_attr(c, "axis", t->rank, &axis));
    int64_t start = ir_op_attr_int(c->op, "start", 0), size = ir_op_attr_int(c->op, "size", 0);
    int64_t dim = t->dims[axis];
    if (start < 0 || size < 1 || size > dim || start > dim - size)
        return fail(c, "slice [%" PRId64 ", %" PRId64 " + %" PRId64 ") out of bounds of dim %d "
                       "of %%%s (%" PRId64 ")",
                    start, start, size, axis, vname(x), dim);
    out[0] = type_like(t, act_dtype(t->dtype));
    out[0].dims[axis] = size;
    return MOEC_OK;
}

static moec_status infer_concat(infer_ctx *c, ir_type *out)
{
    const ir_value *a = c->op->in[0];
    const ir_type *ta = &a->type;
    if (!ir_type_has_t(ta) || ta->rank < 2)
        return fail(c, "operand %%%s must be [T, ...] of rank >= 2, got %s", vname(a),
                    tfmt(ta).s);
    int axis = 0;
    MOEC_TRY(axis_attr(c, "axis", ta->rank, &axis));
    ir_type r = type_like(ta, act_dtype(ta->dtype));
    for (int i = 1; i < c->op->n_in; i++) {
        const ir_value *b = c->op->in[i];
        const ir_type *tb = &b->type;
        if (tb->rank != ta->rank)
            return fail(c, "operand %%%s (%s) has rank %d, %%%s (%s) has %d", vname(b),
                        tfmt(tb).s, tb->rank, vname(a), tfmt(ta).s, ta->rank);
        if (act_dtype(tb->dtype) != r.dtype)
            return fail(c, "operand %%%s (%s) and %%%s (%s) mix float and i32", vname(b),
                        tfmt(tb).s, vname(a), tfmt(ta).s);
        for (int d = 0; d < ta->rank; d++)
            if (d != axis && tb->dims[d] != ta->dims[d])
                return fail(c, "operand %%%s (%s) differs from %%%s (%s) in dim %d", vname(b),
                            tfmt(tb).s, vname(a), tfmt(ta).s, d);
        r.dims[axis] += tb->dims[axis];
    }
    if (!ir_type_valid(&r, 1))
        return fail(c, "joined type %s is too large", tfmt(&r).s);
    out[0] = r;
    return MOEC_OK;
}

static moec_status infer_expand(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0];
    const ir_type *t = &x->type;
    ir_type r;
    MOEC_TRY(declared_result(c, act_dtype(t->dtype), &r));
    if (t->rank != r.rank)
        return fail(c, "input %%%s (%s) and result %s differ in rank", vname(x), tfmt(t).s,
                    tfmt(&r).s);
    for (int d = 0; d < r.rank; d++)
        if (t->dims[d] != r.dims[d] && t->dims[d] != 1)
            return fail(c, "dim %d of input %%%s (%s) is neither 1 nor the result's (%s)", d,
                        vname(x), tfmt(t).s, tfmt(&r).s);
    out[0] = r;
    return MOEC_OK;
}

static moec_status infer_binary(infer_ctx *c, ir_type *out)
{
    const ir_value *a = c->op->in[0], *b = c->op->in[1];
    MOEC_TRY(need_act(c, a, "operand", 1, IR_MAX_RANK, 1));
    const ir_type *ta = &a->type, *tb = &b->type;
    if (!is_float(tb->dtype))
        return fail(c, "operand %%%s must be a float, got %s", vname(b), tfmt(tb).s);
    if (tb->rank != ta->rank)
        return fail(c, "operands %%%s (%s) and %%%s (%s) differ in rank", vname(a), tfmt(ta).s,
                    vname(b), tfmt(tb).s);
    for (int d = 0; d < ta->rank; d++)
        if (tb->dims[d] != ta->dims[d] && tb->dims[d] != 1)
            return fail(c, "dim %d of %%%s (%s) is neither 1 nor that of %%%s (%s)", d, vname(b),
                        tfmt(tb).s, vname(a), tfmt(ta).s);
    if (!isfinite(ir_op_attr_float(c->op, "alpha", 1)))
        return fail(c, "alpha must be finite");
    out[0] = type_like(ta, IR_DTYPE_F32);
    return MOEC_OK;
}

static moec_status infer_unary(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0];
    MOEC_TRY(need_act(c, x, "input", 1, IR_MAX_RANK, 1));
    out[0] = type_like(&x->type, IR_DTYPE_F32);
    return MOEC_OK;
}

/* rope's attributes but rotary_dim: style, theta, scaling and its factor and
 * YaRN range, attn_factor (the MLA prologue ops check theirs the same way). */
static moec_status rope_attrs(infer_ctx *c)
{
    const ir_op *op = c->op;
    const char *style = ir_op_attr_str(op, "style", "");
    if (!str_is(style, "interleave", "neox", NULL))
        return fail(c, "style '%s' must be \"interleave\" or \"neox\"", style);
    double theta = ir_op_attr_float(op, "theta", 0);
    if (!isfinite(theta) || theta <= 0)
        return fail(c, "theta %g must be finite and > 0", theta);
    const char *scaling = ir_op_attr_str(op, "scaling", "none");
    if (!str_is(scaling, "none", "linear", "yarn"))
        return fail(c, "scaling '%s' must be \"none\", \"linear\" or \"yarn\"", scaling);
    if (strcmp(scaling, "none")) {
        if (!ir_op_attr(op, "factor"))
            return fail(c, "scaling \"%s\" needs attribute 'factor'", scaling);
        double f = ir_op_attr_float(op, "factor", 0);
        if (!isfinite(f) || f <= 0)
            return fail(c, "factor %g must be finite and > 0", f);
    }
    if (!strcmp(scaling, "yarn")) {
        if (!ir_op_attr(op, "yarn_low") || !ir_op_attr(op, "yarn_high"))
            return fail(c, "scaling \"yarn\" needs attributes 'yarn_low' and 'yarn_high'");
        if (!isfinite(ir_op_attr_float(op, "yarn_low", 0)) ||
            !isfinite(ir_op_attr_float(op, "yarn_high", 0)))
            return fail(c, "yarn_low and yarn_high must be finite");
    }
    if (!isfinite(ir_op_attr_float(op, "attn_factor", 1)))
        return fail(c, "attn_factor must be finite");
    return MOEC_OK;
}

/* The rotary channels of a head of D (rotary_dim, default D): even, 2 to D. */
static moec_status rotary_dim(infer_ctx *c, int64_t D, int64_t *rd)
{
    *rd = ir_op_attr_int(c->op, "rotary_dim", D);
    if (*rd < 2 || *rd > D || *rd % 2)
        return fail(c, "rotary_dim %" PRId64 " must be even and in [2, %" PRId64 "] (the head dim)",
                    *rd, D);
    return MOEC_OK;
}

static moec_status infer_rope(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *x = op->in[0];
    MOEC_TRY(need_act(c, x, "input", 3, 3, 1));
    MOEC_TRY(need_pos(c, op->in[1]));
    if (x->type.dims[2] % 2)
        return fail(c, "head dim %" PRId64 " of %%%s must be even", x->type.dims[2], vname(x));
    MOEC_TRY(rope_attrs(c));
    int64_t rd;
    MOEC_TRY(rotary_dim(c, x->type.dims[2], &rd));
    out[0] = type_like(&x->type, IR_DTYPE_F32);
    return MOEC_OK;
}

/* The attributes of attention and mla_attention, and the optional token
 * selection (operand sel_at, from dsa_topk): i32 [T, K], and no window with
 * it (a selection already says which positions each token sees). */
static moec_status attention_scale_window(infer_ctx *c, int sel_at)
{
    const ir_op *op = c->op;
    double scale = ir_op_attr_float(op, "scale", 0);
    if (!isfinite(scale))
        return fail(c, "scale %g must be finite", scale);
    int64_t window = ir_op_attr_int(op, "window", 0);
    if (window < 0)
        return fail(c, "window %" PRId64 " must be >= 0", window);
    if (op->n_in <= sel_at)
        return MOEC_OK;
    MOEC_TRY(need_act(c, op->in[sel_at], "sel", 2, 2, 0));
    if (window > 0)
        return fail(c, "window %" PRId64 " and the token selection %%%s cannot be combined",
                    window, vname(op->in[sel_at]));
    return MOEC_OK;
}

static moec_status infer_attention(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *q = op->in[0], *k = op->in[1], *v = op->in[2];
    MOEC_TRY(need_act(c, q, "q", 3, 3, 1));
    MOEC_TRY(need_act(c, k, "k", 3, 3, 1));
    MOEC_TRY(need_act(c, v, "v", 3, 3, 1));
    MOEC_TRY(need_pos(c, op->in[3]));
    int64_t H = q->type.dims[1], Hkv = k->type.dims[1];
    if (k->type.dims[2] != q->type.dims[2])
        return fail(c, "k %%%s has head dim %" PRId64 ", q %%%s has %" PRId64, vname(k),
                    k->type.dims[2], vname(q), q->type.dims[2]);
    if (v->type.dims[1] != Hkv)
        return fail(c, "v %%%s has %" PRId64 " heads, k %%%s has %" PRId64, vname(v),
                    v->type.dims[1], vname(k), Hkv);
    if (H % Hkv)
        return fail(c, "q heads %" PRId64 " are not a multiple of kv heads %" PRId64, H, Hkv);
    MOEC_TRY(attention_scale_window(c, 4));
    out[0] = type_make(IR_DTYPE_F32, 3, IR_DIM_T, H, v->type.dims[2]);
    return MOEC_OK;
}

static moec_status infer_moe_topk(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *logits = op->in[0];
    MOEC_TRY(need_act(c, logits, "logits", 2, 2, 1));
    int64_t E = logits->type.dims[1];
    if (op->n_in == 2) {
        const ir_value *bias = op->in[1];
        MOEC_TRY(need_static(c, bias, "bias", 1));
        if (bias->type.dims[0] != E)
            return fail(c, "bias %%%s has %" PRId64 " elements, logits have %" PRId64 " experts",
                        vname(bias), bias->type.dims[0], E);
    }
    const char *scoring = ir_op_attr_str(op, "scoring", "");
    if (!str_is(scoring, "softmax", "sigmoid", NULL))
        return fail(c, "scoring '%s' must be \"softmax\" or \"sigmoid\"", scoring);
    int64_t K = ir_op_attr_int(op, "top_k", 0);
    if (K < 1 || K > E)
        return fail(c, "top_k %" PRId64 " out of range [1, %" PRId64 "] (experts)", K, E);
    int64_t ng = ir_op_attr_int(op, "n_group", 1), tg = ir_op_attr_int(op, "topk_group", 1);
    if (ng < 1 || ng > E || E % ng)
        return fail(c, "n_group %" PRId64 " does not divide %" PRId64 " experts", ng, E);
    if (tg < 1 || tg > ng)
        return fail(c, "topk_group %" PRId64 " out of range [1, %" PRId64 "] (n_group)", tg, ng);
    const char *gs = ir_op_attr_str(op, "group_score", "max");
    if (!str_is(gs, "max", "top2_sum", NULL))
        return fail(c, "group_score '%s' must be \"max\" or \"top2_sum\"", gs);
    if (ng > 1) {
        if (!strcmp(gs, "top2_sum") && E / ng < 2)
            return fail(c, "group_score \"top2_sum\" needs >= 2 experts per group, have %" PRId64,
                        E / ng);
        if (K > tg * (E / ng))
            return fail(c, "top_k %" PRId64 " exceeds the %" PRId64 " experts of %" PRId64
                           " kept groups",
                        K, tg * (E / ng), tg);
    }
    int64_t norm = ir_op_attr_int(op, "norm_topk_prob", 0);
    if (norm != 0 && norm != 1)
        return fail(c, "norm_topk_prob %" PRId64 " must be 0 or 1", norm);
    if (!isfinite(ir_op_attr_float(op, "scaling", 1)))
        return fail(c, "scaling must be finite");
    out[0] = type_make(IR_DTYPE_I32, 2, IR_DIM_T, K, 0);
    out[1] = type_make(IR_DTYPE_F32, 2, IR_DIM_T, K, 0);
    return MOEC_OK;
}

static moec_status need_dims3(infer_ctx *c, const ir_value *w, const char *role, int64_t d0,
                              int64_t d1, int64_t d2)
{
    MOEC_TRY(need_matrix(c, w, role, 3));
    const int64_t *d = w->type.dims;
    if (d[0] != d0 || d[1] != d1 || d[2] != d2)
        return fail(c, "%s %%%s is %s, expected [%" PRId64 ", %" PRId64 ", %" PRId64 "]", role,
                    vname(w), tfmt(&w->type).s, d0, d1, d2);
    return MOEC_OK;
}

/* The expert weights of moe_experts and moe_routed, from op->in[first]:
 * gate [E, I, H] and up [E, I, H], or gate_up [E, 2I, H]; then down
 * [E, H, I], last; H is the hidden size of the input x. */
static moec_status need_expert_weights(infer_ctx *c, const ir_value *x, int first)
{
    const ir_op *op = c->op;
    int64_t H = x->type.dims[1];
    const ir_value *down = op->in[op->n_in - 1];
    MOEC_TRY(need_matrix(c, down, "down", 3));
    int64_t E = down->type.dims[0], I = down->type.dims[2];
    if (down->type.dims[1] != H)
        return fail(c, "down %%%s is %s: dim 1 must be the hidden size %" PRId64 " of %%%s",
                    vname(down), tfmt(&down->type).s, H, vname(x));
    if (op->n_in == first + 3) {
        MOEC_TRY(need_dims3(c, op->in[first], "gate", E, I, H));
        MOEC_TRY(need_dims3(c, op->in[first + 1], "up", E, I, H));
    } else {
        MOEC_TRY(need_dims3(c, op->in[first], "gate_up", E, 2 * I, H));
    }
    return MOEC_OK;
}

static moec_status infer_moe_experts(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *x = op->in[0], *ids = op->in[1];
    MOEC_TRY(need_act(c, x, "input", 2, 2, 1));
    MOEC_TRY(need_act(c, ids, "ids", 2, 2, 0));
    int64_t H = x->type.dims[1], K = ids->type.dims[1];
    MOEC_TRY(need_expert_weights(c, x, 2));
    const char *act = ir_op_attr_str(op, "act", "silu");
    if (strcmp(act, "silu"))
        return fail(c, "act '%s' is not supported (only \"silu\")", act);
    ir_type r = type_make(IR_DTYPE_F32, 3, IR_DIM_T, K, H);
    if (!ir_type_valid(&r, 1))
        return fail(c, "result %s is too large", tfmt(&r).s);
    out[0] = r;
    return MOEC_OK;
}

static moec_status infer_reduce_sum(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0];
    MOEC_TRY(need_act(c, x, "input", 2, IR_MAX_RANK, 1));
    int axis = 0;
    MOEC_TRY(axis_attr(c, "axis", x->type.rank, &axis));
    ir_type r = type_like(&x->type, IR_DTYPE_F32);
    for (int d = axis; d + 1 < r.rank; d++)
        r.dims[d] = r.dims[d + 1];
    r.rank--;
    r.dims[r.rank] = 0;
    out[0] = r;
    return MOEC_OK;
}

/* ---- fused and scheduled ops ---------------------------------------------- */

static moec_status infer_silu_mul(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0];
    MOEC_TRY(need_act(c, x, "input", 2, IR_MAX_RANK, 1));
    int last = x->type.rank - 1;
    if (x->type.dims[last] % 2)
        return fail(c, "last dim %" PRId64 " of %%%s must be even (gate, then up)",
                    x->type.dims[last], vname(x));
    ir_type r = type_like(&x->type, IR_DTYPE_F32);
    r.dims[last] /= 2;
    out[0] = r;
    return MOEC_OK;
}

static moec_status infer_moe_routed(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *x = op->in[0], *ids = op->in[1], *w = op->in[2];
    MOEC_TRY(need_act(c, x, "input", 2, 2, 1));
    MOEC_TRY(need_act(c, ids, "ids", 2, 2, 0));
    MOEC_TRY(need_act(c, w, "weights", 2, 2, 1));
    int64_t H = x->type.dims[1], K = ids->type.dims[1];
    if (w->type.dims[1] != K)
        return fail(c, "weights %%%s (%s) and ids %%%s (%s) differ in top_k", vname(w),
                    tfmt(&w->type).s, vname(ids), tfmt(&ids->type).s);
    MOEC_TRY(need_expert_weights(c, x, 3));
    if (!isfinite(ir_op_attr_float(op, "scale", 1)))
        return fail(c, "scale must be finite");
    /* an expert-parallel rank holds experts [expert_start, expert_start + E)
     * of n_experts */
    int64_t E = op->in[op->n_in - 1]->type.dims[0];
    int64_t e0 = ir_op_attr_int(op, "expert_start", 0), ne = ir_op_attr_int(op, "n_experts", E);
    if (e0 < 0 || ne < 1 || ne > IR_DIM_MAX || e0 > ne - E)
        return fail(c, "%" PRId64 " experts from expert_start %" PRId64
                       " do not fit n_experts %" PRId64,
                    E, e0, ne);
    /* unsummed: the K weighted expert outputs of each token, for the
     * add_rms_norm that sums them (fuse_moe_sum); every expert held */
    int64_t uns = ir_op_attr_int(op, "unsummed", 0);
    if (uns != 0 && uns != 1)
        return fail(c, "unsummed %" PRId64 " must be 0 or 1", uns);
    if (uns && (e0 != 0 || ne != E))
        return fail(c, "unsummed with experts %" PRId64 " .. %" PRId64 " of %" PRId64
                       ": the weights must hold every expert",
                    e0, e0 + E - 1, ne);
    out[0] = uns ? type_make(IR_DTYPE_F32, 3, IR_DIM_T, K, H)
                 : type_make(IR_DTYPE_F32, 2, IR_DIM_T, H, 0);
    return MOEC_OK;
}

/* qk_nope_head_dim and v_head_dim (>= 1), and kv_b [H*(dn+dv), r]. */
static moec_status mla_kv_b(infer_ctx *c, const ir_value *kv_b, int64_t H, int64_t *dn,
                            int64_t *dv, int64_t *r)
{
    *dn = ir_op_attr_int(c->op, "qk_nope_head_dim", 0);
    *dv = ir_op_attr_int(c->op, "v_head_dim", 0);
    if (*dn < 1 || *dn > IR_DIM_MAX)
        return fail(c, "qk_nope_head_dim %" PRId64 " must be >= 1", *dn);
    if (*dv < 1 || *dv > IR_DIM_MAX)
        return fail(c, "v_head_dim %" PRId64 " must be >= 1", *dv);
    MOEC_TRY(need_matrix(c, kv_b, "kv_b", 2));
    /* dn + dv <= 2^32 and H < 2^31: the product fits when it can equal the rows */
    int64_t want = *dn + *dv > IR_DIM_MAX / H ? -1 : H * (*dn + *dv);
    if (kv_b->type.dims[0] != want)
        return fail(c, "kv_b %%%s has %" PRId64 " rows, expected heads %" PRId64
                       " * (qk_nope_head_dim %" PRId64 " + v_head_dim %" PRId64 ")",
                    vname(kv_b), kv_b->type.dims[0], H, *dn, *dv);
    *r = kv_b->type.dims[1];
    return MOEC_OK;
}

/* mla_qabsorb(q_nope [T, H, dn], kv_b); with heads and head_stride, q [T, N]
 * holding head h's dn channels at columns h * head_stride .. + dn (the q
 * projection itself, read in place). */
static moec_status infer_mla_qabsorb(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *q = op->in[0];
    int rows = ir_op_attr(op, "heads") != NULL || ir_op_attr(op, "head_stride") != NULL;
    int64_t H, dn, dv, r;
    if (rows) {
        MOEC_TRY(need_act(c, q, "q", 2, 2, 1));
        H = ir_op_attr_int(op, "heads", 0);
        int64_t S = ir_op_attr_int(op, "head_stride", 0);
        if (H < 1 || H > IR_DIM_MAX)
            return fail(c, "heads %" PRId64 " must be >= 1", H);
        MOEC_TRY(mla_kv_b(c, op->in[1], H, &dn, &dv, &r));
        if (S < dn || S > q->type.dims[1] || (H - 1) > (q->type.dims[1] - dn) / S)
            return fail(c, "head_stride %" PRId64 " for %" PRId64 " heads of qk_nope_head_dim %" PRId64
                           " does not fit q %%%s (%s)",
                        S, H, dn, vname(q), tfmt(&q->type).s);
    } else {
        MOEC_TRY(need_act(c, q, "q_nope", 3, 3, 1));
        H = q->type.dims[1];
        MOEC_TRY(mla_kv_b(c, op->in[1], H, &dn, &dv, &r));
        if (q->type.dims[2] != dn)
            return fail(c, "q_nope %%%s has head dim %" PRId64 ", qk_nope_head_dim is %" PRId64,
                        vname(q), q->type.dims[2], dn);
    }
    out[0] = type_make(IR_DTYPE_F32, 3, IR_DIM_T, H, r);
    return MOEC_OK;
}

static moec_status infer_mla_vabsorb(infer_ctx *c, ir_type *out)
{
    const ir_value *o = c->op->in[0];
    MOEC_TRY(need_act(c, o, "o_c", 3, 3, 1));
    int64_t H = o->type.dims[1], dn, dv, r;
    MOEC_TRY(mla_kv_b(c, c->op->in[1], H, &dn, &dv, &r));
    if (o->type.dims[2] != r)
        return fail(c, "o_c %%%s has %" PRId64 " channels, kv_b %%%s has %" PRId64 " columns",
                    vname(o), o->type.dims[2], vname(c->op->in[1]), r);
    out[0] = type_make(IR_DTYPE_F32, 3, IR_DIM_T, H, dv);
    return MOEC_OK;
}

static moec_status infer_mla_attention(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *qc = op->in[0], *qpe = op->in[1], *kvc = op->in[2], *kpe = op->in[3];
    MOEC_TRY(need_act(c, qc, "q_c", 3, 3, 1));
    MOEC_TRY(need_act(c, qpe, "q_pe", 3, 3, 1));
    MOEC_TRY(need_act(c, kvc, "kv_c", 2, 2, 1));
    MOEC_TRY(need_act(c, kpe, "k_pe", 3, 3, 1));
    MOEC_TRY(need_pos(c, op->in[4]));
    int64_t H = qc->type.dims[1], r = qc->type.dims[2], dr = qpe->type.dims[2];
    if (qpe->type.dims[1] != H)
        return fail(c, "q_pe %%%s has %" PRId64 " heads, q_c %%%s has %" PRId64, vname(qpe),
                    qpe->type.dims[1], vname(qc), H);
    if (kvc->type.dims[1] != r)
        return fail(c, "kv_c %%%s has %" PRId64 " channels, q_c %%%s has %" PRId64, vname(kvc),
                    kvc->type.dims[1], vname(qc), r);
    if (kpe->type.dims[1] != 1 || kpe->type.dims[2] != dr)
        return fail(c, "k_pe %%%s is %s, expected [T, 1, %" PRId64 "] (q_pe's rope dim)",
                    vname(kpe), tfmt(&kpe->type).s, dr);
    MOEC_TRY(attention_scale_window(c, 5));
    out[0] = type_make(IR_DTYPE_F32, 3, IR_DIM_T, H, r);
    return MOEC_OK;
}

/* The residual add and the RMSNorm of its result in one op: a and b (and the
 * optional second addend c) the same [T, D] (no broadcast), w [D]. */
static moec_status infer_add_rms_norm(infer_ctx *c, ir_type *out)
{
    const ir_value *a = c->op->in[0], *b = c->op->in[1], *w = c->op->in[2];
    MOEC_TRY(need_act(c, a, "a", 2, 2, 1));
    /* b may be [T, K, D]: summed over K first (an unsummed moe_routed's) */
    MOEC_TRY(need_act(c, b, "b", 2, 3, 1));
    MOEC_TRY(need_static(c, w, "weight", 1));
    int64_t d = a->type.dims[1];
    if (b->type.dims[b->type.rank - 1] != d)
        return fail(c, "b %%%s (%s) and a %%%s (%s) differ in width", vname(b),
                    tfmt(&b->type).s, vname(a), tfmt(&a->type).s);
    if (c->op->n_in == 4) {
        const ir_value *b2 = c->op->in[3];
        MOEC_TRY(need_act(c, b2, "c", 2, 2, 1));
        if (b2->type.dims[1] != d)
            return fail(c, "c %%%s (%s) and a %%%s (%s) differ in width", vname(b2),
                        tfmt(&b2->type).s, vname(a), tfmt(&a->type).s);
    }
    if (w->type.dims[0] != d)
        return fail(c, "weight %%%s has %" PRId64 " elements, a's last dim is %" PRId64,
                    vname(w), w->type.dims[0], d);
    MOEC_TRY(need_eps(c));
    if (!isfinite(ir_op_attr_float(c->op, "alpha", 1)))
        return fail(c, "alpha must be finite");
    out[0] = type_make(IR_DTYPE_F32, 2, IR_DIM_T, d, 0);
    out[1] = out[0];
    return MOEC_OK;
}

/* An int attribute of an MLA prologue op that must be >= 1 (and at most
 * IR_DIM_MAX). */
static moec_status prologue_dim(infer_ctx *c, const char *key, int64_t *v)
{
    *v = ir_op_attr_int(c->op, key, 0);
    if (*v < 1 || *v > IR_DIM_MAX)
        return fail(c, "%s %" PRId64 " must be >= 1", key, *v);
    return MOEC_OK;
}

/* The norm weight operand i of an MLA prologue op ([n], float): its size. */
static moec_status prologue_norm(infer_ctx *c, int i, const char *role, int64_t *n)
{
    MOEC_TRY(need_static(c, c->op->in[i], role, 1));
    *n = c->op->in[i]->type.dims[0];
    MOEC_TRY(need_eps(c));
    return MOEC_OK;
}

/* mla_prologue, mla_prologue_kv and mla_prologue_q: x [T, N] holding the
 * sections of the op's kind from column 0 (q heads of dn + dr, or the q
 * latent of qr; then the kv latent of r and the rotary key of dr), pos, and
 * the norm weights; the results in section order. */
static moec_status infer_mla_prologue(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *x = op->in[0];
    MOEC_TRY(need_act(c, x, "input", 2, 2, 1));
    MOEC_TRY(need_pos(c, op->in[1]));
    int64_t dr, H = 0, dn = 0, r = 0, qr = 0;
    MOEC_TRY(prologue_dim(c, "qk_rope_head_dim", &dr));
    if (dr % 2)
        return fail(c, "qk_rope_head_dim %" PRId64 " must be even", dr);
    int heads = op->kind != IR_OP_MLA_PROLOGUE_KV, kv = op->kind != IR_OP_MLA_PROLOGUE_Q;
    if (heads) {
        MOEC_TRY(prologue_dim(c, "heads", &H));
        MOEC_TRY(prologue_dim(c, "qk_nope_head_dim", &dn));
    }
    if (kv)
        MOEC_TRY(prologue_norm(c, 2, "kv_norm", &r));
    if (op->kind == IR_OP_MLA_PROLOGUE_KV)
        MOEC_TRY(prologue_norm(c, 3, "q_norm", &qr));
    MOEC_TRY(rope_attrs(c));
    /* every size <= IR_DIM_MAX, the q heads' product checked: no overflow */
    if (heads && dn + dr > IR_DIM_MAX / H)
        return fail(c, "heads %" PRId64 " * (qk_nope_head_dim %" PRId64
                       " + qk_rope_head_dim %" PRId64 ") is too large",
                    H, dn, dr);
    int64_t need = (heads ? H * (dn + dr) : qr) + (kv ? r + dr : 0);
    if (need > x->type.dims[1])
        return fail(c, "input %%%s (%s) has %" PRId64 " columns, its sections need %" PRId64,
                    vname(x), tfmt(&x->type).s, x->type.dims[1], need);
    int n = 0;
    if (heads) {
        out[n++] = type_make(IR_DTYPE_F32, 3, IR_DIM_T, H, dn);
        out[n++] = type_make(IR_DTYPE_F32, 3, IR_DIM_T, H, dr);
    } else {
        out[n++] = type_make(IR_DTYPE_F32, 2, IR_DIM_T, qr, 0);
    }
    if (kv) {
        out[n++] = type_make(IR_DTYPE_F32, 2, IR_DIM_T, r, 0);
        out[n++] = type_make(IR_DTYPE_F32, 3, IR_DIM_T, 1, dr);
    }
    for (int i = 0; i < n; i++)
        if (!ir_type_valid(&out[i], 1))
            return fail(c, "result %s is too large", tfmt(&out[i]).s);
    return MOEC_OK;
}

/* LayerNorm over the last dim: x [T, ..., D], weight and bias [D]. */
static moec_status infer_layer_norm(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0];
    MOEC_TRY(need_act(c, x, "input", 2, IR_MAX_RANK, 1));
    int64_t d = x->type.dims[x->type.rank - 1];
    for (int i = 1; i < 3; i++) {
        const ir_value *p = c->op->in[i];
        const char *role = i == 1 ? "weight" : "bias";
        MOEC_TRY(need_static(c, p, role, 1));
        if (p->type.dims[0] != d)
            return fail(c, "%s %%%s has %" PRId64 " elements, input's last dim is %" PRId64, role,
                        vname(p), p->type.dims[0], d);
    }
    MOEC_TRY(need_eps(c));
    out[0] = type_like(&x->type, IR_DTYPE_F32);
    return MOEC_OK;
}

/* Columns [col, col + n) of the rows of x [T, N]: col >= 0 and inside. */
static moec_status need_cols(infer_ctx *c, const ir_value *x, const char *key, int64_t col,
                             int64_t n)
{
    if (col < 0 || col > x->type.dims[1] || n > x->type.dims[1] - col)
        return fail(c, "%s %" PRId64 " + %" PRId64 " columns is past %%%s (%s)", key, col, n,
                    vname(x), tfmt(&x->type).s);
    return MOEC_OK;
}

/* The DSA indexer's scores and top-k: q [T, Hi, Di], k [T, Di], w [T, Hi];
 * with heads, q [T, Nq] and w [T, Nw] holding them at q_col and w_col;
 * with rope's attributes, q rotated first. */
static moec_status infer_dsa_topk(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *q = op->in[0], *k = op->in[1], *w = op->in[2];
    int rows = ir_op_attr(op, "heads") != NULL;
    MOEC_TRY(need_act(c, q, "q", rows ? 2 : 3, rows ? 2 : 3, 1));
    MOEC_TRY(need_act(c, k, "k", 2, 2, 1));
    MOEC_TRY(need_act(c, w, "weights", 2, 2, 1));
    MOEC_TRY(need_pos(c, op->in[3]));
    int64_t Di = k->type.dims[1], Hi;
    if (rows) {
        Hi = ir_op_attr_int(op, "heads", 0);
        if (Hi < 1 || Hi > IR_DIM_MAX / Di)
            return fail(c, "heads %" PRId64 " must be >= 1 (and heads * %" PRId64 " not too large)",
                        Hi, Di);
        MOEC_TRY(need_cols(c, q, "q_col", ir_op_attr_int(op, "q_col", 0), Hi * Di));
        MOEC_TRY(need_cols(c, w, "w_col", ir_op_attr_int(op, "w_col", 0), Hi));
    } else {
        if (ir_op_attr(op, "q_col") || ir_op_attr(op, "w_col"))
            return fail(c, "q_col and w_col need the attribute heads");
        Hi = q->type.dims[1];
        if (q->type.dims[2] != Di)
            return fail(c, "k %%%s has %" PRId64 " channels, q %%%s has head dim %" PRId64,
                        vname(k), Di, vname(q), q->type.dims[2]);
        if (w->type.dims[1] != Hi)
            return fail(c, "weights %%%s has %" PRId64 " heads, q %%%s has %" PRId64, vname(w),
                        w->type.dims[1], vname(q), Hi);
    }
    static const char *const rope_keys[] = {"style",     "theta",       "scaling",   "factor",
                                            "yarn_low",  "yarn_high",   "attn_factor", "rotary_dim"};
    int rope = 0;
    for (int i = 0; i < 8; i++)
        rope |= ir_op_attr(op, rope_keys[i]) != NULL;
    if (rope) {
        if (!ir_op_attr(op, "theta"))
            return fail(c, "a rope of q needs attribute 'theta'");
        int64_t rd;
        MOEC_TRY(rope_attrs(c));
        if (Di % 2)
            return fail(c, "head dim %" PRId64 " must be even for a rope of q", Di);
        MOEC_TRY(rotary_dim(c, Di, &rd));
    }
    int64_t K = ir_op_attr_int(op, "top_k", 0);
    if (K < 1 || K > IR_DIM_MAX)
        return fail(c, "top_k %" PRId64 " must be >= 1", K);
    double scale = ir_op_attr_float(op, "scale", 0), ws = ir_op_attr_float(op, "weight_scale", 0);
    if (!isfinite(scale) || scale <= 0)
        return fail(c, "scale %g must be finite and > 0", scale);
    if (!isfinite(ws))
        return fail(c, "weight_scale %g must be finite", ws);
    out[0] = type_make(IR_DTYPE_I32, 2, IR_DIM_T, K, 0);
    return MOEC_OK;
}

/* dsa_prologue_k: x [T, N] holding the key's D columns at col, pos, the
 * LayerNorm's weight and bias [D]; rope's attributes with rotary_dim. */
static moec_status infer_dsa_prologue_k(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *x = op->in[0];
    MOEC_TRY(need_act(c, x, "input", 2, 2, 1));
    MOEC_TRY(need_pos(c, op->in[1]));
    int64_t D;
    MOEC_TRY(prologue_norm(c, 2, "weight", &D));
    MOEC_TRY(need_static(c, op->in[3], "bias", 1));
    if (op->in[3]->type.dims[0] != D)
        return fail(c, "bias %%%s has %" PRId64 " elements, weight %%%s %" PRId64,
                    vname(op->in[3]), op->in[3]->type.dims[0], vname(op->in[2]), D);
    MOEC_TRY(need_cols(c, x, "col", ir_op_attr_int(op, "col", -1), D));
    MOEC_TRY(rope_attrs(c));
    if (D % 2)
        return fail(c, "key width %" PRId64 " must be even", D);
    int64_t rd;
    MOEC_TRY(rotary_dim(c, D, &rd));
    out[0] = type_make(IR_DTYPE_F32, 2, IR_DIM_T, D, 0);
    return MOEC_OK;
}

/* attn_prologue: x [T, N] holding H q heads, then Hkv k heads and Hkv v
 * heads of D from column 0, pos, and q_norm and k_norm [D] with eps, or
 * neither; rope's attributes with rotary_dim. */
static moec_status infer_attn_prologue(infer_ctx *c, ir_type *out)
{
    const ir_op *op = c->op;
    const ir_value *x = op->in[0];
    MOEC_TRY(need_act(c, x, "input", 2, 2, 1));
    MOEC_TRY(need_pos(c, op->in[1]));
    int64_t H, Hkv, D;
    MOEC_TRY(prologue_dim(c, "heads", &H));
    MOEC_TRY(prologue_dim(c, "kv_heads", &Hkv));
    MOEC_TRY(prologue_dim(c, "head_dim", &D));
    if (H % Hkv)
        return fail(c, "heads %" PRId64 " are not a multiple of kv_heads %" PRId64, H, Hkv);
    if (D % 2)
        return fail(c, "head_dim %" PRId64 " must be even", D);
    if (op->n_in == 3)
        return fail(c, "takes q_norm and k_norm, or neither: 1 norm weight given");
    int norms = op->n_in == 4;
    if (norms != (ir_op_attr(op, "eps") != NULL))
        return fail(c, "%s", norms ? "q_norm and k_norm need attribute 'eps'"
                                   : "attribute 'eps' without q_norm and k_norm");
    for (int i = 2; i < op->n_in; i++) {
        int64_t n;
        MOEC_TRY(prologue_norm(c, i, i == 2 ? "q_norm" : "k_norm", &n));
        if (n != D)
            return fail(c, "%s %%%s has %" PRId64 " elements, head_dim is %" PRId64,
                        i == 2 ? "q_norm" : "k_norm", vname(op->in[i]), n, D);
    }
    MOEC_TRY(rope_attrs(c));
    int64_t rd;
    MOEC_TRY(rotary_dim(c, D, &rd));
    /* every size <= IR_DIM_MAX: the heads' product checked, no overflow */
    if (D > IR_DIM_MAX / (H + 2 * Hkv))
        return fail(c, "(heads %" PRId64 " + 2 * kv_heads %" PRId64 ") * head_dim %" PRId64
                       " is too large",
                    H, Hkv, D);
    int64_t need = (H + 2 * Hkv) * D;
    if (need > x->type.dims[1])
        return fail(c, "input %%%s (%s) has %" PRId64 " columns, its sections need %" PRId64,
                    vname(x), tfmt(&x->type).s, x->type.dims[1], need);
    out[0] = type_make(IR_DTYPE_F32, 3, IR_DIM_T, H, D);
    out[1] = type_make(IR_DTYPE_F32, 3, IR_DIM_T, Hkv, D);
    out[2] = out[1];
    return MOEC_OK;
}

/* fork and join: the result is x, type and all. */
static moec_status infer_identity(infer_ctx *c, ir_type *out)
{
    const ir_value *x = c->op->in[0];
    if (!ir_type_has_t(&x->type))
        return fail(c, "input %%%s must have T as its first dimension, got %s", vname(x),
                    tfmt(&x->type).s);
    out[0] = x->type;
    return MOEC_OK;
}

/* ---- collectives ---------------------------------------------------------- */

/* A float activation x and the ranks attribute (1 to IR_MAX_RANKS). */
static moec_status need_collective(infer_ctx *c, int64_t *ranks)
{
    MOEC_TRY(need_act(c, c->op->in[0], "input", 1, IR_MAX_RANK, 1));
    *ranks = ir_op_attr_int(c->op, "ranks", 0);
    if (*ranks < 1 || *ranks > IR_MAX_RANKS)
        return fail(c, "ranks %" PRId64 " out of range [1, %d]", *ranks, IR_MAX_RANKS);
    return MOEC_OK;
}

static moec_status infer_all_reduce(infer_ctx *c, ir_type *out)
{
    int64_t ranks;
    MOEC_TRY(need_collective(c, &ranks));
    out[0] = type_like(&c->op->in[0]->type, IR_DTYPE_F32);
    return MOEC_OK;
}

/* all_gather, reduce_scatter and all_to_all: the dim `axis` grows by ranks,
 * shrinks by ranks (which must divide it) or stays. */
static moec_status infer_blocked(infer_ctx *c, ir_type *out)
{
    int64_t ranks;
    MOEC_TRY(need_collective(c, &ranks));
    const ir_value *x = c->op->in[0];
    ir_type r = type_like(&x->type, IR_DTYPE_F32);
    int axis = 0;
    MOEC_TRY(axis_attr(c, "axis", r.rank, &axis));
    if (c->op->kind == IR_OP_ALL_GATHER)
        r.dims[axis] *= ranks;
    else if (r.dims[axis] % ranks)
        return fail(c, "dim %d of %%%s (%s) does not split into %" PRId64 " ranks", axis,
                    vname(x), tfmt(&x->type).s, ranks);
    else if (c->op->kind == IR_OP_REDUCE_SCATTER)
        r.dims[axis] /= ranks;
    if (!ir_type_valid(&r, 1))
        return fail(c, "result %s is too large", tfmt(&r).s);
    out[0] = r;
    return MOEC_OK;
}

moec_status ir_op_infer_msg(const ir_op *op, ir_type *out, char *msg, size_t cap)
{
    infer_ctx c = {op, msg, cap};
    if (msg && cap)
        msg[0] = '\0';
    const op_info *info = op ? op_info_get(op->kind) : NULL;
    if (!info)
        return fail(&c, "unknown op kind %d", op ? (int)op->kind : -1);
    if (!out)
        return fail(&c, "no room for the result types");
    if (op->n_out != info->n_out)
        return fail(&c, "has %d results, expected %d", op->n_out, info->n_out);
    for (int i = 0; i < op->n_out; i++)
        if (!op->out[i])
            return fail(&c, "result %d is missing", i);
    if (op->n_in < info->min_in || op->n_in > info->max_in) {
        if (info->min_in == info->max_in)
            return fail(&c, "takes %d operands, got %d", info->min_in, op->n_in);
        return fail(&c, "takes %d to %d operands, got %d", info->min_in, info->max_in, op->n_in);
    }
    for (int i = 0; i < op->n_in; i++) {
        if (!op->in[i])
            return fail(&c, "operand %d is missing", i);
        if (!ir_type_valid(&op->in[i]->type, 1))
            return fail(&c, "operand %%%s has an invalid type %s", vname(op->in[i]),
                        tfmt(&op->in[i]->type).s);
    }
    MOEC_TRY(ir_op_check_attrs(op, msg, cap));
    memset(out, 0, sizeof(ir_type) * (size_t)info->n_out);
    switch (op->kind) {
    case IR_OP_EMBEDDING: return infer_embedding(&c, out);
    case IR_OP_RMS_NORM: return infer_rms_norm(&c, out);
    case IR_OP_LINEAR: return infer_linear(&c, out);
    case IR_OP_RESHAPE: return infer_reshape(&c, out);
    case IR_OP_SLICE: return infer_slice(&c, out);
    case IR_OP_CONCAT: return infer_concat(&c, out);
    case IR_OP_EXPAND: return infer_expand(&c, out);
    case IR_OP_ADD:
    case IR_OP_MUL: return infer_binary(&c, out);
    case IR_OP_SILU:
    case IR_OP_SIGMOID: return infer_unary(&c, out);
    case IR_OP_ROPE: return infer_rope(&c, out);
    case IR_OP_ATTENTION: return infer_attention(&c, out);
    case IR_OP_MOE_TOPK: return infer_moe_topk(&c, out);
    case IR_OP_MOE_EXPERTS: return infer_moe_experts(&c, out);
    case IR_OP_REDUCE_SUM: return infer_reduce_sum(&c, out);
    case IR_OP_SILU_MUL: return infer_silu_mul(&c, out);
    case IR_OP_MOE_ROUTED: return infer_moe_routed(&c, out);
    case IR_OP_MLA_QABSORB: return infer_mla_qabsorb(&c, out);
    case IR_OP_MLA_ATTENTION: return infer_mla_attention(&c, out);
    case IR_OP_MLA_VABSORB: return infer_mla_vabsorb(&c, out);
    case IR_OP_FORK:
    case IR_OP_JOIN: return infer_identity(&c, out);
    case IR_OP_ADD_RMS_NORM: return infer_add_rms_norm(&c, out);
    case IR_OP_ALL_REDUCE: return infer_all_reduce(&c, out);
    case IR_OP_ALL_GATHER:
    case IR_OP_REDUCE_SCATTER:
    case IR_OP_ALL_TO_ALL: return infer_blocked(&c, out);
    case IR_OP_LAYER_NORM: return infer_layer_norm(&c, out);
    case IR_OP_DSA_TOPK: return infer_dsa_topk(&c, out);
    case IR_OP_MLA_PROLOGUE:
    case IR_OP_MLA_PROLOGUE_KV:
    case IR_OP_MLA_PROLOGUE_Q: return infer_mla_prologue(&c, out);
    case IR_OP_DSA_PROLOGUE_K: return infer_dsa_prologue_k(&c, out);
    case IR_OP_ATTN_PROLOGUE: return infer_attn_prologue(&c, out);
    case IR_OP_COUNT: break;
    }
    return fail(&c, "unknown op kind %d", (int)op->kind);
}

moec_status ir_op_infer(const ir_op *op, ir_type *out)
{
    char msg[IR_MSG_CAP];
    moec_status st = ir_op_infer_msg(op, out, msg, sizeof msg);
    if (st != MOEC_OK)
        return MOEC_ERR(st, "%s", msg);
    return MOEC_OK;
}
