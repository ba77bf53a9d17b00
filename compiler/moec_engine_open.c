/* moec_engine_open.c — an engine made from a model (include/moec.h): every
 * pass and, on CUDA, the kernels compiled now; on the CPU the reference
 * interpreter over the unfused module. The engine itself is engine/engine.c. */
#include <stdlib.h>

#include "compiler/api_internal.h"
#include "err.h"

moec_status moec_engine_open(const moec_model_t *model, const char *weights_dir,
                             const moec_engine_options *opt, moec_engine_t **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_open: out is NULL");
    *out = NULL;
    if (!model || !weights_dir)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_open: NULL model or weights_dir");
    const moec_engine_options dflt = {0};
    if (!opt)
        opt = &dflt;
    moec_backend backend = opt->backend;
    if (backend != MOEC_BACKEND_AUTO && backend != MOEC_BACKEND_CPU &&
        backend != MOEC_BACKEND_CUDA)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_open: unknown backend %d",
                        (int)backend);
    int max_seqs, max_seq_len;
    MOEC_TRY(moec_engine_sizes(opt, moec_model_max_positions(model), &max_seqs, &max_seq_len));
    MOEC_TRY(moec_resolve_backend(&backend));
    ir_dtype dt = IR_DTYPE_BF16;
    if (backend == MOEC_BACKEND_CUDA)
        MOEC_TRY(moec_cuda_dtype(&dt));

    moec_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    e->backend = backend;
    e->max_seqs = max_seqs;
    e->max_seq_len = max_seq_len;
    e->vocab = moec_model_vocab_size(model);
    moec_status st = moec_eos_init(moec_model_module(model), &e->eos);
    if (st != MOEC_OK) {
        /* recorded */
    } else if (backend == MOEC_BACKEND_CUDA) {
        moec_cuda_opts o = moec_engine_cuda_opts(e, opt);
        st = moec_cuda_model_init(model, weights_dir, dt, &o, &e->gpu);
        if (st == MOEC_OK)
            e->max_tokens = rt_cuda_max_tokens(e->gpu.cuda);
    } else {
        int buckets[IR_BUCKETS_MAX]; /* as many tokens a step as the largest default bucket */
        e->max_tokens = buckets[ir_buckets_default(buckets) - 1];
        st = moec_engine_open_cpu(e, moec_model_module(model), weights_dir, opt);
    }
    if (st == MOEC_OK)
        st = moec_engine_open_done(e, opt);
    if (st != MOEC_OK) {
        moec_engine_free(e);
        return st;
    }
    *out = e;
    return MOEC_OK;
}
