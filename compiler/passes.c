/* passes.c — the default pass pipeline, in order, and the driver that runs
 * it with the verifier after every pass (STYLE.md item 6); the matching
 * helpers the passes share. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/passes.h"
#include "err.h"

static const pass_info PIPELINE[] = {
    /* DeepSeek's q_a_proj (or q_proj) and kv_a_proj_with_mqa read the same
     * input: one GEMM over concatenated weights; Qwen's q, k, v likewise. */
    {"fuse_qkv_a", pass_fuse_qkv_a, "one linear for the projections that read the attention input"},
    /* gate_proj and up_proj read the same input: one GEMM (dense MLPs, shared
     * experts) and one gate_up weight per routed expert. */
    {"fuse_gate_up", pass_fuse_gate_up, "one linear for gate_proj and up_proj"},
    /* silu(gate) * up on the gate_up output becomes one op (later a GEMM epilogue). */
    {"fuse_silu_and_mul", pass_fuse_silu_and_mul, "silu(gate) * up as one op"},
    /* The top-k weights scale each expert's down-projection inside the expert
     * op, which then sums over the k experts: no [T, K, H] intermediate. */
    {"fuse_router_weight", pass_fuse_router_weight, "router weights applied inside the expert op"},
    /* routed_scaling_factor applied once where it costs nothing; in fp16 the
     * shared expert output is divided instead, to avoid overflow (seed 001). */
    {"fold_routed_scale", pass_fold_routed_scale, "routed_scaling_factor applied once, for free"},
    /* The residual add and the RMSNorm that follows it: one kernel reads the
     * residual and the branch output once and writes both the new residual
     * and its normalized form, instead of writing the sum and reading it back. */
    {"fuse_add_rms_norm", pass_fuse_add_rms_norm, "residual add and the next RMSNorm as one op"},
    /* MLA decode attends over the compressed cache (kv_c, k_pe) with the k and
     * v up-projections absorbed into the query and the output. */
    {"absorb_mla", pass_absorb_mla, "MLA over the compressed KV cache"},
    /* One rank's part of a tensor- and expert-parallel group: heads, MLP
     * intermediates, experts and vocabulary split, collectives where the
     * ranks' parts meet (a no-op unless tp is set). */
    {"shard", pass_shard, "one rank's part of the model (tp/ep), collectives between ranks"},
    /* MLA's slices, RMSNorms, ropes and cache write between the q/kv
     * projection and the attention: one op, one kernel (two with q LoRA). */
    {"fuse_mla_prologue", pass_fuse_mla_prologue, "MLA's prologue as one op"},
    /* GQA's (Qwen's) slices of the fused qkv projection, q/k RMSNorms, ropes
     * and cache write before the attention: one op, one kernel. */
    {"fuse_attn_prologue", pass_fuse_attn_prologue, "GQA attention's prologue as one op"},
    /* DeepSeek-V3.2's indexer: its key's slice, LayerNorm, rope and cache
     * write as one op, and its q's rope and the slices of q and the head
     * weights read inside dsa_topk's score kernel (three kernels a layer,
     * from nine). */
    {"fuse_dsa_indexer", pass_fuse_dsa_indexer, "the DSA indexer's key path as one op, q's rope in dsa_topk"},
    /* The shared expert branch runs on stream 1 beside routing and the routed
     * experts on stream 0, and DeepSeek-V3.2's indexer beside the MLA's q
     * path, with explicit fork and join. (The shared expert as n_shared more
     * routed experts that every token takes, as SGLang's shared experts
     * fusion runs it, measured by its stand-in: V2-Lite's config with 66
     * routed experts, 8 a token and no shared one, the same bytes a step at
     * batch 1 and 64. fp8 1.577 / 4.032 / 5.788 / 7.210 ms at 1 / 8 / 32 /
     * 64 tokens against 1.452 / 3.729 / 5.741 / 6.953, bf16 1.990 / 5.984
     * / 9.506 / 10.537 against 1.836 / 5.405 / 9.333 / 10.123 (H200,
     * 2026-11-30): the second stream is worth more.) */
    {"assign_streams", pass_assign_streams, "shared experts, and V3.2's indexer, on a second stream"},
    /* The add of the routed and the shared experts' outputs goes into the
     * residual add_rms_norm after it (after assign_streams: it reads the join). */
    {"fuse_add3_rms_norm", pass_fuse_add3_rms_norm, "the expert sum in the residual add_rms_norm"},
    /* The routed experts' sum over k goes into that add_rms_norm too: it
     * reads the K weighted expert outputs of its row itself (one launch
     * less per MoE layer). */
    {"fuse_moe_sum", pass_fuse_moe_sum, "the routed experts' sum over k in the add_rms_norm"},
    /* The shared expert's silu_mul goes into its down projection, whose
     * few-token kernel computes it while loading its input. */
    {"fuse_silu_mul_linear", pass_fuse_silu_mul_linear, "silu_mul in the linear that reads it"},
    /* Liveness-based offsets for every activation in one arena per bucket. */
    {"plan_memory", pass_plan_memory, "activation offsets in one arena"},
};

#define N_PASSES ((int)(sizeof PIPELINE / sizeof *PIPELINE))

void pass_options_default(pass_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->compute_dtype = IR_DTYPE_BF16;
    opt->n_buckets = ir_buckets_default(opt->buckets);
}

const pass_info *pass_pipeline(int *n)
{
    *n = N_PASSES;
    return PIPELINE;
}

const pass_info *pass_find(const char *name)
{
    for (int i = 0; i < N_PASSES; i++)
        if (!strcmp(PIPELINE[i].name, name))
            return &PIPELINE[i];
    return NULL;
}

ir_op *pass_def_of(const ir_value *v, ir_op_kind kind)
{
    if (!v || v->kind != IR_VALUE_OP || !v->def || v->def->kind != kind)
        return NULL;
    return v->def;
}

int pass_is_act(const ir_value *v, int rank)
{
    return v && v->kind != IR_VALUE_WEIGHT && v->type.dtype == IR_DTYPE_F32 &&
           v->type.rank == rank && v->type.dims[0] == IR_DIM_T;
}

ir_value *pass_col_base(ir_value *v, int64_t *col)
{
    *col = 0;
    for (ir_op *s = pass_def_of(v, IR_OP_SLICE); s && pass_is_act(s->in[0], 2) && pass_is_act(v, 2) &&
                                            ir_op_attr_int(s, "axis", 0) == 1;
         s = pass_def_of(v, IR_OP_SLICE)) {
        *col += ir_op_attr_int(s, "start", 0);
        v = s->in[0];
    }
    return v;
}

const char *const PASS_ROPE_KEYS[PASS_N_ROPE_KEYS] = {
    "style", "theta", "scaling", "factor", "yarn_low", "yarn_high", "attn_factor"};

moec_status pass_copy_rope_attrs(ir_module *m, ir_op *op, const ir_op *from, int with_rotary,
                                 const char *who)
{
    for (int i = 0; i < PASS_N_ROPE_KEYS + with_rotary; i++) {
        const ir_attr *a = ir_op_attr(from, i < PASS_N_ROPE_KEYS ? PASS_ROPE_KEYS[i] : "rotary_dim");
        if (!a)
            continue;
        if (a->kind == IR_ATTR_STR)
            MOEC_TRY(ir_op_set_str(m, op, a->key, a->s));
        else if (a->kind == IR_ATTR_FLOAT)
            MOEC_TRY(ir_op_set_float(m, op, a->key, a->f));
        else if (a->kind == IR_ATTR_INT)
            MOEC_TRY(ir_op_set_int(m, op, a->key, a->i));
        else
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s: rope %%%s: attribute %s is an int list",
                            who, from->out[0]->name, a->key);
    }
    return MOEC_OK;
}

static int attr_same(const ir_attr *a, const ir_attr *b)
{
    if (!a || !b)
        return !a && !b;
    if (a->kind != b->kind)
        return 0;
    switch (a->kind) {
    case IR_ATTR_INT: return a->i == b->i;
    case IR_ATTR_FLOAT: return a->f == b->f;
    case IR_ATTR_STR: return a->s && b->s && !strcmp(a->s, b->s);
    case IR_ATTR_INTS: break;
    }
    return 0;
}

int pass_ropes_agree(const ir_op *a, const ir_op *b, int with_rotary)
{
    if (a->in[1] != b->in[1])
        return 0;
    for (int i = 0; i < PASS_N_ROPE_KEYS + with_rotary; i++) {
        const char *key = i < PASS_N_ROPE_KEYS ? PASS_ROPE_KEYS[i] : "rotary_dim";
        if (!attr_same(ir_op_attr(a, key), ir_op_attr(b, key)))
            return 0;
    }
    return 1;
}

moec_status pass_replace_values(ir_module *m, ir_op_kind kind, ir_value *const *in, int n_in,
                                ir_value *const *old, int n_out, const ir_op *anchor,
                                pass_attr_fn set_attrs, const void *user, const char *who)
{
    const char *tmp[IR_MAX_RESULTS];
    if (n_out < 1 || n_out > IR_MAX_RESULTS)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %d results", who, n_out);
    for (int i = 0; i < n_out; i++) {
        tmp[i] = ir_module_unique_name(m, old[i]->name);
        if (!tmp[i])
            return MOEC_ERR(MOEC_ERR_OOM, "%s %%%s: out of memory", who, old[i]->name);
    }
    if (!anchor)
        for (int i = 0; i < n_out; i++)
            if (!anchor || old[i]->def->id < anchor->id)
                anchor = old[i]->def;
    ir_op *op = ir_module_add_op(m, kind, in, n_in, tmp, n_out);
    if (!op)
        return moec_err_wrap(MOEC_ERR_INTERNAL, "%s %%%s", who, old[0]->name);
    MOEC_TRY(set_attrs(m, op, user));
    moec_status st = ir_op_finish(m, op, NULL);
    if (st != MOEC_OK)
        return moec_err_wrap(st, "%s %%%s", who, old[0]->name);
    MOEC_TRY(ir_module_move_op_before(m, op, anchor));
    for (int i = 0; i < n_out; i++) {
        if (!ir_type_equal(&op->out[i]->type, &old[i]->type))
            return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: %%%s: fused type differs", who,
                            old[i]->name);
        ir_module_replace_uses(m, old[i], op->out[i]);
    }
    MOEC_TRY(ir_module_dce(m));
    /* the replaced values are gone: their names (arena strings) go over */
    for (int i = 0; i < n_out; i++)
        ir_value_rename(m, op->out[i], old[i]->name);
    return MOEC_OK;
}

/* Writes the module a pass failed on; returns 0 when written. */
static int write_reproducer(const char *text, const char *dir, const char *pass, char *path,
                            size_t cap)
{
    snprintf(path, cap, "%s/moec-repro-%s.mir", dir, pass);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int ok = fprintf(f, "# moec reproducer: the IR given to pass %s, which failed\n%s", pass,
                     text) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

moec_status pass_run_pipeline(ir_module *m, const pass_options *opt, const char *stop_after,
                              pass_observer observe, void *user, const char *reproducer_dir)
{
    return pass_run_passes(m, PIPELINE, N_PASSES, opt, stop_after, observe, user, reproducer_dir);
}

moec_status pass_run_passes(ir_module *m, const pass_info *passes, int n, const pass_options *opt,
                            const char *stop_after, pass_observer observe, void *user,
                            const char *reproducer_dir)
{
    int known = !stop_after;
    for (int i = 0; i < n && !known; i++)
        known = !strcmp(passes[i].name, stop_after);
    if (!known) {
        char names[512] = "";
        for (int i = 0; i < n; i++) {
            strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
            strncat(names, passes[i].name, sizeof names - strlen(names) - 1);
        }
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "unknown pass '%s' (passes: %s)", stop_after, names);
    }
    pass_options defaults;
    if (!opt) {
        pass_options_default(&defaults);
        opt = &defaults;
    }
    MOEC_TRY(ir_module_set_meta_str(m, "compute_dtype", ir_dtype_name(opt->compute_dtype)));
    for (int i = 0; i < n; i++) {
        const pass_info *p = &passes[i];
        char *before = reproducer_dir ? ir_module_print_str(m) : NULL;
        moec_status st = p->run(m, opt);
        if (st == MOEC_OK)
            st = ir_module_verify(m);
        if (st != MOEC_OK) {
            char path[4096];
            if (before && write_reproducer(before, reproducer_dir, p->name, path, sizeof path) == 0)
                moec_err_wrap(st, "pass %s failed (its input IR is in %s)", p->name, path);
            else
                moec_err_wrap(st, "pass %s failed", p->name);
            free(before);
            return st;
        }
        free(before);
        if (observe)
            MOEC_TRY(observe(m, p, i, user));
        if (stop_after && !strcmp(stop_after, p->name))
            break;
    }
    return MOEC_OK;
}
