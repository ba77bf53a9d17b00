/* testlib.h — the few helpers every test program shares: checks that print
 * where they failed, paths to the source tree, a deterministic RNG. Tests
 * may die on failure; the library never does. */
#ifndef MOEC_TESTLIB_H
#define MOEC_TESTLIB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "moec.h"

extern int t_failures;
extern int t_checks;

#define T_CHECK(cond)                                                            \
    do {                                                                         \
        t_checks++;                                                              \
        if (!(cond)) {                                                           \
            t_failures++;                                                        \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                        \
    } while (0)

/* Checks that expr returns MOEC_OK; prints moec_last_error() if not. */
#define T_OK(expr)                                                               \
    do {                                                                         \
        t_checks++;                                                              \
        moec_status t_st_ = (expr);                                              \
        if (t_st_ != MOEC_OK) {                                                  \
            t_failures++;                                                        \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,   \
                    moec_status_name(t_st_), moec_last_error());                 \
        }                                                                        \
    } while (0)

/* Checks that expr fails with status st and that the error contains needle. */
#define T_ERR(expr, st, needle) t_expect_err((expr), (st), (needle), #expr, __FILE__, __LINE__)
void t_expect_err(moec_status got, moec_status want, const char *needle, const char *expr,
                  const char *file, int line);

/* Prints "N passed, N failed" and returns the exit code. */
int t_finish(const char *name);

/* $MOEC_SOURCE_DIR/rel (or ./rel), in a static buffer rotated 8 ways. */
const char *t_src(const char *rel);
/* tests/data/NAME, opened (a failure counted and printed: NULL); *dir gets
 * its path (a t_src buffer). */
moec_model_t *t_open_tiny(const char *name, const char **dir);
/* A fresh empty directory under $TMPDIR (static buffer rotated 8 ways),
 * removed with its contents when the test exits (MOEC_KEEP_TMP=1 keeps it). */
const char *t_tmpdir(const char *tag);
/* Reads a whole file (NUL-terminated); dies if it cannot. */
char *t_read_file(const char *path, size_t *len);
void t_write_file(const char *path, const void *data, size_t len);

/* Writes dst (made if missing): src's config.json, and its model.safetensors
 * with NaN (each byte 0xff: a NaN in F32, F16 and BF16 alike) in place of
 * every weight (tensor NULL), or of row `row` of tensor `tensor` only (an
 * embedding row: one token id's logits go NaN). Dies if it cannot. For the
 * tests of non-finite logits; tests/nan_model.c offers it to shell tests. */
void t_write_nan_model(const char *src, const char *dst, const char *tensor, int row);

/* Non-finite logits on `backend` (CPU or CUDA), on deepseek_v3 (untied
 * embeddings) with every weight NaN, and with only token 59's embedding row
 * NaN (so only the rows of sequences that hold a 59 go NaN): a session
 * fails with MOEC_ERR_NUMERIC naming the step and position, its tokens
 * appended all the same; an engine step fails naming the first bad token,
 * its slot and position, with next_out -1 for exactly the bad tokens, the
 * other slots' ids and rows intact and their sequences going on; the
 * scheduler ends exactly the requests that feed a 59 (greedy or sampled),
 * at its position, and one whose penalties overflow, the others running to
 * their length (on the CPU: the clean model's tokens). */
void t_check_nonfinite(moec_backend backend);

/* Up to cap ints of a JSON array into out; returns how many it holds. */
struct cJSON;
int t_json_ints(const struct cJSON *arr, int32_t *out, int cap);

/* A tiny model's golden (scripts/make_goldens.py, tests/data/NAME): from
 * golden.json the prompt and greedy ids (and both in one array, ids: the
 * sequence a teacher-forced run feeds), rows and vocab_size, and
 * transformers' own bf16 errors (transformers_bf16's worst_row_error and
 * mean_row_error: -1 where absent); logits.bin ([rows, vocab] f32, owned,
 * t_golden_free). Checked (a failure counted and printed: returns 0): the
 * files parse, at most T_GOLDEN_IDS ids each, rows == P + G - 1, and
 * logits.bin holds rows * vocab floats. */
#define T_GOLDEN_IDS 64
typedef struct t_golden {
    int32_t prompt[T_GOLDEN_IDS], greedy[T_GOLDEN_IDS], ids[2 * T_GOLDEN_IDS];
    int P, G, n_ids, rows, vocab;
    double tf_bf16_worst, tf_bf16_mean;
    float *logits;
} t_golden;
int t_golden_read(const char *dir, t_golden *g);
void t_golden_free(t_golden *g);

/* Logits rows: the index of the largest (the lowest on ties); the largest
 * |got - ref| over max |ref| (1 when ref is all zeros); 1 when all n values
 * are finite. */
int t_argmax(const float *row, int n);
double t_row_error(const float *got, const float *ref, int n);
/* t_row_error averaged over `rows` rows of n. */
double t_mean_row_error(const float *got, const float *ref, int rows, int n);
int t_all_finite(const float *x, size_t n);

/* splitmix64-based deterministic RNG. */
uint64_t t_rand_u64(uint64_t *state);
float t_rand_normal(uint64_t *state);

#endif
