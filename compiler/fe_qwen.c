/* fe_qwen.c — the qwen2_moe and qwen3_moe families: grouped-query attention
 * with neox RoPE (Qwen2-MoE: qkv bias; Qwen3-MoE: per-head q/k RMSNorm),
 * softmax top-k routing, and Qwen2-MoE's sigmoid-gated shared expert; one IR
 * op per module of transformers 5.17's modeling_qwen2_moe.py /
 * modeling_qwen3_moe.py, with the defaults of their configuration classes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/fe_internal.h"

typedef struct qw_cfg {
    int qwen3;
    int64_t heads, kv_heads, head_dim;
    int qkv_bias, o_bias;
    fe_rope rope;
    double scale;
    int64_t window[FE_LAYERS_MAX]; /* per layer; 0 = full attention */
    unsigned char moe[FE_LAYERS_MAX];

    int64_t n_experts, moe_inter, shared_inter;
    fe_topk topk;
} qw_cfg;

static moec_status read_attention(const fe_json *j, const fe_common *cc, qw_cfg *q)
{
    q->heads = cc->num_heads;
    MOEC_TRY(fe_json_int_or(j, "num_key_value_heads", q->qwen3 ? 4 : 16, &q->kv_heads));
    MOEC_TRY(fe_json_check_range(j, "num_key_value_heads", q->kv_heads, 1, q->heads));
    if (q->heads % q->kv_heads != 0)
        return fe_json_unsupported(j, "num_key_value_heads",
                                   "does not divide num_attention_heads (%lld)",
                                   (long long)q->heads);
    /* getattr(config, "head_dim", hidden_size // num_attention_heads) */
    MOEC_TRY(fe_json_int_or(j, "head_dim", cc->hidden_size / cc->num_heads, &q->head_dim));
    MOEC_TRY(fe_json_check_range(j, "head_dim", q->head_dim, 1, FE_DIM_MAX));
    int64_t p;
    MOEC_TRY(fe_dim_product(j, "num_attention_heads * head_dim", q->heads, q->head_dim, &p));

    if (q->qwen3) {
        MOEC_TRY(fe_json_bool_or(j, "attention_bias", 0, &q->qkv_bias));
        q->o_bias = q->qkv_bias;
    } else {
        /* Configs written before transformers 5 lack qkv_bias: Qwen2-MoE
         * checkpoints have q/k/v biases, and the class default is true. */
        MOEC_TRY(fe_json_bool_or(j, "qkv_bias", 1, &q->qkv_bias));
        q->o_bias = 0;
    }

    MOEC_TRY(fe_rope_read(j, q->head_dim, cc->max_position_embeddings, &q->rope));
    q->rope.style = "neox"; /* rotate_half */
    q->scale = pow((double)q->head_dim, -0.5);
    return MOEC_OK;
}

/* Qwen2MoeConfig.__post_init__: sliding_window counts only with
 * use_sliding_window (else 0); layer_types, when not given, marks layer i
 * sliding when i is even, i < max_window_layers and use_sliding_window. */
static moec_status read_windows_qwen2(const fe_json *j, const fe_common *cc, qw_cfg *q)
{
    int use, win_set;
    int64_t win = 4096, max_window_layers;
    MOEC_TRY(fe_json_bool_or(j, "use_sliding_window", 0, &use));
    if (fe_json_get(j, "sliding_window")) {
        MOEC_TRY(fe_json_int_opt(j, "sliding_window", &win_set, &win));
    } else {
        win_set = 1;
    }
    MOEC_TRY(fe_json_int_or(j, "max_window_layers", 28, &max_window_layers));
    if (use && !win_set)
        return fe_json_unsupported(j, "sliding_window",
                                   "must be set when use_sliding_window is true (transformers "
                                   "builds the sliding mask from it)");
    if (use)
        MOEC_TRY(fe_json_check_range(j, "sliding_window", win, 1, INT64_MAX));
    int64_t eff = use ? win : 0;

    const cJSON *lt = fe_json_get(j, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != cc->num_layers)
            return MOEC_ERR(MOEC_ERR_FORMAT,
                            "%s: field \"layer_types\" must be a list of num_hidden_layers (%lld) "
                            "strings",
                            j->file, (long long)cc->num_layers);
        int i = 0;
        for (const cJSON *it = lt->child; it; it = it->next, i++) {
            if (!cJSON_IsString(it))
                return MOEC_ERR(MOEC_ERR_FORMAT,
                                "%s: field \"layer_types\" item %d must be a string", j->file, i);
            if (strcmp(it->valuestring, "full_attention") == 0) {
                q->window[i] = 0;
            } else if (strcmp(it->valuestring, "sliding_attention") == 0) {
                if (eff <= 0)
                    return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                                    "%s: field \"layer_types\" item %d is sliding_attention but "
                                    "use_sliding_window is false: no window to apply",
                                    j->file, i);
                q->window[i] = eff;
            } else {
                return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                                "%s: field \"layer_types\" item %d = \"%.64s\" is not supported "
                                "(full_attention or sliding_attention)",
                                j->file, i, it->valuestring);
            }
        }
        return MOEC_OK;
    }
    for (int i = 0; i < cc->num_layers; i++)
        q->window[i] = ((i + 1) % 2 != 0 && i < max_window_layers && use) ? eff : 0;
    return MOEC_OK;
}

/* Qwen3MoeConfig.__post_init__: sliding_window (default 4096) only with
 * use_sliding_window; then every layer uses it (one mask for all). */
static moec_status read_windows_qwen3(const fe_json *j, const fe_common *cc, qw_cfg *q)
{
    int use, win_set = 1;
    int64_t win = 4096;
    MOEC_TRY(fe_json_bool_or(j, "use_sliding_window", 0, &use));
    if (fe_json_get(j, "sliding_window"))
        MOEC_TRY(fe_json_int_opt(j, "sliding_window", &win_set, &win));
    int64_t eff = 0;
    if (use && win_set) {
        MOEC_TRY(fe_json_check_range(j, "sliding_window", win, 1, INT64_MAX));
        eff = win;
    }
    for (int i = 0; i < cc->num_layers; i++)
        q->window[i] = eff;
    return MOEC_OK;
}

/* Which layers are sparse: not in mlp_only_layers, num_experts > 0 and
 * (i + 1) % decoder_sparse_step == 0 (Qwen*MoeDecoderLayer). */
static moec_status read_moe(const fe_json *j, const fe_common *cc, qw_cfg *q)
{
    const char *ekey = fe_json_get(j, "num_experts") || !fe_json_get(j, "num_local_experts")
                           ? "num_experts"
                           : "num_local_experts";
    MOEC_TRY(fe_json_int_req(j, ekey, &q->n_experts));
    MOEC_TRY(fe_json_check_range(j, ekey, q->n_experts, 0, FE_EXPERTS_MAX));
    if (strcmp(ekey, "num_experts") == 0 && fe_json_is_set(j, "num_local_experts")) {
        int64_t other;
        MOEC_TRY(fe_json_int_req(j, "num_local_experts", &other));
        if (other != q->n_experts)
            return MOEC_ERR(MOEC_ERR_FORMAT,
                            "%s: fields \"num_experts\" (%lld) and \"num_local_experts\" (%lld) "
                            "disagree",
                            j->file, (long long)q->n_experts, (long long)other);
    }

    int64_t step;
    MOEC_TRY(fe_json_int_or(j, "decoder_sparse_step", 1, &step));
    MOEC_TRY(fe_json_check_range(j, "decoder_sparse_step", step, 1, INT64_MAX));
    for (int i = 0; i < cc->num_layers; i++)
        q->moe[i] = q->n_experts > 0 && (i + 1) % step == 0;
    const cJSON *only = fe_json_get(j, "mlp_only_layers");
    if (only && !cJSON_IsNull(only)) {
        if (!cJSON_IsArray(only))
            return MOEC_ERR(MOEC_ERR_FORMAT,
                            "%s: field \"mlp_only_layers\" must be a list of integers", j->file);
        for (const cJSON *it = only->child; it; it = it->next) {
            double v = cJSON_IsNumber(it) ? it->valuedouble : 0.5;
            if (v != floor(v))
                return MOEC_ERR(MOEC_ERR_FORMAT,
                                "%s: field \"mlp_only_layers\" must be a list of integers",
                                j->file);
            if (v >= 0 && v < (double)cc->num_layers)
                q->moe[(int)v] = 0;
        }
    }
    if (q->n_experts == 0)
        return MOEC_OK;

    fe_topk *t = &q->topk;
    MOEC_TRY(fe_json_int_req(j, "num_experts_per_tok", &t->top_k));
    MOEC_TRY(fe_json_check_range(j, "num_experts_per_tok", t->top_k, 1, q->n_experts));
    MOEC_TRY(fe_json_dim_req(j, "moe_intermediate_size", FE_DIM_MAX, &q->moe_inter));
    if (!q->qwen3)
        MOEC_TRY(
            fe_json_dim_req(j, "shared_expert_intermediate_size", FE_DIM_MAX, &q->shared_inter));
    /* The reference divides by the plain sum; moe_topk adds 1e-20 to it,
     * which cannot change a sum of softmax probabilities in fp32. */
    MOEC_TRY(fe_json_bool_or(j, "norm_topk_prob", 0, &t->norm_topk_prob));
    t->scoring = "softmax";
    t->n_group = 1;
    t->topk_group = 1;
    t->group_score = "max";
    t->scaling = 1.0;
    return MOEC_OK;
}

static moec_status qw_attention(fe_ctx *c, const void *cfgp, ir_value *x, ir_value **out)
{
    const qw_cfg *q = cfgp;
    int64_t hid = c->cc->hidden_size, D = q->head_dim;
    static const char *const proj[3] = {"q", "k", "v"};
    ir_value *heads[3];
    for (int i = 0; i < 3; i++) {
        int64_t n = i == 0 ? q->heads : q->kv_heads;
        char vn[64], tn[64];
        ir_value *w, *b = NULL, *flat;
        snprintf(vn, sizeof vn, "attn.%s_proj", proj[i]);
        snprintf(tn, sizeof tn, "self_attn.%s_proj.weight", proj[i]);
        MOEC_TRY(fe_linear_weight(c, vn, tn, n * D, hid, &w));
        if (q->qkv_bias) {
            snprintf(vn, sizeof vn, "attn.%s_proj.bias", proj[i]);
            snprintf(tn, sizeof tn, "self_attn.%s_proj.bias", proj[i]);
            MOEC_TRY(fe_weight1(c, vn, tn, n * D, &b));
        }
        snprintf(vn, sizeof vn, "attn.%s_flat", proj[i]);
        MOEC_TRY(fe_linear(c, vn, x, w, b, &flat));
        int64_t dims[2] = {n, D};
        snprintf(vn, sizeof vn, "attn.%s", proj[i]);
        MOEC_TRY(fe_reshape(c, vn, flat, 3, dims, &heads[i]));
    }
    ir_value *qh = heads[0], *kh = heads[1];
    if (q->qwen3) {
        /* q_norm / k_norm: RMSNorm over each head's head_dim, before RoPE. */
        ir_value *w;
        MOEC_TRY(fe_weight1(c, "attn.q_norm", "self_attn.q_norm.weight", D, &w));
        MOEC_TRY(fe_rms_norm(c, "attn.q_normed", qh, w, c->cc->rms_norm_eps, &qh));
        MOEC_TRY(fe_weight1(c, "attn.k_norm", "self_attn.k_norm.weight", D, &w));
        MOEC_TRY(fe_rms_norm(c, "attn.k_normed", kh, w, c->cc->rms_norm_eps, &kh));
    }
    ir_value *q_rot, *k_rot, *ctx, *ctx_flat, *w, *b = NULL;
    MOEC_TRY(fe_rope_op(c, "attn.q_rot", qh, &q->rope, &q_rot));
    MOEC_TRY(fe_rope_op(c, "attn.k_rot", kh, &q->rope, &k_rot));
    MOEC_TRY(
        fe_attention(c, "attn.ctx", q_rot, k_rot, heads[2], q->scale, q->window[c->layer], &ctx));
    int64_t cdims[1] = {q->heads * D};
    MOEC_TRY(fe_reshape(c, "attn.ctx_flat", ctx, 2, cdims, &ctx_flat));
    MOEC_TRY(fe_linear_weight(c, "attn.o_proj", "self_attn.o_proj.weight", hid, q->heads * D, &w));
    if (q->o_bias)
        MOEC_TRY(fe_weight1(c, "attn.o_proj.bias", "self_attn.o_proj.bias", hid, &b));
    return fe_linear(c, "attn.out", ctx_flat, w, b, out);
}

static moec_status qw_mlp(fe_ctx *c, const void *cfgp, ir_value *x, ir_value **out)
{
    const qw_cfg *q = cfgp;
    if (!q->moe[c->layer])
        return fe_mlp(c, "mlp", "mlp", x, c->cc->intermediate_size, 0, out);
    ir_value *routed;
    MOEC_TRY(fe_moe_routed(c, x, q->n_experts, q->moe_inter, &q->topk, NULL, &routed));
    if (q->qwen3) {
        *out = routed;
        return MOEC_OK;
    }
    /* Qwen2-MoE's shared expert, scaled by sigmoid(shared_expert_gate(x)). */
    ir_value *shared, *gw, *logit, *gate, *scaled;
    MOEC_TRY(fe_mlp(c, "moe.shared", "mlp.shared_expert", x, q->shared_inter, 0, &shared));
    MOEC_TRY(fe_weight2(c, "moe.shared_expert_gate", "mlp.shared_expert_gate.weight", 1,
                        c->cc->hidden_size, &gw));
    MOEC_TRY(fe_linear(c, "moe.shared_gate_logit", x, gw, NULL, &logit));
    MOEC_TRY(fe_unary(c, IR_OP_SIGMOID, "moe.shared_gate", logit, &gate));
    MOEC_TRY(fe_binary(c, IR_OP_MUL, "moe.shared_scaled", shared, gate, &scaled));
    return fe_binary(c, IR_OP_ADD, "moe.out", routed, scaled, out);
}

moec_status fe_qwen_build(const fe_json *root, const fe_common *cc, ir_module **out)
{
    qw_cfg *q = calloc(1, sizeof *q);
    if (!q)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory reading %s", root->file);
    q->qwen3 = strcmp(cc->model_type, "qwen3_moe") == 0;
    moec_status st = read_attention(root, cc, q);
    if (st == MOEC_OK)
        st = q->qwen3 ? read_windows_qwen3(root, cc, q) : read_windows_qwen2(root, cc, q);
    if (st == MOEC_OK)
        st = read_moe(root, cc, q);
    if (st == MOEC_OK) {
        static const fe_family family = {qw_attention, qw_mlp};
        st = fe_model_build(cc, &family, q, out);
    }
    free(q);
    return st;
}
