/* fe_deepseek.c — the deepseek_v2, deepseek_v3 and deepseek_v32 families:
 * multi-head latent attention (MLA) and the DeepSeek MoE, one IR op per
 * module of transformers 5.17's modeling_deepseek_v2.py /
 * modeling_deepseek_v3.py / modeling_deepseek_v32.py, with the defaults of
 * their configuration classes. V3.2 is V3 with the DSA indexer in every
 * attention (compiler/fe_dsa.c) and mlp_layer_types. */
#include <math.h>
#include <string.h>

#include "compiler/fe_internal.h"

/* DeepseekV2RMSNorm / DeepseekV3RMSNorm's default: q_a_layernorm and
 * kv_a_layernorm are built without an eps, so they use it, not rms_norm_eps. */
#define DS_LATENT_NORM_EPS 1e-6

typedef struct ds_cfg {
    int v3;  /* deepseek_v3 or deepseek_v32: V3's routing and defaults */
    int v32; /* deepseek_v32: DSA */
    fe_dsa dsa;
    int64_t heads;
    int64_t q_lora_rank; /* 0: no q LoRA (q_proj) */
    int64_t kv_lora_rank, nope, rope_dim, v_dim;
    int attention_bias;
    int mlp_bias; /* V2 only: DeepseekV3MLP has no biases */
    fe_rope rope;
    double scale;

    int has_experts;
    int64_t n_experts, moe_inter, n_shared, first_k_dense, layer_freq;
    fe_topk topk;
} ds_cfg;

/* A bool that may be null (falsy), as `if config.x:` reads it. */
static moec_status truthy_or(const fe_json *j, const char *key, int dflt, int *out)
{
    const cJSON *it = fe_json_get(j, key);
    if (it && cJSON_IsNull(it)) {
        *out = 0;
        return MOEC_OK;
    }
    return fe_json_bool_or(j, key, dflt, out);
}

static moec_status read_attention(const fe_json *j, const fe_common *cc, ds_cfg *d)
{
    int set;
    int64_t v;
    d->heads = cc->num_heads;
    if (fe_json_is_set(j, "use_mla")) {
        int mla;
        MOEC_TRY(fe_json_bool_or(j, "use_mla", 1, &mla));
        if (!mla)
            return fe_json_unsupported(j, "use_mla", "is not supported: moec builds MLA only");
    }
    /* MLA expands k and v to every head; the reference's repeat_kv would
     * break on fewer kv heads. DeepseekV3Config defaults to 128. */
    MOEC_TRY(fe_json_int_opt(j, "num_key_value_heads", &set, &v));
    if (!set && !fe_json_get(j, "num_key_value_heads") && d->v3) {
        set = 1;
        v = 128;
    }
    if (set && v != d->heads)
        return fe_json_unsupported(j, "num_key_value_heads",
                                   "is not supported: MLA needs num_key_value_heads == "
                                   "num_attention_heads (%lld)",
                                   (long long)d->heads);
    if (!d->v3 && cc->hidden_size % cc->num_heads != 0)
        return fe_json_unsupported(j, "hidden_size",
                                   "is not a multiple of num_attention_heads (%lld), which "
                                   "DeepseekV2Config rejects",
                                   (long long)cc->num_heads);

    if (!fe_json_get(j, "q_lora_rank"))
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "%s: missing required field \"q_lora_rank\" (null when q is not "
                        "low-rank)",
                        j->file);
    MOEC_TRY(fe_json_int_opt(j, "q_lora_rank", &set, &d->q_lora_rank));
    if (set)
        MOEC_TRY(fe_json_check_range(j, "q_lora_rank", d->q_lora_rank, 1, FE_DIM_MAX));
    else
        d->q_lora_rank = 0;
    MOEC_TRY(fe_json_dim_req(j, "kv_lora_rank", FE_DIM_MAX, &d->kv_lora_rank));
    MOEC_TRY(fe_json_dim_req(j, "qk_nope_head_dim", FE_DIM_MAX, &d->nope));
    MOEC_TRY(fe_json_dim_req(j, "qk_rope_head_dim", FE_DIM_MAX, &d->rope_dim));
    MOEC_TRY(fe_json_dim_req(j, "v_head_dim", FE_DIM_MAX, &d->v_dim));
    MOEC_TRY(fe_json_bool_or(j, "attention_bias", 0, &d->attention_bias));
    d->mlp_bias = 0;
    if (!d->v3)
        MOEC_TRY(fe_json_bool_or(j, "mlp_bias", 0, &d->mlp_bias));

    int64_t p;
    MOEC_TRY(fe_dim_product(j, "num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim)",
                            d->heads, d->nope + d->rope_dim, &p));
    MOEC_TRY(fe_dim_product(j, "num_attention_heads * (qk_nope_head_dim + v_head_dim)", d->heads,
                            d->nope + d->v_dim, &p));

    /* The config sets head_dim = qk_rope_head_dim: the rotary dim. */
    MOEC_TRY(fe_rope_read(j, d->rope_dim, cc->max_position_embeddings, &d->rope));
    /* V2 rotates complex pairs (view_as_complex): the interleaved layout.
     * V3 does too when rope_interleave (default true), else rotate_half. */
    int interleave = 1;
    if (d->v3 && !d->v32) /* DeepseekV32Config drops the field: always interleaved */
        MOEC_TRY(truthy_or(j, "rope_interleave", 1, &interleave));
    d->rope.style = interleave ? "interleave" : "neox";

    /* Softmax scale: qk_head_dim^-0.5, times mscale^2 for any non-default
     * rope type whose dict has a non-zero mscale_all_dim (yarn_apply_mscale,
     * which reads the dict's own factor). */
    d->scale = pow((double)(d->nope + d->rope_dim), -0.5);
    if (d->rope.kind != FE_ROPE_DEFAULT && d->rope.mscale_all_dim != 0) {
        fe_json rd = {NULL, j->file, d->rope.dict_prefix};
        if (!d->rope.has_dict_factor)
            return fe_json_unsupported(&rd, "factor",
                                       "must be a number when mscale_all_dim is set (the "
                                       "softmax scale uses it)");
        double m = d->rope.dict_factor <= 1
                       ? 1.0
                       : 0.1 * d->rope.mscale_all_dim * log(d->rope.dict_factor) + 1.0;
        d->scale = d->scale * m * m;
        if (!isfinite(d->scale)) {
            /* the dict itself, so that the error shows the value */
            rd.obj = d->rope.dict;
            return fe_json_unsupported(&rd, "mscale_all_dim",
                                       "gives a softmax scale that is not finite (with factor %g)",
                                       d->rope.dict_factor);
        }
    }
    return MOEC_OK;
}

/* The number of routed experts: n_routed_experts, or the attribute_map
 * alias a re-saved config may use. Absent under every name: missing; null:
 * no MoE layers. */
static moec_status read_n_experts(const fe_json *j, ds_cfg *d)
{
    static const char *const names[3] = {"n_routed_experts", "num_local_experts", "num_experts"};
    const char *found = NULL;
    int64_t value = 0;
    int present = 0;
    int n_names = d->v3 && !d->v32 ? 2 : 3; /* V3.2 re-routes num_experts too */
    for (int i = 0; i < n_names; i++) {
        if (!fe_json_get(j, names[i]))
            continue;
        present = 1;
        int set;
        int64_t v;
        MOEC_TRY(fe_json_int_opt(j, names[i], &set, &v));
        if (!set)
            continue;
        if (found && v != value)
            return MOEC_ERR(MOEC_ERR_FORMAT, "%s: fields \"%s\" (%lld) and \"%s\" (%lld) disagree",
                            j->file, found, (long long)value, names[i], (long long)v);
        if (!found)
            MOEC_TRY(fe_json_check_range(j, names[i], v, 1, FE_EXPERTS_MAX));
        found = names[i];
        value = v;
    }
    if (!present)
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "%s: missing required field \"n_routed_experts\" (null for a dense model)",
                        j->file);
    d->has_experts = found != NULL;
    d->n_experts = value;
    return MOEC_OK;
}

/* Group-limited routing must leave at least top_k experts selectable: with
 * fewer, the reference picks masked experts (V2 with weight 0), which the
 * IR's moe_topk does not model. */
static moec_status check_groups(const fe_json *j, ds_cfg *d, int64_t min_group)
{
    fe_topk *t = &d->topk;
    MOEC_TRY(fe_json_check_range(j, "n_group", t->n_group, 1, d->n_experts));
    if (d->n_experts % t->n_group != 0)
        return fe_json_unsupported(j, "n_group", "does not divide the %lld routed experts",
                                   (long long)d->n_experts);
    if (d->n_experts / t->n_group < min_group)
        return fe_json_unsupported(j, "n_group",
                                   "leaves groups of fewer than %lld experts; the group score "
                                   "sums the two best",
                                   (long long)min_group);
    MOEC_TRY(fe_json_check_range(j, "topk_group", t->topk_group, 1, t->n_group));
    if (t->top_k > t->topk_group * (d->n_experts / t->n_group))
        return fe_json_unsupported(j, "topk_group",
                                   "leaves fewer than num_experts_per_tok (%lld) experts to "
                                   "choose from",
                                   (long long)t->top_k);
    return MOEC_OK;
}

static moec_status read_routing_v2(const fe_json *j, ds_cfg *d)
{
    fe_topk *t = &d->topk;
    /* transformers' V2 router always uses softmax; a config asking for
     * anything else is not the model the reference runs. */
    const char *scoring;
    MOEC_TRY(fe_json_str_or(j, "scoring_func", "softmax", &scoring));
    if (strcmp(scoring, "softmax") != 0)
        return fe_json_unsupported(j, "scoring_func",
                                   "is not supported for deepseek_v2 (softmax only)");
    t->scoring = "softmax";
    t->group_score = "max";
    t->n_group = 1;
    t->topk_group = 1;
    const cJSON *it = fe_json_get(j, "topk_method");
    const char *method = "greedy";
    if (it) {
        if (cJSON_IsNull(it))
            return fe_json_unsupported(j, "topk_method",
                                       "is not supported (greedy or group_limited_greedy)");
        MOEC_TRY(fe_json_str_or(j, "topk_method", "greedy", &method));
    }
    if (strcmp(method, "group_limited_greedy") == 0) {
        int set;
        MOEC_TRY(fe_json_int_opt(j, "n_group", &set, &t->n_group));
        if (!set)
            return fe_json_unsupported(j, "n_group", "must be set for group_limited_greedy");
        MOEC_TRY(fe_json_int_opt(j, "topk_group", &set, &t->topk_group));
        if (!set)
            return fe_json_unsupported(j, "topk_group", "must be set for group_limited_greedy");
        MOEC_TRY(check_groups(j, d, 1));
    } else if (strcmp(method, "greedy") != 0) {
        return fe_json_unsupported(j, "topk_method",
                                   "is not supported for deepseek_v2 (greedy or "
                                   "group_limited_greedy)");
    }
    /* transformers' DeepseekV2TopkRouter never normalizes the top-k weights:
     * norm_topk_prob is ignored, as there. */
    t->norm_topk_prob = 0;
    MOEC_TRY(fe_json_float_or(j, "routed_scaling_factor", 1.0, &t->scaling));
    return MOEC_OK;
}

static moec_status read_routing_v3(const fe_json *j, ds_cfg *d)
{
    fe_topk *t = &d->topk;
    /* transformers' V3 router always scores with sigmoid, adds
     * e_score_correction_bias for selection and picks groups by the sum of
     * their two best experts; it ignores scoring_func and topk_method, so
     * only the values that mean that are accepted. */
    const char *s;
    MOEC_TRY(fe_json_str_opt(j, "scoring_func", &s));
    if (s && strcmp(s, "sigmoid") != 0)
        return fe_json_unsupported(j, "scoring_func",
                                   "is not supported for deepseek_v3 (sigmoid only)");
    MOEC_TRY(fe_json_str_opt(j, "topk_method", &s));
    if (s && strcmp(s, "noaux_tc") != 0)
        return fe_json_unsupported(j, "topk_method",
                                   "is not supported for deepseek_v3 (noaux_tc only)");
    t->scoring = "sigmoid";
    t->group_score = "top2_sum";
    MOEC_TRY(fe_json_int_or(j, "n_group", 8, &t->n_group));
    MOEC_TRY(fe_json_int_or(j, "topk_group", 4, &t->topk_group));
    MOEC_TRY(check_groups(j, d, 2));
    MOEC_TRY(truthy_or(j, "norm_topk_prob", 1, &t->norm_topk_prob));
    MOEC_TRY(fe_json_float_or(j, "routed_scaling_factor", 2.5, &t->scaling));
    return MOEC_OK;
}

static moec_status read_moe(const fe_json *j, ds_cfg *d)
{
    MOEC_TRY(read_n_experts(j, d));
    if (!d->has_experts)
        return MOEC_OK;
    MOEC_TRY(fe_json_int_req(j, "num_experts_per_tok", &d->topk.top_k));
    MOEC_TRY(fe_json_check_range(j, "num_experts_per_tok", d->topk.top_k, 1, d->n_experts));
    MOEC_TRY(fe_json_dim_req(j, "moe_intermediate_size", FE_DIM_MAX, &d->moe_inter));

    /* n_shared_experts: null (or 0) means none. */
    int set;
    MOEC_TRY(fe_json_int_opt(j, "n_shared_experts", &set, &d->n_shared));
    if (!set)
        d->n_shared = fe_json_get(j, "n_shared_experts") ? 0 : (d->v3 ? 1 : 2);
    MOEC_TRY(fe_json_check_range(j, "n_shared_experts", d->n_shared, 0, FE_DIM_MAX));
    int64_t p;
    MOEC_TRY(fe_dim_product(j, "moe_intermediate_size * n_shared_experts", d->moe_inter,
                            d->n_shared, &p));

    MOEC_TRY(fe_json_int_or(j, "first_k_dense_replace", d->v3 ? 3 : 0, &d->first_k_dense));
    MOEC_TRY(fe_json_check_range(j, "first_k_dense_replace", d->first_k_dense, 0, INT64_MAX));
    MOEC_TRY(fe_json_int_or(j, "moe_layer_freq", 1, &d->layer_freq));
    MOEC_TRY(fe_json_check_range(j, "moe_layer_freq", d->layer_freq, 1, INT64_MAX));

    return d->v3 ? read_routing_v3(j, d) : read_routing_v2(j, d);
}

/* DeepSeek's own rule (modeling_deepseek.py of the published checkpoints).
 * transformers 5.17 ignores moe_layer_freq and makes every layer from
 * first_k_dense_replace on a MoE layer; the two agree for moe_layer_freq 1,
 * the value of every published DeepSeek model. */
static int ds_layer_is_moe(const ds_cfg *d, int layer)
{
    if (!d->v32)
        return d->has_experts && layer >= d->first_k_dense && layer % d->layer_freq == 0;
    /* DeepseekV32Config: mlp_layer_types, by default first_k_dense_replace
     * dense layers and the rest sparse; moe_layer_freq is not read. */
    int sparse = fe_dsa_layer_sparse(&d->dsa, layer);
    return sparse >= 0 ? sparse : d->has_experts && layer >= d->first_k_dense;
}

/* MLA as the reference computes it before any absorption: q (optionally
 * through the q LoRA), the compressed kv latent and the shared rotary key,
 * kv_b_proj expanding the latent to per-head k_nope and v. */
static moec_status ds_attention(fe_ctx *c, const void *cfgp, ir_value *x, ir_value **out)
{
    const ds_cfg *d = cfgp;
    int64_t H = d->heads, hid = c->cc->hidden_size, qk = d->nope + d->rope_dim;
    ir_value *w, *b = NULL, *q_flat, *q_lora = NULL;
    if (d->q_lora_rank == 0) {
        MOEC_TRY(fe_linear_weight(c, "attn.q_proj", "self_attn.q_proj.weight", H * qk, hid, &w));
        MOEC_TRY(fe_linear(c, "attn.q_flat", x, w, NULL, &q_flat));
    } else {
        ir_value *q_a, *q_a_norm, *nw;
        MOEC_TRY(
            fe_linear_weight(c, "attn.q_a_proj", "self_attn.q_a_proj.weight", d->q_lora_rank, hid,
                             &w));
        if (d->attention_bias)
            MOEC_TRY(
                fe_weight1(c, "attn.q_a_proj.bias", "self_attn.q_a_proj.bias", d->q_lora_rank, &b));
        MOEC_TRY(fe_linear(c, "attn.q_a", x, w, b, &q_a));
        MOEC_TRY(fe_weight1(c, "attn.q_a_layernorm", "self_attn.q_a_layernorm.weight",
                            d->q_lora_rank, &nw));
        MOEC_TRY(fe_rms_norm(c, "attn.q_a_norm", q_a, nw, DS_LATENT_NORM_EPS, &q_a_norm));
        q_lora = q_a_norm;
        MOEC_TRY(fe_linear_weight(c, "attn.q_b_proj", "self_attn.q_b_proj.weight", H * qk,
                                  d->q_lora_rank, &w));
        MOEC_TRY(fe_linear(c, "attn.q_flat", q_a_norm, w, NULL, &q_flat));
    }
    ir_value *q, *q_nope, *q_pe;
    int64_t qdims[2] = {H, qk};
    MOEC_TRY(fe_reshape(c, "attn.q", q_flat, 3, qdims, &q));
    MOEC_TRY(fe_slice(c, "attn.q_nope", q, 2, 0, d->nope, &q_nope));
    MOEC_TRY(fe_slice(c, "attn.q_pe", q, 2, d->nope, d->rope_dim, &q_pe));

    ir_value *kv_a, *kv_c, *k_pe_flat, *kv_c_norm, *k_pe, *nw;
    b = NULL;
    MOEC_TRY(fe_linear_weight(c, "attn.kv_a_proj", "self_attn.kv_a_proj_with_mqa.weight",
                              d->kv_lora_rank + d->rope_dim, hid, &w));
    if (d->attention_bias)
        MOEC_TRY(fe_weight1(c, "attn.kv_a_proj.bias", "self_attn.kv_a_proj_with_mqa.bias",
                            d->kv_lora_rank + d->rope_dim, &b));
    MOEC_TRY(fe_linear(c, "attn.kv_a", x, w, b, &kv_a));
    MOEC_TRY(fe_slice(c, "attn.kv_c", kv_a, 1, 0, d->kv_lora_rank, &kv_c));
    MOEC_TRY(fe_slice(c, "attn.k_pe_flat", kv_a, 1, d->kv_lora_rank, d->rope_dim, &k_pe_flat));
    MOEC_TRY(fe_weight1(c, "attn.kv_a_layernorm", "self_attn.kv_a_layernorm.weight",
                        d->kv_lora_rank, &nw));
    MOEC_TRY(fe_rms_norm(c, "attn.kv_c_norm", kv_c, nw, DS_LATENT_NORM_EPS, &kv_c_norm));
    int64_t kpdims[2] = {1, d->rope_dim};
    MOEC_TRY(fe_reshape(c, "attn.k_pe", k_pe_flat, 3, kpdims, &k_pe));

    ir_value *q_pe_rot, *k_pe_rot, *q_full;
    MOEC_TRY(fe_rope_op(c, "attn.q_pe_rot", q_pe, &d->rope, &q_pe_rot));
    MOEC_TRY(fe_rope_op(c, "attn.k_pe_rot", k_pe, &d->rope, &k_pe_rot));
    MOEC_TRY(fe_concat2(c, "attn.q_full", q_nope, q_pe_rot, 2, &q_full));

    ir_value *kv_flat, *kv, *k_nope, *v, *k_pe_exp, *k_full;
    MOEC_TRY(fe_linear_weight(c, "attn.kv_b_proj", "self_attn.kv_b_proj.weight",
                              H * (d->nope + d->v_dim), d->kv_lora_rank, &w));
    MOEC_TRY(fe_linear(c, "attn.kv_flat", kv_c_norm, w, NULL, &kv_flat));
    int64_t kvdims[2] = {H, d->nope + d->v_dim};
    MOEC_TRY(fe_reshape(c, "attn.kv", kv_flat, 3, kvdims, &kv));
    MOEC_TRY(fe_slice(c, "attn.k_nope", kv, 2, 0, d->nope, &k_nope));
    MOEC_TRY(fe_slice(c, "attn.v", kv, 2, d->nope, d->v_dim, &v));
    int64_t edims[2] = {H, d->rope_dim};
    MOEC_TRY(fe_expand(c, "attn.k_pe_exp", k_pe_rot, 3, edims, &k_pe_exp));
    MOEC_TRY(fe_concat2(c, "attn.k_full", k_nope, k_pe_exp, 2, &k_full));

    ir_value *ctx, *ctx_flat, *sel;
    if (d->v32) {
        MOEC_TRY(fe_dsa_indexer(c, &d->dsa, x, q_lora, &sel));
        MOEC_TRY(fe_attention_sel(c, "attn.ctx", q_full, k_full, v, sel, d->scale, &ctx));
    } else {
        MOEC_TRY(fe_attention(c, "attn.ctx", q_full, k_full, v, d->scale, 0, &ctx));
    }
    int64_t cdims[1] = {H * d->v_dim};
    MOEC_TRY(fe_reshape(c, "attn.ctx_flat", ctx, 2, cdims, &ctx_flat));
    b = NULL;
    MOEC_TRY(
        fe_linear_weight(c, "attn.o_proj", "self_attn.o_proj.weight", hid, H * d->v_dim, &w));
    if (d->attention_bias)
        MOEC_TRY(fe_weight1(c, "attn.o_proj.bias", "self_attn.o_proj.bias", hid, &b));
    return fe_linear(c, "attn.out", ctx_flat, w, b, out);
}

static moec_status ds_mlp(fe_ctx *c, const void *cfgp, ir_value *x, ir_value **out)
{
    const ds_cfg *d = cfgp;
    if (!ds_layer_is_moe(d, c->layer))
        return fe_mlp(c, "mlp", "mlp", x, c->cc->intermediate_size, d->mlp_bias, out);

    ir_value *bias = NULL, *routed, *shared;
    if (d->v3) {
        /* Kept in fp32 by the reference (_keep_in_fp32_modules_strict). */
        int64_t E = d->n_experts;
        MOEC_TRY(fe_weight(c, "moe.router_bias", "mlp.gate.e_score_correction_bias", IR_DTYPE_F32,
                           1, &E, &bias));
    }
    MOEC_TRY(fe_moe_routed(c, x, d->n_experts, d->moe_inter, &d->topk, bias, &routed));
    if (d->n_shared == 0) {
        *out = routed;
        return MOEC_OK;
    }
    MOEC_TRY(fe_mlp(c, "moe.shared", "mlp.shared_experts", x, d->moe_inter * d->n_shared,
                    d->mlp_bias, &shared));
    return fe_binary(c, IR_OP_ADD, "moe.out", routed, shared, out);
}

/* num_nextn_predict_layers / num_mtp_layers are read by nobody: the
 * multi-token-prediction layers (model.layers.<num_hidden_layers>.*) are
 * extra weights for speculative decoding that the model's logits never use. */
moec_status fe_deepseek_build(const fe_json *root, const fe_common *cc, ir_module **out)
{
    ds_cfg d;
    memset(&d, 0, sizeof d);
    d.v32 = strcmp(cc->model_type, "deepseek_v32") == 0;
    d.v3 = d.v32 || strcmp(cc->model_type, "deepseek_v3") == 0;
    MOEC_TRY(read_attention(root, cc, &d));
    MOEC_TRY(read_moe(root, &d));
    if (d.v32)
        MOEC_TRY(fe_dsa_read(root, cc, d.q_lora_rank, d.rope_dim, &d.rope, d.has_experts, &d.dsa));
    static const fe_family family = {ds_attention, ds_mlp};
    return fe_model_build(cc, &family, &d, out);
}
