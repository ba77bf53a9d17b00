/* pass_schedule.c — the two scheduling passes.
 *
 * assign_streams: in an MoE layer with a shared expert, the shared branch
 * (from the MoE input to the value added to the routed output) does not
 * depend on routing, so it runs on a side stream (1) beside the router and
 * routed experts on the main stream, between an explicit fork (the side
 * stream waits for the MoE input) and join (the main stream waits for the
 * shared output). Matched on structure: the branch is whatever the
 * combining add's non-routed operand computes from the expert op's input.
 * DeepSeek-V3.2's indexer (wq_b's linear, dsa_prologue_k, dsa_topk: small
 * latency-bound kernels) goes to the side stream too, beside the MLA's q
 * path (q_b_proj, mla_prologue_q, mla_qabsorb: weight streaming) instead
 * of in front of it: its branch is what computes a dsa_topk's operands and
 * nothing else, after the last op of that cone that something outside it
 * reads (mla_prologue_kv, whose q LoRA latent q_b reads too); the fork of
 * that op's result goes right after it, the branch right after the fork,
 * the join of the top-k ids right before their first reader (the
 * attention). Side ops may read what was defined before their fork (qkv_a,
 * the positions): plan_memory keeps whatever an op between a fork and its
 * join touches live over the interval. At most two pairs a layer (the
 * indexer's, then the shared expert's), never overlapping, so a graph
 * never needs more than two streams. Collectives stay on stream 0.
 *
 * plan_memory: every activation gets a byte offset per token in one arena
 * per batch bucket (offset * T), by liveness (ir_module_live_ranges: values
 * touched between a fork and its join stay live over the whole interval,
 * since the two streams run in any interleaving there) and greedy
 * first-fit. A reshape, fork or join result takes its operand's offset when
 * the two are stored alike on the GPU: the same bytes, so the backend moves
 * nothing (a reshape of a row-major value is the same bytes; fork and join
 * only order the streams). Such an alias group is placed as one value,
 * live from its first member's definition to its last member's last use. */
#include <stdlib.h>
#include <string.h>

#include "compiler/passes.h"
#include "err.h"
#include "ir/ir_plan.h"

/* ---- assign_streams ------------------------------------------------------- */

/* The shared branch of one MoE layer, found before anything is changed. */
typedef struct shared_branch {
    ir_value *x;      /* the MoE input, read by both paths */
    ir_op *combine;   /* add(routed, shared) */
    int shared_slot;  /* combine->in[shared_slot] is the shared output */
    int n_ops;
    ir_op **ops;      /* the branch, any order */
} shared_branch;

static int is_activation(const ir_value *v)
{
    return v && v->kind != IR_VALUE_WEIGHT;
}

/* Collects into b the ops computing v from b->x and weights only, all after
 * x's definition at index x_at; 0 when something else feeds it. */
static int collect_branch(ir_value *v, int x_at, shared_branch *b, unsigned char *seen)
{
    if (v == b->x || v->kind == IR_VALUE_WEIGHT)
        return 1;
    if (v->kind != IR_VALUE_OP || !v->def)
        return 0;
    ir_op *op = v->def;
    if (seen[op->id])
        return 1;
    if (op->id <= x_at || op->kind == IR_OP_FORK || op->kind == IR_OP_JOIN || op->stream != 0)
        return 0;
    seen[op->id] = 1;
    b->ops[b->n_ops++] = op;
    for (int i = 0; i < op->n_in; i++)
        if (!collect_branch(op->in[i], x_at, b, seen))
            return 0;
    return 1;
}

/* Finds the shared branch beside expert op e; 0 when the layer has none.
 * routed[] and seen[] are scratch (one entry per value and per op). */
static int find_branch(const ir_module *m, const ir_op *e, shared_branch *b,
                       unsigned char *routed, unsigned char *seen)
{
    b->x = e->in[0];
    b->n_ops = 0;
    int x_at = b->x->kind == IR_VALUE_OP && b->x->def ? b->x->def->id : -1;
    memset(routed, 0, (size_t)m->n_values);
    for (int i = 0; i < e->n_out; i++)
        routed[e->out[i]->id] = 1;
    for (int k = e->id + 1; k < m->n_ops; k++) {
        ir_op *op = m->ops[k];
        int hit = 0;
        for (int i = 0; i < op->n_in; i++)
            hit |= routed[op->in[i]->id];
        if (!hit)
            continue;
        if (op->kind == IR_OP_ADD && routed[op->in[0]->id] != routed[op->in[1]->id]) {
            int slot = routed[op->in[0]->id] ? 1 : 0;
            ir_value *s = op->in[slot];
            memset(seen, 0, (size_t)m->n_ops);
            if (!is_activation(s) || s == b->x || ir_module_use_count(m, s) != 1 ||
                !collect_branch(s, x_at, b, seen) || b->n_ops == 0)
                return 0;
            /* Nothing outside the branch may read its inner values. */
            for (int j = 0; j < m->n_ops; j++) {
                const ir_op *user = m->ops[j];
                if (seen[user->id] || user == op)
                    continue;
                for (int i = 0; i < user->n_in; i++) {
                    const ir_value *in = user->in[i];
                    if (in->kind == IR_VALUE_OP && in->def && seen[in->def->id])
                        return 0;
                }
            }
            for (int i = 0; i < m->n_outputs; i++)
                if (m->outputs[i]->kind == IR_VALUE_OP && seen[m->outputs[i]->def->id])
                    return 0;
            b->combine = op;
            b->shared_slot = slot;
            return 1;
        }
        for (int i = 0; i < op->n_out; i++)
            routed[op->out[i]->id] = 1;
    }
    return 0;
}

/* "<prefix of like's name>.<what>", unique in m. */
static const char *layer_name(ir_module *m, const ir_value *like, const char *what)
{
    char base[256];
    const char *dot = strrchr(like->name, '.');
    int keep = dot ? (int)(dot - like->name) : (int)strlen(like->name);
    snprintf(base, sizeof base, "%.*s.%s", keep, like->name, what);
    return ir_module_unique_name(m, base);
}

static moec_status add_unary(ir_module *m, ir_op_kind kind, ir_value *x, const char *name,
                             ir_op **out)
{
    if (!name)
        return MOEC_ERR(MOEC_ERR_OOM, "assign_streams: out of memory naming a value");
    const char *names[1] = {name};
    ir_op *op = ir_module_add_op(m, kind, &x, 1, names, 1);
    if (!op)
        return moec_err_wrap(MOEC_ERR_INTERNAL, "assign_streams: adding %s %%%s",
                            ir_op_name(kind), name);
    MOEC_TRY(ir_op_finish(m, op, NULL));
    *out = op;
    return MOEC_OK;
}

static moec_status split_branch(ir_module *m, const ir_op *e, shared_branch *b)
{
    ir_op *fork, *join;
    ir_value *x = b->x, *shared = b->combine->in[b->shared_slot];
    const ir_op *after_x = x->kind == IR_VALUE_OP && x->def ? x->def : NULL;
    const ir_op *anchor = after_x ? (after_x->id + 1 < m->n_ops ? m->ops[after_x->id + 1] : NULL)
                                  : (m->n_ops ? m->ops[0] : NULL);
    MOEC_TRY(add_unary(m, IR_OP_FORK, x, layer_name(m, e->out[0], "fork"), &fork));
    fork->stream = 1;
    MOEC_TRY(ir_module_move_op_before(m, fork, anchor));
    for (int k = 0; k < b->n_ops; k++) {
        ir_op *op = b->ops[k];
        op->stream = 1;
        for (int i = 0; i < op->n_in; i++)
            if (op->in[i] == x)
                op->in[i] = fork->out[0];
    }
    MOEC_TRY(add_unary(m, IR_OP_JOIN, shared, layer_name(m, e->out[0], "join"), &join));
    join->stream = 0;
    MOEC_TRY(ir_module_move_op_before(m, join, b->combine));
    b->combine->in[b->shared_slot] = join->out[0];
    return MOEC_OK;
}

/* ---- the indexer branch (DeepSeek-V3.2) ------------------------------------ */

static int is_collective(ir_op_kind k)
{
    return k == IR_OP_ALL_REDUCE || k == IR_OP_ALL_GATHER || k == IR_OP_REDUCE_SCATTER ||
           k == IR_OP_ALL_TO_ALL;
}

/* Whether op may run on the side stream inside d's branch: a main-stream
 * compute op (no fork, join or collective: every rank must issue those in
 * one order on one stream) whose results only ops of d's cone read. */
static int may_branch(const ir_module *m, const ir_op *op, const unsigned char *cone)
{
    if (op->stream != 0 || op->kind == IR_OP_FORK || op->kind == IR_OP_JOIN ||
        is_collective(op->kind))
        return 0;
    for (int j = op->id + 1; j < m->n_ops; j++) {
        const ir_op *user = m->ops[j];
        for (int i = 0; i < user->n_in; i++)
            if (user->in[i]->kind == IR_VALUE_OP && user->in[i]->def == op && !cone[j])
                return 0;
    }
    for (int i = 0; i < m->n_outputs; i++)
        if (m->outputs[i]->kind == IR_VALUE_OP && m->outputs[i]->def == op)
            return 0;
    return 1;
}

/* The first op after v's definition that reads v; NULL when none. */
static ir_op *first_reader(const ir_module *m, const ir_value *v)
{
    for (int j = v->def->id + 1; j < m->n_ops; j++)
        for (int i = 0; i < m->ops[j]->n_in; i++)
            if (m->ops[j]->in[i] == v)
                return m->ops[j];
    return NULL;
}

/* dsa_topk d's branch: the ops of its cone (d and what computes its
 * operands) after the last one that may not join it (cut, whose result the
 * branch reads is *x), in op order, into ops; their number, 0 when d's
 * indexer stays on the main stream. cone[] is scratch, one entry per op. */
static int find_indexer(const ir_module *m, const ir_op *d, ir_op **ops, ir_value **x,
                        unsigned char *cone)
{
    const ir_op *reader = first_reader(m, d->out[0]);
    if (d->stream != 0 || !reader)
        return 0;
    for (int i = 0; i < m->n_outputs; i++)
        if (m->outputs[i] == d->out[0])
            return 0;
    memset(cone, 0, (size_t)m->n_ops);
    cone[d->id] = 1;
    int cut = -1;
    for (int k = d->id; k >= 0; k--) {
        const ir_op *op = m->ops[k];
        if (!cone[k])
            continue;
        if (k < d->id && !may_branch(m, op, cone)) {
            cut = k;
            break;
        }
        for (int i = 0; i < op->n_in; i++)
            if (op->in[i]->kind == IR_VALUE_OP && op->in[i]->def)
                cone[op->in[i]->def->id] = 1;
    }
    if (cut < 0 || m->ops[cut]->stream != 0)
        return 0;
    int n = 0;
    *x = NULL;
    for (int k = cut + 1; k <= d->id; k++) {
        ir_op *op = m->ops[k];
        if (!cone[k])
            continue;
        ops[n++] = op;
        for (int i = 0; i < op->n_in && !*x; i++)
            if (op->in[i]->kind == IR_VALUE_OP && op->in[i]->def == m->ops[cut])
                *x = op->in[i];
    }
    /* The pair must not overlap another: no fork, join or side-stream op
     * from the cut to d's first reader. */
    for (int k = cut + 1; k < reader->id; k++)
        if (m->ops[k]->stream != 0 || m->ops[k]->kind == IR_OP_FORK ||
            m->ops[k]->kind == IR_OP_JOIN)
            return 0;
    return *x ? n : 0;
}

/* Moves the branch ops[0..n-1] of dsa_topk d (ops[n-1]) to stream 1, right
 * after a fork of x, with a join of d's result before its first reader. */
static moec_status split_indexer(ir_module *m, ir_op *const *ops, int n, ir_value *x)
{
    ir_op *d = ops[n - 1], *fork, *join;
    const ir_op *anchor = x->def->id + 1 < m->n_ops ? m->ops[x->def->id + 1] : NULL;
    MOEC_TRY(add_unary(m, IR_OP_FORK, x, layer_name(m, d->out[0], "fork"), &fork));
    fork->stream = 1;
    MOEC_TRY(ir_module_move_op_before(m, fork, anchor));
    /* The branch right after the fork, in its order: launched as early as
     * the main stream's q path, which the branch runs beside. */
    anchor = fork->id + 1 < m->n_ops ? m->ops[fork->id + 1] : NULL;
    for (int k = n - 1; k >= 0; k--) {
        ir_op *op = ops[k];
        op->stream = 1;
        for (int i = 0; i < op->n_in; i++)
            if (op->in[i] == x)
                op->in[i] = fork->out[0];
        MOEC_TRY(ir_module_move_op_before(m, op, anchor));
        anchor = op;
    }
    const ir_op *reader = first_reader(m, d->out[0]);
    MOEC_TRY(add_unary(m, IR_OP_JOIN, d->out[0], layer_name(m, d->out[0], "join"), &join));
    join->stream = 0;
    MOEC_TRY(ir_module_move_op_before(m, join, reader));
    ir_module_replace_uses(m, d->out[0], join->out[0]);
    return MOEC_OK;
}

static moec_status assign_indexers(ir_module *m)
{
    for (int k = 0; k < m->n_ops; k++) {
        if (m->ops[k]->kind != IR_OP_DSA_TOPK)
            continue;
        ir_op *d = m->ops[k];
        ir_value *x = NULL;
        unsigned char *cone = calloc((size_t)m->n_ops + 1, 1);
        ir_op **ops = malloc(sizeof *ops * ((size_t)m->n_ops + 1));
        moec_status st = MOEC_OK;
        if (!cone || !ops)
            st = MOEC_ERR(MOEC_ERR_OOM, "assign_streams: out of memory");
        else {
            int n = find_indexer(m, d, ops, &x, cone);
            if (n > 0)
                st = split_indexer(m, ops, n, x);
        }
        free(cone);
        free(ops);
        MOEC_TRY(st);
        k = d->id; /* ops moved: go on after this dsa_topk */
    }
    return MOEC_OK;
}

moec_status pass_assign_streams(ir_module *m, const pass_options *opt)
{
    MOEC_TRY(assign_indexers(m));
    int n_exp = 0;
    for (int i = 0; i < m->n_ops; i++)
        n_exp += m->ops[i]->kind == IR_OP_MOE_EXPERTS || m->ops[i]->kind == IR_OP_MOE_ROUTED;
    if (!n_exp)
        return MOEC_OK;
    moec_status st = MOEC_OK;
    ir_op **exps = malloc(sizeof *exps * (size_t)n_exp);
    if (!exps)
        return MOEC_ERR(MOEC_ERR_OOM, "assign_streams: out of memory");
    for (int i = 0, k = 0; i < m->n_ops; i++)
        if (m->ops[i]->kind == IR_OP_MOE_EXPERTS || m->ops[i]->kind == IR_OP_MOE_ROUTED)
            exps[k++] = m->ops[i];
    for (int k = 0; k < n_exp && st == MOEC_OK; k++) {
        /* Scratch sized for the module as it stands (each split adds two ops). */
        shared_branch b = {0};
        unsigned char *routed = calloc((size_t)m->n_values + 1, 1);
        unsigned char *seen = calloc((size_t)m->n_ops + 1, 1);
        b.ops = malloc(sizeof *b.ops * ((size_t)m->n_ops + 1));
        if (!routed || !seen || !b.ops)
            st = MOEC_ERR(MOEC_ERR_OOM, "assign_streams: out of memory");
        else if (find_branch(m, exps[k], &b, routed, seen))
            st = split_branch(m, exps[k], &b);
        free(routed);
        free(seen);
        free(b.ops);
    }
    free(exps);
    return st;
}

/* ---- plan_memory ---------------------------------------------------------- */

typedef struct live_value {
    ir_value *v;
    int64_t size;       /* bytes per token, a multiple of 16 */
    int start, end;     /* op indices, inclusive; inputs start at -1 */
    int64_t offset;
} live_value;

/* Whether y (a reshape, fork or join of x) may live in x's bytes: both op
 * results (step inputs are not in the GPU arena) stored alike on the GPU
 * under any compute dtype (ir_value_storage_dtype: i32, forced f32 and
 * compute-dtype values are three classes, told apart under bf16), so that
 * no converting copy is needed. The interpreter stores everything in 4
 * bytes an element: any such pair is the same bytes there. */
static int may_share(const ir_module *m, const ir_value *x, const ir_value *y)
{
    return x->kind == IR_VALUE_OP && y->kind == IR_VALUE_OP &&
           ir_type_numel(&x->type, 1) == ir_type_numel(&y->type, 1) &&
           ir_value_storage_dtype(m, x, IR_DTYPE_BF16) ==
               ir_value_storage_dtype(m, y, IR_DTYPE_BF16);
}

static int by_size_then_start(const void *pa, const void *pb)
{
    const live_value *a = *(live_value *const *)pa, *b = *(live_value *const *)pb;
    if (a->size != b->size)
        return a->size > b->size ? -1 : 1;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    return a->v->id < b->v->id ? -1 : a->v->id > b->v->id;
}

static int by_offset(const void *pa, const void *pb)
{
    const live_value *a = *(live_value *const *)pa, *b = *(live_value *const *)pb;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Greedy first-fit: each value (largest first) at the lowest offset where it
 * overlaps no placed value whose live range meets its own. Returns the peak. */
static int64_t place_values(live_value **order, int n, live_value **scratch)
{
    int64_t peak = 0;
    for (int i = 0; i < n; i++) {
        live_value *cur = order[i];
        int nc = 0;
        for (int j = 0; j < i; j++)
            if (order[j]->start <= cur->end && cur->start <= order[j]->end)
                scratch[nc++] = order[j];
        qsort(scratch, (size_t)nc, sizeof *scratch, by_offset);
        int64_t off = 0;
        for (int j = 0; j < nc; j++) {
            if (off + cur->size <= scratch[j]->offset)
                break;
            if (scratch[j]->offset + scratch[j]->size > off)
                off = scratch[j]->offset + scratch[j]->size;
        }
        cur->offset = off;
        if (off + cur->size > peak)
            peak = off + cur->size;
    }
    return peak;
}

moec_status pass_plan_memory(ir_module *m, const pass_options *opt)
{
    int nv = m->n_values;
    moec_status st = MOEC_OK;
    int *slot = malloc(sizeof *slot * ((size_t)nv + 1));
    int *start = malloc(sizeof *start * ((size_t)nv + 1));
    int *end = malloc(sizeof *end * ((size_t)nv + 1));
    int *root = malloc(sizeof *root * ((size_t)nv + 1));
    live_value *lv = calloc((size_t)nv + 1, sizeof *lv);
    live_value **order = malloc(sizeof *order * ((size_t)nv + 1));
    live_value **scratch = malloc(sizeof *scratch * ((size_t)nv + 1));
    if (!slot || !start || !end || !root || !lv || !order || !scratch) {
        st = MOEC_ERR(MOEC_ERR_OOM, "plan_memory: out of memory");
        goto out;
    }
    for (int k = 0; k < m->n_ops; k++)
        if (m->ops[k]->id != k) {
            st = MOEC_ERR(MOEC_ERR_INTERNAL, "plan_memory: op %d is numbered %d", k, m->ops[k]->id);
            goto out;
        }
    int n = 0;
    int64_t total = 0;
    for (int i = 0; i < nv; i++) {
        ir_value *v = m->values[i];
        slot[i] = -1;
        if (v->id != i) {
            st = MOEC_ERR(MOEC_ERR_INTERNAL, "plan_memory: %%%s is numbered %d, not %d", v->name,
                          v->id, i);
            goto out;
        }
        if (v->kind == IR_VALUE_WEIGHT) {
            v->mem_offset = -1;
            continue;
        }
        if (v->type.rank < 1 || v->type.dims[0] != IR_DIM_T) {
            st = MOEC_ERR(MOEC_ERR_INVALID_ARG,
                          "plan_memory: activation %%%s has no leading token dimension", v->name);
            goto out;
        }
        if (v->kind == IR_VALUE_OP && !v->def) {
            st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "plan_memory: %%%s has no defining op", v->name);
            goto out;
        }
        live_value *l = &lv[n];
        l->v = v;
        l->size = (ir_type_numel(&v->type, 0) * 4 + 15) / 16 * 16;
        total += l->size;
        slot[i] = n++;
    }
    if (ir_module_live_ranges(m, start, end)) {
        st = MOEC_ERR(MOEC_ERR_OOM, "plan_memory: out of memory");
        goto out;
    }
    for (int i = 0; i < nv; i++)
        if (slot[i] >= 0) {
            lv[slot[i]].start = start[i];
            lv[slot[i]].end = end[i];
        }
    /* Alias groups, in op order (an operand's group is final before its
     * result joins it): a group is placed once, at its first value's slot. */
    for (int i = 0; i < n; i++)
        root[i] = i;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        if (!ir_op_may_alias(op->kind))
            continue;
        int si = slot[op->in[0]->id], so = slot[op->out[0]->id];
        if (si >= 0 && so >= 0 && may_share(m, op->in[0], op->out[0]))
            root[so] = root[si];
    }
    for (int i = 0; i < n; i++) {
        live_value *r = &lv[root[i]];
        if (lv[i].start < r->start)
            r->start = lv[i].start;
        if (lv[i].end > r->end)
            r->end = lv[i].end;
    }
    int n_groups = 0;
    for (int i = 0; i < n; i++)
        if (root[i] == i)
            order[n_groups++] = &lv[i];
    qsort(order, (size_t)n_groups, sizeof *order, by_size_then_start);
    int64_t peak = place_values(order, n_groups, scratch);
    for (int i = 0; i < n; i++)
        lv[i].v->mem_offset = lv[root[i]].offset;
    st = ir_module_set_meta_int(m, "arena_bytes_per_token", peak);
    if (st == MOEC_OK)
        st = ir_module_set_meta_int(m, "activation_bytes_per_token", total);
out:
    free(slot);
    free(start);
    free(end);
    free(root);
    free(lv);
    free(order);
    free(scratch);
    return st;
}
