/* sample.h — choosing a request's next token from its row of logits
 * (moec_sampling in moec_rt.h): penalties, temperature, top_k, top_p,
 * min_p, a draw keyed by the request's seed and the token's place in its
 * output, greedy at temperature 0, and the log probabilities asked for.
 *
 * The algorithm is ir/ir_sample.h's, the one the device sampler
 * (codegen/sample.c) runs: the host builds a row's parameters and penalty
 * entries here for either, and moec_sample_row is the kernel's CPU twin,
 * drawing the very same token from the same logits (docs/SAMPLING.md). */
#ifndef MOEC_ENGINE_SAMPLE_H
#define MOEC_ENGINE_SAMPLE_H

#include <stdint.h>

#include "ir/ir_plan.h"
#include "ir/ir_sample.h"
#include "moec_rt.h"

/* Scratch for rows of vocab ids. */
typedef struct moec_sampler {
    int vocab;
    float *work;         /* the row, penalties applied */
    void *cands;         /* vocab candidates: id and processed logit (sample.c) */
    uint64_t *weight;    /* per id: its integer weight (ir_sample.h) */
    unsigned char *keep; /* per id: still in the support */
    uint32_t *stamp;     /* per id: the epoch it was last seen in */
    int32_t *count;      /* per id: its count in the output, valid when stamped */
    uint32_t epoch;
    ir_sample_pen *pens; /* vocab entries: the penalties of the row being sampled */
} moec_sampler;

moec_status moec_sampler_init(moec_sampler *s, int vocab);
void moec_sampler_free(moec_sampler *s);

/* 1 when the token is the argmax of the raw logits and nothing else is
 * asked: the GPU's argmax serves it with no sampling at all. */
int moec_sampling_is_plain_greedy(const moec_sampling *sp);

/* The parameter row of a request's token number `counter` of its output
 * (sp checked), its penalty entries not yet placed (pen_first and
 * pen_count 0). */
void moec_sample_row_init(const moec_sampling *sp, int vocab, int counter, ir_sample_row *row);
/* The penalty entries of a request whose tokens[0, n_prompt) are its prompt
 * and tokens[n_prompt, n_known) its output so far: every distinct id of
 * both when sp has a repetition penalty, else of its output when it has a
 * presence or frequency penalty, else none; each with its count in the
 * output, in order of first appearance. Into pens (room for cap); returns
 * how many, or -1 when more than cap. */
int moec_sample_penalties(moec_sampler *s, const moec_sampling *sp, const int32_t *tokens,
                          int n_prompt, int n_known, ir_sample_pen *pens, int cap);

/* The token the device sampler draws for row parameters p, whose
 * p->pen_count entries start at pens (p->pen_first is not read), from a
 * row of vocab logits (IR_SAMPLE_ON assumed); IR_SAMPLED_NONFINITE when
 * the penalized row holds a NaN or an infinity (non-finite logits, or
 * penalties that overflowed). The log probability is not its business. */
int32_t moec_sample_row(moec_sampler *s, const ir_sample_row *p, const ir_sample_pen *pens,
                        const float *logits);

/* The integer weight of a scaled logit x <= 0: floor(e^x * 2^40) in the
 * float operations of ir_sample.h (the kernel's moec_sample_weight), 0 below
 * IR_SAMPLE_X_MIN. */
uint64_t moec_sample_weight(float x);

/* The log probability of id tok under the logits (finite): their
 * log-softmax, in double. */
float moec_sample_logprob(const float *logits, int vocab, int32_t tok);

/* The next token of a request from its row of logits (vocab floats) on the
 * host: its parameter row and penalties as above (counter: its output so
 * far), then moec_sample_row, then ev->logprob and ev->n_top/top_* as sp
 * asks (nothing written when not finite). */
int32_t moec_sample(moec_sampler *s, const moec_sampling *sp, const float *logits,
                    const int32_t *tokens, int n_prompt, int n_known, moec_event *ev);

#endif
