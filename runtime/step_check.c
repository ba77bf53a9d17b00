/* step_check.c — see step_check.h. */
#include "runtime/step_check.h"

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
    if (first < 0 || n < 0 || first > max_blocks - n)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "block table: entries %d .. %d of row %d: a row has %d entries", first,
                        first + n - 1, row, max_blocks);
    for (int i = 0; i < n; i++)
        if (blocks[i] < -1 || blocks[i] >= n_blocks)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "block table: entry %d of row %d: block %d is not in [0, %d) or -1",
                            first + i, row, blocks[i], n_blocks);
    return MOEC_OK;
}
