/* step_check.c — see step_check.h. */
#include "runtime/step_check.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "err.h"

moec_status rt_step_check(const rt_step_limits *l, int n, const int32_t *tokens,
                          const int32_t *positions, const int32_t *slots)
{
    if (n < 1 || n > l->max_tokens)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "a step runs 1 to %d tokens, not %d", l->max_tokens,
                        n);
    if (!tokens || !positions || !slots)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "a step got NULL tokens, positions or slots");
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0 || slots[i] >= l->max_seqs)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "token %d: slot %d is not in [0, %d)", i,
                            slots[i], l->max_seqs);
        if (positions[i] < 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "token %d: position %d is negative", i,
                            positions[i]);
        if (positions[i] >= l->max_seq_len)
            return MOEC_ERR(MOEC_ERR_CAPACITY,
                            "token %d: position %d of slot %d does not fit the KV cache of %d "
                            "tokens per sequence",
                            i, positions[i], slots[i], l->max_seq_len);
        if (l->table &&
            l->table[(size_t)slots[i] * (size_t)l->max_blocks + positions[i] / l->block_size] < 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "token %d: position %d of slot %d has no KV block (entry %d of its "
                            "row of the block table is -1)",
                            i, positions[i], slots[i], positions[i] / l->block_size);
        if (l->vocab && (tokens[i] < 0 || tokens[i] >= l->vocab))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "token %d: id %d is outside the vocabulary (%d ids)", i, tokens[i],
                            l->vocab);
    }
    return MOEC_OK;
}

moec_status rt_block_table_check(int max_seqs, int max_blocks, int n_blocks, int row, int first,
                                 int n, const int32_t *blocks)
{
    if (!blocks && n > 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "block table: NULL blocks");
    if (row < 0 || row >= max_seqs)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "block table: row %d is not in [0, %d)", row,
                        max_seqs);
    /* the last entry named in 64 bits: first + n - 1 may pass INT_MAX */
    if (first < 0 || n < 0 || first > max_blocks - n)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "block table: entries %d .. %lld of row %d: a row has %d entries", first,
                        (long long)first + n - 1, row, max_blocks);
    for (int i = 0; i < n; i++)
        if (blocks[i] < -1 || blocks[i] >= n_blocks)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "block table: entry %d of row %d: block %d is not in [0, %d) or -1",
                            first + i, row, blocks[i], n_blocks);
    return MOEC_OK;
}

/* x finite and in [lo, hi]. */
static int in_range(float x, float lo, float hi) { return isfinite(x) && x >= lo && x <= hi; }

moec_status rt_sample_check(int vocab, int n, const ir_sample_row *rows, int n_pen,
                            const ir_sample_pen *pens, uint32_t *stamp, uint32_t *epoch)
{
    int next = 0; /* where the next on row's entries may start */
    for (int r = 0; r < n; r++) {
        const ir_sample_row *p = &rows[r];
        if (p->mode == IR_SAMPLE_OFF)
            continue;
        if (p->mode != IR_SAMPLE_ON)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "sampling row %d: mode %d is neither off nor on",
                            r, p->mode);
        uint64_t min_w = (uint64_t)p->min_p_hi << 32 | p->min_p_lo;
        if (!in_range(p->temperature, 0, FLT_MAX) ||
            (p->temperature > 0 && !(in_range(p->inv_temp, 0, FLT_MAX) && p->inv_temp > 0)))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "sampling row %d: temperature %g (1/t %g) is not finite and >= 0", r,
                            (double)p->temperature, (double)p->inv_temp);
        if (p->top_k < 0 || p->top_k >= vocab)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "sampling row %d: top_k %d is not in [0, %d) (0: none)", r, p->top_k,
                            vocab);
        if (min_w > (1ull << IR_SAMPLE_WEIGHT_BITS))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "sampling row %d: min_p's weight %llu is over 2^%d (min_p 1)", r,
                            (unsigned long long)min_w, IR_SAMPLE_WEIGHT_BITS);
        if (!in_range(p->repetition, 0, FLT_MAX) || !(p->repetition > 0) || !isfinite(p->presence) ||
            !isfinite(p->frequency))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "sampling row %d: penalties %g, %g, %g (repetition above 0, all "
                            "finite)",
                            r, (double)p->repetition, (double)p->presence, (double)p->frequency);
        if (p->pen_count < 0 || p->pen_first < next || p->pen_first > n_pen ||
            p->pen_count > n_pen - p->pen_first)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "sampling row %d: penalty entries %d .. %d are not a range of the %d "
                            "after the rows before it",
                            r, p->pen_first, p->pen_first + p->pen_count - 1, n_pen);
        next = p->pen_first + p->pen_count;
        if (++*epoch == 0) {
            memset(stamp, 0, (size_t)vocab * sizeof *stamp);
            *epoch = 1;
        }
        for (int j = p->pen_first; j < next; j++) {
            int32_t id = pens[j].id;
            if (id < 0 || id >= vocab || pens[j].count < 0)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "sampling row %d: penalty entry %d: id %d (vocabulary %d), count "
                                "%d",
                                r, j, id, vocab, pens[j].count);
            if (stamp[id] == *epoch)
                return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                                "sampling row %d: penalty entry %d: id %d is listed twice", r, j,
                                id);
            stamp[id] = *epoch;
        }
    }
    return MOEC_OK;
}
