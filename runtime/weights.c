/* weights.c — binds a module's weight values to checkpoint tensors. Every
 * binding is resolved and checked (presence, shape, dtype) when the weights
 * are opened, so nothing fails half way through a load; reading widens the
 * stored dtype to fp32 and assembles stacks and concatenations in the
 * weight type's row-major layout. */
#include "runtime/weights.h"

#include <stdlib.h>
#include <string.h>

#include "err.h"

/* One part of a weight: a box of a tensor, or of count stacked tensors
 * (dim 0 the expert), covering `size` entries of the weight's concat axis
 * (the whole weight when not a concat). */
typedef struct wt_part {
    int n;                      /* tensors: 1, or the experts of the box */
    const rt_st_tensor **t;     /* a stack's from the box's first expert on */
    int stacked;
    int rank;                   /* dims of the box: a stack's count, then the tensor's */
    int64_t lo[IR_MAX_RANK];    /* the box: lo[d] .. lo[d] + ext[d] (a stack's dim 0: 0,
                                   t[] already starts at its first expert) */
    int64_t ext[IR_MAX_RANK];
    int64_t size;               /* extent along the concat axis */
    int64_t numel;              /* elements of the box */
} wt_part;

typedef struct wt_weight {
    int axis; /* concat axis; 0 otherwise */
    int n_parts;
    wt_part *parts;
} wt_weight;

struct rt_weights {
    rt_safetensors *st;
    const ir_module *m;
    char *dir;
    int n_values;
    wt_weight *w; /* by value id; n_parts == 0 for non-weights */
};

void rt_weights_free(rt_weights *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n_values; i++) {
        for (int p = 0; p < w->w[i].n_parts; p++)
            free(w->w[i].parts[p].t);
        free(w->w[i].parts);
    }
    free(w->w);
    free(w->dir);
    rt_safetensors_free(w->st);
    free(w);
}

static void wt_format_dims(const int64_t *d, int rank, int wild, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && n < cap; i++) {
        if (i == wild)
            n += (size_t)snprintf(buf + n, cap - n, "%s*", i ? ", " : "");
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)d[i]);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

static int wt_dtype_ok(ir_dtype want, rt_st_dtype got)
{
    switch (want) {
    case IR_DTYPE_F32: return got == RT_ST_F32 || got == RT_ST_F16 || got == RT_ST_BF16;
    case IR_DTYPE_F16: return got == RT_ST_F16;
    case IR_DTYPE_BF16: return got == RT_ST_BF16;
    case IR_DTYPE_I32: return got == RT_ST_I32;
    default: return 0;
    }
}

static const char *wt_dtype_expect(ir_dtype want)
{
    switch (want) {
    case IR_DTYPE_F32: return "F32, F16 or BF16";
    case IR_DTYPE_F16: return "F16";
    case IR_DTYPE_BF16: return "BF16";
    case IR_DTYPE_I32: return "I32";
    default: return "?";
    }
}

/* The "[4:8, :]" form of a binding's box over dims [from, box_rank), for
 * messages. */
static void wt_format_box(const ir_binding *b, int from, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = from; d < b->box_rank && n < cap; d++) {
        const char *sep = d > from ? ", " : "";
        if (b->box_size[d] > 0)
            n += (size_t)snprintf(buf + n, cap - n, "%s%lld:%lld", sep,
                                  (long long)b->box_start[d],
                                  (long long)(b->box_start[d] + b->box_size[d]));
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s:", sep);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

/* Finds tensor `name` and checks its dtype against the weight's and its
 * shape against want[0..rank) (dim `wild` may be anything, but is stored
 * into want on return so later tensors of a stack must agree). Where b's
 * box covers a dim (box dims from box_from on are the tensor's), the
 * tensor need only hold the box there. */
static moec_status wt_resolve_tensor(const rt_weights *w, const ir_value *v, const char *name,
                                     const ir_binding *b, int box_from, int64_t *want, int rank,
                                     int wild, const rt_st_tensor **out)
{
    const rt_st_tensor *t = rt_safetensors_find(w->st, name);
    if (!t)
        return MOEC_ERR(MOEC_ERR_MISMATCH, "weight %%%s: tensor '%s' not found in %s", v->name,
                        name, w->dir);
    int ok = t->rank == rank, fits = 1;
    for (int i = 0; ok && i < rank; i++) {
        int boxed = b->box_rank && b->box_size[box_from + i] > 0;
        if (boxed)
            fits &= b->box_start[box_from + i] + b->box_size[box_from + i] <= t->shape[i];
        else
            ok = i == wild || t->shape[i] == want[i];
    }
    if (!ok || !fits) {
        char got[160], exp[160], box[160];
        wt_format_dims(t->shape, t->rank, -1, got, sizeof got);
        if (!ok) {
            wt_format_dims(want, rank, wild, exp, sizeof exp);
            return MOEC_ERR(MOEC_ERR_MISMATCH,
                            "weight %%%s: tensor '%s' in %s has shape %s, expected %s", v->name,
                            name, t->file, got, exp);
        }
        wt_format_box(b, box_from, box, sizeof box);
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: tensor '%s' in %s has shape %s, which the slice %s does "
                        "not fit",
                        v->name, name, t->file, got, box);
    }
    if (!wt_dtype_ok(v->type.dtype, t->dtype))
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: tensor '%s' in %s has dtype %s, expected %s", v->name, name,
                        t->file, rt_st_dtype_name(t->dtype), wt_dtype_expect(v->type.dtype));
    if (wild >= 0 && !(b->box_rank && b->box_size[box_from + wild] > 0))
        want[wild] = t->shape[wild];
    *out = t;
    return MOEC_OK;
}

/* The name of stack member e: pattern with every "{e}" replaced by e. */
static char *wt_stack_name(const char *pattern, int e)
{
    char num[16];
    int nl = snprintf(num, sizeof num, "%d", e);
    size_t len = strlen(pattern) + 1;
    for (const char *p = strstr(pattern, "{e}"); p; p = strstr(p + 3, "{e}"))
        len += (size_t)nl;
    char *s = malloc(len);
    if (!s)
        return NULL;
    char *o = s;
    for (const char *p = pattern; *p;) {
        if (strncmp(p, "{e}", 3) == 0) {
            memcpy(o, num, (size_t)nl);
            o += nl;
            p += 3;
        } else {
            *o++ = *p++;
        }
    }
    *o = '\0';
    return s;
}

/* The box of a resolved part: b's box where it has one, else the whole of
 * t's dims (a stack's dim 0: its experts, already picked into t[]). */
static void wt_part_box(wt_part *part, const ir_binding *b)
{
    const rt_st_tensor *t = part->t[0];
    int d0 = part->stacked;
    part->rank = t->rank + d0;
    if (d0) {
        part->lo[0] = 0;
        part->ext[0] = part->n;
    }
    part->numel = part->stacked ? part->n : 1;
    for (int d = d0; d < part->rank; d++) {
        int boxed = b->box_rank && b->box_size[d] > 0;
        part->lo[d] = boxed ? b->box_start[d] : 0;
        part->ext[d] = boxed ? b->box_size[d] : t->shape[d - d0];
        part->numel *= part->ext[d];
    }
}

/* Resolves a TENSOR or STACK binding into part, whose shape must be the
 * weight type's except along `axis` when axis >= 0 (a concat part). */
static moec_status wt_resolve_part(const rt_weights *w, const ir_value *v, const ir_binding *b,
                                   int axis, wt_part *part)
{
    const ir_type *ty = &v->type;
    int64_t want[IR_MAX_RANK];
    memcpy(want, ty->dims, sizeof want);
    if (b->kind == IR_BIND_TENSOR) {
        if (!b->name)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: binding without a tensor name",
                            v->name);
        part->t = malloc(sizeof *part->t);
        if (!part->t)
            return MOEC_ERR(MOEC_ERR_OOM, "weight %%%s: out of memory", v->name);
        part->n = 1;
        MOEC_TRY(wt_resolve_tensor(w, v, b->name, b, 0, want, ty->rank, axis, &part->t[0]));
    } else if (b->kind == IR_BIND_STACK) {
        if (!b->name || !strstr(b->name, "{e}"))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: stack pattern '%s' has no {e}",
                            v->name, b->name ? b->name : "");
        if (ty->rank < 1)
            return MOEC_ERR(MOEC_ERR_MISMATCH, "weight %%%s: a stack needs a rank >= 1 type",
                            v->name);
        if (b->count < 1)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: stack count %d", v->name,
                            b->count);
        int boxed = b->box_rank && b->box_size[0] > 0;
        int64_t e0 = boxed ? b->box_start[0] : 0, ne = boxed ? b->box_size[0] : b->count;
        if (e0 + ne > b->count || (axis != 0 && ne != ty->dims[0]))
            return MOEC_ERR(MOEC_ERR_MISMATCH,
                            "weight %%%s: stack of %lld tensors ('%s') for leading dim %lld",
                            v->name, (long long)ne, b->name, (long long)ty->dims[0]);
        part->t = malloc((size_t)ne * sizeof *part->t);
        if (!part->t)
            return MOEC_ERR(MOEC_ERR_OOM, "weight %%%s: out of memory", v->name);
        part->stacked = 1;
        int wild = axis > 0 ? axis - 1 : -1;
        for (int64_t e = 0; e < ne; e++) {
            char *name = wt_stack_name(b->name, (int)(e0 + e));
            if (!name)
                return MOEC_ERR(MOEC_ERR_OOM, "weight %%%s: out of memory", v->name);
            moec_status s = wt_resolve_tensor(w, v, name, b, 1, want + 1, ty->rank - 1, wild,
                                              &part->t[e]);
            free(name);
            part->n = (int)e + 1;
            MOEC_TRY(s);
            wild = -1; /* the first tensor fixed the free extent for the rest */
        }
    } else {
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: a concat part must be a tensor or a "
                        "stack", v->name);
    }
    wt_part_box(part, b);
    part->size = axis >= 0 ? part->ext[axis] : ty->rank ? ty->dims[0] : 1;
    return MOEC_OK;
}

static moec_status wt_resolve(const rt_weights *w, const ir_value *v, wt_weight *out)
{
    const ir_binding *b = &v->bind;
    const ir_type *ty = &v->type;
    for (int d = 0; d < ty->rank; d++)
        if (ty->dims[d] < 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: dim %d is %lld", v->name, d,
                            (long long)ty->dims[d]);
    if (b->kind != IR_BIND_CONCAT) {
        out->parts = calloc(1, sizeof *out->parts);
        if (!out->parts)
            return MOEC_ERR(MOEC_ERR_OOM, "weight %%%s: out of memory", v->name);
        out->n_parts = 1;
        out->axis = 0;
        return wt_resolve_part(w, v, b, -1, &out->parts[0]);
    }
    if (b->axis < 0 || b->axis >= ty->rank)
        return MOEC_ERR(MOEC_ERR_MISMATCH, "weight %%%s: concat axis %d outside rank %d", v->name,
                        b->axis, ty->rank);
    if (b->n_parts < 1 || !b->parts)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: concat of no parts", v->name);
    out->parts = calloc((size_t)b->n_parts, sizeof *out->parts);
    if (!out->parts)
        return MOEC_ERR(MOEC_ERR_OOM, "weight %%%s: out of memory", v->name);
    out->axis = b->axis;
    int64_t sum = 0;
    for (int p = 0; p < b->n_parts; p++) {
        out->n_parts = p + 1;
        MOEC_TRY(wt_resolve_part(w, v, &b->parts[p], b->axis, &out->parts[p]));
        sum += out->parts[p].size;
    }
    if (sum != ty->dims[b->axis])
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: concat parts sum to %lld along axis %d, expected %lld",
                        v->name, (long long)sum, b->axis, (long long)ty->dims[b->axis]);
    return MOEC_OK;
}

moec_status rt_weights_open(const ir_module *m, const char *dir, rt_weights **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_weights_open: out is NULL");
    *out = NULL;
    if (!m || !dir)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_weights_open: NULL module or directory");
    rt_weights *w = calloc(1, sizeof *w);
    if (!w)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory opening the weights in %s", dir);
    size_t dl = strlen(dir) + 1;
    w->dir = malloc(dl);
    w->w = calloc((size_t)(m->n_values > 0 ? m->n_values : 1), sizeof *w->w);
    moec_status s = MOEC_OK;
    if (!w->dir || !w->w)
        s = MOEC_ERR(MOEC_ERR_OOM, "out of memory opening the weights in %s", dir);
    else {
        memcpy(w->dir, dir, dl);
        w->m = m;
        w->n_values = m->n_values;
        s = rt_safetensors_open_dir(dir, &w->st);
    }
    for (int i = 0; s == MOEC_OK && i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v && v->kind == IR_VALUE_WEIGHT)
            s = wt_resolve(w, v, &w->w[i]);
    }
    if (s != MOEC_OK) {
        rt_weights_free(w);
        return s;
    }
    *out = w;
    return MOEC_OK;
}

static float wt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    float f;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else {
        /* zero or subnormal: mant * 2^-24, exact in fp32 */
        f = (float)mant * 0x1p-24f;
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint32_t wt_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Widens elements [off, off + n) of t (stored little-endian) into dst. */
static void wt_convert(const rt_st_tensor *t, int64_t off, int64_t n, float *dst)
{
    const uint8_t *p = (const uint8_t *)t->data + (size_t)off * rt_st_dtype_size(t->dtype);
    uint32_t bits;
    switch (t->dtype) {
    case RT_ST_F32:
        for (int64_t i = 0; i < n; i++, p += 4) {
            bits = wt_le32(p);
            memcpy(&dst[i], &bits, sizeof bits);
        }
        break;
    case RT_ST_BF16:
        for (int64_t i = 0; i < n; i++, p += 2) {
            bits = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
            memcpy(&dst[i], &bits, sizeof bits);
        }
        break;
    case RT_ST_F16:
        for (int64_t i = 0; i < n; i++, p += 2)
            dst[i] = wt_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
        break;
    case RT_ST_I32:
        for (int64_t i = 0; i < n; i++, p += 4)
            dst[i] = (float)(int32_t)wt_le32(p);
        break;
    default: /* never reached: dtypes are checked at open */
        memset(dst, 0, (size_t)n * sizeof *dst);
        break;
    }
}

/* Widens elements [start, start + n) of a part's box, in its row-major
 * order (tensor after tensor for a stack), into dst: a run of each box row
 * at a time, from where that row lies in its tensor. */
static void wt_read_range(const wt_part *part, int64_t start, int64_t n, float *dst)
{
    int r = part->rank, d0 = part->stacked;
    int64_t row = part->ext[r - 1];
    while (n > 0) {
        int64_t idx[IR_MAX_RANK], rem = start;
        for (int d = r - 1; d >= 0; d--) {
            idx[d] = rem % part->ext[d];
            rem /= part->ext[d];
        }
        const rt_st_tensor *t = part->t[d0 ? idx[0] : 0];
        int64_t off = 0;
        for (int d = d0; d < r; d++)
            off = off * t->shape[d - d0] + part->lo[d] + idx[d];
        int64_t k = row - idx[r - 1] < n ? row - idx[r - 1] : n;
        wt_convert(t, off, k, dst);
        start += k;
        dst += k;
        n -= k;
    }
}

moec_status rt_weights_read_f32(const rt_weights *w, const ir_value *v, float *dst)
{
    if (!w || !v || !dst)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_weights_read_f32: NULL argument");
    if (v->kind != IR_VALUE_WEIGHT || v->id < 0 || v->id >= w->n_values ||
        w->m->values[v->id] != v || w->w[v->id].n_parts == 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%%%s is not a weight of the module the weights "
                        "were opened for", v->name ? v->name : "?");
    const wt_weight *ww = &w->w[v->id];
    const ir_type *ty = &v->type;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < ww->axis; d++)
        outer *= ty->dims[d];
    for (int d = ww->axis + 1; d < ty->rank; d++)
        inner *= ty->dims[d];
    int64_t row = ty->rank ? ty->dims[ww->axis] * inner : 1;
    int64_t at = 0; /* offset of the current part along the axis, in elements */
    for (int p = 0; p < ww->n_parts; p++) {
        const wt_part *part = &ww->parts[p];
        if (part->numel == 0)
            continue;
        int64_t chunk = part->numel / outer;
        for (int64_t o = 0; o < outer; o++)
            wt_read_range(part, o * chunk, chunk, dst + o * row + at);
        at += chunk;
    }
    return MOEC_OK;
}
