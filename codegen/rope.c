/* rope.c — rotary position embedding, interleaved (DeepSeek) or neox
 * (Qwen), with none, linear or YaRN frequency scaling. The inverse
 * frequencies are computed here on the host, in fp32 step by step exactly as
 * the interpreter computes them (docs/IR.md), and baked into the program as
 * a __constant__ table of exact hex floats; the kernel forms the angle
 * (float)pos * inv_freq[i] in fp32 as transformers does, and scales cos and
 * sin by attn_factor. One thread rotates up to 4 (interleave) or 8 (neox)
 * channel pairs of one head of one token. With rotary_dim R < D (DeepSeek-
 * V3.2's indexer) the first R channels rotate as a head of R and the
 * threads of a head copy the other D - R.
 *
 * Kernel rope_<style>_h<H>_d<D>[_r<R>]_t<T>_<dtypes>_<hash of the table and
 * attn_factor>(const X *x, const int *pos, Y *y); grid ceil(T * H * R/2 /
 * pairs / 256), block 256. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg.h"
#include "err.h"

static int attr_num(const ir_op *op, const char *key, double *out)
{
    const ir_attr *a = ir_op_attr(op, key);
    if (a && a->kind == IR_ATTR_FLOAT)
        *out = a->f;
    else if (a && a->kind == IR_ATTR_INT)
        *out = (double)a->i;
    else
        return 0;
    return 1;
}

static moec_status need_num(const ir_op *op, const char *key, double *out)
{
    if (!attr_num(op, key, out))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: needs a numeric attribute %s",
                        ir_op_name(op->kind), op->out[0]->name, key);
    return MOEC_OK;
}

/* inv_freq[0 .. D/2-1], the interpreter's computation (runtime/interp.c). */
static moec_status inv_freq_table(const ir_op *op, int64_t D, float *inv_freq)
{
    double theta, factor = 1.0, low = 0, high = 0;
    MOEC_TRY(need_num(op, "theta", &theta));
    const char *scaling = ir_op_attr_str(op, "scaling", "none");
    int linear = !strcmp(scaling, "linear"), yarn = !strcmp(scaling, "yarn");
    if (!linear && !yarn && strcmp(scaling, "none") != 0)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "%s %%%s: scaling \"%s\" (want none, linear or yarn)",
                        ir_op_name(op->kind), op->out[0]->name, scaling);
    if (linear || yarn)
        MOEC_TRY(need_num(op, "factor", &factor));
    if (yarn) {
        MOEC_TRY(need_num(op, "yarn_low", &low));
        MOEC_TRY(need_num(op, "yarn_high", &high));
        if (low == high)
            high += 0.001;
    }
    for (int64_t i = 0; i < D / 2; i++) {
        float pos_freq = powf((float)theta, (float)(2 * i) / (float)D);
        inv_freq[i] = 1.0f / pos_freq;
        if (linear)
            inv_freq[i] /= (float)factor;
        if (yarn) {
            float interp = 1.0f / ((float)factor * pos_freq);
            float ramp = ((float)i - (float)low) / (float)(high - low);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            float extrap = 1.0f - ramp;
            inv_freq[i] = interp * (1.0f - extrap) + inv_freq[i] * extrap;
        }
        if (!isfinite(inv_freq[i]))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "%s %%%s: inverse frequency %lld is not finite (theta %g)",
                            ir_op_name(op->kind), op->out[0]->name, (long long)i, theta);
    }
    return MOEC_OK;
}

static uint64_t hash_floats(const float *v, int64_t n, uint64_t h)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], sizeof bits);
        for (int b = 0; b < 4; b++)
            h = (h ^ ((bits >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    }
    return h;
}

moec_status cg_rope_init(const ir_op *op, int64_t R, cg_rope *r)
{
    memset(r, 0, sizeof *r);
    double af;
    r->attn_factor = attr_num(op, "attn_factor", &af) ? (float)af : 1.0f;
    if (!isfinite(r->attn_factor))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s %%%s: attn_factor is not finite",
                        ir_op_name(op->kind), op->out[0]->name);
    r->half = R / 2;
    r->inv_freq = malloc(sizeof(float) * (size_t)(r->half + 1));
    if (!r->inv_freq)
        return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", ir_op_name(op->kind),
                        op->out[0]->name);
    moec_status st = inv_freq_table(op, R, r->inv_freq);
    if (st != MOEC_OK) {
        cg_rope_free(r);
        return st;
    }
    uint64_t h = hash_floats(r->inv_freq, r->half, 0xcbf29ce484222325ull);
    h = hash_floats(&r->attn_factor, 1, h);
    r->hash = (unsigned)(h ^ (h >> 32));
    return MOEC_OK;
}

void cg_rope_free(cg_rope *r)
{
    free(r->inv_freq);
    r->inv_freq = NULL;
}

void cg_rope_emit_table(moec_buf *b, const cg_rope *r, const char *sym)
{
    moec_buf_printf(b, "__constant__ float %s[%lld] = {", sym, (long long)r->half);
    for (int64_t i = 0; i < r->half; i++)
        moec_buf_printf(b, "%s%af",
                      i == 0  ? "\n    "
                      : i % 4 ? ", "
                              : ",\n    ",
                      (double)r->inv_freq[i]);
    moec_buf_printf(b, "};\n");
}

moec_status cg_emit_rope(cg_ctx *c, const ir_op *op)
{
    const ir_value *x = op->in[0], *pos = op->in[1], *y = op->out[0];
    const char *style = ir_op_attr_str(op, "style", "");
    int neox = !strcmp(style, "neox");
    if (!neox && strcmp(style, "interleave") != 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rope %%%s: style must be \"interleave\" or \"neox\", not \"%s\"", y->name,
                        style);
    if (x->type.rank != 3 || x->type.dims[2] < 2 || x->type.dims[2] % 2 ||
        cg_storage(c, pos) != IR_DTYPE_I32 || ir_type_numel(&pos->type, 1) != 1 ||
        ir_type_numel(&y->type, 1) != ir_type_numel(&x->type, 1))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "rope %%%s: wants x [T, H, D] with D even, pos i32[T]", y->name);
    int64_t H = x->type.dims[1], D = x->type.dims[2];
    int64_t R = ir_op_attr_int(op, "rotary_dim", D), half = R / 2;
    if (R < 2 || R > D || R % 2)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rope %%%s: rotary_dim %lld out of [2, %lld] or odd",
                        y->name, (long long)R, (long long)D);
    ir_dtype tx = cg_storage(c, x), ty = cg_storage(c, y);
    if (tx == IR_DTYPE_I32 || ty == IR_DTYPE_I32)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rope %%%s: integer operands", y->name);
    cg_rope rt;
    MOEC_TRY(cg_rope_init(op, R, &rt));
    float af = rt.attn_factor;
    /* vector loads stay aligned in every head: pairs divide the half and
       the head (the rows of rotary_dim < D start at multiples of D) */
    int pairs = neox ? 8 : 4;
    while (pairs > 1 && (half % pairs || D % (neox ? pairs : 2 * pairs)))
        pairs /= 2;
    int64_t per_head = half / pairs, units = (int64_t)c->T * H * per_head;
    char name[256];
    int n = snprintf(name, sizeof name, "rope_%s_h%lld_d%lld", style, (long long)H, (long long)D);
    if (R < D)
        n += snprintf(name + n, sizeof name - (size_t)n, "_r%lld", (long long)R);
    n += snprintf(name + n, sizeof name - (size_t)n, "_t%d_%s", c->T, ir_dtype_name(ty));
    if (tx != ty)
        n += snprintf(name + n, sizeof name - (size_t)n, "_%s", ir_dtype_name(tx));
    snprintf(name + n, sizeof name - (size_t)n, "_%08x", rt.hash);
    int is_new;
    int k = cg_kernel(c, name, &is_new);
    if (k < 0) {
        cg_rope_free(&rt);
        return MOEC_ERR(MOEC_ERR_OOM, "rope %%%s: out of memory", y->name);
    }
    if (is_new) {
        moec_buf *b = &c->src;
        char scale[96] = ""; /* cos and sin times attn_factor (x * 1 is exact: omitted) */
        /* the channels past R: the head's threads copy chunks of pv */
        char pass[256] = "";
        int64_t g = R, r = D;
        while (r) {
            int64_t t = g % r;
            g = r;
            r = t;
        }
        int pv = cg_vec_width(g); /* divides R, D and so D - R */
        if (R < D)
            snprintf(pass, sizeof pass,
                     "    for (int j = c * %d; j < %lld; j += %lld)\n"
                     "        cpv<%d>(yh + %lld + j, xh + %lld + j);\n",
                     pv, (long long)(D - R), (long long)per_head * pv, pv, (long long)R,
                     (long long)R);
        if (af != 1.0f)
            snprintf(scale, sizeof scale, "        cs[q] *= %af;\n        sn[q] *= %af;\n",
                     (double)af, (double)af);
        char sym[300];
        snprintf(sym, sizeof sym, "%s_inv_freq", name);
        moec_buf_printf(b, "// rope (codegen/rope.c), first for %%%s\n", y->name);
        cg_rope_emit_table(b, &rt, sym);
        moec_buf_printf(
            b,
            "extern \"C\" __global__ void __launch_bounds__(256)\n"
            "%s(const %s *__restrict__ x, const int *__restrict__ pos, %s *__restrict__ y)\n"
            "{\n"
            "    const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i >= %lld)\n"
            "        return;\n"
            "    const int c = i %% %lld, th = i / %lld, t = th / %lld;\n"
            "    const float p = (float)pos[t];\n"
            "    float cs[%d], sn[%d];\n"
            "#pragma unroll\n"
            "    for (int q = 0; q < %d; q++) {\n"
            "        const float angle = p * %s_inv_freq[c * %d + q];\n"
            "        sincosf(angle, &sn[q], &cs[q]);\n"
            "%s"
            "    }\n"
            "    const %s *xh = x + (long long)th * %lld;\n"
            "    %s *yh = y + (long long)th * %lld;\n%s",
            name, cg_ctype(tx), cg_ctype(ty), (long long)units, (long long)per_head,
            (long long)per_head, (long long)H, pairs, pairs, pairs, name, pairs, scale,
            cg_ctype(tx), (long long)D, cg_ctype(ty), (long long)D, pass);
        if (neox)
            moec_buf_printf(b,
                          "    float lo[%d], hi[%d], olo[%d], ohi[%d];\n"
                          "    ldv<%d>(xh + c * %d, lo);\n"
                          "    ldv<%d>(xh + %lld + c * %d, hi);\n"
                          "#pragma unroll\n"
                          "    for (int q = 0; q < %d; q++) {\n"
                          "        olo[q] = lo[q] * cs[q] - hi[q] * sn[q];\n"
                          "        ohi[q] = hi[q] * cs[q] + lo[q] * sn[q];\n"
                          "    }\n"
                          "    stv<%d>(yh + c * %d, olo);\n"
                          "    stv<%d>(yh + %lld + c * %d, ohi);\n"
                          "}\n\n",
                          pairs, pairs, pairs, pairs, pairs, pairs, pairs, (long long)half, pairs,
                          pairs, pairs, pairs, pairs, (long long)half, pairs);
        else
            moec_buf_printf(b,
                          "    float v[%d], o[%d];\n"
                          "    ldv<%d>(xh + c * %d, v);\n"
                          "#pragma unroll\n"
                          "    for (int q = 0; q < %d; q++) {\n"
                          "        o[2 * q] = v[2 * q] * cs[q] - v[2 * q + 1] * sn[q];\n"
                          "        o[2 * q + 1] = v[2 * q + 1] * cs[q] + v[2 * q] * sn[q];\n"
                          "    }\n"
                          "    stv<%d>(yh + c * %d, o);\n"
                          "}\n\n",
                          2 * pairs, 2 * pairs, 2 * pairs, 2 * pairs, pairs, 2 * pairs, 2 * pairs);
    }
    cg_rope_free(&rt);
    ir_step *s = cg_step(c, IR_STEP_KERNEL, op);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "rope %%%s: out of memory", y->name);
    s->kernel = k;
    s->grid[0] = (unsigned)((units + 255) / 256);
    s->block[0] = 256;
    s->n_args = 3;
    s->args[0] = cg_arg_act(x);
    s->args[1] = cg_arg_act(pos);
    s->args[2] = cg_arg_act(y);
    return MOEC_OK;
}
