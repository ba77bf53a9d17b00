/* ranks.c — a plan split over tp ranks (moec compile --tp; docs/PARALLEL.md)
 * run by this process on tp GPUs, one thread per GPU.
 *
 * Why one process and a thread per GPU (not a process per rank): the ranks'
 * communicators come from one ncclCommInitAll, with no rendezvous to set
 * up; a step's inputs are handed to every rank and rank 0's logits handed
 * back through memory; the library keeps one handle per engine, which a
 * service embeds as it is; and a failure anywhere is seen by this process
 * at once. A thread per GPU (not one thread for all) because each rank
 * replays its own CUDA Graph and waits for it, and NCCL's collectives only
 * complete when every rank has launched its part.
 *
 * Each rank binds its own plan on its GPU (its slices of the checkpoint,
 * its graphs captured with the collectives inside), steps run on all ranks
 * at once, and rank 0 copies the logits and sampled ids back (the logits
 * are gathered on every rank). A rank that fails aborts every
 * communicator, so the others' collectives end instead of waiting for it,
 * and the step returns the first failure, naming its rank; the group is
 * then unusable. --tp 1 runs here too, with a communicator of one. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "err.h"
#include "runtime/step_check.h"

typedef enum rank_cmd { CMD_NONE, CMD_BIND, CMD_STEP, CMD_EACH, CMD_QUIT } rank_cmd;

typedef struct rank_worker {
    struct moec_ranks *g;
    int r;
    moec_cuda_model m;
    pthread_t th;
    moec_status st;
    char err[1024];
} rank_worker;

struct moec_ranks {
    int n;
    rank_worker w[IR_MAX_RANKS];
    rt_comm *comms[IR_MAX_RANKS];
    int threads;            /* workers started */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen;           /* bumped for every command */
    rank_cmd cmd;
    int busy;               /* ranks still working on the command */
    int failed;             /* the rank that failed first, or -1 */
    /* the command's arguments */
    const ir_plan_meta *meta;
    const char *plan_path, *weights_dir;
    moec_cuda_opts opts;
    int vocab;
    int kv_blocks;          /* the fewest blocks any rank's pool holds */
    int n_tok, first, count;
    const int32_t *tokens, *positions, *slots;
    float *logits_out;
    int32_t *sampled_out;
    moec_rank_fn each_fn;
    void *each_user;
};

static moec_status rank_bind(rank_worker *w)
{
    struct moec_ranks *g = w->g;
    moec_cuda_opts o = g->opts;
    o.device = w->r;
    o.comm = g->comms[w->r];
    int vocab = 0;
    MOEC_TRY(moec_cuda_plan_bind(&w->m, g->meta, g->plan_path, g->weights_dir, &o, &vocab));
    if (w->r == 0)
        g->vocab = vocab;
    return MOEC_OK;
}

static moec_status rank_step(rank_worker *w)
{
    struct moec_ranks *g = w->g;
    return moec_cuda_model_step(&w->m, g->n_tok, g->tokens, g->positions, g->slots, g->first,
                                g->count, w->r ? NULL : g->logits_out,
                                w->r ? NULL : g->sampled_out);
}

/* A rank failed: the first one is remembered, and every communicator is
 * aborted so that no rank waits for it in a collective. */
static void rank_failed(rank_worker *w)
{
    struct moec_ranks *g = w->g;
    snprintf(w->err, sizeof w->err, "%s", moec_last_error());
    pthread_mutex_lock(&g->mu);
    int first = g->failed < 0;
    if (first)
        g->failed = w->r;
    pthread_mutex_unlock(&g->mu);
    if (first)
        for (int r = 0; r < g->n; r++)
            rt_comm_abort(g->comms[r]);
}

static void *rank_main(void *arg)
{
    rank_worker *w = arg;
    struct moec_ranks *g = w->g;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->gen == seen)
            pthread_cond_wait(&g->go, &g->mu);
        seen = g->gen;
        rank_cmd cmd = g->cmd;
        pthread_mutex_unlock(&g->mu);
        moec_status st = MOEC_OK;
        if (cmd == CMD_BIND)
            st = rank_bind(w);
        else if (cmd == CMD_STEP)
            st = rank_step(w);
        else if (cmd == CMD_EACH)
            st = g->each_fn(&w->m, w->r, g->each_user);
        else if (cmd == CMD_QUIT)
            moec_cuda_model_free(&w->m);
        w->st = st;
        if (st != MOEC_OK)
            rank_failed(w);
        pthread_mutex_lock(&g->mu);
        if (--g->busy == 0)
            pthread_cond_signal(&g->done);
        pthread_mutex_unlock(&g->mu);
        if (cmd == CMD_QUIT)
            return NULL;
    }
}

/* Runs cmd on every started rank and waits for all of them; the rank that
 * failed first (ever), or -1. */
static int run_on_ranks(struct moec_ranks *g, rank_cmd cmd)
{
    pthread_mutex_lock(&g->mu);
    g->cmd = cmd;
    g->busy = g->threads;
    g->gen++;
    pthread_cond_broadcast(&g->go);
    while (g->busy)
        pthread_cond_wait(&g->done, &g->mu);
    int failed = g->failed;
    pthread_mutex_unlock(&g->mu);
    return failed;
}

/* run_on_ranks, the first failure recorded as the error. */
static moec_status run_cmd(struct moec_ranks *g, rank_cmd cmd, const char *what)
{
    int failed = run_on_ranks(g, cmd);
    if (failed < 0)
        return MOEC_OK;
    const rank_worker *w = &g->w[failed];
    return MOEC_ERR(w->st, "%s: rank %d of %d (GPU %d) failed, which ended every rank: %s", what,
                    failed, g->n, failed, w->err);
}

moec_status moec_ranks_new(ir_plan **plans, ir_module **mods, int n, moec_ranks **out)
{
    moec_ranks *g = calloc(1, sizeof *g);
    if (!g) {
        for (int r = 0; r < n; r++) {
            ir_plan_free(plans[r]);
            ir_module_free(mods[r]);
        }
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    }
    g->n = n;
    g->failed = -1;
    for (int r = 0; r < n; r++) {
        g->w[r].g = g;
        g->w[r].r = r;
        g->w[r].m.plan = plans[r];
        g->w[r].m.fused = mods[r];
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->done, NULL);
    *out = g;
    return MOEC_OK;
}

const ir_plan *moec_ranks_plan(const moec_ranks *g) { return g->w[0].m.plan; }
ir_module *moec_ranks_module(const moec_ranks *g) { return g->w[0].m.fused; }
rt_cuda *moec_ranks_cuda(const moec_ranks *g) { return g->w[0].m.cuda; }

/* Block-table entries per row: max_seq_len's blocks. */
static int ranks_row_blocks(const struct moec_ranks *g)
{
    int bs = g->w[0].m.plan->kv_block_size;
    return (g->opts.max_seq_len + bs - 1) / bs;
}

/* Every rank holds its shard of each block, so the group's pool has as many
 * blocks as the smallest rank's (a pool sized by memory may differ by rank).
 * When that does not fill every row, rows must start empty on every rank,
 * as one context's table does when its pool is short. */
static moec_status ranks_agree_pool(struct moec_ranks *g)
{
    g->kv_blocks = rt_cuda_kv_blocks(g->w[0].m.cuda);
    int same = 1;
    for (int r = 1; r < g->n; r++) {
        int b = rt_cuda_kv_blocks(g->w[r].m.cuda);
        same &= b == g->kv_blocks;
        g->kv_blocks = b < g->kv_blocks ? b : g->kv_blocks;
    }
    int per_row = ranks_row_blocks(g);
    if (same || (int64_t)g->kv_blocks >= (int64_t)g->opts.max_seqs * per_row)
        return MOEC_OK;
    int32_t *none = malloc((size_t)per_row * sizeof *none);
    if (!none)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for a block-table row of %d", per_row);
    for (int i = 0; i < per_row; i++)
        none[i] = -1;
    moec_status st = MOEC_OK;
    for (int row = 0; st == MOEC_OK && row < g->opts.max_seqs; row++)
        st = moec_ranks_set_blocks(g, row, 0, per_row, none);
    free(none);
    return st;
}

moec_status moec_ranks_bind(moec_ranks *g, const ir_plan_meta *meta, const char *plan_path,
                            const char *weights_dir, const moec_cuda_opts *o, int *vocab)
{
    int n_dev = 0;
    MOEC_TRY(moec_cuda_device_count(&n_dev));
    if (g->n > n_dev)
        return MOEC_ERR(MOEC_ERR_NO_DEVICE,
                        "plan %s is split over %d ranks (tp %d, ep %d): it needs %d GPUs, this "
                        "machine has %d",
                        plan_path, g->n, meta->tp, meta->ep, g->n, n_dev);
    int devs[IR_MAX_RANKS];
    for (int r = 0; r < g->n; r++)
        devs[r] = r;
    MOEC_TRY(rt_comm_init_all(g->n, devs, g->comms));
    g->meta = meta;
    g->plan_path = plan_path;
    g->weights_dir = weights_dir;
    g->opts = *o;
    for (int r = 0; r < g->n; r++) {
        if (pthread_create(&g->w[r].th, NULL, rank_main, &g->w[r]) != 0)
            return MOEC_ERR(MOEC_ERR_OOM, "cannot start the thread of rank %d", r);
        g->threads = r + 1;
    }
    MOEC_TRY(run_cmd(g, CMD_BIND, "binding the ranks"));
    *vocab = g->vocab;
    return ranks_agree_pool(g);
}

/* MOEC_OK when the group is bound and no rank has failed. */
static moec_status ranks_ready(const struct moec_ranks *g)
{
    if (g->failed >= 0)
        return MOEC_ERR(MOEC_ERR_CUDA,
                        "the group of %d ranks stopped when rank %d failed: %s", g->n, g->failed,
                        g->w[g->failed].err);
    if (g->threads != g->n)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "the group of %d ranks is not bound", g->n);
    return MOEC_OK;
}

moec_status moec_ranks_step(moec_ranks *g, int n, const int32_t *tokens,
                            const int32_t *positions, const int32_t *slots, int first, int count,
                            float *logits_out, int32_t *sampled_out)
{
    MOEC_TRY(ranks_ready(g));
    /* checked here, once, on rank 0 (every rank has the same table): a bad
     * step must not look like a failing rank */
    MOEC_TRY(rt_cuda_check_inputs(moec_ranks_cuda(g), n, tokens, positions, slots));
    g->n_tok = n;
    g->tokens = tokens;
    g->positions = positions;
    g->slots = slots;
    g->first = first;
    g->count = count;
    g->logits_out = logits_out;
    g->sampled_out = sampled_out;
    return run_cmd(g, CMD_STEP, "a step");
}

moec_status moec_ranks_each(moec_ranks *g, moec_rank_fn fn, void *user, const char *what)
{
    MOEC_TRY(ranks_ready(g));
    g->each_fn = fn;
    g->each_user = user;
    return run_cmd(g, CMD_EACH, what);
}

moec_status moec_ranks_set_blocks(moec_ranks *g, int row, int first, int n,
                                  const int32_t *blocks)
{
    if (g->threads != g->n)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "the group of %d ranks is not bound", g->n);
    /* checked against the group's pool once: entries past the fewest
     * blocks a rank holds are refused for every rank */
    MOEC_TRY(rt_block_table_check(g->opts.max_seqs, ranks_row_blocks(g), g->kv_blocks, row,
                                  first, n, blocks));
    /* the tables are host memory until a step uploads them: the rank
     * threads, idle between commands, see them through the group's lock */
    for (int r = 0; r < g->n; r++) {
        moec_status st = rt_cuda_set_blocks(g->w[r].m.cuda, row, first, n, blocks);
        if (st != MOEC_OK)
            return moec_err_wrap(st, "rank %d", r);
    }
    return MOEC_OK;
}

int moec_ranks_kv_blocks(const moec_ranks *g) { return g->kv_blocks; }
int moec_ranks_count(const moec_ranks *g) { return g->n; }

void moec_ranks_free(moec_ranks *g)
{
    if (!g)
        return;
    if (g->threads) {
        /* the error that ended the group (if one did) stays the caller's */
        run_on_ranks(g, CMD_QUIT);
        for (int r = 0; r < g->threads; r++)
            pthread_join(g->w[r].th, NULL);
    }
    for (int r = g->threads; r < g->n; r++)
        moec_cuda_model_free(&g->w[r].m);
    rt_comm_free_all(g->comms, g->n);
    pthread_cond_destroy(&g->done);
    pthread_cond_destroy(&g->go);
    pthread_mutex_destroy(&g->mu);
    free(g);
}
