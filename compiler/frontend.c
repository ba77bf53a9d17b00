/* frontend.c — config.json to the unfused IR: reading and checking config
 * fields, the RoPE parameters exactly as Hugging Face transformers 5.17
 * derives them (modeling_rope_utils.py, configuration_utils.py), the builders
 * every family shares, and the dispatch on model_type.
 *
 * Which fields are required: the sizes that fix a model's shapes
 * (vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
 * intermediate_size and each family's expert and head sizes). Any other field
 * that is absent takes the default of the family's transformers config class,
 * so a config means here what it means to transformers. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/fe_internal.h"
#include "compiler/frontend.h"
#include "file.h"
#include "json.h"

/* ---- config fields --------------------------------------------------------- */

const cJSON *fe_json_get(const fe_json *j, const char *key)
{
    if (!j->obj)
        return NULL;
    return cJSON_GetObjectItemCaseSensitive(j->obj, key);
}

int fe_json_is_set(const fe_json *j, const char *key)
{
    const cJSON *it = fe_json_get(j, key);
    return it && !cJSON_IsNull(it);
}

static moec_status json_missing(const fe_json *j, const char *key)
{
    return MOEC_ERR(MOEC_ERR_FORMAT, "%s: missing required field \"%s%s\"", j->file, j->prefix,
                    key);
}

static moec_status json_type_error(const fe_json *j, const char *key, const cJSON *it,
                                   const char *want)
{
    char repr[160];
    moec_json_repr(it, repr, sizeof repr);
    return MOEC_ERR(MOEC_ERR_FORMAT, "%s: field \"%s%s\" must be %s, got %s (%s)", j->file,
                    j->prefix, key, want, moec_json_kind(it), repr);
}

moec_status fe_json_unsupported(const fe_json *j, const char *key, const char *why, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, why);
    vsnprintf(msg, sizeof msg, why, ap);
    va_end(ap);
    const cJSON *it = fe_json_get(j, key);
    if (!it)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s: field \"%s%s\" (absent) %s", j->file, j->prefix,
                        key, msg);
    char repr[160];
    moec_json_repr(it, repr, sizeof repr);
    return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s: field \"%s%s\" = %s %s", j->file, j->prefix, key,
                    repr, msg);
}

static moec_status json_range_error(const fe_json *j, const char *key, int64_t lo, int64_t hi)
{
    if (hi == INT64_MAX)
        return fe_json_unsupported(j, key, "is out of range (must be at least %lld)",
                                   (long long)lo);
    return fe_json_unsupported(j, key, "is out of range (must be in [%lld, %lld])",
                               (long long)lo, (long long)hi);
}

/* An integer in [lo, hi], compared as the double the file holds before it
 * is converted, so that 1e30 is reported as 1e30. */
static moec_status json_item_int_in(const fe_json *j, const char *key, const cJSON *it,
                                    int64_t lo, int64_t hi, int64_t *out)
{
    switch (moec_json_int(it, (double)lo, (double)hi, out)) {
    case MOEC_JSON_INT_OK:
        return MOEC_OK;
    case MOEC_JSON_INT_NOT_INT:
        return json_type_error(j, key, it, "an integer");
    default:
        return json_range_error(j, key, lo, hi);
    }
}

/* Any integer a double holds exactly. */
static moec_status json_item_int(const fe_json *j, const char *key, const cJSON *it, int64_t *out)
{
    const int64_t big = (int64_t)MOEC_JSON_INT_MAX;
    return json_item_int_in(j, key, it, -big, big, out);
}

moec_status fe_json_int_req(const fe_json *j, const char *key, int64_t *out)
{
    const cJSON *it = fe_json_get(j, key);
    if (!it)
        return json_missing(j, key);
    return json_item_int(j, key, it, out);
}

moec_status fe_json_int_or(const fe_json *j, const char *key, int64_t dflt, int64_t *out)
{
    const cJSON *it = fe_json_get(j, key);
    if (!it) {
        *out = dflt;
        return MOEC_OK;
    }
    return json_item_int(j, key, it, out);
}

moec_status fe_json_int_opt(const fe_json *j, const char *key, int *set, int64_t *out)
{
    const cJSON *it = fe_json_get(j, key);
    *set = 0;
    if (!it || cJSON_IsNull(it))
        return MOEC_OK;
    MOEC_TRY(json_item_int(j, key, it, out));
    *set = 1;
    return MOEC_OK;
}

moec_status fe_json_check_range(const fe_json *j, const char *key, int64_t v, int64_t lo,
                                int64_t hi)
{
    return v < lo || v > hi ? json_range_error(j, key, lo, hi) : MOEC_OK;
}

moec_status fe_json_dim_req(const fe_json *j, const char *key, int64_t max, int64_t *out)
{
    const cJSON *it = fe_json_get(j, key);
    if (!it)
        return json_missing(j, key);
    return json_item_int_in(j, key, it, 1, max, out);
}

moec_status fe_dim_product(const fe_json *j, const char *what, int64_t a, int64_t b, int64_t *out)
{
    *out = a * b;
    if (*out > FE_DERIVED_DIM_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s: %s = %lld is larger than moec supports", j->file,
                        what, (long long)*out);
    return MOEC_OK;
}

static moec_status json_item_float(const fe_json *j, const char *key, const cJSON *it, double *out)
{
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return json_type_error(j, key, it, "a finite number");
    *out = it->valuedouble;
    return MOEC_OK;
}

moec_status fe_json_float_or(const fe_json *j, const char *key, double dflt, double *out)
{
    const cJSON *it = fe_json_get(j, key);
    if (!it) {
        *out = dflt;
        return MOEC_OK;
    }
    return json_item_float(j, key, it, out);
}

moec_status fe_json_float_opt(const fe_json *j, const char *key, int *set, double *out)
{
    const cJSON *it = fe_json_get(j, key);
    *set = 0;
    if (!it || cJSON_IsNull(it))
        return MOEC_OK;
    MOEC_TRY(json_item_float(j, key, it, out));
    *set = 1;
    return MOEC_OK;
}

moec_status fe_json_bool_or(const fe_json *j, const char *key, int dflt, int *out)
{
    const cJSON *it = fe_json_get(j, key);
    if (!it) {
        *out = dflt;
        return MOEC_OK;
    }
    if (!cJSON_IsBool(it))
        return json_type_error(j, key, it, "true or false");
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return MOEC_OK;
}

moec_status fe_json_str_or(const fe_json *j, const char *key, const char *dflt, const char **out)
{
    const cJSON *it = fe_json_get(j, key);
    if (!it) {
        *out = dflt;
        return MOEC_OK;
    }
    if (!cJSON_IsString(it) || !it->valuestring)
        return json_type_error(j, key, it, "a string");
    *out = it->valuestring;
    return MOEC_OK;
}

moec_status fe_json_str_opt(const fe_json *j, const char *key, const char **out)
{
    const cJSON *it = fe_json_get(j, key);
    *out = NULL;
    if (!it || cJSON_IsNull(it))
        return MOEC_OK;
    if (!cJSON_IsString(it) || !it->valuestring)
        return json_type_error(j, key, it, "a string");
    *out = it->valuestring;
    return MOEC_OK;
}

/* ---- fields every family has ----------------------------------------------- */

static moec_status read_dtype(const fe_json *j, ir_dtype *out)
{
    /* transformers 5 writes "dtype"; older configs "torch_dtype". When both
     * are present, "dtype" wins (PreTrainedConfig.__post_init__). */
    const char *key = "dtype";
    const char *name;
    MOEC_TRY(fe_json_str_opt(j, key, &name));
    if (!name) {
        key = "torch_dtype";
        MOEC_TRY(fe_json_str_opt(j, key, &name));
    }
    if (!name) {
        *out = IR_DTYPE_BF16;
        return MOEC_OK;
    }
    if (strcmp(name, "bfloat16") == 0)
        *out = IR_DTYPE_BF16;
    else if (strcmp(name, "float16") == 0)
        *out = IR_DTYPE_F16;
    else if (strcmp(name, "float32") == 0)
        *out = IR_DTYPE_F32;
    else
        return fe_json_unsupported(j, key,
                                   "is not supported (moec reads bfloat16, float16 and float32 "
                                   "checkpoints)");
    return MOEC_OK;
}

/* eos_token_id is an id or a list of ids: its first, and the one after e. */
static const cJSON *eos_first(const cJSON *it) { return cJSON_IsArray(it) ? it->child : it; }
static const cJSON *eos_next(const cJSON *it, const cJSON *e)
{
    return cJSON_IsArray(it) ? e->next : NULL;
}

/* j's eos_token_id (absent or null: *n = 0): each id an integer in
 * [0, vocab_size), so that generation can stop on it. */
static moec_status eos_check(const fe_json *j, int64_t vocab, const cJSON **ids, int *n)
{
    const cJSON *it = fe_json_get(j, "eos_token_id");
    *ids = NULL;
    *n = 0;
    if (!it || cJSON_IsNull(it))
        return MOEC_OK;
    if (!cJSON_IsNumber(it) && !cJSON_IsArray(it))
        return json_type_error(j, "eos_token_id", it, "an integer or a list of integers");
    int i = 0;
    for (const cJSON *e = eos_first(it); e; e = eos_next(it, e), i++) {
        char key[48];
        if (cJSON_IsArray(it))
            snprintf(key, sizeof key, "eos_token_id[%d]", i);
        else
            snprintf(key, sizeof key, "eos_token_id");
        int64_t id;
        moec_json_int_result r = moec_json_int(e, 0, (double)(vocab - 1), &id);
        if (r == MOEC_JSON_INT_NOT_INT)
            return json_type_error(j, key, e, "an integer");
        if (r != MOEC_JSON_INT_OK) {
            char repr[64];
            moec_json_repr(e, repr, sizeof repr);
            return MOEC_ERR(MOEC_ERR_FORMAT,
                            "%s: field \"%s\" = %s is not a token id (vocab_size is %lld)",
                            j->file, key, repr, (long long)vocab);
        }
    }
    *ids = it;
    *n = i;
    return MOEC_OK;
}

/* The eos ids generation stops on, as transformers' generate() takes them:
 * generation_config.json's eos_token_id when that file sets one, else
 * config.json's. Both files' ids are checked. */
static moec_status read_eos(const fe_json *cfg, const fe_json *gen, fe_common *c)
{
    MOEC_TRY(eos_check(cfg, c->vocab_size, &c->eos, &c->n_eos));
    if (!gen || !fe_json_is_set(gen, "eos_token_id"))
        return MOEC_OK;
    return eos_check(gen, c->vocab_size, &c->eos, &c->n_eos);
}

moec_status fe_common_read(const fe_json *j, const fe_json *gen, int64_t max_pos_default,
                           fe_common *c)
{
    MOEC_TRY(fe_json_str_or(j, "model_type", "", &c->model_type));
    MOEC_TRY(fe_json_dim_req(j, "vocab_size", FE_DIM_MAX, &c->vocab_size));
    MOEC_TRY(fe_json_dim_req(j, "hidden_size", FE_DIM_MAX, &c->hidden_size));
    MOEC_TRY(fe_json_dim_req(j, "num_hidden_layers", FE_LAYERS_MAX, &c->num_layers));
    MOEC_TRY(fe_json_dim_req(j, "num_attention_heads", FE_DIM_MAX, &c->num_heads));
    MOEC_TRY(fe_json_dim_req(j, "intermediate_size", FE_DIM_MAX, &c->intermediate_size));
    MOEC_TRY(
        fe_json_int_or(j, "max_position_embeddings", max_pos_default, &c->max_position_embeddings));
    MOEC_TRY(fe_json_check_range(j, "max_position_embeddings", c->max_position_embeddings, 1,
                                 1LL << 40));
    MOEC_TRY(fe_json_float_or(j, "rms_norm_eps", 1e-6, &c->rms_norm_eps));
    if (c->rms_norm_eps < 0)
        return fe_json_unsupported(j, "rms_norm_eps", "is negative");
    MOEC_TRY(fe_json_bool_or(j, "tie_word_embeddings", 0, &c->tie_word_embeddings));
    MOEC_TRY(read_eos(j, gen, c));
    MOEC_TRY(read_dtype(j, &c->weight_dtype));

    const char *act;
    MOEC_TRY(fe_json_str_or(j, "hidden_act", "silu", &act));
    /* transformers' ACT2FN maps "swish" to SiLU too */
    if (strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        return fe_json_unsupported(j, "hidden_act",
                                   "is not supported (moec supports \"silu\", also named "
                                   "\"swish\")");
    return fe_quant_read(j, &c->quant);
}

/* ---- RoPE -------------------------------------------------------------------- */

/* get_mscale / yarn_get_mscale of the reference. */
static double yarn_mscale(double scale, double mscale)
{
    if (scale <= 1)
        return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

/* find_correction_dim of _compute_yarn_parameters: the dimension whose
 * wavelength turns num_rotations times over the original context. */
static double yarn_correction_dim(double num_rotations, double dim, double base, double ompe)
{
    return (dim * log(ompe / (num_rotations * 2 * M_PI))) / (2 * log(base));
}

/* The rope dict: rope_scaling when it is a non-empty object (it has
 * priority: `rope_scaling or rope_parameters` in convert_rope_params_to_dict),
 * else rope_parameters, else none (an empty view named rope_parameters). */
static moec_status rope_dict(const fe_json *root, fe_json *d)
{
    const cJSON *rs = fe_json_get(root, "rope_scaling");
    const cJSON *rp = fe_json_get(root, "rope_parameters");
    d->obj = NULL;
    d->file = root->file;
    d->prefix = "rope_parameters.";
    if (rs && !cJSON_IsNull(rs)) {
        if (!cJSON_IsObject(rs))
            return json_type_error(root, "rope_scaling", rs, "an object");
        if (rs->child) {
            d->obj = rs;
            d->prefix = "rope_scaling.";
        }
    }
    if (!d->obj && rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp))
            return json_type_error(root, "rope_parameters", rp, "an object");
        d->obj = rp;
    }
    if (d->obj) {
        for (const cJSON *it = d->obj->child; it; it = it->next)
            if (cJSON_IsObject(it))
                return fe_json_unsupported(d, it->string,
                                           "is not supported: per-layer-type RoPE parameters");
    }
    return MOEC_OK;
}

static moec_status rope_yarn(const fe_json *root, const fe_json *d, int64_t dim, int64_t max_pos,
                             fe_rope *r)
{
    if (!fe_json_get(d, "factor"))
        return json_missing(d, "factor");
    int factor_set;
    double factor;
    MOEC_TRY(fe_json_float_opt(d, "factor", &factor_set, &factor));

    /* original_max_position_embeddings: a top-level field of that name
     * overrides the dict's (standardize_rope_params runs again when the
     * frequencies are computed, with the config's extra fields set); absent
     * from both, max_position_embeddings. */
    const fe_json *ojs = root;
    if (!fe_json_get(root, "original_max_position_embeddings"))
        ojs = d;
    double ompe = (double)max_pos;
    if (fe_json_get(ojs, "original_max_position_embeddings")) {
        const cJSON *it = fe_json_get(ojs, "original_max_position_embeddings");
        MOEC_TRY(json_item_float(ojs, "original_max_position_embeddings", it, &ompe));
        if (!(ompe > 0))
            return fe_json_unsupported(ojs, "original_max_position_embeddings", "must be positive");
    }
    if (!factor_set)
        factor = (double)max_pos / ompe;
    if (!(factor > 0))
        return fe_json_unsupported(d, "factor", "must be positive");

    int af_set, ms_set, msa_set, bf_set, bs_set;
    double af = 0, ms = 0, msa = 0, bf = 0, bs = 0;
    MOEC_TRY(fe_json_float_opt(d, "attention_factor", &af_set, &af));
    MOEC_TRY(fe_json_float_opt(d, "mscale", &ms_set, &ms));
    MOEC_TRY(fe_json_float_opt(d, "mscale_all_dim", &msa_set, &msa));
    MOEC_TRY(fe_json_float_opt(d, "beta_fast", &bf_set, &bf));
    MOEC_TRY(fe_json_float_opt(d, "beta_slow", &bs_set, &bs));
    if (!af_set) {
        if (ms_set && ms != 0 && msa_set && msa != 0)
            af = yarn_mscale(factor, ms) / yarn_mscale(factor, msa);
        else
            af = yarn_mscale(factor, 1);
    }
    /* `beta_fast or 32`, `beta_slow or 1`: null and 0 take the default. */
    if (!bf_set || bf == 0)
        bf = 32;
    if (!bs_set || bs == 0)
        bs = 1;

    /* truncate: absent -> True; null is falsy -> no truncation. */
    int truncate = 1;
    const cJSON *tr = fe_json_get(d, "truncate");
    if (tr) {
        if (cJSON_IsNull(tr))
            truncate = 0;
        else if (cJSON_IsBool(tr))
            truncate = cJSON_IsTrue(tr) ? 1 : 0;
        else
            return json_type_error(d, "truncate", tr, "true, false or null");
    }

    double low = yarn_correction_dim(bf, (double)dim, r->theta, ompe);
    double high = yarn_correction_dim(bs, (double)dim, r->theta, ompe);
    if (truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0)
        low = 0;
    if (high > (double)(dim - 1))
        high = (double)(dim - 1);
    if (!isfinite(low) || !isfinite(high) || !isfinite(af))
        return fe_json_unsupported(d, "factor",
                                   "gives a non-finite YaRN correction range with rope_theta %g "
                                   "and original_max_position_embeddings %g",
                                   r->theta, ompe);
    r->kind = FE_ROPE_YARN;
    r->factor = factor;
    r->yarn_low = low;
    r->yarn_high = high;
    r->attn_factor = af;
    return MOEC_OK;
}

moec_status fe_rope_read(const fe_json *root, int64_t dim, int64_t max_pos, fe_rope *r)
{
    memset(r, 0, sizeof *r);
    r->attn_factor = 1.0;
    fe_json d;
    MOEC_TRY(rope_dict(root, &d));
    r->dict_prefix = d.prefix;
    r->dict = d.obj;
    if (dim % 2 != 0)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "%s: the rotary dimension %lld is odd; RoPE rotates pairs of channels",
                        root->file, (long long)dim);

    /* rope_theta: the dict's own, else the top-level field, else 10000
     * (RotaryEmbeddingConfigMixin.default_theta). */
    if (fe_json_get(&d, "rope_theta")) {
        MOEC_TRY(fe_json_float_or(&d, "rope_theta", 0, &r->theta));
        if (!(r->theta > 0))
            return fe_json_unsupported(&d, "rope_theta", "must be positive");
    } else {
        MOEC_TRY(fe_json_float_or(root, "rope_theta", 10000.0, &r->theta));
        if (!(r->theta > 0))
            return fe_json_unsupported(root, "rope_theta", "must be positive");
    }

    /* partial_rotary_factor: moec rotates whole heads. */
    const fe_json *pj = fe_json_is_set(&d, "partial_rotary_factor") ? &d : root;
    int prf_set;
    double prf;
    MOEC_TRY(fe_json_float_opt(pj, "partial_rotary_factor", &prf_set, &prf));
    if (prf_set && prf != 1.0)
        return fe_json_unsupported(pj, "partial_rotary_factor",
                                   "is not supported (moec rotates the whole head)");

    /* rope_type, else the transformers-4 "type", else "default". */
    const char *type_key = fe_json_get(&d, "rope_type") ? "rope_type" : "type";
    const char *type;
    MOEC_TRY(fe_json_str_or(&d, type_key, "default", &type));

    if (strcmp(type, "default") == 0) {
        r->kind = FE_ROPE_DEFAULT;
        return MOEC_OK;
    }
    if (strcmp(type, "linear") != 0 && strcmp(type, "yarn") != 0)
        return fe_json_unsupported(&d, type_key,
                                   "is not supported (moec supports RoPE types default, linear "
                                   "and yarn)");
    /* Read for any scaled type, as DeepSeek's yarn_apply_mscale reads them. */
    int fset, mset;
    MOEC_TRY(fe_json_float_opt(&d, "factor", &fset, &r->dict_factor));
    r->has_dict_factor = fset;
    MOEC_TRY(fe_json_float_opt(&d, "mscale_all_dim", &mset, &r->mscale_all_dim));
    if (!mset)
        r->mscale_all_dim = 0;
    if (strcmp(type, "linear") == 0) {
        if (!fe_json_get(&d, "factor"))
            return json_missing(&d, "factor");
        MOEC_TRY(fe_json_float_or(&d, "factor", 1, &r->factor));
        if (!(r->factor > 0))
            return fe_json_unsupported(&d, "factor", "must be positive");
        r->kind = FE_ROPE_LINEAR;
        return MOEC_OK;
    }
    return rope_yarn(root, &d, dim, max_pos, r);
}

/* ---- building ---------------------------------------------------------------- */

void fe_ctx_layer(fe_ctx *c, int layer)
{
    c->layer = layer;
    if (layer < 0) {
        c->vpre[0] = '\0';
        snprintf(c->tpre, sizeof c->tpre, "model.");
    } else {
        snprintf(c->vpre, sizeof c->vpre, "l%d.", layer);
        snprintf(c->tpre, sizeof c->tpre, "model.layers.%d.", layer);
    }
}

static moec_status join_name(char *buf, size_t cap, const char *pre, const char *name)
{
    int n = snprintf(buf, cap, "%s%s", pre, name);
    if (n < 0 || (size_t)n >= cap)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "frontend: name \"%s%s\" is too long", pre, name);
    return MOEC_OK;
}

/* An IR builder returned NULL; it recorded why. Everything the frontend
 * builds is checked before, so this is a frontend bug or no memory. */
static moec_status ir_failed(const char *what, const char *name)
{
    return moec_err_wrap(MOEC_ERR_INTERNAL, "frontend: building %s %%%s", what, name);
}

static moec_status weight_type(const char *vname, ir_dtype dt, int rank, const int64_t *dims,
                               ir_type *t)
{
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->rank = rank;
    double numel = 1;
    for (int i = 0; i < rank; i++) {
        t->dims[i] = dims[i];
        numel *= (double)dims[i];
    }
    if (numel > (double)FE_WEIGHT_NUMEL_MAX)
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                        "weight %%%s would have %.0f elements; moec supports at most %lld per "
                        "weight",
                        vname, numel, (long long)FE_WEIGHT_NUMEL_MAX);
    return MOEC_OK;
}

moec_status fe_weight(fe_ctx *c, const char *vname, const char *tensor, ir_dtype dt, int rank,
                      const int64_t *dims, ir_value **out)
{
    char vn[256], tn[512];
    ir_type t;
    MOEC_TRY(join_name(vn, sizeof vn, c->vpre, vname));
    MOEC_TRY(join_name(tn, sizeof tn, c->tpre, tensor));
    MOEC_TRY(weight_type(vn, dt, rank, dims, &t));
    *out = ir_module_add_weight(c->m, vn, t, tn);
    return *out ? MOEC_OK : ir_failed("weight", vn);
}

moec_status fe_weight_stack(fe_ctx *c, const char *vname, const char *pattern, ir_dtype dt,
                            int count, int64_t d1, int64_t d2, ir_value **out)
{
    char vn[256], tn[512];
    ir_type t;
    int64_t dims[3] = {count, d1, d2};
    MOEC_TRY(join_name(vn, sizeof vn, c->vpre, vname));
    MOEC_TRY(join_name(tn, sizeof tn, c->tpre, pattern));
    MOEC_TRY(weight_type(vn, dt, 3, dims, &t));
    *out = ir_module_add_weight_stack(c->m, vn, t, tn, count);
    return *out ? MOEC_OK : ir_failed("weight", vn);
}

moec_status fe_weight1(fe_ctx *c, const char *vname, const char *tensor, int64_t d0, ir_value **out)
{
    return fe_weight(c, vname, tensor, c->cc->weight_dtype, 1, &d0, out);
}

moec_status fe_weight2(fe_ctx *c, const char *vname, const char *tensor, int64_t d0, int64_t d1,
                       ir_value **out)
{
    int64_t dims[2] = {d0, d1};
    return fe_weight(c, vname, tensor, c->cc->weight_dtype, 2, dims, out);
}

/* Appends an op with one result %<vpre>name; the caller sets attributes and
 * calls op_finish. */
static moec_status op_begin(fe_ctx *c, ir_op_kind kind, const char *name, ir_value *const *in,
                            int n_in, ir_op **op)
{
    char vn[256];
    MOEC_TRY(join_name(vn, sizeof vn, c->vpre, name));
    const char *names[1] = {vn};
    *op = ir_module_add_op(c->m, kind, in, n_in, names, 1);
    return *op ? MOEC_OK : ir_failed(ir_op_name(kind), vn);
}

static moec_status op_finish(fe_ctx *c, ir_op *op, const ir_type *hint, ir_value **out)
{
    MOEC_TRY(ir_op_finish(c->m, op, hint));
    *out = op->out[0];
    return MOEC_OK;
}

static moec_status op_simple(fe_ctx *c, ir_op_kind kind, const char *name, ir_value *const *in,
                             int n_in, ir_value **out)
{
    ir_op *op;
    MOEC_TRY(op_begin(c, kind, name, in, n_in, &op));
    return op_finish(c, op, NULL, out);
}

moec_status fe_linear(fe_ctx *c, const char *name, ir_value *x, ir_value *w, ir_value *b,
                      ir_value **out)
{
    ir_value *in[3] = {x, w, b};
    return op_simple(c, IR_OP_LINEAR, name, in, b ? 3 : 2, out);
}

moec_status fe_rms_norm(fe_ctx *c, const char *name, ir_value *x, ir_value *w, double eps,
                        ir_value **out)
{
    ir_value *in[2] = {x, w};
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_RMS_NORM, name, in, 2, &op));
    MOEC_TRY(ir_op_set_float(c->m, op, "eps", eps));
    return op_finish(c, op, NULL, out);
}

static ir_type act_type(int rank, const int64_t *dims)
{
    ir_type t;
    memset(&t, 0, sizeof t);
    t.dtype = IR_DTYPE_F32;
    t.rank = rank;
    t.dims[0] = IR_DIM_T;
    for (int i = 1; i < rank; i++)
        t.dims[i] = dims[i - 1];
    return t;
}

moec_status fe_reshape(fe_ctx *c, const char *name, ir_value *x, int rank, const int64_t *dims,
                       ir_value **out)
{
    ir_type t = act_type(rank, dims);
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_RESHAPE, name, &x, 1, &op));
    return op_finish(c, op, &t, out);
}

moec_status fe_expand(fe_ctx *c, const char *name, ir_value *x, int rank, const int64_t *dims,
                      ir_value **out)
{
    ir_type t = act_type(rank, dims);
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_EXPAND, name, &x, 1, &op));
    return op_finish(c, op, &t, out);
}

moec_status fe_slice(fe_ctx *c, const char *name, ir_value *x, int axis, int64_t start,
                     int64_t size, ir_value **out)
{
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_SLICE, name, &x, 1, &op));
    MOEC_TRY(ir_op_set_int(c->m, op, "axis", axis));
    MOEC_TRY(ir_op_set_int(c->m, op, "start", start));
    MOEC_TRY(ir_op_set_int(c->m, op, "size", size));
    return op_finish(c, op, NULL, out);
}

moec_status fe_concat2(fe_ctx *c, const char *name, ir_value *a, ir_value *b, int axis,
                       ir_value **out)
{
    ir_value *in[2] = {a, b};
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_CONCAT, name, in, 2, &op));
    MOEC_TRY(ir_op_set_int(c->m, op, "axis", axis));
    return op_finish(c, op, NULL, out);
}

moec_status fe_binary(fe_ctx *c, ir_op_kind kind, const char *name, ir_value *a, ir_value *b,
                      ir_value **out)
{
    ir_value *in[2] = {a, b};
    return op_simple(c, kind, name, in, 2, out);
}

moec_status fe_unary(fe_ctx *c, ir_op_kind kind, const char *name, ir_value *x, ir_value **out)
{
    return op_simple(c, kind, name, &x, 1, out);
}

moec_status fe_rope_op(fe_ctx *c, const char *name, ir_value *x, const fe_rope *r, ir_value **out)
{
    ir_value *in[2] = {x, c->positions};
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_ROPE, name, in, 2, &op));
    MOEC_TRY(ir_op_set_str(c->m, op, "style", r->style));
    MOEC_TRY(ir_op_set_float(c->m, op, "theta", r->theta));
    if (r->kind == FE_ROPE_LINEAR) {
        MOEC_TRY(ir_op_set_str(c->m, op, "scaling", "linear"));
        MOEC_TRY(ir_op_set_float(c->m, op, "factor", r->factor));
    } else if (r->kind == FE_ROPE_YARN) {
        MOEC_TRY(ir_op_set_str(c->m, op, "scaling", "yarn"));
        MOEC_TRY(ir_op_set_float(c->m, op, "factor", r->factor));
        MOEC_TRY(ir_op_set_float(c->m, op, "yarn_low", r->yarn_low));
        MOEC_TRY(ir_op_set_float(c->m, op, "yarn_high", r->yarn_high));
        MOEC_TRY(ir_op_set_float(c->m, op, "attn_factor", r->attn_factor));
    }
    if (r->rotary_dim > 0)
        MOEC_TRY(ir_op_set_int(c->m, op, "rotary_dim", r->rotary_dim));
    return op_finish(c, op, NULL, out);
}

moec_status fe_attention(fe_ctx *c, const char *name, ir_value *q, ir_value *k, ir_value *v,
                         double scale, int64_t window, ir_value **out)
{
    ir_value *in[4] = {q, k, v, c->positions};
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_ATTENTION, name, in, 4, &op));
    MOEC_TRY(ir_op_set_float(c->m, op, "scale", scale));
    if (window > 0)
        MOEC_TRY(ir_op_set_int(c->m, op, "window", window));
    return op_finish(c, op, NULL, out);
}

moec_status fe_attention_sel(fe_ctx *c, const char *name, ir_value *q, ir_value *k, ir_value *v,
                             ir_value *sel, double scale, ir_value **out)
{
    ir_value *in[5] = {q, k, v, c->positions, sel};
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_ATTENTION, name, in, 5, &op));
    MOEC_TRY(ir_op_set_float(c->m, op, "scale", scale));
    return op_finish(c, op, NULL, out);
}

moec_status fe_layer_norm(fe_ctx *c, const char *name, ir_value *x, ir_value *w, ir_value *b,
                          double eps, ir_value **out)
{
    ir_value *in[3] = {x, w, b};
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_LAYER_NORM, name, in, 3, &op));
    MOEC_TRY(ir_op_set_float(c->m, op, "eps", eps));
    return op_finish(c, op, NULL, out);
}

moec_status fe_dsa_topk(fe_ctx *c, const char *name, ir_value *q, ir_value *k, ir_value *w,
                        int64_t top_k, double scale, double weight_scale, ir_value **out)
{
    ir_value *in[4] = {q, k, w, c->positions};
    ir_op *op;
    MOEC_TRY(op_begin(c, IR_OP_DSA_TOPK, name, in, 4, &op));
    MOEC_TRY(ir_op_set_int(c->m, op, "top_k", top_k));
    MOEC_TRY(ir_op_set_float(c->m, op, "scale", scale));
    MOEC_TRY(ir_op_set_float(c->m, op, "weight_scale", weight_scale));
    return op_finish(c, op, NULL, out);
}

moec_status fe_mlp(fe_ctx *c, const char *vmod, const char *tmod, ir_value *x, int64_t inter,
                   int bias, ir_value **out)
{
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    int64_t H = c->cc->hidden_size;
    ir_value *w[3], *b[3] = {NULL, NULL, NULL};
    char vn[128], tn[128];
    for (int i = 0; i < 3; i++) {
        int64_t rows = i < 2 ? inter : H, cols = i < 2 ? H : inter;
        snprintf(vn, sizeof vn, "%s.%s", vmod, proj[i]);
        snprintf(tn, sizeof tn, "%s.%s.weight", tmod, proj[i]);
        MOEC_TRY(fe_linear_weight(c, vn, tn, rows, cols, &w[i]));
        if (bias) {
            snprintf(vn, sizeof vn, "%s.%s.bias", vmod, proj[i]);
            snprintf(tn, sizeof tn, "%s.%s.bias", tmod, proj[i]);
            MOEC_TRY(fe_weight1(c, vn, tn, rows, &b[i]));
        }
    }
    ir_value *gate, *up, *act, *hidden;
    snprintf(vn, sizeof vn, "%s.gate", vmod);
    MOEC_TRY(fe_linear(c, vn, x, w[0], b[0], &gate));
    snprintf(vn, sizeof vn, "%s.up", vmod);
    MOEC_TRY(fe_linear(c, vn, x, w[1], b[1], &up));
    snprintf(vn, sizeof vn, "%s.act", vmod);
    MOEC_TRY(fe_unary(c, IR_OP_SILU, vn, gate, &act));
    snprintf(vn, sizeof vn, "%s.hidden", vmod);
    MOEC_TRY(fe_binary(c, IR_OP_MUL, vn, act, up, &hidden));
    snprintf(vn, sizeof vn, "%s.out", vmod);
    return fe_linear(c, vn, hidden, w[2], b[2], out);
}

moec_status fe_moe_routed(fe_ctx *c, ir_value *x, int64_t n_experts, int64_t moe_inter,
                          const fe_topk *tk, ir_value *bias, ir_value **out)
{
    int64_t H = c->cc->hidden_size;
    ir_value *router, *logits;
    MOEC_TRY(fe_weight2(c, "moe.router", "mlp.gate.weight", n_experts, H, &router));
    MOEC_TRY(fe_linear(c, "moe.logits", x, router, NULL, &logits));

    char ids_name[64], w_name[64];
    MOEC_TRY(join_name(ids_name, sizeof ids_name, c->vpre, "moe.topk_ids"));
    MOEC_TRY(join_name(w_name, sizeof w_name, c->vpre, "moe.topk_w"));
    const char *names[2] = {ids_name, w_name};
    ir_value *in[2] = {logits, bias};
    ir_op *op = ir_module_add_op(c->m, IR_OP_MOE_TOPK, in, bias ? 2 : 1, names, 2);
    if (!op)
        return ir_failed("moe_topk", ids_name);
    MOEC_TRY(ir_op_set_str(c->m, op, "scoring", tk->scoring));
    MOEC_TRY(ir_op_set_int(c->m, op, "top_k", tk->top_k));
    if (tk->n_group > 1) {
        MOEC_TRY(ir_op_set_int(c->m, op, "n_group", tk->n_group));
        MOEC_TRY(ir_op_set_int(c->m, op, "topk_group", tk->topk_group));
        MOEC_TRY(ir_op_set_str(c->m, op, "group_score", tk->group_score));
    }
    MOEC_TRY(ir_op_set_int(c->m, op, "norm_topk_prob", tk->norm_topk_prob ? 1 : 0));
    MOEC_TRY(ir_op_set_float(c->m, op, "scaling", tk->scaling));
    MOEC_TRY(ir_op_finish(c->m, op, NULL));
    ir_value *ids = op->out[0], *topk_w = op->out[1];

    ir_value *gate, *up, *down;
    int E = (int)n_experts;
    MOEC_TRY(fe_linear_weight_stack(c, "moe.experts.gate", "mlp.experts.{e}.gate_proj.weight", E,
                                    moe_inter, H, &gate));
    MOEC_TRY(fe_linear_weight_stack(c, "moe.experts.up", "mlp.experts.{e}.up_proj.weight", E,
                                    moe_inter, H, &up));
    MOEC_TRY(fe_linear_weight_stack(c, "moe.experts.down", "mlp.experts.{e}.down_proj.weight", E,
                                    H, moe_inter, &down));
    ir_value *ein[5] = {x, ids, gate, up, down};
    ir_value *experts, *w3, *weighted;
    MOEC_TRY(op_simple(c, IR_OP_MOE_EXPERTS, "moe.experts", ein, 5, &experts));

    /* The unfused combine: each expert's output times its routing weight,
     * then the sum over the k chosen experts. */
    int64_t wdims[2] = {tk->top_k, 1};
    MOEC_TRY(fe_reshape(c, "moe.topk_w3", topk_w, 3, wdims, &w3));
    MOEC_TRY(fe_binary(c, IR_OP_MUL, "moe.weighted", experts, w3, &weighted));
    ir_op *rop;
    MOEC_TRY(op_begin(c, IR_OP_REDUCE_SUM, "moe.routed", &weighted, 1, &rop));
    MOEC_TRY(ir_op_set_int(c->m, rop, "axis", 1));
    return op_finish(c, rop, NULL, out);
}

/* eos_token_id: one id as an int (as modules had it before lists), several
 * as a list. */
static moec_status model_eos_meta(ir_module *m, const fe_common *cc)
{
    if (cc->n_eos == 0)
        return MOEC_OK;
    int64_t *ids = malloc((size_t)cc->n_eos * sizeof *ids);
    if (!ids)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for %d eos ids", cc->n_eos);
    int n = 0;
    for (const cJSON *e = eos_first(cc->eos); e; e = eos_next(cc->eos, e))
        ids[n++] = (int64_t)e->valuedouble;
    moec_status st = n == 1 ? ir_module_set_meta_int(m, "eos_token_id", ids[0])
                            : ir_module_set_meta_ints(m, "eos_token_id", ids, n);
    free(ids);
    return st;
}

static moec_status model_metas(ir_module *m, const fe_common *cc)
{
    MOEC_TRY(ir_module_set_meta_int(m, "vocab_size", cc->vocab_size));
    MOEC_TRY(ir_module_set_meta_int(m, "hidden_size", cc->hidden_size));
    MOEC_TRY(ir_module_set_meta_int(m, "num_hidden_layers", cc->num_layers));
    MOEC_TRY(ir_module_set_meta_int(m, "max_position_embeddings", cc->max_position_embeddings));
    MOEC_TRY(model_eos_meta(m, cc));
    MOEC_TRY(ir_module_set_meta_int(m, "tie_word_embeddings", cc->tie_word_embeddings ? 1 : 0));
    return MOEC_OK;
}

static moec_status model_body(fe_ctx *c, const fe_family *fam, const void *cfg)
{
    const fe_common *cc = c->cc;
    ir_module *m = c->m;
    ir_type ids_t = {IR_DTYPE_I32, 1, {IR_DIM_T}};
    ir_value *tokens = ir_module_add_input(m, "tokens", ids_t);
    if (!tokens)
        return ir_failed("input", "tokens");
    c->positions = ir_module_add_input(m, "positions", ids_t);
    if (!c->positions)
        return ir_failed("input", "positions");

    fe_ctx_layer(c, -1);
    ir_value *embed_w, *x;
    MOEC_TRY(fe_weight2(c, "embed_tokens", "embed_tokens.weight", cc->vocab_size, cc->hidden_size,
                        &embed_w));
    ir_value *ein[2] = {tokens, embed_w};
    MOEC_TRY(op_simple(c, IR_OP_EMBEDDING, "embed", ein, 2, &x));

    for (int i = 0; i < cc->num_layers; i++) {
        fe_ctx_layer(c, i);
        ir_value *w, *h, *a, *f;
        MOEC_TRY(fe_weight1(c, "input_layernorm", "input_layernorm.weight", cc->hidden_size, &w));
        MOEC_TRY(fe_rms_norm(c, "attn_norm", x, w, cc->rms_norm_eps, &h));
        MOEC_TRY(fam->attention(c, cfg, h, &a));
        MOEC_TRY(fe_binary(c, IR_OP_ADD, "attn_residual", x, a, &x));
        MOEC_TRY(fe_weight1(c, "post_attention_layernorm", "post_attention_layernorm.weight",
                            cc->hidden_size, &w));
        MOEC_TRY(fe_rms_norm(c, "mlp_norm", x, w, cc->rms_norm_eps, &h));
        MOEC_TRY(fam->mlp(c, cfg, h, &f));
        MOEC_TRY(fe_binary(c, IR_OP_ADD, "mlp_residual", x, f, &x));
    }

    fe_ctx_layer(c, -1);
    ir_value *norm_w, *h, *head, *logits;
    MOEC_TRY(fe_weight1(c, "norm", "norm.weight", cc->hidden_size, &norm_w));
    MOEC_TRY(fe_rms_norm(c, "final_norm", x, norm_w, cc->rms_norm_eps, &h));
    if (cc->tie_word_embeddings) {
        head = embed_w;
    } else {
        c->tpre[0] = '\0'; /* lm_head.weight sits outside "model." */
        MOEC_TRY(
            fe_weight2(c, "lm_head", "lm_head.weight", cc->vocab_size, cc->hidden_size, &head));
    }
    MOEC_TRY(fe_linear(c, "logits", h, head, NULL, &logits));
    return ir_module_add_output(m, logits);
}

moec_status fe_model_build(const fe_common *cc, const fe_family *fam, const void *cfg,
                           ir_module **out)
{
    *out = NULL;
    ir_module *m = ir_module_init(cc->model_type);
    if (!m)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory creating the module for %s", cc->model_type);
    fe_ctx c;
    memset(&c, 0, sizeof c);
    c.m = m;
    c.cc = cc;
    moec_status st = model_metas(m, cc);
    if (st == MOEC_OK)
        st = model_body(&c, fam, cfg);
    if (st != MOEC_OK) {
        ir_module_free(m);
        return st;
    }
    *out = m;
    return MOEC_OK;
}

/* ---- entry points ------------------------------------------------------------ */

/* Parses a config file's text (named file in errors): JSON with no key
 * written twice. */
static moec_status config_parse(const char *text, const char *file, cJSON **out)
{
    const char *end = NULL;
    *out = cJSON_ParseWithOpts(text, &end, 1);
    if (!*out)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: not valid JSON (at byte %ld)", file,
                        end ? (long)(end - text) : 0L);
    moec_status st = moec_json_check_unique(*out, file);
    if (st != MOEC_OK) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return st;
}

/* The family's builder and default max_position_embeddings for j's
 * model_type. */
static moec_status config_family(const fe_json *j,
                                 moec_status (**build)(const fe_json *, const fe_common *,
                                                       ir_module **),
                                 int64_t *max_pos)
{
    const char *type = NULL;
    MOEC_TRY(fe_json_str_or(j, "model_type", NULL, &type));
    if (!type)
        return json_missing(j, "model_type");
    if (strcmp(type, "deepseek_v2") == 0 || strcmp(type, "deepseek_v3") == 0 ||
        strcmp(type, "deepseek_v32") == 0) {
        *build = fe_deepseek_build;
        *max_pos = strcmp(type, "deepseek_v2") == 0   ? 2048
                   : strcmp(type, "deepseek_v3") == 0 ? 4096
                                                      : 163840;
    } else if (strcmp(type, "qwen2_moe") == 0 || strcmp(type, "qwen3_moe") == 0) {
        *build = fe_qwen_build;
        *max_pos = 32768;
    } else {
        return fe_json_unsupported(j, "model_type",
                                   "is not supported (moec supports deepseek_v2, deepseek_v3, "
                                   "deepseek_v32, qwen2_moe and qwen3_moe)");
    }
    return MOEC_OK;
}

/* The verified module of a parsed config and, when gen is not NULL, its
 * generation config. */
static moec_status config_build(const fe_json *j, const fe_json *gen, ir_module **out)
{
    if (!cJSON_IsObject(j->obj))
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: the config must be a JSON object", j->file);
    if (gen && !cJSON_IsObject(gen->obj))
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: the generation config must be a JSON object",
                        gen->file);
    moec_status (*build)(const fe_json *, const fe_common *, ir_module **);
    int64_t max_pos;
    MOEC_TRY(config_family(j, &build, &max_pos));
    fe_common cc;
    MOEC_TRY(fe_common_read(j, gen, max_pos, &cc));
    MOEC_TRY(build(j, &cc, out));
    moec_status st = ir_module_verify(*out);
    if (st != MOEC_OK) {
        moec_err_wrap(st, "%s: the frontend built an invalid module", j->file);
        ir_module_free(*out);
        *out = NULL;
    }
    return st;
}

moec_status fe_config_build(const char *json, const char *filename, ir_module **out)
{
    if (!json || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "fe_config_build: NULL argument");
    *out = NULL;
    if (!filename)
        filename = "config.json";
    cJSON *root;
    MOEC_TRY(config_parse(json, filename, &root));
    fe_json j = {root, filename, ""};
    moec_status st = config_build(&j, NULL, out);
    cJSON_Delete(root);
    return st;
}

/* Reads and parses the config file path; with optional, a path that does
 * not exist gives MOEC_OK and *out NULL. */
static moec_status config_read(const char *path, int optional, cJSON **out)
{
    char *text;
    size_t len;
    *out = NULL;
    MOEC_TRY(optional ? moec_file_read_optional(path, MOEC_FILE_CONFIG_MAX, &text, &len)
                      : moec_file_read(path, MOEC_FILE_CONFIG_MAX, &text, &len));
    if (!text)
        return MOEC_OK;
    moec_status st = strlen(text) != len
                         ? MOEC_ERR(MOEC_ERR_FORMAT, "%s: not valid JSON (a NUL byte at byte %zu)",
                                    path, strlen(text))
                         : config_parse(text, path, out);
    free(text);
    return st;
}

moec_status fe_config_load(const char *path, ir_module **out)
{
    if (!path || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "fe_config_load: NULL argument");
    *out = NULL;
    cJSON *root;
    MOEC_TRY(config_read(path, 0, &root));
    fe_json j = {root, path, ""};
    moec_status st = config_build(&j, NULL, out);
    cJSON_Delete(root);
    return st;
}

moec_status fe_model_load(const char *model_dir, ir_module **out)
{
    if (!model_dir || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "fe_model_load: NULL argument");
    *out = NULL;
    size_t plen = strlen(model_dir) + sizeof "/generation_config.json";
    char *path = malloc(plen), *gen_path = malloc(plen);
    cJSON *root = NULL, *gen_root = NULL;
    moec_status st = path && gen_path ? MOEC_OK
                                      : MOEC_ERR(MOEC_ERR_OOM, "out of memory opening %s",
                                                 model_dir);
    if (st == MOEC_OK) {
        snprintf(path, plen, "%s/config.json", model_dir);
        snprintf(gen_path, plen, "%s/generation_config.json", model_dir);
        st = config_read(path, 0, &root);
    }
    if (st == MOEC_OK)
        st = config_read(gen_path, 1, &gen_root);
    if (st == MOEC_OK) {
        fe_json j = {root, path, ""}, gen = {gen_root, gen_path, ""};
        st = config_build(&j, gen_root ? &gen : NULL, out);
    }
    cJSON_Delete(gen_root);
    cJSON_Delete(root);
    free(gen_path);
    free(path);
    return st;
}
