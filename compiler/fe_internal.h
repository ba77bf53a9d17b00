/* fe_internal.h — what the frontend files share: reading config.json fields
 * with errors that name the field and the file, the RoPE parameters as
 * transformers derives them, and builders for the pieces every family has
 * (norms, linears, the SwiGLU MLP, routed experts, the decoder skeleton).
 * Only compiler/frontend.c and compiler/fe_*.c include it. */
#ifndef MOEC_FE_INTERNAL_H
#define MOEC_FE_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "err.h"
#include "ir/ir.h"

/* Bounds on what a config may ask for. Real models are far below them; they
 * keep every shape the frontend builds inside the IR's limits and bound the
 * work one config can cause. */
#define FE_DIM_MAX (1LL << 24)          /* any size read from the config */
#define FE_LAYERS_MAX 4096              /* num_hidden_layers */
#define FE_EXPERTS_MAX 65536            /* routed experts per layer */
#define FE_DERIVED_DIM_MAX 2147483647LL /* a product such as heads * head_dim */
#define FE_WEIGHT_NUMEL_MAX (1LL << 40) /* elements of one weight value */

/* ---- reading config fields ------------------------------------------------
 * A view of one JSON object of a config: the root, or a nested object such as
 * rope_scaling (then prefix is "rope_scaling." so errors say which). Errors:
 * a missing required field or a value of the wrong JSON type is
 * MOEC_ERR_FORMAT naming the field and the file. */
typedef struct fe_json {
    const cJSON *obj;
    const char *file;
    const char *prefix; /* "" at the root */
} fe_json;

/* The item under key, NULL when absent (a JSON null is returned). */
const cJSON *fe_json_get(const fe_json *j, const char *key);
/* 1 when key is present with a value other than null. */
int fe_json_is_set(const fe_json *j, const char *key);

/* Integers: a JSON number with an integral value. "_req": absent -> error;
 * "_or": absent -> dflt; both: null -> error. "_opt": absent or null ->
 * *set = 0. */
moec_status fe_json_int_req(const fe_json *j, const char *key, int64_t *out);
moec_status fe_json_int_or(const fe_json *j, const char *key, int64_t dflt, int64_t *out);
moec_status fe_json_int_opt(const fe_json *j, const char *key, int *set, int64_t *out);
/* A required size in [1, max]; out of range is MOEC_ERR_UNSUPPORTED. */
moec_status fe_json_dim_req(const fe_json *j, const char *key, int64_t max, int64_t *out);
/* An integer already read must lie in [lo, hi]; MOEC_ERR_UNSUPPORTED naming key. */
moec_status fe_json_check_range(const fe_json *j, const char *key, int64_t v, int64_t lo,
                                int64_t hi);

/* a * b (sizes read from the config) as one dimension; over
 * FE_DERIVED_DIM_MAX is MOEC_ERR_UNSUPPORTED naming what ("num_attention_heads
 * * v_head_dim"). */
moec_status fe_dim_product(const fe_json *j, const char *what, int64_t a, int64_t b, int64_t *out);

moec_status fe_json_float_or(const fe_json *j, const char *key, double dflt, double *out);
moec_status fe_json_float_opt(const fe_json *j, const char *key, int *set, double *out);
/* Booleans: true/false only. */
moec_status fe_json_bool_or(const fe_json *j, const char *key, int dflt, int *out);
/* Strings (pointing into the JSON tree); "_opt" gives NULL when absent or null. */
moec_status fe_json_str_or(const fe_json *j, const char *key, const char *dflt, const char **out);
moec_status fe_json_str_opt(const fe_json *j, const char *key, const char **out);

/* Records MOEC_ERR_UNSUPPORTED: "<file>: field "<prefix><key>" = <value>
 * <why>", with the value as written in the config (when present). */
moec_status fe_json_unsupported(const fe_json *j, const char *key, const char *why, ...)
    MOEC_PRINTF(3, 4);

/* ---- quantization (compiler/fe_quant.c) ----------------------------------- */

typedef struct fe_quant {
    int fp8;              /* quant_method "fp8": linears are block-scaled f8e4m3 */
    int64_t block[2];     /* weight_block_size: rows, columns */
    const cJSON *skip[2]; /* modules_to_not_convert, ignored_layers (NULL: none) */
} fe_quant;

/* Reads quantization_config (absent or null: none). Anything but
 * quant_method "fp8", fmt "e4m3", activation_scheme "dynamic", a
 * weight_block_size of two sizes, scale_fmt "float" or "ue8m0", expert_dtype
 * "fp8" and no modules_to_convert is MOEC_ERR_UNSUPPORTED naming the field. */
moec_status fe_quant_read(const fe_json *root, fe_quant *q);

/* ---- fields every family has ---------------------------------------------- */

typedef struct fe_common {
    const char *model_type;
    int64_t vocab_size, hidden_size, num_layers, num_heads, intermediate_size;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    int tie_word_embeddings;
    const cJSON *eos; /* eos_token_id (an id or a list), checked; NULL: none */
    int n_eos;
    ir_dtype weight_dtype; /* from "dtype" or "torch_dtype" */
    fe_quant quant;        /* points into the config's JSON tree */
} fe_common;

/* Reads the fields above (and rejects hidden_act other than silu); the eos
 * ids from gen (generation_config.json) when it is not NULL and sets them.
 * max_pos_default is the family's default for max_position_embeddings. */
moec_status fe_common_read(const fe_json *j, const fe_json *gen, int64_t max_pos_default,
                           fe_common *c);

/* ---- RoPE -----------------------------------------------------------------
 * The rope op's attributes as transformers' standardize_rope_params and its
 * ROPE_INIT_FUNCTIONS compute them from either the transformers-4 form
 * (top-level rope_theta, rope_scaling {type|rope_type, ...}) or the
 * transformers-5 form (rope_parameters {rope_type, rope_theta, ...}). */
typedef enum fe_rope_kind {
    FE_ROPE_DEFAULT,
    FE_ROPE_LINEAR,
    FE_ROPE_YARN,
} fe_rope_kind;

typedef struct fe_rope {
    fe_rope_kind kind;
    const char *style; /* "interleave" or "neox": set by the family */
    double theta;
    double factor;   /* LINEAR, YARN: the factor the frequencies use */
    double yarn_low; /* YARN: correction range, truncated as asked */
    double yarn_high;
    double attn_factor; /* YARN: multiplies cos and sin */
    /* As written in the rope dict, for DeepSeek's softmax scale
     * (yarn_apply_mscale reads the dict, not the derived values). */
    int has_dict_factor;
    double dict_factor;
    double mscale_all_dim;   /* 0 when absent or null */
    const char *dict_prefix; /* "rope_scaling." or "rope_parameters." */
    const cJSON *dict;       /* that dict (NULL when there is none) */
    int64_t rotary_dim;      /* > 0: only the first rotary_dim channels rotate (set by the
                                family; 0: all) */
} fe_rope;

/* dim: the rotated head dim (head_dim as transformers' rope code sees it). */
moec_status fe_rope_read(const fe_json *root, int64_t dim, int64_t max_position_embeddings,
                         fe_rope *r);

/* ---- building -------------------------------------------------------------
 * Value names are "<vpre><name>" and tensor names "<tpre><tensor>"; inside a
 * layer vpre is "l3." and tpre "model.layers.3.". All activations are f32. */
typedef struct fe_ctx {
    ir_module *m;
    const fe_common *cc;
    ir_value *positions;
    int layer;
    char vpre[32];
    char tpre[48];
} fe_ctx;

/* Enters layer i (or, with -1, the model level: vpre "", tpre "model."). */
void fe_ctx_layer(fe_ctx *c, int layer);

/* A weight %<vpre>vname bound to "<tpre>tensor" (stack: a pattern with {e}). */
moec_status fe_weight(fe_ctx *c, const char *vname, const char *tensor, ir_dtype dt, int rank,
                      const int64_t *dims, ir_value **out);
moec_status fe_weight_stack(fe_ctx *c, const char *vname, const char *pattern, ir_dtype dt,
                            int count, int64_t d1, int64_t d2, ir_value **out);
/* Shorthands for weights of the checkpoint dtype. */
moec_status fe_weight1(fe_ctx *c, const char *vname, const char *tensor, int64_t d0,
                       ir_value **out);
moec_status fe_weight2(fe_ctx *c, const char *vname, const char *tensor, int64_t d0, int64_t d1,
                       ir_value **out);

/* The weight [rows, cols] of a linear of a decoder layer (attention, MLP,
 * experts), bound to "<tpre>tensor" ("<module>.weight"): block-scaled
 * f8e4m3 with scales "<tpre><tensor>_scale_inv" when the config quantizes
 * it, else of the checkpoint dtype. The stack form binds count experts'
 * tensors; all of them must be quantized alike. */
moec_status fe_linear_weight(fe_ctx *c, const char *vname, const char *tensor, int64_t rows,
                             int64_t cols, ir_value **out);
moec_status fe_linear_weight_stack(fe_ctx *c, const char *vname, const char *pattern, int count,
                                   int64_t rows, int64_t cols, ir_value **out);

/* Ops (names get vpre). */
moec_status fe_linear(fe_ctx *c, const char *name, ir_value *x, ir_value *w, ir_value *b,
                      ir_value **out);
moec_status fe_rms_norm(fe_ctx *c, const char *name, ir_value *x, ir_value *w, double eps,
                        ir_value **out);
/* dims: the result's dims after the leading T (rank - 1 of them). */
moec_status fe_reshape(fe_ctx *c, const char *name, ir_value *x, int rank, const int64_t *dims,
                       ir_value **out);
moec_status fe_expand(fe_ctx *c, const char *name, ir_value *x, int rank, const int64_t *dims,
                      ir_value **out);
moec_status fe_slice(fe_ctx *c, const char *name, ir_value *x, int axis, int64_t start,
                     int64_t size, ir_value **out);
moec_status fe_concat2(fe_ctx *c, const char *name, ir_value *a, ir_value *b, int axis,
                       ir_value **out);
moec_status fe_binary(fe_ctx *c, ir_op_kind kind, const char *name, ir_value *a, ir_value *b,
                      ir_value **out);
moec_status fe_unary(fe_ctx *c, ir_op_kind kind, const char *name, ir_value *x, ir_value **out);
moec_status fe_rope_op(fe_ctx *c, const char *name, ir_value *x, const fe_rope *r, ir_value **out);
moec_status fe_attention(fe_ctx *c, const char *name, ir_value *q, ir_value *k, ir_value *v,
                         double scale, int64_t window, ir_value **out);

/* attention(q, k, v, positions, sel) over the positions the token selection
 * sel (dsa_topk's result) chose. */
moec_status fe_attention_sel(fe_ctx *c, const char *name, ir_value *q, ir_value *k, ir_value *v,
                             ir_value *sel, double scale, ir_value **out);
moec_status fe_layer_norm(fe_ctx *c, const char *name, ir_value *x, ir_value *w, ir_value *b,
                          double eps, ir_value **out);
moec_status fe_dsa_topk(fe_ctx *c, const char *name, ir_value *q, ir_value *k, ir_value *w,
                        int64_t top_k, double scale, double weight_scale, ir_value **out);

/* The SwiGLU MLP down(silu(gate(x)) * up(x)) with weights
 * "<tpre><tmod>.{gate,up,down}_proj.weight" (and ".bias" when bias) and
 * values %<vpre><vmod>.{gate,up,act,hidden,out}. */
moec_status fe_mlp(fe_ctx *c, const char *vmod, const char *tmod, ir_value *x, int64_t inter,
                   int bias, ir_value **out);

/* moe_topk's attributes. Group attributes are written when n_group > 1. */
typedef struct fe_topk {
    const char *scoring; /* "softmax" or "sigmoid" */
    int64_t top_k;
    int64_t n_group, topk_group;
    const char *group_score; /* "max" or "top2_sum" */
    int norm_topk_prob;
    double scaling;
} fe_topk;

/* The routed experts of a MoE layer, unfused: router logits (weight
 * "<tpre>mlp.gate.weight"), moe_topk (bias: optional [E] f32), moe_experts
 * over the stacks "<tpre>mlp.experts.{e}.{gate,up,down}_proj.weight", the
 * top-k weights broadcast-multiplied and summed over k: %<vpre>moe.routed. */
moec_status fe_moe_routed(fe_ctx *c, ir_value *x, int64_t n_experts, int64_t moe_inter,
                          const fe_topk *tk, ir_value *bias, ir_value **out);

/* A family: attention and feed-forward of layer c->layer on the normed x. */
typedef struct fe_family {
    moec_status (*attention)(fe_ctx *c, const void *cfg, ir_value *x, ir_value **out);
    moec_status (*mlp)(fe_ctx *c, const void *cfg, ir_value *x, ir_value **out);
} fe_family;

/* The whole model: metas, inputs, embedding, the decoder layers
 * (x + attn(input_layernorm(x)), then x + mlp(post_attention_layernorm(x))),
 * final norm, lm_head, output %logits. The result is not yet verified. */
moec_status fe_model_build(const fe_common *cc, const fe_family *fam, const void *cfg,
                           ir_module **out);

/* ---- DeepSeek-V3.2's sparse attention (compiler/fe_dsa.c) ---------------- */

/* The lightning indexer's sizes, as DeepseekV32Config reads them. */
typedef struct fe_dsa {
    int64_t top_k;    /* index_topk, at most max_position_embeddings */
    int64_t n_heads;  /* index_n_heads */
    int64_t head_dim; /* index_head_dim */
    int64_t rope_dim; /* qk_rope_head_dim: the first channels, rotated half-split */
    fe_rope rope;     /* the MLA's RoPE parameters, in the "neox" layout, over the first
                         rope_dim channels of each head */
    const cJSON *mlp_layer_types; /* "dense" / "sparse" per layer; NULL: the default */
} fe_dsa;

/* Reads and checks index_topk, index_n_heads, index_head_dim (against
 * qk_rope_head_dim rope_dim), q_lora_rank (the indexer needs it), layer_types
 * and mlp_layer_types (n_layers entries; a "sparse" layer needs experts:
 * has_experts). mla_rope: the attention's RoPE. */
moec_status fe_dsa_read(const fe_json *j, const fe_common *cc, int64_t q_lora_rank,
                        int64_t rope_dim, const fe_rope *mla_rope, int has_experts, fe_dsa *d);
/* Layer `layer`'s MLP type: 1 for "sparse" (MoE), 0 for "dense", -1 when
 * mlp_layer_types is not given (the caller's default applies). */
int fe_dsa_layer_sparse(const fe_dsa *d, int layer);
/* The indexer of the layer of c on the attention input x and the normed q
 * LoRA latent q_lora (q_a_layernorm's output): its top-k selection. */
moec_status fe_dsa_indexer(fe_ctx *c, const fe_dsa *d, ir_value *x, ir_value *q_lora,
                           ir_value **sel);

/* The families (compiler/fe_deepseek.c, compiler/fe_qwen.c). */
moec_status fe_deepseek_build(const fe_json *root, const fe_common *cc, ir_module **out);
moec_status fe_qwen_build(const fe_json *root, const fe_common *cc, ir_module **out);

#endif
