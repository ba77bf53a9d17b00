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
        if (l->vocab && (tokens[i] < 0 || tokens[i] >= l->vocab))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "token %d: id %d is outside the vocabulary (%d ids)", i, tokens[i],
                            l->vocab);
    }
    return MOEC_OK;
}
