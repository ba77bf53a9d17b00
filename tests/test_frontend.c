/* test_frontend.c — config.json to IR for every family: the modules build
 * and verify; each layer has the ops of its kind; MoE layers sit where
 * first_k_dense_replace / moe_layer_freq / decoder_sparse_step /
 * mlp_only_layers put them; RoPE, YaRN and softmax-scale attributes equal
 * the reference's formulas (expected values computed independently with
 * Python's math module, shown next to each literal); the transformers-4 and
 * transformers-5 forms of one config give the same IR text; fp8
 * checkpoints (quantization_config) get block-scaled f8e4m3 linears but
 * where modules_to_not_convert / ignored_layers say; every unsupported or
 * malformed field is rejected by name. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/frontend.h"
#include "testlib.h"

/* ---- helpers ------------------------------------------------------------------ */

static char *config_text(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/configs/%s", name);
    return t_read_file(t_src(rel), NULL);
}

static ir_module *build_named(const char *name)
{
    char *text = config_text(name);
    ir_module *m = NULL;
    T_OK(fe_config_build(text, name, &m));
    free(text);
    return m;
}

/* The config `name` with one field replaced (value: JSON text) or removed
 * (value NULL); "a.b" reaches into the object a. Builds it into *m. */
static moec_status build_with(const char *name, const char *key, const char *value, ir_module **m)
{
    char *text = config_text(name);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) {
        fprintf(stderr, "cannot parse %s\n", name);
        exit(2);
    }
    cJSON *obj = root;
    char path[128];
    snprintf(path, sizeof path, "%s", key);
    char *field = path, *dot = strchr(path, '.');
    if (dot) {
        *dot = '\0';
        obj = cJSON_GetObjectItemCaseSensitive(root, path);
        if (!cJSON_IsObject(obj)) {
            fprintf(stderr, "%s has no object %s\n", name, path);
            exit(2);
        }
        field = dot + 1;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(obj, field);
    if (value) {
        cJSON *v = cJSON_Parse(value);
        if (!v) {
            fprintf(stderr, "bad JSON value %s\n", value);
            exit(2);
        }
        cJSON_AddItemToObject(obj, field, v);
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *m = NULL;
    moec_status st = fe_config_build(out, name, m);
    free(out);
    return st;
}

/* Expects the mutated config to fail with st and an error containing needle. */
static void expect_reject(const char *name, const char *key, const char *value, moec_status st,
                          const char *needle, int line)
{
    ir_module *m = NULL;
    moec_status got = build_with(name, key, value, &m);
    t_expect_err(got, st, needle, key, __FILE__, line);
    if (m) {
        fprintf(stderr, "%s:%d: %s: module returned with an error\n", __FILE__, line, key);
        t_failures++;
    }
    ir_module_free(m);
}
#define REJECT(name, key, value, st, needle) expect_reject(name, key, value, st, needle, __LINE__)

static ir_module *build_ok_with(const char *name, const char *key, const char *value)
{
    ir_module *m = NULL;
    T_OK(build_with(name, key, value, &m));
    return m;
}

/* Ops whose first result is named "l<layer>.*" (layer -1: outside layers). */
static int layer_ops(const ir_module *m, int layer, int kind)
{
    char pre[32];
    snprintf(pre, sizeof pre, "l%d.", layer);
    int n = 0;
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        int in_layer = strncmp(op->out[0]->name, pre, strlen(pre)) == 0;
        if (layer < 0)
            in_layer = op->out[0]->name[0] != 'l' || !strchr(op->out[0]->name, '.');
        if (in_layer && (kind < 0 || (int)op->kind == kind))
            n++;
    }
    return n;
}

static const ir_op *op_of(const ir_module *m, const char *name)
{
    const ir_value *v = ir_module_find_value(m, name);
    if (!v || v->kind != IR_VALUE_OP) {
        fprintf(stderr, "no op result %%%s\n", name);
        return NULL;
    }
    return v->def;
}

static int has(const ir_module *m, const char *name)
{
    return ir_module_find_value(m, name) != NULL;
}

static int is_moe(const ir_module *m, int layer)
{
    char name[64];
    snprintf(name, sizeof name, "l%d.moe.topk_ids", layer);
    return has(m, name);
}

/* A weight's type and binding. */
static void check_weight(const ir_module *m, const char *name, ir_dtype dt, int rank, int64_t d0,
                         int64_t d1, int64_t d2, const char *tensor, int count, int line)
{
    t_checks++;
    const ir_value *v = ir_module_find_value(m, name);
    int64_t want[3] = {d0, d1, d2};
    int ok = v && v->kind == IR_VALUE_WEIGHT && v->type.dtype == dt && v->type.rank == rank;
    for (int i = 0; ok && i < rank; i++)
        ok = v->type.dims[i] == want[i];
    if (ok)
        ok = strcmp(v->bind.name, tensor) == 0 &&
             v->bind.kind == (count ? IR_BIND_STACK : IR_BIND_TENSOR) &&
             (!count || v->bind.count == count);
    if (!ok) {
        t_failures++;
        char ts[64] = "?";
        if (v)
            ir_type_format(&v->type, ts, sizeof ts);
        fprintf(stderr, "%s:%d: weight %%%s: got %s bound to %s\n", __FILE__, line, name, ts,
                v && v->bind.name ? v->bind.name : "(none)");
    }
}
#define WEIGHT(m, name, dt, rank, d0, d1, d2, tensor, count)                                       \
    check_weight(m, name, dt, rank, d0, d1, d2, tensor, count, __LINE__)

static int near(double a, double b) { return fabs(a - b) <= 1e-14 * fabs(b); }

static double fattr(const ir_module *m, const char *op, const char *key)
{
    const ir_op *o = op_of(m, op);
    return o ? ir_op_attr_float(o, key, NAN) : NAN;
}

static int64_t iattr(const ir_module *m, const char *op, const char *key)
{
    const ir_op *o = op_of(m, op);
    return o ? ir_op_attr_int(o, key, -999) : -999;
}

static const char *sattr(const ir_module *m, const char *op, const char *key)
{
    const ir_op *o = op_of(m, op);
    const char *s = o ? ir_op_attr_str(o, key, NULL) : NULL;
    return s ? s : "(absent)";
}

static void check_round_trip(const ir_module *m)
{
    char *a = ir_module_print_str(m);
    ir_module *p = NULL;
    T_CHECK(a != NULL);
    if (!a)
        return;
    T_OK(ir_module_parse(a, "printed", &p));
    char *b = p ? ir_module_print_str(p) : NULL;
    T_CHECK(b && strcmp(a, b) == 0);
    free(a);
    free(b);
    ir_module_free(p);
}

/* ---- DeepSeek --------------------------------------------------------------- */

static void test_deepseek_v2(void)
{
    ir_module *m = build_named("deepseek_v2_tiny.json");
    if (!m)
        return;
    T_CHECK(strcmp(m->name, "deepseek_v2") == 0);
    T_CHECK(ir_module_meta_int(m, "vocab_size", -1) == 256);
    T_CHECK(ir_module_meta_int(m, "hidden_size", -1) == 64);
    T_CHECK(ir_module_meta_int(m, "num_hidden_layers", -1) == 3);
    T_CHECK(ir_module_meta_int(m, "max_position_embeddings", -1) == 512);
    T_CHECK(ir_module_meta_int(m, "eos_token_id", -1) == 1);
    T_CHECK(ir_module_meta_int(m, "tie_word_embeddings", -1) == 0);
    T_CHECK(m->n_inputs == 2 && strcmp(m->inputs[0]->name, "tokens") == 0 &&
            strcmp(m->inputs[1]->name, "positions") == 0);
    T_CHECK(m->n_outputs == 1 && strcmp(m->outputs[0]->name, "logits") == 0);
    T_CHECK(m->outputs[0]->type.dims[1] == 256);

    /* Layer 0 dense (first_k_dense_replace 1), 1 and 2 MoE. Ops: 4 of the
     * layer skeleton (2 norms, 2 residual adds), 21 of MLA without q LoRA,
     * 5 of the MLP; MoE: router linear, moe_topk, moe_experts, reshape, mul,
     * reduce_sum (6) + shared MLP (5) + add (1). */
    T_CHECK(!is_moe(m, 0) && is_moe(m, 1) && is_moe(m, 2));
    T_CHECK(layer_ops(m, 0, -1) == 4 + 21 + 5);
    T_CHECK(layer_ops(m, 1, -1) == 4 + 21 + 12);
    T_CHECK(layer_ops(m, 2, -1) == 4 + 21 + 12);
    T_CHECK(layer_ops(m, -1, -1) == 3); /* embed, final_norm, logits */
    T_CHECK(layer_ops(m, 1, IR_OP_ROPE) == 2);
    T_CHECK(layer_ops(m, 1, IR_OP_ATTENTION) == 1);
    T_CHECK(layer_ops(m, 1, IR_OP_RMS_NORM) == 3); /* attn_norm, mlp_norm, kv_c_norm */
    T_CHECK(!has(m, "l0.attn.q_a") && has(m, "l0.attn.q_flat"));

    WEIGHT(m, "embed_tokens", IR_DTYPE_BF16, 2, 256, 64, 0, "model.embed_tokens.weight", 0);
    WEIGHT(m, "lm_head", IR_DTYPE_BF16, 2, 256, 64, 0, "lm_head.weight", 0);
    WEIGHT(m, "norm", IR_DTYPE_BF16, 1, 64, 0, 0, "model.norm.weight", 0);
    WEIGHT(m, "l0.input_layernorm", IR_DTYPE_BF16, 1, 64, 0, 0,
           "model.layers.0.input_layernorm.weight", 0);
    WEIGHT(m, "l0.attn.q_proj", IR_DTYPE_BF16, 2, 4 * 24, 64, 0,
           "model.layers.0.self_attn.q_proj.weight", 0);
    WEIGHT(m, "l0.attn.kv_a_proj", IR_DTYPE_BF16, 2, 32 + 8, 64, 0,
           "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 0);
    WEIGHT(m, "l0.attn.kv_b_proj", IR_DTYPE_BF16, 2, 4 * 32, 32, 0,
           "model.layers.0.self_attn.kv_b_proj.weight", 0);
    WEIGHT(m, "l0.attn.o_proj", IR_DTYPE_BF16, 2, 64, 4 * 16, 0,
           "model.layers.0.self_attn.o_proj.weight", 0);
    WEIGHT(m, "l0.mlp.gate_proj", IR_DTYPE_BF16, 2, 96, 64, 0,
           "model.layers.0.mlp.gate_proj.weight", 0);
    WEIGHT(m, "l0.mlp.down_proj", IR_DTYPE_BF16, 2, 64, 96, 0,
           "model.layers.0.mlp.down_proj.weight", 0);
    WEIGHT(m, "l1.moe.router", IR_DTYPE_BF16, 2, 8, 64, 0, "model.layers.1.mlp.gate.weight", 0);
    WEIGHT(m, "l1.moe.experts.gate", IR_DTYPE_BF16, 3, 8, 32, 64,
           "model.layers.1.mlp.experts.{e}.gate_proj.weight", 8);
    WEIGHT(m, "l1.moe.experts.up", IR_DTYPE_BF16, 3, 8, 32, 64,
           "model.layers.1.mlp.experts.{e}.up_proj.weight", 8);
    WEIGHT(m, "l1.moe.experts.down", IR_DTYPE_BF16, 3, 8, 64, 32,
           "model.layers.1.mlp.experts.{e}.down_proj.weight", 8);
    /* Shared experts: moe_intermediate_size * n_shared_experts = 64. */
    WEIGHT(m, "l1.moe.shared.gate_proj", IR_DTYPE_BF16, 2, 64, 64, 0,
           "model.layers.1.mlp.shared_experts.gate_proj.weight", 0);
    T_CHECK(!has(m, "l1.moe.router_bias") && !has(m, "l0.attn.q_a_proj.bias"));

    /* Routing: softmax greedy, no group attributes, no normalization. */
    T_CHECK(strcmp(sattr(m, "l1.moe.topk_ids", "scoring"), "softmax") == 0);
    T_CHECK(iattr(m, "l1.moe.topk_ids", "top_k") == 2);
    T_CHECK(iattr(m, "l1.moe.topk_ids", "n_group") == -999);
    T_CHECK(iattr(m, "l1.moe.topk_ids", "norm_topk_prob") == 0);
    T_CHECK(fattr(m, "l1.moe.topk_ids", "scaling") == 1.0);
    T_CHECK(op_of(m, "l1.moe.topk_ids") && op_of(m, "l1.moe.topk_ids")->n_in == 1);
    T_CHECK(iattr(m, "l1.moe.routed", "axis") == 1);
    const ir_value *w3 = ir_module_find_value(m, "l1.moe.topk_w3");
    T_CHECK(w3 && w3->type.rank == 3 && w3->type.dims[1] == 2 && w3->type.dims[2] == 1);

    /* Interleaved YaRN rope over qk_rope_head_dim 8, theta 10000, factor 4,
     * original 128, beta 32/1, mscale = mscale_all_dim = 0.707:
     *   low  = max(floor(8*ln(128/(32*2*pi))/(2*ln 10000)), 0) = max(floor(-0.196), 0) = 0
     *   high = min(ceil(8*ln(128/(1*2*pi))/(2*ln 10000)), 7) = ceil(1.309) = 2
     *   attn_factor = get_mscale(4, .707) / get_mscale(4, .707) = 1.0
     *   scale = 24**-0.5 * (0.1*0.707*ln 4 + 1)**2 = 0.24609782191507454 */
    T_CHECK(strcmp(sattr(m, "l0.attn.q_pe_rot", "style"), "interleave") == 0);
    T_CHECK(strcmp(sattr(m, "l0.attn.k_pe_rot", "scaling"), "yarn") == 0);
    T_CHECK(fattr(m, "l0.attn.q_pe_rot", "theta") == 10000.0);
    T_CHECK(fattr(m, "l0.attn.q_pe_rot", "factor") == 4.0);
    T_CHECK(fattr(m, "l0.attn.q_pe_rot", "yarn_low") == 0.0);
    T_CHECK(fattr(m, "l0.attn.q_pe_rot", "yarn_high") == 2.0);
    T_CHECK(fattr(m, "l0.attn.q_pe_rot", "attn_factor") == 1.0);
    T_CHECK(near(fattr(m, "l2.attn.ctx", "scale"), 0.24609782191507454));
    T_CHECK(iattr(m, "l2.attn.ctx", "window") == -999);
    T_CHECK(fattr(m, "l0.attn_norm", "eps") == 1e-6);
    T_CHECK(fattr(m, "l0.attn.kv_c_norm", "eps") == 1e-6);
    const ir_value *kpe = ir_module_find_value(m, "l0.attn.k_pe_exp");
    T_CHECK(kpe && kpe->type.rank == 3 && kpe->type.dims[1] == 4 && kpe->type.dims[2] == 8);
    const ir_value *qf = ir_module_find_value(m, "l0.attn.q_full");
    T_CHECK(qf && qf->type.dims[1] == 4 && qf->type.dims[2] == 24);
    check_round_trip(m);
    ir_module_free(m);
}

static void test_deepseek_v2_qlora(void)
{
    ir_module *m = build_named("deepseek_v2_qlora.json");
    if (!m)
        return;
    /* first_k_dense_replace 0, moe_layer_freq 2: layers 0 and 2 are MoE. */
    T_CHECK(is_moe(m, 0) && !is_moe(m, 1) && is_moe(m, 2) && !is_moe(m, 3));
    T_CHECK(layer_ops(m, 0, -1) == 4 + 23 + 12);
    T_CHECK(layer_ops(m, 1, -1) == 4 + 23 + 5);
    const int64_t *eos;
    T_CHECK(ir_module_meta_ints(m, "eos_token_id", &eos) == 2 && eos[0] == 7 && eos[1] == 9);
    /* torch_dtype float32; attention_bias -> q_a_proj, kv_a_proj, o_proj biases. */
    WEIGHT(m, "l0.attn.q_a_proj", IR_DTYPE_F32, 2, 24, 64, 0,
           "model.layers.0.self_attn.q_a_proj.weight", 0);
    WEIGHT(m, "l0.attn.q_a_proj.bias", IR_DTYPE_F32, 1, 24, 0, 0,
           "model.layers.0.self_attn.q_a_proj.bias", 0);
    WEIGHT(m, "l0.attn.q_a_layernorm", IR_DTYPE_F32, 1, 24, 0, 0,
           "model.layers.0.self_attn.q_a_layernorm.weight", 0);
    WEIGHT(m, "l0.attn.q_b_proj", IR_DTYPE_F32, 2, 4 * 24, 24, 0,
           "model.layers.0.self_attn.q_b_proj.weight", 0);
    WEIGHT(m, "l0.attn.kv_a_proj.bias", IR_DTYPE_F32, 1, 40, 0, 0,
           "model.layers.0.self_attn.kv_a_proj_with_mqa.bias", 0);
    WEIGHT(m, "l0.attn.o_proj.bias", IR_DTYPE_F32, 1, 64, 0, 0,
           "model.layers.0.self_attn.o_proj.bias", 0);
    T_CHECK(!has(m, "l0.attn.q_proj") && !has(m, "l0.attn.kv_b_proj.bias"));
    /* q_a_layernorm uses DeepseekV2RMSNorm's default eps even if
     * rms_norm_eps differs (checked below with a mutated config). */
    T_CHECK(fattr(m, "l0.attn.q_a_norm", "eps") == 1e-6);
    /* group_limited_greedy: groups by max; norm_topk_prob true is ignored. */
    T_CHECK(iattr(m, "l0.moe.topk_ids", "top_k") == 3);
    T_CHECK(iattr(m, "l0.moe.topk_ids", "n_group") == 4);
    T_CHECK(iattr(m, "l0.moe.topk_ids", "topk_group") == 2);
    T_CHECK(strcmp(sattr(m, "l0.moe.topk_ids", "group_score"), "max") == 0);
    T_CHECK(iattr(m, "l0.moe.topk_ids", "norm_topk_prob") == 0);
    T_CHECK(fattr(m, "l0.moe.topk_ids", "scaling") == 2.0);
    /* Default rope: no scaling attrs; scale = 24**-0.5 = 0.2041241452319315. */
    T_CHECK(strcmp(sattr(m, "l0.attn.q_pe_rot", "scaling"), "(absent)") == 0);
    T_CHECK(near(fattr(m, "l0.attn.ctx", "scale"), 0.2041241452319315));
    /* One shared expert: 32 wide. */
    WEIGHT(m, "l0.moe.shared.down_proj", IR_DTYPE_F32, 2, 64, 32, 0,
           "model.layers.0.mlp.shared_experts.down_proj.weight", 0);
    check_round_trip(m);
    ir_module_free(m);

    m = build_ok_with("deepseek_v2_qlora.json", "rms_norm_eps", "1e-5");
    if (m) {
        T_CHECK(fattr(m, "l0.attn.q_a_norm", "eps") == 1e-6);
        T_CHECK(fattr(m, "l0.attn.kv_c_norm", "eps") == 1e-6);
        T_CHECK(fattr(m, "l0.attn_norm", "eps") == 1e-5);
        T_CHECK(fattr(m, "final_norm", "eps") == 1e-5);
    }
    ir_module_free(m);

    /* mlp_bias (V2 only) -> biases on the dense and shared MLPs. */
    m = build_ok_with("deepseek_v2_qlora.json", "mlp_bias", "true");
    if (m) {
        WEIGHT(m, "l1.mlp.up_proj.bias", IR_DTYPE_F32, 1, 96, 0, 0,
               "model.layers.1.mlp.up_proj.bias", 0);
        WEIGHT(m, "l0.moe.shared.down_proj.bias", IR_DTYPE_F32, 1, 64, 0, 0,
               "model.layers.0.mlp.shared_experts.down_proj.bias", 0);
    }
    ir_module_free(m);
}

static void test_deepseek_v3(void)
{
    ir_module *m = build_named("deepseek_v3_yarn_t4.json");
    if (!m)
        return;
    T_CHECK(!is_moe(m, 0) && is_moe(m, 1) && is_moe(m, 2));
    T_CHECK(layer_ops(m, 0, -1) == 4 + 23 + 5);
    T_CHECK(layer_ops(m, 1, -1) == 4 + 23 + 12);
    WEIGHT(m, "l1.moe.router_bias", IR_DTYPE_F32, 1, 16, 0, 0,
           "model.layers.1.mlp.gate.e_score_correction_bias", 0);
    WEIGHT(m, "l1.moe.experts.up", IR_DTYPE_BF16, 3, 16, 32, 64,
           "model.layers.1.mlp.experts.{e}.up_proj.weight", 16);
    const ir_op *topk = op_of(m, "l1.moe.topk_ids");
    T_CHECK(topk && topk->n_in == 2 && strcmp(topk->in[1]->name, "l1.moe.router_bias") == 0);
    T_CHECK(strcmp(sattr(m, "l1.moe.topk_ids", "scoring"), "sigmoid") == 0);
    T_CHECK(iattr(m, "l1.moe.topk_ids", "top_k") == 4);
    T_CHECK(iattr(m, "l1.moe.topk_ids", "n_group") == 4);
    T_CHECK(iattr(m, "l1.moe.topk_ids", "topk_group") == 2);
    T_CHECK(strcmp(sattr(m, "l1.moe.topk_ids", "group_score"), "top2_sum") == 0);
    T_CHECK(iattr(m, "l1.moe.topk_ids", "norm_topk_prob") == 1);
    T_CHECK(fattr(m, "l1.moe.topk_ids", "scaling") == 2.5);
    /* rope_interleave defaults to true. YaRN as for V2 (low 0, high 2,
     * attn_factor 1); scale = 24**-0.5 * (0.1*1.0*ln 4 + 1)**2
     * = 0.2646422579642267. */
    T_CHECK(strcmp(sattr(m, "l1.attn.q_pe_rot", "style"), "interleave") == 0);
    T_CHECK(fattr(m, "l1.attn.q_pe_rot", "yarn_low") == 0.0);
    T_CHECK(fattr(m, "l1.attn.q_pe_rot", "yarn_high") == 2.0);
    T_CHECK(fattr(m, "l1.attn.q_pe_rot", "attn_factor") == 1.0);
    T_CHECK(near(fattr(m, "l1.attn.ctx", "scale"), 0.2646422579642267));

    /* The transformers-5 form of the same config: identical IR text. */
    ir_module *m5 = build_named("deepseek_v3_yarn_t5.json");
    if (m5) {
        char *a = ir_module_print_str(m), *b = ir_module_print_str(m5);
        T_CHECK(a && b && strcmp(a, b) == 0);
        free(a);
        free(b);
    }
    ir_module_free(m5);
    check_round_trip(m);
    ir_module_free(m);

    m = build_ok_with("deepseek_v3_yarn_t4.json", "rope_interleave", "false");
    T_CHECK(m && strcmp(sattr(m, "l0.attn.k_pe_rot", "style"), "neox") == 0);
    ir_module_free(m);
    /* null is falsy to `if config.rope_interleave:` */
    m = build_ok_with("deepseek_v3_yarn_t4.json", "rope_interleave", "null");
    T_CHECK(m && strcmp(sattr(m, "l0.attn.k_pe_rot", "style"), "neox") == 0);
    ir_module_free(m);
    m = build_ok_with("deepseek_v3_yarn_t4.json", "norm_topk_prob", "false");
    T_CHECK(m && iattr(m, "l1.moe.topk_ids", "norm_topk_prob") == 0);
    ir_module_free(m);
    /* No shared experts when n_shared_experts is null or 0. */
    m = build_ok_with("deepseek_v3_yarn_t4.json", "n_shared_experts", "null");
    T_CHECK(m && !has(m, "l1.moe.shared.gate") && !has(m, "l1.moe.out") &&
            layer_ops(m, 1, -1) == 4 + 23 + 6);
    ir_module_free(m);
    /* num_key_value_heads absent: DeepseekV3Config's 128 != 4 heads. */
    REJECT("deepseek_v3_yarn_t4.json", "num_key_value_heads", NULL, MOEC_ERR_UNSUPPORTED,
           "num_key_value_heads");
    /* ... but null means "as many as heads". */
    m = build_ok_with("deepseek_v3_yarn_t4.json", "num_key_value_heads", "null");
    T_CHECK(m != NULL);
    ir_module_free(m);
}

/* Which layers are MoE for several placements (4 layers, DeepSeek's rule). */
static void test_deepseek_placement(void)
{
    ir_module *m = build_ok_with("deepseek_v2_qlora.json", "first_k_dense_replace", "2");
    T_CHECK(m && !is_moe(m, 0) && !is_moe(m, 1) && is_moe(m, 2) && !is_moe(m, 3));
    ir_module_free(m);
    m = build_ok_with("deepseek_v2_qlora.json", "moe_layer_freq", "1");
    T_CHECK(m && is_moe(m, 0) && is_moe(m, 1) && is_moe(m, 2) && is_moe(m, 3));
    ir_module_free(m);
    m = build_ok_with("deepseek_v2_qlora.json", "moe_layer_freq", "3");
    T_CHECK(m && is_moe(m, 0) && !is_moe(m, 1) && !is_moe(m, 2) && is_moe(m, 3));
    ir_module_free(m);
    /* n_routed_experts null: a dense model. */
    m = build_ok_with("deepseek_v2_qlora.json", "n_routed_experts", "null");
    T_CHECK(m && !is_moe(m, 0) && !is_moe(m, 2) && has(m, "l0.mlp.out"));
    ir_module_free(m);
    /* V3 default first_k_dense_replace is 3. */
    m = build_ok_with("deepseek_v3_yarn_t4.json", "first_k_dense_replace", NULL);
    T_CHECK(m && !is_moe(m, 0) && !is_moe(m, 1) && !is_moe(m, 2));
    ir_module_free(m);
}

/* ---- Qwen --------------------------------------------------------------------- */

static void test_qwen2_moe(void)
{
    ir_module *m = build_named("qwen2_moe_sparse.json");
    if (!m)
        return;
    /* decoder_sparse_step 2: (i+1) % 2 == 0 -> 1, 3, 5; mlp_only_layers [3]. */
    T_CHECK(!is_moe(m, 0) && is_moe(m, 1) && !is_moe(m, 2) && !is_moe(m, 3) && !is_moe(m, 4) &&
            is_moe(m, 5));
    /* Attention 11 ops (3 linears, 3 reshapes, 2 ropes, attention, reshape,
     * o_proj); MoE 6 + shared expert 5 + gate linear, sigmoid, mul, add. */
    T_CHECK(layer_ops(m, 0, -1) == 4 + 11 + 5);
    T_CHECK(layer_ops(m, 1, -1) == 4 + 11 + 15);
    /* qkv_bias absent -> true; o_proj without bias. */
    WEIGHT(m, "l0.attn.q_proj", IR_DTYPE_BF16, 2, 64, 64, 0,
           "model.layers.0.self_attn.q_proj.weight", 0);
    WEIGHT(m, "l0.attn.k_proj.bias", IR_DTYPE_BF16, 1, 32, 0, 0,
           "model.layers.0.self_attn.k_proj.bias", 0);
    WEIGHT(m, "l0.attn.v_proj.bias", IR_DTYPE_BF16, 1, 32, 0, 0,
           "model.layers.0.self_attn.v_proj.bias", 0);
    T_CHECK(!has(m, "l0.attn.o_proj.bias"));
    WEIGHT(m, "l1.moe.shared.gate_proj", IR_DTYPE_BF16, 2, 48, 64, 0,
           "model.layers.1.mlp.shared_expert.gate_proj.weight", 0);
    WEIGHT(m, "l1.moe.shared_expert_gate", IR_DTYPE_BF16, 2, 1, 64, 0,
           "model.layers.1.mlp.shared_expert_gate.weight", 0);
    WEIGHT(m, "l5.moe.experts.down", IR_DTYPE_BF16, 3, 8, 64, 32,
           "model.layers.5.mlp.experts.{e}.down_proj.weight", 8);
    const ir_op *sc = op_of(m, "l1.moe.shared_scaled");
    T_CHECK(sc && sc->kind == IR_OP_MUL && strcmp(sc->in[1]->name, "l1.moe.shared_gate") == 0);
    T_CHECK(op_of(m, "l1.moe.shared_gate") &&
            op_of(m, "l1.moe.shared_gate")->kind == IR_OP_SIGMOID);
    T_CHECK(strcmp(sattr(m, "l1.moe.topk_ids", "scoring"), "softmax") == 0);
    T_CHECK(iattr(m, "l1.moe.topk_ids", "norm_topk_prob") == 0);
    T_CHECK(fattr(m, "l1.moe.topk_ids", "scaling") == 1.0);
    /* neox rope, theta 1e6, head_dim 16: scale = 16**-0.5 = 0.25. */
    T_CHECK(strcmp(sattr(m, "l0.attn.q_rot", "style"), "neox") == 0);
    T_CHECK(fattr(m, "l0.attn.q_rot", "theta") == 1e6);
    T_CHECK(fattr(m, "l0.attn.ctx", "scale") == 0.25);
    /* Sliding window 16 on even layers below max_window_layers 4. */
    T_CHECK(iattr(m, "l0.attn.ctx", "window") == 16);
    T_CHECK(iattr(m, "l1.attn.ctx", "window") == -999);
    T_CHECK(iattr(m, "l2.attn.ctx", "window") == 16);
    T_CHECK(iattr(m, "l3.attn.ctx", "window") == -999);
    T_CHECK(iattr(m, "l4.attn.ctx", "window") == -999);
    check_round_trip(m);
    ir_module_free(m);

    /* An explicit layer_types wins over the derivation. */
    m = build_ok_with("qwen2_moe_sparse.json", "layer_types",
                      "[\"full_attention\", \"sliding_attention\", \"full_attention\", "
                      "\"full_attention\", \"full_attention\", \"sliding_attention\"]");
    T_CHECK(m && iattr(m, "l0.attn.ctx", "window") == -999 &&
            iattr(m, "l1.attn.ctx", "window") == 16 && iattr(m, "l5.attn.ctx", "window") == 16);
    ir_module_free(m);
    m = build_ok_with("qwen2_moe_sparse.json", "use_sliding_window", "false");
    T_CHECK(m && iattr(m, "l0.attn.ctx", "window") == -999);
    ir_module_free(m);
    m = build_ok_with("qwen2_moe_sparse.json", "qkv_bias", "false");
    T_CHECK(m && !has(m, "l0.attn.q_proj.bias"));
    ir_module_free(m);

    /* Placements. */
    m = build_ok_with("qwen2_moe_sparse.json", "decoder_sparse_step", "3");
    T_CHECK(m && !is_moe(m, 0) && !is_moe(m, 1) && is_moe(m, 2) && !is_moe(m, 3) && !is_moe(m, 4) &&
            is_moe(m, 5));
    ir_module_free(m);
    m = build_ok_with("qwen2_moe_sparse.json", "decoder_sparse_step", NULL);
    T_CHECK(m && is_moe(m, 0) && is_moe(m, 1) && is_moe(m, 2) && !is_moe(m, 3) && is_moe(m, 4) &&
            is_moe(m, 5));
    ir_module_free(m);
    m = build_ok_with("qwen2_moe_sparse.json", "num_experts", "0");
    T_CHECK(m && !is_moe(m, 1) && !is_moe(m, 5) && has(m, "l1.mlp.out"));
    ir_module_free(m);
    m = build_ok_with("qwen2_moe_sparse.json", "mlp_only_layers", "null");
    T_CHECK(m && is_moe(m, 3));
    ir_module_free(m);
    m = build_ok_with("qwen2_moe_sparse.json", "norm_topk_prob", "true");
    T_CHECK(m && iattr(m, "l1.moe.topk_ids", "norm_topk_prob") == 1);
    ir_module_free(m);
}

static void test_qwen3_moe(void)
{
    ir_module *m = build_named("qwen3_moe_tied.json");
    if (!m)
        return;
    T_CHECK(is_moe(m, 0) && !is_moe(m, 1) && is_moe(m, 2));
    T_CHECK(layer_ops(m, 0, -1) == 4 + 13 + 6);
    T_CHECK(layer_ops(m, 1, -1) == 4 + 13 + 5);
    T_CHECK(ir_module_meta_int(m, "tie_word_embeddings", -1) == 1);
    /* Tied: no lm_head weight; the logits use embed_tokens. */
    T_CHECK(!has(m, "lm_head"));
    const ir_op *lg = op_of(m, "logits");
    T_CHECK(lg && strcmp(lg->in[1]->name, "embed_tokens") == 0);
    /* head_dim 24 (not 64 / 4); 2 kv heads; q/k norms over head_dim. */
    WEIGHT(m, "l0.attn.q_proj", IR_DTYPE_BF16, 2, 4 * 24, 64, 0,
           "model.layers.0.self_attn.q_proj.weight", 0);
    WEIGHT(m, "l0.attn.k_proj", IR_DTYPE_BF16, 2, 2 * 24, 64, 0,
           "model.layers.0.self_attn.k_proj.weight", 0);
    WEIGHT(m, "l0.attn.o_proj", IR_DTYPE_BF16, 2, 64, 4 * 24, 0,
           "model.layers.0.self_attn.o_proj.weight", 0);
    WEIGHT(m, "l0.attn.q_norm", IR_DTYPE_BF16, 1, 24, 0, 0,
           "model.layers.0.self_attn.q_norm.weight", 0);
    WEIGHT(m, "l0.attn.k_norm", IR_DTYPE_BF16, 1, 24, 0, 0,
           "model.layers.0.self_attn.k_norm.weight", 0);
    T_CHECK(!has(m, "l0.attn.q_proj.bias") && !has(m, "l0.moe.shared.gate"));
    const ir_op *qn = op_of(m, "l0.attn.q_normed");
    T_CHECK(qn && qn->kind == IR_OP_RMS_NORM && strcmp(qn->in[0]->name, "l0.attn.q") == 0);
    const ir_op *kr = op_of(m, "l0.attn.k_rot");
    T_CHECK(kr && strcmp(kr->in[0]->name, "l0.attn.k_normed") == 0);
    const ir_value *kh = ir_module_find_value(m, "l0.attn.k");
    T_CHECK(kh && kh->type.rank == 3 && kh->type.dims[1] == 2 && kh->type.dims[2] == 24);
    T_CHECK(iattr(m, "l0.moe.topk_ids", "norm_topk_prob") == 1);
    /* scale = 24**-0.5 = 0.2041241452319315 */
    T_CHECK(near(fattr(m, "l0.attn.ctx", "scale"), 0.2041241452319315));
    T_CHECK(iattr(m, "l0.attn.ctx", "window") == -999);
    check_round_trip(m);
    ir_module_free(m);

    m = build_ok_with("qwen3_moe_tied.json", "attention_bias", "true");
    if (m) {
        WEIGHT(m, "l0.attn.o_proj.bias", IR_DTYPE_BF16, 1, 64, 0, 0,
               "model.layers.0.self_attn.o_proj.bias", 0);
        WEIGHT(m, "l0.attn.v_proj.bias", IR_DTYPE_BF16, 1, 48, 0, 0,
               "model.layers.0.self_attn.v_proj.bias", 0);
    }
    ir_module_free(m);
    /* Qwen3's sliding window applies to every layer, only with
     * use_sliding_window. */
    m = build_ok_with("qwen3_moe_tied.json", "sliding_window", "32");
    T_CHECK(m && iattr(m, "l1.attn.ctx", "window") == -999);
    ir_module_free(m);
    m = build_ok_with("qwen3_moe_tied.json", "use_sliding_window", "true");
    T_CHECK(m && iattr(m, "l1.attn.ctx", "window") == -999); /* sliding_window null */
    ir_module_free(m);
    {
        /* use_sliding_window with the default window 4096 */
        ir_module *m2 = NULL;
        char *text = config_text("qwen3_moe_tied.json");
        cJSON *root = cJSON_Parse(text);
        free(text);
        cJSON_DeleteItemFromObjectCaseSensitive(root, "sliding_window");
        cJSON_ReplaceItemInObjectCaseSensitive(root, "use_sliding_window", cJSON_CreateTrue());
        char *out = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        T_OK(fe_config_build(out, "qwen3_moe_tied.json", &m2));
        free(out);
        T_CHECK(m2 && iattr(m2, "l0.attn.ctx", "window") == 4096 &&
                iattr(m2, "l2.attn.ctx", "window") == 4096);
        ir_module_free(m2);
    }
    /* num_local_experts (the transformers-5 name) works as num_experts. */
    {
        char *text = config_text("qwen3_moe_tied.json");
        cJSON *root = cJSON_Parse(text);
        free(text);
        cJSON_DeleteItemFromObjectCaseSensitive(root, "num_experts");
        cJSON_AddNumberToObject(root, "num_local_experts", 8);
        char *out = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        ir_module *m2 = NULL;
        T_OK(fe_config_build(out, "qwen3_moe_tied.json", &m2));
        free(out);
        ir_module *m1 = build_named("qwen3_moe_tied.json");
        char *a = m1 ? ir_module_print_str(m1) : NULL, *b = m2 ? ir_module_print_str(m2) : NULL;
        T_CHECK(a && b && strcmp(a, b) == 0);
        free(a);
        free(b);
        ir_module_free(m1);
        ir_module_free(m2);
    }
}

/* ---- RoPE parameters ----------------------------------------------------------- */

static void test_rope_variants(void)
{
    /* truncate false, beta_fast 4, beta_slow 2 (dim 8, theta 1e4, orig 128):
     *   low  = 8*ln(128/(4*2*pi))/(2*ln 1e4) = 0.7069701099617909
     *   high = 8*ln(128/(2*2*pi))/(2*ln 1e4) = 1.0080001056257721
     *   attn_factor (no mscale) = 0.1*ln 4 + 1 = 1.138629436111989 */
    ir_module *m = NULL;
    char *text = config_text("deepseek_v3_yarn_t5.json");
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    cJSON_DeleteItemFromObjectCaseSensitive(rp, "mscale");
    cJSON_DeleteItemFromObjectCaseSensitive(rp, "mscale_all_dim");
    cJSON_ReplaceItemInObjectCaseSensitive(rp, "beta_fast", cJSON_CreateNumber(4));
    cJSON_ReplaceItemInObjectCaseSensitive(rp, "beta_slow", cJSON_CreateNumber(2));
    cJSON_AddFalseToObject(rp, "truncate");
    char *out = cJSON_PrintUnformatted(root);
    T_OK(fe_config_build(out, "t5.json", &m));
    free(out);
    if (m) {
        T_CHECK(near(fattr(m, "l0.attn.q_pe_rot", "yarn_low"), 0.7069701099617909));
        T_CHECK(near(fattr(m, "l0.attn.q_pe_rot", "yarn_high"), 1.0080001056257721));
        T_CHECK(near(fattr(m, "l0.attn.q_pe_rot", "attn_factor"), 1.138629436111989));
        /* No mscale_all_dim: the softmax scale stays 24**-0.5. */
        T_CHECK(near(fattr(m, "l0.attn.ctx", "scale"), 0.2041241452319315));
    }
    ir_module_free(m);

    /* A top-level original_max_position_embeddings overrides the dict's
     * (standardize_rope_params at init): orig 4096 ->
     *   low = 8*ln(4096/(4*2*pi))/(2*ln 1e4) = 2.2121200882816967
     *   high = 8*ln(4096/(2*2*pi))/(2*ln 1e4) = 2.513150083945678 */
    cJSON_AddNumberToObject(root, "original_max_position_embeddings", 4096);
    out = cJSON_PrintUnformatted(root);
    m = NULL;
    T_OK(fe_config_build(out, "t5.json", &m));
    free(out);
    if (m) {
        T_CHECK(near(fattr(m, "l0.attn.q_pe_rot", "yarn_low"), 2.2121200882816967));
        T_CHECK(near(fattr(m, "l0.attn.q_pe_rot", "yarn_high"), 2.513150083945678));
    }
    ir_module_free(m);

    /* attention_factor given wins; factor null -> max_pos / orig = 512/128. */
    cJSON_DeleteItemFromObjectCaseSensitive(root, "original_max_position_embeddings");
    cJSON_AddNumberToObject(rp, "attention_factor", 0.75);
    cJSON_ReplaceItemInObjectCaseSensitive(rp, "factor", cJSON_CreateNull());
    out = cJSON_PrintUnformatted(root);
    m = NULL;
    T_OK(fe_config_build(out, "t5.json", &m));
    free(out);
    if (m) {
        T_CHECK(fattr(m, "l0.attn.q_pe_rot", "attn_factor") == 0.75);
        T_CHECK(fattr(m, "l0.attn.q_pe_rot", "factor") == 4.0);
    }
    ir_module_free(m);
    cJSON_Delete(root);

    /* mscale 1.5 / mscale_all_dim 0.5, factor 4:
     *   attn_factor = (0.1*1.5*ln 4 + 1) / (0.1*0.5*ln 4 + 1) = 1.1296432507391427
     *   scale = 24**-0.5 * (0.1*0.5*ln 4 + 1)**2 */
    {
        text = config_text("deepseek_v2_tiny.json");
        root = cJSON_Parse(text);
        free(text);
        cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
        cJSON_ReplaceItemInObjectCaseSensitive(rs, "mscale", cJSON_CreateNumber(1.5));
        cJSON_ReplaceItemInObjectCaseSensitive(rs, "mscale_all_dim", cJSON_CreateNumber(0.5));
        out = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        m = NULL;
        T_OK(fe_config_build(out, "v2.json", &m));
        free(out);
        double ms = 0.1 * 0.5 * log(4.0) + 1.0;
        if (m) {
            T_CHECK(near(fattr(m, "l0.attn.q_pe_rot", "attn_factor"), 1.1296432507391427));
            T_CHECK(near(fattr(m, "l0.attn.ctx", "scale"), pow(24, -0.5) * ms * ms));
        }
        ir_module_free(m);
    }

    /* linear scaling: factor only, scale untouched (no mscale_all_dim). */
    m = build_ok_with("deepseek_v2_tiny.json", "rope_scaling",
                      "{\"type\": \"linear\", \"factor\": 2}");
    if (m) {
        T_CHECK(strcmp(sattr(m, "l0.attn.q_pe_rot", "scaling"), "linear") == 0);
        T_CHECK(fattr(m, "l0.attn.q_pe_rot", "factor") == 2.0);
        T_CHECK(fattr(m, "l0.attn.q_pe_rot", "yarn_low") !=
                fattr(m, "l0.attn.q_pe_rot", "yarn_low"));
        T_CHECK(near(fattr(m, "l0.attn.ctx", "scale"), 0.2041241452319315));
    }
    ir_module_free(m);
    /* linear with mscale_all_dim: yarn_apply_mscale applies to any
     * non-default type: 24**-0.5 * (0.1*1*ln 2 + 1)**2. */
    m = build_ok_with("deepseek_v2_tiny.json", "rope_scaling",
                      "{\"type\": \"linear\", \"factor\": 2, \"mscale_all_dim\": 1}");
    if (m) {
        double ms = 0.1 * log(2.0) + 1.0;
        T_CHECK(near(fattr(m, "l0.attn.ctx", "scale"), pow(24, -0.5) * ms * ms));
    }
    ir_module_free(m);
    /* an mscale_all_dim whose softmax scale overflows (fuzz_config found
       it reaching the verifier as an invalid argument): refused by name */
    REJECT("deepseek_v2_tiny.json", "rope_scaling",
           "{\"type\": \"yarn\", \"factor\": 4, \"mscale_all_dim\": 1e307}",
           MOEC_ERR_UNSUPPORTED,
           "field \"rope_scaling.mscale_all_dim\" = 1e+307 gives a softmax scale that is not "
           "finite (with factor 4)");
    /* The default type ignores the other fields. */
    m = build_ok_with("deepseek_v2_tiny.json", "rope_scaling",
                      "{\"type\": \"default\", \"factor\": \"x\", \"mscale_all_dim\": 1}");
    T_CHECK(m && near(fattr(m, "l0.attn.ctx", "scale"), 0.2041241452319315));
    ir_module_free(m);
    /* An empty rope_scaling falls back to rope_parameters; rope_type beats type. */
    m = build_ok_with("deepseek_v2_tiny.json", "rope_scaling",
                      "{\"type\": \"yarn\", \"rope_type\": \"default\"}");
    T_CHECK(m && strcmp(sattr(m, "l0.attn.q_pe_rot", "scaling"), "(absent)") == 0);
    ir_module_free(m);
    m = build_ok_with("deepseek_v2_tiny.json", "rope_scaling", "{}");
    T_CHECK(m && strcmp(sattr(m, "l0.attn.q_pe_rot", "scaling"), "(absent)") == 0 &&
            fattr(m, "l0.attn.q_pe_rot", "theta") == 10000.0);
    ir_module_free(m);
    /* rope_theta absent: 10000. rope_parameters' own rope_theta wins. */
    m = build_ok_with("qwen3_moe_tied.json", "rope_theta", NULL);
    T_CHECK(m && fattr(m, "l0.attn.q_rot", "theta") == 10000.0);
    ir_module_free(m);
    m = build_ok_with("qwen3_moe_tied.json", "rope_parameters",
                      "{\"rope_type\": \"default\", \"rope_theta\": 5000}");
    T_CHECK(m && fattr(m, "l0.attn.q_rot", "theta") == 5000.0);
    ir_module_free(m);
    /* Qwen3 yarn over head_dim 24, theta 1e6, orig 128, factor 4:
     *   low = max(floor(24*ln(128/(32*2*pi))/(2*ln 1e6)), 0) = max(floor(-0.392), 0) = 0
     *   high = min(ceil(24*ln(128/(2*pi))/(2*ln 1e6)), 23) = ceil(2.618) = 3 */
    m = build_ok_with("qwen3_moe_tied.json", "rope_scaling",
                      "{\"rope_type\": \"yarn\", \"factor\": 4, "
                      "\"original_max_position_embeddings\": 128}");
    if (m) {
        T_CHECK(fattr(m, "l0.attn.k_rot", "yarn_low") == 0.0);
        T_CHECK(fattr(m, "l0.attn.k_rot", "yarn_high") == 3.0);
        T_CHECK(near(fattr(m, "l0.attn.k_rot", "attn_factor"), 1.138629436111989));
        T_CHECK(near(fattr(m, "l0.attn.ctx", "scale"), 0.2041241452319315));
    }
    ir_module_free(m);
    /* partial_rotary_factor 1.0 is fine. */
    m = build_ok_with("qwen3_moe_tied.json", "partial_rotary_factor", "1.0");
    T_CHECK(m != NULL);
    ir_module_free(m);
}

/* ---- published configs ---------------------------------------------------------- */

static void test_published(void)
{
    ir_module *m = build_named("deepseek_v2_lite.json");
    if (m) {
        T_CHECK(ir_module_meta_int(m, "num_hidden_layers", -1) == 27);
        T_CHECK(!is_moe(m, 0) && is_moe(m, 1) && is_moe(m, 26));
        T_CHECK(layer_ops(m, 26, -1) == 4 + 21 + 12);
        WEIGHT(m, "l1.moe.experts.gate", IR_DTYPE_BF16, 3, 64, 1408, 2048,
               "model.layers.1.mlp.experts.{e}.gate_proj.weight", 64);
        WEIGHT(m, "l1.moe.shared.up_proj", IR_DTYPE_BF16, 2, 2816, 2048, 0,
               "model.layers.1.mlp.shared_experts.up_proj.weight", 0);
        WEIGHT(m, "l0.mlp.up_proj", IR_DTYPE_BF16, 2, 10944, 2048, 0,
               "model.layers.0.mlp.up_proj.weight", 0);
        WEIGHT(m, "l0.attn.q_proj", IR_DTYPE_BF16, 2, 16 * 192, 2048, 0,
               "model.layers.0.self_attn.q_proj.weight", 0);
        WEIGHT(m, "l0.attn.kv_b_proj", IR_DTYPE_BF16, 2, 16 * 256, 512, 0,
               "model.layers.0.self_attn.kv_b_proj.weight", 0);
        T_CHECK(iattr(m, "l1.moe.topk_ids", "top_k") == 6);
        /* dim 64, theta 1e4, orig 4096, factor 40, beta 32/1:
         *   low = floor(64*ln(4096/(32*2*pi))/(2*ln 1e4)) = 10
         *   high = ceil(64*ln(4096/(2*pi))/(2*ln 1e4)) = 23
         *   attn_factor = 1.0 (mscale == mscale_all_dim)
         *   scale = 192**-0.5 * (0.1*0.707*ln 40 + 1)**2 = 0.1147213867929261 */
        T_CHECK(fattr(m, "l5.attn.q_pe_rot", "yarn_low") == 10.0);
        T_CHECK(fattr(m, "l5.attn.q_pe_rot", "yarn_high") == 23.0);
        T_CHECK(fattr(m, "l5.attn.q_pe_rot", "attn_factor") == 1.0);
        T_CHECK(fattr(m, "l5.attn.q_pe_rot", "factor") == 40.0);
        T_CHECK(near(fattr(m, "l5.attn.ctx", "scale"), 0.1147213867929261));
        T_CHECK(ir_module_meta_int(m, "eos_token_id", -1) == 100001);
        T_CHECK(ir_module_meta_int(m, "max_position_embeddings", -1) == 163840);
    }
    ir_module_free(m);

    m = build_named("deepseek_v3.json");
    if (m) {
        T_CHECK(!is_moe(m, 2) && is_moe(m, 3) && is_moe(m, 60));
        T_CHECK(layer_ops(m, 60, -1) == 4 + 23 + 12);
        WEIGHT(m, "l3.attn.q_a_proj", IR_DTYPE_BF16, 2, 1536, 7168, 0,
               "model.layers.3.self_attn.q_a_proj.weight", 0);
        WEIGHT(m, "l3.attn.q_b_proj", IR_DTYPE_BF16, 2, 128 * 192, 1536, 0,
               "model.layers.3.self_attn.q_b_proj.weight", 0);
        WEIGHT(m, "l3.moe.router_bias", IR_DTYPE_F32, 1, 256, 0, 0,
               "model.layers.3.mlp.gate.e_score_correction_bias", 0);
        WEIGHT(m, "l3.moe.experts.down", IR_DTYPE_BF16, 3, 256, 7168, 2048,
               "model.layers.3.mlp.experts.{e}.down_proj.weight", 256);
        WEIGHT(m, "l2.mlp.gate_proj", IR_DTYPE_BF16, 2, 18432, 7168, 0,
               "model.layers.2.mlp.gate_proj.weight", 0);
        WEIGHT(m, "lm_head", IR_DTYPE_BF16, 2, 129280, 7168, 0, "lm_head.weight", 0);
        T_CHECK(!has(m, "l61.attn_norm")); /* the MTP layer is not built */
        T_CHECK(iattr(m, "l3.moe.topk_ids", "n_group") == 8);
        T_CHECK(iattr(m, "l3.moe.topk_ids", "topk_group") == 4);
        T_CHECK(iattr(m, "l3.moe.topk_ids", "top_k") == 8);
        T_CHECK(fattr(m, "l3.moe.topk_ids", "scaling") == 2.5);
        /* yarn as V2-Lite (low 10, high 23, attn_factor 1);
         * scale = 192**-0.5 * (0.1*1.0*ln 40 + 1)**2 = 0.1352337788608801 */
        T_CHECK(fattr(m, "l3.attn.k_pe_rot", "yarn_low") == 10.0);
        T_CHECK(fattr(m, "l3.attn.k_pe_rot", "yarn_high") == 23.0);
        T_CHECK(near(fattr(m, "l3.attn.ctx", "scale"), 0.1352337788608801));
    }
    ir_module_free(m);

    m = build_named("qwen3_30b_a3b.json");
    if (m) {
        T_CHECK(is_moe(m, 0) && is_moe(m, 47));
        T_CHECK(layer_ops(m, 47, -1) == 4 + 13 + 6);
        WEIGHT(m, "l0.attn.q_proj", IR_DTYPE_BF16, 2, 4096, 2048, 0,
               "model.layers.0.self_attn.q_proj.weight", 0);
        WEIGHT(m, "l0.attn.k_proj", IR_DTYPE_BF16, 2, 512, 2048, 0,
               "model.layers.0.self_attn.k_proj.weight", 0);
        WEIGHT(m, "l0.attn.o_proj", IR_DTYPE_BF16, 2, 2048, 4096, 0,
               "model.layers.0.self_attn.o_proj.weight", 0);
        WEIGHT(m, "l7.moe.experts.gate", IR_DTYPE_BF16, 3, 128, 768, 2048,
               "model.layers.7.mlp.experts.{e}.gate_proj.weight", 128);
        WEIGHT(m, "lm_head", IR_DTYPE_BF16, 2, 151936, 2048, 0, "lm_head.weight", 0);
        T_CHECK(iattr(m, "l0.moe.topk_ids", "top_k") == 8);
        T_CHECK(iattr(m, "l0.moe.topk_ids", "norm_topk_prob") == 1);
        T_CHECK(fattr(m, "l0.attn.q_rot", "theta") == 1e6);
        /* scale = 128**-0.5 = 0.08838834764831845 */
        T_CHECK(near(fattr(m, "l0.attn.ctx", "scale"), 0.08838834764831845));
        T_CHECK(ir_module_meta_int(m, "eos_token_id", -1) == 151645);
    }
    ir_module_free(m);
}

/* ---- fp8 block-scaled checkpoints ------------------------------------------- */

/* Weight `name` is f8e4m3 in blocks of b0 x b1, its scales bound like its
 * tensors to `scale` ({e} pattern when a stack). */
static void check_fp8(const ir_module *m, const char *name, int64_t b0, int64_t b1,
                      const char *scale, int line)
{
    t_checks++;
    const ir_value *v = ir_module_find_value(m, name);
    int ok = v && v->kind == IR_VALUE_WEIGHT && v->type.dtype == IR_DTYPE_F8E4M3 &&
             v->scale.block[0] == b0 && v->scale.block[1] == b1 && v->scale.bind.name &&
             !strcmp(v->scale.bind.name, scale) && v->scale.bind.kind == v->bind.kind &&
             v->scale.bind.count == v->bind.count;
    if (!ok) {
        t_failures++;
        fprintf(stderr, "%s:%d: weight %%%s is not f8e4m3 in [%lld, %lld] blocks scaled by %s\n",
                __FILE__, line, name, (long long)b0, (long long)b1, scale);
    }
}
#define FP8(m, name, scale) check_fp8(m, name, 128, 128, scale, __LINE__)

/* Weight `name` is not block-scaled and of dtype dt. */
static void check_plain(const ir_module *m, const char *name, ir_dtype dt, int line)
{
    t_checks++;
    const ir_value *v = ir_module_find_value(m, name);
    if (!v || v->kind != IR_VALUE_WEIGHT || v->type.dtype != dt || v->scale.block[0] ||
        v->scale.block[1] || v->scale.bind.name) {
        t_failures++;
        fprintf(stderr, "%s:%d: weight %%%s is not a plain %s weight\n", __FILE__, line, name,
                ir_dtype_name(dt));
    }
}
#define PLAIN(m, name, dt) check_plain(m, name, dt, __LINE__)

/* The number of block-scaled weights of m. */
static int n_scaled(const ir_module *m)
{
    int n = 0;
    for (int i = 0; i < m->n_values; i++)
        n += m->values[i]->kind == IR_VALUE_WEIGHT && m->values[i]->scale.block[0] > 0;
    return n;
}

#define FP8_QC                                                                                     \
    "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", "               \
    "\"weight_block_size\": [128, 128]}"

static void test_fp8(void)
{
    const char *ds = "deepseek_v3_fp8.json", *qw = "qwen3_moe_fp8.json";
    const char *skip = "quantization_config.modules_to_not_convert";

    /* DeepSeek-V3 as published: every linear of the layers in fp8, the rest
     * not; 2 layers x 5 attention projections, 3 dense + 3 shared MLP
     * linears, 3 expert stacks. */
    ir_module *m = build_ok_with(ds, "quantization_config", FP8_QC);
    if (m) {
        WEIGHT(m, "l0.attn.kv_a_proj", IR_DTYPE_F8E4M3, 2, 192, 320, 0,
               "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 0);
        FP8(m, "l0.attn.kv_a_proj", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv");
        FP8(m, "l0.attn.q_a_proj", "model.layers.0.self_attn.q_a_proj.weight_scale_inv");
        FP8(m, "l0.attn.q_b_proj", "model.layers.0.self_attn.q_b_proj.weight_scale_inv");
        FP8(m, "l1.attn.kv_b_proj", "model.layers.1.self_attn.kv_b_proj.weight_scale_inv");
        FP8(m, "l1.attn.o_proj", "model.layers.1.self_attn.o_proj.weight_scale_inv");
        FP8(m, "l0.mlp.down_proj", "model.layers.0.mlp.down_proj.weight_scale_inv");
        FP8(m, "l1.moe.shared.up_proj", "model.layers.1.mlp.shared_experts.up_proj.weight_scale_inv");
        WEIGHT(m, "l1.moe.experts.down", IR_DTYPE_F8E4M3, 3, 4, 320, 128,
               "model.layers.1.mlp.experts.{e}.down_proj.weight", 4);
        FP8(m, "l1.moe.experts.down", "model.layers.1.mlp.experts.{e}.down_proj.weight_scale_inv");
        FP8(m, "l1.moe.experts.gate", "model.layers.1.mlp.experts.{e}.gate_proj.weight_scale_inv");
        PLAIN(m, "embed_tokens", IR_DTYPE_BF16);
        PLAIN(m, "lm_head", IR_DTYPE_BF16);
        PLAIN(m, "l1.moe.router", IR_DTYPE_BF16);
        PLAIN(m, "l1.moe.router_bias", IR_DTYPE_F32);
        PLAIN(m, "l0.attn.kv_a_layernorm", IR_DTYPE_BF16);
        PLAIN(m, "norm", IR_DTYPE_BF16);
        T_CHECK(n_scaled(m) == 2 * 5 + 3 + 3 + 3);
        check_round_trip(m);
    }
    ir_module_free(m);
    m = build_named(ds); /* no quantization_config: nothing quantized */
    T_CHECK(m && n_scaled(m) == 0);
    if (m)
        PLAIN(m, "l0.attn.kv_a_proj", IR_DTYPE_BF16);
    ir_module_free(m);
    m = build_ok_with(ds, "quantization_config", "{\"quant_method\": \"fp8\"}");
    if (m) /* transformers' defaults: 128 x 128, dynamic */
        FP8(m, "l0.attn.o_proj", "model.layers.0.self_attn.o_proj.weight_scale_inv");
    ir_module_free(m);
    m = build_ok_with(ds, "quantization_config",
                      "{\"quant_method\": \"fp8\", \"activation_scheme\": \"Dynamic\", "
                      "\"weight_block_size\": [64, 32], \"ignored_layers\": null}");
    if (m)
        check_fp8(m, "l0.attn.o_proj", 64, 32, "model.layers.0.self_attn.o_proj.weight_scale_inv",
                  __LINE__);
    ir_module_free(m);

    /* Qwen3-FP8 lists modules it kept in bf16: the router, here an o_proj. */
    m = build_named(qw);
    if (m) {
        PLAIN(m, "l0.attn.o_proj", IR_DTYPE_BF16);
        FP8(m, "l1.attn.o_proj", "model.layers.1.self_attn.o_proj.weight_scale_inv");
        FP8(m, "l0.attn.k_proj", "model.layers.0.self_attn.k_proj.weight_scale_inv");
        FP8(m, "l0.mlp.gate_proj", "model.layers.0.mlp.gate_proj.weight_scale_inv");
        FP8(m, "l1.moe.experts.up", "model.layers.1.mlp.experts.{e}.up_proj.weight_scale_inv");
        PLAIN(m, "l1.moe.router", IR_DTYPE_BF16);
        PLAIN(m, "l0.attn.q_norm", IR_DTYPE_BF16);
        T_CHECK(n_scaled(m) == 2 * 4 - 1 + 3 + 3);
        check_round_trip(m);
    }
    ir_module_free(m);
    /* How entries name modules: a name at a dot ... */
    m = build_ok_with(qw, skip, "[\"o_proj\"]");
    if (m) {
        PLAIN(m, "l0.attn.o_proj", IR_DTYPE_BF16);
        PLAIN(m, "l1.attn.o_proj", IR_DTYPE_BF16);
        T_CHECK(n_scaled(m) == 2 * 3 + 3 + 3);
    }
    ir_module_free(m);
    /* ... a module holding others, with or without the dot ... */
    m = build_ok_with(qw, skip, "[\"model.layers.1\"]");
    if (m) {
        PLAIN(m, "l1.attn.q_proj", IR_DTYPE_BF16);
        PLAIN(m, "l1.moe.experts.down", IR_DTYPE_BF16);
        T_CHECK(n_scaled(m) == 4 + 3);
    }
    ir_module_free(m);
    m = build_ok_with(qw, skip, "[\"model.layers.0.\"]");
    T_CHECK(m && n_scaled(m) == 4 + 3);
    if (m)
        PLAIN(m, "l0.mlp.up_proj", IR_DTYPE_BF16);
    ir_module_free(m);
    /* ... the experts module of transformers 5 ... */
    m = build_ok_with(qw, skip, "[\"model.layers.1.mlp.experts\"]");
    if (m) {
        PLAIN(m, "l1.moe.experts.gate", IR_DTYPE_BF16);
        T_CHECK(n_scaled(m) == 2 * 4 + 3);
    }
    ir_module_free(m);
    /* ... never part of a name; and ignored_layers counts too. */
    m = build_ok_with(qw, skip, "[\"layers.1\", \"proj\", \"model.layers.1.self\"]");
    T_CHECK(m && n_scaled(m) == 2 * 4 + 3 + 3);
    ir_module_free(m);
    m = build_ok_with(qw, "quantization_config.ignored_layers", "[\"model.layers.0.mlp\"]");
    if (m) {
        PLAIN(m, "l0.mlp.down_proj", IR_DTYPE_BF16);
        PLAIN(m, "l0.attn.o_proj", IR_DTYPE_BF16);
        T_CHECK(n_scaled(m) == 2 * 4 - 1 + 3);
    }
    ir_module_free(m);

    const moec_status U = MOEC_ERR_UNSUPPORTED, F = MOEC_ERR_FORMAT;
    REJECT(ds, "quantization_config", "\"fp8\"", F,
           "deepseek_v3_fp8.json: field \"quantization_config\" must be an object");
    REJECT(ds, "quantization_config", "{}", F,
           "missing required field \"quantization_config.quant_method\"");
    REJECT(qw, "quantization_config.quant_method", "\"fbgemm_fp8\"", U,
           "qwen3_moe_fp8.json: field \"quantization_config.quant_method\" = \"fbgemm_fp8\" is "
           "not supported");
    REJECT(qw, "quantization_config.quant_method", "null", F,
           "field \"quantization_config.quant_method\" must be a string");
    REJECT(qw, "quantization_config.fmt", "\"e5m2\"", U,
           "field \"quantization_config.fmt\" = \"e5m2\" is not supported");
    REJECT(qw, "quantization_config.activation_scheme", "\"static\"", U,
           "field \"quantization_config.activation_scheme\" = \"static\" is not supported");
    REJECT(qw, "quantization_config.weight_block_size", "null", U,
           "field \"quantization_config.weight_block_size\" = null is not supported: moec reads "
           "block-scaled fp8");
    /* FineGrainedFP8Config's storage fields: ue8m0 scales held as F32
     * (DeepSeek-V3.1) are read as they are; fp4 experts and quantized
     * embeddings are refused by name. */
    m = build_ok_with(qw, "quantization_config.scale_fmt", "\"ue8m0\"");
    T_CHECK(m != NULL);
    ir_module_free(m);
    m = build_ok_with(qw, "quantization_config.modules_to_convert", "[]");
    T_CHECK(m != NULL);
    ir_module_free(m);
    REJECT(qw, "quantization_config.scale_fmt", "\"e4m3\"", U,
           "field \"quantization_config.scale_fmt\" = \"e4m3\" is not supported (\"float\" or "
           "\"ue8m0\": F32 block scales)");
    REJECT(qw, "quantization_config.expert_dtype", "\"fp4\"", U,
           "field \"quantization_config.expert_dtype\" = \"fp4\" is not supported (moec reads "
           "fp8 experts: \"fp8\")");
    REJECT(qw, "quantization_config.modules_to_convert", "[\"embed_tokens\"]", U,
           "field \"quantization_config.modules_to_convert\" = [...] is not supported: moec "
           "quantizes only the linears of the decoder layers, never embeddings");
    REJECT(qw, "quantization_config.weight_block_size", "[128]", F,
           "field \"quantization_config.weight_block_size\" must be a list of two integers");
    REJECT(qw, "quantization_config.weight_block_size", "[128, 1.5]", F,
           "field \"quantization_config.weight_block_size\" must be a list of two integers");
    REJECT(qw, "quantization_config.weight_block_size", "[0, 128]", U,
           "field \"quantization_config.weight_block_size\" = [0, ...] is not supported");
    /* beyond any integer type (the fuzzer's find: no cast of it) */
    REJECT(qw, "quantization_config.weight_block_size", "[128, 1.28889e+82]", U,
           "field \"quantization_config.weight_block_size\" = [1.28889e+82, ...] is not "
           "supported (block sizes must be in [1, ");
    REJECT(qw, skip, "\"lm_head\"", F,
           "field \"quantization_config.modules_to_not_convert\" must be a list of module names");
    REJECT(qw, skip, "[\"lm_head\", 3]", F,
           "field \"quantization_config.modules_to_not_convert\" item 1 must be a string");
    REJECT(qw, "quantization_config.ignored_layers", "[\"model.layers.*.mlp\"]", U,
           "field \"quantization_config.ignored_layers\" item 0 = \"model.layers.*.mlp\" is not "
           "supported");
    REJECT(qw, skip, "[\"model.layers.1.mlp.experts.0\"]", U,
           "name some of the experts \"model.layers.1.mlp.experts.{e}.gate_proj.weight\" but not "
           "others");
}

/* ---- rejections ---------------------------------------------------------------- */

static void test_rejections(void)
{
    const moec_status U = MOEC_ERR_UNSUPPORTED, F = MOEC_ERR_FORMAT;
    const char *v2 = "deepseek_v2_tiny.json", *v2q = "deepseek_v2_qlora.json";
    const char *v3 = "deepseek_v3_yarn_t4.json", *v3b = "deepseek_v3_yarn_t5.json";
    const char *q2 = "qwen2_moe_sparse.json", *q3 = "qwen3_moe_tied.json";

    REJECT(v2, "model_type", "\"llama\"", U, "\"llama\"");
    REJECT(v2, "model_type", NULL, F, "model_type");
    REJECT(v2, "hidden_act", "\"gelu\"", U, "hidden_act");
    REJECT(q3, "hidden_act", "\"relu\"", U,
           "field \"hidden_act\" = \"relu\" is not supported (moec supports \"silu\", also "
           "named \"swish\")");
    /* "swish" is SiLU in transformers' ACT2FN: the same module as "silu" */
    {
        ir_module *a = build_ok_with(v2, "hidden_act", "\"swish\"");
        ir_module *b = build_ok_with(v2, "hidden_act", "\"silu\"");
        T_CHECK(a && b && a->n_ops == b->n_ops && layer_ops(a, 1, IR_OP_SILU) >= 1 &&
                layer_ops(a, 1, IR_OP_SILU) == layer_ops(b, 1, IR_OP_SILU));
        ir_module_free(a);
        ir_module_free(b);
    }
    REJECT(v3, "quantization_config", "{\"quant_method\": \"gptq\"}", U,
           "quantization_config.quant_method");
    REJECT(v2, "use_mla", "false", U, "use_mla");
    REJECT(v2, "torch_dtype", "\"float8_e4m3fn\"", U, "torch_dtype");
    REJECT(v3b, "dtype", "\"int8\"", U, "dtype");
    REJECT(v2, "num_key_value_heads", "2", U, "num_key_value_heads");
    REJECT(q2, "num_key_value_heads", "3", U, "num_key_value_heads");
    REJECT(q3, "num_key_value_heads", "8", U, "num_key_value_heads");

    /* RoPE types and fields. */
    REJECT(v2, "rope_scaling.type", "\"dynamic\"", U, "rope_scaling.type");
    REJECT(v2, "rope_scaling.type", "\"llama3\"", U, "rope_scaling.type");
    REJECT(v2, "rope_scaling.type", "\"longrope\"", U, "\"longrope\"");
    REJECT(v3b, "rope_parameters.rope_type", "\"longrope\"", U, "rope_parameters.rope_type");
    REJECT(v3b, "rope_parameters.rope_type", "\"dynamic\"", U, "rope_parameters.rope_type");
    REJECT(v2, "rope_scaling.factor", NULL, F, "rope_scaling.factor");
    REJECT(v2, "rope_scaling.factor", "\"4\"", F, "rope_scaling.factor");
    REJECT(v2, "rope_scaling.factor", "-1", U, "rope_scaling.factor");
    REJECT(v2, "rope_scaling.truncate", "1", F, "rope_scaling.truncate");
    /* The type is judged before the other fields. */
    REJECT(v2, "rope_scaling", "{\"type\": \"dynamic\", \"factor\": \"x\"}", U,
           "rope_scaling.type");
    /* factor null is computed for the frequencies, but DeepSeek's softmax
     * scale needs it when mscale_all_dim is set. */
    REJECT(v2, "rope_scaling.factor", "null", U, "rope_scaling.factor");
    REJECT(v2, "rope_scaling", "{\"type\": \"linear\"}", F, "rope_scaling.factor");
    REJECT(v2, "rope_scaling", "[1]", F, "rope_scaling");
    REJECT(v2, "rope_theta", "\"big\"", F, "rope_theta");
    REJECT(v2, "rope_theta", "0", U, "rope_theta");
    REJECT(q3, "partial_rotary_factor", "0.5", U, "partial_rotary_factor");
    REJECT(v3b, "rope_parameters.partial_rotary_factor", "0.25", U,
           "rope_parameters.partial_rotary_factor");
    REJECT(q3, "head_dim", "25", U, "odd");
    REJECT(v2, "qk_rope_head_dim", "7", U, "odd");
    REJECT(q2, "rope_parameters", "{\"full_attention\": {\"rope_type\": \"default\"}}", U,
           "rope_parameters.full_attention");

    /* DeepSeek routing. */
    REJECT(v3, "scoring_func", "\"softmax\"", U, "scoring_func");
    REJECT(v3, "topk_method", "\"greedy\"", U, "topk_method");
    REJECT(v2, "scoring_func", "\"sigmoid\"", U, "scoring_func");
    REJECT(v2, "topk_method", "\"noaux_tc\"", U, "topk_method");
    REJECT(v2, "topk_method", "null", U, "topk_method");
    REJECT(v2q, "n_group", "null", U, "n_group");
    REJECT(v2q, "n_group", "3", U, "n_group");
    REJECT(v2q, "topk_group", "1", U, "topk_group");
    REJECT(v2q, "topk_group", "5", U, "topk_group");
    REJECT(v3, "n_group", "16", U, "n_group");
    REJECT(v3, "n_group", "null", F, "n_group");
    REJECT(v3, "num_experts_per_tok", "17", U, "num_experts_per_tok");
    REJECT(v3, "num_experts_per_tok", "0", U, "num_experts_per_tok");
    REJECT(v3, "n_routed_experts", NULL, F, "n_routed_experts");
    REJECT(v3b, "num_local_experts", "10", U, "n_group"); /* 10 experts in 4 groups */
    REJECT(v3, "num_local_experts", "8", F, "num_local_experts");
    REJECT(v3, "moe_layer_freq", "0", U, "moe_layer_freq");
    REJECT(v3, "first_k_dense_replace", "null", F, "first_k_dense_replace");
    REJECT(v3, "first_k_dense_replace", "-1", U, "first_k_dense_replace");
    REJECT(v2, "hidden_size", "66", U, "hidden_size"); /* not a multiple of 4 heads (V2) */

    /* Missing and mistyped fields. */
    REJECT(v2, "hidden_size", NULL, F, "hidden_size");
    REJECT(v2, "hidden_size", "\"64\"", F, "hidden_size");
    REJECT(v2, "hidden_size", "64.5", F, "hidden_size");
    REJECT(v2, "hidden_size", "0", U, "hidden_size");
    REJECT(v2, "num_hidden_layers", "100000", U, "num_hidden_layers");
    REJECT(v2, "vocab_size", NULL, F, "deepseek_v2_tiny.json");
    REJECT(v2, "q_lora_rank", NULL, F, "q_lora_rank");
    REJECT(v2, "kv_lora_rank", NULL, F, "kv_lora_rank");
    REJECT(v2, "v_head_dim", "null", F, "v_head_dim");
    REJECT(v2, "tie_word_embeddings", "1", F, "tie_word_embeddings");
    REJECT(v2, "rms_norm_eps", "null", F, "rms_norm_eps");
    REJECT(v2, "eos_token_id", "\"x\"", F, "eos_token_id");
    REJECT(v2, "eos_token_id", "[\"x\"]", F, "field \"eos_token_id[0]\" must be an integer");
    REJECT(v2, "eos_token_id", "[1, 2.5]", F, "field \"eos_token_id[1]\" must be an integer");
    /* Every eos id must be a token: [0, vocab_size 256). */
    REJECT(v2, "eos_token_id", "256", F,
           "deepseek_v2_tiny.json: field \"eos_token_id\" = 256 is not a token id (vocab_size is "
           "256)");
    REJECT(v2, "eos_token_id", "[1, 2, 1e30]", F,
           "deepseek_v2_tiny.json: field \"eos_token_id[2]\" = 1e+30 is not a token id "
           "(vocab_size is 256)");
    REJECT(v2, "eos_token_id", "[-1]", F, "field \"eos_token_id[0]\" = -1 is not a token id");
    /* Integers are range-checked as the file writes them, never wrapped. */
    REJECT(v2, "hidden_size", "1e30", U,
           "deepseek_v2_tiny.json: field \"hidden_size\" = 1e+30 is out of range (must be in "
           "[1, 16777216])");
    REJECT(v2, "max_position_embeddings", "-1e30", U,
           "field \"max_position_embeddings\" = -1e+30 is out of range");
    REJECT(v2, "n_shared_experts", "9007199254740994", U,
           "field \"n_shared_experts\" = 9007199254740994 is out of range");
    REJECT(q3, "moe_intermediate_size", NULL, F, "moe_intermediate_size");
    REJECT(q2, "shared_expert_intermediate_size", NULL, F, "shared_expert_intermediate_size");
    REJECT(q2, "num_experts", NULL, F, "num_experts");
    REJECT(q2, "mlp_only_layers", "\"3\"", F, "mlp_only_layers");
    REJECT(q2, "mlp_only_layers", "[1.5]", F, "mlp_only_layers");
    REJECT(q2, "decoder_sparse_step", "0", U, "decoder_sparse_step");
    REJECT(q2, "qkv_bias", "\"yes\"", F, "qkv_bias");
    REJECT(q3, "head_dim", "null", F, "head_dim");

    /* Sliding windows the reference cannot apply. */
    REJECT(q2, "sliding_window", "null", U, "sliding_window");
    REJECT(q2, "layer_types", "[\"full_attention\"]", F, "layer_types");
    REJECT(q2, "layer_types",
           "[\"sliding_attention\", \"full_attention\", \"full_attention\", \"full_attention\", "
           "\"full_attention\", \"chunked_attention\"]",
           U, "layer_types");
    {
        ir_module *m = NULL;
        char *text = config_text(q2);
        cJSON *root = cJSON_Parse(text);
        free(text);
        cJSON_ReplaceItemInObjectCaseSensitive(root, "use_sliding_window", cJSON_CreateFalse());
        cJSON_AddItemToObject(root, "layer_types",
                              cJSON_Parse("[\"sliding_attention\", \"full_attention\", "
                                          "\"full_attention\", \"full_attention\", "
                                          "\"full_attention\", \"full_attention\"]"));
        char *out = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        T_ERR(fe_config_build(out, q2, &m), MOEC_ERR_UNSUPPORTED, "use_sliding_window");
        T_CHECK(m == NULL);
        free(out);
    }

    /* Not JSON, not an object, NULL arguments, missing files. */
    ir_module *m = NULL;
    T_ERR(fe_config_build("{\"model_type\": ", "broken.json", &m), MOEC_ERR_FORMAT, "broken.json");
    T_ERR(fe_config_build("[1, 2]", "list.json", &m), MOEC_ERR_FORMAT, "list.json");
    T_ERR(fe_config_build("{} trailing", "trail.json", &m), MOEC_ERR_FORMAT, "trail.json");
    T_ERR(fe_config_build(NULL, "x", &m), MOEC_ERR_INVALID_ARG, NULL);
    T_CHECK(m == NULL);
    T_ERR(fe_model_load("/nonexistent/moec-model", &m), MOEC_ERR_IO,
          "/nonexistent/moec-model/config.json");
    T_CHECK(m == NULL);
}

/* A key written twice, at any depth, is refused by name: cJSON would take
 * the first, transformers (Python's json) the last. */
static void test_duplicate_keys(void)
{
    const moec_status F = MOEC_ERR_FORMAT;
    char *text = config_text("deepseek_v2_tiny.json");
    size_t n = strlen(text);
    char *dup = malloc(n + 64);
    ir_module *m = NULL;
    /* hidden_size 32 before the config's 64 */
    snprintf(dup, n + 64, "{\"hidden_size\": 32, %s", text + 1);
    T_ERR(fe_config_build(dup, "dup.json", &m), F, "dup.json: key \"hidden_size\" appears twice");
    T_CHECK(m == NULL);
    /* inside rope_scaling */
    const char *rs = strstr(text, "\"rope_scaling\": {");
    T_CHECK(rs != NULL);
    if (rs) {
        size_t at = (size_t)(rs - text) + strlen("\"rope_scaling\": {");
        snprintf(dup, n + 64, "%.*s\"factor\": 2, %s", (int)at, text, text + at);
        T_ERR(fe_config_build(dup, "dup.json", &m), F,
              "dup.json: key \"rope_scaling.factor\" appears twice");
        T_CHECK(m == NULL);
    }
    /* in an object inside a list */
    T_ERR(fe_config_build("{\"a\": [1, {\"b\": 1, \"b\": 2}], \"model_type\": \"x\"}",
                          "list.json", &m),
          F, "list.json: key \"a[1].b\" appears twice");
    /* many keys (sorted, not pairwise): the 40th written twice */
    char many[2048] = "{";
    for (int i = 0; i < 60; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "\"k%d\": %d, ", i, i);
    snprintf(many + strlen(many), sizeof many - strlen(many), "\"k40\": 1}");
    T_ERR(fe_config_build(many, "many.json", &m), F, "many.json: key \"k40\" appears twice");
    T_CHECK(m == NULL);
    free(dup);
    free(text);
}

/* Writes text to dir/name. */
static void write_in(const char *dir, const char *name, const char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    t_write_file(path, text, strlen(text));
}

/* The eos ids of a model folder: generation_config.json's when it sets
 * eos_token_id, else config.json's; each checked; the file named. */
static void test_generation_config(void)
{
    const char *dir = t_tmpdir("fe_gen");
    char cfg[4200], gen[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(gen, sizeof gen, "%s/generation_config.json", dir);
    char *text = config_text("deepseek_v2_qlora.json"); /* eos [7, 9], vocab 256 */
    t_write_file(cfg, text, strlen(text));
    free(text);
    ir_module *m = NULL;
    const int64_t *eos;

    write_in(dir, "generation_config.json", "{\"eos_token_id\": [3, 4, 5], \"do_sample\": false}");
    T_OK(fe_model_load(dir, &m));
    T_CHECK(m && ir_module_meta_ints(m, "eos_token_id", &eos) == 3 && eos[0] == 3 &&
            eos[2] == 5);
    ir_module_free(m);
    write_in(dir, "generation_config.json", "{\"eos_token_id\": 11}");
    T_OK(fe_model_load(dir, &m));
    T_CHECK(m && ir_module_meta_int(m, "eos_token_id", -1) == 11);
    ir_module_free(m);
    /* absent or null in the generation config: config.json's */
    write_in(dir, "generation_config.json", "{\"eos_token_id\": null, \"bos_token_id\": 0}");
    T_OK(fe_model_load(dir, &m));
    T_CHECK(m && ir_module_meta_ints(m, "eos_token_id", &eos) == 2 && eos[0] == 7 && eos[1] == 9);
    ir_module_free(m);

    m = NULL;
    char want[4400];
    write_in(dir, "generation_config.json", "{\"eos_token_id\": [1, 300]}");
    snprintf(want, sizeof want,
             "%s: field \"eos_token_id[1]\" = 300 is not a token id (vocab_size is 256)", gen);
    T_ERR(fe_model_load(dir, &m), MOEC_ERR_FORMAT, want);
    write_in(dir, "generation_config.json", "{\"eos_token_id\": 1, \"eos_token_id\": 2}");
    snprintf(want, sizeof want, "%s: key \"eos_token_id\" appears twice", gen);
    T_ERR(fe_model_load(dir, &m), MOEC_ERR_FORMAT, want);
    write_in(dir, "generation_config.json", "[1]");
    snprintf(want, sizeof want, "%s: the generation config must be a JSON object", gen);
    T_ERR(fe_model_load(dir, &m), MOEC_ERR_FORMAT, want);
    write_in(dir, "generation_config.json", "{\"eos_token_id\": ");
    snprintf(want, sizeof want, "%s: not valid JSON", gen);
    T_ERR(fe_model_load(dir, &m), MOEC_ERR_FORMAT, want);
    T_CHECK(m == NULL);

    /* A FIFO in place of either file is refused at once, never read. */
    remove(gen);
    T_CHECK(mkfifo(gen, 0600) == 0);
    snprintf(want, sizeof want, "%s is not a regular file (it is a FIFO)", gen);
    T_ERR(fe_model_load(dir, &m), MOEC_ERR_IO, want);
    remove(gen);
    remove(cfg);
    T_CHECK(mkfifo(cfg, 0600) == 0);
    snprintf(want, sizeof want, "%s is not a regular file (it is a FIFO)", cfg);
    T_ERR(fe_model_load(dir, &m), MOEC_ERR_IO, want);
    T_ERR(fe_config_load(cfg, &m), MOEC_ERR_IO, want);
    remove(cfg);
    /* A directory in place of config.json */
    T_CHECK(mkdir(cfg, 0700) == 0);
    snprintf(want, sizeof want, "%s is not a regular file (it is a directory)", cfg);
    T_ERR(fe_model_load(dir, &m), MOEC_ERR_IO, want);
    rmdir(cfg);
    /* A NUL byte cuts what cJSON sees: refused, not read as the text before it. */
    t_write_file(cfg, "{}\0{", 4);
    snprintf(want, sizeof want, "%s: not valid JSON (a NUL byte at byte 2)", cfg);
    T_ERR(fe_model_load(dir, &m), MOEC_ERR_FORMAT, want);
    T_CHECK(m == NULL);
    remove(cfg);
    remove(dir);
}

/* fe_model_load reads <dir>/config.json and names it in errors. */
static void test_model_load(void)
{
    const char *dir = t_tmpdir("fe");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = config_text("qwen3_moe_tied.json");
    t_write_file(path, text, strlen(text));
    free(text);
    ir_module *m = NULL;
    T_OK(fe_model_load(dir, &m));
    T_CHECK(m && strcmp(m->name, "qwen3_moe") == 0);
    ir_module_free(m);

    const char *bad = "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 16}";
    t_write_file(path, bad, strlen(bad));
    m = NULL;
    T_ERR(fe_model_load(dir, &m), MOEC_ERR_FORMAT, path);
    T_CHECK(m == NULL);
    remove(path);
    remove(dir);

    /* moec_model_tensor_info's refusals name what is wrong */
    const char *tiny;
    moec_model_t *mm = t_open_tiny("qwen3_moe", &tiny);
    moec_tensor_info ti;
    T_CHECK(mm && moec_model_tensor_count(mm) == 79);
    T_OK(moec_model_tensor_info(mm, 78, &ti));
    T_ERR(moec_model_tensor_info(mm, 79, &ti), MOEC_ERR_INVALID_ARG,
          "tensor index 79 out of range [0, 79)");
    T_ERR(moec_model_tensor_info(mm, -1, &ti), MOEC_ERR_INVALID_ARG,
          "tensor index -1 out of range [0, 79)");
    T_ERR(moec_model_tensor_info(mm, 0, NULL), MOEC_ERR_INVALID_ARG,
          "moec_model_tensor_info: NULL out");
    T_ERR(moec_model_tensor_info(NULL, 0, &ti), MOEC_ERR_INVALID_ARG,
          "moec_model_tensor_info: NULL model");
    moec_model_free(mm);
}

int main(void)
{
    test_deepseek_v2();
    test_deepseek_v2_qlora();
    test_deepseek_v3();
    test_deepseek_placement();
    test_qwen2_moe();
    test_qwen3_moe();
    test_rope_variants();
    test_published();
    test_fp8();
    test_rejections();
    test_duplicate_keys();
    test_generation_config();
    test_model_load();
    return t_finish("test_frontend");
}
