/* sample.h — choosing a request's next token from its row of logits on the
 * host (moec_sampling in moec_rt.h): penalties, temperature, top_k, top_p,
 * min_p, a draw from the request's own random stream, greedy at
 * temperature 0, and the log probabilities asked for. Deterministic: the
 * same logits, settings and stream give the same token on any machine. */
#ifndef MOEC_ENGINE_SAMPLE_H
#define MOEC_ENGINE_SAMPLE_H

#include <stdint.h>

#include "moec_rt.h"

/* Scratch for rows of vocab ids. */
typedef struct moec_sampler {
    int vocab;
    float *work;     /* the row, penalties applied */
    void *cands;     /* vocab candidates: id and processed logit (sample.c) */
    double *prob;    /* per id: its weight exp((v - max) / temperature) */
    uint32_t *stamp; /* per id: the epoch it was last seen in */
    int32_t *count;  /* per id: its count in the output, valid when stamped */
    uint32_t epoch;
} moec_sampler;

moec_status moec_sampler_init(moec_sampler *s, int vocab);
void moec_sampler_free(moec_sampler *s);

/* 1 when the token is the argmax of the raw logits and nothing else is
 * asked: the GPU's argmax serves it with no logits copied back. */
int moec_sampling_is_plain_greedy(const moec_sampling *sp);
/* The first state of a request's random stream. */
uint64_t moec_sampling_stream(uint64_t seed);

/* The next token of a request from its row of logits (vocab floats):
 * tokens[0, n_prompt) are its prompt and tokens[n_prompt, n_known) its
 * output so far (for the penalties); *rng advances by one draw when it
 * samples. ev->logprob and ev->n_top/top_* are written as sp asks.
 * IR_SAMPLED_NONFINITE, and nothing drawn or written, when the row it
 * samples from (the logits, penalties applied) holds a NaN or an infinity:
 * non-finite logits, or penalties that overflowed. */
int32_t moec_sample(moec_sampler *s, const moec_sampling *sp, uint64_t *rng, const float *logits,
                    const int32_t *tokens, int n_prompt, int n_known, moec_event *ev);

#endif
