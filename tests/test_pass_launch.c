/* test_pass_launch.c — fuse_moe_sum and fuse_silu_mul_linear (issue 15: a
 * launch less each per MoE layer) and the op forms they make: moe_routed
 * `unsummed` with the add_rms_norm that sums its [T, K, D] b, linear `act
 * silu_mul`. On every tiny model the pipeline with them gives exactly the
 * logits of the pipeline without (bit for bit, in fp32 and with every
 * result rounded to bf16 as the GPU stores it), and each pass within 1e-5
 * alone (bf16, f16); every MoE layer's routed sum and every silu_mul of a
 * non-fp8 linear is folded, nothing is left for a second run; the
 * verifier's errors, word for word. */
#include <stdlib.h>
#include <string.h>

#include "compiler/passes.h"
#include "ir/ir.h"
#include "passlib.h"
#include "testlib.h"

static const char *const ALL[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3",
                                  "deepseek_v3_fp8", "deepseek_v32",   "qwen2_moe",
                                  "qwen3_moe",   "qwen3_moe_fp8"};
#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

static void bad_op(const char *line, const char *needle)
{
    char text[2048];
    snprintf(text, sizeof text,
             "module test {\n"
             "  input %%tokens : i32[T]\n"
             "  input %%positions : i32[T]\n"
             "  weight %%tx : f32[5, 16] = \"tx\"\n"
             "  weight %%rw : f32[3, 8] = \"rw\"\n"
             "  weight %%nw : f32[8] = \"nw\"\n"
             "  weight %%gu : f32[3, 8, 8] = \"gu\"\n"
             "  weight %%dn : f32[3, 8, 4] = \"dn\"\n"
             "  weight %%w4 : f32[2, 4] = \"w4\"\n"
             "  weight %%w8 : f32[2, 8] = \"w8\"\n"
             "  %%x : f32[T, 16] = embedding(%%tokens, %%tx)\n"
             "  %%x8 : f32[T, 8] = slice(%%x) {axis = 1, start = 0, size = 8}\n"
             "  %%x9 : f32[T, 9] = slice(%%x) {axis = 1, start = 0, size = 9}\n"
             "  %%lg : f32[T, 3] = linear(%%x8, %%rw)\n"
             "  %%ids : i32[T, 2], %%tw : f32[T, 2] = moe_topk(%%lg) {scoring = \"softmax\", "
             "top_k = 2}\n"
             "  %s\n"
             "  output %%x\n"
             "}\n",
             line);
    ir_module *m = NULL;
    T_ERR(ir_module_parse(text, "bad.mir", &m), MOEC_ERR_FORMAT, needle);
    ir_module_free(m);
}

static void test_verifier(void)
{
    bad_op("%r : f32[T, 2, 8] = moe_routed(%x8, %ids, %tw, %gu, %dn) {unsummed = 1, "
           "expert_start = 1, n_experts = 4}",
           "%r: moe_routed: unsummed with experts 1 .. 3 of 4: the weights must hold every expert");
    bad_op("%r : f32[T, 2, 8] = moe_routed(%x8, %ids, %tw, %gu, %dn) {unsummed = 2}",
           "%r: moe_routed: unsummed 2 must be 0 or 1");
    bad_op("%r : f32[T, 8] = moe_routed(%x8, %ids, %tw, %gu, %dn) {unsummed = 1}",
           "%r: moe_routed: declared type f32[T, 8], inferred f32[T, 2, 8]");
    bad_op("%r : f32[T, 2, 8] = moe_routed(%x8, %ids, %tw, %gu, %dn) {unsummed = 1}\n"
           "  %s : f32[T, 4], %n : f32[T, 4] = add_rms_norm(%x8, %r, %nw) {eps = 1e-06}",
           "%s: add_rms_norm: declared type f32[T, 4], inferred f32[T, 8]");
    bad_op("%r : f32[T, 2, 8] = moe_routed(%x8, %ids, %tw, %gu, %dn) {unsummed = 1}\n"
           "  %s : f32[T, 9], %n : f32[T, 9] = add_rms_norm(%x9, %r, %nw) {eps = 1e-06}",
           "%s: add_rms_norm: b %r (f32[T, 2, 8]) and a %x9 (f32[T, 9]) differ in width");
    bad_op("%y : f32[T, 2] = linear(%x8, %w4) {act = \"gelu\"}",
           "%y: linear: act \"gelu\" is not \"silu_mul\"");
    bad_op("%y : f32[T, 2] = linear(%x8, %w8) {act = \"silu_mul\"}",
           "%y: linear: weight %w8 has 8 columns, input has 4 after silu_mul");
    bad_op("%y : f32[T, 2] = linear(%x9, %w4) {act = \"silu_mul\"}",
           "%y: linear: act \"silu_mul\" wants an even input width (gate, then up), got 9");
}

/* The ops of kind k in m whose attribute `key` is set. */
static int count_with(const ir_module *m, ir_op_kind k, const char *key)
{
    int n = 0;
    for (int i = 0; i < m->n_ops; i++)
        n += m->ops[i]->kind == k && ir_op_attr(m->ops[i], key) != NULL;
    return n;
}

/* The silu_mul ops of m whose one reader is a linear of an fp8 weight:
 * all of them (all: those fuse_silu_mul_linear leaves by default), or
 * those it leaves with MOEC_FUSE_SILU_FP8=1 at a bf16 compute dtype:
 * input width not in 64s, or scale blocks of fewer than 16 rows or 64
 * columns (the staged kernel's conditions). */
static int fp8_silu_muls(const ir_module *m, int all)
{
    int n = 0;
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        const ir_op *u = op->kind == IR_OP_SILU_MUL ? ir_module_single_user(m, op->out[0]) : NULL;
        if (!u || u->kind != IR_OP_LINEAR || u->in[1]->type.dtype != IR_DTYPE_F8E4M3)
            continue;
        const ir_value *w = u->in[1];
        n += all || w->type.dims[1] % 64 != 0 || w->scale.block[0] % 16 != 0 ||
             w->scale.block[1] % 64 != 0;
    }
    return n;
}

static void check_model(const char *model)
{
    pass_options o = t_pass_options(IR_DTYPE_BF16);
    ir_module *before, *m;
    if (!t_pipeline_pair(model, "fuse_add3_rms_norm", "fuse_silu_mul_linear", &o, &before, &m))
        return;
    /* every MoE layer's routed sum (no model here is expert-parallel) */
    int routed = t_count_ops(m, IR_OP_MOE_ROUTED), uns = 0;
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *r = m->ops[i];
        if (r->kind != IR_OP_MOE_ROUTED || !ir_op_attr_int(r, "unsummed", 0))
            continue;
        uns++;
        const ir_op *n = ir_module_single_user(m, r->out[0]);
        T_CHECK(n && n->kind == IR_OP_ADD_RMS_NORM && n->in[1] == r->out[0] &&
                r->out[0]->type.rank == 3 &&
                r->out[0]->type.dims[1] == r->in[1]->type.dims[1]);
        T_CHECK(ir_value_storage_dtype(m, r->out[0], IR_DTYPE_BF16) == IR_DTYPE_F32);
    }
    T_CHECK(routed > 0 && uns == routed);
    /* every silu_mul but those of fp8 linears */
    int sm_before = t_count_ops(before, IR_OP_SILU_MUL), left = t_count_ops(m, IR_OP_SILU_MUL);
    T_CHECK(left == fp8_silu_muls(before, 1));
    /* MOEC_FUSE_SILU_FP8=1: all but those of fp8 linears the staged kernel
       cannot take with act, computed exactly as the pairs */
    ir_module *on = NULL;
    T_OK(ir_module_clone(before, &on));
    if (on) {
        setenv("MOEC_FUSE_SILU_FP8", "1", 1);
        T_OK(pass_fuse_silu_mul_linear(on, &o));
        unsetenv("MOEC_FUSE_SILU_FP8");
        T_CHECK(t_count_ops(on, IR_OP_SILU_MUL) == fp8_silu_muls(before, 0));
        T_CHECK(t_modules_agree_stored(model, before, on, 0x1a5, IR_DTYPE_BF16) == 0);
        /* anything but 0 or 1: refused by name, the module left as it was */
        int n_ops = on->n_ops;
        setenv("MOEC_FUSE_SILU_FP8", "yes", 1);
        T_ERR(pass_fuse_silu_mul_linear(on, &o), MOEC_ERR_INVALID_ARG,
              "MOEC_FUSE_SILU_FP8=\"yes\": not 0 or 1");
        unsetenv("MOEC_FUSE_SILU_FP8");
        T_CHECK(on->n_ops == n_ops);
        ir_module_free(on);
    }
    T_CHECK(count_with(m, IR_OP_LINEAR, "act") == sm_before - left);
    T_CHECK(m->n_ops == before->n_ops - (sm_before - left));
    t_pass_idempotent(m, pass_fuse_moe_sum);
    t_pass_idempotent(m, pass_fuse_silu_mul_linear);
    /* exactly the same logits, in fp32 and stored as bf16 */
    double f32 = t_modules_agree_stored(model, before, m, 0x1a5, IR_DTYPE_F32);
    double bf16 = t_modules_agree_stored(model, before, m, 0x1a5, IR_DTYPE_BF16);
    T_CHECK(f32 == 0 && bf16 == 0);
    printf("%-18s %d routed sums and %d silu_muls folded (%d left, %d of fp8 linears); fused - "
           "unfused: fp32 %g, bf16 %g\n",
           model, uns, sm_before - left, left, fp8_silu_muls(before, 1), f32, bf16);
    ir_module_free(before);
    ir_module_free(m);
}

static void test_models(void)
{
    pass_options f16 = t_pass_options(IR_DTYPE_F16);
    for (int i = 0; i < N_OF(ALL); i++) {
        T_CHECK(t_pass_equivalence(ALL[i], "fuse_moe_sum", NULL) >= 0);
        T_CHECK(t_pass_equivalence(ALL[i], "fuse_moe_sum", &f16) >= 0);
        T_CHECK(t_pass_equivalence(ALL[i], "fuse_silu_mul_linear", NULL) >= 0);
        check_model(ALL[i]);
    }
}

int main(void)
{
    test_verifier();
    test_models();
    return t_finish("test_pass_launch");
}
