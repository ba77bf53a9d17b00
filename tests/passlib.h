/* passlib.h — checks that a pass keeps a model's function: the interpreter
 * runs the module before and after the pass, with the tiny model's real
 * weights, on random tokens (a prefill, then decode steps), and every output
 * row must agree to 1e-5 of the row's largest magnitude. */
#ifndef MOEC_TEST_PASSLIB_H
#define MOEC_TEST_PASSLIB_H

#include "compiler/passes.h"
#include "ir/ir.h"

/* Loads tests/data/<model>, runs the pipeline up to (not including) `pass`,
 * then checks `pass` as above with options opt (NULL: defaults). Returns the
 * worst relative error seen, or a negative number when something failed
 * (the failure is counted and printed). */
double t_pass_equivalence(const char *model, const char *pass, const pass_options *opt);

/* Runs two modules (same checkpoint tests/data/<model>) on the same random
 * tokens; returns the worst relative row error, negative on failure. */
double t_modules_agree(const char *model, const ir_module *a, const ir_module *b, uint64_t seed);

/* The same with every result rounded as the GPU stores it in `round`
 * (rt_interp_round_storage; F32: none). */
double t_modules_agree_stored(const char *model, const ir_module *a, const ir_module *b,
                              uint64_t seed, ir_dtype round);

/* Builds tests/data/<model> and runs the pipeline up to and including
 * stop_after (NULL: every pass). */
ir_module *t_pipeline_module(const char *model, const char *stop_after, const pass_options *opt);

/* Builds tests/data/<model> twice, through the pipeline up to and
 * including `before` and `after`, into *b and *a; returns 0 (both freed,
 * NULL) when either failed. */
int t_pipeline_pair(const char *model, const char *before, const char *after,
                    const pass_options *opt, ir_module **b, ir_module **a);

/* The ops of kind `kind` in m. */
int t_count_ops(const ir_module *m, ir_op_kind kind);

/* Running pass `run` again on m (default options) changes nothing: it
 * left nothing of its pattern. */
void t_pass_idempotent(ir_module *m, pass_fn run);

/* The default pass options with compute dtype dt. */
pass_options t_pass_options(ir_dtype dt);

#endif
