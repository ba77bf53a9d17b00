/* engine.c — the multi-sequence engine of include/moec_rt.h, for services:
 * sequences over one pool of KV blocks, a block-table row each, advanced
 * together one step of tokens at a time. The scheduler (sched.c) decides
 * what a step holds; below it moec_engine_step lets a caller decide. Either
 * way the engine checks the step's tokens, runs it and gives each token's
 * greedy next id and, when asked, its logits.
 *
 * On CUDA a step is one graph step: the smallest compiled bucket that holds
 * the tokens, replayed from its CUDA Graph unless eager, the block table a
 * fixed device buffer whose changed rows are copied before the replay; the
 * argmax is taken on the device, and the scheduler's sampled rows drawn
 * there too (moec_engine_set_sampling). On the CPU one paged interpreter runs the
 * whole step over the same pool and table (a model split over ranks: a
 * group of them, each holding its shard of every block, stepped together),
 * and the argmax is taken here. A plan split over ranks has a context per
 * GPU, each with its shard of every block and the same table.
 * Tokens never mix across rows in either backend, so a sequence's logits do
 * not depend on what else shares its step. A row of logits with a NaN or an
 * infinity has the id IR_SAMPLED_NONFINITE on both backends (the argmax sees
 * every logit anyway), which moec_engine_step reports as MOEC_ERR_NUMERIC
 * with those ids left in next_out for the caller to sort out sequence by
 * sequence, and the scheduler as an error ending only those sequences.
 *
 * The engine owns everything it runs on: on the CPU a copy of the model's
 * module, on CUDA the fused module and plan; the model may be freed after
 * moec_engine_open (compiler/moec_engine_open.c, which makes an engine from
 * a model; moec_engine_open_plan here needs no compiler). */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/sample.h"
#include "err.h"
#include "runtime/cuda_rt.h"
#include "runtime/interp.h"
#include "runtime/step_check.h"
#include "runtime/weights.h"

#define ENGINE_DEFAULT_SEQS 8
#define ENGINE_DEFAULT_SEQ_LEN 4096   /* when the model names no max_position_embeddings */
#define ENGINE_CPU_POOL_SEQ_LEN 4096  /* the CPU pool's default: sequences this long */
#define ENGINE_CPU_BLOCK_SIZE 16
#define ENGINE_KV_FRACTION 0.9

/* ---- opening -------------------------------------------------------------- */

moec_status moec_engine_sizes(const moec_engine_options *opt, int max_pos, int *max_seqs,
                              int *max_seq_len)
{
    *max_seqs = opt->max_seqs ? opt->max_seqs : ENGINE_DEFAULT_SEQS;
    *max_seq_len = opt->max_seq_len;
    if (!*max_seq_len)
        *max_seq_len = max_pos > 0 ? max_pos : ENGINE_DEFAULT_SEQ_LEN;
    if (*max_seqs < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "max_seqs must be positive, got %d", *max_seqs);
    if (*max_seq_len < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "max_seq_len must be positive, got %d",
                        *max_seq_len);
    if (max_pos > 0 && *max_seq_len > max_pos)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "max_seq_len %d exceeds the model's max_position_embeddings %d",
                        *max_seq_len, max_pos);
    if (opt->kv_blocks < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "kv_blocks must be 0 (sized for you) or more, got %d",
                        opt->kv_blocks);
    if (!(opt->kv_memory_fraction >= 0 && opt->kv_memory_fraction <= 1))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "kv_memory_fraction must be from 0 to 1 (0: %g), got %g",
                        ENGINE_KV_FRACTION, opt->kv_memory_fraction);
    if (opt->kv_block_size < 0 || opt->kv_block_size > 4096)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "kv_block_size must be from 1 to 4096 tokens (0: the default), got %d",
                        opt->kv_block_size);
    return MOEC_OK;
}

/* e's block table on the CPU: every row owns its blocks when the pool holds
 * them all, else every entry -1 (as the CUDA runtime starts its table). */
static moec_status table_init(moec_engine_t *e)
{
    size_t n = (size_t)e->max_seqs * (size_t)e->max_blocks;
    e->table = malloc((n ? n : 1) * sizeof *e->table);
    if (!e->table)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for a block table of %d rows of %d",
                        e->max_seqs, e->max_blocks);
    int own = (size_t)e->kv_blocks >= n;
    for (size_t i = 0; i < n; i++)
        e->table[i] = own ? (int32_t)i : -1;
    return MOEC_OK;
}

/* The CPU pool's sizes from opt, the block table and the rows of logits;
 * the interpreter is the caller's. */
static moec_status engine_cpu_pool(moec_engine_t *e, const moec_engine_options *opt)
{
    e->block_size = opt->kv_block_size ? opt->kv_block_size : ENGINE_CPU_BLOCK_SIZE;
    e->max_blocks = (e->max_seq_len + e->block_size - 1) / e->block_size;
    if ((int64_t)e->max_seqs * e->max_blocks > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "a block table of %d rows of %d blocks (%d tokens of %d) is too large",
                        e->max_seqs, e->max_blocks, e->max_seq_len, e->block_size);
    int pool_len = e->max_seq_len < ENGINE_CPU_POOL_SEQ_LEN ? e->max_seq_len
                                                             : ENGINE_CPU_POOL_SEQ_LEN;
    int64_t blocks = opt->kv_blocks ? opt->kv_blocks
                                    : (int64_t)e->max_seqs *
                                          ((pool_len + e->block_size - 1) / e->block_size);
    if (blocks * e->block_size > INT32_MAX)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "a KV pool of %lld blocks of %d tokens is too large",
                        (long long)blocks, e->block_size);
    e->kv_blocks = (int)blocks;
    e->rows = malloc((size_t)e->max_tokens * (size_t)e->vocab * sizeof *e->rows);
    if (!e->rows)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for %d rows of logits", e->max_tokens);
    return table_init(e);
}

moec_status moec_engine_open_cpu(moec_engine_t *e, const ir_module *module,
                                 const char *weights_dir, const moec_engine_options *opt)
{
    MOEC_TRY(engine_cpu_pool(e, opt));
    MOEC_TRY(ir_module_clone(module, &e->module));
    rt_weights *w = NULL;
    MOEC_TRY(rt_weights_open(e->module, weights_dir, &w));
    moec_status st = rt_interp_init_paged(e->module, w, e->kv_blocks, e->block_size, &e->interp);
    rt_weights_free(w);
    return st;
}

moec_status moec_engine_open_cpu_ranks(moec_engine_t *e, ir_module **mods, int n,
                                       const char *weights_dir, const moec_engine_options *opt)
{
    moec_status st = engine_cpu_pool(e, opt);
    if (st != MOEC_OK) {
        for (int r = 0; r < n; r++)
            ir_module_free(mods[r]);
        return st;
    }
    /* every rank's interpreter holds its shard of every block of the pool
     * (its heads' K/V), all read through the one block table */
    return rt_interp_init_ranks_paged(mods, n, weights_dir, e->kv_blocks, e->block_size,
                                      &e->interp);
}

/* moec_cuda_opts for an engine of e's sizes. */
moec_cuda_opts moec_engine_cuda_opts(const moec_engine_t *e, const moec_engine_options *opt)
{
    double fraction = opt->kv_memory_fraction ? opt->kv_memory_fraction : ENGINE_KV_FRACTION;
    return (moec_cuda_opts){.max_seqs = e->max_seqs,
                            .max_seq_len = e->max_seq_len,
                            .single_stream = opt->single_stream,
                            .eager = opt->eager,
                            .kv_blocks = opt->kv_blocks,
                            .kv_fraction = opt->kv_blocks ? 0 : fraction};
}

moec_status moec_engine_open_done(moec_engine_t *e, const moec_engine_options *opt)
{
    if (e->backend == MOEC_BACKEND_CUDA) {
        e->block_size = e->gpu.plan->kv_block_size;
        if (opt->kv_block_size && opt->kv_block_size != e->block_size)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "kv_block_size %d: the plan was compiled for blocks of %d tokens",
                            opt->kv_block_size, e->block_size);
        e->max_blocks = (e->max_seq_len + e->block_size - 1) / e->block_size;
        e->kv_blocks = moec_cuda_model_kv_blocks(&e->gpu);
    }
    /* MOEC_SAMPLER=host: the CUDA backend samples on the host too (for
     * comparisons and debugging) */
    const char *where = getenv("MOEC_SAMPLER");
    e->sample_cap = e->backend == MOEC_BACKEND_CUDA && !(where && !strcmp(where, "host"))
                        ? rt_cuda_sample_capacity(e->gpu.cuda)
                        : -1;
    e->next = malloc((size_t)e->max_tokens * sizeof *e->next);
    if (!e->next)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for %d ids", e->max_tokens);
    return moec_sched_init(e, !opt->no_prefix_cache);
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
    if (st == MOEC_OK && opt->par.tp)
        st = moec_plan_check_parallel(&meta, &opt->par, plan_path);
    if (st == MOEC_OK)
        st = moec_engine_sizes(opt, (int)ir_module_meta_int(e->gpu.fused, "max_position_embeddings", 0),
                          &e->max_seqs, &e->max_seq_len);
    if (st == MOEC_OK) {
        moec_cuda_opts o = moec_engine_cuda_opts(e, opt);
        st = moec_cuda_plan_bind(&e->gpu, &meta, plan_path, weights_dir, &o, &e->vocab);
    }
    if (st == MOEC_OK)
        st = moec_eos_init(e->gpu.fused, &e->eos);
    if (st == MOEC_OK) {
        e->max_tokens = rt_cuda_max_tokens(e->gpu.cuda);
        st = moec_engine_open_done(e, opt);
    }
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
    moec_sched_free(e);
    moec_cuda_model_free(&e->gpu);
    rt_interp_free(e->interp);
    free(e->table);
    free(e->rows);
    free(e->next);
    ir_module_free(e->module);
    moec_eos_free(&e->eos);
    free(e);
}

/* ---- stepping ------------------------------------------------------------- */

moec_status moec_engine_table_set(moec_engine_t *e, int row, int first, int n,
                                  const int32_t *blocks)
{
    if (e->backend == MOEC_BACKEND_CUDA)
        return moec_cuda_model_set_blocks(&e->gpu, row, first, n, blocks);
    MOEC_TRY(rt_block_table_check(e->max_seqs, e->max_blocks, e->kv_blocks, row, first, n,
                                  blocks));
    if (n)
        memcpy(e->table + (size_t)row * (size_t)e->max_blocks + first, blocks,
               (size_t)n * sizeof *blocks);
    return MOEC_OK;
}

moec_status moec_engine_set_sampling(moec_engine_t *e, int n, const ir_sample_row *rows,
                                     int n_pen, const ir_sample_pen *pens, int32_t *tokens_out,
                                     float *logprobs_out)
{
    if (e->sample_cap < 0)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "this engine samples on the host");
    return rt_cuda_set_sampling(e->gpu.cuda, n, rows, n_pen, pens, tokens_out, logprobs_out);
}

moec_status moec_engine_forward(moec_engine_t *e, int n, const int32_t *tokens,
                                const int32_t *positions, const int32_t *slots,
                                int32_t *next_out, int first, int count, float *logits_out)
{
    if (e->backend == MOEC_BACKEND_CUDA)
        return moec_cuda_model_step(&e->gpu, n, tokens, positions, slots, first, count,
                                    logits_out, next_out);
    size_t V = (size_t)e->vocab;
    float *rows = logits_out && first == 0 && count == n ? logits_out : e->rows;
    rt_interp_pages pg = {.table = e->table, .max_pages = e->max_blocks,
                          .n_rows = e->max_seqs, .row = slots};
    MOEC_TRY(rt_interp_forward_paged(e->interp, &pg, tokens, positions, n, rows));
    if (logits_out && rows != logits_out)
        memcpy(logits_out, rows + (size_t)first * V, (size_t)count * V * sizeof *rows);
    if (next_out)
        for (int i = 0; i < n; i++)
            next_out[i] = rt_logits_argmax(rows + (size_t)i * V, e->vocab);
    return MOEC_OK;
}

/* The scheduler owns the block table while it has requests; a step below it
 * may write any block, so the prefix cache forgets what it kept. */
static moec_status check_unscheduled(moec_engine_t *e, const char *what)
{
    if (moec_sched_busy(e))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "%s: the scheduler has %d requests and owns the block table until they "
                        "end",
                        what, moec_engine_pending(e));
    moec_sched_forget(e);
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
    MOEC_TRY(check_unscheduled(e, "moec_engine_step"));
    if (e->backend != MOEC_BACKEND_CUDA) {
        /* the CUDA runtime makes the same check against its own table */
        rt_step_limits l = {e->max_tokens, e->max_seqs, e->max_seq_len, e->vocab,
                            e->table,      e->max_blocks, e->block_size};
        MOEC_TRY(rt_step_check(&l, n, tokens, positions, slots));
    }
    /* the greedy ids are read even when the caller wants none: they say
     * which rows are not finite */
    int32_t *next = next_out ? next_out : e->next;
    MOEC_TRY(moec_engine_forward(e, n, tokens, positions, slots, next, 0, n, logits_out));
    return step_check_finite(e->steps++, n, positions, slots, next);
}

moec_status moec_engine_set_blocks(moec_engine_t *e, int slot, int first, int n,
                                   const int32_t *blocks)
{
    if (!e)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_set_blocks: NULL engine");
    MOEC_TRY(check_unscheduled(e, "moec_engine_set_blocks"));
    return moec_engine_table_set(e, slot, first, n, blocks);
}

int moec_engine_max_tokens(const moec_engine_t *e) { return e ? e->max_tokens : 0; }
int moec_engine_max_seqs(const moec_engine_t *e) { return e ? e->max_seqs : 0; }
int moec_engine_max_seq_len(const moec_engine_t *e) { return e ? e->max_seq_len : 0; }
int moec_engine_max_len(const moec_engine_t *e)
{
    if (!e)
        return 0;
    long long pool = (long long)e->kv_blocks * e->block_size + 1;
    return pool < e->max_seq_len ? (int)pool : e->max_seq_len;
}
int moec_engine_kv_blocks(const moec_engine_t *e) { return e ? e->kv_blocks : 0; }
int moec_engine_kv_block_size(const moec_engine_t *e) { return e ? e->block_size : 0; }
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
