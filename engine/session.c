/* session.c — one sequence being generated (moec_rt.h): on the GPU from a
 * plan file (moec_session_init_plan, no compiler call) or a plan the
 * compiler built (moec_session_init in compiler/moec_api.c), or on the CPU
 * reference interpreter over the unfused module. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "err.h"

moec_status moec_session_new(moec_backend backend, int max_seq_len, moec_session_t **out)
{
    *out = NULL;
    if (max_seq_len <= 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "max_seq_len must be positive, got %d", max_seq_len);
    moec_session_t *s = calloc(1, sizeof *s);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    s->backend = backend;
    s->max_seq = max_seq_len;
    *out = s;
    return MOEC_OK;
}

moec_status moec_session_bind_cpu(moec_session_t *s, const ir_module *module,
                                  const char *weights_dir)
{
    /* the interpreter and the weights point into the module: a copy, so
     * that they do not depend on the caller keeping the model */
    MOEC_TRY(ir_module_clone(module, &s->module));
    MOEC_TRY(rt_weights_open(s->module, weights_dir, &s->weights));
    return rt_interp_init(s->module, s->weights, s->max_seq, &s->interp);
}

void moec_session_free(moec_session_t *s)
{
    if (!s)
        return;
    moec_cuda_model_free(&s->gpu);
    rt_interp_free(s->interp);
    rt_weights_free(s->weights);
    ir_module_free(s->module);
    moec_eos_free(&s->eos);
    free(s);
}

moec_backend moec_session_backend(const moec_session_t *s) { return s ? s->backend : MOEC_BACKEND_AUTO; }

int moec_session_vocab_size(const moec_session_t *s) { return s ? s->vocab : 0; }

int moec_session_eos_token(const moec_session_t *s) { return moec_eos_first(s ? &s->eos : NULL); }

int moec_session_eos_tokens(const moec_session_t *s, const int32_t **ids)
{
    return moec_eos_list(s ? &s->eos : NULL, ids);
}

moec_status moec_session_init_plan(const char *plan_path, const char *weights_dir,
                                   int max_seq_len, moec_session_t **out)
{
    return moec_session_init_plan_parallel(plan_path, weights_dir, max_seq_len, NULL, out);
}

moec_status moec_session_init_plan_parallel(const char *plan_path, const char *weights_dir,
                                            int max_seq_len, const moec_parallel *par,
                                            moec_session_t **out)
{
    if (!plan_path || !weights_dir || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_session_init_plan: NULL argument");
    *out = NULL; /* as moec_session_init: a failed call leaves no stale handle */
    moec_session_t *s;
    MOEC_TRY(moec_session_new(MOEC_BACKEND_CUDA, max_seq_len, &s));
    moec_cuda_opts o = {.max_seqs = 1, .max_seq_len = max_seq_len};
    ir_plan_meta meta;
    moec_status st = moec_cuda_plan_read(plan_path, &s->gpu, &meta);
    if (st == MOEC_OK)
        st = moec_plan_check_parallel(&meta, par, plan_path);
    if (st == MOEC_OK)
        st = moec_cuda_plan_bind(&s->gpu, &meta, plan_path, weights_dir, &o, &s->vocab);
    if (st == MOEC_OK)
        st = moec_eos_init(s->gpu.fused, &s->eos);
    if (st != MOEC_OK) {
        moec_session_free(s);
        return st;
    }
    *out = s;
    return MOEC_OK;
}

int moec_session_length(const moec_session_t *s) { return s ? s->length : 0; }

/* Runs the tokens on the interpreter; next gets each row's greedy id. */
static moec_status forward_cpu(moec_session_t *s, const int32_t *ids, int n, float *logits_out,
                               int32_t *next)
{
    size_t V = (size_t)s->vocab;
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    float *rows = logits_out ? logits_out : malloc((size_t)n * V * sizeof *rows);
    moec_status st = pos && rows ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    for (int i = 0; st == MOEC_OK && i < n; i++)
        pos[i] = s->length + i;
    if (st == MOEC_OK)
        st = rt_interp_forward(s->interp, ids, pos, n, rows);
    for (int i = 0; st == MOEC_OK && i < n; i++)
        next[i] = rt_logits_argmax(rows + (size_t)i * V, s->vocab);
    if (rows != logits_out)
        free(rows);
    free(pos);
    return st;
}

/* Runs the tokens in chunks of the largest bucket (one sequence, slot 0,
 * consecutive positions); next gets each row's greedy id. */
static moec_status forward_cuda(moec_session_t *s, const int32_t *ids, int n, float *logits_out,
                                int32_t *next)
{
    int chunk = rt_cuda_max_tokens(s->gpu.cuda);
    size_t cols = (size_t)rt_cuda_logits_cols(s->gpu.cuda);
    int32_t *pos = malloc((size_t)chunk * sizeof *pos);
    int32_t *slot = calloc((size_t)chunk, sizeof *slot);
    moec_status st = pos && slot ? MOEC_OK : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    for (int done = 0; done < n && st == MOEC_OK; done += chunk) {
        int k = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < k; i++)
            pos[i] = s->length + done + i;
        st = moec_cuda_model_step(&s->gpu, k, ids + done, pos, slot, 0, k,
                                  logits_out ? logits_out + (size_t)done * cols : NULL,
                                  next + done);
    }
    free(pos);
    free(slot);
    return st;
}

/* MOEC_ERR_NUMERIC naming the call and the position of the first of the n
 * tokens just appended whose logits are not finite, if any. */
static moec_status session_check_finite(const moec_session_t *s, long step, const int32_t *next,
                                        int n)
{
    for (int i = 0; i < n; i++)
        if (next[i] == IR_SAMPLED_NONFINITE)
            return MOEC_ERR(MOEC_ERR_NUMERIC,
                            "step %ld, position %d: the logits hold a NaN or an infinity (a NaN "
                            "in the checkpoint, or an overflow)",
                            step, s->length - n + i);
    return MOEC_OK;
}

moec_status moec_session_forward(moec_session_t *s, const int32_t *ids, int n, float *logits_out)
{
    /* each refusal names its argument: "no tokens" said nothing of a NULL
     * session */
    if (!s)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_session_forward: NULL session");
    if (n <= 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "moec_session_forward: n is %d; it must be at least 1", n);
    if (!ids)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_session_forward: NULL ids");
    if (n > s->max_seq - s->length)
        return MOEC_ERR(MOEC_ERR_CAPACITY,
                        "%d tokens do not fit: the sequence holds %d of at most %d tokens", n,
                        s->length, s->max_seq);
    /* each row's greedy id says whether it is finite: on the GPU the argmax
     * step computes it anyway, on the CPU it is one pass over the rows */
    int32_t *next = malloc((size_t)n * sizeof *next);
    if (!next)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    long step = s->steps++;
    moec_status st = s->gpu.cuda ? forward_cuda(s, ids, n, logits_out, next)
                                 : forward_cpu(s, ids, n, logits_out, next);
    if (st == MOEC_OK) {
        s->length += n;
        st = session_check_finite(s, step, next, n);
    }
    free(next);
    return st;
}
