/* test_pass_fuse.c — the fusion passes (fuse_qkv_a, fuse_gate_up,
 * fuse_silu_and_mul, fuse_router_weight) and fold_routed_scale on the tiny
 * model of every family: each keeps the model's function through the
 * interpreter, makes the structure it promises (fewer GEMMs, CONCAT weights
 * of the right shapes, fused ops, the scale in one place), does nothing the
 * second time, and leaves alone what does not match its pattern. The fp8
 * tiny models (block-scaled weights with partial edge blocks) fuse exactly
 * where the scale grids join: their scales concatenated like the weights,
 * in finer blocks of rows where parts end inside a block (blocks of a
 * multiple of 16 rows that every part but the last spans), and fp8 pairs
 * that cannot join so (or mix blocks or dtypes) left unfused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "passlib.h"
#include "testlib.h"

static const char *const PASSES[] = {"fuse_qkv_a", "fuse_gate_up", "fuse_silu_and_mul",
                                     "fuse_router_weight", "fold_routed_scale"};
#define N_PASSES ((int)(sizeof PASSES / sizeof *PASSES))

/* What each tiny model (3 layers) should come to. */
typedef struct model_case {
    const char *name;
    int linears;          /* linear ops in the unfused module */
    int qkv_fused;        /* linears fuse_qkv_a removes */
    int pairs;            /* gate/up pairs: dense MLPs and shared experts */
    int moe_layers;
    double scaling;       /* routed_scaling_factor */
    const char *qkv;      /* layer 0's fused projection, its weight, rows */
    const char *qkv_w;
    int64_t qkv_rows;
    int qkv_parts;
    int qkv_bias;
    const char *gate_up_w; /* the first fused dense/shared gate_up weight, rows */
    int64_t gate_up_rows;
    const char *experts_w; /* the first MoE layer's expert gate_up, [E, 2I, H] */
    int64_t experts_e;
} model_case;

static const model_case CASES[] = {
    {"deepseek_v2", 24, 3, 3, 2, 1.0, "l0.attn.qkv_a", "l0.attn.qkv_a_proj", 136, 2, 0,
     "l0.mlp.gate_up_proj", 192, "l1.moe.experts.gate_up", 8},
    {"deepseek_v2_qlora", 27, 3, 3, 2, 2.0, "l0.attn.qkv_a", "l0.attn.qkv_a_proj", 64, 2, 0,
     "l0.mlp.gate_up_proj", 192, "l1.moe.experts.gate_up", 8},
    {"deepseek_v3", 27, 3, 3, 2, 2.5, "l0.attn.qkv_a", "l0.attn.qkv_a_proj", 64, 2, 0,
     "l0.mlp.gate_up_proj", 192, "l1.moe.experts.gate_up", 16},
    {"qwen2_moe", 26, 6, 3, 2, 1.0, "l0.attn.qkv", "l0.attn.qkv_proj", 128, 3, 1,
     "l0.mlp.gate_up_proj", 192, "l1.moe.experts.gate_up", 8},
    {"qwen3_moe", 18, 6, 1, 2, 1.0, "l0.attn.qkv", "l0.attn.qkv_proj", 192, 3, 0,
     "l1.mlp.gate_up_proj", 192, "l0.moe.experts.gate_up", 8},
};
#define N_CASES ((int)(sizeof CASES / sizeof *CASES))

/* Ops of kind that carry attribute key. */
static int count_with_attr(const ir_module *m, ir_op_kind kind, const char *key)
{
    int n = 0;
    for (int i = 0; i < m->n_ops; i++)
        n += m->ops[i]->kind == kind && ir_op_attr(m->ops[i], key) != NULL;
    return n;
}

static int count_concat_weights(const ir_module *m)
{
    int n = 0;
    for (int i = 0; i < m->n_values; i++)
        n += m->values[i]->kind == IR_VALUE_WEIGHT && m->values[i]->bind.kind == IR_BIND_CONCAT;
    return n;
}

static ir_module *unfused(const char *model)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", model);
    ir_module *m = NULL;
    T_OK(fe_model_load(t_src(rel), &m));
    return m;
}

/* Every pass, every model: the interpreter agrees before and after. */
static void test_equivalence(void)
{
    for (int p = 0; p < N_PASSES; p++)
        for (int c = 0; c < N_CASES; c++) {
            double err = t_pass_equivalence(CASES[c].name, PASSES[p], NULL);
            T_CHECK(err >= 0 && err <= 1e-5);
        }
    pass_options f16 = t_pass_options(IR_DTYPE_F16), f32 = t_pass_options(IR_DTYPE_F32);
    for (int c = 0; c < N_CASES; c++) {
        double err = t_pass_equivalence(CASES[c].name, "fold_routed_scale", &f16);
        T_CHECK(err >= 0 && err <= 1e-5);
        err = t_pass_equivalence(CASES[c].name, "fold_routed_scale", &f32);
        T_CHECK(err >= 0 && err <= 1e-5);
    }
}

/* fuse_qkv_a: one GEMM for the attention's input projections. */
static void check_qkv(const model_case *c)
{
    ir_module *m = t_pipeline_module(c->name, "fuse_qkv_a", NULL);
    if (!m)
        return;
    T_CHECK(t_count_ops(m, IR_OP_LINEAR) == c->linears - c->qkv_fused);
    T_CHECK(count_concat_weights(m) == 3 * (1 + c->qkv_bias));
    const ir_value *w = ir_module_find_value(m, c->qkv_w);
    const ir_value *y = ir_module_find_value(m, c->qkv);
    T_CHECK(w && w->kind == IR_VALUE_WEIGHT && w->bind.kind == IR_BIND_CONCAT);
    T_CHECK(y && y->kind == IR_VALUE_OP && y->def->kind == IR_OP_LINEAR);
    if (w && y && y->kind == IR_VALUE_OP) {
        T_CHECK(w->bind.axis == 0 && w->bind.n_parts == c->qkv_parts);
        T_CHECK(w->type.dtype == IR_DTYPE_BF16 && w->type.rank == 2 &&
                w->type.dims[0] == c->qkv_rows && w->type.dims[1] == 64);
        T_CHECK(w->bind.parts[0].kind == IR_BIND_TENSOR &&
                strstr(w->bind.parts[0].name, "model.layers.0.self_attn.q") == w->bind.parts[0].name);
        T_CHECK(y->def->in[1] == w && y->type.dims[1] == c->qkv_rows);
        T_CHECK((y->def->n_in == 3) == c->qkv_bias);
        if (y->def->n_in == 3) {
            const ir_value *b = y->def->in[2];
            T_CHECK(b->bind.kind == IR_BIND_CONCAT && b->bind.n_parts == 3 &&
                    b->type.rank == 1 && b->type.dims[0] == c->qkv_rows &&
                    !strcmp(b->bind.parts[2].name, "model.layers.0.self_attn.v_proj.bias"));
        }
    }
    /* Each old projection is now a slice of the fused output, in order, and
     * the router and MLP GEMMs are untouched. */
    int64_t next = 0;
    int slices = 0;
    for (int i = 0; i < m->n_ops && y && y->kind == IR_VALUE_OP; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind != IR_OP_SLICE || op->in[0] != y)
            continue;
        T_CHECK(ir_op_attr_int(op, "axis", -1) == 1 && ir_op_attr_int(op, "start", -1) == next);
        T_CHECK(op->id > y->def->id);
        next += ir_op_attr_int(op, "size", 0);
        slices++;
    }
    T_CHECK(slices == c->qkv_parts && next == c->qkv_rows);
    T_CHECK(t_count_ops(m, IR_OP_SILU) == c->pairs && t_count_ops(m, IR_OP_MOE_TOPK) == c->moe_layers);
    ir_module_free(m);
}

/* fuse_gate_up: dense/shared gate and up in one GEMM, experts' in one weight. */
static void check_gate_up(const model_case *c)
{
    ir_module *m = t_pipeline_module(c->name, "fuse_gate_up", NULL);
    if (!m)
        return;
    T_CHECK(t_count_ops(m, IR_OP_LINEAR) == c->linears - c->qkv_fused - c->pairs);
    T_CHECK(count_concat_weights(m) == 3 * (1 + c->qkv_bias) + c->pairs + c->moe_layers);
    const ir_value *w = ir_module_find_value(m, c->gate_up_w);
    T_CHECK(w && w->bind.kind == IR_BIND_CONCAT && w->bind.axis == 0 && w->bind.n_parts == 2 &&
            w->type.dims[0] == c->gate_up_rows && w->type.dims[1] == 64);
    if (w && w->bind.n_parts == 2)
        T_CHECK(strstr(w->bind.parts[0].name, "gate_proj") && strstr(w->bind.parts[1].name, "up_proj"));
    const ir_value *e = ir_module_find_value(m, c->experts_w);
    T_CHECK(e && e->bind.kind == IR_BIND_CONCAT && e->bind.axis == 1 && e->bind.n_parts == 2);
    if (e && e->bind.n_parts == 2) {
        T_CHECK(e->type.rank == 3 && e->type.dims[0] == c->experts_e && e->type.dims[1] == 64 &&
                e->type.dims[2] == 64);
        T_CHECK(e->bind.parts[0].kind == IR_BIND_STACK && e->bind.parts[0].count == c->experts_e &&
                strstr(e->bind.parts[0].name, "gate_proj"));
        T_CHECK(e->bind.parts[1].kind == IR_BIND_STACK && strstr(e->bind.parts[1].name, "up_proj"));
    }
    for (int i = 0; i < m->n_ops; i++)
        if (m->ops[i]->kind == IR_OP_MOE_EXPERTS)
            T_CHECK(m->ops[i]->n_in == 4 && m->ops[i]->in[2]->bind.kind == IR_BIND_CONCAT);
    /* silu and mul now read the two halves of one gate_up output. */
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind != IR_OP_SILU)
            continue;
        const ir_op *s = op->in[0]->def;
        T_CHECK(s && s->kind == IR_OP_SLICE && ir_op_attr_int(s, "start", -1) == 0 &&
                s->in[0]->def->kind == IR_OP_LINEAR &&
                s->in[0]->def->in[1]->bind.kind == IR_BIND_CONCAT);
    }
    T_CHECK(ir_module_find_value(m, "l0.attn.q_a_proj") == NULL);
    ir_module_free(m);
}

/* fuse_silu_and_mul and fuse_router_weight: the fused ops replace the
 * elementwise chains, keeping the names of the values they replace. */
static void check_fused_ops(const model_case *c)
{
    int reshapes = -1;
    ir_module *m = t_pipeline_module(c->name, "fuse_silu_and_mul", NULL);
    if (m) {
        reshapes = t_count_ops(m, IR_OP_RESHAPE);
        T_CHECK(t_count_ops(m, IR_OP_SILU) == 0 && t_count_ops(m, IR_OP_SILU_MUL) == c->pairs);
        T_CHECK(t_count_ops(m, IR_OP_MUL) == c->moe_layers + !strcmp(c->name, "qwen2_moe") * 2);
        const char *act = !strcmp(c->name, "qwen3_moe") ? "l1.mlp.act" : "l0.mlp.act";
        const ir_value *v = ir_module_find_value(m, act);
        T_CHECK(v && v->kind == IR_VALUE_OP && v->def->kind == IR_OP_SILU_MUL &&
                v->def->in[0]->type.dims[1] == 192 && v->type.dims[1] == 96);
        ir_module_free(m);
    }
    m = t_pipeline_module(c->name, "fuse_router_weight", NULL);
    if (m) {
        T_CHECK(t_count_ops(m, IR_OP_REDUCE_SUM) == 0 && t_count_ops(m, IR_OP_MOE_EXPERTS) == 0);
        T_CHECK(t_count_ops(m, IR_OP_MOE_ROUTED) == c->moe_layers);
        T_CHECK(t_count_ops(m, IR_OP_RESHAPE) == reshapes - c->moe_layers);
        const char *routed = !strcmp(c->name, "qwen3_moe") ? "l0.moe.routed" : "l1.moe.routed";
        const ir_value *v = ir_module_find_value(m, routed);
        T_CHECK(v && v->kind == IR_VALUE_OP && v->def->kind == IR_OP_MOE_ROUTED);
        if (v && v->kind == IR_VALUE_OP) {
            const ir_op *op = v->def;
            T_CHECK(op->n_in == 5 && op->in[2]->def->kind == IR_OP_MOE_TOPK &&
                    op->in[2] == op->in[2]->def->out[1] && op->in[1] == op->in[2]->def->out[0]);
            T_CHECK(ir_op_attr_float(op, "scale", -1) == 1.0);
            T_CHECK(v->type.rank == 2 && v->type.dims[1] == 64);
        }
        ir_module_free(m);
    }
}

/* fold_routed_scale: the factor in exactly one place. */
static void check_fold(const model_case *c)
{
    pass_options bf16 = t_pass_options(IR_DTYPE_BF16), f16 = t_pass_options(IR_DTYPE_F16);
    ir_module *m = t_pipeline_module(c->name, "fold_routed_scale", &bf16);
    if (m) {
        for (int i = 0; i < m->n_ops; i++) {
            const ir_op *op = m->ops[i];
            if (op->kind == IR_OP_MOE_TOPK)
                T_CHECK(ir_op_attr_float(op, "scaling", 1.0) == 1.0);
            if (op->kind == IR_OP_MOE_ROUTED)
                T_CHECK(ir_op_attr_float(op, "scale", 1.0) == c->scaling);
        }
        T_CHECK(count_with_attr(m, IR_OP_LINEAR, "alpha") == 0);
        T_CHECK(count_with_attr(m, IR_OP_ADD, "alpha") == 0);
        ir_module_free(m);
    }
    m = t_pipeline_module(c->name, "fold_routed_scale", &f16);
    if (!m)
        return;
    int shared_form = c->scaling != 1.0 && strncmp(c->name, "deepseek", 8) == 0;
    int alphas = 0;
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind == IR_OP_MOE_TOPK)
            T_CHECK(ir_op_attr_float(op, "scaling", 1.0) == 1.0);
        if (op->kind == IR_OP_MOE_ROUTED)
            T_CHECK(ir_op_attr_float(op, "scale", 1.0) == (shared_form ? 1.0 : c->scaling));
        if (op->kind == IR_OP_LINEAR && ir_op_attr(op, "alpha")) {
            /* the shared expert's down_proj, feeding the add with the routed sum */
            T_CHECK(fabs(ir_op_attr_float(op, "alpha", 0) - 1.0 / c->scaling) < 1e-15);
            T_CHECK(strstr(op->in[1]->bind.name, "shared_experts.down_proj") != NULL);
        }
        if (op->kind == IR_OP_ADD && ir_op_attr(op, "alpha")) {
            alphas++;
            T_CHECK(ir_op_attr_float(op, "alpha", 0) == c->scaling);
            const ir_op *moe_out = op->in[1]->def;
            T_CHECK(moe_out && moe_out->kind == IR_OP_ADD &&
                    moe_out->in[0]->def->kind == IR_OP_MOE_ROUTED);
            T_CHECK(op->in[0]->def->kind == IR_OP_ADD); /* the attention residual */
        }
    }
    T_CHECK(alphas == (shared_form ? c->moe_layers : 0));
    T_CHECK(count_with_attr(m, IR_OP_LINEAR, "alpha") == (shared_form ? c->moe_layers : 0));
    ir_module_free(m);
}

/* A second run of a pass changes nothing. */
static void check_idempotent(const char *model, const char *pass, ir_dtype dt)
{
    pass_options o = t_pass_options(dt);
    ir_module *m = t_pipeline_module(model, pass, &o);
    if (!m)
        return;
    char *before = ir_module_print_str(m);
    T_OK(pass_find(pass)->run(m, &o));
    T_OK(ir_module_verify(m));
    char *after = ir_module_print_str(m);
    T_CHECK(before && after && !strcmp(before, after));
    if (before && after && strcmp(before, after))
        fprintf(stderr, "%s changed %s on its second run\n", pass, model);
    free(before);
    free(after);
    ir_module_free(m);
}

/* The whole fusion prefix against the frontend's module. */
static void check_prefix_agrees(const char *model, ir_dtype dt)
{
    pass_options o = t_pass_options(dt);
    ir_module *a = unfused(model), *b = t_pipeline_module(model, "fold_routed_scale", &o);
    if (a && b) {
        double err = t_modules_agree(model, a, b, 0xf05e + (uint64_t)dt);
        printf("prefix %-5s %-18s max row error %.3g\n", ir_dtype_name(dt), model, err);
        T_CHECK(err >= 0 && err <= 1e-5);
    }
    ir_module_free(a);
    ir_module_free(b);
}

/* Runs pass on IR text; returns the printed result (caller frees). */
static char *run_on_text(const char *text, const char *pass, ir_dtype dt)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "<test>", &m));
    if (!m)
        return NULL;
    pass_options o = t_pass_options(dt);
    T_OK(ir_module_set_meta_str(m, "compute_dtype", ir_dtype_name(dt)));
    T_OK(pass_find(pass)->run(m, &o));
    T_OK(ir_module_verify(m));
    char *s = ir_module_print_str(m);
    ir_module_free(m);
    return s;
}

/* Passes a pattern does not fit leave the module as it was. */
static void check_unchanged(const char *what, const char *text, const char *pass, ir_dtype dt)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "<test>", &m));
    if (!m)
        return;
    T_OK(ir_module_set_meta_str(m, "compute_dtype", ir_dtype_name(dt)));
    char *want = ir_module_print_str(m);
    ir_module_free(m);
    char *got = run_on_text(text, pass, dt);
    T_CHECK(want && got && !strcmp(want, got));
    if (want && got && strcmp(want, got))
        fprintf(stderr, "%s: %s changed the module:\n%s\n", what, pass, got);
    free(want);
    free(got);
}

static void test_near_misses(void)
{
    /* Projections of one input with a bias on one only, or mixed dtypes. */
    check_unchanged("mixed bias",
                    "module t {\n"
                    "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
                    "  weight %e : f32[16, 8] = \"e\"\n"
                    "  weight %wq : f32[8, 8] = \"wq\"\n  weight %bq : f32[8] = \"bq\"\n"
                    "  weight %wk : f32[4, 8] = \"wk\"\n"
                    "  %x : f32[T, 8] = embedding(%tokens, %e)\n"
                    "  %q : f32[T, 8] = linear(%x, %wq, %bq)\n"
                    "  %k : f32[T, 4] = linear(%x, %wk)\n"
                    "  %y : f32[T, 12] = concat(%q, %k) {axis = 1}\n"
                    "  output %y\n}\n",
                    "fuse_qkv_a", IR_DTYPE_BF16);
    check_unchanged("mixed dtypes",
                    "module t {\n"
                    "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
                    "  weight %e : f32[16, 8] = \"e\"\n"
                    "  weight %wq : bf16[8, 8] = \"wq\"\n  weight %wk : f16[4, 8] = \"wk\"\n"
                    "  %x : f32[T, 8] = embedding(%tokens, %e)\n"
                    "  %q : f32[T, 8] = linear(%x, %wq)\n"
                    "  %k : f32[T, 4] = linear(%x, %wk)\n"
                    "  %y : f32[T, 12] = concat(%q, %k) {axis = 1}\n"
                    "  output %y\n}\n",
                    "fuse_qkv_a", IR_DTYPE_BF16);
    /* A gate/up pair (feeds silu and mul) is not qkv_a's, even with a third
     * projection beside it. */
    static const char mlp[] =
        "module t {\n"
        "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
        "  weight %e : f32[16, 8] = \"e\"\n"
        "  weight %wg : f32[6, 8] = \"wg\"\n  weight %wu : f32[6, 8] = \"wu\"\n"
        "  weight %wz : f32[2, 8] = \"wz\"\n"
        "  %x : f32[T, 8] = embedding(%tokens, %e)\n"
        "  %g : f32[T, 6] = linear(%x, %wg)\n"
        "  %u : f32[T, 6] = linear(%x, %wu)\n"
        "  %z : f32[T, 2] = linear(%x, %wz)\n"
        "  %a : f32[T, 6] = silu(%g)\n"
        "  %h : f32[T, 6] = mul(%u, %a)\n"
        "  %y : f32[T, 8] = concat(%h, %z) {axis = 1}\n"
        "  output %y\n}\n";
    check_unchanged("gate/up group", mlp, "fuse_qkv_a", IR_DTYPE_BF16);
    /* ...but fuse_gate_up takes it, with mul's operands swapped. */
    char *s = run_on_text(mlp, "fuse_gate_up", IR_DTYPE_BF16);
    T_CHECK(s && strstr(s, "weight %gate_up_proj : f32[12, 8] = concat(0, \"wg\", \"wu\")"));
    T_CHECK(s && strstr(s, "%gate_up : f32[T, 12] = linear(%x, %gate_up_proj)"));
    T_CHECK(s && strstr(s, "%u : f32[T, 6] = slice(%gate_up) {axis = 1, start = 6, size = 6}"));
    free(s);
    /* fp8 gate/up pairs whose rows end inside a block: 48 rows join in
     * blocks of 16 (the scales repeated, read from the 128-row blocks);
     * 40 rows would need blocks of 8, finer than a kernel's 16-row tile,
     * so they stay apart. */
    static const char fp8_mlp[] =
        "module t {\n"
        "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
        "  weight %e : f32[16, 128] = \"e\"\n"
        "  weight %wg : f8e4m3[48, 128] = \"wg\", block_scale[128, 128] = \"sg\"\n"
        "  weight %wu : f8e4m3[48, 128] = \"wu\", block_scale[128, 128] = \"su\"\n"
        "  %x : f32[T, 128] = embedding(%tokens, %e)\n"
        "  %g : f32[T, 48] = linear(%x, %wg)\n"
        "  %u : f32[T, 48] = linear(%x, %wu)\n"
        "  %a : f32[T, 48] = silu(%g)\n"
        "  %h : f32[T, 48] = mul(%a, %u)\n"
        "  output %h\n}\n";
    s = run_on_text(fp8_mlp, "fuse_gate_up", IR_DTYPE_BF16);
    T_CHECK(s && strstr(s, "weight %gate_up_proj : f8e4m3[96, 128] = concat(0, \"wg\", \"wu\"), "
                           "block_scale[16, 128] from [128, 128] = concat(0, \"sg\", \"su\")"));
    free(s);
    char fp8_40[sizeof fp8_mlp];
    memcpy(fp8_40, fp8_mlp, sizeof fp8_mlp);
    for (char *p = strstr(fp8_40, "48"); p; p = strstr(p + 2, "48"))
        memcpy(p, "40", 2);
    check_unchanged("fp8 rows in blocks of 8", fp8_40, "fuse_gate_up", IR_DTYPE_BF16);
    /* MOEC_FUSE_REFINE=0 keeps the 48-row pair apart too; a bad value is refused */
    setenv("MOEC_FUSE_REFINE", "0", 1);
    check_unchanged("MOEC_FUSE_REFINE=0", fp8_mlp, "fuse_gate_up", IR_DTYPE_BF16);
    setenv("MOEC_FUSE_REFINE", "yes", 1);
    ir_module *bad = NULL;
    T_OK(ir_module_parse(fp8_mlp, "<test>", &bad));
    if (bad) {
        pass_options o = t_pass_options(IR_DTYPE_BF16);
        T_ERR(pass_find("fuse_gate_up")->run(bad, &o), MOEC_ERR_INVALID_ARG,
              "MOEC_FUSE_REFINE=\"yes\": not 0 or 1");
    }
    ir_module_free(bad);
    unsetenv("MOEC_FUSE_REFINE");
    /* silu's result used twice: silu_mul would lose it. */
    check_unchanged("silu used twice",
                    "module t {\n"
                    "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
                    "  weight %e : f32[16, 8] = \"e\"\n"
                    "  %x : f32[T, 8] = embedding(%tokens, %e)\n"
                    "  %g : f32[T, 4] = slice(%x) {axis = 1, start = 0, size = 4}\n"
                    "  %u : f32[T, 4] = slice(%x) {axis = 1, start = 4, size = 4}\n"
                    "  %a : f32[T, 4] = silu(%g)\n"
                    "  %h : f32[T, 4] = mul(%a, %u)\n"
                    "  %y : f32[T, 8] = concat(%h, %a) {axis = 1}\n"
                    "  output %y\n}\n",
                    "fuse_silu_and_mul", IR_DTYPE_BF16);
    /* Halves that are not halves. */
    check_unchanged("uneven halves",
                    "module t {\n"
                    "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
                    "  weight %e : f32[16, 8] = \"e\"\n"
                    "  %x : f32[T, 8] = embedding(%tokens, %e)\n"
                    "  %g : f32[T, 3] = slice(%x) {axis = 1, start = 0, size = 3}\n"
                    "  %u : f32[T, 3] = slice(%x) {axis = 1, start = 3, size = 3}\n"
                    "  %a : f32[T, 3] = silu(%g)\n"
                    "  %h : f32[T, 3] = mul(%a, %u)\n"
                    "  output %h\n}\n",
                    "fuse_silu_and_mul", IR_DTYPE_BF16);
    /* The expert outputs are used elsewhere: no moe_routed; and without it
     * fold_routed_scale keeps the router's scaling. */
    static const char moe[] =
        "module t {\n"
        "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
        "  weight %e : f32[16, 8] = \"e\"\n  weight %r : f32[4, 8] = \"r\"\n"
        "  weight %g : f32[4, 6, 8] = stack(\"g{e}\", 4)\n"
        "  weight %u : f32[4, 6, 8] = stack(\"u{e}\", 4)\n"
        "  weight %d : f32[4, 8, 6] = stack(\"d{e}\", 4)\n"
        "  %x : f32[T, 8] = embedding(%tokens, %e)\n"
        "  %l : f32[T, 4] = linear(%x, %r)\n"
        "  %ids : i32[T, 2], %w : f32[T, 2] = moe_topk(%l) {scoring = \"softmax\", top_k = 2, scaling = 2.5}\n"
        "  %ex : f32[T, 2, 8] = moe_experts(%x, %ids, %g, %u, %d)\n"
        "  %w3 : f32[T, 2, 1] = reshape(%w)\n"
        "  %p : f32[T, 2, 8] = mul(%ex, %w3)\n"
        "  %s : f32[T, 8] = reduce_sum(%p) {axis = 1}\n"
        "  %y : f32[T, 8] = reduce_sum(%ex) {axis = 1}\n"
        "  %o : f32[T, 8] = add(%s, %y)\n"
        "  output %o\n}\n";
    check_unchanged("experts used twice", moe, "fuse_router_weight", IR_DTYPE_BF16);
    check_unchanged("no moe_routed", moe, "fold_routed_scale", IR_DTYPE_BF16);
    check_unchanged("no moe_routed f16", moe, "fold_routed_scale", IR_DTYPE_F16);
    /* Without a shared expert, f16 folds into moe_routed too. */
    static const char routed[] =
        "module t {\n"
        "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
        "  weight %e : f32[16, 8] = \"e\"\n  weight %r : f32[4, 8] = \"r\"\n"
        "  weight %gu : f32[4, 12, 8] = stack(\"gu{e}\", 4)\n"
        "  weight %d : f32[4, 8, 6] = stack(\"d{e}\", 4)\n"
        "  %x : f32[T, 8] = embedding(%tokens, %e)\n"
        "  %l : f32[T, 4] = linear(%x, %r)\n"
        "  %ids : i32[T, 2], %w : f32[T, 2] = moe_topk(%l) {scoring = \"softmax\", top_k = 2, scaling = 2.5}\n"
        "  %s : f32[T, 8] = moe_routed(%x, %ids, %w, %gu, %d) {scale = 1.0}\n"
        "  %o : f32[T, 8] = add(%s, %x)\n"
        "  output %o\n}\n";
    s = run_on_text(routed, "fold_routed_scale", IR_DTYPE_F16);
    T_CHECK(s && strstr(s, "top_k = 2, scaling = 1.0}") && strstr(s, "{scale = 2.5}") &&
            !strstr(s, "alpha"));
    free(s);
    /* A shared expert with the adds' operands the other way round: the
     * residual add is reordered so alpha falls on the MoE output; and the
     * six-operand moe_routed gets a gate_up weight from fuse_gate_up. */
    static const char shared[] =
        "module t {\n"
        "  input %tokens : i32[T]\n  input %positions : i32[T]\n"
        "  weight %e : f32[16, 8] = \"e\"\n  weight %r : f32[4, 8] = \"r\"\n"
        "  weight %g : f32[4, 6, 8] = stack(\"g{e}\", 4)\n"
        "  weight %u : f32[4, 6, 8] = stack(\"u{e}\", 4)\n"
        "  weight %d : f32[4, 8, 6] = stack(\"d{e}\", 4)\n"
        "  weight %sd : f32[8, 8] = \"sd\"\n"
        "  %x : f32[T, 8] = embedding(%tokens, %e)\n"
        "  %l : f32[T, 4] = linear(%x, %r)\n"
        "  %ids : i32[T, 2], %w : f32[T, 2] = moe_topk(%l) {scoring = \"softmax\", top_k = 2, scaling = 2.5}\n"
        "  %s : f32[T, 8] = moe_routed(%x, %ids, %w, %g, %u, %d) {scale = 1.0}\n"
        "  %sh : f32[T, 8] = linear(%x, %sd)\n"
        "  %mo : f32[T, 8] = add(%sh, %s)\n"
        "  %o : f32[T, 8] = add(%mo, %x)\n"
        "  output %o\n}\n";
    s = run_on_text(shared, "fold_routed_scale", IR_DTYPE_F16);
    T_CHECK(s && strstr(s, "%o : f32[T, 8] = add(%x, %mo) {alpha = 2.5}"));
    T_CHECK(s && strstr(s, "%sh : f32[T, 8] = linear(%x, %sd) {alpha = 0.4}"));
    T_CHECK(s && strstr(s, "%mo : f32[T, 8] = add(%sh, %s)\n"));
    T_CHECK(s && strstr(s, "%d) {scale = 1.0}") && strstr(s, "top_k = 2, scaling = 1.0}"));
    free(s);
    s = run_on_text(shared, "fold_routed_scale", IR_DTYPE_BF16);
    T_CHECK(s && strstr(s, "%d) {scale = 2.5}") && !strstr(s, "alpha"));
    free(s);
    s = run_on_text(shared, "fuse_gate_up", IR_DTYPE_BF16);
    T_CHECK(s && strstr(s, "weight %gate_up : f32[4, 12, 8] = concat(1, stack(\"g{e}\", 4), "
                           "stack(\"u{e}\", 4))"));
    T_CHECK(s && strstr(s, "= moe_routed(%x, %ids, %w, %gate_up, %d) {scale = 1.0}"));
    T_CHECK(s && !strstr(s, "weight %g :"));
    free(s);
}

/* ---- fp8 (block-scaled) weights -------------------------------------------- */

static const ir_value *weight_of(const ir_module *m, const char *name)
{
    const ir_value *v = ir_module_find_value(m, name);
    return v && v->kind == IR_VALUE_WEIGHT ? v : NULL;
}

/* w is an f8e4m3 concat of n parts on axis whose scales join the same way,
 * in blocks of rows x 128 made from the checkpoint's 128 x 128, the first
 * scale part named first_scale. */
static int fp8_concat(const ir_value *w, int axis, int n, const char *first_scale, int64_t rows)
{
    return w && w->type.dtype == IR_DTYPE_F8E4M3 && w->bind.kind == IR_BIND_CONCAT &&
           w->bind.axis == axis && w->bind.n_parts == n && w->scale.block[0] == rows &&
           w->scale.block[1] == 128 && ir_block_scale_stored(&w->scale, 0) == 128 &&
           ir_block_scale_stored(&w->scale, 1) == 128 && w->scale.bind.kind == IR_BIND_CONCAT &&
           w->scale.bind.axis == axis && w->scale.bind.n_parts == n &&
           !strcmp(w->scale.bind.parts[0].name, first_scale);
}

static void test_fp8_models(void)
{
    static const char *const models[] = {"deepseek_v3_fp8", "qwen3_moe_fp8"};
    for (int k = 0; k < 2; k++) {
        for (int p = 0; p < N_PASSES; p++) {
            double err = t_pass_equivalence(models[k], PASSES[p], NULL);
            T_CHECK(err >= 0 && err <= 1e-5);
        }
        double err = t_pass_equivalence(models[k], "absorb_mla", NULL);
        T_CHECK(err >= 0 && err <= 1e-5);
        check_prefix_agrees(models[k], IR_DTYPE_BF16);
        check_idempotent(models[k], "fuse_gate_up", IR_DTYPE_BF16);
    }
    /* DeepSeek: q_a (256 rows, two blocks) then kv_a (192: its last block
     * partial) fuse; the dense MLP's 192-row gate/up in blocks of 64 rows;
     * the shared expert's and the experts' 128-row gate/up in 128. */
    ir_module *m = t_pipeline_module("deepseek_v3_fp8", "fuse_gate_up", NULL);
    if (m) {
        const ir_value *qkv = weight_of(m, "l0.attn.qkv_a_proj");
        T_CHECK(fp8_concat(qkv, 0, 2, "model.layers.0.self_attn.q_a_proj.weight_scale_inv", 128));
        T_CHECK(qkv && qkv->scale.stored[0] == 0 && qkv->scale.stored[1] == 0);
        T_CHECK(qkv && qkv->type.dims[0] == 448 && qkv->type.dims[1] == 320 &&
                !strcmp(qkv->scale.bind.parts[1].name,
                        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"));
        const ir_value *gu = weight_of(m, "l0.mlp.gate_up_proj");
        T_CHECK(!weight_of(m, "l0.mlp.gate_proj"));
        T_CHECK(fp8_concat(gu, 0, 2, "model.layers.0.mlp.gate_proj.weight_scale_inv", 64));
        T_CHECK(gu && gu->type.dims[0] == 384 && ir_block_scale_type(gu).dims[0] == 6);
        const ir_value *sh = weight_of(m, "l1.moe.shared.gate_up_proj");
        T_CHECK(fp8_concat(sh, 0, 2, "model.layers.1.mlp.shared_experts.gate_proj.weight_scale_inv",
                           128));
        const ir_value *ex = weight_of(m, "l1.moe.experts.gate_up");
        T_CHECK(fp8_concat(ex, 1, 2, "model.layers.1.mlp.experts.{e}.gate_proj.weight_scale_inv",
                           128));
        T_CHECK(ex && ex->type.dims[0] == 4 && ex->type.dims[1] == 256 &&
                ex->scale.bind.parts[1].kind == IR_BIND_STACK && ex->scale.bind.parts[1].count == 4);
        T_CHECK(count_concat_weights(m) == 2 + 3);
    }
    ir_module_free(m);
    /* Qwen3: q_proj (192 rows) and k (96) end inside a block: q, k and v
     * fuse in blocks of 32 rows; the dense gate/up (192) in 64, and the
     * experts' (64 each) in 64. */
    m = t_pipeline_module("qwen3_moe_fp8", "fuse_gate_up", NULL);
    T_CHECK(m && count_concat_weights(m) == 4);
    if (m) {
        T_CHECK(fp8_concat(weight_of(m, "l0.attn.qkv_proj"), 0, 3,
                           "model.layers.0.self_attn.q_proj.weight_scale_inv", 32));
        T_CHECK(fp8_concat(weight_of(m, "l0.mlp.gate_up_proj"), 0, 2,
                           "model.layers.0.mlp.gate_proj.weight_scale_inv", 64));
        T_CHECK(fp8_concat(weight_of(m, "l1.moe.experts.gate_up"), 1, 2,
                           "model.layers.1.mlp.experts.{e}.gate_proj.weight_scale_inv", 64));
    }
    ir_module_free(m);
    /* absorb_mla: kv_b_proj is dequantized at load into the compute dtype. */
    pass_options f32 = t_pass_options(IR_DTYPE_F32);
    for (int f = 0; f < 2; f++) {
        pass_options bf16 = t_pass_options(IR_DTYPE_BF16);
        m = t_pipeline_module("deepseek_v3_fp8", "absorb_mla", f ? &f32 : &bf16);
        const ir_value *kvb = m ? weight_of(m, "l1.attn.kv_b_proj") : NULL;
        T_CHECK(kvb && kvb->type.dtype == (f ? IR_DTYPE_F32 : IR_DTYPE_BF16) &&
                kvb->scale.block[0] == 128 && kvb->bind.kind == IR_BIND_TENSOR);
        T_CHECK(m && weight_of(m, "l1.attn.o_proj")->type.dtype == IR_DTYPE_F8E4M3);
        ir_module_free(m);
    }
}

#define FP8_TEXT_HEAD                                                                              \
    "module t {\n  input %tokens : i32[T]\n  input %positions : i32[T]\n"                          \
    "  weight %e : f32[16, 8] = \"e\"\n"

/* Two projections of x with weights wq, wk declared as given. */
static void qk_text(char *buf, size_t cap, const char *wq, const char *wk, int nq, int nk)
{
    snprintf(buf, cap,
             "%s%s\n%s\n"
             "  %%x : f32[T, 8] = embedding(%%tokens, %%e)\n"
             "  %%q : f32[T, %d] = linear(%%x, %%wq)\n"
             "  %%k : f32[T, %d] = linear(%%x, %%wk)\n"
             "  %%y : f32[T, %d] = concat(%%q, %%k) {axis = 1}\n"
             "  output %%y\n}\n",
             FP8_TEXT_HEAD, wq, wk, nq, nk, nq + nk);
}

static void test_fp8_near_misses(void)
{
    char text[2048];
    /* Whole blocks then a partial one: fused, scales joined. */
    qk_text(text, sizeof text,
            "  weight %wq : f8e4m3[4, 8] = \"wq\", block_scale[2, 4] = \"sq\"",
            "  weight %wk : f8e4m3[3, 8] = \"wk\", block_scale[2, 4] = \"sk\"", 4, 3);
    char *s = run_on_text(text, "fuse_qkv_a", IR_DTYPE_BF16);
    T_CHECK(s && strstr(s, "weight %qkv_proj : f8e4m3[7, 8] = concat(0, \"wq\", \"wk\"), "
                           "block_scale[2, 4] = concat(0, \"sq\", \"sk\")\n"));
    T_CHECK(s && strstr(s, "%k : f32[T, 3] = slice(%qkv) {axis = 1, start = 4, size = 3}"));
    free(s);
    /* Three, the second ending inside a block (V3.2's fp8 q_a, kv_a, then
       the indexer's wk): the first two fuse, the third stays its own. */
    snprintf(text, sizeof text,
             "%s"
             "  weight %%wq : f8e4m3[4, 8] = \"wq\", block_scale[2, 4] = \"sq\"\n"
             "  weight %%wk : f8e4m3[3, 8] = \"wk\", block_scale[2, 4] = \"sk\"\n"
             "  weight %%wv : f8e4m3[4, 8] = \"wv\", block_scale[2, 4] = \"sv\"\n"
             "  %%x : f32[T, 8] = embedding(%%tokens, %%e)\n"
             "  %%q : f32[T, 4] = linear(%%x, %%wq)\n"
             "  %%k : f32[T, 3] = linear(%%x, %%wk)\n"
             "  %%v : f32[T, 4] = linear(%%x, %%wv)\n"
             "  %%y : f32[T, 11] = concat(%%q, %%k, %%v) {axis = 1}\n"
             "  output %%y\n}\n",
             FP8_TEXT_HEAD);
    s = run_on_text(text, "fuse_qkv_a", IR_DTYPE_BF16);
    T_CHECK(s && strstr(s, "weight %qkv_proj : f8e4m3[7, 8] = concat(0, \"wq\", \"wk\"), "
                           "block_scale[2, 4] = concat(0, \"sq\", \"sk\")\n") &&
            strstr(s, "%v : f32[T, 4] = linear(%x, %wv)\n"));
    free(s);
    /* The first part ends inside a block: left. */
    qk_text(text, sizeof text,
            "  weight %wq : f8e4m3[3, 8] = \"wq\", block_scale[2, 4] = \"sq\"",
            "  weight %wk : f8e4m3[4, 8] = \"wk\", block_scale[2, 4] = \"sk\"", 3, 4);
    check_unchanged("fp8 part off the blocks", text, "fuse_qkv_a", IR_DTYPE_BF16);
    /* Blocks that differ, and fp8 beside bf16: left. */
    qk_text(text, sizeof text,
            "  weight %wq : f8e4m3[4, 8] = \"wq\", block_scale[2, 4] = \"sq\"",
            "  weight %wk : f8e4m3[4, 8] = \"wk\", block_scale[4, 4] = \"sk\"", 4, 4);
    check_unchanged("fp8 blocks differ", text, "fuse_qkv_a", IR_DTYPE_BF16);
    qk_text(text, sizeof text,
            "  weight %wq : f8e4m3[4, 8] = \"wq\", block_scale[2, 4] = \"sq\"",
            "  weight %wk : bf16[4, 8] = \"wk\"", 4, 4);
    check_unchanged("fp8 and bf16", text, "fuse_qkv_a", IR_DTYPE_BF16);
    /* A float weight dequantized at load is not fp8: it fuses with its like only. */
    qk_text(text, sizeof text,
            "  weight %wq : bf16[4, 8] = \"wq\", block_scale[2, 4] = \"sq\"",
            "  weight %wk : bf16[4, 8] = \"wk\"", 4, 4);
    check_unchanged("dequantized and plain", text, "fuse_qkv_a", IR_DTYPE_BF16);

    /* Experts: gate and up of I = 4 rows fuse along axis 1 (blocks of 2
     * rows), I = 3 do not. */
    static const char experts[] =
        "module t {\n  input %%tokens : i32[T]\n  input %%positions : i32[T]\n"
        "  weight %%e : f32[16, 8] = \"e\"\n  weight %%r : f32[4, 8] = \"r\"\n"
        "  weight %%g : f8e4m3[4, %d, 8] = stack(\"g{e}\", 4), block_scale[2, 8] = "
        "stack(\"sg{e}\", 4)\n"
        "  weight %%u : f8e4m3[4, %d, 8] = stack(\"u{e}\", 4), block_scale[2, 8] = "
        "stack(\"su{e}\", 4)\n"
        "  weight %%d : f8e4m3[4, 8, %d] = stack(\"d{e}\", 4), block_scale[2, 8] = "
        "stack(\"sd{e}\", 4)\n"
        "  %%x : f32[T, 8] = embedding(%%tokens, %%e)\n"
        "  %%l : f32[T, 4] = linear(%%x, %%r)\n"
        "  %%ids : i32[T, 2], %%w : f32[T, 2] = moe_topk(%%l) {scoring = \"softmax\", top_k = 2}\n"
        "  %%s : f32[T, 8] = moe_routed(%%x, %%ids, %%w, %%g, %%u, %%d)\n"
        "  output %%s\n}\n";
    snprintf(text, sizeof text, experts, 4, 4, 4);
    s = run_on_text(text, "fuse_gate_up", IR_DTYPE_BF16);
    T_CHECK(s && strstr(s, "weight %gate_up : f8e4m3[4, 8, 8] = concat(1, stack(\"g{e}\", 4), "
                           "stack(\"u{e}\", 4)), block_scale[2, 8] = concat(1, stack(\"sg{e}\", "
                           "4), stack(\"su{e}\", 4))\n"));
    T_CHECK(s && strstr(s, "= moe_routed(%x, %ids, %w, %gate_up, %d)"));
    free(s);
    snprintf(text, sizeof text, experts, 3, 3, 3);
    check_unchanged("fp8 experts off the blocks", text, "fuse_gate_up", IR_DTYPE_BF16);
}

int main(void)
{
    test_equivalence();
    test_fp8_models();
    test_fp8_near_misses();
    for (int c = 0; c < N_CASES; c++) {
        check_qkv(&CASES[c]);
        check_gate_up(&CASES[c]);
        check_fused_ops(&CASES[c]);
        check_fold(&CASES[c]);
        for (int p = 0; p < N_PASSES; p++)
            check_idempotent(CASES[c].name, PASSES[p], IR_DTYPE_BF16);
        check_idempotent(CASES[c].name, "fold_routed_scale", IR_DTYPE_F16);
        check_prefix_agrees(CASES[c].name, IR_DTYPE_BF16);
        check_prefix_agrees(CASES[c].name, IR_DTYPE_F16);
    }
    test_near_misses();
    return t_finish("test_pass_fuse");
}
