/* step_check.h — the one check of a step's inputs, made before anything
 * runs by the engine (either backend) and by the CUDA runtime. */
#ifndef MOEC_RT_STEP_CHECK_H
#define MOEC_RT_STEP_CHECK_H

#include <stdint.h>

#include "moec_rt.h"

typedef struct rt_step_limits {
    int max_tokens;  /* tokens one step takes */
    int max_seqs;    /* slots */
    int max_seq_len; /* positions per slot */
    int vocab;       /* token ids below it; 0: unchecked */
} rt_step_limits;

/* n in [1, max_tokens]; every token's slot in [0, max_seqs), position in
 * [0, max_seq_len) (MOEC_ERR_CAPACITY past it) and id in [0, vocab);
 * MOEC_ERR_INVALID_ARG naming the token otherwise. */
moec_status rt_step_check(const rt_step_limits *l, int n, const int32_t *tokens,
                          const int32_t *positions, const int32_t *slots);

#endif
