/* interp.h — the CPU reference interpreter: executes any IR module in fp32,
 * one plain function per op, with a KV cache per attention op. It is the
 * definition of every op, the oracle of every test, and the backend used
 * where there is no GPU. */
#ifndef MOEC_RT_INTERP_H
#define MOEC_RT_INTERP_H

#include "ir/ir.h"
#include "ir/ir_plan.h"
#include "runtime/weights.h"

typedef struct rt_interp rt_interp;

/* Prepares to run m for sequences of up to max_seq tokens. Weights are read
 * (widened to fp32) from w; with w NULL they start at zero and the caller
 * sets each with rt_interp_set_weight (pass tests use random weights). */
moec_status rt_interp_init(const ir_module *m, const rt_weights *w, int max_seq,
                           rt_interp **out);
/* Another interpreter of owner's module, with its own KV caches and
 * activations for sequences of up to max_seq tokens, that reads owner's
 * weights in place (not copied: owner must outlive it, and a weight set
 * through either is seen by both). For many sequences of one model. */
moec_status rt_interp_init_shared(const rt_interp *owner, int max_seq, rt_interp **out);
void rt_interp_free(rt_interp *in);

/* Copies ir_type_numel(&v->type, 0) floats into weight v. */
moec_status rt_interp_set_weight(rt_interp *in, const ir_value *v, const float *data);
/* The interpreter's fp32 copy of weight v (to read or perturb). */
float *rt_interp_weight(rt_interp *in, const ir_value *v);

/* Runs the module on T tokens (inputs "tokens" and "positions", i32[T]),
 * appending to the KV caches. Writes output 0 ([T, ...] f32, all T rows)
 * into out when not NULL. MOEC_ERR_CAPACITY if a position is >= max_seq. */
moec_status rt_interp_forward(rt_interp *in, const int32_t *tokens, const int32_t *positions,
                              int T, float *out);
/* The greedy id of one row of n logits: the largest, the lowest id on ties;
 * IR_SAMPLED_NONFINITE when the row holds a NaN or an infinity, as the GPU's
 * argmax step gives. */
int32_t rt_logits_argmax(const float *row, int n);
/* Planned-arena mode (enable 1), to test memory plans for real: every
 * activation (input and op result) lives in ONE buffer of meta
 * "arena_bytes_per_token" * T bytes, at byte mem_offset * T, 4 bytes an
 * element, so values whose planned ranges overlap while both are live
 * corrupt each other. An op's results must not overlap its operands (but a
 * reshape, fork or join may sit exactly on its operand). rt_interp_value
 * then shows what the arena holds at the value's place after the forward.
 * MOEC_ERR_INVALID_ARG naming the first activation without an offset (or
 * one misaligned or past the arena; checked again at each forward).
 * enable 0: separate buffers (the default). */
moec_status rt_interp_use_plan(rt_interp *in, int enable);
/* Looks up any value of the last forward (fp32, [T, ...]); NULL if unknown.
 * For debugging and pass tests. */
const float *rt_interp_value(const rt_interp *in, const ir_value *v);
/* Empties the KV caches. */
void rt_interp_reset(rt_interp *in);

#endif
