/* test_pass_norm.c — fuse_add_rms_norm and its op, add_rms_norm: on the tiny
 * model of every family the pass keeps the model's function through the
 * interpreter (bf16 and, where the residual add carries alpha, f16), fuses
 * every residual add an RMSNorm reads (two per layer: the post-attention
 * norm, and the next layer's input norm or the final norm) under the
 * original value names, does nothing the second time, and leaves alone what
 * does not fit its pattern. The interpreter's add_rms_norm is checked on
 * hand-computed values and, bit for bit, against add then rms_norm. */
#include <math.h>
#include <string.h>

#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "passlib.h"
#include "runtime/interp.h"
#include "testlib.h"

static const char *const MODELS[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3",
                                     "qwen2_moe", "qwen3_moe"};
#define N_MODELS ((int)(sizeof MODELS / sizeof *MODELS))

static void test_equivalence(void)
{
    for (int i = 0; i < N_MODELS; i++) {
        double err = t_pass_equivalence(MODELS[i], "fuse_add_rms_norm", NULL);
        T_CHECK(err >= 0 && err <= 1e-5);
    }
    /* In f16, DeepSeek's MoE residual add multiplies by routed_scaling_factor
     * (fold_routed_scale): the fused op takes the alpha. */
    pass_options f16 = t_pass_options(IR_DTYPE_F16);
    for (int i = 0; i < N_MODELS; i++) {
        double err = t_pass_equivalence(MODELS[i], "fuse_add_rms_norm", &f16);
        T_CHECK(err >= 0 && err <= 1e-5);
    }
}

/* The value named `name` is result `slot` of an add_rms_norm. */
static const ir_op *fused_result(const ir_module *m, const char *name, int slot)
{
    const ir_value *v = ir_module_find_value(m, name);
    int ok = v && v->kind == IR_VALUE_OP && v->def && v->def->kind == IR_OP_ADD_RMS_NORM &&
             v->def->out[slot] == v;
    if (!ok)
        fprintf(stderr, "%%%s is not result %d of an add_rms_norm\n", name, slot);
    T_CHECK(ok);
    return ok ? v->def : NULL;
}

static void check_structure(const char *model, ir_dtype dt)
{
    pass_options o = t_pass_options(dt);
    ir_module *before = t_pipeline_module(model, "fold_routed_scale", &o);
    ir_module *m = t_pipeline_module(model, "fuse_add_rms_norm", &o);
    if (!before || !m) {
        ir_module_free(before);
        ir_module_free(m);
        return;
    }
    int layers = (int)ir_module_meta_int(m, "num_hidden_layers", 0);
    T_CHECK(layers == 3);
    /* Two per layer: the post-attention norm of every layer, the input norm
     * of layers >= 1 and the final norm (layer 0's reads the embedding). */
    int fused = t_count_ops(m, IR_OP_ADD_RMS_NORM);
    T_CHECK(fused == 2 * layers);
    T_CHECK(t_count_ops(before, IR_OP_ADD_RMS_NORM) == 0);
    T_CHECK(t_count_ops(m, IR_OP_RMS_NORM) == t_count_ops(before, IR_OP_RMS_NORM) - fused);
    T_CHECK(t_count_ops(m, IR_OP_ADD) == t_count_ops(before, IR_OP_ADD) - fused);
    T_CHECK(m->n_ops == before->n_ops - fused);
    /* No rms_norm reads an add any more. */
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind == IR_OP_RMS_NORM)
            T_CHECK(op->in[0]->kind != IR_VALUE_OP || op->in[0]->def->kind != IR_OP_ADD);
    }
    /* The results keep the names of the add and the rms_norm they replace;
     * the operands and attributes are theirs. */
    char name[64], norm[64];
    int alphas = 0;
    for (int l = 0; l < layers; l++) {
        snprintf(name, sizeof name, "l%d.attn_residual", l);
        snprintf(norm, sizeof norm, "l%d.mlp_norm", l);
        const ir_op *a = fused_result(m, name, 0), *b = fused_result(m, norm, 1);
        T_CHECK(a && a == b);
        snprintf(name, sizeof name, "l%d.mlp_residual", l);
        if (l + 1 < layers)
            snprintf(norm, sizeof norm, "l%d.attn_norm", l + 1);
        else
            snprintf(norm, sizeof norm, "final_norm");
        const ir_op *c = fused_result(m, name, 0), *d = fused_result(m, norm, 1);
        T_CHECK(c && c == d);
        const ir_value *old_add = ir_module_find_value(before, name);
        const ir_value *old_norm = ir_module_find_value(before, norm);
        T_CHECK(old_add && old_add->def->kind == IR_OP_ADD && old_norm &&
                old_norm->def->kind == IR_OP_RMS_NORM);
        if (c && old_add && old_norm) {
            T_CHECK(!strcmp(c->in[0]->name, old_add->def->in[0]->name) &&
                    !strcmp(c->in[1]->name, old_add->def->in[1]->name) &&
                    !strcmp(c->in[2]->name, old_norm->def->in[1]->name));
            T_CHECK(ir_op_attr_float(c, "eps", -1) == ir_op_attr_float(old_norm->def, "eps", -2));
            T_CHECK(ir_op_attr_float(c, "alpha", 1.0) ==
                    ir_op_attr_float(old_add->def, "alpha", 1.0));
            alphas += ir_op_attr(c, "alpha") != NULL;
            /* the residual stream goes on from the fused op's sum */
            if (l + 1 < layers) {
                snprintf(name, sizeof name, "l%d.attn_residual", l + 1);
                const ir_op *next = fused_result(m, name, 0);
                T_CHECK(next && next->in[0] == c->out[0]);
            }
        }
    }
    const ir_value *first = ir_module_find_value(m, "l0.attn_norm");
    T_CHECK(first && first->def->kind == IR_OP_RMS_NORM &&
            !strcmp(first->def->in[0]->name, "embed"));
    int shared_f16 = dt == IR_DTYPE_F16 && (!strcmp(model, "deepseek_v2_qlora") ||
                                            !strcmp(model, "deepseek_v3"));
    T_CHECK(alphas == (shared_f16 ? 2 : 0));
    ir_module_free(before);
    ir_module_free(m);
}

static void check_idempotent(const char *model)
{
    ir_module *m = t_pipeline_module(model, "fuse_add_rms_norm", NULL);
    if (!m)
        return;
    char *before = ir_module_print_str(m);
    T_OK(pass_fuse_add_rms_norm(m, NULL));
    T_OK(ir_module_verify(m));
    char *after = ir_module_print_str(m);
    T_CHECK(before && after && !strcmp(before, after));
    free(before);
    free(after);
    ir_module_free(m);
}

/* Runs the pass on IR text; returns the printed result (caller frees). */
static char *run_on_text(const char *text)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "<test>", &m));
    if (!m)
        return NULL;
    T_OK(pass_fuse_add_rms_norm(m, NULL));
    T_OK(ir_module_verify(m));
    char *s = ir_module_print_str(m);
    ir_module_free(m);
    return s;
}

static void check_unchanged(const char *what, const char *text)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "<test>", &m));
    char *want = m ? ir_module_print_str(m) : NULL;
    ir_module_free(m);
    char *got = run_on_text(text);
    T_CHECK(want && got && !strcmp(want, got));
    if (want && got && strcmp(want, got))
        fprintf(stderr, "%s: fuse_add_rms_norm changed the module:\n%s\n", what, got);
    free(want);
    free(got);
}

#define HEAD                                                                                  \
    "module t {\n  input %tokens : i32[T]\n  input %positions : i32[T]\n"                     \
    "  weight %e : f32[16, 8] = \"e\"\n  weight %e2 : f32[16, 8] = \"e2\"\n"                   \
    "  weight %w : f32[8] = \"w\"\n  weight %w4 : f32[4] = \"w4\"\n"                           \
    "  weight %one : f32[16, 1] = \"one\"\n"                                                  \
    "  %x : f32[T, 8] = embedding(%tokens, %e)\n  %z : f32[T, 8] = embedding(%tokens, %e2)\n"

static void test_patterns(void)
{
    /* b broadcast along the row: not the fused op's shape */
    check_unchanged("broadcast", HEAD
                    "  %c : f32[T, 1] = embedding(%tokens, %one)\n"
                    "  %s : f32[T, 8] = add(%x, %c)\n"
                    "  %n : f32[T, 8] = rms_norm(%s, %w) {eps = 1e-06}\n"
                    "  output %n\n}\n");
    /* a rank-3 value (per-head norms) */
    check_unchanged("rank 3", HEAD
                    "  %s : f32[T, 8] = add(%x, %z)\n"
                    "  %h : f32[T, 2, 4] = reshape(%s)\n"
                    "  %s3 : f32[T, 2, 4] = add(%h, %h)\n"
                    "  %n : f32[T, 2, 4] = rms_norm(%s3, %w4) {eps = 1e-06}\n"
                    "  output %n\n}\n");
    /* an rms_norm of something else, and an add nothing normalizes */
    check_unchanged("no add", HEAD
                    "  %m : f32[T, 8] = mul(%x, %z)\n"
                    "  %n : f32[T, 8] = rms_norm(%m, %w) {eps = 1e-06}\n"
                    "  %s : f32[T, 8] = add(%n, %z)\n"
                    "  output %s\n}\n");
    /* The sum is also read later and is an output; a second rms_norm of it
     * reads the fused op's sum; alpha and eps carry over. */
    char *s = run_on_text(HEAD
                          "  %s : f32[T, 8] = add(%x, %z) {alpha = 0.25}\n"
                          "  %m : f32[T, 8] = mul(%x, %z)\n"
                          "  %n : f32[T, 8] = rms_norm(%s, %w) {eps = 0.001}\n"
                          "  %n2 : f32[T, 8] = rms_norm(%s, %w) {eps = 1e-06}\n"
                          "  %y : f32[T, 8] = add(%n, %m)\n"
                          "  %o : f32[T, 8] = add(%y, %n2)\n"
                          "  %o2 : f32[T, 8] = add(%o, %s)\n"
                          "  output %o2\n  output %s\n}\n");
    T_CHECK(s && strstr(s, "  %z : f32[T, 8] = embedding(%tokens, %e2)\n"
                           "  %s : f32[T, 8], %n : f32[T, 8] = add_rms_norm(%x, %z, %w) "
                           "{eps = 0.001, alpha = 0.25}\n"
                           "  %m : f32[T, 8] = mul(%x, %z)\n"
                           "  %n2 : f32[T, 8] = rms_norm(%s, %w) {eps = 1e-06}\n"));
    T_CHECK(s && strstr(s, "  %o2 : f32[T, 8] = add(%o, %s)\n  output %o2\n  output %s\n"));
    T_CHECK(s && !strstr(s, ".1"));
    free(s);
}

/* ---- the op in the interpreter -------------------------------------------- */

static const char UNIT[] =
    "module t {\n"
    "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
    "  weight %ea : f32[2, 4] = \"ea\"\n  weight %eb : f32[2, 4] = \"eb\"\n"
    "  weight %w : f32[4] = \"w\"\n"
    "  %a : f32[T, 4] = embedding(%tokens, %ea)\n"
    "  %b : f32[T, 4] = embedding(%tokens, %eb)\n"
    "  %s : f32[T, 4], %y : f32[T, 4] = add_rms_norm(%a, %b, %w) {eps = 0.5, alpha = 2.0}\n"
    "  %s1 : f32[T, 4], %y1 : f32[T, 4] = add_rms_norm(%a, %b, %w) {eps = 0.5}\n"
    "  %o : f32[T, 8] = concat(%s, %y) {axis = 1}\n"
    "  output %o\n"
    "}\n";

static void test_interp_hand(void)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(UNIT, "unit.mir", &m));
    if (!m)
        return;
    rt_interp *in = NULL;
    T_OK(rt_interp_init(m, NULL, 4, &in));
    if (!in) {
        ir_module_free(m);
        return;
    }
    /* row 0: sum = a + 2b = [2, 0, 3, 7], mean(sum^2) + eps = 15.5 + 0.5 = 16
     * row 1: sum = [1, -1, 0, 0], 0.5 + 0.5 = 1 */
    static const float ea[8] = {1, 2, 3, 4, 0, 1, 0.5f, -1};
    static const float eb[8] = {0.5f, -1, 0, 1.5f, 0.5f, -1, -0.25f, 0.5f};
    static const float w[4] = {1, 2, 0.5f, -1};
    T_OK(rt_interp_set_weight(in, ir_module_find_value(m, "ea"), ea));
    T_OK(rt_interp_set_weight(in, ir_module_find_value(m, "eb"), eb));
    T_OK(rt_interp_set_weight(in, ir_module_find_value(m, "w"), w));
    int32_t tok[2] = {0, 1}, pos[2] = {0, 1};
    float out[16];
    T_OK(rt_interp_forward(in, tok, pos, 2, out));
    static const float want[16] = {2, 0, 3, 7, 0.5f, 0, 0.375f, -1.75f,
                                   1, -1, 0, 0, 1, -2, 0, 0};
    int same = 1;
    for (int i = 0; i < 16; i++)
        same &= out[i] == want[i];
    T_CHECK(same);
    if (!same)
        for (int i = 0; i < 16; i++)
            fprintf(stderr, "  out[%d] = %g, want %g\n", i, out[i], want[i]);
    /* without alpha: a + b; row 1: sum = [0.5, 0, 0.25, -0.5], mean(sum^2) =
     * 0.140625 */
    const float *s1 = rt_interp_value(in, ir_module_find_value(m, "s1"));
    const float *y1 = rt_interp_value(in, ir_module_find_value(m, "y1"));
    T_CHECK(s1 && y1);
    if (s1 && y1) {
        T_CHECK(s1[0] == 1.5f && s1[1] == 1 && s1[2] == 3 && s1[3] == 5.5f);
        T_CHECK(s1[4] == 0.5f && s1[5] == 0 && s1[6] == 0.25f && s1[7] == -0.5f);
        float inv = 1.0f / sqrtf(0.140625f + 0.5f);
        T_CHECK(y1[4] == 1 * (0.5f * inv) && y1[5] == 0 && y1[6] == 0.5f * (0.25f * inv) &&
                y1[7] == -1 * (-0.5f * inv));
    }
    rt_interp_free(in);
    ir_module_free(m);
}

/* add_rms_norm against add then rms_norm on random rows: the same floats. */
static void test_interp_matches_pair(void)
{
    static const char text[] =
        "module t {\n"
        "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
        "  weight %ea : f32[16, 40] = \"ea\"\n  weight %eb : f32[16, 40] = \"eb\"\n"
        "  weight %w : f32[40] = \"w\"\n"
        "  %a : f32[T, 40] = embedding(%tokens, %ea)\n"
        "  %b : f32[T, 40] = embedding(%tokens, %eb)\n"
        "  %s : f32[T, 40], %y : f32[T, 40] = add_rms_norm(%a, %b, %w) {eps = 1e-05, alpha = 0.7}\n"
        "  %s2 : f32[T, 40] = add(%a, %b) {alpha = 0.7}\n"
        "  %y2 : f32[T, 40] = rms_norm(%s2, %w) {eps = 1e-05}\n"
        "  output %y\n"
        "}\n";
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "pair.mir", &m));
    if (!m)
        return;
    rt_interp *in = NULL;
    T_OK(rt_interp_init(m, NULL, 16, &in));
    uint64_t rng = 42;
    float ea[640], eb[640], w[40];
    for (int i = 0; i < 640; i++) {
        ea[i] = 3 * t_rand_normal(&rng);
        eb[i] = t_rand_normal(&rng);
    }
    for (int i = 0; i < 40; i++)
        w[i] = 1 + 0.1f * t_rand_normal(&rng);
    int32_t tok[16], pos[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = 15 - i;
        pos[i] = i;
    }
    if (in) {
        T_OK(rt_interp_set_weight(in, ir_module_find_value(m, "ea"), ea));
        T_OK(rt_interp_set_weight(in, ir_module_find_value(m, "eb"), eb));
        T_OK(rt_interp_set_weight(in, ir_module_find_value(m, "w"), w));
        T_OK(rt_interp_forward(in, tok, pos, 16, NULL));
        const char *names[4] = {"s", "s2", "y", "y2"};
        const float *v[4];
        for (int i = 0; i < 4; i++)
            v[i] = rt_interp_value(in, ir_module_find_value(m, names[i]));
        T_CHECK(v[0] && v[1] && v[2] && v[3]);
        if (v[0] && v[1] && v[2] && v[3]) {
            T_CHECK(!memcmp(v[0], v[1], 640 * sizeof(float)));
            T_CHECK(!memcmp(v[2], v[3], 640 * sizeof(float)));
            T_CHECK(fabsf(v[0][0] - (ea[15 * 40] + 0.7f * eb[15 * 40])) < 1e-6f);
        }
    }
    rt_interp_free(in);
    ir_module_free(m);
}

/* The op's shape rules, as the parser and verifier report them. */
static void test_op_errors(void)
{
    static const char head[] =
        "module t {\n  input %tokens : i32[T]\n  input %positions : i32[T]\n"
        "  weight %e : f32[16, 8] = \"e\"\n  weight %e6 : f32[16, 6] = \"e6\"\n"
        "  weight %w : f32[8] = \"w\"\n  weight %w6 : f32[6] = \"w6\"\n"
        "  %x : f32[T, 8] = embedding(%tokens, %e)\n  %x6 : f32[T, 6] = embedding(%tokens, %e6)\n";
    static const struct {
        const char *body, *needle;
    } cases[] = {
        {"  %s : f32[T, 8], %y : f32[T, 8] = add_rms_norm(%x, %x6, %w) {eps = 1e-06}\n",
         "b %x6 (f32[T, 6]) and a %x (f32[T, 8]) differ in width"},
        {"  %s : f32[T, 8], %y : f32[T, 8] = add_rms_norm(%x, %x, %w6) {eps = 1e-06}\n",
         "weight %w6 has 6 elements, a's last dim is 8"},
        {"  %s : f32[T, 8], %y : f32[T, 8] = add_rms_norm(%x, %x, %w)\n",
         "missing required attribute 'eps'"},
        {"  %s : f32[T, 8], %y : f32[T, 8] = add_rms_norm(%x, %x, %w) {eps = -1.0}\n",
         "eps -1 must be finite and >= 0"},
        {"  %s : f32[T, 8], %y : f32[T, 8] = add_rms_norm(%x, %x, %w) {eps = 0.1, alpha = inf}\n",
         "alpha must be finite"},
        {"  %s : f32[T, 8] = add_rms_norm(%x, %x, %w) {eps = 1e-06}\n", "add_rms_norm has 2 results"},
        {"  %h : f32[T, 2, 4] = reshape(%x)\n"
         "  %s : f32[T, 2, 4], %y : f32[T, 2, 4] = add_rms_norm(%h, %h, %w) {eps = 1e-06}\n",
         "a %h must have rank 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[2048];
        snprintf(text, sizeof text, "%s%s  output %%x\n}\n", head, cases[i].body);
        ir_module *m = NULL;
        moec_status st = ir_module_parse(text, "bad.mir", &m);
        T_CHECK(st != MOEC_OK && m == NULL);
        T_CHECK(strstr(moec_last_error(), cases[i].needle) != NULL);
        if (!strstr(moec_last_error(), cases[i].needle))
            fprintf(stderr, "case %zu: got '%s', want '%s'\n", i, moec_last_error(),
                    cases[i].needle);
        ir_module_free(m);
    }
}

int main(void)
{
    test_equivalence();
    for (int i = 0; i < N_MODELS; i++) {
        check_structure(MODELS[i], IR_DTYPE_BF16);
        check_structure(MODELS[i], IR_DTYPE_F16);
        check_idempotent(MODELS[i]);
    }
    test_patterns();
    test_interp_hand();
    test_interp_matches_pair();
    test_op_errors();
    return t_finish("test_pass_norm");
}
