/* pass_shard.c — shard: the fused module of one rank of a tensor- and
 * expert-parallel group (docs/PARALLEL.md). tp ranks split attention by
 * heads, every MLP and shared expert by its intermediate, the vocabulary of
 * the embedding and lm_head, and the routed experts: spread over ep groups
 * of tp/ep ranks, each expert's intermediate split over the ranks of its
 * group (ep 1: tensor parallel inside every expert; ep tp: whole experts per
 * rank). As nano-vllm's linear classes and vLLM's DeepSeek code (seeds):
 * q_b / q_proj, kv_b and the merged gate_up are column-parallel (a rank's
 * rows of gate AND of up), o_proj and down row-parallel with an all_reduce
 * after them, MLA's q_a / kv_a (and the router) replicated, GQA's kv heads
 * split or, fewer than the ranks, replicated; the routed experts' partial
 * sums meet in the same all_reduce as the shared expert's, and the vocab-
 * parallel logits in an all_gather. Every weight's binding names the box of
 * the checkpoint tensor its rank reads; a block-scaled (fp8) weight's scales
 * the blocks that box touches, the box starting on a block boundary and
 * ending on one or at its tensor's end, or the split is refused naming the
 * weight, rank, rows or columns and block (check_blocks).
 *
 * Nothing is matched by name. Each activation gets a layout: replicated
 * (full), a box along one axis (narrow: one or more ranges of it, joined in
 * order; a rank's share of a split, or a window of it every rank reads), or
 * a partial sum of the ranks'. A backward sweep says which layout each
 * value's users would like (attention wants its rank's heads, a slice only
 * its window), a forward sweep gives each op the layout it can produce from
 * its operands and what is wanted, and puts a collective or a local slice
 * where an operand arrives in another layout than its op needs. The seeds
 * of the split are the ops with a natural parallel axis: attention heads,
 * silu_mul's intermediate, the experts of moe_routed, the embedding's rows
 * and the module output's vocabulary. The shapes that do not split evenly
 * are refused naming the config field, before anything is rewritten. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/passes.h"
#include "err.h"

#define LAY_MAX 8 /* most ranges of a narrowed axis (Qwen's q, k and v) */

typedef enum lay_kind {
    LAY_DC = 0, /* no user cares (demands only) */
    LAY_FULL,   /* the whole value, the same on every rank */
    LAY_NARROW, /* ranges of one axis */
    LAY_PART,   /* a partial sum: the value is the sum over the ranks */
} lay_kind;

typedef struct lay {
    lay_kind kind;
    int split; /* NARROW: 0 a window every rank reads alike; 1 this rank's share of
                  a partition of the axis over the ranks; 2 rank-dependent otherwise */
    int axis;  /* NARROW */
    int n;     /* NARROW: ranges, ascending, disjoint */
    int64_t lo[LAY_MAX], len[LAY_MAX];
} lay;

/* A conversion made once and reused by later users. */
typedef struct conv {
    const ir_value *v;
    lay to;
    ir_value *out;
} conv;

/* A weight's box along up to three axes. */
typedef struct wspec {
    int n;
    int axis[3];
    lay r[3];
} wspec;

typedef struct wmemo {
    int orig_id;
    wspec spec;
    ir_value *out;
} wmemo;

typedef struct shard_ctx {
    ir_module *m;
    const pass_options *opt;
    int tp, ep, rank;
    int moe_tp, moe_rank; /* the ranks of one expert group, and this rank among them */
    int n0;               /* values before the pass */
    ir_type *orig;        /* per original value: its unsharded type */
    ir_binding *orig_bind;/* per original weight: its unsharded binding */
    ir_block_scale *orig_scale; /* per original weight: its unsharded block scales */
    lay *want, *have;     /* per original value */
    conv *convs;
    int n_convs, cap_convs;
    wmemo *wm;
    int n_wm, cap_wm;
    int deepseek;         /* config field names: DeepSeek's, else Qwen's */
} shard_ctx;

/* Room for one more of n elements of `elem` bytes in the malloc'd *arr. */
static moec_status grow(void **arr, int n, int *cap, size_t elem)
{
    if (n < *cap)
        return MOEC_OK;
    int next = *cap ? 2 * *cap : 64;
    void *g = realloc(*arr, elem * (size_t)next);
    if (!g)
        return MOEC_ERR(MOEC_ERR_OOM, "shard: out of memory");
    *arr = g;
    *cap = next;
    return MOEC_OK;
}

/* ---- layouts ---------------------------------------------------------------- */

static lay lay_of(lay_kind k)
{
    lay l;
    memset(&l, 0, sizeof l);
    l.kind = k;
    return l;
}

static lay lay_range(int axis, int64_t lo, int64_t len, int split)
{
    lay l = lay_of(LAY_NARROW);
    l.axis = axis;
    l.split = split;
    l.n = 1;
    l.lo[0] = lo;
    l.len[0] = len;
    return l;
}

static int64_t lay_total(const lay *l)
{
    int64_t n = 0;
    for (int i = 0; i < l->n; i++)
        n += l->len[i];
    return n;
}

static int lay_equal(const lay *a, const lay *b)
{
    if (a->kind != b->kind)
        return 0;
    if (a->kind != LAY_NARROW)
        return 1;
    if (a->axis != b->axis || a->n != b->n || a->split != b->split)
        return 0;
    for (int i = 0; i < a->n; i++)
        if (a->lo[i] != b->lo[i] || a->len[i] != b->len[i])
            return 0;
    return 1;
}

/* l's ranges shifted by d. */
static lay lay_shift(lay l, int64_t d)
{
    for (int i = 0; i < l.n; i++)
        l.lo[i] += d;
    return l;
}

/* Adds [lo, lo+len) to l's ranges, merging what touches; 0 when full. */
static int lay_add_range(lay *l, int64_t lo, int64_t len)
{
    int64_t hi = lo + len;
    int i = 0;
    while (i < l->n && l->lo[i] + l->len[i] < lo)
        i++;
    int j = i;
    while (j < l->n && l->lo[j] <= hi) {
        if (l->lo[j] < lo)
            lo = l->lo[j];
        if (l->lo[j] + l->len[j] > hi)
            hi = l->lo[j] + l->len[j];
        j++;
    }
    int n = l->n - (j - i) + 1;
    if (n > LAY_MAX)
        return 0;
    memmove(&l->lo[i + 1], &l->lo[j], sizeof l->lo[0] * (size_t)(l->n - j));
    memmove(&l->len[i + 1], &l->len[j], sizeof l->len[0] * (size_t)(l->n - j));
    l->lo[i] = lo;
    l->len[i] = hi - lo;
    l->n = n;
    return 1;
}

/* The demand of two users together: DC yields, full wins, boxes of one
 * axis join. */
static lay lay_merge(const lay *a, const lay *b)
{
    if (a->kind == LAY_DC)
        return *b;
    if (b->kind == LAY_DC)
        return *a;
    if (a->kind != LAY_NARROW || b->kind != LAY_NARROW || a->axis != b->axis)
        return lay_of(LAY_FULL);
    if (lay_equal(a, b))
        return *a;
    lay r = *a;
    r.split = a->split == 0 && b->split == 0 ? 0 : 2;
    for (int i = 0; i < b->n; i++)
        if (!lay_add_range(&r, b->lo[i], b->len[i]))
            return lay_of(LAY_FULL);
    return r;
}

/* t with l's axis narrowed to l's ranges. */
static ir_type lay_type(const ir_type *t, const lay *l)
{
    ir_type r = *t;
    if (l->kind == LAY_NARROW)
        r.dims[l->axis] = lay_total(l);
    return r;
}

/* 1 when l holds the whole of dim `dim` (one range [0, dim)). */
static int lay_whole(const lay *l, int64_t dim)
{
    return l->kind == LAY_NARROW && l->n == 1 && l->lo[0] == 0 && l->len[0] == dim;
}

/* The position in l's local layout of global index g, or -1. */
static int64_t lay_local(const lay *l, int64_t g)
{
    int64_t at = 0;
    for (int i = 0; i < l->n; i++) {
        if (g >= l->lo[i] && g < l->lo[i] + l->len[i])
            return at + g - l->lo[i];
        at += l->len[i];
    }
    return -1;
}

/* ---- errors naming the config field ----------------------------------------- */

/* The config field behind a dimension the pass splits, in the module's family. */
typedef enum shard_field {
    F_HEADS,
    F_KV_HEADS,
    F_INTERMEDIATE,
    F_SHARED_INTERMEDIATE,
    F_EXPERTS,
    F_MOE_INTERMEDIATE,
    F_VOCAB,
    F_HIDDEN,
} shard_field;

static const char *field_name(const shard_ctx *c, shard_field f)
{
    switch (f) {
    case F_HEADS: return "num_attention_heads";
    case F_KV_HEADS: return "num_key_value_heads";
    case F_INTERMEDIATE: return "intermediate_size";
    case F_SHARED_INTERMEDIATE:
        return c->deepseek ? "moe_intermediate_size * n_shared_experts"
                           : "shared_expert_intermediate_size";
    case F_EXPERTS: return c->deepseek ? "n_routed_experts" : "num_experts";
    case F_MOE_INTERMEDIATE: return "moe_intermediate_size";
    case F_VOCAB: return "vocab_size";
    case F_HIDDEN: return "hidden_size";
    }
    return "?";
}

static moec_status need_divides(const shard_ctx *c, int64_t dim, int ways, const char *what,
                                shard_field f, const ir_value *at)
{
    if (dim % ways == 0)
        return MOEC_OK;
    return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                    "%s %d does not divide %s %" PRId64 " (%%%s): the shard pass splits it "
                    "evenly over the ranks",
                    what, ways, field_name(c, f), dim, at->name);
}

/* ---- what each op splits ------------------------------------------------------ */

/* A value an activation op reads (not a weight). */
static int is_act(const ir_value *v) { return v && v->kind != IR_VALUE_WEIGHT; }

/* The rank's even share [rank * d / ways, ...) of dim d. */
static lay share(int axis, int64_t d, int ways, int rank)
{
    return lay_range(axis, rank * (d / ways), d / ways, 1);
}

/* attention: the rank's q heads, and the kv heads they read (a split of
 * them, or, with fewer kv heads than ranks, the one they share). */
static void attention_heads(const shard_ctx *c, const ir_op *op, lay *q, lay *kv)
{
    int64_t H = c->orig[op->in[0]->id].dims[1], Hkv = c->orig[op->in[1]->id].dims[1];
    *q = share(1, H, c->tp, c->rank);
    if (Hkv % c->tp == 0)
        *kv = share(1, Hkv, c->tp, c->rank);
    else
        *kv = lay_range(1, q->lo[0] / (H / Hkv), 1, 2);
}

/* silu_mul's intermediate I: the rank's share of gate's half and of up's. */
static lay silu_mul_input(const shard_ctx *c, const ir_op *op, const lay *out)
{
    int last = op->in[0]->type.rank - 1;
    if (out->axis != last)
        return *out;
    int64_t I = c->orig[op->out[0]->id].dims[last];
    lay in = *out;
    for (int i = 0; i < out->n; i++)
        lay_add_range(&in, out->lo[i] + I, out->len[i]);
    return in;
}

/* The ops whose output is split whatever their users want: the seeds. */
static int seed_layout(const shard_ctx *c, const ir_op *op, lay *out)
{
    if (op->kind == IR_OP_ATTENTION) {
        lay kv;
        attention_heads(c, op, out, &kv);
        return 1;
    }
    if (op->kind == IR_OP_MLA_ATTENTION) {
        *out = share(1, c->orig[op->in[0]->id].dims[1], c->tp, c->rank);
        return 1;
    }
    if (op->kind == IR_OP_SILU_MUL) {
        const ir_type *t = &c->orig[op->out[0]->id];
        *out = share(t->rank - 1, t->dims[t->rank - 1], c->tp, c->rank);
        return 1;
    }
    return 0;
}

/* Maps a box of axis `a` of type `from` onto type `to` of the same elements
 * per token (a reshape): the flat range each box range covers must be a
 * range of one axis of `to`. 0 when it is not. */
static int reshape_map(const ir_type *from, const ir_type *to, const lay *l, lay *out)
{
    int64_t inner = 1;
    for (int d = 1; d < l->axis; d++)
        if (from->dims[d] != 1)
            return 0;
    for (int d = l->axis + 1; d < from->rank; d++)
        inner *= from->dims[d];
    for (int b = 1; b < to->rank; b++) {
        int64_t tin = 1;
        for (int d = b + 1; d < to->rank; d++)
            tin *= to->dims[d];
        int ok = 1;
        for (int i = 0; i < l->n && ok; i++)
            ok = (l->lo[i] * inner) % tin == 0 && (l->len[i] * inner) % tin == 0;
        if (ok) {
            *out = *l;
            out->axis = b;
            for (int i = 0; i < l->n; i++) {
                out->lo[i] = l->lo[i] * inner / tin;
                out->len[i] = l->len[i] * inner / tin;
            }
            return 1;
        }
        if (to->dims[b] != 1)
            return 0;
    }
    return 0;
}

/* For op to produce out[0] in layout `out` (narrow), the layout operand i
 * must arrive in (weights: DC, their box is the op's business); 0 when op
 * cannot produce that layout. */
static int operand_layout(const shard_ctx *c, const ir_op *op, const lay *out, int i, lay *req)
{
    const ir_value *x = op->in[i];
    *req = lay_of(LAY_DC);
    if (!is_act(x))
        return 1;
    int a = out->axis;
    const ir_type *tx = &c->orig[x->id];
    switch (op->kind) {
    case IR_OP_RMS_NORM:
        if (a == tx->rank - 1)
            return 0;
        *req = *out;
        return 1;
    case IR_OP_ROPE:
    case IR_OP_MLA_QABSORB:
    case IR_OP_MLA_VABSORB:
        if (a != 1)
            return 0;
        *req = i == 0 ? *out : lay_of(LAY_FULL);
        return 1;
    case IR_OP_RESHAPE: return reshape_map(&c->orig[op->out[0]->id], tx, out, req);
    case IR_OP_SLICE: {
        int s = (int)ir_op_attr_int(op, "axis", 0);
        *req = a == s ? lay_shift(*out, ir_op_attr_int(op, "start", 0)) : *out;
        return 1;
    }
    case IR_OP_CONCAT:
        if (a == ir_op_attr_int(op, "axis", 0))
            return 0;
        *req = *out;
        return 1;
    case IR_OP_EXPAND:
    case IR_OP_ADD:
    case IR_OP_MUL:
        *req = tx->dims[a] == 1 && c->orig[op->out[0]->id].dims[a] != 1 ? lay_of(LAY_FULL) : *out;
        return 1;
    case IR_OP_SILU:
    case IR_OP_SIGMOID:
    case IR_OP_FORK:
    case IR_OP_JOIN: *req = *out; return 1;
    case IR_OP_SILU_MUL: *req = silu_mul_input(c, op, out); return 1;
    case IR_OP_REDUCE_SUM: {
        int s = (int)ir_op_attr_int(op, "axis", 0);
        *req = *out;
        req->axis = a < s ? a : a + 1;
        return 1;
    }
    case IR_OP_LINEAR:
        if (a != 1)
            return 0;
        *req = lay_of(LAY_FULL);
        return 1;
    case IR_OP_ATTENTION: {
        lay q, kv;
        attention_heads(c, op, &q, &kv);
        if (a != 1 || !lay_equal(out, &q))
            return 0;
        *req = i == 0 ? q : i < 3 ? kv : lay_of(LAY_FULL);
        return 1;
    }
    case IR_OP_MLA_ATTENTION:
        if (a != 1)
            return 0;
        *req = i < 2 ? *out : lay_of(LAY_FULL);
        return 1;
    default: return 0;
    }
}

/* The layout op's output takes when operand 0 arrives narrowed as `in` and
 * no user asked for more; 0 when op cannot keep that split. */
static int output_from_operand(const shard_ctx *c, const ir_op *op, const lay *in, lay *out)
{
    lay cand = *in;
    switch (op->kind) {
    case IR_OP_RESHAPE:
        if (!reshape_map(&c->orig[op->in[0]->id], &c->orig[op->out[0]->id], in, &cand))
            return 0;
        break;
    case IR_OP_REDUCE_SUM: {
        int s = (int)ir_op_attr_int(op, "axis", 0);
        if (in->axis == s)
            return 0;
        cand.axis = in->axis < s ? in->axis : in->axis - 1;
        break;
    }
    case IR_OP_SLICE:
        if (in->axis == ir_op_attr_int(op, "axis", 0))
            return 0; /* handled by the slice itself */
        break;
    case IR_OP_SILU_MUL:
    case IR_OP_RMS_NORM:
    case IR_OP_ROPE:
    case IR_OP_MLA_QABSORB:
    case IR_OP_MLA_VABSORB:
    case IR_OP_CONCAT:
    case IR_OP_EXPAND:
    case IR_OP_ADD:
    case IR_OP_MUL:
    case IR_OP_SILU:
    case IR_OP_SIGMOID:
    case IR_OP_FORK:
    case IR_OP_JOIN: break;
    default: return 0;
    }
    lay req;
    if (!operand_layout(c, op, &cand, 0, &req) || !lay_equal(&req, in))
        return 0;
    *out = cand;
    return 1;
}

/* ---- the backward sweep: what users want ------------------------------------ */

static void want_add(shard_ctx *c, const ir_value *v, const lay *l)
{
    if (is_act(v) && v->id < c->n0)
        c->want[v->id] = lay_merge(&c->want[v->id], l);
}

/* The demands op puts on its operands, given what is wanted of its output. */
static void demand_operands(shard_ctx *c, const ir_op *op)
{
    lay out = c->want[op->out[0]->id], req;
    lay full = lay_of(LAY_FULL);
    if (seed_layout(c, op, &out) || out.kind == LAY_NARROW) {
        if (op->kind == IR_OP_SLICE || operand_layout(c, op, &out, 0, &req)) {
            for (int i = 0; i < op->n_in; i++)
                if (operand_layout(c, op, &out, i, &req))
                    want_add(c, op->in[i], &req);
            return;
        }
    }
    switch (op->kind) {
    case IR_OP_SLICE: {
        /* a slice reads only its window */
        lay win = lay_range((int)ir_op_attr_int(op, "axis", 0), ir_op_attr_int(op, "start", 0),
                            ir_op_attr_int(op, "size", 0), 0);
        want_add(c, op->in[0], &win);
        return;
    }
    case IR_OP_LINEAR:
        /* row-parallel takes a partition of its columns, which arrives
         * whatever is asked; a window of them would be wrong */
        want_add(c, op->in[0], &full);
        return;
    case IR_OP_RESHAPE:
    case IR_OP_ADD:
    case IR_OP_MUL:
    case IR_OP_REDUCE_SUM:
    case IR_OP_FORK:
    case IR_OP_JOIN:
    case IR_OP_RMS_NORM:
    case IR_OP_ROPE:
    case IR_OP_SILU:
    case IR_OP_SIGMOID:
    case IR_OP_CONCAT:
    case IR_OP_EXPAND:
    case IR_OP_MLA_QABSORB:
    case IR_OP_MLA_VABSORB: return; /* whatever arrives: row-parallel, or kept as it comes */
    default:
        for (int i = 0; i < op->n_in; i++)
            want_add(c, op->in[i], &full);
        return;
    }
}

/* ---- weights ------------------------------------------------------------------- */

/* Where the checkpoint tensor of leaf b is declared in the frontend's
 * module (opt->source), for its extent along `axis`; -1 when unknown. */
static int64_t source_extent(const shard_ctx *c, const ir_binding *b, int axis)
{
    if (b->box_rank && b->box_size[axis] > 0)
        return b->box_size[axis];
    if (b->kind == IR_BIND_STACK && axis == 0)
        return b->count;
    const ir_module *src = c->opt->source;
    for (int i = 0; src && i < src->n_values; i++) {
        const ir_value *v = src->values[i];
        if (v->kind == IR_VALUE_WEIGHT && v->bind.kind == b->kind && !v->bind.box_rank &&
            v->bind.name && !strcmp(v->bind.name, b->name))
            return v->type.dims[axis];
    }
    return -1;
}

/* Leaf b boxed to [lo, lo+len) along axis (inside any box it has). */
static ir_binding leaf_box(const ir_binding *b, int rank, int axis, int64_t lo, int64_t len)
{
    ir_binding r = *b;
    if (!r.box_rank) {
        r.box_rank = rank;
        memset(r.box_start, 0, sizeof r.box_start);
        memset(r.box_size, 0, sizeof r.box_size);
    }
    r.box_start[axis] += lo;
    r.box_size[axis] = len;
    return r;
}

/* *b (type *t) restricted to l's ranges of its axis l->axis; the parts
 * go into the module's arena. */
static moec_status bind_restrict(shard_ctx *c, const ir_value *w, ir_binding *b, ir_type *t,
                                 const lay *l)
{
    int axis = l->axis;
    if (lay_whole(l, t->dims[axis]))
        return MOEC_OK;
    ir_binding parts[IR_MAX_OPERANDS * LAY_MAX];
    int n = 0;
    if (b->kind == IR_BIND_CONCAT && b->axis == axis) {
        int64_t at = 0;
        for (int p = 0; p < b->n_parts; p++) {
            int64_t ext = source_extent(c, &b->parts[p], axis);
            if (ext < 0)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "weight %%%s: the extent of \"%s\" along dim %d is not known "
                                "(the shard pass reads it from the frontend's module)",
                                w->name, b->parts[p].name, axis);
            for (int i = 0; i < l->n; i++) {
                int64_t lo = l->lo[i] > at ? l->lo[i] : at;
                int64_t hi = l->lo[i] + l->len[i] < at + ext ? l->lo[i] + l->len[i] : at + ext;
                if (lo < hi) {
                    if (n == (int)(sizeof parts / sizeof *parts))
                        return MOEC_ERR(MOEC_ERR_INTERNAL, "weight %%%s: too many parts",
                                        w->name);
                    parts[n++] = lo == at && hi == at + ext
                                     ? b->parts[p]
                                     : leaf_box(&b->parts[p], t->rank, axis, lo - at, hi - lo);
                }
            }
            at += ext;
        }
    } else if (b->kind == IR_BIND_CONCAT) {
        if (l->n != 1)
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "weight %%%s: %d ranges of dim %d across a concat of dim %d",
                            w->name, l->n, axis, b->axis);
        for (int p = 0; p < b->n_parts; p++)
            parts[n++] = leaf_box(&b->parts[p], t->rank, axis, l->lo[0], l->len[0]);
    } else {
        for (int i = 0; i < l->n; i++)
            parts[n++] = leaf_box(b, t->rank, axis, l->lo[i], l->len[i]);
    }
    int concat_axis = b->kind == IR_BIND_CONCAT ? b->axis : axis;
    t->dims[axis] = lay_total(l);
    if (n == 1 && b->kind != IR_BIND_CONCAT) {
        *b = parts[0];
        return MOEC_OK;
    }
    if (n > IR_MAX_OPERANDS * LAY_MAX)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "weight %%%s: too many parts", w->name);
    ir_binding *copy = ir_arena_alloc(c->m->arena, sizeof *copy * (size_t)n);
    if (!copy)
        return MOEC_ERR(MOEC_ERR_OOM, "weight %%%s: out of memory", w->name);
    memcpy(copy, parts, sizeof *copy * (size_t)n);
    ir_binding r = {.kind = IR_BIND_CONCAT, .axis = concat_axis, .n_parts = n, .parts = copy};
    *b = r;
    return MOEC_OK;
}

/* The part of original binding `orig` that leaf l (a box of it) comes
 * from: its index (0 when orig is not a concat), or -1. */
static int orig_part(const ir_binding *orig, const ir_binding *l)
{
    if (orig->kind != IR_BIND_CONCAT)
        return 0;
    for (int p = 0; p < orig->n_parts; p++) {
        const ir_binding *o = &orig->parts[p];
        if (o->kind == l->kind && o->count == l->count && o->name && l->name &&
            !strcmp(o->name, l->name))
            return p;
    }
    return -1;
}

/* Leaf l of block-scaled weight w's split binding (a box of original part
 * `o`) read along whole blocks: along each blocked dim its box starts on a
 * block boundary and ends on one or at its tensor's end. */
static moec_status check_blocks(const shard_ctx *c, const ir_value *w, const ir_binding *l,
                                const ir_binding *o)
{
    const ir_block_scale *sc = &c->orig_scale[w->id];
    const ir_binding *ob = &c->orig_bind[w->id];
    const ir_type *t = &c->orig[w->id];
    for (int k = 0; k < 2; k++) {
        int d = t->rank - 2 + k;
        if (d >= l->box_rank || l->box_size[d] <= 0)
            continue;
        int64_t lo = l->box_start[d], hi = lo + l->box_size[d];
        int64_t blk = ir_block_scale_stored(sc, k);
        int64_t ext = ob->kind == IR_BIND_CONCAT && ob->axis == d ? source_extent(c, o, d)
                                                                   : t->dims[d];
        int start_ok = lo % blk == 0, end_ok = hi % blk == 0 || hi == ext;
        if (start_ok && end_ok)
            continue;
        const char *what = k ? "columns" : "rows";
        char of[64] = "";
        if (ext > 0)
            snprintf(of, sizeof of, " (%" PRId64 " %s)", ext, what);
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "shard: weight %%%s is block-scaled fp8 (blocks of %" PRId64 " x %" PRId64
                        "): rank %d's %s %" PRId64 "..%" PRId64 " of \"%s\"%s %s (tp %d, ep %d): "
                        "a rank reads whole blocks of an fp8 checkpoint",
                        w->name, ir_block_scale_stored(sc, 0), ir_block_scale_stored(sc, 1),
                        c->rank, what, lo, hi, l->name, of,
                        start_ok ? "end neither on a block boundary nor at the tensor's end"
                                 : "do not start on a block boundary",
                        c->tp, c->ep);
    }
    return MOEC_OK;
}

/* The scales of block-scaled weight w once its binding is b (its original
 * one boxed by the split), into *s (parts in `parts`): for each leaf of b
 * the original scale leaf of its part, boxed to the blocks the leaf's box
 * touches. Each leaf must read whole blocks (check_blocks). */
static moec_status scale_for(const shard_ctx *c, const ir_value *w, const ir_binding *b,
                             ir_binding *s, ir_binding *parts)
{
    const ir_block_scale *sc = &c->orig_scale[w->id];
    const ir_binding *ob = &c->orig_bind[w->id];
    int n = b->kind == IR_BIND_CONCAT ? b->n_parts : 1;
    for (int i = 0; i < n; i++) {
        const ir_binding *l = b->kind == IR_BIND_CONCAT ? &b->parts[i] : b;
        int p = orig_part(ob, l);
        if (p < 0)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "shard: weight %%%s: \"%s\" is not a part of "
                            "its binding", w->name, l->name ? l->name : "");
        MOEC_TRY(check_blocks(c, w, l, ob->kind == IR_BIND_CONCAT ? &ob->parts[p] : ob));
        parts[i] = sc->bind.kind == IR_BIND_CONCAT ? sc->bind.parts[p] : sc->bind;
        const int64_t stored[2] = {ir_block_scale_stored(sc, 0), ir_block_scale_stored(sc, 1)};
        ir_block_scale_box(l, c->orig[w->id].rank, stored, &parts[i]);
    }
    if (b->kind == IR_BIND_CONCAT)
        *s = (ir_binding){.kind = IR_BIND_CONCAT, .axis = b->axis, .n_parts = n, .parts = parts};
    else
        *s = parts[0];
    return MOEC_OK;
}

static int wspec_equal(const wspec *a, const wspec *b)
{
    if (a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++)
        if (a->axis[i] != b->axis[i] || !lay_equal(&a->r[i], &b->r[i]))
            return 0;
    return 1;
}

/* Weight w (an original weight) boxed as spec says: changed in place the
 * first time, a new weight for a second, different box. */
static moec_status weight_for(shard_ctx *c, ir_value *w, const wspec *spec, ir_value **out)
{
    int first = 1;
    for (int i = 0; i < c->n_wm; i++) {
        if (c->wm[i].orig_id != w->id)
            continue;
        if (wspec_equal(&c->wm[i].spec, spec)) {
            *out = c->wm[i].out;
            return MOEC_OK;
        }
        first = 0;
    }
    ir_type t = c->orig[w->id];
    ir_binding b = c->orig_bind[w->id];
    for (int i = 0; i < spec->n; i++)
        MOEC_TRY(bind_restrict(c, w, &b, &t, &spec->r[i]));
    const ir_block_scale *sc = &c->orig_scale[w->id];
    ir_binding sb, sparts[IR_MAX_OPERANDS * LAY_MAX];
    if (sc->block[0] > 0)
        MOEC_TRY(scale_for(c, w, &b, &sb, sparts));
    ir_value *v = w;
    if (first) {
        w->type = t;
        w->bind = b;
    } else {
        char name[512];
        snprintf(name, sizeof name, "%s.shard", w->name);
        const char *unique = ir_module_unique_name(c->m, name);
        if (!unique || !(v = ir_module_add_weight_bound(c->m, unique, t, &b)))
            return moec_err_wrap(MOEC_ERR_INTERNAL, "sharding weight %%%s", w->name);
    }
    if (sc->block[0] > 0 &&
        (ir_weight_set_block_scale(c->m, v, ir_block_scale_stored(sc, 0),
                                   ir_block_scale_stored(sc, 1), &sb) != MOEC_OK ||
         ir_weight_refine_block_scale(c->m, v, sc->block[0], sc->block[1]) != MOEC_OK))
        return moec_err_wrap(MOEC_ERR_INTERNAL, "sharding weight %%%s", w->name);
    MOEC_TRY(grow((void **)&c->wm, c->n_wm, &c->cap_wm, sizeof *c->wm));
    c->wm[c->n_wm++] = (wmemo){w->id, *spec, v};
    *out = v;
    return MOEC_OK;
}

/* Operand i of op (a weight) boxed along one axis. */
static moec_status box_operand(shard_ctx *c, ir_op *op, int i, int axis, const lay *l)
{
    wspec s = {.n = 1, .axis = {axis}, .r = {*l}};
    s.r[0].axis = axis;
    return weight_for(c, op->in[i], &s, &op->in[i]);
}

/* ---- conversions ---------------------------------------------------------------- */

/* A new op of kind over x (one result `name`), placed before `before`
 * (NULL: at the end), with axis (>= 0) and ranks attributes. */
static moec_status add_op1(shard_ctx *c, ir_op_kind kind, ir_value *x, const char *name,
                           ir_op *before, int axis, int64_t start, int64_t size, ir_value **out)
{
    const char *unique = ir_module_unique_name(c->m, name);
    if (!unique)
        return MOEC_ERR(MOEC_ERR_OOM, "shard: out of memory");
    ir_op *op = ir_module_add_op(c->m, kind, &x, 1, &unique, 1);
    if (!op)
        return moec_err_wrap(MOEC_ERR_INTERNAL, "shard: adding %s", ir_op_name(kind));
    if (kind == IR_OP_SLICE) {
        MOEC_TRY(ir_op_set_int(c->m, op, "axis", axis));
        MOEC_TRY(ir_op_set_int(c->m, op, "start", start));
        MOEC_TRY(ir_op_set_int(c->m, op, "size", size));
    } else {
        if (kind != IR_OP_ALL_REDUCE)
            MOEC_TRY(ir_op_set_int(c->m, op, "axis", axis));
        MOEC_TRY(ir_op_set_int(c->m, op, "ranks", c->tp));
    }
    MOEC_TRY(ir_op_finish(c->m, op, NULL));
    if (before)
        MOEC_TRY(ir_module_move_op_before(c->m, op, before));
    *out = op->out[0];
    return MOEC_OK;
}

static const char *name_with(const ir_value *v, const char *suffix, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s.%s", v->name, suffix);
    return buf;
}

/* x (holding `from`) cut down locally to `to` (a box of the same axis that
 * from holds, or of a full value): one slice, or slices joined. */
static moec_status local_slices(shard_ctx *c, ir_value *x, const lay *from, const lay *to,
                                ir_op *before, ir_value **out)
{
    ir_value *pieces[LAY_MAX];
    char name[512];
    for (int i = 0; i < to->n; i++) {
        int64_t at = from->kind == LAY_NARROW ? lay_local(from, to->lo[i]) : to->lo[i];
        if (at < 0 || (from->kind == LAY_NARROW &&
                       lay_local(from, to->lo[i] + to->len[i] - 1) != at + to->len[i] - 1))
            return MOEC_ERR(MOEC_ERR_INTERNAL, "shard: %%%s does not hold range [%" PRId64
                            ", %" PRId64 ") of dim %d",
                            x->name, to->lo[i], to->lo[i] + to->len[i], to->axis);
        MOEC_TRY(add_op1(c, IR_OP_SLICE, x, name_with(x, "local", name, sizeof name), before,
                         to->axis, at, to->len[i], &pieces[i]));
    }
    if (to->n == 1) {
        *out = pieces[0];
        return MOEC_OK;
    }
    const char *unique = ir_module_unique_name(c->m, name_with(x, "local", name, sizeof name));
    ir_op *op = unique ? ir_module_add_op(c->m, IR_OP_CONCAT, pieces, to->n, &unique, 1) : NULL;
    if (!op)
        return moec_err_wrap(MOEC_ERR_INTERNAL, "shard: joining the slices of %%%s", x->name);
    MOEC_TRY(ir_op_set_int(c->m, op, "axis", to->axis));
    MOEC_TRY(ir_op_finish(c->m, op, NULL));
    MOEC_TRY(ir_module_move_op_before(c->m, op, before));
    *out = op->out[0];
    return MOEC_OK;
}

/* 1 when l is this rank's even share of dim d (what all_gather joins and
 * reduce_scatter hands out). */
static int is_share(const shard_ctx *c, const lay *l, int64_t d)
{
    return l->kind == LAY_NARROW && l->split == 1 && l->n == 1 && d % c->tp == 0 &&
           l->len[0] == d / c->tp && l->lo[0] == c->rank * (d / c->tp);
}

/* 1 when partial sum v is the MoE block's: a moe_routed result, or sums
 * (and reshapes, forks, joins) over one, the shared expert's added in. */
static int moe_partial(const ir_value *v)
{
    for (int depth = 0; v && v->kind == IR_VALUE_OP && v->def && depth < 16; depth++) {
        const ir_op *op = v->def;
        if (op->kind == IR_OP_MOE_ROUTED)
            return 1;
        if (op->kind == IR_OP_ADD && moe_partial(op->in[1]))
            return 1;
        if (op->kind != IR_OP_ADD && op->kind != IR_OP_RESHAPE && op->kind != IR_OP_FORK &&
            op->kind != IR_OP_JOIN)
            return 0;
        v = op->in[0];
    }
    return 0;
}

/* The MoE block's partial sum v made whole as a reduce_scatter along the
 * hidden (last) axis, each rank summing its share, then an all_gather of
 * the shares (pass_options.ep_combine): the same sum as one all_reduce. */
static moec_status combine_scattered(shard_ctx *c, ir_value *v, ir_op *before, ir_value **out)
{
    char name[512];
    ir_value *mine = NULL;
    int axis = v->type.rank - 1;
    MOEC_TRY(add_op1(c, IR_OP_REDUCE_SCATTER, v, name_with(v, "scatter", name, sizeof name),
                     before, axis, 0, 0, &mine));
    return add_op1(c, IR_OP_ALL_GATHER, mine, name_with(v, "gather", name, sizeof name), before,
                   axis, 0, 0, out);
}

/* x (original value v, arriving as `from`) as `to`, converted before op
 * `before`; each conversion made once. */
static moec_status convert(shard_ctx *c, ir_value *v, const lay *from, const lay *to,
                           ir_op *before, ir_value **out)
{
    *out = v;
    if (to->kind == LAY_DC || lay_equal(from, to))
        return MOEC_OK;
    const ir_type *t = &c->orig[v->id];
    if (to->kind == LAY_FULL && from->kind == LAY_NARROW && !is_share(c, from, t->dims[from->axis]) &&
        lay_whole(from, t->dims[from->axis]))
        return MOEC_OK;
    for (int i = 0; i < c->n_convs; i++)
        if (c->convs[i].v == v && lay_equal(&c->convs[i].to, to)) {
            *out = c->convs[i].out;
            return MOEC_OK;
        }
    char name[512];
    ir_value *r = NULL;
    if (from->kind == LAY_PART && is_share(c, to, to->kind == LAY_NARROW ? t->dims[to->axis] : 0)) {
        MOEC_TRY(add_op1(c, IR_OP_REDUCE_SCATTER, v, name_with(v, "scatter", name, sizeof name),
                         before, to->axis, 0, 0, &r));
    } else if (from->kind == LAY_PART) {
        if (c->opt->ep_combine && moe_partial(v))
            MOEC_TRY(combine_scattered(c, v, before, &r));
        else
            MOEC_TRY(add_op1(c, IR_OP_ALL_REDUCE, v, name_with(v, "sum", name, sizeof name),
                             before, 0, 0, 0, &r));
        lay full = lay_of(LAY_FULL);
        if (to->kind == LAY_NARROW)
            MOEC_TRY(local_slices(c, r, &full, to, before, &r));
    } else if (from->kind == LAY_NARROW && to->kind == LAY_NARROW && from->axis == to->axis) {
        MOEC_TRY(local_slices(c, v, from, to, before, &r));
    } else if (from->kind == LAY_NARROW) {
        if (!is_share(c, from, t->dims[from->axis]))
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "shard: %%%s holds %d ranges of dim %d, which no all_gather joins",
                            v->name, from->n, from->axis);
        MOEC_TRY(add_op1(c, IR_OP_ALL_GATHER, v, name_with(v, "gather", name, sizeof name),
                         before, from->axis, 0, 0, &r));
        lay full = lay_of(LAY_FULL);
        if (to->kind == LAY_NARROW)
            MOEC_TRY(local_slices(c, r, &full, to, before, &r));
    } else {
        MOEC_TRY(local_slices(c, v, from, to, before, &r));
    }
    MOEC_TRY(grow((void **)&c->convs, c->n_convs, &c->cap_convs, sizeof *c->convs));
    c->convs[c->n_convs++] = (conv){v, *to, r};
    *out = r;
    return MOEC_OK;
}

/* Operand i of op brought to layout `to`. */
static moec_status operand_to(shard_ctx *c, ir_op *op, int i, const lay *to)
{
    ir_value *x = op->in[i];
    if (!is_act(x) || x->id >= c->n0)
        return MOEC_OK;
    return convert(c, x, &c->have[x->id], to, op, &op->in[i]);
}

/* ---- the forward sweep: each op rewritten ----------------------------------- */

/* Sets the op's results to their types in layout `l` (re-inferred: a wrong
 * split shows up here as an internal error) and records the layout. */
static moec_status finish(shard_ctx *c, ir_op *op, const lay *l)
{
    ir_type want[IR_MAX_RESULTS];
    for (int i = 0; i < op->n_out; i++)
        want[i] = lay_type(&c->orig[op->out[i]->id], l);
    moec_status st = ir_op_finish(c->m, op, &want[0]);
    if (st != MOEC_OK)
        return moec_err_wrap(MOEC_ERR_INTERNAL, "shard: rewriting %%%s", op->out[0]->name);
    for (int i = 0; i < op->n_out; i++) {
        if (!ir_type_equal(&want[i], &op->out[i]->type)) {
            char a[96], b[96];
            ir_type_format(&want[i], a, sizeof a);
            ir_type_format(&op->out[i]->type, b, sizeof b);
            return MOEC_ERR(MOEC_ERR_INTERNAL, "shard: %%%s came out %s, expected %s",
                            op->out[i]->name, b, a);
        }
        c->have[op->out[i]->id] = l->kind == LAY_DC ? lay_of(LAY_FULL) : *l;
    }
    return MOEC_OK;
}

/* Every activation operand of op brought to its layout for output `l`
 * (full ones where l is not narrow). */
static moec_status operands_for(shard_ctx *c, ir_op *op, const lay *l)
{
    for (int i = 0; i < op->n_in; i++) {
        lay req = lay_of(LAY_FULL);
        if (l->kind == LAY_NARROW && !operand_layout(c, op, l, i, &req))
            return MOEC_ERR(MOEC_ERR_INTERNAL, "shard: %%%s cannot be split along dim %d",
                            op->out[0]->name, l->axis);
        MOEC_TRY(operand_to(c, op, i, &req));
    }
    return MOEC_OK;
}

static moec_status shard_embedding(shard_ctx *c, ir_op *op)
{
    int64_t V = c->orig[op->in[1]->id].dims[0];
    lay rows = share(0, V, c->tp, c->rank);
    lay full = lay_of(LAY_FULL);
    MOEC_TRY(operand_to(c, op, 0, &full));
    MOEC_TRY(box_operand(c, op, 1, 0, &rows));
    MOEC_TRY(ir_op_set_int(c->m, op, "vocab_start", rows.lo[0]));
    MOEC_TRY(ir_op_set_int(c->m, op, "vocab_size", V));
    lay part = lay_of(LAY_PART);
    return finish(c, op, &part);
}

/* linear: row-parallel when its input arrives split along the columns it
 * reads (the sum is partial; the bias added on rank 0 only), column-parallel
 * when its users want some of its columns, else replicated. */
static moec_status shard_linear(shard_ctx *c, ir_op *op)
{
    const lay *x = &c->have[op->in[0]->id];
    lay out = c->want[op->out[0]->id];
    if (x->kind == LAY_NARROW && x->axis == 1 && x->split == 1) {
        MOEC_TRY(box_operand(c, op, 1, 1, x));
        if (op->n_in == 3 && c->rank != 0) {
            op->in[2] = NULL;
            op->n_in = 2;
        }
        lay part = lay_of(LAY_PART);
        return finish(c, op, &part);
    }
    lay full = lay_of(LAY_FULL);
    MOEC_TRY(operand_to(c, op, 0, &full));
    if (out.kind != LAY_NARROW || out.axis != 1)
        return finish(c, op, &full);
    MOEC_TRY(box_operand(c, op, 1, 0, &out));
    if (op->n_in == 3)
        MOEC_TRY(box_operand(c, op, 2, 0, &out));
    return finish(c, op, &out);
}

/* moe_routed: this rank's experts (expert group rank / moe_tp) and, in each,
 * its share of the intermediate; the output is a partial sum. */
static moec_status shard_moe_routed(shard_ctx *c, ir_op *op)
{
    int fused = op->n_in == 5;
    ir_value *down = op->in[op->n_in - 1];
    int64_t E = c->orig[down->id].dims[0], I = c->orig[down->id].dims[2];
    lay full = lay_of(LAY_FULL);
    for (int i = 0; i < 3; i++)
        MOEC_TRY(operand_to(c, op, i, &full));
    lay ex = share(0, E, c->ep, c->rank / c->moe_tp);
    lay in = share(1, I, c->moe_tp, c->moe_rank);
    lay gate_up = in;
    lay_add_range(&gate_up, in.lo[0] + I, in.len[0]);
    for (int i = 3; i < op->n_in; i++) {
        int is_down = i == op->n_in - 1;
        wspec s = {.n = 2, .axis = {0, is_down ? 2 : 1}, .r = {ex, fused && !is_down ? gate_up : in}};
        s.r[1].axis = s.axis[1];
        MOEC_TRY(weight_for(c, op->in[i], &s, &op->in[i]));
    }
    MOEC_TRY(ir_op_set_int(c->m, op, "expert_start", ex.lo[0]));
    MOEC_TRY(ir_op_set_int(c->m, op, "n_experts", E));
    lay part = lay_of(LAY_PART);
    return finish(c, op, &part);
}

/* The weights of an op split by heads: the rows of kv_b that MLA's absorbed
 * k and v up-projections of the rank's heads read. */
static moec_status box_weights(shard_ctx *c, ir_op *op, const lay *out)
{
    if (op->kind != IR_OP_MLA_QABSORB && op->kind != IR_OP_MLA_VABSORB)
        return MOEC_OK;
    int64_t per = ir_op_attr_int(op, "qk_nope_head_dim", 0) + ir_op_attr_int(op, "v_head_dim", 0);
    lay rows = *out;
    rows.axis = 0;
    for (int i = 0; i < rows.n; i++) {
        rows.lo[i] *= per;
        rows.len[i] *= per;
    }
    return box_operand(c, op, 1, 0, &rows);
}

/* A slice reads its window from whatever box of its axis arrives. */
static moec_status shard_slice(shard_ctx *c, ir_op *op)
{
    int s = (int)ir_op_attr_int(op, "axis", 0);
    int64_t start = ir_op_attr_int(op, "start", 0), size = ir_op_attr_int(op, "size", 0);
    lay out = c->want[op->out[0]->id];
    lay x = c->have[op->in[0]->id];
    if (x.kind == LAY_NARROW && x.axis != s) {
        MOEC_TRY(ir_op_set_int(c->m, op, "start", start));
        return finish(c, op, &x);
    }
    if (out.kind != LAY_NARROW || out.axis != s || out.n != 1)
        out = lay_of(LAY_FULL);
    lay need = out.kind == LAY_NARROW ? lay_shift(out, start) : lay_range(s, start, size, 0);
    if (x.kind == LAY_PART || (x.kind == LAY_NARROW && lay_local(&x, need.lo[0]) < 0)) {
        lay full = lay_of(LAY_FULL);
        MOEC_TRY(operand_to(c, op, 0, &full));
        x = full;
    }
    int64_t at = x.kind == LAY_NARROW ? lay_local(&x, need.lo[0]) : need.lo[0];
    if (x.kind == LAY_NARROW && lay_local(&x, need.lo[0] + need.len[0] - 1) != at + need.len[0] - 1)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "shard: %%%s's window is not contiguous on this rank",
                        op->out[0]->name);
    MOEC_TRY(ir_op_set_int(c->m, op, "start", at));
    MOEC_TRY(ir_op_set_int(c->m, op, "size", need.len[0]));
    return finish(c, op, &out);
}

/* 1 when the partial sums arriving at op stay partial through it: it is
 * linear in them and reads nothing else that is not full. */
static int keeps_partial(const shard_ctx *c, const ir_op *op)
{
    const lay *a = &c->have[op->in[0]->id];
    switch (op->kind) {
    case IR_OP_RESHAPE:
    case IR_OP_FORK:
    case IR_OP_JOIN:
    case IR_OP_REDUCE_SUM: return a->kind == LAY_PART;
    case IR_OP_ADD: return a->kind == LAY_PART && c->have[op->in[1]->id].kind == LAY_PART;
    case IR_OP_MUL: {
        const ir_value *b = op->in[1];
        int b_full = !is_act(b) || c->have[b->id].kind == LAY_FULL;
        return a->kind == LAY_PART && b_full;
    }
    default: return 0;
    }
}

static moec_status shard_op(shard_ctx *c, ir_op *op)
{
    lay out;
    switch (op->kind) {
    case IR_OP_EMBEDDING: return shard_embedding(c, op);
    case IR_OP_LINEAR: return shard_linear(c, op);
    case IR_OP_MOE_ROUTED: return shard_moe_routed(c, op);
    case IR_OP_SLICE: return shard_slice(c, op);
    case IR_OP_MOE_EXPERTS:
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "shard: %%%s: moe_experts must become moe_routed "
                        "first (pass fuse_router_weight)", op->out[0]->name);
    case IR_OP_ALL_REDUCE:
    case IR_OP_ALL_GATHER:
    case IR_OP_REDUCE_SCATTER:
    case IR_OP_ALL_TO_ALL:
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "shard: %%%s: the module is sharded already",
                        op->out[0]->name);
    default: break;
    }
    if (seed_layout(c, op, &out)) {
        MOEC_TRY(operands_for(c, op, &out));
        return finish(c, op, &out);
    }
    out = c->want[op->out[0]->id];
    lay req;
    if (out.kind == LAY_NARROW && operand_layout(c, op, &out, 0, &req)) {
        MOEC_TRY(operands_for(c, op, &out));
        MOEC_TRY(box_weights(c, op, &out));
        return finish(c, op, &out);
    }
    if (keeps_partial(c, op)) {
        out = lay_of(LAY_PART);
        for (int i = 1; i < op->n_in; i++)
            if (op->kind == IR_OP_MUL)
                MOEC_TRY(operand_to(c, op, i, &(lay){.kind = LAY_FULL}));
        return finish(c, op, &out);
    }
    const lay *x = &c->have[op->in[0]->id];
    if (x->kind == LAY_NARROW && output_from_operand(c, op, x, &out)) {
        MOEC_TRY(operands_for(c, op, &out));
        MOEC_TRY(box_weights(c, op, &out));
        return finish(c, op, &out);
    }
    out = lay_of(LAY_FULL);
    MOEC_TRY(operands_for(c, op, &out));
    return finish(c, op, &out);
}

/* ---- checks before anything is rewritten ------------------------------------- */

/* 1 when silu_mul op is a shared expert's: its input's linear reads the
 * input of a moe_routed op. */
static int is_shared_expert(const ir_module *m, const ir_op *op)
{
    const ir_value *gu = op->in[0];
    if (gu->kind != IR_VALUE_OP || !gu->def || gu->def->kind != IR_OP_LINEAR)
        return 0;
    const ir_value *x = gu->def->in[0];
    for (int i = 0; i < m->n_ops; i++)
        if (m->ops[i]->kind == IR_OP_MOE_ROUTED && m->ops[i]->in[0] == x)
            return 1;
    return 0;
}

static moec_status check_splits(const shard_ctx *c)
{
    const ir_module *m = c->m;
    char what[32]; /* "tp / ep = 4 / 2 =": the ranks an expert is split over */
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind == IR_OP_ATTENTION || op->kind == IR_OP_MLA_ATTENTION) {
            int64_t H = op->in[0]->type.dims[1];
            MOEC_TRY(need_divides(c, H, c->tp, "tp", F_HEADS, op->out[0]));
            if (op->kind == IR_OP_ATTENTION) {
                int64_t Hkv = op->in[1]->type.dims[1];
                if (Hkv % c->tp && c->tp % Hkv)
                    return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                    "tp %d and %s %" PRId64 " (%%%s): one must divide the other "
                                    "(kv heads split over the ranks, or each replicated on "
                                    "tp / %" PRId64 " of them)",
                                    c->tp, field_name(c, F_KV_HEADS), Hkv, op->out[0]->name, Hkv);
            }
        }
    }
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind == IR_OP_SILU_MUL) {
            const ir_type *t = &op->out[0]->type;
            MOEC_TRY(need_divides(c, t->dims[t->rank - 1], c->tp, "tp",
                                  is_shared_expert(m, op) ? F_SHARED_INTERMEDIATE : F_INTERMEDIATE,
                                  op->out[0]));
        }
    }
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind != IR_OP_MOE_ROUTED)
            continue;
        const ir_value *down = op->in[op->n_in - 1];
        MOEC_TRY(need_divides(c, down->type.dims[0], c->ep, "ep", F_EXPERTS, op->out[0]));
        snprintf(what, sizeof what, "tp / ep = %d / %d =", c->tp, c->ep);
        MOEC_TRY(need_divides(c, down->type.dims[2], c->moe_tp, what, F_MOE_INTERMEDIATE,
                              op->out[0]));
        if (c->opt->ep_combine) /* each rank sums its share of the hidden state */
            MOEC_TRY(need_divides(c, op->out[0]->type.dims[op->out[0]->type.rank - 1], c->tp,
                                  "tp (the MoE combine's reduce_scatter)", F_HIDDEN, op->out[0]));
    }
    for (int i = 0; i < m->n_ops; i++)
        if (m->ops[i]->kind == IR_OP_EMBEDDING)
            MOEC_TRY(need_divides(c, m->ops[i]->in[1]->type.dims[0], c->tp, "tp", F_VOCAB,
                                  m->ops[i]->out[0]));
    for (int i = 0; i < m->n_outputs; i++) {
        const ir_type *t = &m->outputs[i]->type;
        MOEC_TRY(need_divides(c, t->dims[t->rank - 1], c->tp, "tp", F_VOCAB, m->outputs[i]));
    }
    return MOEC_OK;
}

moec_status pass_shard_check(int tp, int ep, int rank)
{
    if (tp < 1 || tp > IR_MAX_RANKS)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "tp %d out of range [1, %d]", tp, IR_MAX_RANKS);
    if (ep < 1 || ep > tp || tp % ep)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "ep %d must divide tp %d (the tp ranks hold the experts in ep groups)",
                        ep, tp);
    if (rank < 0 || rank >= tp)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rank %d out of range [0, %d) (tp %d)", rank, tp,
                        tp);
    return MOEC_OK;
}

/* ---- the pass ------------------------------------------------------------------ */

static void ctx_free(shard_ctx *c)
{
    free(c->orig);
    free(c->orig_bind);
    free(c->orig_scale);
    free(c->want);
    free(c->have);
    free(c->convs);
    free(c->wm);
}

static moec_status shard_run(shard_ctx *c)
{
    ir_module *m = c->m;
    MOEC_TRY(check_splits(c));
    for (int i = 0; i < m->n_outputs; i++) {
        const ir_value *o = m->outputs[i];
        if (!is_act(o) || o->type.rank < 2)
            continue;
        int last = o->type.rank - 1;
        lay l = share(last, o->type.dims[last], c->tp, c->rank);
        want_add(c, o, &l);
    }
    int n_ops = m->n_ops;
    ir_op **ops = malloc(sizeof *ops * (size_t)(n_ops ? n_ops : 1));
    if (!ops)
        return MOEC_ERR(MOEC_ERR_OOM, "shard: out of memory");
    memcpy(ops, m->ops, sizeof *ops * (size_t)n_ops);
    for (int i = n_ops - 1; i >= 0; i--)
        demand_operands(c, ops[i]);
    moec_status st = MOEC_OK;
    for (int i = 0; i < n_ops && st == MOEC_OK; i++)
        st = shard_op(c, ops[i]);
    free(ops);
    MOEC_TRY(st);
    /* every output whole on every rank: the vocab-parallel logits gathered */
    for (int i = 0; i < m->n_outputs; i++) {
        ir_value *o = m->outputs[i];
        if (!is_act(o) || o->id >= c->n0)
            continue;
        lay full = lay_of(LAY_FULL);
        ir_value *g;
        MOEC_TRY(convert(c, o, &c->have[o->id], &full, NULL, &g));
        if (g == o)
            continue;
        const char *name = o->name;
        char buf[512];
        const char *part = ir_module_unique_name(m, name_with(o, "shard", buf, sizeof buf));
        if (!part)
            return MOEC_ERR(MOEC_ERR_OOM, "shard: out of memory");
        ir_value_rename(m, o, part);
        ir_value_rename(m, g, name);
        m->outputs[i] = g;
    }
    MOEC_TRY(ir_module_set_meta_int(m, "tp", c->tp));
    MOEC_TRY(ir_module_set_meta_int(m, "ep", c->ep));
    MOEC_TRY(ir_module_set_meta_int(m, "rank", c->rank));
    return ir_module_dce(m);
}

moec_status pass_shard(ir_module *m, const pass_options *opt)
{
    if (!opt || opt->tp == 0)
        return MOEC_OK;
    int ep = opt->ep ? opt->ep : 1;
    MOEC_TRY(pass_shard_check(opt->tp, ep, opt->rank));
    if (ir_module_meta(m, "tp"))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "shard: module %s is sharded already (meta tp)",
                        m->name);
    shard_ctx c = {.m = m, .opt = opt, .tp = opt->tp, .ep = ep, .rank = opt->rank};
    c.moe_tp = c.tp / c.ep;
    c.moe_rank = c.rank % c.moe_tp;
    c.n0 = m->n_values;
    c.deepseek = m->name && !strncmp(m->name, "deepseek", 8);
    size_t n = (size_t)(c.n0 ? c.n0 : 1);
    c.orig = malloc(n * sizeof *c.orig);
    c.orig_bind = malloc(n * sizeof *c.orig_bind);
    c.orig_scale = malloc(n * sizeof *c.orig_scale);
    c.want = calloc(n, sizeof *c.want);
    c.have = calloc(n, sizeof *c.have);
    moec_status st = MOEC_OK;
    if (!c.orig || !c.orig_bind || !c.orig_scale || !c.want || !c.have) {
        st = MOEC_ERR(MOEC_ERR_OOM, "shard: out of memory");
    } else {
        for (int i = 0; i < c.n0; i++) {
            c.orig[i] = m->values[i]->type;
            c.orig_bind[i] = m->values[i]->bind;
            c.orig_scale[i] = m->values[i]->scale;
            c.have[i] = lay_of(LAY_FULL);
        }
        st = shard_run(&c);
    }
    ctx_free(&c);
    return st;
}
