/* fe_dsa.c — DeepSeek-V3.2's sparse attention (DSA) in the frontend: the
 * fields DeepseekV32Config adds to DeepSeek-V3 (index_topk, index_n_heads,
 * index_head_dim, mlp_layer_types, layer_types) and the lightning indexer
 * of one layer, one IR op per step of transformers 5.17's
 * DeepseekV32Indexer:
 *
 *   q = wq_b(q_lora) as [T, index_n_heads, index_head_dim]
 *   k = k_norm(wk(x))                  LayerNorm with a bias, eps 1e-6
 *   the first qk_rope_head_dim channels of q and k rotated half-split
 *   ("neox"; the MLA's own RoPE is interleaved), the rest passed through:
 *   one rope op with rotary_dim
 *   w = weights_proj(x)                never quantized (bf16 in fp8 checkpoints)
 *   sel = dsa_topk(q, k, w) {scale = index_head_dim^-0.5,
 *                            weight_scale = index_n_heads^-0.5}
 *
 * The attention then reads only the positions sel holds. */
#include <math.h>
#include <string.h>

#include "compiler/fe_internal.h"
#include "json.h"

/* nn.LayerNorm(index_head_dim, eps=1e-6) of the reference's k_norm. */
#define DSA_K_NORM_EPS 1e-6

/* Entry i of list field `key` of j as a string; MOEC_ERR_FORMAT naming
 * key[i] when it is not one. */
static moec_status list_str(const fe_json *j, const char *key, const cJSON *it, int i,
                            const char **out)
{
    if (cJSON_IsString(it) && it->valuestring) {
        *out = it->valuestring;
        return MOEC_OK;
    }
    char repr[160];
    moec_json_repr(it, repr, sizeof repr);
    return MOEC_ERR(MOEC_ERR_FORMAT, "%s: field \"%s[%d]\" must be a string, got %s (%s)", j->file,
                    key, i, moec_json_kind(it), repr);
}

/* List field `key`, when set: n_layers strings. *out is NULL when it is
 * absent or null. */
static moec_status layer_list(const fe_json *j, const char *key, int64_t n_layers,
                              const cJSON **out)
{
    *out = NULL;
    const cJSON *it = fe_json_get(j, key);
    if (!it || cJSON_IsNull(it))
        return MOEC_OK;
    if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != n_layers)
        return fe_json_unsupported(j, key, "must be a list of num_hidden_layers (%lld) strings",
                                   (long long)n_layers);
    *out = it;
    return MOEC_OK;
}

/* Every layer of V3.2 is DSA: layer_types, when given, can only say so,
 * by the name transformers 5 writes for it: "indexed_attention" (5.24's
 * DeepseekV32Config) or "deepseek_sparse_attention" (earlier 5.x). The
 * modeling code runs every layer the same whatever the list says. */
static moec_status read_layer_types(const fe_json *j, int64_t n_layers)
{
    const cJSON *list;
    MOEC_TRY(layer_list(j, "layer_types", n_layers, &list));
    int i = 0;
    for (const cJSON *it = list ? list->child : NULL; it; it = it->next, i++) {
        const char *s = NULL;
        MOEC_TRY(list_str(j, "layer_types", it, i, &s));
        if (strcmp(s, "indexed_attention") != 0 && strcmp(s, "deepseek_sparse_attention") != 0)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "%s: field \"layer_types[%d]\" = \"%s\" is not supported "
                            "(deepseek_v32 layers are \"indexed_attention\", also named "
                            "\"deepseek_sparse_attention\")",
                            j->file, i, s);
    }
    return MOEC_OK;
}

/* mlp_layer_types: "dense" or "sparse" per layer; a sparse layer needs the
 * routed experts. */
static moec_status read_mlp_layer_types(const fe_json *j, int64_t n_layers, int has_experts,
                                        fe_dsa *d)
{
    MOEC_TRY(layer_list(j, "mlp_layer_types", n_layers, &d->mlp_layer_types));
    int i = 0;
    for (const cJSON *it = d->mlp_layer_types ? d->mlp_layer_types->child : NULL; it;
         it = it->next, i++) {
        const char *s = NULL;
        MOEC_TRY(list_str(j, "mlp_layer_types", it, i, &s));
        if (strcmp(s, "dense") != 0 && strcmp(s, "sparse") != 0)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "%s: field \"mlp_layer_types[%d]\" = \"%s\" is not supported (\"dense\" "
                            "or \"sparse\")",
                            j->file, i, s);
        if (strcmp(s, "sparse") == 0 && !has_experts)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "%s: field \"mlp_layer_types[%d]\" is \"sparse\", but the model has no "
                            "routed experts (n_routed_experts is null)",
                            j->file, i);
    }
    return MOEC_OK;
}

moec_status fe_dsa_read(const fe_json *j, const fe_common *cc, int64_t q_lora_rank,
                        int64_t rope_dim, const fe_rope *mla_rope, int has_experts, fe_dsa *d)
{
    memset(d, 0, sizeof *d);
    if (q_lora_rank == 0)
        return fe_json_unsupported(j, "q_lora_rank",
                                   "is not supported for deepseek_v32: the indexer's wq_b reads "
                                   "the q LoRA latent, so q_lora_rank must be set");
    int64_t top_k;
    MOEC_TRY(fe_json_int_or(j, "index_topk", 2048, &top_k));
    MOEC_TRY(fe_json_check_range(j, "index_topk", top_k, 1, INT64_MAX));
    /* No sequence is longer than max_position_embeddings: a larger top-k
     * selects every token either way, and needs no wider result. */
    d->top_k = top_k < cc->max_position_embeddings ? top_k : cc->max_position_embeddings;
    MOEC_TRY(fe_json_int_or(j, "index_n_heads", 64, &d->n_heads));
    MOEC_TRY(fe_json_check_range(j, "index_n_heads", d->n_heads, 1, FE_DIM_MAX));
    MOEC_TRY(fe_json_int_or(j, "index_head_dim", 128, &d->head_dim));
    MOEC_TRY(fe_json_check_range(j, "index_head_dim", d->head_dim, 1, FE_DIM_MAX));
    if (d->head_dim < rope_dim)
        return fe_json_unsupported(j, "index_head_dim",
                                   "is smaller than qk_rope_head_dim (%lld), the channels of "
                                   "each indexer head that RoPE rotates",
                                   (long long)rope_dim);
    if (d->head_dim % 2)
        return fe_json_unsupported(j, "index_head_dim",
                                   "is odd: moec's rope op rotates heads of an even size");
    int64_t p;
    MOEC_TRY(fe_dim_product(j, "index_n_heads * index_head_dim", d->n_heads, d->head_dim, &p));
    d->rope_dim = rope_dim;
    d->rope = *mla_rope;
    d->rope.style = "neox";
    d->rope.rotary_dim = d->head_dim > rope_dim ? rope_dim : 0;
    MOEC_TRY(read_layer_types(j, cc->num_layers));
    return read_mlp_layer_types(j, cc->num_layers, has_experts, d);
}

int fe_dsa_layer_sparse(const fe_dsa *d, int layer)
{
    if (!d->mlp_layer_types)
        return -1;
    const cJSON *it = cJSON_GetArrayItem(d->mlp_layer_types, layer);
    return it && cJSON_IsString(it) && strcmp(it->valuestring, "sparse") == 0;
}

moec_status fe_dsa_indexer(fe_ctx *c, const fe_dsa *d, ir_value *x, ir_value *q_lora,
                           ir_value **sel)
{
    int64_t H = d->n_heads, D = d->head_dim, hid = c->cc->hidden_size;
    ir_value *w, *b, *q_flat, *q, *q_rot, *k_raw, *k_normed, *k3, *k3_rot, *k, *weights;
    MOEC_TRY(fe_linear_weight(c, "attn.indexer.wq_b", "self_attn.indexer.wq_b.weight", H * D,
                              q_lora->type.dims[1], &w));
    MOEC_TRY(fe_linear(c, "attn.indexer.q_flat", q_lora, w, NULL, &q_flat));
    int64_t qdims[2] = {H, D};
    MOEC_TRY(fe_reshape(c, "attn.indexer.q", q_flat, 3, qdims, &q));
    MOEC_TRY(fe_rope_op(c, "attn.indexer.q_rot", q, &d->rope, &q_rot));

    MOEC_TRY(fe_linear_weight(c, "attn.indexer.wk", "self_attn.indexer.wk.weight", D, hid, &w));
    MOEC_TRY(fe_linear(c, "attn.indexer.k_raw", x, w, NULL, &k_raw));
    MOEC_TRY(fe_weight1(c, "attn.indexer.k_norm", "self_attn.indexer.k_norm.weight", D, &w));
    MOEC_TRY(fe_weight1(c, "attn.indexer.k_norm.bias", "self_attn.indexer.k_norm.bias", D, &b));
    MOEC_TRY(fe_layer_norm(c, "attn.indexer.k_normed", k_raw, w, b, DSA_K_NORM_EPS, &k_normed));
    int64_t kdims[2] = {1, D};
    MOEC_TRY(fe_reshape(c, "attn.indexer.k3", k_normed, 3, kdims, &k3));
    MOEC_TRY(fe_rope_op(c, "attn.indexer.k3_rot", k3, &d->rope, &k3_rot));
    MOEC_TRY(fe_reshape(c, "attn.indexer.k", k3_rot, 2, &D, &k));

    /* The reference keeps weights_proj in fp32 and DeepSeek's fp8
     * checkpoints store it in bf16: it is never block-scaled. */
    MOEC_TRY(fe_weight2(c, "attn.indexer.weights_proj", "self_attn.indexer.weights_proj.weight", H,
                        hid, &w));
    MOEC_TRY(fe_linear(c, "attn.indexer.weights", x, w, NULL, &weights));
    return fe_dsa_topk(c, "attn.indexer.topk", q_rot, k, weights, d->top_k, pow((double)D, -0.5),
                       pow((double)H, -0.5), sel);
}
