/* weights.c — binds a module's weight values to checkpoint tensors. Every
 * binding is resolved and checked (presence, shape, dtype; for block-scaled
 * weights the scale tensors' presence, dtype, shape and finiteness too) when
 * the weights are opened, so nothing fails half way through a load; reading
 * widens the stored dtype to fp32 (dequantizing fp8 codes by their block's
 * scale) and assembles stacks and concatenations in the weight type's
 * row-major layout. */
#include "runtime/weights.h"

#include <math.h>
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
    const rt_st_tensor **s;     /* block-scaled: each tensor's F32 scales; else NULL */
    int64_t slo[IR_MAX_RANK];   /* block-scaled: the box of the scales (the blocks the */
    int64_t sext[IR_MAX_RANK];  /* box touches), as lo and ext */
    int64_t rext[IR_MAX_RANK];  /* block-scaled: the part's grid of the weight's blocks */
    int64_t rnumel;             /* (finer than the stored ones where refined) and its size */
    int64_t size;               /* extent along the concat axis */
    int64_t numel;              /* elements of the box */
    int64_t snumel;             /* scales of the scale box */
} wt_part;

/* A box of one tensor or of stacked tensors (dim 0 the tensor, t[0] the
 * box's first): lo[d] .. lo[d] + ext[d] per dim, a stack's lo[0] 0. */
typedef struct wt_box {
    const rt_st_tensor *const *t;
    int stacked, rank;
    const int64_t *lo, *ext;
} wt_box;

typedef struct wt_weight {
    int axis; /* concat axis; 0 otherwise */
    int n_parts;
    wt_part *parts;
    int64_t block[2]; /* block-scaled: rows, columns per scale; else 0 */
    int64_t stored[2]; /* the checkpoint's blocks, which block divides */
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
        for (int p = 0; p < w->w[i].n_parts; p++) {
            free(w->w[i].parts[p].t);
            free(w->w[i].parts[p].s);
        }
        free(w->w[i].parts);
    }
    free(w->w);
    free(w->dir);
    rt_safetensors_free(w->st);
    free(w);
}

static uint32_t wt_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
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
    /* F32 only where it holds bf16 values, checked as it is read
       (wt_check_bf16): transformers 5 saves DeepSeek's routers in F32 */
    case IR_DTYPE_BF16: return got == RT_ST_BF16 || got == RT_ST_F32;
    case IR_DTYPE_I32: return got == RT_ST_I32;
    default: return 0;
    }
}

static const char *wt_dtype_expect(ir_dtype want)
{
    switch (want) {
    case IR_DTYPE_F32: return "F32, F16 or BF16";
    case IR_DTYPE_F16: return "F16";
    case IR_DTYPE_BF16: return "BF16 (or F32 holding bf16 values)";
    case IR_DTYPE_I32: return "I32";
    default: return "?";
    }
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
        ir_binding_box_format(b, box_from, box, sizeof box);
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: tensor '%s' in %s has shape %s, which the slice %s does "
                        "not fit",
                        v->name, name, t->file, got, box);
    }
    int scaled = v->scale.block[0] > 0;
    if (scaled && t->dtype != RT_ST_F8_E4M3)
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: tensor '%s' in %s has dtype %s, expected F8_E4M3 (the "
                        "config quantizes it: quantization_config)",
                        v->name, name, t->file, rt_st_dtype_name(t->dtype));
    if (!scaled && !wt_dtype_ok(v->type.dtype, t->dtype))
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: tensor '%s' in %s has dtype %s, expected %s%s", v->name, name,
                        t->file, rt_st_dtype_name(t->dtype),
                        t->dtype == RT_ST_F8_E4M3 && v->type.dtype == IR_DTYPE_BF16
                            ? "BF16"
                            : wt_dtype_expect(v->type.dtype),
                        t->dtype == RT_ST_F8_E4M3
                            ? " (an fp8 tensor, but the config does not quantize this weight: "
                              "quantization_config)"
                            : "");
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

/* Scale tensor `name` of fp8 tensor q of block-scaled weight v: present,
 * F32, shaped as q's grid of blocks, every scale finite. */
static moec_status wt_resolve_scale(const rt_weights *w, const ir_value *v, const rt_st_tensor *q,
                                    const char *name, const rt_st_tensor **out)
{
    const rt_st_tensor *s = rt_safetensors_find(w->st, name);
    if (!s)
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: scale tensor '%s' (of '%s') not found in %s", v->name, name,
                        q->name, w->dir);
    if (s->dtype != RT_ST_F32)
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: scale tensor '%s' in %s has dtype %s, expected F32", v->name,
                        name, s->file, rt_st_dtype_name(s->dtype));
    if (q->rank < 2)
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: tensor '%s' has rank %d; a block-scaled tensor needs rows "
                        "and columns",
                        v->name, q->name, q->rank);
    int64_t want[RT_ST_MAX_RANK];
    int ok = s->rank == q->rank;
    for (int d = 0; d < q->rank; d++) {
        want[d] = q->shape[d];
        if (d >= q->rank - 2) {
            int64_t b = ir_block_scale_stored(&v->scale, d - (q->rank - 2));
            want[d] = (want[d] + b - 1) / b;
        }
        ok = ok && s->shape[d] == want[d];
    }
    if (!ok) {
        char got[160], exp[160], qs[160];
        wt_format_dims(s->shape, s->rank, -1, got, sizeof got);
        wt_format_dims(want, q->rank, -1, exp, sizeof exp);
        wt_format_dims(q->shape, q->rank, -1, qs, sizeof qs);
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: scale tensor '%s' in %s has shape %s, expected %s ('%s' is "
                        "%s in blocks of [%lld, %lld])",
                        v->name, name, s->file, got, exp, q->name, qs,
                        (long long)ir_block_scale_stored(&v->scale, 0),
                        (long long)ir_block_scale_stored(&v->scale, 1));
    }
    size_t n = s->nbytes / 4;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = wt_le32((const uint8_t *)s->data + 4 * i);
        if ((bits & 0x7f800000u) == 0x7f800000u)
            return MOEC_ERR(MOEC_ERR_MISMATCH,
                            "weight %%%s: scale tensor '%s' in %s holds %s at element %zu; scales "
                            "must be finite",
                            v->name, name, s->file, bits & 0x7fffffu ? "nan" : "inf", i);
    }
    *out = s;
    return MOEC_OK;
}

/* The box of part's scales: leaf's, else the whole scale tensors. It fits
 * them: the verifier made it the blocks that the part's box, which fits its
 * tensors, touches (ir_block_scale_box), and each scale tensor is its
 * tensor's grid of blocks (wt_resolve_scale). Then the part's grid of the
 * weight's blocks, block[0] x block[1]: the same where they are the
 * stored ones. */
static void wt_scale_box(const ir_binding *leaf, const int64_t *block, wt_part *part)
{
    const rt_st_tensor *s = part->s[0];
    int d0 = part->stacked;
    if (d0) {
        part->slo[0] = 0;
        part->sext[0] = part->n;
    }
    part->snumel = d0 ? part->n : 1;
    for (int d = d0; d < part->rank; d++) {
        int boxed = leaf->box_rank && leaf->box_size[d] > 0;
        part->slo[d] = boxed ? leaf->box_start[d] : 0;
        part->sext[d] = boxed ? leaf->box_size[d] : s->shape[d - d0];
        part->snumel *= part->sext[d];
    }
    part->rnumel = 1;
    for (int d = 0; d < part->rank; d++) {
        int k = d - (part->rank - 2);
        part->rext[d] = k >= 0 ? (part->ext[d] + block[k] - 1) / block[k] : part->sext[d];
        part->rnumel *= part->rext[d];
    }
}

/* The scales of block-scaled weight v, part by part as its scale binding
 * mirrors its binding (a stack's from its box's first expert on, as the
 * codes); the parts of a concatenation along a blocked axis must each (but
 * the last) span whole blocks, so that their scale grids join into the
 * weight's. */
static moec_status wt_resolve_scales(const rt_weights *w, const ir_value *v, wt_weight *out)
{
    for (int k = 0; k < 2; k++) {
        out->block[k] = v->scale.block[k];
        out->stored[k] = ir_block_scale_stored(&v->scale, k);
    }
    const ir_binding *sb = &v->scale.bind;
    for (int p = 0; p < out->n_parts; p++) {
        wt_part *part = &out->parts[p];
        const ir_binding *leaf = sb->kind == IR_BIND_CONCAT ? &sb->parts[p] : sb;
        int stack = leaf->kind == IR_BIND_STACK;
        int64_t e0 = stack && leaf->box_rank && leaf->box_size[0] > 0 ? leaf->box_start[0] : 0;
        part->s = calloc((size_t)part->n, sizeof *part->s);
        if (!part->s)
            return MOEC_ERR(MOEC_ERR_OOM, "weight %%%s: out of memory", v->name);
        for (int e = 0; e < part->n; e++) {
            char *name = stack ? wt_stack_name(leaf->name, (int)(e0 + e)) : NULL;
            if (stack && !name)
                return MOEC_ERR(MOEC_ERR_OOM, "weight %%%s: out of memory", v->name);
            moec_status st = wt_resolve_scale(w, v, part->t[e], name ? name : leaf->name,
                                              &part->s[e]);
            free(name);
            MOEC_TRY(st);
        }
        wt_scale_box(leaf, out->block, part);
    }
    int r = v->type.rank, a = out->axis;
    if (v->bind.kind != IR_BIND_CONCAT || a < r - 2)
        return MOEC_OK;
    int64_t blk = out->block[a - (r - 2)];
    for (int p = 0; p + 1 < out->n_parts; p++)
        if (out->parts[p].size % blk)
            return MOEC_ERR(MOEC_ERR_MISMATCH,
                            "weight %%%s: concat part %d ('%s') spans %lld along axis %d, not a "
                            "multiple of the %lld of a scale block: the parts' blocks would not "
                            "line up",
                            v->name, p, out->parts[p].t[0]->name, (long long)out->parts[p].size,
                            a, (long long)blk);
    return MOEC_OK;
}

static moec_status wt_resolve_binding(const rt_weights *w, const ir_value *v, wt_weight *out)
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

static moec_status wt_resolve(const rt_weights *w, const ir_value *v, wt_weight *out)
{
    MOEC_TRY(wt_resolve_binding(w, v, out));
    if (v->scale.block[0] > 0)
        return wt_resolve_scales(w, v, out);
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

uint8_t moec_f32_to_f8e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 464.0f) /* past 448 and the tie above it, which goes to 448 (even) */
        return sign | 0x7e;
    if (a < 0x1p-6f) /* subnormal: m/8 2^-6 for m = 0..7; m = 8 is the smallest normal's code */
        return sign | (uint8_t)nearbyintf(a * 512.0f);
    int ex;
    frexpf(a, &ex); /* a = fr 2^ex, fr in [0.5, 1) */
    int e = ex - 1, m = (int)nearbyintf((ldexpf(a, -e) - 1.0f) * 8.0f);
    if (m == 8) {
        m = 0;
        e++;
    }
    return (uint8_t)(sign | (e + 7) << 3 | m);
}

float rt_f8e4m3_to_f32(uint8_t code)
{
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t exp = (code >> 3) & 0xfu, mant = code & 0x7u;
    uint32_t bits;
    float f;
    if (exp == 0xf && mant == 0x7) {
        bits = sign | 0x7fc00000u; /* the only NaNs; e4m3fn has no infinities */
    } else if (exp != 0) {
        bits = sign | ((exp + 120) << 23) | (mant << 20); /* (1 + m/8) 2^(e-7) */
    } else {
        f = (float)mant * 0x1p-9f; /* subnormal: m/8 2^-6, exact */
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Elements [off, off + n) of fp8 tensor t [..., rows, cols], each code times
 * its block's scale in s [..., ceil(rows / block[0]), ceil(cols / block[1])]. */
static void wt_dequant(const rt_st_tensor *t, const rt_st_tensor *s, const int64_t *block,
                       int64_t off, int64_t n, float *dst)
{
    int r = t->rank;
    int64_t cols = t->shape[r - 1], rows = t->shape[r - 2];
    int64_t scols = (cols + block[1] - 1) / block[1], srows = (rows + block[0] - 1) / block[0];
    const uint8_t *q = t->data, *sp = s->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t at = off + i, col = at % cols, row = (at / cols) % rows, lead = at / (cols * rows);
        int64_t si = (lead * srows + row / block[0]) * scols + col / block[1];
        uint32_t bits = wt_le32(sp + 4 * si);
        float scale;
        memcpy(&scale, &bits, sizeof scale);
        dst[i] = rt_f8e4m3_to_f32(q[at]) * scale;
    }
}

/* Widens elements [off, off + n) of t (stored little-endian) into dst; an
 * fp8 t is dequantized by its scales s in blocks of block[0] x block[1]. */
static void wt_convert(const rt_st_tensor *t, const rt_st_tensor *s, const int64_t *block,
                       int64_t off, int64_t n, float *dst)
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
    case RT_ST_F8_E4M3: /* always with its scales: an unscaled weight refuses F8 at open */
        if (s)
            wt_dequant(t, s, block, off, n, dst);
        else
            memset(dst, 0, (size_t)n * sizeof *dst);
        break;
    default: /* never reached: dtypes are checked at open */
        memset(dst, 0, (size_t)n * sizeof *dst);
        break;
    }
}

moec_status rt_tensor_read_f32(const rt_st_tensor *t, float *dst)
{
    if (!t || !dst)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_tensor_read_f32: NULL argument");
    if (t->dtype != RT_ST_F32 && t->dtype != RT_ST_F16 && t->dtype != RT_ST_BF16 &&
        t->dtype != RT_ST_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "tensor '%s' in %s has dtype %s, not F32, F16, BF16 or I32", t->name,
                        t->file, rt_st_dtype_name(t->dtype));
    wt_convert(t, NULL, NULL, 0, (int64_t)(t->nbytes / rt_st_dtype_size(t->dtype)), dst);
    return MOEC_OK;
}

/* The run of box b's elements from `at` (row-major over ext) to the end
 * of its box row, at most n long: its length; *ti gets the tensor it lies
 * in, *off its element offset there. */
static int64_t wt_box_run(const wt_box *b, int64_t at, int64_t n, int *ti, int64_t *off)
{
    int r = b->rank, d0 = b->stacked;
    int64_t idx[IR_MAX_RANK], rem = at;
    for (int d = r - 1; d >= 0; d--) {
        idx[d] = rem % b->ext[d];
        rem /= b->ext[d];
    }
    *ti = d0 ? (int)idx[0] : 0;
    const rt_st_tensor *t = b->t[*ti];
    int64_t o = 0;
    for (int d = d0; d < r; d++)
        o = o * t->shape[d - d0] + b->lo[d] + idx[d];
    *off = o;
    int64_t k = b->ext[r - 1] - idx[r - 1];
    return k < n ? k : n;
}

/* Widens elements [start, start + n) of a part's box, in its row-major
 * order (tensor after tensor for a stack), into dst: a run of each box row
 * at a time, from where that row lies in its tensor (an fp8 tensor's
 * elements each times its block's scale). */
static void wt_read_range(const wt_part *part, const int64_t *block, int64_t start, int64_t n,
                          float *dst)
{
    wt_box b = {part->t, part->stacked, part->rank, part->lo, part->ext};
    while (n > 0) {
        int ti;
        int64_t off, k = wt_box_run(&b, start, n, &ti, &off);
        wt_convert(part->t[ti], part->s ? part->s[ti] : NULL, block, off, k, dst);
        start += k;
        dst += k;
        n -= k;
    }
}

/* The resolved weight of v, or an error when v is not a weight of w's module. */
static moec_status wt_lookup(const rt_weights *w, const ir_value *v, const wt_weight **out)
{
    if (v->kind != IR_VALUE_WEIGHT || v->id < 0 || v->id >= w->n_values ||
        w->m->values[v->id] != v || w->w[v->id].n_parts == 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%%%s is not a weight of the module the weights "
                        "were opened for", v->name ? v->name : "?");
    *out = &w->w[v->id];
    return MOEC_OK;
}

/* A bf16 weight read from F32 tensors (the n floats at dst) must hold
 * values bf16 represents exactly, as transformers 5 writes a bf16 model's
 * routers: anything else would be rounded, so it is an error naming the
 * F32 tensor (the first of them where the weight joins several). */
static moec_status wt_check_bf16(const ir_value *v, const wt_weight *ww, const float *dst,
                                 int64_t n)
{
    const rt_st_tensor *f32 = NULL;
    int n32 = 0;
    for (int p = 0; p < ww->n_parts; p++)
        for (int i = 0; i < ww->parts[p].n; i++)
            if (ww->parts[p].t[i]->dtype == RT_ST_F32 && !n32++)
                f32 = ww->parts[p].t[i];
    if (!f32)
        return MOEC_OK;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &dst[i], sizeof u);
        if (!(u & 0xffffu) || (u & 0x7fffffffu) > 0x7f800000u)
            continue;
        char what[1200];
        snprintf(what, sizeof what,
                 n32 > 1 ? "its F32 tensors ('%s' in %s the first of %d) hold"
                         : "tensor '%s' in %s (F32) holds",
                 f32->name, f32->file, n32);
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "weight %%%s: %s values bf16 does not represent (element %lld of the "
                        "weight: %.9g); moec keeps this weight in bf16, the config's dtype",
                        v->name, what, (long long)i, (double)dst[i]);
    }
    return MOEC_OK;
}

moec_status rt_weights_read_f32(const rt_weights *w, const ir_value *v, float *dst)
{
    if (!w || !v || !dst)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_weights_read_f32: NULL argument");
    const wt_weight *ww = NULL;
    MOEC_TRY(wt_lookup(w, v, &ww));
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
            wt_read_range(part, ww->stored, o * chunk, chunk, dst + o * row + at);
        at += chunk;
    }
    return ty->dtype == IR_DTYPE_BF16 ? wt_check_bf16(v, ww, dst, ir_type_numel(ty, 0)) : MOEC_OK;
}

/* Elements [start, start + n) of box b copied as stored (esize bytes
 * each; 4-byte elements are little-endian f32) into dst. */
static void wt_copy_range(const wt_box *b, size_t esize, int64_t start, int64_t n, uint8_t *dst)
{
    while (n > 0) {
        int ti;
        int64_t off, k = wt_box_run(b, start, n, &ti, &off);
        const uint8_t *src = (const uint8_t *)b->t[ti]->data + (size_t)off * esize;
        if (esize == 4)
            for (int64_t i = 0; i < k; i++) {
                uint32_t bits = wt_le32(src + 4 * i);
                memcpy(dst + 4 * i, &bits, 4);
            }
        else
            memcpy(dst, src, (size_t)k * esize);
        start += k;
        dst += (size_t)k * esize;
        n -= k;
    }
}

/* Elements [start, start + n) of part's grid of the weight's blocks (rext,
 * row-major) into dst, each its stored block's scale (little-endian f32):
 * a grid finer than the stored one repeats a stored scale over the blocks
 * it holds. The part's box starts on a stored block boundary (the
 * verifier's rule), so its block i lies in its scale box's block
 * i * block / stored. */
static void wt_copy_refined(const wt_part *part, const int64_t *block, const int64_t *stored,
                            int64_t start, int64_t n, uint8_t *dst)
{
    wt_box b = {part->s, part->stacked, part->rank, part->slo, part->sext};
    int r = part->rank;
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = start + i, at = 0, mul = 1;
        for (int d = r - 1; d >= 0; d--) {
            int64_t idx = rem % part->rext[d];
            rem /= part->rext[d];
            int k = d - (r - 2);
            if (k >= 0)
                idx = idx * block[k] / stored[k];
            at += idx * mul;
            mul *= part->sext[d];
        }
        int ti;
        int64_t off;
        wt_box_run(&b, at, 1, &ti, &off);
        uint32_t bits = wt_le32((const uint8_t *)part->s[ti]->data + (size_t)off * 4);
        memcpy(dst + 4 * i, &bits, 4);
    }
}

/* The boxes of every part of weight ww of type ty (the codes', or with
 * `scales` the scales', in the weight's blocks) assembled into dst: the
 * parts of a concatenation side by side along its axis. */
static void wt_assemble(const wt_weight *ww, const ir_type *ty, int scales, uint8_t *dst)
{
    size_t esize = scales ? 4 : 1;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < ww->axis; d++)
        outer *= ty->dims[d];
    for (int d = ww->axis + 1; d < ty->rank; d++)
        inner *= ty->dims[d];
    int64_t row = ty->dims[ww->axis] * inner, at = 0;
    for (int p = 0; p < ww->n_parts; p++) {
        const wt_part *part = &ww->parts[p];
        wt_box b = {scales ? part->s : part->t, part->stacked, part->rank,
                    scales ? part->slo : part->lo, scales ? part->sext : part->ext};
        int refined = scales && (ww->block[0] != ww->stored[0] || ww->block[1] != ww->stored[1]);
        int64_t numel = !scales ? part->numel : refined ? part->rnumel : part->snumel;
        if (numel == 0)
            continue;
        int64_t chunk = numel / outer;
        for (int64_t o = 0; o < outer; o++) {
            uint8_t *to = dst + (size_t)(o * row + at) * esize;
            if (refined)
                wt_copy_refined(part, ww->block, ww->stored, o * chunk, chunk, to);
            else
                wt_copy_range(&b, esize, o * chunk, chunk, to);
        }
        at += chunk;
    }
}

moec_status rt_weights_read_f8(const rt_weights *w, const ir_value *v, uint8_t *codes,
                               float *scales)
{
    if (!w || !v || !codes || !scales)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_weights_read_f8: NULL argument");
    const wt_weight *ww = NULL;
    MOEC_TRY(wt_lookup(w, v, &ww));
    if (v->type.dtype != IR_DTYPE_F8E4M3 || ww->block[0] <= 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_weights_read_f8: weight %%%s is not kept in fp8 (dtype %s)", v->name,
                        ir_dtype_name(v->type.dtype));
    ir_type st = ir_block_scale_type(v);
    wt_assemble(ww, &v->type, 0, codes);
    wt_assemble(ww, &st, 1, (uint8_t *)scales);
    return MOEC_OK;
}
