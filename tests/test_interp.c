/* test_interp.c — the CPU reference interpreter checked op by op against
 * numbers worked out here independently (closed forms, hand-picked cases,
 * straightforward double loops), plus its KV cache behaviour and errors. */
#include <math.h>
#include <string.h>

#include "ir/ir.h"
#include "runtime/interp.h"
#include "testlib.h"

/* ---- building tiny modules ------------------------------------------------ */

static ir_type ty(ir_dtype dt, int rank, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    ir_type t = {dt, rank, {d0, d1, d2, d3}};
    return t;
}
#define F32(...) ty(IR_DTYPE_F32, __VA_ARGS__)

static void die(const char *what)
{
    fprintf(stderr, "building %s: %s\n", what, moec_last_error());
    exit(2);
}

/* A module with inputs %tokens and %positions. */
static ir_module *new_module(void)
{
    ir_module *m = ir_module_init("test");
    if (!m || !ir_module_add_input(m, "tokens", ty(IR_DTYPE_I32, 1, IR_DIM_T, 0, 0, 0)) ||
        !ir_module_add_input(m, "positions", ty(IR_DTYPE_I32, 1, IR_DIM_T, 0, 0, 0)))
        die("module");
    return m;
}

static ir_value *tokens_of(ir_module *m) { return ir_module_find_value(m, "tokens"); }
static ir_value *positions_of(ir_module *m) { return ir_module_find_value(m, "positions"); }

static ir_value *weight(ir_module *m, const char *name, ir_type t)
{
    ir_value *v = ir_module_add_weight(m, name, t, name);
    if (!v)
        die(name);
    return v;
}

/* Starts a one-result op; attributes are set on it, then fin() finishes it. */
static ir_op *start(ir_module *m, ir_op_kind k, const char *name, ir_value *const *in, int n)
{
    const char *names[1] = {name};
    ir_op *op = ir_module_add_op(m, k, in, n, names, 1);
    if (!op)
        die(name);
    return op;
}

static ir_value *fin(ir_module *m, ir_op *op, const ir_type *hint)
{
    if (ir_op_finish(m, op, hint) != MOEC_OK)
        die(op->out[0] ? op->out[0]->name : "op");
    return op->out[0];
}

#define INS(...) (ir_value *[]){__VA_ARGS__}, (int)(sizeof((ir_value *[]){__VA_ARGS__}) / sizeof(ir_value *))

static ir_value *build(ir_module *m, ir_op_kind k, const char *name, ir_value *const *in, int n)
{
    ir_value *v = ir_build(m, k, name, in, n);
    if (!v)
        die(name);
    return v;
}

static ir_value *reshape(ir_module *m, const char *name, ir_value *x, ir_type t)
{
    return fin(m, start(m, IR_OP_RESHAPE, name, INS(x)), &t);
}

static ir_value *slice(ir_module *m, const char *name, ir_value *x, int axis, int start_, int size)
{
    ir_op *op = start(m, IR_OP_SLICE, name, INS(x));
    T_OK(ir_op_set_int(m, op, "axis", axis));
    T_OK(ir_op_set_int(m, op, "start", start_));
    T_OK(ir_op_set_int(m, op, "size", size));
    return fin(m, op, NULL);
}

/* %x = embedding(%tokens, %table): the way every test feeds activations. */
static ir_value *embed(ir_module *m, int64_t V, int64_t H)
{
    ir_value *table = weight(m, "table", F32(2, V, H, 0, 0));
    return build(m, IR_OP_EMBEDDING, "x", INS(tokens_of(m), table));
}

static void output(ir_module *m, ir_value *v)
{
    if (ir_module_add_output(m, v) != MOEC_OK)
        die("output");
}

static void set(rt_interp *in, ir_module *m, const char *name, const float *data)
{
    T_OK(rt_interp_set_weight(in, ir_module_find_value(m, name), data));
}

static const float *val(rt_interp *in, ir_module *m, const char *name)
{
    const float *p = rt_interp_value(in, ir_module_find_value(m, name));
    if (!p) {
        fprintf(stderr, "no value %s\n", name);
        exit(2);
    }
    return p;
}

/* Relative to the value, absolute below 1 (where cancellation leaves rounding
 * of larger terms). */
static int close_to(double got, double want, double rel)
{
    return fabs(got - want) <= rel * fmax(fabs(want), 1.0);
}

/* Counts (and prints the first of) elements off by more than rel. */
static int mismatches(const char *what, const float *got, const double *want, int n, double rel)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (close_to(got[i], want[i], rel))
            continue;
        if (bad++ < 4)
            fprintf(stderr, "%s[%d]: got %.9g, want %.9g\n", what, i, got[i], want[i]);
    }
    return bad;
}

static void fill_random(float *p, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++)
        p[i] = t_rand_normal(rng);
}

static const int32_t POS[8] = {0, 1, 2, 3, 4, 5, 6, 7};

/* ---- elementwise and linear ----------------------------------------------- */

static void test_rms_norm_linear_embedding(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 4, 3);
    ir_value *w = weight(m, "norm", F32(1, 3, 0, 0, 0));
    ir_op *op = start(m, IR_OP_RMS_NORM, "n", INS(x, w));
    T_OK(ir_op_set_float(m, op, "eps", 0.0));
    fin(m, op, NULL);
    ir_value *lw = weight(m, "lw", F32(2, 2, 3, 0, 0));
    ir_value *lb = weight(m, "lb", F32(1, 2, 0, 0, 0));
    output(m, build(m, IR_OP_LINEAR, "y", INS(x, lw, lb)));
    build(m, IR_OP_LINEAR, "y_nobias", INS(x, lw));

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 8, &in));
    float table[12] = {0, 0, 0, 3, 4, 0, 1, -2, 2, 5, 5, 5};
    float nw[3] = {1, 2, -1};
    float lwv[6] = {1, 0, 2, -1, 0.5f, 3};
    float lbv[2] = {0.25f, -1};
    set(in, m, "table", table);
    set(in, m, "norm", nw);
    set(in, m, "lw", lwv);
    set(in, m, "lb", lbv);
    T_CHECK(rt_interp_weight(in, ir_module_find_value(m, "lw"))[5] == 3.0f);
    T_CHECK(rt_interp_weight(in, x) == NULL);

    int32_t tok[2] = {1, 2};
    float y[4];
    T_OK(rt_interp_forward(in, tok, POS, 2, y));
    /* embedding: rows 1 and 2 of the table */
    const float *xv = val(in, m, "x");
    T_CHECK(xv[0] == 3 && xv[1] == 4 && xv[2] == 0 && xv[3] == 1 && xv[4] == -2 && xv[5] == 2);
    /* rms_norm of [3, 4, 0]: rms = sqrt(25/3); of [1, -2, 2]: rms = sqrt(3) */
    const float *n = val(in, m, "n");
    double r0 = sqrt(25.0 / 3), r1 = sqrt(3.0);
    double want_n[6] = {3 / r0, 2 * 4 / r0, 0, 1 / r1, 2 * -2 / r1, -1 * 2 / r1};
    T_CHECK(mismatches("rms_norm", n, want_n, 6, 1e-6) == 0);
    /* linear: [3,4,0]·[1,0,2] + .25 = 3.25, [3,4,0]·[-1,.5,3] - 1 = -2;
     * [1,-2,2]·[1,0,2] + .25 = 5.25, [1,-2,2]·[-1,.5,3] - 1 = 3 */
    double want_y[4] = {3.25, -2, 5.25, 3};
    T_CHECK(mismatches("linear", y, want_y, 4, 1e-6) == 0);
    const float *nb = val(in, m, "y_nobias");
    T_CHECK(nb[0] == 3.0f && nb[1] == -1.0f && nb[2] == 5.0f && nb[3] == 4.0f);

    /* a token id outside the vocabulary */
    int32_t bad[2] = {1, 4};
    T_ERR(rt_interp_forward(in, bad, POS, 2, y), MOEC_ERR_INVALID_ARG, "token id 4");
    T_ERR(rt_interp_forward(in, bad, POS, 2, y), MOEC_ERR_INVALID_ARG, "[0, 4)");
    int32_t neg[1] = {-1};
    T_ERR(rt_interp_forward(in, neg, POS, 1, y), MOEC_ERR_INVALID_ARG, "token id -1");
    /* set_weight on something that is not a weight */
    T_ERR(rt_interp_set_weight(in, x, table), MOEC_ERR_INVALID_ARG, "x is not a weight");
    rt_interp_free(in);
    ir_module_free(m);
}

static void test_silu_sigmoid_add_mul(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 1, 3);
    build(m, IR_OP_SIGMOID, "sg", INS(x));
    build(m, IR_OP_SILU, "si", INS(x));
    ir_value *b = slice(m, "b", x, 1, 2, 1); /* [T, 1] */
    build(m, IR_OP_ADD, "add", INS(x, b));
    ir_value *mw = weight(m, "mw", F32(2, 1, 3, 0, 0)); /* broadcast over T */
    output(m, build(m, IR_OP_MUL, "mul", INS(x, mw)));

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    float table[3] = {-2, 0, 1.5f}, mwv[3] = {2, 3, -4};
    set(in, m, "table", table);
    set(in, m, "mw", mwv);
    int32_t tok[1] = {0};
    float y[3];
    T_OK(rt_interp_forward(in, tok, POS, 1, y));
    double sg[3] = {1 / (1 + exp(2.0)), 0.5, 1 / (1 + exp(-1.5))};
    double si[3] = {-2 * sg[0], 0, 1.5 * sg[2]};
    T_CHECK(mismatches("sigmoid", val(in, m, "sg"), sg, 3, 1e-6) == 0);
    T_CHECK(mismatches("silu", val(in, m, "si"), si, 3, 1e-6) == 0);
    T_CHECK(fabs(val(in, m, "sg")[0] - 0.11920292) < 1e-7);
    double add[3] = {-0.5, 1.5, 3}, mul[3] = {-4, 0, -6};
    T_CHECK(mismatches("add", val(in, m, "add"), add, 3, 0) == 0);
    T_CHECK(mismatches("mul", y, mul, 3, 0) == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

/* ---- data movement on 3-D values ------------------------------------------ */

static void test_movement(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 2, 6);
    ir_value *x3 = reshape(m, "x3", x, F32(3, IR_DIM_T, 2, 3, 0));      /* [T, 2, 3] */
    ir_value *s = slice(m, "s", x3, 2, 1, 2);                         /* [T, 2, 2] */
    ir_op *cat = start(m, IR_OP_CONCAT, "cat", INS(x3, s));
    T_OK(ir_op_set_int(m, cat, "axis", 2));
    fin(m, cat, NULL);                                                /* [T, 2, 5] */
    ir_op *cat1 = start(m, IR_OP_CONCAT, "cat1", INS(s, x3, s));
    T_OK(ir_op_set_int(m, cat1, "axis", 2));
    fin(m, cat1, NULL);                                               /* [T, 2, 7] */
    ir_value *row = slice(m, "row", x3, 1, 1, 1);                     /* [T, 1, 3] */
    ir_type ex_t = F32(3, IR_DIM_T, 4, 3, 0);
    fin(m, start(m, IR_OP_EXPAND, "ex", INS(row)), &ex_t);           /* [T, 4, 3] */
    ir_value *col = slice(m, "col", x3, 2, 0, 1);                     /* [T, 2, 1] */
    ir_type ex2_t = F32(3, IR_DIM_T, 2, 5, 0);
    fin(m, start(m, IR_OP_EXPAND, "ex2", INS(col)), &ex2_t);         /* [T, 2, 5] */
    ir_op *r1 = start(m, IR_OP_REDUCE_SUM, "r1", INS(x3));
    T_OK(ir_op_set_int(m, r1, "axis", 1));
    fin(m, r1, NULL);                                                 /* [T, 3] */
    ir_op *r2 = start(m, IR_OP_REDUCE_SUM, "r2", INS(x3));
    T_OK(ir_op_set_int(m, r2, "axis", 2));
    output(m, fin(m, r2, NULL));                                      /* [T, 2] */

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    float table[12];
    for (int i = 0; i < 12; i++)
        table[i] = (float)(i * i) - 3.5f * (float)i;
    set(in, m, "table", table);
    int32_t tok[3] = {1, 0, 1};
    float out[6];
    /* T = 1 first, then T = 3 (the buffers grow) */
    T_OK(rt_interp_forward(in, tok + 1, POS, 1, out));
    T_CHECK(out[0] == table[0] + table[1] + table[2] && out[1] == table[3] + table[4] + table[5]);
    T_OK(rt_interp_forward(in, tok, POS, 3, out));
    int bad = 0;
    const float *sv = val(in, m, "s"), *cv = val(in, m, "cat"), *c1 = val(in, m, "cat1");
    const float *ev = val(in, m, "ex"), *e2 = val(in, m, "ex2");
    const float *r1v = val(in, m, "r1");
    for (int t = 0; t < 3; t++) {
        const float *xt = table + tok[t] * 6; /* x3[t][i][j] = xt[i*3+j] */
        for (int i = 0; i < 2; i++) {
            for (int j = 0; j < 2; j++)
                bad += sv[(t * 2 + i) * 2 + j] != xt[i * 3 + 1 + j];
            for (int j = 0; j < 5; j++) {
                float want = j < 3 ? xt[i * 3 + j] : xt[i * 3 + 1 + (j - 3)];
                bad += cv[(t * 2 + i) * 5 + j] != want;
                bad += e2[(t * 2 + i) * 5 + j] != xt[i * 3];
            }
            for (int j = 0; j < 7; j++) {
                float want = j < 2 ? xt[i * 3 + 1 + j] : j < 5 ? xt[i * 3 + j - 2]
                                                           : xt[i * 3 + 1 + (j - 5)];
                bad += c1[(t * 2 + i) * 7 + j] != want;
            }
            bad += out[t * 2 + i] != xt[i * 3] + xt[i * 3 + 1] + xt[i * 3 + 2];
        }
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < 3; j++)
                bad += ev[(t * 4 + r) * 3 + j] != xt[3 + j];
        for (int j = 0; j < 3; j++)
            bad += r1v[t * 3 + j] != xt[j] + xt[3 + j];
    }
    T_CHECK(bad == 0);
    /* reshape keeps the row-major order */
    T_CHECK(memcmp(val(in, m, "x3"), val(in, m, "x"), 18 * sizeof(float)) == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

/* ---- rope ----------------------------------------------------------------- */

static ir_value *rope(ir_module *m, const char *name, ir_value *x, const char *style)
{
    ir_op *op = start(m, IR_OP_ROPE, name, INS(x, positions_of(m)));
    T_OK(ir_op_set_str(m, op, "style", style));
    T_OK(ir_op_set_float(m, op, "theta", 10000.0));
    return fin(m, op, NULL);
}

static void test_rope(void)
{
    ir_module *m = new_module();
    ir_value *x = reshape(m, "x3", embed(m, 1, 4), F32(3, IR_DIM_T, 1, 4, 0));
    rope(m, "inter", x, "interleave");
    rope(m, "neox", x, "neox");
    ir_op *op = start(m, IR_OP_ROPE, "scaled", INS(x, positions_of(m)));
    T_OK(ir_op_set_str(m, op, "style", "neox"));
    T_OK(ir_op_set_float(m, op, "theta", 10000.0));
    T_OK(ir_op_set_str(m, op, "scaling", "linear"));
    T_OK(ir_op_set_float(m, op, "factor", 2.0));
    T_OK(ir_op_set_float(m, op, "attn_factor", 0.5));
    output(m, fin(m, op, NULL));

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 8, &in));
    float table[4] = {0.5f, -1.25f, 2, 0.75f};
    set(in, m, "table", table);
    int32_t tok[2] = {0, 0}, pos[2] = {1, 3};
    float out[8];
    T_OK(rt_interp_forward(in, tok, pos, 2, out));
    /* D = 4, theta = 10000: inv_freq = [1, 1/100] */
    const double a = 0.5, b = -1.25, c = 2, d = 0.75;
    double wi[8], wn[8], ws[8];
    for (int t = 0; t < 2; t++) {
        double p = pos[t], c0 = cos(p), s0 = sin(p), c1 = cos(p / 100), s1 = sin(p / 100);
        double *i = wi + 4 * t, *n = wn + 4 * t, *s = ws + 4 * t;
        /* interleave: pairs (0, 1) at angle p, (2, 3) at p/100 */
        i[0] = a * c0 - b * s0, i[1] = b * c0 + a * s0;
        i[2] = c * c1 - d * s1, i[3] = d * c1 + c * s1;
        /* neox: pairs (0, 2) at angle p, (1, 3) at p/100 */
        n[0] = a * c0 - c * s0, n[2] = c * c0 + a * s0;
        n[1] = b * c1 - d * s1, n[3] = d * c1 + b * s1;
        /* linear factor 2 halves the angles; attn_factor 0.5 scales cos, sin */
        double h0 = p / 2, h1 = p / 200;
        s[0] = 0.5 * (a * cos(h0) - c * sin(h0)), s[2] = 0.5 * (c * cos(h0) + a * sin(h0));
        s[1] = 0.5 * (b * cos(h1) - d * sin(h1)), s[3] = 0.5 * (d * cos(h1) + b * sin(h1));
    }
    T_CHECK(mismatches("rope interleave", val(in, m, "inter"), wi, 8, 2e-6) == 0);
    T_CHECK(mismatches("rope neox", val(in, m, "neox"), wn, 8, 2e-6) == 0);
    T_CHECK(mismatches("rope linear", out, ws, 8, 2e-6) == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

/* YaRN: recover inv_freq[i] from the rotation of [1, 0] pairs at position 1
 * and compare with the formula of the YaRN paper, written here in double. */
static void test_rope_yarn(void)
{
    enum { D = 16 };
    const double theta = 10000, factor = 4, orig_max = 4096, beta_fast = 32, beta_slow = 1;
    const double attn_factor = 0.1 * log(factor) + 1;
    double low = floor(D * log(orig_max / (beta_fast * 2 * M_PI)) / (2 * log(theta)));
    double high = ceil(D * log(orig_max / (beta_slow * 2 * M_PI)) / (2 * log(theta)));
    T_CHECK(low == 2 && high == 6); /* the ramp spans the middle of the 8 frequencies */

    ir_module *m = new_module();
    ir_value *x = reshape(m, "x3", embed(m, 1, D), F32(3, IR_DIM_T, 1, D, 0));
    ir_op *op = start(m, IR_OP_ROPE, "y", INS(x, positions_of(m)));
    T_OK(ir_op_set_str(m, op, "style", "interleave"));
    T_OK(ir_op_set_float(m, op, "theta", theta));
    T_OK(ir_op_set_str(m, op, "scaling", "yarn"));
    T_OK(ir_op_set_float(m, op, "factor", factor));
    T_OK(ir_op_set_float(m, op, "yarn_low", low));
    T_OK(ir_op_set_float(m, op, "yarn_high", high));
    T_OK(ir_op_set_float(m, op, "attn_factor", attn_factor));
    output(m, fin(m, op, NULL));

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    float table[D];
    for (int i = 0; i < D; i++)
        table[i] = i % 2 == 0 ? 1.0f : 0.0f;
    set(in, m, "table", table);
    int32_t tok[1] = {0}, pos[1] = {1};
    float y[D];
    T_OK(rt_interp_forward(in, tok, pos, 1, y));
    int bad = 0;
    for (int i = 0; i < D / 2; i++) {
        double base = pow(theta, -2.0 * i / D);
        double ramp = fmin(fmax((i - low) / (high - low), 0), 1);
        double want = base / factor * ramp + base * (1 - ramp);
        double got = atan2(y[2 * i + 1], y[2 * i]);
        double mag = hypot(y[2 * i], y[2 * i + 1]);
        if (fabs(got - want) > 1e-6 * want || fabs(mag - attn_factor) > 1e-6) {
            bad++;
            fprintf(stderr, "yarn inv_freq[%d]: got %.9g (|.| %.9g), want %.9g (|.| %.9g)\n", i,
                    got, mag, want, attn_factor);
        }
    }
    T_CHECK(bad == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

/* ---- attention ------------------------------------------------------------ */

enum { AH = 4, AHKV = 2, ADK = 3, ADV = 2, AN = AH * ADK + AHKV * ADK + AHKV * ADV };

/* x [T, AN] split into q [T, 4, 3], k [T, 2, 3], v [T, 2, 2]; attention out. */
static ir_module *attention_module(int window)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 6, AN);
    ir_value *q = reshape(m, "q", slice(m, "qf", x, 1, 0, AH * ADK), F32(3, IR_DIM_T, AH, ADK, 0));
    ir_value *k = reshape(m, "k", slice(m, "kf", x, 1, AH * ADK, AHKV * ADK),
                          F32(3, IR_DIM_T, AHKV, ADK, 0));
    ir_value *v = reshape(m, "v", slice(m, "vf", x, 1, (AH + AHKV) * ADK, AHKV * ADV),
                          F32(3, IR_DIM_T, AHKV, ADV, 0));
    ir_op *op = start(m, IR_OP_ATTENTION, "o", INS(q, k, v, positions_of(m)));
    T_OK(ir_op_set_float(m, op, "scale", 0.7));
    if (window)
        T_OK(ir_op_set_int(m, op, "window", window));
    ir_value *o = fin(m, op, NULL);
    output(m, reshape(m, "of", o, F32(2, IR_DIM_T, AH * ADV, 0, 0)));
    return m;
}

/* Attention recomputed directly in double from the embedding rows. */
static void attention_reference(const float *table, const int32_t *tok, int T, int window,
                                double *out)
{
    for (int t = 0; t < T; t++) {
        const float *xq = table + tok[t] * AN;
        for (int h = 0; h < AH; h++) {
            int kvh = h / (AH / AHKV);
            double sc[8], mx = -INFINITY, sum = 0;
            int lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
            for (int p = lo; p <= t; p++) {
                const float *xk = table + tok[p] * AN + AH * ADK + kvh * ADK;
                double dot = 0;
                for (int j = 0; j < ADK; j++)
                    dot += (double)xq[h * ADK + j] * xk[j];
                sc[p] = 0.7 * dot;
                mx = fmax(mx, sc[p]);
            }
            for (int p = lo; p <= t; p++)
                sum += exp(sc[p] - mx);
            for (int j = 0; j < ADV; j++) {
                double acc = 0;
                for (int p = lo; p <= t; p++)
                    acc += exp(sc[p] - mx) / sum *
                           table[tok[p] * AN + (AH + AHKV) * ADK + kvh * ADV + j];
                out[(t * AH + h) * ADV + j] = acc;
            }
        }
    }
}

static void test_attention(void)
{
    uint64_t rng = 7;
    float table[6 * AN];
    fill_random(table, 6 * AN, &rng);
    int32_t tok[5] = {3, 0, 5, 2, 4};
    for (int window = 0; window <= 2; window += 2) {
        ir_module *m = attention_module(window);
        rt_interp *a, *b;
        T_OK(rt_interp_init(m, NULL, 8, &a));
        T_OK(rt_interp_init(m, NULL, 8, &b));
        set(a, m, "table", table);
        set(b, m, "table", table);
        /* a: prefill 3 tokens then decode 1; b: all 4 at once */
        float pre[3 * AH * ADV], dec[AH * ADV], all[4 * AH * ADV];
        T_OK(rt_interp_forward(a, tok, POS, 3, pre));
        T_OK(rt_interp_forward(a, tok + 3, POS + 3, 1, dec));
        T_OK(rt_interp_forward(b, tok, POS, 4, all));
        double want[4 * AH * ADV];
        attention_reference(table, tok, 4, window, want);
        T_CHECK(mismatches("attention prefill", pre, want, 3 * AH * ADV, 1e-5) == 0);
        T_CHECK(mismatches("attention decode", dec, want + 3 * AH * ADV, AH * ADV, 1e-5) == 0);
        T_CHECK(mismatches("attention all", all, want, 4 * AH * ADV, 1e-5) == 0);
        T_CHECK(memcmp(all + 3 * AH * ADV, dec, sizeof dec) == 0);
        /* causality: token 0 sees only itself, so head h gives v[0] of kv head h / 2 */
        int bad = 0;
        for (int h = 0; h < AH; h++)
            for (int j = 0; j < ADV; j++)
                bad += fabsf(all[h * ADV + j] -
                             table[tok[0] * AN + (AH + AHKV) * ADK + (h / 2) * ADV + j]) > 1e-6f;
        T_CHECK(bad == 0);
        if (window == 2) {
            /* with window 2, token 3 ignores tokens 0 and 1: same as [5, 2] alone */
            double w2[2 * AH * ADV];
            attention_reference(table, tok + 2, 2, 0, w2);
            T_CHECK(mismatches("attention window", dec, w2 + AH * ADV, AH * ADV, 1e-5) == 0);
        }
        /* reset empties the cache: decoding position 3 again needs 0..2 (or 2 with window) */
        rt_interp_reset(a);
        T_ERR(rt_interp_forward(a, tok + 3, POS + 3, 1, dec), MOEC_ERR_INVALID_ARG,
              window ? "attends to position 2" : "attends to position 0");
        rt_interp_reset(a);
        T_OK(rt_interp_forward(a, tok, POS, 4, all));
        T_CHECK(mismatches("attention after reset", all, want, 4 * AH * ADV, 1e-5) == 0);
        /* positions past the cache */
        int32_t far[1] = {8};
        T_ERR(rt_interp_forward(a, tok, far, 1, dec), MOEC_ERR_CAPACITY,
              "position 8 is past the KV cache (max_seq 8)");
        T_ERR(rt_interp_forward(a, tok, POS, 0, dec), MOEC_ERR_INVALID_ARG, "T is 0");
        rt_interp_free(a);
        rt_interp_free(b);
        ir_module_free(m);
    }
}

/* ---- moe_topk ------------------------------------------------------------- */

static void test_moe_topk_softmax(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 2, 4);
    const char *names[2] = {"ids", "w"};
    ir_op *op = ir_module_add_op(m, IR_OP_MOE_TOPK, INS(x), names, 2);
    if (!op)
        die("moe_topk");
    T_OK(ir_op_set_str(m, op, "scoring", "softmax"));
    T_OK(ir_op_set_int(m, op, "top_k", 2));
    fin(m, op, NULL);
    output(m, op->out[1]);

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    /* row 0: logits [1, 3, 2, 0.5] -> ids 1, 2; row 1: a tie [2, 1, 2, 0] -> ids 0, 2 */
    float table[8] = {1, 3, 2, 0.5f, 2, 1, 2, 0};
    set(in, m, "table", table);
    int32_t tok[2] = {0, 1};
    float w[4];
    T_OK(rt_interp_forward(in, tok, POS, 2, w));
    const int32_t *ids = (const int32_t *)val(in, m, "ids");
    T_CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 0 && ids[3] == 2);
    double z0 = exp(1.0) + exp(3.0) + exp(2.0) + exp(0.5), z1 = 2 * exp(2.0) + exp(1.0) + 1;
    double want[4] = {exp(3.0) / z0, exp(2.0) / z0, exp(2.0) / z1, exp(2.0) / z1};
    T_CHECK(mismatches("topk softmax", w, want, 4, 1e-6) == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

/* DeepSeek-V3 routing: sigmoid scores s, bias for selection only, 4 groups
 * of 2 experts, 2 groups kept, top-2, normalized, scaled by 2.5.
 *   s    = [.95 .01 | .60 .50 | .70 .45 | .30 .20],  bias[3] = .25
 *   c    = [.95 .01 | .60 .75 | .70 .45 | .30 .20]
 * top2_sum groups: .96, 1.35, 1.15, .50 -> groups 1, 2 kept; expert 0 (the
 * highest score) is masked out. Top-2 by c: 3 (.75), 4 (.70); without the
 * bias it would be 4, 2. Weights: s = .5, .7 -> /1.2 -> *2.5.
 * max groups: .95, .75, .70, .30 -> groups 0, 1: ids 0 (.95), 3 (.75). */
static void test_moe_topk_grouped(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 1, 8);
    ir_value *bias = weight(m, "bias", F32(1, 8, 0, 0, 0));
    const char *kinds[3] = {"top2_sum", "max", "top2_sum"};
    for (int variant = 0; variant < 3; variant++) {
        char n0[16], n1[16];
        snprintf(n0, sizeof n0, "ids%d", variant);
        snprintf(n1, sizeof n1, "w%d", variant);
        const char *names[2] = {n0, n1};
        ir_op *op = variant < 2 ? ir_module_add_op(m, IR_OP_MOE_TOPK, INS(x, bias), names, 2)
                                : ir_module_add_op(m, IR_OP_MOE_TOPK, INS(x), names, 2);
        if (!op)
            die("moe_topk");
        T_OK(ir_op_set_str(m, op, "scoring", "sigmoid"));
        T_OK(ir_op_set_int(m, op, "top_k", 2));
        T_OK(ir_op_set_int(m, op, "n_group", 4));
        T_OK(ir_op_set_int(m, op, "topk_group", 2));
        T_OK(ir_op_set_str(m, op, "group_score", kinds[variant]));
        T_OK(ir_op_set_int(m, op, "norm_topk_prob", 1));
        T_OK(ir_op_set_float(m, op, "scaling", 2.5));
        fin(m, op, NULL);
        if (variant == 0)
            output(m, op->out[1]);
    }
    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    const double s[8] = {.95, .01, .60, .50, .70, .45, .30, .20};
    float logits[8], bv[8] = {0, 0, 0, 0.25f, 0, 0, 0, 0};
    for (int e = 0; e < 8; e++)
        logits[e] = (float)log(s[e] / (1 - s[e]));
    set(in, m, "table", logits);
    set(in, m, "bias", bv);
    int32_t tok[1] = {0};
    float w[2];
    T_OK(rt_interp_forward(in, tok, POS, 1, w));
    const int32_t *i0 = (const int32_t *)val(in, m, "ids0");
    const int32_t *i1 = (const int32_t *)val(in, m, "ids1");
    const int32_t *i2 = (const int32_t *)val(in, m, "ids2");
    T_CHECK(i0[0] == 3 && i0[1] == 4);
    T_CHECK(i1[0] == 0 && i1[1] == 3);
    /* without the bias: groups .96, 1.1, 1.15, .5 keep 1, 2; top-2 is 4, 2 */
    T_CHECK(i2[0] == 4 && i2[1] == 2);
    double want0[2] = {2.5 * .5 / 1.2, 2.5 * .7 / 1.2};
    double want1[2] = {2.5 * .95 / 1.45, 2.5 * .5 / 1.45};
    double want2[2] = {2.5 * .7 / 1.3, 2.5 * .6 / 1.3};
    T_CHECK(mismatches("grouped top2_sum", w, want0, 2, 1e-6) == 0);
    T_CHECK(mismatches("grouped max", val(in, m, "w1"), want1, 2, 1e-6) == 0);
    T_CHECK(mismatches("grouped no bias", val(in, m, "w2"), want2, 2, 1e-6) == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

/* ---- moe_experts ---------------------------------------------------------- */

enum { XE = 3, XI = 2, XH = 3, XK = 2 };

static void test_moe_experts(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 4, XH);
    ir_value *router = weight(m, "router", F32(2, XE, XH, 0, 0));
    ir_value *logits = build(m, IR_OP_LINEAR, "logits", INS(x, router));
    const char *names[2] = {"ids", "w"};
    ir_op *top = ir_module_add_op(m, IR_OP_MOE_TOPK, INS(logits), names, 2);
    if (!top)
        die("moe_topk");
    T_OK(ir_op_set_str(m, top, "scoring", "softmax"));
    T_OK(ir_op_set_int(m, top, "top_k", XK));
    fin(m, top, NULL);
    ir_value *ids = top->out[0];
    ir_value *gate = weight(m, "gate", F32(3, XE, XI, XH, 0));
    ir_value *up = weight(m, "up", F32(3, XE, XI, XH, 0));
    ir_value *gate_up = weight(m, "gate_up", F32(3, XE, 2 * XI, XH, 0));
    ir_value *down = weight(m, "down", F32(3, XE, XH, XI, 0));
    build(m, IR_OP_MOE_EXPERTS, "y5", INS(x, ids, gate, up, down));
    output(m, build(m, IR_OP_MOE_EXPERTS, "y4", INS(x, ids, gate_up, down)));

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    uint64_t rng = 11;
    float table[4 * XH], rw[XE * XH], g[XE * XI * XH], u[XE * XI * XH], gu[XE * 2 * XI * XH],
        dn[XE * XH * XI];
    fill_random(table, 4 * XH, &rng);
    fill_random(rw, XE * XH, &rng);
    fill_random(g, XE * XI * XH, &rng);
    fill_random(u, XE * XI * XH, &rng);
    fill_random(dn, XE * XH * XI, &rng);
    for (int e = 0; e < XE; e++) {
        memcpy(gu + e * 2 * XI * XH, g + e * XI * XH, sizeof(float) * XI * XH);
        memcpy(gu + e * 2 * XI * XH + XI * XH, u + e * XI * XH, sizeof(float) * XI * XH);
    }
    set(in, m, "table", table);
    set(in, m, "router", rw);
    set(in, m, "gate", g);
    set(in, m, "up", u);
    set(in, m, "gate_up", gu);
    set(in, m, "down", dn);
    int32_t tok[4] = {0, 1, 2, 3};
    float y4[4 * XK * XH];
    T_OK(rt_interp_forward(in, tok, POS, 4, y4));
    const int32_t *idv = (const int32_t *)val(in, m, "ids");
    double want[4 * XK * XH];
    int distinct = 0;
    for (int t = 0; t < 4; t++) {
        const float *xt = table + t * XH;
        distinct |= 1 << idv[t * XK] | 1 << idv[t * XK + 1];
        for (int k = 0; k < XK; k++) {
            int e = idv[t * XK + k];
            double act[XI];
            for (int i = 0; i < XI; i++) {
                double gs = 0, us = 0;
                for (int h = 0; h < XH; h++) {
                    gs += g[(e * XI + i) * XH + h] * (double)xt[h];
                    us += u[(e * XI + i) * XH + h] * (double)xt[h];
                }
                act[i] = gs / (1 + exp(-gs)) * us;
            }
            for (int h = 0; h < XH; h++) {
                double acc = 0;
                for (int i = 0; i < XI; i++)
                    acc += dn[(e * XH + h) * XI + i] * act[i];
                want[(t * XK + k) * XH + h] = acc;
            }
        }
    }
    T_CHECK(distinct == 7); /* every expert is used by some token */
    T_CHECK(mismatches("moe_experts gate_up", y4, want, 4 * XK * XH, 1e-5) == 0);
    T_CHECK(mismatches("moe_experts gate, up", val(in, m, "y5"), want, 4 * XK * XH, 1e-5) == 0);
    T_CHECK(memcmp(val(in, m, "y5"), y4, sizeof y4) == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

/* Expert ids from the token input itself, to reach an id out of range. */
static void test_moe_experts_bad_id(void)
{
    ir_module *m = new_module();
    ir_value *table = weight(m, "table", F32(2, 8, XH, 0, 0));
    ir_value *x = build(m, IR_OP_EMBEDDING, "x", INS(positions_of(m), table));
    ir_value *ids = reshape(m, "ids", tokens_of(m), ty(IR_DTYPE_I32, 2, IR_DIM_T, 1, 0, 0));
    ir_value *gu = weight(m, "gate_up", F32(3, XE, 2 * XI, XH, 0));
    ir_value *down = weight(m, "down", F32(3, XE, XH, XI, 0));
    output(m, build(m, IR_OP_MOE_EXPERTS, "y", INS(x, ids, gu, down)));
    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 8, &in));
    int32_t tok[2] = {2, 3};
    float y[2 * XH];
    T_ERR(rt_interp_forward(in, tok, POS, 2, y), MOEC_ERR_INVALID_ARG, "expert id 3");
    T_OK(rt_interp_forward(in, tok, POS, 1, y));
    T_CHECK(y[0] == 0 && y[1] == 0 && y[2] == 0); /* weights start at zero */
    rt_interp_free(in);
    ir_module_free(m);
}

/* ---- fused and scheduled ops ---------------------------------------------- */

static void test_silu_mul(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 2, 6);
    output(m, build(m, IR_OP_SILU_MUL, "sm", INS(x)));
    ir_value *x3 = reshape(m, "x3", x, F32(3, IR_DIM_T, 3, 2, 0)); /* pairs (gate, up) per row */
    build(m, IR_OP_SILU_MUL, "sm3", INS(x3));
    /* the unfused form: silu of the first half times the second half */
    ir_value *g = build(m, IR_OP_SILU, "g", INS(slice(m, "gs", x, 1, 0, 3)));
    build(m, IR_OP_MUL, "unfused", INS(g, slice(m, "us", x, 1, 3, 3)));

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    float table[12] = {-2, 0, 1.5f, 3, -1, 0.5f, 1, 2, -3, 0.25f, 4, -1};
    set(in, m, "table", table);
    int32_t tok[2] = {0, 1};
    float y[6];
    T_OK(rt_interp_forward(in, tok, POS, 2, y));
    double want[6];
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 3; i++) {
            double gt = table[t * 6 + i];
            want[t * 3 + i] = gt / (1 + exp(-gt)) * table[t * 6 + 3 + i];
        }
    T_CHECK(mismatches("silu_mul", y, want, 6, 1e-6) == 0);
    T_CHECK(fabs(y[0] - (-2 / (1 + exp(2.0)) * 3)) < 1e-6 && y[1] == 0.0f);
    T_CHECK(memcmp(y, val(in, m, "unfused"), sizeof y) == 0);
    /* 3-D: row (t, j) is [gate, up] = table[t*6 + 2j], table[t*6 + 2j + 1] */
    double want3[6];
    for (int r = 0; r < 6; r++) {
        double gt = table[2 * r];
        want3[r] = gt / (1 + exp(-gt)) * table[2 * r + 1];
    }
    T_CHECK(mismatches("silu_mul 3-D", val(in, m, "sm3"), want3, 6, 1e-6) == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

enum { RE = 4, RI = 3, RH = 5, RK = 2, RT = 5 };

/* moe_routed against moe_experts, mul by the routing weights, reduce_sum. */
static void test_moe_routed(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, RT, RH);
    ir_value *router = weight(m, "router", F32(2, RE, RH, 0, 0));
    ir_value *logits = build(m, IR_OP_LINEAR, "logits", INS(x, router));
    const char *names[2] = {"ids", "w"};
    ir_op *top = ir_module_add_op(m, IR_OP_MOE_TOPK, INS(logits), names, 2);
    if (!top)
        die("moe_topk");
    T_OK(ir_op_set_str(m, top, "scoring", "softmax"));
    T_OK(ir_op_set_int(m, top, "top_k", RK));
    fin(m, top, NULL);
    ir_value *ids = top->out[0], *w = top->out[1];
    ir_value *gate = weight(m, "gate", F32(3, RE, RI, RH, 0));
    ir_value *up = weight(m, "up", F32(3, RE, RI, RH, 0));
    ir_value *gate_up = weight(m, "gate_up", F32(3, RE, 2 * RI, RH, 0));
    ir_value *down = weight(m, "down", F32(3, RE, RH, RI, 0));
    ir_value *ex = build(m, IR_OP_MOE_EXPERTS, "ex", INS(x, ids, gate, up, down));
    ir_value *w3 = reshape(m, "w3", w, F32(3, IR_DIM_T, RK, 1, 0));
    ir_value *weighted = build(m, IR_OP_MUL, "weighted", INS(ex, w3));
    ir_op *rs = start(m, IR_OP_REDUCE_SUM, "unfused", INS(weighted));
    T_OK(ir_op_set_int(m, rs, "axis", 1));
    fin(m, rs, NULL);
    output(m, build(m, IR_OP_MOE_ROUTED, "routed5", INS(x, ids, w, gate_up, down)));
    build(m, IR_OP_MOE_ROUTED, "routed6", INS(x, ids, w, gate, up, down));
    ir_op *sc = start(m, IR_OP_MOE_ROUTED, "scaled", INS(x, ids, w, gate_up, down));
    T_OK(ir_op_set_float(m, sc, "scale", 2.5));
    fin(m, sc, NULL);
    T_OK(ir_module_verify(m));

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 8, &in));
    uint64_t rng = 23;
    float table[RT * RH], rw[RE * RH], g[RE * RI * RH], u[RE * RI * RH], gu[RE * 2 * RI * RH],
        dn[RE * RH * RI];
    fill_random(table, RT * RH, &rng);
    fill_random(rw, RE * RH, &rng);
    fill_random(g, RE * RI * RH, &rng);
    fill_random(u, RE * RI * RH, &rng);
    fill_random(dn, RE * RH * RI, &rng);
    for (int e = 0; e < RE; e++) {
        memcpy(gu + e * 2 * RI * RH, g + e * RI * RH, sizeof(float) * RI * RH);
        memcpy(gu + e * 2 * RI * RH + RI * RH, u + e * RI * RH, sizeof(float) * RI * RH);
    }
    set(in, m, "table", table);
    set(in, m, "router", rw);
    set(in, m, "gate", g);
    set(in, m, "up", u);
    set(in, m, "gate_up", gu);
    set(in, m, "down", dn);
    int32_t tok[RT] = {0, 1, 2, 3, 4};
    float y[RT * RH];
    T_OK(rt_interp_forward(in, tok, POS, RT, y));
    const float *unfused = val(in, m, "unfused");
    double want[RT * RH], want_scaled[RT * RH];
    int nonzero = 0;
    for (int i = 0; i < RT * RH; i++) {
        want[i] = unfused[i];
        want_scaled[i] = 2.5 * unfused[i];
        nonzero += unfused[i] != 0.0f;
    }
    T_CHECK(nonzero == RT * RH);
    const int32_t *idv = (const int32_t *)val(in, m, "ids");
    int used = 0;
    for (int i = 0; i < RT * RK; i++)
        used |= 1 << idv[i];
    T_CHECK(used == (1 << RE) - 1); /* every expert chosen somewhere */
    T_CHECK(mismatches("moe_routed gate_up", y, want, RT * RH, 1e-6) == 0);
    T_CHECK(mismatches("moe_routed gate, up", val(in, m, "routed6"), want, RT * RH, 1e-6) == 0);
    T_CHECK(mismatches("moe_routed scale", val(in, m, "scaled"), want_scaled, RT * RH, 1e-6) == 0);
    rt_interp_free(in);
    ir_module_free(m);

    /* an expert id out of range */
    m = new_module();
    ir_value *table_w = weight(m, "table", F32(2, 8, 2 * RH, 0, 0));
    ir_value *xx = build(m, IR_OP_EMBEDDING, "xx", INS(positions_of(m), table_w));
    ir_value *xh = slice(m, "xh", xx, 1, 0, RH);
    ir_value *wk = slice(m, "wk", xx, 1, RH, 1);
    ir_value *bad_ids = reshape(m, "bad_ids", tokens_of(m), ty(IR_DTYPE_I32, 2, IR_DIM_T, 1, 0, 0));
    ir_value *gu2 = weight(m, "gate_up", F32(3, RE, 2 * RI, RH, 0));
    ir_value *dn2 = weight(m, "down", F32(3, RE, RH, RI, 0));
    output(m, build(m, IR_OP_MOE_ROUTED, "y", INS(xh, bad_ids, wk, gu2, dn2)));
    T_OK(rt_interp_init(m, NULL, 8, &in));
    int32_t bt[2] = {1, RE};
    T_ERR(rt_interp_forward(in, bt, POS, 2, y), MOEC_ERR_INVALID_ARG, "y: expert id 4 is outside [0, 4)");
    T_OK(rt_interp_forward(in, bt, POS, 1, y));
    rt_interp_free(in);
    ir_module_free(m);
}

/* MLA, H heads: per token x = [q_nope (H*dn) | q_pe (H*dr) | kv_c (r) | k_pe (dr)]. */
enum { MH = 3, MDN = 4, MDV = 3, MDR = 2, MR = 5, MN = MH * (MDN + MDR) + MR + MDR, MV = 7 };

typedef struct mla_parts {
    ir_value *q_nope, *q_pe, *kv_c, *k_pe, *kv_b;
} mla_parts;

static mla_parts mla_inputs(ir_module *m)
{
    mla_parts p;
    ir_value *x = embed(m, MV, MN);
    p.q_nope = reshape(m, "q_nope", slice(m, "q_nope_f", x, 1, 0, MH * MDN),
                       F32(3, IR_DIM_T, MH, MDN, 0));
    p.q_pe = reshape(m, "q_pe", slice(m, "q_pe_f", x, 1, MH * MDN, MH * MDR),
                     F32(3, IR_DIM_T, MH, MDR, 0));
    p.kv_c = slice(m, "kv_c", x, 1, MH * (MDN + MDR), MR);
    p.k_pe = reshape(m, "k_pe", slice(m, "k_pe_f", x, 1, MH * (MDN + MDR) + MR, MDR),
                     F32(3, IR_DIM_T, 1, MDR, 0));
    p.kv_b = weight(m, "kv_b", F32(2, MH * (MDN + MDV), MR, 0, 0));
    return p;
}

static ir_value *absorbed(ir_module *m, const char *tag, const mla_parts *p, ir_value *kv_c,
                          double scale, int window)
{
    char n[32];
    snprintf(n, sizeof n, "%s.q_c", tag);
    ir_op *qa = start(m, IR_OP_MLA_QABSORB, n, INS(p->q_nope, p->kv_b));
    T_OK(ir_op_set_int(m, qa, "qk_nope_head_dim", MDN));
    T_OK(ir_op_set_int(m, qa, "v_head_dim", MDV));
    snprintf(n, sizeof n, "%s.o_c", tag);
    ir_op *at = start(m, IR_OP_MLA_ATTENTION, n, INS(fin(m, qa, NULL), p->q_pe, kv_c, p->k_pe,
                                                     positions_of(m)));
    T_OK(ir_op_set_float(m, at, "scale", scale));
    if (window)
        T_OK(ir_op_set_int(m, at, "window", window));
    snprintf(n, sizeof n, "%s.o", tag);
    ir_op *va = start(m, IR_OP_MLA_VABSORB, n, INS(fin(m, at, NULL), p->kv_b));
    T_OK(ir_op_set_int(m, va, "qk_nope_head_dim", MDN));
    T_OK(ir_op_set_int(m, va, "v_head_dim", MDV));
    snprintf(n, sizeof n, "%s.out", tag);
    return reshape(m, n, fin(m, va, NULL), F32(2, IR_DIM_T, MH * MDV, 0, 0));
}

/* The path before absorb_mla: kv_b expands kv_c to k_nope and v per head. */
static ir_value *unabsorbed(ir_module *m, const char *tag, const mla_parts *p, ir_value *kv_c,
                            double scale, int window)
{
    char n[32];
    snprintf(n, sizeof n, "%s.kv", tag);
    ir_value *kv = build(m, IR_OP_LINEAR, n, INS(kv_c, p->kv_b));
    snprintf(n, sizeof n, "%s.kv3", tag);
    ir_value *kv3 = reshape(m, n, kv, F32(3, IR_DIM_T, MH, MDN + MDV, 0));
    snprintf(n, sizeof n, "%s.k_nope", tag);
    ir_value *k_nope = slice(m, n, kv3, 2, 0, MDN);
    snprintf(n, sizeof n, "%s.v", tag);
    ir_value *v = slice(m, n, kv3, 2, MDN, MDV);
    snprintf(n, sizeof n, "%s.k_pe_h", tag);
    ir_type th = F32(3, IR_DIM_T, MH, MDR, 0);
    ir_value *k_pe_h = fin(m, start(m, IR_OP_EXPAND, n, INS(p->k_pe)), &th);
    snprintf(n, sizeof n, "%s.q", tag);
    ir_op *qc = start(m, IR_OP_CONCAT, n, INS(p->q_nope, p->q_pe));
    T_OK(ir_op_set_int(m, qc, "axis", 2));
    snprintf(n, sizeof n, "%s.k", tag);
    ir_op *kc = start(m, IR_OP_CONCAT, n, INS(k_nope, k_pe_h));
    T_OK(ir_op_set_int(m, kc, "axis", 2));
    snprintf(n, sizeof n, "%s.attn", tag);
    ir_op *at = start(m, IR_OP_ATTENTION, n, INS(fin(m, qc, NULL), fin(m, kc, NULL), v,
                                                 positions_of(m)));
    T_OK(ir_op_set_float(m, at, "scale", scale));
    if (window)
        T_OK(ir_op_set_int(m, at, "window", window));
    snprintf(n, sizeof n, "%s.out", tag);
    return reshape(m, n, fin(m, at, NULL), F32(2, IR_DIM_T, MH * MDV, 0, 0));
}

/* Two attention layers per module: the second reads silu(kv_c), so if the
 * two ops shared a cache, the second would overwrite what the first reads
 * in the decode steps. */
static ir_module *mla_module(int absorb, int window)
{
    ir_module *m = new_module();
    mla_parts p = mla_inputs(m);
    ir_value *kv_c2 = build(m, IR_OP_SILU, "kv_c2", INS(p.kv_c));
    ir_value *(*layer)(ir_module *, const char *, const mla_parts *, ir_value *, double, int) =
        absorb ? absorbed : unabsorbed;
    ir_value *a = layer(m, "a", &p, p.kv_c, 0.4, window);
    ir_value *b = layer(m, "b", &p, kv_c2, 0.9, window);
    ir_op *cat = start(m, IR_OP_CONCAT, "out", INS(a, b));
    T_OK(ir_op_set_int(m, cat, "axis", 1));
    output(m, fin(m, cat, NULL));
    T_OK(ir_module_verify(m));
    return m;
}

static void test_mla_absorbed(void)
{
    uint64_t rng = 31;
    float table[MV * MN], kv_b[MH * (MDN + MDV) * MR];
    fill_random(table, MV * MN, &rng);
    fill_random(kv_b, MH * (MDN + MDV) * MR, &rng);
    int32_t tok[6] = {3, 0, 6, 2, 5, 1};
    enum { W = 2 * MH * MDV };
    for (int window = 0; window <= 3; window += 3) {
        ir_module *ma = mla_module(1, window), *mb = mla_module(0, window);
        rt_interp *a, *b;
        T_OK(rt_interp_init(ma, NULL, 8, &a));
        T_OK(rt_interp_init(mb, NULL, 8, &b));
        set(a, ma, "table", table);
        set(b, mb, "table", table);
        set(a, ma, "kv_b", kv_b);
        set(b, mb, "kv_b", kv_b);
        float ya[4 * W], yb[4 * W];
        double want[4 * W];
        /* prefill 4, then decode positions 4 and 5 */
        for (int step = 0; step < 3; step++) {
            int T = step == 0 ? 4 : 1, at = step == 0 ? 0 : 3 + step;
            T_OK(rt_interp_forward(a, tok + at, POS + at, T, ya));
            T_OK(rt_interp_forward(b, tok + at, POS + at, T, yb));
            double mx = 0;
            for (int i = 0; i < T * W; i++) {
                want[i] = yb[i];
                mx = fmax(mx, fabs(yb[i]));
            }
            T_CHECK(mx > 0.1);
            int bad = 0;
            for (int i = 0; i < T * W; i++)
                if (fabs(ya[i] - want[i]) > 1e-5 * mx && bad++ < 4)
                    fprintf(stderr, "mla window %d step %d [%d]: absorbed %.9g, unabsorbed %.9g\n",
                            window, step, i, ya[i], want[i]);
            T_CHECK(bad == 0);
        }
        /* the compressed cache is per op and checked like attention's */
        rt_interp_reset(a);
        T_ERR(rt_interp_forward(a, tok + 5, POS + 5, 1, ya), MOEC_ERR_INVALID_ARG,
              window ? "a.o_c: token at position 5 attends to position 3, which no forward has written"
                     : "a.o_c: token at position 5 attends to position 0, which no forward has written");
        int32_t far[1] = {8};
        T_ERR(rt_interp_forward(a, tok, far, 1, ya), MOEC_ERR_CAPACITY, "position 8 is past the KV cache");
        rt_interp_free(a);
        rt_interp_free(b);
        ir_module_free(ma);
        ir_module_free(mb);
    }

    /* mla_qabsorb and mla_vabsorb alone, against their formulas */
    ir_module *m = new_module();
    mla_parts p = mla_inputs(m);
    ir_op *qa = start(m, IR_OP_MLA_QABSORB, "q_c", INS(p.q_nope, p.kv_b));
    T_OK(ir_op_set_int(m, qa, "qk_nope_head_dim", MDN));
    T_OK(ir_op_set_int(m, qa, "v_head_dim", MDV));
    ir_value *q_c = fin(m, qa, NULL);
    /* ... and reading the embedding row in place: heads of MDN + MDR columns */
    ir_value *x = p.q_nope->def->in[0]->def->in[0];
    ir_op *qa2 = start(m, IR_OP_MLA_QABSORB, "q_c2", INS(x, p.kv_b));
    T_OK(ir_op_set_int(m, qa2, "qk_nope_head_dim", MDN));
    T_OK(ir_op_set_int(m, qa2, "v_head_dim", MDV));
    T_OK(ir_op_set_int(m, qa2, "heads", MH));
    T_OK(ir_op_set_int(m, qa2, "head_stride", MDN + MDR));
    T_CHECK(fin(m, qa2, NULL) != NULL);
    ir_value *o_c = reshape(m, "o_c", p.kv_c, F32(3, IR_DIM_T, 1, MR, 0));
    ir_type t3 = F32(3, IR_DIM_T, MH, MR, 0);
    ir_value *o_ce = fin(m, start(m, IR_OP_EXPAND, "o_ce", INS(o_c)), &t3);
    ir_op *va = start(m, IR_OP_MLA_VABSORB, "o", INS(o_ce, p.kv_b));
    T_OK(ir_op_set_int(m, va, "qk_nope_head_dim", MDN));
    T_OK(ir_op_set_int(m, va, "v_head_dim", MDV));
    output(m, fin(m, va, NULL));
    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    set(in, m, "table", table);
    set(in, m, "kv_b", kv_b);
    float y[2 * MH * MDV];
    T_OK(rt_interp_forward(in, tok, POS, 2, y));
    double wq[2 * MH * MR], wq2[2 * MH * MR], wo[2 * MH * MDV];
    for (int t = 0; t < 2; t++) {
        const float *xt = table + tok[t] * MN;
        for (int h = 0; h < MH; h++) {
            for (int j = 0; j < MR; j++) {
                double acc = 0, acc2 = 0;
                for (int i = 0; i < MDN; i++) {
                    acc += (double)xt[h * MDN + i] * kv_b[(h * (MDN + MDV) + i) * MR + j];
                    acc2 += (double)xt[h * (MDN + MDR) + i] * kv_b[(h * (MDN + MDV) + i) * MR + j];
                }
                wq[(t * MH + h) * MR + j] = acc;
                wq2[(t * MH + h) * MR + j] = acc2;
            }
            for (int i = 0; i < MDV; i++) {
                double acc = 0;
                for (int j = 0; j < MR; j++)
                    acc += (double)kv_b[(h * (MDN + MDV) + MDN + i) * MR + j] *
                           xt[MH * (MDN + MDR) + j];
                wo[(t * MH + h) * MDV + i] = acc;
            }
        }
    }
    T_CHECK(mismatches("mla_qabsorb", val(in, m, "q_c"), wq, 2 * MH * MR, 1e-6) == 0);
    T_CHECK(mismatches("mla_qabsorb in place", val(in, m, "q_c2"), wq2, 2 * MH * MR, 1e-6) == 0);
    T_CHECK(mismatches("mla_vabsorb", y, wo, 2 * MH * MDV, 1e-6) == 0);
    (void)q_c;
    rt_interp_free(in);
    ir_module_free(m);
}

static void test_fork_join_alpha(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 4, 3);
    ir_value *f = build(m, IR_OP_FORK, "f", INS(x));
    f->def->stream = 1;
    ir_value *s = build(m, IR_OP_SILU, "s", INS(f));
    s->def->stream = 1;
    ir_value *j = build(m, IR_OP_JOIN, "j", INS(s));
    ir_value *tf = build(m, IR_OP_FORK, "tok_f", INS(tokens_of(m)));
    tf->def->stream = 1;
    build(m, IR_OP_JOIN, "tok_j", INS(tf));
    ir_value *lw = weight(m, "lw", F32(2, 2, 3, 0, 0));
    ir_value *lb = weight(m, "lb", F32(1, 2, 0, 0, 0));
    ir_op *lin = start(m, IR_OP_LINEAR, "lin", INS(x, lw, lb));
    T_OK(ir_op_set_float(m, lin, "alpha", 0.5));
    output(m, fin(m, lin, NULL));
    ir_value *b = slice(m, "b", x, 1, 2, 1); /* [T, 1] broadcast */
    ir_op *add = start(m, IR_OP_ADD, "add", INS(x, b));
    T_OK(ir_op_set_float(m, add, "alpha", -2.0));
    fin(m, add, NULL);
    ir_op *add1 = start(m, IR_OP_ADD, "add1", INS(j, x));
    T_OK(ir_op_set_float(m, add1, "alpha", 1.0));
    fin(m, add1, NULL);
    T_OK(ir_module_verify(m));

    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 8, &in));
    float table[12] = {0, 0, 0, 3, 4, 0, 1, -2, 2, 5, 5, 5};
    float lwv[6] = {1, 0, 2, -1, 0.5f, 3};
    float lbv[2] = {0.25f, -1};
    set(in, m, "table", table);
    set(in, m, "lw", lwv);
    set(in, m, "lb", lbv);
    int32_t tok[2] = {1, 2};
    float y[4];
    T_OK(rt_interp_forward(in, tok, POS, 2, y));
    /* alpha * (x w^T + b): half of 3.25, -2, 5.25, 3 */
    double want_lin[4] = {1.625, -1, 2.625, 1.5};
    T_CHECK(mismatches("linear alpha", y, want_lin, 4, 0) == 0);
    /* a + alpha * b: [3,4,0] - 2*0, [1,-2,2] - 2*2 */
    double want_add[6] = {3, 4, 0, -3, -6, -2};
    T_CHECK(mismatches("add alpha", val(in, m, "add"), want_add, 6, 0) == 0);
    /* fork and join hand the value on unchanged, i32 too */
    T_CHECK(memcmp(val(in, m, "f"), val(in, m, "x"), 6 * sizeof(float)) == 0);
    T_CHECK(memcmp(val(in, m, "j"), val(in, m, "s"), 6 * sizeof(float)) == 0);
    const int32_t *tj = (const int32_t *)val(in, m, "tok_j");
    T_CHECK(tj[0] == 1 && tj[1] == 2);
    const float *a1 = val(in, m, "add1"), *sv = val(in, m, "s"), *xv = val(in, m, "x");
    int bad = 0;
    for (int i = 0; i < 6; i++)
        bad += a1[i] != sv[i] + xv[i];
    T_CHECK(bad == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

/* ---- planned arena -------------------------------------------------------- */

/* x = embed; a = linear(x, w1); b = silu(a); c = add(b, x); d = linear(c, w2).
 * Bytes per token: tokens 4, positions 4, x 16, a 16, b 16, c 16, d 12. */
static ir_module *plan_module(void)
{
    ir_module *m = new_module();
    ir_value *x = embed(m, 5, 4);
    ir_value *a = build(m, IR_OP_LINEAR, "a", INS(x, weight(m, "w1", F32(2, 4, 4, 0, 0))));
    ir_value *b = build(m, IR_OP_SILU, "b", INS(a));
    ir_value *c = build(m, IR_OP_ADD, "c", INS(b, x));
    output(m, build(m, IR_OP_LINEAR, "d", INS(c, weight(m, "w2", F32(2, 3, 4, 0, 0)))));
    return m;
}

/* Offsets of tokens, positions, x, a, b, c, d. */
static void plan_set(ir_module *m, const int64_t off[7], int64_t arena)
{
    static const char *const names[7] = {"tokens", "positions", "x", "a", "b", "c", "d"};
    for (int i = 0; i < 7; i++)
        ir_module_find_value(m, names[i])->mem_offset = off[i];
    if (arena > 0)
        T_OK(ir_module_set_meta_int(m, "arena_bytes_per_token", arena));
}

static void plan_run(ir_module *m, const float *table, const float *w1, const float *w2,
                     int planned, float out[3][5 * 3])
{
    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 16, &in));
    set(in, m, "table", table);
    set(in, m, "w1", w1);
    set(in, m, "w2", w2);
    T_OK(rt_interp_use_plan(in, planned));
    /* T = 3, then 1 (offsets scale with T), then 5 (the arena grows) */
    static const int32_t tok[5] = {4, 1, 3, 0, 2};
    static const int Ts[3] = {3, 1, 5};
    for (int i = 0; i < 3; i++)
        T_OK(rt_interp_forward(in, tok + 5 - Ts[i], POS, Ts[i], out[i]));
    rt_interp_free(in);
}

static void test_planned_arena(void)
{
    uint64_t rng = 41;
    float table[20], w1[16], w2[12];
    fill_random(table, 20, &rng);
    fill_random(w1, 16, &rng);
    fill_random(w2, 12, &rng);
    ir_module *m = plan_module();
    float sep[3][15], good[3][15], bad[3][15];
    memset(sep, 0, sizeof sep);
    memset(good, 0, sizeof good);
    memset(bad, 0, sizeof bad);
    plan_run(m, table, w1, w2, 0, sep);

    /* a valid plan that reuses memory: c takes a's place (a dies at b), d
     * takes b's (b dies at c) */
    const int64_t valid[7] = {0, 4, 8, 24, 40, 24, 40};
    plan_set(m, valid, 56);
    T_OK(ir_module_verify(m));
    plan_run(m, table, w1, w2, 1, good);
    T_CHECK(memcmp(sep, good, sizeof sep) == 0);

    /* an overlapping plan: b on top of x, which c still reads */
    const int64_t overlap[7] = {0, 4, 8, 24, 8, 40, 24};
    plan_set(m, overlap, 56);
    plan_run(m, table, w1, w2, 1, bad);
    int differ = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 15; j++)
            differ += bad[i][j] != sep[i][j];
    T_CHECK(differ >= 9); /* every row of every step, at least */

    /* what use_plan refuses, naming the value */
    rt_interp *in;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    ir_module_find_value(m, "c")->mem_offset = -1;
    T_ERR(rt_interp_use_plan(in, 1), MOEC_ERR_INVALID_ARG, "module test: %c has no arena offset");
    ir_module_find_value(m, "c")->mem_offset = 42;
    T_ERR(rt_interp_use_plan(in, 1), MOEC_ERR_INVALID_ARG, "%c: arena offset 42 is not a multiple of 4");
    ir_module_find_value(m, "c")->mem_offset = 44;
    T_ERR(rt_interp_use_plan(in, 1), MOEC_ERR_INVALID_ARG,
          "%c: 16 bytes per token at offset 44 run past arena_bytes_per_token 56");
    ir_module_find_value(m, "c")->mem_offset = 40;
    T_OK(ir_module_set_meta_float(m, "arena_bytes_per_token", 56.0));
    T_ERR(rt_interp_use_plan(in, 1), MOEC_ERR_INVALID_ARG, "needs meta arena_bytes_per_token");
    T_OK(ir_module_set_meta_int(m, "arena_bytes_per_token", 56));
    T_ERR(rt_interp_use_plan(NULL, 1), MOEC_ERR_INVALID_ARG, "NULL interpreter");
    /* a plan spoiled after use_plan is caught at the forward, before any write */
    T_OK(rt_interp_use_plan(in, 1));
    ir_module_find_value(m, "d")->mem_offset = 48;
    static const int32_t one[1] = {0};
    float y1[3];
    T_ERR(rt_interp_forward(in, one, POS, 1, y1), MOEC_ERR_INVALID_ARG,
          "%d: 12 bytes per token at offset 48 run past arena_bytes_per_token 56");
    ir_module_find_value(m, "d")->mem_offset = 40;
    T_OK(rt_interp_forward(in, one, POS, 1, y1));
    /* turning it on and off again keeps the default path working */
    T_OK(rt_interp_use_plan(in, 1));
    T_OK(rt_interp_use_plan(in, 0));
    float table_w[20];
    memcpy(table_w, table, sizeof table_w);
    set(in, m, "table", table_w);
    set(in, m, "w1", w1);
    set(in, m, "w2", w2);
    float y[15];
    static const int32_t tok[3] = {3, 0, 2}; /* the first step of plan_run */
    T_CHECK(rt_interp_value(in, ir_module_find_value(m, "d")) == NULL);
    T_OK(rt_interp_forward(in, tok, POS, 3, y));
    T_CHECK(memcmp(y, sep[0], 3 * 3 * sizeof(float)) == 0);
    rt_interp_free(in);
    ir_module_free(m);
}

/* Whether x is a bf16 value (its low 16 bits zero). */
static int is_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0xffffu) == 0;
}

/* rt_interp_round_storage: every result but the f32 output rounded to
 * bf16, to nearest even; weights declared f32 stay f32 (as the GPU stores
 * them); skipped op kinds; bad arguments. */
static void test_round_storage(void)
{
    uint64_t rng = 43;
    float table[20], w1[16], w2[12];
    fill_random(table, 20, &rng);
    fill_random(w1, 16, &rng);
    fill_random(w2, 12, &rng);
    /* ties go to even: 1 + 2^-8 (the bf16 halfway) rounds down to 1, and
     * 1 + 3 * 2^-8 up to 1 + 2^-6 */
    table[0] = 1.0f + 1.0f / 256;
    table[1] = 1.0f + 3.0f / 256;
    ir_module *m = plan_module();
    rt_interp *in = NULL, *exact = NULL;
    T_OK(rt_interp_init(m, NULL, 16, &in));
    T_OK(rt_interp_init(m, NULL, 16, &exact));
    if (!in || !exact)
        return;
    set(in, m, "table", table);
    set(in, m, "w1", w1);
    set(in, m, "w2", w2);
    set(exact, m, "table", table);
    set(exact, m, "w1", w1);
    set(exact, m, "w2", w2);
    T_ERR(rt_interp_round_storage(in, IR_DTYPE_I32, 0), MOEC_ERR_INVALID_ARG,
          "i32 is not a compute dtype (f32, bf16, f16)");
    T_ERR(rt_interp_round_storage(NULL, IR_DTYPE_BF16, 0), MOEC_ERR_INVALID_ARG, "NULL interpreter");
    T_OK(rt_interp_round_storage(in, IR_DTYPE_BF16, 0));
    const float *tw = rt_interp_weight(in, ir_module_find_value(m, "table"));
    T_CHECK(tw[0] == 1.0f + 1.0f / 256 && tw[1] == 1.0f + 3.0f / 256);
    static const int32_t tok[3] = {4, 0, 3};
    float y[9], ye[9];
    T_OK(rt_interp_forward(in, tok, POS, 3, y));
    T_OK(rt_interp_forward(exact, tok, POS, 3, ye));
    const float *x = rt_interp_value(in, ir_module_find_value(m, "x"));
    T_CHECK(x[4] == 1.0f && x[5] == 1.0f + 4.0f / 256);
    static const char *const rounded[] = {"x", "a", "b", "c"};
    for (size_t k = 0; k < sizeof rounded / sizeof *rounded; k++) {
        const ir_value *v = ir_module_find_value(m, rounded[k]);
        const float *r = rt_interp_value(in, v), *e = rt_interp_value(exact, v);
        int bf = 1, close = 1;
        for (int i = 0; i < 12; i++) {
            bf &= is_bf16(r[i]);
            close &= fabsf(r[i] - e[i]) <= 0.02f * (fabsf(e[i]) + 0.1f);
        }
        if (!bf || !close)
            fprintf(stderr, "FAIL %s: bf16 %d, close %d\n", rounded[k], bf, close);
        T_CHECK(bf && close);
    }
    /* the output is stored f32: not rounded, but not the exact one either */
    int out_bf = 1, differ = 0;
    for (int i = 0; i < 9; i++) {
        out_bf &= is_bf16(y[i]);
        differ |= y[i] != ye[i];
    }
    T_CHECK(!out_bf && differ);
    /* skipping linear's results leaves a in f32 */
    T_OK(rt_interp_round_storage(in, IR_DTYPE_BF16, 1ull << IR_OP_LINEAR));
    T_OK(rt_interp_forward(in, tok, POS, 3, y));
    int a_bf = 1;
    for (int i = 0; i < 12; i++)
        a_bf &= is_bf16(rt_interp_value(in, ir_module_find_value(m, "a"))[i]);
    T_CHECK(!a_bf);
    rt_interp_free(in);
    rt_interp_free(exact);
    ir_module_free(m);
}

/* ---- errors --------------------------------------------------------------- */

static void test_missing_input(void)
{
    ir_module *m = ir_module_init("test");
    if (!m || !ir_module_add_input(m, "tokens", ty(IR_DTYPE_I32, 1, IR_DIM_T, 0, 0, 0)))
        die("module");
    ir_value *table = weight(m, "table", F32(2, 4, 2, 0, 0));
    output(m, build(m, IR_OP_EMBEDDING, "x", INS(tokens_of(m), table)));
    static char dummy;
    rt_interp *in = (rt_interp *)(void *)&dummy;
    T_ERR(rt_interp_init(m, NULL, 4, &in), MOEC_ERR_INVALID_ARG, "positions");
    T_CHECK(in == NULL);
    T_ERR(rt_interp_init(m, NULL, 0, &in), MOEC_ERR_INVALID_ARG, "max_seq 0");
    ir_module_free(m);
}

int main(void)
{
    test_rms_norm_linear_embedding();
    test_silu_sigmoid_add_mul();
    test_movement();
    test_rope();
    test_rope_yarn();
    test_attention();
    test_moe_topk_softmax();
    test_moe_topk_grouped();
    test_moe_experts();
    test_moe_experts_bad_id();
    test_missing_input();
    test_silu_mul();
    test_moe_routed();
    test_mla_absorbed();
    test_fork_join_alpha();
    test_planned_arena();
    test_round_storage();
    return t_finish("test_interp");
}
