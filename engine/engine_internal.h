/* engine_internal.h — what the library's own files (engine/ and the
 * compiler's API glue, not its users) may ask of the runtime's public
 * handles: a plan bound to the GPU, the session and engine structs, and the
 * steps that sessions and engines made from a model (compiler/) share with
 * those made from a plan file (here). Nothing here needs the compiler. */
#ifndef MOEC_ENGINE_INTERNAL_H
#define MOEC_ENGINE_INTERNAL_H

#include "graphs/graph.h"
#include "ir/ir.h"
#include "ir/ir_plan_file.h"
#include "moec_rt.h"
#include "runtime/cuda_rt.h"
#include "runtime/interp.h"
#include "runtime/weights.h"

/* A plan bound to the GPU: the plan and the module it points into (built
 * in-process by the compiler, or read from a plan file), the runtime bound
 * for max_seqs sequences of max_seq_len, and its graphs. */
typedef struct moec_ranks moec_ranks;

typedef struct moec_cuda_model {
    ir_module *fused;
    ir_plan *plan;
    rt_cuda *cuda;
    graph_set *graphs;
    double capture_s; /* capturing every bucket's graph (0: not captured) */
    /* A plan split over ranks (engine/ranks.c): the group owns every rank's
     * plan, module, context and graphs; fused, plan and cuda above are rank
     * 0's, borrowed (for queries), and graphs is NULL. */
    moec_ranks *ranks;
} moec_cuda_model;

/* How a plan is bound: graphs are captured at bind unless `eager` or
 * MOEC_DISABLE_GRAPHS=1; single_stream runs the shared-expert branch on
 * stream 0 too (moec --single-stream); the KV pool as rt_cuda_sizes says
 * (kv_blocks and kv_fraction 0: every slot owns max_seq_len of blocks). */
typedef struct moec_cuda_opts {
    int max_seqs, max_seq_len;
    int single_stream;
    int eager;
    int kv_blocks;
    double kv_fraction;
    int device;     /* the GPU (a rank's; 0 otherwise) */
    rt_comm *comm;  /* a rank's communicator (engine/ranks.c); NULL unsharded */
} moec_cuda_opts;

/* AUTO becomes CUDA where a device is present, else CPU; CUDA is checked
 * to have a device (MOEC_ERR_NO_DEVICE otherwise). */
moec_status moec_resolve_backend(moec_backend *backend);

/* x->plan and x->fused made: binds them with w for o (rt_cuda_init, the
 * logits checked to have vocab columns, the graph policy applied). */
moec_status moec_cuda_model_bind(moec_cuda_model *x, const rt_weights *w,
                                 const moec_cuda_opts *o, int vocab, const char *what);
/* MOEC_ERR_IO when plan_path is a directory. */
moec_status moec_check_plan_path(const char *plan_path);
/* Reads the plan file into x->plan and x->fused (x zeroed first). */
moec_status moec_cuda_plan_read(const char *plan_path, moec_cuda_model *x, ir_plan_meta *meta);
/* Binds a plan read into x for o: max_seq_len checked against the model's
 * max_position_embeddings, the plan checked against the checkpoint in
 * weights_dir (meta's hashes), weights uploaded, graphs captured; *vocab
 * gets the model's vocab_size. */
moec_status moec_cuda_plan_bind(moec_cuda_model *x, const ir_plan_meta *meta,
                                const char *plan_path, const char *weights_dir,
                                const moec_cuda_opts *o, int *vocab);
/* MOEC_ERR_INVALID_ARG when par asks for another split than the plan's
 * (par NULL: any). */
moec_status moec_plan_check_parallel(const ir_plan_meta *meta, const moec_parallel *par,
                                     const char *plan_path);
/* moec_cuda_plan_read, then moec_cuda_plan_bind. On failure x holds what
 * was made (free it). */
moec_status moec_cuda_model_init_plan(const char *plan_path, const char *weights_dir,
                                      const moec_cuda_opts *o, moec_cuda_model *x, int *vocab);
void moec_cuda_model_free(moec_cuda_model *x);
/* One step of n tokens on x (graph replay where captured): the logits of
 * rows first .. first + count - 1 into logits_out, the n argmax ids into
 * sampled_out (each when not NULL). */
moec_status moec_cuda_model_step(moec_cuda_model *x, int n, const int32_t *tokens,
                                 const int32_t *positions, const int32_t *slots, int first,
                                 int count, float *logits_out, int32_t *sampled_out);
/* Block-table entries first .. first + n - 1 of row `row` (every rank's
 * table when split), and the blocks of the pool (a split's: the fewest any
 * rank holds). */
moec_status moec_cuda_model_set_blocks(moec_cuda_model *x, int row, int first, int n,
                                       const int32_t *blocks);
int moec_cuda_model_kv_blocks(const moec_cuda_model *x);

/* ---- a plan split over ranks (engine/ranks.c) ------------------------------ */

/* A group of n ranks over their plans and modules (taken; freed with the
 * group, or here on failure), not yet bound. */
moec_status moec_ranks_new(ir_plan **plans, ir_module **mods, int n, moec_ranks **out);
/* Rank 0's plan, module and (once bound) context. */
const ir_plan *moec_ranks_plan(const moec_ranks *g);
ir_module *moec_ranks_module(const moec_ranks *g);
rt_cuda *moec_ranks_cuda(const moec_ranks *g);
/* Binds rank r on GPU r (MOEC_ERR_NO_DEVICE when the machine has fewer GPUs
 * than ranks), a thread each, with communicators made at once; each rank
 * reads only its slices of the checkpoint, and holds its shard of every
 * block of the KV pool. A pool sized by memory takes the fewest blocks any
 * rank found room for; then, unless that fills every row, every rank's
 * table starts empty (-1), as one context's does. *vocab: as
 * moec_cuda_plan_bind. */
moec_status moec_ranks_bind(moec_ranks *g, const ir_plan_meta *meta, const char *plan_path,
                            const char *weights_dir, const moec_cuda_opts *o, int *vocab);
/* One step on every rank at once; rank 0 copies logits (rows first ..
 * first + count - 1) and sampled ids back. A failing rank ends every rank;
 * its error (naming it) is returned, and the group is unusable after. */
moec_status moec_ranks_step(moec_ranks *g, int n, const int32_t *tokens,
                            const int32_t *positions, const int32_t *slots, int first, int count,
                            float *logits_out, int32_t *sampled_out);
/* Sets the entries in every rank's block table (between steps). */
moec_status moec_ranks_set_blocks(moec_ranks *g, int row, int first, int n,
                                  const int32_t *blocks);
/* The blocks of the group's pool (as bound). */
int moec_ranks_kv_blocks(const moec_ranks *g);
/* The ranks of the group. */
int moec_ranks_count(const moec_ranks *g);
void moec_ranks_free(moec_ranks *g);

/* Work on one rank's bound model (its plan, module, context and graphs),
 * called on that rank's thread: what a benchmark does on every rank at
 * once (capture, timed steps, profiles), the collectives inside meeting
 * the other ranks'. */
typedef moec_status (*moec_rank_fn)(moec_cuda_model *m, int rank, void *user);
/* fn on every rank of the bound group at once, each on its thread; as a
 * step, a failing rank ends every rank and its error (naming it, prefixed
 * with what) is returned. */
moec_status moec_ranks_each(moec_ranks *g, moec_rank_fn fn, void *user, const char *what);
/* The same on a bound model: every rank of a split, else fn(x, 0, user). */
moec_status moec_cuda_model_each(moec_cuda_model *x, moec_rank_fn fn, void *user,
                                 const char *what);
/* The ranks of x: its group's, else 1. */
int moec_cuda_model_ranks(const moec_cuda_model *x);

/* The eos ids of a module (its meta eos_token_id: one id or a list) as the
 * public API gives them out, each checked to lie in [0, vocab_size)
 * (engine/eos.c). */
typedef struct moec_eos {
    int n;
    int32_t *ids;
} moec_eos;
moec_status moec_eos_init(const ir_module *m, moec_eos *out);
void moec_eos_free(moec_eos *e);
/* e's count, and *ids (when ids is not NULL) its ids. */
int moec_eos_list(const moec_eos *e, const int32_t **ids);
/* The first id, or -1. */
int moec_eos_first(const moec_eos *e);

/* One sequence: the CPU interpreter on the unfused module, or a plan bound
 * to the GPU. */
struct moec_session {
    moec_backend backend;
    int max_seq;
    int length;
    int vocab;
    moec_eos eos;
    long steps; /* forward calls begun, for errors */
    /* CPU: the session's own copy of the model's module (the caller may
     * free the model once the session is made, as with an engine) */
    ir_module *module;
    rt_weights *weights;
    rt_interp *interp;
    /* CUDA: the plan points into the fused module, the runtime into both */
    moec_cuda_model gpu;
};

/* A zeroed session of max_seq_len tokens on backend (CPU or CUDA). */
moec_status moec_session_new(moec_backend backend, int max_seq_len, moec_session_t **out);
/* A CPU session's interpreter on its own copy of module. */
moec_status moec_session_bind_cpu(moec_session_t *s, const ir_module *module,
                                  const char *weights_dir);

/* The scheduler's state (engine/sched.c). */
typedef struct moec_sched moec_sched;

/* Sequences over one pool of KV blocks, a block-table row each. */
struct moec_engine {
    moec_backend backend; /* CPU or CUDA, never AUTO */
    int max_seqs, max_seq_len, max_tokens;
    int vocab;
    int kv_blocks, block_size; /* the pool: blocks of block_size tokens */
    int max_blocks;            /* block-table entries per row: max_seq_len's blocks */
    moec_eos eos;
    /* CPU: the module copy, one paged interpreter over the pool (split:
     * a group of ranks' interpreters, which owns their modules, and module
     * is NULL), the block table, and max_tokens rows of logits when the
     * caller wants none */
    ir_module *module;
    rt_interp *interp;
    int32_t *table;
    float *rows;
    /* both: max_tokens greedy ids of a moec_engine_step whose caller wants
     * none (they say which rows are not finite), and the steps it ran, for
     * errors */
    int32_t *next;
    long steps;
    /* CUDA: the plan bound (the block table lives in its context) */
    moec_cuda_model gpu;
    /* the device sampler's room for penalty entries per step, -1 when every
     * row is sampled on the host: the CPU backend, a plan without the
     * sampler, or MOEC_SAMPLER=host */
    int sample_cap;
    moec_sched *sched;
};

/* max_seqs and max_seq_len from the options (0: the defaults), checked
 * against the model's max_position_embeddings (0: unknown), and the other
 * pool options checked. */
moec_status moec_engine_sizes(const moec_engine_options *opt, int max_pos, int *max_seqs,
                              int *max_seq_len);
/* The CPU backend of e (sizes set): module copied, its weights read into a
 * paged interpreter over a pool of opt's blocks, the block table made. */
moec_status moec_engine_open_cpu(moec_engine_t *e, const ir_module *module,
                                 const char *weights_dir, const moec_engine_options *opt);
/* The same over the sharded modules of n ranks (rt_interp_init_ranks_paged:
 * every rank's interpreter holds its shard of each block of the pool, and
 * the one block table maps them all; the modules are taken, freed with the
 * engine or here on failure). */
moec_status moec_engine_open_cpu_ranks(moec_engine_t *e, ir_module **mods, int n,
                                       const char *weights_dir, const moec_engine_options *opt);
/* moec_cuda_opts for an engine of e's sizes. */
moec_cuda_opts moec_engine_cuda_opts(const moec_engine_t *e, const moec_engine_options *opt);
/* The end of opening either backend (e->gpu bound, or the CPU backend made):
 * the pool's sizes taken (opt's kv_block_size checked against the plan's),
 * e->next and the scheduler made. */
moec_status moec_engine_open_done(moec_engine_t *e, const moec_engine_options *opt);

/* Sets entries first .. first + n - 1 of block-table row `row` (checked). */
moec_status moec_engine_table_set(moec_engine_t *e, int row, int first, int n,
                                  const int32_t *blocks);
/* One step of n checked tokens on e's backend: next ids into next_out (when
 * not NULL; IR_SAMPLED_NONFINITE for a row with a NaN or an infinity), the
 * logits of rows first .. first + count - 1 into logits_out (when not
 * NULL). */
moec_status moec_engine_forward(moec_engine_t *e, int n, const int32_t *tokens,
                                const int32_t *positions, const int32_t *slots,
                                int32_t *next_out, int first, int count, float *logits_out);

/* The next step's device sampling (sample_cap >= 0): rt_cuda_set_sampling
 * on the context (a split's rank 0, which holds the gathered logits). */
moec_status moec_engine_set_sampling(moec_engine_t *e, int n, const ir_sample_row *rows,
                                     int n_pen, const ir_sample_pen *pens, int32_t *tokens_out,
                                     float *logprobs_out);

/* The scheduler of e (sched.c): made at open, freed with e; busy while it
 * has requests (and so owns the block table). */
moec_status moec_sched_init(moec_engine_t *e, int prefix_cache);
void moec_sched_free(moec_engine_t *e);
int moec_sched_busy(const moec_engine_t *e);
/* The prefix cache emptied: a step below the scheduler may write any block. */
void moec_sched_forget(moec_engine_t *e);

#endif
