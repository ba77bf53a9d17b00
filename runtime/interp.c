/* interp.c — the CPU reference interpreter: the definition of every IR op
 * (docs/IR.md), in naive fp32 loops, one function per op, so that every
 * other path (passes, GPU kernels) can be checked against it. Dot products
 * and sums accumulate in double: this is the oracle, and the extra accuracy
 * only brings it closer to the exact result. RoPE frequencies are computed
 * in fp32 step by step as transformers computes them, since angles at large
 * positions amplify any difference there. Weights arrive in fp32 from
 * rt_weights_read_f32: fp8 block-scaled ones dequantized exactly there (each
 * e4m3 code times its block's scale, one fp32 multiply), so every op below
 * sees the checkpoint's function whatever its storage. */
#include "runtime/interp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

struct rt_interp {
    const ir_module *m;
    int page_size;       /* positions per KV page */
    int n_pages;         /* pages in every KV cache */
    int paged;           /* 0: one sequence, its page_size positions in page 0 */
    int T;               /* tokens of the last forward (0 before any) */
    int T_cap;           /* tokens the activation buffers are sized for */
    void **data;         /* per value id: weights (all elements, fp32); inputs and
                            op results [T_cap, ...] (int32 for i32 values, else fp32) */
    float **k_cache;     /* per op id, n_pages * page_size rows: attention [Hkv, Dk];
                            mla_attention [r] (kv_c) */
    float **v_cache;     /* per op id, rows as k_cache: attention [Hkv, Dv];
                            mla_attention [dr] (k_pe) */
    unsigned char **kv_written; /* per op id: rows whose k, v are cached */
    int planned;         /* activations live in `arena` at their planned offsets */
    char *arena;         /* planned mode: arena_bytes_per_token * arena_T bytes */
    int64_t arena_bytes_per_token;
    int arena_T;         /* tokens the arena is sized for */
    double *scores;      /* attention scratch: a score per attended position */
    int64_t *kv_rows;    /* attention scratch: the cache row of each attended position */
    unsigned char *mark; /* attention and dsa_topk scratch: a flag per position, left all 0 */
    struct dsa_cand *cand; /* dsa_topk scratch: a scored candidate per position */
    int64_t scratch_cap; /* positions the scratch arrays hold */
    rt_interp_pages pages; /* the page map of the forward being run */
    int32_t page0;       /* the page map of an unpaged interpreter: page 0 */
    const ir_value *tokens;
    const ir_value *positions;
    /* A group of ranks (rt_interp_init_ranks): rank 0's interpreter holds
     * every rank's (peers[0] is itself) and runs them all, in step, meeting
     * at each collective; it owns the modules when `owned` is set. */
    ir_dtype round_dt;    /* rt_interp_round_storage: results rounded to it (F32: none) */
    uint64_t round_skip;  /* op kinds (bit 1 << kind) whose results are not rounded */
    int n_ranks;          /* 1 alone */
    rt_interp **peers;    /* rank 0 of a group: n_ranks interpreters */
    ir_module **owned;    /* rank 0 of a group: the modules it frees */
};

static void round_floats(float *x, int64_t n, ir_dtype dt);

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* A fused op's intermediate (the silu_mul it folds in, the routed sum)
 * rounded as the op it replaces rounds its result under
 * rt_interp_round_storage: to round_dt unless that op's kind is skipped. */
static void round_as(const rt_interp *in, ir_op_kind replaced, float *x, int64_t n)
{
    if (in->round_dt != IR_DTYPE_F32 && !(in->round_skip >> replaced & 1))
        round_floats(x, n, in->round_dt);
}

/* y[o, j] = the sum over k of x[o, k, j] (x [outer, n, inner]), in double in
 * k order, then fp32: reduce_sum's sum, and moe_routed's over its experts. */
static void sum_middle(const float *x, float *y, int64_t outer, int64_t n, int64_t inner)
{
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            double acc = 0;
            for (int64_t k = 0; k < n; k++)
                acc += x[(o * n + k) * inner + j];
            y[o * inner + j] = (float)acc;
        }
}

/* ---- shapes and buffers --------------------------------------------------- */

/* The dims of v for T tokens (the symbolic dim replaced by T); returns rank. */
static int shape_of(const ir_value *v, int64_t T, int64_t d[IR_MAX_RANK])
{
    for (int i = 0; i < v->type.rank; i++)
        d[i] = v->type.dims[i] == IR_DIM_T ? T : v->type.dims[i];
    return v->type.rank;
}

static int64_t prod(const int64_t *d, int from, int to)
{
    int64_t n = 1;
    for (int i = from; i < to; i++)
        n *= d[i];
    return n;
}

static int64_t numel_of(const ir_value *v, int64_t T)
{
    int64_t d[IR_MAX_RANK];
    int r = shape_of(v, T, d);
    return prod(d, 0, r);
}

static int is_i32(const ir_value *v) { return v->type.dtype == IR_DTYPE_I32; }

static float *fbuf(const rt_interp *in, const ir_value *v) { return (float *)in->data[v->id]; }
static int32_t *ibuf(const rt_interp *in, const ir_value *v) { return (int32_t *)in->data[v->id]; }

/* The name an error about op names it by: its first result. */
static const char *op_name(const ir_op *op)
{
    return op->n_out > 0 && op->out[0] ? op->out[0]->name : ir_op_name(op->kind);
}

/* ---- attributes ----------------------------------------------------------- */

/* A numeric attribute read as a double whether written as int or float. */
static int attr_num(const ir_op *op, const char *key, double *out)
{
    const ir_attr *a = ir_op_attr(op, key);
    if (!a)
        return 0;
    if (a->kind == IR_ATTR_FLOAT)
        *out = a->f;
    else if (a->kind == IR_ATTR_INT)
        *out = (double)a->i;
    else
        return 0;
    return 1;
}

static double attr_num_or(const ir_op *op, const char *key, double dflt)
{
    double v;
    return attr_num(op, key, &v) ? v : dflt;
}

static moec_status attr_num_req(const ir_op *op, const char *key, double *out)
{
    if (!attr_num(op, key, out))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s needs a numeric attribute %s", op_name(op),
                        ir_op_name(op->kind), key);
    return MOEC_OK;
}

static moec_status attr_int_req(const ir_op *op, const char *key, int64_t *out)
{
    const ir_attr *a = ir_op_attr(op, key);
    if (!a || a->kind != IR_ATTR_INT)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s needs an int attribute %s", op_name(op),
                        ir_op_name(op->kind), key);
    *out = a->i;
    return MOEC_OK;
}

/* ---- elementwise and data movement ---------------------------------------- */

static moec_status op_embedding(rt_interp *in, const ir_op *op, int T)
{
    int64_t d[IR_MAX_RANK];
    if (shape_of(op->in[1], T, d) != 2)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: embedding table %s is not 2-D", op_name(op),
                        op->in[1]->name);
    int64_t V = d[0], H = d[1];
    if (numel_of(op->in[0], T) != T || numel_of(op->out[0], T) != (int64_t)T * H)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: embedding wants ids [T] and result [T, %lld]",
                        op_name(op), (long long)H);
    /* a vocab-parallel rank's table: rows [start, start + V) of `vocab` ids;
     * an id another rank holds reads as zeros (its all_reduce adds them) */
    int64_t start = (int64_t)attr_num_or(op, "vocab_start", 0);
    int64_t vocab = (int64_t)attr_num_or(op, "vocab_size", (double)V);
    const int32_t *ids = ibuf(in, op->in[0]);
    const float *table = fbuf(in, op->in[1]);
    float *y = fbuf(in, op->out[0]);
    for (int t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= vocab)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "%s: token id %d is outside the vocabulary [0, %lld) of %s",
                            op_name(op), (int)ids[t], (long long)vocab, op->in[1]->name);
        int64_t row = ids[t] - start;
        if (row >= 0 && row < V)
            memcpy(y + (int64_t)t * H, table + row * H, (size_t)H * sizeof(float));
        else
            memset(y + (int64_t)t * H, 0, (size_t)H * sizeof(float));
    }
    return MOEC_OK;
}

/* y = x / sqrt(mean(x^2) + eps) * w over rows of D: rms_norm and add_rms_norm. */
static void rms_norm_rows(const float *x, const float *w, float *y, int64_t rows, int64_t D,
                          double eps)
{
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * D;
        double ss = 0;
        for (int64_t j = 0; j < D; j++)
            ss += (double)xr[j] * xr[j];
        float var = (float)(ss / (double)D);
        float inv = 1.0f / sqrtf(var + (float)eps);
        for (int64_t j = 0; j < D; j++)
            y[i * D + j] = w[j] * (xr[j] * inv);
    }
}

static moec_status op_rms_norm(rt_interp *in, const ir_op *op, int T)
{
    double eps;
    MOEC_TRY(attr_num_req(op, "eps", &eps));
    int64_t d[IR_MAX_RANK];
    int r = shape_of(op->in[0], T, d);
    if (r < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: rms_norm of a scalar", op_name(op));
    int64_t D = d[r - 1], rows = prod(d, 0, r - 1);
    if (numel_of(op->in[1], T) != D || numel_of(op->out[0], T) != rows * D)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: rms_norm weight %s must have %lld elements",
                        op_name(op), op->in[1]->name, (long long)D);
    rms_norm_rows(fbuf(in, op->in[0]), fbuf(in, op->in[1]), fbuf(in, op->out[0]), rows, D, eps);
    return MOEC_OK;
}

/* sum = a + alpha * b (rounded to fp32, as add leaves it), then normed =
 * rms_norm(sum, w): bit for bit the add and the rms_norm it replaces. With
 * a second addend c, b + c first (rounded to fp32): add(b, c), then that.
 * A b of [T, K, D] (an unsummed moe_routed's) is first summed over K as
 * moe_routed sums (in double, in k order, then fp32) and rounded as its
 * summed result was stored. */
static moec_status op_add_rms_norm(rt_interp *in, const ir_op *op, int T)
{
    double eps;
    MOEC_TRY(attr_num_req(op, "eps", &eps));
    int64_t d[IR_MAX_RANK], db[IR_MAX_RANK];
    if (shape_of(op->in[0], T, d) != 2)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: add_rms_norm wants a [T, D]", op_name(op));
    int64_t rows = d[0], D = d[1];
    int rb = shape_of(op->in[1], T, db);
    int64_t kb = rb == 3 ? db[1] : 1;
    if (numel_of(op->in[1], T) != rows * kb * D || numel_of(op->in[2], T) != D ||
        numel_of(op->out[0], T) != rows * D || numel_of(op->out[1], T) != rows * D)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: add_rms_norm wants b [T, %lld] and weight %s of %lld elements",
                        op_name(op), (long long)D, op->in[2]->name, (long long)D);
    if (op->n_in == 4 && numel_of(op->in[3], T) != rows * D)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: add_rms_norm wants c [T, %lld]", op_name(op),
                        (long long)D);
    const float *a = fbuf(in, op->in[0]), *b = fbuf(in, op->in[1]);
    const float *c = op->n_in == 4 ? fbuf(in, op->in[3]) : NULL;
    float *sum = fbuf(in, op->out[0]), *bsum = NULL;
    if (rb == 3) {
        bsum = malloc((size_t)(rows * D) * sizeof(float) + 1);
        if (!bsum)
            return MOEC_ERR(MOEC_ERR_OOM, "%s: no memory for the sum over k", op_name(op));
        sum_middle(b, bsum, rows, kb, D);
        round_as(in, IR_OP_MOE_ROUTED, bsum, rows * D);
        b = bsum;
    }
    float alpha = (float)attr_num_or(op, "alpha", 1.0);
    for (int64_t i = 0; i < rows * D; i++) {
        float bc = c ? b[i] + c[i] : b[i]; /* add(b, c), rounded to fp32 */
        sum[i] = a[i] + alpha * bc;
    }
    free(bsum);
    rms_norm_rows(sum, fbuf(in, op->in[2]), fbuf(in, op->out[1]), rows, D, eps);
    return MOEC_OK;
}

/* LayerNorm over the last dim, as torch computes it in fp32: mean and
 * (biased) variance of the row, then (x - mean) / sqrt(var + eps) * w + b. */
/* y [rows, D] = LayerNorm of x's rows with w and b: the mean and biased
 * variance in fp32 as torch's; layer_norm and dsa_prologue_k. y may be x. */
static void layer_norm_rows(const float *x, const float *w, const float *b, float *y,
                            int64_t rows, int64_t D, double eps)
{
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * D;
        double s = 0, ss = 0;
        for (int64_t j = 0; j < D; j++)
            s += xr[j];
        float mean = (float)(s / (double)D);
        for (int64_t j = 0; j < D; j++)
            ss += (double)(xr[j] - mean) * (xr[j] - mean);
        float inv = 1.0f / sqrtf((float)(ss / (double)D) + (float)eps);
        for (int64_t j = 0; j < D; j++)
            y[i * D + j] = (xr[j] - mean) * inv * w[j] + b[j];
    }
}

static moec_status op_layer_norm(rt_interp *in, const ir_op *op, int T)
{
    double eps;
    MOEC_TRY(attr_num_req(op, "eps", &eps));
    int64_t d[IR_MAX_RANK];
    int r = shape_of(op->in[0], T, d);
    if (r < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: layer_norm of a scalar", op_name(op));
    int64_t D = d[r - 1], rows = prod(d, 0, r - 1);
    if (numel_of(op->in[1], T) != D || numel_of(op->in[2], T) != D ||
        numel_of(op->out[0], T) != rows * D)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: layer_norm weight %s and bias %s must have %lld elements",
                        op_name(op), op->in[1]->name, op->in[2]->name, (long long)D);
    layer_norm_rows(fbuf(in, op->in[0]), fbuf(in, op->in[1]), fbuf(in, op->in[2]),
                    fbuf(in, op->out[0]), rows, D, eps);
    return MOEC_OK;
}

static moec_status op_linear(rt_interp *in, const ir_op *op, int T)
{
    int64_t dx[IR_MAX_RANK], dw[IR_MAX_RANK];
    int rx = shape_of(op->in[0], T, dx), rw = shape_of(op->in[1], T, dw);
    if (rx != 2 || rw != 2)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: linear wants x [T, K] and w [N, K]",
                        op_name(op));
    /* act = "silu_mul": x is [T, 2K], silu_mul(x) rounded as its own
     * result was stored, then the product */
    int act = ir_op_attr_str(op, "act", NULL) != NULL;
    if (rx == 2 && act && dx[1] == 2 * dw[1])
        dx[1] = dw[1];
    if (rx == 2 && dx[1] != dw[1])
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: linear wants x [T, K] and w [N, K]",
                        op_name(op));
    int64_t rows = dx[0], K = dx[1], N = dw[0];
    const float *b = NULL;
    if (op->n_in > 2 && op->in[2]) {
        if (numel_of(op->in[2], T) != N)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: bias %s must have %lld elements",
                            op_name(op), op->in[2]->name, (long long)N);
        b = fbuf(in, op->in[2]);
    }
    if (numel_of(op->out[0], T) != rows * N)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: result must be [T, %lld]", op_name(op),
                        (long long)N);
    const float *x = fbuf(in, op->in[0]), *w = fbuf(in, op->in[1]);
    float *h = NULL;
    if (act) {
        h = malloc((size_t)(rows * K) * sizeof(float) + 1);
        if (!h)
            return MOEC_ERR(MOEC_ERR_OOM, "%s: no memory for silu_mul", op_name(op));
        for (int64_t t = 0; t < rows; t++)
            for (int64_t k = 0; k < K; k++)
                h[t * K + k] = silu(x[t * 2 * K + k]) * x[t * 2 * K + K + k];
        round_as(in, IR_OP_SILU_MUL, h, rows * K);
        x = h;
    }
    float *y = fbuf(in, op->out[0]);
    float alpha = (float)attr_num_or(op, "alpha", 1.0);
    for (int64_t t = 0; t < rows; t++) {
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)x[t * K + k] * w[n * K + k];
            float v = (float)acc;
            y[t * N + n] = alpha * (b ? v + b[n] : v);
        }
    }
    free(h);
    return MOEC_OK;
}

static moec_status op_reshape(rt_interp *in, const ir_op *op, int T)
{
    int64_t n = numel_of(op->in[0], T);
    if (n != numel_of(op->out[0], T) || is_i32(op->in[0]) != is_i32(op->out[0]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: reshape of %s changes the element count or kind",
                        op_name(op), op->in[0]->name);
    /* memmove: a memory plan may give a reshape its operand's place */
    memmove(in->data[op->out[0]->id], in->data[op->in[0]->id], (size_t)n * 4);
    return MOEC_OK;
}

static moec_status op_slice(rt_interp *in, const ir_op *op, int T)
{
    int64_t axis, start, size;
    MOEC_TRY(attr_int_req(op, "axis", &axis));
    MOEC_TRY(attr_int_req(op, "start", &start));
    MOEC_TRY(attr_int_req(op, "size", &size));
    int64_t d[IR_MAX_RANK];
    int r = shape_of(op->in[0], T, d);
    if (axis < 1 || axis >= r || start < 0 || size < 0 || start + size > d[axis])
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: slice axis %lld [%lld, %lld) is outside %s", op_name(op),
                        (long long)axis, (long long)start, (long long)(start + size),
                        op->in[0]->name);
    int64_t outer = prod(d, 0, (int)axis), inner = prod(d, (int)axis + 1, r);
    if (numel_of(op->out[0], T) != outer * size * inner || is_i32(op->in[0]) != is_i32(op->out[0]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: slice result has the wrong shape", op_name(op));
    const char *x = in->data[op->in[0]->id];
    char *y = in->data[op->out[0]->id];
    size_t row = (size_t)(size * inner) * 4;
    for (int64_t o = 0; o < outer; o++)
        memcpy(y + (size_t)o * row, x + (size_t)((o * d[axis] + start) * inner) * 4, row);
    return MOEC_OK;
}

static moec_status op_concat(rt_interp *in, const ir_op *op, int T)
{
    int64_t axis;
    MOEC_TRY(attr_int_req(op, "axis", &axis));
    int64_t dy[IR_MAX_RANK];
    int r = shape_of(op->out[0], T, dy);
    if (axis < 1 || axis >= r)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: concat axis %lld is outside rank %d",
                        op_name(op), (long long)axis, r);
    int64_t outer = prod(dy, 0, (int)axis), inner = prod(dy, (int)axis + 1, r), total = 0;
    for (int i = 0; i < op->n_in; i++) {
        int64_t d[IR_MAX_RANK];
        int ri = shape_of(op->in[i], T, d);
        int ok = ri == r && is_i32(op->in[i]) == is_i32(op->out[0]);
        for (int j = 0; ok && j < r; j++)
            ok = j == axis || d[j] == dy[j];
        if (!ok)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: concat operand %s does not fit the result",
                            op_name(op), op->in[i]->name);
        total += d[axis];
    }
    if (total != dy[axis])
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: concat operands sum to %lld along axis %lld, not %lld",
                        op_name(op), (long long)total, (long long)axis, (long long)dy[axis]);
    char *y = in->data[op->out[0]->id];
    size_t yrow = (size_t)(dy[axis] * inner) * 4, off = 0;
    for (int i = 0; i < op->n_in; i++) {
        int64_t d[IR_MAX_RANK];
        shape_of(op->in[i], T, d);
        const char *x = in->data[op->in[i]->id];
        size_t row = (size_t)(d[axis] * inner) * 4;
        for (int64_t o = 0; o < outer; o++)
            memcpy(y + (size_t)o * yrow + off, x + (size_t)o * row, row);
        off += row;
    }
    return MOEC_OK;
}

/* Pads a shape to 4 dims with leading 1s. */
static void pad4(int r, const int64_t *d, int64_t out[4])
{
    for (int i = 0; i < 4; i++)
        out[i] = i < 4 - r ? 1 : d[i - (4 - r)];
}

/* Strides (in elements) of a row-major shape of 4 dims, 0 where src's dim is
 * 1 and dst's is not (broadcast). */
static int bcast_strides(const int64_t src[4], const int64_t dst[4], int64_t st[4])
{
    int64_t s = 1;
    for (int i = 3; i >= 0; i--) {
        if (src[i] != dst[i] && src[i] != 1)
            return 0;
        st[i] = src[i] == 1 ? 0 : s;
        s *= src[i];
    }
    return 1;
}

static moec_status op_expand(rt_interp *in, const ir_op *op, int T)
{
    int64_t dx[IR_MAX_RANK], dy[IR_MAX_RANK], x4[4], y4[4], st[4];
    int rx = shape_of(op->in[0], T, dx), ry = shape_of(op->out[0], T, dy);
    pad4(rx, dx, x4);
    pad4(ry, dy, y4);
    if (rx != ry || !bcast_strides(x4, y4, st) || is_i32(op->in[0]) != is_i32(op->out[0]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s does not expand to the result type",
                        op_name(op), op->in[0]->name);
    const char *x = in->data[op->in[0]->id];
    char *y = in->data[op->out[0]->id];
    int64_t o = 0;
    for (int64_t a = 0; a < y4[0]; a++)
        for (int64_t b = 0; b < y4[1]; b++)
            for (int64_t c = 0; c < y4[2]; c++)
                for (int64_t e = 0; e < y4[3]; e++, o++)
                    memcpy(y + o * 4, x + (a * st[0] + b * st[1] + c * st[2] + e * st[3]) * 4, 4);
    return MOEC_OK;
}

/* add (a + alpha * b) and mul: b broadcasts where its dim is 1. */
static moec_status op_binary(rt_interp *in, const ir_op *op, int T)
{
    int64_t da[IR_MAX_RANK], db[IR_MAX_RANK], a4[4], b4[4], st[4];
    int ra = shape_of(op->in[0], T, da), rb = shape_of(op->in[1], T, db);
    pad4(ra, da, a4);
    pad4(rb, db, b4);
    if (ra != rb || !bcast_strides(b4, a4, st) || numel_of(op->out[0], T) != prod(da, 0, ra))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s does not broadcast to %s", op_name(op),
                        op->in[1]->name, op->in[0]->name);
    const float *a = fbuf(in, op->in[0]), *b = fbuf(in, op->in[1]);
    float *y = fbuf(in, op->out[0]);
    int mul = op->kind == IR_OP_MUL;
    float alpha = mul ? 1.0f : (float)attr_num_or(op, "alpha", 1.0);
    int64_t o = 0;
    for (int64_t i = 0; i < a4[0]; i++)
        for (int64_t j = 0; j < a4[1]; j++)
            for (int64_t k = 0; k < a4[2]; k++)
                for (int64_t l = 0; l < a4[3]; l++, o++) {
                    float bv = b[i * st[0] + j * st[1] + k * st[2] + l * st[3]];
                    y[o] = mul ? a[o] * bv : a[o] + alpha * bv;
                }
    return MOEC_OK;
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* silu and sigmoid. */
static moec_status op_unary(rt_interp *in, const ir_op *op, int T)
{
    int64_t n = numel_of(op->in[0], T);
    if (n != numel_of(op->out[0], T))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: result differs in size from %s", op_name(op),
                        op->in[0]->name);
    const float *x = fbuf(in, op->in[0]);
    float *y = fbuf(in, op->out[0]);
    for (int64_t i = 0; i < n; i++)
        y[i] = op->kind == IR_OP_SILU ? silu(x[i]) : sigmoid(x[i]);
    return MOEC_OK;
}

static moec_status op_reduce_sum(rt_interp *in, const ir_op *op, int T)
{
    int64_t axis;
    MOEC_TRY(attr_int_req(op, "axis", &axis));
    int64_t d[IR_MAX_RANK];
    int r = shape_of(op->in[0], T, d);
    if (axis < 1 || axis >= r)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: reduce_sum axis %lld is outside rank %d",
                        op_name(op), (long long)axis, r);
    int64_t outer = prod(d, 0, (int)axis), n = d[axis], inner = prod(d, (int)axis + 1, r);
    if (numel_of(op->out[0], T) != outer * inner)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: reduce_sum result has the wrong shape",
                        op_name(op));
    sum_middle(fbuf(in, op->in[0]), fbuf(in, op->out[0]), outer, n, inner);
    return MOEC_OK;
}

/* ---- rope ----------------------------------------------------------------- */

/* inv_freq[0..D/2-1] for op's attributes, in fp32 step by step as
 * transformers' _compute_default/linear/yarn_parameters compute it. */
static moec_status rope_inv_freq(const ir_op *op, int64_t D, float *inv_freq)
{
    double theta;
    MOEC_TRY(attr_num_req(op, "theta", &theta));
    const char *scaling = ir_op_attr_str(op, "scaling", "none");
    int64_t half = D / 2;
    int yarn = strcmp(scaling, "yarn") == 0;
    if (!yarn && strcmp(scaling, "none") != 0 && strcmp(scaling, "linear") != 0)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s: rope scaling \"%s\" (want none, linear or yarn)",
                        op_name(op), scaling);
    double factor = 1.0, low = 0, high = 0;
    if (strcmp(scaling, "none") != 0)
        MOEC_TRY(attr_num_req(op, "factor", &factor));
    if (yarn) {
        MOEC_TRY(attr_num_req(op, "yarn_low", &low));
        MOEC_TRY(attr_num_req(op, "yarn_high", &high));
        if (low == high)
            high += 0.001;
    }
    for (int64_t i = 0; i < half; i++) {
        float pos_freq = powf((float)theta, (float)(2 * i) / (float)D);
        inv_freq[i] = 1.0f / pos_freq;
        if (strcmp(scaling, "linear") == 0)
            inv_freq[i] /= (float)factor;
        if (!yarn)
            continue;
        float interp = 1.0f / ((float)factor * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float extrap = 1.0f - ramp;
        inv_freq[i] = interp * (1.0f - extrap) + inv_freq[i] * extrap;
    }
    return MOEC_OK;
}

/* y [T, H, D] = x rotated by op's rope attributes (style, theta, scaling,
 * attn_factor), the first rd channels of each head as a head of rd, the
 * rest copied: rope, and the rotations of the MLA prologue ops. y may be x
 * (each pair is read before it is written). */
static moec_status rope_rows(const ir_op *op, const float *x, const int32_t *pos, float *y, int T,
                             int64_t H, int64_t D, int64_t rd)
{
    const char *style = ir_op_attr_str(op, "style", NULL);
    if (!style || (strcmp(style, "interleave") != 0 && strcmp(style, "neox") != 0))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: rope style must be \"interleave\" or \"neox\", not %s%s%s",
                        op_name(op), style ? "\"" : "", style ? style : "absent",
                        style ? "\"" : "");
    int neox = strcmp(style, "neox") == 0;
    int64_t half = rd / 2;
    float af = (float)attr_num_or(op, "attn_factor", 1.0);
    float *inv_freq = malloc((size_t)half * sizeof(float) + 1);
    if (!inv_freq)
        return MOEC_ERR(MOEC_ERR_OOM, "%s: no memory for rope frequencies", op_name(op));
    moec_status st = rope_inv_freq(op, rd, inv_freq);
    if (st != MOEC_OK) {
        free(inv_freq);
        return st;
    }
    for (int64_t r = 0; r < (int64_t)T * H && rd < D && x != y; r++)
        memcpy(y + r * D + rd, x + r * D + rd, (size_t)(D - rd) * sizeof(float));
    for (int t = 0; t < T; t++) {
        for (int64_t i = 0; i < half; i++) {
            float angle = (float)pos[t] * inv_freq[i];
            float c = cosf(angle) * af, s = sinf(angle) * af;
            int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
            for (int64_t h = 0; h < H; h++) {
                const float *xr = x + ((int64_t)t * H + h) * D;
                float *yr = y + ((int64_t)t * H + h) * D;
                float x0 = xr[i0], x1 = xr[i1];
                yr[i0] = x0 * c - x1 * s;
                yr[i1] = x1 * c + x0 * s;
            }
        }
    }
    free(inv_freq);
    return MOEC_OK;
}

static moec_status op_rope(rt_interp *in, const ir_op *op, int T)
{
    int64_t d[IR_MAX_RANK];
    if (shape_of(op->in[0], T, d) != 3 || d[2] % 2 != 0 || numel_of(op->in[1], T) != T ||
        numel_of(op->out[0], T) != prod(d, 0, 3))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: rope wants x [T, H, D] with D even, pos [T]",
                        op_name(op));
    /* rotary_dim: the first channels rotate as a head of that size; the rest pass */
    int64_t H = d[1], D = d[2], rd = ir_op_attr_int(op, "rotary_dim", D);
    if (rd < 2 || rd > D || rd % 2)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: rope rotary_dim %lld out of [2, %lld] or odd",
                        op_name(op), (long long)rd, (long long)D);
    return rope_rows(op, fbuf(in, op->in[0]), ibuf(in, op->in[1]), fbuf(in, op->out[0]), T, H, D,
                     rd);
}

/* ---- the MLA prologue ------------------------------------------------------ */

/* Copies n columns from column `col` of every row of x (rows of stride
 * `stride`) into y, rows of n: a slice along dim 1. */
static void gather_cols(const float *x, int64_t stride, int64_t col, int64_t n, int64_t rows,
                        float *y)
{
    for (int64_t t = 0; t < rows; t++)
        memcpy(y + t * n, x + t * stride + col, (size_t)n * sizeof(float));
}

/* mla_prologue, mla_prologue_kv and mla_prologue_q: exactly the slices,
 * rms_norms and ropes they replace (docs/IR.md): each section of a row of x
 * is sliced into its result, which is then normalized or rotated in place
 * by the functions rms_norm and rope use. */
static moec_status op_mla_prologue(rt_interp *in, const ir_op *op, int T)
{
    int64_t d[IR_MAX_RANK];
    if (shape_of(op->in[0], T, d) != 2 || numel_of(op->in[1], T) != T)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s wants x [T, N] and pos [T]", op_name(op),
                        ir_op_name(op->kind));
    int64_t N = d[1], dr = ir_op_attr_int(op, "qk_rope_head_dim", 0);
    int heads = op->kind != IR_OP_MLA_PROLOGUE_KV, kv = op->kind != IR_OP_MLA_PROLOGUE_Q;
    int64_t H = heads ? ir_op_attr_int(op, "heads", 0) : 0;
    int64_t dn = heads ? ir_op_attr_int(op, "qk_nope_head_dim", 0) : 0;
    int64_t r = kv ? numel_of(op->in[2], T) : 0;
    int64_t qr = op->kind == IR_OP_MLA_PROLOGUE_KV ? numel_of(op->in[3], T) : 0;
    int64_t q_cols = heads ? H * (dn + dr) : qr;
    double eps = 0;
    if (kv)
        MOEC_TRY(attr_num_req(op, "eps", &eps));
    int o = 0; /* the result being written */
    if (dr < 2 || dr % 2 || (heads && (H < 1 || dn < 1)) || q_cols + (kv ? r + dr : 0) > N ||
        (heads &&
         (numel_of(op->out[0], T) != T * H * dn || numel_of(op->out[1], T) != T * H * dr)) ||
        (!heads && numel_of(op->out[0], T) != T * qr) ||
        (kv && (numel_of(op->out[op->n_out - 2], T) != T * r ||
                numel_of(op->out[op->n_out - 1], T) != T * dr)))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s: x [T, %lld] does not hold its sections",
                        op_name(op), ir_op_name(op->kind), (long long)N);
    const float *x = fbuf(in, op->in[0]);
    const int32_t *pos = ibuf(in, op->in[1]);
    if (heads) {
        /* q [T, H, dn + dr] = reshape(slice(x)); q_nope, q_pe its slices; rope(q_pe) */
        float *q_nope = fbuf(in, op->out[o++]), *q_pe = fbuf(in, op->out[o++]);
        for (int t = 0; t < T; t++) {
            gather_cols(x + (int64_t)t * N, dn + dr, 0, dn, H, q_nope + (int64_t)t * H * dn);
            gather_cols(x + (int64_t)t * N, dn + dr, dn, dr, H, q_pe + (int64_t)t * H * dr);
        }
        MOEC_TRY(rope_rows(op, q_pe, pos, q_pe, T, H, dr, dr));
    } else {
        float *q_a = fbuf(in, op->out[o++]);
        gather_cols(x, N, 0, qr, T, q_a);
        rms_norm_rows(q_a, fbuf(in, op->in[3]), q_a, T, qr, eps);
    }
    if (kv) {
        float *kv_c = fbuf(in, op->out[o++]), *k_pe = fbuf(in, op->out[o++]);
        gather_cols(x, N, q_cols, r, T, kv_c);
        rms_norm_rows(kv_c, fbuf(in, op->in[2]), kv_c, T, r, eps);
        gather_cols(x, N, q_cols + r, dr, T, k_pe);
        MOEC_TRY(rope_rows(op, k_pe, pos, k_pe, T, 1, dr, dr));
    }
    return MOEC_OK;
}

/* dsa_prologue_k: exactly the slice, layer_norm and rope it replaces
 * (docs/IR.md): x's columns [col, col + D) sliced into the result, then
 * normalized and rotated there in place, as a head of D at pos. */
static moec_status op_dsa_prologue_k(rt_interp *in, const ir_op *op, int T)
{
    int64_t d[IR_MAX_RANK], col = ir_op_attr_int(op, "col", -1);
    double eps;
    MOEC_TRY(attr_num_req(op, "eps", &eps));
    int64_t D = numel_of(op->in[2], T), rd = ir_op_attr_int(op, "rotary_dim", D);
    if (shape_of(op->in[0], T, d) != 2 || numel_of(op->in[1], T) != T ||
        numel_of(op->in[3], T) != D || numel_of(op->out[0], T) != T * D || col < 0 ||
        col + D > d[1] || D % 2 || rd < 2 || rd > D || rd % 2)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: dsa_prologue_k wants x [T, N] holding D columns at col, pos [T], "
                        "weight and bias [D] (D even) and an even rotary_dim <= D",
                        op_name(op));
    float *k = fbuf(in, op->out[0]);
    gather_cols(fbuf(in, op->in[0]), d[1], col, D, T, k);
    layer_norm_rows(k, fbuf(in, op->in[2]), fbuf(in, op->in[3]), k, T, D, eps);
    return rope_rows(op, k, ibuf(in, op->in[1]), k, T, 1, D, rd);
}

/* attn_prologue: exactly the slices, reshapes, rms_norms and ropes it
 * replaces (docs/IR.md): q's, k's and v's columns of x sliced into the
 * results; q and k normalized in place by rms_norm's function, then rotated
 * in place by rope's; each intermediate rounded as the op it stands for
 * stored it, under rt_interp_round_storage. */
static moec_status op_attn_prologue(rt_interp *in, const ir_op *op, int T)
{
    int64_t d[IR_MAX_RANK];
    int64_t H = ir_op_attr_int(op, "heads", 0), Hkv = ir_op_attr_int(op, "kv_heads", 0);
    int64_t D = ir_op_attr_int(op, "head_dim", 0), rd = ir_op_attr_int(op, "rotary_dim", D);
    int norms = op->n_in == 4;
    double eps = 0;
    if (norms)
        MOEC_TRY(attr_num_req(op, "eps", &eps));
    if (shape_of(op->in[0], T, d) != 2 || numel_of(op->in[1], T) != T || H < 1 || Hkv < 1 ||
        D < 2 || D % 2 || rd < 2 || rd > D || rd % 2 || (H + 2 * Hkv) * D > d[1] ||
        numel_of(op->out[0], T) != T * H * D || numel_of(op->out[1], T) != T * Hkv * D ||
        numel_of(op->out[2], T) != T * Hkv * D ||
        (norms && (numel_of(op->in[2], T) != D || numel_of(op->in[3], T) != D)))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: attn_prologue wants x [T, N] holding (heads + 2 kv_heads) heads of "
                        "an even head_dim, pos [T], norm weights [head_dim] and an even "
                        "rotary_dim <= head_dim",
                        op_name(op));
    const float *x = fbuf(in, op->in[0]);
    const int32_t *pos = ibuf(in, op->in[1]);
    const int64_t heads[2] = {H, Hkv};
    int64_t col = 0;
    for (int i = 0; i < 2; i++) {
        float *y = fbuf(in, op->out[i]);
        int64_t n = heads[i] * D;
        gather_cols(x, d[1], col, n, T, y);
        round_as(in, IR_OP_SLICE, y, T * n);
        col += n;
        if (norms) {
            rms_norm_rows(y, fbuf(in, op->in[2 + i]), y, T * heads[i], D, eps);
            round_as(in, IR_OP_RMS_NORM, y, T * n);
        }
        MOEC_TRY(rope_rows(op, y, pos, y, T, heads[i], D, rd));
    }
    gather_cols(x, d[1], col, Hkv * D, T, fbuf(in, op->out[2]));
    round_as(in, IR_OP_SLICE, fbuf(in, op->out[2]), T * Hkv * D);
    return MOEC_OK;
}

/* ---- attention ------------------------------------------------------------ */

/* The cache row of position p of token t's sequence, through the page map. */
static int64_t kv_row(const rt_interp *in, int t, int64_t p)
{
    const rt_interp_pages *pg = &in->pages;
    int64_t r = pg->row ? pg->row[t] : 0;
    return (int64_t)pg->table[r * pg->max_pages + p / in->page_size] * in->page_size +
           p % in->page_size;
}

/* Writes token t's k (nk floats) and v (nv floats; none for dsa_topk's
 * keys) to the rows of its position in the caches of op. */
static void kv_store(rt_interp *in, const ir_op *op, int t, int32_t pos, const float *k,
                     int64_t nk, const float *v, int64_t nv)
{
    int64_t row = kv_row(in, t, pos);
    memcpy(in->k_cache[op->id] + row * nk, k + (int64_t)t * nk, (size_t)nk * sizeof(float));
    if (nv)
        memcpy(in->v_cache[op->id] + row * nv, v + (int64_t)t * nv, (size_t)nv * sizeof(float));
    in->kv_written[op->id][row] = 1;
}

/* [lo, hi] of the cached positions token t attends to, their cache rows in
 * in->kv_rows[0..hi - lo], after checking they were all written. */
static moec_status attend_range(rt_interp *in, const ir_op *op, int t, int32_t pos,
                                int64_t window, int64_t *lo, int64_t *hi)
{
    const unsigned char *written = in->kv_written[op->id];
    *hi = pos;
    *lo = 0;
    if (window > 0 && *hi - window + 1 > 0)
        *lo = *hi - window + 1;
    for (int64_t p = *lo; p <= *hi; p++) {
        in->kv_rows[p - *lo] = kv_row(in, t, p);
        if (!written[in->kv_rows[p - *lo]])
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "%s: token at position %d attends to position %lld, which no "
                            "forward has written to the KV cache",
                            op_name(op), (int)pos, (long long)p);
    }
    return MOEC_OK;
}

/* One head's end of attention: the scores sc[0 .. n) (their largest mx)
 * become softmax weights in place, and yr[j] = the weighted sum of
 * v[rows[i] * vstride + j] over i, for j < dv (v: the head's values in
 * the cache, vstride apart a cache row; MLA's are its kv_c rows). */
static void attend_values(double *sc, int64_t n, double mx, const int64_t *rows, const float *v,
                          int64_t vstride, int64_t dv, float *yr)
{
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        sc[i] = exp(sc[i] - mx);
        sum += sc[i];
    }
    for (int64_t j = 0; j < dv; j++) {
        double acc = 0;
        for (int64_t i = 0; i < n; i++)
            acc += sc[i] * v[rows[i] * vstride + j];
        yr[j] = (float)(acc / sum);
    }
}

/* The cached positions token t (at position pos) attends to, their cache
 * rows into in->kv_rows[0..*n-1]: with a token selection (operand sel_at,
 * dsa_topk's result [T, K]) its first min(K, pos + 1) entries, each a
 * distinct cached position <= pos; without one, [lo, pos] by the window. */
static moec_status attend_positions(rt_interp *in, const ir_op *op, int t, int32_t pos,
                                    int64_t window, int sel_at, int64_t *n)
{
    if (op->n_in <= sel_at) {
        int64_t lo, hi;
        MOEC_TRY(attend_range(in, op, t, pos, window, &lo, &hi));
        *n = hi - lo + 1;
        return MOEC_OK;
    }
    int64_t K = op->in[sel_at]->type.dims[1];
    if (op->in[sel_at]->type.rank != 2 || K < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: selection %s must be i32 [T, K]", op_name(op),
                        op->in[sel_at]->name);
    *n = K < (int64_t)pos + 1 ? K : (int64_t)pos + 1;
    const int32_t *sel = ibuf(in, op->in[sel_at]) + (int64_t)t * K;
    const unsigned char *written = in->kv_written[op->id];
    moec_status st = MOEC_OK;
    int64_t i = 0;
    for (; i < *n && st == MOEC_OK; i++) {
        int32_t p = sel[i];
        int ok = p >= 0 && p <= pos && !in->mark[p];
        if (ok) {
            in->kv_rows[i] = kv_row(in, t, p);
            ok = written[in->kv_rows[i]];
        }
        if (!ok)
            st = MOEC_ERR(MOEC_ERR_INVALID_ARG,
                          "%s: token at position %d: selection %s[%d][%lld] = %d is not a "
                          "distinct cached position <= %d",
                          op_name(op), (int)pos, op->in[sel_at]->name, t, (long long)i, (int)p,
                          (int)pos);
        else
            in->mark[p] = 1;
    }
    for (int64_t j = 0; j < i; j++)
        if (sel[j] >= 0 && sel[j] <= pos)
            in->mark[sel[j]] = 0;
    return st;
}

static moec_status op_attention(rt_interp *in, const ir_op *op, int T)
{
    double scale_d;
    MOEC_TRY(attr_num_req(op, "scale", &scale_d));
    int64_t window = ir_op_attr_int(op, "window", 0);
    int64_t dq[IR_MAX_RANK], dk[IR_MAX_RANK], dv[IR_MAX_RANK];
    int rq = shape_of(op->in[0], T, dq), rk = shape_of(op->in[1], T, dk),
        rv = shape_of(op->in[2], T, dv);
    if (rq != 3 || rk != 3 || rv != 3 || dq[0] != T || dk[0] != T || dv[0] != T ||
        dq[2] != dk[2] || dk[1] != dv[1] || dk[1] < 1 || dq[1] % dk[1] != 0 ||
        numel_of(op->in[3], T) != T || numel_of(op->out[0], T) != (int64_t)T * dq[1] * dv[2])
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: attention wants q [T, H, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv], "
                        "pos [T] with H a multiple of Hkv",
                        op_name(op));
    int64_t H = dq[1], Hkv = dk[1], Dk = dk[2], Dv = dv[2], group = H / Hkv;
    const float *q = fbuf(in, op->in[0]), *k = fbuf(in, op->in[1]), *v = fbuf(in, op->in[2]);
    const int32_t *pos = ibuf(in, op->in[3]);
    float *y = fbuf(in, op->out[0]);
    const float *kc = in->k_cache[op->id], *vc = in->v_cache[op->id];
    for (int t = 0; t < T; t++)
        kv_store(in, op, t, pos[t], k, Hkv * Dk, v, Hkv * Dv);
    float scale = (float)scale_d;
    double *sc = in->scores;
    const int64_t *rows = in->kv_rows;
    for (int t = 0; t < T; t++) {
        int64_t n;
        MOEC_TRY(attend_positions(in, op, t, pos[t], window, 4, &n));
        for (int64_t h = 0; h < H; h++) {
            const float *qr = q + ((int64_t)t * H + h) * Dk;
            int64_t kvh = h / group;
            double mx = -INFINITY;
            for (int64_t i = 0; i < n; i++) {
                const float *kr = kc + (rows[i] * Hkv + kvh) * Dk;
                double dot = 0;
                for (int64_t j = 0; j < Dk; j++)
                    dot += (double)qr[j] * kr[j];
                sc[i] = (double)((float)dot * scale);
                if (sc[i] > mx)
                    mx = sc[i];
            }
            attend_values(sc, n, mx, rows, vc + kvh * Dv, Hkv * Dv, Dv,
                          y + ((int64_t)t * H + h) * Dv);
        }
    }
    return MOEC_OK;
}


/* ---- fused ops ------------------------------------------------------------ */

static moec_status op_silu_mul(rt_interp *in, const ir_op *op, int T)
{
    int64_t d[IR_MAX_RANK];
    int r = shape_of(op->in[0], T, d);
    if (r < 1 || d[r - 1] % 2 != 0 || numel_of(op->out[0], T) * 2 != prod(d, 0, r))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: silu_mul wants x [T, ..., 2I] and a result [T, ..., I]",
                        op_name(op));
    int64_t I = d[r - 1] / 2, rows = prod(d, 0, r - 1);
    const float *x = fbuf(in, op->in[0]);
    float *y = fbuf(in, op->out[0]);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < I; j++)
            y[i * I + j] = silu(x[i * 2 * I + j]) * x[i * 2 * I + I + j];
    return MOEC_OK;
}

/* fork and join: the value itself (streams only matter on the GPU). */
static moec_status op_copy(rt_interp *in, const ir_op *op, int T)
{
    int64_t n = numel_of(op->in[0], T);
    if (n != numel_of(op->out[0], T) || is_i32(op->in[0]) != is_i32(op->out[0]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s changes the type of %s", op_name(op),
                        ir_op_name(op->kind), op->in[0]->name);
    memmove(in->data[op->out[0]->id], in->data[op->in[0]->id], (size_t)n * 4);
    return MOEC_OK;
}

/* qk_nope_head_dim, v_head_dim and kv_b [H*(dn+dv), r] of an mla_*absorb op. */
static moec_status mla_kv_b_dims(const ir_op *op, int64_t H, int64_t *dn, int64_t *dv,
                                 int64_t *r)
{
    MOEC_TRY(attr_int_req(op, "qk_nope_head_dim", dn));
    MOEC_TRY(attr_int_req(op, "v_head_dim", dv));
    int64_t d[IR_MAX_RANK];
    if (shape_of(op->in[1], 0, d) != 2 || *dn < 1 || *dv < 1 || *dn > INT32_MAX ||
        *dv > INT32_MAX || H < 1 || H > INT32_MAX || d[0] != H * (*dn + *dv))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: %s wants kv_b %s of %lld * (%lld + %lld) rows", op_name(op),
                        ir_op_name(op->kind), op->in[1]->name, (long long)H, (long long)*dn,
                        (long long)*dv);
    *r = d[1];
    return MOEC_OK;
}

/* mla_qabsorb and mla_vabsorb, per token and head a product with a slice
 * of kv_b [H*(dn+dv), r] (in double): mla_qabsorb takes q_nope [T, H, dn]
 * through W_UK[h] (dn x r, the head's first dn rows) transposed to r
 * channels; mla_vabsorb takes o_c [T, H, r] through W_UV[h] (dv x r, the
 * dv rows after them) to dv channels. */
static moec_status op_mla_absorb(rt_interp *in, const ir_op *op, int T)
{
    int is_v = op->kind == IR_OP_MLA_VABSORB;
    const char *kind = ir_op_name(op->kind), *xname = is_v ? "o_c" : "q_nope";
    int64_t d[IR_MAX_RANK], dn = 0, dv = 0, r = 0;
    /* qabsorb with heads and head_stride: q [T, N], head h's channels at
       columns h * head_stride (the q projection read in place) */
    int64_t S = is_v ? 0 : ir_op_attr_int(op, "head_stride", 0);
    int rank = shape_of(op->in[0], T, d);
    if (S > 0 ? rank != 2 : rank != 3)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s wants %s [T, H, %s]%s", op_name(op), kind,
                        xname, is_v ? "r" : "dn", S > 0 ? " (with head_stride: q [T, N])" : "");
    int64_t H = S > 0 ? ir_op_attr_int(op, "heads", 0) : d[1];
    if (H < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s with head_stride wants heads >= 1",
                        op_name(op), kind);
    MOEC_TRY(mla_kv_b_dims(op, H, &dn, &dv, &r));
    int64_t n_in = is_v ? r : dn, n_out = is_v ? dv : r;
    if ((S > 0 ? S < dn || S > d[1] || H - 1 > (d[1] - dn) / S : d[2] != n_in) ||
        numel_of(op->out[0], T) != (int64_t)T * H * n_out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: %s wants %s [T, %lld, %lld] and a result [T, %lld, %lld]",
                        op_name(op), kind, xname, (long long)H, (long long)n_in, (long long)H,
                        (long long)n_out);
    /* x's row of token t and head h */
    int64_t x_t = S > 0 ? d[1] : H * n_in, x_h = S > 0 ? S : n_in;
    /* the weight of output k and input m is w[k * w_out + m * w_in] */
    int64_t w_first = is_v ? dn * r : 0, w_out = is_v ? r : 1, w_in = is_v ? 1 : r;
    const float *x = fbuf(in, op->in[0]), *kv_b = fbuf(in, op->in[1]);
    float *y = fbuf(in, op->out[0]);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const float *xr = x + t * x_t + h * x_h;
            const float *w = kv_b + h * (dn + dv) * r + w_first;
            for (int64_t k = 0; k < n_out; k++) {
                double acc = 0;
                for (int64_t m = 0; m < n_in; m++)
                    acc += (double)xr[m] * w[k * w_out + m * w_in];
                y[(t * H + h) * n_out + k] = (float)acc;
            }
        }
    return MOEC_OK;
}

/* Attention over the compressed MLA cache: kv_c [r] and k_pe [dr] per
 * position; logits scale * (q_c . kv_c[p] + q_pe . k_pe[p]), values kv_c[p]. */
static moec_status op_mla_attention(rt_interp *in, const ir_op *op, int T)
{
    double scale_d;
    MOEC_TRY(attr_num_req(op, "scale", &scale_d));
    int64_t window = ir_op_attr_int(op, "window", 0);
    int64_t dq[IR_MAX_RANK], dp[IR_MAX_RANK], dc[IR_MAX_RANK], dk[IR_MAX_RANK];
    int rq = shape_of(op->in[0], T, dq), rp = shape_of(op->in[1], T, dp),
        rc = shape_of(op->in[2], T, dc), rk = shape_of(op->in[3], T, dk);
    if (rq != 3 || rp != 3 || rc != 2 || rk != 3 || dq[0] != T || dp[0] != T || dc[0] != T ||
        dk[0] != T || dp[1] != dq[1] || dc[1] != dq[2] || dk[1] != 1 || dk[2] != dp[2] ||
        numel_of(op->in[4], T) != T || numel_of(op->out[0], T) != (int64_t)T * dq[1] * dq[2])
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: mla_attention wants q_c [T, H, r], q_pe [T, H, dr], kv_c [T, r], "
                        "k_pe [T, 1, dr], pos [T]",
                        op_name(op));
    int64_t H = dq[1], R = dq[2], Dr = dp[2];
    const float *qc = fbuf(in, op->in[0]), *qpe = fbuf(in, op->in[1]);
    const float *kvc = fbuf(in, op->in[2]), *kpe = fbuf(in, op->in[3]);
    const int32_t *pos = ibuf(in, op->in[4]);
    float *y = fbuf(in, op->out[0]);
    const float *cc = in->k_cache[op->id], *pc = in->v_cache[op->id];
    for (int t = 0; t < T; t++)
        kv_store(in, op, t, pos[t], kvc, R, kpe, Dr);
    float scale = (float)scale_d;
    double *sc = in->scores;
    const int64_t *rows = in->kv_rows;
    for (int t = 0; t < T; t++) {
        int64_t n;
        MOEC_TRY(attend_positions(in, op, t, pos[t], window, 5, &n));
        for (int64_t h = 0; h < H; h++) {
            const float *qr = qc + ((int64_t)t * H + h) * R;
            const float *qp = qpe + ((int64_t)t * H + h) * Dr;
            double mx = -INFINITY;
            for (int64_t i = 0; i < n; i++) {
                int64_t r = rows[i];
                double dot = 0;
                for (int64_t j = 0; j < R; j++)
                    dot += (double)qr[j] * cc[r * R + j];
                for (int64_t j = 0; j < Dr; j++)
                    dot += (double)qp[j] * pc[r * Dr + j];
                sc[i] = (double)((float)dot * scale);
                if (sc[i] > mx)
                    mx = sc[i];
            }
            attend_values(sc, n, mx, rows, cc, R, R, y + ((int64_t)t * H + h) * R);
        }
    }
    return MOEC_OK;
}

/* ---- DeepSeek sparse attention -------------------------------------------- */

/* A scored position of dsa_topk. */
struct dsa_cand {
    float score;
    int32_t pos;
};

/* Best first: the higher score (NaN above all, as torch.topk ranks it),
 * then the lower position. */
static int dsa_cand_cmp(const void *pa, const void *pb)
{
    const struct dsa_cand *a = pa, *b = pb;
    int na = isnan(a->score), nb = isnan(b->score);
    if (na != nb)
        return na ? -1 : 1;
    if (!na && a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

/* The index score of cached position p for token t: sum over the heads h
 * of (w[h] * weight_scale) * relu(scale * q[h] . k[p]), each product and
 * the head weights rounded to fp32 as the reference computes them. */
static float dsa_score(const float *q, const float *kp, const float *w, int64_t Hi, int64_t Di,
                       float scale, float weight_scale)
{
    double acc = 0;
    for (int64_t h = 0; h < Hi; h++) {
        double dot = 0;
        for (int64_t j = 0; j < Di; j++)
            dot += (double)q[h * Di + j] * kp[j];
        float s = (float)dot * scale;
        acc += (double)(w[h] * weight_scale) * (s > 0 ? s : 0.0f);
    }
    return (float)acc;
}

/* dsa_topk on q [T, Hi, Di], k [T, Di], w [T, Hi] as given: caches k, then
 * each token's row of y. */
static moec_status dsa_select(rt_interp *in, const ir_op *op, const float *q, const float *k,
                              const float *w, const int32_t *pos, int T, int64_t Hi, int64_t Di,
                              int64_t K, float scale, float weight_scale)
{
    int32_t *y = ibuf(in, op->out[0]);
    const float *kc = in->k_cache[op->id];
    for (int t = 0; t < T; t++)
        kv_store(in, op, t, pos[t], k, Di, NULL, 0);
    for (int t = 0; t < T; t++) {
        int64_t lo, hi, n = (int64_t)pos[t] + 1;
        MOEC_TRY(attend_range(in, op, t, pos[t], 0, &lo, &hi));
        int32_t *yr = y + (int64_t)t * K;
        if (n <= K) {
            for (int64_t i = 0; i < K; i++)
                yr[i] = i < n ? (int32_t)i : -1;
            continue;
        }
        struct dsa_cand *cand = in->cand;
        for (int64_t p = 0; p < n; p++) {
            cand[p].score = dsa_score(q + (int64_t)t * Hi * Di, kc + in->kv_rows[p] * Di,
                                      w + (int64_t)t * Hi, Hi, Di, scale, weight_scale);
            cand[p].pos = (int32_t)p;
        }
        qsort(cand, (size_t)n, sizeof *cand, dsa_cand_cmp);
        for (int64_t i = 0; i < K; i++)
            in->mark[cand[i].pos] = 1;
        int64_t o = 0;
        for (int64_t p = 0; p < n; p++)
            if (in->mark[p]) {
                yr[o++] = (int32_t)p;
                in->mark[p] = 0;
            }
    }
    return MOEC_OK;
}

/* The DSA lightning indexer: caches this call's keys, then for each token
 * the top_k cached positions <= pos by index score (ties: the lower
 * position), written in ascending order, -1 after them; every position
 * when there are no more than top_k. q and w read from rows at q_col and
 * w_col with heads; q rotated first with rope's attributes. */
static moec_status op_dsa_topk(rt_interp *in, const ir_op *op, int T)
{
    int64_t K;
    double scale_d, ws_d;
    MOEC_TRY(attr_int_req(op, "top_k", &K));
    MOEC_TRY(attr_num_req(op, "scale", &scale_d));
    MOEC_TRY(attr_num_req(op, "weight_scale", &ws_d));
    int64_t dq[IR_MAX_RANK], dk[IR_MAX_RANK], dw[IR_MAX_RANK];
    int rq = shape_of(op->in[0], T, dq), rk = shape_of(op->in[1], T, dk),
        rw = shape_of(op->in[2], T, dw);
    /* q [T, Hi, Di] and w [T, Hi]; or, with heads, rows holding them at q_col and w_col */
    int rows = ir_op_attr(op, "heads") != NULL;
    int64_t Di = dk[1], Hi = rows ? ir_op_attr_int(op, "heads", 0) : dq[1];
    int64_t qc = ir_op_attr_int(op, "q_col", 0), wc = ir_op_attr_int(op, "w_col", 0);
    int64_t rd = ir_op_attr_int(op, "rotary_dim", Di);
    int rope = ir_op_attr(op, "style") != NULL;
    if (rq != (rows ? 2 : 3) || rk != 2 || rw != 2 || dq[0] != T || dk[0] != T || dw[0] != T ||
        Hi < 1 || (!rows && (dq[2] != Di || dw[1] != Hi)) ||
        (rows && (qc < 0 || wc < 0 || qc + Hi * Di > dq[1] || wc + Hi > dw[1])) || K < 1 ||
        numel_of(op->in[3], T) != T || numel_of(op->out[0], T) != (int64_t)T * K ||
        (rope && (Di % 2 || rd < 2 || rd > Di || rd % 2)))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: dsa_topk wants q [T, Hi, Di], k [T, Di], weights [T, Hi] (or rows "
                        "holding them at q_col and w_col), pos [T] and a result [T, top_k]",
                        op_name(op));
    const float *q = fbuf(in, op->in[0]), *k = fbuf(in, op->in[1]), *w = fbuf(in, op->in[2]);
    const int32_t *pos = ibuf(in, op->in[3]);
    int64_t q_stride = rows ? dq[1] : Hi * Di, w_stride = rows ? dw[1] : Hi;
    /* the rows' q and w gathered, and q rotated as rope would: a copy */
    float *qbuf = NULL, *wbuf = NULL;
    if (rows || rope) {
        qbuf = malloc((size_t)T * (size_t)(Hi * Di) * sizeof(float) + 1);
        wbuf = malloc((size_t)T * (size_t)Hi * sizeof(float) + 1);
        if (!qbuf || !wbuf) {
            free(qbuf);
            free(wbuf);
            return MOEC_ERR(MOEC_ERR_OOM, "%s: no memory for dsa_topk's q", op_name(op));
        }
        gather_cols(q, q_stride, qc, Hi * Di, T, qbuf);
        gather_cols(w, w_stride, wc, Hi, T, wbuf);
        moec_status st = rope ? rope_rows(op, qbuf, pos, qbuf, T, Hi, Di, rd) : MOEC_OK;
        if (st != MOEC_OK) {
            free(qbuf);
            free(wbuf);
            return st;
        }
        q = qbuf;
        w = wbuf;
    }
    moec_status st = dsa_select(in, op, q, k, w, pos, T, Hi, Di, K, (float)scale_d, (float)ws_d);
    free(qbuf);
    free(wbuf);
    return st;
}

/* ---- mixture of experts --------------------------------------------------- */

/* Index of the largest of v[0..n-1] not yet taken; ties go to the lower
 * index. Callers leave at least one untaken (0 otherwise). */
static int argmax_untaken(const float *v, const unsigned char *taken, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best]))
            best = i;
    return best < 0 ? 0 : best;
}

static moec_status op_moe_topk(rt_interp *in, const ir_op *op, int T)
{
    const char *scoring = ir_op_attr_str(op, "scoring", NULL);
    int64_t top_k;
    MOEC_TRY(attr_int_req(op, "top_k", &top_k));
    int64_t n_group = ir_op_attr_int(op, "n_group", 1);
    int64_t topk_group = ir_op_attr_int(op, "topk_group", 1);
    const char *group_score = ir_op_attr_str(op, "group_score", "max");
    int norm = ir_op_attr_int(op, "norm_topk_prob", 0) != 0;
    float scaling = (float)attr_num_or(op, "scaling", 1.0);
    if (!scoring || (strcmp(scoring, "softmax") != 0 && strcmp(scoring, "sigmoid") != 0))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: moe_topk scoring must be \"softmax\" or \"sigmoid\"", op_name(op));
    int top2 = strcmp(group_score, "top2_sum") == 0;
    if (!top2 && strcmp(group_score, "max") != 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: moe_topk group_score must be \"max\" or \"top2_sum\", not \"%s\"",
                        op_name(op), group_score);
    int64_t d[IR_MAX_RANK];
    if (shape_of(op->in[0], T, d) != 2 || op->n_out != 2)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: moe_topk wants logits [T, E] and two results",
                        op_name(op));
    int64_t E = d[1];
    if (top_k < 1 || top_k > E || n_group < 1 || E % n_group != 0 || topk_group < 1 ||
        topk_group > n_group || (top2 && n_group > 1 && E / n_group < 2))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: moe_topk top_k %lld, n_group %lld, topk_group %lld do not fit %lld "
                        "experts",
                        op_name(op), (long long)top_k, (long long)n_group, (long long)topk_group,
                        (long long)E);
    const float *bias = NULL;
    if (op->n_in > 1 && op->in[1]) {
        if (numel_of(op->in[1], T) != E)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: bias %s must have %lld elements",
                            op_name(op), op->in[1]->name, (long long)E);
        bias = fbuf(in, op->in[1]);
    }
    if (numel_of(op->out[0], T) != (int64_t)T * top_k || numel_of(op->out[1], T) != (int64_t)T * top_k ||
        !is_i32(op->out[0]) || is_i32(op->out[1]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: moe_topk results must be i32[T, %lld] and f32[T, %lld]",
                        op_name(op), (long long)top_k, (long long)top_k);
    /* s, c, group scores, taken flags for experts and for groups */
    float *s = malloc((size_t)(2 * E + n_group) * sizeof(float));
    unsigned char *taken = malloc((size_t)(E + n_group));
    if (!s || !taken) {
        free(s);
        free(taken);
        return MOEC_ERR(MOEC_ERR_OOM, "%s: no memory for routing scores", op_name(op));
    }
    float *c = s + E, *gs = c + E;
    unsigned char *gtaken = taken + E;
    const float *logits = fbuf(in, op->in[0]);
    int32_t *ids = ibuf(in, op->out[0]);
    float *wts = fbuf(in, op->out[1]);
    int64_t gsize = E / n_group;
    for (int t = 0; t < T; t++) {
        const float *l = logits + (int64_t)t * E;
        if (strcmp(scoring, "softmax") == 0) {
            float mx = l[0];
            for (int64_t e = 1; e < E; e++)
                mx = l[e] > mx ? l[e] : mx;
            double sum = 0;
            for (int64_t e = 0; e < E; e++) {
                s[e] = expf(l[e] - mx);
                sum += s[e];
            }
            for (int64_t e = 0; e < E; e++)
                s[e] = (float)(s[e] / sum);
        } else {
            for (int64_t e = 0; e < E; e++)
                s[e] = sigmoid(l[e]);
        }
        for (int64_t e = 0; e < E; e++)
            c[e] = bias ? s[e] + bias[e] : s[e];
        if (n_group > 1) {
            for (int64_t g = 0; g < n_group; g++) {
                const float *cg = c + g * gsize;
                memset(taken, 0, (size_t)gsize);
                int a = argmax_untaken(cg, taken, (int)gsize);
                gs[g] = cg[a];
                if (top2) {
                    taken[a] = 1;
                    gs[g] = cg[a] + cg[argmax_untaken(cg, taken, (int)gsize)];
                }
            }
            memset(gtaken, 0, (size_t)n_group);
            for (int64_t j = 0; j < topk_group; j++)
                gtaken[argmax_untaken(gs, gtaken, (int)n_group)] = 1;
            for (int64_t e = 0; e < E; e++)
                if (!gtaken[e / gsize])
                    c[e] = -INFINITY;
        }
        memset(taken, 0, (size_t)E);
        double sum = 0;
        for (int64_t j = 0; j < top_k; j++) {
            int e = argmax_untaken(c, taken, (int)E);
            taken[e] = 1;
            ids[(int64_t)t * top_k + j] = e;
            wts[(int64_t)t * top_k + j] = s[e];
            sum += s[e];
        }
        float denom = (float)sum + 1e-20f;
        for (int64_t j = 0; j < top_k; j++) {
            float *w = &wts[(int64_t)t * top_k + j];
            if (norm)
                *w /= denom;
            *w *= scaling;
        }
    }
    free(s);
    free(taken);
    return MOEC_OK;
}

/* y[0..N-1] = W x, W [N, K] row-major. */
static void matvec(const float *W, const float *x, int64_t N, int64_t K, float *y)
{
    for (int64_t n = 0; n < N; n++) {
        double acc = 0;
        for (int64_t k = 0; k < K; k++)
            acc += (double)W[n * K + k] * x[k];
        y[n] = (float)acc;
    }
}

static moec_status op_moe_experts(rt_interp *in, const ir_op *op, int T)
{
    const char *act = ir_op_attr_str(op, "act", "silu");
    if (strcmp(act, "silu") != 0)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s: moe_experts act \"%s\" (only silu)",
                        op_name(op), act);
    int fused = op->n_in == 4;
    const ir_value *down = op->in[fused ? 3 : 4];
    int64_t dx[IR_MAX_RANK], di[IR_MAX_RANK], dg[IR_MAX_RANK], dd[IR_MAX_RANK], du[IR_MAX_RANK];
    int rx = shape_of(op->in[0], T, dx), ri = shape_of(op->in[1], T, di),
        rg = shape_of(op->in[2], T, dg), rd = shape_of(down, T, dd);
    int ok = rx == 2 && ri == 2 && rg == 3 && rd == 3 && dx[0] == T && di[0] == T;
    int64_t H = dx[1], K = di[1], E = dg[0], I = fused ? dg[1] / 2 : dg[1];
    ok = ok && dg[2] == H && (!fused || dg[1] % 2 == 0) && dd[0] == E && dd[1] == H && dd[2] == I;
    if (ok && !fused)
        ok = shape_of(op->in[3], T, du) == 3 && du[0] == E && du[1] == I && du[2] == H;
    if (!ok || numel_of(op->out[0], T) != (int64_t)T * K * H)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: moe_experts wants x [T, H], ids [T, K], gate and up [E, I, H] (or "
                        "gate_up [E, 2I, H]), down [E, H, I]",
                        op_name(op));
    float *g = malloc((size_t)(2 * I) * sizeof(float) + 1);
    if (!g)
        return MOEC_ERR(MOEC_ERR_OOM, "%s: no memory for the expert intermediate", op_name(op));
    float *u = g + I;
    const float *x = fbuf(in, op->in[0]);
    const int32_t *ids = ibuf(in, op->in[1]);
    const float *wg = fbuf(in, op->in[2]), *wd = fbuf(in, down);
    const float *wu = fused ? NULL : fbuf(in, op->in[3]);
    float *y = fbuf(in, op->out[0]);
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * H;
        for (int64_t k = 0; k < K; k++) {
            int32_t e = ids[t * K + k];
            if (e < 0 || e >= E) {
                free(g);
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "%s: expert id %d is outside [0, %lld)", op_name(op), (int)e,
                                (long long)E);
            }
            if (fused) {
                const float *gu = wg + (int64_t)e * 2 * I * H;
                matvec(gu, xt, I, H, g);
                matvec(gu + I * H, xt, I, H, u);
            } else {
                matvec(wg + (int64_t)e * I * H, xt, I, H, g);
                matvec(wu + (int64_t)e * I * H, xt, I, H, u);
            }
            for (int64_t i = 0; i < I; i++)
                g[i] = silu(g[i]) * u[i];
            matvec(wd + (int64_t)e * H * I, g, H, I, y + (t * K + k) * H);
        }
    }
    free(g);
    return MOEC_OK;
}

/* The routed experts and their weighted sum in one: for each token,
 * sum_k (scale * w[t,k]) * down_e(silu(gate_e x) * up_e x). The product
 * with the weight is rounded to fp32 before the sum, as mul then
 * reduce_sum would. */
static moec_status op_moe_routed(rt_interp *in, const ir_op *op, int T)
{
    int fused = op->n_in == 5;
    const ir_value *down = op->in[fused ? 4 : 5];
    int64_t dx[IR_MAX_RANK], di[IR_MAX_RANK], dw[IR_MAX_RANK], dg[IR_MAX_RANK],
        dd[IR_MAX_RANK], du[IR_MAX_RANK];
    int rx = shape_of(op->in[0], T, dx), ri = shape_of(op->in[1], T, di),
        rw = shape_of(op->in[2], T, dw), rg = shape_of(op->in[3], T, dg), rd = shape_of(down, T, dd);
    int ok = rx == 2 && ri == 2 && rw == 2 && rg == 3 && rd == 3 && dx[0] == T && di[0] == T &&
             dw[0] == T && dw[1] == di[1];
    int64_t H = dx[1], K = di[1], E = dg[0], I = fused ? dg[1] / 2 : dg[1];
    ok = ok && dg[2] == H && (!fused || dg[1] % 2 == 0) && dd[0] == E && dd[1] == H && dd[2] == I;
    if (ok && !fused)
        ok = shape_of(op->in[4], T, du) == 3 && du[0] == E && du[1] == I && du[2] == H;
    /* unsummed: slot (t, k) holds its weighted expert output, summed by
     * the add_rms_norm that reads it */
    int uns = ir_op_attr_int(op, "unsummed", 0) != 0;
    if (!ok || numel_of(op->out[0], T) != (int64_t)T * H * (uns ? K : 1))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: moe_routed wants x [T, H], ids [T, K], w [T, K], gate_up [E, 2I, H] "
                        "(or gate and up [E, I, H]), down [E, H, I]",
                        op_name(op));
    float scale = (float)attr_num_or(op, "scale", 1.0);
    /* an expert-parallel rank holds experts [e0, e0 + E) of n_experts; the
     * others' add nothing here (its all_reduce adds them) */
    int64_t e0 = (int64_t)attr_num_or(op, "expert_start", 0);
    int64_t n_experts = (int64_t)attr_num_or(op, "n_experts", (double)E);
    float *g = malloc((size_t)(2 * I + H) * sizeof(float) + 1);
    double *acc = malloc((size_t)H * sizeof(double) + 1);
    if (!g || !acc) {
        free(g);
        free(acc);
        return MOEC_ERR(MOEC_ERR_OOM, "%s: no memory for the expert intermediate", op_name(op));
    }
    float *u = g + I, *eo = u + I;
    const float *x = fbuf(in, op->in[0]), *wts = fbuf(in, op->in[2]);
    const int32_t *ids = ibuf(in, op->in[1]);
    const float *wg = fbuf(in, op->in[3]), *wd = fbuf(in, down);
    const float *wu = fused ? NULL : fbuf(in, op->in[4]);
    float *y = fbuf(in, op->out[0]);
    moec_status st = MOEC_OK;
    for (int64_t t = 0; t < T && st == MOEC_OK; t++) {
        const float *xt = x + t * H;
        for (int64_t h = 0; h < H; h++)
            acc[h] = 0;
        for (int64_t k = 0; k < K; k++) {
            int32_t id = ids[t * K + k];
            if (id < 0 || id >= n_experts) {
                st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: expert id %d is outside [0, %lld)",
                              op_name(op), (int)id, (long long)n_experts);
                break;
            }
            int64_t e = id - e0;
            if (e < 0 || e >= E)
                continue;
            if (fused) {
                const float *gu = wg + (int64_t)e * 2 * I * H;
                matvec(gu, xt, I, H, g);
                matvec(gu + I * H, xt, I, H, u);
            } else {
                matvec(wg + (int64_t)e * I * H, xt, I, H, g);
                matvec(wu + (int64_t)e * I * H, xt, I, H, u);
            }
            for (int64_t i = 0; i < I; i++)
                g[i] = silu(g[i]) * u[i];
            matvec(wd + (int64_t)e * H * I, g, H, I, eo);
            float coef = scale * wts[t * K + k];
            for (int64_t h = 0; h < H; h++) {
                if (uns)
                    y[(t * K + k) * H + h] = eo[h] * coef;
                acc[h] += (double)(eo[h] * coef);
            }
        }
        for (int64_t h = 0; !uns && h < H; h++)
            y[t * H + h] = (float)acc[h];
    }
    free(g);
    free(acc);
    return st;
}

/* ---- collectives ---------------------------------------------------------- */

/* Every rank's collective ops[r] (rank r of n) agree: one kind, `ranks` n, one axis and one operand type. */
static moec_status collective_check(const ir_op *const *ops, int n)
{
    const ir_op *a = ops[0];
    int64_t ranks = ir_op_attr_int(a, "ranks", 0);
    if (ranks != n)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: %s over %lld ranks, but the interpreter runs %d (a sharded module "
                        "runs with one interpreter per rank: rt_interp_init_ranks)",
                        op_name(a), ir_op_name(a->kind), (long long)ranks, n);
    for (int r = 1; r < n; r++) {
        const ir_op *b = ops[r];
        if (b->kind != a->kind || ir_op_attr_int(b, "ranks", 0) != ranks ||
            ir_op_attr_int(b, "axis", 0) != ir_op_attr_int(a, "axis", 0) ||
            !ir_type_equal(&b->in[0]->type, &a->in[0]->type)) {
            char ta[96], tb[96];
            ir_type_format(&a->in[0]->type, ta, sizeof ta);
            ir_type_format(&b->in[0]->type, tb, sizeof tb);
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "rank %d reached %s %s of %s while rank 0 reached %s %s of %s: the "
                            "ranks' modules do not run the same collectives",
                            r, ir_op_name(b->kind), op_name(b), tb, ir_op_name(a->kind),
                            op_name(a), ta);
        }
    }
    return MOEC_OK;
}

/* Element i summed over the n ranks' x, in rank order, in double. */
static float sum_ranks(const float *const *x, int n, int64_t i)
{
    double sum = 0;
    for (int j = 0; j < n; j++)
        sum += x[j][i];
    return (float)sum;
}

/* Runs the collective ops[r] of n ranks in memory: rank r's operand and
 * result are in ins[r]'s buffers. Sums accumulate in double, in rank order. */
static moec_status collective_run(rt_interp *const *ins, const ir_op *const *ops, int n, int T)
{
    MOEC_TRY(collective_check(ops, n));
    const ir_op *op = ops[0];
    int64_t d[IR_MAX_RANK];
    int rank = shape_of(op->in[0], T, d);
    int axis = op->kind == IR_OP_ALL_REDUCE ? 0 : (int)ir_op_attr_int(op, "axis", 0);
    int64_t outer = prod(d, 0, axis), inner = prod(d, axis, rank), chunk = inner / n;
    const float *x[IR_MAX_RANKS];
    float *y[IR_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        x[r] = fbuf(ins[r], ops[r]->in[0]);
        y[r] = fbuf(ins[r], ops[r]->out[0]);
    }
    for (int r = 0; r < n; r++) {
        for (int64_t o = 0; o < outer; o++) {
            const int64_t row = o * inner;
            switch (op->kind) {
            case IR_OP_ALL_REDUCE:
                for (int64_t c = 0; c < inner; c++)
                    y[r][row + c] = sum_ranks(x, n, row + c);
                break;
            case IR_OP_REDUCE_SCATTER:
                for (int64_t c = 0; c < chunk; c++)
                    y[r][o * chunk + c] = sum_ranks(x, n, row + r * chunk + c);
                break;
            case IR_OP_ALL_GATHER:
                for (int j = 0; j < n; j++)
                    memcpy(y[r] + (o * n + j) * inner, x[j] + row, (size_t)inner * sizeof(float));
                break;
            case IR_OP_ALL_TO_ALL:
                for (int j = 0; j < n; j++)
                    memcpy(y[r] + row + j * chunk, x[j] + row + r * chunk,
                           (size_t)chunk * sizeof(float));
                break;
            default:
                return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %s is not a collective", op_name(op),
                                ir_op_name(op->kind));
            }
        }
    }
    return MOEC_OK;
}

static int is_collective(ir_op_kind k)
{
    return k == IR_OP_ALL_REDUCE || k == IR_OP_ALL_GATHER || k == IR_OP_REDUCE_SCATTER ||
           k == IR_OP_ALL_TO_ALL;
}

/* A collective run by one interpreter alone: a group of one rank. */
static moec_status op_collective_alone(rt_interp *in, const ir_op *op, int T)
{
    return collective_run(&in, &op, 1, T);
}

/* ---- the interpreter ------------------------------------------------------ */

static moec_status run_op(rt_interp *in, const ir_op *op, int T)
{
    switch (op->kind) {
    case IR_OP_EMBEDDING: return op_embedding(in, op, T);
    case IR_OP_RMS_NORM: return op_rms_norm(in, op, T);
    case IR_OP_LINEAR: return op_linear(in, op, T);
    case IR_OP_RESHAPE: return op_reshape(in, op, T);
    case IR_OP_SLICE: return op_slice(in, op, T);
    case IR_OP_CONCAT: return op_concat(in, op, T);
    case IR_OP_EXPAND: return op_expand(in, op, T);
    case IR_OP_ADD:
    case IR_OP_MUL: return op_binary(in, op, T);
    case IR_OP_SILU:
    case IR_OP_SIGMOID: return op_unary(in, op, T);
    case IR_OP_ROPE: return op_rope(in, op, T);
    case IR_OP_ATTENTION: return op_attention(in, op, T);
    case IR_OP_MOE_TOPK: return op_moe_topk(in, op, T);
    case IR_OP_MOE_EXPERTS: return op_moe_experts(in, op, T);
    case IR_OP_REDUCE_SUM: return op_reduce_sum(in, op, T);
    case IR_OP_SILU_MUL: return op_silu_mul(in, op, T);
    case IR_OP_MOE_ROUTED: return op_moe_routed(in, op, T);
    case IR_OP_MLA_QABSORB: return op_mla_absorb(in, op, T);
    case IR_OP_MLA_ATTENTION: return op_mla_attention(in, op, T);
    case IR_OP_MLA_VABSORB: return op_mla_absorb(in, op, T);
    case IR_OP_FORK:
    case IR_OP_JOIN: return op_copy(in, op, T);
    case IR_OP_ADD_RMS_NORM: return op_add_rms_norm(in, op, T);
    case IR_OP_ALL_REDUCE:
    case IR_OP_ALL_GATHER:
    case IR_OP_REDUCE_SCATTER:
    case IR_OP_ALL_TO_ALL: return op_collective_alone(in, op, T);
    case IR_OP_LAYER_NORM: return op_layer_norm(in, op, T);
    case IR_OP_DSA_TOPK: return op_dsa_topk(in, op, T);
    case IR_OP_MLA_PROLOGUE:
    case IR_OP_MLA_PROLOGUE_KV:
    case IR_OP_MLA_PROLOGUE_Q: return op_mla_prologue(in, op, T);
    case IR_OP_DSA_PROLOGUE_K: return op_dsa_prologue_k(in, op, T);
    case IR_OP_ATTN_PROLOGUE: return op_attn_prologue(in, op, T);
    case IR_OP_COUNT: break;
    }
    return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s: op kind %d has no interpreter", op_name(op),
                    (int)op->kind);
}

/* Operand counts and which operands and results are i32, per op kind. Bit i
 * of in_i32 is operand i; bit i of out_i32 result i. Anything that is not
 * i32 is fp32 in the interpreter. */
static const struct {
    int min_in, max_in, n_out;
    unsigned in_i32, out_i32;
    int any_dtype; /* data movement: i32 or float, result like operands */
} op_sig[IR_OP_COUNT] = {
    [IR_OP_EMBEDDING] = {2, 2, 1, 1u << 0, 0, 0},
    [IR_OP_RMS_NORM] = {2, 2, 1, 0, 0, 0},
    [IR_OP_LINEAR] = {2, 3, 1, 0, 0, 0},
    [IR_OP_RESHAPE] = {1, 1, 1, 0, 0, 1},
    [IR_OP_SLICE] = {1, 1, 1, 0, 0, 1},
    [IR_OP_CONCAT] = {2, IR_MAX_OPERANDS, 1, 0, 0, 1},
    [IR_OP_EXPAND] = {1, 1, 1, 0, 0, 1},
    [IR_OP_ADD] = {2, 2, 1, 0, 0, 0},
    [IR_OP_MUL] = {2, 2, 1, 0, 0, 0},
    [IR_OP_SILU] = {1, 1, 1, 0, 0, 0},
    [IR_OP_SIGMOID] = {1, 1, 1, 0, 0, 0},
    [IR_OP_ROPE] = {2, 2, 1, 1u << 1, 0, 0},
    [IR_OP_ATTENTION] = {4, 5, 1, (1u << 3) | (1u << 4), 0, 0},
    [IR_OP_MOE_TOPK] = {1, 2, 2, 0, 1u << 0, 0},
    [IR_OP_MOE_EXPERTS] = {4, 5, 1, 1u << 1, 0, 0},
    [IR_OP_REDUCE_SUM] = {1, 1, 1, 0, 0, 0},
    [IR_OP_SILU_MUL] = {1, 1, 1, 0, 0, 0},
    [IR_OP_MOE_ROUTED] = {5, 6, 1, 1u << 1, 0, 0},
    [IR_OP_MLA_QABSORB] = {2, 2, 1, 0, 0, 0},
    [IR_OP_MLA_ATTENTION] = {5, 6, 1, (1u << 4) | (1u << 5), 0, 0},
    [IR_OP_MLA_VABSORB] = {2, 2, 1, 0, 0, 0},
    [IR_OP_FORK] = {1, 1, 1, 0, 0, 1},
    [IR_OP_JOIN] = {1, 1, 1, 0, 0, 1},
    [IR_OP_ADD_RMS_NORM] = {3, 4, 2, 0, 0, 0},
    [IR_OP_ALL_REDUCE] = {1, 1, 1, 0, 0, 0},
    [IR_OP_ALL_GATHER] = {1, 1, 1, 0, 0, 0},
    [IR_OP_REDUCE_SCATTER] = {1, 1, 1, 0, 0, 0},
    [IR_OP_ALL_TO_ALL] = {1, 1, 1, 0, 0, 0},
    [IR_OP_LAYER_NORM] = {3, 3, 1, 0, 0, 0},
    [IR_OP_DSA_TOPK] = {4, 4, 1, 1u << 3, 1u << 0, 0},
    [IR_OP_MLA_PROLOGUE] = {3, 3, 4, 1u << 1, 0, 0},
    [IR_OP_MLA_PROLOGUE_KV] = {4, 4, 3, 1u << 1, 0, 0},
    [IR_OP_MLA_PROLOGUE_Q] = {2, 2, 2, 1u << 1, 0, 0},
    [IR_OP_DSA_PROLOGUE_K] = {4, 4, 1, 1u << 1, 0, 0},
    [IR_OP_ATTN_PROLOGUE] = {2, 4, 3, 1u << 1, 0, 0},
};

/* Checks what the op functions rely on before indexing buffers: operand
 * counts, operands present and defined in this module, i32 where ids are. */
static moec_status check_op(const ir_module *m, const ir_op *op)
{
    if ((int)op->kind < 0 || op->kind >= IR_OP_COUNT)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "op %d: kind %d has no interpreter", op->id,
                        (int)op->kind);
    if (op->n_out != op_sig[op->kind].n_out || op->n_in < op_sig[op->kind].min_in ||
        op->n_in > op_sig[op->kind].max_in)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %s with %d operands and %d results",
                        op_name(op), ir_op_name(op->kind), op->n_in, op->n_out);
    for (int i = 0; i < op->n_out; i++) {
        const ir_value *v = op->out[i];
        if (!v || v->id < 0 || v->id >= m->n_values || m->values[v->id] != v)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: result %d is not a value of the module",
                            op_name(op), i);
        if (is_i32(v) != !!(op_sig[op->kind].out_i32 & (1u << i)) && !op_sig[op->kind].any_dtype)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: result %d of %s must be %s", op_name(op),
                            i, ir_op_name(op->kind),
                            (op_sig[op->kind].out_i32 & (1u << i)) ? "i32" : "a float type");
    }
    for (int i = 0; i < op->n_in; i++) {
        const ir_value *v = op->in[i];
        if (!v) {
            /* only the optional biases may be absent */
            if ((op->kind == IR_OP_LINEAR && i == 2) || (op->kind == IR_OP_MOE_TOPK && i == 1))
                continue;
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: operand %d of %s is missing", op_name(op),
                            i, ir_op_name(op->kind));
        }
        if (v->id < 0 || v->id >= m->n_values || m->values[v->id] != v)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: operand %d is not a value of the module",
                            op_name(op), i);
        int want = !!(op_sig[op->kind].in_i32 & (1u << i));
        if (op_sig[op->kind].any_dtype)
            want = is_i32(op->out[0]);
        if (is_i32(v) != want)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: operand %s of %s must be %s", op_name(op),
                            v->name, ir_op_name(op->kind), want ? "i32" : "a float type");
    }
    return MOEC_OK;
}

/* Drops the activation buffers (separate ones, or the planned arena). */
static void free_activations(rt_interp *in)
{
    const ir_module *m = in->m;
    for (int i = 0; in->data && i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (!v || v->kind == IR_VALUE_WEIGHT)
            continue;
        if (!in->planned)
            free(in->data[i]);
        in->data[i] = NULL;
    }
    free(in->arena);
    in->arena = NULL;
    in->arena_T = 0;
    in->T_cap = 0;
}

/* The plan m carries: arena_bytes_per_token into *per_token, and every
 * activation placed inside it, 4-byte aligned. */
static moec_status plan_check(const ir_module *m, int64_t *per_token)
{
    const char *mname = m->name ? m->name : "?";
    const ir_attr *a = ir_module_meta(m, "arena_bytes_per_token");
    if (!a || a->kind != IR_ATTR_INT || a->i < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "module %s: planned mode needs meta arena_bytes_per_token (an int >= 1)",
                        mname);
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind == IR_VALUE_WEIGHT)
            continue;
        int64_t size = numel_of(v, 1) * 4;
        if (v->mem_offset < 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "module %s: %%%s has no arena offset (mem_offset %lld); planned mode "
                            "needs every activation placed",
                            mname, v->name, (long long)v->mem_offset);
        if (v->mem_offset % 4 != 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "module %s: %%%s: arena offset %lld is not a multiple of 4", mname,
                            v->name, (long long)v->mem_offset);
        if (size > a->i || v->mem_offset > a->i - size)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "module %s: %%%s: %lld bytes per token at offset %lld run past "
                            "arena_bytes_per_token %lld",
                            mname, v->name, (long long)size, (long long)v->mem_offset,
                            (long long)a->i);
    }
    *per_token = a->i;
    return MOEC_OK;
}

/* Planned mode: one arena of arena_bytes_per_token * T bytes, every
 * activation at byte mem_offset * T in it, as the GPU runtime lays out the
 * bucket of T tokens. */
static moec_status place_in_arena(rt_interp *in, int T)
{
    const ir_module *m = in->m;
    int64_t per_token;
    /* again: the module may have changed since use_plan, and a stale plan
     * must not write outside the arena */
    MOEC_TRY(plan_check(m, &per_token));
    if (per_token != in->arena_bytes_per_token) {
        free(in->arena);
        in->arena = NULL;
        in->arena_T = 0;
        in->arena_bytes_per_token = per_token;
    }
    if (per_token > (int64_t)(SIZE_MAX / 2) / T)
        return MOEC_ERR(MOEC_ERR_CAPACITY, "planned arena of %lld bytes per token for %d tokens "
                        "is too large", (long long)per_token, T);
    if (T > in->arena_T) {
        free(in->arena);
        in->arena_T = 0;
        in->arena = calloc((size_t)(per_token * T) + 4, 1);
        if (!in->arena)
            return MOEC_ERR(MOEC_ERR_OOM, "no memory for a planned arena of %lld bytes",
                            (long long)(per_token * T));
        in->arena_T = T;
    }
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind != IR_VALUE_WEIGHT)
            in->data[i] = in->arena + (size_t)v->mem_offset * (size_t)T;
    }
    return MOEC_OK;
}

/* Sizes the activation buffers (inputs and op results) for T tokens. */
static moec_status ensure_capacity(rt_interp *in, int T)
{
    if (in->planned)
        return place_in_arena(in, T);
    if (T <= in->T_cap)
        return MOEC_OK;
    const ir_module *m = in->m;
    free_activations(in);
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind == IR_VALUE_WEIGHT)
            continue;
        int64_t n = numel_of(v, T);
        if (n < 0 || (uint64_t)n > SIZE_MAX / 4 - 1)
            return MOEC_ERR(MOEC_ERR_CAPACITY, "%s: %lld elements for %d tokens is too many",
                            v->name, (long long)n, T);
        in->data[i] = malloc((size_t)n * 4 + 4);
        if (!in->data[i])
            return MOEC_ERR(MOEC_ERR_OOM, "%s: no memory for %d tokens", v->name, T);
    }
    in->T_cap = T;
    return MOEC_OK;
}

void rt_interp_free(rt_interp *in)
{
    if (!in)
        return;
    for (int r = 1; in->peers && r < in->n_ranks; r++)
        rt_interp_free(in->peers[r]);
    if (in->m) {
        free_activations(in);
        for (int i = 0; in->data && i < in->m->n_values; i++)
            free(in->data[i]);
        for (int i = 0; i < in->m->n_ops; i++) {
            if (in->k_cache)
                free(in->k_cache[i]);
            if (in->v_cache)
                free(in->v_cache[i]);
            if (in->kv_written)
                free(in->kv_written[i]);
        }
    }
    free(in->data);
    free(in->k_cache);
    free(in->v_cache);
    free(in->kv_written);
    free(in->scores);
    free(in->kv_rows);
    free(in->peers);
    ir_module **owned = in->owned;
    int n = in->n_ranks;
    free(in->mark);
    free(in->cand);
    free(in);
    for (int r = 0; owned && r < n; r++)
        ir_module_free(owned[r]);
    free(owned);
}

/* Checks every value and sets up the weights: read from w (zero when w is
 * NULL). */
static moec_status init_values(rt_interp *in, const rt_weights *w)
{
    const ir_module *m = in->m;
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (!v || v->id != i)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "value %d of module %s has id %d", i,
                            m->name ? m->name : "?", v ? v->id : -1);
        if (v->type.rank < 0 || v->type.rank > IR_MAX_RANK)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: rank %d", v->name, v->type.rank);
        for (int j = 0; j < v->type.rank; j++)
            if (v->type.dims[j] < 0 && v->type.dims[j] != IR_DIM_T)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: dim %d is %lld", v->name, j,
                                (long long)v->type.dims[j]);
        if (v->kind == IR_VALUE_INPUT) {
            if (strcmp(v->name, "tokens") == 0)
                in->tokens = v;
            else if (strcmp(v->name, "positions") == 0)
                in->positions = v;
            else
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "input %s: the interpreter feeds only tokens and positions",
                                v->name);
            if (!is_i32(v) || v->type.rank != 1 || v->type.dims[0] != IR_DIM_T)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG, "input %s must be i32[T]", v->name);
        }
        if (v->kind != IR_VALUE_WEIGHT)
            continue;
        if (is_i32(v))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %s is i32; weights are float", v->name);
        int64_t n = numel_of(v, 0);
        if ((uint64_t)n > SIZE_MAX / sizeof(float) - 1)
            return MOEC_ERR(MOEC_ERR_OOM, "weight %s: %lld elements", v->name, (long long)n);
        in->data[i] = calloc((size_t)n + 1, sizeof(float));
        if (!in->data[i])
            return MOEC_ERR(MOEC_ERR_OOM, "weight %s: no memory for %lld floats", v->name,
                            (long long)n);
        if (w)
            MOEC_TRY(rt_weights_read_f32(w, v, in->data[i]));
    }
    if (!in->tokens)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "module %s has no input %%tokens",
                        m->name ? m->name : "?");
    if (!in->positions)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "module %s has no input %%positions",
                        m->name ? m->name : "?");
    return MOEC_OK;
}

/* Floats per cached position of op's KV cache (k, then v); 0 when op has none. */
static int cache_widths(const ir_op *op, int64_t *nk, int64_t *nv)
{
    if (op->kind == IR_OP_ATTENTION) {
        *nk = numel_of(op->in[1], 1);
        *nv = numel_of(op->in[2], 1);
        return 1;
    }
    if (op->kind == IR_OP_MLA_ATTENTION) {
        *nk = numel_of(op->in[2], 1); /* kv_c: r */
        *nv = numel_of(op->in[3], 1); /* k_pe: dr */
        return 1;
    }
    if (op->kind == IR_OP_DSA_TOPK) {
        *nk = numel_of(op->in[1], 1); /* the indexer's keys: Di */
        *nv = 0;
        return 1;
    }
    return 0;
}

static moec_status init_ops(rt_interp *in)
{
    const ir_module *m = in->m;
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (!op || op->id != i)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "op %d of module %s has id %d", i,
                            m->name ? m->name : "?", op ? op->id : -1);
        MOEC_TRY(check_op(m, op));
        if (op->kind == IR_OP_ATTENTION) {
            const ir_type *k = &op->in[1]->type, *v = &op->in[2]->type;
            if (k->rank != 3 || v->rank != 3 || k->dims[1] < 1 || k->dims[2] < 1 ||
                v->dims[1] < 1 || v->dims[2] < 1)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "%s: attention k and v must be [T, Hkv, D]", op_name(op));
        } else if (op->kind == IR_OP_MLA_ATTENTION) {
            const ir_type *c = &op->in[2]->type, *p = &op->in[3]->type;
            if (c->rank != 2 || p->rank != 3 || c->dims[1] < 1 || p->dims[1] != 1 ||
                p->dims[2] < 1)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "%s: mla_attention kv_c must be [T, r] and k_pe [T, 1, dr]",
                                op_name(op));
        }
        int64_t wk, wv;
        if (!cache_widths(op, &wk, &wv))
            continue;
        size_t rows = (size_t)in->n_pages * (size_t)in->page_size;
        in->k_cache[i] = calloc(rows * (size_t)wk, sizeof(float));
        in->v_cache[i] = wv ? calloc(rows * (size_t)wv, sizeof(float)) : NULL;
        in->kv_written[i] = calloc(rows, 1);
        if (!in->k_cache[i] || (wv && !in->v_cache[i]) || !in->kv_written[i])
            return MOEC_ERR(MOEC_ERR_OOM, "%s: no memory for a KV cache of %zu positions",
                            op_name(op), rows);
    }
    return MOEC_OK;
}

/* An interpreter of n_pages KV pages of page_size positions; paged 0 for
 * one sequence (one page). */
static moec_status interp_init(const ir_module *m, const rt_weights *w, int n_pages,
                               int page_size, int paged, rt_interp **out)
{
    rt_interp *in = calloc(1, sizeof *in);
    if (!in)
        return MOEC_ERR(MOEC_ERR_OOM, "rt_interp_init: no memory");
    in->m = m;
    in->n_ranks = 1;
    in->n_pages = n_pages;
    in->page_size = page_size;
    in->paged = paged;
    size_t nv = (size_t)(m->n_values > 0 ? m->n_values : 1);
    size_t no = (size_t)(m->n_ops > 0 ? m->n_ops : 1);
    in->data = calloc(nv, sizeof *in->data);
    in->k_cache = calloc(no, sizeof *in->k_cache);
    in->v_cache = calloc(no, sizeof *in->v_cache);
    in->kv_written = calloc(no, sizeof *in->kv_written);
    moec_status st = MOEC_OK;
    if (!in->data || !in->k_cache || !in->v_cache || !in->kv_written)
        st = MOEC_ERR(MOEC_ERR_OOM, "rt_interp_init: no memory for %d values", m->n_values);
    if (st == MOEC_OK)
        st = init_values(in, w);
    if (st == MOEC_OK)
        st = init_ops(in);
    if (st != MOEC_OK) {
        rt_interp_free(in);
        return st;
    }
    *out = in;
    return MOEC_OK;
}

moec_status rt_interp_init(const ir_module *m, const rt_weights *w, int max_seq, rt_interp **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_init: out is NULL");
    *out = NULL;
    if (!m)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_init: module is NULL");
    if (max_seq < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_init: max_seq %d must be at least 1",
                        max_seq);
    return interp_init(m, w, 1, max_seq, 0, out);
}

moec_status rt_interp_init_paged(const ir_module *m, const rt_weights *w, int n_pages,
                                 int page_size, rt_interp **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_init_paged: out is NULL");
    *out = NULL;
    if (!m)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_init_paged: module is NULL");
    if (n_pages < 1 || page_size < 1 || (int64_t)n_pages * page_size > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_interp_init_paged: %d pages of %d positions (each at least 1, at "
                        "most 2^31 - 1 positions in all)",
                        n_pages, page_size);
    return interp_init(m, w, n_pages, page_size, 1, out);
}

/* A group leader over peers[0..n-1] (made, owned by the leader from now). */
static moec_status group_make(rt_interp **peers, int n, rt_interp **out)
{
    rt_interp *lead = peers[0];
    lead->peers = malloc((size_t)n * sizeof *lead->peers);
    if (!lead->peers) {
        for (int r = 0; r < n; r++)
            rt_interp_free(peers[r]);
        return MOEC_ERR(MOEC_ERR_OOM, "no memory for a group of %d ranks", n);
    }
    memcpy(lead->peers, peers, (size_t)n * sizeof *peers);
    lead->n_ranks = n;
    *out = lead;
    return MOEC_OK;
}

/* Module mods[r] is a shard of rank r of n, or unsharded with n == 1. */
static moec_status check_rank_module(const ir_module *m, int r, int n)
{
    int64_t tp = ir_module_meta_int(m, "tp", 0), rank = ir_module_meta_int(m, "rank", 0);
    if ((tp || n > 1) && (tp != n || rank != r))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "module %d of a group of %d ranks is rank %lld of tp %lld (module %s)", r,
                        n, (long long)rank, (long long)tp, m->name ? m->name : "?");
    return MOEC_OK;
}

/* rt_interp_init_ranks (paged 0: rt_interp_init of page_size positions for
 * every rank) and rt_interp_init_ranks_paged (rt_interp_init_paged of
 * n_pages pages); fn names the caller in errors. */
static moec_status ranks_init(ir_module **mods, int n, const char *weights_dir, int n_pages,
                              int page_size, int paged, const char *fn, rt_interp **out)
{
    ir_module **owned = malloc((size_t)(n > 0 ? n : 1) * sizeof *owned);
    rt_interp *peers[IR_MAX_RANKS] = {0};
    moec_status st = MOEC_OK;
    if (!out || !mods || n < 1 || n > IR_MAX_RANKS)
        st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: %d ranks (1 to %d)", fn, n, IR_MAX_RANKS);
    else if (!owned)
        st = MOEC_ERR(MOEC_ERR_OOM, "no memory for a group of %d ranks", n);
    else
        *out = NULL;
    for (int r = 0; st == MOEC_OK && r < n; r++) {
        rt_weights *w = NULL;
        st = mods[r] ? check_rank_module(mods[r], r, n)
                     : MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: module %d is NULL", fn, r);
        if (st == MOEC_OK && weights_dir)
            st = rt_weights_open(mods[r], weights_dir, &w);
        if (st == MOEC_OK)
            st = paged ? rt_interp_init_paged(mods[r], w, n_pages, page_size, &peers[r])
                       : rt_interp_init(mods[r], w, page_size, &peers[r]);
        rt_weights_free(w);
        if (st != MOEC_OK)
            moec_err_wrap(st, "rank %d", r);
    }
    if (st == MOEC_OK)
        st = group_make(peers, n, out);
    else
        for (int r = 0; r < n && r < IR_MAX_RANKS; r++)
            rt_interp_free(peers[r]);
    if (st != MOEC_OK) {
        for (int r = 0; mods && r < n; r++)
            ir_module_free(mods[r]);
        free(owned);
        return st;
    }
    memcpy(owned, mods, (size_t)n * sizeof *owned);
    (*out)->owned = owned;
    return MOEC_OK;
}

moec_status rt_interp_init_ranks(ir_module **mods, int n, const char *weights_dir, int max_seq,
                                 rt_interp **out)
{
    return ranks_init(mods, n, weights_dir, 1, max_seq, 0, "rt_interp_init_ranks", out);
}

moec_status rt_interp_init_ranks_paged(ir_module **mods, int n, const char *weights_dir,
                                       int n_pages, int page_size, rt_interp **out)
{
    return ranks_init(mods, n, weights_dir, n_pages, page_size, 1, "rt_interp_init_ranks_paged",
                      out);
}

rt_interp *rt_interp_rank(rt_interp *in, int r)
{
    if (!in || r < 0 || r >= in->n_ranks)
        return NULL;
    return in->peers ? in->peers[r] : in;
}

static int is_weight_of(const rt_interp *in, const ir_value *v)
{
    return in && v && v->id >= 0 && v->id < in->m->n_values && in->m->values[v->id] == v &&
           v->kind == IR_VALUE_WEIGHT;
}

moec_status rt_interp_set_weight(rt_interp *in, const ir_value *v, const float *data)
{
    if (!in || !data)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_set_weight: NULL argument");
    if (!is_weight_of(in, v))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_set_weight: %s is not a weight of module %s",
                        v && v->name ? v->name : "(null)", in->m->name ? in->m->name : "?");
    memcpy(in->data[v->id], data, (size_t)numel_of(v, 0) * sizeof(float));
    return MOEC_OK;
}

float *rt_interp_weight(rt_interp *in, const ir_value *v)
{
    return is_weight_of(in, v) ? fbuf(in, v) : NULL;
}

/* Checks every token's position against its page map (pages in the pool,
 * positions within the row) and sizes the attention scratch for the
 * furthest one. */
static moec_status check_pages(rt_interp *in, const int32_t *positions, int T)
{
    const rt_interp_pages *pg = &in->pages;
    int64_t limit = (int64_t)pg->max_pages * in->page_size, need = 0;
    for (int t = 0; t < T; t++) {
        int32_t p = positions[t], r = pg->row ? pg->row[t] : 0;
        if (!in->paged && (p < 0 || p >= in->page_size))
            return MOEC_ERR(MOEC_ERR_CAPACITY, "position %d is past the KV cache (max_seq %d)",
                            (int)p, in->page_size);
        if (p < 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "token %d: position %d is negative", t, p);
        if (p >= limit)
            return MOEC_ERR(MOEC_ERR_CAPACITY,
                            "token %d: position %d is past its %d pages of %d positions", t, p,
                            pg->max_pages, in->page_size);
        if (r < 0 || r >= pg->n_rows)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "token %d: row %d of a page table of %d rows",
                            t, r, pg->n_rows);
        for (int64_t k = 0; k <= p / in->page_size; k++) {
            int32_t page = pg->table[(int64_t)r * pg->max_pages + k];
            if (page < 0 || page >= in->n_pages)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "token %d (position %d): page %lld of row %d is %d, not one of "
                                "the %d pages",
                                t, p, (long long)k, r, page, in->n_pages);
        }
        if (p + 1 > need)
            need = p + 1;
    }
    if (need <= in->scratch_cap)
        return MOEC_OK;
    free(in->scores);
    free(in->kv_rows);
    free(in->mark);
    free(in->cand);
    in->scores = malloc((size_t)need * sizeof *in->scores);
    in->kv_rows = malloc((size_t)need * sizeof *in->kv_rows);
    in->mark = calloc((size_t)need, 1);
    in->cand = malloc((size_t)need * sizeof *in->cand);
    in->scratch_cap = in->scores && in->kv_rows && in->mark && in->cand ? need : 0;
    if (!in->scratch_cap)
        return MOEC_ERR(MOEC_ERR_OOM, "no memory to attend to %lld positions", (long long)need);
    return MOEC_OK;
}

/* Checks a forward's inputs against its page map in->pages, sizes the
 * buffers and writes the inputs. */
static moec_status forward_begin(rt_interp *in, const int32_t *tokens, const int32_t *positions,
                                 int T, int want_out)
{
    if (!in || !tokens || !positions)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_forward: NULL argument");
    if (T < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_forward: T is %d; it must be at least 1",
                        T);
    MOEC_TRY(check_pages(in, positions, T));
    const ir_module *m = in->m;
    if (want_out && (m->n_outputs < 1 || !m->outputs[0]))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "module %s has no output to write",
                        m->name ? m->name : "?");
    MOEC_TRY(ensure_capacity(in, T));
    in->T = 0;
    memcpy(in->data[in->tokens->id], tokens, (size_t)T * sizeof(int32_t));
    memcpy(in->data[in->positions->id], positions, (size_t)T * sizeof(int32_t));
    return MOEC_OK;
}

/* Runs ops from *pc on until a collective (left for the group to run; *pc
 * at it) or the end (*pc = n_ops). */
/* v's n floats rounded to dt (bf16 or f16) to nearest even, as the GPU
 * stores them. */
static void round_floats(float *x, int64_t n, ir_dtype dt)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == IR_DTYPE_F16) {
            x[i] = (float)(_Float16)x[i];
            continue;
        }
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        if ((u & 0x7f800000u) != 0x7f800000u)
            u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        else if (u & 0x007fffffu)
            u |= 0x00400000u; /* a NaN stays a NaN */
        memcpy(&x[i], &u, sizeof u);
    }
}

/* rt_interp_round_storage's rounding of op's results. */
static void round_results(rt_interp *in, const ir_op *op, int T)
{
    if (in->round_dt == IR_DTYPE_F32 || (in->round_skip >> op->kind & 1))
        return;
    for (int i = 0; i < op->n_out; i++) {
        const ir_value *v = op->out[i];
        if (!is_i32(v) && ir_value_storage_dtype(in->m, v, in->round_dt) == in->round_dt)
            round_floats(fbuf(in, v), numel_of(v, T), in->round_dt);
    }
}

static moec_status run_to_collective(rt_interp *in, int *pc, int T)
{
    const ir_module *m = in->m;
    for (; *pc < m->n_ops && !is_collective(m->ops[*pc]->kind); (*pc)++) {
        MOEC_TRY(run_op(in, m->ops[*pc], T));
        round_results(in, m->ops[*pc], T);
    }
    return MOEC_OK;
}

/* A group's forward: every rank up to its next collective, the collective
 * across all of them, and again, until all have run every op. */
static moec_status group_forward(rt_interp *lead, int T)
{
    int n = lead->n_ranks, pc[IR_MAX_RANKS] = {0};
    for (;;) {
        int ended = 0;
        for (int r = 0; r < n; r++) {
            moec_status st = run_to_collective(lead->peers[r], &pc[r], T);
            if (st != MOEC_OK)
                return moec_err_wrap(st, "rank %d", r);
            ended += pc[r] == lead->peers[r]->m->n_ops;
        }
        if (ended == n)
            return MOEC_OK;
        const ir_op *ops[IR_MAX_RANKS];
        for (int r = 0; r < n; r++) {
            if (pc[r] == lead->peers[r]->m->n_ops)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "rank %d ran its last op while another rank waits in a "
                                "collective: the ranks' modules do not run the same collectives",
                                r);
            ops[r] = lead->peers[r]->m->ops[pc[r]];
        }
        MOEC_TRY(collective_run(lead->peers, ops, n, T));
        for (int r = 0; r < n; r++)
            pc[r]++;
    }
}

/* A forward of in (every rank of a group) through the page map pg. */
static moec_status forward(rt_interp *in, const rt_interp_pages *pg, const int32_t *tokens,
                           const int32_t *positions, int T, float *out)
{
    int n = in->peers ? in->n_ranks : 1;
    for (int r = 0; r < n; r++) {
        rt_interp *x = in->peers ? in->peers[r] : in;
        x->pages = *pg;
        moec_status st = forward_begin(x, tokens, positions, T, out != NULL);
        if (st != MOEC_OK)
            return n > 1 ? moec_err_wrap(st, "rank %d", r) : st;
    }
    const ir_module *m = in->m;
    if (in->peers) {
        MOEC_TRY(group_forward(in, T));
    } else {
        int pc = 0;
        for (; pc < m->n_ops; pc++) {
            MOEC_TRY(run_op(in, m->ops[pc], T));
            round_results(in, m->ops[pc], T);
        }
    }
    for (int r = 0; r < n; r++)
        (in->peers ? in->peers[r] : in)->T = T;
    if (out)
        memcpy(out, in->data[m->outputs[0]->id], (size_t)numel_of(m->outputs[0], T) * 4);
    return MOEC_OK;
}

moec_status rt_interp_forward(rt_interp *in, const int32_t *tokens, const int32_t *positions,
                              int T, float *out)
{
    if (!in)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_forward: NULL argument");
    if (in->paged)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_interp_forward: a paged interpreter needs a page map "
                        "(rt_interp_forward_paged)");
    rt_interp_pages pg = {.table = &in->page0, .max_pages = 1, .n_rows = 1};
    return forward(in, &pg, tokens, positions, T, out);
}

moec_status rt_interp_forward_paged(rt_interp *in, const rt_interp_pages *pages,
                                    const int32_t *tokens, const int32_t *positions, int T,
                                    float *out)
{
    if (!in || !pages || !pages->table || !pages->row || pages->max_pages < 1 ||
        pages->n_rows < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_interp_forward_paged: NULL interpreter or an empty page map");
    if (!in->paged)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_interp_forward_paged: the interpreter has one sequence's cache "
                        "(rt_interp_init_paged makes a paged one)");
    return forward(in, pages, tokens, positions, T, out);
}

int32_t rt_logits_argmax(const float *row, int n)
{
    int32_t best = 0;
    float top = row[0];
    for (int i = 0; i < n; i++) {
        if (!isfinite(row[i]))
            return IR_SAMPLED_NONFINITE;
        if (row[i] > top) {
            top = row[i];
            best = i;
        }
    }
    return best;
}

moec_status rt_interp_use_plan(rt_interp *in, int enable)
{
    if (!in)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_use_plan: NULL interpreter");
    for (int r = 1; in->peers && r < in->n_ranks; r++)
        MOEC_TRY(rt_interp_use_plan(in->peers[r], enable));
    int64_t per_token = 0;
    if (enable)
        MOEC_TRY(plan_check(in->m, &per_token));
    free_activations(in);
    in->planned = enable != 0;
    in->arena_bytes_per_token = per_token;
    in->T = 0;
    return MOEC_OK;
}

const float *rt_interp_value(const rt_interp *in, const ir_value *v)
{
    if (!in || !v || v->id < 0 || v->id >= in->m->n_values || in->m->values[v->id] != v)
        return NULL;
    if (v->kind != IR_VALUE_WEIGHT && in->T == 0)
        return NULL;
    return fbuf(in, v);
}

moec_status rt_interp_round_storage(rt_interp *in, ir_dtype dt, uint64_t skip)
{
    if (!in)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_interp_round_storage: NULL interpreter");
    if (dt != IR_DTYPE_F32 && dt != IR_DTYPE_BF16 && dt != IR_DTYPE_F16)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rt_interp_round_storage: %s is not a compute dtype (f32, bf16, f16)",
                        ir_dtype_name(dt));
    for (int r = 1; in->peers && r < in->n_ranks; r++)
        MOEC_TRY(rt_interp_round_storage(in->peers[r], dt, skip));
    const ir_module *m = in->m;
    for (int i = 0; dt != IR_DTYPE_F32 && i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind == IR_VALUE_WEIGHT && ir_value_storage_dtype(m, v, dt) == dt)
            round_floats(fbuf(in, v), numel_of(v, 0), dt);
    }
    in->round_dt = dt;
    in->round_skip = skip;
    return MOEC_OK;
}

void rt_interp_reset(rt_interp *in)
{
    if (!in)
        return;
    for (int r = 1; in->peers && r < in->n_ranks; r++)
        rt_interp_reset(in->peers[r]);
    size_t rows = (size_t)in->n_pages * (size_t)in->page_size;
    for (int i = 0; i < in->m->n_ops; i++) {
        if (!in->kv_written[i])
            continue;
        int64_t wk, wv;
        if (!cache_widths(in->m->ops[i], &wk, &wv))
            continue;
        memset(in->kv_written[i], 0, rows);
        memset(in->k_cache[i], 0, rows * (size_t)wk * sizeof(float));
        if (wv)
            memset(in->v_cache[i], 0, rows * (size_t)wv * sizeof(float));
    }
}
