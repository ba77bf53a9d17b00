/* interp.h — the CPU reference interpreter: executes any IR module in fp32,
 * one plain function per op, with a KV cache per attention op (one
 * sequence's, or a paged pool shared by many). It is the
 * definition of every op, the oracle of every test, and the backend used
 * where there is no GPU. */
#ifndef MOEC_RT_INTERP_H
#define MOEC_RT_INTERP_H

#include "ir/ir.h"
#include "ir/ir_plan.h"
#include "runtime/weights.h"

typedef struct rt_interp rt_interp;

/* Prepares to run m for one sequence of up to max_seq tokens. Weights are
 * read (widened to fp32) from w; with w NULL they start at zero and the
 * caller sets each with rt_interp_set_weight (pass tests use random
 * weights). */
moec_status rt_interp_init(const ir_module *m, const rt_weights *w, int max_seq,
                           rt_interp **out);
/* A paged interpreter for many sequences at once, as the GPU runs them:
 * every attention op's KV cache is one pool of n_pages pages of page_size
 * positions, shared by all sequences, and each forward says through a page
 * map which page holds each position of each token's sequence
 * (rt_interp_forward_paged). Pages may be shared (a common prefix). */
moec_status rt_interp_init_paged(const ir_module *m, const rt_weights *w, int n_pages,
                                 int page_size, rt_interp **out);
/* A group of n ranks (1 to IR_MAX_RANKS) of one sharded model (pass shard):
 * rank r runs mods[r], whose metas tp and rank must say so (an unsharded
 * module may be the one rank of a group of 1), with its weights read from
 * the checkpoint in weights_dir (each rank reads only its slices; NULL:
 * zeros), each rank for one sequence of up to max_seq tokens. The result is
 * rank 0's interpreter: rt_interp_forward on it runs every rank in step,
 * each up to its next collective, then that collective in memory across
 * them all, and writes rank 0's output; rt_interp_reset, rt_interp_use_plan
 * and rt_interp_free act on every rank. Takes the modules: they are freed
 * with the group, or here on failure. The other accessors see rank 0
 * (rt_interp_rank for the rest). */
moec_status rt_interp_init_ranks(ir_module **mods, int n, const char *weights_dir, int max_seq,
                                 rt_interp **out);
/* The same with every rank paged (rt_interp_init_paged): each rank's KV
 * pool has n_pages pages of page_size positions, holding that rank's shard
 * (its heads) of every page, and rt_interp_forward_paged on the group maps
 * them all through the one page map it is given. */
moec_status rt_interp_init_ranks_paged(ir_module **mods, int n, const char *weights_dir,
                                       int n_pages, int page_size, rt_interp **out);
/* Rank r's interpreter of a group (in itself for r 0, or alone); NULL when
 * there is no rank r. */
rt_interp *rt_interp_rank(rt_interp *in, int r);
void rt_interp_free(rt_interp *in);

/* A page map: row r of table (max_pages entries) lists the pages of one
 * sequence, position p in page table[r * max_pages + p / page_size]; token
 * t of a forward belongs to the sequence of row[t]. */
typedef struct rt_interp_pages {
    const int32_t *table; /* [n_rows, max_pages] */
    int max_pages;
    int n_rows;
    const int32_t *row;   /* per token */
} rt_interp_pages;

/* Copies ir_type_numel(&v->type, 0) floats into weight v. */
moec_status rt_interp_set_weight(rt_interp *in, const ir_value *v, const float *data);
/* The interpreter's fp32 copy of weight v (to read or perturb). */
float *rt_interp_weight(rt_interp *in, const ir_value *v);

/* A diagnostic of storage precision: from now on every op result that the
 * GPU would store in the compute dtype dt (ir_value_storage_dtype: bf16 or
 * f16) is rounded to it, to nearest even, after its op, and the weights
 * stored in dt are rounded once now; arithmetic inside each op stays fp32.
 * Results of op kinds with bit (1 << kind) set in skip stay fp32 (to find
 * which op's rounding costs the most). dt F32 stops the rounding (weights
 * stay as rounded). Collectives' results are not rounded. */
moec_status rt_interp_round_storage(rt_interp *in, ir_dtype dt, uint64_t skip);

/* Runs the module on T tokens (inputs "tokens" and "positions", i32[T]),
 * appending to the KV caches. Writes output 0 ([T, ...] f32, all T rows)
 * into out when not NULL. MOEC_ERR_CAPACITY if a position is >= max_seq.
 * Not for a paged interpreter. */
moec_status rt_interp_forward(rt_interp *in, const int32_t *tokens, const int32_t *positions,
                              int T, float *out);
/* The same on a paged interpreter, tokens of any sequences mixed: each
 * token's K/V go to the page its position maps to in its row of pages (all
 * written before any token attends), and it attends to positions 0..its own
 * of that row. Every page a token's row maps up to its position must be in
 * [0, n_pages) (MOEC_ERR_INVALID_ARG naming the token, row and page), and
 * each position below max_pages * page_size (MOEC_ERR_CAPACITY); rows are
 * independent, so a token's logits do not depend on what else runs with
 * it. */
moec_status rt_interp_forward_paged(rt_interp *in, const rt_interp_pages *pages,
                                    const int32_t *tokens, const int32_t *positions, int T,
                                    float *out);
/* The greedy id of one row of n logits: the largest, the lowest id on ties;
 * IR_SAMPLED_NONFINITE when the row holds a NaN or an infinity, as the GPU's
 * argmax step gives. */
int32_t rt_logits_argmax(const float *row, int n);
/* Planned-arena mode (enable 1), to test memory plans for real: every
 * activation (input and op result) lives in ONE buffer of meta
 * "arena_bytes_per_token" * T bytes, at byte mem_offset * T, 4 bytes an
 * element, so values whose planned ranges overlap while both are live
 * corrupt each other. An op's results must not overlap its operands (but a
 * reshape, fork or join may sit exactly on its operand). rt_interp_value
 * then shows what the arena holds at the value's place after the forward.
 * MOEC_ERR_INVALID_ARG naming the first activation without an offset (or
 * one misaligned or past the arena; checked again at each forward).
 * enable 0: separate buffers (the default). */
moec_status rt_interp_use_plan(rt_interp *in, int enable);
/* Looks up any value of the last forward (fp32, [T, ...]); NULL if unknown.
 * For debugging and pass tests. */
const float *rt_interp_value(const rt_interp *in, const ir_value *v);
/* Empties the KV caches (every page). */
void rt_interp_reset(rt_interp *in);

#endif
