/* engine.c — the multi-sequence engine of include/moec_rt.h, for services:
 * up to max_seqs sequences, each in a slot with its own KV cache, advanced
 * together one step of tokens at a time. The caller (a scheduler such as
 * samples/serve.c) decides which slot and position every token of a step
 * has; the engine checks them all, runs the step and returns each token's
 * greedy next id (and, when asked, its logits).
 *
 * On CUDA a step is one graph_step: the smallest compiled bucket that
 * holds the tokens, replayed from its CUDA Graph unless eager; the argmax is
 * taken on the device. On the CPU every slot has its own reference
 * interpreter (its own KV cache, the weights shared with slot 0's), a step
 * runs each run of consecutive tokens of one slot as one forward, and the
 * argmax is taken here. Tokens never mix across rows in either backend, so a
 * sequence's logits do not depend on what else shares its step. A row of
 * logits with a NaN or an infinity has the id IR_SAMPLED_NONFINITE on both
 * backends (the argmax sees every logit anyway), which the step reports as
 * MOEC_ERR_NUMERIC with those ids left in next_out for the caller to sort
 * out sequence by sequence.
 *
 * The engine owns everything it runs on: on the CPU a copy of the model's
 * module, on CUDA the fused module and plan; the model may be freed after
 * moec_engine_open (compiler/moec_engine_open.c, which makes an engine from
 * a model; moec_engine_open_plan here needs no compiler). */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "err.h"
#include "runtime/cuda_rt.h"
#include "runtime/interp.h"
#include "runtime/step_check.h"
#include "runtime/weights.h"

#define ENGINE_DEFAULT_SEQS 8
#define ENGINE_DEFAULT_SEQ_LEN 4096

/* ---- opening -------------------------------------------------------------- */

/* max_seqs and max_seq_len from the options (0: the defaults), checked
 * against the model's max_position_embeddings (0: unknown). */
moec_status moec_engine_sizes(const moec_engine_options *opt, int max_pos, int *max_seqs,
                                int *max_seq_len)
{
    *max_seqs = opt->max_seqs ? opt->max_seqs : ENGINE_DEFAULT_SEQS;
    *max_seq_len = opt->max_seq_len;
    if (!*max_seq_len)
        *max_seq_len = max_pos > 0 && max_pos < ENGINE_DEFAULT_SEQ_LEN ? max_pos
                                                                       : ENGINE_DEFAULT_SEQ_LEN;
    if (*max_seqs < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "max_seqs must be positive, got %d", *max_seqs);
    if (*max_seq_len < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "max_seq_len must be positive, got %d",
                        *max_seq_len);
    if (max_pos > 0 && *max_seq_len > max_pos)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "max_seq_len %d exceeds the model's max_position_embeddings %d",
                        *max_seq_len, max_pos);
    return MOEC_OK;
}

/* The CPU backend: the module copied, its weights read once into slot 0's
 * interpreter, every other slot's interpreter borrowing them. */
moec_status moec_engine_open_cpu(moec_engine_t *e, const ir_module *module,
                                 const char *weights_dir)
{
    MOEC_TRY(ir_module_clone(module, &e->module));
    e->interp = calloc((size_t)e->max_seqs, sizeof *e->interp);
    e->rows = malloc((size_t)e->max_tokens * (size_t)e->vocab * sizeof *e->rows);
    if (!e->interp || !e->rows)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for %d sequence slots", e->max_seqs);
    rt_weights *w = NULL;
    MOEC_TRY(rt_weights_open(e->module, weights_dir, &w));
    moec_status st = rt_interp_init(e->module, w, e->max_seq_len, &e->interp[0]);
    rt_weights_free(w);
    MOEC_TRY(st);
    for (int s = 1; s < e->max_seqs; s++)
        MOEC_TRY(rt_interp_init_shared(e->interp[0], e->max_seq_len, &e->interp[s]));
    return MOEC_OK;
}

/* The greedy ids of a step whose caller wants none, once max_tokens is known. */
moec_status moec_engine_alloc_next(moec_engine_t *e)
{
    e->next = malloc((size_t)e->max_tokens * sizeof *e->next);
    return e->next ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory for %d ids", e->max_tokens);
}

/* moec_cuda_opts for an engine of e's sizes. */
moec_cuda_opts moec_engine_cuda_opts(const moec_engine_t *e, const moec_engine_options *opt)
{
    return (moec_cuda_opts){.max_seqs = e->max_seqs,
                            .max_seq_len = e->max_seq_len,
                            .single_stream = opt->single_stream,
                            .eager = opt->eager};
}

/* The plan's max_position_embeddings (0 if it names none), for the default
 * max_seq_len: the plan read once just for its module's meta. */
moec_status moec_engine_open_plan(const char *plan_path, const char *weights_dir,
                                  const moec_engine_options *opt, moec_engine_t **out)
{
    if (!out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_open_plan: out is NULL");
    *out = NULL;
    if (!plan_path || !weights_dir)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "moec_engine_open_plan: NULL plan_path or weights_dir");
    const moec_engine_options dflt = {0};
    if (!opt)
        opt = &dflt;
    if (opt->backend != MOEC_BACKEND_AUTO && opt->backend != MOEC_BACKEND_CUDA)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "plan %s runs on the GPU: the engine's backend must be auto or cuda",
                        plan_path);
    MOEC_TRY(moec_check_plan_path(plan_path));
    int n_dev = 0;
    MOEC_TRY(moec_cuda_device_count(&n_dev));

    moec_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    e->backend = MOEC_BACKEND_CUDA;
    /* the plan's module gives the default max_seq_len, then the plan is bound */
    ir_plan_meta meta;
    moec_status st = moec_cuda_plan_read(plan_path, &e->gpu, &meta);
    if (st == MOEC_OK)
        st = moec_engine_sizes(opt, (int)ir_module_meta_int(e->gpu.fused, "max_position_embeddings", 0),
                          &e->max_seqs, &e->max_seq_len);
    if (st == MOEC_OK) {
        moec_cuda_opts o = moec_engine_cuda_opts(e, opt);
        st = moec_cuda_plan_bind(&e->gpu, &meta, plan_path, weights_dir, &o, &e->vocab);
    }
    if (st == MOEC_OK)
        st = moec_eos_init(e->gpu.fused, &e->eos);
    if (st != MOEC_OK) {
        moec_engine_free(e);
        return st;
    }
    e->max_tokens = rt_cuda_max_tokens(e->gpu.cuda);
    st = moec_engine_alloc_next(e);
    if (st != MOEC_OK) {
        moec_engine_free(e);
        return st;
    }
    *out = e;
    return MOEC_OK;
}

void moec_engine_free(moec_engine_t *e)
{
    if (!e)
        return;
    moec_cuda_model_free(&e->gpu);
    /* The borrowers first: slot 0 owns the weights they read. */
    for (int s = e->interp ? e->max_seqs - 1 : -1; s >= 0; s--)
        rt_interp_free(e->interp[s]);
    free(e->interp);
    free(e->rows);
    free(e->next);
    ir_module_free(e->module);
    moec_eos_free(&e->eos);
    free(e);
}

/* ---- stepping ------------------------------------------------------------- */

/* A CPU step: each run of consecutive tokens of one slot is one forward of
 * that slot's interpreter, in order, so later tokens of a slot see the K/V
 * its earlier tokens of the step wrote. */
static moec_status step_cpu(moec_engine_t *e, int n, const int32_t *tokens,
                            const int32_t *positions, const int32_t *slots, int32_t *next_out,
                            float *logits_out)
{
    size_t V = (size_t)e->vocab;
    float *rows = logits_out ? logits_out : e->rows;
    for (int i = 0; i < n;) {
        int k = 1;
        while (i + k < n && slots[i + k] == slots[i])
            k++;
        MOEC_TRY(rt_interp_forward(e->interp[slots[i]], tokens + i, positions + i, k,
                                   rows + (size_t)i * V));
        i += k;
    }
    for (int i = 0; i < n; i++)
        next_out[i] = rt_logits_argmax(rows + (size_t)i * V, e->vocab);
    return MOEC_OK;
}

/* MOEC_ERR_NUMERIC naming the step and the first token whose logits are not
 * finite (next[i] IR_SAMPLED_NONFINITE), if any. */
static moec_status step_check_finite(long step, int n, const int32_t *positions,
                                     const int32_t *slots, const int32_t *next)
{
    int first = -1, bad = 0;
    for (int i = 0; i < n; i++)
        if (next[i] == IR_SAMPLED_NONFINITE) {
            first = first < 0 ? i : first;
            bad++;
        }
    if (!bad)
        return MOEC_OK;
    return MOEC_ERR(MOEC_ERR_NUMERIC,
                    "step %ld: the logits of token %d (slot %d, position %d) hold a NaN or an "
                    "infinity, and those of %d of the step's %d tokens in all",
                    step, first, slots[first], positions[first], bad, n);
}

moec_status moec_engine_step(moec_engine_t *e, int n, const int32_t *tokens,
                             const int32_t *positions, const int32_t *slots, int32_t *next_out,
                             float *logits_out)
{
    if (!e)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_step: NULL engine");
    rt_step_limits l = {e->max_tokens, e->max_seqs, e->max_seq_len, e->vocab};
    MOEC_TRY(rt_step_check(&l, n, tokens, positions, slots));
    /* the greedy ids are read even when the caller wants none: they say
     * which rows are not finite */
    int32_t *next = next_out ? next_out : e->next;
    long step = e->steps++;
    if (e->backend == MOEC_BACKEND_CUDA)
        MOEC_TRY(moec_cuda_model_step(&e->gpu, n, tokens, positions, slots, logits_out, next));
    else
        MOEC_TRY(step_cpu(e, n, tokens, positions, slots, next, logits_out));
    return step_check_finite(step, n, positions, slots, next);
}

int moec_engine_max_tokens(const moec_engine_t *e) { return e ? e->max_tokens : 0; }
int moec_engine_max_seqs(const moec_engine_t *e) { return e ? e->max_seqs : 0; }
int moec_engine_max_seq_len(const moec_engine_t *e) { return e ? e->max_seq_len : 0; }
int moec_engine_vocab_size(const moec_engine_t *e) { return e ? e->vocab : 0; }
int moec_engine_eos_token(const moec_engine_t *e) { return moec_eos_first(e ? &e->eos : NULL); }
int moec_engine_eos_tokens(const moec_engine_t *e, const int32_t **ids)
{
    return moec_eos_list(e ? &e->eos : NULL, ids);
}
moec_backend moec_engine_backend(const moec_engine_t *e)
{
    return e ? e->backend : MOEC_BACKEND_AUTO;
}
