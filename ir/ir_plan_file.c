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

static cJSON *step_json(const ir_step *s)
{
    double v[11] = {s->kind, s->stream, s->op_id, s->kernel, s->grid[0], s->grid[1], s->grid[2],
                    s->block[0], s->block[1], s->block[2], s->smem};
    cJSON *a = num_array(v, 11);
    cJSON *args = cJSON_CreateArray();
    for (int i = 0; i < s->n_args; i++)
        cJSON_AddItemToArray(args, arg_json(&s->args[i]));
    cJSON_AddItemToArray(a, args);
    cJSON_AddItemToArray(a, s->kind == IR_STEP_GEMM ? gemm_json(&s->gemm) : cJSON_CreateNull());
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

moec_status ir_plan_write(const char *path, const ir_plan *p, const ir_plan_meta *meta)
{
    if (!path || !p || !p->module || !meta)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "ir_plan_write: NULL argument");
    char *ir = ir_module_print_str(p->module);
    if (!ir)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory printing the plan's IR");
    size_t ir_size = strlen(ir);

    /* Blob offsets are relative to the end of the header, which is only
     * known once the header is printed: so they are stored relative to the
     * start of the blob section. */
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "format", IR_PLAN_FORMAT);
    cJSON_AddStringToObject(h, "moec", MOEC_VERSION);
    cJSON_AddStringToObject(h, "arch", p->arch);
    cJSON_AddStringToObject(h, "compute_dtype", ir_dtype_name(p->compute_dtype));
    cJSON_AddNumberToObject(h, "kv_block_size", p->kv_block_size);
    cJSON_AddNumberToObject(h, "pdl", p->pdl);
    cJSON_AddStringToObject(h, "config_hash", meta->config_hash);
    cJSON_AddStringToObject(h, "weights_hash", meta->weights_hash);
    size_t off = 0;
    cJSON_AddItemToObject(h, "ir", blob_json(off, ir_size));
    off = align16(off + ir_size);
    cJSON *buckets = cJSON_AddArrayToObject(h, "buckets");
    for (int b = 0; b < p->n_buckets; b++) {
        const ir_bucket *bk = &p->buckets[b];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "T", bk->T);
        cJSON_AddNumberToObject(o, "arena_bytes", (double)bk->arena_bytes);
        cJSON_AddNumberToObject(o, "scratch_bytes", (double)bk->scratch_bytes);
        cJSON_AddItemToObject(o, "cubin", blob_json(off, bk->cubin_size));
        off = align16(off + bk->cubin_size);
        cJSON *names = cJSON_AddArrayToObject(o, "kernels");
        for (int k = 0; k < bk->n_kernels; k++)
            cJSON_AddItemToArray(names, cJSON_CreateString(bk->kernel_names[k]));
        cJSON *steps = cJSON_AddArrayToObject(o, "steps");
        for (int s = 0; s < bk->n_steps; s++)
            cJSON_AddItemToArray(steps, step_json(&bk->steps[s]));
        cJSON_AddItemToArray(buckets, o);
    }
    char *htext = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!htext) {
        free(ir);
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory writing the plan header");
    }

    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    out_file o = {fopen(tmp, "wb"), MOEC_FNV_SEED, 0, 0};
    if (!o.f) {
        free(ir);
        free(htext);
        return MOEC_ERR(MOEC_ERR_IO, "cannot write %s (through the temporary %s): %s", path, tmp,
                        strerror(errno));
    }
    uint32_t fmt = IR_PLAN_FORMAT, zero = 0;
    uint64_t hlen = strlen(htext);
    out_write(&o, MAGIC, 8);
    out_write(&o, &fmt, 4);
    out_write(&o, &zero, 4);
    out_write(&o, &hlen, 8);
    out_write(&o, htext, hlen);
    size_t base = align16(o.pos);
    out_pad(&o, base);
    out_write(&o, ir, ir_size);
    for (int b = 0; b < p->n_buckets; b++) {
        out_pad(&o, align16(o.pos));
        out_write(&o, p->buckets[b].cubin, p->buckets[b].cubin_size);
    }
    uint64_t sum = o.hash;
    out_write(&o, &sum, 8);
    free(ir);
    free(htext);
    int closed = fclose(o.f) == 0;
    if (o.failed || !closed || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return MOEC_ERR(MOEC_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return MOEC_OK;
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

static void read_step(reader *r, const cJSON *a, ir_step *s, const ir_module *m, int n_kernels)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 13) {
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
    if (s->kind < IR_STEP_KERNEL || s->kind > IR_STEP_JOIN || s->stream < 0 || s->stream > 1 ||
        s->op_id < -1 || s->op_id >= m->n_ops ||
        (s->kind == IR_STEP_KERNEL && (s->kernel < 0 || s->kernel >= n_kernels))) {
        bad(r, "a step refers to something that does not exist");
        return;
    }
    const cJSON *args = cJSON_GetArrayItem(a, 11);
    int n = cJSON_GetArraySize(args);
    if (!cJSON_IsArray(args) || n > IR_MAX_ARGS) {
        bad(r, "a step has too many arguments");
        return;
    }
    s->n_args = n;
    for (int i = 0; i < n; i++)
        s->args[i] = read_arg(r, cJSON_GetArrayItem(args, i));
    const cJSON *g = cJSON_GetArrayItem(a, 12);
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

moec_status ir_plan_read(const char *path, ir_plan **out, ir_module **module_out,
                         ir_plan_meta *meta)
{
    if (!path || !out || !module_out || !meta)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "ir_plan_read: NULL argument");
    *out = NULL;
    *module_out = NULL;
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
    ir_plan *p = calloc(1, sizeof *p);
    ir_module *m = NULL;
    if (!h || !p) {
        if (!h)
            bad(&r, "the header is not JSON");
        else
            r.st = MOEC_ERR(MOEC_ERR_OOM, "out of memory reading plan %s", path);
        goto done;
    }
    if ((r.st = moec_json_check_unique(h, path)) != MOEC_OK)
        goto done;
    meta->format = (int)fmt;
    const cJSON *s;
    const char *strs[] = {"arch", "compute_dtype", "config_hash", "weights_hash", "moec"};
    for (int i = 0; i < 5; i++) {
        s = cJSON_GetObjectItemCaseSensitive(h, strs[i]);
        if (!cJSON_IsString(s) || strlen(s->valuestring) > 16) {
            bad(&r, "a header string is missing");
            goto done;
        }
    }
    snprintf(p->arch, sizeof p->arch, "%s", cJSON_GetObjectItem(h, "arch")->valuestring);
    snprintf(meta->config_hash, sizeof meta->config_hash, "%s",
             cJSON_GetObjectItem(h, "config_hash")->valuestring);
    snprintf(meta->weights_hash, sizeof meta->weights_hash, "%s",
             cJSON_GetObjectItem(h, "weights_hash")->valuestring);
    snprintf(meta->moec_version, sizeof meta->moec_version, "%s",
             cJSON_GetObjectItem(h, "moec")->valuestring);
    if (ir_dtype_from_name(cJSON_GetObjectItem(h, "compute_dtype")->valuestring, &p->compute_dtype)) {
        bad(&r, "unknown compute dtype");
        goto done;
    }
    p->kv_block_size = (int)jfield(&r, h, "kv_block_size", 1, PLAN_INT_HI);
    const cJSON *pdl = cJSON_GetObjectItemCaseSensitive(h, "pdl"); /* absent: kernels without waits */
    p->pdl = cJSON_IsNumber(pdl) && pdl->valuedouble == 1;
    size_t ir_size = 0;
    const uint8_t *ir = blob(&r, cJSON_GetObjectItemCaseSensitive(h, "ir"), &ir_size);
    if (!ir)
        goto done;
    char *text = malloc(ir_size + 1);
    if (!text) {
        r.st = MOEC_ERR(MOEC_ERR_OOM, "out of memory reading plan %s", path);
        goto done;
    }
    memcpy(text, ir, ir_size);
    text[ir_size] = '\0';
    r.st = ir_module_parse(text, path, &m);
    free(text);
    if (r.st != MOEC_OK)
        goto done;
    p->module = m;
    read_buckets(&r, h, p, m);
done:
    cJSON_Delete(h);
    free(data);
    if (r.st != MOEC_OK) {
        if (p)
            ir_plan_free(p);
        ir_module_free(m);
        return r.st;
    }
    *out = p;
    *module_out = m;
    return MOEC_OK;
}
