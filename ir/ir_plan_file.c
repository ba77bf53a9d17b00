/* ir_plan_file.c — writing and reading plan files (see ir_plan_file.h). The header
 * is JSON (cJSON) with compact arrays for steps; the blobs are raw. Reading
 * checks the magic, the format version, the checksum and every offset
 * before it trusts anything. */
#include "ir/ir_plan_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "file.h"
#include "json.h"
#include "hash.h"

static const char MAGIC[8] = {'M', 'O', 'E', 'C', 'P', 'L', 'A', 'N'};
#define MOEC_VERSION "0.1"


/* ---- writing --------------------------------------------------------------- */

static cJSON *num_array(const double *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static cJSON *arg_json(const ir_arg *a)
{
    double v[4] = {a->kind, a->index, (double)a->i, a->f};
    return num_array(v, 4);
}

static cJSON *gemm_json(const ir_gemm *g)
{
    double v[20] = {g->trans_a, g->trans_b, g->m, g->n, g->k, g->batch,
                    (double)g->lda, (double)g->ldb, (double)g->ldc,
                    (double)g->stride_a, (double)g->stride_b, (double)g->stride_c,
                    g->type_a, g->type_b, g->type_c, g->alpha, g->has_bias, g->type_bias, 0, 0};
    cJSON *a = num_array(v, 18);
    cJSON_AddItemToArray(a, arg_json(&g->a));
    cJSON_AddItemToArray(a, arg_json(&g->b));
    cJSON_AddItemToArray(a, arg_json(&g->c));
    cJSON_AddItemToArray(a, arg_json(&g->bias));
    return a;
}

static cJSON *coll_json(const ir_coll *c)
{
    double v[4] = {c->op, c->dtype, (double)c->count, c->ranks};
    cJSON *a = num_array(v, 4);
    cJSON_AddItemToArray(a, arg_json(&c->send));
    cJSON_AddItemToArray(a, arg_json(&c->recv));
    return a;
}

static cJSON *step_json(const ir_step *s)
{
    double v[13] = {s->kind,     s->stream,   s->op_id,    s->kernel, s->grid[0],
                    s->grid[1],  s->grid[2],  s->block[0], s->block[1], s->block[2],
                    s->smem,     s->plain,    s->prio};
    cJSON *a = num_array(v, 13);
    cJSON *args = cJSON_CreateArray();
    for (int i = 0; i < s->n_args; i++)
        cJSON_AddItemToArray(args, arg_json(&s->args[i]));
    cJSON_AddItemToArray(a, args);
    cJSON_AddItemToArray(a, s->kind == IR_STEP_GEMM         ? gemm_json(&s->gemm)
                            : s->kind == IR_STEP_COLLECTIVE ? coll_json(&s->coll)
                                                            : cJSON_CreateNull());
    return a;
}

static size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

static cJSON *blob_json(size_t offset, size_t size)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "offset", (double)offset);
    cJSON_AddNumberToObject(o, "size", (double)size);
    return o;
}

typedef struct out_file {
    FILE *f;
    uint64_t hash;
    size_t pos;
    int failed;
} out_file;

static void out_write(out_file *o, const void *data, size_t n)
{
    if (o->failed || !n)
        return;
    if (fwrite(data, 1, n, o->f) != n) {
        o->failed = 1;
        return;
    }
    o->hash = moec_fnv1a(o->hash, data, n);
    o->pos += n;
}

static void out_pad(out_file *o, size_t to)
{
    static const char zeros[16];
    while (o->pos < to)
        out_write(o, zeros, to - o->pos < 16 ? to - o->pos : 16);
}

int ir_plan_meta_ranks(const ir_plan_meta *meta) { return meta && meta->tp > 0 ? meta->tp : 1; }

/* The blobs of a plan file in the order they are written, identical ones
 * (the cubins ranks share) once. */
typedef struct blob_list {
    const void **data;
    size_t *size, *offset;
    int n, cap;
    size_t end;
} blob_list;

/* Adds a blob (or finds the same bytes already added); returns its offset,
 * or (size_t)-1 when out of memory. */
static size_t blob_add(blob_list *l, const void *data, size_t size)
{
    for (int i = 0; i < l->n; i++)
        if (l->size[i] == size && (!size || !memcmp(l->data[i], data, size)))
            return l->offset[i];
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        const void **d = realloc(l->data, sizeof *d * (size_t)cap);
        if (d)
            l->data = d;
        size_t *sz = realloc(l->size, sizeof *sz * (size_t)cap);
        if (sz)
            l->size = sz;
        size_t *of = realloc(l->offset, sizeof *of * (size_t)cap);
        if (of)
            l->offset = of;
        if (!d || !sz || !of)
            return (size_t)-1;
        l->cap = cap;
    }
    l->data[l->n] = data;
    l->size[l->n] = size;
    l->offset[l->n] = l->end;
    l->end = align16(l->end + size);
    return l->offset[l->n++];
}

/* One rank's part of the header: its IR and its buckets. */
static cJSON *rank_json(const ir_plan *p, const char *ir, blob_list *blobs)
{
    cJSON *r = cJSON_CreateObject();
    size_t off = blob_add(blobs, ir, strlen(ir));
    if (!r || off == (size_t)-1) {
        cJSON_Delete(r);
        return NULL;
    }
    cJSON_AddItemToObject(r, "ir", blob_json(off, strlen(ir)));
    cJSON *buckets = cJSON_AddArrayToObject(r, "buckets");
    for (int b = 0; b < p->n_buckets; b++) {
        const ir_bucket *bk = &p->buckets[b];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "T", bk->T);
        cJSON_AddNumberToObject(o, "arena_bytes", (double)bk->arena_bytes);
        cJSON_AddNumberToObject(o, "scratch_bytes", (double)bk->scratch_bytes);
        off = blob_add(blobs, bk->cubin, bk->cubin_size);
        if (off == (size_t)-1) {
            cJSON_Delete(o);
            cJSON_Delete(r);
            return NULL;
        }
        cJSON_AddItemToObject(o, "cubin", blob_json(off, bk->cubin_size));
        cJSON *names = cJSON_AddArrayToObject(o, "kernels");
        for (int k = 0; k < bk->n_kernels; k++)
            cJSON_AddItemToArray(names, cJSON_CreateString(bk->kernel_names[k]));
        cJSON *steps = cJSON_AddArrayToObject(o, "steps");
        for (int s = 0; s < bk->n_steps; s++)
            cJSON_AddItemToArray(steps, step_json(&bk->steps[s]));
        cJSON_AddItemToArray(buckets, o);
    }
    return r;
}

/* The header of plans[0 .. n-1]: what they share, then each rank's. */
static char *header_text(const ir_plan *const *plans, int n, char **irs, const ir_plan_meta *meta,
                         blob_list *blobs)
{
    const ir_plan *p = plans[0];
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "format", IR_PLAN_FORMAT);
    cJSON_AddStringToObject(h, "moec", MOEC_VERSION);
    cJSON_AddStringToObject(h, "arch", p->arch);
    cJSON_AddStringToObject(h, "compute_dtype", ir_dtype_name(p->compute_dtype));
    cJSON_AddNumberToObject(h, "kv_block_size", p->kv_block_size);
    cJSON_AddNumberToObject(h, "pdl", p->pdl);
    cJSON_AddNumberToObject(h, "fp8_tiles", p->fp8_tiles);
    cJSON_AddNumberToObject(h, "sampler", p->sampler);
    cJSON_AddStringToObject(h, "config_hash", meta->config_hash);
    cJSON_AddStringToObject(h, "weights_hash", meta->weights_hash);
    cJSON_AddNumberToObject(h, "tp", meta->tp);
    cJSON_AddNumberToObject(h, "ep", meta->ep);
    cJSON *ranks = cJSON_AddArrayToObject(h, "ranks");
    int ok = h && ranks;
    for (int r = 0; ok && r < n; r++) {
        cJSON *o = rank_json(plans[r], irs[r], blobs);
        ok = o != NULL;
        cJSON_AddItemToArray(ranks, o);
    }
    char *text = ok ? cJSON_PrintUnformatted(h) : NULL;
    cJSON_Delete(h);
    return text;
}

/* The ranks' plans agree on what the header holds once. */
static moec_status check_ranks_agree(const ir_plan *const *plans, int n)
{
    for (int r = 1; r < n; r++) {
        const ir_plan *a = plans[0], *b = plans[r];
        if (!b || !b->module || strcmp(a->arch, b->arch) || a->compute_dtype != b->compute_dtype ||
            a->kv_block_size != b->kv_block_size || a->pdl != b->pdl ||
            a->sampler != b->sampler)
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "ir_plan_write_ranks: rank %d's plan differs from rank 0's in arch, "
                            "dtype, kv block size, pdl or sampler",
                            r);
    }
    return MOEC_OK;
}

moec_status ir_plan_write(const char *path, const ir_plan *p, const ir_plan_meta *meta)
{
    if (meta && ir_plan_meta_ranks(meta) != 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "ir_plan_write: one plan for tp %d", meta->tp);
    const ir_plan *one[1] = {p};
    return ir_plan_write_ranks(path, one, meta);
}

moec_status ir_plan_write_ranks(const char *path, const ir_plan *const *plans,
                                const ir_plan_meta *meta)
{
    if (!path || !plans || !meta)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "ir_plan_write: NULL argument");
    int n = ir_plan_meta_ranks(meta);
    if (n > IR_MAX_RANKS)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "ir_plan_write: tp %d", meta->tp);
    for (int r = 0; r < n; r++)
        if (!plans[r] || !plans[r]->module)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "ir_plan_write: NULL plan of rank %d", r);
    MOEC_TRY(check_ranks_agree(plans, n));
    char *irs[IR_MAX_RANKS] = {0};
    blob_list blobs = {0};
    moec_status st = MOEC_OK;
    for (int r = 0; r < n && st == MOEC_OK; r++)
        if (!(irs[r] = ir_module_print_str(plans[r]->module)))
            st = MOEC_ERR(MOEC_ERR_OOM, "out of memory printing the plan's IR");
    /* Blob offsets are relative to the start of the blob section, since the
     * header's length is only known once it is printed. */
    char *htext = st == MOEC_OK ? header_text(plans, n, irs, meta, &blobs) : NULL;
    if (st == MOEC_OK && !htext)
        st = MOEC_ERR(MOEC_ERR_OOM, "out of memory writing the plan header");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    out_file o = {NULL, MOEC_FNV_SEED, 0, 0};
    if (st == MOEC_OK && !(o.f = fopen(tmp, "wb")))
        st = MOEC_ERR(MOEC_ERR_IO, "cannot write %s (through the temporary %s): %s", path, tmp,
                      strerror(errno));
    if (st == MOEC_OK) {
        uint32_t fmt = IR_PLAN_FORMAT, zero = 0;
        uint64_t hlen = strlen(htext);
        out_write(&o, MAGIC, 8);
        out_write(&o, &fmt, 4);
        out_write(&o, &zero, 4);
        out_write(&o, &hlen, 8);
        out_write(&o, htext, hlen);
        size_t base = align16(o.pos);
        for (int i = 0; i < blobs.n; i++) {
            out_pad(&o, base + blobs.offset[i]);
            out_write(&o, blobs.data[i], blobs.size[i]);
        }
        uint64_t sum = o.hash;
        out_write(&o, &sum, 8);
        int closed = fclose(o.f) == 0;
        if (o.failed || !closed || rename(tmp, path) != 0) {
            int e = errno;
            remove(tmp);
            st = MOEC_ERR(MOEC_ERR_IO, "cannot write %s: %s", path, strerror(e));
        }
    }
    for (int r = 0; r < n; r++)
        free(irs[r]);
    free(blobs.data);
    free(blobs.size);
    free(blobs.offset);
    free(htext);
    return st;
}

/* ---- reading --------------------------------------------------------------- */

typedef struct reader {
    const char *path;
    const uint8_t *data;
    size_t size;       /* without the checksum */
    size_t base;       /* start of the blob section */
    moec_status st;
} reader;

static moec_status bad(reader *r, const char *what)
{
    if (r->st == MOEC_OK)
        r->st = MOEC_ERR(MOEC_ERR_FORMAT, "plan %s is corrupt: %s", r->path, what);
    return r->st;
}

static double jnum(reader *r, const cJSON *a, int i)
{
    const cJSON *it = cJSON_GetArrayItem(a, i);
    if (!cJSON_IsNumber(it)) {
        bad(r, "a step field is not a number");
        return 0;
    }
    return it->valuedouble;
}

/* Integer fields are checked as the doubles the header holds, before any
 * conversion, so that the error shows the file's value. */
#define PLAN_INT_LO ((double)INT_MIN)
#define PLAN_INT_HI ((double)INT_MAX)
#define PLAN_UINT_HI ((double)UINT_MAX)
#define PLAN_I64 MOEC_JSON_INT_MAX /* within +-2^53: exact in a double */

/* The integer `it` (named by what) in [lo, hi], or 0 with the error kept. */
static int64_t jint_item(reader *r, const cJSON *it, const char *what, double lo, double hi)
{
    int64_t v = 0;
    if (moec_json_int(it, lo, hi, &v) == MOEC_JSON_INT_OK)
        return v;
    char repr[64], msg[256];
    moec_json_repr(it, repr, sizeof repr);
    if (!cJSON_IsNumber(it))
        snprintf(msg, sizeof msg, "%s is missing or not a number", what);
    else
        snprintf(msg, sizeof msg, "%s is %s, not an integer in [%.0f, %.0f]", what, repr, lo, hi);
    bad(r, msg);
    return 0;
}

/* Item i of a step's (or argument's) array, an integer in [lo, hi]. */
static int64_t jint(reader *r, const cJSON *a, int i, double lo, double hi)
{
    return jint_item(r, cJSON_GetArrayItem(a, i), "a step field", lo, hi);
}

/* Header (or bucket) field key, an integer in [lo, hi]. */
static int64_t jfield(reader *r, const cJSON *o, const char *key, double lo, double hi)
{
    char what[128];
    snprintf(what, sizeof what, "header field '%s'", key);
    return jint_item(r, cJSON_GetObjectItemCaseSensitive(o, key), what, lo, hi);
}

/* Validates a blob reference; returns its start or NULL. */
static const uint8_t *blob(reader *r, const cJSON *o, size_t *size)
{
    size_t off = (size_t)jfield(r, o, "offset", 0, PLAN_I64);
    size_t n = (size_t)jfield(r, o, "size", 0, PLAN_I64);
    if (r->st != MOEC_OK)
        return NULL;
    if (r->base + off + n > r->size) {
        bad(r, "a blob lies outside the file");
        return NULL;
    }
    *size = n;
    return r->data + r->base + off;
}

static ir_arg read_arg(reader *r, const cJSON *a)
{
    ir_arg x = {0};
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 4) {
        bad(r, "a step argument is malformed");
        return x;
    }
    x.kind = (ir_arg_kind)jint(r, a, 0, PLAN_INT_LO, PLAN_INT_HI);
    x.index = (int)jint(r, a, 1, PLAN_INT_LO, PLAN_INT_HI);
    x.i = jint(r, a, 2, -PLAN_I64, PLAN_I64);
    x.f = jnum(r, a, 3);
    if (x.kind < IR_ARG_ACT || x.kind > IR_ARG_F32)
        bad(r, "a step argument has an unknown kind");
    return x;
}

static void read_coll(reader *r, const cJSON *g, ir_coll *c)
{
    if (!cJSON_IsArray(g) || cJSON_GetArraySize(g) != 6) {
        bad(r, "a collective step is malformed");
        return;
    }
    int64_t op = jint(r, g, 0, 0, IR_OP_COUNT - 1), dt = jint(r, g, 1, 0, IR_DTYPE_COUNT - 1);
    c->count = jint(r, g, 2, 0, PLAN_I64);
    c->ranks = (int)jint(r, g, 3, 1, IR_MAX_RANKS);
    c->send = read_arg(r, cJSON_GetArrayItem(g, 4));
    c->recv = read_arg(r, cJSON_GetArrayItem(g, 5));
    if (r->st != MOEC_OK)
        return;
    c->op = (ir_op_kind)op;
    c->dtype = (ir_dtype)dt;
    if (c->op != IR_OP_ALL_REDUCE && c->op != IR_OP_ALL_GATHER &&
        c->op != IR_OP_REDUCE_SCATTER && c->op != IR_OP_ALL_TO_ALL)
        bad(r, "a collective step is none of all_reduce, all_gather, reduce_scatter, all_to_all");
}

static void read_step(reader *r, const cJSON *a, ir_step *s, const ir_module *m, int n_kernels)
{
    /* 15 items; 14 in plans of format 4, which had no `prio`, 13 in those of
       format 3, which had no `plain` either */
    const int n_items = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    const int x1 = n_items >= 14, x2 = n_items == 15;
    if (n_items < 13 || n_items > 15) {
        bad(r, "a step is malformed");
        return;
    }
    s->kind = (ir_step_kind)jint(r, a, 0, PLAN_INT_LO, PLAN_INT_HI);
    s->stream = (int)jint(r, a, 1, PLAN_INT_LO, PLAN_INT_HI);
    s->op_id = (int)jint(r, a, 2, PLAN_INT_LO, PLAN_INT_HI);
    s->kernel = (int)jint(r, a, 3, PLAN_INT_LO, PLAN_INT_HI);
    for (int i = 0; i < 3; i++) {
        s->grid[i] = (unsigned)jint(r, a, 4 + i, 0, PLAN_UINT_HI);
        s->block[i] = (unsigned)jint(r, a, 7 + i, 0, PLAN_UINT_HI);
    }
    s->smem = (unsigned)jint(r, a, 10, 0, PLAN_UINT_HI);
    s->plain = x1 ? (int)jint(r, a, 11, 0, 1) : 0;
    s->prio = x2 ? (int)jint(r, a, 12, 0, 1) : 0;
    if (s->kind < IR_STEP_KERNEL || s->kind > IR_STEP_COLLECTIVE || s->stream < 0 || s->stream > 1 ||
        s->op_id < -1 || s->op_id >= m->n_ops ||
        (s->kind == IR_STEP_KERNEL && (s->kernel < 0 || s->kernel >= n_kernels))) {
        bad(r, "a step refers to something that does not exist");
        return;
    }
    const cJSON *args = cJSON_GetArrayItem(a, 11 + x1 + x2);
    int n = cJSON_GetArraySize(args);
    if (!cJSON_IsArray(args) || n > IR_MAX_ARGS) {
        bad(r, "a step has too many arguments");
        return;
    }
    s->n_args = n;
    for (int i = 0; i < n; i++)
        s->args[i] = read_arg(r, cJSON_GetArrayItem(args, i));
    const cJSON *g = cJSON_GetArrayItem(a, 12 + x1 + x2);
    if (s->kind == IR_STEP_COLLECTIVE) {
        read_coll(r, g, &s->coll);
        return;
    }
    if (s->kind != IR_STEP_GEMM)
        return;
    if (!cJSON_IsArray(g) || cJSON_GetArraySize(g) != 22) {
        bad(r, "a GEMM step is malformed");
        return;
    }
    ir_gemm *x = &s->gemm;
    x->trans_a = (int)jint(r, g, 0, PLAN_INT_LO, PLAN_INT_HI);
    x->trans_b = (int)jint(r, g, 1, PLAN_INT_LO, PLAN_INT_HI);
    x->m = (int)jint(r, g, 2, PLAN_INT_LO, PLAN_INT_HI);
    x->n = (int)jint(r, g, 3, PLAN_INT_LO, PLAN_INT_HI);
    x->k = (int)jint(r, g, 4, PLAN_INT_LO, PLAN_INT_HI);
    x->batch = (int)jint(r, g, 5, PLAN_INT_LO, PLAN_INT_HI);
    x->lda = jint(r, g, 6, -PLAN_I64, PLAN_I64);
    x->ldb = jint(r, g, 7, -PLAN_I64, PLAN_I64);
    x->ldc = jint(r, g, 8, -PLAN_I64, PLAN_I64);
    x->stride_a = jint(r, g, 9, -PLAN_I64, PLAN_I64);
    x->stride_b = jint(r, g, 10, -PLAN_I64, PLAN_I64);
    x->stride_c = jint(r, g, 11, -PLAN_I64, PLAN_I64);
    double dmax = IR_DTYPE_COUNT - 1;
    int64_t ta = jint(r, g, 12, 0, dmax), tb = jint(r, g, 13, 0, dmax);
    int64_t tc = jint(r, g, 14, 0, dmax), tbias = jint(r, g, 17, 0, dmax);
    if (r->st != MOEC_OK)
        return;
    x->type_a = (ir_dtype)ta;
    x->type_b = (ir_dtype)tb;
    x->type_c = (ir_dtype)tc;
    x->type_bias = (ir_dtype)tbias;
    x->alpha = (float)jnum(r, g, 15);
    x->has_bias = (int)jint(r, g, 16, PLAN_INT_LO, PLAN_INT_HI);
    x->a = read_arg(r, cJSON_GetArrayItem(g, 18));
    x->b = read_arg(r, cJSON_GetArrayItem(g, 19));
    x->c = read_arg(r, cJSON_GetArrayItem(g, 20));
    x->bias = read_arg(r, cJSON_GetArrayItem(g, 21));
}

static moec_status read_buckets(reader *r, const cJSON *h, ir_plan *p, const ir_module *m)
{
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(h, "buckets");
    if (!cJSON_IsArray(bs))
        return bad(r, "no bucket list");
    int nb = cJSON_GetArraySize(bs);
    p->buckets = calloc((size_t)(nb ? nb : 1), sizeof *p->buckets);
    if (!p->buckets)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory reading plan %s", r->path);
    p->n_buckets = nb;
    for (int b = 0; b < nb && r->st == MOEC_OK; b++) {
        const cJSON *o = cJSON_GetArrayItem(bs, b);
        ir_bucket *bk = &p->buckets[b];
        bk->T = (int)jfield(r, o, "T", 1, PLAN_INT_HI);
        bk->arena_bytes = (size_t)jfield(r, o, "arena_bytes", 0, PLAN_I64);
        bk->scratch_bytes = (size_t)jfield(r, o, "scratch_bytes", 0, PLAN_I64);
        size_t n = 0;
        const uint8_t *cubin = blob(r, cJSON_GetObjectItemCaseSensitive(o, "cubin"), &n);
        if (!cubin)
            break;
        if (bk->T < 1 || (b && bk->T <= p->buckets[b - 1].T))
            return bad(r, "bucket sizes are not ascending");
        bk->cubin = malloc(n ? n : 1);
        if (!bk->cubin)
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory reading plan %s", r->path);
        memcpy(bk->cubin, cubin, n);
        bk->cubin_size = n;
        const cJSON *names = cJSON_GetObjectItemCaseSensitive(o, "kernels");
        const cJSON *steps = cJSON_GetObjectItemCaseSensitive(o, "steps");
        if (!cJSON_IsArray(names) || !cJSON_IsArray(steps))
            return bad(r, "a bucket lacks its kernels or steps");
        int nk = cJSON_GetArraySize(names), ns = cJSON_GetArraySize(steps);
        bk->kernel_names = calloc((size_t)(nk ? nk : 1), sizeof *bk->kernel_names);
        bk->steps = calloc((size_t)(ns ? ns : 1), sizeof *bk->steps);
        if (!bk->kernel_names || !bk->steps)
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory reading plan %s", r->path);
        for (int k = 0; k < nk; k++) {
            const cJSON *s = cJSON_GetArrayItem(names, k);
            if (!cJSON_IsString(s))
                return bad(r, "a kernel name is not a string");
            bk->kernel_names[k] = strdup(s->valuestring);
            if (!bk->kernel_names[k])
                return MOEC_ERR(MOEC_ERR_OOM, "out of memory reading plan %s", r->path);
            bk->n_kernels = k + 1;
        }
        for (int s = 0; s < ns && r->st == MOEC_OK; s++) {
            read_step(r, cJSON_GetArrayItem(steps, s), &bk->steps[s], m, nk);
            bk->n_steps = s + 1;
        }
    }
    return r->st;
}

/* One rank's plan from its part of the header, o: its IR parsed into *m
 * and checked to be rank `rank` of meta's split, then its buckets; the
 * shared fields come from the top of the header, h. */
static moec_status read_rank(reader *r, const cJSON *h, const cJSON *o, const ir_plan_meta *meta,
                             int rank, ir_plan **out, ir_module **m)
{
    ir_plan *p = calloc(1, sizeof *p);
    *out = p;
    if (!p)
        return r->st = MOEC_ERR(MOEC_ERR_OOM, "out of memory reading plan %s", r->path);
    snprintf(p->arch, sizeof p->arch, "%s", cJSON_GetObjectItem(h, "arch")->valuestring);
    if (ir_dtype_from_name(cJSON_GetObjectItem(h, "compute_dtype")->valuestring, &p->compute_dtype))
        return bad(r, "unknown compute dtype");
    p->kv_block_size = (int)jfield(r, h, "kv_block_size", 1, PLAN_INT_HI);
    const cJSON *pdl = cJSON_GetObjectItemCaseSensitive(h, "pdl"); /* absent: kernels without waits */
    p->pdl = cJSON_IsNumber(pdl) && pdl->valuedouble == 1;
    /* absent (older plans): no tiles */
    if (cJSON_GetObjectItemCaseSensitive(h, "fp8_tiles"))
        p->fp8_tiles = (int)jfield(r, h, "fp8_tiles", IR_FP8_TILES_NONE, IR_FP8_TILES_MAX);
    /* absent (format 2 and older): no device sampler, the host samples */
    const cJSON *sampler = cJSON_GetObjectItemCaseSensitive(h, "sampler");
    p->sampler = cJSON_IsNumber(sampler) && sampler->valuedouble == 1;
    size_t ir_size = 0;
    const uint8_t *ir = blob(r, cJSON_GetObjectItemCaseSensitive(o, "ir"), &ir_size);
    if (!ir)
        return r->st;
    char *text = malloc(ir_size + 1);
    if (!text)
        return r->st = MOEC_ERR(MOEC_ERR_OOM, "out of memory reading plan %s", r->path);
    memcpy(text, ir, ir_size);
    text[ir_size] = '\0';
    r->st = ir_module_parse(text, r->path, m);
    free(text);
    if (r->st != MOEC_OK)
        return r->st;
    if (ir_module_meta_int(*m, "tp", 0) != meta->tp ||
        (meta->tp && (ir_module_meta_int(*m, "ep", 0) != meta->ep ||
                      ir_module_meta_int(*m, "rank", -1) != rank))) {
        char msg[160];
        snprintf(msg, sizeof msg, "the IR of rank %d is not rank %d of tp %d ep %d", rank, rank,
                 meta->tp, meta->ep);
        return bad(r, msg);
    }
    p->module = *m;
    return read_buckets(r, o, p, *m);
}

/* The header's strings, its tp and ep (format 1: none), and where each
 * rank's part is: the ranks array, or the header itself in format 1. */
static moec_status read_top(reader *r, const cJSON *h, ir_plan_meta *meta, const cJSON **ranks)
{
    const char *strs[] = {"arch", "compute_dtype", "config_hash", "weights_hash", "moec"};
    for (int i = 0; i < 5; i++) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(h, strs[i]);
        if (!cJSON_IsString(s) || strlen(s->valuestring) > 16)
            return bad(r, "a header string is missing");
    }
    snprintf(meta->config_hash, sizeof meta->config_hash, "%s",
             cJSON_GetObjectItem(h, "config_hash")->valuestring);
    snprintf(meta->weights_hash, sizeof meta->weights_hash, "%s",
             cJSON_GetObjectItem(h, "weights_hash")->valuestring);
    snprintf(meta->moec_version, sizeof meta->moec_version, "%s",
             cJSON_GetObjectItem(h, "moec")->valuestring);
    *ranks = NULL;
    if (meta->format < 2)
        return MOEC_OK;
    meta->tp = (int)jfield(r, h, "tp", 0, IR_MAX_RANKS);
    meta->ep = (int)jfield(r, h, "ep", 0, IR_MAX_RANKS);
    *ranks = cJSON_GetObjectItemCaseSensitive(h, "ranks");
    if (r->st == MOEC_OK && (!cJSON_IsArray(*ranks) ||
                             cJSON_GetArraySize(*ranks) != ir_plan_meta_ranks(meta)))
        return bad(r, "the ranks' plans do not match tp");
    if (r->st == MOEC_OK && meta->tp && (meta->ep < 1 || meta->tp % meta->ep))
        return bad(r, "ep does not divide tp");
    return r->st;
}

moec_status ir_plan_read_ranks(const char *path, ir_plan **out, ir_module **modules,
                               ir_plan_meta *meta)
{
    if (!path || !out || !modules || !meta)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "ir_plan_read: NULL argument");
    for (int i = 0; i < IR_MAX_RANKS; i++) {
        out[i] = NULL;
        modules[i] = NULL;
    }
    memset(meta, 0, sizeof *meta);
    char *raw = NULL;
    size_t size = 0;
    MOEC_TRY(moec_file_read(path, SIZE_MAX, &raw, &size));
    uint8_t *data = (uint8_t *)raw;
    reader r = {path, data, 0, 0, MOEC_OK};
    uint32_t fmt = 0;
    uint64_t hlen = 0, sum = 0;
    if (size < 8 || memcmp(data, MAGIC, 8) != 0) {
        free(data);
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s is not a moec plan (no MOECPLAN magic)", path);
    }
    if (size < 24 + 8) {
        free(data);
        return MOEC_ERR(MOEC_ERR_FORMAT, "plan %s is truncated (%zu bytes)", path, size);
    }
    memcpy(&fmt, data + 8, 4);
    if (fmt > IR_PLAN_FORMAT) {
        free(data);
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "plan %s has format version %u; this moec reads version %d: recompile it "
                        "with this moec (moec compile)", path, fmt, IR_PLAN_FORMAT);
    }
    memcpy(&hlen, data + 16, 8);
    if (hlen > size - 24 - 8) {
        free(data);
        return MOEC_ERR(MOEC_ERR_FORMAT, "plan %s is truncated (header of %llu bytes, file of %zu)",
                        path, (unsigned long long)hlen, size);
    }
    memcpy(&sum, data + size - 8, 8);
    if (moec_fnv1a(MOEC_FNV_SEED, data, size - 8) != sum) {
        free(data);
        return MOEC_ERR(MOEC_ERR_FORMAT, "plan %s is corrupt or truncated (checksum mismatch)", path);
    }
    r.size = size - 8;
    r.base = align16(24 + (size_t)hlen);
    cJSON *h = cJSON_ParseWithLength((const char *)data + 24, (size_t)hlen);
    const cJSON *ranks = NULL;
    meta->format = (int)fmt;
    if (!h)
        bad(&r, "the header is not JSON");
    else if ((r.st = moec_json_check_unique(h, path)) == MOEC_OK)
        read_top(&r, h, meta, &ranks);
    for (int i = 0; r.st == MOEC_OK && i < ir_plan_meta_ranks(meta); i++)
        read_rank(&r, h, ranks ? cJSON_GetArrayItem(ranks, i) : h, meta, i, &out[i],
                  &modules[i]);
    cJSON_Delete(h);
    free(data);
    if (r.st != MOEC_OK) {
        for (int i = 0; i < IR_MAX_RANKS; i++) {
            ir_plan_free(out[i]);
            ir_module_free(modules[i]);
            out[i] = NULL;
            modules[i] = NULL;
        }
        return r.st;
    }
    return MOEC_OK;
}

moec_status ir_plan_read(const char *path, ir_plan **out, ir_module **module_out,
                         ir_plan_meta *meta)
{
    if (!path || !out || !module_out || !meta)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "ir_plan_read: NULL argument");
    ir_plan *plans[IR_MAX_RANKS];
    ir_module *mods[IR_MAX_RANKS];
    *out = NULL;
    *module_out = NULL;
    MOEC_TRY(ir_plan_read_ranks(path, plans, mods, meta));
    int n = ir_plan_meta_ranks(meta);
    if (n != 1) {
        for (int i = 0; i < n; i++) {
            ir_plan_free(plans[i]);
            ir_module_free(mods[i]);
        }
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "plan %s is split over %d ranks (tp %d, ep %d): it runs as a group of "
                        "ranks, one GPU each",
                        path, n, meta->tp, meta->ep);
    }
    *out = plans[0];
    *module_out = mods[0];
    return MOEC_OK;
}
