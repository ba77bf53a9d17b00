/* fe_quant.c — quantized checkpoints: the quantization_config moec reads
 * (fp8 weights as DeepSeek-V3/R1 and Qwen3-FP8 publish them: float8 e4m3
 * codes with one f32 weight_scale_inv per block of 128 x 128, the fields
 * transformers' FineGrainedFP8Config reads), and which weights it
 * quantizes: every linear a decoder layer projects through (attention, the
 * dense and shared MLPs, the routed experts) unless modules_to_not_convert
 * (transformers) or ignored_layers (vLLM) names it (docs/IR.md, "Block-
 * scaled (fp8) weights", says how names match). Embeddings, lm_head,
 * norms, routers, biases and e_score_correction_bias never are: the
 * reference never quantizes them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "compiler/fe_internal.h"
#include "json.h"

/* The weights a list entry names are modules, written literally: moec does
 * not read transformers' regular expressions. */
static int fe_quant_entry_valid(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '.'))
            return 0;
    return 1;
}

/* A list of module names (absent or null: none) into *out. */
static moec_status fe_quant_list(const fe_json *j, const char *key, const cJSON **out)
{
    const cJSON *it = fe_json_get(j, key);
    *out = NULL;
    if (!it || cJSON_IsNull(it))
        return MOEC_OK;
    if (!cJSON_IsArray(it))
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: field \"%s%s\" must be a list of module names",
                        j->file, j->prefix, key);
    int i = 0;
    for (const cJSON *e = it->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e) || !e->valuestring)
            return MOEC_ERR(MOEC_ERR_FORMAT, "%s: field \"%s%s\" item %d must be a string",
                            j->file, j->prefix, key, i);
        if (!fe_quant_entry_valid(e->valuestring))
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "%s: field \"%s%s\" item %d = \"%.120s\" is not supported: moec "
                            "matches module names literally (letters, digits, '_' and '.'), not "
                            "patterns",
                            j->file, j->prefix, key, i, e->valuestring);
    }
    *out = it;
    return MOEC_OK;
}

/* weight_block_size: two sizes >= 1; absent: transformers' [128, 128]. */
static moec_status fe_quant_block(const fe_json *j, int64_t *block)
{
    const cJSON *it = fe_json_get(j, "weight_block_size");
    block[0] = block[1] = 128;
    if (!it)
        return MOEC_OK;
    if (cJSON_IsNull(it))
        return fe_json_unsupported(j, "weight_block_size",
                                   "is not supported: moec reads block-scaled fp8 (one scale per "
                                   "block), not a scale per tensor");
    if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2)
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "%s: field \"%sweight_block_size\" must be a list of two integers "
                        "(rows, columns)",
                        j->file, j->prefix);
    int k = 0;
    for (const cJSON *e = it->child; e; e = e->next, k++) {
        moec_json_int_result r = moec_json_int(e, 1, (double)FE_DIM_MAX, &block[k]);
        if (r == MOEC_JSON_INT_NOT_INT)
            return MOEC_ERR(MOEC_ERR_FORMAT,
                            "%s: field \"%sweight_block_size\" must be a list of two integers "
                            "(rows, columns)",
                            j->file, j->prefix);
        if (r != MOEC_JSON_INT_OK) {
            char v[64];
            moec_json_repr(e, v, sizeof v);
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "%s: field \"%sweight_block_size\" = [%s, ...] is not supported "
                            "(block sizes must be in [1, %lld])",
                            j->file, j->prefix, v, (long long)FE_DIM_MAX);
        }
    }
    return MOEC_OK;
}

/* The fields FineGrainedFP8Config (transformers 5.24) adds that change
 * which tensors are fp8 or how their scales are stored. scale_fmt "ue8m0"
 * (DeepSeek-V3.1 and later) says each block scale is a power of two: as the
 * F32 tensors those checkpoints hold, their values are what moec multiplies
 * by (scales stored as 1-byte e8m0 do not load: the loader asks for F32).
 * expert_dtype "fp4" packs the experts in 4 bits, and modules_to_convert
 * quantizes modules outside the decoder layers' linears (embeddings): moec
 * reads neither, so both are refused here rather than at weight load. */
static moec_status fe_quant_storage(const fe_json *j)
{
    const char *s;
    MOEC_TRY(fe_json_str_opt(j, "scale_fmt", &s));
    if (s && strcmp(s, "float") != 0 && strcmp(s, "ue8m0") != 0)
        return fe_json_unsupported(j, "scale_fmt",
                                   "is not supported (\"float\" or \"ue8m0\": F32 block scales)");
    MOEC_TRY(fe_json_str_opt(j, "expert_dtype", &s));
    if (s && strcmp(s, "fp8") != 0)
        return fe_json_unsupported(j, "expert_dtype",
                                   "is not supported (moec reads fp8 experts: \"fp8\")");
    /* An empty list converts nothing, as in the reference. */
    const cJSON *it = fe_json_get(j, "modules_to_convert");
    if (it && !cJSON_IsNull(it) && !(cJSON_IsArray(it) && !it->child))
        return fe_json_unsupported(j, "modules_to_convert",
                                   "is not supported: moec quantizes only the linears of the "
                                   "decoder layers, never embeddings");
    return MOEC_OK;
}

moec_status fe_quant_read(const fe_json *root, fe_quant *q)
{
    memset(q, 0, sizeof *q);
    const cJSON *it = fe_json_get(root, "quantization_config");
    if (!it || cJSON_IsNull(it))
        return MOEC_OK;
    if (!cJSON_IsObject(it))
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: field \"quantization_config\" must be an object",
                        root->file);
    fe_json j = {it, root->file, "quantization_config."};
    if (!fe_json_get(&j, "quant_method"))
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "%s: missing required field \"quantization_config.quant_method\"",
                        root->file);
    const char *method, *fmt, *act;
    MOEC_TRY(fe_json_str_or(&j, "quant_method", NULL, &method));
    if (strcmp(method, "fp8") != 0)
        return fe_json_unsupported(&j, "quant_method",
                                   "is not supported (moec reads block-scaled fp8 checkpoints: "
                                   "quant_method \"fp8\")");
    MOEC_TRY(fe_json_str_opt(&j, "fmt", &fmt));
    if (fmt && strcmp(fmt, "e4m3") != 0)
        return fe_json_unsupported(&j, "fmt", "is not supported (moec reads float8 e4m3 weights)");
    /* FineGrainedFP8Config lower-cases it. */
    MOEC_TRY(fe_json_str_or(&j, "activation_scheme", "dynamic", &act));
    if (strcasecmp(act, "dynamic") != 0)
        return fe_json_unsupported(&j, "activation_scheme",
                                   "is not supported (\"dynamic\" only: moec keeps activations in "
                                   "floating point and has no static activation scales)");
    MOEC_TRY(fe_quant_block(&j, q->block));
    MOEC_TRY(fe_quant_storage(&j));
    MOEC_TRY(fe_quant_list(&j, "modules_to_not_convert", &q->skip[0]));
    MOEC_TRY(fe_quant_list(&j, "ignored_layers", &q->skip[1]));
    q->fp8 = 1;
    return MOEC_OK;
}

/* 1 when entry e names module `name` ("model.layers.3.mlp.gate_proj"): the
 * module itself, a module holding it ("model.layers.3", "model.layers.3.")
 * or, after a dot, any module of that name ("o_proj", "mlp.gate_proj"). */
static int fe_quant_names(const char *e, const char *name)
{
    size_t le = strlen(e), ln = strlen(name);
    if (!strncmp(name, e, le) && (name[le] == '\0' || name[le] == '.' || e[le - 1] == '.'))
        return 1;
    return ln > le && name[ln - le - 1] == '.' && !strcmp(name + ln - le, e);
}

/* 1 when the config quantizes the linear whose weight tensor is `tensor`
 * ("<module>.weight"). */
static int fe_quant_applies(const fe_quant *q, const char *tensor)
{
    if (!q->fp8)
        return 0;
    char module[512];
    size_t n = strlen(tensor);
    if (n > 7 && !strcmp(tensor + n - 7, ".weight"))
        n -= 7;
    snprintf(module, sizeof module, "%.*s", (int)n, tensor);
    for (int l = 0; l < 2; l++)
        for (const cJSON *e = q->skip[l] ? q->skip[l]->child : NULL; e; e = e->next)
            if (fe_quant_names(e->valuestring, module))
                return 0;
    return 1;
}

/* "<tpre><tensor>" and its scales' "<tpre><tensor>_scale_inv". */
static moec_status fe_quant_names_of(const fe_ctx *c, const char *tensor, char *full, char *scale,
                                     size_t cap)
{
    int n = snprintf(full, cap, "%s%s", c->tpre, tensor);
    int k = snprintf(scale, cap, "%s%s_scale_inv", c->tpre, tensor);
    if (n < 0 || k < 0 || (size_t)k >= cap)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "frontend: tensor name \"%s%s\" is too long", c->tpre,
                        tensor);
    return MOEC_OK;
}

moec_status fe_linear_weight(fe_ctx *c, const char *vname, const char *tensor, int64_t rows,
                             int64_t cols, ir_value **out)
{
    const fe_quant *q = &c->cc->quant;
    char full[512], scale[512];
    MOEC_TRY(fe_quant_names_of(c, tensor, full, scale, sizeof full));
    if (!fe_quant_applies(q, full))
        return fe_weight2(c, vname, tensor, rows, cols, out);
    int64_t dims[2] = {rows, cols};
    MOEC_TRY(fe_weight(c, vname, tensor, IR_DTYPE_F8E4M3, 2, dims, out));
    ir_binding sb = {.kind = IR_BIND_TENSOR, .name = scale};
    return ir_weight_set_block_scale(c->m, *out, q->block[0], q->block[1], &sb);
}

moec_status fe_linear_weight_stack(fe_ctx *c, const char *vname, const char *pattern, int count,
                                   int64_t rows, int64_t cols, ir_value **out)
{
    const fe_quant *q = &c->cc->quant;
    char full[512], scale[512], expert[560];
    MOEC_TRY(fe_quant_names_of(c, pattern, full, scale, sizeof full));
    const char *at = strstr(full, "{e}");
    /* transformers 5 holds a layer's experts in one module, "<...>.experts" */
    char group[512];
    snprintf(group, sizeof group, "%.*s", at && at > full ? (int)(at - full - 1) : 0, full);
    int quantized = 0;
    for (int e = 0; e < count && at && fe_quant_applies(q, group); e++) {
        snprintf(expert, sizeof expert, "%.*s%d%s", (int)(at - full), full, e, at + 3);
        int qe = fe_quant_applies(q, expert);
        if (e > 0 && qe != quantized)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "quantization_config: modules_to_not_convert / ignored_layers name "
                            "some of the experts \"%s\" but not others; moec keeps a layer's "
                            "experts in one dtype",
                            full);
        quantized = qe;
    }
    if (!quantized)
        return fe_weight_stack(c, vname, pattern, c->cc->weight_dtype, count, rows, cols, out);
    MOEC_TRY(fe_weight_stack(c, vname, pattern, IR_DTYPE_F8E4M3, count, rows, cols, out));
    ir_binding sb = {.kind = IR_BIND_STACK, .name = scale, .count = count};
    return ir_weight_set_block_scale(c->m, *out, q->block[0], q->block[1], &sb);
}
