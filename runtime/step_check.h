/* step_check.h — the one check of a step's inputs, made before anything
 * runs by the engine (either backend) and by the CUDA runtime, and of a
 * change to a block table. */
#ifndef MOEC_RT_STEP_CHECK_H
#define MOEC_RT_STEP_CHECK_H

#include <stdint.h>

#include "ir/ir_sample.h"
#include "moec_rt.h"

typedef struct rt_step_limits {
    int max_tokens;  /* tokens one step takes */
    int max_seqs;    /* slots */
    int max_seq_len; /* positions per slot */
    int vocab;       /* token ids below it; 0: unchecked */
    const int32_t *table; /* when not NULL, the block table [max_seqs, max_blocks]: the
                           * block of every token's position must be set (not -1) */
    int max_blocks, block_size;
} rt_step_limits;

/* n in [1, max_tokens]; every token's slot in [0, max_seqs), position in
 * [0, max_seq_len) (MOEC_ERR_CAPACITY past it) with a block, and id in
 * [0, vocab); MOEC_ERR_INVALID_ARG naming the token otherwise. */
moec_status rt_step_check(const rt_step_limits *l, int n, const int32_t *tokens,
                          const int32_t *positions, const int32_t *slots);

/* Setting entries first .. first + n - 1 of row `row` of a block table of
 * max_seqs rows of max_blocks entries to blocks[0 .. n-1], each in
 * [0, n_blocks) or -1 (none): MOEC_ERR_INVALID_ARG naming what is out of
 * range. */
moec_status rt_block_table_check(int max_seqs, int max_blocks, int n_blocks, int row, int first,
                                 int n, const int32_t *blocks);

/* The device sampler's parameter rows[0, n) and penalty entries
 * pens[0, n_pen) for a step (ir/ir_sample.h), which the kernel trusts: each
 * row off or on; an on row's temperature finite and >= 0 (with a finite
 * inv_temp above 0 when not 0: subnormals too), top_k in [0, vocab),
 * min_p's weight at most 2^40, its penalties finite (repetition above 0,
 * subnormals too), and its entries a
 * range of [0, n_pen) after the ranges of the rows before it, their ids in
 * [0, vocab), distinct, and their counts >= 0. stamp (vocab words, zeroed
 * once) and *epoch are the check's scratch across calls.
 * MOEC_ERR_INVALID_ARG naming the row and what is wrong. */
moec_status rt_sample_check(int vocab, int n, const ir_sample_row *rows, int n_pen,
                            const ir_sample_pen *pens, uint32_t *stamp, uint32_t *epoch);

#endif
