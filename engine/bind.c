/* bind.c — a plan bound to the GPU (moec_cuda_model): read from a plan file
 * and checked against the checkpoint it was compiled for, or built by the
 * compiler in-process; then the runtime context, its weights and the graph
 * policy. Sessions and engines of both origins share it. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine_internal.h"
#include "err.h"
#include "runtime/plan_check.h"

moec_status moec_resolve_backend(moec_backend *backend)
{
    int n_dev = 0;
    /* a value outside the enum would otherwise run on the CPU and be
     * reported back by moec_session_backend as given */
    if (*backend != MOEC_BACKEND_AUTO && *backend != MOEC_BACKEND_CPU &&
        *backend != MOEC_BACKEND_CUDA)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "unknown backend %d (auto, cpu or cuda)",
                        (int)*backend);
    if (*backend == MOEC_BACKEND_AUTO) {
        *backend = moec_cuda_device_count(&n_dev) == MOEC_OK && n_dev > 0 ? MOEC_BACKEND_CUDA
                                                                          : MOEC_BACKEND_CPU;
        moec_err_clear();
    }
    if (*backend == MOEC_BACKEND_CUDA)
        MOEC_TRY(moec_cuda_device_count(&n_dev));
    return MOEC_OK;
}

moec_status moec_cuda_model_bind(moec_cuda_model *x, const rt_weights *w,
                                 const moec_cuda_opts *o, int vocab, const char *what)
{
    rt_cuda_sizes sz = {.max_seqs = o->max_seqs,
                        .max_seq_len = o->max_seq_len,
                        .kv_blocks = o->kv_blocks,
                        .kv_fraction = o->kv_fraction};
    MOEC_TRY(rt_cuda_init_rank(x->plan, w, &sz, o->device, o->comm, &x->cuda));
    if (rt_cuda_logits_cols(x->cuda) != vocab)
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s: its logits have %d columns, its vocabulary %d",
                        what, rt_cuda_logits_cols(x->cuda), vocab);
    return graph_bind(x->cuda, o->eager, o->single_stream, &x->graphs, &x->capture_s);
}

void moec_cuda_model_free(moec_cuda_model *x)
{
    if (x->ranks) {
        moec_ranks_free(x->ranks);
        memset(x, 0, sizeof *x);
        return;
    }
    graph_set_free(x->graphs);
    rt_cuda_free(x->cuda);
    ir_plan_free(x->plan);
    ir_module_free(x->fused);
    memset(x, 0, sizeof *x);
}

moec_status moec_cuda_model_step(moec_cuda_model *x, int n, const int32_t *tokens,
                                 const int32_t *positions, const int32_t *slots, int first,
                                 int count, float *logits_out, int32_t *sampled_out)
{
    if (x->ranks)
        return moec_ranks_step(x->ranks, n, tokens, positions, slots, first, count, logits_out,
                               sampled_out);
    return graph_step_rows(x->graphs, x->cuda, n, tokens, positions, slots, first, count,
                           logits_out, sampled_out);
}

moec_status moec_cuda_model_set_blocks(moec_cuda_model *x, int row, int first, int n,
                                       const int32_t *blocks)
{
    if (x->ranks)
        return moec_ranks_set_blocks(x->ranks, row, first, n, blocks);
    return rt_cuda_set_blocks(x->cuda, row, first, n, blocks);
}

moec_status moec_cuda_model_each(moec_cuda_model *x, moec_rank_fn fn, void *user,
                                 const char *what)
{
    if (x->ranks)
        return moec_ranks_each(x->ranks, fn, user, what);
    moec_status st = fn(x, 0, user);
    return st == MOEC_OK ? MOEC_OK : moec_err_wrap(st, "%s", what);
}

int moec_cuda_model_ranks(const moec_cuda_model *x)
{
    return x->ranks ? moec_ranks_count(x->ranks) : 1;
}

int moec_cuda_model_kv_blocks(const moec_cuda_model *x)
{
    return x->ranks ? moec_ranks_kv_blocks(x->ranks) : rt_cuda_kv_blocks(x->cuda);
}

moec_status moec_check_plan_path(const char *plan_path)
{
    struct stat sb;
    if (stat(plan_path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return MOEC_ERR(MOEC_ERR_IO, "%s is a directory, not a plan file", plan_path);
    return MOEC_OK;
}

moec_status moec_cuda_plan_read(const char *plan_path, moec_cuda_model *x, ir_plan_meta *meta)
{
    memset(x, 0, sizeof *x);
    MOEC_TRY(moec_check_plan_path(plan_path));
    ir_plan *plans[IR_MAX_RANKS];
    ir_module *mods[IR_MAX_RANKS];
    MOEC_TRY(ir_plan_read_ranks(plan_path, plans, mods, meta));
    if (!meta->tp) {
        x->plan = plans[0];
        x->fused = mods[0];
        return MOEC_OK;
    }
    /* split over ranks (tp 1 too: the same path with a communicator of one) */
    MOEC_TRY(moec_ranks_new(plans, mods, ir_plan_meta_ranks(meta), &x->ranks));
    x->plan = (ir_plan *)moec_ranks_plan(x->ranks);
    x->fused = moec_ranks_module(x->ranks);
    return MOEC_OK;
}

moec_status moec_plan_check_parallel(const ir_plan_meta *meta, const moec_parallel *par,
                                     const char *plan_path)
{
    if (!par || (par->tp == meta->tp && (par->ep ? par->ep : 1) == (meta->ep ? meta->ep : 1)))
        return MOEC_OK;
    if (!meta->tp)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "plan %s was compiled unsharded (no --tp); asked to run it with tp %d: "
                        "compile it with --tp %d",
                        plan_path, par->tp, par->tp);
    int n = ir_plan_meta_ranks(meta);
    return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                    "plan %s was compiled for tp %d, ep %d (%d rank%s); asked to run it with tp "
                    "%d, ep %d: a plan runs with the split it was compiled for",
                    plan_path, meta->tp, meta->ep, n, n == 1 ? "" : "s", par->tp,
                    par->ep ? par->ep : 1);
}

moec_status moec_cuda_plan_bind(moec_cuda_model *x, const ir_plan_meta *meta,
                                const char *plan_path, const char *weights_dir,
                                const moec_cuda_opts *o, int *vocab)
{
    int max_pos = (int)ir_module_meta_int(x->fused, "max_position_embeddings", 0);
    if (max_pos > 0 && o->max_seq_len > max_pos)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "max_seq_len %d exceeds the model's max_position_embeddings %d (plan %s)",
                        o->max_seq_len, max_pos, plan_path);
    if (x->ranks) {
        MOEC_TRY(moec_ranks_bind(x->ranks, meta, plan_path, weights_dir, o, vocab));
        x->cuda = moec_ranks_cuda(x->ranks);
        return MOEC_OK;
    }
    MOEC_TRY(rt_plan_check_checkpoint(meta, x->fused, plan_path, weights_dir));
    rt_weights *w = NULL;
    MOEC_TRY(rt_weights_open(x->fused, weights_dir, &w));
    *vocab = (int)ir_module_meta_int(x->fused, "vocab_size", 0);
    char what[4200];
    snprintf(what, sizeof what, "plan %s", plan_path);
    moec_status st = moec_cuda_model_bind(x, w, o, *vocab, what);
    rt_weights_free(w);
    return st;
}

moec_status moec_cuda_model_init_plan(const char *plan_path, const char *weights_dir,
                                      const moec_cuda_opts *o, moec_cuda_model *x, int *vocab)
{
    ir_plan_meta meta;
    MOEC_TRY(moec_cuda_plan_read(plan_path, x, &meta));
    return moec_cuda_plan_bind(x, &meta, plan_path, weights_dir, o, vocab);
}
