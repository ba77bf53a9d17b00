/* moec_engine_open.c — an engine made from a model (include/moec.h): every
 * pass and, on CUDA, the kernels compiled now (a model split over ranks
 * through a scratch plan file: moec_compile_scratch); on the CPU the
 * reference interpreter over the unfused module. The engine itself is engine/engine.c. */
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
    MOEC_TRY(moec_parallel_check(&opt->par));
    moec_backend backend = opt->backend;
    if (backend != MOEC_BACKEND_AUTO && backend != MOEC_BACKEND_CPU &&
        backend != MOEC_BACKEND_CUDA)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_open: unknown backend %d",
                        (int)backend);
    int max_seqs, max_seq_len;
    MOEC_TRY(moec_engine_sizes(opt, moec_model_max_positions(model), &max_seqs, &max_seq_len));
    if (backend != MOEC_BACKEND_CUDA || !opt->par.tp)
        MOEC_TRY(moec_resolve_backend(&backend));
    ir_dtype dt = IR_DTYPE_BF16;
    if (backend == MOEC_BACKEND_CUDA)
        MOEC_TRY(moec_cuda_dtype(&dt));
    if (backend == MOEC_BACKEND_CUDA && opt->par.tp) {
        /* the model compiled into a scratch plan, opened as `moec serve PLAN --tp` */
        char path[4096];
        MOEC_TRY(moec_compile_scratch(model, weights_dir, &opt->par, dt, path, sizeof path));
        moec_status st = moec_engine_open_plan(path, weights_dir, opt, out);
        moec_compile_scratch_remove(path);
        return st;
    }

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
        ir_module *mods[IR_MAX_RANKS];
        if (!opt->par.tp)
            st = moec_engine_open_cpu(e, moec_model_module(model), weights_dir, opt);
        else if ((st = moec_fuse_ranks_cpu(model, &opt->par, mods)) == MOEC_OK)
            st = moec_engine_open_cpu_ranks(e, mods, opt->par.tp, weights_dir, opt);
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
