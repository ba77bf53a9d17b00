/* test_pass_prologue.c — issue 15's fusions and their ops. The MLA prologue
 * ops (mla_prologue, mla_prologue_kv, mla_prologue_q) and add_rms_norm's
 * second addend in the interpreter: bit for bit the slices, rms_norms,
 * ropes and adds they stand for, side by side in one module (rope with
 * YaRN and neox, rows wider than the sections); their verifier errors, word
 * for word. fuse_mla_prologue and fuse_add3_rms_norm on every tiny model:
 * logits within 1e-5 of the module before the pass (bf16, and f16 where the
 * residual add carries routed_scaling_factor), one prologue op per MLA
 * attention in the form of its model (one mla_prologue without q LoRA,
 * mla_prologue_kv and mla_prologue_q with it) under the names of the values
 * they replace, the expert sum in every MoE layer's residual add_rms_norm,
 * nothing left to do a second time, and a prologue whose ropes disagree
 * left alone. attn_prologue (GQA) likewise: bit for bit its slices,
 * rms_norms and ropes (fp32 and bf16 storage), its verifier errors, and
 * fuse_attn_prologue on the Qwen models: the same logits bit for bit, one
 * op per layer where q, k and v are one projection. */
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "ir/ir.h"
#include "passlib.h"
#include "runtime/interp.h"
#include "testlib.h"

static const char *const DEEPSEEK[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3",
                                       "deepseek_v3_fp8", "deepseek_v32"};
static const char *const ALL[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3",
                                  "deepseek_v3_fp8", "deepseek_v32",   "qwen2_moe",
                                  "qwen3_moe"};
#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

/* ---- the ops in the interpreter ------------------------------------------- */

/* H = 3 heads of dn 4 + dr 6, r 8, qr 5; x rows of 48 columns: the q heads
 * (30), kv_c (8), k_pe (6), 4 more. q rows (xq) of 30 + 2. y: 44 columns,
 * the q latent (5), kv_c, k_pe, 25 more. Each fused op beside the ops it
 * replaces. */
static const char OPS_IR[] =
    "module test {\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  weight %tx : f32[5, 48] = \"tx\"\n"
    "  weight %tq : f32[5, 32] = \"tq\"\n"
    "  weight %ty : f32[5, 44] = \"ty\"\n"
    "  weight %kvw : f32[8] = \"kvw\"\n"
    "  weight %qw : f32[5] = \"qw\"\n"
    "  %x : f32[T, 48] = embedding(%tokens, %tx)\n"
    "  %xq : f32[T, 32] = embedding(%tokens, %tq)\n"
    "  %y : f32[T, 44] = embedding(%tokens, %ty)\n"
    /* mla_prologue: interleaved, YaRN with its mscale */
    "  %a.q_nope : f32[T, 3, 4], %a.q_pe : f32[T, 3, 6], %a.kv_c : f32[T, 8], %a.k_pe : f32[T, 1, 6] = "
    "mla_prologue(%x, %positions, %kvw) {heads = 3, qk_nope_head_dim = 4, qk_rope_head_dim = 6, "
    "eps = 1e-06, style = \"interleave\", theta = 1e+04, scaling = \"yarn\", factor = 4.0, "
    "yarn_low = 1.0, yarn_high = 2.0, attn_factor = 1.25}\n"
    "  %u.q_flat : f32[T, 30] = slice(%x) {axis = 1, start = 0, size = 30}\n"
    "  %u.q : f32[T, 3, 10] = reshape(%u.q_flat)\n"
    "  %u.q_nope : f32[T, 3, 4] = slice(%u.q) {axis = 2, start = 0, size = 4}\n"
    "  %u.q_pe0 : f32[T, 3, 6] = slice(%u.q) {axis = 2, start = 4, size = 6}\n"
    "  %u.q_pe : f32[T, 3, 6] = rope(%u.q_pe0, %positions) {style = \"interleave\", theta = 1e+04, "
    "scaling = \"yarn\", factor = 4.0, yarn_low = 1.0, yarn_high = 2.0, attn_factor = 1.25}\n"
    "  %u.kv_a : f32[T, 14] = slice(%x) {axis = 1, start = 30, size = 14}\n"
    "  %u.kv_c0 : f32[T, 8] = slice(%u.kv_a) {axis = 1, start = 0, size = 8}\n"
    "  %u.kv_c : f32[T, 8] = rms_norm(%u.kv_c0, %kvw) {eps = 1e-06}\n"
    "  %u.k_pe_flat : f32[T, 6] = slice(%u.kv_a) {axis = 1, start = 8, size = 6}\n"
    "  %u.k_pe0 : f32[T, 1, 6] = reshape(%u.k_pe_flat)\n"
    "  %u.k_pe : f32[T, 1, 6] = rope(%u.k_pe0, %positions) {style = \"interleave\", theta = 1e+04, "
    "scaling = \"yarn\", factor = 4.0, yarn_low = 1.0, yarn_high = 2.0, attn_factor = 1.25}\n"
    /* mla_prologue_kv and mla_prologue_q: neox, linear */
    "  %b.q_a : f32[T, 5], %b.kv_c : f32[T, 8], %b.k_pe : f32[T, 1, 6] = mla_prologue_kv(%y, "
    "%positions, %kvw, %qw) {qk_rope_head_dim = 6, eps = 0.001, style = \"neox\", theta = 500.0, "
    "scaling = \"linear\", factor = 2.0}\n"
    "  %v.q_a0 : f32[T, 5] = slice(%y) {axis = 1, start = 0, size = 5}\n"
    "  %v.q_a : f32[T, 5] = rms_norm(%v.q_a0, %qw) {eps = 0.001}\n"
    "  %v.kv_c0 : f32[T, 8] = slice(%y) {axis = 1, start = 5, size = 8}\n"
    "  %v.kv_c : f32[T, 8] = rms_norm(%v.kv_c0, %kvw) {eps = 0.001}\n"
    "  %v.k_pe_flat : f32[T, 6] = slice(%y) {axis = 1, start = 13, size = 6}\n"
    "  %v.k_pe0 : f32[T, 1, 6] = reshape(%v.k_pe_flat)\n"
    "  %v.k_pe : f32[T, 1, 6] = rope(%v.k_pe0, %positions) {style = \"neox\", theta = 500.0, "
    "scaling = \"linear\", factor = 2.0}\n"
    "  %c.q_nope : f32[T, 3, 4], %c.q_pe : f32[T, 3, 6] = mla_prologue_q(%xq, %positions) {heads = "
    "3, qk_nope_head_dim = 4, qk_rope_head_dim = 6, style = \"neox\", theta = 500.0, scaling = "
    "\"linear\", factor = 2.0}\n"
    "  %w.q_flat : f32[T, 30] = slice(%xq) {axis = 1, start = 0, size = 30}\n"
    "  %w.q : f32[T, 3, 10] = reshape(%w.q_flat)\n"
    "  %w.q_nope : f32[T, 3, 4] = slice(%w.q) {axis = 2, start = 0, size = 4}\n"
    "  %w.q_pe0 : f32[T, 3, 6] = slice(%w.q) {axis = 2, start = 4, size = 6}\n"
    "  %w.q_pe : f32[T, 3, 6] = rope(%w.q_pe0, %positions) {style = \"neox\", theta = 500.0, "
    "scaling = \"linear\", factor = 2.0}\n"
    /* add_rms_norm with a second addend, alpha 2.5 */
    "  %d.p : f32[T, 8] = slice(%y) {axis = 1, start = 20, size = 8}\n"
    "  %d.q : f32[T, 8] = slice(%y) {axis = 1, start = 28, size = 8}\n"
    "  %d.r : f32[T, 8] = slice(%y) {axis = 1, start = 36, size = 8}\n"
    "  %d.sum : f32[T, 8], %d.normed : f32[T, 8] = add_rms_norm(%d.r, %d.p, %kvw, %d.q) {eps = "
    "1e-05, alpha = 2.5}\n"
    "  %e.pq : f32[T, 8] = add(%d.p, %d.q)\n"
    "  %e.sum0 : f32[T, 8] = add(%d.r, %e.pq) {alpha = 2.5}\n"
    "  %e.normed : f32[T, 8] = rms_norm(%e.sum0, %kvw) {eps = 1e-05}\n"
    "  %e.sum : f32[T, 8], %e.normed2 : f32[T, 8] = add_rms_norm(%d.r, %e.pq, %kvw) {eps = "
    "1e-05, alpha = 2.5}\n"
    "  output %x\n"
    "}\n";

/* fused value `a` equals unfused `b`, bit for bit, over T tokens. */
static void same_bits(rt_interp *in, const ir_module *m, const char *a, const char *b, int T)
{
    const ir_value *va = ir_module_find_value(m, a), *vb = ir_module_find_value(m, b);
    T_CHECK(va && vb && ir_type_equal(&va->type, &vb->type));
    if (!va || !vb)
        return;
    size_t n = (size_t)ir_type_numel(&va->type, T);
    const float *x = rt_interp_value(in, va), *y = rt_interp_value(in, vb);
    int same = x && y && !memcmp(x, y, n * sizeof *x);
    if (!same)
        for (size_t i = 0; x && y && i < n; i++)
            if (x[i] != y[i]) {
                fprintf(stderr, "%%%s[%zu] = %.9g, %%%s[%zu] = %.9g\n", a, i, x[i], b, i, y[i]);
                break;
            }
    T_CHECK(same);
    /* and something was computed: not all zeros */
    int nonzero = 0;
    for (size_t i = 0; x && i < n; i++)
        nonzero |= x[i] != 0.0f;
    T_CHECK(nonzero);
}

static void test_ops(void)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(OPS_IR, "ops.mir", &m));
    if (!m)
        return;
    rt_interp *in = NULL;
    T_OK(rt_interp_init(m, NULL, 64, &in));
    uint64_t rng = 0x9e3779b9;
    static const char *const W[] = {"tx", "tq", "ty", "kvw", "qw"};
    for (int i = 0; in && i < N_OF(W); i++) {
        const ir_value *w = ir_module_find_value(m, W[i]);
        int64_t n = ir_type_numel(&w->type, 0);
        float *d = malloc((size_t)n * sizeof *d);
        for (int64_t j = 0; d && j < n; j++)
            d[j] = t_rand_normal(&rng) * (j % 7 == 3 ? 9.0f : 1.0f);
        T_OK(rt_interp_set_weight(in, w, d));
        free(d);
    }
    int32_t tok[4] = {3, 0, 4, 1}, pos[4] = {0, 7, 31, 63};
    if (in) {
        T_OK(rt_interp_forward(in, tok, pos, 4, NULL));
        static const char *const PAIRS[][2] = {
            {"a.q_nope", "u.q_nope"}, {"a.q_pe", "u.q_pe"},     {"a.kv_c", "u.kv_c"},
            {"a.k_pe", "u.k_pe"},     {"b.q_a", "v.q_a"},       {"b.kv_c", "v.kv_c"},
            {"b.k_pe", "v.k_pe"},     {"c.q_nope", "w.q_nope"}, {"c.q_pe", "w.q_pe"},
            {"d.sum", "e.sum0"},      {"d.normed", "e.normed"}, {"d.sum", "e.sum"},
        };
        for (int i = 0; i < N_OF(PAIRS); i++)
            same_bits(in, m, PAIRS[i][0], PAIRS[i][1], 4);
    }
    rt_interp_free(in);
    ir_module_free(m);
}

/* attn_prologue beside the ops it replaces: H = 4 q heads, Hkv = 2, D = 8,
 * g rows of 66 columns (q 32, k 16, v 16, 2 more). Qwen3's form (q/k norms,
 * neox, YaRN with its mscale) and Qwen2's (no norms; interleaved, linear,
 * a rotary_dim of 6). */
static const char GQA_IR[] =
    "module test {\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  weight %tg : f32[5, 66] = \"tg\"\n"
    "  weight %qn : f32[8] = \"qn\"\n"
    "  weight %kn : f32[8] = \"kn\"\n"
    "  %g : f32[T, 66] = embedding(%tokens, %tg)\n"
    "  %a.q : f32[T, 4, 8], %a.k : f32[T, 2, 8], %a.v : f32[T, 2, 8] = attn_prologue(%g, "
    "%positions, %qn, %kn) {heads = 4, kv_heads = 2, head_dim = 8, eps = 1e-06, style = "
    "\"neox\", theta = 1e+04, scaling = \"yarn\", factor = 4.0, yarn_low = 1.0, yarn_high = "
    "2.0, attn_factor = 1.25}\n"
    "  %u.q_flat : f32[T, 32] = slice(%g) {axis = 1, start = 0, size = 32}\n"
    "  %u.q0 : f32[T, 4, 8] = reshape(%u.q_flat)\n"
    "  %u.qn : f32[T, 4, 8] = rms_norm(%u.q0, %qn) {eps = 1e-06}\n"
    "  %u.q : f32[T, 4, 8] = rope(%u.qn, %positions) {style = \"neox\", theta = 1e+04, "
    "scaling = \"yarn\", factor = 4.0, yarn_low = 1.0, yarn_high = 2.0, attn_factor = 1.25}\n"
    "  %u.k_flat : f32[T, 16] = slice(%g) {axis = 1, start = 32, size = 16}\n"
    "  %u.k0 : f32[T, 2, 8] = reshape(%u.k_flat)\n"
    "  %u.kn : f32[T, 2, 8] = rms_norm(%u.k0, %kn) {eps = 1e-06}\n"
    "  %u.k : f32[T, 2, 8] = rope(%u.kn, %positions) {style = \"neox\", theta = 1e+04, "
    "scaling = \"yarn\", factor = 4.0, yarn_low = 1.0, yarn_high = 2.0, attn_factor = 1.25}\n"
    "  %u.v_flat : f32[T, 16] = slice(%g) {axis = 1, start = 48, size = 16}\n"
    "  %u.v : f32[T, 2, 8] = reshape(%u.v_flat)\n"
    "  %b.q : f32[T, 4, 8], %b.k : f32[T, 2, 8], %b.v : f32[T, 2, 8] = attn_prologue(%g, "
    "%positions) {heads = 4, kv_heads = 2, head_dim = 8, style = \"interleave\", theta = "
    "500.0, scaling = \"linear\", factor = 2.0, rotary_dim = 6}\n"
    "  %w.q0 : f32[T, 4, 8] = reshape(%u.q_flat)\n"
    "  %w.q : f32[T, 4, 8] = rope(%w.q0, %positions) {style = \"interleave\", theta = 500.0, "
    "scaling = \"linear\", factor = 2.0, rotary_dim = 6}\n"
    "  %w.k : f32[T, 2, 8] = rope(%u.k0, %positions) {style = \"interleave\", theta = 500.0, "
    "scaling = \"linear\", factor = 2.0, rotary_dim = 6}\n"
    "  output %g\n"
    "}\n";

/* attn_prologue equals its ops bit for bit, in fp32 and with every result
 * rounded to bf16 as the GPU stores it. */
static void test_gqa_ops(ir_dtype round)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(GQA_IR, "gqa.mir", &m));
    if (!m)
        return;
    rt_interp *in = NULL;
    T_OK(rt_interp_init(m, NULL, 64, &in));
    uint64_t rng = 0x51ed27;
    static const char *const W[] = {"tg", "qn", "kn"};
    for (int i = 0; in && i < N_OF(W); i++) {
        const ir_value *w = ir_module_find_value(m, W[i]);
        int64_t n = ir_type_numel(&w->type, 0);
        float *d = malloc((size_t)n * sizeof *d);
        for (int64_t j = 0; d && j < n; j++)
            d[j] = t_rand_normal(&rng) * (j % 5 == 2 ? 7.0f : 1.0f);
        T_OK(rt_interp_set_weight(in, w, d));
        free(d);
    }
    int32_t tok[4] = {2, 4, 0, 3}, pos[4] = {0, 5, 17, 63};
    if (in) {
        T_OK(rt_interp_round_storage(in, round, 0));
        T_OK(rt_interp_forward(in, tok, pos, 4, NULL));
        static const char *const PAIRS[][2] = {
            {"a.q", "u.q"}, {"a.k", "u.k"}, {"a.v", "u.v"},
            {"b.q", "w.q"}, {"b.k", "w.k"}, {"b.v", "u.v"},
        };
        for (int i = 0; i < N_OF(PAIRS); i++)
            same_bits(in, m, PAIRS[i][0], PAIRS[i][1], 4);
    }
    rt_interp_free(in);
    ir_module_free(m);
}

/* The op line `line` in a module of x [T, 48], weights kvw [8], qw [5],
 * v3 [3]: the verifier's error names it. */
static void bad_op(const char *line, const char *needle)
{
    char text[2048];
    snprintf(text, sizeof text,
             "module test {\n"
             "  input %%tokens : i32[T]\n"
             "  input %%positions : i32[T]\n"
             "  weight %%tx : f32[5, 48] = \"tx\"\n"
             "  weight %%kvw : f32[8] = \"kvw\"\n"
             "  weight %%qw : f32[5] = \"qw\"\n"
             "  weight %%m2 : f32[2, 4] = \"m2\"\n"
             "  %%x : f32[T, 48] = embedding(%%tokens, %%tx)\n"
             "  %%x8 : f32[T, 8] = slice(%%x) {axis = 1, start = 0, size = 8}\n"
             "  %%x9 : f32[T, 9] = slice(%%x) {axis = 1, start = 0, size = 9}\n"
             "  %s\n"
             "  output %%x\n"
             "}\n",
             line);
    ir_module *m = NULL;
    T_ERR(ir_module_parse(text, "bad.mir", &m), MOEC_ERR_FORMAT, needle);
    ir_module_free(m);
}

#define ROPE_ATTRS "style = \"interleave\", theta = 1e+04"

static void test_verifier(void)
{
    bad_op("%q : f32[T, 3, 4], %p : f32[T, 3, 6], %c : f32[T, 8], %k : f32[T, 1, 6] = "
           "mla_prologue(%x, %positions, %kvw) {heads = 3, qk_nope_head_dim = 6, "
           "qk_rope_head_dim = 6, eps = 1e-06, " ROPE_ATTRS "}",
           "%q: mla_prologue: input %x (f32[T, 48]) has 48 columns, its sections need 50");
    bad_op("%q : f32[T, 3, 4], %p : f32[T, 3, 5], %c : f32[T, 8], %k : f32[T, 1, 5] = "
           "mla_prologue(%x, %positions, %kvw) {heads = 3, qk_nope_head_dim = 4, "
           "qk_rope_head_dim = 5, eps = 1e-06, " ROPE_ATTRS "}",
           "%q: mla_prologue: qk_rope_head_dim 5 must be even");
    bad_op("%q : f32[T, 3, 4], %p : f32[T, 3, 6], %c : f32[T, 8], %k : f32[T, 1, 6] = "
           "mla_prologue(%x, %positions, %kvw) {heads = 3, qk_nope_head_dim = 4, "
           "qk_rope_head_dim = 6, " ROPE_ATTRS "}",
           "%q: mla_prologue: missing required attribute 'eps'");
    bad_op("%q : f32[T, 3, 4], %p : f32[T, 3, 6], %c : f32[T, 8], %k : f32[T, 1, 6] = "
           "mla_prologue(%x, %positions, %kvw) {heads = 0, qk_nope_head_dim = 4, "
           "qk_rope_head_dim = 6, eps = 1e-06, " ROPE_ATTRS "}",
           "%q: mla_prologue: heads 0 must be >= 1");
    bad_op("%q : f32[T, 3, 4], %p : f32[T, 3, 6], %c : f32[T, 8], %k : f32[T, 1, 6] = "
           "mla_prologue(%x, %positions, %m2) {heads = 3, qk_nope_head_dim = 4, "
           "qk_rope_head_dim = 6, eps = 1e-06, " ROPE_ATTRS "}",
           "%q: mla_prologue: kv_norm %m2 must have rank 1, got f32[2, 4]");
    bad_op("%q : f32[T, 3, 4], %p : f32[T, 3, 6], %c : f32[T, 8], %k : f32[T, 1, 6] = "
           "mla_prologue(%x, %positions, %kvw) {heads = 3, qk_nope_head_dim = 4, "
           "qk_rope_head_dim = 6, eps = 1e-06, style = \"sideways\", theta = 1e+04}",
           "%q: mla_prologue: style 'sideways' must be \"interleave\" or \"neox\"");
    bad_op("%a : f32[T, 5], %c : f32[T, 8], %k : f32[T, 1, 6] = mla_prologue_kv(%x, %positions, "
           "%kvw, %qw) {heads = 3, qk_rope_head_dim = 6, eps = 1e-06, " ROPE_ATTRS "}",
           "bad.mir:11:99: unknown attribute 'heads' for mla_prologue_kv");
    bad_op("%a : f32[T, 5], %c : f32[T, 8], %k : f32[T, 1, 6] = mla_prologue_kv(%x9, %positions, "
           "%kvw, %qw) {qk_rope_head_dim = 6, eps = 1e-06, " ROPE_ATTRS "}",
           "%a: mla_prologue_kv: input %x9 (f32[T, 9]) has 9 columns, its sections need 19");
    bad_op("%a : f32[T, 5], %c : f32[T, 8], %k : f32[T, 1, 6] = mla_prologue_kv(%x, %positions, "
           "%kvw) {qk_rope_head_dim = 6, eps = 1e-06, " ROPE_ATTRS "}",
           "bad.mir:11:91: mla_prologue_kv takes at least 4 operands, 3 given");
    bad_op("%q : f32[T, 3, 4], %p : f32[T, 3, 6] = mla_prologue_q(%x8, %positions) {heads = 3, "
           "qk_nope_head_dim = 4, qk_rope_head_dim = 6, " ROPE_ATTRS "}",
           "%q: mla_prologue_q: input %x8 (f32[T, 8]) has 8 columns, its sections need 30");
    bad_op("%q : f32[T, 3, 4], %p : f32[T, 3, 6] = mla_prologue_q(%x, %positions) {heads = 3, "
           "qk_nope_head_dim = 4, qk_rope_head_dim = 6, eps = 1e-06, " ROPE_ATTRS "}",
           "bad.mir:11:129: unknown attribute 'eps' for mla_prologue_q");
    bad_op("%q : f32[T, 3, 4], %p : f32[T, 3, 8] = mla_prologue_q(%x, %positions) {heads = 3, "
           "qk_nope_head_dim = 4, qk_rope_head_dim = 6, " ROPE_ATTRS "}",
           "%p: mla_prologue_q: declared type f32[T, 3, 8], inferred f32[T, 3, 6]");
    /* attn_prologue: x [T, 48] holds 6 heads of 8 */
#define GQA_OUT "%q : f32[T, 4, 8], %k : f32[T, 2, 8], %v : f32[T, 2, 8] = "
    bad_op(GQA_OUT "attn_prologue(%x, %positions) {heads = 4, kv_heads = 2, head_dim = 8, "
           ROPE_ATTRS "}",
           "%q: attn_prologue: input %x (f32[T, 48]) has 48 columns, its sections need 64");
    bad_op(GQA_OUT "attn_prologue(%x, %positions) {heads = 3, kv_heads = 2, head_dim = 4, "
           ROPE_ATTRS "}",
           "%q: attn_prologue: heads 3 are not a multiple of kv_heads 2");
    bad_op(GQA_OUT "attn_prologue(%x, %positions, %kvw) {heads = 2, kv_heads = 1, head_dim = 8, "
           "eps = 1e-06, " ROPE_ATTRS "}",
           "%q: attn_prologue: takes q_norm and k_norm, or neither: 1 norm weight given");
    bad_op(GQA_OUT "attn_prologue(%x, %positions, %kvw, %kvw) {heads = 2, kv_heads = 1, "
           "head_dim = 8, " ROPE_ATTRS "}",
           "%q: attn_prologue: q_norm and k_norm need attribute 'eps'");
    bad_op(GQA_OUT "attn_prologue(%x, %positions) {heads = 2, kv_heads = 1, head_dim = 8, "
           "eps = 1e-06, " ROPE_ATTRS "}",
           "%q: attn_prologue: attribute 'eps' without q_norm and k_norm");
    bad_op(GQA_OUT "attn_prologue(%x, %positions, %kvw, %qw) {heads = 2, kv_heads = 1, "
           "head_dim = 8, eps = 1e-06, " ROPE_ATTRS "}",
           "%q: attn_prologue: k_norm %qw has 5 elements, head_dim is 8");
    bad_op(GQA_OUT "attn_prologue(%x, %positions) {heads = 2, kv_heads = 1, head_dim = 7, "
           ROPE_ATTRS "}",
           "%q: attn_prologue: head_dim 7 must be even");
    bad_op(GQA_OUT "attn_prologue(%x, %positions) {heads = 2, kv_heads = 1, head_dim = 8, "
           "rotary_dim = 10, " ROPE_ATTRS "}",
           "%q: attn_prologue: rotary_dim 10 must be even and in [2, 8] (the head dim)");
    bad_op(GQA_OUT "attn_prologue(%x, %positions) {heads = 4, kv_heads = 2, head_dim = 6, "
           ROPE_ATTRS "}",
           "%q: attn_prologue: declared type f32[T, 4, 8], inferred f32[T, 4, 6]");
#undef GQA_OUT
    bad_op("%s : f32[T, 8], %n : f32[T, 8] = add_rms_norm(%x8, %x8, %kvw, %x9) {eps = 1e-06}",
           "%s: add_rms_norm: c %x9 (f32[T, 9]) and a %x8 (f32[T, 8]) differ in width");
}

/* ---- the passes on the tiny models ---------------------------------------- */

static const char *const QWEN[] = {"qwen2_moe", "qwen3_moe", "qwen3_moe_fp8"};

static void test_equivalence(void)
{
    for (int i = 0; i < N_OF(DEEPSEEK); i++)
        T_CHECK(t_pass_equivalence(DEEPSEEK[i], "fuse_mla_prologue", NULL) >= 0);
    /* fuse_attn_prologue: the same logits bit for bit, in fp32 and with
       every result rounded to bf16 as the GPU stores it */
    for (int i = 0; i < N_OF(QWEN); i++) {
        ir_module *before, *m;
        if (!t_pipeline_pair(QWEN[i], "fuse_mla_prologue", "fuse_attn_prologue", NULL, &before,
                             &m))
            continue;
        double f32 = t_modules_agree(QWEN[i], before, m, 0x5eed);
        double bf16 = t_modules_agree_stored(QWEN[i], before, m, 0x5eed, IR_DTYPE_BF16);
        printf("fuse_attn_prologue %-18s max row error %.3g (fp32), %.3g (bf16 storage)\n",
               QWEN[i], f32, bf16);
        T_CHECK(f32 == 0 && bf16 == 0);
        ir_module_free(before);
        ir_module_free(m);
    }
    pass_options f16 = t_pass_options(IR_DTYPE_F16);
    for (int i = 0; i < N_OF(ALL); i++) {
        T_CHECK(t_pass_equivalence(ALL[i], "fuse_add3_rms_norm", NULL) >= 0);
        /* f16: DeepSeek's residual add_rms_norm multiplies by routed_scaling_factor */
        T_CHECK(t_pass_equivalence(ALL[i], "fuse_add3_rms_norm", &f16) >= 0);
    }
}

/* The op defining the value named `name` is of kind k and that value is its
 * result `slot`. */
static const ir_op *result_of(const ir_module *m, const char *name, ir_op_kind k, int slot)
{
    const ir_value *v = ir_module_find_value(m, name);
    int ok = v && v->kind == IR_VALUE_OP && v->def && v->def->kind == k && v->def->out[slot] == v;
    if (!ok)
        fprintf(stderr, "%s: %%%s is not result %d of a %s\n", m->name, name, slot, ir_op_name(k));
    T_CHECK(ok);
    return ok ? v->def : NULL;
}

static void check_prologue(const char *model)
{
    ir_module *before = t_pipeline_module(model, "shard", NULL);
    ir_module *m = t_pipeline_module(model, "fuse_mla_prologue", NULL);
    if (!before || !m) {
        ir_module_free(before);
        ir_module_free(m);
        return;
    }
    int layers = (int)ir_module_meta_int(m, "num_hidden_layers", 0);
    int lora = t_count_ops(before, IR_OP_MLA_ATTENTION) > 0 &&
               ir_module_find_value(before, "l0.attn.q_a_norm") != NULL;
    int n_a = t_count_ops(m, IR_OP_MLA_PROLOGUE), n_kv = t_count_ops(m, IR_OP_MLA_PROLOGUE_KV);
    int n_q = t_count_ops(m, IR_OP_MLA_PROLOGUE_Q);
    T_CHECK(t_count_ops(m, IR_OP_MLA_ATTENTION) == layers);
    T_CHECK(lora ? n_a == 0 && n_kv == layers && n_q == layers : n_a == layers && n_kv + n_q == 0);
    /* every rope and rms_norm of the attention went in; the indexer's stay */
    int idx_ropes = 2 * t_count_ops(before, IR_OP_DSA_TOPK);
    T_CHECK(t_count_ops(m, IR_OP_ROPE) == idx_ropes);
    T_CHECK(t_count_ops(m, IR_OP_RMS_NORM) ==
            t_count_ops(before, IR_OP_RMS_NORM) - (lora ? 2 : 1) * layers);
    for (int l = 0; l < layers; l++) {
        char n[6][64];
        static const char *const what[6] = {"q_nope", "q_pe_rot", "kv_c_norm", "k_pe_rot",
                                            "q_a_norm", "o_c"};
        for (int i = 0; i < 6; i++)
            snprintf(n[i], sizeof n[i], "l%d.attn.%s", l, what[i]);
        const ir_op *att = result_of(m, n[5], IR_OP_MLA_ATTENTION, 0);
        const ir_op *q, *kv;
        if (lora) {
            q = result_of(m, n[0], IR_OP_MLA_PROLOGUE_Q, 0);
            T_CHECK(q && q == result_of(m, n[1], IR_OP_MLA_PROLOGUE_Q, 1));
            kv = result_of(m, n[4], IR_OP_MLA_PROLOGUE_KV, 0);
            T_CHECK(kv && kv == result_of(m, n[2], IR_OP_MLA_PROLOGUE_KV, 1) &&
                    kv == result_of(m, n[3], IR_OP_MLA_PROLOGUE_KV, 2));
            /* the q side reads what q_b_proj made of the latent */
            T_CHECK(q && kv && q->in[0]->def && q->in[0]->def->kind == IR_OP_LINEAR &&
                    q->in[0]->def->in[0] == kv->out[0] && q->id > kv->id);
        } else {
            q = kv = result_of(m, n[0], IR_OP_MLA_PROLOGUE, 0);
            T_CHECK(q && q == result_of(m, n[1], IR_OP_MLA_PROLOGUE, 1) &&
                    q == result_of(m, n[2], IR_OP_MLA_PROLOGUE, 2) &&
                    q == result_of(m, n[3], IR_OP_MLA_PROLOGUE, 3));
        }
        if (!att || !q || !kv)
            continue;
        /* the kv side reads the fused q/kv projection, the attention its results */
        char qkv[64];
        snprintf(qkv, sizeof qkv, "l%d.attn.qkv_a", l);
        T_CHECK(!strcmp(kv->in[0]->name, qkv) && kv->in[1] == ir_module_find_value(m, "positions"));
        T_CHECK(att->in[1] == q->out[1] && att->in[2] == kv->out[kv->n_out - 2] &&
                att->in[3] == kv->out[kv->n_out - 1]);
        T_CHECK(ir_op_attr_int(q, "qk_rope_head_dim", 0) == att->in[1]->type.dims[2]);
        /* the ropes' attributes and the norm's eps */
        snprintf(qkv, sizeof qkv, "l%d.attn.k_pe_rot", l);
        const ir_value *rope = ir_module_find_value(before, qkv);
        T_CHECK(rope && ir_op_attr_float(kv, "eps", 0) == 1e-6 &&
                ir_op_attr_float(kv, "theta", 0) == ir_op_attr_float(rope->def, "theta", 1) &&
                !strcmp(ir_op_attr_str(kv, "style", ""), "interleave") &&
                !strcmp(ir_op_attr_str(q, "scaling", "none"),
                        ir_op_attr_str(rope->def, "scaling", "none")) &&
                ir_op_attr_float(q, "attn_factor", 1) ==
                    ir_op_attr_float(rope->def, "attn_factor", 1));
        /* the absorption reads q_nope in place in the projection the q
           side reads (heads of dn + dr columns); the prologue's q_nope is
           left unread */
        const ir_op *qa = att->in[0]->def;
        int64_t H = ir_op_attr_int(q, "heads", 0), dn = ir_op_attr_int(q, "qk_nope_head_dim", 0);
        T_CHECK(qa && qa->kind == IR_OP_MLA_QABSORB && qa->in[0] == q->in[0] &&
                ir_op_attr_int(qa, "heads", 0) == H && H > 0 &&
                ir_op_attr_int(qa, "head_stride", 0) ==
                    dn + ir_op_attr_int(q, "qk_rope_head_dim", 0) &&
                ir_op_attr_int(qa, "qk_nope_head_dim", 0) == dn && !ir_module_single_user(m, q->out[0]));
        for (int k = 0; k < m->n_ops; k++)
            for (int i = 0; i < m->ops[k]->n_in; i++)
                T_CHECK(m->ops[k]->in[i] != q->out[0]);
    }
    t_pass_idempotent(m, pass_fuse_mla_prologue);
    printf("fuse_mla_prologue %-18s %d layers: %d mla_prologue, %d mla_prologue_kv, %d "
           "mla_prologue_q\n",
           model, layers, n_a, n_kv, n_q);
    ir_module_free(before);
    ir_module_free(m);
}

/* Ropes of q and k that disagree (another theta on q's): without q LoRA
 * nothing fuses; with it the kv side does, the q side stays. */
static void check_mismatch(const char *model, int lora)
{
    ir_module *m = t_pipeline_module(model, "shard", NULL);
    if (!m)
        return;
    for (int i = 0; i < m->n_ops; i++)
        if (m->ops[i]->kind == IR_OP_ROPE && strstr(m->ops[i]->out[0]->name, "q_pe_rot"))
            T_OK(ir_op_set_float(m, m->ops[i], "theta", 5000.0));
    int layers = (int)ir_module_meta_int(m, "num_hidden_layers", 0);
    int ropes = t_count_ops(m, IR_OP_ROPE);
    T_OK(pass_fuse_mla_prologue(m, NULL));
    T_OK(ir_module_verify(m));
    T_CHECK(t_count_ops(m, IR_OP_MLA_PROLOGUE) == 0 && t_count_ops(m, IR_OP_MLA_PROLOGUE_Q) == 0);
    T_CHECK(t_count_ops(m, IR_OP_MLA_PROLOGUE_KV) == (lora ? layers : 0));
    T_CHECK(t_count_ops(m, IR_OP_ROPE) == ropes - (lora ? layers : 0));
    ir_module_free(m);
}

/* fuse_attn_prologue on a Qwen model: one attn_prologue per layer where the
 * q, k and v projections are one linear (not in qwen3_moe_fp8, whose
 * block-scaled q, k and v stay linears of their own: nothing to do), under
 * the names of the values it replaces, the attention reading its results;
 * no rope and no head rms_norm left. With `theta`, q's ropes get another
 * theta first: nothing fuses. */
static void check_gqa(const char *model, double theta)
{
    ir_module *before, *m;
    if (!t_pipeline_pair(model, "fuse_mla_prologue", "fuse_mla_prologue", NULL, &before, &m))
        return;
    for (int i = 0; theta > 0 && i < m->n_ops; i++)
        if (m->ops[i]->kind == IR_OP_ROPE && strstr(m->ops[i]->out[0]->name, "q_rot"))
            T_OK(ir_op_set_float(m, m->ops[i], "theta", theta));
    T_OK(pass_fuse_attn_prologue(m, NULL));
    T_OK(ir_module_verify(m));
    int layers = (int)ir_module_meta_int(m, "num_hidden_layers", 0);
    int fused = theta > 0 || !ir_module_find_value(before, "l0.attn.qkv") ? 0 : layers;
    int norms = ir_module_find_value(before, "l0.attn.q_normed") != NULL;
    int n = t_count_ops(m, IR_OP_ATTN_PROLOGUE);
    T_CHECK(n == fused && t_count_ops(m, IR_OP_ATTENTION) == layers);
    T_CHECK(t_count_ops(m, IR_OP_ROPE) == t_count_ops(before, IR_OP_ROPE) - 2 * fused);
    T_CHECK(t_count_ops(m, IR_OP_RMS_NORM) ==
            t_count_ops(before, IR_OP_RMS_NORM) - (norms ? 2 : 0) * fused);
    for (int l = 0; l < layers && fused; l++) {
        char n3[3][64], ctx[64], qkv[64];
        static const char *const what[3] = {"q_rot", "k_rot", "v"};
        const ir_op *pro = NULL;
        for (int i = 0; i < 3; i++) {
            snprintf(n3[i], sizeof n3[i], "l%d.attn.%s", l, what[i]);
            const ir_op *p = result_of(m, n3[i], IR_OP_ATTN_PROLOGUE, i);
            T_CHECK(p && (!pro || p == pro));
            pro = p;
        }
        snprintf(ctx, sizeof ctx, "l%d.attn.ctx", l);
        snprintf(qkv, sizeof qkv, "l%d.attn.qkv", l);
        const ir_op *att = result_of(m, ctx, IR_OP_ATTENTION, 0);
        if (!pro || !att)
            continue;
        T_CHECK(att->in[0] == pro->out[0] && att->in[1] == pro->out[1] &&
                att->in[2] == pro->out[2] && pro->in[1] == att->in[3]);
        T_CHECK(!strcmp(pro->in[0]->name, qkv) && pro->n_in == (norms ? 4 : 2));
        const ir_value *rope = ir_module_find_value(before, n3[0]);
        T_CHECK(rope && !strcmp(ir_op_attr_str(pro, "style", ""), "neox") &&
                ir_op_attr_float(pro, "theta", 0) == ir_op_attr_float(rope->def, "theta", 1) &&
                ir_op_attr_int(pro, "head_dim", 0) == rope->type.dims[2] &&
                ir_op_attr_int(pro, "heads", 0) == rope->type.dims[1] &&
                (ir_op_attr(pro, "eps") != NULL) == norms);
    }
    t_pass_idempotent(m, pass_fuse_attn_prologue);
    printf("fuse_attn_prologue %-18s %d layers%s: %d attn_prologue\n", model, layers,
           theta > 0 ? " (ropes disagree)" : "", n);
    ir_module_free(before);
    ir_module_free(m);
}

static void check_add3(const char *model, ir_dtype dt)
{
    pass_options o = t_pass_options(dt);
    ir_module *before, *m;
    if (!t_pipeline_pair(model, "assign_streams", "fuse_add3_rms_norm", &o, &before, &m))
        return;
    /* one per MoE layer with a shared expert: each join's add (not the
       joins of V3.2's indexer, whose top-k ids the attention reads) */
    int joins = 0, fused = 0;
    for (int i = 0; i < m->n_ops; i++)
        joins += m->ops[i]->kind == IR_OP_JOIN && m->ops[i]->in[0]->def->kind != IR_OP_DSA_TOPK;
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *n = m->ops[i];
        if (n->kind != IR_OP_ADD_RMS_NORM || n->n_in != 4)
            continue;
        fused++;
        /* the routed experts' sum, then the shared expert's (qwen2_moe: gated) */
        T_CHECK(n->in[1]->def && n->in[1]->def->kind == IR_OP_MOE_ROUTED && n->stream == 0);
        const ir_op *shared = n->in[3]->def;
        T_CHECK(shared && (shared->kind == IR_OP_JOIN || shared->kind == IR_OP_MUL));
        const ir_value *old = ir_module_find_value(before, n->out[0]->name);
        T_CHECK(old && old->def->kind == IR_OP_ADD_RMS_NORM && old->def->in[1]->def &&
                old->def->in[1]->def->kind == IR_OP_ADD &&
                ir_op_attr_float(n, "alpha", 1) == ir_op_attr_float(old->def, "alpha", 1));
    }
    T_CHECK(fused == joins);
    T_CHECK(t_count_ops(m, IR_OP_ADD) == t_count_ops(before, IR_OP_ADD) - fused);
    T_CHECK(m->n_ops == before->n_ops - fused);
    t_pass_idempotent(m, pass_fuse_add3_rms_norm);
    printf("fuse_add3_rms_norm %-18s %s: %d expert sums in the residual add_rms_norm\n", model,
           ir_dtype_name(dt), fused);
    ir_module_free(before);
    ir_module_free(m);
}

static void test_structure(void)
{
    for (int i = 0; i < N_OF(DEEPSEEK); i++)
        check_prologue(DEEPSEEK[i]);
    check_mismatch("deepseek_v2", 0);
    check_mismatch("deepseek_v3", 1);
    /* no MLA: nothing to do */
    ir_module *q = t_pipeline_module("qwen3_moe", "fuse_mla_prologue", NULL);
    T_CHECK(q && t_count_ops(q, IR_OP_ROPE) > 0 && t_count_ops(q, IR_OP_MLA_PROLOGUE) == 0);
    ir_module_free(q);
    for (int i = 0; i < N_OF(QWEN); i++)
        check_gqa(QWEN[i], 0);
    check_gqa("qwen3_moe", 5000.0);
    /* no GQA attention: nothing to do */
    ir_module *d = t_pipeline_module("deepseek_v2", "fuse_attn_prologue", NULL);
    T_CHECK(d && t_count_ops(d, IR_OP_ATTN_PROLOGUE) == 0);
    ir_module_free(d);
    for (int i = 0; i < N_OF(ALL); i++) {
        check_add3(ALL[i], IR_DTYPE_BF16);
        check_add3(ALL[i], IR_DTYPE_F16);
    }
}

int main(void)
{
    test_ops();
    test_gqa_ops(IR_DTYPE_F32);
    test_gqa_ops(IR_DTYPE_BF16);
    test_verifier();
    test_equivalence();
    test_structure();
    return t_finish("test_pass_prologue");
}
