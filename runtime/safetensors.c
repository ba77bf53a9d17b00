/* safetensors.c — the safetensors reader and writer. One validation routine
 * (st_parse) serves mmapped files and in-memory buffers alike, so the fuzz
 * target exercises exactly the code that loads checkpoints. Tensors point
 * into read-only mappings; names are found through an open-addressing hash
 * table because checkpoints hold up to ~100k tensors. */
#include "runtime/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "file.h"
#include "json.h"
#include "strbuf.h"

/* A header this long is corruption, not a checkpoint. */
#define ST_MAX_HEADER ((uint64_t)100000000)
/* An index is a name per tensor: a few MB for the largest checkpoints. */
#define ST_MAX_INDEX ((size_t)1 << 30)

static const struct {
    const char *name;
    size_t size;
} st_dtypes[RT_ST_DTYPE_COUNT] = {
    [RT_ST_F32] = {"F32", 4},         [RT_ST_F16] = {"F16", 2},
    [RT_ST_BF16] = {"BF16", 2},       [RT_ST_F64] = {"F64", 8},
    [RT_ST_I64] = {"I64", 8},         [RT_ST_I32] = {"I32", 4},
    [RT_ST_I16] = {"I16", 2},         [RT_ST_I8] = {"I8", 1},
    [RT_ST_U8] = {"U8", 1},           [RT_ST_BOOL] = {"BOOL", 1},
    [RT_ST_F8_E4M3] = {"F8_E4M3", 1}, [RT_ST_F8_E5M2] = {"F8_E5M2", 1},
    [RT_ST_U16] = {"U16", 2},         [RT_ST_U32] = {"U32", 4},
    [RT_ST_U64] = {"U64", 8},
};

const char *rt_st_dtype_name(rt_st_dtype dt)
{
    return (unsigned)dt < RT_ST_DTYPE_COUNT ? st_dtypes[dt].name : "?";
}

size_t rt_st_dtype_size(rt_st_dtype dt)
{
    return (unsigned)dt < RT_ST_DTYPE_COUNT ? st_dtypes[dt].size : 0;
}

static int st_dtype_from_name(const char *s, rt_st_dtype *out)
{
    for (int i = 0; i < RT_ST_DTYPE_COUNT; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (rt_st_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ---- the opened set ------------------------------------------------------- */

typedef struct st_file {
    char *path;
    void *map;
    size_t map_len;
    char *names; /* every tensor name of this file, NUL-separated */
} st_file;

struct rt_safetensors {
    st_file *files;
    int n_files, files_cap;
    rt_st_tensor *tensors;
    int n_tensors, tensors_cap;
    int32_t *slots; /* index + 1 into tensors; 0 = empty */
    size_t n_slots; /* a power of two */
};

static uint64_t st_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

void rt_safetensors_free(rt_safetensors *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map)
            munmap(st->files[i].map, st->files[i].map_len);
        free(st->files[i].path);
        free(st->files[i].names);
    }
    free(st->files);
    free(st->tensors);
    free(st->slots);
    free(st);
}

const rt_st_tensor *rt_safetensors_find(const rt_safetensors *st, const char *name)
{
    if (!st || !name || !st->slots)
        return NULL;
    size_t mask = st->n_slots - 1;
    for (size_t i = st_hash(name) & mask;; i = (i + 1) & mask) {
        int32_t s = st->slots[i];
        if (s == 0)
            return NULL;
        if (strcmp(st->tensors[s - 1].name, name) == 0)
            return &st->tensors[s - 1];
    }
}

int rt_safetensors_count(const rt_safetensors *st) { return st ? st->n_tensors : 0; }

const rt_st_tensor *rt_safetensors_at(const rt_safetensors *st, int i)
{
    return st && i >= 0 && i < st->n_tensors ? &st->tensors[i] : NULL;
}

/* Builds the name table over every tensor of every file; a name held by two
 * files (or twice by one) is an error. */
static moec_status st_build_index(rt_safetensors *st)
{
    size_t n = 16;
    while (n < (size_t)st->n_tensors * 2)
        n *= 2;
    free(st->slots);
    st->slots = calloc(n, sizeof *st->slots);
    if (!st->slots)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for the index of %d tensors", st->n_tensors);
    st->n_slots = n;
    for (int t = 0; t < st->n_tensors; t++) {
        const rt_st_tensor *x = &st->tensors[t];
        size_t i = st_hash(x->name) & (n - 1);
        for (; st->slots[i]; i = (i + 1) & (n - 1)) {
            const rt_st_tensor *y = &st->tensors[st->slots[i] - 1];
            if (strcmp(y->name, x->name) != 0)
                continue;
            if (y->file == x->file)
                return MOEC_ERR(MOEC_ERR_FORMAT, "%s: duplicate tensor name '%s'", x->file,
                                x->name);
            return MOEC_ERR(MOEC_ERR_FORMAT, "tensor '%s' is in both %s and %s", x->name,
                            y->file, x->file);
        }
        st->slots[i] = t + 1;
    }
    return MOEC_OK;
}

/* ---- header validation ---------------------------------------------------- */

typedef struct st_entry {
    const char *name; /* owned by the cJSON tree */
    int order;        /* position in the header */
    rt_st_dtype dtype;
    int rank;
    int64_t shape[RT_ST_MAX_RANK];
    uint64_t begin, end;
} st_entry;

static int st_cmp_name(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

static int st_cmp_begin(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static int st_cmp_order(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    return (x->order > y->order) - (x->order < y->order);
}

/* A JSON number that is an exact non-negative integer within 2^53. */
static int st_json_uint(const cJSON *j, uint64_t *out)
{
    int64_t v;
    if (moec_json_int(j, 0, MOEC_JSON_INT_MAX, &v) != MOEC_JSON_INT_OK)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static void st_format_shape(const int64_t *shape, int rank, char *buf, size_t cap)
{
    size_t n = 0;
    n += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

/* Reads one tensor entry of the header into e. */
static moec_status st_parse_entry(const cJSON *j, const char *file, uint64_t data_len,
                                  st_entry *e)
{
    const char *name = e->name;
    if (!cJSON_IsObject(j))
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': entry is not an object", file, name);

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    if (!dt)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': missing \"dtype\"", file, name);
    if (!cJSON_IsString(dt) || !dt->valuestring)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is not a string", file, name);
    if (st_dtype_from_name(dt->valuestring, &e->dtype) != 0)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.64s'", file, name,
                        dt->valuestring);

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    if (!shape)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': missing \"shape\"", file, name);
    if (!cJSON_IsArray(shape))
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", file, name);
    int rank = cJSON_GetArraySize(shape);
    if (rank > RT_ST_MAX_RANK)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': rank %d exceeds the maximum of %d",
                        file, name, rank, RT_ST_MAX_RANK);
    e->rank = 0;
    uint64_t bytes = rt_st_dtype_size(e->dtype);
    int overflow = 0, empty = 0;
    for (const cJSON *d = shape->child; d; d = d->next) {
        uint64_t v;
        if (st_json_uint(d, &v) != 0)
            return MOEC_ERR(MOEC_ERR_FORMAT,
                            "%s: tensor '%s': shape[%d] is not a non-negative integer", file,
                            name, e->rank);
        e->shape[e->rank++] = (int64_t)v;
        if (v == 0)
            empty = 1;
        else if (bytes > UINT64_MAX / v)
            overflow = 1;
        else
            bytes *= v;
    }

    if (empty) { /* a zero dim makes any product of the others empty */
        bytes = 0;
        overflow = 0;
    }

    const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!off)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': missing \"data_offsets\"", file, name);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "%s: tensor '%s': \"data_offsets\" is not an array of two integers", file,
                        name);
    if (st_json_uint(off->child, &e->begin) != 0 || st_json_uint(off->child->next, &e->end) != 0)
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "%s: tensor '%s': \"data_offsets\" are not non-negative integers", file,
                        name);
    if (e->begin > e->end)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': offsets [%llu, %llu) have begin > end",
                        file, name, (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > data_len)
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "%s: tensor '%s': offsets [%llu, %llu) out of range: data section is "
                        "%llu bytes",
                        file, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)data_len);

    char sbuf[256];
    st_format_shape(e->shape, e->rank, sbuf, sizeof sbuf);
    if (overflow)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: tensor '%s': shape %s of %s overflows 64 bits",
                        file, name, sbuf, rt_st_dtype_name(e->dtype));
    if (bytes != e->end - e->begin)
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "%s: tensor '%s': shape %s of %s is %llu bytes, but offsets [%llu, %llu) "
                        "hold %llu",
                        file, name, sbuf, rt_st_dtype_name(e->dtype), (unsigned long long)bytes,
                        (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)(e->end - e->begin));
    return MOEC_OK;
}

static moec_status st_check_metadata(const cJSON *j, const char *file)
{
    if (!cJSON_IsObject(j))
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: \"__metadata__\" is not an object", file);
    for (const cJSON *c = j->child; c; c = c->next)
        if (!cJSON_IsString(c))
            return MOEC_ERR(MOEC_ERR_FORMAT, "%s: \"__metadata__\" entry '%s' is not a string",
                            file, c->string ? c->string : "");
    return MOEC_OK;
}

/* Appends the validated entries to dst as tensors pointing into data. */
static moec_status st_append(rt_safetensors *dst, st_file *f, st_entry *es, int n,
                             const uint8_t *data)
{
    size_t pool = 0;
    for (int i = 0; i < n; i++)
        pool += strlen(es[i].name) + 1;
    f->names = malloc(pool ? pool : 1);
    if (!f->names)
        return MOEC_ERR(MOEC_ERR_OOM, "%s: out of memory for %d tensor names", f->path, n);
    if (dst->n_tensors + n > dst->tensors_cap) {
        if (n > INT32_MAX / 2 - dst->n_tensors)
            return MOEC_ERR(MOEC_ERR_CAPACITY, "%s: too many tensors", f->path);
        int cap = dst->tensors_cap ? dst->tensors_cap : 64;
        while (cap < dst->n_tensors + n)
            cap *= 2;
        rt_st_tensor *t = realloc(dst->tensors, (size_t)cap * sizeof *t);
        if (!t)
            return MOEC_ERR(MOEC_ERR_OOM, "%s: out of memory for %d tensors", f->path, n);
        dst->tensors = t;
        dst->tensors_cap = cap;
    }
    char *p = f->names;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(es[i].name) + 1;
        memcpy(p, es[i].name, len);
        rt_st_tensor *t = &dst->tensors[dst->n_tensors++];
        memset(t, 0, sizeof *t);
        t->name = p;
        t->dtype = es[i].dtype;
        t->rank = es[i].rank;
        memcpy(t->shape, es[i].shape, sizeof t->shape);
        t->data = data + es[i].begin;
        t->nbytes = (size_t)(es[i].end - es[i].begin);
        t->file = f->path;
        p += len;
    }
    return MOEC_OK;
}

/* Validates the image buf[0, len) named `file`; when dst is given, appends its
 * tensors (pointing into buf) to dst with f as their file. */
static moec_status st_parse(const uint8_t *buf, size_t len, const char *file,
                            rt_safetensors *dst, st_file *f)
{
    if (len < 8)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: truncated: no header length (%zu bytes)", file, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > (uint64_t)len - 8)
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "%s: header length %llu runs past the end of the file (%zu bytes)", file,
                        (unsigned long long)hlen, len);
    if (hlen > ST_MAX_HEADER)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: header length %llu is absurd (the limit is %llu)",
                        file, (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    const char *hdr = (const char *)buf + 8;
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = (uint64_t)len - 8 - hlen;

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + hlen ? (size_t)(end - hdr) : 0;
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: header is not valid JSON (error at header byte %zu)",
                        file, at);
    }
    moec_status s = MOEC_OK;
    st_entry *es = NULL;
    for (const char *p = end; p && p < hdr + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            s = MOEC_ERR(MOEC_ERR_FORMAT, "%s: trailing bytes after the JSON header (at header "
                         "byte %zu)", file, (size_t)(p - hdr));
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        s = MOEC_ERR(MOEC_ERR_FORMAT, "%s: header is not a JSON object", file);
        goto done;
    }

    int n = 0, n_meta = 0;
    for (const cJSON *c = root->child; c; c = c->next)
        n++;
    es = malloc((size_t)(n ? n : 1) * sizeof *es);
    if (!es) {
        s = MOEC_ERR(MOEC_ERR_OOM, "%s: out of memory for %d header entries", file, n);
        goto done;
    }
    n = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        const char *name = c->string ? c->string : "";
        if (strcmp(name, "__metadata__") == 0) {
            if (n_meta++) {
                s = MOEC_ERR(MOEC_ERR_FORMAT, "%s: duplicate \"__metadata__\"", file);
                goto done;
            }
            if ((s = st_check_metadata(c, file)) != MOEC_OK)
                goto done;
            continue;
        }
        st_entry *e = &es[n];
        e->name = name;
        e->order = n;
        if ((s = st_parse_entry(c, file, data_len, e)) != MOEC_OK)
            goto done;
        n++;
    }

    qsort(es, (size_t)n, sizeof *es, st_cmp_name);
    for (int i = 1; i < n; i++) {
        if (strcmp(es[i - 1].name, es[i].name) == 0) {
            s = MOEC_ERR(MOEC_ERR_FORMAT, "%s: duplicate tensor name '%s'", file, es[i].name);
            goto done;
        }
    }
    /* A tensor's own fields ("dtype" twice) */
    if ((s = moec_json_check_unique(root, file)) != MOEC_OK)
        goto done;

    /* Empty tensors occupy no bytes and overlap nothing. */
    qsort(es, (size_t)n, sizeof *es, st_cmp_begin);
    const st_entry *last = NULL; /* the non-empty tensor reaching furthest so far */
    for (int i = 0; i < n; i++) {
        if (es[i].begin == es[i].end)
            continue;
        if (last && es[i].begin < last->end) {
            s = MOEC_ERR(MOEC_ERR_FORMAT,
                         "%s: tensor '%s': offsets [%llu, %llu) overlaps tensor '%s' at "
                         "[%llu, %llu)",
                         file, es[i].name, (unsigned long long)es[i].begin,
                         (unsigned long long)es[i].end, last->name,
                         (unsigned long long)last->begin, (unsigned long long)last->end);
            goto done;
        }
        if (!last || es[i].end > last->end)
            last = &es[i];
    }

    if (dst) {
        qsort(es, (size_t)n, sizeof *es, st_cmp_order);
        s = st_append(dst, f, es, n, data);
    }
done:
    free(es);
    cJSON_Delete(root);
    return s;
}

moec_status rt_safetensors_check_buffer(const uint8_t *buf, size_t len, const char *filename)
{
    if (!filename)
        filename = "<buffer>";
    if (!buf && len)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: NULL buffer of %zu bytes", filename, len);
    static const uint8_t empty[1];
    return st_parse(buf ? buf : empty, len, filename, NULL, NULL);
}

/* ---- opening -------------------------------------------------------------- */

static char *st_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static char *st_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* Maps path and appends its tensors to st. */
static moec_status st_add_file(rt_safetensors *st, const char *path)
{
    if (st->n_files == st->files_cap) {
        int cap = st->files_cap ? st->files_cap * 2 : 4;
        st_file *f = realloc(st->files, (size_t)cap * sizeof *f);
        if (!f)
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory opening %s", path);
        st->files = f;
        st->files_cap = cap;
    }
    st_file *f = &st->files[st->n_files];
    memset(f, 0, sizeof *f);
    f->path = st_strdup(path);
    if (!f->path)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory opening %s", path);
    st->n_files++; /* from here on rt_safetensors_free releases f */

    int fd;
    size_t len;
    MOEC_TRY(moec_file_open(path, &fd, &len));
    if (len < 8) {
        close(fd);
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: truncated: no header length (%zu bytes)", path,
                        len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return MOEC_ERR(MOEC_ERR_IO, "cannot mmap %s (%zu bytes): %s", path, len, strerror(e));
    f->map = map;
    f->map_len = len;
    return st_parse(map, len, f->path, st, f);
}

moec_status rt_safetensors_open_file(const char *path, rt_safetensors **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_safetensors_open_file: out is NULL");
    *out = NULL;
    if (!path)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_safetensors_open_file: path is NULL");
    rt_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory opening %s", path);
    moec_status s = st_add_file(st, path);
    if (s == MOEC_OK)
        s = st_build_index(st);
    if (s != MOEC_OK) {
        rt_safetensors_free(st);
        return s;
    }
    *out = st;
    return MOEC_OK;
}

static int st_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name from an index must name a file in the model directory. */
static int st_plain_name(const char *s)
{
    return s[0] && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Opens every shard an index names and checks that each mapped tensor is in
 * the shard the index says. */
static moec_status st_open_index(rt_safetensors *st, const char *dir, const char *index)
{
    char *text = NULL;
    size_t len = 0;
    MOEC_TRY(moec_file_read(index, ST_MAX_INDEX, &text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: not valid JSON", index);

    const char **shards = NULL;
    char *path = NULL;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    moec_status s = moec_json_check_unique(root, index);
    if (s != MOEC_OK)
        goto done;
    if (!cJSON_IsObject(root) || !cJSON_IsObject(map)) {
        s = MOEC_ERR(MOEC_ERR_FORMAT, "%s: no \"weight_map\" object", index);
        goto done;
    }
    int n = cJSON_GetArraySize(map);
    if (n == 0) {
        s = MOEC_ERR(MOEC_ERR_FORMAT, "%s: \"weight_map\" is empty", index);
        goto done;
    }
    shards = malloc((size_t)n * sizeof *shards);
    if (!shards) {
        s = MOEC_ERR(MOEC_ERR_OOM, "out of memory reading %s", index);
        goto done;
    }
    n = 0;
    for (const cJSON *c = map->child; c; c = c->next) {
        const char *tname = c->string ? c->string : "";
        if (!cJSON_IsString(c) || !c->valuestring) {
            s = MOEC_ERR(MOEC_ERR_FORMAT, "%s: weight_map entry for tensor '%s' is not a string",
                         index, tname);
            goto done;
        }
        if (!st_plain_name(c->valuestring)) {
            s = MOEC_ERR(MOEC_ERR_FORMAT,
                         "%s: shard name '%s' for tensor '%s' is not a plain file name", index,
                         c->valuestring, tname);
            goto done;
        }
        shards[n++] = c->valuestring;
    }
    qsort(shards, (size_t)n, sizeof *shards, st_cmp_str);
    for (int i = 0; i < n; i++) {
        if (i > 0 && strcmp(shards[i], shards[i - 1]) == 0)
            continue;
        path = st_join(dir, shards[i]);
        if (!path) {
            s = MOEC_ERR(MOEC_ERR_OOM, "out of memory reading %s", index);
            goto done;
        }
        if (access(path, F_OK) != 0) {
            s = MOEC_ERR(MOEC_ERR_IO, "%s names shard '%s', but %s cannot be opened: %s", index,
                         shards[i], path, strerror(errno));
            goto done;
        }
        if ((s = st_add_file(st, path)) != MOEC_OK)
            goto done;
        free(path);
        path = NULL;
    }
    if ((s = st_build_index(st)) != MOEC_OK)
        goto done;
    for (const cJSON *c = map->child; c; c = c->next) {
        const rt_st_tensor *t = rt_safetensors_find(st, c->string);
        const char *base = t ? strrchr(t->file, '/') : NULL;
        base = base ? base + 1 : t ? t->file : NULL;
        if (!t || strcmp(base, c->valuestring) != 0) {
            s = MOEC_ERR(MOEC_ERR_FORMAT, "%s maps tensor '%s' to shard '%s', but %s%s", index,
                         c->string, c->valuestring, t ? "it is in " : "that shard lacks it",
                         t ? t->file : "");
            goto done;
        }
    }
done:
    free(path);
    free(shards);
    cJSON_Delete(root);
    return s;
}

static int st_has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Opens every *.safetensors file of dir, in name order. */
static moec_status st_open_all(rt_safetensors *st, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return MOEC_ERR(MOEC_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    moec_status s = MOEC_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!st_has_suffix(de->d_name, ".safetensors"))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) {
                s = MOEC_ERR(MOEC_ERR_OOM, "out of memory listing %s", dir);
                break;
            }
            names = nn;
        }
        if (!(names[n] = st_strdup(de->d_name))) {
            s = MOEC_ERR(MOEC_ERR_OOM, "out of memory listing %s", dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (s == MOEC_OK && n == 0)
        s = MOEC_ERR(MOEC_ERR_IO, "no *.safetensors in %s", dir);
    if (s == MOEC_OK)
        qsort(names, (size_t)n, sizeof *names, st_cmp_str);
    for (int i = 0; i < n && s == MOEC_OK; i++) {
        char *path = st_join(dir, names[i]);
        if (!path)
            s = MOEC_ERR(MOEC_ERR_OOM, "out of memory opening %s", dir);
        else
            s = st_add_file(st, path);
        free(path);
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (s == MOEC_OK)
        s = st_build_index(st);
    return s;
}

moec_status rt_safetensors_open_dir(const char *dir, rt_safetensors **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_safetensors_open_dir: out is NULL");
    *out = NULL;
    if (!dir)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_safetensors_open_dir: dir is NULL");
    rt_safetensors *st = calloc(1, sizeof *st);
    char *index = st_join(dir, "model.safetensors.index.json");
    char *single = st_join(dir, "model.safetensors");
    moec_status s = MOEC_OK;
    struct stat sb;
    if (!st || !index || !single)
        s = MOEC_ERR(MOEC_ERR_OOM, "out of memory opening %s", dir);
    else if (stat(index, &sb) == 0)
        s = st_open_index(st, dir, index);
    else if (errno != ENOENT)
        s = MOEC_ERR(MOEC_ERR_IO, "cannot stat %s: %s", index, strerror(errno));
    else if (stat(single, &sb) == 0) {
        s = st_add_file(st, single);
        if (s == MOEC_OK)
            s = st_build_index(st);
    } else if (errno != ENOENT)
        s = MOEC_ERR(MOEC_ERR_IO, "cannot stat %s: %s", single, strerror(errno));
    else
        s = st_open_all(st, dir);
    free(index);
    free(single);
    if (s != MOEC_OK) {
        rt_safetensors_free(st);
        return s;
    }
    *out = st;
    return MOEC_OK;
}

/* ---- writing -------------------------------------------------------------- */

static void json_string(moec_buf *b, const char *s)
{
    moec_buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            moec_buf_put(b, esc, 2);
        } else if (c < 0x20) {
            moec_buf_printf(b, "\\u%04x", c);
        } else {
            moec_buf_put(b, (const char *)&c, 1);
        }
    }
    moec_buf_put(b, "\"", 1);
}

static moec_status st_write_all(FILE *fp, const void *p, size_t n, const char *path)
{
    if (n && fwrite(p, 1, n, fp) != n)
        return MOEC_ERR(MOEC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return MOEC_OK;
}

static moec_status st_write_check(const rt_st_write_tensor *tensors, int n, const char *path,
                                  uint64_t *sizes)
{
    for (int i = 0; i < n; i++) {
        const rt_st_write_tensor *t = &tensors[i];
        if (!t->name)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: tensor %d has no name", path, i);
        if (strcmp(t->name, "__metadata__") == 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: '__metadata__' is not a tensor name",
                            path);
        if ((unsigned)t->dtype >= RT_ST_DTYPE_COUNT)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: tensor '%s': bad dtype %d", path, t->name,
                            (int)t->dtype);
        if (t->rank < 0 || t->rank > RT_ST_MAX_RANK || (t->rank && !t->shape))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: tensor '%s': bad rank %d", path, t->name,
                            t->rank);
        uint64_t bytes = rt_st_dtype_size(t->dtype);
        for (int d = 0; d < t->rank; d++) {
            if (t->shape[d] < 0 || (double)t->shape[d] > MOEC_JSON_INT_MAX)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: tensor '%s': bad dim %lld", path,
                                t->name, (long long)t->shape[d]);
            uint64_t v = (uint64_t)t->shape[d];
            if (v && bytes > UINT64_MAX / v)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: tensor '%s': size overflows", path,
                                t->name);
            bytes *= v;
        }
        if (bytes && !t->data)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: tensor '%s': no data", path, t->name);
        sizes[i] = bytes;
    }
    return MOEC_OK;
}

moec_status rt_safetensors_write(const char *path, const rt_st_write_tensor *tensors, int n)
{
    if (!path || n < 0 || (n && !tensors))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_safetensors_write: bad arguments");
    uint64_t *sizes = malloc((size_t)(n ? n : 1) * sizeof *sizes);
    const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    moec_buf b = {0};
    FILE *fp = NULL;
    moec_status s = MOEC_OK;
    if (!sizes || !names) {
        s = MOEC_ERR(MOEC_ERR_OOM, "out of memory writing %s", path);
        goto done;
    }
    if ((s = st_write_check(tensors, n, path, sizes)) != MOEC_OK)
        goto done;
    for (int i = 0; i < n; i++)
        names[i] = tensors[i].name;
    qsort(names, (size_t)n, sizeof *names, st_cmp_str);
    for (int i = 1; i < n; i++) {
        if (strcmp(names[i], names[i - 1]) == 0) {
            s = MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: duplicate tensor name '%s'", path, names[i]);
            goto done;
        }
    }

    moec_buf_put(&b, "{", 1);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const rt_st_write_tensor *t = &tensors[i];
        if (i)
            moec_buf_put(&b, ",", 1);
        json_string(&b, t->name);
        moec_buf_printf(&b, ":{\"dtype\":\"%s\",\"shape\":[", rt_st_dtype_name(t->dtype));
        for (int d = 0; d < t->rank; d++)
            moec_buf_printf(&b, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        moec_buf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                      (unsigned long long)(off + sizes[i]));
        off += sizes[i];
    }
    moec_buf_put(&b, "}", 1);
    while (!b.oom && b.len % 8 != 0)
        moec_buf_put(&b, " ", 1);
    if (b.oom) {
        s = MOEC_ERR(MOEC_ERR_OOM, "out of memory writing the header of %s", path);
        goto done;
    }

    fp = fopen(path, "wb");
    if (!fp) {
        s = MOEC_ERR(MOEC_ERR_IO, "cannot create %s: %s", path, strerror(errno));
        goto done;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
    s = st_write_all(fp, len8, 8, path);
    if (s == MOEC_OK)
        s = st_write_all(fp, b.data, b.len, path);
    for (int i = 0; i < n && s == MOEC_OK; i++)
        s = st_write_all(fp, tensors[i].data, (size_t)sizes[i], path);
    if (fclose(fp) != 0 && s == MOEC_OK)
        s = MOEC_ERR(MOEC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (s != MOEC_OK)
        remove(path);
done:
    free(b.data);
    free(names);
    free(sizes);
    return s;
}
