/* ir_verify.c — the module verifier, run after parsing and after every pass:
 * names unique, one definition per value and none used before it, weights
 * bound (block-scaled ones with scales that mirror them), T only where it
 * belongs, attributes known, every op's result types exactly what inference
 * gives, and a memory plan whose live values never share bytes but through
 * the aliases plan_memory makes (reshape, fork, join). The error names the
 * first offending value. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "ir/ir_internal.h"

#define BAD(...) MOEC_ERR(MOEC_ERR_INVALID_ARG, __VA_ARGS__)

static const char *nm(const ir_value *v) { return v && v->name ? v->name : "?"; }

static int in_module(const ir_module *m, const ir_value *v)
{
    return v && v->id >= 0 && v->id < m->n_values && m->values[v->id] == v;
}

static int module_name_valid(const char *s)
{
    return ir_value_name_valid(s) && !(s[0] >= '0' && s[0] <= '9');
}

static moec_status verify_metas(const ir_module *m)
{
    if (m->n_meta < 0 || (m->n_meta > 0 && !m->meta))
        return BAD("module %s: bad meta table (%d entries)", m->name, m->n_meta);
    for (int i = 0; i < m->n_meta; i++) {
        const ir_attr *a = &m->meta[i];
        if (!ir_key_valid(a->key))
            return BAD("meta '%s': key must match [A-Za-z_][A-Za-z0-9_]*", a->key ? a->key : "");
        for (int j = 0; j < i; j++)
            if (m->meta[j].key && !strcmp(m->meta[j].key, a->key))
                return BAD("meta '%s': set twice", a->key);
        if ((int)a->kind < IR_ATTR_INT || a->kind > IR_ATTR_INTS)
            return BAD("meta '%s': unknown kind %d", a->key, (int)a->kind);
        if (a->kind == IR_ATTR_STR && !ir_string_valid(a->s))
            return BAD("meta '%s': string is null or has control characters", a->key);
        if (a->kind == IR_ATTR_INTS && (a->n < 0 || (a->n > 0 && !a->ints)))
            return BAD("meta '%s': bad int list", a->key);
    }
    return MOEC_OK;
}

static moec_status verify_value(const ir_module *m, const ir_value *v)
{
    char ts[96];
    ir_type_format(&v->type, ts, sizeof ts);
    if (v->mem_offset < -1)
        return BAD("%%%s: mem_offset %" PRId64 " must be >= 0 (planned) or -1", v->name,
                   v->mem_offset);
    if (v->kind == IR_VALUE_WEIGHT && v->mem_offset != -1)
        return BAD("weight %%%s: mem_offset %" PRId64 ": weights are not in the activation arena",
                   v->name, v->mem_offset);
    switch (v->kind) {
    case IR_VALUE_INPUT: {
        if (!ir_type_valid(&v->type, 1) || !ir_type_has_t(&v->type))
            return BAD("input %%%s: type %s must have T first (and only there), other dims >= 1",
                       v->name, ts);
        int listed = 0;
        for (int i = 0; i < m->n_inputs; i++)
            listed |= m->inputs[i] == v;
        if (!listed)
            return BAD("input %%%s: not in the module's input list", v->name);
        if (v->type.dtype == IR_DTYPE_F8E4M3)
            return BAD("input %%%s: f8e4m3 is for block-scaled weights only", v->name);
        return MOEC_OK;
    }
    case IR_VALUE_WEIGHT: {
        if (!ir_type_valid(&v->type, 0))
            return BAD("weight %%%s: type %s must not have T, dims >= 1", v->name, ts);
        char msg[IR_MSG_CAP];
        if (ir_binding_check(&v->bind, &v->type, msg, sizeof msg) != MOEC_OK)
            return BAD("weight %%%s: %s", v->name, msg);
        if (ir_block_scale_check(v, msg, sizeof msg) != MOEC_OK)
            return BAD("weight %%%s: %s", v->name, msg);
        return MOEC_OK;
    }
    case IR_VALUE_OP: {
        const ir_op *d = v->def;
        if (!d)
            return BAD("%%%s: no op defines it", v->name);
        if (d->id < 0 || d->id >= m->n_ops || m->ops[d->id] != d)
            return BAD("%%%s: its defining op is not in the module", v->name);
        return MOEC_OK;
    }
    }
    return BAD("%%%s: unknown value kind %d", v->name, (int)v->kind);
}

static moec_status verify_values(const ir_module *m, ir_name_map *names)
{
    if (m->n_values < 0 || (m->n_values > 0 && !m->values))
        return BAD("module %s: bad value table (%d entries)", m->name, m->n_values);
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (!v)
            return BAD("value #%d is null", i);
        if (v->id != i)
            return BAD("%%%s: id %d but at index %d", nm(v), v->id, i);
        if (!ir_value_name_valid(v->name))
            return BAD("value #%d: name '%s' must match [A-Za-z0-9_.]+", i, nm(v));
        if (ir_name_map_get(names, v->name, strlen(v->name)))
            return BAD("duplicate value %%%s", v->name);
        if (ir_name_map_put(names, (ir_value *)v))
            return MOEC_ERR(MOEC_ERR_OOM, "verify: out of memory");
    }
    for (int i = 0; i < m->n_values; i++)
        MOEC_TRY(verify_value(m, m->values[i]));
    if (m->n_inputs < 0 || m->n_inputs > (int)(sizeof m->inputs / sizeof m->inputs[0]))
        return BAD("module %s: %d inputs", m->name, m->n_inputs);
    for (int i = 0; i < m->n_inputs; i++) {
        const ir_value *v = m->inputs[i];
        if (!in_module(m, v) || v->kind != IR_VALUE_INPUT)
            return BAD("input #%d (%%%s) is not an input value of the module", i, nm(v));
        for (int j = 0; j < i; j++)
            if (m->inputs[j] == v)
                return BAD("input %%%s: listed twice", v->name);
    }
    return MOEC_OK;
}

static moec_status verify_op(const ir_module *m, const ir_op *op, int idx, unsigned char *defined)
{
    char label[256];
    if (!op)
        return BAD("op #%d is null", idx);
    ir_op_label(op, label, sizeof label);
    int min_in, max_in, n_out;
    if (!ir_op_arity(op->kind, &min_in, &max_in, &n_out))
        return BAD("%s: unknown op kind %d", label, (int)op->kind);
    if (op->id != idx)
        return BAD("%s: id %d but at index %d", label, op->id, idx);
    if (op->n_out != n_out)
        return BAD("%s: has %d results, expected %d", label, op->n_out, n_out);
    if (op->n_in < min_in || op->n_in > max_in)
        return BAD("%s: takes %d to %d operands, got %d", label, min_in, max_in, op->n_in);
    if (op->stream != 0 && op->stream != 1)
        return BAD("%s: stream %d must be 0 (main) or 1 (side)", label, op->stream);
    for (int i = 0; i < op->n_out; i++) {
        const ir_value *v = op->out[i];
        if (!in_module(m, v))
            return BAD("%s: result %d (%%%s) is not a value of the module", label, i, nm(v));
        if (v->kind != IR_VALUE_OP)
            return BAD("%%%s: a weight or input cannot be an op's result", v->name);
        if (v->def != op || defined[v->id])
            return BAD("%%%s: defined by more than one op", v->name);
        if (!ir_type_valid(&v->type, 1) || !ir_type_has_t(&v->type)) {
            char ts[96];
            ir_type_format(&v->type, ts, sizeof ts);
            return BAD("%%%s: result type %s must have T first (and only there)", v->name, ts);
        }
    }
    for (int i = 0; i < op->n_in; i++) {
        const ir_value *v = op->in[i];
        if (!in_module(m, v))
            return BAD("%s: operand %d (%%%s) is not a value of the module", label, i, nm(v));
        if (v->kind == IR_VALUE_OP && !defined[v->id])
            return BAD("%s: operand %%%s is used before its definition", label, v->name);
    }
    ir_type out[IR_MAX_RESULTS];
    char msg[IR_MSG_CAP];
    moec_status st = ir_op_infer_msg(op, out, msg, sizeof msg);
    if (st != MOEC_OK)
        return MOEC_ERR(st, "%s", msg);
    for (int i = 0; i < op->n_out; i++) {
        if (!ir_type_equal(&out[i], &op->out[i]->type)) {
            char have[96], want[96];
            ir_type_format(&op->out[i]->type, have, sizeof have);
            ir_type_format(&out[i], want, sizeof want);
            return BAD("%%%s: %s: declared type %s, inferred %s", op->out[i]->name,
                       ir_op_name(op->kind), have, want);
        }
    }
    for (int i = 0; i < op->n_out; i++)
        defined[op->out[i]->id] = 1;
    return MOEC_OK;
}

static moec_status verify_ops(const ir_module *m)
{
    if (m->n_ops < 0 || (m->n_ops > 0 && !m->ops))
        return BAD("module %s: bad op table (%d entries)", m->name, m->n_ops);
    unsigned char *defined = calloc((size_t)m->n_values + 1, 1);
    if (!defined)
        return MOEC_ERR(MOEC_ERR_OOM, "verify: out of memory");
    moec_status st = MOEC_OK;
    for (int i = 0; i < m->n_ops && st == MOEC_OK; i++)
        st = verify_op(m, m->ops[i], i, defined);
    for (int i = 0; i < m->n_values && st == MOEC_OK; i++)
        if (m->values[i]->kind == IR_VALUE_OP && !defined[i])
            st = BAD("%%%s: no op defines it", m->values[i]->name);
    free(defined);
    return st;
}

/* In a sharded module (meta tp), every collective spans its tp ranks, and
 * the metas ep and rank agree with tp. */
static moec_status verify_ranks(const ir_module *m)
{
    const ir_attr *tp = ir_module_meta(m, "tp");
    if (!tp)
        return MOEC_OK;
    int64_t ep = ir_module_meta_int(m, "ep", 1), rank = ir_module_meta_int(m, "rank", 0);
    if (tp->kind != IR_ATTR_INT || tp->i < 1 || tp->i > IR_MAX_RANKS || ep < 1 || tp->i % ep ||
        rank < 0 || rank >= tp->i)
        return BAD("module %s: meta tp %lld, ep %lld, rank %lld do not make a rank of a split "
                   "(tp 1 to %d, ep dividing it, rank below it)",
                   m->name, tp->kind == IR_ATTR_INT ? (long long)tp->i : -1LL, (long long)ep,
                   (long long)rank, IR_MAX_RANKS);
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind != IR_OP_ALL_REDUCE && op->kind != IR_OP_ALL_GATHER &&
            op->kind != IR_OP_REDUCE_SCATTER && op->kind != IR_OP_ALL_TO_ALL)
            continue;
        int64_t ranks = ir_op_attr_int(op, "ranks", 0);
        if (ranks != tp->i)
            return BAD("%%%s: %s over %lld ranks in a module of tp %lld", op->out[0]->name,
                       ir_op_name(op->kind), (long long)ranks, (long long)tp->i);
    }
    return MOEC_OK;
}

static moec_status verify_outputs(const ir_module *m)
{
    int cap = (int)(sizeof m->outputs / sizeof m->outputs[0]);
    if (m->n_outputs < 1)
        return BAD("module %s: has no outputs", m->name);
    if (m->n_outputs > cap)
        return BAD("module %s: %d outputs (at most %d)", m->name, m->n_outputs, cap);
    for (int i = 0; i < m->n_outputs; i++) {
        const ir_value *v = m->outputs[i];
        if (!in_module(m, v))
            return BAD("output #%d (%%%s) is not a value of the module", i, nm(v));
        for (int j = 0; j < i; j++)
            if (m->outputs[j] == v)
                return BAD("output %%%s: listed twice", v->name);
    }
    return MOEC_OK;
}

/* One placed activation of the plan check: its bytes per token and the live
 * range of its alias group. */
typedef struct placed {
    const ir_value *v;
    int group, start, end;
    int64_t lo, hi; /* bytes [lo, hi) per token */
} placed;

static int by_start(const void *pa, const void *pb)
{
    const placed *a = pa, *b = pb;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    return a->v->id < b->v->id ? -1 : a->v->id > b->v->id;
}

/* Among activations with arena offsets: a reshape, fork or join result at
 * exactly its operand's offset joins the operand's alias group (the bytes
 * are written once, by the op that defines the group's first value, and
 * only read after), live over the union of its members' ranges; no two
 * groups may share bytes while both are live. */
static moec_status verify_plan(const ir_module *m)
{
    int n = m->n_values, n_placed = 0;
    for (int i = 0; i < n; i++)
        n_placed += m->values[i]->kind != IR_VALUE_WEIGHT && m->values[i]->mem_offset >= 0;
    if (!n_placed)
        return MOEC_OK;
    int *start = malloc(sizeof *start * (size_t)n), *end = malloc(sizeof *end * (size_t)n);
    int *group = malloc(sizeof *group * (size_t)n);
    placed *p = malloc(sizeof *p * (size_t)n_placed);
    int *active = malloc(sizeof *active * (size_t)n_placed);
    moec_status st = MOEC_OK;
    if (!start || !end || !group || !p || !active || ir_module_live_ranges(m, start, end)) {
        st = MOEC_ERR(MOEC_ERR_OOM, "verify: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++)
        group[i] = i;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        const ir_value *x = op->in[0], *y = op->out[0];
        if (ir_op_may_alias(op->kind) && x->kind == IR_VALUE_OP && x->mem_offset >= 0 &&
            y->mem_offset == x->mem_offset)
            group[y->id] = group[x->id]; /* x's group is final: x is defined before y */
    }
    for (int i = 0; i < n; i++) {
        int g = group[i];
        if (start[i] < start[g])
            start[g] = start[i];
        if (end[i] > end[g])
            end[g] = end[i];
    }
    for (int i = 0, j = 0; i < n; i++) {
        const ir_value *v = m->values[i];
        if (v->kind == IR_VALUE_WEIGHT || v->mem_offset < 0)
            continue;
        int g = group[i];
        p[j++] = (placed){v, g, start[g], end[g], v->mem_offset,
                          v->mem_offset + ir_type_numel(&v->type, 1) * 4};
    }
    qsort(p, (size_t)n_placed, sizeof *p, by_start);
    int n_active = 0;
    for (int i = 0; i < n_placed && st == MOEC_OK; i++) {
        const placed *a = &p[i];
        int keep = 0;
        for (int j = 0; j < n_active; j++)
            if (p[active[j]].end >= a->start)
                active[keep++] = active[j];
        n_active = keep;
        for (int j = 0; j < n_active; j++) {
            const placed *b = &p[active[j]];
            if (b->group == a->group || b->hi <= a->lo || a->hi <= b->lo)
                continue;
            st = BAD("%%%s (@%" PRId64 "*T) and %%%s (@%" PRId64 "*T) share arena bytes while "
                     "both are live (ops %d..%d and %d..%d); only a reshape, fork or join result "
                     "may share its operand's storage, at exactly its offset",
                     b->v->name, b->lo, a->v->name, a->lo, b->start, b->end, a->start, a->end);
            break;
        }
        active[n_active++] = i;
    }
out:
    free(start);
    free(end);
    free(group);
    free(p);
    free(active);
    return st;
}

moec_status ir_module_verify(const ir_module *m)
{
    if (!m)
        return BAD("verify: null module");
    if (!module_name_valid(m->name))
        return BAD("module '%s': name must match [A-Za-z_][A-Za-z0-9_.]*", m->name ? m->name : "");
    MOEC_TRY(verify_metas(m));
    ir_name_map names;
    if (ir_name_map_init(&names, m->n_values > 0 ? (size_t)m->n_values : 0))
        return MOEC_ERR(MOEC_ERR_OOM, "verify: out of memory");
    moec_status st = verify_values(m, &names);
    ir_name_map_free(&names);
    MOEC_TRY(st);
    MOEC_TRY(verify_ops(m));
    MOEC_TRY(verify_ranks(m));
    MOEC_TRY(verify_outputs(m));
    return verify_plan(m);
}
