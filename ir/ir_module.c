/* ir_module.c — the module: values, ops and metas in one arena, and the
 * builders that record them (checking names, shapes and attributes as they
 * go, so a bad frontend fails at the line that made the mistake). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "ir/ir_internal.h"

/* ---- names ---------------------------------------------------------------- */

static int is_name_char(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '.';
}

int ir_value_name_valid(const char *s)
{
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if (!is_name_char((unsigned char)*s))
            return 0;
    return 1;
}

int ir_key_valid(const char *s)
{
    if (!s || !*s || (*s >= '0' && *s <= '9'))
        return 0;
    for (; *s; s++)
        if (!is_name_char((unsigned char)*s) || *s == '.')
            return 0;
    return 1;
}

int ir_string_valid(const char *s)
{
    if (!s)
        return 0;
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 0;
    return 1;
}

/* ---- name map ------------------------------------------------------------- */

static size_t name_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return (size_t)h;
}

int ir_name_map_init(ir_name_map *h, size_t expect)
{
    size_t cap = 64;
    while (cap < expect * 2 && cap < ((size_t)1 << 40))
        cap *= 2;
    h->slots = calloc(cap, sizeof *h->slots);
    h->cap = h->slots ? cap : 0;
    h->n = 0;
    return h->slots ? 0 : -1;
}

void ir_name_map_free(ir_name_map *h)
{
    free(h->slots);
    h->slots = NULL;
    h->cap = h->n = 0;
}

ir_value *ir_name_map_get(const ir_name_map *h, const char *name, size_t len)
{
    if (!h->cap)
        return NULL;
    size_t mask = h->cap - 1;
    for (size_t i = name_hash(name, len) & mask, probes = 0; probes < h->cap;
         i = (i + 1) & mask, probes++) {
        ir_value *v = h->slots[i];
        if (!v)
            return NULL;
        if (v->name && strlen(v->name) == len && !memcmp(v->name, name, len))
            return v;
    }
    return NULL;
}

static void name_map_insert(ir_value **slots, size_t cap, ir_value *v)
{
    size_t mask = cap - 1;
    size_t i = name_hash(v->name, strlen(v->name)) & mask;
    while (slots[i])
        i = (i + 1) & mask;
    slots[i] = v;
}

int ir_name_map_put(ir_name_map *h, ir_value *v)
{
    if (!v || !v->name || !h->cap)
        return -1;
    if ((h->n + 1) * 2 > h->cap) {
        size_t cap = h->cap * 2;
        ir_value **slots = calloc(cap, sizeof *slots);
        if (!slots)
            return -1;
        for (size_t i = 0; i < h->cap; i++)
            if (h->slots[i])
                name_map_insert(slots, cap, h->slots[i]);
        free(h->slots);
        h->slots = slots;
        h->cap = cap;
    }
    name_map_insert(h->slots, h->cap, v);
    h->n++;
    return 0;
}

/* ---- module --------------------------------------------------------------- */

ir_module *ir_module_init(const char *name)
{
    ir_arena *a = ir_arena_init();
    if (!a)
        return NULL;
    ir_module *m = ir_arena_alloc(a, sizeof *m);
    if (!m) {
        ir_arena_free(a);
        return NULL;
    }
    m->arena = a;
    m->name = ir_arena_strdup(a, name ? name : "");
    if (!m->name) {
        ir_arena_free(a);
        return NULL;
    }
    return m;
}

void ir_module_free(ir_module *m)
{
    if (!m)
        return;
    if (m->index) {
        ir_name_map_free(m->index);
        free(m->index);
    }
    ir_arena_free(m->arena);
}

const ir_attr *ir_module_meta(const ir_module *m, const char *key)
{
    if (!m || !key || !m->meta)
        return NULL;
    for (int i = 0; i < m->n_meta; i++)
        if (m->meta[i].key && !strcmp(m->meta[i].key, key))
            return &m->meta[i];
    return NULL;
}

int64_t ir_module_meta_int(const ir_module *m, const char *key, int64_t dflt)
{
    const ir_attr *a = ir_module_meta(m, key);
    return a && a->kind == IR_ATTR_INT ? a->i : dflt;
}

int ir_module_meta_ints(const ir_module *m, const char *key, const int64_t **v)
{
    const ir_attr *a = ir_module_meta(m, key);
    *v = NULL;
    if (a && a->kind == IR_ATTR_INT) {
        *v = &a->i;
        return 1;
    }
    if (a && a->kind == IR_ATTR_INTS) {
        *v = a->ints;
        return a->n;
    }
    return 0;
}

/* The module's name index (an ir_name_map the module owns), kept as values
 * are appended and rebuilt when a rename or a removal has made it stale, so
 * that a lookup costs O(1) instead of a scan of all values (which made
 * building a large model quadratic). NULL when memory ran out: the caller
 * then scans. */
static const ir_name_map *module_index(const ir_module *cm)
{
    ir_module *m = (ir_module *)cm; /* the index is a cache: lookups may build it */
    if (m->index && !m->index_stale)
        return m->index;
    if (!m->index && !(m->index = calloc(1, sizeof *m->index)))
        return NULL;
    m->index_stale = 1; /* until it is whole again */
    ir_name_map_free(m->index);
    if (ir_name_map_init(m->index, (size_t)m->n_values + 1))
        return NULL;
    for (int i = 0; i < m->n_values; i++)
        if (m->values[i] && m->values[i]->name && ir_name_map_put(m->index, m->values[i]))
            return NULL;
    m->index_stale = 0;
    return m->index;
}

void ir_module_values_changed(ir_module *m)
{
    if (m)
        m->index_stale = 1;
}

void ir_value_rename(ir_module *m, ir_value *v, const char *name)
{
    v->name = name;
    ir_module_values_changed(m);
}

ir_value *ir_module_find_value(const ir_module *m, const char *name)
{
    if (!m || !name || !m->values)
        return NULL;
    if (name[0] == '%')
        name++;
    const ir_name_map *x = module_index(m);
    if (x)
        return ir_name_map_get(x, name, strlen(name));
    for (int i = 0; i < m->n_values; i++)
        if (m->values[i] && m->values[i]->name && !strcmp(m->values[i]->name, name))
            return m->values[i];
    return NULL;
}

/* Grows an arena-held pointer array to hold one more; the old array is left
 * in the arena. */
static int grow(ir_arena *a, void **arr, int n, int *cap, size_t elem)
{
    if (n < *cap)
        return 0;
    if (*cap > (1 << 28))
        return -1;
    int ncap = *cap ? *cap * 2 : 16;
    void *fresh = ir_arena_alloc(a, (size_t)ncap * elem);
    if (!fresh)
        return -1;
    if (n > 0 && *arr)
        memcpy(fresh, *arr, (size_t)n * elem);
    *arr = fresh;
    *cap = ncap;
    return 0;
}

ir_value *ir_module_new_value(ir_module *m, const char *name, size_t name_len,
                              ir_value_kind kind)
{
    void *arr = m->values;
    if (grow(m->arena, &arr, m->n_values, &m->values_cap, sizeof(ir_value *)))
        return NULL;
    m->values = arr;
    ir_value *v = ir_arena_alloc(m->arena, sizeof *v);
    char *s = ir_arena_alloc(m->arena, name_len + 1);
    if (!v || !s)
        return NULL;
    memcpy(s, name, name_len);
    s[name_len] = '\0';
    v->name = s;
    v->kind = kind;
    v->id = m->n_values;
    v->mem_offset = -1;
    m->values[m->n_values++] = v;
    if (m->index && !m->index_stale && ir_name_map_put(m->index, v))
        m->index_stale = 1; /* rebuilt (or scanned) at the next lookup */
    return v;
}

ir_op *ir_module_new_op(ir_module *m, ir_op_kind kind)
{
    void *arr = m->ops;
    if (grow(m->arena, &arr, m->n_ops, &m->ops_cap, sizeof(ir_op *)))
        return NULL;
    m->ops = arr;
    ir_op *op = ir_arena_alloc(m->arena, sizeof *op);
    if (!op)
        return NULL;
    op->kind = kind;
    op->id = m->n_ops;
    m->ops[m->n_ops++] = op;
    return op;
}

/* ---- metas ---------------------------------------------------------------- */

moec_status ir_module_meta_slot(ir_module *m, const char *key, ir_attr_kind kind, ir_attr **out)
{
    if (!m || !key)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "meta: null module or key");
    if (!ir_key_valid(key))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "meta '%s': key must match [A-Za-z_][A-Za-z0-9_]*",
                        key);
    ir_attr *a = (ir_attr *)ir_module_meta(m, key);
    if (!a) {
        void *arr = m->meta;
        if (grow(m->arena, &arr, m->n_meta, &m->meta_cap, sizeof(ir_attr)))
            return MOEC_ERR(MOEC_ERR_OOM, "meta '%s': out of memory", key);
        m->meta = arr;
        a = &m->meta[m->n_meta];
        a->key = ir_arena_strdup(m->arena, key);
        if (!a->key)
            return MOEC_ERR(MOEC_ERR_OOM, "meta '%s': out of memory", key);
        m->n_meta++;
    }
    const char *k = a->key;
    memset(a, 0, sizeof *a);
    a->key = k;
    a->kind = kind;
    *out = a;
    return MOEC_OK;
}

moec_status ir_module_set_meta_int(ir_module *m, const char *key, int64_t v)
{
    ir_attr *a;
    MOEC_TRY(ir_module_meta_slot(m, key, IR_ATTR_INT, &a));
    a->i = v;
    return MOEC_OK;
}

moec_status ir_module_set_meta_ints(ir_module *m, const char *key, const int64_t *v, int n)
{
    if (n < 0 || (n > 0 && !v))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "meta '%s': bad int list", key ? key : "?");
    ir_attr *a;
    MOEC_TRY(ir_module_meta_slot(m, key, IR_ATTR_INTS, &a));
    if (n > 0) {
        a->ints = ir_arena_alloc(m->arena, sizeof *a->ints * (size_t)n);
        if (!a->ints)
            return MOEC_ERR(MOEC_ERR_OOM, "meta '%s': out of memory", key);
        memcpy(a->ints, v, sizeof *a->ints * (size_t)n);
    }
    a->n = n;
    return MOEC_OK;
}

moec_status ir_module_set_meta_float(ir_module *m, const char *key, double v)
{
    ir_attr *a;
    MOEC_TRY(ir_module_meta_slot(m, key, IR_ATTR_FLOAT, &a));
    a->f = v;
    return MOEC_OK;
}

moec_status ir_module_set_meta_str(ir_module *m, const char *key, const char *v)
{
    if (!ir_string_valid(v))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "meta '%s': string is null or has control characters",
                        key ? key : "?");
    ir_attr *a;
    MOEC_TRY(ir_module_meta_slot(m, key, IR_ATTR_STR, &a));
    a->s = ir_arena_strdup(m->arena, v);
    if (!a->s) {
        a->kind = IR_ATTR_INT;
        return MOEC_ERR(MOEC_ERR_OOM, "meta '%s': out of memory", key);
    }
    return MOEC_OK;
}

/* ---- values --------------------------------------------------------------- */

static moec_status check_new_name(const ir_module *m, const char *what, const char *name)
{
    if (!m)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: null module", what);
    if (!ir_value_name_valid(name))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: name must match [A-Za-z0-9_.]+", what,
                        name ? name : "(null)");
    if (ir_module_find_value(m, name))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "duplicate value %%%s", name);
    return MOEC_OK;
}

static ir_value *new_value_or_oom(ir_module *m, const char *name, ir_value_kind kind)
{
    ir_value *v = ir_module_new_value(m, name, strlen(name), kind);
    if (!v)
        MOEC_ERR(MOEC_ERR_OOM, "out of memory adding %%%s", name);
    return v;
}

ir_value *ir_module_add_input(ir_module *m, const char *name, ir_type type)
{
    if (check_new_name(m, "input", name) != MOEC_OK)
        return NULL;
    char ts[96];
    ir_type_format(&type, ts, sizeof ts);
    if (!ir_type_valid(&type, 1) || !ir_type_has_t(&type)) {
        MOEC_ERR(MOEC_ERR_INVALID_ARG, "input %%%s: type %s must be valid with T first", name, ts);
        return NULL;
    }
    if (m->n_inputs >= (int)(sizeof m->inputs / sizeof m->inputs[0])) {
        MOEC_ERR(MOEC_ERR_CAPACITY, "input %%%s: too many inputs (at most %d)", name,
                 (int)(sizeof m->inputs / sizeof m->inputs[0]));
        return NULL;
    }
    ir_value *v = new_value_or_oom(m, name, IR_VALUE_INPUT);
    if (!v)
        return NULL;
    v->type = type;
    m->inputs[m->n_inputs++] = v;
    return v;
}

/* The leaf's extent along dim d: its box's, else the whole dim (-1: not
 * known without the checkpoint, a plain tensor's dim). */
static int64_t leaf_extent(const ir_binding *b, int d)
{
    if (b->box_rank > d && b->box_size[d] > 0)
        return b->box_size[d];
    if (d == 0 && b->kind == IR_BIND_STACK)
        return b->count;
    return -1;
}

static int stack_fits(const ir_binding *b, const ir_type *t, int concat_axis)
{
    int64_t n = leaf_extent(b, 0);
    if (concat_axis == 0)
        return n <= t->dims[0];
    return n == t->dims[0];
}

/* A leaf's box: as many dims as the weight, each range inside a stack's
 * count (dim 0) and, but along a concat axis, as wide as the weight. */
static moec_status box_check(const ir_binding *b, const ir_type *t, int concat_axis, char *msg,
                             size_t cap)
{
    if (b->box_rank == 0)
        return MOEC_OK;
    if (b->box_rank != t->rank) {
        snprintf(msg, cap, "slice has %d dims, the weight has %d", b->box_rank, t->rank);
        return MOEC_ERR_INVALID_ARG;
    }
    for (int d = 0; d < b->box_rank; d++) {
        int64_t lo = b->box_start[d], n = b->box_size[d];
        if (n == 0 && lo == 0)
            continue;
        if (lo < 0 || n < 1 || lo > IR_DIM_MAX - n) {
            snprintf(msg, cap, "slice dim %d [%" PRId64 ":%" PRId64 "] is empty or negative", d,
                     lo, lo + n);
            return MOEC_ERR_INVALID_ARG;
        }
        if (d == 0 && b->kind == IR_BIND_STACK && lo + n > b->count) {
            snprintf(msg, cap, "slice dim 0 [%" PRId64 ":%" PRId64 "] is outside the stack's %d",
                     lo, lo + n, b->count);
            return MOEC_ERR_INVALID_ARG;
        }
        if (d != concat_axis && n != t->dims[d]) {
            snprintf(msg, cap, "slice dim %d [%" PRId64 ":%" PRId64 "] has %" PRId64
                     " entries, the weight %" PRId64, d, lo, lo + n, n, t->dims[d]);
            return MOEC_ERR_INVALID_ARG;
        }
    }
    return MOEC_OK;
}

static moec_status binding_leaf_check(const ir_binding *b, const ir_type *t, int concat_axis,
                                      char *msg, size_t cap)
{
    if (b->kind == IR_BIND_TENSOR) {
        if (!b->name || !*b->name) {
            snprintf(msg, cap, "has no binding (empty tensor name)");
            return MOEC_ERR_INVALID_ARG;
        }
    } else if (b->kind == IR_BIND_STACK) {
        if (!b->name || !strstr(b->name, "{e}")) {
            snprintf(msg, cap, "stack pattern \"%s\" must contain {e}", b->name ? b->name : "");
            return MOEC_ERR_INVALID_ARG;
        }
        if (b->count < 1) {
            snprintf(msg, cap, "stack count %d must be >= 1", b->count);
            return MOEC_ERR_INVALID_ARG;
        }
        if (!stack_fits(b, t, concat_axis)) {
            snprintf(msg, cap, "stack count %" PRId64 " does not match dim 0 (%" PRId64 ")",
                     leaf_extent(b, 0), t->dims[0]);
            return MOEC_ERR_INVALID_ARG;
        }
    } else {
        snprintf(msg, cap, "binding part of kind %d must be a tensor or a stack", (int)b->kind);
        return MOEC_ERR_INVALID_ARG;
    }
    MOEC_TRY(box_check(b, t, concat_axis, msg, cap));
    if (!ir_string_valid(b->name)) {
        snprintf(msg, cap, "tensor name has control characters");
        return MOEC_ERR_INVALID_ARG;
    }
    return MOEC_OK;
}

moec_status ir_binding_check(const ir_binding *b, const ir_type *t, char *msg, size_t cap)
{
    if (!b || !t || t->rank < 1 || t->rank > IR_MAX_RANK) {
        snprintf(msg, cap, "has no binding");
        return MOEC_ERR_INVALID_ARG;
    }
    if (b->kind != IR_BIND_CONCAT)
        return binding_leaf_check(b, t, -1, msg, cap);
    if (b->n_parts < 1 || b->n_parts > IR_MAX_BIND_PARTS || !b->parts) {
        snprintf(msg, cap, "concat binding has %d parts (1 to %d allowed)", b->n_parts,
                 IR_MAX_BIND_PARTS);
        return MOEC_ERR_INVALID_ARG;
    }
    if (b->axis < 0 || b->axis >= t->rank) {
        snprintf(msg, cap, "concat axis %d out of range [0, %d]", b->axis, t->rank - 1);
        return MOEC_ERR_INVALID_ARG;
    }
    for (int i = 0; i < b->n_parts; i++)
        MOEC_TRY(binding_leaf_check(&b->parts[i], t, b->axis, msg, cap));
    return MOEC_OK;
}

/* 1 when s has b's structure: kind, stack count, concat axis and parts. */
static int binding_mirrors(const ir_binding *b, const ir_binding *s)
{
    if (b->kind != s->kind || b->count != s->count)
        return 0;
    if (b->kind != IR_BIND_CONCAT)
        return 1;
    if (b->axis != s->axis || b->n_parts != s->n_parts || !b->parts || !s->parts)
        return 0;
    for (int i = 0; i < b->n_parts; i++)
        if (b->parts[i].kind != s->parts[i].kind || b->parts[i].count != s->parts[i].count)
            return 0;
    return 1;
}

void ir_binding_box_format(const ir_binding *b, int from, char *buf, size_t cap)
{
    if (cap == 0)
        return;
    if (b->box_rank == 0) {
        snprintf(buf, cap, "(none)");
        return;
    }
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = from; d < b->box_rank && n < cap; d++) {
        const char *sep = d > from ? ", " : "";
        if (b->box_size[d] > 0)
            n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64 ":%" PRId64, sep,
                                  b->box_start[d], b->box_start[d] + b->box_size[d]);
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s:", sep);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

int ir_binding_tensor_name(const ir_binding *b, int e, char *buf, size_t cap)
{
    if (!b->name || cap == 0 || b->kind == IR_BIND_CONCAT)
        return -1;
    size_t n = 0;
    for (const char *p = b->name; *p;) {
        int k = 1;
        if (b->kind == IR_BIND_STACK && !strncmp(p, "{e}", 3)) {
            k = 3;
            n += (size_t)snprintf(buf + n, cap - n, "%d", e);
        } else {
            buf[n++] = *p;
        }
        if (n >= cap)
            return -1;
        p += k;
    }
    buf[n] = '\0';
    return 0;
}

void ir_block_scale_box(const ir_binding *b, int rank, const int64_t *block, ir_binding *s)
{
    s->box_rank = b->box_rank;
    memcpy(s->box_start, b->box_start, sizeof s->box_start);
    memcpy(s->box_size, b->box_size, sizeof s->box_size);
    for (int k = 0; k < 2; k++) {
        int d = rank - 2 + k;
        if (d < 0 || d >= b->box_rank || b->box_size[d] <= 0 || block[k] < 1)
            continue;
        int64_t lo = b->box_start[d] / block[k];
        int64_t hi = (b->box_start[d] + b->box_size[d] + block[k] - 1) / block[k];
        s->box_start[d] = lo;
        s->box_size[d] = hi - lo;
    }
}

/* Leaf b of block-scaled weight w and its scales' leaf s: b's box starts
 * on a block boundary along the blocked dims, and s holds the blocks it
 * touches. */
static moec_status block_scale_leaf_check(const ir_value *w, const ir_binding *b,
                                          const ir_binding *s, char *msg, size_t cap)
{
    const int64_t block[2] = {ir_block_scale_stored(&w->scale, 0),
                              ir_block_scale_stored(&w->scale, 1)};
    int rank = w->type.rank;
    for (int k = 0; k < 2; k++) {
        int d = rank - 2 + k;
        if (d < b->box_rank && b->box_size[d] > 0 && b->box_start[d] % block[k]) {
            snprintf(msg, cap,
                     "the slice of \"%s\" starts at %s %" PRId64 " (dim %d), not on a "
                     "boundary of its blocks of %" PRId64 ": a block-scaled weight is sliced "
                     "along whole blocks",
                     b->name ? b->name : "", k ? "column" : "row", b->box_start[d], d, block[k]);
            return MOEC_ERR_INVALID_ARG;
        }
    }
    ir_binding want = *s;
    ir_block_scale_box(b, rank, block, &want);
    int same = want.box_rank == s->box_rank;
    for (int d = 0; same && d < s->box_rank; d++)
        same = want.box_start[d] == s->box_start[d] && want.box_size[d] == s->box_size[d];
    if (!same) {
        char got[160], exp[160];
        ir_binding_box_format(s, 0, got, sizeof got);
        ir_binding_box_format(&want, 0, exp, sizeof exp);
        snprintf(msg, cap,
                 "the block_scale slice of \"%s\" is %s, but the weight's slice touches the "
                 "blocks %s",
                 s->name ? s->name : "", got, exp);
        return MOEC_ERR_INVALID_ARG;
    }
    return MOEC_OK;
}

ir_type ir_block_scale_type(const ir_value *w)
{
    ir_type t = w->type;
    t.dtype = IR_DTYPE_F32;
    for (int k = 0; k < 2 && t.rank >= 2 && t.rank <= IR_MAX_RANK; k++) {
        int64_t b = w->scale.block[k];
        int d = t.rank - 2 + k;
        if (b > 0)
            t.dims[d] = (t.dims[d] + b - 1) / b;
    }
    return t;
}

moec_status ir_block_scale_check(const ir_value *w, char *msg, size_t cap)
{
    const ir_block_scale *s = &w->scale;
    const ir_type *t = &w->type;
    char ts[96];
    ir_type_format(t, ts, sizeof ts);
    if (s->block[0] == 0 && s->block[1] == 0) {
        if (t->dtype != IR_DTYPE_F8E4M3)
            return MOEC_OK;
        snprintf(msg, cap, "f8e4m3 needs a block_scale (the scales of its blocks)");
        return MOEC_ERR_INVALID_ARG;
    }
    if (s->block[0] < 1 || s->block[0] > IR_DIM_MAX || s->block[1] < 1 ||
        s->block[1] > IR_DIM_MAX) {
        snprintf(msg, cap, "block_scale block [%" PRId64 ", %" PRId64 "] must be >= 1",
                 s->block[0], s->block[1]);
        return MOEC_ERR_INVALID_ARG;
    }
    for (int k = 0; k < 2 && (s->stored[0] || s->stored[1]); k++) {
        int64_t st = s->stored[k];
        if (st < 1 || st > IR_DIM_MAX || st % s->block[k]) {
            snprintf(msg, cap,
                     "block_scale block [%" PRId64 ", %" PRId64 "] must divide the blocks [%" PRId64
                     ", %" PRId64 "] its scales are stored in",
                     s->block[0], s->block[1], s->stored[0], s->stored[1]);
            return MOEC_ERR_INVALID_ARG;
        }
    }
    if (t->rank < 2) {
        snprintf(msg, cap, "a block_scale needs a weight of rank >= 2 (rows, columns), got %s", ts);
        return MOEC_ERR_INVALID_ARG;
    }
    if (t->dtype == IR_DTYPE_I32) {
        snprintf(msg, cap, "an i32 weight cannot have a block_scale");
        return MOEC_ERR_INVALID_ARG;
    }
    if (!binding_mirrors(&w->bind, &s->bind)) {
        snprintf(msg, cap, "the block_scale binding must mirror the weight's (same kind, stack "
                           "count, concat axis and parts)");
        return MOEC_ERR_INVALID_ARG;
    }
    if (w->bind.kind != IR_BIND_CONCAT)
        MOEC_TRY(block_scale_leaf_check(w, &w->bind, &s->bind, msg, cap));
    for (int i = 0; w->bind.kind == IR_BIND_CONCAT && i < w->bind.n_parts; i++)
        MOEC_TRY(block_scale_leaf_check(w, &w->bind.parts[i], &s->bind.parts[i], msg, cap));
    ir_value stored = *w; /* the scale tensors' grid: the checkpoint's blocks */
    stored.scale.block[0] = ir_block_scale_stored(s, 0);
    stored.scale.block[1] = ir_block_scale_stored(s, 1);
    ir_type st = ir_block_scale_type(&stored);
    char sub[IR_MSG_CAP];
    if (ir_binding_check(&s->bind, &st, sub, sizeof sub) != MOEC_OK) {
        snprintf(msg, cap, "block_scale %s", sub);
        return MOEC_ERR_INVALID_ARG;
    }
    return MOEC_OK;
}

/* A TENSOR or STACK leaf, name and box, into m's arena. */
static int binding_leaf_copy(ir_module *m, ir_binding *dst, const ir_binding *src)
{
    memset(dst, 0, sizeof *dst);
    dst->kind = src->kind;
    dst->count = src->count;
    dst->box_rank = src->box_rank;
    memcpy(dst->box_start, src->box_start, sizeof dst->box_start);
    memcpy(dst->box_size, src->box_size, sizeof dst->box_size);
    return src->name && !(dst->name = ir_arena_strdup(m->arena, src->name)) ? -1 : 0;
}

int ir_binding_copy(ir_module *m, ir_binding *dst, const ir_binding *src)
{
    if (src->kind != IR_BIND_CONCAT)
        return binding_leaf_copy(m, dst, src);
    memset(dst, 0, sizeof *dst);
    dst->kind = src->kind;
    dst->axis = src->axis;
    if (src->n_parts <= 0 || !src->parts)
        return 0;
    ir_binding *parts = ir_arena_alloc(m->arena, sizeof *parts * (size_t)src->n_parts);
    if (!parts)
        return -1;
    for (int i = 0; i < src->n_parts; i++)
        if (binding_leaf_copy(m, &parts[i], &src->parts[i]))
            return -1;
    dst->parts = parts;
    dst->n_parts = src->n_parts;
    return 0;
}

ir_value *ir_module_add_weight_bound(ir_module *m, const char *name, ir_type type,
                                     const ir_binding *bind)
{
    if (check_new_name(m, "weight", name) != MOEC_OK)
        return NULL;
    char ts[96];
    ir_type_format(&type, ts, sizeof ts);
    if (!ir_type_valid(&type, 0)) {
        MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: type %s must be valid, without T", name, ts);
        return NULL;
    }
    char msg[IR_MSG_CAP];
    if (ir_binding_check(bind, &type, msg, sizeof msg) != MOEC_OK) {
        MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: %s", name, msg);
        return NULL;
    }
    ir_value *v = new_value_or_oom(m, name, IR_VALUE_WEIGHT);
    if (!v)
        return NULL;
    v->type = type;
    if (ir_binding_copy(m, &v->bind, bind)) {
        MOEC_ERR(MOEC_ERR_OOM, "out of memory adding %%%s", name);
        return NULL;
    }
    return v;
}

ir_value *ir_module_add_weight(ir_module *m, const char *name, ir_type type, const char *tensor)
{
    ir_binding b = {.kind = IR_BIND_TENSOR, .name = tensor};
    return ir_module_add_weight_bound(m, name, type, &b);
}

ir_value *ir_module_add_weight_stack(ir_module *m, const char *name, ir_type type,
                                     const char *pattern, int count)
{
    ir_binding b = {.kind = IR_BIND_STACK, .name = pattern, .count = count};
    return ir_module_add_weight_bound(m, name, type, &b);
}

static int value_in_module(const ir_module *m, const ir_value *v)
{
    return v && v->id >= 0 && v->id < m->n_values && m->values[v->id] == v;
}

moec_status ir_weight_set_block_scale(ir_module *m, ir_value *w, int64_t rows, int64_t cols,
                                      const ir_binding *scale)
{
    if (!m || !value_in_module(m, w) || w->kind != IR_VALUE_WEIGHT || !scale)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "block_scale: %%%s is not a weight of the module",
                        w && w->name ? w->name : "?");
    ir_block_scale was = w->scale;
    w->scale.block[0] = rows;
    w->scale.block[1] = cols;
    w->scale.stored[0] = w->scale.stored[1] = 0;
    w->scale.bind = *scale;
    char msg[IR_MSG_CAP];
    if (ir_block_scale_check(w, msg, sizeof msg) != MOEC_OK) {
        w->scale = was;
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: %s", w->name, msg);
    }
    if (ir_binding_copy(m, &w->scale.bind, scale)) {
        w->scale = was;
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory adding the block scale of %%%s", w->name);
    }
    return MOEC_OK;
}

moec_status ir_weight_refine_block_scale(ir_module *m, ir_value *w, int64_t rows, int64_t cols)
{
    if (!m || !value_in_module(m, w) || w->kind != IR_VALUE_WEIGHT || w->scale.block[0] < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "refining block scales: %%%s is not a block-scaled "
                        "weight of the module", w && w->name ? w->name : "?");
    ir_block_scale was = w->scale;
    w->scale.stored[0] = ir_block_scale_stored(&was, 0);
    w->scale.stored[1] = ir_block_scale_stored(&was, 1);
    w->scale.block[0] = rows;
    w->scale.block[1] = cols;
    if (rows == w->scale.stored[0] && cols == w->scale.stored[1])
        w->scale.stored[0] = w->scale.stored[1] = 0;
    char msg[IR_MSG_CAP];
    if (rows < 1 || cols < 1 || ir_block_scale_check(w, msg, sizeof msg) != MOEC_OK) {
        if (rows < 1 || cols < 1)
            snprintf(msg, sizeof msg, "block_scale block [%" PRId64 ", %" PRId64 "] must be >= 1",
                     rows, cols);
        w->scale = was;
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: %s", w->name, msg);
    }
    return MOEC_OK;
}

moec_status ir_module_add_output(ir_module *m, ir_value *v)
{
    if (!m || !value_in_module(m, v))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "output: value %%%s is not in the module",
                        v && v->name ? v->name : "?");
    int cap = (int)(sizeof m->outputs / sizeof m->outputs[0]);
    for (int i = 0; i < m->n_outputs; i++)
        if (m->outputs[i] == v)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "output %%%s: already an output", v->name);
    if (m->n_outputs >= cap)
        return MOEC_ERR(MOEC_ERR_CAPACITY, "output %%%s: too many outputs (at most %d)", v->name,
                        cap);
    m->outputs[m->n_outputs++] = v;
    return MOEC_OK;
}

/* ---- ops ------------------------------------------------------------------ */

ir_op *ir_module_add_op(ir_module *m, ir_op_kind kind, ir_value *const *in, int n_in,
                        const char *const *out_names, int n_out)
{
    int min_in, max_in, want_out;
    if (!m) {
        MOEC_ERR(MOEC_ERR_INVALID_ARG, "add_op: null module");
        return NULL;
    }
    if (!ir_op_arity(kind, &min_in, &max_in, &want_out)) {
        MOEC_ERR(MOEC_ERR_INVALID_ARG, "add_op: unknown op kind %d", (int)kind);
        return NULL;
    }
    const char *opname = ir_op_name(kind);
    const char *first = out_names && n_out > 0 && out_names[0] ? out_names[0] : "?";
    if (n_out != want_out || !out_names) {
        MOEC_ERR(MOEC_ERR_INVALID_ARG, "%%%s: %s: has %d results, %d given", first, opname,
                 want_out, n_out);
        return NULL;
    }
    if (n_in < min_in || n_in > max_in || (n_in > 0 && !in)) {
        MOEC_ERR(MOEC_ERR_INVALID_ARG, "%%%s: %s: takes %d to %d operands, got %d", first, opname,
                 min_in, max_in, n_in);
        return NULL;
    }
    for (int i = 0; i < n_in; i++) {
        if (!value_in_module(m, in[i])) {
            MOEC_ERR(MOEC_ERR_INVALID_ARG, "%%%s: %s: operand %d (%%%s) is not a value of this module",
                     first, opname, i, in[i] && in[i]->name ? in[i]->name : "?");
            return NULL;
        }
    }
    for (int i = 0; i < n_out; i++) {
        if (check_new_name(m, opname, out_names[i]) != MOEC_OK)
            return NULL;
        for (int j = 0; j < i; j++)
            if (!strcmp(out_names[j], out_names[i])) {
                MOEC_ERR(MOEC_ERR_INVALID_ARG, "duplicate value %%%s", out_names[i]);
                return NULL;
            }
    }
    ir_op *op = ir_module_new_op(m, kind);
    if (!op) {
        MOEC_ERR(MOEC_ERR_OOM, "%%%s: %s: out of memory", first, opname);
        return NULL;
    }
    op->n_in = n_in;
    for (int i = 0; i < n_in; i++)
        op->in[i] = in[i];
    for (int i = 0; i < n_out; i++) {
        ir_value *v = new_value_or_oom(m, out_names[i], IR_VALUE_OP);
        if (!v)
            return NULL;
        v->def = op;
        op->out[i] = v;
        op->n_out = i + 1;
    }
    return op;
}

/* The attribute slot for key on op, cleared, after checking the key is one
 * of op's with this kind; replaces an earlier value of the same key. */
static moec_status attr_slot(ir_module *m, ir_op *op, const char *key, ir_attr_kind kind,
                             ir_attr **out)
{
    if (!m || !op)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "set attribute '%s': null module or op",
                        key ? key : "?");
    char label[256];
    ir_op_label(op, label, sizeof label);
    ir_attr_kind want;
    const char *k = ir_op_attr_key(op->kind, key);
    if (!k || !ir_op_attr_spec(op->kind, key, &want, NULL))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: unknown attribute '%s'", label,
                        key ? key : "(null)");
    if (want != kind) {
        static const char *const names[] = {"an int", "a float", "a string", "an int list"};
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: attribute '%s' must be %s", label, key,
                        names[want]);
    }
    ir_attr *a = (ir_attr *)ir_op_attr(op, k);
    if (!a) {
        if (op->n_attr < 0 || op->n_attr >= IR_MAX_ATTRS)
            return MOEC_ERR(MOEC_ERR_CAPACITY, "%s: too many attributes", label);
        a = &op->attrs[op->n_attr++];
    }
    memset(a, 0, sizeof *a);
    a->key = k;
    a->kind = kind;
    *out = a;
    return MOEC_OK;
}

moec_status ir_op_set_int(ir_module *m, ir_op *op, const char *key, int64_t v)
{
    ir_attr *a;
    MOEC_TRY(attr_slot(m, op, key, IR_ATTR_INT, &a));
    a->i = v;
    return MOEC_OK;
}

moec_status ir_op_set_float(ir_module *m, ir_op *op, const char *key, double v)
{
    ir_attr *a;
    MOEC_TRY(attr_slot(m, op, key, IR_ATTR_FLOAT, &a));
    a->f = v;
    return MOEC_OK;
}

moec_status ir_op_set_str(ir_module *m, ir_op *op, const char *key, const char *v)
{
    if (!ir_string_valid(v))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "set attribute '%s': string is null or has control characters",
                        key ? key : "?");
    char *s = m ? ir_arena_strdup(m->arena, v) : NULL;
    if (m && !s)
        return MOEC_ERR(MOEC_ERR_OOM, "set attribute '%s': out of memory", key ? key : "?");
    ir_attr *a;
    MOEC_TRY(attr_slot(m, op, key, IR_ATTR_STR, &a));
    a->s = s;
    return MOEC_OK;
}

moec_status ir_op_set_ints(ir_module *m, ir_op *op, const char *key, const int64_t *v, int n)
{
    if (n < 0 || (n > 0 && !v))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "set attribute '%s': bad int list",
                        key ? key : "?");
    int64_t *copy = NULL;
    if (n > 0) {
        copy = m ? ir_arena_alloc(m->arena, sizeof *copy * (size_t)n) : NULL;
        if (m && !copy)
            return MOEC_ERR(MOEC_ERR_OOM, "set attribute '%s': out of memory", key ? key : "?");
        if (copy)
            memcpy(copy, v, sizeof *copy * (size_t)n);
    }
    ir_attr *a;
    MOEC_TRY(attr_slot(m, op, key, IR_ATTR_INTS, &a));
    a->n = n;
    a->ints = copy;
    return MOEC_OK;
}

moec_status ir_op_finish(ir_module *m, ir_op *op, const ir_type *hint)
{
    if (!m || !op)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "finish: null module or op");
    if (op->kind == IR_OP_RESHAPE || op->kind == IR_OP_EXPAND) {
        char label[256];
        ir_op_label(op, label, sizeof label);
        if (!hint)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: the result type must be given", label);
        if (op->n_out >= 1 && op->out[0])
            op->out[0]->type = *hint;
    }
    ir_type out[IR_MAX_RESULTS];
    char msg[IR_MSG_CAP];
    moec_status st = ir_op_infer_msg(op, out, msg, sizeof msg);
    if (st != MOEC_OK)
        return MOEC_ERR(st, "%s", msg);
    for (int i = 0; i < op->n_out; i++)
        op->out[i]->type = out[i];
    return MOEC_OK;
}

ir_value *ir_build(ir_module *m, ir_op_kind kind, const char *name, ir_value *const *in, int n_in)
{
    const char *names[1] = {name};
    ir_op *op = ir_module_add_op(m, kind, in, n_in, names, 1);
    if (!op || ir_op_finish(m, op, NULL) != MOEC_OK)
        return NULL;
    return op->out[0];
}
