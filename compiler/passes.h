/* passes.h — the pass pipeline: a flat, named list of IR -> IR rewrites, each
 * keeping the model's function (tested by interpreting before and after),
 * with the verifier run after every pass. */
#ifndef MOEC_PASS_PASSES_H
#define MOEC_PASS_PASSES_H

#include "ir/ir.h"
#include "ir/ir_plan.h"

typedef struct pass_options {
    ir_dtype compute_dtype;  /* bf16 (default), f16 or f32: what the GPU computes in */
    int n_buckets;           /* the compiled batch buckets (absorb_mla weighs them) */
    int buckets[IR_BUCKETS_MAX];
    /* shard: rank `rank` of tp ranks, the routed experts in ep groups of
     * them (ep 0: 1); tp 0 leaves the module whole (no collectives), tp 1
     * shards it for one rank (collectives of one). source: the frontend's
     * module, where the checkpoint tensors' shapes are (to slice a fused
     * weight's parts). */
    int tp, ep, rank;
    const ir_module *source;
    /* shard: how the MoE block's partial sums meet (moec_parallel.ep_combine):
     * 0 one all_reduce; 1 a reduce_scatter over the hidden axis (each rank
     * sums its share) then an all_gather, the same sum */
    int ep_combine;
} pass_options;

/* The defaults: bf16, buckets 1, 2, 4, 8, 16, 32, 64. */
void pass_options_default(pass_options *opt);

typedef moec_status (*pass_fn)(ir_module *m, const pass_options *opt);

typedef struct pass_info {
    const char *name;  /* "fuse_qkv_a" */
    pass_fn run;
    const char *what;  /* one line: what it does and why */
} pass_info;

/* The default pipeline, in order. */
const pass_info *pass_pipeline(int *n);
const pass_info *pass_find(const char *name);

/* Called after each pass with the module as it stands (for dumps). */
typedef moec_status (*pass_observer)(const ir_module *m, const pass_info *pass, int index,
                                     void *user);

/* Runs the pipeline up to and including `stop_after` (NULL: all), verifying
 * after each pass. A failing pass (or verifier) returns its error prefixed
 * with the pass name and, when reproducer_dir is not NULL, leaves the IR it
 * was given in <reproducer_dir>/moec-repro-<pass>.mir and names that file. */
moec_status pass_run_pipeline(ir_module *m, const pass_options *opt, const char *stop_after,
                              pass_observer observe, void *user, const char *reproducer_dir);

/* The same over any list of passes (tests run their own lists). */
moec_status pass_run_passes(ir_module *m, const pass_info *passes, int n, const pass_options *opt,
                            const char *stop_after, pass_observer observe, void *user,
                            const char *reproducer_dir);

/* tp, ep and rank as pass_shard takes them: tp 1 to IR_MAX_RANKS, ep
 * dividing it, rank below it; MOEC_ERR_INVALID_ARG naming the one that is
 * not. */
moec_status pass_shard_check(int tp, int ep, int rank);

/* Matching helpers the passes share. */
/* The op of kind `kind` that defines v, or NULL (v no op result, or another kind's). */
ir_op *pass_def_of(const ir_value *v, ir_op_kind kind);
/* v is an f32 activation (not a weight) [T, ...] of rank `rank`. */
int pass_is_act(const ir_value *v, int rank);
/* The [T, N] value whose columns v is, through slices along dim 1 of
 * [T, N] values, and *col, the column v starts at there (v itself and 0
 * when it is no such slice). */
ir_value *pass_col_base(ir_value *v, int64_t *col);
/* rope's attributes but rotary_dim, as a list (style, theta, scaling,
 * factor, yarn_low, yarn_high, attn_factor). */
extern const char *const PASS_ROPE_KEYS[];
#define PASS_N_ROPE_KEYS 7
/* Copies those of from's rope attributes that are set (and rotary_dim when
 * with_rotary) onto op; `who` names the pass in errors. */
moec_status pass_copy_rope_attrs(ir_module *m, ir_op *op, const ir_op *from, int with_rotary,
                                 const char *who);
/* Whether ropes a and b rotate alike: the same positions and the same rope
 * attributes (rotary_dim too when with_rotary), each set on both or on
 * neither. */
int pass_ropes_agree(const ir_op *a, const ir_op *b, int with_rotary);
/* Sets the attributes of an op being built by pass_replace_values. */
typedef moec_status (*pass_attr_fn)(ir_module *m, ir_op *op, const void *user);
/* Adds an op of `kind` over in[0 .. n_in) whose n_out results replace the
 * values old[] (their types, users and names go over), placed before
 * `anchor` (NULL: before the first op defining one of them); set_attrs sets
 * its attributes before it is checked. What only the old values read is
 * dropped (ir_module_dce). `who` names the pass in errors. */
moec_status pass_replace_values(ir_module *m, ir_op_kind kind, ir_value *const *in, int n_in,
                                ir_value *const *old, int n_out, const ir_op *anchor,
                                pass_attr_fn set_attrs, const void *user, const char *who);

/* The passes (compiler/pass_*.c). */
moec_status pass_fuse_qkv_a(ir_module *m, const pass_options *opt);
moec_status pass_fuse_gate_up(ir_module *m, const pass_options *opt);
moec_status pass_fuse_silu_and_mul(ir_module *m, const pass_options *opt);
moec_status pass_fuse_router_weight(ir_module *m, const pass_options *opt);
moec_status pass_fold_routed_scale(ir_module *m, const pass_options *opt);
moec_status pass_fuse_add_rms_norm(ir_module *m, const pass_options *opt);
moec_status pass_absorb_mla(ir_module *m, const pass_options *opt);
moec_status pass_shard(ir_module *m, const pass_options *opt);
moec_status pass_fuse_mla_prologue(ir_module *m, const pass_options *opt);
moec_status pass_fuse_attn_prologue(ir_module *m, const pass_options *opt);
moec_status pass_fuse_dsa_indexer(ir_module *m, const pass_options *opt);
moec_status pass_assign_streams(ir_module *m, const pass_options *opt);
moec_status pass_fuse_add3_rms_norm(ir_module *m, const pass_options *opt);
moec_status pass_fuse_moe_sum(ir_module *m, const pass_options *opt);
moec_status pass_fuse_silu_mul_linear(ir_module *m, const pass_options *opt);
moec_status pass_plan_memory(ir_module *m, const pass_options *opt);

#endif
