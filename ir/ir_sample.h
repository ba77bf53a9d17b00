/* ir_sample.h — the contract of the one sampling algorithm moec has, which
 * the device sampler (codegen/sample.c, the last step of every bucket) and
 * its CPU twin (engine/sample.c) both implement: the per-row parameter
 * table and the penalty entries the host writes for each step, and the
 * constants of the arithmetic. The definition, in docs/SAMPLING.md:
 *
 *   v     the row's logits, penalties applied (float operations)
 *   greedy (temperature 0): the largest v, the lowest id on ties
 *   x_i   = (v_i - max v) * inv_temp                      (float)
 *   w_i   = floor(e^x_i * 2^40), e^x by range reduction and a degree-6
 *           polynomial in float operations without fused multiply-adds,
 *           0 below x = -28: an integer weight, the likeliest id's 2^40
 *   rank  by v descending, the lower id first on ties
 *   top_k the top_k first-ranked ids
 *   top_p of those, the fewest first-ranked whose weight reaches
 *         max(1, floor(Z * top_p32 / 2^32)), Z their total weight
 *   min_p of those, the ids with w_i >= min_p40
 *   draw  u = floor(r * S / 2^64), S the total weight left and r the
 *         64-bit hash of (seed, counter); the token is the first id in id
 *         order whose running weight exceeds u
 *
 * Every step is either exact integer arithmetic or a float operation that
 * IEEE 754 rounds the same way everywhere, so the host and the device draw
 * the same token from the same row, settings, seed and counter. They can
 * differ only where their penalized rows already differ, which they do not:
 * both run the same float operations in the same order. */
#ifndef MOEC_IR_SAMPLE_H
#define MOEC_IR_SAMPLE_H

#include <stdint.h>

/* One row of the parameter table (IR_INPUT_SAMPLE_ROWS, 64 bytes): what the
 * device sampler does with that row of the step's logits. */
typedef struct ir_sample_row {
    int32_t mode;          /* IR_SAMPLE_OFF or IR_SAMPLE_ON */
    int32_t logprob;       /* 1: write the token's log probability */
    float temperature;     /* 0: greedy */
    float inv_temp;        /* 1 / temperature, finite (FLT_MAX at most) */
    int32_t top_k;         /* 0: no top_k filter, else 1 .. vocab - 1 */
    uint32_t top_p;        /* top_p * 2^32, rounded; 0: no top_p filter */
    uint32_t min_p_lo;     /* min_p * 2^40 rounded up, a weight (lo, hi words); */
    uint32_t min_p_hi;     /* 0: no min_p filter */
    float repetition;      /* 1: none */
    float presence, frequency;
    uint32_t seed_lo, seed_hi;
    uint32_t counter;      /* the output index of the token drawn */
    int32_t pen_first;     /* the row's penalty entries: pen_count of them from */
    int32_t pen_count;     /* pen_first in IR_INPUT_SAMPLE_PENS */
} ir_sample_row;

enum { IR_SAMPLE_OFF = 0, IR_SAMPLE_ON = 1 };

/* A penalty entry: a distinct id of the request's prompt or output. The
 * repetition penalty applies to every entry, presence and frequency to
 * those with a count. raw is the device's: it keeps the logit there while
 * the row is penalized in place (the host uploads 0). */
typedef struct ir_sample_pen {
    int32_t id;
    int32_t count;         /* its occurrences in the output (0: in the prompt only) */
    float raw;
} ir_sample_pen;

#define IR_SAMPLE_ROW_WORDS 16
#define IR_SAMPLE_PEN_WORDS 3
_Static_assert(sizeof(ir_sample_row) == 4 * IR_SAMPLE_ROW_WORDS, "ir_sample_row: 16 words");
_Static_assert(sizeof(ir_sample_pen) == 4 * IR_SAMPLE_PEN_WORDS, "ir_sample_pen: 3 words");

/* The likeliest id's weight is 2^IR_SAMPLE_WEIGHT_BITS; a row's total
 * weight fits 64 bits for fewer than 2^(64 - that) ids. */
#define IR_SAMPLE_WEIGHT_BITS 40
#define IR_SAMPLE_VOCAB_MAX (1 << 23)
/* Below this scaled logit the weight is 0 (e^-28 * 2^40 < 1). */
#define IR_SAMPLE_X_MIN (-28.0f)
/* e^x = 2^k e^r: k = rint(x log2 e), r = (x - k ln2_hi) - k ln2_lo (ln2_hi
 * has 16 significant bits: k ln2_hi is exact), e^r by Taylor's polynomial
 * of degree 6 in Horner's form, then scaled by 2^(k + 40). */
#define IR_SAMPLE_LOG2E 0x1.715476p+0f
#define IR_SAMPLE_LN2_HI 0x1.62e4p-1f
#define IR_SAMPLE_LN2_LO 0x1.7f7d1cp-20f
#define IR_SAMPLE_EXP_DEGREE 6
#define IR_SAMPLE_EXP_C0 0x1p+0f
#define IR_SAMPLE_EXP_C1 0x1p+0f
#define IR_SAMPLE_EXP_C2 0x1p-1f
#define IR_SAMPLE_EXP_C3 0x1.555556p-3f
#define IR_SAMPLE_EXP_C4 0x1.555556p-5f
#define IR_SAMPLE_EXP_C5 0x1.111112p-7f
#define IR_SAMPLE_EXP_C6 0x1.6c16c2p-10f
/* The random word of (seed, counter): splitmix64's finalizer of
 * mix(seed + GOLDEN) + (counter + 1) * GOLDEN. */
#define IR_SAMPLE_GOLDEN 0x9e3779b97f4a7c15ull
#define IR_SAMPLE_MIX1 0xbf58476d1ce4e5b9ull
#define IR_SAMPLE_MIX2 0x94d049bb133111ebull

#endif
