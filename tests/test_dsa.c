/* test_dsa.c — DeepSeek-V3.2 (deepseek_v32) on the CPU: the frontend's
 * indexer and mlp_layer_types, the config and checkpoint errors it names,
 * the verifier on the DSA ops, the interpreter's layer_norm, dsa_topk and
 * attention over a token selection (against sums written out here), every
 * pass keeping the tiny model's function with the fusions it promises, and
 * that sparsity decides the output: the tiny model (index_topk 8) with
 * index_topk past its context gives exactly the logits of the same weights
 * run as dense DeepSeek-V3 MLA, and with index_topk 8 differs once the
 * context is longer than 8. Last, the margin at the top-k boundary on the
 * golden's prompt, so that its transformers golden cannot hinge on a
 * near-tie. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "passlib.h"
#include "runtime/interp.h"
#include "runtime/weights.h"
#include "testlib.h"

#define TINY "tests/data/deepseek_v32"

/* ---- helpers --------------------------------------------------------------- */

static cJSON *tiny_config(void)
{
    char *text = t_read_file(t_src(TINY "/config.json"), NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) {
        fprintf(stderr, "cannot parse %s/config.json\n", TINY);
        exit(2);
    }
    return root;
}

static void set_item(cJSON *root, const char *key, cJSON *value)
{
    if (cJSON_GetObjectItem(root, key))
        cJSON_ReplaceItemInObject(root, key, value);
    else
        cJSON_AddItemToObject(root, key, value);
}

/* The tiny config with key set to the JSON text `json` (NULL: removed),
 * built; the status, and the module in *out (freed by the caller). */
static moec_status build_with(const char *key, const char *json, ir_module **out)
{
    cJSON *root = tiny_config();
    if (!json)
        cJSON_DeleteItemFromObject(root, key);
    else
        set_item(root, key, cJSON_Parse(json));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    *out = NULL;
    moec_status st = fe_config_build(text, "config.json", out);
    free(text);
    return st;
}

/* Expects the tiny config with key = json to fail with st and needle. */
static void config_error(const char *key, const char *json, moec_status st, const char *needle)
{
    ir_module *m = NULL;
    T_ERR(build_with(key, json, &m), st, needle);
    ir_module_free(m);
}

/* A model directory: the tiny checkpoint under a config edited as given
 * (pairs of key, JSON text; NULL text: removed). */
static const char *model_dir(const char *tag, const char *const *edits, int n)
{
    const char *dir = t_tmpdir(tag);
    cJSON *root = tiny_config();
    for (int i = 0; i < n; i++) {
        if (!edits[2 * i + 1])
            cJSON_DeleteItemFromObject(root, edits[2 * i]);
        else
            set_item(root, edits[2 * i], cJSON_Parse(edits[2 * i + 1]));
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    t_write_file(path, text, strlen(text));
    free(text);
    size_t len;
    char *st = t_read_file(t_src(TINY "/model.safetensors"), &len);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    t_write_file(path, st, len);
    free(st);
    return dir;
}

static const ir_op *def_op(const ir_module *m, const char *name)
{
    const ir_value *v = ir_module_find_value(m, name);
    return v && v->kind == IR_VALUE_OP ? v->def : NULL;
}

/* ---- frontend --------------------------------------------------------------- */

static void test_frontend(void)
{
    ir_module *m = NULL;
    T_OK(fe_model_load(t_src(TINY), &m));
    if (!m)
        return;
    T_CHECK(!strcmp(m->name, "deepseek_v32"));
    T_CHECK(t_count_ops(m, IR_OP_DSA_TOPK) == 3 && t_count_ops(m, IR_OP_LAYER_NORM) == 3);
    const ir_op *tk = def_op(m, "l1.attn.indexer.topk");
    T_CHECK(tk && tk->kind == IR_OP_DSA_TOPK && ir_op_attr_int(tk, "top_k", 0) == 8);
    T_CHECK(tk && ir_op_attr_float(tk, "scale", 0) == 0.25);               /* 16^-0.5 */
    T_CHECK(tk && fabs(ir_op_attr_float(tk, "weight_scale", 0) - sqrt(0.125)) < 1e-15); /* 8^-0.5 */
    T_CHECK(tk && tk->out[0]->type.dtype == IR_DTYPE_I32 && tk->out[0]->type.dims[1] == 8);
    const ir_op *at = def_op(m, "l1.attn.ctx");
    T_CHECK(at && at->kind == IR_OP_ATTENTION && at->n_in == 5 && tk && at->in[4] == tk->out[0]);
    /* the indexer's RoPE: the MLA's parameters, half-split, on 8 of 16 channels */
    const ir_op *qr = def_op(m, "l1.attn.indexer.q_rot"), *mr = def_op(m, "l1.attn.q_pe_rot");
    T_CHECK(qr && mr && !strcmp(ir_op_attr_str(qr, "style", ""), "neox") &&
            !strcmp(ir_op_attr_str(mr, "style", ""), "interleave"));
    T_CHECK(qr && mr && ir_op_attr_float(qr, "yarn_high", -1) == ir_op_attr_float(mr, "yarn_high", 0) &&
            ir_op_attr_float(qr, "factor", -1) == 4.0 && qr->out[0]->type.dims[2] == 16 &&
            ir_op_attr_int(qr, "rotary_dim", 0) == 8 && !ir_op_attr(mr, "rotary_dim"));
    const ir_op *kr = def_op(m, "l1.attn.indexer.k3_rot");
    T_CHECK(kr && kr->kind == IR_OP_ROPE && ir_op_attr_int(kr, "rotary_dim", 0) == 8 &&
            tk && tk->in[0] == qr->out[0]);
    const ir_op *ln = def_op(m, "l1.attn.indexer.k_normed");
    T_CHECK(ln && ln->kind == IR_OP_LAYER_NORM && ir_op_attr_float(ln, "eps", 0) == 1e-6);
    const ir_value *wp = ir_module_find_value(m, "l2.attn.indexer.weights_proj");
    T_CHECK(wp && wp->kind == IR_VALUE_WEIGHT && wp->type.dims[0] == 8 && wp->type.dims[1] == 64 &&
            !strcmp(wp->bind.name, "model.layers.2.self_attn.indexer.weights_proj.weight"));
    const ir_value *wq = ir_module_find_value(m, "l0.attn.indexer.wq_b");
    T_CHECK(wq && wq->type.dims[0] == 128 && wq->type.dims[1] == 24);
    /* mlp_layer_types ["sparse", "dense", "sparse"] over first_k_dense_replace 1 */
    T_CHECK(def_op(m, "l0.moe.routed") && !def_op(m, "l0.mlp.out"));
    T_CHECK(def_op(m, "l1.mlp.out") && !def_op(m, "l1.moe.routed"));
    T_CHECK(def_op(m, "l2.moe.routed"));
    ir_module_free(m);

    /* without mlp_layer_types: first_k_dense_replace dense layers, moe_layer_freq unread */
    T_OK(build_with("mlp_layer_types", NULL, &m));
    T_CHECK(m && def_op(m, "l0.mlp.out") && def_op(m, "l1.moe.routed") && def_op(m, "l2.moe.routed"));
    ir_module_free(m);
    cJSON *root = tiny_config();
    cJSON_DeleteItemFromObject(root, "mlp_layer_types");
    set_item(root, "moe_layer_freq", cJSON_CreateNumber(2));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    T_OK(fe_config_build(text, "config.json", &m));
    T_CHECK(m && def_op(m, "l1.moe.routed"));
    free(text);
    ir_module_free(m);
    /* the class defaults: index_topk 2048 (here at most max_position_embeddings
       512), index_n_heads 64, index_head_dim 128 */
    cJSON *r2 = tiny_config();
    cJSON_DeleteItemFromObject(r2, "index_topk");
    cJSON_DeleteItemFromObject(r2, "index_n_heads");
    cJSON_DeleteItemFromObject(r2, "index_head_dim");
    text = cJSON_Print(r2);
    cJSON_Delete(r2);
    T_OK(fe_config_build(text, "config.json", &m));
    free(text);
    tk = m ? def_op(m, "l0.attn.indexer.topk") : NULL;
    T_CHECK(tk && ir_op_attr_int(tk, "top_k", 0) == 512 && tk->in[0]->type.dims[1] == 64 &&
            tk->in[0]->type.dims[2] == 128);
    ir_module_free(m);
    /* index_head_dim == qk_rope_head_dim: every channel rotated */
    T_OK(build_with("index_head_dim", "8", &m));
    T_CHECK(m && def_op(m, "l0.attn.indexer.q_rot") &&
            !ir_op_attr(def_op(m, "l0.attn.indexer.q_rot"), "rotary_dim"));
    ir_module_free(m);
    /* layer_types naming DSA everywhere is accepted, by either of its names
       (transformers 5.24 writes "indexed_attention"); rope_interleave is not
       read */
    T_OK(build_with("layer_types",
                    "[\"deepseek_sparse_attention\", \"deepseek_sparse_attention\", "
                    "\"deepseek_sparse_attention\"]",
                    &m));
    ir_module_free(m);
    m = NULL;
    T_OK(build_with("layer_types",
                    "[\"indexed_attention\", \"deepseek_sparse_attention\", "
                    "\"indexed_attention\"]",
                    &m));
    T_CHECK(m && def_op(m, "l2.attn.indexer.topk"));
    ir_module_free(m);
    T_OK(build_with("rope_interleave", "false", &m));
    T_CHECK(m && !strcmp(ir_op_attr_str(def_op(m, "l0.attn.q_pe_rot"), "style", ""), "interleave"));
    ir_module_free(m);
    /* the published V3.2 config (bf16 form) */
    T_OK(fe_config_load(t_src("tests/data/configs/deepseek_v32.json"), &m));
    tk = m ? def_op(m, "l60.attn.indexer.topk") : NULL;
    T_CHECK(tk && ir_op_attr_int(tk, "top_k", 0) == 2048 && tk->in[0]->type.dims[1] == 64 &&
            tk->in[0]->type.dims[2] == 128);
    T_CHECK(m && def_op(m, "l2.mlp.out") && def_op(m, "l3.moe.routed"));
    ir_module_free(m);
}

/* An fp8 V3.2 (as DeepSeek publishes it): the indexer's wq_b and wk are
 * block-scaled like every attention projection, weights_proj is not (the
 * checkpoint holds it in bf16); fuse_qkv_a joins q_a, kv_a and wk, and
 * leaves the bf16 weights_proj its own GEMM. */
static void test_fp8(void)
{
    ir_module *m = NULL;
    T_OK(build_with("quantization_config",
                    "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": "
                    "\"dynamic\", \"weight_block_size\": [8, 8]}",
                    &m));
    if (!m)
        return;
    const ir_value *wq = ir_module_find_value(m, "l0.attn.indexer.wq_b"),
                   *wk = ir_module_find_value(m, "l0.attn.indexer.wk"),
                   *wp = ir_module_find_value(m, "l0.attn.indexer.weights_proj");
    T_CHECK(wq && wq->type.dtype == IR_DTYPE_F8E4M3 && wq->scale.block[0] == 8 &&
            !strcmp(wq->scale.bind.name, "model.layers.0.self_attn.indexer.wq_b.weight_scale_inv"));
    T_CHECK(wk && wk->type.dtype == IR_DTYPE_F8E4M3);
    T_CHECK(wp && wp->type.dtype == IR_DTYPE_BF16 && wp->scale.block[0] == 0);
    T_OK(pass_run_pipeline(m, NULL, "fuse_qkv_a", NULL, NULL, NULL));
    const ir_value *qkv = ir_module_find_value(m, "l0.attn.qkv_a_proj");
    T_CHECK(qkv && qkv->type.dtype == IR_DTYPE_F8E4M3 && qkv->bind.n_parts == 3 &&
            qkv->scale.bind.n_parts == 3);
    const ir_op *w = def_op(m, "l0.attn.indexer.weights");
    T_CHECK(w && w->kind == IR_OP_LINEAR && w->in[1] == wp);
    ir_module_free(m);
}

/* ---- bad input -------------------------------------------------------------- */

static void test_config_errors(void)
{
    config_error("index_topk", "0", MOEC_ERR_UNSUPPORTED,
                 "config.json: field \"index_topk\" = 0 is out of range (must be at least 1)");
    config_error("index_topk", "-3", MOEC_ERR_UNSUPPORTED,
                 "field \"index_topk\" = -3 is out of range (must be at least 1)");
    config_error("index_topk", "2.5", MOEC_ERR_FORMAT, "field \"index_topk\" must be an integer");
    config_error("index_topk", "null", MOEC_ERR_FORMAT, "field \"index_topk\" must be an integer");
    config_error("index_head_dim", "4", MOEC_ERR_UNSUPPORTED,
                 "config.json: field \"index_head_dim\" = 4 is smaller than qk_rope_head_dim (8)");
    /* found by fuzz_config: an odd head dim reached the rope op's verifier
       as an invalid-argument error instead of being refused by name */
    config_error("index_head_dim", "15", MOEC_ERR_UNSUPPORTED,
                 "config.json: field \"index_head_dim\" = 15 is odd: moec's rope op rotates heads "
                 "of an even size");
    config_error("index_head_dim", "0", MOEC_ERR_UNSUPPORTED,
                 "field \"index_head_dim\" = 0 is out of range (must be in [1,");
    config_error("index_n_heads", "0", MOEC_ERR_UNSUPPORTED,
                 "field \"index_n_heads\" = 0 is out of range (must be in [1,");
    config_error("q_lora_rank", "null", MOEC_ERR_UNSUPPORTED,
                 "field \"q_lora_rank\" = null is not supported for deepseek_v32");
    config_error("mlp_layer_types", "[\"dense\", \"sparse\"]", MOEC_ERR_UNSUPPORTED,
                 "field \"mlp_layer_types\" = [...] must be a list of num_hidden_layers (3) "
                 "strings");
    config_error("mlp_layer_types", "[\"dense\", \"moe\", \"dense\"]", MOEC_ERR_UNSUPPORTED,
                 "field \"mlp_layer_types[1]\" = \"moe\" is not supported (\"dense\" or \"sparse\")");
    config_error("mlp_layer_types", "[\"dense\", 3, \"dense\"]", MOEC_ERR_FORMAT,
                 "field \"mlp_layer_types[1]\" must be a string, got a number (3)");
    config_error("layer_types", "[\"deepseek_sparse_attention\", \"full_attention\", "
                                "\"deepseek_sparse_attention\"]",
                 MOEC_ERR_UNSUPPORTED,
                 "field \"layer_types[1]\" = \"full_attention\" is not supported "
                 "(deepseek_v32 layers are \"indexed_attention\", also named "
                 "\"deepseek_sparse_attention\")");
    config_error("layer_types", "\"all\"", MOEC_ERR_UNSUPPORTED,
                 "field \"layer_types\" = \"all\" must be a list of num_hidden_layers (3) strings");
    config_error("n_routed_experts", "null", MOEC_ERR_UNSUPPORTED,
                 "field \"mlp_layer_types[0]\" is \"sparse\", but the model has no routed experts");
}

/* A checkpoint missing one indexer tensor: the tensor is named, whichever
 * way the model is run. */
static void test_missing_tensor(void)
{
    const char *dir = model_dir("dsa-missing", NULL, 0);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    char *st = t_read_file(path, &len);
    uint64_t hlen = 0;
    memcpy(&hlen, st, 8);
    /* rename the tensor inside the JSON header (same length, offsets kept) */
    const char *name = "model.layers.1.self_attn.indexer.wk.weight";
    char *at = NULL;
    for (size_t i = 8; i + strlen(name) < 8 + hlen && !at; i++)
        if (!memcmp(st + i, name, strlen(name)))
            at = st + i;
    T_CHECK(at != NULL);
    if (at)
        at[strlen("model.layers.1.self_attn.indexer.w")] = 'z';
    t_write_file(path, st, len);
    free(st);
    ir_module *m = NULL;
    T_OK(fe_model_load(dir, &m));
    rt_weights *w = NULL;
    if (m)
        T_ERR(rt_weights_open(m, dir, &w), MOEC_ERR_MISMATCH,
              "weight %l1.attn.indexer.wk: tensor 'model.layers.1.self_attn.indexer.wk.weight' "
              "not found in");
    rt_weights_free(w);
    if (m)
        T_OK(pass_run_pipeline(m, NULL, NULL, NULL, NULL, NULL));
    if (m)
        T_ERR(rt_weights_open(m, dir, &w), MOEC_ERR_MISMATCH,
              "weight %l1.attn.qkv_a_proj: tensor 'model.layers.1.self_attn.indexer.wk.weight' not found in");
    rt_weights_free(w);
    ir_module_free(m);
    moec_model_t *model = NULL;
    moec_session_t *s = NULL;
    T_OK(moec_model_open(dir, &model));
    if (model)
        T_ERR(moec_session_init(model, dir, MOEC_BACKEND_CPU, 16, &s), MOEC_ERR_MISMATCH,
              "'model.layers.1.self_attn.indexer.wk.weight' not found");
    moec_session_free(s);
    moec_model_free(model);
}

/* ---- the verifier ----------------------------------------------------------- */

static const char IR_HEAD[] =
    "module v {\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  weight %tab : f32[16, 64] = \"tab\"\n"
    "  weight %g : f32[8] = \"g\"\n"
    "  weight %b : f32[8] = \"b\"\n"
    "  weight %b7 : f32[7] = \"b7\"\n"
    "  %e : f32[T, 64] = embedding(%tokens, %tab)\n"
    "  %qf : f32[T, 16] = slice(%e) {axis = 1, start = 0, size = 16}\n"
    "  %q : f32[T, 2, 8] = reshape(%qf)\n"
    "  %k : f32[T, 8] = slice(%e) {axis = 1, start = 16, size = 8}\n"
    "  %w : f32[T, 2] = slice(%e) {axis = 1, start = 24, size = 2}\n"
    "  %w3 : f32[T, 3] = slice(%e) {axis = 1, start = 24, size = 3}\n"
    "  %k3 : f32[T, 1, 8] = reshape(%k)\n";

static void verify_error(const char *ops, const char *needle)
{
    char text[4096];
    snprintf(text, sizeof text, "%s%s  output %%e\n}\n", IR_HEAD, ops);
    ir_module *m = NULL;
    T_ERR(ir_module_parse(text, "v.mir", &m), MOEC_ERR_FORMAT, needle);
    ir_module_free(m);
}

static void test_verifier(void)
{
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 0, scale = 0.5, "
                 "weight_scale = 1.0}\n",
                 "%s: dsa_topk: top_k 0 must be >= 1");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 4, scale = 0.5}\n",
                 "%s: dsa_topk: missing required attribute 'weight_scale'");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w3, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0}\n",
                 "%s: dsa_topk: weights %w3 has 3 heads, q %q has 2");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %qf, %w, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0}\n",
                 "%s: dsa_topk: k %qf has 16 channels, q %q has head dim 8");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 4, scale = -1.0, "
                 "weight_scale = 1.0}\n",
                 "%s: dsa_topk: scale -1 must be finite and > 0");
    verify_error("  %s : f32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0}\n",
                 "%s: dsa_topk");
    verify_error("  %r : f32[T, 2, 8] = rope(%q, %positions) {style = \"neox\", theta = 1e+04, "
                 "rotary_dim = 5}\n",
                 "%r: rope: rotary_dim 5 must be even and in [2, 8] (the head dim)");
    verify_error("  %r : f32[T, 2, 8] = rope(%q, %positions) {style = \"neox\", theta = 1e+04, "
                 "rotary_dim = 10}\n",
                 "%r: rope: rotary_dim 10 must be even and in [2, 8] (the head dim)");
    verify_error("  %y : f32[T, 8] = layer_norm(%k, %g, %b7) {eps = 1e-06}\n",
                 "%y: layer_norm: bias %b7 has 7 elements, input's last dim is 8");
    verify_error("  %y : f32[T, 8] = layer_norm(%k, %g) {eps = 1e-06}\n",
                 "v.mir:15:37: layer_norm takes at least 3 operands, 2 given");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0}\n"
                 "  %a : f32[T, 2, 8] = attention(%q, %k3, %k3, %positions, %s) {scale = 0.5, "
                 "window = 3}\n",
                 "%a: attention: window 3 and the token selection %s cannot be combined");
    verify_error("  %a : f32[T, 2, 8] = attention(%q, %k3, %k3, %positions, %w) {scale = 0.5}\n",
                 "%a: attention: sel %w must be i32");
    /* fuse_dsa_indexer's forms: dsa_topk reading q and w from rows, rotating q */
    verify_error("  %s : i32[T, 4] = dsa_topk(%e, %k, %e, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0, heads = 2, q_col = 50, w_col = 24}\n",
                 "%s: dsa_topk: q_col 50 + 16 columns is past %e (f32[T, 64])");
    verify_error("  %s : i32[T, 4] = dsa_topk(%e, %k, %e, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0, heads = 2, q_col = 0, w_col = 63}\n",
                 "%s: dsa_topk: w_col 63 + 2 columns is past %e (f32[T, 64])");
    verify_error("  %s : i32[T, 4] = dsa_topk(%e, %k, %e, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0, heads = 0}\n",
                 "%s: dsa_topk: heads 0 must be >= 1");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0, q_col = 8}\n",
                 "%s: dsa_topk: q_col and w_col need the attribute heads");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0, heads = 2}\n",
                 "%s: dsa_topk: q %q must have rank 2, got f32[T, 2, 8]");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0, style = \"neox\"}\n",
                 "%s: dsa_topk: a rope of q needs attribute 'theta'");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0, style = \"neox\", theta = 1e+04, rotary_dim = 12}\n",
                 "%s: dsa_topk: rotary_dim 12 must be even and in [2, 8] (the head dim)");
    verify_error("  %s : i32[T, 4] = dsa_topk(%q, %k, %w, %positions) {top_k = 4, scale = 0.5, "
                 "weight_scale = 1.0, theta = 1e+04}\n",
                 "%s: dsa_topk: style '' must be \"interleave\" or \"neox\"");
    /* dsa_prologue_k */
    verify_error("  %y : f32[T, 8] = dsa_prologue_k(%e, %positions, %g, %b) {col = 60, eps = 1e-06, "
                 "style = \"neox\", theta = 1e+04}\n",
                 "%y: dsa_prologue_k: col 60 + 8 columns is past %e (f32[T, 64])");
    verify_error("  %y : f32[T, 8] = dsa_prologue_k(%e, %positions, %g, %b7) {col = 0, eps = 1e-06, "
                 "style = \"neox\", theta = 1e+04}\n",
                 "%y: dsa_prologue_k: bias %b7 has 7 elements, weight %g 8");
    verify_error("  %y : f32[T, 8] = dsa_prologue_k(%e, %positions, %g, %b) {col = 0, eps = 1e-06, "
                 "style = \"neox\", theta = 1e+04, rotary_dim = 3}\n",
                 "%y: dsa_prologue_k: rotary_dim 3 must be even and in [2, 8] (the head dim)");
    verify_error("  %y : f32[T, 8] = dsa_prologue_k(%e, %positions, %g, %b) {col = 0, "
                 "style = \"neox\", theta = 1e+04}\n",
                 "%y: dsa_prologue_k: missing required attribute 'eps'");
    verify_error("  %y : f32[T, 8] = dsa_prologue_k(%e, %positions, %g, %b) {col = 0, eps = 1e-06, "
                 "style = \"half\", theta = 1e+04}\n",
                 "%y: dsa_prologue_k: style 'half' must be \"interleave\" or \"neox\"");
    verify_error("  %y : f32[T, 8] = dsa_prologue_k(%e, %positions, %g, %b) {col = 0, eps = 1e-06, "
                 "style = \"neox\", theta = 1e+04, heads = 2}\n",
                 "unknown attribute 'heads' for dsa_prologue_k");
    verify_error("  %a : f32[T, 2, 8] = mla_attention(%q, %q, %k, %k3, %positions, %positions) "
                 "{scale = 0.5}\n",
                 "%a: mla_attention: sel %positions must have rank 2");
}

/* ---- the interpreter ------------------------------------------------------- */

/* A module whose table row r holds, for a token of id r: q [Hi, Di], k [Di],
 * w [Hi], then the values v of two attentions; with dsa_topk {top_k K}, a
 * dense and a sparse GQA attention, and a dense and a sparse mla_attention
 * over the same cache rows. */
enum { HI = 2, DI = 4, VOCAB = 32 };

static char *interp_module_text(int K, double weight_scale)
{
    static char text[4096];
    snprintf(text, sizeof text,
             "module dsa {\n"
             "  input %%tokens : i32[T]\n"
             "  input %%positions : i32[T]\n"
             "  weight %%tab : f32[%d, %d] = \"tab\"\n"
             "  weight %%g : f32[%d] = \"g\"\n"
             "  weight %%b : f32[%d] = \"b\"\n"
             "  %%e : f32[T, %d] = embedding(%%tokens, %%tab)\n"
             "  %%qf : f32[T, %d] = slice(%%e) {axis = 1, start = 0, size = %d}\n"
             "  %%q : f32[T, %d, %d] = reshape(%%qf)\n"
             "  %%k : f32[T, %d] = slice(%%e) {axis = 1, start = %d, size = %d}\n"
             "  %%w : f32[T, %d] = slice(%%e) {axis = 1, start = %d, size = %d}\n"
             "  %%kn : f32[T, %d] = layer_norm(%%k, %%g, %%b) {eps = 1e-06}\n"
             "  %%sel : i32[T, %d] = dsa_topk(%%q, %%k, %%w, %%positions) {top_k = %d, scale = "
             "0.5, weight_scale = %#.17g}\n"
             "  %%k3 : f32[T, 1, %d] = reshape(%%k)\n"
             "  %%v3 : f32[T, 1, %d] = reshape(%%kn)\n"
             "  %%dense : f32[T, %d, %d] = attention(%%q, %%k3, %%v3, %%positions) {scale = 0.7}\n"
             "  %%sparse : f32[T, %d, %d] = attention(%%q, %%k3, %%v3, %%positions, %%sel) {scale = "
             "0.7}\n"
             "  %%mdense : f32[T, %d, %d] = mla_attention(%%q, %%q, %%k, %%k3, %%positions) "
             "{scale = 0.3}\n"
             "  %%msparse : f32[T, %d, %d] = mla_attention(%%q, %%q, %%k, %%k3, %%positions, "
             "%%sel) {scale = 0.3}\n"
             "  output %%e\n"
             "}\n",
             VOCAB, HI * DI + DI + HI, DI, DI, HI * DI + DI + HI, HI * DI, HI * DI, HI, DI, DI,
             HI * DI, DI, HI, HI * DI + DI, HI, DI, K, K, weight_scale, DI, DI, HI, DI, HI, DI, HI,
             DI, HI, DI);
    return text;
}

typedef struct dsa_run {
    ir_module *m;
    rt_interp *in;
} dsa_run;

static int dsa_open(dsa_run *r, int K, double weight_scale, const float *tab, int max_seq)
{
    memset(r, 0, sizeof *r);
    T_OK(ir_module_parse(interp_module_text(K, weight_scale), "dsa.mir", &r->m));
    if (!r->m)
        return 0;
    T_OK(rt_interp_init(r->m, NULL, max_seq, &r->in));
    if (!r->in)
        return 0;
    float g[DI], b[DI];
    for (int j = 0; j < DI; j++) {
        g[j] = 1.0f + 0.25f * (float)j;
        b[j] = 0.125f * (float)j - 0.2f;
    }
    T_OK(rt_interp_set_weight(r->in, ir_module_find_value(r->m, "tab"), tab));
    T_OK(rt_interp_set_weight(r->in, ir_module_find_value(r->m, "g"), g));
    T_OK(rt_interp_set_weight(r->in, ir_module_find_value(r->m, "b"), b));
    return 1;
}

static void dsa_close(dsa_run *r)
{
    rt_interp_free(r->in);
    ir_module_free(r->m);
}

static const float *val(const dsa_run *r, const char *name)
{
    return rt_interp_value(r->in, ir_module_find_value(r->m, name));
}

/* The index score of (q row, k row), in double from the definition. */
static double ref_score(const float *tab, int qtok, int ktok, double weight_scale)
{
    const float *qr = tab + qtok * (HI * DI + DI + HI), *kr = tab + ktok * (HI * DI + DI + HI);
    double s = 0;
    for (int h = 0; h < HI; h++) {
        double dot = 0;
        for (int j = 0; j < DI; j++)
            dot += (double)qr[h * DI + j] * kr[HI * DI + j];
        double wh = qr[HI * DI + DI + h] * weight_scale;
        s += wh * fmax(0.0, 0.5 * dot);
    }
    return s;
}

/* The selection dsa_topk must make for the token at position p of tokens:
 * the K best of 0..p by (score, lower position), ascending, -1 after. */
static void ref_select(const float *tab, const int32_t *tokens, int p, int K, double ws,
                       int32_t *out)
{
    int n = p + 1, chosen[64] = {0};
    for (int k = 0; k < K && k < n; k++) {
        int best = -1;
        double bs = 0;
        for (int i = 0; i < n; i++) {
            double s = ref_score(tab, tokens[p], tokens[i], ws);
            if (!chosen[i] && (best < 0 || s > bs)) {
                best = i;
                bs = s;
            }
        }
        chosen[best] = 1;
    }
    int o = 0;
    for (int i = 0; i < n; i++)
        if (chosen[i])
            out[o++] = i;
    while (o < K)
        out[o++] = -1;
}

/* rope with rotary_dim R: exactly the rope of the first R channels (a head
 * of R) with the rest passed, for both styles and YaRN. */
static void test_partial_rope(void)
{
    static const char *styles[2] = {"neox", "interleave"};
    for (int st = 0; st < 2; st++) {
        char text[2048];
        const char *attrs = "theta = 1e+04, scaling = \"yarn\", factor = 4.0, yarn_low = 1.0, "
                            "yarn_high = 3.0, attn_factor = 1.25";
        snprintf(text, sizeof text,
                 "module r {\n  input %%tokens : i32[T]\n  input %%positions : i32[T]\n"
                 "  weight %%tab : f32[8, 36] = \"tab\"\n"
                 "  %%e : f32[T, 36] = embedding(%%tokens, %%tab)\n"
                 "  %%x : f32[T, 3, 12] = reshape(%%e)\n"
                 "  %%part : f32[T, 3, 12] = rope(%%x, %%positions) {style = \"%s\", %s, "
                 "rotary_dim = 8}\n"
                 "  %%lo : f32[T, 3, 8] = slice(%%x) {axis = 2, start = 0, size = 8}\n"
                 "  %%hi : f32[T, 3, 4] = slice(%%x) {axis = 2, start = 8, size = 4}\n"
                 "  %%lo_rot : f32[T, 3, 8] = rope(%%lo, %%positions) {style = \"%s\", %s}\n"
                 "  %%whole : f32[T, 3, 12] = concat(%%lo_rot, %%hi) {axis = 2}\n"
                 "  output %%e\n}\n",
                 styles[st], attrs, styles[st], attrs);
        ir_module *m = NULL;
        rt_interp *in = NULL;
        T_OK(ir_module_parse(text, "r.mir", &m));
        if (m)
            T_OK(rt_interp_init(m, NULL, 64, &in));
        if (in) {
            float tab[8 * 36];
            uint64_t rng = 3 + (uint64_t)st;
            for (int i = 0; i < 8 * 36; i++)
                tab[i] = t_rand_normal(&rng);
            T_OK(rt_interp_set_weight(in, ir_module_find_value(m, "tab"), tab));
            int32_t tok[4] = {1, 7, 3, 0}, pos[4] = {0, 5, 17, 40};
            T_OK(rt_interp_forward(in, tok, pos, 4, NULL));
            const float *a = rt_interp_value(in, ir_module_find_value(m, "part"));
            const float *b = rt_interp_value(in, ir_module_find_value(m, "whole"));
            T_CHECK(a && b && !memcmp(a, b, 4 * 36 * sizeof(float)));
        }
        rt_interp_free(in);
        ir_module_free(m);
    }
}

static void test_layer_norm(void)
{
    float tab[VOCAB * (HI * DI + DI + HI)];
    uint64_t rng = 7;
    for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
        tab[i] = t_rand_normal(&rng) * 3.0f + 1.0f;
    dsa_run r;
    if (dsa_open(&r, 4, 1.0, tab, 8)) {
        int32_t tok[3] = {5, 9, 30}, pos[3] = {0, 1, 2};
        T_OK(rt_interp_forward(r.in, tok, pos, 3, NULL));
        const float *kn = val(&r, "kn");
        double worst = 0;
        for (int t = 0; t < 3 && kn; t++) {
            const float *k = tab + tok[t] * (HI * DI + DI + HI) + HI * DI;
            double mean = 0, var = 0;
            for (int j = 0; j < DI; j++)
                mean += k[j] / (double)DI;
            for (int j = 0; j < DI; j++)
                var += (k[j] - mean) * (k[j] - mean) / (double)DI;
            for (int j = 0; j < DI; j++) {
                double want = (k[j] - mean) / sqrt(var + 1e-6) * (1.0 + 0.25 * j) + 0.125 * j - 0.2;
                worst = fmax(worst, fabs(want - kn[t * DI + j]));
            }
        }
        printf("layer_norm: max error %.3g\n", worst);
        T_CHECK(kn && worst < 1e-5);
    }
    dsa_close(&r);
}

/* Attention of token t of a forward over the positions in sel (n of
 * them), from the cached q, k, v rows of the forward's tokens (the prefill
 * holds every position): softmax(scale * q . k) v, per head. */
static double attention_error(const dsa_run *r, const float *tab, const int32_t *tokens, int t,
                              const int32_t *sel, int n, const float *got, int mla)
{
    double worst = 0;
    const int W = HI * DI + DI + HI;
    const float *qr = tab + tokens[t] * W;
    double scale = mla ? 0.3 : 0.7;
    const float *kn_all = val(r, "kn");
    for (int h = 0; h < HI; h++) {
        double sc[64], mx = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++) {
            const float *kr = tab + tokens[sel[i]] * W + HI * DI;
            double dot = 0;
            for (int j = 0; j < DI; j++)
                dot += (double)qr[h * DI + j] * kr[j] * (mla ? 2.0 : 1.0);
            sc[i] = scale * dot;
            mx = fmax(mx, sc[i]);
        }
        for (int i = 0; i < n; i++)
            sum += sc[i] = exp(sc[i] - mx);
        for (int j = 0; j < DI; j++) {
            double acc = 0;
            for (int i = 0; i < n; i++) {
                double v = mla ? tab[tokens[sel[i]] * W + HI * DI + j] : kn_all[sel[i] * DI + j];
                acc += sc[i] * v;
            }
            worst = fmax(worst, fabs(acc / sum - got[(t * HI + h) * DI + j]));
        }
    }
    return worst;
}

static void test_dsa_topk(void)
{
    /* Random rows: every token's selection against the definition, in one
     * prefill of 12 tokens (positions 0..3 see at most K = 4 and take all). */
    float tab[VOCAB * (HI * DI + DI + HI)];
    uint64_t rng = 11;
    for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
        tab[i] = t_rand_normal(&rng);
    int32_t tokens[12], pos[12];
    for (int i = 0; i < 12; i++) {
        tokens[i] = (int32_t)((i * 7 + 3) % VOCAB);
        pos[i] = i;
    }
    for (int neg = 0; neg < 2; neg++) {
        double ws = neg ? -0.75 : 0.75; /* negative weights: negative scores rank too */
        dsa_run r;
        if (!dsa_open(&r, 4, ws, tab, 16)) {
            dsa_close(&r);
            continue;
        }
        T_OK(rt_interp_forward(r.in, tokens, pos, 12, NULL));
        const int32_t *sel = (const int32_t *)val(&r, "sel");
        int ok = sel != NULL;
        double att = 0, matt = 0, dense_same = 0;
        for (int t = 0; t < 12 && sel; t++) {
            int32_t want[4];
            ref_select(tab, tokens, t, 4, ws, want);
            for (int i = 0; i < 4; i++)
                ok &= sel[t * 4 + i] == want[i];
            int n = t + 1 < 4 ? t + 1 : 4;
            att = fmax(att, attention_error(&r, tab, tokens, t, sel + t * 4, n, val(&r, "sparse"), 0));
            matt = fmax(matt, attention_error(&r, tab, tokens, t, sel + t * 4, n, val(&r, "msparse"), 1));
            if (t < 4) /* all positions selected: the dense result, exactly */
                for (int j = 0; j < HI * DI; j++)
                    dense_same = fmax(dense_same, fabs(val(&r, "sparse")[t * HI * DI + j] -
                                                       val(&r, "dense")[t * HI * DI + j]) +
                                                      fabs(val(&r, "msparse")[t * HI * DI + j] -
                                                           val(&r, "mdense")[t * HI * DI + j]));
        }
        printf("dsa_topk (weights %s): selections %s; sparse attention error %.3g, mla %.3g; "
               "all-selected rows differ from dense by %.3g\n",
               neg ? "negative" : "positive", ok ? "as defined" : "WRONG", att, matt, dense_same);
        T_CHECK(ok);
        T_CHECK(att < 1e-5 && matt < 1e-5 && dense_same == 0);
        /* a decode step on top: position 12 (13 candidates) */
        int32_t tk = 17, p = 12;
        T_OK(rt_interp_forward(r.in, &tk, &p, 1, NULL));
        sel = (const int32_t *)val(&r, "sel");
        int32_t all[13], want[4];
        memcpy(all, tokens, sizeof tokens);
        all[12] = tk;
        ref_select(tab, all, 12, 4, ws, want);
        T_CHECK(sel && !memcmp(sel, want, sizeof want));
        dsa_close(&r);
    }

    /* Designed scores (1 head, q = (1, 0, 0, 0), k = (s, 0, 0, 0), w = 1):
       score = 0.5 * relu(s) * weight_scale; ties go to the lower position. */
    static const float s_of[8] = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f, 3.0f, -2.0f, 1.0f};
    float tab2[VOCAB * (HI * DI + DI + HI)];
    memset(tab2, 0, sizeof tab2);
    for (int r = 0; r < 8; r++) {
        float *row = tab2 + r * (HI * DI + DI + HI);
        row[0] = 1.0f;              /* head 0: q = e0 */
        row[HI * DI] = s_of[r];     /* k = s e0 */
        row[HI * DI + DI] = 1.0f;   /* head 0's weight; head 1's stays 0 */
    }
    int32_t tok8[8] = {0, 1, 2, 3, 4, 5, 6, 7}, pos8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const struct {
        int K;
        int32_t want[6]; /* the selection of the token at position 7 */
    } cases[] = {
        {1, {5}},
        {3, {1, 3, 5}},          /* 3, then the first two of the three 2s */
        {4, {1, 3, 4, 5}},
        {6, {0, 1, 3, 4, 5, 7}},
        {5, {1, 3, 4, 5, 7}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        dsa_run r;
        int K = cases[c].K;
        if (dsa_open(&r, K, 1.0, tab2, 8)) {
            T_OK(rt_interp_forward(r.in, tok8, pos8, 8, NULL));
            const int32_t *sel = (const int32_t *)val(&r, "sel");
            T_CHECK(sel && !memcmp(sel + 7 * K, cases[c].want, (size_t)K * sizeof(int32_t)));
            /* position 1 sees two tokens: both, then -1s (K = 1: the better) */
            T_CHECK(sel && (K == 1 ? sel[1] == 1
                                   : sel[K] == 0 && sel[K + 1] == 1 && (K < 3 || sel[K + 2] == -1)));
        }
        dsa_close(&r);
    }
    /* K = 7 over 8 positions: the zero scores of positions 2 and 6 tie: 2 wins */
    dsa_run r;
    if (dsa_open(&r, 7, 1.0, tab2, 8)) {
        T_OK(rt_interp_forward(r.in, tok8, pos8, 8, NULL));
        const int32_t *sel = (const int32_t *)val(&r, "sel");
        static const int32_t want7[7] = {0, 1, 2, 3, 4, 5, 7};
        T_CHECK(sel && !memcmp(sel + 7 * 7, want7, sizeof want7));
    }
    dsa_close(&r);

    /* A position beyond the cache, and a selection naming an uncached or
     * later position, are errors, not reads out of bounds. */
    if (dsa_open(&r, 4, 1.0, tab2, 8)) {
        int32_t p = 8, t0 = 0;
        T_ERR(rt_interp_forward(r.in, &t0, &p, 1, NULL), MOEC_ERR_CAPACITY, "past the KV cache");
        p = 5;
        T_ERR(rt_interp_forward(r.in, &t0, &p, 1, NULL), MOEC_ERR_INVALID_ARG,
              "sel: token at position 5 attends to position 0, which no forward has written");
    }
    dsa_close(&r);
}

/* fuse_dsa_indexer off the tiny model's layout: odd columns (the key at
 * 5 of a row of 5 + 12 + 3, q at 3 of a row of 3 + 36), interleaved pairs,
 * linear scaling and an attn_factor, rotary_dim 6 of 12. The fused module
 * (dsa_prologue_k; dsa_topk with heads, q_col, w_col and the rope) gives
 * the unfused one's keys and selections over 14 positions (top 5). */
static void test_fused_forms(void)
{
    const char *rope = "style = \"interleave\", theta = 500.0, scaling = \"linear\", "
                       "factor = 2.0, attn_factor = 1.25, rotary_dim = 6";
    char text[4096];
    snprintf(text, sizeof text,
             "module f {\n  input %%tokens : i32[T]\n  input %%positions : i32[T]\n"
             "  weight %%tabk : f32[16, 20] = \"tabk\"\n"
             "  weight %%tabq : f32[16, 39] = \"tabq\"\n"
             "  weight %%g : f32[12] = \"g\"\n"
             "  weight %%b : f32[12] = \"b\"\n"
             "  %%kx : f32[T, 20] = embedding(%%tokens, %%tabk)\n"
             "  %%qx : f32[T, 39] = embedding(%%tokens, %%tabq)\n"
             "  %%k_raw : f32[T, 12] = slice(%%kx) {axis = 1, start = 5, size = 12}\n"
             "  %%k_n : f32[T, 12] = layer_norm(%%k_raw, %%g, %%b) {eps = 1e-06}\n"
             "  %%k3 : f32[T, 1, 12] = reshape(%%k_n)\n"
             "  %%k3_rot : f32[T, 1, 12] = rope(%%k3, %%positions) {%s}\n"
             "  %%k : f32[T, 12] = reshape(%%k3_rot)\n"
             "  %%w : f32[T, 3] = slice(%%kx) {axis = 1, start = 17, size = 3}\n"
             "  %%q_flat : f32[T, 36] = slice(%%qx) {axis = 1, start = 3, size = 36}\n"
             "  %%q : f32[T, 3, 12] = reshape(%%q_flat)\n"
             "  %%q_rot : f32[T, 3, 12] = rope(%%q, %%positions) {%s}\n"
             "  %%sel : i32[T, 5] = dsa_topk(%%q_rot, %%k, %%w, %%positions) {top_k = 5, "
             "scale = 0.5, weight_scale = -0.7}\n"
             "  output %%sel\n}\n",
             rope, rope);
    ir_module *a = NULL, *b = NULL;
    T_OK(ir_module_parse(text, "f.mir", &a));
    if (a)
        T_OK(ir_module_clone(a, &b));
    if (!a || !b) {
        ir_module_free(a);
        return;
    }
    T_OK(pass_fuse_dsa_indexer(b, NULL));
    T_OK(ir_module_verify(b));
    T_CHECK(t_count_ops(b, IR_OP_DSA_PROLOGUE_K) == 1 && t_count_ops(b, IR_OP_ROPE) == 0 &&
            t_count_ops(b, IR_OP_SLICE) == 0 && t_count_ops(b, IR_OP_LAYER_NORM) == 0);
    const ir_op *tk = def_op(b, "sel");
    T_CHECK(tk && ir_op_attr_int(tk, "heads", 0) == 3 && ir_op_attr_int(tk, "q_col", 0) == 3 &&
            ir_op_attr_int(tk, "w_col", 0) == 17 && ir_op_attr_int(tk, "rotary_dim", 0) == 6);
    enum { N = 14 };
    float tabk[16 * 20], tabq[16 * 39], g[12], bb[12];
    uint64_t seed = 0xf05ed;
    for (int i = 0; i < 16 * 20; i++)
        tabk[i] = (float)(t_rand_u64(&seed) % 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < 16 * 39; i++)
        tabq[i] = (float)(t_rand_u64(&seed) % 2001) / 1000.0f - 1.0f;
    for (int j = 0; j < 12; j++) {
        g[j] = 1.0f + 0.125f * (float)j;
        bb[j] = 0.0625f * (float)j - 0.3f;
    }
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)(t_rand_u64(&seed) % 16);
        pos[i] = i;
    }
    rt_interp *in[2] = {NULL, NULL};
    ir_module *ms[2] = {a, b};
    for (int v = 0; v < 2; v++) {
        T_OK(rt_interp_init(ms[v], NULL, N, &in[v]));
        if (!in[v])
            continue;
        T_OK(rt_interp_set_weight(in[v], ir_module_find_value(ms[v], "tabk"), tabk));
        T_OK(rt_interp_set_weight(in[v], ir_module_find_value(ms[v], "tabq"), tabq));
        T_OK(rt_interp_set_weight(in[v], ir_module_find_value(ms[v], "g"), g));
        T_OK(rt_interp_set_weight(in[v], ir_module_find_value(ms[v], "b"), bb));
    }
    /* a prefill of 9 (past top_k), then single steps */
    for (int at = 0; in[0] && in[1] && at < N; at += at ? 1 : 9) {
        int n = at ? 1 : 9;
        double kerr = 0;
        int same = 1;
        for (int v = 0; v < 2; v++)
            T_OK(rt_interp_forward(in[v], tok + at, pos + at, n, NULL));
        const float *ka = rt_interp_value(in[0], ir_module_find_value(a, "k")),
                    *kb = rt_interp_value(in[1], ir_module_find_value(b, "k"));
        const int32_t *sa = (const int32_t *)rt_interp_value(in[0], ir_module_find_value(a, "sel")),
                      *sb = (const int32_t *)rt_interp_value(in[1], ir_module_find_value(b, "sel"));
        for (int i = 0; i < n * 12; i++)
            kerr = fmax(kerr, fabs((double)ka[i] - kb[i]));
        for (int i = 0; i < n * 5; i++)
            same &= sa[i] == sb[i];
        T_CHECK(kerr <= 1e-6 && same);
        if (kerr > 1e-6 || !same)
            fprintf(stderr, "fused forms at position %d: keys differ by %g, selections %s\n", at,
                    kerr, same ? "agree" : "differ");
    }
    for (int v = 0; v < 2; v++)
        rt_interp_free(in[v]);
    ir_module_free(a);
    ir_module_free(b);
}

/* ---- passes ------------------------------------------------------------------ */

/* Pass `name` run again on m (after the whole pipeline) changes nothing. */
static void rerun_changes_nothing(ir_module *m, const char *name)
{
    char *a = ir_module_print_str(m);
    T_OK(pass_find(name)->run(m, NULL));
    char *b = ir_module_print_str(m);
    T_CHECK(a && b && !strcmp(a, b));
    if (a && b && strcmp(a, b))
        fprintf(stderr, "a second run of %s changed the module\n", name);
    free(a);
    free(b);
}

static void test_passes(void)
{
    int n;
    const pass_info *pl = pass_pipeline(&n);
    pass_options f32;
    pass_options_default(&f32);
    f32.compute_dtype = IR_DTYPE_F32;
    for (int i = 0; i < n; i++) {
        double err = t_pass_equivalence("deepseek_v32", pl[i].name, NULL);
        printf("pass %-20s deepseek_v32 max row error %.3g\n", pl[i].name, err);
        T_CHECK(err >= 0 && err <= 1e-5);
    }
    T_CHECK(t_pass_equivalence("deepseek_v32", "fold_routed_scale", &f32) >= 0);

    ir_module *m = t_pipeline_module("deepseek_v32", NULL, NULL);
    if (m) {
        /* q_a, kv_a, wk and weights_proj read the attention input: one GEMM;
           q_b and wq_b read the q LoRA latent but stay two, so that wq_b
           runs on the side stream with the rest of the indexer */
        const ir_value *qkv = ir_module_find_value(m, "l1.attn.qkv_a_proj");
        T_CHECK(qkv && qkv->bind.kind == IR_BIND_CONCAT && qkv->bind.n_parts == 4 &&
                qkv->type.dims[0] == 24 + 40 + 16 + 8 &&
                !strcmp(qkv->bind.parts[2].name, "model.layers.1.self_attn.indexer.wk.weight") &&
                !strcmp(qkv->bind.parts[3].name,
                        "model.layers.1.self_attn.indexer.weights_proj.weight"));
        const ir_value *wq_b = ir_module_find_value(m, "l1.attn.indexer.wq_b");
        T_CHECK(wq_b && wq_b->bind.kind == IR_BIND_TENSOR && wq_b->type.dims[0] == 128 &&
                wq_b->type.dims[1] == 24 &&
                !strcmp(wq_b->bind.name, "model.layers.1.self_attn.indexer.wq_b.weight"));
        T_CHECK(!ir_module_find_value(m, "l1.attn.q_b_wq_b_proj"));
        const ir_op *iq = def_op(m, "l1.attn.indexer.q_flat");
        T_CHECK(iq && iq->kind == IR_OP_LINEAR && iq->in[1] == wq_b && iq->stream == 1);
        /* per layer 4 linears (qkv_a, q_b, wq_b, o_proj), the MoE's router,
           shared gate_up and down or the dense gate_up and down; lm_head */
        T_CHECK(t_count_ops(m, IR_OP_LINEAR) == 3 * 4 + 3 + 3 + 2 + 1);
        /* the attention reads the top-k ids through the indexer's join
           (assign_streams) */
        const ir_op *ma = def_op(m, "l2.attn.o_c");
        const ir_op *ij = def_op(m, "l2.attn.indexer.join");
        T_CHECK(ij && ij->kind == IR_OP_JOIN &&
                ij->in[0] == ir_module_find_value(m, "l2.attn.indexer.topk"));
        T_CHECK(ma && ma->kind == IR_OP_MLA_ATTENTION && ma->n_in == 6 && ij &&
                ma->in[5] == ij->out[0]);
        T_CHECK(t_count_ops(m, IR_OP_ATTENTION) == 0 && t_count_ops(m, IR_OP_DSA_TOPK) == 3);
        /* fuse_dsa_indexer: the key path one dsa_prologue_k reading qkv_a's wk
           columns; no rope, layer_norm or slice left (the MLA prologue
           ops read their sections themselves); dsa_topk reads wq_b's output
           (column 0) and qkv_a's weights_proj columns in place and rotates q */
        T_CHECK(t_count_ops(m, IR_OP_DSA_PROLOGUE_K) == 3 && t_count_ops(m, IR_OP_ROPE) == 0 &&
                t_count_ops(m, IR_OP_LAYER_NORM) == 0 && t_count_ops(m, IR_OP_SLICE) == 0);
        const ir_op *pk = def_op(m, "l1.attn.indexer.k"), *tk = def_op(m, "l1.attn.indexer.topk");
        T_CHECK(pk && pk->kind == IR_OP_DSA_PROLOGUE_K &&
                pk->in[0] == ir_module_find_value(m, "l1.attn.qkv_a") &&
                ir_op_attr_int(pk, "col", -1) == 24 + 40 &&
                !strcmp(ir_op_attr_str(pk, "style", ""), "neox") &&
                ir_op_attr_int(pk, "rotary_dim", 0) == 8 && ir_op_attr_float(pk, "eps", 0) == 1e-6);
        T_CHECK(tk && tk->kind == IR_OP_DSA_TOPK &&
                tk->in[0] == ir_module_find_value(m, "l1.attn.indexer.q_flat") &&
                tk->in[1] == pk->out[0] && tk->in[2] == ir_module_find_value(m, "l1.attn.qkv_a") &&
                ir_op_attr_int(tk, "heads", 0) == 8 && ir_op_attr_int(tk, "q_col", -1) == 0 &&
                ir_op_attr_int(tk, "w_col", 0) == 24 + 40 + 16 &&
                !strcmp(ir_op_attr_str(tk, "style", ""), "neox") &&
                ir_op_attr_int(tk, "rotary_dim", 0) == 8);
        rerun_changes_nothing(m, "fuse_dsa_indexer");
        /* a second run of the pipeline's fusion changes nothing */
        rerun_changes_nothing(m, "fuse_qkv_a");
        /* the text form parses back */
        char *text = ir_module_print_str(m);
        ir_module *m2 = NULL;
        T_OK(ir_module_parse(text, "v32.mir", &m2));
        char *text2 = m2 ? ir_module_print_str(m2) : NULL;
        T_CHECK(text && text2 && !strcmp(text, text2));
        free(text);
        free(text2);
        ir_module_free(m2);
    }
    ir_module_free(m);
}

/* ---- sparsity decides the output ------------------------------------------------ */

/* The tiny model's logits over the golden prompt and 8 more tokens, from
 * dir (a session: the unfused module on the CPU); rows into out. */
enum { PROMPT_MAX = 64, EXTRA = 8, GAP_MAX = 160 };

static int prompt_ids(int32_t *ids)
{
    char *text = t_read_file(t_src(TINY "/prompt.json"), NULL);
    cJSON *p = cJSON_Parse(text);
    free(text);
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(p, "prompt_ids"))
    {
        if (n < PROMPT_MAX - EXTRA)
            ids[n++] = (int32_t)it->valueint;
    }
    cJSON_Delete(p);
    for (int i = 0; i < EXTRA; i++)
        ids[n + i] = (int32_t)((37 * i + 11) % 256);
    return n + EXTRA;
}

static float *run_dir(const char *dir, const int32_t *ids, int n)
{
    moec_model_t *model = NULL;
    moec_session_t *s = NULL;
    float *rows = malloc((size_t)n * 256 * sizeof *rows);
    T_OK(moec_model_open(dir, &model));
    if (model)
        T_OK(moec_session_init(model, dir, MOEC_BACKEND_CPU, n + 1, &s));
    int ok = s && rows;
    if (ok) {
        moec_status st = moec_session_forward(s, ids, n - 4, rows);
        for (int i = n - 4; i < n && st == MOEC_OK; i++)
            st = moec_session_forward(s, ids + i, 1, rows + (size_t)i * 256);
        T_OK(st);
        ok = st == MOEC_OK;
    }
    moec_session_free(s);
    moec_model_free(model);
    if (!ok) {
        free(rows);
        return NULL;
    }
    return rows;
}

static void test_sparsity_matters(void)
{
    int32_t ids[PROMPT_MAX];
    int n = prompt_ids(ids);
    /* the same weights: V3.2 with every token selected, and V3's dense MLA
       (which reads V3.2's mlp_layer_types, MoE layers 0 and 2, from
       first_k_dense_replace 0 and moe_layer_freq 2) */
    const char *all[] = {"index_topk", "1000000"};
    const char *dense[] = {"model_type", "\"deepseek_v3\"", "first_k_dense_replace", "0",
                           "moe_layer_freq", "2"};
    float *ra = run_dir(model_dir("dsa-all", all, 1), ids, n);
    float *rd = run_dir(model_dir("dsa-dense", dense, 3), ids, n);
    float *rs = run_dir(t_src(TINY), ids, n);
    if (ra && rd && rs) {
        double same = 0, before = 0, after = 1e30;
        for (int r = 0; r < n; r++) {
            same = fmax(same, t_row_error(ra + (size_t)r * 256, rd + (size_t)r * 256, 256));
            double e = t_row_error(rs + (size_t)r * 256, rd + (size_t)r * 256, 256);
            if (r < 8) /* at most 8 positions: every one selected */
                before = fmax(before, e);
            else
                after = fmin(after, e);
        }
        printf("index_topk >= context vs dense V3 MLA: max row error %.3g; index_topk 8: rows "
               "0..7 differ by %.3g, rows 8..%d by at least %.3g\n",
               same, before, n - 1, after);
        T_CHECK(same == 0);
        T_CHECK(before == 0);
        T_CHECK(after > 1e-3);
    }
    free(ra);
    free(rd);
    free(rs);
}

/* ---- the golden's margin -------------------------------------------------------- */

/* The smallest gap, relative to the row's largest |score|, between the
 * index_topk-th and the next score, over every layer and position of the
 * golden prompt and its greedy continuation: a near-tie there would let
 * float rounding decide which token the reference selects. */
static double boundary_gap(const rt_interp *in, const ir_module *m, int T, const int32_t *pos,
                           double gap)
{
    int layer = 0;
    for (int i = 0; i < m->n_ops; i++) {
        const ir_op *op = m->ops[i];
        if (op->kind != IR_OP_DSA_TOPK)
            continue;
        int64_t Hi = op->in[0]->type.dims[1], Di = op->in[0]->type.dims[2];
        int64_t K = ir_op_attr_int(op, "top_k", 0);
        double scale = ir_op_attr_float(op, "scale", 0), ws = ir_op_attr_float(op, "weight_scale", 0);
        const float *q = rt_interp_value(in, op->in[0]), *w = rt_interp_value(in, op->in[2]);
        /* the keys of every position so far, per indexer (layer) */
        static float cache[8][GAP_MAX][64];
        float(*keys)[64] = cache[layer++ % 8];
        const float *k = rt_interp_value(in, op->in[1]);
        for (int t = 0; t < T; t++)
            memcpy(keys[pos[t]], k + t * Di, (size_t)Di * sizeof(float));
        for (int t = 0; t < T; t++) {
            int n = pos[t] + 1;
            if (n <= K)
                continue;
            double sc[GAP_MAX] = {0}, big = 0;
            for (int p = 0; p < n; p++) {
                double s = 0;
                for (int64_t h = 0; h < Hi; h++) {
                    double dot = 0;
                    for (int64_t j = 0; j < Di; j++)
                        dot += (double)q[(t * Hi + h) * Di + j] * keys[p][j];
                    s += w[t * Hi + h] * ws * fmax(0.0, dot * scale);
                }
                sc[p] = s;
                big = fmax(big, fabs(s));
            }
            /* sort descending (n is small) */
            for (int a = 0; a < n; a++)
                for (int b = a + 1; b < n; b++)
                    if (sc[b] > sc[a]) {
                        double x = sc[a];
                        sc[a] = sc[b];
                        sc[b] = x;
                    }
            gap = fmin(gap, (sc[K - 1] - sc[K]) / (big > 0 ? big : 1));
        }
    }
    return gap;
}

/* The smallest boundary gap over a prompt of n tokens then `greedy` greedy
 * decode steps of the tiny model (unfused, on the interpreter). */
static double margin_of(const int32_t *ids, int n, int greedy)
{
    ir_module *m = NULL;
    rt_weights *w = NULL;
    rt_interp *in = NULL;
    double gap = -1;
    T_OK(fe_model_load(t_src(TINY), &m));
    if (m)
        T_OK(rt_weights_open(m, t_src(TINY), &w));
    if (w)
        T_OK(rt_interp_init(m, w, n + greedy, &in));
    float *rows = malloc((size_t)n * 256 * sizeof *rows);
    if (in && rows && n + greedy <= GAP_MAX) {
        int32_t pos[GAP_MAX];
        for (int i = 0; i < GAP_MAX; i++)
            pos[i] = i;
        T_OK(rt_interp_forward(in, ids, pos, n, rows));
        gap = boundary_gap(in, m, n, pos, 1e30);
        int32_t next = t_argmax(rows + (size_t)(n - 1) * 256, 256);
        for (int k = 0; k < greedy; k++) {
            int32_t p = n + k;
            T_OK(rt_interp_forward(in, &next, &p, 1, rows));
            gap = boundary_gap(in, m, 1, &p, gap);
            next = t_argmax(rows, 256);
        }
    }
    free(rows);
    rt_interp_free(in);
    rt_weights_free(w);
    ir_module_free(m);
    return gap;
}

/* The golden (transformers, fp32) and the GPU tests (fp32 against the
 * interpreter) must not hinge on a near-tie at the top-k boundary: over the
 * golden's prompt and 8 greedy steps the gap must exceed 1e-4 of the
 * largest score, over gpu_model.c's sequences (its 150-token prompt and 2
 * steps; its three batch sequences and 4 steps) 1e-5. */
static void test_margins(void)
{
    int32_t ids[PROMPT_MAX];
    int n = prompt_ids(ids) - EXTRA;
    double g = margin_of(ids, n, 8);
    printf("golden prompt: smallest relative gap at the top-8 boundary %.3g\n", g);
    T_CHECK(g > 1e-4);
    int32_t long_ids[150];
    for (int i = 0; i < 150; i++)
        long_ids[i] = (int32_t)((i * 37 + 11) % 256);
    g = margin_of(long_ids, 150, 2);
    printf("gpu_model's long prompt (150 tokens + 2 steps): smallest gap %.3g\n", g);
    T_CHECK(g > 1e-5);
    static const int seq_len[3] = {8, 5, 11};
    for (int s = 0; s < 3; s++) {
        int32_t sids[16];
        for (int i = 0; i < seq_len[s]; i++)
            sids[i] = (int32_t)((s * 53 + i * 29 + 3) % 256);
        g = margin_of(sids, seq_len[s], 4);
        printf("gpu_model's batch sequence %d: smallest gap %.3g\n", s, g);
        T_CHECK(g > 1e-5);
    }
}

int main(void)
{
    test_frontend();
    test_fp8();
    test_config_errors();
    test_missing_tensor();
    test_verifier();
    test_partial_rope();
    test_layer_norm();
    test_dsa_topk();
    test_passes();
    test_fused_forms();
    test_sparsity_matters();
    test_margins();
    return t_finish("test_dsa");
}
