/* eos.c — a module's eos ids (generation_config.json's, else config.json's,
 * one id or a list, carried in the module's meta and so in plan files) as
 * sessions, engines and models give them out. */
#include <stdlib.h>

#include "engine/engine_internal.h"
#include "err.h"

moec_status moec_eos_init(const ir_module *m, moec_eos *out)
{
    const int64_t *v;
    int n = ir_module_meta_ints(m, "eos_token_id", &v);
    int64_t vocab = ir_module_meta_int(m, "vocab_size", 0);
    out->n = 0;
    out->ids = malloc((size_t)(n ? n : 1) * sizeof *out->ids);
    if (!out->ids)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for %d eos ids", n);
    for (int i = 0; i < n; i++) {
        if (v[i] < 0 || v[i] >= vocab)
            return MOEC_ERR(MOEC_ERR_FORMAT,
                            "module %s: eos id %lld is outside the vocabulary (vocab_size %lld)",
                            m->name, (long long)v[i], (long long)vocab);
        out->ids[out->n++] = (int32_t)v[i];
    }
    return MOEC_OK;
}

void moec_eos_free(moec_eos *e)
{
    free(e->ids);
    e->ids = NULL;
    e->n = 0;
}

int moec_eos_list(const moec_eos *e, const int32_t **ids)
{
    if (ids)
        *ids = e && e->n ? e->ids : NULL;
    return e ? e->n : 0;
}

int moec_eos_first(const moec_eos *e) { return e && e->n ? e->ids[0] : -1; }
