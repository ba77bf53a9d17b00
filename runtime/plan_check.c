/* plan_check.c — the checkpoint hashes a plan file carries (ir_plan_meta)
 * and the check that a plan is bound only to the checkpoint it was compiled
 * for: config.json's bytes, and the name, dtype and shape of every tensor
 * the module binds (a block-scaled weight's scale tensors too), as the
 * checkpoint's safetensors headers give them. */
#include "runtime/plan_check.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "file.h"
#include "hash.h"
#include "runtime/safetensors.h"

static void hex64(uint64_t h, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)h); }

/* The files whose bytes make the config hash: generation_config.json gives
 * the eos ids the plan carries; a folder without one hashes as before it
 * was read. */
static const char *const CONFIG_FILES[2] = {"config.json", "generation_config.json"};

moec_status rt_hash_config(const char *model_dir, char out[17])
{
    uint64_t h = MOEC_FNV_SEED;
    for (int i = 0; i < 2; i++) {
        char path[4096], *text;
        size_t len;
        snprintf(path, sizeof path, "%s/%s", model_dir, CONFIG_FILES[i]);
        MOEC_TRY(i == 0 ? moec_file_read(path, MOEC_FILE_CONFIG_MAX, &text, &len)
                        : moec_file_read_optional(path, MOEC_FILE_CONFIG_MAX, &text, &len));
        if (!text)
            continue;
        if (i > 0)
            h = moec_fnv1a(h, CONFIG_FILES[i], strlen(CONFIG_FILES[i]) + 1);
        h = moec_fnv1a(h, text, len);
        free(text);
    }
    hex64(h, out);
    return MOEC_OK;
}

static uint64_t hash_tensor(uint64_t h, const rt_st_tensor *t)
{
    h = moec_fnv1a(h, t->name, strlen(t->name) + 1);
    const char *dt = rt_st_dtype_name(t->dtype);
    h = moec_fnv1a(h, dt, strlen(dt) + 1);
    for (int d = 0; d < t->rank; d++) {
        int64_t v = t->shape[d];
        h = moec_fnv1a(h, &v, sizeof v);
    }
    return h;
}

static moec_status hash_binding(const rt_safetensors *st, const ir_binding *b, const char *dir,
                                uint64_t *h)
{
    if (b->kind == IR_BIND_CONCAT) {
        for (int i = 0; i < b->n_parts; i++)
            MOEC_TRY(hash_binding(st, &b->parts[i], dir, h));
        return MOEC_OK;
    }
    int count = b->kind == IR_BIND_STACK ? b->count : 1;
    for (int e = 0; e < count; e++) {
        char name[1024];
        if (ir_binding_tensor_name(b, e, name, sizeof name))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "tensor name '%.200s' is too long", b->name);
        const rt_st_tensor *t = rt_safetensors_find(st, name);
        if (!t)
            return MOEC_ERR(MOEC_ERR_MISMATCH, "tensor '%s' not found in %s", name, dir);
        *h = hash_tensor(*h, t);
    }
    return MOEC_OK;
}

moec_status rt_hash_weights(const ir_module *m, const char *model_dir, char out[17])
{
    rt_safetensors *st = NULL;
    MOEC_TRY(rt_safetensors_open_dir(model_dir, &st));
    uint64_t h = MOEC_FNV_SEED;
    moec_status s = MOEC_OK;
    for (int i = 0; i < m->n_values && s == MOEC_OK; i++) {
        const ir_value *v = m->values[i];
        if (v->kind != IR_VALUE_WEIGHT)
            continue;
        s = hash_binding(st, &v->bind, model_dir, &h);
        if (s == MOEC_OK && v->scale.block[0] > 0)
            s = hash_binding(st, &v->scale.bind, model_dir, &h);
    }
    rt_safetensors_free(st);
    if (s == MOEC_OK)
        hex64(h, out);
    return s;
}

moec_status rt_plan_check_checkpoint(const ir_plan_meta *meta, const ir_module *m,
                                     const char *plan_path, const char *model_dir)
{
    char cfg[17], w[17];
    MOEC_TRY(rt_hash_config(model_dir, cfg));
    if (strcmp(cfg, meta->config_hash))
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "plan %s was compiled for another config (config hash %s; %s/config.json "
                        "with its generation_config.json has %s)",
                        plan_path, meta->config_hash, model_dir, cfg);
    MOEC_TRY(rt_hash_weights(m, model_dir, w));
    if (strcmp(w, meta->weights_hash))
        return MOEC_ERR(MOEC_ERR_MISMATCH,
                        "plan %s was compiled for another checkpoint (weights hash %s; %s has %s)",
                        plan_path, meta->weights_hash, model_dir, w);
    return MOEC_OK;
}

