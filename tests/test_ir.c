/* test_ir.c — the IR library: arena, types, a module that uses every op
 * built with the builder API, its text form against a golden file, the
 * print/parse round trip, every verifier rule (the memory plan's too:
 * live ranges, reshape/fork/join aliases, overlaps), parser errors with their
 * exact "file:line:col", shape-inference errors, block-scaled (fp8) weights
 * (text form, scale grid, what the verifier and the ops accept), and a
 * mutation loop that the parser must survive. Set MOEC_UPDATE_GOLDEN=1 to rewrite the golden. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "testlib.h"

#define T IR_DIM_T

static ir_type ty(ir_dtype dt, int rank, int64_t d0, int64_t d1, int64_t d2)
{
    ir_type t = {dt, rank, {d0, d1, d2, 0}};
    return t;
}

static void *must(void *p, const char *what)
{
    if (!p) {
        fprintf(stderr, "building %s failed: %s\n", what, moec_last_error());
        exit(2);
    }
    return p;
}

static void must_ok(moec_status st, const char *what)
{
    if (st != MOEC_OK) {
        fprintf(stderr, "%s failed: %s\n", what, moec_last_error());
        exit(2);
    }
}

/* Adds op kind with results names[0..n_out-1], sets no attributes. */
static ir_op *op_new(ir_module *m, ir_op_kind kind, const char *const *names, int n_out,
                     ir_value *const *in, int n_in)
{
    return must(ir_module_add_op(m, kind, in, n_in, names, n_out), names[0]);
}

static ir_value *op1(ir_module *m, ir_op_kind kind, const char *name, ir_value *a, ir_value *b)
{
    ir_value *in[2] = {a, b};
    return must(ir_build(m, kind, name, in, b ? 2 : 1), name);
}

static ir_value *shaped(ir_module *m, ir_op_kind kind, const char *name, ir_value *x, ir_type t)
{
    const char *names[1] = {name};
    ir_op *op = op_new(m, kind, names, 1, &x, 1);
    must_ok(ir_op_finish(m, op, &t), name);
    return op->out[0];
}

static ir_value *slice(ir_module *m, const char *name, ir_value *x, int axis, int start, int size)
{
    const char *names[1] = {name};
    ir_op *op = op_new(m, IR_OP_SLICE, names, 1, &x, 1);
    must_ok(ir_op_set_int(m, op, "axis", axis), "axis");
    must_ok(ir_op_set_int(m, op, "start", start), "start");
    must_ok(ir_op_set_int(m, op, "size", size), "size");
    must_ok(ir_op_finish(m, op, NULL), name);
    return op->out[0];
}

static ir_value *axis_op(ir_module *m, ir_op_kind kind, const char *name, ir_value *const *in,
                         int n_in, int axis)
{
    const char *names[1] = {name};
    ir_op *op = op_new(m, kind, names, 1, in, n_in);
    must_ok(ir_op_set_int(m, op, "axis", axis), "axis");
    must_ok(ir_op_finish(m, op, NULL), name);
    return op->out[0];
}

static ir_value *rms_norm(ir_module *m, const char *name, ir_value *x, ir_value *w)
{
    ir_value *in[2] = {x, w};
    const char *names[1] = {name};
    ir_op *op = op_new(m, IR_OP_RMS_NORM, names, 1, in, 2);
    must_ok(ir_op_set_float(m, op, "eps", 1e-6), "eps");
    must_ok(ir_op_finish(m, op, NULL), name);
    return op->out[0];
}

/* An int-list meta; ir.h has no setter for one, so append it by hand. */
static void set_meta_ints(ir_module *m, const char *key, const int64_t *v, int n)
{
    ir_attr *meta = must(ir_arena_alloc(m->arena, sizeof *meta * (size_t)(m->n_meta + 1)), key);
    if (m->n_meta)
        memcpy(meta, m->meta, sizeof *meta * (size_t)m->n_meta);
    ir_attr *a = &meta[m->n_meta];
    a->key = must(ir_arena_strdup(m->arena, key), key);
    a->kind = IR_ATTR_INTS;
    a->n = n;
    a->ints = must(ir_arena_alloc(m->arena, sizeof *a->ints * (size_t)(n ? n : 1)), key);
    memcpy(a->ints, v, sizeof *v * (size_t)n);
    m->meta = meta;
    m->meta_cap = ++m->n_meta;
}

/* A one-layer toy model that uses every op kind, both moe_topk forms, both
 * moe_experts and moe_routed forms, every binding kind and every attribute
 * kind, a side-stream op and planned arena offsets. */
static ir_module *build_all(void)
{
    ir_module *m = must(ir_module_init("all_ops"), "module");
    must_ok(ir_module_set_meta_int(m, "vocab_size", 32), "meta");
    must_ok(ir_module_set_meta_float(m, "rms_norm_eps", 1e-6), "meta");
    must_ok(ir_module_set_meta_float(m, "tenth", 0.1), "meta");
    must_ok(ir_module_set_meta_float(m, "two", 2.0), "meta");
    must_ok(ir_module_set_meta_float(m, "huge", 1e30), "meta");
    must_ok(ir_module_set_meta_float(m, "neg_zero", -0.0), "meta");
    must_ok(ir_module_set_meta_float(m, "third", 1.0 / 3.0), "meta");
    must_ok(ir_module_set_meta_int(m, "min_int", INT64_MIN), "meta");
    must_ok(ir_module_set_meta_str(m, "note", "a \"tiny\" model \\ every op"), "meta");
    const int64_t layers[2] = {0, 3};
    set_meta_ints(m, "mlp_only_layers", layers, 2);
    set_meta_ints(m, "empty_list", layers, 0);

    ir_value *tokens = must(ir_module_add_input(m, "tokens", ty(IR_DTYPE_I32, 1, T, 0, 0)), "t");
    ir_value *pos = must(ir_module_add_input(m, "positions", ty(IR_DTYPE_I32, 1, T, 0, 0)), "p");

    ir_value *embed_w = must(ir_module_add_weight(m, "embed_tokens", ty(IR_DTYPE_BF16, 2, 32, 16, 0),
                                                  "model.embed_tokens.weight"), "w");
    ir_value *norm0 = must(ir_module_add_weight(m, "l0.input_norm", ty(IR_DTYPE_F32, 1, 16, 0, 0),
                                                "model.layers.0.input_layernorm.weight"), "w");
    ir_binding qkv_parts[3] = {
        {.kind = IR_BIND_TENSOR, .name = "model.layers.0.self_attn.q_proj.weight"},
        {.kind = IR_BIND_TENSOR, .name = "model.layers.0.self_attn.k_proj.weight"},
        {.kind = IR_BIND_TENSOR, .name = "model.layers.0.self_attn.v_proj.weight"},
    };
    ir_binding qkv_bind = {.kind = IR_BIND_CONCAT, .axis = 0, .n_parts = 3, .parts = qkv_parts};
    ir_value *qkv_w = must(ir_module_add_weight_bound(m, "l0.attn.qkv", ty(IR_DTYPE_BF16, 2, 32, 16, 0),
                                                      &qkv_bind), "w");
    ir_value *qkv_b = must(ir_module_add_weight(m, "l0.attn.qkv_bias", ty(IR_DTYPE_F32, 1, 32, 0, 0),
                                                "model.layers.0.self_attn.qkv.bias"), "w");
    ir_value *o_w = must(ir_module_add_weight(m, "l0.attn.o", ty(IR_DTYPE_BF16, 2, 16, 16, 0),
                                              "model.layers.0.self_attn.o_proj.weight"), "w");
    ir_value *router = must(ir_module_add_weight(m, "l0.moe.router", ty(IR_DTYPE_F32, 2, 4, 16, 0),
                                                 "model.layers.0.mlp.gate.weight"), "w");
    ir_value *bias = must(ir_module_add_weight(m, "l0.moe.bias", ty(IR_DTYPE_F32, 1, 4, 0, 0),
                                               "model.layers.0.mlp.gate.e_score_correction_bias"), "w");
    ir_value *gate = must(ir_module_add_weight_stack(m, "l0.moe.experts.gate", ty(IR_DTYPE_BF16, 3, 4, 8, 16),
                                                     "model.layers.0.mlp.experts.{e}.gate_proj.weight", 4), "w");
    ir_value *up = must(ir_module_add_weight_stack(m, "l0.moe.experts.up", ty(IR_DTYPE_BF16, 3, 4, 8, 16),
                                                   "model.layers.0.mlp.experts.{e}.up_proj.weight", 4), "w");
    ir_value *down = must(ir_module_add_weight_stack(m, "l0.moe.experts.down", ty(IR_DTYPE_F16, 3, 4, 16, 8),
                                                     "model.layers.0.mlp.experts.{e}.down_proj.weight", 4), "w");
    ir_binding gu_parts[2] = {
        {.kind = IR_BIND_STACK, .name = "model.layers.0.mlp.experts.{e}.gate_proj.weight", .count = 4},
        {.kind = IR_BIND_STACK, .name = "model.layers.0.mlp.experts.{e}.up_proj.weight", .count = 4},
    };
    ir_binding gu_bind = {.kind = IR_BIND_CONCAT, .axis = 1, .n_parts = 2, .parts = gu_parts};
    ir_value *gate_up = must(ir_module_add_weight_bound(m, "l0.moe.experts.gate_up",
                                                        ty(IR_DTYPE_BF16, 3, 4, 16, 16), &gu_bind), "w");
    ir_value *norm_f = must(ir_module_add_weight(m, "norm", ty(IR_DTYPE_F32, 1, 16, 0, 0),
                                                 "model.norm.weight"), "w");
    ir_value *lm_head = must(ir_module_add_weight(m, "lm_head", ty(IR_DTYPE_BF16, 2, 32, 16, 0),
                                                  "lm_head.weight"), "w");
    ir_value *kv_b = must(ir_module_add_weight(m, "l0.mla.kv_b", ty(IR_DTYPE_BF16, 2, 24, 6, 0),
                                               "model.layers.0.self_attn.kv_b_proj.weight"), "w");
    ir_value *mla_o = must(ir_module_add_weight(m, "l0.mla.o", ty(IR_DTYPE_BF16, 2, 16, 8, 0),
                                                "model.layers.0.self_attn.mla_o_proj.weight"), "w");
    tokens->mem_offset = 0;

    ir_value *x = op1(m, IR_OP_EMBEDDING, "embed", tokens, embed_w);
    ir_value *h = rms_norm(m, "l0.h", x, norm0);
    ir_value *lin_in[3] = {h, qkv_w, qkv_b};
    ir_value *qkv = must(ir_build(m, IR_OP_LINEAR, "l0.attn.qkv_out", lin_in, 3), "qkv");
    ir_value *q_flat = slice(m, "l0.attn.q_flat", qkv, 1, 0, 16);
    ir_value *k_flat = slice(m, "l0.attn.k_flat", qkv, 1, 16, 8);
    ir_value *v_flat = slice(m, "l0.attn.v_flat", qkv, 1, 24, 8);
    ir_value *q = shaped(m, IR_OP_RESHAPE, "l0.attn.q", q_flat, ty(IR_DTYPE_F32, 3, T, 2, 8));
    ir_value *k = shaped(m, IR_OP_RESHAPE, "l0.attn.k", k_flat, ty(IR_DTYPE_F32, 3, T, 1, 8));
    ir_value *v = shaped(m, IR_OP_RESHAPE, "l0.attn.v", v_flat, ty(IR_DTYPE_F32, 3, T, 1, 8));

    const char *qr_name[1] = {"l0.attn.q_rot"};
    ir_value *rope_in[2] = {q, pos};
    ir_op *rq = op_new(m, IR_OP_ROPE, qr_name, 1, rope_in, 2);
    must_ok(ir_op_set_str(m, rq, "style", "neox"), "style");
    must_ok(ir_op_set_float(m, rq, "theta", 1e6), "theta");
    must_ok(ir_op_set_str(m, rq, "scaling", "linear"), "scaling");
    must_ok(ir_op_set_float(m, rq, "factor", 2.0), "factor");
    must_ok(ir_op_finish(m, rq, NULL), "q_rot");

    const char *kr_name[1] = {"l0.attn.k_rot"};
    rope_in[0] = k;
    ir_op *rk = op_new(m, IR_OP_ROPE, kr_name, 1, rope_in, 2);
    must_ok(ir_op_set_str(m, rk, "style", "interleave"), "style");
    must_ok(ir_op_set_float(m, rk, "theta", 10000.0), "theta");
    must_ok(ir_op_set_str(m, rk, "scaling", "yarn"), "scaling");
    must_ok(ir_op_set_float(m, rk, "factor", 40.0), "factor");
    must_ok(ir_op_set_float(m, rk, "yarn_low", 1.0), "low");
    must_ok(ir_op_set_float(m, rk, "yarn_high", 3.0), "high");
    must_ok(ir_op_set_float(m, rk, "attn_factor", 1.2), "attn_factor");
    must_ok(ir_op_finish(m, rk, NULL), "k_rot");

    const char *at_name[1] = {"l0.attn.out"};
    ir_value *at_in[4] = {rq->out[0], rk->out[0], v, pos};
    ir_op *at = op_new(m, IR_OP_ATTENTION, at_name, 1, at_in, 4);
    must_ok(ir_op_set_float(m, at, "scale", 1.0 / sqrt(8.0)), "scale");
    must_ok(ir_op_set_int(m, at, "window", 0), "window");
    must_ok(ir_op_finish(m, at, NULL), "attention");
    ir_value *at_flat = shaped(m, IR_OP_RESHAPE, "l0.attn.out_flat", at->out[0],
                               ty(IR_DTYPE_F32, 2, T, 16, 0));
    ir_value *o = op1(m, IR_OP_LINEAR, "l0.attn.o_out", at_flat, o_w);
    ir_value *resid = op1(m, IR_OP_ADD, "l0.resid", x, o);
    ir_value *logits = op1(m, IR_OP_LINEAR, "l0.moe.logits", resid, router);

    const char *tk_names[2] = {"l0.moe.ids", "l0.moe.w"};
    ir_value *tk_in[2] = {logits, bias};
    ir_op *tk = op_new(m, IR_OP_MOE_TOPK, tk_names, 2, tk_in, 2);
    must_ok(ir_op_set_str(m, tk, "scoring", "sigmoid"), "scoring");
    must_ok(ir_op_set_int(m, tk, "top_k", 2), "top_k");
    must_ok(ir_op_set_int(m, tk, "n_group", 2), "n_group");
    must_ok(ir_op_set_int(m, tk, "topk_group", 1), "topk_group");
    must_ok(ir_op_set_str(m, tk, "group_score", "top2_sum"), "group_score");
    must_ok(ir_op_set_int(m, tk, "norm_topk_prob", 1), "norm");
    must_ok(ir_op_set_float(m, tk, "scaling", 2.5), "scaling");
    must_ok(ir_op_finish(m, tk, NULL), "topk");

    const char *tk2_names[2] = {"l0.moe.ids_sm", "l0.moe.w_sm"};
    ir_op *tk2 = op_new(m, IR_OP_MOE_TOPK, tk2_names, 2, &logits, 1);
    must_ok(ir_op_set_str(m, tk2, "scoring", "softmax"), "scoring");
    must_ok(ir_op_set_int(m, tk2, "top_k", 2), "top_k");
    must_ok(ir_op_finish(m, tk2, NULL), "topk2");

    ir_value *ex5_in[5] = {resid, tk->out[0], gate, up, down};
    ir_value *ex5 = must(ir_build(m, IR_OP_MOE_EXPERTS, "l0.moe.out5", ex5_in, 5), "ex5");
    const char *ex4_name[1] = {"l0.moe.out4"};
    ir_value *ex4_in[4] = {resid, tk2->out[0], gate_up, down};
    ir_op *ex4 = op_new(m, IR_OP_MOE_EXPERTS, ex4_name, 1, ex4_in, 4);
    must_ok(ir_op_set_str(m, ex4, "act", "silu"), "act");
    must_ok(ir_op_finish(m, ex4, NULL), "ex4");

    ir_value *w3 = shaped(m, IR_OP_RESHAPE, "l0.moe.w3", tk->out[1], ty(IR_DTYPE_F32, 3, T, 2, 1));
    ir_value *w_full = shaped(m, IR_OP_EXPAND, "l0.moe.w_full", w3, ty(IR_DTYPE_F32, 3, T, 2, 16));
    ir_value *weighted5 = op1(m, IR_OP_MUL, "l0.moe.weighted5", ex5, w_full);
    ir_value *w3_sm = shaped(m, IR_OP_RESHAPE, "l0.moe.w3_sm", tk2->out[1], ty(IR_DTYPE_F32, 3, T, 2, 1));
    ir_value *weighted4 = op1(m, IR_OP_MUL, "l0.moe.weighted4", ex4->out[0], w3_sm);
    ir_value *sum5 = axis_op(m, IR_OP_REDUCE_SUM, "l0.moe.sum5", &weighted5, 1, 1);
    ir_value *sum4 = axis_op(m, IR_OP_REDUCE_SUM, "l0.moe.sum4", &weighted4, 1, 1);
    ir_value *act = op1(m, IR_OP_SILU, "l0.moe.act", sum5, NULL);
    ir_value *gated = op1(m, IR_OP_SIGMOID, "l0.moe.gated", sum4, NULL);
    ir_value *cat_in[3] = {act, gated, act};
    ir_value *both = axis_op(m, IR_OP_CONCAT, "l0.moe.both", cat_in, 3, 1);
    ir_value *mixed = slice(m, "l0.moe.mixed", both, 1, 8, 16);

    /* fused and scheduled ops */
    ir_value *r5_in[5] = {resid, tk->out[0], tk->out[1], gate_up, down};
    const char *r5_name[1] = {"l0.moe.routed5"};
    ir_op *r5 = op_new(m, IR_OP_MOE_ROUTED, r5_name, 1, r5_in, 5);
    must_ok(ir_op_set_float(m, r5, "scale", 2.5), "scale");
    must_ok(ir_op_finish(m, r5, NULL), "routed5");
    ir_value *r6_in[6] = {resid, tk2->out[0], tk2->out[1], gate, up, down};
    ir_value *r6 = must(ir_build(m, IR_OP_MOE_ROUTED, "l0.moe.routed6", r6_in, 6), "routed6");
    r6->mem_offset = 256;
    ir_value *side = op1(m, IR_OP_FORK, "l0.moe.side", r5->out[0], NULL);
    side->def->stream = 1;
    ir_value *side_act = op1(m, IR_OP_SILU_MUL, "l0.moe.side_act", side, NULL);
    side_act->def->stream = 1;
    ir_value *joined = op1(m, IR_OP_JOIN, "l0.moe.joined", side_act, NULL);
    const char *mix_name[1] = {"l0.moe.mix"};
    ir_value *mix_in[2] = {r6, r5->out[0]};
    ir_op *mix = op_new(m, IR_OP_ADD, mix_name, 1, mix_in, 2);
    must_ok(ir_op_set_float(m, mix, "alpha", 0.5), "alpha");
    must_ok(ir_op_finish(m, mix, NULL), "mix");

    ir_value *qa_in[2] = {q, kv_b};
    const char *qa_name[1] = {"l0.mla.q_c"};
    ir_op *qa = op_new(m, IR_OP_MLA_QABSORB, qa_name, 1, qa_in, 2);
    must_ok(ir_op_set_int(m, qa, "qk_nope_head_dim", 8), "dn");
    must_ok(ir_op_set_int(m, qa, "v_head_dim", 4), "dv");
    must_ok(ir_op_finish(m, qa, NULL), "q_c");
    ir_value *kv_c = slice(m, "l0.mla.kv_c", qkv, 1, 0, 6);
    ir_value *ma_in[5] = {qa->out[0], rq->out[0], kv_c, rk->out[0], pos};
    const char *ma_name[1] = {"l0.mla.o_c"};
    ir_op *ma = op_new(m, IR_OP_MLA_ATTENTION, ma_name, 1, ma_in, 5);
    must_ok(ir_op_set_float(m, ma, "scale", 0.25), "scale");
    must_ok(ir_op_set_int(m, ma, "window", 2), "window");
    must_ok(ir_op_finish(m, ma, NULL), "o_c");
    ir_value *va_in[2] = {ma->out[0], kv_b};
    const char *va_name[1] = {"l0.mla.v"};
    ir_op *va = op_new(m, IR_OP_MLA_VABSORB, va_name, 1, va_in, 2);
    must_ok(ir_op_set_int(m, va, "qk_nope_head_dim", 8), "dn");
    must_ok(ir_op_set_int(m, va, "v_head_dim", 4), "dv");
    must_ok(ir_op_finish(m, va, NULL), "v");
    ir_value *v_flat2 = shaped(m, IR_OP_RESHAPE, "l0.mla.v_flat", va->out[0],
                               ty(IR_DTYPE_F32, 2, T, 8, 0));
    ir_value *mo_in[2] = {v_flat2, mla_o};
    const char *mo_name[1] = {"l0.mla.out"};
    ir_op *mo = op_new(m, IR_OP_LINEAR, mo_name, 1, mo_in, 2);
    must_ok(ir_op_set_float(m, mo, "alpha", 0.125), "alpha");
    must_ok(ir_op_finish(m, mo, NULL), "mla out");
    /* DeepSeek-V3.2's sparse attention: the indexer's key norm, its top-k,
       and the selection read by both attentions */
    ir_value *kn_w = must(ir_module_add_weight(m, "l0.dsa.k_norm", ty(IR_DTYPE_F32, 1, 8, 0, 0),
                                               "model.layers.0.self_attn.indexer.k_norm.weight"), "w");
    ir_value *kn_b = must(ir_module_add_weight(m, "l0.dsa.k_norm_bias", ty(IR_DTYPE_F32, 1, 8, 0, 0),
                                               "model.layers.0.self_attn.indexer.k_norm.bias"), "w");
    ir_value *ln_in[3] = {k_flat, kn_w, kn_b};
    const char *ln_name[1] = {"l0.dsa.k"};
    ir_op *ln = op_new(m, IR_OP_LAYER_NORM, ln_name, 1, ln_in, 3);
    must_ok(ir_op_set_float(m, ln, "eps", 1e-6), "eps");
    must_ok(ir_op_finish(m, ln, NULL), "layer_norm");
    ir_value *iw = slice(m, "l0.dsa.w", qkv, 1, 0, 2);
    ir_value *ds_in[4] = {q, ln->out[0], iw, pos};
    const char *ds_name[1] = {"l0.dsa.sel"};
    ir_op *ds = op_new(m, IR_OP_DSA_TOPK, ds_name, 1, ds_in, 4);
    must_ok(ir_op_set_int(m, ds, "top_k", 3), "top_k");
    must_ok(ir_op_set_float(m, ds, "scale", 0.25), "scale");
    must_ok(ir_op_set_float(m, ds, "weight_scale", 0.5), "weight_scale");
    must_ok(ir_op_finish(m, ds, NULL), "dsa_topk");
    ir_value *sa_in[5] = {rq->out[0], rk->out[0], v, pos, ds->out[0]};
    const char *sa_name[1] = {"l0.dsa.att"};
    ir_op *sa = op_new(m, IR_OP_ATTENTION, sa_name, 1, sa_in, 5);
    must_ok(ir_op_set_float(m, sa, "scale", 0.5), "scale");
    must_ok(ir_op_finish(m, sa, NULL), "sparse attention");
    ir_value *sm_in[6] = {qa->out[0], rq->out[0], kv_c, rk->out[0], pos, ds->out[0]};
    const char *sm_name[1] = {"l0.dsa.o_c"};
    ir_op *sm = op_new(m, IR_OP_MLA_ATTENTION, sm_name, 1, sm_in, 6);
    must_ok(ir_op_set_float(m, sm, "scale", 0.25), "scale");
    must_ok(ir_op_finish(m, sm, NULL), "sparse mla_attention");
    ir_value *j2 = shaped(m, IR_OP_RESHAPE, "l0.moe.joined2", joined, ty(IR_DTYPE_F32, 3, T, 2, 4));
    ir_value *j_full = shaped(m, IR_OP_RESHAPE, "l0.moe.joined_flat", j2,
                              ty(IR_DTYPE_F32, 2, T, 8, 0));
    ir_value *j_cat_in[2] = {j_full, j_full};
    ir_value *j_cat = axis_op(m, IR_OP_CONCAT, "l0.moe.joined_cat", j_cat_in, 2, 1);
    ir_value *sum_a = op1(m, IR_OP_ADD, "l0.fused.a", mix->out[0], mo->out[0]);
    ir_value *sum_b = op1(m, IR_OP_ADD, "l0.fused.b", sum_a, j_cat);
    ir_value *mixed2 = op1(m, IR_OP_MUL, "l0.moe.mixed2", mixed, sum_b);
    ir_value *out = op1(m, IR_OP_ADD, "l0.out", resid, mixed2);
    out->mem_offset = 64;
    ir_value *fin = rms_norm(m, "final_norm", out, norm_f);
    ir_value *lg = op1(m, IR_OP_LINEAR, "logits", fin, lm_head);
    must_ok(ir_module_add_output(m, lg), "output");
    must_ok(ir_module_add_output(m, both), "output");
    return m;
}

/* ---- small pieces --------------------------------------------------------- */

static void test_arena(void)
{
    ir_arena *a = ir_arena_init();
    T_CHECK(a != NULL);
    size_t sizes[] = {1, 3, 16, 17, 100, 70000, 5, 300000, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = ir_arena_alloc(a, sizes[i]);
        T_CHECK(p != NULL);
        T_CHECK(((uintptr_t)p & 15) == 0);
        int zero = 1;
        for (size_t j = 0; j < sizes[i]; j++)
            zero &= p[j] == 0;
        T_CHECK(zero);
        memset(p, 0xab, sizes[i]);
    }
    char *s = ir_arena_strdup(a, "hello");
    T_CHECK(s && !strcmp(s, "hello"));
    T_CHECK(ir_arena_strdup(a, NULL) == NULL);
    ir_arena_free(a);
    ir_arena_free(NULL);
}

static void test_types(void)
{
    ir_dtype dt;
    T_CHECK(!strcmp(ir_dtype_name(IR_DTYPE_BF16), "bf16"));
    T_CHECK(ir_dtype_from_name("f16", &dt) == 0 && dt == IR_DTYPE_F16);
    T_CHECK(ir_dtype_from_name("f8", &dt) != 0);
    T_CHECK(ir_dtype_from_name("f8e4m3", &dt) == 0 && dt == IR_DTYPE_F8E4M3);
    T_CHECK(ir_dtype_size(IR_DTYPE_F8E4M3) == 1 && !strcmp(ir_dtype_name(dt), "f8e4m3"));
    T_CHECK(ir_dtype_size(IR_DTYPE_F32) == 4 && ir_dtype_size(IR_DTYPE_BF16) == 2);
    ir_type t = ty(IR_DTYPE_BF16, 3, T, 4, 64);
    char buf[64];
    ir_type_format(&t, buf, sizeof buf);
    T_CHECK(!strcmp(buf, "bf16[T, 4, 64]"));
    T_CHECK(ir_type_numel(&t, 0) == 256);
    T_CHECK(ir_type_numel(&t, 3) == 768);
    ir_type w = ty(IR_DTYPE_F32, 2, 8, 16, 0);
    T_CHECK(ir_type_numel(&w, 0) == 128);
    ir_type t2 = t;
    T_CHECK(ir_type_equal(&t, &t2));
    t2.dims[2] = 63;
    T_CHECK(!ir_type_equal(&t, &t2));
    ir_op_kind k;
    T_CHECK(ir_op_kind_from_name("moe_experts", &k) == 0 && k == IR_OP_MOE_EXPERTS);
    T_CHECK(ir_op_kind_from_name("lineer", &k) != 0);
    for (int i = 0; i < IR_OP_COUNT; i++) {
        T_CHECK(ir_op_kind_from_name(ir_op_name((ir_op_kind)i), &k) == 0 && (int)k == i);
    }
}

static void test_builder_and_lookup(void)
{
    ir_module *m = build_all();
    T_OK(ir_module_verify(m));
    T_CHECK(m->n_ops == 57);
    T_CHECK(ir_module_meta_int(m, "vocab_size", 0) == 32);
    T_CHECK(ir_module_meta_int(m, "missing", 7) == 7);
    T_CHECK(ir_module_meta(m, "note") && ir_module_meta(m, "note")->kind == IR_ATTR_STR);
    ir_value *v = ir_module_find_value(m, "l0.moe.w");
    T_CHECK(v && v->kind == IR_VALUE_OP && v->def->kind == IR_OP_MOE_TOPK);
    T_CHECK(v && v->type.dtype == IR_DTYPE_F32 && v->type.rank == 2 && v->type.dims[1] == 2);
    T_CHECK(v && v->def->out[0]->type.dtype == IR_DTYPE_I32);
    T_CHECK(ir_module_find_value(m, "%l0.moe.w") == v);
    T_CHECK(ir_module_find_value(m, "nope") == NULL);
    const ir_op *tk = v->def;
    T_CHECK(ir_op_attr_int(tk, "top_k", 0) == 2);
    T_CHECK(ir_op_attr_int(tk, "absent", -5) == -5);
    T_CHECK(ir_op_attr_float(tk, "scaling", 1.0) == 2.5);
    T_CHECK(!strcmp(ir_op_attr_str(tk, "group_score", "max"), "top2_sum"));
    T_CHECK(ir_op_attr_int(tk, "scoring", 9) == 9); /* wrong kind -> default */
    ir_value *both = ir_module_find_value(m, "l0.moe.both");
    T_CHECK(both && both->type.rank == 2 && both->type.dims[1] == 48);
    T_CHECK(both && both->mem_offset == -1 && both->def->stream == 0);
    T_CHECK(ir_module_find_value(m, "positions")->mem_offset == -1);
    T_CHECK(ir_module_find_value(m, "norm")->mem_offset == -1);

    /* builder errors */
    T_CHECK(ir_module_add_input(m, "tokens", ty(IR_DTYPE_I32, 1, T, 0, 0)) == NULL);
    T_CHECK(strstr(moec_last_error(), "duplicate value %tokens") != NULL);
    T_CHECK(ir_module_add_input(m, "bad name", ty(IR_DTYPE_I32, 1, T, 0, 0)) == NULL);
    T_CHECK(ir_module_add_weight(m, "wt", ty(IR_DTYPE_F32, 2, T, 4, 0), "x") == NULL);
    T_CHECK(strstr(moec_last_error(), "weight %wt") != NULL);
    T_CHECK(ir_module_add_weight_stack(m, "ws", ty(IR_DTYPE_F32, 2, 3, 4, 0), "no_e", 3) == NULL);
    T_CHECK(strstr(moec_last_error(), "must contain {e}") != NULL);
    T_CHECK(ir_module_add_weight_stack(m, "ws", ty(IR_DTYPE_F32, 2, 3, 4, 0), "a.{e}", 4) == NULL);
    T_CHECK(strstr(moec_last_error(), "stack count 4 does not match dim 0 (3)") != NULL);
    ir_op *rn = ir_module_find_value(m, "l0.h")->def;
    T_ERR(ir_op_set_int(m, rn, "bogus", 1), MOEC_ERR_INVALID_ARG, "%l0.h: rms_norm: unknown attribute 'bogus'");
    T_ERR(ir_op_set_int(m, rn, "eps", 1), MOEC_ERR_INVALID_ARG, "attribute 'eps' must be a float");
    T_ERR(ir_module_set_meta_int(m, "bad key", 1), MOEC_ERR_INVALID_ARG, "meta 'bad key'");
    T_ERR(ir_module_add_output(m, ir_module_find_value(m, "logits")), MOEC_ERR_INVALID_ARG,
          "already an output");
    ir_value *in1[1] = {ir_module_find_value(m, "l0.h")};
    T_CHECK(ir_build(m, IR_OP_RESHAPE, "r", in1, 1) == NULL);
    T_CHECK(strstr(moec_last_error(), "%r: reshape: the result type must be given") != NULL);
    const char *two[2] = {"a1", "a2"};
    T_CHECK(ir_module_add_op(m, IR_OP_SILU, in1, 1, two, 2) == NULL);
    T_CHECK(strstr(moec_last_error(), "%a1: silu: has 1 results, 2 given") != NULL);
    ir_module_free(m);
    ir_module_free(NULL);
}

/* ---- text form ------------------------------------------------------------ */

static void test_print_parse(void)
{
    ir_module *m = build_all();
    char *s1 = ir_module_print_str(m);
    T_CHECK(s1 != NULL);
    if (!s1)
        return;
    T_CHECK(strstr(s1, "module all_ops {\n  meta vocab_size = 32\n") == s1);
    T_CHECK(strstr(s1, "  meta rms_norm_eps = 1e-06\n") != NULL);
    T_CHECK(strstr(s1, "  meta tenth = 0.1\n") != NULL);
    T_CHECK(strstr(s1, "  meta two = 2.0\n") != NULL);
    T_CHECK(strstr(s1, "  meta huge = 1e+30\n") != NULL);
    T_CHECK(strstr(s1, "  meta neg_zero = -0.0\n") != NULL);
    T_CHECK(strstr(s1, "  meta third = 0.3333333333333333\n") != NULL);
    T_CHECK(strstr(s1, "  meta min_int = -9223372036854775808\n") != NULL);
    T_CHECK(strstr(s1, "  meta note = \"a \\\"tiny\\\" model \\\\ every op\"\n") != NULL);
    T_CHECK(strstr(s1, "  meta mlp_only_layers = [0, 3]\n  meta empty_list = []\n") != NULL);
    T_CHECK(strstr(s1, "  input %tokens : i32[T] @0*T\n  input %positions : i32[T]\n") != NULL);
    T_CHECK(strstr(s1, "  %l0.moe.side_act : f32[T, 8] = silu_mul(%l0.moe.side) stream 1\n") != NULL);
    T_CHECK(strstr(s1, "  %l0.moe.routed6 : f32[T, 16] @256*T = moe_routed(%l0.resid, "
                       "%l0.moe.ids_sm, %l0.moe.w_sm, %l0.moe.experts.gate, %l0.moe.experts.up, "
                       "%l0.moe.experts.down)\n") != NULL);
    T_CHECK(strstr(s1, "  %l0.moe.mix : f32[T, 16] = add(%l0.moe.routed6, %l0.moe.routed5) "
                       "{alpha = 0.5}\n") != NULL);
    T_CHECK(strstr(s1, "  %l0.mla.o_c : f32[T, 2, 6] = mla_attention(%l0.mla.q_c, %l0.attn.q_rot, "
                       "%l0.mla.kv_c, %l0.attn.k_rot, %positions) {scale = 0.25, window = 2}\n") != NULL);
    T_CHECK(strstr(s1, "  weight %l0.moe.experts.gate_up : bf16[4, 16, 16] = concat(1, "
                       "stack(\"model.layers.0.mlp.experts.{e}.gate_proj.weight\", 4), "
                       "stack(\"model.layers.0.mlp.experts.{e}.up_proj.weight\", 4))\n") != NULL);
    T_CHECK(strstr(s1, "  %l0.moe.ids : i32[T, 2], %l0.moe.w : f32[T, 2] = moe_topk(%l0.moe.logits, "
                       "%l0.moe.bias) {scoring = \"sigmoid\", top_k = 2, n_group = 2, topk_group = 1, "
                       "group_score = \"top2_sum\", norm_topk_prob = 1, scaling = 2.5}\n") != NULL);
    T_CHECK(strstr(s1, "  %l0.attn.out : f32[T, 2, 8] = attention(%l0.attn.q_rot, %l0.attn.k_rot, "
                       "%l0.attn.v, %positions) {scale = 0.35355339059327373, window = 0}\n") != NULL);
    T_CHECK(strstr(s1, "  output %logits\n  output %l0.moe.both\n}\n") != NULL);

    /* golden */
    const char *golden_path = t_src("tests/data/ir/all_ops.mir");
    if (getenv("MOEC_UPDATE_GOLDEN"))
        t_write_file(golden_path, s1, strlen(s1));
    char *golden = t_read_file(golden_path, NULL);
    T_CHECK(!strcmp(golden, s1));
    free(golden);

    /* round trip */
    ir_module *m2 = NULL;
    T_OK(ir_module_parse(s1, "all_ops.mir", &m2));
    if (m2) {
        char *s2 = ir_module_print_str(m2);
        T_CHECK(s2 && !strcmp(s1, s2));
        T_CHECK(m2->n_ops == m->n_ops && m2->n_values == m->n_values && m2->n_meta == m->n_meta);
        const ir_attr *nz = ir_module_meta(m2, "neg_zero");
        T_CHECK(nz && nz->kind == IR_ATTR_FLOAT && nz->f == 0.0 && signbit(nz->f));
        const ir_attr *th = ir_module_meta(m2, "third");
        T_CHECK(th && th->f == 1.0 / 3.0);
        const ir_attr *note = ir_module_meta(m2, "note");
        T_CHECK(note && !strcmp(note->s, "a \"tiny\" model \\ every op"));
        const ir_attr *li = ir_module_meta(m2, "mlp_only_layers");
        T_CHECK(li && li->kind == IR_ATTR_INTS && li->n == 2 && li->ints[1] == 3);
        T_CHECK(ir_module_meta(m2, "min_int")->i == INT64_MIN);
        ir_value *gu = ir_module_find_value(m2, "l0.moe.experts.gate_up");
        T_CHECK(gu && gu->bind.kind == IR_BIND_CONCAT && gu->bind.n_parts == 2 &&
                gu->bind.parts[1].kind == IR_BIND_STACK && gu->bind.parts[1].count == 4);
        ir_value *sc = ir_module_find_value(m2, "l0.attn.out");
        T_CHECK(sc && ir_op_attr_float(sc->def, "scale", 0) == 1.0 / sqrt(8.0));
        /* scheduling marks read back; everything else is unplanned, main stream */
        int planned = 0, side = 0;
        for (int i = 0; i < m2->n_values; i++)
            planned += m2->values[i]->mem_offset != -1;
        for (int i = 0; i < m2->n_ops; i++)
            side += m2->ops[i]->stream != 0;
        T_CHECK(planned == 3 && side == 2);
        T_CHECK(ir_module_find_value(m2, "tokens")->mem_offset == 0);
        T_CHECK(ir_module_find_value(m2, "l0.moe.routed6")->mem_offset == 256);
        T_CHECK(ir_module_find_value(m2, "l0.out")->mem_offset == 64);
        T_CHECK(ir_module_find_value(m2, "l0.moe.side")->def->stream == 1);
        T_CHECK(ir_module_find_value(m2, "l0.moe.joined")->def->stream == 0);
        free(s2);
        ir_module_free(m2);
    }

    /* comments, blank lines, CRLF and extra spaces are accepted */
    const char *loose =
        "# a comment\r\n\n"
        "module  loose {   # trailing\r\n"
        "  meta x = inf\n  meta y = -inf\n  meta z = nan\n  meta w = 1.5E3\n  meta v = 1e+04\n  meta u = 100.0\n  meta k = 1e2\n"
        "  input %tokens:i32[ T ]\n"
        "\n"
        "  weight %e : f32[4,2] = \"e\"\n"
        "  %y : f32[T, 2] = embedding( %tokens ,%e )\n"
        "  output %y\n"
        "}\n# done\n\n";
    ir_module *m3 = NULL;
    T_OK(ir_module_parse(loose, "loose.mir", &m3));
    if (m3) {
        char *s3 = ir_module_print_str(m3);
        T_CHECK(s3 && strstr(s3, "  meta x = inf\n  meta y = -inf\n  meta z = nan\n  meta w = 1500.0\n  meta v = 1e+04\n  meta u = 100.0\n  meta k = 100.0\n"));
        free(s3);
        ir_module_free(m3);
    }

    /* print to a stream */
    FILE *f = tmpfile();
    T_CHECK(f != NULL);
    if (f) {
        T_OK(ir_module_print(m, f));
        T_CHECK(ftell(f) == (long)strlen(s1));
        fclose(f);
    }
    free(s1);
    ir_module_free(m);
}

/* ---- verifier ------------------------------------------------------------- */

static ir_value *val(ir_module *m, const char *name)
{
    return must(ir_module_find_value(m, name), name);
}

static void test_verifier(void)
{
    ir_module *m;

    /* declared result type disagrees with inference */
    m = build_all();
    val(m, "l0.attn.qkv_out")->type.dims[1] = 31;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "%l0.attn.qkv_out: linear: declared type f32[T, 31], inferred f32[T, 32]");
    ir_module_free(m);

    /* one definition per value */
    m = build_all();
    val(m, "l0.moe.act")->def = NULL;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "%l0.moe.act: no op defines it");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.act")->def = val(m, "l0.moe.gated")->def;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "%l0.moe.act: defined by more than one op");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.act")->def->out[0] = val(m, "l0.h");
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "%l0.h: defined by more than one op");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.act")->def->out[0] = val(m, "norm");
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "%norm: a weight or input cannot be an op's result");
    ir_module_free(m);
    m = build_all();
    {
        ir_op *a = val(m, "l0.moe.act")->def, *b = val(m, "l0.moe.gated")->def;
        b->out[0] = a->out[0];
    }
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "%l0.moe.act: defined by more than one op");
    ir_module_free(m);

    /* use before definition: swap two dependent ops */
    m = build_all();
    {
        ir_op *a = val(m, "l0.moe.act")->def, *b = val(m, "l0.moe.both")->def;
        int ia = a->id, ib = b->id;
        m->ops[ia] = b;
        m->ops[ib] = a;
        a->id = ib;
        b->id = ia;
    }
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "%l0.moe.both: concat: operand %l0.moe.act is used before its definition");
    ir_module_free(m);

    /* an operand from another module */
    m = build_all();
    {
        ir_module *other = build_all();
        val(m, "l0.moe.act")->def->in[0] = val(other, "l0.h");
        T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
              "%l0.moe.act: silu: operand 0 (%l0.h) is not a value of the module");
        ir_module_free(other);
    }
    ir_module_free(m);

    /* unknown attribute, wrong kind, missing required, duplicate */
    m = build_all();
    val(m, "l0.h")->def->attrs[0].key = "epsilon";
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "%l0.h: rms_norm: unknown attribute 'epsilon'");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.h")->def->attrs[0].kind = IR_ATTR_INT;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "%l0.h: rms_norm: attribute 'eps' must be a float");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.attn.q_flat")->def->n_attr = 2;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "%l0.attn.q_flat: slice: missing required attribute 'size'");
    ir_module_free(m);
    m = build_all();
    {
        ir_op *op = val(m, "l0.attn.q_flat")->def;
        op->attrs[1].key = "axis";
    }
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "%l0.attn.q_flat: slice: duplicate attribute 'axis'");
    ir_module_free(m);

    /* weights: binding present, stack pattern and count */
    m = build_all();
    val(m, "norm")->bind.name = "";
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "weight %norm: has no binding");
    ir_module_free(m);
    m = build_all();
    val(m, "norm")->bind.name = NULL;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "weight %norm: has no binding");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.experts.up")->bind.name = "model.layers.0.mlp.experts.up_proj.weight";
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "weight %l0.moe.experts.up: stack pattern");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.experts.up")->bind.count = 0;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "weight %l0.moe.experts.up: stack count 0 must be >= 1");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.experts.up")->bind.count = 5;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "weight %l0.moe.experts.up: stack count 5 does not match dim 0 (4)");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.experts.gate_up")->bind.parts[1].count = 3;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "weight %l0.moe.experts.gate_up: stack count 3 does not match dim 0 (4)");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.attn.qkv")->bind.n_parts = 0;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "weight %l0.attn.qkv: concat binding has 0 parts");
    ir_module_free(m);

    /* T: never in weights, only first in inputs and results */
    m = build_all();
    val(m, "lm_head")->type.dims[0] = IR_DIM_T;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "weight %lm_head: type bf16[T, 16] must not have T");
    ir_module_free(m);
    m = build_all();
    {
        ir_value *p = val(m, "positions");
        p->type.rank = 2;
        p->type.dims[0] = 4;
        p->type.dims[1] = IR_DIM_T;
    }
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "input %positions: type i32[4, T] must have T first");
    ir_module_free(m);
    m = build_all();
    {
        ir_value *r = val(m, "l0.moe.w_full");
        r->type.dims[0] = 1; /* a result without T */
    }
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "%l0.moe.w_full: result type f32[1, 2, 16] must have T first");
    ir_module_free(m);

    /* names */
    m = build_all();
    val(m, "l0.moe.gated")->name = "l0.moe.act";
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "duplicate value %l0.moe.");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.gated")->name = "l0 moe";
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "name 'l0 moe' must match");
    ir_module_free(m);

    /* outputs */
    m = build_all();
    m->n_outputs = 0;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "module all_ops: has no outputs");
    ir_module_free(m);

    /* scheduling marks: stream 0 or 1, offsets >= -1, none on weights */
    m = build_all();
    val(m, "l0.moe.side_act")->def->stream = 2;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "%l0.moe.side_act: silu_mul: stream 2 must be 0 (main) or 1 (side)");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.side_act")->def->stream = -1;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "stream -1 must be 0 (main) or 1 (side)");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.mix")->mem_offset = -2;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "%l0.moe.mix: mem_offset -2 must be >= 0 (planned) or -1");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.mla.kv_b")->mem_offset = 0;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "weight %l0.mla.kv_b: mem_offset 0: weights are not in the activation arena");
    ir_module_free(m);
    m = build_all();
    val(m, "l0.moe.joined")->type.dims[1] = 16; /* join changes the type */
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "%l0.moe.joined: join: declared type f32[T, 16], inferred f32[T, 8]");
    ir_module_free(m);

    /* an input value missing from the input list */
    m = build_all();
    m->n_inputs = 1;
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "input %positions: not in the module's input list");
    ir_module_free(m);
}

/* ---- the memory plan: aliases and overlaps ----------------------------------- */

/* A planned module in the text form: e lives across the fork..join (the
 * side stream reads it as f, its alias), the join's j is the side output s
 * itself, q a reshape of j; o reuses tokens' and positions' bytes. */
static const char PLANNED_IR[] =
    "module planned {\n"
    "  meta arena_bytes_per_token = 128\n"
    "  input %tokens : i32[T] @0*T\n"
    "  input %positions : i32[T] @16*T\n"
    "  weight %emb : f32[16, 8] = \"emb\"\n"
    "  weight %w : f32[8, 8] = \"w\"\n"
    "  %e : f32[T, 8] @32*T = embedding(%tokens, %emb)\n"
    "  %f : f32[T, 8] @32*T = fork(%e) stream 1\n"
    "  %s : f32[T, 8] @64*T = linear(%f, %w) stream 1\n"
    "  %r : f32[T, 8] @96*T = linear(%e, %w)\n"
    "  %j : f32[T, 8] @64*T = join(%s)\n"
    "  %q : f32[T, 2, 4] @64*T = reshape(%j)\n"
    "  %o : f32[T, 2, 4] @0*T = mul(%q, %q)\n"
    "  output %o\n"
    "}\n";

/* PLANNED_IR with the first `from` replaced by `to`. */
static char *planned_with(const char *from, const char *to)
{
    const char *at = strstr(PLANNED_IR, from);
    T_CHECK(at != NULL);
    size_t n = strlen(PLANNED_IR) + strlen(to) + 1;
    char *s = malloc(n);
    if (!s || !at) {
        free(s);
        return NULL;
    }
    snprintf(s, n, "%.*s%s%s", (int)(at - PLANNED_IR), PLANNED_IR, to, at + strlen(from));
    return s;
}

static void expect_plan_rejected(const char *from, const char *to, const char *needle)
{
    char *text = planned_with(from, to);
    ir_module *m = NULL;
    if (text)
        T_ERR(ir_module_parse(text, "bad_plan.mir", &m), MOEC_ERR_FORMAT, needle);
    T_CHECK(m == NULL);
    free(text);
}

static void test_plan_aliases(void)
{
    /* reshape, fork and join at their operand's offset: accepted, printed
     * and read back the same */
    ir_module *m = NULL;
    T_OK(ir_module_parse(PLANNED_IR, "planned.mir", &m));
    if (m) {
        char *text = ir_module_print_str(m);
        T_CHECK(text && !strcmp(text, PLANNED_IR));
        free(text);
        T_CHECK(ir_op_may_alias(IR_OP_RESHAPE) && ir_op_may_alias(IR_OP_FORK) &&
                ir_op_may_alias(IR_OP_JOIN) && !ir_op_may_alias(IR_OP_SLICE) &&
                !ir_op_may_alias(IR_OP_LINEAR));
        /* live ranges: e and everything the side stream touches span the
         * fork..join (ops 1..4); j and q until the mul; o past the end */
        int start[16], end[16];
        T_CHECK(m->n_values <= 16 && ir_module_live_ranges(m, start, end) == 0);
        int e = val(m, "e")->id, s = val(m, "s")->id, r = val(m, "r")->id;
        int q = val(m, "q")->id, o = val(m, "o")->id, tok = val(m, "tokens")->id;
        T_CHECK(start[tok] == -1 && end[tok] == 0);
        T_CHECK(start[e] == 0 && end[e] == 4 && start[s] == 1 && end[s] == 4);
        T_CHECK(start[r] == 1 && end[r] == 4 && start[q] == 5 && end[q] == 6);
        T_CHECK(start[o] == 6 && end[o] == 7);
        /* the verifier on the module itself: an op result in place over its
         * operand is no alias */
        val(m, "o")->mem_offset = 64;
        T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "share arena bytes while both are live");
        val(m, "o")->mem_offset = 0;
        T_OK(ir_module_verify(m));
        /* only placed values are checked against each other */
        val(m, "r")->mem_offset = 32;
        T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG, "%e (@32*T) and %r (@32*T)");
        val(m, "e")->mem_offset = val(m, "f")->mem_offset = -1;
        T_OK(ir_module_verify(m));
        ir_module_free(m);
    }
    /* r written while e is still read by the side stream (as its alias f) */
    expect_plan_rejected("%r : f32[T, 8] @96*T", "%r : f32[T, 8] @32*T",
                         "%e (@32*T) and %r (@32*T) share arena bytes while both are live "
                         "(ops 0..4 and 1..4)");
    /* a linear in place over its operand: only reshape, fork, join alias */
    expect_plan_rejected("%s : f32[T, 8] @64*T", "%s : f32[T, 8] @32*T",
                         "share arena bytes while both are live (ops 0..4 and 1..4)");
    /* an alias must be exact: a join 4 bytes into its operand overlaps it */
    expect_plan_rejected("%j : f32[T, 8] @64*T", "%j : f32[T, 8] @68*T",
                         "%s (@64*T) and %j (@68*T) share arena bytes");
    /* a reshape apart from its operand is a copy: fine into bytes no live
     * value holds (r's: r is dead after the join), not into bytes it
     * overlaps while reading them */
    char *copy = planned_with("%q : f32[T, 2, 4] @64*T", "%q : f32[T, 2, 4] @96*T");
    ir_module *mc = NULL;
    if (copy)
        T_OK(ir_module_parse(copy, "copy.mir", &mc));
    ir_module_free(mc);
    free(copy);
    /* (s and its alias j, which q reads, span 1..5) */
    expect_plan_rejected("%q : f32[T, 2, 4] @64*T", "%q : f32[T, 2, 4] @80*T",
                         "%s (@64*T) and %q (@80*T) share arena bytes");
    /* step inputs are not op results: no alias of tokens (on the GPU they
     * live outside the arena) */
    expect_plan_rejected("  %o : f32[T, 2, 4] @0*T = mul(%q, %q)\n",
                         "  %t2 : i32[T, 1] @0*T = reshape(%tokens)\n"
                         "  %o : f32[T, 2, 4] @16*T = mul(%q, %q)\n",
                         "%tokens (@0*T) and %t2 (@0*T) share arena bytes");

    /* a side-stream chain whose every op reads the previous value twice:
     * finding the join's fork is linear, not one walk per path (2^64) */
    enum { CHAIN = 64 };
    char *deep = malloc(16384);
    if (!deep)
        return;
    int n = snprintf(deep, 16384,
                     "module deep {\n  meta arena_bytes_per_token = %d\n"
                     "  input %%tokens : i32[T] @0*T\n  weight %%emb : f32[16, 4] = \"emb\"\n"
                     "  %%e : f32[T, 4] @16*T = embedding(%%tokens, %%emb)\n"
                     "  %%a0 : f32[T, 4] @16*T = fork(%%e) stream 1\n",
                     32 + 16 * (CHAIN + 1));
    for (int i = 1; i <= CHAIN; i++)
        n += snprintf(deep + n, 16384 - (size_t)n,
                      "  %%a%d : f32[T, 4] @%d*T = add(%%a%d, %%a%d) stream 1\n", i, 16 + 16 * i,
                      i - 1, i - 1);
    snprintf(deep + n, 16384 - (size_t)n,
             "  %%j : f32[T, 4] @%d*T = join(%%a%d)\n  output %%j\n}\n", 16 + 16 * CHAIN, CHAIN);
    ir_module *md = NULL;
    T_OK(ir_module_parse(deep, "deep.mir", &md));
    if (md) {
        int start[CHAIN + 8], end[CHAIN + 8];
        T_CHECK(md->n_values <= CHAIN + 8 && ir_module_live_ranges(md, start, end) == 0);
        /* every side value spans the fork..join (ops 1..CHAIN + 2) */
        T_CHECK(start[val(md, "a1")->id] == 1 && end[val(md, "a1")->id] == CHAIN + 2);
        ir_module_free(md);
    }
    free(deep);
}

/* ---- shape inference ------------------------------------------------------ */

static void test_infer_errors(void)
{
    ir_module *m = must(ir_module_init("shapes"), "m");
    ir_value *x = must(ir_module_add_input(m, "x", ty(IR_DTYPE_F32, 2, T, 64, 0)), "x");
    ir_value *ids = must(ir_module_add_input(m, "ids", ty(IR_DTYPE_I32, 2, T, 2, 0)), "ids");
    ir_value *pos = must(ir_module_add_input(m, "pos", ty(IR_DTYPE_I32, 1, T, 0, 0)), "pos");
    ir_value *w = must(ir_module_add_weight(m, "w", ty(IR_DTYPE_BF16, 2, 32, 63, 0), "w"), "w");
    ir_value *q = must(ir_module_add_input(m, "q", ty(IR_DTYPE_F32, 3, T, 6, 16)), "q");
    ir_value *k = must(ir_module_add_input(m, "k", ty(IR_DTYPE_F32, 3, T, 4, 16)), "k");
    ir_value *gate = must(ir_module_add_weight_stack(m, "gate", ty(IR_DTYPE_BF16, 3, 8, 32, 64),
                                                     "g.{e}", 8), "gate");
    ir_value *up = must(ir_module_add_weight_stack(m, "up", ty(IR_DTYPE_BF16, 3, 8, 31, 64), "u.{e}", 8), "up");
    ir_value *down = must(ir_module_add_weight_stack(m, "down", ty(IR_DTYPE_BF16, 3, 8, 64, 32),
                                                     "d.{e}", 8), "down");
    ir_value *gu = must(ir_module_add_weight_stack(m, "gu", ty(IR_DTYPE_BF16, 3, 8, 63, 64), "gu.{e}", 8), "gu");
    ir_value *logits8 = must(ir_module_add_input(m, "logits", ty(IR_DTYPE_F32, 2, T, 8, 0)), "l");

    const char *n1[1] = {"l0.attn.q"};
    ir_value *lin_in[2] = {x, w};
    ir_op *op = op_new(m, IR_OP_LINEAR, n1, 1, lin_in, 2);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%l0.attn.q: linear: weight %w has 63 columns, input has 64");
    T_ERR(ir_op_infer(op, (ir_type[2]){0}), MOEC_ERR_INVALID_ARG, "weight %w has 63 columns");

    const char *n2[1] = {"att"};
    ir_value *at_in[4] = {q, k, k, pos};
    op = op_new(m, IR_OP_ATTENTION, n2, 1, at_in, 4);
    T_OK(ir_op_set_float(m, op, "scale", 0.25));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%att: attention: q heads 6 are not a multiple of kv heads 4");
    at_in[3] = x;
    op = op_new(m, IR_OP_ATTENTION, (const char *[]){"att2"}, 1, at_in, 4);
    T_OK(ir_op_set_float(m, op, "scale", 0.25));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%att2: attention: positions %x must have rank 1");

    const char *n3[2] = {"tk_ids", "tk_w"};
    op = op_new(m, IR_OP_MOE_TOPK, n3, 2, &logits8, 1);
    T_OK(ir_op_set_str(m, op, "scoring", "softmax"));
    T_OK(ir_op_set_int(m, op, "top_k", 9));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%tk_ids: moe_topk: top_k 9 out of range [1, 8]");
    T_OK(ir_op_set_int(m, op, "top_k", 2));
    T_OK(ir_op_set_int(m, op, "n_group", 3));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "n_group 3 does not divide 8 experts");
    T_OK(ir_op_set_int(m, op, "n_group", 4));
    T_OK(ir_op_set_int(m, op, "topk_group", 5));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "topk_group 5 out of range [1, 4]");
    T_OK(ir_op_set_int(m, op, "topk_group", 1));
    T_OK(ir_op_set_int(m, op, "top_k", 3));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "top_k 3 exceeds the 2 experts of 1 kept groups");
    T_OK(ir_op_set_int(m, op, "topk_group", 2));
    T_OK(ir_op_set_str(m, op, "scoring", "relu"));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "scoring 'relu' must be");
    T_OK(ir_op_set_str(m, op, "scoring", "sigmoid"));
    T_OK(ir_op_finish(m, op, NULL));
    T_CHECK(op->out[0]->type.dtype == IR_DTYPE_I32 && op->out[0]->type.dims[1] == 3);
    T_CHECK(op->out[1]->type.dtype == IR_DTYPE_F32 && op->out[1]->type.dims[0] == IR_DIM_T);

    ir_value *ex5[5] = {x, ids, gate, up, down};
    op = op_new(m, IR_OP_MOE_EXPERTS, (const char *[]){"ex5"}, 1, ex5, 5);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%ex5: moe_experts: up %up is bf16[8, 31, 64], expected [8, 32, 64]");
    ir_value *ex4[4] = {x, ids, gu, down};
    op = op_new(m, IR_OP_MOE_EXPERTS, (const char *[]){"ex4"}, 1, ex4, 4);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%ex4: moe_experts: gate_up %gu is bf16[8, 63, 64], expected [8, 64, 64]");
    ir_value *ex_bad_ids[4] = {x, pos, gu, down};
    op = op_new(m, IR_OP_MOE_EXPERTS, (const char *[]){"ex_ids"}, 1, ex_bad_ids, 4);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%ex_ids: moe_experts: ids %pos must have rank 2");
    ir_value *ex_f_ids[4] = {x, logits8, gu, down};
    op = op_new(m, IR_OP_MOE_EXPERTS, (const char *[]){"ex_f"}, 1, ex_f_ids, 4);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "ids %logits must be i32");

    op = op_new(m, IR_OP_SLICE, (const char *[]){"sl"}, 1, &x, 1);
    T_OK(ir_op_set_int(m, op, "axis", 1));
    T_OK(ir_op_set_int(m, op, "start", 60));
    T_OK(ir_op_set_int(m, op, "size", 5));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%sl: slice: slice [60, 60 + 5) out of bounds of dim 1 of %x (64)");
    T_OK(ir_op_set_int(m, op, "axis", 0));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%sl: slice: axis 0 out of range [1, 1]");

    ir_value *cat_in[2] = {x, q};
    op = op_new(m, IR_OP_CONCAT, (const char *[]){"cat"}, 1, cat_in, 2);
    T_OK(ir_op_set_int(m, op, "axis", 1));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%cat: concat: operand %q (f32[T, 6, 16]) has rank 3");

    op = op_new(m, IR_OP_RESHAPE, (const char *[]){"rs"}, 1, &x, 1);
    T_ERR(ir_op_finish(m, op, &(ir_type){IR_DTYPE_F32, 3, {T, 7, 9, 0}}), MOEC_ERR_INVALID_ARG,
          "%rs: reshape: result f32[T, 7, 9] has 63 elements per token, input %x (f32[T, 64]) has 64");
    T_ERR(ir_op_finish(m, op, &(ir_type){IR_DTYPE_F32, 2, {8, 8, 0, 0}}), MOEC_ERR_INVALID_ARG,
          "%rs: reshape: result type f32[8, 8] must have T as its first dimension");

    op = op_new(m, IR_OP_EXPAND, (const char *[]){"ex"}, 1, &q, 1);
    T_ERR(ir_op_finish(m, op, &(ir_type){IR_DTYPE_F32, 3, {T, 6, 32, 0}}), MOEC_ERR_INVALID_ARG,
          "%ex: expand: dim 2 of input %q (f32[T, 6, 16]) is neither 1 nor the result's");

    op = op_new(m, IR_OP_REDUCE_SUM, (const char *[]){"rsum"}, 1, &q, 1);
    T_OK(ir_op_set_int(m, op, "axis", 3));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%rsum: reduce_sum: axis 3 out of range [1, 2]");
    T_OK(ir_op_set_int(m, op, "axis", 2));
    T_OK(ir_op_finish(m, op, NULL));
    T_CHECK(op->out[0]->type.rank == 2 && op->out[0]->type.dims[1] == 6);

    ir_value *add_in[2] = {x, logits8};
    op = op_new(m, IR_OP_ADD, (const char *[]){"sum"}, 1, add_in, 2);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%sum: add: dim 1 of %logits (f32[T, 8]) is neither 1 nor that of %x (f32[T, 64])");

    ir_value *rope_in[2] = {q, pos};
    op = op_new(m, IR_OP_ROPE, (const char *[]){"rot"}, 1, rope_in, 2);
    T_OK(ir_op_set_str(m, op, "style", "neox"));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%rot: rope: missing required attribute 'theta'");
    T_OK(ir_op_set_float(m, op, "theta", 10000.0));
    T_OK(ir_op_set_str(m, op, "scaling", "yarn"));
    T_OK(ir_op_set_float(m, op, "factor", 4.0));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "needs attributes 'yarn_low' and 'yarn_high'");

    ir_value *emb_in[2] = {x, w};
    op = op_new(m, IR_OP_EMBEDDING, (const char *[]){"emb"}, 1, emb_in, 2);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%emb: embedding: ids %x must have rank 1");
    ir_module_free(m);
}

/* Every rule of the fused and scheduled ops (docs/IR.md). */
static void test_infer_fused(void)
{
    ir_module *m = must(ir_module_init("fused"), "m");
    ir_value *x = must(ir_module_add_input(m, "x", ty(IR_DTYPE_F32, 2, T, 64, 0)), "x");
    ir_value *odd = must(ir_module_add_input(m, "odd", ty(IR_DTYPE_F32, 3, T, 2, 7)), "odd");
    ir_value *ids = must(ir_module_add_input(m, "ids", ty(IR_DTYPE_I32, 2, T, 2, 0)), "ids");
    ir_value *wts = must(ir_module_add_input(m, "wts", ty(IR_DTYPE_F32, 2, T, 2, 0)), "wts");
    ir_value *w3 = must(ir_module_add_input(m, "w3", ty(IR_DTYPE_F32, 2, T, 3, 0)), "w3");
    ir_value *gate = must(ir_module_add_weight_stack(m, "gate", ty(IR_DTYPE_BF16, 3, 8, 32, 64),
                                                     "g.{e}", 8), "gate");
    ir_value *up = must(ir_module_add_weight_stack(m, "up", ty(IR_DTYPE_BF16, 3, 8, 31, 64), "u.{e}", 8), "up");
    ir_value *down = must(ir_module_add_weight_stack(m, "down", ty(IR_DTYPE_BF16, 3, 8, 64, 32),
                                                     "d.{e}", 8), "down");
    ir_value *gu = must(ir_module_add_weight_stack(m, "gu", ty(IR_DTYPE_BF16, 3, 8, 64, 64), "gu.{e}", 8), "gu");
    ir_value *gu_bad = must(ir_module_add_weight_stack(m, "gu_bad", ty(IR_DTYPE_BF16, 3, 8, 62, 64),
                                                       "gb.{e}", 8), "gu_bad");
    ir_value *lw = must(ir_module_add_weight(m, "lw", ty(IR_DTYPE_BF16, 2, 16, 64, 0), "lw"), "lw");
    /* MLA (its own module: at most 8 inputs): H = 4, dn = 16, dv = 8, r = 32, dr = 8 */
    ir_module *mm = must(ir_module_init("mla"), "mm");
    ir_value *mpos = must(ir_module_add_input(mm, "pos", ty(IR_DTYPE_I32, 1, T, 0, 0)), "pos");
    ir_value *mids = must(ir_module_add_input(mm, "ids", ty(IR_DTYPE_I32, 2, T, 2, 0)), "ids");
    ir_value *q_nope = must(ir_module_add_input(mm, "q_nope", ty(IR_DTYPE_F32, 3, T, 4, 16)), "qn");
    ir_value *q_pe = must(ir_module_add_input(mm, "q_pe", ty(IR_DTYPE_F32, 3, T, 4, 8)), "qp");
    ir_value *kv_c = must(ir_module_add_input(mm, "kv_c", ty(IR_DTYPE_F32, 2, T, 32, 0)), "kvc");
    ir_value *kv_c31 = must(ir_module_add_input(mm, "kv_c31", ty(IR_DTYPE_F32, 2, T, 31, 0)), "kvc31");
    ir_value *k_pe = must(ir_module_add_input(mm, "k_pe", ty(IR_DTYPE_F32, 3, T, 1, 8)), "kp");
    ir_value *k_pe2 = must(ir_module_add_input(mm, "k_pe2", ty(IR_DTYPE_F32, 3, T, 2, 8)), "kp2");
    ir_value *kv_b = must(ir_module_add_weight(mm, "kv_b", ty(IR_DTYPE_BF16, 2, 96, 32, 0), "kv_b"), "kv_b");
    ir_value *kv_b95 = must(ir_module_add_weight(mm, "kv_b95", ty(IR_DTYPE_BF16, 2, 95, 32, 0), "b95"), "b95");

    /* silu_mul */
    ir_value *sm = op1(m, IR_OP_SILU_MUL, "sm", x, NULL);
    T_CHECK(sm->type.rank == 2 && sm->type.dims[0] == T && sm->type.dims[1] == 32 &&
            sm->type.dtype == IR_DTYPE_F32);
    ir_op *op = op_new(m, IR_OP_SILU_MUL, (const char *[]){"sm_odd"}, 1, &odd, 1);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%sm_odd: silu_mul: last dim 7 of %odd must be even");
    op = op_new(m, IR_OP_SILU_MUL, (const char *[]){"sm_w"}, 1, &lw, 1);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%sm_w: silu_mul: input %lw must have T as its first dimension");
    op = op_new(m, IR_OP_SILU_MUL, (const char *[]){"sm_i"}, 1, &ids, 1);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%sm_i: silu_mul: input %ids must be a float");

    /* moe_routed, both forms */
    ir_value *r5_in[5] = {x, ids, wts, gu, down};
    op = op_new(m, IR_OP_MOE_ROUTED, (const char *[]){"r5"}, 1, r5_in, 5);
    T_OK(ir_op_set_float(m, op, "scale", 2.0));
    T_OK(ir_op_finish(m, op, NULL));
    T_CHECK(op->out[0]->type.rank == 2 && op->out[0]->type.dims[1] == 64);
    T_OK(ir_op_set_float(m, op, "scale", INFINITY));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%r5: moe_routed: scale must be finite");
    T_ERR(ir_op_set_int(m, op, "scale", 2), MOEC_ERR_INVALID_ARG, "attribute 'scale' must be a float");
    r5_in[3] = gu_bad;
    op = op_new(m, IR_OP_MOE_ROUTED, (const char *[]){"r5b"}, 1, r5_in, 5);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%r5b: moe_routed: gate_up %gu_bad is bf16[8, 62, 64], expected [8, 64, 64]");
    r5_in[3] = gu;
    r5_in[2] = w3;
    op = op_new(m, IR_OP_MOE_ROUTED, (const char *[]){"r5w"}, 1, r5_in, 5);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%r5w: moe_routed: weights %w3 (f32[T, 3]) and ids %ids (i32[T, 2]) differ in top_k");
    r5_in[2] = ids;
    op = op_new(m, IR_OP_MOE_ROUTED, (const char *[]){"r5i"}, 1, r5_in, 5);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%r5i: moe_routed: weights %ids must be a float");
    r5_in[2] = wts;
    r5_in[1] = wts;
    op = op_new(m, IR_OP_MOE_ROUTED, (const char *[]){"r5f"}, 1, r5_in, 5);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%r5f: moe_routed: ids %wts must be i32");
    ir_value *r6_in[6] = {x, ids, wts, gate, up, down};
    op = op_new(m, IR_OP_MOE_ROUTED, (const char *[]){"r6"}, 1, r6_in, 6);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%r6: moe_routed: up %up is bf16[8, 31, 64], expected [8, 32, 64]");
    r6_in[4] = gate;
    op = op_new(m, IR_OP_MOE_ROUTED, (const char *[]){"r6ok"}, 1, r6_in, 6);
    T_OK(ir_op_finish(m, op, NULL));
    r6_in[5] = lw;
    op = op_new(m, IR_OP_MOE_ROUTED, (const char *[]){"r6d"}, 1, r6_in, 6);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%r6d: moe_routed: down %lw must have rank 3");
    T_CHECK(ir_module_add_op(m, IR_OP_MOE_ROUTED, r6_in, 4, (const char *[]){"r4"}, 1) == NULL);
    T_CHECK(strstr(moec_last_error(), "%r4: moe_routed: takes 5 to 6 operands, got 4") != NULL);

    /* mla_qabsorb */
    ir_value *qa_in[2] = {q_nope, kv_b};
    op = op_new(mm, IR_OP_MLA_QABSORB, (const char *[]){"qa"}, 1, qa_in, 2);
    T_OK(ir_op_set_int(mm, op, "qk_nope_head_dim", 16));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG,
          "%qa: mla_qabsorb: missing required attribute 'v_head_dim'");
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 8));
    T_OK(ir_op_finish(mm, op, NULL));
    T_CHECK(op->out[0]->type.rank == 3 && op->out[0]->type.dims[1] == 4 &&
            op->out[0]->type.dims[2] == 32);
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 9));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG,
          "%qa: mla_qabsorb: kv_b %kv_b has 96 rows, expected heads 4 * (qk_nope_head_dim 16 + "
          "v_head_dim 9)");
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 0));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG, "%qa: mla_qabsorb: v_head_dim 0 must be >= 1");
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 8));
    T_OK(ir_op_set_int(mm, op, "qk_nope_head_dim", 8));
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 16));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG,
          "%qa: mla_qabsorb: q_nope %q_nope has head dim 16, qk_nope_head_dim is 8");
    /* reading the q projection in place: q [T, N], heads of head_stride columns */
    {
        ir_value *qin[2] = {q_nope, kv_b};
        ir_op *o2 = op_new(mm, IR_OP_MLA_QABSORB, (const char *[]){"qa2"}, 1, qin, 2);
        T_OK(ir_op_set_int(mm, o2, "qk_nope_head_dim", 16));
        T_OK(ir_op_set_int(mm, o2, "v_head_dim", 8));
        T_OK(ir_op_set_int(mm, o2, "heads", 4));
        T_OK(ir_op_set_int(mm, o2, "head_stride", 16));
        T_ERR(ir_op_finish(mm, o2, NULL), MOEC_ERR_INVALID_ARG,
              "%qa2: mla_qabsorb: q %q_nope must have rank 2, got f32[T, 4, 16]");
        ir_module *mq = must(ir_module_init("mq"), "mq");
        qin[0] = must(ir_module_add_input(mq, "qrow", ty(IR_DTYPE_F32, 2, T, 100, 0)), "qrow");
        qin[1] = must(ir_module_add_weight(mq, "kv_b", ty(IR_DTYPE_BF16, 2, 96, 32, 0), "kv_b"), "kv_b");
        o2 = op_new(mq, IR_OP_MLA_QABSORB, (const char *[]){"qa3"}, 1, qin, 2);
        T_OK(ir_op_set_int(mq, o2, "qk_nope_head_dim", 16));
        T_OK(ir_op_set_int(mq, o2, "v_head_dim", 8));
        T_OK(ir_op_set_int(mq, o2, "heads", 4));
        T_OK(ir_op_set_int(mq, o2, "head_stride", 24));
        T_OK(ir_op_finish(mq, o2, NULL));
        T_CHECK(o2->out[0]->type.rank == 3 && o2->out[0]->type.dims[1] == 4 &&
                o2->out[0]->type.dims[2] == 32);
        T_OK(ir_op_set_int(mq, o2, "head_stride", 30));
        T_ERR(ir_op_finish(mq, o2, NULL), MOEC_ERR_INVALID_ARG,
              "%qa3: mla_qabsorb: head_stride 30 for 4 heads of qk_nope_head_dim 16 does not fit "
              "q %qrow (f32[T, 100])");
        T_OK(ir_op_set_int(mq, o2, "head_stride", 8));
        T_ERR(ir_op_finish(mq, o2, NULL), MOEC_ERR_INVALID_ARG,
              "%qa3: mla_qabsorb: head_stride 8 for 4 heads of qk_nope_head_dim 16 does not fit "
              "q %qrow (f32[T, 100])");
        T_OK(ir_op_set_int(mq, o2, "heads", 0));
        T_ERR(ir_op_finish(mq, o2, NULL), MOEC_ERR_INVALID_ARG, "%qa3: mla_qabsorb: heads 0 must be >= 1");
        ir_module_free(mq);
    }
    T_OK(ir_op_set_int(mm, op, "qk_nope_head_dim", 4000000000LL));
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 4000000000LL));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG, "qk_nope_head_dim 4000000000 must be >= 1");
    qa_in[1] = kv_b95;
    op = op_new(mm, IR_OP_MLA_QABSORB, (const char *[]){"qa95"}, 1, qa_in, 2);
    T_OK(ir_op_set_int(mm, op, "qk_nope_head_dim", 16));
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 8));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG, "kv_b %kv_b95 has 95 rows");
    qa_in[1] = q_pe;
    op = op_new(mm, IR_OP_MLA_QABSORB, (const char *[]){"qa_act"}, 1, qa_in, 2);
    T_OK(ir_op_set_int(mm, op, "qk_nope_head_dim", 16));
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 8));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG, "%qa_act: mla_qabsorb: kv_b %q_pe must not have T");

    /* mla_attention */
    ir_value *q_c = must(ir_module_find_value(mm, "qa"), "qa");
    ir_value *ma_in[5] = {q_c, q_pe, kv_c, k_pe, mpos};
    op = op_new(mm, IR_OP_MLA_ATTENTION, (const char *[]){"ma"}, 1, ma_in, 5);
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG,
          "%ma: mla_attention: missing required attribute 'scale'");
    T_OK(ir_op_set_float(mm, op, "scale", 0.1));
    T_OK(ir_op_finish(mm, op, NULL));
    T_CHECK(op->out[0]->type.rank == 3 && op->out[0]->type.dims[1] == 4 &&
            op->out[0]->type.dims[2] == 32);
    T_OK(ir_op_set_int(mm, op, "window", -1));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG, "%ma: mla_attention: window -1 must be >= 0");
    ir_value *bad_in[5];
    const struct {
        int slot;
        ir_value *v;
        const char *want;
    } ma_bad[] = {
        {2, kv_c31, "kv_c %kv_c31 has 31 channels, q_c %qa has 32"},
        {3, k_pe2, "k_pe %k_pe2 is f32[T, 2, 8], expected [T, 1, 8] (q_pe's rope dim)"},
        {1, k_pe2, "q_pe %k_pe2 has 2 heads, q_c %qa has 4"},
        {1, kv_c, "q_pe %kv_c must have rank 3"},
        {4, mids, "positions %ids must have rank 1"},
        {0, q_pe, "kv_c %kv_c has 32 channels, q_c %q_pe has 8"},
    };
    for (size_t i = 0; i < sizeof ma_bad / sizeof ma_bad[0]; i++) {
        memcpy(bad_in, ma_in, sizeof bad_in);
        bad_in[ma_bad[i].slot] = ma_bad[i].v;
        char name[16];
        snprintf(name, sizeof name, "ma_bad%zu", i);
        op = op_new(mm, IR_OP_MLA_ATTENTION, (const char *[]){name}, 1, bad_in, 5);
        T_OK(ir_op_set_float(mm, op, "scale", 0.1));
        T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG, ma_bad[i].want);
    }
    /* q_nope [T, 4, 16] against q_pe [T, 4, 8]: heads agree, so only the rope dim of k_pe differs */
    memcpy(bad_in, ma_in, sizeof bad_in);
    bad_in[1] = q_nope;
    bad_in[0] = q_c;
    op = op_new(mm, IR_OP_MLA_ATTENTION, (const char *[]){"ma_dr"}, 1, bad_in, 5);
    T_OK(ir_op_set_float(mm, op, "scale", 0.1));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG,
          "%ma_dr: mla_attention: k_pe %k_pe is f32[T, 1, 8], expected [T, 1, 16]");

    /* mla_vabsorb */
    ir_value *o_c = must(ir_module_find_value(mm, "ma"), "ma");
    ir_value *va_in[2] = {o_c, kv_b};
    op = op_new(mm, IR_OP_MLA_VABSORB, (const char *[]){"va"}, 1, va_in, 2);
    T_OK(ir_op_set_int(mm, op, "qk_nope_head_dim", 16));
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 8));
    T_OK(ir_op_finish(mm, op, NULL));
    T_CHECK(op->out[0]->type.rank == 3 && op->out[0]->type.dims[1] == 4 &&
            op->out[0]->type.dims[2] == 8);
    T_OK(ir_op_set_int(mm, op, "qk_nope_head_dim", 15));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG,
          "%va: mla_vabsorb: kv_b %kv_b has 96 rows, expected heads 4 * (qk_nope_head_dim 15");
    va_in[0] = q_pe;
    op = op_new(mm, IR_OP_MLA_VABSORB, (const char *[]){"va_r"}, 1, va_in, 2);
    T_OK(ir_op_set_int(mm, op, "qk_nope_head_dim", 16));
    T_OK(ir_op_set_int(mm, op, "v_head_dim", 8));
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG,
          "%va_r: mla_vabsorb: o_c %q_pe has 8 channels, kv_b %kv_b has 32 columns");
    op = op_new(mm, IR_OP_MLA_VABSORB, (const char *[]){"va_na"}, 1, va_in, 2);
    T_ERR(ir_op_finish(mm, op, NULL), MOEC_ERR_INVALID_ARG,
          "%va_na: mla_vabsorb: missing required attribute 'qk_nope_head_dim'");

    /* fork and join: the type passes through, i32 too */
    ir_value *f = op1(m, IR_OP_FORK, "f", ids, NULL);
    T_CHECK(ir_type_equal(&f->type, &ids->type));
    ir_value *j = op1(m, IR_OP_JOIN, "j", odd, NULL);
    T_CHECK(ir_type_equal(&j->type, &odd->type));
    op = op_new(m, IR_OP_FORK, (const char *[]){"f_w"}, 1, &lw, 1);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%f_w: fork: input %lw must have T as its first dimension, got bf16[16, 64]");
    op = op_new(m, IR_OP_JOIN, (const char *[]){"j_w"}, 1, &gu, 1);
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%j_w: join: input %gu must have T");
    T_ERR(ir_op_set_int(m, op, "stream", 1), MOEC_ERR_INVALID_ARG, "%j_w: join: unknown attribute 'stream'");

    /* alpha on linear and add (finite floats), not on mul */
    ir_value *lin_in[2] = {x, lw};
    op = op_new(m, IR_OP_LINEAR, (const char *[]){"lin"}, 1, lin_in, 2);
    T_OK(ir_op_set_float(m, op, "alpha", 0.5));
    T_OK(ir_op_finish(m, op, NULL));
    T_OK(ir_op_set_float(m, op, "alpha", NAN));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%lin: linear: alpha must be finite");
    T_ERR(ir_op_set_int(m, op, "alpha", 1), MOEC_ERR_INVALID_ARG, "%lin: linear: attribute 'alpha' must be a float");
    ir_value *add_in[2] = {x, x};
    op = op_new(m, IR_OP_ADD, (const char *[]){"ad"}, 1, add_in, 2);
    T_OK(ir_op_set_float(m, op, "alpha", -2.0));
    T_OK(ir_op_finish(m, op, NULL));
    T_OK(ir_op_set_float(m, op, "alpha", -INFINITY));
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG, "%ad: add: alpha must be finite");
    op = op_new(m, IR_OP_MUL, (const char *[]){"mu"}, 1, add_in, 2);
    T_ERR(ir_op_set_float(m, op, "alpha", 2.0), MOEC_ERR_INVALID_ARG, "%mu: mul: unknown attribute 'alpha'");
    ir_module_free(m);
    ir_module_free(mm);
}

/* ---- parser errors -------------------------------------------------------- */

typedef struct bad_case {
    const char *text;
    const char *want; /* the exact "file:line:col: message" (or its start) */
} bad_case;

/* Each case, parsed as `file`, fails with its message and no module. */
static void expect_parse_errors(const bad_case *cases, size_t n, const char *file)
{
    for (size_t i = 0; i < n; i++) {
        ir_module *m = (ir_module *)&cases[i]; /* must be reset to NULL on error */
        moec_status st = ir_module_parse(cases[i].text, file, &m);
        T_ERR(st, MOEC_ERR_FORMAT, cases[i].want);
        T_CHECK(m == NULL);
        if (st != MOEC_ERR_FORMAT || !strstr(moec_last_error(), cases[i].want))
            fprintf(stderr, "  (case %zu)\n", i);
        ir_module_free(st == MOEC_OK ? m : NULL);
    }
}

#define HEAD "module t {\n  input %tokens : i32[T]\n  weight %emb : bf16[8, 4] = \"emb\"\n"

static void test_parse_errors(void)
{
    static const bad_case cases[] = {
        {HEAD "  %x : f32[T, 4] = lineer(%tokens, %emb)\n  output %x\n}\n",
         "bad.mir:4:20: unknown op 'lineer'"},
        {HEAD "  %x f32[T, 4] = embedding(%tokens, %emb)\n  output %x\n}\n",
         "bad.mir:4:6: expected ':' after value name, found 'f32'"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %l0.x)\n  output %x\n}\n",
         "bad.mir:4:39: undefined value %l0.x"},
        {HEAD "  %emb : f32[T, 4] = embedding(%tokens, %emb)\n  output %emb\n}\n",
         "bad.mir:4:3: duplicate value %emb"},
        {HEAD "  %x : f8[T, 4] = embedding(%tokens, %emb)\n  output %x\n}\n",
         "bad.mir:4:8: unknown dtype 'f8'"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb) {eps = 1e-06}\n  output %x\n}\n",
         "bad.mir:4:46: unknown attribute 'eps' for embedding"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb)\n  %y : f32[T, 4] = rms_norm(%x, %x) {eps = 1}\n"
              "  output %y\n}\n",
         "bad.mir:5:44: attribute 'eps' of rms_norm must be a float"},
        {HEAD "  %x : f32[T, 5] = embedding(%tokens, %emb)\n  output %x\n}\n",
         "bad.mir:4:8: %x: embedding: declared type f32[T, 5], inferred f32[T, 4]"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb)\n  output %x\n",
         "bad.mir:6:1: expected '}' at the end of the module"},
        {HEAD "  %x : f32[4, T] = embedding(%tokens, %emb)\n  output %x\n}\n",
         "bad.mir:4:15: T may only be the first dimension"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb)\n  output %x\n}\nmodule u {\n",
         "bad.mir:7:1: expected end of file after the module's '}', found 'module'"},
        {HEAD "  meta big = 99999999999999999999\n  output %tokens\n}\n",
         "bad.mir:4:14: integer '99999999999999999999' out of range"},
        {"module t {\n  meta s = \"abc\n}\n", "bad.mir:2:12: unterminated string"},
        {"module t {\n  meta s = \"a\\nb\"\n}\n", "bad.mir:2:14: unknown escape '\\n' in string"},
        {"  # only a comment\n\nmodel t {\n}\n", "bad.mir:3:1: expected 'module', found 'model'"},
        {"", "bad.mir:1:1: expected 'module', found end of file"},
        {HEAD "  %a : i32[T, 2] = moe_topk(%x) {scoring = \"softmax\", top_k = 2}\n  output %a\n}\n",
         "bad.mir:4:20: moe_topk has 2 results, 1 given"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb, %emb)\n  output %x\n}\n",
         "bad.mir:4:45: embedding takes at most 2 operands"},
        {HEAD "  weight %s : f32[4, 2] = stack(\"x.{e}\", 3)\n  output %tokens\n}\n",
         "bad.mir:4:27: weight %s: stack count 3 does not match dim 0 (4)"},
        {HEAD "  weight %s : f32[4, 2] = stack(\"x.{x}\", 4)\n  output %tokens\n}\n",
         "bad.mir:4:27: weight %s: stack pattern \"x.{x}\" must contain {e}"},
        {HEAD "  weight %s : f32[T, 2] = \"s\"\n  output %tokens\n}\n",
         "bad.mir:4:15: weight %s must not have T"},
        {HEAD "  input %pos : i32[4]\n  output %tokens\n}\n",
         "bad.mir:4:16: input %pos must have T as its first dimension"},
        {HEAD "  meta x = 1.5.2\n  output %tokens\n}\n", "bad.mir:4:12: malformed number '1.5.2'"},
        {HEAD "  meta x = 12abc\n  output %tokens\n}\n", "bad.mir:4:12: malformed number '12abc'"},
        {HEAD "  meta x = 1\n  meta x = 2\n  output %tokens\n}\n", "bad.mir:5:8: duplicate meta key 'x'"},
        {HEAD "}\n", "bad.mir:4:1: module has no outputs"},
        {HEAD "  output %nope\n}\n", "bad.mir:4:10: undefined value %nope"},
        {HEAD "  output %tokens\n  output %tokens\n}\n", "bad.mir:5:10: %tokens is already an output"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb) output %x\n}\n",
         "bad.mir:4:45: expected end of line, found 'output'"},
        {HEAD "  $x\n}\n", "bad.mir:4:3: unexpected character '$'"},
        {HEAD "  %x : f32[T, 4, 1, 1, 1] = embedding(%tokens, %emb)\n}\n",
         "bad.mir:4:24: more than 4 dimensions"},
        {HEAD "  %x : f32[T, 0] = embedding(%tokens, %emb)\n}\n",
         "bad.mir:4:15: dimension 0 out of range [1, 2147483647]"},
        {HEAD "  %x : f32[T, 4] = embedding(%emb, %emb)\n  output %x\n}\n",
         "bad.mir:4:3: %x: embedding: ids %emb must have T as its first dimension"},
        {HEAD "  weight %c : f32[8, 2] = concat(0)\n  output %tokens\n}\n",
         "bad.mir:4:35: expected ',' and a part after the concat axis"},
        {HEAD "  weight %c : f32[8, 2] = concat(2, \"a\", \"b\")\n  output %tokens\n}\n",
         "bad.mir:4:27: weight %c: concat axis 2 out of range [0, 1]"},
        {"module t {\n  meta k = [1, 2.5]\n}\n", "bad.mir:2:16: expected an int in the list, found number '2.5'"},
        {"module t {\n  meta s = \"tab\there\"\n}\n", "bad.mir:2:16: control character in string"},
        {"module t {\n  input % : i32[T]\n}\n", "bad.mir:2:9: expected a value name after '%'"},
        {HEAD "  %x : f32[T, 4] @x*T = embedding(%tokens, %emb)\n  output %x\n}\n",
         "bad.mir:4:19: expected an arena offset (an int >= 0) after '@', found 'x'"},
        {HEAD "  %x : f32[T, 4] @-4*T = embedding(%tokens, %emb)\n  output %x\n}\n",
         "bad.mir:4:19: expected an arena offset (an int >= 0) after '@', found number '-4'"},
        {HEAD "  %x : f32[T, 4] @16*S = embedding(%tokens, %emb)\n  output %x\n}\n",
         "bad.mir:4:22: expected 'T' after '@16*', found 'S'"},
        {HEAD "  %x : f32[T, 4] @16 = embedding(%tokens, %emb)\n  output %x\n}\n",
         "bad.mir:4:22: expected '*T' after the arena offset, found '='"},
        {HEAD "  input %pos : i32[T] @4*T4\n  output %tokens\n}\n",
         "bad.mir:4:26: expected 'T' after '@4*', found 'T4'"},
        {HEAD "  weight %s : f32[4, 2] @0*T = \"s\"\n  output %tokens\n}\n",
         "bad.mir:4:25: expected '=' and the weight's binding, found '@'"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb) stream 2\n  output %x\n}\n",
         "bad.mir:4:52: stream 2 out of range [0, 1]"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb) stream\n  output %x\n}\n",
         "bad.mir:4:51: expected stream (an int), found end of line"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb) stream 1 {eps = 1.0}\n  output %x\n}\n",
         "bad.mir:4:54: expected end of line, found '{'"},
        {HEAD "  %x : f32[T, 4] = fork(%emb)\n  output %x\n}\n",
         "bad.mir:4:3: %x: fork: input %emb must have T as its first dimension"},
        {HEAD "  %x : f32[T, 4] = embedding(%tokens, %emb)\n  %y : f32[T, 2] = silu_mul(%x) {alpha = 1.0}\n"
              "  output %y\n}\n",
         "bad.mir:5:34: unknown attribute 'alpha' for silu_mul"},
    };
    expect_parse_errors(cases, sizeof cases / sizeof cases[0], "bad.mir");
    ir_module *m = NULL;
    T_ERR(ir_module_parse(NULL, "x.mir", &m), MOEC_ERR_INVALID_ARG, "x.mir: null text");
}

/* ---- block-scaled weights -------------------------------------------------- */

#define FP8_HEAD "module t {\n  input %tokens : i32[T]\n  weight %emb : bf16[8, 320] = \"emb\"\n"

static const char FP8_TEXT[] =
    FP8_HEAD
    "  weight %w : f8e4m3[192, 320] = \"w.weight\", block_scale[128, 128] = \"w.weight_scale_inv\"\n"
    "  weight %e : f8e4m3[4, 64, 320] = stack(\"e.{e}.weight\", 4), block_scale[128, 64] = "
    "stack(\"e.{e}.weight_scale_inv\", 4)\n"
    "  weight %c : f8e4m3[448, 320] = concat(0, \"a.weight\", \"b.weight\"), block_scale[128, 128] "
    "= concat(0, \"a.weight_scale_inv\", \"b.weight_scale_inv\")\n"
    "  weight %d : bf16[192, 320] = \"d.weight\", block_scale[128, 128] = \"d.weight_scale_inv\"\n"
    "  %x : f32[T, 320] = embedding(%tokens, %emb)\n"
    "  %y : f32[T, 192] = linear(%x, %w)\n"
    "  %z : f32[T, 448] = linear(%x, %c)\n"
    "  %u : f32[T, 192] = linear(%x, %d)\n"
    "  output %y\n"
    "  output %z\n"
    "  output %u\n"
    "}\n";

static const char FP8_BOX_TEXT[] =
    FP8_HEAD
    "  weight %w : f8e4m3[128, 320] = \"w.weight\"[128:256, :], block_scale[128, 128] = "
    "\"w.weight_scale_inv\"[1:2, :]\n"
    "  weight %o : f8e4m3[320, 100] = \"o.weight\"[:, 256:356], block_scale[128, 128] = "
    "\"o.weight_scale_inv\"[:, 2:3]\n"
    "  weight %gu : f8e4m3[2, 256, 320] = concat(1, stack(\"g.{e}\", 4)[2:4, 128:256, :], "
    "stack(\"u.{e}\", 4)[2:4, 128:256, :]), block_scale[128, 128] = concat(1, "
    "stack(\"gs.{e}\", 4)[2:4, 1:2, :], stack(\"us.{e}\", 4)[2:4, 1:2, :])\n"
    "  %x : f32[T, 320] = embedding(%tokens, %emb)\n"
    "  %y : f32[T, 128] = linear(%x, %w)\n"
    "  output %y\n"
    "}\n";

/* Refined scales (fusion's finer blocks): gate and up of 192 rows, 1.5
 * blocks of 128 each, joined in blocks of 64; a rank's box of them. */
static const char FP8_REFINED_TEXT[] =
    FP8_HEAD
    "  weight %gu : f8e4m3[384, 320] = concat(0, \"g\", \"u\"), block_scale[64, 128] from [128, "
    "128] = concat(0, \"gs\", \"us\")\n"
    "  weight %r : f8e4m3[128, 320] = \"r\"[128:256, :], block_scale[32, 128] from [128, 128] = "
    "\"rs\"[1:2, :]\n"
    "  %x : f32[T, 320] = embedding(%tokens, %emb)\n"
    "  %y : f32[T, 384] = linear(%x, %gu)\n"
    "  output %y\n"
    "}\n";

static int type_is(ir_type t, ir_dtype dt, int rank, int64_t d0, int64_t d1, int64_t d2)
{
    ir_type want = ty(dt, rank, d0, d1, d2);
    return ir_type_equal(&t, &want);
}

static void test_block_scale(void)
{
    /* The text form round-trips; the scale grids are the blocks rounded up. */
    ir_module *m = NULL;
    T_OK(ir_module_parse(FP8_TEXT, "fp8.mir", &m));
    if (!m)
        return;
    char *text = ir_module_print_str(m);
    T_CHECK(text && !strcmp(text, FP8_TEXT));
    free(text);
    const ir_value *w = ir_module_find_value(m, "w"), *e = ir_module_find_value(m, "e");
    const ir_value *c = ir_module_find_value(m, "c"), *d = ir_module_find_value(m, "d");
    T_CHECK(w->scale.block[0] == 128 && w->scale.block[1] == 128 &&
            w->scale.bind.kind == IR_BIND_TENSOR && !strcmp(w->scale.bind.name, "w.weight_scale_inv"));
    T_CHECK(type_is(ir_block_scale_type(w), IR_DTYPE_F32, 2, 2, 3, 0));
    T_CHECK(type_is(ir_block_scale_type(e), IR_DTYPE_F32, 3, 4, 1, 5));
    T_CHECK(type_is(ir_block_scale_type(c), IR_DTYPE_F32, 2, 4, 3, 0));
    T_CHECK(c->scale.bind.kind == IR_BIND_CONCAT && c->scale.bind.n_parts == 2 &&
            !strcmp(c->scale.bind.parts[1].name, "b.weight_scale_inv"));
    T_CHECK(d->type.dtype == IR_DTYPE_BF16 && d->scale.block[0] == 128);
    const ir_value *emb = ir_module_find_value(m, "emb");
    T_CHECK(emb->scale.block[0] == 0 && emb->scale.block[1] == 0);

    /* The builder checks what the verifier checks and leaves a refused weight as it was. */
    ir_value *q = must(ir_module_add_weight(m, "q", ty(IR_DTYPE_F8E4M3, 2, 4, 4, 0), "q.weight"),
                       "q");
    T_ERR(ir_module_verify(m), MOEC_ERR_INVALID_ARG,
          "weight %q: f8e4m3 needs a block_scale (the scales of its blocks)");
    ir_binding stk = {.kind = IR_BIND_STACK, .name = "s.{e}", .count = 4};
    T_ERR(ir_weight_set_block_scale(m, q, 2, 2, &stk), MOEC_ERR_INVALID_ARG,
          "weight %q: the block_scale binding must mirror the weight's (same kind, stack count, "
          "concat axis and parts)");
    ir_binding one = {.kind = IR_BIND_TENSOR, .name = "q.weight_scale_inv"};
    T_ERR(ir_weight_set_block_scale(m, q, 0, 2, &one), MOEC_ERR_INVALID_ARG,
          "weight %q: block_scale block [0, 2] must be >= 1");
    T_CHECK(q->scale.block[0] == 0 && q->scale.bind.name == NULL);
    T_ERR(ir_weight_set_block_scale(m, m->inputs[0], 2, 2, &one), MOEC_ERR_INVALID_ARG,
          "block_scale: %tokens is not a weight of the module");
    T_OK(ir_weight_set_block_scale(m, q, 2, 2, &one));
    T_OK(ir_module_verify(m));
    ir_value *qi = must(ir_module_add_weight(m, "qi", ty(IR_DTYPE_I32, 2, 4, 4, 0), "qi"), "qi");
    T_ERR(ir_weight_set_block_scale(m, qi, 2, 2, &one), MOEC_ERR_INVALID_ARG,
          "weight %qi: an i32 weight cannot have a block_scale");
    ir_value *q1 = must(ir_module_add_weight(m, "q1", ty(IR_DTYPE_BF16, 1, 4, 0, 0), "q1"), "q1");
    T_ERR(ir_weight_set_block_scale(m, q1, 2, 2, &one), MOEC_ERR_INVALID_ARG,
          "weight %q1: a block_scale needs a weight of rank >= 2 (rows, columns), got bf16[4]");

    /* Only the ops that multiply by a weight take f8e4m3: not an embedding or a norm. */
    ir_value *x = ir_module_find_value(m, "x");
    ir_value *emb_in[2] = {m->inputs[0], q};
    T_CHECK(ir_build(m, IR_OP_EMBEDDING, "bad_emb", emb_in, 2) == NULL);
    T_CHECK(strstr(moec_last_error(), "table %q must be a float, got f8e4m3[4, 4]") != NULL);
    ir_value *w1 = must(ir_module_add_weight(m, "w1", ty(IR_DTYPE_F8E4M3, 1, 320, 0, 0), "w1"), "w1");
    const char *names[1] = {"bad_norm"};
    ir_value *norm_in[2] = {x, w1};
    ir_op *op = op_new(m, IR_OP_RMS_NORM, names, 1, norm_in, 2);
    must_ok(ir_op_set_float(m, op, "eps", 1e-6), "eps");
    T_ERR(ir_op_finish(m, op, NULL), MOEC_ERR_INVALID_ARG,
          "%bad_norm: rms_norm: weight %w1 must be a float, got f8e4m3[320]");
    ir_module_free(m);

    /* A rank's slices of block-scaled weights (pass shard): boxes that start
     * on block boundaries, their scales the blocks they touch (an end inside
     * a block takes that block: a partial edge block of the slice). */
    m = NULL;
    T_OK(ir_module_parse(FP8_BOX_TEXT, "box.mir", &m));
    text = m ? ir_module_print_str(m) : NULL;
    T_CHECK(text && !strcmp(text, FP8_BOX_TEXT));
    free(text);
    const ir_value *g = m ? ir_module_find_value(m, "gu") : NULL;
    T_CHECK(g && type_is(ir_block_scale_type(g), IR_DTYPE_F32, 3, 2, 2, 3));
    ir_binding leaf = {.kind = IR_BIND_STACK, .name = "x.{e}", .count = 8, .box_rank = 3,
                       .box_start = {4, 128, 0}, .box_size = {2, 200, 0}};
    ir_binding sl = {.kind = IR_BIND_STACK, .name = "s.{e}", .count = 8};
    ir_block_scale_box(&leaf, 3, (const int64_t[2]){128, 64}, &sl);
    T_CHECK(sl.box_rank == 3 && sl.box_start[0] == 4 && sl.box_size[0] == 2 &&
            sl.box_start[1] == 1 && sl.box_size[1] == 2 && sl.box_size[2] == 0 &&
            !strcmp(sl.name, "s.{e}"));
    ir_module_free(m);

    /* Refined: the weight's blocks divide the stored ones its scale tensors
     * grid (and its boxes align to); the text round-trips. */
    m = NULL;
    T_OK(ir_module_parse(FP8_REFINED_TEXT, "refined.mir", &m));
    text = m ? ir_module_print_str(m) : NULL;
    T_CHECK(text && !strcmp(text, FP8_REFINED_TEXT));
    free(text);
    g = m ? ir_module_find_value(m, "gu") : NULL;
    T_CHECK(g && g->scale.block[0] == 64 && ir_block_scale_stored(&g->scale, 0) == 128 &&
            ir_block_scale_stored(&g->scale, 1) == 128 &&
            type_is(ir_block_scale_type(g), IR_DTYPE_F32, 2, 6, 3, 0));
    ir_value *r = m ? ir_module_find_value(m, "r") : NULL;
    if (r) {
        T_ERR(ir_weight_refine_block_scale(m, r, 48, 128), MOEC_ERR_INVALID_ARG,
              "weight %r: block_scale block [48, 128] must divide the blocks [128, 128] its "
              "scales are stored in");
        T_CHECK(r->scale.block[0] == 32 && r->scale.stored[0] == 128);
        T_OK(ir_weight_refine_block_scale(m, r, 128, 128));
        T_CHECK(r->scale.block[0] == 128 && r->scale.stored[0] == 0 && r->scale.stored[1] == 0);
        T_OK(ir_weight_refine_block_scale(m, r, 16, 64));
        T_CHECK(r->scale.block[0] == 16 && r->scale.block[1] == 64 &&
                type_is(ir_block_scale_type(r), IR_DTYPE_F32, 2, 8, 5, 0));
        T_OK(ir_module_verify(m));
    }
    ir_module_free(m);

    /* Parse errors of the block_scale clause, and of what it must agree with. */
    static const bad_case cases[] = {
        {FP8_HEAD "  weight %q : f8e4m3[4, 4] = \"q\"\n  output %tokens\n}\n",
         "fp8.mir:4:33: weight %q: f8e4m3 needs a block_scale (the scales of its blocks)"},
        {FP8_HEAD "  weight %q : f8e4m3[4] = \"q\", block_scale[2, 2] = \"s\"\n  output %tokens\n}\n",
         "fp8.mir:4:32: weight %q: a block_scale needs a weight of rank >= 2 (rows, columns), got "
         "f8e4m3[4]"},
        {FP8_HEAD "  weight %q : i32[4, 4] = \"q\", block_scale[2, 2] = \"s\"\n  output %tokens\n}\n",
         "fp8.mir:4:32: weight %q: an i32 weight cannot have a block_scale"},
        {FP8_HEAD "  weight %q : f8e4m3[4, 4] = \"q\", block_scale[2, 2] = stack(\"s.{e}\", 4)\n"
                  "  output %tokens\n}\n",
         "fp8.mir:4:35: weight %q: the block_scale binding must mirror the weight's"},
        {FP8_HEAD "  weight %q : f8e4m3[4, 4, 4] = stack(\"q.{e}\", 4), block_scale[2, 2] = "
                  "stack(\"s.{e}\", 3)\n  output %tokens\n}\n",
         "fp8.mir:4:52: weight %q: the block_scale binding must mirror the weight's"},
        {FP8_HEAD "  weight %q : f8e4m3[4, 4] = \"q\", block_scale[0, 2] = \"s\"\n  output %tokens\n}\n",
         "fp8.mir:4:47: expected a block size (an int in [1, 2147483647]), found number '0'"},
        {FP8_HEAD "  weight %q : f8e4m3[4, 4] = \"q\", block_scale[2, 2] \"s\"\n  output %tokens\n}\n",
         "fp8.mir:4:53: expected '=' and the scales' binding, found string \"s\""},
        {FP8_HEAD "  weight %q : f8e4m3[4, 4] = \"q\", block_scale[2, 2] from [3, 2] = \"s\"\n"
                  "  output %tokens\n}\n",
         "fp8.mir:4:35: weight %q: block_scale block [2, 2] must divide the blocks [3, 2] its "
         "scales are stored in"},
        {FP8_HEAD "  weight %q : f8e4m3[4, 4] = \"q\", block_scale[2, 2] from 4 = \"s\"\n"
                  "  output %tokens\n}\n",
         "fp8.mir:4:58: expected '[' after from, found number '4'"},
        {FP8_HEAD "  weight %q : f8e4m3[2, 4] = \"q\"[2:4, :], block_scale[1, 2] from [4, 2] = "
                  "\"s\"[0:1, :]\n  output %tokens\n}\n",
         "fp8.mir:4:43: weight %q: the slice of \"q\" starts at row 2 (dim 0), not on a boundary "
         "of its blocks of 4: a block-scaled weight is sliced along whole blocks"},
        {FP8_HEAD "  weight %q : f8e4m3[4, 4] = \"q\", scale[2, 2] = \"s\"\n  output %tokens\n}\n",
         "fp8.mir:4:35: expected block_scale after ',', found 'scale'"},
        {FP8_HEAD "  weight %q : f8e4m3[4, 4] = \"q\", block_scale[2] = \"s\"\n  output %tokens\n}\n",
         "fp8.mir:4:48: expected ',' between the block's rows and columns, found ']'"},
        {FP8_HEAD "  weight %q : f8e4m3[2, 4] = \"q\"[0:2, :], block_scale[2, 2] = \"s\"\n"
                  "  output %tokens\n}\n",
         "fp8.mir:4:43: weight %q: the block_scale slice of \"s\" is (none), but the weight's "
         "slice touches the blocks [0:1, :]"},
        {FP8_HEAD "  weight %q : f8e4m3[4, 4] = \"q\", block_scale[2, 2] = \"s\"[0:2, :]\n"
                  "  output %tokens\n}\n",
         "fp8.mir:4:35: weight %q: the block_scale slice of \"s\" is [0:2, :], but the weight's "
         "slice touches the blocks (none)"},
        {FP8_HEAD "  weight %q : f8e4m3[2, 4] = \"q\"[1:3, :], block_scale[2, 2] = \"s\"[0:2, :]\n"
                  "  output %tokens\n}\n",
         "fp8.mir:4:43: weight %q: the slice of \"q\" starts at row 1 (dim 0), not on a boundary "
         "of its blocks of 2: a block-scaled weight is sliced along whole blocks"},
        {FP8_HEAD "  weight %q : f8e4m3[2, 3, 4] = stack(\"q.{e}\", 4)[2:4, :, 3:7], "
                  "block_scale[2, 4] = stack(\"s.{e}\", 4)[2:4, :, 0:2]\n  output %tokens\n}\n",
         "weight %q: the slice of \"q.{e}\" starts at column 3 (dim 2), not on a boundary of its "
         "blocks of 4"},
        {FP8_HEAD "  weight %q : f8e4m3[2, 3, 4] = stack(\"q.{e}\", 4)[2:4, :, 4:8], "
                  "block_scale[2, 4] = stack(\"s.{e}\", 4)[0:2, :, 1:2]\n  output %tokens\n}\n",
         "weight %q: the block_scale slice of \"s.{e}\" is [0:2, :, 1:2], but the weight's slice "
         "touches the blocks [2:4, :, 1:2]"},
        {FP8_HEAD "  weight %q : f8e4m3[6, 4] = concat(0, \"a\"[2:4, :], \"b\"[1:5, :]), "
                  "block_scale[2, 2] = concat(0, \"sa\"[1:2, :], \"sb\"[0:3, :])\n"
                  "  output %tokens\n}\n",
         "weight %q: the slice of \"b\" starts at row 1 (dim 0), not on a boundary of its blocks "
         "of 2"},
        {FP8_HEAD "  input %p : f8e4m3[T]\n  output %tokens\n}\n",
         "input %p: f8e4m3 is for block-scaled weights only"},
        {FP8_HEAD "  weight %q : f8e4m3[8, 320] = \"q\", block_scale[2, 2] = \"s\"\n"
                  "  %x : f32[T, 320] = embedding(%tokens, %q)\n  output %x\n}\n",
         "fp8.mir:5:3: %x: embedding: table %q must be a float, got f8e4m3[8, 320]"},
    };
    expect_parse_errors(cases, sizeof cases / sizeof cases[0], "fp8.mir");
}

/* ---- mutation ------------------------------------------------------------- */

/* err contains "file:LINE:COL: " with LINE, COL >= 1. */
static int has_position(const char *err, const char *file)
{
    const char *at = strstr(err, file);
    if (!at || at[strlen(file)] != ':')
        return 0;
    int line = 0, col = 0, used = 0;
    if (sscanf(at + strlen(file) + 1, "%d:%d: %n", &line, &col, &used) != 2 || used == 0)
        return 0;
    return line >= 1 && col >= 1;
}

static void test_mutations(void)
{
    const char *path = t_src("tests/data/ir/all_ops.mir");
    size_t len;
    char *golden = t_read_file(path, &len);
    char *buf = malloc(len * 2 + 64);
    if (!buf) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    static const char POKE[] = "%{}[](),:=\"\\#-.eT0123456789\n \t\r@*";
    uint64_t rng = 20261122;
    int ok = 0, format = 0, other = 0, round_trip_bad = 0;
    for (int iter = 0; iter < 2000; iter++) {
        memcpy(buf, golden, len + 1);
        size_t n = len;
        int edits = 1 + (int)(t_rand_u64(&rng) % 3);
        for (int e = 0; e < edits && n > 0; e++) {
            size_t at = (size_t)(t_rand_u64(&rng) % n);
            switch (t_rand_u64(&rng) % 6) {
            case 0: /* flip to any byte (0 truncates) */
                buf[at] = (char)(t_rand_u64(&rng) & 0xff);
                break;
            case 1: /* a syntax character */
                buf[at] = POKE[t_rand_u64(&rng) % (sizeof POKE - 1)];
                break;
            case 2: { /* delete a run */
                size_t k = 1 + (size_t)(t_rand_u64(&rng) % 16);
                if (k > n - at)
                    k = n - at;
                memmove(buf + at, buf + at + k, n - at - k + 1);
                n -= k;
                break;
            }
            case 3: /* truncate */
                buf[at] = '\0';
                n = at;
                break;
            case 4: { /* duplicate a run */
                size_t k = 1 + (size_t)(t_rand_u64(&rng) % 32);
                if (k > n - at)
                    k = n - at;
                if (n + k < len * 2 + 32) {
                    memmove(buf + at + k, buf + at, n - at + 1);
                    n += k;
                }
                break;
            }
            default: /* a digit run that may overflow */
                buf[at] = (char)('0' + t_rand_u64(&rng) % 10);
                break;
            }
            n = strlen(buf);
        }
        ir_module *m = NULL;
        moec_status st = ir_module_parse(buf, "mut.mir", &m);
        if (st == MOEC_OK) {
            ok++;
            char *s1 = ir_module_print_str(m);
            ir_module *m2 = NULL;
            if (!s1 || ir_module_parse(s1, "mut2.mir", &m2) != MOEC_OK) {
                round_trip_bad++;
            } else {
                char *s2 = ir_module_print_str(m2);
                if (!s2 || strcmp(s1, s2))
                    round_trip_bad++;
                free(s2);
            }
            ir_module_free(m2);
            free(s1);
            ir_module_free(m);
        } else if (st == MOEC_ERR_FORMAT) {
            format++;
            T_CHECK(m == NULL);
            if (!has_position(moec_last_error(), "mut.mir")) {
                other++;
                fprintf(stderr, "mutation %d: error without position: %s\n", iter, moec_last_error());
            }
        } else {
            other++;
            fprintf(stderr, "mutation %d: status %s: %s\n", iter, moec_status_name(st),
                    moec_last_error());
        }
    }
    T_CHECK(other == 0);
    T_CHECK(round_trip_bad == 0);
    T_CHECK(ok + format == 2000);
    T_CHECK(format > 1000); /* most mutations must be rejected */
    printf("mutations: %d parsed, %d rejected\n", ok, format);
    free(buf);
    free(golden);
}

int main(void)
{
    test_arena();
    test_types();
    test_builder_and_lookup();
    test_print_parse();
    test_verifier();
    test_plan_aliases();
    test_infer_errors();
    test_infer_fused();
    test_parse_errors();
    test_block_scale();
    test_mutations();
    return t_finish("test_ir");
}
